//! HTTPS for valve's listeners, from the settings: the certificate store of
//! the main port (from files, watched; or from an ACME authority, renewed),
//! the admin listener's (the same, or its own), and what each listener
//! speaks. Wires `tls` to `http`; neither names the other.

use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::Notify;

use crate::config::tls::{AdminTls, CertSource, Tls};
use crate::http::conn::Speaks;
use crate::tls::acme::{self, Authority, Challenges};
use crate::tls::{certs, server_config, watch, Origin, Store};

pub struct Https {
    /// The main port's certificate.
    pub store: Arc<Store>,
    /// The admin listener's, when it has one of its own.
    admin: Option<Arc<Store>>,
    admin_tls: bool,
    /// HTTP-01's answers, served on the plain-HTTP port.
    pub challenges: Arc<Challenges>,
    /// Notified on SIGHUP: certificate files are read again.
    pub again: Arc<Notify>,
    acme: Option<(Arc<Authority>, Option<SystemTime>)>,
}

impl Https {
    /// The stores, from certificates already at hand (files, or a kept ACME
    /// certificate; else a stand-in until `main` has the authority's).
    pub fn start(tls: Option<&Tls>) -> Result<Option<Https>, String> {
        let Some(tls) = tls else { return Ok(None) };
        let again = Arc::new(Notify::new());
        let (store, acme) = match &tls.certs {
            CertSource::Files { cert, key } => {
                let pair = certs::load(cert, key).map_err(|e| e.to_string())?;
                let store = Store::new(pair, Origin::Files { cert: cert.clone(), key: key.clone() });
                watch(store.clone(), cert.clone(), key.clone(), again.clone());
                (store, None)
            }
            CertSource::Acme(a) => {
                let authority = Authority::new(acme::Settings {
                    domains: a.domains.clone(),
                    contact: a.contact.clone(),
                    directory: a.directory.clone(),
                    ca: a.ca.clone(),
                    dir: a.dir.clone(),
                });
                let origin = Origin::Acme { directory: a.directory.clone() };
                let (pair, issued) = match authority.kept() {
                    Some((pair, issued)) => (pair, Some(issued)),
                    None => (stand_in(&a.domains)?, None),
                };
                (Store::new(pair, origin), Some((authority, issued)))
            }
        };
        let challenges = acme.as_ref().map(|(a, _)| a.challenges.clone()).unwrap_or_default();
        let admin = match &tls.admin {
            AdminTls::Own { cert, key } => {
                let pair = certs::load(cert, key).map_err(|e| e.to_string())?;
                let own = Store::new(pair, Origin::Files { cert: cert.clone(), key: key.clone() });
                watch(own.clone(), cert.clone(), key.clone(), again.clone());
                Some(own)
            }
            _ => None,
        };
        let admin_tls = tls.admin != AdminTls::Off;
        Ok(Some(Https { store, admin, admin_tls, challenges, again, acme }))
    }

    /// What the main port speaks, once it has a certificate: an ACME
    /// certificate not kept from before is asked for now (its check comes to
    /// the plain-HTTP port, which must be serving), then kept renewed.
    pub async fn main(&self) -> Result<Speaks, String> {
        if let Some((authority, kept)) = &self.acme {
            let issued = match kept {
                Some(at) => *at,
                None => {
                    tracing::info!("asking the ACME authority for a certificate");
                    let pair = authority.issue().await.map_err(|why| {
                        format!("no certificate from the ACME authority: {why} (valve keeps none from before; fix it and start again)")
                    })?;
                    tracing::info!(names = ?pair.names, expires = %httpdate::fmt_http_date(pair.not_after),
                        "TLS certificate issued by the ACME authority");
                    self.store.replace(pair);
                    SystemTime::now()
                }
            };
            authority.clone().keep_renewed(self.store.clone(), issued);
        }
        Ok(Speaks::tls(server_config(self.store.clone(), true)))
    }

    /// What the admin listener (and the publishing address) speaks.
    pub fn admin(&self) -> Speaks {
        match (&self.admin, self.admin_tls) {
            (Some(own), _) => Speaks::tls(server_config(own.clone(), true)),
            (None, true) => Speaks::tls(server_config(self.store.clone(), true)),
            (None, false) => Speaks::Plain,
        }
    }

    /// Every certificate served, by listener, for the status page and metrics.
    pub fn stores(&self) -> Vec<(&'static str, Arc<Store>)> {
        let mut all = vec![("main", self.store.clone())];
        if let Some(own) = &self.admin {
            all.push(("admin", own.clone()));
        }
        all
    }
}

/// A self-signed certificate for `domains`, served only until the authority's comes.
fn stand_in(domains: &[String]) -> Result<certs::Pair, String> {
    let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
    let cert =
        rcgen::CertificateParams::new(domains.to_vec()).and_then(|p| p.self_signed(&key)).map_err(|e| e.to_string())?;
    certs::from_pem(cert.pem().as_bytes(), key.serialize_pem().as_bytes(), "stand-in".as_ref(), "stand-in".as_ref())
        .map_err(|e| e.to_string())
}
