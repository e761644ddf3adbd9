//! A certificate and its key, read from PEM and checked before valve serves
//! them: the chain parses, the key is one rustls can sign with, the key is
//! the certificate's, and the certificate has not expired.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

/// A certificate chain and its key, ready to serve.
#[derive(Clone, Debug)]
pub struct Pair {
    pub key: Arc<CertifiedKey>,
    /// When the leaf certificate expires.
    pub not_after: SystemTime,
    /// The names it is for (its subject alternative names), for the log.
    pub names: Vec<String>,
}

/// What is wrong with a certificate or its key.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("cannot read {}: {error} (check the path and that valve's user may read it)", path.display())]
    Read { path: PathBuf, error: std::io::Error },
    #[error("{} holds no PEM certificate (-----BEGIN CERTIFICATE-----): give the certificate (and its chain) as PEM", path.display())]
    NoCertificate { path: PathBuf },
    #[error("{} holds no PEM private key (PKCS#8, RSA or EC): give the certificate's key as PEM", path.display())]
    NoKey { path: PathBuf },
    #[error("{} is not a certificate valve can read: {why}", path.display())]
    Unreadable { path: PathBuf, why: String },
    #[error("the key in {} is not one TLS can sign with: {why} (use an RSA, ECDSA P-256/P-384 or Ed25519 key)", path.display())]
    BadKey { path: PathBuf, why: String },
    #[error("the key in {} is not the key of the certificate in {}: give the key the certificate was issued for", key.display(), cert.display())]
    Mismatch { cert: PathBuf, key: PathBuf },
    #[error("the certificate in {} expired {} ago ({}): renew it", path.display(), ago(.expired), httpdate::fmt_http_date(*.when))]
    Expired { path: PathBuf, when: SystemTime, expired: Duration },
}

fn ago(d: &Duration) -> String {
    match d.as_secs() {
        s if s < 120 => format!("{s} s"),
        s if s < 7200 => format!("{} min", s / 60),
        s if s < 2 * 86400 => format!("{} h", s / 3600),
        s => format!("{} days", s / 86400),
    }
}

/// Reads and checks a certificate file (a chain allowed: the leaf first) and its key file.
pub fn load(cert: &Path, key: &Path) -> Result<Pair, CertError> {
    let cert_pem = std::fs::read(cert).map_err(|error| CertError::Read { path: cert.into(), error })?;
    let key_pem = std::fs::read(key).map_err(|error| CertError::Read { path: key.into(), error })?;
    from_pem(&cert_pem, &key_pem, cert, key)
}

/// Checks a certificate chain and key given as PEM; `cert` and `key` name
/// where they came from, for messages.
pub fn from_pem(cert_pem: &[u8], key_pem: &[u8], cert: &Path, key: &Path) -> Result<Pair, CertError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| CertError::Unreadable { path: cert.into(), why: e.to_string() })?;
    let Some(leaf) = chain.first() else { return Err(CertError::NoCertificate { path: cert.into() }) };
    let (_, parsed) = x509_parser::parse_x509_certificate(leaf)
        .map_err(|e| CertError::Unreadable { path: cert.into(), why: e.to_string() })?;
    let not_after = UNIX_EPOCH + Duration::from_secs(parsed.validity().not_after.timestamp().max(0) as u64);
    let names = parsed
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| san.value.general_names.iter().map(name).collect())
        .unwrap_or_default();
    let private = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => CertError::NoKey { path: key.into() },
        other => CertError::BadKey { path: key.into(), why: other.to_string() },
    })?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&private)
        .map_err(|e| CertError::BadKey { path: key.into(), why: e.to_string() })?;
    let certified = CertifiedKey::new(chain, signer);
    certified.keys_match().map_err(|_| CertError::Mismatch { cert: cert.into(), key: key.into() })?;
    let now = SystemTime::now();
    if let Ok(expired) = now.duration_since(not_after) {
        return Err(CertError::Expired { path: cert.into(), when: not_after, expired });
    }
    Ok(Pair { key: Arc::new(certified), not_after, names })
}

/// A subject alternative name as people write it.
fn name(n: &x509_parser::extensions::GeneralName<'_>) -> String {
    use x509_parser::extensions::GeneralName;
    match n {
        GeneralName::DNSName(d) => d.to_string(),
        GeneralName::IPAddress(b) if b.len() == 4 => std::net::Ipv4Addr::new(b[0], b[1], b[2], b[3]).to_string(),
        GeneralName::IPAddress(b) if b.len() == 16 => {
            let mut a = [0u8; 16];
            a.copy_from_slice(b);
            std::net::Ipv6Addr::from(a).to_string()
        }
        other => other.to_string(),
    }
}

/// Days from now until `when` (negative once past), for the status page and metrics.
pub fn days_left(when: SystemTime) -> f64 {
    match when.duration_since(SystemTime::now()) {
        Ok(d) => d.as_secs_f64() / 86400.0,
        Err(e) => -(e.duration().as_secs_f64() / 86400.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap().self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn a_certificate_and_its_key_load_and_another_key_is_named() {
        let (cert, key) = pair("localhost");
        let (_, other) = pair("localhost");
        let ok = from_pem(cert.as_bytes(), key.as_bytes(), Path::new("c.pem"), Path::new("k.pem")).unwrap();
        assert_eq!(ok.names, vec!["localhost".to_string()]);
        assert!(days_left(ok.not_after) > 300.0);
        let wrong = from_pem(cert.as_bytes(), other.as_bytes(), Path::new("c.pem"), Path::new("k2.pem")).unwrap_err();
        assert!(wrong.to_string().contains("k2.pem is not the key of the certificate in c.pem"), "{wrong}");
        let none = from_pem(key.as_bytes(), key.as_bytes(), Path::new("k.pem"), Path::new("k.pem")).unwrap_err();
        assert!(matches!(none, CertError::NoCertificate { .. }), "{none}");
        let nokey = from_pem(cert.as_bytes(), cert.as_bytes(), Path::new("c.pem"), Path::new("c.pem")).unwrap_err();
        assert!(matches!(nokey, CertError::NoKey { .. }), "{nokey}");
    }

    #[test]
    fn an_expired_certificate_is_refused_with_its_date() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        let cert = params.self_signed(&key).unwrap();
        let e = from_pem(cert.pem().as_bytes(), key.serialize_pem().as_bytes(), Path::new("old.pem"), Path::new("k"))
            .unwrap_err();
        assert!(e.to_string().contains("old.pem expired") && e.to_string().contains("2021"), "{e}");
    }
}
