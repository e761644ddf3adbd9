//! Connections to a worker, of two kinds behind one `Conn`:
//! - HTTP/1.1 over the worker's private Unix socket (httpuv in the worker:
//!   Shiny apps, and plumber APIs with `--worker-transport httpuv`), kept
//!   alive between requests (a Unix socket has no Nagle stall), or over
//!   loopback TCP to a port valve picked (a `_server.yml` engine, which
//!   runs its own HTTP server: `TcpConnector`);
//! - a handle to the worker's one frames link (`frames`: valve's own
//!   protocol, plumber APIs by default).
//!
//! Either way the forwarder sends an `http::Request` and gets an
//! `http::Response` back, so there is one forwarding loop for both.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};

use super::frames::link::Link;
use super::wire::{AnswerBody, BoxFuture, ClientAddrs, SendError, WireBody};

/// The path httpuv workers answer for probes; valve never forwards `/__valve__/` paths.
const PING_PATH: &str = "/__valve__/ping";

/// The client's address and port on an HTTP exchange with a worker. httpuv on
/// a Unix socket has no peer address to give R (and an engine's peer is
/// valve): the launcher moves these into the Rook environment's
/// `REMOTE_ADDR` and `REMOTE_PORT` (a frames worker is told in its frames).
/// The front removes any a client sent.
pub static CLIENT_ADDR: http::HeaderName = http::HeaderName::from_static("x-valve-remote-addr");
pub static CLIENT_PORT: http::HeaderName = http::HeaderName::from_static("x-valve-remote-port");
/// `https` when the client came over TLS (R's `rook.url_scheme`); only valve sends it.
pub static CLIENT_SCHEME: http::HeaderName = http::HeaderName::from_static("x-valve-scheme");

/// The worker's link token, on every request valve sends over a worker's
/// socket: the launcher answers 403 to a request without it (another
/// program of the same user, such as another app's R under Landlock, which
/// cannot be kept from connecting to a pathname socket before Linux 7.1).
/// The front removes any a client sent.
pub static LINK: http::HeaderName = http::HeaderName::from_static("x-valve-link");

/// The link token of the worker serving `socket` (`VALVE_LINK_TOKEN` in its
/// environment): a keyed tag of the path under a key valve makes at start.
pub fn link_token(socket: &Path) -> String {
    static KEY: std::sync::OnceLock<crate::mac::Key> = std::sync::OnceLock::new();
    let key = KEY.get_or_init(crate::mac::Key::random);
    key.tag_hex(&[b"valve-link", std::os::unix::ffi::OsStrExt::as_bytes(socket.as_os_str())])
}

fn name_the_client<B>(req: &mut http::Request<B>) {
    let Some(addrs) = req.extensions().get::<ClientAddrs>().copied() else { return };
    let headers = req.headers_mut();
    if let Ok(ip) = http::HeaderValue::from_str(&addrs.remote.ip().to_string()) {
        headers.insert(CLIENT_ADDR.clone(), ip);
    }
    headers.insert(CLIENT_PORT.clone(), http::HeaderValue::from(addrs.remote.port()));
    if addrs.secure {
        headers.insert(CLIENT_SCHEME.clone(), http::HeaderValue::from_static("https"));
    }
}

/// One connection to a worker.
pub struct Conn {
    kind: Kind,
    /// The worker's link token (`LINK`), over its socket.
    link: Option<http::HeaderValue>,
    /// Used for one exchange only, then closed (`Conn::once`).
    once: bool,
    spent: bool,
}

enum Kind {
    Http(hyper::client::conn::http1::SendRequest<WireBody>),
    Frames(Link),
}

impl Conn {
    /// Speaks HTTP over any byte stream (a worker's socket; an in-memory pipe in tests).
    pub async fn handshake<IO>(io: IO, upgradable: bool) -> io::Result<Conn>
    where
        IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await.map_err(io::Error::other)?;
        tokio::spawn(async move {
            let ended = if upgradable { conn.with_upgrades().await } else { conn.await };
            if let Err(e) = ended {
                tracing::debug!(error = %e, "worker connection closed");
            }
        });
        Ok(Conn { kind: Kind::Http(sender), link: None, once: false, spent: false })
    }

    pub(crate) fn frames(link: Link) -> Conn {
        Conn { kind: Kind::Frames(link), link: None, once: false, spent: false }
    }

    /// Every request on this connection carries the worker's link token.
    pub fn linked(mut self, token: &str) -> Conn {
        self.link = http::HeaderValue::from_str(token).ok();
        self
    }

    /// This connection serves one exchange (a request or a ping) and is then
    /// given up: keep-alive TCP to an httpuv server stalls ~40 ms a request
    /// (its Nagle meets valve's delayed ACK), a fresh loopback connection
    /// costs well under a millisecond.
    pub fn once(mut self) -> Conn {
        self.once = true;
        self
    }

    /// Waits until the connection can take a request; fails if it closed.
    pub async fn ready(&mut self) -> Result<(), SendError> {
        if self.spent {
            return Err(SendError::Lost(io::Error::other("a connection for one exchange, used")));
        }
        match &mut self.kind {
            Kind::Http(sender) => Ok(sender.ready().await?),
            Kind::Frames(link) if link.alive() => Ok(()),
            Kind::Frames(_) => Err(SendError::Lost(io::Error::other("the worker's connection to valve is gone"))),
        }
    }

    pub fn is_closed(&self) -> bool {
        if self.spent {
            return true;
        }
        match &self.kind {
            Kind::Http(sender) => sender.is_closed(),
            Kind::Frames(link) => !link.alive(),
        }
    }

    pub async fn send(&mut self, mut req: http::Request<WireBody>) -> Result<http::Response<AnswerBody>, SendError> {
        self.spent = self.once;
        match &mut self.kind {
            Kind::Http(sender) => {
                name_the_client(&mut req);
                if let Some(link) = &self.link {
                    req.headers_mut().insert(LINK.clone(), link.clone());
                }
                Ok(sender.send_request(req).await?.map(AnswerBody::Http))
            }
            Kind::Frames(link) => link.send(req).await,
        }
    }

    /// Asks whether the worker serves and reads the whole answer: the ping
    /// path over HTTP, a P/O exchange over frames. Says the worker's pid when
    /// it knows it (plumber workers say theirs).
    pub async fn ping(&mut self) -> io::Result<Option<u32>> {
        if self.spent {
            return Err(io::Error::other("a connection for one exchange, used"));
        }
        self.spent = self.once;
        let sender = match &mut self.kind {
            Kind::Http(sender) => sender,
            Kind::Frames(link) => return link.ping().await.map(Some),
        };
        let mut req = http::Request::get(PING_PATH).header(http::header::HOST, "valve");
        if let Some(link) = &self.link {
            req = req.header(LINK.clone(), link.clone());
        }
        let req = req.body(Empty::new().map_err(|never| match never {}).boxed()).map_err(io::Error::other)?;
        sender.ready().await.map_err(io::Error::other)?;
        let resp = sender.send_request(req).await.map_err(io::Error::other)?;
        let body = resp.into_body().collect().await.map_err(io::Error::other)?.to_bytes();
        Ok(std::str::from_utf8(&body).ok().and_then(|b| b.strip_prefix("valve-worker-ready ")?.trim().parse().ok()))
    }
}

/// Opens connections to one worker.
pub trait Connect: Send + Sync {
    /// A fresh connection; `upgradable` for a WebSocket, whose connection is
    /// handed over after the upgrade. (A frames worker has one connection for
    /// its life: this hands out another handle to it.)
    fn connect(&self, upgradable: bool) -> BoxFuture<'_, io::Result<Conn>>;

    /// A fresh connection that has answered a ping.
    fn probe(&self) -> BoxFuture<'_, io::Result<Conn>> {
        Box::pin(async move {
            let mut conn = self.connect(false).await?;
            conn.ping().await?;
            Ok(conn)
        })
    }

    /// The pid of the process that must answer (a frames worker's hello is
    /// checked against it); told once the process is known.
    fn expect_pid(&self, _pid: u32) {}

    /// Where the worker's own HTTP server listens, when valve picked a TCP
    /// address for it (an engine), and whether it ever accepted a
    /// connection there: what a start-up timeout reports.
    fn listens_on(&self) -> Option<(SocketAddr, bool)> {
        None
    }
}

/// A worker's HTTP server on a loopback TCP port valve picked for it (a
/// `_server.yml` engine listens where `launch_server` is told to).
pub struct TcpConnector {
    addr: SocketAddr,
    /// Whether a connection was ever accepted: tells "never listened" from
    /// "listened but never answered".
    listened: AtomicBool,
}

impl TcpConnector {
    pub fn new(addr: SocketAddr) -> Self {
        TcpConnector { addr, listened: AtomicBool::new(false) }
    }
}

impl Connect for TcpConnector {
    fn connect(&self, upgradable: bool) -> BoxFuture<'_, io::Result<Conn>> {
        Box::pin(async move {
            let stream = TcpStream::connect(self.addr).await?;
            self.listened.store(true, Ordering::Relaxed);
            // valve writes a request head and body as it has them; no Nagle stall on its side.
            stream.set_nodelay(true)?;
            Ok(Conn::handshake(stream, upgradable).await?.once())
        })
    }

    fn listens_on(&self) -> Option<(SocketAddr, bool)> {
        Some((self.addr, self.listened.load(Ordering::Relaxed)))
    }
}

/// An engine's worker (`_server.yml`): its own HTTP server on the Unix
/// socket valve gave it (the launcher turns httpuv's `startServer(host,
/// port)` into a pipe server there, which only valve and the worker can
/// reach), or, for an engine that opens its own TCP server, the loopback port
/// valve picked. Whichever answers first is used for the worker's life.
pub struct EngineConnector {
    socket: PathBuf,
    /// The uid that must serve the socket.
    peer: u32,
    tcp: TcpConnector,
    /// 0: not known yet, 1: the socket, 2: the TCP port.
    serves_on: std::sync::atomic::AtomicU8,
}

impl EngineConnector {
    pub fn new(socket: PathBuf, peer: u32, addr: SocketAddr) -> Self {
        EngineConnector { socket, peer, tcp: TcpConnector::new(addr), serves_on: std::sync::atomic::AtomicU8::new(0) }
    }
}

impl Connect for EngineConnector {
    fn connect(&self, upgradable: bool) -> BoxFuture<'_, io::Result<Conn>> {
        Box::pin(async move {
            match self.serves_on.load(Ordering::Relaxed) {
                1 => return Ok(connect(&self.socket, self.peer, upgradable).await?.once()),
                2 => return self.tcp.connect(upgradable).await,
                _ => {}
            }
            if let Ok(conn) = connect(&self.socket, self.peer, upgradable).await {
                self.serves_on.store(1, Ordering::Relaxed);
                return Ok(conn.once());
            }
            let conn = self.tcp.connect(upgradable).await?;
            if self.serves_on.swap(2, Ordering::Relaxed) != 2 {
                tracing::warn!(addr = %self.tcp.addr,
                    "this engine opens its own TCP server (not httpuv's): any local process can reach it on its loopback port");
            }
            Ok(conn)
        })
    }

    fn listens_on(&self) -> Option<(SocketAddr, bool)> {
        (self.serves_on.load(Ordering::Relaxed) != 1).then(|| self.tcp.listens_on()).flatten()
    }
}

/// A worker's Unix socket.
pub struct SocketConnector {
    path: PathBuf,
    /// The uid that must serve the socket.
    peer: u32,
}

impl SocketConnector {
    pub fn new(path: PathBuf, peer: u32) -> Self {
        SocketConnector { path, peer }
    }
}

impl Connect for SocketConnector {
    fn connect(&self, upgradable: bool) -> BoxFuture<'_, io::Result<Conn>> {
        Box::pin(connect(&self.path, self.peer, upgradable))
    }
}

/// Opens a fresh HTTP/1.1 connection to a worker's socket, served by `peer`
/// (the socket is in a folder of the app's user's: a link there to another
/// program's socket is refused, whoever's it is).
pub async fn connect(socket: &Path, peer: u32, upgradable: bool) -> io::Result<Conn> {
    let stream = UnixStream::connect(socket).await?;
    let served_by = stream.peer_cred()?.uid();
    if served_by != peer {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} is served by uid {served_by}, not the app's worker (uid {peer})", socket.display()),
        ));
    }
    Ok(Conn::handshake(stream, upgradable).await?.linked(&link_token(socket)))
}

/// Connects to a worker's socket and pings it; returns the connection and the
/// pid a plumber worker reports.
pub async fn probe(socket: &Path, peer: u32) -> io::Result<(Conn, Option<u32>)> {
    let mut conn = connect(socket, peer, false).await?;
    let pid = conn.ping().await?;
    Ok((conn, pid))
}
