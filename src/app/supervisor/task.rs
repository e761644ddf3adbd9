//! One worker's task, from start to exit: wait out the crash-loop backoff,
//! launch (through `worker::Launch`), wait until it answers, hand it to the
//! pool, then watch it (`worker::watch`) until it exits, and report the exit.
//! The task owns the worker's process: only it signals it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch, Notify};

use super::after::After;
use super::{now, Live, Supervisor};
use crate::app::pool::{Event, Start, State, WorkerId};
use crate::metrics::ExitReason;
use crate::worker::watch::{serve, Observer, Watch};
use crate::worker::{Exit, StartError, Stop};

/// How often a Shiny worker's CPU is sampled (when --busy-threshold is not 0).
const CPU_SAMPLE_EVERY: Duration = Duration::from_millis(250);

type Report = oneshot::Sender<Result<(), StartError>>;

impl Supervisor {
    pub(super) fn spawn_start(self: &Arc<Self>, start: Start) {
        for id in start.ids {
            self.spawn_worker(id, start.delay, None);
        }
    }

    pub(super) fn spawn_worker(self: &Arc<Self>, id: WorkerId, delay: Duration, report: Option<Report>) {
        let this = self.clone();
        self.tasks.spawn(async move { this.run_worker(id, delay, report).await });
    }

    /// One worker's whole life: launch, wait until it answers, serve, exit.
    async fn run_worker(self: Arc<Self>, id: WorkerId, delay: Duration, report: Option<Report>) {
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
            if stopping {
                let _ = stop_tx.send(Some(Stop::Term));
            }
            app.live.insert(
                id,
                Live {
                    stop: stop_tx,
                    exit: exit_rx,
                    connector: launched.connector.clone(),
                    conns: Vec::new(),
                    pid: process.pid(),
                    forked: false,
                    started_by: "",
                    used: used.clone(),
                },
            );
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
                let startup = now().saturating_duration_since(launched_at);
                let started_by = process.started_by();
                self.metrics.spawn_duration.observe(startup);
                self.metrics.started(started_by, startup);
                tracing::info!(app = %self.settings.name, worker = id, pid,
                    startup_ms = startup.as_millis() as u64, started_by, "worker ready");
                let mut after = After::default();
                {
                    let mut f = self.fleet.lock();
                    if let Some(app) = f.apps.get_mut(&self.key) {
                        if let Some(live) = app.live.get_mut(&id) {
                            live.pid = pid;
                            live.forked = memory.is_some_and(|m| m.private_only);
                            live.started_by = started_by;
                            live.conns.push(conn);
                        }
                        self.feed(app, Event::Ready(id), &mut after);
                    }
                }
                after.run();
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

        let limits = self.settings.limits;
        let watching = Watch {
            worker: id,
            stops: stop_rx,
            used,
            memory,
            memory_after_use: limits.max_memory.is_some(),
            memory_every: self.settings.check_unused,
            cpu_every: (limits.busy_threshold > 0.0).then_some(CPU_SAMPLE_EVERY),
        };
        let exit = serve(process.as_mut(), watching, &self).await;
        let _ = exit_tx.send(Some(exit.clone()));
        self.exited(id, process.pid(), exit);
    }

    fn start_failed(self: &Arc<Self>, id: WorkerId, error: StartError, report: Option<Report>) {
        self.metrics.exit(ExitReason::FailedStart);
        let mut after = After::default();
        {
            let mut f = self.fleet.lock();
            let now = now();
            if let Some(app) = f.apps.get_mut(&self.key) {
                app.live.remove(&id);
                self.feed(app, Event::Exited(id), &mut after);
            }
            // Before the app was ever ready, the failure goes to whoever started it instead.
            let retry = f.apps.get(&self.key).is_some_and(|a| a.started && !a.closing);
            if retry {
                self.fleet.rebalance(&mut f, now, &mut after);
            }
        }
        match report {
            Some(tx) => {
                let _ = tx.send(Err(error));
            }
            None => tracing::error!(app = %self.settings.name, worker = id, error = %error,
                output = ?error.tail(), "worker failed to start"),
        }
        after.run();
    }

    fn exited(self: &Arc<Self>, id: WorkerId, pid: Option<u32>, exit: Exit) {
        let mut after = After::default();
        let reason = {
            let mut f = self.fleet.lock();
            let now = now();
            let reason = f.apps.get_mut(&self.key).and_then(|app| {
                app.live.remove(&id);
                let reason = app.pool.slot(id).and_then(|s| s.retired);
                self.feed(app, Event::Exited(id), &mut after);
                reason
            });
            self.fleet.rebalance(&mut f, now, &mut after);
            reason
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
        for (sup, start) in &after.starts {
            for new in &start.ids {
                tracing::info!(app = %sup.settings.name, worker = new, replaces = id, "starting worker to replace one that exited");
            }
        }
        after.run();
    }
}

/// The worker's samples go to the pool, which says what they mean.
impl Observer for Arc<Supervisor> {
    fn memory(&self, worker: WorkerId, bytes: u64) {
        self.metrics.worker_memory(worker, bytes);
        self.feed_now(Event::Memory(worker, bytes));
    }

    fn cpu(&self, worker: WorkerId, since: tokio::time::Instant, _at: tokio::time::Instant, share: f64) {
        let since: Instant = since.into_std();
        self.feed_now(Event::Cpu { worker, since, share });
    }
}
