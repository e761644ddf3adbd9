//! What keeps an app's metrics small while it is idle, so that valve's memory
//! does not grow with apps that serve nothing: `Runs`, a bounded ring that
//! stores equal neighbours once (a quiet app's history is one run), and
//! `Counts`, request counters that take room only for the method and status
//! pairs an app has answered.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::RwLock;

/// A value that may repeat its predecessor in a run (a second of history
/// like the last, a histogram that did not move).
pub(super) trait Repeat: Clone {
    /// Whether `next` is what a run of `n` values beginning with `self` holds next.
    fn repeats(&self, n: usize, next: &Self) -> bool;
    /// The `i`th value of a run beginning with `self`.
    fn nth(&self, i: usize) -> Self;
}

/// The last `bound` values pushed, oldest first, runs of repeats stored once.
pub(super) struct Runs<T> {
    runs: VecDeque<(T, usize)>,
    len: usize,
    bound: usize,
}

impl<T: Repeat> Runs<T> {
    pub(super) fn new(bound: usize) -> Self {
        Runs { runs: VecDeque::new(), len: 0, bound: bound.max(1) }
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Adds `value`, dropping the oldest past the bound.
    pub(super) fn push(&mut self, value: T) {
        if self.len == self.bound {
            self.pop_front();
        }
        self.len += 1;
        if let Some((first, n)) = self.runs.back_mut() {
            if first.repeats(*n, &value) {
                *n += 1;
                return;
            }
        }
        self.runs.push_back((value, 1));
    }

    fn pop_front(&mut self) {
        let Some((first, n)) = self.runs.front_mut() else { return };
        self.len -= 1;
        if *n == 1 {
            self.runs.pop_front();
        } else {
            *first = first.nth(1);
            *n -= 1;
        }
    }

    pub(super) fn front(&self) -> Option<T> {
        self.runs.front().map(|(first, _)| first.clone())
    }

    pub(super) fn back(&self) -> Option<T> {
        self.runs.back().map(|(first, n)| first.nth(n - 1))
    }

    /// Every value, oldest first (runs expanded).
    pub(super) fn iter(&self) -> impl DoubleEndedIterator<Item = T> + '_ {
        self.runs.iter().flat_map(|(first, n)| (0..*n).map(move |i| first.nth(i)))
    }

    /// How many runs are stored (what the memory holds).
    #[cfg(test)]
    pub(super) fn stored(&self) -> usize {
        self.runs.len()
    }
}

/// A histogram's buckets at one tick: repeats while nothing was observed.
impl<const N: usize> Repeat for [u64; N] {
    fn repeats(&self, _n: usize, next: &Self) -> bool {
        self == next
    }

    fn nth(&self, _i: usize) -> Self {
        *self
    }
}

/// Counters by a small key (method and status), each taking room once it counted.
#[derive(Default)]
pub(super) struct Counts {
    seen: RwLock<Vec<(u32, AtomicU64)>>,
}

impl Counts {
    pub(super) fn add(&self, key: u32) {
        {
            let seen = self.seen.read().unwrap_or_else(|p| p.into_inner());
            if let Some((_, n)) = seen.iter().find(|(k, _)| *k == key) {
                n.fetch_add(1, Relaxed);
                return;
            }
        }
        let mut seen = self.seen.write().unwrap_or_else(|p| p.into_inner());
        match seen.iter().find(|(k, _)| *k == key) {
            Some((_, n)) => {
                n.fetch_add(1, Relaxed);
            }
            None => seen.push((key, AtomicU64::new(1))),
        }
    }

    /// Every key counted, in key order, with its count.
    pub(super) fn snapshot(&self) -> Vec<(u32, u64)> {
        let seen = self.seen.read().unwrap_or_else(|p| p.into_inner());
        let mut all: Vec<(u32, u64)> = seen.iter().map(|(k, n)| (*k, n.load(Relaxed))).collect();
        all.sort_unstable();
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second's value: repeats when it is the next second with the same figure.
    #[derive(Clone, Copy, Debug, PartialEq)]
    struct Second(u64, u32);

    impl Repeat for Second {
        fn repeats(&self, n: usize, next: &Self) -> bool {
            next.0 == self.0 + n as u64 && next.1 == self.1
        }
        fn nth(&self, i: usize) -> Self {
            Second(self.0 + i as u64, self.1)
        }
    }

    #[test]
    fn runs_keep_their_bound_and_store_a_quiet_stretch_once() {
        let mut r = Runs::new(5);
        for t in 0..100 {
            r.push(Second(t, 0));
        }
        assert_eq!((r.len(), r.stored()), (5, 1), "100 quiet seconds: the last 5, stored as one run");
        assert_eq!(r.iter().collect::<Vec<_>>(), (95..100).map(|t| Second(t, 0)).collect::<Vec<_>>());
        r.push(Second(100, 7));
        r.push(Second(102, 7)); // a skipped second starts a run of its own
        assert_eq!(r.stored(), 3);
        assert_eq!(r.front(), Some(Second(97, 0)));
        assert_eq!(r.back(), Some(Second(102, 7)));
        assert_eq!(r.iter().next_back(), Some(Second(102, 7)));
        for t in 103..108 {
            r.push(Second(t, t as u32));
        }
        assert_eq!((r.len(), r.stored()), (5, 5), "busy seconds each take a run, within the bound");
        assert_eq!(r.iter().map(|s| s.0).collect::<Vec<_>>(), vec![103, 104, 105, 106, 107]);
    }

    #[test]
    fn counts_take_room_only_for_what_was_counted() {
        let c = Counts::default();
        assert!(c.snapshot().is_empty());
        for key in [200, 7, 200, 200] {
            c.add(key);
        }
        assert_eq!(c.snapshot(), vec![(7, 1), (200, 3)]);
    }
}
