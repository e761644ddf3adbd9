//! The command line: clap's derive API with a `VALVE_*` variable on every flag.
//!
//! Here the flags themselves, in `--help`'s order (the reference pages are
//! made from it); beside them `build` (from the flags to a checked `Config`:
//! `-f`, `--site`, the published apps) and `values` (parse helpers the config
//! file reader shares).

use std::collections::BTreeSet;
use std::path::PathBuf;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use super::access::{DEFAULT_EMAIL_HEADER, DEFAULT_GROUPS_HEADER, DEFAULT_USER_HEADER};
use super::model::admin_addr;
use super::users::{parse_uid_range, Kernel};

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

    /// The operator token valve's admin pages take (`Authorization: Bearer TOKEN`: valve's own
    /// subcommands, the R package, a Prometheus scrape), read from FILE (owner-only, at least 20
    /// characters). Unset: valve makes one at start, admin.token in --state-dir (mode 0600).
    #[arg(long = "admin-token-file", env = "VALVE_ADMIN_TOKEN_FILE", value_name = "FILE")]
    pub admin_token_file: Option<PathBuf>,

    /// Users a trusted sign-in proxy names (--trusted-proxies) who may use valve's admin pages as
    /// operators, comma-separated. Unset: nobody by the proxy's word alone.
    #[arg(long = "admin-users", env = "VALVE_ADMIN_USERS", default_value = "", value_name = "USER,...")]
    pub admin_users: String,

    /// Groups (in the proxy's groups header) whose users may use valve's admin pages as operators.
    #[arg(long = "admin-groups", env = "VALVE_ADMIN_GROUPS", default_value = "", value_name = "GROUP,...")]
    pub admin_groups: String,

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
    /// Without root, how apps are kept apart: auto (each app's R under a Landlock ruleset of its
    /// own where the kernel has Landlock), required (refuse to start unless apps get users of
    /// their own or a Landlock that covers signals: ABI 6, Linux 6.12), none (no Landlock: every
    /// app's R reaches what valve's user may).
    #[arg(long = "isolation", env = "VALVE_ISOLATION", default_value = "auto", value_parser = ["auto", "required", "none"])]
    pub isolation: String,
    /// The most bytes of each app's log valve keeps in memory: what its R processes print (stdout
    /// and stderr, per worker) and valve's own lines about the app, served at
    /// /__valve__/apps/NAME/logs and live on the app's dashboard page (0: none).
    #[arg(long = "log-buffer", env = "VALVE_LOG_BUFFER", default_value = "1MiB", value_name = "SIZE")]
    pub log_buffer: String,

    /// Append each Shiny session and each app's requests per user per hour to FILE as JSON lines,
    /// and read its tail back at start, so /__valve__/usage survives restarts. A folder: shared by
    /// a site's valves (replicas), each writes a file of its own there and reports all of them.
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

    /// How the package versions a bundle's manifest names must match those the app's R loads
    /// (`exact`, `at-least`, `any`). No longer used: valve now restores the exact versions a
    /// bundle names into the app's own library (see --package-cache); kept so that existing
    /// configs still start.
    #[arg(long = "publish-versions", env = "VALVE_PUBLISH_VERSIONS", default_value = "exact",
          value_parser = ["exact", "at-least", "any"])]
    pub publish_versions: String,

    /// The largest bundle, compressed or unpacked (e.g. 500MB, 2GiB).
    #[arg(long = "publish-max-size", env = "VALVE_PUBLISH_MAX_SIZE", default_value = "1GiB", value_name = "SIZE")]
    pub publish_max_size: String,

    /// The most files and folders one bundle may hold.
    #[arg(long = "publish-max-files", env = "VALVE_PUBLISH_MAX_FILES", default_value_t = 20000, value_name = "N")]
    pub publish_max_files: u64,

    /// Apps' packages: the cache, the builds, the repositories (`--package-cache` and the rest).
    /// Last, under a heading of their own (a flattened group's heading holds for what follows).
    #[command(flatten)]
    pub packages: PackageFlags,

    /// HTTPS: the certificate's files or ACME authority, the redirecting plain port, HSTS.
    #[command(flatten)]
    pub tls: TlsFlags,

    /// What to do instead of serving (none: serve).
    #[command(subcommand)]
    pub command: Option<Command>,

    /// The flags given on the command line or by a `VALVE_*` variable (by
    /// their names in snake_case): they beat a config file's top level.
    #[arg(skip)]
    pub explicit: BTreeSet<String>,

    /// Those of `explicit` given on the command line itself: there they beat
    /// a `VALVE_*` variable (an image's `VALVE_FILE` yields to `--config`).
    #[arg(skip)]
    pub on_command_line: BTreeSet<String>,

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
    /// List the package cache (each built package: version, the R it was built for, size, the
    /// apps whose library uses it), or with --prune remove what no app's folder uses.
    Packages {
        /// Remove the libraries no existing app folder (or kept published version) uses, the
        /// packages no remaining library links, their tarballs, and what killed restores left.
        #[arg(long)]
        prune: bool,
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
        // Read before the values are taken out of `matches` (which forgets
        // where a value it no longer holds came from).
        use clap::parser::ValueSource::{CommandLine, EnvVariable};
        let given = |sources: &[clap::parser::ValueSource]| -> BTreeSet<String> {
            cmd.get_arguments()
                .map(|arg| arg.get_id().as_str())
                .filter(|id| matches.value_source(id).is_some_and(|s| sources.contains(&s)))
                .map(str::to_string)
                .collect()
        };
        let explicit = given(&[CommandLine, EnvVariable]);
        let on_command_line = given(&[CommandLine]);
        let mut args = Args::from_arg_matches_mut(&mut matches)?;
        args.explicit = explicit;
        args.on_command_line = on_command_line;
        Ok(args)
    }

    /// Where the operator token of a running valve is: `--admin-token-file`,
    /// else `admin.token` in the state folder (`--state-dir`, or its default).
    pub fn admin_token_path(&self) -> PathBuf {
        self.admin_token_file.clone().unwrap_or_else(|| self.state_dir().join("admin.token"))
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
}

mod build;
mod packages;
mod tls;
mod values;

pub(super) use build::split_list;
pub use packages::PackageFlags;
pub(super) use packages::{cache_dir_problem, parse_repositories, repository_url, REPOSITORY_EXAMPLE};
pub use tls::TlsFlags;

pub(super) use values::{package_list, parse_memory_limit, publishing, valves_own, MIN_MEMORY_LIMIT};

#[cfg(test)]
mod tests;
