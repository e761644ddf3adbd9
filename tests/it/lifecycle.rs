//! Starting and stopping: bad flags and broken APIs fail fast with a clear
//! message, and no R process outlives valve, however valve ends.

use std::time::Duration;

use crate::harness::{client, example, fixture, pid_alive, state_and_parent, wait_until, Valve};

/// The live processes whose environment holds `needle` (`NAME=value`).
pub(crate) fn processes_with_env(needle: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        if let Ok(env) = std::fs::read(entry.path().join("environ")) {
            if env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()) && pid_alive(pid) {
                found.push(pid);
            }
        }
    }
    found
}

#[test]
fn n_min_above_n_max_is_one_line_and_exit_2() {
    let out = Valve::run_to_exit(
        &["-f", example().to_str().unwrap(), "--n-min", "5", "-n", "2", "--port", "0"],
        Duration::from_secs(10),
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(out.stderr.trim(), "valve: error: --n-min 5 is above --n-max 2: raise --n-max or lower --n-min");
}

#[test]
fn missing_file_is_one_line_and_exit_2() {
    let out = Valve::run_to_exit(&["-f", "/nonexistent/plumber.R", "--port", "0"], Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
    assert!(out.stderr.contains("app not found: /nonexistent/plumber.R"), "{}", out.stderr);
}

#[test]
fn an_api_that_fails_to_load_exits_with_rs_message_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let api = dir.path().join("plumber.R");
    std::fs::copy(fixture("broken.R"), &api).unwrap();
    let out = Valve::run_to_exit(
        &["-f", api.to_str().unwrap(), "-n", "2", "--n-min", "2", "--port", "0"],
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stderr.contains("could not start"), "{}", out.stderr);
    assert!(out.stderr.contains("unexpected"), "R's own parse error is shown: {}", out.stderr);
    assert!(out.stderr.contains("hint: "), "{}", out.stderr);
    // No restart loop: each of the two workers tried once (counted, not timed:
    // a worker's own output line names it; the error repeats R's last lines).
    let tries =
        out.stderr.lines().filter(|l| l.contains("valve: the API failed to load") && l.contains(" worker=")).count();
    assert!((1..=2).contains(&tries), "each worker tries once, not again and again: {tries} tries\n{}", out.stderr);
    let leftover = processes_with_env(&format!("VALVE_APP={}", api.display()));
    assert!(leftover.is_empty(), "R processes left behind: {leftover:?}");
}

#[test]
fn missing_r_says_how_to_install_it() {
    let out = Valve::run_to_exit(
        &["-f", example().to_str().unwrap(), "--r-bin", "/nonexistent/R", "--port", "0"],
        Duration::from_secs(10),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stderr.contains("cannot run R (/nonexistent/R): not found"), "{}", out.stderr);
    assert!(out.stderr.contains("apt-get install r-base-core r-cran-plumber"), "{}", out.stderr);
}

#[test]
fn missing_plumber_package_says_how_to_install_it() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("lib");
    std::fs::create_dir(&empty).unwrap();
    let wrapper = dir.path().join("R");
    let script = format!("#!/bin/sh\nexec env R_LIBS_SITE={0} R_LIBS_USER={0} R_LIBS={0} R \"$@\"\n", empty.display());
    std::fs::write(&wrapper, script).unwrap();
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = Valve::run_to_exit(
        &["-f", example().to_str().unwrap(), "--r-bin", wrapper.to_str().unwrap(), "--port", "0"],
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stderr.contains("the R package 'plumber' is not installed"), "{}", out.stderr);
    assert!(out.stderr.contains("apt-get install r-base-core r-cran-plumber"), "{}", out.stderr);
}

#[test]
fn a_port_in_use_is_refused_clearly() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let out = Valve::run_to_exit(&["-f", example().to_str().unwrap(), "--port", &port], Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stderr.contains(&format!("cannot listen on 127.0.0.1:{port}")), "{}", out.stderr);
    assert!(out.stderr.contains("pick another --port"), "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_drains_in_flight_requests_then_stops_every_worker() {
    let mut valve = Valve::start(&["-f", fixture("api.R").to_str().unwrap(), "-n", "2", "--n-min", "2"]);
    assert_eq!(valve.workers().len(), 2);
    let workers = valve.r_processes();
    let in_flight = tokio::spawn({
        let url = valve.get("/sleep?zzz=1");
        async move { client().get(url).send().await.map(|r| r.status().as_u16()) }
    });
    valve.wait_for_requests(1, 0);
    valve.signal(libc::SIGTERM);
    assert_eq!(in_flight.await.unwrap().unwrap(), 200, "the request in flight finished");
    let status = valve.wait_exit(Duration::from_secs(15));
    assert_eq!(status.code(), Some(0), "a clean drain exits 0");
    for pid in workers {
        assert!(!pid_alive(pid), "worker {pid} outlived valve");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_of_valve_takes_the_workers_with_it() {
    // A worker busy in R cannot notice valve's end on its own, and a Shiny
    // worker has no connection to valve between requests: only the kernel's
    // parent-death signal takes them (which becoming the app's user, as root,
    // clears: it is set again after).
    let mut valve = Valve::start(&["-f", fixture("api.R").to_str().unwrap(), "-n", "3", "--n-min", "3"]);
    assert_eq!(valve.workers().len(), 3);
    let hang = tokio::spawn(client().get(valve.get("/hang")).send());
    wait_until("a worker busy in R", Duration::from_secs(10), || {
        valve.status()["pool"]["busy"].as_u64().unwrap_or(0) >= 1
    });
    let mut shiny = Valve::start(&["-f", fixture("shiny_whoami").to_str().unwrap(), "-n", "2", "--n-min", "2"]);
    assert_eq!(shiny.workers().len(), 2);
    for valve in [&mut valve, &mut shiny] {
        let workers = valve.r_processes();
        valve.signal(libc::SIGKILL);
        valve.wait_exit(Duration::from_secs(5));
        wait_until("workers to die with valve", Duration::from_secs(5), || workers.iter().all(|p| !pid_alive(*p)));
    }
    hang.abort();
}

#[test]
fn json_logs_are_json_on_every_line_even_when_the_app_fails() {
    let dir = tempfile::tempdir().unwrap();
    let api = dir.path().join("plumber.R");
    std::fs::copy(fixture("broken.R"), &api).unwrap();
    let out = Valve::run_to_exit(
        &["-f", api.to_str().unwrap(), "--port", "0", "--log-format", "json"],
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(1));
    let lines: Vec<&str> = out.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines.len() > 3, "{}", out.stderr);
    for line in &lines {
        assert!(serde_json::from_str::<serde_json::Value>(line).is_ok(), "not JSON: {line}");
    }
    assert!(out.stderr.contains("unexpected"), "R's own error is in there: {}", out.stderr);
    let bad_flag = Valve::run_to_exit(&["--log-format", "json", "--n-max", "none"], Duration::from_secs(10));
    assert_eq!(bad_flag.status.code(), Some(2));
    assert!(serde_json::from_str::<serde_json::Value>(bad_flag.stderr.trim()).is_ok(), "{}", bad_flag.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn logs_written_to_a_pipe_carry_no_colour_codes() {
    let valve = Valve::start(&["-f", fixture("api.R").to_str().unwrap()]);
    client().get(valve.get("/pid")).send().await.unwrap();
    valve.wait_for_log("path=/pid", Duration::from_secs(5));
    assert!(!valve.log().contains('\u{1b}'), "ANSI escapes in a piped log:\n{}", valve.log());
}

/// The kernel's transparent-huge-page mode, the bracketed word of
/// `always [madvise] never`.
fn thp_mode() -> String {
    let text = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    text.split('[').nth(1).and_then(|s| s.split(']').next()).unwrap_or("never").to_string()
}

fn anon_huge_kb(pid: u32) -> u64 {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    rollup
        .lines()
        .find(|l| l.starts_with("AnonHugePages:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// Whether the kernel lets process `pid` have transparent huge pages
/// (`THP_enabled` in its status: 0 once PR_SET_THP_DISABLE is set on it or
/// on the parent it was forked from).
fn thp_enabled(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("THP_enabled:")).is_none_or(|v| v.trim() != "0")
}

/// valve asks glibc's malloc for transparent huge pages in every R process it
/// starts (less R CPU per request, bench/r-cost), keeps the user's other
/// tunables, and leaves a user's own `glibc.malloc.hugetlb` alone; an R
/// process valve forks workers from (the warm parent, a preload parent) and
/// its forks do without (bench/packages c.: a fork writing into a huge page it
/// shares with its parent is slower on its slowest requests).
#[tokio::test(flavor = "multi_thread")]
async fn fresh_workers_ask_for_huge_pages_unless_the_user_said_otherwise_and_forks_do_without() {
    let api = fixture("api.R");
    let tunables = |valve: &Valve| {
        let url = valve.get("/env?name=GLIBC_TUNABLES");
        async move {
            let body: serde_json::Value = client().get(url).send().await.unwrap().json().await.unwrap();
            body["value"][0].as_str().unwrap_or("(unset)").to_string()
        }
    };
    let madvise = thp_mode() == "madvise";

    // A fresh R (under VALVE_PRELOAD=true the workers are forks even so).
    let valve = Valve::start_with_env(
        &["-f", api.to_str().unwrap(), "--warm-parent", "false"],
        &[("GLIBC_TUNABLES", "glibc.malloc.arena_max=4")],
    );
    assert_eq!(tunables(&valve).await, "glibc.malloc.arena_max=4:glibc.malloc.hugetlb=1");
    let worker = valve.workers()[0];
    match valve.preload_parent() {
        None => {
            assert!(thp_enabled(worker), "a fresh R worker {worker} may not have huge pages");
            if madvise {
                assert!(anon_huge_kb(worker) > 0, "no transparent huge pages in R process {worker}");
            }
        }
        Some(parent) => {
            for pid in [parent, worker] {
                assert!(!thp_enabled(pid), "the preload parent or its fork {pid} may have huge pages");
                assert_eq!(anon_huge_kb(pid), 0, "huge pages in the preload parent or its fork {pid}");
            }
        }
    }
    drop(valve);

    // The warm parent's forks (the default), and the warm parent itself.
    let valve = Valve::start(&["-f", api.to_str().unwrap()]);
    let worker = valve.workers()[0];
    let (_, parent) = state_and_parent(worker).unwrap();
    assert_ne!(parent, valve.pid(), "worker {worker} is a fork, not valve's child");
    for pid in [parent, worker] {
        assert!(!thp_enabled(pid), "the warm parent or its fork {pid} may have huge pages");
        assert_eq!(anon_huge_kb(pid), 0, "huge pages in the warm parent or its fork {pid}");
    }
    drop(valve);

    let valve = Valve::start_with_env(
        &["-f", api.to_str().unwrap(), "--warm-parent", "false"],
        &[("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0")],
    );
    assert_eq!(tunables(&valve).await, "glibc.malloc.hugetlb=0", "the user's choice stands");
    let pid = valve.workers()[0];
    assert_eq!(anon_huge_kb(pid), 0, "huge pages in R process {pid} though the user turned them off");
}
