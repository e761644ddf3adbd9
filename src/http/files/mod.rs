//! Static content, served by valve itself (no R): a folder's files under its
//! app's prefix, GET and HEAD only.
//!
//! - A path is decoded segment by segment; a segment that is empty (`//`),
//!   hidden or a dot (`.`, `..`, `.git`, `%2e%2e`), or holds a slash,
//!   backslash or NUL once decoded, is refused (404), and so is a file whose
//!   real path (symlinks followed) lies outside the folder: both are
//!   canonicalized and the one must start with the other.
//! - A folder's path serves its `index.html` (any case); without its
//!   trailing slash it redirects to it; a folder without one is 404 (no
//!   listing). Only regular files are served (no FIFO or device).
//! - Answers stream the file a chunk at a time, with `Content-Length`,
//!   `Accept-Ranges`, `ETag`, `Last-Modified` and `Cache-Control: no-cache`
//!   (browsers revalidate, and an unchanged file costs a 304); one `Range`
//!   gets 206 (`headers`).

mod headers;

use std::ffi::OsString;
use std::fs::{File, Metadata};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};

use self::headers::{content_type, etag, http_date, not_modified, range_applies, span, Span};
use super::body::FileBody;
use super::head::join;
use super::reply::{error, redirect, ReplyBody};
use crate::config::index_html;

/// Answers `req` for the static folder `root`, mounted at `prefix`; `path` is
/// the request's path under the prefix, as it came (percent-encoded).
pub async fn serve<B>(root: &Path, prefix: &str, path: &str, req: &Request<B>) -> Response<ReplyBody> {
    let method = req.method();
    if method != Method::GET && method != Method::HEAD {
        let mut resp = error(
            StatusCode::METHOD_NOT_ALLOWED,
            &format!("method {method} is not served here: static content answers GET and HEAD"),
        );
        resp.headers_mut().insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return resp;
    }
    let Some((segments, slash)) = segments(path) else { return missing() };
    let root = root.to_path_buf();
    let found = tokio::task::spawn_blocking(move || locate(&root, &segments, slash)).await.unwrap_or(Found::Missing);
    match found {
        Found::Missing => missing(),
        Found::AddSlash => {
            let query = req.uri().query().map(|q| format!("?{q}")).unwrap_or_default();
            redirect(&format!("{}/{query}", join(prefix, path)))
        }
        Found::File(opened) => answer(method, req.headers(), *opened),
    }
}

fn missing() -> Response<ReplyBody> {
    error(StatusCode::NOT_FOUND, "no file at this path")
}

/// The decoded segments of `path` (which starts with `/`), and whether it
/// ends with a slash; `None` if a segment could reach outside the folder or
/// into a hidden file (see the module's comment).
fn segments(path: &str) -> Option<(Vec<OsString>, bool)> {
    let rest = path.strip_prefix('/')?;
    let slash = rest.is_empty() || rest.ends_with('/');
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() {
        return Some((Vec::new(), true));
    }
    let mut out = Vec::new();
    for raw in rest.split('/') {
        let bytes = percent_decode(raw)?;
        let bad = bytes.is_empty() || bytes[0] == b'.' || bytes.iter().any(|b| matches!(b, b'/' | b'\\' | 0));
        if bad {
            return None;
        }
        out.push(OsString::from_vec(bytes));
    }
    Some((out, slash))
}

/// `%XX` decoded; `None` for a `%` not followed by two hex digits.
fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(out)
}

/// A regular file inside the folder, opened: its real path and what `fstat` says.
struct Opened {
    file: File,
    path: PathBuf,
    meta: Metadata,
}

/// What a path names in the folder.
enum Found {
    File(Box<Opened>),
    /// A folder named without its trailing slash.
    AddSlash,
    /// Nothing that is served (missing, outside, hidden, a folder without an index, not a regular file).
    Missing,
}

/// Finds the file `segments` name under `root` (blocking: run off the async threads).
fn locate(root: &Path, segments: &[OsString], slash: bool) -> Found {
    let Ok(root) = std::fs::canonicalize(root) else { return Found::Missing };
    // The real path, symlinks followed, and only if it stays inside the folder.
    let inside = |p: &Path| std::fs::canonicalize(p).ok().filter(|real| real.starts_with(&root));
    let target: PathBuf = segments.iter().fold(root.clone(), |p, s| p.join(s));
    let Some(mut real) = inside(&target) else { return Found::Missing };
    let Ok(mut meta) = std::fs::metadata(&real) else { return Found::Missing };
    if meta.is_dir() {
        if !slash {
            return Found::AddSlash;
        }
        let Some(index) = index_html(&real).and_then(|i| inside(&i)) else { return Found::Missing };
        let Ok(m) = std::fs::metadata(&index) else { return Found::Missing };
        (real, meta) = (index, m);
    }
    // Checked before opening: opening a FIFO would block.
    if !meta.is_file() {
        return Found::Missing;
    }
    let Ok(file) = File::open(&real) else { return Found::Missing };
    match file.metadata() {
        Ok(meta) if meta.is_file() => Found::File(Box::new(Opened { file, path: real, meta })),
        _ => Found::Missing,
    }
}

/// A file's answer: 304 if the client's copy is current, 206 for one range,
/// 416 for a range past the end, else 200; a HEAD gets the headers alone.
fn answer(method: &Method, req: &HeaderMap, Opened { file, path, meta }: Opened) -> Response<ReplyBody> {
    let len = meta.len();
    let modified = meta.modified().unwrap_or(UNIX_EPOCH);
    let tag = etag(len, modified);
    let mut resp = Response::new(ReplyBody::Empty);
    let h = resp.headers_mut();
    let value = |s: &str| HeaderValue::from_str(s).unwrap_or_else(|_| HeaderValue::from_static(""));
    h.insert(header::ETAG, value(&tag));
    h.insert(header::LAST_MODIFIED, value(&http_date(modified)));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if not_modified(req, &tag, modified) {
        *resp.status_mut() = StatusCode::NOT_MODIFIED;
        return resp;
    }
    let range = req.get(header::RANGE).and_then(|v| v.to_str().ok());
    let wanted = if range_applies(req, &tag, modified) { span(range, len) } else { Span::Whole };
    let (start, end) = match wanted {
        Span::Whole => (0, len),
        Span::Part { start, end } => (start, end + 1),
        Span::Unsatisfiable => {
            let mut resp = error(StatusCode::RANGE_NOT_SATISFIABLE, &format!("the file has {len} bytes"));
            resp.headers_mut().insert(header::CONTENT_RANGE, value(&format!("bytes */{len}")));
            return resp;
        }
    };
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type(&path)));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(end - start));
    if let Span::Part { .. } = wanted {
        h.insert(header::CONTENT_RANGE, value(&format!("bytes {start}-{}/{len}", end - 1)));
        *resp.status_mut() = StatusCode::PARTIAL_CONTENT;
    }
    if method != Method::HEAD {
        *resp.body_mut() = ReplyBody::File(FileBody::part(file, start, end));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(path: &str) -> Option<(Vec<String>, bool)> {
        segments(path).map(|(s, slash)| (s.into_iter().map(|s| s.to_string_lossy().into_owned()).collect(), slash))
    }

    #[test]
    fn paths_are_decoded_and_escapes_refused() {
        assert_eq!(names("/"), Some((vec![], true)));
        assert_eq!(names("/a/b.html"), Some((vec!["a".into(), "b.html".into()], false)));
        assert_eq!(names("/docs/"), Some((vec!["docs".into()], true)));
        assert_eq!(names("/my%20file.txt"), Some((vec!["my file.txt".into()], false)));
        for bad in [
            "/../etc/passwd",
            "/a/../../x",
            "/%2e%2e/x",
            "/%2E%2E/x",
            "/a/%2e%2e%2f%2e%2e/x",
            "/./a",
            "/.git/config",
            "/.env",
            "/a%2fb",
            "/a%5c..%5cb",
            "/a\\b",
            "/a%00b",
            "//evil.example",
            "/a//b",
            "/a%zz",
            "/a%2",
            "relative",
        ] {
            assert_eq!(names(bad), None, "{bad}");
        }
    }

    fn site() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("INDEX.HTML"), "<h1>home</h1>").unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("sub/index.html"), "sub").unwrap();
        std::fs::create_dir(d.path().join("empty")).unwrap();
        std::fs::write(d.path().join("a.css"), "b{}").unwrap();
        d
    }

    fn found(root: &Path, path: &str) -> Option<String> {
        let (segs, slash) = segments(path)?;
        match locate(root, &segs, slash) {
            Found::File(opened) => Some(opened.path.file_name().unwrap().to_string_lossy().into_owned()),
            Found::AddSlash => Some("->/".into()),
            Found::Missing => None,
        }
    }

    #[test]
    fn folders_serve_their_index_and_are_never_listed() {
        let d = site();
        assert_eq!(found(d.path(), "/").as_deref(), Some("INDEX.HTML"), "any case");
        assert_eq!(found(d.path(), "/sub/").as_deref(), Some("index.html"));
        assert_eq!(found(d.path(), "/sub").as_deref(), Some("->/"), "a folder without its slash");
        assert_eq!(found(d.path(), "/empty/"), None, "no index: no listing");
        assert_eq!(found(d.path(), "/a.css").as_deref(), Some("a.css"));
        assert_eq!(found(d.path(), "/missing.txt"), None);
    }

    #[test]
    fn symlinks_are_followed_only_inside_the_folder() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.txt"), "secret").unwrap();
        let d = site();
        std::os::unix::fs::symlink(outside.path().join("secret.txt"), d.path().join("leak.txt")).unwrap();
        std::os::unix::fs::symlink(outside.path(), d.path().join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(d.path().join("a.css"), d.path().join("alias.css")).unwrap();
        assert_eq!(found(d.path(), "/leak.txt"), None);
        assert_eq!(found(d.path(), "/elsewhere/secret.txt"), None);
        assert_eq!(found(d.path(), "/alias.css").as_deref(), Some("a.css"), "a link within the folder");
    }

    #[test]
    fn only_regular_files_are_served() {
        let d = site();
        let fifo = d.path().join("pipe");
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0);
        assert_eq!(found(d.path(), "/pipe"), None, "a FIFO is never opened");
    }
}
