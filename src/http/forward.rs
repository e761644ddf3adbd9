//! One request from a client to an app's worker and back, for plumber and
//! Shiny alike (static content is answered from its folder first, by
//! `files`, and never reaches a worker):
//!
//! 1. valve's own checks, so only requests R can parse reach R: the method
//!    (405), the size of the request line and headers (431), a WebSocket's
//!    handshake (400), a declared body over the limit (413);
//! 2. the body read whole (memory, then a spool file) before any worker is
//!    taken: a slow upload costs a connection, never a worker;
//! 3. a worker: a `Lease` for plumber (one R computation at a time), the
//!    sticky worker for Shiny;
//! 4. the exchange, under `--request-timeout` (a worker past it is killed:
//!    504; a request only waiting on a promise gets 504 alone), with one
//!    retry rule: a request that never reached a worker goes to another; a
//!    bodyless GET, HEAD or OPTIONS whose worker died under it is sent once
//!    more, unless the worker ended itself (`quit()`, a crash):
//!    then the request is the cause and a second worker would die the same way;
//! 5. the answer: a plumber worker's is read whole at the worker's speed, so
//!    the worker goes back before the client has read a byte; a Shiny worker's
//!    is streamed (a download may be long, and Shiny workers are not leased);
//!    a WebSocket is spliced both ways, or, when valve's reconnect script
//!    opened it, becomes a session that outlives its connection
//!    (`http::resume`), and a Shiny page gets that script's tag.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::body::{read_whole, Payload, ReadError};
use super::files;
use super::head::{
    closes, declared_length, head_bytes, is_websocket, join, strip_hop_by_hop, under_prefix, valid_websocket_handshake,
    worker_head, Head, STICKY_COOKIE,
};
use super::reply::{error, redirect, ReplyBody};
use super::resume::{self, Offer, Resumes};
use super::router::Mounted;
use super::seat::Seat;
use super::spans;
use crate::app::verdict::{after_exchange, Asked, Hold, Next, Outcome};
use crate::app::{Supervisor, Unavailable, WorkerId};
use crate::metrics::Rejection;
use crate::worker::{AnswerBody, SendError, SpoolDir};

/// The methods plumber routes and httpuv parses; anything else is answered here.
const METHODS: [Method; 7] =
    [Method::GET, Method::HEAD, Method::POST, Method::PUT, Method::DELETE, Method::OPTIONS, Method::PATCH];
const ALLOW: &str = "GET, HEAD, POST, PUT, DELETE, OPTIONS, PATCH";

/// The largest request line plus headers passed on (httpuv gives up at 80 KiB).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// How long to wait, after an exchange broke off, for the worker's exit to
/// say whether it ended itself.
const EXIT_WAIT: Duration = Duration::from_millis(300);

/// Where `/` goes when a plumber API has no `/` route of its own.
const DOCS_PATH: &str = "/__docs__/";

/// Which worker served a request and how long it waited, for the access log
/// (and its span).
#[derive(Default)]
pub struct Served {
    pub worker: Option<WorkerId>,
    pub waited: Duration,
    /// Who the request came from, as a trusted proxy said.
    pub user: Option<String>,
    /// What the request's span tells besides (its context: R's `traceparent`).
    pub trace: spans::Traced,
}

/// What every forwarded request shares.
pub struct Forwarder {
    /// Where bodies too big for memory are spooled (valve's private run
    /// directory; an app's request bodies go to its own run folder).
    spool: SpoolDir,
    /// The longest a client may stay silent while sending a body.
    client_timeout: Duration,
    /// Keys the sticky cookie's check, so a browser cannot name a worker it was not given.
    cookie_key: crate::mac::Key,
    /// Numbers the browsers placed on Shiny workers (their cookie's token).
    browsers: std::sync::atomic::AtomicU64,
    /// Open WebSocket sessions, so the drain can wait for them.
    pub sessions: TaskTracker,
    /// Fired when the drain gives up on open sessions.
    pub close_sessions: CancellationToken,
    /// Shiny sessions that outlive their connections.
    pub resumes: Arc<Resumes>,
    /// Where Shiny sessions' spans go (off unless traces are on).
    pub tracer: crate::trace::Tracer,
}

/// A worker's answer: read whole (plumber) or streamed (Shiny).
enum Answer {
    Whole(Payload),
    Stream(AnswerBody),
}

impl Forwarder {
    pub fn new(spool: PathBuf, client_timeout: Duration, bounds: resume::Bounds) -> Self {
        let (sessions, close_sessions) = (TaskTracker::new(), CancellationToken::new());
        Forwarder {
            spool: SpoolDir { dir: spool, owner: None },
            client_timeout,
            cookie_key: crate::mac::Key::random(),
            browsers: std::sync::atomic::AtomicU64::new(1),
            resumes: Arc::new(Resumes::new(bounds, sessions.clone(), close_sessions.clone())),
            sessions,
            close_sessions,
            tracer: crate::trace::Tracer::off(),
        }
    }

    /// Records spans with `tracer` (requests' and Shiny sessions').
    pub fn traced(mut self, tracer: crate::trace::Tracer) -> Self {
        self.tracer = tracer;
        self
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
        if let Some(root) = cfg.source.static_root() {
            // Static content: valve answers from the folder; no worker is asked.
            return files::serve(root, &cfg.prefix, path, &req).await;
        }
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
        let offer =
            if websocket && !cfg.reconnect_window.is_zero() { resume::offer(req.headers()) } else { Offer::Plain };
        if offer == Offer::Resume {
            // A browser coming back to its session: no worker is asked.
            if let Some(key) = req.headers().get(header::SEC_WEBSOCKET_KEY).cloned() {
                return self.resumes.resume(hyper::upgrade::on(&mut req), &key, app.sup.clone());
            }
        }
        let client_upgrade = websocket.then(|| hyper::upgrade::on(&mut req));
        let (parts, body) = req.into_parts();
        let payload = if websocket || body.is_end_stream() {
            Payload::empty()
        } else {
            match read_whole(
                body,
                Some(cfg.max_body_size),
                Some(self.client_timeout),
                app.sup.settings.spool.as_ref().unwrap_or(&self.spool),
            )
            .await
            {
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
        let mut head = worker_head(parts, path, peer, &cfg.prefix, &payload, websocket, cfg.is_shiny());
        if matches!(offer, Offer::New { .. }) {
            resume::plain_upgrade(&mut head.headers);
        }
        if let Some(cx) = &served.trace.context {
            cx.to_r(&mut head.headers);
        }
        if cfg.is_shiny() && !websocket && !cfg.reconnect_window.is_zero() && head.method == Method::GET {
            // A page valve adds its script to must come uncompressed (Shiny gzips).
            let page =
                head.headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|a| a.contains("text/html"));
            if page {
                head.headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
            }
        }
        let mut resp = self.exchange(app, head, payload, client_upgrade.map(|c| (c, offer)), served).await;
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
        client_upgrade: Option<(hyper::upgrade::OnUpgrade, Offer)>,
        served: &mut Served,
    ) -> Response<ReplyBody> {
        let shiny = app.config.is_shiny();
        let websocket = client_upgrade.is_some();
        let mut wanted = if shiny { self.sticky_worker(&head.headers) } else { None };
        // A browser whose worker belongs to an older generation (a reload)
        // stays with it while that worker serves sessions.
        let mut sup: Arc<Supervisor> = wanted
            .and_then(|(id, _)| std::iter::once(&app.sup).chain(app.older.iter()).find(|s| s.keeps(id)))
            .unwrap_or(&app.sup)
            .clone();
        let token = wanted.map(|(_, t)| t).unwrap_or_else(|| self.browsers.fetch_add(1, Ordering::Relaxed));
        let mut asked =
            Asked { hold: Hold::Lease, replayable: replayable(&head, &payload), unreachable: 0, retried: false };
        let (seat, parts, body) = loop {
            let mut seat = match if shiny {
                sup.sticky(wanted, token).await.map(Seat::Sticky)
            } else {
                sup.lease().await.map(Seat::Lease)
            } {
                Ok(seat) => seat,
                // A reload replaced the generation this browser waited in.
                Err(e) => match (&e, sup.successor()) {
                    (Unavailable::Replaced, Some(next)) => {
                        sup = next;
                        continue;
                    }
                    _ => return unavailable(&e),
                },
            };
            asked.hold = seat.hold();
            let worker = seat.worker();
            served.worker = Some(worker);
            served.waited += seat.waited();
            let outcome = match seat.connect(websocket).await {
                Err(e) => {
                    tracing::warn!(app = %sup.settings.name, worker, error = %e, "worker unreachable; taking it out of service");
                    asked.unreachable += 1;
                    Outcome::Unreachable
                }
                Ok(()) => {
                    let req = head.request(&payload);
                    let spool = &self.spool;
                    let exchange = async {
                        let resp = seat.send(req).await?;
                        let (parts, body) = resp.into_parts();
                        // A plumber answer is read whole at the worker's speed, so the worker
                        // goes back before the client has read a byte; a Shiny answer streams.
                        let body = if shiny {
                            Answer::Stream(body)
                        } else {
                            Answer::Whole(
                                read_whole(body, None, None, spool)
                                    .await
                                    .map_err(|e| SendError::Lost(std::io::Error::other(e.to_string())))?,
                            )
                        };
                        Ok::<_, SendError>((parts, body))
                    };
                    // An open WebSocket has no time limit; anything else does.
                    let limit = sup.settings.request_timeout.filter(|_| !websocket);
                    let began = std::time::Instant::now();
                    let result = match limit {
                        Some(limit) => tokio::time::timeout(limit, exchange).await.map_err(|_| limit),
                        None => Ok(exchange.await),
                    };
                    served.trace.in_r += began.elapsed();
                    match result {
                        Ok(Ok((parts, body))) => {
                            let reusable = !closes(&parts.headers);
                            seat.obey(&sup, after_exchange(&Outcome::Answered { reusable }, asked).fate);
                            break (seat, parts, body);
                        }
                        Err(limit) if seat.parked() && sup.settings.limits.max_pending > 0 => {
                            // R serves others meanwhile: only this request is given up.
                            tracing::warn!(app = %sup.settings.name, worker, limit_s = limit.as_secs_f64(),
                                "request timed out waiting on its promise; its late answer will be dropped");
                            Outcome::Unsettled(limit)
                        }
                        Err(limit) => {
                            // R was stuck (for every session on it, if it is a Shiny worker).
                            tracing::warn!(app = %sup.settings.name, worker, limit_s = limit.as_secs_f64(), "request timed out; killing its worker");
                            Outcome::TimedOut(limit)
                        }
                        Ok(Err(SendError::Garbage(e))) => {
                            tracing::error!(app = %sup.settings.name, worker, error = %e, "worker sent an answer valve cannot read; replacing it");
                            Outcome::Garbage
                        }
                        Ok(Err(e)) => {
                            let exit = seat.exit_within(EXIT_WAIT).await;
                            match &exit {
                                Some(exit) if exit.self_inflicted() => {
                                    tracing::warn!(app = %sup.settings.name, worker, status = exit.describe(), "a request ended its worker; it is not retried")
                                }
                                _ => {
                                    tracing::warn!(app = %sup.settings.name, worker, error = %e, "worker failed while handling a request")
                                }
                            }
                            Outcome::Failed(exit)
                        }
                    }
                }
            };
            let verdict = after_exchange(&outcome, asked);
            seat.obey(&sup, verdict.fate);
            drop(seat);
            match verdict.next {
                Next::Retry => {
                    asked.retried |= matches!(outcome, Outcome::Failed(_));
                    wanted = None;
                    served.trace.retries += 1;
                }
                Next::Refuse(refusal) => {
                    sup.metrics.reject(refusal.rejection);
                    return error(refusal.status, &refusal.message);
                }
                // Only an answer is delivered (above), and only a client
                // gone has nothing next (the lease's drop asks for it).
                Next::Deliver | Next::Nothing => {
                    return error(StatusCode::BAD_GATEWAY, "the R worker died while handling the request")
                }
            }
        };
        // A browser placed on a worker just now learns which, in its sticky cookie.
        let cookie = match &seat {
            Seat::Sticky(sticky) if sticky.new => {
                let path = if app.config.prefix == "/" { "/".to_string() } else { format!("{}/", app.config.prefix) };
                // Over valve's TLS, browsers send it back over TLS only.
                let secure = if head.addrs.is_some_and(|a| a.secure) { "; Secure" } else { "" };
                HeaderValue::from_str(&format!(
                    "{STICKY_COOKIE}={}.{:x}.{}; Path={path}; HttpOnly; SameSite=Lax{secure}",
                    sticky.worker,
                    sticky.token,
                    self.cookie_mac(sticky.worker, sticky.token)
                ))
                .ok()
            }
            _ => None,
        };
        let mut out = match body {
            Answer::Whole(payload) => {
                drop(seat);
                // The worker went to the request waiting for one, if any: let
                // it write to R before this answer is encrypted and written.
                tokio::task::yield_now().await;
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
                    (Some((client, offer)), StatusCode::SWITCHING_PROTOCOLS) => {
                        let worker_upgrade = hyper::upgrade::on(&mut resp);
                        let (mut parts, _) = resp.into_parts();
                        match offer {
                            Offer::New { restart } => {
                                resume::speaks(&mut parts.headers);
                                let window = app.config.reconnect_window;
                                let parent = served.trace.context.as_ref();
                                let span = spans::session(&self.tracer, parent, &app.config, seat.worker(), true);
                                self.resumes.start(
                                    client,
                                    worker_upgrade,
                                    sup.clone(),
                                    seat.worker(),
                                    token,
                                    window,
                                    restart,
                                    served.user.clone(),
                                    span,
                                );
                            }
                            Offer::Plain | Offer::Resume => self.splice(
                                client,
                                worker_upgrade,
                                sup.clone(),
                                seat.worker(),
                                token,
                                served.user.clone(),
                                spans::session(
                                    &self.tracer,
                                    served.trace.context.as_ref(),
                                    &app.config,
                                    seat.worker(),
                                    false,
                                ),
                            ),
                        }
                        Response::from_parts(parts, ReplyBody::Empty)
                    }
                    _ => {
                        let (parts, body) = resp.into_parts();
                        let scripted = !app.config.reconnect_window.is_zero() && head.method == Method::GET;
                        match scripted.then(|| with_script(&parts, head.uri.path())).flatten() {
                            Some(src) => match body.collect().await {
                                Ok(page) => {
                                    let page = page.to_bytes();
                                    let mut parts = parts;
                                    let page = match resume::inject(&page, &src) {
                                        Some(tagged) => {
                                            // Another body than R's: R's validators no longer name it.
                                            parts.headers.remove(header::ETAG);
                                            parts.headers.remove(header::ACCEPT_RANGES);
                                            bytes::Bytes::from(tagged)
                                        }
                                        None => page,
                                    };
                                    parts.headers.insert(header::CONTENT_LENGTH, HeaderValue::from(page.len()));
                                    answer(parts, ReplyBody::text(page))
                                }
                                Err(_) => error(StatusCode::BAD_GATEWAY, "the R worker's page broke off"),
                            },
                            None => answer(parts, ReplyBody::Stream(body)),
                        }
                    }
                }
            }
        };
        if let Some(cookie) = cookie {
            out.headers_mut().append(header::SET_COOKIE, cookie);
        }
        out
    }

    /// The sticky cookie's MAC of a worker and a browser's token (128 bits of HMAC-SHA-256).
    fn cookie_mac(&self, worker: WorkerId, token: u64) -> String {
        self.cookie_key.tag_hex(&[&worker.to_be_bytes(), &token.to_be_bytes()])
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
                let mac = parts.next()?;
                crate::mac::same(self.cookie_mac(id, token).as_bytes(), mac.as_bytes()).then_some((id, token))
            },
        )
    }

    /// Copies a WebSocket's bytes both ways until either side closes or the
    /// drain gives up; the session counts on its worker meanwhile (and its
    /// span, if any, lasts as long).
    #[allow(clippy::too_many_arguments)]
    fn splice(
        &self,
        client: hyper::upgrade::OnUpgrade,
        worker: hyper::upgrade::OnUpgrade,
        sup: Arc<Supervisor>,
        id: WorkerId,
        token: u64,
        user: Option<String>,
        span: Option<crate::trace::Live>,
    ) {
        let close = self.close_sessions.clone();
        self.sessions.spawn(async move {
            let (Ok(client), Ok(worker)) = tokio::join!(client, worker) else {
                if let Some(span) = span {
                    span.discard();
                }
                return;
            };
            sup.session(id, true, Some(token));
            let _usage = sup.metrics.session(id, user.as_deref());
            let _user = user.map(|u| sup.signed_in(id, u));
            let mut client = TokioIo::new(client);
            let mut worker = TokioIo::new(worker);
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut worker) => {}
                _ = close.cancelled() => {}
            }
            sup.session(id, false, None);
            drop(span);
        });
    }
}

/// The answer as the client receives it.
fn answer(mut parts: http::response::Parts, body: ReplyBody) -> Response<ReplyBody> {
    strip_hop_by_hop(&mut parts.headers);
    Response::from_parts(parts, body)
}

/// The script's `src` if this answer is a Shiny page valve adds it to:
/// 200, HTML, not compressed, of a known length within `resume::MAX_PAGE`.
/// Not a download (`Content-Disposition`), not marked `no-transform`.
fn with_script(parts: &http::response::Parts, inner: &str) -> Option<String> {
    let h = &parts.headers;
    let text = |name| h.get(name).and_then(|v: &HeaderValue| v.to_str().ok());
    let html = text(header::CONTENT_TYPE).is_some_and(|t| t.starts_with("text/html"));
    let plain = text(header::CONTENT_ENCODING).is_none_or(|v| v.eq_ignore_ascii_case("identity"));
    let small = declared_length(h).is_some_and(|n| n <= resume::MAX_PAGE);
    let download = h.contains_key(header::CONTENT_DISPOSITION);
    let untouchable = text(header::CACHE_CONTROL).is_some_and(|v| v.to_ascii_lowercase().contains("no-transform"));
    (parts.status == StatusCode::OK && html && plain && small && !download && !untouchable)
        .then(|| resume::script_src(inner))
}

/// A bodyless GET, HEAD or OPTIONS, which R can safely be asked twice.
fn replayable(head: &Head, payload: &Payload) -> bool {
    matches!(head.method, Method::GET | Method::HEAD | Method::OPTIONS) && payload.is_empty()
}

fn too_large(limit: u64) -> Response<ReplyBody> {
    error(StatusCode::PAYLOAD_TOO_LARGE, &format!("the request body is larger than --max-body-size ({limit} bytes)"))
}

fn unavailable(e: &Unavailable) -> Response<ReplyBody> {
    let mut resp = error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string());
    resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    resp
}
