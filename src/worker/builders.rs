//! The builders that fetch and build apps' packages, never the apps
//! themselves (a boundary: the packages a bundle or lockfile names, from
//! repositories a publisher chose). As root each build slot has a uid of
//! its own (`.builder-N` in the uid table): one build at a time per uid,
//! and every process a build left behind is killed before the slot serves
//! another. Without root a build is valve's user under a Landlock ruleset
//! of its own. Each build or fetch works in a fresh folder of its own in
//! the cache's `tmp/` (`Scratch`), seeing no app's folder and none of
//! valve's files (`sandbox::build`); valve takes what it made out of it
//! through handles, trusting only files the builder owns.

use std::io::{self, Read as _, Write as _};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::fs::{Mode, OFlags};
use rustix::process::Signal;
use tokio::io::AsyncWriteExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::job::{Io, Job};
use super::launchable::{Launchable, Spawner};
use super::privsep::chores::{self, Chore};
use super::privsep::wire::Kind;
use super::process::pid_of;
use super::sandbox::{self, safe, Prepared, Site};
use crate::config::Isolation;

/// The most bytes of one fetched tarball valve reads back.
const MAX_TARBALL: u64 = 512 << 20;

/// One restore's way to them: the slots and the site they build for.
#[derive(Clone, Copy)]
pub struct Builds<'a> {
    pub builders: &'a Arc<Builders>,
    pub site: &'a Site,
}

impl Builds<'_> {
    /// A free slot, waiting for one.
    pub async fn take(&self) -> io::Result<Builder> {
        self.builders.take(self.site).await
    }
}

/// The build slots of one valve: `package_builds` at once.
pub struct Builders {
    permits: Arc<Semaphore>,
    /// Each free slot's uid (`None`: valve's own user, under Landlock).
    free: Mutex<Vec<Option<u32>>>,
    run_dir: PathBuf,
}

/// One build slot, held for one fetch or build; its stray processes are
/// killed when it is given back.
pub struct Builder {
    uid: Option<u32>,
    /// The site as it is now: every app's folder hidden from the build.
    site: Site,
    builders: Arc<Builders>,
    _permit: OwnedSemaphorePermit,
}

impl Builders {
    /// `uids`: the builder uids (as root, one per slot); else `slots` slots of valve's own user.
    pub fn new(run_dir: &Path, uids: Vec<u32>, slots: usize) -> Arc<Builders> {
        let free: Vec<Option<u32>> =
            if uids.is_empty() { vec![None; slots.max(1)] } else { uids.into_iter().map(Some).collect() };
        Arc::new(Builders {
            permits: Arc::new(Semaphore::new(free.len())),
            free: Mutex::new(free),
            run_dir: run_dir.to_path_buf(),
        })
    }

    /// A free slot for a build on `site`, waiting for one.
    pub async fn take(self: &Arc<Self>, site: &Site) -> io::Result<Builder> {
        let permit = self.permits.clone().acquire_owned().await.map_err(io::Error::other)?;
        let uid = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop().flatten();
        Ok(Builder { uid, site: site.clone(), builders: self.clone(), _permit: permit })
    }
}

impl Drop for Builder {
    fn drop(&mut self) {
        if let Some(uid) = self.uid {
            // As root, the privileged spawner's chore (valve's server may
            // not signal a builder's uid); without one, valve's own.
            match chores::ask(&Chore::KillUid { uid }) {
                None => kill_all_of(uid),
                Some(Ok(_)) => {}
                Some(Err(e)) => tracing::warn!("the processes of builder uid {uid} were not killed: {e}"),
            }
        }
        self.builders.free.lock().unwrap_or_else(|p| p.into_inner()).push(self.uid);
    }
}

/// Kills every process whose real uid is `uid` (a builder's: nothing else
/// runs as it), until none is left: what a build started in the background
/// never sees the next build.
pub(crate) fn kill_all_of(uid: u32) {
    for _ in 0..10 {
        let mut found = false;
        let Ok(procs) = std::fs::read_dir("/proc") else { return };
        for p in procs.flatten() {
            let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            if sandbox::ids_of(pid).is_ok_and(|(u, _)| u == uid) {
                found = true;
                let _ = rustix::process::kill_process(pid_of(pid), Signal::KILL);
            }
        }
        if !found {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A build's own folder in the cache's `tmp/`: its `home/` and `tmp/`,
/// `lib/` (what it installs), `dl/` (what it fetches); the builder's, 0700.
/// Removed with everything in it when dropped, following no link.
pub struct Scratch {
    path: PathBuf,
    parent: OwnedFd,
    name: String,
    /// Whose files in it valve trusts: the builder's.
    owner: u32,
    prepared: Arc<Prepared>,
    view: bool,
}

impl Builder {
    /// A new folder for one build or fetch in `tmp` (the cache's), the
    /// build reading `library` too.
    pub fn scratch(&self, tmp: &Path, library: Option<&Path>) -> io::Result<Scratch> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let name = format!("build-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let parent = safe::open_dir(tmp)?;
        let owner = self.uid.map(|u| (u, u));
        let dir = safe::owned_dir(&parent, &name, 0o700, owner)?;
        for sub in ["home", "tmp", "lib", "dl"] {
            drop(safe::owned_dir(&dir, sub, 0o700, owner)?);
        }
        let path = tmp.join(&name);
        let prepared = sandbox::build::for_build(&self.site, &self.builders.run_dir, &path, self.uid, library)?;
        let owner = self.uid.unwrap_or_else(|| rustix::process::geteuid().as_raw());
        Ok(Scratch { path, parent, name, owner, prepared, view: self.site.isolation == Isolation::View })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = safe::remove_tree(&self.parent, &self.name);
    }
}

/// What a build said: its last lines (stdout and stderr as they came).
pub type Tail = Vec<String>;

impl Scratch {
    /// Where the build installs (`R CMD INSTALL -l`).
    pub fn lib(&self) -> PathBuf {
        self.path.join("lib")
    }

    /// Whose files valve takes out of it.
    pub fn owner(&self) -> u32 {
        self.owner
    }

    /// The handle of its `lib/`, never through a link.
    pub fn lib_handle(&self) -> io::Result<OwnedFd> {
        safe::open_at(&safe::open_at(&self.parent, &self.name)?, "lib")
    }

    /// `r_bin` with `args`, as the builder, in this folder, with the
    /// build's environment (its libraries `library`), killed after `timeout`.
    async fn run(
        &self,
        r_bin: &Path,
        args: &[&str],
        library: Option<&Path>,
        stdin: &[u8],
        timeout: Duration,
    ) -> Result<std::process::Output, String> {
        let mut cmd = Job::new(r_bin);
        cmd.args(args)
            .env_clear()
            .envs(sandbox::build::build_env(&self.path, self.view, library))
            .current_dir(&self.path)
            .stdin(Io::Piped);
        let cmd = Launchable::new(cmd, Kind::Builder, Some(self.prepared.clone()));
        let spawner = Spawner::shared().map_err(|e| e.to_string())?;
        let mut child = spawner.spawn(r_bin, cmd).await.map_err(|e| e.to_string())?;
        if let Some(mut input) = child.stdin.take() {
            let _ = input.write_all(stdin).await;
        }
        match tokio::time::timeout(timeout, child.wait_with_output()).await {
            Ok(Ok(output)) => Ok(output),
            Ok(Err(e)) => Err(e.to_string()),
            // Its process group is killed with it (`Child` dropped).
            Err(_) => Err(format!("it took longer than {}s", timeout.as_secs())),
        }
    }

    /// Builds the package in `tarball` into `lib/` with `R CMD INSTALL`,
    /// finding what it needs in `library` and R's own. The last lines of its
    /// output either way.
    pub async fn install(
        &self,
        r_bin: &Path,
        tarball: &Path,
        library: &Path,
        timeout: Duration,
    ) -> Result<Tail, (String, Tail)> {
        let lib = self.lib();
        let (lib, tarball) = (lib.display().to_string(), tarball.display().to_string());
        let args = ["CMD", "INSTALL", "--no-docs", "--no-multiarch", "-l", &lib, &tarball];
        let output = self.run(r_bin, &args, Some(library), b"", timeout).await.map_err(|why| {
            let why = if why.starts_with("it took longer") { format!("{why} (package_build_timeout)") } else { why };
            (why, Vec::new())
        })?;
        let mut lines: Vec<String> = String::from_utf8_lossy(&output.stdout).lines().map(str::to_string).collect();
        lines.extend(String::from_utf8_lossy(&output.stderr).lines().map(str::to_string));
        lines.retain(|l| !l.trim().is_empty());
        let tail: Tail = lines.split_off(lines.len().saturating_sub(20));
        match super::process::Exit::from_status(output.status) {
            super::process::Exit::Code(0) => Ok(tail),
            exit => Err((format!("R CMD INSTALL {}", exit.describe()), tail)),
        }
    }

    /// Fetches each job (a package's name and the URLs to try) with R's own
    /// downloader into `dl/NAME.tar.gz`: for each name, the URL that gave it
    /// or why none did. Read the files back with `take`.
    pub async fn fetch(
        &self,
        r_bin: &Path,
        jobs: &[(String, Vec<String>)],
        timeout: Duration,
    ) -> Result<Vec<(String, Result<String, String>)>, String> {
        let mut input = Vec::new();
        for (name, urls) in jobs {
            // Names are checked package names; URLs checked repositories (no tab, no line break).
            let mut line = self.path.join("dl").join(format!("{name}.tar.gz")).display().to_string();
            for u in urls {
                line.push('\t');
                line.push_str(u);
            }
            if line.contains('\n') {
                return Err(format!("{line:?} holds a line break"));
            }
            let _ = writeln!(input, "{line}");
        }
        let output = self.run(r_bin, &["--vanilla", "--no-echo", "-e", FETCH], None, &input, timeout).await?;
        if !output.status.success() {
            let err = String::from_utf8_lossy(&output.stderr);
            let tail: Vec<&str> = err.lines().rev().take(5).collect();
            return Err(format!(
                "the download failed ({}): {}",
                output.status,
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            ));
        }
        let dl = self.path.join("dl");
        let mut results = Vec::new();
        for line in String::from_utf8_lossy(&output.stdout).lines() {
            let parts: Vec<&str> = line.splitn(3, '\t').collect();
            let name_of = |dest: &str| {
                Path::new(dest)
                    .strip_prefix(&dl)
                    .ok()
                    .and_then(|p| p.to_str())
                    .and_then(|p| p.strip_suffix(".tar.gz"))
                    .map(str::to_string)
            };
            match parts.as_slice() {
                ["valve-fetched", dest, url] => {
                    if let Some(n) = name_of(dest) {
                        results.push((n, Ok(url.to_string())));
                    }
                }
                ["valve-fetch-failed", dest, why] => {
                    if let Some(n) = name_of(dest) {
                        results.push((n, Err(why.to_string())));
                    }
                }
                _ => {}
            }
        }
        Ok(results)
    }

    /// The bytes of `dl/NAME.tar.gz`, as the builder left it: opened
    /// through handles, never through a link, only a regular file of the
    /// builder's with one name, at most `MAX_TARBALL` bytes.
    pub fn take(&self, name: &str) -> io::Result<Vec<u8>> {
        let dl = safe::open_at(&safe::open_at(&self.parent, &self.name)?, "dl")?;
        let fd = rustix::fs::openat(
            &dl,
            format!("{name}.tar.gz").as_str(),
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let st = rustix::fs::fstat(&fd)?;
        if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile
            || st.st_nlink != 1
            || st.st_uid != self.owner
        {
            return Err(io::Error::other(format!(
                "{name}.tar.gz is not a file of the builder's own (uid {}, {} names)",
                st.st_uid, st.st_nlink
            )));
        }
        if st.st_size as u64 > MAX_TARBALL {
            return Err(io::Error::other(format!("{name}.tar.gz is larger than {} MiB", MAX_TARBALL >> 20)));
        }
        let mut bytes = Vec::with_capacity(st.st_size as usize);
        std::fs::File::from(fd).take(MAX_TARBALL + 1).read_to_end(&mut bytes)?;
        Ok(bytes)
    }
}

/// R's downloader (libcurl), one line of stdin a job: `DEST\tURL\tURL...`.
const FETCH: &str = r#"options(timeout = max(600, getOption("timeout")))
jobs <- strsplit(readLines(file("stdin")), "\t", fixed = TRUE)
for (j in jobs) {
  dest <- j[1]; why <- character(); ok <- FALSE
  for (u in j[-1]) {
    r <- tryCatch(suppressWarnings(utils::download.file(u, dest, quiet = TRUE, mode = "wb", method = "libcurl")),
                  error = function(e) conditionMessage(e))
    if (identical(r, 0L) && file.exists(dest)) { ok <- TRUE; cat("valve-fetched\t", dest, "\t", u, "\n", sep = ""); break }
    unlink(dest)
    why <- c(why, paste0(u, ": ", gsub("[\t\n]", " ", if (is.character(r)) r else paste("status", r))))
  }
  if (!ok) cat("valve-fetch-failed\t", dest, "\t", paste(why, collapse = "; "), "\n", sep = "")
}
"#;
