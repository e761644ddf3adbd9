//! A `Sticky`: the Shiny worker a browser's requests go to. Shiny workers are
//! not leased (httpuv serves a worker's many sessions at once); a browser keeps
//! its worker through the `valve_worker` cookie while the worker lives.

use std::sync::Arc;

use tokio::sync::watch;

use super::pool::WorkerId;
use crate::worker::{Connect, Exit};

/// The worker a Shiny request goes to.
pub struct Sticky {
    pub worker: WorkerId,
    pub connector: Arc<dyn Connect>,
    /// The browser had no (live) worker yet: tell it its new one.
    pub new: bool,
    /// The browser's token (in its sticky cookie): its place on the worker
    /// until its session opens.
    pub token: u64,
    /// The worker's exit, once its watcher has seen it.
    pub exit: watch::Receiver<Option<Exit>>,
}
