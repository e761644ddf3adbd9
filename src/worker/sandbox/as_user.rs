//! Acting, on one thread, with the file-system identity of an app's user:
//! valve as root without CAP_SYS_PTRACE (a container's default
//! capabilities) may not open another user's `/proc/PID/root` or read its
//! `smaps_rollup`; that user may.

use std::io;

/// The real uid and gid of process `pid`.
pub fn ids_of(pid: u32) -> io::Result<(u32, u32)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse::<u32>().ok())
            .ok_or_else(|| io::Error::other(format!("no {name} in /proc/{pid}/status")))
    };
    Ok((field("Uid:")?, field("Gid:")?))
}

/// Runs `f` on this thread with the file-system identity of `ids` (uid,
/// gid, no supplementary groups), then gives valve's back. fsuid, fsgid and
/// the groups of a thread are its own (raw system calls, which glibc would
/// otherwise apply to every thread): no other thread is affected, and `f`
/// makes system calls only, so nothing runs meanwhile on this thread.
pub fn as_user<T>(ids: Option<(u32, u32)>, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    let Some((uid, gid)) = ids else { return f() };
    let groups = rustix::process::getgroups()?;
    rustix::thread::set_thread_groups(&[])?;
    // SAFETY: setfsuid and setfsgid take plain numbers and change only this
    // thread; each returns the value it replaced.
    let (old_gid, old_uid) = unsafe { (libc::setfsgid(gid), libc::setfsuid(uid)) };
    let result = f();
    // SAFETY: as above; valve is root, so going back cannot fail.
    let back = unsafe {
        libc::setfsuid(old_uid as u32);
        libc::setfsgid(old_gid as u32);
        libc::setfsuid(u32::MAX) == old_uid
    };
    if !back || rustix::thread::set_thread_groups(&groups).is_err() {
        // Never go on as another user.
        std::process::abort();
    }
    result
}
