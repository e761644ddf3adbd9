//! The warm parent: one R process, started once and shared by apps, with
//! the packages apps load already loaded and warmed; it never runs an app's
//! code. A new worker of an app that can use it is a fork of it that enters
//! the app's sandbox (`enter.c`, through R's `.C`), starts as R's own
//! start-up would for the app and serves it (`zygote.R` runs the launcher).
//!
//! valve writes one JSON line per worker on the parent's stdin: the fork's
//! FIFO, its sandbox's steps, and the file in the app's own run folder that
//! holds its environment (the app's variables and its frames token: secrets
//! never pass through the parent's memory, which every fork inherits). A
//! fork that finds the app needs another R (library paths that hold other
//! versions of what the parent loaded) exits with code 6; one that cannot
//! enter the sandbox with code 7: the launcher then starts a fresh R.
//!
//! The parent's death is survived: until it is back (started again at most
//! every `RESTART_AFTER`), workers start the old way.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use super::child::ChildStdin;
use super::job::{Io, Job};
use super::privsep::wire::Kind;
use tokio::io::AsyncWriteExt;
use tokio::sync::{watch, Mutex};
use tokio_util::sync::CancellationToken;

use super::caps::Keep;
use super::fork::{own_start_time, wait_parent, Fork, ParentExit};
use super::output::{self, Sink, Tail, NOT_A_WORKER};
use super::process::pid_of;
use super::spawn::{Launchable, Spawner, Spec};
use super::wire::WorkerId;

/// The least time between two starts of a parent that died.
const RESTART_AFTER: Duration = Duration::from_secs(5);

/// A fork's exit code when the app needs a fresh R (`SANDBOX_FAILED`: when
/// it could not enter its sandbox).
pub const NEEDS_FRESH_R: i32 = 6;
pub use forks::SANDBOX_FAILED;

mod forks;

/// What the warm parent is made of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recipe {
    pub r_bin: PathBuf,
    /// Packages to load besides plumber, shiny and rmarkdown.
    pub packages: Vec<String>,
    /// What it keeps of root's capabilities (valve as root): `caps`.
    pub keep: Option<Keep>,
}

/// The warm parents of one valve, one per R binary (started when first asked).
pub struct Zygotes {
    packages: Vec<String>,
    keep: Option<Keep>,
    run_dir: Arc<tempfile::TempDir>,
    spawner: Spawner,
    parents: StdMutex<BTreeMap<PathBuf, Arc<Zygote>>>,
}

impl Zygotes {
    /// Must be called inside the runtime that will own the parents.
    pub fn new(run_dir: Arc<tempfile::TempDir>, packages: Vec<String>) -> io::Result<Arc<Zygotes>> {
        let keep = match Keep::for_warm_parent() {
            Ok(keep) => keep,
            Err(why) => {
                tracing::warn!(
                    why,
                    "the warm parent keeps all of root's capabilities: valve may not narrow them \
                     (give valve CAP_SETPCAP, as a plain root has it)"
                );
                None
            }
        };
        Ok(Arc::new(Zygotes {
            packages,
            keep,
            run_dir,
            spawner: Spawner::shared()?,
            parents: StdMutex::new(BTreeMap::new()),
        }))
    }

    /// The warm parent for `r_bin`, starting it in the background if new.
    pub fn for_r(&self, r_bin: &Path) -> Arc<Zygote> {
        let mut parents = self.parents.lock().unwrap_or_else(|p| p.into_inner());
        parents
            .entry(r_bin.to_path_buf())
            .or_insert_with(|| {
                let z = Arc::new(Zygote {
                    recipe: Recipe { r_bin: r_bin.to_path_buf(), packages: self.packages.clone(), keep: self.keep },
                    run_dir: self.run_dir.clone(),
                    spawner: self.spawner.clone(),
                    parent: Mutex::new(None),
                    failed_at: StdMutex::new(None),
                    closed: CancellationToken::new(),
                });
                tokio::spawn(z.clone().keep_up());
                z
            })
            .clone()
    }

    /// Stops every warm parent.
    pub async fn shutdown(&self) {
        let all: Vec<Arc<Zygote>> = self.parents.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
        for z in all {
            z.shutdown().await;
        }
    }
}

/// One warm parent.
pub struct Zygote {
    recipe: Recipe,
    run_dir: Arc<tempfile::TempDir>,
    spawner: Spawner,
    parent: Mutex<Option<Parent>>,
    /// When it last failed to start or died: not started again before `RESTART_AFTER`.
    failed_at: StdMutex<Option<Instant>>,
    /// Fired at shutdown: no more starts.
    closed: CancellationToken,
}

struct Parent {
    pid: u32,
    stdin: ChildStdin,
    gone: watch::Receiver<Option<ParentExit>>,
    /// Its forks still to say their pid (on its output).
    forks: Arc<forks::Forks>,
}

/// Why a worker was not asked of the warm parent (its launcher starts a fresh R).
#[derive(Debug)]
pub struct Unavailable(pub String);

impl Zygote {
    pub fn r_bin(&self) -> &Path {
        &self.recipe.r_bin
    }

    /// Starts the parent, and starts it again `RESTART_AFTER` after it dies,
    /// until valve stops: between, workers start as fresh R.
    async fn keep_up(self: Arc<Self>) {
        loop {
            let gone = match self.parent().await {
                Ok(guard) => guard.as_ref().map(|p| p.gone.clone()),
                Err(_) => None,
            };
            if let Some(mut gone) = gone {
                tokio::select! {
                    _ = gone.wait_for(Option::is_some) => {}
                    _ = self.closed.cancelled() => return,
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(RESTART_AFTER) => {}
                _ = self.closed.cancelled() => return,
            }
        }
    }

    fn failed_at(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.failed_at.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The live parent, started (again) if it is not running and may be.
    async fn parent(&self) -> Result<tokio::sync::MutexGuard<'_, Option<Parent>>, Unavailable> {
        let mut guard = self.parent.lock().await;
        if self.closed.is_cancelled() {
            return Err(Unavailable("valve is stopping".into()));
        }
        if let Some(p) = guard.as_ref() {
            if p.gone.borrow().is_none() {
                return Ok(guard);
            }
            // It died: workers start the old way until it may start again.
            *guard = None;
            *self.failed_at() = Some(Instant::now());
        }
        if self.failed_at().is_some_and(|t| t.elapsed() < RESTART_AFTER) {
            return Err(Unavailable("the warm parent is not running (it starts again shortly)".into()));
        }
        match self.start().await {
            Ok(p) => {
                *guard = Some(p);
                Ok(guard)
            }
            Err(e) => {
                *self.failed_at() = Some(Instant::now());
                tracing::warn!(r_bin = %self.recipe.r_bin.display(), error = %e,
                    "cannot start the warm parent; workers start as fresh R");
                Err(Unavailable(format!("the warm parent could not start: {e}")))
            }
        }
    }

    async fn start(&self) -> Result<Parent, super::process::StartError> {
        // Its own empty home and working directory: it reads no user's
        // .Renviron or .Rprofile. As root, both are the spawner's, made by
        // root before valve's server ran anything.
        let (lib, home) = match super::privsep::client::root_folder() {
            Some(root) => (root.join("lib"), root.join("zygote")),
            None => {
                let home = self.run_dir.path().join("zygote");
                std::fs::create_dir_all(&home)?;
                std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700))?;
                (super::sandbox::lib_dir(self.run_dir.path()), home)
            }
        };
        let mut cmd = Job::new(&self.recipe.r_bin);
        // Of valve's environment only what any isolated worker may have: every
        // fork inherits the parent's (a fork of an app that shares valve's
        // environment is given the rest in its environment file).
        cmd.env_clear().envs(super::sandbox::allowed_env());
        cmd.arg("--no-echo")
            .arg("--no-restore")
            .arg("--no-save")
            .arg(format!("--file={}", lib.join("zygote.R").display()))
            .current_dir(&home)
            .env("HOME", &home)
            .env("R_ENVIRON_USER", "/dev/null")
            .env("R_PROFILE_USER", "/dev/null")
            .env("VALVE_MODE", "zygote")
            .env("VALVE_LOOP", lib.join("loop.R"))
            .env("VALVE_LAUNCHER", lib.join("launcher.R"))
            .env("VALVE_ENTER_LIB", lib.join("valve_enter.so"))
            .env("VALVE_PRELOAD_PACKAGES", self.recipe.packages.join(","))
            .stdin(Io::Piped);
        #[cfg(feature = "test-hooks")]
        if let Some(file) = crate::config::hook("FORK_DIES") {
            // A test's: a fork kills itself at once, before it says a word, while this file exists.
            cmd.env("VALVE_HOOK_FORK_DIES", file);
        }
        // No huge pages for it nor its forks (so no `glibc.malloc.hugetlb=1`
        // added to its tunables, as a fresh worker's are): `parent_of_forks`.
        // Of root's rights only what forking into apps' users needs: `caps`.
        let cmd = Launchable::new(cmd, Kind::WarmParent, None).parent_of_forks().holding_only(self.recipe.keep);
        let mut child = self.spawner.spawn(&self.recipe.r_bin, cmd).await?;
        let pid = child.id().ok_or_else(|| io::Error::other("the warm parent exited at once"))?;
        let stdin = child.stdin.take().ok_or_else(|| io::Error::other("no stdin for the warm parent"))?;
        let tail = Arc::new(Tail::default());
        let forks = Arc::new(forks::Forks::default());
        let mut sink = Sink::of("warm-parent", NOT_A_WORKER, tail.clone());
        sink.hooks.push(forks.clone());
        output::forward(&mut child, &sink);
        let (tx, gone) = watch::channel(None);
        tokio::spawn(async move {
            let exit = wait_parent(child, tail).await;
            tracing::warn!(
                pid,
                status = exit.status,
                "the warm parent exited; workers start as fresh R until it is back"
            );
            let _ = tx.send(Some(exit));
        });
        tracing::info!(pid, r_bin = %self.recipe.r_bin.display(), packages = ?self.recipe.packages,
            "warm parent started: loading and warming the packages apps load");
        Ok(Parent { pid, stdin, gone, forks })
    }

    /// Asks the parent to fork worker `id` of `spec`'s app.
    pub(super) async fn fork(&self, spec: &Spec, id: WorkerId, socket: &Path) -> Result<Fork, Unavailable> {
        let unavailable = |what: &str, e: io::Error| Unavailable(format!("{what}: {e}"));
        let mut guard = self.parent().await?;
        let Some(parent) = guard.as_mut() else { return Err(Unavailable("no warm parent".into())) };
        let (fifo, fork) =
            Fork::expect(spec, id, parent.gone.clone(), "warm parent").map_err(|e| unavailable("its FIFO", e))?;
        let env_file = write_env(spec, id, socket).map_err(|e| unavailable("its environment file", e))?;
        // Its output goes to its FIFO last, once it is the app's user (it
        // opens the FIFO as that user, write-only): until then it speaks on
        // the parent's output, by worker id (`Forks`).
        // Under Landlock it opens it just before its ruleset: the ruleset
        // lets it write into what valve made in its run folder, and make nothing there.
        let mut steps = spec.fork_steps();
        let stdio = format!("stdio {}", fifo.display());
        match steps.iter().position(|l| l.starts_with("landlock ")) {
            Some(at) => steps.insert(at, stdio),
            None => steps.push(stdio),
        }
        #[cfg(feature = "test-hooks")]
        if crate::config::hook("FORK_AS_ROOT").is_some() {
            // A test's: the server asks the warm parent for a fork as root
            // (its forks must refuse, and a fresh R take its place).
            for line in steps.iter_mut().filter(|l| l.starts_with("uid ") || l.starts_with("gid ")) {
                *line = format!("{} 0", &line[..3]);
            }
        }
        let env_uid = rustix::process::geteuid().as_raw();
        let job =
            serde_json::json!({ "id": id, "fifo": fifo, "env_file": env_file, "env_uid": env_uid, "steps": steps });
        let line = format!("{job}\n");
        parent.forks.expect(id, fork.reports());
        if let Err(e) = parent.stdin.write_all(line.as_bytes()).await {
            let _ = std::fs::remove_file(&env_file);
            return Err(Unavailable(format!("cannot reach the warm parent: {e}")));
        }
        let _ = parent.stdin.flush().await;
        Ok(fork)
    }

    /// Closes the parent's stdin (it exits on end-of-file), then makes sure.
    pub async fn shutdown(&self) {
        self.closed.cancel();
        let Some(parent) = self.parent.lock().await.take() else { return };
        let Parent { pid, stdin, mut gone, .. } = parent;
        drop(stdin);
        if tokio::time::timeout(Duration::from_secs(2), gone.wait_for(Option::is_some)).await.is_err() {
            let _ = rustix::process::kill_process_group(pid_of(pid), rustix::process::Signal::KILL);
        }
    }
}

/// Variables the warm parent is started with for itself alone: a fork of
/// an app of its own user has none of them but what the worker's own
/// environment sets again (`VALVE_LIFELINE`, the lifeline every worker
/// holds, stays).
pub(crate) const PARENT_OWN: [&str; 9] = [
    "HOME",
    "R_ENVIRON_USER",
    "R_PROFILE_USER",
    "VALVE_MODE",
    "VALVE_LOOP",
    "VALVE_LAUNCHER",
    "VALVE_ENTER_LIB",
    "VALVE_PRELOAD_PACKAGES",
    "GLIBC_TUNABLES",
];

/// Worker `id`'s environment, in a file of valve's own in the app's run
/// folder (made through the folder's handle, never through a link, 0600):
/// the fork reads it and removes it while it is still root, before it
/// enters the sandbox; secrets never pass through the parent's memory.
fn write_env(spec: &Spec, id: WorkerId, socket: &Path) -> io::Result<PathBuf> {
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in spec.worker_env("plain") {
        env.insert(k, v.to_string_lossy().into_owned());
    }
    env.insert("VALVE_SOCKET".into(), socket.display().to_string());
    env.insert("VALVE_LINK_TOKEN".into(), crate::worker::conn::link_token(socket));
    env.insert("VALVE_WORKER_ID".into(), id.to_string());
    if let Some(token) = spec.frame_token(id) {
        env.insert("VALVE_FRAME_TOKEN".into(), token);
    }
    env.insert("VALVE_PID".into(), std::process::id().to_string());
    env.insert("VALVE_START_TIME".into(), own_start_time().unwrap_or_default());
    let isolated = spec.isolated();
    if !isolated {
        // An app that shares valve's environment has it all, as a fresh R
        // would: the parent started with only what isolated apps may have.
        for (k, v) in std::env::vars() {
            env.entry(k).or_insert(v);
        }
    }
    // What the parent set for itself alone, as a worker started fresh would
    // have it; of an app of its own user, only what `sandbox::inherited`
    // allows of valve's environment (the parent has nothing else), and none
    // of the parent's own.
    let mut unset: Vec<String> = Vec::new();
    for key in ["R_ENVIRON_USER", "R_PROFILE_USER"] {
        match std::env::var(key) {
            Ok(v) => {
                env.insert(key.into(), v);
            }
            Err(_) => unset.push(key.into()),
        }
    }
    unset.extend(PARENT_OWN.iter().filter(|k| !env.contains_key(**k)).map(|k| k.to_string()));
    unset.retain(|k| !env.contains_key(k));
    unset.sort();
    unset.dedup();
    let text = serde_json::json!({ "env": env, "unset": unset }).to_string();
    let (mut file, path) = spec.run_folder()?.new_file(&format!("w{id}.env"))?;
    std::io::Write::write_all(&mut file, text.as_bytes())?;
    Ok(path)
}
