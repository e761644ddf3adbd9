//! What the publishing calls share: JSON answers and errors, and request
//! bodies read within their limits (a JSON body whole, a bundle to a file).

use std::path::Path;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use serde_json::Value;

use super::store::Fail;
use crate::http::reply::{error, text, ReplyBody};

/// The largest JSON body a publishing call takes.
const MAX_JSON: usize = 1 << 20;

/// A JSON answer.
pub(super) fn json(status: StatusCode, value: serde_json::Value) -> Response<ReplyBody> {
    text(status, "application/json", value.to_string())
}

/// The answer to a call that could not be done.
pub(super) fn failed(f: Fail) -> Response<ReplyBody> {
    error(f.status, &f.message)
}

/// A JSON body (an empty one is `{}`), at most `MAX_JSON` bytes.
pub(super) async fn json_body(req: Request<Incoming>) -> Result<serde_json::Value, Fail> {
    let body = http_body_util::Limited::new(req.into_body(), MAX_JSON)
        .collect()
        .await
        .map_err(|e| Fail::new(StatusCode::BAD_REQUEST, format!("cannot read the request's body: {e}")))?
        .to_bytes();
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(serde_json::json!({}));
    }
    serde_json::from_slice(&body).map_err(|e| Fail::new(StatusCode::BAD_REQUEST, format!("the body is not JSON: {e}")))
}

/// Writes a request's body to `to`, at most `max` bytes (413 past it).
pub(super) async fn save_body(req: Request<Incoming>, to: &Path, max: u64) -> Result<u64, Fail> {
    use tokio::io::AsyncWriteExt;
    let too_big = || {
        Fail::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the bundle is larger than {max} bytes (publish_max_size): leave data out of it, or raise publish_max_size"),
        )
    };
    let declared = req.headers().get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max) {
        return Err(too_big());
    }
    let mut file = tokio::fs::File::create(to).await.map_err(|e| Fail::io("cannot store the upload", e))?;
    let mut body = req.into_body();
    let mut written: u64 = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Fail::new(StatusCode::BAD_REQUEST, format!("the upload broke off: {e}")))?;
        if let Ok(data) = frame.into_data() {
            let data: Bytes = data;
            written += data.len() as u64;
            if written > max {
                return Err(too_big());
            }
            file.write_all(&data).await.map_err(|e| Fail::io("cannot store the upload", e))?;
        }
    }
    file.flush().await.map_err(|e| Fail::io("cannot store the upload", e))?;
    Ok(written)
}

/// Allow lists: users, groups (`None`: that list unset).
pub(super) type Lists = (Option<Vec<String>>, Option<Vec<String>>);

/// valve's `allow_users` and `allow_groups` in a body: lists of names, or
/// null (that list unset); absent: `None`.
pub(super) fn lists(body: &Value) -> Result<Lists, Fail> {
    let list = |key: &str| -> Result<Option<Vec<String>>, Fail> {
        match &body[key] {
            Value::Null => Ok(None),
            Value::Array(items) => items
                .iter()
                .map(|i| i.as_str().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()))
                .collect::<Option<Vec<String>>>()
                .map(Some)
                .ok_or_else(|| Fail::new(StatusCode::BAD_REQUEST, format!("{key} must be a list of names"))),
            _ => Err(Fail::new(StatusCode::BAD_REQUEST, format!("{key} must be a list of names, such as [\"alice\"]"))),
        }
    };
    Ok((list("allow_users")?, list("allow_groups")?))
}
