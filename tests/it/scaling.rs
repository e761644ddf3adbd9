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
