//! The pool's hands, one `Supervisor` per app generation: hands out
//! `Lease`s (plumber) and `Sticky` workers (Shiny), runs the app's
//! background loop, starts and stops the app. Its rooms:
//!
//! - this file: the supervisor's interface to the forwarder, the reloader
//!   and the admin pages, and the app's background loop;
//! - `fleet`: the one lock over every app's pool and live workers, and
//!   growth within the worker budget;
//! - `execute`: the executor, which feeds the pool events and carries out
//!   the effects it returns (nothing else here decides), liveness probes and
//!   settling abandoned requests;
//! - `task`: one worker's task, from launch to exit (its process is watched
//!   by `worker::watch`);
//! - `status`: status, gauges, readiness.
//!
//! Every time here comes from tokio's clock, so that tests on a paused clock
//! reach every timer (probes, pruning, backoff, draining, settling).

mod execute;
mod fleet;
mod status;
mod task;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, Notify};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::execute::After;
use self::fleet::{AppKey, AppState};
use super::lease::Lease;
use super::pool::{Event, Limits, Pool, WorkerId, BUSY_PATIENCE};
use super::sticky::Sticky;
use crate::metrics::{AppMetrics, Rejection};
use crate::worker::{Launch, StartError};

pub use self::execute::{DRAIN_QUIET, SETTLE_MAX};
pub use self::fleet::Fleet;
pub use self::status::{Status, WorkerStatus};
pub use crate::worker::watch::KILL_AFTER;

/// How often the app's background loop runs.
const TICK: Duration = Duration::from_secs(1);

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

    /// Runs `f` on this app's state under the fleet's lock, then grows the
    /// app as far as the budget allows, and carries out what follows once
    /// the lock is released. Returns what `f` returned and the workers started.
    fn with_growth<T>(self: &Arc<Self>, f: impl FnOnce(&mut AppState, &mut After) -> T) -> Option<(T, After)> {
        let mut after = After::default();
        let mut fleet = self.fleet.lock();
        let app = fleet.apps.get_mut(&self.key)?;
        let out = f(app, &mut after);
        self.fleet.grow(&mut fleet, self.key, now(), &mut after);
        Some((out, after))
    }

    /// Whether worker `id` is this app's and still serves its sessions (not
    /// stopping): a browser on an older generation stays there only while its
    /// worker does, and otherwise goes to the current one (a winding-down
    /// generation starts no worker for it).
    pub fn keeps(&self, id: WorkerId) -> bool {
        self.with(|app| app.pool.slot(id).is_some_and(|s| s.state != super::State::Stopping)).unwrap_or(false)
    }

    /// Starts `n_min` workers and waits until all of them answer. The first
    /// failure is returned (with R's output); nothing is restarted before the
    /// app has been ready once.
    pub async fn start(self: &Arc<Self>) -> Result<(), StartError> {
        let ids = match self.with_growth(|_, _| ()) {
            Some((_, after)) => after.starts.into_iter().flat_map(|(_, s)| s.ids).collect(),
            None => Vec::new(),
        };
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
        self.with(|app| app.started = true);
        Ok(())
    }

    /// Takes a worker for one request: an idle one now, or the first to come free.
    pub async fn lease(self: &Arc<Self>) -> Result<Lease, Unavailable> {
        let rx = {
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
            let mut after = After::default();
            self.fleet.grow(&mut f, self.key, now(), &mut after);
            drop(f);
            if let Some((_, start)) = after.starts.first() {
                let g = self.gauges();
                tracing::info!(
                    app = %self.settings.name,
                    workers = ?start.ids,
                    queued = g.queued,
                    live = g.starting + g.idle + g.busy,
                    n_max = g.n_max,
                    "starting worker: requests are waiting and the pool has room"
                );
            }
            after.run();
            rx
        };
        let queued = now();
        let result = match tokio::time::timeout(self.settings.queue_timeout, rx).await {
            Ok(Ok(mut lease)) => {
                lease.waited = now().saturating_duration_since(queued);
                Ok(lease)
            }
            Ok(Err(_)) => Err(Unavailable::ShuttingDown),
            Err(_) => Err(Unavailable::QueueTimeout),
        };
        self.metrics.queue_wait.observe(now().saturating_duration_since(queued));
        match &result {
            Err(Unavailable::QueueTimeout) => self.metrics.reject(Rejection::QueueTimeout),
            Err(Unavailable::ShuttingDown) => self.metrics.reject(Rejection::ShuttingDown),
            _ => {}
        }
        result
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
            let mut after = After::default();
            let seen = {
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
                self.fleet.grow(&mut f, self.key, now, &mut after);
                seen
            };
            if let Some((_, start)) = after.starts.first() {
                tracing::info!(
                    app = %self.settings.name,
                    workers = ?start.ids,
                    seen = ?seen,
                    wanted = ?wanted.map(|w| w.0),
                    max_sessions = self.settings.limits.max_sessions,
                    "starting worker: a new browser finds every worker busy or holding --max-sessions sessions"
                );
            }
            after.run();
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
    pub fn session(self: &Arc<Self>, id: WorkerId, open: bool, token: Option<u64>) {
        if open {
            let now = now();
            self.with(|app| app.pool.session_opened(id, now, token));
            self.metrics.session_opened();
        } else {
            self.feed_now(Event::SessionClosed(id));
        }
    }

    /// Takes a worker out of service now (a Shiny worker that broke or hung).
    pub fn retire(self: &Arc<Self>, id: WorkerId, reason: super::Retire) {
        if let Some((_, after)) = self.with_growth(|app, after| self.feed(app, Event::Retire(id, reason), after)) {
            after.run();
        }
    }

    /// Changes the app's `n_min` and starts what that calls for.
    pub fn set_n_min(self: &Arc<Self>, n_min: usize) {
        if let Some((_, after)) = self.with_growth(|app, _| app.pool.set_n_min(n_min)) {
            after.run();
        }
    }

    /// Winds this generation down (its app was reloaded or removed): no new
    /// worker, idle ones stop now, busy ones once their request (and those
    /// already queued) are done, Shiny workers once their sessions end; after
    /// `grace`, whatever is left is stopped as at shutdown.
    pub async fn wind_down(self: &Arc<Self>, grace: Duration) {
        let deadline = tokio::time::Instant::now() + grace;
        self.feed_now(Event::WindDown);
        loop {
            // Every exit wakes `changed`: wait for the last one, or the deadline.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.with(|app| app.pool.processes() > 0) != Some(true) {
                break;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                break;
            }
        }
        self.shutdown().await;
    }

    /// Stops taking requests, stops every worker and waits until all have
    /// exited (SIGKILL after a grace). Requests still queued get `Unavailable::ShuttingDown`.
    pub async fn shutdown(&self) {
        let mut after = After::default();
        {
            let mut f = self.fleet.lock();
            if let Some(app) = f.apps.get_mut(&self.key) {
                app.closing = true;
                if let Some(this) = app.sup.upgrade() {
                    this.feed(app, Event::Close, &mut after);
                }
            }
        }
        after.run();
        self.changed.notify_waiters();
        self.loops.cancel();
        self.tasks.close();
        if tokio::time::timeout(KILL_AFTER + Duration::from_secs(2), self.tasks.wait()).await.is_err() {
            tracing::error!(app = %self.settings.name, "some workers did not exit after SIGKILL");
        }
        self.launcher.shutdown().await;
        self.fleet.lock().apps.remove(&self.key);
    }

    /// The app's background loop, once a second: feeds the pool the time
    /// (it probes idle workers, stops drained Shiny workers, prunes unused
    /// ones every `check_unused`) and records a point of the dashboard's history.
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
            let mut after = After::default();
            let gauges = {
                let mut f = self.fleet.lock();
                match f.apps.get_mut(&self.key) {
                    Some(app) if !app.closing => {
                        self.feed(app, Event::Tick { prune }, &mut after);
                        Some(status::gauges(&app.pool))
                    }
                    _ => None,
                }
            };
            after.run();
            if let Some(g) = gauges {
                self.metrics.tick(&g);
            }
        }
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
