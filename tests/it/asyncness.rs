//! Async plumber endpoints (promises resolved by `later`, by a
//! `future`, rejected, chained, drawing images) answer through valve exactly as
//! a plain plumber process answers them; and one worker keeps several promises
//! pending at once, as plain plumber does. No assertion here is about time: the
//! concurrency tests hold their promises behind a gate they open themselves,
//! and assert orderings, read from R's clock and from the order in which
//! answers arrive.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::{Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::{
    client, comparable, fixture, need_r_packages, preloading, unread_by_server, wait_until, Plumber, Valve,
    TAKE_DEADLINE,
};

fn api() -> String {
    fixture("async_api.R").to_str().unwrap().to_string()
}

fn need_async_packages() {
    need_r_packages(&["plumber", "promises", "later", "future"]);
}

/// One request to send to valve and to plain plumber.
struct Case {
    method: Method,
    path: &'static str,
    headers: &'static [(&'static str, &'static str)],
    body: Option<&'static [u8]>,
    /// Keys of a JSON object answer whose values differ by design (a pid, R's
    /// clock): they must be there, their values are not compared, nor is the
    /// Content-Length that depends on them (it is checked against the body).
    volatile: &'static [&'static str],
}

fn get(path: &'static str) -> Case {
    Case { method: Method::GET, path, headers: &[], body: None, volatile: &[] }
}

/// A summary of an answer that must match: status, headers but `date`, body.
async fn fetch(base: &str, case: &Case) -> (StatusCode, Vec<(String, String)>, String) {
    let (status, mut headers, body) = comparable(base, &case.method, case.path, case.headers, case.body).await;
    let content_type = headers.iter().find(|(k, _)| k == "content-type").map(|(_, v)| v.clone());
    if case.volatile.is_empty() {
        let described = if content_type.as_deref() == Some("image/png") { png(&body, base) } else { describe(&body) };
        return (status, headers, described);
    }
    let length = headers.iter().find(|(k, _)| k == "content-length").map(|(_, v)| v.clone());
    assert_eq!(
        length,
        Some(body.len().to_string()),
        "{} {} from {base}: Content-Length is the body's",
        case.method,
        case.path
    );
    headers.retain(|(k, _)| k != "content-length");
    let mut json: serde_json::Value = serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("{} {} from {base}: not JSON ({e}): {}", case.method, case.path, describe(&body)));
    for key in case.volatile {
        let value =
            json.get_mut(*key).unwrap_or_else(|| panic!("{} {} from {base}: no {key:?}", case.method, case.path));
        *value = serde_json::Value::String("<volatile>".into());
    }
    (status, headers, json.to_string())
}

/// Bytes as text when they are text, else as a length and a checksum.
fn describe(body: &[u8]) -> String {
    match std::str::from_utf8(body) {
        Ok(text) if text.len() < 2000 => text.to_string(),
        _ => format!("{} bytes, checksum {:x}", body.len(), checksum(body)),
    }
}

fn checksum(body: &[u8]) -> u64 {
    body.iter().fold(0u64, |h, b| h.wrapping_mul(1_099_511_628_211).wrapping_add(u64::from(*b)))
}

/// A PNG answer as its dimensions, length and checksum (failing unless it is a PNG).
fn png(body: &[u8], from: &str) -> String {
    assert!(
        body.len() > 24 && body.starts_with(b"\x89PNG\r\n\x1a\n") && &body[12..16] == b"IHDR",
        "not a PNG from {from}: {}",
        describe(body)
    );
    let width = u32::from_be_bytes(body[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(body[20..24].try_into().unwrap());
    format!("PNG {width}x{height}, {} bytes, checksum {:x}", body.len(), checksum(body))
}

/// valve's flags for each way this run starts workers: plain and, unless the
/// whole suite already runs preloaded (VALVE_PRELOAD=true), `--preload` too.
fn worker_modes() -> Vec<Vec<&'static str>> {
    if preloading() {
        vec![vec![]]
    } else {
        vec![vec![], vec!["--preload"]]
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn async_answers_match_plain_plumber() {
    need_async_packages();
    let cases = [
        Case { volatile: &["pid", "started", "resolved"], ..get("/later?secs=0.05&id=a") },
        get("/future"),
        get("/future?x=4.5"),
        get("/reject-condition"),
        get("/reject-in-then"),
        get("/reject-string"),
        get("/reject-number"),
        Case {
            method: Method::POST,
            headers: &[("content-type", "application/json")],
            body: Some(br#"{"name":"widget"}"#),
            ..get("/created")
        },
        get("/plot.png"),
        Case { volatile: &["pid", "at"], ..get("/echo?msg=h%C3%A9llo") },
        get("/no/such/route"),
    ];
    let plumber = Plumber::start(&fixture("async_api.R"));
    for mode in worker_modes() {
        let api = api();
        let mut args = vec!["-f", api.as_str()];
        args.extend_from_slice(&mode);
        let valve = Valve::start(&args);
        for case in &cases {
            let direct = fetch(&plumber.url, case).await;
            let proxied = fetch(&valve.url, case).await;
            assert_eq!(proxied, direct, "{} {} differs through valve {mode:?}", case.method, case.path);
        }
    }
}

/// What `/later` or `/gated` said: the request's id, the pid that answered, and R's clock
/// when the endpoint ran and when its promise resolved.
#[derive(Debug)]
struct Later {
    id: String,
    pid: u64,
    started: f64,
    resolved: f64,
}

fn later_answer(status: u16, body: &str) -> Later {
    assert_eq!(status, 200, "/later answered {status}: {body}");
    let json: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("/later: not JSON ({e}): {body}"));
    let stamp = |key: &str| -> f64 {
        json[key].as_str().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("/later: no {key} stamp: {body}"))
    };
    Later {
        id: json["id"].as_str().unwrap_or_else(|| panic!("/later: no id: {body}")).to_string(),
        pid: json["pid"].as_u64().unwrap_or_else(|| panic!("/later: no pid: {body}")),
        started: stamp("started"),
        resolved: stamp("resolved"),
    }
}

/// The most promises pending at once in R, from their start and resolve stamps.
fn most_pending(answers: &[Later]) -> usize {
    let mut events: Vec<(f64, i32)> = answers.iter().flat_map(|a| [(a.started, 1), (a.resolved, -1)]).collect();
    // At equal stamps a promise that resolved is no longer pending.
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut now, mut most) = (0i32, 0i32);
    for (_, step) in events {
        now += step;
        most = most.max(now);
    }
    most as usize
}

/// How long a test waits for what never comes when promises are served one at
/// a time: a bound against hanging, far above what it takes on a busy machine.
const GATE_DEADLINE: Duration = Duration::from_secs(60);

/// `fut`'s output, or a failure naming `what` once GATE_DEADLINE has passed.
async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(GATE_DEADLINE, fut)
        .await
        .unwrap_or_else(|_| panic!("no {what} after {GATE_DEADLINE:?}: the server served one promise at a time"))
}

/// A GET of `path` on `base`, as JSON.
async fn json_of(base: &str, path: &str) -> serde_json::Value {
    let resp = client().get(format!("{base}{path}")).send().await.unwrap();
    assert_eq!(resp.status(), 200, "{path}");
    resp.json().await.unwrap()
}

/// Opens `gate`: its promises resolve.
async fn open(base: &str, gate: &str) {
    json_of(base, &format!("/open?gate={gate}")).await;
}

/// Sends 8 `/gated` at once to `base`; checks that R, in one process, holds all
/// 8 promises pending at once (counted by R and asked amid them), then opens
/// their gate and checks R's clock agrees: all 8 started before any resolved.
async fn eight_promises_overlap(base: &str) -> u64 {
    let gate = "overlap";
    let calls: Vec<_> = (0..8).map(|i| spawn_later(format!("{base}/gated?gate={gate}&id=call{i}"))).collect();
    within("answer saying R holds 8 promises pending", async {
        while json_of(base, &format!("/waiting?gate={gate}")).await["waiting"] != 8 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    open(base, gate).await;
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap());
    }
    for (i, a) in answers.iter().enumerate() {
        assert_eq!(a.id, format!("call{i}"), "each call got its own answer: {answers:?}");
    }
    let pids: std::collections::BTreeSet<u64> = answers.iter().map(|a| a.pid).collect();
    assert_eq!(pids.len(), 1, "one process answered all 8: {answers:?}");
    // In R's own clock: every promise started before any resolved.
    let most = most_pending(&answers);
    let spans: Vec<String> = answers.iter().map(|a| format!("{} {:.3}..{:.3}", a.id, a.started, a.resolved)).collect();
    assert_eq!(most, 8, "R kept at most {most} promises pending at a time (started..resolved in R): {spans:?}");
    answers[0].pid
}

#[tokio::test(flavor = "multi_thread")]
async fn promises_overlap_on_one_worker() {
    need_async_packages();
    let valve = Valve::start(&["-f", &api(), "-n", "1"]);
    let pid = eight_promises_overlap(&valve.url).await;
    assert_eq!(valve.workers(), vec![pid as u32], "valve -n 1 ran one worker, the one that answered");
}

/// The control: plain plumber, one R process, overlaps the same 8 promises,
/// so the check above can hold and fails only for serving them one at a time.
#[tokio::test(flavor = "multi_thread")]
async fn plain_plumber_overlaps_promises_in_one_process() {
    need_async_packages();
    let plumber = Plumber::start(&fixture("async_api.R"));
    eight_promises_overlap(&plumber.url).await;
}

/// A request written on its own connection (HTTP/1.0: the answer ends when the
/// connection closes), so the test can see when valve has read it.
struct Sent {
    stream: tokio::net::TcpStream,
    port: u16,
}

async fn send(base: &str, path: &str) -> Sent {
    let addr = base.trim_start_matches("http://").trim_end_matches('/').to_string();
    let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).await.unwrap();
    let port = stream.local_addr().unwrap().port();
    Sent { stream, port }
}

/// The status and body of the answer to a request `send` wrote.
async fn answer(mut sent: Sent) -> (u16, String) {
    let mut all = Vec::new();
    sent.stream.read_to_end(&mut all).await.unwrap();
    let text = String::from_utf8_lossy(&all).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no HTTP answer: {text:?}"));
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{head}"));
    (status, body.to_string())
}

/// Sends 4 `/gated` to `base`, then, once it has read them all, `/echo`;
/// checks that `/echo` is answered while the 4 promises wait at their closed
/// gate, and in R's clock ran before any of them resolved.
async fn echo_overtakes_pending_promises(base: &str) {
    let server_port: u16 = base.trim_end_matches('/').rsplit(':').next().unwrap().parse().unwrap();
    let gate = "echo";
    // The order in which answers arrive.
    let arrived = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut pending = Vec::new();
    for i in 0..4 {
        let sent = send(base, &format!("/gated?gate={gate}&id=later{i}")).await;
        // Pending: the server has read the whole request (none of it is left unread).
        let port = sent.port;
        wait_until(&format!("the server reading /gated #{i}"), TAKE_DEADLINE, || {
            unread_by_server(server_port, port) == Some(0)
        });
        let arrived = arrived.clone();
        pending.push(tokio::spawn(async move {
            let (status, body) = answer(sent).await;
            let later = later_answer(status, &body);
            arrived.lock().unwrap().push(later.id.clone());
            later
        }));
    }
    let (status, body) =
        within("answer to /echo amid 4 pending promises", async { answer(send(base, "/echo?msg=fast").await).await })
            .await;
    arrived.lock().unwrap().push("echo".into());
    assert_eq!(status, 200, "/echo: {body}");
    let echo: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(echo["msg"], "fast");
    open(base, gate).await;
    let mut laters = Vec::new();
    for p in pending {
        laters.push(p.await.unwrap());
    }
    let arrived = arrived.lock().unwrap().clone();
    assert_eq!(arrived[0], "echo", "/echo answered only after a pending /gated did: arrival order {arrived:?}");
    // And in R's clock: /echo ran before any of the four promises resolved.
    let echo_at: f64 = echo["at"].as_str().unwrap().parse().unwrap();
    for later in &laters {
        assert!(echo_at < later.resolved, "/echo ran after {later:?} resolved (echo at {echo_at})");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fast_call_is_not_blocked_by_pending_promises() {
    need_async_packages();
    let valve = Valve::start(&["-f", &api(), "-n", "1"]);
    echo_overtakes_pending_promises(&valve.url).await;
}

/// The control: plain plumber answers `/echo` amid its pending promises.
#[tokio::test(flavor = "multi_thread")]
async fn plain_plumber_answers_a_fast_call_amid_pending_promises() {
    need_async_packages();
    let plumber = Plumber::start(&fixture("async_api.R"));
    echo_overtakes_pending_promises(&plumber.url).await;
}

/// GETs a `/later` or `/gated` URL in a task of its own; the task gives its answer.
fn spawn_later(url: String) -> tokio::task::JoinHandle<Later> {
    tokio::spawn(async move {
        let resp = client().get(url).send().await.unwrap();
        let status = resp.status().as_u16();
        later_answer(status, &resp.text().await.unwrap())
    })
}

/// Waits until valve's one app holds `pending` requests waiting on promises.
fn wait_for_pending(valve: &Valve, pending: u64) {
    wait_until(&format!("{pending} request(s) waiting on promises"), TAKE_DEADLINE, || {
        valve.status()["pool"]["pending"] == pending
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn a_promise_that_never_settles_gets_504_and_its_worker_serves_on() {
    need_async_packages();
    let valve = Valve::start(&["-f", &api(), "-n", "1", "--request-timeout", "2"]);
    let base = valve.url.clone();
    let never = tokio::spawn(async move { client().get(format!("{base}/never")).send().await.unwrap() });
    wait_for_pending(&valve, 1);
    let later: Later = {
        let resp = client().get(format!("{}/later?secs=0.2&id=beside", valve.url)).send().await.unwrap();
        let status = resp.status().as_u16();
        later_answer(status, &resp.text().await.unwrap())
    };
    assert_eq!(later.id, "beside", "a request beside the unsettled promise is answered");
    let never = never.await.unwrap();
    assert_eq!(never.status(), StatusCode::GATEWAY_TIMEOUT);
    let body: serde_json::Value = never.json().await.unwrap();
    assert!(body["error"].as_str().unwrap().contains("did not settle within --request-timeout"), "{body}");
    // The worker was not killed: the same process answers on.
    let echo: serde_json::Value =
        client().get(format!("{}/echo", valve.url)).send().await.unwrap().json().await.unwrap();
    assert_eq!(echo["pid"].as_u64(), Some(later.pid));
    assert_eq!(valve.workers(), vec![later.pid as u32]);
    wait_for_pending(&valve, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_requests_a_dead_worker_held_waiting_on_promises_are_tried_again_elsewhere() {
    need_async_packages();
    let valve = Valve::start(&["-f", &api(), "-n", "1"]);
    let first = valve.workers();
    let held: Vec<_> = (0..2).map(|i| spawn_later(format!("{}/gated?gate=held&id=held{i}", valve.url))).collect();
    wait_for_pending(&valve, 2);
    // The worker dies from outside (an OOM kill) holding both.
    unsafe { libc::kill(first[0] as i32, libc::SIGKILL) };
    // Its replacement gets them again: they resolve there once its gate is open.
    wait_until("a new worker", TAKE_DEADLINE, || valve.workers().iter().any(|pid| !first.contains(pid)));
    open(&valve.url, "held").await;
    for (i, call) in held.into_iter().enumerate() {
        let later = call.await.unwrap();
        assert_eq!(later.id, format!("held{i}"));
        assert!(!first.contains(&(later.pid as u32)), "a GET the dead worker held went to a new worker");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_waits_for_pending_promises_to_settle() {
    need_async_packages();
    let mut valve = Valve::start(&["-f", &api(), "-n", "1"]);
    let calls: Vec<_> = (0..3).map(|i| spawn_later(format!("{}/later?secs=5&id=p{i}", valve.url))).collect();
    wait_for_pending(&valve, 3);
    valve.signal(libc::SIGTERM);
    for (i, call) in calls.into_iter().enumerate() {
        assert_eq!(call.await.unwrap().id, format!("p{i}"), "a pending promise settled and was answered");
    }
    assert!(valve.wait_exit(TAKE_DEADLINE).success());
}
