//! How one R worker is started, reached, watched and stopped. This is the only
//! module that creates or signals processes.
//!
//! A worker is `R --file=launcher.R` (the launcher is embedded in the binary)
//! serving the API on its own Unix socket inside valve's private 0700 run
//! directory. Each worker is the leader of its own process group, so a signal to
//! the group reaches anything it started, and carries a parent-death signal so
//! it dies with valve even when valve is SIGKILLed.

use std::collections::VecDeque;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Either, Empty};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::net::UnixStream;
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

use crate::body::ReqBody;
use crate::config::App;
use crate::pool::WorkerId;

/// The R code each worker runs.
const LAUNCHER: &str = include_str!("launcher.R");

/// The path workers answer for readiness probes; valve never forwards `/__valve__/` paths.
const PING_PATH: &str = "/__valve__/ping";

/// How many of a worker's last output lines are kept to explain a failed start.
const TAIL_LINES: usize = 40;

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

/// A running worker process.
#[derive(Debug)]
pub struct Process {
    pub id: WorkerId,
    pub pid: u32,
    pub socket: PathBuf,
    pub tail: Arc<Tail>,
    child: Child,
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
pub struct Spawner {
    jobs: std::sync::mpsc::Sender<(Command, oneshot::Sender<io::Result<Child>>)>,
}

impl Spawner {
    /// Must be called inside the tokio runtime that will own the children.
    pub fn new() -> io::Result<Self> {
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

    async fn spawn(&self, cmd: Command) -> io::Result<Child> {
        let (tx, rx) = oneshot::channel();
        self.jobs.send((cmd, tx)).map_err(|_| io::Error::other("spawner thread is gone"))?;
        rx.await.map_err(|_| io::Error::other("spawner thread is gone"))?
    }

    /// Launches worker `id`. It is not ready until `wait_ready` says so.
    pub async fn launch(&self, spec: &Spec, id: WorkerId) -> Result<Process, StartError> {
        let socket = spec.socket_path(id);
        let _ = std::fs::remove_file(&socket);
        let mut cmd = Command::new(&spec.r_bin);
        cmd.arg("--no-echo")
            .arg("--no-restore")
            .arg("--no-save")
            .arg(format!("--file={}", spec.launcher.display()))
            .current_dir(spec.app.workdir())
            .env("VALVE_SOCKET", &socket)
            .env("VALVE_APP", spec.app.path())
            .env(
                "VALVE_APP_KIND",
                match spec.app {
                    App::PlumberFile(_) => "plumber-file",
                    App::PlumberDir(_) => "plumber-dir",
                },
            )
            .env("VALVE_PUBLIC_HOST", &spec.public_host)
            .env("VALVE_PUBLIC_PORT", spec.public_port.to_string())
            .env("VALVE_WORKER_ID", id.to_string())
            .stdin(Stdio::null())
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
        let mut child = self.spawn(cmd).await.map_err(|e| StartError::NoR {
            r_bin: spec.r_bin.display().to_string(),
            reason: match e.kind() {
                io::ErrorKind::NotFound => {
                    "not found (install R, e.g. `apt-get install r-base-core r-cran-plumber`, or pass --r-bin)".into()
                }
                io::ErrorKind::PermissionDenied => "permission denied (is it executable?)".into(),
                _ => e.to_string(),
            },
        })?;
        let pid = child.id().ok_or_else(|| io::Error::other("worker exited at once"))?;
        let tail = Arc::new(Tail::default());
        if let Some(out) = child.stdout.take() {
            tokio::spawn(forward_output(out, id, pid, "stdout", tail.clone()));
        }
        if let Some(err) = child.stderr.take() {
            tokio::spawn(forward_output(err, id, pid, "stderr", tail.clone()));
        }
        tracing::debug!(worker = id, pid, "worker launched");
        Ok(Process { id, pid, socket, tail, child })
    }
}

/// Turns each line a worker prints into a log event carrying the worker's id.
async fn forward_output(stream: impl AsyncRead + Unpin, id: WorkerId, pid: u32, name: &'static str, tail: Arc<Tail>) {
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
        let socket = self.socket.clone();
        let probe = async {
            loop {
                if let Ok(conn) = probe(&socket).await {
                    return conn;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::select! {
            conn = tokio::time::timeout(timeout, probe) => {
                conn.map_err(|_| StartError::Timeout(timeout, self.tail.lines()))
            }
            status = self.child.wait() => {
                let status = status?;
                // Let the output readers catch R's last words.
                tokio::time::sleep(Duration::from_millis(50)).await;
                Err(StartError::Exited { status: describe(status), code: status.code(), tail: self.tail.lines() })
            }
        }
    }

    /// Waits for the process to exit and describes how it did.
    pub async fn wait(&mut self) -> String {
        match self.child.wait().await {
            Ok(status) => describe(status),
            Err(e) => format!("unknown ({e})"),
        }
    }
}

/// Connects to a worker's socket and checks it answers the readiness path.
async fn probe(socket: &Path) -> io::Result<Conn> {
    let mut conn = connect(socket).await?;
    let req = http::Request::get(PING_PATH)
        .header(http::header::HOST, "valve")
        .body(Either::Right(Empty::new()))
        .map_err(io::Error::other)?;
    conn.ready().await.map_err(io::Error::other)?;
    let resp = conn.send_request(req).await.map_err(io::Error::other)?;
    let ok = resp.status() == http::StatusCode::OK;
    resp.into_body().collect().await.map_err(io::Error::other)?;
    if ok {
        Ok(conn)
    } else {
        Err(io::Error::other("worker answered the readiness probe with an error"))
    }
}

/// Opens a fresh HTTP/1.1 connection to a worker's socket.
pub async fn connect(socket: &Path) -> io::Result<Conn> {
    let stream = UnixStream::connect(socket).await?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(io::Error::other)?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "worker connection closed");
        }
    });
    Ok(sender)
}

/// Sends `signal` to a worker's whole process group.
pub fn signal_group(pid: u32, signal: libc::c_int) {
    // SAFETY: kill(2) has no memory-safety preconditions; a negative pid names the group.
    unsafe {
        libc::kill(-(pid as libc::pid_t), signal);
    }
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
