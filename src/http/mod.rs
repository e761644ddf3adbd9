//! HTTP in front of the apps: the listener and its drain (`server`), which
//! app a request goes to (`router`), the one forwarding loop (`forward`),
//! static content's files (`files`), bodies held whole (`body`), what goes
//! back to clients (`reply`), and the identity headers no client may set
//! (`identity`).

pub mod body;
mod files;
pub mod forward;
mod head;
pub mod identity;
pub mod reply;
pub mod resume;
pub mod router;
pub mod server;
