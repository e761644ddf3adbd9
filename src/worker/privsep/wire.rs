//! What valve's server and the privileged spawner say to each other: one
//! JSON value per message of a `SOCK_SEQPACKET` socket pair (a message is
//! read whole or not at all), at most `MAX_MESSAGE` bytes, file descriptors
//! (a job's pipes) beside it. Every field is named, none is optional that
//! is not said to be, and an unknown one is an error: the spawner reads
//! exactly these types or refuses the message.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags,
};
use serde::{Deserialize, Serialize};

pub use crate::worker::sandbox::SandboxSpec as Sandbox;

/// The largest message either side sends or reads.
pub const MAX_MESSAGE: usize = 256 * 1024;

/// The most descriptors one message carries (a job's three streams).
pub const MAX_FDS: usize = 3;

/// What the process is, which decides what it may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// An app's R (a worker, its render, its package check): as its user.
    App,
    /// A package builder: as one of the builders' uids.
    Builder,
    /// The warm parent: root, keeping only what forking into users needs.
    WarmParent,
    /// valve's question to R about itself (`rtools`), as an app's user would.
    Probe,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case", tag = "ask")]
pub enum Request {
    /// Start a job; its piped streams come as descriptors, stdin first.
    Start(Box<Start>),
    /// Signal a process this spawner started and has not reaped.
    Signal { id: u64, sig: i32, group: bool },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Start {
    /// valve's number for it: the replies about it carry it.
    pub id: u64,
    pub kind: Kind,
    /// The app it is for (`Kind::App`).
    pub app: Option<String>,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub clear_env: bool,
    pub cwd: Option<PathBuf>,
    /// Which of stdin, stdout and stderr come as descriptors.
    pub piped: [bool; 3],
    /// Without transparent huge pages (a parent of forks).
    pub thp_off: bool,
    /// When it exits, what is left of its process group is killed (a
    /// worker's `system()` children; not a parent's forks, which serve on).
    pub group_dies: bool,
    /// The capabilities a process started as root keeps (a mask).
    pub keep: Option<u64>,
    pub sandbox: Option<Sandbox>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case", tag = "said")]
pub enum Reply {
    Started {
        id: u64,
        pid: u32,
    },
    /// The request broke a rule; nothing was started or changed.
    Refused {
        id: Option<u64>,
        why: String,
    },
    /// It was allowed but did not start: the sandbox's step that failed, if one did.
    Failed {
        id: u64,
        step: Option<String>,
        not_found: bool,
        denied: bool,
        error: String,
    },
    /// Its raw wait status.
    Exited {
        id: u64,
        status: i32,
    },
}

/// Sends `value` with `fds` as one message (blocking or not, as `sock` is).
pub fn send(sock: impl AsFd, value: &impl Serialize, fds: &[OwnedFd]) -> io::Result<()> {
    let bytes = serde_json::to_vec(value).map_err(io::Error::other)?;
    if bytes.len() > MAX_MESSAGE {
        return Err(io::Error::other(format!("a message of {} bytes, over {MAX_MESSAGE}", bytes.len())));
    }
    let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !borrowed.is_empty() && !control.push(SendAncillaryMessage::ScmRights(&borrowed)) {
        return Err(io::Error::other("too many descriptors for one message"));
    }
    let sent = sendmsg(sock, &[io::IoSlice::new(&bytes)], &mut control, SendFlags::NOSIGNAL)?;
    if sent != bytes.len() {
        return Err(io::Error::other("a message was cut"));
    }
    Ok(())
}

/// What one message held: its bytes (`None`: the other side is gone) and
/// the descriptors that came with it (closed on exec).
pub struct Received {
    pub bytes: Option<Vec<u8>>,
    pub fds: Vec<OwnedFd>,
    /// Cut to `MAX_MESSAGE`, or with more descriptors than fit.
    pub truncated: bool,
}

pub fn recv(sock: impl AsFd) -> io::Result<Received> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = recvmsg(&sock, &mut [io::IoSliceMut::new(&mut buf)], &mut control, RecvFlags::CMSG_CLOEXEC)?;
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = message {
            fds.extend(rights);
        }
    }
    let truncated =
        got.flags.contains(rustix::net::ReturnFlags::TRUNC) || got.flags.contains(rustix::net::ReturnFlags::CTRUNC);
    if got.bytes == 0 && fds.is_empty() {
        return Ok(Received { bytes: None, fds, truncated });
    }
    buf.truncate(got.bytes);
    Ok(Received { bytes: Some(buf), fds, truncated })
}
