//! Every app's log: what its R processes printed (stdout and stderr, per
//! worker; a fork's one stream) and valve's own lines about it, kept in a
//! buffer per app that is bounded in bytes (`log_buffer`), read whole or
//! followed (`/__valve__/apps/NAME/logs`). Fed by the app's output hook
//! (`AppLog` is a `worker::OutputHook`, set where the app's generations are
//! built) and by `Layer`, a tracing layer that hands valve's events carrying
//! an `app` field to that app's buffer.
//!
//! Rooms: `buffer` (one app's bounded ring, read in batches by sequence
//! number, so a follower needs no queue of its own), `layer`.

mod buffer;
mod layer;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

pub use buffer::{AppLog, Batch, Line, Origin};
pub use layer::Layer;

/// What an app's log keeps unless `log_buffer` says otherwise: 1 MiB, some
/// ten thousand lines of R output.
pub const DEFAULT_BYTES: u64 = 1 << 20;

/// Every app's log, by app name.
#[derive(Default)]
pub struct Logs {
    apps: RwLock<HashMap<String, Arc<AppLog>>>,
}

impl Logs {
    /// App `name`'s log, created on first use and kept across reloads of the
    /// app; its bound becomes `bytes` (0: nothing is kept).
    pub fn app(&self, name: &str, bytes: u64) -> Arc<AppLog> {
        let bound = usize::try_from(bytes).unwrap_or(usize::MAX);
        if let Some(log) = self.get(name) {
            log.set_bound(bound);
            return log;
        }
        let mut apps = self.apps.write().unwrap_or_else(|p| p.into_inner());
        apps.entry(name.to_string()).or_insert_with(|| Arc::new(AppLog::new(bound))).clone()
    }

    /// App `name`'s log, made with `bytes` as its bound if it has none yet.
    pub fn app_log(&self, name: &str, bytes: u64) -> Arc<AppLog> {
        match self.get(name) {
            Some(log) => log,
            None => self.app(name, bytes),
        }
    }

    /// App `name`'s log, if it has one.
    pub fn get(&self, name: &str) -> Option<Arc<AppLog>> {
        self.apps.read().unwrap_or_else(|p| p.into_inner()).get(name).cloned()
    }

    /// Forgets the logs of apps no longer served (a reload removed them).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.apps.write().unwrap_or_else(|p| p.into_inner()).retain(|name, _| keep(name));
    }
}
