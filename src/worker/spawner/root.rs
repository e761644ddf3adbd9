//! The privileged spawner: one small process that keeps root when valve's
//! server drops to valve's own user (`split`). It takes requests only from
//! the server, over a socket pair (`wire`), checks each (`checks`) and
//! logs every refusal; it starts processes as apps' users in their
//! sandboxes, starts the warm parent as valve's user with only the right
//! to switch users (and make mount namespaces, for private views), relays
//! fork requests to it, signals the processes it started (and theirs),
//! gives folders valve made to apps' users through handles, reads a
//! process's private memory, and kills a builder's leftovers. It never joins
//! a name from a request into a path it has not checked, never reads a
//! bundle, a lockfile or an app's file, and never speaks HTTP. It dies
//! with the server (a parent-death signal), and the server stops when it
//! dies; its children die with it (their own parent-death signals, the
//! lifeline).

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::process::{Pid, Signal};
use tokio::io::unix::AsyncFd;
use tokio::io::AsyncWriteExt;

use super::super::job::{Confine, Job, Kind};
use super::super::process::pid_of;
use super::super::sandbox::{enter, safe, Prepared};
use super::checks::Known;
use super::local::{self, Launchable, Local};
use super::wire::{self, Reply, Request};

/// What the spawner knows and does, decided by root before the split.
pub struct Start {
    pub known: Known,
    /// The warm parent may make mount namespaces (apps get private views).
    pub views: bool,
    /// Its log lines as JSON objects (`--log-format json`).
    pub json: bool,
}

/// The capabilities the warm parent keeps: switching users, and with
/// private views making mount namespaces.
fn warm_caps(views: bool) -> u64 {
    let mut caps = (1u64 << libc::CAP_SETUID) | (1u64 << libc::CAP_SETGID);
    if views {
        caps |= 1u64 << libc::CAP_SYS_ADMIN;
    }
    caps
}

/// Forks the spawner off this process (still root, one thread). In the
/// child it serves until the server goes and never returns; in the parent
/// it returns the server's end of the socket.
pub fn split(start: Start) -> io::Result<OwnedFd> {
    let (server, spawner) = wire::pair()?;
    let parent = std::process::id();
    // SAFETY: this process has one thread (nothing started yet), so the
    // child may do anything the parent could.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => {
            drop(server);
            // It dies with the server, however the server ends.
            let _ = rustix::process::set_parent_process_death_signal(Some(Signal::KILL));
            if rustix::process::getppid().map(|p| p.as_raw_nonzero().get() as u32) != Some(parent) {
                std::process::exit(1);
            }
            let code = serve(spawner, start);
            std::process::exit(code)
        }
        _ => Ok(server),
    }
}

/// Drops this process (the server) to valve's user `uid`/`gid` for good:
/// no other group, every capability gone from every set (the bounding set
/// too), no new privileges, not dumpable. Nothing of root's is left.
pub fn become_valve(uid: u32, gid: u32) -> io::Result<()> {
    use rustix::thread::{set_thread_groups, set_thread_res_gid, set_thread_res_uid};
    for cap in 0..=63 {
        // SAFETY: a plain prctl; caps past the kernel's last are refused (EINVAL), which is fine.
        unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
    }
    let (g, u) = (rustix::process::Gid::from_raw(gid), rustix::process::Uid::from_raw(uid));
    // glibc's wrappers: every thread (there is one) changes together.
    // SAFETY: plain calls with plain numbers.
    unsafe {
        if libc::setgroups(1, [gid].as_ptr()) != 0 || libc::setresgid(gid, gid, gid) != 0 || libc::setresuid(uid, uid, uid) != 0 {
            return Err(io::Error::last_os_error());
        }
        libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    }
    let _ = (set_thread_groups, set_thread_res_gid, set_thread_res_uid, g, u);
    rustix::thread::set_no_new_privs(true)?;
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
    if rustix::process::getuid().is_root() || rustix::process::geteuid().is_root() {
        return Err(io::Error::other("valve's server is still root after dropping it"));
    }
    Ok(())
}

/// The spawner's state: what it knows, the warm parents' stdins.
struct State {
    known: Known,
    views: bool,
    /// Each warm parent the spawner started: its stdin (fork requests go there).
    warm: HashMap<u32, tokio::net::unix::pipe::Sender>,
}

fn serve(sock: OwnedFd, start: Start) -> i32 {
    let subscriber = tracing_subscriber::fmt().with_writer(std::io::stderr).with_target(false);
    let _ = if start.json { subscriber.json().try_init() } else { subscriber.try_init() };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "the spawner cannot start its runtime");
            return 1;
        }
    };
    runtime.block_on(async move {
        let _reaper = tokio_util::task::AbortOnDropHandle::new(super::super::reap::start());
        if rustix::io::ioctl_fionbio(&sock, true).is_err() {
            return 1;
        }
        let Ok(sock) = AsyncFd::new(sock) else { return 1 };
        let sock = Arc::new(sock);
        let state = Arc::new(tokio::sync::Mutex::new(State {
            known: start.known,
            views: start.views,
            warm: HashMap::new(),
        }));
        let out = Arc::new(tokio::sync::Mutex::new(()));
        let mut buf = vec![0u8; wire::MAX_MESSAGE];
        loop {
            let got = loop {
                let Ok(mut ready) = sock.readable().await else { break None };
                match ready.try_io(|fd| wire::recv(fd.get_ref().as_fd(), &mut buf)) {
                    Ok(r) => break r.ok().flatten(),
                    Err(_would_block) => continue,
                }
            };
            // The server is gone: so is everything the spawner started.
            let Some((n, _fds)) = got else { return 0 };
            let (reply, fds) = match serde_json::from_slice::<Request>(&buf[..n]) {
                Ok(req) => handle(req, &state, &sock, &out).await,
                Err(e) => {
                    tracing::warn!(error = %e, "spawner: a malformed message from valve's server was refused");
                    (Reply::Refused { id: 0, why: format!("a malformed message: {e}") }, Vec::new())
                }
            };
            let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
            if send(&sock, &out, &reply, &borrowed).await.is_err() {
                return 0;
            }
        }
    })
}

async fn send(
    sock: &AsyncFd<OwnedFd>,
    out: &tokio::sync::Mutex<()>,
    msg: &Reply,
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> io::Result<()> {
    let _one = out.lock().await;
    loop {
        let mut ready = sock.writable().await?;
        match ready.try_io(|fd| wire::send(fd.get_ref().as_fd(), msg, fds)) {
            Ok(r) => return r,
            Err(_would_block) => continue,
        }
    }
}

/// Carries out one request, or refuses it (logged): the reply and the descriptors beside it.
async fn handle(
    req: Request,
    state: &Arc<tokio::sync::Mutex<State>>,
    sock: &Arc<AsyncFd<OwnedFd>>,
    out: &Arc<tokio::sync::Mutex<()>>,
) -> (Reply, Vec<OwnedFd>) {
    let id = req.id();
    let what = op_name(&req);
    let done = match req {
        Request::Start { job, .. } => return start(id, job, state, sock, out).await,
        Request::Signal { pid, group, signal, .. } => signal_one(&state.lock().await.known, pid, group, signal),
        Request::Give { path, uid, gid, .. } => give(&state.lock().await.known, &path, uid, gid),
        Request::GiveTree { path, gid, .. } => give_tree(&state.lock().await.known, &path, gid),
        Request::Memory { pid, .. } => {
            let known = &state.lock().await.known;
            return match descendant(known, pid) {
                Ok(()) => (Reply::Bytes { id, bytes: super::super::process::private_bytes(pid) }, Vec::new()),
                Err(why) => refuse(id, what, why),
            };
        }
        Request::KillAll { uid, .. } => {
            if state.lock().await.known.is_builder(uid) {
                tokio::task::spawn_blocking(move || local::kill_all_of(uid)).await.map_err(|e| e.to_string())
            } else {
                Err(format!("uid {uid} is no builder's"))
            }
        }
        Request::Fork { parent, app, worker, fifo, env_file, confine, .. } => {
            fork(&mut *state.lock().await, parent, &app, worker, &fifo, &env_file, &confine).await
        }
    };
    match done {
        Ok(()) => (Reply::Done { id }, Vec::new()),
        Err(why) => refuse(id, what, why),
    }
}

fn op_name(req: &Request) -> &'static str {
    match req {
        Request::Start { .. } => "start",
        Request::Signal { .. } => "signal",
        Request::Give { .. } => "give",
        Request::GiveTree { .. } => "give_tree",
        Request::Memory { .. } => "memory",
        Request::KillAll { .. } => "kill_all",
        Request::Fork { .. } => "fork",
    }
}

fn refuse(id: u64, what: &str, why: String) -> (Reply, Vec<OwnedFd>) {
    tracing::warn!(request = what, why = %why, "spawner: a request from valve's server was refused; nothing was done");
    (Reply::Refused { id, why }, Vec::new())
}

async fn start(
    id: u64,
    job: Job,
    state: &Arc<tokio::sync::Mutex<State>>,
    sock: &Arc<AsyncFd<OwnedFd>>,
    out: &Arc<tokio::sync::Mutex<()>>,
) -> (Reply, Vec<OwnedFd>) {
    let mut st = state.lock().await;
    if let Err(why) = st.known.job(&job) {
        return refuse(id, "start", why);
    }
    let prepared = if job.kind == Kind::Warm {
        // valve's own user, keeping only the right to switch users (and to
        // make mount namespaces, for private views).
        let (uid, gid) = st.known.valve;
        let groups = [gid];
        Prepared::new(enter::Spec {
            steps: None,
            workdir: None,
            data_limit: None,
            oom_score_adj: None,
            ids: Some((uid, gid, &groups)),
            landlock: None,
            keep_caps: Some(warm_caps(st.views)),
        })
        .map(Arc::new)
    } else {
        match job.confine.as_ref().map(local::prepared).transpose() {
            Ok(p) => Ok(p.unwrap_or_else(|| Arc::new(Prepared::none()))),
            Err(e) => Err(e),
        }
    };
    let prepared = match prepared {
        Ok(p) => p,
        Err(e) => return (Reply::Failed { id, step: None, error: e.to_string(), not_found: false }, Vec::new()),
    };
    let launched = match (Local::shared(), Launchable::of(&job, Some(prepared))) {
        (Ok(l), Ok(cmd)) => l.launch(&job.program, cmd).await,
        (Err(e), _) | (_, Err(e)) => Err(e.into()),
    };
    let mut started = match launched {
        Ok(s) => s,
        Err(super::super::process::StartError::Sandbox { step, error }) => {
            return (Reply::Failed { id, step: Some(step), error: error.to_string(), not_found: false }, Vec::new())
        }
        Err(super::super::process::StartError::NoR { reason, .. }) => {
            let not_found = reason.starts_with("not found");
            return (Reply::Failed { id, step: None, error: reason, not_found }, Vec::new());
        }
        Err(e) => return (Reply::Failed { id, step: None, error: e.to_string(), not_found: false }, Vec::new()),
    };
    let pid = started.pid;
    tracing::debug!(pid, kind = ?job.kind, owner = %job.owner, "spawner: started");
    // Its exit, said to the server once it is reaped.
    let (sock, out) = (sock.clone(), out.clone());
    let mut exit = started.exit.clone();
    tokio::spawn(async move {
        let status = match exit.wait_for(Option::is_some).await {
            Ok(s) => s.unwrap_or(-1),
            Err(_) => -1,
        };
        let _ = send(&sock, &out, &Reply::Exited { pid, status }, &[]).await;
    });
    let mut fds = Vec::new();
    let mut stdin = false;
    if let Some(input) = started.stdin.take() {
        if job.kind == Kind::Warm {
            // Fork requests go through the spawner's checks alone.
            match tokio::net::unix::pipe::Sender::from_owned_fd(input) {
                Ok(tx) => {
                    st.warm.insert(pid, tx);
                }
                Err(e) => tracing::warn!(error = %e, "spawner: the warm parent's stdin"),
            }
        } else {
            fds.push(input);
            stdin = true;
        }
    }
    fds.push(started.stdout);
    fds.push(started.stderr);
    (Reply::Started { id, pid, stdin }, fds)
}

/// Whether `pid` is a process of an app's (or a builder's) that the
/// spawner started, or one of theirs (a fork): never root's or valve's.
fn descendant(known: &Known, pid: u32) -> Result<(), String> {
    let (uid, _) = super::super::sandbox::ids_of(pid).map_err(|e| format!("process {pid}: {e}"))?;
    if !known.is_apps(uid) {
        return Err(format!("process {pid} (uid {uid}) is no app's"));
    }
    let me = std::process::id();
    let mut at = pid;
    for _ in 0..32 {
        let stat = std::fs::read_to_string(format!("/proc/{at}/stat")).map_err(|e| format!("process {at}: {e}"))?;
        let ppid: u32 = stat.rsplit(')').next().and_then(|s| s.split_whitespace().nth(1)?.parse().ok()).unwrap_or(0);
        if ppid == me {
            return Ok(());
        }
        if ppid <= 1 {
            break;
        }
        at = ppid;
    }
    Err(format!("process {pid} is not one the spawner started"))
}

fn signal_one(known: &Known, pid: u32, group: bool, signal: i32) -> Result<(), String> {
    descendant(known, pid)?;
    // SAFETY: a signal number, checked by the kernel.
    let signal = unsafe { Signal::from_raw_unchecked(signal) };
    let _ = if group {
        rustix::process::kill_process_group(pid_of(pid), signal)
    } else {
        rustix::process::kill_process(pid_of(pid), signal)
    };
    Ok(())
}

/// Opens `rel`'s folder inside valve's folder `top`, component by component, no link followed.
fn open_parent(top: &Path, rel: &Path) -> Result<(OwnedFd, String), String> {
    let mut fd = safe::open_dir(top).map_err(|e| format!("{}: {e}", top.display()))?;
    let parts: Vec<&str> = rel.iter().filter_map(|p| p.to_str()).collect();
    let Some((name, dirs)) = parts.split_last() else { return Err("an empty path".into()) };
    for d in dirs {
        fd = safe::open_at(&fd, d).map_err(|e| format!("{}/{d}: {e}", top.display()))?;
    }
    Ok((fd, name.to_string()))
}

fn give(known: &Known, path: &Path, uid: Option<u32>, gid: Option<u32>) -> Result<(), String> {
    let (top, rel) = known.inside(path)?;
    if let Some(u) = uid.filter(|u| !known.is_apps(*u)) {
        return Err(format!("uid {u} is no app's"));
    }
    if let Some(g) = gid.filter(|g| !known.app_gid(*g)) {
        return Err(format!("gid {g} is no app's group"));
    }
    let (parent, name) = open_parent(top, rel)?;
    let st = rustix::fs::statat(&parent, name.as_str(), AtFlags::SYMLINK_NOFOLLOW).map_err(|e| format!("{}: {e}", path.display()))?;
    let kind = FileType::from_raw_mode(st.st_mode);
    let whose = st.st_uid == known.valve.0 || Some(st.st_uid) == uid;
    let plain = matches!(kind, FileType::Directory | FileType::Fifo) || (kind == FileType::RegularFile && st.st_nlink == 1);
    if !whose || !plain {
        return Err(format!("{} is not a folder, FIFO or file of valve's own", path.display()));
    }
    safe::give_entry(&parent, &name, uid, gid).map_err(|e| format!("{}: {e}", path.display()))
}

fn give_tree(known: &Known, path: &Path, gid: u32) -> Result<(), String> {
    let (top, rel) = known.inside(path)?;
    if !known.app_gid(gid) {
        return Err(format!("gid {gid} is no app's group"));
    }
    let (parent, name) = open_parent(top, rel)?;
    let dir = safe::open_at(&parent, &name).map_err(|e| format!("{}: {e}", path.display()))?;
    safe::give_tree_as(&dir, known.valve.0, gid, 0).map_err(|e| format!("{}: {e}", path.display()))
}

/// Relays a fork request to the warm parent `parent`, checked as a start
/// is: its steps made here from what it enters, its FIFO and environment
/// file valve's own files in the app's run folder.
async fn fork(
    st: &mut State,
    parent: u32,
    app: &str,
    worker: u64,
    fifo: &Path,
    env_file: &Path,
    confine: &Confine,
) -> Result<(), String> {
    st.known.confine(app, confine)?;
    for p in [fifo, env_file] {
        let (_, rel) = st.known.inside(p)?;
        let mut parts = rel.iter();
        let under_app = parts.next().is_some_and(|a| a == "apps") && parts.next().is_some_and(|a| a == app);
        if !under_app || parts.count() != 1 {
            return Err(format!("{} is not in app {app}'s run folder", p.display()));
        }
    }
    let prepared = local::prepared(confine).map_err(|e| e.to_string())?;
    let mut steps = prepared.lines().to_vec();
    let stdio = format!("stdio {}", fifo.display());
    match steps.iter().position(|l| l.starts_with("landlock ")) {
        Some(at) => steps.insert(at, stdio),
        None => steps.push(stdio),
    }
    let line = serde_json::json!({
        "id": worker, "fifo": fifo, "env_file": env_file, "env_uid": st.known.valve.0, "steps": steps,
    });
    let Some(tx) = st.warm.get_mut(&parent) else { return Err(format!("process {parent} is no warm parent of the spawner's")) };
    tx.write_all(format!("{line}\n").as_bytes()).await.map_err(|e| format!("the warm parent: {e}"))?;
    let _ = tx.flush().await;
    let _ = Pid::from_raw(1);
    let _ = OFlags::empty();
    let _ = Mode::empty();
    Ok(())
}
