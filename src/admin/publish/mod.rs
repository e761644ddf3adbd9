//! Publishing: R users publish apps to valve the way hosted R taught them,
//! `rsconnect::deployApp()` (RStudio's Publish button) or the R package's
//! `valve_deploy()`. The API lives on the admin listener (and, if asked,
//! on an address of its own), under `/__api__/`, behind API keys; the admin
//! listener alone also has valve's own `/__valve__/published/` pages (versions,
//! activate, access) that the `valve` subcommands use.
//!
//! Its rooms, from the bottom: `unpack` (a bundle unpacked safely), `lease`
//! (a lock the valves sharing `publish_dir` agree on), `store` (writes to
//! `publish_dir`), `tasks` (the deployment logs clients follow, shared),
//! `wire` (bodies and JSON answers), `publisher` (the state: settings, keys,
//! locks, the summary behind the status page and metrics), `deploy` (a
//! deployment, which is a reload), `api` (the HTTP calls clients make, both
//! the ones rsconnect 0.8 makes and the `v1` ones of rsconnect 1.x),
//! `pages` (valve's own pages of published apps), `watch` (what other
//! valves sharing `publish_dir` deployed, served here too), and apart
//! `cli` (the subcommands' client).

mod api;
pub mod cli;
mod deploy;
mod lease;
mod pages;
mod publisher;
mod store;
mod tasks;
mod unpack;
mod watch;
mod wire;

use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;

#[cfg(test)]
pub(crate) use publisher::metrics as published_metrics;
pub use publisher::PAGES;
pub use publisher::{Publisher, Summary};

use crate::http::reply::{error, ReplyBody};

impl Publisher {
    /// Whether a path is publishing's: the API, or (on the admin listener)
    /// valve's own pages of published apps.
    pub fn wants(path: &str, _admin: bool) -> bool {
        path == "/__api__" || path.starts_with("/__api__/")
    }

    /// valve's own pages of published apps (`/__valve__/published/`), for
    /// a caller the admin pages know.
    pub async fn pages(self: Arc<Self>, req: Request<Incoming>, who: &crate::admin::auth::Who) -> Response<ReplyBody> {
        pages::handle(&self, req, who).await
    }

    /// Answers a request for which `wants` holds (the publishing API, behind its keys).
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>, _admin: bool) -> Response<ReplyBody> {
        let path = req.uri().path().to_string();
        let method = req.method().clone();
        let Some(caller) = self.key_of(req.headers()) else {
            tracing::info!(target: "valve::publish", key = "-", method = %method, path = %path, status = 401,
                "publishing call refused: no key or an unknown key");
            return error(
                StatusCode::UNAUTHORIZED,
                "publishing needs an API key valve knows: send `Authorization: Key KEY` (rsconnect::connectApiUser(apiKey = KEY)); keys are made with `valve publish-key NAME`",
            );
        };
        let resp = api::handle(&self, req, &caller).await;
        tracing::info!(target: "valve::publish", key = %caller.name, method = %method, path = %path,
            status = resp.status().as_u16(), "publishing call");
        resp
    }
}
