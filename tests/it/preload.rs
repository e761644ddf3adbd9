//! `--preload`: workers forked from one parent that loaded the API once.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::harness::{children, client, fixture, pid_alive, spawner_of, state_and_parent, wait_until, Valve};

fn preload_api() -> String {
    fixture("preload.R").to_str().unwrap().to_string()
}

/// Calls `/info?zzz=` on `n` workers at once, so each answer comes from a different one.
async fn info_from_each(valve: &Valve, n: usize) -> Vec<serde_json::Value> {
    let calls = (0..n).map(|_| {
        let url = valve.get("/info?zzz=0.5");
        async move { client().get(url).send().await.unwrap().json::<serde_json::Value>().await.unwrap() }
    });
    futures::future::join_all(calls).await
}

fn pss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Pss:"))?.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn forks_share_the_loaded_object_yet_are_individuals() {
    let valve = Valve::start(&["-f", &preload_api(), "--preload", "-n", "3", "--n-min", "3"]);
    let answers = info_from_each(&valve, 3).await;
    let pids: BTreeSet<_> = answers.iter().map(|a| a["pid"][0].as_u64().unwrap()).collect();
    assert_eq!(pids.len(), 3, "three forks answered: {answers:?}");
    let randoms: BTreeSet<_> = answers.iter().map(|a| a["random"][0].to_string()).collect();
    assert_eq!(randoms.len(), 3, "each fork draws its own random numbers: {answers:?}");
    let tmps: BTreeSet<_> = answers.iter().map(|a| a["tempdir"][0].to_string()).collect();
    assert_eq!(tmps.len(), 3, "each fork has its own tempdir(): {answers:?}");
    for a in &answers {
        assert_eq!(a["setup_runs"][0], 1, "the per-worker set-up ran once in each fork: {a}");
    }
    let sums: BTreeSet<_> = answers.iter().map(|a| a["big_sum"][0].to_string()).collect();
    assert_eq!(sums.len(), 1, "every fork sees the parent's object");
    valve.wait_for_log("worker set-up ran in", Duration::from_secs(5));

    // The 200 MB object is in memory once: the parent's and forks' PSS add up to
    // far less than 4 copies (the parent plus three forks loading it each).
    let parent = valve.preload_parent().expect("a preload parent runs");
    let total_kb: u64 = valve.r_processes().iter().map(|p| pss_kb(*p)).sum();
    let object_kb = 200 * 1024;
    eprintln!("preload: total PSS {} MB for parent {parent} and 3 forks", total_kb / 1024);
    assert!(total_kb < 2 * object_kb, "PSS {} MB: the object is not shared", total_kb / 1024);
}

#[tokio::test(flavor = "multi_thread")]
async fn forks_start_in_milliseconds() {
    let valve = Valve::start(&["-f", &preload_api(), "--preload", "-n", "4"]);
    info_from_each(&valve, 4).await;
    wait_until("four forks", Duration::from_secs(10), || valve.workers().len() == 4);
    let log = valve.log();
    let startups: Vec<u64> = log
        .lines()
        .filter(|l| l.contains("worker ready"))
        .filter_map(|l| l.split("startup_ms=").nth(1)?.split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(startups.len(), 4, "{log}");
    // The first waits for the parent to load; the ones forked after it do not.
    assert!(startups[1..].iter().all(|ms| *ms < 1000), "forks took {startups:?} ms");
}

#[tokio::test(flavor = "multi_thread")]
async fn killing_the_parent_keeps_serving_and_it_comes_back() {
    let valve = Valve::start(&["-f", &preload_api(), "--preload", "-n", "3", "--n-min", "1"]);
    let parent = valve.preload_parent().unwrap();
    let first = valve.workers();
    unsafe { libc::kill(parent as i32, libc::SIGKILL) };
    valve.wait_for_log("preload parent exited", Duration::from_secs(5));
    let r = client().get(valve.get("/pid")).send().await.unwrap();
    assert_eq!(r.status(), 200, "the existing fork still serves");
    // New workers need a new parent: valve starts one.
    let answers = info_from_each(&valve, 3).await;
    assert_eq!(answers.len(), 3);
    let new_parent = valve.preload_parent().expect("a new parent runs");
    assert_ne!(new_parent, parent);
    assert!(first.iter().all(|p| pid_alive(*p)), "forks of the old parent lived on");
}

#[tokio::test(flavor = "multi_thread")]
async fn no_fork_outlives_valve_even_after_sigkill() {
    let mut valve = Valve::start(&["-f", &preload_api(), "--preload", "-n", "3", "--n-min", "3"]);
    let all = valve.r_processes();
    assert_eq!(all.len(), 4, "a parent and three forks");
    valve.signal(libc::SIGKILL);
    valve.wait_exit(Duration::from_secs(5));
    wait_until("the parent and every fork to die", Duration::from_secs(5), || all.iter().all(|p| !pid_alive(*p)));

    let mut valve = Valve::start(&["-f", &preload_api(), "--preload", "-n", "2", "--n-min", "2"]);
    let all = valve.r_processes();
    valve.signal(libc::SIGTERM);
    assert_eq!(valve.wait_exit(Duration::from_secs(10)).code(), Some(0));
    wait_until("everything stopped on SIGTERM", Duration::from_secs(5), || all.iter().all(|p| !pid_alive(*p)));
}

/// valve's children that are zombies: exited, never reaped.
fn zombie_children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
        let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        out.extend(list.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
    }
    out.retain(|p| state_and_parent(*p).is_some_and(|(state, _)| state == "Z"));
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn forks_of_a_dead_parent_become_valves_and_are_reaped_never_zombies() {
    let mut valve = Valve::start(&["-f", &preload_api(), "--preload", "-n", "3", "--n-min", "2"]);
    let parent = valve.preload_parent().unwrap();
    let forks = children(parent);
    assert_eq!(forks.len(), 2, "two forks of {parent}: {forks:?}");
    unsafe { libc::kill(parent as i32, libc::SIGKILL) };
    valve.wait_for_log("preload parent exited", Duration::from_secs(5));
    assert!(
        valve.log().contains("killed by signal 9"),
        "the parent's own exit status still reaches valve: {}",
        valve.log()
    );
    // valve (as root its privileged spawner, the parent of what valve
    // starts) is a child subreaper: the orphans are its children now, not init's.
    let reaper = spawner_of(valve.pid()).unwrap_or(valve.pid());
    wait_until("the orphaned forks to be valve's children", Duration::from_secs(5), || {
        forks.iter().all(|f| state_and_parent(*f).is_some_and(|(_, ppid)| ppid == reaper))
    });

    // One dies from outside: valve replaces it (with a new parent) and reaps it.
    unsafe { libc::kill(forks[0] as i32, libc::SIGKILL) };
    wait_until("the killed fork to be reaped", Duration::from_secs(10), || {
        state_and_parent(forks[0]).is_none_or(|(state, ppid)| state != "Z" && ppid != reaper)
    });
    let answers = info_from_each(&valve, 2).await;
    assert_eq!(answers.len(), 2);
    assert!(zombie_children(reaper).is_empty(), "zombies: {:?}", zombie_children(reaper));

    // The other ends through valve (SIGTERM at shutdown): reaped as well, and
    // valve still exits 0.
    let survivor = forks[1];
    valve.signal(libc::SIGTERM);
    wait_until("the orphaned fork to stop and be reaped", Duration::from_secs(10), || {
        state_and_parent(survivor).is_none_or(|(state, ppid)| state != "Z" && ppid != reaper)
    });
    assert_eq!(valve.wait_exit(Duration::from_secs(10)).code(), Some(0));
}
