//! What the executor does once the fleet's lock is released: starting
//! workers, liveness probes, waking browsers that wait for a place, and
//! turning waiters away. Collected under the lock, run after it.

use std::sync::Arc;

use super::{Supervisor, Waiter};
use crate::app::pool::{Start, WorkerId};
use crate::worker::{Conn, Connect};

/// What the executor does once the fleet's lock is released.
#[derive(Default)]
pub(super) struct After {
    /// Workers to start, per app.
    pub(super) starts: Vec<(Arc<Supervisor>, Start)>,
    /// Liveness probes: the worker, a kept connection, how to open another.
    pub(super) probes: Vec<(Arc<Supervisor>, WorkerId, Option<Conn>, Arc<dyn Connect>)>,
    /// Apps whose waiting browsers may find a place now.
    pub(super) wake: Vec<Arc<Supervisor>>,
    /// Waiters turned away (dropping them answers "shutting down").
    pub(super) dismissed: Vec<Waiter>,
}

impl After {
    /// Carries out what waited for the lock.
    pub(super) fn run(self) {
        drop(self.dismissed);
        for sup in self.wake {
            sup.changed.notify_waiters();
        }
        for (sup, start) in self.starts {
            sup.spawn_start(start);
        }
        for (sup, id, conn, connector) in self.probes {
            tokio::spawn(sup.clone().liveness(id, conn, connector));
        }
    }
}
