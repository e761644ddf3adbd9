//! HTTPS settings: a certificate from files or from an ACME authority, the
//! plain-HTTP port that redirects to HTTPS, HSTS, and TLS on the admin and
//! publishing listeners. Given by flags (`flags::TlsFlags`) or config keys
//! of the same names; checked here once, whichever gave them.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Let's Encrypt's production directory: the default ACME authority.
pub const LETS_ENCRYPT: &str = "https://acme-v02.api.letsencrypt.org/directory";

/// HSTS's default max-age: a year, as browsers' preload lists ask.
pub const HSTS_DEFAULT: &str = "31536000";

/// HTTPS, when on.
#[derive(Clone, Debug, PartialEq)]
pub struct Tls {
    pub certs: CertSource,
    /// A plain-HTTP port that redirects to HTTPS (and answers ACME's HTTP-01 checks).
    pub http_port: Option<u16>,
    /// `Strict-Transport-Security`'s max-age, when sent.
    pub hsts: Option<Duration>,
    /// The admin listener (and the publishing address): plain, or HTTPS with which certificate.
    pub admin: AdminTls,
}

#[derive(Clone, Debug, PartialEq)]
pub enum CertSource {
    Files { cert: PathBuf, key: PathBuf },
    Acme(Acme),
}

/// Certificates from an ACME authority (HTTP-01 on the plain-HTTP port).
#[derive(Clone, Debug, PartialEq)]
pub struct Acme {
    pub domains: Vec<String>,
    /// `mailto:` addresses the authority may write to about the certificates.
    pub contact: Vec<String>,
    pub directory: String,
    /// PEM roots to trust the authority's own HTTPS with (a private authority), else the system's.
    pub ca: Option<PathBuf>,
    /// Where the account and certificates are kept.
    pub dir: PathBuf,
}

#[derive(Clone, Debug, PartialEq)]
pub enum AdminTls {
    Off,
    /// The main port's certificate.
    Same,
    Own {
        cert: PathBuf,
        key: PathBuf,
    },
}

/// The settings as given (a flag's or a key's text), before they are checked.
#[derive(Clone, Debug, Default)]
pub struct TlsGiven {
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub acme_domains: Vec<String>,
    pub acme_contact: Vec<String>,
    pub acme_directory: Option<String>,
    pub acme_ca: Option<PathBuf>,
    pub acme_dir: Option<PathBuf>,
    /// A port, `off`, or `auto` (80 with ACME or when the main port is 443).
    pub http_port: String,
    pub hsts: String,
    pub admin_tls: bool,
    pub admin_cert: Option<PathBuf>,
    pub admin_key: Option<PathBuf>,
}

impl TlsGiven {
    /// The checked settings; `base` is what relative paths are relative to,
    /// `state_dir` holds ACME's folder by default, `port` is the main port.
    /// The certificate files are read and checked too, so `--check` finds a
    /// bad one.
    pub fn settle(&self, base: &Path, state_dir: &Path, port: u16) -> Result<Option<Tls>, String> {
        let at = |p: &PathBuf| base.join(p);
        let certs = match (&self.cert, &self.key, self.acme_domains.is_empty()) {
            (None, None, true) => {
                if self.admin_tls || self.admin_cert.is_some() {
                    return Err("admin_tls needs HTTPS on the main port first: give tls_cert and tls_key, or tls_acme_domains".into());
                }
                return Ok(None);
            }
            (Some(_), Some(_), false) => {
                return Err("give a certificate either from files (tls_cert, tls_key) or from an ACME authority (tls_acme_domains), not both".into())
            }
            (Some(cert), Some(key), true) => {
                let (cert, key) = (at(cert), at(key));
                crate::tls::certs::load(&cert, &key).map_err(|e| format!("tls_cert: {e}"))?;
                CertSource::Files { cert, key }
            }
            (Some(_), None, _) => return Err("tls_cert is given without tls_key: give the certificate's key file too".into()),
            (None, Some(_), _) => return Err("tls_key is given without tls_cert: give the certificate file too".into()),
            (None, None, false) => CertSource::Acme(self.acme(base, state_dir)?),
        };
        let acme = matches!(certs, CertSource::Acme(_));
        let http_port = match self.http_port.trim() {
            "off" if acme => return Err("http_port = off: ACME's HTTP-01 check needs the plain-HTTP port (80, as the authority asks it); leave http_port at auto or give the port a proxy forwards 80 to".into()),
            "off" => None,
            "auto" | "" => (acme || port == 443).then_some(80),
            n => match n.parse::<u16>() {
                Ok(p) if p != 0 && p != port => Some(p),
                Ok(p) if p == port && p != 0 => return Err(format!("http_port = {p} is the HTTPS port too: give plain HTTP a port of its own (80) or `off`")),
                _ => return Err(format!("http_port = {n:?}: a port number (80), `auto` or `off`")),
            },
        };
        let hsts = match self.hsts.trim().parse::<u64>() {
            Ok(0) => None,
            Ok(s) => Some(Duration::from_secs(s)),
            Err(_) => {
                return Err(format!(
                    "hsts = {:?}: seconds browsers keep to HTTPS (31536000, a year), or 0 for none",
                    self.hsts
                ))
            }
        };
        let admin =
            match (&self.admin_cert, &self.admin_key) {
                (Some(cert), Some(key)) => {
                    let (cert, key) = (at(cert), at(key));
                    crate::tls::certs::load(&cert, &key).map_err(|e| format!("admin_tls_cert: {e}"))?;
                    AdminTls::Own { cert, key }
                }
                (None, None) if self.admin_tls => AdminTls::Same,
                (None, None) => AdminTls::Off,
                _ => return Err(
                    "admin_tls_cert and admin_tls_key go together: give both, or neither to use the main certificate"
                        .into(),
                ),
            };
        Ok(Some(Tls { certs, http_port, hsts, admin }))
    }

    fn acme(&self, base: &Path, state_dir: &Path) -> Result<Acme, String> {
        for d in &self.acme_domains {
            if let Some(why) = domain_problem(d) {
                return Err(format!("tls_acme_domains: {d:?} {why}"));
            }
        }
        let directory = self.acme_directory.clone().unwrap_or_else(|| LETS_ENCRYPT.to_string());
        if !directory.starts_with("https://") {
            return Err(format!(
                "tls_acme_directory = {directory:?}: an ACME directory is an https:// URL, such as {LETS_ENCRYPT}"
            ));
        }
        let contact = self
            .acme_contact
            .iter()
            .map(|c| if c.starts_with("mailto:") { c.clone() } else { format!("mailto:{c}") })
            .collect::<Vec<_>>();
        if let Some(bad) = contact.iter().find(|c| !c[7..].contains('@')) {
            return Err(format!("tls_acme_contact = {bad:?}: an email address, such as admin@example.org"));
        }
        let ca = self.acme_ca.as_ref().map(|p| base.join(p));
        if let Some(ca) = &ca {
            if !ca.is_file() {
                return Err(format!(
                    "tls_acme_ca = {}: no such file (PEM certificates that sign the authority's own HTTPS)",
                    ca.display()
                ));
            }
        }
        let dir = self.acme_dir.as_ref().map(|p| base.join(p)).unwrap_or_else(|| state_dir.join("acme"));
        Ok(Acme { domains: self.acme_domains.clone(), contact, directory, ca, dir })
    }
}

/// Why `name` cannot be an ACME certificate's name for HTTP-01, if it cannot.
fn domain_problem(name: &str) -> Option<&'static str> {
    if name.starts_with("*.") {
        return Some("is a wildcard: HTTP-01 cannot prove one (list each name, or terminate TLS at a proxy with a wildcard certificate)");
    }
    if name.parse::<std::net::IpAddr>().is_ok() {
        return Some("is an address: give the DNS names the site is reached by");
    }
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        });
    (!ok).then_some("is not a DNS name (letters, digits and hyphens, dot-separated, such as apps.example.org)")
}

/// Splits a comma-separated list, dropping empty items.
pub fn list(text: &str) -> Vec<String> {
    text.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn given() -> TlsGiven {
        TlsGiven { http_port: "auto".into(), hsts: HSTS_DEFAULT.into(), ..Default::default() }
    }

    #[test]
    fn acme_settings_default_to_lets_encrypt_port_80_and_the_state_folder() {
        let g = TlsGiven {
            acme_domains: vec!["apps.example.org".into()],
            acme_contact: vec!["ops@example.org".into()],
            ..given()
        };
        let tls = g.settle(Path::new("/etc/valve"), Path::new("/var/lib/valve"), 443).unwrap().unwrap();
        let CertSource::Acme(acme) = &tls.certs else { panic!("{tls:?}") };
        assert_eq!(acme.directory, LETS_ENCRYPT);
        assert_eq!(acme.contact, vec!["mailto:ops@example.org".to_string()]);
        assert_eq!(acme.dir, Path::new("/var/lib/valve/acme"));
        assert_eq!(tls.http_port, Some(80));
        assert_eq!(tls.hsts, Some(Duration::from_secs(31_536_000)));
        assert_eq!(tls.admin, AdminTls::Off);
    }

    #[test]
    fn bad_tls_settings_say_what_to_give() {
        let base = Path::new("/");
        let none = given().settle(base, base, 3000).unwrap();
        assert!(none.is_none());
        let half = TlsGiven { cert: Some("c.pem".into()), ..given() }.settle(base, base, 3000).unwrap_err();
        assert!(half.contains("without tls_key"), "{half}");
        let wild = TlsGiven { acme_domains: vec!["*.example.org".into()], ..given() }.settle(base, base, 443);
        assert!(wild.unwrap_err().contains("wildcard"));
        let off = TlsGiven { acme_domains: vec!["a.example".into()], http_port: "off".into(), ..given() };
        assert!(off.settle(base, base, 443).unwrap_err().contains("HTTP-01"));
        let plain_dir =
            TlsGiven { acme_domains: vec!["a.example".into()], acme_directory: Some("http://x/dir".into()), ..given() };
        assert!(plain_dir.settle(base, base, 443).unwrap_err().contains("https:// URL"));
        let missing = TlsGiven { cert: Some("/nowhere/c.pem".into()), key: Some("/nowhere/k.pem".into()), ..given() };
        let e = missing.settle(base, base, 443).unwrap_err();
        assert!(e.contains("cannot read /nowhere/c.pem"), "{e}");
        let admin = TlsGiven { admin_tls: true, ..given() }.settle(base, base, 443).unwrap_err();
        assert!(admin.contains("needs HTTPS on the main port"), "{admin}");
    }
}
