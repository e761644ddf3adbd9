//! A config file of several apps, in TOML: server settings and per-app
//! defaults at the top level (the flags' names in snake_case), one `[[app]]`
//! table per app. Every problem found is reported with the file, line and
//! column, all of them at once, so `valve --check` lists everything to fix.
//!
//! Precedence for an app's setting: its own `[[app]]` key, then a flag or
//! `VALVE_*` variable given explicitly, then the file's top-level key, then
//! the flag's default. Server settings: flag, then file, then default.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use toml::Spanned;

use super::discover;
use super::error::{
    parse_log_buffer, parse_reconnect_window, parse_seconds, parse_session_buffer, parse_size, show_size,
    usage_log_problem, ConfigError, MAX_RECONNECT_WINDOW, MIN_SESSION_BUFFER, RECONNECT_RANGE, SESSION_BUFFER_RANGE,
};
use super::flags::Args;
use super::flags::{parse_memory_limit, valves_own};
use super::keys::{edit_distance, flag_name, ACCESS_KEYS, APP_KEYS, APP_ONLY, SERVER_KEYS};
use super::model::{self, normal_prefix, valid_name, AppConfig, Config, Server};
use super::otel::{self, Given, Otlp};
use super::problems::{line_col, Problem, Problems};
use super::publish::{Candidate, Publishing};
use super::settle::{settle, Unfit};
use super::uid_store::Store;
use super::users::{parse_uid_range, Isolation, RunAs};

type Val = Spanned<toml::Value>;

type Table = BTreeMap<String, Val>;

#[derive(serde::Deserialize)]
struct Apps {
    #[serde(default)]
    app: Vec<Spanned<Table>>,
}

/// Reads, checks and resolves a config file against the flags.
pub fn load(path: &Path, args: &Args) -> Result<Config, Problems> {
    load_with(path, args, None)
}

/// As `load`, with one published app at `candidate`'s version.
pub(super) fn load_with(path: &Path, args: &Args, candidate: Option<&Candidate>) -> Result<Config, Problems> {
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
    let mut cx = Cx { text: &text, args, top: &top, problems: Vec::new(), candidate, base: base.clone() };
    let config = cx.resolve(&apps.app, &base, path);
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

/// The resolution of one file: what it says, what the flags say, what is wrong.
struct Cx<'a> {
    text: &'a str,
    args: &'a Args,
    top: &'a Table,
    problems: Vec<Problem>,
    /// A deployment's version to load for one published app.
    candidate: Option<&'a Candidate>,
    /// The config file's folder: relative paths start there.
    base: PathBuf,
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

    fn resolve(&mut self, apps: &[Spanned<Table>], base: &Path, file: &Path) -> Option<Config> {
        let top = self.top;
        self.unknown_keys(top, &[SERVER_KEYS, APP_KEYS, ACCESS_KEYS, &["app"]], "at the top level");
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
            self.unknown_keys(app.get_ref(), &[APP_KEYS, APP_ONLY, ACCESS_KEYS], "in [[app]]");
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
        let spans: Vec<std::ops::Range<usize>> = resolved.iter().map(|(_, s)| s.clone()).collect();
        let mut apps: Vec<AppConfig> = resolved.into_iter().map(|(a, _)| a).collect();
        let publish = self.publishing();
        if let Some(Some(p)) = &publish {
            self.published(p, &mut apps, base);
        }
        let private = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_path_buf());
        let server = self.server(&apps, base, private, publish?)?;
        let mut said = Default::default();
        if let Some(range) = self.uid_range() {
            let store = Store { dir: server.state_dir.clone(), record: !self.args.check };
            let unchecked = self.candidate.filter(|c| c.unchecked).map(|c| c.app.as_str());
            let settled = settle(&mut apps, &self.args.kernel, range, &store, unchecked);
            said = settled.said;
            for (i, why) in settled.unfit {
                // The app's own run_as, else the top level's; a folder problem at the app's table
                // (a published app has none: said without a place).
                match why {
                    Unfit::RunAs(m) => {
                        let place = i
                            .and_then(|i| spans.get(i))
                            .and_then(|span| app_tables_key(self.text, span, "run_as"))
                            .or_else(|| self.top.get("run_as").map(|v| v.span()));
                        match place {
                            Some(span) => self.at(span, m),
                            None => self.nowhere(m),
                        }
                    }
                    Unfit::Folder(m) | Unfit::Uid(m) => match i.and_then(|i| spans.get(i)) {
                        Some(span) => self.at(span.clone(), m),
                        None => self.nowhere(m),
                    },
                }
            }
        }
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
        Some(Config { server, apps, notes: Vec::new(), uids: said })
    }

    /// `preload_packages`: a list of R package names (or one comma-separated string).
    fn packages(&mut self) -> Option<Vec<String>> {
        let Some(v) = self.pick("preload_packages", None) else {
            let given = &self.args.preload_packages;
            return self.flag_result(
                super::flags::package_list(given)
                    .map_err(|why| ConfigError::Access { flag: "--preload-packages", why }),
            );
        };
        let joined = match v.get_ref() {
            toml::Value::String(s) => Some(s.clone()),
            toml::Value::Array(items) => {
                items.iter().map(|i| i.as_str().map(str::to_string)).collect::<Option<Vec<_>>>().map(|l| l.join(","))
            }
            _ => None,
        };
        match joined.map(|j| super::flags::package_list(&j)) {
            Some(Ok(list)) => Some(list),
            Some(Err(why)) => {
                self.at(v.span(), format!("preload_packages: {why}"));
                None
            }
            None => {
                self.at(
                    v.span(),
                    "preload_packages must be a list of R package names, such as [\"dplyr\", \"ggplot2\"]".into(),
                );
                None
            }
        }
    }

    /// `uid_range`: the file's, else the flag's.
    fn uid_range(&mut self) -> Option<(u32, u32)> {
        match self.pick("uid_range", None) {
            Some(v) => match v.get_ref().as_str().map(parse_uid_range) {
                Some(Ok(r)) => Some(r),
                Some(Err(why)) => {
                    self.at(v.span(), format!("uid_range = {why}"));
                    None
                }
                None => {
                    self.at(v.span(), "uid_range must be a string such as \"1900000000-1999999999\"".into());
                    None
                }
            },
            None => self.flag_result(
                parse_uid_range(&self.args.uid_range)
                    .map_err(|why| ConfigError::Isolation(format!("--uid-range {why}"))),
            ),
        }
    }

    fn server(
        &mut self,
        apps: &[AppConfig],
        base: &Path,
        config_file: PathBuf,
        publish: Option<Publishing>,
    ) -> Option<Server> {
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
        let (shiny_session_buffer, shiny_buffer_total) = self.shiny_buffers();
        let trust = self.trust();
        let state_dir = match self.pick("state_dir", None) {
            Some(v) => match v.get_ref().as_str() {
                Some(s) if Path::new(s).is_absolute() => Some(PathBuf::from(s)),
                _ => {
                    self.at(v.span(), "state_dir must be an absolute path such as \"/var/lib/valve\"".into());
                    None
                }
            },
            None => Some(a.state_dir()),
        };
        let state_dir = state_dir?;
        let usage_log = self.usage_log(base);
        let usage_anonymize = self.boolean("usage_anonymize", None, a.usage_anonymize);
        let warm_parent = self.boolean("warm_parent", None, a.warm_parent);
        let preload_packages = self.packages();
        let otlp = self.otlp();
        Some(Server {
            host,
            port,
            threads,
            graceful_timeout: self.seconds("graceful_timeout", None, &a.graceful_timeout, true)?,
            header_timeout: self.seconds("header_timeout", None, &a.header_timeout, false)?,
            drain_delay: self.seconds("drain_delay", None, &a.drain_delay, true)?,
            check_unused: self.seconds("check_unused", None, &a.check_unused, false)?,
            admin_addr: model::admin_addr(&admin_addr),
            admin_on_main: self.boolean("admin_on_main", None, a.admin_on_main)?,
            access_log: !self.boolean("no_access_log", None, a.no_access_log)?,
            log_json: log_format == "json",
            max_workers,
            worker_transport: model::transport(&transport),
            shiny_session_buffer: shiny_session_buffer?,
            shiny_buffer_total: shiny_buffer_total?,
            trust: trust?,
            publish,
            private_paths: vec![config_file, state_dir.clone()],
            state_dir,
            isolation: Isolation::from_kernel(&a.kernel),
            valve_uid: a.kernel.uid,
            usage_log: usage_log?,
            usage_anonymize: usage_anonymize?,
            warm_parent: warm_parent?,
            preload_packages: preload_packages?,
            otlp: otlp?,
        })
    }

    /// `otlp_endpoint` (a flag given explicitly wins), else OpenTelemetry's variables.
    fn otlp(&mut self) -> Option<Option<Otlp>> {
        let key = self.pick("otlp_endpoint", None);
        let given = match key.map(|v| v.get_ref()) {
            None => self.args.otlp_endpoint.as_deref().map(|v| (Given::Flag, v.to_string())),
            Some(toml::Value::String(s)) => Some((Given::Key, s.clone())),
            Some(other) => {
                let message = format!("otlp_endpoint = {other}: must be a string such as \"http://127.0.0.1:4318\"");
                self.at(key.map(|v| v.span()).unwrap_or(0..0), message);
                return None;
            }
        };
        match otel::otlp(given.as_ref().map(|(g, v)| (*g, v.as_str())), otel::environment) {
            Ok(otlp) => Some(otlp),
            Err(why) => {
                match key {
                    Some(v) => self.at(v.span(), why),
                    None => self.nowhere(why),
                }
                None
            }
        }
    }

    /// `usage_log`: a file (relative to the config file's folder) in a folder that exists.
    fn usage_log(&mut self, base: &Path) -> Option<Option<PathBuf>> {
        let Some(v) = self.pick("usage_log", None) else {
            let flag = self.args.usage_log.clone();
            if let Some(why) = flag.as_deref().and_then(usage_log_problem) {
                let path = flag.as_deref().map(|p| p.display().to_string()).unwrap_or_default();
                self.nowhere(ConfigError::UsageLog { path, why }.to_string());
                return None;
            }
            return Some(flag);
        };
        let Some(path) = v.get_ref().as_str().filter(|p| !p.is_empty()) else {
            self.at(v.span(), format!("usage_log = {}: must be a path, such as \"usage.jsonl\"", v.get_ref()));
            return None;
        };
        let path = base.join(path);
        if let Some(why) = usage_log_problem(&path) {
            self.at(v.span(), format!("usage_log = {:?}: {why}", path.display().to_string()));
            return None;
        }
        Some(Some(path))
    }

    /// `log_buffer`: a size, or 0 to keep no log.
    fn log_buffer(&mut self, app: Option<&Table>) -> Option<u64> {
        match self.pick("log_buffer", app) {
            Some(v) if matches!(v.get_ref(), toml::Value::Integer(0)) => Some(0),
            Some(v) if v.get_ref().as_str().is_some_and(|s| s.trim() == "0") => Some(0),
            Some(v) => self.size("log_buffer", v),
            None => self.flag_result(parse_log_buffer("--log-buffer", &self.args.log_buffer)),
        }
    }

    /// `shiny_session_buffer` (at least 64KiB) and `shiny_buffer_total` (at
    /// least the session buffer): the file's keys, else the flags.
    fn shiny_buffers(&mut self) -> (Option<u64>, Option<u64>) {
        let a = self.args;
        let session = match self.pick("shiny_session_buffer", None) {
            Some(v) => self.size("shiny_session_buffer", v).and_then(|n| {
                if n >= MIN_SESSION_BUFFER {
                    return Some(n);
                }
                let message =
                    format!("shiny_session_buffer = {}: out of range: use {SESSION_BUFFER_RANGE}", v.get_ref());
                self.at(v.span(), message);
                None
            }),
            None => self.flag_result(parse_session_buffer("--shiny-session-buffer", &a.shiny_session_buffer)),
        };
        let total = match self.pick("shiny_buffer_total", None) {
            Some(v) => self.size("shiny_buffer_total", v),
            None => self.flag_size("--shiny-buffer-total", &a.shiny_buffer_total),
        };
        if let (Some(s), Some(t)) = (session, total) {
            if t < s {
                let place = self.pick("shiny_buffer_total", None).or(self.pick("shiny_session_buffer", None));
                match place.map(|v| v.span()) {
                    Some(span) => self.at(
                        span,
                        format!(
                            "shiny_buffer_total ({}) is below shiny_session_buffer ({}): the total must hold at least one session's buffer (raise shiny_buffer_total or lower shiny_session_buffer)",
                            show_size(t),
                            show_size(s)
                        ),
                    ),
                    None => self.nowhere(
                        ConfigError::BufferTotalBelowSession { total: show_size(t), session: show_size(s) }.to_string(),
                    ),
                }
                return (session, None);
            }
        }
        (session, total)
    }

    fn app(&mut self, i: usize, app: &Spanned<Table>, base: &Path, count: usize) -> Option<AppConfig> {
        let t = Some(app.get_ref());
        let a = self.args;
        let ordinal = i + 1;
        let source = self.source(ordinal, app, base);
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
        let max_pending = self.count("max_pending", t, u64::from(a.max_pending), 0, 4000).map(|n| n as usize);
        let busy_threshold = self.count("busy_threshold", t, a.busy_threshold as u64, 0, 100).map(|n| n as f64 / 100.0);
        let queue_size = self.count("queue_size", t, a.queue_size as u64, 1, u32::MAX as u64).map(|n| n as usize);
        let max_age = self.seconds("max_age", t, &a.max_age, true);
        let queue_timeout = self.seconds("queue_timeout", t, &a.queue_timeout, false);
        let start_timeout = self.seconds("start_timeout", t, &a.start_timeout, false);
        let reconnect_window = self.reconnect_window(t);
        let allow = self.allow(app.get_ref());
        let run_as = self.run_as(t);
        let memory_limit = match self.pick("memory_limit", t) {
            Some(v) => self.size("memory_limit", v).and_then(|n| {
                if n >= super::flags::MIN_MEMORY_LIMIT {
                    return Some(Some(n));
                }
                let message = format!(
                    "memory_limit = {}: too small: use 100MB or more (R with plumber or Shiny loaded takes ~75MB before the app loads anything)",
                    v.get_ref()
                );
                self.at(v.span(), message);
                None
            }),
            None => match &a.memory_limit {
                Some(s) => self.flag_result(parse_memory_limit("--memory-limit", s)).map(Some),
                None => Some(None),
            },
        };
        let log_buffer = self.log_buffer(t);
        Some(
            AppConfig {
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
                max_pending: max_pending?,
                busy_threshold: busy_threshold?,
                reconnect_window: reconnect_window?,
                r_bin: r_bin?,
                start_timeout: start_timeout?,
                env: env?,
                allow: allow?,
                run_as: run_as?,
                account: valves_own(&a.kernel),
                memory_limit: memory_limit?,
                log_buffer: log_buffer?,
                source: source?,
            }
            .fit_to_source(),
        )
    }

    /// What the app serves: `file` (found as R finds it; a folder with only
    /// an `index.html` is static), or `static` (a folder served as files). A
    /// static app's own table holds no worker setting: it has no worker.
    fn source(&mut self, ordinal: usize, app: &Spanned<Table>, base: &Path) -> Option<discover::AppSource> {
        let t = app.get_ref();
        let (key, v) = match (t.get("file"), t.get("static")) {
            (Some(_), Some(v)) => {
                let message = "give either `file` (an R app) or `static` (a folder of files), not both".to_string();
                self.at(self.key_span("static", v.span()), message);
                return None;
            }
            (Some(v), None) => ("file", v),
            (None, Some(v)) => ("static", v),
            (None, None) => {
                let message = format!(
                    "app {ordinal} has no `file`: name its plumber file or folder, its Shiny app folder or its interactive R Markdown document (or `static`: a folder of files with an index.html), relative to the config file's folder"
                );
                self.at(app.span(), message);
                return None;
            }
        };
        let Some(path) = v.get_ref().as_str() else {
            self.at(v.span(), format!("`{key}` must be a string (a path)"));
            return None;
        };
        let found = match key {
            "static" => discover::resolve_static(&base.join(path)),
            _ => discover::resolve(&base.join(path), "`file`"),
        };
        let source = found
            .map_err(|e| self.at(v.span(), format!("{key} = {path:?}: {e} (paths are relative to {})", base.display())))
            .ok()?;
        if source.static_root().is_some() {
            for (k, w) in t.iter().filter(|(k, _)| APP_KEYS.contains(&k.as_str())) {
                let message = format!("`{k}` does nothing for static content (valve serves its files itself, with no R worker): remove it");
                self.at(self.key_span(k, w.span()), message);
            }
        }
        Some(source)
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

    /// `run_as`: a user name, a uid (a number or its digits), or "root".
    fn run_as(&mut self, app: Option<&Table>) -> Option<RunAs> {
        let Some(v) = self.pick("run_as", app) else {
            return Some(RunAs::parse(self.args.run_as.as_deref().unwrap_or("")));
        };
        match v.get_ref() {
            toml::Value::String(s) if !s.trim().is_empty() => Some(RunAs::User(s.trim().to_string())),
            toml::Value::Integer(i) if *i >= 0 && *i < u32::MAX as i64 => Some(RunAs::User(i.to_string())),
            other => {
                self.at(
                    v.span(),
                    format!("run_as = {other}: name a user (run_as = \"shiny\") or a uid (run_as = 1001), or remove it to give the app a user of its own"),
                );
                None
            }
        }
    }

    /// `reconnect_window`: seconds, 0 (off) to a day.
    fn reconnect_window(&mut self, app: Option<&Table>) -> Option<Duration> {
        let key = "reconnect_window";
        let flag = &self.args.reconnect_window;
        let d = self.seconds(key, app, flag, true)?;
        if d <= MAX_RECONNECT_WINDOW {
            return Some(d);
        }
        match self.pick(key, app) {
            Some(v) => self.at(v.span(), format!("{key} = {}: out of range: use {RECONNECT_RANGE}", v.get_ref())),
            None => {
                self.flag_result(parse_reconnect_window(flag_name(key), flag));
            }
        }
        None
    }

    /// A flag's value, or its error noted (it has no place in the file).
    fn flag_result<T>(&mut self, r: Result<T, ConfigError>) -> Option<T> {
        r.map_err(|e| self.nowhere(e.to_string())).ok()
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

/// Where `key` is written inside an app's table (the table's text span), if it is.
fn app_tables_key(text: &str, table: &std::ops::Range<usize>, key: &str) -> Option<std::ops::Range<usize>> {
    let body = text.get(table.clone())?;
    let mut at = 0;
    for line in body.split_inclusive('\n') {
        let trimmed = line.trim_start();
        if trimmed.starts_with(key) && trimmed[key.len()..].trim_start().starts_with('=') {
            let start = table.start + at + (line.len() - trimmed.len());
            return Some(start..start + key.len());
        }
        at += line.len();
    }
    None
}

fn valid_hostname(h: &str) -> bool {
    !h.is_empty() && h.len() <= 253 && h.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.".contains(&b))
}

mod access;
mod publish;

#[cfg(test)]
mod tests;
