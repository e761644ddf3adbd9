//! Integration tests: the real `valve` binary with real R workers on loopback.

mod admin;
mod apps;
mod asyncness;
mod cut;
mod deps;
mod engines;
mod fidelity;
mod forward_auth;
mod guard;
mod harness;
mod identity;
mod layers;
mod lifecycle;
mod placement;
mod preload;
mod reconnect;
mod reliability;
mod rmarkdown;
mod rules;
mod scaling;
mod shiny;
mod site;
mod statics;
mod traces;
