//! The sandbox of a package build or fetch: what restores an app's
//! packages runs as and sees. Never the app: a builder of its own (as
//! root, a builder uid; without root, valve's user under a Landlock
//! ruleset of the build's own), in a fresh folder of its own (its home and
//! temporary folder inside), seeing no app's folder and none of valve's
//! files, writing nowhere else, with an allow-listed environment and no
//! profile or environ file. Only what such a build made enters the shared
//! package cache, so no app's code or files reach another app's packages.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::enter::{self, Prepared};
use super::view::{self, View};
use super::{landlock, Site, OOM_SCORE_ADJ};
use crate::config::Isolation;

/// What a build's R gets of valve's environment: the search path, the
/// locale and time zone, R's own settings (not a user's profile or
/// environ, not its library paths: valve sets those), and what R's
/// downloader needs to reach a repository (proxies, certificate bundles).
pub fn build_inherits(name: &str) -> bool {
    let r_own = name.starts_with("R_")
        && !matches!(name, "R_PROFILE_USER" | "R_ENVIRON_USER" | "R_LIBS" | "R_LIBS_USER" | "R_LIBS_SITE");
    r_own
        || matches!(
            name,
            "PATH"
                | "LANG"
                | "LANGUAGE"
                | "TZ"
                | "http_proxy"
                | "https_proxy"
                | "no_proxy"
                | "HTTP_PROXY"
                | "HTTPS_PROXY"
                | "NO_PROXY"
                | "CURL_CA_BUNDLE"
                | "SSL_CERT_FILE"
                | "SSL_CERT_DIR"
        )
        || name.starts_with("LC_")
}

/// The whole environment of a build's R in `folder` (its home and
/// temporary folder inside it; `/tmp` in a private view), its libraries
/// `library` (none for a fetch).
pub fn build_env(folder: &Path, view: bool, library: Option<&Path>) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = std::env::vars().filter(|(k, _)| build_inherits(k)).collect();
    let tmp = if view && Path::new("/tmp").is_dir() { PathBuf::from("/tmp") } else { folder.join("tmp") };
    for (k, v) in [
        ("HOME", folder.join("home").display().to_string()),
        ("TMPDIR", tmp.display().to_string()),
        // No profile, no environ file of a user's: /dev/null is read, and holds nothing.
        ("R_PROFILE_USER", "/dev/null".to_string()),
        ("R_ENVIRON_USER", "/dev/null".to_string()),
    ] {
        env.push((k.to_string(), v));
    }
    if let Some(lib) = library {
        for k in ["R_LIBS", "R_LIBS_USER", "R_LIBS_SITE"] {
            env.push((k.to_string(), lib.display().to_string()));
        }
    }
    env
}

/// The sandbox of a build in `folder` (its parent: the cache's `tmp/`), as
/// `uid` when valve switches users, reading the library `library` (on its
/// way into the cache) besides the cache: the steps its child takes
/// between fork and exec.
pub fn for_build(
    site: &Site,
    run_dir: &Path,
    folder: &Path,
    uid: Option<u32>,
    library: Option<&Path>,
) -> io::Result<Arc<Prepared>> {
    let mut hide: Vec<PathBuf> = site.folders.iter().map(|(_, f)| f.clone()).collect();
    hide.extend(site.private.iter().cloned());
    hide.push(run_dir.to_path_buf());
    hide.extend(["/home", "/root"].map(PathBuf::from));
    // The cache's `tmp/` (other builds, libraries on their way in) is
    // among valve's private paths: a build sees its own folder and library
    // there. (As root each build's folder is its own uid's, 0700.)
    let mut show = vec![folder.to_path_buf(), site.packages.clone()];
    show.extend(library.map(Path::to_path_buf));
    show.extend(r_paths());
    let tmp = folder.join("tmp");
    let landlock = match site.isolation {
        Isolation::Landlock(abi) if uid.is_none() => {
            let mut hidden = hide.clone();
            hidden.extend(["/tmp", "/var/tmp", "/dev/shm"].map(PathBuf::from));
            if let Some(h) =
                std::env::var_os("HOME").map(PathBuf::from).filter(|h| h.is_absolute() && h != Path::new("/"))
            {
                show.push(h.join("R"));
                hidden.push(h);
            }
            let mut write = vec![folder.to_path_buf()];
            write.extend(
                ["/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/ptmx", "/dev/pts"].map(PathBuf::from),
            );
            Some(landlock::plan(abi, &hidden, &show, &write))
        }
        _ => None,
    };
    // The way to what it must see, through folders its uid cannot pass (a
    // state folder of mode 0700), is covered and put back, as for an app.
    let account = uid.map(|u| crate::config::Account {
        uid: u,
        gid: u,
        groups: vec![u],
        name: "valve-builder".into(),
        home: None,
        kind: crate::config::AccountKind::Own,
    });
    let steps = (site.isolation == Isolation::View).then(|| {
        // A view puts back what is shown under a cover once: the cache's
        // `tmp/` stays seen (what is in it is each build's own, by its mode).
        let tmp_dir = folder.parent();
        let view = View {
            hide: hide.into_iter().filter(|h| Some(h.as_path()) != tmp_dir).collect(),
            show,
            tmp_at: vec![PathBuf::from("/tmp"), PathBuf::from("/var/tmp")],
            scratch: vec![PathBuf::from("/dev/shm")],
            tmp,
        };
        view::plan(
            &view,
            |p| match std::fs::metadata(p) {
                Ok(m) if m.is_dir() => view::Kind::Folder,
                Ok(_) => view::Kind::File,
                Err(_) => view::Kind::Missing,
            },
            |p| account.as_ref().and_then(|a| crate::config::blocked_ancestor(a, p)),
        )
    });
    let groups: Vec<u32> = uid.into_iter().collect();
    Ok(Arc::new(Prepared::new(enter::Spec {
        steps: steps.as_ref(),
        workdir: Some(folder),
        data_limit: None,
        oom_score_adj: Some(OOM_SCORE_ADJ),
        ids: uid.map(|u| (u, u, groups.as_slice())),
        landlock: landlock.as_ref(),
    })?))
}

/// R's library folders from valve's environment and R's own folders: a
/// build needs them whatever covers them.
fn r_paths() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for key in ["R_LIBS", "R_LIBS_USER", "R_LIBS_SITE"] {
        if let Ok(v) = std::env::var(key) {
            out.extend(v.split(':').map(PathBuf::from).filter(|p| p.is_absolute()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_inherits_no_profile_environ_or_library_of_valves_and_reads_none_of_a_users() {
        for name in ["PATH", "LANG", "LC_ALL", "R_HOME", "https_proxy", "SSL_CERT_FILE"] {
            assert!(build_inherits(name), "{name}");
        }
        for name in ["R_PROFILE_USER", "R_ENVIRON_USER", "R_LIBS", "R_LIBS_USER", "HOME", "AWS_SECRET", "LD_PRELOAD"] {
            assert!(!build_inherits(name), "{name}");
        }
        let env = build_env(Path::new("/c/tmp/b1"), false, Some(Path::new("/c/tmp/lib-1")));
        let get = |k: &str| env.iter().rev().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("HOME"), Some("/c/tmp/b1/home"));
        assert_eq!(get("TMPDIR"), Some("/c/tmp/b1/tmp"));
        assert_eq!(get("R_PROFILE_USER"), Some("/dev/null"));
        assert_eq!(get("R_ENVIRON_USER"), Some("/dev/null"));
        assert_eq!(get("R_LIBS_USER"), Some("/c/tmp/lib-1"));
    }
}
