//! One request from a client to an app's worker and back, for plumber and
//! Shiny alike:
//!
//! 1. valve's own checks, so only requests R can parse reach R: the method
//!    (405), the size of the request line and headers (431), a WebSocket's
//!    handshake (400), a declared body over the limit (413);
//! 2. the body read whole (memory, then a spool file) before any worker is
//!    taken: a slow upload costs a connection, never a worker;
//! 3. a worker: a `Lease` for plumber (one request at a time), the sticky
//!    worker for Shiny;
//! 4. the exchange, under `--request-timeout` (a worker past it is killed:
//!    504), with one retry rule: a request that never reached a worker goes
//!    to another; a bodyless GET, HEAD or OPTIONS whose worker died under it
//!    is sent once more, unless the worker ended itself (`quit()`, a crash):
//!    then the request is the cause and a second worker would die the same way;
//! 5. the answer: a plumber worker's is read whole at the worker's speed, so
//!    the worker goes back before the client has read a byte; a Shiny worker's
//!    is streamed (a download may be long, and Shiny workers are not leased);
//!    a WebSocket is spliced both ways.

use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body::Body;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::body::{read_whole, Payload, ReadError};
use super::identity::strip_client_identity;
use super::reply::{error, redirect, ReplyBody};
use super::router::Mounted;
use crate::app::{Lease, Retire, Sticky, Supervisor, Unavailable, WorkerId};
use crate::metrics::Rejection;
use crate::worker::{AnswerBody, ClientAddrs, Exit, SendError, WireBody};

/// The methods plumber routes and httpuv parses; anything else is answered here.
const METHODS: [Method; 7] =
    [Method::GET, Method::HEAD, Method::POST, Method::PUT, Method::DELETE, Method::OPTIONS, Method::PATCH];
const ALLOW: &str = "GET, HEAD, POST, PUT, DELETE, OPTIONS, PATCH";

/// The largest request line plus headers passed on (httpuv gives up at 80 KiB).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// How often a request that never reached a worker (its socket refused) is
/// tried on another one before the client gets 502.
const CONNECT_TRIES: usize = 3;

/// How long to wait, after an exchange broke off, for the worker's exit to
/// say whether it ended itself.
const EXIT_WAIT: Duration = Duration::from_millis(300);

/// Where `/` goes when a plumber API has no `/` route of its own.
const DOCS_PATH: &str = "/__docs__/";

/// The sticky cookie that ties a browser to its Shiny worker.
const STICKY_COOKIE: &str = "valve_worker";

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
static X_FORWARDED_PREFIX: HeaderName = HeaderName::from_static("x-forwarded-prefix");

/// Headers that belong to one connection and are never passed on (RFC 9110 7.6.1).
static HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// End-to-end headers a request needs: a `Connection` header naming them does
/// not remove them (a client could otherwise strip `Host` on its way to R).
static KEPT: [HeaderName; 6] =
    [header::HOST, header::CONTENT_LENGTH, header::CONTENT_TYPE, header::COOKIE, header::AUTHORIZATION, header::ACCEPT];

/// Which worker served a request and how long it waited, for the access log.
#[derive(Default)]
pub struct Served {
    pub worker: Option<WorkerId>,
    pub waited: Duration,
}

/// What every forwarded request shares.
pub struct Forwarder {
    /// Where bodies too big for memory are spooled (valve's private run directory).
    spool: PathBuf,
    /// The longest a client may stay silent while sending a body.
    client_timeout: Duration,
    /// Keys the sticky cookie's check, so a browser cannot name a worker it was not given.
    cookie_key: std::collections::hash_map::RandomState,
    /// Numbers the browsers placed on Shiny workers (their cookie's token).
    browsers: std::sync::atomic::AtomicU64,
    /// Open WebSocket sessions, so the drain can wait for them.
    pub sessions: TaskTracker,
    /// Fired when the drain gives up on open sessions.
    pub close_sessions: CancellationToken,
}

/// The request line and headers as a worker receives them; rebuilt for a retry.
#[derive(Clone)]
struct Head {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    /// The client's connection, for a frames worker's Rook environment.
    addrs: Option<ClientAddrs>,
}

impl Head {
    fn request(&self, payload: &Payload) -> Request<WireBody> {
        let mut req = Request::new(payload.wire());
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = self.uri.clone();
        *req.headers_mut() = self.headers.clone();
        if let Some(addrs) = self.addrs {
            req.extensions_mut().insert(addrs);
        }
        // A frames worker reads a spooled body from its file (an httpuv
        // worker gets the bytes, as ever).
        if let Some(spooled) = payload.spooled_file() {
            req.extensions_mut().insert(spooled);
        }
        req
    }
}

/// Why an exchange with a worker failed.
enum Fail {
    Timeout(Duration),
    Worker(String),
    /// The worker broke valve's protocol: its stream is lost.
    Garbage(String),
}

impl From<SendError> for Fail {
    fn from(e: SendError) -> Fail {
        match e {
            SendError::Garbage(what) => Fail::Garbage(what),
            e => Fail::Worker(e.to_string()),
        }
    }
}

/// A worker's answer: read whole (plumber) or streamed (Shiny).
enum Answer {
    Whole(Payload),
    Stream(AnswerBody),
}

/// The worker a request holds: a lease (plumber: one request at a time) or
/// the browser's sticky worker (Shiny: many sessions at once), and the
/// connection the request goes on.
enum Seat {
    Lease(Lease),
    Sticky(Sticky),
}

impl Seat {
    fn worker(&self) -> WorkerId {
        match self {
            Seat::Lease(l) => l.worker,
            Seat::Sticky(s) => s.worker,
        }
    }

    fn waited(&self) -> Duration {
        match self {
            Seat::Lease(l) => l.waited,
            Seat::Sticky(_) => Duration::ZERO,
        }
    }

    async fn connect(&mut self, upgradable: bool) -> std::io::Result<()> {
        match self {
            Seat::Lease(l) => l.connect().await,
            Seat::Sticky(s) => s.connect(upgradable).await,
        }
    }

    async fn send(&mut self, req: Request<WireBody>) -> Result<Response<AnswerBody>, SendError> {
        match self {
            Seat::Lease(l) => l.send(req).await,
            Seat::Sticky(s) => s.send(req).await,
        }
    }

    /// The exchange failed: a leased worker is retired before anyone else can
    /// have it; a Shiny worker serves other sessions, so only a refused
    /// connection or a timeout (R stuck for all of them) retires it.
    fn failed(&mut self, sup: &Arc<Supervisor>, reason: Retire) {
        match self {
            Seat::Lease(l) => l.broken(reason),
            Seat::Sticky(s) if reason != Retire::Broken || s.unreachable() => sup.retire(s.worker, reason),
            Seat::Sticky(_) => {}
        }
    }

    fn answered(&mut self, reusable: bool) {
        if let Seat::Lease(l) = self {
            l.answered(reusable);
        }
    }

    async fn exit_within(&mut self, wait: Duration) -> Option<Exit> {
        match self {
            Seat::Lease(l) => l.exit_within(wait).await,
            Seat::Sticky(s) => s.exit_within(wait).await,
        }
    }
}

impl Forwarder {
    pub fn new(spool: PathBuf, client_timeout: Duration) -> Self {
        Forwarder {
            spool,
            client_timeout,
            cookie_key: std::collections::hash_map::RandomState::new(),
            browsers: std::sync::atomic::AtomicU64::new(1),
            sessions: TaskTracker::new(),
            close_sessions: CancellationToken::new(),
        }
    }

    /// Forwards `req` to `app`, which sees `path` (its prefix taken off).
    pub async fn forward(
        &self,
        app: &Mounted,
        path: &str,
        mut req: Request<Incoming>,
        peer: SocketAddr,
        served: &mut Served,
    ) -> Response<ReplyBody> {
        let cfg = &app.config;
        let metrics = &app.sup.metrics;
        if !METHODS.contains(req.method()) {
            metrics.reject(Rejection::BadRequest);
            let mut resp = error(
                StatusCode::METHOD_NOT_ALLOWED,
                &format!("method {} is not served here; use one of {ALLOW}", req.method()),
            );
            resp.headers_mut().insert(header::ALLOW, HeaderValue::from_static(ALLOW));
            return resp;
        }
        if head_bytes(&req) > MAX_HEAD_BYTES {
            metrics.reject(Rejection::BadRequest);
            return error(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                &format!("the request line and headers are larger than {} KiB", MAX_HEAD_BYTES / 1024),
            );
        }
        let websocket = cfg.is_shiny() && is_websocket(&req);
        if websocket && !valid_websocket_handshake(&req) {
            metrics.reject(Rejection::BadRequest);
            return error(
                StatusCode::BAD_REQUEST,
                "a WebSocket upgrade needs Sec-WebSocket-Version 13 and a valid Sec-WebSocket-Key",
            );
        }
        if declared_length(req.headers()).is_some_and(|len| len > cfg.max_body_size) {
            // Refused before any worker is touched.
            metrics.reject(Rejection::BodyTooLarge);
            return too_large(cfg.max_body_size);
        }
        let client_upgrade = websocket.then(|| hyper::upgrade::on(&mut req));
        let (parts, body) = req.into_parts();
        let payload = if websocket || body.is_end_stream() {
            Payload::empty()
        } else {
            match read_whole(body, Some(cfg.max_body_size), Some(self.client_timeout), &self.spool).await {
                Ok(p) => p,
                Err(ReadError::TooLarge(limit)) => {
                    metrics.reject(Rejection::BodyTooLarge);
                    return too_large(limit);
                }
                Err(ReadError::Stalled(d)) => {
                    metrics.reject(Rejection::BadRequest);
                    return error(
                        StatusCode::REQUEST_TIMEOUT,
                        &format!("the request body stalled: nothing arrived for {}s", d.as_secs_f64()),
                    );
                }
                Err(ReadError::Broken(_)) => {
                    metrics.reject(Rejection::BadRequest);
                    return error(StatusCode::BAD_REQUEST, "the request body could not be read");
                }
                Err(e @ ReadError::Spool(_)) => {
                    tracing::error!(error = %e, "cannot hold a request body");
                    return error(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "valve could not hold the request body (disk full?)",
                    );
                }
            }
        };
        let head = worker_head(parts, path, peer, &cfg.prefix, &payload, websocket);
        let mut resp = self.exchange(app, head, payload, client_upgrade, served).await;
        if cfg.prefix != "/" {
            under_prefix(resp.headers_mut(), &cfg.prefix);
        }
        resp
    }

    /// The exchange, for plumber and Shiny alike: one worker (a lease, or the
    /// browser's sticky worker), one timeout, one retry rule.
    async fn exchange(
        &self,
        app: &Mounted,
        head: Head,
        payload: Payload,
        client_upgrade: Option<hyper::upgrade::OnUpgrade>,
        served: &mut Served,
    ) -> Response<ReplyBody> {
        let shiny = app.config.is_shiny();
        let websocket = client_upgrade.is_some();
        let mut wanted = if shiny { self.sticky_worker(&head.headers) } else { None };
        // A browser whose worker belongs to an older generation (a reload)
        // stays with it while that worker serves sessions.
        let sup: &Arc<Supervisor> = wanted
            .and_then(|(id, _)| std::iter::once(&app.sup).chain(app.older.iter()).find(|s| s.keeps(id)))
            .unwrap_or(&app.sup);
        let token = wanted.map(|(_, t)| t).unwrap_or_else(|| self.browsers.fetch_add(1, Ordering::Relaxed));
        let mut replayable = replayable(&head, &payload);
        let mut unreachable = 0;
        let (mut seat, parts, body) = loop {
            let mut seat = match if shiny {
                sup.sticky(wanted, token).await.map(Seat::Sticky)
            } else {
                sup.lease().await.map(Seat::Lease)
            } {
                Ok(seat) => seat,
                Err(e) => return unavailable(&e),
            };
            let worker = seat.worker();
            served.worker = Some(worker);
            served.waited += seat.waited();
            // Nothing is sent if this fails, so any request may go to another worker.
            if let Err(e) = seat.connect(websocket).await {
                tracing::warn!(app = %sup.settings.name, worker, error = %e, "worker unreachable; taking it out of service");
                seat.failed(sup, Retire::Broken);
                unreachable += 1;
                if unreachable < CONNECT_TRIES {
                    wanted = None;
                    continue;
                }
                sup.metrics.reject(Rejection::WorkerFailed);
                return error(StatusCode::BAD_GATEWAY, "no R worker could be reached");
            }
            let req = head.request(&payload);
            let spool = &self.spool;
            let exchange = async {
                let resp = seat.send(req).await.map_err(Fail::from)?;
                let (parts, body) = resp.into_parts();
                // A plumber answer is read whole at the worker's speed, so the worker
                // goes back before the client has read a byte; a Shiny answer streams.
                let body = if shiny {
                    Answer::Stream(body)
                } else {
                    Answer::Whole(read_whole(body, None, None, spool).await.map_err(|e| Fail::Worker(e.to_string()))?)
                };
                Ok::<_, Fail>((parts, body))
            };
            // An open WebSocket has no time limit; anything else does.
            let outcome = match sup.settings.request_timeout.filter(|_| !websocket) {
                Some(limit) => tokio::time::timeout(limit, exchange).await.unwrap_or(Err(Fail::Timeout(limit))),
                None => exchange.await,
            };
            match outcome {
                Ok((parts, body)) => break (seat, parts, body),
                Err(Fail::Timeout(limit)) => {
                    // R was stuck (for every session on it, if it is a Shiny worker).
                    tracing::warn!(app = %sup.settings.name, worker, limit_s = limit.as_secs_f64(), "request timed out; killing its worker");
                    seat.failed(sup, Retire::Timeout);
                    sup.metrics.reject(Rejection::RequestTimeout);
                    return error(
                        StatusCode::GATEWAY_TIMEOUT,
                        &format!(
                            "the R worker took longer than --request-timeout ({}s) and was restarted",
                            limit.as_secs_f64()
                        ),
                    );
                }
                Err(Fail::Garbage(e)) => {
                    // Not retried: the worker answered, but nothing it said can be trusted.
                    tracing::error!(app = %sup.settings.name, worker, error = %e, "worker sent an answer valve cannot read; replacing it");
                    seat.failed(sup, Retire::Broken);
                    sup.metrics.reject(Rejection::WorkerFailed);
                    return error(
                        StatusCode::BAD_GATEWAY,
                        "the R worker sent an answer valve cannot read; it was replaced",
                    );
                }
                Err(Fail::Worker(e)) => {
                    let exit = seat.exit_within(EXIT_WAIT).await;
                    seat.failed(sup, Retire::Broken);
                    drop(seat);
                    if let Some(exit) = exit.filter(Exit::self_inflicted) {
                        tracing::warn!(app = %sup.settings.name, worker, status = exit.describe(), "a request ended its worker; it is not retried");
                        sup.metrics.reject(Rejection::WorkerFailed);
                        return error(
                            StatusCode::BAD_GATEWAY,
                            &format!("the request ended its R worker ({}); it was not retried", exit.describe()),
                        );
                    }
                    tracing::warn!(app = %sup.settings.name, worker, error = %e, "worker failed while handling a request");
                    if std::mem::take(&mut replayable) {
                        wanted = None;
                        continue;
                    }
                    sup.metrics.reject(Rejection::WorkerFailed);
                    return error(StatusCode::BAD_GATEWAY, "the R worker died while handling the request");
                }
            }
        };
        // A browser placed on a worker just now learns which, in its sticky cookie.
        let cookie = match &seat {
            Seat::Sticky(sticky) if sticky.new => {
                let path = if app.config.prefix == "/" { "/".to_string() } else { format!("{}/", app.config.prefix) };
                HeaderValue::from_str(&format!(
                    "{STICKY_COOKIE}={}.{:x}.{:016x}; Path={path}; HttpOnly; SameSite=Lax",
                    sticky.worker,
                    sticky.token,
                    self.cookie_key.hash_one((sticky.worker, sticky.token))
                ))
                .ok()
            }
            _ => None,
        };
        let mut out = match body {
            Answer::Whole(payload) => {
                seat.answered(!closes(&parts.headers));
                drop(seat);
                let root = head.uri.path() == "/" && matches!(head.method, Method::GET | Method::HEAD);
                if root && parts.status == StatusCode::NOT_FOUND {
                    // The API has no `/` route: send people to the docs, as the reference tool did.
                    return redirect(&join(&app.config.prefix, DOCS_PATH));
                }
                answer(parts, ReplyBody::from(payload))
            }
            Answer::Stream(body) => {
                let mut resp = Response::from_parts(parts, body);
                match (client_upgrade, resp.status()) {
                    (Some(client), StatusCode::SWITCHING_PROTOCOLS) => {
                        let worker_upgrade = hyper::upgrade::on(&mut resp);
                        self.splice(client, worker_upgrade, sup.clone(), seat.worker(), token);
                        let (parts, _) = resp.into_parts();
                        Response::from_parts(parts, ReplyBody::Empty)
                    }
                    _ => {
                        let (parts, body) = resp.into_parts();
                        answer(parts, ReplyBody::Stream(body))
                    }
                }
            }
        };
        if let Some(cookie) = cookie {
            out.headers_mut().append(header::SET_COOKIE, cookie);
        }
        out
    }

    /// The worker and browser token this browser's sticky cookie names, if
    /// the cookie is one valve gave (in this run).
    fn sticky_worker(&self, headers: &HeaderMap) -> Option<(WorkerId, u64)> {
        headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(';')).find_map(
            |c| {
                let value = c.trim().strip_prefix(STICKY_COOKIE)?.strip_prefix('=')?;
                let mut parts = value.split('.');
                let id: WorkerId = parts.next()?.parse().ok()?;
                let token = u64::from_str_radix(parts.next()?, 16).ok()?;
                let mac = u64::from_str_radix(parts.next()?, 16).ok()?;
                (mac == self.cookie_key.hash_one((id, token))).then_some((id, token))
            },
        )
    }

    /// Copies a WebSocket's bytes both ways until either side closes or the
    /// drain gives up; the session counts on its worker meanwhile.
    fn splice(
        &self,
        client: hyper::upgrade::OnUpgrade,
        worker: hyper::upgrade::OnUpgrade,
        sup: Arc<Supervisor>,
        id: WorkerId,
        token: u64,
    ) {
        let close = self.close_sessions.clone();
        self.sessions.spawn(async move {
            let (Ok(client), Ok(worker)) = tokio::join!(client, worker) else { return };
            sup.session(id, true, Some(token));
            let mut client = TokioIo::new(client);
            let mut worker = TokioIo::new(worker);
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut worker) => {}
                _ = close.cancelled() => {}
            }
            sup.session(id, false, None);
        });
    }
}

/// The answer as the client receives it.
fn answer(mut parts: http::response::Parts, body: ReplyBody) -> Response<ReplyBody> {
    strip_hop_by_hop(&mut parts.headers);
    Response::from_parts(parts, body)
}

/// A bodyless GET, HEAD or OPTIONS, which R can safely be asked twice.
fn replayable(head: &Head, payload: &Payload) -> bool {
    matches!(head.method, Method::GET | Method::HEAD | Method::OPTIONS) && payload.is_empty()
}

/// Whether the worker's answer closes its connection.
fn closes(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .any(|v| v.to_str().unwrap_or("").split(',').any(|t| t.trim().eq_ignore_ascii_case("close")))
}

/// The size of the request line and headers, as a worker's parser counts them.
fn head_bytes<B>(req: &Request<B>) -> usize {
    let line = req.method().as_str().len() + req.uri().to_string().len() + 12;
    line + req.headers().iter().map(|(k, v)| k.as_str().len() + v.len() + 4).sum::<usize>()
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

/// RFC 6455 4.2.1: version 13 and a key that is 16 bytes in base64.
fn valid_websocket_handshake<B>(req: &Request<B>) -> bool {
    let version = req.headers().get(header::SEC_WEBSOCKET_VERSION).is_some_and(|v| v == "13");
    let key = req.headers().get(header::SEC_WEBSOCKET_KEY).and_then(|v| v.to_str().ok()).is_some_and(|k| {
        k.len() == 24
            && k.ends_with("==")
            && k[..22].bytes().all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
    });
    req.method() == Method::GET && version && key
}

/// The `Content-Length` a client declared, if any.
fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.trim().parse().ok()
}

fn too_large(limit: u64) -> Response<ReplyBody> {
    error(StatusCode::PAYLOAD_TOO_LARGE, &format!("the request body is larger than --max-body-size ({limit} bytes)"))
}

fn unavailable(e: &Unavailable) -> Response<ReplyBody> {
    let mut resp = error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string());
    resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    resp
}

/// Removes the hop-by-hop headers, and those the `Connection` header names
/// (except the end-to-end ones a request needs).
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("").split(',').map(str::trim).map(str::to_string).collect::<Vec<_>>())
        .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
        .filter(|n| !KEPT.contains(n) && !n.as_str().starts_with("x-forwarded-"))
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
}

/// `path` under `prefix` (`/` for a root app).
fn join(prefix: &str, path: &str) -> String {
    if prefix == "/" {
        path.to_string()
    } else {
        format!("{prefix}{path}")
    }
}

/// Keeps an app's own absolute redirects and cookie paths under its prefix,
/// so that an app mounted at `/sales` behaves as it does alone.
fn under_prefix(headers: &mut HeaderMap, prefix: &str) {
    if let Some(loc) = headers.get(header::LOCATION).and_then(|v| v.to_str().ok()) {
        if loc.starts_with('/') && !loc.starts_with("//") && !loc.starts_with(&format!("{prefix}/")) {
            if let Ok(v) = HeaderValue::from_str(&format!("{prefix}{loc}")) {
                headers.insert(header::LOCATION, v);
            }
        }
    }
    let cookies: Vec<HeaderValue> = headers.get_all(header::SET_COOKIE).iter().cloned().collect();
    if cookies.is_empty() {
        return;
    }
    headers.remove(header::SET_COOKIE);
    for c in cookies {
        // valve's own sticky cookie already names the prefix.
        if c.as_bytes().starts_with(STICKY_COOKIE.as_bytes()) {
            headers.append(header::SET_COOKIE, c);
            continue;
        }
        let rewritten = c.to_str().ok().map(|text| {
            text.split(';')
                .map(|attr| {
                    let t = attr.trim_start();
                    match t.get(..5) {
                        Some(name) if name.eq_ignore_ascii_case("path=") => {
                            let lead = &attr[..attr.len() - t.len()];
                            format!("{lead}Path={}", join(prefix, &t[5..]))
                        }
                        _ => attr.to_string(),
                    }
                })
                .collect::<Vec<_>>()
                .join(";")
        });
        headers.append(header::SET_COOKIE, rewritten.and_then(|r| HeaderValue::from_str(&r).ok()).unwrap_or(c));
    }
}

/// The request as the worker receives it: origin-form target inside the app,
/// no hop-by-hop headers, no identity headers a client sent (no client names
/// itself a user), the body's real length, `X-Forwarded-*` added (the
/// client's own `X-Forwarded-For` is kept and appended to, never taken as the
/// peer address; `-Proto` and `-Host` are set only when absent: an outer proxy
/// knows better).
fn worker_head(
    parts: http::request::Parts,
    path: &str,
    peer: SocketAddr,
    prefix: &str,
    payload: &Payload,
    websocket: bool,
) -> Head {
    let target = match parts.uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    };
    let uri = target.parse().unwrap_or_else(|_| Uri::from_static("/"));
    let mut headers = parts.headers;
    strip_hop_by_hop(&mut headers);
    let spoofed = strip_client_identity(&mut headers);
    if !spoofed.is_empty() {
        tracing::debug!(peer = %peer, headers = ?spoofed, "identity headers from a client removed");
    }
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
    if prefix != "/" {
        if let Ok(v) = HeaderValue::from_str(prefix) {
            headers.insert(X_FORWARDED_PREFIX.clone(), v);
        }
    }
    if !payload.is_empty() || headers.contains_key(header::CONTENT_LENGTH) {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(payload.len()));
    }
    if websocket {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    }
    let addrs = parts.extensions.get::<ClientAddrs>().copied();
    Head { method: parts.method, uri, headers, addrs }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_cannot_strip_the_headers_a_request_needs() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("example.org"));
        h.insert(header::CONNECTION, HeaderValue::from_static("Host, x-secret, keep-alive"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.get(header::HOST).unwrap(), "example.org");
        assert!(h.get("x-secret").is_none());
        assert!(h.get(header::CONNECTION).is_none());
    }

    #[test]
    fn an_apps_redirects_and_cookie_paths_stay_under_its_prefix() {
        let mut h = HeaderMap::new();
        h.insert(header::LOCATION, HeaderValue::from_static("/__docs__/"));
        h.append(header::SET_COOKIE, HeaderValue::from_static("a=1; Path=/; HttpOnly"));
        h.append(header::SET_COOKIE, HeaderValue::from_static("valve_worker=1.2.3; Path=/sales/; HttpOnly"));
        h.append(header::SET_COOKIE, HeaderValue::from_static("b=2; path=/x"));
        under_prefix(&mut h, "/sales");
        assert_eq!(h.get(header::LOCATION).unwrap(), "/sales/__docs__/");
        let cookies: Vec<_> = h.get_all(header::SET_COOKIE).iter().map(|v| v.to_str().unwrap().to_string()).collect();
        assert_eq!(
            cookies,
            ["a=1; Path=/sales/; HttpOnly", "valve_worker=1.2.3; Path=/sales/; HttpOnly", "b=2; Path=/sales/x"]
        );
    }

    #[test]
    fn websocket_handshakes_are_checked_before_r_sees_them() {
        let ok = Request::get("/websocket/")
            .header(header::SEC_WEBSOCKET_VERSION, "13")
            .header(header::SEC_WEBSOCKET_KEY, "dGhlIHNhbXBsZSBub25jZQ==")
            .body(())
            .unwrap();
        assert!(valid_websocket_handshake(&ok));
        let bad = Request::get("/websocket/")
            .header(header::SEC_WEBSOCKET_VERSION, "13")
            .header(header::SEC_WEBSOCKET_KEY, "not a key")
            .body(())
            .unwrap();
        assert!(!valid_websocket_handshake(&bad));
    }
}
