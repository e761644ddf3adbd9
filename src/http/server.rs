//! The listener: accepts clients, serves HTTP/1.1 (with upgrades) on each
//! connection, routes each request (valve's own pages, or an app through the
//! forwarder), logs it, and on shutdown stops accepting and drains.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::access::{decide, Asking, Gate, Named};
use super::auth::{Asker, Question, Unavailable};
use super::conn::{accept_failed, serve, Reserve, Speaks};
use super::forward::{Forwarder, Served};
use super::head::is_websocket;
use super::identity::{strip_client_identity, BadIdentity, MAX_IDENTITY_BYTES};
use super::reply::{error, redirect, ReplyBody};
use super::resume;
use super::router::{Mounted, Routed, Router, Table};
use super::spans::RequestSpan;
use crate::config::{is_admin_path, Trust};
use crate::metrics::Rejection;
use crate::shutdown::Shutdown;
use crate::worker::ClientAddrs;

/// valve's own pages, as the listeners serve them. The admin module
/// implements it and `lib.rs` hands it in, so this module names no layer
/// above it.
pub trait Pages: Send + Sync {
    /// Answers a path for which `config::is_admin_path` holds, with its query
    /// string. `private`: the request came to the admin listener (or the main
    /// port serves every page).
    fn handle<'a>(
        &'a self,
        method: &'a http::Method,
        path: &'a str,
        query: Option<&'a str>,
        private: bool,
    ) -> Pin<Box<dyn Future<Output = Response<ReplyBody>> + Send + 'a>>;
    /// `--site`'s page at `/` when no app is mounted there.
    fn listing(&self, table: &Table) -> Response<ReplyBody>;
    /// Answers a request for any of valve's own pages where they are all
    /// served (the admin listener, or the main port with `admin_on_main`):
    /// the admin module decides who calls (`peer`, over TLS or not) before
    /// what is asked.
    fn private(
        self: Arc<Self>,
        req: Request<Incoming>,
        peer: SocketAddr,
        secure: bool,
    ) -> Pin<Box<dyn Future<Output = Response<ReplyBody>> + Send>>;
}

/// Publishing's calls: the publishing API (`/__api__/`) and, on the admin
/// listener, valve's pages of published apps. The admin module implements
/// it and `lib.rs` hands it in.
pub trait Publish: Send + Sync {
    /// Whether `path` is publishing's; `admin`: on the admin listener.
    fn wants(&self, path: &str, admin: bool) -> bool;
    /// Answers a request for which `wants` holds (the whole request: an
    /// upload's body is a bundle).
    fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        admin: bool,
    ) -> Pin<Box<dyn Future<Output = Response<ReplyBody>> + Send>>;
}

/// How the drain at shutdown ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    /// Every request finished.
    Clean,
    /// Requests were still running when --graceful-timeout passed or a second signal came.
    Cut,
}

pub use super::conn::ClientLimits;

/// How the main port serves, besides its parts.
#[derive(Clone, Copy, Debug)]
pub struct FrontOptions {
    pub admin_on_main: bool,
    pub access_log: bool,
    /// `--site`: `/` lists the apps when no app is mounted there.
    pub listing: bool,
    /// `Strict-Transport-Security`'s max-age on answers over TLS, when sent.
    pub hsts: Option<Duration>,
}

/// What answers every request on the main port.
pub struct Front {
    router: Arc<Router>,
    pub forwarder: Forwarder,
    /// The forward-auth service's client and cache (used when `auth_url` is set).
    auth: Asker,
    /// valve's own pages: health and readiness always, the rest when
    /// `admin_on_main` (else they are on the admin listener only).
    admin: Arc<dyn Pages>,
    admin_on_main: bool,
    /// Fired when a stop was asked for: answers carry `Connection: close`.
    closing: CancellationToken,
    access_log: bool,
    /// `--site`: `/` lists the apps when no app is mounted there.
    listing: bool,
    /// `Strict-Transport-Security` for answers over TLS.
    hsts: Option<HeaderValue>,
}

impl Front {
    pub fn new(
        router: Arc<Router>,
        forwarder: Forwarder,
        auth: Asker,
        admin: Arc<dyn Pages>,
        closing: CancellationToken,
        options: FrontOptions,
    ) -> Arc<Self> {
        let FrontOptions { admin_on_main, access_log, listing, hsts } = options;
        let hsts = hsts.and_then(|age| HeaderValue::from_str(&format!("max-age={}", age.as_secs())).ok());
        Arc::new(Front { router, forwarder, auth, admin, admin_on_main, closing, access_log, listing, hsts })
    }

    /// Answers one client request. Every failure becomes a short JSON answer.
    /// Once a stop was asked for, every answer closes its connection, so
    /// clients reconnect (through their load balancer) to a valve that stays.
    pub async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        peer: SocketAddr,
        secure: bool,
    ) -> Result<Response<ReplyBody>, Infallible> {
        let http2 = req.version() == http::Version::HTTP_2;
        let mut req = req;
        let tunnel = http2 && h2_websocket(&mut req);
        let mut resp = self.answer(req, peer, secure).await;
        if tunnel && resp.status() == StatusCode::SWITCHING_PROTOCOLS {
            // RFC 8441: an HTTP/2 WebSocket is accepted with 200, no upgrade headers.
            *resp.status_mut() = StatusCode::OK;
            for name in [header::CONNECTION, header::UPGRADE, header::SEC_WEBSOCKET_ACCEPT] {
                resp.headers_mut().remove(name);
            }
        }
        if self.closing.is_cancelled() && resp.status() != StatusCode::SWITCHING_PROTOCOLS && !http2 {
            resp.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if let (true, Some(hsts)) = (secure, &self.hsts) {
            resp.headers_mut().entry(header::STRICT_TRANSPORT_SECURITY).or_insert_with(|| hsts.clone());
        }
        Ok(resp)
    }

    async fn answer(&self, mut req: Request<Incoming>, peer: SocketAddr, secure: bool) -> Response<ReplyBody> {
        if resume::wants_script(req.uri().path()) && matches!(*req.method(), Method::GET | Method::HEAD) {
            return reconnect_script();
        }
        if is_admin_path(req.uri().path()) {
            if self.admin_on_main {
                return self.admin.clone().private(req, peer, secure).await;
            }
            return self.admin.handle(req.method(), req.uri().path(), req.uri().query(), false).await;
        }
        let table = self.router.current();
        let host = req.headers().get(header::HOST).and_then(|h| h.to_str().ok()).or_else(|| req.uri().host());
        let (mounted, inner) = match table.route(host, req.uri().path(), req.uri().query()) {
            Routed::App(m, inner) => (m, inner),
            Routed::AddSlash(location) => return redirect(&location),
            Routed::Nowhere if self.listing && req.uri().path() == "/" => return self.admin.listing(&table),
            Routed::Nowhere => return error(StatusCode::NOT_FOUND, "no app is mounted at this path"),
        };
        let start = Instant::now();
        let method = req.method().clone();
        let version = match req.version() {
            http::Version::HTTP_2 => "2",
            http::Version::HTTP_10 => "1.0",
            _ => "1.1",
        };
        // The path only: query strings can carry secrets.
        let path = self.access_log.then(|| req.uri().path().to_owned());
        let mut served = Served::default();
        let span = RequestSpan::begin(&self.forwarder.tracer, &req, peer);
        served.trace.context = span.as_ref().map(RequestSpan::context);
        let target = req.uri().path_and_query().map(|p| p.as_str()).unwrap_or("/").to_owned();
        let resp = match self.named(&table.trust, &mounted, &req, &target, peer).await {
            Err(refused) => refused,
            Ok(named) => match gate(&table.trust, &mounted, named, &mut req, &target, peer, &mut served) {
                Some(refused) => refused,
                None => self.forwarder.forward(&mounted, &inner, req, peer, &mut served).await,
            },
        };
        let took = start.elapsed();
        let status = resp.status().as_u16();
        mounted.sup.metrics.request(&method, status, took);
        mounted.sup.metrics.user_request(served.user.as_deref());
        if let Some(span) = span {
            span.end(&mounted.config, status, served.worker, served.waited, &served.trace);
        }
        if let Some(path) = path {
            tracing::info!(
                target: "valve::access",
                app = %mounted.config.name,
                method = %method,
                path = %path,
                http = %version,
                status,
                duration_ms = took.as_secs_f64() * 1e3,
                queue_ms = served.waited.as_secs_f64() * 1e3,
                worker = served.worker,
                user = %served.user.as_deref().unwrap_or("-"),
                "request"
            );
        }
        resp
    }
}

impl Front {
    /// Where the request's identity comes from: with `auth_url`, the auth
    /// service's answer, or 503 when it has none (before any worker is asked).
    async fn named(
        &self,
        trust: &Trust,
        app: &Mounted,
        req: &Request<Incoming>,
        target: &str,
        peer: SocketAddr,
    ) -> Result<Named, Response<ReplyBody>> {
        let q = Question { method: req.method(), headers: req.headers(), target, peer };
        self.auth.named(trust, &q).await.map_err(|Unavailable| {
            app.sup.metrics.reject(Rejection::AuthUnavailable);
            let mut resp = error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the sign-in check (the forward-auth service, auth_url) is not answering; try again shortly",
            );
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
            resp
        })
    }
}

/// Who is calling, and may they: obeys `access::decide` before any worker
/// is asked. An admitted request carries its client's address (what R's
/// `REMOTE_ADDR` says) and identity (which only valve writes for R) in its
/// extensions; a refused one gets its answer here.
fn gate(
    trust: &Trust,
    app: &Mounted,
    named: Named,
    req: &mut Request<Incoming>,
    target: &str,
    peer: SocketAddr,
    served: &mut Served,
) -> Option<Response<ReplyBody>> {
    let websocket = is_websocket(req);
    let ask = Asking { peer, method: req.method(), headers: req.headers(), target, websocket, named };
    let gate = decide(trust, &app.config.allow, &ask);
    let removed = strip_client_identity(req.headers_mut(), trust);
    let metrics = &app.sup.metrics;
    match gate {
        Gate::Admit { client, who } => {
            if who.is_none() && !removed.is_empty() {
                tracing::debug!(%peer, headers = ?removed, "identity headers from a client removed");
            }
            if let Some(addrs) = req.extensions_mut().get_mut::<ClientAddrs>() {
                addrs.remote = client;
            }
            served.trace.client = Some(client.ip());
            served.user = who.as_ref().map(|w| w.user.clone());
            if let Some(who) = who {
                req.extensions_mut().insert(who);
            }
            None
        }
        Gate::Forbid { who } => {
            metrics.reject(Rejection::AccessDenied);
            served.user = who.map(|w| w.user);
            let message = match &served.user {
                Some(user) => format!("{user} may not use this app"),
                None => "this app is open to signed-in users it names; sign in first".to_string(),
            };
            Some(error(StatusCode::FORBIDDEN, &message))
        }
        Gate::SignIn(location) => {
            metrics.reject(Rejection::SignIn);
            let mut resp = redirect(&location);
            *resp.status_mut() = StatusCode::FOUND;
            Some(resp)
        }
        Gate::Bad(bad) => {
            metrics.reject(Rejection::BadRequest);
            Some(match bad {
                BadIdentity::TooLong(header) => error(
                    StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                    &format!("the identity header {header} is longer than {} KiB", MAX_IDENTITY_BYTES / 1024),
                ),
                BadIdentity::NotUtf8(header) => {
                    error(StatusCode::BAD_REQUEST, &format!("the identity header {header} is not valid UTF-8"))
                }
            })
        }
    }
}

/// Serves until `shutdown.drain` fires, then drains within `grace` (or until
/// `shutdown.now`): in-flight requests first, then Shiny sessions with what is
/// left of the grace period.
pub async fn run(
    listener: TcpListener,
    speaks: Speaks,
    front: Arc<Front>,
    shutdown: Shutdown,
    limits: ClientLimits,
    grace: Duration,
) -> Drained {
    let connections = TaskTracker::new();
    let mut reserve = Reserve::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.drain.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    accept_failed(&e, "main");
                    if reserve.out_of_descriptors(&e) {
                        // Shed the waiting connection instead of leaving it (and
                        // every one behind it) to time out: close the spare
                        // descriptor, take the connection, close it, take the spare back.
                        reserve.release();
                        if let Ok((stream, _)) = listener.accept().await {
                            drop(stream);
                        }
                        reserve = Reserve::new();
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let front = front.clone();
        // What a frames worker is told of the client's connection (Rook's SERVER_* and REMOTE_*).
        let secure = speaks.is_tls();
        let addrs = stream.local_addr().ok().map(|local| ClientAddrs { local, remote: peer, secure });
        let service = service_fn(move |mut req: Request<Incoming>| {
            if let Some(addrs) = addrs {
                req.extensions_mut().insert(addrs);
            }
            front.clone().handle(req, peer, secure)
        });
        let (drain, speaks) = (shutdown.drain.clone(), speaks.clone());
        connections.spawn(async move { serve(stream, peer, &speaks, limits, service, drain, true).await });
    }
    drop(listener);
    connections.close();
    // No browser can come back to this valve now: sessions held for one end.
    front.forwarder.resumes.draining();
    let deadline = tokio::time::Instant::now() + grace;
    let drained = tokio::select! {
        _ = connections.wait() => {
            tracing::info!("all requests finished");
            Drained::Clean
        }
        _ = tokio::time::sleep_until(deadline) => {
            tracing::warn!(grace_s = grace.as_secs_f64(), "requests still running after --graceful-timeout; stopping anyway");
            Drained::Cut
        }
        _ = shutdown.now.cancelled() => Drained::Cut,
    };
    // Shiny sessions end when their browsers leave; give them what is left of
    // the grace period, then close them (a closed session is not a lost request).
    let sessions = &front.forwarder.sessions;
    sessions.close();
    if !sessions.is_empty() {
        tracing::info!(sessions = sessions.len(), "waiting for open Shiny sessions to end");
        tokio::select! {
            _ = sessions.wait() => {}
            _ = tokio::time::sleep_until(deadline) => tracing::info!("closing the Shiny sessions still open"),
            _ = shutdown.now.cancelled() => {}
        }
        front.forwarder.close_sessions.cancel();
    }
    drained
}

/// An HTTP/2 request as the rest of valve reads requests: its authority as
/// `Host`, and a WebSocket opened by extended CONNECT (RFC 8441) as the
/// HTTP/1.1 upgrade it stands for (a key of valve's own: HTTP/2 has none).
/// True for such a WebSocket.
fn h2_websocket(req: &mut Request<Incoming>) -> bool {
    if !req.headers().contains_key(header::HOST) {
        if let Some(v) = req.uri().authority().and_then(|a| HeaderValue::from_str(a.as_str()).ok()) {
            req.headers_mut().insert(header::HOST, v);
        }
    }
    let websocket = req.method() == Method::CONNECT
        && req.extensions().get::<hyper::ext::Protocol>().is_some_and(|p| p.as_str().eq_ignore_ascii_case("websocket"));
    if websocket {
        *req.method_mut() = Method::GET;
        let h = req.headers_mut();
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        if let Ok(key) = HeaderValue::from_str(&tokio_tungstenite::tungstenite::handshake::client::generate_key()) {
            h.insert(header::SEC_WEBSOCKET_KEY, key);
        }
    }
    websocket
}

/// valve's Shiny reconnect script, at any app's root (its URL carries its
/// version, so it may be cached).
fn reconnect_script() -> Response<ReplyBody> {
    let mut resp = Response::new(ReplyBody::text(resume::script().0));
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/javascript; charset=utf-8"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("public, max-age=86400"));
    resp
}

/// Connections the admin listener holds at once; more are closed at once, so
/// no number of clients there can take the descriptors the main port needs.
pub const ADMIN_CONNECTIONS: usize = 64;

/// Serves valve's own pages on a listener of their own (`--admin-addr`) until
/// valve exits: it stays up through the drain so readiness can say so. With
/// `publish`, publishing's calls too.
pub fn serve_admin(
    listener: TcpListener,
    speaks: Speaks,
    admin: Arc<dyn Pages>,
    limits: ClientLimits,
    publish: Option<Arc<dyn Publish>>,
) {
    serve_private(listener, speaks, limits, "admin", move |req, peer, secure| {
        let (admin, publish) = (admin.clone(), publish.clone());
        Box::pin(async move {
            let path = req.uri().path();
            match publish {
                Some(p) if p.wants(path, true) => p.handle(req, true).await,
                _ if is_admin_path(path) => admin.private(req, peer, secure).await,
                _ => error(StatusCode::NOT_FOUND, "the admin listener serves /__valve__/ only"),
            }
        })
    });
}

/// Serves the publishing API alone on an address of its own (`--publish-addr`).
pub fn serve_publish(listener: TcpListener, speaks: Speaks, publish: Arc<dyn Publish>, limits: ClientLimits) {
    serve_private(listener, speaks, limits, "publish", move |req, _, _| {
        let publish = publish.clone();
        Box::pin(async move {
            if publish.wants(req.uri().path(), false) {
                publish.handle(req, false).await
            } else {
                error(StatusCode::NOT_FOUND, "this address serves valve's publishing API (/__api__/) only")
            }
        })
    })
}

/// An answer on its way, from a listener of valve's own.
type Answering = Pin<Box<dyn Future<Output = Response<ReplyBody>> + Send>>;

/// Serves `answer` on `listener` until valve exits, holding at most
/// `ADMIN_CONNECTIONS` connections at once.
fn serve_private(
    listener: TcpListener,
    speaks: Speaks,
    limits: ClientLimits,
    name: &'static str,
    answer: impl Fn(Request<Incoming>, SocketAddr, bool) -> Answering + Send + Sync + 'static,
) {
    let answer = Arc::new(answer);
    let slots = Arc::new(tokio::sync::Semaphore::new(ADMIN_CONNECTIONS));
    tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_failed(&e, name);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                drop(stream);
                continue;
            };
            let _ = stream.set_nodelay(true);
            let answer = answer.clone();
            let secure = speaks.is_tls();
            let service = service_fn(move |req: Request<Incoming>| {
                let answer = answer.clone();
                async move { Ok::<_, Infallible>(answer(req, peer, secure).await) }
            });
            let speaks = speaks.clone();
            tokio::spawn(async move {
                // valve's own listeners stay up through the drain.
                serve(stream, peer, &speaks, limits, service, CancellationToken::new(), false).await;
                drop(slot);
            });
        }
    });
}

/// The address to print for people and programs: the bound one.
pub fn display_addr(addr: SocketAddr, tls: bool) -> String {
    format!("{}://{addr}", if tls { "https" } else { "http" })
}
