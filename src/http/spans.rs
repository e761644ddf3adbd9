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
use crate::trace::{Begun, Context, Described, Kind, Live, Tracer, Value};
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

/// A request's span, begun as it arrived. What it will say is kept as the
/// request had it (shared buffers, no copies) until the span is described.
pub(super) struct RequestSpan {
    begun: Begun,
    method: Method,
    uri: http::Uri,
    version: http::Version,
    host: Option<http::HeaderValue>,
    user_agent: Option<http::HeaderValue>,
    peer: SocketAddr,
}

impl RequestSpan {
    /// Begins the span of `req` (continuing its caller's trace); `None`
    /// when traces are off, at the cost of one branch.
    pub(super) fn begin<B>(tracer: &Tracer, req: &Request<B>, peer: SocketAddr) -> Option<RequestSpan> {
        let begun = tracer.begin(req.headers())?;
        Some(RequestSpan {
            begun,
            method: req.method().clone(),
            uri: req.uri().clone(),
            version: req.version(),
            host: req.headers().get(header::HOST).cloned(),
            user_agent: req.headers().get(header::USER_AGENT).cloned(),
            peer,
        })
    }

    pub(super) fn context(&self) -> Context {
        self.begun.context
    }

    /// Ends the span with what became of the request: its status, the
    /// worker that answered it (if any) after `waited` in the queue. The
    /// attributes are written only if the span goes anywhere.
    pub(super) fn end(self, app: &AppConfig, status: u16, worker: Option<WorkerId>, waited: Duration, t: &Traced) {
        let RequestSpan { begun, method, uri, version, host, user_agent, peer } = self;
        begun.end(|| {
            let (method, original) = known_method(&method);
            let route = route(&app.prefix);
            let name = format!("{} {route}", if original.is_some() { "HTTP" } else { method });
            let mut a = vec![
                ("http.request.method", Value::Str(method.to_string())),
                ("url.path", Value::Str(uri.path().to_string())),
                ("url.scheme", Value::Str("http".into())),
                ("http.route", Value::Str(route)),
                ("http.response.status_code", Value::Int(i64::from(status))),
                ("network.protocol.version", Value::Str(protocol(version).into())),
                ("network.peer.address", Value::Str(peer.ip().to_string())),
                ("network.peer.port", Value::Int(i64::from(peer.port()))),
                ("client.address", Value::Str(t.client.unwrap_or(peer.ip()).to_string())),
                ("valve.app", Value::Str(app.name.clone())),
            ];
            if let Some(original) = original {
                a.push(("http.request.method_original", Value::Str(original)));
            }
            let authority = match host.as_ref().and_then(|h| h.to_str().ok()) {
                Some(h) => h.parse::<http::uri::Authority>().ok(),
                None => uri.authority().cloned(),
            };
            if let Some(authority) = authority {
                a.push(("server.address", Value::Str(authority.host().to_string())));
                if let Some(port) = authority.port_u16() {
                    a.push(("server.port", Value::Int(i64::from(port))));
                }
            }
            if let Some(agent) = user_agent.as_ref().and_then(|v| v.to_str().ok()) {
                a.push(("user_agent.original", Value::Str(agent.to_string())));
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
            Described { name, kind: Kind::Server, attributes: a, events: Vec::new(), error }
        });
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

fn protocol(v: http::Version) -> &'static str {
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
        assert_eq!((protocol(http::Version::HTTP_10), protocol(http::Version::HTTP_11)), ("1.0", "1.1"));
    }
}
