//! What a request asks of an app: a `Lease` on a plumber worker (an idle
//! one now, or the first to come free), the browser's `Sticky` Shiny worker
//! (or the one the pool places it on), sessions opening and closing, and
//! taking a broken worker out of service.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use super::after::After;
use super::{now, AppState, Supervisor, Unavailable};
use crate::app::lease::Lease;
use crate::app::pool::{Event, State, WorkerId, BUSY_PATIENCE};
use crate::app::sticky::Sticky;
use crate::app::Retire;
use crate::metrics::Rejection;

impl Supervisor {
    /// Runs `f` on this app's state under the fleet's lock, then grows the
    /// app as far as the budget allows, and carries out what follows once
    /// the lock is released. Returns what `f` returned and the workers started.
    pub(super) fn with_growth<T>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut AppState, &mut After) -> T,
    ) -> Option<(T, After)> {
        let mut after = After::default();
        let mut fleet = self.fleet.lock();
        let app = fleet.apps.get_mut(&self.key)?;
        let out = f(app, &mut after);
        self.fleet.grow(&mut fleet, self.key, now(), &mut after);
        Some((out, after))
    }

    /// Whether worker `id` is this app's and still serves its sessions (not
    /// stopping): a browser on an older generation stays there only while its
    /// worker does, and otherwise goes to the current one (a winding-down
    /// generation starts no worker for it).
    pub fn keeps(&self, id: WorkerId) -> bool {
        self.with(|app| app.pool.slot(id).is_some_and(|s| s.state != State::Stopping)).unwrap_or(false)
    }

    /// Takes a worker for one request: an idle one now, or the first to come free.
    pub async fn lease(self: &Arc<Self>) -> Result<Lease, Unavailable> {
        let rx = {
            let mut f = self.fleet.lock();
            let Some(app) = f.apps.get_mut(&self.key) else { return Err(Unavailable::ShuttingDown) };
            if app.closing {
                return Err(Unavailable::ShuttingDown);
            }
            if let Some(id) = app.pool.checkout() {
                self.metrics.queue_wait.observe(Duration::ZERO);
                return Ok(self.lease_for(app, id));
            }
            if app.pool.queue_len() >= self.settings.queue_size {
                // Clients that gave up while waiting still hold places: free them first.
                app.pool.retain_waiters(|w| !w.is_closed());
                if app.pool.queue_len() >= self.settings.queue_size {
                    self.metrics.reject(Rejection::QueueFull);
                    return Err(Unavailable::QueueFull);
                }
            }
            let (tx, rx) = oneshot::channel();
            app.pool.enqueue(tx);
            let mut after = After::default();
            self.fleet.grow(&mut f, self.key, now(), &mut after);
            drop(f);
            if let Some((_, start)) = after.starts.first() {
                let g = self.gauges();
                tracing::info!(
                    app = %self.settings.name,
                    workers = ?start.ids,
                    queued = g.queued,
                    live = g.starting + g.idle + g.busy,
                    n_max = g.n_max,
                    "starting worker: requests are waiting and the pool has room"
                );
            }
            after.run();
            rx
        };
        let queued = now();
        let result = match tokio::time::timeout(self.settings.queue_timeout, rx).await {
            Ok(Ok(mut lease)) => {
                lease.waited = now().saturating_duration_since(queued);
                Ok(lease)
            }
            Ok(Err(_)) => Err(Unavailable::ShuttingDown),
            Err(_) => Err(Unavailable::QueueTimeout),
        };
        self.metrics.queue_wait.observe(now().saturating_duration_since(queued));
        match &result {
            Err(Unavailable::QueueTimeout) => self.metrics.reject(Rejection::QueueTimeout),
            Err(Unavailable::ShuttingDown) => self.metrics.reject(Rejection::ShuttingDown),
            _ => {}
        }
        result
    }

    /// The Shiny worker for a request: the browser's own (`wanted`, its worker
    /// and token from its sticky cookie) while it serves, else the one the
    /// pool picks (`Pool::pick_for_session`: a worker whose R is not busy,
    /// with the fewest sessions below --max-sessions), starting one when all
    /// are busy or full. `token` names a browser that has none yet.
    pub async fn sticky(self: &Arc<Self>, wanted: Option<(WorkerId, u64)>, token: u64) -> Result<Sticky, Unavailable> {
        let began = tokio::time::Instant::now();
        let deadline = began + self.settings.queue_timeout;
        // Past this, a busy worker with room will do (the pool decides); look again then.
        let patience = began + BUSY_PATIENCE;
        let mut counted = false;
        // A worker that has now served its share drains: its replacement may start at once.
        let mut drained = false;
        let result = loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let mut after = After::default();
            let seen = {
                let mut f = self.fleet.lock();
                let Some(app) = f.apps.get_mut(&self.key) else { break Err(Unavailable::ShuttingDown) };
                if app.closing {
                    break Err(Unavailable::ShuttingDown);
                }
                let now = now();
                if let Some((id, token)) = wanted {
                    if let Some(spent) = app.pool.touch(id, now, Some(token)) {
                        drained |= spent;
                        if let Some(sticky) = sticky_for(self, app, id, false, token) {
                            break Ok(sticky);
                        }
                    }
                }
                if let Some(id) = app.pool.pick_for_session(now, token, began.elapsed()) {
                    drained |= app.pool.touch(id, now, None) == Some(true);
                    if let Some(sticky) = sticky_for(self, app, id, true, token) {
                        break Ok(sticky);
                    }
                }
                // Replaced while this browser waited: its workers take no new
                // session and it starts none, so the browser goes elsewhere.
                if app.pool.is_winding_down() {
                    break Err(Unavailable::Replaced);
                }
                if !counted {
                    app.pool.session_wanted();
                    counted = true;
                }
                let seen: Vec<(WorkerId, &'static str, usize)> =
                    app.pool.slots().map(|(id, s)| (id, s.state.as_str(), s.sessions)).collect();
                self.fleet.grow(&mut f, self.key, now, &mut after);
                seen
            };
            if let Some((_, start)) = after.starts.first() {
                tracing::info!(
                    app = %self.settings.name,
                    workers = ?start.ids,
                    seen = ?seen,
                    wanted = ?wanted.map(|w| w.0),
                    max_sessions = self.settings.limits.max_sessions,
                    "starting worker: a new browser finds every worker busy or holding --max-sessions sessions"
                );
            }
            after.run();
            let wake = if tokio::time::Instant::now() < patience { patience.min(deadline) } else { deadline };
            if tokio::time::timeout_at(wake, changed).await.is_err() && wake == deadline {
                self.metrics.reject(Rejection::QueueTimeout);
                break Err(Unavailable::QueueTimeout);
            }
        };
        if counted {
            self.with(|app| app.pool.session_served());
        }
        if drained {
            self.grow_now();
        }
        result
    }

    /// A Shiny session's WebSocket opened (`true`, from the browser with
    /// `token`) or closed on a worker.
    pub fn session(self: &Arc<Self>, id: WorkerId, open: bool, token: Option<u64>) {
        if open {
            let now = now();
            self.with(|app| app.pool.session_opened(id, now, token));
            self.metrics.session_opened();
        } else {
            self.feed_now(Event::SessionClosed(id));
        }
    }

    /// A signed-in user's Shiny session on worker `id`: listed on the status
    /// page until the returned guard is dropped (the session ends).
    pub fn signed_in(self: &Arc<Self>, id: WorkerId, user: String) -> SignedIn {
        self.session_user(id, &user, true);
        SignedIn { sup: self.clone(), id, user }
    }

    fn session_user(&self, id: WorkerId, user: &str, open: bool) {
        let mut users = self.users.lock().unwrap_or_else(|p| p.into_inner());
        let list = users.entry(id).or_default();
        if open {
            list.push(user.to_string());
        } else if let Some(i) = list.iter().position(|u| u == user) {
            list.remove(i);
        }
        if list.is_empty() {
            users.remove(&id);
        }
    }

    /// Takes a worker out of service now (a Shiny worker that broke or hung).
    pub fn retire(self: &Arc<Self>, id: WorkerId, reason: Retire) {
        if let Some((_, after)) = self.with_growth(|app, after| self.feed(app, Event::Retire(id, reason), after)) {
            after.run();
        }
    }
}

/// The sticky worker for a request `touch` has counted; if the worker is
/// gone, the count is taken back.
fn sticky_for(sup: &Arc<Supervisor>, app: &mut AppState, id: WorkerId, new: bool, token: u64) -> Option<Sticky> {
    let Some(live) = app.live.get(&id) else {
        app.pool.finished(id, now());
        return None;
    };
    let home = Arc::downgrade(sup);
    let done = Box::new(move || {
        if let Some(sup) = home.upgrade() {
            sup.with(|app| app.pool.finished(id, now()));
        }
    });
    Some(Sticky::new(id, live.connector.clone(), new, token, live.exit.clone(), done))
}

/// A signed-in user's open Shiny session, as the status page lists it.
pub struct SignedIn {
    sup: Arc<Supervisor>,
    id: WorkerId,
    user: String,
}

impl Drop for SignedIn {
    fn drop(&mut self) {
        self.sup.session_user(self.id, &self.user, false);
    }
}
