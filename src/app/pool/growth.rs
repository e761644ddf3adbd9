//! How big the pool should be: workers wanted for `n_min` and the queue,
//! starting them within the budget's room, crash-loop backoff (which exits
//! count as failed starts), pruning unused workers, and the spare worker
//! another app may take the place of.

use std::time::{Duration, Instant};

use super::{
    jittered, Pool, Retire, Slot, Start, State, WorkerId, BACKOFF_FIRST, BACKOFF_MAX, CRASH_WINDOW, FAILURE_MEMORY,
};

impl<W> Pool<W> {
    /// How long to wait before the next start: 0, or 250 ms doubling to 30 s
    /// while failed starts keep coming less than a minute apart.
    pub fn backoff(&self, now: Instant) -> Duration {
        let recent = self.last_failure.is_some_and(|t| now.duration_since(t) < FAILURE_MEMORY);
        match self.failed_starts {
            n if n > 0 && recent => BACKOFF_FIRST.saturating_mul(1 << (n - 1).min(16)).min(BACKOFF_MAX),
            _ => Duration::ZERO,
        }
    }

    /// Whether the app is in a crash loop: its last start failed recently.
    pub fn crash_looping(&self, now: Instant) -> bool {
        !self.backoff(now).is_zero()
    }

    fn record_failed_start(&mut self, now: Instant) {
        let recent = self.last_failure.is_some_and(|t| now.duration_since(t) < FAILURE_MEMORY);
        self.failed_starts = if recent { self.failed_starts.saturating_add(1) } else { 1 };
        self.last_failure = Some(now);
    }

    /// How many workers the pool would start now if the budget allowed: enough
    /// for `n_min`, one per waiter not covered by workers already starting,
    /// and a replacement for each worker past a limit that waits for one,
    /// never above `n_max`.
    pub fn wants(&self) -> usize {
        let live = self.live();
        let starting = self.count(State::Starting);
        let for_min = self.limits.n_min.saturating_sub(live);
        // A generation winding down sends waiting browsers to its successor:
        // no worker for them here.
        let browsers = if self.winding_down { 0 } else { self.session_demand };
        let waiting = self.queue.len() + browsers;
        let for_queue = waiting.saturating_sub(starting);
        (for_min.max(for_queue) + self.unreplaced()).min(self.limits.n_max.saturating_sub(live))
    }

    /// Starts up to `room` of the workers the pool wants (the budget across
    /// apps says how many it may); replacements of workers past a limit first.
    pub fn grow(&mut self, now: Instant, room: usize) -> Start {
        let n = self.wants().min(room);
        let ids: Vec<WorkerId> = (0..n)
            .map(|_| {
                let id = self.ids.next();
                let limit = self.limits.max_requests.map(|n| jittered(n, id));
                self.slots.insert(id, Slot::new(now, limit));
                id
            })
            .collect();
        self.assign_replacements(&ids);
        Start { ids, delay: self.backoff(now) }
    }

    /// A worker failed to start, or its process is gone (crashed, stopped).
    /// Counts a failed start when it died before or soon after it became
    /// ready without having done anything, unless valve stopped it.
    pub fn exited(&mut self, id: WorkerId, now: Instant) {
        let Some(slot) = self.slots.remove(&id) else { return };
        self.replacement_gone(id);
        let planned = slot.retired.is_some_and(Retire::gentle);
        let early = slot.ready_at.is_none_or(|t| now.duration_since(t) < CRASH_WINDOW);
        if !planned && !slot.proven && early {
            self.record_failed_start(now);
        }
    }

    /// Idle workers unused for longer than `max_age`, oldest first, never taking
    /// the pool below `n_min`. They are retired.
    pub fn prune(&mut self, now: Instant, max_age: Duration) -> Vec<WorkerId> {
        let mut stale: Vec<(Instant, WorkerId)> = self
            .slots
            .iter()
            .filter(|(_, s)| s.state == State::Idle && s.load(now) == 0 && now.duration_since(s.last_used) > max_age)
            .map(|(id, s)| (s.last_used, *id))
            .collect();
        stale.sort();
        let spare = self.live().saturating_sub(self.limits.n_min);
        stale.truncate(spare);
        stale.into_iter().map(|(_, id)| id).filter(|id| self.retire(*id, Retire::Idle)).collect()
    }

    /// The idle worker another app may take the place of (the budget across
    /// apps is spent): the one idle longest, if taking it keeps `n_min`.
    pub fn spare(&self, now: Instant) -> Option<(WorkerId, Instant)> {
        if self.live() <= self.limits.n_min {
            return None;
        }
        self.slots
            .iter()
            // (An idle worker being probed is idle all the same.)
            .filter(|(_, s)| matches!(s.state, State::Idle | State::Probing) && s.load(now) == 0)
            .min_by_key(|(id, s)| (s.last_used, **id))
            .map(|(id, s)| (*id, s.last_used))
    }
}
