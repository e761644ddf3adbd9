//! One package built once: by a builder (never the app: no app's code,
//! profile or folder reaches a build), within `package_build_timeout`, at
//! most `package_builds` at once, two restores that need the same one at
//! once building it once; then copied into the cache (only what the
//! builder made) and renamed into place whole. And the links of an app
//! library and of the runtime library (what valve's launcher needs).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::cache::{self, Cache, Entry, From};
use super::lock::Wanted;
use super::say::Say;
use super::source::Tarball;
use crate::config::PackageSettings;
use crate::worker::builders::Builds;
use crate::worker::rtools::RFacts;

/// What valve's launcher loads itself, whatever the app: found in the
/// server's libraries, after the app's own (whose versions win).
const RUNTIME: &[&str] = &["later", "httpuv", "jsonlite", "promises"];

/// One lock per cache entry: a second restore that needs it waits for the first's build.
fn entry_lock(path: &Path) -> Arc<tokio::sync::Mutex<()>> {
    static LOCKS: Mutex<Vec<(PathBuf, Arc<tokio::sync::Mutex<()>>)>> = Mutex::new(Vec::new());
    let mut locks = LOCKS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, l)) = locks.iter().find(|(p, _)| p == path) {
        return l.clone();
    }
    let l = Arc::new(tokio::sync::Mutex::new(()));
    locks.push((path.to_path_buf(), l.clone()));
    l
}

/// The package `w` (from tarball `t`) in the cache: there already, or
/// built now by a builder with what it needs in `library`.
#[allow(clippy::too_many_arguments)]
pub async fn ensure(
    cache: &Cache,
    rkey: &str,
    w: &Wanted,
    t: &Tarball,
    builds: Builds<'_>,
    r_bin: &Path,
    library: &Path,
    settings: &PackageSettings,
    say: Say<'_>,
) -> Result<Entry, String> {
    let dir = cache.built(rkey, &w.name, &w.version, &t.sha);
    let installed = dir.join(&w.name);
    let entry = |from| Entry { name: w.name.clone(), version: w.version.clone(), from, path: installed.clone() };
    if installed.is_dir() {
        return Ok(entry(From::Cache));
    }
    let lock = entry_lock(&dir);
    let _one = lock.lock().await;
    if installed.is_dir() {
        return Ok(entry(From::Cache));
    }
    let fail = |why: String, tail: &[String]| {
        let mut msg = format!("{} {} failed to build: {why}", w.name, w.version);
        if !tail.is_empty() {
            msg.push_str(&format!("; its last lines: {}", tail.join(" | ")));
        }
        if let Some(req) = &t.system_requirements {
            msg.push_str(&format!("; it says it needs (SystemRequirements): {req}: install those on the server"));
        }
        msg
    };
    let builder = builds.take().await.map_err(|e| fail(format!("no builder: {e}"), &[]))?;
    say(format!("{} {}: building from source", w.name, w.version));
    let started = Instant::now();
    let build = builder.scratch(&cache.tmp(), Some(library)).map_err(|e| fail(format!("no build folder: {e}"), &[]))?;
    build.install(r_bin, &t.path, library, settings.build_timeout).await.map_err(|(why, tail)| fail(why, &tail))?;
    let staged = cache.fresh(&format!("built-{}", w.name));
    let (name, uid) = (w.name.clone(), build.owner());
    let copied = {
        let staged = staged.clone();
        let out = build.lib_handle();
        tokio::task::spawn_blocking(move || -> std::io::Result<u64> {
            std::fs::create_dir(&staged)?;
            super::copy::copy_out(std::os::fd::AsFd::as_fd(&out?), &name, &staged.join(&name), uid)
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()))
    };
    drop(build);
    drop(builder);
    if let Err(e) = copied {
        let _ = std::fs::remove_dir_all(&staged);
        return Err(fail(format!("its installed files could not be taken into the cache: {e}"), &[]));
    }
    cache::put(&staged, &dir).map_err(|e| fail(format!("cannot put it in the cache: {e}"), &[]))?;
    Ok(entry(From::Built(started.elapsed().as_secs_f64())))
}

/// The packages the server's R holds (outside R's own library, which is on
/// every path anyway) that `roots` need, recursively, skipping `named` (what
/// the app names itself) and R's base packages: each with its folder.
pub fn server_closure(facts: &RFacts, roots: Vec<String>, named: &[String]) -> Vec<(String, PathBuf)> {
    let mut found: Vec<(String, PathBuf)> = Vec::new();
    let mut todo = roots;
    while let Some(name) = todo.pop() {
        if found.iter().any(|(n, _)| *n == name) || named.contains(&name) || super::dcf::BASE.contains(&name.as_str()) {
            continue;
        }
        let Some(dir) = facts.libraries.iter().map(|l| l.join(&name)).find(|d| d.join("DESCRIPTION").is_file()) else {
            continue;
        };
        if dir.starts_with(&facts.own) {
            continue;
        }
        todo.extend(super::dcf::needs_of(&dir));
        found.push((name, dir));
    }
    found
}

/// Links `e` into the library folder `lib`.
pub fn link(lib: &Path, e: &Entry) -> Result<(), String> {
    std::os::unix::fs::symlink(&e.path, lib.join(&e.name))
        .map_err(|err| format!("cannot link {} into the library: {err}", e.name))
}

/// The runtime library for R `facts`: links to the server's copies of what
/// valve's launcher loads and everything they need.
pub fn runtime(cache: &Cache, facts: &RFacts, rkey: &str) -> Result<PathBuf, String> {
    let roots: Vec<String> = RUNTIME.iter().map(|s| s.to_string()).collect();
    let mut found = server_closure(facts, roots, &[]);
    found.sort();
    let listing: String = found.iter().map(|(n, d)| format!("{n}={}\n", d.display())).collect();
    let path = cache.runtime().join(format!("{rkey}-{}", &super::cache::sha256_hex(listing.as_bytes())[..12]));
    if path.is_dir() {
        return Ok(path);
    }
    let staged = cache.fresh("runtime");
    let made = (|| -> std::io::Result<()> {
        std::fs::create_dir(&staged)?;
        for (n, d) in &found {
            std::os::unix::fs::symlink(d, staged.join(n))?;
        }
        cache::put(&staged, &path)
    })();
    made.map_err(|e| format!("cannot make the runtime library {}: {e}", path.display()))?;
    Ok(path)
}
