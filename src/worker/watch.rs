//! Watching one serving worker process from the task that owns it: its
//! exit, the stops asked of it (SIGTERM, then SIGKILL after `KILL_AFTER`),
//! and samples of its memory and CPU, read off every lock and handed to an
//! `Observer` (the app's supervisor), which decides what they mean.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use super::process::{cpu_time, Exit, MemoryProbe, Process, Stop};
use super::wire::WorkerId;

/// How long a worker gets between SIGTERM and SIGKILL.
pub const KILL_AFTER: Duration = Duration::from_secs(3);
/// Memory samples after requests are at least this far apart, and at least
/// 50 times as far apart as a sample takes (reading a fork's private memory
/// costs milliseconds).
const SAMPLE_MIN_GAP: Duration = Duration::from_millis(200);

/// Who is told what the samples read.
pub trait Observer: Send + Sync {
    /// The worker's memory, in bytes.
    fn memory(&self, worker: WorkerId, bytes: u64);
    /// The share of one CPU the worker's R ran, or waited to run, between
    /// `since` and `at` (tokio's clock).
    fn cpu(&self, worker: WorkerId, since: Instant, at: Instant, share: f64);
}

/// What to watch a worker for.
pub struct Watch {
    pub worker: WorkerId,
    /// Stops asked of the worker (the supervisor's executor sends them).
    pub stops: watch::Receiver<Option<Stop>>,
    /// Rung when the worker finished a request: its memory is due a sample soon.
    pub used: Arc<Notify>,
    /// How to read its memory, if it can be read.
    pub memory: Option<MemoryProbe>,
    /// Sample memory soon after requests (a memory limit is set), not only every `memory_every`.
    pub memory_after_use: bool,
    pub memory_every: Duration,
    /// Sample its CPU this often (Shiny placement reads it), if at all.
    pub cpu_every: Option<Duration>,
}

/// Watches `process` until it exits, carrying out stops and sampling.
pub async fn serve(process: &mut dyn Process, mut w: Watch, observer: &dyn Observer) -> Exit {
    let cpu_pid = process.pid().filter(|_| w.cpu_every.is_some());
    let mut cpu_tick = tokio::time::interval(w.cpu_every.unwrap_or(Duration::from_secs(1)));
    cpu_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut cpu_last: Option<(Instant, Duration)> = None;
    let mut memory_at: Option<Instant> = None;
    let mut sample_cost = Duration::ZERO;
    let mut next_sample = Instant::now();
    let mut kill_at: Option<Instant> = None;
    let mut stops_open = true;
    loop {
        tokio::select! {
            exit = process.exited() => return exit,
            changed = w.stops.changed(), if stops_open => {
                if changed.is_err() {
                    stops_open = false;
                    continue;
                }
                match *w.stops.borrow_and_update() {
                    Some(Stop::Term) => {
                        process.signal(Stop::Term);
                        kill_at.get_or_insert(Instant::now() + KILL_AFTER);
                    }
                    Some(Stop::Kill) => process.signal(Stop::Kill),
                    None => {}
                }
            }
            _ = tokio::time::sleep_until(kill_at.unwrap_or_else(Instant::now)), if kill_at.is_some() => {
                process.signal(Stop::Kill);
                kill_at = None;
            }
            _ = w.used.notified(), if w.memory_after_use => {
                let gap = SAMPLE_MIN_GAP.max(sample_cost * 50);
                let due = memory_at.map(|t| t + gap).unwrap_or_else(Instant::now);
                next_sample = next_sample.min(due);
            }
            _ = cpu_tick.tick(), if cpu_pid.is_some() => {
                cpu_last = sample_cpu(w.worker, cpu_pid, cpu_last, observer);
            }
            _ = tokio::time::sleep_until(next_sample), if w.memory.is_some() => {
                let began = Instant::now();
                if let Some(probe) = w.memory {
                    if let Ok(Some(bytes)) = tokio::task::spawn_blocking(move || probe.read()).await {
                        observer.memory(w.worker, bytes);
                    }
                }
                sample_cost = began.elapsed();
                memory_at = Some(Instant::now());
                next_sample = Instant::now() + w.memory_every;
            }
        }
    }
}

/// Reads how long the worker's R has run or waited to run (one small /proc
/// file) and reports its share of the time since the last reading. Returns
/// the new last reading.
fn sample_cpu(
    worker: WorkerId,
    pid: Option<u32>,
    last: Option<(Instant, Duration)>,
    observer: &dyn Observer,
) -> Option<(Instant, Duration)> {
    let at = Instant::now();
    let used = cpu_time(pid?)?;
    if let Some((since, before)) = last {
        let wall = at.saturating_duration_since(since);
        if !wall.is_zero() {
            observer.cpu(worker, since, at, used.saturating_sub(before).as_secs_f64() / wall.as_secs_f64());
        }
    }
    Some((at, used))
}
