//! Shiny apps: Shiny's own examples in a real headless Chromium, through valve.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::harness::{need_browser, need_program, pid_alive, shiny_example, wait_until, Valve};

pub(crate) fn browser_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser")
}

/// Runs tests/browser/shiny.mjs and returns its output, failing the test if it fails.
fn drive(mode: &str, valve: &Valve, extra: &[&str]) -> String {
    need_browser();
    let url = &valve.url;
    let out = Command::new("node")
        .env("VALVE_ADMIN", valve.admin_url())
        .env("VALVE_ADMIN_TOKEN", valve.token())
        .arg("shiny.mjs")
        .arg(mode)
        .arg(url)
        .args(extra)
        .current_dir(browser_dir())
        .output()
        .expect("node runs (install nodejs and Debian's chromium; `npm ci` in tests/browser)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("[shiny.mjs {mode}] {text}");
    assert!(out.status.success(), "the {mode} check failed in Chromium: {text}");
    text
}

#[test]
fn hello_renders_its_plot_and_rerenders_on_input() {
    let valve = Valve::start(&["-f", &shiny_example("01_hello")]);
    let seen = drive("hello", &valve, &[]);
    assert!(seen.contains("\"rerendered\":true"));
    valve.wait_for_log("path=/websocket/ http=1.1 status=101", Duration::from_secs(5));
}

#[test]
fn a_browser_cannot_name_itself_a_shiny_user() {
    let app = crate::harness::fixture("shiny_whoami");
    let valve = Valve::start(&["-f", app.to_str().unwrap()]);
    let seen = drive("whoami", &valve, &[]);
    assert!(
        seen.contains(r#""who":"user=NULL;groups=NULL;addr=127.0.0.1""#),
        "Shiny saw a user the browser named: {seen}"
    );
}

#[test]
fn six_upload_sessions_spread_over_three_workers_each_see_their_own_table() {
    // Two sessions per worker: valve grows the pool from one worker as sessions arrive.
    let valve = Valve::start(&["-f", &shiny_example("09_upload"), "-n", "3", "--max-sessions", "2", "--no-access-log"]);
    let seen = drive("upload", &valve, &["6"]);
    assert!(seen.contains("\"uploads\":6"), "{seen}");
    assert!(seen.contains("\"sessions\":[2,2,2]"), "sessions per worker: {seen}");
    assert_eq!(valve.workers().len(), 3);
}

#[test]
fn downloads_arrive_whole() {
    let valve = Valve::start(&["-f", &shiny_example("10_download"), "--no-access-log"]);
    let seen = drive("download", &valve, &[]);
    assert!(seen.contains("\"filename\":\"rock.csv\""), "{seen}");
    assert!(seen.contains("\"lines\":49"), "48 rows and a header: {seen}");
}

#[test]
fn a_reload_survives_the_death_of_the_sessions_worker() {
    need_browser();
    let valve = Valve::start(&["-f", &shiny_example("01_hello"), "--no-access-log"]);
    let mut node = Command::new("node")
        .args(["shiny.mjs", "survive", &valve.url])
        .current_dir(browser_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("node runs");
    let mut lines = BufReader::new(node.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a line from the browser").unwrap();
    assert!(first.contains("\"ready\":true"), "{first}");
    let victim = valve.workers()[0];
    unsafe { libc::kill(victim as i32, libc::SIGKILL) };
    wait_until("the session's worker to die", Duration::from_secs(5), || !pid_alive(victim));
    node.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = node.wait().unwrap();
    assert!(status.success() && rest.iter().any(|l| l.contains("\"survived\":true")), "{rest:?}");
    assert!(!valve.workers().contains(&victim));
}

#[test]
fn a_page_asked_for_as_its_worker_dies_is_served_by_another() {
    // The worker takes the connection and dies before answering (stopped, then
    // killed, so the race the page load meets in real life happens every time):
    // the page load must get the app from a new worker, not a 502.
    need_program("curl", "curl");
    let valve = Valve::start(&["-f", &shiny_example("01_hello"), "--no-access-log"]);
    let victim = valve.workers()[0];
    // What valve counts as sent to the worker (a page load is no pool lease: `busy` stays 0).
    let served = || {
        let status = valve.status();
        status["workers"].as_array().and_then(|w| w.iter().find(|w| w["pid"] == victim)?["requests"].as_u64())
    };
    let before = served().expect("the worker in the status");
    unsafe { libc::kill(victim as i32, libc::SIGSTOP) };
    let curl = Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}", "--max-time", "30", &valve.get("/")])
        .stdout(Stdio::piped())
        .spawn()
        .expect("curl runs");
    wait_until("the page load handed to the stopped worker", Duration::from_secs(10), || {
        served().is_some_and(|n| n > before)
    });
    unsafe { libc::kill(victim as i32, libc::SIGKILL) };
    let out = curl.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.ends_with("\n200") && text.contains("shiny"), "{text}\n{}", valve.log());
    valve.wait_for_log("worker failed while handling a request", Duration::from_secs(5));
    assert!(!valve.workers().contains(&victim));
}

#[test]
fn sessions_are_counted_in_metrics_and_status() {
    let valve = Valve::start(&["-f", &shiny_example("01_hello"), "--no-access-log"]);
    drive("hello", &valve, &[]);
    let metrics =
        Command::new("curl").args(["-s", "-H", &valve.bearer(), &valve.admin("/__valve__/metrics")]).output().unwrap();
    let text = String::from_utf8_lossy(&metrics.stdout);
    assert!(text.contains("valve_shiny_sessions_opened_total{app=\"01_hello\"} 1"), "{text}");
}

/// The pid of the worker that served a page of the `shiny_hang` fixture.
fn served_by(page: &str) -> u32 {
    page.split("served by ")
        .nth(1)
        .and_then(|r| r.split('<').next())
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no pid in the page: {page}"))
}

fn get(url: &str) -> (u16, String) {
    let out = Command::new("curl").args(["-s", "--max-time", "60", "-w", "\n%{http_code}", url]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.parse().unwrap_or(0), body.to_string())
}

#[test]
fn a_shiny_worker_past_request_timeout_is_replaced() {
    need_program("curl", "curl");
    let app = crate::harness::fixture("shiny_hang");
    // Placement by session count: both page loads (new browsers, one right
    // after the other) go to the first worker, whatever its R is doing.
    let valve = Valve::start(&["-f", app.to_str().unwrap(), "--request-timeout", "2", "--busy-threshold", "0"]);
    let (_, page) = get(&valve.get("/"));
    let first = served_by(&page);
    let start = std::time::Instant::now();
    let (status, body) = get(&valve.get("/?hang=1"));
    assert_eq!(status, 504, "{body}");
    assert!(start.elapsed() < Duration::from_secs(10), "504 after {:?}", start.elapsed());
    wait_until("the stuck worker replaced", Duration::from_secs(15), || !pid_alive(first));
    let (status, page) = get(&valve.get("/"));
    assert_eq!(status, 200, "a fresh worker serves the app");
    assert_ne!(served_by(&page), first);
}

#[test]
fn a_shiny_worker_past_max_requests_takes_no_new_browsers_and_then_stops() {
    need_program("curl", "curl");
    let app = crate::harness::fixture("shiny_hang");
    // Placement by session count: the first three page loads (new browsers in
    // quick succession) go to the first worker, not to a new one each.
    let valve = Valve::start(&["-f", app.to_str().unwrap(), "--max-requests", "3", "-n", "2", "--busy-threshold", "0"]);
    let pids: Vec<u32> = (0..3).map(|_| served_by(&get(&valve.get("/")).1)).collect();
    assert!(pids.iter().all(|p| *p == pids[0]), "three page loads on the first worker: {pids:?}");
    let (status, page) = get(&valve.get("/"));
    assert_eq!(status, 200);
    assert_ne!(served_by(&page), pids[0], "a worker past --max-requests takes no new browser");
    wait_until("the spent worker to stop once quiet", Duration::from_secs(20), || !pid_alive(pids[0]));
    valve.wait_for_log("drained", Duration::from_secs(5));
}

#[test]
fn page_loads_that_never_open_a_session_lock_no_visitor_out() {
    need_program("curl", "curl");
    let valve = Valve::start(&["-f", &shiny_example("01_hello"), "-n", "1", "--max-sessions", "2", "--no-access-log"]);
    for _ in 0..40 {
        assert_eq!(get(&valve.get("/")).0, 200);
    }
    let start = std::time::Instant::now();
    assert_eq!(get(&valve.get("/")).0, 200, "a new visitor still gets the app");
    assert!(start.elapsed() < Duration::from_secs(3), "at once, not after a lock-out: {:?}", start.elapsed());
}

#[test]
fn a_forged_sticky_cookie_names_no_worker() {
    need_program("curl", "curl");
    let valve = Valve::start(&["-f", &shiny_example("01_hello"), "-n", "2", "--n-min", "2"]);
    let set_cookie = |cookie: Option<&str>| -> Option<String> {
        let mut args = vec!["-s", "-D", "-", "-o", "/dev/null"];
        let header = cookie.map(|c| format!("Cookie: valve_worker={c}"));
        if let Some(h) = &header {
            args.extend(["-H", h.as_str()]);
        }
        let url = valve.get("/");
        args.push(&url);
        let out = Command::new("curl").args(&args).output().unwrap();
        let headers = String::from_utf8_lossy(&out.stdout).to_string();
        headers.lines().find_map(|l| {
            let l = l.trim();
            l.to_lowercase()
                .starts_with("set-cookie: valve_worker=")
                .then(|| l["set-cookie: valve_worker=".len()..].split(';').next().unwrap().to_string())
        })
    };
    let real = set_cookie(None).expect("a new browser gets a sticky cookie");
    assert_eq!(set_cookie(Some(&real)), None, "a real cookie is honoured");
    // The same cookie edited to name the other worker (1 <-> 2), field by field.
    let fields: Vec<&str> = real.split('.').collect();
    let mut forged = 0;
    for (i, f) in fields.iter().enumerate() {
        let other = match *f {
            "1" => "2",
            "2" => "1",
            _ => continue,
        };
        let mut edited = fields.clone();
        edited[i] = other;
        let edited = edited.join(".");
        assert!(set_cookie(Some(&edited)).is_some(), "the forged cookie {edited} was honoured");
        forged += 1;
    }
    assert!(forged > 0, "the cookie {real} names a worker");
}

#[test]
fn a_websocket_upgrade_with_a_malformed_key_never_reaches_r() {
    need_program("curl", "curl");
    let valve = Valve::start(&["-f", &shiny_example("01_hello")]);
    let out = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "10",
            "-H",
            "Connection: Upgrade",
            "-H",
            "Upgrade: websocket",
            "-H",
            "Sec-WebSocket-Version: 13",
            "-H",
            "Sec-WebSocket-Key: not-a-key",
            &valve.get("/websocket/"),
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "400");
    valve.wait_for_log("path=/websocket/", Duration::from_secs(5));
    let line = valve.log().lines().find(|l| l.contains("path=/websocket/")).unwrap().to_string();
    assert!(line.contains("status=400") && !line.contains("worker="), "answered by valve, no worker involved: {line}");
}
