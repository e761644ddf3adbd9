//! Counters and histograms for `/__valve__/metrics`: lock-free on the request
//! path (atomics only), one set per app (labelled `app`, kept across reloads
//! of that app), a per-second history for the dashboard, and valve's own
//! process metrics. Rendered in the Prometheus text format, with family names
//! that stay distinct under OpenMetrics (no gauge shares a name with a
//! counter's `_total` stem).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::Method;

use crate::worker::WorkerId;

mod auth;
mod compact;
mod family;
mod packages;
mod process;
mod reasons;
mod session;
mod shiny;
mod tls;
mod trace;
pub use auth::{AuthCounts, AuthResult};
use compact::{Counts, Repeat, Runs};
pub use family::Histogram;
use family::{header, BUCKETS, LONG_BUCKETS};
use process::{process_metrics, single};
pub use reasons::{ExitReason, Rejection};
pub use session::{SessionLength, SessionUse};
pub use shiny::{Reconnects, SessionEnd};
pub use trace::{SpanDrop, TraceCounts};

const METHODS: [&str; 8] = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "OTHER"];
const STATUSES: usize = 600;

/// A quantile estimated from bucket deltas (upper bound of the bucket it falls in).
fn quantile(deltas: &[u64; BUCKETS.len()], total: u64, q: f64) -> Option<f64> {
    if total == 0 {
        return None;
    }
    let rank = (q * total as f64).ceil() as u64;
    let mut seen = 0;
    for (bound, n) in BUCKETS.iter().zip(deltas) {
        seen += n;
        if seen >= rank {
            return Some(*bound);
        }
    }
    BUCKETS.last().copied()
}

/// One second of the dashboard's history.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Point {
    #[serde(rename = "t")]
    pub unix: u64,
    pub requests: u64,
    /// Answers with a 5xx status.
    pub errors: u64,
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub queued: usize,
    pub busy: usize,
    pub idle: usize,
}

/// Seconds of history the dashboard shows.
const HISTORY: usize = 300;

/// Seconds the site dashboard's figures cover (requests per second, p50, p99, error rate).
pub const RECENT: usize = 60;

/// An app's last `RECENT` seconds, from its request-duration histogram.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Recent {
    pub seconds: usize,
    pub requests: u64,
    pub errors: u64,
    pub p50: Option<f64>,
    pub p99: Option<f64>,
}

/// A second repeats the one before when it is the next second and nothing changed
/// (an idle app's history is one run).
impl Repeat for Point {
    fn repeats(&self, n: usize, next: &Self) -> bool {
        next.unix == self.unix + n as u64 && Point { unix: self.unix, ..*next } == *self
    }

    fn nth(&self, i: usize) -> Self {
        Point { unix: self.unix + i as u64, ..*self }
    }
}

struct History {
    points: Runs<Point>,
    /// The histogram's buckets at each of the last `RECENT` + 1 ticks.
    window: Runs<[u64; BUCKETS.len()]>,
    last_total: u64,
    last_errors: u64,
    last_buckets: [u64; BUCKETS.len()],
}

/// One app's pool at scrape time.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Gauges {
    pub starting: usize,
    pub idle: usize,
    /// Workers whose R computes a request (or answers a probe).
    pub busy: usize,
    /// plumber workers whose R computes nothing but that hold requests waiting on promises.
    pub waiting: usize,
    /// Requests waiting on promises, across the workers.
    pub pending: usize,
    /// The waiting workers as saturation counts them: each by its share of
    /// `max_pending` (1: full, or max_pending 0).
    pub waiting_load: f64,
    /// Workers past a limit, serving only the sessions (Shiny) or promises (plumber) they hold.
    pub draining: usize,
    pub queued: usize,
    pub n_max: usize,
    /// Open Shiny sessions.
    pub sessions: usize,
}

impl Gauges {
    /// (busy workers + waiting workers by their pending share + queued
    /// requests) / n_max: above 1, requests wait; the metric to autoscale on.
    pub fn saturation(&self) -> f64 {
        (self.busy as f64 + self.waiting_load + self.queued as f64) / self.n_max.max(1) as f64
    }

    /// Adds another generation's gauges of the same app.
    pub fn add(&mut self, other: &Gauges) {
        self.starting += other.starting;
        self.idle += other.idle;
        self.busy += other.busy;
        self.waiting += other.waiting;
        self.pending += other.pending;
        self.waiting_load += other.waiting_load;
        self.draining += other.draining;
        self.queued += other.queued;
        self.n_max = self.n_max.max(other.n_max);
        self.sessions += other.sessions;
    }
}

/// One app's counters, histograms and history.
pub struct AppMetrics {
    pub name: String,
    /// Requests by method and status (`method * STATUSES + status`).
    requests: Counts,
    pub request_duration: Histogram,
    pub queue_wait: Histogram,
    pub spawn_duration: Histogram,
    /// Time to a worker's first answer by how it started (`STARTED_BY`).
    started_by: [Histogram; 3],
    exits: [AtomicU64; ExitReason::ALL.len()],
    rejected: [AtomicU64; Rejection::ALL.len()],
    sessions_opened: AtomicU64,
    /// Answers with a 5xx status (the dashboard's error rate).
    errors: AtomicU64,
    /// How long Shiny sessions lasted.
    pub session_length: Arc<SessionLength>,
    /// Where sessions and requests by user are kept (the registry's, shared by every app).
    usage: Arc<crate::usage::Usage>,
    /// Resumable Shiny sessions (docs/design/shiny-reconnect.md).
    pub reconnects: Reconnects,
    memory: Mutex<BTreeMap<WorkerId, u64>>,
    /// The app's `memory_limit` per worker, in bytes (0: none).
    memory_limit: AtomicU64,
    /// Allocations R refused a worker of the app (its memory_limit reached).
    memory_limit_errors: AtomicU64,
    /// Requests each worker holds waiting on promises (workers that ever held one).
    pending: Mutex<BTreeMap<WorkerId, usize>>,
    history: Mutex<History>,
}

fn method_index(m: &Method) -> usize {
    METHODS[..METHODS.len() - 1].iter().position(|n| *n == m.as_str()).unwrap_or(METHODS.len() - 1)
}

/// R's words when an allocation fails (`cannot allocate vector of size
/// 3.0 Gb`, `cannot allocate memory block of size ...`).
const ALLOCATION_FAILED: [&str; 2] = ["cannot allocate vector of size", "cannot allocate memory block of size"];

impl crate::worker::OutputHook for AppMetrics {
    fn line(&self, worker: WorkerId, _pid: u32, _stream: crate::worker::Stream, line: &str) {
        let limit = self.memory_limit();
        if limit == 0 || !ALLOCATION_FAILED.iter().any(|m| line.contains(m)) {
            return;
        }
        self.memory_limit_errors.fetch_add(1, Relaxed);
        tracing::warn!(app = %self.name, worker, memory_limit = limit,
            "a worker reached the app's memory_limit: R could not allocate memory, and the request that asked got an error");
    }
}

/// How a worker started, as the worker module says it and as the metric labels it.
const STARTED_BY: [(&str, &str); 3] =
    [("fresh R", "fresh_r"), ("app preload", "app_preload"), ("warm parent", "warm_parent")];

impl AppMetrics {
    /// A worker of the app answered, `startup` after the decision to start it.
    pub fn started(&self, by: &str, startup: std::time::Duration) {
        if let Some(i) = STARTED_BY.iter().position(|(name, _)| *name == by) {
            self.started_by[i].observe(startup);
        }
    }

    /// The app's `memory_limit` (0: none), for the metrics and the status.
    pub fn set_memory_limit(&self, bytes: Option<u64>) {
        self.memory_limit.store(bytes.unwrap_or(0), Relaxed);
    }

    pub fn memory_limit(&self) -> u64 {
        self.memory_limit.load(Relaxed)
    }

    /// How often R could not allocate past the app's memory_limit.
    pub fn memory_limit_errors(&self) -> u64 {
        self.memory_limit_errors.load(Relaxed)
    }

    /// An app's metrics with usage of its own (kept in memory only).
    pub fn new(name: &str) -> Self {
        Self::with_usage(name, Arc::default())
    }

    fn with_usage(name: &str, usage: Arc<crate::usage::Usage>) -> Self {
        AppMetrics {
            name: name.to_string(),
            requests: Counts::default(),
            request_duration: Histogram::new(),
            queue_wait: Histogram::new(),
            spawn_duration: Histogram::new(),
            started_by: std::array::from_fn(|_| Histogram::new()),
            exits: Default::default(),
            rejected: Default::default(),
            sessions_opened: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            session_length: Arc::new(Histogram::with_bounds(&LONG_BUCKETS)),
            usage,
            reconnects: Reconnects::new(),
            memory: Mutex::new(BTreeMap::new()),
            memory_limit: AtomicU64::new(0),
            memory_limit_errors: AtomicU64::new(0),
            pending: Mutex::new(BTreeMap::new()),
            history: Mutex::new(History {
                points: Runs::new(HISTORY),
                window: Runs::new(RECENT + 1),
                last_total: 0,
                last_errors: 0,
                last_buckets: [0; BUCKETS.len()],
            }),
        }
    }

    pub fn request(&self, method: &Method, status: u16, took: Duration) {
        let s = usize::from(status).min(STATUSES - 1);
        self.requests.add((method_index(method) * STATUSES + s) as u32);
        if s >= 500 {
            self.errors.fetch_add(1, Relaxed);
        }
        self.request_duration.observe(took);
    }

    /// A Shiny session opened on `worker`, for `user` if one signed in:
    /// counted (its length, and in the usage list) when the guard is dropped.
    pub fn session(&self, worker: WorkerId, user: Option<&str>) -> SessionUse {
        SessionUse::new(self.session_length.clone(), self.usage.open_session(&self.name, worker, user))
    }

    /// A request to the app from `user` (None: nobody signed in), for the
    /// usage list's requests per user per hour.
    pub fn user_request(&self, user: Option<&str>) {
        self.usage.request(&self.name, user);
    }

    pub fn session_opened(&self) {
        self.sessions_opened.fetch_add(1, Relaxed);
    }

    pub fn exit(&self, reason: ExitReason) {
        self.exits[reason as usize].fetch_add(1, Relaxed);
    }

    pub fn reject(&self, reason: Rejection) {
        self.rejected[reason as usize].fetch_add(1, Relaxed);
    }

    /// A worker's memory at its last sample.
    pub fn worker_memory(&self, id: WorkerId, bytes: u64) {
        self.memory.lock().unwrap_or_else(|p| p.into_inner()).insert(id, bytes);
    }

    /// How many requests a worker holds waiting on promises now.
    pub fn worker_pending(&self, id: WorkerId, pending: usize) {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).insert(id, pending);
    }

    pub fn forget_worker(&self, id: WorkerId) {
        self.memory.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
    }

    /// Takes this second's point for the dashboard (called once a second).
    pub fn tick(&self, g: &Gauges) {
        let (buckets, total, _) = self.request_duration.snapshot();
        let mut h = self.history.lock().unwrap_or_else(|p| p.into_inner());
        let mut deltas = [0; BUCKETS.len()];
        for (i, d) in deltas.iter_mut().enumerate() {
            *d = buckets[i].saturating_sub(h.last_buckets[i]);
        }
        let requests = total.saturating_sub(h.last_total);
        let errors = self.errors.load(Relaxed);
        let unix = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let point = Point {
            unix,
            requests,
            errors: errors.saturating_sub(h.last_errors),
            p50: quantile(&deltas, requests, 0.5),
            p99: quantile(&deltas, requests, 0.99),
            queued: g.queued,
            busy: g.busy,
            idle: g.idle,
        };
        h.last_total = total;
        h.last_errors = errors;
        h.last_buckets = buckets;
        h.points.push(point);
        h.window.push(buckets);
    }

    /// The last `RECENT` seconds (fewer just after start): requests, 5xx
    /// answers, and p50 and p99 from the histogram's buckets over them.
    pub fn recent(&self) -> Recent {
        let h = self.history.lock().unwrap_or_else(|p| p.into_inner());
        let (Some(first), Some(last)) = (h.window.front(), h.window.back()) else { return Recent::default() };
        let mut deltas = [0; BUCKETS.len()];
        for (i, d) in deltas.iter_mut().enumerate() {
            *d = last[i].saturating_sub(first[i]);
        }
        let seconds = h.window.len() - 1;
        let recent = h.points.iter().rev().take(seconds);
        let (requests, errors) = recent.fold((0, 0), |(r, e), p| (r + p.requests, e + p.errors));
        let counted = deltas.iter().sum();
        Recent {
            seconds,
            requests,
            errors,
            p50: quantile(&deltas, counted, 0.5),
            p99: quantile(&deltas, counted, 0.99),
        }
    }

    pub fn history(&self) -> Vec<Point> {
        self.history.lock().unwrap_or_else(|p| p.into_inner()).points.iter().collect()
    }
}

/// Every app's metrics, by app name, plus valve-wide counters, and what
/// valve keeps of each app besides: its log and its usage.
#[derive(Default)]
pub struct Registry {
    apps: Mutex<BTreeMap<String, Arc<AppMetrics>>>,
    /// Every app's log buffer (R's output and valve's lines about the app).
    pub logs: Arc<crate::applog::Logs>,
    /// Shiny sessions and requests by user, of every app.
    pub usage: Arc<crate::usage::Usage>,
    /// Counts log lines dropped because the log's reader fell behind.
    log_dropped: std::sync::OnceLock<Box<dyn Fn() -> u64 + Send + Sync>>,
    /// The forward-auth service's answers.
    pub auth: AuthCounts,
    /// Spans exported to the trace collector, and dropped.
    pub trace: TraceCounts,
    /// The certificates served, when HTTPS is on.
    pub tls: tls::TlsCerts,
}

impl Registry {
    /// Where the count of dropped log lines comes from.
    pub fn count_log_drops(&self, count: impl Fn() -> u64 + Send + Sync + 'static) {
        let _ = self.log_dropped.set(Box::new(count));
    }

    /// The metrics of app `name`, created on first use and kept across reloads.
    pub fn app(&self, name: &str) -> Arc<AppMetrics> {
        self.apps
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(name.to_string())
            .or_insert_with(|| Arc::new(AppMetrics::with_usage(name, self.usage.clone())))
            .clone()
    }

    /// The Prometheus text format. `gauges` are each app's pool at scrape time.
    pub fn render(&self, gauges: &BTreeMap<String, Gauges>, processes: usize, max_workers: usize) -> String {
        let apps: Vec<Arc<AppMetrics>> =
            self.apps.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
        let mut out = String::with_capacity(16384);
        header(&mut out, "valve_build_info", "gauge", "valve's version (always 1).");
        let _ = writeln!(out, "valve_build_info{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"));

        header(&mut out, "valve_requests_total", "counter", "Requests answered, by app, method and status.");
        for a in &apps {
            for (key, n) in a.requests.snapshot() {
                let (method, s) = (METHODS[key as usize / STATUSES], key as usize % STATUSES);
                let _ =
                    writeln!(out, "valve_requests_total{{app=\"{}\",method=\"{method}\",status=\"{s}\"}} {n}", a.name);
            }
        }
        /// A histogram family: its name, its help, and where an app keeps it.
        type Family = (&'static str, &'static str, fn(&AppMetrics) -> &Histogram);
        let histograms: [Family; 3] = [
            ("valve_request_duration_seconds", "Time from a request's arrival to its answer's head.", |a| {
                &a.request_duration
            }),
            ("valve_queue_wait_seconds", "Time requests waited for a worker.", |a| &a.queue_wait),
            (
                "valve_worker_spawn_duration_seconds",
                "Time from the decision to start a worker to its first answer.",
                |a| &a.spawn_duration,
            ),
        ];
        for (name, help, get) in histograms {
            header(&mut out, name, "histogram", help);
            for a in &apps {
                get(a).render(&mut out, name, &a.name);
            }
        }
        let name = "valve_worker_start_seconds";
        header(
            &mut out,
            name,
            "histogram",
            "Time from the decision to start a worker to its first answer, by how it started (fresh_r, app_preload: a fork of the app's own loaded parent, warm_parent: a fork of the parent shared by apps).",
        );
        for a in &apps {
            for (i, (_, label)) in STARTED_BY.iter().enumerate() {
                if a.started_by[i].snapshot().1 > 0 {
                    a.started_by[i].render_labels(
                        &mut out,
                        name,
                        &format!("app=\"{}\",started_by=\"{label}\"", a.name),
                    );
                }
            }
        }
        let per_app = |out: &mut String, name: &str, kind: &str, help: &str, value: &dyn Fn(&Gauges) -> String| {
            header(out, name, kind, help);
            for (app, g) in gauges {
                let _ = writeln!(out, "{name}{{app=\"{app}\"}} {}", value(g));
            }
        };
        per_app(&mut out, "valve_queue_depth", "gauge", "Requests waiting for a worker.", &|g| g.queued.to_string());
        per_app(
            &mut out,
            "valve_pending_requests",
            "gauge",
            "Requests R holds waiting on promises (the workers compute others meanwhile).",
            &|g| g.pending.to_string(),
        );
        header(
            &mut out,
            "valve_workers",
            "gauge",
            "Workers by state (busy: R computes; waiting: R holds only requests waiting on promises).",
        );
        for (app, g) in gauges {
            let states = [
                ("starting", g.starting),
                ("idle", g.idle),
                ("busy", g.busy),
                ("waiting", g.waiting),
                ("draining", g.draining),
            ];
            for (state, n) in states {
                let _ = writeln!(out, "valve_workers{{app=\"{app}\",state=\"{state}\"}} {n}");
            }
        }
        per_app(&mut out, "valve_workers_max", "gauge", "The most workers the app may run (n_max).", &|g| {
            g.n_max.to_string()
        });
        per_app(
            &mut out,
            "valve_saturation",
            "gauge",
            "(Busy workers + waiting workers by their share of --max-pending + queued requests) / n_max: above 1 requests wait. Autoscale on it.",
            &|g| format!("{:.4}", g.saturation()),
        );
        per_app(&mut out, "valve_shiny_sessions", "gauge", "Open Shiny sessions (WebSockets).", &|g| {
            g.sessions.to_string()
        });
        header(&mut out, "valve_shiny_sessions_opened_total", "counter", "Shiny sessions opened.");
        for a in &apps {
            let _ = writeln!(
                out,
                "valve_shiny_sessions_opened_total{{app=\"{}\"}} {}",
                a.name,
                a.sessions_opened.load(Relaxed)
            );
        }
        shiny::render(&mut out, &apps.iter().map(|a| (a.name.as_str(), &a.reconnects)).collect::<Vec<_>>());
        let lengths: Vec<(&str, &SessionLength)> = apps.iter().map(|a| (a.name.as_str(), &*a.session_length)).collect();
        session::render(&mut out, &lengths, self.usage.dropped());
        header(
            &mut out,
            "valve_worker_memory_bytes",
            "gauge",
            "Each worker's memory at its last sample (RSS; a fork's private memory).",
        );
        for a in &apps {
            for (id, bytes) in a.memory.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                let _ = writeln!(out, "valve_worker_memory_bytes{{app=\"{}\",worker=\"{id}\"}} {bytes}", a.name);
            }
        }
        header(
            &mut out,
            "valve_memory_limit_bytes",
            "gauge",
            "The most memory one worker of the app may take (memory_limit).",
        );
        for a in apps.iter().filter(|a| a.memory_limit() > 0) {
            let _ = writeln!(out, "valve_memory_limit_bytes{{app=\"{}\"}} {}", a.name, a.memory_limit());
        }
        header(
            &mut out,
            "valve_memory_limit_errors_total",
            "counter",
            "Allocations R could not make in a worker held to memory_limit (its request got an error).",
        );
        for a in apps.iter().filter(|a| a.memory_limit() > 0) {
            let n = a.memory_limit_errors.load(Relaxed);
            let _ = writeln!(out, "valve_memory_limit_errors_total{{app=\"{}\"}} {n}", a.name);
        }
        header(
            &mut out,
            "valve_worker_pending_requests",
            "gauge",
            "Requests each worker holds waiting on promises (workers that held one).",
        );
        for a in &apps {
            for (id, n) in a.pending.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                let _ = writeln!(out, "valve_worker_pending_requests{{app=\"{}\",worker=\"{id}\"}} {n}", a.name);
            }
        }
        header(&mut out, "valve_worker_exits_total", "counter", "Workers that left the pool, by reason.");
        for a in &apps {
            for r in ExitReason::ALL {
                let n = a.exits[r as usize].load(Relaxed);
                let _ = writeln!(out, "valve_worker_exits_total{{app=\"{}\",reason=\"{}\"}} {n}", a.name, r.as_str());
            }
        }
        header(&mut out, "valve_rejected_requests_total", "counter", "Requests valve answered itself, by reason.");
        for a in &apps {
            for r in Rejection::ALL {
                let n = a.rejected[r as usize].load(Relaxed);
                let _ =
                    writeln!(out, "valve_rejected_requests_total{{app=\"{}\",reason=\"{}\"}} {n}", a.name, r.as_str());
            }
        }
        single(&mut out, "valve_r_processes", "gauge", "R worker processes across every app.", processes as f64);
        single(&mut out, "valve_max_workers", "gauge", "The most R workers across every app.", max_workers as f64);
        single(
            &mut out,
            "valve_log_dropped_total",
            "counter",
            "Log lines dropped because whatever reads valve's log fell behind.",
            self.log_dropped.get().map(|count| count()).unwrap_or(0) as f64,
        );
        self.auth.render(&mut out);
        self.trace.render(&mut out);
        self.tls.render(&mut out);
        packages::render(&mut out);
        process_metrics(&mut out);
        out
    }
}

#[cfg(test)]
pub mod reference;
#[cfg(test)]
mod tests;
