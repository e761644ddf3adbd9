//! One worker's frames connection (`Link`), owned by one task that runs one
//! exchange at a time (a request and its whole answer, or a ping and its
//! pong) in the order asked. A request whose client left is still read to
//! its end, so the stream stays in step; a ping queued behind it is answered
//! only once R has finished (what an abandoned lease waits for).

use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use flate2::write::GzEncoder;
use http::{Method, Response};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use super::answer::{self, Asked, FrameHeader, Garbage, HEADER_LEN};
use super::head;
use crate::worker::wire::{AnswerBody, ClientAddrs, FrameBody, SendError, Spooled, WireBody, WorkerId};

/// The largest answer head valve reads (status and headers).
const MAX_ANSWER_HEAD: u32 = 64 << 20;

/// The longest file path an answer may name.
const MAX_PATH: u64 = 64 * 1024;

/// How much of an answer body is read (and passed on) at a time.
const CHUNK: usize = 64 * 1024;

/// Chunks in flight between a link and the answer's reader.
const CHUNKS_IN_FLIGHT: usize = 8;

// A worker's connection

/// A handle to one worker's connection; cheap to clone.
#[derive(Clone)]
pub struct Link {
    jobs: mpsc::UnboundedSender<Job>,
    alive: Arc<AtomicBool>,
}

enum Job {
    Ping(oneshot::Sender<io::Result<u32>>),
    Request(Outgoing, oneshot::Sender<Result<Response<AnswerBody>, SendError>>),
}

/// A request frame, ready to go in one write.
struct Outgoing {
    frame: Vec<u8>,
    asked: Asked,
    /// The spooled request body's file, kept until the answer is read.
    _keep: Option<Spooled>,
}

impl Link {
    pub(super) fn start(stream: TcpStream, id: WorkerId, pid: u32) -> Link {
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
    pub async fn send(&self, req: http::Request<WireBody>) -> Result<Response<AnswerBody>, SendError> {
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
    reply: oneshot::Sender<Result<Response<AnswerBody>, SendError>>,
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
                let mut resp = Response::new(AnswerBody::empty());
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
    let mut resp = Response::new(AnswerBody::Frames(body));
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
