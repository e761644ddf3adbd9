//! What is decided once every app of a configuration is read: whom each
//! app's R runs as (an app's own uid: the one the uid table gives it, a
//! new name taking a free one) and whether that user can read the app's folder and
//! file, so that a configuration that cannot work stops valve (exit 2, also
//! under `--check`) instead of failing at its first worker.

use super::isolation::Isolation;
use super::model::AppConfig;
use super::uid_store::{Store, UidNotes};
use super::users::{self, Kernel, RunAs};

/// Why an app cannot run as configured.
#[derive(Debug, PartialEq, Eq)]
pub enum Unfit {
    /// `run_as` names no user, or one valve cannot switch to.
    RunAs(String),
    /// The app's user cannot read its folder or file (or reach it, without a private view).
    Folder(String),
    /// No uid is free for the app, or (no app's) the uid table cannot be used.
    Uid(String),
}

/// What `settle` found: what is wrong, by app index (`None`: no one app's),
/// and what to say about the uids.
#[derive(Debug, Default)]
pub struct Settled {
    pub unfit: Vec<(Option<usize>, Unfit)>,
    pub said: UidNotes,
    /// The package builders' uids (as root: one per build slot), in the uid table as `.builder-N`.
    pub builders: Vec<u32>,
}

/// The uid table's name of package build slot `n` (from 1): no app's name
/// starts with a dot, so none can take it.
pub fn builder_name(n: usize) -> String {
    format!(".builder-{n}")
}

/// Which published apps' folders `settle` checks. valve itself gives each
/// published version to its app's group: every kept version when valve
/// starts (after this load: the uid table may have given the app another
/// uid since, when the state directory was lost), and a version being
/// deployed before the deployment's checked load. So the folders under
/// `dir` are left unchecked, but for `checked`, the deployment's app.
#[derive(Clone, Copy, Debug, Default)]
pub struct PublishedCheck<'a> {
    pub dir: Option<&'a std::path::Path>,
    pub checked: Option<&'a str>,
}

impl PublishedCheck<'_> {
    fn skips(&self, app: &AppConfig) -> bool {
        self.dir.is_some_and(|dir| app.folder().starts_with(dir)) && self.checked != Some(app.name.as_str())
    }
}

/// Resolves each app's account in place, its own uid from the table in
/// `store`, and (as root) gives each of `builders` build slots a uid.
pub fn settle(
    apps: &mut [AppConfig],
    kernel: &Kernel,
    range: (u32, u32),
    store: &Store,
    published: PublishedCheck<'_>,
    builders: usize,
) -> Settled {
    let mut settled = Settled::default();
    let mut own_uids = std::collections::BTreeMap::new();
    if kernel.switch_users {
        let names: Vec<&str> = apps.iter().map(|a| a.name.as_str()).collect();
        let mut own: Vec<&str> = apps.iter().filter(|a| a.run_as == RunAs::Own).map(|a| a.name.as_str()).collect();
        let builder_names: Vec<String> = (1..=builders).map(builder_name).collect();
        own.extend(builder_names.iter().map(String::as_str));
        // A uid a configured run_as names, or a user of this machine, is nobody's own.
        let named: Vec<u32> = apps.iter().filter_map(|a| users::named_uid(&a.run_as)).collect();
        let taken = |uid: u32| uid == kernel.uid || named.contains(&uid) || users::known_uid(uid);
        match store.assign(&names, &own, range, &taken) {
            Ok(assigned) => {
                for (name, why) in assigned.refused {
                    let i = apps.iter().position(|a| a.name == name);
                    settled.unfit.push((i, Unfit::Uid(why)));
                }
                settled.builders = builder_names.iter().filter_map(|n| assigned.uids.get(n)).copied().collect();
                own_uids = assigned.uids;
                settled.said = assigned.said;
            }
            Err(why) => {
                settled.unfit.push((None, Unfit::Uid(why)));
                return settled;
            }
        }
    }
    let unfit = &mut settled.unfit;
    let view = Isolation::from_kernel(kernel) == Isolation::View;
    for (i, app) in apps.iter_mut().enumerate() {
        let own_uid = match own_uids.get(&app.name) {
            Some(uid) => *uid,
            None if kernel.switch_users && app.run_as == RunAs::Own => continue, // refused above
            None => 0,
        };
        match users::resolve(&app.name, &app.run_as, own_uid, kernel) {
            Ok(account) => app.account = account,
            Err(why) => {
                unfit.push((Some(i), Unfit::RunAs(format!("app `{}`: {why}", app.name))));
                continue;
            }
        }
        if app.is_static() || published.skips(app) {
            // valve serves static content itself: no R, no user of its own to read it.
            continue;
        }
        let folder = app.folder();
        let file = Some(app.source.path()).filter(|p| *p != folder.as_path());
        if let Err(why) = users::check_readable(&app.name, &app.account, &folder, file) {
            unfit.push((Some(i), Unfit::Folder(why)));
            continue;
        }
        if !view {
            if let Some(blocked) = users::blocked_ancestor(&app.account, &folder.join(".")) {
                unfit.push((
                    Some(i),
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
    settled
}
