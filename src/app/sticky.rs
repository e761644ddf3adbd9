//! A `Sticky`: the Shiny worker a browser's requests go to. Shiny workers are
//! not leased (httpuv serves a worker's many sessions at once); a browser keeps
//! its worker through the `valve_worker` cookie while the worker lives.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::pool::WorkerId;
use crate::worker::{AnswerBody, Conn, Connect, Exit, SendError, WireBody};

/// The worker a Shiny request goes to, and the connection it goes on.
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
    conn: Option<Conn>,
    refused: bool,
    /// Tells the pool the request is done (when the `Sticky` is dropped).
    done: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl Drop for Sticky {
    fn drop(&mut self) {
        if let Some(done) = self.done.take() {
            done();
        }
    }
}

impl Sticky {
    pub(super) fn new(
        worker: WorkerId,
        connector: Arc<dyn Connect>,
        new: bool,
        token: u64,
        exit: watch::Receiver<Option<Exit>>,
        done: Box<dyn FnOnce() + Send + Sync>,
    ) -> Self {
        Sticky { worker, connector, new, token, exit, conn: None, refused: false, done: Some(done) }
    }

    /// A fresh connection to the worker (`upgradable` for a WebSocket).
    pub async fn connect(&mut self, upgradable: bool) -> std::io::Result<()> {
        match self.connector.connect(upgradable).await {
            Ok(conn) => {
                self.conn = Some(conn);
                Ok(())
            }
            Err(e) => {
                self.refused = true;
                Err(e)
            }
        }
    }

    /// Whether the worker refused a connection (so it is gone or broken).
    pub fn unreachable(&self) -> bool {
        self.refused
    }

    pub async fn send(&mut self, req: http::Request<WireBody>) -> Result<http::Response<AnswerBody>, SendError> {
        let conn = self.conn.as_mut().ok_or_else(|| SendError::Lost(std::io::Error::other("not connected")))?;
        conn.ready().await?;
        conn.send(req).await
    }

    /// How the worker ended, if it has within `wait`.
    pub async fn exit_within(&mut self, wait: Duration) -> Option<Exit> {
        let _ = tokio::time::timeout(wait, self.exit.wait_for(Option::is_some)).await;
        self.exit.borrow().clone()
    }
}
