//! Flags, environment variables (and, for several apps, a config file) in; a
//! checked `Config` out. Only this module knows about clap and `VALVE_*`
//! variables; everything else reads plain data.
//!
//! Parsing is two steps, like ripgrep: `flags::Args` is what the user typed,
//! `Config` is what valve will do, and the conversion says what is wrong with
//! the first before anything binds a port or starts R.

mod discover;
mod file;
mod flags;

use std::path::PathBuf;
use std::time::Duration;

pub use discover::AppSource;
pub use file::{normal_prefix, valid_name, Problem, Problems};
pub use flags::Args;

/// A checked configuration: plain data, valid by construction.
#[derive(Clone, Debug)]
pub struct Config {
    pub server: Server,
    /// The apps to serve (one for `-f`), in the order given.
    pub apps: Vec<AppConfig>,
    /// Things worth saying at start-up (folders `--site` skipped).
    pub notes: Vec<String>,
}

/// Where the configuration comes from, so that a reload reads it again.
#[derive(Clone, Debug)]
pub enum Source {
    /// `-f`: one app, from flags (a reload restarts its workers).
    Flags(Args),
    /// `--config FILE`.
    File(PathBuf, Args),
    /// `--site DIR`.
    Site(PathBuf, Args),
}

impl Source {
    /// Reads the configuration (again).
    pub fn load(&self) -> Result<Config, LoadError> {
        match self {
            Source::Flags(args) => args.single().map_err(LoadError::Flags),
            Source::File(path, args) => file::load(path, args).map_err(LoadError::File),
            Source::Site(dir, args) => args.site(dir).map_err(LoadError::Flags),
        }
    }

    /// What a reload reads, for messages.
    pub fn describe(&self) -> String {
        match self {
            Source::Flags(args) => format!("-f {}", args.file.display()),
            Source::File(path, _) => path.display().to_string(),
            Source::Site(dir, _) => format!("--site {}", dir.display()),
        }
    }
}

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0}")]
    Flags(#[from] ConfigError),
    #[error("{0}")]
    File(Problems),
}

/// `off` (or empty) turns the admin listener off.
fn admin_addr(value: &str) -> Option<String> {
    match value.trim() {
        "off" | "none" | "" => None,
        addr => Some(addr.to_string()),
    }
}

/// What is valve-wide: the listener, the drain, logging, the worker budget.
#[derive(Clone, Debug)]
pub struct Server {
    pub host: String,
    pub port: u16,
    /// Tokio worker threads.
    pub threads: usize,
    pub graceful_timeout: Duration,
    pub header_timeout: Duration,
    pub drain_delay: Duration,
    /// How often apps look for unused workers (and sample worker memory).
    pub check_unused: Duration,
    /// The admin listener (`None`: none).
    pub admin_addr: Option<String>,
    /// Serve metrics, status and the dashboard on the main port too.
    pub admin_on_main: bool,
    pub access_log: bool,
    pub log_json: bool,
    /// The most R workers across every app.
    pub max_workers: usize,
    /// How plumber workers are reached (Shiny workers always use httpuv).
    pub worker_transport: Transport,
}

/// How valve reaches a plumber worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// valve's own protocol: one frame per request on a loopback connection
    /// the worker opened; no HTTP server in the worker.
    Frames,
    /// An httpuv server on the worker's private Unix socket.
    Httpuv,
}

/// One app: what it is, where it is mounted, and its pool's rules.
#[derive(Clone, Debug, PartialEq)]
pub struct AppConfig {
    /// A label in logs, metrics and the dashboard.
    pub name: String,
    /// The URL prefix it is mounted at: `/` or `/name` (no trailing slash).
    pub prefix: String,
    /// Serve it only for requests to this Host (and the prefix).
    pub hostname: Option<String>,
    pub source: AppSource,
    pub n_min: usize,
    pub n_max: usize,
    pub max_age: Duration,
    pub preload: bool,
    /// `None`: no limit.
    pub request_timeout: Option<Duration>,
    pub queue_size: usize,
    pub queue_timeout: Duration,
    pub max_body_size: u64,
    /// `None`: never recycle by count.
    pub max_requests: Option<u64>,
    /// `None`: never recycle by memory. In bytes.
    pub max_worker_memory: Option<u64>,
    pub max_sessions: usize,
    /// Shiny: the share of a CPU that makes a worker busy for placement (0: never).
    pub busy_threshold: f64,
    pub r_bin: PathBuf,
    pub start_timeout: Duration,
    /// Extra environment variables for the app's workers.
    pub env: Vec<(String, String)>,
}

impl AppConfig {
    pub fn is_shiny(&self) -> bool {
        self.source.is_shiny()
    }
}

/// Why a configuration was refused. Each message names the value and what to try.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("app not found: {path} (pass a plumber file, a folder holding entrypoint.R or plumber.R, or a Shiny app folder with {what})")]
    NotFound { path: String, what: String },
    #[error("cannot read {path}: {reason}")]
    Unreadable { path: String, reason: String },
    #[error("folder {0} holds no entrypoint.R, plumber.R, server.R or app.R (pass the app file itself with -f)")]
    EmptyDir(String),
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
    #[error("--site {0} holds no app folders (each sub-folder with plumber.R, entrypoint.R, app.R or server.R is served at /<folder>/)")]
    EmptySite(String),
    #[error(
        "--n-min adds up to {n_min} over the apps, above --max-workers {max}: raise --max-workers or lower --n-min"
    )]
    MinAboveBudget { n_min: usize, max: usize },
    #[error("use one of -f/--file, --config and --site, not several")]
    Several,
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
}
