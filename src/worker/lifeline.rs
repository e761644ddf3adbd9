//! The lifeline: a pipe whose write end only valve holds and never writes.
//! Every R process valve starts inherits the read end (`VALVE_LIFELINE`);
//! a fork of a warm or preload parent, whose parent is R and not valve,
//! watches it from a thread (`valve_lifeline()` in zygote/enter.c) and dies
//! when it hangs up, which the kernel does when valve ends, however it ends.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;

static LINE: OnceLock<Option<(OwnedFd, OwnedFd)>> = OnceLock::new();

/// The read end's number (the same in every child: children inherit it as is).
pub(super) fn read_end() -> Option<RawFd> {
    LINE.get_or_init(|| rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).ok())
        .as_ref()
        .map(|(read, _)| read.as_raw_fd())
}

/// In the child, between fork and exec: keep the read end across exec.
pub(super) fn keep_in_child(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: `fd` is the read end, open for valve's whole life; fcntl is
    // async-signal-safe and changes only the child's copy of the table.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty())?;
    Ok(())
}
