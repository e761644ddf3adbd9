//! The spawner's voice: one line on valve's standard error, in valve's
//! log format (the spawner has no log of its own).

/// Whether valve's log is JSON lines.
static JSON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// One line on valve's standard error in its log's format (the spawner has
/// no log of its own).
pub(super) fn say(what: &str) {
    let json = JSON.get().copied().unwrap_or(false);
    crate::log::early_line(json, "WARN", "valve::spawner", &format!("privileged spawner: {what}"));
}

pub(super) fn log_json(json: bool) {
    let _ = JSON.set(json);
}
