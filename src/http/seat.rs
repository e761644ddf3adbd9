//! The worker one forwarded request holds, whichever kind of app it is:
//! a plumber worker's lease or a Shiny browser's sticky worker, with the
//! connection the request goes on.

use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};

use crate::app::verdict::{Fate, Hold};
use crate::app::{Lease, Sticky, Supervisor, WorkerId};
use crate::worker::{AnswerBody, Exit, SendError, WireBody};

/// The worker a request holds: a lease (plumber: one R computation at a time) or
/// the browser's sticky worker (Shiny: many sessions at once), and the
/// connection the request goes on.
pub(super) enum Seat {
    Lease(Lease),
    Sticky(Sticky),
}

impl Seat {
    pub(super) fn worker(&self) -> WorkerId {
        match self {
            Seat::Lease(l) => l.worker,
            Seat::Sticky(s) => s.worker,
        }
    }

    pub(super) fn waited(&self) -> Duration {
        match self {
            Seat::Lease(l) => l.waited,
            Seat::Sticky(_) => Duration::ZERO,
        }
    }

    pub(super) async fn connect(&mut self, upgradable: bool) -> std::io::Result<()> {
        match self {
            Seat::Lease(l) => l.connect().await,
            Seat::Sticky(s) => s.connect(upgradable).await,
        }
    }

    pub(super) async fn send(&mut self, req: Request<WireBody>) -> Result<Response<AnswerBody>, SendError> {
        match self {
            Seat::Lease(l) => l.send(req).await,
            Seat::Sticky(s) => s.send(req).await,
        }
    }

    /// Whether R left the request waiting on a promise (a lease's worker
    /// then serves others); if not, it never counts as parked from now on.
    pub(super) fn parked(&self) -> bool {
        match self {
            Seat::Lease(l) => l.parked(),
            Seat::Sticky(_) => false,
        }
    }

    pub(super) fn hold(&self) -> Hold {
        match self {
            Seat::Lease(_) => Hold::Lease,
            Seat::Sticky(_) => Hold::Sticky,
        }
    }

    /// Carries out what the verdict says becomes of the worker.
    pub(super) fn obey(&mut self, sup: &Arc<Supervisor>, fate: Fate) {
        match (self, fate) {
            (Seat::Lease(l), fate) => l.decided(fate),
            (Seat::Sticky(s), Fate::Retire(reason)) => sup.retire(s.worker, reason),
            (Seat::Sticky(_), _) => {}
        }
    }

    pub(super) async fn exit_within(&mut self, wait: Duration) -> Option<Exit> {
        match self {
            Seat::Lease(l) => l.exit_within(wait).await,
            Seat::Sticky(s) => s.exit_within(wait).await,
        }
    }
}
