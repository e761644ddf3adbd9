//! An app's fingerprint: what its files look like now, so a reload can tell
//! an app that changed from one that did not.

use std::hash::{Hash, Hasher};
use std::path::Path;

use crate::config::{is_output_of_a_document, AppSource};

/// What an app's files look like now: names, sizes and modification times of
/// the app's file, or of every file in its folder (hidden ones and files
/// beyond 20,000 aside). A plumber file's sibling R files count too (it may
/// `source()` them). An R Markdown document's app is its folder, less what
/// rendering a document writes there (`doc.html`, `doc_files/`...): valve's
/// own render must not look like a change. Static content's files are read
/// at each request, so only its folder counts.
pub fn fingerprint(source: &AppSource) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut files = Vec::new();
    match source {
        AppSource::PlumberDir(d) | AppSource::ServerYml { dir: d, .. } => walk(d, 0, &mut files),
        AppSource::ShinyRmd { doc, .. } => {
            if let Some(dir) = doc.parent() {
                walk(dir, 0, &mut files);
                files.retain(|f| !f.ancestors().take_while(|a| *a != dir).any(is_output_of_a_document));
            }
        }
        AppSource::Shiny(p) if p.is_dir() => walk(p, 0, &mut files),
        // Served from the disk as they are: an edit needs no new generation.
        AppSource::Static(dir) => dir.hash(&mut h),
        AppSource::PlumberFile(p) | AppSource::PlumberRds(p) | AppSource::Shiny(p) => {
            files.push(p.clone());
            if let Some(Ok(siblings)) = p.parent().map(std::fs::read_dir) {
                files.extend(
                    siblings
                        .flatten()
                        .map(|e| e.path())
                        .filter(|f| f.extension().is_some_and(|e| e.eq_ignore_ascii_case("r"))),
                );
            }
        }
    }
    files.sort();
    files.dedup();
    for f in files {
        f.hash(&mut h);
        if let Ok(m) = std::fs::metadata(&f) {
            m.len().hash(&mut h);
            m.modified().ok().hash(&mut h);
        }
    }
    h.finish()
}

fn walk(dir: &Path, depth: usize, out: &mut Vec<std::path::PathBuf>) {
    if depth > 8 || out.len() > 20_000 {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => walk(&path, depth + 1, out),
            Ok(t) if t.is_file() => out.push(path),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fingerprint_changes_with_the_apps_files() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("plumber.R"), "a").unwrap();
        let app = AppSource::PlumberDir(d.path().to_path_buf());
        let first = fingerprint(&app);
        assert_eq!(fingerprint(&app), first);
        std::fs::write(d.path().join("plumber.R"), "ab").unwrap();
        assert_ne!(fingerprint(&app), first, "an edit");
        let second = fingerprint(&app);
        std::fs::create_dir(d.path().join("R")).unwrap();
        std::fs::write(d.path().join("R/helpers.R"), "x").unwrap();
        assert_ne!(fingerprint(&app), second, "a file added in a sub-folder");
        let third = fingerprint(&app);
        std::fs::write(d.path().join(".Rhistory"), "x").unwrap();
        assert_eq!(fingerprint(&app), third, "hidden files do not count");
    }

    #[test]
    fn rendering_a_document_does_not_change_its_fingerprint_and_editing_it_does() {
        let d = tempfile::tempdir().unwrap();
        let doc = d.path().join("doc.Rmd");
        std::fs::write(&doc, "---\nruntime: shiny_prerendered\n---\n").unwrap();
        let app = AppSource::ShinyRmd { doc: doc.clone(), runtime: crate::config::Runtime::Prerendered, folder: true };
        let first = fingerprint(&app);
        std::fs::write(d.path().join("doc.html"), "<html>").unwrap();
        std::fs::create_dir_all(d.path().join("doc_files/figure-html")).unwrap();
        std::fs::write(d.path().join("doc_files/figure-html/plot.png"), "png").unwrap();
        assert_eq!(fingerprint(&app), first, "what a render writes");
        std::fs::write(d.path().join("data.csv"), "x").unwrap();
        assert_ne!(fingerprint(&app), first, "a file beside the document");
        let second = fingerprint(&app);
        std::fs::write(&doc, "---\nruntime: shiny_prerendered\n---\nmore").unwrap();
        assert_ne!(fingerprint(&app), second, "the document itself");
    }
}
