//! Crashes, hangs, floods and bad input: valve keeps serving, answers clearly
//! and loses nothing.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::harness::{client, fixture, pid_alive, preloading, wait_until, Valve};

fn api() -> String {
    fixture("api.R").to_str().unwrap().to_string()
}

async fn pid_of(valve: &Valve) -> u64 {
    let v: serde_json::Value = client().get(valve.get("/pid")).send().await.unwrap().json().await.unwrap();
    v["pid"][0].as_u64().unwrap()
}

fn json_error(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("error body is JSON ({e}): {body}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn chaos_killing_workers_under_load_fails_no_request() {
    let valve = Valve::start(&["-f", &api(), "-n", "4", "--n-min", "4"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let clients: Vec<_> = (0..4)
        .map(|i| {
            let url = valve.get(if i % 2 == 0 { "/pid" } else { "/sleep?zzz=0.05" });
            tokio::spawn(async move {
                let (mut ok, mut failed) = (0, Vec::new());
                while Instant::now() < deadline {
                    match client().get(&url).send().await {
                        Ok(r) if r.status() == 200 => ok += 1,
                        Ok(r) => failed.push(format!("{} {}", r.status(), r.text().await.unwrap_or_default())),
                        Err(e) => failed.push(e.to_string()),
                    }
                }
                (ok, failed)
            })
        })
        .collect();
    let mut killed = 0;
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    while Instant::now() < deadline - Duration::from_millis(500) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Workers that serve (a worker killed while it starts counts towards crash-loop backoff).
        let status: serde_json::Value =
            valve.admin_client().get(valve.admin("/__valve__/status")).send().await.unwrap().json().await.unwrap();
        let workers: Vec<u32> = status["workers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|w| w["state"] == "idle" || w["state"] == "busy")
            .filter_map(|w| w["pid"].as_u64().map(|p| p as u32))
            .collect();
        // Never the last serving worker: on a slow machine replacements take
        // seconds to start, and a kill a second would otherwise hit the one
        // worker every request (and its one retry) is queued on.
        if workers.len() >= 2 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let victim = workers[(seed % workers.len() as u64) as usize];
            unsafe { libc::kill(victim as i32, libc::SIGKILL) };
            killed += 1;
        }
    }
    let (mut ok, mut failed) = (0, Vec::new());
    for c in clients {
        let (o, f) = c.await.unwrap();
        ok += o;
        failed.extend(f);
    }
    eprintln!("chaos: {ok} requests answered, {killed} workers killed, {} failed", failed.len());
    assert!(killed >= 5, "the chaos actually happened: {killed} workers killed");
    assert!(ok > 30, "load was steady: {ok}");
    assert!(failed.is_empty(), "failed requests: {failed:?}");
    // Workers that had served are replaced at once, not backed off as a crash loop.
    wait_until("the pool back at n_min", Duration::from_secs(10), || valve.workers().len() == 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hung_request_gets_504_and_its_worker_is_replaced() {
    let valve = Valve::start(&["-f", &api(), "-n", "1", "--request-timeout", "1"]);
    let before = pid_of(&valve).await;
    let start = Instant::now();
    let resp = client().get(valve.get("/hang")).send().await.unwrap();
    let took = start.elapsed();
    assert_eq!(resp.status(), 504);
    assert!(took >= Duration::from_millis(950) && took < Duration::from_secs(3), "504 came after {took:?}");
    assert!(json_error(&resp.text().await.unwrap())["error"].as_str().unwrap().contains("--request-timeout"));
    wait_until("the hung worker to die", Duration::from_secs(5), || !pid_alive(before as u32));
    let after = pid_of(&valve).await;
    assert_ne!(before, after, "a fresh worker serves");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_queue_is_answered_503_at_once() {
    let valve = Valve::start(&["-f", &api(), "-n", "1", "--queue-size", "2"]);
    let mut busy = Vec::new();
    // The slow call takes the only worker first; then two calls fill the queue.
    for (p, queued) in [("/sleep?zzz=2", 0), ("/pid", 1), ("/pid", 2)] {
        let url = valve.get(p);
        busy.push(tokio::spawn(async move { client().get(url).send().await.unwrap().status() }));
        valve.wait_for_requests(1, queued);
    }
    let start = Instant::now();
    let resp = client().get(valve.get("/pid")).send().await.unwrap();
    let took = start.elapsed();
    assert_eq!(resp.status(), 503);
    assert!(took < Duration::from_millis(100), "503 took {took:?}");
    assert_eq!(resp.headers()["retry-after"], "1");
    assert!(json_error(&resp.text().await.unwrap())["error"].as_str().unwrap().contains("queue is full"));
    for b in busy {
        assert_eq!(b.await.unwrap(), 200, "queued requests are still served");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_waiting_past_queue_timeout_gets_503() {
    let valve = Valve::start(&["-f", &api(), "-n", "1", "--queue-timeout", "0.5"]);
    let slow = tokio::spawn({
        let url = valve.get("/sleep?zzz=2");
        async move { client().get(url).send().await.unwrap().status() }
    });
    valve.wait_for_requests(1, 0);
    let start = Instant::now();
    let resp = client().get(valve.get("/pid")).send().await.unwrap();
    let took = start.elapsed();
    assert_eq!(resp.status(), 503);
    assert!(took >= Duration::from_millis(450) && took < Duration::from_millis(1500), "503 after {took:?}");
    assert_eq!(slow.await.unwrap(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_crash_is_retried_for_get_and_502_for_post() {
    let valve = Valve::start(&["-f", &api(), "-n", "2", "--n-min", "2"]);
    // In the app's home: its workers share it, its R may write it, the test may read it.
    let marker = valve.home("api").join("crashed");
    let resp = client().get(valve.get(&format!("/crash-once?marker={}", marker.display()))).send().await.unwrap();
    assert_eq!(resp.status(), 200, "the GET was retried on another worker");
    assert!(marker.exists(), "the first worker really crashed");

    let resp = client().post(valve.get("/crash")).send().await.unwrap();
    assert_eq!(resp.status(), 502);
    assert!(json_error(&resp.text().await.unwrap())["error"].as_str().unwrap().contains("died"));
    valve.wait_for_log("worker exited unexpectedly", Duration::from_secs(5));
    // A fork's exit status (an app preload's, the warm parent's) goes to its
    // parent, not to valve: valve says what it knows.
    let forked = preloading() || valve.log().contains("started_by=\"warm parent\"");
    let status = if forked { "status=\"exited (a fork: killed or crashed)\"" } else { "status=\"killed by signal 9\"" };
    valve.wait_for_log(status, Duration::from_secs(5));
    wait_until("crashed workers replaced", Duration::from_secs(15), || valve.workers().len() == 2);
    assert_eq!(client().get(valve.get("/pid")).send().await.unwrap().status(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_loop_backs_off_instead_of_spinning() {
    let valve = Valve::start(&["-f", fixture("crash_loop.R").to_str().unwrap()]);
    valve.wait_for_log("delay_ms=1000", Duration::from_secs(60));
    let log = valve.log();
    let waits: Vec<&str> = log.lines().filter(|l| l.contains("waiting before the next start")).collect();
    assert!(log.find("delay_ms=250").unwrap() < log.find("delay_ms=500").unwrap(), "{waits:?}");
    assert!(log.find("delay_ms=500").unwrap() < log.find("delay_ms=1000").unwrap(), "{waits:?}");
    assert_eq!(waits.len(), 3, "one log line per backoff step: {waits:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_lets_in_flight_and_queued_requests_finish() {
    let mut valve = Valve::start(&["-f", &api(), "-n", "1"]);
    let workers = valve.r_processes();
    // One request in flight on the only worker, one queued behind it.
    let mut calls = Vec::new();
    for (p, queued) in [("/sleep?zzz=2", 0), ("/pid", 1)] {
        let url = valve.get(p);
        calls.push(tokio::spawn(async move { client().get(url).send().await.map(|r| r.status().as_u16()) }));
        valve.wait_for_requests(1, queued);
    }
    valve.signal(libc::SIGTERM);
    let addr = valve.url.trim_start_matches("http://").to_string();
    wait_until("the listener to close", Duration::from_secs(10), || std::net::TcpStream::connect(&addr).is_err());
    assert!(calls.iter().all(|c| !c.is_finished()), "the listener closed at once, before the drain ended");
    for c in calls {
        assert_eq!(c.await.unwrap().unwrap(), 200, "in-flight and queued requests finish");
    }
    assert_eq!(valve.wait_exit(Duration::from_secs(10)).code(), Some(0));
    assert!(workers.iter().all(|p| !pid_alive(*p)));
}

#[tokio::test(flavor = "multi_thread")]
async fn workers_are_recycled_after_max_requests() {
    let valve = Valve::start(&["-f", &api(), "-n", "1", "--max-requests", "5"]);
    let mut pids = Vec::new();
    for _ in 0..20 {
        pids.push(pid_of(&valve).await);
    }
    let distinct: std::collections::BTreeSet<_> = pids.iter().collect();
    assert!((3..=5).contains(&distinct.len()), "20 requests at ~5 per worker: {pids:?}");
    valve.wait_for_log("it served --max-requests requests", Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_recycled_worker_serves_until_its_replacement_answers_so_no_request_waits() {
    // Room for a replacement (n_max 2): a worker past its share serves on
    // while the next one starts, and takes nothing once that one answers.
    let valve = Valve::start(&["-f", &api(), "-n", "2", "--n-min", "1", "--max-requests", "10", "--no-access-log"]);
    let replaced = "its replacement answers, and it takes no more requests";
    let mut pids = Vec::new();
    let began = Instant::now();
    while valve.log().matches(replaced).count() < 2 {
        assert!(began.elapsed() < Duration::from_secs(120), "two workers replaced: {pids:?}\n{}", valve.log());
        let resp = client().get(valve.get("/pid")).send().await.unwrap();
        assert_eq!(resp.status(), 200, "no request fails");
        pids.push(resp.json::<serde_json::Value>().await.unwrap()["pid"][0].as_u64().unwrap());
        // A steady client, not a flood: the replacement has time to start.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The next request goes to the second replacement.
    let resp = client().get(valve.get("/pid")).send().await.unwrap();
    pids.push(resp.json::<serde_json::Value>().await.unwrap()["pid"][0].as_u64().unwrap());
    let mut runs = pids.clone();
    runs.dedup();
    let distinct: std::collections::BTreeSet<_> = runs.iter().collect();
    assert!(runs.len() >= 3, "three workers in turn: {runs:?}");
    assert_eq!(distinct.len(), runs.len(), "a replaced worker never serves again: {pids:?}");
    assert!(valve.log().contains("starting worker: replacing one past its limit"));
    // Every request found a worker at once: none waited in the queue for a start.
    let metrics =
        valve.admin_client().get(valve.admin("/__valve__/metrics")).send().await.unwrap().text().await.unwrap();
    let waited: Vec<&str> = metrics.lines().filter(|l| l.starts_with("valve_queue_wait_seconds_sum")).collect();
    assert!(!waited.is_empty() && waited.iter().all(|l| l.ends_with(" 0")), "no wait: {waited:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn workers_are_recycled_when_they_grow_past_max_worker_memory() {
    let valve = Valve::start(&["-f", &api(), "-n", "1", "--max-worker-memory", "300MB"]);
    let small = pid_of(&valve).await;
    assert_eq!(pid_of(&valve).await, small, "a small worker is kept");
    let resp = client().get(valve.get("/grow?mb=400")).send().await.unwrap();
    assert_eq!(resp.status(), 200, "the request that grew the worker is answered");
    valve.wait_for_log("its memory passed --max-worker-memory", Duration::from_secs(5));
    wait_until("the big worker to go", Duration::from_secs(10), || !pid_alive(small as u32));
    assert_ne!(pid_of(&valve).await, small);
}

#[tokio::test(flavor = "multi_thread")]
async fn oversized_bodies_get_413_before_any_worker_is_touched() {
    let valve = Valve::start(&["-f", &api(), "-n", "1", "--max-body-size", "1KB"]);
    let resp = client().post(valve.get("/size")).body(vec![b'x'; 4096]).send().await.unwrap();
    assert_eq!(resp.status(), 413);
    assert!(json_error(&resp.text().await.unwrap())["error"].as_str().unwrap().contains("--max-body-size"));
    let chunks = futures::stream::iter((0..8).map(|_| Ok::<_, std::io::Error>(vec![b'y'; 512])));
    let resp = client().post(valve.get("/size")).body(reqwest::Body::wrap_stream(chunks)).send().await.unwrap();
    assert_eq!(resp.status(), 413, "a chunked body over the limit is refused too");
    let ok = client().post(valve.get("/size")).body(vec![b'x'; 1000]).send().await.unwrap();
    assert_eq!(ok.status(), 200, "a body under the limit passes");
    assert!(!valve.log().contains("worker exited"), "no worker was harmed");
}

fn raw(url: &str, payload: &[u8], wait: Duration) -> (String, Duration) {
    let addr = url.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(wait)).unwrap();
    s.write_all(payload).unwrap();
    let start = Instant::now();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    (String::from_utf8_lossy(&out).to_string(), start.elapsed())
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_http_gets_400_and_slow_headers_are_cut_off() {
    let valve = Valve::start(&["-f", &api(), "--header-timeout", "1"]);
    let (answer, _) = raw(&valve.url, b"NOT HTTP AT ALL\r\n\r\n", Duration::from_secs(5));
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    let (answer, took) = raw(&valve.url, b"GET /pid HTTP/1.1\r\nHost: x\r\n", Duration::from_secs(10));
    assert!(took < Duration::from_secs(4), "a slow client is cut off after --header-timeout, took {took:?}");
    assert!(!answer.contains("200 OK"), "{answer}");
    assert_eq!(client().get(valve.get("/pid")).send().await.unwrap().status(), 200, "valve still serves");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_leaves_mid_request_frees_its_worker() {
    let valve = Valve::start(&["-f", &api(), "-n", "1"]);
    let before = pid_of(&valve).await;
    {
        let addr = valve.url.trim_start_matches("http://").to_string();
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /sleep?zzz=1 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        valve.wait_for_requests(1, 0);
    }
    let start = Instant::now();
    assert_eq!(pid_of(&valve).await, before, "the same worker serves: it was neither lost nor killed");
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(500), "the worker finished the abandoned call first ({took:?})");
    assert!(took < Duration::from_secs(3), "and then came free ({took:?})");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_that_crashes_its_worker_is_not_retried_plain_or_forked() {
    // A fork is not valve's child, so valve cannot wait for its status: it
    // learns of the crash from R's own report. Without it a GET that
    // segfaults R was replayed on a second fork, which crashed the same way.
    for preload in [false, true] {
        let mut args = vec!["-f".to_string(), api(), "-n".into(), "2".into(), "--n-min".into(), "2".into()];
        if preload {
            args.push("--preload".into());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let valve = Valve::start(&args);
        let before = valve.workers();
        assert_eq!(before.len(), 2);
        let resp = client().get(valve.get("/segfault")).send().await.unwrap();
        assert_eq!(resp.status(), 502, "preload {preload}");
        let body = json_error(&resp.text().await.unwrap());
        assert!(body["error"].as_str().unwrap().contains("ended its R worker"), "preload {preload}: {body}");
        let dead: Vec<_> = before.iter().filter(|p| !pid_alive(**p)).collect();
        assert_eq!(dead.len(), 1, "preload {preload}: exactly one worker ended: {before:?}");
        wait_until("the pool back at n_min", Duration::from_secs(15), || valve.workers().len() == 2);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_that_ends_its_worker_is_not_retried_on_another() {
    let valve = Valve::start(&["-f", &api(), "-n", "2", "--n-min", "2"]);
    let before = valve.workers();
    assert_eq!(before.len(), 2);
    let resp = client().get(valve.get("/quit")).send().await.unwrap();
    assert_eq!(resp.status(), 502);
    let body = json_error(&resp.text().await.unwrap());
    assert!(body["error"].as_str().unwrap().contains("ended its R worker"), "{body}");
    // One worker died of it; the other, never asked, lives.
    let dead: Vec<_> = before.iter().filter(|p| !pid_alive(**p)).collect();
    assert_eq!(dead.len(), 1, "exactly one worker ended: {before:?}");
    wait_until("the pool back at n_min", Duration::from_secs(15), || valve.workers().len() == 2);
}
