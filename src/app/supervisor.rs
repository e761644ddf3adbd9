//! The pool's hands: carries out what `Pool` decides with worker processes
//! (through `worker::Launch`), keeps each worker's idle connections, hands out
//! `Lease`s (plumber) and `Sticky` workers (Shiny), and runs the app's
//! background loop (pruning, liveness probes, draining, history).
//!
//! Each worker has one task that owns its process: it launches it, waits for
//! it to answer, signals it (only that task does, and only before it has seen
//! the exit), samples its memory off every lock, and reports its exit.
//!
//! Locking: one `std::sync::Mutex` in the `Fleet` over every app's pool and
//! live workers, so the budget across apps is exact. It is held for
//! bookkeeping only: never across an `.await`, never while reading /proc.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch, Notify};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::budget::{self, Spare};
use super::lease::{Home, Lease, Returned};
use super::pool::{Done, Ids, Limits, Pool, Release, Retire, Start, State, WorkerId, BUSY_PATIENCE};
use super::sticky::Sticky;
use crate::metrics::{AppMetrics, ExitReason, Gauges, Rejection};
use crate::worker::{Conn, Connect, Exit, Launch, MemoryProbe, StartError, Stop};

/// How long a worker gets between SIGTERM and SIGKILL.
pub const KILL_AFTER: Duration = Duration::from_secs(3);
/// How often the app's background loop runs.
const TICK: Duration = Duration::from_secs(1);
/// Idle workers unused this long get a liveness probe, which must answer within `PROBE_DEADLINE`.
const PROBE_IDLE: Duration = Duration::from_secs(1);
const PROBE_DEADLINE: Duration = Duration::from_secs(3);
/// A draining Shiny worker with no session left stops after this long without traffic.
const DRAIN_QUIET: Duration = Duration::from_secs(5);
/// Memory samples after requests are at least this far apart, and at least
/// 50 times as far apart as a sample takes (reading a fork's private memory
/// costs milliseconds).
const SAMPLE_MIN_GAP: Duration = Duration::from_millis(200);
/// How often a Shiny worker's CPU is sampled (when --busy-threshold is not 0).
const CPU_SAMPLE_EVERY: Duration = Duration::from_millis(250);

type Waiter = oneshot::Sender<Lease>;

/// The time, from tokio's clock (so that tests with a paused clock drive
/// pruning, backoff and probes too).
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// An app generation's key in the fleet.
pub type AppKey = u64;

/// Why no worker could be had.
#[derive(Debug, thiserror::Error)]
pub enum Unavailable {
    #[error("valve is shutting down")]
    ShuttingDown,
    #[error("all workers are busy and the queue is full")]
    QueueFull,
    #[error("no worker came free within --queue-timeout")]
    QueueTimeout,
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
}

/// Every app's workers, under one lock, within one budget.
pub struct Fleet {
    state: Mutex<FleetState>,
    ids: Ids,
    max_workers: AtomicUsize,
    next_key: AtomicU64,
}

struct FleetState {
    apps: BTreeMap<AppKey, AppState>,
}

impl FleetState {
    fn processes(&self) -> usize {
        self.apps.values().map(|a| a.pool.processes()).sum()
    }
}

/// One app's share of the fleet.
struct AppState {
    pool: Pool<Waiter>,
    live: HashMap<WorkerId, Live>,
    closing: bool,
    /// The app reached `n_min` once (after that, failed starts are retried).
    started: bool,
    sup: Weak<Supervisor>,
}

impl AppState {
    /// Takes a worker out of service: no more connections to it, and a signal
    /// (SIGTERM for a planned stop, SIGKILL for a hung or broken worker) sent by
    /// the task that owns its process. Returns false if it was out already.
    fn take_out(&mut self, id: WorkerId, reason: Retire) -> bool {
        if !self.pool.retire(id, reason) {
            return false;
        }
        self.signal(id, reason);
        true
    }

    /// Sends the stop for a worker the pool has already retired.
    fn signal(&mut self, id: WorkerId, reason: Retire) {
        if let Some(live) = self.live.get_mut(&id) {
            live.conns.clear();
            let _ = live.stop.send(Some(if reason.gentle() { Stop::Term } else { Stop::Kill }));
        }
    }
}

/// A worker process the app's task has launched and not yet seen exit.
struct Live {
    stop: watch::Sender<Option<Stop>>,
    exit: watch::Receiver<Option<Exit>>,
    connector: Arc<dyn Connect>,
    /// Open keep-alive connections to the worker, ready for reuse.
    conns: Vec<Conn>,
    pid: Option<u32>,
    forked: bool,
    /// Rung when the worker finished a request: its memory is due a sample.
    used: Arc<Notify>,
}

impl Fleet {
    pub fn new(max_workers: usize) -> Arc<Fleet> {
        Arc::new(Fleet {
            state: Mutex::new(FleetState { apps: BTreeMap::new() }),
            ids: Ids::default(),
            max_workers: AtomicUsize::new(max_workers),
            next_key: AtomicU64::new(1),
        })
    }

    fn lock(&self) -> MutexGuard<'_, FleetState> {
        // A panic while holding the lock cannot leave the pools half-updated in
        // a way that matters more than stopping valve would, so keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// R worker processes across every app now (stopping ones included).
    pub fn processes(&self) -> usize {
        self.lock().processes()
    }

    pub fn max_workers(&self) -> usize {
        self.max_workers.load(Ordering::Relaxed)
    }

    /// Changes the budget (a reload): more room starts what apps want; less
    /// stops nothing at once, workers above it are not replaced when they go.
    pub fn set_max_workers(&self, max_workers: usize) {
        let starts = {
            let mut f = self.lock();
            self.max_workers.store(max_workers.max(1), Ordering::Relaxed);
            self.rebalance(&mut f, now())
        };
        spawn_all(starts);
    }

    /// Starts what every app wants that the budget allows (after a worker of
    /// any app exited, room may have come free). Called with the lock held;
    /// the returned starts are carried out after it is released.
    fn rebalance(&self, f: &mut FleetState, now: Instant) -> Vec<(Arc<Supervisor>, Start)> {
        let keys: Vec<AppKey> = f.apps.keys().copied().collect();
        let mut starts = Vec::new();
        for key in keys {
            starts.extend(self.grow(f, key, now));
        }
        starts
    }

    /// Grows one app as far as it wants and the budget allows. When the budget
    /// is what stops it, the longest-idle spare worker of another app is
    /// stopped: its exit makes the room.
    fn grow(&self, f: &mut FleetState, key: AppKey, now: Instant) -> Option<(Arc<Supervisor>, Start)> {
        let room = budget::room(self.max_workers(), f.processes());
        let app = f.apps.get_mut(&key)?;
        if app.closing {
            return None;
        }
        let start = app.pool.grow(now, room);
        let short = app.pool.wants();
        let sup = app.sup.upgrade()?;
        // Stopping workers will free their places: only take more for what they do not cover.
        let freeing: usize = f.apps.values().map(|a| a.pool.count(State::Stopping)).sum();
        if short > freeing {
            let spares = f.apps.iter().filter_map(|(k, a)| {
                a.pool.spare(now).map(|(worker, idle_since)| Spare { app: *k, worker, idle_since })
            });
            if let Some(victim) = budget::victim(key, spares) {
                if let Some(other) = f.apps.get_mut(&victim.app) {
                    if other.take_out(victim.worker, Retire::Budget) {
                        tracing::info!(
                            worker = victim.worker,
                            app = %other.sup.upgrade().map(|s| s.settings.name.clone()).unwrap_or_default(),
                            for_app = %sup.settings.name,
                            max_workers = self.max_workers(),
                            "stopping an idle worker: another app needs its place in the worker budget"
                        );
                    }
                }
            }
        }
        (!start.ids.is_empty()).then_some((sup, start))
    }
}

/// One app's supervisor.
pub struct Supervisor {
    fleet: Arc<Fleet>,
    key: AppKey,
    launcher: Box<dyn Launch>,
    pub settings: Settings,
    pub metrics: Arc<AppMetrics>,
    /// Woken whenever a worker becomes ready or a session closes (Shiny placement waits on it).
    changed: Notify,
    tasks: TaskTracker,
    /// Stops the app's background loop.
    loops: CancellationToken,
}

/// What `/__valve__/status` shows of one worker.
#[derive(Clone, Debug, serde::Serialize)]
pub struct WorkerStatus {
    pub id: WorkerId,
    pub pid: Option<u32>,
    pub state: &'static str,
    pub requests: u64,
    pub sessions: usize,
    pub uptime_s: f64,
    pub idle_s: Option<f64>,
    pub memory_bytes: Option<u64>,
    pub forked: bool,
    /// Shiny: the share of a CPU its R used (running or waiting to run) at the last sample.
    pub cpu: Option<f64>,
}

/// What `/__valve__/status` shows of one app's pool.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Status {
    pub workers: Vec<WorkerStatus>,
    pub gauges: Gauges,
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
        let key = fleet.next_key.fetch_add(1, Ordering::Relaxed);
        let sup = Arc::new(Supervisor {
            fleet: fleet.clone(),
            key,
            launcher,
            settings: settings.clone(),
            metrics,
            changed: Notify::new(),
            tasks: TaskTracker::new(),
            loops: CancellationToken::new(),
        });
        fleet.lock().apps.insert(
            key,
            AppState {
                pool: Pool::new(settings.limits, fleet.ids.clone()),
                live: HashMap::new(),
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

    /// Whether worker `id` is one of this app's (generation's).
    /// Whether worker `id` is this app's and still serves its sessions (not
    /// stopping): a browser on an older generation stays there only while its
    /// worker does, and otherwise goes to the current one (a winding-down
    /// generation starts no worker for it).
    pub fn keeps(&self, id: WorkerId) -> bool {
        self.with(|app| app.pool.slot(id).is_some_and(|s| s.state != State::Stopping)).unwrap_or(false)
    }

    pub fn gauges(&self) -> Gauges {
        self.with(|app| gauges(&app.pool)).unwrap_or_default()
    }

    /// Whether the app can serve: it reached `n_min` once and a request sent
    /// now will be served (a worker answers, or one is on its way: see
    /// `Pool::can_serve`). A worker recycled or replaced keeps the app ready.
    pub fn ready(&self) -> bool {
        let now = now();
        let f = self.fleet.lock();
        let freeing = f.apps.values().map(|a| a.pool.count(State::Stopping)).sum();
        f.apps.get(&self.key).is_some_and(|app| app.started && !app.closing && app.pool.can_serve(now, freeing))
    }

    /// Every worker of the app, from what is known: no lock is held while
    /// anything is read from /proc (memory is sampled by each worker's task).
    pub fn status(&self) -> Status {
        let now = now();
        self.with(|app| {
            let workers = app
                .pool
                .slots()
                .map(|(id, slot)| {
                    let live = app.live.get(&id);
                    WorkerStatus {
                        id,
                        pid: live.and_then(|l| l.pid),
                        state: slot.state.as_str(),
                        requests: slot.served,
                        sessions: slot.sessions,
                        uptime_s: now.duration_since(slot.created).as_secs_f64(),
                        idle_s: (slot.state == State::Idle).then(|| now.duration_since(slot.last_used).as_secs_f64()),
                        memory_bytes: slot.memory,
                        forked: live.is_some_and(|l| l.forked),
                        cpu: slot.cpu.map(|c| (c * 100.0).round() / 100.0),
                    }
                })
                .collect();
            Status { workers, gauges: gauges(&app.pool) }
        })
        .unwrap_or(Status { workers: Vec::new(), gauges: Gauges::default() })
    }

    /// Starts `n_min` workers and waits until all of them answer. The first
    /// failure is returned (with R's output); nothing is restarted before the
    /// app has been ready once.
    pub async fn start(self: &Arc<Self>) -> Result<(), StartError> {
        let start = {
            let mut f = self.fleet.lock();
            self.fleet.grow(&mut f, self.key, now())
        };
        let mut reports = Vec::new();
        for id in start.map(|(_, s)| s.ids).unwrap_or_default() {
            let (tx, rx) = oneshot::channel();
            self.spawn_worker(id, Duration::ZERO, Some(tx));
            reports.push(rx);
        }
        for rx in reports {
            match rx.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(StartError::Io(std::io::Error::other("worker task ended unexpectedly"))),
            }
        }
        self.with(|app| app.started = true);
        Ok(())
    }

    /// Takes a worker for one request: an idle one now, or the first to come free.
    pub async fn lease(self: &Arc<Self>) -> Result<Lease, Unavailable> {
        let (rx, starts) = {
            let mut f = self.fleet.lock();
            let Some(app) = f.apps.get_mut(&self.key) else { return Err(Unavailable::ShuttingDown) };
            if app.closing {
                return Err(Unavailable::ShuttingDown);
            }
            if let Some(id) = app.pool.checkout() {
                self.metrics.queue_wait.observe(Duration::ZERO);
                return Ok(self.lease_for(app, id));
            }
            if app.pool.queue_len() >= self.settings.queue_size {
                // Clients that gave up while waiting still hold places: free them first.
                app.pool.retain_waiters(|w| !w.is_closed());
                if app.pool.queue_len() >= self.settings.queue_size {
                    self.metrics.reject(Rejection::QueueFull);
                    return Err(Unavailable::QueueFull);
                }
            }
            let (tx, rx) = oneshot::channel();
            app.pool.enqueue(tx);
            let starts = self.fleet.grow(&mut f, self.key, now());
            (rx, starts)
        };
        if let Some((sup, start)) = starts {
            let g = self.gauges();
            tracing::info!(
                app = %self.settings.name,
                workers = ?start.ids,
                queued = g.queued,
                live = g.starting + g.idle + g.busy,
                n_max = g.n_max,
                "starting worker: requests are waiting and the pool has room"
            );
            sup.spawn_start(start);
        }
        let queued = now();
        let result = match tokio::time::timeout(self.settings.queue_timeout, rx).await {
            Ok(Ok(mut lease)) => {
                lease.waited = queued.elapsed();
                Ok(lease)
            }
            Ok(Err(_)) => Err(Unavailable::ShuttingDown),
            Err(_) => Err(Unavailable::QueueTimeout),
        };
        self.metrics.queue_wait.observe(queued.elapsed());
        match &result {
            Err(Unavailable::QueueTimeout) => self.metrics.reject(Rejection::QueueTimeout),
            Err(Unavailable::ShuttingDown) => self.metrics.reject(Rejection::ShuttingDown),
            _ => {}
        }
        result
    }

    fn lease_for(self: &Arc<Self>, app: &mut AppState, id: WorkerId) -> Lease {
        let home: Arc<dyn Home> = self.clone();
        match app.live.get_mut(&id) {
            Some(live) => Lease::new(home, id, Some(live.connector.clone()), live.conns.pop(), live.exit.clone()),
            None => Lease::new(home, id, None, None, watch::channel(Some(Exit::Unknown)).1),
        }
    }

    /// The Shiny worker for a request: the browser's own (`wanted`, its worker
    /// and token from its sticky cookie) while it serves, else the one the
    /// pool picks (`Pool::pick_for_session`: a worker whose R is not busy,
    /// with the fewest sessions below --max-sessions), starting one when all
    /// are busy or full. `token` names a browser that has none yet.
    pub async fn sticky(self: &Arc<Self>, wanted: Option<(WorkerId, u64)>, token: u64) -> Result<Sticky, Unavailable> {
        let began = tokio::time::Instant::now();
        let deadline = began + self.settings.queue_timeout;
        // Past this, a busy worker with room will do (the pool decides); look again then.
        let patience = began + BUSY_PATIENCE;
        let mut counted = false;
        let result = loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let starts = {
                let mut f = self.fleet.lock();
                let Some(app) = f.apps.get_mut(&self.key) else { break Err(Unavailable::ShuttingDown) };
                if app.closing {
                    break Err(Unavailable::ShuttingDown);
                }
                let now = now();
                if let Some((id, token)) = wanted {
                    if app.pool.touch(id, now, Some(token)).is_some() {
                        if let Some(sticky) = sticky_for(self, app, id, false, token) {
                            break Ok(sticky);
                        }
                    }
                }
                if let Some(id) = app.pool.pick_for_session(now, token, began.elapsed()) {
                    app.pool.touch(id, now, None);
                    if let Some(sticky) = sticky_for(self, app, id, true, token) {
                        break Ok(sticky);
                    }
                }
                if !counted {
                    app.pool.session_wanted();
                    counted = true;
                }
                let seen: Vec<(WorkerId, &'static str, usize)> =
                    app.pool.slots().map(|(id, s)| (id, s.state.as_str(), s.sessions)).collect();
                (self.fleet.grow(&mut f, self.key, now), seen)
            };
            let (starts, seen) = starts;
            if let Some((sup, start)) = starts {
                tracing::info!(
                    app = %self.settings.name,
                    workers = ?start.ids,
                    seen = ?seen,
                    wanted = ?wanted.map(|w| w.0),
                    max_sessions = self.settings.limits.max_sessions,
                    "starting worker: a new browser finds every worker busy or holding --max-sessions sessions"
                );
                sup.spawn_start(start);
            }
            let wake = if tokio::time::Instant::now() < patience { patience.min(deadline) } else { deadline };
            if tokio::time::timeout_at(wake, changed).await.is_err() && wake == deadline {
                self.metrics.reject(Rejection::QueueTimeout);
                break Err(Unavailable::QueueTimeout);
            }
        };
        if counted {
            self.with(|app| app.pool.session_served());
        }
        result
    }

    /// A Shiny session's WebSocket opened (`true`, from the browser with
    /// `token`) or closed on a worker.
    pub fn session(&self, id: WorkerId, open: bool, token: Option<u64>) {
        let now = now();
        self.with(|app| {
            if open {
                app.pool.session_opened(id, now, token);
            } else {
                app.pool.session_closed(id, now);
            }
        });
        if open {
            self.metrics.session_opened();
        } else {
            self.changed.notify_waiters();
        }
    }

    /// Takes a worker out of service now (a Shiny worker that broke or hung).
    pub fn retire(self: &Arc<Self>, id: WorkerId, reason: Retire) {
        let starts = {
            let mut f = self.fleet.lock();
            let Some(app) = f.apps.get_mut(&self.key) else { return };
            app.take_out(id, reason);
            self.fleet.grow(&mut f, self.key, now())
        };
        spawn_starts(starts);
    }

    /// Gives a worker that came back to the next waiter, or makes it idle, or
    /// retires it. Called with the lock held.
    fn hand_on(self: &Arc<Self>, app: &mut AppState, id: WorkerId, mut done: Done) {
        loop {
            match app.pool.release(id, now(), done, |w| !w.is_closed()) {
                Release::Handoff(waiter) => {
                    let lease = self.lease_for(app, id);
                    match waiter.send(lease) {
                        Ok(()) => return,
                        // That client left just now: take the worker back
                        // without giving it back through the lock we hold.
                        Err(lease) => {
                            if let (Some(live), Some(conn)) = (app.live.get_mut(&id), lease.disarm()) {
                                live.conns.push(conn);
                            }
                            done = Done::Unused;
                        }
                    }
                }
                Release::Retire(reason) => {
                    app.signal(id, reason);
                    let pid = app.live.get(&id).and_then(|l| l.pid);
                    match reason {
                        Retire::Memory => tracing::info!(
                            app = %self.settings.name, worker = id, pid,
                            memory_mb = app.pool.slot(id).and_then(|s| s.memory).unwrap_or(0) >> 20,
                            limit_mb = self.settings.limits.max_memory.unwrap_or(0) >> 20,
                            "replacing worker: its memory passed --max-worker-memory"
                        ),
                        Retire::Shutdown => tracing::info!(
                            app = %self.settings.name, worker = id, pid,
                            "stopping worker: its app was reloaded or removed, and its last request is done"
                        ),
                        _ => tracing::info!(
                            app = %self.settings.name, worker = id, pid,
                            "replacing worker: it served --max-requests requests"
                        ),
                    }
                    return;
                }
                Release::Idle | Release::Gone => return,
            }
        }
    }

    /// After a request ended without its client (or its worker's answer):
    /// the worker is still busy in R. A probe on a fresh connection is answered
    /// only once R has finished, so the worker comes back then.
    async fn settle(self: Arc<Self>, id: WorkerId, connector: Option<Arc<dyn Connect>>) {
        let probe = async {
            let connector = connector.ok_or_else(|| std::io::Error::other("the worker is gone"))?;
            connector.probe().await
        };
        let settled = match self.settings.request_timeout {
            Some(limit) => {
                tokio::time::timeout(limit, probe).await.unwrap_or_else(|_| Err(std::io::Error::other("timed out")))
            }
            None => probe.await,
        };
        let mut f = self.fleet.lock();
        let Some(app) = f.apps.get_mut(&self.key) else { return };
        match settled {
            Ok(conn) => {
                if let Some(live) = app.live.get_mut(&id) {
                    live.conns.push(conn);
                }
                self.hand_on(app, id, Done::Completed);
            }
            Err(e) => {
                tracing::warn!(app = %self.settings.name, worker = id, error = %e,
                    "worker did not finish an abandoned request; replacing it");
                app.take_out(id, Retire::Timeout);
            }
        }
    }

    fn spawn_start(self: &Arc<Self>, start: Start) {
        for id in start.ids {
            self.spawn_worker(id, start.delay, None);
        }
    }

    fn spawn_worker(
        self: &Arc<Self>,
        id: WorkerId,
        delay: Duration,
        report: Option<oneshot::Sender<Result<(), StartError>>>,
    ) {
        let this = self.clone();
        self.tasks.spawn(async move { this.run_worker(id, delay, report).await });
    }

    /// One worker's whole life: launch, wait until it answers, serve, exit.
    async fn run_worker(
        self: Arc<Self>,
        id: WorkerId,
        delay: Duration,
        report: Option<oneshot::Sender<Result<(), StartError>>>,
    ) {
        if !delay.is_zero() {
            tracing::warn!(
                app = %self.settings.name,
                worker = id,
                delay_ms = delay.as_millis() as u64,
                "a worker failed to start or died soon after starting; waiting before the next start"
            );
            tokio::time::sleep(delay).await;
        }
        let wanted = self.with(|app| !app.closing && app.pool.slot(id).is_some_and(|s| s.state == State::Starting));
        if wanted != Some(true) {
            return self.exited(id, None, Exit::Unknown);
        }
        let launched_at = now();
        let launched = match self.launcher.launch(id).await {
            Ok(l) => l,
            Err(e) => return self.start_failed(id, e, report),
        };
        let mut process = launched.process;
        let (stop_tx, mut stop_rx) = watch::channel(None);
        let (exit_tx, exit_rx) = watch::channel(None);
        let used = Arc::new(Notify::new());
        self.with(|app| {
            let stopping = app.pool.slot(id).is_none_or(|s| s.state == State::Stopping);
            app.live.insert(
                id,
                Live {
                    stop: stop_tx,
                    exit: exit_rx,
                    connector: launched.connector.clone(),
                    conns: Vec::new(),
                    pid: process.pid(),
                    forked: false,
                    used: used.clone(),
                },
            );
            if stopping {
                let _ = app.live[&id].stop.send(Some(Stop::Term));
            }
        });

        let ready = tokio::select! {
            ready = process.ready(launched.connector.as_ref(), self.settings.start_timeout) => ready,
            _ = stop_rx.wait_for(Option::is_some) => Err(StartError::Io(std::io::Error::other("stopped while starting"))),
        };
        // A fork's pid (so its memory) is known once it answered.
        let memory = process.memory();
        match ready {
            Ok(conn) => {
                let pid = process.pid();
                self.metrics.spawn_duration.observe(launched_at.elapsed());
                tracing::info!(app = %self.settings.name, worker = id, pid,
                    startup_ms = launched_at.elapsed().as_millis() as u64, "worker ready");
                {
                    let mut f = self.fleet.lock();
                    if let Some(app) = f.apps.get_mut(&self.key) {
                        if let Some(live) = app.live.get_mut(&id) {
                            live.pid = pid;
                            live.forked = memory.is_some_and(|m| m.private_only);
                            live.conns.push(conn);
                        }
                        self.hand_on(app, id, Done::Ready);
                    }
                }
                self.changed.notify_waiters();
                if let Some(tx) = report {
                    let _ = tx.send(Ok(()));
                }
            }
            Err(e) => {
                process.signal(Stop::Kill);
                let exit = process.exited().await;
                let _ = exit_tx.send(Some(exit));
                let stopped = self.with(|app| app.pool.slot(id).is_some_and(|s| s.retired.is_some())) == Some(true);
                if stopped {
                    return self.exited(id, process.pid(), Exit::Unknown);
                }
                return self.start_failed(id, e, report);
            }
        }

        // Serving: wait for the exit; carry out stops; sample memory, and a
        // Shiny worker's CPU (the pool places new sessions by it).
        let cpu_pid = process.pid().filter(|_| self.settings.limits.busy_threshold > 0.0);
        let mut cpu_tick = tokio::time::interval(CPU_SAMPLE_EVERY);
        cpu_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut cpu_last: Option<(Instant, Duration)> = None;
        let mut memory_at: Option<Instant> = None;
        let mut sample_cost = Duration::ZERO;
        let mut next_sample = tokio::time::Instant::now();
        let mut kill_at: Option<tokio::time::Instant> = None;
        let mut stops_open = true;
        let exit = loop {
            tokio::select! {
                exit = process.exited() => break exit,
                changed = stop_rx.changed(), if stops_open => {
                    if changed.is_err() {
                        stops_open = false;
                        continue;
                    }
                    match *stop_rx.borrow_and_update() {
                        Some(Stop::Term) => {
                            process.signal(Stop::Term);
                            kill_at.get_or_insert(tokio::time::Instant::now() + KILL_AFTER);
                        }
                        Some(Stop::Kill) => process.signal(Stop::Kill),
                        None => {}
                    }
                }
                _ = tokio::time::sleep_until(kill_at.unwrap_or_else(tokio::time::Instant::now)), if kill_at.is_some() => {
                    process.signal(Stop::Kill);
                    kill_at = None;
                }
                _ = used.notified(), if self.settings.limits.max_memory.is_some() => {
                    let gap = SAMPLE_MIN_GAP.max(sample_cost * 50);
                    let due = memory_at.map(|t| t + gap).unwrap_or_else(Instant::now);
                    next_sample = next_sample.min(tokio::time::Instant::from_std(due));
                }
                _ = cpu_tick.tick(), if cpu_pid.is_some() => {
                    cpu_last = self.sample_cpu(id, cpu_pid, cpu_last);
                }
                _ = tokio::time::sleep_until(next_sample), if memory.is_some() => {
                    let began = now();
                    if let Some(probe) = memory {
                        self.sample(id, probe).await;
                    }
                    sample_cost = began.elapsed();
                    memory_at = Some(now());
                    next_sample = tokio::time::Instant::now() + self.settings.check_unused;
                }
            }
        };
        let _ = exit_tx.send(Some(exit.clone()));
        self.exited(id, process.pid(), exit);
    }

    /// Reads how long a Shiny worker's R has run or waited to run (one small
    /// /proc file, off the lock) and gives the pool its share of the time
    /// since the last reading; wakes browsers waiting for a place when the
    /// pool says this worker can take one now. Returns the new last reading.
    fn sample_cpu(
        &self,
        id: WorkerId,
        pid: Option<u32>,
        last: Option<(Instant, Duration)>,
    ) -> Option<(Instant, Duration)> {
        let at = now();
        let used = crate::worker::cpu_time(pid?)?;
        if let Some((since, before)) = last {
            let wall = at.saturating_duration_since(since);
            if !wall.is_zero() {
                let share = used.saturating_sub(before).as_secs_f64() / wall.as_secs_f64();
                if self.with(|app| app.pool.cpu_sampled(id, at, since, share)) == Some(true) {
                    self.changed.notify_waiters();
                }
            }
        }
        Some((at, used))
    }

    /// Reads a worker's memory off the lock, then records it; the pool says
    /// whether the worker must go.
    async fn sample(self: &Arc<Self>, id: WorkerId, probe: MemoryProbe) {
        let Ok(Some(bytes)) = tokio::task::spawn_blocking(move || probe.read()).await else { return };
        self.metrics.worker_memory(id, bytes);
        let retire = self.with(|app| {
            let retire = app.pool.sampled(id, bytes)?;
            app.signal(id, retire);
            Some(retire)
        });
        if let Some(Some(_)) = retire {
            tracing::info!(
                app = %self.settings.name, worker = id, memory_mb = bytes >> 20,
                limit_mb = self.settings.limits.max_memory.unwrap_or(0) >> 20,
                "replacing worker: its memory passed --max-worker-memory"
            );
        }
    }

    fn start_failed(
        self: &Arc<Self>,
        id: WorkerId,
        error: StartError,
        report: Option<oneshot::Sender<Result<(), StartError>>>,
    ) {
        self.metrics.exit(ExitReason::FailedStart);
        let starts = {
            let mut f = self.fleet.lock();
            let now = now();
            if let Some(app) = f.apps.get_mut(&self.key) {
                app.live.remove(&id);
                app.pool.exited(id, now);
            }
            // Before the app was ever ready, the failure goes to whoever started it instead.
            let retry = f.apps.get(&self.key).is_some_and(|a| a.started && !a.closing);
            if retry {
                self.fleet.rebalance(&mut f, now)
            } else {
                Vec::new()
            }
        };
        match report {
            Some(tx) => {
                let _ = tx.send(Err(error));
            }
            None => tracing::error!(app = %self.settings.name, worker = id, error = %error,
                output = ?error.tail(), "worker failed to start"),
        }
        spawn_all(starts);
    }

    fn exited(self: &Arc<Self>, id: WorkerId, pid: Option<u32>, exit: Exit) {
        let (reason, starts) = {
            let mut f = self.fleet.lock();
            let now = now();
            let reason = f.apps.get_mut(&self.key).map(|app| {
                app.live.remove(&id);
                let reason = app.pool.slot(id).and_then(|s| s.retired);
                app.pool.exited(id, now);
                reason
            });
            (reason.flatten(), self.fleet.rebalance(&mut f, now))
        };
        self.metrics.forget_worker(id);
        let status = exit.describe();
        match reason {
            Some(r) if r.gentle() => {
                self.metrics.exit(ExitReason::from(r));
                tracing::info!(app = %self.settings.name, worker = id, pid, status, reason = ExitReason::from(r).as_str(), "worker stopped");
            }
            Some(r) => {
                self.metrics.exit(ExitReason::from(r));
                tracing::warn!(app = %self.settings.name, worker = id, pid, status, reason = ExitReason::from(r).as_str(), "worker exited");
            }
            None => {
                self.metrics.exit(ExitReason::Crashed);
                tracing::warn!(app = %self.settings.name, worker = id, pid, status, "worker exited unexpectedly");
            }
        }
        self.changed.notify_waiters();
        for (sup, start) in starts {
            for new in &start.ids {
                tracing::info!(app = %sup.settings.name, worker = new, replaces = id, "starting worker to replace one that exited");
            }
            sup.spawn_start(start);
        }
    }

    /// The app's background loop, once a second: probes idle workers, stops
    /// drained Shiny workers, prunes unused ones every `check_unused`, and
    /// records a point of the dashboard's history.
    async fn background(self: Arc<Self>) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_prune = now();
        loop {
            tokio::select! {
                _ = self.loops.cancelled() => return,
                _ = tick.tick() => {}
            }
            let now = now();
            let prune = now.duration_since(last_prune) >= self.settings.check_unused;
            if prune {
                last_prune = now;
            }
            let work = self.with(|app| {
                if app.closing {
                    return None;
                }
                let stopped = app.pool.drained(now, DRAIN_QUIET);
                for (id, reason) in &stopped {
                    app.signal(*id, *reason);
                }
                let pruned = if prune { app.pool.prune(now, self.settings.max_age) } else { Vec::new() };
                for id in &pruned {
                    app.signal(*id, Retire::Idle);
                }
                let probes: Vec<(WorkerId, Option<Conn>, Arc<dyn Connect>)> = app
                    .pool
                    .due_for_probe(now, PROBE_IDLE)
                    .into_iter()
                    .filter_map(|id| {
                        let live = app.live.get_mut(&id)?;
                        Some((id, live.conns.pop(), live.connector.clone()))
                    })
                    .collect();
                Some((stopped, pruned, probes, gauges(&app.pool)))
            });
            let Some(Some((stopped, pruned, probes, g))) = work else { continue };
            for (id, _) in stopped {
                tracing::info!(app = %self.settings.name, worker = id, "stopping worker: drained, its last session ended");
            }
            for id in pruned {
                tracing::info!(
                    app = %self.settings.name,
                    worker = id,
                    idle_s = self.settings.max_age.as_secs_f64(),
                    left = g.starting + g.idle + g.busy,
                    "stopping worker: unused for longer than --max-age"
                );
            }
            for (id, conn, connector) in probes {
                tokio::spawn(self.clone().liveness(id, conn, connector));
            }
            self.metrics.tick(&g);
        }
    }

    /// Pings an idle worker; one that does not answer in time is replaced
    /// before any request is sent to it.
    async fn liveness(self: Arc<Self>, id: WorkerId, conn: Option<Conn>, connector: Arc<dyn Connect>) {
        let ping = async {
            let mut conn = match conn {
                Some(c) if !c.is_closed() => c,
                _ => connector.connect(false).await?,
            };
            conn.ping().await?;
            Ok::<Conn, std::io::Error>(conn)
        };
        let answer = tokio::time::timeout(PROBE_DEADLINE, ping).await;
        let mut f = self.fleet.lock();
        let Some(app) = f.apps.get_mut(&self.key) else { return };
        match answer {
            Ok(Ok(conn)) => {
                if let Some(live) = app.live.get_mut(&id) {
                    live.conns.push(conn);
                }
                self.hand_on(app, id, Done::Probed);
            }
            other => {
                let error = match other {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no answer within {}s", PROBE_DEADLINE.as_secs()),
                };
                if app.take_out(id, Retire::Unresponsive) {
                    tracing::warn!(app = %self.settings.name, worker = id, error,
                        "replacing worker: it did not answer a liveness probe while idle");
                }
            }
        }
    }

    /// Changes the app's `n_min` and starts what that calls for.
    pub fn set_n_min(self: &Arc<Self>, n_min: usize) {
        let starts = {
            let mut f = self.fleet.lock();
            let Some(app) = f.apps.get_mut(&self.key) else { return };
            app.pool.set_n_min(n_min);
            self.fleet.grow(&mut f, self.key, now())
        };
        spawn_starts(starts);
    }

    /// Winds this generation down (its app was reloaded or removed): no new
    /// worker, idle ones stop now, busy ones once their request (and those
    /// already queued) are done, Shiny workers once their sessions end; after
    /// `grace`, whatever is left is stopped as at shutdown.
    pub async fn wind_down(self: &Arc<Self>, grace: Duration) {
        let deadline = tokio::time::Instant::now() + grace;
        self.with(|app| {
            for (id, reason) in app.pool.wind_down() {
                app.signal(id, reason);
            }
        });
        self.changed.notify_waiters();
        while self.with(|app| app.pool.processes() > 0) == Some(true) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.shutdown().await;
    }

    /// Stops taking requests, stops every worker and waits until all have
    /// exited (SIGKILL after a grace). Requests still queued get `Unavailable::ShuttingDown`.
    pub async fn shutdown(&self) {
        let waiting = {
            let mut f = self.fleet.lock();
            match f.apps.get_mut(&self.key) {
                Some(app) => {
                    app.closing = true;
                    for id in app.pool.retire_all() {
                        app.signal(id, Retire::Shutdown);
                    }
                    app.pool.drain_waiters()
                }
                None => Vec::new(),
            }
        };
        drop(waiting);
        self.changed.notify_waiters();
        self.loops.cancel();
        self.tasks.close();
        if tokio::time::timeout(KILL_AFTER + Duration::from_secs(2), self.tasks.wait()).await.is_err() {
            tracing::error!(app = %self.settings.name, "some workers did not exit after SIGKILL");
        }
        self.launcher.shutdown().await;
        self.fleet.lock().apps.remove(&self.key);
    }
}

impl Home for Supervisor {
    fn give_back(&self, worker: WorkerId, returned: Returned) {
        let mut f = self.fleet.lock();
        let Some(app) = f.apps.get_mut(&self.key) else { return };
        // Leases hold an `Arc` of their supervisor, so it is alive here.
        let Some(this) = app.sup.upgrade() else { return };
        match returned {
            Returned::Unused(conn) => {
                if let (Some(live), Some(conn)) = (app.live.get_mut(&worker), conn) {
                    live.conns.push(conn);
                }
                this.hand_on(app, worker, Done::Unused);
            }
            Returned::Answered(conn) => {
                if let Some(live) = app.live.get_mut(&worker) {
                    live.conns.extend(conn);
                    live.used.notify_one();
                }
                this.hand_on(app, worker, Done::Completed);
            }
            Returned::Broken(reason) => {
                app.take_out(worker, reason);
                let starts = self.fleet.grow(&mut f, self.key, now());
                drop(f);
                spawn_starts(starts);
            }
            Returned::Abandoned(connector) => {
                drop(f);
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(this.settle(worker, connector));
                }
            }
        }
    }
}

fn gauges(pool: &Pool<Waiter>) -> Gauges {
    Gauges {
        sessions: pool.sessions(),
        starting: pool.count(State::Starting),
        idle: pool.count(State::Idle),
        busy: pool.count(State::Busy) + pool.count(State::Probing),
        draining: pool.count(State::Draining),
        queued: pool.queue_len(),
        n_max: pool.limits().n_max,
    }
}

/// The sticky worker for a request `touch` has counted; if the worker is
/// gone, the count is taken back.
fn sticky_for(sup: &Arc<Supervisor>, app: &mut AppState, id: WorkerId, new: bool, token: u64) -> Option<Sticky> {
    let Some(live) = app.live.get(&id) else {
        app.pool.finished(id, now());
        return None;
    };
    let home = Arc::downgrade(sup);
    let done = Box::new(move || {
        if let Some(sup) = home.upgrade() {
            sup.with(|app| app.pool.finished(id, now()));
        }
    });
    Some(Sticky::new(id, live.connector.clone(), new, token, live.exit.clone(), done))
}

fn spawn_starts(start: Option<(Arc<Supervisor>, Start)>) {
    if let Some((sup, start)) = start {
        sup.spawn_start(start);
    }
}

fn spawn_all(starts: Vec<(Arc<Supervisor>, Start)>) {
    for (sup, start) in starts {
        sup.spawn_start(start);
    }
}
