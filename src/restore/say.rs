//! How a restore reports as it goes.

/// What a restore says as it goes (the deployment's log, the app's log).
pub type Say<'a> = &'a (dyn Fn(String) + Send + Sync);
