//! A worker's private view of the files, as steps for its mount namespace
//! (pure: paths in, steps out; `enter` carries them out between fork and
//! exec). What must be hidden is covered (a folder by an empty tmpfs, a
//! file by an empty one); what must stay visible and lies under a cover is
//! cloned first and put back at its own path afterwards; the app's private
//! temporary folder is put over `/tmp` and `/var/tmp`. Folders the app's
//! user cannot pass through on the way to what it must see (`/root`, a
//! temporary folder of mode 0700) are covered too, so the way in is made of
//! the cover's open folders while what it holds stays hidden.

use std::path::{Path, PathBuf};

/// What one app's workers see, before it is turned into steps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    /// Hidden: other apps' folders, valve's config, state and run directory, /home, /root.
    pub hide: Vec<PathBuf>,
    /// Visible at their own paths whatever covers them: the app's folder, its
    /// private home and run folder, R's library folders.
    pub show: Vec<PathBuf>,
    /// Where the app's private temporary folder is put: `/tmp`, `/var/tmp`.
    pub tmp_at: Vec<PathBuf>,
    /// Shared-memory folders each worker gets empty and its own (`/dev/shm`).
    pub scratch: Vec<PathBuf>,
    /// The app's private temporary folder.
    pub tmp: PathBuf,
}

/// How a path is covered.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cover {
    /// An empty, read-only-for-apps tmpfs over a folder.
    Empty(PathBuf),
    /// An empty file over a file.
    EmptyFile(PathBuf),
    /// Clone number `n` put over the path (the private temporary folder over /tmp).
    Clone(usize, PathBuf),
    /// An empty tmpfs anyone may write to (mode 1777), private to the worker.
    Scratch(PathBuf),
}

/// The steps, in the order they must run.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Steps {
    /// Trees to clone before anything is covered (numbered by position).
    pub clones: Vec<PathBuf>,
    /// Covers made first: none lies inside what is put back.
    pub covers: Vec<Cover>,
    /// Clones put back at these paths (their folders made first), shallow first.
    pub places: Vec<(usize, PathBuf)>,
    /// Covers inside what was put back (another app's folder inside this one's).
    pub inner: Vec<Cover>,
}

/// What kind of thing is at a path, for the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Folder,
    File,
    Missing,
}

fn under(path: &Path, root: &Path) -> bool {
    path != root && path.starts_with(root)
}

fn depth(p: &Path) -> usize {
    p.components().count()
}

/// Turns a view into steps. `kind` says what a path is; `blocked` names the
/// first folder on the way to a path that the app's user cannot pass through.
pub fn plan(view: &View, kind: impl Fn(&Path) -> Kind, blocked: impl Fn(&Path) -> Option<PathBuf>) -> Steps {
    let show: Vec<PathBuf> = {
        let mut s: Vec<PathBuf> = view.show.iter().filter(|p| kind(p) != Kind::Missing).cloned().collect();
        s.sort_by_key(|p| depth(p));
        s.dedup();
        s
    };
    // Everything to cover, with what covers it.
    let mut outer: Vec<Cover> = Vec::new();
    let mut inner: Vec<Cover> = Vec::new();
    let tmp_at: Vec<&PathBuf> = view.tmp_at.iter().filter(|p| kind(p) == Kind::Folder).collect();
    // One clone of the private temporary folder for each place it goes (a clone moves once).
    let mut clones: Vec<PathBuf> = Vec::new();
    for at in tmp_at {
        clones.push(view.tmp.clone());
        outer.push(Cover::Clone(clones.len() - 1, at.clone()));
    }
    outer.extend(view.scratch.iter().filter(|p| kind(p) == Kind::Folder).map(|p| Cover::Scratch(p.clone())));
    let mut hidden: Vec<PathBuf> = view.hide.clone();
    hidden.extend(show.iter().filter_map(|p| blocked(p)));
    hidden.sort_by_key(|p| depth(p));
    hidden.dedup();
    for h in hidden {
        let k = kind(&h);
        if k == Kind::Missing || show.contains(&h) {
            continue;
        }
        let cover = if k == Kind::Folder { Cover::Empty(h.clone()) } else { Cover::EmptyFile(h.clone()) };
        if show.iter().any(|s| under(&h, s)) {
            inner.push(cover);
        } else {
            outer.push(cover);
        }
    }
    // An outer cover inside another outer cover is hidden already.
    let covered_at: Vec<PathBuf> = outer.iter().map(cover_path).cloned().collect();
    outer.retain(|c| !covered_at.iter().any(|other| under(cover_path(c), other)));
    let covered_at: Vec<PathBuf> = outer.iter().map(cover_path).cloned().collect();
    // What to put back: a shown path under a cover, unless a shown path
    // above it is put back already (its clone holds it).
    let mut places = Vec::new();
    let mut placed: Vec<PathBuf> = Vec::new();
    for s in &show {
        let hidden_by_cover = covered_at.iter().any(|c| under(s, c) || s == c);
        if !hidden_by_cover || placed.iter().any(|p| under(s, p)) {
            continue;
        }
        clones.push(s.clone());
        places.push((clones.len() - 1, s.clone()));
        placed.push(s.clone());
    }
    // An inner cover inside another inner cover is hidden already.
    let inner_at: Vec<PathBuf> = inner.iter().map(cover_path).cloned().collect();
    inner.retain(|c| !inner_at.iter().any(|other| under(cover_path(c), other)));
    Steps { clones, covers: outer, places, inner }
}

pub fn cover_path(c: &Cover) -> &PathBuf {
    match c {
        Cover::Empty(p) | Cover::EmptyFile(p) | Cover::Clone(_, p) | Cover::Scratch(p) => p,
    }
}

/// Every folder from the root down to `path` (for making a path inside a cover).
pub fn prefixes(path: &Path) -> Vec<PathBuf> {
    let mut at = PathBuf::new();
    let mut out = Vec::new();
    for part in path.components() {
        at.push(part);
        if at.parent().is_some() {
            out.push(at.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    fn folders(s: &Path) -> Kind {
        if s.extension().is_some_and(|e| e == "toml") {
            Kind::File
        } else if s.starts_with("/gone") {
            Kind::Missing
        } else {
            Kind::Folder
        }
    }

    #[test]
    fn other_apps_and_valves_files_are_covered_the_apps_own_put_back() {
        let view = View {
            hide: vec![p("/srv/site"), p("/srv/site/beta"), p("/etc/valve/site.toml"), p("/root"), p("/gone/x")],
            show: vec![p("/srv/site/alpha"), p("/var/lib/valve/apps/alpha/home")],
            tmp_at: vec![p("/tmp"), p("/var/tmp")],
            scratch: vec![p("/dev/shm")],
            tmp: p("/run/valve-1/tmp/alpha"),
        };
        let steps = plan(&view, folders, |_| None);
        assert_eq!(steps.clones, vec![p("/run/valve-1/tmp/alpha"), p("/run/valve-1/tmp/alpha"), p("/srv/site/alpha")]);
        assert_eq!(
            steps.covers,
            vec![
                Cover::Clone(0, p("/tmp")),
                Cover::Clone(1, p("/var/tmp")),
                Cover::Scratch(p("/dev/shm")),
                Cover::Empty(p("/root")),
                Cover::Empty(p("/srv/site")),
                Cover::EmptyFile(p("/etc/valve/site.toml")),
            ],
            "beta is inside the site's cover already; what does not exist is skipped"
        );
        assert_eq!(steps.places, vec![(2, p("/srv/site/alpha"))]);
        assert!(steps.inner.is_empty());
    }

    #[test]
    fn a_way_the_user_cannot_pass_is_covered_and_the_app_put_back_inside() {
        let view = View {
            hide: vec![p("/home"), p("/root")],
            show: vec![p("/root/valve/examples"), p("/tmp/.tmpAB/app")],
            tmp_at: vec![p("/tmp")],
            scratch: vec![],
            tmp: p("/tmp/valve-1/tmp/app"),
        };
        let blocked = |s: &Path| {
            if s.starts_with("/root") {
                Some(p("/root"))
            } else if s.starts_with("/tmp/.tmpAB") {
                Some(p("/tmp/.tmpAB"))
            } else {
                None
            }
        };
        let steps = plan(&view, folders, blocked);
        assert_eq!(
            steps.covers,
            vec![Cover::Clone(0, p("/tmp")), Cover::Empty(p("/home")), Cover::Empty(p("/root"))],
            "/tmp/.tmpAB lies under the private /tmp: nothing to cover there"
        );
        assert_eq!(steps.places, vec![(1, p("/root/valve/examples")), (2, p("/tmp/.tmpAB/app"))]);
    }

    #[test]
    fn another_app_inside_this_ones_folder_is_covered_after_it_is_put_back() {
        // A site's root app serves the site folder, which holds the other apps.
        let view = View {
            hide: vec![p("/srv/site/beta"), p("/srv")],
            show: vec![p("/srv/site")],
            tmp_at: vec![],
            scratch: vec![],
            tmp: p("/x"),
        };
        let steps = plan(&view, folders, |_| None);
        assert_eq!(steps.covers, vec![Cover::Empty(p("/srv"))]);
        assert_eq!(steps.places, vec![(0, p("/srv/site"))]);
        assert_eq!(steps.inner, vec![Cover::Empty(p("/srv/site/beta"))]);
    }

    #[test]
    fn a_shown_path_inside_another_comes_back_with_it_and_the_app_is_never_hidden() {
        let view = View {
            hide: vec![p("/srv"), p("/srv/a")],
            show: vec![p("/srv/a"), p("/srv/a/lib")],
            tmp_at: vec![],
            scratch: vec![],
            tmp: p("/x"),
        };
        let steps = plan(&view, folders, |_| None);
        assert_eq!(steps.places, vec![(0, p("/srv/a"))]);
        assert!(steps.inner.is_empty(), "the app's own folder is never covered");
        assert_eq!(prefixes(Path::new("/srv/a/b")), vec![p("/srv"), p("/srv/a"), p("/srv/a/b")]);
    }
}
