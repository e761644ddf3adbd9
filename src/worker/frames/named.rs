//! A file a worker's answer names (httpuv's `list(file = path, owned =
//! TRUE)` body): opened, and deleted when handed over, as the worker itself
//! would: the path is resolved inside the worker's own view of the files
//! (its root, `/proc/PID/root`, never leaving it) and with its user's
//! permissions. valve runs as root while an app's worker does not: without
//! this, an app could name `/etc/shadow`, or another app's file, and have
//! valve send it, or delete it.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};

/// Where a named file is, as the worker sees it.
pub(in crate::worker) struct Place {
    /// The worker's root (`/proc/PID/root`).
    root: OwnedFd,
    /// The path inside it, without its leading `/`.
    inside: PathBuf,
    /// The worker's user and group, when valve must act as them.
    ids: Option<(u32, u32)>,
}

/// The real uid and gid of process `pid`.
fn ids_of(pid: u32) -> io::Result<(u32, u32)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse::<u32>().ok())
            .ok_or_else(|| io::Error::other(format!("no {name} in /proc/{pid}/status")))
    };
    Ok((field("Uid:")?, field("Gid:")?))
}

impl Place {
    /// Where worker `pid` means by `path`.
    pub(in crate::worker) fn of(pid: u32, path: &Path) -> io::Result<Place> {
        if !path.is_absolute() {
            return Err(io::Error::other("not an absolute path"));
        }
        let root = rustix::fs::open(
            format!("/proc/{pid}/root").as_str(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let valve_is_root = rustix::process::geteuid().is_root();
        let ids = ids_of(pid)?;
        let ids = (valve_is_root && ids.0 != 0).then_some(ids);
        let bytes = path.as_os_str().as_bytes();
        let inside = PathBuf::from(OsStr::from_bytes(&bytes[bytes.iter().take_while(|b| **b == b'/').count()..]));
        Ok(Place { root, inside, ids })
    }

    /// Opens it for reading, as the worker would.
    pub(in crate::worker) fn open(&self) -> io::Result<File> {
        as_worker(self.ids, || {
            let fd = rustix::fs::openat2(
                &self.root,
                &self.inside,
                OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY,
                Mode::empty(),
                ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
            )?;
            let file = File::from(fd);
            if !file.metadata()?.is_file() {
                return Err(io::Error::other("not a regular file"));
            }
            Ok(file)
        })
    }

    /// Deletes it, as the worker would (an answer that handed its file over).
    pub(in crate::worker) fn remove(&self) -> io::Result<()> {
        let (dir, name) = match (self.inside.parent(), self.inside.file_name()) {
            (Some(d), Some(n)) => (d, n),
            _ => return Err(io::Error::other("no file name")),
        };
        as_worker(self.ids, || {
            let dir = if dir.as_os_str().is_empty() {
                rustix::io::dup(&self.root)?
            } else {
                rustix::fs::openat2(
                    &self.root,
                    dir,
                    OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                    Mode::empty(),
                    ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
                )?
            };
            rustix::fs::unlinkat(&dir, name, rustix::fs::AtFlags::empty())?;
            Ok(())
        })
    }
}

/// Runs `f` on this thread with the file-system identity of `ids` (uid,
/// gid, no supplementary groups), then gives valve's back. fsuid, fsgid and
/// the groups of a thread are its own (raw system calls, which glibc would
/// otherwise apply to every thread): no other thread is affected, and `f`
/// makes system calls only, so nothing runs meanwhile on this thread.
fn as_worker<T>(ids: Option<(u32, u32)>, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    let Some((uid, gid)) = ids else { return f() };
    let groups = rustix::process::getgroups()?;
    rustix::thread::set_thread_groups(&[])?;
    // SAFETY: setfsuid and setfsgid take plain numbers and change only this
    // thread; each returns the value it replaced.
    let (old_gid, old_uid) = unsafe { (libc::setfsgid(gid), libc::setfsuid(uid)) };
    let result = f();
    // SAFETY: as above; valve is root, so going back cannot fail.
    let back = unsafe {
        libc::setfsuid(old_uid as u32);
        libc::setfsgid(old_gid as u32);
        libc::setfsuid(u32::MAX) == old_uid
    };
    if !back || rustix::thread::set_thread_groups(&groups).is_err() {
        // Never go on as another user.
        std::process::abort();
    }
    result
}
