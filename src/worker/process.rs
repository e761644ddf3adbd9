//! One worker process as the supervisor sees it: the `Launch` and `Process`
//! interfaces (so its logic can be tested with a fake worker), how a
//! process ended (`Exit`), how it is asked to stop (`Stop`), why it could not
//! start (`StartError`), and what /proc says of it (memory, CPU time).

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use rustix::process::{Pid, PidfdFlags, Signal};
use tokio::io::unix::AsyncFd;

use super::conn::{Conn, Connect};
use super::wire::{BoxFuture, WorkerId};

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

    pub(super) fn from_status(status: ExitStatus) -> Exit {
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
    #[error("the engine {} on {addr} within {timeout:?} (its launch_server() must serve HTTP on the host and port it is given, and block while it serves; raise --start-timeout if it takes longer to load)", if *.listened { "accepted connections but never answered an HTTP request" } else { "never listened" })]
    NeverListened { addr: String, timeout: Duration, listened: bool, tail: Vec<String> },
    #[error("{doc} is a Quarto document: serving it needs the Quarto CLI, and `quarto` is not on the PATH ({path}); install Quarto (https://quarto.org/docs/get-started/) or set QUARTO_PATH to the quarto binary")]
    NoQuarto { doc: String, path: String },
    #[error("cannot start worker: {0}")]
    Io(#[from] io::Error),
    #[error("cannot put the worker in its sandbox: {step} failed: {error} (a private view needs valve to run as root with CAP_SYS_ADMIN; `valve --check` says what valve can give apps here)")]
    Sandbox { step: String, error: io::Error },
    #[error("rendering {} failed: {}", .0.doc, .0.message)]
    Render(Box<RenderError>),
}

/// Why a `shiny_prerendered` document could not be rendered before its workers started.
#[derive(Debug)]
pub struct RenderError {
    /// The document.
    pub doc: String,
    /// knitr's, pandoc's or R's message (with where knitr stopped).
    pub message: String,
    /// The render process's exit code (3: a package is missing).
    pub code: Option<i32>,
    /// Its last lines of output.
    pub tail: Vec<String>,
}

impl StartError {
    /// What R printed before it failed, if anything.
    pub fn tail(&self) -> &[String] {
        match self {
            StartError::Exited { tail, .. } | StartError::Timeout(_, tail) | StartError::NeverListened { tail, .. } => {
                tail
            }
            StartError::Render(r) => &r.tail,
            _ => &[],
        }
    }

    /// Whether the failure is in the set-up (R or a package missing) rather than in one worker.
    pub fn missing_package(&self) -> bool {
        match self {
            StartError::Exited { code, .. } => *code == Some(3),
            StartError::Render(r) => r.code == Some(3),
            _ => false,
        }
    }
}

/// Starts workers of one app.
pub trait Launch: Send + Sync {
    /// Launches worker `id`. It is not ready until `Process::ready` says so.
    fn launch(&self, id: WorkerId) -> BoxFuture<'_, Result<Launched, StartError>>;
    /// What must happen once before the first worker of this generation
    /// starts (a `shiny_prerendered` document's render); `launch` waits for
    /// it too. Called when a generation starts, so a failure is a start-up error.
    fn prepare(&self) -> BoxFuture<'_, Result<(), StartError>> {
        Box::pin(async { Ok(()) })
    }
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
    /// How it started, as logs, the status page and the start-time metric
    /// say it: "fresh R", "app preload" (a fork of the app's own loaded
    /// parent) or "warm parent" (a fork of the parent shared by apps).
    fn started_by(&self) -> &'static str {
        "fresh R"
    }
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

pub(super) fn signal(stop: Stop) -> Signal {
    match stop {
        Stop::Term => Signal::TERM,
        Stop::Kill => Signal::KILL,
    }
}

pub(super) fn pid_of(pid: u32) -> Pid {
    Pid::from_raw(pid as i32).unwrap_or(Pid::INIT)
}

/// Opens a pidfd: a file descriptor that becomes readable when `pid` exits,
/// even when `pid` is not valve's child, and that signals exactly that process.
pub(super) fn pidfd_open(pid: u32) -> io::Result<AsyncFd<OwnedFd>> {
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

/// A process's private memory (not shared with any other process) in
/// bytes: as root, read by the privileged spawner (valve's server may not
/// read another user's), else by valve itself.
pub fn private_bytes(pid: u32) -> Option<u64> {
    use crate::worker::privsep::chores::{self, Chore, Done};
    match chores::ask(&Chore::Memory { pid }) {
        None => private_bytes_here(pid),
        Some(Ok(Done::Memory { bytes })) => bytes,
        Some(_) => None,
    }
}

/// `private_bytes`, read with this process's own rights.
pub(crate) fn private_bytes_here(pid: u32) -> Option<u64> {
    let path = format!("/proc/{pid}/smaps_rollup");
    let rollup = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        // valve as root without CAP_SYS_PTRACE: read it as the process's own user.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied && rustix::process::geteuid().is_root() => {
            let ids = crate::worker::sandbox::ids_of(pid).ok().filter(|ids| ids.0 != 0)?;
            crate::worker::sandbox::as_user(Some(ids), || std::fs::read_to_string(&path)).ok()?
        }
        Err(_) => return None,
    };
    let kb: u64 = rollup
        .lines()
        .filter(|l| l.starts_with("Private_Clean:") || l.starts_with("Private_Dirty:"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum();
    Some(kb * 1024)
}
