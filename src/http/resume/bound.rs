//! What valve holds for browsers, counted across sessions against one bound.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Bounds on what valve holds for browsers.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Bytes per session.
    pub session: usize,
    /// Bytes across every session.
    pub total: usize,
}

/// The bytes held now for every session's browser.
#[derive(Debug)]
pub struct Held {
    bytes: AtomicUsize,
    pub bounds: Bounds,
}

impl Held {
    pub fn new(bounds: Bounds) -> Self {
        Held { bytes: AtomicUsize::new(0), bounds }
    }

    /// Counts `bytes` more held; false if that passes the shared bound
    /// (the holder then lets some go, or ends its session).
    pub fn hold(&self, bytes: usize) -> bool {
        self.bytes.fetch_add(bytes, Ordering::Relaxed) + bytes <= self.bounds.total
    }

    pub fn release(&self, bytes: usize) {
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_bound_is_kept() {
        let held = Held::new(Bounds { session: 10, total: 100 });
        assert!(held.hold(60));
        assert!(!held.hold(41), "over the total");
        held.release(41);
        assert!(held.hold(40));
        held.release(100);
        assert!(held.hold(100));
    }
}
