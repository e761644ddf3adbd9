//! One site on several valves sharing `publish_dir`, as replicas behind a
//! balancer without affinity share a volume: what one publishes, every one
//! serves; a deployment's task is read from any of them; a rollback on one
//! is served by all; two deployments of one app at once, on two valves,
//! end with one active version served everywhere and nothing half-written;
//! usage counted on one is in the usage list of another.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::harness::{as_root, free_port, need_program, need_r_packages, Valve};
use crate::publish::{deploy_app, follow, get};
use crate::published::{call, create, held_api, publish, site, slow_api, upload};

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
    let (_, three) = upload(&admin_a, ann, &guid, slow_api(3)).await;
    let (_, four) = upload(&admin_b, ann, &guid, slow_api(4)).await;
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

/// HAProxy in front of valves' main ports (`/`) and publishing APIs
/// (their admin listeners), balancing each request round robin with no
/// affinity, set as the manual says for replicas (a refused connection is
/// tried on another valve, and its valve marked down).
struct Balancer {
    child: std::process::Child,
    main: u16,
    publish: u16,
}

impl Balancer {
    fn start(dir: &std::path::Path, valves: &[&Valve]) -> Balancer {
        need_program("haproxy", "haproxy");
        let (main, publish) = (free_port(), free_port());
        let servers = |port_of: &dyn Fn(&Valve) -> String| {
            valves
                .iter()
                .enumerate()
                .map(|(i, v)| format!("    server v{i} {} check\n", port_of(v)))
                .collect::<String>()
        };
        let main_servers =
            servers(&|v: &Valve| v.get("").trim_start_matches("http://").trim_end_matches('/').to_string());
        let admin_servers = servers(&|v: &Valve| v.admin_addr());
        let cfg = dir.join("haproxy.cfg");
        std::fs::write(
            &cfg,
            format!(
                "defaults\n    mode http\n    timeout connect 500ms\n    timeout client 60s\n    timeout server 60s\n    retries 2\n    option redispatch 1\n\
                 frontend main\n    bind 127.0.0.1:{main}\n    default_backend main\n\
                 frontend publish\n    bind 127.0.0.1:{publish}\n    default_backend publish\n\
                 backend main\n    balance roundrobin\n    option httpchk GET /__valve__/readyz\n    default-server inter 1s fastinter 250ms fall 2 rise 2 observe layer4 error-limit 1 on-error mark-down\n{main_servers}\
                 backend publish\n    balance roundrobin\n    default-server inter 1s fastinter 250ms fall 2 rise 2 observe layer4 error-limit 1 on-error mark-down\n{admin_servers}"
            ),
        )
        .unwrap();
        let child = std::process::Command::new("haproxy")
            .args(["-db", "-f", cfg.to_str().unwrap()])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("haproxy starts");
        Balancer { child, main, publish }
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn api_folder(parent: &std::path::Path, version: u32) -> std::path::PathBuf {
    let dir = parent.join(format!("api-source-{version}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("plumber.R"), format!("#* @get /version\nfunction() list(version = {version})\n")).unwrap();
    dir
}

/// Waits until every valve of `valves` answers `/api/version` with `version`.
async fn all_serve(valves: &[&Valve], version: u32, what: &str) {
    let want = format!("{{\"version\":[{version}]}}");
    for v in valves {
        serves(v, &want, what).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn rsconnect_publishes_through_a_balancer_without_affinity_to_three_valves_and_a_valve_killed_mid_publish_costs_nothing_published(
) {
    need_r_packages(&["rsconnect", "plumber"]);
    let docs = "[[app]]\nname = \"docs\"\npath = \"/docs\"\nstatic = \"docs\"\n";
    let (dir, keys) = site("n_max = 2", docs, &[("ci", "")]);
    let w = dir.path();
    let config = w.join("valve.toml");
    let args = ["--config", config.to_str().unwrap()];
    let mut valves: Vec<Valve> = (0..3).map(|_| Valve::start(&args)).collect();
    let lb = Balancer::start(w, &valves.iter().collect::<Vec<_>>());
    let (publish, main) = (format!("http://127.0.0.1:{}", lb.publish), format!("http://127.0.0.1:{}", lb.main));
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(&format!("{main}/__valve__/readyz")).await.0 != 200 {
        assert!(Instant::now() < deadline, "haproxy never answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let home = w.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let key = keys[0].1.clone();
    let deploy = |version: u32| {
        let (home, publish, key, src) = (home.clone(), publish.clone(), key.clone(), api_folder(w, version));
        tokio::task::spawn_blocking(move || deploy_app(&home, &publish, &key, &src, "api", None))
    };

    // Published through the balancer: every call of rsconnect's (and its task polls) on any valve.
    let (ok, said) = deploy(1).await.unwrap();
    assert!(ok && said.contains("successfully deployed"), "{said}");
    all_serve(&valves.iter().collect::<Vec<_>>(), 1, "after the first publish").await;

    // A redeploy under steady load through the balancer fails no request on any valve.
    let stop = Arc::new(AtomicBool::new(false));
    let (served, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut load = Vec::new();
    for _ in 0..4 {
        let (stop, served, failed, url) = (stop.clone(), served.clone(), failed.clone(), format!("{main}/api/version"));
        load.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match get(&url).await {
                    (200, _) => served.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    let (ok, said) = deploy(2).await.unwrap();
    assert!(ok, "{said}");
    all_serve(&valves.iter().collect::<Vec<_>>(), 2, "after the redeploy").await;
    stop.store(true, Ordering::Relaxed);
    for l in load {
        l.await.unwrap();
    }
    let (served, failed) = (served.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    assert!(served > 0 && failed == 0, "{failed} of {} requests failed during the redeploy", served + failed);

    // The valve that runs a deployment is SIGKILLed in its middle.
    let running = deploy(3);
    let started = Instant::now();
    let deploying = loop {
        if let Some(v) = valves.iter().position(|v| v.log().contains("Deploying version 3 of api")) {
            break v;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "no valve started deploying version 3");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let killed = valves.remove(deploying);
    killed.signal(libc::SIGKILL);
    let (_, said) = running.await.unwrap();
    let survivors: Vec<&Valve> = valves.iter().collect();
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(w.join("published/api/app.json")).unwrap()).unwrap();
    let active = record["active"].as_u64().unwrap() as u32;
    assert!(active == 2 || active == 3, "{record}");
    all_serve(&survivors, active, "after a valve died mid-deployment").await;
    // A deployment the client heard succeed is the one the others serve; one it
    // heard stopped left the version before, or the new one if its valve died
    // after recording the switch but before finishing its log (the message says
    // "nothing it had not switched changed").
    if said.contains("successfully deployed") {
        assert_eq!(active, 3, "{record}");
    } else {
        assert!(said.contains("stopped before it ended"), "the client hears why: {said}");
    }
    // A later publish succeeds (the dead valve's lock is broken once stale) and is served by all left.
    let (ok, said) = deploy(4).await.unwrap();
    assert!(ok, "{said}");
    all_serve(&survivors, 4, "after a publish following the kill").await;
    let partial: Vec<String> = std::fs::read_dir(w.join("published/api"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("partial"))
        .collect();
    assert!(partial.is_empty(), "no half-written version: {partial:?}");
    drop(killed);
}

/// `dir` bound read-only onto itself while it lives (root only).
struct ReadOnly(std::path::PathBuf);

impl ReadOnly {
    fn bind(dir: &std::path::Path) -> ReadOnly {
        let run = |args: &[&str]| {
            let out = std::process::Command::new("mount").args(args).output().expect("mount runs");
            assert!(out.status.success(), "mount {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        let d = dir.to_str().unwrap();
        run(&["--bind", d, d]);
        let guard = ReadOnly(dir.to_path_buf());
        run(&["-o", "remount,ro,bind", d]);
        guard
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_valve_on_a_shared_folder_it_cannot_write_serves_what_is_published_and_refuses_changes_saying_why() {
    need_r_packages(&["plumber"]);
    assert!(as_root(), "this test binds a folder read-only: run the tests as root, as CI does");
    let docs = "[[app]]\nname = \"docs\"\npath = \"/docs\"\nstatic = \"docs\"\n";
    let (dir, keys) = site("n_max = 1", docs, &[("ann", "")]);
    let config = dir.path().join("valve.toml");
    let args = ["--config", config.to_str().unwrap()];
    let guid = {
        let a = Valve::start(&args);
        let guid = create(&a.admin_url(), &keys[0].1, "api").await;
        publish(&a.admin_url(), &keys[0].1, &guid, held_api(1)).await;
        guid
    };
    let _ro = ReadOnly::bind(&dir.path().join("published"));
    let b = Valve::start(&args);
    serves(&b, "[1]", "a valve on a read-only publish_dir").await;
    let (code, body) = upload(&b.admin_url(), &keys[0].1, &guid, held_api(2)).await;
    let error = body["error"].as_str().unwrap_or_default();
    assert!(code >= 500 && error.contains("publish_dir"), "{code} {body}");
    assert!(error.contains("Read-only") || error.contains("permission"), "says why: {error}");
    serves(&b, "[1]", "after the refused upload").await;
}
