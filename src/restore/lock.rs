//! What an app says it needs: the packages of a published bundle's
//! `manifest.json` (rsconnect: each name with its `Source`, `Repository`
//! and whole `description`) or of an `renv.lock` (each `Package`,
//! `Version`, `Source`, `Repository`, with the lockfile's repositories).
//! Pure: text in, a list out. Every name and version is checked here
//! (`names`), before anything can use it as a path or in a URL: what a
//! publisher or an app wrote is refused naming the entry and the file.

use std::path::Path;

use super::dcf::BASE;
use super::names::{check_package, check_version};

/// Where a package comes from, as the client said it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A CRAN-like repository: its name (`CRAN`, `RSPM`, `Bioconductor`, a
    /// user's own) and the URL the client gave, if any.
    Repository { name: String, url: Option<String> },
    /// A Git host (`github`, `gitlab`, `bitbucket`): never fetched by valve.
    Git { host: String, repo: String },
    /// Anything else (a local folder, a URL, unknown): never fetched.
    Other(String),
}

/// One package at one version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    pub name: String,
    pub version: String,
    pub origin: Origin,
    /// What it needs, when the client said (the manifest's description).
    pub needs: Option<Vec<String>>,
}

/// The packages an app names, and the file that names them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lock {
    /// `manifest.json` or `renv.lock`.
    pub file: &'static str,
    /// Its exact bytes' hash, hex (part of the app library's key).
    pub digest: String,
    pub packages: Vec<Wanted>,
}

use std::os::unix::fs::OpenOptionsExt;

/// The packages the app in `folder` names: its `manifest.json`'s if that
/// names any, else its `renv.lock`'s; `None` when neither names one.
pub fn read(folder: &Path) -> Result<Option<Lock>, String> {
    for (file, parse) in [("manifest.json", manifest as fn(&str) -> Result<Vec<Wanted>, String>), ("renv.lock", renv)] {
        let path = folder.join(file);
        // Never through a link: a published app may add files beside its code
        // (valve reads this as root), and a link it made could name any file.
        let opened =
            std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&path).and_then(|mut f| {
                let mut t = String::new();
                std::io::Read::read_to_string(&mut f, &mut t).map(|_| t)
            });
        let text = match opened {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(format!("{} is a link: valve reads the file that names an app's packages only as a file in its folder (copy it there)", path.display()))
            }
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        let packages = parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        if packages.is_empty() {
            continue;
        }
        return Ok(Some(Lock { file, digest: super::cache::sha256_hex(text.as_bytes()), packages }));
    }
    Ok(None)
}

fn json(text: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(text).map_err(|e| format!("not JSON ({e})"))
}

/// rsconnect's manifest: `packages` maps each name to its `Source`,
/// `Repository` and `description` (0.8.x: `Source` may be `CRAN` with the
/// URL in `Repository`; 1.x the same, or `github` with `Remote*` fields).
pub fn manifest(text: &str) -> Result<Vec<Wanted>, String> {
    let doc = json(text)?;
    let Some(packages) = doc.get("packages").and_then(|p| p.as_object()) else { return Ok(Vec::new()) };
    let mut out = Vec::new();
    for (name, p) in packages {
        check_package(name)?;
        if BASE.contains(&name.as_str()) {
            continue;
        }
        let desc = &p["description"];
        let text = |v: &serde_json::Value| v.as_str().map(str::to_string);
        if let Some(said) = text(&desc["Package"]).filter(|said| said != name) {
            return Err(format!(
                "the entry {name} describes the package {} (its description's Package): they must be the same",
                super::names::shown(&said)
            ));
        }
        let version = text(&desc["Version"])
            .or_else(|| text(&p["Version"]))
            .ok_or_else(|| format!("the package {name} has no Version in its description"))?;
        check_version(name, &version)?;
        let source = text(&p["Source"]).unwrap_or_default();
        let url = text(&p["Repository"]).filter(|u| !u.is_empty());
        let origin = match source.to_ascii_lowercase().as_str() {
            "github" | "gitlab" | "bitbucket" => Origin::Git {
                host: source.to_ascii_lowercase(),
                repo: format!(
                    "{}/{}",
                    text(&desc["RemoteUsername"]).unwrap_or_default(),
                    text(&desc["RemoteRepo"]).unwrap_or_else(|| name.clone())
                ),
            },
            "" | "local" | "unknown" | "source" => {
                Origin::Other(if source.is_empty() { "unknown".into() } else { source })
            }
            _ => Origin::Repository { name: source, url },
        };
        let needs = desc.as_object().map(|d| {
            let fields: Vec<(String, String)> =
                d.iter().filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string()))).collect();
            super::dcf::needs(&fields)
        });
        for need in needs.iter().flatten() {
            check_package(need).map_err(|e| format!("what {name} needs: {e}"))?;
        }
        out.push(Wanted { name: name.clone(), version, origin, needs });
    }
    Ok(out)
}

/// renv's lockfile: `Packages` maps each name to `Package`, `Version`,
/// `Source` (`Repository`, `Bioconductor`, `GitHub`...) and `Repository`
/// (a name in `R.Repositories`, whose URL is given there).
pub fn renv(text: &str) -> Result<Vec<Wanted>, String> {
    let doc = json(text)?;
    let repos: Vec<(String, String)> = doc["R"]["Repositories"]
        .as_array()
        .map(|a| {
            a.iter().filter_map(|r| Some((r["Name"].as_str()?.to_string(), r["URL"].as_str()?.to_string()))).collect()
        })
        .unwrap_or_default();
    let Some(packages) = doc.get("Packages").and_then(|p| p.as_object()) else {
        return Err("no \"Packages\" object: is this an renv.lock?".into());
    };
    let mut out = Vec::new();
    for (key, p) in packages {
        check_package(key)?;
        let name = p["Package"].as_str().unwrap_or(key).to_string();
        if name != *key {
            return Err(format!(
                "the entry {key} names the package {} (its Package): they must be the same",
                super::names::shown(&name)
            ));
        }
        if BASE.contains(&name.as_str()) {
            continue;
        }
        let version = p["Version"].as_str().ok_or_else(|| format!("the package {name} has no Version"))?.to_string();
        check_version(&name, &version)?;
        let source = p["Source"].as_str().unwrap_or("").to_string();
        let origin = match source.to_ascii_lowercase().as_str() {
            "repository" | "cran" => {
                let repo = p["Repository"].as_str().unwrap_or("CRAN").to_string();
                let url = repos.iter().find(|(n, _)| *n == repo).map(|(_, u)| u.clone());
                Origin::Repository { name: repo, url }
            }
            "bioconductor" => Origin::Repository {
                name: "Bioconductor".into(),
                url: repos.iter().find(|(n, _)| n == "Bioconductor").map(|(_, u)| u.clone()),
            },
            "github" | "gitlab" | "bitbucket" => Origin::Git {
                host: source.to_ascii_lowercase(),
                repo: format!(
                    "{}/{}",
                    p["RemoteUsername"].as_str().unwrap_or(""),
                    p["RemoteRepo"].as_str().unwrap_or(&name)
                ),
            },
            _ => Origin::Other(if source.is_empty() { "unknown".into() } else { source }),
        };
        out.push(Wanted { name, version, origin, needs: None });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_gives_each_package_its_version_origin_and_needs_and_skips_base() {
        let text = r#"{"packages": {
            "R6": {"Source": "CRAN", "Repository": "https://cloud.r-project.org", "description": {"Package": "R6", "Version": "2.5.0", "Depends": "R (>= 3.0)"}},
            "mine": {"Source": "github", "Repository": null, "description": {"Version": "0.1", "RemoteUsername": "me", "RemoteRepo": "mine", "Imports": "R6, stats"}},
            "here": {"Source": null, "description": {"Version": "1.0"}},
            "stats": {"Source": null, "description": {"Version": "4.2.2"}}}}"#;
        let got = manifest(text).unwrap();
        assert_eq!(got.len(), 3);
        let by = |n: &str| got.iter().find(|w| w.name == n).unwrap_or_else(|| panic!("{n} is listed"));
        assert_eq!(got[0].name, "R6");
        assert_eq!(
            got[0].origin,
            Origin::Repository { name: "CRAN".into(), url: Some("https://cloud.r-project.org".into()) }
        );
        assert_eq!(got[0].needs.as_deref(), Some(&[][..]));
        assert_eq!(by("mine").origin, Origin::Git { host: "github".into(), repo: "me/mine".into() });
        assert_eq!(by("mine").needs.as_deref(), Some(&["R6".to_string(), "stats".to_string()][..]));
        assert_eq!(by("here").origin, Origin::Other("unknown".into()));
    }

    #[test]
    fn an_renv_lock_names_repositories_by_its_own_list() {
        let text = r#"{"R": {"Version": "4.2.2", "Repositories": [{"Name": "CRAN", "URL": "http://127.0.0.1:9/cran"}]},
            "Packages": {"bitops": {"Package": "bitops", "Version": "1.0-7", "Source": "Repository", "Repository": "CRAN", "Hash": "x"},
                         "gh": {"Package": "gh", "Version": "1.0", "Source": "GitHub", "RemoteUsername": "a", "RemoteRepo": "gh"}}}"#;
        let got = renv(text).unwrap();
        assert_eq!(
            got[0].origin,
            Origin::Repository { name: "CRAN".into(), url: Some("http://127.0.0.1:9/cran".into()) }
        );
        assert_eq!(got[1].origin, Origin::Git { host: "github".into(), repo: "a/gh".into() });
        assert!(renv("{}").unwrap_err().contains("renv.lock"));
    }
}
