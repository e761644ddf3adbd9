//! From the flags to a checked `Config`: one app (`-f`), a site folder
//! (`--site`), the published apps, and the server settings they share.

use std::path::{Path, PathBuf};

use super::values::{package_list, parse_memory_limit, publishing, valves_own};
use super::Args;
use crate::config::access::{self, Trust};
use crate::config::discover::{self, AppSource};
use crate::config::error::{
    check_buffer_total, parse_log_buffer, parse_reconnect_window, parse_seconds, parse_session_buffer, parse_size,
    usage_log_problem, ConfigError,
};
use crate::config::isolation::{Isolation, IsolationSetting};
use crate::config::model::{admin_addr, transport, AppConfig, Config, Server};
use crate::config::otel::{self, Otlp};
use crate::config::publish::{self, Candidate, Publishing};
use crate::config::settle::{settle, PublishedCheck, Unfit};
use crate::config::site;
use crate::config::uid_store::Store;
use crate::config::users::{parse_uid_range, RunAs};

impl Args {
    /// `--publish-dir` and its companions, checked; the keys file is read.
    pub(in crate::config) fn publishing(&self) -> Result<Option<Publishing>, ConfigError> {
        let Some(dir) = &self.publish_dir else { return Ok(None) };
        let keys_file = self.publish_keys_file.clone().ok_or_else(|| {
            ConfigError::Published("--publish-dir needs --publish-keys-file: a file of keys that may publish (`valve publish-key NAME` makes one)".into())
        })?;
        publishing(
            dir,
            &keys_file,
            self.publish_addr.clone(),
            self.publish_keep,
            &self.publish_versions,
            parse_size("--publish-max-size", &self.publish_max_size)?,
            self.publish_max_files,
        )
    }

    /// Adds the published apps to a configuration made from flags (`-f`, `--site`).
    fn with_published(&self, mut config: Config, candidate: Option<&Candidate>) -> Result<Config, ConfigError> {
        let Some(p) = config.server.publish.clone() else { return Ok(config) };
        let mut max = config.server.max_workers;
        publish::add_published(
            &p,
            candidate,
            &mut config.apps,
            &mut max,
            self.max_workers.is_some(),
            |source, name, prefix, allow| {
                let mut app = self.app(name, prefix, source, self.preload)?;
                app.allow = allow;
                Ok(app)
            },
        )?;
        config.server.max_workers = max;
        let n_min: usize = config.apps.iter().map(|a| a.n_min).sum();
        if n_min > max {
            return Err(ConfigError::MinAboveBudget { n_min, max });
        }
        // Whom every app runs as, the published ones among them (own uids are settled together).
        self.settle(&mut config, candidate.filter(|c| c.checked).map(|c| c.app.as_str()))?;
        Ok(config)
    }

    /// Checks the per-app flags alone.
    fn check_pool_flags(&self) -> Result<(), ConfigError> {
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
        Ok(())
    }

    /// `-f`: one app at `/`.
    pub fn single(&self) -> Result<Config, ConfigError> {
        self.single_with(None)
    }

    /// `-f`, and the published apps (one at `candidate`'s version).
    pub(in crate::config) fn single_with(&self, candidate: Option<&Candidate>) -> Result<Config, ConfigError> {
        let config = self.single_alone()?;
        self.with_published(config, candidate)
    }

    fn single_alone(&self) -> Result<Config, ConfigError> {
        self.check_pool_flags()?;
        let source = discover::resolve(&self.file, "-f/--file")?;
        let app = self.app(source.default_name(), "/".to_string(), source, self.preload)?;
        let server = self.server(self.max_workers.unwrap_or(app.n_max.max(1)), Vec::new())?;
        if app.n_min > server.max_workers {
            return Err(ConfigError::MinAboveBudget { n_min: app.n_min, max: server.max_workers });
        }
        let mut config = Config { server, apps: vec![app], notes: Vec::new(), uids: Default::default() };
        self.settle(&mut config, None)?;
        Ok(config)
    }

    /// `--site DIR`: each app folder at `/<folder>`, with the flags' settings.
    pub fn site(&self, dir: &Path) -> Result<Config, ConfigError> {
        self.site_with(dir, None)
    }

    /// `--site DIR`, and the published apps (one at `candidate`'s version).
    pub(in crate::config) fn site_with(
        &self,
        dir: &Path,
        candidate: Option<&Candidate>,
    ) -> Result<Config, ConfigError> {
        let config = self.site_alone(dir)?;
        self.with_published(config, candidate)
    }

    fn site_alone(&self, dir: &Path) -> Result<Config, ConfigError> {
        self.check_pool_flags()?;
        let (apps, notes) = site::site(dir, |source, name, prefix| self.app(name, prefix, source, self.preload))?;
        let n_min: usize = apps.iter().map(|a| a.n_min).sum();
        // At least one: static folders alone need no worker, but a budget is never 0.
        let n_max: usize = apps.iter().map(|a| a.n_max).sum();
        let server = self.server(self.max_workers.unwrap_or(n_max.max(1)), vec![dir.to_path_buf()])?;
        if n_min > server.max_workers {
            return Err(ConfigError::MinAboveBudget { n_min, max: server.max_workers });
        }
        let mut config = Config { server, apps, notes, uids: Default::default() };
        self.settle(&mut config, None)?;
        Ok(config)
    }

    /// Whom each app runs as, and whether that user can read it.
    /// Published apps' folders are checked only for `checked`, the app a
    /// deployment checks (see `PublishedCheck`).
    fn settle(&self, config: &mut Config, checked: Option<&str>) -> Result<(), ConfigError> {
        let range =
            parse_uid_range(&self.uid_range).map_err(|why| ConfigError::Isolation(format!("--uid-range {why}")))?;
        let publish_dir = config.server.publish.as_ref().map(|p| p.dir.as_path());
        let store = Store::of_site(&config.server.state_dir, publish_dir, !self.check);
        let published = PublishedCheck { dir: config.server.publish.as_ref().map(|p| p.dir.as_path()), checked };
        let settled = settle(&mut config.apps, &self.kernel, range, &store, published, config.server.packages.builds);
        config.server.builder_uids = settled.builders;
        // Settled again with the published apps: what the first time said stays, once.
        for (said, to) in
            [(settled.said.notes, &mut config.uids.notes), (settled.said.warnings, &mut config.uids.warnings)]
        {
            for line in said {
                if !to.contains(&line) {
                    to.push(line);
                }
            }
        }
        if settled.unfit.is_empty() {
            return Ok(());
        }
        let lines: Vec<String> = settled
            .unfit
            .into_iter()
            .map(|(_, u)| match u {
                Unfit::RunAs(m) => m.replace("run_as = ", "--run-as "),
                Unfit::Folder(m) | Unfit::Uid(m) => m.replace("uid_range ", "--uid-range "),
            })
            .collect();
        Err(ConfigError::Isolation(lines.join("\n")))
    }

    /// One app with the flags' settings.
    fn app(&self, name: String, prefix: String, source: AppSource, preload: bool) -> Result<AppConfig, ConfigError> {
        let request_timeout = parse_seconds("--request-timeout", &self.request_timeout, true)?;
        Ok(AppConfig {
            instance: None,
            name,
            prefix,
            hostname: None,
            n_min: self.n_min,
            n_max: self.n_max,
            max_age: parse_seconds("--max-age", &self.max_age, true)?,
            preload,
            request_timeout: (!request_timeout.is_zero()).then_some(request_timeout),
            queue_size: self.queue_size,
            queue_timeout: parse_seconds("--queue-timeout", &self.queue_timeout, false)?,
            max_body_size: parse_size("--max-body-size", &self.max_body_size)?,
            max_requests: (self.max_requests > 0).then_some(self.max_requests),
            max_worker_memory: self
                .max_worker_memory
                .as_deref()
                .map(|v| parse_size("--max-worker-memory", v))
                .transpose()?,
            max_sessions: self.max_sessions,
            max_pending: usize::from(self.max_pending),
            busy_threshold: f64::from(self.busy_threshold) / 100.0,
            reconnect_window: parse_reconnect_window("--shiny-reconnect-window", &self.reconnect_window)?,
            r_bin: self.r_bin.clone(),
            start_timeout: parse_seconds("--start-timeout", &self.start_timeout, false)?,
            env: Vec::new(),
            allow: Default::default(),
            run_as: RunAs::parse(self.run_as.as_deref().unwrap_or("")),
            account: valves_own(&self.kernel),
            memory_limit: self.memory_limit.as_deref().map(|v| parse_memory_limit("--memory-limit", v)).transpose()?,
            log_buffer: parse_log_buffer("--log-buffer", &self.log_buffer)?,
            source,
        }
        .fit_to_source())
    }

    /// `--state-dir`, else where valve keeps state by default.
    pub(in crate::config) fn state_dir(&self) -> PathBuf {
        if let Some(dir) = &self.state_dir {
            return dir.clone();
        }
        if self.kernel.uid == 0 {
            return PathBuf::from("/var/lib/valve");
        }
        let xdg = std::env::var_os("XDG_STATE_HOME").map(PathBuf::from).filter(|p| p.is_absolute());
        let home = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state"));
        xdg.or(home).unwrap_or_else(std::env::temp_dir).join("valve")
    }

    fn server(&self, max_workers: usize, mut private_paths: Vec<PathBuf>) -> Result<Server, ConfigError> {
        if max_workers == 0 {
            return Err(ConfigError::ZeroMax);
        }
        let shiny_session_buffer = parse_session_buffer("--shiny-session-buffer", &self.shiny_session_buffer)?;
        let shiny_buffer_total = parse_size("--shiny-buffer-total", &self.shiny_buffer_total)?;
        check_buffer_total(shiny_session_buffer, shiny_buffer_total)?;
        if let Some(why) = self.usage_log.as_deref().and_then(usage_log_problem) {
            let path = self.usage_log.as_deref().unwrap_or(Path::new("")).display().to_string();
            return Err(ConfigError::UsageLog { path, why });
        }
        let state_dir = self.state_dir();
        let packages = self.packages.settings(&state_dir)?;
        let tls = self
            .tls
            .given()
            .settle(&std::env::current_dir().unwrap_or_default(), &state_dir, self.port)
            .map_err(ConfigError::Tls)?;
        Ok(Server {
            host: self.host.clone(),
            port: self.port,
            threads: self.workers,
            graceful_timeout: parse_seconds("--graceful-timeout", &self.graceful_timeout, true)?,
            header_timeout: parse_seconds("--header-timeout", &self.header_timeout, false)?,
            drain_delay: parse_seconds("--drain-delay", &self.drain_delay, true)?,
            check_unused: parse_seconds("--check-unused", &self.check_unused, false)?,
            admin_addr: admin_addr(&self.admin_addr),
            admin_on_main: self.admin_on_main,
            access_log: !self.no_access_log,
            log_json: self.log_format == "json",
            max_workers,
            worker_transport: transport(&self.worker_transport),
            shiny_session_buffer,
            shiny_buffer_total,
            trust: self.trust()?,
            publish: self.publishing()?,
            state_dir: {
                private_paths.push(state_dir.clone());
                state_dir
            },
            isolation: Isolation::decide(&self.kernel, IsolationSetting::parse(&self.isolation).unwrap_or_default())
                .map_err(ConfigError::Isolation)?,
            admin_access: crate::config::model::AdminAccess {
                token_file: self.admin_token_file.clone(),
                users: split_list(&self.admin_users),
                groups: split_list(&self.admin_groups),
            },
            valve_uid: self.kernel.uid,
            builder_uids: Vec::new(),
            private_paths,
            usage_log: self.usage_log.clone(),
            usage_anonymize: self.usage_anonymize,
            warm_parent: self.warm_parent,
            preload_packages: package_list(&self.preload_packages)
                .map_err(|why| ConfigError::Access { flag: "--preload-packages", why })?,
            otlp: self.otlp()?,
            packages,
            tls,
        })
    }

    /// `--otlp-endpoint`, else OpenTelemetry's variables.
    fn otlp(&self) -> Result<Option<Otlp>, ConfigError> {
        let given = self.otlp_endpoint.as_deref().map(|v| (otel::Given::Flag, v));
        otel::otlp(given, otel::environment).map_err(ConfigError::Otlp)
    }

    /// `--trusted-proxies`, the identity header names, `--sign-in-url` and `--auth-url`.
    pub(in crate::config) fn trust(&self) -> Result<Trust, ConfigError> {
        let bad = |flag: &'static str| move |why: String| ConfigError::Access { flag, why };
        Ok(Trust {
            proxies: access::parse_cidrs(&self.trusted_proxies).map_err(bad("--trusted-proxies"))?,
            user_header: access::header_name(&self.user_header).map_err(bad("--user-header"))?,
            email_header: access::header_name(&self.email_header).map_err(bad("--email-header"))?,
            groups_header: access::header_name(&self.groups_header).map_err(bad("--groups-header"))?,
            sign_in_url: self
                .sign_in_url
                .as_deref()
                .map(access::sign_in_url)
                .transpose()
                .map_err(bad("--sign-in-url"))?,
            auth: match &self.auth_url {
                Some(url) => Some(
                    access::auth_service(url, parse_seconds("--auth-cache", &self.auth_cache, true)?)
                        .map_err(bad("--auth-url"))?,
                ),
                None => None,
            },
        })
    }
}

/// A comma-separated list of names, blanks dropped.
pub(in crate::config) fn split_list(list: &str) -> Vec<String> {
    list.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect()
}
