//! The spawner's socket: a Unix socket pair of `SOCK_SEQPACKET` (one
//! message a packet, never torn or merged), each a JSON object (`Request`
//! from valve's server, `Reply` back, typed and checked as it is parsed:
//! unknown fields refused), descriptors (a process's pipes) beside it as
//! `SCM_RIGHTS`. Nothing else ever crosses it.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;

use rustix::net::{
    recvmsg, sendmsg, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};
use serde::{Deserialize, Serialize};

use super::super::job::{Confine, Job};

/// The largest message either side sends (a job's environment and view).
pub const MAX_MESSAGE: usize = 1 << 20;

/// The most descriptors one message carries (a process's three pipes).
const MAX_FDS: usize = 4;

/// What valve's server asks of the spawner. Each carries an id its reply repeats.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Start `job` (its pipes come back with the reply).
    Start { id: u64, job: Job },
    /// Signal a process the spawner started (or one of theirs).
    Signal { id: u64, pid: u32, group: bool, signal: i32 },
    /// Give an entry valve made in one of its folders to an app's user or group.
    Give { id: u64, path: PathBuf, uid: Option<u32>, gid: Option<u32> },
    /// Give a published version's tree to its app's group.
    GiveTree { id: u64, path: PathBuf, gid: u32 },
    /// A process's private memory (`smaps_rollup`).
    Memory { id: u64, pid: u32 },
    /// Kill every process of a builder's uid.
    KillAll { id: u64, uid: u32 },
    /// Ask the warm parent `parent` to fork worker `worker` of `app`.
    Fork { id: u64, parent: u32, app: String, worker: u64, fifo: PathBuf, env_file: PathBuf, confine: Confine },
}

impl Request {
    pub fn id(&self) -> u64 {
        match self {
            Request::Start { id, .. }
            | Request::Signal { id, .. }
            | Request::Give { id, .. }
            | Request::GiveTree { id, .. }
            | Request::Memory { id, .. }
            | Request::KillAll { id, .. }
            | Request::Fork { id, .. } => *id,
        }
    }
}

/// What the spawner answers, and what it says unasked (a process's exit).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply {
    Done { id: u64 },
    /// Started: its pid; its stdin (if asked), stdout and stderr are the message's descriptors.
    Started { id: u64, pid: u32, stdin: bool },
    /// A sandbox step that failed in the child, by its name.
    Failed { id: u64, step: Option<String>, error: String, not_found: bool },
    Bytes { id: u64, bytes: Option<u64> },
    /// The request was refused, and why (said in the spawner's log too).
    Refused { id: u64, why: String },
    /// A process the spawner started has exited and been reaped: its wait status.
    Exited { pid: u32, status: i32 },
}

/// A connected pair: (valve's server's end, the spawner's end).
pub fn pair() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?)
}

/// Sends `msg` with `fds` beside it: one packet.
pub fn send<T: Serialize>(sock: BorrowedFd<'_>, msg: &T, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let bytes = serde_json::to_vec(msg).map_err(io::Error::other)?;
    if bytes.len() > MAX_MESSAGE {
        return Err(io::Error::other(format!("a message of {} bytes is more than the spawner takes", bytes.len())));
    }
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("too many descriptors for one message"));
    }
    loop {
        match sendmsg(sock, &[IoSlice::new(&bytes)], &mut control, SendFlags::NOSIGNAL) {
            Ok(_) => return Ok(()),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Receives one packet: its bytes and the descriptors beside it; `None` at
/// the end (the other side is gone).
pub fn recv(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Option<(usize, Vec<OwnedFd>)>> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = loop {
        match recvmsg(sock, &mut [IoSliceMut::new(buf)], &mut control, RecvFlags::CMSG_CLOEXEC) {
            Ok(got) => break got,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    let mut fds = Vec::new();
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = msg {
            fds.extend(received);
        }
    }
    if got.bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    if got.flags.contains(rustix::net::ReturnFlags::TRUNC) {
        return Err(io::Error::other("a message longer than the spawner takes"));
    }
    Ok(Some((got.bytes, fds)))
}

/// The fd as a borrowed one (for `send`).
pub fn borrow(fd: &impl AsFd) -> BorrowedFd<'_> {
    fd.as_fd()
}
