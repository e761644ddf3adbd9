//! The six kinds on one site (docs/design/engines-quarto-and-site.md): one `--site` folder holding all six kinds of app
//! an R team deploys (a plumber API, a Shiny app, a `runtime: shiny`
//! document, a `shiny_prerendered` tutorial, a `_server.yml` app and a
//! static folder), served by one valve on one port within one worker budget
//! smaller than the apps want, each through real HTTP and the two
//! interactive documents in real Chromium.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::engines::with_engine;
use crate::harness::{fixture, need_r_packages, valve_bin, Valve};
use crate::reconnect::Page;
use crate::rmarkdown::{get, need_rmarkdown, output_with, wait_js};

/// Copies the fixture folder `from` to `to`.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// The six apps, each in its folder, as a team would lay them out.
fn six_kinds(site: &Path) {
    std::fs::create_dir_all(site.join("api")).unwrap();
    std::fs::copy(fixture("api.R"), site.join("api/plumber.R")).unwrap();
    copy_dir(&fixture("shiny_whoami"), &site.join("whoami"));
    copy_dir(&fixture("rmd_shiny"), &site.join("live"));
    copy_dir(&fixture("rmd_tutorial"), &site.join("tutorial"));
    copy_dir(&fixture("engine_app"), &site.join("engine"));
    copy_dir(&fixture("site_docs"), &site.join("docs"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn six_kinds_of_app_are_served_from_one_port_within_one_worker_budget() {
    need_rmarkdown();
    need_r_packages(&["plumber", "shiny"]);
    let root = tempfile::tempdir().unwrap();
    let site = root.path().join("site");
    six_kinds(&site);
    let site_dir = site.to_str().unwrap();
    // Five R apps wanting up to 2 workers each, within a budget of 3.
    let flags = ["--site", site_dir, "--n-min", "0", "-n", "2", "--max-workers", "3", "--no-access-log"];

    let out = Command::new(valve_bin()).args(flags).arg("--check").output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}{}", String::from_utf8_lossy(&out.stderr));
    for kind in [
        "api at /api (plumber-dir,",
        "whoami at /whoami (shiny,",
        "live at /live (shiny-rmd,",
        "tutorial at /tutorial (shiny-prerendered,",
        "engine at /engine (server-yml,",
        "docs at /docs (static, no R)",
    ] {
        assert!(said.contains(kind), "--check names each kind: {kind} in {said}");
    }
    assert!(said.contains("6 app(s), at most 3 R workers"), "{said}");

    let valve = Arc::new(Valve::start_with_env(&flags, &with_engine()));
    assert_eq!(valve.ready["max_workers"], 3);
    let port = valve.ready["port"].clone();
    assert!(valve.ready["apps"]
        .as_array()
        .unwrap()
        .iter()
        .all(|a| a["url"].as_str().unwrap().contains(&format!(":{port}/"))));
    let done = Arc::new(AtomicBool::new(false));
    let most = Arc::new(AtomicUsize::new(0));
    let watcher = {
        let (valve, done, most) = (valve.clone(), done.clone(), most.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                most.fetch_max(valve.workers().len(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };

    // The listing names all six.
    let (_, listing) = get(&valve.get("/"));
    for name in ["api", "whoami", "live", "tutorial", "engine", "docs"] {
        assert!(listing.contains(&format!("href=\"/{name}/\"")), "{name} in {listing}");
    }
    // Static: valve's own files, no R.
    let (status, page) = get(&valve.get("/docs/"));
    assert_eq!(status, 200);
    assert!(page.contains("<h1>Team docs</h1>"), "{page}");
    // The plumber API.
    let (status, body) = get(&valve.get("/api/pid"));
    assert_eq!(status, 200, "{body}");
    let pid: u32 = body.trim_matches(|c: char| !c.is_ascii_digit()).parse().unwrap();
    assert!(valve.workers().contains(&pid), "answered by one of valve's workers: {body}");
    // The _server.yml app, through its engine.
    let (status, body) = get(&valve.get("/engine/hello"));
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (answer["greeting"].as_str(), answer["path"].as_str()),
        (Some("hello from _server.yml"), Some("/hello"))
    );
    // The Shiny app's page.
    let (status, page) = get(&valve.get("/whoami/"));
    assert_eq!(status, 200);
    assert!(page.contains("shiny") && page.contains("shiny-reconnect.js"), "{page}");

    // The runtime: shiny document, knitted for its session, in Chromium.
    let mut browser = Page::open(&valve.get("/live/")).await;
    let typed = wait_js(
        "document.querySelector('#name.shiny-bound-input')",
        "(() => { const el = document.getElementById('name'); el.value = 'six'; \
           el.dispatchEvent(new Event('input', { bubbles: true })); $(el).trigger('change'); return true; })()",
    );
    browser.ask(json!({"op": "eval", "js": typed})).await;
    browser.ask(json!({"op": "eval", "js": output_with("Hello, six!")})).await;
    browser.close().await;

    // The shiny_prerendered tutorial (rendered once at start), in Chromium.
    let mut browser = Page::open(&valve.get("/tutorial/")).await;
    browser.ask(json!({"op": "eval", "js": output_with("square: 9")})).await;
    browser.ask(json!({"op": "eval", "js": "$('#n').data('ionRangeSlider').update({ from: 6 }); true"})).await;
    browser.ask(json!({"op": "eval", "js": output_with("square: 36")})).await;
    browser.close().await;

    // Back to the first ones: the budget moved workers between the apps.
    let (status, _) = get(&valve.get("/api/pid"));
    assert_eq!(status, 200);
    let (status, body) = get(&valve.get("/engine/again"));
    assert_eq!(status, 200, "{body}");
    done.store(true, Ordering::Relaxed);
    watcher.join().unwrap();
    let most = most.load(Ordering::Relaxed);
    assert!(most <= 3, "never more than --max-workers R workers across the six: saw {most}");
    // Logged before the request that needed the place was served.
    valve.wait_for_log("another app needs its place in the worker budget", Duration::from_secs(10));
}
