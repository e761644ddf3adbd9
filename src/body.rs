//! The request body valve sends to a worker: the client's stream, counted
//! against `--max-body-size`, or nothing (which can be replayed on a retry).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{Either, Empty};
use hyper::body::Incoming;

/// What a worker receives as a request body.
pub type ReqBody = Either<Upload, Empty<Bytes>>;

/// Why an upload stopped.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error("the request body is larger than --max-body-size ({0} bytes)")]
    TooLarge(u64),
    #[error("the client's request body could not be read: {0}")]
    Client(#[from] hyper::Error),
}

/// The client's body, streamed through with a byte budget.
pub struct Upload {
    inner: Incoming,
    limit: u64,
    left: u64,
}

impl Upload {
    pub fn new(inner: Incoming, limit: u64) -> Self {
        Upload { inner, limit, left: limit }
    }
}

impl Body for Upload {
    type Data = Bytes;
    type Error = UploadError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, UploadError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let len = data.len() as u64;
                    if len > this.left {
                        return Poll::Ready(Some(Err(UploadError::TooLarge(this.limit))));
                    }
                    this.left -= len;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(UploadError::Client(e)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Whether an error from a worker exchange came from the upload, and how.
pub fn upload_error<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a UploadError> {
    let mut cur: Option<&'a (dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(u) = e.downcast_ref::<UploadError>() {
            return Some(u);
        }
        cur = e.source();
    }
    None
}
