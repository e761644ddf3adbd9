//! Connections to a worker: HTTP/1.1 over its private Unix socket, kept alive
//! between requests (a Unix socket has no Nagle stall, so one connection per
//! worker serves request after request).

use std::io;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::UnixStream;

use super::BoxFuture;

/// The request body as a worker receives it: already complete in valve's
/// hands (memory or a spooled file), so a worker never waits for a client.
pub type WireBody = BoxBody<Bytes, io::Error>;

/// The path workers answer for probes; valve never forwards `/__valve__/` paths.
const PING_PATH: &str = "/__valve__/ping";

/// One HTTP/1.1 connection to a worker.
pub struct Conn {
    sender: hyper::client::conn::http1::SendRequest<WireBody>,
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
        Ok(Conn { sender })
    }

    /// Waits until the connection can take a request; fails if it closed.
    pub async fn ready(&mut self) -> Result<(), hyper::Error> {
        self.sender.ready().await
    }

    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }

    pub async fn send(&mut self, req: http::Request<WireBody>) -> Result<http::Response<Incoming>, hyper::Error> {
        self.sender.send_request(req).await
    }

    /// Asks the worker's ping path and reads the whole answer. Any answer means
    /// the worker serves; plumber workers (through the launcher) say their pid.
    pub async fn ping(&mut self) -> io::Result<Option<u32>> {
        let req = http::Request::get(PING_PATH)
            .header(http::header::HOST, "valve")
            .body(Empty::new().map_err(|never| match never {}).boxed())
            .map_err(io::Error::other)?;
        self.ready().await.map_err(io::Error::other)?;
        let resp = self.send(req).await.map_err(io::Error::other)?;
        let body = resp.into_body().collect().await.map_err(io::Error::other)?.to_bytes();
        Ok(std::str::from_utf8(&body).ok().and_then(|b| b.strip_prefix("valve-worker-ready ")?.trim().parse().ok()))
    }
}

/// Opens connections to one worker.
pub trait Connect: Send + Sync {
    /// A fresh connection; `upgradable` for a WebSocket, whose connection is
    /// handed over after the upgrade.
    fn connect(&self, upgradable: bool) -> BoxFuture<'_, io::Result<Conn>>;

    /// A fresh connection that has answered a ping.
    fn probe(&self) -> BoxFuture<'_, io::Result<Conn>> {
        Box::pin(async move {
            let mut conn = self.connect(false).await?;
            conn.ping().await?;
            Ok(conn)
        })
    }
}

/// A worker's Unix socket.
pub struct SocketConnector {
    path: PathBuf,
}

impl SocketConnector {
    pub fn new(path: PathBuf) -> Self {
        SocketConnector { path }
    }
}

impl Connect for SocketConnector {
    fn connect(&self, upgradable: bool) -> BoxFuture<'_, io::Result<Conn>> {
        Box::pin(connect(&self.path, upgradable))
    }
}

/// Opens a fresh HTTP/1.1 connection to a worker's socket.
pub async fn connect(socket: &Path, upgradable: bool) -> io::Result<Conn> {
    let stream = UnixStream::connect(socket).await?;
    Conn::handshake(stream, upgradable).await
}

/// Connects to a worker's socket and pings it; returns the connection and the
/// pid a plumber worker reports.
pub async fn probe(socket: &Path) -> io::Result<(Conn, Option<u32>)> {
    let mut conn = connect(socket, false).await?;
    let pid = conn.ping().await?;
    Ok((conn, pid))
}
