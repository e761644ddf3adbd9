//! Between fork and exec: the one command that carries out a job's steps
//! (its streams, the lifeline, the parent-death signal, the sandbox, no huge
//! pages, the capabilities it keeps), the same in valve and in the
//! privileged spawner, and which sandbox step a child said failed.

use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::sync::Arc;

use rustix::process::{Pid, Signal};

use super::caps::Keep;
use super::job::Job;
use super::sandbox::Prepared;

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
            // What the privileged spawner ignores, the child does not (an
            // ignored signal stays ignored across exec).
            for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT] {
                libc::signal(sig, libc::SIG_DFL);
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
