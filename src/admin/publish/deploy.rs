//! A deployment: make a kept version of a published app the one it serves.
//! It is a reload: the configuration the switch would give is loaded first
//! (with this version as the app's), the version's packages are restored or
//! checked (nothing switches if one is missing or at another version), then
//! valve reloads with this version as the app's: the new generation starts
//! beside the old one and takes over once it serves, and only then does the
//! record name it (so every valve sharing `publish_dir` switches to a version
//! that served, and one that dies midway leaves them on the version before).
//! If it cannot start, the previous generation, which never stopped, serves
//! on. Every step is said in the task's log, which clients print as it comes.

use std::sync::Arc;
use std::time::Duration;

use super::lease;
use super::publisher::Publisher;
use super::store;
use super::tasks::Task;
use super::unpack::Modes;
use crate::config::publish::{app_dir, version_dir, Candidate, VersionRule};
use crate::config::AppConfig;
use crate::worker::packages;
use crate::worker::sandbox::Site;

/// The most a deployment waits for its new generation beyond the app's
/// start timeout (a render, the first worker's warm-up).
const SWITCH_SLACK: Duration = Duration::from_secs(60);

/// The lease in an app's folder that one deployment of it holds.
pub const DEPLOY_LOCK: &str = ".deploy.lock";

/// A deployment's lease unrenewed this long was left by a valve that died
/// (its holder renews it every `lease::RENEW`).
const DEPLOY_STALE: Duration = Duration::from_secs(10);

/// The longest a deployment waits for another valve's of the same app (one
/// that restores packages from source may take minutes).
const DEPLOY_WAIT: Duration = Duration::from_secs(30 * 60);

/// What is wrong with the packages of a bundle: each one missing or at
/// another version than `rule` allows, with the version wanted and found.
pub fn package_problems(
    wanted: &[(String, String)],
    found: &[(String, Option<String>)],
    rule: VersionRule,
) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, version) in wanted {
        match found.iter().find(|(n, _)| n == name).and_then(|(_, v)| v.as_deref()) {
            None => problems.push(format!("{name} (not installed; the bundle has {version})")),
            Some(have) if !version.is_empty() && !rule.admits(version, have) => {
                problems.push(format!("{name} (the bundle has {version}, the app's R has {have})"))
            }
            Some(_) => {}
        }
    }
    problems
}

/// Runs the deployment of version `version` of app `name` for `key`,
/// saying each step in `task`, and finishes the task.
pub async fn run(publisher: Arc<Publisher>, task: Arc<Task>, name: String, version: u32, key: String) {
    // One deployment of an app at a time among the valves sharing publish_dir, then one at a time here.
    let lock = app_dir(&publisher.settings.dir, &name).join(DEPLOY_LOCK);
    let says = |holder: &str| task.say(format!("Waiting for a deployment of {name} by {holder} to finish"));
    let mut lease = match lease::take(&lock, DEPLOY_STALE, DEPLOY_WAIT, says).await {
        Ok(l) => l,
        Err(e) => {
            publisher.counted(&name, false);
            task.finish(Err(format!("{e}; nothing changed")));
            return;
        }
    };
    lease.keep_renewed();
    if publisher.deploying.try_lock().is_err() {
        task.say("Waiting for another deployment to finish");
    }
    let _one = publisher.deploying.lock().await;
    let result = deploy(&publisher, &task, &name, version, &key).await;
    drop(lease);
    publisher.counted(&name, result.is_ok());
    publisher.refresh();
    task.finish(result);
}

async fn deploy(
    publisher: &Arc<Publisher>,
    task: &Task,
    name: &str,
    version: u32,
    key: &str,
) -> Result<String, String> {
    let p = &publisher.settings;
    let record = publisher.locked(|p| store::by_name(p, name)).map_err(|f| f.message)?;
    let Some(v) = record.version(version).cloned() else {
        return Err(format!("{name} has no version {version}: upload a bundle first (kept: {:?})", versions(&record)));
    };
    task.say(format!("Deploying version {version} of {name} (uploaded by {}), for {key}", v.uploaded_by));
    task.say(format!(
        "Bundle: {} files, {} bytes, unpacked and checked on upload: {} ({})",
        v.files, v.bytes, v.appmode, v.kind
    ));
    // The configuration this deployment would switch to, before anything changes.
    let group = publisher.modes == Modes::Group;
    let (config, app) = load(publisher, name, version, !group).await?;
    let (config, app) = if group {
        // Only the app's group reads the version (its R runs as a user of its own); then the full check.
        let gid = if app.account.isolated() { app.account.gid } else { 0 };
        let folder = version_dir(&app_dir(&p.dir, name), version);
        tokio::task::spawn_blocking(move || store::give_group(&folder, gid))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
            .map_err(|e| format!("cannot give version {version} to the app's group {gid}: {e}; nothing changed"))?;
        load(publisher, name, version, true).await?
    } else {
        (config, app)
    };
    if app.is_static() {
        task.say("Static content: no R, no packages to restore");
    } else {
        let say = |line: String| task.say(line);
        match publisher.reloader.apps.restore_one(&app, &config, &Site::of(&config), &say).await {
            Ok(Some(_)) => {}
            Ok(None) => check_packages(publisher, task, &app, &Site::of(&config), &v.packages).await?,
            Err(e) => return Err(format!("{e}; nothing changed")),
        }
    }
    let serving = publisher.reloader.apps.configs().into_iter().find(|a| a.name == name);
    if record.active == Some(version) && serving.as_ref().is_some_and(|s| s.source == app.source) {
        return Ok(format!("Version {version} of {name} already serves at {}", publisher.app_url(name)));
    }
    // Switch: valve reloads with this version as the app's; the record names
    // it once it serves (then every valve sharing publish_dir switches too: a
    // valve that dies before leaves the record, and them, on the version before).
    let mut told = publisher.reloader.apps.promotions();
    task.say(format!("Starting version {version}'s workers beside the serving version"));
    let previous = record.active;
    let revert = |why: String| {
        let publisher = publisher.clone();
        async move {
            let _ = publisher.reloader.reload().await;
            match previous {
                Some(prev) => format!("{why}; version {prev} keeps serving"),
                None => format!("{why}; {name} is not served"),
            }
        }
    };
    let candidate = Candidate { app: name.to_string(), version, checked: true };
    let plan = match publisher.reloader.reload_with(Some(candidate)).await {
        Ok(plan) => plan,
        Err(e) => return Err(revert(format!("the configuration has problems, nothing changed: {e}")).await),
    };
    let record_it = || {
        publisher.writing(|p| store::activate(p, name, Some(version), key)).map(|_| ()).map_err(|f| {
            format!("version {version} serves here but could not be recorded as {name}'s active one: {}", f.message)
        })
    };
    if plan.unchanged.iter().any(|a| a == name) {
        record_it()?;
        return Ok(format!("Version {version} of {name} serves at {}", publisher.app_url(name)));
    }
    let path = app.source.path().to_path_buf();
    let deadline = app.start_timeout + SWITCH_SLACK;
    let outcome = tokio::time::timeout(deadline, async {
        loop {
            match told.recv().await {
                Ok(p) if p.app == name && p.path == path => return p.result,
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return Err("valve is stopping".into()),
            }
        }
    })
    .await
    .unwrap_or_else(|_| Err(format!("it did not serve within {}s", deadline.as_secs())));
    match outcome {
        Ok(()) => {
            if let Err(e) = record_it() {
                return Err(revert(e).await);
            }
            task.say("The new version serves: switched (the previous version finishes its requests and sessions)");
            let in_use = publisher.reloader.apps.paths_in_use();
            match publisher.writing(|p| store::prune(p, name, &in_use)) {
                Ok(removed) if !removed.is_empty() => {
                    task.say(format!("Removed old versions {removed:?} (publish_keep = {})", p.keep))
                }
                Ok(_) => {}
                Err(f) => task.say(format!("Could not remove old versions: {}", f.message)),
            }
            Ok(format!("Version {version} of {name} serves at {}", publisher.app_url(name)))
        }
        Err(why) => Err(revert(format!("version {version} could not start: {why}")).await),
    }
}

/// The configuration this deployment would switch to, and the app in it
/// (`checked`: its folder's readability by the app's user checked).
async fn load(
    publisher: &Publisher,
    name: &str,
    version: u32,
    checked: bool,
) -> Result<(crate::config::Config, AppConfig), String> {
    let candidate = Candidate { app: name.to_string(), version, checked };
    let source = publisher.reloader.source().clone();
    let loaded = tokio::task::spawn_blocking(move || source.load_with(Some(&candidate)))
        .await
        .map_err(|e| format!("the configuration could not be read: {e}"))?;
    let config =
        loaded.map_err(|e| format!("the configuration with this version has problems, nothing changed: {e}"))?;
    let app = config
        .apps
        .iter()
        .find(|a| a.name == name)
        .cloned()
        .ok_or_else(|| format!("{name} is not in the configuration this version gives"))?;
    Ok((config, app))
}

/// Asks the app's R (as its workers would run) for the bundle's packages.
async fn check_packages(
    publisher: &Publisher,
    task: &Task,
    app: &AppConfig,
    site: &Site,
    wanted: &[(String, String)],
) -> Result<(), String> {
    if app.is_static() {
        task.say("Static content: no R, no packages to check");
        return Ok(());
    }
    if wanted.is_empty() {
        task.say("The manifest names no packages: nothing to check");
        return Ok(());
    }
    task.say(format!(
        "Checking {} packages against what the app's R finds ({}, publish_versions = {})",
        wanted.len(),
        app.r_bin.display(),
        publisher.settings.versions.as_str()
    ));
    let (spec, _) =
        publisher.reloader.apps.spec(app, site).map_err(|e| format!("R could not be started as the app: {e}"))?;
    let names: Vec<String> = wanted.iter().map(|(n, _)| n.clone()).collect();
    let found = packages::installed(&spec, &names, app.start_timeout)
        .await
        .map_err(|e| format!("R could not say which packages it has: {e}"))?;
    task.say(format!("R {} with the libraries {}", found.r_version, found.lib_paths));
    let problems = package_problems(wanted, &found.packages, publisher.settings.versions);
    if problems.is_empty() {
        task.say(format!("Packages: all {} found", wanted.len()));
        return Ok(());
    }
    for p in &problems {
        task.say(format!("Package {p}"));
    }
    Err(format!(
        "{} of the bundle's packages are missing or at another version: {}. valve installs no packages: install them where the app's R finds them (such as apt-get install r-cran-NAME), keep an renv library in the app, or publish with the versions installed (publish_versions = \"at-least\" accepts later ones); nothing changed",
        problems.len(),
        problems.join(", ")
    ))
}

fn versions(record: &crate::config::publish::AppRecord) -> Vec<u32> {
    record.versions.iter().map(|v| v.version).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packages_missing_or_at_another_version_are_named() {
        let wanted = vec![
            ("plumber".to_string(), "1.2.1".to_string()),
            ("jsonlite".to_string(), "1.8.4".to_string()),
            ("nothere".to_string(), "0.1".to_string()),
            ("any".to_string(), String::new()),
        ];
        let found = vec![
            ("plumber".to_string(), Some("1.2.1".to_string())),
            ("jsonlite".to_string(), Some("1.8.9".to_string())),
            ("nothere".to_string(), None),
            ("any".to_string(), Some("3".to_string())),
        ];
        assert_eq!(
            package_problems(&wanted, &found, VersionRule::Exact),
            ["jsonlite (the bundle has 1.8.4, the app's R has 1.8.9)", "nothere (not installed; the bundle has 0.1)"]
        );
        assert_eq!(
            package_problems(&wanted, &found, VersionRule::AtLeast),
            ["nothere (not installed; the bundle has 0.1)"]
        );
        assert_eq!(package_problems(&wanted, &found[..1], VersionRule::Any).len(), 3, "not asked is not found");
    }
}
