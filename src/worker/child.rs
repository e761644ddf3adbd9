//! A process valve started, wherever it was started: by valve itself (its
//! own child, reaped by tokio) or by the privileged spawner (the spawner's
//! child: its exit comes as a message, signals go as requests). Either way
//! it leads its own process group, its streams are pipes valve holds, and
//! dropping it before it exited kills it.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Output};

use rustix::process::Signal;
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;

use super::process::pid_of;

/// The write end of a child's stdin.
pub(super) type ChildStdin = pipe::Sender;
/// The read end of a child's stdout or stderr.
pub(super) type ChildOut = pipe::Receiver;

pub(super) struct Child {
    pid: u32,
    pub stdin: Option<ChildStdin>,
    pub stdout: Option<ChildOut>,
    pub stderr: Option<ChildOut>,
    how: How,
    exit: Option<ExitStatus>,
    /// Kill what is left of its group when it exits.
    group_dies: bool,
}

enum How {
    Local { child: tokio::process::Child, pidfd: tokio::io::unix::AsyncFd<OwnedFd>, _own: super::reap::Own },
    Remote(super::privsep::client::Started),
}

fn sender(fd: Option<OwnedFd>) -> io::Result<Option<ChildStdin>> {
    fd.map(pipe::Sender::from_owned_fd).transpose()
}

fn receiver(fd: Option<OwnedFd>) -> io::Result<Option<ChildOut>> {
    fd.map(pipe::Receiver::from_owned_fd).transpose()
}

impl Child {
    pub(super) fn local(
        child: tokio::process::Child,
        own: super::reap::Own,
        pipes: super::job::Pipes,
        group_dies: bool,
    ) -> io::Result<Child> {
        let pid = child.id().ok_or_else(|| io::Error::other("the process exited at once"))?;
        let pidfd = super::process::pidfd_open(pid)?;
        Ok(Child {
            pid,
            stdin: sender(pipes.stdin)?,
            stdout: receiver(pipes.stdout)?,
            stderr: receiver(pipes.stderr)?,
            how: How::Local { child, pidfd, _own: own },
            exit: None,
            group_dies,
        })
    }

    pub(super) fn remote(started: super::privsep::client::Started, pipes: super::job::Pipes) -> io::Result<Child> {
        Ok(Child {
            pid: started.pid(),
            stdin: sender(pipes.stdin)?,
            stdout: receiver(pipes.stdout)?,
            stderr: receiver(pipes.stderr)?,
            how: How::Remote(started),
            exit: None,
            group_dies: false,
        })
    }

    pub(super) fn id(&self) -> Option<u32> {
        Some(self.pid)
    }

    /// Waits for it to exit; then, if its group dies with it, kills what is
    /// left of its process group (while it is a zombie, not reaped, its pid
    /// and group cannot have been taken), and reaps it.
    pub(super) async fn wait(&mut self) -> io::Result<ExitStatus> {
        if let Some(status) = self.exit {
            return Ok(status);
        }
        let status = match &mut self.how {
            How::Local { child, pidfd, .. } => {
                let _ = pidfd.readable().await;
                if self.group_dies {
                    let _ = rustix::process::kill_process_group(pid_of(self.pid), Signal::KILL);
                }
                child.wait().await?
            }
            // The spawner kills the group (if it dies with it) before it reaps.
            How::Remote(started) => ExitStatus::from_raw(started.exited().await),
        };
        self.exit = Some(status);
        Ok(status)
    }

    /// Signals its whole process group (nothing once it has exited).
    pub(super) fn signal_group(&self, sig: Signal) {
        if self.exit.is_some() {
            return;
        }
        match &self.how {
            How::Local { .. } => {
                let _ = rustix::process::kill_process_group(pid_of(self.pid), sig);
            }
            How::Remote(started) => started.signal(sig),
        }
    }

    /// Reads its stdout and stderr to their ends while waiting for its exit.
    pub(super) async fn wait_with_output(mut self) -> io::Result<Output> {
        async fn all(out: Option<ChildOut>) -> Vec<u8> {
            let mut buf = Vec::new();
            if let Some(mut out) = out {
                let _ = out.read_to_end(&mut buf).await;
            }
            buf
        }
        drop(self.stdin.take());
        let (stdout, stderr) = (self.stdout.take(), self.stderr.take());
        let (stdout, stderr, status) = tokio::join!(all(stdout), all(stderr), self.wait());
        Ok(Output { status: status?, stdout, stderr })
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.exit.is_some() {
            return;
        }
        // Its whole group (not reaped: the pid and group are still its).
        match &self.how {
            How::Local { .. } => {
                let _ = rustix::process::kill_process_group(pid_of(self.pid), Signal::KILL);
            }
            How::Remote(started) => started.kill_if_running(),
        }
    }
}
