//! Landlock, for a valve that cannot switch users: each app's workers (its
//! fresh R, its forks of the warm parent, its package builds) restrict
//! themselves to a ruleset that reads everything but what is hidden (other
//! apps' folders, valve's files), writes only the app's own folders, and
//! neither signals nor reaches the abstract sockets of anything outside it.
//!
//! Landlock only allows: "everything but these" is written as the folders
//! beside each hidden path (`plan`, which reads the folders on the way to a
//! hidden path once, in valve, when the generation is prepared). A ruleset is
//! built in valve (`Ruleset::new`) and a fresh worker's child only calls
//! `restrict` between fork and exec (system calls, nothing allocated); a fork
//! of the warm parent builds the same rules from lines (`lines`, carried out
//! by src/worker/zygote/enter.c). Plain system calls, no crate: what the
//! kernel enforces is decided here from the ABI it reports, never weakened
//! silently (`config::LandlockCoverage` says what is and is not protected).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

const EXECUTE: u64 = 1 << 0;
const WRITE_FILE: u64 = 1 << 1;
const READ_FILE: u64 = 1 << 2;
const READ_DIR: u64 = 1 << 3;
const REFER: u64 = 1 << 13;
const TRUNCATE: u64 = 1 << 14;
/// The rights a rule on a file (not a folder) may hold.
const FILE_RIGHTS: u64 = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE;
/// What a path of `Kind::Read` allows.
const READ: u64 = EXECUTE | READ_FILE | READ_DIR;

const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
const SCOPE_SIGNAL: u64 = 1 << 1;

const CREATE_RULESET_VERSION: u32 = 1 << 0;
const RULE_PATH_BENEATH: u32 = 1;

/// The Landlock ABI this kernel offers (0: none, or a runtime such as
/// gVisor that does not implement it, or Landlock turned off at boot).
pub fn abi() -> u32 {
    // SAFETY: the documented way to ask for the ABI version: no attributes.
    let r = unsafe {
        libc::syscall(libc::SYS_landlock_create_ruleset, std::ptr::null::<u8>(), 0usize, CREATE_RULESET_VERSION)
    };
    u32::try_from(r).unwrap_or(0)
}

/// What a ruleset built for `abi` handles: every file right the ABI knows
/// (device ioctls aside: R's terminal checks on /dev/null would fail) and,
/// from ABI 6, signals and abstract Unix sockets.
pub fn handled(abi: u32) -> (u64, u64) {
    let mut fs = (1u64 << 13) - 1;
    if abi >= 2 {
        fs |= REFER;
    }
    if abi >= 3 {
        fs |= TRUNCATE;
    }
    let scoped = if abi >= 6 { SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL } else { 0 };
    (fs, scoped)
}

/// What a path gives an app.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Hide,
    Read,
    /// Read, and write into files already there (valve's FIFOs in an app's
    /// run folder): nothing made, removed, renamed or linked.
    Fill,
    Write,
}

/// One app's rules: which paths, which rights (folders beneath them too).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rules {
    pub fs: u64,
    pub scoped: u64,
    pub paths: Vec<(PathBuf, u64)>,
}

/// Everything readable but `hide`; `read` and `write` given whatever
/// covers them (the deepest named path wins: a hidden file inside a
/// written folder stays hidden). Folders are read from the file system on
/// the way to each hidden path (valve reads them as itself, as the app would).
pub fn plan(abi: u32, hide: &[PathBuf], read: &[PathBuf], write: &[PathBuf]) -> Rules {
    plan_with(abi, hide, read, &[], write)
}

/// As `plan`, with `fill`: folders whose files may be written but in which
/// nothing may be made, removed, renamed or linked.
pub fn plan_with(abi: u32, hide: &[PathBuf], read: &[PathBuf], fill: &[PathBuf], write: &[PathBuf]) -> Rules {
    let (fs, scoped) = handled(abi);
    let canon = |p: &PathBuf| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
    let hide: Vec<PathBuf> = hide.iter().map(canon).collect();
    let mut named: Vec<(PathBuf, Kind)> = vec![(PathBuf::from("/"), Kind::Read)];
    named.extend(read.iter().map(|p| (canon(p), Kind::Read)));
    named.extend(fill.iter().map(|p| (canon(p), Kind::Fill)));
    named.extend(write.iter().map(|p| (canon(p), Kind::Write)));
    let mut out = Rules { fs, scoped, paths: Vec::new() };
    // The deepest name wins, and a path named to read or write wins over the
    // same path hidden (an app whose folder is valve's user's home, or /tmp
    // itself): what is hidden inside it stays hidden.
    for (path, kind) in &named {
        beside(path, *kind, &hide, fs, &mut out.paths, 0);
    }
    out.paths.sort();
    out.paths.dedup();
    out
}

/// Rules giving `kind` to `path` but nothing hidden inside it.
fn beside(path: &Path, kind: Kind, hide: &[PathBuf], fs: u64, out: &mut Vec<(PathBuf, u64)>, depth: usize) {
    let rights = match kind {
        Kind::Hide => return,
        Kind::Read => READ & fs,
        Kind::Fill => (READ | WRITE_FILE) & fs,
        Kind::Write => fs,
    };
    let inside: Vec<&PathBuf> = hide.iter().filter(|h| h.starts_with(path) && h.as_path() != path).collect();
    let Ok(meta) = std::fs::metadata(path) else { return };
    if inside.is_empty() || !meta.is_dir() || depth > 64 {
        let rights = if meta.is_dir() { rights } else { rights & FILE_RIGHTS };
        out.push((path.to_path_buf(), rights));
        return;
    }
    let Ok(entries) = std::fs::read_dir(path) else { return };
    for e in entries.flatten() {
        let child = e.path();
        if hide.contains(&child) {
            continue;
        }
        let is_link = e.file_type().is_ok_and(|t| t.is_symlink());
        if is_link {
            // A link leads elsewhere: given only if where it leads holds nothing hidden.
            let Ok(target) = std::fs::canonicalize(&child) else { continue };
            if hide.iter().any(|h| target.starts_with(h) || h.starts_with(&target)) {
                continue;
            }
            beside(&target, kind, hide, fs, out, depth + 1);
            continue;
        }
        beside(&child, kind, hide, fs, out, depth + 1);
    }
}

/// A ruleset built in valve for one app's generation, entered by each
/// fresh worker's child (`restrict`).
#[derive(Debug)]
pub struct Ruleset {
    fd: OwnedFd,
}

#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

#[repr(C, packed)]
struct PathBeneath {
    allowed_access: u64,
    parent_fd: i32,
}

impl Ruleset {
    /// Creates the ruleset and adds every rule: fails naming the path a
    /// rule could not be made for.
    pub fn new(rules: &Rules) -> io::Result<Ruleset> {
        let attr = RulesetAttr { handled_access_fs: rules.fs, handled_access_net: 0, scoped: rules.scoped };
        // SAFETY: a valid attribute struct of the size given.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                &attr as *const RulesetAttr,
                std::mem::size_of::<RulesetAttr>(),
                0u32,
            )
        };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("the kernel refused a Landlock ruleset: {e}")));
        }
        // SAFETY: the kernel just gave us this descriptor (close-on-exec).
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        for (path, rights) in &rules.paths {
            let c = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
            // The rule's own path, never through a link (the plan gave what
            // a link leads to by its own path).
            // SAFETY: a NUL-terminated path.
            let parent = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
            if parent < 0 {
                // Gone (or made a link) since the plan: nothing to give.
                continue;
            }
            // SAFETY: just opened.
            let parent = unsafe { OwnedFd::from_raw_fd(parent) };
            // O_PATH with O_NOFOLLOW opens a link itself: a link is given nothing.
            if rustix::fs::fstat(&parent).is_ok_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode).is_symlink()) {
                continue;
            }
            let rule = PathBeneath { allowed_access: *rights, parent_fd: parent.as_raw_fd() };
            // SAFETY: a valid rule struct for RULE_PATH_BENEATH.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_landlock_add_rule,
                    fd.as_raw_fd(),
                    RULE_PATH_BENEATH,
                    &rule as *const PathBeneath,
                    0u32,
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                return Err(io::Error::new(
                    e.kind(),
                    format!("a Landlock rule for {} (rights {rights:#x}): {e}", path.display()),
                ));
            }
        }
        Ok(Ruleset { fd })
    }

    /// In a forked child: no new privileges, then the ruleset. System calls only.
    pub fn restrict(&self) -> io::Result<()> {
        rustix::thread::set_no_new_privs(true)?;
        // SAFETY: a ruleset descriptor; no flags.
        let r = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, self.fd.as_raw_fd(), 0u32) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// The rules as lines for the C executor of a warm parent's fork:
/// `landlock FS SCOPED`, one `lpath RIGHTS PATH` per rule, `lrestrict`.
pub fn lines(rules: &Rules) -> Vec<String> {
    let mut out = vec![format!("landlock {} {}", rules.fs, rules.scoped)];
    out.extend(rules.paths.iter().map(|(p, r)| format!("lpath {r} {}", p.display())));
    out.push("lrestrict".into());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn everything_is_read_but_what_is_hidden_and_a_shown_path_inside_it_comes_back() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        for d in ["site/alpha", "site/beta", "site/beta/shared", "state/alpha-home", "other"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(root.join("site/valve.toml"), "").unwrap();
        std::os::unix::fs::symlink(root.join("site/beta"), root.join("link-to-beta")).unwrap();
        std::os::unix::fs::symlink(root.join("other"), root.join("link-to-other")).unwrap();
        let hide = vec![root.join("site/beta"), root.join("site/valve.toml"), root.join("state")];
        let read = vec![root.join("site/beta/shared")];
        let write = vec![root.join("state/alpha-home"), root.join("site/alpha")];
        let rules = plan(6, &hide, &read, &write);
        let rights = |p: &str| rules.paths.iter().find(|(q, _)| *q == root.join(p)).map(|(_, r)| *r);
        let given = |p: &Path| rules.paths.iter().any(|(q, _)| p.starts_with(q));
        assert!(!given(&root.join("site/beta/secret")), "beta is hidden: {rules:?}");
        assert!(!given(&root.join("site/valve.toml")), "the config file is hidden");
        assert!(!given(&root.join("state/beta-home")), "the state folder is hidden");
        assert_eq!(rights("site/beta/shared"), Some(READ), "a shown folder inside a hidden one comes back");
        assert_eq!(rights("state/alpha-home"), Some(handled(6).0), "its home is its own to write");
        assert!(given(&root.join("site/alpha/data.txt")));
        assert_eq!(rights("other"), Some(READ), "what a link leads to, when nothing hidden is there");
        assert!(!rules.paths.iter().any(|(q, _)| q.ends_with("link-to-beta")), "a link into what is hidden");
        assert!(given(Path::new("/usr/lib")), "the rest of the system is read: {:?}", &rules.paths[..3]);
        assert_eq!(rules.scoped, SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL);
    }

    #[test]
    fn a_written_folder_holding_a_hidden_file_is_given_around_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(root.join("app/logs")).unwrap();
        std::fs::write(root.join("app/valve.toml"), "").unwrap();
        std::fs::write(root.join("app/app.R"), "").unwrap();
        let rules = plan(7, &[root.join("app/valve.toml"), root.clone()], &[], &[root.join("app")]);
        let rights = |p: &str| rules.paths.iter().find(|(q, _)| *q == root.join(p)).map(|(_, r)| *r);
        assert_eq!(rights("app/logs"), Some(handled(7).0));
        assert_eq!(rights("app/app.R"), Some(handled(7).0 & FILE_RIGHTS), "a file's rule holds file rights only");
        assert_eq!(rights("app/valve.toml"), None);
        assert_eq!(rights("app"), None, "not the whole folder: the hidden file is in it");
        // An app whose folder is valve's user's home (hidden as a home): its folder wins.
        let home = plan(7, &[root.join("app"), root.join("app/valve.toml")], &[], &[root.join("app")]);
        assert!(home.paths.iter().any(|(q, _)| *q == root.join("app/app.R")), "{home:?}");
        assert!(!home.paths.iter().any(|(q, _)| q.starts_with(root.join("app/valve.toml"))));
    }

    #[test]
    fn each_abi_handles_what_it_knows_and_forks_read_the_rules_as_lines() {
        assert_eq!(handled(1).0, (1 << 13) - 1);
        assert_eq!(handled(1).1, 0, "no scopes before ABI 6");
        assert_eq!(
            lines(&Rules { fs: 3, scoped: 2, paths: vec![("/usr".into(), 1)] }),
            ["landlock 3 2", "lpath 1 /usr", "lrestrict"]
        );
    }

    #[test]
    fn a_ruleset_restricts_a_child_to_what_it_gives() {
        if abi() < 1 {
            eprintln!("no Landlock here: skipped");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(root.join("mine")).unwrap();
        std::fs::create_dir_all(root.join("theirs")).unwrap();
        std::fs::write(root.join("theirs/secret"), "s").unwrap();
        let rules = plan(abi(), &[root.join("theirs")], &[], &[root.join("mine")]);
        let ruleset = std::sync::Arc::new(Ruleset::new(&rules).unwrap());
        let script = format!(
            "cat {0}/theirs/secret && exit 3; echo ok > {0}/mine/f || exit 4; echo no > {0}/f && exit 5; exit 0",
            root.display()
        );
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.args(["-c", &script]).stderr(std::process::Stdio::null());
        let r = ruleset.clone();
        // SAFETY: restrict makes system calls only.
        unsafe { std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || r.restrict()) };
        let status = cmd.status().unwrap();
        assert_eq!(status.code(), Some(0), "read theirs (3), could not write its own (4), wrote elsewhere (5)");
        assert_eq!(std::fs::read_to_string(root.join("mine/f")).unwrap(), "ok\n");
    }
}
