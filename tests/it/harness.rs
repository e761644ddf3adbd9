//! Starts the real `valve` binary (and plain plumber processes to compare with),
//! waits for readiness against named deadlines, and cleans up when dropped.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod net;
mod plumber;
use net::ADMINS;
pub use net::*;
pub use plumber::*;

/// How long valve may take to say it serves before a test gives up: a hang
/// guard, not a figure (a start that restores packages builds them first).
pub const START_DEADLINE: Duration = Duration::from_secs(180);

/// How long a test waits for valve to take a request it was sent (the request
/// reaching a worker, or joining the queue): seconds on a loaded machine, not minutes.
pub const TAKE_DEADLINE: Duration = Duration::from_secs(10);

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

pub fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/plumber.R")
}

/// Fails the test, naming what to install, unless `program` is on the PATH.
pub fn need_program(program: &str, debian_package: &str) {
    let found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()));
    assert!(
        found,
        "this test needs `{program}`, which is not installed: run scripts/install-deps (or apt-get install {debian_package})"
    );
}

/// Fails the test, naming the Debian packages to install, unless R has `packages`.
pub fn need_r_packages(packages: &[&str]) {
    need_program("Rscript", "r-base-core");
    let out = Command::new("Rscript")
        .args(["--vanilla", "-e", "p <- commandArgs(TRUE); cat(p[!vapply(p, requireNamespace, TRUE, quietly = TRUE)])"])
        .args(packages)
        .output()
        .expect("Rscript runs");
    let missing: Vec<String> = String::from_utf8_lossy(&out.stdout).split_whitespace().map(str::to_string).collect();
    assert!(
        missing.is_empty(),
        "this test needs the R packages {missing:?}: run scripts/install-deps (or apt-get install {})",
        missing.iter().map(|p| format!("r-cran-{}", p.to_lowercase())).collect::<Vec<_>>().join(" ")
    );
}

/// Where an installed R package keeps `what` (e.g. its examples).
fn r_package_path(package: &str, what: &str) -> PathBuf {
    need_r_packages(&[package]);
    let out = Command::new("Rscript")
        .args(["-e", &format!("cat(system.file({what}, package = '{package}'))")])
        .output()
        .expect("Rscript runs");
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(!path.is_empty(), "{package} has no {what}: reinstall r-cran-{package}");
    PathBuf::from(path)
}

/// Plumber's own example APIs, as installed with the R package.
pub fn plumber_example(name: &str) -> PathBuf {
    // Its session examples need these at run time, without naming them.
    need_r_packages(&["plumber", "base64enc", "sodium"]);
    r_package_path("plumber", "'plumber'").join(name)
}

/// Shiny's own example apps, as installed with the R package.
pub fn shiny_example(name: &str) -> String {
    r_package_path("shiny", "'examples'").join(name).display().to_string()
}

/// Fails the test, naming what to install, unless a headless browser can run.
pub fn need_browser() {
    need_program("node", "nodejs");
    need_program("chromium", "chromium");
    let playwright = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/node_modules/playwright-core");
    assert!(playwright.is_dir(), "this test needs playwright-core: run scripts/install-deps (npm ci in tests/browser)");
}

/// Polls `cond` every 20 ms until it holds or `deadline` passes.
pub fn wait_until(what: &str, deadline: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < deadline, "timed out after {deadline:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn pid_alive(pid: u32) -> bool {
    // A zombie still has a /proc entry; it is dead for our purposes.
    state_and_parent(pid).is_some_and(|(state, _)| state != "Z")
}

/// A process's state letter and parent pid, from /proc (None once it is reaped).
pub fn state_and_parent(pid: u32) -> Option<(String, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat.rsplit(')').next()?.split_whitespace();
    Some((fields.next()?.to_string(), fields.next()?.parse().ok()?))
}

/// The direct children of a process.
/// valve's run directory, from one of `pids` (its R processes): a fresh R's
/// command line (`--file=RUN/lib/launcher.R`), or a fork's output, its FIFO
/// in `RUN/apps/NAME/` (a fork's command line is the warm parent's, whose
/// code as root is in the privileged spawner's own folder).
pub fn run_dir_of(pids: impl IntoIterator<Item = u32>) -> Option<std::path::PathBuf> {
    use std::path::Path;
    for pid in pids {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let file = cmdline
            .split(|b| *b == 0)
            .filter_map(|a| std::str::from_utf8(a).ok())
            .find_map(|a| a.strip_prefix("--file="))
            .map(std::path::PathBuf::from)
            .filter(|f| !f.ends_with("zygote.R"));
        if let Some(run) = file.as_deref().and_then(Path::parent).and_then(Path::parent) {
            return Some(run.to_path_buf());
        }
        if let Ok(out) = std::fs::read_link(format!("/proc/{pid}/fd/1")) {
            if let Some(run) =
                out.ancestors().find(|a| a.file_name().is_some_and(|n| n == "apps")).and_then(Path::parent)
            {
                return Some(run.to_path_buf());
            }
        }
    }
    None
}

/// valve's privileged spawner (valve as root), if `pid` has one.
pub fn spawner_of(pid: u32) -> Option<u32> {
    children(pid)
        .into_iter()
        .find(|c| std::fs::read_to_string(format!("/proc/{c}/comm")).is_ok_and(|n| n.trim() == "valve-spawner"))
}

/// The processes valve started: its children, or as root its spawner's.
pub fn started_by(valve: u32) -> Vec<u32> {
    let mut out: Vec<u32> = children(valve).into_iter().filter(|c| Some(*c) != spawner_of(valve)).collect();
    if let Some(spawner) = spawner_of(valve) {
        out.extend(children(spawner));
    }
    out
}

pub fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            if let Ok(list) = std::fs::read_to_string(task.path().join("children")) {
                out.extend(list.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
            }
        }
    }
    out.sort();
    out.dedup();
    out.retain(|p| pid_alive(*p));
    out
}

fn is_preload_parent(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|env| env.split(|b| *b == 0).any(|kv| kv == b"VALVE_MODE=preload" || kv == b"VALVE_MODE=zygote"))
        .unwrap_or(false)
}

/// Whether this test run drives valve with `--preload` (VALVE_PRELOAD=true).
pub fn preloading() -> bool {
    std::env::var("VALVE_PRELOAD").is_ok_and(|v| v == "true" || v == "1")
}

/// A running valve with its output captured.
pub struct Valve {
    child: Child,
    /// Its state directory, removed after it.
    _state: Option<tempfile::TempDir>,
    state_dir: PathBuf,
    pub url: String,
    /// The JSON object valve printed on stdout when it was ready.
    pub ready: serde_json::Value,
    log: Arc<Mutex<Vec<String>>>,
}

/// How a valve that was expected to fail ended.
pub struct Failed {
    pub status: ExitStatus,
    pub stderr: String,
}

/// The valve binary under test: this build, or `VALVE_TEST_BIN` (to show a
/// test fails on another build).
pub fn valve_bin() -> PathBuf {
    std::env::var_os("VALVE_TEST_BIN").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_valve")))
}

/// Where scripts/install-deps keeps what it builds or fetches once for the
/// tests (Jaeger, CRAN's tarballs): `$VALVE_TEST_CACHE`, else `~/.cache/valve-test`.
pub fn test_cache() -> PathBuf {
    std::env::var_os("VALVE_TEST_CACHE").map(PathBuf::from).unwrap_or_else(|| {
        std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache"))
            .join("valve-test")
    })
}

/// A Go program scripts/install-deps builds into `test_cache()` as
/// `NAME-VERSION`, the version the module `tests/NAME/go.mod` requires of
/// `module`; the variable `env` names another binary instead.
pub fn go_tool(name: &str, module: &str, env: &str) -> PathBuf {
    if let Some(bin) = std::env::var_os(env) {
        return PathBuf::from(bin);
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/{name}/go.mod"));
    let go_mod =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{} pins {name}'s version: {e}", path.display()));
    let version = go_mod
        .lines()
        .find_map(|l| l.trim().strip_prefix(module)?.strip_prefix(' '))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("{} requires {module}", path.display()));
    test_cache().join(format!("{name}-{version}"))
}

/// A temporary folder anyone may read and enter (mode 0755, not tempfile's
/// 0700): an app's folder there is readable by the user of its own valve
/// gives it (as root), as an app's folder on a server is.
pub fn app_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("a temporary folder");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod 0755");
    dir
}

/// Whether these tests run as root (as CI does): then valve gives each app a
/// user of its own and a private view.
pub fn as_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

/// Starts valve with its own state directory (each app's private home) unless
/// `envs` names one, as `uid` if given.
fn spawn(args: &[&str], envs: &[(&str, &str)], uid: Option<u32>) -> (Child, Option<tempfile::TempDir>) {
    let wrap = WRAP.with(|w| w.borrow().clone());
    let mut cmd = match wrap.split_first() {
        Some((program, rest)) => {
            let mut cmd = Command::new(program);
            cmd.args(rest).arg(valve_bin());
            cmd
        }
        None => Command::new(valve_bin()),
    };
    cmd.args(args)
        .env("VALVE_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let state = if envs.iter().any(|(k, _)| *k == "VALVE_STATE_DIR") {
        None
    } else {
        let dir = tempfile::tempdir().expect("a state directory");
        cmd.env("VALVE_STATE_DIR", dir.path());
        Some(dir)
    };
    for (k, v) in envs {
        cmd.env(k, v);
    }
    if let Some(uid) = uid {
        cmd.uid(uid).gid(uid);
        if let Some(dir) = &state {
            let _ = std::os::unix::fs::chown(dir.path(), Some(uid), Some(uid));
        }
    }
    (cmd.spawn().expect("valve binary starts"), state)
}

fn capture(
    stream: impl std::io::Read + Send + 'static,
    prefix: &'static str,
    log: Arc<Mutex<Vec<String>>>,
    ready: Option<std::sync::mpsc::Sender<String>>,
) {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            eprintln!("[{prefix}] {line}");
            if let Some(tx) = &ready {
                let _ = tx.send(line.clone());
            }
            log.lock().unwrap().push(line);
        }
    });
}

thread_local! {
    /// A program (and its arguments) valve is started through, by `start_wrapped`.
    static WRAP: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Valve {
    /// Starts valve on a free port with `args` and waits until it says it serves.
    pub fn start(args: &[&str]) -> Valve {
        Self::start_with_env(args, &[])
    }

    /// As `start`, through `wrap` (such as `setpriv --bounding-set=-sys_admin --`).
    pub fn start_wrapped(wrap: &[&str], args: &[&str]) -> Valve {
        WRAP.with(|w| *w.borrow_mut() = wrap.iter().map(|s| s.to_string()).collect());
        let valve = std::panic::catch_unwind(|| Self::start(args));
        WRAP.with(|w| w.borrow_mut().clear());
        valve.unwrap_or_else(|e| std::panic::resume_unwind(e))
    }

    pub fn start_with_env(args: &[&str], envs: &[(&str, &str)]) -> Valve {
        Self::start_with_hook(args, envs, None, |_| {})
    }

    /// As `start`, calling `hook(pid)` once valve has logged `when` (before it
    /// reports ready).
    pub fn start_with_hook(args: &[&str], envs: &[(&str, &str)], when: Option<&str>, hook: impl FnOnce(u32)) -> Valve {
        Self::start_as(None, args, envs, when, hook)
    }

    /// As `start_with_hook`, run as user `uid` (and its group) if given.
    pub fn start_as(
        uid: Option<u32>,
        args: &[&str],
        envs: &[(&str, &str)],
        when: Option<&str>,
        hook: impl FnOnce(u32),
    ) -> Valve {
        let mut full = vec!["--port", "0"];
        full.extend_from_slice(args);
        let (mut child, state) = spawn(&full, envs, uid);
        let state_dir = match &state {
            Some(dir) => dir.path().to_path_buf(),
            None => {
                envs.iter().find(|(k, _)| *k == "VALVE_STATE_DIR").map(|(_, v)| PathBuf::from(v)).unwrap_or_default()
            }
        };
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        capture(child.stdout.take().unwrap(), "valve stdout", log.clone(), Some(tx));
        capture(child.stderr.take().unwrap(), "valve", log.clone(), None);
        let start = Instant::now();
        let mut hook = when.map(|w| (w.to_string(), hook));
        loop {
            if hook.as_ref().is_some_and(|(w, _)| log.lock().unwrap().iter().any(|l| l.contains(w.as_str()))) {
                if let Some((_, h)) = hook.take() {
                    h(child.id());
                }
            }
            let left = START_DEADLINE.checked_sub(start.elapsed()).unwrap_or_default();
            let left = if hook.is_some() { left.min(Duration::from_millis(20)) } else { left };
            match rx.recv_timeout(left) {
                Ok(line) => {
                    // valve's one line on stdout: a JSON object once it serves.
                    if let Ok(ready) = serde_json::from_str::<serde_json::Value>(&line) {
                        if ready["event"] == "ready" {
                            let url = ready["url"].as_str().expect("the ready line carries the url").to_string();
                            let valve = Valve { child, _state: state, state_dir, url, ready, log };
                            ADMINS.lock().unwrap().push((format!("{}/", valve.admin_url()), valve.token()));
                            return valve;
                        }
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) if start.elapsed() < START_DEADLINE => {}
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "valve did not report ready within {START_DEADLINE:?}; log:\n{}",
                        log.lock().unwrap().join("\n")
                    );
                }
            }
        }
    }

    /// Runs valve expecting it to exit on its own (bad flags, a broken API).
    pub fn run_to_exit(args: &[&str], deadline: Duration) -> Failed {
        Self::run_to_exit_with_env(args, &[], deadline)
    }

    /// As `run_to_exit`, with `envs` added to valve's environment.
    pub fn run_to_exit_with_env(args: &[&str], envs: &[(&str, &str)], deadline: Duration) -> Failed {
        let start = Instant::now();
        let (mut child, _state) = spawn(args, envs, None);
        capture(child.stdout.take().unwrap(), "valve stdout", Arc::new(Mutex::new(Vec::new())), None);
        let stderr = child.stderr.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut s);
            s
        });
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                let stderr = reader.join().unwrap();
                eprintln!("[valve stderr] {stderr}");
                return Failed { status, stderr };
            }
            if start.elapsed() > deadline {
                let _ = child.kill();
                panic!("valve did not exit within {deadline:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// App `app`'s private home: where its R may write and a test may read
    /// (as root; valve's own user's home otherwise).
    pub fn home(&self, app: &str) -> PathBuf {
        if !as_root() {
            return PathBuf::from(std::env::var("HOME").unwrap_or_default());
        }
        self.state_dir.join("apps").join(app).join("home")
    }

    /// The R worker processes valve runs now: its children, or with
    /// `--preload` the forks of its preload parent.
    pub fn workers(&self) -> Vec<u32> {
        let mut workers = Vec::new();
        for child in started_by(self.pid()) {
            if is_preload_parent(child) {
                workers.extend(children(child));
            } else {
                workers.push(child);
            }
        }
        workers
    }

    /// The preload parent, if valve runs with `--preload`.
    pub fn preload_parent(&self) -> Option<u32> {
        started_by(self.pid()).into_iter().find(|p| is_preload_parent(*p))
    }

    /// Every R process valve runs (workers and any preload parent).
    pub fn r_processes(&self) -> Vec<u32> {
        let mut all = self.workers();
        all.extend(self.preload_parent());
        all
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    pub fn wait_for_log(&self, needle: &str, deadline: Duration) {
        wait_until(&format!("log line containing {needle:?}"), deadline, || self.log().contains(needle));
    }

    /// The file the operator token is in (the ready line names it).
    pub fn token_file(&self) -> String {
        self.ready["admin_token_file"].as_str().expect("the ready line names the operator token's file").to_string()
    }

    /// The operator token of valve's admin pages (read from the file the ready line names).
    pub fn token(&self) -> String {
        let file = self.ready["admin_token_file"].as_str().expect("the ready line names the operator token's file");
        std::fs::read_to_string(file).unwrap_or_else(|e| panic!("the operator token {file}: {e}")).trim().to_string()
    }

    /// The header that carries the operator token, as curl takes it.
    pub fn bearer(&self) -> String {
        format!("Authorization: Bearer {}", self.token())
    }

    /// A client (as `client()`) whose every request carries the operator token.
    pub fn admin_client(&self) -> reqwest::Client {
        let mut headers = reqwest::header::HeaderMap::new();
        let value = format!("Bearer {}", self.token());
        headers.insert(reqwest::header::AUTHORIZATION, value.parse().unwrap());
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(0)
            .timeout(Duration::from_secs(60))
            .default_headers(headers)
            .build()
            .unwrap()
    }

    /// `/__valve__/status` from the admin listener (`Null` if it does not answer).
    pub fn status(&self) -> serde_json::Value {
        let addr = self.admin_url().trim_start_matches("http://").to_string();
        let token = self.token();
        let get = || -> std::io::Result<Vec<u8>> {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(&addr)?;
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            // HTTP/1.0: the answer ends when the connection closes, never chunked.
            s.write_all(
                format!("GET /__valve__/status HTTP/1.0\r\nHost: valve\r\nAuthorization: Bearer {token}\r\n\r\n")
                    .as_bytes(),
            )?;
            let mut all = Vec::new();
            s.read_to_end(&mut all)?;
            Ok(all)
        };
        let Ok(all) = get() else { return serde_json::Value::Null };
        let body = all.windows(4).position(|w| w == b"\r\n\r\n").map_or(&all[..0], |i| &all[i + 4..]);
        serde_json::from_slice(body).unwrap_or(serde_json::Value::Null)
    }

    /// Waits until valve's workers serve `busy` requests and `queued` more
    /// wait for a worker: the requests a test sent have been taken.
    pub fn wait_for_requests(&self, busy: u64, queued: u64) {
        let mut seen = serde_json::Value::Null;
        let what = format!("{busy} request(s) on workers and {queued} queued");
        let start = Instant::now();
        loop {
            let status = self.status();
            if status["pool"]["busy"] == busy && status["queue"]["waiting"] == queued {
                return;
            }
            seen = if status.is_null() { seen } else { status };
            assert!(
                start.elapsed() < TAKE_DEADLINE,
                "timed out after {TAKE_DEADLINE:?} waiting for {what}; last pool {} and queue {}",
                seen["pool"],
                seen["queue"]
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// valve's admin listener as host:port.
    pub fn admin_addr(&self) -> String {
        self.admin_url().trim_start_matches("http://").to_string()
    }

    pub fn signal(&self, sig: libc::c_int) {
        unsafe {
            libc::kill(self.pid() as i32, sig);
        }
    }

    /// Waits for valve to exit (after a signal) and returns its status.
    pub fn wait_exit(&mut self, deadline: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(start.elapsed() < deadline, "valve did not exit within {deadline:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn get(&self, path: &str) -> String {
        format!("{}{}", self.url, path)
    }

    /// valve's admin listener (metrics, status, the dashboard), from the ready line.
    pub fn admin_url(&self) -> String {
        self.ready["admin_url"].as_str().map(str::to_string).unwrap_or_else(|| self.url.clone())
    }

    /// A URL on valve's admin listener.
    pub fn admin(&self, path: &str) -> String {
        format!("{}{}", self.admin_url(), path)
    }
}

impl Drop for Valve {
    fn drop(&mut self) {
        let mine = format!("{}/", self.admin_url());
        ADMINS.lock().unwrap_or_else(|p| p.into_inner()).retain(|(admin, _)| *admin != mine);
        // SIGKILL on purpose: the workers must follow through their parent-death signal.
        unsafe {
            libc::kill(-(self.child.id() as i32), libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}
