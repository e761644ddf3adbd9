//! The queue and the hand-over: which idle worker takes a request (the most
//! recently used), the FIFO queue of waiters, a worker coming back (to the
//! next waiter, idle, or retired past its share or its memory), retiring,
//! and winding a generation down.

use std::time::Instant;

use super::{Done, Pool, Release, Retire, State, WorkerId};

impl<W> Pool<W> {
    /// Takes an idle worker for a request, if there is one. The most recently
    /// used idle worker is chosen, so that a quiet pool keeps a warm core and the
    /// rest age out and get pruned.
    pub fn checkout(&mut self) -> Option<WorkerId> {
        let (&id, slot) = self
            .slots
            .iter_mut()
            .filter(|(_, s)| s.state == State::Idle)
            .max_by_key(|(id, s)| (s.last_used, std::cmp::Reverse(**id)))?;
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
    /// a probe, or never used by the waiter it was handed to. It goes to the
    /// first waiter still waiting (`waiting` tells), or becomes idle, or, past
    /// its share of requests or its memory, is retired.
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
            Done::Unused => slot.served = slot.served.saturating_sub(1),
            Done::Probed => {}
        }
        let retire = if slot.over_memory {
            Some(Retire::Memory)
        } else if slot.limit.is_some_and(|limit| slot.served >= limit) {
            Some(Retire::Requests)
        } else {
            None
        };
        if let Some(reason) = retire {
            slot.state = State::Stopping;
            slot.retired = Some(reason);
            return Release::Retire(reason);
        }
        while let Some(waiter) = self.queue.pop_front() {
            if waiting(&waiter) {
                slot.state = State::Busy;
                slot.served += 1;
                return Release::Handoff(waiter);
            }
        }
        if self.winding_down {
            slot.state = State::Stopping;
            slot.retired = Some(Retire::Shutdown);
            return Release::Retire(Retire::Shutdown);
        }
        slot.state = State::Idle;
        Release::Idle
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

    /// Winds this generation down: idle workers stop now, busy ones when their
    /// request ends (after the requests already queued), Shiny workers holding
    /// sessions or browsers on their way drain. Returns the workers to stop now.
    pub fn wind_down(&mut self) -> Vec<(WorkerId, Retire)> {
        self.winding_down = true;
        self.limits.n_min = 0;
        let mut stop = Vec::new();
        for (id, slot) in self.slots.iter_mut() {
            if slot.state != State::Idle {
                continue;
            }
            slot.retired = Some(Retire::Shutdown);
            if slot.sessions == 0 && slot.pending.is_empty() {
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
