//! What restores did since valve started, for the metrics: valve-wide, since
//! the cache is shared by every app.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::cache::{Entry, From};

static RESTORED: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicU64 = AtomicU64::new(0);
static LIBRARY_HITS: AtomicU64 = AtomicU64::new(0);
static FROM_R: AtomicU64 = AtomicU64::new(0);
static FROM_CACHE: AtomicU64 = AtomicU64::new(0);
static BUILT: AtomicU64 = AtomicU64::new(0);
static BUILD_MILLIS: AtomicU64 = AtomicU64::new(0);

/// The counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Counts {
    /// Restores that gave a library, and those that failed.
    pub restored: u64,
    pub failed: u64,
    /// Restores whose whole library was in the cache already.
    pub library_hits: u64,
    /// Packages linked from R's library, from the cache, and built.
    pub from_r: u64,
    pub from_cache: u64,
    pub built: u64,
    /// Seconds spent building packages.
    pub build_seconds: f64,
}

pub fn counts() -> Counts {
    Counts {
        restored: RESTORED.load(Relaxed),
        failed: FAILED.load(Relaxed),
        library_hits: LIBRARY_HITS.load(Relaxed),
        from_r: FROM_R.load(Relaxed),
        from_cache: FROM_CACHE.load(Relaxed),
        built: BUILT.load(Relaxed),
        build_seconds: BUILD_MILLIS.load(Relaxed) as f64 / 1000.0,
    }
}

/// A restore ended: with a library (`whole`: found whole in the cache) or not.
pub(super) fn restore_ended(ok: bool, whole: bool) {
    if !ok {
        FAILED.fetch_add(1, Relaxed);
        return;
    }
    RESTORED.fetch_add(1, Relaxed);
    if whole {
        LIBRARY_HITS.fetch_add(1, Relaxed);
    }
}

/// One package placed in a library as `e` says.
pub(super) fn placed(e: &Entry) {
    match e.from {
        From::System => FROM_R.fetch_add(1, Relaxed),
        From::Cache => FROM_CACHE.fetch_add(1, Relaxed),
        From::Built(s) => {
            BUILD_MILLIS.fetch_add((s * 1000.0) as u64, Relaxed);
            BUILT.fetch_add(1, Relaxed)
        }
    };
}
