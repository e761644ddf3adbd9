//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>): the
//! `traceparent` a request may carry, read by the specification's rules
//! (pure), the one valve passes on, and trace and span ids drawn from the
//! kernel's random source.

use std::cell::RefCell;

use http::header::{HeaderMap, HeaderName, HeaderValue};

pub static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
pub static TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// The length of a version-00 `traceparent`, and the least of any version's.
const LEN: usize = 55;

/// A trace's id: 16 bytes, never all zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TraceId(pub [u8; 16]);

/// A span's id: 8 bytes, never all zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SpanId(pub [u8; 8]);

impl TraceId {
    pub fn random() -> TraceId {
        TraceId(nonzero_random())
    }

    pub fn hex(&self) -> String {
        hex(&self.0)
    }
}

impl SpanId {
    pub fn random() -> SpanId {
        SpanId(nonzero_random())
    }

    pub fn hex(&self) -> String {
        hex(&self.0)
    }
}

/// The caller's span, from a valid `traceparent`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parent {
    pub trace: TraceId,
    pub span: SpanId,
    /// The caller recorded its span (the `sampled` flag).
    pub sampled: bool,
}

/// The caller's span named by a request's headers: exactly one
/// `traceparent` field, valid. Anything else (none, several, malformed) is
/// no parent: valve starts a new trace and drops the caller's `tracestate`,
/// as the specification says.
pub fn parent(headers: &HeaderMap) -> Option<Parent> {
    let mut all = headers.get_all(&TRACEPARENT).iter();
    let one = all.next()?;
    if all.next().is_some() {
        return None;
    }
    parse(one.as_bytes())
}

/// One `traceparent` value, by the rules of Trace Context's section 3.2 and
/// its versioning rules (4.3): lowercase hex only; version `ff` is invalid;
/// version 00 is exactly 55 characters; a later version is at least 55, and
/// if longer, its 56th character is `-` (what follows is that version's and
/// ignored); an all-zero trace id or parent id is invalid.
pub fn parse(value: &[u8]) -> Option<Parent> {
    if value.len() < LEN {
        return None;
    }
    let version = lower_hex::<1>(&value[0..2])?[0];
    match version {
        0xff => return None,
        0x00 if value.len() != LEN => return None,
        _ if value.len() > LEN && value[LEN] != b'-' => return None,
        _ => {}
    }
    if value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
        return None;
    }
    let trace = lower_hex::<16>(&value[3..35])?;
    let span = lower_hex::<8>(&value[36..52])?;
    let flags = lower_hex::<1>(&value[53..55])?[0];
    if trace == [0; 16] || span == [0; 8] {
        return None;
    }
    Some(Parent { trace: TraceId(trace), span: SpanId(span), sampled: flags & 1 == 1 })
}

/// A version-00 `traceparent` naming `span` of `trace`.
pub fn format(trace: TraceId, span: SpanId, sampled: bool) -> String {
    format!("00-{}-{}-{}", trace.hex(), span.hex(), if sampled { "01" } else { "00" })
}

/// Every value of the caller's `tracestate`, joined as one list (RFC 9110
/// allows splitting a list across fields), if any and printable.
pub fn tracestate(headers: &HeaderMap) -> Option<String> {
    let mut joined = String::new();
    for v in headers.get_all(&TRACESTATE) {
        let v = v.to_str().ok()?.trim();
        if !v.is_empty() {
            if !joined.is_empty() {
                joined.push(',');
            }
            joined.push_str(v);
        }
    }
    (!joined.is_empty()).then_some(joined)
}

/// Puts `traceparent` in `headers` in place of any the caller sent.
pub fn put(headers: &mut HeaderMap, traceparent: &str) {
    if let Ok(v) = HeaderValue::from_str(traceparent) {
        headers.insert(TRACEPARENT.clone(), v);
    }
}

/// `N` bytes from `hex`, which must be exactly `2N` lowercase hex digits.
fn lower_hex<const N: usize>(hex: &[u8]) -> Option<[u8; N]> {
    if hex.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, pair) in hex.chunks_exact(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

/// Random bytes are taken from the kernel this many at a time, per thread,
/// so that a request's two ids cost no system call of their own.
const POOL: usize = 512;

thread_local! {
    static RANDOM: RefCell<([u8; POOL], usize)> = const { RefCell::new(([0; POOL], POOL)) };
}

/// `N` random bytes, not all zero.
fn nonzero_random<const N: usize>() -> [u8; N] {
    loop {
        let mut out = [0u8; N];
        RANDOM.with(|pool| {
            let (bytes, used) = &mut *pool.borrow_mut();
            if *used + N > POOL {
                refill(bytes);
                *used = 0;
            }
            out.copy_from_slice(&bytes[*used..*used + N]);
            // Each byte is handed out once.
            bytes[*used..*used + N].fill(0);
            *used += N;
        });
        if out != [0; N] {
            return out;
        }
    }
}

/// Fills `buf` from the kernel's random source. Should it ever fail, std's
/// randomly keyed hasher (itself keyed from the kernel once) over a counter
/// stands in: trace ids need to be unique, not secret.
fn refill(buf: &mut [u8]) {
    use std::hash::BuildHasher;
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut filled = 0;
    while filled < buf.len() {
        match rustix::rand::getrandom(&mut buf[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => {
                let keyed = std::collections::hash_map::RandomState::new();
                for chunk in buf[filled..].chunks_mut(8) {
                    let h = keyed.hash_one(COUNTER.fetch_add(1, Ordering::Relaxed)).to_le_bytes();
                    chunk.copy_from_slice(&h[..chunk.len()]);
                }
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_names_the_callers_trace_span_and_sampling() {
        let p = parse(GOOD.as_bytes()).unwrap();
        assert_eq!(p.trace.hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(p.span.hex(), "00f067aa0ba902b7");
        assert!(p.sampled);
        let unsampled = parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap();
        assert!(!unsampled.sampled);
        // Only the sampled bit means anything to valve; other flags are allowed.
        assert!(parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03").unwrap().sampled);
        assert!(!parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-fe").unwrap().sampled);
    }

    #[test]
    fn malformed_traceparents_are_no_parent() {
        let bad = [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0X",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01.what-the-future-holds",
        ];
        for b in bad {
            assert_eq!(parse(b.as_bytes()), None, "{b:?}");
        }
    }

    #[test]
    fn a_later_version_is_read_for_its_first_four_fields() {
        let p = parse(b"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds").unwrap();
        assert_eq!((p.trace.hex().as_str(), p.sampled), ("4bf92f3577b34da6a3ce929d0e0e4736", true));
        assert!(parse(b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").is_some());
    }

    #[test]
    fn exactly_one_traceparent_field_counts() {
        let mut h = HeaderMap::new();
        assert_eq!(parent(&h), None);
        h.append(&TRACEPARENT, HeaderValue::from_static(GOOD));
        assert!(parent(&h).is_some());
        h.append(&TRACEPARENT, HeaderValue::from_static(GOOD));
        assert_eq!(parent(&h), None, "two traceparent fields are no parent");
    }

    #[test]
    fn valves_traceparent_is_version_00_and_reads_back() {
        let (t, s) = (TraceId::random(), SpanId::random());
        let text = format(t, s, true);
        assert_eq!(text.len(), LEN);
        assert_eq!(parse(text.as_bytes()), Some(Parent { trace: t, span: s, sampled: true }));
        assert!(format(t, s, false).ends_with("-00"));
        let mut h = HeaderMap::new();
        h.append(&TRACEPARENT, HeaderValue::from_static(GOOD));
        h.append(&TRACEPARENT, HeaderValue::from_static("junk"));
        put(&mut h, &text);
        assert_eq!(h.get_all(&TRACEPARENT).iter().collect::<Vec<_>>(), [text.as_str()], "the caller's are replaced");
    }

    #[test]
    fn tracestate_fields_are_joined_as_one_list() {
        let mut h = HeaderMap::new();
        assert_eq!(tracestate(&h), None);
        h.append(&TRACESTATE, HeaderValue::from_static("rojo=00f067aa0ba902b7"));
        h.append(&TRACESTATE, HeaderValue::from_static(" congo=t61rcWkgMzE "));
        assert_eq!(tracestate(&h).unwrap(), "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE");
    }

    #[test]
    fn ids_are_random_and_never_zero() {
        let ids: std::collections::HashSet<_> = (0..10_000).map(|_| SpanId::random()).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(!ids.contains(&SpanId([0; 8])));
        assert_ne!(TraceId::random(), TraceId::random());
        assert_eq!(hex(&[0x00, 0xab, 0x7f]), "00ab7f");
    }
}
