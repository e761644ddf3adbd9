//! HTTP in front of the apps: the listener and its drain (`server`), which
//! app a request goes to (`router`), who is calling and may they (`access`,
//! over `forwarded`, the client's address behind trusted proxies, and `auth`,
//! the forward-auth service asked first when `auth_url` is set), the one forwarding loop (`forward`),
//! static content's files (`files`), bodies held whole (`body`), what goes
//! back to clients (`reply`), the identity headers no client may set
//! (`identity`), and what requests' and Shiny sessions' spans say (`spans`).

mod access;
pub mod auth;
pub mod body;
pub mod conn;
mod files;
pub mod forward;
mod forwarded;
mod head;
pub mod identity;
pub mod redirect;
pub mod reply;
pub mod resume;
pub mod router;
mod seat;
pub mod server;
mod spans;
