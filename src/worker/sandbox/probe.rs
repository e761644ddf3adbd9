//! What the kernel lets this valve do, measured before the configuration
//! is read: whether a child can become another user and whether it can have
//! a mount namespace of its own (root in a container often cannot: no
//! CAP_SYS_ADMIN, or a seccomp filter), each tried in a short-lived child;
//! and which Landlock ABI the kernel offers (asked of the kernel).

use std::io;
use std::process::{Command, Stdio};

use rustix::fs::{Gid, Uid};
use std::os::unix::process::CommandExt;

use crate::config::Kernel;

/// Measures what valve may do; `try_uid` is a uid to try switching to.
pub fn probe(try_uid: u32) -> Kernel {
    let uid = rustix::process::geteuid().as_raw();
    let gid = rustix::process::getegid().as_raw();
    let landlock = super::landlock::abi();
    if uid != 0 {
        return Kernel { uid, gid, switch_users: false, mount_namespaces: false, landlock };
    }
    let switch_users = child_can(move || {
        rustix::thread::set_thread_groups(&[Gid::from_raw(try_uid)])?;
        rustix::thread::set_thread_res_gid(Gid::from_raw(try_uid), Gid::from_raw(try_uid), Gid::from_raw(try_uid))?;
        rustix::thread::set_thread_res_uid(Uid::from_raw(try_uid), Uid::from_raw(try_uid), Uid::from_raw(try_uid))?;
        Ok(())
    });
    let mount_namespaces = child_can(|| {
        // SAFETY: the forked child is single-threaded.
        unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS) }?;
        rustix::mount::mount_change(
            c"/",
            rustix::mount::MountPropagationFlags::DOWNSTREAM | rustix::mount::MountPropagationFlags::REC,
        )?;
        rustix::mount::mount(c"tmpfs", c"/tmp", c"tmpfs", rustix::mount::MountFlags::empty(), Some(c"size=4k"))?;
        let tree = rustix::mount::open_tree(
            rustix::fs::CWD,
            c"/tmp",
            rustix::mount::OpenTreeFlags::OPEN_TREE_CLONE | rustix::mount::OpenTreeFlags::OPEN_TREE_CLOEXEC,
        )?;
        drop(tree);
        Ok(())
    });
    Kernel { uid, gid, switch_users, mount_namespaces, landlock }
}

/// Whether `step` succeeds in a forked child (which then runs valve's own
/// `--version`, quietly: any program would do, this one surely exists).
fn child_can(step: impl Fn() -> rustix::io::Result<()> + Send + Sync + 'static) -> bool {
    // By /proc/self/exe, not by path: an app's user (the child after
    // `switch_users`) may not pass valve's folder (under /root, /tmp/...).
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg("--version").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    // SAFETY: `step` makes system calls only.
    unsafe {
        cmd.pre_exec(move || step().map_err(io::Error::from));
    }
    match cmd.spawn() {
        Ok(mut child) => child.wait().is_ok_and(|s| s.success()),
        Err(_) => false,
    }
}

/// No process of valve's own user may read valve's memory or environment
/// or trace it (`/proc/PID/mem`, `environ`: with apps sharing valve's user,
/// the only guard of valve's keys). Children that exec are dumpable again.
pub fn guard_valve() {
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
}
