//! One site on several valves sharing `publish_dir`, as replicas behind a
//! balancer without affinity share a volume: what one publishes, every one
//! serves; a deployment's task is read from any of them; a rollback on one
//! is served by all; two deployments of one app at once, on two valves,
//! end with one active version served everywhere and nothing half-written;
//! usage counted on one is in the usage list of another.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;

use crate::harness::{need_r_packages, Valve};
use crate::publish::{follow, get};
use crate::published::{call, create, held_api, publish, site, upload};

/// Waits (at most a minute) until `valve` answers `/api/version` with `want`.
async fn serves(valve: &Valve, want: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = get(&valve.get("/api/version")).await;
        if got == (200, want.to_string()) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: still {got:?}, not {want}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Starts the deployment of bundle `version` on `admin`: its task id.
async fn deploy(admin: &str, key: &str, guid: &str, version: &str) -> String {
    let body = json!({ "bundle_id": version });
    let (code, t) = call(admin, key, Method::POST, &format!("/v1/content/{guid}/deploy"), Some(body)).await;
    assert_eq!(code, 202, "{t}");
    t["task_id"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn valves_sharing_a_folder_serve_what_any_of_them_publishes_and_read_each_others_tasks_and_usage() {
    need_r_packages(&["plumber"]);
    let docs = "[[app]]\nname = \"docs\"\npath = \"/docs\"\nstatic = \"docs\"\n";
    let (dir, keys) = site("n_max = 1\nusage_log = \"usage\"", docs, &[("ann", "")]);
    std::fs::create_dir_all(dir.path().join("usage")).unwrap();
    let config = dir.path().join("valve.toml");
    let args = ["--config", config.to_str().unwrap()];
    let (mut a, b) = (Valve::start(&args), Valve::start(&args));
    let (admin_a, admin_b, ann) = (a.admin_url(), b.admin_url(), keys[0].1.as_str());
    let auth = format!("Key {ann}");

    // Published on a, its task followed through b (a balancer sent the polls there).
    let guid = create(&admin_a, ann, "api").await;
    let (code, bundle) = upload(&admin_a, ann, &guid, held_api(1)).await;
    assert_eq!(code, 200, "{bundle}");
    let task = deploy(&admin_a, ann, &guid, bundle["id"].as_str().unwrap()).await;
    let (done, lines) = follow(&format!("{admin_b}/__api__"), &auth, &task).await;
    assert_eq!(done["code"], 0, "{done} {lines:?}");
    assert!(lines.iter().any(|l| l.starts_with("Deploying version 1 of api")), "{lines:?}");
    serves(&a, "[1]", "a, which deployed version 1").await;
    serves(&b, "[1]", "b, which shares a's publish_dir").await;

    // Published on b; a serves it too; then a rollback on a reaches b.
    publish(&admin_b, ann, &guid, held_api(2)).await;
    serves(&a, "[2]", "a, after version 2 was published on b").await;
    let task = deploy(&admin_a, ann, &guid, "1").await;
    let (done, lines) = follow(&format!("{admin_a}/__api__"), &auth, &task).await;
    assert_eq!(done["code"], 0, "{done} {lines:?}");
    serves(&b, "[1]", "b, after a rolled back to version 1").await;

    // Two deployments of the app at once, one on each valve: one waits for
    // the other; both finish, and both valves serve the version the record names.
    let (_, three) = upload(&admin_a, ann, &guid, held_api(3)).await;
    let (_, four) = upload(&admin_b, ann, &guid, held_api(4)).await;
    let (three, four) = (three["id"].as_str().unwrap().to_string(), four["id"].as_str().unwrap().to_string());
    let (ta, tb) = tokio::join!(deploy(&admin_a, ann, &guid, &three), deploy(&admin_b, ann, &guid, &four));
    let (api_a, api_b) = (format!("{admin_a}/__api__"), format!("{admin_b}/__api__"));
    let ((da, la), (db, lb)) = tokio::join!(follow(&api_b, &auth, &ta), follow(&api_a, &auth, &tb));
    assert_eq!((da["code"].clone(), db["code"].clone()), (json!(0), json!(0)), "{la:?} {lb:?}");
    let waited = la.iter().chain(&lb).filter(|l| l.starts_with("Waiting for a deployment of api by")).count();
    assert_eq!(waited, 1, "one of the two waited for the other: {la:?} {lb:?}");
    let app = dir.path().join("published/api");
    let record: serde_json::Value = serde_json::from_slice(&std::fs::read(app.join("app.json")).unwrap()).unwrap();
    let active = format!("[{}]", record["active"]);
    assert!(active == "[3]" || active == "[4]", "{record}");
    serves(&a, &active, "a, after two deployments at once").await;
    serves(&b, &active, "b, after two deployments at once").await;
    let left: Vec<String> = std::fs::read_dir(&app)
        .unwrap()
        .chain(std::fs::read_dir(dir.path().join("published")).unwrap())
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n == ".records.lock" || n == ".deploy.lock" || n.contains("partial"))
        .collect();
    assert!(left.is_empty(), "no lock nor half-written version is left: {left:?}");

    // Usage for the site: what a counted reaches b's usage list (here as a
    // stops: it writes the hour in progress every minute, and when it stops).
    assert!(b.status()["host"].as_str().is_some_and(|h| !h.is_empty()), "the dashboard says which valve answers");
    let requests = |usage: &serde_json::Value| -> u64 {
        usage["requests"].as_array().map_or(0, |hours| hours.iter().filter_map(|h| h["requests"].as_u64()).sum())
    };
    let usage_of = |valve: &Valve| {
        let url = valve.admin("/__valve__/usage?app=api");
        async move { serde_json::from_str::<serde_json::Value>(&get(&url).await.1).unwrap_or_default() }
    };
    let before = requests(&usage_of(&b).await);
    for _ in 0..7 {
        assert_eq!(get(&a.get("/api/version")).await.0, 200);
    }
    a.signal(libc::SIGTERM);
    a.wait_exit(Duration::from_secs(60));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let site = requests(&usage_of(&b).await);
        if site >= before + 7 {
            break;
        }
        assert!(Instant::now() < deadline, "a's 7 requests never reached b's usage list: {before} before, {site} now");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
