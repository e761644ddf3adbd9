//! File operations valve does as root where an app's user could have put a
//! link: each goes through a folder's handle, by one name, never following
//! a link (O_NOFOLLOW, AT_SYMLINK_NOFOLLOW), so a name an app controls is
//! never followed.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Gid, Mode, OFlags, Uid};

/// How deep `remove_tree` goes before it gives up (a folder left by an
/// app, not valve's to walk forever).
const MAX_DEPTH: usize = 64;

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// A handle on the folder `path` (itself not a link).
pub fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(path, dir_flags(), Mode::empty())?)
}

/// A handle on the folder `name` in `parent` (itself not a link).
pub fn open_at(parent: &OwnedFd, name: &str) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(parent, name, dir_flags(), Mode::empty())?)
}

/// The folder `name` in `parent`, valve's own with `mode`: made if missing;
/// anything else there (a link, a file, a folder of another user's: left by
/// an older valve, whose run folders were the app's) is set aside and
/// removed without following a link, and a new one made.
pub fn valve_dir(parent: &OwnedFd, name: &str, mode: u32) -> io::Result<OwnedFd> {
    owned_dir(parent, name, mode, None)
}

/// Like `valve_dir`, but the folder is `owner`'s (uid, gid) once made: one
/// already there that is valve's or already `owner`'s is kept with what is
/// in it (a reload's new generation beside the old one's sockets); anything
/// else is set aside. The owner and mode are given through the handle.
pub fn owned_dir(parent: &OwnedFd, name: &str, mode: u32, owner: Option<(u32, u32)>) -> io::Result<OwnedFd> {
    let me = rustix::process::geteuid();
    for _ in 0..2 {
        match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(mode)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
        match rustix::fs::openat(parent, name, dir_flags(), Mode::empty()) {
            Ok(fd) => {
                let st = rustix::fs::fstat(&fd)?;
                if st.st_uid == me.as_raw() || owner.is_some_and(|(uid, _)| st.st_uid == uid) {
                    if let Some((uid, gid)) = owner {
                        rustix::fs::fchown(&fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))?;
                    }
                    rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))?;
                    return Ok(fd);
                }
            }
            // A link (ELOOP) or something not a folder: set aside below.
            Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {}
            Err(e) => return Err(e.into()),
        }
        set_aside(parent, name)?;
    }
    Err(io::Error::other(format!("{name} is not valve's own folder even after it was set aside")))
}

/// Renames `name` aside in `parent` (the rename moves the entry itself,
/// whatever it is), then removes it; what cannot be removed stays aside
/// (under valve's run directory, gone with it).
fn set_aside(parent: &OwnedFd, name: &str) -> io::Result<()> {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let aside = format!(".old-{name}-{nanos}");
    rustix::fs::renameat(parent, name, parent, aside.as_str())?;
    if let Err(e) = remove_tree(parent, &aside) {
        tracing::warn!(folder = name, aside = %aside, error = %e,
            "a run folder that was not valve's was set aside but not wholly removed");
    }
    Ok(())
}

/// Removes `name` in `parent` and, if it is a folder, everything in it,
/// following no link: each entry is opened through its folder's handle.
pub fn remove_tree<Fd: AsFd>(parent: Fd, name: &str) -> io::Result<()> {
    remove_at(parent.as_fd(), name, 0)
}

fn remove_at(parent: std::os::fd::BorrowedFd<'_>, name: &str, depth: usize) -> io::Result<()> {
    let st = match rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return Ok(rustix::fs::unlinkat(parent, name, AtFlags::empty())?);
    }
    if depth >= MAX_DEPTH {
        return Err(io::Error::other(format!("{name}: more than {MAX_DEPTH} folders deep")));
    }
    let dir = rustix::fs::openat(parent, name, dir_flags(), Mode::empty())?;
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(&dir)? {
        let entry = entry?;
        let n = entry.file_name().to_string_lossy().into_owned();
        if n != "." && n != ".." {
            names.push(n);
        }
    }
    for n in names {
        remove_at(dir.as_fd(), &n, depth + 1)?;
    }
    Ok(rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_is_removed_without_following_its_links() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("kept"), "x").unwrap();
        let top = tempfile::tempdir().unwrap();
        let tree = top.path().join("tree");
        std::fs::create_dir_all(tree.join("a/b")).unwrap();
        std::fs::write(tree.join("a/b/f"), "y").unwrap();
        std::os::unix::fs::symlink(outside.path(), tree.join("a/link")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("kept"), tree.join("file-link")).unwrap();
        let fd = open_dir(top.path()).unwrap();
        remove_tree(&fd, "tree").unwrap();
        assert!(!tree.exists());
        assert_eq!(std::fs::read_to_string(outside.path().join("kept")).unwrap(), "x");
    }

    #[test]
    fn a_folder_already_given_to_its_owner_is_kept_with_what_is_in_it() {
        let top = tempfile::tempdir().unwrap();
        let fd = open_dir(top.path()).unwrap();
        // As root (as the tests run) the folder goes to a user not valve's.
        let me = rustix::process::geteuid().as_raw();
        let app = if me == 0 { (54_321, 54_321) } else { (me, rustix::process::getegid().as_raw()) };
        drop(owned_dir(&fd, "own", 0o700, Some(app)).unwrap());
        std::fs::write(top.path().join("own/w1.sock"), "").unwrap();
        let again = owned_dir(&fd, "own", 0o700, Some(app)).unwrap();
        assert_eq!(rustix::fs::fstat(&again).unwrap().st_uid, app.0);
        assert!(top.path().join("own/w1.sock").exists(), "a second call keeps the first one's sockets");
    }

    #[test]
    fn a_link_where_valves_folder_goes_is_set_aside_not_followed() {
        let outside = tempfile::tempdir().unwrap();
        let top = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), top.path().join("app")).unwrap();
        let fd = open_dir(top.path()).unwrap();
        let dir = valve_dir(&fd, "app", 0o711).unwrap();
        let st = rustix::fs::fstat(&dir).unwrap();
        assert_eq!(st.st_mode & 0o7777, 0o711);
        assert!(std::fs::symlink_metadata(top.path().join("app")).unwrap().is_dir());
        assert!(outside.path().is_dir(), "the link's target is untouched");
        let left: Vec<_> = std::fs::read_dir(top.path()).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(left, vec![std::ffi::OsString::from("app")], "the link set aside is gone");
    }
}
