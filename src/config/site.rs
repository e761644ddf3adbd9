//! A folder of apps (`--site DIR`): which sub-folders are apps, and where
//! each is served.

use std::path::{Path, PathBuf};

use super::discover::{self, AppSource};
use super::error::ConfigError;
use super::model::{valid_name, AppConfig};

/// A folder of apps (`--site DIR`): each sub-folder holding a plumber API, a
/// Shiny app, an interactive R Markdown or Quarto document, a `_server.yml`
/// app or static content (an
/// `index.html` and no R), served at `/<folder>` with the flags' settings. Folders that
/// hold no app, hidden ones and names that are not plain URL segments are
/// skipped (and said so in `notes`).
pub(super) fn site(
    dir: &Path,
    template: impl Fn(AppSource, String, String) -> Result<AppConfig, ConfigError>,
) -> Result<(Vec<AppConfig>, Vec<String>), ConfigError> {
    let entries = std::fs::read_dir(dir).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => ConfigError::NotFound {
            path: dir.display().to_string(),
            what: "--site: a folder whose sub-folders are apps".into(),
        },
        _ => ConfigError::Unreadable { path: dir.display().to_string(), reason: e.to_string() },
    })?;
    let mut folders: Vec<PathBuf> = entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
    folders.sort();
    let mut apps = Vec::new();
    let mut notes = Vec::new();
    for folder in folders {
        let name = folder.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if name.starts_with('.') {
            continue;
        }
        if !valid_name(&name) {
            notes.push(format!(
                "--site: skipping {}: its name is not a plain URL segment (letters, digits, -, _, .)",
                folder.display()
            ));
            continue;
        }
        match discover::resolve(&folder, "--site") {
            Ok(source) => apps.push(template(source, name.clone(), format!("/{name}"))?),
            Err(ConfigError::EmptyDir(_)) => {
                notes.push(format!(
                    "--site: skipping {}: it holds no _server.yml, plumber.R, entrypoint.R, app.R, server.R, R Markdown or Quarto document, or index.html",
                    folder.display()
                ));
            }
            Err(ConfigError::QuartoNotInteractive(doc)) => {
                notes.push(format!(
                    "--site: skipping {}: its Quarto document {doc} has no `server: shiny` in its front matter",
                    folder.display()
                ));
            }
            Err(ConfigError::NotInteractive(doc)) => {
                notes.push(format!(
                    "--site: skipping {}: its document {doc} has no `runtime: shiny` or `runtime: shiny_prerendered` in its front matter",
                    folder.display()
                ));
            }
            Err(e) => return Err(e),
        }
    }
    if apps.is_empty() {
        return Err(ConfigError::EmptySite(dir.display().to_string()));
    }
    Ok((apps, notes))
}
