//! The pool's bookkeeping: which workers exist, what state each is in, who waits
//! for one, and when to grow or shrink. Pure logic: no processes, no sockets, no
//! clocks of its own (callers pass `now`), so every decision is unit-tested.
//!
//! The pool only decides. It hands back the ids of workers to start or stop and
//! the waiters to serve; the supervisor carries those decisions out.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// A worker's identity for its whole life; never reused within one valve run.
pub type WorkerId = u64;

/// Where a worker is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Launched (or waiting to be launched) but not yet answering.
    Starting,
    /// Answering and free to take a request.
    Idle,
    /// Serving a request; never given a second one.
    Busy,
    /// Asked to stop; takes no more requests.
    Stopping,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Idle => "idle",
            State::Busy => "busy",
            State::Stopping => "stopping",
        }
    }
}

/// What the pool knows of one worker.
#[derive(Clone, Debug)]
pub struct Slot {
    pub state: State,
    /// When the worker last finished a request (or became ready).
    pub last_used: Instant,
    pub created: Instant,
    pub served: u64,
    /// The worker finished a request or opened a Shiny session: it works, so
    /// its death is not a failed start (crash-loop backoff ignores it).
    pub proven: bool,
    /// Requests after which the worker is replaced (`--max-requests` plus jitter).
    pub limit: Option<u64>,
    /// Shiny sessions the worker holds (open WebSockets). A worker with
    /// sessions is never pruned.
    pub sessions: usize,
    /// Browsers sent to this worker whose WebSocket has not opened yet, and
    /// when the last was sent (they stop counting after `PENDING_FOR`).
    pub pending: usize,
    pub pending_at: Instant,
}

/// How long a browser sent to a Shiny worker counts against it before its
/// WebSocket opens.
const PENDING_FOR: Duration = Duration::from_secs(30);

impl Slot {
    fn load(&self, now: Instant) -> usize {
        let pending = if now.duration_since(self.pending_at) < PENDING_FOR { self.pending } else { 0 };
        self.sessions + pending
    }
}

/// How big the pool may be.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub n_min: usize,
    pub n_max: usize,
    /// Replace a worker after about this many requests.
    pub max_requests: Option<u64>,
}

/// The result of returning a worker to the pool.
#[derive(Debug)]
pub enum Release<W> {
    /// The worker stays busy and goes straight to this waiter.
    Handoff(W),
    /// Nobody waits: the worker is idle now.
    Idle,
    /// The worker is no longer in the pool (it exited or is stopping).
    Gone,
    /// The worker served its share of requests and is now stopping; start
    /// these to replace it.
    Retire(Vec<WorkerId>),
}

/// Up to 10% more requests for some workers than others, spread by worker id,
/// so that workers started together are not all replaced together.
fn jittered(max_requests: u64, id: WorkerId) -> u64 {
    let mut x = id.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    max_requests + x % (max_requests / 10 + 1)
}

/// The pool of workers and the FIFO queue of requests waiting for one.
/// `W` is whatever a waiter is to the caller (a channel in valve, a number in tests).
#[derive(Debug)]
pub struct Pool<W> {
    limits: Limits,
    slots: BTreeMap<WorkerId, Slot>,
    queue: VecDeque<W>,
    next_id: WorkerId,
}

impl<W> Pool<W> {
    pub fn new(limits: Limits) -> Self {
        assert!(limits.n_min <= limits.n_max && limits.n_max >= 1, "limits are checked by config");
        Pool { limits, slots: BTreeMap::new(), queue: VecDeque::new(), next_id: 1 }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn slot(&self, id: WorkerId) -> Option<&Slot> {
        self.slots.get(&id)
    }

    pub fn slots(&self) -> impl Iterator<Item = (WorkerId, &Slot)> {
        self.slots.iter().map(|(id, s)| (*id, s))
    }

    pub fn queue_len(&self) -> usize {
        self.queue.len()
    }

    pub fn count(&self, state: State) -> usize {
        self.slots.values().filter(|s| s.state == state).count()
    }

    /// Workers that count towards the limits: all but those stopping.
    pub fn live(&self) -> usize {
        self.slots.len() - self.count(State::Stopping)
    }

    fn add_starting(&mut self, now: Instant) -> WorkerId {
        let id = self.next_id;
        self.next_id += 1;
        let limit = self.limits.max_requests.map(|n| jittered(n, id));
        self.slots.insert(
            id,
            Slot {
                state: State::Starting,
                last_used: now,
                created: now,
                served: 0,
                proven: false,
                limit,
                sessions: 0,
                pending: 0,
                pending_at: now,
            },
        );
        id
    }

    /// New workers needed to bring the pool up to `n_min`.
    pub fn fill_to_min(&mut self, now: Instant) -> Vec<WorkerId> {
        let missing = self.limits.n_min.saturating_sub(self.live());
        (0..missing).map(|_| self.add_starting(now)).collect()
    }

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

    /// Queues a waiter (after `checkout` found no idle worker). Returns the id of
    /// a worker to start when the waiters outnumber the workers already starting
    /// and the pool is below `n_max`.
    pub fn enqueue(&mut self, waiter: W, now: Instant) -> Option<WorkerId> {
        self.queue.push_back(waiter);
        self.grow_for_queue(now)
    }

    fn grow_for_queue(&mut self, now: Instant) -> Option<WorkerId> {
        let starting = self.count(State::Starting);
        if self.live() < self.limits.n_max && starting < self.queue.len() {
            Some(self.add_starting(now))
        } else {
            None
        }
    }

    /// Drops waiters the caller no longer wants (a client that went away).
    pub fn retain_waiters(&mut self, keep: impl FnMut(&W) -> bool) {
        self.queue.retain(keep);
    }

    /// A worker finished a request, or a starting worker became ready.
    pub fn release(&mut self, id: WorkerId, now: Instant) -> Release<W> {
        let Some(slot) = self.slots.get_mut(&id) else {
            return Release::Gone;
        };
        if slot.state == State::Stopping {
            return Release::Gone;
        }
        slot.proven |= slot.state == State::Busy;
        slot.last_used = now;
        if slot.limit.is_some_and(|limit| slot.served >= limit) {
            slot.state = State::Stopping;
            return Release::Retire(self.replacements(now));
        }
        match self.queue.pop_front() {
            Some(waiter) => {
                slot.state = State::Busy;
                slot.served += 1;
                Release::Handoff(waiter)
            }
            None => {
                slot.state = State::Idle;
                Release::Idle
            }
        }
    }

    /// A worker process is gone (crashed, stopped, or failed to start). Returns
    /// the replacements to start.
    pub fn exited(&mut self, id: WorkerId, now: Instant) -> Vec<WorkerId> {
        self.slots.remove(&id);
        self.replacements(now)
    }

    /// Takes a worker out of service (too big, hung, unreachable): it is marked
    /// stopping and the replacements to start are returned.
    pub fn retire(&mut self, id: WorkerId, now: Instant) -> Vec<WorkerId> {
        match self.slots.get(&id) {
            Some(slot) if slot.state != State::Stopping => self.stop(id),
            _ => return Vec::new(),
        };
        self.replacements(now)
    }

    /// Workers to start after one left: enough for `n_min`, and one more while
    /// requests wait and the pool has room.
    fn replacements(&mut self, now: Instant) -> Vec<WorkerId> {
        let mut spawn = self.fill_to_min(now);
        if spawn.is_empty() && !self.queue.is_empty() {
            spawn.extend(self.grow_for_queue(now));
        }
        spawn
    }

    /// Marks a worker as stopping. Returns false if it was not in the pool.
    pub fn stop(&mut self, id: WorkerId) -> bool {
        match self.slots.get_mut(&id) {
            Some(slot) => {
                slot.state = State::Stopping;
                true
            }
            None => false,
        }
    }

    /// Idle workers unused for longer than `max_age`, oldest first, never taking
    /// the pool below `n_min`. They are marked stopping.
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
        stale
            .into_iter()
            .map(|(_, id)| {
                self.stop(id);
                id
            })
            .collect()
    }

    /// Chooses the worker for a new Shiny session: the ready worker holding the
    /// fewest sessions, below `max_sessions`. `Err(Some(id))`: none has room,
    /// start worker `id`; `Err(None)`: none has room and the pool is full.
    pub fn pick_for_session(&mut self, max_sessions: usize, now: Instant) -> Result<WorkerId, Option<WorkerId>> {
        let best = self
            .slots
            .iter()
            .filter(|(_, s)| s.state == State::Idle && s.load(now) < max_sessions)
            .min_by_key(|(id, s)| (s.load(now), **id))
            .map(|(id, _)| *id);
        match best {
            Some(id) => {
                if let Some(slot) = self.slots.get_mut(&id) {
                    if now.duration_since(slot.pending_at) >= PENDING_FOR {
                        slot.pending = 0;
                    }
                    slot.pending += 1;
                    slot.pending_at = now;
                }
                Ok(id)
            }
            None if self.count(State::Starting) > 0 => Err(None),
            None if self.live() < self.limits.n_max => Err(Some(self.add_starting(now))),
            None => Err(None),
        }
    }

    /// A Shiny session's WebSocket opened on a worker.
    pub fn session_opened(&mut self, id: WorkerId, now: Instant) {
        if let Some(slot) = self.slots.get_mut(&id) {
            slot.sessions += 1;
            slot.proven = true;
            slot.pending = slot.pending.saturating_sub(1);
            slot.last_used = now;
        }
    }

    /// Open sessions across the pool.
    pub fn sessions(&self) -> usize {
        self.slots.values().map(|s| s.sessions).sum()
    }

    pub fn session_closed(&mut self, id: WorkerId, now: Instant) {
        if let Some(slot) = self.slots.get_mut(&id) {
            slot.sessions = slot.sessions.saturating_sub(1);
            slot.last_used = now;
        }
    }

    /// Counts one plain HTTP request on a Shiny worker (they share workers freely).
    pub fn touch(&mut self, id: WorkerId, now: Instant) -> bool {
        match self.slots.get_mut(&id) {
            Some(slot) if slot.state == State::Idle => {
                slot.served += 1;
                slot.last_used = now;
                true
            }
            _ => false,
        }
    }

    /// Takes every waiter out of the queue (at shutdown).
    pub fn drain_waiters(&mut self) -> Vec<W> {
        self.queue.drain(..).collect()
    }

    /// Marks every worker stopping and returns their ids (at shutdown).
    pub fn stop_all(&mut self) -> Vec<WorkerId> {
        let ids: Vec<WorkerId> = self.slots.keys().copied().collect();
        for id in &ids {
            self.stop(*id);
        }
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n_min: usize, n_max: usize) -> (Pool<u32>, Instant) {
        (Pool::new(Limits { n_min, n_max, max_requests: None }), Instant::now())
    }

    #[test]
    fn workers_retire_after_their_share_of_requests_with_jitter() {
        let now = Instant::now();
        let mut p: Pool<u32> = Pool::new(Limits { n_min: 1, n_max: 1, max_requests: Some(100) });
        let limits: Vec<u64> = (1..=50).map(|id| jittered(100, id)).collect();
        assert!(limits.iter().all(|l| (100..=110).contains(l)), "{limits:?}");
        assert!(limits.iter().collect::<std::collections::BTreeSet<_>>().len() > 5, "limits are spread");
        let id = p.fill_to_min(now)[0];
        ready_all(&mut p, &[id], now);
        let limit = p.slot(id).unwrap().limit.unwrap();
        for _ in 1..limit {
            assert_eq!(p.checkout(), Some(id));
            assert!(matches!(p.release(id, now), Release::Idle));
        }
        assert_eq!(p.checkout(), Some(id));
        match p.release(id, now) {
            Release::Retire(new) => assert_eq!(new, vec![id + 1], "a replacement keeps n_min"),
            other => panic!("expected retirement, got {other:?}"),
        }
        assert_eq!(p.checkout(), None, "a retiring worker takes no more requests");
    }

    #[test]
    fn a_worker_is_proven_once_it_finishes_a_request_or_opens_a_session() {
        let (mut p, now) = pool(2, 2);
        let ids = p.fill_to_min(now);
        ready_all(&mut p, &ids, now);
        assert!(ids.iter().all(|id| !p.slot(*id).unwrap().proven), "ready is not proven");
        let busy = p.checkout().unwrap();
        assert!(!p.slot(busy).unwrap().proven, "a request in progress proves nothing yet");
        p.release(busy, now);
        assert!(p.slot(busy).unwrap().proven);
        let other = *ids.iter().find(|id| **id != busy).unwrap();
        p.session_opened(other, now);
        assert!(p.slot(other).unwrap().proven);
    }

    #[test]
    fn sessions_go_to_the_least_loaded_worker_and_grow_the_pool_at_the_limit() {
        let (mut p, now) = pool(2, 3);
        let ids = p.fill_to_min(now);
        ready_all(&mut p, &ids, now);
        let mut picks = Vec::new();
        for _ in 0..4 {
            picks.push(p.pick_for_session(2, now).unwrap());
        }
        assert_eq!(picks, vec![1, 2, 1, 2], "fewest sessions first, counting browsers not yet connected");
        for id in picks {
            p.session_opened(id, now);
        }
        assert_eq!(p.pick_for_session(2, now), Err(Some(3)), "all full: start a worker");
        assert_eq!(p.pick_for_session(2, now), Err(None), "one is starting already");
        p.session_closed(1, now);
        assert_eq!(p.pick_for_session(2, now), Ok(1));
        let later = now + Duration::from_secs(100);
        assert!(p.prune(later, Duration::from_secs(1)).is_empty(), "workers with sessions are never pruned");
    }

    #[test]
    fn retiring_a_worker_starts_its_replacement() {
        let (mut p, now) = pool(2, 3);
        let ids = p.fill_to_min(now);
        ready_all(&mut p, &ids, now);
        assert_eq!(p.retire(1, now), vec![3]);
        assert_eq!(p.retire(1, now), Vec::<WorkerId>::new(), "retiring twice starts nothing more");
        assert_eq!(p.retire(99, now), Vec::<WorkerId>::new());
    }

    fn ready_all(p: &mut Pool<u32>, ids: &[WorkerId], now: Instant) {
        for id in ids {
            assert!(matches!(p.release(*id, now), Release::Idle));
        }
    }

    #[test]
    fn starts_n_min_and_hands_out_idle_workers() {
        let (mut p, now) = pool(2, 4);
        let ids = p.fill_to_min(now);
        assert_eq!(ids, vec![1, 2]);
        assert_eq!(p.checkout(), None, "starting workers take no requests");
        ready_all(&mut p, &ids, now);
        let a = p.checkout().unwrap();
        let b = p.checkout().unwrap();
        assert_ne!(a, b);
        assert_eq!(p.checkout(), None, "a busy worker never gets a second request");
    }

    #[test]
    fn queue_grows_pool_up_to_n_max_only() {
        let (mut p, now) = pool(1, 2);
        let ids = p.fill_to_min(now);
        ready_all(&mut p, &ids, now);
        assert!(p.checkout().is_some());
        assert_eq!(p.enqueue(10, now), Some(2), "first waiter starts a worker");
        assert_eq!(p.enqueue(11, now), None, "n_max reached");
        assert_eq!(p.live(), 2);
    }

    #[test]
    fn one_start_per_waiter_not_more() {
        let (mut p, now) = pool(0, 5);
        assert_eq!(p.enqueue(1, now), Some(1));
        assert_eq!(p.enqueue(2, now), Some(2));
        p.retain_waiters(|w| *w != 2);
        assert_eq!(p.enqueue(3, now), None, "two starting already cover two waiters");
    }

    #[test]
    fn release_serves_waiters_in_fifo_order() {
        let (mut p, now) = pool(1, 1);
        let ids = p.fill_to_min(now);
        ready_all(&mut p, &ids, now);
        let w = p.checkout().unwrap();
        p.enqueue(1, now);
        p.enqueue(2, now);
        assert!(matches!(p.release(w, now), Release::Handoff(1)));
        assert!(matches!(p.release(w, now), Release::Handoff(2)));
        assert!(matches!(p.release(w, now), Release::Idle));
        assert_eq!(p.slot(w).unwrap().served, 3);
    }

    #[test]
    fn prefers_most_recently_used_idle_worker() {
        let (mut p, t0) = pool(3, 3);
        let ids = p.fill_to_min(t0);
        ready_all(&mut p, &ids, t0);
        let t1 = t0 + Duration::from_secs(1);
        p.release(2, t1);
        assert_eq!(p.checkout(), Some(2));
    }

    #[test]
    fn prune_keeps_n_min_and_spares_busy_and_recent() {
        let (mut p, t0) = pool(1, 4);
        for _ in 0..3 {
            p.enqueue(0, t0);
        }
        assert_eq!(p.live(), 3);
        p.drain_waiters();
        ready_all(&mut p, &[1, 2, 3], t0);
        let busy = p.checkout().unwrap();
        let later = t0 + Duration::from_secs(10);
        let stopped = p.prune(later, Duration::from_secs(5));
        assert_eq!(stopped.len(), 2, "busy worker stays, others age out");
        assert!(!stopped.contains(&busy));
        assert_eq!(p.prune(later, Duration::from_secs(5)), Vec::<WorkerId>::new());
        for id in stopped {
            assert!(p.exited(id, later).is_empty(), "n_min still holds");
        }
        assert_eq!(p.live(), 1);
    }

    #[test]
    fn prune_never_goes_below_n_min() {
        let (mut p, t0) = pool(2, 2);
        let ids = p.fill_to_min(t0);
        ready_all(&mut p, &ids, t0);
        assert!(p.prune(t0 + Duration::from_secs(100), Duration::from_secs(1)).is_empty());
    }

    #[test]
    fn exit_is_replaced_to_keep_n_min_and_serve_waiters() {
        let (mut p, now) = pool(1, 2);
        let ids = p.fill_to_min(now);
        ready_all(&mut p, &ids, now);
        assert_eq!(p.exited(1, now), vec![2]);
        let (mut p, now) = pool(0, 2);
        p.enqueue(7, now);
        assert_eq!(p.exited(1, now), vec![2], "a waiter still needs a worker");
    }

    #[test]
    fn stopping_workers_take_nothing_and_release_reports_gone() {
        let (mut p, now) = pool(1, 1);
        let ids = p.fill_to_min(now);
        ready_all(&mut p, &ids, now);
        let w = p.checkout().unwrap();
        p.enqueue(1, now);
        assert_eq!(p.stop_all(), vec![w]);
        assert!(matches!(p.release(w, now), Release::Gone));
        assert_eq!(p.drain_waiters(), vec![1]);
    }
}
