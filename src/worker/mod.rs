//! How one R worker is started, reached, watched and stopped. This is the only
//! module that creates or signals processes.
//!
//! A worker serves the API on its own Unix socket inside valve's private 0700
//! run directory. It is either a plain process (`R --file=launcher.R`, the
//! leader of its own process group, with a parent-death signal so it dies with
//! valve even when valve is SIGKILLed) or, with `--preload`, a fork of one
//! parent R process that loaded the API once (see `fork.rs`).

mod fork;

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Either, Empty};
use hyper_util::rt::TokioIo;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::net::UnixStream;
use tokio::process::{Child, Command};
use tokio::sync::{oneshot, watch};

use crate::body::ReqBody;
use crate::config::App;
use crate::pool::WorkerId;

/// The R code each worker runs.
const LAUNCHER: &str = include_str!("launcher.R");

/// The path workers answer for readiness probes; valve never forwards `/__valve__/` paths.
const PING_PATH: &str = "/__valve__/ping";

/// How many of a worker's last output lines are kept to explain a failed start.
const TAIL_LINES: usize = 40;

/// How often a starting worker's socket is probed.
const PROBE_EVERY: Duration = Duration::from_millis(2);

/// One HTTP/1.1 connection to a worker's socket, kept alive between requests.
pub type Conn = hyper::client::conn::http1::SendRequest<ReqBody>;

/// What every worker of this valve run shares.
#[derive(Debug)]
pub struct Spec {
    pub r_bin: PathBuf,
    pub app: App,
    /// The address clients use, so plumber's docs and messages show it.
    pub public_host: String,
    pub public_port: u16,
    run_dir: tempfile::TempDir,
    launcher: PathBuf,
}

impl Spec {
    /// Creates the private run directory (mode 0700) and writes the launcher into it.
    pub fn new(r_bin: PathBuf, app: App, public_host: String, public_port: u16) -> io::Result<Self> {
        let run_dir = tempfile::Builder::new().prefix("valve-").tempdir()?;
        let launcher = run_dir.path().join("launcher.R");
        std::fs::write(&launcher, LAUNCHER)?;
        Ok(Spec { r_bin, app, public_host, public_port, run_dir, launcher })
    }

    pub fn socket_path(&self, id: WorkerId) -> PathBuf {
        self.run_dir.path().join(format!("w{id}.sock"))
    }

    fn path(&self, name: &str) -> PathBuf {
        self.run_dir.path().join(name)
    }

    /// `R --file=launcher.R` with the environment every launcher mode reads.
    fn command(&self, mode: &str) -> Command {
        let mut cmd = Command::new(&self.r_bin);
        cmd.arg("--no-echo")
            .arg("--no-restore")
            .arg("--no-save")
            .arg(format!("--file={}", self.launcher.display()))
            .current_dir(self.app.workdir())
            .env("VALVE_MODE", mode)
            .env("VALVE_APP", self.app.path())
            .env("VALVE_APP_KIND", self.app.kind())
            .env("VALVE_PUBLIC_HOST", &self.public_host)
            .env("VALVE_PUBLIC_PORT", self.public_port.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let parent = std::process::id();
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // valve may have died between fork and prctl; then nobody would kill us.
                if libc::getppid() as u32 != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        cmd
    }
}

/// The last lines a worker printed, kept to explain why it failed.
#[derive(Debug, Default)]
pub struct Tail(Mutex<VecDeque<String>>);

impl Tail {
    fn push(&self, line: String) {
        let mut lines = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if lines.len() == TAIL_LINES {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    pub fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect()
    }
}

/// Whom to signal to stop a worker, and how to read its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Not known yet (a fork before it answered).
    Unknown,
    /// A plain worker: the leader of its own process group.
    Group(u32),
    /// A forked worker: it shares its parent's group, so only itself.
    Fork(u32),
}

impl Target {
    pub fn pid(self) -> Option<u32> {
        match self {
            Target::Unknown => None,
            Target::Group(pid) | Target::Fork(pid) => Some(pid),
        }
    }

    /// Sends `signal` to the worker (and, for a plain worker, all it started).
    pub fn signal(self, signal: libc::c_int) {
        let target = match self {
            Target::Unknown => return,
            Target::Group(pid) => -(pid as libc::pid_t),
            Target::Fork(pid) => pid as libc::pid_t,
        };
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe {
            libc::kill(target, signal);
        }
    }

    /// The memory that is the worker's own: RSS for a plain worker; for a
    /// fork, its private pages only, since the pages it shares with its parent
    /// cost nothing extra.
    pub fn memory_bytes(self) -> Option<u64> {
        match self {
            Target::Unknown => None,
            Target::Group(pid) => rss_bytes(pid),
            Target::Fork(pid) => private_bytes(pid),
        }
    }
}

/// How valve learns that a worker exited.
#[derive(Debug)]
enum Watch {
    /// valve's own child.
    Child(Child),
    /// A fork: its parent's exit until its pid is known, then a pidfd.
    Fork {
        parent: watch::Receiver<Option<fork::ParentExit>>,
        pid: Option<oneshot::Receiver<u32>>,
        pidfd: Option<AsyncFd<OwnedFd>>,
    },
}

/// A running worker process.
#[derive(Debug)]
pub struct Process {
    pub id: WorkerId,
    pub target: Target,
    pub socket: PathBuf,
    pub tail: Arc<Tail>,
    watch: Watch,
}

/// Why a worker did not come up.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot run R ({r_bin}): {reason}")]
    NoR { r_bin: String, reason: String },
    #[error("worker exited before answering ({status})")]
    Exited { status: String, code: Option<i32>, tail: Vec<String> },
    #[error("worker did not answer within {0:?} (raise --start-timeout if the API takes longer to load)")]
    Timeout(Duration, Vec<String>),
    #[error("cannot start worker: {0}")]
    Io(#[from] io::Error),
}

impl StartError {
    /// What R printed before it failed, if anything.
    pub fn tail(&self) -> &[String] {
        match self {
            StartError::Exited { tail, .. } | StartError::Timeout(_, tail) => tail,
            _ => &[],
        }
    }

    /// Whether the failure is in the set-up (R or a package missing) rather than in one worker.
    pub fn missing_package(&self) -> bool {
        matches!(self, StartError::Exited { code: Some(3), .. })
    }
}

/// Starts processes from one long-lived thread. Linux delivers the parent-death
/// signal when the *thread* that forked a child exits, so children must not be
/// forked from threads that come and go (tokio's blocking pool).
#[derive(Clone, Debug)]
struct Spawner {
    jobs: std::sync::mpsc::Sender<(Command, oneshot::Sender<io::Result<Child>>)>,
}

impl Spawner {
    fn new() -> io::Result<Self> {
        let handle = tokio::runtime::Handle::current();
        let (jobs, rx) = std::sync::mpsc::channel::<(Command, oneshot::Sender<io::Result<Child>>)>();
        std::thread::Builder::new().name("valve-spawner".into()).spawn(move || {
            let _runtime = handle.enter();
            for (mut cmd, reply) in rx {
                let _ = reply.send(cmd.spawn());
            }
        })?;
        Ok(Spawner { jobs })
    }

    async fn spawn(&self, spec: &Spec, cmd: Command) -> Result<Child, StartError> {
        let (tx, rx) = oneshot::channel();
        let gone = || StartError::Io(io::Error::other("spawner thread is gone"));
        self.jobs.send((cmd, tx)).map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?.map_err(|e| StartError::NoR {
            r_bin: spec.r_bin.display().to_string(),
            reason: match e.kind() {
                io::ErrorKind::NotFound => {
                    "not found (install R, e.g. `apt-get install r-base-core r-cran-plumber`, or pass --r-bin)".into()
                }
                io::ErrorKind::PermissionDenied => "permission denied (is it executable?)".into(),
                _ => e.to_string(),
            },
        })
    }
}

/// Starts workers: plain R processes, or forks of a preloaded parent.
#[derive(Debug)]
pub struct Launcher {
    spec: Spec,
    spawner: Spawner,
    forks: Option<fork::ForkServer>,
}

impl Launcher {
    /// Must be called inside the tokio runtime that will own the workers.
    pub fn new(spec: Spec, preload: bool) -> io::Result<Self> {
        Ok(Launcher { spec, spawner: Spawner::new()?, forks: preload.then(fork::ForkServer::new) })
    }

    /// Launches worker `id`. It is not ready until `wait_ready` says so.
    pub async fn launch(&self, id: WorkerId) -> Result<Process, StartError> {
        let socket = self.spec.socket_path(id);
        let _ = std::fs::remove_file(&socket);
        if let Some(forks) = &self.forks {
            return forks.fork(&self.spec, &self.spawner, id, socket).await;
        }
        let mut cmd = self.spec.command("plain");
        cmd.env("VALVE_SOCKET", &socket).env("VALVE_WORKER_ID", id.to_string()).stdin(Stdio::null());
        let mut child = self.spawner.spawn(&self.spec, cmd).await?;
        let pid = child.id().ok_or_else(|| io::Error::other("worker exited at once"))?;
        let tail = Arc::new(Tail::default());
        forward_output(&mut child, id, tail.clone());
        tracing::debug!(worker = id, pid, "worker launched");
        Ok(Process { id, target: Target::Group(pid), socket, tail, watch: Watch::Child(child) })
    }

    /// Stops the preload parent, if any (after the workers are gone).
    pub async fn shutdown(&self) {
        if let Some(forks) = &self.forks {
            forks.shutdown().await;
        }
    }
}

/// Turns each line a process prints into a log event carrying the worker's id.
fn forward_output(child: &mut Child, id: WorkerId, tail: Arc<Tail>) {
    let pid = child.id().unwrap_or_default();
    if let Some(out) = child.stdout.take() {
        tokio::spawn(log_lines(out, id, pid, "stdout", tail.clone()));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(log_lines(err, id, pid, "stderr", tail));
    }
}

async fn log_lines(stream: impl AsyncRead + Unpin, id: WorkerId, pid: u32, name: &'static str, tail: Arc<Tail>) {
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        tracing::info!(target: "valve::worker::output", worker = id, pid, stream = name, "{line}");
        tail.push(line);
    }
}

impl Process {
    /// Waits until the worker answers on its socket, or fails if it exits first or
    /// takes longer than `timeout`. Returns the connection that proved it ready.
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<Conn, StartError> {
        let Process { socket, tail, watch, target, .. } = self;
        let probe = async {
            loop {
                if let Ok(ready) = probe(socket).await {
                    return ready;
                }
                tokio::time::sleep(PROBE_EVERY).await;
            }
        };
        let exited = async {
            match watch {
                Watch::Child(child) => {
                    let status = child.wait().await;
                    // Let the output readers catch R's last words.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    match status {
                        Ok(status) => {
                            StartError::Exited { status: describe(status), code: status.code(), tail: tail.lines() }
                        }
                        Err(e) => StartError::Io(e),
                    }
                }
                Watch::Fork { parent, pid, pidfd } => {
                    let parent_exit = async {
                        fork::parent_gone(parent.wait_for(Option::is_some).await.ok().and_then(|w| w.clone()))
                    };
                    tokio::pin!(parent_exit);
                    if let Some(rx) = pid.take() {
                        tokio::select! {
                            error = &mut parent_exit => return error,
                            got = rx => if let Ok(p) = got {
                                *target = Target::Fork(p);
                                *pidfd = pidfd_open(p).ok();
                            },
                        }
                    }
                    match pidfd {
                        Some(fd) => tokio::select! {
                            error = &mut parent_exit => error,
                            _ = fd.readable() => {
                                tokio::time::sleep(Duration::from_millis(50)).await;
                                StartError::Exited { status: "the fork exited".into(), code: None, tail: tail.lines() }
                            }
                        },
                        None => parent_exit.await,
                    }
                }
            }
        };
        let (conn, pid) = tokio::select! {
            ready = tokio::time::timeout(timeout, probe) => {
                ready.map_err(|_| StartError::Timeout(timeout, self.tail.lines()))?
            }
            error = exited => return Err(error),
        };
        if let Watch::Fork { pidfd, .. } = &mut self.watch {
            let pid = pid.ok_or_else(|| io::Error::other("a forked worker did not say its pid"))?;
            self.target = Target::Fork(pid);
            if pidfd.is_none() {
                *pidfd = pidfd_open(pid).ok();
            }
        }
        Ok(conn)
    }

    /// Waits for the process to exit and describes how it did.
    pub async fn wait(&mut self) -> String {
        match &mut self.watch {
            Watch::Child(child) => match child.wait().await {
                Ok(status) => describe(status),
                Err(e) => format!("unknown ({e})"),
            },
            Watch::Fork { pidfd: Some(fd), .. } => {
                // A pidfd turns readable when the process exits; its parent reaps it.
                let _ = fd.readable().await;
                "exited (a fork: its parent collects the status)".to_string()
            }
            Watch::Fork { pidfd: None, .. } => "exited before it could be watched".to_string(),
        }
    }
}

/// Opens a pidfd: a file descriptor that becomes readable when `pid` exits,
/// even though `pid` is not valve's child.
fn pidfd_open(pid: u32) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the descriptor was just created and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    debug_assert!(fd.as_raw_fd() >= 0);
    // SAFETY: the AsyncFd owns the descriptor and deregisters it before closing it.
    unsafe { AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)
}

/// Connects to a worker's socket and checks it answers HTTP. A plumber
/// worker's answer carries its pid.
pub async fn probe(socket: &Path) -> io::Result<(Conn, Option<u32>)> {
    let mut conn = connect(socket, false).await?;
    let req = http::Request::get(PING_PATH)
        .header(http::header::HOST, "valve")
        .body(Either::Right(Empty::new()))
        .map_err(io::Error::other)?;
    conn.ready().await.map_err(io::Error::other)?;
    let resp = conn.send_request(req).await.map_err(io::Error::other)?;
    // Any answer means the worker serves. Plumber workers (through the
    // launcher's wrapper) also say their pid; a Shiny app just answers 404.
    let body = resp.into_body().collect().await.map_err(io::Error::other)?.to_bytes();
    let pid = std::str::from_utf8(&body).ok().and_then(|b| b.strip_prefix("valve-worker-ready ")?.trim().parse().ok());
    Ok((conn, pid))
}

/// Opens a fresh HTTP/1.1 connection to a worker's socket; `upgradable` for a
/// WebSocket, whose connection is handed over after the upgrade.
pub async fn connect(socket: &Path, upgradable: bool) -> io::Result<Conn> {
    let stream = UnixStream::connect(socket).await?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(io::Error::other)?;
    tokio::spawn(async move {
        let ended = if upgradable { conn.with_upgrades().await } else { conn.await };
        if let Err(e) = ended {
            tracing::debug!(error = %e, "worker connection closed");
        }
    });
    Ok(sender)
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => status.to_string(),
    }
}

/// A process's resident memory in bytes, from `/proc/PID/statm`.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

/// A process's private memory (not shared with any other process) in bytes.
pub fn private_bytes(pid: u32) -> Option<u64> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let kb: u64 = rollup
        .lines()
        .filter(|l| l.starts_with("Private_Clean:") || l.starts_with("Private_Dirty:"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum();
    Some(kb * 1024)
}
