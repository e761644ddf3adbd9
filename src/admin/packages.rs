//! `/__valve__/packages` (GET: the package cache, each built package with
//! its size and the apps using it) and `/__valve__/packages/prune` (POST:
//! remove what no app folder uses), for `valve packages`.

use std::path::Path;

use http::header::{HeaderValue, ALLOW};
use http::{Method, Response, StatusCode};

use crate::http::reply::{error, text, ReplyBody};
use crate::restore::cache::Cache;
use crate::restore::manage;

pub(super) async fn answer(cache_dir: &Path, method: &Method, page: &str) -> Response<ReplyBody> {
    let json = |v: serde_json::Value| text(StatusCode::OK, "application/json", v.to_string());
    let cache = Cache { root: cache_dir.to_path_buf() };
    match (page, method) {
        ("/packages", &Method::GET) => {
            let rows = {
                let cache = cache.clone();
                tokio::task::spawn_blocking(move || manage::list(&cache)).await.unwrap_or_default()
            };
            let bytes: u64 = rows.iter().map(|r| r.bytes).sum();
            json(serde_json::json!({ "cache": cache_dir, "bytes": bytes, "packages": rows }))
        }
        ("/packages/prune", &Method::POST) => {
            let pruned = manage::prune(&cache).await;
            json(serde_json::json!({ "cache": cache_dir, "pruned": pruned }))
        }
        ("/packages", _) | ("/packages/prune", _) => {
            let allow = if page == "/packages" { "GET" } else { "POST" };
            let mut resp = error(StatusCode::METHOD_NOT_ALLOWED, &format!("{page} answers {allow} only"));
            resp.headers_mut().insert(ALLOW, HeaderValue::from_static(allow));
            resp
        }
        _ => error(
            StatusCode::NOT_FOUND,
            "no such packages path: GET /__valve__/packages lists the cache, POST /__valve__/packages/prune prunes it",
        ),
    }
}
