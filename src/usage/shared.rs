//! Usage for a whole site: when `usage_log` names a folder that several
//! valves share (replicas with one volume), each appends to a file of its
//! own there (`<replica>.jsonl`, never written by another) and follows the
//! others' files, adding what they append to what it reports. So
//! `/__valve__/usage` and the dashboard answer for the site on any replica.
//!
//! A replica's name is its host's (a pod's name) and a short hash of its
//! state folder: stable across its restarts, distinct for two valves on one
//! host.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::file::{self, Tail, TAIL_BYTES};

/// How often the other valves' files are looked at.
pub const FOLLOW_EVERY: Duration = Duration::from_secs(5);

/// The file name's ending.
const EXT: &str = "jsonl";

/// This valve's name among those sharing a usage folder.
pub fn replica_name(state_dir: &Path) -> String {
    let host: String = crate::config::host_name()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' })
        .collect();
    let host = if host.is_empty() { "valve".to_string() } else { host };
    // FNV-1a of the state folder: two valves on one host apart.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in state_dir.as_os_str().as_encoded_bytes() {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{host}-{:08x}", h as u32)
}

/// This valve's own file in a shared folder.
pub fn own_file(dir: &Path, replica: &str) -> PathBuf {
    dir.join(format!("{replica}.{EXT}"))
}

/// The other valves' files and how far each has been read.
pub struct Follower {
    dir: PathBuf,
    own: PathBuf,
    read: HashMap<PathBuf, u64>,
}

impl Follower {
    pub fn new(dir: &Path, own: &Path) -> Follower {
        Follower { dir: dir.to_path_buf(), own: own.to_path_buf(), read: HashMap::new() }
    }

    /// What the other valves appended since the last call (a file seen the
    /// first time: its last `TAIL_BYTES`, as a valve reads its own at start).
    pub fn read_new(&mut self) -> Tail {
        let mut out = Tail::default();
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return out };
        for path in entries.flatten().map(|e| e.path()) {
            if path == self.own || path.extension().is_none_or(|x| x != EXT) {
                continue;
            }
            let (from, cut) = match self.read.get(&path) {
                Some(at) => (*at, false),
                None => (std::fs::metadata(&path).map_or(0, |m| m.len().saturating_sub(TAIL_BYTES)), true),
            };
            match file::read_from(&path, from, cut) {
                Ok((tail, next)) => {
                    out.records.extend(tail.records);
                    out.unreadable += tail.unreadable;
                    self.read.insert(path, next);
                }
                Err(e) => tracing::debug!(path = %path.display(), error = %e, "cannot read another valve's usage"),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::record::{Hourly, Record, Session};

    #[test]
    fn a_follower_reads_what_other_valves_append_once_and_never_its_own_file() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (replica_name(Path::new("/var/lib/valve-a")), replica_name(Path::new("/var/lib/valve-b")));
        assert_ne!(a, b, "two valves on one host");
        assert_eq!(a, replica_name(Path::new("/var/lib/valve-a")), "stable");
        let (own, other) = (own_file(dir.path(), &a), own_file(dir.path(), &b));
        let s = Session { app: "x".into(), user: Some("ann".into()), start_ms: 1, end_ms: 2, worker: 1, reconnects: 0 };
        std::fs::write(&own, format!("{}\n", s.to_json())).unwrap();
        let h = Hourly { app: "x".into(), user: None, hour: 7, requests: 3 };
        std::fs::write(&other, format!("{}\n{}", s.to_json(), "{\"half\": ")).unwrap();
        let mut f = Follower::new(dir.path(), &own);
        let first = f.read_new();
        assert_eq!(first.records, vec![Record::Session(s.clone())], "the other's whole lines, not its own");
        assert!(f.read_new().records.is_empty(), "read once");
        // The half line is finished, and another follows.
        let mut text = std::fs::read_to_string(&other).unwrap();
        text.truncate(text.len() - "{\"half\": ".len());
        text.push_str(&format!("{}\n", h.to_json()));
        std::fs::write(&other, text).unwrap();
        assert_eq!(f.read_new().records, vec![Record::Hourly(h)]);
    }
}
