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

use crate::worker::sandbox::{as_user, ids_of};

/// Where a named file is, as the worker sees it.
pub(in crate::worker) struct Place {
    /// The worker's process: its root is `/proc/PID/root`.
    pid: u32,
    /// The path inside it, without its leading `/`.
    inside: PathBuf,
    /// The worker's user and group, when valve must act as them.
    ids: Option<(u32, u32)>,
}

impl Place {
    /// Where worker `pid` means by `path`.
    pub(in crate::worker) fn of(pid: u32, path: &Path) -> io::Result<Place> {
        if !path.is_absolute() {
            return Err(io::Error::other("not an absolute path"));
        }
        let valve_is_root = rustix::process::geteuid().is_root();
        let ids = ids_of(pid)?;
        let ids = (valve_is_root && ids.0 != 0).then_some(ids);
        let bytes = path.as_os_str().as_bytes();
        let inside = PathBuf::from(OsStr::from_bytes(&bytes[bytes.iter().take_while(|b| **b == b'/').count()..]));
        Ok(Place { pid, inside, ids })
    }

    /// The worker's root, opened as the worker's user: valve as root without
    /// CAP_SYS_PTRACE (a container's default capabilities) may not open
    /// another user's `/proc/PID/root`, the worker's own user may.
    fn root(&self) -> io::Result<OwnedFd> {
        Ok(rustix::fs::open(
            format!("/proc/{}/root", self.pid).as_str(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?)
    }

    /// Opens it for reading, as the worker would.
    pub(in crate::worker) fn open(&self) -> io::Result<File> {
        as_user(self.ids, || {
            let root = self.root()?;
            let fd = rustix::fs::openat2(
                &root,
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
        as_user(self.ids, || {
            let root = self.root()?;
            let dir = if dir.as_os_str().is_empty() {
                root
            } else {
                rustix::fs::openat2(
                    &root,
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
