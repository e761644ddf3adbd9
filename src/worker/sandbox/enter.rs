//! Entering a sandbox: the one function a worker runs between fork and exec
//! (`Prepared::enter`), in a fixed order, each step failing closed and
//! naming itself: a mount namespace of its own and the view's covers, clones
//! put back and inner covers; the working directory (again, inside the
//! view: the one inherited would lead back to the real tree); the memory
//! limit and the OOM killer's preference; supplementary groups, gid, uid;
//! no new privileges. Everything is computed before the fork (paths as C
//! strings, step names), so the child only makes system calls: it runs in
//! a copy of a multi-threaded process, where allocating could deadlock.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{Gid, Mode, Uid, CWD};
use rustix::mount::{MountFlags, MountPropagationFlags, MoveMountFlags, OpenTreeFlags};
use rustix::process::{Resource, Rlimit};

use super::landlock::{self, Ruleset};
use super::view::{prefixes, Cover, Steps};

/// The most trees one view clones (the private /tmp, the app's folder, its
/// home, its run folder, R's libraries...).
pub const MAX_CLONES: usize = 32;

/// What the workers of one app become, computed once per generation.
#[derive(Debug)]
pub struct Prepared {
    view: Option<PreparedView>,
    workdir: Option<CString>,
    data_limit: Option<u64>,
    oom_score_adj: Option<CString>,
    ids: Option<Ids>,
    /// The app's Landlock ruleset, built once, entered last.
    landlock: Option<Ruleset>,
    /// Each step's name, by number, for the parent's error message.
    names: Vec<String>,
    /// The same steps as lines for the C executor a warm parent's fork runs
    /// (src/worker/zygote/enter.c).
    lines: Vec<String>,
    /// What it was made of, for the privileged spawner to check and make
    /// again (`None` with a Landlock ruleset: valve is not root, it starts
    /// its processes itself).
    owned: Option<Owned>,
}

/// `Spec` as a value of its own (without Landlock), as valve's server sends
/// it to the privileged spawner.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Owned {
    pub steps: Option<Steps>,
    pub workdir: Option<std::path::PathBuf>,
    pub data_limit: Option<u64>,
    pub oom_score_adj: Option<i32>,
    /// uid, gid, supplementary groups.
    pub ids: Option<(u32, u32, Vec<u32>)>,
}

impl Owned {
    /// The spec it holds.
    pub fn spec(&self) -> Spec<'_> {
        Spec {
            steps: self.steps.as_ref(),
            workdir: self.workdir.as_deref(),
            data_limit: self.data_limit,
            oom_score_adj: self.oom_score_adj,
            ids: self.ids.as_ref().map(|(u, g, groups)| (*u, *g, groups.as_slice())),
            landlock: None,
        }
    }
}

#[derive(Debug)]
struct Ids {
    uid: Uid,
    gid: Gid,
    groups: Vec<Gid>,
}

#[derive(Debug)]
struct PreparedView {
    clones: Vec<CString>,
    covers: Vec<PCover>,
    /// A clone, the folders its place is made in, the place, and whose
    /// file-system ids make them (`as_app`).
    places: Vec<(usize, Vec<CString>, CString, Option<(u32, u32)>)>,
    inner: Vec<PCover>,
}

#[derive(Debug)]
enum PCover {
    Empty(CString),
    Scratch(CString),
    EmptyFile(CString),
    Clone(usize, CString),
}

fn c(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::other(format!("{}: a NUL in the path", path.display())))
}

/// What to prepare.
pub struct Spec<'a> {
    pub steps: Option<&'a Steps>,
    pub workdir: Option<&'a Path>,
    pub data_limit: Option<u64>,
    pub oom_score_adj: Option<i32>,
    pub ids: Option<(u32, u32, &'a [u32])>,
    pub landlock: Option<&'a landlock::Rules>,
}

impl Prepared {
    pub fn new(spec: Spec<'_>) -> io::Result<Prepared> {
        let mut names = Vec::new();
        let lines = fork_lines(&spec);
        let owned = spec.landlock.is_none().then(|| Owned {
            steps: spec.steps.cloned(),
            workdir: spec.workdir.map(Path::to_path_buf),
            data_limit: spec.data_limit,
            oom_score_adj: spec.oom_score_adj,
            ids: spec.ids.map(|(u, g, groups)| (u, g, groups.to_vec())),
        });
        let view = match spec.steps {
            None => None,
            Some(steps) => {
                if steps.clones.len() > MAX_CLONES {
                    return Err(io::Error::other(format!(
                        "the view clones {} trees, more than {MAX_CLONES}: show fewer folders",
                        steps.clones.len()
                    )));
                }
                names.push("a mount namespace of its own (unshare)".to_string());
                names.push("mounts that stay private to it (/ as a slave mount)".to_string());
                let mut clones = Vec::new();
                for p in &steps.clones {
                    names.push(format!("a copy of {} to put back later (open_tree)", p.display()));
                    clones.push(c(p)?);
                }
                let cover = |cv: &Cover, names: &mut Vec<String>| -> io::Result<PCover> {
                    Ok(match cv {
                        Cover::Empty(p) => {
                            names.push(format!("an empty folder over {} (tmpfs)", p.display()));
                            PCover::Empty(c(p)?)
                        }
                        Cover::EmptyFile(p) => {
                            names.push(format!("an empty file over {} (bind /dev/null)", p.display()));
                            PCover::EmptyFile(c(p)?)
                        }
                        Cover::Scratch(p) => {
                            names
                                .push(format!("an empty shared-memory folder of its own over {} (tmpfs)", p.display()));
                            PCover::Scratch(c(p)?)
                        }
                        Cover::Clone(n, p) => {
                            names.push(format!("the app's private temporary folder over {}", p.display()));
                            PCover::Clone(*n, c(p)?)
                        }
                    })
                };
                let mut covers = Vec::new();
                for cv in &steps.covers {
                    covers.push(cover(cv, &mut names)?);
                }
                let mut places = Vec::new();
                for (n, p) in &steps.places {
                    names.push(format!("{} put back in the view (mkdir, move_mount)", p.display()));
                    let dirs = prefixes(p).iter().map(|d| c(d)).collect::<io::Result<Vec<_>>>()?;
                    places.push((*n, dirs, c(p)?, as_app(steps, p, &spec)));
                }
                let mut inner = Vec::new();
                for cv in &steps.inner {
                    inner.push(cover(cv, &mut names)?);
                }
                Some(PreparedView { clones, covers, places, inner })
            }
        };
        let workdir = match spec.workdir {
            Some(w) => {
                names.push(format!("the app's folder {} as the working directory", w.display()));
                Some(c(w)?)
            }
            None => None,
        };
        if let Some(limit) = spec.data_limit {
            names.push(format!("the memory limit ({limit} bytes of data, RLIMIT_DATA)"));
        }
        let oom_score_adj = match spec.oom_score_adj {
            Some(v) => {
                names.push("the OOM killer's preference (/proc/self/oom_score_adj)".into());
                Some(CString::new(v.to_string()).map_err(io::Error::other)?)
            }
            None => None,
        };
        let ids = spec.ids.map(|(uid, gid, groups)| {
            names.push(format!("the supplementary groups {groups:?}"));
            names.push(format!("gid {gid}"));
            names.push(format!("uid {uid}"));
            names.push("no new privileges (prctl PR_SET_NO_NEW_PRIVS)".into());
            Ids {
                uid: Uid::from_raw(uid),
                gid: Gid::from_raw(gid),
                groups: groups.iter().map(|g| Gid::from_raw(*g)).collect(),
            }
        });
        let landlock = match spec.landlock {
            Some(rules) => {
                names.push(format!(
                    "the app's Landlock ruleset ({} rules; no new privileges, landlock_restrict_self)",
                    rules.paths.len()
                ));
                Some(Ruleset::new(rules)?)
            }
            None => None,
        };
        Ok(Prepared { view, workdir, data_limit: spec.data_limit, oom_score_adj, ids, landlock, names, lines, owned })
    }

    /// What it was made of, when it has no Landlock ruleset.
    pub fn owned(&self) -> Option<&Owned> {
        self.owned.as_ref()
    }

    /// The steps as the C executor of a warm parent's fork reads them.
    pub fn lines(&self) -> &[String] {
        &self.lines
    }

    /// The name of step `n`, for the message when it failed.
    pub fn step_name(&self, n: usize) -> Option<&str> {
        self.names.get(n).map(String::as_str)
    }

    /// Whether entering changes anything at all.
    pub fn is_empty(&self) -> bool {
        self.view.is_none()
            && self.data_limit.is_none()
            && self.oom_score_adj.is_none()
            && self.ids.is_none()
            && self.landlock.is_none()
    }

    /// Runs every step, in order, in the forked child. On failure, returns
    /// the number of the step that failed (see `names`) and the error.
    /// Async-signal-safe: system calls only, nothing allocated.
    pub fn enter(&self) -> Result<(), (usize, io::Error)> {
        let mut step = 0usize;
        let mut next = |r: io::Result<()>| -> Result<(), (usize, io::Error)> {
            let n = step;
            step += 1;
            r.map_err(|e| (n, e))
        };
        if let Some(v) = &self.view {
            // SAFETY: the child is single-threaded (a fork), so nothing else
            // shares its file-system attributes.
            next(unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS) }.map_err(Into::into))?;
            next(
                rustix::mount::mount_change(c"/", MountPropagationFlags::DOWNSTREAM | MountPropagationFlags::REC)
                    .map_err(Into::into),
            )?;
            // Numbered slots: no allocation in the child.
            let mut slots: [Option<OwnedFd>; MAX_CLONES] = [const { None }; MAX_CLONES];
            for (i, path) in v.clones.iter().enumerate() {
                let fd = rustix::mount::open_tree(
                    CWD,
                    path.as_c_str(),
                    OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::AT_RECURSIVE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
                );
                next(fd.map(|fd| slots[i] = Some(fd)).map_err(Into::into))?;
            }
            for cover in &v.covers {
                next(apply_cover(cover, &slots))?;
            }
            for (slot, dirs, target, as_app) in &v.places {
                let r = (|| {
                    let _ids = match as_app {
                        Some((uid, gid)) => Some(FsIds::become_(*uid, *gid)?),
                        None => None,
                    };
                    for d in dirs {
                        match rustix::fs::mkdirat(CWD, d.as_c_str(), Mode::from_raw_mode(0o755)) {
                            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                            Err(e) => return Err(io::Error::from(e)),
                        }
                    }
                    place(&slots, *slot, target)
                })();
                next(r)?;
            }
            for cover in &v.inner {
                next(apply_cover(cover, &slots))?;
            }
        }
        if let Some(w) = &self.workdir {
            next(rustix::process::chdir(w.as_c_str()).map_err(Into::into))?;
        }
        if let Some(limit) = self.data_limit {
            next(
                rustix::process::setrlimit(Resource::Data, Rlimit { current: Some(limit), maximum: Some(limit) })
                    .map_err(Into::into),
            )?;
        }
        if let Some(adj) = &self.oom_score_adj {
            let r = (|| {
                // valve keeps itself undumpable, which makes /proc/self root's
                // in this child of valve's own user until it execs.
                rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::Dumpable)?;
                let fd = rustix::fs::open(c"/proc/self/oom_score_adj", rustix::fs::OFlags::WRONLY, Mode::empty())?;
                rustix::io::write(&fd, adj.as_bytes())?;
                Ok(())
            })();
            next(r)?;
        }
        if let Some(ids) = &self.ids {
            next(rustix::thread::set_thread_groups(&ids.groups).map_err(Into::into))?;
            next(rustix::thread::set_thread_res_gid(ids.gid, ids.gid, ids.gid).map_err(Into::into))?;
            next(rustix::thread::set_thread_res_uid(ids.uid, ids.uid, ids.uid).map_err(Into::into))?;
            next(rustix::thread::set_no_new_privs(true).map_err(Into::into))?;
        }
        if let Some(ruleset) = &self.landlock {
            next(ruleset.restrict())?;
        }
        Ok(())
    }
}

/// The steps of `spec`, one line each, as src/worker/zygote/enter.c reads
/// them: `enter`'s order, but the working directory entered as the app's
/// user.
fn fork_lines(spec: &Spec<'_>) -> Vec<String> {
    let mut out = Vec::new();
    let cover = |c: &Cover| match c {
        Cover::Empty(p) => format!("empty {}", p.display()),
        Cover::EmptyFile(p) => format!("null {}", p.display()),
        Cover::Scratch(p) => format!("scratch {}", p.display()),
        Cover::Clone(n, p) => format!("place {n} {}", p.display()),
    };
    if let Some(steps) = spec.steps {
        out.push("unshare".to_string());
        out.push("slave".to_string());
        out.extend(steps.clones.iter().enumerate().map(|(i, p)| format!("clone {i} {}", p.display())));
        out.extend(steps.covers.iter().map(cover));
        for (n, p) in &steps.places {
            let ids = as_app(steps, p, spec);
            if let Some((uid, gid)) = ids {
                out.push(format!("fsids {uid} {gid}"));
            }
            out.extend(prefixes(p).iter().map(|d| format!("mkdir {}", d.display())));
            out.push(format!("place {n} {}", p.display()));
            if ids.is_some() {
                out.push("fsids 0 0".to_string());
            }
        }
        out.extend(steps.inner.iter().map(cover));
    }
    if let Some(limit) = spec.data_limit {
        out.push(format!("data {limit}"));
    }
    if let Some(adj) = spec.oom_score_adj {
        out.push(format!("oom {adj}"));
    }
    if let Some((uid, gid, groups)) = spec.ids {
        out.push(format!("groups {}", groups.iter().map(u32::to_string).collect::<Vec<_>>().join(",")));
        out.push(format!("gid {gid}"));
        out.push(format!("uid {uid}"));
        out.push("nonewprivs".to_string());
    }
    // As the app's user: the warm parent may not read or search what its
    // user may not (it holds no CAP_DAC_READ_SEARCH: `caps`).
    if let Some(w) = spec.workdir {
        out.push(format!("chdir {}", w.display()));
    }
    if let Some(rules) = spec.landlock {
        out.extend(landlock::lines(rules));
    }
    out
}

fn apply_cover(cover: &PCover, slots: &[Option<OwnedFd>; MAX_CLONES]) -> io::Result<()> {
    match cover {
        PCover::Empty(p) => rustix::mount::mount(
            c"tmpfs",
            p.as_c_str(),
            c"tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
            Some(c"mode=0755,size=1m"),
        )
        .map_err(Into::into),
        PCover::Scratch(p) => rustix::mount::mount(
            c"tmpfs",
            p.as_c_str(),
            c"tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
            Some(c"mode=1777,size=64m"),
        )
        .map_err(Into::into),
        PCover::EmptyFile(p) => rustix::mount::mount_bind(c"/dev/null", p.as_c_str()).map_err(Into::into),
        PCover::Clone(n, p) => place(slots, *n, p),
    }
}

/// Whose file-system ids make the folders of a place `p` and put it there:
/// the app's, inside the app's own private temporary folder (a cover its
/// workers write: root would follow the links they leave there, and the
/// warm parent may not write it), else valve's (root's covers).
fn as_app(steps: &Steps, p: &Path, spec: &Spec<'_>) -> Option<(u32, u32)> {
    let (uid, gid, _) = spec.ids?;
    steps.covers.iter().any(|cv| matches!(cv, Cover::Clone(_, at) if p.starts_with(at))).then_some((uid, gid))
}

/// The file-system uid and gid of this thread, set for a while and put
/// back when dropped (raw system calls: safe between fork and exec).
struct FsIds {
    uid: u32,
    gid: u32,
}

impl FsIds {
    fn become_(uid: u32, gid: u32) -> io::Result<FsIds> {
        // SAFETY: setfsgid and setfsuid change this thread's ids only; -1
        // (u32::MAX) asks the current one without changing it.
        let old = unsafe { FsIds { gid: libc::setfsgid(gid) as u32, uid: libc::setfsuid(uid) as u32 } };
        let now = unsafe { (libc::setfsuid(u32::MAX) as u32, libc::setfsgid(u32::MAX) as u32) };
        if now != (uid, gid) {
            drop(old);
            return Err(io::Error::from_raw_os_error(rustix::io::Errno::PERM.raw_os_error()));
        }
        Ok(old)
    }
}

impl Drop for FsIds {
    fn drop(&mut self) {
        // SAFETY: as above; the uid first, while CAP_SETGID is still effective.
        unsafe {
            libc::setfsuid(self.uid);
            libc::setfsgid(self.gid);
        }
    }
}

fn place(slots: &[Option<OwnedFd>; MAX_CLONES], n: usize, target: &CString) -> io::Result<()> {
    let Some(fd) = slots.get(n).and_then(Option::as_ref) else {
        return Err(io::Error::from_raw_os_error(rustix::io::Errno::BADF.raw_os_error()));
    };
    rustix::mount::move_mount(fd.as_fd(), c"", CWD, target.as_c_str(), MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH)
        .map_err(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn places_inside_the_apps_own_temporary_folder_are_made_with_its_ids_and_the_rest_with_roots() {
        let p = PathBuf::from;
        let steps = Steps {
            clones: vec![p("/var/lib/valve/apps/api/tmp"), p("/tmp/valve-run"), p("/srv/api")],
            covers: vec![Cover::Clone(0, p("/tmp")), Cover::Empty(p("/srv"))],
            places: vec![(1, p("/tmp/valve-run")), (2, p("/srv/api"))],
            inner: vec![],
        };
        let groups = [1001];
        let spec = Spec {
            steps: Some(&steps),
            workdir: Some(Path::new("/srv/api")),
            data_limit: None,
            oom_score_adj: None,
            ids: Some((1001, 1001, &groups)),
            landlock: None,
        };
        let lines = fork_lines(&spec);
        let at = |l: &str| lines.iter().position(|x| x == l).unwrap_or_else(|| panic!("{l}: {lines:?}"));
        assert!(at("fsids 1001 1001") < at("mkdir /tmp/valve-run"), "{lines:?}");
        assert!(at("place 1 /tmp/valve-run") < at("fsids 0 0"), "{lines:?}");
        assert!(at("fsids 0 0") < at("mkdir /srv/api"), "root's own cover is made as root: {lines:?}");
        assert_eq!(lines.iter().filter(|l| l.starts_with("fsids")).count(), 2, "{lines:?}");
        assert!(at("uid 1001") < at("chdir /srv/api"), "the working directory is entered as the app: {lines:?}");
        assert_eq!(as_app(&steps, Path::new("/srv/api"), &spec), None);
        let root = Spec { ids: None, ..spec };
        assert_eq!(as_app(&steps, Path::new("/tmp/valve-run"), &root), None, "no user to become: valve's own");
    }
}
