//! What other valves sharing `publish_dir` change: every `EVERY` the
//! records' file stamps are looked at (network file systems deliver no
//! change events, and a look at a few hundred stamps costs microseconds),
//! and when one changed, the records are read; if what they say is served
//! (each app's active version and who may use it) differs from what this
//! valve last saw, valve reloads, as a deployment here would: the new
//! version starts beside the old one and takes over once it serves.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::publisher::Publisher;
use super::store;
use crate::config::publish::{AppRecord, RECORD};

/// How often the records' stamps are looked at.
pub const EVERY: Duration = Duration::from_millis(500);

/// Each record file's name, size, modification time and inode.
type Stamps = Vec<(std::ffi::OsString, u64, Option<std::time::SystemTime>, u64)>;

/// What the records say is served: by app, its active version and its allow lists.
type View = BTreeMap<String, (Option<u32>, Option<Vec<String>>, Option<Vec<String>>)>;

fn stamps(dir: &Path) -> Stamps {
    use std::os::unix::fs::MetadataExt;
    let mut out: Stamps = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                .filter_map(|e| {
                    let m = std::fs::metadata(e.path().join(RECORD)).ok()?;
                    Some((e.file_name(), m.len(), m.modified().ok(), m.ino()))
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

fn view(records: &[AppRecord]) -> View {
    records.iter().map(|r| (r.name.clone(), (r.active, r.allow_users.clone(), r.allow_groups.clone()))).collect()
}

impl Publisher {
    /// The watch: a loop the publisher owns (it ends with the publisher).
    pub(super) fn watch_records(self: &Arc<Self>) {
        let this = Arc::downgrade(self);
        let dir = self.settings.dir.clone();
        let first = self.locked(store::all).map(|r| view(&r)).unwrap_or_default();
        tokio::spawn(async move {
            let look = move || {
                let dir = dir.clone();
                async move { tokio::task::spawn_blocking(move || stamps(&dir)).await.unwrap_or_default() }
            };
            let (mut stamped, mut seen) = (look().await, first);
            loop {
                tokio::time::sleep(EVERY).await;
                let now = look().await;
                if now == stamped {
                    continue;
                }
                let Some(p) = this.upgrade() else { return };
                // A deployment here reloads itself; what it leaves changed is
                // looked at after. Only asked, not held: held across the
                // reload below, an upload's prune would skip its turn.
                if p.deploying.try_lock().is_err() {
                    continue;
                }
                stamped = now;
                let records = match p.locked(store::all) {
                    Ok(r) => r,
                    Err(f) => {
                        tracing::warn!(target: "valve::publish", error = %f.message,
                            "cannot read the published apps' records");
                        continue;
                    }
                };
                let current = view(&records);
                if current == seen {
                    continue;
                }
                let changed: Vec<&String> = current
                    .iter()
                    .filter(|(name, v)| seen.get(*name) != Some(v))
                    .map(|(n, _)| n)
                    .chain(seen.keys().filter(|n| !current.contains_key(*n)))
                    .collect();
                tracing::info!(target: "valve::publish", apps = ?changed,
                    "published apps changed in publish_dir (a deployment by another valve sharing it): reloading");
                seen = current;
                let _ = p.reloader.reload().await;
                p.refresh();
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_rewritten_changes_the_stamps_and_hidden_folders_do_not() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("api")).unwrap();
        std::fs::create_dir_all(dir.path().join(".tasks")).unwrap();
        std::fs::write(dir.path().join(".tasks").join(RECORD), "{}").unwrap();
        let empty = stamps(dir.path());
        assert!(empty.is_empty(), "a folder without a record and hidden ones count for nothing");
        std::fs::write(dir.path().join("api").join(RECORD), "{\"id\":1}").unwrap();
        let one = stamps(dir.path());
        assert_eq!(one.len(), 1);
        // Written whole through a rename, as records are: a new inode.
        std::fs::write(dir.path().join("api").join("next"), "{\"id\":1} ").unwrap();
        std::fs::rename(dir.path().join("api").join("next"), dir.path().join("api").join(RECORD)).unwrap();
        assert_ne!(stamps(dir.path()), one);
    }
}
