//! What valve says of its apps as JSON: `/__valve__/status` (everything,
//! every worker), `/__valve__/apps` (the site dashboard's table: one compact
//! entry per app with its recent figures, no workers) and
//! `/__valve__/apps/NAME/status` (one app's page: its workers only). All are
//! built from one description of an app, so a field added to it shows in
//! each; none reads /proc or asks R anything.

use std::collections::BTreeSet;

use crate::http::router::Mounted;
use crate::metrics::Gauges;

use super::Admin;

/// How much of an app to describe.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Detail {
    /// The site dashboard's row: figures and a small chart, no workers.
    Summary,
    /// Its workers and its last 5 minutes too.
    Full,
}

/// Seconds of requests per second in a site dashboard row's chart.
const SPARK: usize = 60;

impl Admin {
    /// `/__valve__/status`: valve, every app and every worker.
    pub(super) fn status(&self) -> serde_json::Value {
        let table = self.router.current();
        let mut apps = Vec::new();
        let mut all_workers = Vec::new();
        let mut total = Gauges::default();
        for m in table.apps() {
            let (app, g, workers) = self.app(m, Detail::Full);
            total.add(&g);
            all_workers.extend(workers);
            apps.push(app);
        }
        let first = table.apps().first();
        let mut status = self.valve();
        let more = serde_json::json!({
            "workers": all_workers,
            "pool": { "starting": total.starting, "idle": total.idle, "busy": total.busy, "waiting": total.waiting,
                      "pending": total.pending, "draining": total.draining,
                      "n_min": first.map(|m| m.config.n_min), "n_max": first.map(|m| m.config.n_max) },
            "queue": { "waiting": total.queued,
                       "limit": first.map(|m| m.config.queue_size),
                       "timeout_s": first.map(|m| m.config.queue_timeout.as_secs_f64()) },
            "history": first.map(|m| m.sup.metrics.history()).unwrap_or_default(),
            "apps": apps,
            "not_served": self.not_served(),
            "config": self.config,
        });
        merge(&mut status, more);
        status
    }

    /// `/__valve__/apps`: every app's row of the site dashboard.
    pub(super) fn apps(&self) -> serde_json::Value {
        self.apps_of(&|_| true)
    }

    /// `/__valve__/apps` of the apps `visible` says (a publishing key's own).
    pub(super) fn apps_of(&self, visible: &dyn Fn(&str) -> bool) -> serde_json::Value {
        let table = self.router.current();
        let mut mounted: Vec<&Mounted> =
            table.apps().iter().map(|m| &**m).filter(|m| visible(&m.config.name)).collect();
        mounted.sort_by(|a, b| a.config.name.cmp(&b.config.name));
        let apps: Vec<serde_json::Value> = mounted.into_iter().map(|m| self.app(m, Detail::Summary).0).collect();
        let mut out = self.valve();
        let not_served: Vec<serde_json::Value> = self
            .not_served()
            .as_array()
            .into_iter()
            .flatten()
            .filter(|n| n["name"].as_str().is_some_and(visible))
            .cloned()
            .collect();
        merge(&mut out, serde_json::json!({ "apps": apps, "not_served": not_served }));
        out
    }

    /// `/__valve__/apps/NAME/status`: one app and its workers only.
    pub(super) fn app_status(&self, m: &Mounted) -> serde_json::Value {
        let mut out = self.valve();
        merge(&mut out, serde_json::json!({ "app": self.app(m, Detail::Full).0 }));
        out
    }

    /// Configured apps that serve no version (their packages could not be
    /// restored, or their first start failed), each with why.
    fn not_served(&self) -> serde_json::Value {
        let failed = self.reloader.get().map(|r| r.apps.not_served()).unwrap_or_default();
        failed.into_iter().map(|(name, error)| serde_json::json!({ "name": name, "error": error })).collect()
    }

    /// What every status answer says of valve itself.
    fn valve(&self) -> serde_json::Value {
        serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_s": self.started.elapsed().as_secs_f64(),
            "draining": self.stopping.is_cancelled(),
            "ready": self.ready(),
            "max_workers": self.fleet.max_workers(),
            "r_processes": self.fleet.processes(),
            "valve_user": valve_user(),
            "host": crate::config::host_name(),
            "isolation": isolation_json(self.isolation),
            "tls": self.tls_json(),
        })
    }

    /// The certificates served, by listener (null without HTTPS).
    fn tls_json(&self) -> serde_json::Value {
        let stores = self.registry.tls.stores();
        if stores.is_empty() {
            return serde_json::Value::Null;
        }
        stores
            .iter()
            .map(|(listener, store)| {
                let s = store.shown();
                let (source, from) = match &s.origin {
                    crate::tls::Origin::Files { cert, .. } => ("files", cert.display().to_string()),
                    crate::tls::Origin::Acme { directory } => ("acme", directory.clone()),
                };
                (
                    listener.to_string(),
                    serde_json::json!({
                        "source": source,
                        "from": from,
                        "names": s.names,
                        "not_after": httpdate::fmt_http_date(s.not_after),
                        "days_left": crate::tls::certs::days_left(s.not_after),
                        "since": httpdate::fmt_http_date(s.since),
                        "failing": s.failing,
                    }),
                )
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    }

    /// One app (its generations added up): the JSON, its gauges, and (with
    /// `Detail::Full`) its workers, each naming the app.
    fn app(&self, m: &Mounted, detail: Detail) -> (serde_json::Value, Gauges, Vec<serde_json::Value>) {
        let mut workers = Vec::new();
        let mut g = Gauges::default();
        let mut users = BTreeSet::new();
        for sup in std::iter::once(&m.sup).chain(m.older.iter()) {
            let status = sup.status();
            g.add(&status.gauges);
            for w in status.workers {
                users.extend(w.users.iter().cloned());
                let mut w = serde_json::to_value(&w).unwrap_or_default();
                w["app"] = m.config.name.clone().into();
                workers.push(w);
            }
        }
        let c = &m.config;
        let recent = m.sup.metrics.recent();
        let live = g.starting + g.idle + g.busy + g.waiting + g.draining;
        let mut app = serde_json::json!({
            "name": c.name,
            "path": c.prefix,
            "hostname": c.hostname,
            "kind": c.source.family(),
            "file": c.source.path(),
            "static": c.is_static(),
            "preload": c.preload,
            "ready": m.sup.ready(),
            "generations": 1 + m.older.len(),
            "pool": { "starting": g.starting, "idle": g.idle, "busy": g.busy, "waiting": g.waiting,
                      "pending": g.pending, "draining": g.draining,
                      "n_min": c.n_min, "n_max": c.n_max },
            "queue": { "waiting": g.queued, "limit": c.queue_size, "timeout_s": c.queue_timeout.as_secs_f64() },
            "sessions": g.sessions,
            "signed_in": users,
            "saturation": g.saturation(),
            // Whom its R runs as and how it is kept apart (none for static content: valve serves it).
            "user": (!c.is_static()).then(|| c.account.name.clone()),
            "uid": (!c.is_static()).then_some(c.account.uid),
            "isolation": (!c.is_static()).then(|| super::isolation(c, self.isolation)),
            "memory_limit": c.memory_limit,
            "memory_limit_errors": m.sup.metrics.memory_limit_errors(),
            // A published app's active version, when and by which key (none for others).
            "published": self.publisher.get().and_then(|p| p.status_of(&c.name)),
            // Its own library, when it names packages: how many, and from where.
            "packages": m.sup.settings.packages.as_ref().map(|s| {
                let from_r = s.packages.iter().filter(|e| e.from == crate::restore::cache::From::System).count();
                serde_json::json!({ "file": s.file, "r_version": s.r_version, "total": s.packages.len(),
                                    "from_r_library": from_r, "built": s.packages.len() - from_r })
            }),
            "live_workers": live,
            // No R process now, and none until a request comes (static content has none ever).
            "scaled_to_zero": !c.is_static() && c.n_min == 0 && live == 0,
            "recent": {
                "seconds": recent.seconds,
                "requests": recent.requests,
                "rps": if recent.seconds > 0 { recent.requests as f64 / recent.seconds as f64 } else { 0.0 },
                "p50_s": recent.p50,
                "p99_s": recent.p99,
                "errors": recent.errors,
                "error_rate": if recent.requests > 0 { recent.errors as f64 / recent.requests as f64 } else { 0.0 },
            },
            "settings": {
                "max_age_s": c.max_age.as_secs_f64(),
                "request_timeout_s": c.request_timeout.map(|d| d.as_secs_f64()),
                "max_body_size": c.max_body_size,
                "max_requests": c.max_requests,
                "max_worker_memory": c.max_worker_memory,
                "max_sessions": c.max_sessions,
                "max_pending": c.max_pending,
                "reconnect_window_s": c.reconnect_window.as_secs_f64(),
                "log_buffer": c.log_buffer,
            },
        });
        match detail {
            Detail::Full => {
                app["workers"] = serde_json::Value::Array(workers.clone());
                app["history"] = serde_json::to_value(m.sup.metrics.history()).unwrap_or_default();
            }
            Detail::Summary => {
                let history = m.sup.metrics.history();
                let spark: Vec<u64> = history.iter().rev().take(SPARK).rev().map(|p| p.requests).collect();
                app["spark"] = spark.into();
            }
        }
        (app, g, workers)
    }
}

/// Adds `more`'s keys to `into` (both objects).
fn merge(into: &mut serde_json::Value, more: serde_json::Value) {
    if let (Some(into), serde_json::Value::Object(more)) = (into.as_object_mut(), more) {
        into.extend(more);
    }
}

/// The name of the user valve runs as (from /etc/passwd, read once; else
/// its uid): what an app runs as when its status names no user of its own.
fn valve_user() -> &'static str {
    static USER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    USER.get_or_init(|| {
        let uid = rustix::process::geteuid().as_raw().to_string();
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
        passwd
            .lines()
            .find_map(|l| {
                let fields: Vec<&str> = l.split(':').collect();
                (fields.get(2) == Some(&uid.as_str())).then(|| fields[0].to_string())
            })
            .unwrap_or_else(|| format!("uid {uid}"))
    })
}

/// How valve keeps apps apart, and under Landlock what it does and does not
/// keep each app from (the kernel's ABI decides).
fn isolation_json(level: crate::config::Isolation) -> serde_json::Value {
    match level {
        crate::config::Isolation::Landlock(abi) => {
            let c = crate::config::LandlockCoverage::of(abi);
            serde_json::json!({
                "level": level.label(),
                "landlock_abi": abi,
                "complete": c.full(),
                "protected": c.protected,
                "unprotected": c.unprotected,
            })
        }
        _ => serde_json::json!({ "level": level.label() }),
    }
}
