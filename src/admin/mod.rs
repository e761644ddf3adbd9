//! valve's own pages under `/__valve__/`: liveness, readiness, Prometheus
//! metrics, a JSON status and a live dashboard. Never forwarded to R, and
//! none of them asks R anything (memory is what each worker's task sampled),
//! so a long computation cannot fail a probe. Publishing (`publish/`) is a
//! room of its own: the publishing API and valve's pages of published apps.

pub mod publish;

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use http::header::{HeaderValue, ALLOW};
use http::{Method, Response, StatusCode};
use tokio_util::sync::CancellationToken;

use crate::app::Fleet;
use crate::config::{AccountKind, AppConfig, AppSource, Config, Isolation};
use crate::http::reply::{error, redirect, text, ReplyBody};
use crate::http::router::{Router, Table};
use crate::http::server::Pages;
use crate::metrics::{Gauges, Registry};
use crate::reload::Reloader;

const DASHBOARD: &str = include_str!("dashboard.html");

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
}

impl Admin {
    pub fn new(
        router: Arc<Router>,
        fleet: Arc<Fleet>,
        registry: Arc<Registry>,
        config: &Config,
        stopping: CancellationToken,
    ) -> Arc<Self> {
        let isolation = config.server.isolation;
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
    pub async fn handle(&self, method: &Method, path: &str, private: bool) -> Response<ReplyBody> {
        let plain = "text/plain; charset=utf-8";
        let page = path.strip_prefix(PREFIX).unwrap_or("");
        if private && page == "/reload" {
            return self.reload(method).await;
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
            "/" => text(StatusCode::OK, "text/html; charset=utf-8", DASHBOARD),
            _ => error(StatusCode::NOT_FOUND, "no such valve path; try /__valve__/ for the dashboard"),
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

    fn status(&self) -> serde_json::Value {
        let table = self.router.current();
        let mut apps = Vec::new();
        let mut all_workers = Vec::new();
        let mut total = Gauges::default();
        for m in table.apps() {
            let mut workers = Vec::new();
            let mut g = Gauges::default();
            for sup in std::iter::once(&m.sup).chain(m.older.iter()) {
                let status = sup.status();
                g.add(&status.gauges);
                for w in status.workers {
                    let mut w = serde_json::to_value(&w).unwrap_or_default();
                    w["app"] = m.config.name.clone().into();
                    workers.push(w);
                }
            }
            total.add(&g);
            all_workers.extend(workers.iter().cloned());
            let c = &m.config;
            apps.push(serde_json::json!({
                "name": c.name,
                "path": c.prefix,
                "hostname": c.hostname,
                "kind": c.source.family(),
                "file": c.source.path(),
                "preload": c.preload,
                "ready": m.sup.ready(),
                "generations": 1 + m.older.len(),
                "pool": { "starting": g.starting, "idle": g.idle, "busy": g.busy, "waiting": g.waiting,
                          "pending": g.pending, "draining": g.draining,
                          "n_min": c.n_min, "n_max": c.n_max },
                "queue": { "waiting": g.queued, "limit": c.queue_size, "timeout_s": c.queue_timeout.as_secs_f64() },
                "sessions": g.sessions,
                "saturation": g.saturation(),
                // Whom its R runs as and how it is kept apart (none for static content: valve serves it).
                "user": (!c.is_static()).then(|| c.account.name.clone()),
                "uid": (!c.is_static()).then_some(c.account.uid),
                "isolation": (!c.is_static()).then(|| isolation(c, self.isolation)),
                "memory_limit": c.memory_limit,
                "memory_limit_errors": m.sup.metrics.memory_limit_errors(),
                "workers": workers,
                "history": m.sup.metrics.history(),
                "published": self.publisher.get().and_then(|p| p.status_of(&c.name)),
                "settings": {
                    "max_age_s": c.max_age.as_secs_f64(),
                    "request_timeout_s": c.request_timeout.map(|d| d.as_secs_f64()),
                    "max_body_size": c.max_body_size,
                    "max_requests": c.max_requests,
                    "max_worker_memory": c.max_worker_memory,
                    "max_sessions": c.max_sessions,
                    "max_pending": c.max_pending,
                    "reconnect_window_s": c.reconnect_window.as_secs_f64(),
                },
            }));
        }
        let first = table.apps().first();
        serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_s": self.started.elapsed().as_secs_f64(),
            "draining": self.stopping.is_cancelled(),
            "ready": self.ready(),
            "max_workers": self.fleet.max_workers(),
            "r_processes": self.fleet.processes(),
            "workers": all_workers,
            "pool": { "starting": total.starting, "idle": total.idle, "busy": total.busy, "waiting": total.waiting,
                      "pending": total.pending, "draining": total.draining,
                      "n_min": first.map(|m| m.config.n_min), "n_max": first.map(|m| m.config.n_max) },
            "queue": { "waiting": total.queued,
                       "limit": first.map(|m| m.config.queue_size),
                       "timeout_s": first.map(|m| m.config.queue_timeout.as_secs_f64()) },
            "history": first.map(|m| m.sup.metrics.history()).unwrap_or_default(),
            "apps": apps,
            "config": self.config,
        })
    }
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
        private: bool,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Response<ReplyBody>> + Send + 'a>> {
        Box::pin(Admin::handle(self, method, path, private))
    }

    fn listing(&self, table: &Table) -> Response<ReplyBody> {
        listing(table)
    }
}

/// How an app is kept apart, as the status page says it.
fn isolation(app: &AppConfig, site: Isolation) -> &'static str {
    match app.account.kind {
        AccountKind::Root => "none: runs as root (run_as = \"root\")",
        AccountKind::Valve => Isolation::Shared.label(),
        AccountKind::Own | AccountKind::Named => site.label(),
    }
}
