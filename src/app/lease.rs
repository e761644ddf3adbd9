//! A `Lease`: one plumber worker, busy for one request. The only way to reach
//! a plumber worker; the pool hands a worker's R to at most one lease at a
//! time. When R leaves the request waiting on a promise (the link says so
//! through the request's `Park`), R is free again: the worker goes back to
//! the pool at once, holding the request as parked, and the lease keeps only
//! the request; when it settles (or is given up) the pool learns it.
//!
//! A lease gives its worker back through `Home` (the supervisor implements
//! it), so this module and the supervisor do not import each other. How it
//! comes back depends on how far the exchange got: untouched, answered (with
//! its connection, if it can serve another request), broken (the worker is
//! retired before anything else can be given to it), or abandoned mid-request
//! (the worker stays busy until R has finished, then comes back).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::pool::{Retire, WorkerId};
use super::verdict::{after_exchange, Asked, Fate, Hold, Outcome};
use crate::worker::{AnswerBody, Conn, Connect, Exit, Park, Parking, SendError};

/// How a lease's worker comes back.
pub enum Returned {
    /// Nothing was asked of it (its client left before sending).
    Unused(Option<Conn>),
    /// It answered; the connection comes back if it can serve another request.
    Answered(Option<Conn>),
    /// It broke off an exchange, hung or could not be reached: retire it.
    Broken(Retire),
    /// Its client left while R worked on the request: it is busy until R is done.
    Abandoned(Option<Arc<dyn Connect>>),
    /// R left the request waiting on a promise: the worker is free to
    /// compute another, and holds this one until it settles.
    Parked,
    /// A request the worker held waiting on a promise is over.
    Settled,
}

/// Where a lease's worker goes back to.
pub trait Home: Send + Sync {
    fn give_back(&self, worker: WorkerId, returned: Returned);
}

/// Where a sent request stands, between the link (which learns R parked it)
/// and the lease (which may give it up first); whichever moves first wins.
struct Parker {
    home: Arc<dyn Home>,
    worker: WorkerId,
    state: AtomicU8,
}

/// R computes the request (or nobody decided yet).
const COMPUTING: u8 = 0;
/// R left it waiting on a promise; the worker went back to the pool.
const PARKED: u8 = 1;
/// The lease decided the worker's fate while R computed: a later WAITING is not counted.
const CLAIMED: u8 = 2;

impl Parker {
    /// Whether R parked the request; if it had not, it never counts as parked from now on.
    fn claim(&self) -> bool {
        match self.state.compare_exchange(COMPUTING, CLAIMED, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => false,
            Err(state) => state == PARKED,
        }
    }
}

impl Parking for Parker {
    fn parked(&self) -> bool {
        let won = self.state.compare_exchange(COMPUTING, PARKED, Ordering::AcqRel, Ordering::Acquire).is_ok();
        if won {
            self.home.give_back(self.worker, Returned::Parked);
        }
        won
    }

    fn settled(&self) {
        self.home.give_back(self.worker, Returned::Settled);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Nothing sent yet.
    Fresh,
    /// A request was sent and its answer is not complete.
    Sent,
    /// The exchange ended and the verdict said what becomes of the worker.
    Decided(Fate),
}

/// One worker, busy for one request, until the lease is dropped.
pub struct Lease {
    home: Arc<dyn Home>,
    pub worker: WorkerId,
    connector: Option<Arc<dyn Connect>>,
    conn: Option<Conn>,
    /// The worker's exit, once its watcher has seen it.
    exit: watch::Receiver<Option<Exit>>,
    /// How long the request waited in the queue for this worker.
    pub waited: Duration,
    stage: Stage,
    /// The sent request's standing (frames workers tell when R parks it).
    parker: Option<Arc<Parker>>,
    /// False once taken apart without going back through `Home`.
    armed: bool,
}

impl Lease {
    pub(super) fn new(
        home: Arc<dyn Home>,
        worker: WorkerId,
        connector: Option<Arc<dyn Connect>>,
        conn: Option<Conn>,
        exit: watch::Receiver<Option<Exit>>,
    ) -> Lease {
        Lease {
            home,
            worker,
            connector,
            conn,
            exit,
            waited: Duration::ZERO,
            stage: Stage::Fresh,
            parker: None,
            armed: true,
        }
    }

    /// Takes the lease apart without giving the worker back: the supervisor
    /// does, when a waiter left just as its lease was sent (it holds the lock
    /// that giving back would take).
    pub(super) fn disarm(mut self) -> Option<Conn> {
        self.armed = false;
        self.conn.take()
    }

    /// Makes sure the lease holds a ready connection: the kept one, or a fresh
    /// one. Nothing has been sent when this fails, so the request may go elsewhere.
    pub async fn connect(&mut self) -> std::io::Result<()> {
        if let Some(conn) = self.conn.as_mut() {
            if conn.ready().await.is_ok() {
                return Ok(());
            }
        }
        self.conn = None;
        let connector = self.connector.clone().ok_or_else(|| std::io::Error::other("the worker is gone"))?;
        let mut conn = connector.connect(false).await?;
        conn.ready().await.map_err(std::io::Error::other)?;
        self.conn = Some(conn);
        Ok(())
    }

    /// Sends the request on the connection `connect` made ready. From now on,
    /// a lease dropped before `answered` leaves its worker busy until R is done.
    pub async fn send(
        &mut self,
        mut req: http::Request<crate::worker::WireBody>,
    ) -> Result<http::Response<AnswerBody>, SendError> {
        let conn = self.conn.as_mut().ok_or_else(|| SendError::Lost(std::io::Error::other("not connected")))?;
        let parker = Arc::new(Parker { home: self.home.clone(), worker: self.worker, state: AtomicU8::new(COMPUTING) });
        req.extensions_mut().insert(Park(parker.clone()));
        self.parker = Some(parker);
        self.stage = Stage::Sent;
        conn.send(req).await
    }

    /// Whether R left the request waiting on a promise (so the worker went
    /// back to the pool already); if it had not, a later WAITING is not
    /// counted: the caller decides the worker's fate now.
    pub fn parked(&self) -> bool {
        self.parker.as_ref().is_some_and(|p| p.claim())
    }

    /// The exchange ended: `fate` (from `verdict::after_exchange`) is carried
    /// out when the lease drops; a worker retired is out of service before
    /// it could be handed to anyone else.
    pub fn decided(&mut self, fate: Fate) {
        self.stage = Stage::Decided(fate);
    }

    /// The answer is complete; `reusable` if the connection can serve again.
    pub fn answered(&mut self, reusable: bool) {
        self.decided(Fate::GiveBack { reusable });
    }

    /// The worker failed: it is taken out of service when the lease drops.
    pub fn broken(&mut self, reason: Retire) {
        self.decided(Fate::Retire(reason));
    }

    /// How the worker ended, if it has within `wait` (after an exchange broke off).
    pub async fn exit_within(&mut self, wait: Duration) -> Option<Exit> {
        let _ = tokio::time::timeout(wait, self.exit.wait_for(Option::is_some)).await;
        self.exit.borrow().clone()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // R parked the request: the worker went back to the pool then, and
        // the link tells when the request settles. Only a retirement is left to say.
        let parked = self.parked();
        let fate = match self.stage {
            Stage::Fresh => return self.home.give_back(self.worker, Returned::Unused(self.conn.take())),
            Stage::Sent | Stage::Decided(Fate::GiveBack { .. } | Fate::Settle | Fate::Detach) if parked => return,
            // Dropped mid-exchange: its client left while R worked.
            Stage::Sent => {
                let asked = Asked { hold: Hold::Lease, replayable: false, unreachable: 0, retried: false };
                after_exchange(&Outcome::ClientGone, asked).fate
            }
            Stage::Decided(fate) => fate,
        };
        let returned = match fate {
            Fate::GiveBack { reusable } => Returned::Answered(if reusable { self.conn.take() } else { None }),
            Fate::Retire(reason) => Returned::Broken(reason),
            Fate::Settle => Returned::Abandoned(self.connector.take()),
            // Only a shared (Shiny) worker is kept serving as it is; a lease gives its worker back.
            Fate::Keep => Returned::Answered(None),
            // Only a parked request is detached from its worker (returned above).
            Fate::Detach => Returned::Answered(None),
        };
        self.home.give_back(self.worker, returned);
    }
}
