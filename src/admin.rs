//! valve's own pages under `/__valve__/`: liveness, readiness, Prometheus
//! metrics, a JSON status and a live dashboard. Never forwarded to R, and
//! none of them asks R anything.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::Full;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::proxy::{error, ProxyBody};
use crate::supervisor::Supervisor;

const DASHBOARD: &str = include_str!("dashboard.html");

pub struct Admin {
    sup: Arc<Supervisor>,
    draining: CancellationToken,
    started: Instant,
    config: serde_json::Value,
}

impl Admin {
    pub fn new(sup: Arc<Supervisor>, config: &Config, draining: CancellationToken) -> Arc<Self> {
        let secs = |d: std::time::Duration| d.as_secs_f64();
        let config = serde_json::json!({
            "app": config.app.path(),
            "host": config.host,
            "port": config.port,
            "n_min": config.n_min,
            "n_max": config.n_max,
            "preload": config.preload,
            "check_unused_s": secs(config.check_unused),
            "max_age_s": secs(config.max_age),
            "request_timeout_s": config.request_timeout.map(secs),
            "queue_size": config.queue_size,
            "queue_timeout_s": secs(config.queue_timeout),
            "max_body_size": config.max_body_size,
            "max_requests": config.max_requests,
            "max_worker_memory": config.max_worker_memory,
            "graceful_timeout_s": secs(config.graceful_timeout),
            "threads": config.threads,
        });
        Arc::new(Admin { sup, draining, started: Instant::now(), config })
    }

    /// Answers a `/__valve__/...` path.
    pub fn handle(&self, path: &str) -> Response<ProxyBody> {
        match path.strip_prefix(crate::proxy::RESERVED_PREFIX).unwrap_or("") {
            "healthz" => text(StatusCode::OK, "text/plain; charset=utf-8", "ok\n".into()),
            "readyz" => {
                if self.draining.is_cancelled() {
                    text(StatusCode::SERVICE_UNAVAILABLE, "text/plain; charset=utf-8", "draining\n".into())
                } else if self.sup.ready() {
                    text(StatusCode::OK, "text/plain; charset=utf-8", "ready\n".into())
                } else {
                    text(StatusCode::SERVICE_UNAVAILABLE, "text/plain; charset=utf-8", "workers are starting\n".into())
                }
            }
            "metrics" => {
                let body = self.sup.metrics.render(&self.sup.gauges());
                text(StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", body)
            }
            "status" => {
                let mut status = self.sup.status();
                status["uptime_s"] = self.started.elapsed().as_secs_f64().into();
                status["draining"] = self.draining.is_cancelled().into();
                status["version"] = env!("CARGO_PKG_VERSION").into();
                status["config"] = self.config.clone();
                status["history"] = self
                    .sup
                    .metrics
                    .history()
                    .iter()
                    .map(|p| {
                        serde_json::json!({
                            "t": p.unix, "requests": p.requests, "p50": p.p50, "p99": p.p99,
                            "queued": p.queued, "busy": p.busy, "idle": p.idle,
                        })
                    })
                    .collect();
                text(StatusCode::OK, "application/json", status.to_string())
            }
            "" => text(StatusCode::OK, "text/html; charset=utf-8", DASHBOARD.into()),
            _ => error(StatusCode::NOT_FOUND, "no such valve path"),
        }
    }
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<ProxyBody> {
    let mut resp = Response::new(ProxyBody::Full(Full::new(Bytes::from(body))));
    *resp.status_mut() = status;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}
