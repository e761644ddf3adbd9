//! One app's pool: which workers exist, what state each is in, who waits for
//! one, and every rule about them. Pure logic: no processes, no sockets, no
//! clocks of its own (callers pass `now`), no knowledge of other apps
//! (callers pass the budget's `room`), so every decision is unit-tested.
//!
//! The pool is fed what happened (`Event`: a worker became ready, finished,
//! broke, was sampled; time passed) and returns what should happen as plain
//! values (`Effect`: start, retire and why, hand a waiter a worker, probe,
//! wake waiting browsers); the supervisor's executor carries them out and
//! nothing else in the supervisor decides. Its rooms:
//!
//! - this file: worker states, the pool's shape and what can be read of it;
//! - `events`: `Event` in, `Effect`s out, the one entry the executor uses;
//! - `dispatch`: the FIFO queue, which idle worker takes a request, giving
//!   workers back, retiring, winding a generation down;
//! - `growth`: how many workers to start, crash-loop backoff, pruning, the
//!   spare worker another app may take;
//! - `recycle`: a worker past a limit serves on until its replacement answers;
//! - `health`: memory limits and liveness probes;
//! - `shiny`: placing browsers on workers (by session count and whether R
//!   is busy, from the CPU samples fed in), sessions, draining.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::worker::WorkerId;

mod dispatch;
mod events;
mod growth;
mod health;
mod recycle;
mod shiny;
#[cfg(test)]
mod tests;

pub use events::{Effect, Event, Note, Timers};

/// Where a worker is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Launched (or waiting to be launched) but not yet answering.
    Starting,
    /// Answering and free to take a request (a Shiny worker: taking sessions).
    Idle,
    /// R computes a request; never given a second one meanwhile. It may
    /// also hold requests waiting on promises (`Slot::parked`).
    Busy,
    /// R computes nothing but holds requests waiting on promises
    /// (`Slot::parked`); it takes more while it holds fewer than `max_pending`.
    Waiting,
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
            State::Waiting => "waiting",
            State::Probing => "probing",
            State::Draining => "draining",
            State::Stopping => "stopping",
        }
    }

    /// Whether the worker answers requests now.
    pub fn answering(self) -> bool {
        matches!(self, State::Idle | State::Busy | State::Waiting | State::Probing | State::Draining)
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

/// A worker past `--max-requests` or `--max-worker-memory` and its
/// replacement: it serves on while its replacement starts, and stops taking
/// requests once the replacement answers (see `recycle`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recycle {
    /// Its replacement is wanted: none started yet, or the last failed to start.
    Wanted(Retire),
    /// Its replacement (this worker) is starting.
    Starting(Retire, WorkerId),
    /// Its replacement answers, or none can start: it takes nothing more and stops once free.
    Done(Retire),
}

impl Recycle {
    pub fn as_str(self) -> &'static str {
        match self {
            Recycle::Wanted(_) => "replacement wanted",
            Recycle::Starting(..) => "replacement starting",
            Recycle::Done(_) => "replaced",
        }
    }
}

impl Retire {
    /// Whether the worker gets SIGTERM and time to finish (a planned stop), or SIGKILL.
    pub fn gentle(self) -> bool {
        matches!(self, Retire::Idle | Retire::Requests | Retire::Memory | Retire::Budget | Retire::Shutdown)
    }
}

/// A retirement as metrics count it (`valve_worker_exits_total`'s reason).
impl From<Retire> for crate::metrics::ExitReason {
    fn from(r: Retire) -> Self {
        match r {
            Retire::Idle => crate::metrics::ExitReason::Idle,
            Retire::Requests => crate::metrics::ExitReason::Recycled,
            Retire::Memory => crate::metrics::ExitReason::Memory,
            Retire::Timeout => crate::metrics::ExitReason::Timeout,
            Retire::Broken => crate::metrics::ExitReason::Broken,
            Retire::Unresponsive => crate::metrics::ExitReason::Unresponsive,
            Retire::Budget => crate::metrics::ExitReason::Budget,
            Retire::Shutdown => crate::metrics::ExitReason::Shutdown,
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
    /// When it answered its readiness probe.
    pub ready_at: Option<Instant>,
    pub served: u64,
    /// Requests it holds that wait on promises (R computes nothing for them
    /// until one settles). A worker with any is never pruned, probed or
    /// stopped gently before they settle.
    pub parked: usize,
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
    /// Past a limit, serving on until its replacement answers.
    pub recycle: Option<Recycle>,
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
    /// probe does not hold it), is not draining and is not past a limit (a
    /// session would keep it for its whole length).
    fn takes_sessions(&self) -> bool {
        matches!(self.state, State::Idle | State::Probing) && self.recycle.is_none()
    }

    fn new(now: Instant, limit: Option<u64>) -> Self {
        Slot {
            state: State::Starting,
            last_used: now,
            created: now,
            ready_at: None,
            served: 0,
            parked: 0,
            proven: false,
            limit,
            memory: None,
            over_memory: false,
            retired: None,
            recycle: None,
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
    /// plumber: requests waiting on promises a worker may hold and still take
    /// another (`--max-pending`); 0: a worker holding one takes nothing more.
    pub max_pending: usize,
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
    /// Its request waits on a promise: R computes nothing now.
    Parked,
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
    /// Due to stop, it takes nothing more and stops once its requests waiting on promises settle.
    Settling,
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
        // n_max = 0: static content's pool, which never holds a worker.
        assert!(limits.n_min <= limits.n_max, "limits are checked by config");
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
}
