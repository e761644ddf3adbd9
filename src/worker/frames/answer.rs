//! Frame headers, the answer frame's head, and the HTTP answer valve makes of
//! it: what httpuv 1.6.9 would have written for the same list, minus its
//! quirks (bench/r-loop/PROTOCOL.md §2 and §5). Pure: no I/O, no clock.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;

/// Every frame starts with 16 bytes: type, flags, the request's id (u16; 0
/// in frames of no request), head length (u32), body length (u64).
pub const HEADER_LEN: usize = 16;

pub const HELLO: u8 = b'H';
pub const PING: u8 = b'P';
pub const PONG: u8 = b'O';
pub const REQUEST: u8 = b'Q';
pub const ANSWER: u8 = b'A';
/// The request (by id) waits on a promise: the worker may take another.
pub const WAITING: u8 = b'W';

/// Request flag: the body is the path of a file holding it.
pub const REQ_BODY_FILE: u8 = 0x01;
/// Answer flags.
pub const BODY_FILE: u8 = 0x01;
pub const FILE_OWNED: u8 = 0x02;
pub const NO_BODY: u8 = 0x04;
pub const LOOP_ERROR: u8 = 0x08;

/// A frame's fixed header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: u8,
    pub flags: u8,
    /// Which request a REQUEST, ANSWER or WAITING frame is about.
    pub id: u16,
    pub head_len: u32,
    pub body_len: u64,
}

impl FrameHeader {
    pub fn parse(b: &[u8; HEADER_LEN]) -> FrameHeader {
        FrameHeader {
            kind: b[0],
            flags: b[1],
            id: u16::from_be_bytes([b[2], b[3]]),
            head_len: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
            body_len: u64::from_be_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]),
        }
    }

    pub fn bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = self.kind;
        b[1] = self.flags;
        b[2..4].copy_from_slice(&self.id.to_be_bytes());
        b[4..8].copy_from_slice(&self.head_len.to_be_bytes());
        b[8..16].copy_from_slice(&self.body_len.to_be_bytes());
        b
    }
}

/// The worker broke the protocol: the stream cannot be trusted any more.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Garbage(pub String);

/// An answer frame's head: the status and the app's headers in its order,
/// repeats kept, names in the app's case.
#[derive(Debug, PartialEq, Eq)]
pub struct AnswerHead<'a> {
    pub status: i32,
    pub headers: Vec<(&'a [u8], &'a [u8])>,
}

/// `status i32, n u32, 2n x u32 lengths, then the names and values back to back`.
pub fn parse_head(head: &[u8]) -> Result<AnswerHead<'_>, Garbage> {
    let int = |at: usize| -> Result<u32, Garbage> {
        head.get(at..at + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or_else(|| Garbage(format!("answer head cut short at byte {at} of {}", head.len())))
    };
    let status = int(0)? as i32;
    let n = int(4)? as usize;
    // Each header takes 8 bytes of lengths at least: a count past that is garbage.
    if n > head.len() / 8 {
        return Err(Garbage(format!("answer head claims {n} headers in {} bytes", head.len())));
    }
    let mut pos = 8 + 8 * n;
    let mut headers = Vec::with_capacity(n);
    for i in 0..n {
        let name_len = int(8 + 8 * i)? as usize;
        let value_len = int(12 + 8 * i)? as usize;
        let name =
            head.get(pos..pos.saturating_add(name_len)).ok_or_else(|| Garbage("header name past the end".into()))?;
        pos += name_len;
        let value =
            head.get(pos..pos.saturating_add(value_len)).ok_or_else(|| Garbage("header value past the end".into()))?;
        pos += value_len;
        headers.push((name, value));
    }
    if pos != head.len() {
        return Err(Garbage(format!("answer head has {} stray bytes", head.len() - pos)));
    }
    Ok(AnswerHead { status, headers })
}

/// What the request asked that changes the answer.
#[derive(Clone, Copy, Debug, Default)]
pub struct Asked {
    pub head: bool,
    /// Its merged Accept-Encoding holds `gzip` (httpuv's test, case-sensitive).
    pub gzip: bool,
}

/// The HTTP answer to send: status, headers (without Date: hyper adds it),
/// whether the body is gzip-compressed, whether a body is sent at all.
#[derive(Debug)]
pub struct Rendered {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub gzip: bool,
    /// Send the body (false for NO_BODY and HEAD).
    pub body: bool,
    /// What was dropped or changed, for the log: the app's fault, not valve's.
    pub notes: Vec<String>,
}

/// Renders an answer as httpuv's HttpResponse::writeResponse would, with
/// valve's rules: headers hyper refuses and connection headers are dropped,
/// the app's Content-Length is replaced by the body's (`body_len`, the
/// file's size for BODY_FILE), gzip when the client accepts it.
pub fn render(answer: &AnswerHead, flags: u8, body_len: u64, asked: Asked) -> Rendered {
    let mut notes = Vec::new();
    let status = match u16::try_from(answer.status).ok().filter(|s| (100..=999).contains(s)) {
        Some(s) => StatusCode::from_u16(s).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        None => {
            notes.push(format!("status {} is not an HTTP status: sent 500", answer.status));
            StatusCode::INTERNAL_SERVER_ERROR
        }
    };
    let mut headers = HeaderMap::with_capacity(answer.headers.len() + 2);
    let mut app_length: Option<HeaderValue> = None;
    let mut encoded = false;
    for (name, value) in &answer.headers {
        let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) else {
            notes.push(format!("dropped an invalid header {:?}", String::from_utf8_lossy(name)));
            continue;
        };
        if name == header::CONTENT_LENGTH {
            app_length = Some(value);
            continue;
        }
        if name == header::CONNECTION || name == header::TRANSFER_ENCODING || name.as_str() == "keep-alive" {
            continue;
        }
        if name == header::CONTENT_ENCODING {
            encoded = true;
        }
        headers.append(name, value);
    }
    let no_body = flags & NO_BODY != 0;
    let gzip = asked.gzip && !no_body && !encoded && status != StatusCode::SWITCHING_PROTOCOLS;
    if gzip {
        headers.append(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    } else if no_body {
        if let Some(len) = app_length {
            headers.insert(header::CONTENT_LENGTH, len);
        }
    } else {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body_len));
    }
    Rendered { status, headers, gzip, body: !no_body && !asked.head, notes }
}

/// Whether a request's Accept-Encoding values, merged as httpuv merges them,
/// hold `gzip`: a value with `gzip` in it always survives the merge.
pub fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers.get_all(header::ACCEPT_ENCODING).iter().any(|v| v.as_bytes().windows(4).any(|w| w == b"gzip"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer head as loop.R writes it.
    fn head(status: i32, headers: &[(&str, &str)]) -> Vec<u8> {
        let mut out = status.to_be_bytes().to_vec();
        out.extend((headers.len() as u32).to_be_bytes());
        for (n, v) in headers {
            out.extend((n.len() as u32).to_be_bytes());
            out.extend((v.len() as u32).to_be_bytes());
        }
        for (n, v) in headers {
            out.extend(n.as_bytes());
            out.extend(v.as_bytes());
        }
        out
    }

    #[test]
    fn frame_headers_round_trip() {
        let h = FrameHeader { kind: REQUEST, flags: REQ_BODY_FILE, id: 7, head_len: 669, body_len: 1 << 33 };
        assert_eq!(FrameHeader::parse(&h.bytes()), h);
        assert_eq!(&h.bytes()[..4], &[b'Q', 1, 0, 7]);
    }

    #[test]
    fn parses_repeats_in_order() {
        let bytes = head(200, &[("Set-Cookie", "a=1"), ("Content-Type", "text/plain"), ("Set-Cookie", "b=2")]);
        let a = parse_head(&bytes).unwrap();
        assert_eq!(a.status, 200);
        let names: Vec<&[u8]> = a.headers.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, [&b"Set-Cookie"[..], b"Content-Type", b"Set-Cookie"]);
        let r = render(&a, 0, 5, Asked::default());
        let cookies: Vec<_> = r.headers.get_all(header::SET_COOKIE).iter().collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
        assert_eq!(r.headers[header::CONTENT_LENGTH], "5");
    }

    #[test]
    fn garbage_is_refused_never_panics() {
        for bad in [
            vec![],
            vec![0, 0, 0, 200],
            head(200, &[("a", "b")])[..15].to_vec(),
            [head(200, &[]), vec![1]].concat(),
            // A count of headers far past the bytes.
            [200i32.to_be_bytes(), u32::MAX.to_be_bytes()].concat(),
            // Lengths past the end.
            [&200i32.to_be_bytes()[..], &1u32.to_be_bytes(), &u32::MAX.to_be_bytes(), &u32::MAX.to_be_bytes()].concat(),
        ] {
            assert!(parse_head(&bad).is_err(), "{bad:?}");
        }
        // Every prefix of a good head, and every single-byte corruption, is handled.
        let good = head(200, &[("Content-Type", "text/plain"), ("X", "y")]);
        for cut in 0..good.len() {
            let _ = parse_head(&good[..cut]);
        }
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0xff;
            if let Ok(a) = parse_head(&bad) {
                let _ = render(&a, 0xff, u64::MAX, Asked { head: false, gzip: true });
            }
        }
    }

    #[test]
    fn drops_what_valve_owns_and_what_hyper_refuses() {
        let bytes = head(
            200,
            &[
                ("Content-Length", "999"),
                ("Connection", "close"),
                ("Transfer-Encoding", "chunked"),
                ("Keep-Alive", "timeout=5"),
                ("X-Split", "a\r\nInjected: yes"),
                ("", "empty name"),
                ("X-Ok", "fine"),
            ],
        );
        let r = render(&parse_head(&bytes).unwrap(), 0, 12, Asked::default());
        let names: Vec<&str> = r.headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["x-ok", "content-length"]);
        assert_eq!(r.headers[header::CONTENT_LENGTH], "12", "the body's length, not the app's");
        assert_eq!(r.notes.len(), 2);
    }

    #[test]
    fn gzip_when_accepted_unless_the_app_encoded_or_sent_no_body() {
        let plain = head(200, &[("Content-Type", "application/json")]);
        let a = parse_head(&plain).unwrap();
        let r = render(&a, 0, 10, Asked { head: false, gzip: true });
        assert!(r.gzip && r.body);
        assert_eq!(r.headers[header::CONTENT_ENCODING], "gzip");
        assert!(r.headers.get(header::CONTENT_LENGTH).is_none());
        // An empty body counts as a body.
        assert!(render(&a, 0, 0, Asked { head: false, gzip: true }).gzip);
        let own = head(200, &[("content-ENCODING", "br")]);
        assert!(!render(&parse_head(&own).unwrap(), 0, 10, Asked { head: false, gzip: true }).gzip);
        let r = render(&a, NO_BODY, 0, Asked { head: false, gzip: true });
        assert!(!r.gzip && !r.body);
        assert!(r.headers.get(header::CONTENT_LENGTH).is_none());
    }

    #[test]
    fn no_body_keeps_the_apps_length_and_head_sends_none() {
        let bytes = head(200, &[("Content-Length", "1234")]);
        let r = render(&parse_head(&bytes).unwrap(), NO_BODY, 0, Asked::default());
        assert_eq!(r.headers[header::CONTENT_LENGTH], "1234");
        assert!(!r.body);
        let bytes = head(200, &[]);
        let r = render(&parse_head(&bytes).unwrap(), 0, 256, Asked { head: true, gzip: false });
        assert_eq!(r.headers[header::CONTENT_LENGTH], "256", "HEAD says the length GET would send");
        assert!(!r.body);
    }

    #[test]
    fn statuses_outside_http_become_500() {
        for (status, want) in [(200, 200), (999, 999), (99, 500), (1000, 500), (-1, 500)] {
            let r = render(&parse_head(&head(status, &[])).unwrap(), 0, 0, Asked::default());
            assert_eq!(r.status.as_u16(), want);
        }
    }

    #[test]
    fn accept_encoding_is_searched_like_httpuv() {
        let mut h = HeaderMap::new();
        h.append(header::ACCEPT_ENCODING, HeaderValue::from_static("deflate"));
        assert!(!accepts_gzip(&h));
        h.append(header::ACCEPT_ENCODING, HeaderValue::from_static("x-gzip;q=0.5"));
        assert!(accepts_gzip(&h));
        let mut h = HeaderMap::new();
        h.append(header::ACCEPT_ENCODING, HeaderValue::from_static("GZIP"));
        assert!(!accepts_gzip(&h), "case-sensitive, as httpuv");
    }
}
