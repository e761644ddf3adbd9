//! Seeing every app: the site dashboard and each app's page (in real
//! Chromium), each app's log (what its R prints and valve's lines about it,
//! read whole and followed), and the usage list (Shiny sessions and requests
//! by user) that survives a restart through `usage_log`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;

use crate::harness::{client, fixture, need_browser, wait_until, Valve};
use crate::identity::shiny_whoami_at;
use crate::shiny::browser_dir;

/// A site of four apps: two plumber APIs (the same file, so only the name
/// tells their lines apart), a Shiny app, and a static folder; and `idle`
/// more APIs scaled to zero (no R process until a request comes).
fn four_apps(dir: &Path, extra: &str, idle: usize) -> PathBuf {
    let config = dir.join("valve.toml");
    let mut text = format!(
        r#"trusted_proxies = ["127.0.0.1"]
n_min = 1
n_max = 2
{extra}

[[app]]
name = "api"
file = "{api}"

[[app]]
name = "api2"
file = "{api}"
log_buffer = "16KiB"

[[app]]
name = "whoami"
file = "{shiny}"

[[app]]
name = "docs"
static = "{docs}"
"#,
        api = fixture("api.R").display(),
        shiny = fixture("shiny_whoami").display(),
        docs = fixture("site_docs").display(),
    );
    for i in 1..=idle {
        let api = fixture("api.R");
        text.push_str(&format!("\n[[app]]\nname = \"report-{i:02}\"\nfile = \"{}\"\nn_min = 0\n", api.display()));
    }
    std::fs::write(&config, text).unwrap();
    config
}

async fn get(url: &str) -> (u16, String) {
    let resp = crate::harness::get_url(url).send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

async fn json(url: &str) -> Value {
    let (status, body) = get(url).await;
    assert_eq!(status, 200, "{url}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{url}: {e}: {body}"))
}

/// One field (`id`, `pid`) of each of an app's workers, from its own status.
async fn workers_of(valve: &Valve, app: &str, field: &str) -> Vec<u64> {
    let status = json(&valve.admin(&format!("/__valve__/apps/{app}/status"))).await;
    status["app"]["workers"].as_array().unwrap().iter().filter_map(|w| w[field].as_u64()).collect()
}

/// A 4xx answer's status and its JSON error message.
async fn refused(url: &str) -> (u16, String) {
    let (status, body) = get(url).await;
    let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{url}: not JSON ({e}): {body}"));
    (status, v["error"].as_str().unwrap_or_default().to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dashboard_lists_every_app_each_page_shows_its_own_workers_and_each_log_only_its_own_lines() {
    need_browser();
    let dir = tempfile::tempdir().unwrap();
    let config = four_apps(dir.path(), "", 40);
    let valve = Valve::start(&["-c", config.to_str().unwrap(), "--log-format", "json"]);
    let logs = |app: &str, query: &str| valve.admin(&format!("/__valve__/apps/{app}/logs{query}"));

    // Follow api's log, then have one of its endpoints print a line.
    let follow = crate::harness::get_url(&logs("api", "?follow=1")).send().await.unwrap();
    assert_eq!(follow.status(), 200);
    assert_eq!(follow.headers()["content-type"], "text/plain; charset=utf-8");
    let mut stream = follow.bytes_stream();
    let marker = format!("m{}", std::process::id());
    let printed = client().get(valve.get(&format!("/api/print?marker={marker}"))).send().await.unwrap();
    assert_eq!(printed.status(), 200);
    let mut followed = String::new();
    tokio::time::timeout(Duration::from_secs(10), async {
        while !followed.contains(&format!("stderr-marker: {marker}")) {
            let chunk = stream.next().await.expect("the follow stream stays open").unwrap();
            followed.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await
    .unwrap_or_else(|_| panic!("?follow=1 did not stream the line: {followed}"));
    drop(stream);
    // valve's own lines about the app are in it too, and they name the worker.
    assert!(followed.contains("[valve INFO] worker ready worker="), "{followed}");
    let line = followed.lines().find(|l| l.contains(&format!("stderr-marker: {marker}"))).unwrap();
    let worker: u64 = line.split("[worker ").nth(1).and_then(|r| r.split(' ').next()).unwrap().parse().unwrap();
    let api_workers = workers_of(&valve, "api", "id").await;
    assert!(api_workers.contains(&worker), "the line names one of api's workers: {line} {api_workers:?}");

    // Read whole: the text, one worker's lines as JSON, never in another app's log.
    let (_, whole) = get(&logs("api", "")).await;
    assert!(whole.contains(&format!("stdout-marker: {marker}")), "{whole}");
    let one = json(&logs("api", &format!("?format=json&worker={worker}"))).await;
    let lines = one["lines"].as_array().unwrap();
    assert!(lines.iter().all(|l| l["worker"] == worker), "{one}");
    assert!(lines.iter().any(|l| l["text"] == format!("stderr-marker: {marker}")), "{one}");
    for other in ["api2", "whoami", "docs"] {
        let (status, text) = get(&logs(other, "")).await;
        assert_eq!(status, 200);
        assert!(!text.contains(&marker), "api's line is in {other}'s log: {text}");
    }
    assert_eq!(json(&logs("api2", "?format=json")).await["log_buffer"], 16384, "the app's own log_buffer");
    // valve's own log keeps the line with the app and the worker (JSON for collectors).
    valve.wait_for_log(&format!("stderr-marker: {marker}"), Duration::from_secs(5));
    let logged: Value = valve
        .log()
        .lines()
        .find(|l| l.contains(&format!("stderr-marker: {marker}")))
        .and_then(|l| serde_json::from_str(l).ok())
        .expect("a JSON line");
    assert_eq!((logged["fields"]["app"].as_str(), logged["fields"]["worker"].as_u64()), (Some("api"), Some(worker)));

    // Bad queries get a JSON error naming what was wrong and what to send.
    let (status, message) = refused(&logs("nope", "")).await;
    assert_eq!(status, 404);
    assert!(message.contains("\"nope\"") && message.contains("api, api2, docs, report-01,"), "{message}");
    assert!(message.contains("and 34 more"), "a long list is cut: {message}");
    let (status, message) = refused(&logs("api", "?worker=first")).await;
    assert_eq!(status, 400);
    assert!(message.contains("worker=\"first\"") && message.contains("a worker's id"), "{message}");
    let (status, message) = refused(&logs("api", "?format=xml")).await;
    assert_eq!((status, message.contains("send text or json")), (400, true), "{message}");
    let (status, message) = refused(&valve.admin("/__valve__/usage?since=yesterday")).await;
    assert_eq!(status, 400);
    assert!(message.contains("since=\"yesterday\"") && message.contains("RFC 3339"), "{message}");
    let (status, message) = refused(&valve.admin("/__valve__/usage?app=nope")).await;
    assert_eq!(status, 404, "{message}");
    // All of it on the admin listener only.
    for page in ["/__valve__/apps", "/__valve__/apps/api/logs", "/__valve__/usage"] {
        assert_eq!(get(&valve.get(page)).await.0, 404, "{page} on the main port");
    }

    // The site dashboard and api's page, in Chromium, while alice holds a Shiny session.
    let shots = tempfile::tempdir().unwrap();
    let out = Command::new("node")
        .args(["observe.mjs", &valve.admin_url(), &valve.get("/whoami/"), &valve.get("/api"), "api"])
        .arg(shots.path())
        .env("VALVE_ADMIN_TOKEN", valve.token())
        .current_dir(browser_dir())
        .output()
        .expect("node runs (install nodejs and Debian's chromium; `npm ci` in tests/browser)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("[observe.mjs] {text}");
    assert!(out.status.success(), "the dashboard check failed in Chromium: {text}");
    let seen: Value = serde_json::from_str(text.lines().find(|l| l.starts_with('{')).unwrap()).unwrap();
    let rows = &seen["rows"];
    for (app, kind, path) in [
        ("api", "plumber", "/api"),
        ("api2", "plumber", "/api2"),
        ("whoami", "shiny", "/whoami"),
        ("docs", "static", "/docs"),
    ] {
        assert_eq!((rows[app]["kind"].as_str(), rows[app]["path"].as_str()), (Some(kind), Some(path)), "{rows}");
        // As root each R app runs as a user of its own; static content is valve's to serve.
        let runs_as = if kind != "static" && crate::harness::as_root() {
            format!("valve-{app} (own user, private view)")
        } else {
            "valve's user (".to_string()
        };
        assert!(rows[app]["runs_as"].as_str().unwrap().starts_with(&runs_as), "{rows}");
    }
    assert_eq!((rows["api"]["workers"].as_str(), rows["docs"]["workers"].as_str()), (Some("1 / 2"), Some("–")));
    assert_eq!((rows["whoami"]["sessions"].as_u64(), rows["whoami"]["users"].as_str()), (Some(1), Some("alice")));
    assert_eq!(
        (rows["api"]["sessions"].as_u64(), rows["api"]["users"].as_str()),
        (Some(0), Some("")),
        "its own figures"
    );
    assert_eq!(seen["filtered"], serde_json::json!(["docs"]), "the filter narrows the table to static content");
    assert_eq!(seen["last"], "whoami", "sorted by name, the other way round");
    assert_eq!(seen["busiest"], "whoami", "sorted by sessions, the most first");
    assert_eq!(rows.as_object().map(|r| r.len()), Some(44), "every app has its row");
    let idle = &rows["report-07"];
    assert_eq!((idle["workers"].as_str(), idle["state"].as_str()), (Some("0 / 2"), Some("scaled to zero")), "{idle}");
    // api's page lists api's workers, and none of the other apps'.
    let mut shown: Vec<u64> = seen["pids"].as_array().unwrap().iter().map(|p| p.as_u64().unwrap()).collect();
    shown.sort();
    let mut own = workers_of(&valve, "api", "pid").await;
    own.sort();
    assert_eq!(shown, own, "api's page shows api's workers");
    for other in ["api2", "whoami"] {
        let theirs = workers_of(&valve, other, "pid").await;
        assert!(!theirs.is_empty() && theirs.iter().all(|p| !shown.contains(p)), "{other}'s workers on api's page");
    }
    assert!(get(&logs("api", "")).await.1.contains(seen["marker"].as_str().unwrap()), "the page's line is api's");
    for shot in ["dashboard-site.png", "dashboard-app.png"] {
        let size = std::fs::metadata(shots.path().join(shot)).map(|m| m.len()).unwrap_or(0);
        assert!(size > 10_000, "{shot} was taken ({size} bytes)");
        if let Ok(dest) = std::env::var("VALVE_SCREENSHOTS") {
            std::fs::copy(shots.path().join(shot), Path::new(&dest).join(shot)).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_signed_in_users_shiny_session_is_in_the_usage_list_and_in_the_usage_log_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let usage_log = dir.path().join("usage.jsonl");
    let config = four_apps(dir.path(), "usage_log = \"usage.jsonl\"", 0);
    let mut valve = Valve::start(&["-c", config.to_str().unwrap(), "--no-access-log"]);
    // alice opens the Shiny app in Chromium, then leaves it.
    shiny_whoami_at(&valve, &valve.get("/whoami/"), r#"{"X-Forwarded-User":"alice"}"#);
    for _ in 0..2 {
        let r = client().get(valve.get("/api/pid")).header("x-forwarded-user", "bob").send().await.unwrap();
        assert_eq!(r.status(), 200);
    }
    let whoami_workers = workers_of(&valve, "whoami", "id").await;

    // The browser left: its session is in the list with its length.
    let usage_url = valve.admin("/__valve__/usage");
    let mut usage = Value::Null;
    wait_until("alice's session in the usage list", Duration::from_secs(10), || {
        let out = Command::new("curl").args(["-s", "-H", &valve.bearer(), &usage_url]).output().unwrap();
        usage = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        usage["sessions"].as_array().is_some_and(|s| !s.is_empty())
    });
    let session = usage["sessions"][0].clone();
    assert_eq!((session["app"].as_str(), session["user"].as_str()), (Some("whoami"), Some("alice")), "{usage}");
    assert!(session["seconds"].as_f64().unwrap() > 0.0, "{session}");
    assert!(session["end"].as_str() > session["start"].as_str(), "{session}");
    assert!(whoami_workers.contains(&session["worker"].as_u64().unwrap()), "{session} {whoami_workers:?}");
    assert_eq!(session["reconnects"], 0);
    let bob = |usage: &Value| {
        usage["requests"].as_array().unwrap().iter().find(|h| h["app"] == "api" && h["user"] == "bob").cloned()
    };
    assert_eq!(bob(&usage).map(|h| h["requests"].clone()), Some(2.into()), "{usage}");
    // Filtered by app, since a time, as CSV.
    let whoami = json(&valve.admin("/__valve__/usage?app=whoami")).await;
    assert!(whoami["requests"].as_array().unwrap().iter().all(|h| h["app"] == "whoami"), "{whoami}");
    let later = json(&valve.admin("/__valve__/usage?since=2999-01-01")).await;
    assert_eq!(
        (later["sessions"].as_array().map(Vec::len), later["requests"].as_array().map(Vec::len)),
        (Some(0), Some(0))
    );
    let (status, csv) = get(&valve.admin("/__valve__/usage?format=csv&since=1h")).await;
    assert_eq!(status, 200);
    assert!(csv.starts_with("type,app,user,start,end,seconds,worker,reconnects,requests\n"), "{csv}");
    assert!(csv.lines().any(|l| l.starts_with("session,whoami,alice,")), "{csv}");
    let metrics = get(&valve.admin("/__valve__/metrics")).await.1;
    assert!(metrics.contains("valve_shiny_session_duration_seconds_count{app=\"whoami\"} 1"), "{metrics}");

    // A restart: the usage log holds it all, and valve reads it back.
    valve.signal(libc::SIGTERM);
    assert_eq!(valve.wait_exit(Duration::from_secs(20)).code(), Some(0));
    let logged = std::fs::read_to_string(&usage_log).unwrap();
    assert!(logged.lines().any(|l| l.contains("\"type\":\"session\"") && l.contains("\"user\":\"alice\"")), "{logged}");
    assert!(logged.lines().any(|l| l.contains("\"type\":\"requests\"") && l.contains("\"user\":\"bob\"")), "{logged}");
    // This time users are kept as a keyed hash, its key beside the log.
    std::fs::write(
        &config,
        std::fs::read_to_string(&config).unwrap().replace("n_min = 1\n", "n_min = 1\nusage_anonymize = true\n"),
    )
    .unwrap();
    let again = Valve::start(&["-c", config.to_str().unwrap(), "--no-access-log"]);
    let usage = json(&again.admin("/__valve__/usage")).await;
    assert_eq!(usage["sessions"][0], session, "the session, read back");
    assert_eq!(bob(&usage).map(|h| h["requests"].clone()), Some(2.into()), "{usage}");
    let r = client().get(again.get("/api/pid")).header("x-forwarded-user", "carol").send().await.unwrap();
    assert_eq!(r.status(), 200);
    let usage = json(&again.admin("/__valve__/usage?app=api")).await;
    let users: Vec<&str> = usage["requests"].as_array().unwrap().iter().filter_map(|h| h["user"].as_str()).collect();
    assert!(users.iter().any(|u| u.starts_with("anon-")) && !users.contains(&"carol"), "{users:?}");
    let key = dir.path().join("usage.jsonl.key");
    assert_eq!(std::fs::metadata(&key).map(|m| m.permissions().mode() & 0o777).ok(), Some(0o600), "{}", key.display());
}
