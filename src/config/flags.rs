//! The command line: clap's derive API with a `VALVE_*` variable on every flag.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use super::access::{self, Trust, DEFAULT_EMAIL_HEADER, DEFAULT_GROUPS_HEADER, DEFAULT_USER_HEADER};
use super::discover::{self, AppSource};
use super::error::{
    check_buffer_total, parse_log_buffer, parse_reconnect_window, parse_seconds, parse_session_buffer, parse_size,
    usage_log_problem, ConfigError,
};
use super::model::{admin_addr, transport, AppConfig, Config, Server};
use super::otel::{self, Otlp};
use super::publish::{self, Candidate, Publishing, VersionRule};
use super::settle::{settle, Unfit};
use super::site;
use super::uid_store::Store;
use super::users::{parse_uid_range, Account, AccountKind, Isolation, Kernel, RunAs};

/// One port in front of a pool of R worker processes running a plumber API or a Shiny app.
///
/// Each request goes to an idle worker; when all are busy it waits in a queue
/// and the pool grows up to --n-max, then shrinks back to --n-min once workers
/// sit unused for --max-age seconds. Several apps on one port: --config FILE or
/// --site DIR; SIGHUP reloads them without dropping requests.
#[derive(Parser, Debug, Clone)]
#[command(name = "valve", version, max_term_width = 100)]
pub struct Args {
    /// The app: a plumber file, a folder holding entrypoint.R or plumber.R, or a router saved with
    /// saveRDS() (.rds); or a Shiny app: a folder holding server.R or app.R, or a file ending in
    /// shinyApp(). Folders are searched as plumb(dir=) and shiny::runApp() search them. Also an
    /// interactive .Rmd or .qmd (or its folder), a folder whose _server.yml names an engine
    /// package, or a folder with index.html (static).
    #[arg(short = 'f', long = "file", env = "VALVE_FILE", default_value = "plumber.R")]
    pub file: PathBuf,

    /// Several apps on one port: a TOML file with server settings, per-app defaults (these flags'
    /// names in snake_case) and one [[app]] table per app (name, path, file, hostname, env, and
    /// any per-app flag). An app's own keys beat flags given here, which beat the file's top level.
    #[arg(short = 'c', long = "config", env = "VALVE_CONFIG", value_name = "FILE", conflicts_with = "site")]
    pub config: Option<PathBuf>,

    /// Serve every folder of DIR that holds an app at /<folder>/ (as Shiny Server's site_dir
    /// does), with these flags' settings; / lists the apps.
    #[arg(long, env = "VALVE_SITE", value_name = "DIR")]
    pub site: Option<PathBuf>,

    /// Check the configuration (flags, --config file or --site folder) and exit: 0 when valve
    /// would start, 2 with every problem listed (file:line:column).
    #[arg(long)]
    pub check: bool,

    /// Most R workers across every app (--config, --site): the machine's budget. When an app needs
    /// a worker and the budget is spent, the longest-idle worker of another app gives way (never
    /// below that app's --n-min). Default: the apps' --n-max added up.
    #[arg(long = "max-workers", env = "VALVE_MAX_WORKERS", value_name = "N")]
    pub max_workers: Option<usize>,

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

    /// Seconds between checks for unused workers (and samples of worker memory).
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

    /// Seconds a worker may take to answer a request before the client gets 504 and the worker is
    /// replaced (0: no limit). Shiny: applies to requests, not to open sessions; a Shiny worker that
    /// times out is replaced and its sessions end (its R was stuck for all of them).
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

    /// Replace a worker after about N requests (each worker gets up to 10% more, so they don't all
    /// restart together; 0: never). Shiny: requests and sessions count; a worker past N takes no
    /// new sessions and stops when its last session ends.
    #[arg(long = "max-requests", env = "VALVE_MAX_REQUESTS", default_value_t = 0, value_name = "N")]
    pub max_requests: u64,

    /// Replace a worker once its memory passes SIZE (e.g. 500MB): RSS, or for --preload forks the
    /// memory they do not share. Sampled every --check-unused seconds and after requests. Shiny: the
    /// worker takes no new sessions and stops when its last session ends.
    #[arg(long = "max-worker-memory", env = "VALVE_MAX_WORKER_MEMORY", value_name = "SIZE")]
    pub max_worker_memory: Option<String>,

    /// Load the API once in a parent R process and fork workers from it: workers share its
    /// memory and start in milliseconds. Per-worker set-up: options(valve.on_worker_start = function() ...).
    #[arg(long, env = "VALVE_PRELOAD")]
    pub preload: bool,

    /// Where valve's own pages are served: metrics, status and the dashboard (/__valve__/),
    /// and health and readiness too. Loopback on a free port by default (its address is in the
    /// ready line); 0.0.0.0:9090 for a Prometheus in a cluster; `off` for none. Health and
    /// readiness are always on the main port as well, for load balancers and probes.
    #[arg(long = "admin-addr", env = "VALVE_ADMIN_ADDR", default_value = "127.0.0.1:0", value_name = "HOST:PORT")]
    pub admin_addr: String,

    /// Also serve metrics, status and the dashboard on the main port (they reveal paths, pids and
    /// the configuration: only where the main port is private).
    #[arg(long = "admin-on-main", env = "VALVE_ADMIN_ON_MAIN")]
    pub admin_on_main: bool,

    /// Turn off the access log (one line per request).
    #[arg(long = "no-access-log", env = "VALVE_NO_ACCESS_LOG")]
    pub no_access_log: bool,

    /// Log format: text for people, json for log collectors.
    #[arg(long = "log-format", env = "VALVE_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,

    /// How valve reaches plumber workers: `frames` (valve's own protocol: R gets each request
    /// ready-made and runs no HTTP server, so it spends its time on the API) or `httpuv` (an httpuv
    /// server in each worker on a private socket). Use httpuv for an API that needs what frames do
    /// not carry: WebSockets (onWSOpen), httpuv's staticPaths, streaming, or httpuv's private
    /// req$.bodyData. Shiny apps always use httpuv.
    #[arg(long = "worker-transport", env = "VALVE_WORKER_TRANSPORT", default_value = "frames", value_parser = ["frames", "httpuv"])]
    pub worker_transport: String,

    /// plumber: requests waiting on promises one worker may hold and still take another (an
    /// endpoint that returns a pending promise frees R, as in one plain plumber process); a
    /// worker holding this many takes nothing more until one settles (0: a worker waiting on a
    /// promise takes nothing more until it settles). Frames transport only; httpuv workers take
    /// one request at a time.
    #[arg(long = "max-pending", env = "VALVE_MAX_PENDING", default_value_t = 16, value_name = "N",
          value_parser = clap::value_parser!(u16).range(0..=4000))]
    pub max_pending: u16,

    /// Shiny: most sessions one worker holds; a new worker starts when all are full.
    #[arg(long = "max-sessions", env = "VALVE_MAX_SESSIONS", default_value_t = 20, value_name = "N")]
    pub max_sessions: usize,

    /// Shiny: a worker whose R ran (or waited to run) at least PERCENT% of the last quarter second
    /// is busy; new sessions go to a worker that is not, or start another up to --n-max, before they
    /// crowd a busy one (0: place by session count only).
    #[arg(long = "busy-threshold", env = "VALVE_BUSY_THRESHOLD", default_value_t = 50,
          value_parser = clap::value_parser!(u8).range(0..=100), value_name = "PERCENT")]
    pub busy_threshold: u8,

    /// Shiny: how long valve keeps a session whose browser's connection dropped, so the browser
    /// can come back to the same session (R state and all); 0 turns this off (a dropped connection
    /// ends the session, as in plain Shiny).
    #[arg(
        long = "shiny-reconnect-window",
        env = "VALVE_SHINY_RECONNECT_WINDOW",
        default_value = "120",
        value_name = "SECONDS"
    )]
    pub reconnect_window: String,

    /// Shiny: the most bytes valve holds for one session's browser (messages sent, not yet
    /// acknowledged), e.g. 16MiB; at least 64KiB.
    #[arg(
        long = "shiny-session-buffer",
        env = "VALVE_SHINY_SESSION_BUFFER",
        default_value = "16MiB",
        value_name = "SIZE"
    )]
    pub shiny_session_buffer: String,

    /// Shiny: the most bytes valve holds for all sessions together; at least --shiny-session-buffer.
    #[arg(
        long = "shiny-buffer-total",
        env = "VALVE_SHINY_BUFFER_TOTAL",
        default_value = "256MiB",
        value_name = "SIZE"
    )]
    pub shiny_buffer_total: String,

    /// Peers whose X-Forwarded-For/Forwarded and identity headers valve believes: addresses or
    /// CIDRs, comma-separated (a sign-in proxy such as oauth2-proxy, a balancer). Default: nobody,
    /// not even loopback; from any other peer the identity headers are removed.
    #[arg(long = "trusted-proxies", env = "VALVE_TRUSTED_PROXIES", default_value = "", value_name = "CIDR,...")]
    pub trusted_proxies: String,

    /// The header a trusted proxy names the user in.
    #[arg(long = "user-header", env = "VALVE_USER_HEADER", default_value = DEFAULT_USER_HEADER, value_name = "NAME")]
    pub user_header: String,

    /// The header a trusted proxy gives the user's email in (the user, when no user header came).
    #[arg(long = "email-header", env = "VALVE_EMAIL_HEADER", default_value = DEFAULT_EMAIL_HEADER, value_name = "NAME")]
    pub email_header: String,

    /// The header a trusted proxy lists the user's groups in (comma-separated).
    #[arg(long = "groups-header", env = "VALVE_GROUPS_HEADER", default_value = DEFAULT_GROUPS_HEADER, value_name = "NAME")]
    pub groups_header: String,

    /// Where a browser without an identity goes when an app's allow lists refuse it (302), such
    /// as /oauth2/start?rd={rd}: `{rd}` becomes the path asked for, `{url}` the full URL (escaped);
    /// with neither, an `rd` parameter is added. Unset: 403.
    #[arg(long = "sign-in-url", env = "VALVE_SIGN_IN_URL", value_name = "URL")]
    pub sign_in_url: Option<String>,

    /// Forward auth: valve asks this http:// URL (GET, with the request's Cookie and Authorization)
    /// about every request to an app, such as oauth2-proxy's http://127.0.0.1:4180/oauth2/auth.
    /// 2xx: signed in, named by X-Auth-Request-User/-Email/-Groups; 401/403: no identity; else 503.
    /// Identity headers from clients and proxies are then never believed.
    #[arg(long = "auth-url", env = "VALVE_AUTH_URL", value_name = "URL")]
    pub auth_url: Option<String>,

    /// Seconds an --auth-url answer is reused for the same Cookie and Authorization (0: ask every time).
    #[arg(long = "auth-cache", env = "VALVE_AUTH_CACHE", default_value = "5", value_name = "SECONDS")]
    pub auth_cache: String,

    /// The user each app's R runs as when valve runs as root (a user name or a uid). Unset: each
    /// app gets a user of its own, a uid from --uid-range, recorded in the state folder (`uids`)
    /// when first given and never moved. R never runs as root unless this says `root`.
    #[arg(long = "run-as", env = "VALVE_RUN_AS", value_name = "USER")]
    pub run_as: Option<String>,

    /// The most memory one worker may take (e.g. 512MB, 2GB): past it, R's allocations fail with
    /// "cannot allocate vector", that request gets an error and the worker serves on. It bounds
    /// the worker's data (its heap), as the kernel counts it for RLIMIT_DATA. Unset: no limit.
    #[arg(long = "memory-limit", env = "VALVE_MEMORY_LIMIT", value_name = "SIZE")]
    pub memory_limit: Option<String>,

    /// Where valve keeps what outlives a run (each app's private home, the table of the apps'
    /// uids). Default: /var/lib/valve as root, else $XDG_STATE_HOME/valve (~/.local/state/valve).
    #[arg(long = "state-dir", env = "VALVE_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// The uids valve gives apps without --run-as (as root); a uid once given is kept even outside
    /// a changed range.
    #[arg(
        long = "uid-range",
        env = "VALVE_UID_RANGE",
        default_value = "1900000000-1999999999",
        value_name = "START-END"
    )]
    pub uid_range: String,
    /// The most bytes of each app's log valve keeps in memory: what its R processes print (stdout
    /// and stderr, per worker) and valve's own lines about the app, served at
    /// /__valve__/apps/NAME/logs and live on the app's dashboard page (0: none).
    #[arg(long = "log-buffer", env = "VALVE_LOG_BUFFER", default_value = "1MiB", value_name = "SIZE")]
    pub log_buffer: String,

    /// Append each Shiny session and each app's requests per user per hour to FILE as JSON lines,
    /// and read its tail back at start, so /__valve__/usage survives restarts.
    #[arg(long = "usage-log", env = "VALVE_USAGE_LOG", value_name = "FILE")]
    pub usage_log: Option<PathBuf>,

    /// Keep a keyed hash of each user instead of the name in the usage list and log; the key is
    /// kept in FILE.key (mode 0600) beside --usage-log, so a user hashes the same across restarts.
    #[arg(long = "usage-anonymize", env = "VALVE_USAGE_ANONYMIZE")]
    pub usage_anonymize: bool,
    /// Traces: send a span per request and per Shiny session to this OpenTelemetry collector over
    /// OTLP/HTTP, such as http://127.0.0.1:4318 (spans go to its /v1/traces); `off` for none. R
    /// gets valve's span as `traceparent`. Unset: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
    /// OTEL_EXPORTER_OTLP_ENDPOINT if set; the service name is OTEL_SERVICE_NAME (default valve).
    #[arg(long = "otlp-endpoint", env = "VALVE_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,

    /// Start workers as forks of one warm R parent shared by apps, with the packages apps load
    /// already loaded: a new worker of any app serves in milliseconds instead of R's second or more
    /// of start-up. A fork becomes the app's worker as a fresh R would (its user, folder,
    /// .Renviron, .Rprofile); an app whose library paths hold other versions of what the parent
    /// loaded starts fresh R. `false`: every worker is a fresh R (or a --preload fork).
    #[arg(long = "warm-parent", env = "VALVE_WARM_PARENT", default_value_t = true, action = clap::ArgAction::Set,
          value_name = "BOOL")]
    pub warm_parent: bool,

    /// Packages the warm parent loads besides plumber, shiny and rmarkdown (comma-separated, such
    /// as dplyr,ggplot2), so that apps using them start in milliseconds too.
    #[arg(long = "preload-packages", env = "VALVE_PRELOAD_PACKAGES", default_value = "", value_name = "PKG,...")]
    pub preload_packages: String,

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

    /// Turn publishing on: apps published with rsconnect::deployApp() (RStudio's Publish button)
    /// or valve_deploy() are kept in DIR, each version in a folder of its own, and served at
    /// /<name>/ beside the other apps. The publishing API is on the admin address (or
    /// --publish-addr); needs --publish-keys-file.
    #[arg(long = "publish-dir", env = "VALVE_PUBLISH_DIR", value_name = "DIR")]
    pub publish_dir: Option<PathBuf>,

    /// Who may publish: one key a line, `NAME KEY` or `NAME sha256:HEX` (the key's SHA-256);
    /// `valve publish-key NAME` makes a key and its line. Read again when it changes.
    #[arg(long = "publish-keys-file", env = "VALVE_PUBLISH_KEYS_FILE", value_name = "FILE")]
    pub publish_keys_file: Option<PathBuf>,

    /// Also serve the publishing API (only it) on this address, for publishing from laptops;
    /// by default it is on the admin address alone.
    #[arg(long = "publish-addr", env = "VALVE_PUBLISH_ADDR", value_name = "HOST:PORT")]
    pub publish_addr: Option<String>,

    /// Versions kept of each published app (the active one always); older ones are removed.
    #[arg(long = "publish-keep", env = "VALVE_PUBLISH_KEEP", default_value_t = 5, value_name = "N")]
    pub publish_keep: usize,

    /// How the package versions a bundle's manifest names must match those the app's R loads:
    /// `exact`, `at-least` (that version or a later one) or `any` (installed at all). valve
    /// installs nothing: a deployment whose packages do not match fails and changes nothing.
    #[arg(long = "publish-versions", env = "VALVE_PUBLISH_VERSIONS", default_value = "exact",
          value_parser = ["exact", "at-least", "any"])]
    pub publish_versions: String,

    /// The largest bundle, compressed or unpacked (e.g. 500MB, 2GiB).
    #[arg(long = "publish-max-size", env = "VALVE_PUBLISH_MAX_SIZE", default_value = "1GiB", value_name = "SIZE")]
    pub publish_max_size: String,

    /// The most files and folders one bundle may hold.
    #[arg(long = "publish-max-files", env = "VALVE_PUBLISH_MAX_FILES", default_value_t = 20000, value_name = "N")]
    pub publish_max_files: u64,

    /// What to do instead of serving (none: serve).
    #[command(subcommand)]
    pub command: Option<Command>,

    /// The flags given on the command line or by a `VALVE_*` variable (by
    /// their names in snake_case): they beat a config file's top level.
    #[arg(skip)]
    pub explicit: BTreeSet<String>,

    /// What the kernel lets this valve do (measured by the worker module at
    /// start, before the configuration is read): whether apps get users of
    /// their own and a private view.
    #[arg(skip)]
    pub kernel: Kernel,
}

/// `valve COMMAND`: tasks beside serving. Without one, valve serves.
#[derive(Subcommand, Debug, Clone)]
pub enum Command {
    /// Make a new random publishing key for NAME: prints the key (give it to NAME) and the line
    /// to add to publish_keys_file (the key's hash: the file holds no secret).
    PublishKey {
        /// Who holds the key, as calls are logged (letters, digits, -, _, .).
        name: String,
    },
    /// List a published app's versions: which is active, when and by which key each came.
    Versions {
        app: String,
        /// valve's admin address (the ready line's admin_url), such as http://127.0.0.1:9090.
        #[arg(long, env = "VALVE_ADMIN_URL", value_name = "URL")]
        admin: Option<String>,
    },
    /// Serve another kept version of a published app (a rollback): a reload, no request fails.
    Activate {
        app: String,
        version: u32,
        /// valve's admin address (the ready line's admin_url), such as http://127.0.0.1:9090.
        #[arg(long, env = "VALVE_ADMIN_URL", value_name = "URL")]
        admin: Option<String>,
    },
    /// Set who may use a published app (its allow_users and allow_groups).
    Access {
        app: String,
        /// Users (or emails) who may use it, comma-separated.
        #[arg(long, value_name = "NAME,...")]
        users: Option<String>,
        /// Groups whose members may use it, comma-separated.
        #[arg(long, value_name = "GROUP,...")]
        groups: Option<String>,
        /// Open it to everyone (drops both lists).
        #[arg(long, conflicts_with_all = ["users", "groups"])]
        open: bool,
        /// valve's admin address (the ready line's admin_url), such as http://127.0.0.1:9090.
        #[arg(long, env = "VALVE_ADMIN_URL", value_name = "URL")]
        admin: Option<String>,
    },
}

impl Args {
    /// With `--healthcheck`: the URL to check.
    pub fn healthcheck_url(&self) -> Option<String> {
        let given = self.healthcheck.as_deref()?;
        if !given.is_empty() {
            return Some(given.to_string());
        }
        let host = match self.host.as_str() {
            "0.0.0.0" | "" => "127.0.0.1".to_string(),
            "::" => "[::1]".to_string(),
            h if h.contains(':') && !h.starts_with('[') => format!("[{h}]"),
            h => h.to_string(),
        };
        Some(format!("http://{host}:{}/__valve__/healthz", self.port))
    }

    /// `--uid-range` as numbers (the default range if it does not parse: the
    /// configuration check says so).
    pub fn uid_range(&self) -> (u32, u32) {
        parse_uid_range(&self.uid_range).unwrap_or(super::users::DEFAULT_UID_RANGE)
    }

    /// Whether JSON logs were asked for (known before the rest is checked, so
    /// that even errors about the rest are JSON).
    pub fn wants_json_logs(&self) -> bool {
        self.log_format == "json"
    }

    /// Parses the command line, noting which flags were given (not defaulted).
    pub fn parse_noting_given() -> Result<Args, clap::Error> {
        let cmd = Args::command();
        let mut matches = cmd.clone().try_get_matches()?;
        let mut args = Args::from_arg_matches_mut(&mut matches)?;
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if matches!(
                matches.value_source(id),
                Some(clap::parser::ValueSource::CommandLine | clap::parser::ValueSource::EnvVariable)
            ) {
                args.explicit.insert(id.to_string());
            }
        }
        Ok(args)
    }

    /// The admin URL a subcommand talks to: `--admin`, else `--admin-addr`
    /// when it names a port.
    pub fn admin_url_for(&self, given: Option<&str>) -> Result<String, String> {
        if let Some(url) = given {
            let url = url.trim_end_matches('/');
            return Ok(if url.contains("://") { url.to_string() } else { format!("http://{url}") });
        }
        match admin_addr(&self.admin_addr) {
            Some(addr) if !addr.ends_with(":0") => Ok(format!("http://{addr}")),
            _ => Err("pass --admin URL (or VALVE_ADMIN_URL): valve's admin address, the admin_url of its ready line, such as http://127.0.0.1:9090".into()),
        }
    }

    /// `--publish-dir` and its companions, checked; the keys file is read.
    pub(super) fn publishing(&self) -> Result<Option<Publishing>, ConfigError> {
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
        self.settle(&mut config, candidate.filter(|c| c.unchecked).map(|c| c.app.as_str()))?;
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
    pub(super) fn single_with(&self, candidate: Option<&Candidate>) -> Result<Config, ConfigError> {
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
    pub(super) fn site_with(&self, dir: &Path, candidate: Option<&Candidate>) -> Result<Config, ConfigError> {
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
    fn settle(&self, config: &mut Config, unchecked: Option<&str>) -> Result<(), ConfigError> {
        let range =
            parse_uid_range(&self.uid_range).map_err(|why| ConfigError::Isolation(format!("--uid-range {why}")))?;
        let store = Store { dir: config.server.state_dir.clone(), record: !self.check };
        let settled = settle(&mut config.apps, &self.kernel, range, &store, unchecked);
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
    pub(super) fn state_dir(&self) -> PathBuf {
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
                let dir = self.state_dir();
                private_paths.push(dir.clone());
                dir
            },
            isolation: Isolation::from_kernel(&self.kernel),
            valve_uid: self.kernel.uid,
            private_paths,
            usage_log: self.usage_log.clone(),
            usage_anonymize: self.usage_anonymize,
            warm_parent: self.warm_parent,
            preload_packages: package_list(&self.preload_packages)
                .map_err(|why| ConfigError::Access { flag: "--preload-packages", why })?,
            otlp: self.otlp()?,
        })
    }

    /// `--otlp-endpoint`, else OpenTelemetry's variables.
    fn otlp(&self) -> Result<Option<Otlp>, ConfigError> {
        let given = self.otlp_endpoint.as_deref().map(|v| (otel::Given::Flag, v));
        otel::otlp(given, otel::environment).map_err(ConfigError::Otlp)
    }

    /// `--trusted-proxies`, the identity header names, `--sign-in-url` and `--auth-url`.
    pub(super) fn trust(&self) -> Result<Trust, ConfigError> {
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

/// `preload_packages`: R package names, comma-separated.
pub(super) fn package_list(value: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '.')
            && !name.ends_with('.');
        if !valid {
            return Err(format!(
                "{name:?} is not an R package name (letters, digits and dots, starting with a letter)"
            ));
        }
        out.push(name.to_string());
    }
    Ok(out)
}

/// Publishing's settings from their values, checked; the keys file is read.
pub(super) fn publishing(
    dir: &Path,
    keys_file: &Path,
    addr: Option<String>,
    keep: usize,
    versions: &str,
    max_size: u64,
    max_files: u64,
) -> Result<Option<Publishing>, ConfigError> {
    let bad = ConfigError::Published;
    if keep == 0 {
        return Err(bad("publish_keep must be at least 1 (the active version is always kept)".into()));
    }
    let versions = VersionRule::parse(versions)
        .ok_or_else(|| bad(format!("publish_versions {versions:?}: use \"exact\", \"at-least\" or \"any\"")))?;
    std::fs::create_dir_all(dir).map_err(|e| {
        bad(format!("publish_dir {}: cannot create it: {e} (valve's user must be able to write there)", dir.display()))
    })?;
    let dir = std::fs::canonicalize(dir).map_err(|e| bad(format!("publish_dir {}: {e}", dir.display())))?;
    let keys = publish::read_keys(keys_file).map_err(bad)?;
    if keys.is_empty() {
        return Err(bad(format!(
            "publish_keys_file {} holds no key: add a line with `valve publish-key NAME`",
            keys_file.display()
        )));
    }
    Ok(Some(Publishing {
        dir,
        keys_file: keys_file.to_path_buf(),
        addr: addr.and_then(|a| admin_addr(&a)),
        keep,
        versions,
        max_size,
        max_files: max_files.max(1),
    }))
}

/// The account an app has until its own is settled: valve's.
pub(super) fn valves_own(kernel: &Kernel) -> Account {
    Account {
        uid: kernel.uid,
        gid: kernel.gid,
        groups: Vec::new(),
        name: kernel.uid.to_string(),
        home: None,
        kind: AccountKind::Valve,
    }
}

/// The least `memory_limit` valve accepts: R with plumber or Shiny loaded
/// takes ~75MB of data before an app loads anything.
pub(super) const MIN_MEMORY_LIMIT: u64 = 100 << 20;

/// `--memory-limit` / `memory_limit`: a size of at least 100MB.
pub(super) fn parse_memory_limit(flag: &'static str, value: &str) -> Result<u64, ConfigError> {
    let n = parse_size(flag, value)?;
    if n < MIN_MEMORY_LIMIT {
        return Err(ConfigError::OutOfRange {
            flag,
            value: value.to_string(),
            range: "100MB or more (R with plumber or Shiny loaded takes ~75MB before the app loads anything)",
        });
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn args(extra: &[&str]) -> Args {
        let mut argv = vec!["valve"];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv).expect("flags parse")
    }

    fn api() -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("plumber.R");
        std::fs::write(&f, "").unwrap();
        let path = f.to_str().unwrap().to_string();
        (dir, path)
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
        let (_dir, f) = api();
        let err = args(&["-f", &f, "--n-min", "5", "-n", "2"]).single().unwrap_err();
        assert_eq!(err.to_string(), "--n-min 5 is above --n-max 2: raise --n-max or lower --n-min");
    }

    #[test]
    fn one_app_at_the_root_named_after_its_file() {
        let (_dir, f) = api();
        let c = args(&["-f", &f]).single().unwrap();
        assert_eq!(c.apps.len(), 1);
        assert_eq!((c.apps[0].name.as_str(), c.apps[0].prefix.as_str()), ("plumber", "/"));
        assert_eq!(c.server.max_workers, 3, "-f: the budget is --n-max");
    }

    #[test]
    fn static_content_takes_no_worker_from_flags_or_the_site_budget() {
        let site = tempfile::tempdir().unwrap();
        std::fs::create_dir(site.path().join("docs")).unwrap();
        std::fs::write(site.path().join("docs/index.html"), "<h1>docs</h1>").unwrap();
        let docs = site.path().join("docs");
        let c = args(&["-f", docs.to_str().unwrap(), "--n-min", "2", "--preload"]).single().unwrap();
        let app = &c.apps[0];
        assert_eq!((app.source.kind(), app.n_min, app.n_max, app.preload), ("static", 0, 0, false));
        assert_eq!(c.server.max_workers, 1);
        let c = args(&[]).site(site.path()).unwrap();
        assert_eq!((c.apps[0].prefix.as_str(), c.apps[0].n_max, c.server.max_workers), ("/docs", 0, 1));
        std::fs::create_dir(site.path().join("api")).unwrap();
        std::fs::write(site.path().join("api/plumber.R"), "").unwrap();
        let c = args(&[]).site(site.path()).unwrap();
        assert_eq!(c.server.max_workers, 3, "the R apps' --n-max added up");
    }

    #[test]
    fn zero_disables_request_timeout_and_recycling() {
        let (_dir, f) = api();
        let c = args(&["-f", &f, "--request-timeout", "0"]).single().unwrap();
        let app = &c.apps[0];
        assert_eq!((app.request_timeout, app.max_requests, app.max_worker_memory), (None, None, None));
        assert_eq!(app.max_body_size, 100 << 20);
    }

    #[test]
    fn missing_file_and_bad_seconds_say_what_and_where() {
        let err = args(&["-f", "/nonexistent/api.R"]).single().unwrap_err();
        assert!(err.to_string().contains("/nonexistent/api.R"));
        let (_dir, f) = api();
        let err = args(&["-f", &f, "--max-age", "soon"]).single().unwrap_err();
        assert!(err.to_string().contains("--max-age \"soon\""));
        let c = args(&["-f", &f, "--check-unused", "0.5"]).single().unwrap();
        assert_eq!(c.server.check_unused, Duration::from_millis(500));
    }

    #[test]
    fn shiny_reconnect_and_buffers_default_and_take_flags() {
        let (_dir, f) = api();
        let c = args(&["-f", &f]).single().unwrap();
        assert_eq!(c.apps[0].reconnect_window, Duration::from_secs(120));
        assert_eq!((c.server.shiny_session_buffer, c.server.shiny_buffer_total), (16 << 20, 256 << 20));
        let given = ["-f", &f, "--shiny-reconnect-window", "30.5", "--shiny-session-buffer", "64KiB"];
        let c = args(&[&given[..], &["--shiny-buffer-total", "1MB"]].concat()).single().unwrap();
        assert_eq!(c.apps[0].reconnect_window, Duration::from_millis(30_500));
        assert_eq!((c.server.shiny_session_buffer, c.server.shiny_buffer_total), (64 << 10, 1 << 20));
        let c = args(&["-f", &f, "--shiny-reconnect-window", "0"]).single().unwrap();
        assert_eq!(c.apps[0].reconnect_window, Duration::ZERO, "0 turns same-session reconnect off");
    }

    #[test]
    fn shiny_reconnect_and_buffers_refuse_what_is_out_of_range() {
        let (_dir, f) = api();
        let refused = |extra: &[&str]| args(&[&["-f", f.as_str()], extra].concat()).single().unwrap_err().to_string();
        assert_eq!(
            refused(&["--shiny-reconnect-window", "86401"]),
            "--shiny-reconnect-window \"86401\" is out of range: use 0 to 86400 seconds (a day; 0 turns same-session reconnect off)"
        );
        assert!(args(&["-f", &f, "--shiny-reconnect-window", "86400"]).single().is_ok());
        let e = refused(&["--shiny-reconnect-window", "2m"]);
        assert!(e.starts_with("--shiny-reconnect-window \"2m\" is not a number of seconds"), "{e}");
        let e = refused(&["--shiny-session-buffer", "32KiB"]);
        assert_eq!(e, "--shiny-session-buffer \"32KiB\" is out of range: use 64KiB or more (such as 16MiB)");
        let e = refused(&["--shiny-session-buffer", "16XB"]);
        assert!(e.starts_with("--shiny-session-buffer \"16XB\" is not a size"), "{e}");
        let e = refused(&["--shiny-buffer-total", "lots"]);
        assert!(e.starts_with("--shiny-buffer-total \"lots\" is not a size"), "{e}");
        let e = refused(&["--shiny-session-buffer", "32MiB", "--shiny-buffer-total", "16MiB"]);
        assert!(e.starts_with("--shiny-buffer-total 16MiB is below --shiny-session-buffer 32MiB:"), "{e}");
        assert!(e.contains("raise --shiny-buffer-total or lower --shiny-session-buffer"), "{e}");
    }

    /// The variables are process-wide and other tests parse flags meanwhile:
    /// the test binary runs `shiny_settings_from_variables` again, alone, in a
    /// child process with them set.
    #[test]
    fn variables_set_the_shiny_settings() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["config::flags::tests::shiny_settings_from_variables", "--exact", "--include-ignored"])
            .env("VALVE_SHINY_RECONNECT_WINDOW", "45")
            .env("VALVE_SHINY_SESSION_BUFFER", "2MiB")
            .env("VALVE_SHINY_BUFFER_TOTAL", "64MiB")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    #[ignore = "run by variables_set_the_shiny_settings, with the variables set"]
    fn shiny_settings_from_variables() {
        if std::env::var_os("VALVE_SHINY_RECONNECT_WINDOW").is_none() {
            return;
        }
        let (_dir, f) = api();
        let c = args(&["-f", &f]).single().unwrap();
        assert_eq!(c.apps[0].reconnect_window, Duration::from_secs(45));
        assert_eq!((c.server.shiny_session_buffer, c.server.shiny_buffer_total), (2 << 20, 64 << 20));
    }

    #[test]
    fn healthcheck_defaults_to_valves_own_healthz() {
        assert_eq!(args(&["--healthcheck"]).healthcheck_url().unwrap(), "http://127.0.0.1:3000/__valve__/healthz");
        let a = args(&["--healthcheck", "--host", "0.0.0.0", "--port", "8080"]);
        assert_eq!(a.healthcheck_url().unwrap(), "http://127.0.0.1:8080/__valve__/healthz");
        assert_eq!(args(&["--healthcheck", "http://x:1/y"]).healthcheck_url().unwrap(), "http://x:1/y");
        assert_eq!(args(&[]).healthcheck_url(), None);
    }

    #[test]
    fn log_buffer_and_usage_log_flags_are_checked() {
        let (_d, api) = api();
        let c = args(&["-f", &api, "--log-buffer", "64KiB", "--usage-anonymize"]).single().unwrap();
        assert_eq!((c.apps[0].log_buffer, c.server.usage_anonymize), (64 << 10, true));
        assert_eq!(args(&["-f", &api, "--log-buffer", "0"]).single().unwrap().apps[0].log_buffer, 0);
        let err = args(&["-f", &api, "--log-buffer", "big"]).single().unwrap_err().to_string();
        assert!(err.contains("--log-buffer \"big\" is not a size"), "{err}");
        let err = args(&["-f", &api, "--usage-log", "/no/such/folder/usage.jsonl"]).single().unwrap_err().to_string();
        assert_eq!(err, "--usage-log /no/such/folder/usage.jsonl: its folder /no/such/folder does not exist: create it, or name a file in a folder that does");
        let dir = tempfile::tempdir().unwrap();
        let err = args(&["-f", &api, "--usage-log", dir.path().to_str().unwrap()]).single().unwrap_err().to_string();
        assert!(err.ends_with("is a folder: name a file in it, such as usage.jsonl"), "{err}");
    }
}
