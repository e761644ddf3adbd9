//! One R process: how it is started, reached, watched and stopped. This is the
//! only module that creates or signals processes.
//!
//! A plumber worker is reached through valve's own protocol (`frames`: one
//! loopback TCP connection the worker opens to valve's listener, one frame
//! per request and per answer) unless `--worker-transport httpuv`; a Shiny
//! worker (and a plumber one with httpuv) serves HTTP on its own Unix socket
//! inside valve's private 0700 run directory. It is either a plain process (`R --file=launcher.R`, the
//! leader of its own process group, with a parent-death signal so it dies with
//! valve even when valve is SIGKILLed) or, with `--preload`, a fork of one
//! parent R process that loaded the API once (see `fork.rs`).
//!
//! The supervisor sees workers through two small interfaces, `Launch` (start
//! one) and `Process` (wait for it, signal it), so its logic can be tested with
//! a fake worker; `RLauncher` is the real one.

//! Its files, from the bottom: `wire` (the small types every part shares),
//! `output` (a worker's output as log lines), `frames` (valve's own
//! protocol: `link` under `conn`, `hub` over it), `conn` (a connection of
//! either transport), `process` (the interfaces and /proc), `reap`,
//! `job` (what to start, as a value), `exec` (the steps between fork and
//! exec, in valve and the spawner alike), `launchable` (starting it: valve's
//! spawner thread or the privileged spawner), `privsep` (as root, the
//! privileged spawner process every start goes through), `child` (a started
//! process, wherever it was started), `spawn` (plain workers), `caps` (what the warm parent keeps of root's), `render` (a `shiny_prerendered` document's one
//! render, before its workers), `packages` (which versions of some packages
//! an app's R finds: a published bundle's check), `fork` (`--preload`), `launcher`
//! (`RLauncher`), `watch` (a serving worker's exit, stops and samples).

pub mod builders;
mod caps;
mod child;
mod conn;
mod exec;
mod fork;
mod frames;
mod job;
mod launchable;
mod launcher;
mod lifeline;
mod output;
pub mod packages;
pub mod privsep;
mod process;
pub mod reap;
mod render;
pub mod rtools;
pub mod sandbox;
mod spawn;
pub mod watch;
mod wire;
pub mod zygote;

pub use conn::{
    connect, link_token, probe, Conn, Connect, EngineConnector, SocketConnector, TcpConnector, CLIENT_ADDR,
    CLIENT_PORT, CLIENT_SCHEME, LINK,
};
pub use frames::FrameHub;
pub use launcher::{NoWorkers, RLauncher};
pub use output::{OutputHook, Stream, Tail, NOT_A_WORKER};
pub use process::{
    cpu_time, private_bytes, rss_bytes, Exit, Launch, Launched, MemoryProbe, Process, RenderError, StartError, Stop,
};
pub use spawn::{run_dir, Spec};
pub use wire::{AnswerBody, BoxFuture, ClientAddrs, Park, Parking, SendError, SpoolDir, Spooled, WireBody, WorkerId};
