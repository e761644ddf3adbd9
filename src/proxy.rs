//! HTTP in, HTTP out. Takes a client's request, asks the supervisor for a
//! worker, forwards the request and streams the answer back. It never starts or
//! stops a worker itself.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Either, Empty, Full};
use hyper::body::Incoming;

use crate::admin::Admin;
use crate::body::{self, ReqBody, Upload, UploadError};
use crate::config::Config;
use crate::metrics::{ExitReason, Rejection};
use crate::supervisor::{Lease, SendError, Supervisor, Unavailable};
use crate::worker;
use hyper_util::rt::TokioIo;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

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
    max_body_size: u64,
    request_timeout: Option<Duration>,
    access_log: bool,
    /// valve's own pages, when they are served on the main port.
    admin: Option<Arc<Admin>>,
    /// Shiny: requests are routed by sticky cookie, WebSockets are proxied.
    shiny: bool,
    /// Names this valve run in sticky cookies, so a cookie from an earlier run
    /// is not taken for a worker of this one.
    run_nonce: String,
    /// Open WebSocket sessions, so the drain can wait for them.
    pub sessions: TaskTracker,
    /// Fired when the drain gives up on open sessions.
    pub close_sessions: CancellationToken,
    /// Fired when a stop was asked for: answers carry `Connection: close`.
    closing: CancellationToken,
}

/// The sticky cookie that ties a browser to its Shiny worker.
const STICKY_COOKIE: &str = "valve_worker";

/// How often a request that never reached a worker (its socket refused) is
/// tried on another one before the client gets 502.
const CONNECT_TRIES: usize = 3;

/// Which worker served a request and how long it waited, for the access log.
#[derive(Default)]
struct Served {
    worker: Option<u64>,
    waited: Duration,
}

impl Proxy {
    pub fn new(
        sup: Arc<Supervisor>,
        config: &Config,
        admin: Option<Arc<Admin>>,
        closing: CancellationToken,
    ) -> Arc<Self> {
        Arc::new(Proxy {
            sup,
            max_body_size: config.max_body_size,
            request_timeout: config.request_timeout,
            access_log: config.access_log,
            admin,
            shiny: config.app.is_shiny(),
            run_nonce: format!("{:x}", u64::from(std::process::id()) ^ nonce_seed()),
            sessions: TaskTracker::new(),
            close_sessions: CancellationToken::new(),
            closing,
        })
    }

    /// Answers one client request. Every failure becomes a short JSON answer.
    /// Once a stop was asked for, every answer closes its connection, so
    /// clients reconnect (through their load balancer) to a valve that stays.
    pub async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        peer: SocketAddr,
    ) -> Result<Response<ProxyBody>, Infallible> {
        let closing = self.closing.clone();
        let mut resp = self.answer(req, peer).await;
        if closing.is_cancelled() && resp.status() != StatusCode::SWITCHING_PROTOCOLS {
            resp.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        Ok(resp)
    }

    async fn answer(self: Arc<Self>, req: Request<Incoming>, peer: SocketAddr) -> Response<ProxyBody> {
        if req.uri().path().starts_with(RESERVED_PREFIX) {
            return match &self.admin {
                Some(admin) => admin.handle(req.uri().path()),
                None => error(StatusCode::NOT_FOUND, "no such valve path"),
            };
        }
        let start = Instant::now();
        let method = req.method().clone();
        // The path only: query strings can carry secrets.
        let path = self.access_log.then(|| req.uri().path().to_owned());
        let mut served = Served::default();
        let resp = if declared_length(req.headers()).is_some_and(|len| len > self.max_body_size) {
            // Refused before any worker is touched.
            self.sup.metrics.reject(Rejection::BodyTooLarge);
            too_large(self.max_body_size)
        } else if self.shiny {
            self.forward_shiny(req, peer, &mut served).await
        } else {
            self.forward(req, peer, &mut served).await
        };
        let took = start.elapsed();
        let status = resp.status().as_u16();
        self.sup.metrics.request(&method, status, took);
        if let Some(path) = path {
            tracing::info!(
                target: "valve::access",
                method = %method,
                path = %path,
                status,
                duration_ms = took.as_secs_f64() * 1e3,
                queue_ms = served.waited.as_secs_f64() * 1e3,
                worker = served.worker,
                "request"
            );
        }
        resp
    }

    async fn forward(&self, req: Request<Incoming>, peer: SocketAddr, served: &mut Served) -> Response<ProxyBody> {
        let root = req.uri().path() == "/" && matches!(*req.method(), Method::GET | Method::HEAD);
        let mut outgoing = to_worker(req, peer, self.max_body_size);
        // Replayed once if its worker dies before answering.
        let mut spare = replay_copy(&outgoing);
        let mut refused = 0;
        let resp = loop {
            let mut lease = match self.sup.acquire().await {
                Ok(lease) => lease,
                Err(e) => return unavailable(&e),
            };
            let worker = lease.worker();
            served.worker = Some(worker);
            served.waited += lease.waited();
            if let Err(e) = lease.connect().await {
                tracing::warn!(worker, error = %e, "worker unreachable; taking it out of service");
                lease.retire(ExitReason::Broken);
                refused += 1;
                if refused < CONNECT_TRIES {
                    continue;
                }
                self.sup.metrics.reject(Rejection::WorkerFailed);
                return error(StatusCode::BAD_GATEWAY, "no R worker could be reached");
            }
            match exchange(lease, outgoing, self.request_timeout).await {
                Ok(answer) => break answer,
                Err(SendError::Timeout(_, limit)) => {
                    let msg = format!(
                        "the R worker took longer than --request-timeout ({}s) and was restarted",
                        limit.as_secs_f64()
                    );
                    self.sup.metrics.reject(Rejection::RequestTimeout);
                    return error(StatusCode::GATEWAY_TIMEOUT, &msg);
                }
                Err(SendError::Http(_, e)) => {
                    match body::upload_error(&e) {
                        Some(UploadError::TooLarge(limit)) => {
                            self.sup.metrics.reject(Rejection::BodyTooLarge);
                            return too_large(*limit);
                        }
                        Some(UploadError::Client(_)) => {
                            return error(StatusCode::BAD_REQUEST, "the request body could not be read")
                        }
                        None => {}
                    }
                    tracing::warn!(worker, error = %e, "worker failed while handling a request; taken out of service");
                    match spare.take() {
                        Some(again) => outgoing = again,
                        None => {
                            self.sup.metrics.reject(Rejection::WorkerFailed);
                            return error(StatusCode::BAD_GATEWAY, "the R worker died while handling the request");
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(worker, error = %e, "request to worker failed");
                    self.sup.metrics.reject(Rejection::WorkerFailed);
                    return error(StatusCode::BAD_GATEWAY, "the R worker failed to answer");
                }
            }
        };
        if root && resp.status() == StatusCode::NOT_FOUND {
            // The API has no `/` route: send people to the docs, as the reference tool did.
            return redirect(DOCS_PATH);
        }
        resp
    }
}

impl Proxy {
    /// Shiny: every request of a browser goes to its sticky worker; a WebSocket
    /// upgrade is proxied both ways and counts as a session on that worker.
    async fn forward_shiny(
        &self,
        mut req: Request<Incoming>,
        peer: SocketAddr,
        served: &mut Served,
    ) -> Response<ProxyBody> {
        let mut wanted = sticky_worker(req.headers(), &self.run_nonce);
        let websocket = is_websocket(&req);
        let client_upgrade = websocket.then(|| hyper::upgrade::on(&mut req));
        let mut outgoing = to_worker(req, peer, self.max_body_size);
        if websocket {
            outgoing.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            outgoing.headers_mut().insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        }
        // While nothing has come back, a request the worker could not take may go
        // to another one (the browser then gets a new sticky cookie): any request
        // when the worker cannot be reached, a bodyless GET, HEAD or OPTIONS (the
        // page, a WebSocket upgrade) when it dies before answering.
        let mut failed = 0;
        let (sticky, mut resp) = loop {
            let sticky = match self.sup.session_worker(wanted).await {
                Ok(s) => s,
                Err(e) => return unavailable(&e),
            };
            served.worker = Some(sticky.worker);
            let mut conn = match worker::connect(&sticky.socket, websocket).await {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(worker = sticky.worker, error = %e, "worker unreachable; taking it out of service");
                    self.sup.retire(sticky.worker, ExitReason::Broken);
                    failed += 1;
                    if failed >= CONNECT_TRIES {
                        self.sup.metrics.reject(Rejection::WorkerFailed);
                        return error(StatusCode::BAD_GATEWAY, "no R worker could be reached; reload the page");
                    }
                    wanted = None;
                    continue;
                }
            };
            let spare = replay_copy(&outgoing);
            let sent = async {
                conn.ready().await?;
                conn.send_request(outgoing).await
            };
            let answer = match (websocket, self.request_timeout) {
                (false, Some(limit)) => match tokio::time::timeout(limit, sent).await {
                    Ok(answer) => answer,
                    Err(_) => {
                        self.sup.metrics.reject(Rejection::RequestTimeout);
                        return error(StatusCode::GATEWAY_TIMEOUT, "the R worker took longer than --request-timeout");
                    }
                },
                _ => sent.await,
            };
            match answer {
                Ok(resp) => break (sticky, resp),
                Err(e) => {
                    tracing::warn!(worker = sticky.worker, error = %e, "request to Shiny worker failed");
                    failed += 1;
                    match spare {
                        Some(again) if failed < CONNECT_TRIES => {
                            // If the worker is dead the next connect to it is refused and
                            // takes it out of service; a live one just gets the retry.
                            outgoing = again;
                            wanted = None;
                        }
                        _ => {
                            self.sup.metrics.reject(Rejection::WorkerFailed);
                            return error(StatusCode::BAD_GATEWAY, "the R worker failed to answer");
                        }
                    }
                }
            }
        };
        let mut out = if let (Some(client), StatusCode::SWITCHING_PROTOCOLS) = (client_upgrade, resp.status()) {
            let worker_upgrade = hyper::upgrade::on(&mut resp);
            self.splice(client, worker_upgrade, sticky.worker);
            let (parts, _) = resp.into_parts();
            Response::from_parts(parts, ProxyBody::Empty)
        } else {
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, ProxyBody::Stream(body))
        };
        if sticky.new {
            let cookie =
                format!("{STICKY_COOKIE}={}.{}; Path=/; HttpOnly; SameSite=Lax", self.run_nonce, sticky.worker);
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                out.headers_mut().append(header::SET_COOKIE, v);
            }
        }
        out
    }

    /// Copies a WebSocket's bytes both ways until either side closes or the
    /// drain gives up; the session counts on its worker meanwhile.
    fn splice(&self, client: hyper::upgrade::OnUpgrade, worker: hyper::upgrade::OnUpgrade, id: u64) {
        let sup = self.sup.clone();
        let close = self.close_sessions.clone();
        self.sessions.spawn(async move {
            let (Ok(client), Ok(worker)) = tokio::join!(client, worker) else { return };
            sup.session(id, true);
            let mut client = TokioIo::new(client);
            let mut worker = TokioIo::new(worker);
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut worker) => {}
                _ = close.cancelled() => {}
            }
            sup.session(id, false);
        });
    }
}

fn is_websocket<B>(req: &Request<B>) -> bool {
    let has = |name: header::HeaderName, token: &str| {
        req.headers()
            .get_all(name)
            .iter()
            .any(|v| v.to_str().unwrap_or("").split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    };
    has(header::UPGRADE, "websocket") && has(header::CONNECTION, "upgrade")
}

/// The worker id in this run's sticky cookie, if the browser sent one.
fn sticky_worker(headers: &HeaderMap, nonce: &str) -> Option<u64> {
    headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(';')).find_map(|c| {
        let value = c.trim().strip_prefix(STICKY_COOKIE)?.strip_prefix('=')?;
        let (run, id) = value.split_once('.')?;
        (run == nonce).then(|| id.parse().ok()).flatten()
    })
}

fn nonce_seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// Sends a request to the leased worker and reads its answer (a small one
/// whole). Inline, in the client's own task: each hop between tasks costs a
/// wake-up on the request path. If the client leaves meanwhile, the dropped
/// lease keeps its worker busy until R is done (see `Lease`'s drop). A worker
/// past `timeout` is killed.
async fn exchange(
    mut lease: Lease,
    req: Request<ReqBody>,
    timeout: Option<Duration>,
) -> Result<Response<ProxyBody>, SendError> {
    let answer = match timeout {
        None => lease.send(req).await,
        Some(limit) => match tokio::time::timeout(limit, lease.send(req)).await {
            Ok(answer) => answer,
            Err(_) => {
                tracing::warn!(
                    worker = lease.worker(),
                    limit_s = limit.as_secs_f64(),
                    "request timed out; killing its worker"
                );
                lease.retire(ExitReason::Timeout);
                return Err(SendError::Timeout(lease.worker(), limit));
            }
        },
    };
    match answer {
        Ok(resp) => Ok(from_worker(resp, lease).await),
        Err(e) => {
            retire_if_broken(&mut lease, &e);
            Err(e)
        }
    }
}

/// A worker that broke off an exchange (died, or spoke garbage) is taken out
/// of service before its lease is dropped, so that it is never handed to the
/// next request in the queue.
fn retire_if_broken(lease: &mut Lease, e: &SendError) {
    if let SendError::Http(_, err) = e {
        if body::upload_error(err).is_none() {
            lease.retire(ExitReason::Broken);
        }
    }
}

/// The `Content-Length` a client declared, if any.
fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.trim().parse().ok()
}

/// A copy to send again if the worker dies before answering: only for a
/// bodyless GET, HEAD or OPTIONS, which R can safely be asked twice.
fn replay_copy(req: &Request<ReqBody>) -> Option<Request<ReqBody>> {
    let replayable =
        matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) && matches!(req.body(), Either::Right(_));
    replayable.then(|| {
        let mut copy = Request::new(Either::Right(Empty::new()));
        *copy.method_mut() = req.method().clone();
        *copy.uri_mut() = req.uri().clone();
        *copy.version_mut() = req.version();
        *copy.headers_mut() = req.headers().clone();
        copy
    })
}

fn too_large(limit: u64) -> Response<ProxyBody> {
    error(StatusCode::PAYLOAD_TOO_LARGE, &format!("the request body is larger than --max-body-size ({limit} bytes)"))
}

fn unavailable(e: &Unavailable) -> Response<ProxyBody> {
    let mut resp = error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string());
    resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    resp
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
    // Upgrades are re-added for WebSockets to Shiny apps, where valve carries them.
    headers.remove(header::UPGRADE);
}

/// The request as the worker receives it: origin-form target, no hop-by-hop
/// headers, `X-Forwarded-*` added (the client's own `X-Forwarded-For` is kept and
/// appended to, never taken as the peer address).
fn to_worker(req: Request<Incoming>, peer: SocketAddr, max_body_size: u64) -> Request<ReqBody> {
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
    let body =
        if body.is_end_stream() { Either::Right(Empty::new()) } else { Either::Left(Upload::new(body, max_body_size)) };
    Request::from_parts(parts, body)
}

/// The worker's answer as the client receives it, holding the worker until the
/// last byte is through.
/// Answers up to this size are read whole before valve answers, so that the
/// client gets head and body in one write (R writes them separately) and the
/// worker is free again before the client has read a byte.
const COALESCE_UP_TO: u64 = 64 * 1024;

async fn from_worker(resp: Response<Incoming>, mut lease: Lease) -> Response<ProxyBody> {
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let small = body.size_hint().exact().is_some_and(|n| n <= COALESCE_UP_TO);
    let body = if body.is_end_stream() {
        lease.set_reusable();
        ProxyBody::Empty
    } else if small {
        match body.collect().await {
            Ok(all) => {
                lease.set_reusable();
                ProxyBody::Full(Full::new(all.to_bytes()))
            }
            Err(e) => {
                tracing::warn!(worker = lease.worker(), error = %e, "worker's answer broke off");
                return error(StatusCode::BAD_GATEWAY, "the R worker's answer broke off");
            }
        }
    } else {
        return Response::from_parts(parts, ProxyBody::Worker { body, lease: Some(lease) });
    };
    drop(lease);
    Response::from_parts(parts, body)
}

fn redirect(location: &'static str) -> Response<ProxyBody> {
    let mut resp = Response::new(ProxyBody::Empty);
    *resp.status_mut() = StatusCode::TEMPORARY_REDIRECT;
    resp.headers_mut().insert(header::LOCATION, HeaderValue::from_static(location));
    resp
}

/// A short JSON error: `{"error": "...", "status": N}`.
pub fn error(status: StatusCode, message: &str) -> Response<ProxyBody> {
    let text = format!("{}\n", serde_json::json!({ "error": message, "status": status.as_u16() }));
    let mut resp = Response::new(ProxyBody::Full(Full::new(Bytes::from(text))));
    *resp.status_mut() = status;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// What valve sends back to a client.
pub enum ProxyBody {
    Empty,
    Full(Full<Bytes>),
    /// A Shiny worker's answer, streamed (Shiny workers are not leased).
    Stream(Incoming),
    /// A worker's answer, streamed; the lease is returned when it ends.
    Worker {
        body: Incoming,
        lease: Option<Lease>,
    },
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        // Every variant is Unpin, so plain `&mut` access is fine.
        match self.get_mut() {
            ProxyBody::Empty => Poll::Ready(None),
            ProxyBody::Full(full) => Pin::new(full).poll_frame(cx).map_err(|never| match never {}),
            ProxyBody::Stream(body) => Pin::new(body).poll_frame(cx),
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
            ProxyBody::Stream(body) => body.is_end_stream(),
            ProxyBody::Worker { body, .. } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Empty => SizeHint::with_exact(0),
            ProxyBody::Full(full) => full.size_hint(),
            ProxyBody::Stream(body) => body.size_hint(),
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
