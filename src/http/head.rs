//! A request's head on each side of valve: the checks made before a worker
//! is taken (its size, a WebSocket's handshake, a declared body length), the
//! head a worker receives (origin-form target inside the app, no hop-by-hop
//! headers, no identity a client sent, `X-Forwarded-*` added), and an app's
//! answer kept under its prefix (redirects, cookie paths).

use std::net::SocketAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Uri};

use super::body::Payload;
use super::identity::{to_r, Identity};
use crate::worker::{ClientAddrs, WireBody, CLIENT_ADDR, CLIENT_PORT, CLIENT_SCHEME, LINK};

/// The sticky cookie that ties a browser to its Shiny worker.
pub(super) const STICKY_COOKIE: &str = "valve_worker";

pub(super) static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

pub(super) static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

pub(super) static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

pub(super) static X_FORWARDED_PREFIX: HeaderName = HeaderName::from_static("x-forwarded-prefix");

/// Headers that belong to one connection and are never passed on (RFC 9110 7.6.1).
pub(super) static HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// End-to-end headers a request needs: a `Connection` header naming them does
/// not remove them (a client could otherwise strip `Host` on its way to R).
pub(super) static KEPT: [HeaderName; 6] =
    [header::HOST, header::CONTENT_LENGTH, header::CONTENT_TYPE, header::COOKIE, header::AUTHORIZATION, header::ACCEPT];

/// The request line and headers as a worker receives them; rebuilt for a retry.
#[derive(Clone)]
pub(super) struct Head {
    pub(super) method: Method,
    pub(super) uri: Uri,
    pub(super) headers: HeaderMap,
    /// The client's connection, for a frames worker's Rook environment.
    pub(super) addrs: Option<ClientAddrs>,
}

impl Head {
    pub(super) fn request(&self, payload: &Payload) -> Request<WireBody> {
        let mut req = Request::new(payload.wire());
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = self.uri.clone();
        *req.headers_mut() = self.headers.clone();
        if let Some(addrs) = self.addrs {
            req.extensions_mut().insert(addrs);
        }
        // A frames worker reads a spooled body from its file (an httpuv
        // worker gets the bytes, as ever).
        if let Some(spooled) = payload.spooled_file() {
            req.extensions_mut().insert(spooled);
        }
        req
    }
}

/// The size of the request line and headers, as a worker's parser counts them.
pub(super) fn head_bytes<B>(req: &Request<B>) -> usize {
    let line = req.method().as_str().len() + req.uri().to_string().len() + 12;
    line + req.headers().iter().map(|(k, v)| k.as_str().len() + v.len() + 4).sum::<usize>()
}

pub(super) fn is_websocket<B>(req: &Request<B>) -> bool {
    let has = |name: header::HeaderName, token: &str| {
        req.headers()
            .get_all(name)
            .iter()
            .any(|v| v.to_str().unwrap_or("").split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    };
    has(header::UPGRADE, "websocket") && has(header::CONNECTION, "upgrade")
}

/// RFC 6455 4.2.1: version 13 and a key that is 16 bytes in base64.
pub(super) fn valid_websocket_handshake<B>(req: &Request<B>) -> bool {
    let version = req.headers().get(header::SEC_WEBSOCKET_VERSION).is_some_and(|v| v == "13");
    let key = req.headers().get(header::SEC_WEBSOCKET_KEY).and_then(|v| v.to_str().ok()).is_some_and(|k| {
        k.len() == 24
            && k.ends_with("==")
            && k[..22].bytes().all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
    });
    req.method() == Method::GET && version && key
}

/// The `Content-Length` a client declared, if any.
pub(super) fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.trim().parse().ok()
}

/// Removes the hop-by-hop headers, and those the `Connection` header names
/// (except the end-to-end ones a request needs).
pub(super) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("").split(',').map(str::trim).map(str::to_string).collect::<Vec<_>>())
        .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
        .filter(|n| !KEPT.contains(n) && !n.as_str().starts_with("x-forwarded-"))
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
}

/// `path` under `prefix` (`/` for a root app).
pub(super) fn join(prefix: &str, path: &str) -> String {
    if prefix == "/" {
        path.to_string()
    } else {
        format!("{prefix}{path}")
    }
}

/// Keeps an app's own absolute redirects and cookie paths under its prefix,
/// so that an app mounted at `/sales` behaves as it does alone.
pub(super) fn under_prefix(headers: &mut HeaderMap, prefix: &str) {
    if let Some(loc) = headers.get(header::LOCATION).and_then(|v| v.to_str().ok()) {
        if loc.starts_with('/') && !loc.starts_with("//") && !loc.starts_with(&format!("{prefix}/")) {
            if let Ok(v) = HeaderValue::from_str(&format!("{prefix}{loc}")) {
                headers.insert(header::LOCATION, v);
            }
        }
    }
    let cookies: Vec<HeaderValue> = headers.get_all(header::SET_COOKIE).iter().cloned().collect();
    if cookies.is_empty() {
        return;
    }
    headers.remove(header::SET_COOKIE);
    for c in cookies {
        // valve's own sticky cookie already names the prefix.
        if c.as_bytes().starts_with(STICKY_COOKIE.as_bytes()) {
            headers.append(header::SET_COOKIE, c);
            continue;
        }
        let rewritten = c.to_str().ok().map(|text| {
            text.split(';')
                .map(|attr| {
                    let t = attr.trim_start();
                    match t.get(..5) {
                        Some(name) if name.eq_ignore_ascii_case("path=") => {
                            let lead = &attr[..attr.len() - t.len()];
                            format!("{lead}Path={}", join(prefix, &t[5..]))
                        }
                        _ => attr.to_string(),
                    }
                })
                .collect::<Vec<_>>()
                .join(";")
        });
        headers.append(header::SET_COOKIE, rewritten.and_then(|r| HeaderValue::from_str(&r).ok()).unwrap_or(c));
    }
}

/// The request as the worker receives it: origin-form target inside the app,
/// no hop-by-hop headers, the identity a trusted proxy gave written by valve
/// (the front removed every identity header a client sent: no client names
/// itself a user), the body's real length, `X-Forwarded-*` added (the
/// client's own `X-Forwarded-For` is kept and appended to, never taken as the
/// peer address; `-Proto` and `-Host` are set only when absent: an outer proxy
/// knows better).
pub(super) fn worker_head(
    parts: http::request::Parts,
    path: &str,
    peer: SocketAddr,
    prefix: &str,
    payload: &Payload,
    websocket: bool,
    shiny: bool,
) -> Head {
    let target = match parts.uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    };
    let uri = target.parse().unwrap_or_else(|_| Uri::from_static("/"));
    let mut headers = parts.headers;
    strip_hop_by_hop(&mut headers);
    // Only valve names the client to an httpuv worker (`worker::CLIENT_ADDR`).
    headers.remove(&CLIENT_ADDR);
    headers.remove(&CLIENT_PORT);
    headers.remove(&CLIENT_SCHEME);
    headers.remove(&LINK);
    if let Some(who) = parts.extensions.get::<Identity>() {
        to_r(&mut headers, who, shiny);
    }
    let ip = peer.ip().to_string();
    let xff = match headers.get(&X_FORWARDED_FOR).and_then(|v| v.to_str().ok()) {
        Some(prior) if !prior.trim().is_empty() => format!("{prior}, {ip}"),
        _ => ip,
    };
    if let Ok(v) = HeaderValue::from_str(&xff) {
        headers.insert(X_FORWARDED_FOR.clone(), v);
    }
    let addrs = parts.extensions.get::<ClientAddrs>().copied();
    // Over valve's own TLS valve knows the scheme; behind a proxy, the proxy does.
    if addrs.is_some_and(|a| a.secure) {
        headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static("https"));
    } else if !headers.contains_key(&X_FORWARDED_PROTO) {
        headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static("http"));
    }
    if !headers.contains_key(&X_FORWARDED_HOST) {
        if let Some(host) = headers.get(header::HOST).cloned() {
            headers.insert(X_FORWARDED_HOST.clone(), host);
        }
    }
    if prefix != "/" {
        if let Ok(v) = HeaderValue::from_str(prefix) {
            headers.insert(X_FORWARDED_PREFIX.clone(), v);
        }
    }
    if !payload.is_empty() || headers.contains_key(header::CONTENT_LENGTH) {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(payload.len()));
    }
    if websocket {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    }
    Head { method: parts.method, uri, headers, addrs }
}

/// Whether the worker's answer closes its connection.
pub(super) fn closes(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .any(|v| v.to_str().unwrap_or("").split(',').any(|t| t.trim().eq_ignore_ascii_case("close")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_cannot_strip_the_headers_a_request_needs() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("example.org"));
        h.insert(header::CONNECTION, HeaderValue::from_static("Host, x-secret, keep-alive"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.get(header::HOST).unwrap(), "example.org");
        assert!(h.get("x-secret").is_none());
        assert!(h.get(header::CONNECTION).is_none());
    }

    #[test]
    fn an_apps_redirects_and_cookie_paths_stay_under_its_prefix() {
        let mut h = HeaderMap::new();
        h.insert(header::LOCATION, HeaderValue::from_static("/__docs__/"));
        h.append(header::SET_COOKIE, HeaderValue::from_static("a=1; Path=/; HttpOnly"));
        h.append(header::SET_COOKIE, HeaderValue::from_static("valve_worker=1.2.3; Path=/sales/; HttpOnly"));
        h.append(header::SET_COOKIE, HeaderValue::from_static("b=2; path=/x"));
        under_prefix(&mut h, "/sales");
        assert_eq!(h.get(header::LOCATION).unwrap(), "/sales/__docs__/");
        let cookies: Vec<_> = h.get_all(header::SET_COOKIE).iter().map(|v| v.to_str().unwrap().to_string()).collect();
        assert_eq!(
            cookies,
            ["a=1; Path=/sales/; HttpOnly", "valve_worker=1.2.3; Path=/sales/; HttpOnly", "b=2; Path=/sales/x"]
        );
    }

    #[test]
    fn websocket_handshakes_are_checked_before_r_sees_them() {
        let ok = Request::get("/websocket/")
            .header(header::SEC_WEBSOCKET_VERSION, "13")
            .header(header::SEC_WEBSOCKET_KEY, "dGhlIHNhbXBsZSBub25jZQ==")
            .body(())
            .unwrap();
        assert!(valid_websocket_handshake(&ok));
        let bad = Request::get("/websocket/")
            .header(header::SEC_WEBSOCKET_VERSION, "13")
            .header(header::SEC_WEBSOCKET_KEY, "not a key")
            .body(())
            .unwrap();
        assert!(!valid_websocket_handshake(&bad));
    }
}
