//! What a bundle or a lockfile may name, checked before anything becomes
//! a path or a URL (a boundary: what a publisher or an app wrote, read by
//! valve). R's own rules: a package name is ASCII letters, digits and dots,
//! at least two characters, starting with a letter and not ending in a dot
//! (`tools:::.standard_regexps()$valid_package_name`); a version is two or
//! more numbers joined by single dots or dashes (`valid_package_version`).
//! A repository a client names is `http://` or `https://`; anything else
//! (`file://` above all) only through an administrator's `[repositories]`.
//! Pure.

/// Why `name` is not a package name, if it is not one.
pub fn package_problem(name: &str) -> Option<String> {
    let b = name.as_bytes();
    let why = if b.is_empty() {
        "it is empty"
    } else if b.len() > 200 {
        "it is longer than 200 characters"
    } else if b.contains(&0) {
        "it holds a NUL"
    } else if b.contains(&b'/') || b.contains(&b'\\') {
        "it holds a slash"
    } else if name.contains("..") {
        "it holds `..`"
    } else if !b[0].is_ascii_alphabetic() {
        "it does not start with a letter"
    } else if b.len() < 2 {
        "it is one character"
    } else if b[b.len() - 1] == b'.' {
        "it ends in a dot"
    } else if !b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'.') {
        "it holds a character other than ASCII letters, digits and dots"
    } else {
        return None;
    };
    Some(why.to_string())
}

/// Why `version` is not a package version, if it is not one.
pub fn version_problem(version: &str) -> Option<String> {
    let b = version.as_bytes();
    if b.len() > 64 {
        return Some("it is longer than 64 characters".into());
    }
    let parts: Vec<&[u8]> = b.split(|c| *c == b'.' || *c == b'-').collect();
    if parts.len() < 2 || parts.iter().any(|p| p.is_empty() || !p.iter().all(u8::is_ascii_digit)) {
        return Some("it is not numbers joined by `.` or `-` (such as 1.0-7 or 2.5.1)".into());
    }
    None
}

/// `name` as a package name, or the error naming it (the caller names the file).
pub fn check_package(name: &str) -> Result<(), String> {
    match package_problem(name) {
        None => Ok(()),
        Some(why) => Err(format!(
            "the package name {} is refused ({why}): R package names are letters, digits and dots, starting with a letter",
            shown(name)
        )),
    }
}

/// `version` of package `name` as a version, or the error naming both.
pub fn check_version(name: &str, version: &str) -> Result<(), String> {
    match version_problem(version) {
        None => Ok(()),
        Some(why) => Err(format!("the package {name} has the version {} ({why}), which is refused", shown(version))),
    }
}

/// Why `url` may not be a repository a client names, if it may not be.
pub fn repository_problem(url: &str) -> Option<String> {
    let lower = url.to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://")) {
        return Some(
            "only http:// and https:// repositories may be named by a bundle or lockfile (an administrator maps any other in [repositories])"
                .into(),
        );
    }
    if url.len() > 2048 {
        return Some("it is longer than 2048 characters".into());
    }
    if url.bytes().any(|c| c.is_ascii_control() || c == b' ' || c == b'\\') {
        return Some("it holds a space, a backslash or a control character".into());
    }
    let rest = &url[url.find("://").map_or(0, |i| i + 3)..];
    if rest.split(['/', '?', '#']).next().unwrap_or("").is_empty() {
        return Some("it names no host".into());
    }
    None
}

/// A name or value as a message shows it: quoted, escapes visible, at most 60 characters.
pub fn shown(s: &str) -> String {
    let short: String = s.chars().take(60).collect();
    let more = if s.chars().count() > 60 { "..." } else { "" };
    format!("{short:?}{more}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_names_follow_rs_rule_and_nothing_that_is_a_path_passes() {
        for ok in ["R6", "data.table", "bitops", "base64url", "A3", "Rcpp"] {
            assert_eq!(package_problem(ok), None, "{ok}");
        }
        for bad in [
            "",
            "R",
            "../../../../tmp/x/pwn",
            "a/b",
            "a\\b",
            "a\0b",
            "pkg.",
            "9lives",
            ".hidden",
            "a..b",
            "nam e",
            "naïve",
            "a-b",
            "a_b",
        ] {
            assert!(package_problem(bad).is_some(), "{bad:?} is refused");
        }
        let e = check_package("../x").unwrap_err();
        assert!(e.starts_with("the package name \"../x\" is refused"), "{e}");
    }

    #[test]
    fn versions_are_numbers_joined_by_dots_or_dashes() {
        for ok in ["1.0", "1.0-7", "2.5.1", "0.1.0", "1.0.10000"] {
            assert_eq!(version_problem(ok), None, "{ok}");
        }
        for bad in ["", "1", "1.0a", "1..0", "1.0/../x", "v1.0", "1.0 ", "-1.0", "1.0\0"] {
            assert!(version_problem(bad).is_some(), "{bad:?} is refused");
        }
        let e = check_version("R6", "2.5.1a").unwrap_err();
        assert!(e.contains("R6") && e.contains("\"2.5.1a\""), "{e}");
    }

    #[test]
    fn a_client_names_only_http_and_https_repositories() {
        for ok in ["https://cloud.r-project.org", "http://127.0.0.1:8080/cran/", "HTTPS://p3m.dev/cran/latest"] {
            assert_eq!(repository_problem(ok), None, "{ok}");
        }
        for bad in ["file:///etc", "ftp://h/", "/srv/cran", "https://", "http:///x", "https://h/a b", "gopher://h"] {
            assert!(repository_problem(bad).is_some(), "{bad:?} is refused");
        }
    }
}
