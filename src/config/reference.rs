//! The manual's reference page of flags, environment variables and config
//! keys, rendered from clap's `Args` and the key lists in `keys`, and the
//! check that keeps each generated page of the manual equal to its code.
//!
//! `VALVE_BLESS=1 cargo test --release --lib reference` rewrites the pages
//! (docs/src/reference/flags.md here, metrics.md from `metrics`); without it
//! the tests fail when a page and the code disagree.

use std::fmt::Write;

use clap::{ArgAction, CommandFactory};

use super::error::ConfigError;
use super::flags::Args;
use super::keys::{flag_name, ACCESS_KEYS, APP_KEYS, APP_ONLY, SERVER_KEYS};

/// How to regenerate a page, as each generated page says it.
pub const BLESS: &str = "VALVE_BLESS=1 cargo test --release --lib reference";

/// Variables valve reads that are not flags: logging before a config exists,
/// OpenTelemetry's standard ones (config::otel), and what a worker finds.
const OTHER_VARIABLES: &[(&str, &str)] = &[
    (
        "VALVE_LOG",
        "valve's log filter, as tracing's `EnvFilter` reads it (`debug`, `valve=debug,hyper=info`); default `info`",
    ),
    ("NO_COLOR", "set: no colour in the log even on a terminal"),
    (
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT",
        "where traces go when `--otlp-endpoint` is not given (the first wins; `/v1/traces` is added to the second)",
    ),
    ("OTEL_EXPORTER_OTLP_PROTOCOL", "only `http/protobuf` is spoken; another value is an error at start"),
    ("OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES", "the traces' service name and resource attributes"),
    ("OTEL_SDK_DISABLED", "`true`: no traces, whatever else is set"),
    ("QUARTO_PATH", "the Quarto CLI for `.qmd` documents (else `quarto` on the `PATH`)"),
    ("GLIBC_TUNABLES", "kept and passed to R; `glibc.malloc.hugetlb=0` turns off the huge pages valve asks for"),
    ("VALVE_ADMIN_URL", "the admin address the `versions`, `activate` and `access` commands talk to (their `--admin`)"),
];

/// The page: every flag with its variable, key and default; the keys that
/// have no flag; the commands; the other variables.
pub fn flags_page() -> String {
    let cmd = Args::command();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Flags, config keys and variables\n\n\
         <!-- Generated from src/config/flags.rs and src/config/keys.rs: do not edit. {BLESS} -->\n\n\
         Every flag has an environment variable (`VALVE_PORT=8080 valve` works like\n\
         `valve --port 8080`), and most have a key in a config file (the flag's name\n\
         in snake_case). An app's own key beats a flag given on the command line (or\n\
         its variable), which beats the file's top level, which beats the default.\n\
         `valve --help` says the same as this page, which is generated from the same\n\
         code (`{BLESS}` rewrites it).\n\n\
         ## At a glance\n\n\
         | flag | variable | config key |\n\
         |---|---|---|"
    );
    let flags: Vec<&clap::Arg> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set() && a.get_long().is_some_and(|l| l != "help" && l != "version"))
        .collect();
    for arg in &flags {
        let long = arg.get_long().unwrap_or_default();
        let var = arg.get_env().map(|e| format!("`{}`", e.to_string_lossy())).unwrap_or_default();
        let key = key_of(long).map(|(k, _)| format!("`{k}`")).unwrap_or_default();
        let _ = writeln!(out, "| [`--{long}`](#--{long}) | {var} | {key} |");
    }
    let _ = writeln!(out, "\n## Every flag");
    for arg in &flags {
        let long = arg.get_long().unwrap_or_default();
        let mut facts = Vec::new();
        if let Some(short) = arg.get_short() {
            facts.push(format!("short `-{short}`"));
        }
        if let Some(env) = arg.get_env() {
            facts.push(format!("variable `{}`", env.to_string_lossy()));
        }
        if let Some((key, place)) = key_of(long) {
            facts.push(format!("config key `{key}` ({place})"));
        }
        let defaults: Vec<String> = arg.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
        match arg.get_action() {
            ArgAction::SetTrue => facts.push("off unless given".to_string()),
            _ if defaults.iter().all(|d| d.is_empty()) => facts.push("no default".to_string()),
            _ => facts.push(format!("default `{}`", defaults.join(","))),
        }
        let mut help = arg.get_long_help().or(arg.get_help()).map(|h| one_line(&h.to_string())).unwrap_or_default();
        if !help.ends_with(['.', ')', ':']) {
            help.push('.');
        }
        let _ = writeln!(out, "\n### `--{long}`\n\n{}.\n\n{}", facts.join(", "), cell(&help));
    }
    let _ = writeln!(
        out,
        "\n## Config keys without a flag\n\n\
         These are set in a config file only (`--config`).\n\n\
         | key | where | meaning |\n|---|---|---|"
    );
    for key in APP_ONLY {
        let _ = writeln!(out, "| `{key}` | `[[app]]` only | {} |", app_only_meaning(key));
    }
    for key in APP_KEYS.iter().chain(ACCESS_KEYS) {
        if flag_of(key).is_none() {
            let _ = writeln!(out, "| `{key}` | `[[app]]`, or the top level as a default | {} |", keyed_meaning(key));
        }
    }
    for key in SERVER_KEYS {
        if flag_of(key).is_none() {
            let _ = writeln!(out, "| `{key}` | top level | {} |", keyed_meaning(key));
        }
    }
    let _ = writeln!(out, "\n## Commands\n\n| command | what |\n|---|---|");
    for sub in cmd.get_subcommands() {
        let args: Vec<String> = sub
            .get_arguments()
            .filter(|a| a.get_id() != "help")
            .map(|a| match a.get_long() {
                Some(l) => format!("[--{l}]"),
                None => a.get_id().as_str().to_uppercase(),
            })
            .collect();
        let about = sub.get_about().map(|a| one_line(&a.to_string())).unwrap_or_default();
        let _ = writeln!(out, "| `valve {} {}` | {} |", sub.get_name(), args.join(" "), cell(&about));
    }
    let _ = writeln!(out, "\n## Other environment variables\n\n| variable | what |\n|---|---|");
    for (name, what) in OTHER_VARIABLES {
        let names: Vec<String> = name.split(", ").map(|n| format!("`{n}`")).collect();
        let _ = writeln!(out, "| {} | {what} |", names.join(", "));
    }
    out
}

/// The page of configuration errors: each `ConfigError` valve can stop with
/// (exit code 2, also under `--check`), its message with `…` for the values.
pub fn config_errors_page() -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Configuration errors\n\n\
         <!-- Generated from src/config/error.rs by src/config/reference.rs: do not edit. {BLESS} -->\n\n\
         valve checks its whole configuration before it binds a port or starts R.\n\
         Each problem below stops it with exit code 2 (`valve --check` says the\n\
         same and exits 2), every problem at once, a config file's with\n\
         `file:line:column`. `…` stands for the value valve names. A config file's\n\
         own problems (an unknown key, with the nearest known one; a value of the\n\
         wrong type) come from the TOML reader, and the answers valve gives to\n\
         requests are in [Errors and exit codes](errors.md).\n\n\
         | problem | message |\n|---|---|"
    );
    for e in config_error_examples() {
        let _ = writeln!(out, "| {} | {} |", variant(&e), cell(&one_line(&e.to_string())));
    }
    out
}

/// One of each `ConfigError`, with `…` for its values.
fn config_error_examples() -> Vec<ConfigError> {
    let v = || "…".to_string();
    vec![
        ConfigError::NotFound { path: v(), what: v() },
        ConfigError::Unreadable { path: v(), reason: v() },
        ConfigError::EmptyDir(v()),
        ConfigError::NoStaticFolder(v()),
        ConfigError::StaticNotAFolder(v()),
        ConfigError::NoIndex(v()),
        ConfigError::NotInteractive(v()),
        ConfigError::BadFrontMatter { path: v(), reason: v() },
        ConfigError::QuartoNotInteractive(v()),
        ConfigError::BadServerYml { path: v(), reason: v() },
        ConfigError::NoEngine { path: v(), found: String::new() },
        ConfigError::ZeroSessions,
        ConfigError::MinAboveMax { n_min: 4, n_max: 3 },
        ConfigError::ZeroMax,
        ConfigError::ZeroThreads,
        ConfigError::BadSeconds { flag: "--FLAG", value: v() },
        ConfigError::BadSize { flag: "--FLAG", value: v() },
        ConfigError::ZeroQueue,
        ConfigError::EmptySite(v()),
        ConfigError::MinAboveBudget { n_min: 9, max: 8 },
        ConfigError::Several,
        ConfigError::OutOfRange { flag: "--FLAG", value: v(), range: "…" },
        ConfigError::BufferTotalBelowSession { total: v(), session: v() },
        ConfigError::Access { flag: "trusted_proxies, auth_url or sign_in_url", why: "what is wrong with it".into() },
        ConfigError::Published("a publishing setting, the keys file or a published app, and what is wrong".into()),
        ConfigError::Isolation("whom an app runs as or what its user cannot read, one line per app".into()),
        ConfigError::UsageLog { path: v(), why: v() },
        ConfigError::Otlp("the trace setting, its value and what is wrong".into()),
        ConfigError::Packages(
            "the package setting (`--package-cache`, `--repositories`), its value and what to write".into(),
        ),
        ConfigError::Tls(
            "the HTTPS setting (`tls_cert`, `tls_acme_domains`, `http_port`), its value and what to give".into(),
        ),
    ]
}

/// What a `ConfigError` is about. The match is exhaustive: a new variant
/// does not compile until it is named here (and given an example above).
fn variant(e: &ConfigError) -> &'static str {
    match e {
        ConfigError::NotFound { .. } => "no app at the path",
        ConfigError::Unreadable { .. } => "a file valve cannot read",
        ConfigError::EmptyDir(_) => "a folder holding no app",
        ConfigError::NoStaticFolder(_) => "`static` names no folder",
        ConfigError::StaticNotAFolder(_) => "`static` names a file",
        ConfigError::NoIndex(_) => "a static folder without index.html",
        ConfigError::NotInteractive(_) => "an R Markdown document without a Shiny runtime",
        ConfigError::BadFrontMatter { .. } => "front matter that is not YAML",
        ConfigError::QuartoNotInteractive(_) => "a Quarto document without `server: shiny`",
        ConfigError::BadServerYml { .. } => "a `_server.yml` that is not YAML",
        ConfigError::NoEngine { .. } => "a `_server.yml` naming no engine",
        ConfigError::ZeroSessions => "`--max-sessions 0`",
        ConfigError::MinAboveMax { .. } => "`--n-min` above `--n-max`",
        ConfigError::ZeroMax => "`--n-max 0`",
        ConfigError::ZeroThreads => "`--workers 0`",
        ConfigError::BadSeconds { .. } => "not a number of seconds",
        ConfigError::BadSize { .. } => "not a size",
        ConfigError::ZeroQueue => "`--queue-size 0`",
        ConfigError::EmptySite(_) => "a `--site` with no app folder",
        ConfigError::MinAboveBudget { .. } => "the apps' `n_min` above `--max-workers`",
        ConfigError::Several => "two of `-f`, `--config`, `--site` on the command line (or two from `VALVE_*` variables; one on the command line beats a variable)",
        ConfigError::OutOfRange { .. } => "a value out of range",
        ConfigError::BufferTotalBelowSession { .. } => "`--shiny-buffer-total` below `--shiny-session-buffer`",
        ConfigError::Access { .. } => "a bad trusted proxy, `auth_url` or `sign_in_url`",
        ConfigError::Published(_) => "publishing",
        ConfigError::Isolation(_) => "whom apps run as",
        ConfigError::UsageLog { .. } => "a `--usage-log` valve cannot use",
        ConfigError::Otlp(_) => "where traces go",
        ConfigError::Packages(_) => "apps' packages: the cache or the repositories",
        ConfigError::Tls(_) => "HTTPS: a certificate valve cannot serve, or settings that do not go together",
    }
}

/// The config key a flag stands for, and where it may stand.
fn key_of(long: &str) -> Option<(&'static str, &'static str)> {
    let places: [(&[&'static str], &'static str); 3] = [
        (APP_KEYS, "an app's, or the top level's"),
        (ACCESS_KEYS, "an app's, or the top level's"),
        (SERVER_KEYS, "top level"),
    ];
    places
        .iter()
        .find_map(|(keys, place)| keys.iter().find(|k| flag_of(k).as_deref() == Some(long)).map(|k| (*k, *place)))
}

/// The flag (without `--`) a key stands for, if there is one.
fn flag_of(key: &str) -> Option<String> {
    let named = flag_name(key);
    let long = match named.strip_prefix("--") {
        Some(l) => l.to_string(),
        None => key.replace('_', "-"),
    };
    Args::command().get_arguments().any(|a| a.get_long() == Some(long.as_str())).then_some(long)
}

fn app_only_meaning(key: &str) -> &'static str {
    match key {
        "name" => "the app's name: a label in logs, metrics and the dashboard",
        "path" => "its URL prefix (`/` for a root app; default `/<name>`, or `/` for a file's only app)",
        "file" => "what it runs: a plumber file or folder, a Shiny app, an interactive `.Rmd` or `.qmd`, a `_server.yml` folder",
        "static" => "a folder of files served by valve itself (in place of `file`)",
        "hostname" => "route by `Host` as well as by path",
        _ => "",
    }
}

fn keyed_meaning(key: &str) -> &'static str {
    match key {
        "env" => "environment variables for the app's workers (`env = { DB_HOST = \"db\" }`)",
        "allow_users" => "users (or emails) who may use the app; with `allow_groups`, anyone else gets 403",
        "allow_groups" => "groups whose members may use the app",
        _ => "see the flag of the same name",
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Help text as a table cell: no column breaks, and outside code spans no
/// HTML tags and no emphasis (inside them a backslash would show).
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
        .split('`')
        .enumerate()
        .map(|(i, part)| {
            if i % 2 == 1 {
                part.to_string()
            } else {
                part.replace('<', "&lt;").replace('*', "\\*").replace('_', "\\_")
            }
        })
        .collect::<Vec<_>>()
        .join("`")
}

/// Compares a generated page with the manual's copy at `page` (relative to
/// the repository), or writes it under `VALVE_BLESS=1`. The error names the
/// first line that differs and the command that fixes it.
#[cfg(test)]
pub fn compare_or_bless(page: &str, text: &str) -> Result<(), String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(page);
    if std::env::var("VALVE_BLESS").is_ok_and(|v| v == "1") {
        return std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()));
    }
    let written = std::fs::read_to_string(&path).unwrap_or_default();
    if written == text {
        return Ok(());
    }
    let (n, (old, new)) = written
        .lines()
        .chain(std::iter::repeat(""))
        .zip(text.lines().chain(std::iter::repeat("")))
        .enumerate()
        .find(|(_, (a, b))| a != b)
        .unwrap_or((0, ("", "")));
    Err(format!(
        "{page} is not what the code says (line {}):\n  page: {old}\n  code: {new}\nRun `{BLESS}` and commit the page.",
        n + 1
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_page_of_flags_keys_and_variables_is_what_the_code_says() {
        let page = flags_page();
        for needle in [
            "### `--n-max`\n\nshort `-n`",
            "variable `VALVE_MEMORY_LIMIT`",
            "config key `memory_limit` (an app's, or the top level's)",
            "`reconnect_window`",
            "`allow_users`",
        ] {
            assert!(page.contains(needle), "{needle} in:\n{page}");
        }
        if let Err(e) = compare_or_bless("docs/src/reference/flags.md", &page) {
            panic!("{e}");
        }
    }

    #[test]
    fn the_reference_page_of_configuration_errors_is_what_the_code_says() {
        let examples = config_error_examples();
        let kinds: std::collections::BTreeSet<&str> = examples.iter().map(variant).collect();
        assert_eq!(kinds.len(), examples.len(), "one example of each ConfigError, none twice");
        if let Err(e) = compare_or_bless("docs/src/reference/config-errors.md", &config_errors_page()) {
            panic!("{e}");
        }
    }

    #[test]
    fn every_config_key_is_on_the_page() {
        let page = flags_page();
        for key in APP_KEYS.iter().chain(ACCESS_KEYS).chain(APP_ONLY).chain(SERVER_KEYS) {
            assert!(page.contains(&format!("`{key}`")), "{key} is missing from the reference page");
        }
    }
}
