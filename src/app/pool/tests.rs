//! The pool's rules, values in and values out.

use super::*;

fn limits(n_min: usize, n_max: usize) -> Limits {
    Limits { n_min, n_max, max_requests: None, max_memory: None, max_sessions: 20, busy_threshold: 0.0, max_pending: 4 }
}

fn pool(n_min: usize, n_max: usize) -> (Pool<u32>, Instant) {
    (Pool::new(limits(n_min, n_max), Ids::default()), Instant::now())
}

const ALL: fn(&u32) -> bool = |_| true;

fn ready_all(p: &mut Pool<u32>, ids: &[WorkerId], now: Instant) {
    for id in ids {
        assert!(matches!(p.release(*id, now, Done::Ready, ALL), Release::Idle));
    }
}

fn grow(p: &mut Pool<u32>, now: Instant) -> Vec<WorkerId> {
    p.grow(now, usize::MAX).ids
}

#[test]
fn a_shiny_worker_busy_with_requests_is_not_probed() {
    let (mut p, t0) = pool(1, 1);
    let start = p.grow(t0, 10);
    ready_all(&mut p, &start.ids, t0);
    let id = start.ids[0];
    assert_eq!(p.touch(id, t0, None), Some(false));
    let later = t0 + Duration::from_secs(5);
    assert!(p.due_for_probe(later, Duration::from_secs(1)).is_empty(), "R may be busy with that request");
    p.finished(id, later);
    assert!(p.due_for_probe(later + Duration::from_secs(1), Duration::from_secs(1)) == vec![id]);
}

#[test]
fn a_generation_winding_down_stops_workers_as_they_come_free() {
    let (mut p, t0) = pool(2, 4);
    let start = p.grow(t0, 10);
    ready_all(&mut p, &start.ids, t0);
    let busy = p.checkout().unwrap();
    let idle = *start.ids.iter().find(|id| **id != busy).unwrap();
    p.enqueue(7);
    assert_eq!(p.wind_down(), vec![(idle, Retire::Shutdown)], "the idle worker stops now");
    assert!(
        matches!(p.release(busy, t0, Done::Completed, ALL), Release::Handoff(7)),
        "queued requests are served first"
    );
    assert!(matches!(p.release(busy, t0, Done::Completed, ALL), Release::Retire(Retire::Shutdown)));
    assert_eq!(p.wants(), 0, "a generation winding down starts nothing");
    assert_eq!(p.limits().n_min, 0);
}

#[test]
fn a_generation_winding_down_starts_no_worker_for_browsers_waiting_in_it() {
    // A browser waited here for a place when a reload replaced the
    // generation: it goes to the new one, and nothing starts here for it
    // (a worker started here would only be stopped again, over and over).
    let (mut p, t0) = pool(0, 3);
    p.session_wanted();
    assert_eq!(p.wants(), 1, "before the reload, a waiting browser wants a worker");
    p.wind_down();
    assert!(p.is_winding_down());
    assert_eq!(p.wants(), 0);
    assert!(grow(&mut p, t0).is_empty());
}

#[test]
fn winding_down_stops_idle_workers_and_drains_shiny_ones() {
    let (mut p, t0) = pool(3, 4);
    let start = p.grow(t0, 10);
    ready_all(&mut p, &start.ids, t0);
    let busy = p.checkout().unwrap();
    let shiny = *start.ids.iter().find(|id| **id != busy).unwrap();
    p.session_opened(shiny, t0, None);
    let stopped = p.wind_down();
    assert_eq!(p.slot(shiny).unwrap().state, State::Draining, "a worker holding a session drains");
    assert_eq!(stopped.len(), 1, "the idle worker stops now: {stopped:?}");
    assert_eq!(p.slot(busy).unwrap().state, State::Busy, "a busy worker finishes its request");
}

#[test]
fn starts_n_min_and_hands_out_idle_workers() {
    let (mut p, now) = pool(2, 4);
    let ids = grow(&mut p, now);
    assert_eq!(ids, vec![1, 2]);
    assert_eq!(p.checkout(), None, "starting workers take no requests");
    ready_all(&mut p, &ids, now);
    let a = p.checkout().unwrap();
    let b = p.checkout().unwrap();
    assert_ne!(a, b);
    assert_eq!(p.checkout(), None, "a busy worker never gets a second request");
}

#[test]
fn the_queue_grows_the_pool_one_worker_per_waiter_up_to_n_max() {
    let (mut p, now) = pool(1, 3);
    let ids = grow(&mut p, now);
    ready_all(&mut p, &ids, now);
    assert!(p.checkout().is_some());
    p.enqueue(10);
    assert_eq!(grow(&mut p, now), vec![2], "the first waiter starts a worker");
    assert_eq!(grow(&mut p, now), Vec::<WorkerId>::new(), "one starting covers one waiter");
    p.enqueue(11);
    p.enqueue(12);
    assert_eq!(grow(&mut p, now), vec![3], "n_max reached");
    assert_eq!(p.live(), 3);
}

#[test]
fn the_budget_caps_growth_and_the_pool_says_what_it_still_wants() {
    let (mut p, now) = pool(2, 4);
    assert_eq!(p.grow(now, 1).ids, vec![1], "room for one");
    assert_eq!(p.wants(), 1, "n_min still wants another");
    assert_eq!(p.grow(now, 0).ids, Vec::<WorkerId>::new());
    assert_eq!(p.grow(now, 5).ids, vec![2]);
    assert_eq!(p.wants(), 0);
}

#[test]
fn release_serves_waiters_in_fifo_order_skipping_those_gone() {
    let (mut p, now) = pool(1, 1);
    let ids = grow(&mut p, now);
    ready_all(&mut p, &ids, now);
    let w = p.checkout().unwrap();
    p.enqueue(1);
    p.enqueue(2);
    p.enqueue(3);
    assert!(matches!(p.release(w, now, Done::Completed, ALL), Release::Handoff(1)));
    assert!(matches!(p.release(w, now, Done::Completed, |w| *w != 2), Release::Handoff(3)));
    assert!(matches!(p.release(w, now, Done::Completed, ALL), Release::Idle));
    assert_eq!(p.slot(w).unwrap().served, 3);
}

#[test]
fn a_handoff_to_a_departed_client_is_not_a_served_request() {
    let (mut p, now) = pool(0, 1);
    p.enqueue(1);
    let w = grow(&mut p, now)[0];
    // The worker became ready and went to the waiter, which had just left.
    assert!(matches!(p.release(w, now, Done::Ready, ALL), Release::Handoff(1)));
    assert!(matches!(p.release(w, now, Done::Unused, ALL), Release::Idle));
    let slot = p.slot(w).unwrap();
    assert_eq!(slot.served, 0, "returned unused: not counted");
    assert!(!slot.proven, "a worker that never finished a request is not proven");
    // So its death soon after start still counts as a failed start.
    p.exited(w, now + Duration::from_secs(1));
    assert_eq!(p.backoff(now + Duration::from_secs(1)), BACKOFF_FIRST);
}

#[test]
fn a_worker_is_proven_once_it_finishes_a_request_or_opens_a_session() {
    let (mut p, now) = pool(2, 2);
    let ids = grow(&mut p, now);
    ready_all(&mut p, &ids, now);
    assert!(ids.iter().all(|id| !p.slot(*id).unwrap().proven), "ready is not proven");
    let busy = p.checkout().unwrap();
    assert!(!p.slot(busy).unwrap().proven, "a request in progress proves nothing yet");
    p.release(busy, now, Done::Completed, ALL);
    assert!(p.slot(busy).unwrap().proven);
    let other = *ids.iter().find(|id| **id != busy).unwrap();
    p.session_opened(other, now, None);
    assert!(p.slot(other).unwrap().proven);
}

#[test]
fn crash_loops_back_off_doubling_and_forget_after_a_minute() {
    let (mut p, t0) = pool(1, 1);
    let mut now = t0;
    let mut delays = Vec::new();
    for _ in 0..4 {
        let start = p.grow(now, 1);
        delays.push(start.delay);
        // Fails before it ever answers.
        p.exited(start.ids[0], now);
        now += Duration::from_millis(10);
    }
    assert_eq!(delays, [0, 250, 500, 1000].map(Duration::from_millis));
    assert_eq!(p.grow(now, 1).delay, Duration::from_secs(2));
    assert!(p.crash_looping(now));
    assert_eq!(p.backoff(now + FAILURE_MEMORY), Duration::ZERO, "an old crash loop is forgotten");
}

#[test]
fn a_worker_that_served_or_was_stopped_is_no_failed_start() {
    let (mut p, now) = pool(2, 2);
    let ids = grow(&mut p, now);
    ready_all(&mut p, &ids, now);
    let busy = p.checkout().unwrap();
    p.release(busy, now, Done::Completed, ALL);
    p.exited(busy, now);
    let other = *ids.iter().find(|id| **id != busy).unwrap();
    p.retire(other, Retire::Idle);
    p.exited(other, now);
    assert_eq!(p.backoff(now), Duration::ZERO);
    // A worker killed for hanging counts: valve's kill was not planned.
    let ids = grow(&mut p, now);
    ready_all(&mut p, &ids, now);
    p.retire(ids[0], Retire::Timeout);
    p.exited(ids[0], now);
    assert_eq!(p.backoff(now), BACKOFF_FIRST);
    // One that lived past the crash window does not.
    let later = now + CRASH_WINDOW + Duration::from_secs(1);
    p.exited(ids[1], later);
    assert_eq!(p.backoff(later), BACKOFF_FIRST, "unchanged");
}

#[test]
fn workers_retire_after_their_share_of_requests_with_jitter() {
    let now = Instant::now();
    let mut p: Pool<u32> = Pool::new(Limits { max_requests: Some(100), ..limits(1, 1) }, Ids::default());
    let limits: Vec<u64> = (1..=50).map(|id| jittered(100, id)).collect();
    assert!(limits.iter().all(|l| (100..=110).contains(l)), "{limits:?}");
    assert!(limits.iter().collect::<std::collections::BTreeSet<_>>().len() > 5, "limits are spread");
    let id = grow(&mut p, now)[0];
    ready_all(&mut p, &[id], now);
    let limit = p.slot(id).unwrap().limit.unwrap();
    for _ in 1..limit {
        assert_eq!(p.checkout(), Some(id));
        assert!(matches!(p.release(id, now, Done::Completed, ALL), Release::Idle));
    }
    assert_eq!(p.checkout(), Some(id));
    assert!(matches!(p.release(id, now, Done::Completed, ALL), Release::Retire(Retire::Requests)));
    assert_eq!(p.checkout(), None, "a retiring worker takes no more requests");
    assert_eq!(p.wants(), 1, "a replacement keeps n_min");
    // The budget (n_max 1) counts the stopping worker until it has exited:
    // the replacement waits for its place, and requests wait with it.
    assert_eq!(p.grow(now, 0).ids, Vec::<WorkerId>::new());
    assert!(p.can_serve(now, 1), "a replacement is on its way: still serving");
    assert!(!p.can_serve(now, 0), "nothing answers and nothing frees a place");
    p.exited(id, now);
    let next = grow(&mut p, now);
    assert_eq!(next.len(), 1);
    assert!(p.can_serve(now, 0), "the replacement is starting");
    ready_all(&mut p, &next, now);
    assert!(p.can_serve(now, 0));
}

#[test]
fn memory_past_the_limit_retires_idle_at_once_busy_after_its_request() {
    let now = Instant::now();
    let mut p: Pool<u32> = Pool::new(Limits { max_memory: Some(1000), ..limits(2, 2) }, Ids::default());
    let ids = grow(&mut p, now);
    ready_all(&mut p, &ids, now);
    assert_eq!(p.sampled(ids[0], 500), None, "under the limit");
    assert_eq!(p.slot(ids[0]).unwrap().memory, Some(500));
    let busy = p.checkout().unwrap();
    let idle = *ids.iter().find(|id| **id != busy).unwrap();
    assert_eq!(p.sampled(idle, 2000), Some(Retire::Memory), "an idle worker goes now");
    assert_eq!(p.sampled(busy, 2000), None, "a busy one finishes first");
    // The idle one's place under n_max is free: the busy one serves on while
    // its replacement starts there (see `recycle`).
    assert!(matches!(p.release(busy, now, Done::Completed, ALL), Release::Idle));
    assert_eq!(p.slot(busy).unwrap().recycle, Some(super::Recycle::Wanted(Retire::Memory)));
}

#[test]
fn shiny_workers_past_a_limit_drain_their_sessions_then_stop() {
    let now = Instant::now();
    let mut p: Pool<u32> =
        Pool::new(Limits { max_requests: Some(3), max_memory: Some(1000), ..limits(1, 2) }, Ids::default());
    let ids = grow(&mut p, now);
    ready_all(&mut p, &ids, now);
    let w = ids[0];
    let limit = p.slot(w).unwrap().limit.unwrap();
    p.session_opened(w, now, None);
    for _ in 1..limit {
        assert_eq!(p.touch(w, now, None), Some(false));
    }
    assert_eq!(p.touch(w, now, None), Some(true), "its share is served");
    assert_eq!(p.slot(w).unwrap().state, State::Draining);
    assert_eq!(p.pick_for_session(now, 1, Duration::ZERO), None, "a draining worker takes no new session");
    assert_eq!(p.touch(w, now, None), Some(false), "but serves the sessions it has");
    assert_eq!(p.wants(), 1, "the pool wants a worker in its place");
    p.session_closed(w, now);
    let quiet = Duration::from_secs(5);
    assert_eq!(p.drained(now, quiet), vec![], "its traffic must go quiet first");
    assert_eq!(p.drained(now + quiet, quiet), vec![(w, Retire::Requests)], "then it stops");

    let ids = grow(&mut p, now);
    ready_all(&mut p, &ids, now);
    p.session_opened(ids[0], now, None);
    assert_eq!(p.sampled(ids[0], 5000), None);
    assert_eq!(p.slot(ids[0]).unwrap().state, State::Draining, "too big with sessions: drains");
    p.session_closed(ids[0], now);
    assert_eq!(p.drained(now + quiet, quiet), vec![(ids[0], Retire::Memory)]);
}

#[test]
fn sessions_go_to_the_least_loaded_worker_and_grow_the_pool_at_the_limit() {
    let now = Instant::now();
    let mut p: Pool<u32> = Pool::new(Limits { max_sessions: 2, ..limits(2, 3) }, Ids::default());
    let ids = grow(&mut p, now);
    ready_all(&mut p, &ids, now);
    let mut picks = Vec::new();
    for token in 0..4 {
        let id = p.pick_for_session(now, token, Duration::ZERO).unwrap();
        p.touch(id, now, Some(token));
        picks.push(id);
    }
    assert_eq!(picks, vec![1, 2, 1, 2], "fewest sessions first, counting browsers not yet connected");
    assert_eq!(
        p.pick_for_session(now, 9, Duration::ZERO),
        None,
        "browsers that came back for the assets hold their places"
    );
    for (token, id) in picks.into_iter().enumerate() {
        p.session_opened(id, now, Some(token as u64));
    }
    assert!(p.slots().all(|(_, s)| s.pending.is_empty()), "each session took its browser's place");
    assert_eq!(p.pick_for_session(now, 9, Duration::ZERO), None, "all full");
    p.session_wanted();
    assert_eq!(grow(&mut p, now), vec![3], "a waiting browser starts a worker");
    assert_eq!(grow(&mut p, now), Vec::<WorkerId>::new(), "one is starting already");
    p.session_served();
    p.session_closed(1, now);
    assert_eq!(p.pick_for_session(now, 10, Duration::ZERO), Some(1));
    let later = now + Duration::from_secs(100);
    assert!(p.prune(later, Duration::from_secs(1)).is_empty(), "workers with sessions are never pruned");
}

#[test]
fn page_loads_that_never_open_a_session_lock_nobody_out() {
    let now = Instant::now();
    let mut p: Pool<u32> = Pool::new(Limits { max_sessions: 2, ..limits(1, 1) }, Ids::default());
    let ids = grow(&mut p, now);
    ready_all(&mut p, &ids, now);
    for token in 0..40 {
        assert!(p.pick_for_session(now, token, Duration::ZERO).is_some(), "page load {token} is placed at once");
    }
    assert!(p.slot(ids[0]).unwrap().pending.len() <= 8, "and the bookkeeping stays bounded");
    p.session_opened(ids[0], now, Some(38));
    p.session_opened(ids[0], now, Some(39));
    assert_eq!(p.pick_for_session(now, 100, Duration::ZERO), None, "open sessions are the real limit");
}

#[test]
fn a_burst_below_n_max_waits_for_new_workers_rather_than_crowding_one() {
    let now = Instant::now();
    let mut p: Pool<u32> = Pool::new(Limits { max_sessions: 2, ..limits(1, 2) }, Ids::default());
    let ids = grow(&mut p, now);
    ready_all(&mut p, &ids, now);
    assert!(p.pick_for_session(now, 1, Duration::ZERO).is_some());
    assert!(p.pick_for_session(now, 2, Duration::ZERO).is_some());
    assert_eq!(
        p.pick_for_session(now, 3, Duration::ZERO),
        None,
        "the pool can grow: the third browser waits for a worker"
    );
    p.session_wanted();
    let new = grow(&mut p, now);
    assert_eq!(p.pick_for_session(now, 3, Duration::ZERO), None, "still starting");
    ready_all(&mut p, &new, now);
    assert_eq!(p.pick_for_session(now, 3, Duration::ZERO), Some(new[0]));
    assert!(
        p.pick_for_session(now + PENDING_FOR, 4, Duration::ZERO).is_some(),
        "browsers that stayed away stop counting"
    );
}

fn busy_aware(n_min: usize, n_max: usize, max_sessions: usize) -> (Pool<u32>, Instant, Vec<WorkerId>) {
    let now = Instant::now();
    let mut p: Pool<u32> =
        Pool::new(Limits { max_sessions, busy_threshold: 0.5, ..limits(n_min, n_max) }, Ids::default());
    let ids = grow(&mut p, now);
    ready_all(&mut p, &ids, now);
    (p, now, ids)
}

/// A browser placed on `id` at `now` opens its session there.
fn open_session(p: &mut Pool<u32>, id: WorkerId, now: Instant, token: u64) {
    p.session_opened(id, now, Some(token));
}

const SAMPLE: Duration = Duration::from_millis(250);

#[test]
fn a_new_session_goes_to_a_worker_whose_r_is_not_busy_even_if_it_holds_more_sessions() {
    let (mut p, t0, ids) = busy_aware(2, 2, 20);
    let (a, b) = (ids[0], ids[1]);
    for token in 0..3 {
        open_session(&mut p, a, t0, token);
    }
    open_session(&mut p, b, t0, 3);
    let t1 = t0 + Duration::from_secs(3);
    p.cpu_sampled(a, t1, t1 - SAMPLE, 0.02);
    p.cpu_sampled(b, t1, t1 - SAMPLE, 0.97);
    assert!(p.slot(b).unwrap().busy(t1, 0.5) && !p.slot(a).unwrap().busy(t1, 0.5));
    assert_eq!(p.pick_for_session(t1, 9, Duration::ZERO), Some(a), "the calm worker, though it holds 3 sessions");
    assert!(p.slot(a).unwrap().busy(t1, 0.5), "a browser on its way makes it busy until it has been seen working");
}

#[test]
fn when_every_worker_is_busy_the_pool_grows_and_the_browser_waits_for_the_new_worker() {
    let (mut p, t0, ids) = busy_aware(1, 3, 20);
    let w = ids[0];
    open_session(&mut p, w, t0, 1);
    let t1 = t0 + Duration::from_secs(3);
    p.cpu_sampled(w, t1, t1 - SAMPLE, 1.0);
    assert_eq!(p.pick_for_session(t1, 2, Duration::ZERO), None, "its only worker is busy: wait for another");
    p.session_wanted();
    let new = grow(&mut p, t1);
    assert_eq!(new.len(), 1, "one new worker for the one waiting browser");
    assert_eq!(p.pick_for_session(t1, 2, Duration::from_secs(1)), None, "still starting");
    ready_all(&mut p, &new, t1);
    assert_eq!(p.pick_for_session(t1, 2, Duration::from_secs(1)), Some(new[0]));
    p.session_served();
}

#[test]
fn a_worker_that_finishes_its_work_wakes_waiting_browsers_and_takes_them() {
    let (mut p, t0, ids) = busy_aware(1, 2, 20);
    let w = ids[0];
    open_session(&mut p, w, t0, 1);
    let t1 = t0 + Duration::from_secs(3);
    assert!(!p.cpu_sampled(w, t1, t1 - SAMPLE, 0.9), "busy, and nobody waits anyway");
    assert_eq!(p.pick_for_session(t1, 2, Duration::ZERO), None);
    p.session_wanted();
    let t2 = t1 + SAMPLE;
    assert!(p.cpu_sampled(w, t2, t1, 0.01), "calm again while a browser waits: wake it");
    assert_eq!(p.pick_for_session(t2, 2, SAMPLE), Some(w), "before the new worker is up");
}

#[test]
fn new_work_counts_as_busy_until_a_sample_that_began_after_it() {
    let (mut p, t0, ids) = busy_aware(1, 1, 20);
    let w = ids[0];
    p.cpu_sampled(w, t0, t0 - SAMPLE, 0.0);
    open_session(&mut p, w, t0 + Duration::from_millis(10), 1);
    let t1 = t0 + SAMPLE;
    p.cpu_sampled(w, t1, t0, 0.05);
    assert!(p.slot(w).unwrap().busy(t1, 0.5), "that window began before the session opened");
    let t2 = t1 + SAMPLE;
    p.cpu_sampled(w, t2, t1, 0.05);
    assert!(!p.slot(w).unwrap().busy(t2, 0.5), "a whole window after it, and R stayed calm: cheap work");
    // Without samples (no /proc), new work stops counting after NEW_WORK_FOR.
    let (mut q, t0, ids) = busy_aware(1, 1, 20);
    open_session(&mut q, ids[0], t0, 1);
    assert!(q.slot(ids[0]).unwrap().busy(t0 + NEW_WORK_FOR / 2, 0.5));
    assert!(!q.slot(ids[0]).unwrap().busy(t0 + NEW_WORK_FOR, 0.5));
}

#[test]
fn at_n_max_with_every_worker_busy_the_one_with_fewest_sessions_takes_it() {
    // The placement case: 6 sessions burn CPU on 4 workers (2, 2, 1, 1); a 7th arrives.
    let (mut p, t0, ids) = busy_aware(4, 4, 20);
    for (token, w) in [ids[0], ids[0], ids[1], ids[1], ids[2], ids[3]].into_iter().enumerate() {
        open_session(&mut p, w, t0, token as u64);
    }
    let t1 = t0 + Duration::from_secs(3);
    for w in &ids {
        p.cpu_sampled(*w, t1, t1 - SAMPLE, 0.5);
    }
    assert_eq!(p.pick_for_session(t1, 7, Duration::ZERO), Some(ids[2]), "not a worker holding 2");
}

#[test]
fn at_n_max_browsers_stuck_on_their_page_are_spread_not_stacked() {
    // Every worker busy; their pages wait on R, so no session opens: each
    // browser placed still weighs on its worker.
    let (mut p, t0, ids) = busy_aware(2, 2, 20);
    let t1 = t0 + Duration::from_secs(3);
    for w in &ids {
        p.cpu_sampled(*w, t1, t1 - SAMPLE, 1.0);
    }
    let picks: Vec<WorkerId> = (0..4).map(|t| p.pick_for_session(t1, t, Duration::ZERO).unwrap()).collect();
    assert_eq!(picks, vec![ids[0], ids[1], ids[0], ids[1]]);
}

#[test]
fn a_browser_waits_for_a_calm_worker_at_most_busy_patience() {
    let (mut p, t0, ids) = busy_aware(1, 2, 20);
    let w = ids[0];
    open_session(&mut p, w, t0, 1);
    let t1 = t0 + Duration::from_secs(3);
    p.cpu_sampled(w, t1, t1 - SAMPLE, 1.0);
    p.session_wanted();
    assert_eq!(p.grow(t1, 0).ids, Vec::<WorkerId>::new(), "the budget across apps is spent: nothing starts");
    assert_eq!(p.pick_for_session(t1, 2, BUSY_PATIENCE / 2), None, "the pool may still grow: wait");
    assert_eq!(p.pick_for_session(t1, 2, BUSY_PATIENCE), Some(w), "long enough: a busy worker with room it is");
    // A worker on its way is waited for, however slow its start (calm workers still wake the browser).
    let new = grow(&mut p, t1);
    assert_eq!(p.pick_for_session(t1, 3, BUSY_PATIENCE * 4), None);
    ready_all(&mut p, &new, t1);
    assert_eq!(p.pick_for_session(t1, 3, BUSY_PATIENCE * 4), Some(new[0]));
    // A full worker is not "busy with room": past patience the browser still waits for room.
    let (mut q, t0, ids) = busy_aware(1, 2, 1);
    open_session(&mut q, ids[0], t0, 1);
    assert_eq!(q.pick_for_session(t0, 2, BUSY_PATIENCE * 2), None);
}

#[test]
fn past_patience_a_busy_worker_with_a_free_place_beats_a_calm_one_whose_places_are_taken() {
    // CI's case: worker a took two browsers at once and went quiet while
    // their pages load; b and c started later and each took one. A fifth
    // browser that waited past BUSY_PATIENCE belongs on b or c, not on a.
    let (mut p, t0, ids) = busy_aware(3, 3, 2);
    let (a, b, c) = (ids[0], ids[1], ids[2]);
    for token in [1, 2] {
        p.slots.get_mut(&a).unwrap().pending.push_back(Pending { token, at: t0 });
    }
    p.slots.get_mut(&a).unwrap().new_work = Some(t0);
    let t1 = t0 + Duration::from_secs(5);
    assert!(!p.slot(a).unwrap().busy(t1, 0.5), "a's new work is old news");
    for (w, token) in [(b, 3), (c, 4)] {
        p.slots.get_mut(&w).unwrap().new_work = Some(t1);
        p.slots.get_mut(&w).unwrap().pending.push_back(Pending { token, at: t1 });
    }
    let picked = p.pick_for_session(t1, 5, BUSY_PATIENCE).unwrap();
    assert_ne!(picked, a, "a's two places are held by browsers on their way");
    // Only when every place is held by a browser on its way (a crawler's
    // page loads, say) do those browsers stop holding places.
    let picked = p.pick_for_session(t1, 6, BUSY_PATIENCE).unwrap();
    assert_ne!(picked, a);
    assert!(p.pick_for_session(t1, 7, BUSY_PATIENCE).is_some(), "all held, none open: still placed");
}

#[test]
fn threshold_zero_is_the_session_count_rule() {
    let now = Instant::now();
    let mut p: Pool<u32> = Pool::new(Limits { max_sessions: 20, ..limits(1, 4) }, Ids::default());
    let ids = grow(&mut p, now);
    ready_all(&mut p, &ids, now);
    open_session(&mut p, ids[0], now, 1);
    p.cpu_sampled(ids[0], now, now - SAMPLE, 1.0);
    assert!(!p.slot(ids[0]).unwrap().busy(now, 0.0));
    assert_eq!(p.pick_for_session(now, 2, Duration::ZERO), Some(ids[0]), "busy R, but it has room");
}

#[test]
fn prune_keeps_n_min_and_spares_busy_and_recent() {
    let (mut p, t0) = pool(1, 4);
    for w in 0..3 {
        p.enqueue(w);
    }
    let ids = grow(&mut p, t0);
    assert_eq!(p.live(), 3);
    p.drain_waiters();
    ready_all(&mut p, &ids, t0);
    let busy = p.checkout().unwrap();
    let later = t0 + Duration::from_secs(10);
    let stopped = p.prune(later, Duration::from_secs(5));
    assert_eq!(stopped.len(), 2, "busy worker stays, others age out");
    assert!(!stopped.contains(&busy));
    assert_eq!(p.prune(later, Duration::from_secs(5)), Vec::<WorkerId>::new());
    for id in stopped {
        p.exited(id, later);
    }
    assert_eq!(p.wants(), 0, "n_min still holds");
    assert_eq!(p.live(), 1);
}

#[test]
fn a_spare_worker_for_another_app_is_the_longest_idle_above_n_min() {
    let (mut p, t0) = pool(1, 3);
    for w in 0..3 {
        p.enqueue(w);
    }
    let ids = grow(&mut p, t0);
    assert_eq!(ids.len(), 3);
    p.drain_waiters();
    assert_eq!(p.spare(t0), None, "starting workers are not spare");
    for (i, id) in ids.iter().enumerate() {
        p.release(*id, t0 + Duration::from_secs(i as u64), Done::Ready, ALL);
    }
    assert_eq!(p.spare(t0), Some((ids[0], t0)));
    p.retire(ids[0], Retire::Budget);
    assert_eq!(p.spare(t0).map(|s| s.0), Some(ids[1]));
    p.retire(ids[1], Retire::Budget);
    assert_eq!(p.spare(t0), None, "never below n_min");
}

#[test]
fn idle_workers_are_probed_and_nothing_else_reaches_them_meanwhile() {
    let (mut p, t0) = pool(2, 2);
    let ids = grow(&mut p, t0);
    ready_all(&mut p, &ids, t0);
    let busy = p.checkout().unwrap();
    let due = p.due_for_probe(t0 + Duration::from_secs(2), Duration::from_secs(1));
    assert_eq!(due.len(), 1, "busy workers are not probed");
    assert_ne!(due[0], busy);
    assert_eq!(p.checkout(), None, "a worker being probed takes no request");
    assert_eq!(p.answering(), 2, "a probed worker still counts as answering");
    assert_eq!(p.touch(due[0], t0, None), Some(false), "a Shiny browser's requests go on during a probe");
    assert!(matches!(p.release(due[0], t0, Done::Probed, ALL), Release::Idle));
    assert_eq!(p.slot(due[0]).unwrap().served, 1, "a probe is not a request");
}

#[test]
fn retiring_takes_a_worker_out_once() {
    let (mut p, now) = pool(2, 3);
    let ids = grow(&mut p, now);
    ready_all(&mut p, &ids, now);
    assert!(p.retire(1, Retire::Broken));
    assert!(!p.retire(1, Retire::Broken), "retiring twice does nothing more");
    assert!(!p.retire(99, Retire::Broken));
    assert_eq!(p.wants(), 1, "a replacement keeps n_min");
    assert_eq!(p.processes(), 2, "the stopping worker still counts against the budget");
}

#[test]
fn stopping_workers_take_nothing_and_release_reports_gone() {
    let (mut p, now) = pool(1, 1);
    let ids = grow(&mut p, now);
    ready_all(&mut p, &ids, now);
    let w = p.checkout().unwrap();
    p.enqueue(1);
    assert_eq!(p.retire_all(), vec![w]);
    assert!(matches!(p.release(w, now, Done::Completed, ALL), Release::Gone));
    assert_eq!(p.drain_waiters(), vec![1]);
}
