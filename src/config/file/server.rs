//! A config file's server settings: the top level's keys (a flag given
//! explicitly wins), `uid_range`, `preload_packages`, `otlp_endpoint`,
//! `usage_log` and the Shiny buffers (apps' packages are in `packages`).

use std::path::{Path, PathBuf};

use super::Cx;
use crate::config::error::{
    parse_session_buffer, show_size, usage_log_problem, ConfigError, MIN_SESSION_BUFFER, SESSION_BUFFER_RANGE,
};
use crate::config::flags::package_list;
use crate::config::isolation::{Isolation, IsolationSetting};
use crate::config::model::{self, AppConfig, Server};
use crate::config::otel::{self, Given, Otlp};
use crate::config::publish::Publishing;
use crate::config::users::parse_uid_range;

impl Cx<'_> {
    /// `preload_packages`: a list of R package names (or one comma-separated string).
    pub(super) fn packages(&mut self) -> Option<Vec<String>> {
        let Some(v) = self.pick("preload_packages", None) else {
            let given = &self.args.preload_packages;
            return self.flag_result(
                package_list(given).map_err(|why| ConfigError::Access { flag: "--preload-packages", why }),
            );
        };
        let joined = match v.get_ref() {
            toml::Value::String(s) => Some(s.clone()),
            toml::Value::Array(items) => {
                items.iter().map(|i| i.as_str().map(str::to_string)).collect::<Option<Vec<_>>>().map(|l| l.join(","))
            }
            _ => None,
        };
        match joined.map(|j| package_list(&j)) {
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

    /// `isolation`: the file's, else the flag's, decided on the measured kernel.
    fn isolation(&mut self) -> Option<Isolation> {
        let value = self.string("isolation", None, &self.args.isolation.clone())?;
        let span = self.pick("isolation", None).map(|v| v.span());
        let setting = match IsolationSetting::parse(&value) {
            Ok(s) => s,
            Err(why) => {
                self.at(span.unwrap_or(0..0), format!("isolation = {why}"));
                return None;
            }
        };
        match Isolation::decide(&self.args.kernel, setting) {
            Ok(level) => Some(level),
            Err(why) => {
                match span {
                    Some(span) => self.at(span, why),
                    None => self.nowhere(why),
                }
                None
            }
        }
    }

    /// `uid_range`: the file's, else the flag's.
    pub(super) fn uid_range(&mut self) -> Option<(u32, u32)> {
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

    pub(super) fn server(
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
        let isolation = self.isolation();
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
        let packages = self.package_settings(base, &state_dir);
        let tls = self.tls(base, &state_dir, port);
        let admin_access = self.admin_access(base);
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
            isolation: isolation?,
            admin_access: admin_access?,
            valve_uid: a.kernel.uid,
            builder_uids: Vec::new(),
            usage_log: usage_log?,
            usage_anonymize: usage_anonymize?,
            warm_parent: warm_parent?,
            preload_packages: preload_packages?,
            otlp: otlp?,
            packages: packages?,
            tls: tls?,
        })
    }

    /// `otlp_endpoint` (a flag given explicitly wins), else OpenTelemetry's variables.
    pub(super) fn otlp(&mut self) -> Option<Option<Otlp>> {
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
    pub(super) fn usage_log(&mut self, base: &Path) -> Option<Option<PathBuf>> {
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

    /// `shiny_session_buffer` (at least 64KiB) and `shiny_buffer_total` (at
    /// least the session buffer): the file's keys, else the flags.
    pub(super) fn shiny_buffers(&mut self) -> (Option<u64>, Option<u64>) {
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
}
