//! Who a request says it is: the identity headers that R reads, which no
//! client may set. Shiny takes `session$user` and `session$groups` from
//! `Shiny-Server-Credentials`, and sign-in proxies (oauth2-proxy and the
//! like) name their user in `X-Forwarded-User`, `-Email`, `-Groups` and
//! `-Preferred-Username`. valve trusts no peer to set them, so they are
//! removed from every request before R sees it.

use http::header::{HeaderMap, HeaderName};

/// The identity headers, lower case with `-`: R sees `x_forwarded_user` and
/// `x-forwarded-user` as one `HTTP_X_FORWARDED_USER`, so both spellings count.
const IDENTITY: [&str; 5] = [
    "shiny-server-credentials",
    "x-forwarded-user",
    "x-forwarded-email",
    "x-forwarded-groups",
    "x-forwarded-preferred-username",
];

/// Whether R would read `name` as one of the identity headers.
fn is_identity(name: &HeaderName) -> bool {
    let name = name.as_str();
    IDENTITY.iter().any(|id| {
        id.len() == name.len() && id.bytes().zip(name.bytes()).all(|(a, b)| a == if b == b'_' { b'-' } else { b })
    })
}

/// Removes every identity header a client sent; returns the names removed
/// (for a debug line: never their values).
pub fn strip_client_identity(headers: &mut HeaderMap) -> Vec<HeaderName> {
    let found: Vec<HeaderName> = headers.keys().filter(|n| is_identity(n)).cloned().collect();
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
        let removed = strip_client_identity(&mut h);
        assert_eq!(removed.len(), 7, "{removed:?}");
        let mut left: Vec<_> = h.keys().map(|k| k.as_str().to_string()).collect();
        left.sort();
        assert_eq!(left, ["x-forwarded-for", "x-forwarded-users"]);
    }
}
