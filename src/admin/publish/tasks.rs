//! Deployment tasks and their logs, as clients follow them: lines said so
//! far (read from line `first` on), finished or not, the exit code and the
//! error. Bounded: at most `MAX_LINES` lines a task (the rest is counted,
//! not kept) and `MAX_TASKS` tasks (the oldest finished ones go first).
//!
//! Each task's log is also written, line by line, to `publish_dir/.tasks/`
//! (JSON lines: the app, then each line, then how it ended), so that a
//! client publishing through a balancer without affinity reads it from
//! whichever valve sharing `publish_dir` answers; ids are random, never
//! the same on two valves.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

/// Lines kept of one task's log.
pub const MAX_LINES: usize = 2000;

/// Tasks kept.
pub const MAX_TASKS: usize = 200;

/// The longest a client may ask to wait for more lines.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

/// One task: what it said and how it ended.
#[derive(Default)]
pub struct Task {
    pub id: u64,
    /// The published app it deploys.
    pub app: String,
    state: Mutex<State>,
    changed: Notify,
    /// Where its log is written for the other valves (none: nowhere).
    file: Option<PathBuf>,
}

#[derive(Default, Clone)]
struct State {
    lines: Vec<String>,
    dropped: usize,
    finished: bool,
    code: i32,
    error: String,
}

/// A task's log from a line on, as a client reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page {
    pub lines: Vec<String>,
    /// The line to read from next time.
    pub last: usize,
    pub finished: bool,
    pub code: i32,
    pub error: String,
}

impl Task {
    /// Adds a line to the log (and to valve's own log).
    pub fn say(&self, line: impl Into<String>) {
        let line = line.into();
        tracing::info!(target: "valve::publish", task = self.id, line = %line, "deployment");
        let mut s = self.lock();
        if s.lines.len() < MAX_LINES {
            self.append(&serde_json::json!({ "line": line }));
            s.lines.push(line);
        } else {
            s.dropped += 1;
        }
        drop(s);
        self.changed.notify_waiters();
    }

    /// Ends the task: `Ok` (code 0) or the error (code 1), said last.
    pub fn finish(&self, result: Result<String, String>) {
        match &result {
            Ok(line) => self.say(line.clone()),
            Err(error) => self.say(format!("Error: {error}")),
        }
        let mut s = self.lock();
        s.finished = true;
        (s.code, s.error) = match result {
            Ok(_) => (0, String::new()),
            Err(e) => (1, e),
        };
        self.append(&serde_json::json!({ "finished": true, "code": s.code, "error": s.error }));
        drop(s);
        self.changed.notify_waiters();
    }

    pub fn finished(&self) -> bool {
        self.lock().finished
    }

    /// The log from line `first` on; with `wait`, waits (at most
    /// `MAX_WAIT`) until there is a line past `first` or the task is done.
    pub async fn page(&self, first: usize, wait: Duration) -> Page {
        let deadline = tokio::time::Instant::now() + wait.min(MAX_WAIT);
        loop {
            let notified = self.changed.notified();
            {
                let s = self.lock();
                if s.finished || s.lines.len() > first || tokio::time::Instant::now() >= deadline {
                    let from = first.min(s.lines.len());
                    return Page {
                        lines: s.lines[from..].to_vec(),
                        last: s.lines.len(),
                        finished: s.finished,
                        code: s.code,
                        error: s.error.clone(),
                    };
                }
            }
            let _ = tokio::time::timeout_at(deadline, notified).await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One line of the shared log (a failure is logged once and the rest is
    /// kept here only: the client of this valve still reads it all).
    fn append(&self, entry: &serde_json::Value) {
        let Some(file) = &self.file else { return };
        // valve's alone (0600): read through the API by the app's owner and admin keys only.
        let written = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(file)
            .and_then(|mut f| f.write_all(format!("{entry}\n").as_bytes()));
        if let Err(e) = written {
            tracing::warn!(target: "valve::publish", task = self.id, file = %file.display(), error = %e,
                "cannot write a deployment's log where the other valves sharing publish_dir read it");
        }
    }
}

/// A task's log as another valve wrote it: the app, and the page from `first` on.
fn read_shared(file: &Path, first: usize) -> Option<(String, Page)> {
    let text = std::fs::read_to_string(file).ok()?;
    let mut lines = text.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok());
    let app = lines.next()?["app"].as_str()?.to_string();
    let mut page = Page { lines: Vec::new(), last: 0, finished: false, code: 0, error: String::new() };
    for entry in lines {
        if let Some(line) = entry["line"].as_str() {
            if page.last >= first {
                page.lines.push(line.to_string());
            }
            page.last += 1;
        } else if entry["finished"].as_bool() == Some(true) {
            page.finished = true;
            page.code = entry["code"].as_i64().unwrap_or(1) as i32;
            page.error = entry["error"].as_str().unwrap_or_default().to_string();
        }
    }
    Some((app, page))
}

/// Makes every log already in `dir` valve's alone (0600: an older valve
/// wrote them readable by all), following no link.
fn private_logs(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for entry in std::fs::read_dir(dir)?.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_file()) {
            std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o600))?;
        }
    }
    Ok(())
}

/// Every task kept, by id.
#[derive(Default)]
pub struct Tasks {
    inner: Mutex<BTreeMap<u64, Arc<Task>>>,
    /// Where the logs are shared (`publish_dir/.tasks`; none: not shared).
    shared: Option<PathBuf>,
    /// Other valves' tasks read here: what was seen of each, and since when.
    watched: Mutex<std::collections::HashMap<u64, (Seen, std::time::Instant)>>,
}

/// A new task id: random, below 2^53 (a number JSON clients keep exactly), never 0.
fn new_id() -> u64 {
    let mut b = [0u8; 8];
    let _ = rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty());
    (u64::from_le_bytes(b) >> 11).max(1)
}

impl Tasks {
    /// Tasks whose logs are shared in `dir` (made if missing).
    pub fn shared_in(dir: PathBuf) -> Tasks {
        use std::os::unix::fs::PermissionsExt;
        // valve's alone (0700): no app's user lists or reads a deployment's log.
        let made = std::fs::create_dir_all(&dir)
            .and_then(|_| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)))
            .and_then(|_| private_logs(&dir));
        if let Err(e) = made {
            tracing::warn!(target: "valve::publish", dir = %dir.display(), error = %e,
                "cannot make the folder where deployments' logs are shared; other valves will not read them");
        }
        Tasks { inner: Mutex::default(), shared: Some(dir), watched: Mutex::default() }
    }

    /// A new task deploying `app` (the oldest finished one goes when `MAX_TASKS` are kept).
    pub fn start(&self, app: &str) -> Arc<Task> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut id = new_id();
        while inner.contains_key(&id) {
            id = new_id();
        }
        if inner.len() >= MAX_TASKS {
            let oldest = inner.iter().find(|(_, t)| t.finished()).or(inner.iter().next()).map(|(id, _)| *id);
            if let Some(old) = oldest {
                inner.remove(&old);
            }
        }
        let file = self.file_of(id);
        let task = Arc::new(Task { id, app: app.to_string(), file, ..Task::default() });
        task.append(&serde_json::json!({ "app": app, "valve": super::lease::holder_name() }));
        inner.insert(id, task.clone());
        drop(inner);
        if let Some(dir) = &self.shared {
            forget_old(dir);
        }
        task
    }

    pub fn get(&self, id: u64) -> Option<Arc<Task>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).get(&id).cloned()
    }

    /// Where task `id`'s log is shared.
    fn file_of(&self, id: u64) -> Option<PathBuf> {
        self.shared.as_ref().map(|d| d.join(format!("{id}.jsonl")))
    }

    /// The app of a task another valve sharing `publish_dir` runs or ran.
    pub fn shared_app(&self, id: u64) -> Option<String> {
        read_shared(&self.file_of(id)?, usize::MAX).map(|(app, _)| app)
    }

    /// A page of another valve's task, as `Task::page` reads one of this
    /// valve's (a wait looks at the shared log every quarter second). `lease`:
    /// the app's deployment lease. A task unfinished whose log and lease both
    /// stayed unchanged for `ORPHANED` (on this valve's clock: its valve
    /// renews the lease every 2 s while it deploys) was left by a valve that
    /// died: it reads as failed, saying so.
    pub async fn shared_page(&self, id: u64, first: usize, wait: Duration, lease: &Path) -> Option<Page> {
        let file = self.file_of(id)?;
        let deadline = tokio::time::Instant::now() + wait.min(MAX_WAIT);
        loop {
            let (_, mut page) = read_shared(&file, first)?;
            if !page.finished && self.orphaned(id, &file, lease) {
                page.finished = true;
                page.code = 1;
                page.error = format!(
                    "the valve running this deployment stopped before it ended (its log and its lock {} unchanged for {}s): nothing it had not switched changed; publish again",
                    lease.display(),
                    ORPHANED.as_secs()
                );
                page.lines.push(format!("Error: {}", page.error));
                page.last += 1;
            }
            if page.finished || page.last > first || tokio::time::Instant::now() >= deadline {
                return Some(page);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Whether task `id`'s log and lease have both stayed as they are for `ORPHANED`.
    fn orphaned(&self, id: u64, file: &Path, lease: &Path) -> bool {
        let look = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.len(), m.modified().ok()));
        let now = (look(file), look(lease));
        let mut seen = self.watched.lock().unwrap_or_else(|p| p.into_inner());
        if seen.len() >= MAX_TASKS && !seen.contains_key(&id) {
            seen.clear();
        }
        match seen.get(&id) {
            Some((was, since)) if *was == now => since.elapsed() >= ORPHANED,
            _ => {
                seen.insert(id, (now, std::time::Instant::now()));
                false
            }
        }
    }
}

/// A shared task whose log and deployment lease stay unchanged this long
/// was left by a valve that died.
pub const ORPHANED: Duration = Duration::from_secs(15);

/// What a valve saw of another's task: the log's and lease's size and time.
type Seen = (Option<(u64, Option<std::time::SystemTime>)>, Option<(u64, Option<std::time::SystemTime>)>);

/// Keeps the newest `MAX_TASKS` shared logs (by their last change).
fn forget_old(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut logs: Vec<(std::time::SystemTime, PathBuf)> = entries
        .flatten()
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .filter(|(_, p)| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    if logs.len() <= MAX_TASKS {
        return;
    }
    logs.sort();
    for (_, old) in &logs[..logs.len() - MAX_TASKS] {
        let _ = std::fs::remove_file(old);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_log_is_read_from_where_the_client_left_off_and_a_wait_ends_with_a_line() {
        let tasks = Tasks::default();
        let t = tasks.start("api");
        t.say("unpacked");
        t.say("checked");
        let p = t.page(0, Duration::ZERO).await;
        assert_eq!((p.lines.len(), p.last, p.finished), (2, 2, false));
        let p = t.page(2, Duration::ZERO).await;
        assert!(p.lines.is_empty() && p.last == 2, "nothing new");
        let p = t.page(99, Duration::ZERO).await;
        assert_eq!(p.last, 2, "past the end reads nothing");
        let waiter = {
            let t = t.clone();
            tokio::spawn(async move { t.page(2, Duration::from_secs(10)).await })
        };
        tokio::task::yield_now().await;
        t.finish(Err("the package nothere is not installed".into()));
        let p = waiter.await.unwrap();
        assert_eq!(p.lines, ["Error: the package nothere is not installed"]);
        assert_eq!((p.finished, p.code, p.last), (true, 1, 3));
        assert!(p.error.contains("nothere"));
        assert!(Arc::ptr_eq(&tasks.get(t.id).unwrap(), &t));
        assert!(tasks.get(t.id + 1).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn logs_and_tasks_are_bounded() {
        let tasks = Tasks::default();
        let first = tasks.start("api");
        for i in 0..MAX_LINES + 10 {
            first.say(format!("line {i}"));
        }
        assert_eq!(first.page(0, Duration::ZERO).await.last, MAX_LINES);
        first.finish(Ok("done".into()));
        for _ in 0..MAX_TASKS {
            tasks.start("api");
        }
        assert!(tasks.get(first.id).is_none(), "the oldest finished task went");
        assert_eq!(tasks.inner.lock().unwrap().len(), MAX_TASKS);
    }

    #[tokio::test]
    async fn another_valve_reads_a_tasks_log_from_the_shared_folder_and_old_logs_go() {
        let dir = tempfile::tempdir().unwrap();
        let here = Tasks::shared_in(dir.path().join(".tasks"));
        let there = Tasks::shared_in(dir.path().join(".tasks"));
        let t = here.start("api");
        t.say("unpacked");
        assert!(there.get(t.id).is_none(), "not in the other valve's memory");
        assert_eq!(there.shared_app(t.id).as_deref(), Some("api"));
        let lease = dir.path().join("api.lock");
        let p = there.shared_page(t.id, 0, Duration::ZERO, &lease).await.unwrap();
        assert_eq!((p.lines.clone(), p.last, p.finished), (vec!["unpacked".to_string()], 1, false));
        let id = t.id;
        let l = lease.clone();
        let there = Arc::new(there);
        let reader = there.clone();
        let waiter = tokio::spawn(async move { reader.shared_page(id, 1, Duration::from_secs(10), &l).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        t.finish(Err("nothere is not installed".into()));
        let p = waiter.await.unwrap().unwrap();
        assert_eq!(p.lines, ["Error: nothere is not installed"]);
        assert_eq!((p.finished, p.code, p.last), (true, 1, 2));
        for _ in 0..MAX_TASKS + 5 {
            here.start("api");
        }
        let kept = std::fs::read_dir(dir.path().join(".tasks")).unwrap().count();
        assert_eq!(kept, MAX_TASKS, "the oldest shared logs went");
    }
}
