//! Where a request comes from, behind trusted proxies: the client's address
//! from `X-Forwarded-For` (or, without it, RFC 7239 `Forwarded: for=`),
//! taken as the rightmost entry that is not itself a trusted proxy (each
//! proxy appends the peer it saw, so entries left of the first untrusted
//! one could be anything a client wrote); and the scheme and host the client
//! asked for (`origin`). Pure: headers in, an address or a URL out.

use std::net::{IpAddr, SocketAddr};

use http::header::{self, HeaderMap, HeaderName};

use crate::config::Trust;

use super::head::{X_FORWARDED_FOR, X_FORWARDED_HOST, X_FORWARDED_PROTO};

static FORWARDED: HeaderName = HeaderName::from_static("forwarded");

/// A forwarding header valve could not read: the peer's address is used.
#[derive(Debug, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

/// The client's address for a request from `peer`, a trusted proxy. No
/// forwarding header: the peer itself. A port given in the header is kept,
/// else the port is 0.
pub fn client_addr(peer: SocketAddr, headers: &HeaderMap, trust: &Trust) -> Result<SocketAddr, Malformed> {
    let entries = if headers.contains_key(&X_FORWARDED_FOR) {
        let text = joined(headers, &X_FORWARDED_FOR).ok_or(Malformed("x-forwarded-for"))?;
        text.split(',').map(|e| node(e.trim())).collect::<Option<Vec<_>>>().ok_or(Malformed("x-forwarded-for"))?
    } else if headers.contains_key(&FORWARDED) {
        let text = joined(headers, &FORWARDED).ok_or(Malformed("forwarded"))?;
        forwarded_for(&text).ok_or(Malformed("forwarded"))?
    } else {
        return Ok(peer);
    };
    if entries.is_empty() {
        return Err(Malformed("x-forwarded-for"));
    }
    let pick = entries.iter().rev().find(|a| !trust.trusts(a.ip())).unwrap_or(&entries[0]);
    Ok(*pick)
}

/// The scheme and host the client asked for, `http://valve.example.org:8080`:
/// a trusted proxy's `X-Forwarded-Proto` and `X-Forwarded-Host` (first
/// entries), else `http` and the `Host` header. `None` without a host.
pub fn origin(headers: &HeaderMap, trusted: bool) -> Option<(String, String)> {
    let first = |name: &HeaderName| {
        let v = headers.get(name)?.to_str().ok()?.split(',').next()?.trim();
        Some(v.to_string()).filter(|v| !v.is_empty())
    };
    let forwarded = |name| if trusted { first(name) } else { None };
    let proto = forwarded(&X_FORWARDED_PROTO)
        .filter(|p| p.eq_ignore_ascii_case("https") || p.eq_ignore_ascii_case("http"))
        .map(|p| p.to_ascii_lowercase())
        .unwrap_or_else(|| "http".to_string());
    let host = forwarded(&X_FORWARDED_HOST).or_else(|| first(&header::HOST))?;
    Some((proto, host))
}

/// Every value of a header as one comma-separated list (ASCII only).
fn joined(headers: &HeaderMap, name: &HeaderName) -> Option<String> {
    let parts: Option<Vec<&str>> = headers.get_all(name).iter().map(|v| v.to_str().ok()).collect();
    Some(parts?.join(","))
}

/// An address as proxies write it: `203.0.113.7`, `203.0.113.7:4711`,
/// `2001:db8::1`, `[2001:db8::1]:4711`.
fn node(text: &str) -> Option<SocketAddr> {
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(SocketAddr::new(ip, 0));
    }
    if let Ok(sa) = text.parse::<SocketAddr>() {
        return Some(sa);
    }
    let inner = text.strip_prefix('[')?.strip_suffix(']')?;
    Some(SocketAddr::new(inner.parse::<IpAddr>().ok().filter(IpAddr::is_ipv6)?, 0))
}

/// The `for=` of each element of a `Forwarded` header, in order. An element
/// without `for=`, or one naming no address (`unknown`, an obfuscated
/// `_name`), makes the header unreadable for this purpose.
fn forwarded_for(text: &str) -> Option<Vec<SocketAddr>> {
    text.split(',')
        .map(|element| {
            element.split(';').find_map(|pair| {
                let (k, v) = pair.split_once('=')?;
                k.trim().eq_ignore_ascii_case("for").then(|| v.trim().trim_matches('"'))
            })
        })
        .map(|v| node(v?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Cidr;
    use http::HeaderValue;

    fn trust(cidrs: &[&str]) -> Trust {
        Trust { proxies: cidrs.iter().map(|c| Cidr::parse(c).unwrap()).collect(), ..Trust::default() }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    const PEER: &str = "10.0.0.2:5000";

    fn addr(pairs: &[(&str, &str)], cidrs: &[&str]) -> Result<String, Malformed> {
        client_addr(PEER.parse().unwrap(), &headers(pairs), &trust(cidrs)).map(|a| a.to_string())
    }

    #[test]
    fn the_rightmost_untrusted_entry_of_x_forwarded_for_is_the_client() {
        let proxies = ["10.0.0.0/8"];
        assert_eq!(addr(&[], &proxies).unwrap(), PEER, "no header: the peer");
        assert_eq!(addr(&[("x-forwarded-for", "203.0.113.7")], &proxies).unwrap(), "203.0.113.7:0");
        // A client wrote the first entry; the proxy appended what it saw.
        let spoofed = [("x-forwarded-for", "1.2.3.4, 198.51.100.9, 10.0.0.5")];
        assert_eq!(addr(&spoofed, &proxies).unwrap(), "198.51.100.9:0");
        let split = [("x-forwarded-for", "1.2.3.4"), ("x-forwarded-for", "198.51.100.9:4711")];
        assert_eq!(addr(&split, &proxies).unwrap(), "198.51.100.9:4711", "several headers are one list");
        let all_trusted = [("x-forwarded-for", "10.1.1.1, 10.2.2.2")];
        assert_eq!(addr(&all_trusted, &proxies).unwrap(), "10.1.1.1:0", "all trusted: the leftmost");
        let v6 = [("x-forwarded-for", "2001:db8::1, [2001:db8::2]:80")];
        assert_eq!(addr(&v6, &proxies).unwrap(), "[2001:db8::2]:80");
        assert_eq!(addr(&[("x-forwarded-for", "2001:db8::1")], &proxies).unwrap(), "[2001:db8::1]:0");
    }

    #[test]
    fn the_origin_is_the_host_asked_for_and_a_trusted_proxys_scheme() {
        let h =
            headers(&[("host", "valve:8080"), ("x-forwarded-proto", "https"), ("x-forwarded-host", "apps.example")]);
        assert_eq!(origin(&h, false), Some(("http".into(), "valve:8080".into())), "an untrusted peer's claims ignored");
        assert_eq!(origin(&h, true), Some(("https".into(), "apps.example".into())));
        assert_eq!(origin(&headers(&[("x-forwarded-proto", "gopher")]), true), None, "no host");
    }

    #[test]
    fn a_malformed_x_forwarded_for_is_refused_whole() {
        for bad in ["not-an-ip", "203.0.113.7, ", "203.0.113.7,,10.0.0.1", "", "1.2.3.4 5.6.7.8", "[1.2.3.4]"] {
            assert!(addr(&[("x-forwarded-for", bad)], &["10.0.0.0/8"]).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn forwarded_for_is_read_when_x_forwarded_for_is_absent() {
        let proxies = ["10.0.0.0/8"];
        let f = [("forwarded", r#"for=192.0.2.60;proto=http;by=203.0.113.43, for="[2001:db8:cafe::17]:4711""#)];
        assert_eq!(addr(&f, &proxies).unwrap(), "[2001:db8:cafe::17]:4711");
        let f = [("forwarded", "For=198.51.100.17, for=10.0.0.9")];
        assert_eq!(addr(&f, &proxies).unwrap(), "198.51.100.17:0");
        assert!(addr(&[("forwarded", "for=unknown")], &proxies).is_err());
        assert!(addr(&[("forwarded", "proto=https")], &proxies).is_err());
        let both = [("x-forwarded-for", "198.51.100.1"), ("forwarded", "for=198.51.100.2")];
        assert_eq!(addr(&both, &proxies).unwrap(), "198.51.100.1:0", "X-Forwarded-For first");
    }
}
