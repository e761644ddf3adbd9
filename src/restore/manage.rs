//! Managing the cache: which app folders use which library (`uses/`, one
//! small file per folder, written when a restore ends), the list of what is
//! built with its size and users, and pruning what no existing folder uses.
//!
//! A use is live while its folder exists: a published version's folder goes
//! when the version is pruned, so its library and the packages only it used
//! go at the next prune. Restores hold `GATE` shared and a prune holds it
//! alone, so a prune never removes what a restore is about to link.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::cache::{sha256_hex, Cache};

/// Restores share it; a prune takes it alone.
pub(super) static GATE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// One app folder's use of one library.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Use {
    pub app: String,
    pub folder: PathBuf,
    /// The library's key (its folder in `libs/`).
    pub library: String,
}

fn uses_dir(cache: &Cache) -> PathBuf {
    cache.root.join("uses")
}

/// Records that `app` in `folder` uses the library `key`.
pub(super) fn record(cache: &Cache, app: &str, folder: &Path, key: &str) {
    let dir = uses_dir(cache);
    let u = Use { app: app.to_string(), folder: folder.to_path_buf(), library: key.to_string() };
    let file = dir.join(format!("{}.json", &sha256_hex(folder.as_os_str().as_encoded_bytes())[..24]));
    let staged = cache.fresh("use");
    let written = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(&staged, serde_json::to_vec(&u).unwrap_or_default()))
        .and_then(|()| std::fs::rename(&staged, &file));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&staged);
        tracing::warn!(app, error = %e, path = %file.display(), "cannot record which library the app uses; a prune may remove it");
    }
}

/// Every recorded use, and whether its folder still exists.
fn uses(cache: &Cache) -> Vec<(PathBuf, Use, bool)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(uses_dir(cache)).into_iter().flatten().flatten() {
        let Ok(text) = std::fs::read(entry.path()) else { continue };
        let Ok(u) = serde_json::from_slice::<Use>(&text) else { continue };
        let live = u.folder.is_dir();
        out.push((entry.path(), u, live));
    }
    out
}

/// One built package in the cache.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub package: String,
    pub version: String,
    /// The R it was built for (`R-4.2.2-x86_64-pc-linux-gnu`).
    pub r: String,
    pub bytes: u64,
    /// The apps whose library links it, by name.
    pub apps: Vec<String>,
    pub path: PathBuf,
}

/// The built packages (`built/R/NAME/VERSION-SHA/NAME`), each with the apps using it.
pub fn list(cache: &Cache) -> Vec<Row> {
    let users = linked_by(cache, true);
    let mut rows = Vec::new();
    for (r, name, entry) in built_entries(cache) {
        let package = entry.join(&name);
        let version = super::cache::installed_version(&package).unwrap_or_default();
        let apps = users.get(&package).map(|a| a.iter().cloned().collect()).unwrap_or_default();
        rows.push(Row { package: name, version, r, bytes: size(&entry), apps, path: package });
    }
    rows.sort_by(|a, b| (&a.package, &a.version, &a.r).cmp(&(&b.package, &b.version, &b.r)));
    rows
}

/// `(R key, package name, entry folder)` of every built entry.
fn built_entries(cache: &Cache) -> Vec<(String, String, PathBuf)> {
    let mut out = Vec::new();
    let read = |p: &Path| std::fs::read_dir(p).into_iter().flatten().flatten().collect::<Vec<_>>();
    for r in read(&cache.root.join("built")) {
        for name in read(&r.path()) {
            for entry in read(&name.path()) {
                out.push((
                    r.file_name().to_string_lossy().into_owned(),
                    name.file_name().to_string_lossy().into_owned(),
                    entry.path(),
                ));
            }
        }
    }
    out
}

/// Each package folder linked from a library some use names (only live
/// uses when `live_only`), with the apps of those uses.
fn linked_by(cache: &Cache, live_only: bool) -> BTreeMap<PathBuf, BTreeSet<String>> {
    let mut out: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    for (_, u, live) in uses(cache) {
        if live_only && !live {
            continue;
        }
        for link in std::fs::read_dir(cache.libs().join(&u.library)).into_iter().flatten().flatten() {
            if let Ok(target) = std::fs::read_link(link.path()) {
                out.entry(target).or_default().insert(u.app.clone());
            }
        }
    }
    out
}

/// What is left in the cache's `tmp/` this long was left by a restore that
/// was killed (valves sharing the cache build there at once; no build runs
/// this long: `package_build_timeout`).
const STALE_TMP: std::time::Duration = std::time::Duration::from_secs(6 * 3600);

/// What a prune removed.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Pruned {
    pub libraries: usize,
    pub packages: Vec<String>,
    pub tarballs: usize,
    pub bytes: u64,
}

/// Removes the libraries no existing folder uses, the built packages no
/// remaining library links, the tarballs of packages no longer built, and
/// what killed restores left in `tmp/`.
pub async fn prune(cache: &Cache) -> Pruned {
    let _alone = GATE.write().await;
    let cache = cache.clone();
    tokio::task::spawn_blocking(move || prune_now(&cache)).await.unwrap_or_default()
}

fn prune_now(cache: &Cache) -> Pruned {
    let mut pruned = Pruned::default();
    let all = uses(cache);
    let live: BTreeSet<&str> = all.iter().filter(|(_, _, l)| *l).map(|(_, u, _)| u.library.as_str()).collect();
    for (file, _, is_live) in &all {
        if !is_live {
            let _ = std::fs::remove_file(file);
        }
    }
    let remove = |path: &Path, pruned: &mut Pruned| {
        let bytes = size(path);
        if std::fs::remove_dir_all(path).is_ok() || std::fs::remove_file(path).is_ok() {
            pruned.bytes += bytes;
            true
        } else {
            false
        }
    };
    for lib in std::fs::read_dir(cache.libs()).into_iter().flatten().flatten() {
        if !live.contains(lib.file_name().to_string_lossy().as_ref()) && remove(&lib.path(), &mut pruned) {
            pruned.libraries += 1;
        }
    }
    let linked = linked_by(cache, true);
    let mut kept: BTreeSet<(String, String)> = BTreeSet::new();
    for (_, name, entry) in built_entries(cache) {
        let package = entry.join(&name);
        let version = super::cache::installed_version(&package).unwrap_or_default();
        if linked.contains_key(&package) {
            kept.insert((name, version));
        } else if remove(&entry, &mut pruned) {
            pruned.packages.push(format!("{name} {version}"));
        }
    }
    for tarball in std::fs::read_dir(cache.src()).into_iter().flatten().flatten() {
        let file = tarball.file_name().to_string_lossy().into_owned();
        let still = kept.iter().any(|(n, v)| file.starts_with(&format!("{n}_{v}-")));
        if !still && remove(&tarball.path(), &mut pruned) {
            pruned.tarballs += 1;
        }
    }
    // What a restore killed midway left: none of this valve's runs now (the
    // gate is ours), but another valve sharing the cache may be building, so
    // only what nobody touched for `STALE_TMP`.
    for left in std::fs::read_dir(cache.tmp()).into_iter().flatten().flatten() {
        let age = left.metadata().and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
        if age.is_some_and(|a| a >= STALE_TMP) {
            remove(&left.path(), &mut pruned);
        }
    }
    pruned
}

/// Bytes under `path`, links not followed.
fn size(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else { return 0 };
    if !meta.is_dir() {
        return meta.len();
    }
    std::fs::read_dir(path).into_iter().flatten().flatten().map(|e| size(&e.path())).sum()
}
