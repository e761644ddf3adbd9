//! The pool's hands: carries out what `pool::Pool` decides with real worker
//! processes (via `worker`), keeps each worker's idle connections, and hands out
//! `Lease`s. A lease is one worker, busy for one request, until it is dropped.
//!
//! Locking: one `std::sync::Mutex` over the pool and the live workers, held for
//! bookkeeping only and never across an `.await`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::body::ReqBody;
use crate::config::Config;
use crate::metrics::{ExitReason, Gauges, Metrics, Rejection};
use crate::pool::{Limits, Pool, Release, State, WorkerId};
use crate::worker::{self, Conn, Launcher, Spec, StartError, Target};

/// How long a worker gets between SIGTERM and SIGKILL.
const KILL_AFTER: Duration = Duration::from_secs(3);
/// The first and the longest pause before restarting a worker that failed to start.
const BACKOFF_FIRST: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A worker that dies sooner than this after it became ready, before finishing a
/// request, counts as a failed start.
const CRASH_WINDOW: Duration = Duration::from_secs(5);
/// Failed starts further apart than this do not add up to a crash loop.
const FAILURE_MEMORY: Duration = Duration::from_secs(60);

type Waiter = oneshot::Sender<Lease>;

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

/// A worker process valve started and has not yet seen exit.
struct Live {
    target: Target,
    /// When the worker answered its readiness probe.
    ready_at: Option<Instant>,
    /// Why valve took it out of service, if it did.
    stop_reason: Option<ExitReason>,
    socket: Arc<Path>,
    /// Open keep-alive connections to the worker's socket, ready for reuse.
    conns: Vec<Conn>,
}

impl Live {
    /// valve takes the worker out of service: no more connections to it, and a
    /// signal (SIGTERM for a planned stop, SIGKILL for a hung or broken worker).
    /// The first reason given is the one its exit is counted under.
    fn take_out(&mut self, reason: ExitReason) {
        self.conns.clear();
        self.stop_reason.get_or_insert(reason);
        signal_then_kill(self.target, if reason.planned() { libc::SIGTERM } else { libc::SIGKILL });
    }
}

struct Inner {
    pool: Pool<Waiter>,
    live: HashMap<WorkerId, Live>,
    closing: bool,
    ever_ready: bool,
    /// Workers in a row that died before or right after answering, and when
    /// the last did; drives the restart backoff.
    failed_starts: u32,
    last_failure: Option<Instant>,
}

impl Inner {
    fn backoff(&self) -> Duration {
        let recent = self.last_failure.is_some_and(|t| t.elapsed() < FAILURE_MEMORY);
        match self.failed_starts {
            n if n > 0 && recent => BACKOFF_FIRST.saturating_mul(1 << (n - 1).min(16)).min(BACKOFF_MAX),
            _ => Duration::ZERO,
        }
    }

    fn record_failed_start(&mut self) {
        let recent = self.last_failure.is_some_and(|t| t.elapsed() < FAILURE_MEMORY);
        self.failed_starts = if recent { self.failed_starts.saturating_add(1) } else { 1 };
        self.last_failure = Some(Instant::now());
    }
}

pub struct Supervisor {
    launcher: Launcher,
    start_timeout: Duration,
    max_age: Duration,
    check_unused: Duration,
    queue_size: usize,
    queue_timeout: Duration,
    max_worker_memory: Option<u64>,
    pub metrics: Arc<Metrics>,
    max_sessions: usize,
    request_timeout: Option<Duration>,
    /// Woken whenever a worker becomes ready or a session closes (Shiny routing waits on it).
    changed: tokio::sync::Notify,
    inner: Mutex<Inner>,
    tasks: TaskTracker,
}

impl Supervisor {
    /// Must be called inside the tokio runtime. `port` is the port actually bound.
    pub fn new(config: &Config, port: u16) -> std::io::Result<Arc<Self>> {
        let spec = Spec::new(config.r_bin.clone(), config.app.clone(), config.host.clone(), port)?;
        Ok(Arc::new(Supervisor {
            launcher: Launcher::new(spec, config.preload)?,
            start_timeout: config.start_timeout,
            max_age: config.max_age,
            check_unused: config.check_unused,
            queue_size: config.queue_size,
            queue_timeout: config.queue_timeout,
            max_worker_memory: config.max_worker_memory,
            metrics: Arc::new(Metrics::default()),
            max_sessions: config.max_sessions,
            request_timeout: config.request_timeout,
            changed: tokio::sync::Notify::new(),
            inner: Mutex::new(Inner {
                pool: Pool::new(Limits { n_min: config.n_min, n_max: config.n_max, max_requests: config.max_requests }),
                live: HashMap::new(),
                closing: false,
                ever_ready: false,
                failed_starts: 0,
                last_failure: None,
            }),
            tasks: TaskTracker::new(),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the pool half-updated in a
        // way that matters more than stopping valve would, so keep serving.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn gauges(&self) -> Gauges {
        let inner = self.lock();
        counts(&inner.pool)
    }

    /// Whether at least `n_min` workers answer.
    pub fn ready(&self) -> bool {
        let inner = self.lock();
        let answering = inner.pool.count(State::Idle) + inner.pool.count(State::Busy);
        inner.ever_ready && answering >= inner.pool.limits().n_min
    }

    /// Every worker and the queue, for `/__valve__/status`.
    pub fn status(&self) -> serde_json::Value {
        let inner = self.lock();
        let now = Instant::now();
        let workers: Vec<serde_json::Value> = inner
            .pool
            .slots()
            .map(|(id, slot)| {
                let target = inner.live.get(&id).map(|l| l.target).unwrap_or(Target::Unknown);
                serde_json::json!({
                    "id": id,
                    "pid": target.pid(),
                    "state": slot.state.as_str(),
                    "requests": slot.served,
                    "sessions": slot.sessions,
                    "uptime_s": now.duration_since(slot.created).as_secs_f64(),
                    "idle_s": (slot.state == State::Idle).then(|| now.duration_since(slot.last_used).as_secs_f64()),
                    "memory_bytes": target.memory_bytes(),
                    "forked": matches!(target, Target::Fork(_)),
                })
            })
            .collect();
        let g = counts(&inner.pool);
        serde_json::json!({
            "workers": workers,
            "queue": { "waiting": g.queued, "limit": self.queue_size, "timeout_s": self.queue_timeout.as_secs_f64() },
            "pool": { "starting": g.starting, "idle": g.idle, "busy": g.busy, "n_min": inner.pool.limits().n_min, "n_max": g.n_max },
        })
    }

    /// Once a second, records a point of history for the dashboard.
    pub async fn history_loop(self: Arc<Self>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let g = self.gauges();
            self.metrics.tick(g.queued, g.busy, g.idle);
        }
    }

    /// Starts `n_min` workers and waits until all of them answer. The first
    /// failure is returned (with R's output); nothing is restarted before the
    /// pool has been ready once.
    pub async fn start(self: &Arc<Self>) -> Result<(), StartError> {
        let ids = self.lock().pool.fill_to_min(Instant::now());
        let mut reports = Vec::new();
        for id in ids {
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
        self.lock().ever_ready = true;
        Ok(())
    }

    /// Takes a worker for one request: an idle one now, or the first to come free.
    pub async fn acquire(self: &Arc<Self>) -> Result<Lease, Unavailable> {
        let (rx, spawn) = {
            let mut inner = self.lock();
            if inner.closing {
                return Err(Unavailable::ShuttingDown);
            }
            if let Some(id) = inner.pool.checkout() {
                self.metrics.queue_wait.observe(Duration::ZERO);
                return Ok(self.lease(&mut inner, id));
            }
            if inner.pool.queue_len() >= self.queue_size {
                // Clients that gave up while waiting still hold places: free them first.
                inner.pool.retain_waiters(|w| !w.is_closed());
                if inner.pool.queue_len() >= self.queue_size {
                    self.metrics.reject(Rejection::QueueFull);
                    return Err(Unavailable::QueueFull);
                }
            }
            let (tx, rx) = oneshot::channel();
            let spawn = inner.pool.enqueue(tx, Instant::now());
            let spawn = spawn.map(|id| (id, inner.backoff(), counts(&inner.pool)));
            (rx, spawn)
        };
        if let Some((id, delay, c)) = spawn {
            tracing::info!(
                worker = id,
                queued = c.queued,
                live = c.starting + c.idle + c.busy,
                n_max = c.n_max,
                "starting worker: requests are waiting and the pool has room"
            );
            self.spawn_worker(id, delay, None);
        }
        let queued = Instant::now();
        let result = match tokio::time::timeout(self.queue_timeout, rx).await {
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

    fn lease(self: &Arc<Self>, inner: &mut Inner, id: WorkerId) -> Lease {
        let (conn, socket) = match inner.live.get_mut(&id) {
            Some(live) => (live.conns.pop(), Some(live.socket.clone())),
            None => (None, None),
        };
        Lease {
            sup: self.clone(),
            worker: id,
            socket,
            conn,
            reusable: false,
            armed: true,
            waited: Duration::ZERO,
            in_flight: false,
        }
    }

    /// The Shiny worker for a request: the browser's own (`wanted`, from its
    /// sticky cookie) while it lives, else the ready worker with the fewest
    /// sessions below --max-sessions, starting one when all are full.
    pub async fn session_worker(self: &Arc<Self>, wanted: Option<WorkerId>) -> Result<Sticky, Unavailable> {
        let deadline = tokio::time::Instant::now() + self.queue_timeout;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let spawn = {
                let mut inner = self.lock();
                if inner.closing {
                    return Err(Unavailable::ShuttingDown);
                }
                let now = Instant::now();
                if let Some(id) = wanted.filter(|id| inner.pool.touch(*id, now)) {
                    if let Some(live) = inner.live.get(&id) {
                        return Ok(Sticky { worker: id, socket: live.socket.clone(), new: false });
                    }
                }
                match inner.pool.pick_for_session(self.max_sessions, now) {
                    Ok(id) => {
                        inner.pool.touch(id, now);
                        if let Some(live) = inner.live.get(&id) {
                            return Ok(Sticky { worker: id, socket: live.socket.clone(), new: true });
                        }
                        None
                    }
                    Err(spawn) => spawn.map(|id| (id, inner.backoff())),
                }
            };
            if let Some((id, delay)) = spawn {
                tracing::info!(
                    worker = id,
                    max_sessions = self.max_sessions,
                    "starting worker: every worker holds --max-sessions sessions"
                );
                self.spawn_worker(id, delay, None);
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                self.metrics.reject(Rejection::QueueTimeout);
                return Err(Unavailable::QueueTimeout);
            }
        }
    }

    /// A Shiny session's WebSocket opened (`true`) or closed on a worker.
    pub fn session(&self, id: WorkerId, open: bool) {
        let mut inner = self.lock();
        if open {
            inner.pool.session_opened(id, Instant::now());
            self.metrics.session_opened();
        } else {
            inner.pool.session_closed(id, Instant::now());
            drop(inner);
            self.changed.notify_waiters();
        }
    }

    /// Returns a worker after a request, with its connection if that can be reused,
    /// and passes it on to the first waiter still waiting.
    fn release(self: &Arc<Self>, id: WorkerId, conn: Option<Conn>) {
        let mut inner = self.lock();
        let Some(live) = inner.live.get_mut(&id) else { return };
        if let Some(conn) = conn {
            live.conns.push(conn);
        }
        if let (Some(max), Some(used)) =
            (self.max_worker_memory, self.max_worker_memory.and_then(|_| live.target.memory_bytes()))
        {
            if used > max {
                let pid = live.target.pid();
                drop(inner);
                tracing::info!(
                    worker = id,
                    pid,
                    memory_mb = used >> 20,
                    limit_mb = max >> 20,
                    "replacing worker: its memory passed --max-worker-memory"
                );
                return self.retire(id, ExitReason::Memory);
            }
        }
        self.hand_on(&mut inner, id);
    }

    /// Waits until a worker whose client left mid-request has finished that
    /// request, then returns it to the pool. R answers one call at a time, so
    /// a readiness probe on a fresh connection is answered only after the
    /// abandoned request: the probe is the barrier. A worker that does not
    /// answer within --request-timeout is killed.
    async fn settle(self: Arc<Self>, id: WorkerId, socket: Option<Arc<Path>>) {
        let probe = async {
            let socket = socket.ok_or_else(|| std::io::Error::other("worker is gone"))?;
            worker::probe(&socket).await
        };
        let settled = match self.request_timeout {
            Some(limit) => {
                tokio::time::timeout(limit, probe).await.unwrap_or_else(|_| Err(std::io::Error::other("timed out")))
            }
            None => probe.await,
        };
        match settled {
            Ok((conn, _)) => self.release(id, Some(conn)),
            Err(e) => {
                tracing::warn!(worker = id, error = %e, "worker did not finish an abandoned request; replacing it");
                self.retire(id, ExitReason::Timeout);
                self.release(id, None);
            }
        }
    }

    /// Takes a worker out of service now and starts its replacement. A planned
    /// retirement (too big) gets SIGTERM; a hung or broken worker SIGKILL.
    pub fn retire(self: &Arc<Self>, id: WorkerId, reason: ExitReason) {
        let mut inner = self.lock();
        let respawn = inner.pool.retire(id, Instant::now());
        if let Some(live) = inner.live.get_mut(&id) {
            live.take_out(reason);
        }
        let delay = inner.backoff();
        drop(inner);
        for new in respawn {
            tracing::info!(worker = new, replaces = id, "starting worker to replace one taken out of service");
            self.spawn_worker(new, delay, None);
        }
    }

    fn hand_on(self: &Arc<Self>, inner: &mut Inner, id: WorkerId) {
        loop {
            match inner.pool.release(id, Instant::now()) {
                Release::Handoff(waiter) => {
                    let lease = self.lease(inner, id);
                    match waiter.send(lease) {
                        Ok(()) => return,
                        // That client left while it waited: put the connection back, try the next.
                        Err(lease) => {
                            if let (Some(live), Some(conn)) = (inner.live.get_mut(&id), lease.disarm()) {
                                live.conns.push(conn);
                            }
                        }
                    }
                }
                Release::Retire(respawn) => {
                    if let Some(live) = inner.live.get_mut(&id) {
                        live.take_out(ExitReason::Recycled);
                        tracing::info!(
                            worker = id,
                            pid = live.target.pid(),
                            "replacing worker: it served --max-requests requests"
                        );
                    }
                    let delay = inner.backoff();
                    for new in respawn {
                        self.spawn_worker(new, delay, None);
                    }
                    return;
                }
                Release::Idle | Release::Gone => return,
            }
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
                worker = id,
                delay_ms = delay.as_millis() as u64,
                "a worker failed to start or died soon after starting; waiting before the next start"
            );
            tokio::time::sleep(delay).await;
        }
        if self.lock().closing {
            return;
        }
        let launched = Instant::now();
        let mut process = match self.launcher.launch(id).await {
            Ok(p) => p,
            Err(e) => return self.start_failed(id, e, report),
        };
        {
            let mut inner = self.lock();
            let socket: Arc<Path> = Arc::from(process.socket.as_path());
            let live = Live { target: process.target, ready_at: None, stop_reason: None, socket, conns: Vec::new() };
            inner.live.insert(id, live);
            if inner.closing {
                process.target.signal(libc::SIGTERM);
            }
        }
        match process.wait_ready(self.start_timeout).await {
            Ok(conn) => {
                let pid = process.target.pid();
                self.metrics.spawn_duration.observe(launched.elapsed());
                tracing::info!(worker = id, pid, startup_ms = launched.elapsed().as_millis() as u64, "worker ready");
                let mut inner = self.lock();
                if let Some(live) = inner.live.get_mut(&id) {
                    live.conns.push(conn);
                    live.ready_at = Some(Instant::now());
                    live.target = process.target;
                    if live.stop_reason.is_some() {
                        // Asked to stop while it was still starting.
                        process.target.signal(libc::SIGTERM);
                    }
                }
                self.hand_on(&mut inner, id);
                drop(inner);
                self.changed.notify_waiters();
                if let Some(tx) = report {
                    let _ = tx.send(Ok(()));
                }
            }
            Err(e) => {
                process.target.signal(libc::SIGKILL);
                process.wait().await;
                return self.start_failed(id, e, report);
            }
        }
        let status = process.wait().await;
        if let Target::Group(_) = process.target {
            // Anything the worker started in its group goes with it.
            process.target.signal(libc::SIGKILL);
        }
        self.exited(id, process.target.pid().unwrap_or_default(), &status);
    }

    fn start_failed(
        self: &Arc<Self>,
        id: WorkerId,
        error: StartError,
        report: Option<oneshot::Sender<Result<(), StartError>>>,
    ) {
        self.metrics.exit(ExitReason::FailedStart);
        let mut inner = self.lock();
        inner.live.remove(&id);
        inner.record_failed_start();
        let respawn = if inner.ever_ready && !inner.closing {
            inner.pool.exited(id, Instant::now())
        } else {
            inner.pool.exited(id, Instant::now());
            Vec::new()
        };
        let delay = inner.backoff();
        drop(inner);
        match report {
            Some(tx) => {
                let _ = tx.send(Err(error));
            }
            None => {
                tracing::error!(worker = id, error = %error, output = ?error.tail(), "worker failed to start")
            }
        }
        for id in respawn {
            self.spawn_worker(id, delay, None);
        }
    }

    fn exited(self: &Arc<Self>, id: WorkerId, pid: u32, status: &str) {
        let mut inner = self.lock();
        let live = inner.live.remove(&id);
        let reason = live.as_ref().and_then(|l| l.stop_reason).unwrap_or(ExitReason::Crashed);
        self.metrics.exit(reason);
        let planned = reason.planned();
        // A worker that dies soon after it became ready, before it ever finished a
        // request, counts as a failed start; one that served is simply replaced.
        let proven = inner.pool.slot(id).is_some_and(|s| s.proven);
        if !planned && !proven && live.and_then(|l| l.ready_at).is_some_and(|t| t.elapsed() < CRASH_WINDOW) {
            inner.record_failed_start();
        }
        let respawn = inner.pool.exited(id, Instant::now());
        let respawn = if inner.closing { Vec::new() } else { respawn };
        let delay = inner.backoff();
        drop(inner);
        if planned {
            tracing::info!(worker = id, pid, status, reason = reason.as_str(), "worker stopped");
        } else if reason == ExitReason::Crashed {
            tracing::warn!(worker = id, pid, status, "worker exited unexpectedly");
        } else {
            tracing::warn!(worker = id, pid, status, reason = reason.as_str(), "worker exited unexpectedly");
        }
        for new in respawn {
            tracing::info!(worker = new, replaces = id, "starting worker to replace one that exited");
            self.spawn_worker(new, delay, None);
        }
    }

    /// Asks one worker to stop: SIGTERM to its group now, SIGKILL if it lingers.
    fn stop(&self, inner: &mut Inner, id: WorkerId, reason: ExitReason) {
        inner.pool.stop(id);
        if let Some(live) = inner.live.get_mut(&id) {
            live.take_out(reason);
        }
    }

    /// Every `check_unused`, stops workers idle for longer than `max_age`, keeping `n_min`.
    pub async fn prune_loop(self: Arc<Self>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.check_unused);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let mut inner = self.lock();
            let stale = inner.pool.prune(Instant::now(), self.max_age);
            for id in &stale {
                self.stop(&mut inner, *id, ExitReason::Idle);
            }
            let c = counts(&inner.pool);
            drop(inner);
            for id in stale {
                tracing::info!(
                    worker = id,
                    idle_s = self.max_age.as_secs_f64(),
                    left = c.starting + c.idle + c.busy,
                    "stopping worker: unused for longer than --max-age"
                );
            }
        }
    }

    /// Stops every worker and waits until all have exited (SIGKILL after a grace).
    /// Requests still queued get `Unavailable::ShuttingDown`.
    pub async fn shutdown(&self) {
        let waiting = {
            let mut inner = self.lock();
            inner.closing = true;
            let waiting = inner.pool.drain_waiters();
            for id in inner.pool.stop_all() {
                self.stop(&mut inner, id, ExitReason::Shutdown);
            }
            waiting
        };
        drop(waiting);
        self.tasks.close();
        if tokio::time::timeout(KILL_AFTER + Duration::from_secs(2), self.tasks.wait()).await.is_err() {
            tracing::error!("some workers did not exit after SIGKILL");
        }
        self.launcher.shutdown().await;
    }
}

/// Sends `signal` now and SIGKILL after `KILL_AFTER`, for whatever ignored it.
fn signal_then_kill(target: Target, signal: libc::c_int) {
    target.signal(signal);
    if signal != libc::SIGKILL {
        tokio::spawn(async move {
            tokio::time::sleep(KILL_AFTER).await;
            target.signal(libc::SIGKILL);
        });
    }
}

fn counts<W>(pool: &Pool<W>) -> Gauges {
    Gauges {
        sessions: pool.sessions(),
        starting: pool.count(State::Starting),
        idle: pool.count(State::Idle),
        busy: pool.count(State::Busy),
        queued: pool.queue_len(),
        n_max: pool.limits().n_max,
    }
}

/// One worker, busy for one request. Dropping the lease returns the worker to
/// the pool; its connection is kept only if the response was read to the end.
pub struct Lease {
    sup: Arc<Supervisor>,
    worker: WorkerId,
    socket: Option<Arc<Path>>,
    conn: Option<Conn>,
    reusable: bool,
    armed: bool,
    waited: Duration,
    /// A request was sent and its answer's head has not come back yet.
    in_flight: bool,
}

/// The worker a Shiny request goes to.
pub struct Sticky {
    pub worker: WorkerId,
    pub socket: Arc<Path>,
    /// The browser had no (live) worker yet: tell it its new one.
    pub new: bool,
}

/// Why a request could not be passed to a worker.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("cannot connect to worker {0}: {1}")]
    Connect(WorkerId, std::io::Error),
    #[error("worker {0} failed to answer: {1}")]
    Http(WorkerId, hyper::Error),
    #[error("worker {0} took longer than --request-timeout ({1:?})")]
    Timeout(WorkerId, Duration),
}

impl Lease {
    pub fn worker(&self) -> WorkerId {
        self.worker
    }

    /// Makes sure the lease holds a ready connection: the kept one, or a fresh one.
    /// Nothing has been sent when this fails, so the request may go elsewhere.
    pub async fn connect(&mut self) -> Result<(), SendError> {
        if let Some(conn) = self.conn.as_mut() {
            if conn.ready().await.is_ok() {
                return Ok(());
            }
        }
        self.conn = None;
        let socket = self
            .socket
            .clone()
            .ok_or_else(|| SendError::Connect(self.worker, std::io::Error::other("worker is gone")))?;
        let mut conn = worker::connect(&socket, false).await.map_err(|e| SendError::Connect(self.worker, e))?;
        conn.ready().await.map_err(|e| SendError::Connect(self.worker, std::io::Error::other(e)))?;
        self.conn = Some(conn);
        Ok(())
    }

    /// Sends a request on the connection `connect` made ready.
    pub async fn send(&mut self, req: http::Request<ReqBody>) -> Result<http::Response<Incoming>, SendError> {
        self.reusable = false;
        let conn = self
            .conn
            .as_mut()
            .ok_or_else(|| SendError::Connect(self.worker, std::io::Error::other("not connected")))?;
        self.in_flight = true;
        let answer = conn.send_request(req).await.map_err(|e| SendError::Http(self.worker, e));
        self.in_flight = false;
        answer
    }

    /// Takes this lease's worker out of service (see `Supervisor::retire`).
    pub fn retire(&mut self, reason: ExitReason) {
        self.in_flight = false;
        self.sup.retire(self.worker, reason);
    }

    /// How long the request waited in the queue for this worker.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// The response was read to its end: the connection can serve the next request.
    pub fn set_reusable(&mut self) {
        self.reusable = true;
    }

    fn disarm(mut self) -> Option<Conn> {
        self.armed = false;
        self.conn.take()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if self.in_flight {
            // The client left while R works on its request: the worker stays
            // busy until R is done, then goes back to the pool.
            let (sup, worker, socket) = (self.sup.clone(), self.worker, self.socket.clone());
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move { sup.settle(worker, socket).await });
            }
            return;
        }
        let conn = if self.reusable { self.conn.take() } else { None };
        self.sup.release(self.worker, conn);
    }
}
