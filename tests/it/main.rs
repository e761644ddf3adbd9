//! Integration tests: the real `valve` binary with real R workers on loopback.

mod harness;
mod fidelity;
mod lifecycle;
mod scaling;
