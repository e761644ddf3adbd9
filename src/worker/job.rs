//! A process to start, as plain data: what runs, as whom, in what sandbox,
//! with which environment. valve describes every R process it starts this
//! way (a worker, a parent of forks, a render, a package check, a build);
//! a spawner starts it: valve's own thread when valve cannot switch users,
//! else the privileged spawner process (`privsep`), which checks it first.
//! Serialized as JSON over the spawner's socket.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::sandbox::{landlock, view};

/// What kind of process, for the spawner's checks and its log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// An app's worker (a fresh R).
    Worker,
    /// An app's `--preload` parent (the app's code, its workers forked from it).
    Preload,
    /// The warm parent: valve's own R, no app's code, forks into apps' users.
    Warm,
    /// A document's render before its workers.
    Render,
    /// A published bundle's check of its packages' versions.
    Check,
    /// A package's fetch or build (a builder's).
    Build,
}

/// One process to start.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    pub kind: Kind,
    /// Whose it is: an app's name, a builder's (`.builder-N`), or empty for
    /// valve's own (the warm parent).
    pub owner: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Its whole environment (nothing else is inherited).
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    /// A pipe for its stdin (else `/dev/null`).
    pub stdin: bool,
    /// It forks workers: no transparent huge pages for it or its forks.
    pub parent_of_forks: bool,
    /// What it enters between fork and exec (none: valve's own process).
    pub confine: Option<Confine>,
}

/// Whom a process runs as and what it sees: a sandbox as data, turned into
/// steps (`Prepared`) by whoever starts it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Confine {
    /// Its user: (uid, gid, supplementary groups); none: valve's own.
    pub ids: Option<(u32, u32, Vec<u32>)>,
    /// Its private view of the files (a mount namespace of its own).
    pub view: Option<view::View>,
    /// Its working directory, entered inside the view.
    pub workdir: Option<PathBuf>,
    /// RLIMIT_DATA.
    pub data_limit: Option<u64>,
    /// What the OOM killer adds to its badness (0 and up: raised, never lowered).
    pub oom_score_adj: Option<i32>,
    /// Its Landlock ruleset (valve without root only: never asked of the spawner).
    pub landlock: Option<landlock::Rules>,
}

impl Job {
    /// A job to run `program` with `args` in `cwd`, no sandbox, an empty environment.
    pub fn new(kind: Kind, owner: &str, program: impl Into<PathBuf>, cwd: impl Into<PathBuf>) -> Job {
        Job {
            kind,
            owner: owner.to_string(),
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            cwd: cwd.into(),
            stdin: false,
            parent_of_forks: false,
            confine: None,
        }
    }

    pub fn arg(mut self, a: impl Into<String>) -> Job {
        self.args.push(a.into());
        self
    }

    /// Sets `k` to `v` (replacing an earlier value).
    pub fn env(&mut self, k: impl Into<String>, v: impl Into<String>) -> &mut Job {
        let k = k.into();
        self.env.retain(|(n, _)| *n != k);
        self.env.push((k, v.into()));
        self
    }

    /// The value `k` has in the job's environment.
    pub fn get_env(&self, k: &str) -> Option<&str> {
        self.env.iter().rev().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }
}
