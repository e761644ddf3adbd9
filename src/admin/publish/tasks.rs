//! Deployment tasks and their logs, as clients follow them: lines said so
//! far (read from line `first` on), finished or not, the exit code and the
//! error. Bounded: at most `MAX_LINES` lines a task (the rest is counted,
//! not kept) and `MAX_TASKS` tasks (the oldest finished ones go first).

use std::collections::BTreeMap;
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
}

/// Every task kept, by id.
#[derive(Default)]
pub struct Tasks {
    inner: Mutex<(u64, BTreeMap<u64, Arc<Task>>)>,
}

impl Tasks {
    /// A new task deploying `app` (the oldest finished one goes when `MAX_TASKS` are kept).
    pub fn start(&self, app: &str) -> Arc<Task> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.0 += 1;
        let id = inner.0;
        if inner.1.len() >= MAX_TASKS {
            let oldest = inner.1.iter().find(|(_, t)| t.finished()).or(inner.1.iter().next()).map(|(id, _)| *id);
            if let Some(old) = oldest {
                inner.1.remove(&old);
            }
        }
        let task = Arc::new(Task { id, app: app.to_string(), ..Task::default() });
        inner.1.insert(id, task.clone());
        task
    }

    pub fn get(&self, id: u64) -> Option<Arc<Task>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).1.get(&id).cloned()
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
        assert_eq!(tasks.inner.lock().unwrap().1.len(), MAX_TASKS);
    }
}
