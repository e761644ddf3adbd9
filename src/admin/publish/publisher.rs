//! The publisher's state: its settings, the keys (read again when their
//! file changes), the tasks, the locks that keep one record writer and one
//! deployment at a time, and a summary of the published apps for the status
//! page and metrics; `publish_dir` holds the rest.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use http::HeaderMap;

use super::lease;
use super::store;
use super::tasks::Tasks;
use super::unpack::Modes;
use crate::config::publish::{read_keys, PublishKeys, Publishing};
use crate::reload::Reloader;

/// Where deployments' logs are shared in `publish_dir`.
pub const TASKS: &str = ".tasks";

/// The lease in `publish_dir` around each change of the records.
pub const RECORDS_LOCK: &str = ".records.lock";

/// A records lease unchanged this long was left by a valve that died (a
/// change of the records takes milliseconds, removing an old version seconds).
const RECORDS_STALE: std::time::Duration = std::time::Duration::from_secs(15);

/// The longest a change of the records waits for another valve's.
const RECORDS_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Where valve's own pages of published apps live (admin listener only).
pub const PAGES: &str = "/__valve__/published/";

/// The publishing API and what it keeps in memory (tasks, a summary of the
/// published apps for the status page and metrics); `publish_dir` holds the rest.
pub struct Publisher {
    pub(super) settings: Publishing,
    pub(super) keys: Mutex<(Option<SystemTime>, PublishKeys)>,
    pub(super) tasks: Tasks,
    pub(super) reloader: Arc<Reloader>,
    /// The apps' base URL, for what clients print.
    pub(super) base_url: String,
    /// One read-modify-write of records at a time.
    pub(super) records: Mutex<()>,
    /// One deployment at a time.
    pub(super) deploying: tokio::sync::Mutex<()>,
    /// One prune at a time: a prune waits for one that runs (which may have
    /// read the records before an upload's), never skips because of it.
    pub(super) pruning: Mutex<()>,
    /// Who may read what is unpacked: with apps that run as users of their
    /// own, only root and the app's group.
    pub(super) modes: Modes,
    /// Each published app's active version, when and by which key.
    pub(super) summary: Mutex<BTreeMap<String, Summary>>,
    /// Deployments by app and outcome (true: switched).
    pub(super) deployments: Mutex<BTreeMap<(String, bool), u64>>,
}

/// Every published app's record (`app.json`) valve's alone (0600: an
/// older valve wrote them readable by all).
fn private_records(settings: &Publishing) {
    use std::os::unix::fs::PermissionsExt;
    for record in store::all(settings).unwrap_or_default() {
        let path = crate::config::publish::app_dir(&settings.dir, &record.name).join(crate::config::publish::RECORD);
        let private = std::fs::symlink_metadata(&path).map(|m| m.is_file()).and_then(|file| {
            if file {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            } else {
                Ok(())
            }
        });
        if let Err(e) = private {
            tracing::warn!(target: "valve::publish", path = %path.display(), error = %e,
                "cannot make a published app's record valve's alone");
        }
    }
}

/// With apps that run as users of their own: the publish folder and each
/// app's folder 0711 (passable, not listable), and every kept version given
/// to its app's group (versions unpacked before valve did so were readable
/// by everyone). Problems are logged; the apps are served regardless.
fn lock_down(settings: &Publishing, apps: &[crate::config::AppConfig]) {
    let warn = |path: &std::path::Path, e: std::io::Error| {
        tracing::warn!(target: "valve::publish", path = %path.display(), error = %e,
            "cannot make a published folder private to its app (check publish_dir's owner)")
    };
    if let Err(e) = std::fs::create_dir_all(&settings.dir).and_then(|_| store::unlisted(&settings.dir)) {
        warn(&settings.dir, e);
    }
    for record in store::all(settings).unwrap_or_default() {
        let dir = crate::config::publish::app_dir(&settings.dir, &record.name);
        if let Err(e) = store::unlisted(&dir) {
            warn(&dir, e);
        }
        let gid = apps.iter().find(|a| a.name == record.name && a.account.isolated()).map_or(0, |a| a.account.gid);
        for v in &record.versions {
            let folder = crate::config::publish::version_dir(&dir, v.version);
            if let Err(e) = store::give_group(&folder, gid) {
                warn(&folder, e);
            }
        }
    }
}

/// The key a publishing call came with: its name, its place in the keys
/// file (from 1: the account id clients see), and whether it is an admin key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub name: String,
    pub number: usize,
    pub admin: bool,
}

/// Whether `caller` may change published app `record` (upload, deploy, roll
/// back, set access, read its tasks): its owner or an admin key; else a 403
/// naming the app, its owner and what to do.
pub fn may_change(caller: &Caller, record: &crate::config::publish::AppRecord) -> Result<(), store::Fail> {
    if caller.admin || record.owner.as_deref() == Some(caller.name.as_str()) {
        return Ok(());
    }
    let message = match &record.owner {
        Some(owner) => format!(
            "the published app `{}` belongs to the key `{owner}`, not to `{}`: publish under another name, or ask its owner or an admin key (marked `admin` in publish_keys_file)",
            record.name, caller.name
        ),
        None => format!(
            "the published app `{}` was published before valve recorded owners, so only an admin key (marked `admin` in publish_keys_file) may change it; an operator can give it an owner with `\"owner\": \"KEYNAME\"` in its app.json",
            record.name
        ),
    };
    Err(store::Fail::new(http::StatusCode::FORBIDDEN, message))
}

/// What the status page and metrics say of a published app.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Summary {
    /// The key that published it (its owner).
    pub owner: Option<String>,
    pub version: Option<u32>,
    pub versions: Vec<u32>,
    pub activated: Option<u64>,
    pub activated_by: Option<String>,
}

impl Publisher {
    /// `addr` is the main listener's: where the published apps are served.
    pub fn new(settings: Publishing, reloader: Arc<Reloader>, base_url: String) -> Arc<Publisher> {
        let modified = std::fs::metadata(&settings.keys_file).and_then(|m| m.modified()).ok();
        // The configuration's load checked the file; should it have changed since, it is read again at the first call.
        let keys = read_keys(&settings.keys_file).unwrap_or_default();
        let started = reloader.started();
        let modes = match started.server.isolation {
            crate::config::Isolation::Shared | crate::config::Isolation::Landlock(_) => Modes::Open,
            _ => Modes::Group,
        };
        if modes == Modes::Group {
            lock_down(&settings, &started.apps);
        }
        private_records(&settings);
        let tasks = Tasks::shared_in(settings.dir.join(TASKS));
        let p = Arc::new(Publisher {
            settings,
            keys: Mutex::new((modified, keys)),
            tasks,
            reloader,
            base_url,
            records: Mutex::new(()),
            deploying: tokio::sync::Mutex::new(()),
            pruning: Mutex::new(()),
            modes,
            summary: Mutex::new(BTreeMap::new()),
            deployments: Mutex::new(BTreeMap::new()),
        });
        p.refresh();
        p.prune_when_generations_end();
        p.watch_records();
        p
    }

    /// Removes, in every published app, the versions `store::prunable`
    /// names (none while a deployment runs: it prunes when it ends).
    /// Blocks while another prune runs: call it off the runtime.
    pub(super) fn prune_all(&self) {
        let _turn = self.pruning.lock().unwrap_or_else(|p| p.into_inner());
        let Ok(_one) = self.deploying.try_lock() else { return };
        let in_use = self.reloader.apps.paths_in_use();
        let names: Vec<String> = self.locked(store::all).unwrap_or_default().into_iter().map(|r| r.name).collect();
        for name in names {
            match self.writing(|s| store::prune(s, &name, &in_use)) {
                Ok(removed) if !removed.is_empty() => tracing::info!(target: "valve::publish", app = %name,
                    versions = ?removed, keep = self.settings.keep, "old published versions removed"),
                Ok(_) => {}
                Err(f) => tracing::warn!(target: "valve::publish", app = %name, error = %f.message,
                    "cannot remove old published versions"),
            }
        }
        self.refresh();
    }

    /// Each time an old generation stops, the versions it alone used may go:
    /// a loop the publisher owns (it ends with the publisher).
    fn prune_when_generations_end(self: &Arc<Self>) {
        let mut ended = self.reloader.apps.generations_ended();
        let this = Arc::downgrade(self);
        tokio::spawn(async move {
            while ended.changed().await.is_ok() {
                let Some(p) = this.upgrade() else { return };
                let _ = tokio::task::spawn_blocking(move || p.prune_all()).await;
            }
        });
    }

    /// Who calls, from `Authorization: Key KEY`, reading the keys file
    /// again if it changed.
    pub(super) fn key_of(&self, headers: &HeaderMap) -> Option<Caller> {
        let presented = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
        let (scheme, key) = presented.trim().split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("key") {
            return None;
        }
        self.key(key.trim())
    }

    /// The key `key` is, if the keys file (read again if it changed) holds it.
    pub fn key(&self, key: &str) -> Option<Caller> {
        let mut cached = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let modified = std::fs::metadata(&self.settings.keys_file).and_then(|m| m.modified()).ok();
        if modified.is_some() && modified != cached.0 {
            match read_keys(&self.settings.keys_file) {
                Ok(keys) => {
                    tracing::info!(target: "valve::publish", keys = keys.len(), "publish_keys_file read again");
                    *cached = (modified, keys);
                }
                Err(e) => tracing::warn!(target: "valve::publish", error = %e,
                    "publish_keys_file changed but has problems: the keys read before stay"),
            }
        }
        let found = cached.1.key_of(key)?;
        let (name, admin) = (found.name.clone(), found.admin);
        let number = cached.1.names().position(|n| n == name).map_or(0, |i| i + 1);
        Some(Caller { name, number, admin })
    }

    /// Runs `f` on the settings with the records lock held.
    pub(super) fn locked<T>(&self, f: impl FnOnce(&Publishing) -> T) -> T {
        let _one = self.records.lock().unwrap_or_else(|p| p.into_inner());
        f(&self.settings)
    }

    /// Runs a read-modify-write `f` of the records with the records lock
    /// held, in this valve and, through a lease in `publish_dir`, among all
    /// the valves that share it.
    pub(super) fn writing<T>(&self, f: impl FnOnce(&Publishing) -> Result<T, store::Fail>) -> Result<T, store::Fail> {
        let _one = self.records.lock().unwrap_or_else(|p| p.into_inner());
        let _all = lease::take_blocking(&self.settings.dir.join(RECORDS_LOCK), RECORDS_STALE, RECORDS_WAIT)
            .map_err(|e| store::Fail::new(http::StatusCode::SERVICE_UNAVAILABLE, e))?;
        f(&self.settings)
    }

    /// The URL of published app `name`.
    pub(super) fn app_url(&self, name: &str) -> String {
        format!("{}/{name}/", self.base_url)
    }

    pub(super) fn counted(&self, app: &str, switched: bool) {
        *self.deployments.lock().unwrap_or_else(|p| p.into_inner()).entry((app.to_string(), switched)).or_default() +=
            1;
    }

    /// Reads the records again for the status page and metrics.
    pub(super) fn refresh(&self) {
        let records = match self.locked(store::all) {
            Ok(r) => r,
            Err(f) => {
                tracing::warn!(target: "valve::publish", error = %f.message, "cannot read the published apps' records");
                return;
            }
        };
        let summary = records
            .iter()
            .map(|r| {
                let current = r.current();
                (
                    r.name.clone(),
                    Summary {
                        owner: r.owner.clone(),
                        version: r.active,
                        versions: r.versions.iter().map(|v| v.version).collect(),
                        activated: current.and_then(|v| v.activated),
                        activated_by: current.and_then(|v| v.activated_by.clone()),
                    },
                )
            })
            .collect();
        *self.summary.lock().unwrap_or_else(|p| p.into_inner()) = summary;
    }

    /// The key that owns published app `name` (`None`: not a published app,
    /// or one published before valve recorded owners: an operator's).
    pub fn owner_of(&self, name: &str) -> Option<String> {
        self.summary.lock().unwrap_or_else(|p| p.into_inner()).get(name).and_then(|s| s.owner.clone())
    }

    /// What the status page says of app `name`, if it is a published one.
    pub fn status_of(&self, name: &str) -> Option<serde_json::Value> {
        let s = self.summary.lock().unwrap_or_else(|p| p.into_inner()).get(name).cloned()?;
        Some(serde_json::json!({
            "version": s.version,
            "versions": s.versions,
            "activated": s.activated.map(store::rfc3339),
            "activated_by": s.activated_by,
        }))
    }

    /// The published apps' metrics, in Prometheus' text format.
    pub fn metrics(&self) -> String {
        metrics(
            &self.summary.lock().unwrap_or_else(|p| p.into_inner()),
            &self.deployments.lock().unwrap_or_else(|p| p.into_inner()),
        )
    }
}

/// The published apps' metrics, in Prometheus' text format.
pub(crate) fn metrics(summary: &BTreeMap<String, Summary>, deployments: &BTreeMap<(String, bool), u64>) -> String {
    let mut out = String::new();
    let head = |out: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };
    head(&mut out, "valve_published_version", "gauge", "The version each published app serves (0: none yet).");
    for (app, s) in summary {
        let _ = writeln!(out, "valve_published_version{{app=\"{app}\"}} {}", s.version.unwrap_or(0));
    }
    head(
        &mut out,
        "valve_published_activated_timestamp_seconds",
        "gauge",
        "When each published app's version became the one it serves (Unix time).",
    );
    for (app, s) in summary.iter().filter(|(_, s)| s.activated.is_some()) {
        let _ =
            writeln!(out, "valve_published_activated_timestamp_seconds{{app=\"{app}\"}} {}", s.activated.unwrap_or(0));
    }
    head(
        &mut out,
        "valve_published_info",
        "gauge",
        "The version each published app serves and the key that made it so (always 1).",
    );
    for (app, s) in summary.iter().filter(|(_, s)| s.version.is_some()) {
        let _ = writeln!(
            out,
            "valve_published_info{{app=\"{app}\",version=\"{}\",key=\"{}\"}} 1",
            s.version.unwrap_or(0),
            s.activated_by.as_deref().unwrap_or("")
        );
    }
    head(&mut out, "valve_publish_deployments_total", "counter", "Deployments by app and result (switched or failed).");
    for ((app, ok), n) in deployments {
        let _ = writeln!(
            out,
            "valve_publish_deployments_total{{app=\"{app}\",result=\"{}\"}} {n}",
            if *ok { "switched" } else { "failed" }
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_owner_or_an_admin_key_may_change_an_app_and_an_ownerless_one_is_admins_only() {
        let who = |name: &str, admin: bool| Caller { name: name.into(), number: 1, admin };
        let mut record =
            crate::config::publish::AppRecord { name: "sales".into(), owner: Some("ann".into()), ..Default::default() };
        assert!(may_change(&who("ann", false), &record).is_ok());
        assert!(may_change(&who("ops", true), &record).is_ok());
        let e = may_change(&who("bob", false), &record).unwrap_err();
        assert_eq!(e.status, http::StatusCode::FORBIDDEN);
        assert!(e.message.contains("`sales` belongs to the key `ann`, not to `bob`"), "{}", e.message);
        record.owner = None;
        let e = may_change(&who("ann", false), &record).unwrap_err();
        assert!(e.message.contains("only an admin key") && e.message.contains("app.json"), "{}", e.message);
        assert!(may_change(&who("ops", true), &record).is_ok());
    }

    #[test]
    fn metrics_name_the_version_and_the_key() {
        let mut summary = BTreeMap::new();
        summary.insert(
            "api".to_string(),
            Summary {
                owner: Some("ci".into()),
                version: Some(3),
                versions: vec![2, 3],
                activated: Some(1_700_000_000),
                activated_by: Some("ci".into()),
            },
        );
        summary.insert("new".to_string(), Summary::default());
        let mut deployments = BTreeMap::new();
        deployments.insert(("api".to_string(), true), 3);
        deployments.insert(("api".to_string(), false), 1);
        let text = metrics(&summary, &deployments);
        for line in [
            "valve_published_version{app=\"api\"} 3",
            "valve_published_version{app=\"new\"} 0",
            "valve_published_activated_timestamp_seconds{app=\"api\"} 1700000000",
            "valve_published_info{app=\"api\",version=\"3\",key=\"ci\"} 1",
            "valve_publish_deployments_total{app=\"api\",result=\"switched\"} 3",
            "valve_publish_deployments_total{app=\"api\",result=\"failed\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        assert!(prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).is_ok());
    }
}
