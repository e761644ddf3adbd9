//! `--preload`: one parent R process attaches plumber and loads the API once,
//! then forks a worker each time valve asks. Forks share the parent's memory
//! copy-on-write and start in milliseconds.
//!
//! The protocol is three private channels, none of them the user's output:
//! - valve → parent: lines `fork ID SOCKET FIFO TOKEN` on the parent's stdin
//!   (TOKEN: the fork's own frames token, `-` for none);
//! - fork → valve: the FIFO (in the app's run folder, valve's own: the fork
//!   opens it write-only, as the app's user): its first line is
//!   `valve-fork-pid PID`, then everything the fork prints (it `sink()`s there),
//!   so each fork's output is logged under its own id and pid; a fork that
//!   ends through `quit()` says `valve-fork-exit CODE` last, and one that R's
//!   own handler catches crashing says ` *** caught segfault ***` (or bus
//!   error, illegal operation) before it re-raises the signal;
//! - the fork's socket (httpuv), or its connection to valve's worker listener
//!   (frames), where it answers the readiness probe like any worker.
//!
//! A fork is not valve's child, so valve watches and signals it through a
//! pidfd, which names that one process even if its pid is reused later. A fork
//! cannot take a parent-death signal from valve either, so each holds a
//! lifeline (lifeline.rs): a pipe only valve holds open, watched by a thread.

use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use super::child::{Child, ChildStdin};
use super::job::Io;
use rustix::process::Signal;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::sync::{oneshot, watch, Mutex};

use super::conn::{Conn, Connect};
use super::output::{self, Sink, Stream, Tail, NOT_A_WORKER};
use super::process::{pid_of, pidfd_open, Exit, MemoryProbe, Process, StartError, Stop};
use super::spawn::{wait_answering, Spawner, Spec};
use super::wire::{BoxFuture, WorkerId};

/// The worker id the preload parent's own output is logged under.
pub const PARENT_ID: WorkerId = NOT_A_WORKER;

/// How the parent ended, for forks that were waiting on it.
#[derive(Clone, Debug)]
pub struct ParentExit {
    pub(super) status: String,
    code: Option<i32>,
    tail: Vec<String>,
}

/// Waits until the parent is gone and says so as a start error.
async fn parent_exit(mut parent: watch::Receiver<Option<ParentExit>>) -> StartError {
    let exit = parent.wait_for(Option::is_some).await.ok().and_then(|w| w.clone());
    parent_gone(exit)
}

fn parent_gone(exit: Option<ParentExit>) -> StartError {
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

pub(super) struct ForkServer {
    parent: Mutex<Option<Parent>>,
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
    ) -> Result<Fork, StartError> {
        let mut guard = self.parent.lock().await;
        let alive = guard.as_ref().is_some_and(|p| p.gone.borrow().is_none());
        if !alive {
            *guard = Some(start_parent(spec, spawner).await?);
        }
        let Some(parent) = guard.as_mut() else { unreachable!("the parent was just started") };
        let (fifo, fork) = Fork::expect(spec, id, parent.gone.clone(), "app preload")?;
        // The fork's own frames token goes on the parent's private stdin ("-": none).
        let token = spec.frame_token(id).unwrap_or_else(|| "-".into());
        let link = super::conn::link_token(&socket);
        let line = format!("fork {id} {} {} {token} {link}\n", socket.display(), fifo.display());
        if let Err(e) = parent.stdin.write_all(line.as_bytes()).await {
            return Err(StartError::Io(io::Error::other(format!("cannot reach the preload parent: {e}"))));
        }
        let _ = parent.stdin.flush().await;
        Ok(fork)
    }

    /// Closes the parent's stdin (it exits on end-of-file), then makes sure.
    pub async fn shutdown(&self) {
        let Some(parent) = self.parent.lock().await.take() else { return };
        let Parent { pid, stdin, mut gone } = parent;
        drop(stdin);
        if tokio::time::timeout(Duration::from_secs(2), gone.wait_for(Option::is_some)).await.is_err() {
            // Still unreaped (its watcher has not seen the exit), so the group is still its own.
            let _ = rustix::process::kill_process_group(pid_of(pid), Signal::KILL);
        }
    }
}

/// A forked worker.
pub(super) struct Fork {
    parent: watch::Receiver<Option<ParentExit>>,
    /// The fork's pid once said (0 before).
    pid_rx: Option<watch::Receiver<u32>>,
    pid: Option<u32>,
    pidfd: Option<AsyncFd<OwnedFd>>,
    tail: Arc<Tail>,
    /// How the fork said it ends: the code it gave `quit()`, or the crash
    /// signal R's handler reported (a fork is not valve's child: valve cannot
    /// wait for its status).
    said_exit: Arc<StdMutex<Option<Exit>>>,
    exit: Option<Exit>,
    /// Ends when the FIFO's reader has read all the fork wrote (its sender is
    /// dropped then).
    read_all: Option<oneshot::Receiver<()>>,
    /// Where what the fork says of itself before its FIFO is open goes.
    reports: Arc<Reports>,
    /// Whose fork it is: "app preload" or "warm parent".
    started_by: &'static str,
}

impl Fork {
    /// Whether the parent it was asked of is gone.
    pub(super) fn parent_gone(&self) -> bool {
        self.parent.borrow().is_some()
    }

    /// A fork of `parent` to come: worker `id`'s FIFO in its app's run folder
    /// (the app's user's: the fork writes it as that user), read from now on.
    /// Returns the FIFO's path for the parent to be told.
    pub(super) fn expect(
        spec: &Spec,
        id: WorkerId,
        parent: watch::Receiver<Option<ParentExit>>,
        started_by: &'static str,
    ) -> io::Result<(PathBuf, Fork)> {
        // Made through the run folder's handle (valve's own folder: the app
        // cannot put a link where the FIFO goes), then given to its user.
        let fifo = spec.run_folder()?.fifo(&format!("w{id}.out"), spec.owner())?;
        // Opened read-write so that it never reads end-of-file before the fork opens it.
        let output = tokio::net::unix::pipe::OpenOptions::new().read_write(true).open_receiver(&fifo)?;
        let tail = Arc::new(Tail::default());
        let (pid_tx, pid_rx) = watch::channel(0u32);
        let said_exit = Arc::new(StdMutex::new(None));
        let (reading, read_all) = oneshot::channel::<()>();
        let sink = spec.sink(id, tail.clone());
        let reports = Arc::new(Reports {
            pid: pid_tx,
            said_exit: said_exit.clone(),
            sink: sink.clone(),
            opened: Default::default(),
            failed: Default::default(),
        });
        tokio::spawn(fork_output(output, sink, reports.clone(), said_exit.clone(), reading));
        let fork = Fork {
            parent,
            pid_rx: Some(pid_rx),
            pid: None,
            pidfd: None,
            tail,
            said_exit,
            exit: None,
            read_all: Some(read_all),
            reports,
            started_by,
        };
        Ok((fifo, fork))
    }

    /// Whether the fork opened its FIFO (it began to run as the app's worker).
    pub(super) fn opened(&self) -> bool {
        self.reports.opened.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Where the fork's own words before its FIFO is open go (a warm
    /// parent's fork says them on the parent's output).
    pub(super) fn reports(&self) -> &Arc<Reports> {
        &self.reports
    }

    /// Learns the fork's pid (its first line on the FIFO) unless known.
    async fn learn_pid(&mut self) -> Result<(), StartError> {
        let Some(mut rx) = self.pid_rx.take() else { return Ok(()) };
        tokio::select! {
            error = parent_exit(self.parent.clone()) => Err(error),
            got = rx.wait_for(|p| *p != 0) => {
                let pid = got.map(|p| *p).map_err(|_| StartError::Io(io::Error::other("the fork never said its pid")))?;
                self.pid = Some(pid);
                self.pidfd = Some(pidfd_open(pid)?);
                Ok(())
            }
        }
    }
}

impl Process for Fork {
    fn pid(&self) -> Option<u32> {
        self.pid
    }

    fn ready<'a>(
        &'a mut self,
        connector: &'a dyn Connect,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Conn, StartError>> {
        Box::pin(async move {
            let tail = self.tail.clone();
            let deadline = tokio::time::Instant::now() + timeout;
            tokio::time::timeout_at(deadline, self.learn_pid())
                .await
                .map_err(|_| StartError::Timeout(timeout, tail.lines()))??;
            if let Some(pid) = self.pid {
                connector.expect_pid(pid);
            }
            let parent = self.parent.clone();
            tokio::select! {
                ready = tokio::time::timeout_at(deadline, wait_answering(connector)) => {
                    ready.map_err(|_| StartError::Timeout(timeout, tail.lines()))
                }
                exit = self.exited() => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let code = match exit { Exit::Code(c) => Some(c), _ => None };
                    Err(StartError::Exited { status: format!("the fork {}", exit.describe()), code, tail: tail.lines() })
                }
                error = parent_exit(parent) => Err(error),
            }
        })
    }

    fn exited(&mut self) -> BoxFuture<'_, Exit> {
        Box::pin(async move {
            if let Some(exit) = &self.exit {
                return exit.clone();
            }
            if self.learn_pid().await.is_err() {
                // It never became a process valve could watch.
                self.exit = Some(Exit::Unknown);
                return Exit::Unknown;
            }
            if let Some(fd) = &self.pidfd {
                let _ = fd.readable().await;
            }
            // Its last words on the FIFO: the reader drains them, then ends.
            if let Some(read) = self.read_all.take() {
                let _ = tokio::time::timeout(Duration::from_millis(200), read).await;
            }
            let said = || self.said_exit.lock().unwrap_or_else(|p| p.into_inner()).clone();
            if said().is_none() && !self.reports.opened.load(std::sync::atomic::Ordering::Relaxed) {
                // Gone before it opened its FIFO: why is on its parent's
                // output, which another task reads (it wrote it before it exited).
                let _ = tokio::time::timeout(Duration::from_millis(200), self.reports.failed.notified()).await;
            }
            let exit = said().unwrap_or(Exit::Unknown);
            self.exit = Some(exit.clone());
            exit
        })
    }

    fn signal(&self, stop: Stop) {
        if self.exit.is_some() {
            return;
        }
        if let Some(fd) = &self.pidfd {
            let _ = rustix::process::pidfd_send_signal(fd.get_ref(), super::process::signal(stop));
        }
    }

    fn memory(&self) -> Option<MemoryProbe> {
        self.pid.map(|pid| MemoryProbe { pid, private_only: true })
    }

    fn started_by(&self) -> &'static str {
        self.started_by
    }
}

/// Waits for a parent that forks workers (an app's preload parent, the warm
/// parent) to exit, and says how, with its last lines of output.
pub(super) async fn wait_parent(mut child: Child, tail: Arc<Tail>) -> ParentExit {
    let status = child.wait().await;
    // Its last output lines may still be on their way to the tail.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (status, code) = match status {
        Ok(s) => (Exit::from_status(s).describe(), s.code()),
        Err(e) => (format!("unknown ({e})"), None),
    };
    ParentExit { status, code, tail: tail.lines() }
}

async fn start_parent(spec: &Spec, spawner: &Spawner) -> Result<Parent, StartError> {
    let mut cmd = spec.command("preload")?.parent_of_forks();
    cmd.env("VALVE_PID", std::process::id().to_string())
        .env("VALVE_START_TIME", own_start_time().unwrap_or_default())
        .stdin(Io::Piped);
    let mut child = spawner.spawn(&spec.r_bin, cmd).await?;
    let pid = child.id().ok_or_else(|| io::Error::other("the preload parent exited at once"))?;
    let stdin = child.stdin.take().ok_or_else(|| io::Error::other("no stdin for the preload parent"))?;
    let tail = Arc::new(Tail::default());
    output::forward(&mut child, &spec.sink(PARENT_ID, tail.clone()));
    let (tx, gone) = watch::channel(None);
    let app = spec.name.clone();
    tokio::spawn(async move {
        let exit = wait_parent(child, tail).await;
        tracing::warn!(app = %app, worker = PARENT_ID, pid, status = exit.status, "preload parent exited; forked workers keep serving");
        let _ = tx.send(Some(exit));
    });
    tracing::info!(app = %spec.name, worker = PARENT_ID, pid, "preload parent started: loading the API once");
    Ok(Parent { pid, stdin, gone })
}

/// What a fork says of itself where it can before its FIFO is open: a warm
/// parent's fork opens it only once it is the app's user, so its pid and a
/// failure to enter the sandbox come on the parent's own output, by worker id.
pub(super) struct Reports {
    pid: watch::Sender<u32>,
    said_exit: Arc<StdMutex<Option<Exit>>>,
    sink: Sink,
    /// The fork said its pid on its FIFO: it opened it.
    opened: std::sync::atomic::AtomicBool,
    /// Told when it said it failed before it opened its FIFO.
    failed: tokio::sync::Notify,
}

impl Reports {
    /// The fork's pid (the first word of it counts).
    pub(super) fn pid(&self, pid: u32) {
        self.pid.send_if_modified(|known| {
            let new = *known == 0 && pid != 0;
            if new {
                *known = pid;
            }
            new
        });
    }

    /// The fork is ending with `code` before it could open its FIFO, for `why`.
    pub(super) fn failed(&self, code: i32, why: &str) {
        self.sink.line(*self.pid.borrow(), Stream::Output, format!("valve-fork-failed: {why}"));
        *self.said_exit.lock().unwrap_or_else(|p| p.into_inner()) = Some(Exit::Code(code));
        self.failed.notify_one();
    }
}

/// Reads a fork's FIFO: its pid first, then its output lines as log events,
/// and the code it gave `quit()`, until the fork exits.
async fn fork_output(
    fifo: tokio::net::unix::pipe::Receiver,
    sink: Sink,
    reports: Arc<Reports>,
    said_exit: Arc<StdMutex<Option<Exit>>>,
    // Held until the last line is read: dropping it tells `Fork::exited`.
    _reading: oneshot::Sender<()>,
) {
    let mut reader = BufReader::new(fifo);
    let mut pid = 0;
    let mut said = reports.pid.subscribe();
    // The FIFO is open read-write here, so it never reads end-of-file: stop
    // when the fork is gone instead.
    let mut gone: Option<AsyncFd<OwnedFd>> = None;
    loop {
        let line = match &gone {
            Some(fd) => tokio::select! {
                line = output::next_line(&mut reader) => line,
                _ = fd.readable() => {
                    // Whatever it wrote before it exited is in the pipe now.
                    for line in drain(reader).await {
                        handle_line(line, pid, &sink, &said_exit);
                    }
                    return;
                }
            },
            None => tokio::select! {
                line = output::next_line(&mut reader) => line,
                // Said on the parent's output (a fork that may never open its FIFO).
                Ok(p) = said.wait_for(|p| *p != 0) => {
                    pid = *p;
                    drop(p);
                    gone = pidfd_open(pid).ok();
                    continue;
                }
            },
        };
        let Some(line) = line else { return };
        if let Some(p) = line.strip_prefix("valve-fork-pid ").and_then(|p| p.trim().parse::<u32>().ok()) {
            pid = p;
            gone = pidfd_open(p).ok();
            reports.opened.store(true, std::sync::atomic::Ordering::Relaxed);
            reports.pid(p);
            continue;
        }
        handle_line(line, pid, &sink, &said_exit);
    }
}

/// The most a fork's FIFO is read once the fork is gone (a child it left
/// behind may still write there).
const DRAIN_MAX: usize = 1 << 20;

/// The lines left in a gone fork's FIFO: what the reader holds, then the pipe
/// read until it is empty (no waiting: the fork wrote them before it exited).
async fn drain(reader: BufReader<tokio::net::unix::pipe::Receiver>) -> Vec<String> {
    let mut rest = reader.buffer().to_vec();
    let fifo = reader.into_inner();
    let mut chunk = [0u8; 8192];
    while rest.len() < DRAIN_MAX {
        // The FIFO is non-blocking: an empty pipe says EAGAIN at once.
        match rustix::io::read(&fifo, &mut chunk) {
            Ok(0) => break,
            Ok(n) => rest.extend_from_slice(&chunk[..n]),
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => break,
        }
    }
    let mut lines = Vec::new();
    let mut bytes = &rest[..];
    while let Some(line) = output::next_line(&mut bytes).await {
        lines.push(line);
    }
    lines
}

fn handle_line(line: String, pid: u32, sink: &Sink, said_exit: &StdMutex<Option<Exit>>) {
    if let Some(code) = line.strip_prefix("valve-fork-exit ").and_then(|c| c.trim().parse::<i32>().ok()) {
        *said_exit.lock().unwrap_or_else(|p| p.into_inner()) = Some(Exit::Code(code));
        return;
    }
    if let Some(sig) = crash_reported(&line) {
        said_exit.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(Exit::Signal(sig));
    }
    sink.line(pid, Stream::Output, line);
}

/// The signal of a crash R's own handler reports (R's sigactionSegv prints
/// ` *** caught segfault ***` and the like, then re-raises the signal).
fn crash_reported(line: &str) -> Option<i32> {
    match line.trim() {
        "*** caught segfault ***" => Some(11),
        "*** caught bus error ***" => Some(7),
        "*** caught illegal operation ***" => Some(4),
        _ => None,
    }
}

/// valve's start time in clock ticks since boot (field 22 of /proc/self/stat):
/// with the pid, it names this valve process even if the pid is reused later.
pub(super) fn own_start_time() -> Option<String> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    stat.rsplit(')').next()?.split_whitespace().nth(19).map(str::to_string)
}
