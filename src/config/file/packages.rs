//! A config file's settings of apps' packages: `package_cache`,
//! `package_builds`, `package_build_timeout`, `repositories_only`,
//! `site_library` (a flag given explicitly wins) and the `[repositories]`
//! table, merged with `--repositories` (whose URL wins for a name in both).

use std::collections::BTreeMap;
use std::path::Path;

use toml::Spanned;

use super::Cx;
use crate::config::error::ConfigError;
use crate::config::flags::{cache_dir_problem, parse_repositories, repository_url, REPOSITORY_EXAMPLE};
use crate::config::model::PackageSettings;

/// The `[repositories]` table with each value's place.
#[derive(serde::Deserialize)]
struct Repositories {
    repositories: BTreeMap<String, Spanned<toml::Value>>,
}

impl Cx<'_> {
    /// The package settings; the cache defaults to `state_dir`'s.
    pub(super) fn package_settings(&mut self, base: &Path, state_dir: &Path) -> Option<PackageSettings> {
        let args = self.args;
        let a = &args.packages;
        let defaults = PackageSettings::defaults(state_dir);
        let cache_dir = self.package_cache(base, &defaults.cache_dir);
        let builds = a.package_builds.map(usize::from).unwrap_or(defaults.builds);
        let builds = self.count("package_builds", None, builds as u64, 1, 256);
        let build_timeout = self.seconds("package_build_timeout", None, &a.package_build_timeout, false);
        let repositories_only = self.boolean("repositories_only", None, a.repositories_only);
        let site_library = self.boolean("site_library", None, a.site_library);
        let repositories = self.repositories();
        Some(PackageSettings {
            cache_dir: cache_dir?,
            repositories: repositories?,
            repositories_only: repositories_only?,
            builds: builds? as usize,
            build_timeout: build_timeout?,
            site_library: site_library?,
        })
    }

    /// `package_cache`: a folder (relative to the config file's folder), else the flag's, else the default.
    fn package_cache(&mut self, base: &Path, default: &Path) -> Option<std::path::PathBuf> {
        let Some(v) = self.pick("package_cache", None) else {
            return match self.args.packages.package_cache() {
                Some(dir) => self.flag_result(dir.map_err(ConfigError::Packages)),
                None => Some(default.to_path_buf()),
            };
        };
        let Some(dir) = v.get_ref().as_str().filter(|d| !d.is_empty()) else {
            let message =
                format!("package_cache = {}: must be a folder, such as \"/var/cache/valve/packages\"", v.get_ref());
            self.at(v.span(), message);
            return None;
        };
        let dir = base.join(dir);
        if let Some(why) = cache_dir_problem(&dir) {
            self.at(v.span(), format!("package_cache = {why}"));
            return None;
        }
        Some(dir)
    }

    /// `[repositories]` and `--repositories`: the table's entries (by name),
    /// then the flag's; the flag's URL replaces the table's for the same name.
    fn repositories(&mut self) -> Option<Vec<(String, String)>> {
        let flag = parse_repositories(&self.args.packages.repositories).map_err(ConfigError::Packages);
        let flag = self.flag_result(flag);
        let mut list = self.repositories_table()?;
        for (name, url) in flag? {
            match list.iter_mut().find(|(n, _)| *n == name) {
                Some(entry) => entry.1 = url,
                None => list.push((name, url)),
            }
        }
        Some(list)
    }

    /// The `[repositories]` table: `NAME = "URL"`, each URL checked at its place.
    fn repositories_table(&mut self) -> Option<Vec<(String, String)>> {
        let Some(v) = self.top.get("repositories") else { return Some(Vec::new()) };
        let table = match v.get_ref().is_table().then(|| toml::from_str::<Repositories>(self.text)) {
            Some(Ok(t)) => t.repositories,
            _ => {
                let message = format!(
                    "repositories must be a table: write a [repositories] table with one line per repository, such as CRAN = \"{REPOSITORY_EXAMPLE}\""
                );
                self.at(v.span(), message);
                return None;
            }
        };
        let mut list = Vec::new();
        let mut fine = true;
        for (name, value) in table {
            let checked = match value.get_ref() {
                toml::Value::String(url) => repository_url(url).map_err(|why| {
                    format!("repositories: {name} = {url:?} {why}: write {name} = \"{REPOSITORY_EXAMPLE}\" (or a mirror's http://, https:// or file:/// URL)")
                }),
                other => Err(format!(
                    "repositories: {name} = {other} is not a URL: write it in quotes, such as {name} = \"{REPOSITORY_EXAMPLE}\""
                )),
            };
            match checked {
                Ok(url) => list.push((name, url)),
                Err(message) => {
                    self.at(value.span(), message);
                    fine = false;
                }
            }
        }
        fine.then_some(list)
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use clap::Parser;

    use crate::config::file::load;
    use crate::config::flags::Args;
    use crate::config::problems::Problems;
    use crate::config::Config;

    fn args(extra: &[&str]) -> Args {
        let mut argv = vec!["valve"];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv).unwrap()
    }

    /// A config file of `top` and one app, loaded with `flags`.
    fn load_with(top: &str, flags: &[&str]) -> (tempfile::TempDir, Result<Config, Problems>) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("plumber.R"), "").unwrap();
        let path = dir.path().join("valve.toml");
        let text = format!("state_dir = \"/srv/state\"\n{top}\n\n[[app]]\nfile = \"plumber.R\"\n");
        std::fs::write(&path, text).unwrap();
        let mut a = args(flags);
        a.explicit = flags.iter().filter_map(|f| f.strip_prefix("--")).map(|f| f.replace('-', "_")).collect();
        let loaded = load(&path, &a);
        (dir, loaded)
    }

    fn problems(top: &str) -> Vec<(usize, String)> {
        let (_d, loaded) = load_with(top, &[]);
        loaded.err().expect("refused").list.into_iter().map(|p| (p.line, p.message)).collect()
    }

    #[test]
    fn defaults_follow_the_files_state_dir() {
        let (_d, c) = load_with("", &[]);
        let p = c.unwrap().server.packages;
        assert_eq!(p, crate::config::PackageSettings::defaults(std::path::Path::new("/srv/state")));
        assert_eq!(p.cache_dir, PathBuf::from("/srv/state/packages"));
    }

    #[test]
    fn every_key_is_read_and_a_relative_cache_starts_at_the_files_folder() {
        let top = "package_cache = \"cache\"\npackage_builds = 3\npackage_build_timeout = 120\n\
                   repositories_only = true\nsite_library = false\n\n\
                   [repositories]\nCRAN = \"https://cran.example.org/\"\nlocal = \"file:///srv/cran\"";
        let (d, c) = load_with(top, &[]);
        let p = c.unwrap().server.packages;
        let base = std::fs::canonicalize(d.path()).unwrap();
        assert_eq!(p.cache_dir, base.join("cache"));
        assert_eq!((p.builds, p.build_timeout), (3, Duration::from_secs(120)));
        assert_eq!((p.repositories_only, p.site_library), (true, false));
        let repos = vec![
            ("CRAN".to_string(), "https://cran.example.org".to_string()),
            ("local".to_string(), "file:///srv/cran".to_string()),
        ];
        assert_eq!(p.repositories, repos);
        let (_d, c) = load_with("package_cache = \"/var/cache/pkgs\"", &[]);
        assert_eq!(c.unwrap().server.packages.cache_dir, PathBuf::from("/var/cache/pkgs"));
    }

    #[test]
    fn flags_win_over_the_file_and_their_repositories_over_the_tables() {
        let top = "package_builds = 3\n\n[repositories]\nCRAN = \"https://cran.example.org\"\n\
                   BioCsoft = \"https://bioc.example.org\"";
        let flags =
            ["--package-builds", "5", "--repositories", "CRAN=http://mirror.local/cran,RSPM=https://p3m.dev/cran"];
        let (_d, c) = load_with(top, &flags);
        let p = c.unwrap().server.packages;
        assert_eq!(p.builds, 5);
        let repos: Vec<(&str, &str)> = p.repositories.iter().map(|(n, u)| (n.as_str(), u.as_str())).collect();
        assert_eq!(
            repos,
            [
                ("BioCsoft", "https://bioc.example.org"),
                ("CRAN", "http://mirror.local/cran"),
                ("RSPM", "https://p3m.dev/cran")
            ]
        );
    }

    #[test]
    fn a_repository_of_another_scheme_is_refused_at_its_line() {
        let top = "[repositories]\nCRAN = \"https://cran.example.org\"\nold = \"ftp://ftp.example.org/cran\"";
        assert_eq!(
            problems(top),
            [(4, "repositories: old = \"ftp://ftp.example.org/cran\" is not an http://, https:// or file:// URL: write old = \"https://cloud.r-project.org\" (or a mirror's http://, https:// or file:/// URL)".to_string())]
        );
    }

    #[test]
    fn a_repository_that_is_not_a_string_is_refused_at_its_line() {
        assert_eq!(
            problems("[repositories]\nCRAN = 5"),
            [(3, "repositories: CRAN = 5 is not a URL: write it in quotes, such as CRAN = \"https://cloud.r-project.org\"".to_string())]
        );
        let said = problems("repositories = \"CRAN=https://cran.example.org\"");
        assert_eq!(said.len(), 1);
        assert!(said[0].1.starts_with("repositories must be a table: write a [repositories] table"), "{said:?}");
    }

    #[test]
    fn package_builds_of_zero_and_bad_keys_are_refused_at_their_lines() {
        assert_eq!(
            problems("package_builds = 0"),
            [(2, "package_builds = 0: must be a whole number from 1 to 256".to_string())]
        );
        assert_eq!(problems("package_builds = 257")[0].1, "package_builds = 257: must be a whole number from 1 to 256");
        let said = problems("package_build_timeout = 0");
        assert!(said[0].1.starts_with("package_build_timeout = 0: not a number of seconds above 0"), "{said:?}");
        assert_eq!(problems("site_library = \"no\"")[0].1, "site_library = \"no\": must be true or false");
        assert!(problems("package_cache = 1")[0].1.starts_with("package_cache = 1: must be a folder"));
    }

    #[test]
    fn a_bad_repositories_flag_is_said_beside_a_file() {
        let (_d, loaded) = load_with("", &["--repositories", "CRAN"]);
        let list = loaded.err().expect("refused").list;
        assert_eq!(list.len(), 1);
        assert!(list[0].message.starts_with("--repositories \"CRAN\" has no `=`: write NAME=URL"), "{list:?}");
    }
}
