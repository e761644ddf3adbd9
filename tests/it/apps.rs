//! Several apps on one port: a config file, a site folder, one worker budget,
//! prefixes the apps never see, and reloads that drop nothing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::{client, fixture, need_browser, plumber_example, shiny_example, wait_until, Valve};

/// A folder holding `valve.toml` with `text`; `{api}`, `{shiny}` and
/// `{sessions}` stand for the test API, Shiny's 01_hello and plumber's
/// 06-sessions example.
fn config(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let text = text
        .replace("{api}", fixture("api.R").to_str().unwrap())
        .replace("{shiny}", &shiny_example("01_hello"))
        .replace("{sessions}", plumber_example("06-sessions").to_str().unwrap());
    let path = dir.path().join("valve.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

fn start(path: &Path, extra: &[&str]) -> Valve {
    let mut args = vec!["--config", path.to_str().unwrap()];
    args.extend_from_slice(extra);
    Valve::start(&args)
}

async fn get(url: String) -> (u16, String) {
    let resp = crate::harness::get_url(&url).send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

async fn status(valve: &Valve) -> serde_json::Value {
    valve.admin_client().get(valve.admin("/__valve__/status")).send().await.unwrap().json().await.unwrap()
}

const THREE_APPS: &str = r#"
port = 3000
max_workers = 4

[[app]]
name = "sales"
path = "/sales"
file = "{api}"
n_min = 1
n_max = 2

[[app]]
name = "sessions"
path = "/team/sessions"
file = "{sessions}"
n_min = 1
n_max = 1

[[app]]
name = "explorer"
path = "/explorer"
file = "{shiny}"
n_min = 1
n_max = 1
"#;

#[tokio::test(flavor = "multi_thread")]
async fn two_plumber_apis_and_a_shiny_app_share_one_port() {
    let (_dir, path) = config(THREE_APPS);
    let valve = start(&path, &[]);
    let apps = valve.ready["apps"].as_array().unwrap();
    assert_eq!(apps.len(), 3, "the ready line lists every app: {}", valve.ready);

    // Each app sees the paths it sees alone.
    let (code, body) = get(valve.get("/sales/pid")).await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = get(valve.get("/team/sessions/counter")).await;
    assert_eq!(
        (code, body.contains("visit")),
        (200, true),
        "plumber's 06-sessions example under a nested prefix: {body}"
    );
    let (code, page) = get(valve.get("/explorer/")).await;
    assert_eq!(code, 200);
    assert!(page.contains("shiny"), "Shiny's page: {page}");

    // A bare prefix moves to the prefix with a slash; unknown prefixes get valve's JSON 404.
    let resp = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let moved = resp.get(valve.get("/explorer")).send().await.unwrap();
    assert!(moved.status().is_redirection());
    assert_eq!(moved.headers()["location"], "/explorer/");
    let (code, body) = get(valve.get("/nowhere/pid")).await;
    assert_eq!(code, 404);
    assert!(body.contains("\"error\""), "JSON: {body}");
    let (code, _) = get(valve.get("/salesx/pid")).await;
    assert_eq!(code, 404, "a prefix matches whole path segments only");

    // Docs, redirects and cookies stay under the prefix.
    let (code, docs) = get(valve.get("/sales/__docs__/")).await;
    assert_eq!(code, 200);
    assert!(docs.to_lowercase().contains("swagger"), "{docs}");
    let (code, spec) = get(valve.get("/sales/openapi.json")).await;
    assert_eq!(code, 200);
    assert!(spec.contains("\"/pid\""), "the API's own paths in its spec: {spec}");
    let moved = resp.get(valve.get("/sales/moved")).send().await.unwrap();
    assert_eq!(moved.headers()["location"], "/sales/pid", "the app's redirect stays under its prefix");
    let cookies = resp.get(valve.get("/sales/cookies")).send().await.unwrap();
    let set: Vec<&str> = cookies.headers().get_all("set-cookie").iter().map(|v| v.to_str().unwrap()).collect();
    assert_eq!(set.len(), 2, "{set:?}");
    assert!(set.iter().all(|c| c.contains("Path=/sales")), "cookies stay under the prefix: {set:?}");

    // Status, metrics and readiness per app.
    assert_eq!(get(valve.get("/__valve__/readyz")).await.0, 200);
    let s = status(&valve).await;
    let names: Vec<&str> = s["apps"].as_array().unwrap().iter().map(|a| a["name"].as_str().unwrap()).collect();
    assert_eq!(names.len(), 3, "{s}");
    for want in ["sales", "sessions", "explorer"] {
        assert!(names.contains(&want), "{names:?}");
    }
    assert_eq!(s["max_workers"], 4);
    let metrics = get(valve.admin("/__valve__/metrics")).await.1;
    assert!(metrics.contains("app=\"sales\""), "{metrics}");
    assert!(metrics.contains("app=\"explorer\""));
}

#[test]
fn a_shiny_app_works_under_its_prefix_in_a_real_browser() {
    need_browser();
    let (_dir, path) = config(THREE_APPS);
    let valve = start(&path, &[]);
    let out = Command::new("node")
        .env("VALVE_ADMIN", valve.admin_url())
        .env("VALVE_ADMIN_TOKEN", valve.token())
        .args(["shiny.mjs", "hello", &valve.get("/explorer/")])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser"))
        .output()
        .expect("node runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("\"rerendered\":true"), "Shiny under /explorer/ in Chromium: {text}");
    valve.wait_for_log("path=/explorer/websocket/ http=1.1 status=101", Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_worker_budget_holds_across_apps_under_load() {
    let (_dir, path) = config(
        r#"
max_workers = 3
check_unused = 0.5

[[app]]
name = "a"
path = "/a"
file = "{api}"
n_min = 1
n_max = 3

[[app]]
name = "b"
path = "/b"
file = "{api}"
n_min = 1
n_max = 3
"#,
    );
    let valve = Arc::new(start(&path, &[]));
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
    // App a grows into the budget (2 workers, b holds the third)...
    let burst = |app: &'static str, n: usize| {
        let calls: Vec<_> = (0..n).map(|_| tokio::spawn(get(valve.get(&format!("/{app}/sleep?zzz=1"))))).collect();
        async move {
            for c in calls {
                assert_eq!(c.await.unwrap().0, 200);
            }
        }
    };
    burst("a", 3).await;
    assert_eq!(valve.workers().len(), 3, "the budget counts workers (a preload parent is not one)");
    // ... then b needs more: a's idle worker above its n_min gives way.
    burst("b", 3).await;
    valve.wait_for_log("another app needs its place in the worker budget", Duration::from_secs(5));
    // Both at once, twice over: everything is served within the budget.
    let (x, y) = (burst("a", 3), burst("b", 3));
    x.await;
    y.await;
    done.store(true, Ordering::Relaxed);
    watcher.join().unwrap();
    let most = most.load(Ordering::Relaxed);
    assert!(most <= 3, "never more than max_workers R workers: saw {most}");
    assert!(most >= 3, "the budget was used: saw {most}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_app_scales_to_zero_and_back() {
    let (_dir, path) = config(
        r#"
check_unused = 0.3
max_age = 1

[[app]]
name = "always"
path = "/always"
file = "{api}"
n_min = 1

[[app]]
name = "lazy"
path = "/lazy"
file = "{api}"
n_min = 0
n_max = 2
"#,
    );
    let valve = start(&path, &[]);
    assert_eq!(valve.workers().len(), 1, "only the app with n_min = 1 has a worker at start");
    assert_eq!(get(valve.get("/__valve__/readyz")).await.0, 200, "an app at zero is ready");
    let (code, body) = get(valve.get("/lazy/pid")).await;
    assert_eq!(code, 200, "the first request starts a worker: {body}");
    assert_eq!(valve.workers().len(), 2);
    wait_until("the idle app back at zero", Duration::from_secs(15), || valve.workers().len() == 1);
    let (code, _) = get(valve.get("/lazy/pid")).await;
    assert_eq!(code, 200, "and back again");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_site_folder_serves_every_app_in_it_and_lists_them() {
    let site = tempfile::tempdir().unwrap();
    let link = |name: &str, target: &Path| std::os::unix::fs::symlink(target, site.path().join(name)).unwrap();
    let api_dir = site.path().join("api");
    std::fs::create_dir(&api_dir).unwrap();
    std::fs::copy(fixture("api.R"), api_dir.join("plumber.R")).unwrap();
    link("hello", Path::new(&shiny_example("01_hello")));
    link("sessions", &plumber_example("06-sessions"));
    std::fs::create_dir(site.path().join("notes")).unwrap();
    std::fs::write(site.path().join("notes/readme.txt"), "not an app").unwrap();
    let valve = Valve::start(&["--site", site.path().to_str().unwrap(), "--n-min", "1"]);
    let (code, listing) = get(valve.get("/")).await;
    assert_eq!(code, 200);
    for want in ["href=\"/api/\"", "href=\"/hello/\"", "href=\"/sessions/\"", "/api/__docs__/"] {
        assert!(listing.contains(want), "{want} in {listing}");
    }
    assert!(!listing.contains("notes"), "a folder without an app is not listed");
    assert_eq!(get(valve.get("/api/pid")).await.0, 200);
    assert_eq!(get(valve.get("/hello/")).await.0, 200);
    assert_eq!(get(valve.get("/sessions/counter")).await.0, 200);
    valve.wait_for_log("skipping", Duration::from_secs(5));
    assert_eq!(valve.ready["max_workers"], 9, "the apps' --n-max added up");
}

/// A broken config, and what its one problem must say (after `valve.toml:`).
const BROKEN: &[(&str, &str)] = &[
    ("[[app]\nfile = \"{api}\"\n", ":1:"),
    ("[[app]]\nfile = \"missing/plumber.R\"\n", ":2:8: file = \"missing/plumber.R\": app not found"),
    ("[[app]]\npath = \"/a\"\n", ":1:1: app 1 has no `file`"),
    ("[[app]]\nfile = \"{api}\"\npath = \"a\"\n", ":3:8: path = \"a\": must start with `/`"),
    ("[[app]]\nfile = \"{api}\"\nn_min = 3\nn_max = 2\n", ":3:9: n_min = 3 is above n_max = 2"),
    ("[[app]]\nfile = \"{api}\"\nmax_age = \"soon\"\n", ":3:11: max_age = \"soon\": not a number of seconds"),
    ("[[app]]\nfile = \"{api}\"\nn_maxx = 2\n", ":3:1: unknown key `n_maxx` in [[app]] (did you mean `n_max`?)"),
    ("[[app]]\nfile = \"{shiny}\"\nn_max = 0\n", ":3:9: n_max = 0: must be a whole number from 1 to 100000"),
    (
        "[[app]]\nfile = \"{api}\"\npath = \"/x\"\n[[app]]\nname = \"other\"\nfile = \"{api}\"\npath = \"/x/\"\n",
        ":4:1: path `/x` is already served by app `api` (line 1)",
    ),
    (
        "max_workers = 1\n[[app]]\nfile = \"{api}\"\nn_min = 2\nn_max = 2\n",
        ":1:15: the apps' n_min add up to 2, above max_workers = 1",
    ),
    ("[[app]]\nfile = \"{api}\"\nmax_body_size = \"lots\"\n", ":3:17: max_body_size = \"lots\": not a size"),
];

#[test]
fn check_names_the_file_line_and_problem_of_every_broken_config() {
    for (text, want) in BROKEN {
        let (_dir, path) = config(text);
        let out = Valve::run_to_exit(&["--config", path.to_str().unwrap(), "--check"], Duration::from_secs(20));
        assert_eq!(out.status.code(), Some(2), "exit 2 for {text:?}: {}", out.stderr);
        let expected = format!("{}{want}", path.display());
        assert!(out.stderr.contains(&expected), "{expected:?} in:\n{}", out.stderr);
        // Without --check, valve refuses to start with the same message.
        let out = Valve::run_to_exit(&["--config", path.to_str().unwrap()], Duration::from_secs(20));
        assert_eq!(out.status.code(), Some(2));
        assert!(out.stderr.contains(&expected), "{}", out.stderr);
    }
    // All problems of one file at once.
    let (_dir, path) = config("n_maxx = 1\n[[app]]\nfile = \"nope\"\npath = \"x\"\nmax_age = -1\n");
    let out = Valve::run_to_exit(&["--config", path.to_str().unwrap(), "--check"], Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(out.stderr.matches(&*path.display().to_string()).count(), 4, "four problems:\n{}", out.stderr);
    // And a good one.
    let (_dir, path) = config(THREE_APPS);
    let out = Command::new(crate::harness::valve_bin())
        .args(["--config", path.to_str().unwrap(), "--check"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("3 app(s)") && said.contains("sales at /sales"), "{said}");
}

/// The image sets `VALVE_FILE=/app`; `docker run IMAGE --config FILE` must
/// serve the file's apps, not refuse "not several". Two sources given the same
/// way (both flags, both variables) are still refused.
#[test]
fn a_config_on_the_command_line_beats_a_file_from_a_variable_and_two_flags_are_refused() {
    let (_dir, path) = config(THREE_APPS);
    let config = path.to_str().unwrap();
    let api = fixture("api.R");
    let api = api.to_str().unwrap();
    let check = |env: &[(&str, &str)], args: &[&str]| {
        let out = Command::new(crate::harness::valve_bin()).envs(env.iter().copied()).args(args).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, said, err) = check(&[("VALVE_FILE", "/app")], &["--config", config, "--check"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(said.contains("3 app(s)"), "{said}");
    let (code, said, err) = check(&[("VALVE_CONFIG", config)], &["-f", api, "--check"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!said.contains("3 app(s)"), "-f on the command line serves one app: {said}");
    for (env, args) in [
        (vec![], vec!["-f", api, "--config", config, "--check"]),
        (vec![("VALVE_FILE", "/app"), ("VALVE_CONFIG", config)], vec!["--check"]),
    ] {
        let (code, _, err) = check(&env, &args);
        assert_eq!(code, Some(2), "{env:?} {args:?}: {err}");
        assert!(err.contains("use one of -f/--file, --config and --site, not several"), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hostname_routes_before_the_path() {
    let (_dir, path) = config(
        r#"
[[app]]
name = "public"
path = "/"
file = "{api}"
env = { APP_VERSION = "public" }

[[app]]
name = "internal"
path = "/"
hostname = "internal.example.com"
file = "{api}"
env = { APP_VERSION = "internal" }
"#,
    );
    let valve = start(&path, &[]);
    let c = client();
    let via = |host: &'static str| {
        let c = c.clone();
        let url = valve.get("/version");
        async move { c.get(url).header("host", host).send().await.unwrap().text().await.unwrap() }
    };
    assert!(via("internal.example.com:8080").await.contains("\"internal\""));
    assert!(via("INTERNAL.example.com").await.contains("\"internal\""), "host names match without regard to case");
    assert!(via("other.example.com").await.contains("\"public\""));
}

/// Rewrites the config file (the caller reloads, by SIGHUP or POST).
fn rewrite(path: &Path, text: &str) {
    let text = text
        .replace("{api}", fixture("api.R").to_str().unwrap())
        .replace("{shiny}", &shiny_example("01_hello"))
        .replace("{sessions}", plumber_example("06-sessions").to_str().unwrap());
    std::fs::write(path, text).unwrap();
}

async fn post_reload(valve: &Valve) -> (u16, serde_json::Value) {
    let resp = valve.admin_client().post(valve.admin("/__valve__/reload")).send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

fn app_config(apps: &[(&str, &str)]) -> String {
    let mut text = String::from("max_workers = 6\ncheck_unused = 0.5\n");
    for (name, version) in apps {
        text.push_str(&format!(
            "\n[[app]]\nname = \"{name}\"\npath = \"/{name}\"\nfile = \"{{api}}\"\nn_min = 1\nn_max = 2\nenv = {{ APP_VERSION = \"{version}\" }}\n"
        ));
    }
    text
}

#[tokio::test(flavor = "multi_thread")]
async fn reloads_add_change_and_remove_apps_without_failing_a_request() {
    let (_dir, path) = config(&app_config(&[("steady", "1"), ("changing", "1"), ("leaving", "1")]));
    let valve = Arc::new(start(&path, &[]));
    // Requests flow to two apps throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let load = |app: &'static str| {
        let (valve, stop) = (valve.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut ok, mut failed) = (0, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                let (code, body) = get(valve.get(&format!("/{app}/sleep?zzz=0.05"))).await;
                if code == 200 {
                    ok += 1
                } else {
                    failed.push((code, body))
                }
            }
            (ok, failed)
        })
    };
    let steady = load("steady");
    let changing = load("changing");
    let version = |app: &'static str| {
        let valve = valve.clone();
        async move {
            let (_, body) = get(valve.get(&format!("/{app}/version"))).await;
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            v["version"][0].as_str().unwrap_or("").to_string()
        }
    };
    assert_eq!(version("changing").await, "1");

    // Change one app, remove one, add one.
    rewrite(&path, &app_config(&[("steady", "1"), ("changing", "2"), ("arriving", "1")]));
    let (code, plan) = post_reload(&valve).await;
    assert_eq!(code, 200, "{plan}");
    assert_eq!(plan["apps"]["changed"], serde_json::json!(["changing"]));
    assert_eq!(plan["apps"]["removed"], serde_json::json!(["leaving"]));
    assert_eq!(plan["apps"]["added"], serde_json::json!(["arriving"]));
    assert_eq!(plan["apps"]["unchanged"], serde_json::json!(["steady"]));
    let start = Instant::now();
    while version("changing").await != "2" {
        assert!(start.elapsed() < Duration::from_secs(30), "the new version took over");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_until("the added app to serve", Duration::from_secs(30), || {
        std::process::Command::new("curl")
            .args(["-sf", &valve.get("/arriving/pid")])
            .status()
            .is_ok_and(|s| s.success())
    });
    assert_eq!(get(valve.get("/leaving/pid")).await.0, 404, "a removed app is gone");

    // Ten reloads in a row, by SIGHUP, each changing the app again: each
    // rewrite waits until the reload before it has read the file (and logged its plan).
    let plans = || valve.log().lines().filter(|l| l.contains("reloading") && l.contains("unchanged=")).count();
    for i in 3..13 {
        rewrite(&path, &app_config(&[("steady", "1"), ("changing", &i.to_string()), ("arriving", "1")]));
        let before = plans();
        valve.signal(libc::SIGHUP);
        wait_until("the reload to read the configuration", Duration::from_secs(10), || plans() > before);
    }
    let start = Instant::now();
    while version("changing").await != "12" {
        assert!(start.elapsed() < Duration::from_secs(60), "the last reload wins");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Old generations wind down: the budget is back to what the apps hold.
    wait_until("old generations gone", Duration::from_secs(30), || valve.workers().len() <= 6);
    stop.store(true, Ordering::Relaxed);
    for (name, task) in [("steady", steady), ("changing", changing)] {
        let (ok, failed) = task.await.unwrap();
        assert!(
            failed.is_empty(),
            "{name}: {} failed of {}: {:?}",
            failed.len(),
            ok + failed.len(),
            &failed[..failed.len().min(3)]
        );
        assert!(ok > 20, "{name}: requests flowed: {ok}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_version_that_cannot_start_leaves_the_old_one_serving() {
    let (dir, path) = config(&app_config(&[("app", "1")]));
    let valve = start(&path, &[]);
    let broken = dir.path().join("broken.R");
    std::fs::copy(fixture("broken.R"), &broken).unwrap();
    let text =
        std::fs::read_to_string(&path).unwrap().replace(fixture("api.R").to_str().unwrap(), broken.to_str().unwrap());
    std::fs::write(&path, text).unwrap();
    let (code, _) = post_reload(&valve).await;
    assert_eq!(code, 200);
    valve.wait_for_log("the previous version keeps serving", Duration::from_secs(60));
    assert_eq!(get(valve.get("/app/pid")).await.0, 200);
    // A config that fails --check changes nothing and says why.
    std::fs::write(&path, "[[app]]\nfile = 3\n").unwrap();
    let (code, body) = post_reload(&valve).await;
    assert_eq!(code, 400);
    assert!(body["problems"][0].as_str().unwrap().contains("valve.toml:2:8"), "{body}");
    assert_eq!(get(valve.get("/app/pid")).await.0, 200);
    let get_reload = valve.admin_client().get(valve.admin("/__valve__/reload")).send().await.unwrap();
    assert_eq!(get_reload.status(), 405);
}

#[test]
fn a_shiny_session_on_a_changed_app_keeps_working_and_new_browsers_get_the_new_version() {
    use std::io::{BufRead, BufReader, Write};
    need_browser();
    let shiny_app = |version: &str| {
        format!(
            "max_workers = 4\n[[app]]\nname = \"explorer\"\npath = \"/explorer\"\nfile = \"{{shiny}}\"\nenv = {{ APP_VERSION = \"{version}\" }}\n"
        )
    };
    let (_dir, path) = config(&shiny_app("1"));
    let valve = start(&path, &[]);
    let mut node = Command::new("node")
        .args(["shiny.mjs", "keep", &valve.get("/explorer/")])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("node runs");
    let mut out = BufReader::new(node.stdout.take().unwrap()).lines();
    let mut input = node.stdin.take().unwrap();
    assert!(out.next().unwrap().unwrap().contains("\"ready\":true"));
    let status: serde_json::Value = serde_json::from_slice(
        &Command::new("curl")
            .args(["-s", "-H", &valve.bearer(), &valve.admin("/__valve__/status")])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let first: Vec<u32> = status["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["sessions"] == 1)
        .map(|w| w["pid"].as_u64().unwrap() as u32)
        .collect();
    assert_eq!(first.len(), 1, "one worker holds the session: {status}");
    assert!(
        !valve.log().contains("every worker holds"),
        "one browser needs one worker: its sticky cookie works under the prefix\n{}",
        valve.log()
    );
    for version in ["2", "3"] {
        rewrite(&path, &shiny_app(version));
        valve.signal(libc::SIGHUP);
        let before = valve.log().matches("reloaded: the new version serves").count();
        wait_until("the new generation to take over", Duration::from_secs(60), || {
            valve.log().matches("reloaded: the new version serves").count() > before
        });
        writeln!(input, "step").unwrap();
        let line = out.next().unwrap().unwrap();
        assert!(line.contains("\"kept\":true"), "the session on the old generation still works: {line}");
    }
    assert!(first.iter().all(|p| crate::harness::pid_alive(*p)), "the session's worker serves on");
    writeln!(input, "end").unwrap();
    let line = out.next().unwrap().unwrap();
    assert!(line.contains("\"fresh\":true"), "a new browser gets the app: {line}");
    drop(input);
    assert!(node.wait().unwrap().success());
    // Its session closed: the old generations stop once quiet.
    wait_until("the old generations to stop", Duration::from_secs(30), || {
        !first.iter().any(|p| crate::harness::pid_alive(*p))
    });
}

#[test]
fn a_sighup_while_workers_start_never_ends_valve_and_is_applied_once_they_serve() {
    // Orchestrators send SIGHUP whenever a config map changes, with no regard
    // for whether valve has finished starting.
    let dir = tempfile::tempdir().unwrap();
    let api = dir.path().join("slow.R");
    std::fs::write(&api, "Sys.sleep(3)\n\n#* @get /ok\nfunction() \"ok\"\n").unwrap();
    let valve = Valve::start_with_hook(
        &["-f", api.to_str().unwrap(), "--no-access-log"],
        &[],
        Some("starting workers"),
        |pid| unsafe {
            libc::kill(pid as i32, libc::SIGHUP);
        },
    );
    valve.wait_for_log("SIGHUP: reloading", Duration::from_secs(30));
    valve.wait_for_log("unchanged=1", Duration::from_secs(30));
    let (status, _) = tokio::runtime::Runtime::new().unwrap().block_on(get(valve.get("/ok")));
    assert_eq!(status, 200);
}
