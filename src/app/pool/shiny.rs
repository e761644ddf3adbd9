//! Shiny: which worker a new browser goes to (one whose R is not busy, with
//! the fewest sessions below `--max-sessions`; grow when all are busy),
//! sessions opening and closing, requests counted per worker, and draining
//! workers past a limit once their sessions end.

use std::time::{Duration, Instant};

use super::{Pending, Pool, Retire, Slot, State, WorkerId, BUSY_PATIENCE};

impl<W> Pool<W> {
    /// Chooses the worker for a new Shiny session (the browser's `token` goes
    /// in its sticky cookie), the browser having waited `waited` so far:
    ///
    /// 1. a ready worker below `max_sessions` (browsers on their way included)
    ///    whose R is not busy (see `Slot::busy`), the one holding the fewest;
    /// 2. none, and a worker is starting or the pool can grow: `None`, the
    ///    caller waits for the new worker (see `wants`, `session_wanted`) or for
    ///    a worker to finish its work (`cpu_sampled`). When workers with room are
    ///    only busy and nothing starts (the budget across apps is spent), it
    ///    waits for up to `BUSY_PATIENCE`;
    /// 3. otherwise a worker below `max_sessions` open sessions: one with room
    ///    counting browsers on their way first (busy or not: those browsers
    ///    are real until they stay away), then one that is not busy, then the
    ///    one with the fewest sessions and browsers on their way (under load,
    ///    browsers whose page waits on a busy R are spread, not stacked on one
    ///    worker). Only when browsers on their way fill every place do they
    ///    stop holding them, so page loads that never open a session (a
    ///    crawler, an attack) lock nobody out. `None` only when every worker
    ///    holds `max_sessions` open sessions.
    ///
    /// With `busy_threshold` 0 no worker is busy: fewest sessions below
    /// `max_sessions`, and a new worker only when all are full.
    pub fn pick_for_session(&mut self, now: Instant, token: u64, waited: Duration) -> Option<WorkerId> {
        let max = self.limits.max_sessions;
        let threshold = self.limits.busy_threshold;
        let has_room = |s: &Slot| s.takes_sessions() && s.load(now) < max;
        let calm = self
            .slots
            .iter()
            .filter(|(_, s)| has_room(s) && !s.busy(now, threshold))
            .min_by_key(|(id, s)| (s.load(now), **id))
            .map(|(id, _)| *id);
        let starting = self.count(State::Starting) > 0;
        let can_grow = self.live() < self.limits.n_max;
        let only_busy = self.slots.values().any(has_room);
        let id = match calm {
            Some(id) => id,
            None if starting => return None,
            None if can_grow && !(only_busy && waited >= BUSY_PATIENCE) => return None,
            None => self
                .slots
                .iter()
                .filter(|(_, s)| s.takes_sessions() && s.sessions < max)
                .min_by_key(|(id, s)| (!has_room(s), s.busy(now, threshold), s.load(now), s.sessions, **id))
                .map(|(id, _)| *id)?,
        };
        let slot = self.slots.get_mut(&id)?;
        slot.forget_stale(now);
        // Bounded: a flood of page loads only replaces its own oldest entries.
        if slot.pending.len() >= max.saturating_mul(2).max(8) {
            slot.pending.pop_front();
        }
        slot.pending.push_back(Pending { token, at: now });
        slot.new_work = Some(now);
        Some(id)
    }

    /// A CPU sample of a Shiny worker: the share of the window since `since`
    /// its R spent running or waiting to run. Returns whether a browser
    /// waiting for a place may now take this worker (it has room, is not busy,
    /// and browsers wait): the caller wakes them.
    pub fn cpu_sampled(&mut self, id: WorkerId, now: Instant, since: Instant, share: f64) -> bool {
        let threshold = self.limits.busy_threshold;
        let max = self.limits.max_sessions;
        let demand = self.session_demand > 0;
        let Some(slot) = self.slots.get_mut(&id) else { return false };
        slot.cpu = Some(share);
        slot.cpu_since = Some(since);
        demand && slot.state == State::Idle && slot.load(now) < max && !slot.busy(now, threshold)
    }

    /// A browser waits for a place (all workers full): the pool wants a worker for it.
    pub fn session_wanted(&mut self) {
        self.session_demand += 1;
    }

    /// A browser that waited for a place got one or gave up.
    pub fn session_served(&mut self) {
        self.session_demand = self.session_demand.saturating_sub(1);
    }

    /// A Shiny session's WebSocket opened on a worker, from the browser with `token`.
    pub fn session_opened(&mut self, id: WorkerId, now: Instant, token: Option<u64>) {
        if let Some(slot) = self.slots.get_mut(&id) {
            slot.sessions += 1;
            slot.proven = true;
            slot.new_work = Some(now);
            if let Some(i) = slot.pending.iter().position(|p| Some(p.token) == token) {
                slot.pending.remove(i);
            }
            slot.last_used = now;
        }
    }

    /// A Shiny session ended.
    pub fn session_closed(&mut self, id: WorkerId, now: Instant) {
        if let Some(slot) = self.slots.get_mut(&id) {
            slot.sessions = slot.sessions.saturating_sub(1);
            slot.last_used = now;
        }
    }

    /// Counts one HTTP request on a Shiny worker (they share workers freely)
    /// from the browser with `token`, whose place it confirms and refreshes.
    /// `Some(true)`: the worker serves it and has now served its share, so it
    /// takes no new sessions. `None`: the worker does not serve (gone, stopping).
    pub fn touch(&mut self, id: WorkerId, now: Instant, token: Option<u64>) -> Option<bool> {
        let slot = self.slots.get_mut(&id)?;
        // A liveness probe does not hold a Shiny worker: its browsers' requests go on.
        if !matches!(slot.state, State::Idle | State::Draining | State::Probing) {
            return None;
        }
        slot.served += 1;
        slot.in_flight += 1;
        slot.last_used = now;
        if let Some(p) = slot.pending.iter_mut().find(|p| Some(p.token) == token) {
            p.at = now;
        }
        let spent = slot.state == State::Idle && slot.limit.is_some_and(|l| slot.served >= l);
        if spent {
            // It stops once its sessions end and its traffic has gone quiet.
            slot.state = State::Draining;
            slot.retired = Some(Retire::Requests);
        }
        Some(spent)
    }

    /// A Shiny request counted by `touch` is done (answered, or its
    /// WebSocket closed).
    pub fn finished(&mut self, id: WorkerId, now: Instant) {
        if let Some(slot) = self.slots.get_mut(&id) {
            slot.in_flight = slot.in_flight.saturating_sub(1);
            slot.last_used = now;
        }
    }

    /// Draining Shiny workers whose last session ended and whose traffic has
    /// been quiet for `quiet`: they are retired now (returned with the reason
    /// they drained for).
    pub fn drained(&mut self, now: Instant, quiet: Duration) -> Vec<(WorkerId, Retire)> {
        let done: Vec<(WorkerId, Retire)> = self
            .slots
            .iter()
            .filter(|(_, s)| {
                s.state == State::Draining
                    && s.sessions == 0
                    && s.parked == 0
                    && now.duration_since(s.last_used) >= quiet
            })
            .map(|(id, s)| (*id, s.retired.unwrap_or(Retire::Requests)))
            .collect();
        done.into_iter().filter(|(id, reason)| self.retire(*id, *reason)).collect()
    }
}
