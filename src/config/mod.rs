//! Flags, environment variables (and, for several apps, a config file) in; a
//! checked `Config` out. Only this module knows about clap and `VALVE_*`
//! variables; everything else reads plain data.
//!
//! Parsing is two steps, like ripgrep: `flags::Args` is what the user typed,
//! `Config` is what valve will do, and the conversion says what is wrong with
//! the first before anything binds a port or starts R.
//!
//! Its files, from the bottom: `access` (who may call: trusted proxies,
//! identity headers, allow lists), `error` (refusals and units), `rmd`
//! (interactive R Markdown and Quarto: front matter, a folder's document,
//! what a render writes), `engine` (`_server.yml`: the engine it names), `discover` (what kind of app a path is), `model` (the
//! checked `Config`, app names and prefixes, valve's own admin path),
//! `problems` (a config file's
//! problems with line and column), `keys` (the names of its settings),
//! `users` (whom an app's R runs as: `run_as`, an app's own uid, what the
//! kernel lets valve do), `uids` and `uid_store` (the table of the uids
//! given, which never move, and its file), `secret_file` (whether a file of
//! keys may be trusted), `settle` (accounts and readable folders, once
//! every app is read), `site` (`--site`), `flags` (clap), `file` (the TOML
//! reader), `source` (where a configuration comes from, for reloads),
//! `publish` (publishing's settings, keys file and records, and the
//! published apps as data), `otel` (where traces go: `--otlp-endpoint` and
//! OpenTelemetry's `OTEL_*` variables), `table` (what `--check` prints of a
//! valid configuration).

mod access;
mod discover;
mod engine;
mod error;
mod file;
mod flags;
mod isolation;
mod keys;
mod model;
mod otel;
mod problems;
pub mod publish;
pub mod reference;
mod rmd;
pub mod secret_file;
mod settle;
mod site;
mod source;
mod table;
pub mod tls;
pub(crate) mod uid_store;
mod uids;
mod users;

pub use access::{Allow, AuthService, Cidr, Trust};
pub use discover::{index_html, AppSource};
pub use error::{parse_seconds, parse_size, usage_log_is_folder, ConfigError};
pub use flags::{Args, Command, PackageFlags};
pub use isolation::{Isolation, IsolationSetting, LandlockCoverage};
pub use model::{
    is_admin_path, normal_prefix, valid_name, AdminAccess, AppConfig, Config, PackageSettings, Server, Transport,
    ADMIN_PREFIX,
};
pub use otel::Otlp;
pub use problems::{Problem, Problems};
pub use rmd::{is_output_of_a_document, Runtime};
pub use source::{LoadError, Source};
pub use table::{summary, table};
pub use uid_store::{Store as UidStore, UidNotes};
pub use users::{blocked_ancestor, Account, AccountKind, Kernel, RunAs, DEFAULT_UID_RANGE};

/// The machine's name (a pod's, under Kubernetes): which of a site's valves
/// this is, in status, usage files and locks; empty if the kernel says none.
pub fn host_name() -> &'static str {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default()
    })
}

/// A test's hook, `VALVE_HOOK_NAME` in valve's environment: read only in a
/// build with the `test-hooks` feature (never one users get).
#[cfg(feature = "test-hooks")]
pub fn hook(name: &str) -> Option<std::ffi::OsString> {
    std::env::var_os(format!("VALVE_HOOK_{name}"))
}
