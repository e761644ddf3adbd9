//! The privileged spawner's loop: one thread, blocking, root. It reads one
//! request at a time from valve's server, checks it (`check`), starts what
//! is allowed (`exec::command`, the steps valve itself would take),
//! signals only what it started and has not reaped, reaps its children
//! (and, as a subreaper, the orphans below them) and says each exit. When
//! the server's end closes, it kills every process group it started and
//! exits. It opens no file a request names, reads no bundle or app file and
//! speaks no HTTP.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use rustix::event::{poll, PollFd, PollFlags};
use rustix::process::{Pid, PidfdFlags, Signal, WaitOptions};

use super::check::{Rules, SIGNALS};
use super::say::say;
use super::wire::{self, Reply, Request, Start};
use crate::worker::caps::Keep;
use crate::worker::exec::{command, failed_step};
use crate::worker::job::{Io, Job};
use crate::worker::sandbox::Prepared;

/// The signals the spawner ignores (and its children do not).
const HELD: [i32; 4] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT];

/// A process this spawner started, until it is reaped.
struct Kid {
    pid: u32,
    pidfd: OwnedFd,
    group_dies: bool,
}

/// Serves valve's server on `sock` until it hangs up. `known`: the app uid
/// table's uid for a name, read again for each app the settings do not name.
pub(super) fn serve(sock: OwnedFd, chores: OwnedFd, rules: Rules, known: Box<dyn Fn(&str) -> Option<u32>>) {
    // It ends when valve's server does, never before: a signal to valve's
    // whole process group (Ctrl-C in a terminal, a container's stop) is the
    // server's to act on (a drain). Its children get these back (`exec`).
    for sig in HELD {
        // SAFETY: setting a signal's disposition to ignored.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    let me = rustix::process::getpid();
    if let Err(e) = rustix::process::set_child_subreaper(Some(me)) {
        say(&format!("cannot become a child subreaper ({e}): orphans of its processes go to init"));
    }
    let mut kids: BTreeMap<u64, Kid> = BTreeMap::new();
    loop {
        let ready: Vec<(u64, bool)>;
        let (asked, chore);
        {
            let mut fds = vec![PollFd::new(&sock, PollFlags::IN), PollFd::new(&chores, PollFlags::IN)];
            fds.extend(kids.values().map(|k| PollFd::new(&k.pidfd, PollFlags::IN)));
            match poll(&mut fds, Some(&rustix::event::Timespec { tv_sec: 1, tv_nsec: 0 })) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    say(&format!("poll: {e}"));
                    break;
                }
            }
            asked = !fds[0].revents().is_empty();
            chore = !fds[1].revents().is_empty();
            ready = kids.keys().zip(&fds[2..]).map(|(id, fd)| (*id, !fd.revents().is_empty())).collect();
        }
        for (id, exited) in ready {
            if exited {
                if let Some(kid) = kids.remove(&id) {
                    let status = reap(kid.pid, kid.group_dies);
                    let _ = wire::send(&sock, &Reply::Exited { id, status }, &[]);
                }
            }
        }
        reap_orphans(&kids);
        if chore {
            match wire::recv(&chores) {
                Ok(wire::Received { bytes: Some(bytes), fds, truncated }) => {
                    let done = super::errands::handle(&bytes, truncated || !fds.is_empty(), &rules);
                    let _ = wire::send(&chores, &done, &[]);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                _ => break,
            }
        }
        if asked {
            let received = match wire::recv(&sock) {
                Ok(r) => r,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            let Some(bytes) = received.bytes else { break };
            if let Some(reply) = handle(&bytes, received.fds, received.truncated, &rules, &*known, &mut kids) {
                let _ = wire::send(&sock, &reply, &[]);
            }
        }
    }
    // valve's server is gone: so is everything it asked for.
    for kid in kids.values() {
        let _ = rustix::process::kill_process_group(pid(kid.pid), Signal::KILL);
    }
    for kid in kids.values() {
        reap(kid.pid, false);
    }
}

/// One request's answer (none for a signal, which needs none).
fn handle(
    bytes: &[u8],
    fds: Vec<OwnedFd>,
    truncated: bool,
    rules: &Rules,
    known: &dyn Fn(&str) -> Option<u32>,
    kids: &mut BTreeMap<u64, Kid>,
) -> Option<Reply> {
    if truncated {
        return Some(refuse(None, format!("a message over {} bytes or with more descriptors", wire::MAX_MESSAGE)));
    }
    let request: Request = match serde_json::from_slice(bytes) {
        Ok(r) => r,
        Err(e) => return Some(refuse(None, format!("a malformed request: {e}"))),
    };
    match request {
        Request::Signal { id, sig, group } => {
            if !SIGNALS.contains(&sig) {
                return Some(refuse(Some(id), format!("signal {sig}: not one valve sends")));
            }
            // Gone already: its exit is on its way to the server.
            let kid = kids.get(&id)?;
            // SAFETY: a plain kill(2); the process is not reaped, so the pid is still its.
            let sig = unsafe { Signal::from_raw_unchecked(sig) };
            let _ = if group {
                rustix::process::kill_process_group(pid(kid.pid), sig)
            } else {
                rustix::process::kill_process(pid(kid.pid), sig)
            };
            None
        }
        Request::Start(start) => {
            let id = start.id;
            if kids.contains_key(&id) {
                return Some(refuse(Some(id), format!("id {id} is taken")));
            }
            let piped = start.piped.iter().filter(|p| **p).count();
            if piped != fds.len() {
                return Some(refuse(Some(id), format!("{piped} piped streams but {} descriptors", fds.len())));
            }
            let checked = match rules.check(&start, known) {
                Ok(c) => c,
                Err(why) => return Some(refuse(Some(id), why)),
            };
            Some(match launch(&start, checked, fds) {
                Ok(kid) => {
                    let pid = kid.pid;
                    kids.insert(id, kid);
                    Reply::Started { id, pid }
                }
                Err((error, step)) => Reply::Failed {
                    id,
                    step,
                    not_found: error.kind() == io::ErrorKind::NotFound,
                    denied: error.kind() == io::ErrorKind::PermissionDenied,
                    error: error.to_string(),
                },
            })
        }
    }
}

/// Starts a checked request, its streams `fds` in order.
fn launch(
    start: &Start,
    checked: super::check::Checked,
    fds: Vec<OwnedFd>,
) -> Result<Kid, (io::Error, Option<String>)> {
    let plain = |e: io::Error| (e, None);
    let mut job = Job::new(&checked.program);
    job.args(&start.args);
    match checked.env {
        Some(env) => {
            job.env_clear().envs(env);
        }
        None => {
            if start.clear_env {
                job.env_clear();
            }
            job.envs(start.env.iter().map(|(k, v)| (k, v)));
        }
    }
    if let Some(cwd) = &start.cwd {
        job.current_dir(cwd);
    }
    let mut fds = fds.into_iter();
    let mut ends: [Option<OwnedFd>; 3] = [None, None, None];
    for (n, piped) in start.piped.iter().enumerate() {
        job.stdio[n] = if *piped { Io::Piped } else { Io::Null };
        if *piped {
            ends[n] = fds.next();
        }
    }
    let prepared = match &start.sandbox {
        Some(owned) => Some(Arc::new(Prepared::new(owned.spec()).map_err(plain)?)),
        None => None,
    };
    let keep = start.keep.map(Keep::of_mask);
    let (mut cmd, report) = command(&job, ends, prepared.clone(), start.thp_off, keep).map_err(plain)?;
    let child = cmd.spawn().map_err(|e| {
        let step = failed_step(report.as_ref(), prepared.as_deref());
        (e, step)
    })?;
    drop(cmd);
    let pid = child.id();
    let pidfd = rustix::process::pidfd_open(self::pid(pid), PidfdFlags::empty()).map_err(|e| plain(e.into()))?;
    Ok(Kid { pid, pidfd, group_dies: start.group_dies })
}

/// Kills what is left of its process group if that dies with it (not
/// reaped yet, the group is still its), then reaps it: its raw wait status.
fn reap(p: u32, group_dies: bool) -> i32 {
    if group_dies {
        let _ = rustix::process::kill_process_group(pid(p), Signal::KILL);
    }
    match rustix::process::waitpid(Some(pid(p)), WaitOptions::empty()) {
        Ok(Some((_, status))) => status.as_raw() as i32,
        _ => libc::SIGKILL,
    }
}

/// Reaps every exited child that is not one of `kids` (an orphan that came
/// to the subreaper), never blocking.
fn reap_orphans(kids: &BTreeMap<u64, Kid>) {
    loop {
        // SAFETY: waitid fills `info`; WNOWAIT leaves the child waitable.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let r = unsafe { libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOHANG | libc::WNOWAIT) };
        // SAFETY: filled by a successful waitid of an exited child.
        let child = unsafe { info.si_pid() };
        if r != 0 || child == 0 || kids.values().any(|k| k.pid as i32 == child) {
            return;
        }
        let _ = rustix::process::waitpid(Pid::from_raw(child), WaitOptions::NOHANG);
    }
}

fn pid(p: u32) -> Pid {
    Pid::from_raw(p as i32).unwrap_or(Pid::INIT)
}

/// Refuses a request: said on valve's log by the spawner itself, and to the server.
fn refuse(id: Option<u64>, why: String) -> Reply {
    match id {
        Some(id) => say(&format!("refused request {id}: {why}")),
        None => say(&format!("refused a request: {why}")),
    }
    Reply::Refused { id, why }
}
