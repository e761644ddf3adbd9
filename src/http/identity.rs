//! Who a request says it is. Shiny takes `session$user` and
//! `session$groups` from `Shiny-Server-Credentials`, and sign-in proxies
//! (oauth2-proxy and the like) name their user in `X-Forwarded-User`,
//! `-Email`, `-Groups` and `-Preferred-Username`. Those headers, and the
//! names a trusted proxy is configured to use, are removed from every
//! request; the identity a trusted proxy gave (`read`), or a forward-auth
//! service's answer (`from_auth_answer`), is then written back by valve
//! alone, the way R reads it (`to_r`).

use http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::config::Trust;

/// The longest identity header valve reads from a trusted proxy (a user, an
/// email, a list of groups); past it the request gets 431.
pub const MAX_IDENTITY_BYTES: usize = 8 * 1024;

/// The canonical headers R reads (plumber's `req$HTTP_X_FORWARDED_USER`...).
static USER: HeaderName = HeaderName::from_static("x-forwarded-user");
static EMAIL: HeaderName = HeaderName::from_static("x-forwarded-email");
static GROUPS: HeaderName = HeaderName::from_static("x-forwarded-groups");
static CREDENTIALS: HeaderName = HeaderName::from_static("shiny-server-credentials");

/// Who is calling, as a trusted proxy said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The user header, else the email.
    pub user: String,
    pub email: Option<String>,
    /// Comma-separated in the header: trimmed, empties dropped.
    pub groups: Vec<String>,
}

/// An identity header valve will not pass on.
#[derive(Debug, PartialEq, Eq)]
pub enum BadIdentity {
    NotUtf8(String),
    TooLong(String),
}

/// The identity a trusted proxy's headers name; `None` when they name no
/// user (no user header and no email).
pub fn read(headers: &HeaderMap, trust: &Trust) -> Result<Option<Identity>, BadIdentity> {
    read_names(headers, trust.identity_headers())
}

/// oauth2-proxy's names for the identity in its `/oauth2/auth` answer (with `--set-xauthrequest`).
const AUTH_ANSWER: [&str; 3] = ["x-auth-request-user", "x-auth-request-email", "x-auth-request-groups"];

/// The identity a forward-auth service's answer names: each of the user,
/// email and groups from oauth2-proxy's `X-Auth-Request-*` header when the
/// answer has it, else from the header name `trust` reads (`X-Forwarded-User`...).
pub fn from_auth_answer(headers: &HeaderMap, trust: &Trust) -> Result<Option<Identity>, BadIdentity> {
    let configured = trust.identity_headers();
    let pick = |i: usize| if headers.contains_key(AUTH_ANSWER[i]) { AUTH_ANSWER[i] } else { configured[i] };
    read_names(headers, [pick(0), pick(1), pick(2)])
}

/// The identity in the headers named `[user, email, groups]`.
fn read_names(headers: &HeaderMap, [user, email, groups]: [&str; 3]) -> Result<Option<Identity>, BadIdentity> {
    let text = |name: &str| -> Result<Option<String>, BadIdentity> {
        let values: Vec<&HeaderValue> = headers.get_all(name).iter().collect();
        if values.is_empty() {
            return Ok(None);
        }
        if values.iter().map(|v| v.len() + 1).sum::<usize>() > MAX_IDENTITY_BYTES {
            return Err(BadIdentity::TooLong(name.to_string()));
        }
        let parts: Result<Vec<&str>, _> = values.iter().map(|v| std::str::from_utf8(v.as_bytes())).collect();
        let joined = parts.map_err(|_| BadIdentity::NotUtf8(name.to_string()))?.join(",");
        Ok(Some(joined.trim().to_string()).filter(|s| !s.is_empty()))
    };
    let user = text(user)?;
    let email = text(email)?;
    let groups = text(groups)?;
    let Some(user) = user.or_else(|| email.clone()) else { return Ok(None) };
    let groups =
        groups.iter().flat_map(|g| g.split(',')).map(str::trim).filter(|g| !g.is_empty()).map(str::to_string).collect();
    Ok(Some(Identity { user, email, groups }))
}

/// Writes the identity the way R reads it: `X-Forwarded-User`, `-Email`
/// and `-Groups` (joined by `,`) for every app, and for Shiny
/// `Shiny-Server-Credentials` (`{"user": ..., "groups": [...]}`), which
/// Shiny turns into `session$user` and `session$groups`.
pub fn to_r(headers: &mut HeaderMap, who: &Identity, shiny: bool) {
    let mut put = |name: &HeaderName, value: &str| {
        if let Ok(v) = HeaderValue::from_bytes(value.as_bytes()) {
            headers.insert(name.clone(), v);
        }
    };
    put(&USER, &who.user);
    if let Some(email) = &who.email {
        put(&EMAIL, email);
    }
    if !who.groups.is_empty() {
        put(&GROUPS, &who.groups.join(","));
    }
    if shiny {
        let json = serde_json::json!({ "user": who.user, "groups": who.groups }).to_string();
        put(&CREDENTIALS, &ascii_json(&json));
    }
}

/// JSON with every non-ASCII character escaped (`\uXXXX`), so the header is
/// plain ASCII whatever R's locale.
fn ascii_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    out
}

/// The identity headers, lower case with `-`: R sees `x_forwarded_user` and
/// `x-forwarded-user` as one `HTTP_X_FORWARDED_USER`, so both spellings count.
const IDENTITY: [&str; 9] = [
    "shiny-server-credentials",
    "x-forwarded-user",
    "x-forwarded-email",
    "x-forwarded-groups",
    "x-forwarded-preferred-username",
    "x-auth-request-user",
    "x-auth-request-email",
    "x-auth-request-groups",
    "x-auth-request-preferred-username",
];

/// Whether R would read `name` as one of the identity headers.
fn is_identity(name: &HeaderName) -> bool {
    let name = name.as_str();
    IDENTITY.iter().any(|id| {
        id.len() == name.len() && id.bytes().zip(name.bytes()).all(|(a, b)| a == if b == b'_' { b'-' } else { b })
    })
}

/// Removes every identity header a client sent, and the names `trust` reads
/// identity from; returns the names removed (for a debug line: never their values).
pub fn strip_client_identity(headers: &mut HeaderMap, trust: &Trust) -> Vec<HeaderName> {
    let configured = trust.identity_headers();
    let found: Vec<HeaderName> =
        headers.keys().filter(|n| is_identity(n) || configured.contains(&n.as_str())).cloned().collect();
    for name in &found {
        headers.remove(name);
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn a_client_cannot_name_itself_a_user_in_any_spelling() {
        let mut h = HeaderMap::new();
        for name in [
            "Shiny-Server-Credentials",
            "shiny_server_credentials",
            "X-Forwarded-User",
            "x_forwarded_user",
            "X-Forwarded-Email",
            "X-Forwarded-Groups",
            "X-Forwarded-Preferred-Username",
        ] {
            h.append(HeaderName::from_bytes(name.as_bytes()).unwrap(), HeaderValue::from_static("mallory"));
        }
        h.insert("x-forwarded-for", HeaderValue::from_static("203.0.113.7"));
        h.insert("x-forwarded-users", HeaderValue::from_static("kept"));
        h.insert("x-auth-request-user", HeaderValue::from_static("mallory"));
        h.insert("x-proxy-user", HeaderValue::from_static("mallory"));
        let trust = Trust { user_header: "x-proxy-user".into(), ..Trust::default() };
        let removed = strip_client_identity(&mut h, &trust);
        assert_eq!(removed.len(), 9, "{removed:?}");
        let mut left: Vec<_> = h.keys().map(|k| k.as_str().to_string()).collect();
        left.sort();
        assert_eq!(left, ["x-forwarded-for", "x-forwarded-users"]);
    }

    fn with(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_bytes(v).unwrap());
        }
        h
    }

    #[test]
    fn a_trusted_proxys_headers_name_the_user_its_email_and_groups() {
        let t = Trust::default();
        assert_eq!(read(&with(&[]), &t), Ok(None));
        assert_eq!(read(&with(&[("x-forwarded-groups", b"admin")]), &t), Ok(None), "groups alone name nobody");
        let who = read(&with(&[("x-forwarded-user", b"alice"), ("x-forwarded-groups", b" a, ,b ,")]), &t);
        assert_eq!(who, Ok(Some(Identity { user: "alice".into(), email: None, groups: vec!["a".into(), "b".into()] })));
        let who = read(&with(&[("x-forwarded-email", b"bob@example.org"), ("x-forwarded-groups", b"x")]), &t);
        assert_eq!(who.unwrap().unwrap().user, "bob@example.org", "no user header: the email is the user");
        let split = with(&[("x-forwarded-user", b"al"), ("x-forwarded-groups", b"a"), ("x-forwarded-groups", b"b")]);
        assert_eq!(read(&split, &t).unwrap().unwrap().groups, ["a", "b"]);
        let custom = Trust { user_header: "x-auth-request-user".into(), ..Trust::default() };
        let h = with(&[("x-auth-request-user", b"carol"), ("x-forwarded-user", b"mallory")]);
        assert_eq!(read(&h, &custom).unwrap().unwrap().user, "carol");
    }

    #[test]
    fn an_auth_answer_names_the_user_in_oauth2_proxys_headers_else_the_configured_ones() {
        let t = Trust::default();
        let h = with(&[
            ("x-auth-request-user", b"alice"),
            ("x-auth-request-groups", b"staff,admins"),
            ("x-forwarded-user", b"other"),
            ("x-forwarded-email", b"alice@example.org"),
        ]);
        let who = from_auth_answer(&h, &t).unwrap().unwrap();
        assert_eq!(
            (who.user.as_str(), who.email.as_deref(), who.groups.len()),
            ("alice", Some("alice@example.org"), 2),
            "each field from X-Auth-Request-* when present, else the configured name"
        );
        assert_eq!(from_auth_answer(&with(&[("x-forwarded-user", b"bob")]), &t).unwrap().unwrap().user, "bob");
        assert_eq!(from_auth_answer(&with(&[]), &t), Ok(None));
    }

    #[test]
    fn identity_headers_too_long_or_not_utf8_are_refused() {
        let t = Trust::default();
        let long = vec![b'g'; MAX_IDENTITY_BYTES + 1];
        let h = with(&[("x-forwarded-user", b"alice"), ("x-forwarded-groups", &long)]);
        assert_eq!(read(&h, &t), Err(BadIdentity::TooLong("x-forwarded-groups".into())));
        let h = with(&[("x-forwarded-user", b"al\xffice")]);
        assert_eq!(read(&h, &t), Err(BadIdentity::NotUtf8("x-forwarded-user".into())));
        let h = with(&[("x-forwarded-user", "zoë".as_bytes())]);
        assert_eq!(read(&h, &t).unwrap().unwrap().user, "zoë");
    }

    #[test]
    fn r_reads_the_identity_valve_writes() {
        let who =
            Identity { user: "zoë".into(), email: Some("z@example.org".into()), groups: vec!["a".into(), "b".into()] };
        let mut h = HeaderMap::new();
        to_r(&mut h, &who, false);
        assert_eq!(h["x-forwarded-user"].as_bytes(), "zoë".as_bytes());
        assert_eq!(
            (h["x-forwarded-email"].to_str().unwrap(), h["x-forwarded-groups"].to_str().unwrap()),
            ("z@example.org", "a,b")
        );
        assert!(!h.contains_key("shiny-server-credentials"));
        to_r(&mut h, &who, true);
        let creds = h["shiny-server-credentials"].to_str().unwrap();
        assert_eq!(creds, r#"{"groups":["a","b"],"user":"zo\u00eb"}"#);
        let back: serde_json::Value = serde_json::from_str(creds).unwrap();
        assert_eq!(back["user"], "zoë");
    }
}
