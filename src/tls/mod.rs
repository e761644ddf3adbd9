//! HTTPS: the certificate valve serves and how it stays current.
//!
//! `certs` reads and checks a certificate and its key; `Store` holds the one
//! being served (each new connection asks it, so a replaced certificate is
//! served from the next handshake on and no connection is dropped); `watch`
//! reads certificate files again when they change or on SIGHUP, keeping the
//! old certificate when the new one is bad; `acme` gets and renews
//! certificates from an ACME authority. The listeners (`http::server`) turn
//! a `Store` into a rustls acceptor with `server_config`.

pub mod acme;
pub mod certs;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;

pub use certs::{CertError, Pair};

/// Where a listener's certificate comes from, as the status page says it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    Files { cert: PathBuf, key: PathBuf },
    Acme { directory: String },
}

/// What the status page and metrics say of a certificate.
#[derive(Clone, Debug)]
pub struct Shown {
    pub origin: Origin,
    pub names: Vec<String>,
    pub not_after: SystemTime,
    /// When the certificate now served was taken.
    pub since: SystemTime,
    /// Why the last attempt to replace it failed (the old one serves on), if it did.
    pub failing: Option<String>,
}

/// The certificate a listener serves; replaced whole, never edited.
pub struct Store {
    current: RwLock<Arc<CertifiedKey>>,
    shown: Mutex<Shown>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("shown", &self.shown()).finish()
    }
}

impl Store {
    pub fn new(pair: Pair, origin: Origin) -> Arc<Store> {
        let shown =
            Shown { origin, names: pair.names, not_after: pair.not_after, since: SystemTime::now(), failing: None };
        Arc::new(Store { current: RwLock::new(pair.key), shown: Mutex::new(shown) })
    }

    /// Serves `pair` from the next handshake on.
    pub fn replace(&self, pair: Pair) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = pair.key;
        let mut shown = self.shown.lock().unwrap_or_else(|p| p.into_inner());
        shown.names = pair.names;
        shown.not_after = pair.not_after;
        shown.since = SystemTime::now();
        shown.failing = None;
    }

    /// Notes that a replacement failed: the current certificate serves on.
    pub fn failed(&self, why: String) {
        self.shown.lock().unwrap_or_else(|p| p.into_inner()).failing = Some(why);
    }

    pub fn shown(&self) -> Shown {
        self.shown.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl ResolvesServerCert for Store {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().unwrap_or_else(|p| p.into_inner()).clone())
    }
}

/// TLS 1.2 and 1.3 only, HTTP/2 offered before HTTP/1.1 (`h2` only when
/// `http2`), session resumption by tickets.
pub fn server_config(store: Arc<Store>, http2: bool) -> Arc<ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .expect("ring supports TLS 1.2 and 1.3")
        .with_no_client_auth()
        .with_cert_resolver(store);
    config.alpn_protocols = if http2 { vec![b"h2".to_vec(), b"http/1.1".to_vec()] } else { vec![b"http/1.1".to_vec()] };
    if let Ok(ticketer) = rustls::crypto::ring::Ticketer::new() {
        config.ticketer = ticketer;
    }
    Arc::new(config)
}

/// How often certificate files are looked at for a change.
const LOOK_EVERY: Duration = Duration::from_secs(2);

/// What identifies a file's content without reading it.
fn stamp(path: &Path) -> Option<(SystemTime, u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len(), m.ino()))
}

/// Reads `cert` and `key` again into `store` when either changes (looked at
/// every two seconds) or when `again` is notified (SIGHUP). A bad pair keeps
/// the old certificate serving, with a warning saying why.
pub fn watch(store: Arc<Store>, cert: PathBuf, key: PathBuf, again: Arc<tokio::sync::Notify>) {
    tokio::spawn(async move {
        let mut seen = (stamp(&cert), stamp(&key));
        loop {
            let asked = tokio::select! {
                _ = tokio::time::sleep(LOOK_EVERY) => false,
                _ = again.notified() => true,
            };
            let now = (stamp(&cert), stamp(&key));
            if !asked && now == seen {
                continue;
            }
            // A certificate and its key are seldom replaced in one instant:
            // let the second file land before reading the pair.
            if !asked {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            seen = (stamp(&cert), stamp(&key));
            let (c, k) = (cert.clone(), key.clone());
            match tokio::task::spawn_blocking(move || certs::load(&c, &k)).await {
                Ok(Ok(pair)) => {
                    tracing::info!(cert = %cert.display(), names = ?pair.names,
                        expires = %httpdate::fmt_http_date(pair.not_after), "TLS certificate read again: serving it to new connections");
                    store.replace(pair);
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "TLS certificate not replaced: the one read before serves on");
                    store.failed(e.to_string());
                }
                Err(_) => {}
            }
        }
    });
}
