//! Tarballs: fetched by a builder once per repository and version, checked
//! (one folder of the package asked for, at its version), then kept in
//! the cache and known by their content's hash; what their DESCRIPTION says.

use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::cache::Cache;
use super::lock::Wanted;
use super::plan::tarball_urls;
use crate::worker::builders::Builds;

/// A package's tarball in the cache, and what its DESCRIPTION says.
#[derive(Clone, Debug)]
pub struct Tarball {
    pub path: PathBuf,
    pub sha: String,
    pub needs: Vec<String>,
    pub system_requirements: Option<String>,
}

/// Where `w` from the repository at `url` is kept once fetched.
fn kept(cache: &Cache, w: &Wanted, url: &str) -> PathBuf {
    let repo = &super::cache::sha256_hex(url.trim_end_matches('/').as_bytes())[..12];
    cache.src().join(format!("{}_{}-{repo}.tar.gz", w.name, w.version))
}

/// Fetches each package's tarball not yet kept (current, then archived)
/// with `r_bin`'s downloader, as a builder (never as valve or an app), and
/// keeps it only once `check` says it is the package asked for: each
/// package's tarball or why not.
pub async fn fetch_all(
    cache: &Cache,
    builds: Builds<'_>,
    r_bin: &Path,
    wanted: &[(&Wanted, String)],
) -> Result<Vec<Result<Tarball, String>>, String> {
    let jobs: Vec<(String, Vec<String>)> = wanted
        .iter()
        .filter(|(w, url)| !kept(cache, w, url).exists())
        .map(|(w, url)| (w.name.clone(), tarball_urls(url, &w.name, &w.version).to_vec()))
        .collect();
    let mut fetched: Vec<(String, Result<Vec<u8>, String>)> = Vec::new();
    if !jobs.is_empty() {
        let builder = builds.take().await.map_err(|e| format!("no builder for the downloads: {e}"))?;
        let scratch = builder.scratch(&cache.tmp(), None).map_err(|e| format!("no folder for the downloads: {e}"))?;
        for (name, got) in scratch.fetch(r_bin, &jobs, Duration::from_secs(1800)).await? {
            fetched.push((name.clone(), got.and_then(|_| scratch.take(&name).map_err(|e| e.to_string()))));
        }
    }
    let mut out = Vec::new();
    for (w, url) in wanted {
        let path = kept(cache, w, url);
        if !path.exists() {
            match fetched.iter().find(|(n, _)| *n == w.name).map(|(_, r)| r) {
                Some(Ok(bytes)) => {
                    if let Err(e) = check(bytes, &w.name, &w.version).and_then(|_| keep(cache, &path, bytes)) {
                        out.push(Err(format!(
                            "{} {} from {}: its tarball is refused: {e}",
                            w.name,
                            w.version,
                            url.trim_end_matches('/')
                        )));
                        continue;
                    }
                }
                Some(Err(why)) => {
                    out.push(Err(format!(
                        "{} {} is in no repository valve may use: neither {}/src/contrib nor its Archive has it ({why}); check the version, or map the repository in [repositories]",
                        w.name,
                        w.version,
                        url.trim_end_matches('/')
                    )));
                    continue;
                }
                None => {
                    out.push(Err(format!("{} {}: the downloader said nothing of it", w.name, w.version)));
                    continue;
                }
            }
        }
        out.push(
            read(&path, &w.name, &w.version)
                .map_err(|e| format!("{} {}: its tarball {}: {e}", w.name, w.version, path.display())),
        );
    }
    Ok(out)
}

/// Writes a checked tarball into the cache at `path`, whole or not at all.
fn keep(cache: &Cache, path: &Path, bytes: &[u8]) -> Result<(), String> {
    let tmp = cache.fresh("tarball");
    std::fs::write(&tmp, bytes).and_then(|_| std::fs::rename(&tmp, path)).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot keep it in the cache: {e}")
    })
}

/// The hash and DESCRIPTION of the tarball at `path`, which must be
/// package `name` at `version` (`check`).
pub fn read(path: &Path, name: &str, version: &str) -> Result<Tarball, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let (sha, fields) = check(&bytes, name, version)?;
    Ok(Tarball {
        path: path.to_path_buf(),
        sha,
        needs: super::dcf::needs(&fields),
        system_requirements: super::dcf::field(&fields, "SystemRequirements").map(str::to_string),
    })
}

/// The most entries and bytes a package's source may unpack to.
const MAX_ENTRIES: usize = 100_000;
const MAX_UNPACKED: u64 = 2 << 30;

/// Whether `bytes` are what R would build as package `name` at `version`:
/// a gzip'd tar whose every entry is inside one top folder named for the
/// package (no absolute path, no `..`), whose `DESCRIPTION` says that
/// `Package` and `Version`, and whose needs are package names. Its hash
/// and DESCRIPTION's fields, or what is wrong. Nothing is kept before this
/// says yes. Pure.
pub fn check(bytes: &[u8], name: &str, version: &str) -> Result<(String, Vec<(String, String)>), String> {
    use std::path::Component;
    let sha = super::cache::sha256_hex(bytes);
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(bytes));
    let wanted = Path::new(name).join("DESCRIPTION");
    let mut text = None;
    let (mut entries, mut unpacked) = (0usize, 0u64);
    for entry in archive.entries().map_err(|e| format!("not a tar.gz: {e}"))? {
        let mut entry = entry.map_err(|e| format!("not a tar.gz: {e}"))?;
        entries += 1;
        unpacked = unpacked.saturating_add(entry.size());
        if entries > MAX_ENTRIES || unpacked > MAX_UNPACKED {
            return Err(format!("it unpacks to more than {MAX_ENTRIES} entries or {} GiB", MAX_UNPACKED >> 30));
        }
        let raw = entry.path_bytes().into_owned();
        let path = Path::new(std::ffi::OsStr::from_bytes(&raw));
        let mut parts = path.components().filter(|c| *c != Component::CurDir);
        let inside = match parts.next() {
            Some(Component::Normal(top)) => top.as_bytes() == name.as_bytes(),
            _ => false,
        } && parts.all(|c| matches!(c, Component::Normal(_)));
        if !inside {
            return Err(format!(
                "it holds {}, which is not inside one folder named {name} (a package's source is one folder of its name)",
                super::names::shown(&String::from_utf8_lossy(&raw))
            ));
        }
        if text.is_none() && path.components().filter(|c| *c != Component::CurDir).eq(wanted.components()) {
            let mut s = String::new();
            entry.by_ref().take(1 << 20).read_to_string(&mut s).map_err(|e| e.to_string())?;
            text = Some(s);
        }
    }
    let text = text.ok_or_else(|| format!("no {} in it", wanted.display()))?;
    let fields = super::dcf::parse(&text);
    let said = |field: &str| super::dcf::field(&fields, field).unwrap_or("").to_string();
    if said("Package") != name || said("Version") != version {
        return Err(format!(
            "its DESCRIPTION says Package {} Version {}, not {name} {version}",
            super::names::shown(&said("Package")),
            super::names::shown(&said("Version"))
        ));
    }
    for need in super::dcf::needs(&fields) {
        super::names::check_package(&need).map_err(|e| format!("its DESCRIPTION's needs: {e}"))?;
    }
    Ok((sha, fields))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tarball(entries: &[(&str, &str)]) -> Vec<u8> {
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let mut b = tar::Builder::new(gz);
        for (path, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o644);
            h.set_size(data.len() as u64);
            // Written raw: the builder itself refuses `..`, a tarball from elsewhere need not.
            h.as_gnu_mut().unwrap().name[..path.len()].copy_from_slice(path.as_bytes());
            h.set_cksum();
            b.append(&h, data.as_bytes()).unwrap();
        }
        b.into_inner().unwrap().finish().unwrap()
    }

    const DESC: &str = "Package: R6\nVersion: 2.5.1\nImports: utils\n";

    #[test]
    fn a_tarball_is_one_folder_of_the_package_it_claims_to_be() {
        let good = tarball(&[("R6/DESCRIPTION", DESC), ("R6/R/r6.R", "x <- 1\n")]);
        let (sha, fields) = check(&good, "R6", "2.5.1").unwrap();
        assert_eq!(sha.len(), 64);
        assert_eq!(super::super::dcf::field(&fields, "Imports"), Some("utils"));
        let e = check(&good, "R6", "2.5.0").unwrap_err();
        assert!(e.contains("says Package \"R6\" Version \"2.5.1\", not R6 2.5.0"), "{e}");
        for (entries, says) in [
            (vec![("R6/DESCRIPTION", DESC), ("other/x", "")], "\"other/x\", which is not inside one folder named R6"),
            (vec![("R6/DESCRIPTION", DESC), ("R6/../../etc/x", "")], "R6/../../etc/x"),
            (vec![("R6/DESCRIPTION", DESC), ("/etc/x", "")], "/etc/x"),
            (vec![("R6/R/r6.R", "")], "no R6/DESCRIPTION"),
            (vec![("R6/DESCRIPTION", "Package: R6\nVersion: 2.5.1\nImports: ../x\n")], "needs"),
        ] {
            let e = check(&tarball(&entries), "R6", "2.5.1").unwrap_err();
            assert!(e.contains(says), "{says}: {e}");
        }
        assert!(check(b"not a tarball at all", "R6", "2.5.1").is_err());
    }
}
