//! A lock that several valves sharing `publish_dir` agree on: a file made
//! with `O_EXCL` that says who holds it. A holder that keeps it long
//! rewrites it every `RENEW`; a waiter that sees it unchanged (the same
//! bytes, the same modification time) for its `stale` time, measured on
//! the waiter's own clock, takes it as left by a valve that died and breaks
//! it. Nothing is judged on a time written by another machine, so a clock
//! skewed between replicas neither breaks a live lease nor keeps a dead one.
//!
//! Breaking is a rename to a name of the breaker's own, then a check that
//! what it moved is what it saw unchanged; if another waiter was quicker
//! and already holds a fresh lease there, that one is put back.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// How often a long holder rewrites its lease.
pub const RENEW: Duration = Duration::from_secs(2);

/// A lease held; given back (its file removed) when dropped.
pub struct Lease {
    path: PathBuf,
    token: String,
    renewer: Option<tokio::task::JoinHandle<()>>,
}

/// Who holds a lease and since when, as its file says.
fn content(holder: &str, token: &str, beat: u64) -> String {
    format!("{holder}\n{token}\n{beat}\n")
}

/// The holder named in a lease's file (its first line).
pub fn holder_of(text: &str) -> &str {
    text.lines().next().unwrap_or("another valve")
}

/// What a waiter watches: the file's bytes and modification time.
fn seen(path: &Path) -> Option<(String, Option<SystemTime>)> {
    let text = std::fs::read_to_string(path).ok()?;
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
    Some((text, modified))
}

/// Who valve is among the valves sharing a folder: the host's name (a
/// pod's name under Kubernetes) and the process.
pub fn holder_name() -> String {
    let host = Some(crate::config::host_name()).filter(|h| !h.is_empty()).unwrap_or("a valve");
    format!("{host} (pid {})", std::process::id())
}

fn token() -> String {
    let mut b = [0u8; 12];
    let _ = rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty());
    crate::mac::hex(&b)
}

/// One try: the lease, or who holds it now.
fn try_take(path: &Path, holder: &str, token: &str) -> std::io::Result<Result<Lease, String>> {
    match std::fs::OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(mut f) => {
            f.write_all(content(holder, token, 0).as_bytes())?;
            f.sync_all()?;
            Ok(Ok(Lease { path: path.to_path_buf(), token: token.to_string(), renewer: None }))
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            Ok(Err(std::fs::read_to_string(path).map(|t| holder_of(&t).to_string()).unwrap_or_default()))
        }
        Err(e) => Err(e),
    }
}

/// Breaks the lease at `path` if it still is what the waiter saw unchanged.
fn break_stale(path: &Path, saw: &str, mine: &str) {
    let aside = path.with_extension(format!("broken-{mine}"));
    if std::fs::rename(path, &aside).is_err() {
        return;
    }
    let moved = std::fs::read_to_string(&aside).unwrap_or_default();
    if moved != saw {
        // Another waiter broke it first and holds a fresh one: put it back.
        let _ = std::fs::hard_link(&aside, path);
    } else {
        tracing::warn!(target: "valve::publish", lock = %path.display(), holder = %holder_of(saw),
            "a lock in publish_dir was left by a valve that stopped renewing it: broken");
    }
    let _ = std::fs::remove_file(&aside);
}

/// Watches one lease for staleness.
struct Watch {
    saw: Option<(String, Option<SystemTime>)>,
    since: Instant,
}

impl Watch {
    fn new() -> Watch {
        Watch { saw: None, since: Instant::now() }
    }

    /// Whether the lease at `path` has stayed the same for `stale`; breaks it if so.
    fn check(&mut self, path: &Path, stale: Duration, mine: &str) {
        let now = seen(path);
        if now != self.saw {
            self.saw = now;
            self.since = Instant::now();
        } else if let Some((text, _)) = &self.saw {
            if self.since.elapsed() >= stale {
                break_stale(path, text, mine);
                self.saw = None;
                self.since = Instant::now();
            }
        }
    }
}

fn gave_up(path: &Path, holder: &str, waited: Duration) -> String {
    format!(
        "{} is held by {holder} and was not given back within {}s: another valve sharing publish_dir is busy with it; try again (a lock left by a valve that died is broken after it stops being renewed)",
        path.display(),
        waited.as_secs()
    )
}

/// One taker's tries at a lease: who it is, until when it waits, what it saw.
struct Taking<'a> {
    path: &'a Path,
    holder: String,
    mine: String,
    stale: Duration,
    wait: Duration,
    deadline: Instant,
    watch: Watch,
}

impl<'a> Taking<'a> {
    fn new(path: &'a Path, stale: Duration, wait: Duration) -> Taking<'a> {
        let (holder, mine) = (holder_name(), token());
        Taking { path, holder, mine, stale, wait, deadline: Instant::now() + wait, watch: Watch::new() }
    }

    /// One try: the lease, or who holds it (wait and try again); an error
    /// once the wait is over or the lock cannot be made.
    fn attempt(&mut self) -> Result<Result<Lease, String>, String> {
        match try_take(self.path, &self.holder, &self.mine) {
            Ok(Ok(lease)) => Ok(Ok(lease)),
            Ok(Err(other)) if Instant::now() >= self.deadline => Err(gave_up(self.path, &other, self.wait)),
            Ok(Err(other)) => {
                self.watch.check(self.path, self.stale, &self.mine);
                Ok(Err(other))
            }
            Err(e) => Err(format!("cannot make the lock {}: {e} (is publish_dir writable?)", self.path.display())),
        }
    }
}

/// Takes the lease at `path`, waiting (the thread sleeps) at most `wait`.
pub fn take_blocking(path: &Path, stale: Duration, wait: Duration) -> Result<Lease, String> {
    let mut taking = Taking::new(path, stale, wait);
    loop {
        if let Ok(lease) = taking.attempt()? {
            return Ok(lease);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Takes the lease at `path`, waiting at most `wait`; `waiting` is told
/// once who holds it, if anyone does.
pub async fn take(path: &Path, stale: Duration, wait: Duration, waiting: impl FnOnce(&str)) -> Result<Lease, String> {
    let mut taking = Taking::new(path, stale, wait);
    let mut waiting = Some(waiting);
    loop {
        match taking.attempt()? {
            Ok(lease) => return Ok(lease),
            Err(other) => {
                if let Some(tell) = waiting.take() {
                    tell(&other);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

impl Lease {
    /// Rewrites the lease every `RENEW` while it is held (a holder that
    /// keeps it longer than a waiter's stale time).
    pub fn keep_renewed(&mut self) {
        let (path, token) = (self.path.clone(), self.token.clone());
        self.renewer = Some(tokio::spawn(async move {
            let holder = holder_name();
            for beat in 1u64.. {
                tokio::time::sleep(RENEW).await;
                let ours = std::fs::read_to_string(&path).is_ok_and(|t| t.lines().nth(1) == Some(token.as_str()));
                if !ours {
                    tracing::warn!(target: "valve::publish", lock = %path.display(),
                        "a lock this valve held in publish_dir was broken by another valve (was this one stalled?)");
                    return;
                }
                let _ = std::fs::write(&path, content(&holder, &token, beat));
            }
        }));
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(r) = self.renewer.take() {
            r.abort();
        }
        let ours = std::fs::read_to_string(&self.path).is_ok_and(|t| t.lines().nth(1) == Some(self.token.as_str()));
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_and_a_lease_left_unrenewed_is_broken_after_its_stale_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".records.lock");
        let first = take_blocking(&path, Duration::from_secs(60), Duration::ZERO).unwrap();
        let refused = take_blocking(&path, Duration::from_secs(60), Duration::from_millis(50)).err().unwrap();
        assert!(refused.contains("held by") && refused.contains("pid"), "{refused}");
        drop(first);
        assert!(!path.exists(), "given back");
        // A valve that died holding it, on a machine whose clock runs ten
        // minutes ahead: the file stays, never rewritten, dated in the future.
        std::fs::write(&path, content("gone (pid 1)", "dead", 0)).unwrap();
        let ahead = SystemTime::now() + Duration::from_secs(600);
        std::fs::File::options().write(true).open(&path).unwrap().set_modified(ahead).unwrap();
        let started = Instant::now();
        let taken = take_blocking(&path, Duration::from_millis(300), Duration::from_secs(5)).unwrap();
        assert!(started.elapsed() >= Duration::from_millis(300), "not before the stale time");
        assert_ne!(std::fs::read_to_string(&path).unwrap(), content("gone (pid 1)", "dead", 0));
        drop(taken);
        assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none(), "nothing left beside it");
    }

    #[tokio::test]
    async fn a_renewed_lease_is_not_broken_and_a_waiter_is_told_who_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".deploy.lock");
        let mut held = take(&path, Duration::from_secs(1), Duration::ZERO, |_| {}).await.unwrap();
        held.keep_renewed();
        let mut told = String::new();
        let stale = RENEW + Duration::from_millis(1500);
        let waited = take(&path, stale, RENEW * 3, |h| told = h.to_string()).await;
        assert!(waited.is_err(), "a lease renewed every {RENEW:?} outlives a stale time of {stale:?}");
        assert!(told.contains("pid"), "{told}");
        drop(held);
        assert!(take(&path, stale, Duration::ZERO, |_| {}).await.is_ok());
    }
}
