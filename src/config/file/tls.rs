//! A config file's HTTPS keys (`tls_cert`, `tls_key`, `tls_acme_*`,
//! `http_port`, `hsts`, `admin_tls*`): the file's where given, else the
//! flags'; checked by `config::tls`.

use std::path::{Path, PathBuf};

use super::Cx;
use crate::config::tls::{list, Tls};

impl Cx<'_> {
    /// A key that holds one string (`what` it must be, for the message), else the flag's.
    fn tls_text(&mut self, key: &str, flag: Option<String>, what: &str) -> Option<Option<String>> {
        let Some(v) = self.pick(key, None) else { return Some(flag) };
        match v.get_ref().as_str().filter(|s| !s.is_empty()) {
            Some(s) => Some(Some(s.to_string())),
            None => {
                self.at(v.span(), format!("{key} = {}: must be {what}", v.get_ref()));
                None
            }
        }
    }

    /// A key that names a file or folder (relative to the config file's folder), else the flag's.
    fn tls_path(&mut self, key: &str, flag: &Option<PathBuf>) -> Option<Option<PathBuf>> {
        match self.pick(key, None) {
            Some(_) => {
                self.tls_text(key, None, "a path, such as \"/etc/valve/tls/cert.pem\"").map(|t| t.map(PathBuf::from))
            }
            None => Some(flag.clone()),
        }
    }

    /// A key that holds a list of names (an array or one comma-separated string), else the flag's.
    fn tls_list(&mut self, key: &str, flag: &str) -> Option<Vec<String>> {
        let Some(v) = self.pick(key, None) else { return Some(list(flag)) };
        let items = match v.get_ref() {
            toml::Value::String(s) => Some(list(s)),
            toml::Value::Array(items) => items.iter().map(|i| i.as_str().map(str::to_string)).collect(),
            _ => None,
        };
        if items.is_none() {
            self.at(v.span(), format!("{key} must be a list of strings, such as [\"apps.example.org\"]"));
        }
        items
    }

    /// A key that is a number or a word (`http_port`, `hsts`), as text, else the flag's.
    fn tls_word(&mut self, key: &str, flag: &str) -> Option<String> {
        let Some(v) = self.pick(key, None) else { return Some(flag.to_string()) };
        match v.get_ref() {
            toml::Value::Integer(i) => Some(i.to_string()),
            toml::Value::String(s) => Some(s.clone()),
            other => {
                self.at(v.span(), format!("{key} = {other}: a number or a word such as \"off\""));
                None
            }
        }
    }

    pub(super) fn tls(&mut self, base: &Path, state_dir: &Path, port: u16) -> Option<Option<Tls>> {
        let f = &self.args.tls;
        let mut given = f.given();
        given.cert = self.tls_path("tls_cert", &f.tls_cert)?;
        given.key = self.tls_path("tls_key", &f.tls_key)?;
        given.acme_domains = self.tls_list("tls_acme_domains", &f.tls_acme_domains)?;
        given.acme_contact = self.tls_list("tls_acme_contact", &f.tls_acme_contact)?;
        given.acme_directory = self
            .tls_path("tls_acme_directory", &f.tls_acme_directory.as_ref().map(PathBuf::from))?
            .map(|p| p.display().to_string());
        given.acme_ca = self.tls_path("tls_acme_ca", &f.tls_acme_ca)?;
        given.acme_dir = self.tls_path("tls_acme_dir", &f.tls_acme_dir)?;
        given.http_port = self.tls_word("http_port", &f.http_port)?;
        given.hsts = self.tls_word("hsts", &f.hsts)?;
        given.admin_tls = self.boolean("admin_tls", None, f.admin_tls)?;
        given.admin_cert = self.tls_path("admin_tls_cert", &f.admin_tls_cert)?;
        given.admin_key = self.tls_path("admin_tls_key", &f.admin_tls_key)?;
        match given.settle(base, state_dir, port) {
            Ok(tls) => Some(tls),
            Err(why) => {
                let span = ["tls_cert", "tls_acme_domains", "http_port", "hsts", "admin_tls"]
                    .iter()
                    .find_map(|k| self.pick(k, None).map(|v| v.span()));
                match span {
                    Some(span) => self.at(span, why),
                    None => self.nowhere(why),
                }
                None
            }
        }
    }
}
