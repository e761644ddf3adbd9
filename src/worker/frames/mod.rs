//! valve-frames/2: valve's own protocol with its plumber workers
//! (bench/r-loop/PROTOCOL.md is the byte-level specification; `loop.R` is the
//! worker's side).
//!
//! valve parses HTTP; a plumber worker gets each request as one frame on one
//! loopback TCP connection that the worker opened to valve (a worker listens
//! on nothing), and answers with one frame carrying the request's id (after a
//! WAITING frame, if the answer waits on a promise). So the worker runs no
//! HTTP server and spends its time on the API.
//!
//! - `hub`, `FrameHub`: valve's one listener (`127.0.0.1:0`) and the key of
//!   its workers' tokens. A connection becomes a worker's only after a valid
//!   hello (that worker's own token, compared in constant time; an id valve is
//!   starting and has no connection for yet) within 5 s; few unauthenticated
//!   connections are kept at once.
//! - `link`, `Link`: one worker's connection: one task writes frames in the
//!   order asked, one reads the worker's and matches each answer to its
//!   request by id (several may wait on promises at once). A request whose
//!   client left is still read to its end, so the stream stays in step; R
//!   reads a ping only while it computes nothing, so a pong says R is free
//!   (what an abandoned lease waits for).
//! - `sink`: an answer's body on its way to its reader (gzip if asked), or
//!   read to its end for nobody; the files an answer names.
//! - `named`: such a file, opened (and deleted, when handed over) as the
//!   worker would: in its view of the files, with its user's permissions.
//! - `FrameConnector`: the worker's `Connect`: waits for its hello, checks the
//!   pid, and hands out handles to its one link.

pub mod answer;
pub mod head;
pub mod hub;
pub mod link;
mod named;
mod sink;

#[cfg(test)]
mod tests;

pub use hub::FrameHub;
