//! HTTP in, HTTP out. Takes a client's request, asks the supervisor for a
//! worker, forwards the request and streams the answer back. It never starts or
//! stops a worker itself.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Either, Empty, Full};
use hyper::body::Incoming;

use crate::supervisor::{Lease, SendError, Supervisor};
use crate::worker::ReqBody;

/// valve's own paths; never forwarded to R.
pub const RESERVED_PREFIX: &str = "/__valve__/";

/// Where `/` goes when the API has no `/` route of its own.
const DOCS_PATH: &str = "/__docs__/";

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Headers that belong to one connection and are never passed on (RFC 9110 7.6.1).
static HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

pub struct Proxy {
    sup: Arc<Supervisor>,
}

impl Proxy {
    pub fn new(sup: Arc<Supervisor>) -> Arc<Self> {
        Arc::new(Proxy { sup })
    }

    /// Answers one client request. Every failure becomes a short JSON answer.
    pub async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        peer: SocketAddr,
    ) -> Result<Response<ProxyBody>, Infallible> {
        if req.uri().path().starts_with(RESERVED_PREFIX) {
            return Ok(error(StatusCode::NOT_FOUND, "no such valve path"));
        }
        let root = req.uri().path() == "/" && matches!(*req.method(), Method::GET | Method::HEAD);
        let outgoing = to_worker(req, peer);
        let lease = match self.sup.acquire().await {
            Ok(lease) => lease,
            Err(e) => return Ok(error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string())),
        };
        let worker = lease.worker();
        let (resp, mut lease) = match exchange(lease, outgoing).await {
            Ok(answer) => answer,
            Err(e) => {
                tracing::warn!(worker, error = %e, "request to worker failed");
                return Ok(error(
                    StatusCode::BAD_GATEWAY,
                    "the R worker failed to answer",
                ));
            }
        };
        if root && resp.status() == StatusCode::NOT_FOUND {
            // The API has no `/` route: send people to the docs, as the reference tool did.
            if resp.into_body().collect().await.is_ok() {
                lease.set_reusable();
            }
            return Ok(redirect(DOCS_PATH));
        }
        Ok(from_worker(resp, lease))
    }
}

/// Sends a request to the leased worker and waits for the head of its answer.
/// The exchange runs in its own task: if the client goes away meanwhile, the
/// worker is still busy with the request, so the task keeps the lease until the
/// worker has answered, and only then gives it back.
async fn exchange(
    mut lease: Lease,
    req: Request<ReqBody>,
) -> Result<(Response<Incoming>, Lease), SendError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let answer = lease.send(req).await.map(|resp| (resp, lease));
        if let Err(Ok((resp, mut lease))) = tx.send(answer) {
            if resp.into_body().collect().await.is_ok() {
                lease.set_reusable();
            }
        }
    });
    rx.await.unwrap_or_else(|_| Err(SendError::Cancelled))
}

/// Removes the hop-by-hop headers, including any the `Connection` header names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    if let Some(conn) = headers.get(header::CONNECTION) {
        let named: Vec<HeaderName> = conn
            .to_str()
            .unwrap_or("")
            .split(',')
            .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    // WebSocket upgrades are not proxied yet; an upgrade the worker would accept
    // could not be carried, so the header is not passed on.
    headers.remove(header::UPGRADE);
}

/// The request as the worker receives it: origin-form target, no hop-by-hop
/// headers, `X-Forwarded-*` added (the client's own `X-Forwarded-For` is kept and
/// appended to, never taken as the peer address).
fn to_worker(req: Request<Incoming>, peer: SocketAddr) -> Request<ReqBody> {
    let (mut parts, body) = req.into_parts();
    if let Some(pq) = parts.uri.path_and_query() {
        if let Ok(uri) = pq.as_str().parse() {
            parts.uri = uri;
        }
    }
    parts.version = http::Version::HTTP_11;
    let headers = &mut parts.headers;
    strip_hop_by_hop(headers);
    let ip = peer.ip().to_string();
    let xff = match headers.get(&X_FORWARDED_FOR).and_then(|v| v.to_str().ok()) {
        Some(prior) if !prior.trim().is_empty() => format!("{prior}, {ip}"),
        _ => ip,
    };
    if let Ok(v) = HeaderValue::from_str(&xff) {
        headers.insert(X_FORWARDED_FOR.clone(), v);
    }
    if !headers.contains_key(&X_FORWARDED_PROTO) {
        headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static("http"));
    }
    if !headers.contains_key(&X_FORWARDED_HOST) {
        if let Some(host) = headers.get(header::HOST).cloned() {
            headers.insert(X_FORWARDED_HOST.clone(), host);
        }
    }
    // A request with no body is sent as one that can be replayed.
    let body = if body.is_end_stream() {
        Either::Right(Empty::new())
    } else {
        Either::Left(body)
    };
    Request::from_parts(parts, body)
}

/// The worker's answer as the client receives it, holding the worker until the
/// last byte is through.
fn from_worker(resp: Response<Incoming>, mut lease: Lease) -> Response<ProxyBody> {
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let body = if body.is_end_stream() {
        lease.set_reusable();
        drop(lease);
        ProxyBody::Empty
    } else {
        ProxyBody::Worker {
            body,
            lease: Some(lease),
        }
    };
    Response::from_parts(parts, body)
}

fn redirect(location: &'static str) -> Response<ProxyBody> {
    let mut resp = Response::new(ProxyBody::Empty);
    *resp.status_mut() = StatusCode::TEMPORARY_REDIRECT;
    resp.headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static(location));
    resp
}

/// A short JSON error: `{"error": "...", "status": N}`.
pub fn error(status: StatusCode, message: &str) -> Response<ProxyBody> {
    let text = format!(
        "{{\"error\":{},\"status\":{}}}\n",
        json_string(message),
        status.as_u16()
    );
    let mut resp = Response::new(ProxyBody::Full(Full::new(Bytes::from(text))));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// What valve sends back to a client.
pub enum ProxyBody {
    Empty,
    Full(Full<Bytes>),
    /// A worker's answer, streamed; the lease is returned when it ends.
    Worker {
        body: Incoming,
        lease: Option<Lease>,
    },
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        // Every variant is Unpin, so plain `&mut` access is fine.
        match self.get_mut() {
            ProxyBody::Empty => Poll::Ready(None),
            ProxyBody::Full(full) => Pin::new(full)
                .poll_frame(cx)
                .map_err(|never| match never {}),
            ProxyBody::Worker { body, lease } => {
                let frame = Pin::new(&mut *body).poll_frame(cx);
                match &frame {
                    Poll::Ready(None) => release(lease, true),
                    Poll::Ready(Some(Err(_))) => release(lease, false),
                    Poll::Ready(Some(Ok(_))) if body.is_end_stream() => release(lease, true),
                    _ => {}
                }
                frame
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Empty => true,
            ProxyBody::Full(full) => full.is_end_stream(),
            ProxyBody::Worker { body, .. } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Empty => SizeHint::with_exact(0),
            ProxyBody::Full(full) => full.size_hint(),
            ProxyBody::Worker { body, .. } => body.size_hint(),
        }
    }
}

/// Returns the worker as soon as its answer is complete, before the client has
/// read the last bytes from valve's buffers.
fn release(lease: &mut Option<Lease>, complete: bool) {
    if let Some(mut lease) = lease.take() {
        if complete {
            lease.set_reusable();
        }
    }
}
