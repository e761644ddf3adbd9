//! valve's own pages under `/__valve__/`: liveness, readiness, Prometheus
//! metrics, JSON status, the site dashboard and each app's page, each app's
//! log, and usage. Never forwarded to R, and none of them asks R anything
//! (memory is what each worker's task sampled), so a long computation
//! cannot fail a probe. Every page but health and readiness asks who is
//! calling first (`auth`: the operator token, a key, a session, a listed
//! user of the sign-in proxy); an operator sees everything, a publishing
//! key its own apps. This file routes; its rooms answer: `status` (the
//! JSON of valve, its apps and workers), `logs`, `usage`, and `query` (the
//! parameters they take). Publishing (`publish/`) is a room of its own:
//! the publishing API and valve's pages of published apps
//! (`/__valve__/published/`).
//!
//! | path                          | answer                                      |
//! |-------------------------------|---------------------------------------------|
//! | `/`                           | the site dashboard (`site.html`)            |
//! | `/apps`                       | every app's figures (JSON)                  |
//! | `/apps/NAME/`                 | the app's page (`app.html`)                 |
//! | `/apps/NAME/status`           | the app and its workers (JSON)              |
//! | `/apps/NAME/logs`             | the app's log (`logs`)                      |
//! | `/usage`                      | sessions and requests by user (`usage`)     |
//! | `/status`, `/metrics`, `/healthz`, `/readyz`, `/reload` | as before         |

pub mod auth;
pub mod publish;

mod logs;
mod packages;
mod query;
#[cfg(test)]
mod reference;
mod status;
mod usage;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use http::header::{HeaderValue, ACCEPT, ALLOW, WWW_AUTHENTICATE};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio_util::sync::CancellationToken;

use auth::{Auth, Shown, Who};

use crate::app::Fleet;
use crate::config::{valid_name, AccountKind, AppConfig, AppSource, Config, Isolation};
use crate::http::reply::{error, redirect, text, ReplyBody};
use crate::http::router::{Mounted, Router, Table};
use crate::http::server::Pages;
use crate::metrics::{Gauges, Registry};
use crate::reload::Reloader;

/// The site dashboard: every app in one table.
const SITE: &str = include_str!("site.html");
/// One app's page: its workers, charts and live log.
const APP: &str = include_str!("app.html");

pub use crate::config::{is_admin_path, ADMIN_PREFIX as PREFIX};

pub struct Admin {
    router: Arc<Router>,
    fleet: Arc<Fleet>,
    registry: Arc<Registry>,
    /// Fired when a stop was asked for: readiness turns 503.
    stopping: CancellationToken,
    /// What valve can give apps here (own users, a private view).
    isolation: Isolation,
    started: Instant,
    config: serde_json::Value,
    /// Reloads the configuration (`POST /__valve__/reload`).
    reloader: OnceLock<Arc<Reloader>>,
    /// Publishing, when on: the status page and metrics say what each
    /// published app serves.
    publisher: OnceLock<Arc<publish::Publisher>>,
    /// The package cache (`valve packages`).
    package_cache: std::path::PathBuf,
    /// Who may use these pages.
    auth: Arc<Auth>,
}

impl Admin {
    pub fn new(
        router: Arc<Router>,
        fleet: Arc<Fleet>,
        registry: Arc<Registry>,
        config: &Config,
        stopping: CancellationToken,
        auth: Arc<Auth>,
    ) -> Arc<Self> {
        let isolation = config.server.isolation;
        let config_packages = config.server.packages.cache_dir.clone();
        let secs = |d: std::time::Duration| d.as_secs_f64();
        let s = &config.server;
        let first = config.apps.first();
        let config = serde_json::json!({
            "host": s.host,
            "port": s.port,
            "threads": s.threads,
            "max_workers": s.max_workers,
            "graceful_timeout_s": secs(s.graceful_timeout),
            "drain_delay_s": secs(s.drain_delay),
            "check_unused_s": secs(s.check_unused),
            "shiny_session_buffer": s.shiny_session_buffer,
            "shiny_buffer_total": s.shiny_buffer_total,
            // The first app's settings, as with one app (-f).
            "app": first.map(|a| a.source.path()),
            "n_min": first.map(|a| a.n_min),
            "n_max": first.map(|a| a.n_max),
            "preload": first.map(|a| a.preload),
            "max_age_s": first.map(|a| secs(a.max_age)),
            "request_timeout_s": first.and_then(|a| a.request_timeout.map(secs)),
            "queue_size": first.map(|a| a.queue_size),
            "queue_timeout_s": first.map(|a| secs(a.queue_timeout)),
            "max_body_size": first.map(|a| a.max_body_size),
            "max_requests": first.and_then(|a| a.max_requests),
            "max_worker_memory": first.and_then(|a| a.max_worker_memory),
            "max_sessions": first.map(|a| a.max_sessions),
            "busy_threshold": first.map(|a| a.busy_threshold),
            "reconnect_window_s": first.map(|a| secs(a.reconnect_window)),
        });
        Arc::new(Admin {
            router,
            fleet,
            registry,
            stopping,
            isolation,
            started: Instant::now(),
            config,
            reloader: OnceLock::new(),
            publisher: OnceLock::new(),
            package_cache: config_packages,
            auth,
        })
    }

    pub fn set_publisher(&self, publisher: Arc<publish::Publisher>) {
        let _ = self.publisher.set(publisher);
    }

    pub fn set_reloader(&self, reloader: Arc<Reloader>) {
        let _ = self.reloader.set(reloader);
    }

    /// Every app's gauges, by name (an app's generations added up).
    fn gauges(&self) -> BTreeMap<String, Gauges> {
        let mut out: BTreeMap<String, Gauges> = BTreeMap::new();
        for m in self.router.current().apps() {
            let entry = out.entry(m.config.name.clone()).or_default();
            for sup in std::iter::once(&m.sup).chain(m.older.iter()) {
                entry.add(&sup.gauges());
            }
        }
        out
    }

    /// Whether every app can serve, and valve is not stopping.
    pub fn ready(&self) -> bool {
        !self.stopping.is_cancelled() && self.router.current().apps().iter().all(|m| m.sup.ready())
    }

    /// Answers a path for which `is_admin_path` holds. `private`: the
    /// request came to the admin listener (or the main port serves all pages);
    /// otherwise only health and readiness are answered.
    pub async fn handle(&self, method: &Method, path: &str, query: Option<&str>, private: bool) -> Response<ReplyBody> {
        let plain = "text/plain; charset=utf-8";
        let page = path.strip_prefix(PREFIX).unwrap_or("");
        if private && page == "/reload" {
            return self.reload(method).await;
        }
        if private && (page == "/packages" || page.starts_with("/packages/")) {
            return packages::answer(&self.package_cache, method, page).await;
        }
        if !private && !matches!(page, "/healthz" | "/readyz") {
            return error(
                StatusCode::NOT_FOUND,
                "valve's metrics, status and dashboard are on its admin address (see --admin-addr and the ready line), not on this port",
            );
        }
        match page {
            "" => redirect(&format!("{PREFIX}/")),
            "/healthz" => text(StatusCode::OK, plain, "ok\n"),
            "/readyz" => {
                if self.stopping.is_cancelled() {
                    text(StatusCode::SERVICE_UNAVAILABLE, plain, "draining\n")
                } else if self.ready() {
                    text(StatusCode::OK, plain, "ready\n")
                } else {
                    text(StatusCode::SERVICE_UNAVAILABLE, plain, "workers are starting\n")
                }
            }
            "/metrics" => {
                let mut body = self.registry.render(&self.gauges(), self.fleet.processes(), self.fleet.max_workers());
                if let Some(p) = self.publisher.get() {
                    body.push_str(&p.metrics());
                }
                text(StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", body)
            }
            "/status" => text(StatusCode::OK, "application/json", self.status().to_string()),
            "/" => text(StatusCode::OK, "text/html; charset=utf-8", SITE),
            "/apps" | "/apps/" => text(StatusCode::OK, "application/json", self.apps().to_string()),
            "/usage" => {
                let table = self.router.current();
                usage::answer(&self.registry.usage, query, |name| table.apps().iter().any(|m| m.config.name == name))
            }
            _ => match page.strip_prefix("/apps/").map(|rest| rest.split_at(rest.find('/').unwrap_or(rest.len()))) {
                Some((name, rest)) => self.app_page(name, rest, query),
                None => error(StatusCode::NOT_FOUND, "no such valve path; try /__valve__/ for the dashboard"),
            },
        }
    }

    /// A request for any of valve's pages where all are served: health and
    /// readiness for anyone; the sign-in; everything else once the caller
    /// is known (`auth`), a POST a session cookie carries only with its
    /// CSRF token; an operator sees all, a publishing key its own apps.
    pub async fn private(
        self: Arc<Self>,
        req: Request<Incoming>,
        peer: SocketAddr,
        secure: bool,
    ) -> Response<ReplyBody> {
        let path = req.uri().path().to_string();
        let method = req.method().clone();
        let query = req.uri().query().map(str::to_string);
        let page = path.strip_prefix(PREFIX).unwrap_or("");
        if matches!(page, "/healthz" | "/readyz") {
            return self.handle(&method, &path, query.as_deref(), true).await;
        }
        let publisher = self.publisher.get().cloned();
        let keys = move |k: &str| publisher.as_ref().and_then(|p| p.key(k)).map(|c| (c.name, c.admin));
        if path == auth::sign_in::PATH {
            return match method {
                Method::GET | Method::HEAD => auth::sign_in::page(StatusCode::OK, None),
                Method::POST => auth::sign_in::sign_in(&self.auth, req, secure, &keys).await,
                _ => not_allowed("GET or POST /__valve__/sign-in", "GET, POST"),
            };
        }
        if path == auth::sign_in::SIGN_OUT && method == Method::POST {
            return auth::sign_in::sign_out(&self.auth, req.headers(), secure);
        }
        let trust = self.router.current().trust.clone();
        let Some((who, shown)) = self.auth.who(req.headers(), peer, &trust, &keys) else {
            tracing::info!(target: "valve::admin", %peer, method = %method, path = %path, status = 401,
                "an admin page was asked for without a credential valve takes");
            return unauthorized(req.headers(), &method);
        };
        let safe = matches!(method, Method::GET | Method::HEAD | Method::OPTIONS);
        if let Shown::Cookie { csrf } = &shown {
            if !safe && !auth::csrf_ok(req.headers(), csrf) {
                tracing::warn!(target: "valve::admin", %peer, who = %who.label(), method = %method, path = %path,
                    status = 403, "a POST with the dashboard's cookie but not its CSRF token was refused (another site's page?)");
                return error(
                    StatusCode::FORBIDDEN,
                    "this change came with the dashboard's cookie but not its token (X-Valve-CSRF): valve's own page sends it, another site's cannot",
                );
            }
        }
        if page == "/session" {
            let csrf = match &shown {
                Shown::Cookie { csrf } => Some(csrf.clone()),
                Shown::Credential => None,
            };
            let body = serde_json::json!({ "who": who.label(), "operator": who.is_operator(), "csrf": csrf });
            return text(StatusCode::OK, "application/json", body.to_string());
        }
        if path.starts_with(publish::PAGES) || path == publish::PAGES.trim_end_matches('/') {
            return match self.publisher.get().cloned() {
                Some(p) => p.pages(req, &who).await,
                None => error(StatusCode::NOT_FOUND, "publishing is off here (no publish_dir)"),
            };
        }
        if !who.is_operator() {
            return self.as_publisher(&who, &method, page, query.as_deref());
        }
        self.handle(&method, &path, query.as_deref(), true).await
    }

    /// What a publishing key (not an admin key) may see here: the
    /// dashboard, and the apps it published.
    fn as_publisher(&self, who: &Who, method: &Method, page: &str, query: Option<&str>) -> Response<ReplyBody> {
        let owner_of = |name: &str| self.publisher.get().and_then(|p| p.owner_of(name));
        let mine = |name: &str| who.owns(owner_of(name).as_deref());
        if method != Method::GET && method != Method::HEAD {
            return error(StatusCode::FORBIDDEN, &format!("only an operator may do this ({} may not)", who.label()));
        }
        match page {
            "" => redirect(&format!("{PREFIX}/")),
            "/" => text(StatusCode::OK, "text/html; charset=utf-8", SITE),
            "/apps" | "/apps/" => text(StatusCode::OK, "application/json", self.apps_of(&mine).to_string()),
            _ => match page.strip_prefix("/apps/").map(|rest| rest.split_at(rest.find('/').unwrap_or(rest.len()))) {
                Some((name, rest)) if mine(name) => self.app_page(name, rest, query),
                Some((name, _)) => error(
                    StatusCode::FORBIDDEN,
                    &format!("{} may see only the apps it published; {name:?} is not one of them", who.label()),
                ),
                None => error(
                    StatusCode::FORBIDDEN,
                    &format!("only an operator may see this page ({} sees the apps it published)", who.label()),
                ),
            },
        }
    }

    /// `/__valve__/apps/NAME/...`: the app's page, status or log.
    fn app_page(&self, name: &str, rest: &str, query: Option<&str>) -> Response<ReplyBody> {
        let table = self.router.current();
        let Some(m) = table.apps().iter().find(|m| m.config.name == name) else {
            return no_such_app(name, &table);
        };
        match rest {
            "" if !name.is_empty() => redirect(&format!("{PREFIX}/apps/{name}/")),
            "/" => text(StatusCode::OK, "text/html; charset=utf-8", APP),
            "/status" => text(StatusCode::OK, "application/json", self.app_status(m).to_string()),
            "/logs" => logs::answer(name, self.registry.logs.app_log(name, m.config.log_buffer), query),
            _ => error(
                StatusCode::NOT_FOUND,
                &format!("no such page of app {name:?}: try {PREFIX}/apps/{name}/ (its page), status or logs"),
            ),
        }
    }

    /// `POST /__valve__/reload`: reads the configuration again and applies it.
    async fn reload(&self, method: &Method) -> Response<ReplyBody> {
        if method != Method::POST {
            let mut resp =
                error(StatusCode::METHOD_NOT_ALLOWED, "reload with POST /__valve__/reload (or send valve SIGHUP)");
            resp.headers_mut().insert(ALLOW, HeaderValue::from_static("POST"));
            return resp;
        }
        let Some(reloader) = self.reloader.get() else {
            return error(StatusCode::SERVICE_UNAVAILABLE, "valve is still starting; reload once it is ready");
        };
        if self.stopping.is_cancelled() {
            return error(StatusCode::SERVICE_UNAVAILABLE, "valve is shutting down; nothing was reloaded");
        }
        match reloader.reload().await {
            Ok(plan) => {
                let body = serde_json::json!({ "reloaded": true, "apps": plan });
                text(StatusCode::OK, "application/json", body.to_string())
            }
            Err(e) => {
                let problems: Vec<String> = e.to_string().lines().map(str::to_string).collect();
                let body = serde_json::json!({
                    "error": "the configuration has problems; nothing changed",
                    "problems": problems,
                });
                text(StatusCode::BAD_REQUEST, "application/json", body.to_string())
            }
        }
    }
}

/// 401: who is calling is unknown. A browser asking for a page gets the
/// sign-in page; anything else a short JSON error saying what to send.
fn unauthorized(headers: &http::HeaderMap, method: &Method) -> Response<ReplyBody> {
    let html = headers.get(ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|a| a.contains("text/html"));
    let mut resp = if html && method == Method::GET {
        auth::sign_in::page(StatusCode::UNAUTHORIZED, Some("Sign in to see valve's pages."))
    } else {
        error(
            StatusCode::UNAUTHORIZED,
            "valve's admin pages need a credential: `Authorization: Bearer TOKEN` (the operator token, admin.token in valve's state folder), `Authorization: Key KEY` (a publishing key), or a sign-in at /__valve__/sign-in",
        )
    };
    resp.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"valve\", Key"));
    resp
}

fn not_allowed(what: &str, allow: &'static str) -> Response<ReplyBody> {
    let mut resp = error(StatusCode::METHOD_NOT_ALLOWED, &format!("use {what}"));
    resp.headers_mut().insert(ALLOW, HeaderValue::from_static(allow));
    resp
}

/// 404 for an app valve does not serve, naming a few it does.
fn no_such_app(name: &str, table: &Table) -> Response<ReplyBody> {
    let mut names: Vec<&str> = table.apps().iter().map(|m: &Arc<Mounted>| m.config.name.as_str()).collect();
    names.sort();
    let some = names.iter().take(10).copied().collect::<Vec<_>>().join(", ");
    let more = if names.len() > 10 { format!(" and {} more", names.len() - 10) } else { String::new() };
    let shown = if valid_name(name) { format!("{name:?}") } else { "by that name".to_string() };
    error(
        StatusCode::NOT_FOUND,
        &format!("no app {shown} is served here; the apps are: {some}{more} (see {PREFIX}/apps)"),
    )
}

/// `/` under `--site`: the apps, as a plain page of links.
pub fn listing(table: &Table) -> Response<ReplyBody> {
    let mut apps: Vec<_> = table.apps().iter().filter(|m| m.config.hostname.is_none()).collect();
    apps.sort_by(|a, b| a.config.prefix.cmp(&b.config.prefix));
    let mut body = String::from(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Apps</title>\n\
         <style>body{font-family:system-ui,sans-serif;max-width:40em;margin:3em auto;line-height:1.6}\
         small{color:#666}</style></head>\n<body><h1>Apps</h1>\n<ul>\n",
    );
    for m in apps {
        let c = &m.config;
        let kind = match &c.source {
            AppSource::ShinyRmd { .. } => "interactive document",
            AppSource::ServerYml { .. } => "_server.yml app",
            AppSource::Static(_) => "static content",
            s if s.is_shiny() => "Shiny app",
            _ => "plumber API",
        };
        let docs = match c.source.family() {
            "plumber" => format!(" &middot; <a href=\"{}/__docs__/\">docs</a>", c.prefix),
            _ => String::new(),
        };
        body.push_str(&format!(
            "<li><a href=\"{p}/\">{n}</a> <small>{kind}{docs}</small></li>\n",
            p = c.prefix,
            n = html_escape(&c.name)
        ));
    }
    body.push_str("</ul>\n</body></html>\n");
    text(StatusCode::OK, "text/html; charset=utf-8", body)
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

impl crate::http::server::Publish for publish::Publisher {
    fn wants(&self, path: &str, admin: bool) -> bool {
        publish::Publisher::wants(path, admin)
    }

    fn handle(
        self: Arc<Self>,
        req: http::Request<hyper::body::Incoming>,
        admin: bool,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Response<ReplyBody>> + Send>> {
        Box::pin(publish::Publisher::handle(self, req, admin))
    }
}

impl Pages for Admin {
    fn handle<'a>(
        &'a self,
        method: &'a Method,
        path: &'a str,
        query: Option<&'a str>,
        private: bool,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Response<ReplyBody>> + Send + 'a>> {
        Box::pin(Admin::handle(self, method, path, query, private))
    }

    fn listing(&self, table: &Table) -> Response<ReplyBody> {
        listing(table)
    }

    fn private(
        self: Arc<Self>,
        req: Request<Incoming>,
        peer: SocketAddr,
        secure: bool,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Response<ReplyBody>> + Send>> {
        Box::pin(Admin::private(self, req, peer, secure))
    }
}

/// How an app is kept apart, as the status page says it.
pub(super) fn isolation(app: &AppConfig, site: Isolation) -> &'static str {
    match app.account.kind {
        AccountKind::Root => "none: runs as root (run_as = \"root\")",
        AccountKind::Valve if matches!(site, Isolation::Landlock(_)) => site.label(),
        AccountKind::Valve => Isolation::Shared.label(),
        AccountKind::Own | AccountKind::Named => site.label(),
    }
}
