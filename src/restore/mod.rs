//! Restores the packages an app names (a published bundle's
//! `manifest.json`, an app folder's `renv.lock`) at their exact versions
//! into a library of the app's own, from a cache shared by all apps.
//!
//! `lock` reads what is named, `plan` decides (R's own library holds it,
//! a repository has it, or what to do) and orders the builds, `source`
//! fetches tarballs (R's downloader, as a builder) and checks them before
//! keeping them, `build` builds one as a builder (`worker::builders`: never
//! the app, never valve) and moves it into the `cache`, `copy` without
//! following a link. `names` checks every name and version before it is
//! used as a path or in a URL.
//! An app library is keyed on the lockfile's bytes, R and the repository
//! settings: a redeploy with the same packages finds it whole and builds
//! nothing; a built package is keyed on its tarball's content, so one
//! author's upload never changes what another app loads.

mod build;
pub mod cache;
mod copy;
pub mod counts;
pub mod dcf;
pub mod lock;
pub mod manage;
pub mod names;
pub mod plan;
mod say;
mod source;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::PackageSettings;
use crate::worker::builders::Builds;
use crate::worker::rtools::{self, RFacts};
use crate::worker::Spec;
use cache::{sha256_hex, Cache, Entry, From, Summary};
use plan::Repositories;
pub use say::Say;

/// An app's own library, ready.
#[derive(Clone, Debug)]
pub struct Library {
    /// Its restored packages (links).
    pub path: PathBuf,
    /// What valve's launcher needs, after the app's own.
    pub runtime: PathBuf,
    pub summary: Summary,
    /// It was in the cache whole: nothing fetched, built or linked.
    pub whole: bool,
}

impl Library {
    /// The library paths the app's R gets, before R's own.
    pub fn paths(&self) -> Vec<PathBuf> {
        let mut paths = vec![self.path.clone()];
        if self.runtime != self.path {
            paths.push(self.runtime.clone());
        }
        paths
    }
}

/// What R at `r_bin` is, asked once per run.
async fn facts(r_bin: &Path) -> Result<RFacts, String> {
    static KNOWN: std::sync::Mutex<Vec<(PathBuf, RFacts)>> = std::sync::Mutex::new(Vec::new());
    if let Some((_, f)) = KNOWN.lock().unwrap_or_else(|p| p.into_inner()).iter().find(|(p, _)| p == r_bin) {
        return Ok(f.clone());
    }
    let f = rtools::facts(r_bin).await?;
    KNOWN.lock().unwrap_or_else(|p| p.into_inner()).push((r_bin.to_path_buf(), f.clone()));
    Ok(f)
}

/// Where R (with its default libraries) holds `name` at exactly `version`.
fn held(facts: &RFacts, name: &str, version: &str) -> Option<PathBuf> {
    facts.libraries.iter().map(|l| l.join(name)).find(|dir| cache::installed_version(dir).as_deref() == Some(version))
}

/// The app in `folder` (run by `r_bin`, its processes as `spec` says)
/// restored: its library, or `None` when it names no packages. Counted,
/// and the library's use by the folder recorded (a prune keeps it while the
/// folder exists).
pub async fn restore(
    folder: &Path,
    spec: &Spec,
    via: Builds<'_>,
    settings: &PackageSettings,
    say: Say<'_>,
) -> Result<Option<Library>, String> {
    let _shared = manage::GATE.read().await;
    let got = assemble(folder, spec, via, settings, say).await;
    match &got {
        Ok(Some(lib)) => {
            counts::restore_ended(true, lib.whole);
            if !lib.whole {
                lib.summary.packages.iter().for_each(counts::placed);
            }
            let cache = Cache { root: settings.cache_dir.clone() };
            if let (Ok(rest), Some(key)) = (lib.path.strip_prefix(cache.libs()), lib.path.file_name()) {
                if rest.components().count() == 1 {
                    manage::record(&cache, &spec.name, folder, &key.to_string_lossy());
                }
            }
        }
        Ok(None) => {}
        Err(_) => counts::restore_ended(false, false),
    }
    got
}

async fn assemble(
    folder: &Path,
    spec: &Spec,
    via: Builds<'_>,
    settings: &PackageSettings,
    say: Say<'_>,
) -> Result<Option<Library>, String> {
    let lock = lock::read(folder)?;
    if lock.is_none() && settings.site_library {
        return Ok(None);
    }
    let facts = facts(&spec.r_bin).await?;
    let cache = Cache::open(&settings.cache_dir)
        .map_err(|e| format!("cannot open the package cache {}: {e}", settings.cache_dir.display()))?;
    let rkey = format!("R-{}-{}", facts.version, facts.platform);
    let Some(lock) = lock else {
        // Names nothing, and the site library is off: R's own library and
        // what valve's launcher needs, nothing else.
        let runtime = build::runtime(&cache, &facts, &rkey)?;
        say("Packages: the app names none and the site library is off (--site-library false): it sees R's own library only".into());
        return Ok(Some(Library { path: runtime.clone(), runtime, summary: Summary::default(), whole: true }));
    };
    let repos = Repositories { mapped: settings.repositories.clone(), only_mapped: settings.repositories_only };
    let key = {
        let mut k = format!("{}\n{rkey}\n{}\n", lock.digest, repos.only_mapped);
        for (n, u) in &repos.mapped {
            k.push_str(&format!("{n}={u}\n"));
        }
        sha256_hex(k.as_bytes())[..24].to_string()
    };
    let runtime = build::runtime(&cache, &facts, &rkey)?;
    let path = cache.libs().join(&key);
    if let Some(summary) = cache::summary(&path) {
        say(format!(
            "Packages: the {} packages {} names were restored before (library {key})",
            summary.packages.len(),
            lock.file
        ));
        for e in &summary.packages {
            let again = Entry { from: if e.from == From::System { From::System } else { From::Cache }, ..e.clone() };
            say(again.said());
        }
        return Ok(Some(Library { path, runtime, summary, whole: true }));
    }
    say(format!(
        "Restoring the {} packages {} names (R {}, {}) into the app's own library",
        lock.packages.len(),
        lock.file,
        facts.version,
        facts.platform
    ));
    let mut entries: Vec<Entry> = Vec::new();
    let mut to_fetch = Vec::new();
    let mut problems = Vec::new();
    for w in &lock.packages {
        if let Some(dir) = held(&facts, &w.name, &w.version) {
            entries.push(Entry { name: w.name.clone(), version: w.version.clone(), from: From::System, path: dir });
            continue;
        }
        match repos.url_for(w) {
            Ok(url) => to_fetch.push((w, url)),
            Err(e) => problems.push(e),
        }
    }
    for e in &entries {
        say(e.said());
    }
    if !problems.is_empty() {
        return Err(failed(problems));
    }
    if !to_fetch.is_empty() {
        say(format!("Fetching {} source packages", to_fetch.len()));
    }
    let tarballs = source::fetch_all(&cache, via, &spec.r_bin, &to_fetch).await?;
    let mut builds = Vec::new();
    for ((w, _), t) in to_fetch.iter().zip(tarballs) {
        match t {
            Ok(t) => builds.push(((*w).clone(), t)),
            Err(e) => problems.push(e),
        }
    }
    if !problems.is_empty() {
        return Err(failed(problems));
    }
    // What the named packages need that the app does not name (an
    // incomplete lockfile, or a package used from R's library with its own
    // dependencies there) comes from R's library as it stands, and is said.
    let named: Vec<String> = lock.packages.iter().map(|w| w.name.clone()).collect();
    let mut roots: Vec<String> = entries.iter().flat_map(|e| dcf::needs_of(&e.path)).collect();
    // What valve's launcher loads to serve an app of its kind, if not named.
    roots.extend(serves_with(&spec.app).iter().map(|s| s.to_string()));
    roots.extend(
        builds.iter().flat_map(|(w, t)| w.needs.clone().unwrap_or_default().into_iter().chain(t.needs.clone())),
    );
    for (name, dir) in build::server_closure(&facts, roots, &named) {
        let version = cache::installed_version(&dir).unwrap_or_default();
        let e = Entry { name, version, from: From::System, path: dir };
        say(format!("{} (needed, not named in {})", e.said(), lock.file));
        entries.push(e);
    }
    let order: Vec<(String, Vec<String>)> = builds
        .iter()
        .map(|(w, t)| (w.name.clone(), w.needs.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| t.needs.clone())))
        .collect();
    let waves = plan::waves(&order).map_err(|e| failed(vec![e]))?;
    let partial = cache.fresh(&format!("lib-{key}"));
    std::fs::create_dir(&partial).map_err(|e| format!("cannot make {}: {e}", partial.display()))?;
    let result = async {
        for e in &entries {
            build::link(&partial, e)?;
        }
        let builds = Arc::new(builds);
        for wave in waves {
            let jobs = wave.iter().map(|name| {
                let (w, t) = builds.iter().find(|(w, _)| &w.name == name).cloned().expect("in the wave's list");
                let (cache, rkey, partial) = (&cache, &rkey, &partial);
                async move {
                    let got = build::ensure(cache, rkey, &w, &t, via, &spec.r_bin, partial, settings, say).await;
                    if let Ok(e) = &got {
                        say(e.said());
                    }
                    got
                }
            });
            let done = futures_util::future::join_all(jobs).await;
            let mut failures = Vec::new();
            for d in done {
                match d {
                    Ok(e) => {
                        build::link(&partial, &e)?;
                        entries.push(e);
                    }
                    Err(why) => failures.push(why),
                }
            }
            if !failures.is_empty() {
                return Err(failed(failures));
            }
        }
        let summary = Summary { file: lock.file.to_string(), r_version: facts.version.clone(), packages: entries };
        let text = serde_json::to_string_pretty(&summary).map_err(|e| e.to_string())?;
        std::fs::write(partial.join(cache::SUMMARY), text)
            .map_err(|e| format!("cannot write the library's summary: {e}"))?;
        cache::put(&partial, &path).map_err(|e| format!("cannot put the library at {}: {e}", path.display()))?;
        Ok(summary)
    }
    .await;
    match result {
        Ok(summary) => {
            say(format!("Packages: all {} restored (library {key})", summary.packages.len()));
            Ok(Some(Library { path, runtime, summary, whole: false }))
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&partial);
            Err(e)
        }
    }
}

/// The packages valve's launcher loads to serve `app` (an engine's
/// `_server.yml` names its own, which the app must name).
fn serves_with(app: &crate::config::AppSource) -> &'static [&'static str] {
    match app.family() {
        "plumber" => &["plumber"],
        "shiny" if matches!(app, crate::config::AppSource::Shiny(_)) => &["shiny"],
        "shiny" => &["shiny", "rmarkdown", "knitr"],
        _ => &[],
    }
}

fn failed(problems: Vec<String>) -> String {
    format!("the app's packages could not be restored: {}", problems.join("; "))
}
