//! The pool's one entry for the supervisor's executor: it is fed what
//! happened (`Event`) and returns what should happen (`Effect`s), as plain
//! values. The executor carries the effects out (signals, hand-overs,
//! probes, wake-ups) and decides nothing itself.

use std::time::{Duration, Instant};

use super::{Done, Pool, Release, Retire, WorkerId};

/// What happened to the pool's workers, or to time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Event {
    /// A worker answered its readiness probe.
    Ready(WorkerId),
    /// A worker finished a request (answered it, or R finished one whose client left).
    Completed(WorkerId),
    /// An idle worker answered its liveness probe.
    Probed(WorkerId),
    /// R returned a pending promise for the request the worker computed: it
    /// holds that request and is free to compute another.
    Parked(WorkerId),
    /// A request the worker held waiting on a promise is over (answered,
    /// timed out, its client gone).
    Settled(WorkerId),
    /// A worker handed to a waiter that had just left comes back untouched.
    Unused(WorkerId),
    /// A worker must go now: it broke, hung, stopped answering, or another
    /// app needs its place in the budget.
    Retire(WorkerId, Retire),
    /// A worker's memory was read: this many bytes.
    Memory(WorkerId, u64),
    /// A Shiny worker's R ran (or waited to run) `share` of one CPU since `since`.
    Cpu { worker: WorkerId, since: Instant, share: f64 },
    /// A worker's process is gone.
    Exited(WorkerId),
    /// A Shiny session ended on a worker.
    SessionClosed(WorkerId),
    /// The background loop's tick; `prune` when `check_unused` has passed since the last prune.
    Tick { prune: bool },
    /// This generation is being replaced or removed.
    WindDown,
    /// The worker budget across apps is spent and no place will come free
    /// (no worker is stopping, no other app's idle one can give way): what
    /// the pool wants cannot start now.
    NoRoom,
    /// The app stops: every worker goes, and waiters are turned away.
    Close,
}

/// The timers the pool's rules run on (the supervisor's settings).
#[derive(Clone, Copy, Debug)]
pub struct Timers {
    /// An idle worker unused this long is due a liveness probe.
    pub probe_idle: Duration,
    /// A draining Shiny worker with no session left stops after this long without traffic.
    pub drain_quiet: Duration,
    /// An idle worker unused longer than this is pruned (down to `n_min`).
    pub max_age: Duration,
}

/// Why a retirement is worth a log line of its own (the reason alone does not say).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Note {
    /// The caller logged it already, or it needs no line (shutdown, winding down).
    Silent,
    /// Retired as it came back from a request: its share of requests, its memory, or its generation is going.
    Served,
    /// A draining Shiny worker whose last session ended.
    Drained,
    /// Unused for longer than `--max-age`.
    Pruned,
    /// An idle worker whose memory sample passed `--max-worker-memory`.
    OverMemory,
    /// A worker past a limit whose replacement answers now.
    Replaced,
}

/// What should happen, for the executor to carry out.
#[derive(Debug, PartialEq)]
pub enum Effect<W> {
    /// Stop the worker: SIGTERM and time to finish when `reason` is gentle, SIGKILL otherwise.
    Retire { worker: WorkerId, reason: Retire, note: Note },
    /// The worker is busy for this waiter now: give it to them. If they left
    /// meanwhile, feed `Event::Unused` back.
    Hand { worker: WorkerId, waiter: W },
    /// Ping the idle worker; it is given nothing else until it answers.
    Probe(WorkerId),
    /// Browsers waiting for a place may find one now.
    Wake,
    /// Turn this waiter away: the app is stopping.
    Dismiss(W),
    /// The pool wants more workers than it has now (a worker past a limit
    /// waits for its replacement, or began to drain): grow it as far as the
    /// worker budget allows.
    Grow,
}

impl<W> Pool<W> {
    /// Feeds the pool one event at `now`; `waiting` tells whether a queued
    /// waiter still waits. Returns what should happen, in order.
    pub fn handle(
        &mut self,
        now: Instant,
        event: Event,
        timers: &Timers,
        waiting: impl Fn(&W) -> bool,
    ) -> Vec<Effect<W>> {
        let mut out = Vec::new();
        let leaving = self.leaving();
        match event {
            Event::Ready(id) => {
                self.came_back(id, now, Done::Ready, &waiting, &mut out);
                if let Some((old, reason)) = self.relieve(id) {
                    out.push(Effect::Retire { worker: old, reason, note: Note::Replaced });
                }
                out.push(Effect::Wake);
            }
            Event::Completed(id) => self.came_back(id, now, Done::Completed, &waiting, &mut out),
            Event::Probed(id) => self.came_back(id, now, Done::Probed, &waiting, &mut out),
            Event::Parked(id) => self.came_back(id, now, Done::Parked, &waiting, &mut out),
            Event::Settled(id) => {
                let release = self.settled(id, now, &waiting);
                self.went(id, release, &mut out);
            }
            Event::Unused(id) => self.came_back(id, now, Done::Unused, &waiting, &mut out),
            Event::Retire(id, reason) => {
                if self.retire(id, reason) {
                    out.push(Effect::Retire { worker: id, reason, note: Note::Silent });
                }
            }
            Event::Memory(id, bytes) => {
                if let Some(reason) = self.sampled(id, bytes) {
                    out.push(Effect::Retire { worker: id, reason, note: Note::OverMemory });
                }
            }
            Event::Cpu { worker, since, share } => {
                if self.cpu_sampled(worker, now, since, share) {
                    out.push(Effect::Wake);
                }
            }
            Event::Exited(id) => {
                self.exited(id, now);
                out.push(Effect::Wake);
            }
            Event::SessionClosed(id) => {
                self.session_closed(id, now);
                out.push(Effect::Wake);
            }
            Event::Tick { prune } => {
                for (id, reason) in self.drained(now, timers.drain_quiet) {
                    out.push(Effect::Retire { worker: id, reason, note: Note::Drained });
                }
                if prune {
                    for id in self.prune(now, timers.max_age) {
                        out.push(Effect::Retire { worker: id, reason: Retire::Idle, note: Note::Pruned });
                    }
                }
                out.extend(self.due_for_probe(now, timers.probe_idle).into_iter().map(Effect::Probe));
            }
            Event::WindDown => {
                for (id, reason) in self.wind_down() {
                    out.push(Effect::Retire { worker: id, reason, note: Note::Silent });
                }
                out.push(Effect::Wake);
            }
            Event::NoRoom => {
                for (id, reason) in self.no_room() {
                    out.push(Effect::Retire { worker: id, reason, note: Note::Served });
                }
            }
            Event::Close => {
                for id in self.retire_all() {
                    out.push(Effect::Retire { worker: id, reason: Retire::Shutdown, note: Note::Silent });
                }
                out.extend(self.drain_waiters().into_iter().map(Effect::Dismiss));
                out.push(Effect::Wake);
            }
        }
        // A worker began to leave (past a limit, serving on; draining) but
        // holds its place in the budget: its replacement may start now.
        if self.leaving() > leaving && !self.winding_down {
            out.push(Effect::Grow);
        }
        out
    }

    /// Workers past a limit that wait for a replacement, and draining ones.
    fn leaving(&self) -> usize {
        self.unreplaced() + self.count(super::State::Draining)
    }

    /// A worker came back: to the next waiter, idle, or retired.
    fn came_back(
        &mut self,
        id: WorkerId,
        now: Instant,
        done: Done,
        waiting: &impl Fn(&W) -> bool,
        out: &mut Vec<Effect<W>>,
    ) {
        let release = self.release(id, now, done, waiting);
        self.went(id, release, out);
    }

    /// What a worker coming back means for the executor.
    fn went(&mut self, id: WorkerId, release: Release<W>, out: &mut Vec<Effect<W>>) {
        match release {
            Release::Handoff(waiter) => out.push(Effect::Hand { worker: id, waiter }),
            Release::Retire(reason) => out.push(Effect::Retire { worker: id, reason, note: Note::Served }),
            Release::Idle | Release::Gone | Release::Settling => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Ids, Limits, State};
    use super::*;

    const TIMERS: Timers = Timers {
        probe_idle: Duration::from_secs(1),
        drain_quiet: Duration::from_secs(5),
        max_age: Duration::from_secs(10),
    };

    fn pool(n_min: usize, n_max: usize) -> (Pool<u32>, Instant, Vec<WorkerId>) {
        let limits = Limits {
            n_min,
            n_max,
            max_requests: None,
            max_memory: Some(1000),
            max_sessions: 20,
            busy_threshold: 0.5,
            max_pending: 4,
        };
        let mut p = Pool::new(limits, Ids::default());
        let t0 = Instant::now();
        let ids = p.grow(t0, usize::MAX).ids;
        (p, t0, ids)
    }

    fn feed(p: &mut Pool<u32>, now: Instant, e: Event) -> Vec<Effect<u32>> {
        p.handle(now, e, &TIMERS, |w| *w != 0)
    }

    #[test]
    fn a_ready_worker_goes_to_the_first_waiter_still_waiting_and_wakes_browsers() {
        let (mut p, t0, ids) = pool(1, 1);
        p.enqueue(0);
        p.enqueue(7);
        assert_eq!(
            feed(&mut p, t0, Event::Ready(ids[0])),
            vec![Effect::Hand { worker: ids[0], waiter: 7 }, Effect::Wake],
            "the waiter that left (0) is skipped"
        );
        assert_eq!(feed(&mut p, t0, Event::Unused(ids[0])), vec![], "a hand-over that found nobody makes it idle");
        assert_eq!(p.slot(ids[0]).unwrap().state, State::Idle);
    }

    #[test]
    fn a_worker_retired_twice_is_stopped_once() {
        let (mut p, t0, ids) = pool(1, 1);
        feed(&mut p, t0, Event::Ready(ids[0]));
        let stop = Effect::Retire { worker: ids[0], reason: Retire::Broken, note: Note::Silent };
        assert_eq!(feed(&mut p, t0, Event::Retire(ids[0], Retire::Broken)), vec![stop]);
        assert_eq!(feed(&mut p, t0, Event::Retire(ids[0], Retire::Timeout)), vec![]);
        assert_eq!(feed(&mut p, t0, Event::Exited(ids[0])), vec![Effect::Wake]);
        assert!(p.slot(ids[0]).is_none());
    }

    #[test]
    fn memory_over_the_limit_retires_an_idle_worker_now_and_a_busy_one_serves_on_until_replaced() {
        let (mut p, t0, ids) = pool(2, 2);
        feed(&mut p, t0, Event::Ready(ids[0]));
        feed(&mut p, t0, Event::Ready(ids[1]));
        let busy = p.checkout().unwrap();
        let idle = *ids.iter().find(|id| **id != busy).unwrap();
        assert_eq!(
            feed(&mut p, t0, Event::Memory(idle, 2000)),
            vec![Effect::Retire { worker: idle, reason: Retire::Memory, note: Note::OverMemory }]
        );
        assert_eq!(feed(&mut p, t0, Event::Memory(busy, 2000)), vec![]);
        // The idle one's place under n_max is free: the busy one serves on
        // while a replacement starts there (see `recycle`).
        assert_eq!(feed(&mut p, t0, Event::Completed(busy)), vec![Effect::Grow]);
    }

    #[test]
    fn the_tick_probes_idle_workers_prunes_only_when_asked_and_stops_drained_ones() {
        let (mut p, t0, ids) = pool(1, 3);
        feed(&mut p, t0, Event::Ready(ids[0]));
        let more = p.grow(t0, usize::MAX);
        assert!(more.ids.is_empty());
        p.enqueue(1);
        p.enqueue(2);
        let extra = p.grow(t0, usize::MAX).ids;
        for id in &extra {
            feed(&mut p, t0, Event::Ready(*id));
        }
        // Both extra workers served their waiter; give them back.
        for id in &extra {
            feed(&mut p, t0, Event::Completed(*id));
        }
        let t1 = t0 + Duration::from_millis(500);
        assert_eq!(feed(&mut p, t1, Event::Tick { prune: true }), vec![], "nothing is due yet");
        let t2 = t0 + Duration::from_secs(2);
        let probes = feed(&mut p, t2, Event::Tick { prune: false });
        assert_eq!(probes.len(), 3, "each idle worker is probed: {probes:?}");
        for e in probes {
            let Effect::Probe(id) = e else { panic!("a probe: {e:?}") };
            assert_eq!(feed(&mut p, t2, Event::Probed(id)), vec![]);
        }
        let t3 = t0 + Duration::from_secs(11);
        let tick = feed(&mut p, t3, Event::Tick { prune: true });
        let pruned =
            tick.iter().filter(|e| matches!(e, Effect::Retire { note: Note::Pruned, reason: Retire::Idle, .. }));
        assert_eq!(pruned.count(), 2, "pruned down to n_min: {tick:?}");
        for e in tick {
            if let Effect::Probe(id) = e {
                feed(&mut p, t3, Event::Probed(id));
            }
        }
        // A Shiny worker past its memory drains, then stops once quiet.
        let shiny = *ids.iter().chain(&extra).find(|id| p.slot(**id).unwrap().state == State::Idle).unwrap();
        p.session_opened(shiny, t3, None);
        assert_eq!(feed(&mut p, t3, Event::Memory(shiny, 5000)), vec![Effect::Grow], "its replacement may start");
        assert_eq!(p.slot(shiny).unwrap().state, State::Draining);
        assert_eq!(feed(&mut p, t3, Event::SessionClosed(shiny)), vec![Effect::Wake]);
        let quiet = t3 + TIMERS.drain_quiet;
        assert_eq!(
            feed(&mut p, quiet, Event::Tick { prune: false }),
            vec![Effect::Retire { worker: shiny, reason: Retire::Memory, note: Note::Drained }]
        );
    }

    #[test]
    fn a_cpu_sample_wakes_browsers_only_when_one_waits_and_the_worker_calmed_down() {
        let (mut p, t0, ids) = pool(1, 1);
        feed(&mut p, t0, Event::Ready(ids[0]));
        let cpu = |share| Event::Cpu { worker: ids[0], since: t0, share };
        assert_eq!(feed(&mut p, t0, cpu(0.1)), vec![], "nobody waits");
        p.session_wanted();
        assert_eq!(feed(&mut p, t0, cpu(0.9)), vec![], "still busy");
        assert_eq!(feed(&mut p, t0, cpu(0.1)), vec![Effect::Wake]);
    }

    #[test]
    fn winding_down_and_closing_say_whom_to_stop_and_turn_waiters_away() {
        let (mut p, t0, ids) = pool(2, 2);
        feed(&mut p, t0, Event::Ready(ids[0]));
        feed(&mut p, t0, Event::Ready(ids[1]));
        let busy = p.checkout().unwrap();
        let idle = *ids.iter().find(|id| **id != busy).unwrap();
        assert_eq!(
            feed(&mut p, t0, Event::WindDown),
            vec![Effect::Retire { worker: idle, reason: Retire::Shutdown, note: Note::Silent }, Effect::Wake]
        );
        p.enqueue(5);
        assert_eq!(
            feed(&mut p, t0, Event::Close),
            vec![
                Effect::Retire { worker: busy, reason: Retire::Shutdown, note: Note::Silent },
                Effect::Dismiss(5),
                Effect::Wake
            ]
        );
    }

    fn with_pending(
        n_min: usize,
        n_max: usize,
        max_pending: usize,
        max_requests: Option<u64>,
    ) -> (Pool<u32>, Instant, Vec<WorkerId>) {
        let (mut p, t0, ids) = pool(n_min, n_max);
        p.limits.max_pending = max_pending;
        p.limits.max_requests = max_requests;
        for id in &ids {
            p.slots.get_mut(id).unwrap().limit = max_requests;
            feed(&mut p, t0, Event::Ready(*id));
        }
        (p, t0, ids)
    }

    #[test]
    fn a_worker_waiting_on_promises_takes_more_up_to_max_pending_then_the_queue_waits_for_a_settle() {
        let (mut p, t0, ids) = with_pending(1, 1, 2, None);
        let w = ids[0];
        assert_eq!(p.checkout(), Some(w));
        assert_eq!(feed(&mut p, t0, Event::Parked(w)), vec![]);
        assert_eq!((p.slot(w).unwrap().state, p.slot(w).unwrap().parked), (State::Waiting, 1));
        assert_eq!(p.checkout(), Some(w), "R is free: it takes the next request");
        assert_eq!(feed(&mut p, t0, Event::Parked(w)), vec![]);
        assert_eq!(p.checkout(), None, "it holds max_pending promises");
        p.enqueue(9);
        assert_eq!(feed(&mut p, t0, Event::Settled(w)), vec![Effect::Hand { worker: w, waiter: 9 }]);
        assert_eq!((p.slot(w).unwrap().state, p.slot(w).unwrap().parked), (State::Busy, 1));
        assert_eq!(feed(&mut p, t0, Event::Completed(w)), vec![]);
        assert_eq!(p.slot(w).unwrap().state, State::Waiting);
        assert_eq!(feed(&mut p, t0, Event::Settled(w)), vec![]);
        assert_eq!((p.slot(w).unwrap().state, p.slot(w).unwrap().parked), (State::Idle, 0));
    }

    #[test]
    fn an_idle_worker_first_then_the_one_waiting_on_the_fewest_promises() {
        let (mut p, t0, _) = with_pending(3, 3, 4, None);
        for _ in 0..3 {
            let w = p.checkout().unwrap();
            feed(&mut p, t0, Event::Parked(w));
        }
        let two = p.checkout().unwrap();
        feed(&mut p, t0, Event::Parked(two));
        assert_eq!(p.slot(two).unwrap().parked, 2);
        let next = p.checkout().unwrap();
        assert_eq!(p.slot(next).unwrap().parked, 1, "one holding fewer promises");
        feed(&mut p, t0, Event::Completed(next));
        feed(&mut p, t0, Event::Settled(two));
        feed(&mut p, t0, Event::Settled(two));
        assert_eq!(p.slot(two).unwrap().state, State::Idle);
        assert_eq!(p.checkout(), Some(two), "an idle worker before any waiting one");
    }

    #[test]
    fn zero_max_pending_takes_nothing_while_a_promise_is_pending() {
        let (mut p, t0, ids) = with_pending(1, 1, 0, None);
        let w = ids[0];
        assert_eq!(p.checkout(), Some(w));
        feed(&mut p, t0, Event::Parked(w));
        assert_eq!(p.checkout(), None);
        p.enqueue(3);
        assert_eq!(feed(&mut p, t0, Event::Settled(w)), vec![Effect::Hand { worker: w, waiter: 3 }]);
    }

    #[test]
    fn recycling_and_winding_down_wait_for_pending_promises() {
        // n_max 1: no place for a replacement to start first (see `recycle`).
        let (mut p, t0, ids) = with_pending(1, 1, 4, Some(1));
        let w = ids[0];
        assert_eq!(p.checkout(), Some(w));
        assert_eq!(
            feed(&mut p, t0, Event::Parked(w)),
            vec![Effect::Grow],
            "past its share, it stops once its promise settles; its replacement may start"
        );
        assert_eq!(p.slot(w).unwrap().state, State::Draining);
        assert_eq!(p.checkout(), None, "a settling worker takes nothing");
        let quiet = t0 + TIMERS.drain_quiet * 2;
        let tick = feed(&mut p, quiet, Event::Tick { prune: false });
        assert!(!tick.iter().any(|e| matches!(e, Effect::Retire { .. })), "not while a promise is pending: {tick:?}");
        assert_eq!(
            feed(&mut p, quiet, Event::Settled(w)),
            vec![Effect::Retire { worker: w, reason: Retire::Requests, note: Note::Served }]
        );

        let (mut p, t0, ids) = with_pending(1, 1, 4, None);
        let w = ids[0];
        p.checkout();
        feed(&mut p, t0, Event::Parked(w));
        assert_eq!(feed(&mut p, t0, Event::WindDown), vec![Effect::Wake], "it drains, holding a promise");
        assert_eq!(p.slot(w).unwrap().state, State::Draining);
        assert_eq!(
            feed(&mut p, t0, Event::Settled(w)),
            vec![Effect::Retire { worker: w, reason: Retire::Shutdown, note: Note::Served }]
        );
    }
}
