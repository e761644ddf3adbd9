//! The bounded queue between the requests and the exporter: offering a span
//! never waits; a span that finds the queue full is dropped and counted
//! (`valve_trace_spans_dropped_total{reason="queue_full"}`).

use std::sync::Arc;

use tokio::sync::mpsc;

use super::Span;
use crate::metrics::{Registry, SpanDrop};

/// The most spans waiting for the exporter (OpenTelemetry's batch
/// processor's default `maxQueueSize`); about 2 MB at most.
pub const CAPACITY: usize = 2048;

pub struct Queue {
    tx: mpsc::Sender<Span>,
    registry: Arc<Registry>,
}

impl Queue {
    pub fn new(capacity: usize, registry: Arc<Registry>) -> (Queue, mpsc::Receiver<Span>) {
        let (tx, rx) = mpsc::channel(capacity);
        (Queue { tx, registry }, rx)
    }

    /// Whether a span offered now would be queued (the exporter is behind, or
    /// backing off from a collector that fails, when not).
    pub fn has_room(&self) -> bool {
        self.tx.capacity() > 0
    }

    /// Counts a span that was not even offered: the queue had no room.
    pub fn dropped(&self) {
        self.registry.trace.dropped(SpanDrop::QueueFull, 1);
    }

    /// Queues `span` for export, or drops and counts it if the queue is
    /// full (or the exporter has stopped). Never waits.
    pub fn offer(&self, span: Span) -> bool {
        match self.tx.try_send(span) {
            Ok(()) => true,
            Err(_) => {
                self.registry.trace.dropped(SpanDrop::QueueFull, 1);
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Kind, SpanId, TraceId};
    use super::*;

    fn span() -> Span {
        Span {
            trace: TraceId::random(),
            span: SpanId::random(),
            parent: None,
            tracestate: None,
            name: "GET".into(),
            kind: Kind::Server,
            start: 1,
            end: 2,
            attributes: vec![],
            events: vec![],
            error: None,
        }
    }

    #[test]
    fn a_full_queue_drops_and_counts_and_takes_again_once_drained() {
        let registry = Arc::new(Registry::default());
        let (queue, mut rx) = Queue::new(2, registry.clone());
        assert!(queue.has_room());
        let offered: Vec<bool> = (0..5).map(|_| queue.offer(span())).collect();
        assert_eq!(offered, [true, true, false, false, false]);
        assert!(!queue.has_room());
        assert_eq!(registry.trace.dropped_for(SpanDrop::QueueFull), 3);
        assert!(rx.try_recv().is_ok());
        assert!(queue.offer(span()), "room again once the exporter took one");
        assert_eq!(registry.trace.dropped_for(SpanDrop::QueueFull), 3);
        drop(rx);
        assert!(!queue.offer(span()), "an exporter that stopped takes nothing");
        assert_eq!(registry.trace.dropped_for(SpanDrop::QueueFull), 4);
        assert_eq!(registry.trace.dropped_for(SpanDrop::ExportFailed), 0);
    }
}
