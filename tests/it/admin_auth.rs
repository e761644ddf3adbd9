//! valve's admin pages ask who is calling (a boundary: every app's R
//! shares valve's host and network, and finds the admin port in
//! /proc/net/tcp). From inside an app's R, with no credential, every admin
//! path but health and readiness answers 401, and nothing it asked for
//! happens; valve's own subcommands (with the operator token), a key on
//! its own apps, and the dashboard in Chromium (a sign-in, then a session
//! cookie) keep working; a page of another site (an app's, on the main
//! port) cannot make a signed-in browser change anything.

use std::process::Command;

use reqwest::Method;
use serde_json::{json, Value};

use crate::harness::{client, fixture, need_browser, need_r_packages, valve_bin, Valve};
use crate::published::{call, create, publish, site};

/// What the attacker app's R gets for `method url`: the HTTP status.
async fn from_r(valve: &Valve, method: &str, url: &str) -> String {
    let url = valve.get(&format!("/attacker/admin?method={method}&url={}", urlencode(url)));
    let resp = client().get(&url).send().await.unwrap();
    assert_eq!(resp.status(), 200, "{url}");
    resp.json::<Value>().await.unwrap()["status"].as_str().unwrap_or_default().to_string()
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn attacker_site() -> (tempfile::TempDir, Vec<(String, String)>) {
    let apps = format!(
        "[[app]]\nname = \"attacker\"\npath = \"/attacker\"\nfile = \"{}\"\nn_max = 1\n",
        fixture("attacker/plumber.R").display()
    );
    site("max_workers = 6", &apps, &[("ann", ""), ("bob", "")])
}

#[tokio::test(flavor = "multi_thread")]
async fn an_apps_r_reaching_the_admin_port_gets_401_for_everything_but_health_and_changes_nothing() {
    need_r_packages(&["plumber"]);
    let (dir, keys) = attacker_site();
    let config = dir.path().join("valve.toml");
    let valve = Valve::start(&["--config", config.to_str().unwrap()]);
    let (admin, ann) = (valve.admin_url(), keys[0].1.clone());
    let guid = create(&admin, &ann, "notes").await;
    publish(&admin, &ann, &guid, crate::published::held_api(1)).await;
    let (_, before) = call(
        &admin,
        &ann,
        Method::PATCH,
        &format!("/v1/content/{guid}"),
        Some(json!({
            "allow_users": ["ann"]
        })),
    )
    .await;
    assert_eq!(before["allow_users"], json!(["ann"]), "{before}");
    // The deployment's and the access change's own reloads are done (their log lines in).
    let reloads = || valve.log().matches("reloading source=").count();
    let mut reloads_before = reloads();
    loop {
        std::thread::sleep(std::time::Duration::from_millis(500));
        if reloads() == reloads_before {
            break;
        }
        reloads_before = reloads();
    }

    for (method, page) in [
        ("GET", "/__valve__/status"),
        ("GET", "/__valve__/"),
        ("GET", "/__valve__/apps"),
        ("GET", "/__valve__/apps/notes/logs"),
        ("GET", "/__valve__/usage"),
        ("GET", "/__valve__/metrics"),
        ("GET", "/__valve__/packages"),
        ("POST", "/__valve__/reload"),
        ("POST", "/__valve__/packages/prune"),
        ("GET", "/__valve__/published/"),
        ("POST", "/__valve__/published/notes/activate"),
        ("POST", "/__valve__/published/notes/access"),
    ] {
        assert_eq!(from_r(&valve, method, &format!("{admin}{page}")).await, "401", "{method} {page} from an app's R");
    }
    for probe in ["/__valve__/healthz", "/__valve__/readyz"] {
        assert_eq!(from_r(&valve, "GET", &format!("{admin}{probe}")).await, "200", "{probe} answers anyone");
    }
    // Nothing it asked for happened: notes is still ann's alone, no reload ran.
    let (_, after) = call(&admin, &ann, Method::GET, &format!("/v1/content/{guid}"), None).await;
    assert_eq!(after["allow_users"], json!(["ann"]), "{after}");
    assert_eq!(reloads(), reloads_before, "no reload ran:\n{}", valve.log());
    assert_eq!(client().get(valve.get("/notes/version")).send().await.unwrap().status(), 403, "still ann's alone");

    // valve's own subcommands, with the operator token: they work.
    let out = Command::new(valve_bin())
        .args(["versions", "notes", "--admin", &admin])
        .env("VALVE_ADMIN_TOKEN_FILE", valve.token_file())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("notes at"));
    // Without it, they are told what is missing.
    let out = Command::new(valve_bin())
        .args(["versions", "notes", "--admin", &admin])
        .env("VALVE_ADMIN_TOKEN_FILE", dir.path().join("no-such-token"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no-such-token"), "{}", String::from_utf8_lossy(&out.stderr));

    // A key that is not an admin key sees and changes its own apps there, and no other.
    let get_as = |key: &str, path: &str| {
        client().get(format!("{admin}{path}")).header("Authorization", format!("Key {key}")).send()
    };
    let bob = keys[1].1.clone();
    assert_eq!(get_as(&ann, "/__valve__/published/notes/versions").await.unwrap().status(), 200);
    assert_eq!(get_as(&bob, "/__valve__/published/notes/versions").await.unwrap().status(), 403);
    assert_eq!(get_as(&ann, "/__valve__/apps/notes/logs").await.unwrap().status(), 200);
    assert_eq!(get_as(&bob, "/__valve__/apps/notes/logs").await.unwrap().status(), 403);
    assert_eq!(get_as(&ann, "/__valve__/apps/attacker/status").await.unwrap().status(), 403, "a configured app");
    assert_eq!(get_as(&ann, "/__valve__/status").await.unwrap().status(), 403, "valve's own status: operators'");
    let listed: Value = get_as(&bob, "/__valve__/apps").await.unwrap().json().await.unwrap();
    assert_eq!(listed["apps"], json!([]), "bob published nothing: {listed}");
    let wrong = get_as("not-a-key-valve-knows-at-all", "/__valve__/status").await.unwrap();
    assert_eq!(wrong.status(), 401);
    let body: Value = wrong.json().await.unwrap();
    assert!(body["error"].as_str().unwrap().contains("Bearer"), "what to send: {body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dashboard_asks_to_sign_in_works_after_and_refuses_another_sites_post_in_chromium() {
    need_browser();
    need_r_packages(&["plumber"]);
    let (dir, keys) = attacker_site();
    let config = dir.path().join("valve.toml");
    let valve = Valve::start(&["--config", config.to_str().unwrap()]);
    let evil = valve.get(&format!("/attacker/evil?target={}", urlencode(&valve.admin("/__valve__/reload"))));
    let out = tokio::process::Command::new("node")
        .args(["signin.mjs", &valve.admin_url(), &evil])
        .env("VALVE_ADMIN_TOKEN", valve.token())
        .env("VALVE_KEY", &keys[0].1)
        .current_dir(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser"))
        .output()
        .await
        .expect("node runs (install nodejs, then `npm ci` in tests/browser, and Debian's chromium)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("[signin.mjs] {text}");
    assert!(out.status.success(), "the sign-in check failed in Chromium");
    let seen: Value = serde_json::from_str(text.lines().find(|l| l.starts_with('{')).unwrap()).unwrap();
    assert_eq!(seen["asked"], "Sign in to valve", "{seen}");
    assert_eq!(seen["wrong"], 401, "{seen}");
    assert!(seen["apps"].as_u64() >= Some(1), "the dashboard lists the apps once signed in: {seen}");
    assert_eq!(seen["cookie"]["httpOnly"], true, "{seen}");
    assert_eq!(seen["cookie"]["sameSite"], "Strict", "{seen}");
    assert!(seen["evil"].as_str().unwrap().contains("X-Valve-CSRF"), "another site's POST is refused: {seen}");
    assert_eq!(seen["own"].as_u64(), Some(200), "valve's own page may POST with its token: {seen}");
    assert_eq!(valve.log().matches("reloading source=").count(), 1, "the page's reload ran, the other site's did not");
}

#[test]
fn check_reads_the_publish_keys_file_the_command_line_names_over_the_config_files() {
    use std::os::unix::fs::PermissionsExt;
    need_r_packages(&["plumber"]);
    let (dir, _) = attacker_site();
    let config = dir.path().join("valve.toml");
    let bad = dir.path().join("bad.keys");
    std::fs::write(&bad, "bob short\n").unwrap();
    std::fs::set_permissions(&bad, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = Command::new(valve_bin())
        .args(["--check", "--config", config.to_str().unwrap(), "--publish-keys-file", bad.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("publish_keys_file {}:1", bad.display())), "{err}");
    let good = Command::new(valve_bin()).args(["--check", "--config", config.to_str().unwrap()]).output().unwrap();
    assert!(good.status.success(), "{}", String::from_utf8_lossy(&good.stderr));
}
