//! Flags and environment variables in, a checked `Config` out. Only this module
//! knows about clap and `VALVE_*` variables; everything else reads plain data.
//!
//! Parsing is two steps, like ripgrep: `Args` is what the user typed, `Config`
//! is what valve will do, and `Args::into_config` says what is wrong with the
//! first before anything binds a port or starts R.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;

/// One port in front of a pool of R worker processes running a plumber API.
///
/// Each request goes to an idle worker; when all are busy it waits in a queue
/// and the pool grows up to --n-max, then shrinks back to --n-min once workers
/// sit unused for --max-age seconds.
#[derive(Parser, Debug)]
#[command(name = "valve", version, max_term_width = 100)]
pub struct Args {
    /// The app: a plumber file, or a directory holding entrypoint.R or plumber.R; or a Shiny app:
    /// a directory holding app.R (or ui.R and server.R), or an app.R file ending in shinyApp().
    #[arg(short = 'f', long = "file", env = "VALVE_FILE", default_value = "plumber.R")]
    pub file: PathBuf,

    /// Address to listen on.
    #[arg(long, env = "VALVE_HOST", default_value = "127.0.0.1")]
    pub host: String,

    /// Port to listen on (0 picks a free one and prints it).
    #[arg(short = 'p', long, env = "VALVE_PORT", default_value_t = 3000)]
    pub port: u16,

    /// Threads valve itself uses to move requests (tokio worker threads).
    #[arg(short = 'w', long, env = "VALVE_WORKERS", default_value_t = 3)]
    pub workers: usize,

    /// Most R worker processes to run at once.
    #[arg(short = 'n', long = "n-max", env = "VALVE_N_MAX", default_value_t = 3)]
    pub n_max: usize,

    /// R worker processes to keep running even when idle.
    #[arg(long = "n-min", env = "VALVE_N_MIN", default_value_t = 1)]
    pub n_min: usize,

    /// Seconds between checks for unused workers.
    #[arg(long = "check-unused", env = "VALVE_CHECK_UNUSED", default_value = "10", value_name = "SECONDS")]
    pub check_unused: String,

    /// Seconds a worker may sit unused before it is stopped (never below --n-min).
    #[arg(long = "max-age", env = "VALVE_MAX_AGE", default_value = "300", value_name = "SECONDS")]
    pub max_age: String,

    /// The R executable that runs workers.
    #[arg(long = "r-bin", env = "VALVE_R_BIN", default_value = "R", value_name = "PATH")]
    pub r_bin: PathBuf,

    /// Seconds a new worker may take to load the API and answer before it is given up on.
    #[arg(long = "start-timeout", env = "VALVE_START_TIMEOUT", default_value = "120", value_name = "SECONDS")]
    pub start_timeout: String,

    /// Seconds in-flight and queued requests get to finish on SIGTERM or SIGINT before workers are stopped.
    #[arg(long = "graceful-timeout", env = "VALVE_GRACEFUL_TIMEOUT", default_value = "30", value_name = "SECONDS")]
    pub graceful_timeout: String,

    /// Seconds a worker may take to answer a request before the client gets 504 and the worker is replaced (0: no limit).
    #[arg(long = "request-timeout", env = "VALVE_REQUEST_TIMEOUT", default_value = "300", value_name = "SECONDS")]
    pub request_timeout: String,

    /// Most requests waiting for a worker; more are answered 503 at once.
    #[arg(long = "queue-size", env = "VALVE_QUEUE_SIZE", default_value_t = 1000, value_name = "N")]
    pub queue_size: usize,

    /// Longest wait for a worker, in seconds, before the client gets 503.
    #[arg(long = "queue-timeout", env = "VALVE_QUEUE_TIMEOUT", default_value = "60", value_name = "SECONDS")]
    pub queue_timeout: String,

    /// Largest request body accepted (e.g. 512KB, 10MB, 1GB); larger ones get 413.
    #[arg(long = "max-body-size", env = "VALVE_MAX_BODY_SIZE", default_value = "100MB", value_name = "SIZE")]
    pub max_body_size: String,

    /// Replace a worker after about N requests (each worker gets up to 10% more, so they don't all restart together; 0: never).
    #[arg(long = "max-requests", env = "VALVE_MAX_REQUESTS", default_value_t = 0, value_name = "N")]
    pub max_requests: u64,

    /// Replace a worker after its current request once its memory (RSS) passes SIZE (e.g. 500MB).
    #[arg(long = "max-worker-memory", env = "VALVE_MAX_WORKER_MEMORY", value_name = "SIZE")]
    pub max_worker_memory: Option<String>,

    /// Load the API once in a parent R process and fork workers from it: workers share its
    /// memory and start in milliseconds. Per-worker set-up: options(valve.on_worker_start = function() ...).
    #[arg(long, env = "VALVE_PRELOAD")]
    pub preload: bool,

    /// Serve valve's own pages (/__valve__/healthz, readyz, metrics, status, the dashboard) on this
    /// separate HOST:PORT instead of the main port, e.g. when the main port faces the internet.
    #[arg(long = "admin-addr", env = "VALVE_ADMIN_ADDR", value_name = "HOST:PORT")]
    pub admin_addr: Option<String>,

    /// Turn off the access log (one line per request).
    #[arg(long = "no-access-log", env = "VALVE_NO_ACCESS_LOG")]
    pub no_access_log: bool,

    /// Log format: text for people, json for log collectors.
    #[arg(long = "log-format", env = "VALVE_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,

    /// Shiny: most sessions one worker holds; a new worker starts when all are full.
    #[arg(long = "max-sessions", env = "VALVE_MAX_SESSIONS", default_value_t = 20, value_name = "N")]
    pub max_sessions: usize,

    /// Seconds a client gets to send a request's headers before it is cut off.
    #[arg(long = "header-timeout", env = "VALVE_HEADER_TIMEOUT", default_value = "30", value_name = "SECONDS")]
    pub header_timeout: String,

    /// On SIGTERM, answer readiness 503 at once but keep serving for SECONDS before draining, so a
    /// load balancer (a Kubernetes Service) stops sending traffic first. Answers carry
    /// `Connection: close` meanwhile.
    #[arg(long = "drain-delay", env = "VALVE_DRAIN_DELAY", default_value = "0", value_name = "SECONDS")]
    pub drain_delay: String,

    /// Check a running valve and exit: 0 if URL answers 2xx within 5 s, 1 otherwise. Without URL,
    /// valve's own /__valve__/healthz at --host (127.0.0.1 for 0.0.0.0) and --port. For container
    /// HEALTHCHECKs: no curl needed.
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    pub healthcheck: Option<String>,
}

/// What valve serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum App {
    /// A plumber API file, run as `pr(file)` would.
    PlumberFile(PathBuf),
    /// A directory with `entrypoint.R` or `plumber.R`, run as `plumb(dir = )` would.
    PlumberDir(PathBuf),
    /// A Shiny app: a directory (`app.R`, or `ui.R` and `server.R`) or one file.
    Shiny(PathBuf),
}

impl App {
    /// The path handed to R (absolute).
    pub fn path(&self) -> &Path {
        match self {
            App::PlumberFile(p) | App::PlumberDir(p) | App::Shiny(p) => p,
        }
    }

    /// A label for logs and metrics: the app's folder, or its file's name without `.R`.
    pub fn name(&self) -> String {
        let p = match self {
            App::PlumberFile(p) => p.clone(),
            App::Shiny(p) if p.is_file() => p.parent().map(Path::to_path_buf).unwrap_or_else(|| p.clone()),
            App::PlumberDir(p) | App::Shiny(p) => p.clone(),
        };
        match self {
            App::PlumberFile(_) => p.file_stem(),
            _ => p.file_name(),
        }
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "app".to_string())
    }

    pub fn is_shiny(&self) -> bool {
        matches!(self, App::Shiny(_))
    }

    /// How the launcher runs it.
    pub fn kind(&self) -> &'static str {
        match self {
            App::PlumberFile(_) => "plumber-file",
            App::PlumberDir(_) => "plumber-dir",
            App::Shiny(_) => "shiny",
        }
    }

    /// The directory workers run in, so relative paths in the API work as without valve.
    pub fn workdir(&self) -> &Path {
        match self {
            App::PlumberFile(p) => p.parent().unwrap_or(Path::new("/")),
            App::Shiny(p) if p.is_file() => p.parent().unwrap_or(Path::new("/")),
            App::PlumberDir(d) | App::Shiny(d) => d,
        }
    }
}

/// A checked configuration: plain data, valid by construction.
#[derive(Clone, Debug)]
pub struct Config {
    pub app: App,
    pub host: String,
    pub port: u16,
    pub threads: usize,
    pub n_min: usize,
    pub n_max: usize,
    pub check_unused: Duration,
    pub max_age: Duration,
    pub r_bin: PathBuf,
    pub start_timeout: Duration,
    pub graceful_timeout: Duration,
    /// `None`: no limit.
    pub request_timeout: Option<Duration>,
    pub queue_size: usize,
    pub queue_timeout: Duration,
    pub max_body_size: u64,
    /// `None`: never recycle by count.
    pub max_requests: Option<u64>,
    /// `None`: never recycle by memory. In bytes.
    pub max_worker_memory: Option<u64>,
    pub header_timeout: Duration,
    pub drain_delay: Duration,
    pub preload: bool,
    pub admin_addr: Option<String>,
    pub access_log: bool,
    pub log_json: bool,
    pub max_sessions: usize,
}

/// Why a configuration was refused. Each message names the value and what to try.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("API file not found: {0} (pass the plumber file or its directory with -f/--file)")]
    NotFound(String),
    #[error("cannot read API file {path}: {reason}")]
    Unreadable { path: String, reason: String },
    #[error("directory {0} holds no entrypoint.R, plumber.R, app.R, or ui.R with server.R (pass the app file itself with -f)")]
    EmptyDir(String),
    #[error("--preload runs plumber APIs only; {0} is a Shiny app (drop --preload)")]
    PreloadShiny(String),
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

fn seconds(flag: &'static str, value: &str, allow_zero: bool) -> Result<Duration, ConfigError> {
    let bad = || ConfigError::BadSeconds { flag, value: value.to_string() };
    let secs: f64 = value.trim().parse().map_err(|_| bad())?;
    if !secs.is_finite() || secs < 0.0 || (!allow_zero && secs == 0.0) || secs > 1e9 {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Resolves `-f` to an absolute file or directory and checks R can read it.
fn resolve_app(path: &Path) -> Result<App, ConfigError> {
    let shown = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => ConfigError::NotFound(shown.clone()),
        _ => ConfigError::Unreadable { path: shown.clone(), reason: e.to_string() },
    })?;
    let abs = std::fs::canonicalize(path)
        .map_err(|e| ConfigError::Unreadable { path: shown.clone(), reason: e.to_string() })?;
    let (app, file) = if meta.is_dir() {
        let found = |name: &str| Some(abs.join(name)).filter(|p| p.is_file());
        if let Some(file) = found("entrypoint.R").or_else(|| found("plumber.R")) {
            (App::PlumberDir(abs), file)
        } else if let Some(file) = found("app.R").or_else(|| found("server.R").filter(|_| found("ui.R").is_some())) {
            (App::Shiny(abs), file)
        } else {
            return Err(ConfigError::EmptyDir(shown));
        }
    } else if is_shiny_file(&abs) {
        (App::Shiny(abs.clone()), abs)
    } else {
        (App::PlumberFile(abs.clone()), abs)
    };
    std::fs::File::open(&file).map_err(|e| ConfigError::Unreadable {
        path: file.display().to_string(),
        reason: match e.kind() {
            std::io::ErrorKind::PermissionDenied => "permission denied".into(),
            _ => e.to_string(),
        },
    })?;
    Ok(app)
}

/// A single file is a Shiny app when it calls `shinyApp()` and has no plumber
/// annotations (`#* @get` and friends).
fn is_shiny_file(path: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(path) else { return false };
    let plumber = text.lines().any(|l| {
        let l = l.trim_start();
        (l.starts_with("#*") || l.starts_with("#'")) && l.contains('@')
    });
    !plumber && text.contains("shinyApp(")
}

impl Args {
    /// With `--healthcheck`: the URL to check.
    pub fn healthcheck_url(&self) -> Option<String> {
        let given = self.healthcheck.as_deref()?;
        if !given.is_empty() {
            return Some(given.to_string());
        }
        let host = match self.host.as_str() {
            "0.0.0.0" | "" => "127.0.0.1",
            "::" => "[::1]",
            h if h.contains(':') && !h.starts_with('[') => return Some(format!("http://[{h}]:{}/__valve__/healthz", self.port)),
            h => h,
        };
        Some(format!("http://{host}:{}/__valve__/healthz", self.port))
    }

    pub fn into_config(self) -> Result<Config, ConfigError> {
        if self.n_max == 0 {
            return Err(ConfigError::ZeroMax);
        }
        if self.n_min > self.n_max {
            return Err(ConfigError::MinAboveMax { n_min: self.n_min, n_max: self.n_max });
        }
        if self.workers == 0 {
            return Err(ConfigError::ZeroThreads);
        }
        if self.queue_size == 0 {
            return Err(ConfigError::ZeroQueue);
        }
        if self.max_sessions == 0 {
            return Err(ConfigError::ZeroSessions);
        }
        let request_timeout = seconds("--request-timeout", &self.request_timeout, true)?;
        Ok(Config {
            check_unused: seconds("--check-unused", &self.check_unused, false)?,
            max_age: seconds("--max-age", &self.max_age, true)?,
            start_timeout: seconds("--start-timeout", &self.start_timeout, false)?,
            graceful_timeout: seconds("--graceful-timeout", &self.graceful_timeout, true)?,
            request_timeout: (!request_timeout.is_zero()).then_some(request_timeout),
            queue_size: self.queue_size,
            queue_timeout: seconds("--queue-timeout", &self.queue_timeout, false)?,
            max_body_size: parse_size("--max-body-size", &self.max_body_size)?,
            max_requests: (self.max_requests > 0).then_some(self.max_requests),
            max_worker_memory: self
                .max_worker_memory
                .as_deref()
                .map(|v| parse_size("--max-worker-memory", v))
                .transpose()?,
            header_timeout: seconds("--header-timeout", &self.header_timeout, false)?,
            drain_delay: seconds("--drain-delay", &self.drain_delay, true)?,
            preload: self.preload,
            admin_addr: self.admin_addr,
            access_log: !self.no_access_log,
            log_json: self.log_format == "json",
            max_sessions: self.max_sessions,
            app: match resolve_app(&self.file)? {
                App::Shiny(p) if self.preload => return Err(ConfigError::PreloadShiny(p.display().to_string())),
                app => app,
            },
            host: self.host,
            port: self.port,
            threads: self.workers,
            n_min: self.n_min,
            n_max: self.n_max,
            r_bin: self.r_bin,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Args {
        let mut argv = vec!["valve"];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv).expect("flags parse")
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
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("plumber.R");
        std::fs::write(&f, "").unwrap();
        let err = args(&["-f", f.to_str().unwrap(), "--n-min", "5", "-n", "2"]).into_config().unwrap_err();
        assert_eq!(err.to_string(), "--n-min 5 is above --n-max 2: raise --n-max or lower --n-min");
    }

    #[test]
    fn resolves_directories_like_plumb_dir() {
        let dir = tempfile::tempdir().unwrap();
        let err = args(&["-f", dir.path().to_str().unwrap()]).into_config().unwrap_err();
        assert!(matches!(err, ConfigError::EmptyDir(_)));
        std::fs::write(dir.path().join("plumber.R"), "").unwrap();
        let c = args(&["-f", dir.path().to_str().unwrap()]).into_config().unwrap();
        assert!(matches!(c.app, App::PlumberDir(_)));
        assert_eq!(c.app.workdir(), std::fs::canonicalize(dir.path()).unwrap());
    }

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
    fn zero_disables_request_timeout_and_recycling() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("plumber.R");
        std::fs::write(&f, "").unwrap();
        let c = args(&["-f", f.to_str().unwrap(), "--request-timeout", "0"]).into_config().unwrap();
        assert_eq!((c.request_timeout, c.max_requests, c.max_worker_memory), (None, None, None));
        assert_eq!(c.max_body_size, 100 << 20);
    }

    #[test]
    fn missing_file_and_bad_seconds_say_what_and_where() {
        let err = args(&["-f", "/nonexistent/api.R"]).into_config().unwrap_err();
        assert!(err.to_string().contains("/nonexistent/api.R"));
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("plumber.R");
        std::fs::write(&f, "").unwrap();
        let err = args(&["-f", f.to_str().unwrap(), "--max-age", "soon"]).into_config().unwrap_err();
        assert!(err.to_string().contains("--max-age \"soon\""));
        let c = args(&["-f", f.to_str().unwrap(), "--check-unused", "0.5"]).into_config().unwrap();
        assert_eq!(c.check_unused, Duration::from_millis(500));
    }
}
