//! The shapes every metric family shares: histogram buckets and the
//! Prometheus text's headers.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Histogram bucket bounds in seconds (Prometheus `le`).
pub(super) const BUCKETS: [f64; 17] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];

pub struct Histogram {
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub(super) fn new() -> Self {
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

    pub(super) fn snapshot(&self) -> ([u64; BUCKETS.len()], u64, u64) {
        let mut b = [0; BUCKETS.len()];
        for (i, c) in self.buckets.iter().enumerate() {
            b[i] = c.load(Relaxed);
        }
        (b, self.count.load(Relaxed), self.sum_micros.load(Relaxed))
    }

    pub(super) fn render(&self, out: &mut String, name: &str, app: &str) {
        let (b, count, sum) = self.snapshot();
        let mut cumulative = 0;
        for (bound, n) in BUCKETS.iter().zip(b) {
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
