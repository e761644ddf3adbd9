//! Starting processes from valve's own process: one long-lived thread forks
//! them all (the parent-death signal follows the thread that forked, so
//! never a thread that comes and goes), each entering its sandbox between
//! fork and exec (`Launchable`). The privileged spawner (`root`) starts its
//! processes with the same code.

use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};

use rustix::process::{Pid, Signal};
use tokio::process::{Child, Command};
use tokio::sync::{oneshot, watch};

use super::super::job::{Confine, Job};
use super::super::process::{pid_of, pidfd_open, StartError};
use super::super::reap;
use super::super::sandbox::{safe, Prepared};
use super::Started;

/// A command to start, with what reports which step of entering its
/// sandbox failed (the child can only say a number).
pub(crate) struct Launchable {
    cmd: Command,
    report: Option<(OwnedFd, Arc<Prepared>)>,
}

impl Launchable {
    /// `job` as a command: its program, arguments, whole environment and
    /// working directory; dying with valve (a parent-death signal, the
    /// lifeline) and, between fork and exec, entering `prepared`.
    pub(crate) fn of(job: &Job, prepared: Option<Arc<Prepared>>) -> io::Result<Launchable> {
        let mut cmd = Command::new(&job.program);
        cmd.args(&job.args)
            .env_clear()
            .envs(job.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&job.cwd)
            .stdin(if job.stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut l = Launchable::new(cmd, prepared.filter(|p| !p.is_empty()))?;
        if job.parent_of_forks {
            l = l.parent_of_forks();
        }
        Ok(l)
    }

    fn new(mut cmd: Command, sandbox: Option<Arc<Prepared>>) -> io::Result<Launchable> {
        let parent = std::process::id();
        let lifeline = super::super::lifeline::read_end();
        if let Some(fd) = lifeline {
            cmd.env("VALVE_LIFELINE", fd.to_string());
        }
        let mut report = None;
        let enter = match sandbox {
            Some(prepared) => {
                let (read, write) =
                    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK)?;
                report = Some((read, prepared.clone()));
                Some((prepared, write))
            }
            None => None,
        };
        // SAFETY: only async-signal-safe calls (raw prctl, getppid, the
        // sandbox's system calls, write and _exit) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if let Some(fd) = lifeline {
                    super::super::lifeline::keep_in_child(fd)?;
                }
                rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
                // valve may have died between fork and prctl; then nobody would kill us.
                if rustix::process::getppid().map(Pid::as_raw_nonzero).map(|p| p.get() as u32) != Some(parent) {
                    return Err(io::Error::other("valve exited while the worker started"));
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
                        return Err(io::Error::other("valve exited while the worker started"));
                    }
                }
                Ok(())
            });
        }
        Ok(Launchable { cmd, report })
    }

    /// For an R process valve starts to fork workers from (the warm parent, a
    /// `--preload` parent): no transparent huge pages, for it and its forks
    /// (the kernel keeps the switch across fork and exec). A fork writing
    /// into a huge page it shares with its parent paid for it on its slowest
    /// requests: with huge pages a warm parent's fork had a p99 2-3 % over a
    /// fresh R's on bench/packages' c., without them within 1 %.
    fn parent_of_forks(mut self) -> Launchable {
        // SAFETY: one raw prctl between fork and exec. Its failure (a kernel
        // before 3.15) leaves huge pages as they were.
        unsafe {
            self.cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
                Ok(())
            });
        }
        self
    }

    /// The step that failed in the child, if one did.
    fn failed_step(&self) -> Option<String> {
        let (read, prepared) = self.report.as_ref()?;
        let mut n = [0u8; 4];
        match rustix::io::read(read, &mut n) {
            Ok(4) => prepared.step_name(u32::from_le_bytes(n) as usize).map(str::to_string),
            _ => None,
        }
    }
}

/// The steps of `confine`, made once and kept (a generation's workers all
/// share them), a bounded number of them.
pub(crate) fn prepared(confine: &Confine) -> io::Result<Arc<Prepared>> {
    static KEPT: Mutex<Option<HashMap<Confine, Arc<Prepared>>>> = Mutex::new(None);
    if let Some(p) = KEPT.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(HashMap::new).get(confine) {
        return Ok(p.clone());
    }
    let p = Arc::new(Prepared::of(confine)?);
    let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    let kept = kept.get_or_insert_with(HashMap::new);
    if kept.len() >= 512 {
        kept.clear();
    }
    kept.insert(confine.clone(), p.clone());
    Ok(p)
}

/// A command for the spawner thread, the runtime its child belongs to, and
/// where to send the child.
type SpawnJob = (Launchable, tokio::runtime::Handle, oneshot::Sender<(Launchable, io::Result<(Child, reap::Own)>)>);

/// Starts processes from one long-lived thread. Linux delivers the parent-death
/// signal when the *thread* that forked a child exits, so children must not be
/// forked from threads that come and go (tokio's blocking pool). One thread
/// serves the whole process, every app and generation alike.
#[derive(Clone, Debug)]
pub struct Local {
    jobs: std::sync::mpsc::Sender<SpawnJob>,
}

impl Local {
    /// The process's spawner thread (started the first time).
    pub(super) fn shared() -> io::Result<Self> {
        static SHARED: OnceLock<Local> = OnceLock::new();
        if let Some(s) = SHARED.get() {
            return Ok(s.clone());
        }
        let (jobs, rx) = std::sync::mpsc::channel::<SpawnJob>();
        std::thread::Builder::new().name("valve-spawner".into()).spawn(move || {
            for (mut cmd, runtime, reply) in rx {
                // The child is watched by the runtime of whoever asked (tests run several).
                let _runtime = runtime.enter();
                let spawned = reap::spawn(&mut cmd.cmd);
                let _ = reply.send((cmd, spawned));
            }
        })?;
        Ok(SHARED.get_or_init(|| Local { jobs }).clone())
    }

    /// Starts `job` (its sandbox's steps made now, or taken from those made before).
    pub(super) async fn start(&self, job: Job) -> Result<Started, StartError> {
        let prepared = job.confine.as_ref().map(prepared).transpose()?;
        let cmd = Launchable::of(&job, prepared)?;
        self.launch(&job.program, cmd).await
    }

    /// Starts `cmd`: its pipes, and a task that reaps it (killing what is
    /// left of its process group first) and says how it ended.
    pub(crate) async fn launch(&self, program: &Path, cmd: Launchable) -> Result<Started, StartError> {
        let (tx, rx) = oneshot::channel();
        let gone = || StartError::Io(io::Error::other("spawner thread is gone"));
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| StartError::Io(io::Error::other(e)))?;
        self.jobs.send((cmd, runtime, tx)).map_err(|_| gone())?;
        let (cmd, spawned) = rx.await.map_err(|_| gone())?;
        if let (Err(error), Some(step)) = (&spawned, cmd.failed_step()) {
            return Err(StartError::Sandbox { step, error: io::Error::new(error.kind(), error.to_string()) });
        }
        let (mut child, own) = spawned.map_err(|e| StartError::NoR {
            r_bin: program.display().to_string(),
            reason: match e.kind() {
                io::ErrorKind::NotFound => {
                    "not found (install R, e.g. `apt-get install r-base-core r-cran-plumber`, or pass --r-bin)".into()
                }
                io::ErrorKind::PermissionDenied => "permission denied (is it executable?)".into(),
                _ => e.to_string(),
            },
        })?;
        let pid = child.id().ok_or_else(|| io::Error::other("the process exited at once"))?;
        let stdin = child.stdin.take().map(|s| s.into_owned_fd()).transpose()?;
        let stdout = child.stdout.take().ok_or_else(|| io::Error::other("no stdout"))?.into_owned_fd()?;
        let stderr = child.stderr.take().ok_or_else(|| io::Error::other("no stderr"))?.into_owned_fd()?;
        let (exit_tx, exit) = watch::channel(None);
        let pidfd = pidfd_open(pid)?;
        tokio::spawn(async move {
            // Readable once it is a zombie: not reaped yet, so the process
            // group it leads cannot have been taken by anyone else. Anything
            // it started in its group goes with it.
            let _ = pidfd.readable().await;
            let _ = rustix::process::kill_process_group(pid_of(pid), Signal::KILL);
            let status = child.wait().await.ok().map(|s| std::os::unix::process::ExitStatusExt::into_raw(s));
            drop(own);
            let _ = exit_tx.send(Some(status.unwrap_or(-1)));
        });
        Ok(Started { pid, stdin, stdout, stderr, exit })
    }
}

/// A signal to `pid` (and its group): valve may send it (its own child, or valve is root).
pub(super) fn signal(pid: u32, group: bool, signal: Signal) {
    let _ = if group {
        rustix::process::kill_process_group(pid_of(pid), signal)
    } else {
        rustix::process::kill_process(pid_of(pid), signal)
    };
}

/// Gives `path` to `uid`/`gid` through its own handle (no link followed).
pub(super) fn give(path: &Path, uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
    if uid.is_none() && gid.is_none() {
        return Ok(());
    }
    let (dir, name) = split(path)?;
    let parent = safe::open_dir(dir)?;
    safe::give_entry(&parent, name, uid, gid)
}

/// Gives the tree at `path` to group `gid` (a published version).
pub(super) fn give_tree(path: &Path, gid: u32) -> io::Result<()> {
    safe::give_tree(&safe::open_dir(path)?, gid, 0)
}

/// Kills every process of `uid` until none is left.
pub(super) fn kill_all_of(uid: u32) {
    for _ in 0..10 {
        let mut found = false;
        let Ok(procs) = std::fs::read_dir("/proc") else { return };
        for p in procs.flatten() {
            let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            if super::super::sandbox::ids_of(pid).is_ok_and(|(u, _)| u == uid) {
                found = true;
                let _ = rustix::process::kill_process(pid_of(pid), Signal::KILL);
            }
        }
        if !found {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A path's folder and its last name.
pub(super) fn split(path: &Path) -> io::Result<(&Path, &str)> {
    match (path.parent(), path.file_name().and_then(|n| n.to_str())) {
        (Some(dir), Some(name)) => Ok((dir, name)),
        _ => Err(io::Error::other(format!("{}: not a path to an entry", path.display()))),
    }
}
