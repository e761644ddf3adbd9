//! `RLauncher`: the real `Launch`, starting plain R processes (`spawn`) or
//! forks of a preloaded parent (`fork`), each with its connector (frames,
//! the worker's Unix socket, or for a `_server.yml` engine a loopback TCP
//! port picked for it), after the one render a `shiny_prerendered` or
//! Quarto document needs (`render`).

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::Stdio;
use std::sync::Arc;

use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use super::conn::{Connect, EngineConnector, SocketConnector};
use super::fork;
use super::output::{self, Tail};
use super::process::{Launch, Launched, Process, StartError};
use super::render;
use super::spawn::{Plain, Spawner, Spec};
use super::wire::{BoxFuture, WorkerId};
use crate::config::AppSource;

/// Starts real R workers: plain R processes, or forks of a preloaded parent.
pub struct RLauncher {
    spec: Arc<Spec>,
    spawner: Spawner,
    forks: Option<fork::ForkServer>,
    /// The document's one render (`shiny_prerendered` only), and its outcome.
    rendered: OnceCell<Result<(), render::Failed>>,
    /// Stops a render still running when the generation shuts down.
    stop: CancellationToken,
}

impl RLauncher {
    /// Must be called inside the tokio runtime that will own the workers.
    pub fn new(mut spec: Spec, preload: bool) -> io::Result<Self> {
        let preload = preload && spec.app.preloadable();
        if spec.app.prerendered() {
            spec.make_render_dir()?;
        }
        Ok(RLauncher {
            spec: Arc::new(spec),
            spawner: Spawner::shared()?,
            forks: preload.then(fork::ForkServer::new),
            rendered: OnceCell::new(),
            stop: CancellationToken::new(),
        })
    }
}

impl Launch for RLauncher {
    fn launch(&self, id: WorkerId) -> BoxFuture<'_, Result<Launched, StartError>> {
        Box::pin(async move {
            self.prepare().await?;
            let socket = self.spec.socket_path(id);
            let _ = std::fs::remove_file(&socket);
            // An engine listens on a loopback port of its own (what its
            // launch_server() is given as host and port).
            let engine_port = match self.spec.app {
                AppSource::ServerYml { .. } => Some(free_loopback_port()?),
                _ => None,
            };
            // A frames worker's hello is expected before the worker can say it.
            let connector: Arc<dyn Connect> = match (&self.spec.frames, engine_port) {
                (_, Some(port)) => {
                    Arc::new(EngineConnector::new(socket.clone(), SocketAddr::from((Ipv4Addr::LOCALHOST, port))))
                }
                (Some(hub), None) => Arc::new(hub.connector(id, self.spec.name.clone())),
                (None, None) => Arc::new(SocketConnector::new(socket.clone())),
            };
            let process: Box<dyn Process> = match &self.forks {
                Some(forks) => Box::new(forks.fork(&self.spec, &self.spawner, id, socket).await?),
                None => {
                    let mut cmd = self.spec.command("plain")?;
                    cmd.env("VALVE_SOCKET", &socket).env("VALVE_WORKER_ID", id.to_string()).stdin(Stdio::null());
                    if let Some(token) = self.spec.frame_token(id) {
                        cmd.env("VALVE_FRAME_TOKEN", token);
                    }
                    if let Some(port) = engine_port {
                        cmd.env("VALVE_ENGINE_HOST", Ipv4Addr::LOCALHOST.to_string())
                            .env("VALVE_ENGINE_PORT", port.to_string());
                    }
                    let (mut child, own) = self.spawner.spawn(&self.spec.r_bin, cmd).await?;
                    let pid = child.id().ok_or_else(|| io::Error::other("worker exited at once"))?;
                    let tail = Arc::new(Tail::default());
                    output::forward(&mut child, &self.spec.sink(id, tail.clone()));
                    tracing::debug!(app = %self.spec.name, worker = id, pid, "worker launched");
                    Box::new(Plain::new(child, own, pid, tail)?)
                }
            };
            Ok(Launched { process, connector })
        })
    }

    fn prepare(&self) -> BoxFuture<'_, Result<(), StartError>> {
        Box::pin(async move {
            if !self.spec.app.prerendered() {
                return Ok(());
            }
            if self.spec.app.quarto() {
                render::quarto_binary()
                    .map_err(|path| StartError::NoQuarto { doc: self.spec.app.path().display().to_string(), path })?;
            }
            let outcome = self.rendered.get_or_init(|| render::prerender(&self.spec, &self.spawner, &self.stop)).await;
            outcome.clone().map_err(|failed| failed.error(&self.spec))
        })
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.stop.cancel();
            if let Some(forks) = &self.forks {
                forks.shutdown().await;
            }
            if let Some(dir) = self.spec.render_dir.clone() {
                let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
            }
        })
    }
}

/// A loopback port free now, for an engine to listen on. The kernel picks it
/// and valve lets it go at once; should another program take it before the
/// engine binds it, the engine fails to start and is started again on
/// another (the usual backoff).
fn free_loopback_port() -> io::Result<u16> {
    let probe = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(probe.local_addr()?.port())
}

/// Launches nothing: static content's generation, whose pool has no room for
/// a worker (`n_max` = 0). Asked anyway, it refuses rather than start R.
pub struct NoWorkers;

impl Launch for NoWorkers {
    fn launch(&self, _id: WorkerId) -> BoxFuture<'_, Result<Launched, StartError>> {
        Box::pin(async { Err(StartError::Io(io::Error::other("static content starts no R worker"))) })
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}
