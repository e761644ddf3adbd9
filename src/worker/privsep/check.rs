//! The spawner's rules: what a request from valve's server may start. Pure:
//! the values the spawner was given at start (`Rules`) and the app uid
//! table's names (asked of `known`) against one request. A request that
//! breaks one is refused whole, naming the rule.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use super::wire::{Kind, Sandbox, Start};
use crate::worker::sandbox::view::Cover;

/// The signals valve sends its processes.
pub const SIGNALS: [i32; 3] = [libc::SIGTERM, libc::SIGKILL, libc::SIGINT];

/// Of a process started as root (the warm parent), the variables valve's
/// server may set: the parent's own (but glibc's tunables, which a root
/// process would take as given), the lifeline and a test's hook. The rest
/// of its environment is the spawner's own allowed one, whatever the server
/// says of those.
fn root_may_set(name: &str) -> bool {
    let own = crate::worker::zygote::PARENT_OWN.contains(&name) && name != "GLIBC_TUNABLES";
    own || matches!(name, "VALVE_LIFELINE" | "VALVE_HOOK_FORK_DIES")
}

/// What the spawner knows from valve's settings, read as root at start.
#[derive(Clone, Debug, Default)]
pub struct Rules {
    /// `uid_range`: where apps' own uids are.
    pub uid_range: (u32, u32),
    /// The uid and gid valve's server runs as, never an app's.
    pub server: Option<(u32, u32)>,
    /// Uids the settings give apps outside the range (`run_as` users, uids
    /// kept from before a change of range).
    pub named: BTreeSet<u32>,
    pub builders: BTreeSet<u32>,
    /// The apps the settings name, and those that run as root (`run_as = "root"`).
    pub apps: BTreeSet<String>,
    pub root_apps: BTreeSet<String>,
    /// The R binaries the settings name, each as the spawner runs it (found on its PATH).
    pub r_bins: BTreeMap<PathBuf, PathBuf>,
    /// What the warm parent may keep of root's capabilities (`None`: valve
    /// may not narrow them, without CAP_SETPCAP: it keeps what valve has).
    pub warm_keep: Option<u64>,
    /// The folders a process started as root may name (its code, its home):
    /// the spawner's own, made by root before the server ran anything.
    pub folders: Vec<PathBuf>,
    /// The arguments of valve's one question to R about itself (`rtools`).
    pub probe_args: Vec<String>,
}

/// What to start, once checked: the program as the spawner finds it, and
/// the environment of a process started as root.
#[derive(Debug)]
pub struct Checked {
    pub program: PathBuf,
    pub env: Option<Vec<(String, String)>>,
}

impl Rules {
    /// `start` may be started (`known`: the uid table's uid for a name), or why not.
    pub fn check(&self, start: &Start, known: &dyn Fn(&str) -> Option<u32>) -> Result<Checked, String> {
        let program = self
            .r_bins
            .get(&start.program)
            .cloned()
            .ok_or_else(|| format!("program {}: not an R binary valve's settings name", start.program.display()))?;
        for (k, v) in &start.env {
            if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
                return Err(format!("environment variable {k:?}: not a name and value"));
            }
        }
        // An app's or builder's working directory is its own business (it
        // runs as its uid); a root process's must be in valve's folders.
        let as_root = matches!(start.kind, Kind::WarmParent | Kind::Probe);
        for p in start.cwd.iter().chain(start.sandbox.as_ref().and_then(|s| s.workdir.as_ref())) {
            if as_root {
                self.inside(p, "working directory")?;
            } else {
                whole(p, "working directory")?;
            }
        }
        let ids = start.sandbox.as_ref().and_then(|s| s.ids.as_ref());
        if let Some(sandbox) = &start.sandbox {
            check_view(sandbox)?;
        }
        match start.kind {
            Kind::App => {
                let app = start.app.as_deref().ok_or("an app's process names no app")?;
                let table = known(app);
                if !self.apps.contains(app) && table.is_none() {
                    return Err(format!("app {app:?}: neither valve's settings nor its uid table know it"));
                }
                if start.keep.is_some() {
                    return Err(format!("app {app:?}: an app's process keeps no capability"));
                }
                match ids {
                    Some((uid, gid, groups)) => self.app_ids(*uid, *gid, groups, table)?,
                    None if self.root_apps.contains(app) => {}
                    None => return Err(format!("app {app:?}: it does not run as root (`run_as`), so it needs a uid")),
                }
                Ok(Checked { program, env: None })
            }
            Kind::Builder => {
                let Some((uid, gid, groups)) = ids else { return Err("a package builder needs a uid".into()) };
                if !self.builders.contains(uid) {
                    return Err(format!("uid {uid}: not one of the package builders' uids"));
                }
                self.not_valves(*uid, *gid, groups)?;
                if start.keep.is_some() {
                    return Err("a package builder keeps no capability".into());
                }
                Ok(Checked { program, env: None })
            }
            Kind::WarmParent => {
                if ids.is_some() {
                    return Err("the warm parent runs as root and switches users in its forks".into());
                }
                match (self.warm_keep, start.keep) {
                    (Some(most), Some(keep)) if keep & !most != 0 => {
                        return Err(format!("capabilities {keep:#x}: more than a warm parent keeps ({most:#x})"));
                    }
                    (Some(_), None) => return Err("the warm parent must give up root's capabilities".into()),
                    (None, Some(_)) => return Err("valve may not narrow capabilities (no CAP_SETPCAP)".into()),
                    _ => {}
                }
                let file = start.args.iter().find_map(|a| a.strip_prefix("--file=")).ok_or("no --file")?;
                self.inside(Path::new(file), "the warm parent's code")?;
                if start.args.len() != 4 || !start.args.iter().take(3).all(|a| a.starts_with("--no-")) {
                    return Err(format!("arguments {:?}: not the warm parent's", start.args));
                }
                let mut env = self.root_env(start)?;
                env.push(("VALVE_FORK_RULES".into(), self.fork_rules()));
                Ok(Checked { program, env: Some(env) })
            }
            Kind::Probe => {
                if ids.is_some() || start.keep.is_some() || start.args != self.probe_args {
                    return Err(format!("arguments {:?}: not valve's question to R", start.args));
                }
                Ok(Checked { program, env: Some(own_env()) })
            }
        }
    }

    /// The rules the warm parent's forks keep (src/worker/zygote/enter.c
    /// checks each fork's steps against them): `LO HI UID GID EXTRA,...`.
    pub fn fork_rules(&self) -> String {
        let (lo, hi) = self.uid_range;
        let (uid, gid) = self.server.unwrap_or((0, 0));
        let extra: Vec<String> = self.named.iter().map(u32::to_string).collect();
        format!("{lo} {hi} {uid} {gid} {}", extra.join(","))
    }

    /// An app's ids: never root's nor the server's, the uid in the range or
    /// one the settings or the uid table give.
    fn app_ids(&self, uid: u32, gid: u32, groups: &[u32], table: Option<u32>) -> Result<(), String> {
        self.not_valves(uid, gid, groups)?;
        let (lo, hi) = self.uid_range;
        if !(lo..=hi).contains(&uid) && !self.named.contains(&uid) && table != Some(uid) {
            return Err(format!("uid {uid}: outside uid_range {lo}-{hi} and no app's by the settings"));
        }
        Ok(())
    }

    fn not_valves(&self, uid: u32, gid: u32, groups: &[u32]) -> Result<(), String> {
        if uid == 0 || gid == 0 || groups.contains(&0) {
            return Err(format!("uid {uid}, gid {gid}, groups {groups:?}: root's is never an app's"));
        }
        if let Some((vu, vg)) = self.server {
            if uid == vu || gid == vg || groups.contains(&vg) {
                return Err(format!("uid {uid}, gid {gid}, groups {groups:?}: valve's own is never an app's"));
            }
        }
        Ok(())
    }

    /// `p` is whole, without `..`, and inside one of valve's folders.
    fn inside(&self, p: &Path, what: &str) -> Result<(), String> {
        whole(p, what)?;
        if self.folders.iter().any(|f| p.starts_with(f)) {
            Ok(())
        } else {
            Err(format!("{what} {}: outside valve's folders", p.display()))
        }
    }

    /// A root process's environment: the spawner's own allowed variables,
    /// and of the server's only what `root_may_set`, each a path inside valve's
    /// folders or a plain word list.
    fn root_env(&self, start: &Start) -> Result<Vec<(String, String)>, String> {
        let mut env = own_env();
        for (k, v) in &start.env {
            if crate::worker::sandbox::inherited(k) {
                // The spawner's own value (valve's environment at start) stands.
                continue;
            }
            if !root_may_set(k) {
                return Err(format!("environment variable {k}: not one valve's server sets for a root process"));
            }
            let plain = v.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, ',' | '.' | '_'));
            // A test's hook (builds with `test-hooks` only) names a file of the test's.
            let hook = cfg!(feature = "test-hooks") && k.starts_with("VALVE_HOOK_");
            if !plain && v != "/dev/null" && !hook {
                self.inside(Path::new(v), &format!("environment variable {k}"))?;
            }
            env.push((k.clone(), v.clone()));
        }
        Ok(env)
    }
}

/// Of the spawner's own environment (valve's at start, the operator's), what
/// any isolated process may inherit: the search path, locale, time zone, R's.
fn own_env() -> Vec<(String, String)> {
    std::env::vars().filter(|(k, _)| crate::worker::sandbox::inherited(k)).collect()
}

/// A path from the root with no `.` or `..` in it.
fn whole(p: &Path, what: &str) -> Result<(), String> {
    let parts_ok = p.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if p.is_absolute() && parts_ok {
        Ok(())
    } else {
        Err(format!("{what} {}: not a whole path from the root", p.display()))
    }
}

/// A view only hides and puts back: every path whole, and every folder it
/// makes inside what it covered (never on the real tree as root).
fn check_view(sandbox: &Sandbox) -> Result<(), String> {
    let Some(steps) = &sandbox.steps else { return Ok(()) };
    let covered: Vec<&Path> = steps
        .covers
        .iter()
        .map(|c| match c {
            Cover::Empty(p) | Cover::EmptyFile(p) | Cover::Clone(_, p) | Cover::Scratch(p) => p.as_path(),
        })
        .collect();
    for p in steps.clones.iter().map(PathBuf::as_path).chain(covered.iter().copied()) {
        whole(p, "a view's path")?;
    }
    for (n, p) in &steps.places {
        whole(p, "a view's path")?;
        if *n >= steps.clones.len() {
            return Err(format!("a view puts back clone {n} of {}", steps.clones.len()));
        }
        if !covered.iter().any(|c| p.starts_with(c)) {
            return Err(format!("a view puts back {} outside what it covered", p.display()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
