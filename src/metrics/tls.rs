//! The certificates valve serves (`valve_tls_certificate_days_left`,
//! `valve_tls_certificate_renewal_failing`), by listener.

use std::fmt::Write;
use std::sync::{Arc, OnceLock};

use crate::tls::{certs::days_left, Store};

/// The certificate stores, by listener (`main`, `admin`), once HTTPS is on.
#[derive(Default)]
pub struct TlsCerts(OnceLock<Vec<(&'static str, Arc<Store>)>>);

impl TlsCerts {
    pub fn set(&self, stores: Vec<(&'static str, Arc<Store>)>) {
        let _ = self.0.set(stores);
    }

    pub fn stores(&self) -> &[(&'static str, Arc<Store>)] {
        self.0.get().map(Vec::as_slice).unwrap_or(&[])
    }

    pub(super) fn render(&self, out: &mut String) {
        let stores = self.stores();
        if stores.is_empty() {
            return;
        }
        type Value = fn(&Store) -> String;
        let families: [(&str, &str, Value); 2] = [
            (
                "valve_tls_certificate_days_left",
                "Days until the certificate served expires (negative once expired), by listener.",
                |s| format!("{:.4}", days_left(s.shown().not_after)),
            ),
            (
                "valve_tls_certificate_renewal_failing",
                "1 while the last attempt to replace the certificate (read again, or renewed) failed and the old one serves on.",
                |s| u8::from(s.shown().failing.is_some()).to_string(),
            ),
        ];
        for (name, help, value) in families {
            super::family::header(out, name, "gauge", help);
            for (listener, store) in stores {
                let _ = writeln!(out, "{name}{{listener=\"{listener}\"}} {}", value(store));
            }
        }
    }
}
