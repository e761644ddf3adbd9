//! One app's log: a ring of lines bounded in bytes. Each line gets the next
//! sequence number; a reader asks for the lines from a number on and learns
//! how many it missed (the ring let them go before it read them), so a
//! follower holds a number, never a queue, and a slow one costs nothing.
//!
//! Locking: one std `Mutex` per app, held to push a line or copy a batch
//! out, never across an `.await`. New lines are announced on a `watch`
//! channel (the last sequence number), which never blocks the writer.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

use crate::worker::{OutputHook, Stream, WorkerId};

/// What a line costs beside its text (its number, time, worker, the ring's slot).
const OVERHEAD: usize = 96;

/// Where a line came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// What an R process printed.
    R(Stream),
    /// valve's own line about the app, with its level (`INFO`, `WARN`, `ERROR`).
    Valve(&'static str),
}

/// One line of an app's log.
#[derive(Clone, Debug)]
pub struct Line {
    pub seq: u64,
    pub unix_ms: u64,
    /// The worker it is about (for valve's lines, when the event named one);
    /// 0 for the preload parent and a document's render.
    pub worker: Option<WorkerId>,
    pub pid: Option<u32>,
    pub origin: Origin,
    pub text: String,
}

impl Line {
    fn cost(&self) -> usize {
        self.text.len() + OVERHEAD
    }

    /// `2025-05-01T10:00:00.123Z [worker 3 stderr] text`, or `[valve WARN]` for valve's own.
    pub fn to_text(&self) -> String {
        let time = crate::log::utc(self.unix_ms);
        match self.origin {
            Origin::R(stream) => {
                let worker = self.worker.map(|w| format!("worker {w}")).unwrap_or_else(|| "worker ?".into());
                format!("{time} [{worker} {}] {}", stream.as_str(), self.text)
            }
            Origin::Valve(level) => format!("{time} [valve {level}] {}", self.text),
        }
    }

    /// `{"seq", "time", "worker", "pid", "stream", "level", "text"}`; `stream`
    /// is `stdout`, `stderr`, `output` (a fork) or `valve`.
    pub fn to_json(&self) -> serde_json::Value {
        let (stream, level) = match self.origin {
            Origin::R(stream) => (stream.as_str(), None),
            Origin::Valve(level) => ("valve", Some(level)),
        };
        serde_json::json!({
            "seq": self.seq,
            "time": crate::log::utc(self.unix_ms),
            "worker": self.worker,
            "pid": self.pid,
            "stream": stream,
            "level": level,
            "text": self.text,
        })
    }
}

/// Lines read from a log, and where the next read starts.
#[derive(Debug, Default)]
pub struct Batch {
    pub lines: Vec<Line>,
    /// Lines the ring let go between the number asked for and its oldest line.
    pub missed: u64,
    /// The number to ask for next.
    pub next: u64,
    /// More lines wait past this batch.
    pub more: bool,
}

struct Ring {
    lines: VecDeque<Line>,
    bytes: usize,
    bound: usize,
    /// The next line's number; the first line is 1.
    next: u64,
}

impl Ring {
    fn fit(&mut self, room: usize) {
        while self.bytes + room > self.bound {
            match self.lines.pop_front() {
                Some(old) => self.bytes -= old.cost(),
                None => break,
            }
        }
    }
}

/// One app's log.
pub struct AppLog {
    ring: Mutex<Ring>,
    latest: watch::Sender<u64>,
}

impl std::fmt::Debug for AppLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppLog").finish_non_exhaustive()
    }
}

impl AppLog {
    /// A log that keeps at most `bound` bytes (0: none).
    pub fn new(bound: usize) -> Self {
        AppLog {
            ring: Mutex::new(Ring { lines: VecDeque::new(), bytes: 0, bound, next: 1 }),
            latest: watch::channel(0).0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Changes the bound; the oldest lines go until the rest fit.
    pub fn set_bound(&self, bound: usize) {
        let mut ring = self.lock();
        ring.bound = bound;
        ring.fit(0);
    }

    /// The bytes kept now and the most that may be.
    pub fn size(&self) -> (usize, usize) {
        let ring = self.lock();
        (ring.bytes, ring.bound)
    }

    /// Adds a line (cut to what the bound can hold), letting the oldest go.
    pub fn push(&self, worker: Option<WorkerId>, pid: Option<u32>, origin: Origin, text: &str) {
        let unix_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
        let seq = {
            let mut ring = self.lock();
            let Some(room) = ring.bound.checked_sub(OVERHEAD).filter(|r| *r > 0) else { return };
            let text = cut(text, room).to_string();
            let line = Line { seq: ring.next, unix_ms, worker, pid, origin, text };
            ring.fit(line.cost());
            ring.bytes += line.cost();
            ring.next += 1;
            let seq = line.seq;
            ring.lines.push_back(line);
            seq
        };
        self.latest.send_replace(seq);
    }

    /// Up to `max_bytes` of text from line `from` on (1: the oldest kept),
    /// only worker `worker`'s if given (valve's lines about it included).
    pub fn read(&self, from: u64, worker: Option<WorkerId>, max_bytes: usize) -> Batch {
        let ring = self.lock();
        let first = ring.lines.front().map_or(ring.next, |l| l.seq);
        let start = from.max(first);
        let mut batch = Batch { missed: first.saturating_sub(from.max(1)), next: start, ..Batch::default() };
        let mut taken = 0;
        let skip = usize::try_from(start - first).unwrap_or(usize::MAX);
        for line in ring.lines.iter().skip(skip) {
            if taken >= max_bytes {
                batch.more = true;
                break;
            }
            batch.next = line.seq + 1;
            if worker.is_some_and(|w| line.worker != Some(w)) {
                continue;
            }
            taken += line.text.len();
            batch.lines.push(line.clone());
        }
        batch
    }

    /// The number the next line will get (to follow only what comes next).
    pub fn next_seq(&self) -> u64 {
        self.lock().next
    }

    /// Changes whenever a line is added.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.latest.subscribe()
    }

    /// Readers following the log now.
    pub fn followers(&self) -> usize {
        self.latest.receiver_count()
    }
}

/// `text` cut to at most `max` bytes, at a character's boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The app's R output goes to its log.
impl OutputHook for AppLog {
    fn line(&self, worker: WorkerId, pid: u32, stream: Stream, line: &str) {
        self.push(Some(worker), (pid != 0).then_some(pid), Origin::R(stream), line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(batch: &Batch) -> Vec<&str> {
        batch.lines.iter().map(|l| l.text.as_str()).collect()
    }

    #[test]
    fn the_ring_keeps_its_bound_in_bytes_and_a_reader_learns_what_it_missed() {
        let log = AppLog::new(10 * (OVERHEAD + 10));
        for i in 0..1000 {
            log.line(1 + i % 2, 42, Stream::Stderr, &format!("line {i:5}"));
        }
        let (bytes, bound) = log.size();
        assert!(bytes <= bound, "{bytes} > {bound}");
        let all = log.read(1, None, usize::MAX);
        assert_eq!(all.lines.len(), 10, "ten lines of 10 bytes fit");
        assert_eq!(texts(&all)[9], "line   999");
        assert_eq!(all.missed, 990, "the 990 first lines went before this reader came");
        assert_eq!(all.next, 1001);

        // A follower reading from where it was: nothing missed, nothing new.
        let none = log.read(all.next, None, usize::MAX);
        assert_eq!((none.lines.len(), none.missed, none.next), (0, 0, 1001));
        // One worker's lines only; the count of missed lines still counts them all.
        let one = log.read(995, Some(2), usize::MAX);
        assert_eq!(texts(&one), ["line   995", "line   997", "line   999"]);
        // Batches: a reader takes at most max_bytes and is told more wait.
        let first = log.read(991, None, 25);
        assert_eq!((first.lines.len(), first.more), (3, true));
        let rest = log.read(first.next, None, usize::MAX);
        assert_eq!((rest.lines.len(), rest.more, rest.missed), (7, false, 0));
    }

    #[test]
    fn a_long_line_is_cut_to_the_bound_a_smaller_bound_drops_the_oldest_and_zero_keeps_nothing() {
        let log = AppLog::new(OVERHEAD + 100);
        log.push(None, None, Origin::Valve("INFO"), &"é".repeat(200));
        let line = &log.read(1, None, usize::MAX).lines[0];
        assert!(line.text.len() <= 100 && line.text.chars().all(|c| c == 'é'), "{}", line.text.len());
        let log = AppLog::new(4 * (OVERHEAD + 1));
        for c in ["a", "b", "c", "d"] {
            log.push(Some(1), None, Origin::R(Stream::Stdout), c);
        }
        log.set_bound(2 * (OVERHEAD + 1));
        assert_eq!(texts(&log.read(1, None, usize::MAX)), ["c", "d"]);
        log.set_bound(0);
        log.push(Some(1), None, Origin::R(Stream::Stdout), "e");
        assert_eq!(log.read(1, None, usize::MAX).lines.len(), 0);
    }

    #[test]
    fn lines_render_as_text_and_json() {
        let log = AppLog::new(1 << 20);
        log.line(3, 99, Stream::Stderr, "Error in f(): boom");
        log.push(Some(3), Some(99), Origin::Valve("WARN"), "worker exited status=\"exit code 1\"");
        let lines = log.read(1, None, usize::MAX).lines;
        let text = lines[0].to_text();
        assert!(text.ends_with("Z [worker 3 stderr] Error in f(): boom"), "{text}");
        assert!(lines[1].to_text().contains("[valve WARN] worker exited"));
        let json = lines[0].to_json();
        assert_eq!(
            (json["worker"].as_u64(), json["pid"].as_u64(), json["stream"].as_str()),
            (Some(3), Some(99), Some("stderr"))
        );
        assert_eq!(lines[1].to_json()["level"], "WARN");
    }

    #[tokio::test]
    async fn a_push_wakes_followers() {
        let log = AppLog::new(1 << 20);
        let mut rx = log.subscribe();
        rx.borrow_and_update();
        log.push(None, None, Origin::Valve("INFO"), "hello");
        tokio::time::timeout(std::time::Duration::from_secs(1), rx.changed()).await.unwrap().unwrap();
        assert_eq!(*rx.borrow(), 1);
    }
}
