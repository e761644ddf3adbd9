//! An app's life: starting its `n_min` workers, its background loop (the
//! pool fed the time once a second, and the dashboard's history), changing
//! `n_min`, winding a generation down after a reload, shutting down.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use super::after::After;
use super::{now, status, Supervisor, KILL_AFTER};
use crate::app::pool::Event;
use crate::worker::StartError;

/// How often the app's background loop runs.
const TICK: Duration = Duration::from_secs(1);

impl Supervisor {
    /// Prepares the generation (a prerendered document's one render), starts
    /// `n_min` workers and waits until all of them answer. The first failure
    /// is returned (with R's output); nothing is restarted before the app has
    /// been ready once.
    pub async fn start(self: &Arc<Self>) -> Result<(), StartError> {
        self.launcher.prepare().await?;
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

    /// Grows the app as far as its pool wants and the budget allows (the
    /// pool asked: a worker past a limit waits for its replacement).
    pub(super) fn grow_now(self: &Arc<Self>) {
        if let Some((_, after)) = self.with_growth(|_, _| ()) {
            after.run();
        }
    }

    /// Changes the app's `n_min` and starts what that calls for.
    pub fn set_n_min(self: &Arc<Self>, n_min: usize) {
        if let Some((_, after)) = self.with_growth(|app, _| app.pool.set_n_min(n_min)) {
            after.run();
        }
    }

    /// A reload: `next` serves this app from now on. Browsers still waiting
    /// here for a place go to it (`Unavailable::Replaced`). Call before
    /// `wind_down`.
    pub fn replaced_by(&self, next: &Arc<Supervisor>) {
        let _ = self.successor.set(Arc::downgrade(next));
    }

    /// The generation that replaced this one, while it runs.
    pub fn successor(&self) -> Option<Arc<Supervisor>> {
        self.successor.get().and_then(std::sync::Weak::upgrade)
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
    pub(super) async fn background(self: Arc<Self>) {
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
                // Requests waiting for a place in the budget: another app's
                // worker may have become spare by time alone (a Shiny page
                // whose browser never opened its session), with no event.
                // (Before the tick, which may start probing idle workers; and
                // only once `start` has started n_min, which it waits for.)
                if f.apps.get(&self.key).is_some_and(|a| a.started && !a.closing && a.pool.wants() > 0) {
                    self.fleet.grow(&mut f, self.key, now, &mut after);
                }
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
