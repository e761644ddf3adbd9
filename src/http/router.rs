//! Which app a request goes to: apps that name a hostname match only that
//! Host; among the rest, the longest path prefix wins. The table is built
//! whole and swapped in one step (a reload builds the new one beside the old).

use std::sync::{Arc, RwLock};

use crate::app::Supervisor;
use crate::config::{AppConfig, Trust};

/// An app as the router serves it.
pub struct Mounted {
    pub config: AppConfig,
    /// The generation that takes new requests and sessions.
    pub sup: Arc<Supervisor>,
    /// Older generations still serving the Shiny sessions they hold (a browser's
    /// sticky cookie may name one of their workers).
    pub older: Vec<Arc<Supervisor>>,
}

/// Where a request goes.
pub enum Routed {
    /// To this app, which sees this path (the prefix taken off).
    App(Arc<Mounted>, String),
    /// The bare prefix of an app: it lives at the prefix with a slash.
    AddSlash(String),
    /// No app is mounted there.
    Nowhere,
}

/// The apps, in matching order, and whom valve believes about who calls
/// (swapped with them, so a reload's rules hold for the next request).
#[derive(Default)]
pub struct Table {
    routes: Vec<Arc<Mounted>>,
    pub trust: Arc<Trust>,
}

impl Table {
    pub fn new(mut routes: Vec<Arc<Mounted>>, trust: Arc<Trust>) -> Table {
        // Hostname-specific routes first, then longer prefixes first.
        routes.sort_by_key(|m| (m.config.hostname.is_none(), std::cmp::Reverse(m.config.prefix.len())));
        Table { routes, trust }
    }

    pub fn apps(&self) -> &[Arc<Mounted>] {
        &self.routes
    }

    /// Routes a path (and query) for a request to `host`.
    pub fn route(&self, host: Option<&str>, path: &str, query: Option<&str>) -> Routed {
        let host = host.map(|h| match h.rsplit_once(':') {
            Some((name, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => h,
        });
        for m in &self.routes {
            if let Some(want) = &m.config.hostname {
                if !host.is_some_and(|h| h.eq_ignore_ascii_case(want)) {
                    continue;
                }
            }
            let prefix = m.config.prefix.as_str();
            if prefix == "/" {
                return Routed::App(m.clone(), path.to_string());
            }
            if path == prefix {
                let location = match query {
                    Some(q) => format!("{prefix}/?{q}"),
                    None => format!("{prefix}/"),
                };
                return Routed::AddSlash(location);
            }
            if let Some(rest) = path.strip_prefix(prefix).filter(|r| r.starts_with('/')) {
                return Routed::App(m.clone(), rest.to_string());
            }
        }
        Routed::Nowhere
    }
}

/// The current table, swapped whole on reload.
#[derive(Default)]
pub struct Router {
    table: RwLock<Arc<Table>>,
}

impl Router {
    pub fn new(table: Table) -> Router {
        Router { table: RwLock::new(Arc::new(table)) }
    }

    pub fn current(&self) -> Arc<Table> {
        self.table.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Puts a new table in place; requests already routed keep the old one's apps.
    pub fn swap(&self, table: Table) -> Arc<Table> {
        std::mem::replace(&mut *self.table.write().unwrap_or_else(|p| p.into_inner()), Arc::new(table))
    }
}
