//! A config file of several apps, in TOML: server settings and per-app
//! defaults at the top level (the flags' names in snake_case), one `[[app]]`
//! table per app. Every problem found is reported with the file, line and
//! column, all of them at once, so `valve --check` lists everything to fix.
//!
//! Precedence for an app's setting: its own `[[app]]` key, then a flag or
//! `VALVE_*` variable given explicitly, then the file's top-level key, then
//! the flag's default. Server settings: flag, then file, then default.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use toml::Spanned;

use super::flags::Args;
use super::{discover, parse_seconds, parse_size, AppConfig, AppSource, Config, Server};

type Val = Spanned<toml::Value>;
type Table = BTreeMap<String, Val>;

/// Keys an `[[app]]` table may hold that also work at the top level, as defaults.
const APP_KEYS: &[&str] = &[
    "n_min",
    "n_max",
    "max_age",
    "preload",
    "request_timeout",
    "queue_size",
    "queue_timeout",
    "max_body_size",
    "max_requests",
    "max_worker_memory",
    "max_sessions",
    "busy_threshold",
    "r_bin",
    "start_timeout",
    "env",
];
/// Keys only an `[[app]]` table holds.
const APP_ONLY: &[&str] = &["name", "path", "file", "hostname"];
/// Server settings (top level only).
const SERVER_KEYS: &[&str] = &[
    "host",
    "port",
    "workers",
    "max_workers",
    "check_unused",
    "graceful_timeout",
    "header_timeout",
    "drain_delay",
    "admin_addr",
    "admin_on_main",
    "no_access_log",
    "log_format",
    "worker_transport",
];

/// One problem, where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// 1-based; 0 when the problem has no place in the file (a flag's value).
    pub line: usize,
    pub col: usize,
    pub message: String,
}

/// Everything wrong with one config file.
#[derive(Debug, Clone)]
pub struct Problems {
    pub file: PathBuf,
    pub list: Vec<Problem>,
}

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.list.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            match p.line {
                0 => write!(f, "{}: {}", self.file.display(), p.message)?,
                line => write!(f, "{}:{}:{}: {}", self.file.display(), line, p.col, p.message)?,
            }
        }
        Ok(())
    }
}

impl std::error::Error for Problems {}

#[derive(serde::Deserialize)]
struct Apps {
    #[serde(default)]
    app: Vec<Spanned<Table>>,
}

/// Reads, checks and resolves a config file against the flags.
pub fn load(path: &Path, args: &Args) -> Result<Config, Problems> {
    let fail =
        |line, col, message: String| Problems { file: path.to_path_buf(), list: vec![Problem { line, col, message }] };
    let text = std::fs::read_to_string(path).map_err(|e| {
        fail(0, 0, format!("cannot read the config file: {e} (check the path given to --config / VALVE_CONFIG)"))
    })?;
    let base = std::fs::canonicalize(path).ok().and_then(|p| p.parent().map(Path::to_path_buf)).unwrap_or_default();
    let parse_error = |e: toml::de::Error| {
        let (line, col) = e.span().map(|s| line_col(&text, s.start)).unwrap_or((0, 0));
        fail(line, col, e.message().trim().to_string())
    };
    let top: Table = toml::from_str(&text).map_err(parse_error)?;
    let apps: Apps = toml::from_str(&text).map_err(parse_error)?;
    let mut cx = Cx { text: &text, args, top: &top, problems: Vec::new() };
    let config = cx.resolve(&apps.app, &base);
    match (config, cx.problems.is_empty()) {
        (Some(c), true) => Ok(c),
        _ => {
            let mut list = cx.problems;
            list.sort_by_key(|p| (p.line, p.col));
            list.dedup();
            Err(Problems { file: path.to_path_buf(), list })
        }
    }
}

/// 1-based line and column of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map(|l| l.chars().count()).unwrap_or(0) + 1;
    (line, col)
}

/// The resolution of one file: what it says, what the flags say, what is wrong.
struct Cx<'a> {
    text: &'a str,
    args: &'a Args,
    top: &'a Table,
    problems: Vec<Problem>,
}

impl<'a> Cx<'a> {
    fn at(&mut self, span: std::ops::Range<usize>, message: String) {
        let (line, col) = line_col(self.text, span.start);
        self.problems.push(Problem { line, col, message });
    }

    /// Where `key` is written on the line of its value (else the value).
    fn key_span(&self, key: &str, value: std::ops::Range<usize>) -> std::ops::Range<usize> {
        let line_start = self.text[..value.start.min(self.text.len())].rfind('\n').map(|i| i + 1).unwrap_or(0);
        match self.text[line_start..value.start.min(self.text.len())].find(key) {
            Some(i) => line_start + i..line_start + i + key.len(),
            None => value,
        }
    }

    fn nowhere(&mut self, message: String) {
        self.problems.push(Problem { line: 0, col: 0, message });
    }

    /// The file's value for `key` when it wins over the flag: the app's own,
    /// else (unless the flag was given) the top level's.
    fn pick<'v>(&self, key: &str, app: Option<&'v Table>) -> Option<&'v Val>
    where
        'a: 'v,
    {
        if let Some(v) = app.and_then(|t| t.get(key)) {
            return Some(v);
        }
        if self.args.explicit.contains(key) {
            return None;
        }
        self.top.get(key)
    }

    fn unknown_keys(&mut self, table: &Table, allowed: &[&[&str]], place: &str) {
        for (key, v) in table {
            if allowed.iter().any(|set| set.contains(&key.as_str())) {
                continue;
            }
            let mut known: Vec<&str> = allowed.iter().flat_map(|s| s.iter().copied()).collect();
            known.sort();
            let hint = known
                .iter()
                .map(|k| (edit_distance(k, key), *k))
                .filter(|(d, _)| *d <= 2)
                .min()
                .map(|(_, k)| format!(" (did you mean `{k}`?)"))
                .unwrap_or_default();
            let message = format!("unknown key `{key}` {place}{hint}; known keys: {}", known.join(", "));
            self.at(self.key_span(key, v.span()), message);
        }
    }

    fn resolve(&mut self, apps: &[Spanned<Table>], base: &Path) -> Option<Config> {
        let top = self.top;
        self.unknown_keys(top, &[SERVER_KEYS, APP_KEYS, &["app"]], "at the top level");
        if let Some(v) = top.get("app") {
            if !matches!(v.get_ref(), toml::Value::Array(_)) {
                self.at(v.span(), "`app` must be a list of tables: write each app as an [[app]] table".into());
            }
        }
        if apps.is_empty() {
            self.nowhere("no apps: add an [[app]] table with at least `file` (and `path` for its URL prefix)".into());
        }
        let mut resolved: Vec<(AppConfig, std::ops::Range<usize>)> = Vec::new();
        for (i, app) in apps.iter().enumerate() {
            self.unknown_keys(app.get_ref(), &[APP_KEYS, APP_ONLY], "in [[app]]");
            if let Some(a) = self.app(i, app, base, apps.len()) {
                resolved.push((a, app.span()));
            }
        }
        // Names and mount points are each used once.
        for (i, (a, span)) in resolved.iter().enumerate() {
            if let Some((_, first)) = resolved[..i].iter().find(|(b, _)| b.name == a.name) {
                let (line, _) = line_col(self.text, first.start);
                let message = format!(
                    "app name `{}` is already used by the app at line {line}: give each app its own `name`",
                    a.name
                );
                self.at(span.clone(), message);
            }
            if let Some((b, first)) =
                resolved[..i].iter().find(|(b, _)| b.prefix == a.prefix && b.hostname == a.hostname)
            {
                let (line, _) = line_col(self.text, first.start);
                let message = format!(
                    "path `{}` is already served by app `{}` (line {line}): give each app its own `path`{}",
                    a.prefix,
                    b.name,
                    if a.hostname.is_some() { " or `hostname`" } else { "" }
                );
                self.at(span.clone(), message);
            }
        }
        let apps: Vec<AppConfig> = resolved.into_iter().map(|(a, _)| a).collect();
        let server = self.server(&apps)?;
        let n_min: usize = apps.iter().map(|a| a.n_min).sum();
        if n_min > server.max_workers {
            let message = format!(
                "the apps' n_min add up to {n_min}, above max_workers = {}: raise max_workers or lower some n_min",
                server.max_workers
            );
            match top.get("max_workers") {
                Some(v) => self.at(v.span(), message),
                None => self.nowhere(message),
            }
        }
        Some(Config { server, apps, notes: Vec::new() })
    }

    fn server(&mut self, apps: &[AppConfig]) -> Option<Server> {
        let a = self.args;
        let host = self.string("host", None, &a.host)?;
        let port = self.count("port", None, a.port as u64, 0, u16::MAX as u64)? as u16;
        let threads = self.count("workers", None, a.workers as u64, 1, 1024)? as usize;
        let default_max = a.max_workers.unwrap_or_else(|| apps.iter().map(|x| x.n_max).sum::<usize>().max(1));
        let max_workers = self.count("max_workers", None, default_max as u64, 1, 100_000)? as usize;
        let admin_addr = self.string("admin_addr", None, &a.admin_addr)?;
        let log_format = self.string("log_format", None, &a.log_format)?;
        let transport = self.string("worker_transport", None, &a.worker_transport)?;
        if !matches!(transport.as_str(), "frames" | "httpuv") {
            let v = self.pick("worker_transport", None).map(|v| v.span()).unwrap_or(0..0);
            self.at(v, format!("worker_transport = {transport:?}: use \"frames\" or \"httpuv\""));
        }
        if !matches!(log_format.as_str(), "text" | "json") {
            let v = self.pick("log_format", None).map(|v| v.span()).unwrap_or(0..0);
            self.at(v, format!("log_format = {log_format:?}: use \"text\" or \"json\""));
        }
        Some(Server {
            host,
            port,
            threads,
            graceful_timeout: self.seconds("graceful_timeout", None, &a.graceful_timeout, true)?,
            header_timeout: self.seconds("header_timeout", None, &a.header_timeout, false)?,
            drain_delay: self.seconds("drain_delay", None, &a.drain_delay, true)?,
            check_unused: self.seconds("check_unused", None, &a.check_unused, false)?,
            admin_addr: super::admin_addr(&admin_addr),
            admin_on_main: self.boolean("admin_on_main", None, a.admin_on_main)?,
            access_log: !self.boolean("no_access_log", None, a.no_access_log)?,
            log_json: log_format == "json",
            max_workers,
            worker_transport: super::flags::transport(&transport),
        })
    }

    fn app(&mut self, i: usize, app: &Spanned<Table>, base: &Path, count: usize) -> Option<AppConfig> {
        let t = Some(app.get_ref());
        let a = self.args;
        let ordinal = i + 1;
        let source = match app.get_ref().get("file") {
            None => {
                self.at(
                    app.span(),
                    format!(
                        "app {ordinal} has no `file`: name its plumber file or folder, or its Shiny app folder (relative to the config file's folder)"
                    ),
                );
                None
            }
            Some(v) => match v.get_ref().as_str() {
                None => {
                    self.at(v.span(), "`file` must be a string (a path)".into());
                    None
                }
                Some(file) => match discover::resolve(&base.join(file), "`file`") {
                    Ok(s) => Some(s),
                    Err(e) => {
                        self.at(v.span(), format!("file = {file:?}: {e} (paths are relative to {})", base.display()));
                        None
                    }
                },
            },
        };
        let name = match app.get_ref().get("name") {
            Some(v) => match v.get_ref().as_str() {
                Some(n) if valid_name(n) => Some(n.to_string()),
                _ => {
                    self.at(v.span(), "`name` must be a non-empty string of letters, digits, `-`, `_` or `.`".into());
                    None
                }
            },
            None => source.as_ref().map(|s| s.default_name()),
        };
        let prefix = match app.get_ref().get("path") {
            Some(v) => match v.get_ref().as_str().map(normal_prefix) {
                Some(Ok(p)) => Some(p),
                Some(Err(why)) => {
                    self.at(v.span(), format!("path = {}: {why}", v.get_ref()));
                    None
                }
                None => {
                    self.at(v.span(), "`path` must be a string such as \"/sales\" (or \"/\")".into());
                    None
                }
            },
            None if count == 1 => Some("/".to_string()),
            None => name.as_ref().map(|n| format!("/{n}")),
        };
        let hostname = match app.get_ref().get("hostname") {
            None => None,
            Some(v) => match v.get_ref().as_str() {
                Some(h) if valid_hostname(h) => Some(h.to_ascii_lowercase()),
                _ => {
                    self.at(
                        v.span(),
                        "`hostname` must be a host name such as \"api.example.com\" (no scheme, port or path)".into(),
                    );
                    None
                }
            },
        };
        // Every setting is checked (no early return), so that all problems are listed.
        let n_min = self.count("n_min", t, a.n_min as u64, 0, 100_000).map(|n| n as usize);
        let n_max = self.count("n_max", t, a.n_max as u64, 1, 100_000).map(|n| n as usize);
        if let (Some(lo), Some(hi)) = (n_min, n_max) {
            if lo > hi {
                let span = self.pick("n_min", t).or(self.pick("n_max", t)).map(|v| v.span()).unwrap_or(app.span());
                self.at(span, format!("n_min = {lo} is above n_max = {hi}: raise n_max or lower n_min"));
            }
        }
        let request_timeout = self.seconds("request_timeout", t, &a.request_timeout, true);
        let max_requests = self.count("max_requests", t, a.max_requests, 0, u64::MAX);
        let max_worker_memory = match self.pick("max_worker_memory", t) {
            Some(v) => self.size("max_worker_memory", v).map(Some),
            None => match &a.max_worker_memory {
                Some(s) => self.flag_size("--max-worker-memory", s).map(Some),
                None => Some(None),
            },
        };
        let max_body_size = match self.pick("max_body_size", t) {
            Some(v) => self.size("max_body_size", v),
            None => self.flag_size("--max-body-size", &a.max_body_size),
        };
        let preload = self.boolean("preload", t, a.preload);
        let r_bin = self.string("r_bin", t, &a.r_bin.to_string_lossy()).map(PathBuf::from);
        let env = self.env(t);
        let max_sessions = self.count("max_sessions", t, a.max_sessions as u64, 1, 100_000).map(|n| n as usize);
        let busy_threshold = self.count("busy_threshold", t, a.busy_threshold as u64, 0, 100).map(|n| n as f64 / 100.0);
        let queue_size = self.count("queue_size", t, a.queue_size as u64, 1, u32::MAX as u64).map(|n| n as usize);
        let max_age = self.seconds("max_age", t, &a.max_age, true);
        let queue_timeout = self.seconds("queue_timeout", t, &a.queue_timeout, false);
        let start_timeout = self.seconds("start_timeout", t, &a.start_timeout, false);
        Some(AppConfig {
            name: name?,
            prefix: prefix?,
            hostname,
            n_min: n_min?,
            n_max: n_max?,
            max_age: max_age?,
            preload: preload?,
            request_timeout: request_timeout.map(|d| (!d.is_zero()).then_some(d))?,
            queue_size: queue_size?,
            queue_timeout: queue_timeout?,
            max_body_size: max_body_size?,
            max_requests: max_requests.map(|n| (n > 0).then_some(n))?,
            max_worker_memory: max_worker_memory?,
            max_sessions: max_sessions?,
            busy_threshold: busy_threshold?,
            r_bin: r_bin?,
            start_timeout: start_timeout?,
            env: env?,
            source: source?,
        })
    }

    fn seconds(&mut self, key: &str, app: Option<&Table>, flag: &str, allow_zero: bool) -> Option<Duration> {
        let Some(v) = self.pick(key, app) else {
            return match parse_seconds(flag_name(key), flag, allow_zero) {
                Ok(d) => Some(d),
                Err(e) => {
                    self.nowhere(e.to_string());
                    None
                }
            };
        };
        let shown = match v.get_ref() {
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::String(s) => s.clone(),
            _ => String::new(),
        };
        match parse_seconds(flag_name(key), &shown, allow_zero) {
            Ok(d) => Some(d),
            Err(_) => {
                let least = if allow_zero { "0 or more" } else { "above 0" };
                self.at(
                    v.span(),
                    format!("{key} = {}: not a number of seconds {least} (try {key} = 10 or {key} = 0.5)", v.get_ref()),
                );
                None
            }
        }
    }

    fn size(&mut self, key: &str, v: &Val) -> Option<u64> {
        let parsed = match v.get_ref() {
            toml::Value::Integer(i) if *i >= 1 => Ok(*i as u64),
            toml::Value::String(s) => parse_size(flag_name(key), s).map_err(|_| ()),
            _ => Err(()),
        };
        match parsed {
            Ok(n) => Some(n),
            Err(()) => {
                self.at(
                    v.span(),
                    format!("{key} = {}: not a size (try {key} = \"10MB\", \"512KB\" or \"1GB\")", v.get_ref()),
                );
                None
            }
        }
    }

    fn flag_size(&mut self, flag: &'static str, value: &str) -> Option<u64> {
        match parse_size(flag, value) {
            Ok(n) => Some(n),
            Err(e) => {
                self.nowhere(e.to_string());
                None
            }
        }
    }

    fn count(&mut self, key: &str, app: Option<&Table>, flag: u64, min: u64, max: u64) -> Option<u64> {
        let Some(v) = self.pick(key, app) else { return Some(flag) };
        match v.get_ref() {
            toml::Value::Integer(i) if *i >= 0 && (*i as u64) >= min && (*i as u64) <= max => Some(*i as u64),
            other => {
                let range =
                    if max >= u32::MAX as u64 { format!("{min} or more") } else { format!("from {min} to {max}") };
                self.at(v.span(), format!("{key} = {other}: must be a whole number {range}"));
                None
            }
        }
    }

    fn boolean(&mut self, key: &str, app: Option<&Table>, flag: bool) -> Option<bool> {
        let Some(v) = self.pick(key, app) else { return Some(flag) };
        match v.get_ref() {
            toml::Value::Boolean(b) => Some(*b),
            other => {
                self.at(v.span(), format!("{key} = {other}: must be true or false"));
                None
            }
        }
    }

    fn string(&mut self, key: &str, app: Option<&Table>, flag: &str) -> Option<String> {
        let Some(v) = self.pick(key, app) else { return Some(flag.to_string()) };
        match v.get_ref() {
            toml::Value::String(s) if !s.is_empty() => Some(s.clone()),
            other => {
                self.at(v.span(), format!("{key} = {other}: must be a non-empty string"));
                None
            }
        }
    }

    /// The workers' environment: the top level's `env`, then the app's (its keys win).
    fn env(&mut self, app: Option<&Table>) -> Option<Vec<(String, String)>> {
        let mut out: BTreeMap<String, String> = BTreeMap::new();
        let mut ok = true;
        for v in [self.top.get("env"), app.and_then(|t| t.get("env"))].into_iter().flatten() {
            let toml::Value::Table(t) = v.get_ref() else {
                self.at(v.span(), "`env` must be a table of strings, e.g. env = { DB_HOST = \"db\" }".into());
                ok = false;
                continue;
            };
            for (k, val) in t {
                let good_key = !k.is_empty() && !k.contains(['=', '\0']);
                match val.as_str() {
                    Some(s) if good_key && !s.contains('\0') => {
                        out.insert(k.clone(), s.to_string());
                    }
                    _ => {
                        self.at(
                            v.span(),
                            format!("env: {k} = {val}: names and values must be strings (names without `=`)"),
                        );
                        ok = false;
                    }
                }
            }
        }
        ok.then(|| out.into_iter().collect())
    }
}

/// The flag a key stands for, for messages about flag values.
fn flag_name(key: &str) -> &'static str {
    match key {
        "max_age" => "--max-age",
        "request_timeout" => "--request-timeout",
        "queue_timeout" => "--queue-timeout",
        "start_timeout" => "--start-timeout",
        "graceful_timeout" => "--graceful-timeout",
        "header_timeout" => "--header-timeout",
        "drain_delay" => "--drain-delay",
        "check_unused" => "--check-unused",
        "max_body_size" => "--max-body-size",
        "max_worker_memory" => "--max-worker-memory",
        _ => "a setting",
    }
}

/// An app's label: used in logs, metric labels and URLs of `--site`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 100 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

fn valid_hostname(h: &str) -> bool {
    !h.is_empty() && h.len() <= 253 && h.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.".contains(&b))
}

/// `"/sales/"` → `"/sales"`; `"/"` stays. Refuses what could not be a URL prefix.
pub fn normal_prefix(p: &str) -> Result<String, String> {
    if !p.starts_with('/') {
        return Err("must start with `/` (such as \"/sales\", or \"/\" for the root)".into());
    }
    if p.contains(['?', '#', ' ', '\\', '%']) || p.contains("//") || p.split('/').any(|s| s == "." || s == "..") {
        return Err("must be a plain URL path (letters, digits, `-`, `_`, `.` and `/`)".into());
    }
    let trimmed = p.trim_end_matches('/');
    let prefix = if trimmed.is_empty() { "/".to_string() } else { trimmed.to_string() };
    if crate::admin::is_admin_path(&prefix) {
        return Err("/__valve__ is valve's own; pick another path".into());
    }
    Ok(prefix)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// A folder of apps (`--site DIR`): each sub-folder holding a plumber API or a
/// Shiny app, served at `/<folder>` with the flags' settings. Folders that
/// hold no app, hidden ones and names that are not plain URL segments are
/// skipped (and said so in `notes`).
pub fn site(
    dir: &Path,
    template: impl Fn(AppSource, String, String) -> Result<AppConfig, super::ConfigError>,
) -> Result<(Vec<AppConfig>, Vec<String>), super::ConfigError> {
    let entries = std::fs::read_dir(dir).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => super::ConfigError::NotFound {
            path: dir.display().to_string(),
            what: "--site: a folder whose sub-folders are apps".into(),
        },
        _ => super::ConfigError::Unreadable { path: dir.display().to_string(), reason: e.to_string() },
    })?;
    let mut folders: Vec<PathBuf> = entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
    folders.sort();
    let mut apps = Vec::new();
    let mut notes = Vec::new();
    for folder in folders {
        let name = folder.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if name.starts_with('.') {
            continue;
        }
        if !valid_name(&name) {
            notes.push(format!(
                "--site: skipping {}: its name is not a plain URL segment (letters, digits, -, _, .)",
                folder.display()
            ));
            continue;
        }
        match discover::resolve(&folder, "--site") {
            Ok(source) => apps.push(template(source, name.clone(), format!("/{name}"))?),
            Err(super::ConfigError::EmptyDir(_)) => {
                notes.push(format!(
                    "--site: skipping {}: it holds no plumber.R, entrypoint.R, app.R or server.R",
                    folder.display()
                ));
            }
            Err(e) => return Err(e),
        }
    }
    if apps.is_empty() {
        return Err(super::ConfigError::EmptySite(dir.display().to_string()));
    }
    Ok((apps, notes))
}

#[cfg(test)]
mod tests {
    use super::*;
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
        assert_eq!(
            normal_prefix("//").unwrap_err(),
            "must be a plain URL path (letters, digits, `-`, `_`, `.` and `/`)"
        );
        assert!(normal_prefix("/__valve__/x").is_err());
        assert!(normal_prefix("/a/../b").is_err());
    }
}
