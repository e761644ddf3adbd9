//! Starting a process: a `Job` and what it enters between fork and exec
//! (`Launchable`: the app's sandbox, no huge pages, the capabilities a root
//! process keeps), the one command that does those steps (`command`: the
//! same in valve and in the privileged spawner), and `Spawner`, which starts
//! it: as root through the privileged spawner (`privsep`), else from one
//! long-lived thread of valve's own.

use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::path::Path;
use std::sync::Arc;

use rustix::process::{Pid, Signal};
use tokio::sync::oneshot;

use super::caps::Keep;
use super::child::Child;
use super::job::{Job, Pipes};
use super::privsep::wire::Kind;
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
        Launchable { job, kind, app: None, sandbox, thp_off: false, keep: None }
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

    /// Started as root, keeping only `keep` of root's capabilities (nothing
    /// to do when `None`: valve is not root).
    pub(super) fn holding_only(mut self, keep: Option<Keep>) -> Launchable {
        self.keep = keep;
        self
    }
}

/// The std command of a job: its streams (`ends`), and between fork and
/// exec the lifeline kept, the parent-death signal, `sandbox` entered, huge
/// pages off (`thp_off`) and `keep` applied. With the read end of the pipe
/// on which the child says which sandbox step failed.
pub(super) fn command(
    job: &Job,
    ends: [Option<OwnedFd>; 3],
    sandbox: Option<Arc<Prepared>>,
    thp_off: bool,
    keep: Option<Keep>,
) -> io::Result<(std::process::Command, Option<OwnedFd>)> {
    use std::os::unix::process::CommandExt;
    let mut cmd = job.std_command();
    super::job::streams(&mut cmd, ends);
    let parent = std::process::id();
    let lifeline: Option<RawFd> = super::lifeline::read_end();
    if let Some(fd) = lifeline {
        cmd.env("VALVE_LIFELINE", fd.to_string());
    }
    let mut report = None;
    let enter = match sandbox.filter(|p| !p.is_empty()) {
        Some(prepared) => {
            let (read, write) =
                rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK)?;
            report = Some(read);
            Some((prepared, write))
        }
        None => None,
    };
    // SAFETY: only async-signal-safe calls (raw prctl, getppid, the
    // sandbox's system calls, capset, write and _exit) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(fd) = lifeline {
                super::lifeline::keep_in_child(fd)?;
            }
            rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
            // The parent may have died between fork and prctl; then nobody would kill us.
            if rustix::process::getppid().map(Pid::as_raw_nonzero).map(|p| p.get() as u32) != Some(parent) {
                return Err(io::Error::other("valve exited while the process started"));
            }
            if let Some((prepared, write)) = &enter {
                if let Err((step, error)) = prepared.enter() {
                    let _ = rustix::io::write(write, &(step as u32).to_le_bytes());
                    return Err(error);
                }
                // Becoming the app's user cleared the death signal (the
                // kernel does on every change of credentials): again.
                rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
                if rustix::process::getppid().map(Pid::as_raw_nonzero).map(|p| p.get() as u32) != Some(parent) {
                    return Err(io::Error::other("valve exited while the process started"));
                }
            }
            if thp_off {
                // Its failure (a kernel before 3.15) leaves huge pages as they were.
                libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
            }
            if let Some(keep) = keep {
                keep.apply()?;
            }
            Ok(())
        });
    }
    Ok((cmd, report))
}

/// The step a child said failed on `report`, by its number in `prepared`.
pub(super) fn failed_step(report: Option<&OwnedFd>, prepared: Option<&Prepared>) -> Option<String> {
    let mut n = [0u8; 4];
    match rustix::io::read(report?, &mut n) {
        Ok(4) => prepared?.step_name(u32::from_le_bytes(n) as usize).map(str::to_string),
        _ => None,
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
    pub(super) async fn spawn(&self, r_bin: &Path, mut cmd: Launchable) -> Result<Child, StartError> {
        let mut pipes = Pipes::for_job(&cmd.job).map_err(StartError::Io)?;
        if let Some(client) = super::privsep::client() {
            let ends = std::mem::take(&mut pipes.child);
            let started = client.start(&mut cmd, ends).await.map_err(|f| match f {
                super::privsep::Failure::Refused(why) => {
                    StartError::Io(io::Error::other(format!("the privileged spawner refused to start it: {why}")))
                }
                super::privsep::Failure::Failed(e, step) => start_error(r_bin, e, step),
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
        Ok((child, own)) => Child::local(child, own, pipes).map_err(StartError::Io),
        Err(error) => match failed_step(report.as_ref(), cmd.sandbox.as_deref()) {
            Some(step) => Err(StartError::Sandbox { step, error }),
            None => Err(StartError::Io(error)),
        },
    }
}
