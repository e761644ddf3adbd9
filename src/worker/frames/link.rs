//! One worker's frames connection (`Link`): one task writes frames in the
//! order asked, one reads what the worker sends (pongs, WAITING, answers)
//! and matches each to its request by id, so a worker that waits on
//! promises holds several requests and answers them in any order. A request
//! whose client left (or that timed out) is still read to its end, so the
//! stream stays in step. R reads a ping only while it computes nothing, so a
//! pong also says R is free (what an abandoned lease waits for).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Method, Response};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use super::answer::{self, Asked, FrameHeader, Garbage, HEADER_LEN};
use super::head;
use super::sink::{AnswerFile, Gzip, Sink, CHUNK};
use crate::worker::wire::{AnswerBody, ClientAddrs, FrameBody, Park, Parking, SendError, Spooled, WireBody, WorkerId};

/// The largest answer head valve reads (status and headers).
const MAX_ANSWER_HEAD: u32 = 64 << 20;

/// The longest file path an answer may name.
const MAX_PATH: u64 = 64 * 1024;

/// Chunks in flight between a link and the answer's reader.
const CHUNKS_IN_FLIGHT: usize = 8;

// A worker's connection

/// The most requests one link holds at once (ids are 16 bits; 0 is no request).
const MAX_REQUESTS: usize = 4096;

/// A handle to one worker's connection; cheap to clone.
#[derive(Clone)]
pub struct Link {
    /// Frames to write, in order, to the one writer task.
    frames: mpsc::UnboundedSender<Vec<u8>>,
    table: Arc<Table>,
    alive: Arc<AtomicBool>,
}

/// What the link's writer, reader and handles share: the requests and pings
/// awaiting their answers.
#[derive(Default)]
struct Table(Mutex<Inner>);

#[derive(Default)]
struct Inner {
    last_id: u16,
    requests: HashMap<u16, Entry>,
    pings: HashMap<[u8; 8], oneshot::Sender<io::Result<u32>>>,
    next_nonce: u64,
    lost: bool,
}

type Reply = oneshot::Sender<Result<Response<AnswerBody>, SendError>>;

/// A request sent and not yet answered.
struct Entry {
    /// Who waits for the answer; None once they gave up (its answer is read and dropped).
    reply: Option<Reply>,
    asked: Asked,
    park: Option<Arc<dyn Parking>>,
    /// R said WAITING for it: it waits on a promise.
    parked: bool,
    /// The spooled request body's file, kept until the answer is read.
    _keep: Option<Spooled>,
}

impl Entry {
    /// Who counted the request parked, to be told it is over (once).
    fn settler(&mut self) -> Option<Arc<dyn Parking>> {
        if self.parked {
            self.park.take()
        } else {
            None
        }
    }

    /// The request is over for whoever counted it parked.
    fn settle(&mut self) {
        if let Some(park) = self.settler() {
            park.settled();
        }
    }
}

impl Table {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The link is gone: every waiter learns it (their reply senders drop,
    /// or say what the worker broke).
    fn lose(&self, broken: Option<&str>) {
        let (requests, _pings) = {
            let mut t = self.lock();
            t.lost = true;
            (std::mem::take(&mut t.requests), std::mem::take(&mut t.pings))
        };
        for (_, mut entry) in requests {
            entry.settle();
            if let (Some(what), Some(reply)) = (broken, entry.reply.take()) {
                let _ = reply.send(Err(SendError::Garbage(what.to_string())));
            }
        }
    }
}

/// Drops a request's claim on its answer if its sender stops waiting (a
/// timeout, a client gone): the answer, when it comes, is read and dropped.
struct GiveUp<'a> {
    table: &'a Table,
    id: u16,
}

impl Drop for GiveUp<'_> {
    fn drop(&mut self) {
        let settler = {
            let mut t = self.table.lock();
            let Some(entry) = t.requests.get_mut(&self.id) else { return };
            entry.reply = None;
            entry.settler()
        };
        // Told outside the table's lock, as everywhere.
        if let Some(park) = settler {
            park.settled();
        }
    }
}

/// Whose connection a link is, for its log events.
#[derive(Clone, Debug)]
pub(super) struct Who {
    pub(super) app: Arc<str>,
    pub(super) id: WorkerId,
    pub(super) pid: u32,
}

impl Link {
    pub(super) fn start(stream: TcpStream, who: Who) -> Link {
        let (frames, rx) = mpsc::unbounded_channel();
        let alive = Arc::new(AtomicBool::new(true));
        let table = Arc::new(Table::default());
        let (rd, wr) = stream.into_split();
        tokio::spawn(write_frames(wr, rx, table.clone(), alive.clone()));
        tokio::spawn(read_frames(BufReader::with_capacity(CHUNK, rd), table.clone(), alive.clone(), who));
        Link { frames, table, alive }
    }

    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::Relaxed) && !self.frames.is_closed()
    }

    fn lost() -> io::Error {
        io::Error::new(io::ErrorKind::ConnectionReset, "the worker's connection to valve is gone")
    }

    /// P/O: the worker's pid once it answers. R reads a ping only while it
    /// computes nothing, so a pong also says R is free.
    pub async fn ping(&self) -> io::Result<u32> {
        let (tx, rx) = oneshot::channel();
        let nonce = {
            let mut t = self.table.lock();
            if t.lost {
                return Err(Self::lost());
            }
            t.next_nonce += 1;
            let nonce = t.next_nonce.to_be_bytes();
            t.pings.insert(nonce, tx);
            nonce
        };
        let header = FrameHeader { kind: answer::PING, flags: 0, id: 0, head_len: 8, body_len: 0 };
        let mut frame = header.bytes().to_vec();
        frame.extend_from_slice(&nonce);
        self.frames.send(frame).map_err(|_| Self::lost())?;
        rx.await.map_err(|_| Self::lost())?
    }

    /// Sends one request and returns its answer's head once it comes; its
    /// body arrives as the worker sends it. Other requests may be sent
    /// meanwhile (R takes them while this one waits on a promise); answers
    /// come back in any order, each matched to its request by id.
    pub async fn send(&self, req: http::Request<WireBody>) -> Result<Response<AnswerBody>, SendError> {
        let park = req.extensions().get::<Park>().map(|p| p.0.clone());
        let mut out = outgoing(req).await?;
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut t = self.table.lock();
            if t.lost {
                return Err(SendError::Lost(Self::lost()));
            }
            if t.requests.len() >= MAX_REQUESTS {
                return Err(SendError::Lost(io::Error::other("the worker holds too many requests")));
            }
            let mut id = t.last_id;
            loop {
                id = id.wrapping_add(1);
                if id != 0 && !t.requests.contains_key(&id) {
                    break;
                }
            }
            t.last_id = id;
            let entry = Entry { reply: Some(tx), asked: out.asked, park, parked: false, _keep: out.keep.take() };
            t.requests.insert(id, entry);
            id
        };
        let _give_up = GiveUp { table: &self.table, id };
        out.frame[2..4].copy_from_slice(&id.to_be_bytes());
        self.frames.send(out.frame).map_err(|_| SendError::Lost(Self::lost()))?;
        rx.await.map_err(|_| SendError::Lost(Self::lost()))?
    }
}

/// A request frame, ready to go in one write (its id set as it goes).
struct Outgoing {
    frame: Vec<u8>,
    asked: Asked,
    /// The spooled request body's file, kept until the answer is read.
    keep: Option<Spooled>,
}

/// Builds a request frame: the head (the Rook environment, serialized), and
/// the body inline or, when valve spooled it, the path of its file.
async fn outgoing(req: http::Request<WireBody>) -> Result<Outgoing, SendError> {
    let (parts, body) = req.into_parts();
    let addrs = parts.extensions.get::<ClientAddrs>().copied().unwrap_or(ClientAddrs {
        local: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
        remote: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
        secure: false,
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
        url_scheme: if addrs.secure { "https" } else { "http" },
    };
    let head = head::encode(&rook, &parts.headers);
    let header =
        FrameHeader { kind: answer::REQUEST, flags, id: 0, head_len: head.len() as u32, body_len: body.len() as u64 };
    let mut frame = Vec::with_capacity(HEADER_LEN + head.len() + body.len());
    frame.extend_from_slice(&header.bytes());
    frame.extend_from_slice(&head);
    frame.extend_from_slice(&body);
    let asked = Asked { head: parts.method == Method::HEAD, gzip: answer::accepts_gzip(&parts.headers) };
    Ok(Outgoing { frame, asked, keep: spooled })
}

/// The one task that writes to a worker's connection, frames in the order sent.
async fn write_frames(
    mut wr: OwnedWriteHalf,
    mut frames: mpsc::UnboundedReceiver<Vec<u8>>,
    table: Arc<Table>,
    alive: Arc<AtomicBool>,
) {
    while let Some(frame) = frames.recv().await {
        if wr.write_all(&frame).await.is_err() {
            break;
        }
    }
    // All handles are gone (the worker is retired: it reads EOF and ends), or
    // the socket broke.
    alive.store(false, Ordering::Relaxed);
    table.lose(None);
}

/// How a frame ended for the reader.
enum Step {
    /// The stream is in step: read the next frame.
    Next,
    /// The stream is lost (closed or broken): the link ends.
    Lost,
    /// The worker broke the protocol: nothing it says can be trusted; the link ends.
    Garbage(String),
}

/// The one task that reads a worker's connection: pongs, WAITING, answers.
async fn read_frames(mut rd: BufReader<OwnedReadHalf>, table: Arc<Table>, alive: Arc<AtomicBool>, who: Who) {
    let (app, id, pid) = (&who.app, who.id, who.pid);
    loop {
        let h = match read_header(&mut rd).await {
            Ok(h) => h,
            Err(_) => break,
        };
        let step = match h.kind {
            answer::PONG => pong(&mut rd, h, &table, &who).await,
            answer::WAITING => waiting(h, &table, &who),
            answer::ANSWER => {
                let entry = table.lock().requests.remove(&h.id);
                if entry.is_none() {
                    tracing::error!(
                        app = %app,
                        worker = id,
                        pid,
                        request = h.id,
                        "the worker answered a request valve did not send or no longer has; the answer is dropped"
                    );
                }
                answer(&mut rd, h, entry, &who).await
            }
            kind => Step::Garbage(format!("a frame of unknown type {kind:#04x}")),
        };
        match step {
            Step::Next => {}
            Step::Lost => break,
            Step::Garbage(what) => {
                tracing::error!(app = %app, worker = id, pid, error = %what, "the worker broke valve's protocol; replacing it");
                alive.store(false, Ordering::Relaxed);
                return table.lose(Some(&what));
            }
        }
    }
    alive.store(false, Ordering::Relaxed);
    table.lose(None);
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

async fn pong(rd: &mut BufReader<OwnedReadHalf>, h: FrameHeader, table: &Table, who: &Who) -> Step {
    if h.head_len != 12 || h.body_len != 0 {
        return Step::Garbage("a malformed pong".into());
    }
    let Ok(head) = read_vec(rd, 12).await else { return Step::Lost };
    let nonce: [u8; 8] = head[..8].try_into().unwrap_or_default();
    match table.lock().pings.remove(&nonce) {
        Some(reply) => {
            let _ = reply.send(Ok(u32::from_be_bytes([head[8], head[9], head[10], head[11]])));
        }
        None => {
            tracing::warn!(app = %who.app, worker = who.id, pid = who.pid, "the worker answered a ping valve did not send; ignored")
        }
    }
    Step::Next
}

/// R says a request waits on a promise: whoever counts the worker's load learns it.
fn waiting(h: FrameHeader, table: &Table, who: &Who) -> Step {
    if h.head_len != 0 || h.body_len != 0 {
        return Step::Garbage("a WAITING frame with a head or body".into());
    }
    let park = {
        let mut t = table.lock();
        match t.requests.get_mut(&h.id) {
            Some(entry) if !entry.parked => {
                entry.parked = true;
                if entry.reply.is_none() {
                    // Given up while R computed it: the worker is settling, nobody counts it.
                    entry.park = None;
                }
                entry.park.clone()
            }
            _ => {
                tracing::error!(
                    app = %who.app,
                    worker = who.id,
                    pid = who.pid,
                    request = h.id,
                    "the worker says a request waits on a promise that is not one it computes; ignored"
                );
                return Step::Next;
            }
        }
    };
    if let Some(park) = park {
        if !park.parked() {
            if let Some(entry) = table.lock().requests.get_mut(&h.id) {
                entry.park = None;
            }
        }
    }
    Step::Next
}

/// One answer frame, for the request `entry` (None: an answer nobody asked
/// for, read and dropped). The answer's head goes to the request's reply as
/// soon as it is read; its body follows through a channel. If nobody wants
/// the answer any more, it is still read to its end.
async fn answer(rd: &mut BufReader<OwnedReadHalf>, h: FrameHeader, entry: Option<Entry>, who: &Who) -> Step {
    let (app, id, pid) = (&who.app, who.id, who.pid);
    let (reply, asked, _keep) = match entry {
        Some(mut entry) => {
            entry.settle();
            (entry.reply.take(), entry.asked, entry._keep.take())
        }
        None => (None, Asked::default(), None),
    };
    let garbage = |reply: Option<Reply>, what: String| {
        if let Some(reply) = reply {
            let _ = reply.send(Err(SendError::Garbage(what.clone())));
        }
        Step::Garbage(what)
    };
    let lost = |reply: Option<Reply>, e: io::Error| {
        if let Some(reply) = reply {
            let _ = reply.send(Err(SendError::Lost(e)));
        }
        Step::Lost
    };
    if h.head_len > MAX_ANSWER_HEAD {
        return garbage(reply, format!("answer head of {} bytes", h.head_len));
    }
    let head = match read_vec(rd, h.head_len as usize).await {
        Ok(head) => head,
        Err(e) => return lost(reply, e),
    };
    let parsed = match answer::parse_head(&head) {
        Ok(parsed) => parsed,
        Err(Garbage(what)) => return garbage(reply, what),
    };
    if h.flags & answer::LOOP_ERROR != 0 {
        tracing::warn!(
            app = %app,
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
            Err(e) => return lost(reply, e),
        };
        let owned = h.flags & answer::FILE_OWNED != 0;
        // Opened as the worker would open it: in its view, with its permissions.
        let place = super::named::Place::of(pid, &path);
        let opened = place
            .as_ref()
            .map_err(|e| io::Error::new(e.kind(), e.to_string()))
            .and_then(|p| p.open())
            .and_then(|f| f.metadata().map(|m| (f, m.len())));
        match opened {
            Ok((f, len)) => {
                body_len = len;
                file = Some(AnswerFile { file: Some(f), place: place.ok(), owned });
            }
            Err(e) => {
                tracing::error!(app = %app, worker = id, pid, path = %path.display(), error = %e,
                    "the app's answer names a file valve cannot open as the worker; answered 500");
                drop(AnswerFile { file: None, place: place.ok(), owned });
                let mut resp = Response::new(AnswerBody::empty());
                *resp.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
                if let Some(reply) = reply {
                    let _ = reply.send(Ok(resp));
                }
                return Step::Next;
            }
        }
    }

    let rendered = answer::render(&parsed, h.flags, body_len, asked);
    for note in &rendered.notes {
        tracing::warn!(app = %app, worker = id, pid, note, "the app's answer was not valid HTTP as given");
    }
    let send_body = rendered.body && reply.is_some();
    let (tx, rx) = mpsc::channel(CHUNKS_IN_FLIGHT);
    if let Some(reply) = reply {
        let hint = (send_body && !rendered.gzip).then_some(body_len);
        let body = if send_body { FrameBody::new(rx, hint) } else { FrameBody::empty() };
        let mut resp = Response::new(AnswerBody::Frames(body));
        *resp.status_mut() = rendered.status;
        *resp.headers_mut() = rendered.headers;
        let _ = reply.send(Ok(resp));
    }

    let sink = Sink { tx: send_body.then_some(tx), gzip: (send_body && rendered.gzip).then(Gzip::new) };
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
