//! valve: one port in front of pools of R worker processes running plumber
//! APIs and Shiny apps (and static content, served by valve itself).
//!
//! Module map (see ARCHITECTURE.md for the invariants between them):
//! - `config`: flags and `VALVE_*` variables in, a checked `Config` out.
//! - `app`: one app's pool (pure decisions), its supervisor (which carries
//!   them out and owns the app's loops), leases and sticky workers; the fleet
//!   of apps and the worker budget across them.
//! - `worker`: starting, reaching, watching and signalling one R process.
//! - `http`: the listener and drain, the router (prefix and host to app), the
//!   one forwarding loop, bodies held whole, replies.
//! - `admin`: valve's own pages under /__valve__/, and publishing
//!   (`admin::publish`: the publishing API, deployments, versions).
//! - `applog`: every app's log buffer (R's output, valve's lines about it).
//! - `usage`: Shiny sessions and requests by user, kept and logged.
//! - `metrics`: counters, histograms and the dashboard's history.
//! - `log`: non-blocking logging, text or JSON.
//! - `mac`: valve's secret keys and their MACs (HMAC-SHA-256).
//! - `reload`: the apps being served, their generations, and reloads.
//! - `shutdown`: the signals that stop valve, fanned out as tokens.
//! - `trace`: OpenTelemetry traces: W3C `traceparent` in and out, spans
//!   exported over OTLP/HTTP through a bounded queue.
//! - `healthcheck`: `valve --healthcheck`.
//! - `client`: valve's HTTP/1.1 connections to services beside it.

pub mod admin;
pub mod app;
pub mod applog;
pub mod client;
pub mod config;
pub mod healthcheck;
pub mod http;
pub mod log;
pub mod mac;
pub mod metrics;
pub mod reload;
pub mod restore;
pub mod shutdown;
pub mod tls;
pub mod trace;
pub mod usage;
pub mod worker;

mod https;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;

use crate::admin::publish::Publisher;
use crate::admin::Admin;
use crate::app::Fleet;
use crate::config::{Config, Source, Transport};
use crate::http::conn::Speaks;
use crate::http::forward::{Forwarder, MAX_HEAD_BYTES};
use crate::http::router::Router;
use crate::http::server::{display_addr, ClientLimits, Drained, Front, FrontOptions};
use crate::metrics::Registry;
pub use crate::reload::RunError;
use crate::reload::{Apps, Reloader, Starters};
use crate::shutdown::Shutdown;

/// How often the start-up reports progress while the first workers load.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// The longest a client may leave an answer unread or a body unsent.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);

/// What valve serves, once every app is ready.
#[derive(Debug, Clone)]
pub struct Serving {
    pub addr: SocketAddr,
    pub admin: Option<SocketAddr>,
    /// The main port speaks HTTPS.
    pub tls: bool,
    /// The admin listener speaks HTTPS.
    pub admin_tls: bool,
    /// The plain-HTTP port that redirects to HTTPS, when there is one.
    pub http: Option<SocketAddr>,
    /// Where the operator token of the admin pages is (never the token).
    pub admin_token_file: std::path::PathBuf,
}

/// The listeners valve serves on, bound before any R starts.
pub struct Listeners {
    pub main: TcpListener,
    pub admin: Option<TcpListener>,
    /// Plain HTTP beside HTTPS (`--http-port`).
    pub http: Option<TcpListener>,
}

/// Binds the main listener (and the admin one, and the plain-HTTP one beside
/// HTTPS, if asked), so that bad addresses fail before any R starts.
pub async fn bind(config: &Config) -> Result<Listeners, RunError> {
    let s = &config.server;
    let main = bind_one(&format!("{}:{}", bracket(&s.host), s.port), "pick another --port").await?;
    let admin = match &s.admin_addr {
        None => None,
        Some(addr) => Some(bind_one(addr, "pick another --admin-addr HOST:PORT").await?),
    };
    let http = match s.tls.as_ref().and_then(|t| t.http_port) {
        None => None,
        Some(port) => Some(bind_one(&format!("{}:{port}", bracket(&s.host)), "pick another --http-port").await?),
    };
    Ok(Listeners { main, admin, http })
}

fn bracket(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

async fn bind_one(addr: &str, what: &'static str) -> Result<TcpListener, RunError> {
    TcpListener::bind(addr).await.map_err(|error| RunError::Bind {
        addr: addr.to_string(),
        hint: match error.kind() {
            std::io::ErrorKind::AddrInUse => match what {
                "pick another --port" => " (another program uses it: stop it or pick another --port)",
                "pick another --publish-addr HOST:PORT" => {
                    " (another program uses it: pick another --publish-addr HOST:PORT)"
                }
                "pick another --http-port" => " (another program uses it: pick another --http-port, or `off`)",
                _ => " (another program uses it: pick another --admin-addr HOST:PORT)",
            },
            std::io::ErrorKind::PermissionDenied => " (ports below 1024 need privileges: pick one above 1024)",
            _ => " (check --host and --port)",
        },
        error,
    })
}

/// Serves `config` on `listener` until `shutdown` has run its course: starts
/// every app's `n_min` workers (requests are accepted meanwhile and wait),
/// calls `ready` once all answer, then serves (reloading `source` on SIGHUP
/// and `POST /__valve__/reload`) until the drain ends and every worker has
/// stopped.
pub async fn run(
    config: Config,
    source: Source,
    listeners: Listeners,
    registry: Arc<Registry>,
    shutdown: Shutdown,
    ready: impl FnOnce(&Serving),
) -> Result<Drained, RunError> {
    // Listen for SIGHUP before anything can send it: its default action would
    // end valve. One that comes while workers start is applied once they have.
    let hup = hangups();
    let Listeners { main: listener, admin: admin_listener, http: http_listener } = listeners;
    let addr =
        listener.local_addr().map_err(|error| RunError::Bind { addr: config.server.host.clone(), error, hint: "" })?;
    let run_dir = worker::run_dir().map_err(RunError::RunDir)?;
    // Orphans (forks of a preload parent that died) are valve's to reap, for as
    // long as valve runs workers.
    let _reaper = tokio_util::task::AbortOnDropHandle::new(worker::reap::start());
    // As root: valve's side of the privileged spawner, which stops valve if the spawner dies.
    let _ = worker::privsep::client::client();
    let fleet = Fleet::new(config.server.max_workers);
    // One listener for every frames worker of this valve (plumber apps, now or after a reload).
    let frames = match config.server.worker_transport {
        Transport::Frames => Some(worker::FrameHub::start().map_err(RunError::WorkerListener)?),
        Transport::Httpuv => None,
    };
    // The warm parents workers fork from, one per R binary, started as apps ask.
    let zygotes = match config.server.warm_parent {
        true => Some(
            worker::zygote::Zygotes::new(run_dir.clone(), config.server.preload_packages.clone())
                .map_err(RunError::RunDir)?,
        ),
        false => None,
    };
    open_usage(&registry, &config)?;
    let router = Arc::new(Router::default());
    let apps = Apps::new(
        router.clone(),
        fleet.clone(),
        registry.clone(),
        Starters {
            run_dir: run_dir.clone(),
            frames,
            zygotes,
            builders: worker::builders::Builders::new(
                run_dir.path(),
                config.server.builder_uids.clone(),
                config.server.packages.builds,
            ),
        },
        &config,
        addr.port(),
    );
    let reloader = Reloader::new(apps.clone(), source.clone(), config.clone());
    let auth = Arc::new(
        admin::auth::Auth::start(&config.server.admin_access, &config.server.state_dir).map_err(RunError::Admin)?,
    );
    let admin_token = auth.token_file().to_path_buf();
    let admin = Admin::new(router.clone(), fleet.clone(), registry.clone(), &config, shutdown.signalled.clone(), auth);
    admin.set_reloader(reloader.clone());
    // Publishing, when on: its API on the admin listener (and its own address, if asked).
    let tls = https::Https::start(config.server.tls.as_ref()).map_err(RunError::Tls)?;
    if let Some(t) = &tls {
        registry.tls.set(t.stores());
    }
    let publisher = config
        .server
        .publish
        .as_ref()
        .map(|p| Publisher::new(p.clone(), reloader.clone(), display_addr(addr, tls.is_some())));
    if let Some(p) = &publisher {
        admin.set_publisher(p.clone());
    }
    let limits = ClientLimits {
        header_timeout: config.server.header_timeout,
        client_timeout: CLIENT_TIMEOUT,
        max_head: MAX_HEAD_BYTES * 2,
    };
    let publish: Option<Arc<dyn http::server::Publish>> = publisher.clone().map(|p| p as _);
    let admin_speaks = tls.as_ref().map(|t| t.admin()).unwrap_or(Speaks::Plain);
    let admin_addr =
        serve_admin_and_publish(admin_listener, admin_speaks.clone(), &admin, publish, &config, limits).await?;
    let http_addr = match (http_listener, &tls) {
        (Some(l), Some(t)) => {
            let at = l.local_addr().ok();
            http::redirect::serve_redirects(l, addr.port(), t.challenges.clone(), limits);
            at
        }
        _ => None,
    };
    let tracer = trace::Tracer::start(config.server.otlp.as_ref(), registry.clone());
    let front = Front::new(
        router.clone(),
        Forwarder::new(
            run_dir.path().to_path_buf(),
            CLIENT_TIMEOUT,
            http::resume::Bounds {
                session: config.server.shiny_session_buffer as usize,
                total: config.server.shiny_buffer_total as usize,
            },
        )
        .traced(tracer.clone()),
        http::auth::Asker::new(registry.clone()),
        admin.clone(),
        shutdown.signalled.clone(),
        FrontOptions {
            admin_on_main: config.server.admin_on_main,
            access_log: config.server.access_log,
            listing: matches!(source, Source::Site(..)),
            hsts: config.server.tls.as_ref().and_then(|t| t.hsts),
        },
    );
    for note in config.notes.iter().chain(&config.uids.notes) {
        tracing::info!("{note}");
    }
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
    for app in config.apps.iter().filter(|a| !a.is_static()) {
        tracing::info!(app = %app.name, path = %app.source.path().display(), mount = %app.prefix, workers = app.n_min,
            preload = app.preload, "starting workers");
    }
    // An ACME certificate not yet held is asked for now (its check comes to the plain-HTTP port).
    let main_speaks = match &tls {
        Some(t) => t.main().await.map_err(RunError::Tls)?,
        None => Speaks::Plain,
    };
    let starting = apps.start(&config);
    tokio::pin!(starting);
    // The Shiny sessions' tasks, to let them record their ends before the usage log closes.
    let sessions = front.forwarder.sessions.clone();
    // Serve at once: health checks answer while workers start, requests wait for them.
    let server = tokio::spawn(http::server::run(
        listener,
        main_speaks,
        front,
        shutdown.clone(),
        limits,
        config.server.graceful_timeout,
    ));
    let started = Instant::now();
    let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + PROGRESS_EVERY, PROGRESS_EVERY);
    loop {
        tokio::select! {
            result = &mut starting => match result {
                Ok(()) => break,
                Err(e) => {
                    apps.shutdown().await;
                    return Err(e);
                }
            },
            _ = progress.tick() => {
                for m in router.current().apps() {
                    let g = m.sup.gauges();
                    tracing::info!(app = %m.config.name, ready = g.idle + g.busy, wanted = m.config.n_min,
                        waited_s = started.elapsed().as_secs(), "still starting workers");
                }
            }
            _ = shutdown.drain.cancelled() => {
                apps.shutdown().await;
                registry.usage.close();
                tracer.shutdown().await;
                return Ok(Drained::Clean);
            }
        }
    }
    ready(&Serving {
        addr,
        admin: admin_addr,
        tls: tls.is_some(),
        admin_tls: admin_speaks.is_tls(),
        http: http_addr,
        admin_token_file: admin_token,
    });
    if let Some(hup) = hup {
        reload_on_hangup(hup, reloader, tls.as_ref().map(|t| t.again.clone()), shutdown.drain.clone());
    }
    let drained = server.await.unwrap_or(Drained::Cut);
    apps.shutdown().await;
    // Sessions end as their workers stop: what the usage log lacks goes now.
    let _ = tokio::time::timeout(Duration::from_secs(2), sessions.wait()).await;
    registry.usage.close();
    tracer.shutdown().await;
    Ok(drained)
}

/// Opens the usage log, when there is one, and reads back what it holds.
fn open_usage(registry: &Registry, config: &Config) -> Result<(), RunError> {
    let usage = usage::Settings {
        log: config.server.usage_log.clone(),
        anonymize: config.server.usage_anonymize,
        replica: usage::replica_name(&config.server.state_dir),
    };
    let opened = registry.usage.open(&usage).map_err(RunError::Usage)?;
    if let Some(path) = &usage.log {
        tracing::info!(path = %path.display(), sessions = opened.sessions, hours = opened.hours,
            shared = usage.shared_dir().map(|_| usage.replica.as_str()).unwrap_or("no"),
            "usage log read back: sessions and request counts");
        if opened.unreadable > 0 {
            tracing::warn!(path = %path.display(), lines = opened.unreadable, "lines of the usage log are not usage records; skipped");
        }
    }
    Ok(())
}

/// Serves valve's own pages on the admin listener, when there is one, and
/// the publishing API on its own address, when asked; says where the admin
/// pages are.
async fn serve_admin_and_publish(
    admin_listener: Option<TcpListener>,
    speaks: Speaks,
    admin: &Arc<Admin>,
    publish: Option<Arc<dyn http::server::Publish>>,
    config: &Config,
    limits: ClientLimits,
) -> Result<Option<SocketAddr>, RunError> {
    let admin_addr = match admin_listener {
        Some(l) => {
            let a = l.local_addr().ok();
            http::server::serve_admin(l, speaks.clone(), admin.clone(), limits, publish.clone());
            a
        }
        None => None,
    };
    if let (Some(p), Some(settings)) = (&publish, &config.server.publish) {
        match &settings.addr {
            Some(at) => {
                let l = bind_one(at, "pick another --publish-addr HOST:PORT").await?;
                if let Ok(bound) = l.local_addr() {
                    tracing::info!(addr = %bound, "publishing API on its own address");
                }
                http::server::serve_publish(l, speaks.clone(), p.clone(), limits);
            }
            None if admin_addr.is_none() => tracing::warn!(
                "publishing is on but valve has no admin listener (--admin-addr off) and no --publish-addr: nobody can publish"
            ),
            None => {}
        }
    }
    Ok(admin_addr)
}

fn hangups() -> Option<tokio::signal::unix::Signal> {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP: reload with POST /__valve__/reload");
            None
        }
    }
}

/// SIGHUP reloads the configuration (until the drain begins).
fn reload_on_hangup(
    mut hup: tokio::signal::unix::Signal,
    reloader: Arc<Reloader>,
    certificates: Option<Arc<tokio::sync::Notify>>,
    drain: tokio_util::sync::CancellationToken,
) {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = drain.cancelled() => return,
                got = hup.recv() => if got.is_none() { return },
            }
            tracing::info!("SIGHUP: reloading the configuration");
            if let Some(certificates) = &certificates {
                certificates.notify_one();
            }
            let _ = reloader.reload().await;
        }
    });
}
