//! The flags of apps' packages (`--package-cache`, `--package-builds`,
//! `--package-build-timeout`, `--repositories`, `--repositories-only`,
//! `--site-library`), flattened into `Args`, and the checks of a repository's
//! name and URL the config file reader shares.

use std::path::{Path, PathBuf};

use crate::config::error::{parse_seconds, ConfigError};
use crate::config::model::PackageSettings;

/// How apps' packages are restored. The fields' names are the config keys
/// (a `[repositories]` table for `repositories`).
#[derive(clap::Args, Debug, Clone)]
#[command(next_help_heading = "Packages")]
pub struct PackageFlags {
    /// Where apps' packages are kept: valve restores the exact package versions an app's
    /// manifest.json or renv.lock names into a library of the app's own, from a cache here shared
    /// by all apps (each version is fetched and built once, whichever apps use it). Default:
    /// `STATE_DIR/packages`, in --state-dir.
    #[arg(long = "package-cache", env = "VALVE_PACKAGE_CACHE", value_name = "DIR")]
    pub package_cache: Option<PathBuf>,

    /// Packages built at once while apps' libraries are restored (1 to 256). Default: the
    /// machine's cores minus one, at least 1.
    #[arg(long = "package-builds", env = "VALVE_PACKAGE_BUILDS", value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..=256))]
    pub package_builds: Option<u16>,

    /// Seconds one package's build may take; a build past it is stopped and the restore of the
    /// apps that need the package fails, naming it.
    #[arg(
        long = "package-build-timeout",
        env = "VALVE_PACKAGE_BUILD_TIMEOUT",
        default_value = "900",
        value_name = "SECONDS"
    )]
    pub package_build_timeout: String,

    /// Where packages come from, by the repository name an app's manifest.json or renv.lock gives
    /// (NAME=URL, comma-separated, such as CRAN=https://cran.example.org,BioCsoft=file:///srv/bioc):
    /// a mapped repository overrides the URL the manifest gives (a mirror, a copy inside the
    /// network). A version that is no longer the repository's current one is fetched from its
    /// Archive (src/contrib/Archive/PKG/). URLs are http://, https:// or file:///. In a config
    /// file: a `[repositories]` table of `NAME = "URL"` lines; for a name in both, this flag's URL wins.
    #[arg(long = "repositories", env = "VALVE_REPOSITORIES", default_value = "", value_name = "NAME=URL,...")]
    pub repositories: String,

    /// Fetch packages only from the repositories --repositories maps, never from a URL a
    /// manifest.json or renv.lock gives: a package from a repository not mapped is not fetched
    /// and the app's restore says which mapping to add. For machines that may reach only a mirror.
    #[arg(long = "repositories-only", env = "VALVE_REPOSITORIES_ONLY", default_value_t = false,
          action = clap::ArgAction::Set, value_name = "BOOL")]
    pub repositories_only: bool,

    /// Apps that name no packages (no packages in a manifest.json, no renv.lock) load what the
    /// server's site library holds, as R run by hand does. `false`: such apps see R's own library
    /// only (base and recommended packages). Apps that name packages always get their own library.
    #[arg(long = "site-library", env = "VALVE_SITE_LIBRARY", default_value_t = true,
          action = clap::ArgAction::Set, value_name = "BOOL")]
    pub site_library: bool,
}

/// What to write for a repository, in messages.
pub(in crate::config) const REPOSITORY_EXAMPLE: &str = "https://cloud.r-project.org";

impl PackageFlags {
    /// The flags' settings, checked; `state_dir` is where the cache goes by default.
    pub(in crate::config) fn settings(&self, state_dir: &Path) -> Result<PackageSettings, ConfigError> {
        let defaults = PackageSettings::defaults(state_dir);
        Ok(PackageSettings {
            cache_dir: match self.package_cache() {
                Some(dir) => dir.map_err(ConfigError::Packages)?,
                None => defaults.cache_dir,
            },
            repositories: parse_repositories(&self.repositories).map_err(ConfigError::Packages)?,
            repositories_only: self.repositories_only,
            builds: self.package_builds.map(usize::from).unwrap_or(defaults.builds),
            build_timeout: parse_seconds("--package-build-timeout", &self.package_build_timeout, false)?,
            site_library: self.site_library,
        })
    }

    /// `--package-cache`, made absolute against the current folder (`None`: not given).
    pub(in crate::config) fn package_cache(&self) -> Option<Result<PathBuf, String>> {
        let dir = self.package_cache.as_deref().filter(|d| !d.as_os_str().is_empty())?;
        let checked = match std::path::absolute(dir) {
            Ok(d) => match cache_dir_problem(&d) {
                Some(why) => Err(format!("--package-cache {why}")),
                None => Ok(d),
            },
            Err(e) => Err(format!("--package-cache {}: {e}", dir.display())),
        };
        Some(checked)
    }
}

/// What is wrong with a package cache's folder (it need not exist yet: valve makes it).
pub(in crate::config) fn cache_dir_problem(dir: &Path) -> Option<String> {
    (dir.exists() && !dir.is_dir()).then(|| format!("{} is a file: name a folder (valve creates it)", dir.display()))
}

/// `--repositories`: `NAME=URL`, comma-separated, each name once.
pub(in crate::config) fn parse_repositories(value: &str) -> Result<Vec<(String, String)>, String> {
    let mut out: Vec<(String, String)> = Vec::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((name, url)) = entry.split_once('=') else {
            return Err(format!(
                "--repositories {entry:?} has no `=`: write NAME=URL, such as CRAN={REPOSITORY_EXAMPLE} (several: comma-separated)"
            ));
        };
        let (name, url) = (name.trim(), url.trim());
        if name.is_empty() {
            return Err(format!(
                "--repositories {entry:?} names no repository: write NAME=URL, such as CRAN={REPOSITORY_EXAMPLE}"
            ));
        }
        let url = repository_url(url)
            .map_err(|why| format!("--repositories {name}={url:?} {why}: write {name}={REPOSITORY_EXAMPLE}"))?;
        if out.iter().any(|(n, _)| n == name) {
            return Err(format!("--repositories names {name} twice: give each repository one URL"));
        }
        out.push((name.to_string(), url));
    }
    Ok(out)
}

/// A repository's URL, checked: http://, https:// or file:/// with something
/// after the scheme; returned without a trailing `/`. The error says why,
/// to follow the value in a message.
pub(in crate::config) fn repository_url(url: &str) -> Result<String, String> {
    let scheme = ["http://", "https://", "file://"]
        .into_iter()
        .find(|s| url.get(..s.len()).is_some_and(|p| p.eq_ignore_ascii_case(s)));
    let Some(scheme) = scheme else {
        return Err("is not an http://, https:// or file:// URL".into());
    };
    if url.chars().any(char::is_whitespace) {
        return Err("holds a space (write spaces in a URL as %20)".into());
    }
    let trimmed = url.trim_end_matches('/');
    let rest = trimmed.get(scheme.len()..).unwrap_or("");
    if scheme == "file://" && !url[scheme.len()..].starts_with('/') {
        return Err("is not a file:/// URL of an absolute folder (such as file:///srv/cran)".into());
    }
    if rest.is_empty() {
        return Err(if scheme == "file://" { "names no folder" } else { "names no host" }.into());
    }
    Ok(trimmed.to_string())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;

    use super::*;
    use crate::config::flags::Args;

    fn args(extra: &[&str]) -> Args {
        let mut argv = vec!["valve"];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv).expect("flags parse")
    }

    #[test]
    fn defaults_put_the_cache_in_the_state_dir() {
        let s = args(&[]).packages.settings(Path::new("/var/lib/valve")).unwrap();
        assert_eq!(s, PackageSettings::defaults(Path::new("/var/lib/valve")));
        assert_eq!(s.cache_dir, PathBuf::from("/var/lib/valve/packages"));
        assert!(s.builds >= 1 && s.builds <= 256);
        assert_eq!((s.build_timeout, s.repositories_only, s.site_library), (Duration::from_secs(900), false, true));
        assert!(s.repositories.is_empty());
    }

    #[test]
    fn every_flag_is_read() {
        let given = [
            "--package-cache",
            "/srv/cache",
            "--package-builds",
            "4",
            "--package-build-timeout",
            "60.5",
            "--repositories",
            "CRAN=https://cran.example.org/, BioCsoft=file:///srv/bioc",
            "--repositories-only",
            "true",
            "--site-library",
            "false",
        ];
        let s = args(&given).packages.settings(Path::new("/state")).unwrap();
        assert_eq!(s.cache_dir, PathBuf::from("/srv/cache"));
        assert_eq!((s.builds, s.build_timeout), (4, Duration::from_millis(60_500)));
        let repos = vec![
            ("CRAN".to_string(), "https://cran.example.org".to_string()),
            ("BioCsoft".to_string(), "file:///srv/bioc".to_string()),
        ];
        assert_eq!(s.repositories, repos, "in the order given, without the trailing slash");
        assert_eq!((s.repositories_only, s.site_library), (true, false));
    }

    #[test]
    fn a_relative_cache_is_made_absolute_against_the_current_folder() {
        let s = args(&["--package-cache", "cache"]).packages.settings(Path::new("/state")).unwrap();
        assert_eq!(s.cache_dir, std::env::current_dir().unwrap().join("cache"));
        let file = tempfile::NamedTempFile::new().unwrap();
        let err = args(&["--package-cache", file.path().to_str().unwrap()])
            .packages
            .settings(Path::new("/state"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("--package-cache ") && err.ends_with("is a file: name a folder (valve creates it)"),
            "{err}"
        );
    }

    #[test]
    fn repositories_without_an_equals_sign_say_what_to_write() {
        let err = args(&["--repositories", "https://cran.example.org"])
            .packages
            .settings(Path::new("/state"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "--repositories \"https://cran.example.org\" has no `=`: write NAME=URL, such as CRAN=https://cloud.r-project.org (several: comma-separated)"
        );
    }

    #[test]
    fn repositories_refuse_other_schemes_blank_names_and_a_name_twice() {
        let refused = |v: &str| parse_repositories(v).unwrap_err();
        assert_eq!(
            refused("CRAN=ftp://cran.example.org"),
            "--repositories CRAN=\"ftp://cran.example.org\" is not an http://, https:// or file:// URL: write CRAN=https://cloud.r-project.org"
        );
        assert!(refused("=https://x").contains("names no repository"));
        assert!(refused("CRAN=https://").contains("names no host"));
        assert!(refused("CRAN=https://a,CRAN=https://b").contains("names CRAN twice"));
        assert_eq!(parse_repositories(" , ").unwrap(), vec![]);
    }

    #[test]
    fn repository_urls_are_http_https_or_absolute_file_urls() {
        assert_eq!(repository_url("HTTPS://cran.example.org/").unwrap(), "HTTPS://cran.example.org");
        assert_eq!(repository_url("http://10.0.0.1:8080/cran").unwrap(), "http://10.0.0.1:8080/cran");
        assert_eq!(repository_url("file:///srv/cran/").unwrap(), "file:///srv/cran");
        assert!(repository_url("file://srv/cran").unwrap_err().contains("absolute folder"));
        assert_eq!(repository_url("file:///").unwrap_err(), "names no folder");
        assert!(repository_url("cran.example.org").is_err());
        assert!(repository_url("https://cran example.org").unwrap_err().contains("space"));
    }

    /// The variables are process-wide and other tests parse flags meanwhile:
    /// the test binary runs `package_settings_from_variables` again, alone,
    /// in a child process with them set.
    #[test]
    fn variables_set_the_package_settings() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["config::flags::packages::tests::package_settings_from_variables", "--exact", "--include-ignored"])
            .env("VALVE_PACKAGE_CACHE", "/srv/pkgs")
            .env("VALVE_PACKAGE_BUILDS", "2")
            .env("VALVE_PACKAGE_BUILD_TIMEOUT", "30")
            .env("VALVE_REPOSITORIES", "CRAN=https://cran.example.org")
            .env("VALVE_REPOSITORIES_ONLY", "true")
            .env("VALVE_SITE_LIBRARY", "false")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    #[ignore = "run by variables_set_the_package_settings, with the variables set"]
    fn package_settings_from_variables() {
        if std::env::var_os("VALVE_PACKAGE_CACHE").is_none() {
            return;
        }
        let s = args(&[]).packages.settings(Path::new("/state")).unwrap();
        assert_eq!((s.cache_dir, s.builds, s.build_timeout), (PathBuf::from("/srv/pkgs"), 2, Duration::from_secs(30)));
        assert_eq!(s.repositories, vec![("CRAN".to_string(), "https://cran.example.org".to_string())]);
        assert_eq!((s.repositories_only, s.site_library), (true, false));
    }

    #[test]
    fn package_builds_out_of_range_is_refused_by_the_flag() {
        let argv = ["valve", "--package-builds", "0"];
        let err = Args::try_parse_from(argv).unwrap_err().to_string();
        assert!(err.contains("--package-builds") && err.contains("1..=256"), "{err}");
        assert!(Args::try_parse_from(["valve", "--package-builds", "257"]).is_err());
        assert_eq!(args(&["--package-builds", "256"]).packages.package_builds, Some(256));
    }
}
