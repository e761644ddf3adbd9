//! What a fresh machine needs: `scripts/install-deps` must install every R
//! package the repository's own R code, the R package, and the example apps
//! the tests run load. A machine that already has a package cannot tell it is
//! missing from the list, so this reads the code.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::{need_r_packages, plumber_example, shiny_example};

/// R's own packages, always there.
const BASE: [&str; 15] = [
    "base",
    "stats",
    "utils",
    "methods",
    "grDevices",
    "graphics",
    "tools",
    "parallel",
    "grid",
    "splines",
    "stats4",
    "compiler",
    "datasets",
    "tcltk",
    "valve",
];

/// Packages the example apps need without naming them in their code: plumber
/// loads these itself when an API uses its session cookies (06-sessions,
/// 12-entrypoint).
const INDIRECT: [&str; 2] = ["base64enc", "sodium"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The R packages `scripts/install-deps` installs (its `R_PACKAGES` list).
fn listed() -> BTreeSet<String> {
    let script = std::fs::read_to_string(root().join("scripts/install-deps")).expect("scripts/install-deps exists");
    let start =
        script.find("R_PACKAGES=(").expect("install-deps has an R_PACKAGES=( ... ) list") + "R_PACKAGES=(".len();
    script[start..]
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .take_while(|l| *l != ")")
        .flat_map(str::split_whitespace)
        .map(str::to_string)
        .collect()
}

/// Package names loaded in `text`: `library(x)`, `require(x)`,
/// `requireNamespace("x")` anywhere (R snippets live in Python and Rust
/// strings too), and `x::` in R code.
fn loaded(text: &str, r_code: bool) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    // requireNamespace() takes a string: an unquoted argument is a variable.
    for (call, quoted) in [("library(", false), ("require(", false), ("requireNamespace(", true)] {
        for (i, _) in text.match_indices(call) {
            let rest = &text[i + call.len()..];
            if quoted && !rest.starts_with(['"', '\'']) {
                continue;
            }
            let rest = rest.trim_start_matches(['"', '\'']);
            let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '.').collect();
            if name.len() > 1 && name.chars().next().is_some_and(|c| c.is_ascii_alphabetic()) {
                found.insert(name);
            }
        }
    }
    if r_code {
        for (i, _) in text.match_indices("::") {
            let before: String =
                text[..i].chars().rev().take_while(|c| c.is_ascii_alphanumeric() || *c == '.').collect();
            let name: String = before.chars().rev().collect();
            if name.len() > 1 && name.chars().next().is_some_and(|c| c.is_ascii_alphabetic()) {
                found.insert(name);
            }
        }
    }
    found
}

fn tracked_files() -> Vec<PathBuf> {
    let out = Command::new("git").args(["ls-files"]).current_dir(root()).output().expect("git runs");
    String::from_utf8_lossy(&out.stdout).lines().map(|l| root().join(l)).collect()
}

/// The R code of a file: all of an R script; the evaluated chunks of an R Markdown file.
fn r_code(path: &Path, text: &str) -> Option<String> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("R" | "r") => Some(text.to_string()),
        Some("Rmd") => {
            let mut code = String::new();
            let mut inside = false;
            for line in text.lines() {
                let t = line.trim_start();
                if !inside && t.starts_with("```{r") {
                    let header = t.replace(' ', "");
                    inside =
                        !header.contains("eval=FALSE") && !header.contains("eval=F,") && !header.contains("eval=F}");
                    continue;
                }
                if t.starts_with("```") {
                    inside = false;
                    continue;
                }
                if inside {
                    code.push_str(line);
                    code.push('\n');
                }
            }
            Some(code)
        }
        _ => None,
    }
}

fn is_r(path: &Path) -> bool {
    matches!(path.extension().and_then(|e| e.to_str()), Some("R" | "r" | "Rmd"))
}

fn r_files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(r_files_under(&p));
            } else if is_r(&p) {
                out.push(p);
            }
        }
    }
    out
}

/// The example apps of plumber and Shiny the integration tests run.
fn examples_the_tests_run() -> Vec<PathBuf> {
    let plumber = plumber_example("");
    let shiny = PathBuf::from(shiny_example(""));
    let mut dirs = Vec::new();
    for file in std::fs::read_dir(root().join("tests/it")).unwrap().flatten() {
        let text = std::fs::read_to_string(file.path()).unwrap_or_default();
        for (call, base) in [("plumber_example(\"", &plumber), ("shiny_example(\"", &shiny)] {
            for (i, _) in text.match_indices(call) {
                let name: String = text[i + call.len()..].chars().take_while(|c| *c != '"').collect();
                if !name.is_empty() && !name.contains('{') {
                    dirs.push(base.join(name));
                }
            }
        }
    }
    dirs.sort();
    dirs.dedup();
    dirs
}

#[test]
fn install_deps_names_every_r_package_the_repository_loads() {
    let listed = listed();
    let mut used: BTreeSet<(String, String)> = BTreeSet::new();
    let skip = |p: &Path| p.components().any(|c| c.as_os_str() == "node_modules");
    for file in tracked_files().into_iter().filter(|p| !skip(p)) {
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
        let where_ = file.strip_prefix(root()).unwrap_or(&file).display().to_string();
        let found = match r_code(&file, &text) {
            Some(code) => loaded(&code, true),
            // R run from other files (scripts, tests): only its library() calls are visible.
            None if file.extension().is_some_and(|e| e == "md") => BTreeSet::new(),
            None => loaded(&text, false),
        };
        for pkg in found {
            used.insert((pkg, where_.clone()));
        }
    }
    let description = std::fs::read_to_string(root().join("r/DESCRIPTION")).unwrap_or_default();
    for field in ["Imports:", "Suggests:", "Depends:"] {
        if let Some(i) = description.find(field) {
            let block: String = description[i + field.len()..]
                .lines()
                .enumerate()
                .take_while(|(n, l)| *n == 0 || l.starts_with(' ') || l.starts_with('\t'))
                .map(|(_, l)| l.to_string())
                .collect::<Vec<_>>()
                .join(" ");
            for dep in block.split(',') {
                let name: String = dep.trim().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '.').collect();
                if !name.is_empty() && name != "R" {
                    used.insert((name, "r/DESCRIPTION".into()));
                }
            }
        }
    }
    for dir in examples_the_tests_run() {
        for file in r_files_under(&dir) {
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            for pkg in loaded(&text, true) {
                used.insert((pkg, file.display().to_string()));
            }
        }
    }
    for pkg in INDIRECT {
        used.insert((pkg.to_string(), "plumber's session cookies (06-sessions, 12-entrypoint)".into()));
    }
    let missing: Vec<String> = used
        .iter()
        .filter(|(pkg, _)| !BASE.contains(&pkg.as_str()) && !listed.contains(pkg))
        .map(|(pkg, at)| {
            format!(
                "{pkg} (loaded in {at}): add `{pkg}` to R_PACKAGES in scripts/install-deps (Debian's r-cran-{})",
                pkg.to_lowercase()
            )
        })
        .collect();
    assert!(missing.is_empty(), "R packages a fresh machine would lack:\n{}", missing.join("\n"));
}

#[test]
fn every_listed_r_package_is_installed() {
    let listed: Vec<String> = listed().into_iter().collect();
    let refs: Vec<&str> = listed.iter().map(String::as_str).collect();
    need_r_packages(&refs);
}
