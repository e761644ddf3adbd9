//! The flags of HTTPS (`--tls-cert`, `--tls-key`, `--tls-acme-*`,
//! `--http-port`, `--hsts`, `--admin-tls*`), flattened into `Args`. Their
//! names in snake_case are the config keys.

use std::path::PathBuf;

use crate::config::tls::{list, TlsGiven, HSTS_DEFAULT};

/// HTTPS: a certificate from files or an ACME authority.
#[derive(clap::Args, Debug, Clone, Default)]
#[command(next_help_heading = "HTTPS")]
pub struct TlsFlags {
    /// Serve HTTPS (HTTP/2 and HTTP/1.1, TLS 1.2 and 1.3) on the main port with this certificate:
    /// a PEM file, the certificate first and its chain after it. Read again when it changes or on
    /// SIGHUP; a bad new one is refused with a warning and the old one serves on.
    #[arg(long = "tls-cert", env = "VALVE_TLS_CERT", value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The certificate's private key (PEM: PKCS#8, RSA or EC).
    #[arg(long = "tls-key", env = "VALVE_TLS_KEY", value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Get the certificate from an ACME authority (Let's Encrypt by default) for these DNS names
    /// (comma-separated), proven by HTTP-01 on --http-port (80), and renew it when a third of its
    /// life is left. The old certificate serves on while a renewal fails.
    #[arg(long = "tls-acme-domains", env = "VALVE_TLS_ACME_DOMAINS", value_name = "NAME,...", default_value = "")]
    pub tls_acme_domains: String,

    /// Email addresses the ACME authority may write to about the certificates (comma-separated).
    #[arg(long = "tls-acme-contact", env = "VALVE_TLS_ACME_CONTACT", value_name = "EMAIL,...", default_value = "")]
    pub tls_acme_contact: String,

    /// The ACME authority's directory URL. Default: Let's Encrypt's.
    #[arg(long = "tls-acme-directory", env = "VALVE_TLS_ACME_DIRECTORY", value_name = "URL")]
    pub tls_acme_directory: Option<String>,

    /// PEM certificates that sign the ACME authority's own HTTPS (a private authority); default:
    /// the system's roots.
    #[arg(long = "tls-acme-ca", env = "VALVE_TLS_ACME_CA", value_name = "FILE")]
    pub tls_acme_ca: Option<PathBuf>,

    /// Where the ACME account and certificates are kept. Default: `STATE_DIR/acme`.
    #[arg(long = "tls-acme-dir", env = "VALVE_TLS_ACME_DIR", value_name = "DIR")]
    pub tls_acme_dir: Option<PathBuf>,

    /// A plain-HTTP port beside HTTPS: it redirects every request to HTTPS (308), except ACME's
    /// HTTP-01 checks (/.well-known/acme-challenge/), which it answers. `auto`: 80 with ACME or when
    /// --port is 443, else none; `off`: none.
    #[arg(long = "http-port", env = "VALVE_HTTP_PORT", value_name = "PORT", default_value = "auto")]
    pub http_port: String,

    /// Strict-Transport-Security's max-age in seconds on HTTPS answers (0: not sent).
    #[arg(long = "hsts", env = "VALVE_HSTS", value_name = "SECONDS", default_value = HSTS_DEFAULT)]
    pub hsts: String,

    /// Serve the admin listener (and --publish-addr) over HTTPS too, with the main certificate
    /// or --admin-tls-cert.
    #[arg(long = "admin-tls", env = "VALVE_ADMIN_TLS")]
    pub admin_tls: bool,

    /// The admin listener's own certificate (PEM), if not the main one; with --admin-tls-key.
    #[arg(long = "admin-tls-cert", env = "VALVE_ADMIN_TLS_CERT", value_name = "FILE", requires = "admin_tls_key")]
    pub admin_tls_cert: Option<PathBuf>,

    /// The admin certificate's private key (PEM).
    #[arg(long = "admin-tls-key", env = "VALVE_ADMIN_TLS_KEY", value_name = "FILE", requires = "admin_tls_cert")]
    pub admin_tls_key: Option<PathBuf>,
}

impl TlsFlags {
    /// The flags as given, to be checked by `TlsGiven::settle`.
    pub(in crate::config) fn given(&self) -> TlsGiven {
        TlsGiven {
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            acme_domains: list(&self.tls_acme_domains),
            acme_contact: list(&self.tls_acme_contact),
            acme_directory: self.tls_acme_directory.clone(),
            acme_ca: self.tls_acme_ca.clone(),
            acme_dir: self.tls_acme_dir.clone(),
            http_port: self.http_port.clone(),
            hsts: self.hsts.clone(),
            admin_tls: self.admin_tls,
            admin_cert: self.admin_tls_cert.clone(),
            admin_key: self.admin_tls_key.clone(),
        }
    }
}
