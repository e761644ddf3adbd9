//! The executor: feeds the pool what happened and carries out the effects it
//! returns, and nothing else in the supervisor decides. Under the fleet's
//! lock it does bookkeeping only (signals through each worker's stop
//! channel, hand-overs, log lines); what must wait for the lock to be
//! released (starting workers, liveness probes, waking browsers, turning
//! waiters away) goes into an `After`.
//!
//! Also here: what happens to the effects' results (a probe answered or
//! not, an abandoned request settled or not), fed back as events.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use super::after::{After, Probe};
use super::{now, AppState, Supervisor, Waiter};
use crate::app::lease::{Home, Lease, Returned};
use crate::app::pool::{Effect, Event, Note, Timers, WorkerId};
use crate::app::Retire;
use crate::worker::{Conn, Connect, Exit, Stop};

/// Idle workers unused this long get a liveness probe, which must answer within `PROBE_DEADLINE`.
pub(super) const PROBE_IDLE: Duration = Duration::from_secs(1);
pub(super) const PROBE_DEADLINE: Duration = Duration::from_secs(3);
/// A draining Shiny worker with no session left stops after this long without traffic.
pub const DRAIN_QUIET: Duration = Duration::from_secs(5);
/// The longest a worker may take to finish a request its client abandoned
/// when `--request-timeout` is 0 (no limit on requests): past it the worker
/// is replaced, so that a hung R cannot hold a place in the pool for ever.
pub const SETTLE_MAX: Duration = Duration::from_secs(600);

impl Supervisor {
    /// The timers the pool's rules run on.
    pub(super) fn timers(&self) -> Timers {
        Timers { probe_idle: PROBE_IDLE, drain_quiet: DRAIN_QUIET, max_age: self.settings.max_age }
    }

    /// Feeds the pool `event` and carries out every effect, and those of the
    /// events they lead to (a hand-over to a waiter that just left gives the
    /// worker back). Called with the lock held. Returns whether the pool asked
    /// for anything.
    pub(super) fn feed(self: &Arc<Self>, app: &mut AppState, event: Event, after: &mut After) -> bool {
        let timers = self.timers();
        let mut events = VecDeque::from([event]);
        let mut acted = false;
        while let Some(event) = events.pop_front() {
            for effect in app.pool.handle(now(), event, &timers, |w| !w.is_closed()) {
                acted = true;
                self.execute(app, effect, &mut events, after);
            }
        }
        acted
    }

    fn execute(
        self: &Arc<Self>,
        app: &mut AppState,
        effect: Effect<Waiter>,
        events: &mut VecDeque<Event>,
        after: &mut After,
    ) {
        match effect {
            Effect::Retire { worker, reason, note } => {
                if let Some(live) = app.live.get_mut(&worker) {
                    live.conns.clear();
                    let _ = live.stop.send(Some(if reason.gentle() { Stop::Term } else { Stop::Kill }));
                }
                self.log_retired(app, worker, reason, note);
            }
            Effect::Hand { worker, waiter } => {
                let lease = self.lease_for(app, worker);
                if let Err(lease) = waiter.send(lease) {
                    // That client left just now: take the worker back without
                    // giving it back through the lock we hold.
                    if let (Some(live), Some(conn)) = (app.live.get_mut(&worker), lease.disarm()) {
                        live.conns.push(conn);
                    }
                    events.push_back(Event::Unused(worker));
                }
            }
            Effect::Probe(worker) => {
                if let Some(live) = app.live.get_mut(&worker) {
                    after.probes.push(Probe {
                        sup: self.clone(),
                        worker,
                        conn: live.conns.pop(),
                        connector: live.connector.clone(),
                    });
                }
            }
            Effect::Wake => {
                if !after.wake.iter().any(|s| Arc::ptr_eq(s, self)) {
                    after.wake.push(self.clone());
                }
            }
            Effect::Dismiss(waiter) => after.dismissed.push(waiter),
            Effect::Grow => {
                if !after.grow.iter().any(|s| Arc::ptr_eq(s, self)) {
                    after.grow.push(self.clone());
                }
            }
        }
    }

    fn log_retired(&self, app: &AppState, id: WorkerId, reason: Retire, note: Note) {
        let name = &self.settings.name;
        let pid = app.live.get(&id).and_then(|l| l.pid);
        let memory_mb = app.pool.slot(id).and_then(|s| s.memory).unwrap_or(0) >> 20;
        let limit_mb = self.settings.limits.max_memory.unwrap_or(0) >> 20;
        match (note, reason) {
            (Note::Silent, _) => {}
            (Note::Replaced, _) => tracing::info!(
                app = %name, worker = id, pid, reason = crate::metrics::ExitReason::from(reason).as_str(),
                "stopping worker: its replacement answers, and it takes no more requests"
            ),
            (Note::Drained, _) => {
                tracing::info!(app = %name, worker = id, "stopping worker: drained, its last session ended")
            }
            (Note::Pruned, _) => {
                let g = super::status::gauges(&app.pool);
                tracing::info!(
                    app = %name,
                    worker = id,
                    idle_s = self.settings.max_age.as_secs_f64(),
                    left = g.starting + g.idle + g.busy,
                    "stopping worker: unused for longer than --max-age"
                );
            }
            (Note::OverMemory, _) | (Note::Served, Retire::Memory) => tracing::info!(
                app = %name, worker = id, pid, memory_mb, limit_mb,
                "replacing worker: its memory passed --max-worker-memory"
            ),
            (Note::Served, Retire::Shutdown) => tracing::info!(
                app = %name, worker = id, pid,
                "stopping worker: its app was reloaded or removed, and its last request is done"
            ),
            (Note::Served, _) => {
                tracing::info!(app = %name, worker = id, pid, "replacing worker: it served --max-requests requests")
            }
        }
    }

    /// A lease for worker `id`, which the pool has just made busy.
    pub(super) fn lease_for(self: &Arc<Self>, app: &mut AppState, id: WorkerId) -> Lease {
        let home: Arc<dyn Home> = self.clone();
        match app.live.get_mut(&id) {
            Some(live) => Lease::new(home, id, Some(live.connector.clone()), live.conns.pop(), live.exit.clone()),
            None => Lease::new(home, id, None, None, tokio::sync::watch::channel(Some(Exit::Unknown)).1),
        }
    }

    /// Feeds one event under the lock and carries out what follows.
    pub(super) fn feed_now(self: &Arc<Self>, event: Event) {
        let mut after = After::default();
        {
            let mut f = self.fleet.lock();
            let Some(app) = f.apps.get_mut(&self.key) else { return };
            self.feed(app, event, &mut after);
        }
        after.run();
    }

    /// After a request ended without its client (or its worker's answer):
    /// the worker is still busy in R. A probe on a fresh connection is answered
    /// only once R has finished, so the worker comes back then; past
    /// `--request-timeout` (or `SETTLE_MAX` without one) it is replaced.
    pub(super) async fn settle(self: Arc<Self>, id: WorkerId, connector: Option<Arc<dyn Connect>>) {
        let probe = async {
            let connector = connector.ok_or_else(|| std::io::Error::other("the worker is gone"))?;
            connector.probe().await
        };
        let limit = self.settings.request_timeout.unwrap_or(SETTLE_MAX);
        let settled =
            tokio::time::timeout(limit, probe).await.unwrap_or_else(|_| Err(std::io::Error::other("timed out")));
        let mut after = After::default();
        {
            let mut f = self.fleet.lock();
            let Some(app) = f.apps.get_mut(&self.key) else { return };
            match settled {
                Ok(conn) => {
                    if let Some(live) = app.live.get_mut(&id) {
                        live.conns.push(conn);
                    }
                    self.feed(app, Event::Completed(id), &mut after);
                }
                Err(e) => {
                    tracing::warn!(app = %self.settings.name, worker = id, error = %e, limit_s = limit.as_secs_f64(),
                        "worker did not finish an abandoned request; replacing it");
                    self.feed(app, Event::Retire(id, Retire::Timeout), &mut after);
                }
            }
        }
        after.run();
    }

    /// Pings an idle worker; one that does not answer in time is replaced
    /// before any request is sent to it.
    pub(super) async fn liveness(self: Arc<Self>, id: WorkerId, conn: Option<Conn>, connector: Arc<dyn Connect>) {
        let ping = async {
            let mut conn = match conn {
                Some(c) if !c.is_closed() => c,
                _ => connector.connect(false).await?,
            };
            conn.ping().await?;
            Ok::<Conn, std::io::Error>(conn)
        };
        let answer = tokio::time::timeout(PROBE_DEADLINE, ping).await;
        let mut after = After::default();
        {
            let mut f = self.fleet.lock();
            let Some(app) = f.apps.get_mut(&self.key) else { return };
            match answer {
                Ok(Ok(conn)) => {
                    if let Some(live) = app.live.get_mut(&id) {
                        live.conns.push(conn);
                    }
                    self.feed(app, Event::Probed(id), &mut after);
                }
                other => {
                    let error = match other {
                        Ok(Err(e)) => e.to_string(),
                        _ => format!("no answer within {}s", PROBE_DEADLINE.as_secs()),
                    };
                    if self.feed(app, Event::Retire(id, Retire::Unresponsive), &mut after) {
                        tracing::warn!(app = %self.settings.name, worker = id, error,
                            "replacing worker: it did not answer a liveness probe while idle");
                    }
                }
            }
        }
        after.run();
    }
}

impl Home for Supervisor {
    fn give_back(&self, worker: WorkerId, returned: Returned) {
        let mut after = After::default();
        {
            let mut f = self.fleet.lock();
            let Some(app) = f.apps.get_mut(&self.key) else { return };
            // Leases hold an `Arc` of their supervisor, so it is alive here.
            let Some(this) = app.sup.upgrade() else { return };
            match returned {
                Returned::Unused(conn) => {
                    if let (Some(live), Some(conn)) = (app.live.get_mut(&worker), conn) {
                        live.conns.push(conn);
                    }
                    this.feed(app, Event::Unused(worker), &mut after);
                }
                Returned::Answered(conn) => {
                    if let Some(live) = app.live.get_mut(&worker) {
                        live.conns.extend(conn);
                        live.used.notify_one();
                    }
                    this.feed(app, Event::Completed(worker), &mut after);
                }
                Returned::Parked => {
                    if let Some(live) = app.live.get(&worker) {
                        live.used.notify_one();
                    }
                    this.feed(app, Event::Parked(worker), &mut after);
                    self.count_pending(app, worker);
                }
                Returned::Settled => {
                    this.feed(app, Event::Settled(worker), &mut after);
                    self.count_pending(app, worker);
                }
                Returned::Broken(reason) => {
                    this.feed(app, Event::Retire(worker, reason), &mut after);
                    self.fleet.grow(&mut f, self.key, now(), &mut after);
                }
                Returned::Abandoned(connector) => {
                    drop(f);
                    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                        runtime.spawn(this.settle(worker, connector));
                    }
                    return;
                }
            }
        }
        after.run();
    }
}

impl Supervisor {
    /// The worker's requests waiting on promises, as metrics show them.
    fn count_pending(&self, app: &AppState, worker: WorkerId) {
        if let Some(slot) = app.pool.slot(worker) {
            self.metrics.worker_pending(worker, slot.parked);
        }
    }
}
