//! `--preload`: one parent R process attaches plumber and loads the API once,
//! then forks a worker each time valve asks. Forks share the parent's memory
//! copy-on-write and start in milliseconds.
//!
//! The protocol is three private channels, none of them the user's output:
//! - valve → parent: lines `fork ID SOCKET FIFO` on the parent's stdin;
//! - fork → valve: the FIFO (in the private run directory): its first line is
//!   `valve-fork-pid PID`, then everything the fork prints (it `sink()`s there),
//!   so each fork's output is logged under its own id and pid;
//! - the fork's socket, where it answers the readiness probe like any worker.
//!
//! A fork is not valve's child, so valve watches it with a pidfd. A fork cannot
//! carry a parent-death signal to valve either, so the launcher has each fork
//! check once a second that valve (by pid and start time) still runs.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::ChildStdin;
use tokio::sync::{oneshot, watch, Mutex};

use super::{describe, forward_output, Process, Spawner, Spec, StartError, Tail, Target, Watch};
use crate::pool::WorkerId;

/// The worker id the preload parent's own output is logged under.
pub const PARENT_ID: WorkerId = 0;

/// How the parent ended, for forks that were waiting on it.
#[derive(Clone, Debug)]
pub struct ParentExit {
    status: String,
    code: Option<i32>,
    tail: Vec<String>,
}

pub(super) fn parent_gone(exit: Option<ParentExit>) -> StartError {
    match exit {
        Some(e) => {
            StartError::Exited { status: format!("the preload parent {}", e.status), code: e.code, tail: e.tail }
        }
        None => StartError::Io(io::Error::other("the preload parent went away")),
    }
}

struct Parent {
    pid: u32,
    stdin: ChildStdin,
    gone: watch::Receiver<Option<ParentExit>>,
}

#[derive(Debug)]
pub(super) struct ForkServer {
    parent: Mutex<Option<Parent>>,
}

impl std::fmt::Debug for Parent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parent").field("pid", &self.pid).finish()
    }
}

impl ForkServer {
    pub fn new() -> Self {
        ForkServer { parent: Mutex::new(None) }
    }

    /// Asks the parent (started or restarted as needed) to fork worker `id`.
    pub async fn fork(
        &self,
        spec: &Spec,
        spawner: &Spawner,
        id: WorkerId,
        socket: PathBuf,
    ) -> Result<Process, StartError> {
        let mut guard = self.parent.lock().await;
        let alive = guard.as_ref().is_some_and(|p| p.gone.borrow().is_none());
        if !alive {
            *guard = Some(start_parent(spec, spawner).await?);
        }
        let Some(parent) = guard.as_mut() else { unreachable!("the parent was just started") };

        let fifo = spec.path(&format!("w{id}.out"));
        let _ = std::fs::remove_file(&fifo);
        mkfifo(&fifo)?;
        // Opened read-write so that it never reads end-of-file before the fork opens it.
        let output = tokio::net::unix::pipe::OpenOptions::new().read_write(true).open_receiver(&fifo)?;
        let tail = Arc::new(Tail::default());
        let (pid_tx, pid_rx) = oneshot::channel();
        tokio::spawn(fork_output(output, id, tail.clone(), pid_tx));

        let line = format!("fork {id} {} {}\n", socket.display(), fifo.display());
        if let Err(e) = parent.stdin.write_all(line.as_bytes()).await {
            return Err(StartError::Io(io::Error::other(format!("cannot reach the preload parent: {e}"))));
        }
        let _ = parent.stdin.flush().await;
        let watch = Watch::Fork { parent: parent.gone.clone(), pid: Some(pid_rx), pidfd: None };
        Ok(Process { id, target: Target::Unknown, socket, tail, watch })
    }

    /// Closes the parent's stdin (it exits on end-of-file), then makes sure.
    pub async fn shutdown(&self) {
        let Some(parent) = self.parent.lock().await.take() else { return };
        let Parent { pid, stdin, mut gone } = parent;
        drop(stdin);
        if tokio::time::timeout(Duration::from_secs(2), gone.wait_for(Option::is_some)).await.is_err() {
            Target::Group(pid).signal(libc::SIGKILL);
        }
    }
}

async fn start_parent(spec: &Spec, spawner: &Spawner) -> Result<Parent, StartError> {
    let mut cmd = spec.command("preload");
    cmd.env("VALVE_PID", std::process::id().to_string())
        .env("VALVE_START_TIME", own_start_time().unwrap_or_default())
        .stdin(Stdio::piped());
    let mut child = spawner.spawn(spec, cmd).await?;
    let pid = child.id().ok_or_else(|| io::Error::other("the preload parent exited at once"))?;
    let stdin = child.stdin.take().ok_or_else(|| io::Error::other("no stdin for the preload parent"))?;
    let tail = Arc::new(Tail::default());
    forward_output(&mut child, PARENT_ID, tail.clone());
    let (tx, gone) = watch::channel(None);
    tokio::spawn(async move {
        let status = child.wait().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (status, code) = match status {
            Ok(s) => (describe(s), s.code()),
            Err(e) => (format!("unknown ({e})"), None),
        };
        tracing::warn!(worker = PARENT_ID, pid, status, "preload parent exited; forked workers keep serving");
        let _ = tx.send(Some(ParentExit { status, code, tail: tail.lines() }));
    });
    tracing::info!(worker = PARENT_ID, pid, "preload parent started: loading the API once");
    Ok(Parent { pid, stdin, gone })
}

/// Reads a fork's FIFO: its pid first, then its output lines as log events,
/// until the fork exits.
async fn fork_output(
    fifo: tokio::net::unix::pipe::Receiver,
    id: WorkerId,
    tail: Arc<Tail>,
    pid_tx: oneshot::Sender<u32>,
) {
    let mut lines = BufReader::new(fifo).lines();
    let mut pid = 0;
    let mut pid_tx = Some(pid_tx);
    let mut exit = None;
    loop {
        let line = tokio::select! {
            line = lines.next_line() => line,
            _ = async { exit.as_ref().map(|fd: &tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>| fd.readable()).unwrap().await }, if exit.is_some() => return,
        };
        let Ok(Some(line)) = line else { return };
        if let Some(p) = line.strip_prefix("valve-fork-pid ").and_then(|p| p.trim().parse::<u32>().ok()) {
            pid = p;
            exit = super::pidfd_open(p).ok();
            if let Some(tx) = pid_tx.take() {
                let _ = tx.send(p);
            }
            continue;
        }
        tracing::info!(target: "valve::worker::output", worker = id, pid, stream = "output", "{line}");
        tail.push(line);
    }
}

fn mkfifo(path: &Path) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: c is a valid NUL-terminated path.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// valve's start time in clock ticks since boot (field 22 of /proc/self/stat):
/// with the pid, it names this valve process even if the pid is reused later.
fn own_start_time() -> Option<String> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    stat.rsplit(')').next()?.split_whitespace().nth(19).map(str::to_string)
}
