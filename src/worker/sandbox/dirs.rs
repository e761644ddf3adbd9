//! Each app's private folders, made by valve (as root) and owned by the
//! app's user: its run folder (sockets, FIFOs, spooled bodies) and its
//! temporary folder inside valve's run directory, its home inside the
//! state directory. Each is 0700: no other app's user can enter it; the
//! folders above them are 0711, passable but not listable.

use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{Gid, Uid};

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

/// `RUN/apps/NAME`: the app's workers' sockets and FIFOs, and its spooled
/// bodies. Owned by the app's user when it has one of its own.
pub fn app_run_dir(run_dir: &Path, app: &str, account: Option<&Account>) -> io::Result<PathBuf> {
    let apps = run_dir.join("apps");
    ensure(&apps, 0o711, None)?;
    let dir = apps.join(app);
    ensure(&dir, 0o700, account.and_then(owner))?;
    Ok(dir)
}

/// `RUN/tmp/NAME`: the app's temporary folder (gone with the run directory).
pub fn private_tmp(run_dir: &Path, app: &str, account: &Account) -> io::Result<PathBuf> {
    let tmps = run_dir.join("tmp");
    ensure(&tmps, 0o711, None)?;
    let dir = tmps.join(app);
    ensure(&dir, 0o700, owner(account))?;
    Ok(dir)
}

/// `STATE/apps/NAME/home`: the app's home, kept across runs.
pub fn private_home(state_dir: &Path, app: &str, account: &Account) -> io::Result<PathBuf> {
    if !state_dir.exists() {
        ensure(state_dir, 0o711, None)?;
    }
    let apps = state_dir.join("apps");
    ensure(&apps, 0o711, None)?;
    ensure(&apps.join(app), 0o711, None)?;
    let home = apps.join(app).join("home");
    ensure(&home, 0o700, owner(account))?;
    Ok(home)
}
