//! Traces' counters (`valve_trace_spans_exported_total`,
//! `valve_trace_spans_dropped_total`): valve-wide, since every app's spans
//! share one exporter.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Why spans never reached the collector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanDrop {
    /// The export queue was full (the collector is slow, down, or backing off).
    QueueFull,
    /// Their batch's POST failed: no connection, no answer in time, or an error status.
    ExportFailed,
    /// They ended while the exporter waited out a failing collector (its
    /// backoff): valve keeps no span then.
    CollectorDown,
    /// The collector took the batch but said it rejected these (OTLP partial success).
    Rejected,
}

impl SpanDrop {
    const ALL: [SpanDrop; 4] =
        [SpanDrop::QueueFull, SpanDrop::ExportFailed, SpanDrop::CollectorDown, SpanDrop::Rejected];

    fn as_str(self) -> &'static str {
        match self {
            SpanDrop::QueueFull => "queue_full",
            SpanDrop::ExportFailed => "export_failed",
            SpanDrop::CollectorDown => "collector_down",
            SpanDrop::Rejected => "rejected",
        }
    }
}

#[derive(Default)]
pub struct TraceCounts {
    exported: AtomicU64,
    dropped: [AtomicU64; SpanDrop::ALL.len()],
}

impl TraceCounts {
    pub fn exported(&self, spans: u64) {
        self.exported.fetch_add(spans, Relaxed);
    }

    pub fn dropped(&self, why: SpanDrop, spans: u64) {
        self.dropped[why as usize].fetch_add(spans, Relaxed);
    }

    /// Spans dropped so far for `why`.
    pub fn dropped_for(&self, why: SpanDrop) -> u64 {
        self.dropped[why as usize].load(Relaxed)
    }

    pub(super) fn render(&self, out: &mut String) {
        super::family::header(
            out,
            "valve_trace_spans_exported_total",
            "counter",
            "Spans the trace collector (--otlp-endpoint) accepted.",
        );
        let _ = writeln!(out, "valve_trace_spans_exported_total {}", self.exported.load(Relaxed));
        super::family::header(
            out,
            "valve_trace_spans_dropped_total",
            "counter",
            "Spans that never reached the trace collector, by reason (requests never wait for it).",
        );
        for why in SpanDrop::ALL {
            let _ = writeln!(
                out,
                "valve_trace_spans_dropped_total{{reason=\"{}\"}} {}",
                why.as_str(),
                self.dropped_for(why)
            );
        }
    }
}
