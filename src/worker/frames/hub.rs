//! valve's one frames listener (`FrameHub`: `127.0.0.1:0` and the key its
//! workers' tokens are made with) and each worker's `FrameConnector`: a
//! connection becomes a worker's only after a valid hello (an id valve is
//! starting and has no connection for yet; that worker's own token, an HMAC
//! of its id under a key only valve holds, compared in constant time; the
//! pid of the process valve started or one of its descendants) within 5 s.
//! A worker knows its own token only, so no app can speak for another app's
//! worker.

use std::collections::HashMap;
use std::io::{self};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch, Semaphore};

use super::answer::{self, FrameHeader, HEADER_LEN};
use super::link::{Link, Who};
use crate::worker::conn::{Conn, Connect};
use crate::worker::wire::{BoxFuture, WorkerId};

/// The protocol line a hello starts with.
const PROTOCOL: &[u8] = b"valve-frames/2";

/// How long a new connection gets to say hello.
const HELLO_DEADLINE: Duration = Duration::from_secs(5);

/// Unauthenticated connections held at once; more are closed at once.
const MAX_UNAUTHENTICATED: usize = 16;

/// The largest hello head (protocol, id, pid, a 64-character token).
const MAX_HELLO: u32 = 1024;

/// A worker that said a valid hello.
struct Hello {
    stream: TcpStream,
    pid: u32,
}

pub(super) struct HubShared {
    /// Makes each worker's token; never leaves valve.
    key: crate::mac::Key,
    /// Workers valve is starting and that have not said hello yet.
    waiting: Mutex<HashMap<WorkerId, oneshot::Sender<Hello>>>,
}

impl HubShared {
    pub(super) fn token(&self, id: WorkerId) -> String {
        self.key.tag_hex(&[b"valve-frames hello", &id.to_be_bytes()])
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, HashMap<WorkerId, oneshot::Sender<Hello>>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// valve's one listener for worker connections, and the token that makes a
/// connection a worker's. Stops listening when dropped.
pub struct FrameHub {
    pub(super) port: u16,
    pub(super) shared: Arc<HubShared>,
    acceptor: tokio::task::JoinHandle<()>,
}

impl FrameHub {
    /// Listens on a free loopback port. Must be called inside the runtime.
    pub fn start() -> io::Result<Arc<FrameHub>> {
        let std_listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        std_listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(std_listener)?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(HubShared { key: crate::mac::Key::random(), waiting: Mutex::new(HashMap::new()) });
        let acceptor = tokio::spawn(accept_loop(listener, shared.clone()));
        tracing::debug!(port, "worker listener (valve-frames/2) ready");
        Ok(Arc::new(FrameHub { port, shared, acceptor }))
    }

    /// Where workers reach valve.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Worker `id`'s token, which its hello must carry.
    pub fn token(&self, id: WorkerId) -> String {
        self.shared.token(id)
    }

    /// Expects a hello from worker `id` of app `app` (call before the worker can say it).
    pub fn connector(&self, id: WorkerId, app: Arc<str>) -> FrameConnector {
        let (tx, rx) = oneshot::channel();
        self.shared.waiting().insert(id, tx);
        let (pid_tx, pid_rx) = watch::channel(None);
        FrameConnector {
            id,
            app,
            hello: tokio::sync::Mutex::new(Some(Expected { rx, id, shared: self.shared.clone() })),
            expected_pid: pid_tx,
            pid_rx,
            link: Mutex::new(None),
        }
    }
}

impl std::fmt::Debug for FrameHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("FrameHub").field("port", &self.port).finish_non_exhaustive()
    }
}

impl Drop for FrameHub {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

pub(super) use crate::mac::same as same_secret;

async fn accept_loop(listener: TcpListener, shared: Arc<HubShared>) {
    let unauthenticated = Arc::new(Semaphore::new(MAX_UNAUTHENTICATED));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "worker listener: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if !peer.ip().is_loopback() {
            continue;
        }
        let Ok(permit) = unauthenticated.clone().try_acquire_owned() else {
            tracing::warn!(%peer, "worker listener: too many connections without a hello; closing one");
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let said = tokio::time::timeout(HELLO_DEADLINE, read_hello(stream, &shared)).await;
            drop(permit);
            match said {
                Ok(Ok((id, hello))) => {
                    let waiter = shared.waiting().remove(&id);
                    match waiter {
                        Some(tx) => {
                            let _ = tx.send(hello);
                        }
                        None => tracing::warn!(worker = id, pid = hello.pid,
                            "worker listener: a hello from a worker valve is not starting (or one already connected); closed"),
                    }
                }
                Ok(Err(why)) => tracing::warn!(%peer, why, "worker listener: refused a connection"),
                Err(_) => tracing::warn!(%peer, "worker listener: no hello within 5 s; closed"),
            }
        });
    }
}

/// Reads and checks a hello: `valve-frames/2\nID\nPID\nTOKEN\n`.
async fn read_hello(mut stream: TcpStream, shared: &HubShared) -> Result<(WorkerId, Hello), &'static str> {
    let _ = stream.set_nodelay(true);
    let mut raw = [0u8; HEADER_LEN];
    stream.read_exact(&mut raw).await.map_err(|_| "closed before a whole hello")?;
    let h = FrameHeader::parse(&raw);
    if h.kind != answer::HELLO || h.head_len > MAX_HELLO || h.body_len != 0 {
        return Err("not a hello frame");
    }
    let mut head = vec![0u8; h.head_len as usize];
    stream.read_exact(&mut head).await.map_err(|_| "closed before a whole hello")?;
    let fields: Vec<&[u8]> = head.split(|b| *b == b'\n').collect();
    let [protocol, id, pid, token, end] = fields.as_slice() else { return Err("malformed hello") };
    if *protocol != PROTOCOL || !end.is_empty() {
        return Err("not valve-frames/2");
    }
    let id: WorkerId = std::str::from_utf8(id).ok().and_then(|s| s.parse().ok()).ok_or("malformed worker id")?;
    // That worker's token before anything else is believed (it is never logged).
    if !same_secret(token, shared.token(id).as_bytes()) {
        return Err("wrong token");
    }
    let pid: u32 = std::str::from_utf8(pid).ok().and_then(|s| s.parse().ok()).ok_or("malformed pid")?;
    Ok((id, Hello { stream, pid }))
}

// ---------------------------------------------------------------------------
// A worker's connector

/// A hello valve waits for; no longer waited for once dropped.
struct Expected {
    rx: oneshot::Receiver<Hello>,
    id: WorkerId,
    shared: Arc<HubShared>,
}

impl Drop for Expected {
    fn drop(&mut self) {
        self.shared.waiting().remove(&self.id);
    }
}

/// One frames worker: its hello (awaited once) and then its one link.
pub struct FrameConnector {
    id: WorkerId,
    /// The app's name, on the link's log events.
    app: Arc<str>,
    hello: tokio::sync::Mutex<Option<Expected>>,
    /// The process that must have said the hello (a plain worker's process,
    /// or a fork's pid as it reported it).
    expected_pid: watch::Sender<Option<u32>>,
    pid_rx: watch::Receiver<Option<u32>>,
    link: Mutex<Option<Link>>,
}

impl FrameConnector {
    pub(super) fn current(&self) -> Option<Link> {
        self.link.lock().unwrap_or_else(|p| p.into_inner()).clone().filter(Link::alive)
    }

    /// Waits for the worker's hello, checks it came from the worker's
    /// process, and pings it: then the worker is ready.
    async fn establish(&self) -> io::Result<Conn> {
        let mut expected = self.hello.lock().await;
        if let Some(link) = self.current() {
            let mut conn = Conn::frames(link);
            conn.ping().await?;
            return Ok(conn);
        }
        let waiting = expected.as_mut().ok_or_else(|| io::Error::other("the worker's connection to valve is gone"))?;
        let hello = (&mut waiting.rx).await.map_err(|_| io::Error::other("valve's worker listener stopped"))?;
        *expected = None;
        let mut pid_rx = self.pid_rx.clone();
        let root = pid_rx.wait_for(Option::is_some).await.ok().and_then(|p| *p);
        if !root.is_some_and(|root| same_or_descendant(hello.pid, root)) {
            tracing::error!(
                app = %self.app,
                worker = self.id,
                hello_pid = hello.pid,
                expected_pid = root,
                "a hello with this worker's id came from another process; ignored"
            );
            return Err(io::Error::other("the hello came from another process"));
        }
        let link = Link::start(hello.stream, Who { app: self.app.clone(), id: self.id, pid: hello.pid });
        let mut conn = Conn::frames(link.clone());
        let pid = conn.ping().await?;
        if pid != Some(hello.pid) {
            return Err(io::Error::other("the worker's pong names another pid than its hello"));
        }
        *self.link.lock().unwrap_or_else(|p| p.into_inner()) = Some(link);
        Ok(conn)
    }
}

impl Connect for FrameConnector {
    fn connect(&self, _upgradable: bool) -> BoxFuture<'_, io::Result<Conn>> {
        Box::pin(async move {
            self.current().map(Conn::frames).ok_or_else(|| io::Error::other("the worker's connection to valve is gone"))
        })
    }

    fn probe(&self) -> BoxFuture<'_, io::Result<Conn>> {
        Box::pin(self.establish())
    }

    fn expect_pid(&self, pid: u32) {
        let _ = self.expected_pid.send(Some(pid));
    }
}

/// Whether `pid` is `root` or runs under it (`--r-bin` may be a script that
/// starts R as its child instead of exec'ing it).
fn same_or_descendant(pid: u32, root: u32) -> bool {
    let mut p = pid;
    for _ in 0..8 {
        if p == root {
            return true;
        }
        let Some(parent) = parent_pid(p) else { return false };
        if parent <= 1 {
            return false;
        }
        p = parent;
    }
    false
}

fn parent_pid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok()
}
