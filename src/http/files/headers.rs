//! What a static file's answer says, pure: its content type by extension,
//! its validators (`ETag` from size and modification time, `Last-Modified`),
//! whether a conditional request gets 304, and which bytes a `Range` asks for.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{self, HeaderMap};

/// The content type of a file, by its extension (any case); unknown ones are
/// `application/octet-stream` (a browser downloads them, never sniffs them).
pub fn content_type(path: &Path) -> &'static str {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
    match ext.as_str() {
        "html" | "htm" => "text/html; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "json" | "map" => "application/json",
        "webmanifest" => "application/manifest+json",
        "txt" | "r" | "rmd" | "qmd" | "log" => "text/plain; charset=utf-8",
        "md" => "text/markdown; charset=utf-8",
        "csv" => "text/csv; charset=utf-8",
        "tsv" => "text/tab-separated-values; charset=utf-8",
        "xml" => "application/xml",
        "yaml" | "yml" => "application/yaml",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "avif" => "image/avif",
        "ico" => "image/x-icon",
        "bmp" => "image/bmp",
        "tif" | "tiff" => "image/tiff",
        "pdf" => "application/pdf",
        "woff" => "font/woff",
        "woff2" => "font/woff2",
        "ttf" => "font/ttf",
        "otf" => "font/otf",
        "wasm" => "application/wasm",
        "mp4" => "video/mp4",
        "webm" => "video/webm",
        "mp3" => "audio/mpeg",
        "ogg" => "audio/ogg",
        "wav" => "audio/wav",
        "zip" => "application/zip",
        "gz" => "application/gzip",
        _ => "application/octet-stream",
    }
}

/// A file's entity tag: its size and modification time (in nanoseconds),
/// as nginx builds one: it changes whenever the file is rewritten.
pub fn etag(len: u64, modified: SystemTime) -> String {
    let nanos = modified.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
    format!("\"{len:x}-{nanos:x}\"")
}

/// A time as HTTP writes it (`Sun, 06 Nov 1994 08:49:37 GMT`).
pub fn http_date(t: SystemTime) -> String {
    httpdate::fmt_http_date(t)
}

/// `t` to the second, as `Last-Modified` carries it.
fn whole_seconds(t: SystemTime) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs())
}

fn header_str<'a>(headers: &'a HeaderMap, name: &header::HeaderName) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Whether a GET or HEAD is answered 304: `If-None-Match` names the file's
/// tag (weak comparison, or `*`), or, without `If-None-Match`,
/// `If-Modified-Since` is not before the file's last change.
pub fn not_modified(headers: &HeaderMap, etag: &str, modified: SystemTime) -> bool {
    if let Some(tags) = header_str(headers, &header::IF_NONE_MATCH) {
        let ours = etag.trim_start_matches("W/");
        return tags.split(',').map(str::trim).any(|t| t == "*" || t.trim_start_matches("W/") == ours);
    }
    match header_str(headers, &header::IF_MODIFIED_SINCE).map(httpdate::parse_http_date) {
        Some(Ok(since)) => whole_seconds(modified) <= since,
        _ => false,
    }
}

/// Which bytes of a file of `len` bytes an answer carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Span {
    /// All of it (no `Range`, one valve ignores, or several ranges): 200.
    Whole,
    /// Bytes `start..=end`: 206.
    Part { start: u64, end: u64 },
    /// Nothing the file has: 416.
    Unsatisfiable,
}

/// The bytes a `Range` header asks for: one `bytes=a-b`, `bytes=a-` or
/// `bytes=-n`. A header that is not one of those (another unit, bad syntax,
/// several ranges) is ignored, as RFC 9110 allows: the whole file.
pub fn span(range: Option<&str>, len: u64) -> Span {
    let Some(spec) = range.map(str::trim) else { return Span::Whole };
    let Some(spec) = spec.get(..6).filter(|u| u.eq_ignore_ascii_case("bytes=")).map(|_| spec[6..].trim()) else {
        return Span::Whole;
    };
    if spec.contains(',') {
        return Span::Whole;
    }
    let Some((first, last)) = spec.split_once('-') else { return Span::Whole };
    let (first, last) = (first.trim(), last.trim());
    // Digits only; a number too large for u64 is past the end of any file.
    let number = |s: &str| {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse::<u64>().unwrap_or(u64::MAX))
    };
    let from = |start: u64, end: u64| match start < len {
        true => Span::Part { start, end: end.min(len.saturating_sub(1)) },
        false => Span::Unsatisfiable,
    };
    match (number(first), number(last)) {
        // `-n`: the last n bytes.
        (None, Some(n)) if first.is_empty() => match n == 0 || len == 0 {
            true => Span::Unsatisfiable,
            false => Span::Part { start: len.saturating_sub(n), end: len - 1 },
        },
        // `a-`: from a to the end.
        (Some(start), None) if last.is_empty() => from(start, u64::MAX),
        // `a-b` (b past the end means the end).
        (Some(start), Some(end)) if start <= end => from(start, end),
        _ => Span::Whole,
    }
}

/// Whether a `Range` is to be honoured: no `If-Range`, or one naming the
/// file as it is now (its tag, strongly, or its `Last-Modified` exactly).
pub fn range_applies(headers: &HeaderMap, etag: &str, modified: SystemTime) -> bool {
    match header_str(headers, &header::IF_RANGE).map(str::trim) {
        None => true,
        Some(tag) if tag.starts_with('"') || tag.starts_with("W/") => tag == etag,
        Some(date) => httpdate::parse_http_date(date).is_ok_and(|d| d == whole_seconds(modified)),
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(k.clone(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn content_types_follow_the_extension_in_any_case() {
        let t = |name: &str| content_type(Path::new(name));
        assert_eq!(t("index.html"), "text/html; charset=utf-8");
        assert_eq!(t("INDEX.HTM"), "text/html; charset=utf-8");
        assert_eq!(t("app.js"), "text/javascript; charset=utf-8");
        assert_eq!(t("style.css"), "text/css; charset=utf-8");
        assert_eq!(t("data.json"), "application/json");
        assert_eq!(t("logo.SVG"), "image/svg+xml");
        assert_eq!(t("plot.png"), "image/png");
        assert_eq!(t("photo.jpeg"), "image/jpeg");
        assert_eq!(t("report.pdf"), "application/pdf");
        assert_eq!(t("font.woff2"), "font/woff2");
        assert_eq!(t("analysis.R"), "text/plain; charset=utf-8");
        assert_eq!(t("data.bin"), "application/octet-stream");
        assert_eq!(t("Makefile"), "application/octet-stream");
    }

    #[test]
    fn an_etag_changes_with_size_or_time() {
        let t = UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789);
        let tag = etag(3000, t);
        assert!(tag.starts_with('"') && tag.ends_with('"'), "{tag}");
        assert_ne!(tag, etag(3001, t));
        assert_ne!(tag, etag(3000, t + Duration::from_nanos(1)), "a rewrite within the same second");
        assert_eq!(http_date(UNIX_EPOCH + Duration::from_secs(784_111_777)), "Sun, 06 Nov 1994 08:49:37 GMT");
    }

    #[test]
    fn conditional_requests_get_304_when_the_file_is_unchanged() {
        let t = UNIX_EPOCH + Duration::from_millis(784_111_777_500);
        let tag = etag(10, t);
        let inm = header::IF_NONE_MATCH;
        let ims = header::IF_MODIFIED_SINCE;
        assert!(not_modified(&headers(&[(inm.clone(), &tag)]), &tag, t));
        assert!(not_modified(&headers(&[(inm.clone(), &format!("\"x\", W/{tag}"))]), &tag, t), "weak, in a list");
        assert!(not_modified(&headers(&[(inm.clone(), "*")]), &tag, t));
        assert!(!not_modified(&headers(&[(inm.clone(), "\"other\"")]), &tag, t));
        let date = "Sun, 06 Nov 1994 08:49:37 GMT";
        assert!(not_modified(&headers(&[(ims.clone(), date)]), &tag, t), "the same second");
        assert!(not_modified(&headers(&[(ims.clone(), "Sun, 06 Nov 1994 09:00:00 GMT")]), &tag, t));
        assert!(!not_modified(&headers(&[(ims.clone(), "Sun, 06 Nov 1994 08:49:36 GMT")]), &tag, t), "changed since");
        assert!(!not_modified(&headers(&[(ims.clone(), "yesterday")]), &tag, t), "not a date: ignored");
        assert!(
            !not_modified(&headers(&[(inm, "\"other\""), (ims, date)]), &tag, t),
            "If-None-Match wins over If-Modified-Since"
        );
        assert!(!not_modified(&HeaderMap::new(), &tag, t));
    }

    #[test]
    fn one_range_is_served_and_anything_else_is_the_whole_file() {
        let s = |r: &str| span(Some(r), 3000);
        assert_eq!(s("bytes=0-99"), Span::Part { start: 0, end: 99 });
        assert_eq!(s("bytes=2990-"), Span::Part { start: 2990, end: 2999 });
        assert_eq!(s("bytes=-10"), Span::Part { start: 2990, end: 2999 });
        assert_eq!(s("bytes=-5000"), Span::Part { start: 0, end: 2999 }, "a suffix longer than the file");
        assert_eq!(s("bytes=100-99999"), Span::Part { start: 100, end: 2999 }, "an end past the file");
        assert_eq!(s("BYTES = 5-5"), Span::Whole, "not the syntax");
        assert_eq!(s("Bytes=5-5"), Span::Part { start: 5, end: 5 }, "the unit in any case");
        assert_eq!(s("bytes=3000-"), Span::Unsatisfiable);
        assert_eq!(s("bytes=5000-6000"), Span::Unsatisfiable);
        assert_eq!(s("bytes=-0"), Span::Unsatisfiable);
        assert_eq!(s("bytes=99999999999999999999999-"), Span::Unsatisfiable);
        assert_eq!(s("bytes=5-99999999999999999999999"), Span::Part { start: 5, end: 2999 });
        assert_eq!(s("bytes=0-1,5-6"), Span::Whole, "several ranges: the whole file");
        assert_eq!(s("bytes=9-5"), Span::Whole, "backwards: ignored");
        assert_eq!(s("bytes=a-b"), Span::Whole);
        assert_eq!(s("bytes=-"), Span::Whole);
        assert_eq!(s("items=0-5"), Span::Whole);
        assert_eq!(span(None, 3000), Span::Whole);
        assert_eq!(span(Some("bytes=0-"), 0), Span::Unsatisfiable, "an empty file has no bytes");
        assert_eq!(span(Some("bytes=-1"), 0), Span::Unsatisfiable);
    }

    #[test]
    fn if_range_honours_a_range_only_for_the_file_as_it_is() {
        let t = UNIX_EPOCH + Duration::from_millis(784_111_777_500);
        let tag = etag(10, t);
        assert!(range_applies(&HeaderMap::new(), &tag, t));
        assert!(range_applies(&headers(&[(header::IF_RANGE, &tag)]), &tag, t));
        assert!(!range_applies(&headers(&[(header::IF_RANGE, "\"old\"")]), &tag, t));
        assert!(!range_applies(&headers(&[(header::IF_RANGE, &format!("W/{tag}"))]), &tag, t), "weak never matches");
        assert!(range_applies(&headers(&[(header::IF_RANGE, "Sun, 06 Nov 1994 08:49:37 GMT")]), &tag, t));
        assert!(!range_applies(&headers(&[(header::IF_RANGE, "Sun, 06 Nov 1994 08:49:36 GMT")]), &tag, t));
    }
}
