//! Apps that cannot touch each other or valve: run as root (as CI runs),
//! valve gives each app's R a user of its own, a private view of the files
//! and its memory limit. Each promise is tried from inside R, as an app would
//! try it (tests/fixtures/isolation/alpha); beta is a Shiny app whose
//! password sits in its own `.Renviron`, mode 644.

use std::path::Path;
use std::time::Duration;

use crate::harness::{app_dir, as_root, fixture, need_r_packages, pid_alive, Valve, START_DEADLINE};
use crate::rmarkdown::get;

/// GET `url`: 200 and its JSON body (the isolation tests' probes answer JSON).
pub(crate) fn get_json(url: &str) -> serde_json::Value {
    let (code, body) = get(url);
    assert_eq!(code, 200, "GET {url}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {url}: not JSON ({e}): {body}"))
}

fn status_code(url: &str) -> u16 {
    get(url).0
}

/// A process's real uid, as root reads it.
fn uid_of(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn config(alpha: &Path, beta: &Path, extra: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = app_dir();
    let file = dir.path().join("valve.toml");
    std::fs::write(
        &file,
        format!(
            "max_workers = 3\n{extra}\n\
             [[app]]\nname = \"alpha\"\nfile = \"{}\"\nn_max = 1\nmemory_limit = \"400MB\"\n\
             env = {{ ALPHA_FROM_CONFIG = \"from-config\" }}\n\n\
             [[app]]\nname = \"beta\"\nfile = \"{}\"\nn_max = 1\n",
            alpha.display(),
            beta.display()
        ),
    )
    .unwrap();
    (dir, file)
}

#[test]
fn an_app_cannot_read_signal_or_reach_another_app_or_valve_and_its_memory_limit_fails_it_alone() {
    need_r_packages(&["plumber", "shiny"]);
    assert!(as_root(), "this test checks what valve does as root: run the tests as root, as CI does");
    let (alpha_dir, beta_dir) = (fixture("isolation/alpha"), fixture("isolation/beta"));
    let (_cfg, file) = config(&alpha_dir, &beta_dir, "");
    let v = Valve::start(&["--config", file.to_str().unwrap()]);
    let alpha = |path: &str| get_json(&v.get(&format!("/alpha{path}")));

    // Each app's R runs as a user of its own, never root; files valid for the app work as in plain R.
    let me = alpha("/whoami");
    let alpha_uid = me["uid"].as_u64().unwrap() as u32;
    assert_ne!(alpha_uid, 0, "R never runs as root: {me}");
    assert_eq!(me["wd"], alpha_dir.display().to_string(), "the app's folder is its working directory");
    assert_eq!(me["renviron"], "read-by-r-at-start", "its .Renviron is read at start: {me}");
    assert_eq!(me["rprofile"], "read", "its project .Rprofile is read at start: {me}");
    assert_eq!(me["library"], alpha_dir.join("lib").display().to_string(), "its own library first, as renv's: {me}");
    assert_eq!(me["env"], "from-config", "its env from the config: {me}");
    assert_eq!(me["relative"], "alpha's own data", "relative paths: {me}");
    // Its private temporary folder is its /tmp (a preloaded fork's own folder inside it).
    assert!(me["tmpdir"].as_str().unwrap().starts_with("/tmp"), "{me}");
    assert_eq!(me["home_writable"], true, "its private home is its own: {me}");
    assert_eq!(status_code(&v.get("/beta/")), 200, "beta serves");
    let status = v.status();
    let app = |name: &str| status["apps"].as_array().unwrap().iter().find(|a| a["name"] == name).unwrap().clone();
    let beta_pid = app("beta")["workers"][0]["pid"].as_u64().expect("beta's worker and its pid") as u32;
    let beta_uid = uid_of(beta_pid);
    assert!(beta_uid != 0 && beta_uid != alpha_uid, "two apps, two users: alpha {alpha_uid}, beta {beta_uid}");
    assert_eq!(app("alpha")["uid"].as_u64(), Some(u64::from(alpha_uid)), "the status names each app's user");
    assert_eq!(app("alpha")["isolation"], "own user, private view");
    assert_eq!(app("alpha")["memory_limit"].as_u64(), Some(400 << 20));

    // Another app's files, however readable they are on disk.
    let beta_renviron = beta_dir.join(".Renviron");
    for path in ["../beta/.Renviron".to_string(), beta_renviron.display().to_string()] {
        let read = alpha(&format!("/read?path={path}"));
        let text = read["text"].as_str().unwrap();
        assert!(text.starts_with("ERROR") && !text.contains("hunter2"), "{path}: {read}");
    }
    // valve's config file: not in alpha's view (or an empty file where its folder is).
    let read = alpha(&format!("/read?path={}", file.display()));
    let text = read["text"].as_str().unwrap();
    assert!(text.is_empty() || text.starts_with("ERROR"), "the config file is hidden: {read}");

    // valve's environment and memory, and beta's environment.
    let valve_pid = v.pid();
    for path in [format!("/proc/{valve_pid}/environ"), format!("/proc/{beta_pid}/environ")] {
        let read = alpha(&format!("/read?path={path}"));
        assert!(read["text"].as_str().unwrap().starts_with("ERROR"), "{path}: {read}");
    }
    for pid in [valve_pid, beta_pid] {
        let mem = alpha(&format!("/mem?pid={pid}"));
        assert!(mem["maps"].as_str().unwrap().starts_with("ERROR"), "maps of {pid}: {mem}");
        assert!(mem["mem"].as_str().is_some_and(|m| m.starts_with("ERROR")), "mem of {pid}: {mem}");
    }

    // A file an answer names is opened (and deleted, when handed over) as the
    // worker would: valve sends neither root's secrets nor another app's file.
    let beta_file = beta_dir.join(".Renviron");
    for (path, owned) in [("/etc/shadow", "false"), (beta_file.to_str().unwrap(), "true")] {
        let (code, body) = get(&v.get(&format!("/alpha/sendfile?path={path}&owned={owned}")));
        assert_eq!(code, 500, "{path}: {body}");
        assert!(!body.contains("root:") && !body.contains("hunter2"), "{path}: {body}");
    }
    assert!(beta_file.exists(), "beta's file was not deleted for alpha");
    let (code, body) = get(&v.get("/alpha/sendfile?path=data.txt"));
    assert_eq!((code, body.as_str()), (200, "alpha's own data\n"), "its own file, by a relative path");

    // Signals: beta's worker and valve live on.
    for pid in [beta_pid, valve_pid] {
        let kill = alpha(&format!("/kill?pid={pid}&signal=9"));
        assert_eq!(kill["sent"], false, "SIGKILL to {pid}: {kill}");
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(pid_alive(beta_pid) && pid_alive(valve_pid));

    // beta's socket: not there for alpha, and no answer from it.
    let run_dir = crate::harness::run_dir_of([beta_pid]).expect("valve's run directory, from beta's worker");
    let beta_id = app("beta")["workers"][0]["id"].as_u64().unwrap();
    let socket = run_dir.join(format!("apps/beta/own/w{beta_id}.sock")).display().to_string();
    assert!(Path::new(&socket).exists(), "the socket exists for valve: {socket}");
    let talk = alpha(&format!("/socket?path={socket}"));
    assert_eq!(talk["exists"], false, "beta's socket is not in alpha's view: {talk}");
    assert_eq!(talk["status"], "000", "no answer from beta's R: {talk}");

    // Past its memory limit, alpha's allocation fails alone: its next
    // request, beta and valve are fine.
    let (code, big) = get(&v.get("/alpha/alloc?mb=3000"));
    assert_eq!(code, 500, "R's allocation failed, plumber said so: {big}");
    assert_eq!(alpha("/alloc?mb=10")["result"], "allocated");
    assert_eq!(alpha("/whoami")["uid"].as_u64(), Some(u64::from(alpha_uid)));
    assert_eq!(status_code(&v.get("/beta/")), 200);
    v.wait_for_log("reached the app's memory_limit", START_DEADLINE);
    let (_, metrics) = get(&format!("{}/__valve__/metrics", v.admin_url()));
    assert!(metrics.contains("valve_memory_limit_errors_total{app=\"alpha\"} 1"), "{metrics}");
    assert!(metrics.contains(&format!("valve_memory_limit_bytes{{app=\"alpha\"}} {}", 400u64 << 20)));
    assert_eq!(v.status()["apps"][0]["memory_limit_errors"].as_u64(), Some(1));
}

#[test]
fn bad_isolation_settings_stop_valve_with_exit_2_naming_the_app_and_the_fix() {
    need_r_packages(&["plumber"]);
    assert!(as_root(), "this test checks what valve does as root: run the tests as root, as CI does");
    let site = app_dir();
    let (alpha, beta) = (site.path().join("alpha"), site.path().join("beta"));
    for d in [&alpha, &beta] {
        std::fs::create_dir(d).unwrap();
        std::fs::write(d.join("plumber.R"), "#* @get /\nfunction() 1\n").unwrap();
    }
    let check = |extra: &str| {
        let (_cfg, file) = config(&alpha, &beta, extra);
        crate::harness::Valve::run_to_exit(&["--check", "--config", file.to_str().unwrap()], START_DEADLINE)
    };
    let unknown = check("run_as = \"no-such-user-here\"");
    assert_eq!(unknown.status.code(), Some(2), "{}", unknown.stderr);
    assert!(unknown.stderr.contains("app `alpha`") && unknown.stderr.contains("no such user"), "{}", unknown.stderr);
    let small = check("memory_limit = \"10MB\"");
    assert_eq!(small.status.code(), Some(2));
    // An app's own key wins over the top level: alpha keeps its 400MB, beta takes the top level's.
    assert!(small.stderr.contains("memory_limit = \"10MB\": too small: use 100MB or more"), "{}", small.stderr);
    let bad = check("memory_limit = \"lots\"");
    assert!(bad.stderr.contains("memory_limit = \"lots\": not a size"), "{}", bad.stderr);
    // An app folder its user cannot read.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&beta, std::fs::Permissions::from_mode(0o700)).unwrap();
    let unreadable = check("");
    assert_eq!(unreadable.status.code(), Some(2));
    assert!(
        unreadable.stderr.contains("app `beta`")
            && unreadable.stderr.contains(&beta.display().to_string())
            && unreadable.stderr.contains("chmod o+rx"),
        "{}",
        unreadable.stderr
    );
    // Without --check, the same: exit 2 before any R starts.
    let (_cfg, file) = config(&alpha, &beta, "");
    let started =
        crate::harness::Valve::run_to_exit(&["--config", file.to_str().unwrap(), "--port", "0"], START_DEADLINE);
    assert_eq!(started.status.code(), Some(2), "{}", started.stderr);
    std::fs::set_permissions(&beta, std::fs::Permissions::from_mode(0o755)).unwrap();
    // root only when spelt out, with a warning.
    let as_root = check("run_as = \"root\"");
    assert_eq!(as_root.status.code(), Some(0), "{}", as_root.stderr);
    assert!(as_root.stderr.contains("run_as = \"root\": its R runs as root"), "{}", as_root.stderr);
}

#[test]
fn as_an_ordinary_user_with_isolation_none_valve_says_apps_share_its_user_and_serves_them() {
    need_r_packages(&["plumber"]);
    assert!(as_root(), "this test switches to an ordinary user: run the tests as root, as CI does");
    let dir = app_dir();
    let api = dir.path().join("plumber.R");
    std::fs::write(&api, "#* @get /uid\nfunction() as.integer(system('id -u', intern = TRUE))\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&api, std::fs::Permissions::from_mode(0o644)).unwrap();
    let nobody = 65534;
    let check = {
        let mut cmd = std::process::Command::new(crate::harness::valve_bin());
        std::os::unix::process::CommandExt::uid(&mut cmd, nobody);
        std::os::unix::process::CommandExt::gid(&mut cmd, nobody);
        cmd.args(["--check", "-f", api.to_str().unwrap()])
            .env("VALVE_STATE_DIR", dir.path().join("state"))
            .env("VALVE_ISOLATION", "none")
            .output()
            .unwrap()
    };
    let said = String::from_utf8_lossy(&check.stderr).to_string() + &String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{said}");
    assert!(said.contains("isolation: shared with valve"), "{said}");
    assert!(said.contains("every app's R runs as this same user"), "{said}");
    let v = Valve::start_as(Some(nobody), &["-f", api.to_str().unwrap()], &[("VALVE_ISOLATION", "none")], None, |_| {});
    assert!(v.log().contains("every app's R runs as this same user"), "the warning at start");
    let (_, uid) = get(&v.get("/uid"));
    assert_eq!(uid, "[65534]", "the app serves, as valve's own user");
    assert_eq!(v.status()["apps"][0]["isolation"], "shared with valve");
}
