//! Who starts, signals and owns valve's processes. Every process valve
//! starts is a `Job` (plain data) handed to the one `Spawner`:
//!
//! - `Local`: valve's own thread starts it (valve cannot switch users: it
//!   runs as one user, each app under a Landlock ruleset of its own);
//! - `Remote`: valve as root forks a small privileged spawner at start
//!   (`root`), then its server drops to valve's own user; the spawner keeps
//!   root, takes requests over a socket pair only (`wire`), checks each
//!   (`checks`: a uid of an app's, never root's or valve's; paths inside
//!   valve's own folders), starts, signals and gives folders to apps' users,
//!   and parses nothing an app or a publisher wrote. The server's side of it
//!   is `remote`.
//!
//! A started process's stdin, stdout and stderr come back as descriptors,
//! its exit as a value (`Started`); the spawner that started it reaps it,
//! killing what is left of its process group first.

mod checks;
mod local;
pub(crate) mod remote;
pub(crate) mod root;
mod wire;

use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use rustix::process::Signal;
use tokio::sync::watch;

use super::job::Job;
use super::process::StartError;
pub use checks::Known;
pub use remote::Remote;
pub use root::Start as RootStart;

/// A process just started: its pid, its pipes, and how it ends.
pub struct Started {
    pub pid: u32,
    pub stdin: Option<OwnedFd>,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// Its wait status once it has exited (and been reaped).
    pub exit: watch::Receiver<Option<i32>>,
}

impl Started {
    /// Waits for its exit: its raw wait status (`None`: the spawner went away first).
    pub async fn wait(&mut self) -> Option<i32> {
        match self.exit.wait_for(Option::is_some).await {
            Ok(s) => *s,
            Err(_) => None,
        }
    }
}

/// valve's one spawner.
#[derive(Clone)]
pub enum Spawner {
    Local(local::Local),
    Remote(Arc<Remote>),
}

static SPAWNER: OnceLock<Spawner> = OnceLock::new();

/// Makes `remote` the spawner of this process (valve as root, once its
/// server has dropped to valve's user). Before any process is started.
pub fn use_remote(remote: Arc<Remote>) {
    let _ = SPAWNER.set(Spawner::Remote(remote));
}

/// The spawner of this process: the privileged spawner's handle if valve
/// started one, else valve's own thread.
pub fn spawner() -> io::Result<Spawner> {
    if let Some(s) = SPAWNER.get() {
        return Ok(s.clone());
    }
    let local = Spawner::Local(local::Local::shared()?);
    Ok(SPAWNER.get_or_init(|| local).clone())
}

impl Spawner {
    /// Starts `job`.
    pub async fn start(&self, job: Job) -> Result<Started, StartError> {
        match self {
            Spawner::Local(l) => l.start(job).await,
            Spawner::Remote(r) => r.start(job).await,
        }
    }

    /// Sends `signal` to `pid`, one of valve's processes (`group`: and its
    /// process group, which it leads). Never waits.
    pub fn signal(&self, pid: u32, group: bool, signal: Signal) {
        match self {
            Spawner::Local(_) => local::signal(pid, group, signal),
            Spawner::Remote(r) => r.signal(pid, group, signal),
        }
    }

    /// Gives `path` (a folder or file valve made in one of its folders) to
    /// `uid` and/or group `gid`, through handles, following no link.
    pub async fn give(&self, path: &Path, uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
        match self {
            Spawner::Local(_) => local::give(path, uid, gid),
            Spawner::Remote(r) => r.give(path, uid, gid).await,
        }
    }

    /// Gives the unpacked version at `path` to group `gid`: its folders 01770, its files 0640 (0750).
    pub async fn give_tree(&self, path: &Path, gid: u32) -> io::Result<()> {
        match self {
            Spawner::Local(_) => local::give_tree(path, gid),
            Spawner::Remote(r) => r.give_tree(path, gid).await,
        }
    }

    /// The private memory of process `pid` (a fork: what it does not share).
    pub async fn private_bytes(&self, pid: u32) -> Option<u64> {
        match self {
            Spawner::Local(_) => super::process::private_bytes(pid),
            Spawner::Remote(r) => r.private_bytes(pid).await,
        }
    }

    /// Kills every process of builder uid `uid` (a build's leftovers).
    pub async fn kill_all_of(&self, uid: u32) {
        match self {
            Spawner::Local(_) => local::kill_all_of(uid),
            Spawner::Remote(r) => r.kill_all_of(uid).await,
        }
    }

    /// Whether processes of other users are started (and so given folders, signalled) through a privileged spawner.
    pub fn is_remote(&self) -> bool {
        matches!(self, Spawner::Remote(_))
    }
}
