//! The usage log (`usage_log = "PATH"`): JSON lines appended by a thread of
//! its own through a bounded queue (a full queue drops the line and counts
//! it; nothing on a request's path waits for the disk), and its tail read
//! back when valve starts. The file is opened again for each batch of
//! lines, so moving it away (log rotation) needs no signal.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use super::record::{parse_line, Record};

/// The most of a usage log read back at start: its last 8 MiB.
pub const TAIL_BYTES: u64 = 8 << 20;

/// Lines waiting for the writer at most; beyond, lines are dropped and counted.
const QUEUED: usize = 4096;

/// What the tail of a usage log held.
#[derive(Debug, Default)]
pub struct Tail {
    pub records: Vec<Record>,
    /// Lines that were not usage records (cut, edited by hand).
    pub unreadable: usize,
}

/// Reads the records in the last `TAIL_BYTES` of `path` (none if it does not exist yet).
pub fn read_tail(path: &Path) -> std::io::Result<Tail> {
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Tail::default()),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    let from = len.saturating_sub(TAIL_BYTES);
    file.seek(SeekFrom::Start(from))?;
    let mut bytes = Vec::with_capacity((len - from) as usize);
    file.read_to_end(&mut bytes)?;
    let text = String::from_utf8_lossy(&bytes);
    // Started mid-file: the first line is a piece of one.
    let whole = if from > 0 { text.split_once('\n').map_or("", |(_, rest)| rest) } else { &text };
    let mut tail = Tail::default();
    for line in whole.lines().filter(|l| !l.trim().is_empty()) {
        match parse_line(line) {
            Some(r) => tail.records.push(r),
            None => tail.unreadable += 1,
        }
    }
    Ok(tail)
}

/// Reads the whole lines of `path` from byte `from` on (`cut`: `from` may
/// fall inside a line, whose rest is skipped): the records, and where the
/// next read starts (past the last whole line; a line being written stays
/// for the next read).
pub fn read_from(path: &Path, from: u64, cut: bool) -> std::io::Result<(Tail, u64)> {
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    let from = if from > len { 0 } else { from };
    file.seek(SeekFrom::Start(from))?;
    let mut bytes = Vec::with_capacity((len - from).min(TAIL_BYTES) as usize);
    file.take(len - from).read_to_end(&mut bytes)?;
    let Some(last) = bytes.iter().rposition(|b| *b == b'\n') else { return Ok((Tail::default(), from)) };
    let text = String::from_utf8_lossy(&bytes[..=last]);
    let whole = if cut && from > 0 { text.split_once('\n').map_or("", |(_, rest)| rest) } else { &text };
    let mut tail = Tail::default();
    for line in whole.lines().filter(|l| !l.trim().is_empty()) {
        match parse_line(line) {
            Some(r) => tail.records.push(r),
            None => tail.unreadable += 1,
        }
    }
    Ok((tail, from + last as u64 + 1))
}

/// Appends lines to the usage log from its own thread.
pub struct Writer {
    tx: Option<mpsc::SyncSender<String>>,
    done: mpsc::Receiver<()>,
    pub dropped: Arc<AtomicU64>,
}

impl Writer {
    /// Starts the writer thread for `path`.
    pub fn start(path: PathBuf) -> std::io::Result<Writer> {
        let (tx, rx) = mpsc::sync_channel::<String>(QUEUED);
        let (done_tx, done) = mpsc::channel();
        std::thread::Builder::new().name("valve-usage-log".into()).spawn(move || {
            let mut failing = false;
            while let Ok(first) = rx.recv() {
                let mut batch = first;
                while let Ok(more) = rx.try_recv() {
                    batch.push_str(&more);
                }
                let written = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .and_then(|mut f| f.write_all(batch.as_bytes()));
                match written {
                    Err(e) if !failing => {
                        tracing::error!(path = %path.display(), error = %e, "cannot append to the usage log; usage is kept in memory only until it can");
                        failing = true;
                    }
                    Ok(()) if failing => {
                        tracing::info!(path = %path.display(), "the usage log is written again");
                        failing = false;
                    }
                    _ => {}
                }
            }
            let _ = done_tx.send(());
        })?;
        Ok(Writer { tx: Some(tx), done, dropped: Arc::new(AtomicU64::new(0)) })
    }

    /// Queues one line (with its newline); never waits.
    pub fn write(&self, line: String) {
        let Some(tx) = &self.tx else { return };
        if tx.try_send(line).is_err() && self.dropped.fetch_add(1, Relaxed).is_multiple_of(1000) {
            tracing::warn!(
                dropped = self.dropped.load(Relaxed),
                "the usage log's writer falls behind; usage lines dropped"
            );
        }
    }

    /// Writes what is queued and stops, waiting `wait` at most.
    pub fn close(&mut self, wait: Duration) {
        if self.tx.take().is_some() {
            let _ = self.done.recv_timeout(wait);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::record::{Hourly, Session};

    #[test]
    fn lines_written_are_read_back_and_only_the_tail_of_a_big_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage.jsonl");
        let mut w = Writer::start(path.clone()).unwrap();
        let s = Session { app: "a".into(), user: None, start_ms: 1000, end_ms: 5000, worker: 1, reconnects: 0 };
        w.write(format!("{}\n", s.to_json()));
        w.write("garbage\n".into());
        w.close(Duration::from_secs(5));
        let tail = read_tail(&path).unwrap();
        assert_eq!((tail.records, tail.unreadable), (vec![Record::Session(s)], 1));
        assert_eq!(read_tail(&dir.path().join("none")).unwrap().records, vec![]);

        // Past TAIL_BYTES, only the end is read, from its first whole line.
        let h = Hourly { app: "a".into(), user: Some("u".into()), hour: 5, requests: 1 };
        let line = format!("{}\n", h.to_json());
        let count = (TAIL_BYTES as usize / line.len()) * 2;
        std::fs::write(&path, line.repeat(count)).unwrap();
        let tail = read_tail(&path).unwrap();
        assert_eq!(tail.unreadable, 0, "a cut first line is skipped, not counted");
        assert!(tail.records.len() < count / 2 + 1 && tail.records.len() > count / 2 - 2, "{}", tail.records.len());
    }
}
