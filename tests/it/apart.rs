//! valve's own files and environment are out of every app's reach, at
//! every isolation level (a boundary: an app's R against valve's run folder,
//! the files its settings name, its environment). Each is tried from inside
//! R (tests/fixtures/attacker): under Landlock it cannot make, rename or
//! link anything in its run folder but its sockets' own/, nor read the TLS
//! key, the ACME folder or the usage log; a warm fork's environment holds
//! none of valve's; plumber in a warm fork takes a JSON body and an upload;
//! as root another app's user reads no deployment's log or record; a fork
//! that dies before it says a word is noticed at once.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::harness::{app_dir, as_root, fixture, free_port, need_r_packages, Valve};

const NOBODY: u32 = 65534;
const MARKER: &str = "VALVE_TEST_MARKER";

/// GET (or POST `body`) of `url` with curl (HTTPS with valve's own certificate too): its JSON.
fn curl_json(url: &str, post: Option<&[&str]>) -> Value {
    let mut cmd = Command::new("curl");
    cmd.args(["-sk", "--max-time", "60"]);
    if let Some(args) = post {
        cmd.args(args);
    }
    let out = cmd.arg(url).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{url}: not JSON ({e}): {text}"))
}

/// A folder of the attacker app's config, owned by nobody: (folder, config file).
fn site(extra: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = app_dir();
    let file = dir.path().join("valve.toml");
    std::fs::write(
        &file,
        format!(
            "{extra}\n[[app]]\nname = \"attacker\"\npath = \"/attacker\"\nfile = \"{}\"\nn_max = 1\n",
            fixture("attacker/plumber.R").display()
        ),
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("state")).unwrap();
    (dir, file)
}

/// Starts valve as nobody on `file`, its state and home in `dir`; its
/// workers forks of the warm parent (no `--preload`, in the preloaded pass too).
fn as_nobody(dir: &Path, file: &Path, extra: &[&str]) -> Valve {
    crate::landlock::give_to_nobody(dir);
    let mut args = vec!["--config", file.to_str().unwrap()];
    args.extend_from_slice(extra);
    let state = dir.join("state");
    Valve::start_as(
        Some(NOBODY),
        &args,
        &[
            ("VALVE_STATE_DIR", state.to_str().unwrap()),
            ("HOME", dir.to_str().unwrap()),
            (MARKER, "marker-7d1c"),
            ("VALVE_PRELOAD", "false"),
        ],
        None,
        |_| {},
    )
}

fn refused(v: &Value, what: &str) {
    let text = v.as_str().unwrap_or_default();
    assert!(text.starts_with("ERROR"), "{what} was allowed: {v}");
}

#[test]
fn under_landlock_an_app_cannot_touch_its_run_folder_nor_read_valves_files_or_environment() {
    need_r_packages(&["plumber"]);
    assert!(as_root(), "this test switches to an ordinary user: run the tests as root, as CI does");
    let (dir, file) = site("");
    let (cert, key) = crate::https::write_cert(dir.path(), "localhost", 30);
    let usage = dir.path().join("usage.jsonl");
    std::fs::write(&usage, "").unwrap();
    let v = as_nobody(
        dir.path(),
        &file,
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--usage-log",
            usage.to_str().unwrap(),
        ],
    );
    let at = |path: &str| v.get(&format!("/attacker{path}"));
    let me = curl_json(&at("/whoami"), None);
    assert_eq!(me["uid"].as_u64(), Some(u64::from(NOBODY)), "{me}");
    let environ = me["environ"].as_str().unwrap();
    // A fork's /proc/self/environ is what its parent started with.
    assert!(environ.contains("R_HOME="), "the environment it started with is read: {environ}");
    assert!(!environ.contains(MARKER), "a variable of valve's reached the app's R: {environ}");

    // Its run folder is valve's: nothing made, renamed or linked there; its own/ is its own.
    let run = curl_json(&at("/run-folder"), None);
    for op in ["create", "symlink", "mkdir", "rename", "hardlink"] {
        refused(&run["in_run"][op], &format!("{op} in the run folder {}", run["run"]));
    }
    for op in ["create", "symlink", "mkdir"] {
        assert_eq!(run["in_own"][op], "yes", "{op} in its own/: {run}");
    }
    // The files valve's settings name: the TLS key, the usage log.
    assert!(usage.exists(), "the usage log is there to read");
    for path in [key.as_path(), cert.as_path(), usage.as_path()] {
        refused(&curl_json(&at(&format!("/read?path={}", path.display())), None)["text"], &path.display().to_string());
    }

    // plumber in a warm fork takes a JSON body and a multipart upload (R's temporary folder is its own).
    let json = curl_json(
        &at("/json?name=x"),
        Some(&[
            "-X",
            "POST",
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            &format!("{{\"a\": \"{}\"}}", "x".repeat(5000)),
        ]),
    );
    assert_eq!(json["tmp_ok"], true, "{json}");
    assert!(json["bytes"].as_u64() > Some(5000), "{json}");
    let upload = dir.path().join("upload.txt");
    std::fs::write(&upload, "a file\n".repeat(1000)).unwrap();
    let parts = curl_json(&at("/upload"), Some(&["-F", &format!("file=@{}", upload.display()), "-F", "note=hi"]));
    assert_eq!(parts["parts"], 2, "{parts}");
    let status = v.status();
    let worker = &status["apps"][0]["workers"][0];
    assert_eq!(worker["started_by"], "warm parent", "a fork served all of it: {worker}");
}

#[test]
fn under_landlock_an_app_cannot_read_the_acme_folder() {
    need_r_packages(&["plumber"]);
    assert!(as_root(), "this test switches to an ordinary user: run the tests as root, as CI does");
    let http_port = free_port();
    let pebble = crate::pebble::Pebble::start(http_port, free_port(), 3600);
    let (dir, file) = site("");
    let acme = dir.path().join("acme");
    let root = dir.path().join("pebble-ca.pem");
    std::fs::copy(pebble.ca(), &root).unwrap();
    let settings = format!(
        "tls_acme_domains = [\"localhost\"]\ntls_acme_directory = {:?}\ntls_acme_ca = {:?}\ntls_acme_dir = {:?}\nhttp_port = {http_port}\n",
        pebble.directory(),
        root,
        acme,
    );
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, format!("{settings}{text}")).unwrap();
    let v = as_nobody(dir.path(), &file, &[]);
    assert!(acme.join("certificate.pem").is_file(), "valve holds a certificate from the authority");
    for path in [acme.join("certificate.pem"), acme.join("account.json"), root] {
        let read = curl_json(&v.get(&format!("/attacker/read?path={}", path.display())), None);
        refused(&read["text"], &path.display().to_string());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn as_root_a_warm_fork_has_none_of_valves_environment_and_no_app_reads_publishings_files() {
    need_r_packages(&["plumber"]);
    assert!(as_root(), "this test checks what valve does as root: run the tests as root, as CI does");
    let apps = format!(
        "[[app]]\nname = \"attacker\"\npath = \"/attacker\"\nfile = \"{}\"\nn_max = 1\n",
        fixture("attacker/plumber.R").display()
    );
    let (dir, keys) = crate::published::site("n_max = 1", &apps, &[("ann", "")]);
    let config = dir.path().join("valve.toml");
    // Own users, no private view: what keeps apps out is each file's owner and mode.
    let v = Valve::start_wrapped(
        &["setpriv", "--bounding-set=-sys_admin", "--", "env", &format!("{MARKER}=marker-7d1c")],
        &["--config", config.to_str().unwrap()],
    );
    let me = curl_json(&v.get("/attacker/whoami"), None);
    let environ = me["environ"].as_str().unwrap();
    assert!(environ.contains("R_HOME=") && !environ.contains(MARKER), "{environ}");
    let (admin, ann) = (v.admin_url(), keys[0].1.clone());
    let guid = crate::published::create(&admin, &ann, "notes").await;
    crate::published::publish(&admin, &ann, &guid, crate::published::held_api(1)).await;
    use std::os::unix::fs::MetadataExt;
    let published = dir.path().join("published");
    let tasks = published.join(".tasks");
    assert_eq!(std::fs::metadata(&tasks).unwrap().mode() & 0o777, 0o700, "{}", tasks.display());
    let logs: Vec<PathBuf> = std::fs::read_dir(&tasks).unwrap().flatten().map(|e| e.path()).collect();
    assert!(!logs.is_empty(), "the deployment's log is shared there");
    let record = published.join("notes/app.json");
    for f in logs.iter().chain(std::iter::once(&record)) {
        assert_eq!(std::fs::metadata(f).unwrap().mode() & 0o777, 0o600, "{}", f.display());
        let read = curl_json(&v.get(&format!("/attacker/read?path={}", f.display())), None);
        refused(&read["text"], &f.display().to_string());
    }
}

#[test]
fn a_fork_that_dies_before_it_says_a_word_is_replaced_by_a_fresh_r_at_once() {
    need_r_packages(&["plumber"]);
    assert!(
        cfg!(feature = "test-hooks"),
        "this test plants a dying fork through valve's test hooks: run it with `--features test-hooks`, as scripts/test does"
    );
    let (dir, file) = site("start_timeout = 600");
    let hook = dir.path().join("fork-dies");
    std::fs::write(&hook, "").unwrap();
    // Were the fork not noticed, the worker would wait out its 600 s start
    // timeout, past the harness's deadline for the ready line.
    let v = Valve::start_with_env(
        &["--config", file.to_str().unwrap()],
        // The warm parent's fork, in the preloaded pass too.
        &[("VALVE_HOOK_FORK_DIES", hook.to_str().unwrap()), ("VALVE_PRELOAD", "false")],
    );
    assert!(!hook.exists(), "the hook ran: a fork died");
    assert!(v.log().contains("the fork ended before it started"), "{}", v.log());
    assert!(curl_json(&v.get("/attacker/whoami"), None)["wd"].as_str().is_some(), "and the app serves");
}
