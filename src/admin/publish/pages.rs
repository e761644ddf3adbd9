//! valve's own pages of published apps, on the admin listener only, which
//! the `valve versions`, `activate` and `access` subcommands use. The admin
//! pages have decided who calls (`admin::auth`): an operator acts on every
//! published app, a publishing key on its own.

use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::json as j;

use super::deploy;
use super::publisher::Publisher;
use super::store::{self, rfc3339, Fail};
use super::wire::{failed, json, json_body, lists};
use crate::admin::auth::Who;
use crate::http::reply::ReplyBody;

/// Where these pages live.
pub const PREFIX: &str = super::publisher::PAGES;

/// The key name deployments started here are recorded under.
pub const ADMIN: &str = "admin";

pub(crate) async fn handle(p: &Arc<Publisher>, req: Request<Incoming>, who: &Who) -> Response<ReplyBody> {
    let rest = req.uri().path().trim_start_matches(PREFIX).trim_end_matches('/').to_string();
    let parts: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    let method = req.method().clone();
    let result = match (&method, parts.as_slice()) {
        (&Method::GET, []) => apps(p, who),
        (_, [name, ..]) if !owned(p, name, who) => Err(Fail::new(
            StatusCode::FORBIDDEN,
            format!("the published app {name:?} is not {}'s: only its owner's key or an operator may see or change it", who.label()),
        )),
        (&Method::GET, [name] | [name, "versions"]) => versions(p, name),
        (&Method::POST, [name, "activate"]) => activate(p, req, name, who).await,
        (&Method::POST, [name, "access"]) => access(p, req, name).await,
        _ => Err(Fail::new(
            StatusCode::NOT_FOUND,
            "valve's published-app pages: GET /__valve__/published/, GET /__valve__/published/NAME/versions, POST /__valve__/published/NAME/activate {\"version\": N}, POST /__valve__/published/NAME/access {\"allow_users\": [...], \"allow_groups\": [...]}",
        )),
    };
    let resp = result.unwrap_or_else(failed);
    tracing::info!(target: "valve::publish", key = %who.label(), method = %method, path = %req_path(&rest),
        status = resp.status().as_u16(), "publishing call");
    resp
}

/// Whether `who` may see and change published app `name` (one that does
/// not exist is said to be missing by the call itself, to an operator).
fn owned(p: &Publisher, name: &str, who: &Who) -> bool {
    who.is_operator() || p.locked(|s| store::by_name(s, name)).is_ok_and(|r| who.owns(r.owner.as_deref()))
}

fn req_path(rest: &str) -> String {
    format!("{PREFIX}{rest}")
}

fn apps(p: &Publisher, who: &Who) -> Result<Response<ReplyBody>, Fail> {
    let list: Vec<serde_json::Value> = p
        .locked(store::all)?
        .iter()
        .filter(|r| who.owns(r.owner.as_deref()))
        .map(|r| {
            j!({ "name": r.name, "url": p.app_url(&r.name), "active": r.active,
                      "versions": r.versions.iter().map(|v| v.version).collect::<Vec<_>>() })
        })
        .collect();
    Ok(json(StatusCode::OK, j!({ "apps": list })))
}

fn versions(p: &Publisher, name: &str) -> Result<Response<ReplyBody>, Fail> {
    let r = p.locked(|s| store::by_name(s, name))?;
    let versions: Vec<serde_json::Value> = r
        .versions
        .iter()
        .map(|v| {
            j!({
                "version": v.version,
                "active": r.active == Some(v.version),
                "uploaded": rfc3339(v.uploaded),
                "uploaded_by": v.uploaded_by,
                "appmode": v.appmode,
                "kind": v.kind,
                "files": v.files,
                "bytes": v.bytes,
                "packages": v.packages.len(),
                "activated": v.activated.map(rfc3339),
                "activated_by": v.activated_by,
            })
        })
        .collect();
    Ok(json(
        StatusCode::OK,
        j!({ "app": r.name, "url": p.app_url(&r.name), "active": r.active, "keep": p.settings.keep,
             "allow_users": r.allow_users, "allow_groups": r.allow_groups, "versions": versions }),
    ))
}

/// Activates a kept version: a deployment (packages checked, a reload), waited for.
async fn activate(
    p: &Arc<Publisher>,
    req: Request<Incoming>,
    name: &str,
    who: &Who,
) -> Result<Response<ReplyBody>, Fail> {
    let record = p.locked(|s| store::by_name(s, name))?;
    let body = json_body(req).await?;
    let version = body["version"].as_u64().map(|n| n as u32).ok_or_else(|| {
        Fail::new(StatusCode::BAD_REQUEST, "send {\"version\": N}, N one of the app's versions (GET .../versions)")
    })?;
    if record.version(version).is_none() {
        return Err(Fail::new(
            StatusCode::NOT_FOUND,
            format!(
                "{name} has no version {version} (kept: {:?})",
                record.versions.iter().map(|v| v.version).collect::<Vec<_>>()
            ),
        ));
    }
    let task = p.tasks.start(name);
    let by = match who {
        Who::Publisher(key) => key.clone(),
        Who::Operator(_) => ADMIN.to_string(),
    };
    deploy::run(p.clone(), task.clone(), name.to_string(), version, by).await;
    let page = task.page(0, std::time::Duration::ZERO).await;
    let status = if page.code == 0 { StatusCode::OK } else { StatusCode::CONFLICT };
    Ok(json(
        status,
        j!({ "app": name, "version": version, "activated": page.code == 0, "error": page.error, "log": page.lines }),
    ))
}

/// Sets who may use the app: applies from the next request on (a reload).
async fn access(p: &Arc<Publisher>, req: Request<Incoming>, name: &str) -> Result<Response<ReplyBody>, Fail> {
    p.locked(|s| store::by_name(s, name))?;
    let body = json_body(req).await?;
    let (users, groups) = lists(&body)?;
    let record = p.writing(|s| store::set_access(s, name, users, groups))?;
    let applied = p.reloader.reload().await;
    Ok(json(
        StatusCode::OK,
        j!({ "app": name, "allow_users": record.allow_users, "allow_groups": record.allow_groups,
             "applied": applied.is_ok(),
             "note": applied.err().map(|e| format!("saved; the configuration has problems, so it applies at the next good reload: {e}")) }),
    ))
}
