//! What valve will do, as plain data valid by construction: the `Config`
//! (server settings and apps), and the names and paths an app may have.

use std::path::PathBuf;
use std::time::Duration;

use super::access::{Allow, Trust};
use super::discover::AppSource;
use super::isolation::Isolation;
use super::otel::Otlp;
use super::publish::settings::Publishing;
use super::users::{Account, RunAs};

/// valve's own paths: never an app's, never forwarded to R.
pub const ADMIN_PREFIX: &str = "/__valve__";

/// Whether a path is one of valve's own (`/__valve__` or below it).
pub fn is_admin_path(path: &str) -> bool {
    path.strip_prefix(ADMIN_PREFIX).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// A checked configuration: plain data, valid by construction.
#[derive(Clone, Debug)]
pub struct Config {
    pub server: Server,
    /// The apps to serve (one for `-f`), in the order given.
    pub apps: Vec<AppConfig>,
    /// Things worth saying at start-up (folders `--site` skipped).
    pub notes: Vec<String>,
    /// What was said of the apps' own uids (given now, kept outside the range).
    pub uids: super::uid_store::UidNotes,
}

impl Config {
    /// What a configuration that starts may still get wrong (`--check` and
    /// the start-up log say it): apps nobody can use, apps that share
    /// valve's user or run as root, files only permissions hide.
    pub fn warnings(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .apps
            .iter()
            .filter(|a| a.allow.names_nobody())
            .map(|a| {
                format!(
                    "app `{}`: allow_users and allow_groups name nobody, so every request gets 403; list users or groups, or remove both to open it",
                    a.name
                )
            })
            .collect();
        out.extend(self.uids.warnings.iter().cloned());
        let r_apps = || self.apps.iter().filter(|a| !a.is_static());
        for a in r_apps().filter(|a| a.account.kind == super::users::AccountKind::Root) {
            out.push(format!(
                "app `{}`: run_as = \"root\": its R runs as root and can read and change everything valve can, other apps included",
                a.name
            ));
        }
        let published = |a: &AppConfig| self.server.publish.as_ref().is_some_and(|p| a.folder().starts_with(&p.dir));
        // A published version is its app's group's to add to (valve gives it so).
        for a in r_apps().filter(|a| !published(a) && !super::users::can_write(&a.account, &a.folder())) {
            out.push(format!(
                "app `{}`: its folder {} is read-only to its user {}: what it writes beside its code (a log folder, a SQLite file) fails; give it the folder (chown -R {} {}: its uid never moves) or have it write under its home (HOME)",
                a.name,
                a.folder().display(),
                a.account.describe(),
                a.account.uid,
                a.folder().display()
            ));
        }
        match self.server.isolation {
            Isolation::Shared if r_apps().next().is_some() => out.push(format!(
                "valve runs as uid {} and cannot switch users (that needs root): every app's R runs as this same user, so apps can read each other's files, signal each other's workers and valve; run valve as root to give each app a user of its own",
                self.server.valve_uid
            )),
            Isolation::Landlock(abi) if r_apps().next().is_some() => {
                let c = crate::config::LandlockCoverage::of(abi);
                out.push(format!(
                    "valve runs as uid {} and cannot switch users: each app's R runs as this same user under a Landlock ruleset of its own ({}){}",
                    self.server.valve_uid,
                    c.describe(),
                    if c.full() { "" } else { "; set isolation = \"required\" to refuse to start with less, or use a kernel with Landlock ABI 6 (Linux 6.12)" }
                ));
            }
            Isolation::Users if r_apps().next().is_some() => out.push(
                "valve cannot make mount namespaces here (a container without CAP_SYS_ADMIN?): each app runs as a user of its own, but sees every file its user may read, so other apps' folders and the config file are hidden only by their permissions (chmod o-rwx them, or give valve CAP_SYS_ADMIN)".into(),
            ),
            _ => {}
        }
        out
    }
}

/// `off` (or empty) turns the admin listener off.
pub(super) fn admin_addr(value: &str) -> Option<String> {
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
    /// Shiny: the most bytes held for one session's browser (messages sent,
    /// not yet acknowledged). At least 64KiB.
    pub shiny_session_buffer: u64,
    /// Shiny: the most bytes held for all sessions together. At least
    /// `shiny_session_buffer`.
    pub shiny_buffer_total: u64,
    /// Who is calling: trusted proxies, identity header names, the sign-in URL.
    pub trust: Trust,
    /// Publishing (`publish_dir`), when on.
    pub publish: Option<Publishing>,
    /// Where valve keeps what outlives a run: each app's private home.
    pub state_dir: PathBuf,
    /// What valve can give apps (own users, a private view), from what it
    /// runs as and what the kernel allows.
    pub isolation: Isolation,
    /// Who may use valve's admin pages besides its operator token and admin keys.
    pub admin_access: AdminAccess,
    /// valve's own uid, for messages.
    pub valve_uid: u32,
    /// The package builders' uids, one per build slot (as root; else none:
    /// builds run as valve's user under Landlock).
    pub builder_uids: Vec<u32>,
    /// Files and folders of valve's own that no app sees (the config file,
    /// the site folder, the state directory).
    pub private_paths: Vec<PathBuf>,
    /// Where Shiny sessions and requests per user per hour are appended
    /// (JSON lines) and read back from at start.
    pub usage_log: Option<PathBuf>,
    /// Keep a keyed hash instead of each user in the usage list and log.
    pub usage_anonymize: bool,
    /// Workers start as forks of one warm R parent shared by apps.
    pub warm_parent: bool,
    /// Packages the warm parent loads besides plumber, shiny and rmarkdown.
    pub preload_packages: Vec<String>,
    /// Where spans go (`None`: valve records none).
    pub otlp: Option<Otlp>,
    /// Restores of the packages apps name (`manifest.json`, `renv.lock`).
    pub packages: PackageSettings,
    /// HTTPS, when on.
    pub tls: Option<super::tls::Tls>,
}

/// Who may use valve's admin pages (every one of them but health and
/// readiness asks who is calling): the operator token (`token_file`, else
/// one valve makes at start), admin publish keys, and the users and groups
/// a trusted sign-in proxy names that are listed here.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdminAccess {
    pub token_file: Option<PathBuf>,
    pub users: Vec<String>,
    pub groups: Vec<String>,
}

/// How apps' packages are restored: the shared cache, the repositories,
/// the builds (`[packages]` and `[repositories]`).
#[derive(Clone, Debug, PartialEq)]
pub struct PackageSettings {
    /// Built packages, fetched tarballs and app libraries, shared by all apps.
    pub cache_dir: PathBuf,
    /// Repository name to URL (http, https or file; no trailing `/`): overrides
    /// the URL a manifest or lockfile gives.
    pub repositories: Vec<(String, String)>,
    /// Only the mapped repositories are used.
    pub repositories_only: bool,
    /// Packages built at once (1 to 256).
    pub builds: usize,
    /// The longest one package's build may take.
    pub build_timeout: Duration,
    /// Apps that name no packages use the server's site library (else R's own alone).
    pub site_library: bool,
}

impl PackageSettings {
    /// The defaults, the cache in `state_dir`.
    pub fn defaults(state_dir: &std::path::Path) -> PackageSettings {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        PackageSettings {
            cache_dir: state_dir.join("packages"),
            repositories: Vec::new(),
            repositories_only: false,
            builds: cores.saturating_sub(1).clamp(1, 256),
            build_timeout: Duration::from_secs(900),
            site_library: true,
        }
    }
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
    /// plumber: requests waiting on promises a worker may hold and still take another.
    pub max_pending: usize,
    /// Shiny: the share of a CPU that makes a worker busy for placement (0: never).
    pub busy_threshold: f64,
    /// Shiny: how long a session whose browser's connection dropped is kept
    /// for the browser to come back to (`Duration::ZERO`: off). At most a day.
    pub reconnect_window: Duration,
    pub r_bin: PathBuf,
    pub start_timeout: Duration,
    /// Extra environment variables for the app's workers.
    pub env: Vec<(String, String)>,
    /// Who may use it (`allow_users`, `allow_groups`); applied to new
    /// requests at once on reload, without a new generation.
    pub allow: Allow,
    /// `run_as` as written.
    pub run_as: RunAs,
    /// Whom its R runs as, resolved.
    pub account: Account,
    /// The most memory one of its workers may take (RLIMIT_DATA), in bytes.
    pub memory_limit: Option<u64>,
    /// The most bytes of the app's log (its R output and valve's lines
    /// about it) kept in memory; 0: none. A reload applies it at once.
    pub log_buffer: u64,
    /// A published app's record (its guid): its private home is this
    /// record's, so a name published anew gets an empty one.
    pub instance: Option<String>,
}

impl AppConfig {
    pub fn is_shiny(&self) -> bool {
        self.source.is_shiny()
    }

    /// Static content: valve serves its files, no R worker ever starts.
    pub fn is_static(&self) -> bool {
        self.source.static_root().is_some()
    }

    /// The folder that holds the app: what its workers must see (a saved
    /// router's folder, not the working directory it runs in).
    pub fn folder(&self) -> PathBuf {
        match &self.source {
            AppSource::PlumberRds(p) => p.parent().unwrap_or(std::path::Path::new("/")).to_path_buf(),
            s => s.workdir(),
        }
    }

    /// Whether `other` needs a new generation of workers to serve: any
    /// difference but the allow lists, which apply to requests as they come.
    pub fn same_workers(&self, other: &AppConfig) -> bool {
        AppConfig { allow: other.allow.clone(), log_buffer: other.log_buffer, ..self.clone() } == *other
    }

    /// What the app's kind allows, whatever the flags or defaults say: a
    /// static app holds no place in the worker budget (its pool is empty for
    /// good, `n_min` = `n_max` = 0), and an app that cannot be preloaded (a
    /// `_server.yml` engine's) runs plain workers.
    pub(super) fn fit_to_source(mut self) -> AppConfig {
        if self.is_static() {
            (self.n_min, self.n_max) = (0, 0);
        }
        self.preload &= self.source.preloadable();
        self
    }
}

/// `--worker-transport`: clap allows only `frames` and `httpuv`.
pub(super) fn transport(value: &str) -> Transport {
    match value {
        "httpuv" => Transport::Httpuv,
        _ => Transport::Frames,
    }
}

/// An app's label: used in logs, metric labels and URLs of `--site`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 100 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
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
    if is_admin_path(&prefix) {
        return Err("/__valve__ is valve's own; pick another path".into());
    }
    Ok(prefix)
}
