//! Before an app's generation starts: the packages it names (its
//! `manifest.json` or `renv.lock`) restored into its own library, every
//! line said in its log. Apps restore side by side (builds within
//! `package_builds`); one whose restore fails is left out, the others start.

use std::collections::BTreeMap;

use super::Apps;
use crate::config::{AppConfig, Config};
use crate::restore::{self, Library};
use crate::worker::sandbox::Site;

/// Each R app's library (`None`: it names no packages), or why it has none.
pub type Libraries = BTreeMap<String, Result<Option<Library>, String>>;

impl Apps {
    /// Restores what each app of `config` names (`only`: these apps alone).
    pub(super) async fn restore_all(&self, config: &Config, site: &Site, only: Option<&[String]>) -> Libraries {
        let apps: Vec<&AppConfig> = config
            .apps
            .iter()
            .filter(|a| !a.is_static())
            .filter(|a| only.is_none_or(|o| o.contains(&a.name)))
            .collect();
        let jobs = apps.into_iter().map(|app| async move {
            let say = |line: String| tracing::info!(app = %app.name, "{line}");
            let got = self.restore_one(app, config, site, &say).await;
            (app.name.clone(), got)
        });
        futures_util::future::join_all(jobs).await.into_iter().collect()
    }

    /// Restores what `app` names, saying each step with `say`.
    pub async fn restore_one(
        &self,
        app: &AppConfig,
        config: &Config,
        site: &Site,
        say: restore::Say<'_>,
    ) -> Result<Option<Library>, String> {
        // Most apps name nothing: nothing to make, no R asked.
        if config.server.packages.site_library && matches!(restore::lock::read(&app.folder()), Ok(None)) {
            return Ok(None);
        }
        // Made before the app's sandbox, which shows it.
        let _ = restore::cache::Cache::open(&config.server.packages.cache_dir);
        let (spec, _) = self.spec(app, site).map_err(|e| e.to_string())?;
        let via = crate::worker::builders::Builds { builders: &self.starters.builders, site };
        let got = restore::restore(&app.folder(), &spec, via, &config.server.packages, say).await;
        if let Err(e) = &got {
            tracing::error!(app = %app.name, error = %e, "the app's packages could not be restored: it does not start");
        }
        got
    }
}
