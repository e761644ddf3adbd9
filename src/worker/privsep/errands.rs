//! The spawner's side of chores (`chores`): each one read as its typed
//! value, checked against the rules of start, then done; anything else is
//! refused, said on valve's log, and changes nothing.

use super::check::Rules;
use super::chores::{Chore, Done};

/// The answer to one chore's message.
pub(super) fn handle(bytes: &[u8], truncated: bool, rules: &Rules) -> Done {
    if truncated {
        return refuse(format!("a chore over {} bytes or with descriptors", super::wire::MAX_MESSAGE));
    }
    let chore: Chore = match serde_json::from_slice(bytes) {
        Ok(c) => c,
        Err(e) => return refuse(format!("a malformed chore: {e}")),
    };
    match chore {
        Chore::KillUid { uid } => {
            if let Err(why) = builder_uid(uid, rules) {
                return refuse(why);
            }
            crate::worker::builders::kill_all_of(uid);
            Done::Done
        }
        Chore::Memory { pid } => {
            if let Err(why) = below_me(pid) {
                return refuse(why);
            }
            Done::Memory { bytes: crate::worker::process::private_bytes_here(pid) }
        }
    }
}

/// Whether process `pid` is below the spawner: one it started, or one of
/// theirs (a warm parent's fork), by the parents the kernel gives in
/// `/proc/PID/stat`.
fn below_me(pid: u32) -> Result<(), String> {
    let me = std::process::id();
    let mut at = pid;
    for _ in 0..16 {
        let stat = std::fs::read_to_string(format!("/proc/{at}/stat")).map_err(|_| format!("no process {pid}"))?;
        // The parent is the second field after the command, which may hold spaces and ')'.
        let parent = stat
            .rfind(')')
            .and_then(|end| stat[end + 1..].split_whitespace().nth(1)?.parse::<u32>().ok())
            .ok_or_else(|| format!("process {at}'s stat has no parent"))?;
        if parent == me {
            return Ok(());
        }
        if parent <= 1 {
            break;
        }
        at = parent;
    }
    Err(format!("process {pid} is not one the spawner started or one of theirs"))
}

/// Whether `uid` is one of the package builders' uids (never root's, never valve's server's).
fn builder_uid(uid: u32, rules: &Rules) -> Result<(), String> {
    if uid == 0 || rules.server.is_some_and(|(u, _)| u == uid) {
        return Err(format!("uid {uid} is root's or valve's own"));
    }
    if !rules.builders.contains(&uid) {
        return Err(format!("uid {uid} is not one of the builders' uids"));
    }
    Ok(())
}

fn refuse(why: String) -> Done {
    super::say::say(&format!("refused a chore: {why}"));
    Done::Refused { why }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> Rules {
        Rules {
            uid_range: (60000, 60100),
            server: Some((999, 999)),
            named: Default::default(),
            builders: [61000, 999].into_iter().collect(),
            apps: Default::default(),
            root_apps: Default::default(),
            r_bins: Default::default(),
            warm_keep: None,
            folders: vec![],
            probe_args: vec![],
        }
    }

    fn refused(bytes: &[u8]) -> String {
        match handle(bytes, false, &rules()) {
            Done::Refused { why } => why,
            done => panic!("{done:?}: {}", String::from_utf8_lossy(bytes)),
        }
    }

    #[test]
    fn only_a_builders_uid_is_killed_never_roots_an_apps_or_valves() {
        assert!(refused(br#"{"chore":"kill_uid","uid":0}"#).contains("root's or valve's"));
        assert!(refused(br#"{"chore":"kill_uid","uid":999}"#).contains("root's or valve's"));
        assert!(refused(br#"{"chore":"kill_uid","uid":60001}"#).contains("not one of the builders'"));
        // A builder's uid with nothing running: done, nothing else touched.
        assert_eq!(handle(br#"{"chore":"kill_uid","uid":61000}"#, false, &rules()), Done::Done);
    }

    #[test]
    fn memory_is_read_only_of_a_process_below_the_spawner() {
        // This test process plays the spawner: its child is below it, its parent and init are not.
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let asked = format!(r#"{{"chore":"memory","pid":{}}}"#, child.id());
        let below = handle(asked.as_bytes(), false, &rules());
        let _ = child.kill();
        let _ = child.wait();
        assert!(matches!(below, Done::Memory { bytes: Some(b) } if b > 0), "{below:?}");
        let parent = std::os::unix::process::parent_id();
        assert!(refused(format!(r#"{{"chore":"memory","pid":{parent}}}"#).as_bytes()).contains("not one the spawner"));
        assert!(refused(br#"{"chore":"memory","pid":1}"#).contains("not one the spawner"));
    }

    #[test]
    fn a_malformed_or_unknown_chore_is_refused() {
        assert!(refused(br#"{"chore":"kill_uid","uid":61000,"also":1}"#).contains("malformed"));
        assert!(refused(br#"{"chore":"chown","path":"/etc/shadow"}"#).contains("malformed"));
        assert!(refused(b"not json").contains("malformed"));
        assert!(matches!(handle(b"{}", true, &rules()), Done::Refused { .. }));
    }
}
