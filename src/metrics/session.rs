//! A Shiny session as metrics and usage see it: its length goes to the
//! app's `valve_shiny_session_duration_seconds` histogram and the session
//! itself to the usage list when it ends.

use std::fmt::Write;
use std::sync::Arc;

use super::family::{header, Histogram, LONG_BUCKETS};

/// How long an app's Shiny sessions lasted.
pub type SessionLength = Histogram<{ LONG_BUCKETS.len() }>;

/// A Shiny session in progress, counted when dropped (the session ended).
pub struct SessionUse {
    length: Arc<SessionLength>,
    usage: crate::usage::Open,
}

impl SessionUse {
    pub(super) fn new(length: Arc<SessionLength>, usage: crate::usage::Open) -> Self {
        SessionUse { length, usage }
    }

    /// Its browser came back after its connection dropped.
    pub fn reconnected(&self) {
        self.usage.reconnected();
    }
}

impl Drop for SessionUse {
    fn drop(&mut self) {
        self.length.observe(self.usage.elapsed());
    }
}

/// Every app's session length histogram, and the usage log's dropped lines.
pub(super) fn render(out: &mut String, apps: &[(&str, &SessionLength)], usage_dropped: u64) {
    let name = "valve_shiny_session_duration_seconds";
    header(
        out,
        name,
        "histogram",
        "How long Shiny sessions lasted, from the WebSocket's opening to the session's end.",
    );
    for (app, length) in apps {
        length.render(out, name, app);
    }
    let name = "valve_usage_log_dropped_total";
    header(out, name, "counter", "Usage log lines dropped because its writer fell behind the disk.");
    let _ = writeln!(out, "{name} {usage_dropped}");
}
