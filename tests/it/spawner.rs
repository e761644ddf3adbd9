//! As root, every process valve starts is started by its privileged
//! spawner, which takes only requests that keep its rules: sent requests
//! that break them are refused, said on the log, and start nothing. The
//! spawner and valve's server live and die together, and no R process
//! outlives either.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use crate::harness::{app_dir, as_root, fixture, need_r_packages, pid_alive, spawner_of, wait_until, Valve};
use crate::rmarkdown::get;

/// A request to start R as `ids` for `app` that writes `mark` if it ever runs.
fn start_request(
    id: u64,
    kind: &str,
    app: Option<&str>,
    ids: Option<(u64, u64)>,
    keep: Option<u64>,
    mark: &Path,
) -> String {
    let code = format!("file.create('{}')", mark.display());
    serde_json::json!({
        "ask": "start", "id": id, "kind": kind, "app": app, "program": "R",
        "args": ["--no-echo", "-e", code], "env": [], "clear_env": false, "cwd": null,
        "piped": [false, false, false], "thp_off": false, "group_dies": false, "keep": keep,
        "sandbox": { "steps": null, "workdir": null, "data_limit": null, "oom_score_adj": null,
                     "ids": ids.map(|(u, g)| serde_json::json!([u, g, []])) },
    })
    .to_string()
}

#[test]
fn as_root_the_spawner_refuses_requests_that_break_its_rules_says_why_and_starts_nothing() {
    need_r_packages(&["plumber"]);
    assert!(as_root(), "this test checks what valve does as root: run the tests as root, as CI does");
    let dir = app_dir();
    let marks = dir.path().join("marks");
    std::fs::create_dir(&marks).unwrap();
    std::fs::set_permissions(&marks, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mark = |n: &str| marks.join(n);
    let in_range = Some((1_950_000_001, 1_950_000_001));
    let warm = serde_json::json!({
        "ask": "start", "id": 1_000_006, "kind": "warm_parent", "app": null, "program": "R",
        "args": ["--no-echo", "--no-restore", "--no-save", "--file=/root/zygote.R"], "env": [],
        "clear_env": true, "cwd": null, "piped": [false, false, false], "thp_off": true, "group_dies": false, "keep": 192,
        "sandbox": null,
    });
    let asks = [
        (start_request(1_000_001, "app", Some("api"), Some((0, 0)), None, &mark("root")), "root's is never an app's"),
        (
            start_request(1_000_002, "app", Some("api"), Some((4_000_000, 4_000_000)), None, &mark("out")),
            "outside uid_range",
        ),
        (start_request(1_000_003, "app", Some("nobody"), in_range, None, &mark("unknown")), "know it"),
        (start_request(1_000_004, "app", Some("api"), in_range, Some(1 << 7), &mark("caps")), "keeps no capability"),
        (start_request(1_000_005, "app", Some("api"), None, None, &mark("asroot")), "needs a uid"),
        (warm.to_string(), "outside valve's folders"),
        ("{\"ask\":\"start\",".to_string(), "a malformed request"),
        ("{\"ask\":\"chown\",\"path\":\"/etc/shadow\",\"uid\":1950000001}".to_string(), "unknown variant `chown`"),
        ("{\"ask\":\"signal\",\"id\":1,\"sig\":9,\"group\":true,\"pid\":1}".to_string(), "unknown field `pid`"),
    ];
    let file = dir.path().join("asks");
    std::fs::write(&file, asks.iter().map(|(a, _)| format!("{a}\n")).collect::<String>()).unwrap();
    let config = dir.path().join("valve.toml");
    std::fs::write(
        &config,
        format!("[[app]]\nname = \"api\"\npath = \"/api\"\nfile = \"{}\"\n", fixture("api.R").display()),
    )
    .unwrap();
    let v = Valve::start_with_env(
        &["--config", config.to_str().unwrap()],
        &[("VALVE_HOOK_SPAWNER_ASKS", file.to_str().unwrap())],
    );
    assert_eq!(get(&v.get("/api/pid")).0, 200, "the app itself starts through the spawner");
    for (_, says) in &asks {
        v.wait_for_log(says, Duration::from_secs(20));
    }
    let refused = v.log().lines().filter(|l| l.contains("privileged spawner: refused")).count();
    assert_eq!(refused, asks.len(), "each refused once: {}", v.log());
    // Had any been started, R would have had seconds to write its mark.
    std::thread::sleep(Duration::from_secs(3));
    let made: Vec<_> = std::fs::read_dir(&marks).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(made.is_empty(), "a refused request ran: {made:?}");
    assert_eq!(get(&v.get("/api/pid")).0, 200, "valve serves on");
}

#[test]
fn killing_the_spawner_stops_valve_and_its_workers_and_killing_valve_stops_the_spawner() {
    need_r_packages(&["plumber"]);
    assert!(as_root(), "this test checks what valve does as root: run the tests as root, as CI does");
    let api = fixture("api.R").display().to_string();
    let mut v = Valve::start(&["-f", &api, "-n", "2", "--n-min", "2"]);
    let spawner = spawner_of(v.pid()).expect("valve as root has a privileged spawner");
    let workers = v.r_processes();
    assert!(!workers.is_empty());
    unsafe { libc::kill(spawner as i32, libc::SIGKILL) };
    let status = v.wait_exit(Duration::from_secs(30));
    assert_ne!(status.code(), Some(0), "valve says it stopped for a reason: {}", v.log());
    assert!(v.log().contains("the privileged spawner exited"), "{}", v.log());
    wait_until("no worker outlives them", Duration::from_secs(10), || workers.iter().all(|p| !pid_alive(*p)));

    let mut v = Valve::start(&["-f", &api, "-n", "2", "--n-min", "2"]);
    let spawner = spawner_of(v.pid()).expect("a spawner");
    let workers = v.r_processes();
    v.signal(libc::SIGKILL);
    let _ = v.wait_exit(Duration::from_secs(10));
    wait_until("the spawner and the workers to go with valve", Duration::from_secs(10), || {
        !pid_alive(spawner) && workers.iter().all(|p| !pid_alive(*p))
    });
}

#[test]
fn as_root_a_fork_the_server_asks_of_the_warm_parent_as_root_is_refused_and_a_fresh_r_serves() {
    need_r_packages(&["plumber"]);
    assert!(as_root(), "this test checks what valve does as root: run the tests as root, as CI does");
    if crate::harness::preloading() {
        eprintln!("with --preload the app's own parent forks its workers: no warm parent to ask");
        return;
    }
    let dir = app_dir();
    let config = dir.path().join("valve.toml");
    std::fs::write(
        &config,
        format!("[[app]]\nname = \"api\"\npath = \"/api\"\nfile = \"{}\"\n", fixture("api.R").display()),
    )
    .unwrap();
    // valve's server (as if taken over) asks for forks with uid and gid 0.
    let v = Valve::start_with_env(&["--config", config.to_str().unwrap()], &[("VALVE_HOOK_FORK_AS_ROOT", "1")]);
    assert_eq!(get(&v.get("/api/pid")).0, 200, "the app serves all the same");
    v.wait_for_log("failed uid 0: errno 1", Duration::from_secs(30));
    assert!(v.log().contains("the app's workers start as fresh R, not from the warm parent"), "{}", v.log());
    let parent = v.preload_parent();
    for pid in v.workers().into_iter().filter(|p| Some(*p) != parent) {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let uids = status.lines().find(|l| l.starts_with("Uid:")).unwrap_or("").to_string();
        assert!(!uids.split_whitespace().skip(1).any(|u| u == "0"), "worker {pid} runs as root: {uids}");
    }
}
