//! valve's log on stderr: `tracing` events with values in fields, as text for
//! people (colour only on a terminal) or one JSON object per line for log
//! collectors. Written by a background thread through a bounded queue: when
//! whatever reads stderr falls behind, lines are dropped and counted
//! (`valve_log_dropped_total`), and request handling never waits for the log.

use std::io::IsTerminal;

use tracing_appender::non_blocking::{ErrorCounter, NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::EnvFilter;

/// Lines queued for stderr at most; beyond, new lines are dropped and counted.
const QUEUED_LINES: usize = 8192;

/// Keeps the log's writer thread alive; dropping it flushes what is queued.
pub struct Log {
    _guard: WorkerGuard,
    pub dropped: ErrorCounter,
}

/// Starts logging to stderr. `VALVE_LOG` (e.g. `debug`) sets the level.
pub fn init(json: bool) -> Log {
    let (writer, guard) =
        NonBlockingBuilder::default().lossy(true).buffered_lines_limit(QUEUED_LINES).finish(std::io::stderr());
    let dropped = writer.error_counter();
    let filter = EnvFilter::try_from_env("VALVE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer);
    if json {
        logs.json().with_current_span(false).init();
    } else {
        let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        logs.with_target(false).with_ansi(colour).init();
    }
    Log { _guard: guard, dropped }
}

/// An error before logging is set up (bad flags): one plain line for people,
/// or one JSON object like the log's own.
pub fn early_error(json: bool, message: &str) {
    if json {
        let line = serde_json::json!({
            "timestamp": humantime_now(),
            "level": "ERROR",
            "fields": { "message": message },
            "target": "valve",
        });
        eprintln!("{line}");
    } else {
        eprintln!("valve: error: {message}");
    }
}

/// Seconds since the epoch with a fraction: good enough for a line logged before the log exists.
fn humantime_now() -> String {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format!("{}.{:06}", d.as_secs(), d.subsec_micros())
}
