//! What the executor does once the fleet's lock is released: starting
//! workers, liveness probes, waking browsers that wait for a place, turning
//! waiters away, and growing a pool that asked to. Collected under the lock,
//! run after it.

use std::sync::Arc;

use super::{Supervisor, Waiter};
use crate::app::pool::{Start, WorkerId};
use crate::worker::{Conn, Connect};

/// A liveness probe to send: the worker, a kept connection, how to open another.
pub(super) struct Probe {
    pub(super) sup: Arc<Supervisor>,
    pub(super) worker: WorkerId,
    pub(super) conn: Option<Conn>,
    pub(super) connector: Arc<dyn Connect>,
}

/// What the executor does once the fleet's lock is released.
#[derive(Default)]
pub(super) struct After {
    /// Workers to start, per app.
    pub(super) starts: Vec<(Arc<Supervisor>, Start)>,
    /// Liveness probes to send.
    pub(super) probes: Vec<Probe>,
    /// Apps whose waiting browsers may find a place now.
    pub(super) wake: Vec<Arc<Supervisor>>,
    /// Waiters turned away (dropping them answers "shutting down").
    pub(super) dismissed: Vec<Waiter>,
    /// Apps whose pool wants more workers (a replacement): grown within the budget.
    pub(super) grow: Vec<Arc<Supervisor>>,
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
        for Probe { sup, worker, conn, connector } in self.probes {
            tokio::spawn(sup.liveness(worker, conn, connector));
        }
        for sup in self.grow {
            sup.grow_now();
        }
    }
}
