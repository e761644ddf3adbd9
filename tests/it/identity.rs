//! Who is calling: identity and client address believed only from
//! trusted proxies, written for R the way R reads it, per-app allow lists
//! answered by valve before any worker is taken, and bad input refused.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::harness::{client, fixture, need_browser, Valve};
use crate::shiny::browser_dir;

fn whoami() -> String {
    fixture("whoami.R").display().to_string()
}

async fn who(valve: &Valve, headers: &[(&str, &str)]) -> serde_json::Value {
    let mut req = client().get(valve.get("/who"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

/// Every request valve handed to a worker so far, over every app.
fn handed_to_workers(valve: &Valve) -> u64 {
    let status = valve.status();
    status["workers"].as_array().expect("status lists workers").iter().filter_map(|w| w["requests"].as_u64()).sum()
}

/// One request as raw bytes; the whole answer (valve closes or the read times out).
fn raw(valve: &Valve, payload: &[u8]) -> String {
    let mut s = TcpStream::connect(valve.url.trim_start_matches("http://")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = s.write_all(payload);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).to_string()
}

const SPOOF: [(&str, &str); 6] = [
    ("x-forwarded-user", "mallory"),
    ("x-forwarded-email", "mallory@example.org"),
    ("x-forwarded-groups", "admin"),
    ("shiny-server-credentials", r#"{"user":"mallory","groups":["admin"]}"#),
    ("x-forwarded-for", "203.0.113.66"),
    ("x-valve-remote-addr", "192.0.2.66"),
];

#[tokio::test(flavor = "multi_thread")]
async fn an_untrusted_peer_names_no_user_and_no_client_address() {
    // Loopback is not trusted by default, nor when the list names other networks.
    // On either transport: frames, and httpuv (where valve names the client in a header).
    for extra in [&[][..], &["--trusted-proxies", "10.0.0.0/8"][..], &["--worker-transport", "httpuv"][..]] {
        let valve = Valve::start(&[&["-f", &whoami()], extra].concat());
        let seen = who(&valve, &SPOOF).await;
        for key in ["user", "email", "groups", "credentials"] {
            assert_eq!(seen[key], "", "{key} reached R from an untrusted peer: {seen}");
        }
        assert_eq!(seen["remote"], "127.0.0.1", "R's REMOTE_ADDR is the peer: {seen}");
        valve.wait_for_log("user=-", Duration::from_secs(10));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_trusted_proxy_names_the_user_and_the_client_to_plumber() {
    let valve = Valve::start(&["-f", &whoami(), "--trusted-proxies", "127.0.0.1/32"]);
    let seen = who(
        &valve,
        &[
            ("x-forwarded-user", "alice"),
            ("x-forwarded-email", "alice@example.org"),
            ("x-forwarded-groups", " staff, ,admins "),
            ("shiny-server-credentials", r#"{"user":"mallory"}"#),
            ("x-forwarded-for", "198.51.100.1, 203.0.113.7"),
        ],
    )
    .await;
    assert_eq!(seen["user"], "alice", "{seen}");
    assert_eq!(seen["email"], "alice@example.org", "{seen}");
    assert_eq!(seen["groups"], "staff,admins", "groups trimmed, empties dropped: {seen}");
    assert_eq!(seen["credentials"], "", "Shiny's header is for Shiny apps, and only valve writes it: {seen}");
    assert_eq!(seen["remote"], "203.0.113.7", "the rightmost untrusted X-Forwarded-For entry: {seen}");
    valve.wait_for_log("user=alice", Duration::from_secs(10));

    // No user header: the email is the user. RFC 7239 Forwarded when there is no X-Forwarded-For.
    let seen =
        who(&valve, &[("x-forwarded-email", "bob@example.org"), ("forwarded", "for=\"[2001:db8::5]:4711\"")]).await;
    assert_eq!((seen["user"].as_str(), seen["remote"].as_str()), (Some("bob@example.org"), Some("2001:db8::5")));

    // A malformed X-Forwarded-For is ignored: the peer is the client, the request served.
    let seen = who(&valve, &[("x-forwarded-user", "alice"), ("x-forwarded-for", "203.0.113.7, not-an-address")]).await;
    assert_eq!((seen["user"].as_str(), seen["remote"].as_str()), (Some("alice"), Some("127.0.0.1")), "{seen}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_proxys_own_header_names_reach_r_as_the_canonical_ones() {
    let valve = Valve::start_with_env(
        &["-f", &whoami(), "--user-header", "X-Auth-Request-User", "--worker-transport", "httpuv"],
        &[("VALVE_TRUSTED_PROXIES", "127.0.0.1")],
    );
    let seen = who(
        &valve,
        &[
            ("x-auth-request-user", "carol"),
            ("x-forwarded-user", "mallory"),
            ("x-forwarded-for", "198.51.100.4"),
            ("x-valve-remote-addr", "192.0.2.66"),
        ],
    )
    .await;
    assert_eq!(seen["user"], "carol", "{seen}");
    assert_eq!(seen["custom"], "", "the proxy's own name is not passed on: {seen}");
    assert_eq!(seen["remote"], "198.51.100.4", "an httpuv worker's REMOTE_ADDR is the client's: {seen}");
}

const ACCESS: &str = r#"
trusted_proxies = ["127.0.0.1"]
sign_in_url = "/oauth2/start?rd={rd}"
allow_groups = ["staff"]

[[app]]
name = "api"
file = "{api}"
allow_users = ["alice", "Dana@Example.org"]

[[app]]
name = "docs"
static = "{docs}"
"#;

fn write_config(dir: &Path, text: &str) -> std::path::PathBuf {
    let docs = dir.join("docs");
    std::fs::create_dir_all(&docs).unwrap();
    std::fs::write(docs.join("index.html"), "<h1>docs</h1>").unwrap();
    let path = dir.join("valve.toml");
    std::fs::write(&path, text.replace("{api}", &whoami()).replace("{docs}", docs.to_str().unwrap())).unwrap();
    path
}

async fn status_of(valve: &Valve, path: &str, headers: &[(&str, &str)]) -> (u16, String, String) {
    let c = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let mut req = c.get(valve.get(path));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let location = resp.headers().get("location").map(|l| l.to_str().unwrap().to_string()).unwrap_or_default();
    (resp.status().as_u16(), location, resp.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn per_app_access_is_decided_before_any_worker_and_a_reload_changes_it_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), ACCESS);
    let valve = Valve::start(&["-c", config.to_str().unwrap(), "--n-min", "1"]);
    // The worker has answered its readiness probe; nothing has been handed to it yet.
    let before = handed_to_workers(&valve);
    let json = [("accept", "application/json")];
    let (code, _, body) = status_of(&valve, "/api/who", &json).await;
    assert_eq!(code, 403, "no identity: {body}");
    assert!(body.contains("\"status\":403"), "a short JSON body: {body}");
    let (code, location, _) = status_of(&valve, "/api/who?x=1", &[("accept", "text/html,*/*")]).await;
    assert_eq!((code, location.as_str()), (302, "/oauth2/start?rd=/api/who%3Fx%3D1"), "a browser signs in first");
    let bob = [("x-forwarded-user", "bob"), ("x-forwarded-groups", "staff"), ("accept", "text/html")];
    let (code, _, body) = status_of(&valve, "/api/who", &bob).await;
    assert_eq!(code, 403, "the app's own list replaces the default groups; signed in, so no redirect: {body}");
    assert!(body.contains("bob may not use this app"), "{body}");
    // An untrusted name is no name: a spoofed user from loopback is still trusted here, so
    // the WebSocket-shaped and plain requests of an unnamed caller are both refused.
    let upgrade = b"GET /api/who HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    assert!(raw(&valve, upgrade).starts_with("HTTP/1.1 403"), "upgrades are checked too");
    assert_eq!(handed_to_workers(&valve), before, "no denied request reached a worker");

    let (code, _, body) = status_of(&valve, "/api/who", &[("x-forwarded-user", "alice")]).await;
    assert_eq!(code, 200, "{body}");
    let dana = [("x-forwarded-user", "d"), ("x-forwarded-email", "dana@example.ORG")];
    assert_eq!(status_of(&valve, "/api/who", &dana).await.0, 200, "emails match without regard to case");
    // Static content obeys the same rules: here the top level's group.
    assert_eq!(status_of(&valve, "/docs/", &json).await.0, 403);
    let staff = [("x-forwarded-user", "erin"), ("x-forwarded-groups", "x,staff")];
    let (code, _, body) = status_of(&valve, "/docs/", &staff).await;
    assert_eq!((code, body.as_str()), (200, "<h1>docs</h1>"));

    let metrics =
        valve.admin_client().get(valve.admin("/__valve__/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(
        metrics.contains(r#"valve_rejected_requests_total{app="api",reason="access_denied"} 3"#),
        "{}",
        metrics.lines().filter(|l| l.contains("reason=")).collect::<Vec<_>>().join("\n")
    );
    assert!(metrics.contains(r#"valve_rejected_requests_total{app="api",reason="sign_in"} 1"#));

    // A reload lets bob in at the next request: no new generation of workers needed.
    let workers = valve.workers();
    std::fs::write(&config, std::fs::read_to_string(&config).unwrap().replace("\"alice\",", "\"alice\", \"bob\","))
        .unwrap();
    let plan: serde_json::Value =
        valve.admin_client().post(valve.admin("/__valve__/reload")).send().await.unwrap().json().await.unwrap();
    assert_eq!(plan["apps"]["unchanged"].as_array().map(Vec::len), Some(2), "{plan}");
    let (code, _, body) = status_of(&valve, "/api/who", &bob).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"user\":\"bob\""), "{body}");
    assert_eq!(valve.workers(), workers, "the same workers serve");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_identity_input_is_answered_by_valve_without_a_worker() {
    let valve = Valve::start(&["-f", &whoami(), "--trusted-proxies", "127.0.0.1"]);
    let before = handed_to_workers(&valve);
    // A megabyte of groups: past the head limit.
    let huge = format!(
        "GET /who HTTP/1.1\r\nHost: x\r\nX-Forwarded-User: a\r\nX-Forwarded-Groups: {}\r\n\r\n",
        "g,".repeat(512 * 1024)
    );
    let answer = raw(&valve, huge.as_bytes());
    assert!(answer.starts_with("HTTP/1.1 431"), "{}", answer.lines().next().unwrap_or(""));
    // Within the head limit but past the identity bound: 431 with JSON.
    let long = format!(
        "GET /who HTTP/1.1\r\nHost: x\r\nX-Forwarded-User: a\r\nX-Forwarded-Groups: {}\r\n\r\n",
        "g".repeat(9 * 1024)
    );
    let answer = raw(&valve, long.as_bytes());
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    assert!(answer.contains("\"error\":\"the identity header x-forwarded-groups is longer than 8 KiB\""), "{answer}");
    // Not UTF-8: 400 with JSON.
    let mut bad = b"GET /who HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Forwarded-User: al".to_vec();
    bad.extend_from_slice(b"\xff\xfeice\r\n\r\n");
    let answer = raw(&valve, &bad);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("is not valid UTF-8"), "{answer}");
    assert_eq!(handed_to_workers(&valve), before, "none of these reached a worker");
    // The worker serves on.
    assert_eq!(who(&valve, &[("x-forwarded-user", "a")]).await["user"], "a");
}

#[test]
fn check_refuses_a_bad_cidr_and_warns_of_an_allow_list_naming_nobody() {
    let failed = Valve::run_to_exit(
        &["-f", &whoami(), "--trusted-proxies", "127.0.0.1,10.0.0/8", "--check"],
        Duration::from_secs(30),
    );
    assert_eq!(failed.status.code(), Some(2), "{}", failed.stderr);
    assert!(failed.stderr.contains("--trusted-proxies: \"10.0.0/8\" is not an address or a CIDR"), "{}", failed.stderr);
    let failed =
        Valve::run_to_exit(&["-f", &whoami(), "--trusted-proxies", "nope", "--port", "0"], Duration::from_secs(30));
    assert_eq!(failed.status.code(), Some(2), "start-up refuses it as --check does: {}", failed.stderr);

    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &ACCESS.replace("allow_users = [\"alice\", \"Dana@Example.org\"]", "allow_users = []"),
    );
    let checked = Valve::run_to_exit(&["-c", config.to_str().unwrap(), "--check"], Duration::from_secs(30));
    assert_eq!(checked.status.code(), Some(0), "{}", checked.stderr);
    assert!(
        checked.stderr.contains("warning: app `api`: allow_users and allow_groups name nobody"),
        "{}",
        checked.stderr
    );
}

/// `shiny.mjs whoami` with `headers` on every request of a fresh browser.
fn shiny_whoami(valve: &Valve, headers: &str) -> String {
    shiny_whoami_at(valve, &valve.url, headers)
}

/// `shiny.mjs whoami` on the Shiny app at `url`, with `headers` on every request.
pub(crate) fn shiny_whoami_at(valve: &Valve, url: &str, headers: &str) -> String {
    need_browser();
    let out = Command::new("node")
        .env("VALVE_ADMIN", valve.admin_url())
        .env("VALVE_ADMIN_TOKEN", valve.token())
        .args(["shiny.mjs", "whoami", url, headers])
        .current_dir(browser_dir())
        .output()
        .expect("node runs (install nodejs and Debian's chromium; `npm ci` in tests/browser)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("[shiny.mjs whoami] {text}");
    assert!(out.status.success(), "the whoami check failed in Chromium: {text}");
    text
}

#[test]
fn a_trusted_proxy_names_the_shiny_user_and_a_browser_alone_cannot() {
    let app = fixture("shiny_whoami");
    let valve = Valve::start(&["-f", app.to_str().unwrap(), "--trusted-proxies", "127.0.0.1/32"]);
    // The page, its WebSocket and every other request carry the proxy's headers,
    // and a credentials header of the browser's own, which valve replaces.
    let headers = r#"{"X-Forwarded-User":"alice","X-Forwarded-Groups":"staff, admins","X-Forwarded-For":"203.0.113.7","X-Valve-Remote-Addr":"192.0.2.66","Shiny-Server-Credentials":"{\"user\":\"mallory\"}"}"#;
    let seen = shiny_whoami(&valve, headers);
    assert!(
        seen.contains(r#""who":"user=alice;groups=staff,admins;addr=203.0.113.7""#),
        "session$user, session$groups and the client's address in REMOTE_ADDR: {seen}"
    );
    assert!(seen.contains(r#""users":["alice"]"#), "the status lists the session's user: {seen}");
    valve.wait_for_log("path=/websocket/ http=1.1 status=101", Duration::from_secs(10));
    assert!(valve.log().lines().any(|l| l.contains("path=/websocket/") && l.contains("user=alice")), "{}", valve.log());

    // The same browser headers from a peer valve does not trust name nobody.
    let untrusted = Valve::start(&["-f", app.to_str().unwrap(), "--trusted-proxies", "10.0.0.0/8"]);
    let seen = shiny_whoami(&untrusted, headers);
    assert!(seen.contains(r#""who":"user=NULL;groups=NULL;addr=127.0.0.1""#), "the peer, never a header: {seen}");
    assert!(seen.contains(r#""users":[]"#), "{seen}");
}
