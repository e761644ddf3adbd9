//! The bounded queue between the requests and the exporter: offering a span
//! never waits; a span that finds the queue full is dropped and counted
//! (`valve_trace_spans_dropped_total{reason="queue_full"}`). While the
//! exporter waits out a failing collector it pauses the queue: spans are
//! then dropped as they end, before anyone describes them, and counted
//! (`reason="collector_down"`), so a collector that is down costs requests
//! next to nothing and holds no memory.

use std::sync::atomic::{AtomicBool, Ordering};
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
    paused: Arc<AtomicBool>,
}

/// The exporter's switch on the queue.
pub struct Pause {
    paused: Arc<AtomicBool>,
    registry: Arc<Registry>,
}

impl Queue {
    pub fn new(capacity: usize, registry: Arc<Registry>) -> (Queue, mpsc::Receiver<Span>, Pause) {
        let (tx, rx) = mpsc::channel(capacity);
        let paused = Arc::new(AtomicBool::new(false));
        let pause = Pause { paused: paused.clone(), registry: registry.clone() };
        (Queue { tx, registry, paused }, rx, pause)
    }

    /// Whether a span offered now would be queued: the queue is not paused
    /// and has room (the exporter keeps up).
    pub fn has_room(&self) -> bool {
        !self.paused.load(Ordering::Relaxed) && self.tx.capacity() > 0
    }

    /// Counts a span that was not even offered: the queue was paused or full.
    pub fn dropped(&self) {
        let why = if self.paused.load(Ordering::Relaxed) { SpanDrop::CollectorDown } else { SpanDrop::QueueFull };
        self.registry.trace.dropped(why, 1);
    }

    /// Queues `span` for export, or drops and counts it if the queue is
    /// paused or full (or the exporter has stopped). Never waits.
    pub fn offer(&self, span: Span) -> bool {
        if self.paused.load(Ordering::Relaxed) {
            self.dropped();
            return false;
        }
        match self.tx.try_send(span) {
            Ok(()) => true,
            Err(_) => {
                self.dropped();
                false
            }
        }
    }
}

impl Pause {
    /// The collector fails: spans are dropped as they end, and those queued
    /// now (taken from `rx`) go too, counted.
    pub fn pause(&self, rx: &mut mpsc::Receiver<Span>) {
        self.paused.store(true, Ordering::Relaxed);
        let mut queued = 0;
        while rx.try_recv().is_ok() {
            queued += 1;
        }
        self.registry.trace.dropped(SpanDrop::CollectorDown, queued);
    }

    /// The exporter tries the collector again: spans are queued again.
    pub fn resume(&self) {
        self.paused.store(false, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span() -> Span {
        Span::bare("GET /*")
    }

    #[test]
    fn a_full_or_paused_queue_drops_and_counts_and_takes_again_once_drained_or_resumed() {
        let registry = Arc::new(Registry::default());
        let (queue, mut rx, pause) = Queue::new(2, registry.clone());
        assert!(queue.has_room());
        let offered: Vec<bool> = (0..5).map(|_| queue.offer(span())).collect();
        assert_eq!(offered, [true, true, false, false, false]);
        assert!(!queue.has_room());
        assert_eq!(registry.trace.dropped_for(SpanDrop::QueueFull), 3);
        assert!(rx.try_recv().is_ok());
        assert!(queue.offer(span()), "room again once the exporter took one");
        assert_eq!(registry.trace.dropped_for(SpanDrop::QueueFull), 3);
        pause.pause(&mut rx);
        assert!(rx.try_recv().is_err(), "pausing empties the queue");
        assert_eq!(registry.trace.dropped_for(SpanDrop::CollectorDown), 2);
        assert!(!queue.has_room() && !queue.offer(span()), "a paused queue takes nothing");
        queue.dropped();
        assert_eq!(registry.trace.dropped_for(SpanDrop::CollectorDown), 4);
        pause.resume();
        assert!(queue.has_room() && queue.offer(span()));
        drop(rx);
        assert!(!queue.offer(span()), "an exporter that stopped takes nothing");
        assert_eq!(registry.trace.dropped_for(SpanDrop::QueueFull), 4);
        assert_eq!(registry.trace.dropped_for(SpanDrop::ExportFailed), 0);
    }
}
