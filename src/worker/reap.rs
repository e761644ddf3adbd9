//! Orphans: valve makes itself a child subreaper, so processes its workers
//! leave behind (the forks of a preload parent that died, anything R
//! daemonized) become valve's children instead of the init process's, and
//! valve reaps them when they exit. As PID 1 of a container, where every
//! orphan comes to valve anyway, the same loop keeps the container free of
//! zombies without tini.
//!
//! valve's own children (plain workers, preload parents) are reaped by tokio,
//! which must read their exit status itself: the reaper leaves alone every pid
//! valve spawned. A pid is recorded under the same lock as its `spawn`, so the
//! reaper can never see a child of valve's that is not yet recorded.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use rustix::process::{Pid, WaitOptions};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

/// The pids valve spawned itself and tokio waits for.
static OWN: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

/// How often the reaper looks even without a SIGCHLD: signals coalesce, and a
/// pid valve still records may have been reused by an orphan.
const LOOK_EVERY: Duration = Duration::from_secs(5);

fn own() -> std::sync::MutexGuard<'static, BTreeSet<u32>> {
    OWN.lock().unwrap_or_else(|p| p.into_inner())
}

/// One of valve's own children, left to tokio to reap until this is dropped.
#[derive(Debug)]
pub(super) struct Own(u32);

impl Drop for Own {
    fn drop(&mut self) {
        own().remove(&self.0);
    }
}

/// Spawns `cmd` and records its pid before the reaper can look again.
pub(super) fn spawn(cmd: &mut Command) -> std::io::Result<(Child, Own)> {
    let mut own = own();
    let child = cmd.spawn()?;
    let pid = child.id().unwrap_or(0);
    own.insert(pid);
    Ok((child, Own(pid)))
}

/// Makes valve a child subreaper and reaps, until the returned task is
/// aborted, every child that exits and is not one valve spawned.
pub fn start() -> tokio::task::JoinHandle<()> {
    let me = std::process::id();
    if me != 1 {
        if let Err(error) = rustix::process::set_child_subreaper(Some(Pid::from_raw(me as i32).unwrap_or(Pid::INIT))) {
            tracing::warn!(%error, "cannot become a child subreaper: orphaned forks go to the init process");
        }
    }
    let mut chld = signal(SignalKind::child()).ok();
    tokio::spawn(async move {
        loop {
            match &mut chld {
                Some(s) => {
                    let _ = tokio::time::timeout(LOOK_EVERY, s.recv()).await;
                }
                None => tokio::time::sleep(LOOK_EVERY).await,
            }
            // It reads /proc: off the runtime's threads.
            let _ = tokio::task::spawn_blocking(reap_orphans).await;
        }
    })
}

/// Reaps every exited child of valve's that valve did not spawn.
fn reap_orphans() {
    let children = children();
    let own = own();
    for pid in children.into_iter().filter(|p| !own.contains(p)) {
        let Some(p) = Pid::from_raw(pid as i32) else { continue };
        // Never blocks, and leaves a child that still runs alone.
        if let Ok(Some((_, status))) = rustix::process::waitpid(Some(p), WaitOptions::NOHANG) {
            let status = match (status.exit_status(), status.terminating_signal()) {
                (Some(code), _) => format!("exit code {code}"),
                (None, Some(sig)) => format!("killed by signal {sig}"),
                _ => "gone".into(),
            };
            tracing::debug!(pid, status, "reaped an orphan");
        }
    }
}

/// valve's children, zombies included: each thread's `children` list, or a
/// scan of /proc by parent pid where the kernel has no such lists.
fn children() -> Vec<u32> {
    let mut out = Vec::new();
    let mut listed = false;
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for task in tasks.flatten() {
            if let Ok(list) = std::fs::read_to_string(task.path().join("children")) {
                listed = true;
                out.extend(list.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
            }
        }
    }
    if !listed {
        let me = std::process::id();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
            // After the command name: state, then the parent's pid.
            let ppid = stat.rsplit(')').next().and_then(|s| s.split_whitespace().nth(1)?.parse::<u32>().ok());
            if ppid == Some(me) {
                out.push(pid);
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}
