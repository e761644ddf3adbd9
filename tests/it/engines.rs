//! `_server.yml` apps (docs/design/engines-quarto-and-site.md). A folder whose `_server.yml` names an
//! engine package is served by that package's `launch_server(settings,
//! host, port)`, one engine process per worker on a loopback port valve
//! picks. plumber2 and fiery are not in Debian, so the tests write a small
//! engine of their own (`valveengine`: it reads the YAML and serves with
//! `httpuv::runServer`), install it with `R CMD INSTALL -l` into a library
//! of their own, and hand it to the workers through `R_LIBS`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::harness::{fixture, need_r_packages, preloading, valve_bin, Valve};

const DESCRIPTION: &str = "Package: valveengine
Version: 0.1.0
Title: A Test Engine for _server.yml Apps
Description: Serves a folder described by a _server.yml file, for valve's tests.
Authors@R: person(\"valve\", \"tests\", email = \"tests@example.invalid\", role = c(\"aut\", \"cre\"))
License: MIT
Imports: httpuv, jsonlite, yaml
";

const NAMESPACE: &str = "export(launch_server)\n";

/// The convention's entry point: reads its own keys from the settings and
/// serves until the process ends. `listen: false` makes an engine that never
/// listens; every answer says who answered and what it was given.
const LAUNCH: &str = r#"
launch_server <- function(settings, host = "127.0.0.1", port = 8080L, ...) {
  conf <- yaml::read_yaml(settings)
  if (isFALSE(conf$listen)) repeat Sys.sleep(1)
  greeting <- if (is.null(conf$greeting)) "hello" else conf$greeting
  app <- list(call = function(req) {
    body <- if (identical(req$REQUEST_METHOD, "POST")) rawToChar(req$rook.input$read()) else ""
    answer <- list(greeting = greeting, pid = Sys.getpid(), wd = getwd(), settings = settings,
                   host = host, port = port, path = req$PATH_INFO, query = req$QUERY_STRING, body = body)
    list(status = 200L, headers = list("Content-Type" = "application/json"),
         body = as.character(jsonlite::toJSON(answer, auto_unbox = TRUE)))
  })
  httpuv::runServer(host, port, app)
}
"#;

/// The library `valveengine` is installed in (once per test run).
pub fn engine_library() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        need_r_packages(&["httpuv", "jsonlite", "yaml"]);
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("engine-libs").join(std::process::id().to_string());
        let _ = std::fs::remove_dir_all(&root);
        let src = root.join("valveengine");
        std::fs::create_dir_all(src.join("R")).unwrap();
        std::fs::write(src.join("DESCRIPTION"), DESCRIPTION).unwrap();
        std::fs::write(src.join("NAMESPACE"), NAMESPACE).unwrap();
        std::fs::write(src.join("R/launch.R"), LAUNCH).unwrap();
        let lib = root.join("lib");
        install(&src, &lib);
        lib
    })
}

/// `R CMD INSTALL -l lib src`, as the manual (docs/src/documents.md) says to install an engine.
fn install(src: &Path, lib: &Path) {
    std::fs::create_dir_all(lib).unwrap();
    let out = Command::new("R").arg("CMD").arg("INSTALL").arg("-l").arg(lib).arg(src).output().unwrap();
    assert!(
        out.status.success(),
        "R CMD INSTALL of {} failed:\n{}{}",
        src.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// valve's environment for workers that need the test engine.
pub fn with_engine() -> Vec<(&'static str, &'static str)> {
    vec![("R_LIBS", engine_library().to_str().unwrap())]
}

/// A folder with a `_server.yml` holding `yaml`.
fn app_with(yaml: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("engine");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("_server.yml"), yaml).unwrap();
    (tmp, dir)
}

async fn json(url: &str) -> serde_json::Value {
    let resp = reqwest::get(url).await.unwrap();
    assert_eq!(resp.status(), 200, "{url}");
    resp.json().await.unwrap()
}

/// The loopback port worker `pid` was told to serve on.
fn engine_port(pid: u32) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|b| *b == 0)
        .find_map(|kv| kv.strip_prefix(b"VALVE_ENGINE_PORT="))
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_engine_app_is_served_by_its_launch_server_on_a_private_socket_per_worker_and_reloads() {
    let (_tmp, dir) = app_with(&std::fs::read_to_string(fixture("engine_app/_server.yml")).unwrap());
    let env = with_engine();
    let d = dir.to_str().unwrap();

    let out = Command::new(valve_bin()).args(["-f", d, "-n", "2", "--check"]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && said.contains("engine at / (server-yml, 1-2 workers)"), "{said}");

    let valve = Valve::start_with_env(&["-f", d, "-n", "2", "--n-min", "2"], &env);
    assert_eq!(valve.ready["apps"][0]["kind"], "engine");
    assert!(valve.preload_parent().is_none(), "an engine is never preloaded (VALVE_PRELOAD={})", preloading());
    let workers = valve.workers();
    assert_eq!(workers.len(), 2, "one engine process per worker");
    let ports: Vec<String> = workers.iter().filter_map(|p| engine_port(*p)).collect();
    assert_eq!(ports.len(), 2, "{ports:?}");
    assert_ne!(ports[0], ports[1], "each worker has a port of its own");

    let answer = json(&valve.get("/some/path?x=1")).await;
    assert_eq!(answer["greeting"], "hello from _server.yml", "{answer}");
    assert_eq!(
        (answer["path"].as_str(), answer["query"].as_str()),
        (Some("/some/path"), Some("?x=1")),
        "as httpuv gives them"
    );
    assert_eq!(answer["host"], "127.0.0.1", "the engine is told loopback only");
    assert!(ports.contains(&answer["port"].to_string()), "{answer} {ports:?}");
    // httpuv's startServer(host, port) serves on the worker's private socket
    // instead: no other local process can reach the engine on that port.
    for port in &ports {
        let port: u16 = port.parse().unwrap();
        assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err(), "nothing listens on {port}");
    }
    assert!(!valve.log().contains("opens its own TCP server"), "the engine serves on its socket");
    let pid = answer["pid"].as_u64().unwrap() as u32;
    assert!(workers.contains(&pid), "answered by one of valve's workers: {answer}");
    let canonical = std::fs::canonicalize(&dir).unwrap();
    assert_eq!(answer["wd"], canonical.to_str().unwrap(), "the engine runs in the app's folder");
    assert_eq!(answer["settings"], canonical.join("_server.yml").to_str().unwrap(), "the file, whole, to the engine");
    let posted = reqwest::Client::new().post(valve.get("/echo")).body("a body").send().await.unwrap();
    assert_eq!(posted.json::<serde_json::Value>().await.unwrap()["body"], "a body");

    // A changed _server.yml is a new generation of engines; the old ones stop.
    std::fs::write(dir.join("_server.yml"), "engine: valveengine\ngreeting: edited\n").unwrap();
    valve.signal(libc::SIGHUP);
    crate::harness::wait_until("the new generation to serve", Duration::from_secs(60), || {
        let out = Command::new("curl").args(["-s", "--max-time", "10", &valve.get("/")]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).contains("\"greeting\":\"edited\"")
    });
    crate::harness::wait_until("the old engines to stop", Duration::from_secs(60), || {
        workers.iter().all(|p| !crate::harness::pid_alive(*p))
    });
}

#[test]
fn a_missing_engine_package_stops_valve_saying_it_is_not_installed_and_how_to_install_it() {
    let (_tmp, dir) = app_with("engine: valvenosuchengine\n");
    let out = Valve::run_to_exit_with_env(&["-f", dir.to_str().unwrap()], &with_engine(), Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(1), "a start-up error: {}", out.stderr);
    assert!(out.stderr.contains("the engine package 'valvenosuchengine' named in "), "{}", out.stderr);
    assert!(out.stderr.contains("_server.yml is not installed"), "{}", out.stderr);
    assert!(out.stderr.contains("install.packages(\"valvenosuchengine\")"), "how to install it: {}", out.stderr);
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
}

#[test]
fn a_server_yml_that_is_not_yaml_or_names_no_engine_is_refused_naming_the_file_and_line() {
    for (yaml, said) in [
        ("engine: valveengine\ngreeting: [unclosed\n", "is not YAML"),
        ("greeting: no engine here\n", "names no engine: add a first line `engine: PKG`"),
        ("engine: 42\n", "names no engine (it says `engine: 42`, not an R package's name)"),
    ] {
        let (_tmp, dir) = app_with(yaml);
        for extra in [&["--check"][..], &[][..]] {
            let mut args = vec!["-f", dir.to_str().unwrap()];
            args.extend_from_slice(extra);
            let out = Valve::run_to_exit(&args, Duration::from_secs(30));
            assert_eq!(out.status.code(), Some(2), "a configuration error ({yaml:?}): {}", out.stderr);
            assert!(out.stderr.contains(&format!("{}", dir.join("_server.yml").display())), "{}", out.stderr);
            assert!(out.stderr.contains(said), "{yaml:?}: {}", out.stderr);
        }
    }
    let (_tmp, dir) = app_with("engine: valveengine\ngreeting: [unclosed\n");
    let out = Valve::run_to_exit(&["-f", dir.to_str().unwrap(), "--check"], Duration::from_secs(30));
    assert!(out.stderr.contains("line 3"), "the line: {}", out.stderr);
}

#[test]
fn an_engine_that_never_listens_stops_valve_naming_the_address() {
    let (_tmp, dir) = app_with("engine: valveengine\nlisten: false\n");
    let out = Valve::run_to_exit_with_env(
        &["-f", dir.to_str().unwrap(), "--start-timeout", "5"],
        &with_engine(),
        Duration::from_secs(90),
    );
    assert_eq!(out.status.code(), Some(1), "a start-up error: {}", out.stderr);
    assert!(out.stderr.contains("the engine never listened on 127.0.0.1:"), "{}", out.stderr);
    assert!(out.stderr.contains("within 5s"), "{}", out.stderr);
    assert!(out.stderr.contains("launch_server"), "what to look at: {}", out.stderr);
}

#[test]
fn the_readme_example_engine_installs_and_serves_its_app() {
    need_r_packages(&["httpuv", "yaml"]);
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let lib = tempfile::tempdir().unwrap();
    install(&examples.join("tinyengine"), lib.path());
    let valve = Valve::start_with_env(
        &["-f", examples.join("hello-engine").to_str().unwrap()],
        &[("R_LIBS", lib.path().to_str().unwrap())],
    );
    let out = Command::new("curl").args(["-s", "--max-time", "30", &valve.get("/hi?name=valve")]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.starts_with("Hello from _server.yml, valve! (tinyengine, R process "), "{said}");
    assert!(said.contains("path /hi"), "{said}");
}
