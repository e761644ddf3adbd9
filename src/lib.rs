//! valve: one port in front of a pool of R worker processes running a plumber API.
//!
//! Module map (see ARCHITECTURE.md for the invariants between them):
//! - `admin`: valve's own pages under /__valve__/ (health, readiness, metrics, status, dashboard).
//! - `metrics`: counters, histograms and the dashboard's history.
//! - `body`: the request body sent to workers, with the body-size limit.
//! - `config`: flags and `VALVE_*` variables in, a checked `Config` out.
//! - `pool`: worker states, the wait queue and scaling decisions; pure logic.
//! - `worker`: starting, reaching, watching and signalling one R process.
//! - `supervisor`: carries out the pool's decisions with real workers; hands out leases.
//! - `proxy`: HTTP in, HTTP out, through a leased worker.
//! - `server`: the listener, connection handling and the drain on shutdown.
//! - `shutdown`: the signals that stop valve, fanned out as tokens.

pub mod admin;
pub mod body;
pub mod config;
pub mod healthcheck;
pub mod metrics;
pub mod pool;
pub mod proxy;
pub mod server;
pub mod shutdown;
pub mod supervisor;
pub mod worker;
