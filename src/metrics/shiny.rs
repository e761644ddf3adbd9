//! What Shiny sessions that outlive their connections do (docs/design/shiny-reconnect.md): how
//! often browsers come back to the same session or start a new one, why
//! sessions end, what valve holds for absent browsers, and how long they
//! were away.

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use super::family::{header, Histogram};

/// Why a resumable Shiny session ended (`valve_shiny_sessions_ended_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionEnd {
    /// The browser said goodbye (the page was closed or left).
    Left,
    /// The browser stayed away past the reconnect window.
    Window,
    /// The session's buffer passed its bound while the browser was away.
    Overflow,
    /// The worker's socket closed or broke (the R session ended, or its process died).
    Worker,
    /// The browser broke the protocol (a gap, a bad acknowledgement).
    Protocol,
    /// valve was shutting down.
    Shutdown,
}

impl SessionEnd {
    const ALL: [SessionEnd; 6] = [
        SessionEnd::Left,
        SessionEnd::Window,
        SessionEnd::Overflow,
        SessionEnd::Worker,
        SessionEnd::Protocol,
        SessionEnd::Shutdown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SessionEnd::Left => "left",
            SessionEnd::Window => "window",
            SessionEnd::Overflow => "overflow",
            SessionEnd::Worker => "worker",
            SessionEnd::Protocol => "protocol",
            SessionEnd::Shutdown => "shutdown",
        }
    }
}

/// One app's reconnect counters.
pub struct Reconnects {
    dropped: AtomicU64,
    resumed: AtomicU64,
    restarted: AtomicU64,
    refused: AtomicU64,
    overflowed: AtomicU64,
    ended: [AtomicU64; SessionEnd::ALL.len()],
    /// Bytes held now for browsers (unacknowledged messages).
    buffered: AtomicI64,
    pub disconnected: Histogram,
}

impl Reconnects {
    pub(super) fn new() -> Self {
        Reconnects {
            dropped: AtomicU64::new(0),
            resumed: AtomicU64::new(0),
            restarted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            overflowed: AtomicU64::new(0),
            ended: Default::default(),
            buffered: AtomicI64::new(0),
            disconnected: Histogram::new(),
        }
    }

    /// A browser's connection to its session dropped.
    pub fn dropped(&self) {
        self.dropped.fetch_add(1, Relaxed);
    }

    /// A browser came back to its session after `away`.
    pub fn resumed(&self, away: Duration) {
        self.resumed.fetch_add(1, Relaxed);
        self.disconnected.observe(away);
    }

    /// A browser whose session was gone started a new one with its inputs.
    pub fn restarted(&self) {
        self.restarted.fetch_add(1, Relaxed);
    }

    /// A resume was refused (unknown session, wrong secret, another app's).
    pub fn refused(&self) {
        self.refused.fetch_add(1, Relaxed);
    }

    /// A session's buffer passed its bound.
    pub fn overflowed(&self) {
        self.overflowed.fetch_add(1, Relaxed);
    }

    /// A session ended; `away` if its browser was absent then.
    pub fn ended(&self, why: SessionEnd, away: Option<Duration>) {
        self.ended[why as usize].fetch_add(1, Relaxed);
        if let Some(away) = away {
            self.disconnected.observe(away);
        }
    }

    /// Bytes now held for browsers grew (or, negative, shrank) by `delta`.
    pub fn buffered(&self, delta: i64) {
        self.buffered.fetch_add(delta, Relaxed);
    }
}

/// A counter's name, help and where it is kept.
type Counter = (&'static str, &'static str, fn(&Reconnects) -> &AtomicU64);

/// Renders every app's reconnect metrics.
pub(super) fn render(out: &mut String, apps: &[(&str, &Reconnects)]) {
    let counters: [Counter; 5] = [
        (
            "valve_shiny_connections_dropped_total",
            "Browser connections to a resumable Shiny session that dropped.",
            |r| &r.dropped,
        ),
        ("valve_shiny_sessions_resumed_total", "Browsers that came back to the same Shiny session.", |r| &r.resumed),
        (
            "valve_shiny_sessions_restarted_total",
            "New Shiny sessions a browser started, with its inputs, because its session was gone.",
            |r| &r.restarted,
        ),
        (
            "valve_shiny_resumes_refused_total",
            "Resumes refused: unknown or ended session, wrong secret, another app's session.",
            |r| &r.refused,
        ),
        ("valve_shiny_buffer_overflows_total", "Times a session's buffer for its browser passed its bound.", |r| {
            &r.overflowed
        }),
    ];
    for (name, help, field) in counters {
        header(out, name, "counter", help);
        for (app, r) in apps {
            let _ = writeln!(out, "{name}{{app=\"{app}\"}} {}", field(r).load(Relaxed));
        }
    }
    header(out, "valve_shiny_sessions_ended_total", "counter", "Resumable Shiny sessions that ended, by why.");
    for (name, r) in apps {
        for why in SessionEnd::ALL {
            let n = r.ended[why as usize].load(Relaxed);
            let _ =
                writeln!(out, "valve_shiny_sessions_ended_total{{app=\"{}\",reason=\"{}\"}} {n}", name, why.as_str());
        }
    }
    header(out, "valve_shiny_buffered_bytes", "gauge", "Bytes valve holds for browsers (sent, not yet acknowledged).");
    for (name, r) in apps {
        let _ = writeln!(out, "valve_shiny_buffered_bytes{{app=\"{}\"}} {}", name, r.buffered.load(Relaxed).max(0));
    }
    header(
        out,
        "valve_shiny_disconnected_seconds",
        "histogram",
        "How long browsers were away from their Shiny session (until they came back or it ended).",
    );
    for (name, r) in apps {
        r.disconnected.render(out, "valve_shiny_disconnected_seconds", name);
    }
}
