//! Why a configuration from flags was refused (`ConfigError`: each message
//! names the value and what to try), and the units flags are given in.

use std::time::Duration;

/// Why a configuration was refused. Each message names the value and what to try.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("app not found: {path} (pass a plumber file, a folder holding entrypoint.R or plumber.R, a Shiny app folder, an interactive R Markdown or Quarto document, a folder with _server.yml, or a folder with index.html for static content with {what})")]
    NotFound { path: String, what: String },
    #[error("cannot read {path}: {reason}")]
    Unreadable { path: String, reason: String },
    #[error("folder {0} holds no _server.yml, entrypoint.R, plumber.R, server.R, app.R, R Markdown or Quarto document, or index.html (pass the app file itself with -f)")]
    EmptyDir(String),
    #[error("static folder not found: {0} (name a folder that holds an index.html)")]
    NoStaticFolder(String),
    #[error(
        "{0} is a file, not a folder: `static` names a folder of files with an index.html (for an app, use `file`)"
    )]
    StaticNotAFolder(String),
    #[error("folder {0} holds no index.html: add one (valve serves it at the app's root) or name another folder")]
    NoIndex(String),
    #[error("{0} is an R Markdown document without a Shiny runtime, so there is nothing interactive to serve: add `runtime: shiny` (knitted per session) or `runtime: shiny_prerendered` (rendered once) to the YAML front matter between its `---` lines")]
    NotInteractive(String),
    #[error("cannot read the YAML front matter of {path}: {reason} (fix the lines between the `---` at its top; rmarkdown refuses it too)")]
    BadFrontMatter { path: String, reason: String },
    #[error("{0} is a Quarto document without `server: shiny`, so there is nothing interactive to serve: add `server: shiny` to the YAML front matter between its `---` lines (or render it with `quarto render` and serve the HTML as static content)")]
    QuartoNotInteractive(String),
    #[error("cannot read {path}: it is not YAML: {reason} (fix that line; the engine would refuse it too)")]
    BadServerYml { path: String, reason: String },
    #[error("{path} names no engine{found}: add a first line `engine: PKG` naming the R package that runs the app (such as `engine: plumber2`)")]
    NoEngine { path: String, found: String },
    #[error("--max-sessions must be at least 1")]
    ZeroSessions,
    #[error("--n-min {n_min} is above --n-max {n_max}: raise --n-max or lower --n-min")]
    MinAboveMax { n_min: usize, n_max: usize },
    #[error("--n-max must be at least 1")]
    ZeroMax,
    #[error("--workers must be at least 1")]
    ZeroThreads,
    #[error("{flag} {value:?} is not a number of seconds (try {flag} 10 or {flag} 0.5)")]
    BadSeconds { flag: &'static str, value: String },
    #[error("{flag} {value:?} is not a size (try {flag} 512KB, 10MB or 1GB)")]
    BadSize { flag: &'static str, value: String },
    #[error("--queue-size must be at least 1")]
    ZeroQueue,
    #[error("--site {0} holds no app folders (each sub-folder with _server.yml, plumber.R, entrypoint.R, app.R, server.R, an interactive index.Rmd or .qmd, or an index.html is served at /<folder>/)")]
    EmptySite(String),
    #[error(
        "--n-min adds up to {n_min} over the apps, above --max-workers {max}: raise --max-workers or lower --n-min"
    )]
    MinAboveBudget { n_min: usize, max: usize },
    #[error("use one of -f/--file, --config and --site, not several")]
    Several,
    #[error("{flag} {value:?} is out of range: use {range}")]
    OutOfRange { flag: &'static str, value: String, range: &'static str },
    #[error("--shiny-buffer-total {total} is below --shiny-session-buffer {session}: the total must hold at least one session's buffer (raise --shiny-buffer-total or lower --shiny-session-buffer)")]
    BufferTotalBelowSession { total: String, session: String },
    #[error("{flag}: {why}")]
    Access { flag: &'static str, why: String },
    /// Publishing's settings, keys file or published apps.
    #[error("{0}")]
    Published(String),
    /// Whom apps run as, or what their users can read (one line per problem).
    #[error("{0}")]
    Isolation(String),
    #[error("--usage-log {path}: {why}")]
    UsageLog { path: String, why: String },
    /// Where traces go: the message names the setting and its value.
    #[error("{0}")]
    Otlp(String),
    /// HTTPS: the message names the setting, its value and what to give.
    #[error("{0}")]
    Tls(String),
    /// Apps' packages (the cache, the builds, the repositories): the message
    /// names the setting, its value and what to write.
    #[error("{0}")]
    Packages(String),
}

/// `--shiny-reconnect-window`: the longest (a day).
pub(super) const MAX_RECONNECT_WINDOW: Duration = Duration::from_secs(86_400);

/// `--shiny-session-buffer`: the least.
pub(super) const MIN_SESSION_BUFFER: u64 = 64 << 10;

/// The range `--shiny-reconnect-window` allows, in messages.
pub(super) const RECONNECT_RANGE: &str = "0 to 86400 seconds (a day; 0 turns same-session reconnect off)";

/// The range `--shiny-session-buffer` allows, in messages.
pub(super) const SESSION_BUFFER_RANGE: &str = "64KiB or more (such as 16MiB)";

/// `--shiny-reconnect-window`: seconds, 0 (off) to a day.
pub(super) fn parse_reconnect_window(flag: &'static str, value: &str) -> Result<Duration, ConfigError> {
    let d = parse_seconds(flag, value, true)?;
    if d > MAX_RECONNECT_WINDOW {
        return Err(ConfigError::OutOfRange { flag, value: value.to_string(), range: RECONNECT_RANGE });
    }
    Ok(d)
}

/// `--shiny-session-buffer`: a size of at least 64KiB.
pub(super) fn parse_session_buffer(flag: &'static str, value: &str) -> Result<u64, ConfigError> {
    let n = parse_size(flag, value)?;
    if n < MIN_SESSION_BUFFER {
        return Err(ConfigError::OutOfRange { flag, value: value.to_string(), range: SESSION_BUFFER_RANGE });
    }
    Ok(n)
}

/// `--shiny-buffer-total` must hold at least one session's buffer.
pub(super) fn check_buffer_total(session: u64, total: u64) -> Result<(), ConfigError> {
    if total < session {
        return Err(ConfigError::BufferTotalBelowSession { total: show_size(total), session: show_size(session) });
    }
    Ok(())
}

/// Bytes as people write them: `16MiB`, `64KiB`, else `1000 bytes`.
pub(super) fn show_size(bytes: u64) -> String {
    for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    format!("{bytes} bytes")
}

/// Parses `512KB`, `10MB`, `1GB`, `1.5GB`, `2048` (bytes). Units are powers of
/// 1024, as R's `object.size` and most servers' limits count them.
pub fn parse_size(flag: &'static str, value: &str) -> Result<u64, ConfigError> {
    let bad = || ConfigError::BadSize { flag, value: value.to_string() };
    let v = value.trim().to_ascii_uppercase();
    let split = v.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(v.len());
    let (num, unit) = v.split_at(split);
    let num: f64 = num.parse().map_err(|_| bad())?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        "T" | "TB" | "TIB" => 1 << 40,
        _ => return Err(bad()),
    };
    let bytes = num * mult as f64;
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 {
        return Err(bad());
    }
    Ok(bytes as u64)
}

/// `--log-buffer`: a size, or 0 to keep no log.
pub(super) fn parse_log_buffer(flag: &'static str, value: &str) -> Result<u64, ConfigError> {
    if value.trim() == "0" {
        return Ok(0);
    }
    parse_size(flag, value)
}

/// Whether a `usage_log` path names a folder, shared by a site's valves:
/// one that exists, or a path ending in `/` (made at start).
pub fn usage_log_is_folder(path: &std::path::Path) -> bool {
    path.is_dir() || path.as_os_str().as_encoded_bytes().ends_with(b"/")
}

/// What is wrong with a usage log's path: it must name a file in a folder
/// that exists, or a folder (shared by the valves of a site: each writes a
/// file of its own there and reads the others').
pub(super) fn usage_log_problem(path: &std::path::Path) -> Option<String> {
    if path.is_dir() {
        return None;
    }
    // A folder to make (`usage/`): its parent must exist.
    let path = match path.to_str().and_then(|p| p.strip_suffix('/')) {
        Some(folder) => std::path::Path::new(folder),
        None => path,
    };
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    (!folder.is_dir()).then(|| {
        format!("its folder {} does not exist: create it, or name a file in a folder that does", folder.display())
    })
}

/// Parses a number of seconds (`10`, `0.5`); `allow_zero` where 0 means "none".
pub fn parse_seconds(flag: &'static str, value: &str, allow_zero: bool) -> Result<Duration, ConfigError> {
    let bad = || ConfigError::BadSeconds { flag, value: value.to_string() };
    let secs: f64 = value.trim().parse().map_err(|_| bad())?;
    if !secs.is_finite() || secs < 0.0 || (!allow_zero && secs == 0.0) || secs > 1e9 {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_like_people_write_them() {
        assert_eq!(parse_size("--max-body-size", "512KB").unwrap(), 512 * 1024);
        assert_eq!(parse_size("--max-body-size", "10MB").unwrap(), 10 << 20);
        assert_eq!(parse_size("--max-body-size", "1gb").unwrap(), 1 << 30);
        assert_eq!(parse_size("--max-body-size", "1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("--max-body-size", "2048").unwrap(), 2048);
        let err = parse_size("--max-body-size", "lots").unwrap_err();
        assert_eq!(err.to_string(), "--max-body-size \"lots\" is not a size (try --max-body-size 512KB, 10MB or 1GB)");
        assert!(parse_size("--max-body-size", "10XB").is_err());
        assert!(parse_size("--max-body-size", "0").is_err());
    }

    #[test]
    fn seconds_accept_fractions_and_zero_where_it_means_none() {
        assert_eq!(parse_seconds("--x", "0.5", false).unwrap(), Duration::from_millis(500));
        assert!(parse_seconds("--x", "0", false).is_err());
        assert_eq!(parse_seconds("--x", "0", true).unwrap(), Duration::ZERO);
        assert!(parse_seconds("--x", "-1", true).is_err());
        assert!(parse_seconds("--x", "soon", true).unwrap_err().to_string().contains("--x \"soon\""));
    }

    #[test]
    fn shiny_buffers_and_window_have_bounds() {
        assert_eq!(parse_reconnect_window("--w", "86400").unwrap(), MAX_RECONNECT_WINDOW);
        assert_eq!(parse_reconnect_window("--w", "0").unwrap(), Duration::ZERO);
        let err = parse_reconnect_window("--w", "86401").unwrap_err().to_string();
        assert_eq!(
            err,
            "--w \"86401\" is out of range: use 0 to 86400 seconds (a day; 0 turns same-session reconnect off)"
        );
        assert_eq!(parse_session_buffer("--b", "64KiB").unwrap(), 64 << 10);
        assert!(parse_session_buffer("--b", "63KiB").unwrap_err().to_string().contains("64KiB or more"));
        assert!(check_buffer_total(1 << 20, 1 << 20).is_ok());
        let err = check_buffer_total(16 << 20, 1000).unwrap_err().to_string();
        assert!(err.starts_with("--shiny-buffer-total 1000 bytes is below --shiny-session-buffer 16MiB"), "{err}");
        assert_eq!((show_size(256 << 20), show_size(3 << 9)), ("256MiB".to_string(), "1536 bytes".to_string()));
    }
}
