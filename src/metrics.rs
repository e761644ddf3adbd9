//! Counters and histograms for `/__valve__/metrics`, lock-free on the request
//! path (atomics only), plus a per-second history for the dashboard.

use std::collections::VecDeque;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::Method;

/// Histogram bucket bounds in seconds (Prometheus `le`).
const BUCKETS: [f64; 17] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];

const METHODS: [&str; 8] = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "OTHER"];
const STATUSES: usize = 600;

/// Why a worker left the pool (the `reason` label of `valve_worker_exits_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitReason {
    Idle,
    Recycled,
    Memory,
    Timeout,
    Broken,
    Crashed,
    FailedStart,
    Shutdown,
}

impl ExitReason {
    const ALL: [ExitReason; 8] = [
        ExitReason::Idle,
        ExitReason::Recycled,
        ExitReason::Memory,
        ExitReason::Timeout,
        ExitReason::Broken,
        ExitReason::Crashed,
        ExitReason::FailedStart,
        ExitReason::Shutdown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ExitReason::Idle => "idle",
            ExitReason::Recycled => "max_requests",
            ExitReason::Memory => "max_memory",
            ExitReason::Timeout => "request_timeout",
            ExitReason::Broken => "broken",
            ExitReason::Crashed => "crashed",
            ExitReason::FailedStart => "failed_start",
            ExitReason::Shutdown => "shutdown",
        }
    }

    /// Whether valve asked for this exit (as opposed to the worker dying on it).
    pub fn planned(self) -> bool {
        matches!(self, ExitReason::Idle | ExitReason::Recycled | ExitReason::Memory | ExitReason::Shutdown)
    }
}

/// Why valve answered a request itself (`valve_rejected_requests_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    QueueFull,
    QueueTimeout,
    ShuttingDown,
    BodyTooLarge,
    WorkerFailed,
    RequestTimeout,
}

impl Rejection {
    const ALL: [Rejection; 6] = [
        Rejection::QueueFull,
        Rejection::QueueTimeout,
        Rejection::ShuttingDown,
        Rejection::BodyTooLarge,
        Rejection::WorkerFailed,
        Rejection::RequestTimeout,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Rejection::QueueFull => "queue_full",
            Rejection::QueueTimeout => "queue_timeout",
            Rejection::ShuttingDown => "shutting_down",
            Rejection::BodyTooLarge => "body_too_large",
            Rejection::WorkerFailed => "worker_failed",
            Rejection::RequestTimeout => "request_timeout",
        }
    }
}

pub struct Histogram {
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    fn new() -> Self {
        Histogram { buckets: Default::default(), count: AtomicU64::new(0), sum_micros: AtomicU64::new(0) }
    }

    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| secs <= *b) {
            self.buckets[i].fetch_add(1, Relaxed);
        }
        self.count.fetch_add(1, Relaxed);
        self.sum_micros.fetch_add(d.as_micros() as u64, Relaxed);
    }

    fn snapshot(&self) -> ([u64; BUCKETS.len()], u64, u64) {
        let mut b = [0; BUCKETS.len()];
        for (i, c) in self.buckets.iter().enumerate() {
            b[i] = c.load(Relaxed);
        }
        (b, self.count.load(Relaxed), self.sum_micros.load(Relaxed))
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let (b, count, sum) = self.snapshot();
        header(out, name, "histogram", help);
        let mut cumulative = 0;
        for (bound, n) in BUCKETS.iter().zip(b) {
            cumulative += n;
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {}", sum as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {count}");
    }
}

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
#[derive(Clone, Copy, Debug, Default)]
pub struct Point {
    pub unix: u64,
    pub requests: u64,
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub queued: usize,
    pub busy: usize,
    pub idle: usize,
}

/// Seconds of history the dashboard shows.
const HISTORY: usize = 300;

pub struct Metrics {
    requests: Box<[AtomicU64]>,
    pub request_duration: Histogram,
    pub queue_wait: Histogram,
    pub spawn_duration: Histogram,
    exits: [AtomicU64; ExitReason::ALL.len()],
    rejected: [AtomicU64; Rejection::ALL.len()],
    sessions_total: AtomicU64,
    history: Mutex<History>,
}

struct History {
    points: VecDeque<Point>,
    last_total: u64,
    last_buckets: [u64; BUCKETS.len()],
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: (0..METHODS.len() * STATUSES).map(|_| AtomicU64::new(0)).collect(),
            request_duration: Histogram::new(),
            queue_wait: Histogram::new(),
            spawn_duration: Histogram::new(),
            exits: Default::default(),
            rejected: Default::default(),
            sessions_total: AtomicU64::new(0),
            history: Mutex::new(History {
                points: VecDeque::with_capacity(HISTORY),
                last_total: 0,
                last_buckets: [0; BUCKETS.len()],
            }),
        }
    }
}

fn method_index(m: &Method) -> usize {
    METHODS[..METHODS.len() - 1].iter().position(|n| *n == m.as_str()).unwrap_or(METHODS.len() - 1)
}

impl Metrics {
    pub fn request(&self, method: &Method, status: u16, took: Duration) {
        let s = usize::from(status).min(STATUSES - 1);
        self.requests[method_index(method) * STATUSES + s].fetch_add(1, Relaxed);
        self.request_duration.observe(took);
    }

    pub fn session_opened(&self) {
        self.sessions_total.fetch_add(1, Relaxed);
    }

    pub fn exit(&self, reason: ExitReason) {
        self.exits[reason as usize].fetch_add(1, Relaxed);
    }

    pub fn reject(&self, reason: Rejection) {
        self.rejected[reason as usize].fetch_add(1, Relaxed);
    }

    /// Takes this second's point for the dashboard (called once a second).
    pub fn tick(&self, queued: usize, busy: usize, idle: usize) {
        let (buckets, total, _) = self.request_duration.snapshot();
        let mut h = self.history.lock().unwrap_or_else(|p| p.into_inner());
        let mut deltas = [0; BUCKETS.len()];
        for (i, d) in deltas.iter_mut().enumerate() {
            *d = buckets[i].saturating_sub(h.last_buckets[i]);
        }
        let requests = total.saturating_sub(h.last_total);
        let unix = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let point = Point {
            unix,
            requests,
            p50: quantile(&deltas, requests, 0.5),
            p99: quantile(&deltas, requests, 0.99),
            queued,
            busy,
            idle,
        };
        h.last_total = total;
        h.last_buckets = buckets;
        if h.points.len() == HISTORY {
            h.points.pop_front();
        }
        h.points.push_back(point);
    }

    pub fn history(&self) -> Vec<Point> {
        self.history.lock().unwrap_or_else(|p| p.into_inner()).points.iter().copied().collect()
    }

    /// The Prometheus text format. `gauges` are the pool's state at scrape time.
    pub fn render(&self, gauges: &Gauges) -> String {
        let mut out = String::with_capacity(8192);
        header(&mut out, "valve_requests_total", "counter", "Requests answered, by method and status.");
        for (m, method) in METHODS.iter().enumerate() {
            for s in 0..STATUSES {
                let n = self.requests[m * STATUSES + s].load(Relaxed);
                if n > 0 {
                    let _ = writeln!(out, "valve_requests_total{{method=\"{method}\",status=\"{s}\"}} {n}");
                }
            }
        }
        self.request_duration.render(
            &mut out,
            "valve_request_duration_seconds",
            "Time from a request's arrival to its answer's head.",
        );
        self.queue_wait.render(&mut out, "valve_queue_wait_seconds", "Time requests waited for a worker.");
        self.spawn_duration.render(
            &mut out,
            "valve_worker_spawn_duration_seconds",
            "Time from the decision to start a worker to its first answer.",
        );
        single(&mut out, "valve_queue_depth", "gauge", "Requests waiting for a worker.", gauges.queued as u64);
        header(&mut out, "valve_workers", "gauge", "Workers by state.");
        for (state, n) in [("starting", gauges.starting), ("idle", gauges.idle), ("busy", gauges.busy)] {
            let _ = writeln!(out, "valve_workers{{state=\"{state}\"}} {n}");
        }
        single(
            &mut out,
            "valve_workers_max",
            "gauge",
            "The most workers valve may run (--n-max).",
            gauges.n_max as u64,
        );
        single(&mut out, "valve_sessions", "gauge", "Open Shiny sessions (WebSockets).", gauges.sessions as u64);
        single(
            &mut out,
            "valve_sessions_total",
            "counter",
            "Shiny sessions opened.",
            self.sessions_total.load(Relaxed),
        );
        header(&mut out, "valve_worker_exits_total", "counter", "Workers that left the pool, by reason.");
        for r in ExitReason::ALL {
            let n = self.exits[r as usize].load(Relaxed);
            let _ = writeln!(out, "valve_worker_exits_total{{reason=\"{}\"}} {n}", r.as_str());
        }
        header(&mut out, "valve_rejected_requests_total", "counter", "Requests valve answered itself, by reason.");
        for r in Rejection::ALL {
            let n = self.rejected[r as usize].load(Relaxed);
            let _ = writeln!(out, "valve_rejected_requests_total{{reason=\"{}\"}} {n}", r.as_str());
        }
        out
    }
}

/// The `# HELP` and `# TYPE` lines of one metric.
fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A metric with one unlabelled sample.
fn single(out: &mut String, name: &str, kind: &str, help: &str, value: u64) {
    header(out, name, kind, help);
    let _ = writeln!(out, "{name} {value}");
}

/// The pool's state at scrape time.
#[derive(Clone, Copy, Debug, Default)]
pub struct Gauges {
    pub starting: usize,
    pub idle: usize,
    pub busy: usize,
    pub queued: usize,
    pub n_max: usize,
    /// Open Shiny sessions.
    pub sessions: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let m = Metrics::default();
        m.request(&Method::GET, 200, Duration::from_micros(800));
        m.request(&Method::GET, 200, Duration::from_millis(30));
        m.request(&Method::POST, 502, Duration::from_secs(2));
        let text = m.render(&Gauges::default());
        assert!(text.contains("valve_requests_total{method=\"GET\",status=\"200\"} 2"));
        assert!(text.contains("valve_requests_total{method=\"POST\",status=\"502\"} 1"));
        assert!(text.contains("valve_request_duration_seconds_bucket{le=\"0.001\"} 1"));
        assert!(text.contains("valve_request_duration_seconds_bucket{le=\"0.05\"} 2"));
        assert!(text.contains("valve_request_duration_seconds_bucket{le=\"+Inf\"} 3"));
        assert!(text.contains("valve_request_duration_seconds_count 3"));
    }

    #[test]
    fn history_turns_counters_into_rates_and_quantiles() {
        let m = Metrics::default();
        for _ in 0..99 {
            m.request(&Method::GET, 200, Duration::from_millis(2));
        }
        m.request(&Method::GET, 200, Duration::from_millis(400));
        m.tick(0, 1, 2);
        m.tick(0, 0, 3);
        let h = m.history();
        assert_eq!(h[0].requests, 100);
        assert_eq!(h[0].p50, Some(0.0025));
        assert_eq!(h[0].p99, Some(0.0025));
        assert_eq!(h[1].requests, 0);
        assert_eq!(h[1].p50, None);
    }
}
