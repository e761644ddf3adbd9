//! `RLauncher`: the real `Launch`, starting plain R processes (`spawn`),
//! forks of the app's own preloaded parent (`fork`, `--preload`) or forks of
//! the warm parent shared by apps (`zygote`), each with its connector
//! (frames, the worker's Unix socket, or for a `_server.yml` engine its
//! socket or a loopback TCP port picked for it), after the one render a
//! `shiny_prerendered` or Quarto document needs (`render`). A fork of the
//! warm parent that finds the app needs a fresh R (or whose parent died)
//! gives way to a plain R process under the same worker id (`WarmFork`).

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use super::conn::Conn;
use super::conn::{Connect, EngineConnector, SocketConnector};
use super::fork;
use super::job::Io;
use super::output::{self, Tail};
use super::process::{Exit, Launch, Launched, MemoryProbe, Process, StartError, Stop};
use super::render;
use super::spawn::{Plain, Spawner, Spec};
use super::wire::{BoxFuture, WorkerId};
use super::zygote::{Zygote, NEEDS_FRESH_R, SANDBOX_FAILED};
use crate::config::AppSource;

/// Starts real R workers: plain R processes, or forks of a preloaded parent.
pub struct RLauncher {
    spec: Arc<Spec>,
    spawner: Spawner,
    forks: Option<fork::ForkServer>,
    /// The warm parent the app's workers fork from, when it can use one.
    warm: Option<Arc<Zygote>>,
    /// Why the app's workers start as fresh R after all (a fork found that
    /// the app needs one): decided once for the generation.
    fresh: Arc<StdMutex<Option<String>>>,
    /// The document's one render (`shiny_prerendered` only), and its outcome.
    rendered: OnceCell<Result<(), render::Failed>>,
    /// Stops a render still running when the generation shuts down.
    stop: CancellationToken,
}

impl RLauncher {
    /// Must be called inside the tokio runtime that will own the workers.
    /// `warm`: the warm parent of the app's R, if it may fork the app's
    /// workers (not with `--preload`, which forks from the app's own parent,
    /// and never for an engine, which loads and serves in one call).
    pub fn new(mut spec: Spec, preload: bool, warm: Option<Arc<Zygote>>) -> io::Result<Self> {
        let preload = preload && spec.app.preloadable();
        if spec.app.prerendered() {
            spec.make_render_dir()?;
        }
        let warm = warm.filter(|z| !preload && spec.app.preloadable() && z.r_bin() == spec.r_bin);
        Ok(RLauncher {
            spec: Arc::new(spec),
            spawner: Spawner::shared()?,
            forks: preload.then(fork::ForkServer::new),
            warm,
            fresh: Arc::new(StdMutex::new(None)),
            rendered: OnceCell::new(),
            stop: CancellationToken::new(),
        })
    }
}

impl Launch for RLauncher {
    fn launch(&self, id: WorkerId) -> BoxFuture<'_, Result<Launched, StartError>> {
        Box::pin(async move {
            self.prepare().await?;
            let socket = self.spec.socket_path(id)?;
            let _ = std::fs::remove_file(&socket);
            let peer = self.spec.peer_uid();
            // An engine listens on a loopback port of its own (what its
            // launch_server() is given as host and port).
            let engine_port = match self.spec.app {
                AppSource::ServerYml { .. } => Some(free_loopback_port()?),
                _ => None,
            };
            // A frames worker's hello is expected before the worker can say it.
            let connector: Arc<dyn Connect> = match (&self.spec.frames, engine_port) {
                (_, Some(port)) => {
                    Arc::new(EngineConnector::new(socket.clone(), peer, SocketAddr::from((Ipv4Addr::LOCALHOST, port))))
                }
                (Some(hub), None) => Arc::new(hub.connector(id, self.spec.name.clone())),
                (None, None) => Arc::new(SocketConnector::new(socket.clone(), peer)),
            };
            let fresh = self.fresh.lock().unwrap_or_else(|p| p.into_inner()).is_some();
            let process: Box<dyn Process> = match (&self.forks, &self.warm) {
                (Some(forks), _) => Box::new(forks.fork(&self.spec, &self.spawner, id, socket).await?),
                (None, Some(warm)) if !fresh => match warm.fork(&self.spec, id, &socket).await {
                    Ok(fork) => Box::new(WarmFork {
                        fork,
                        plain: None,
                        spec: self.spec.clone(),
                        spawner: self.spawner.clone(),
                        id,
                        socket,
                        fresh: self.fresh.clone(),
                    }),
                    Err(unavailable) => {
                        tracing::debug!(app = %self.spec.name, worker = id, why = %unavailable.0, "starting a fresh R");
                        Box::new(spawn_plain(&self.spec, &self.spawner, id, &socket, engine_port).await?)
                    }
                },
                _ => Box::new(spawn_plain(&self.spec, &self.spawner, id, &socket, engine_port).await?),
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
            if self.spec.render_dir.is_some() {
                let spec = self.spec.clone();
                let _ = tokio::task::spawn_blocking(move || spec.remove_render_dir()).await;
            }
        })
    }
}

/// Starts worker `id` as a plain R process of the app.
async fn spawn_plain(
    spec: &Spec,
    spawner: &Spawner,
    id: WorkerId,
    socket: &Path,
    engine_port: Option<u16>,
) -> Result<Plain, StartError> {
    let mut cmd = spec.command("plain")?;
    cmd.env("VALVE_SOCKET", socket)
        .env("VALVE_LINK_TOKEN", super::conn::link_token(socket))
        .env("VALVE_WORKER_ID", id.to_string())
        .stdin(Io::Null);
    if let Some(token) = spec.frame_token(id) {
        cmd.env("VALVE_FRAME_TOKEN", token);
    }
    if let Some(port) = engine_port {
        cmd.env("VALVE_ENGINE_HOST", Ipv4Addr::LOCALHOST.to_string()).env("VALVE_ENGINE_PORT", port.to_string());
    }
    let mut child = spawner.spawn(&spec.r_bin, cmd.group_dies_with_it()).await?;
    let pid = child.id().ok_or_else(|| io::Error::other("worker exited at once"))?;
    let tail = Arc::new(Tail::default());
    output::forward(&mut child, &spec.sink(id, tail.clone()));
    tracing::debug!(app = %spec.name, worker = id, pid, "worker launched");
    Ok(Plain::new(child, pid, tail))
}

/// A worker asked of the warm parent. If the fork finds the app needs a
/// fresh R (code 6: its library paths hold other versions of what the parent
/// loaded), cannot enter the app's sandbox (code 7), or its parent dies
/// first, a plain R process takes its place under the same id, within the
/// same start timeout; codes 6 and 7 hold for the rest of the generation.
struct WarmFork {
    fork: fork::Fork,
    plain: Option<Plain>,
    spec: Arc<Spec>,
    spawner: Spawner,
    id: WorkerId,
    socket: PathBuf,
    fresh: Arc<StdMutex<Option<String>>>,
}

impl WarmFork {
    /// Why the fork gave way to a fresh R, if it did (else its error stands:
    /// the app itself failed, as it would have in a fresh R).
    fn gave_way(&self, e: &StartError) -> Option<(String, bool)> {
        if self.fork.parent_gone() {
            return Some(("the warm parent exited".into(), false));
        }
        let said = |marker: &str, tail: &[String]| {
            tail.iter().rev().find_map(|l| l.split_once(marker).map(|(_, why)| why.trim().to_string()))
        };
        match e {
            StartError::Exited { code: Some(NEEDS_FRESH_R), tail, .. } => {
                Some((said("valve-fresh-r: ", tail).unwrap_or_else(|| "it needs a fresh R".into()), true))
            }
            StartError::Exited { code: Some(SANDBOX_FAILED), tail, .. } => Some((
                format!(
                    "a fork could not enter the app's sandbox: {}",
                    said("valve-fork-failed: ", tail).unwrap_or_else(|| "no reason given".into())
                ),
                true,
            )),
            // Gone before it could say a word on its own output (a crash in
            // its first steps): this worker starts as a fresh R, at once.
            _ if !self.fork.opened() && !matches!(e, StartError::Timeout(..)) => {
                Some(("the fork ended before it started (its last words are in the app's log)".into(), false))
            }
            _ => None,
        }
    }
}

impl Process for WarmFork {
    fn pid(&self) -> Option<u32> {
        match &self.plain {
            Some(p) => p.pid(),
            None => self.fork.pid(),
        }
    }

    fn ready<'a>(
        &'a mut self,
        connector: &'a dyn Connect,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Conn, StartError>> {
        Box::pin(async move {
            let started = tokio::time::Instant::now();
            let error = match self.fork.ready(connector, timeout).await {
                Ok(conn) => return Ok(conn),
                Err(e) => e,
            };
            let Some((why, for_good)) = self.gave_way(&error) else { return Err(error) };
            self.fork.signal(Stop::Kill);
            if for_good {
                tracing::info!(app = %self.spec.name, worker = self.id, why = %why,
                    "the app's workers start as fresh R, not from the warm parent");
                *self.fresh.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
            } else {
                tracing::info!(app = %self.spec.name, worker = self.id, why = %why, "starting a fresh R instead");
            }
            let _ = std::fs::remove_file(&self.socket);
            let plain = spawn_plain(&self.spec, &self.spawner, self.id, &self.socket, None).await?;
            let plain = self.plain.insert(plain);
            plain.ready(connector, timeout.saturating_sub(started.elapsed())).await
        })
    }

    fn exited(&mut self) -> BoxFuture<'_, Exit> {
        match &mut self.plain {
            Some(p) => p.exited(),
            None => self.fork.exited(),
        }
    }

    fn signal(&self, stop: Stop) {
        match &self.plain {
            Some(p) => p.signal(stop),
            None => self.fork.signal(stop),
        }
    }

    fn memory(&self) -> Option<MemoryProbe> {
        match &self.plain {
            Some(p) => p.memory(),
            None => self.fork.memory(),
        }
    }

    fn started_by(&self) -> &'static str {
        match &self.plain {
            Some(_) => "fresh R",
            None => "warm parent",
        }
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
