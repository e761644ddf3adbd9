//! Starting a process: a `Job` and what it enters between fork and exec
//! (`Launchable`: the app's sandbox, no huge pages, the capabilities a root
//! process keeps), and `Spawner`, which starts it: as root through the
//! privileged spawner (`privsep`), else from one long-lived thread of
//! valve's own, with the same steps (`exec::command`).

use std::io;
use std::path::Path;
use std::sync::Arc;

use tokio::sync::oneshot;

use super::caps::Keep;
use super::child::Child;
use super::exec::{command, failed_step};
use super::job::{Job, Pipes};
use super::privsep::client::{self, Failure};
use super::privsep::wire::{Kind, Start};
use super::process::StartError;
use super::reap;
use super::sandbox::Prepared;

/// A job with what it enters between fork and exec.
pub(super) struct Launchable {
    pub job: Job,
    pub kind: Kind,
    /// The app it is for (an app's process).
    pub app: Option<String>,
    pub sandbox: Option<Arc<Prepared>>,
    pub thp_off: bool,
    pub keep: Option<Keep>,
    /// What is left of its process group is killed when it exits.
    pub group_dies: bool,
}

impl std::ops::Deref for Launchable {
    type Target = Job;
    fn deref(&self) -> &Job {
        &self.job
    }
}

impl std::ops::DerefMut for Launchable {
    fn deref_mut(&mut self) -> &mut Job {
        &mut self.job
    }
}

impl Launchable {
    /// `job`, of `kind`, entering `sandbox` between fork and exec; every
    /// process valve starts dies with valve (a parent-death signal).
    pub(super) fn new(job: Job, kind: Kind, sandbox: Option<Arc<Prepared>>) -> Launchable {
        Launchable { job, kind, app: None, sandbox, thp_off: false, keep: None, group_dies: false }
    }

    /// For app `name`.
    pub(super) fn for_app(mut self, name: &str) -> Launchable {
        self.app = Some(name.to_string());
        self
    }

    /// For an R process valve starts to fork workers from (the warm parent, a
    /// `--preload` parent): no transparent huge pages, for it and its forks
    /// (the kernel keeps the switch across fork and exec; `HUGE_PAGES` then
    /// asks for nothing). A fork writing into a huge page it shares with its
    /// parent paid for it on its slowest requests: with huge pages a warm
    /// parent's fork had a p99 2-3 % over a fresh R's on bench/packages' c.,
    /// without them within 1 %; its R CPU per GET /echo stayed within this
    /// machine's noise (bench/r-cost).
    pub(super) fn parent_of_forks(mut self) -> Launchable {
        self.thp_off = true;
        self
    }

    /// When it exits, whatever it left in its process group is killed
    /// (a worker's: not a parent's, whose forks serve on).
    pub(super) fn group_dies_with_it(mut self) -> Launchable {
        self.group_dies = true;
        self
    }

    /// Started as root, keeping only `keep` of root's capabilities (nothing
    /// to do when `None`: valve is not root).
    pub(super) fn holding_only(mut self, keep: Option<Keep>) -> Launchable {
        self.keep = keep;
        self
    }

    /// The request that asks the privileged spawner for it (its id and
    /// which streams are piped filled in when it is sent).
    fn request(&self) -> Result<Start, StartError> {
        let sandbox =
            match &self.sandbox {
                Some(p) if !p.is_empty() => Some(p.owned().cloned().ok_or_else(|| {
                    StartError::Io(io::Error::other("a Landlock ruleset cannot be sent to the spawner"))
                })?),
                _ => None,
            };
        let job = &self.job;
        Ok(Start {
            id: 0,
            kind: self.kind,
            app: self.app.clone(),
            program: job.program.clone(),
            args: job.args.clone(),
            env: job.env.clone(),
            clear_env: job.clear_env,
            cwd: job.cwd.clone(),
            piped: [false; 3],
            thp_off: self.thp_off,
            group_dies: self.group_dies,
            keep: self.keep.map(|k| k.mask()),
            sandbox,
        })
    }
}

/// What a start that failed says: which step, or why R did not run.
pub(super) fn start_error(r_bin: &Path, error: io::Error, step: Option<String>) -> StartError {
    if let Some(step) = step {
        return StartError::Sandbox { step, error };
    }
    StartError::NoR {
        r_bin: r_bin.display().to_string(),
        reason: match error.kind() {
            io::ErrorKind::NotFound => {
                "not found (install R, e.g. `apt-get install r-base-core r-cran-plumber`, or pass --r-bin)".into()
            }
            io::ErrorKind::PermissionDenied => "permission denied (is it executable?)".into(),
            _ => error.to_string(),
        },
    }
}

/// A job for the spawner thread, the runtime its child belongs to, and
/// where to send the child.
type SpawnJob = (Launchable, Pipes, tokio::runtime::Handle, oneshot::Sender<Result<Child, StartError>>);

/// The process's one spawner thread, started on first use and never stopped.
static SHARED: std::sync::OnceLock<Spawner> = std::sync::OnceLock::new();

/// Starts processes: as root, by asking the privileged spawner; else from
/// one long-lived thread. Linux delivers the parent-death signal when the
/// *thread* that forked a child exits, so children must not be forked from
/// threads that come and go (tokio's blocking pool). One thread serves the
/// whole process, every app and generation alike: valve's threads do not
/// grow with its apps, and the thread lives as long as valve (the static
/// below holds its channel open), so no child is killed early.
#[derive(Clone, Debug)]
pub(super) struct Spawner {
    jobs: std::sync::mpsc::Sender<SpawnJob>,
}

impl Spawner {
    /// The process's spawner (its thread is started the first time).
    pub(super) fn shared() -> io::Result<Self> {
        if let Some(spawner) = SHARED.get() {
            return Ok(spawner.clone());
        }
        // Two callers racing here both start a thread; the loser's is dropped
        // before it forked anything, and its thread ends with its channel.
        let spawner = Spawner::start()?;
        Ok(SHARED.get_or_init(|| spawner).clone())
    }

    fn start() -> io::Result<Self> {
        let (jobs, rx) = std::sync::mpsc::channel::<SpawnJob>();
        std::thread::Builder::new().name("valve-spawner".into()).spawn(move || {
            for (cmd, pipes, runtime, reply) in rx {
                // The child is watched by the runtime of whoever asked (tests run several).
                let _runtime = runtime.enter();
                let _ = reply.send(spawn_here(cmd, pipes));
            }
        })?;
        Ok(Spawner { jobs })
    }

    /// Starts `cmd`: its piped streams are the returned child's.
    pub(super) async fn spawn(&self, r_bin: &Path, cmd: Launchable) -> Result<Child, StartError> {
        let mut pipes = Pipes::for_job(&cmd.job).map_err(StartError::Io)?;
        if let Some(client) = client::client() {
            let ends = std::mem::take(&mut pipes.child);
            let started = client.start(cmd.request()?, ends).await.map_err(|f| match f {
                Failure::Refused(why) => {
                    StartError::Io(io::Error::other(format!("the privileged spawner refused to start it: {why}")))
                }
                Failure::Failed(e, step) => start_error(r_bin, e, step),
            })?;
            return Child::remote(started, pipes).map_err(StartError::Io);
        }
        let (tx, rx) = oneshot::channel();
        let gone = || StartError::Io(io::Error::other("spawner thread is gone"));
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| StartError::Io(io::Error::other(e)))?;
        self.jobs.send((cmd, pipes, runtime, tx)).map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?.map_err(|e| match e {
            StartError::Io(e) => start_error(r_bin, e, None),
            e => e,
        })
    }
}

/// Starts `cmd` from this thread, valve's own child (the reaper leaves it to
/// tokio while the child's `Own` lives).
fn spawn_here(mut cmd: Launchable, mut pipes: Pipes) -> Result<Child, StartError> {
    let ends = std::mem::take(&mut pipes.child);
    let (std_cmd, report) =
        command(&cmd.job, ends, cmd.sandbox.clone(), cmd.thp_off, cmd.keep.take()).map_err(StartError::Io)?;
    let mut tokio_cmd = tokio::process::Command::from(std_cmd);
    tokio_cmd.kill_on_drop(true);
    let spawned = reap::spawn(&mut tokio_cmd);
    // The child's ends of its pipes close here with the command.
    drop(tokio_cmd);
    match spawned {
        Ok((child, own)) => Child::local(child, own, pipes, cmd.group_dies).map_err(StartError::Io),
        Err(error) => match failed_step(report.as_ref(), cmd.sandbox.as_deref()) {
            Some(step) => Err(StartError::Sandbox { step, error }),
            None => Err(StartError::Io(error)),
        },
    }
}
