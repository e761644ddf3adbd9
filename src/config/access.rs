//! Who may call, as plain data: the peers whose forwarding and identity
//! headers valve believes (`Trust`: `trusted_proxies`, the header names a
//! sign-in proxy uses, the sign-in URL, the forward-auth service `AuthService`)
//! and each app's allow lists (`Allow`),
//! with the pure rules over them (does a CIDR hold an address, does an
//! identity pass an allow list).

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

/// The form a trusted proxy is written in, for messages.
pub const CIDR_FORM: &str = "an address or a CIDR such as 10.0.0.0/8, 192.168.1.5 or fd00::/8";

/// The identity headers a sign-in proxy sends by default (oauth2-proxy with
/// `--pass-user-headers`).
pub const DEFAULT_USER_HEADER: &str = "X-Forwarded-User";
pub const DEFAULT_EMAIL_HEADER: &str = "X-Forwarded-Email";
pub const DEFAULT_GROUPS_HEADER: &str = "X-Forwarded-Groups";

/// A network: an address and how many of its leading bits count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    bits: u8,
}

impl Cidr {
    /// `10.0.0.0/8`, `fd00::/8`, or a bare address (`/32`, `/128`).
    pub fn parse(text: &str) -> Result<Cidr, String> {
        let bad = || format!("{text:?} is not {CIDR_FORM}");
        let text = text.trim();
        let (addr, bits) = match text.split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (text, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            None => max,
            Some(b) if !b.is_empty() && b.bytes().all(|c| c.is_ascii_digit()) => {
                b.parse::<u8>().ok().filter(|n| *n <= max).ok_or_else(bad)?
            }
            Some(_) => return Err(bad()),
        };
        Ok(Cidr { addr, bits })
    }

    /// Whether `ip` is inside this network (an IPv4 peer seen as `::ffff:a.b.c.d` counts as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let bits = u32::from(self.bits);
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = if bits == 0 { 0 } else { u32::MAX << (32 - bits) };
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = if bits == 0 { 0 } else { u128::MAX << (128 - bits) };
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.bits)
    }
}

/// Parses a comma-separated list (a flag or variable); empty: nobody.
pub fn parse_cidrs(list: &str) -> Result<Vec<Cidr>, String> {
    list.split(',').map(str::trim).filter(|s| !s.is_empty()).map(Cidr::parse).collect()
}

/// Whom valve believes about who is calling and from where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trust {
    /// Peers whose `X-Forwarded-For`/`Forwarded` and identity headers count; none by default.
    pub proxies: Vec<Cidr>,
    /// The header names the sign-in proxy uses, lower case.
    pub user_header: String,
    pub email_header: String,
    pub groups_header: String,
    /// Where a browser with no identity is sent when an app refuses it (`{rd}`:
    /// the path it asked for, `{url}` the full URL, escaped; with neither, an
    /// `rd` parameter is added).
    pub sign_in_url: Option<String>,
    /// `auth_url`: asked about every request to an app; then no identity
    /// header is believed from anyone.
    pub auth: Option<AuthService>,
}

impl Default for Trust {
    fn default() -> Self {
        Trust {
            proxies: Vec::new(),
            user_header: DEFAULT_USER_HEADER.to_ascii_lowercase(),
            email_header: DEFAULT_EMAIL_HEADER.to_ascii_lowercase(),
            groups_header: DEFAULT_GROUPS_HEADER.to_ascii_lowercase(),
            sign_in_url: None,
            auth: None,
        }
    }
}

impl Trust {
    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.proxies.iter().any(|c| c.contains(ip))
    }

    /// The names a sign-in proxy's identity is read from: `[user, email, groups]`.
    pub fn identity_headers(&self) -> [&str; 3] {
        [&self.user_header, &self.email_header, &self.groups_header]
    }
}

/// A header name as an identity header: letters, digits and `-`, lower case.
pub fn header_name(value: &str) -> Result<String, String> {
    let v = value.trim();
    if v.is_empty() || v.len() > 100 || !v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(format!("{value:?} is not a header name (letters, digits and `-`, such as X-Forwarded-User)"));
    }
    Ok(v.to_ascii_lowercase())
}

/// A sign-in URL: absolute `http(s)://` or a path on this host.
pub fn sign_in_url(value: &str) -> Result<String, String> {
    let v = value.trim();
    let ok = (v.starts_with("https://") || v.starts_with("http://") || (v.starts_with('/') && !v.starts_with("//")))
        && !v.bytes().any(|b| b.is_ascii_control() || b == b' ');
    if !ok {
        return Err(format!(
            "{value:?} is not a sign-in URL: use an absolute URL or a path, such as \"/oauth2/start?rd={{rd}}\""
        ));
    }
    Ok(v.to_string())
}

/// The forward-auth service (`auth_url`, `auth_cache`): where valve asks
/// whether to let a request in and who it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthService {
    /// As written, for messages and logs.
    pub url: String,
    /// What to connect to and name in `Host`.
    pub host: String,
    pub port: u16,
    pub authority: String,
    /// The path and query asked for (`/oauth2/auth`).
    pub path: String,
    /// How long an answer is reused for the same credentials; zero: never.
    pub cache: Duration,
}

/// The form an auth URL is written in, for messages.
pub const AUTH_URL_FORM: &str = "an http:// URL such as \"http://127.0.0.1:4180/oauth2/auth\"";

/// An `auth_url`: `http://host[:port]/path`. Not https: valve has no TLS
/// client, so the auth service is a sidecar or on the local network.
pub fn auth_service(value: &str, cache: Duration) -> Result<AuthService, String> {
    let v = value.trim();
    let bad = |why: &str| format!("{value:?} is not {AUTH_URL_FORM}: {why}");
    if v.len() >= 8 && v[..8].eq_ignore_ascii_case("https://") {
        return Err(bad("https is not supported (valve has no TLS client); run the auth service beside valve"));
    }
    let Some(rest) = v.get(7..).filter(|_| v[..7].eq_ignore_ascii_case("http://")) else {
        return Err(bad("it must start with http://"));
    };
    if v.bytes().any(|b| b.is_ascii_control() || b == b' ' || b == b'#') {
        return Err(bad("no spaces, control characters or fragments"));
    }
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(split);
    let path = match path {
        "" => "/".to_string(),
        p if p.starts_with('?') => format!("/{p}"),
        p => p.to_string(),
    };
    let parsed: http::uri::Authority = authority.parse().map_err(|_| bad("no host"))?;
    if authority.is_empty() || authority.contains('@') {
        return Err(bad("give a host (and port), without a user or password"));
    }
    let host = parsed.host().trim_start_matches('[').trim_end_matches(']').to_string();
    let port = parsed.port_u16().unwrap_or(80);
    Ok(AuthService { url: v.to_string(), host, port, authority: authority.to_string(), path, cache })
}

/// Who may use an app. Neither list: everyone. Otherwise a caller passes if
/// its user or email is in `users` (emails compared case-insensitively) or
/// one of its groups is in `groups`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allow {
    pub users: Option<Vec<String>>,
    pub groups: Option<Vec<String>>,
}

impl Allow {
    pub fn is_open(&self) -> bool {
        self.users.is_none() && self.groups.is_none()
    }

    /// Lists given, but naming no one: nobody can get in.
    pub fn names_nobody(&self) -> bool {
        !self.is_open() && self.users.iter().chain(self.groups.iter()).all(Vec::is_empty)
    }

    /// Whether a caller with this user, email and groups may pass.
    pub fn admits(&self, user: Option<&str>, email: Option<&str>, groups: &[String]) -> bool {
        if self.is_open() {
            return true;
        }
        let named = |want: &String| {
            user.is_some_and(|u| u == want || (u.contains('@') && u.eq_ignore_ascii_case(want)))
                || email.is_some_and(|e| e.eq_ignore_ascii_case(want))
        };
        self.users.iter().flatten().any(named) || self.groups.iter().flatten().any(|g| groups.contains(g))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn cidrs_parse_bare_addresses_and_refuse_what_is_not_one() {
        assert_eq!(Cidr::parse("127.0.0.1").unwrap().to_string(), "127.0.0.1/32");
        assert_eq!(Cidr::parse(" ::1 ").unwrap().to_string(), "::1/128");
        assert_eq!(Cidr::parse("10.0.0.0/8").unwrap().to_string(), "10.0.0.0/8");
        for bad in ["10.0.0/8", "10.0.0.0/33", "fd00::/129", "10.0.0.0/", "10.0.0.0/-1", "localhost", "", "1.2.3.4/8/8"]
        {
            let e = Cidr::parse(bad).unwrap_err();
            assert!(e.contains(&format!("{:?}", bad.trim())) && e.contains("10.0.0.0/8"), "{e}");
        }
        assert_eq!(parse_cidrs("127.0.0.1/32, 10.0.0.0/8,").unwrap().len(), 2);
        assert!(parse_cidrs("").unwrap().is_empty());
        assert!(parse_cidrs("10.0.0.0/8,nope").unwrap_err().contains("\"nope\""));
    }

    #[test]
    fn cidrs_hold_their_networks_only() {
        let net = Cidr::parse("10.1.0.0/16").unwrap();
        assert!(net.contains(ip("10.1.255.3")));
        assert!(!net.contains(ip("10.2.0.1")));
        assert!(net.contains(ip("::ffff:10.1.0.9")), "an IPv4 peer on a dual-stack socket");
        assert!(!net.contains(ip("fd00::1")));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains(ip("203.0.113.7")));
        let v6 = Cidr::parse("fd00::/8").unwrap();
        assert!(v6.contains(ip("fd12::1")) && !v6.contains(ip("fe80::1")) && !v6.contains(ip("10.0.0.1")));
        assert!(!Trust::default().trusts(ip("127.0.0.1")), "nobody is trusted by default, not even loopback");
    }

    #[test]
    fn allow_lists_admit_users_emails_and_groups() {
        let open = Allow::default();
        assert!(open.is_open() && open.admits(None, None, &[]));
        let users = Allow { users: Some(vec!["alice".into(), "Bob@Example.org".into()]), groups: None };
        assert!(users.admits(Some("alice"), None, &[]));
        assert!(!users.admits(Some("Alice"), None, &[]), "user names are compared exactly");
        assert!(users.admits(Some("carol"), Some("bob@example.ORG"), &[]), "emails case-insensitively");
        assert!(users.admits(Some("bob@example.org"), None, &[]), "a user that is an email");
        assert!(!users.admits(None, None, &["alice".into()]));
        let groups = Allow { users: None, groups: Some(vec!["staff".into()]) };
        assert!(groups.admits(Some("x"), None, &["a".into(), "staff".into()]));
        assert!(!groups.admits(Some("alice"), None, &["Staff".into()]));
        let both = Allow { users: Some(vec!["alice".into()]), groups: Some(vec!["staff".into()]) };
        assert!(both.admits(Some("alice"), None, &[]) && both.admits(Some("dan"), None, &["staff".into()]));
        let nobody = Allow { users: Some(vec![]), groups: None };
        assert!(nobody.names_nobody() && !nobody.admits(Some("alice"), Some("a@b"), &["staff".into()]));
        assert!(!users.names_nobody() && !open.names_nobody());
    }

    #[test]
    fn header_names_and_sign_in_urls_are_checked() {
        assert_eq!(header_name("X-Auth-Request-User").unwrap(), "x-auth-request-user");
        assert!(header_name("X User").is_err() && header_name("").is_err());
        assert!(sign_in_url("/oauth2/start?rd={rd}").is_ok() && sign_in_url("https://sso.example.org/").is_ok());
        assert!(sign_in_url("//evil.example").is_err() && sign_in_url("javascript:x").is_err());
    }

    #[test]
    fn auth_urls_are_plain_http_with_a_host() {
        let s = auth_service(" http://127.0.0.1:4180/oauth2/auth ", Duration::from_secs(5)).unwrap();
        assert_eq!(
            (s.host.as_str(), s.port, s.authority.as_str(), s.path.as_str()),
            ("127.0.0.1", 4180, "127.0.0.1:4180", "/oauth2/auth")
        );
        let s = auth_service("HTTP://[::1]?a=1", Duration::ZERO).unwrap();
        assert_eq!((s.host.as_str(), s.port, s.path.as_str()), ("::1", 80, "/?a=1"));
        assert_eq!(auth_service("http://auth", Duration::ZERO).unwrap().path, "/");
        for bad in [
            "https://sso.example.org/auth",
            "ftp://x",
            "127.0.0.1:4180/auth",
            "http://",
            "http:///x",
            "http://u:p@h/",
            "http://h/a b",
            "",
        ] {
            let e = auth_service(bad, Duration::ZERO).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")) && e.contains("http://127.0.0.1:4180"), "{e}");
        }
        assert!(auth_service("https://x/", Duration::ZERO).unwrap_err().contains("TLS"));
    }
}
