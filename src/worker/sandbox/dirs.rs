//! Each app's private folders, made by valve (as root): its run folder
//! (FIFOs, spooled bodies, valve's own: see `app_run_dir`) and its
//! temporary folder inside valve's run directory, its home inside the
//! state directory, the last two owned by the app's user. Each is 0700 or
//! 0711: no other app's user can list it; the folders above them are 0711,
//! passable but not listable.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{AtFlags, FileType, Gid, Mode, OFlags, Uid};

use crate::config::Account;

/// Makes `dir` (and its parents) if missing, then gives it `mode` and, if
/// given, an owner.
fn ensure(dir: &Path, mode: u32, owner: Option<(u32, u32)>) -> io::Result<()> {
    std::fs::DirBuilder::new().recursive(true).mode(mode).create(dir).map_err(|e| named(dir, e))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).map_err(|e| named(dir, e))?;
    if let Some((uid, gid)) = owner {
        rustix::fs::chown(dir, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid))).map_err(|e| named(dir, e.into()))?;
    }
    Ok(())
}

fn named(dir: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", dir.display()))
}

fn owner(account: &Account) -> Option<(u32, u32)> {
    Some((account.uid, account.gid))
}

/// `RUN/apps/NAME`: valve's own (mode 0711), so that only valve makes
/// entries in it: the app's workers open what valve made for them there by
/// its exact name (a FIFO, a spooled body), and nothing an app names is ever
/// followed by valve as root. What the app's R itself creates (its Unix
/// sockets) goes in `own/`, the app's user's (0700). A folder left there
/// that is not valve's is set aside and removed without following a link.
pub fn app_run_dir(run_dir: &Path, app: &str, account: Option<&Account>) -> io::Result<RunFolder> {
    let apps = run_dir.join("apps");
    ensure(&apps, 0o711, None)?;
    let apps_fd = super::safe::open_dir(&apps).map_err(|e| named(&apps, e))?;
    let path = apps.join(app);
    let fd = super::safe::valve_dir(&apps_fd, app, 0o711).map_err(|e| named(&path, e))?;
    let own = path.join("own");
    // The app's user's: kept across reloads, since the generation still
    // draining has its sockets in it.
    super::safe::owned_dir(&fd, "own", 0o700, account.and_then(owner)).map_err(|e| named(&own, e))?;
    Ok(RunFolder { path, fd: Arc::new(fd), own })
}

/// An app's run folder (`RUN/apps/NAME`, valve's own) and a handle on it:
/// everything valve makes or removes there goes through the handle, by a
/// name it chose, never following a link.
#[derive(Clone, Debug)]
pub struct RunFolder {
    path: PathBuf,
    fd: Arc<OwnedFd>,
    own: PathBuf,
}

impl RunFolder {
    /// A folder of valve's own used as a run folder (a `Spec` with no
    /// sandbox: valve's run directory itself).
    pub fn open(path: &Path) -> io::Result<RunFolder> {
        let fd = super::safe::open_dir(path).map_err(|e| named(path, e))?;
        Ok(RunFolder { path: path.to_path_buf(), fd: Arc::new(fd), own: path.to_path_buf() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `own/`: the app's user's, for what its R creates (its sockets).
    pub fn own(&self) -> &Path {
        &self.own
    }

    /// A FIFO named `name` (0600, `owner`'s), in place of any entry so named.
    pub fn fifo(&self, name: &str, owner: Option<(u32, u32)>) -> io::Result<PathBuf> {
        let path = self.path.join(name);
        self.remove(name);
        rustix::fs::mknodat(&*self.fd, name, FileType::Fifo, Mode::from_raw_mode(0o600), 0)
            .map_err(|e| named(&path, e.into()))?;
        if let Some((uid, gid)) = owner {
            rustix::fs::chownat(
                &*self.fd,
                name,
                Some(Uid::from_raw(uid)),
                Some(Gid::from_raw(gid)),
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(|e| named(&path, e.into()))?;
        }
        Ok(path)
    }

    /// A new file named `name`, valve's (0600), open for writing: never an
    /// entry that was there (O_EXCL), never through a link (O_NOFOLLOW).
    pub fn new_file(&self, name: &str) -> io::Result<(std::fs::File, PathBuf)> {
        let path = self.path.join(name);
        self.remove(name);
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&*self.fd, name, flags, Mode::from_raw_mode(0o600))
            .map_err(|e| named(&path, e.into()))?;
        Ok((std::fs::File::from(fd), path))
    }

    /// A new folder named `name` (0700), given to `owner` through its own handle.
    pub fn new_dir(&self, name: &str, owner: Option<(u32, u32)>) -> io::Result<PathBuf> {
        let path = self.path.join(name);
        rustix::fs::mkdirat(&*self.fd, name, Mode::from_raw_mode(0o700)).map_err(|e| named(&path, e.into()))?;
        let dir = rustix::fs::openat(
            &*self.fd,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| named(&path, e.into()))?;
        if let Some((uid, gid)) = owner {
            rustix::fs::fchown(&dir, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
                .map_err(|e| named(&path, e.into()))?;
        }
        Ok(path)
    }

    /// Removes the entry `name` (a file, FIFO or link: the link itself).
    pub fn remove(&self, name: &str) {
        let _ = rustix::fs::unlinkat(&*self.fd, name, AtFlags::empty());
    }

    /// Removes the folder `name` and all in it, following no link.
    pub fn remove_tree(&self, name: &str) -> io::Result<()> {
        super::safe::remove_tree(&*self.fd, name)
    }
}

/// `RUN/tmp/NAME`: the app's temporary folder (gone with the run directory).
pub fn private_tmp(run_dir: &Path, app: &str, account: Option<&Account>) -> io::Result<PathBuf> {
    let tmps = run_dir.join("tmp");
    ensure(&tmps, 0o711, None)?;
    let dir = tmps.join(app);
    ensure(&dir, 0o700, account.and_then(owner))?;
    Ok(dir)
}

/// `STATE/apps/NAME/home`: the app's home, kept across runs. It stays
/// with its app: a published app's home is its record's (`instance`, its
/// guid, in `STATE/apps/NAME/instance`), and one left by another (a name
/// removed and published anew; a home of another uid's) is set aside as
/// `.home-of-...` (never removed: its files are its owner's), and the app
/// gets an empty one. Everything through handles, no link followed.
pub fn private_home(
    state_dir: &Path,
    app: &str,
    account: Option<&Account>,
    instance: Option<&str>,
) -> io::Result<PathBuf> {
    if !state_dir.exists() {
        ensure(state_dir, 0o711, None)?;
    }
    let apps = state_dir.join("apps");
    ensure(&apps, 0o711, None)?;
    let apps_fd = super::safe::open_dir(&apps).map_err(|e| named(&apps, e))?;
    let dir = apps.join(app);
    let fd = super::safe::valve_dir(&apps_fd, app, 0o711).map_err(|e| named(&dir, e))?;
    let home = dir.join("home");
    if let Some(id) = instance {
        match read_marker(&fd) {
            Some(m) if m == id => {}
            Some(m) => {
                set_home_aside(&fd, &format!(".home-of-{}", short(&m)), app)?;
                write_marker(&fd, id).map_err(|e| named(&dir, e))?;
            }
            // A home made before valve marked them: its app's own.
            None => write_marker(&fd, id).map_err(|e| named(&dir, e))?,
        }
    }
    if let Some(acct) = account {
        let me = rustix::process::geteuid().as_raw();
        if let Ok(st) = rustix::fs::statat(&fd, "home", AtFlags::SYMLINK_NOFOLLOW) {
            if st.st_uid != acct.uid && st.st_uid != me {
                set_home_aside(&fd, &format!(".home-of-uid-{}", st.st_uid), app)?;
            }
        }
    }
    drop(super::safe::owned_dir(&fd, "home", 0o700, account.and_then(owner)).map_err(|e| named(&home, e))?);
    Ok(home)
}

const MARKER: &str = "instance";

fn short(id: &str) -> String {
    id.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').take(36).collect()
}

/// The app a home folder belongs to, as valve wrote it (never through a link).
fn read_marker(dir: &OwnedFd) -> Option<String> {
    let fd =
        rustix::fs::openat(dir, MARKER, OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty()).ok()?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(std::fs::File::from(fd), 256), &mut text).ok()?;
    Some(text.trim().to_string())
}

/// Records which app's the home in `dir` is (valve's own file, 0600, replaced whole).
fn write_marker(dir: &OwnedFd, id: &str) -> io::Result<()> {
    let tmp = format!(".{MARKER}.tmp");
    let _ = rustix::fs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
    let fd = rustix::fs::openat(
        dir,
        tmp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    std::io::Write::write_all(&mut std::fs::File::from(fd), format!("{id}\n").as_bytes())?;
    rustix::fs::renameat(dir, tmp.as_str(), dir, MARKER)?;
    Ok(())
}

/// Moves `home` in `dir` aside to `aside` (a unique name), its files kept as they are.
fn set_home_aside(dir: &OwnedFd, aside: &str, app: &str) -> io::Result<()> {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let aside = format!("{aside}-{nanos}");
    match rustix::fs::renameat(dir, "home", dir, aside.as_str()) {
        Ok(()) => {
            tracing::warn!(app, aside = %aside,
                "the app's home folder was another's (a name published anew, or another user's): set aside, the app gets an empty one");
            Ok(())
        }
        Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
