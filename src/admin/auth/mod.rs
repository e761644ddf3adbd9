//! Who is calling valve's admin pages, decided before what is asked (a
//! boundary: every app's R shares valve's host and network, and can reach
//! the admin port; an address is never a credential). Every admin path but
//! health and readiness needs one of:
//!
//! - the operator token (`Authorization: Bearer TOKEN`): valve makes it at
//!   start in the state folder (`admin.token`, 0600) unless
//!   `admin_token_file` names one; valve's subcommands, the R package and a
//!   Prometheus scrape send it; valve never prints it;
//! - a publishing key (`Authorization: Key KEY`): an admin key is an
//!   operator; any other key sees and changes its own published apps only;
//! - in a browser, the dashboard's sign-in: a key or the token typed once,
//!   then a session cookie (HttpOnly, SameSite=Strict, Secure over TLS);
//!   every POST a cookie carries must also carry the session's token in
//!   `X-Valve-CSRF` (`session`), which no other site's page can send;
//! - a user or group that `admin_users` / `admin_groups` lists, named by a
//!   trusted sign-in proxy (`trusted_proxies`).
//!
//! `/metrics` asks too: it names every app, its traffic and the keys that
//! published them. Prometheus sends the token (`authorization:
//! credentials_file:`), from `admin_token_file` on a cluster.

mod session;
pub mod sign_in;
mod who;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use http::header::{HeaderValue, AUTHORIZATION, COOKIE};
use http::HeaderMap;

use crate::config::secret_file::{self, Holds};
use crate::config::{AdminAccess, Trust};
pub use session::{Sessions, COOKIE_NAME};
pub use who::{Shown, Who};

/// The shortest operator token valve takes from `admin_token_file`.
pub const MIN_TOKEN_CHARS: usize = 20;

/// A publishing key's name and whether it is an admin key, for a key typed or sent.
pub type KeyLookup<'a> = &'a (dyn Fn(&str) -> Option<(String, bool)> + Sync);

/// The admin pages' credentials.
pub struct Auth {
    token_sha: [u8; 32],
    token_file: PathBuf,
    pub sessions: Sessions,
    users: Vec<String>,
    groups: Vec<String>,
}

impl Auth {
    /// The operator token: `access.token_file`'s, else the one in
    /// `state_dir/admin.token` (made now if missing, 0600). An error names
    /// the file and the fix.
    pub fn start(access: &AdminAccess, state_dir: &Path) -> Result<Auth, String> {
        let (token, token_file) = match &access.token_file {
            Some(path) => (read_token(path)?, path.clone()),
            None => {
                let made = if state_dir.exists() { Ok(()) } else { std::fs::create_dir_all(state_dir) };
                let dir = match made {
                    Ok(()) => state_dir.to_path_buf(),
                    // A read-only root (a container run as the image is, no
                    // volume for the state folder): a token for this run
                    // only, in a fresh private folder under TMPDIR.
                    Err(e) if e.raw_os_error() == Some(libc::EROFS) => {
                        let tmp = tempfile::Builder::new().prefix("valve-admin-").tempdir().map_err(|t| {
                            format!("cannot make the state folder {} for the operator token ({e}), nor a folder under TMPDIR ({t}): set --state-dir to a writable folder or --admin-token-file", state_dir.display())
                        })?;
                        tracing::warn!(
                            state_dir = %state_dir.display(),
                            "the state folder cannot be made (a read-only file system): the operator token is new at each start, in {}; set --state-dir to a volume or --admin-token-file to keep one",
                            tmp.path().display()
                        );
                        tmp.keep()
                    }
                    Err(e) => {
                        return Err(format!(
                            "cannot make the state folder {} for the operator token: {e}",
                            state_dir.display()
                        ))
                    }
                };
                let path = dir.join("admin.token");
                let key = secret_file::key_in(&path, "the operator token file")?;
                (crate::mac::hex(&key), path)
            }
        };
        Ok(Auth {
            token_sha: sha256(token.as_bytes()),
            token_file,
            sessions: Sessions::new(),
            users: access.users.clone(),
            groups: access.groups.clone(),
        })
    }

    /// Where the operator token is (the ready line says it; nothing prints the token).
    pub fn token_file(&self) -> &Path {
        &self.token_file
    }

    /// Whether `presented` is the operator token (compared whole, in constant time).
    pub fn is_token(&self, presented: &str) -> bool {
        crate::mac::same(&sha256(presented.trim().as_bytes()), &self.token_sha)
    }

    /// Who typed `secret` into the sign-in form: the token or a key.
    pub fn of_secret(&self, secret: &str, keys: KeyLookup<'_>) -> Option<Who> {
        let secret = secret.trim();
        if secret.is_empty() {
            return None;
        }
        if self.is_token(secret) {
            return Some(Who::Operator("token".into()));
        }
        keys(secret)
            .map(|(name, admin)| if admin { Who::Operator(format!("key {name}")) } else { Who::Publisher(name) })
    }

    /// Who is calling, from the request's headers and its peer: `None`
    /// when it showed nothing valve takes (the caller gets 401).
    pub fn who(
        &self,
        headers: &HeaderMap,
        peer: SocketAddr,
        trust: &Trust,
        keys: KeyLookup<'_>,
    ) -> Option<(Who, Shown)> {
        if let Some(value) = headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok()) {
            let (scheme, secret) = value.trim().split_once(' ').unwrap_or(("", ""));
            let secret = secret.trim();
            let who = match scheme.to_ascii_lowercase().as_str() {
                "bearer" if self.is_token(secret) => Some(Who::Operator("token".into())),
                "key" => self.of_secret(secret, keys),
                _ => None,
            };
            // A credential that is wrong is wrong: no cookie or proxy stands in for it.
            return who.map(|w| (w, Shown::Credential));
        }
        if let Some(who) = self.proxied(headers, peer, trust) {
            return Some((who, Shown::Credential));
        }
        let cookie = cookie_value(headers, COOKIE_NAME)?;
        self.sessions.get(&cookie).map(|(who, csrf)| (who, Shown::Cookie { csrf }))
    }

    /// A user or group of `admin_users` / `admin_groups`, named by a trusted
    /// sign-in proxy (never when `auth_url` asks a service instead).
    fn proxied(&self, headers: &HeaderMap, peer: SocketAddr, trust: &Trust) -> Option<Who> {
        if (self.users.is_empty() && self.groups.is_empty()) || trust.auth.is_some() || !trust.trusts(peer.ip()) {
            return None;
        }
        let id = crate::http::identity::read(headers, trust).ok()??;
        if self.users.iter().any(|u| *u == id.user) {
            return Some(Who::Operator(format!("user {}", id.user)));
        }
        id.groups
            .iter()
            .find(|g| self.groups.contains(g))
            .map(|g| Who::Operator(format!("user {} of group {g}", id.user)))
    }
}

/// The operator token in `path`: root's or valve's, nobody else's to write
/// or read (its group's to read only when valve is in that group: a
/// Kubernetes Secret read through the pod's fsGroup), at least `MIN_TOKEN_CHARS`.
fn read_token(path: &Path) -> Result<String, String> {
    use std::os::unix::fs::MetadataExt;
    let what = "admin_token_file";
    let meta = std::fs::metadata(path).map_err(|e| format!("{what} {}: cannot read it: {e}", path.display()))?;
    let mine = rustix::process::getgroups().unwrap_or_default().iter().any(|g| g.as_raw() == meta.gid())
        || rustix::process::getegid().as_raw() == meta.gid();
    let holds =
        if meta.mode() & 0o040 != 0 && mine && meta.mode() & 0o026 == 0 { Holds::NoSecret } else { Holds::Plain };
    secret_file::judge_meta(path, what, &meta, holds)?;
    if meta.mode() & 0o004 != 0 {
        return Err(format!(
            "{what} {}: its mode {:04o} lets every user read the token: chmod 600 {}",
            path.display(),
            meta.mode() & 0o7777,
            path.display()
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{what} {}: cannot read it: {e}", path.display()))?;
    let token = text.trim().to_string();
    if token.chars().count() < MIN_TOKEN_CHARS || token.contains(char::is_whitespace) {
        return Err(format!(
            "{what} {}: the token must be one word of at least {MIN_TOKEN_CHARS} characters (such as the output of `openssl rand -hex 32`)",
            path.display()
        ));
    }
    Ok(token)
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).into()
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub fn cookie_value(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v: &HeaderValue| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim().to_string())
}

/// Whether a POST a cookie carries may change something: it carries this
/// session's token in `X-Valve-CSRF`, and no browser said it comes from
/// another origin (a page on another port of this host is same-site, so
/// SameSite=Strict alone does not stop it).
pub fn csrf_ok(headers: &HeaderMap, csrf: &str) -> bool {
    let sent = headers.get("x-valve-csrf").and_then(|v| v.to_str().ok()).unwrap_or("");
    crate::mac::same(sent.as_bytes(), csrf.as_bytes()) && same_origin(headers)
}

/// Whether the browser's own headers (`Sec-Fetch-Site`, `Origin`) say the
/// request comes from valve's own page (absent: not a browser, or an old one).
pub fn same_origin(headers: &HeaderMap) -> bool {
    let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    if let Some(site) = header("sec-fetch-site") {
        if !matches!(site, "same-origin" | "none") {
            return false;
        }
    }
    match (header("origin"), header("host")) {
        (Some(origin), Some(host)) => {
            origin.split_once("://").map(|(_, rest)| rest.trim_end_matches('/')) == Some(host)
        }
        (Some(_), None) => false,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(dir: &Path) -> Auth {
        Auth::start(&AdminAccess { token_file: None, users: vec!["ops".into()], groups: vec!["sre".into()] }, dir)
            .unwrap()
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(http::header::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        h
    }

    #[test]
    fn the_token_a_key_a_session_or_a_listed_proxy_user_name_the_caller_and_nothing_else_does() {
        let dir = tempfile::tempdir().unwrap();
        let a = auth(dir.path());
        let token = std::fs::read_to_string(a.token_file()).unwrap().trim().to_string();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(a.token_file()).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(auth(dir.path()).is_token(&token), true, "the same token after a restart");
        let keys = |k: &str| match k {
            "ann-key-0123456789abcdef" => Some(("ann".to_string(), false)),
            "ops-key-0123456789abcdef" => Some(("ci".to_string(), true)),
            _ => None,
        };
        let peer: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let trust = Trust::default();
        let who = |h: &[(&str, &str)]| a.who(&headers(h), peer, &trust, &keys).map(|(w, _)| w);
        assert_eq!(who(&[("authorization", &format!("Bearer {token}"))]), Some(Who::Operator("token".into())));
        assert_eq!(who(&[("authorization", "Key ops-key-0123456789abcdef")]), Some(Who::Operator("key ci".into())));
        assert_eq!(who(&[("authorization", "Key ann-key-0123456789abcdef")]), Some(Who::Publisher("ann".into())));
        assert_eq!(who(&[("authorization", "Bearer nope")]), None);
        assert_eq!(who(&[]), None, "nothing shown, nothing known");
        assert_eq!(who(&[("x-forwarded-user", "ops")]), None, "no trusted proxy: a header names nobody");
        let trust = Trust { proxies: vec![crate::config::Cidr::parse("127.0.0.1").unwrap()], ..Trust::default() };
        let by_proxy = |h: &[(&str, &str)]| a.who(&headers(h), peer, &trust, &keys).map(|(w, _)| w);
        assert!(by_proxy(&[("x-forwarded-user", "ops")]).unwrap().is_operator());
        assert!(by_proxy(&[("x-forwarded-user", "eve"), ("x-forwarded-groups", "sre")]).unwrap().is_operator());
        assert_eq!(by_proxy(&[("x-forwarded-user", "eve")]), None, "a user not listed");
        let (cookie, csrf) = a.sessions.create(Who::Publisher("ann".into())).unwrap();
        let got =
            a.who(&headers(&[("cookie", &format!("x=1; {COOKIE_NAME}={cookie}"))]), peer, &Trust::default(), &keys);
        assert_eq!(got, Some((Who::Publisher("ann".into()), Shown::Cookie { csrf: csrf.clone() })));
        assert_eq!(a.who(&headers(&[("cookie", &format!("{COOKIE_NAME}=forged"))]), peer, &trust, &keys), None);
    }

    #[test]
    fn a_post_a_cookie_carries_needs_the_sessions_token_and_its_own_origin() {
        let ok = headers(&[("x-valve-csrf", "abc"), ("host", "127.0.0.1:9"), ("origin", "http://127.0.0.1:9")]);
        assert!(csrf_ok(&ok, "abc"));
        assert!(!csrf_ok(&ok, "abd"));
        assert!(!csrf_ok(&headers(&[("host", "127.0.0.1:9")]), "abc"), "a form cannot send the header");
        let other_port =
            headers(&[("x-valve-csrf", "abc"), ("host", "127.0.0.1:9"), ("origin", "http://127.0.0.1:3000")]);
        assert!(!csrf_ok(&other_port, "abc"), "another port of this host is another origin");
        assert!(!same_origin(&headers(&[("sec-fetch-site", "same-site")])));
        assert!(same_origin(&headers(&[("sec-fetch-site", "same-origin")])));
    }

    #[test]
    fn a_token_file_must_be_its_owners_alone_and_long_enough() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "short\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let given = |f: &Path| AdminAccess { token_file: Some(f.to_path_buf()), ..Default::default() };
        assert!(Auth::start(&given(&file), dir.path()).err().unwrap().contains("at least 20"));
        std::fs::write(&file, "a-token-long-enough-for-valve\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(Auth::start(&given(&file), dir.path()).err().unwrap().contains("chmod 600"));
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(Auth::start(&given(&file), dir.path()).unwrap().is_token("a-token-long-enough-for-valve"));
    }
}
