//! One R process: how it is started, reached, watched and stopped. This is the
//! only module that creates or signals processes.
//!
//! A plumber worker is reached through valve's own protocol (`frames`: one
//! loopback TCP connection the worker opens to valve's listener, one frame
//! per request and per answer) unless `--worker-transport httpuv`; a Shiny
//! worker (and a plumber one with httpuv) serves HTTP on its own Unix socket
//! inside valve's private 0700 run directory. It is either a plain process (`R --file=launcher.R`, the
//! leader of its own process group, with a parent-death signal so it dies with
//! valve even when valve is SIGKILLed) or, with `--preload`, a fork of one
//! parent R process that loaded the API once (see `fork.rs`).
//!
//! The supervisor sees workers through two small interfaces, `Launch` (start
//! one) and `Process` (wait for it, signal it), so its logic can be tested with
//! a fake worker; `RLauncher` is the real one.

mod conn;
mod fork;
mod frames;
mod output;
pub mod reap;
pub mod watch;

use std::future::Future;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use rustix::process::{Pid, PidfdFlags, Signal};
use tokio::io::unix::AsyncFd;
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

use crate::config::AppSource;

pub use conn::{connect, probe, AnswerBody, ClientAddrs, Conn, Connect, SendError, SocketConnector, Spooled, WireBody};
pub use frames::FrameHub;
pub use output::Tail;

/// A worker's identity for its whole life; never reused within one valve run,
/// across apps and reloads.
pub type WorkerId = u64;

/// A boxed future, for the object-safe traits below.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The R code each worker runs.
const LAUNCHER: &str = include_str!("launcher.R");
/// The frames request loop the launcher sources (bench/r-loop measured it).
const LOOP: &str = include_str!("loop.R");

/// What valve adds to glibc's tunables in every R process it starts: malloc
/// asks the kernel for transparent huge pages (honoured when the kernel's THP
/// mode is `madvise`, the default of many distributions; a no-op under
/// `always` or `never`, or before glibc 2.35). R's heap then takes fewer TLB
/// misses: ~5 % less R CPU on plumber's request path for ~1 % more memory
/// (bench/r-cost; PSS unchanged with --preload, whose forks split the pages).
const HUGE_PAGES: &str = "glibc.malloc.hugetlb=1";

/// The workers' GLIBC_TUNABLES given the value they would inherit: the
/// user's own `glibc.malloc.hugetlb` choice stands (`=0` turns this off);
/// otherwise `HUGE_PAGES` is added to whatever else they set.
fn glibc_tunables(inherited: Option<&str>) -> Option<String> {
    match inherited.map(str::trim) {
        Some(t) if t.split(':').any(|kv| kv.trim().starts_with("glibc.malloc.hugetlb=")) => None,
        Some(t) if !t.is_empty() => Some(format!("{t}:{HUGE_PAGES}")),
        _ => Some(HUGE_PAGES.to_string()),
    }
}

/// How often a starting worker's socket is probed.
const PROBE_EVERY: Duration = Duration::from_millis(2);

/// How a worker process ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exit {
    /// It exited by itself with this code (R's `quit()`, or an error at start-up).
    Code(i32),
    /// A signal ended it.
    Signal(i32),
    /// It is gone, but how is not known (a fork that did not say).
    Unknown,
}

impl Exit {
    pub fn describe(&self) -> String {
        match self {
            Exit::Code(code) => format!("exit code {code}"),
            Exit::Signal(sig) => format!("killed by signal {sig}"),
            Exit::Unknown => "exited (a fork: killed or crashed)".into(),
        }
    }

    /// Whether R ended itself: it returned from R code (`quit()`) or crashed
    /// on its own (a segfault, an abort). A worker ended by SIGKILL or SIGTERM
    /// was ended from outside (the OOM killer, an operator), and the request it
    /// held did nothing wrong.
    pub fn self_inflicted(&self) -> bool {
        const CRASHES: [i32; 5] =
            [4 /* ILL */, 6 /* ABRT */, 7 /* BUS */, 8 /* FPE */, 11 /* SEGV */];
        match self {
            Exit::Code(_) => true,
            Exit::Signal(sig) => CRASHES.contains(sig),
            Exit::Unknown => false,
        }
    }

    fn from_status(status: ExitStatus) -> Exit {
        match (status.code(), status.signal()) {
            (Some(code), _) => Exit::Code(code),
            (None, Some(sig)) => Exit::Signal(sig),
            _ => Exit::Unknown,
        }
    }
}

/// What the supervisor asks of a worker's process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// SIGTERM: finish and exit (a planned stop).
    Term,
    /// SIGKILL: now (hung, broken, or it ignored SIGTERM).
    Kill,
}

/// Why a worker did not come up.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot run R ({r_bin}): {reason}")]
    NoR { r_bin: String, reason: String },
    #[error("worker exited before answering ({status})")]
    Exited { status: String, code: Option<i32>, tail: Vec<String> },
    #[error("worker did not answer within {0:?} (raise --start-timeout if the app takes longer to load)")]
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

/// Starts workers of one app.
pub trait Launch: Send + Sync {
    /// Launches worker `id`. It is not ready until `Process::ready` says so.
    fn launch(&self, id: WorkerId) -> BoxFuture<'_, Result<Launched, StartError>>;
    /// Stops whatever the launcher keeps besides workers (a preload parent).
    fn shutdown(&self) -> BoxFuture<'_, ()>;
}

/// A worker just launched: its process, and how to open connections to it.
pub struct Launched {
    pub process: Box<dyn Process>,
    pub connector: Arc<dyn Connect>,
}

/// One worker process, owned by the one task that watches it. Only that task
/// signals it, and only before it has seen the exit, so a signal can never
/// reach another process that took over a reused pid.
pub trait Process: Send {
    fn pid(&self) -> Option<u32>;
    /// Waits until the worker answers on its socket; returns the connection
    /// that proved it. Fails if it exits first or takes longer than `timeout`.
    fn ready<'a>(
        &'a mut self,
        connector: &'a dyn Connect,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Conn, StartError>>;
    /// Waits for the process to end. Cancel-safe.
    fn exited(&mut self) -> BoxFuture<'_, Exit>;
    fn signal(&self, stop: Stop);
    /// How to read the worker's memory (off any lock: it reads /proc).
    fn memory(&self) -> Option<MemoryProbe>;
}

/// Reads one worker's memory from /proc: RSS for a plain worker; for a fork,
/// its private pages only, since the pages it shares with its parent cost
/// nothing extra. Blocking: run it with `spawn_blocking`.
#[derive(Clone, Copy, Debug)]
pub struct MemoryProbe {
    pub pid: u32,
    pub private_only: bool,
}

impl MemoryProbe {
    pub fn read(self) -> Option<u64> {
        if self.private_only {
            private_bytes(self.pid)
        } else {
            rss_bytes(self.pid)
        }
    }
}

/// What every worker of one app shares.
#[derive(Debug)]
pub struct Spec {
    pub r_bin: PathBuf,
    pub app: AppSource,
    /// The address clients use, so plumber's docs and messages show it.
    pub public_host: String,
    pub public_port: u16,
    /// Extra environment for the app's workers (`env = { ... }` in a config file).
    pub env: Vec<(String, String)>,
    run_dir: Arc<tempfile::TempDir>,
    launcher: PathBuf,
    /// Set when plumber workers are reached over frames (else httpuv).
    frames: Option<Arc<FrameHub>>,
}

/// valve's private run directory (mode 0700): launchers, worker sockets, FIFOs
/// and spooled bodies. Removed when the last holder drops it.
pub fn run_dir() -> io::Result<Arc<tempfile::TempDir>> {
    let dir = tempfile::Builder::new().prefix("valve-").tempdir()?;
    std::fs::write(dir.path().join("launcher.R"), LAUNCHER)?;
    std::fs::write(dir.path().join("loop.R"), LOOP)?;
    Ok(Arc::new(dir))
}

impl Spec {
    pub fn new(
        run_dir: Arc<tempfile::TempDir>,
        r_bin: PathBuf,
        app: AppSource,
        env: Vec<(String, String)>,
        public_host: String,
        public_port: u16,
    ) -> Self {
        let launcher = run_dir.path().join("launcher.R");
        Spec { r_bin, app, public_host, public_port, env, run_dir, launcher, frames: None }
    }

    /// Workers of this app are reached over frames through `hub` (plumber
    /// APIs only: Shiny needs httpuv's WebSockets).
    pub fn over_frames(mut self, hub: Arc<FrameHub>) -> Self {
        if !self.app.is_shiny() {
            self.frames = Some(hub);
        }
        self
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
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("VALVE_MODE", mode)
            .env("VALVE_APP", self.app.path())
            .env("VALVE_APP_KIND", self.app.kind())
            .env("VALVE_PUBLIC_HOST", &self.public_host)
            .env("VALVE_PUBLIC_PORT", self.public_port.to_string())
            .env("VALVE_LOOP", self.path("loop.R"))
            .env("VALVE_TRANSPORT", if self.frames.is_some() { "frames" } else { "httpuv" })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(hub) = &self.frames {
            cmd.envs(hub.env());
        }
        let inherited = match self.env.iter().rev().find(|(k, _)| k == "GLIBC_TUNABLES") {
            Some((_, v)) => Some(v.clone()),
            None => std::env::var("GLIBC_TUNABLES").ok(),
        };
        if let Some(tunables) = glibc_tunables(inherited.as_deref()) {
            cmd.env("GLIBC_TUNABLES", tunables);
        }
        let parent = std::process::id();
        // SAFETY: only async-signal-safe calls (raw prctl, getppid and _exit
        // syscalls) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
                // valve may have died between fork and prctl; then nobody would kill us.
                if rustix::process::getppid().map(Pid::as_raw_nonzero).map(|p| p.get() as u32) != Some(parent) {
                    return Err(io::Error::other("valve exited while the worker started"));
                }
                Ok(())
            });
        }
        cmd
    }

    fn socket_path(&self, id: WorkerId) -> PathBuf {
        self.path(&format!("w{id}.sock"))
    }
}

/// A command for the spawner thread, and where to send the child.
type SpawnJob = (Command, oneshot::Sender<io::Result<(Child, reap::Own)>>);

/// Starts processes from one long-lived thread. Linux delivers the parent-death
/// signal when the *thread* that forked a child exits, so children must not be
/// forked from threads that come and go (tokio's blocking pool).
#[derive(Clone, Debug)]
struct Spawner {
    jobs: std::sync::mpsc::Sender<SpawnJob>,
}

impl Spawner {
    fn new() -> io::Result<Self> {
        let handle = tokio::runtime::Handle::current();
        let (jobs, rx) = std::sync::mpsc::channel::<SpawnJob>();
        std::thread::Builder::new().name("valve-spawner".into()).spawn(move || {
            let _runtime = handle.enter();
            for (mut cmd, reply) in rx {
                let _ = reply.send(reap::spawn(&mut cmd));
            }
        })?;
        Ok(Spawner { jobs })
    }

    /// Spawns `cmd`; the child is valve's own (the reaper leaves it to tokio)
    /// while the returned `Own` lives.
    async fn spawn(&self, r_bin: &Path, cmd: Command) -> Result<(Child, reap::Own), StartError> {
        let (tx, rx) = oneshot::channel();
        let gone = || StartError::Io(io::Error::other("spawner thread is gone"));
        self.jobs.send((cmd, tx)).map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?.map_err(|e| StartError::NoR {
            r_bin: r_bin.display().to_string(),
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

/// Starts real R workers: plain R processes, or forks of a preloaded parent.
pub struct RLauncher {
    spec: Arc<Spec>,
    spawner: Spawner,
    forks: Option<fork::ForkServer>,
}

impl RLauncher {
    /// Must be called inside the tokio runtime that will own the workers.
    pub fn new(spec: Spec, preload: bool) -> io::Result<Self> {
        Ok(RLauncher { spec: Arc::new(spec), spawner: Spawner::new()?, forks: preload.then(fork::ForkServer::new) })
    }
}

impl Launch for RLauncher {
    fn launch(&self, id: WorkerId) -> BoxFuture<'_, Result<Launched, StartError>> {
        Box::pin(async move {
            let socket = self.spec.socket_path(id);
            let _ = std::fs::remove_file(&socket);
            // A frames worker's hello is expected before the worker can say it.
            let connector: Arc<dyn Connect> = match &self.spec.frames {
                Some(hub) => Arc::new(hub.connector(id)),
                None => Arc::new(SocketConnector::new(socket.clone())),
            };
            let process: Box<dyn Process> = match &self.forks {
                Some(forks) => Box::new(forks.fork(&self.spec, &self.spawner, id, socket).await?),
                None => {
                    let mut cmd = self.spec.command("plain");
                    cmd.env("VALVE_SOCKET", &socket).env("VALVE_WORKER_ID", id.to_string()).stdin(Stdio::null());
                    let (mut child, own) = self.spawner.spawn(&self.spec.r_bin, cmd).await?;
                    let pid = child.id().ok_or_else(|| io::Error::other("worker exited at once"))?;
                    let tail = Arc::new(Tail::default());
                    output::forward(&mut child, id, tail.clone());
                    tracing::debug!(worker = id, pid, "worker launched");
                    Box::new(Plain::new(child, own, pid, tail)?)
                }
            };
            Ok(Launched { process, connector })
        })
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Some(forks) = &self.forks {
                forks.shutdown().await;
            }
        })
    }
}

/// A plain worker: valve's own child, leader of its own process group.
struct Plain {
    child: Child,
    _own: reap::Own,
    pid: u32,
    pidfd: AsyncFd<OwnedFd>,
    tail: Arc<Tail>,
    exit: Option<Exit>,
}

impl Plain {
    fn new(child: Child, own: reap::Own, pid: u32, tail: Arc<Tail>) -> io::Result<Self> {
        Ok(Plain { pidfd: pidfd_open(pid)?, child, _own: own, pid, tail, exit: None })
    }
}

impl Process for Plain {
    fn pid(&self) -> Option<u32> {
        Some(self.pid)
    }

    fn ready<'a>(
        &'a mut self,
        connector: &'a dyn Connect,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Conn, StartError>> {
        Box::pin(async move {
            let tail = self.tail.clone();
            connector.expect_pid(self.pid);
            let answered = tokio::time::timeout(timeout, wait_answering(connector));
            tokio::select! {
                ready = answered => ready.map_err(|_| StartError::Timeout(timeout, tail.lines())),
                exit = self.exited() => {
                    // Let the output readers catch R's last words.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let code = match exit { Exit::Code(c) => Some(c), _ => None };
                    Err(StartError::Exited { status: exit.describe(), code, tail: tail.lines() })
                }
            }
        })
    }

    fn exited(&mut self) -> BoxFuture<'_, Exit> {
        Box::pin(async move {
            if let Some(exit) = &self.exit {
                return exit.clone();
            }
            // Readable once the worker is a zombie: not reaped yet, so its pid,
            // and the process group it leads, cannot have been taken by anyone
            // else. Anything the worker started in its group goes with it.
            let _ = self.pidfd.readable().await;
            let _ = rustix::process::kill_process_group(pid_of(self.pid), Signal::KILL);
            let exit = match self.child.wait().await {
                Ok(status) => Exit::from_status(status),
                Err(_) => Exit::Unknown,
            };
            self.exit = Some(exit.clone());
            exit
        })
    }

    fn signal(&self, stop: Stop) {
        if self.exit.is_some() {
            return;
        }
        // The whole group: whatever R started (a `system()` call) stops too.
        // Safe: the leader is not reaped before `exited` has seen its exit.
        let _ = rustix::process::kill_process_group(pid_of(self.pid), signal(stop));
    }

    fn memory(&self) -> Option<MemoryProbe> {
        Some(MemoryProbe { pid: self.pid, private_only: false })
    }
}

fn signal(stop: Stop) -> Signal {
    match stop {
        Stop::Term => Signal::TERM,
        Stop::Kill => Signal::KILL,
    }
}

fn pid_of(pid: u32) -> Pid {
    Pid::from_raw(pid as i32).unwrap_or(Pid::INIT)
}

/// Probes until the worker answers.
async fn wait_answering(connector: &dyn Connect) -> Conn {
    loop {
        if let Ok(conn) = connector.probe().await {
            return conn;
        }
        tokio::time::sleep(PROBE_EVERY).await;
    }
}

/// Opens a pidfd: a file descriptor that becomes readable when `pid` exits,
/// even when `pid` is not valve's child, and that signals exactly that process.
fn pidfd_open(pid: u32) -> io::Result<AsyncFd<OwnedFd>> {
    let fd = rustix::process::pidfd_open(pid_of(pid), PidfdFlags::NONBLOCK)?;
    // SAFETY: the AsyncFd owns the descriptor, which stays open and the same
    // until the AsyncFd is dropped.
    unsafe { AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)
}

/// A process's resident memory in bytes, from `/proc/PID/statm`.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * rustix::param::page_size() as u64)
}

/// How long a process's main thread (R's own) has run on a CPU or waited in
/// a run queue for one, from `/proc/PID/schedstat`: the time R wanted a CPU,
/// whatever the contention. Without scheduler statistics, the process's user
/// and system time from `/proc/PID/stat`.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/schedstat")) {
        let mut f = s.split_whitespace().map(|v| v.parse::<u64>().ok());
        if let (Some(Some(run)), Some(Some(wait))) = (f.next(), f.next()) {
            if run > 0 {
                return Some(Duration::from_nanos(run.saturating_add(wait)));
            }
        }
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces): utime and stime are the 12th and 13th.
    let mut rest = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    let ticks = rest.next()?.parse::<u64>().ok()? + rest.next()?.parse::<u64>().ok()?;
    let per_second = rustix::param::clock_ticks_per_second().max(1);
    Some(Duration::from_nanos(ticks.saturating_mul(1_000_000_000) / per_second))
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

#[cfg(test)]
mod tests {
    use super::glibc_tunables;

    #[test]
    fn workers_ask_for_huge_pages_unless_the_user_chose() {
        assert_eq!(glibc_tunables(None).as_deref(), Some("glibc.malloc.hugetlb=1"));
        assert_eq!(glibc_tunables(Some("")).as_deref(), Some("glibc.malloc.hugetlb=1"));
        assert_eq!(
            glibc_tunables(Some("glibc.malloc.arena_max=2")).as_deref(),
            Some("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"),
            "the user's other tunables are kept"
        );
        assert_eq!(glibc_tunables(Some("glibc.malloc.hugetlb=0")), None, "=0 turns it off");
        assert_eq!(glibc_tunables(Some("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2")), None);
    }
}
