//! The small types every part of a worker's transport shares, at the bottom
//! of `worker`: a worker's id, the request body sent and the answer body
//! received (either transport's), a client's addresses, a spooled body, and
//! why an exchange failed.

use std::any::Any;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use hyper::body::Incoming;
use tokio::sync::mpsc;

/// A worker's identity for its whole life; never reused within one valve run,
/// across apps and reloads.
pub type WorkerId = u64;

/// A boxed future, for the object-safe traits below.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The request body as a worker receives it: already complete in valve's
/// hands (memory or a spooled file), so a worker never waits for a client.
pub type WireBody = BoxBody<Bytes, io::Error>;

/// The client's connection, which a frames worker is told about (Rook's
/// `SERVER_NAME`, `SERVER_PORT`, `REMOTE_ADDR`, `REMOTE_PORT`). Carried in
/// the request's extensions.
#[derive(Clone, Copy, Debug)]
pub struct ClientAddrs {
    /// valve's address and port on the client's connection.
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// The client came over TLS (Rook's `rook.url_scheme` is `https`).
    pub secure: bool,
}

/// Told by a frames link about one request that R left waiting on a promise
/// (the request carries it as a `Park` extension).
pub trait Parking: Send + Sync {
    /// R returned a pending promise for the request and computes nothing for
    /// it now. False if nobody counts the request any more (its client left first).
    fn parked(&self) -> bool;
    /// The parked request is over: answered, given up (timed out, client
    /// gone) or lost with the link. Told once, and only after `parked`.
    fn settled(&self);
}

/// A request's `Parking`, as a request extension.
#[derive(Clone)]
pub struct Park(pub Arc<dyn Parking>);

/// Where an app's request bodies are spooled, and whose they must be (a
/// frames worker opens the file by its path).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpoolDir {
    pub dir: std::path::PathBuf,
    pub owner: Option<(u32, u32)>,
}

/// A request body valve spooled to a named file in its private run directory:
/// a frames worker reads the file instead of receiving the bytes. `keep`
/// keeps the file until the worker has answered. Carried in the request's
/// extensions.
#[derive(Clone)]
pub struct Spooled {
    pub path: PathBuf,
    pub keep: Arc<dyn Any + Send + Sync>,
}

/// Why a request to a worker got no answer.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("{0}")]
    Http(#[from] hyper::Error),
    #[error("the worker's connection broke: {0}")]
    Lost(io::Error),
    /// The worker sent what the protocol does not allow: it was replaced.
    #[error("the worker broke valve's protocol: {0}")]
    Garbage(String),
}

/// A worker's answer body: hyper's (httpuv workers) or a frames link's.
pub enum AnswerBody {
    Http(Incoming),
    Frames(FrameBody),
}

impl AnswerBody {
    pub fn empty() -> AnswerBody {
        AnswerBody::Frames(FrameBody::empty())
    }
}

impl Body for AnswerBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        // Both variants are Unpin.
        match self.get_mut() {
            AnswerBody::Http(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            AnswerBody::Frames(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            AnswerBody::Http(b) => b.is_end_stream(),
            AnswerBody::Frames(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            AnswerBody::Http(b) => b.size_hint(),
            AnswerBody::Frames(b) => b.size_hint(),
        }
    }
}

/// An answer body as the worker's link passes it on.
pub struct FrameBody {
    rx: Option<mpsc::Receiver<io::Result<Bytes>>>,
    /// Bytes still due, when known (not for gzip).
    left: Option<u64>,
}

impl FrameBody {
    pub(super) fn new(rx: mpsc::Receiver<io::Result<Bytes>>, len: Option<u64>) -> FrameBody {
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
