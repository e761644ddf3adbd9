//! R run as valve itself, in no sandbox and with `--vanilla` (no profile,
//! no site file, no app code, nothing an app or publisher sent): what an R
//! installation is (its version, platform and library folders). Fetching
//! packages is a builder's (`builders`), never valve's.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use super::job::{Io, Job};
use super::launchable::{Launchable, Spawner};
use super::privsep::wire::Kind;

/// What one R installation is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RFacts {
    /// `getRversion()`.
    pub version: String,
    /// `R.version$platform`.
    pub platform: String,
    /// Its default library paths, site libraries first, R's own last.
    pub libraries: Vec<PathBuf>,
    /// R's own library (`.Library`: base and recommended packages).
    pub own: PathBuf,
}

const FACTS: &str = r#"cat("valve-r-version", as.character(getRversion()), "\n")
cat("valve-r-platform", R.version$platform, "\n")
cat("valve-r-own", .Library, "\n")
for (p in .libPaths()) cat("valve-r-lib", p, "\n")
"#;

/// The arguments of valve's one question to R about itself (the privileged
/// spawner starts R as root with these and no others).
pub(crate) fn probe_args() -> Vec<String> {
    ["--vanilla", "--no-echo", "-e", FACTS].map(String::from).to_vec()
}

/// Asks `r_bin` what it is.
pub async fn facts(r_bin: &Path) -> Result<RFacts, String> {
    let out = run(r_bin, FACTS, "", Duration::from_secs(60)).await?;
    let mut facts =
        RFacts { version: String::new(), platform: String::new(), libraries: Vec::new(), own: PathBuf::new() };
    for line in out.lines() {
        let mut words = line.splitn(2, ' ');
        let (key, value) = (words.next().unwrap_or(""), words.next().unwrap_or("").trim());
        match key {
            "valve-r-version" => facts.version = value.to_string(),
            "valve-r-platform" => facts.platform = value.to_string(),
            "valve-r-own" => facts.own = PathBuf::from(value),
            "valve-r-lib" => facts.libraries.push(PathBuf::from(value)),
            _ => {}
        }
    }
    if facts.version.is_empty() {
        return Err(format!("{} did not say its version", r_bin.display()));
    }
    Ok(facts)
}

/// Runs `code` in `r_bin --vanilla` with `stdin`, within `timeout`: its
/// standard output, or what went wrong with its last lines.
async fn run(r_bin: &Path, code: &str, stdin: &str, timeout: Duration) -> Result<String, String> {
    let mut cmd = Job::new(r_bin);
    cmd.args(["--vanilla", "--no-echo", "-e", code]).stdin(Io::Piped);
    let spawner = Spawner::shared().map_err(|e| e.to_string())?;
    let cmd = Launchable::new(cmd, Kind::Probe, None);
    let mut child = spawner.spawn(r_bin, cmd).await.map_err(|e| e.to_string())?;
    if let Some(mut input) = child.stdin.take() {
        let _ = input.write_all(stdin.as_bytes()).await;
    }
    let output = match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(Ok(output)) => output,
        Ok(Err(e)) => return Err(e.to_string()),
        // Its process group is killed with it (`Child` dropped).
        Err(_) => return Err(format!("{} took longer than {}s", r_bin.display(), timeout.as_secs())),
    };
    if !output.status.success() {
        let err = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = err.lines().rev().take(5).collect();
        return Err(format!(
            "{} failed ({}): {}",
            r_bin.display(),
            output.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
