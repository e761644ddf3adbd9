//! The exporter's one task: it takes spans from the queue in batches (up to
//! `BATCH`, or whatever came within `BATCH_DELAY` of a batch's first span),
//! POSTs each batch as OTLP JSON within `EXPORT_TIMEOUT`, and never sends a
//! batch twice: a failed batch is dropped and counted, and the next one
//! waits out a backoff (1 s, doubling up to 30 s) with the queue paused
//! (spans that end meanwhile are dropped undescribed, counted). Failures are
//! logged at most once every `WARN_EVERY`, saying how many went unlogged.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::Request;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::otlp::{self, Resource};
use super::queue::Pause;
use super::{Span, TraceId};
use crate::config::Otlp;
use crate::metrics::{Registry, SpanDrop};

/// The most spans in one POST (OpenTelemetry's batch processor's default).
pub const BATCH: usize = 512;
/// The longest a span waits for its batch to fill.
pub const BATCH_DELAY: Duration = Duration::from_secs(1);
/// The longest one export may take, connecting included (OTLP's default).
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_MOST: Duration = Duration::from_secs(30);
/// How often, at most, a failing collector is logged.
pub const WARN_EVERY: Duration = Duration::from_secs(5);
/// The most of a collector's answer valve reads.
const MAX_ANSWER: usize = 64 * 1024;

/// Drains `spans` into the collector until `stop` fires, then sends what is
/// queued (unless the collector was just failing) and ends. While it waits
/// out a failing collector the queue is paused (`pause`).
pub async fn run(
    mut spans: mpsc::Receiver<Span>,
    pause: Pause,
    otlp: Otlp,
    registry: Arc<Registry>,
    stop: CancellationToken,
) {
    let resource = Resource::new(&otlp.service, &instance_id(), &otlp.resource);
    let mut collector = Collector { otlp, kept: None };
    let mut warning = Warning::default();
    let mut backoff: Option<Duration> = None;
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        let open = gather(&mut spans, &mut batch, &stop).await;
        if !open && backoff.is_some() {
            // Stopping, and the collector was failing: do not hold valve's exit for it.
            break;
        }
        if !batch.is_empty() {
            let n = batch.len() as u64;
            let body = otlp::encode(&resource, &batch);
            batch.clear();
            match tokio::time::timeout(EXPORT_TIMEOUT, collector.post(Bytes::from(body))).await {
                Ok(Ok(rejected)) => {
                    registry.trace.exported(n - rejected.min(n));
                    registry.trace.dropped(SpanDrop::Rejected, rejected.min(n));
                    backoff = None;
                    warning.succeeded(&collector.otlp.url);
                }
                failed => {
                    let why = match failed {
                        Ok(Err(why)) => why,
                        _ => format!("no answer within {} s", EXPORT_TIMEOUT.as_secs()),
                    };
                    collector.kept = None;
                    registry.trace.dropped(SpanDrop::ExportFailed, n);
                    let wait = backoff.map_or(BACKOFF_FIRST, |b| (b * 2).min(BACKOFF_MOST));
                    backoff = Some(wait);
                    warning.failed(&collector.otlp.url, &why, n, wait);
                    pause.pause(&mut spans);
                }
            }
        }
        if !open {
            if spans.is_empty() {
                break;
            }
            continue;
        }
        if let Some(wait) = backoff {
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.cancelled() => {}
            }
            // Spans for the next try: if it fails too, the queue pauses again.
            pause.resume();
        }
    }
}

/// Waits for a batch's first span, then takes more until the batch is full
/// or `BATCH_DELAY` passed. False once `stop` fired (the batch then holds
/// what was queued, up to `BATCH`).
async fn gather(spans: &mut mpsc::Receiver<Span>, batch: &mut Vec<Span>, stop: &CancellationToken) -> bool {
    if !stop.is_cancelled() {
        tokio::select! {
            n = spans.recv_many(batch, BATCH) => {
                if n == 0 {
                    return false;
                }
                let deadline = Instant::now() + BATCH_DELAY;
                while batch.len() < BATCH {
                    let room = BATCH - batch.len();
                    tokio::select! {
                        n = spans.recv_many(batch, room) => if n == 0 { return false },
                        _ = tokio::time::sleep_until(deadline) => break,
                        _ = stop.cancelled() => break,
                    }
                }
                return true;
            }
            _ = stop.cancelled() => {}
        }
    }
    spans.close();
    while batch.len() < BATCH {
        match spans.try_recv() {
            Ok(span) => batch.push(span),
            Err(_) => break,
        }
    }
    false
}

/// The collector's endpoint and a connection kept to it between batches.
struct Collector {
    otlp: Otlp,
    kept: Option<SendRequest<Full<Bytes>>>,
}

impl Collector {
    /// POSTs one body; the number of spans the collector says it rejected.
    /// A kept connection the collector closed meanwhile is replaced once.
    async fn post(&mut self, body: Bytes) -> Result<u64, String> {
        let answer = match self.kept.take().filter(|s| !s.is_closed()) {
            Some(mut sender) => match sender.send_request(self.request(body.clone())).await {
                Ok(answer) => (answer, sender),
                Err(_) => self.fresh(body).await?,
            },
            None => self.fresh(body).await?,
        };
        let (answer, sender) = answer;
        let status = answer.status();
        let read = Limited::new(answer.into_body(), MAX_ANSWER).collect().await;
        let text = match read {
            Ok(collected) => {
                self.kept = Some(sender);
                collected.to_bytes()
            }
            Err(_) => Bytes::new(),
        };
        if status.is_success() {
            return Ok(otlp::rejected(&text));
        }
        let said = String::from_utf8_lossy(&text[..text.len().min(200)]).trim().to_string();
        Err(format!("it answered {status}{}", if said.is_empty() { String::new() } else { format!(": {said}") }))
    }

    fn request(&self, body: Bytes) -> Request<Full<Bytes>> {
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = http::Method::POST;
        *req.uri_mut() = self.otlp.path.parse().unwrap_or_else(|_| http::Uri::from_static("/v1/traces"));
        let h = req.headers_mut();
        if let Ok(host) = HeaderValue::from_str(&self.otlp.authority) {
            h.insert(header::HOST, host);
        }
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        req
    }

    async fn fresh(
        &self,
        body: Bytes,
    ) -> Result<(http::Response<hyper::body::Incoming>, SendRequest<Full<Bytes>>), String> {
        let mut sender = crate::client::connect(&self.otlp.host, self.otlp.port, "trace collector").await?;
        let answer = sender.send_request(self.request(body)).await.map_err(|e| e.to_string())?;
        Ok((answer, sender))
    }
}

/// Says a collector fails at most once every `WARN_EVERY`, and once that it
/// takes spans again.
#[derive(Default)]
struct Warning {
    last: Option<Instant>,
    failing: bool,
    unlogged: u64,
}

impl Warning {
    fn failed(&mut self, endpoint: &str, why: &str, spans: u64, retry_in: Duration) {
        self.failing = true;
        let now = Instant::now();
        if self.last.is_some_and(|at| now.saturating_duration_since(at) < WARN_EVERY) {
            self.unlogged += 1;
            return;
        }
        self.last = Some(now);
        let unlogged = std::mem::take(&mut self.unlogged);
        tracing::warn!(endpoint, error = %why, dropped_spans = spans, unlogged_failures = unlogged,
            next_try_s = retry_in.as_secs(), "cannot export spans to the trace collector; dropped them (requests are not slowed)");
    }

    fn succeeded(&mut self, endpoint: &str) {
        if std::mem::take(&mut self.failing) {
            tracing::info!(endpoint, "the trace collector takes spans again");
        }
    }
}

/// A random UUID (version 4) naming this valve process (`service.instance.id`).
fn instance_id() -> String {
    let mut b = TraceId::random().0;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = TraceId(b).hex();
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use hyper_util::rt::TokioIo;

    use super::*;

    fn span() -> Span {
        Span::bare("GET /*")
    }

    /// What a collector on loopback saw: each POST's path, content type and body.
    type Seen = Arc<Mutex<Vec<(String, String, serde_json::Value)>>>;

    /// A collector that answers the n-th POST with `answers[n]` (the last one after that).
    async fn collector(answers: Vec<(u16, &'static str)>) -> (u16, Seen) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen: Seen = Arc::default();
        let log = seen.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let (log, answers) = (log.clone(), answers.clone());
                let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let (log, answers) = (log.clone(), answers.clone());
                    async move {
                        let path = req.uri().path().to_string();
                        let ctype = req.headers()[header::CONTENT_TYPE].to_str().unwrap().to_string();
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let n = {
                            let mut log = log.lock().unwrap();
                            log.push((path, ctype, serde_json::from_slice(&body).unwrap()));
                            log.len() - 1
                        };
                        let (status, text) = answers[n.min(answers.len() - 1)];
                        let mut resp = http::Response::new(Full::new(Bytes::from_static(text.as_bytes())));
                        *resp.status_mut() = http::StatusCode::from_u16(status).unwrap();
                        Ok::<_, std::convert::Infallible>(resp)
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        (port, seen)
    }

    async fn until(what: &str, cond: impl Fn() -> bool) {
        let start = std::time::Instant::now();
        while !cond() {
            assert!(start.elapsed() < Duration::from_secs(20), "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_failed_batch_is_dropped_and_counted_never_sent_again_and_the_next_goes_after_a_backoff() {
        let (port, seen) =
            collector(vec![(503, "overloaded"), (200, r#"{"partialSuccess":{"rejectedSpans":"1"}}"#), (200, "{}")])
                .await;
        let otlp = Otlp {
            url: format!("http://127.0.0.1:{port}/v1/traces"),
            host: "127.0.0.1".into(),
            port,
            authority: format!("127.0.0.1:{port}"),
            path: "/v1/traces".into(),
            service: "valve".into(),
            resource: vec![],
        };
        let registry = Arc::new(Registry::default());
        let (queue, spans, pause) = super::super::queue::Queue::new(16, registry.clone());
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(spans, pause, otlp, registry.clone(), stop.clone()));
        let t = &registry.trace;
        for _ in 0..3 {
            queue.offer(span());
        }
        until("the first batch to fail", || t.dropped_for(SpanDrop::ExportFailed) == 3).await;
        // Waiting out the failure, the queue is paused (it keeps nothing: queue::tests), then resumed.
        until("the queue to pause", || !queue.has_room()).await;
        until("the exporter to try again", || queue.has_room()).await;
        for _ in 0..2 {
            queue.offer(span());
        }
        until("the second batch", || seen.lock().unwrap().len() == 2).await;
        until("its count", || t.dropped_for(SpanDrop::Rejected) == 1).await;
        {
            let seen = seen.lock().unwrap();
            assert_eq!(seen.len(), 2, "the failed batch was not sent again");
            let spans = |i: usize| seen[i].2["resourceSpans"][0]["scopeSpans"][0]["spans"].as_array().unwrap().len();
            assert_eq!((spans(0), spans(1)), (3, 2));
            assert!(seen.iter().all(|(path, ctype, _)| path == "/v1/traces" && ctype == "application/json"));
        }
        queue.offer(span());
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(10), task).await.unwrap().unwrap();
        assert_eq!(seen.lock().unwrap().len(), 3, "what was queued at the stop was sent");
        assert_eq!(t.dropped_for(SpanDrop::QueueFull), 0);
        let out = registry.render(&Default::default(), 0, 0);
        assert!(out.contains("valve_trace_spans_exported_total 2\n"), "{out}");
    }

    #[test]
    fn the_instance_id_is_a_version_4_uuid() {
        let id = instance_id();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert!(matches!(&id[19..20], "8" | "9" | "a" | "b"), "{id}");
        assert_ne!(id, instance_id());
    }
}
