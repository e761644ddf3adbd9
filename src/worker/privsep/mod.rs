//! The privileged spawner: as root, the one process that starts valve's
//! processes. It is forked at start, before the runtime, the log and any
//! listener exist (one thread, nothing shared), keeps root, and takes
//! requests only from valve's server over a `SOCK_SEQPACKET` socket pair:
//! start a job (an app's R as its uid, in its sandbox; a package builder
//! as a builder's uid; the warm parent keeping only what switching users
//! needs; valve's one question to R), signal one it started, do a few
//! chores that need root (`chores`), and nothing else. Each request is one typed value (`wire`), checked against what
//! valve's settings said at start (`check`) before anything is done; a
//! request that breaks a rule is refused, said on valve's log, and changes
//! nothing. The spawner exits when the server does (its end closes), and
//! the server stops when the spawner is gone.
//!
//! Without root there is no spawner: valve starts its processes itself,
//! each under its app's Landlock ruleset (`launchable`).

mod check;
pub(crate) mod chores;
pub(crate) mod client;
mod errands;
mod room;
mod say;
pub mod wire;

use std::io;
use std::path::{Path, PathBuf};

pub use client::lost;

use crate::config::{AccountKind, Config};

/// Which side of the fork this process is.
pub enum Side {
    /// valve's server (with a spawner as root, or without one).
    Server,
    /// The privileged spawner: run this, then exit.
    Spawner(Box<dyn FnOnce()>),
}

/// As root, forks the privileged spawner. Call before any thread is
/// started: the spawner is a copy of this process as it is now.
pub fn start(config: &Config, uid_range: (u32, u32), r_bin: &Path, json: bool) -> io::Result<Side> {
    if !rustix::process::geteuid().is_root() {
        return Ok(Side::Server);
    }
    let status = std::fs::read_to_string("/proc/self/status")?;
    if status.lines().any(|l| l.starts_with("Threads:") && l.split_whitespace().nth(1) != Some("1")) {
        return Err(io::Error::other("valve has threads already: the privileged spawner must be forked before them"));
    }
    // Made before the fork: the spawner holds its write end too.
    let _ = super::lifeline::read_end();
    // What the warm parent runs as root, made by root before the fork: never
    // a file valve's server could change once it runs as a user of its own.
    let root = root_folder()?;
    let rules = rules_of(config, uid_range, r_bin, &root);
    let store = crate::config::uid_store::Store::of_site(
        &config.server.state_dir,
        config.server.publish.as_ref().map(|p| p.dir.as_path()),
        false,
    );
    let (server, spawner) = rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )?;
    // Chores (`chores`) on a pair of their own: a blocking ask and its
    // answer, never mixed with the jobs' replies the server reads as they come.
    let (server_chores, spawner_chores) = rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )?;
    // SAFETY: valve has one thread (checked above), so the child is a whole copy of it.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => {
            drop(server);
            drop(server_chores);
            let _ = rustix::thread::set_name(c"valve-spawner");
            say::log_json(json);
            Ok(Side::Spawner(Box::new(move || {
                room::serve(spawner, spawner_chores, rules, Box::new(move |name| store.known(name)));
                let _ = std::fs::remove_dir_all(&root);
            })))
        }
        _ => {
            drop(spawner);
            drop(spawner_chores);
            client::keep(server, root);
            chores::keep(server_chores);
            Ok(Side::Server)
        }
    }
}

/// The folder of what runs as root: `lib/` (the warm parent's code, as
/// valve carries it) and `zygote/` (its home and working directory), root's,
/// removed by the spawner when it ends.
fn root_folder() -> io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new().prefix("valve-root-").tempdir()?.keep();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    super::spawn::write_lib(&dir.join("lib"))?;
    let home = dir.join("zygote");
    std::fs::create_dir(&home)?;
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700))?;
    Ok(dir)
}

/// What the spawner knows from the settings.
fn rules_of(config: &Config, uid_range: (u32, u32), r_bin: &Path, root: &Path) -> check::Rules {
    let (lo, hi) = uid_range;
    let apps = &config.apps;
    let mut r_bins = std::collections::BTreeMap::new();
    for bin in apps.iter().map(|a| a.r_bin.as_path()).chain([r_bin]) {
        r_bins.insert(bin.to_path_buf(), found(bin));
    }
    check::Rules {
        uid_range,
        server: None,
        named: apps.iter().map(|a| a.account.uid).filter(|u| !(lo..=hi).contains(u)).collect(),
        builders: config.server.builder_uids.iter().copied().collect(),
        apps: apps.iter().map(|a| a.name.clone()).collect(),
        root_apps: apps.iter().filter(|a| a.account.kind == AccountKind::Root).map(|a| a.name.clone()).collect(),
        r_bins,
        warm_keep: super::caps::Keep::for_warm_parent().ok().flatten().map(|k| k.mask()),
        folders: vec![root.to_path_buf()],
        probe_args: super::rtools::probe_args(),
    }
}

/// `bin` as the spawner runs it: found on its PATH when it is a bare name.
fn found(bin: &Path) -> PathBuf {
    if bin.components().count() != 1 {
        return std::path::absolute(bin).unwrap_or_else(|_| bin.to_path_buf());
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(bin))
        .find(|p| p.is_file())
        .unwrap_or_else(|| bin.to_path_buf())
}
