//! The shapes every metric family shares: histogram buckets and the
//! Prometheus text's headers.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Histogram bucket bounds in seconds (Prometheus `le`).
pub(super) const BUCKETS: [f64; 17] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];

/// Bucket bounds for what lasts minutes to hours (a Shiny session), in seconds.
pub(super) const LONG_BUCKETS: [f64; 12] =
    [10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 86400.0];

/// A histogram of durations over `N` buckets (by default valve's request buckets).
pub struct Histogram<const N: usize = 17> {
    bounds: &'static [f64; N],
    buckets: [AtomicU64; N],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub(super) fn new() -> Self {
        Histogram::with_bounds(&BUCKETS)
    }
}

impl<const N: usize> Histogram<N> {
    pub(super) fn with_bounds(bounds: &'static [f64; N]) -> Self {
        Histogram {
            bounds,
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = self.bounds.iter().position(|b| secs <= *b) {
            self.buckets[i].fetch_add(1, Relaxed);
        }
        self.count.fetch_add(1, Relaxed);
        self.sum_micros.fetch_add(d.as_micros() as u64, Relaxed);
    }

    pub(super) fn snapshot(&self) -> ([u64; N], u64, u64) {
        let mut b = [0; N];
        for (i, c) in self.buckets.iter().enumerate() {
            b[i] = c.load(Relaxed);
        }
        (b, self.count.load(Relaxed), self.sum_micros.load(Relaxed))
    }

    pub(super) fn render(&self, out: &mut String, name: &str, app: &str) {
        let (b, count, sum) = self.snapshot();
        let mut cumulative = 0;
        for (bound, n) in self.bounds.iter().zip(b) {
            cumulative += n;
            let _ = writeln!(out, "{name}_bucket{{app=\"{app}\",le=\"{bound}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_bucket{{app=\"{app}\",le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum{{app=\"{app}\"}} {}", sum as f64 / 1e6);
        let _ = writeln!(out, "{name}_count{{app=\"{app}\"}} {count}");
    }
}

/// The `# HELP` and `# TYPE` lines of one metric.
pub(super) fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}
