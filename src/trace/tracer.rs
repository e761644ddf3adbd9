//! The `Tracer` (off, or a queue and the exporter's task it started), spans
//! under way (`Begun`: a context, a parent, a start) and long spans that
//! gather attributes and events as they go (`Live`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http::HeaderMap;
use tokio_util::sync::CancellationToken;

use super::context::{self, SpanId, TraceId};
use super::queue::{self, Queue};
use super::{export, Attributes, Context, Event, Kind, Span, Value, MAX_EVENTS};
use crate::config::Otlp;
use crate::metrics::Registry;

/// The longest valve's exit waits for the last spans to reach the collector.
const FLUSH_AT_EXIT: Duration = Duration::from_secs(3);

/// valve's spans' way out: off (no endpoint), or a queue drained by the
/// exporter's task. Cheap to clone.
#[derive(Clone, Default)]
pub struct Tracer(Option<Arc<Shared>>);

struct Shared {
    queue: Queue,
    stop: CancellationToken,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Tracer {
    /// A tracer that records nothing.
    pub fn off() -> Tracer {
        Tracer(None)
    }

    /// Exports to `otlp`'s collector, or records nothing without one. Starts
    /// the exporter's task (on the current tokio runtime), which lives until
    /// `shutdown`.
    pub fn start(otlp: Option<&Otlp>, registry: Arc<Registry>) -> Tracer {
        let Some(otlp) = otlp else { return Tracer::off() };
        let (queue, spans, pause) = Queue::new(queue::CAPACITY, registry.clone());
        let stop = CancellationToken::new();
        let task = tokio::spawn(export::run(spans, pause, otlp.clone(), registry, stop.clone()));
        tracing::info!(endpoint = %otlp.url, service = %otlp.service, "exporting traces");
        Tracer(Some(Arc::new(Shared { queue, stop, task: Mutex::new(Some(task)) })))
    }

    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// A span begins for a request with these headers: a child of the
    /// caller's span if it names a valid one, else the root of a new trace.
    /// `None` when the tracer is off (and then nothing was done).
    pub fn begin(&self, headers: &HeaderMap) -> Option<Begun> {
        self.0.as_ref()?;
        let caller = context::parent(headers);
        let context = Context {
            trace: caller.map(|p| p.trace).unwrap_or_else(TraceId::random),
            span: SpanId::random(),
            // A caller that did not record its span is followed (its
            // sampling decision is the trace's); a new trace is recorded.
            sampled: caller.is_none_or(|p| p.sampled),
            continued: caller.is_some(),
        };
        let tracestate = caller.and_then(|_| context::tracestate(headers));
        Some(Begun::new(self.clone(), context, caller.map(|p| p.span), tracestate))
    }

    /// A span that begins now as a child of `parent` (`None` when off).
    pub fn child(&self, parent: &Context) -> Option<Begun> {
        self.0.as_ref()?;
        let context = Context { span: SpanId::random(), ..*parent };
        Some(Begun::new(self.clone(), context, Some(parent.span), None))
    }

    fn export(&self, span: Span) {
        if let Some(shared) = &self.0 {
            shared.queue.offer(span);
        }
    }

    /// Sends what is queued (for at most `FLUSH_AT_EXIT`) and stops the exporter.
    pub async fn shutdown(&self) {
        let Some(shared) = &self.0 else { return };
        shared.stop.cancel();
        let task = shared.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(mut task) = task {
            if tokio::time::timeout(FLUSH_AT_EXIT, &mut task).await.is_err() {
                task.abort();
                tracing::warn!(
                    wait_s = FLUSH_AT_EXIT.as_secs(),
                    "the trace collector did not take the last spans in time"
                );
            }
        }
    }
}

/// Unix time now, in nanoseconds.
fn unix_nanos() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// What a span says, as its owner describes it when it ends.
pub struct Described {
    pub name: String,
    pub kind: Kind,
    pub attributes: Attributes,
    pub events: Vec<Event>,
    /// The span failed (OTLP status `ERROR`), with this message (may be empty).
    pub error: Option<String>,
}

/// A span under way: its context, its parent and when it began.
pub struct Begun {
    tracer: Tracer,
    pub context: Context,
    parent: Option<SpanId>,
    tracestate: Option<String>,
    /// Wall-clock start (what the collector shows) and the monotonic clock's
    /// (what the duration is measured on, whatever the wall clock does).
    start: u64,
    started: Instant,
}

impl Begun {
    fn new(tracer: Tracer, context: Context, parent: Option<SpanId>, tracestate: Option<String>) -> Begun {
        Begun { tracer, context, parent, tracestate, start: unix_nanos(), started: Instant::now() }
    }

    /// Unix time now in nanoseconds, on this span's clock (for events).
    pub fn now(&self) -> u64 {
        self.start + self.started.elapsed().as_nanos() as u64
    }

    /// Ends the span now and hands it to the exporter: never waits.
    /// `describe` says what the span says; it is not even called when the
    /// span would go nowhere (not sampled; or the export queue is full, a
    /// collector down: the drop is counted), so that costs next to nothing.
    pub fn end(self, describe: impl FnOnce() -> Described) {
        let Some(shared) = self.tracer.0.as_ref().filter(|_| self.context.sampled) else { return };
        if !shared.queue.has_room() {
            shared.queue.dropped();
            return;
        }
        let end = self.now();
        let Described { name, kind, attributes, events, error } = describe();
        let Begun { tracer, context, parent, tracestate, start, .. } = self;
        tracer.export(Span {
            trace: context.trace,
            span: context.span,
            parent,
            tracestate,
            name,
            kind,
            start,
            end,
            attributes,
            events,
            error,
        });
    }
}

/// A long span (a Shiny session) that gathers attributes and events as it
/// goes and is exported when dropped, however its owner ends.
pub struct Live {
    begun: Option<Begun>,
    name: &'static str,
    kind: Kind,
    attributes: Attributes,
    events: Vec<Event>,
}

impl Live {
    pub fn new(begun: Begun, name: &'static str, kind: Kind, attributes: Attributes) -> Live {
        Live { begun: Some(begun), name, kind, attributes, events: Vec::new() }
    }

    /// Sets an attribute, replacing an earlier value of it.
    pub fn set(&mut self, key: &'static str, value: Value) {
        match self.attributes.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => *v = value,
            None => self.attributes.push((key, value)),
        }
    }

    /// Drops the span unsent: what it was to describe never began (a
    /// WebSocket whose upgrade failed is no session).
    pub fn discard(mut self) {
        self.begun = None;
    }

    /// Adds one to an integer attribute (0 if it had none).
    pub fn count(&mut self, key: &'static str) {
        let n = match self.attributes.iter().find(|(k, _)| *k == key) {
            Some((_, Value::Int(n))) => *n,
            _ => 0,
        };
        self.set(key, Value::Int(n + 1));
    }

    /// Notes an event now (the first `MAX_EVENTS` are kept).
    pub fn event(&mut self, name: &'static str, attributes: Attributes) {
        if let Some(begun) = &self.begun {
            if self.events.len() < MAX_EVENTS {
                self.events.push(Event { name, at: begun.now(), attributes });
            }
        }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        if let Some(begun) = self.begun.take() {
            begun.end(|| Described {
                name: self.name.to_string(),
                kind: self.kind,
                attributes: std::mem::take(&mut self.attributes),
                events: std::mem::take(&mut self.events),
                error: None,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{TRACEPARENT, TRACESTATE};
    use super::*;

    fn on() -> (Tracer, tokio::sync::mpsc::Receiver<Span>) {
        let (queue, rx, _) = Queue::new(8, Arc::new(Registry::default()));
        let shared = Shared { queue, stop: CancellationToken::new(), task: Mutex::new(None) };
        (Tracer(Some(Arc::new(shared))), rx)
    }

    fn headers(pairs: &[(&'static http::HeaderName, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, http::HeaderValue::from_static(v));
        }
        h
    }

    fn described_span(attributes: Attributes) -> Described {
        Described { name: "GET".into(), kind: Kind::Server, attributes, events: vec![], error: None }
    }

    const CALLER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn off_does_nothing_and_leaves_the_callers_headers_alone() {
        assert!(Tracer::off().begin(&headers(&[(&TRACEPARENT, CALLER)])).is_none());
        assert!(Tracer::off().child(&on().0.begin(&HeaderMap::new()).unwrap().context).is_none());
    }

    #[test]
    fn a_request_continues_its_callers_trace_and_r_gets_valves_span() {
        let (tracer, mut rx) = on();
        let mut h = headers(&[(&TRACEPARENT, CALLER), (&TRACESTATE, "rojo=1")]);
        let begun = tracer.begin(&h).unwrap();
        let cx = begun.context;
        assert_eq!(cx.trace.hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert!(cx.sampled && cx.continued);
        cx.to_r(&mut h);
        assert_eq!(h[&TRACEPARENT], format!("00-4bf92f3577b34da6a3ce929d0e0e4736-{}-01", cx.span.hex()));
        assert_eq!(h[&TRACESTATE], "rojo=1", "tracestate goes on with its trace");
        begun.end(|| described_span(vec![("a", Value::Int(1))]));
        let span = rx.try_recv().unwrap();
        assert_eq!(span.parent.map(|p| p.hex()).as_deref(), Some("00f067aa0ba902b7"));
        assert_eq!(span.tracestate.as_deref(), Some("rojo=1"));
        assert!(span.end >= span.start && span.start > 0);
    }

    #[test]
    fn without_a_valid_traceparent_a_new_trace_starts_and_tracestate_is_dropped() {
        let (tracer, mut rx) = on();
        for bad in [None, Some("00-zz")] {
            let mut h = headers(&[(&TRACESTATE, "rojo=1")]);
            if let Some(b) = bad {
                h.insert(&TRACEPARENT, http::HeaderValue::from_static(b));
            }
            let begun = tracer.begin(&h).unwrap();
            assert!(begun.context.sampled && !begun.context.continued);
            begun.context.to_r(&mut h);
            assert!(h.get(&TRACESTATE).is_none());
            assert_eq!(context::parse(h[&TRACEPARENT].as_bytes()).unwrap().span, begun.context.span);
            begun.end(|| described_span(vec![]));
            let span = rx.try_recv().unwrap();
            assert_eq!((span.parent, span.tracestate), (None, None));
        }
    }

    #[test]
    fn a_caller_that_does_not_sample_is_followed_and_nothing_is_exported() {
        let (tracer, mut rx) = on();
        let mut h = headers(&[(&TRACEPARENT, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")]);
        let begun = tracer.begin(&h).unwrap();
        begun.context.to_r(&mut h);
        assert!(h[&TRACEPARENT].to_str().unwrap().ends_with("-00"), "R is told the trace is not sampled");
        begun.end(|| described_span(vec![]));
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn a_span_that_would_go_nowhere_is_never_described_and_a_full_queue_counts_it() {
        let registry = Arc::new(Registry::default());
        let (queue, mut rx, _) = Queue::new(1, registry.clone());
        let shared = Shared { queue, stop: CancellationToken::new(), task: Mutex::new(None) };
        let tracer = Tracer(Some(Arc::new(shared)));
        let described = std::cell::Cell::new(0);
        let describe = || {
            described.set(described.get() + 1);
            described_span(vec![])
        };
        tracer.begin(&HeaderMap::new()).unwrap().end(describe);
        tracer.begin(&HeaderMap::new()).unwrap().end(describe);
        assert_eq!(described.get(), 1, "the queue was full for the second");
        assert_eq!(registry.trace.dropped_for(crate::metrics::SpanDrop::QueueFull), 1);
        let unsampled = headers(&[(&TRACEPARENT, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")]);
        assert!(rx.try_recv().is_ok());
        tracer.begin(&unsampled).unwrap().end(describe);
        assert_eq!(described.get(), 1, "not sampled: not described");
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn a_live_span_is_a_child_exported_when_dropped_with_what_it_gathered() {
        let (tracer, mut rx) = on();
        let parent = tracer.begin(&HeaderMap::new()).unwrap();
        let mut live =
            Live::new(tracer.child(&parent.context).unwrap(), "session", Kind::Internal, vec![("n", Value::Int(0))]);
        for _ in 0..MAX_EVENTS + 3 {
            live.event("resumed", vec![]);
        }
        live.count("n");
        live.count("n");
        live.count("m");
        drop(live);
        let never = Live::new(tracer.child(&parent.context).unwrap(), "session", Kind::Internal, vec![]);
        never.discard();
        let span = rx.try_recv().unwrap();
        assert_eq!((span.trace, span.parent), (parent.context.trace, Some(parent.context.span)));
        assert_eq!(span.attributes, [("n", Value::Int(2)), ("m", Value::Int(1))]);
        assert_eq!(span.events.len(), MAX_EVENTS);
        assert!(rx.try_recv().is_err(), "a discarded span is not exported");
    }
}
