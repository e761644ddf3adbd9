//! What valve sends back to a client: the body type every answer uses (the
//! admin pages' and the proxied ones), and valve's own short JSON errors.

use std::pin::Pin;
use std::task::{Context, Poll};

use crate::worker::AnswerBody;
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;

use super::body::{Contents, FileBody, Payload};

/// A body read whole (a plumber worker's answer) as the client receives it.
impl From<Payload> for ReplyBody {
    fn from(payload: Payload) -> ReplyBody {
        match payload.into_contents() {
            Contents::Empty => ReplyBody::Empty,
            Contents::Memory(bytes) => ReplyBody::Full(Full::new(bytes)),
            Contents::File(file) => ReplyBody::File(file),
        }
    }
}

/// What valve sends back to a client.
pub enum ReplyBody {
    Empty,
    Full(Full<Bytes>),
    /// An answer valve holds in a spool file (read whole from a worker).
    File(FileBody),
    /// A Shiny worker's answer, streamed (a download may be long).
    Stream(AnswerBody),
    /// Written by a task of valve's own as it goes (an app's log, followed);
    /// the channel is bounded, and the task ends when the client leaves.
    Live(tokio::sync::mpsc::Receiver<Bytes>),
}

impl ReplyBody {
    pub fn text(text: impl Into<Bytes>) -> Self {
        ReplyBody::Full(Full::new(text.into()))
    }
}

impl Body for ReplyBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        // Every variant is Unpin, so plain `&mut` access is fine.
        match self.get_mut() {
            ReplyBody::Empty => Poll::Ready(None),
            ReplyBody::Full(full) => Pin::new(full).poll_frame(cx).map_err(|never| match never {}),
            ReplyBody::File(file) => Pin::new(file).poll_frame(cx).map_err(Into::into),
            ReplyBody::Stream(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
            ReplyBody::Live(rx) => rx.poll_recv(cx).map(|chunk| chunk.map(|c| Ok(Frame::data(c)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ReplyBody::Empty => true,
            ReplyBody::Full(full) => full.is_end_stream(),
            ReplyBody::File(file) => file.is_end_stream(),
            ReplyBody::Stream(body) => body.is_end_stream(),
            ReplyBody::Live(_) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ReplyBody::Empty => SizeHint::with_exact(0),
            ReplyBody::Full(full) => full.size_hint(),
            ReplyBody::File(file) => file.size_hint(),
            ReplyBody::Stream(body) => body.size_hint(),
            ReplyBody::Live(_) => SizeHint::default(),
        }
    }
}

/// A short JSON error: `{"error": "...", "status": N}`.
pub fn error(status: StatusCode, message: &str) -> Response<ReplyBody> {
    let text = format!("{}\n", serde_json::json!({ "error": message, "status": status.as_u16() }));
    let mut resp = Response::new(ReplyBody::text(text));
    *resp.status_mut() = status;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// A plain answer of valve's own (admin pages).
pub fn text(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<ReplyBody> {
    let mut resp = Response::new(ReplyBody::text(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// A redirect to `location`.
pub fn redirect(location: &str) -> Response<ReplyBody> {
    let mut resp = Response::new(ReplyBody::Empty);
    *resp.status_mut() = StatusCode::TEMPORARY_REDIRECT;
    if let Ok(v) = HeaderValue::from_str(location) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    resp
}
