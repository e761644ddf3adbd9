//! Interactive R Markdown documents, found as rmarkdown 2.20 finds them:
//! the YAML front matter read as `rmarkdown::yaml_front_matter()` reads it,
//! the kind decided as `rmarkdown:::is_shiny()` and
//! `rmarkdown:::is_shiny_prerendered()` decide it, and the document of a
//! folder picked as `rmarkdown::run(dir = )` picks it.
//!
//! - `runtime: shinyrmd` or `runtime: shiny_prerendered`, `server: shiny` or
//!   `server: {type: shiny}`: prerendered (rendered once, its server code
//!   run per session);
//! - any other `runtime` starting with `shiny` (`runtime: shiny`): rendered
//!   per session;
//! - anything else is not interactive: valve does not serve it.
//!
//! In a folder: the one `.Rmd` (names starting with `_` or `.` aside), else
//! `index.Rmd`, else `ui.Rmd`, else the first interactive one; names matched
//! without regard to case. A Quarto document (`.qmd`) with `server: shiny`
//! is found the same way; Quarto renders it, rmarkdown runs it.

use std::path::{Path, PathBuf};

use yaml_rust2::{Yaml, YamlLoader};

use super::error::ConfigError;

/// How rmarkdown runs an interactive document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runtime {
    /// `runtime: shiny`: knitted again for every session.
    Shiny,
    /// `runtime: shiny_prerendered` (or `server: shiny`): rendered once to
    /// HTML beside the document; its `context="server"` chunks run per session.
    Prerendered,
}

/// What a document's front matter says of its runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrontMatter {
    Interactive(Runtime),
    /// No front matter, or one without a Shiny runtime: a static document.
    Static,
}

/// Whether `path`'s name ends in `.Rmd`, in any case.
pub fn is_rmd(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("rmd"))
}

/// Whether `path`'s name ends in `.qmd` (a Quarto document), in any case.
pub fn is_qmd(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("qmd"))
}

/// The lines of `text`'s front matter, as `rmarkdown:::partition_yaml_front_matter`
/// finds it: between the first two lines that are `---` or `...` (the first
/// must be `---`, not right after one another), with only blank lines before
/// it. Returns the 1-based line the YAML starts on, and the YAML.
fn front_matter(text: &str) -> Option<(usize, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let is_delimiter = |l: &str| {
        let t = l.trim_end();
        t == "---" || t == "..."
    };
    let mut delimiters = lines.iter().enumerate().filter(|(_, l)| is_delimiter(l)).map(|(i, _)| i);
    let (first, second) = (delimiters.next()?, delimiters.next()?);
    let valid = second - first > 1
        && lines[first].trim_end() == "---"
        && lines[..first].iter().all(|l| l.trim().is_empty() || is_notebook_marker(l));
    valid.then(|| (first + 2, lines[first + 1..second].join("\n")))
}

/// The `<!-- rnb-...-begin -->` markers an R notebook may put before its front matter.
fn is_notebook_marker(line: &str) -> bool {
    let t = line.trim();
    t.starts_with("<!-- rnb-") && t.ends_with("-->")
}

/// Reads a document's front matter and says whether it is interactive.
/// Fails, naming the line, when the front matter is not YAML.
pub fn read_front_matter(text: &str) -> Result<FrontMatter, String> {
    let Some((start, yaml)) = front_matter(text) else { return Ok(FrontMatter::Static) };
    if yaml.trim_end().ends_with(':') {
        return Err("it ends with ':' (a key without a value)".into());
    }
    let docs = YamlLoader::load_from_str(&yaml).map_err(|e| {
        format!("{} at line {}, column {}", e.info(), start + e.marker().line().saturating_sub(1), e.marker().col() + 1)
    })?;
    let Some(map @ Yaml::Hash(_)) = docs.first() else { return Ok(FrontMatter::Static) };
    let runtime = map["runtime"].as_str();
    let server = &map["server"];
    let prerendered = matches!(runtime, Some("shinyrmd" | "shiny_prerendered"))
        || server.as_str() == Some("shiny")
        || server["type"].as_str() == Some("shiny");
    Ok(if prerendered {
        FrontMatter::Interactive(Runtime::Prerendered)
    } else if runtime.is_some_and(|r| r.starts_with("shiny")) {
        FrontMatter::Interactive(Runtime::Shiny)
    } else {
        FrontMatter::Static
    })
}

/// Reads `path`'s front matter (see `read_front_matter`).
pub fn runtime_of(path: &Path) -> Result<FrontMatter, ConfigError> {
    let shown = path.display().to_string();
    let bytes =
        std::fs::read(path).map_err(|e| ConfigError::Unreadable { path: shown.clone(), reason: e.to_string() })?;
    read_front_matter(&String::from_utf8_lossy(&bytes))
        .map_err(|reason| ConfigError::BadFrontMatter { path: shown, reason })
}

/// `path` as an interactive document, or why it is not one. A Quarto
/// document is interactive only with `server: shiny` (Quarto's one way):
/// rendered once by `quarto render`, then run as a prerendered document.
pub fn interactive(path: &Path) -> Result<Runtime, ConfigError> {
    let shown = path.display().to_string();
    match runtime_of(path)? {
        FrontMatter::Interactive(Runtime::Prerendered) => Ok(Runtime::Prerendered),
        _ if is_qmd(path) => Err(ConfigError::QuartoNotInteractive(shown)),
        FrontMatter::Interactive(runtime) => Ok(runtime),
        FrontMatter::Static => Err(ConfigError::NotInteractive(shown)),
    }
}

/// The document `rmarkdown::run(dir = )` would serve from `dir`, if `dir`
/// holds any `.Rmd`: `Ok(None)` when it holds none.
pub fn document_of(dir: &Path) -> Result<Option<PathBuf>, ConfigError> {
    document_in(dir, is_rmd)
}

/// A folder's Quarto document, picked as `document_of` picks an R
/// Markdown one (`index.qmd`, else the one `.qmd`...).
pub fn quarto_document_of(dir: &Path) -> Result<Option<PathBuf>, ConfigError> {
    document_in(dir, is_qmd)
}

fn document_in(dir: &Path, is_doc: fn(&Path) -> bool) -> Result<Option<PathBuf>, ConfigError> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| ConfigError::Unreadable { path: dir.display().to_string(), reason: e.to_string() })?
        .flatten()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            !name.starts_with(['_', '.'])
        })
        .map(|e| e.path())
        .filter(|p| is_doc(p) && p.is_file())
        .collect();
    docs.sort();
    if docs.len() <= 1 {
        return Ok(docs.pop());
    }
    let named = |stem: &str| {
        docs.iter().find(|p| p.file_stem().is_some_and(|s| s.to_string_lossy().eq_ignore_ascii_case(stem))).cloned()
    };
    if let Some(doc) = named("index").or_else(|| named("ui")) {
        return Ok(Some(doc));
    }
    for doc in &docs {
        if matches!(runtime_of(doc)?, FrontMatter::Interactive(_)) {
            return Ok(Some(doc.clone()));
        }
    }
    // None is interactive: the first, so that the error names one.
    Ok(docs.into_iter().next())
}

/// The files rendering `doc` (R Markdown or Quarto) writes beside it
/// (`doc.html`, `doc_files/`, `doc_cache/`, `doc_data/`): outputs, not the
/// app's source.
pub fn is_output_of_a_document(path: &Path) -> bool {
    let Some(name) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else { return false };
    let stem = [".html", "_files", "_cache", "_data"].iter().find_map(|suffix| name.strip_suffix(suffix));
    let Some(stem) = stem else { return false };
    let Some(dir) = path.parent() else { return false };
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let p = e.path();
            (is_rmd(&p) || is_qmd(&p)) && p.file_stem().is_some_and(|s| s.to_string_lossy() == stem)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(text: &str) -> FrontMatter {
        read_front_matter(text).unwrap()
    }

    const SHINY: FrontMatter = FrontMatter::Interactive(Runtime::Shiny);
    const PRERENDERED: FrontMatter = FrontMatter::Interactive(Runtime::Prerendered);

    #[test]
    fn every_spelling_of_a_shiny_runtime_is_read_as_rmarkdown_reads_it() {
        assert_eq!(kind("---\ntitle: x\nruntime: shiny\n---\nbody"), SHINY);
        assert_eq!(kind("---\nruntime: \"shiny\"\n---\n"), SHINY, "quoted");
        assert_eq!(kind("---\nruntime: 'shiny'  # a comment\n---\n"), SHINY);
        assert_eq!(kind("---\r\nruntime: shiny\r\n---\r\n"), SHINY, "CRLF lines");
        assert_eq!(kind("---\nruntime: shiny_prerendered\n---\n"), PRERENDERED);
        assert_eq!(kind("---\nruntime: shinyrmd\n---\n"), PRERENDERED, "Connect's old name");
        assert_eq!(kind("---\nserver: shiny\n---\n"), PRERENDERED, "what rmarkdown calls shiny_prerendered");
        assert_eq!(kind("---\nserver:\n  type: shiny\n---\n"), PRERENDERED);
        assert_eq!(kind("---\nserver: {type: shiny}\n---\n"), PRERENDERED, "flow style");
        assert_eq!(kind("---\nruntime: shiny\nserver: shiny\n---\n"), PRERENDERED, "server: shiny wins");
        assert_eq!(kind("\n\n---\nruntime: shiny\n...\n"), SHINY, "blank lines before, `...` to close");
        assert_eq!(
            kind("<!-- rnb-text-begin -->\n---\nruntime: shiny\n---\n"),
            SHINY,
            "a notebook's marker before the front matter"
        );
        assert_eq!(kind("---\noutput:\n  html_document:\n    toc: true\nruntime: shiny\n---\n"), SHINY);
    }

    #[test]
    fn documents_without_a_shiny_runtime_are_static() {
        assert_eq!(kind("---\ntitle: x\noutput: html_document\n---\n"), FrontMatter::Static, "no runtime");
        assert_eq!(kind("no front matter at all\nruntime: shiny\n"), FrontMatter::Static);
        assert_eq!(kind("---\nruntime: static\n---\n"), FrontMatter::Static);
        assert_eq!(kind("---\nRuntime: shiny\n---\n"), FrontMatter::Static, "keys are case-sensitive, as in R");
        assert_eq!(kind("text first\n---\nruntime: shiny\n---\n"), FrontMatter::Static, "not at the top");
        assert_eq!(kind("---\n---\nruntime: shiny\n"), FrontMatter::Static, "an empty front matter");
        assert_eq!(kind("---\n- a list\n---\n"), FrontMatter::Static, "not a mapping");
        assert_eq!(kind("---\nserver: connect\n---\n"), FrontMatter::Static);
    }

    #[test]
    fn bad_yaml_is_an_error_naming_the_line() {
        let e = read_front_matter("---\ntitle: x\nruntime: [shiny\n---\n").unwrap_err();
        assert!(e.contains("line"), "{e}");
        let e = read_front_matter("---\ntitle: \"x\nruntime: shiny\n---\n").unwrap_err();
        assert!(e.contains("line"), "{e}");
        let e = read_front_matter("---\ntitle: x\nruntime:\n---\n").unwrap_err();
        assert!(e.contains("ends with ':'"), "rmarkdown's own check: {e}");
        let e = read_front_matter("---\ntitle: x\n  bad: indent\n---\n").unwrap_err();
        assert!(e.contains("line 3"), "the line in the file: {e}");
    }

    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (f, text) in files {
            std::fs::write(dir.path().join(f), text).unwrap();
        }
        dir
    }

    const DOC: &str = "---\nruntime: shiny\n---\n";
    const STATIC: &str = "---\ntitle: x\n---\n";

    fn found(d: &tempfile::TempDir) -> Option<String> {
        document_of(d.path()).unwrap().map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
    }

    #[test]
    fn a_folders_document_is_picked_as_rmarkdown_run_picks_it() {
        assert_eq!(found(&dir_with(&[("report.rmd", DOC)])).as_deref(), Some("report.rmd"), "the one .Rmd");
        assert_eq!(found(&dir_with(&[("a.Rmd", STATIC), ("INDEX.RMD", STATIC)])).as_deref(), Some("INDEX.RMD"));
        assert_eq!(found(&dir_with(&[("a.Rmd", STATIC), ("Ui.Rmd", STATIC)])).as_deref(), Some("Ui.Rmd"));
        assert_eq!(
            found(&dir_with(&[("a.Rmd", STATIC), ("b.Rmd", DOC), ("c.Rmd", DOC)])).as_deref(),
            Some("b.Rmd"),
            "the first interactive one"
        );
        assert_eq!(
            found(&dir_with(&[("_child.Rmd", STATIC), (".hidden.Rmd", STATIC), ("doc.Rmd", DOC)])).as_deref(),
            Some("doc.Rmd"),
            "`_` and hidden files do not count"
        );
        assert_eq!(found(&dir_with(&[("app.R", "")])), None);
        let d = dir_with(&[("a.Rmd", "---\nruntime: [\n---\n"), ("b.Rmd", DOC)]);
        assert!(matches!(document_of(d.path()), Err(ConfigError::BadFrontMatter { .. })), "R fails on it too");
    }

    #[test]
    fn a_static_document_is_refused_with_what_to_add() {
        let d = dir_with(&[("notes.Rmd", STATIC)]);
        let e = interactive(&d.path().join("notes.Rmd")).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("notes.Rmd") && text.contains("runtime: shiny"), "{text}");
    }

    #[test]
    fn a_quarto_document_is_interactive_only_with_server_shiny() {
        let d = dir_with(&[
            ("dash.qmd", "---\nserver: shiny\n---\n"),
            ("typed.QMD", "---\nserver:\n  type: shiny\n---\n"),
            ("live.qmd", DOC),
            ("plain.qmd", STATIC),
        ]);
        assert_eq!(interactive(&d.path().join("dash.qmd")).unwrap(), Runtime::Prerendered);
        assert_eq!(interactive(&d.path().join("typed.QMD")).unwrap(), Runtime::Prerendered);
        for doc in ["live.qmd", "plain.qmd"] {
            let e = interactive(&d.path().join(doc)).unwrap_err();
            assert!(matches!(e, ConfigError::QuartoNotInteractive(_)), "{doc}: {e}");
            assert!(e.to_string().contains("server: shiny"), "{e}");
        }
        let d = dir_with(&[("a.qmd", STATIC), ("index.qmd", "---\nserver: shiny\n---\n"), ("b.Rmd", DOC)]);
        let found = quarto_document_of(d.path()).unwrap().unwrap();
        assert_eq!(found.file_name().unwrap(), "index.qmd");
        assert!(is_output_of_a_document(&d.path().join("index_files")), "Quarto writes index_files/ too");
    }

    #[test]
    fn render_outputs_are_told_from_sources() {
        let d = dir_with(&[("doc.Rmd", DOC), ("doc.html", ""), ("other.html", ""), ("data.csv", "")]);
        std::fs::create_dir(d.path().join("doc_files")).unwrap();
        assert!(is_output_of_a_document(&d.path().join("doc.html")));
        assert!(is_output_of_a_document(&d.path().join("doc_files")));
        assert!(is_output_of_a_document(&d.path().join("doc_cache")));
        assert!(!is_output_of_a_document(&d.path().join("other.html")), "no other.Rmd");
        assert!(!is_output_of_a_document(&d.path().join("data.csv")));
        assert!(!is_output_of_a_document(&d.path().join("doc.Rmd")));
    }
}
