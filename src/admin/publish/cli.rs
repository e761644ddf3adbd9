//! The client of `valve versions`, `valve activate`, `valve access` and
//! `valve packages`:
//! one call to valve's admin address, its answer as text for people. Errors
//! are what went wrong, for `main` to print and exit on.

use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// The longest a call may take (an activation waits for the new version's workers).
const LIMIT: Duration = Duration::from_secs(600);

/// Where valve's admin pages are and the operator token they take.
pub struct AdminAt {
    pub url: String,
    pub token: String,
}

impl AdminAt {
    /// The admin address `url`, with the operator token in `token_file`: the
    /// error names the file and what to do.
    pub fn new(url: String, token_file: &std::path::Path) -> Result<AdminAt, String> {
        let token = std::fs::read_to_string(token_file).map_err(|e| {
            format!(
                "cannot read valve's operator token {}: {e} (run this as valve's user or root, with the --state-dir or --admin-token-file valve runs with)",
                token_file.display()
            )
        })?;
        Ok(AdminAt { url, token: token.trim().to_string() })
    }
}

/// `valve versions APP`: the versions kept, the active one marked.
pub async fn versions(admin: &AdminAt, app: &str) -> Result<String, String> {
    let v = call(admin, http::Method::GET, &format!("/__valve__/published/{app}/versions"), None).await?;
    let mut out = format!(
        "{} at {} (keeps {} versions{})\n",
        v["app"].as_str().unwrap_or(app),
        v["url"].as_str().unwrap_or(""),
        v["keep"],
        match (&v["allow_users"], &v["allow_groups"]) {
            (Value::Null, Value::Null) => "; open to everyone".to_string(),
            (u, g) => format!("; allow_users {u}, allow_groups {g}"),
        }
    );
    out.push_str("  version  uploaded              by            kind               activated             by\n");
    for x in v["versions"].as_array().into_iter().flatten() {
        let s = |k: &str| x[k].as_str().unwrap_or("-").to_string();
        out.push_str(&format!(
            "{} {:<8} {:<21} {:<13} {:<18} {:<21} {}\n",
            if x["active"] == true { "*" } else { " " },
            x["version"].to_string(),
            s("uploaded"),
            s("uploaded_by"),
            s("kind"),
            s("activated"),
            s("activated_by"),
        ));
    }
    Ok(out)
}

/// `valve activate APP N`: the deployment's log, then what it did.
pub async fn activate(admin: &AdminAt, app: &str, version: u32) -> Result<String, String> {
    let body = serde_json::json!({ "version": version });
    let (status, v) =
        call_raw(admin, http::Method::POST, &format!("/__valve__/published/{app}/activate"), Some(body)).await?;
    let log: Vec<String> =
        v["log"].as_array().into_iter().flatten().filter_map(|l| l.as_str()).map(|l| format!("  {l}\n")).collect();
    if status == 200 && v["activated"] == true {
        Ok(format!("{}{app}: version {version} serves\n", log.concat()))
    } else {
        let why = v["error"].as_str().filter(|e| !e.is_empty()).unwrap_or("the activation failed");
        Err(format!("{}{app}: version {version} was not activated: {why}", log.concat()))
    }
}

/// `valve access APP --users ... --groups ... | --open`.
pub async fn access(
    admin: &AdminAt,
    app: &str,
    users: Option<Vec<String>>,
    groups: Option<Vec<String>>,
) -> Result<String, String> {
    let body = serde_json::json!({ "allow_users": users, "allow_groups": groups });
    let v = call(admin, http::Method::POST, &format!("/__valve__/published/{app}/access"), Some(body)).await?;
    let mut out = match (&v["allow_users"], &v["allow_groups"]) {
        (Value::Null, Value::Null) => format!("{app}: open to everyone\n"),
        (u, g) => format!("{app}: allow_users {u}, allow_groups {g}\n"),
    };
    if let Some(note) = v["note"].as_str() {
        out.push_str(note);
        out.push('\n');
    }
    Ok(out)
}

/// `valve packages [--prune]`: the package cache, or what a prune removed.
pub async fn packages(admin: &AdminAt, prune: bool) -> Result<String, String> {
    let mb = |b: &Value| format!("{:.1} MB", b.as_f64().unwrap_or(0.0) / 1e6);
    if prune {
        let v = call(admin, http::Method::POST, "/__valve__/packages/prune", None).await?;
        let p = &v["pruned"];
        let names: Vec<&str> = p["packages"].as_array().into_iter().flatten().filter_map(|n| n.as_str()).collect();
        return Ok(format!(
            "Pruned {}: {} app libraries, {} built packages{}, {} tarballs; {} freed\n",
            v["cache"].as_str().unwrap_or(""),
            p["libraries"],
            names.len(),
            if names.is_empty() { String::new() } else { format!(" ({})", names.join(", ")) },
            p["tarballs"],
            mb(&p["bytes"]),
        ));
    }
    let v = call(admin, http::Method::GET, "/__valve__/packages", None).await?;
    let rows = v["packages"].as_array().cloned().unwrap_or_default();
    let mut out = format!("{:<20} {:<12} {:<30} {:>10}  apps\n", "package", "version", "built for", "size");
    for r in &rows {
        let apps: Vec<&str> = r["apps"].as_array().into_iter().flatten().filter_map(|a| a.as_str()).collect();
        out.push_str(&format!(
            "{:<20} {:<12} {:<30} {:>10}  {}\n",
            r["package"].as_str().unwrap_or(""),
            r["version"].as_str().unwrap_or(""),
            r["r"].as_str().unwrap_or(""),
            mb(&r["bytes"]),
            if apps.is_empty() { "(none: `valve packages --prune` removes it)".to_string() } else { apps.join(", ") },
        ));
    }
    out.push_str(&format!(
        "{} built packages, {} in {}\n",
        rows.len(),
        mb(&v["bytes"]),
        v["cache"].as_str().unwrap_or("")
    ));
    Ok(out)
}

/// One call; a status other than 2xx is an error carrying valve's message.
async fn call(admin: &AdminAt, method: http::Method, path: &str, body: Option<Value>) -> Result<Value, String> {
    let (status, v) = call_raw(admin, method, path, body).await?;
    if (200..300).contains(&status) {
        return Ok(v);
    }
    Err(v["error"].as_str().map(str::to_string).unwrap_or_else(|| format!("valve answered {status}: {v}")))
}

async fn call_raw(
    admin: &AdminAt,
    method: http::Method,
    path: &str,
    body: Option<Value>,
) -> Result<(u16, Value), String> {
    match tokio::time::timeout(LIMIT, ask(admin, method, path, body)).await {
        Ok(r) => r,
        Err(_) => Err(format!("{} did not answer within {}s", admin.url, LIMIT.as_secs())),
    }
}

async fn ask(at: &AdminAt, method: http::Method, path: &str, body: Option<Value>) -> Result<(u16, Value), String> {
    let admin = at.url.as_str();
    let uri: http::Uri = admin.parse().map_err(|e| {
        format!("{admin:?} is not a URL ({e}): pass valve's admin address, such as http://127.0.0.1:9090")
    })?;
    if uri.scheme_str() != Some("http") {
        return Err(format!("{admin:?}: valve's admin address is plain http://"));
    }
    let host = uri.host().ok_or_else(|| format!("{admin:?} names no host"))?;
    let addr = format!("{host}:{}", uri.port_u16().unwrap_or(80));
    let stream = tokio::net::TcpStream::connect(&addr)
        .await
        .map_err(|e| format!("cannot reach valve's admin address {addr}: {e} (is valve running? the ready line's admin_url is its address)"))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| format!("{admin}: {e}"))?;
    tokio::spawn(conn);
    let bytes = body.map(|b| b.to_string()).unwrap_or_default();
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, uri.authority().map(|a| a.as_str()).unwrap_or(host))
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::AUTHORIZATION, format!("Bearer {}", at.token))
        .body(Full::new(bytes::Bytes::from(bytes)))
        .map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| format!("{admin}: {e}"))?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.map_err(|e| format!("{admin}: {e}"))?.to_bytes();
    let value =
        serde_json::from_slice(&body).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    if status == 404 && value["error"].as_str().is_some_and(|e| e.contains("no such valve path")) {
        return Err("this valve does not publish: start it with --publish-dir and --publish-keys-file".into());
    }
    Ok((status, value))
}
