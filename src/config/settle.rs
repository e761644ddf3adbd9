//! What is decided once every app of a configuration is read: whom each
//! app's R runs as (an app's own uid depends on the other apps' names only
//! when two collide) and whether that user can read the app's folder and
//! file, so that a configuration that cannot work stops valve (exit 2, also
//! under `--check`) instead of failing at its first worker.

use super::model::AppConfig;
use super::users::{self, Isolation, Kernel};

/// Why an app cannot run as configured.
#[derive(Debug, PartialEq, Eq)]
pub enum Unfit {
    /// `run_as` names no user, or one valve cannot switch to.
    RunAs(String),
    /// The app's user cannot read its folder or file (or reach it, without a private view).
    Folder(String),
}

/// Resolves each app's account in place; returns what is wrong, by app index.
/// The folder of app `unchecked` (a published version a deployment is about
/// to give to the app's group, which it learns from this) is not checked.
pub fn settle(
    apps: &mut [AppConfig],
    kernel: &Kernel,
    range: (u32, u32),
    unchecked: Option<&str>,
) -> Vec<(usize, Unfit)> {
    let names: Vec<&str> = apps.iter().map(|a| a.name.as_str()).collect();
    let own = users::own_uids(&names, range);
    let view = Isolation::from_kernel(kernel) == Isolation::View;
    let mut unfit = Vec::new();
    for (i, app) in apps.iter_mut().enumerate() {
        match users::resolve(&app.name, &app.run_as, own[i], kernel) {
            Ok(account) => app.account = account,
            Err(why) => {
                unfit.push((i, Unfit::RunAs(format!("app `{}`: {why}", app.name))));
                continue;
            }
        }
        if app.is_static() || unchecked == Some(app.name.as_str()) {
            // valve serves static content itself: no R, no user of its own to read it.
            continue;
        }
        let folder = app.folder();
        let file = Some(app.source.path()).filter(|p| *p != folder.as_path());
        if let Err(why) = users::check_readable(&app.name, &app.account, &folder, file) {
            unfit.push((i, Unfit::Folder(why)));
            continue;
        }
        if !view {
            if let Some(blocked) = users::blocked_ancestor(&app.account, &folder.join(".")) {
                unfit.push((
                    i,
                    Unfit::Folder(format!(
                        "app `{}`: its user {} cannot reach its folder {}: {} is not searchable by that user and valve cannot give apps a private view here (chmod o+x {}, move the app, or set run_as to a user who can)",
                        app.name,
                        app.account.describe(),
                        folder.display(),
                        blocked.display(),
                        blocked.display()
                    )),
                ));
            }
        }
    }
    unfit
}
