//! What a restore does with each package, decided before anything is
//! fetched or built (pure): used from R's own library when it holds that
//! exact version, fetched from a repository's current or archived
//! tarballs, or refused with what to do; and the order of the builds.

use super::lock::{Origin, Wanted};

/// Where the repositories are, as the administrator mapped them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Repositories {
    /// Name to URL (`[repositories]`): overrides the URL a client gave.
    pub mapped: Vec<(String, String)>,
    /// Only mapped names are used; a URL a client gave is not.
    pub only_mapped: bool,
}

impl Repositories {
    /// Every repository URL a client gave in `lock` that valve would use
    /// (none the administrator maps over) is one a client may name: refused
    /// at upload, naming the entry, before anything is fetched.
    pub fn check_client_urls(&self, lock: &super::lock::Lock) -> Result<(), String> {
        for w in &lock.packages {
            let Origin::Repository { name, url: Some(u) } = &w.origin else { continue };
            if self.mapped.iter().any(|(n, _)| n.eq_ignore_ascii_case(name)) || self.only_mapped {
                continue;
            }
            if let Some(why) = super::names::repository_problem(u) {
                return Err(format!(
                    "{}: the package {} comes from the repository {name} at {}, which is refused: {why}",
                    lock.file,
                    w.name,
                    super::names::shown(u)
                ));
            }
        }
        Ok(())
    }

    /// The URL of the repository a package comes from, or why there is none.
    pub fn url_for(&self, w: &Wanted) -> Result<String, String> {
        let what = format!("{} {}", w.name, w.version);
        match &w.origin {
            Origin::Repository { name, url } => {
                let mapped = self.mapped.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, u)| u.clone());
                match (mapped, url) {
                    (Some(u), _) => Ok(u),
                    (None, Some(u)) if !self.only_mapped => match super::names::repository_problem(u) {
                        None => Ok(u.clone()),
                        Some(why) => Err(format!(
                            "{what} comes from the repository {name} at {}, which is refused: {why}",
                            super::names::shown(u)
                        )),
                    },
                    (None, Some(u)) => Err(format!(
                        "{what} comes from the repository {name} ({u}), which [repositories] does not map and repositories_only forbids: map {name} to a URL this server may use"
                    )),
                    (None, None) => Err(format!(
                        "{what} comes from the repository {name}, whose URL the client did not give: map {name} to a URL in [repositories]"
                    )),
                }
            }
            Origin::Git { host, repo } => Err(format!(
                "{what} comes from {host} ({repo}), which valve does not fetch: publish it to a repository this server reaches (a CRAN-like folder made with tools::write_PACKAGES, or a package manager) and install it from there before publishing"
            )),
            Origin::Other(source) => Err(format!(
                "{what} was installed from {source} (not a repository), so valve cannot fetch it: install it from a repository this server reaches and publish again"
            )),
        }
    }
}

/// The places a tarball of `name` at `version` may be in a CRAN-like
/// repository at `url`: current, then archived.
pub fn tarball_urls(url: &str, name: &str, version: &str) -> [String; 2] {
    let base = url.trim_end_matches('/');
    [
        format!("{base}/src/contrib/{name}_{version}.tar.gz"),
        format!("{base}/src/contrib/Archive/{name}/{name}_{version}.tar.gz"),
    ]
}

/// `packages` (each with what it needs) in waves: each wave's packages
/// need only ones in earlier waves (or ones not in the list). A cycle is
/// an error naming its packages.
pub fn waves(packages: &[(String, Vec<String>)]) -> Result<Vec<Vec<String>>, String> {
    let mut done: Vec<&str> = Vec::new();
    let mut left: Vec<&(String, Vec<String>)> = packages.iter().collect();
    let mut out = Vec::new();
    while !left.is_empty() {
        let ready: Vec<&str> = left
            .iter()
            .filter(|(_, needs)| {
                needs.iter().all(|n| done.contains(&n.as_str()) || !packages.iter().any(|(p, _)| p == n))
            })
            .map(|(p, _)| p.as_str())
            .collect();
        if ready.is_empty() {
            let names: Vec<&str> = left.iter().map(|(p, _)| p.as_str()).collect();
            return Err(format!("the packages {} need each other in a cycle", names.join(", ")));
        }
        left.retain(|(p, _)| !ready.contains(&p.as_str()));
        done.extend(&ready);
        out.push(ready.into_iter().map(str::to_string).collect());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted(origin: Origin) -> Wanted {
        Wanted { name: "R6".into(), version: "2.5.0".into(), origin, needs: None }
    }

    #[test]
    fn a_mapped_name_overrides_the_clients_url_and_only_mapped_refuses_the_rest() {
        let cran = wanted(Origin::Repository { name: "CRAN".into(), url: Some("https://cloud.r-project.org".into()) });
        let mine = wanted(Origin::Repository { name: "Mine".into(), url: Some("http://mine".into()) });
        let mut repos = Repositories { mapped: vec![("cran".into(), "file:///srv/cran".into())], only_mapped: false };
        assert_eq!(repos.url_for(&cran).unwrap(), "file:///srv/cran");
        assert_eq!(repos.url_for(&mine).unwrap(), "http://mine");
        repos.only_mapped = true;
        assert!(repos.url_for(&mine).unwrap_err().contains("map Mine"));
        let git = wanted(Origin::Git { host: "github".into(), repo: "r-lib/R6".into() });
        let err = repos.url_for(&git).unwrap_err();
        assert!(err.contains("R6 2.5.0") && err.contains("github"), "{err}");
    }

    #[test]
    fn archived_tarballs_are_tried_after_current_ones() {
        assert_eq!(
            tarball_urls("http://h/cran/", "R6", "2.5.0"),
            ["http://h/cran/src/contrib/R6_2.5.0.tar.gz", "http://h/cran/src/contrib/Archive/R6/R6_2.5.0.tar.gz"]
        );
    }

    #[test]
    fn waves_put_each_package_after_what_it_needs_and_name_a_cycle() {
        let p = |n: &str, needs: &[&str]| (n.to_string(), needs.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let got = waves(&[p("base64url", &["backports"]), p("backports", &["utils"]), p("R6", &[])]).unwrap();
        assert_eq!(got, vec![vec!["backports".to_string(), "R6".to_string()], vec!["base64url".to_string()]]);
        assert!(waves(&[p("a", &["b"]), p("b", &["a"])]).unwrap_err().contains("a, b"));
    }
}
