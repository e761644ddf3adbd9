//! Whether a worker is still fit to serve: its memory against
//! `--max-worker-memory`, and liveness probes for idle workers.

use std::time::{Duration, Instant};

use super::{Pool, Retire, State, WorkerId};

impl<W> Pool<W> {
    /// A memory sample. A worker past the limit serves on while its
    /// replacement starts when it can have one (`recycle`), else is retired
    /// now if idle; it is retired after its request if busy, or drained
    /// (Shiny, with sessions; plumber, with requests waiting on promises and
    /// no place for a replacement).
    pub fn sampled(&mut self, id: WorkerId, bytes: u64) -> Option<Retire> {
        let over = self.limits.max_memory.is_some_and(|max| bytes > max);
        let slot = self.slots.get_mut(&id)?;
        slot.memory = Some(bytes);
        if !over || slot.recycle.is_some() {
            return None;
        }
        let plain = slot.sessions == 0 && slot.pending.is_empty();
        if plain && matches!(slot.state, State::Idle | State::Waiting) && self.recycle_first(id, Retire::Memory) {
            return None;
        }
        let slot = self.slots.get_mut(&id)?;
        match slot.state {
            State::Idle if plain => self.retire(id, Retire::Memory).then_some(Retire::Memory),
            State::Idle | State::Waiting => {
                slot.state = State::Draining;
                slot.retired = Some(Retire::Memory);
                None
            }
            State::Busy | State::Probing => {
                slot.over_memory = true;
                None
            }
            _ => None,
        }
    }

    /// Idle workers unused for `every` that are due a liveness probe; they are
    /// marked probing, so nothing else is given to them meanwhile.
    pub fn due_for_probe(&mut self, now: Instant, every: Duration) -> Vec<WorkerId> {
        let mut due = Vec::new();
        for (id, slot) in self.slots.iter_mut() {
            // A Shiny worker with sessions proves itself by serving them.
            if slot.state == State::Idle
                && slot.sessions == 0
                && slot.in_flight == 0
                && now.duration_since(slot.last_used) >= every
            {
                slot.state = State::Probing;
                due.push(*id);
            }
        }
        due
    }
}
