//! Recycling without a gap: a worker past `--max-requests` or
//! `--max-worker-memory` serves on while its replacement starts, and stops
//! taking requests only once the replacement answers its readiness probe
//! (then it finishes what it holds and stops). Only when its replacement
//! cannot have a place does it stop first, as it did before: `n_max` is full
//! (the replacement counts towards it), or the worker budget across apps is
//! spent and no place will come free (`no_room`). A worker past a limit has
//! one replacement at a time; one that fails to start is wanted again (after
//! the crash-loop backoff), and the old worker serves on meanwhile.
//!
//! A Shiny worker past a limit keeps its rules (see `shiny`): it takes no
//! new session at once and serves the ones it holds (a session would keep it
//! for hours); its replacement starts as it begins to drain, not once it has
//! stopped.

use super::{Pool, Recycle, Retire, Slot, State, WorkerId};

impl Slot {
    /// The limit the worker is past, if any: its memory, or its share of requests.
    pub(super) fn past_limit(&self) -> Option<Retire> {
        if self.over_memory {
            Some(Retire::Memory)
        } else if self.limit.is_some_and(|limit| self.served >= limit) {
            Some(Retire::Requests)
        } else {
            None
        }
    }
}

impl<W> Pool<W> {
    /// Workers past a limit whose replacement is wanted and not starting
    /// (none while the generation winds down: it is not replaced at all).
    pub fn unreplaced(&self) -> usize {
        if self.winding_down {
            return 0;
        }
        self.slots.values().filter(|s| matches!(s.recycle, Some(Recycle::Wanted(_)))).count()
    }

    /// Whether a worker now past a limit may serve on while a replacement
    /// starts: the generation is not winding down, and the replacement has a
    /// place under `n_max` beside those other replacements want.
    fn replaceable_first(&self) -> bool {
        !self.winding_down && self.live() + self.unreplaced() < self.limits.n_max
    }

    /// A worker whose R is free is past `reason`'s limit: it serves on, its
    /// replacement wanted, if one can have a place; otherwise it is to stop
    /// now (returns false).
    pub(super) fn recycle_first(&mut self, id: WorkerId, reason: Retire) -> bool {
        if !self.replaceable_first() {
            return false;
        }
        match self.slots.get_mut(&id) {
            Some(slot) => {
                slot.recycle = Some(Recycle::Wanted(reason));
                true
            }
            None => false,
        }
    }

    /// New workers (just added by `grow`) replace the workers waiting for a
    /// replacement, oldest first, one each.
    pub(super) fn assign_replacements(&mut self, started: &[WorkerId]) {
        let mut new = started.iter().copied();
        for slot in self.slots.values_mut() {
            if let Some(Recycle::Wanted(reason)) = slot.recycle {
                let Some(by) = new.next() else { return };
                slot.recycle = Some(Recycle::Starting(reason, by));
            }
        }
    }

    /// The worker `replacement` replaces, while it starts.
    pub fn replaces(&self, replacement: WorkerId) -> Option<WorkerId> {
        self.slots
            .iter()
            .find(|(_, s)| matches!(s.recycle, Some(Recycle::Starting(_, by)) if by == replacement))
            .map(|(id, _)| *id)
    }

    /// `ready` answered its readiness probe: the worker it replaces takes
    /// nothing more. Returns that worker and why it goes, when it is to stop
    /// now (it was idle); a busy one stops as its request ends (`free`), one
    /// holding requests waiting on promises once they settle.
    pub(super) fn relieve(&mut self, ready: WorkerId) -> Option<(WorkerId, Retire)> {
        let old = self.replaces(ready)?;
        let slot = self.slots.get_mut(&old)?;
        let Some(Recycle::Starting(reason, _)) = slot.recycle else { return None };
        slot.recycle = Some(Recycle::Done(reason));
        self.stop_if_free(old, reason)
    }

    /// A worker that takes nothing more stops now if its R is free (idle, or
    /// only holding requests waiting on promises, which it drains).
    fn stop_if_free(&mut self, id: WorkerId, reason: Retire) -> Option<(WorkerId, Retire)> {
        let slot = self.slots.get_mut(&id)?;
        if !matches!(slot.state, State::Idle | State::Waiting) {
            return None;
        }
        slot.retired = Some(reason);
        if slot.parked > 0 || slot.sessions > 0 || !slot.pending.is_empty() {
            slot.state = State::Draining;
            return None;
        }
        slot.state = State::Stopping;
        Some((id, reason))
    }

    /// `gone` left before it answered (it failed to start, or was stopped):
    /// the worker it was to replace wants another.
    pub(super) fn replacement_gone(&mut self, gone: WorkerId) {
        if let Some(old) = self.replaces(gone) {
            if let Some(slot) = self.slots.get_mut(&old) {
                if let Some(Recycle::Starting(reason, _)) = slot.recycle {
                    slot.recycle = Some(Recycle::Wanted(reason));
                }
            }
        }
    }

    /// The worker budget across apps is spent and no place will come free
    /// for a replacement: workers waiting for one stop first instead (their
    /// exit makes the place). Returns those to stop now.
    pub fn no_room(&mut self) -> Vec<(WorkerId, Retire)> {
        let wanted: Vec<(WorkerId, Retire)> = self
            .slots
            .iter()
            .filter_map(|(id, s)| match s.recycle {
                Some(Recycle::Wanted(reason)) => Some((*id, reason)),
                _ => None,
            })
            .collect();
        let mut stop = Vec::new();
        for (id, reason) in wanted {
            if let Some(slot) = self.slots.get_mut(&id) {
                slot.recycle = Some(Recycle::Done(reason));
            }
            stop.extend(self.stop_if_free(id, reason));
        }
        stop
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::super::{Effect, Event, Ids, Limits, Note, Pool, Recycle, Retire, State, Timers, WorkerId};

    const TIMERS: Timers = Timers {
        probe_idle: Duration::from_secs(60),
        drain_quiet: Duration::from_secs(5),
        max_age: Duration::from_secs(600),
    };

    /// A pool of `n_min` ready workers, each replaced after `max_requests`
    /// (exactly: no jitter) or past 1000 bytes.
    fn pool(n_min: usize, n_max: usize, max_requests: u64) -> (Pool<u32>, Instant, Vec<WorkerId>) {
        let limits = Limits {
            n_min,
            n_max,
            max_requests: Some(max_requests),
            max_memory: Some(1000),
            max_sessions: 20,
            busy_threshold: 0.0,
            max_pending: 4,
        };
        let mut p = Pool::new(limits, Ids::default());
        let t0 = Instant::now();
        let ids = p.grow(t0, usize::MAX).ids;
        for id in &ids {
            p.slots.get_mut(id).unwrap().limit = Some(max_requests);
            feed(&mut p, t0, Event::Ready(*id));
        }
        (p, t0, ids)
    }

    fn feed(p: &mut Pool<u32>, now: Instant, e: Event) -> Vec<Effect<u32>> {
        p.handle(now, e, &TIMERS, |w| *w != 0)
    }

    /// One request on `w`, which must be the worker checked out.
    fn serve(p: &mut Pool<u32>, now: Instant, w: WorkerId) -> Vec<Effect<u32>> {
        assert_eq!(p.checkout(), Some(w));
        feed(p, now, Event::Completed(w))
    }

    fn recycle(p: &Pool<u32>, w: WorkerId) -> Option<Recycle> {
        p.slot(w).unwrap().recycle
    }

    /// Starts what the pool wants within `room`; returns the one worker started.
    fn replacement(p: &mut Pool<u32>, now: Instant, room: usize) -> WorkerId {
        let start = p.grow(now, room);
        assert_eq!(start.ids.len(), 1, "one replacement: {start:?}");
        start.ids[0]
    }

    #[test]
    fn past_max_requests_a_worker_serves_until_its_replacement_answers_then_takes_nothing_more() {
        let (mut p, t0, ids) = pool(1, 2, 2);
        let w = ids[0];
        assert_eq!(serve(&mut p, t0, w), vec![]);
        assert_eq!(serve(&mut p, t0, w), vec![Effect::Grow], "past its share: the pool asks for its replacement");
        assert_eq!(recycle(&p, w), Some(Recycle::Wanted(Retire::Requests)));
        assert_eq!(p.slot(w).unwrap().state, State::Idle, "it serves on");
        assert_eq!(p.wants(), 1);
        assert!(p.grow(t0, 0).ids.is_empty(), "no room in the budget: nothing starts");
        let r = replacement(&mut p, t0, 5);
        assert_eq!(recycle(&p, w), Some(Recycle::Starting(Retire::Requests, r)));
        assert_eq!((p.wants(), p.grow(t0, 5).ids.len()), (0, 0), "never a second replacement");
        assert_eq!(p.replaces(r), Some(w));
        assert_eq!(serve(&mut p, t0, w), vec![], "past its limit, it still serves while the replacement starts");
        assert_eq!(p.slot(w).unwrap().served, 3);

        // Busy as its replacement answers: it finishes, then stops, handing nothing on.
        assert_eq!(p.checkout(), Some(w));
        assert_eq!(feed(&mut p, t0, Event::Ready(r)), vec![Effect::Wake]);
        assert_eq!(recycle(&p, w), Some(Recycle::Done(Retire::Requests)));
        assert_eq!(p.checkout(), Some(r), "new requests go to the replacement");
        p.enqueue(9);
        assert_eq!(
            feed(&mut p, t0, Event::Completed(w)),
            vec![Effect::Retire { worker: w, reason: Retire::Requests, note: Note::Served }],
            "the waiter is not handed to the replaced worker"
        );
        assert_eq!(feed(&mut p, t0, Event::Completed(r)), vec![Effect::Hand { worker: r, waiter: 9 }]);
        assert_eq!(feed(&mut p, t0, Event::Exited(w)), vec![Effect::Wake]);
        assert_eq!((p.live(), p.wants()), (1, 0), "its exit calls for no other worker");
    }

    #[test]
    fn an_idle_worker_stops_as_its_replacement_answers() {
        let (mut p, t0, ids) = pool(1, 3, 1);
        let w = ids[0];
        assert_eq!(serve(&mut p, t0, w), vec![Effect::Grow]);
        let r = replacement(&mut p, t0, 1);
        assert_eq!(
            feed(&mut p, t0, Event::Ready(r)),
            vec![Effect::Retire { worker: w, reason: Retire::Requests, note: Note::Replaced }, Effect::Wake]
        );
        assert_eq!(p.slot(w).unwrap().state, State::Stopping);
        assert_eq!(p.checkout(), Some(r));
        assert_eq!(p.checkout(), None, "the replaced worker takes nothing");
    }

    #[test]
    fn past_max_worker_memory_idle_or_busy_a_worker_serves_until_its_replacement_answers() {
        let (mut p, t0, ids) = pool(2, 4, 100);
        let busy = p.checkout().unwrap();
        let idle = *ids.iter().find(|id| **id != busy).unwrap();
        assert_eq!(feed(&mut p, t0, Event::Memory(idle, 2000)), vec![Effect::Grow]);
        assert_eq!(recycle(&p, idle), Some(Recycle::Wanted(Retire::Memory)));
        assert_eq!(p.slot(idle).unwrap().state, State::Idle);
        assert_eq!(feed(&mut p, t0, Event::Memory(busy, 2000)), vec![], "busy: decided when its request ends");
        assert_eq!(feed(&mut p, t0, Event::Completed(busy)), vec![Effect::Grow]);
        assert_eq!(recycle(&p, busy), Some(Recycle::Wanted(Retire::Memory)));
        let started = p.grow(t0, 5).ids;
        assert_eq!(started.len(), 2, "one replacement each");
        assert_eq!(feed(&mut p, t0, Event::Memory(idle, 3000)), vec![], "a second sample changes nothing");
        let mut stopped = Vec::new();
        for r in started {
            for e in feed(&mut p, t0, Event::Ready(r)) {
                if let Effect::Retire { worker, reason: Retire::Memory, note: Note::Replaced } = e {
                    stopped.push(worker);
                }
            }
        }
        stopped.sort();
        assert_eq!(stopped, vec![idle.min(busy), idle.max(busy)]);
    }

    #[test]
    fn a_worker_pruned_for_age_is_not_replaced_the_pool_shrinks_on_purpose() {
        let (mut p, t0, _) = pool(1, 3, 100);
        p.enqueue(1);
        let extra = p.grow(t0, 5).ids;
        feed(&mut p, t0, Event::Ready(extra[0]));
        feed(&mut p, t0, Event::Completed(extra[0]));
        let old = t0 + TIMERS.max_age + Duration::from_secs(1);
        let tick = feed(&mut p, old, Event::Tick { prune: true });
        assert!(tick.iter().any(|e| matches!(e, Effect::Retire { reason: Retire::Idle, note: Note::Pruned, .. })));
        assert!(!tick.contains(&Effect::Grow), "{tick:?}");
        assert_eq!((p.unreplaced(), p.wants()), (0, 0), "down to n_min: nothing to replace");
    }

    #[test]
    fn without_a_place_under_n_max_a_worker_past_a_limit_stops_first() {
        let (mut p, t0, ids) = pool(2, 2, 1);
        let w = p.checkout().unwrap();
        assert_eq!(
            feed(&mut p, t0, Event::Completed(w)),
            vec![Effect::Retire { worker: w, reason: Retire::Requests, note: Note::Served }],
            "n_max is full: as before, it stops and its exit makes the place"
        );
        // Three places: the first worker past its limit gets one, the second does not.
        let (mut p, t0, ids3) = pool(2, 3, 1);
        let (a, b) = (p.checkout().unwrap(), p.checkout().unwrap());
        assert_eq!(feed(&mut p, t0, Event::Completed(a)), vec![Effect::Grow]);
        assert_eq!(
            feed(&mut p, t0, Event::Completed(b)),
            vec![Effect::Retire { worker: b, reason: Retire::Requests, note: Note::Served }]
        );
        assert_eq!(p.grow(t0, 5).ids.len(), 2, "a's replacement, and a worker in b's place for n_min");
        assert_eq!(p.slots().filter(|(_, s)| s.state != State::Stopping).count(), 3, "never above n_max");
        assert_eq!(p.grow(t0, 5).ids.len(), 0);
        let _ = (ids, ids3);
    }

    #[test]
    fn with_the_budget_spent_a_worker_waits_for_a_place_and_stops_first_when_none_will_come() {
        let (mut p, t0, ids) = pool(1, 2, 1);
        let w = ids[0];
        assert_eq!(serve(&mut p, t0, w), vec![Effect::Grow]);
        assert!(p.grow(t0, 0).ids.is_empty(), "the budget is spent");
        assert_eq!(serve(&mut p, t0, w), vec![], "a place may come free: it serves on");
        assert_eq!(
            feed(&mut p, t0, Event::NoRoom),
            vec![Effect::Retire { worker: w, reason: Retire::Requests, note: Note::Served }],
            "none will: it stops first"
        );
        assert_eq!(p.unreplaced(), 0);
        assert_eq!(feed(&mut p, t0, Event::Exited(w)), vec![Effect::Wake]);
        assert_eq!(p.grow(t0, 1).ids.len(), 1, "its place goes to the worker n_min wants");

        // Busy when told: it stops once its request ends.
        let (mut p, t0, ids) = pool(1, 2, 1);
        let w = ids[0];
        serve(&mut p, t0, w);
        assert_eq!(p.checkout(), Some(w));
        assert_eq!(feed(&mut p, t0, Event::NoRoom), vec![]);
        assert_eq!(
            feed(&mut p, t0, Event::Completed(w)),
            vec![Effect::Retire { worker: w, reason: Retire::Requests, note: Note::Served }]
        );
    }

    #[test]
    fn a_replacement_that_fails_to_start_is_started_again_after_the_backoff_while_the_old_one_serves() {
        let (mut p, t0, ids) = pool(1, 2, 1);
        let w = ids[0];
        serve(&mut p, t0, w);
        let r = replacement(&mut p, t0, 1);
        let t1 = t0 + Duration::from_millis(100);
        assert_eq!(feed(&mut p, t1, Event::Exited(r)), vec![Effect::Wake, Effect::Grow]);
        assert_eq!(recycle(&p, w), Some(Recycle::Wanted(Retire::Requests)), "wanted again");
        assert_eq!(serve(&mut p, t1, w), vec![], "the old worker serves on");
        let again = p.grow(t1, 1);
        assert_eq!(again.ids.len(), 1, "one new replacement");
        assert!(again.delay > Duration::ZERO, "after the crash-loop backoff: {again:?}");
        assert_eq!(recycle(&p, w), Some(Recycle::Starting(Retire::Requests, again.ids[0])));
        assert_eq!(
            feed(&mut p, t1, Event::Ready(again.ids[0])),
            vec![Effect::Retire { worker: w, reason: Retire::Requests, note: Note::Replaced }, Effect::Wake]
        );
    }

    #[test]
    fn a_generation_winding_down_replaces_nobody() {
        let (mut p, t0, ids) = pool(1, 3, 1);
        let w = ids[0];
        serve(&mut p, t0, w);
        let r = replacement(&mut p, t0, 1);
        let stops = feed(&mut p, t0, Event::WindDown);
        assert!(
            stops.contains(&Effect::Retire { worker: w, reason: Retire::Shutdown, note: Note::Silent })
                && stops.contains(&Effect::Retire { worker: r, reason: Retire::Shutdown, note: Note::Silent }),
            "the worker and its starting replacement stop: {stops:?}"
        );
        assert_eq!((p.unreplaced(), p.wants()), (0, 0));
        assert!(!stops.contains(&Effect::Grow));

        // A worker that passes its limit while its generation winds down stops as before.
        let (mut p, t0, ids) = pool(2, 3, 1);
        let busy = p.checkout().unwrap();
        feed(&mut p, t0, Event::WindDown);
        p.enqueue(4);
        assert_eq!(
            feed(&mut p, t0, Event::Completed(busy)),
            vec![Effect::Retire { worker: busy, reason: Retire::Requests, note: Note::Served }]
        );
        assert_eq!(p.wants(), 1, "the queued request still gets a worker, but no replacement is wanted");
        let _ = ids;
    }

    #[test]
    fn a_shiny_worker_past_a_limit_takes_no_new_session_and_its_replacement_starts_as_it_drains() {
        let (mut p, t0, ids) = pool(1, 2, 2);
        let w = ids[0];
        assert_eq!(p.touch(w, t0, None), Some(false));
        assert_eq!(p.touch(w, t0, None), Some(true), "its share: it drains");
        assert_eq!(p.slot(w).unwrap().state, State::Draining);
        assert_eq!(p.wants(), 1, "its replacement is wanted at once, not once it stopped");
        assert_eq!(p.pick_for_session(t0, 1, Duration::ZERO), None, "no new browser goes to it");
        // Past its memory with no session: it waits for its replacement and takes no session meanwhile.
        let (mut p, t0, ids) = pool(1, 2, 100);
        let w = ids[0];
        assert_eq!(feed(&mut p, t0, Event::Memory(w, 5000)), vec![Effect::Grow]);
        assert_eq!(p.pick_for_session(t0, 1, Duration::ZERO), None);
        let r = replacement(&mut p, t0, 1);
        feed(&mut p, t0, Event::Ready(r));
        assert_eq!(p.pick_for_session(t0, 2, Duration::ZERO), Some(r));
    }
}
