//! Apps that write beside their code keep working under every isolation
//! level: plumber's logging recipe (tests/fixtures/logging: a `logs` folder
//! made beside its plumber.R at start, a line per request) published with
//! rsconnect to valve as root, where the app runs as a user of its own; and
//! configured in a folder of valve's user's, valve as an ordinary user under
//! Landlock. A configured app whose folder its user cannot write is named at
//! start and by `--check`, with the fix.

use std::path::Path;

use crate::harness::{app_dir, as_root, fixture, need_r_packages, Valve};
use crate::publish::{deploy_app, get, new_key};

const NOBODY: u32 = 65534;

fn copy_fixture(to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    std::fs::copy(fixture("logging").join("plumber.R"), to.join("plumber.R")).unwrap();
}

async fn logs_and_echoes(valve: &Valve, prefix: &str) {
    for msg in ["one", "two"] {
        let (code, body) = get(&valve.get(&format!("{prefix}/echo?msg={msg}"))).await;
        assert_eq!(code, 200, "{body}\n{}", valve.log());
        assert!(body.contains(&format!("The message is: '{msg}'")), "{body}");
    }
    let (code, body) = get(&valve.get(&format!("{prefix}/logs"))).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("plumber_"), "a log file in its logs folder: {body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_api_that_logs_beside_its_plumber_r_serves_published_as_root() {
    need_r_packages(&["rsconnect", "plumber", "logger"]);
    assert!(as_root(), "this test checks what valve does as root: run the tests as root, as CI does");
    let work = app_dir();
    let w = work.path();
    let (key, line) = new_key("ci");
    std::fs::write(w.join("keys"), format!("{line}\n")).unwrap();
    // A configured app in a folder of root's: its user cannot write there, and valve says so.
    let configured = w.join("configured");
    copy_fixture(&configured);
    std::fs::write(
        w.join("valve.toml"),
        format!(
            "publish_dir = \"{}\"\npublish_keys_file = \"{}\"\n\n[[app]]\nname = \"configured\"\npath = \"/configured\"\nfile = \"{}\"\n",
            w.join("published").display(),
            w.join("keys").display(),
            configured.join("plumber.R").display()
        ),
    )
    .unwrap();
    let config = w.join("valve.toml");
    let check = std::process::Command::new(crate::harness::valve_bin())
        .args(["--check", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&check.stderr).to_string();
    assert!(
        said.contains("app `configured`: its folder") && said.contains("is read-only to its user"),
        "--check names the app whose writes beside its code fail: {said}"
    );
    let valve = Valve::start(&["--config", config.to_str().unwrap()]);
    assert!(valve.log().contains("is read-only to its user"), "said at start too");

    let api = w.join("api");
    copy_fixture(&api);
    let home = w.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let (ok, said) = deploy_app(&home, &valve.admin_url(), &key, &api, "logging", None);
    assert!(ok, "{said}");
    logs_and_echoes(&valve, "/logging").await;
    // The bundle's own files stay the bundle's: the app adds beside them, cannot take them away.
    let version = w.join("published/logging/v1");
    let meta = std::fs::metadata(&version).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(meta.mode() & 0o7777, 0o1770, "its group adds, the sticky bit keeps the bundle's files");
    let logs = std::fs::metadata(version.join("logs")).unwrap();
    assert_ne!(logs.uid(), 0, "the logs folder is the app's user's");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_api_that_logs_beside_its_plumber_r_serves_without_root_under_landlock() {
    need_r_packages(&["plumber", "logger"]);
    assert!(as_root(), "this test switches to an ordinary user: run the tests as root, as CI does");
    let work = app_dir();
    let api = work.path().join("api");
    copy_fixture(&api);
    let state = work.path().join("state");
    std::fs::create_dir(&state).unwrap();
    for p in [work.path(), api.as_path(), api.join("plumber.R").as_path(), state.as_path()] {
        std::os::unix::fs::chown(p, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    let valve = Valve::start_as(
        Some(NOBODY),
        &["-f", api.join("plumber.R").to_str().unwrap(), "--warm-parent", "true"],
        &[("VALVE_STATE_DIR", state.to_str().unwrap())],
        None,
        |_| {},
    );
    assert_eq!(valve.status()["isolation"]["level"], "valve's user, Landlock");
    logs_and_echoes(&valve, "").await;
    assert!(api.join("logs").is_dir());
}
