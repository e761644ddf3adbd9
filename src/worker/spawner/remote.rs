//! valve's server's side of the privileged spawner: each request a message
//! with an id, its reply matched by that id; a process's exit, said unasked,
//! handed to whoever waits for it. When the spawner goes away (killed, or
//! crashed) every caller gets an error and `gone` fires: valve stops (its
//! processes died with the spawner).

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rustix::process::Signal;
use tokio::io::unix::AsyncFd;
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::super::job::{Confine, Job};
use super::super::process::StartError;
use super::wire::{self, Reply, Request};
use super::Started;

/// A reply and the descriptors that came with it.
type Answer = (Reply, Vec<OwnedFd>);

/// The server's handle on the spawner.
pub struct Remote {
    sock: AsyncFd<OwnedFd>,
    next: AtomicU64,
    waiting: Mutex<HashMap<u64, oneshot::Sender<Answer>>>,
    /// Each live process's exit, by pid.
    exits: Mutex<HashMap<u32, watch::Sender<Option<i32>>>>,
    /// One message written at a time.
    writing: tokio::sync::Mutex<()>,
    /// Fired when the spawner is gone.
    pub gone: CancellationToken,
}

impl Remote {
    /// The handle on the spawner at the other end of `sock`; its reader runs
    /// on the current runtime until the spawner goes.
    pub fn start(sock: OwnedFd) -> io::Result<Arc<Remote>> {
        rustix::io::ioctl_fionbio(&sock, true)?;
        let remote = Arc::new(Remote {
            sock: AsyncFd::new(sock)?,
            next: AtomicU64::new(1),
            waiting: Mutex::new(HashMap::new()),
            exits: Mutex::new(HashMap::new()),
            writing: tokio::sync::Mutex::new(()),
            gone: CancellationToken::new(),
        });
        tokio::spawn(remote.clone().read());
        Ok(remote)
    }

    async fn read(self: Arc<Self>) {
        let mut buf = vec![0u8; wire::MAX_MESSAGE];
        loop {
            let got = loop {
                let mut ready = match self.sock.readable().await {
                    Ok(r) => r,
                    Err(_) => break None,
                };
                match ready.try_io(|fd| wire::recv(fd.get_ref().as_fd(), &mut buf)) {
                    Ok(r) => break r.ok().flatten(),
                    Err(_would_block) => continue,
                }
            };
            let Some((n, fds)) = got else { break };
            let reply: Reply = match serde_json::from_slice(&buf[..n]) {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(error = %e, "the spawner sent a message valve cannot read");
                    continue;
                }
            };
            match reply {
                Reply::Exited { pid, status } => {
                    if let Some(tx) = self.exits.lock().unwrap_or_else(|p| p.into_inner()).remove(&pid) {
                        let _ = tx.send(Some(status));
                    }
                }
                other => {
                    let id = match &other {
                        Reply::Done { id }
                        | Reply::Started { id, .. }
                        | Reply::Failed { id, .. }
                        | Reply::Bytes { id, .. }
                        | Reply::Refused { id, .. } => *id,
                        Reply::Exited { .. } => 0,
                    };
                    if let Reply::Started { pid, .. } = &other {
                        // Before the caller hears of it: its exit cannot come first.
                        let (tx, _) = watch::channel(None);
                        self.exits.lock().unwrap_or_else(|p| p.into_inner()).insert(*pid, tx);
                    }
                    if let Some(tx) = self.waiting.lock().unwrap_or_else(|p| p.into_inner()).remove(&id) {
                        let _ = tx.send((other, fds));
                    }
                }
            }
        }
        tracing::error!("the privileged spawner is gone (killed, or it failed): valve stops; its processes went with it");
        self.waiting.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.exits.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.gone.cancel();
    }

    /// Sends `req` (its id set here) and waits for its reply.
    async fn call(&self, make: impl FnOnce(u64) -> Request) -> io::Result<Answer> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let req = make(id);
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().unwrap_or_else(|p| p.into_inner()).insert(id, tx);
        if self.gone.is_cancelled() {
            return Err(io::Error::other("the privileged spawner is gone"));
        }
        {
            let _one = self.writing.lock().await;
            loop {
                let mut ready = self.sock.writable().await?;
                match ready.try_io(|fd| wire::send(fd.get_ref().as_fd(), &req, &[])) {
                    Ok(r) => {
                        r?;
                        break;
                    }
                    Err(_would_block) => continue,
                }
            }
        }
        rx.await.map_err(|_| io::Error::other("the privileged spawner is gone"))
    }

    /// Sends `text` as it is (a test's: what the spawner must refuse) and
    /// waits for its reply: the reply's text.
    #[cfg(feature = "test-hooks")]
    pub async fn raw(&self, text: &str) -> io::Result<String> {
        let id = serde_json::from_str::<serde_json::Value>(text).ok().and_then(|v| v["id"].as_u64()).unwrap_or(0);
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().unwrap_or_else(|p| p.into_inner()).insert(id, tx);
        {
            let _one = self.writing.lock().await;
            rustix::net::send(self.sock.get_ref(), text.as_bytes(), rustix::net::SendFlags::NOSIGNAL)?;
        }
        let (reply, _) = rx.await.map_err(|_| io::Error::other("the privileged spawner is gone"))?;
        Ok(serde_json::to_string(&reply).unwrap_or_default())
    }

    fn refused(reply: Reply) -> io::Error {
        match reply {
            Reply::Refused { why, .. } => io::Error::new(io::ErrorKind::PermissionDenied, format!("the spawner refused: {why}")),
            Reply::Failed { error, .. } => io::Error::other(error),
            other => io::Error::other(format!("the spawner answered {other:?}")),
        }
    }

    pub(super) async fn start(&self, job: Job) -> Result<Started, StartError> {
        let program = job.program.display().to_string();
        let (reply, mut fds) = self.call(|id| Request::Start { id, job }).await?;
        match reply {
            Reply::Started { pid, stdin, .. } if fds.len() == 2 + usize::from(stdin) => {
                let stdin = stdin.then(|| fds.remove(0));
                let stderr = fds.pop().expect("two descriptors");
                let stdout = fds.pop().expect("two descriptors");
                let exit = self
                    .exits
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&pid)
                    .map(|tx| tx.subscribe())
                    .unwrap_or_else(|| watch::channel(Some(-1)).1);
                Ok(Started { pid, stdin, stdout, stderr, exit })
            }
            Reply::Failed { step: Some(step), error, .. } => Err(StartError::Sandbox { step, error: io::Error::other(error) }),
            Reply::Failed { step: None, error, not_found } => Err(StartError::NoR {
                r_bin: program,
                reason: if not_found {
                    "not found (install R, e.g. `apt-get install r-base-core r-cran-plumber`, or pass --r-bin)".into()
                } else {
                    error
                },
            }),
            other => Err(StartError::Io(Self::refused(other))),
        }
    }

    /// Asks the warm parent `parent` (the spawner's) to fork a worker.
    pub(crate) async fn fork(
        &self,
        parent: u32,
        app: &str,
        worker: u64,
        fifo: &Path,
        env_file: &Path,
        confine: Confine,
    ) -> io::Result<()> {
        let (app, fifo, env_file) = (app.to_string(), fifo.to_path_buf(), env_file.to_path_buf());
        match self.call(|id| Request::Fork { id, parent, app, worker, fifo, env_file, confine }).await?.0 {
            Reply::Done { .. } => Ok(()),
            other => Err(Self::refused(other)),
        }
    }

    pub(super) fn signal(self: &Arc<Self>, pid: u32, group: bool, signal: Signal) {
        let me = self.clone();
        let signal = signal.as_raw();
        tokio::spawn(async move {
            if let Ok((reply @ Reply::Refused { .. }, _)) = me.call(|id| Request::Signal { id, pid, group, signal }).await
            {
                tracing::debug!(pid, ?reply, "the spawner did not signal a process");
            }
        });
    }

    pub(super) async fn give(&self, path: &Path, uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
        let path = path.to_path_buf();
        match self.call(|id| Request::Give { id, path, uid, gid }).await?.0 {
            Reply::Done { .. } => Ok(()),
            other => Err(Self::refused(other)),
        }
    }

    pub(super) async fn give_tree(&self, path: &Path, gid: u32) -> io::Result<()> {
        let path = path.to_path_buf();
        match self.call(|id| Request::GiveTree { id, path, gid }).await?.0 {
            Reply::Done { .. } => Ok(()),
            other => Err(Self::refused(other)),
        }
    }

    pub(super) async fn private_bytes(&self, pid: u32) -> Option<u64> {
        match self.call(|id| Request::Memory { id, pid }).await.ok()?.0 {
            Reply::Bytes { bytes, .. } => bytes,
            _ => None,
        }
    }

    pub(super) async fn kill_all_of(&self, uid: u32) {
        let _ = self.call(|id| Request::KillAll { id, uid }).await;
    }
}
