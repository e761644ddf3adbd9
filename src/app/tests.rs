//! The supervisor's logic with fake workers on tokio's paused clock: start,
//! ready, one request per worker, crash, backoff, prune, broken answers,
//! liveness, stop, the budget across apps. Milliseconds each, no R.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};

use super::fake::{FakeLauncher, Plan};
use super::pool::{Limits, Retire, BACKOFF_FIRST, PENDING_FOR};
use super::supervisor::{DRAIN_QUIET, KILL_AFTER, SETTLE_MAX};
use super::{Fleet, Lease, Settings, Supervisor};
use crate::metrics::AppMetrics;
use crate::worker::{Exit, Stop};

fn settings(n_min: usize, n_max: usize) -> Settings {
    Settings {
        name: "test".into(),
        limits: Limits {
            n_min,
            n_max,
            max_requests: None,
            max_memory: None,
            max_sessions: 20,
            busy_threshold: 0.0,
            max_pending: 4,
        },
        max_age: Duration::from_secs(5),
        check_unused: Duration::from_secs(1),
        start_timeout: Duration::from_secs(10),
        queue_size: 100,
        queue_timeout: Duration::from_secs(30),
        request_timeout: Some(Duration::from_secs(5)),
        spool: None,
        packages: None,
    }
}

fn app_in(fleet: &Arc<Fleet>, s: Settings) -> (Arc<Supervisor>, Arc<FakeLauncher>) {
    let launcher = Arc::new(FakeLauncher::default());
    let metrics = Arc::new(AppMetrics::new(&s.name));
    let sup = Supervisor::new(fleet.clone(), s, Box::new(launcher.clone()), metrics);
    (sup, launcher)
}

fn app(s: Settings) -> (Arc<Supervisor>, Arc<FakeLauncher>) {
    let fleet = Fleet::new(s.limits.n_max);
    app_in(&fleet, s)
}

/// Sends `path` on a lease and reads the answer whole.
async fn call(lease: &mut Lease, path: &str) -> Result<String, String> {
    lease.connect().await.map_err(|e| e.to_string())?;
    let req = http::Request::get(path).body(Empty::new().map_err(|never| match never {}).boxed()).unwrap();
    let resp = lease.send(req).await.map_err(|e| e.to_string())?;
    let body = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    lease.answered(true);
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// Lets time pass (on the paused clock) until `cond` holds, or fails.
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(start_paused = true)]
async fn starts_n_min_and_gives_each_worker_one_request_at_a_time() {
    let (sup, fake) = app(settings(2, 2));
    sup.start().await.unwrap();
    assert_eq!(fake.alive().len(), 2);
    assert!(sup.ready());
    let mut a = sup.lease().await.unwrap();
    let b = sup.lease().await.unwrap();
    assert_ne!(a.worker, b.worker);
    let third = tokio::spawn({
        let sup = sup.clone();
        async move { sup.lease().await.map(|l| l.worker) }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!third.is_finished(), "both workers are busy: the third request waits");
    assert!(call(&mut a, "/pid").await.unwrap().starts_with("ok"));
    let a_worker = a.worker;
    drop(a);
    assert_eq!(third.await.unwrap().unwrap(), a_worker, "the first worker to come free takes the waiter");
    drop(b);
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_served_and_died_is_replaced_at_once() {
    let (sup, fake) = app(settings(1, 1));
    sup.start().await.unwrap();
    let mut lease = sup.lease().await.unwrap();
    call(&mut lease, "/pid").await.unwrap();
    let first = lease.worker;
    drop(lease);
    let died = tokio::time::Instant::now();
    fake.worker(first).end(Exit::Signal(9));
    until("a replacement", || fake.launched_at.lock().unwrap().len() == 2).await;
    let replaced = fake.launched_at.lock().unwrap()[1];
    assert_eq!(replaced - died, Duration::ZERO, "no backoff for a worker that had served");
    until("the replacement ready", || sup.gauges().idle == 1).await;
}

#[tokio::test(start_paused = true)]
async fn failed_starts_back_off_doubling() {
    let (sup, fake) = app(settings(1, 1));
    sup.start().await.unwrap();
    {
        let mut plans = fake.plans.lock().unwrap();
        for _ in 0..3 {
            plans.push_back(Plan { fail: Some(1), ..Plan::default() });
        }
    }
    // Dies right after it became ready, before it ever finished a request.
    fake.worker(1).end(Exit::Signal(11));
    until("four launches", || fake.launched_at.lock().unwrap().len() == 5).await;
    let at = fake.launched_at.lock().unwrap().clone();
    // The first worker died at once; each replacement failed to start.
    let gaps: Vec<Duration> = at.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(gaps, [BACKOFF_FIRST, BACKOFF_FIRST * 2, BACKOFF_FIRST * 4, BACKOFF_FIRST * 8], "launch times {at:?}");
    assert!(!sup.ready() || sup.gauges().idle > 0, "a crash loop with nothing answering is not ready");
}

#[tokio::test(start_paused = true)]
async fn unused_workers_are_pruned_down_to_n_min() {
    let (sup, fake) = app(settings(1, 3));
    sup.start().await.unwrap();
    let leases: Vec<Lease> =
        futures::future::join_all((0..3).map(|_| sup.lease())).await.into_iter().map(Result::unwrap).collect();
    assert_eq!(fake.alive().len(), 3, "the queue grew the pool to n_max");
    drop(leases);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(fake.alive().len(), 3, "younger than max_age: kept");
    until("pruning to n_min", || fake.alive().len() == 1).await;
    let stopped: Vec<_> = fake.workers.lock().unwrap().iter().filter(|w| !w.alive()).map(|w| w.signals()).collect();
    assert!(stopped.iter().all(|s| s == &[(Stop::Term, false)]), "a planned stop is SIGTERM: {stopped:?}");
}

#[tokio::test(start_paused = true)]
async fn a_broken_answer_retires_its_worker_before_the_next_waiter_gets_it() {
    let (sup, fake) = app(settings(1, 1));
    sup.start().await.unwrap();
    let mut lease = sup.lease().await.unwrap();
    let broken = lease.worker;
    let waiter = tokio::spawn({
        let sup = sup.clone();
        async move { sup.lease().await.map(|l| l.worker) }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    lease.broken(Retire::Broken);
    drop(lease);
    let next = waiter.await.unwrap().unwrap();
    assert_ne!(next, broken, "the waiter got a fresh worker, not the broken one");
    assert_eq!(fake.worker(broken).signals(), [(Stop::Kill, false)]);
}

#[tokio::test(start_paused = true)]
async fn a_request_abandoned_mid_exchange_keeps_its_worker_busy_until_r_is_done() {
    let (sup, fake) = app(settings(1, 1));
    sup.start().await.unwrap();
    let mut lease = sup.lease().await.unwrap();
    lease.connect().await.unwrap();
    let req = http::Request::get("/sleep?ms=2000").body(Empty::new().map_err(|never| match never {}).boxed()).unwrap();
    let sending = tokio::spawn(async move {
        let _ = lease.send(req).await;
        lease
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    sending.abort(); // the client left
    let _ = sending.await;
    let asked = tokio::time::Instant::now();
    let next = sup.lease().await.unwrap();
    assert!(tokio::time::Instant::now() - asked >= Duration::from_millis(1800), "it waited for R to finish");
    assert_eq!(next.worker, 1, "the same worker, neither lost nor killed");
    assert!(fake.worker(1).signals().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_handoff_to_a_client_that_left_proves_nothing() {
    let (sup, fake) = app(settings(0, 1));
    sup.start().await.unwrap();
    fake.plans.lock().unwrap().push_back(Plan { ready_after: Duration::from_millis(500), ..Plan::default() });
    let asking = tokio::spawn({
        let sup = sup.clone();
        async move { sup.lease().await.map(|l| l.worker) }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    asking.abort(); // the client left while its worker was starting
    until("the worker ready", || sup.gauges().idle == 1).await;
    let status = sup.status();
    assert_eq!(status.workers[0].requests, 0, "nothing was served");
    // Dying now is a failed start: the worker never proved itself.
    fake.worker(1).end(Exit::Signal(9));
    let died = tokio::time::Instant::now();
    let asked = tokio::spawn({
        let sup = sup.clone();
        async move { sup.lease().await.map(|l| l.worker) }
    });
    until("a replacement", || fake.launched_at.lock().unwrap().len() == 2).await;
    let gap = fake.launched_at.lock().unwrap()[1] - died;
    assert_eq!(gap, BACKOFF_FIRST, "crash-loop detection still works");
    assert_eq!(asked.await.unwrap().unwrap(), 2);
}

#[tokio::test(start_paused = true)]
async fn stopping_sends_sigterm_then_sigkill_and_nothing_after_the_exit() {
    let (sup, fake) = app(settings(2, 2));
    fake.plans.lock().unwrap().push_back(Plan { ignore_term: true, ..Plan::default() });
    sup.start().await.unwrap();
    let stopped = tokio::time::Instant::now();
    sup.shutdown().await;
    assert!(tokio::time::Instant::now() - stopped >= KILL_AFTER, "the stubborn worker had its grace");
    let stubborn = fake.worker(1).signals();
    assert_eq!(stubborn, [(Stop::Term, false), (Stop::Kill, false)]);
    let polite = fake.worker(2).signals();
    assert_eq!(polite, [(Stop::Term, false)], "no SIGKILL once the exit was seen (its pid may be reused)");
    assert!(fake.alive().is_empty());
    assert!(matches!(sup.lease().await, Err(super::Unavailable::ShuttingDown)));
}

#[tokio::test(start_paused = true)]
async fn an_idle_worker_that_stops_answering_is_replaced() {
    let (sup, fake) = app(settings(1, 1));
    sup.start().await.unwrap();
    fake.worker(1).mute.store(true, std::sync::atomic::Ordering::Relaxed);
    until("the mute worker killed", || !fake.worker(1).alive()).await;
    assert_eq!(fake.worker(1).signals(), [(Stop::Kill, false)]);
    until("a replacement ready", || sup.gauges().idle == 1).await;
    let mut lease = sup.lease().await.unwrap();
    assert_eq!(lease.worker, 2);
    call(&mut lease, "/pid").await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_budget_moves_an_idle_worker_to_the_app_that_needs_it() {
    let fleet = Fleet::new(2);
    let (a, fake_a) = app_in(&fleet, Settings { name: "a".into(), ..settings(0, 2) });
    let (b, fake_b) = app_in(&fleet, Settings { name: "b".into(), ..settings(0, 2) });
    a.start().await.unwrap();
    b.start().await.unwrap();
    let leases: Vec<Lease> =
        futures::future::join_all((0..2).map(|_| a.lease())).await.into_iter().map(Result::unwrap).collect();
    drop(leases);
    assert_eq!(fleet.processes(), 2);
    let watch = tokio::spawn({
        let fleet = fleet.clone();
        async move {
            let mut most = 0;
            for _ in 0..300 {
                most = most.max(fleet.processes());
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            most
        }
    });
    let mut lease = b.lease().await.unwrap();
    call(&mut lease, "/pid").await.unwrap();
    assert_eq!(fake_a.alive().len(), 1, "a gave up one idle worker");
    assert_eq!(fake_b.alive().len(), 1);
    assert!(watch.await.unwrap() <= 2, "never more than the budget");
    let gone: Vec<_> = fake_a.workers.lock().unwrap().iter().filter(|w| !w.alive()).map(|w| w.signals()).collect();
    assert_eq!(gone, [vec![(Stop::Term, false)]]);
}

#[tokio::test(start_paused = true)]
async fn a_request_waiting_for_the_budget_gets_a_place_that_frees_by_time_alone() {
    // A Shiny page whose browser never opens its session holds its worker
    // for PENDING_FOR, then the worker is spare: no event says so, and a
    // request of another app waiting for the budget must still get it.
    let fleet = Fleet::new(1);
    // (Not pruned meanwhile for want of use: that would free it too.)
    let (a, fake_a) = app_in(&fleet, Settings { name: "a".into(), max_age: PENDING_FOR * 10, ..settings(0, 1) });
    let (b, fake_b) = app_in(&fleet, Settings { name: "b".into(), queue_timeout: PENDING_FOR * 4, ..settings(0, 1) });
    a.start().await.unwrap();
    b.start().await.unwrap();
    drop(a.sticky(None, 7).await.unwrap());
    let began = tokio::time::Instant::now();
    let mut lease = b.lease().await.expect("a place once the page's hold has passed");
    assert!(tokio::time::Instant::now() - began >= PENDING_FOR, "not before");
    call(&mut lease, "/pid").await.unwrap();
    assert_eq!((fake_a.alive().len(), fake_b.alive().len()), (0, 1));
}

#[tokio::test(start_paused = true)]
async fn without_a_request_timeout_an_abandoned_request_is_settled_within_settle_max() {
    let (sup, fake) = app(Settings { request_timeout: None, ..settings(1, 1) });
    sup.start().await.unwrap();
    let mut lease = sup.lease().await.unwrap();
    lease.connect().await.unwrap();
    let forever = format!("/sleep?ms={}", 10 * SETTLE_MAX.as_millis());
    let req = http::Request::get(forever).body(Empty::new().map_err(|never| match never {}).boxed()).unwrap();
    let sending = tokio::spawn(async move {
        let _ = lease.send(req).await;
        lease
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    sending.abort(); // the client left; R goes on for ever
    let _ = sending.await;
    let left = tokio::time::Instant::now();
    tokio::time::sleep(SETTLE_MAX - Duration::from_secs(1)).await;
    assert!(fake.worker(1).signals().is_empty(), "R has SETTLE_MAX to finish");
    until("the hung worker killed", || !fake.worker(1).signals().is_empty()).await;
    assert!(tokio::time::Instant::now() - left >= SETTLE_MAX, "R had SETTLE_MAX to finish");
    assert_eq!(fake.worker(1).signals(), [(Stop::Kill, false)], "a hung worker is killed, not asked");
    let mut next = sup.lease().await.unwrap();
    assert_eq!(next.worker, 2, "a replacement serves");
    call(&mut next, "/pid").await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_shiny_worker_past_its_share_drains_then_stops_once_quiet() {
    let limits = Limits { max_requests: Some(1), ..settings(1, 2).limits };
    let (sup, fake) = app(Settings { limits, ..settings(1, 2) });
    sup.start().await.unwrap();
    let sticky = sup.sticky(None, 7).await.unwrap();
    let id = sticky.worker;
    drop(sticky);
    assert_eq!(sup.gauges().draining, 1, "its one request spent its share");
    sup.session(id, true, Some(7));
    let now = tokio::time::Instant::now();
    tokio::time::sleep(DRAIN_QUIET * 3).await;
    assert!(fake.worker(id).signals().is_empty(), "a draining worker keeps its open session");
    assert!(tokio::time::Instant::now() - now >= DRAIN_QUIET * 3);
    sup.session(id, false, None);
    let closed = tokio::time::Instant::now();
    until("the drained worker stopped", || !fake.worker(id).signals().is_empty()).await;
    assert!(tokio::time::Instant::now() - closed >= DRAIN_QUIET, "it waited for its traffic to go quiet");
    assert_eq!(fake.worker(id).signals(), [(Stop::Term, false)], "a planned stop");
}

#[tokio::test(start_paused = true)]
async fn winding_down_ends_when_the_last_busy_worker_is_done_or_at_its_grace() {
    let (sup, fake) = app(settings(2, 2));
    sup.start().await.unwrap();
    let mut lease = sup.lease().await.unwrap();
    let busy = lease.worker;
    let began = tokio::time::Instant::now();
    let winding = tokio::spawn({
        let sup = sup.clone();
        async move { sup.wind_down(Duration::from_secs(60)).await }
    });
    until("the idle worker stopped", || fake.alive().len() == 1).await;
    assert!(fake.worker(busy).alive(), "the busy worker finishes its request first");
    tokio::time::sleep(Duration::from_secs(2)).await;
    call(&mut lease, "/pid").await.unwrap();
    drop(lease);
    winding.await.unwrap();
    assert!(tokio::time::Instant::now() - began < Duration::from_secs(60), "no wait for the grace once all exited");
    assert_eq!(fake.worker(busy).signals(), [(Stop::Term, false)]);

    let (sup, fake) = app(settings(1, 1));
    sup.start().await.unwrap();
    let held = sup.lease().await.unwrap();
    let began = tokio::time::Instant::now();
    sup.wind_down(Duration::from_secs(20)).await;
    assert!(
        tokio::time::Instant::now() - began >= Duration::from_secs(20),
        "a worker still busy holds it to its grace"
    );
    assert!(fake.alive().is_empty(), "then it is stopped as at shutdown");
    drop(held);
}

#[tokio::test(start_paused = true)]
async fn a_pool_without_workers_is_ready_at_once_and_never_launches() {
    // Static content's generation: n_min = n_max = 0, beside an app that uses the whole budget.
    let fleet = Fleet::new(1);
    let (files, fake) = app_in(&fleet, settings(0, 0));
    let (api, _) = app_in(&fleet, settings(1, 1));
    files.start().await.unwrap();
    api.start().await.unwrap();
    assert!(files.ready(), "nothing to wait for");
    files.set_n_min(1);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(fake.workers.lock().unwrap().is_empty(), "no worker was ever launched");
    assert_eq!((files.gauges().n_max, fleet.processes()), (0, 1), "and it holds no place in the budget");
    files.shutdown().await;
    api.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_recycled_worker_serves_until_its_replacement_answers_or_stops_first_when_the_budget_has_no_place() {
    let recycled = |name: &str, n_min, n_max| Settings {
        name: name.into(),
        limits: Limits { max_requests: Some(3), ..settings(n_min, n_max).limits },
        ..settings(n_min, n_max)
    };
    // Room for a replacement: it starts while the old worker serves on.
    let fleet = Fleet::new(2);
    let (sup, fake) = app_in(&fleet, recycled("a", 1, 2));
    sup.start().await.unwrap();
    fake.plans.lock().unwrap().push_back(Plan { ready_after: Duration::from_secs(2), ..Plan::default() });
    let old = fake.alive()[0].id;
    for _ in 0..3 {
        let mut lease = sup.lease().await.unwrap();
        assert_eq!(lease.worker, old);
        call(&mut lease, "/pid").await.unwrap();
    }
    until("the replacement launched", || fake.launched_at.lock().unwrap().len() == 2).await;
    let new = fake.workers.lock().unwrap()[1].id;
    for _ in 0..5 {
        let mut lease = sup.lease().await.unwrap();
        assert_eq!((lease.worker, lease.waited), (old, Duration::ZERO), "past its limit, it serves at once");
        call(&mut lease, "/sleep?ms=100").await.unwrap();
    }
    assert!(fake.worker(old).signals().is_empty(), "not stopped while its replacement starts");
    assert_eq!(fleet.processes(), 2, "within n_max and the budget");
    until("the replacement ready", || sup.status().workers.iter().any(|w| w.id == new && w.state == "idle")).await;
    let mut lease = sup.lease().await.unwrap();
    assert_eq!(lease.worker, new, "once the replacement answers, requests go to it");
    call(&mut lease, "/pid").await.unwrap();
    drop(lease);
    until("the old worker stopped", || !fake.worker(old).alive()).await;
    assert_eq!(fake.worker(old).signals(), vec![(Stop::Term, false)], "a planned stop");
    assert_eq!(fake.launched_at.lock().unwrap().len(), 2, "one replacement, no other start");

    // The budget is spent and no place can come free (the other app is at its
    // n_min): the worker stops first, and its exit makes the place.
    let fleet = Fleet::new(2);
    let (a, fake_a) = app_in(&fleet, recycled("a", 1, 2));
    let (b, fake_b) = app_in(&fleet, Settings { name: "b".into(), ..settings(1, 1) });
    a.start().await.unwrap();
    b.start().await.unwrap();
    let old = fake_a.alive()[0].id;
    for _ in 0..3 {
        let mut lease = a.lease().await.unwrap();
        call(&mut lease, "/pid").await.unwrap();
    }
    until("the old worker stopped", || !fake_a.worker(old).alive()).await;
    until("its replacement", || fake_a.alive().len() == 1).await;
    assert_eq!(fake_a.worker(old).signals(), vec![(Stop::Term, false)]);
    assert_eq!(fake_a.launched_at.lock().unwrap().len(), 2, "one replacement, after the old one left");
    assert_eq!(fake_b.alive().len(), 1, "the other app kept its worker");
    assert_eq!(fleet.processes(), 2);
}
