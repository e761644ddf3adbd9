//! valve-frames/1: valve's own protocol with its plumber workers
//! (bench/r-loop/PROTOCOL.md is the byte-level specification; `loop.R` is the
//! worker's side).
//!
//! valve parses HTTP; a plumber worker gets each request as one frame on one
//! loopback TCP connection that the worker opened to valve (a worker listens
//! on nothing), and answers with one frame. So the worker runs no HTTP server
//! and spends its time on the API.
//!
//! - `FrameHub`: valve's one listener (`127.0.0.1:0`) and its secret token.
//!   A connection becomes a worker's only after a valid hello (right token,
//!   compared in constant time; an id valve is starting and has no connection
//!   for yet) within 5 s; few unauthenticated connections are kept at once.
//! - `Link`: one worker's connection, owned by one task that runs one
//!   exchange at a time (a request and its whole answer, or a ping and its
//!   pong) in the order asked. A request whose client left is still read to
//!   its end, so the stream stays in step; a ping queued behind it is answered
//!   only once R has finished (what an abandoned lease waits for).
//! - `FrameConnector`: the worker's `Connect`: waits for its hello, checks the
//!   pid, and hands out handles to its one link.

pub mod answer;
pub mod head;

use std::collections::HashMap;
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use flate2::write::GzEncoder;
use http::{Method, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch, Semaphore};

use self::answer::{Asked, FrameHeader, Garbage, HEADER_LEN};
use super::conn::{ClientAddrs, Conn, Connect, SendError, Spooled, WireBody};
use super::{BoxFuture, WorkerId};

/// The protocol line a hello starts with.
const PROTOCOL: &[u8] = b"valve-frames/1";
/// How long a new connection gets to say hello.
const HELLO_DEADLINE: Duration = Duration::from_secs(5);
/// Unauthenticated connections held at once; more are closed at once.
const MAX_UNAUTHENTICATED: usize = 16;
/// The largest hello head (protocol, id, pid, a 64-character token).
const MAX_HELLO: u32 = 1024;
/// The largest answer head valve reads (status and headers).
const MAX_ANSWER_HEAD: u32 = 64 << 20;
/// The longest file path an answer may name.
const MAX_PATH: u64 = 64 * 1024;
/// How much of an answer body is read (and passed on) at a time.
const CHUNK: usize = 64 * 1024;
/// Chunks in flight between a link and the answer's reader.
const CHUNKS_IN_FLIGHT: usize = 8;

// ---------------------------------------------------------------------------
// The listener

/// A worker that said a valid hello.
struct Hello {
    stream: TcpStream,
    pid: u32,
}

struct HubShared {
    token: String,
    /// Workers valve is starting and that have not said hello yet.
    waiting: Mutex<HashMap<WorkerId, oneshot::Sender<Hello>>>,
}

impl HubShared {
    fn waiting(&self) -> std::sync::MutexGuard<'_, HashMap<WorkerId, oneshot::Sender<Hello>>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// valve's one listener for worker connections, and the token that makes a
/// connection a worker's. Stops listening when dropped.
pub struct FrameHub {
    port: u16,
    shared: Arc<HubShared>,
    acceptor: tokio::task::JoinHandle<()>,
}

impl FrameHub {
    /// Listens on a free loopback port. Must be called inside the runtime.
    pub fn start() -> io::Result<Arc<FrameHub>> {
        let std_listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        std_listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(std_listener)?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(HubShared { token: new_token()?, waiting: Mutex::new(HashMap::new()) });
        let acceptor = tokio::spawn(accept_loop(listener, shared.clone()));
        tracing::debug!(port, "worker listener (valve-frames/1) ready");
        Ok(Arc::new(FrameHub { port, shared, acceptor }))
    }

    /// What a worker needs in its environment to reach valve.
    pub fn env(&self) -> [(&'static str, String); 2] {
        [("VALVE_FRAME_PORT", self.port.to_string()), ("VALVE_FRAME_TOKEN", self.shared.token.clone())]
    }

    /// Expects a hello from worker `id` (call before the worker can say it).
    pub fn connector(&self, id: WorkerId) -> FrameConnector {
        let (tx, rx) = oneshot::channel();
        self.shared.waiting().insert(id, tx);
        let (pid_tx, pid_rx) = watch::channel(None);
        FrameConnector {
            id,
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

/// 32 random bytes, in hex.
fn new_token() -> io::Result<String> {
    let mut bytes = [0u8; 32];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Compares in time that depends only on the lengths, never on where they differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

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

/// Reads and checks a hello: `valve-frames/1\nID\nPID\nTOKEN\n`.
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
        return Err("not valve-frames/1");
    }
    // The token before anything else is believed (it is never logged).
    if !same_secret(token, shared.token.as_bytes()) {
        return Err("wrong token");
    }
    let id: WorkerId = std::str::from_utf8(id).ok().and_then(|s| s.parse().ok()).ok_or("malformed worker id")?;
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
    hello: tokio::sync::Mutex<Option<Expected>>,
    /// The process that must have said the hello (a plain worker's process,
    /// or a fork's pid as it reported it).
    expected_pid: watch::Sender<Option<u32>>,
    pid_rx: watch::Receiver<Option<u32>>,
    link: Mutex<Option<Link>>,
}

impl FrameConnector {
    fn current(&self) -> Option<Link> {
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
                worker = self.id,
                hello_pid = hello.pid,
                expected_pid = root,
                "a hello with this worker's id came from another process; ignored"
            );
            return Err(io::Error::other("the hello came from another process"));
        }
        let link = Link::start(hello.stream, self.id, hello.pid);
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

// ---------------------------------------------------------------------------
// A worker's connection

/// A handle to one worker's connection; cheap to clone.
#[derive(Clone)]
pub struct Link {
    jobs: mpsc::UnboundedSender<Job>,
    alive: Arc<AtomicBool>,
}

enum Job {
    Ping(oneshot::Sender<io::Result<u32>>),
    Request(Outgoing, oneshot::Sender<Result<Response<super::AnswerBody>, SendError>>),
}

/// A request frame, ready to go in one write.
struct Outgoing {
    frame: Vec<u8>,
    asked: Asked,
    /// The spooled request body's file, kept until the answer is read.
    _keep: Option<Spooled>,
}

impl Link {
    fn start(stream: TcpStream, id: WorkerId, pid: u32) -> Link {
        let (jobs, rx) = mpsc::unbounded_channel();
        let alive = Arc::new(AtomicBool::new(true));
        let (rd, wr) = stream.into_split();
        tokio::spawn(serve_link(BufReader::with_capacity(CHUNK, rd), wr, rx, alive.clone(), id, pid));
        Link { jobs, alive }
    }

    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::Relaxed) && !self.jobs.is_closed()
    }

    fn lost() -> io::Error {
        io::Error::new(io::ErrorKind::ConnectionReset, "the worker's connection to valve is gone")
    }

    /// P/O: the worker's pid once it answers.
    pub async fn ping(&self) -> io::Result<u32> {
        let (tx, rx) = oneshot::channel();
        self.jobs.send(Job::Ping(tx)).map_err(|_| Self::lost())?;
        rx.await.map_err(|_| Self::lost())?
    }

    /// Sends one request and returns its answer's head at once; its body
    /// arrives as the worker sends it.
    pub async fn send(&self, req: http::Request<WireBody>) -> Result<Response<super::AnswerBody>, SendError> {
        let out = outgoing(req).await?;
        let (tx, rx) = oneshot::channel();
        self.jobs.send(Job::Request(out, tx)).map_err(|_| SendError::Lost(Self::lost()))?;
        rx.await.map_err(|_| SendError::Lost(Self::lost()))?
    }
}

/// Builds a request frame: the head (the Rook environment, serialized), and
/// the body inline or, when valve spooled it, the path of its file.
async fn outgoing(req: http::Request<WireBody>) -> Result<Outgoing, SendError> {
    let (parts, body) = req.into_parts();
    let addrs = parts.extensions.get::<ClientAddrs>().copied().unwrap_or(ClientAddrs {
        local: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
        remote: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
    });
    let spooled = parts.extensions.get::<Spooled>().cloned();
    let (flags, body) = match &spooled {
        Some(s) => (answer::REQ_BODY_FILE, Bytes::copy_from_slice(s.path.as_os_str().as_bytes())),
        None => {
            let collected = body.collect().await.map_err(SendError::Lost)?;
            (0, collected.to_bytes())
        }
    };
    let (server_name, server_port) = (addrs.local.ip().to_string(), addrs.local.port().to_string());
    let (remote_addr, remote_port) = (addrs.remote.ip().to_string(), addrs.remote.port().to_string());
    let rook = head::Rook {
        method: parts.method.as_str(),
        path: parts.uri.path(),
        query: parts.uri.query(),
        server_name: &server_name,
        server_port: &server_port,
        remote_addr: &remote_addr,
        remote_port: &remote_port,
    };
    let head = head::encode(&rook, &parts.headers);
    let header = FrameHeader { kind: answer::REQUEST, flags, head_len: head.len() as u32, body_len: body.len() as u64 };
    let mut frame = Vec::with_capacity(HEADER_LEN + head.len() + body.len());
    frame.extend_from_slice(&header.bytes());
    frame.extend_from_slice(&head);
    frame.extend_from_slice(&body);
    let asked = Asked { head: parts.method == Method::HEAD, gzip: answer::accepts_gzip(&parts.headers) };
    Ok(Outgoing { frame, asked, _keep: spooled })
}

/// How an exchange ended for the link.
enum Step {
    /// The stream is in step: serve the next job.
    Next,
    /// The stream is lost (closed, broken, or garbage): the link ends.
    Lost,
}

/// The one task that owns a worker's connection.
async fn serve_link(
    mut rd: BufReader<OwnedReadHalf>,
    mut wr: OwnedWriteHalf,
    mut jobs: mpsc::UnboundedReceiver<Job>,
    alive: Arc<AtomicBool>,
    id: WorkerId,
    pid: u32,
) {
    let nonces = AtomicU64::new(1);
    while let Some(job) = jobs.recv().await {
        let step = match job {
            Job::Ping(reply) => {
                let nonce = nonces.fetch_add(1, Ordering::Relaxed).to_be_bytes();
                let pong = ping(&mut rd, &mut wr, nonce).await;
                let step = if pong.is_ok() { Step::Next } else { Step::Lost };
                let _ = reply.send(pong);
                step
            }
            Job::Request(out, reply) => exchange(&mut rd, &mut wr, out, reply, id, pid).await,
        };
        if let Step::Lost = step {
            break;
        }
    }
    alive.store(false, Ordering::Relaxed);
    // Whatever was still queued learns it as its reply sender drops.
}

async fn read_header(rd: &mut BufReader<OwnedReadHalf>) -> io::Result<FrameHeader> {
    let mut raw = [0u8; HEADER_LEN];
    rd.read_exact(&mut raw).await?;
    Ok(FrameHeader::parse(&raw))
}

async fn read_vec(rd: &mut BufReader<OwnedReadHalf>, n: usize) -> io::Result<Vec<u8>> {
    let mut v = vec![0u8; n];
    rd.read_exact(&mut v).await?;
    Ok(v)
}

async fn ping(rd: &mut BufReader<OwnedReadHalf>, wr: &mut OwnedWriteHalf, nonce: [u8; 8]) -> io::Result<u32> {
    let header = FrameHeader { kind: answer::PING, flags: 0, head_len: 8, body_len: 0 };
    let mut frame = header.bytes().to_vec();
    frame.extend_from_slice(&nonce);
    wr.write_all(&frame).await?;
    let h = read_header(rd).await?;
    let garbage = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("bad pong: {what}"));
    if h.kind != answer::PONG || h.head_len != 12 || h.body_len != 0 {
        return Err(garbage("not a pong frame"));
    }
    let head = read_vec(rd, 12).await?;
    if head[..8] != nonce {
        return Err(garbage("the nonce does not match"));
    }
    Ok(u32::from_be_bytes([head[8], head[9], head[10], head[11]]))
}

/// One request and its whole answer. The answer's head goes to `reply` as
/// soon as it is read; its body follows through a channel. If nobody wants
/// the answer any more, it is still read to its end.
async fn exchange(
    rd: &mut BufReader<OwnedReadHalf>,
    wr: &mut OwnedWriteHalf,
    out: Outgoing,
    reply: oneshot::Sender<Result<Response<super::AnswerBody>, SendError>>,
    id: WorkerId,
    pid: u32,
) -> Step {
    if let Err(e) = wr.write_all(&out.frame).await {
        let _ = reply.send(Err(SendError::Lost(e)));
        return Step::Lost;
    }
    let garbage = |reply: oneshot::Sender<_>, what: String| {
        tracing::error!(worker = id, pid, error = %what, "the worker broke valve's protocol; replacing it");
        let _ = reply.send(Err(SendError::Garbage(what)));
        Step::Lost
    };
    let h = match read_header(rd).await {
        Ok(h) => h,
        Err(e) => {
            let _ = reply.send(Err(SendError::Lost(e)));
            return Step::Lost;
        }
    };
    if h.kind != answer::ANSWER {
        return garbage(reply, format!("expected an answer frame, got type {:#04x}", h.kind));
    }
    if h.head_len > MAX_ANSWER_HEAD {
        return garbage(reply, format!("answer head of {} bytes", h.head_len));
    }
    let head = match read_vec(rd, h.head_len as usize).await {
        Ok(head) => head,
        Err(e) => {
            let _ = reply.send(Err(SendError::Lost(e)));
            return Step::Lost;
        }
    };
    let parsed = match answer::parse_head(&head) {
        Ok(parsed) => parsed,
        Err(Garbage(what)) => return garbage(reply, what),
    };
    if h.flags & answer::LOOP_ERROR != 0 {
        tracing::warn!(
            worker = id,
            pid,
            "the worker's request loop failed on a request (its output says why); answered 500"
        );
    }

    // An answer naming a file: the path is the body.
    let mut file = None;
    let mut body_len = h.body_len;
    if h.flags & answer::BODY_FILE != 0 {
        if h.body_len > MAX_PATH {
            return garbage(reply, format!("a file path of {} bytes", h.body_len));
        }
        let path = match read_vec(rd, h.body_len as usize).await {
            Ok(p) => PathBuf::from(std::ffi::OsStr::from_bytes(&p)),
            Err(e) => {
                let _ = reply.send(Err(SendError::Lost(e)));
                return Step::Lost;
            }
        };
        let owned = h.flags & answer::FILE_OWNED != 0;
        let opened = std::fs::File::open(&path).and_then(|f| f.metadata().map(|m| (f, m.len())));
        match opened {
            Ok((f, len)) => {
                body_len = len;
                file = Some(AnswerFile { file: Some(f), path, owned });
            }
            Err(e) => {
                tracing::error!(worker = id, pid, path = %path.display(), error = %e,
                    "the app's answer names a file valve cannot open; answered 500");
                drop(AnswerFile { file: None, path, owned });
                let mut resp = Response::new(super::AnswerBody::empty());
                *resp.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
                let _ = reply.send(Ok(resp));
                return Step::Next;
            }
        }
    }

    let rendered = answer::render(&parsed, h.flags, body_len, out.asked);
    for note in &rendered.notes {
        tracing::warn!(worker = id, pid, note, "the app's answer was not valid HTTP as given");
    }
    let send_body = rendered.body;
    let (tx, rx) = mpsc::channel(CHUNKS_IN_FLIGHT);
    let hint = (send_body && !rendered.gzip).then_some(body_len);
    let body = if send_body { FrameBody::new(rx, hint) } else { FrameBody::empty() };
    let mut resp = Response::new(super::AnswerBody::Frames(body));
    *resp.status_mut() = rendered.status;
    *resp.headers_mut() = rendered.headers;
    let _ = reply.send(Ok(resp));

    let sink = Sink { tx: send_body.then_some(tx), gzip: rendered.gzip.then(Gzip::new) };
    match file {
        Some(f) => {
            // The socket is in step already (the path was the whole body).
            sink.file(f).await;
            Step::Next
        }
        None => match sink.socket(rd, h.body_len).await {
            Ok(()) => Step::Next,
            Err(_) => Step::Lost,
        },
    }
}

/// Where an answer's body goes: the reader of the answer (gzip-compressed if
/// asked), or nowhere once that reader is gone (or never wanted it).
struct Sink {
    tx: Option<mpsc::Sender<io::Result<Bytes>>>,
    gzip: Option<Gzip>,
}

impl Sink {
    async fn push(&mut self, chunk: Bytes) {
        let Some(tx) = &self.tx else { return };
        let chunk = match self.gzip.as_mut() {
            Some(gz) => gz.push(&chunk),
            None => chunk,
        };
        if !chunk.is_empty() && tx.send(Ok(chunk)).await.is_err() {
            self.tx = None;
        }
    }

    async fn finish(mut self) {
        if let (Some(tx), Some(gz)) = (self.tx.take(), self.gzip.take()) {
            match gz.finish() {
                Ok(tail) => {
                    let _ = tx.send(Ok(tail)).await;
                }
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                }
            }
        }
    }

    async fn fail(mut self, e: io::Error) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(Err(e)).await;
        }
    }

    /// Reads `len` bytes of body off the worker's socket: always all of them,
    /// so the stream stays in step.
    async fn socket(mut self, rd: &mut BufReader<OwnedReadHalf>, len: u64) -> io::Result<()> {
        let mut left = len;
        while left > 0 {
            let n = left.min(CHUNK as u64) as usize;
            let mut buf = vec![0u8; n];
            let got = match rd.read(&mut buf).await {
                Ok(0) => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the worker closed mid-answer")),
                Ok(got) => Ok(got),
                Err(e) => Err(e),
            };
            match got {
                Ok(got) => {
                    buf.truncate(got);
                    left -= got as u64;
                    self.push(Bytes::from(buf)).await;
                }
                Err(e) => {
                    let copy = io::Error::new(e.kind(), e.to_string());
                    self.fail(copy).await;
                    return Err(e);
                }
            }
        }
        self.finish().await;
        Ok(())
    }

    /// Streams a file the app named, off the async threads; deletes it
    /// afterwards if the app handed it over.
    async fn file(mut self, mut f: AnswerFile) {
        let Some(file) = f.file.take() else { return };
        let file = Arc::new(file);
        let mut offset = 0u64;
        while self.tx.is_some() {
            let file = file.clone();
            let read = tokio::task::spawn_blocking(move || {
                use std::os::unix::fs::FileExt;
                let mut buf = vec![0u8; CHUNK];
                let n = file.read_at(&mut buf, offset)?;
                buf.truncate(n);
                Ok::<_, io::Error>(buf)
            })
            .await
            .map_err(io::Error::other)
            .and_then(|r| r);
            match read {
                Ok(buf) if buf.is_empty() => break,
                Ok(buf) => {
                    offset += buf.len() as u64;
                    self.push(Bytes::from(buf)).await;
                }
                Err(e) => return self.fail(e).await,
            }
        }
        self.finish().await;
    }
}

/// A file an answer named; deleted when dropped if the app handed it over
/// (httpuv's `owned = TRUE`).
struct AnswerFile {
    file: Option<std::fs::File>,
    path: PathBuf,
    owned: bool,
}

impl Drop for AnswerFile {
    fn drop(&mut self) {
        if self.owned {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// gzip (zlib's default level) of a body that arrives in pieces.
struct Gzip(GzEncoder<Vec<u8>>);

impl Gzip {
    fn new() -> Gzip {
        Gzip(GzEncoder::new(Vec::new(), flate2::Compression::default()))
    }

    fn push(&mut self, chunk: &[u8]) -> Bytes {
        // Writing into a Vec cannot fail.
        let _ = self.0.write_all(chunk);
        Bytes::from(std::mem::take(self.0.get_mut()))
    }

    fn finish(self) -> io::Result<Bytes> {
        self.0.finish().map(Bytes::from)
    }
}

// ---------------------------------------------------------------------------
// An answer's body

/// An answer body as the worker's link passes it on.
pub struct FrameBody {
    rx: Option<mpsc::Receiver<io::Result<Bytes>>>,
    /// Bytes still due, when known (not for gzip).
    left: Option<u64>,
}

impl FrameBody {
    fn new(rx: mpsc::Receiver<io::Result<Bytes>>, len: Option<u64>) -> FrameBody {
        FrameBody { rx: (len != Some(0)).then_some(rx), left: len }
    }

    pub fn empty() -> FrameBody {
        FrameBody { rx: None, left: Some(0) }
    }
}

impl Body for FrameBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = &mut *self;
        let Some(rx) = this.rx.as_mut() else { return Poll::Ready(None) };
        match rx.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(chunk))) => {
                if let Some(left) = this.left.as_mut() {
                    *left = left.saturating_sub(chunk.len() as u64);
                    if *left == 0 {
                        this.rx = None;
                    }
                }
                Poll::Ready(Some(Ok(Frame::data(chunk))))
            }
            Poll::Ready(Some(Err(e))) => {
                this.rx = None;
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                this.rx = None;
                match this.left {
                    Some(left) if left > 0 => Poll::Ready(Some(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the worker's answer was cut short",
                    )))),
                    _ => Poll::Ready(None),
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rx.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match (self.left, &self.rx) {
            (_, None) => SizeHint::with_exact(0),
            (Some(left), _) => SizeHint::with_exact(left),
            (None, _) => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests;
