//! What to start, as a plain value: the program, its arguments and
//! environment, its working directory and which of its standard streams are
//! pipes to valve. Started by valve itself (`local`) or, as root, sent to the
//! privileged spawner (`privsep`), which checks it and starts it the same way.

use std::ffi::OsStr;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// One standard stream of a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Io {
    /// A pipe to valve (`Child::stdin`, `stdout`, `stderr`).
    Piped,
    /// /dev/null.
    Null,
}

/// A process to start (every one valve starts leads its own process group
/// and is killed when its `Child` is dropped before it exited).
#[derive(Clone, Debug)]
pub(super) struct Job {
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Set on top of what it inherits (nothing of valve's when `clear_env`).
    pub env: Vec<(String, String)>,
    pub clear_env: bool,
    pub cwd: Option<PathBuf>,
    /// stdin, stdout, stderr.
    pub stdio: [Io; 3],
}

impl Job {
    pub fn new(program: impl AsRef<Path>) -> Job {
        Job {
            program: program.as_ref().to_path_buf(),
            args: Vec::new(),
            env: Vec::new(),
            clear_env: false,
            cwd: None,
            stdio: [Io::Null, Io::Piped, Io::Piped],
        }
    }

    pub fn arg(&mut self, arg: impl AsRef<OsStr>) -> &mut Job {
        self.args.push(arg.as_ref().to_string_lossy().into_owned());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(&mut self, args: I) -> &mut Job {
        for a in args {
            self.arg(a);
        }
        self
    }

    pub fn env(&mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> &mut Job {
        let key = key.as_ref().to_string_lossy().into_owned();
        self.env.retain(|(k, _)| *k != key);
        self.env.push((key, value.as_ref().to_string_lossy().into_owned()));
        self
    }

    pub fn envs<I, K, V>(&mut self, vars: I) -> &mut Job
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        for (k, v) in vars {
            self.env(k, v);
        }
        self
    }

    /// Nothing of valve's own environment: only what `env` sets.
    pub fn env_clear(&mut self) -> &mut Job {
        self.clear_env = true;
        self.env.clear();
        self
    }

    pub fn current_dir(&mut self, dir: impl AsRef<Path>) -> &mut Job {
        self.cwd = Some(dir.as_ref().to_path_buf());
        self
    }

    pub fn stdin(&mut self, io: Io) -> &mut Job {
        self.stdio[0] = io;
        self
    }

    pub fn stdout(&mut self, io: Io) -> &mut Job {
        self.stdio[1] = io;
        self
    }

    pub fn stderr(&mut self, io: Io) -> &mut Job {
        self.stdio[2] = io;
        self
    }

    /// The std command for this job (without its streams: `streams`).
    pub fn std_command(&self) -> std::process::Command {
        let mut cmd = std::process::Command::new(&self.program);
        if self.clear_env {
            cmd.env_clear();
        }
        cmd.args(&self.args).envs(self.env.iter().map(|(k, v)| (k, v)));
        if let Some(dir) = &self.cwd {
            cmd.current_dir(dir);
        }
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        cmd
    }
}

/// The pipes of a job's streams: the child's ends (given to it, in order,
/// only for the piped ones) and valve's.
pub(super) struct Pipes {
    pub child: [Option<OwnedFd>; 3],
    pub stdin: Option<OwnedFd>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
}

impl Pipes {
    pub fn for_job(job: &Job) -> io::Result<Pipes> {
        let mut pipes = Pipes { child: [None, None, None], stdin: None, stdout: None, stderr: None };
        for (n, io) in job.stdio.iter().enumerate() {
            if *io != Io::Piped {
                continue;
            }
            let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
            if n == 0 {
                pipes.child[0] = Some(read);
                pipes.stdin = Some(write);
            } else {
                pipes.child[n] = Some(write);
                if n == 1 {
                    pipes.stdout = Some(read);
                } else {
                    pipes.stderr = Some(read);
                }
            }
        }
        Ok(pipes)
    }
}

/// Gives `cmd` the child's ends of its streams, /dev/null for the others.
pub(super) fn streams(cmd: &mut std::process::Command, ends: [Option<OwnedFd>; 3]) {
    let [i, o, e] = ends;
    let io = |fd: Option<OwnedFd>| fd.map(Stdio::from).unwrap_or_else(Stdio::null);
    cmd.stdin(io(i)).stdout(io(o)).stderr(io(e));
}
