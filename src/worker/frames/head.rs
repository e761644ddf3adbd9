//! A request frame's head: the Rook environment httpuv 1.6.9 would build,
//! written in R's own serialization format (XDR, version 2) so that the worker
//! builds it with one `unserialize()` (bench/r-loop/PROTOCOL.md §4).
//!
//! Four kinds of item only (strings, character vectors, symbols, NULL), every
//! symbol written in full: no reference table, no hashing.

use std::collections::BTreeMap;

use http::HeaderMap;

const CHARSXP: i32 = 9;
const STRSXP: i32 = 16;
const SYMSXP: i32 = 1;
const ENVSXP: i32 = 4;
const LISTSXP_TAGGED: i32 = 2 | 1 << 10;
const HAS_ATTR: i32 = 1 << 9;
const NILVALUE: i32 = 254;
const EMPTYENV: i32 = 242;
/// "X\n", format 2, written by R 4.2.2, readable by R >= 2.3.0.
const PREAMBLE: [u8; 14] = [b'X', b'\n', 0, 0, 0, 2, 0, 4, 2, 2, 0, 2, 3, 0];

/// What a request head holds besides its headers.
pub struct Rook<'a> {
    pub method: &'a str,
    /// The request-target up to the first `?`.
    pub path: &'a str,
    /// What follows the `?`, if there was one.
    pub query: Option<&'a str>,
    pub server_name: &'a str,
    pub server_port: &'a str,
    pub remote_addr: &'a str,
    pub remote_port: &'a str,
    /// `http`, or `https` when the client came over TLS.
    pub url_scheme: &'a str,
}

/// The headers merged as httpuv's header map merges them: lower-case names in
/// byte order; a repeat joins a non-empty earlier value with `,`, an empty
/// repeat is dropped, and a value after an empty one replaces it.
pub fn merge(headers: &HeaderMap) -> BTreeMap<&str, Vec<u8>> {
    let mut merged: BTreeMap<&str, Vec<u8>> = BTreeMap::new();
    for (name, value) in headers {
        // hyper's names are lower case already.
        let value = value.as_bytes();
        match merged.get_mut(name.as_str()) {
            Some(old) if !old.is_empty() => {
                if !value.is_empty() {
                    old.push(b',');
                    old.extend_from_slice(value);
                }
            }
            _ => {
                merged.insert(name.as_str(), value.to_vec());
            }
        }
    }
    merged
}

/// `HTTP_` + the name in ASCII upper case with `-` turned into `_`.
fn http_key(name: &str) -> Vec<u8> {
    let mut key = b"HTTP_".to_vec();
    key.extend(name.bytes().map(|b| if b == b'-' { b'_' } else { b.to_ascii_uppercase() }));
    key
}

struct Writer(Vec<u8>);

impl Writer {
    fn int(&mut self, i: i32) {
        self.0.extend_from_slice(&i.to_be_bytes());
    }

    fn charsxp(&mut self, s: &[u8]) {
        self.int(CHARSXP);
        self.int(s.len() as i32);
        self.0.extend_from_slice(s);
    }

    fn symbol(&mut self, name: &[u8]) {
        self.int(SYMSXP);
        self.charsxp(name);
    }

    /// One binding of the environment's frame: `name` = a string of length 1.
    fn binding(&mut self, name: &[u8], value: &[u8]) {
        self.int(LISTSXP_TAGGED);
        self.symbol(name);
        self.int(STRSXP);
        self.int(1);
        self.charsxp(value);
    }
}

/// Writes the head. Strings must hold no NUL (hyper guarantees it for the
/// method, target and header values; the forwarder checks the rest).
pub fn encode(rook: &Rook, headers: &HeaderMap) -> Vec<u8> {
    let merged = merge(headers);
    let mut w = Writer(Vec::with_capacity(700 + 64 * merged.len()));
    w.0.extend_from_slice(&PREAMBLE);
    w.int(ENVSXP);
    w.int(0); // not locked
    w.int(EMPTYENV);
    let query = rook.query.map(|q| format!("?{q}")).unwrap_or_default();
    for (name, value) in [
        ("REQUEST_METHOD", rook.method),
        ("PATH_INFO", rook.path),
        ("QUERY_STRING", query.as_str()),
        ("SERVER_NAME", rook.server_name),
        ("SERVER_PORT", rook.server_port),
        ("REMOTE_ADDR", rook.remote_addr),
        ("REMOTE_PORT", rook.remote_port),
        ("rook.url_scheme", rook.url_scheme),
        ("SCRIPT_NAME", ""),
        ("rook.version", "1.1-0"),
    ] {
        w.binding(name.as_bytes(), value.as_bytes());
    }
    // `x-dup` and `x_dup` are one HTTP_X_DUP: written once, with the later
    // name's value (httpuv assigns them in its map's order, the last wins).
    let keys: Vec<Vec<u8>> = merged.keys().map(|n| http_key(n)).collect();
    for (i, (key, value)) in keys.iter().zip(merged.values()).enumerate() {
        if !keys[i + 1..].contains(key) {
            w.binding(key, value);
        }
    }
    // HEADERS: the merged values, named by the lower-case names.
    w.int(LISTSXP_TAGGED);
    w.symbol(b"HEADERS");
    w.int(STRSXP | HAS_ATTR);
    w.int(merged.len() as i32);
    for value in merged.values() {
        w.charsxp(value);
    }
    w.int(LISTSXP_TAGGED);
    w.symbol(b"names");
    w.int(STRSXP);
    w.int(merged.len() as i32);
    for name in merged.keys() {
        w.charsxp(name.as_bytes());
    }
    w.int(NILVALUE); // end of HEADERS' attributes
    w.int(NILVALUE); // end of the frame
    w.int(NILVALUE); // no hash table
    w.int(NILVALUE); // no attributes
    w.0
}

#[cfg(test)]
mod tests {
    use http::header::HeaderValue;

    use super::*;

    fn rook<'a>(query: Option<&'a str>) -> Rook<'a> {
        Rook {
            method: "GET",
            path: "/echo",
            query,
            server_name: "127.0.0.1",
            server_port: "3000",
            url_scheme: "http",
            remote_addr: "127.0.0.1",
            remote_port: "51234",
        }
    }

    fn unhex(text: &str) -> Vec<u8> {
        let hex: String = text.lines().filter(|l| !l.starts_with('#')).collect::<String>();
        (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
    }

    #[test]
    fn writes_the_protocols_test_vector_byte_for_byte() {
        let expected = unhex(include_str!("../../../bench/r-loop/example-head.hex"));
        let mut headers = HeaderMap::new();
        headers.insert("host", HeaderValue::from_static("127.0.0.1"));
        let head = encode(&rook(Some("msg=hi")), &headers);
        assert_eq!(head.len(), 669);
        assert_eq!(head, expected);
    }

    #[test]
    fn merges_repeats_like_httpuv_and_sorts_by_name() {
        let mut h = HeaderMap::new();
        h.append("x-b", HeaderValue::from_static("1"));
        h.append("x-a", HeaderValue::from_static(""));
        h.append("x-a", HeaderValue::from_static("after-empty"));
        h.append("x-b", HeaderValue::from_static(""));
        h.append("x-b", HeaderValue::from_static("2"));
        let merged: Vec<(&str, Vec<u8>)> = merge(&h).into_iter().collect();
        assert_eq!(merged, vec![("x-a", b"after-empty".to_vec()), ("x-b", b"1,2".to_vec())]);
    }

    #[test]
    fn names_differing_by_dash_and_underscore_give_one_variable_with_the_later_value() {
        let mut h = HeaderMap::new();
        h.append("x_dup", HeaderValue::from_static("underscore"));
        h.append("x-dup", HeaderValue::from_static("dash"));
        let head = encode(&rook(None), &h);
        let count = head.windows(10).filter(|w| w == b"HTTP_X_DUP").count();
        assert_eq!(count, 1, "one HTTP_X_DUP binding");
        let at = head.windows(10).position(|w| w == b"HTTP_X_DUP").unwrap();
        // Its value follows: STRSXP, 1, CHARSXP, length, bytes.
        let value = &head[at + 10 + 16..at + 10 + 16 + 10];
        assert_eq!(value, b"underscore", "'_' sorts after '-': the later name wins");
    }

    #[test]
    fn no_headers_is_an_empty_named_vector() {
        let head = encode(&rook(None), &HeaderMap::new());
        let tail: Vec<u8> = [STRSXP | HAS_ATTR, 0, LISTSXP_TAGGED, SYMSXP, CHARSXP, 5]
            .iter()
            .flat_map(|i| i.to_be_bytes())
            .chain(*b"names")
            .chain([STRSXP, 0, NILVALUE, NILVALUE, NILVALUE, NILVALUE].iter().flat_map(|i| i.to_be_bytes()))
            .collect();
        assert!(head.ends_with(&tail));
    }
}
