//! Traces (OpenTelemetry): valve continues a request's W3C trace (or starts
//! one), hands R its own span as `traceparent`, and exports its spans over
//! OTLP/HTTP to the collector `--otlp-endpoint` names.
//!
//! Export never slows a request: a finished span is offered to a bounded
//! queue (`queue`; when full it is dropped and counted) that one background
//! task drains in batches (`export`), encoded as OTLP JSON (`otlp`, pure).
//! With no endpoint the `Tracer` is off: `begin` returns `None` at once and
//! nothing else runs. `context` reads and writes `traceparent` (pure) and
//! draws the ids.
//!
//! `mod.rs` holds the shapes (a finished `Span` is plain data, a `Context`
//! what R is told); `tracer` the `Tracer`, spans under way (`Begun`) and
//! long ones (`Live`). What a span's attributes say is the front's business
//! (`http::spans`), so this module knows nothing of requests.

mod context;
mod export;
mod otlp;
mod queue;
mod tracer;

use http::HeaderMap;

pub use context::{Parent, SpanId, TraceId, TRACEPARENT, TRACESTATE};
pub use tracer::{Begun, Described, Live, Tracer};

/// The most events one span keeps (a Shiny session's reconnects, say);
/// later ones are counted by the caller, not kept.
pub const MAX_EVENTS: usize = 64;

/// A span's kind (OTLP `SpanKind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Internal = 1,
    Server = 2,
}

/// An attribute's value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
}

pub type Attributes = Vec<(&'static str, Value)>;

/// Something that happened during a span, at a time.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub name: &'static str,
    /// Unix time in nanoseconds.
    pub at: u64,
    pub attributes: Attributes,
}

/// A finished span, as the exporter sends it.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub trace: TraceId,
    pub span: SpanId,
    pub parent: Option<SpanId>,
    /// The caller's `tracestate`, for a span that continues its trace.
    pub tracestate: Option<String>,
    pub name: String,
    pub kind: Kind,
    /// Unix times in nanoseconds.
    pub start: u64,
    pub end: u64,
    pub attributes: Attributes,
    pub events: Vec<Event>,
    /// The span failed (OTLP status `ERROR`), with this message.
    pub error: Option<String>,
}

/// Where a span sits in its trace: what R is told, and what a child span
/// names as its parent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Context {
    pub trace: TraceId,
    pub span: SpanId,
    pub sampled: bool,
    /// It continues a caller's trace (whose `tracestate` then goes on with it).
    pub continued: bool,
}

impl Context {
    /// The `traceparent` naming this span.
    pub fn traceparent(&self) -> String {
        context::format(self.trace, self.span, self.sampled)
    }

    /// A request's headers as R gets them: this span as `traceparent` in
    /// place of the caller's, and the caller's `tracestate` only with the
    /// trace it belongs to (a new trace drops it, as the specification says).
    pub fn to_r(&self, headers: &mut HeaderMap) {
        context::put(headers, &self.traceparent());
        if !self.continued {
            headers.remove(&TRACESTATE);
        }
    }
}

#[cfg(test)]
impl Span {
    /// A span with fresh ids, named `name`, saying nothing else.
    pub(crate) fn bare(name: &str) -> Span {
        Span {
            trace: TraceId::random(),
            span: SpanId::random(),
            parent: None,
            tracestate: None,
            name: name.into(),
            kind: Kind::Server,
            start: 1,
            end: 2,
            attributes: vec![],
            events: vec![],
            error: None,
        }
    }
}
