//! What valve's spans say (the `trace` module sends them): one per request
//! to an app, an HTTP server span named and described by OpenTelemetry's
//! semantic conventions (`http.request.method`, `url.path`, `http.route`,
//! `http.response.status_code`...) with valve's own figures under `valve.`
//! (the app, the worker, the queue wait and the time in R, retries); and one
//! per Shiny session, a child of its WebSocket's request, from the socket's
//! opening to the session's end across the browser's reconnects.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use http::header;
use http::{Method, Request};

use crate::config::AppConfig;
use crate::trace::{Begun, Context, Kind, Live, Tracer, Value};
use crate::worker::WorkerId;

/// What the forwarder learns of a request for its span, besides its worker
/// and queue wait (kept whether or not traces are on: a few additions).
#[derive(Default)]
pub struct Traced {
    /// The request's span, when traces are on: R gets it as `traceparent`.
    pub context: Option<Context>,
    /// The client's address as valve decided it (behind trusted proxies).
    pub client: Option<IpAddr>,
    /// Time spent in workers' exchanges (R computing, and its answer read).
    pub in_r: Duration,
    /// Tries after the first (another worker, or the same request again).
    pub retries: u32,
}

/// A request's span, begun as it arrived.
pub(super) struct RequestSpan {
    begun: Begun,
    method: Method,
    path: String,
    version: http::Version,
    host: Option<String>,
    user_agent: Option<String>,
    peer: SocketAddr,
}

impl RequestSpan {
    /// Begins the span of `req` (continuing its caller's trace); `None`
    /// when traces are off, at the cost of one branch.
    pub(super) fn begin<B>(tracer: &Tracer, req: &Request<B>, peer: SocketAddr) -> Option<RequestSpan> {
        let begun = tracer.begin(req.headers())?;
        let text = |name| req.headers().get(name).and_then(|v: &http::HeaderValue| v.to_str().ok()).map(str::to_string);
        Some(RequestSpan {
            begun,
            method: req.method().clone(),
            path: req.uri().path().to_string(),
            version: req.version(),
            host: text(header::HOST).or_else(|| req.uri().authority().map(|a| a.to_string())),
            user_agent: text(header::USER_AGENT),
            peer,
        })
    }

    pub(super) fn context(&self) -> Context {
        self.begun.context
    }

    /// Ends the span with what became of the request: its status, the
    /// worker that answered it (if any) after `waited` in the queue.
    pub(super) fn end(self, app: &AppConfig, status: u16, worker: Option<WorkerId>, waited: Duration, t: &Traced) {
        let (method, original) = known_method(&self.method);
        let route = route(&app.prefix);
        let name = format!("{} {route}", if original.is_some() { "HTTP" } else { method });
        let mut a = vec![
            ("http.request.method", Value::Str(method.to_string())),
            ("url.path", Value::Str(self.path)),
            ("url.scheme", Value::Str("http".into())),
            ("http.route", Value::Str(route.clone())),
            ("http.response.status_code", Value::Int(i64::from(status))),
            ("network.protocol.version", Value::Str(version(self.version).into())),
            ("network.peer.address", Value::Str(self.peer.ip().to_string())),
            ("network.peer.port", Value::Int(i64::from(self.peer.port()))),
            ("client.address", Value::Str(t.client.unwrap_or(self.peer.ip()).to_string())),
            ("valve.app", Value::Str(app.name.clone())),
        ];
        if let Some(original) = original {
            a.push(("http.request.method_original", Value::Str(original)));
        }
        if let Some(authority) = self.host.as_deref().and_then(|h| h.parse::<http::uri::Authority>().ok()) {
            a.push(("server.address", Value::Str(authority.host().to_string())));
            if let Some(port) = authority.port_u16() {
                a.push(("server.port", Value::Int(i64::from(port))));
            }
        }
        if let Some(agent) = self.user_agent {
            a.push(("user_agent.original", Value::Str(agent)));
        }
        if let Some(worker) = worker {
            a.push(("valve.worker.id", Value::Int(worker as i64)));
            a.push(("valve.queue.wait_ms", Value::Float(ms(waited))));
            a.push(("valve.worker.time_ms", Value::Float(ms(t.in_r))));
        }
        if t.retries > 0 {
            a.push(("valve.retries", Value::Int(i64::from(t.retries))));
        }
        // Server spans fail on 5xx only (a 4xx is the client's).
        let error = (status >= 500).then(|| {
            a.push(("error.type", Value::Str(status.to_string())));
            String::new()
        });
        self.begun.end(name, Kind::Server, a, Vec::new(), error);
    }
}

/// The span of a Shiny session on `worker` (`resumable`: it outlives its
/// connections), a child of the request that opened its socket.
pub(super) fn session(
    tracer: &Tracer,
    parent: Option<&Context>,
    app: &AppConfig,
    worker: WorkerId,
    resumable: bool,
) -> Option<Live> {
    let begun = tracer.child(parent?)?;
    let attributes = vec![
        ("valve.app", Value::Str(app.name.clone())),
        ("valve.worker.id", Value::Int(worker as i64)),
        ("valve.shiny.resumable", Value::Bool(resumable)),
        ("valve.shiny.resumes", Value::Int(0)),
    ];
    Some(Live::new(begun, "shiny session", Kind::Internal, attributes))
}

/// A browser came back to its session after `away`.
pub(super) fn resumed(span: &mut Live, away: Duration) {
    span.event("valve.shiny.resumed", vec![("valve.shiny.away_ms", Value::Float(ms(away)))]);
    span.count("valve.shiny.resumes");
}

/// The session ended, for `reason` (`valve_shiny_sessions_ended_total`'s).
pub(super) fn ended(span: &mut Live, reason: &'static str) {
    span.set("valve.shiny.end", Value::Str(reason.to_string()));
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The method as the conventions name it, and the original when it is not
/// one they know (`_OTHER`).
fn known_method(m: &Method) -> (&'static str, Option<String>) {
    const KNOWN: [&str; 10] = ["CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "QUERY", "TRACE"];
    match KNOWN.iter().find(|k| **k == m.as_str()) {
        Some(k) => (k, None),
        None => ("_OTHER", Some(m.as_str().to_string())),
    }
}

/// valve's route to an app: everything under its prefix.
fn route(prefix: &str) -> String {
    if prefix == "/" {
        "/*".to_string()
    } else {
        format!("{prefix}/*")
    }
}

fn version(v: http::Version) -> &'static str {
    match v {
        http::Version::HTTP_09 => "0.9",
        http::Version::HTTP_10 => "1.0",
        http::Version::HTTP_2 => "2",
        http::Version::HTTP_3 => "3",
        _ => "1.1",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_routes_and_versions_are_named_as_the_conventions_say() {
        assert_eq!(known_method(&Method::GET), ("GET", None));
        let odd = Method::from_bytes(b"BREW").unwrap();
        assert_eq!(known_method(&odd), ("_OTHER", Some("BREW".into())));
        assert_eq!((route("/"), route("/sales")), ("/*".to_string(), "/sales/*".to_string()));
        assert_eq!((version(http::Version::HTTP_10), version(http::Version::HTTP_11)), ("1.0", "1.1"));
    }
}
