//! Apps and their workers. One `Supervisor` per app (per generation of an
//! app, across reloads), all sharing one `Fleet`: the lock over every app's
//! pool, so that the worker budget across apps is exact.
//!
//! - `pool`: one app's pure decisions;
//! - `budget`: the pure choice of which idle worker of another app gives up
//!   its place when the budget is spent;
//! - `supervisor`: carries the decisions out with real (or fake) workers and
//!   owns the app's background loops;
//! - `lease`, `sticky`: how requests hold a plumber worker or reach a Shiny one;
//! - `verdict`: the pure decision after one try of a request on a worker
//!   (retry elsewhere? retire the worker? what the client gets).

pub mod budget;
pub mod lease;
pub mod pool;
pub mod sticky;
pub mod supervisor;
pub mod verdict;

#[cfg(test)]
mod fake;
#[cfg(test)]
mod tests;

pub use lease::Lease;
pub use pool::{Retire, State, WorkerId};
pub use sticky::Sticky;
pub use supervisor::{Fleet, Settings, Status, Supervisor, Unavailable, WorkerStatus};
