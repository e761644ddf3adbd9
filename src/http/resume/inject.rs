//! The client script, and its tag in a Shiny app's HTML pages: pure.
//!
//! The tag goes before the first `</head>`, after Shiny's own scripts and
//! before Shiny starts on DOM ready, with a `src` relative to the page so
//! it works under any prefix (and behind a proxy that rewrites paths).

/// The script valve serves at `<app>/__valve__/shiny-reconnect.js`: the
/// framing and the client, inside one function so they leave no globals.
pub const SCRIPT: &str = concat!("(function () {\n", include_str!("framing.js"), include_str!("client.js"), "})();\n");

/// The script's path below an app's root.
const SCRIPT_PATH: &str = "__valve__/shiny-reconnect.js";

/// Pages bigger than this are passed through without the script.
pub const MAX_PAGE: u64 = 2 << 20;

/// Whether a request path asks for the script (at any app's root).
pub fn wants_script(path: &str) -> bool {
    path.strip_suffix(SCRIPT_PATH).is_some_and(|dir| dir.ends_with('/'))
}

/// The script's body and a version for its URL (so a new valve's script is
/// never an old cached one).
pub fn script() -> (&'static str, String) {
    let hash = SCRIPT.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    (SCRIPT, format!("{:x}", hash & 0xffff_ffff))
}

/// The script's `src` from a page at `inner` (the path below the app's root).
pub fn script_src(inner: &str) -> String {
    let depth = inner.trim_start_matches('/').matches('/').count();
    format!("{}{SCRIPT_PATH}?v={}", "../".repeat(depth), script().1)
}

/// The page with the script's tag before its first `</head>` (any case), or
/// `None` if it has no `</head>` or its head loads no Shiny client
/// (`shiny.js` or `shiny.min.js`): an HTML file the app serves is left as it is.
pub fn inject(html: &[u8], src: &str) -> Option<Vec<u8>> {
    let at = html.windows(7).position(|w| w.eq_ignore_ascii_case(b"</head>"))?;
    let head = &html[..at];
    let shiny = [&b"shiny.js"[..], b"shiny.min.js"].iter().any(|name| head.windows(name.len()).any(|w| w == *name));
    if !shiny {
        return None;
    }
    let tag = format!("<script src=\"{src}\"></script>\n");
    let mut page = Vec::with_capacity(html.len() + tag.len());
    page.extend_from_slice(&html[..at]);
    page.extend_from_slice(tag.as_bytes());
    page.extend_from_slice(&html[at..]);
    Some(page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tag_goes_before_the_first_head_end_in_any_case() {
        let page = inject(b"<html><HEAD><script src='shiny.js'></script></Head><body></head></body>", "x.js").unwrap();
        assert_eq!(
            String::from_utf8(page).unwrap(),
            "<html><HEAD><script src='shiny.js'></script><script src=\"x.js\"></script>\n</Head><body></head></body>"
        );
        assert_eq!(inject(b"<html><body>no head</body></html>", "x.js"), None);
        assert_eq!(inject(b"", "x.js"), None);
    }

    #[test]
    fn only_a_page_that_loads_shinys_client_gets_the_tag() {
        let shiny = b"<head><script src=\"shiny-javascript-1.7.4/shiny.min.js\"></script></head>";
        assert!(inject(shiny, "x.js").is_some());
        assert!(inject(b"<head><script src=\"shared/shiny.js\"></script></head>", "x.js").is_some());
        // A report the app offers for download, or any other HTML it serves.
        assert_eq!(inject(b"<html><head><title>report</title></head><body>shiny.js</body></html>", "x.js"), None);
    }

    #[test]
    fn the_src_is_relative_to_the_page() {
        let v = script().1;
        assert_eq!(script_src("/"), format!("__valve__/shiny-reconnect.js?v={v}"));
        assert_eq!(script_src("/report.Rmd"), format!("__valve__/shiny-reconnect.js?v={v}"));
        assert_eq!(script_src("/docs/page.html"), format!("../__valve__/shiny-reconnect.js?v={v}"));
        assert_eq!(script_src("/a/b/"), format!("../../__valve__/shiny-reconnect.js?v={v}"));
    }

    #[test]
    fn the_script_is_asked_for_at_any_apps_root() {
        assert!(wants_script("/__valve__/shiny-reconnect.js"));
        assert!(wants_script("/apps/hello/__valve__/shiny-reconnect.js"));
        assert!(!wants_script("/apps/hello/x__valve__/shiny-reconnect.js"));
        assert!(!wants_script("/__valve__/metrics"));
        assert!(SCRIPT.contains("createSocket"), "the script is the reconnect client");
    }
}
