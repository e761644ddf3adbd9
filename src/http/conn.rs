//! One client connection, from accept to its last answer: TLS first when
//! the listener has a certificate (bounded in time, plain HTTP sent to it
//! answered with a short 400), then HTTP/2 when the client chose it by ALPN,
//! else HTTP/1.1 with upgrades; a socket that closes when its client stops
//! reading; and what an accept loop does when the process is out of
//! descriptors.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::service::Service;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::reply::ReplyBody;

/// Streams one HTTP/2 connection may have open at once: each holds at most
/// a buffered body, never a worker, so this bounds memory, not R.
pub const MAX_STREAMS: u32 = 100;

/// The limits every client connection gets.
#[derive(Clone, Copy, Debug)]
pub struct ClientLimits {
    /// To send a request's headers; also how long an idle keep-alive connection stays.
    pub header_timeout: Duration,
    /// The longest a client may leave an answer unread (or a body unsent).
    pub client_timeout: Duration,
    /// Largest request line and headers hyper reads at all (valve's own, smaller
    /// limit answers with a JSON 431 before this).
    pub max_head: usize,
}

/// How a listener speaks: plain HTTP, or TLS with a certificate store.
#[derive(Clone)]
pub enum Speaks {
    Plain,
    Tls(TlsAcceptor),
}

impl Speaks {
    pub fn tls(config: Arc<rustls::ServerConfig>) -> Speaks {
        Speaks::Tls(TlsAcceptor::from(config))
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, Speaks::Tls(_))
    }
}

/// Serves one accepted connection until it ends or `drain` fires (then the
/// request in flight finishes and the connection closes). `upgrades`: HTTP/1.1
/// upgrades (WebSockets) are served.
pub async fn serve<S>(
    stream: TcpStream,
    peer: SocketAddr,
    speaks: &Speaks,
    limits: ClientLimits,
    service: S,
    drain: CancellationToken,
    upgrades: bool,
) where
    S: Service<Request<Incoming>, Response = Response<ReplyBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let io = ClientIo::new(stream, limits.client_timeout);
    match speaks {
        Speaks::Plain => drive(io, false, limits, service, drain, upgrades).await,
        Speaks::Tls(acceptor) => {
            let Some(tls) = handshake(io, acceptor, limits.header_timeout, peer).await else { return };
            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
            drive(tls, h2, limits, service, drain, upgrades).await
        }
    }
}

/// The TLS handshake, within `limit`; plain HTTP sent to the TLS port gets a
/// plain 400 that says to use https://. None when it failed (said at debug
/// level: a bad client costs its own connection only).
async fn handshake(
    io: ClientIo,
    acceptor: &TlsAcceptor,
    limit: Duration,
    peer: SocketAddr,
) -> Option<tokio_rustls::server::TlsStream<ClientIo>> {
    let handshake = async {
        let mut first = [0u8; 1];
        match io.inner.peek(&mut first).await {
            Ok(1) if first[0] == 0x16 => {}
            Ok(1) if first[0].is_ascii_uppercase() => {
                // A TLS record starts 0x16; a capital letter is an HTTP method.
                let body = "{\"error\":\"this port speaks HTTPS: use https:// (plain HTTP was sent to it)\"}\n";
                let answer = format!(
                    "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let mut io = io;
                let _ = io.write_all(answer.as_bytes()).await;
                let _ = io.shutdown().await;
                return Err("plain HTTP sent to the TLS port".to_string());
            }
            _ => return Err("no TLS handshake".to_string()),
        }
        acceptor.accept(io).await.map_err(|e| e.to_string())
    };
    // One bound for the whole handshake, as for an HTTP/1.1 request's head.
    match tokio::time::timeout(limit, handshake).await {
        Ok(Ok(tls)) => Some(tls),
        Ok(Err(why)) => {
            tracing::debug!(%peer, error = %why, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake not finished within the header timeout");
            None
        }
    }
}

/// HTTP on a (possibly TLS) stream: HTTP/2 when `h2`, else HTTP/1.1.
async fn drive<I, S>(io: I, h2: bool, limits: ClientLimits, service: S, drain: CancellationToken, upgrades: bool)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: Service<Request<Incoming>, Response = Response<ReplyBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let io = TokioIo::new(io);
    let result = if h2 {
        // HTTP/2 has no header timeout of its own: a connection that has not
        // sent a whole request within it is closed, as HTTP/1.1's is.
        let asked = Arc::new(AtomicBool::new(false));
        let noted = asked.clone();
        let inner = service.clone();
        let service = hyper::service::service_fn(move |req| {
            noted.store(true, Ordering::Relaxed);
            inner.call(req)
        });
        let conn = http2_builder(limits).serve_connection(io, service);
        until_drained(conn, |c| c.graceful_shutdown(), drain, Some((limits.header_timeout, asked))).await
    } else if upgrades {
        let conn = http1_builder(limits).serve_connection(io, service).with_upgrades();
        until_drained(conn, |c| c.graceful_shutdown(), drain, None).await
    } else {
        let conn = http1_builder(limits).serve_connection(io, service);
        until_drained(conn, |c| c.graceful_shutdown(), drain, None).await
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "client connection ended with an error");
    }
}

/// Drives `conn` to its end; when `drain` fires, or when `first` passes
/// (its time, and whether a request came) with no request, asks it to
/// finish what is in flight and close (`shut`).
async fn until_drained<C>(
    conn: C,
    shut: impl Fn(Pin<&mut C>),
    drain: CancellationToken,
    first: Option<(Duration, Arc<AtomicBool>)>,
) -> hyper::Result<()>
where
    C: Future<Output = hyper::Result<()>>,
{
    tokio::pin!(conn);
    let (wait, asked) = first.unzip();
    let idle = tokio::time::sleep(wait.unwrap_or(Duration::MAX));
    tokio::pin!(idle);
    let mut watching = asked.is_some();
    loop {
        tokio::select! {
            r = conn.as_mut() => return r,
            _ = &mut idle, if watching => {
                watching = false;
                if asked.as_ref().is_some_and(|a| !a.load(Ordering::Relaxed)) {
                    shut(conn.as_mut());
                }
            }
            _ = drain.cancelled() => {
                shut(conn.as_mut());
                return conn.await;
            }
        }
    }
}

pub fn http1_builder(limits: ClientLimits) -> http1::Builder {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).max_header_size(limits.max_head);
    http
}

/// HTTP/2 within bounds: streams at once, header size, resets a client may
/// cause, and pings that close a connection whose client went silent.
fn http2_builder(limits: ClientLimits) -> http2::Builder<TokioExecutor> {
    let mut http = http2::Builder::new(TokioExecutor::new());
    http.timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS)
        .enable_connect_protocol()
        .max_header_list_size(limits.max_head as u32)
        .max_pending_accept_reset_streams(Some(20))
        .max_local_error_reset_streams(Some(256))
        .keep_alive_interval(Some(Duration::from_secs(20)))
        .keep_alive_timeout(Duration::from_secs(20));
    http
}

/// Out of file descriptors and the like: say so, once a second at most (the
/// caller backs off instead of spinning).
pub fn accept_failed(e: &io::Error, listener: &'static str) {
    use std::sync::atomic::AtomicU64;
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    if LAST.swap(now, Ordering::Relaxed) != now {
        tracing::warn!(listener, error = %e, "accept failed");
    }
}

/// One descriptor held back for the main listener: when the process is out of
/// descriptors, closing it lets valve accept (and shed) a connection.
pub struct Reserve(Option<std::fs::File>);

impl Default for Reserve {
    fn default() -> Self {
        Self::new()
    }
}

impl Reserve {
    pub fn new() -> Self {
        Reserve(std::fs::File::open("/dev/null").ok())
    }

    pub fn out_of_descriptors(&self, e: &io::Error) -> bool {
        self.0.is_some()
            && matches!(e.raw_os_error(), Some(code) if code == rustix::io::Errno::MFILE.raw_os_error() || code == rustix::io::Errno::NFILE.raw_os_error())
    }

    pub fn release(&mut self) {
        self.0 = None;
    }
}

/// A client's socket with a send timeout: a client that leaves an answer
/// unread for `stall` has its connection closed. Answers are already held by
/// valve, so this frees a connection and some buffer, never a worker.
struct ClientIo {
    inner: TcpStream,
    stall: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl ClientIo {
    fn new(inner: TcpStream, stall: Duration) -> Self {
        ClientIo { inner, stall, timer: None }
    }

    fn stalled<T>(&mut self, cx: &mut Context<'_>, polled: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match polled {
            Poll::Ready(r) => {
                self.timer = None;
                Poll::Ready(r)
            }
            Poll::Pending => {
                let stall = self.stall;
                let timer = self.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "the client stopped reading")))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl AsyncRead for ClientIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for ClientIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.stalled(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.stalled(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.stalled(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
