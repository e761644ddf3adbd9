//! valve's server's side of the socket pair: requests out, replies in. One
//! reader task hands each reply to whoever waits for it (a start's answer,
//! a process's exit); when the spawner is gone, every process it started
//! is taken for dead (its parent-death signal killed it) and valve stops.

use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rustix::process::Signal;
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;

use super::wire::{self, Reply, Request, Start};

/// Why a start did not happen.
pub enum Failure {
    /// The request broke one of the spawner's rules (said on the log).
    Refused(String),
    /// It was allowed but did not start: the error, and the sandbox step that failed if one did.
    Failed(io::Error, Option<String>),
}

pub struct Client {
    sock: Arc<AsyncFd<OwnedFd>>,
    shared: Arc<Shared>,
    next: AtomicU64,
}

#[derive(Default)]
struct Shared {
    answers: Mutex<HashMap<u64, oneshot::Sender<Reply>>>,
    exits: Mutex<HashMap<u64, oneshot::Sender<i32>>>,
    gone: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A process the spawner started for valve.
pub struct Started {
    id: u64,
    pid: u32,
    sock: Arc<AsyncFd<OwnedFd>>,
    exit: Option<oneshot::Receiver<i32>>,
    status: Option<i32>,
}

impl Client {
    /// The client of the spawner on `sock`; its reader runs on the current runtime.
    pub(super) fn new(sock: OwnedFd) -> io::Result<Client> {
        rustix::io::ioctl_fionbio(&sock, true)?;
        // SAFETY: the AsyncFd owns the socket, open and the same until it is dropped.
        let sock = Arc::new(unsafe { AsyncFd::register(sock) }.map_err(|e| e.into_parts().1)?);
        let shared = Arc::new(Shared::default());
        tokio::spawn(read_replies(sock.clone(), shared.clone()));
        Ok(Client { sock, shared, next: AtomicU64::new(1) })
    }

    /// Asks the spawner to start `start` (its id and piped streams are
    /// filled in here) with `ends` as its piped streams.
    pub(in crate::worker) async fn start(
        &self,
        mut start: Start,
        ends: [Option<OwnedFd>; 3],
    ) -> Result<Started, Failure> {
        let plain = |e: io::Error| Failure::Failed(e, None);
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        start.id = id;
        start.piped = [ends[0].is_some(), ends[1].is_some(), ends[2].is_some()];
        let fds: Vec<OwnedFd> = ends.into_iter().flatten().collect();
        let (answer, answered) = oneshot::channel();
        let (exit_tx, exit) = oneshot::channel();
        lock(&self.shared.answers).insert(id, answer);
        lock(&self.shared.exits).insert(id, exit_tx);
        if self.shared.gone.load(Ordering::SeqCst) {
            return Err(plain(gone_error()));
        }
        let sent = send(&self.sock, &Request::Start(Box::new(start)), fds).await;
        if let Err(e) = sent {
            lock(&self.shared.answers).remove(&id);
            lock(&self.shared.exits).remove(&id);
            return Err(plain(e));
        }
        match answered.await {
            Ok(Reply::Started { pid, .. }) => {
                Ok(Started { id, pid, sock: self.sock.clone(), exit: Some(exit), status: None })
            }
            Ok(Reply::Refused { why, .. }) => {
                lock(&self.shared.exits).remove(&id);
                Err(Failure::Refused(why))
            }
            Ok(Reply::Failed { step, not_found, denied, error, .. }) => {
                lock(&self.shared.exits).remove(&id);
                let kind = match (not_found, denied) {
                    (true, _) => io::ErrorKind::NotFound,
                    (_, true) => io::ErrorKind::PermissionDenied,
                    _ => io::ErrorKind::Other,
                };
                Err(Failure::Failed(io::Error::new(kind, error), step))
            }
            Ok(Reply::Exited { .. }) | Err(_) => Err(plain(gone_error())),
        }
    }

    /// Sends one raw message as it is (a test's: the spawner must refuse it).
    #[cfg(feature = "test-hooks")]
    pub(in crate::worker) async fn send_raw(&self, bytes: Vec<u8>) -> io::Result<()> {
        raw(&self.sock, &bytes).await
    }
}

fn gone_error() -> io::Error {
    io::Error::other("the privileged spawner is gone")
}

impl Started {
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Its raw wait status, once the spawner reaped it.
    pub async fn exited(&mut self) -> i32 {
        if let Some(status) = self.status {
            return status;
        }
        // Cancel-safe: a wait given up (a `select!` another branch won)
        // leaves the receiver here for the next.
        let status = match &mut self.exit {
            Some(rx) => rx.await.unwrap_or(libc::SIGKILL),
            None => libc::SIGKILL,
        };
        self.exit = None;
        self.status = Some(status);
        status
    }

    /// Signals its process group (or just it, `group` false); nothing once reaped.
    pub fn signal(&self, sig: Signal) {
        self.signal_as(sig, true);
    }

    /// Kills its process group unless it has exited (a `Child` dropped while it runs).
    pub fn kill_if_running(&self) {
        if self.status.is_none() {
            self.signal_as(Signal::KILL, true);
        }
    }

    fn signal_as(&self, sig: Signal, group: bool) {
        let request = Request::Signal { id: self.id, sig: sig.as_raw(), group };
        // A small message on a socket with room is sent at once; else later.
        match wire::send(self.sock.get_ref(), &request, &[]) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let sock = self.sock.clone();
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    rt.spawn(async move { send(&sock, &request, Vec::new()).await });
                }
            }
            _ => {}
        }
    }
}

async fn send(sock: &AsyncFd<OwnedFd>, request: &Request, fds: Vec<OwnedFd>) -> io::Result<()> {
    loop {
        let mut guard = sock.writable().await?;
        match guard.try_io(|s| wire::send(s.get_ref(), request, &fds)) {
            Ok(result) => return result,
            Err(_would_block) => continue,
        }
    }
}

#[cfg(feature = "test-hooks")]
async fn raw(sock: &AsyncFd<OwnedFd>, bytes: &[u8]) -> io::Result<()> {
    loop {
        let mut guard = sock.writable().await?;
        let sent = guard.try_io(|s| {
            rustix::net::send(s.get_ref(), bytes, rustix::net::SendFlags::NOSIGNAL).map(|_| ()).map_err(Into::into)
        });
        match sent {
            Ok(result) => return result,
            Err(_would_block) => continue,
        }
    }
}

/// Hands each reply to its waiter until the spawner hangs up; then valve stops.
async fn read_replies(sock: Arc<AsyncFd<OwnedFd>>, shared: Arc<Shared>) {
    loop {
        let received = match sock.readable().await {
            Ok(mut guard) => match guard.try_io(|s| wire::recv(s.get_ref())) {
                Ok(r) => r,
                Err(_would_block) => continue,
            },
            Err(e) => Err(e),
        };
        let bytes = match received {
            Ok(r) => r.bytes,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => None,
        };
        let Some(bytes) = bytes else { break };
        let reply: Reply = match serde_json::from_slice(&bytes) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "a reply of the privileged spawner that does not parse");
                continue;
            }
        };
        match reply {
            Reply::Exited { id, status } => {
                if let Some(tx) = lock(&shared.exits).remove(&id) {
                    let _ = tx.send(status);
                }
            }
            Reply::Started { id, .. } | Reply::Failed { id, .. } | Reply::Refused { id: Some(id), .. } => {
                if let Some(tx) = lock(&shared.answers).remove(&id) {
                    let _ = tx.send(reply);
                }
            }
            Reply::Refused { id: None, why } => {
                tracing::warn!(why, "the privileged spawner refused a message valve sent");
            }
        }
    }
    shared.gone.store(true, Ordering::SeqCst);
    // Its children died with it (their parent-death signal): so say their exits.
    for (_, tx) in lock(&shared.exits).drain() {
        let _ = tx.send(libc::SIGKILL);
    }
    lock(&shared.answers).clear();
    gone();
}

/// The server's end, from the fork until the first use makes it a client.
static SOCK: Mutex<Option<OwnedFd>> = Mutex::new(None);
static CLIENT: std::sync::OnceLock<Option<Client>> = std::sync::OnceLock::new();
/// The spawner died under valve (valve stops, and says so in its exit code).
static LOST: AtomicBool = AtomicBool::new(false);

/// The spawner's folder of what runs as root (`lib/`, `zygote/`).
static ROOT: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// valve's end of the socket pair, just forked, and the spawner's folder.
pub(super) fn keep(sock: OwnedFd, root: std::path::PathBuf) {
    *lock(&SOCK) = Some(sock);
    let _ = ROOT.set(root);
}

/// Where the warm parent's code and home are when the spawner starts it
/// (root's, made before valve's server ran anything).
pub fn root_folder() -> Option<&'static std::path::Path> {
    ROOT.get().map(|p| p.as_path())
}

/// The client of the privileged spawner, when there is one (valve is root).
/// The first call, on valve's runtime, starts its reader.
pub fn client() -> Option<&'static Client> {
    let client = CLIENT
        .get_or_init(|| {
            let sock = lock(&SOCK).take()?;
            match Client::new(sock) {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::error!(error = %e, "cannot reach the privileged spawner");
                    None
                }
            }
        })
        .as_ref();
    #[cfg(feature = "test-hooks")]
    if let Some(c) = client {
        send_test_asks(c);
    }
    client
}

/// A test's: each line of the file `VALVE_HOOK_SPAWNER_ASKS` names is sent
/// to the spawner as one message, as it is, once (the spawner must refuse
/// every one, saying why, and start nothing).
#[cfg(feature = "test-hooks")]
fn send_test_asks(client: &'static Client) {
    static SENT: std::sync::Once = std::sync::Once::new();
    let Some(file) = crate::config::hook("SPAWNER_ASKS") else { return };
    SENT.call_once(|| {
        let asks = std::fs::read_to_string(file).unwrap_or_default();
        tokio::spawn(async move {
            for line in asks.lines().filter(|l| !l.is_empty()) {
                if let Err(e) = client.send_raw(line.as_bytes().to_vec()).await {
                    tracing::warn!(error = %e, "a test's message did not reach the spawner");
                }
            }
        });
    });
}

/// Whether the spawner died under valve.
pub fn lost() -> bool {
    LOST.load(Ordering::SeqCst)
}

/// The spawner is gone: valve stops (as SIGTERM would have it).
fn gone() {
    LOST.store(true, Ordering::SeqCst);
    tracing::error!("the privileged spawner exited: valve stops (its processes died with it)");
    let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::TERM);
}
