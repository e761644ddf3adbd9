//! What kind of app a path names, found exactly as R finds it:
//! `plumber::plumb(dir = )` takes `entrypoint.R`, else `plumber.R`;
//! `shiny::runApp(dir)` takes `server.R`, else `app.R` (no `ui.R` needed);
//! `rmarkdown::run(dir = )` takes its document (`rmd`: the one `.Rmd`, else
//! `index.Rmd`...) when it is interactive; all of them matched without
//! regard to case, as R does. A folder whose `_server.yml` names an engine
//! package is that engine's app, before anything else it holds; a Quarto
//! document with `server: shiny` comes after R Markdown. A folder with none
//! of those and an `index.html` is static content, served by valve itself (no R).

use std::path::{Path, PathBuf};

use super::engine;
use super::error::ConfigError;
use super::rmd::{self, Runtime};

/// What valve serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AppSource {
    /// A plumber API file, run as `pr(file)` would.
    PlumberFile(PathBuf),
    /// A directory with `entrypoint.R` or `plumber.R`, run as `plumb(dir = )` would.
    PlumberDir(PathBuf),
    /// A plumber router saved with `saveRDS()` (a router built in an R session).
    PlumberRds(PathBuf),
    /// A Shiny app: a directory (`server.R` or `app.R`) or one file.
    Shiny(PathBuf),
    /// An interactive R Markdown document, run as `rmarkdown::run()` runs it
    /// (its folder is the app); `folder` when it was named by its folder.
    ShinyRmd { doc: PathBuf, runtime: Runtime, folder: bool },
    /// A folder of files with an `index.html`, served by valve itself: no R.
    Static(PathBuf),
    /// A folder whose `_server.yml` (`settings`) names `engine`, the R
    /// package whose `launch_server(settings, host, port)` serves it over HTTP.
    ServerYml { dir: PathBuf, settings: PathBuf, engine: String },
}

impl AppSource {
    /// The path handed to R (absolute).
    pub fn path(&self) -> &Path {
        match self {
            AppSource::PlumberFile(p)
            | AppSource::PlumberDir(p)
            | AppSource::PlumberRds(p)
            | AppSource::Shiny(p)
            | AppSource::Static(p) => p,
            AppSource::ShinyRmd { doc, .. } => doc,
            AppSource::ServerYml { dir, .. } => dir,
        }
    }

    /// The folder valve serves files from, for static content (no R).
    pub fn static_root(&self) -> Option<&Path> {
        match self {
            AppSource::Static(dir) => Some(dir),
            _ => None,
        }
    }

    /// What serves it, in the ready line and the status: `plumber`, `shiny` or `static`.
    pub fn family(&self) -> &'static str {
        match self {
            AppSource::Static(_) => "static",
            AppSource::ServerYml { .. } => "engine",
            s if s.is_shiny() => "shiny",
            _ => "plumber",
        }
    }

    /// A plumber API valve can reach over frames (its own protocol): the
    /// launcher runs plumber itself. Shiny needs httpuv's WebSockets, and an
    /// engine runs its own HTTP server.
    pub fn speaks_frames(&self) -> bool {
        matches!(self, AppSource::PlumberFile(_) | AppSource::PlumberDir(_) | AppSource::PlumberRds(_))
    }

    /// Whether `--preload` can fork its workers from one loaded parent. An
    /// engine's `launch_server` loads and serves in one call, with no point
    /// to fork at, so its workers are always plain R processes.
    pub fn preloadable(&self) -> bool {
        !matches!(self, AppSource::ServerYml { .. } | AppSource::Static(_))
    }

    /// A Quarto document with `server: shiny`: rendered once by `quarto
    /// render`, then run by rmarkdown as a prerendered document.
    pub fn quarto(&self) -> bool {
        matches!(self, AppSource::ShinyRmd { doc, .. } if rmd::is_qmd(doc))
    }

    /// Served as a Shiny app (sticky workers, WebSockets, sessions): Shiny
    /// apps and interactive documents.
    pub fn is_shiny(&self) -> bool {
        matches!(self, AppSource::Shiny(_) | AppSource::ShinyRmd { .. })
    }

    /// A `shiny_prerendered` document: rendered once before its workers start.
    pub fn prerendered(&self) -> bool {
        matches!(self, AppSource::ShinyRmd { runtime: Runtime::Prerendered, .. })
    }

    /// How the launcher runs it.
    pub fn kind(&self) -> &'static str {
        match self {
            AppSource::PlumberFile(_) => "plumber-file",
            AppSource::PlumberDir(_) => "plumber-dir",
            AppSource::PlumberRds(_) => "plumber-rds",
            AppSource::Shiny(_) => "shiny",
            s if s.quarto() => "quarto-shiny",
            AppSource::ShinyRmd { runtime: Runtime::Shiny, .. } => "shiny-rmd",
            AppSource::ShinyRmd { runtime: Runtime::Prerendered, .. } => "shiny-prerendered",
            AppSource::Static(_) => "static",
            AppSource::ServerYml { .. } => "server-yml",
        }
    }

    /// The directory workers run in, so relative paths in the app work as
    /// without valve. A saved router runs where valve was started.
    pub fn workdir(&self) -> PathBuf {
        match self {
            AppSource::PlumberFile(p) => p.parent().unwrap_or(Path::new("/")).to_path_buf(),
            AppSource::Shiny(p) if p.is_file() => p.parent().unwrap_or(Path::new("/")).to_path_buf(),
            AppSource::ShinyRmd { doc, .. } => doc.parent().unwrap_or(Path::new("/")).to_path_buf(),
            AppSource::PlumberDir(d) | AppSource::Shiny(d) | AppSource::Static(d) => d.clone(),
            AppSource::ServerYml { dir, .. } => dir.clone(),
            AppSource::PlumberRds(_) => std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")),
        }
    }

    /// A label for logs and metrics: the app's folder, or its file's name without `.R`.
    pub fn default_name(&self) -> String {
        let name = match self {
            AppSource::PlumberFile(p) | AppSource::PlumberRds(p) => p.file_stem(),
            AppSource::ShinyRmd { doc, folder: false, .. } => doc.file_stem(),
            AppSource::ShinyRmd { doc, folder: true, .. } => doc.parent().and_then(Path::file_name),
            AppSource::Shiny(p) if p.is_file() => p.parent().and_then(Path::file_name),
            AppSource::PlumberDir(p) | AppSource::Shiny(p) | AppSource::Static(p) => p.file_name(),
            AppSource::ServerYml { dir, .. } => dir.file_name(),
        };
        name.map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "app".to_string())
    }
}

/// The entry of `dir` whose name is `name` without regard to case (the first
/// in sorted order, as R's `list.files` gives them).
fn find_ci(dir: &Path, name: &str) -> Option<PathBuf> {
    let mut hits: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().eq_ignore_ascii_case(name))
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    hits.sort();
    hits.into_iter().next()
}

/// A folder's `index.html`, matched without regard to case (the first in
/// sorted order), as a static folder's page at its root.
pub fn index_html(dir: &Path) -> Option<PathBuf> {
    find_ci(dir, "index.html")
}

/// Resolves a path to an absolute app and checks R can read it. `what` names
/// where the path came from in messages (`-f/--file`, a config file's entry).
pub fn resolve(path: &Path, what: &str) -> Result<AppSource, ConfigError> {
    let shown = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => ConfigError::NotFound { path: shown.clone(), what: what.to_string() },
        _ => ConfigError::Unreadable { path: shown.clone(), reason: e.to_string() },
    })?;
    let abs = std::fs::canonicalize(path)
        .map_err(|e| ConfigError::Unreadable { path: shown.clone(), reason: e.to_string() })?;
    if !meta.is_dir() && engine::is_server_yml(&abs) {
        // `-f app/_server.yml` names its folder.
        let dir = abs.parent().unwrap_or(Path::new("/"));
        return resolve(dir, what);
    }
    let (app, file) = if meta.is_dir() {
        if let Some(settings) = engine::server_yml_of(&abs) {
            let engine = engine::engine_of(&settings)?;
            (AppSource::ServerYml { dir: abs, settings: settings.clone(), engine }, settings)
        } else if let Some(file) = find_ci(&abs, "entrypoint.R").or_else(|| find_ci(&abs, "plumber.R")) {
            (AppSource::PlumberDir(abs), file)
        } else if let Some(file) = find_ci(&abs, "server.R").or_else(|| find_ci(&abs, "app.R")) {
            (AppSource::Shiny(abs), file)
        } else if let Some(doc) =
            rmd::document_of(&abs)?.map_or_else(|| rmd::quarto_document_of(&abs), |d| Ok(Some(d)))?
        {
            match (rmd::interactive(&doc), index_html(&abs)) {
                (Ok(runtime), _) => (AppSource::ShinyRmd { doc: doc.clone(), runtime, folder: true }, doc),
                // A document (R Markdown or Quarto) rendered to the page beside
                // it: the page is what is served.
                (Err(ConfigError::NotInteractive(_) | ConfigError::QuartoNotInteractive(_)), Some(index)) => {
                    (AppSource::Static(abs), index)
                }
                (Err(e), _) => return Err(e),
            }
        } else if let Some(index) = index_html(&abs) {
            (AppSource::Static(abs), index)
        } else {
            return Err(ConfigError::EmptyDir(shown));
        }
    } else if abs.extension().is_some_and(|e| e.eq_ignore_ascii_case("rds")) {
        (AppSource::PlumberRds(abs.clone()), abs)
    } else if rmd::is_rmd(&abs) || rmd::is_qmd(&abs) {
        let runtime = rmd::interactive(&abs)?;
        (AppSource::ShinyRmd { doc: abs.clone(), runtime, folder: false }, abs)
    } else if is_shiny_file(&abs) {
        (AppSource::Shiny(abs.clone()), abs)
    } else {
        (AppSource::PlumberFile(abs.clone()), abs)
    };
    std::fs::File::open(&file).map_err(|e| ConfigError::Unreadable {
        path: file.display().to_string(),
        reason: match e.kind() {
            std::io::ErrorKind::PermissionDenied => "permission denied".into(),
            _ => e.to_string(),
        },
    })?;
    Ok(app)
}

/// `static = "dir"` in a config file: a folder with an `index.html`, served
/// as files whatever else it holds (R files in it are served as files too).
pub fn resolve_static(path: &Path) -> Result<AppSource, ConfigError> {
    let shown = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => ConfigError::NoStaticFolder(shown.clone()),
        _ => ConfigError::Unreadable { path: shown.clone(), reason: e.to_string() },
    })?;
    if !meta.is_dir() {
        return Err(ConfigError::StaticNotAFolder(shown));
    }
    let abs = std::fs::canonicalize(path)
        .map_err(|e| ConfigError::Unreadable { path: shown.clone(), reason: e.to_string() })?;
    let index = index_html(&abs).ok_or(ConfigError::NoIndex(shown))?;
    std::fs::File::open(&index)
        .map_err(|e| ConfigError::Unreadable { path: index.display().to_string(), reason: e.to_string() })?;
    Ok(AppSource::Static(abs))
}

/// A single file is a Shiny app when it calls `shinyApp()` and has no plumber
/// annotations (`#* @get` and friends).
fn is_shiny_file(path: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(path) else { return false };
    let plumber = text.lines().any(|l| {
        let l = l.trim_start();
        (l.starts_with("#*") || l.starts_with("#'")) && l.contains('@')
    });
    !plumber && text.contains("shinyApp(")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_with(files: &[&str]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for f in files {
            std::fs::write(dir.path().join(f), "").unwrap();
        }
        dir
    }

    #[test]
    fn plumber_dirs_are_found_as_plumb_finds_them() {
        let d = dir_with(&["Plumber.R"]);
        assert!(matches!(resolve(d.path(), "-f").unwrap(), AppSource::PlumberDir(_)), "case does not matter");
        let d = dir_with(&["ENTRYPOINT.r", "app.R"]);
        assert!(matches!(resolve(d.path(), "-f").unwrap(), AppSource::PlumberDir(_)));
    }

    #[test]
    fn shiny_dirs_are_found_as_run_app_finds_them() {
        let d = dir_with(&["server.R"]);
        assert!(matches!(resolve(d.path(), "-f").unwrap(), AppSource::Shiny(_)), "no ui.R needed");
        let d = dir_with(&["App.R"]);
        assert!(matches!(resolve(d.path(), "-f").unwrap(), AppSource::Shiny(_)), "case does not matter");
        let d = dir_with(&["ui.R"]);
        assert!(matches!(resolve(d.path(), "-f"), Err(ConfigError::EmptyDir(_))), "ui.R alone is no app");
    }

    #[test]
    fn a_saved_router_is_served_from_its_rds_file() {
        let d = dir_with(&["router.rds"]);
        let app = resolve(&d.path().join("router.rds"), "-f").unwrap();
        assert_eq!(app.kind(), "plumber-rds");
        assert_eq!(app.default_name(), "router");
    }

    #[test]
    fn interactive_documents_are_found_in_folders_and_as_files() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("INDEX.rmd"), "---\nruntime: shiny_prerendered\n---\n").unwrap();
        let app = resolve(d.path(), "-f").unwrap();
        assert_eq!(app.kind(), "shiny-prerendered");
        assert!(app.is_shiny() && app.prerendered());
        assert_eq!(app.default_name(), d.path().file_name().unwrap().to_string_lossy(), "named by its folder");
        assert_eq!(app.workdir(), std::fs::canonicalize(d.path()).unwrap());
        std::fs::write(d.path().join("report.Rmd"), "---\nruntime: shiny\n---\n").unwrap();
        let app = resolve(&d.path().join("report.Rmd"), "-f").unwrap();
        assert_eq!((app.kind(), app.default_name().as_str(), app.prerendered()), ("shiny-rmd", "report", false));
        std::fs::write(d.path().join("app.R"), "").unwrap();
        assert_eq!(resolve(d.path(), "-f").unwrap().kind(), "shiny", "an app.R beside a document wins");
    }

    #[test]
    fn a_static_document_is_no_app() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("notes.Rmd"), "---\ntitle: notes\n---\n").unwrap();
        assert!(matches!(resolve(&d.path().join("notes.Rmd"), "-f"), Err(ConfigError::NotInteractive(_))));
        assert!(matches!(resolve(d.path(), "-f"), Err(ConfigError::NotInteractive(_))));
    }

    #[test]
    fn a_folder_with_an_index_html_and_no_r_is_static() {
        let d = dir_with(&["INDEX.HTML", "style.css"]);
        let app = resolve(d.path(), "-f").unwrap();
        assert_eq!((app.kind(), app.family(), app.is_shiny()), ("static", "static", false));
        assert_eq!(app.static_root(), Some(std::fs::canonicalize(d.path()).unwrap().as_path()));
        assert_eq!(app.default_name(), d.path().file_name().unwrap().to_string_lossy());
        // A document knitted to the page beside it is static; an interactive one, or R, wins.
        std::fs::write(d.path().join("index.Rmd"), "---\ntitle: notes\n---\n").unwrap();
        assert_eq!(resolve(d.path(), "-f").unwrap().kind(), "static");
        std::fs::write(d.path().join("index.Rmd"), "---\nruntime: shiny_prerendered\n---\n").unwrap();
        assert_eq!(resolve(d.path(), "-f").unwrap().kind(), "shiny-prerendered", "its render writes index.html");
        std::fs::remove_file(d.path().join("index.Rmd")).unwrap();
        std::fs::write(d.path().join("app.R"), "").unwrap();
        assert_eq!(resolve(d.path(), "-f").unwrap().kind(), "shiny");
        let d = dir_with(&["page.html"]);
        assert!(matches!(resolve(d.path(), "-f"), Err(ConfigError::EmptyDir(_))), "index.html it must be");
    }

    #[test]
    fn a_named_static_folder_needs_an_index_html_and_nothing_else() {
        let d = dir_with(&["index.html", "plumber.R"]);
        assert_eq!(resolve_static(d.path()).unwrap().kind(), "static", "named static, served as files");
        assert!(matches!(resolve_static(&d.path().join("plumber.R")), Err(ConfigError::StaticNotAFolder(_))));
        assert!(matches!(resolve_static(&d.path().join("nope")), Err(ConfigError::NoStaticFolder(_))));
        let d = dir_with(&["page.html"]);
        let e = resolve_static(d.path()).unwrap_err();
        assert!(matches!(e, ConfigError::NoIndex(_)) && e.to_string().contains("holds no index.html"), "{e}");
    }

    #[test]
    fn a_server_yml_folder_is_its_engines_app_before_anything_else() {
        let d = dir_with(&["plumber.R", "app.R", "index.html"]);
        std::fs::write(d.path().join("_SERVER.yml"), "engine: plumber2\n").unwrap();
        let app = resolve(d.path(), "-f").unwrap();
        assert_eq!((app.kind(), app.family(), app.is_shiny()), ("server-yml", "engine", false));
        assert!(!app.speaks_frames() && !app.preloadable());
        let abs = std::fs::canonicalize(d.path()).unwrap();
        assert_eq!(
            app,
            AppSource::ServerYml { dir: abs.clone(), settings: abs.join("_SERVER.yml"), engine: "plumber2".into() }
        );
        assert_eq!((app.path(), app.workdir()), (abs.as_path(), abs.clone()));
        assert_eq!(app.default_name(), d.path().file_name().unwrap().to_string_lossy());
        assert_eq!(resolve(&d.path().join("_SERVER.yml"), "-f").unwrap(), app, "-f on the file names its folder");
        std::fs::write(d.path().join("_SERVER.yml"), "engine: [\n").unwrap();
        assert!(matches!(resolve(d.path(), "-f"), Err(ConfigError::BadServerYml { .. })), "never another kind");
        std::fs::write(d.path().join("_SERVER.yml"), "routes: x\n").unwrap();
        assert!(matches!(resolve(d.path(), "-f"), Err(ConfigError::NoEngine { .. })));
    }

    #[test]
    fn a_quarto_document_with_server_shiny_is_found_as_a_file_and_in_a_folder() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("dash.qmd"), "---\nserver: shiny\n---\n").unwrap();
        let app = resolve(&d.path().join("dash.qmd"), "-f").unwrap();
        assert_eq!((app.kind(), app.family(), app.prerendered(), app.quarto()), ("quarto-shiny", "shiny", true, true));
        assert_eq!(resolve(d.path(), "-f").unwrap().kind(), "quarto-shiny");
        std::fs::write(d.path().join("dash.qmd"), "---\ntitle: x\n---\n").unwrap();
        assert!(matches!(resolve(d.path(), "-f"), Err(ConfigError::QuartoNotInteractive(_))));
        std::fs::write(d.path().join("index.html"), "").unwrap();
        assert_eq!(resolve(d.path(), "-f").unwrap().kind(), "static", "rendered beside its source");
    }

    #[test]
    fn names_come_from_the_folder_or_the_file() {
        let d = dir_with(&["plumber.R"]);
        let app = resolve(d.path(), "-f").unwrap();
        assert_eq!(app.default_name(), d.path().file_name().unwrap().to_string_lossy());
        let app = resolve(&d.path().join("plumber.R"), "-f").unwrap();
        assert_eq!(app.default_name(), "plumber");
    }
}
