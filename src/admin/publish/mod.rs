//! Publishing: R users publish apps to valve the way hosted R taught them,
//! `rsconnect::deployApp()` (RStudio's Publish button) or the R package's
//! `valve_deploy()`. The API lives on the admin listener (and, if asked,
//! on an address of its own), under `/__api__/`, behind API keys; the admin
//! listener alone also has valve's own `/__valve__/apps/` pages (versions,
//! activate, access) that the `valve` subcommands use.
//!
//! Its rooms: `api` (the HTTP calls clients make, both the ones rsconnect
//! 0.8 makes and the `v1` ones of rsconnect 1.x), `pages` (valve's own app
//! pages, the status and metrics lines), `store` (writes to `publish_dir`),
//! `unpack` (a bundle unpacked safely), `deploy` (a deployment, which is a
//! reload), `tasks` (the deployment logs clients follow), `cli` (the
//! subcommands' client).

mod api;
pub mod cli;
mod deploy;
mod pages;
mod store;
mod tasks;
mod unpack;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::config::publish::{read_keys, PublishKeys, Publishing};
use crate::http::reply::{error, text, ReplyBody};
use crate::reload::Reloader;
use store::Fail;
use tasks::Tasks;

/// The largest JSON body a publishing call takes.
const MAX_JSON: usize = 1 << 20;

/// The publishing API and what it keeps in memory (tasks, a summary of the
/// published apps for the status page and metrics); `publish_dir` holds the rest.
pub struct Publisher {
    settings: Publishing,
    keys: Mutex<(Option<SystemTime>, PublishKeys)>,
    tasks: Tasks,
    reloader: Arc<Reloader>,
    run_dir: Arc<tempfile::TempDir>,
    /// Where clients reach valve's apps: host and port (R's workers are told).
    public: (String, u16),
    /// The apps' base URL, for what clients print.
    base_url: String,
    /// One read-modify-write of records at a time.
    records: Mutex<()>,
    /// One deployment at a time.
    deploying: tokio::sync::Mutex<()>,
    /// Each published app's active version, when and by which key.
    summary: Mutex<BTreeMap<String, Summary>>,
    /// Deployments by app and outcome (true: switched).
    deployments: Mutex<BTreeMap<(String, bool), u64>>,
}

/// What the status page and metrics say of a published app.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Summary {
    pub version: Option<u32>,
    pub versions: Vec<u32>,
    pub activated: Option<u64>,
    pub activated_by: Option<String>,
}

impl Publisher {
    /// `addr` is the main listener's: where the published apps are served.
    pub fn new(
        settings: Publishing,
        reloader: Arc<Reloader>,
        run_dir: Arc<tempfile::TempDir>,
        host: &str,
        addr: SocketAddr,
    ) -> Arc<Publisher> {
        let modified = std::fs::metadata(&settings.keys_file).and_then(|m| m.modified()).ok();
        let keys = settings.keys.clone();
        let p = Arc::new(Publisher {
            settings,
            keys: Mutex::new((modified, keys)),
            tasks: Tasks::default(),
            reloader,
            run_dir,
            public: (host.to_string(), addr.port()),
            base_url: crate::http::server::display_addr(addr),
            records: Mutex::new(()),
            deploying: tokio::sync::Mutex::new(()),
            summary: Mutex::new(BTreeMap::new()),
            deployments: Mutex::new(BTreeMap::new()),
        });
        p.refresh();
        p
    }

    /// Whether a path is publishing's: the API, or (on the admin listener)
    /// valve's own pages of published apps.
    pub fn wants(path: &str, admin: bool) -> bool {
        path == "/__api__" || path.starts_with("/__api__/") || (admin && path.starts_with(pages::PREFIX))
    }

    /// Answers a request for which `wants` holds. `admin`: it came to the
    /// admin listener (not `publish_addr`).
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>, admin: bool) -> Response<ReplyBody> {
        let path = req.uri().path().to_string();
        if admin && path.starts_with(pages::PREFIX) {
            return pages::handle(&self, req).await;
        }
        let method = req.method().clone();
        let Some((key, account)) = self.key_of(req.headers()) else {
            tracing::info!(target: "valve::publish", key = "-", method = %method, path = %path, status = 401,
                "publishing call refused: no key or an unknown key");
            return error(
                StatusCode::UNAUTHORIZED,
                "publishing needs an API key valve knows: send `Authorization: Key KEY` (rsconnect::connectApiUser(apiKey = KEY)); keys are made with `valve publish-key NAME`",
            );
        };
        let resp = api::handle(&self, req, &key, account).await;
        tracing::info!(target: "valve::publish", key = %key, method = %method, path = %path,
            status = resp.status().as_u16(), "publishing call");
        resp
    }

    /// The key's name and number from `Authorization: Key KEY`, reading the
    /// keys file again if it changed.
    fn key_of(&self, headers: &HeaderMap) -> Option<(String, usize)> {
        let presented = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
        let (scheme, key) = presented.trim().split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("key") {
            return None;
        }
        let key = key.trim();
        let mut cached = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let modified = std::fs::metadata(&self.settings.keys_file).and_then(|m| m.modified()).ok();
        if modified.is_some() && modified != cached.0 {
            match read_keys(&self.settings.keys_file) {
                Ok(keys) => {
                    tracing::info!(target: "valve::publish", keys = keys.len(), "publish_keys_file read again");
                    *cached = (modified, keys);
                }
                Err(e) => tracing::warn!(target: "valve::publish", error = %e,
                    "publish_keys_file changed but has problems: the keys read before stay"),
            }
        }
        let name = cached.1.name_of(key)?.to_string();
        let number = cached.1.names().position(|n| n == name).map_or(0, |i| i + 1);
        Some((name, number))
    }

    /// Runs `f` on the settings with the records lock held.
    fn locked<T>(&self, f: impl FnOnce(&Publishing) -> T) -> T {
        let _one = self.records.lock().unwrap_or_else(|p| p.into_inner());
        f(&self.settings)
    }

    /// The URL of published app `name`.
    fn app_url(&self, name: &str) -> String {
        format!("{}/{name}/", self.base_url)
    }

    fn counted(&self, app: &str, switched: bool) {
        *self.deployments.lock().unwrap_or_else(|p| p.into_inner()).entry((app.to_string(), switched)).or_default() +=
            1;
    }

    /// Reads the records again for the status page and metrics.
    fn refresh(&self) {
        let records = match self.locked(store::all) {
            Ok(r) => r,
            Err(f) => {
                tracing::warn!(target: "valve::publish", error = %f.message, "cannot read the published apps' records");
                return;
            }
        };
        let summary = records
            .iter()
            .map(|r| {
                let current = r.current();
                (
                    r.name.clone(),
                    Summary {
                        version: r.active,
                        versions: r.versions.iter().map(|v| v.version).collect(),
                        activated: current.and_then(|v| v.activated),
                        activated_by: current.and_then(|v| v.activated_by.clone()),
                    },
                )
            })
            .collect();
        *self.summary.lock().unwrap_or_else(|p| p.into_inner()) = summary;
    }

    /// What the status page says of app `name`, if it is a published one.
    pub fn status_of(&self, name: &str) -> Option<serde_json::Value> {
        let s = self.summary.lock().unwrap_or_else(|p| p.into_inner()).get(name).cloned()?;
        Some(serde_json::json!({
            "version": s.version,
            "versions": s.versions,
            "activated": s.activated.map(store::rfc3339),
            "activated_by": s.activated_by,
        }))
    }

    /// The published apps' metrics, in Prometheus' text format.
    pub fn metrics(&self) -> String {
        pages::metrics(
            &self.summary.lock().unwrap_or_else(|p| p.into_inner()),
            &self.deployments.lock().unwrap_or_else(|p| p.into_inner()),
        )
    }
}

/// A JSON answer.
fn json(status: StatusCode, value: serde_json::Value) -> Response<ReplyBody> {
    text(status, "application/json", value.to_string())
}

/// The answer to a call that could not be done.
fn failed(f: Fail) -> Response<ReplyBody> {
    error(f.status, &f.message)
}

/// A JSON body (an empty one is `{}`), at most `MAX_JSON` bytes.
async fn json_body(req: Request<Incoming>) -> Result<serde_json::Value, Fail> {
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
async fn save_body(req: Request<Incoming>, to: &Path, max: u64) -> Result<u64, Fail> {
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
