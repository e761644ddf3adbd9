//! One shutdown signal fanned out to every task. The first SIGINT or SIGTERM
//! asks for a graceful drain; a second one asks to stop at once.

use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

/// The two stages of stopping valve.
#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    /// Stop accepting, let in-flight requests finish, then stop the workers.
    pub drain: CancellationToken,
    /// Stop waiting for requests and stop the workers now.
    pub now: CancellationToken,
}

impl Shutdown {
    pub fn new() -> Self {
        Self::default()
    }

    /// Turns SIGINT and SIGTERM into the two stages. Must run inside the runtime.
    pub fn listen_for_signals(&self) -> std::io::Result<()> {
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
                        "shutting down: draining in-flight requests (send it again to stop at once)"
                    );
                    this.drain.cancel();
                } else {
                    tracing::warn!(signal = name, "stopping at once");
                    this.drain.cancel();
                    this.now.cancel();
                    return;
                }
            }
        });
        Ok(())
    }
}
