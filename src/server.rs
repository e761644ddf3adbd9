//! The listener: accepts clients, serves HTTP/1.1 on each connection through
//! the proxy, and on shutdown stops accepting, drains, then stops the workers.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::task::TaskTracker;

use crate::admin::Admin;
use crate::config::Config;
use crate::proxy::Proxy;
use crate::shutdown::Shutdown;
use crate::supervisor::Supervisor;

/// How the drain at shutdown ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    /// Every request finished.
    Clean,
    /// Requests were still running when --graceful-timeout passed or a second signal came.
    Cut,
}

/// Serves until `shutdown.drain` fires, then drains within --graceful-timeout
/// (or until `shutdown.now`), then stops every worker.
pub async fn run(
    listener: TcpListener,
    sup: Arc<Supervisor>,
    shutdown: Shutdown,
    config: Config,
    admin: Option<Arc<Admin>>,
) -> Drained {
    let config = &config;
    let grace = config.graceful_timeout;
    let proxy = Proxy::new(sup.clone(), config, admin, shutdown.signalled.clone());
    let pruner = tokio::spawn(sup.clone().prune_loop(shutdown.drain.clone()));
    let connections = TaskTracker::new();
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(config.header_timeout);
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.drain.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let proxy = proxy.clone();
        let service = service_fn(move |req| proxy.clone().handle(req, peer));
        let conn = http.serve_connection(TokioIo::new(stream), service).with_upgrades();
        let drain = shutdown.drain.clone();
        connections.spawn(async move {
            tokio::pin!(conn);
            // On drain, finish the request in flight (if any), then close.
            let result = tokio::select! {
                r = conn.as_mut() => r,
                _ = drain.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, %peer, "client connection ended with an error");
            }
        });
    }
    drop(listener);
    let _ = pruner.await;
    connections.close();
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
    proxy.sessions.close();
    if !proxy.sessions.is_empty() {
        tracing::info!(sessions = proxy.sessions.len(), "waiting for open Shiny sessions to end");
        tokio::select! {
            _ = proxy.sessions.wait() => {}
            _ = tokio::time::sleep_until(deadline) => tracing::info!("closing the Shiny sessions still open"),
            _ = shutdown.now.cancelled() => {}
        }
        proxy.close_sessions.cancel();
    }
    sup.shutdown().await;
    drained
}

/// Serves valve's own pages on a listener of their own (`--admin-addr`), until
/// valve exits: it stays up through the drain so readiness can say so.
pub fn serve_admin(listener: TcpListener, admin: Arc<Admin>) {
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let _ = stream.set_nodelay(true);
            let admin = admin.clone();
            let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let admin = admin.clone();
                async move {
                    let path = req.uri().path();
                    let resp = if path.starts_with(crate::proxy::RESERVED_PREFIX) {
                        admin.handle(path)
                    } else {
                        crate::proxy::error(http::StatusCode::NOT_FOUND, "the admin listener serves /__valve__/ only")
                    };
                    Ok::<_, std::convert::Infallible>(resp)
                }
            });
            tokio::spawn(async move {
                let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
}

/// The address to print for people: the bound one.
pub fn display_addr(addr: SocketAddr) -> String {
    format!("http://{addr}")
}
