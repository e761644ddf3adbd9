//! The dashboard's sign-in: a page with one field (a publishing key or the
//! operator token, typed once), the POST that checks it and sets the
//! session cookie, and the POST that ends it. The page runs no script; its
//! content security policy allows none.

use http::header::{HeaderValue, CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, LOCATION, SET_COOKIE};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::session::{COOKIE_NAME, SESSION_LIFE};
use super::{same_origin, Auth, KeyLookup};
use crate::http::reply::{error, ReplyBody};

/// Where the sign-in lives.
pub const PATH: &str = "/__valve__/sign-in";
pub const SIGN_OUT: &str = "/__valve__/sign-out";

/// The most bytes of a sign-in form valve reads.
const MAX_FORM: usize = 4096;

/// The sign-in page (`status`: 200 when asked for, 401 in place of a page
/// that needs a sign-in), with `note` above the field.
pub fn page(status: StatusCode, note: Option<&str>) -> Response<ReplyBody> {
    let note = note.map(|n| format!("<p role=\"alert\">{}</p>\n", escape(n))).unwrap_or_default();
    let body = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Sign in to valve</title>\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <style>body{{font-family:system-ui,sans-serif;max-width:28em;margin:4em auto;line-height:1.5}}\
         input{{width:100%;padding:.4em;font:inherit;box-sizing:border-box}}button{{margin-top:1em;padding:.4em 1.2em;font:inherit}}\
         p[role=alert]{{color:#a00}}</style></head>\n<body><main><h1>Sign in to valve</h1>\n{note}\
         <form method=\"post\" action=\"{PATH}\">\n<label for=\"key\">A publishing key, or valve's operator token</label>\n\
         <input id=\"key\" name=\"key\" type=\"password\" autocomplete=\"current-password\" required autofocus>\n\
         <button type=\"submit\">Sign in</button>\n</form>\n\
         <p><small>An operator finds the token in <code>admin.token</code> in valve's state folder; \
         <code>valve publish-key NAME</code> makes a key.</small></p></main></body></html>\n"
    );
    let mut resp = Response::new(ReplyBody::text(body));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    resp
}

/// `POST /__valve__/sign-in` with `key=...`: a session and its cookie,
/// then the dashboard; or the page again saying what was wrong.
pub async fn sign_in(auth: &Auth, req: Request<Incoming>, secure: bool, keys: KeyLookup<'_>) -> Response<ReplyBody> {
    if !same_origin(req.headers()) {
        return error(StatusCode::FORBIDDEN, "a sign-in must come from valve's own sign-in page");
    }
    let body = match http_body_util::Limited::new(req.into_body(), MAX_FORM).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return page(StatusCode::PAYLOAD_TOO_LARGE, Some("That is longer than any key.")),
    };
    let secret = form_field(&body, "key").unwrap_or_default();
    let Some(who) = auth.of_secret(&secret, keys) else {
        tracing::info!(target: "valve::admin", "a dashboard sign-in with an unknown key or token was refused");
        return page(StatusCode::UNAUTHORIZED, Some("valve knows no such key or token."));
    };
    let Some((cookie, _csrf)) = auth.sessions.create(who.clone()) else {
        return error(StatusCode::SERVICE_UNAVAILABLE, "the kernel's random source failed: no session was made");
    };
    tracing::info!(target: "valve::admin", who = %who.label(), "signed in to the dashboard");
    let mut resp = Response::new(ReplyBody::Empty);
    *resp.status_mut() = StatusCode::SEE_OTHER;
    let h = resp.headers_mut();
    h.insert(LOCATION, HeaderValue::from_static("/__valve__/"));
    if let Ok(v) = HeaderValue::from_str(&set_cookie(&cookie, secure, SESSION_LIFE.as_secs())) {
        h.insert(SET_COOKIE, v);
    }
    resp
}

/// `POST /__valve__/sign-out`: the session ends and its cookie goes.
pub fn sign_out(auth: &Auth, headers: &HeaderMap, secure: bool) -> Response<ReplyBody> {
    if let Some(cookie) = super::cookie_value(headers, COOKIE_NAME) {
        auth.sessions.end(&cookie);
    }
    let mut resp = Response::new(ReplyBody::Empty);
    *resp.status_mut() = StatusCode::SEE_OTHER;
    let h = resp.headers_mut();
    h.insert(LOCATION, HeaderValue::from_static(PATH));
    if let Ok(v) = HeaderValue::from_str(&set_cookie("", secure, 0)) {
        h.insert(SET_COOKIE, v);
    }
    resp
}

/// The session cookie: HttpOnly (no script reads it), SameSite=Strict (no
/// other site's request carries it), Secure over TLS, valve's pages only.
pub fn set_cookie(value: &str, secure: bool, max_age: u64) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!("{COOKIE_NAME}={value}; Path=/__valve__/; Max-Age={max_age}; HttpOnly; SameSite=Strict{secure}")
}

/// The value of `name` in an `application/x-www-form-urlencoded` body.
fn form_field(body: &[u8], name: &str) -> Option<String> {
    std::str::from_utf8(body).ok()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (decode(k) == name).then(|| decode(v))
    })
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_form_is_read_and_the_cookie_is_strict_httponly_and_secure_over_tls() {
        assert_eq!(form_field(b"key=valve_ab%2Bc+d&x=1", "key").as_deref(), Some("valve_ab+c d"));
        assert_eq!(form_field(b"x=1", "key"), None);
        let c = set_cookie("v", true, 60);
        assert!(c.contains("HttpOnly") && c.contains("SameSite=Strict") && c.ends_with("; Secure"), "{c}");
        assert!(!set_cookie("v", false, 60).contains("Secure"));
        assert_eq!(page(StatusCode::UNAUTHORIZED, Some("<b>")).status(), StatusCode::UNAUTHORIZED);
    }
}
