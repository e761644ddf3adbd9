//! Reloading on demand (SIGHUP, `POST /__valve__/reload`, a deployment):
//! the configuration read again and applied to the apps.

use std::sync::Arc;

use super::{Apps, Plan};
use crate::config::{Config, LoadError, Source};

/// Reads the configuration again and applies it: SIGHUP and
/// `POST /__valve__/reload`.
pub struct Reloader {
    pub apps: Arc<Apps>,
    source: Source,
    /// The server settings valve started with (those a reload cannot change).
    started: Config,
}

impl Reloader {
    pub fn new(apps: Arc<Apps>, source: Source, started: Config) -> Arc<Reloader> {
        Arc::new(Reloader { apps, source, started })
    }

    /// Where the configuration comes from (what a reload reads).
    pub fn source(&self) -> &Source {
        &self.source
    }

    /// The configuration valve started with.
    pub fn started(&self) -> &Config {
        &self.started
    }

    /// Reloads, or says why nothing changed.
    pub async fn reload(&self) -> Result<Plan, LoadError> {
        self.reload_with(None).await
    }

    /// Reloads with one published app at `candidate`'s version rather than
    /// the one its record names (a deployment starts it so, and records it
    /// only once it serves).
    pub async fn reload_with(&self, candidate: Option<crate::config::publish::Candidate>) -> Result<Plan, LoadError> {
        let source = self.source.clone();
        let loaded =
            tokio::task::spawn_blocking(move || source.load_with(candidate.as_ref())).await.unwrap_or_else(|e| {
                Err(LoadError::Flags(crate::config::ConfigError::Unreadable {
                    path: String::new(),
                    reason: e.to_string(),
                }))
            });
        let config = match loaded {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(source = %self.source.describe(), "reload refused, nothing changed:\n{e}");
                return Err(e);
            }
        };
        let (old, new) = (&self.started.server, &config.server);
        for (what, changed) in [
            ("host", old.host != new.host),
            ("port", old.port != new.port),
            ("workers", old.threads != new.threads),
            ("admin_addr", old.admin_addr != new.admin_addr),
            ("log_format", old.log_json != new.log_json),
            ("worker_transport", old.worker_transport != new.worker_transport),
            ("publish_*", old.publish != new.publish),
            ("otlp_endpoint", old.otlp != new.otlp),
        ] {
            if changed {
                tracing::warn!(
                    setting = what,
                    "this setting changes only when valve restarts; the rest of the reload applies"
                );
            }
        }
        for note in config.notes.iter().chain(&config.uids.notes) {
            tracing::info!("{note}");
        }
        for warning in config.warnings() {
            tracing::warn!("{warning}");
        }
        let plan = self.apps.reload(config).await;
        tracing::info!(source = %self.source.describe(), added = ?plan.added, changed = ?plan.changed,
            removed = ?plan.removed, unchanged = plan.unchanged.len(), "reloading");
        Ok(plan)
    }
}
