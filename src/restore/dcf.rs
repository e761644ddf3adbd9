//! R's DESCRIPTION format (Debian control files): `Field: value` lines, a
//! value continued on lines that start with white space. Pure.

/// The fields of one DESCRIPTION, in order, values with their continuation
/// lines joined by one space.
pub fn parse(text: &str) -> Vec<(String, String)> {
    let mut fields: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        if line.starts_with([' ', '\t']) {
            if let Some((_, value)) = fields.last_mut() {
                let more = line.trim();
                if !more.is_empty() {
                    if !value.is_empty() {
                        value.push(' ');
                    }
                    value.push_str(more);
                }
            }
        } else if let Some((name, value)) = line.split_once(':') {
            fields.push((name.trim().to_string(), value.trim().to_string()));
        }
    }
    fields
}

/// The value of `name` in `fields`.
pub fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

/// The packages a package needs to be installed and loaded: its `Depends`,
/// `Imports` and `LinkingTo`, without version rules and without R itself.
pub fn needs(fields: &[(String, String)]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for name in ["Depends", "Imports", "LinkingTo"] {
        for item in field(fields, name).unwrap_or("").split(',') {
            let package = item.trim().split(['(', ' ', '\t', '\n']).next().unwrap_or("").trim();
            if !package.is_empty() && package != "R" && !out.iter().any(|p| p == package) {
                out.push(package.to_string());
            }
        }
    }
    out
}

/// What the package installed in `dir` needs (nothing when its
/// DESCRIPTION cannot be read).
pub fn needs_of(dir: &std::path::Path) -> Vec<String> {
    needs(&parse(&std::fs::read_to_string(dir.join("DESCRIPTION")).unwrap_or_default()))
}

/// R's base packages: part of R itself, never restored.
pub const BASE: &[&str] = &[
    "base",
    "compiler",
    "datasets",
    "grDevices",
    "graphics",
    "grid",
    "methods",
    "parallel",
    "splines",
    "stats",
    "stats4",
    "tcltk",
    "tools",
    "utils",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continued_values_are_joined_and_needs_lose_versions_and_r() {
        let text = "Package: base64url\nVersion: 1.4\nDepends: R (>= 3.0),\n    stats\nImports:\n  backports (>= 1.1.0),\n\tutils\nLinkingTo: Rcpp\nSuggests: testthat\n";
        let fields = parse(text);
        assert_eq!(field(&fields, "Version"), Some("1.4"));
        assert_eq!(field(&fields, "Imports"), Some("backports (>= 1.1.0), utils"));
        assert_eq!(needs(&fields), ["stats", "backports", "utils", "Rcpp"]);
    }
}
