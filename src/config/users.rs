//! Whom each app's R runs as. `run_as` as written (a user name, a uid, or
//! `"root"` spelt out), resolved against the machine's user database; the
//! user valve gives an app that names none (a uid in `uid_range`, kept in the
//! uid table: see `uids`; `own_uids` is how it was picked before the table,
//! which seeds it); and what the kernel lets valve do (`Kernel`, measured by
//! the worker module before the configuration is read), from which
//! `isolation` decides how apps are kept apart.

use std::ffi::{CStr, CString};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// What the kernel lets this valve do, measured once at start (the worker
/// module's probe forks a child that tries it). Plain data: the
/// configuration decides from it, and tests set it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Kernel {
    /// valve's effective uid.
    pub uid: u32,
    /// valve's effective gid.
    pub gid: u32,
    /// A child can become another user (root with CAP_SETUID and CAP_SETGID).
    pub switch_users: bool,
    /// A child can have a mount namespace of its own (CAP_SYS_ADMIN).
    pub mount_namespaces: bool,
    /// The Landlock ABI the kernel offers (0: none).
    pub landlock: u32,
}

/// `run_as` as written in the config (or `--run-as`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunAs {
    /// Nothing given: the app gets a user of its own (as root), else valve's.
    Own,
    /// A user name or a numeric uid.
    User(String),
}

impl RunAs {
    pub fn parse(value: &str) -> RunAs {
        match value.trim() {
            "" => RunAs::Own,
            v => RunAs::User(v.to_string()),
        }
    }
}

/// Who an app's R runs as, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (the user's, from the group database; just its
    /// own group for an app's own user).
    pub groups: Vec<u32>,
    /// As people read it: the user's name, or `valve-APP` for an app's own user.
    pub name: String,
    /// A named user's home directory (an app's own user gets a private one).
    pub home: Option<PathBuf>,
    pub kind: AccountKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccountKind {
    /// A uid valve picked for this app (no entry in the user database).
    Own,
    /// A user `run_as` named.
    Named,
    /// valve's own user: valve is not root, so it cannot switch.
    Valve,
    /// root, spelt out with `run_as = "root"`: no isolation at all.
    Root,
}

impl Account {
    /// Whether workers switch to this account (valve is root and the account is not).
    pub fn isolated(&self) -> bool {
        matches!(self.kind, AccountKind::Own | AccountKind::Named)
    }

    /// `valve-api (uid 1904...)` or `shiny (uid 998)`.
    pub fn describe(&self) -> String {
        format!("{} (uid {})", self.name, self.uid)
    }
}

/// The uids valve gives apps without `run_as`, by default: above the ranges
/// systemd hands to containers (up to 1879048191) and below systemd-homed's.
pub const DEFAULT_UID_RANGE: (u32, u32) = (1_900_000_000, 1_999_999_999);

/// `uid_range = "START-END"`.
pub fn parse_uid_range(value: &str) -> Result<(u32, u32), String> {
    let bad = || {
        format!(
            "{value:?} is not a range of uids: write START-END, such as \"{}-{}\" (at least 1000 uids, none below 1000)",
            DEFAULT_UID_RANGE.0, DEFAULT_UID_RANGE.1
        )
    };
    let (a, b) = value.trim().split_once('-').ok_or_else(bad)?;
    let (a, b): (u32, u32) = (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?);
    if a < 1000 || b < a || b - a < 999 || b == u32::MAX {
        return Err(bad());
    }
    Ok((a, b))
}

/// FNV-1a, 64 bits: the same on every machine and every build (a uid must
/// not change when valve is upgraded).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// The uid each app of `names` got before valve kept a uid table (which
/// the first run seeds with it): the range's start plus a hash of its name. Two names that land on one uid (rare: two
/// in a hundred million) are told apart in the order of their names, the
/// later one taking the next free uid.
pub fn own_uids(names: &[&str], range: (u32, u32)) -> Vec<u32> {
    let size = u64::from(range.1 - range.0) + 1;
    let mut order: Vec<usize> = (0..names.len()).collect();
    order.sort_by_key(|i| names[*i]);
    let mut taken = std::collections::BTreeSet::new();
    let mut out = vec![0; names.len()];
    for i in order {
        let mut slot = fnv1a(names[i].as_bytes()) % size;
        while !taken.insert(slot) {
            slot = (slot + 1) % size;
        }
        out[i] = range.0 + slot as u32;
    }
    out
}

/// The uid `run_as` names, if it names one (a number, or a user of this machine).
pub fn named_uid(run_as: &RunAs) -> Option<u32> {
    match run_as {
        RunAs::Own => None,
        RunAs::User(v) => v.parse().ok().or_else(|| lookup_name(v).map(|u| u.uid)),
    }
}

/// Whether `uid` is a user of this machine (its user database).
pub fn known_uid(uid: u32) -> bool {
    lookup_uid(uid).is_some()
}

/// Resolves `run_as` for app `app` given what valve can do. `own_uid` is
/// the uid valve picked for the app (used when `run_as` names nobody).
pub fn resolve(app: &str, run_as: &RunAs, own_uid: u32, kernel: &Kernel) -> Result<Account, String> {
    let valve_own = || Account {
        uid: kernel.uid,
        gid: kernel.gid,
        groups: Vec::new(),
        name: lookup_uid(kernel.uid).map(|u| u.name).unwrap_or_else(|| kernel.uid.to_string()),
        home: None,
        kind: AccountKind::Valve,
    };
    let wanted = match run_as {
        RunAs::Own if kernel.switch_users => {
            return Ok(Account {
                uid: own_uid,
                gid: own_uid,
                groups: vec![own_uid],
                name: format!("valve-{app}"),
                home: None,
                kind: AccountKind::Own,
            })
        }
        RunAs::Own => return Ok(valve_own()),
        RunAs::User(v) => v,
    };
    let found = match wanted.parse::<u32>() {
        Ok(uid) => lookup_uid(uid).unwrap_or(PasswdEntry {
            name: uid.to_string(),
            uid,
            gid: uid,
            home: None,
        }),
        Err(_) => lookup_name(wanted).ok_or_else(|| {
            format!(
                "run_as = {wanted:?}: no such user on this machine (check `getent passwd {wanted}`): create the user, or remove run_as to give the app a user of its own"
            )
        })?,
    };
    if found.uid == 0 {
        if wanted != "root" {
            return Err(format!(
                "run_as = {wanted:?} is root (uid 0): write run_as = \"root\" to run this app's R as root, knowing it can then read and change everything valve can"
            ));
        }
        return Ok(Account {
            uid: 0,
            gid: 0,
            groups: Vec::new(),
            name: "root".into(),
            home: None,
            kind: AccountKind::Root,
        });
    }
    if found.uid == kernel.uid {
        return Ok(Account { kind: AccountKind::Valve, ..valve_own() });
    }
    if !kernel.switch_users {
        return Err(format!(
            "run_as = {wanted:?}: valve runs as uid {} and cannot switch to another user (that needs root): run valve as root, or remove run_as so the app runs as valve's own user",
            kernel.uid
        ));
    }
    let groups = group_list(&found.name, found.gid);
    Ok(Account { uid: found.uid, gid: found.gid, groups, name: found.name, home: found.home, kind: AccountKind::Named })
}

/// Whether `account` may read `folder` (list and enter it) and, if given, the
/// app's own file in it: the check an app's start would otherwise fail on,
/// with a message naming the path and the fix.
pub fn check_readable(app: &str, account: &Account, folder: &Path, file: Option<&Path>) -> Result<(), String> {
    if !account.isolated() {
        return Ok(());
    }
    let denied = |path: &Path, what: &str, fix: String| {
        format!(
            "app `{app}`: its user {} cannot {what} {} ({fix}, or set run_as to a user who can)",
            account.describe(),
            path.display()
        )
    };
    match std::fs::metadata(folder) {
        Ok(m) if !allows(account, &m, 0o5) => {
            return Err(denied(folder, "read its folder", format!("make it readable: chmod o+rx {}", folder.display())))
        }
        _ => {}
    }
    if let Some(file) = file.filter(|f| f.is_file()) {
        if let Ok(m) = std::fs::metadata(file) {
            if !allows(account, &m, 0o4) {
                return Err(denied(file, "read", format!("make it readable: chmod o+r {}", file.display())));
            }
        }
    }
    Ok(())
}

/// Whether `account` (an app's own user) may add files to `folder`: where
/// it may not, what the app writes beside its code fails.
pub fn can_write(account: &Account, folder: &Path) -> bool {
    !account.isolated() || std::fs::metadata(folder).map_or(true, |m| allows(account, &m, 0o3))
}

/// The first folder from the root down to `path` that `account` cannot pass
/// through (search permission), if any. Without a private view, such a
/// folder keeps the app's user out of its own folder.
pub fn blocked_ancestor(account: &Account, path: &Path) -> Option<PathBuf> {
    if !account.isolated() {
        return None;
    }
    let mut at = PathBuf::from("/");
    for part in path.parent()?.components().skip(1) {
        at.push(part);
        if let Ok(m) = std::fs::metadata(&at) {
            if !allows(account, &m, 0o1) {
                return Some(at);
            }
        }
    }
    None
}

/// Whether `account` has the permission bits `want` (of r=4, w=2, x=1) on a file.
fn allows(account: &Account, m: &std::fs::Metadata, want: u32) -> bool {
    let mode = m.mode();
    let bits = if m.uid() == account.uid {
        mode >> 6
    } else if m.gid() == account.gid || account.groups.contains(&m.gid()) {
        mode >> 3
    } else {
        mode
    };
    bits & want == want
}

struct PasswdEntry {
    name: String,
    uid: u32,
    gid: u32,
    home: Option<PathBuf>,
}

fn lookup_name(name: &str) -> Option<PasswdEntry> {
    let c = CString::new(name).ok()?;
    passwd(|pwd, buf, result| {
        // SAFETY: every pointer is valid for the call; buf's length is given.
        unsafe { libc::getpwnam_r(c.as_ptr(), pwd, buf.as_mut_ptr(), buf.len(), result) }
    })
}

fn lookup_uid(uid: u32) -> Option<PasswdEntry> {
    passwd(|pwd, buf, result| {
        // SAFETY: as in lookup_name.
        unsafe { libc::getpwuid_r(uid, pwd, buf.as_mut_ptr(), buf.len(), result) }
    })
}

/// Calls a `getpw*_r` function with a buffer that grows until it fits.
fn passwd(
    call: impl Fn(*mut libc::passwd, &mut Vec<libc::c_char>, *mut *mut libc::passwd) -> libc::c_int,
) -> Option<PasswdEntry> {
    let mut buf: Vec<libc::c_char> = vec![0; 1024];
    loop {
        // SAFETY: a zeroed passwd is a valid out-parameter.
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = call(&mut pwd, &mut buf, &mut result);
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 4, 0);
            continue;
        }
        if rc != 0 || result.is_null() {
            return None;
        }
        // SAFETY: on success the strings point into buf, which is alive.
        let text = |p: *const libc::c_char| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
        let home = (!pwd.pw_dir.is_null()).then(|| PathBuf::from(text(pwd.pw_dir))).filter(|h| h.is_absolute());
        return Some(PasswdEntry { name: text(pwd.pw_name), uid: pwd.pw_uid, gid: pwd.pw_gid, home });
    }
}

/// The user's groups from the group database, its primary group first.
fn group_list(name: &str, gid: u32) -> Vec<u32> {
    let Ok(c) = CString::new(name) else { return vec![gid] };
    let mut n: libc::c_int = 64;
    loop {
        let mut groups: Vec<libc::gid_t> = vec![0; n as usize];
        let asked = n;
        // SAFETY: groups holds n entries; n is updated to the number found.
        let rc = unsafe { libc::getgrouplist(c.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
        if rc >= 0 {
            groups.truncate(n.max(0) as usize);
            if !groups.contains(&gid) {
                groups.insert(0, gid);
            }
            return groups;
        }
        if n <= asked || n > 65_536 {
            return vec![gid];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Isolation;

    fn root_kernel() -> Kernel {
        Kernel { uid: 0, gid: 0, switch_users: true, mount_namespaces: true, landlock: 7 }
    }

    #[test]
    fn own_uids_are_stable_spread_and_distinct() {
        let range = DEFAULT_UID_RANGE;
        let a = own_uids(&["alpha", "beta"], range);
        assert_eq!(a, own_uids(&["beta", "alpha"], range).into_iter().rev().collect::<Vec<_>>(), "order-free");
        assert_eq!(a[0], own_uids(&["alpha"], range)[0], "another app changes nobody's uid");
        assert_ne!(a[0], a[1]);
        assert!(a.iter().all(|u| (range.0..=range.1).contains(u)));
        // A range of one thousand: collisions are told apart, every uid distinct.
        let names: Vec<String> = (0..500).map(|i| format!("app{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let uids = own_uids(&refs, (5000, 5999));
        let distinct: std::collections::BTreeSet<_> = uids.iter().collect();
        assert_eq!(distinct.len(), 500);
        // The hash is fixed for good: a uid that changed on upgrade would orphan an app's files.
        assert_eq!(own_uids(&["api"], range), vec![range.0 + (fnv1a(b"api") % 100_000_000) as u32]);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn uid_ranges_are_checked() {
        assert_eq!(parse_uid_range("100000-199999").unwrap(), (100_000, 199_999));
        for bad in ["", "5", "100-2000", "2000-1000", "1000-1500", "a-b", "1000-4294967295"] {
            let e = parse_uid_range(bad).unwrap_err();
            assert!(e.contains("START-END"), "{bad}: {e}");
        }
    }

    #[test]
    fn run_as_resolves_names_uids_and_root_only_when_spelt_out() {
        let k = root_kernel();
        let own = resolve("api", &RunAs::Own, 1_900_000_123, &k).unwrap();
        assert_eq!(
            (own.uid, own.gid, own.kind, own.name.as_str()),
            (1_900_000_123, 1_900_000_123, AccountKind::Own, "valve-api")
        );
        let nobody = resolve("api", &RunAs::User("nobody".into()), 1, &k).unwrap();
        assert_eq!((nobody.uid, nobody.kind, nobody.name.as_str()), (65534, AccountKind::Named, "nobody"));
        let by_uid = resolve("api", &RunAs::User("65534".into()), 1, &k).unwrap();
        assert_eq!(by_uid.name, "nobody");
        let unknown = resolve("api", &RunAs::User("no-such-user-here".into()), 1, &k).unwrap_err();
        assert!(unknown.contains("no such user") && unknown.contains("no-such-user-here"), "{unknown}");
        assert_eq!(resolve("api", &RunAs::User("root".into()), 1, &k).unwrap().kind, AccountKind::Root);
        let zero = resolve("api", &RunAs::User("0".into()), 1, &k).unwrap_err();
        assert!(zero.contains("write run_as = \"root\""), "{zero}");
    }

    #[test]
    fn without_root_apps_share_valves_user_and_run_as_another_is_refused() {
        let k = Kernel { uid: 1000, gid: 1000, switch_users: false, mount_namespaces: false, landlock: 0 };
        assert_eq!(resolve("api", &RunAs::Own, 5, &k).unwrap().kind, AccountKind::Valve);
        assert_eq!(resolve("api", &RunAs::User("1000".into()), 5, &k).unwrap().kind, AccountKind::Valve);
        let e = resolve("api", &RunAs::User("nobody".into()), 5, &k).unwrap_err();
        assert!(e.contains("cannot switch") && e.contains("uid 1000"), "{e}");
        assert_eq!(Isolation::from_kernel(&k), Isolation::Shared);
        assert_eq!(Isolation::from_kernel(&root_kernel()), Isolation::View);
    }

    #[test]
    fn readability_is_checked_for_the_apps_user() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let app = dir.path().join("app");
        std::fs::create_dir(&app).unwrap();
        let file = app.join("plumber.R");
        std::fs::write(&file, "").unwrap();
        let acct = resolve("api", &RunAs::Own, 1_900_000_001, &root_kernel()).unwrap();
        std::fs::set_permissions(&app, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(check_readable("api", &acct, &app, Some(&file)).is_ok());
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = check_readable("api", &acct, &app, Some(&file)).unwrap_err();
        assert!(e.contains("chmod o+r") && e.contains("plumber.R") && e.contains("valve-api"), "{e}");
        std::fs::set_permissions(&app, std::fs::Permissions::from_mode(0o700)).unwrap();
        let e = check_readable("api", &acct, &app, Some(&file)).unwrap_err();
        assert!(e.contains("read its folder") && e.contains("chmod o+rx"), "{e}");
        // A folder of mode 0700 on the way blocks it without a private view.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(blocked_ancestor(&acct, &file).as_deref(), Some(dir.path()));
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(blocked_ancestor(&acct, &file).as_deref(), Some(app.as_path()));
        std::fs::set_permissions(&app, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(blocked_ancestor(&acct, &file), None);
    }
}
