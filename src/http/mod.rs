//! HTTP in front of the apps: the listener and its drain (`server`), which
//! app a request goes to (`router`), the one forwarding loop (`forward`),
//! bodies held whole (`body`), and what goes back to clients (`reply`).

pub mod body;
pub mod forward;
pub mod reply;
pub mod router;
pub mod server;
