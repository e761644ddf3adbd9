//! Apps kept apart without root: valve as an ordinary user (nobody) on a
//! kernel with Landlock gives each app's R a ruleset of its own. Each promise
//! is tried from inside R, as an app would try it (tests/fixtures/isolation/
//! alpha), against beta (a Shiny app whose password sits in its own
//! `.Renviron`), gamma (a `_server.yml` engine), valve's config and valve
//! itself; for workers forked from the warm parent and for fresh R.

use std::path::Path;
use std::time::Duration;

use crate::harness::{app_dir, as_root, fixture, need_r_packages, pid_alive, Valve, START_DEADLINE};
use crate::isolation::get_json;
use crate::rmarkdown::get;

const NOBODY: u32 = 65534;

/// What the kernel says of Landlock (as valve asks it).
fn landlock_abi() -> i64 {
    // SAFETY: the documented query: no attributes, the version flag.
    unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, std::ptr::null::<u8>(), 0usize, 1u32) }
}

/// Gives `dir` and everything in it to nobody (valve's user in these tests), following no link.
pub(crate) fn give_to_nobody(dir: &Path) {
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        std::os::unix::fs::lchown(&d, Some(NOBODY), Some(NOBODY)).unwrap();
        if std::fs::symlink_metadata(&d).is_ok_and(|m| m.is_dir()) {
            todo.extend(std::fs::read_dir(&d).unwrap().flatten().map(|e| e.path()));
        }
    }
}

/// A site of two apps (alpha, beta) whose config and state only valve's user (nobody) reaches.
fn site(extra: &str) -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let dir = app_dir();
    let file = dir.path().join("valve.toml");
    std::fs::write(
        &file,
        format!(
            "max_workers = 4\n{extra}\n\
             [[app]]\nname = \"alpha\"\nfile = \"{}\"\nn_max = 1\nmemory_limit = \"400MB\"\n\n\
             [[app]]\nname = \"beta\"\nfile = \"{}\"\nn_max = 1\n\n\
             [[app]]\nname = \"gamma\"\nfile = \"{}\"\nn_max = 1\n",
            fixture("isolation/alpha").join("plumber.R").display(),
            fixture("isolation/beta").join("app.R").display(),
            dir.path().join("gamma").display()
        ),
    )
    .unwrap();
    // gamma: a `_server.yml` app, served by the test engine through httpuv on its worker's socket.
    std::fs::create_dir(dir.path().join("gamma")).unwrap();
    std::fs::copy(fixture("engine_app/_server.yml"), dir.path().join("gamma/_server.yml")).unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    for p in [state.as_path(), &dir.path().join("gamma"), &dir.path().join("gamma/_server.yml")] {
        std::os::unix::fs::chown(p, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    // All of it valve's user's to write: what alpha cannot do there, Landlock keeps it from.
    for p in [dir.path(), file.as_path()] {
        std::os::unix::fs::chown(p, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    (dir, file, state)
}

#[test]
fn without_root_each_app_runs_under_landlock_and_cannot_read_write_signal_or_reach_another_app_or_valve() {
    need_r_packages(&["plumber", "shiny"]);
    assert!(as_root(), "this test switches to an ordinary user: run the tests as root, as CI does");
    assert!(
        landlock_abi() >= 6,
        "this kernel has no Landlock ABI 6 (it says {}): valve's Landlock level needs it",
        landlock_abi()
    );
    let beta_dir = fixture("isolation/beta");
    for warm in ["true", "false"] {
        let (dir, file, state) = site("");
        let v = Valve::start_as(
            Some(NOBODY),
            &["--config", file.to_str().unwrap(), "--warm-parent", warm],
            &[
                ("VALVE_STATE_DIR", state.to_str().unwrap()),
                ("HOME", dir.path().to_str().unwrap()),
                ("R_LIBS", crate::engines::engine_library().to_str().unwrap()),
            ],
            None,
            |_| {},
        );
        let alpha = |path: &str| get_json(&v.get(&format!("/alpha{path}")));
        let status = v.status();
        let isolation = &status["isolation"];
        assert_eq!(isolation["level"], "valve's user, Landlock", "{status}");
        assert_eq!(isolation["complete"], true, "{isolation}");
        assert!(
            isolation["unprotected"].to_string().contains("TCP"),
            "what Landlock does not cover is said: {isolation}"
        );
        let app = |name: &str| status["apps"].as_array().unwrap().iter().find(|a| a["name"] == name).unwrap().clone();
        assert_eq!(app("alpha")["isolation"], "valve's user, Landlock");
        assert!(v.log().contains("under a Landlock ruleset of its own"), "said at start");

        // Its own things work as in plain R: its folder, its private home and temporary folder.
        let me = alpha("/whoami");
        assert_eq!(me["uid"].as_u64(), Some(u64::from(NOBODY)), "{me}");
        assert_eq!(me["relative"], "alpha's own data", "{me}");
        assert_eq!(me["renviron"], "read-by-r-at-start", "{me}");
        let home = me["home"].as_str().unwrap().to_string();
        assert!(home.starts_with(state.to_str().unwrap()), "its private home: {me}");
        for path in [format!("{home}/notes.txt"), format!("{}/scratch.txt", me["tempdir"].as_str().unwrap())] {
            assert_eq!(alpha(&format!("/write?path={path}"))["written"], "yes", "{path} (warm parent {warm})");
        }

        // Another app's files, valve's config, a shared /tmp: neither read nor written.
        for path in [beta_dir.join(".Renviron").display().to_string(), file.display().to_string()] {
            let read = alpha(&format!("/read?path={path}"));
            let text = read["text"].as_str().unwrap();
            assert!(text.starts_with("ERROR") && !text.contains("hunter2"), "{path}: {read}");
        }
        let shared_tmp = format!("/tmp/valve-landlock-test-{}", std::process::id());
        for path in [format!("{}/stolen.txt", dir.path().display()), shared_tmp.clone()] {
            let wrote = alpha(&format!("/write?path={path}"));
            assert!(wrote["written"].as_str().unwrap().starts_with("ERROR"), "{path}: {wrote}");
            assert!(!Path::new(&path).exists());
        }

        // valve's and beta's environment and memory; signals to either.
        let beta_pid = app("beta")["workers"][0]["pid"].as_u64().expect("beta's worker and its pid") as u32;
        let valve_pid = v.pid();
        for pid in [valve_pid, beta_pid] {
            let read = alpha(&format!("/read?path=/proc/{pid}/environ"));
            assert!(read["text"].as_str().unwrap().starts_with("ERROR"), "environ of {pid}: {read}");
            let mem = alpha(&format!("/mem?pid={pid}"));
            assert!(mem["mem"].as_str().is_some_and(|m| m.starts_with("ERROR")), "mem of {pid}: {mem}");
            let kill = alpha(&format!("/kill?pid={pid}&signal=9"));
            assert_eq!(kill["sent"], false, "SIGKILL to {pid}: {kill}");
        }
        std::thread::sleep(Duration::from_millis(200));
        assert!(pid_alive(beta_pid) && pid_alive(valve_pid));

        // beta's (Shiny) and gamma's (an engine) sockets: Landlock cannot keep
        // alpha from connecting (before Linux 7.1), so their R answers only
        // valve's link token.
        for (name, page) in [("beta", "/beta/"), ("gamma", "/gamma/")] {
            let id = app(name)["workers"][0]["id"].as_u64().unwrap();
            let socket = find_socket(&format!("apps/{name}/own/w{id}.sock"), valve_pid);
            let talk = alpha(&format!("/socket?path={}", socket.display()));
            assert_eq!(talk["status"], "403", "{name}'s R refuses a request without valve's link token: {talk}");
            assert_eq!(get(&v.get(page)).0, 200, "{name} serves through valve");
        }
        // Shiny's static files, which httpuv serves without calling R, ask for the token too.
        let beta_id = app("beta")["workers"][0]["id"].as_u64().unwrap();
        let socket = find_socket(&format!("apps/beta/own/w{beta_id}.sock"), valve_pid);
        let talk = alpha(&format!("/socket?path={}&target=/shared/shiny.min.js", socket.display()));
        assert_eq!(talk["status"], "403", "a static file of beta's without the token: {talk}");
        assert_eq!(get(&v.get("/beta/shared/shiny.min.js")).0, 200, "and through valve");

        // Past its memory limit, alpha's allocation fails alone.
        assert_eq!(get(&v.get("/alpha/alloc?mb=3000")).0, 500);
        assert_eq!(alpha("/alloc?mb=10")["result"], "allocated");
        v.wait_for_log("reached the app's memory_limit", START_DEADLINE);
        drop(v);
        let _ = std::fs::remove_file(&shared_tmp);
    }
}

/// A path under valve's run directory (found from valve's open files, as root).
fn find_socket(rel: &str, valve_pid: u32) -> std::path::PathBuf {
    for fd in std::fs::read_dir(format!("/proc/{valve_pid}/fd")).unwrap().flatten() {
        let Ok(target) = std::fs::read_link(fd.path()) else { continue };
        for dir in target.ancestors() {
            if dir.file_name().is_some_and(|n| n.to_string_lossy().starts_with("valve-")) && dir.join(rel).exists() {
                return dir.join(rel);
            }
        }
    }
    panic!("no {rel} under valve's run directory")
}

/// Makes `cmd`'s process see a kernel without Landlock: a seccomp filter
/// answers ENOSYS to landlock_create_ruleset, as a runtime that does not
/// implement it (gVisor) or an old kernel does.
fn without_landlock(cmd: &mut std::process::Command) {
    let hook = || -> std::io::Result<()> {
        let filter = [
            // The system call's number...
            libc::sock_filter { code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16, jt: 0, jf: 0, k: 0 },
            libc::sock_filter {
                code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
                jt: 0,
                jf: 1,
                k: libc::SYS_landlock_create_ruleset as u32,
            },
            // ... landlock_create_ruleset: ENOSYS; anything else: allowed.
            libc::sock_filter {
                code: (libc::BPF_RET | libc::BPF_K) as u16,
                jt: 0,
                jf: 0,
                k: libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
            },
            libc::sock_filter { code: (libc::BPF_RET | libc::BPF_K) as u16, jt: 0, jf: 0, k: libc::SECCOMP_RET_ALLOW },
        ];
        let prog = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr() as *mut libc::sock_filter };
        // SAFETY: plain prctl calls with a filter that outlives them.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &prog as *const libc::sock_fprog) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    };
    // SAFETY: the hook makes system calls only.
    unsafe { std::os::unix::process::CommandExt::pre_exec(cmd, hook) };
}

#[test]
fn check_says_what_landlock_covers_and_isolation_none_or_required_are_kept() {
    need_r_packages(&["plumber"]);
    assert!(as_root(), "this test switches to an ordinary user: run the tests as root, as CI does");
    let (_dir, file, state) = site("");
    let check_on = |no_landlock: bool, extra: &[&str]| {
        let mut cmd = std::process::Command::new(crate::harness::valve_bin());
        if no_landlock {
            without_landlock(&mut cmd);
        }
        std::os::unix::process::CommandExt::uid(&mut cmd, NOBODY);
        std::os::unix::process::CommandExt::gid(&mut cmd, NOBODY);
        let out = cmd
            .args(["--check", "--config", file.to_str().unwrap()])
            .args(extra)
            .env("VALVE_STATE_DIR", &state)
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout))
    };
    let check = |extra: &[&str]| check_on(false, extra);
    let (code, said) = check(&[]);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("isolation: valve's user, Landlock"), "{said}");
    assert!(said.contains("Landlock ABI") && said.contains("not kept from"), "what is and is not covered: {said}");
    let (code, said) = check(&["--isolation", "required"]);
    assert_eq!(code, Some(0), "this kernel's Landlock is all `required` asks: {said}");
    let (code, said) = check(&["--isolation", "none"]);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("isolation: shared with valve"), "{said}");
    let (code, said) = check(&["--isolation", "strict"]);
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("required") && said.contains("strict"), "{said}");

    // A kernel (or runtime) without Landlock: apps share valve's user, said
    // as a warning; `required` refuses to start, naming why and the ways out.
    let (code, said) = check_on(true, &[]);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("isolation: shared with valve"), "{said}");
    assert!(said.contains("warning") && said.contains("every app's R runs as this same user"), "{said}");
    let (code, said) = check_on(true, &["--isolation", "required"]);
    assert_eq!(code, Some(2), "nothing starts less isolated than asked: {said}");
    assert!(said.contains("offers no Landlock") && said.contains("run valve as root"), "{said}");
}

/// Plumber's and Shiny's own examples, each its own app, served by valve as
/// an ordinary user under Landlock: fresh and forked from the warm parent,
/// then each app preloaded (its own parent forking its workers).
#[test]
fn plumbers_and_shinys_examples_serve_under_landlock_plain_and_preloaded() {
    use crate::harness::{need_browser, plumber_example, shiny_example};
    need_browser();
    assert!(as_root(), "this test switches to an ordinary user: run the tests as root, as CI does");
    let examples = ["01-append", "02-filters", "05-static", "06-sessions", "09-content-type", "12-entrypoint"];
    let dir = app_dir();
    let mut config = String::from("max_workers = 8\n");
    for name in examples {
        config.push_str(&format!(
            "\n[[app]]\nname = \"p{}\"\npath = \"/{name}\"\nfile = \"{}\"\nn_max = 1\n",
            &name[..2],
            plumber_example(name).display()
        ));
    }
    config.push_str(&format!(
        "\n[[app]]\nname = \"hello\"\npath = \"/hello\"\nfile = \"{}\"\nn_max = 1\n",
        shiny_example("01_hello")
    ));
    let file = dir.path().join("valve.toml");
    std::fs::write(&file, config).unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::os::unix::fs::chown(&state, Some(NOBODY), Some(NOBODY)).unwrap();
    for preload in [false, true] {
        let mut args = vec!["--config", file.to_str().unwrap()];
        if preload {
            args.push("--preload");
        }
        let v = Valve::start_as(Some(NOBODY), &args, &[("VALVE_STATE_DIR", state.to_str().unwrap())], None, |_| {});
        assert_eq!(v.status()["isolation"]["level"], "valve's user, Landlock");
        let post = |path: &str, body: &str| {
            let out = std::process::Command::new("curl")
                .args([
                    "-s",
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{http_code}",
                    "-X",
                    "POST",
                    "-H",
                    "content-type: application/json",
                ])
                .args(["-d", body, &v.get(path)])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).to_string()
        };
        assert_eq!(post("/01-append/append", r#"{"val": 42}"#), "200", "{}", v.log());
        for (path, want) in [
            ("/01-append/tail?n=1", "42"),
            ("/02-filters/about", ""),
            ("/05-static/static/b.txt", ""),
            ("/06-sessions/sessionCounter", "This is visit #0"),
            ("/09-content-type/text", ""),
            ("/09-content-type/pdf", "%PDF"),
            ("/12-entrypoint/counter", ""),
        ] {
            let (code, body) = get(&v.get(path));
            assert_eq!(code, 200, "GET {path} (preload {preload}): {body}\n{}", v.log());
            assert!(body.contains(want), "GET {path} (preload {preload}): {body}");
        }
        let out = std::process::Command::new("node")
            .env("VALVE_ADMIN", v.admin_url())
            .env("VALVE_ADMIN_TOKEN", v.token())
            .args(["shiny.mjs", "hello", &v.get("/hello/")])
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser"))
            .output()
            .expect("node runs");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(
            out.status.success() && text.contains("\"rerendered\":true"),
            "Shiny's 01_hello in Chromium (preload {preload}): {text}"
        );
    }
}
