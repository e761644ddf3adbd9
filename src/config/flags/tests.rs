//! The flags alone: their defaults, what each refuses, and the `-f` and
//! `--site` configurations they make.

use std::time::Duration;

use super::*;

fn args(extra: &[&str]) -> Args {
    let mut argv = vec!["valve"];
    argv.extend_from_slice(extra);
    Args::try_parse_from(argv).expect("flags parse")
}

fn api() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("plumber.R");
    std::fs::write(&f, "").unwrap();
    let path = f.to_str().unwrap().to_string();
    (dir, path)
}

#[test]
fn defaults_match_the_reference_tool() {
    let a = args(&[]);
    assert_eq!(a.file, PathBuf::from("plumber.R"));
    assert_eq!((a.host.as_str(), a.port, a.workers, a.n_max, a.n_min), ("127.0.0.1", 3000, 3, 3, 1));
    assert_eq!((a.check_unused.as_str(), a.max_age.as_str()), ("10", "300"));
}

#[test]
fn refuses_n_min_above_n_max() {
    let (_dir, f) = api();
    let err = args(&["-f", &f, "--n-min", "5", "-n", "2"]).single().unwrap_err();
    assert_eq!(err.to_string(), "--n-min 5 is above --n-max 2: raise --n-max or lower --n-min");
}

#[test]
fn one_app_at_the_root_named_after_its_file() {
    let (_dir, f) = api();
    let c = args(&["-f", &f]).single().unwrap();
    assert_eq!(c.apps.len(), 1);
    assert_eq!((c.apps[0].name.as_str(), c.apps[0].prefix.as_str()), ("plumber", "/"));
    assert_eq!(c.server.max_workers, 3, "-f: the budget is --n-max");
}

#[test]
fn static_content_takes_no_worker_from_flags_or_the_site_budget() {
    let site = tempfile::tempdir().unwrap();
    std::fs::create_dir(site.path().join("docs")).unwrap();
    std::fs::write(site.path().join("docs/index.html"), "<h1>docs</h1>").unwrap();
    let docs = site.path().join("docs");
    let c = args(&["-f", docs.to_str().unwrap(), "--n-min", "2", "--preload"]).single().unwrap();
    let app = &c.apps[0];
    assert_eq!((app.source.kind(), app.n_min, app.n_max, app.preload), ("static", 0, 0, false));
    assert_eq!(c.server.max_workers, 1);
    let c = args(&[]).site(site.path()).unwrap();
    assert_eq!((c.apps[0].prefix.as_str(), c.apps[0].n_max, c.server.max_workers), ("/docs", 0, 1));
    std::fs::create_dir(site.path().join("api")).unwrap();
    std::fs::write(site.path().join("api/plumber.R"), "").unwrap();
    let c = args(&[]).site(site.path()).unwrap();
    assert_eq!(c.server.max_workers, 3, "the R apps' --n-max added up");
}

#[test]
fn zero_disables_request_timeout_and_recycling() {
    let (_dir, f) = api();
    let c = args(&["-f", &f, "--request-timeout", "0"]).single().unwrap();
    let app = &c.apps[0];
    assert_eq!((app.request_timeout, app.max_requests, app.max_worker_memory), (None, None, None));
    assert_eq!(app.max_body_size, 100 << 20);
}

#[test]
fn missing_file_and_bad_seconds_say_what_and_where() {
    let err = args(&["-f", "/nonexistent/api.R"]).single().unwrap_err();
    assert!(err.to_string().contains("/nonexistent/api.R"));
    let (_dir, f) = api();
    let err = args(&["-f", &f, "--max-age", "soon"]).single().unwrap_err();
    assert!(err.to_string().contains("--max-age \"soon\""));
    let c = args(&["-f", &f, "--check-unused", "0.5"]).single().unwrap();
    assert_eq!(c.server.check_unused, Duration::from_millis(500));
}

#[test]
fn shiny_reconnect_and_buffers_default_and_take_flags() {
    let (_dir, f) = api();
    let c = args(&["-f", &f]).single().unwrap();
    assert_eq!(c.apps[0].reconnect_window, Duration::from_secs(120));
    assert_eq!((c.server.shiny_session_buffer, c.server.shiny_buffer_total), (16 << 20, 256 << 20));
    let given = ["-f", &f, "--shiny-reconnect-window", "30.5", "--shiny-session-buffer", "64KiB"];
    let c = args(&[&given[..], &["--shiny-buffer-total", "1MB"]].concat()).single().unwrap();
    assert_eq!(c.apps[0].reconnect_window, Duration::from_millis(30_500));
    assert_eq!((c.server.shiny_session_buffer, c.server.shiny_buffer_total), (64 << 10, 1 << 20));
    let c = args(&["-f", &f, "--shiny-reconnect-window", "0"]).single().unwrap();
    assert_eq!(c.apps[0].reconnect_window, Duration::ZERO, "0 turns same-session reconnect off");
}

#[test]
fn shiny_reconnect_and_buffers_refuse_what_is_out_of_range() {
    let (_dir, f) = api();
    let refused = |extra: &[&str]| args(&[&["-f", f.as_str()], extra].concat()).single().unwrap_err().to_string();
    assert_eq!(
        refused(&["--shiny-reconnect-window", "86401"]),
        "--shiny-reconnect-window \"86401\" is out of range: use 0 to 86400 seconds (a day; 0 turns same-session reconnect off)"
    );
    assert!(args(&["-f", &f, "--shiny-reconnect-window", "86400"]).single().is_ok());
    let e = refused(&["--shiny-reconnect-window", "2m"]);
    assert!(e.starts_with("--shiny-reconnect-window \"2m\" is not a number of seconds"), "{e}");
    let e = refused(&["--shiny-session-buffer", "32KiB"]);
    assert_eq!(e, "--shiny-session-buffer \"32KiB\" is out of range: use 64KiB or more (such as 16MiB)");
    let e = refused(&["--shiny-session-buffer", "16XB"]);
    assert!(e.starts_with("--shiny-session-buffer \"16XB\" is not a size"), "{e}");
    let e = refused(&["--shiny-buffer-total", "lots"]);
    assert!(e.starts_with("--shiny-buffer-total \"lots\" is not a size"), "{e}");
    let e = refused(&["--shiny-session-buffer", "32MiB", "--shiny-buffer-total", "16MiB"]);
    assert!(e.starts_with("--shiny-buffer-total 16MiB is below --shiny-session-buffer 32MiB:"), "{e}");
    assert!(e.contains("raise --shiny-buffer-total or lower --shiny-session-buffer"), "{e}");
}

/// The variables are process-wide and other tests parse flags meanwhile:
/// the test binary runs `shiny_settings_from_variables` again, alone, in a
/// child process with them set.
#[test]
fn variables_set_the_shiny_settings() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["config::flags::tests::shiny_settings_from_variables", "--exact", "--include-ignored"])
        .env("VALVE_SHINY_RECONNECT_WINDOW", "45")
        .env("VALVE_SHINY_SESSION_BUFFER", "2MiB")
        .env("VALVE_SHINY_BUFFER_TOTAL", "64MiB")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("1 passed"), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
#[ignore = "run by variables_set_the_shiny_settings, with the variables set"]
fn shiny_settings_from_variables() {
    if std::env::var_os("VALVE_SHINY_RECONNECT_WINDOW").is_none() {
        return;
    }
    let (_dir, f) = api();
    let c = args(&["-f", &f]).single().unwrap();
    assert_eq!(c.apps[0].reconnect_window, Duration::from_secs(45));
    assert_eq!((c.server.shiny_session_buffer, c.server.shiny_buffer_total), (2 << 20, 64 << 20));
}

#[test]
fn healthcheck_defaults_to_valves_own_healthz() {
    assert_eq!(args(&["--healthcheck"]).healthcheck_url().unwrap(), "http://127.0.0.1:3000/__valve__/healthz");
    let a = args(&["--healthcheck", "--host", "0.0.0.0", "--port", "8080"]);
    assert_eq!(a.healthcheck_url().unwrap(), "http://127.0.0.1:8080/__valve__/healthz");
    assert_eq!(args(&["--healthcheck", "http://x:1/y"]).healthcheck_url().unwrap(), "http://x:1/y");
    assert_eq!(args(&[]).healthcheck_url(), None);
}

#[test]
fn log_buffer_and_usage_log_flags_are_checked() {
    let (_d, api) = api();
    let c = args(&["-f", &api, "--log-buffer", "64KiB", "--usage-anonymize"]).single().unwrap();
    assert_eq!((c.apps[0].log_buffer, c.server.usage_anonymize), (64 << 10, true));
    assert_eq!(args(&["-f", &api, "--log-buffer", "0"]).single().unwrap().apps[0].log_buffer, 0);
    let err = args(&["-f", &api, "--log-buffer", "big"]).single().unwrap_err().to_string();
    assert!(err.contains("--log-buffer \"big\" is not a size"), "{err}");
    let err = args(&["-f", &api, "--usage-log", "/no/such/folder/usage.jsonl"]).single().unwrap_err().to_string();
    assert_eq!(err, "--usage-log /no/such/folder/usage.jsonl: its folder /no/such/folder does not exist: create it, or name a file in a folder that does");
    let dir = tempfile::tempdir().unwrap();
    let shared = args(&["-f", &api, "--usage-log", dir.path().to_str().unwrap()]).single().unwrap();
    assert_eq!(shared.server.usage_log.as_deref(), Some(dir.path()), "a folder: shared by a site's valves");
}
