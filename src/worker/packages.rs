//! Which versions of some packages an app's R finds: one R process
//! (`launcher.R` in `packages` mode) started as the app's workers are (its
//! R, environment, working directory and `.Rprofile`, so an renv library is
//! seen as the app sees it), which says each package's version and exits.
//! A published bundle is checked with it before any worker of it starts.
//! (Packages are built by `builders`, never as the app.)

use std::io;
use std::time::Duration;

use super::job::Io;
use super::process::{Exit, StartError};
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
    cmd.env("VALVE_PACKAGES", names.join("\n")).stdin(Io::Null).stdout(Io::Piped).stderr(Io::Piped);
    let child = spawner.spawn(&spec.r_bin, cmd).await?;
    let output = match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(Ok(output)) => output,
        Ok(Err(e)) => return Err(StartError::Io(e)),
        // Its process group is killed with it (`Child` dropped, not reaped).
        Err(_) => return Err(StartError::Timeout(timeout, Vec::new())),
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
