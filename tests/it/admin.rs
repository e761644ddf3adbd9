//! valve's own pages: health, readiness, Prometheus metrics, status and the
//! live dashboard (in a real headless Chromium).

use std::collections::HashMap;
use std::time::Duration;

use crate::harness::{client, closed_port, example, fixture, wait_until, Valve};

/// Scrapes `/__valve__/metrics` with a real Prometheus text-format parser.
async fn scrape(valve: &Valve) -> prometheus_parse::Scrape {
    let base = valve.admin_url();
    let text =
        valve.admin_client().get(format!("{base}/__valve__/metrics")).send().await.unwrap().text().await.unwrap();
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("valid Prometheus text format")
}

/// The value of one sample, found by metric name and labels.
fn value(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    let want: HashMap<&str, &str> = labels.iter().copied().collect();
    let sample = scrape
        .samples
        .iter()
        .find(|s| s.metric == name && want.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .unwrap_or_else(|| panic!("no sample {name} {labels:?}"));
    match &sample.value {
        prometheus_parse::Value::Counter(v)
        | prometheus_parse::Value::Gauge(v)
        | prometheus_parse::Value::Untyped(v) => *v,
        prometheus_parse::Value::Histogram(buckets) => buckets.last().map(|b| b.count).unwrap_or(0.0),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_match_the_traffic_sent() {
    let valve = Valve::start(&["-f", fixture("api.R").to_str().unwrap(), "--max-body-size", "1KB"]);
    let c = client();
    for _ in 0..7 {
        assert_eq!(c.get(valve.get("/pid")).send().await.unwrap().status(), 200);
    }
    for _ in 0..3 {
        assert_eq!(c.get(valve.get("/no/such/route")).send().await.unwrap().status(), 404);
    }
    for _ in 0..2 {
        assert_eq!(c.post(valve.get("/size")).body(vec![0u8; 4096]).send().await.unwrap().status(), 413);
    }
    let m = scrape(&valve).await;
    assert_eq!(value(&m, "valve_requests_total", &[("method", "GET"), ("status", "200")]), 7.0);
    assert_eq!(value(&m, "valve_requests_total", &[("method", "GET"), ("status", "404")]), 3.0);
    assert_eq!(value(&m, "valve_requests_total", &[("method", "POST"), ("status", "413")]), 2.0);
    assert_eq!(value(&m, "valve_request_duration_seconds_count", &[]), 12.0);
    assert_eq!(value(&m, "valve_queue_wait_seconds_count", &[]), 10.0, "413s never queue");
    assert_eq!(value(&m, "valve_rejected_requests_total", &[("reason", "body_too_large")]), 2.0);
    assert_eq!(value(&m, "valve_workers", &[("state", "idle")]), 1.0);
    assert_eq!(value(&m, "valve_workers", &[("state", "busy")]), 0.0);
    assert_eq!(value(&m, "valve_queue_depth", &[]), 0.0);
    assert_eq!(value(&m, "valve_worker_spawn_duration_seconds_count", &[]), 1.0);
    assert_eq!(value(&m, "valve_worker_exits_total", &[("reason", "crashed")]), 0.0);
    // valve's own pages are not counted as API traffic.
    let m = scrape(&valve).await;
    assert_eq!(value(&m, "valve_request_duration_seconds_count", &[]), 12.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn status_lists_every_worker_and_the_configuration() {
    let valve = Valve::start(&["-f", example().to_str().unwrap(), "-n", "4", "--n-min", "2"]);
    assert_eq!(client().get(valve.get("/__valve__/healthz")).send().await.unwrap().status(), 200);
    assert_eq!(client().get(valve.get("/__valve__/readyz")).send().await.unwrap().status(), 200);
    // Each worker's task samples its memory once it is ready.
    wait_until("every worker's memory sampled", Duration::from_secs(10), || {
        valve.status()["workers"].as_array().is_some_and(|w| w.iter().all(|w| w["memory_bytes"].is_u64()))
    });
    let status: serde_json::Value =
        valve.admin_client().get(valve.admin("/__valve__/status")).send().await.unwrap().json().await.unwrap();
    let mut pids: Vec<u64> = status["workers"].as_array().unwrap().iter().map(|w| w["pid"].as_u64().unwrap()).collect();
    pids.sort();
    let mut real: Vec<u64> = valve.workers().into_iter().map(u64::from).collect();
    real.sort();
    assert_eq!(pids, real, "status shows the real worker pids");
    assert_eq!(status["config"]["n_max"], 4);
    assert_eq!(status["pool"]["idle"], 2);
    // A plain worker reports its RSS; a fork (--preload) only what it does not share.
    assert!(status["workers"][0]["memory_bytes"].as_u64().unwrap() > 1 << 20, "{status}");
    let resp = valve.admin_client().get(valve.admin("/__valve__/nope")).send().await.unwrap();
    assert_eq!(resp.status(), 404, "unknown valve paths are not forwarded to R");
}

#[tokio::test(flavor = "multi_thread")]
async fn readiness_flips_during_drain_on_a_separate_admin_port() {
    // Port 0: valve binds a free port itself and says which in its ready line.
    let mut valve = Valve::start(&["-f", fixture("api.R").to_str().unwrap(), "--admin-addr", "127.0.0.1:0"]);
    let admin = valve.admin_url();
    assert_ne!(admin, valve.url, "a separate admin listener");
    assert_eq!(client().get(format!("{admin}/__valve__/readyz")).send().await.unwrap().status(), 200);
    assert_eq!(
        client().get(valve.get("/__valve__/readyz")).send().await.unwrap().status(),
        200,
        "readiness is on the main port too, for load balancers"
    );
    assert_eq!(
        client().get(valve.get("/__valve__/status")).send().await.unwrap().status(),
        404,
        "status is on the admin listener only"
    );
    let slow = tokio::spawn({
        let url = valve.get("/sleep?zzz=1.5");
        async move { client().get(url).send().await.unwrap().status() }
    });
    valve.wait_for_requests(1, 0);
    valve.signal(libc::SIGTERM);
    wait_until("readyz to say draining", Duration::from_secs(2), || {
        let r = std::process::Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", &format!("{admin}/__valve__/readyz")])
            .output()
            .unwrap();
        String::from_utf8_lossy(&r.stdout) == "503"
    });
    let health = client().get(format!("{admin}/__valve__/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200, "liveness holds while draining");
    assert_eq!(slow.await.unwrap(), 200);
    assert_eq!(valve.wait_exit(Duration::from_secs(10)).code(), Some(0));
}

#[tokio::test(flavor = "multi_thread")]
async fn access_log_lines_carry_method_path_status_and_worker() {
    let valve = Valve::start(&["-f", fixture("api.R").to_str().unwrap()]);
    client().get(valve.get("/pid?secret=hunter2")).send().await.unwrap();
    valve.wait_for_log("path=/pid", Duration::from_secs(5));
    let line = valve.log().lines().find(|l| l.contains("path=/pid")).unwrap().to_string();
    for field in ["method=GET", "status=200", "duration_ms=", "queue_ms=", "worker=1"] {
        assert!(line.contains(field), "{field} in {line}");
    }
    assert!(!valve.log().contains("hunter2"), "query strings are not logged");

    let quiet = Valve::start(&["-f", fixture("api.R").to_str().unwrap(), "--no-access-log", "--log-format", "json"]);
    client().get(quiet.get("/pid")).send().await.unwrap();
    // An access line is logged before its answer is sent, and the log keeps
    // order: once what R printed for a later request is in, so would it be.
    client().get(quiet.get("/print?marker=after-pid")).send().await.unwrap();
    quiet.wait_for_log("stderr-marker: after-pid", Duration::from_secs(5));
    assert!(!quiet.log().contains("valve::access"), "the access log can be turned off");
    let first_json =
        quiet.log().lines().find(|l| l.starts_with('{')).map(|l| serde_json::from_str::<serde_json::Value>(l).is_ok());
    assert_eq!(first_json, Some(true), "--log-format json writes JSON lines");
}

#[tokio::test(flavor = "multi_thread")]
async fn dashboard_shows_every_worker_and_updates_live_in_chromium() {
    crate::harness::need_browser();
    let valve = Valve::start(&["-f", example().to_str().unwrap(), "-n", "3", "--n-min", "3"]);
    let pids: Vec<String> = valve.workers().iter().map(|p| p.to_string()).collect();
    assert_eq!(pids.len(), 3);
    let browser_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    let shot = std::env::temp_dir().join(format!("valve-dashboard-{}.png", std::process::id()));
    let mut args = vec!["dashboard.mjs".to_string(), valve.url.clone(), shot.display().to_string()];
    args.extend(pids);
    let out = tokio::process::Command::new("node")
        .args(&args)
        .env("VALVE_ADMIN", valve.admin_url())
        .env("VALVE_ADMIN_TOKEN", valve.token())
        .current_dir(&browser_dir)
        .output()
        .await
        .expect("node runs (install nodejs, then `npm ci` in tests/browser, and Debian's chromium)");
    eprintln!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the dashboard check failed in Chromium");
    assert!(std::fs::metadata(&shot).map(|m| m.len() > 10_000).unwrap_or(false), "a screenshot was taken");
    if let Ok(dest) = std::env::var("VALVE_DASHBOARD_SCREENSHOT") {
        let _ = std::fs::copy(&shot, dest);
    }
    let _ = std::fs::remove_file(shot);
}

#[tokio::test(flavor = "multi_thread")]
async fn drain_delay_keeps_serving_while_readiness_says_503() {
    let mut valve = Valve::start(&["-f", fixture("api.R").to_str().unwrap(), "--drain-delay", "2"]);
    valve.signal(libc::SIGTERM);
    let signalled = std::time::Instant::now();
    wait_until("readyz to say 503", Duration::from_secs(1), || {
        let r = std::process::Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", &valve.get("/__valve__/readyz")])
            .output()
            .unwrap();
        String::from_utf8_lossy(&r.stdout) == "503"
    });
    // Still accepting and serving during the delay, each answer closing its connection.
    let resp = client().get(valve.get("/pid")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["connection"], "close");
    assert!(signalled.elapsed() < Duration::from_secs(2), "checked within the delay");
    assert_eq!(valve.wait_exit(Duration::from_secs(10)).code(), Some(0));
    assert!(signalled.elapsed() >= Duration::from_millis(1900), "the drain waited for --drain-delay");
}

#[test]
fn healthcheck_mode_says_whether_a_valve_answers() {
    let valve = Valve::start(&["-f", fixture("api.R").to_str().unwrap()]);
    let ok = std::process::Command::new(crate::harness::valve_bin())
        .args(["--healthcheck", &valve.get("/__valve__/healthz")])
        .output()
        .unwrap();
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stderr));
    let port = valve.ready["port"].to_string();
    let by_port = std::process::Command::new(crate::harness::valve_bin())
        .args(["--healthcheck", "--port", &port])
        .output()
        .unwrap();
    assert_eq!(by_port.status.code(), Some(0), "the default URL is valve's own healthz on --port");
    let (_held, closed) = closed_port();
    let closed = closed.to_string();
    let bad = std::process::Command::new(crate::harness::valve_bin())
        .args(["--healthcheck", "--port", &closed])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(1));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("cannot connect") && err.contains(&closed), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn valves_own_path_without_its_slash_never_reaches_r() {
    let valve = Valve::start(&["-f", fixture("api.R").to_str().unwrap()]);
    let resp = valve.admin_client().get(valve.admin("/__valve__")).send().await.unwrap();
    assert_eq!(resp.status(), 307, "redirected to the dashboard");
    assert_eq!(resp.headers()["location"], "/__valve__/");
    let main = client().get(valve.get("/__valve__")).send().await.unwrap();
    assert_eq!(main.status(), 404);
    assert!(main.text().await.unwrap().contains("--admin-addr"), "valve's own answer, not plumber's");
    // The access log keeps order: once a later request's line is in, so would this one be.
    client().get(valve.get("/pid")).send().await.unwrap();
    valve.wait_for_log("path=/pid", Duration::from_secs(5));
    assert!(!valve.log().contains("path=/__valve__"), "not logged as API traffic");
}

#[test]
fn the_admin_listener_cuts_off_clients_that_never_finish_their_headers() {
    use std::io::{Read, Write};
    let valve = Valve::start(&[
        "-f",
        fixture("api.R").to_str().unwrap(),
        "--admin-addr",
        "127.0.0.1:0",
        "--header-timeout",
        "1",
    ]);
    let mut s = std::net::TcpStream::connect(valve.admin_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /__valve__/healthz HTTP/1.1\r\nHost: x\r\n").unwrap();
    let start = std::time::Instant::now();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    assert!(start.elapsed() < Duration::from_secs(4), "cut off after --header-timeout, took {:?}", start.elapsed());
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_carry_build_info_process_and_worker_memory() {
    let valve = Valve::start(&["-f", fixture("api.R").to_str().unwrap(), "-n", "2", "--n-min", "2"]);
    // Each worker's memory is sampled by its own task once it is ready.
    wait_until("worker memory sampled", Duration::from_secs(10), || {
        let out = std::process::Command::new("curl")
            .args(["-s", "-H", &valve.bearer(), &valve.admin("/__valve__/metrics")])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).matches("valve_worker_memory_bytes{").count() == 2
    });
    let m = scrape(&valve).await;
    assert_eq!(value(&m, "valve_build_info", &[("version", env!("CARGO_PKG_VERSION"))]), 1.0);
    assert!(value(&m, "process_resident_memory_bytes", &[]) > 1e6);
    assert!(value(&m, "process_open_fds", &[]) > 3.0);
    assert!(value(&m, "valve_worker_memory_bytes", &[("app", "api")]) > 1e6, "a plain worker's RSS");
    assert_eq!(value(&m, "valve_saturation", &[("app", "api")]), 0.0);
    assert_eq!(value(&m, "valve_r_processes", &[]), 2.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn status_answers_in_milliseconds_with_big_forked_workers() {
    let valve = Valve::start(&["-f", fixture("preload.R").to_str().unwrap(), "--preload", "-n", "3", "--n-min", "3"]);
    let c = valve.admin_client();
    let mut took = Vec::new();
    for _ in 0..20 {
        let start = std::time::Instant::now();
        let status: serde_json::Value =
            c.get(valve.admin("/__valve__/status")).send().await.unwrap().json().await.unwrap();
        took.push(start.elapsed());
        assert_eq!(status["workers"].as_array().unwrap().len(), 3);
    }
    took.sort();
    let median = took[took.len() / 2];
    // Reading a 200 MB fork's private memory takes milliseconds: never on this path.
    assert!(median < Duration::from_millis(10), "status took {median:?} (median of 20)");
}

#[tokio::test(flavor = "multi_thread")]
async fn valves_pages_are_private_by_default_and_on_the_main_port_only_when_asked() {
    // Two valves with default flags: no fixed admin port for them to fight over.
    let a = Valve::start(&["-f", fixture("api.R").to_str().unwrap()]);
    let b = Valve::start(&["-f", fixture("api.R").to_str().unwrap()]);
    for valve in [&a, &b] {
        let admin = valve.admin_url();
        assert!(admin.starts_with("http://127.0.0.1:"), "the admin listener is on loopback: {admin}");
        assert_ne!(admin, valve.url);
        for page in ["/__valve__/status", "/__valve__/metrics", "/__valve__/"] {
            let main = client().get(valve.get(page)).send().await.unwrap();
            assert_eq!(main.status(), 404, "{page} is not public");
            assert!(main.text().await.unwrap().contains("--admin-addr"), "the 404 says where to look");
            assert_eq!(
                valve.admin_client().get(valve.admin(page)).send().await.unwrap().status(),
                200,
                "{page} on the admin listener"
            );
        }
        for probe in ["/__valve__/healthz", "/__valve__/readyz"] {
            assert_eq!(client().get(valve.get(probe)).send().await.unwrap().status(), 200, "{probe} on the main port");
        }
    }
    assert_ne!(a.admin_url(), b.admin_url());
    let open = Valve::start(&["-f", fixture("api.R").to_str().unwrap(), "--admin-on-main"]);
    assert_eq!(client().get(open.get("/__valve__/status")).send().await.unwrap().status(), 401, "it asks who calls");
    assert_eq!(open.admin_client().get(open.get("/__valve__/status")).send().await.unwrap().status(), 200);
    let none = Valve::start(&["-f", fixture("api.R").to_str().unwrap(), "--admin-addr", "off"]);
    assert!(none.ready["admin_url"].is_null());
    assert_eq!(client().get(none.get("/__valve__/healthz")).send().await.unwrap().status(), 200);
}

/// Polls readyz every few milliseconds until told to stop; returns every
/// answer that was not 200 (a status, or an error).
fn watch_readiness(url: String) -> (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<(usize, Vec<String>)>) {
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let (mut polls, mut bad) = (0, Vec::new());
        while stopped.try_recv().is_err() {
            match client().get(&url).send().await {
                Ok(r) if r.status() == 200 => {}
                Ok(r) => bad.push(r.status().to_string()),
                Err(e) => bad.push(e.to_string()),
            }
            polls += 1;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (polls, bad)
    });
    (stop, task)
}

#[tokio::test(flavor = "multi_thread")]
async fn readiness_holds_while_the_only_worker_is_recycled_or_replaced() {
    // One worker, recycled every 3 requests, then killed from outside: at every
    // moment requests can be served (they wait for the replacement), so a load
    // balancer must not take this valve out.
    let valve = Valve::start(&["-f", fixture("api.R").to_str().unwrap(), "-n", "1", "--max-requests", "3"]);
    let (stop, watcher) = watch_readiness(valve.get("/__valve__/readyz"));
    let watched = std::time::Instant::now();
    let mut pids = std::collections::BTreeSet::new();
    for _ in 0..10 {
        let r = client().get(valve.get("/pid")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        pids.insert(r.json::<serde_json::Value>().await.unwrap()["pid"][0].as_u64().unwrap());
    }
    assert!(pids.len() >= 3, "the worker was recycled every 3 requests: {pids:?}");
    let victim = valve.workers();
    assert_eq!(victim.len(), 1);
    unsafe { libc::kill(victim[0] as i32, libc::SIGKILL) };
    wait_until("a replacement worker", Duration::from_secs(30), || {
        let now = valve.workers();
        now.len() == 1 && now != victim
    });
    let r = client().get(valve.get("/pid")).send().await.unwrap();
    assert_eq!(r.status(), 200, "the replacement serves");
    let _ = stop.send(());
    let (polls, bad) = watcher.await.unwrap();
    // A replacement takes 20-50 ms under --preload and far longer without: one
    // poll per 15 ms lands inside every window (a count alone fails a fast run).
    let elapsed_ms = watched.elapsed().as_millis() as usize;
    assert!(polls * 15 >= elapsed_ms, "readyz was polled often ({polls} times in {elapsed_ms} ms)");
    assert!(bad.is_empty(), "readyz said not ready {} times of {polls}: {bad:?}", bad.len());
}

#[tokio::test(flavor = "multi_thread")]
async fn answers_sent_while_draining_close_their_connection() {
    // A request in flight at SIGTERM, answered after the drain delay, in the drain itself.
    let mut valve = Valve::start(&["-f", fixture("api.R").to_str().unwrap(), "-n", "2", "--drain-delay", "1"]);
    let keep_alive = client();
    let before = keep_alive.get(valve.get("/pid")).send().await.unwrap();
    assert_eq!(before.status(), 200);
    assert!(before.headers().get("connection").is_none_or(|v| v != "close"), "keep-alive before the stop");
    let slow = tokio::spawn({
        let url = valve.get("/sleep?zzz=2.5");
        let c = keep_alive.clone();
        async move {
            let r = c.get(url).send().await.unwrap();
            (r.status(), r.headers().get("connection").map(|v| v.to_str().unwrap().to_string()))
        }
    });
    valve.wait_for_requests(1, 0);
    let signalled = std::time::Instant::now();
    valve.signal(libc::SIGTERM);
    let (status, connection) = slow.await.unwrap();
    assert!(signalled.elapsed() > Duration::from_secs(1), "answered after the delay, while draining");
    assert_eq!(status, 200, "the request in flight completes");
    assert_eq!(connection.as_deref(), Some("close"), "its answer closes the connection");
    assert_eq!(valve.wait_exit(Duration::from_secs(10)).code(), Some(0));
}
