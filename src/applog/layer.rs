//! valve's own lines about an app, into that app's log: a tracing layer that
//! takes every event carrying an `app` field (a worker started, exited or
//! was retired, a start failed, the app was reloaded) and adds it, with its
//! other fields, to the app's buffer. The access log (one line per request)
//! and R's output (which the app's output hook already added) are left out.
//! Installed beside valve's log (`log::init`) with its own level filter, so
//! `VALVE_LOG=warn` quiets stderr, not the apps' logs.

use std::fmt::Write;
use std::sync::Arc;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::Context;

use super::{Logs, Origin};

/// Routes events about an app to its log.
pub struct Layer {
    logs: Arc<Logs>,
}

impl Layer {
    pub fn new(logs: Arc<Logs>) -> Self {
        Layer { logs }
    }

    /// The layer for `log::init`: events at INFO and above, whatever `VALVE_LOG` says.
    pub fn beside_the_log(logs: Arc<Logs>) -> crate::log::Extra {
        use tracing_subscriber::Layer as _;
        Box::new(Layer::new(logs).with_filter(tracing_subscriber::filter::LevelFilter::INFO))
    }
}

/// Targets whose events never go to an app's log.
const LEFT_OUT: [&str; 2] = ["valve::access", "valve::worker::output"];

impl<S: Subscriber> tracing_subscriber::Layer<S> for Layer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        if LEFT_OUT.contains(&meta.target()) {
            return;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        let Some(app) = fields.app.as_deref() else { return };
        let Some(log) = self.logs.get(app) else { return };
        let level = match *meta.level() {
            Level::ERROR => "ERROR",
            Level::WARN => "WARN",
            Level::INFO => "INFO",
            Level::DEBUG => "DEBUG",
            Level::TRACE => "TRACE",
        };
        log.push(fields.worker, fields.pid, Origin::Valve(level), &fields.text());
    }
}

/// An event's fields: the app and worker it is about, its message, the rest as `key=value`.
#[derive(Default)]
struct Fields {
    app: Option<String>,
    worker: Option<u64>,
    pid: Option<u32>,
    message: String,
    rest: String,
}

impl Fields {
    fn text(&self) -> String {
        format!("{}{}", self.message, self.rest)
    }

    fn number(&mut self, field: &Field, value: u64) -> bool {
        match field.name() {
            "worker" => self.worker = Some(value),
            "pid" => self.pid = u32::try_from(value).ok(),
            _ => return false,
        }
        // The worker and pid are also shown, as in valve's log.
        let _ = write!(self.rest, " {}={value}", field.name());
        true
    }
}

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if !self.number(field, value) {
            let _ = write!(self.rest, " {}={value}", field.name());
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        match u64::try_from(value) {
            Ok(v) => self.record_u64(field, v),
            Err(_) => {
                let _ = write!(self.rest, " {}={value}", field.name());
            }
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "app" => self.app = Some(value.to_string()),
            "message" => self.message = value.to_string(),
            name => {
                let _ = write!(self.rest, " {name}={value:?}");
            }
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            // `app = %name` arrives here, as its Display.
            "app" => self.app = Some(format!("{value:?}")),
            "message" => self.message = format!("{value:?}"),
            name => {
                let _ = write!(self.rest, " {name}={value:?}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::prelude::*;

    #[test]
    fn events_about_an_app_go_to_its_log_and_nothing_else_does() {
        let logs = Arc::new(Logs::default());
        let api = logs.app("api", 1 << 20);
        let shiny = logs.app("shiny", 1 << 20);
        let subscriber = tracing_subscriber::registry().with(Layer::new(logs.clone()));
        tracing::subscriber::with_default(subscriber, || {
            let name = "api".to_string();
            tracing::warn!(app = %name, worker = 3u64, pid = 77u32, status = "exit code 1", "worker exited");
            tracing::info!(app = "shiny", "reloaded");
            tracing::info!(app = "nobody", "an app without a log");
            tracing::info!(worker = 3u64, "no app named");
            tracing::info!(target: "valve::access", app = "api", path = "/x", "request");
            tracing::info!(target: "valve::worker::output", app = "api", worker = 3u64, "R's own line");
        });
        let lines = api.read(1, None, usize::MAX).lines;
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert_eq!(lines[0].text, "worker exited worker=3 pid=77 status=\"exit code 1\"");
        assert_eq!((lines[0].worker, lines[0].pid, lines[0].origin), (Some(3), Some(77), Origin::Valve("WARN")));
        let lines = shiny.read(1, None, usize::MAX).lines;
        assert_eq!(lines.iter().map(|l| l.text.as_str()).collect::<Vec<_>>(), ["reloaded"]);
    }
}
