//! One `[[app]]` table: what it serves, its name, path and hostname, and its
//! settings (its own keys, else a flag given explicitly, else the top level's).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use toml::Spanned;

use super::{Cx, Table};
use crate::config::discover;
use crate::config::error::{parse_log_buffer, parse_reconnect_window, MAX_RECONNECT_WINDOW, RECONNECT_RANGE};
use crate::config::flags::{parse_memory_limit, valves_own, MIN_MEMORY_LIMIT};
use crate::config::keys::{flag_name, APP_KEYS};
use crate::config::model::{normal_prefix, valid_name, AppConfig};
use crate::config::users::RunAs;

impl Cx<'_> {
    pub(super) fn app(&mut self, i: usize, app: &Spanned<Table>, base: &Path, count: usize) -> Option<AppConfig> {
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
                if n >= MIN_MEMORY_LIMIT {
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
                instance: None,
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
    pub(super) fn source(&mut self, ordinal: usize, app: &Spanned<Table>, base: &Path) -> Option<discover::AppSource> {
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

    /// `run_as`: a user name, a uid (a number or its digits), or "root".
    pub(super) fn run_as(&mut self, app: Option<&Table>) -> Option<RunAs> {
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
    pub(super) fn reconnect_window(&mut self, app: Option<&Table>) -> Option<Duration> {
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

    /// `log_buffer`: a size, or 0 to keep no log.
    pub(super) fn log_buffer(&mut self, app: Option<&Table>) -> Option<u64> {
        match self.pick("log_buffer", app) {
            Some(v) if matches!(v.get_ref(), toml::Value::Integer(0)) => Some(0),
            Some(v) if v.get_ref().as_str().is_some_and(|s| s.trim() == "0") => Some(0),
            Some(v) => self.size("log_buffer", v),
            None => self.flag_result(parse_log_buffer("--log-buffer", &self.args.log_buffer)),
        }
    }

    /// The workers' environment: the top level's `env`, then the app's (its keys win).
    pub(super) fn env(&mut self, app: Option<&Table>) -> Option<Vec<(String, String)>> {
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

fn valid_hostname(h: &str) -> bool {
    !h.is_empty() && h.len() <= 253 && h.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.".contains(&b))
}
