//! The pool's hands, one `Supervisor` per app generation, all sharing one
//! `Fleet`. This file holds their shapes only; their rooms, from the bottom:
//!
//! - `after`: what the executor does once the fleet's lock is released;
//! - `fleet`: the one lock over every app's pool and live workers, and
//!   growth within the worker budget;
//! - `execute`: the executor, which feeds the pool events and carries out
//!   the effects it returns (nothing else here decides), liveness probes and
//!   settling abandoned requests, and giving leased workers back;
//! - `task`: one worker's task, from launch to exit (its process is watched
//!   by `worker::watch`);
//! - `seats`: what a request asks of an app: a `Lease` (plumber) or a
//!   `Sticky` worker (Shiny), sessions opening and closing;
//! - `lifecycle`: starting an app, its background loop, `n_min`, winding a
//!   generation down, shutting down;
//! - `status`: status, gauges, readiness.
//!
//! Every time here comes from tokio's clock, so that tests on a paused clock
//! reach every timer (probes, pruning, backoff, draining, settling).
//!
//! Locking: one `std::sync::Mutex` in the `Fleet` over every app's pool and
//! live workers, so the budget across apps is exact. It is held for
//! bookkeeping only: never across an `.await`, never while reading /proc.

mod after;
mod execute;
mod fleet;
mod lifecycle;
mod seats;
mod status;
mod task;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch, Notify};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::lease::Lease;
use super::pool::{Ids, Limits, Pool, WorkerId};
use crate::config::AppConfig;
use crate::metrics::AppMetrics;
use crate::worker::{Conn, Connect, Exit, Launch, Stop};

pub use self::execute::{DRAIN_QUIET, SETTLE_MAX};
pub use self::status::{Status, WorkerStatus};
pub use crate::worker::watch::KILL_AFTER;

/// The time, from tokio's clock (so that tests with a paused clock drive
/// pruning, backoff and probes too).
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// Why no worker could be had.
#[derive(Debug, thiserror::Error)]
pub enum Unavailable {
    #[error("valve is shutting down")]
    ShuttingDown,
    #[error("all workers are busy and the queue is full")]
    QueueFull,
    #[error("no worker came free within --queue-timeout")]
    QueueTimeout,
    /// A browser waited for a place in a generation that a reload replaced
    /// (or removed) meanwhile: it goes to the successor, if there is one.
    #[error("the app was reloaded or removed while this request waited")]
    Replaced,
}

/// One app's settings, as the supervisor needs them.
#[derive(Clone, Debug)]
pub struct Settings {
    pub name: String,
    pub limits: Limits,
    pub max_age: Duration,
    pub check_unused: Duration,
    pub start_timeout: Duration,
    pub queue_size: usize,
    pub queue_timeout: Duration,
    pub request_timeout: Option<Duration>,
    /// Where the app's request bodies are spooled, if not valve's run
    /// directory (its workers read them: they must be theirs).
    pub spool: Option<crate::worker::SpoolDir>,
    /// What the app's own library holds (none: it names no packages).
    pub packages: Option<crate::restore::cache::Summary>,
}

impl Settings {
    /// An app's settings as its supervisor needs them.
    pub fn from_config(app: &AppConfig, check_unused: Duration) -> Settings {
        Settings {
            name: app.name.clone(),
            limits: Limits {
                n_min: app.n_min,
                n_max: app.n_max,
                max_requests: app.max_requests,
                max_memory: app.max_worker_memory,
                max_sessions: app.max_sessions,
                busy_threshold: if app.is_shiny() { app.busy_threshold } else { 0.0 },
                max_pending: app.max_pending,
            },
            max_age: app.max_age,
            check_unused,
            start_timeout: app.start_timeout,
            queue_size: app.queue_size,
            queue_timeout: app.queue_timeout,
            request_timeout: app.request_timeout,
            spool: None,
            packages: None,
        }
    }
}

/// One app's supervisor.
pub struct Supervisor {
    fleet: Arc<Fleet>,
    key: AppKey,
    launcher: Box<dyn Launch>,
    pub settings: Settings,
    pub metrics: Arc<AppMetrics>,
    /// Woken whenever a worker becomes ready or exits, or a session closes
    /// (Shiny placement and winding down wait on it).
    changed: Notify,
    tasks: TaskTracker,
    /// Stops the app's background loop.
    loops: CancellationToken,
    /// Shiny: the signed-in users of each worker's open sessions, for the
    /// status page (its own lock, never taken with the fleet's held).
    users: Mutex<BTreeMap<WorkerId, Vec<String>>>,
    /// The generation that replaced this one (a reload), for browsers that
    /// were waiting here for a place when it did.
    successor: std::sync::OnceLock<std::sync::Weak<Supervisor>>,
}

pub(super) type Waiter = oneshot::Sender<Lease>;

/// An app generation's key in the fleet.
pub type AppKey = u64;

/// Every app's workers, under one lock, within one budget.
pub struct Fleet {
    pub(super) state: Mutex<FleetState>,
    pub(super) ids: Ids,
    pub(super) max_workers: AtomicUsize,
    pub(super) next_key: AtomicU64,
}

pub(super) struct FleetState {
    pub(super) apps: BTreeMap<AppKey, AppState>,
}

/// One app's share of the fleet.
pub(super) struct AppState {
    pub(super) pool: Pool<Waiter>,
    pub(super) live: HashMap<WorkerId, Live>,
    pub(super) closing: bool,
    /// The app reached `n_min` once (after that, failed starts are retried).
    pub(super) started: bool,
    pub(super) sup: Weak<Supervisor>,
}

/// A worker process the app's task has launched and not yet seen exit.
pub(super) struct Live {
    pub(super) stop: watch::Sender<Option<Stop>>,
    pub(super) exit: watch::Receiver<Option<Exit>>,
    pub(super) connector: Arc<dyn Connect>,
    /// Open keep-alive connections to the worker, ready for reuse.
    pub(super) conns: Vec<Conn>,
    pub(super) pid: Option<u32>,
    pub(super) forked: bool,
    /// How it started: "fresh R", "app preload" or "warm parent" (once ready).
    pub(super) started_by: &'static str,
    /// Rung when the worker finished a request: its memory is due a sample.
    pub(super) used: Arc<Notify>,
}

impl Supervisor {
    /// Registers a new app in the fleet and starts its background loop. Must
    /// be called inside the tokio runtime. Workers start with `start`.
    pub fn new(
        fleet: Arc<Fleet>,
        settings: Settings,
        launcher: Box<dyn Launch>,
        metrics: Arc<AppMetrics>,
    ) -> Arc<Self> {
        let key = fleet.next_key.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let sup = Arc::new(Supervisor {
            fleet: fleet.clone(),
            key,
            launcher,
            settings: settings.clone(),
            metrics,
            changed: Notify::new(),
            tasks: TaskTracker::new(),
            loops: CancellationToken::new(),
            users: Mutex::new(BTreeMap::new()),
            successor: std::sync::OnceLock::new(),
        });
        fleet.lock().apps.insert(
            key,
            AppState {
                pool: Pool::new(settings.limits, fleet.ids.clone()),
                live: Default::default(),
                closing: false,
                started: false,
                sup: Arc::downgrade(&sup),
            },
        );
        tokio::spawn(sup.clone().background());
        sup
    }

    /// Runs `f` on this app's state under the fleet's lock.
    fn with<T>(&self, f: impl FnOnce(&mut AppState) -> T) -> Option<T> {
        let mut fleet = self.fleet.lock();
        fleet.apps.get_mut(&self.key).map(f)
    }
}
