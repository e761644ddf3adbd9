//! What an app's supervisor shows: `/__valve__/status` per worker, the
//! gauges metrics and the dashboard read, and whether the app is ready.

use crate::app::pool::{Pool, State, WorkerId};
use crate::metrics::Gauges;

use super::{now, Supervisor};

/// What `/__valve__/status` shows of one worker.
#[derive(Clone, Debug, serde::Serialize)]
pub struct WorkerStatus {
    pub id: WorkerId,
    pub pid: Option<u32>,
    /// starting, idle, busy (R computes), waiting (R holds only requests
    /// waiting on promises), probing, draining, stopping.
    pub state: &'static str,
    /// Requests it holds waiting on promises.
    pub pending: usize,
    pub requests: u64,
    pub sessions: usize,
    pub uptime_s: f64,
    pub idle_s: Option<f64>,
    pub memory_bytes: Option<u64>,
    pub forked: bool,
    /// How it started: "fresh R", "app preload" (a fork of the app's own
    /// loaded parent) or "warm parent" (a fork of the parent shared by apps).
    pub started_by: &'static str,
    /// Shiny: the share of a CPU its R used (running or waiting to run) at the last sample.
    pub cpu: Option<f64>,
    /// Shiny: the signed-in users of its open sessions (one entry per session, sorted).
    pub users: Vec<String>,
    /// Past a limit: "replacement wanted", "replacement starting" (it serves
    /// on meanwhile) or "replaced" (it takes nothing more).
    pub recycle: Option<&'static str>,
}

/// What `/__valve__/status` shows of one app's pool.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Status {
    pub workers: Vec<WorkerStatus>,
    pub gauges: Gauges,
}

pub(super) fn gauges<W>(pool: &Pool<W>) -> Gauges {
    Gauges {
        sessions: pool.sessions(),
        starting: pool.count(State::Starting),
        idle: pool.count(State::Idle),
        busy: pool.count(State::Busy) + pool.count(State::Probing),
        waiting: pool.count(State::Waiting),
        pending: pool.slots().map(|(_, s)| s.parked).sum(),
        waiting_load: pool
            .slots()
            .filter(|(_, s)| s.state == State::Waiting)
            .map(|(_, s)| match pool.limits().max_pending {
                0 => 1.0,
                max => (s.parked as f64 / max as f64).min(1.0),
            })
            .sum(),
        draining: pool.count(State::Draining),
        queued: pool.queue_len(),
        n_max: pool.limits().n_max,
    }
}

impl Supervisor {
    pub fn gauges(&self) -> Gauges {
        self.with(|app| gauges(&app.pool)).unwrap_or_default()
    }

    /// Whether the app can serve: it reached `n_min` once and a request sent
    /// now will be served (a worker answers, or one is on its way: see
    /// `Pool::can_serve`). A worker recycled or replaced keeps the app ready.
    pub fn ready(&self) -> bool {
        let now = now();
        let f = self.fleet.lock();
        let freeing = f.freeing();
        f.apps.get(&self.key).is_some_and(|app| app.started && !app.closing && app.pool.can_serve(now, freeing))
    }

    /// Every worker of the app, from what is known: no lock is held while
    /// anything is read from /proc (memory is sampled by each worker's task).
    pub fn status(&self) -> Status {
        let now = now();
        let users = self.users.lock().unwrap_or_else(|p| p.into_inner()).clone();
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
                        pending: slot.parked,
                        requests: slot.served,
                        sessions: slot.sessions,
                        uptime_s: now.duration_since(slot.created).as_secs_f64(),
                        idle_s: (slot.state == State::Idle).then(|| now.duration_since(slot.last_used).as_secs_f64()),
                        memory_bytes: slot.memory,
                        forked: live.is_some_and(|l| l.forked),
                        started_by: live.map(|l| l.started_by).unwrap_or(""),
                        cpu: slot.cpu.map(|c| (c * 100.0).round() / 100.0),
                        users: {
                            let mut u = users.get(&id).cloned().unwrap_or_default();
                            u.sort();
                            u
                        },
                        recycle: slot.recycle.map(|r| r.as_str()),
                    }
                })
                .collect();
            Status { workers, gauges: gauges(&app.pool) }
        })
        .unwrap_or(Status { workers: Vec::new(), gauges: Gauges::default() })
    }
}
