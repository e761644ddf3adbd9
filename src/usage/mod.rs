//! Who used which app, and for how long: each Shiny session (app, user,
//! start, end, worker, reconnects) and each app's requests per user per
//! hour, kept in memory within fixed bounds and, with `usage_log`, appended
//! to a file as JSON lines whose tail is read back when valve starts. With
//! `usage_anonymize` a user is kept as a keyed hash (`mac::Key::persistent`,
//! the key in a 0600 file beside the usage log), so the same user hashes the
//! same across restarts and the name is never written.
//!
//! Rooms: `record` (the records as JSON, CSV and log lines; the times
//! `since=` takes), `file` (the usage log: its writer thread and its tail),
//! `shared` (a folder several valves share: each writes its own file and
//! follows the others', so each reports the whole site's usage).
//!
//! Locking: one std `Mutex`, held to count or copy, never across an
//! `.await` or any I/O (the log's lines go to its writer through a bounded
//! queue).

mod file;
mod record;
mod shared;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use record::{hourly_csv, parse_since, session_csv, Hourly, Session, CSV_HEADER, SINCE_FORMS};
pub use shared::replica_name;

use crate::mac::{Key, KeyFileError};
use crate::worker::WorkerId;
use record::Record;

/// Ended Shiny sessions kept in memory at most (the oldest go first).
pub const MAX_SESSIONS: usize = 20_000;
/// (hour, app, user) request counts kept in memory at most (the oldest hours go first).
pub const MAX_HOURLY: usize = 50_000;

/// How often counts of hours that are over go to the usage log.
const FLUSH_EVERY: Duration = Duration::from_secs(60);

const HOUR_MS: u64 = 3_600_000;

/// How valve keeps usage (top-level settings; a reload does not change them).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Settings {
    /// Where usage is appended as JSON lines (`usage_log`), and read back
    /// from at start; a folder: shared with other valves (`shared`).
    pub log: Option<PathBuf>,
    /// Keep a keyed hash instead of each user (`usage_anonymize`).
    pub anonymize: bool,
    /// This valve's name among those sharing a usage folder (`replica_name`).
    pub replica: String,
}

impl Settings {
    /// The folder shared with other valves, if `usage_log` names one (one
    /// that exists, or a path ending in `/`: made at start).
    pub fn shared_dir(&self) -> Option<&std::path::Path> {
        self.log.as_deref().filter(|p| crate::config::usage_log_is_folder(p))
    }

    /// The file this valve appends to.
    pub fn own_file(&self) -> Option<PathBuf> {
        match self.shared_dir() {
            Some(dir) => Some(shared::own_file(dir, &self.replica)),
            None => self.log.clone(),
        }
    }

    /// Where the anonymizing key is kept: beside the usage log (`PATH.key`),
    /// or in the shared folder (`usage.key`), where every valve reads it, so
    /// a user hashes the same on all.
    pub fn key_path(&self) -> Option<PathBuf> {
        if let Some(dir) = self.shared_dir() {
            return Some(dir.join("usage.key"));
        }
        self.log.as_ref().map(|p| {
            let mut name = p.as_os_str().to_owned();
            name.push(".key");
            PathBuf::from(name)
        })
    }
}

/// Why the usage log could not be opened at start.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot read the usage log {path}: {error} (check usage_log / --usage-log and its permissions)")]
    Read { path: String, error: std::io::Error },
    #[error("usage_anonymize: {0}")]
    Key(#[from] KeyFileError),
    #[error("cannot start the usage log's writer: {0}")]
    Writer(std::io::Error),
}

/// What was read back from the usage log at start.
#[derive(Debug, Default)]
pub struct Opened {
    pub sessions: usize,
    pub hours: usize,
    pub unreadable: usize,
}

/// Every app's usage.
#[derive(Default)]
pub struct Usage {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    sessions: VecDeque<Session>,
    /// Requests by hour, then app, then user ("": nobody signed in).
    hours: BTreeMap<u64, HashMap<String, HashMap<String, Count>>>,
    entries: usize,
    /// The hour of the last request counted: earlier hours are over.
    current: u64,
    writer: Option<file::Writer>,
    key: Option<Key>,
    /// Writes the counts of hours that are over, once a minute.
    flusher: Option<tokio_util::task::AbortOnDropHandle<()>>,
    /// The usage log is a folder shared with other valves: the current
    /// hour's counts are written each minute too, for them to read.
    shared: bool,
    /// Adds what other valves sharing the folder append.
    follower: Option<tokio_util::task::AbortOnDropHandle<()>>,
}

#[derive(Clone, Copy, Default)]
struct Count {
    n: u64,
    /// How many of them are in the usage log already.
    logged: u64,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

impl State {
    fn user(&self, user: Option<&str>) -> Option<String> {
        let user = user?;
        Some(match &self.key {
            Some(key) => format!("anon-{}", key.tag_hex(&[b"valve usage user", user.as_bytes()])),
            None => user.to_string(),
        })
    }

    fn add_session(&mut self, s: Session) {
        if self.sessions.len() == MAX_SESSIONS {
            self.sessions.pop_front();
        }
        self.sessions.push_back(s);
    }

    /// Counts `n` requests, `logged` of them already in the usage log.
    fn count(&mut self, hour: u64, app: &str, user: &str, n: u64, logged: u64) {
        let apps = self.hours.entry(hour).or_default();
        let users = match apps.get_mut(app) {
            Some(users) => users,
            None => apps.entry(app.to_string()).or_default(),
        };
        match users.get_mut(user) {
            Some(c) => {
                c.n += n;
                c.logged += logged;
            }
            None => {
                users.insert(user.to_string(), Count { n, logged });
                self.entries += 1;
            }
        }
        while self.entries > MAX_HOURLY {
            let Some((_, apps)) = self.hours.pop_first() else { break };
            self.entries -= apps.values().map(HashMap::len).sum::<usize>();
        }
    }

    /// A record read back (this valve's, from before, or another's): kept,
    /// and its counts marked as written already.
    fn add(&mut self, record: Record) {
        match record {
            Record::Session(s) => self.add_session(s),
            Record::Hourly(h) => {
                let user = h.user.unwrap_or_default();
                self.count(h.hour, &h.app, &user, h.requests, h.requests);
            }
        }
    }

    /// Writes to the usage log what it lacks of hours before `before`.
    fn flush(&mut self, before: u64) {
        let Some(writer) = &self.writer else { return };
        let mut lines = String::new();
        for (hour, apps) in self.hours.range_mut(..before) {
            for (app, users) in apps.iter_mut() {
                for (user, c) in users.iter_mut().filter(|(_, c)| c.n > c.logged) {
                    let h = Hourly {
                        app: app.clone(),
                        user: (!user.is_empty()).then(|| user.clone()),
                        hour: *hour,
                        requests: c.n - c.logged,
                    };
                    lines.push_str(&h.to_json().to_string());
                    lines.push('\n');
                    c.logged = c.n;
                }
            }
        }
        if !lines.is_empty() {
            writer.write(lines);
        }
    }
}

impl Usage {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies `settings` at start: reads the usage log's tail back, starts
    /// its writer, and makes or reads the anonymizing key. Must be called
    /// inside the tokio runtime.
    pub fn open(self: &Arc<Self>, settings: &Settings) -> Result<Opened, OpenError> {
        let mut opened = Opened::default();
        let key = match (settings.anonymize, settings.key_path()) {
            (false, _) => None,
            (true, Some(path)) => Some(Key::persistent(&path)?),
            // Without a usage log nothing outlives this run, nor does its key.
            (true, None) => Some(Key::random()),
        };
        let mut tail = Vec::new();
        let mut writer = None;
        let mut follower = None;
        if let Some(path) = settings.own_file() {
            let read =
                file::read_tail(&path).map_err(|error| OpenError::Read { path: path.display().to_string(), error })?;
            opened.unreadable = read.unreadable;
            tail = read.records;
            if let Some(dir) = settings.shared_dir() {
                std::fs::create_dir_all(dir)
                    .map_err(|error| OpenError::Read { path: dir.display().to_string(), error })?;
                let mut f = shared::Follower::new(dir, &path);
                let others = f.read_new();
                opened.unreadable += others.unreadable;
                tail.extend(others.records);
                follower = Some(f);
            }
            writer = Some(file::Writer::start(path).map_err(OpenError::Writer)?);
        }
        let mut state = self.lock();
        for record in tail {
            match record {
                Record::Session(_) => opened.sessions += 1,
                Record::Hourly(_) => opened.hours += 1,
            }
            state.add(record);
        }
        state.key = key;
        if writer.is_some() {
            state.writer = writer;
            let usage = Arc::downgrade(self);
            state.flusher = Some(tokio_util::task::AbortOnDropHandle::new(tokio::spawn(flush_every(usage))));
        }
        if let Some(f) = follower {
            state.shared = true;
            let usage = Arc::downgrade(self);
            state.follower = Some(tokio_util::task::AbortOnDropHandle::new(tokio::spawn(follow(usage, f))));
        }
        Ok(opened)
    }

    /// One request to `app` from `user` (None: nobody signed in).
    pub fn request(&self, app: &str, user: Option<&str>) {
        let hour = now_ms() / HOUR_MS;
        let mut state = self.lock();
        let user = state.user(user).unwrap_or_default();
        if hour > state.current {
            state.current = hour;
            state.flush(hour);
        }
        state.count(hour, app, &user, 1, 0);
    }

    /// A Shiny session of `app` on `worker` opened; it is recorded when the
    /// returned guard is dropped (the session ended).
    pub fn open_session(self: &Arc<Self>, app: &str, worker: WorkerId, user: Option<&str>) -> Open {
        let user = self.lock().user(user);
        Open {
            usage: Arc::downgrade(self),
            app: app.to_string(),
            user,
            worker,
            start_ms: now_ms(),
            reconnects: AtomicU32::new(0),
        }
    }

    fn ended(&self, s: Session) {
        let mut state = self.lock();
        if let Some(writer) = &state.writer {
            writer.write(format!("{}\n", s.to_json()));
        }
        state.add_session(s);
    }

    /// The sessions that ended at or after `since_ms` and the request counts
    /// of the hours that ended after it, of `app` or of every app.
    pub fn report(&self, app: Option<&str>, since_ms: Option<u64>) -> (Vec<Session>, Vec<Hourly>) {
        let since = since_ms.unwrap_or(0);
        let state = self.lock();
        let sessions =
            state.sessions.iter().filter(|s| app.is_none_or(|a| s.app == a) && s.end_ms >= since).cloned().collect();
        let mut hours = Vec::new();
        for (hour, apps) in state.hours.range((since / HOUR_MS)..) {
            let mut named: Vec<(&String, &HashMap<String, Count>)> =
                apps.iter().filter(|(a, _)| app.is_none_or(|want| a.as_str() == want)).collect();
            named.sort_by_key(|(a, _)| a.as_str());
            for (a, users) in named {
                let mut users: Vec<(&String, &Count)> = users.iter().collect();
                users.sort_by_key(|(u, _)| u.as_str());
                hours.extend(users.into_iter().map(|(u, c)| Hourly {
                    app: a.clone(),
                    user: (!u.is_empty()).then(|| u.clone()),
                    hour: *hour,
                    requests: c.n,
                }));
            }
        }
        (sessions, hours)
    }

    /// Whether any usage of `app` is kept.
    pub fn knows(&self, app: &str) -> bool {
        let state = self.lock();
        state.sessions.iter().any(|s| s.app == app) || state.hours.values().any(|apps| apps.contains_key(app))
    }

    /// Usage log lines dropped because its writer fell behind.
    pub fn dropped(&self) -> u64 {
        self.lock().writer.as_ref().map_or(0, |w| w.dropped.load(Relaxed))
    }

    /// At exit: writes every count the usage log lacks (the current hour's
    /// too; read back, they add up) and waits for the writer, 2 s at most.
    pub fn close(&self) {
        let mut writer = {
            let mut state = self.lock();
            state.flush(u64::MAX);
            state.flusher = None;
            state.writer.take()
        };
        if let Some(w) = writer.as_mut() {
            w.close(Duration::from_secs(2));
        }
    }
}

async fn flush_every(usage: Weak<Usage>) {
    let mut tick = tokio::time::interval(FLUSH_EVERY);
    loop {
        tick.tick().await;
        let Some(usage) = usage.upgrade() else { return };
        let hour = now_ms() / HOUR_MS;
        let mut state = usage.lock();
        // Shared: the hour in progress too (its lines add up when read).
        let before = if state.shared { u64::MAX } else { hour };
        state.flush(before);
    }
}

/// Adds what the other valves sharing the usage folder append, every
/// `shared::FOLLOW_EVERY` (their files read off the runtime's threads).
async fn follow(usage: Weak<Usage>, follower: shared::Follower) {
    let mut follower = Some(follower);
    loop {
        tokio::time::sleep(shared::FOLLOW_EVERY).await;
        let Some(mut f) = follower.take() else { return };
        let Ok((f, read)) = tokio::task::spawn_blocking(move || {
            let read = f.read_new();
            (f, read)
        })
        .await
        else {
            return;
        };
        follower = Some(f);
        let Some(usage) = usage.upgrade() else { return };
        let mut state = usage.lock();
        for record in read.records {
            state.add(record);
        }
    }
}

/// A Shiny session in progress: recorded when dropped.
pub struct Open {
    usage: Weak<Usage>,
    app: String,
    user: Option<String>,
    worker: WorkerId,
    start_ms: u64,
    reconnects: AtomicU32,
}

impl Open {
    /// Its browser came back after its connection dropped.
    pub fn reconnected(&self) {
        self.reconnects.fetch_add(1, Relaxed);
    }

    /// How long it has lasted so far.
    pub fn elapsed(&self) -> Duration {
        Duration::from_millis(now_ms().saturating_sub(self.start_ms))
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let Some(usage) = self.usage.upgrade() else { return };
        usage.ended(Session {
            app: std::mem::take(&mut self.app),
            user: self.user.take(),
            start_ms: self.start_ms,
            end_ms: now_ms().max(self.start_ms),
            worker: self.worker,
            reconnects: self.reconnects.load(Relaxed),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn usage_is_bounded_written_and_read_back_after_a_restart_with_users_hashed_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let settings = Settings { log: Some(dir.path().join("usage.jsonl")), anonymize: true, replica: "here".into() };
        let usage = Arc::new(Usage::default());
        usage.open(&settings).unwrap();
        {
            let session = usage.open_session("shiny", 4, Some("alice"));
            session.reconnected();
        }
        usage.request("api", Some("alice"));
        usage.request("api", Some("alice"));
        usage.request("api", None);
        let (sessions, hours) = usage.report(None, None);
        let alice = sessions[0].user.clone().unwrap();
        assert!(alice.starts_with("anon-") && !alice.contains("alice"), "{alice}");
        assert_eq!((sessions[0].worker, sessions[0].reconnects), (4, 1));
        assert_eq!(hours.iter().map(|h| (h.user.is_some(), h.requests)).collect::<Vec<_>>(), [(false, 1), (true, 2)]);
        usage.close();
        let text = std::fs::read_to_string(settings.log.as_ref().unwrap()).unwrap();
        assert!(!text.contains("alice"), "the name is never written: {text}");

        // A restart reads it all back, and alice hashes the same.
        let again = Arc::new(Usage::default());
        let opened = again.open(&settings).unwrap();
        assert_eq!((opened.sessions, opened.hours, opened.unreadable), (1, 2, 0));
        again.request("api", Some("alice"));
        let (sessions, hours) = again.report(Some("api"), None);
        assert!(sessions.is_empty(), "only the app asked for");
        assert_eq!(hours.iter().find(|h| h.user.as_deref() == Some(&alice)).map(|h| h.requests), Some(3));
        assert!(again.knows("shiny") && !again.knows("nope"));
        // What was read back is not written again.
        again.close();
        let lines = std::fs::read_to_string(settings.log.as_ref().unwrap()).unwrap().lines().count();
        assert_eq!(lines, 4, "a session, two counts, and the one new request");
    }

    #[test]
    fn memory_stays_within_its_bounds() {
        let usage = Arc::new(Usage::default());
        for i in 0..MAX_SESSIONS + 10 {
            drop(usage.open_session("s", i as u64, None));
        }
        let mut state = usage.lock();
        assert_eq!(state.sessions.len(), MAX_SESSIONS);
        assert_eq!(state.sessions.front().map(|s| s.worker), Some(10), "the oldest went first");
        for i in 0..(MAX_HOURLY + 100) as u64 {
            state.count(i / 1000, "api", &format!("user{i}"), 1, 0);
        }
        assert!(state.entries <= MAX_HOURLY, "{}", state.entries);
        let counted: usize = state.hours.values().flat_map(|a| a.values()).map(HashMap::len).sum();
        assert_eq!(counted, state.entries);
        assert!(!state.hours.contains_key(&0), "the oldest hour went first");
    }

    #[test]
    fn since_and_app_filter_the_report() {
        let usage = Arc::new(Usage::default());
        usage.lock().add_session(Session {
            app: "a".into(),
            user: None,
            start_ms: 1000,
            end_ms: 2000,
            worker: 1,
            reconnects: 0,
        });
        usage.lock().count(0, "a", "", 3, 0);
        usage.lock().count(5, "b", "u", 1, 0);
        assert_eq!(usage.report(None, None).0.len(), 1);
        assert_eq!(usage.report(None, Some(2001)).0.len(), 0);
        assert_eq!(usage.report(None, Some(HOUR_MS)).1.len(), 1, "hour 0 is over before since");
        assert_eq!(usage.report(Some("a"), None).1.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn valves_sharing_a_usage_folder_each_report_the_sites_usage_with_users_hashed_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let settings = |replica: &str| Settings {
            log: Some(dir.path().to_path_buf()),
            anonymize: true,
            replica: replica.to_string(),
        };
        let (a, b) = (Arc::new(Usage::default()), Arc::new(Usage::default()));
        a.open(&settings("a")).unwrap();
        drop(a.open_session("shiny", 1, Some("alice")));
        a.request("api", Some("alice"));
        a.close();
        // b, started after: reads a's file back with its own.
        b.open(&settings("b")).unwrap();
        let (sessions, hours) = b.report(None, None);
        assert_eq!((sessions.len(), hours.len()), (1, 1), "a's usage, on b");
        // b's own, and a's later usage, followed as a goes on.
        b.request("api", Some("alice"));
        let a2 = Arc::new(Usage::default());
        a2.open(&settings("a")).unwrap();
        drop(a2.open_session("shiny", 2, Some("bob")));
        a2.close();
        let mut seen = 0;
        for _ in 0..50 {
            tokio::time::sleep(shared::FOLLOW_EVERY).await;
            std::thread::sleep(Duration::from_millis(20));
            seen = b.report(Some("shiny"), None).0.len();
            if seen == 2 {
                break;
            }
        }
        assert_eq!(seen, 2, "a's second session reached b");
        let (_, hours) = b.report(Some("api"), None);
        assert_eq!(hours.len(), 1, "alice hashes the same on both: one row, {hours:?}");
        assert_eq!(hours[0].requests, 2);
        b.close();
        let mut files: Vec<String> =
            std::fs::read_dir(dir.path()).unwrap().flatten().map(|e| e.file_name().into_string().unwrap()).collect();
        files.sort();
        assert_eq!(files, ["a.jsonl", "b.jsonl", "usage.key"], "each writes only its own");
        assert!(
            !std::fs::read_to_string(dir.path().join("b.jsonl")).unwrap().contains("shiny"),
            "a's records stay a's"
        );
    }
}
