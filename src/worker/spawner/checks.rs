//! What the privileged spawner takes from valve's server, decided as data
//! (pure: a request and what the spawner knows in, yes or why not out).
//! The spawner knows, from the configuration root read at start: the uids
//! apps may have (`uid_range`, the users `run_as` names), valve's own user,
//! each app's uid as given so far (a name keeps its uid, a uid belongs to
//! one name), the builders' uids and valve's own folders. A request naming
//! root, valve's user, a uid outside those, another app's uid, or a path
//! outside valve's folders is refused.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use super::super::job::{Confine, Job, Kind};

/// A user `run_as` names: its uid, gid and groups, as root found them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// What the spawner knows.
#[derive(Clone, Debug, Default)]
pub struct Known {
    /// `uid_range`: where apps' own uids are.
    pub range: (u32, u32),
    /// valve's own user (its server's uid and gid).
    pub valve: (u32, u32),
    /// Users that `run_as` names, by uid.
    pub named: Vec<Named>,
    /// Each app's uid, by name (builders' as `.builder-N`).
    pub apps: BTreeMap<String, u32>,
    /// valve's own folders: every path a request names is inside one.
    pub folders: Vec<PathBuf>,
}

impl Known {
    /// Whether `uid` may be an app's (or a builder's) at all.
    fn app_uid(&self, uid: u32) -> Result<(), String> {
        if uid == 0 {
            return Err("uid 0 (root): no app runs as root".into());
        }
        if uid == self.valve.0 {
            return Err(format!("uid {uid} is valve's own user's: no app runs as valve"));
        }
        let in_range = (self.range.0..=self.range.1).contains(&uid);
        if !in_range && !self.named.iter().any(|n| n.uid == uid) {
            return Err(format!(
                "uid {uid} is outside uid_range {}-{} and no run_as named it when valve started",
                self.range.0, self.range.1
            ));
        }
        Ok(())
    }

    /// The gid and groups a process of `uid` gets: its own group for an
    /// app's own uid, a named user's as root found them.
    fn groups_of(&self, uid: u32) -> (u32, Vec<u32>) {
        match self.named.iter().find(|n| n.uid == uid) {
            Some(n) => (n.gid, n.groups.clone()),
            None => (uid, vec![uid]),
        }
    }

    /// Takes `uid` as `owner`'s: the uid an app had is the one it keeps; a
    /// uid another name has is refused; a new name is recorded.
    pub fn claim(&mut self, owner: &str, uid: u32) -> Result<(), String> {
        self.app_uid(uid)?;
        let valid = crate::config::valid_name(owner)
            || owner.strip_prefix(".builder-").is_some_and(|n| n.parse::<u32>().is_ok());
        if !valid {
            return Err(format!("{:?} is no app's name", owner.chars().take(64).collect::<String>()));
        }
        if let Some(had) = self.apps.get(owner) {
            if *had != uid {
                return Err(format!("the app {owner} has uid {had}, not {uid}"));
            }
            return Ok(());
        }
        if let Some((other, _)) = self.apps.iter().find(|(_, u)| **u == uid) {
            return Err(format!("uid {uid} is the app {other}'s, not {owner}'s"));
        }
        if owner.starts_with(".builder-") {
            return Err(format!("{owner} is no builder valve started with"));
        }
        self.apps.insert(owner.to_string(), uid);
        Ok(())
    }

    /// Whether `uid` is some app's or builder's now.
    pub fn is_apps(&self, uid: u32) -> bool {
        self.apps.values().any(|u| *u == uid)
    }

    /// Whether `uid` is a builder's.
    pub fn is_builder(&self, uid: u32) -> bool {
        self.apps.iter().any(|(n, u)| *u == uid && n.starts_with(".builder-"))
    }

    /// Whether `gid` is an app's group (or valve's own, which may reach an app's sockets).
    pub fn app_gid(&self, gid: u32) -> bool {
        gid == self.valve.1 || self.apps.values().any(|u| self.groups_of(*u).0 == gid)
    }

    /// `path` if it is a plain absolute path inside one of valve's folders.
    pub fn inside<'p>(&self, path: &'p Path) -> Result<(&PathBuf, &'p Path), String> {
        if !path.is_absolute() || path.components().any(|c| !matches!(c, Component::RootDir | Component::Normal(_))) {
            return Err(format!("{}: not a plain absolute path", path.display()));
        }
        self.folders
            .iter()
            .find_map(|f| path.strip_prefix(f).ok().filter(|rest| rest.components().next().is_some()).map(|rest| (f, rest)))
            .ok_or_else(|| format!("{} is not inside one of valve's folders", path.display()))
    }

    /// Checks a job before it is started, and records its owner's uid:
    /// what it may run as, and what it may enter. The warm parent is valve's
    /// own (the spawner gives it its user and its capabilities itself).
    pub fn job(&mut self, job: &Job) -> Result<(), String> {
        if !job.program.is_absolute() || !job.cwd.is_absolute() {
            return Err("a job's program and working directory must be absolute paths".into());
        }
        if job.kind == Kind::Warm {
            return match &job.confine {
                None if job.owner.is_empty() => Ok(()),
                _ => Err("the warm parent runs as valve's own user, in no sandbox: a job that says otherwise is no warm parent".into()),
            };
        }
        let Some(confine) = &job.confine else {
            return Err(format!("a {:?} process of {} must run as the app's own user", job.kind, job.owner));
        };
        self.confine(&job.owner, confine)
    }

    /// Checks what a process of `owner` enters: its user is `owner`'s, its
    /// groups that user's, the OOM killer's preference only raised, no
    /// Landlock (a spawner is root: apps get users of their own).
    pub fn confine(&mut self, owner: &str, confine: &Confine) -> Result<(), String> {
        let Some((uid, gid, groups)) = &confine.ids else {
            return Err(format!("a process of {owner} must run as the app's own user"));
        };
        self.claim(owner, *uid)?;
        let (want_gid, want_groups) = self.groups_of(*uid);
        if *gid != want_gid || *groups != want_groups {
            return Err(format!("uid {uid} runs with gid {want_gid} and groups {want_groups:?}, not gid {gid} and {groups:?}"));
        }
        if confine.oom_score_adj.is_some_and(|v| v < 0) {
            return Err("the OOM killer's preference may only be raised".into());
        }
        if confine.landlock.is_some() {
            return Err("a Landlock ruleset is for a valve without root".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known() -> Known {
        let mut apps = BTreeMap::new();
        apps.insert("alpha".to_string(), 1_900_000_001);
        apps.insert(".builder-1".to_string(), 1_900_000_009);
        Known {
            range: (1_900_000_000, 1_999_999_999),
            valve: (998, 998),
            named: vec![Named { uid: 1234, gid: 100, groups: vec![100, 27] }],
            apps,
            folders: vec![PathBuf::from("/run/valve-x"), PathBuf::from("/var/lib/valve")],
        }
    }

    fn confine(uid: u32, gid: u32, groups: &[u32]) -> Confine {
        Confine { ids: Some((uid, gid, groups.to_vec())), ..Default::default() }
    }

    #[test]
    fn only_an_apps_own_uid_its_groups_and_valves_folders_are_taken() {
        let mut k = known();
        assert!(k.confine("alpha", &confine(1_900_000_001, 1_900_000_001, &[1_900_000_001])).is_ok());
        for (owner, c, says) in [
            ("alpha", confine(0, 0, &[0]), "uid 0"),
            ("alpha", confine(998, 998, &[998]), "valve's own user"),
            ("alpha", confine(5000, 5000, &[5000]), "outside uid_range"),
            ("alpha", confine(1_900_000_002, 1_900_000_002, &[1_900_000_002]), "has uid 1900000001"),
            ("beta", confine(1_900_000_001, 1_900_000_001, &[1_900_000_001]), "is the app alpha's"),
            ("../x", confine(1_900_000_003, 1_900_000_003, &[1_900_000_003]), "no app's name"),
            ("alpha", confine(1_900_000_001, 0, &[0]), "runs with gid 1900000001"),
            ("named", confine(1234, 100, &[100, 0]), "groups [100, 27]"),
            (".builder-7", confine(1_900_000_007, 1_900_000_007, &[1_900_000_007]), "no builder"),
            ("alpha", Confine { oom_score_adj: Some(-1000), ..confine(1_900_000_001, 1_900_000_001, &[1_900_000_001]) }, "only be raised"),
        ] {
            let e = k.confine(owner, &c).unwrap_err();
            assert!(e.contains(says), "{owner} {c:?}: {e}");
        }
        assert!(k.confine("named", &confine(1234, 100, &[100, 27])).is_ok(), "a run_as user, with its own groups");
        assert!(k.confine("gamma", &confine(1_900_000_005, 1_900_000_005, &[1_900_000_005])).is_ok(), "a new app's new uid");
        assert!(k.is_builder(1_900_000_009) && !k.is_builder(1_900_000_005));
        assert!(k.inside(Path::new("/var/lib/valve/apps/alpha/home")).is_ok());
        for bad in ["/var/lib/valve", "/etc/passwd", "/var/lib/valve/../../etc", "relative", "/var/lib/valve-other/x"] {
            assert!(k.inside(Path::new(bad)).is_err(), "{bad}");
        }
    }
}
