//! The config file reader against small files: every problem with its place.

use std::time::Duration;

use super::*;
use crate::config::model::normal_prefix;
use crate::config::AppSource;
use clap::Parser;

fn args(extra: &[&str]) -> Args {
    let mut argv = vec!["valve"];
    argv.extend_from_slice(extra);
    Args::try_parse_from(argv).unwrap()
}

/// A folder with a config file and two apps; returns (dir, config path).
fn site_with(config: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sales")).unwrap();
    std::fs::write(dir.path().join("sales/plumber.R"), "#* @get /x\nfunction() 1\n").unwrap();
    std::fs::create_dir(dir.path().join("explorer")).unwrap();
    std::fs::write(dir.path().join("explorer/app.R"), "shinyApp(ui, server)\n").unwrap();
    let path = dir.path().join("valve.toml");
    std::fs::write(&path, config).unwrap();
    (dir, path)
}

const GOOD: &str = r#"
host = "0.0.0.0"
port = 3000
max_workers = 8
max_age = 60

[[app]]
name = "sales"
path = "/sales/"
file = "sales/plumber.R"
n_min = 1
n_max = 4
max_pending = 3
env = { DB = "x" }

[[app]]
name = "explorer"
path = "/explorer"
file = "explorer"
n_min = 0
max_sessions = 10
hostname = "Apps.Example.com"
"#;

#[test]
fn a_config_file_of_two_apps() {
    let (_d, path) = site_with(GOOD);
    let c = load(&path, &args(&[])).unwrap();
    assert_eq!((c.server.host.as_str(), c.server.port, c.server.max_workers), ("0.0.0.0", 3000, 8));
    let sales = &c.apps[0];
    assert_eq!((sales.name.as_str(), sales.prefix.as_str(), sales.n_min, sales.n_max), ("sales", "/sales", 1, 4));
    assert_eq!(sales.env, vec![("DB".to_string(), "x".to_string())]);
    assert_eq!((sales.max_pending, c.apps[1].max_pending), (3, 16), "an app's max_pending, else the default");
    assert_eq!(sales.max_age, Duration::from_secs(60), "top-level defaults apply");
    assert!(matches!(sales.source, AppSource::PlumberFile(_)));
    let explorer = &c.apps[1];
    assert!(explorer.is_shiny());
    assert_eq!((explorer.n_min, explorer.max_sessions), (0, 10));
    assert_eq!(explorer.hostname.as_deref(), Some("apps.example.com"));
}

#[test]
fn an_apps_key_beats_a_flag_which_beats_the_top_level() {
    let (_d, path) = site_with(GOOD);
    let mut a = args(&["--max-age", "5", "--n-max", "2", "--port", "4000"]);
    a.explicit = ["max_age", "n_max", "port"].iter().map(|s| s.to_string()).collect();
    let c = load(&path, &a).unwrap();
    assert_eq!(c.apps[0].max_age, Duration::from_secs(5), "flag over top level");
    assert_eq!(c.apps[0].n_max, 4, "the app's own key over the flag");
    assert_eq!(c.apps[1].n_max, 2);
    assert_eq!(c.server.port, 4000);
}

#[test]
fn every_problem_is_listed_with_its_line() {
    let (_d, path) = site_with(
        r#"max_workers = 1
n_maxx = 3

[[app]]
file = "nowhere"
path = "sales"
n_min = 2

[[app]]
file = "explorer"
preload = true
request_timeout = "soon"
"#,
    );
    let e = load(&path, &args(&[])).unwrap_err();
    let text = e.to_string();
    assert!(text.contains(":2:1: unknown key `n_maxx` at the top level (did you mean `n_max`?)"), "{text}");
    assert!(text.contains(":5:8: file = \"nowhere\": app not found"), "{text}");
    assert!(text.contains(":6:8: path = \"sales\": must start with `/`"), "{text}");
    assert!(text.contains(":12:19: request_timeout = \"soon\": not a number of seconds"), "{text}");
}

#[test]
fn syntax_errors_say_where() {
    let (_d, path) = site_with("[[app]\nfile = 1\n");
    let e = load(&path, &args(&[])).unwrap_err();
    assert_eq!(e.list.len(), 1);
    assert_eq!(e.list[0].line, 1, "{e}");
}

#[test]
fn mount_points_and_names_are_used_once_and_n_min_fits_the_budget() {
    let (_d, path) = site_with(
        r#"max_workers = 2
[[app]]
file = "sales"
path = "/a"
n_min = 2
[[app]]
file = "sales/plumber.R"
name = "sales"
path = "/a/"
n_min = 1
"#,
    );
    let text = load(&path, &args(&[])).unwrap_err().to_string();
    assert!(text.contains("app name `sales` is already used by the app at line 2"), "{text}");
    assert!(text.contains("path `/a` is already served by app `sales`"), "{text}");
    assert!(text.contains("max_workers = 2: raise max_workers") || text.contains("add up to 3"), "{text}");
}

#[test]
fn prefixes_are_normalised_or_refused() {
    assert_eq!(normal_prefix("/sales/").unwrap(), "/sales");
    assert_eq!(normal_prefix("/").unwrap(), "/");
    assert_eq!(normal_prefix("//").unwrap_err(), "must be a plain URL path (letters, digits, `-`, `_`, `.` and `/`)");
    assert!(normal_prefix("/__valve__/x").is_err());
    assert!(normal_prefix("/a/../b").is_err());
}

#[test]
fn shiny_reconnect_and_buffers_default_then_keys_then_flags() {
    let (_d, path) = site_with(GOOD);
    let c = load(&path, &args(&[])).unwrap();
    assert_eq!(c.apps[1].reconnect_window, Duration::from_secs(120), "the default");
    assert_eq!((c.server.shiny_session_buffer, c.server.shiny_buffer_total), (16 << 20, 256 << 20));
    let with_keys = GOOD
        .replace(
            "max_age = 60\n",
            "max_age = 60\nreconnect_window = 300\nshiny_session_buffer = \"1MiB\"\nshiny_buffer_total = 8388608\n",
        )
        .replace("max_sessions = 10\n", "max_sessions = 10\nreconnect_window = 0\n");
    let (_d, path) = site_with(&with_keys);
    let c = load(&path, &args(&[])).unwrap();
    assert_eq!(c.apps[0].reconnect_window, Duration::from_secs(300), "the top level");
    assert_eq!(c.apps[1].reconnect_window, Duration::ZERO, "the app's own key; 0 turns reconnect off");
    assert_eq!((c.server.shiny_session_buffer, c.server.shiny_buffer_total), (1 << 20, 8 << 20));
    let mut a = args(&["--shiny-reconnect-window", "30", "--shiny-buffer-total", "2MiB"]);
    a.explicit = ["reconnect_window", "shiny_buffer_total"].iter().map(|s| s.to_string()).collect();
    let c = load(&path, &a).unwrap();
    assert_eq!(c.apps[0].reconnect_window, Duration::from_secs(30), "a flag over the top level");
    assert_eq!(c.apps[1].reconnect_window, Duration::ZERO, "the app's own key over the flag");
    assert_eq!((c.server.shiny_session_buffer, c.server.shiny_buffer_total), (1 << 20, 2 << 20));
}

#[test]
fn shiny_reconnect_and_buffers_out_of_range_are_listed_with_their_lines() {
    let (_d, path) = site_with(
        r#"reconnect_window = 86401
shiny_session_buffer = "32KiB"
shiny_buffer_total = "10XB"

[[app]]
file = "explorer"
reconnect_window = "2m"

[[app]]
file = "sales"
"#,
    );
    let text = load(&path, &args(&[])).unwrap_err().to_string();
    assert!(
        text.contains(":1:20: reconnect_window = 86401: out of range: use 0 to 86400 seconds (a day; 0 turns same-session reconnect off)"),
        "{text}"
    );
    assert!(text.contains(":2:24: shiny_session_buffer = \"32KiB\": out of range: use 64KiB or more"), "{text}");
    assert!(text.contains(":3:22: shiny_buffer_total = \"10XB\": not a size"), "{text}");
    assert!(text.contains(":7:20: reconnect_window = \"2m\": not a number of seconds"), "{text}");
}

#[test]
fn the_shiny_buffer_total_holds_at_least_one_sessions_buffer() {
    let (_d, path) =
        site_with("shiny_session_buffer = \"32MiB\"\nshiny_buffer_total = \"16MiB\"\n[[app]]\nfile = \"explorer\"\n");
    let text = load(&path, &args(&[])).unwrap_err().to_string();
    assert!(text.contains(":2:22: shiny_buffer_total (16MiB) is below shiny_session_buffer (32MiB)"), "{text}");
    assert!(text.contains("raise shiny_buffer_total or lower shiny_session_buffer"), "{text}");
    let (_d, path) = site_with("shiny_session_buffer = \"512MiB\"\n[[app]]\nfile = \"explorer\"\n");
    let text = load(&path, &args(&[])).unwrap_err().to_string();
    assert!(text.contains(":1:24: shiny_buffer_total (256MiB) is below shiny_session_buffer (512MiB)"), "{text}");
}

#[test]
fn a_static_folder_is_an_app_with_no_worker() {
    let (d, path) = site_with(
        r#"n_min = 2
[[app]]
name = "docs"
path = "/docs"
static = "site"

[[app]]
file = "pages"
"#,
    );
    for folder in ["site", "pages"] {
        std::fs::create_dir(d.path().join(folder)).unwrap();
        std::fs::write(d.path().join(folder).join("Index.html"), "<h1>hi</h1>").unwrap();
    }
    // `static` serves the folder as files whatever it holds; `file` finds R first.
    std::fs::write(d.path().join("site/app.R"), "shinyApp(ui, server)\n").unwrap();
    let c = load(&path, &args(&[])).unwrap();
    for app in &c.apps {
        assert_eq!((app.source.kind(), app.n_min, app.n_max, app.preload), ("static", 0, 0, false), "{app:?}");
    }
    assert_eq!((c.apps[0].prefix.as_str(), c.apps[1].name.as_str()), ("/docs", "pages"));
    assert_eq!(c.server.max_workers, 1, "no worker needed, but a budget is never 0");
}

#[test]
fn a_static_folder_that_cannot_be_served_is_refused_with_its_line() {
    let (d, path) = site_with(
        r#"[[app]]
name = "a"
static = "missing"
[[app]]
name = "b"
static = "sales/plumber.R"
[[app]]
name = "c"
static = "noindex"
[[app]]
name = "d"
static = "sales"
file = "sales"
[[app]]
name = "e"
static = "ok"
n_max = 3
[[app]]
name = "f"
static = 3
"#,
    );
    std::fs::create_dir(d.path().join("noindex")).unwrap();
    std::fs::create_dir(d.path().join("ok")).unwrap();
    std::fs::write(d.path().join("ok/index.html"), "").unwrap();
    let text = load(&path, &args(&[])).unwrap_err().to_string();
    assert!(text.contains(":3:10: static = \"missing\": static folder not found"), "{text}");
    assert!(
        text.contains(":6:10: static = \"sales/plumber.R\":") && text.contains("is a file, not a folder"),
        "{text}"
    );
    assert!(text.contains(":9:10: static = \"noindex\": folder") && text.contains("holds no index.html"), "{text}");
    assert!(text.contains(":12:1: give either `file` (an R app) or `static`"), "{text}");
    assert!(text.contains(":17:1: `n_max` does nothing for static content"), "{text}");
    assert!(text.contains(":20:10: `static` must be a string"), "{text}");
}

#[test]
fn access_keys_top_level_defaults_and_an_apps_own_pair() {
    let (d, path) = site_with(
        r#"
trusted_proxies = ["127.0.0.1", "10.0.0.0/8"]
user_header = "X-Auth-Request-User"
sign_in_url = "/oauth2/start?rd={rd}"
allow_groups = ["staff"]

[[app]]
name = "sales"
file = "sales/plumber.R"
allow_users = ["alice"]

[[app]]
name = "explorer"
file = "explorer"

[[app]]
name = "docs"
static = "docs"
allow_users = []
"#,
    );
    std::fs::create_dir(d.path().join("docs")).unwrap();
    std::fs::write(d.path().join("docs/index.html"), "<h1>docs</h1>").unwrap();
    let c = load(&path, &args(&[])).unwrap();
    let t = &c.server.trust;
    let proxies: Vec<String> = t.proxies.iter().map(|p| p.to_string()).collect();
    assert_eq!(proxies, ["127.0.0.1/32", "10.0.0.0/8"]);
    assert_eq!((t.user_header.as_str(), t.email_header.as_str()), ("x-auth-request-user", "x-forwarded-email"));
    assert_eq!(t.sign_in_url.as_deref(), Some("/oauth2/start?rd={rd}"));
    assert_eq!(c.apps[0].allow.users.as_deref(), Some(&["alice".to_string()][..]));
    assert_eq!(c.apps[0].allow.groups, None, "an app's own pair replaces the defaults whole");
    assert_eq!(c.apps[1].allow.groups.as_deref(), Some(&["staff".to_string()][..]), "the top level's otherwise");
    assert!(c.apps[2].allow.names_nobody(), "a static app takes allow lists too");
    let warnings: Vec<String> = c.warnings().into_iter().filter(|w| w.contains("name nobody")).collect();
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].contains("app `docs`"), "{warnings:?}");
    let mut given = args(&["--trusted-proxies", "192.168.0.0/16"]);
    given.explicit.insert("trusted_proxies".into());
    let flagged = load(&path, &given).unwrap();
    assert_eq!(flagged.server.trust.proxies.len(), 1, "an explicit flag beats the file's top level");
}

#[test]
fn bad_access_settings_are_listed_with_their_lines() {
    let (_d, path) = site_with(
        "trusted_proxies = [\"10.0.0/8\"]\ngroups_header = \"X Groups\"\nsign_in_url = \"javascript:alert(1)\"\n\n[[app]]\nfile = \"sales/plumber.R\"\nallow_users = \"alice\"\n",
    );
    let text = load(&path, &args(&[])).unwrap_err().to_string();
    assert!(
        text.contains(":1:") && text.contains("\"10.0.0/8\" is not an address or a CIDR such as 10.0.0.0/8"),
        "{text}"
    );
    assert!(text.contains(":2:") && text.contains("groups_header"), "{text}");
    assert!(text.contains(":3:") && text.contains("sign_in_url"), "{text}");
    assert!(text.contains(":7:") && text.contains("must be a list of names"), "{text}");
    let e = args(&["--trusted-proxies", "127.0.0.1/40"]).trust().unwrap_err().to_string();
    assert_eq!(
        e,
        "--trusted-proxies: \"127.0.0.1/40\" is not an address or a CIDR such as 10.0.0.0/8, 192.168.1.5 or fd00::/8"
    );
}

#[test]
fn auth_url_and_auth_cache_come_from_the_file_or_the_flags_and_are_checked() {
    let (_d, path) = site_with(
        "auth_url = \"http://127.0.0.1:4180/oauth2/auth\"\nauth_cache = 60\n\n[[app]]\nfile = \"sales/plumber.R\"\n",
    );
    let auth = load(&path, &args(&[])).unwrap().server.trust.auth.unwrap();
    assert_eq!((auth.port, auth.path.as_str(), auth.cache.as_secs()), (4180, "/oauth2/auth", 60));
    let (_d, path) = site_with("[[app]]\nfile = \"sales/plumber.R\"\n");
    assert_eq!(load(&path, &args(&[])).unwrap().server.trust.auth, None, "no auth_url: no forward auth");
    let flagged = load(&path, &args(&["--auth-url", "http://auth/check", "--auth-cache", "0"])).unwrap();
    assert!(flagged.server.trust.auth.is_some_and(|a| a.cache.is_zero() && a.host == "auth"));
    let (_d, path) = site_with("auth_url = \"https://sso.example.org/auth\"\n\n[[app]]\nfile = \"sales/plumber.R\"\n");
    let text = load(&path, &args(&[])).unwrap_err().to_string();
    assert!(
        text.contains(":1:") && text.contains("\"https://sso.example.org/auth\"") && text.contains("TLS"),
        "{text}"
    );
    let e = args(&["--auth-url", "auth:4180"]).trust().unwrap_err().to_string();
    assert!(e.starts_with("--auth-url: \"auth:4180\" is not an http:// URL"), "{e}");
    let e = args(&["--auth-url", "http://auth/", "--auth-cache", "soon"]).trust().unwrap_err().to_string();
    assert!(e.contains("--auth-cache") && e.contains("soon"), "{e}");
}

#[test]
fn log_buffer_and_usage_settings_from_the_file_and_flags() {
    let with = GOOD
        .replace(
            "max_age = 60\n",
            "max_age = 60\nlog_buffer = \"256KiB\"\nusage_log = \"logs/usage.jsonl\"\nusage_anonymize = true\n",
        )
        .replace("max_sessions = 10\n", "max_sessions = 10\nlog_buffer = 0\n");
    let (d, path) = site_with(&with);
    std::fs::create_dir(d.path().join("logs")).unwrap();
    let c = load(&path, &args(&[])).unwrap();
    assert_eq!(
        (c.apps[0].log_buffer, c.apps[1].log_buffer),
        (256 << 10, 0),
        "the top level, then the app's own (0: none)"
    );
    let canonical = std::fs::canonicalize(d.path()).unwrap();
    assert_eq!(c.server.usage_log, Some(canonical.join("logs/usage.jsonl")), "relative to the config file");
    assert!(c.server.usage_anonymize);
    let c = load(&site_with(GOOD).1, &args(&[])).unwrap();
    assert_eq!(
        (c.apps[0].log_buffer, c.server.usage_log.clone(), c.server.usage_anonymize),
        (1 << 20, None, false),
        "defaults"
    );
    // A different log size alone needs no new generation of workers.
    let mut resized = c.apps[0].clone();
    resized.log_buffer = 1;
    assert!(c.apps[0].same_workers(&resized));

    let (_d, path) =
        site_with("usage_log = \"nowhere/usage.jsonl\"\nlog_buffer = \"lots\"\n[[app]]\nfile = \"explorer\"\n");
    let text = load(&path, &args(&[])).unwrap_err().to_string();
    assert!(text.contains(":1:13: usage_log = ") && text.contains("nowhere does not exist"), "{text}");
    assert!(text.contains(":2:14: log_buffer = \"lots\": not a size"), "{text}");
}

#[test]
fn otlp_endpoint_comes_from_the_file_unless_the_flag_is_given_and_is_checked_with_its_line() {
    let (_d, path) = site_with("otlp_endpoint = \"http://collector:4318\"\n\n[[app]]\nfile = \"sales/plumber.R\"\n");
    let otlp = load(&path, &args(&[])).unwrap().server.otlp.unwrap();
    assert_eq!((otlp.host.as_str(), otlp.port, otlp.path.as_str()), ("collector", 4318, "/v1/traces"));
    let mut given = args(&["--otlp-endpoint", "off"]);
    given.explicit.insert("otlp_endpoint".into());
    assert_eq!(load(&path, &given).unwrap().server.otlp, None, "an explicit flag beats the file");
    let (_d, path) = site_with("[[app]]\nfile = \"sales/plumber.R\"\n");
    let flagged = load(&path, &args(&["--otlp-endpoint", "http://c:9/x"])).unwrap().server.otlp.unwrap();
    assert_eq!((flagged.port, flagged.path.as_str()), (9, "/x"), "no key: the flag's value");
    let (_d, bad) = site_with("otlp_endpoint = \"https://c\"\n\n[[app]]\nfile = \"sales/plumber.R\"\n");
    let text = load(&bad, &args(&[])).unwrap_err().to_string();
    assert!(text.contains(":1:") && text.contains("otlp_endpoint \"https://c\"") && text.contains("TLS"), "{text}");
}
