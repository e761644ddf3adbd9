//! The worker budget across apps: never more than `max_workers` R processes in
//! all. When an app needs a worker and the budget is spent, the idle worker of
//! another app that has been idle longest gives up its place (never taking its
//! app below `n_min`); if none is idle, the request waits in its app's queue.
//! Pure: callers pass each app's candidate, this picks.

use std::time::Instant;

use super::pool::WorkerId;

/// An app's spare worker: idle since `idle_since`, above its app's `n_min`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spare<K> {
    pub app: K,
    pub worker: WorkerId,
    pub idle_since: Instant,
}

/// Room left in the budget.
pub fn room(max_workers: usize, processes: usize) -> usize {
    max_workers.saturating_sub(processes)
}

/// The worker to stop for `needy`: the longest idle spare of any other app.
pub fn victim<K: PartialEq + Copy>(needy: K, spares: impl IntoIterator<Item = Spare<K>>) -> Option<Spare<K>> {
    spares.into_iter().filter(|s| s.app != needy).min_by_key(|s| (s.idle_since, s.worker))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_longest_idle_worker_of_another_app_gives_way() {
        let t = Instant::now();
        let spares = [
            Spare { app: 1, worker: 10, idle_since: t },
            Spare { app: 2, worker: 20, idle_since: t + Duration::from_secs(5) },
            Spare { app: 3, worker: 30, idle_since: t + Duration::from_secs(1) },
        ];
        assert_eq!(victim(1, spares).map(|s| s.worker), Some(30), "never the needy app's own");
        assert_eq!(victim(2, spares).map(|s| s.worker), Some(10));
        assert_eq!(victim(1, [spares[0]]), None);
        assert_eq!(room(8, 5), 3);
        assert_eq!(room(8, 9), 0);
    }
}
