//! One app's pool: which workers exist, what state each is in, who waits for
//! one, and every rule about them: which idle worker takes a request, when to
//! grow or shrink, when a worker has served its share or grown too big, which
//! worker takes a new Shiny session (one whose R is not busy, from the CPU
//! samples the supervisor feeds in), when an idle worker is due a liveness
//! probe, and how long to wait before restarting after failed starts.
//!
//! Pure logic: no processes, no sockets, no clocks of its own (callers pass
//! `now`), no knowledge of other apps (callers pass the budget's `room`), so
//! every decision is unit-tested. The pool decides; the supervisor carries out.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::worker::WorkerId;

/// Where a worker is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Launched (or waiting to be launched) but not yet answering.
    Starting,
    /// Answering and free to take a request (a Shiny worker: taking sessions).
    Idle,
    /// Serving a request; never given a second one.
    Busy,
    /// Answering a liveness probe; given nothing else meanwhile.
    Probing,
    /// Shiny: past a limit; serves the sessions it has, takes no new ones,
    /// and stops when the last one ends.
    Draining,
    /// Asked to stop; takes nothing more.
    Stopping,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Idle => "idle",
            State::Busy => "busy",
            State::Probing => "probing",
            State::Draining => "draining",
            State::Stopping => "stopping",
        }
    }

    /// Whether the worker answers requests now.
    pub fn answering(self) -> bool {
        matches!(self, State::Idle | State::Busy | State::Probing | State::Draining)
    }
}

/// Why a worker is taken out of service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retire {
    /// Unused for longer than `max_age`.
    Idle,
    /// Served its share of requests (`--max-requests`).
    Requests,
    /// Grew past `--max-worker-memory`.
    Memory,
    /// A request took longer than `--request-timeout`.
    Timeout,
    /// It broke off an exchange, or its socket refused a connection.
    Broken,
    /// An idle worker that did not answer a liveness probe.
    Unresponsive,
    /// Another app needed its place in the worker budget.
    Budget,
    /// Its app is being replaced or removed, or valve is stopping.
    Shutdown,
}

impl Retire {
    /// Whether the worker gets SIGTERM and time to finish (a planned stop), or SIGKILL.
    pub fn gentle(self) -> bool {
        matches!(self, Retire::Idle | Retire::Requests | Retire::Memory | Retire::Budget | Retire::Shutdown)
    }
}

/// What the pool knows of one worker.
#[derive(Clone, Debug)]
pub struct Slot {
    pub state: State,
    /// When the worker last finished a request (or became ready).
    pub last_used: Instant,
    pub created: Instant,
    /// When it answered its readiness probe.
    pub ready_at: Option<Instant>,
    pub served: u64,
    /// The worker finished a request or opened a Shiny session: it works, so
    /// its death is not a failed start (crash-loop backoff ignores it).
    pub proven: bool,
    /// Requests after which the worker is replaced (`--max-requests` plus jitter).
    pub limit: Option<u64>,
    /// Its memory at the last sample, in bytes.
    pub memory: Option<u64>,
    /// Past `--max-worker-memory` while busy: retired when its request ends.
    pub over_memory: bool,
    /// Why it is stopping, once it is.
    pub retired: Option<Retire>,
    /// Shiny sessions the worker holds (open WebSockets). A worker with
    /// sessions is never pruned.
    pub sessions: usize,
    /// Shiny HTTP requests on their way through the worker now (R may be
    /// busy with them: no liveness probe meanwhile).
    pub in_flight: usize,
    /// Browsers sent to this worker whose WebSocket has not opened yet.
    pub pending: VecDeque<Pending>,
    /// Shiny: the share of the last sampling window its R spent running or
    /// waiting to run (1.0: all of it; more than one thread can add up past it).
    pub cpu: Option<f64>,
    /// When the last CPU sampling window began.
    pub cpu_since: Option<Instant>,
    /// Shiny: when a browser was last placed on it or a session last opened on
    /// it: work that CPU samples taken since may not show yet.
    pub new_work: Option<Instant>,
}

/// A browser placed on a worker, on its way to opening a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pending {
    /// The browser's token (in its sticky cookie).
    pub token: u64,
    /// When it was placed, or last came back (for the page's assets).
    pub at: Instant,
}

impl Slot {
    /// Whether a new Shiny session may go to the worker: it serves (a liveness
    /// probe does not hold it) and is not draining.
    fn takes_sessions(&self) -> bool {
        matches!(self.state, State::Idle | State::Probing)
    }

    fn new(now: Instant, limit: Option<u64>) -> Self {
        Slot {
            state: State::Starting,
            last_used: now,
            created: now,
            ready_at: None,
            served: 0,
            proven: false,
            limit,
            memory: None,
            over_memory: false,
            retired: None,
            sessions: 0,
            in_flight: 0,
            pending: VecDeque::new(),
            cpu: None,
            cpu_since: None,
            new_work: None,
        }
    }

    fn forget_stale(&mut self, now: Instant) {
        self.pending.retain(|p| now.duration_since(p.at) < PENDING_FOR);
    }

    /// Sessions plus every browser on its way: how placements are spread.
    fn load(&self, now: Instant) -> usize {
        self.sessions + self.pending.iter().filter(|p| now.duration_since(p.at) < PENDING_FOR).count()
    }

    /// Whether the worker's R is busy, or about to be, by `threshold` (a
    /// share of one CPU; 0 never): its last CPU sample reached the threshold,
    /// or a browser was placed or a session opened on it and no sampling
    /// window began since (for at most `NEW_WORK_FOR`), so that a burst of
    /// browsers is spread before any sample can show their work.
    pub fn busy(&self, now: Instant, threshold: f64) -> bool {
        if threshold <= 0.0 {
            return false;
        }
        let sampled = self.cpu.is_some_and(|c| c >= threshold);
        let unseen = self
            .new_work
            .is_some_and(|t| now.duration_since(t) < NEW_WORK_FOR && self.cpu_since.is_none_or(|since| since <= t));
        sampled || unseen
    }
}

/// How long a browser placed on a Shiny worker counts against it since it
/// was placed or last came back (for the page's assets), before its WebSocket opens.
pub const PENDING_FOR: Duration = Duration::from_secs(30);
/// How long new work on a Shiny worker (a browser placed on it, a session
/// opened) makes it busy before its CPU samples show that work, at most.
pub const NEW_WORK_FOR: Duration = Duration::from_secs(2);
/// How long a new browser waits for a worker that is not busy (one starting,
/// or one finishing its work) before it takes a busy one that has room.
pub const BUSY_PATIENCE: Duration = Duration::from_secs(5);
/// The first and the longest pause before restarting a worker that failed to start.
pub const BACKOFF_FIRST: Duration = Duration::from_millis(250);
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A worker that dies sooner than this after it became ready, before finishing a
/// request, counts as a failed start.
pub const CRASH_WINDOW: Duration = Duration::from_secs(5);
/// Failed starts further apart than this do not add up to a crash loop.
pub const FAILURE_MEMORY: Duration = Duration::from_secs(60);

/// One app's rules.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub n_min: usize,
    pub n_max: usize,
    /// Replace a worker after about this many requests.
    pub max_requests: Option<u64>,
    /// Replace a worker whose memory passes this many bytes.
    pub max_memory: Option<u64>,
    /// Shiny: sessions per worker.
    pub max_sessions: usize,
    /// Shiny: the share of one CPU (0.5: half) a worker's R must use to count
    /// as busy for placement; 0 places by session count alone.
    pub busy_threshold: f64,
}

/// Worker ids, unique across every app of one valve run (sticky cookies name them).
#[derive(Clone, Debug, Default)]
pub struct Ids(Arc<AtomicU64>);

impl Ids {
    fn next(&self) -> WorkerId {
        self.0.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// How a worker comes back to the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Done {
    /// It answered its readiness probe.
    Ready,
    /// It finished a request.
    Completed,
    /// It answered a liveness probe.
    Probed,
    /// It was handed to a waiter that had already left: nothing was asked of it.
    Unused,
}

/// The result of returning a worker to the pool.
#[derive(Debug)]
pub enum Release<W> {
    /// The worker stays busy and goes straight to this waiter.
    Handoff(W),
    /// Nobody waits: the worker is idle now.
    Idle,
    /// The worker is no longer in service (it exited or is stopping).
    Gone,
    /// The worker is taken out of service now (its share of requests, its memory).
    Retire(Retire),
}

/// Workers to start, and how long to wait first (crash-loop backoff).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Start {
    pub ids: Vec<WorkerId>,
    pub delay: Duration,
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
    ids: Ids,
    slots: BTreeMap<WorkerId, Slot>,
    queue: VecDeque<W>,
    /// Shiny browsers waiting for a place (they wait outside the queue).
    session_demand: usize,
    /// Workers in a row that died before or right after answering, and when
    /// the last did; drives the restart backoff.
    failed_starts: u32,
    last_failure: Option<Instant>,
    /// This generation of the app is being replaced or removed: workers stop
    /// as they come free, and none starts but for requests already queued.
    winding_down: bool,
}

impl<W> Pool<W> {
    pub fn new(limits: Limits, ids: Ids) -> Self {
        assert!(limits.n_min <= limits.n_max && limits.n_max >= 1, "limits are checked by config");
        Pool {
            limits,
            ids,
            slots: BTreeMap::new(),
            queue: VecDeque::new(),
            session_demand: 0,
            failed_starts: 0,
            last_failure: None,
            winding_down: false,
        }
    }

    /// Changes `n_min` (a generation being replaced gives up its places; a new
    /// one proves itself with one worker even when its app scales to zero).
    pub fn set_n_min(&mut self, n_min: usize) {
        self.limits.n_min = n_min.min(self.limits.n_max);
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

    /// Workers that count towards `n_min` and `n_max`: all but those stopping
    /// or draining (a draining Shiny worker takes no new sessions).
    pub fn live(&self) -> usize {
        self.slots.values().filter(|s| !matches!(s.state, State::Stopping | State::Draining)).count()
    }

    /// Worker processes that exist, stopping ones included: what the budget counts.
    pub fn processes(&self) -> usize {
        self.slots.len()
    }

    /// Workers answering now.
    pub fn answering(&self) -> usize {
        self.slots.values().filter(|s| s.state.answering()).count()
    }

    /// Whether a request sent now will be served: a worker answers, or one is
    /// on its way without a crash loop (starting, or owed to `n_min` or the
    /// queue and waiting only for one of the `freeing` stopping workers, of
    /// any app, to leave its place in the budget: a recycled worker whose
    /// replacement starts when it has exited), or the app scales from zero.
    pub fn can_serve(&self, now: Instant, freeing: usize) -> bool {
        self.answering() > 0
            || self.limits.n_min == 0
            || (!self.crash_looping(now) && (self.count(State::Starting) > 0 || (self.wants() > 0 && freeing > 0)))
    }

    /// Open Shiny sessions across the pool.
    pub fn sessions(&self) -> usize {
        self.slots.values().map(|s| s.sessions).sum()
    }

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
    /// for `n_min`, and one per waiter not covered by workers already starting,
    /// never above `n_max`.
    pub fn wants(&self) -> usize {
        let live = self.live();
        let starting = self.count(State::Starting);
        let for_min = self.limits.n_min.saturating_sub(live);
        let waiting = self.queue.len() + self.session_demand;
        let for_queue = waiting.saturating_sub(starting);
        for_min.max(for_queue).min(self.limits.n_max.saturating_sub(live))
    }

    /// Starts up to `room` of the workers the pool wants (the budget across
    /// apps says how many it may).
    pub fn grow(&mut self, now: Instant, room: usize) -> Start {
        let n = self.wants().min(room);
        let ids = (0..n)
            .map(|_| {
                let id = self.ids.next();
                let limit = self.limits.max_requests.map(|n| jittered(n, id));
                self.slots.insert(id, Slot::new(now, limit));
                id
            })
            .collect();
        Start { ids, delay: self.backoff(now) }
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

    /// A worker failed to start, or its process is gone (crashed, stopped).
    /// Counts a failed start when it died before or soon after it became
    /// ready without having done anything, unless valve stopped it.
    pub fn exited(&mut self, id: WorkerId, now: Instant) {
        let Some(slot) = self.slots.remove(&id) else { return };
        let planned = slot.retired.is_some_and(Retire::gentle);
        let early = slot.ready_at.is_none_or(|t| now.duration_since(t) < CRASH_WINDOW);
        if !planned && !slot.proven && early {
            self.record_failed_start(now);
        }
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
            .filter(|(_, s)| s.state == State::Idle && s.load(now) == 0)
            .min_by_key(|(id, s)| (s.last_used, **id))
            .map(|(id, s)| (*id, s.last_used))
    }

    /// A memory sample. A worker past the limit is retired now if idle, after
    /// its request if busy, or (Shiny, with sessions) drained.
    pub fn sampled(&mut self, id: WorkerId, bytes: u64) -> Option<Retire> {
        let over = self.limits.max_memory.is_some_and(|max| bytes > max);
        let slot = self.slots.get_mut(&id)?;
        slot.memory = Some(bytes);
        if !over {
            return None;
        }
        match slot.state {
            State::Idle if slot.sessions == 0 && slot.pending.is_empty() => {
                self.retire(id, Retire::Memory).then_some(Retire::Memory)
            }
            State::Idle => {
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

    /// Draining Shiny workers whose last session ended and whose traffic has
    /// been quiet for `quiet`: they are retired now (returned with the reason
    /// they drained for).
    pub fn drained(&mut self, now: Instant, quiet: Duration) -> Vec<(WorkerId, Retire)> {
        let done: Vec<(WorkerId, Retire)> = self
            .slots
            .iter()
            .filter(|(_, s)| s.state == State::Draining && s.sessions == 0 && now.duration_since(s.last_used) >= quiet)
            .map(|(id, s)| (*id, s.retired.unwrap_or(Retire::Requests)))
            .collect();
        done.into_iter().filter(|(id, reason)| self.retire(*id, *reason)).collect()
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

    /// Takes every waiter out of the queue (at shutdown).
    pub fn drain_waiters(&mut self) -> Vec<W> {
        self.queue.drain(..).collect()
    }

    /// Retires every worker and returns the ids of those not already stopping.
    pub fn retire_all(&mut self) -> Vec<WorkerId> {
        let ids: Vec<WorkerId> = self.slots.keys().copied().collect();
        ids.into_iter().filter(|id| self.retire(*id, Retire::Shutdown)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(n_min: usize, n_max: usize) -> Limits {
        Limits { n_min, n_max, max_requests: None, max_memory: None, max_sessions: 20, busy_threshold: 0.0 }
    }

    fn pool(n_min: usize, n_max: usize) -> (Pool<u32>, Instant) {
        (Pool::new(limits(n_min, n_max), Ids::default()), Instant::now())
    }

    const ALL: fn(&u32) -> bool = |_| true;

    fn ready_all(p: &mut Pool<u32>, ids: &[WorkerId], now: Instant) {
        for id in ids {
            assert!(matches!(p.release(*id, now, Done::Ready, ALL), Release::Idle));
        }
    }

    fn grow(p: &mut Pool<u32>, now: Instant) -> Vec<WorkerId> {
        p.grow(now, usize::MAX).ids
    }

    #[test]
    fn a_shiny_worker_busy_with_requests_is_not_probed() {
        let (mut p, t0) = pool(1, 1);
        let start = p.grow(t0, 10);
        ready_all(&mut p, &start.ids, t0);
        let id = start.ids[0];
        assert_eq!(p.touch(id, t0, None), Some(false));
        let later = t0 + Duration::from_secs(5);
        assert!(p.due_for_probe(later, Duration::from_secs(1)).is_empty(), "R may be busy with that request");
        p.finished(id, later);
        assert!(p.due_for_probe(later + Duration::from_secs(1), Duration::from_secs(1)) == vec![id]);
    }

    #[test]
    fn a_generation_winding_down_stops_workers_as_they_come_free() {
        let (mut p, t0) = pool(2, 4);
        let start = p.grow(t0, 10);
        ready_all(&mut p, &start.ids, t0);
        let busy = p.checkout().unwrap();
        let idle = *start.ids.iter().find(|id| **id != busy).unwrap();
        p.enqueue(7);
        assert_eq!(p.wind_down(), vec![(idle, Retire::Shutdown)], "the idle worker stops now");
        assert!(
            matches!(p.release(busy, t0, Done::Completed, ALL), Release::Handoff(7)),
            "queued requests are served first"
        );
        assert!(matches!(p.release(busy, t0, Done::Completed, ALL), Release::Retire(Retire::Shutdown)));
        assert_eq!(p.wants(), 0, "a generation winding down starts nothing");
        assert_eq!(p.limits().n_min, 0);
    }

    #[test]
    fn winding_down_stops_idle_workers_and_drains_shiny_ones() {
        let (mut p, t0) = pool(3, 4);
        let start = p.grow(t0, 10);
        ready_all(&mut p, &start.ids, t0);
        let busy = p.checkout().unwrap();
        let shiny = *start.ids.iter().find(|id| **id != busy).unwrap();
        p.session_opened(shiny, t0, None);
        let stopped = p.wind_down();
        assert_eq!(p.slot(shiny).unwrap().state, State::Draining, "a worker holding a session drains");
        assert_eq!(stopped.len(), 1, "the idle worker stops now: {stopped:?}");
        assert_eq!(p.slot(busy).unwrap().state, State::Busy, "a busy worker finishes its request");
    }

    #[test]
    fn starts_n_min_and_hands_out_idle_workers() {
        let (mut p, now) = pool(2, 4);
        let ids = grow(&mut p, now);
        assert_eq!(ids, vec![1, 2]);
        assert_eq!(p.checkout(), None, "starting workers take no requests");
        ready_all(&mut p, &ids, now);
        let a = p.checkout().unwrap();
        let b = p.checkout().unwrap();
        assert_ne!(a, b);
        assert_eq!(p.checkout(), None, "a busy worker never gets a second request");
    }

    #[test]
    fn the_queue_grows_the_pool_one_worker_per_waiter_up_to_n_max() {
        let (mut p, now) = pool(1, 3);
        let ids = grow(&mut p, now);
        ready_all(&mut p, &ids, now);
        assert!(p.checkout().is_some());
        p.enqueue(10);
        assert_eq!(grow(&mut p, now), vec![2], "the first waiter starts a worker");
        assert_eq!(grow(&mut p, now), Vec::<WorkerId>::new(), "one starting covers one waiter");
        p.enqueue(11);
        p.enqueue(12);
        assert_eq!(grow(&mut p, now), vec![3], "n_max reached");
        assert_eq!(p.live(), 3);
    }

    #[test]
    fn the_budget_caps_growth_and_the_pool_says_what_it_still_wants() {
        let (mut p, now) = pool(2, 4);
        assert_eq!(p.grow(now, 1).ids, vec![1], "room for one");
        assert_eq!(p.wants(), 1, "n_min still wants another");
        assert_eq!(p.grow(now, 0).ids, Vec::<WorkerId>::new());
        assert_eq!(p.grow(now, 5).ids, vec![2]);
        assert_eq!(p.wants(), 0);
    }

    #[test]
    fn release_serves_waiters_in_fifo_order_skipping_those_gone() {
        let (mut p, now) = pool(1, 1);
        let ids = grow(&mut p, now);
        ready_all(&mut p, &ids, now);
        let w = p.checkout().unwrap();
        p.enqueue(1);
        p.enqueue(2);
        p.enqueue(3);
        assert!(matches!(p.release(w, now, Done::Completed, ALL), Release::Handoff(1)));
        assert!(matches!(p.release(w, now, Done::Completed, |w| *w != 2), Release::Handoff(3)));
        assert!(matches!(p.release(w, now, Done::Completed, ALL), Release::Idle));
        assert_eq!(p.slot(w).unwrap().served, 3);
    }

    #[test]
    fn a_handoff_to_a_departed_client_is_not_a_served_request() {
        let (mut p, now) = pool(0, 1);
        p.enqueue(1);
        let w = grow(&mut p, now)[0];
        // The worker became ready and went to the waiter, which had just left.
        assert!(matches!(p.release(w, now, Done::Ready, ALL), Release::Handoff(1)));
        assert!(matches!(p.release(w, now, Done::Unused, ALL), Release::Idle));
        let slot = p.slot(w).unwrap();
        assert_eq!(slot.served, 0, "returned unused: not counted");
        assert!(!slot.proven, "a worker that never finished a request is not proven");
        // So its death soon after start still counts as a failed start.
        p.exited(w, now + Duration::from_secs(1));
        assert_eq!(p.backoff(now + Duration::from_secs(1)), BACKOFF_FIRST);
    }

    #[test]
    fn a_worker_is_proven_once_it_finishes_a_request_or_opens_a_session() {
        let (mut p, now) = pool(2, 2);
        let ids = grow(&mut p, now);
        ready_all(&mut p, &ids, now);
        assert!(ids.iter().all(|id| !p.slot(*id).unwrap().proven), "ready is not proven");
        let busy = p.checkout().unwrap();
        assert!(!p.slot(busy).unwrap().proven, "a request in progress proves nothing yet");
        p.release(busy, now, Done::Completed, ALL);
        assert!(p.slot(busy).unwrap().proven);
        let other = *ids.iter().find(|id| **id != busy).unwrap();
        p.session_opened(other, now, None);
        assert!(p.slot(other).unwrap().proven);
    }

    #[test]
    fn crash_loops_back_off_doubling_and_forget_after_a_minute() {
        let (mut p, t0) = pool(1, 1);
        let mut now = t0;
        let mut delays = Vec::new();
        for _ in 0..4 {
            let start = p.grow(now, 1);
            delays.push(start.delay);
            // Fails before it ever answers.
            p.exited(start.ids[0], now);
            now += Duration::from_millis(10);
        }
        assert_eq!(delays, [0, 250, 500, 1000].map(Duration::from_millis));
        assert_eq!(p.grow(now, 1).delay, Duration::from_secs(2));
        assert!(p.crash_looping(now));
        assert_eq!(p.backoff(now + FAILURE_MEMORY), Duration::ZERO, "an old crash loop is forgotten");
    }

    #[test]
    fn a_worker_that_served_or_was_stopped_is_no_failed_start() {
        let (mut p, now) = pool(2, 2);
        let ids = grow(&mut p, now);
        ready_all(&mut p, &ids, now);
        let busy = p.checkout().unwrap();
        p.release(busy, now, Done::Completed, ALL);
        p.exited(busy, now);
        let other = *ids.iter().find(|id| **id != busy).unwrap();
        p.retire(other, Retire::Idle);
        p.exited(other, now);
        assert_eq!(p.backoff(now), Duration::ZERO);
        // A worker killed for hanging counts: valve's kill was not planned.
        let ids = grow(&mut p, now);
        ready_all(&mut p, &ids, now);
        p.retire(ids[0], Retire::Timeout);
        p.exited(ids[0], now);
        assert_eq!(p.backoff(now), BACKOFF_FIRST);
        // One that lived past the crash window does not.
        let later = now + CRASH_WINDOW + Duration::from_secs(1);
        p.exited(ids[1], later);
        assert_eq!(p.backoff(later), BACKOFF_FIRST, "unchanged");
    }

    #[test]
    fn workers_retire_after_their_share_of_requests_with_jitter() {
        let now = Instant::now();
        let mut p: Pool<u32> = Pool::new(Limits { max_requests: Some(100), ..limits(1, 1) }, Ids::default());
        let limits: Vec<u64> = (1..=50).map(|id| jittered(100, id)).collect();
        assert!(limits.iter().all(|l| (100..=110).contains(l)), "{limits:?}");
        assert!(limits.iter().collect::<std::collections::BTreeSet<_>>().len() > 5, "limits are spread");
        let id = grow(&mut p, now)[0];
        ready_all(&mut p, &[id], now);
        let limit = p.slot(id).unwrap().limit.unwrap();
        for _ in 1..limit {
            assert_eq!(p.checkout(), Some(id));
            assert!(matches!(p.release(id, now, Done::Completed, ALL), Release::Idle));
        }
        assert_eq!(p.checkout(), Some(id));
        assert!(matches!(p.release(id, now, Done::Completed, ALL), Release::Retire(Retire::Requests)));
        assert_eq!(p.checkout(), None, "a retiring worker takes no more requests");
        assert_eq!(p.wants(), 1, "a replacement keeps n_min");
        // The budget (n_max 1) counts the stopping worker until it has exited:
        // the replacement waits for its place, and requests wait with it.
        assert_eq!(p.grow(now, 0).ids, Vec::<WorkerId>::new());
        assert!(p.can_serve(now, 1), "a replacement is on its way: still serving");
        assert!(!p.can_serve(now, 0), "nothing answers and nothing frees a place");
        p.exited(id, now);
        let next = grow(&mut p, now);
        assert_eq!(next.len(), 1);
        assert!(p.can_serve(now, 0), "the replacement is starting");
        ready_all(&mut p, &next, now);
        assert!(p.can_serve(now, 0));
    }

    #[test]
    fn memory_past_the_limit_retires_idle_at_once_busy_after_its_request() {
        let now = Instant::now();
        let mut p: Pool<u32> = Pool::new(Limits { max_memory: Some(1000), ..limits(2, 2) }, Ids::default());
        let ids = grow(&mut p, now);
        ready_all(&mut p, &ids, now);
        assert_eq!(p.sampled(ids[0], 500), None, "under the limit");
        assert_eq!(p.slot(ids[0]).unwrap().memory, Some(500));
        let busy = p.checkout().unwrap();
        let idle = *ids.iter().find(|id| **id != busy).unwrap();
        assert_eq!(p.sampled(idle, 2000), Some(Retire::Memory), "an idle worker goes now");
        assert_eq!(p.sampled(busy, 2000), None, "a busy one finishes first");
        assert!(matches!(p.release(busy, now, Done::Completed, ALL), Release::Retire(Retire::Memory)));
    }

    #[test]
    fn shiny_workers_past_a_limit_drain_their_sessions_then_stop() {
        let now = Instant::now();
        let mut p: Pool<u32> =
            Pool::new(Limits { max_requests: Some(3), max_memory: Some(1000), ..limits(1, 2) }, Ids::default());
        let ids = grow(&mut p, now);
        ready_all(&mut p, &ids, now);
        let w = ids[0];
        let limit = p.slot(w).unwrap().limit.unwrap();
        p.session_opened(w, now, None);
        for _ in 1..limit {
            assert_eq!(p.touch(w, now, None), Some(false));
        }
        assert_eq!(p.touch(w, now, None), Some(true), "its share is served");
        assert_eq!(p.slot(w).unwrap().state, State::Draining);
        assert_eq!(p.pick_for_session(now, 1, Duration::ZERO), None, "a draining worker takes no new session");
        assert_eq!(p.touch(w, now, None), Some(false), "but serves the sessions it has");
        assert_eq!(p.wants(), 1, "the pool wants a worker in its place");
        p.session_closed(w, now);
        let quiet = Duration::from_secs(5);
        assert_eq!(p.drained(now, quiet), vec![], "its traffic must go quiet first");
        assert_eq!(p.drained(now + quiet, quiet), vec![(w, Retire::Requests)], "then it stops");

        let ids = grow(&mut p, now);
        ready_all(&mut p, &ids, now);
        p.session_opened(ids[0], now, None);
        assert_eq!(p.sampled(ids[0], 5000), None);
        assert_eq!(p.slot(ids[0]).unwrap().state, State::Draining, "too big with sessions: drains");
        p.session_closed(ids[0], now);
        assert_eq!(p.drained(now + quiet, quiet), vec![(ids[0], Retire::Memory)]);
    }

    #[test]
    fn sessions_go_to_the_least_loaded_worker_and_grow_the_pool_at_the_limit() {
        let now = Instant::now();
        let mut p: Pool<u32> = Pool::new(Limits { max_sessions: 2, ..limits(2, 3) }, Ids::default());
        let ids = grow(&mut p, now);
        ready_all(&mut p, &ids, now);
        let mut picks = Vec::new();
        for token in 0..4 {
            let id = p.pick_for_session(now, token, Duration::ZERO).unwrap();
            p.touch(id, now, Some(token));
            picks.push(id);
        }
        assert_eq!(picks, vec![1, 2, 1, 2], "fewest sessions first, counting browsers not yet connected");
        assert_eq!(
            p.pick_for_session(now, 9, Duration::ZERO),
            None,
            "browsers that came back for the assets hold their places"
        );
        for (token, id) in picks.into_iter().enumerate() {
            p.session_opened(id, now, Some(token as u64));
        }
        assert!(p.slots().all(|(_, s)| s.pending.is_empty()), "each session took its browser's place");
        assert_eq!(p.pick_for_session(now, 9, Duration::ZERO), None, "all full");
        p.session_wanted();
        assert_eq!(grow(&mut p, now), vec![3], "a waiting browser starts a worker");
        assert_eq!(grow(&mut p, now), Vec::<WorkerId>::new(), "one is starting already");
        p.session_served();
        p.session_closed(1, now);
        assert_eq!(p.pick_for_session(now, 10, Duration::ZERO), Some(1));
        let later = now + Duration::from_secs(100);
        assert!(p.prune(later, Duration::from_secs(1)).is_empty(), "workers with sessions are never pruned");
    }

    #[test]
    fn page_loads_that_never_open_a_session_lock_nobody_out() {
        let now = Instant::now();
        let mut p: Pool<u32> = Pool::new(Limits { max_sessions: 2, ..limits(1, 1) }, Ids::default());
        let ids = grow(&mut p, now);
        ready_all(&mut p, &ids, now);
        for token in 0..40 {
            assert!(p.pick_for_session(now, token, Duration::ZERO).is_some(), "page load {token} is placed at once");
        }
        assert!(p.slot(ids[0]).unwrap().pending.len() <= 8, "and the bookkeeping stays bounded");
        p.session_opened(ids[0], now, Some(38));
        p.session_opened(ids[0], now, Some(39));
        assert_eq!(p.pick_for_session(now, 100, Duration::ZERO), None, "open sessions are the real limit");
    }

    #[test]
    fn a_burst_below_n_max_waits_for_new_workers_rather_than_crowding_one() {
        let now = Instant::now();
        let mut p: Pool<u32> = Pool::new(Limits { max_sessions: 2, ..limits(1, 2) }, Ids::default());
        let ids = grow(&mut p, now);
        ready_all(&mut p, &ids, now);
        assert!(p.pick_for_session(now, 1, Duration::ZERO).is_some());
        assert!(p.pick_for_session(now, 2, Duration::ZERO).is_some());
        assert_eq!(
            p.pick_for_session(now, 3, Duration::ZERO),
            None,
            "the pool can grow: the third browser waits for a worker"
        );
        p.session_wanted();
        let new = grow(&mut p, now);
        assert_eq!(p.pick_for_session(now, 3, Duration::ZERO), None, "still starting");
        ready_all(&mut p, &new, now);
        assert_eq!(p.pick_for_session(now, 3, Duration::ZERO), Some(new[0]));
        assert!(
            p.pick_for_session(now + PENDING_FOR, 4, Duration::ZERO).is_some(),
            "browsers that stayed away stop counting"
        );
    }

    fn busy_aware(n_min: usize, n_max: usize, max_sessions: usize) -> (Pool<u32>, Instant, Vec<WorkerId>) {
        let now = Instant::now();
        let mut p: Pool<u32> =
            Pool::new(Limits { max_sessions, busy_threshold: 0.5, ..limits(n_min, n_max) }, Ids::default());
        let ids = grow(&mut p, now);
        ready_all(&mut p, &ids, now);
        (p, now, ids)
    }

    /// A browser placed on `id` at `now` opens its session there.
    fn open_session(p: &mut Pool<u32>, id: WorkerId, now: Instant, token: u64) {
        p.session_opened(id, now, Some(token));
    }

    const SAMPLE: Duration = Duration::from_millis(250);

    #[test]
    fn a_new_session_goes_to_a_worker_whose_r_is_not_busy_even_if_it_holds_more_sessions() {
        let (mut p, t0, ids) = busy_aware(2, 2, 20);
        let (a, b) = (ids[0], ids[1]);
        for token in 0..3 {
            open_session(&mut p, a, t0, token);
        }
        open_session(&mut p, b, t0, 3);
        let t1 = t0 + Duration::from_secs(3);
        p.cpu_sampled(a, t1, t1 - SAMPLE, 0.02);
        p.cpu_sampled(b, t1, t1 - SAMPLE, 0.97);
        assert!(p.slot(b).unwrap().busy(t1, 0.5) && !p.slot(a).unwrap().busy(t1, 0.5));
        assert_eq!(p.pick_for_session(t1, 9, Duration::ZERO), Some(a), "the calm worker, though it holds 3 sessions");
        assert!(p.slot(a).unwrap().busy(t1, 0.5), "a browser on its way makes it busy until it has been seen working");
    }

    #[test]
    fn when_every_worker_is_busy_the_pool_grows_and_the_browser_waits_for_the_new_worker() {
        let (mut p, t0, ids) = busy_aware(1, 3, 20);
        let w = ids[0];
        open_session(&mut p, w, t0, 1);
        let t1 = t0 + Duration::from_secs(3);
        p.cpu_sampled(w, t1, t1 - SAMPLE, 1.0);
        assert_eq!(p.pick_for_session(t1, 2, Duration::ZERO), None, "its only worker is busy: wait for another");
        p.session_wanted();
        let new = grow(&mut p, t1);
        assert_eq!(new.len(), 1, "one new worker for the one waiting browser");
        assert_eq!(p.pick_for_session(t1, 2, Duration::from_secs(1)), None, "still starting");
        ready_all(&mut p, &new, t1);
        assert_eq!(p.pick_for_session(t1, 2, Duration::from_secs(1)), Some(new[0]));
        p.session_served();
    }

    #[test]
    fn a_worker_that_finishes_its_work_wakes_waiting_browsers_and_takes_them() {
        let (mut p, t0, ids) = busy_aware(1, 2, 20);
        let w = ids[0];
        open_session(&mut p, w, t0, 1);
        let t1 = t0 + Duration::from_secs(3);
        assert!(!p.cpu_sampled(w, t1, t1 - SAMPLE, 0.9), "busy, and nobody waits anyway");
        assert_eq!(p.pick_for_session(t1, 2, Duration::ZERO), None);
        p.session_wanted();
        let t2 = t1 + SAMPLE;
        assert!(p.cpu_sampled(w, t2, t1, 0.01), "calm again while a browser waits: wake it");
        assert_eq!(p.pick_for_session(t2, 2, SAMPLE), Some(w), "before the new worker is up");
    }

    #[test]
    fn new_work_counts_as_busy_until_a_sample_that_began_after_it() {
        let (mut p, t0, ids) = busy_aware(1, 1, 20);
        let w = ids[0];
        p.cpu_sampled(w, t0, t0 - SAMPLE, 0.0);
        open_session(&mut p, w, t0 + Duration::from_millis(10), 1);
        let t1 = t0 + SAMPLE;
        p.cpu_sampled(w, t1, t0, 0.05);
        assert!(p.slot(w).unwrap().busy(t1, 0.5), "that window began before the session opened");
        let t2 = t1 + SAMPLE;
        p.cpu_sampled(w, t2, t1, 0.05);
        assert!(!p.slot(w).unwrap().busy(t2, 0.5), "a whole window after it, and R stayed calm: cheap work");
        // Without samples (no /proc), new work stops counting after NEW_WORK_FOR.
        let (mut q, t0, ids) = busy_aware(1, 1, 20);
        open_session(&mut q, ids[0], t0, 1);
        assert!(q.slot(ids[0]).unwrap().busy(t0 + NEW_WORK_FOR / 2, 0.5));
        assert!(!q.slot(ids[0]).unwrap().busy(t0 + NEW_WORK_FOR, 0.5));
    }

    #[test]
    fn at_n_max_with_every_worker_busy_the_one_with_fewest_sessions_takes_it() {
        // The case: 6 sessions burn CPU on 4 workers (2, 2, 1, 1); a 7th arrives.
        let (mut p, t0, ids) = busy_aware(4, 4, 20);
        for (token, w) in [ids[0], ids[0], ids[1], ids[1], ids[2], ids[3]].into_iter().enumerate() {
            open_session(&mut p, w, t0, token as u64);
        }
        let t1 = t0 + Duration::from_secs(3);
        for w in &ids {
            p.cpu_sampled(*w, t1, t1 - SAMPLE, 0.5);
        }
        assert_eq!(p.pick_for_session(t1, 7, Duration::ZERO), Some(ids[2]), "not a worker holding 2");
    }

    #[test]
    fn at_n_max_browsers_stuck_on_their_page_are_spread_not_stacked() {
        // Every worker busy; their pages wait on R, so no session opens: each
        // browser placed still weighs on its worker.
        let (mut p, t0, ids) = busy_aware(2, 2, 20);
        let t1 = t0 + Duration::from_secs(3);
        for w in &ids {
            p.cpu_sampled(*w, t1, t1 - SAMPLE, 1.0);
        }
        let picks: Vec<WorkerId> = (0..4).map(|t| p.pick_for_session(t1, t, Duration::ZERO).unwrap()).collect();
        assert_eq!(picks, vec![ids[0], ids[1], ids[0], ids[1]]);
    }

    #[test]
    fn a_browser_waits_for_a_calm_worker_at_most_busy_patience() {
        let (mut p, t0, ids) = busy_aware(1, 2, 20);
        let w = ids[0];
        open_session(&mut p, w, t0, 1);
        let t1 = t0 + Duration::from_secs(3);
        p.cpu_sampled(w, t1, t1 - SAMPLE, 1.0);
        p.session_wanted();
        assert_eq!(p.grow(t1, 0).ids, Vec::<WorkerId>::new(), "the budget across apps is spent: nothing starts");
        assert_eq!(p.pick_for_session(t1, 2, BUSY_PATIENCE / 2), None, "the pool may still grow: wait");
        assert_eq!(p.pick_for_session(t1, 2, BUSY_PATIENCE), Some(w), "long enough: a busy worker with room it is");
        // A worker on its way is waited for, however slow its start (calm workers still wake the browser).
        let new = grow(&mut p, t1);
        assert_eq!(p.pick_for_session(t1, 3, BUSY_PATIENCE * 4), None);
        ready_all(&mut p, &new, t1);
        assert_eq!(p.pick_for_session(t1, 3, BUSY_PATIENCE * 4), Some(new[0]));
        // A full worker is not "busy with room": past patience the browser still waits for room.
        let (mut q, t0, ids) = busy_aware(1, 2, 1);
        open_session(&mut q, ids[0], t0, 1);
        assert_eq!(q.pick_for_session(t0, 2, BUSY_PATIENCE * 2), None);
    }

    #[test]
    fn past_patience_a_busy_worker_with_a_free_place_beats_a_calm_one_whose_places_are_taken() {
        // CI's case: worker a took two browsers at once and went quiet while
        // their pages load; b and c started later and each took one. A fifth
        // browser that waited past BUSY_PATIENCE belongs on b or c, not on a.
        let (mut p, t0, ids) = busy_aware(3, 3, 2);
        let (a, b, c) = (ids[0], ids[1], ids[2]);
        for token in [1, 2] {
            p.slots.get_mut(&a).unwrap().pending.push_back(Pending { token, at: t0 });
        }
        p.slots.get_mut(&a).unwrap().new_work = Some(t0);
        let t1 = t0 + Duration::from_secs(5);
        assert!(!p.slot(a).unwrap().busy(t1, 0.5), "a's new work is old news");
        for (w, token) in [(b, 3), (c, 4)] {
            p.slots.get_mut(&w).unwrap().new_work = Some(t1);
            p.slots.get_mut(&w).unwrap().pending.push_back(Pending { token, at: t1 });
        }
        let picked = p.pick_for_session(t1, 5, BUSY_PATIENCE).unwrap();
        assert_ne!(picked, a, "a's two places are held by browsers on their way");
        // Only when every place is held by a browser on its way (a crawler's
        // page loads, say) do those browsers stop holding places.
        let picked = p.pick_for_session(t1, 6, BUSY_PATIENCE).unwrap();
        assert_ne!(picked, a);
        assert!(p.pick_for_session(t1, 7, BUSY_PATIENCE).is_some(), "all held, none open: still placed");
    }

    #[test]
    fn threshold_zero_is_the_session_count_rule() {
        let now = Instant::now();
        let mut p: Pool<u32> = Pool::new(Limits { max_sessions: 20, ..limits(1, 4) }, Ids::default());
        let ids = grow(&mut p, now);
        ready_all(&mut p, &ids, now);
        open_session(&mut p, ids[0], now, 1);
        p.cpu_sampled(ids[0], now, now - SAMPLE, 1.0);
        assert!(!p.slot(ids[0]).unwrap().busy(now, 0.0));
        assert_eq!(p.pick_for_session(now, 2, Duration::ZERO), Some(ids[0]), "busy R, but it has room");
    }

    #[test]
    fn prune_keeps_n_min_and_spares_busy_and_recent() {
        let (mut p, t0) = pool(1, 4);
        for w in 0..3 {
            p.enqueue(w);
        }
        let ids = grow(&mut p, t0);
        assert_eq!(p.live(), 3);
        p.drain_waiters();
        ready_all(&mut p, &ids, t0);
        let busy = p.checkout().unwrap();
        let later = t0 + Duration::from_secs(10);
        let stopped = p.prune(later, Duration::from_secs(5));
        assert_eq!(stopped.len(), 2, "busy worker stays, others age out");
        assert!(!stopped.contains(&busy));
        assert_eq!(p.prune(later, Duration::from_secs(5)), Vec::<WorkerId>::new());
        for id in stopped {
            p.exited(id, later);
        }
        assert_eq!(p.wants(), 0, "n_min still holds");
        assert_eq!(p.live(), 1);
    }

    #[test]
    fn a_spare_worker_for_another_app_is_the_longest_idle_above_n_min() {
        let (mut p, t0) = pool(1, 3);
        for w in 0..3 {
            p.enqueue(w);
        }
        let ids = grow(&mut p, t0);
        assert_eq!(ids.len(), 3);
        p.drain_waiters();
        assert_eq!(p.spare(t0), None, "starting workers are not spare");
        for (i, id) in ids.iter().enumerate() {
            p.release(*id, t0 + Duration::from_secs(i as u64), Done::Ready, ALL);
        }
        assert_eq!(p.spare(t0), Some((ids[0], t0)));
        p.retire(ids[0], Retire::Budget);
        assert_eq!(p.spare(t0).map(|s| s.0), Some(ids[1]));
        p.retire(ids[1], Retire::Budget);
        assert_eq!(p.spare(t0), None, "never below n_min");
    }

    #[test]
    fn idle_workers_are_probed_and_nothing_else_reaches_them_meanwhile() {
        let (mut p, t0) = pool(2, 2);
        let ids = grow(&mut p, t0);
        ready_all(&mut p, &ids, t0);
        let busy = p.checkout().unwrap();
        let due = p.due_for_probe(t0 + Duration::from_secs(2), Duration::from_secs(1));
        assert_eq!(due.len(), 1, "busy workers are not probed");
        assert_ne!(due[0], busy);
        assert_eq!(p.checkout(), None, "a worker being probed takes no request");
        assert_eq!(p.answering(), 2, "a probed worker still counts as answering");
        assert_eq!(p.touch(due[0], t0, None), Some(false), "a Shiny browser's requests go on during a probe");
        assert!(matches!(p.release(due[0], t0, Done::Probed, ALL), Release::Idle));
        assert_eq!(p.slot(due[0]).unwrap().served, 1, "a probe is not a request");
    }

    #[test]
    fn retiring_takes_a_worker_out_once() {
        let (mut p, now) = pool(2, 3);
        let ids = grow(&mut p, now);
        ready_all(&mut p, &ids, now);
        assert!(p.retire(1, Retire::Broken));
        assert!(!p.retire(1, Retire::Broken), "retiring twice does nothing more");
        assert!(!p.retire(99, Retire::Broken));
        assert_eq!(p.wants(), 1, "a replacement keeps n_min");
        assert_eq!(p.processes(), 2, "the stopping worker still counts against the budget");
    }

    #[test]
    fn stopping_workers_take_nothing_and_release_reports_gone() {
        let (mut p, now) = pool(1, 1);
        let ids = grow(&mut p, now);
        ready_all(&mut p, &ids, now);
        let w = p.checkout().unwrap();
        p.enqueue(1);
        assert_eq!(p.retire_all(), vec![w]);
        assert!(matches!(p.release(w, now, Done::Completed, ALL), Release::Gone));
        assert_eq!(p.drain_waiters(), vec![1]);
    }
}
