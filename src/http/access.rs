//! Who is calling and may they: from the peer and the request's head, the
//! client's address (believed only from a trusted proxy), its identity (from
//! a trusted proxy's headers, or the forward-auth service's answer, looked up
//! before and handed in as `Named`) and whether the app's allow lists let the
//! request in. Pure: `decide` returns a `Gate` as data, and the front obeys
//! it before the forwarder is asked, so a request refused here takes no
//! worker and joins no queue.

use std::net::SocketAddr;

use http::header::{self, HeaderMap};
use http::Method;

use super::forwarded::{client_addr, origin, Malformed};
use super::identity::{read, BadIdentity, Identity};
use crate::config::{Allow, Trust};

/// What the front does with a request, and what it learnt.
#[derive(Debug, PartialEq, Eq)]
pub enum Gate {
    /// Forward it, as from `client`, naming `who` to R.
    Admit { client: SocketAddr, who: Option<Identity> },
    /// 403: the allow lists do not name this caller (or it has no identity).
    Forbid { who: Option<Identity> },
    /// 302 to the sign-in URL: a browser with no identity asked for a page.
    SignIn(String),
    /// 400 or 431: an identity header valve will not pass on.
    Bad(BadIdentity),
}

/// Where a request's identity comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Named {
    /// Its own headers, believed from a trusted proxy only.
    ByHeaders,
    /// The forward-auth service's answer (`None`: it knows nobody); then no
    /// identity header is believed from anyone.
    ByAuth(Option<Identity>),
}

/// The request facts the gate looks at.
pub struct Asking<'a> {
    pub peer: SocketAddr,
    pub method: &'a Method,
    pub headers: &'a HeaderMap,
    /// The path and query asked for (for the sign-in URL's `rd`).
    pub target: &'a str,
    pub websocket: bool,
    pub named: Named,
}

/// The client's address: the peer, or behind a trusted proxy what its
/// forwarding headers say. A malformed one is ignored (the peer is the
/// client) and logged at debug.
pub fn client(trust: &Trust, peer: SocketAddr, headers: &HeaderMap) -> SocketAddr {
    if !trust.trusts(peer.ip()) {
        return peer;
    }
    client_addr(peer, headers, trust).unwrap_or_else(|Malformed(header)| {
        tracing::debug!(%peer, header, "malformed forwarding header from a trusted proxy ignored");
        peer
    })
}

/// The gate for one request to an app with `allow`. From an untrusted peer
/// nothing it says about itself or its client counts: it is the client, and
/// it has no identity but what the forward-auth service says.
pub fn decide(trust: &Trust, allow: &Allow, ask: &Asking) -> Gate {
    let trusted = trust.trusts(ask.peer.ip());
    let client = client(trust, ask.peer, ask.headers);
    let who = match &ask.named {
        Named::ByAuth(who) => who.clone(),
        Named::ByHeaders if trusted => match read(ask.headers, trust) {
            Ok(who) => who,
            Err(bad) => return Gate::Bad(bad),
        },
        Named::ByHeaders => None,
    };
    let admitted = match &who {
        Some(w) => allow.admits(Some(&w.user), w.email.as_deref(), &w.groups),
        None => allow.is_open(),
    };
    if admitted {
        return Gate::Admit { client, who };
    }
    match (&who, &trust.sign_in_url) {
        (None, Some(url)) if navigation(ask) => {
            let full = origin(ask.headers, trusted).map(|(proto, host)| format!("{proto}://{host}{}", ask.target));
            Gate::SignIn(sign_in_location(url, ask.target, full.as_deref()))
        }
        _ => Gate::Forbid { who },
    }
}

/// A browser asking for a page: GET, accepting HTML, not a WebSocket.
fn navigation(ask: &Asking) -> bool {
    *ask.method == Method::GET
        && !ask.websocket
        && ask.headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|a| a.contains("text/html"))
}

/// The sign-in URL with the URL asked for in it, escaped: at `{url}` the
/// full URL (`http://host/path?query`, for a sign-in service on another
/// host or port), at `{rd}` the path and query; with neither, the path and
/// query as an `rd` query parameter (what oauth2-proxy's `/oauth2/start?rd=` reads).
pub fn sign_in_location(url: &str, target: &str, full: Option<&str>) -> String {
    let rd = escape(target);
    if url.contains("{url}") {
        return url.replace("{url}", &escape(full.unwrap_or(target)));
    }
    if url.contains("{rd}") {
        return url.replace("{rd}", &rd);
    }
    let join = if url.contains('?') { '&' } else { '?' };
    format!("{url}{join}rd={rd}")
}

/// Percent-encodes all but RFC 3986's unreserved characters and `/`.
fn escape(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Cidr;
    use http::{HeaderName, HeaderValue};

    fn trust(proxies: &[&str], sign_in: Option<&str>) -> Trust {
        Trust {
            proxies: proxies.iter().map(|c| Cidr::parse(c).unwrap()).collect(),
            sign_in_url: sign_in.map(str::to_string),
            ..Trust::default()
        }
    }

    fn gate(t: &Trust, allow: &Allow, peer: &str, pairs: &[(&str, &str)]) -> Gate {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        let ask = Asking {
            peer: peer.parse().unwrap(),
            method: &Method::GET,
            headers: &h,
            target: "/app/?x=1",
            websocket: false,
            named: Named::ByHeaders,
        };
        decide(t, allow, &ask)
    }

    fn staff() -> Allow {
        Allow { users: Some(vec!["alice".into()]), groups: Some(vec!["staff".into()]) }
    }

    const PROXY: &str = "127.0.0.1:4180";

    #[test]
    fn an_untrusted_peer_has_no_identity_and_is_its_own_client() {
        let t = trust(&["10.0.0.0/8"], None);
        let named = [("x-forwarded-user", "alice"), ("x-forwarded-for", "203.0.113.7")];
        let g = gate(&t, &Allow::default(), PROXY, &named);
        assert_eq!(g, Gate::Admit { client: PROXY.parse().unwrap(), who: None });
        assert_eq!(gate(&t, &staff(), PROXY, &named), Gate::Forbid { who: None });
    }

    #[test]
    fn a_trusted_proxy_names_the_client_and_the_user() {
        let t = trust(&["127.0.0.1"], None);
        let named = [("x-forwarded-user", "alice"), ("x-forwarded-for", "203.0.113.7")];
        match gate(&t, &staff(), PROXY, &named) {
            Gate::Admit { client, who: Some(who) } => {
                assert_eq!((client.to_string().as_str(), who.user.as_str()), ("203.0.113.7:0", "alice"))
            }
            other => panic!("{other:?}"),
        }
        let grouped = [("x-forwarded-user", "dan"), ("x-forwarded-groups", "x, staff")];
        assert!(matches!(gate(&t, &staff(), PROXY, &grouped), Gate::Admit { .. }));
        let outsider = [("x-forwarded-user", "mallory"), ("x-forwarded-groups", "x")];
        assert!(matches!(gate(&t, &staff(), PROXY, &outsider), Gate::Forbid { who: Some(_) }));
        let bad_xff = [("x-forwarded-user", "alice"), ("x-forwarded-for", "not an address")];
        assert_eq!(
            gate(&t, &Allow::default(), PROXY, &bad_xff),
            Gate::Admit {
                client: PROXY.parse().unwrap(),
                who: Some(Identity { user: "alice".into(), email: None, groups: vec![] })
            },
            "a malformed X-Forwarded-For is ignored, the request served"
        );
    }

    #[test]
    fn a_browser_without_identity_is_sent_to_sign_in_and_anything_else_refused() {
        let t = trust(&["127.0.0.1"], Some("/oauth2/start"));
        let page = [("accept", "text/html,application/xhtml+xml")];
        assert_eq!(gate(&t, &staff(), PROXY, &page), Gate::SignIn("/oauth2/start?rd=/app/%3Fx%3D1".into()));
        assert_eq!(gate(&t, &staff(), PROXY, &[("accept", "application/json")]), Gate::Forbid { who: None });
        let signed_in = [("accept", "text/html"), ("x-forwarded-user", "mallory")];
        assert!(matches!(gate(&t, &staff(), PROXY, &signed_in), Gate::Forbid { who: Some(_) }), "403, not a loop");
        let long = "g".repeat(crate::http::identity::MAX_IDENTITY_BYTES + 1);
        let too_long = [("x-forwarded-user", "alice"), ("x-forwarded-groups", long.as_str())];
        assert!(matches!(gate(&t, &staff(), PROXY, &too_long), Gate::Bad(BadIdentity::TooLong(_))));
    }

    #[test]
    fn the_sign_in_url_carries_the_url_asked_for() {
        let full = Some("http://valve:8080/a b/?q=1&r");
        assert_eq!(
            sign_in_location("/oauth2/start?rd={rd}", "/a b/?q=1&r", full),
            "/oauth2/start?rd=/a%20b/%3Fq%3D1%26r"
        );
        assert_eq!(sign_in_location("https://sso/login?app=x", "/p", None), "https://sso/login?app=x&rd=/p");
        assert_eq!(
            sign_in_location("http://127.0.0.1:4180/oauth2/start?rd={url}", "/a b/?q=1&r", full),
            "http://127.0.0.1:4180/oauth2/start?rd=http%3A//valve%3A8080/a%20b/%3Fq%3D1%26r"
        );
        assert_eq!(sign_in_location("/s?rd={url}", "/p", None), "/s?rd=/p", "no host: the path");
    }

    #[test]
    fn with_forward_auth_only_its_answer_names_the_caller() {
        let t = trust(&["127.0.0.1"], Some("http://sso:4180/oauth2/start?rd={url}"));
        let h: HeaderMap = [
            (header::HOST, "valve:8080".parse().unwrap()),
            (header::ACCEPT, "text/html".parse().unwrap()),
            (HeaderName::from_static("x-forwarded-user"), "mallory".parse().unwrap()),
        ]
        .into_iter()
        .collect();
        let ask = |named| Asking {
            peer: PROXY.parse().unwrap(),
            method: &Method::GET,
            headers: &h,
            target: "/app/",
            websocket: false,
            named,
        };
        let alice = Identity { user: "alice".into(), email: None, groups: vec![] };
        assert!(
            matches!(decide(&t, &staff(), &ask(Named::ByAuth(Some(alice)))), Gate::Admit { who: Some(w), .. } if w.user == "alice")
        );
        assert_eq!(
            decide(&t, &staff(), &ask(Named::ByAuth(None))),
            Gate::SignIn("http://sso:4180/oauth2/start?rd=http%3A//valve%3A8080/app/".into()),
            "a trusted proxy's X-Forwarded-User does not count with forward auth"
        );
        assert_eq!(
            decide(&t, &Allow::default(), &ask(Named::ByAuth(None))),
            Gate::Admit { client: PROXY.parse().unwrap(), who: None }
        );
    }
}
