//! The pool: one request per worker, queueing at --n-max, growth on demand and
//! shrinking back to --n-min.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::harness::{client, example, fixture, wait_until, Valve};

/// Sends `n` concurrent requests to `path` and returns the worker pids that
/// answered, and how long the whole batch took.
async fn burst(valve: &Valve, path: &str, n: usize) -> (Vec<u64>, Duration) {
    let start = Instant::now();
    let calls = (0..n).map(|_| {
        let url = valve.get(path);
        async move {
            let resp = client().get(url).send().await.unwrap();
            assert_eq!(resp.status(), 200);
            let v: serde_json::Value = resp.json().await.unwrap();
            v["pid"][0].as_u64().unwrap()
        }
    });
    let pids = futures::future::join_all(calls).await;
    (pids, start.elapsed())
}

#[tokio::test(flavor = "multi_thread")]
async fn five_slow_calls_run_side_by_side() {
    let valve = Valve::start(&["-f", fixture("api.R").to_str().unwrap(), "-n", "5"]);
    // The first burst grows the pool from 1 to 5 workers.
    burst(&valve, "/sleep?zzz=0.1", 5).await;
    wait_until("five workers", Duration::from_secs(30), || valve.log().matches("worker ready").count() == 5);
    let (pids, took) = burst(&valve, "/sleep?zzz=1", 5).await;
    assert_eq!(pids.iter().collect::<BTreeSet<_>>().len(), 5, "each call had a worker of its own: {pids:?}");
    assert!(took < Duration::from_secs(2), "5 concurrent 1 s sleeps took {took:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_queue_when_n_max_is_reached() {
    let valve = Valve::start(&["-f", fixture("api.R").to_str().unwrap(), "-n", "2", "--n-min", "2"]);
    let (pids, took) = burst(&valve, "/sleep?zzz=1", 4).await;
    assert_eq!(pids.iter().collect::<BTreeSet<_>>().len(), 2, "never more than n_max workers: {pids:?}");
    assert!(took >= Duration::from_millis(1900), "4 sleeps on 2 workers queue in two rounds, took {took:?}");
    assert!(took < Duration::from_secs(4), "queued requests go as soon as a worker frees up, took {took:?}");
    assert_eq!(valve.workers().len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_busy_worker_never_gets_a_second_request() {
    let valve = Valve::start(&["-f", fixture("api.R").to_str().unwrap(), "-n", "1"]);
    let slow = tokio::spawn({
        let url = valve.get("/sleep?zzz=1");
        async move { client().get(url).send().await.unwrap().status() }
    });
    valve.wait_for_requests(1, 0);
    let start = Instant::now();
    let fast = client().get(valve.get("/pid")).send().await.unwrap();
    assert_eq!(fast.status(), 200);
    assert!(start.elapsed() >= Duration::from_millis(600), "the fast call waited for the only worker");
    assert_eq!(slow.await.unwrap(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn pool_shrinks_back_to_n_min_after_max_age() {
    let valve = Valve::start(&[
        "-f",
        example().to_str().unwrap(),
        "-n",
        "3",
        "--n-min",
        "1",
        "--check-unused",
        "0.2",
        "--max-age",
        "1",
    ]);
    burst(&valve, "/sleep?zzz=0.5", 3).await;
    wait_until("the pool to grow under load", Duration::from_secs(30), || {
        valve.log().matches("worker ready").count() == 3
    });
    wait_until("the pool to shrink to n_min", Duration::from_secs(15), || valve.workers().len() == 1);
    valve.wait_for_log("unused for longer than --max-age", Duration::from_secs(5));
    // It still serves after shrinking.
    assert_eq!(client().get(valve.get("/echo?msg=hi")).send().await.unwrap().status(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn worker_output_reaches_the_log_with_its_id() {
    let valve = Valve::start(&["-f", fixture("api.R").to_str().unwrap()]);
    client().get(valve.get("/print?marker=m42")).send().await.unwrap();
    valve.wait_for_log("stdout-marker: m42", Duration::from_secs(5));
    valve.wait_for_log("stderr-marker: m42", Duration::from_secs(5));
    let line = valve.log().lines().find(|l| l.contains("stderr-marker: m42")).unwrap().to_string();
    assert!(line.contains("worker=1"), "{line}");
}

/// valve's threads now (`/proc/PID/task`).
fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.count()).unwrap_or(0)
}

/// A site of `n` plumber APIs, the last with a name too long for a table.
fn site_of(n: usize) -> tempfile::TempDir {
    let site = tempfile::tempdir().unwrap();
    for i in 1..=n {
        let name = if i == n && n > 1 {
            "a-very-long-application-name-for-the-quarterly-sales-dashboard-2024".to_string()
        } else {
            format!("api{i}")
        };
        std::fs::create_dir(site.path().join(&name)).unwrap();
        std::fs::write(
            site.path().join(&name).join("plumber.R"),
            "#* @get /echo\nfunction(msg = '') list(msg = msg)\n",
        )
        .unwrap();
    }
    site
}

#[tokio::test(flavor = "multi_thread")]
async fn two_hundred_apps_scaled_to_zero_take_no_thread_each_and_check_lists_them_readably() {
    let (one, many) = (site_of(1), site_of(200));
    let flags = |site: &tempfile::TempDir| {
        vec!["--site".to_string(), site.path().to_str().unwrap().to_string(), "--n-min".into(), "0".into()]
    };

    // --check: a short summary line, a row per app within a terminal's width, counts by kind.
    let out =
        std::process::Command::new(crate::harness::valve_bin()).args(flags(&many)).arg("--check").output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = said.lines().collect();
    assert!(lines[0].contains("200 app(s)") && lines[0].chars().count() < 120, "one short summary: {}", lines[0]);
    let rows: Vec<&str> = lines.iter().copied().filter(|l| l.contains("plumber-dir  0-3")).collect();
    assert_eq!(rows.len(), 200, "a row per app:\n{said}");
    assert!(lines.iter().all(|l| l.chars().count() <= 160), "every line fits a terminal:\n{said}");
    let long = rows.iter().find(|r| r.contains('…')).expect("the long name, shortened");
    assert!(long.contains("a-very-long-ap") && long.contains("dashboard-2024"), "both ends kept: {long}");
    assert!(said.contains("200 apps: 200 plumber-dir; 0 R workers at start"), "{said}");

    // Threads: one app's, plus at most 4, for 200 apps that run no R.
    let mut args: Vec<String> = flags(&one);
    args.extend(["-w", "2", "--no-access-log"].map(String::from));
    let small = Valve::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let mut args: Vec<String> = flags(&many);
    args.extend(["-w", "2", "--no-access-log"].map(String::from));
    let big = Valve::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(big.ready["apps"].as_array().map(Vec::len), Some(200));
    assert!(big.workers().is_empty(), "scaled to zero: no worker");
    assert!(big.r_processes().len() <= 1, "no R but the warm parent, shared by every app");
    // Threads tokio's blocking pool started for the start-up's file reads end when idle.
    wait_until("valve's threads for 200 apps to be one app's + 4 at most", Duration::from_secs(30), || {
        threads(big.pid()) <= threads(small.pid()) + 4
    });
    let first = client().get(big.get("/api7/echo?msg=x")).send().await.unwrap();
    assert_eq!(first.status(), 200, "an app of the 200 starts on its first request");
    wait_until("still one app's threads + 4 with one worker started", Duration::from_secs(30), || {
        threads(big.pid()) <= threads(small.pid()) + 4
    });
}
