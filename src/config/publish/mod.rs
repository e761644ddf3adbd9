//! Publishing, as configuration: the settings (`publish_dir` turns it on,
//! `publish_keys_file`, `publish_addr`, `publish_keep`...), the keys file
//! (`keys`), the records valve keeps of what was published (`record`), and
//! the published apps as data: read on every load and reload and made
//! ordinary `AppConfig`s beside the configured ones, so the worker budget,
//! access rules and reloads apply to them unchanged.

mod keys;
mod record;
pub(super) mod settings;

use std::path::Path;

pub use keys::{new_key, parse_keys, read_keys, PublishKey, PublishKeys, MIN_KEY_CHARS};
pub use record::{app_dir, read_record, read_records, version_dir, write_record, AppRecord, VersionRecord, RECORD};
pub use settings::{Publishing, VersionRule};

use super::access::Allow;
use super::discover::{self, AppSource};
use super::error::ConfigError;
use super::model::AppConfig;

/// Which version one app takes in a load, instead of its record's active
/// one: a deployment checks the configuration it would switch to before
/// any record changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub app: String,
    pub version: u32,
    /// Check its folder's readability by the app's user: a deployment
    /// first loads without (to learn the app's account), gives the version
    /// to the app's group, then loads again with the check.
    pub checked: bool,
}

/// A published app as a load reads it.
#[derive(Clone, Debug)]
pub struct Published {
    /// Its record's guid (a name published anew has another).
    pub guid: String,
    pub name: String,
    pub version: u32,
    pub source: AppSource,
    pub allow: Allow,
}

/// The published apps that have an active version (or the candidate's), in
/// name order.
pub fn published(p: &Publishing, candidate: Option<&Candidate>) -> Result<Vec<Published>, ConfigError> {
    let bad = |why: String| ConfigError::Published(why);
    let mut out = Vec::new();
    for record in read_records(&p.dir).map_err(bad)? {
        let version = match candidate {
            Some(c) if c.app == record.name => Some(c.version),
            _ => record.active,
        };
        let Some(version) = version else { continue };
        let folder = version_dir(&app_dir(&p.dir, &record.name), version);
        let source = discover::resolve(&folder, "a published version").map_err(|e| {
            bad(format!(
                "the published app `{}` has no usable version {version} ({e}): activate another with `valve activate {} N`",
                record.name, record.name
            ))
        })?;
        out.push(Published {
            guid: record.guid.clone(),
            name: record.name.clone(),
            version,
            source,
            allow: Allow { users: record.allow_users.clone(), groups: record.allow_groups.clone() },
        });
    }
    Ok(out)
}

/// The configured app a published app named `name` would clash with: one
/// of the same name, or one on every host (a published app serves on every
/// host) whose path it would shadow or be shadowed by. The router takes the
/// longest prefix, so a configured app at `/` or at `/<name>` loses
/// `/<name>/...` to the published app, and one under `/<name>/` takes part
/// of the published app's paths. An app bound to a hostname is matched
/// before any other for its host, so it neither shadows nor is shadowed.
pub fn clash<'a>(name: &str, configured: &'a [AppConfig]) -> Option<&'a AppConfig> {
    let path = format!("/{name}");
    let under = format!("/{name}/");
    configured.iter().find(|a| {
        a.name == name
            || (a.hostname.is_none() && (a.prefix == "/" || a.prefix == path || a.prefix.starts_with(&under)))
    })
}

/// Why a published app named `name` cannot be beside configured app `with`,
/// and what to do.
pub fn clash_reason(name: &str, with: &AppConfig) -> String {
    if with.name == name {
        return format!(
            "the name {name:?} (and the path /{name}/) belongs to the app `{name}` in valve's configuration, at {}",
            with.prefix
        );
    }
    let how = if with.prefix.len() > name.len() + 1 {
        "it would lose those paths to the configured app, which is mounted under them"
    } else {
        "valve routes a request to the longest matching path, so the published app would take those paths (and the cookies and identity headers sent there) from it"
    };
    format!(
        "the path /{name}/ belongs to the app `{}` in valve's configuration, mounted at {}: {how}",
        with.name, with.prefix
    )
}

/// The error for a published app that clashes with a configured one.
pub(crate) fn clash_error(p: &Publishing, name: &str, with: &AppConfig) -> ConfigError {
    ConfigError::Published(format!(
        "the published app `{name}` (in {}) cannot be served: {}; mount the configured app under a path of its own (path = \"/NAME\" in its [[app]]) or rename it, or unpublish this one by removing its folder",
        app_dir(&p.dir, name).display(),
        clash_reason(name, with),
    ))
}

/// Adds the published apps to `apps` (made by `make` from each one's
/// source, name, prefix and allow lists). With no `max_workers` given
/// (`budget_given` false), the budget grows by their `n_max`.
pub(crate) fn add_published(
    p: &Publishing,
    candidate: Option<&Candidate>,
    apps: &mut Vec<AppConfig>,
    max_workers: &mut usize,
    budget_given: bool,
    mut make: impl FnMut(AppSource, String, String, Allow) -> Result<AppConfig, ConfigError>,
) -> Result<(), ConfigError> {
    let configured = apps.len();
    for one in published(p, candidate)? {
        if let Some(with) = clash(&one.name, &apps[..configured]) {
            return Err(clash_error(p, &one.name, with));
        }
        let mut app = make(one.source, one.name.clone(), format!("/{}", one.name), one.allow)?;
        app.instance = Some(one.guid);
        if !budget_given {
            *max_workers += app.n_max;
        }
        apps.push(app);
    }
    Ok(())
}

/// What a bundle unpacked in `dir` serves, checked against the kind its
/// manifest names (`metadata.appmode`).
pub fn bundle_source(dir: &Path, appmode: &str) -> Result<AppSource, String> {
    let wanted: &[&str] = match appmode {
        "api" => &["plumber-dir", "server-yml"],
        "shiny" => &["shiny"],
        "rmd-shiny" => &["shiny-rmd", "shiny-prerendered"],
        "quarto-shiny" => &["quarto-shiny"],
        "static" | "rmd-static" | "quarto-static" | "jupyter-static" => &["static"],
        other => {
            return Err(format!(
                "the manifest's appmode {other:?} is not one valve serves: publish a plumber API (api), a Shiny app (shiny), an interactive document (rmd-shiny, quarto-shiny) or static content with an index.html (static, rmd-static, quarto-static)"
            ))
        }
    };
    let what = match appmode {
        "api" => "a plumber API needs entrypoint.R or plumber.R at the bundle's top",
        "shiny" => "a Shiny app needs app.R or server.R at the bundle's top",
        "rmd-shiny" | "quarto-shiny" => {
            "an interactive document needs `runtime: shiny` (or `server: shiny`) in its front matter"
        }
        _ => "static content needs an index.html at the bundle's top: render documents to HTML before publishing them",
    };
    let source = discover::resolve(dir, "the bundle").map_err(|e| format!("appmode {appmode:?}: {what} ({e})"))?;
    if !wanted.contains(&source.kind()) {
        return Err(format!("appmode {appmode:?}: {what}; the bundle holds {} instead", source.kind()));
    }
    Ok(source)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Args, Command, Source};
    use clap::Parser;

    fn args(extra: &[&str]) -> Args {
        let mut argv = vec!["valve"];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv).expect("flags parse")
    }

    #[test]
    fn subcommands_leave_every_flag_as_it_was() {
        let a = args(&["-f", "api.R", "--port", "8080", "--n-max", "4"]);
        assert!(a.command.is_none(), "no subcommand: valve serves");
        assert_eq!((a.port, a.n_max), (8080, 4));
        let a = args(&["publish-key", "alice"]);
        assert!(matches!(a.command, Some(Command::PublishKey { ref name }) if name == "alice"));
        let a = args(&["--admin-addr", "127.0.0.1:9090", "activate", "sales", "3"]);
        assert!(matches!(a.command, Some(Command::Activate { ref app, version: 3, .. }) if app == "sales"));
        assert_eq!(a.admin_url_for(None).unwrap(), "http://127.0.0.1:9090", "--admin-addr names the admin address");
        assert_eq!(a.admin_url_for(Some("127.0.0.1:1/")).unwrap(), "http://127.0.0.1:1");
        let e = args(&["versions", "sales"]).admin_url_for(None).unwrap_err();
        assert!(e.contains("pass --admin URL"), "a port 0 admin address cannot be guessed: {e}");
        let a = args(&["access", "sales", "--users", "ann,bob", "--admin", "http://x:1"]);
        assert!(
            matches!(a.command, Some(Command::Access { ref users, open: false, .. }) if users.as_deref() == Some("ann,bob"))
        );
        assert!(Args::try_parse_from(["valve", "access", "x", "--open", "--users", "a"]).is_err());
    }

    /// A publish folder with app `name` active at version 1 (a plumber API), and a keys file.
    fn published_one(name: &str, users: Option<Vec<String>>) -> (tempfile::TempDir, String, String) {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("published");
        let app = app_dir(&dir, name);
        std::fs::create_dir_all(version_dir(&app, 1)).unwrap();
        std::fs::write(version_dir(&app, 1).join("plumber.R"), "#* @get /\nfunction() 1\n").unwrap();
        let record = AppRecord {
            id: 1,
            name: name.into(),
            active: Some(1),
            allow_users: users,
            versions: vec![VersionRecord { version: 1, ..Default::default() }],
            next_version: 2,
            ..Default::default()
        };
        write_record(&app, &record).unwrap();
        let keys = d.path().join("keys");
        std::fs::write(&keys, format!("ci {}\n", "k".repeat(30))).unwrap();
        // A plain key: only its owner may read the file.
        let private = <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600);
        std::fs::set_permissions(&keys, private).unwrap();
        let (dir, keys) = (dir.display().to_string(), keys.display().to_string());
        (d, dir, keys)
    }

    #[test]
    fn published_apps_join_the_configured_ones_with_their_allow_lists_and_the_budget() {
        let (d, dir, keys) = published_one("sales", Some(vec!["ann".into()]));
        let api = d.path().join("api.R");
        std::fs::write(&api, "").unwrap();
        let site = d.path().join("site");
        std::fs::create_dir_all(site.join("api")).unwrap();
        std::fs::write(site.join("api/plumber.R"), "").unwrap();
        let flags = ["--site", site.to_str().unwrap(), "--publish-dir", &dir, "--publish-keys-file", &keys];
        let c = Source::Site(site.clone(), args(&flags)).load().unwrap();
        let names: Vec<(&str, &str)> = c.apps.iter().map(|a| (a.name.as_str(), a.prefix.as_str())).collect();
        assert_eq!(names, [("api", "/api"), ("sales", "/sales")]);
        assert_eq!(c.apps[1].allow.users.as_deref(), Some(&["ann".to_string()][..]));
        assert_eq!(c.server.max_workers, 6, "the budget grows by the published app's n_max");
        assert_eq!(c.server.publish.as_ref().map(|p| p.keep), Some(5));
        // A deployment loads the configuration it would switch to.
        let c = Source::Site(site.clone(), args(&flags)).load_with(Some(&Candidate {
            app: "sales".into(),
            version: 2,
            checked: true,
        }));
        assert!(c.unwrap_err().to_string().contains("has no usable version 2"), "no such version yet");
        // A configured app at `/` would lose /sales/ to the published app: refused, naming both and the way out.
        let flags = ["-f", api.to_str().unwrap(), "--publish-dir", &dir, "--publish-keys-file", &keys];
        let e = args(&flags).single().unwrap_err().to_string();
        assert!(
            e.contains("the published app `sales`")
                && e.contains("the app `api` in valve's configuration, mounted at /:"),
            "{e}"
        );
        assert!(e.contains("mount the configured app under a path of its own"), "{e}");
        // A config file: the published app is an [[app]] of its own, under the file's defaults.
        let toml = d.path().join("valve.toml");
        std::fs::write(
            &toml,
            format!("n_max = 2\npublish_dir = \"{dir}\"\npublish_keys_file = \"{keys}\"\n[[app]]\nname = \"api\"\npath = \"/api\"\nfile = \"api.R\"\n"),
        )
        .unwrap();
        let c = Source::File(toml.clone(), args(&[])).load().unwrap();
        assert_eq!(c.apps.iter().map(|a| (a.name.as_str(), a.n_max)).collect::<Vec<_>>(), [("api", 2), ("sales", 2)]);
        assert_eq!(c.server.max_workers, 4);
        // An app mounted under the published app's path would take part of it: refused too.
        std::fs::write(
            &toml,
            format!("publish_dir = \"{dir}\"\npublish_keys_file = \"{keys}\"\n[[app]]\nname = \"api\"\npath = \"/sales/api\"\nfile = \"api.R\"\n"),
        )
        .unwrap();
        let e = Source::File(toml.clone(), args(&[])).load().unwrap_err().to_string();
        assert!(e.contains("mounted at /sales/api: it would lose those paths"), "{e}");
        // Its name taken by a configured app: a clear error.
        std::fs::write(&toml, format!("publish_dir = \"{dir}\"\npublish_keys_file = \"{keys}\"\n[[app]]\nname = \"sales\"\nfile = \"api.R\"\n")).unwrap();
        let e = Source::File(toml, args(&[])).load().unwrap_err().to_string();
        assert!(
            e.contains("the published app `sales`")
                && e.contains("belongs to the app `sales` in valve's configuration"),
            "{e}"
        );
        let e = args(&["-f", api.to_str().unwrap(), "--publish-dir", &dir]).single().unwrap_err().to_string();
        assert!(e.contains("--publish-dir needs --publish-keys-file"), "{e}");
    }

    #[test]
    fn a_published_name_clashes_with_a_configured_app_it_would_shadow_or_be_shadowed_by() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("api.R"), "").unwrap();
        let base = args(&["-f", d.path().join("api.R").to_str().unwrap()]).single().unwrap().apps[0].clone();
        let app = |name: &str, prefix: &str, host: Option<&str>| AppConfig {
            name: name.into(),
            prefix: prefix.into(),
            hostname: host.map(str::to_string),
            ..base.clone()
        };
        let named = |name: &str, apps: &[AppConfig]| clash(name, apps).map(|a| a.name.clone());
        let root = [app("api", "/", None)];
        assert_eq!(named("users", &root), Some("api".into()), "every path is the root app's");
        let apps = [app("docs", "/docs", None), app("deep", "/team/tools", None), app("other", "/", Some("a.example"))];
        assert_eq!(named("docs", &apps), Some("docs".into()));
        assert_eq!(named("team", &apps), Some("deep".into()), "/team/tools is under /team/");
        assert_eq!(named("doc", &apps), None, "a prefix of the string, not of the path");
        assert_eq!(named("docsx", &apps), None);
        assert_eq!(named("tools", &apps), None);
        assert_eq!(named("other", &apps), Some("other".into()), "names are unique on every host");
        assert_eq!(named("x", &apps), None, "a hostname's app is matched first for its host: no shadowing");
    }

    #[test]
    fn version_rules_compare_r_versions_as_numbers() {
        assert!(VersionRule::Exact.admits("1.2.0", "1.2"));
        assert!(!VersionRule::Exact.admits("1.2.3", "1.2.10"));
        assert!(VersionRule::AtLeast.admits("1.2.3", "1.2.10"), "10 is above 3, as numbers");
        assert!(VersionRule::AtLeast.admits("1.2-3", "1.2.3"));
        assert!(!VersionRule::AtLeast.admits("1.10.0", "1.9.9"));
        assert!(VersionRule::Any.admits("9.9", "0.1"));
        for rule in [VersionRule::Exact, VersionRule::AtLeast, VersionRule::Any] {
            assert_eq!(VersionRule::parse(rule.as_str()), Some(rule));
        }
    }

    #[test]
    fn a_bundles_kind_must_be_the_one_its_manifest_names() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("plumber.R"), "#* @get /\nfunction() 1\n").unwrap();
        assert_eq!(bundle_source(d.path(), "api").unwrap().kind(), "plumber-dir");
        let e = bundle_source(d.path(), "shiny").unwrap_err();
        assert!(e.contains("app.R or server.R") && e.contains("plumber-dir instead"), "{e}");
        let e = bundle_source(d.path(), "python-api").unwrap_err();
        assert!(e.contains("\"python-api\" is not one valve serves"), "{e}");
        let empty = tempfile::tempdir().unwrap();
        let e = bundle_source(empty.path(), "static").unwrap_err();
        assert!(e.contains("needs an index.html"), "{e}");
    }
}
