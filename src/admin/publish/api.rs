//! The publishing API's calls under `/__api__/`, in the two shapes clients
//! speak: the one rsconnect 0.8 uses (`/users/current`, `/applications`,
//! `/applications/{id}/upload` and `/deploy`, `/tasks/{id}?first_status=`)
//! and the `v1` one of rsconnect 1.x and `valve_deploy()` (`/v1/content`,
//! `/v1/content/{guid}/bundles` and `/deploy`, `/v1/tasks/{id}?first=&wait=`).
//! Both act on the same records. Any key may look apps up (rsconnect finds
//! an app by its name before it uploads); only the app's owner (the key
//! that created it) or an admin key may change it or read its tasks.

use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::{json as j, Value};

use super::deploy;
use super::publisher::{may_change, Caller, Publisher};
use super::store::{self, rfc3339, Fail};
use super::unpack::Modes;
use super::wire::{failed, json, json_body, lists, save_body};
use crate::config::publish::{clash, clash_reason, AppRecord};
use crate::config::AppConfig;
use crate::http::reply::ReplyBody;

/// Which shape of the API a call is in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// rsconnect 0.8's calls.
    Classic,
    /// `/v1/`.
    V1,
}

pub(super) async fn handle(p: &Arc<Publisher>, req: Request<Incoming>, caller: &Caller) -> Response<ReplyBody> {
    let path = req.uri().path().trim_start_matches("/__api__").trim_matches('/').to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let method = req.method().clone();
    let parts: Vec<&str> = path.split('/').collect();
    use Shape::{Classic, V1};
    let result = match (&method, parts.as_slice()) {
        (&Method::GET, ["users", "current"] | ["v1", "user"]) => Ok(json(StatusCode::OK, user(caller))),
        (&Method::GET, ["server_settings"] | ["v1", "server_settings"] | ["server_settings", "r"]) => {
            Ok(json(StatusCode::OK, j!({ "version": env!("CARGO_PKG_VERSION"), "product": "valve" })))
        }
        (&Method::GET, ["applications"]) => list(p, &query, Classic),
        (&Method::GET, ["v1", "content"]) => list(p, &query, V1),
        (&Method::POST, ["applications"]) => create(p, req, &caller.name, Classic).await,
        (&Method::POST, ["v1", "content"]) => create(p, req, &caller.name, V1).await,
        (&Method::GET, ["applications", id]) => one(p, id, Classic),
        (&Method::GET, ["v1", "content", id]) => one(p, id, V1),
        (&Method::PATCH, ["v1", "content", id]) => access(p, req, id, caller).await,
        (&Method::GET, ["applications", id, "config"]) => config(p, id),
        (&Method::GET, ["v1", "content", id, "bundles"]) => bundles(p, id),
        (&Method::POST, ["applications", id, "upload"]) => upload(p, req, id, caller, Classic).await,
        (&Method::POST, ["v1", "content", id, "bundles"]) => upload(p, req, id, caller, V1).await,
        (&Method::POST, ["applications", id, "deploy"]) => start_deploy(p, req, id, caller, Classic).await,
        (&Method::POST, ["v1", "content", id, "deploy"]) => start_deploy(p, req, id, caller, V1).await,
        (&Method::GET, ["tasks", id]) => task(p, id, &query, caller, Classic).await,
        (&Method::GET, ["v1", "tasks", id]) => task(p, id, &query, caller, V1).await,
        _ => Err(Fail::new(
            StatusCode::NOT_FOUND,
            format!(
                "no publishing call {method} /__api__/{path}: see docs/src/publishing.md for the calls valve answers"
            ),
        )),
    };
    result.unwrap_or_else(failed)
}

/// The key as a user: its name is the user name, its place in the file the id.
fn user(caller: &Caller) -> Value {
    let (key, account) = (&caller.name, caller.number);
    j!({
        "id": account,
        "guid": format!("00000000-0000-0000-0000-{account:012}"),
        "username": key,
        "first_name": key,
        "last_name": "",
        "email": "",
        "user_role": "publisher",
        "active_time": null,
        "locked": false,
    })
}

/// The query's `name=value` pairs, percent-decoded.
fn pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|s| !s.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// An app as a client reads it.
fn app_json(p: &Publisher, r: &AppRecord, shape: Shape) -> Value {
    let url = p.app_url(&r.name);
    let current = r.current();
    let appmode = current.map(|v| v.appmode.clone()).unwrap_or_else(|| "unknown".into());
    let deployed = current.and_then(|v| v.activated).map(rfc3339);
    match shape {
        Shape::Classic => j!({
            "id": r.id,
            "guid": r.guid,
            "name": r.name,
            "title": r.title,
            "url": url,
            "app_mode": appmode,
            "created_time": rfc3339(r.created),
            "last_deployed_time": deployed,
            "bundle_id": r.active,
        }),
        Shape::V1 => j!({
            "guid": r.guid,
            "id": r.id.to_string(),
            "name": r.name,
            "title": r.title,
            "description": "",
            "app_mode": appmode,
            "content_url": url,
            "dashboard_url": url,
            "created_time": rfc3339(r.created),
            "last_deployed_time": deployed,
            "bundle_id": r.active.map(|n| n.to_string()),
            "owner_guid": null,
            "owner": r.owner,
            "allow_users": r.allow_users,
            "allow_groups": r.allow_groups,
        }),
    }
}

/// `GET /applications?filter=name:N&count=&offset=` (`count` is this
/// page's length, `total` all that match: clients page with them) and
/// `GET /v1/content?name=N`.
fn list(p: &Publisher, query: &str, shape: Shape) -> Result<Response<ReplyBody>, Fail> {
    let q = pairs(query);
    let name = q.iter().find_map(|(k, v)| match (shape, k.as_str()) {
        (Shape::Classic, "filter") => v.strip_prefix("name:").map(str::to_string),
        (Shape::V1, "name") => Some(v.clone()),
        _ => None,
    });
    let records: Vec<AppRecord> =
        p.locked(store::all)?.into_iter().filter(|r| name.as_ref().is_none_or(|n| *n == r.name)).collect();
    if shape == Shape::V1 {
        let list: Vec<Value> = records.iter().map(|r| app_json(p, r, shape)).collect();
        return Ok(json(StatusCode::OK, Value::Array(list)));
    }
    let number =
        |k: &str, default: usize| q.iter().find(|(n, _)| n == k).and_then(|(_, v)| v.parse().ok()).unwrap_or(default);
    let (offset, count) = (number("offset", 0), number("count", 100).clamp(1, 1000));
    let page: Vec<Value> = records.iter().skip(offset).take(count).map(|r| app_json(p, r, shape)).collect();
    Ok(json(StatusCode::OK, j!({ "applications": page, "count": page.len(), "total": records.len() })))
}

/// `POST /applications` and `POST /v1/content`: `{name, title}` (and
/// valve's own `allow_users`, `allow_groups`).
async fn create(
    p: &Arc<Publisher>,
    req: Request<Incoming>,
    key: &str,
    shape: Shape,
) -> Result<Response<ReplyBody>, Fail> {
    let body = json_body(req).await?;
    let name = body["name"].as_str().unwrap_or("").to_string();
    let title = body["title"].as_str().unwrap_or("").to_string();
    let published: Vec<String> = p.locked(store::all)?.into_iter().map(|r| r.name).collect();
    let configured = p.reloader.apps.configs();
    let configured: Vec<AppConfig> = configured.into_iter().filter(|a| !published.contains(&a.name)).collect();
    let taken = |name: &str| clash(name, &configured).map(|with| clash_reason(name, with));
    // A name given a uid before (published and removed, or a configured app
    // gone): its uid stays with the files it owned, and the new app gets a
    // fresh one, and so an empty home.
    let uids = crate::config::UidStore::of_site(&p.reloader.started().server.state_dir, Some(&p.settings.dir), true);
    let mut record = p.writing(|s| {
        let record = store::create(s, &name, &title, key, taken)?;
        match uids.retire(&name) {
            Ok(Some(uid)) => tracing::info!(target: "valve::publish", key, app = %name, old_uid = uid,
                "a name that had a uid is published anew: its old uid is retired, the new app gets a fresh uid and an empty home"),
            Ok(None) => {}
            Err(e) => {
                let _ = std::fs::remove_dir_all(crate::config::publish::app_dir(&s.dir, &name));
                return Err(Fail::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("cannot retire the uid {name:?} had before, so it was not created: {e}"),
                ));
            }
        }
        Ok(record)
    })?;
    if p.modes == Modes::Group {
        let dir = crate::config::publish::app_dir(&p.settings.dir, &name);
        store::unlisted(&dir).map_err(|e| Fail::io(&format!("cannot make {} unlisted", dir.display()), e))?;
    }
    let (users, groups) = lists(&body)?;
    if users.is_some() || groups.is_some() {
        record = p.writing(|s| store::set_access(s, &name, users, groups))?;
    }
    tracing::info!(target: "valve::publish", key, app = %name, "app created");
    p.refresh();
    let status = if shape == Shape::V1 { StatusCode::CREATED } else { StatusCode::OK };
    Ok(json(status, app_json(p, &record, shape)))
}

/// `PATCH /v1/content/{guid}` with `allow_users` and `allow_groups`:
/// who may use the app, from the next request on (a reload, no new workers).
async fn access(
    p: &Arc<Publisher>,
    req: Request<Incoming>,
    id: &str,
    caller: &Caller,
) -> Result<Response<ReplyBody>, Fail> {
    let record = p.locked(|s| store::by_id(s, id))?;
    may_change(caller, &record)?;
    let body = json_body(req).await?;
    let (users, groups) = lists(&body)?;
    let record = p.writing(|s| store::set_access(s, &record.name, users, groups))?;
    p.reloader.reload().await.map_err(|e| {
        Fail::new(
            StatusCode::CONFLICT,
            format!("saved, but the configuration has problems, so it applies at the next reload: {e}"),
        )
    })?;
    Ok(json(StatusCode::OK, app_json(p, &record, Shape::V1)))
}

fn one(p: &Publisher, id: &str, shape: Shape) -> Result<Response<ReplyBody>, Fail> {
    let record = p.locked(|s| store::by_id(s, id))?;
    Ok(json(StatusCode::OK, app_json(p, &record, shape)))
}

/// `GET /applications/{id}/config`: where the app is.
fn config(p: &Publisher, id: &str) -> Result<Response<ReplyBody>, Fail> {
    let record = p.locked(|s| store::by_id(s, id))?;
    Ok(json(StatusCode::OK, j!({ "config_url": p.app_url(&record.name), "logs_url": "" })))
}

fn bundle_json(r: &AppRecord, v: &crate::config::publish::VersionRecord, shape: Shape) -> Value {
    match shape {
        Shape::Classic => j!({ "id": v.version, "app_id": r.id, "created_time": rfc3339(v.uploaded), "size": v.bytes }),
        Shape::V1 => j!({
            "id": v.version.to_string(),
            "content_guid": r.guid,
            "created_time": rfc3339(v.uploaded),
            "size": v.bytes,
            "active": r.active == Some(v.version),
            "metadata": { "appmode": v.appmode, "kind": v.kind, "files": v.files, "uploaded_by": v.uploaded_by },
        }),
    }
}

/// `GET /v1/content/{guid}/bundles`: the versions kept.
fn bundles(p: &Publisher, id: &str) -> Result<Response<ReplyBody>, Fail> {
    let record = p.locked(|s| store::by_id(s, id))?;
    let list: Vec<Value> = record.versions.iter().map(|v| bundle_json(&record, v, Shape::V1)).collect();
    Ok(json(StatusCode::OK, Value::Array(list)))
}

/// `POST /applications/{id}/upload` and `POST /v1/content/{guid}/bundles`:
/// the body is the bundle, unpacked and checked now as the next version.
async fn upload(
    p: &Arc<Publisher>,
    req: Request<Incoming>,
    id: &str,
    caller: &Caller,
    shape: Shape,
) -> Result<Response<ReplyBody>, Fail> {
    let record = p.locked(|s| store::by_id(s, id))?;
    may_change(caller, &record)?;
    let key = caller.name.as_str();
    let uploads = p.settings.dir.join(".uploads");
    std::fs::create_dir_all(&uploads).map_err(|e| Fail::io("cannot store the upload", e))?;
    let tmp = tempfile::Builder::new()
        .prefix(&format!("{}-", record.name))
        .suffix(".tar.gz")
        .tempfile_in(&uploads)
        .map_err(|e| Fail::io("cannot store the upload", e))?
        .into_temp_path();
    let size = save_body(req, &tmp, p.settings.max_size).await?;
    let n = p.writing(|s| store::next_version(s, &record.name))?;
    let (settings, name, key_name, path, modes) =
        (p.settings.clone(), record.name.clone(), key.to_string(), tmp.to_path_buf(), p.modes);
    let packages = &p.reloader.started().server.packages;
    let repos = crate::restore::plan::Repositories {
        mapped: packages.repositories.clone(),
        only_mapped: packages.repositories_only,
    };
    let unpacked = tokio::task::spawn_blocking(move || {
        store::unpack_version(&settings, &name, n, &path, &key_name, modes, &repos)
    })
    .await
    .map_err(|e| Fail::new(StatusCode::INTERNAL_SERVER_ERROR, format!("the unpacking stopped: {e}")))?;
    drop(tmp);
    let version = match unpacked {
        Ok(v) => v,
        Err(f) => {
            tracing::warn!(target: "valve::publish", key, app = %record.name, version = n, why = %f.message, "bundle refused");
            return Err(f);
        }
    };
    tracing::info!(target: "valve::publish", key, app = %record.name, version = n, bytes = size,
        files = version.files, kind = %version.kind, "bundle unpacked and checked");
    p.writing(|s| store::add_version(s, &record.name, version.clone()))?;
    // Uploads never deployed count against publish_keep too.
    let pruner = p.clone();
    let _ = tokio::task::spawn_blocking(move || pruner.prune_all()).await;
    let record = p.locked(|s| store::by_id(s, id))?;
    Ok(json(StatusCode::OK, bundle_json(&record, &version, shape)))
}

/// `POST /applications/{id}/deploy {bundle}` and `POST
/// /v1/content/{guid}/deploy {bundle_id}` (none: the latest bundle): starts
/// the deployment and answers its task's id.
async fn start_deploy(
    p: &Arc<Publisher>,
    req: Request<Incoming>,
    id: &str,
    caller: &Caller,
    shape: Shape,
) -> Result<Response<ReplyBody>, Fail> {
    let record = p.locked(|s| store::by_id(s, id))?;
    may_change(caller, &record)?;
    let body = json_body(req).await?;
    let field = if shape == Shape::Classic { "bundle" } else { "bundle_id" };
    let asked = match &body[field] {
        Value::Null => None,
        Value::Number(n) => n.as_u64().map(|n| n as u32),
        Value::String(s) => s.parse().ok(),
        _ => None,
    };
    let version = asked.or(record.versions.last().map(|v| v.version)).ok_or_else(|| {
        Fail::new(StatusCode::NOT_FOUND, format!("{} has no bundle yet: upload one first", record.name))
    })?;
    if record.version(version).is_none() {
        return Err(Fail::new(
            StatusCode::NOT_FOUND,
            format!(
                "{} has no bundle {version} (kept: {:?})",
                record.name,
                record.versions.iter().map(|v| v.version).collect::<Vec<_>>()
            ),
        ));
    }
    let task = p.tasks.start(&record.name);
    tokio::spawn(deploy::run(p.clone(), task.clone(), record.name.clone(), version, caller.name.clone()));
    let status = if shape == Shape::V1 { StatusCode::ACCEPTED } else { StatusCode::OK };
    Ok(json(status, j!({ "task_id": task.id.to_string() })))
}

/// `GET /tasks/{id}?first_status=N` and `GET /v1/tasks/{id}?first=N&wait=S`
/// (the app's owner or an admin key: a deployment's log is the app's).
async fn task(
    p: &Publisher,
    id: &str,
    query: &str,
    caller: &Caller,
    shape: Shape,
) -> Result<Response<ReplyBody>, Fail> {
    // This valve's task, or one another valve sharing publish_dir runs or ran.
    let number: Option<u64> = id.parse().ok();
    let local = number.and_then(|n| p.tasks.get(n));
    let app = local.as_ref().map(|t| t.app.clone()).or_else(|| number.and_then(|n| p.tasks.shared_app(n)));
    let app = app.ok_or_else(|| {
        Fail::new(
            StatusCode::NOT_FOUND,
            format!("no task {id:?} (valve keeps the last {} tasks)", super::tasks::MAX_TASKS),
        )
    })?;
    if !caller.admin {
        let record = p.locked(|s| store::by_name(s, &app))?;
        may_change(caller, &record)?;
    }
    let q = pairs(query);
    let get = |k: &str| q.iter().find(|(n, _)| n == k).and_then(|(_, v)| v.parse::<f64>().ok());
    let (first, wait) = match shape {
        Shape::Classic => (get("first_status").unwrap_or(0.0), 0.0),
        Shape::V1 => (get("first").unwrap_or(0.0), get("wait").unwrap_or(0.0)),
    };
    let (first, wait) = (first.max(0.0) as usize, Duration::from_secs_f64(wait.clamp(0.0, 30.0)));
    let page = match (local, number) {
        (Some(task), _) => Some(task.page(first, wait).await),
        (None, Some(n)) => {
            let lease = crate::config::publish::app_dir(&p.settings.dir, &app).join(super::deploy::DEPLOY_LOCK);
            p.tasks.shared_page(n, first, wait, &lease).await
        }
        (None, None) => None,
    };
    let page =
        page.ok_or_else(|| Fail::new(StatusCode::NOT_FOUND, format!("task {id:?} was removed while it was read")))?;
    Ok(json(
        StatusCode::OK,
        match shape {
            Shape::Classic => j!({
                "id": id, "status": page.lines, "finished": page.finished, "code": page.code,
                "error": page.error, "last_status": page.last,
            }),
            Shape::V1 => j!({
                "id": id, "output": page.lines, "result": null, "finished": page.finished, "code": page.code,
                "error": page.error, "last": page.last,
            }),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_split_and_decoded() {
        assert_eq!(
            pairs("filter=account_id:1&filter=name%3Amy-api&count=100&offset=0"),
            [
                ("filter".to_string(), "account_id:1".to_string()),
                ("filter".to_string(), "name:my-api".to_string()),
                ("count".to_string(), "100".to_string()),
                ("offset".to_string(), "0".to_string()),
            ]
        );
        assert_eq!(decode("a%2"), "a%2");
        assert_eq!(decode("%zz"), "%zz");
        assert_eq!(decode("a+b%20c"), "a b c");
    }
}
