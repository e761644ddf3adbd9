//! A worker's output: each line becomes a log event carrying the worker's id,
//! and the last few are kept to explain a failed start. Lines are capped, so
//! a worker printing without end cannot grow valve's memory.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Child;

use super::wire::WorkerId;

/// How many of a worker's last output lines are kept to explain a failed start.
const TAIL_LINES: usize = 40;

/// The longest line logged whole; the rest of a longer one is dropped and counted.
pub const MAX_LINE: usize = 16 * 1024;

/// Sees every line a worker prints, beside the log (the app's metrics count
/// R's failed allocations in it).
pub trait Tap: Send + Sync {
    fn line(&self, worker: WorkerId, line: &str);
}

/// The last lines a worker printed, kept to explain why it failed, and
/// whatever taps its lines.
#[derive(Debug, Default)]
pub struct Tail(Mutex<VecDeque<String>>, Option<(std::sync::Arc<dyn Tap>, WorkerId)>);

impl std::fmt::Debug for dyn Tap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tap")
    }
}

impl Tail {
    /// A worker's tail whose lines `tap` sees too.
    pub fn tapped(tap: Option<std::sync::Arc<dyn Tap>>, worker: WorkerId) -> Tail {
        Tail(Mutex::new(VecDeque::new()), tap.map(|t| (t, worker)))
    }

    pub fn push(&self, line: String) {
        if let Some((tap, worker)) = &self.1 {
            tap.line(*worker, &line);
        }
        let mut lines = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if lines.len() == TAIL_LINES {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    pub fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect()
    }
}

/// Logs a plain worker's stdout and stderr.
pub fn forward(child: &mut Child, id: WorkerId, tail: std::sync::Arc<Tail>) {
    let pid = child.id().unwrap_or_default();
    if let Some(out) = child.stdout.take() {
        tokio::spawn(log_lines(out, id, pid, "stdout", tail.clone()));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(log_lines(err, id, pid, "stderr", tail));
    }
}

async fn log_lines(
    stream: impl AsyncRead + Unpin,
    id: WorkerId,
    pid: u32,
    name: &'static str,
    tail: std::sync::Arc<Tail>,
) {
    let mut reader = BufReader::new(stream);
    while let Some(line) = next_line(&mut reader).await {
        tracing::info!(target: "valve::worker::output", worker = id, pid, stream = name, "{line}");
        tail.push(line);
    }
}

/// The next line, at most `MAX_LINE` bytes of it: a longer line is cut and
/// says how much was dropped. `None` at end of stream.
pub async fn next_line(reader: &mut (impl AsyncBufRead + Unpin)) -> Option<String> {
    let mut kept: Vec<u8> = Vec::new();
    let mut dropped: u64 = 0;
    loop {
        let buf = match reader.fill_buf().await {
            Ok(buf) => buf,
            Err(_) => return None,
        };
        if buf.is_empty() {
            return (!kept.is_empty() || dropped > 0).then(|| finish(kept, dropped));
        }
        let (chunk, end) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (&buf[..i], Some(i + 1)),
            None => (buf, None),
        };
        let room = MAX_LINE.saturating_sub(kept.len());
        let take = chunk.len().min(room);
        kept.extend_from_slice(&chunk[..take]);
        dropped += (chunk.len() - take) as u64;
        let consumed = end.unwrap_or(buf.len());
        reader.consume(consumed);
        if end.is_some() {
            return Some(finish(kept, dropped));
        }
    }
}

fn finish(mut kept: Vec<u8>, dropped: u64) -> String {
    if kept.last() == Some(&b'\r') {
        kept.pop();
    }
    let mut line = String::from_utf8_lossy(&kept).into_owned();
    if dropped > 0 {
        line.push_str(&format!(" [line cut: {dropped} more bytes]"));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn long_lines_are_cut_and_say_so() {
        let mut input = vec![b'a'; MAX_LINE + 100];
        input.extend_from_slice(b"\nshort\r\nlast");
        let mut reader = BufReader::with_capacity(1000, &input[..]);
        let first = next_line(&mut reader).await.unwrap();
        assert!(first.starts_with(&"a".repeat(MAX_LINE)));
        assert!(first.ends_with(" [line cut: 100 more bytes]"), "{}", &first[MAX_LINE..]);
        assert_eq!(next_line(&mut reader).await.unwrap(), "short");
        assert_eq!(next_line(&mut reader).await.unwrap(), "last");
        assert_eq!(next_line(&mut reader).await, None);
    }
}
