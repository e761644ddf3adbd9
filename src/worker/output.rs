//! A worker's output: each line becomes a log event carrying the app and the
//! worker's id, goes to the app's output hooks (its log buffer, say), and the
//! last few are kept to explain a failed start. Lines are capped, so a worker
//! printing without end cannot grow valve's memory.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use super::child::Child;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, BufReader};

use super::wire::WorkerId;

/// The worker id of an app's R process that is no worker: the preload
/// parent, or the render of a `shiny_prerendered` document.
pub const NOT_A_WORKER: WorkerId = 0;

/// Which of a process's streams a line came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
    /// A fork's FIFO: what it printed to stdout and stderr, in one stream.
    Output,
}

impl Stream {
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
            Stream::Output => "output",
        }
    }
}

/// Hears every line an app's R processes print, besides valve's log (the
/// app's log buffer, a watch for R's out-of-memory errors). Set on a
/// `Spec` (`Spec::on_output`) by what builds the app's generation. Called
/// on the task that reads the stream, one line at a time: it must return at
/// once (no I/O, no waiting on a lock held across anything slow).
pub trait OutputHook: Send + Sync {
    /// `worker` is `NOT_A_WORKER` for the preload parent and the render;
    /// `pid` is 0 for a fork's lines before it said its pid.
    fn line(&self, worker: WorkerId, pid: u32, stream: Stream, line: &str);
}

/// The output hooks of one app's processes.
#[derive(Clone, Default)]
pub struct Hooks(Vec<Arc<dyn OutputHook>>);

impl Hooks {
    pub fn push(&mut self, hook: Arc<dyn OutputHook>) {
        self.0.push(hook);
    }
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Hooks({})", self.0.len())
    }
}

/// Where one process's lines go: valve's log (with the app, worker, pid and
/// stream), the app's hooks, and the tail kept to explain a failed start.
#[derive(Clone, Debug)]
pub struct Sink {
    pub(super) app: Arc<str>,
    pub(super) worker: WorkerId,
    pub(super) hooks: Hooks,
    pub(super) tail: Arc<Tail>,
}

impl Sink {
    /// Where the lines of a process of `app` go (no output hooks).
    pub(super) fn of(app: &str, worker: WorkerId, tail: Arc<Tail>) -> Sink {
        Sink { app: Arc::from(app), worker, hooks: Hooks::default(), tail }
    }

    pub(super) fn line(&self, pid: u32, stream: Stream, line: String) {
        tracing::info!(target: "valve::worker::output", app = %self.app, worker = self.worker, pid,
            stream = stream.as_str(), "{line}");
        for hook in &self.hooks.0 {
            hook.line(self.worker, pid, stream, &line);
        }
        self.tail.push(line);
    }
}

/// How many of a worker's last output lines are kept to explain a failed start.
const TAIL_LINES: usize = 40;

/// The longest line logged whole; the rest of a longer one is dropped and counted.
pub const MAX_LINE: usize = 16 * 1024;

/// The last lines a worker printed, kept to explain why it failed.
#[derive(Debug, Default)]
pub struct Tail(Mutex<VecDeque<String>>);

impl Tail {
    pub fn push(&self, line: String) {
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

/// Reads a plain process's stdout and stderr into `sink`; returns the readers.
pub fn forward(child: &mut Child, sink: &Sink) -> [Option<tokio::task::JoinHandle<()>>; 2] {
    let pid = child.id().unwrap_or_default();
    [
        child.stdout.take().map(|out| tokio::spawn(read_lines(out, sink.clone(), pid, Stream::Stdout))),
        child.stderr.take().map(|err| tokio::spawn(read_lines(err, sink.clone(), pid, Stream::Stderr))),
    ]
}

async fn read_lines(stream: impl AsyncRead + Unpin, sink: Sink, pid: u32, name: Stream) {
    let mut reader = BufReader::new(stream);
    while let Some(line) = next_line(&mut reader).await {
        sink.line(pid, name, line);
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
