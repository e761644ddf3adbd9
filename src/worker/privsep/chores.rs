//! Chores: what valve's server asks the privileged spawner to do for it
//! and waits for, on a socket pair of their own beside the one for jobs:
//! one request, then its answer, one caller at a time. Each chore is a
//! small typed value the spawner checks (`errands`) before doing anything;
//! without a spawner (valve is not root) there is nobody to ask, and the
//! caller does the chore itself, with the rights it has.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::{Mutex, OnceLock};

use serde::{Deserialize, Serialize};

use super::wire;

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case", tag = "chore")]
pub enum Chore {
    /// Kill every process whose real uid is `uid`, one of the package
    /// builders' uids (what a build left running never sees the next one).
    KillUid { uid: u32 },
    /// The private memory of a process below the spawner (a warm parent's
    /// fork), from `/proc/PID/smaps_rollup`, which only its own user or a
    /// tracer may read.
    Memory { pid: u32 },
}

#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case", tag = "said")]
pub enum Done {
    Done,
    /// Its private bytes (`None`: the process is gone, or not readable).
    Memory {
        bytes: Option<u64>,
    },
    /// The chore broke a rule; nothing was done.
    Refused {
        why: String,
    },
}

/// valve's server's end, once the spawner is forked.
static SOCK: OnceLock<Mutex<OwnedFd>> = OnceLock::new();

pub(super) fn keep(sock: OwnedFd) {
    let _ = SOCK.set(Mutex::new(sock));
}

/// Asks the privileged spawner to do `chore`, and waits for its answer
/// (a chore is short: a scan of `/proc`, a few system calls). `None`:
/// there is no spawner, and the caller does the chore itself.
pub fn ask(chore: &Chore) -> Option<io::Result<Done>> {
    let sock = SOCK.get()?.lock().unwrap_or_else(|p| p.into_inner());
    let answer = (|| {
        wire::send(&*sock, chore, &[])?;
        let bytes = wire::recv(&*sock)?.bytes.ok_or_else(|| io::Error::other("the privileged spawner is gone"))?;
        match serde_json::from_slice::<Done>(&bytes).map_err(io::Error::other)? {
            Done::Refused { why } => {
                Err(io::Error::new(io::ErrorKind::PermissionDenied, format!("the privileged spawner refused: {why}")))
            }
            done => Ok(done),
        }
    })();
    Some(answer)
}
