//! Tarballs: fetched into the cache once per repository and version, then
//! known by their content's hash; what their DESCRIPTION says.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::cache::Cache;
use super::lock::Wanted;
use super::plan::tarball_urls;
use crate::worker::rtools;

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

/// Fetches each package's tarball not yet kept (current, then archived),
/// with `r_bin`'s downloader; each package's tarball or why not.
pub async fn fetch_all(
    cache: &Cache,
    r_bin: &Path,
    wanted: &[(&Wanted, String)],
) -> Result<Vec<Result<Tarball, String>>, String> {
    let mut jobs = Vec::new();
    for (w, url) in wanted {
        let path = kept(cache, w, url);
        if !path.exists() {
            jobs.push((cache.fresh(&format!("{}.tar.gz", w.name)), tarball_urls(url, &w.name, &w.version).to_vec()));
        }
    }
    let fetched =
        if jobs.is_empty() { Vec::new() } else { rtools::fetch(r_bin, &jobs, Duration::from_secs(1800)).await? };
    let mut out = Vec::new();
    let mut n = 0;
    for (w, url) in wanted {
        let path = kept(cache, w, url);
        if !path.exists() {
            let (tmp, _) = &jobs[n];
            n += 1;
            match fetched.iter().find(|(d, _)| d == tmp).map(|(_, r)| r.clone()) {
                Some(Ok(_)) => {
                    if let Err(e) = std::fs::rename(tmp, &path) {
                        out.push(Err(format!("{} {}: cannot keep its tarball: {e}", w.name, w.version)));
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
            read(&path, &w.name).map_err(|e| format!("{} {}: its tarball {}: {e}", w.name, w.version, path.display())),
        );
    }
    Ok(out)
}

/// The hash and DESCRIPTION of the tarball at `path` of package `name`.
pub fn read(path: &Path, name: &str) -> Result<Tarball, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let sha = super::cache::sha256_hex(&bytes);
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(&bytes[..]));
    let wanted = format!("{name}/DESCRIPTION");
    let mut text = None;
    for entry in archive.entries().map_err(|e| format!("not a tar.gz: {e}"))? {
        let mut entry = entry.map_err(|e| format!("not a tar.gz: {e}"))?;
        if entry.path().ok().is_some_and(|p| p.to_string_lossy() == wanted) {
            let mut s = String::new();
            entry.by_ref().take(1 << 20).read_to_string(&mut s).map_err(|e| e.to_string())?;
            text = Some(s);
            break;
        }
    }
    let text = text.ok_or_else(|| format!("no {wanted} in it"))?;
    let fields = super::dcf::parse(&text);
    Ok(Tarball {
        path: path.to_path_buf(),
        sha,
        needs: super::dcf::needs(&fields),
        system_requirements: super::dcf::field(&fields, "SystemRequirements").map(str::to_string),
    })
}
