//! What the warm parent's forks say on the parent's own output before each
//! opens its FIFO (it does so only once it is the app's user): `valve-fork
//! ID pid PID` at once, and `valve-fork ID failed WHY` if it cannot enter
//! its sandbox. Each goes to the waiting `Fork` of worker ID, so a fork that
//! fails before it has a FIFO is noticed at once, not at the start timeout.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use super::super::fork::Reports;
use super::super::output::{OutputHook, Stream};
use super::super::wire::WorkerId;

/// A fork's exit code when it could not enter its sandbox.
pub const SANDBOX_FAILED: i32 = 7;

/// The forks of one warm parent still to be heard of, by worker id.
#[derive(Default)]
pub(super) struct Forks(Mutex<HashMap<WorkerId, Weak<Reports>>>);

impl Forks {
    /// Worker `id` is being forked: what it says goes to `reports`.
    pub(super) fn expect(&self, id: WorkerId, reports: &Arc<Reports>) {
        let mut forks = self.0.lock().unwrap_or_else(|p| p.into_inner());
        // Forks that are gone (their worker stopped) are forgotten.
        forks.retain(|_, r| r.strong_count() > 0);
        forks.insert(id, Arc::downgrade(reports));
    }

    fn of(&self, id: WorkerId) -> Option<Arc<Reports>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).get(&id).and_then(Weak::upgrade)
    }
}

/// A fork's word, if `line` is one.
#[derive(Debug, PartialEq, Eq)]
enum Said<'a> {
    Pid(WorkerId, u32),
    Failed(WorkerId, &'a str),
}

fn parse(line: &str) -> Option<Said<'_>> {
    let rest = line.strip_prefix("valve-fork ")?;
    let (id, rest) = rest.split_once(' ')?;
    let id: WorkerId = id.parse().ok()?;
    if let Some(pid) = rest.strip_prefix("pid ") {
        return pid.trim().parse().ok().map(|p| Said::Pid(id, p));
    }
    rest.strip_prefix("failed ").map(|why| Said::Failed(id, why.trim()))
}

impl OutputHook for Forks {
    fn line(&self, _worker: WorkerId, _pid: u32, stream: Stream, line: &str) {
        if stream != Stream::Stdout {
            return;
        }
        match parse(line) {
            Some(Said::Pid(id, pid)) => {
                if let Some(r) = self.of(id) {
                    r.pid(pid);
                }
            }
            Some(Said::Failed(id, why)) => {
                if let Some(r) = self.of(id) {
                    r.failed(SANDBOX_FAILED, why);
                }
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forks_words_are_read_by_worker_id() {
        assert_eq!(parse("valve-fork 12 pid 4242"), Some(Said::Pid(12, 4242)));
        assert_eq!(parse("valve-fork 12 failed uid 1001: errno 1"), Some(Said::Failed(12, "uid 1001: errno 1")));
        assert_eq!(parse("valve-fork x pid 1"), None);
        assert_eq!(parse("valve-zygote-ready 1 0.5 plumber"), None);
        assert_eq!(parse("valve-fork 3 pid nope"), None);
    }
}
