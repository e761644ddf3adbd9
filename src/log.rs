//! valve's log on stderr: `tracing` events with values in fields, as text for
//! people (colour only on a terminal) or one JSON object per line for log
//! collectors. Written by a background thread through a bounded queue: when
//! whatever reads stderr falls behind, lines are dropped and counted
//! (`valve_log_dropped_total`), and request handling never waits for the log.
//! Beside it, another layer may take events too (the apps' logs), with its
//! own filter. Also: times as the logs show them (`utc`).

use std::io::IsTerminal;

use tracing_appender::non_blocking::{ErrorCounter, NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::prelude::*;
use tracing_subscriber::{EnvFilter, Registry};

/// A layer that takes events beside valve's log, filtered on its own.
pub type Extra = Box<dyn tracing_subscriber::Layer<Registry> + Send + Sync>;

/// Lines queued for stderr at most; beyond, new lines are dropped and counted.
const QUEUED_LINES: usize = 8192;

/// Keeps the log's writer thread alive; dropping it flushes what is queued.
pub struct Log {
    _guard: WorkerGuard,
    pub dropped: ErrorCounter,
}

/// Starts logging to stderr (and to `extra`). `VALVE_LOG` (e.g. `debug`)
/// sets stderr's level.
pub fn init(json: bool, extra: Option<Extra>) -> Log {
    let (writer, guard) =
        NonBlockingBuilder::default().lossy(true).buffered_lines_limit(QUEUED_LINES).finish(std::io::stderr());
    let dropped = writer.error_counter();
    let filter = EnvFilter::try_from_env("VALVE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt::layer().with_writer(writer);
    let logs: Extra = if json {
        logs.json().with_current_span(false).boxed()
    } else {
        let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        logs.with_target(false).with_ansi(colour).boxed()
    };
    let mut layers = vec![logs.with_filter(filter).boxed()];
    layers.extend(extra);
    tracing_subscriber::registry().with(layers).init();
    Log { _guard: guard, dropped }
}

/// A Unix time in milliseconds as RFC 3339 in UTC: `2025-05-01T10:00:00.123Z`.
pub fn utc(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let s = secs % 86_400;
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z", s / 3600, s / 60 % 60, s % 60, unix_ms % 1000)
}

/// The date of a day counted from 1970-01-01 (Howard Hinnant's algorithm).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// The day counted from 1970-01-01 of a date (the inverse of `civil_from_days`).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = i64::from(if m > 2 { m - 3 } else { m + 9 });
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// An error before logging is set up (bad flags): one plain line for people,
/// or one JSON object like the log's own.
pub fn early_error(json: bool, message: &str) {
    early_line(json, "ERROR", "valve", message);
}

/// A line in valve's log format, written straight to standard error by a
/// process without the log (the privileged spawner): `level` as tracing
/// says it, from `target`.
pub fn early_line(json: bool, level: &str, target: &str, message: &str) {
    if json {
        let line = serde_json::json!({
            "timestamp": humantime_now(),
            "level": level,
            "fields": { "message": message },
            "target": target,
        });
        eprintln!("{line}");
    } else {
        eprintln!("valve: {}: {message}", level.to_lowercase());
    }
}

/// Seconds since the epoch with a fraction: good enough for a line logged before the log exists.
fn humantime_now() -> String {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format!("{}.{:06}", d.as_secs(), d.subsec_micros())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_in_utc_and_dates_round_trip() {
        assert_eq!(utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc(1_709_251_199_999), "2024-02-29T23:59:59.999Z");
        assert_eq!(utc(951_868_800_000), "2000-03-01T00:00:00.000Z");
        for days in [-1_000_000, -1, 0, 59, 11_016, 19_782, 2_932_896] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days, "{y}-{m}-{d}");
        }
    }
}
