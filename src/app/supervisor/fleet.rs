//! The `Fleet`: one lock over every app's pool and live workers, so that the
//! worker budget across apps is exact, and growth within that budget (which
//! app starts what, and whose idle worker gives up its place).
//!
//! Locking: a `std::sync::Mutex`, held for bookkeeping only: never across an
//! `.await`, never while reading /proc. What must happen after it is released
//! (starting workers, probes, wake-ups) is collected in an `After`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use super::after::After;
use super::{now, AppKey, Fleet, FleetState};
use crate::app::budget::{self, Spare};
use crate::app::pool::{Event, Ids, State};
use crate::app::Retire;

impl FleetState {
    pub(super) fn processes(&self) -> usize {
        self.apps.values().map(|a| a.pool.processes()).sum()
    }

    /// Workers stopping across every app: their exits will free places in the budget.
    pub(super) fn freeing(&self) -> usize {
        self.apps.values().map(|a| a.pool.count(State::Stopping)).sum()
    }
}

impl Fleet {
    pub fn new(max_workers: usize) -> std::sync::Arc<Fleet> {
        std::sync::Arc::new(Fleet {
            state: Mutex::new(FleetState { apps: BTreeMap::new() }),
            ids: Ids::default(),
            max_workers: AtomicUsize::new(max_workers),
            next_key: AtomicU64::new(1),
        })
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, FleetState> {
        // A panic while holding the lock cannot leave the pools half-updated in
        // a way that matters more than stopping valve would, so keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// R worker processes across every app now (stopping ones included).
    pub fn processes(&self) -> usize {
        self.lock().processes()
    }

    pub fn max_workers(&self) -> usize {
        self.max_workers.load(Ordering::Relaxed)
    }

    /// Changes the budget (a reload): more room starts what apps want; less
    /// stops nothing at once, workers above it are not replaced when they go.
    pub fn set_max_workers(&self, max_workers: usize) {
        let mut after = After::default();
        {
            let mut f = self.lock();
            self.max_workers.store(max_workers.max(1), Ordering::Relaxed);
            self.rebalance(&mut f, now(), &mut after);
        }
        after.run();
    }

    /// Starts what every app wants that the budget allows (after a worker of
    /// any app exited, room may have come free). Called with the lock held;
    /// the starts are carried out by `after` once it is released.
    pub(super) fn rebalance(&self, f: &mut FleetState, now: Instant, after: &mut After) {
        let keys: Vec<AppKey> = f.apps.keys().copied().collect();
        for key in keys {
            self.grow(f, key, now, after);
        }
    }

    /// Grows one app as far as it wants and the budget allows. When the budget
    /// is what stops it, the longest-idle spare worker of another app is
    /// stopped: its exit makes the room.
    pub(super) fn grow(&self, f: &mut FleetState, key: AppKey, now: Instant, after: &mut After) {
        let room = budget::room(self.max_workers(), f.processes());
        let freeing = f.freeing();
        let Some(app) = f.apps.get_mut(&key) else { return };
        if app.closing {
            return;
        }
        let start = app.pool.grow(now, room);
        let short = app.pool.wants();
        let unreplaced = app.pool.unreplaced();
        let Some(sup) = app.sup.upgrade() else { return };
        let mut making_room = false;
        // Stopping workers will free their places: only take more for what they do not cover.
        if short > freeing {
            let spares = f.apps.iter().filter_map(|(k, a)| {
                a.pool.spare(now).map(|(worker, idle_since)| Spare { app: *k, worker, idle_since })
            });
            if let Some(victim) = budget::victim(key, spares) {
                if let Some(other) = f.apps.get_mut(&victim.app) {
                    if let Some(owner) = other.sup.upgrade() {
                        if owner.feed(other, Event::Retire(victim.worker, Retire::Budget), after) {
                            making_room = true;
                            tracing::info!(
                                worker = victim.worker,
                                app = %owner.settings.name,
                                for_app = %sup.settings.name,
                                max_workers = self.max_workers(),
                                "stopping an idle worker: another app needs its place in the worker budget"
                            );
                        }
                    }
                }
            }
        }
        // Workers past a limit wait for a replacement while a place may come;
        // when none will, the pool hears so (they stop first instead).
        if unreplaced > 0 && freeing == 0 && !making_room {
            if let Some(app) = f.apps.get_mut(&key) {
                sup.feed(app, Event::NoRoom, after);
            }
        }
        if let Some(app) = f.apps.get(&key) {
            for id in &start.ids {
                if let Some(old) = app.pool.replaces(*id) {
                    tracing::info!(app = %sup.settings.name, worker = id, replaces = old,
                        "starting worker: replacing one past its limit, which serves until this one answers");
                }
            }
        }
        if !start.ids.is_empty() {
            after.starts.push((sup, start));
        }
    }
}
