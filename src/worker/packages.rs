//! Which versions of some packages an app's R finds: one R process
//! (`launcher.R` in `packages` mode) started as the app's workers are (its
//! R, environment, working directory and `.Rprofile`, so an renv library is
//! seen as the app sees it), which says each package's version and exits.
//! A published bundle is checked with it before any worker of it starts.
//! And one package's build as the app (`install`): `R CMD INSTALL` in the
//! app's sandbox, as its user, under its memory limit, within a time.

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use rustix::process::Signal;

use super::process::{pid_of, Exit, StartError};
use super::sandbox::safe;
use super::spawn::{Spawner, Spec};

/// What the app's R has of the packages asked about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Installed {
    /// R's version, as `getRversion()` says it.
    pub r_version: String,
    /// Its library paths, `:`-separated.
    pub lib_paths: String,
    /// Each package asked about and the version found (`None`: not installed).
    pub packages: Vec<(String, Option<String>)>,
}

/// Asks the R of `spec` for the versions of `names`, within `timeout`.
/// The names go in its environment (`VALVE_PACKAGES`, one a line): never in
/// a file, which would be in a folder the app's R can reach.
pub async fn installed(spec: &Spec, names: &[String], timeout: Duration) -> Result<Installed, StartError> {
    if let Some(bad) = names.iter().find(|n| n.contains('\0') || n.contains('\n')) {
        return Err(StartError::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{bad:?} is no package name (it holds a NUL or a line break)"),
        )));
    }
    let spawner = Spawner::shared().map_err(StartError::Io)?;
    let mut cmd = spec.command("packages").map_err(StartError::Io)?;
    cmd.env("VALVE_PACKAGES", names.join("\n")).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let (child, _own) = spawner.spawn(&spec.r_bin, cmd).await?;
    let pid = child.id().unwrap_or_default();
    let output = match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(Ok(output)) => output,
        Ok(Err(e)) => return Err(StartError::Io(e)),
        Err(_) => {
            // Not reaped yet (its output is still being read): the group is its own.
            let _ = rustix::process::kill_process_group(pid_of(pid), Signal::KILL);
            return Err(StartError::Timeout(timeout, Vec::new()));
        }
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let tail: Vec<String> =
        String::from_utf8_lossy(&output.stderr).lines().rev().take(20).map(str::to_string).collect();
    let exit = Exit::from_status(output.status);
    if exit != Exit::Code(0) {
        let code = match exit {
            Exit::Code(c) => Some(c),
            _ => None,
        };
        return Err(StartError::Exited { status: exit.describe(), code, tail: tail.into_iter().rev().collect() });
    }
    Ok(parse(&stdout))
}

/// A folder one build writes to: the app's user's, in its private
/// temporary folder when it has one (`inside` is its path as the build
/// sees it: under `/tmp` in a private view), else `fallback` (valve's own).
#[derive(Debug)]
pub struct BuildDir {
    pub outside: PathBuf,
    pub inside: PathBuf,
    /// Its parent's handle and its name there (removed through them).
    parent: Option<(OwnedFd, String)>,
    /// Whose files the build makes.
    uid: u32,
}

impl BuildDir {
    /// Makes a new build folder for an app of `spec`.
    pub fn new(spec: &Spec, fallback: &Path) -> io::Result<BuildDir> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let name = format!("valve-build-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        match (spec.owner(), spec.private_tmp()) {
            // The app's own temporary folder: its user's, or (under Landlock) valve's and the app's to write.
            (owner, Some((outside, inside))) => {
                let parent = safe::open_dir(&outside)?;
                drop(safe::owned_dir(&parent, &name, 0o700, owner)?);
                Ok(BuildDir {
                    outside: outside.join(&name),
                    inside: inside.join(&name),
                    parent: Some((parent, name)),
                    uid: owner.map_or_else(|| rustix::process::geteuid().as_raw(), |o| o.0),
                })
            }
            (_, None) => {
                std::fs::create_dir_all(fallback)?;
                let parent = safe::open_dir(fallback)?;
                drop(safe::valve_dir(&parent, &name, 0o755)?);
                let path = fallback.join(&name);
                let uid = rustix::process::geteuid().as_raw();
                Ok(BuildDir { outside: path.clone(), inside: path, parent: Some((parent, name)), uid })
            }
        }
    }

    /// Whose files the build makes (the app's user, or valve).
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// The handle of the folder (never through a link).
    pub fn open(&self) -> io::Result<OwnedFd> {
        safe::open_dir(&self.outside)
    }
}

impl Drop for BuildDir {
    fn drop(&mut self) {
        if let Some((parent, name)) = &self.parent {
            let _ = safe::remove_tree(parent, name);
        }
    }
}

/// What a build said: its last lines (stdout and stderr as they came).
pub type Tail = Vec<String>;

/// Builds the package in `tarball` (a path the app's R can read) into
/// `dir`'s `lib` folder as the app's workers would run (its user, sandbox,
/// memory limit), finding what it needs in `library` and R's own; killed
/// after `timeout`. Gives the last lines of its output either way.
pub async fn install(
    spec: &Spec,
    tarball: &Path,
    dir: &BuildDir,
    library: &Path,
    timeout: Duration,
) -> Result<Tail, (String, Tail)> {
    let io_err = |e: io::Error| (e.to_string(), Vec::new());
    let spawner = Spawner::shared().map_err(io_err)?;
    let mut cmd = spec.command("install").map_err(io_err)?;
    let out = dir.inside.join("lib");
    cmd.env("VALVE_INSTALL_TARBALL", tarball)
        .env("VALVE_INSTALL_OUT", &out)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for name in ["VALVE_LIBRARY", "R_LIBS", "R_LIBS_USER", "R_LIBS_SITE"] {
        cmd.env(name, library);
    }
    safe::owned_dir(&dir.open().map_err(io_err)?, "lib", 0o755, spec.owner()).map_err(io_err)?;
    let (child, _own) = spawner.spawn(&spec.r_bin, cmd).await.map_err(|e| (e.to_string(), Vec::new()))?;
    let pid = child.id().unwrap_or_default();
    let output = match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(Ok(output)) => output,
        Ok(Err(e)) => return Err(io_err(e)),
        Err(_) => {
            let _ = rustix::process::kill_process_group(pid_of(pid), Signal::KILL);
            return Err((format!("it took longer than {}s (package_build_timeout)", timeout.as_secs()), Vec::new()));
        }
    };
    let mut lines: Vec<String> = String::from_utf8_lossy(&output.stdout).lines().map(str::to_string).collect();
    lines.extend(String::from_utf8_lossy(&output.stderr).lines().map(str::to_string));
    lines.retain(|l| !l.trim().is_empty());
    let tail: Tail = lines.split_off(lines.len().saturating_sub(20));
    match Exit::from_status(output.status) {
        Exit::Code(0) => Ok(tail),
        exit => Err((format!("R CMD INSTALL {}", exit.describe()), tail)),
    }
}

/// Reads the launcher's `valve-r` and `valve-package` lines (anything else
/// an `.Rprofile` printed is ignored).
fn parse(stdout: &str) -> Installed {
    let mut out = Installed { r_version: String::new(), lib_paths: String::new(), packages: Vec::new() };
    for line in stdout.lines() {
        if let Some(rest) = line.strip_prefix("valve-r ") {
            let (version, paths) = rest.split_once(' ').unwrap_or((rest, ""));
            out.r_version = version.to_string();
            out.lib_paths = paths.to_string();
        } else if let Some(rest) = line.strip_prefix("valve-package ") {
            if let Some((name, version)) = rest.split_once(' ') {
                let version = (version != "-").then(|| version.to_string());
                out.packages.push((name.to_string(), version));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_launchers_lines_are_read_and_the_rest_ignored() {
        let got =
            parse("renv: project loaded\nvalve-r 4.2.2 /a:/b\nvalve-package plumber 1.2.1\nvalve-package nope -\n");
        assert_eq!(got.r_version, "4.2.2");
        assert_eq!(got.lib_paths, "/a:/b");
        assert_eq!(got.packages, vec![("plumber".into(), Some("1.2.1".into())), ("nope".into(), None)]);
    }
}
