//! The queue and the hand-over: which worker takes a request (the most
//! recently used idle one, else the one waiting on the fewest promises), the
//! FIFO queue of waiters, a worker coming back (to the next waiter, idle or
//! waiting; past its share or its memory, serving on while its replacement
//! starts, or retired once its promises settle), retiring, and winding a
//! generation down.

use std::time::Instant;

use super::{Done, Pool, Recycle, Release, Retire, State, WorkerId};

impl<W> Pool<W> {
    /// Takes a worker for a request, if one is free: the most recently used
    /// idle worker (so that a quiet pool keeps a warm core and the rest age
    /// out and get pruned), else the worker waiting on the fewest promises
    /// that holds fewer than `max_pending` (R is free there now; a new
    /// worker would first have to start).
    pub fn checkout(&mut self) -> Option<WorkerId> {
        let max_pending = self.limits.max_pending;
        let idle = self
            .slots
            .iter()
            .filter(|(_, s)| s.state == State::Idle)
            .max_by_key(|(id, s)| (s.last_used, std::cmp::Reverse(**id)))
            .map(|(id, _)| *id);
        let id = idle.or_else(|| {
            self.slots
                .iter()
                .filter(|(_, s)| s.state == State::Waiting && s.parked < max_pending)
                .min_by_key(|(id, s)| (s.parked, std::cmp::Reverse(s.last_used), **id))
                .map(|(id, _)| *id)
        })?;
        let slot = self.slots.get_mut(&id)?;
        slot.state = State::Busy;
        slot.served += 1;
        Some(id)
    }

    /// Queues a waiter (after `checkout` found no idle worker).
    pub fn enqueue(&mut self, waiter: W) {
        self.queue.push_back(waiter);
    }

    /// Drops waiters the caller no longer wants (clients that went away).
    pub fn retain_waiters(&mut self, keep: impl FnMut(&W) -> bool) {
        self.queue.retain(keep);
    }

    /// A worker comes back: ready for the first time, done with a request or
    /// a probe, its request left waiting on a promise, or never used by the
    /// waiter it was handed to. It goes to the first waiter still waiting
    /// (`waiting` tells), or becomes idle (waiting, if it holds requests
    /// waiting on promises), or, past its share of requests or its memory,
    /// is retired (once those requests settle).
    pub fn release(&mut self, id: WorkerId, now: Instant, done: Done, waiting: impl Fn(&W) -> bool) -> Release<W> {
        let Some(slot) = self.slots.get_mut(&id) else {
            return Release::Gone;
        };
        if matches!(slot.state, State::Stopping | State::Draining) {
            return Release::Gone;
        }
        match done {
            Done::Ready => {
                slot.ready_at = Some(now);
                slot.last_used = now;
            }
            Done::Completed => {
                slot.proven = true;
                slot.last_used = now;
            }
            Done::Parked => {
                slot.proven = true;
                slot.last_used = now;
                slot.parked += 1;
            }
            Done::Unused => slot.served = slot.served.saturating_sub(1),
            Done::Probed => {}
        }
        self.free(id, waiting)
    }

    /// A request a worker held waiting on a promise is over (answered, timed
    /// out, or its client left). A worker due to stop stops once none is left;
    /// a waiting one takes the next waiter, or is idle once none is left.
    pub fn settled(&mut self, id: WorkerId, now: Instant, waiting: impl Fn(&W) -> bool) -> Release<W> {
        let Some(slot) = self.slots.get_mut(&id) else {
            return Release::Gone;
        };
        slot.parked = slot.parked.saturating_sub(1);
        slot.last_used = now;
        match slot.state {
            State::Waiting => self.free(id, waiting),
            State::Draining if slot.parked == 0 && slot.sessions == 0 && slot.pending.is_empty() => {
                let reason = slot.retired.unwrap_or(Retire::Requests);
                Self::stop_when_settled(slot, reason)
            }
            _ => Release::Gone,
        }
    }

    /// Where a worker whose R is free goes: retired (its replacement
    /// answers, or past its share or its memory without a place for a
    /// replacement, or its generation winding down; once its requests
    /// waiting on promises settle), to the next waiter, or idle (waiting, if
    /// it holds such requests). Past a limit with a place for a replacement,
    /// it serves on while that starts (`recycle`).
    fn free(&mut self, id: WorkerId, waiting: impl Fn(&W) -> bool) -> Release<W> {
        let max_pending = self.limits.max_pending;
        let Some(slot) = self.slots.get(&id) else {
            return Release::Gone;
        };
        let past = match slot.recycle {
            Some(Recycle::Done(reason)) => Some(reason),
            Some(_) => None,
            None => slot.past_limit().filter(|reason| !self.recycle_first(id, *reason)),
        };
        let Some(slot) = self.slots.get_mut(&id) else {
            return Release::Gone;
        };
        if let Some(reason) = past {
            return Self::stop_when_settled(slot, reason);
        }
        if slot.parked == 0 || slot.parked < max_pending {
            while let Some(waiter) = self.queue.pop_front() {
                if waiting(&waiter) {
                    slot.state = State::Busy;
                    slot.served += 1;
                    return Release::Handoff(waiter);
                }
            }
        }
        // A generation winding down still serves the requests already queued.
        if self.winding_down && !self.queue.iter().any(&waiting) {
            return Self::stop_when_settled(slot, Retire::Shutdown);
        }
        slot.state = if slot.parked > 0 { State::Waiting } else { State::Idle };
        Release::Idle
    }

    /// Stops a worker now, or once its requests waiting on promises settle
    /// (it takes nothing more meanwhile).
    fn stop_when_settled(slot: &mut super::Slot, reason: Retire) -> Release<W> {
        slot.retired = Some(reason);
        if slot.parked > 0 {
            slot.state = State::Draining;
            return Release::Settling;
        }
        slot.state = State::Stopping;
        Release::Retire(reason)
    }

    /// Takes a worker out of service now. Returns false if it was not in service.
    pub fn retire(&mut self, id: WorkerId, reason: Retire) -> bool {
        match self.slots.get_mut(&id) {
            Some(slot) if slot.state != State::Stopping => {
                slot.state = State::Stopping;
                slot.retired = Some(reason);
                true
            }
            _ => false,
        }
    }

    /// Retires every worker and returns the ids of those not already stopping.
    pub fn retire_all(&mut self) -> Vec<WorkerId> {
        let ids: Vec<WorkerId> = self.slots.keys().copied().collect();
        ids.into_iter().filter(|id| self.retire(*id, Retire::Shutdown)).collect()
    }

    /// Takes every waiter out of the queue (at shutdown).
    pub fn drain_waiters(&mut self) -> Vec<W> {
        self.queue.drain(..).collect()
    }

    /// Whether this generation is winding down (a reload replaced it).
    pub fn is_winding_down(&self) -> bool {
        self.winding_down
    }

    /// Winds this generation down: idle workers stop now, busy ones when their
    /// request ends (after the requests already queued), Shiny workers holding
    /// sessions or browsers on their way drain. Returns the workers to stop now.
    pub fn wind_down(&mut self) -> Vec<(WorkerId, Retire)> {
        self.winding_down = true;
        self.limits.n_min = 0;
        let mut stop = Vec::new();
        for (id, slot) in self.slots.iter_mut() {
            if !matches!(slot.state, State::Idle | State::Waiting) {
                continue;
            }
            slot.retired = Some(Retire::Shutdown);
            if slot.sessions == 0 && slot.pending.is_empty() && slot.parked == 0 {
                slot.state = State::Stopping;
                stop.push((*id, Retire::Shutdown));
            } else {
                slot.state = State::Draining;
            }
        }
        if self.queue.is_empty() {
            for (id, slot) in self.slots.iter_mut().filter(|(_, s)| s.state == State::Starting) {
                slot.state = State::Stopping;
                slot.retired = Some(Retire::Shutdown);
                stop.push((*id, Retire::Shutdown));
            }
        }
        stop
    }
}
