//! One shutdown signal fanned out to every task. The first SIGINT or SIGTERM
//! turns readiness off at once and, after `--drain-delay`, starts the graceful
//! drain; a second one stops at once.

use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

/// The stages of stopping valve, in the order they fire.
#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    /// A stop was asked for: readiness answers 503 and answers carry
    /// `Connection: close`, but valve still accepts and serves normally
    /// (load balancers take a moment to stop sending traffic).
    pub signalled: CancellationToken,
    /// Stop accepting, let in-flight requests finish, then stop the workers.
    pub drain: CancellationToken,
    /// Stop waiting for requests and stop the workers now.
    pub now: CancellationToken,
}

impl Shutdown {
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts the stop as a signal would: readiness off now, the drain after `delay`.
    pub fn begin(&self, delay: Duration) {
        self.signalled.cancel();
        if delay.is_zero() {
            self.drain.cancel();
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = this.now.cancelled() => {}
            }
            this.drain.cancel();
        });
    }

    /// Turns SIGINT and SIGTERM into the stages. Must run inside the runtime.
    pub fn listen_for_signals(&self, drain_delay: Duration) -> std::io::Result<()> {
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        let this = self.clone();
        tokio::spawn(async move {
            let mut seen = 0;
            loop {
                let name = tokio::select! {
                    _ = int.recv() => "SIGINT",
                    _ = term.recv() => "SIGTERM",
                };
                seen += 1;
                if seen == 1 {
                    tracing::info!(
                        signal = name,
                        drain_delay_s = drain_delay.as_secs_f64(),
                        "shutting down: not ready any more; draining in-flight requests after --drain-delay \
                         (send it again to stop at once)"
                    );
                    this.begin(drain_delay);
                } else {
                    tracing::warn!(signal = name, "stopping at once");
                    this.signalled.cancel();
                    this.drain.cancel();
                    this.now.cancel();
                    return;
                }
            }
        });
        Ok(())
    }
}
