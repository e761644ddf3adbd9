//! `_server.yml` apps: a folder whose `_server.yml` names the R package
//! that runs it (`engine: plumber2`), the convention plumber2, fiery-based
//! frameworks and Posit Connect share. valve reads only `engine`; the rest of
//! the file is the engine's, handed to its `launch_server(settings, host,
//! port)` whole.

use std::path::{Path, PathBuf};

use yaml_rust2::{Yaml, YamlLoader};

use super::error::ConfigError;

/// The name of the file, matched without regard to case.
pub const SERVER_YML: &str = "_server.yml";

/// Whether `path` is named `_server.yml` (in any case).
pub fn is_server_yml(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n.to_string_lossy().eq_ignore_ascii_case(SERVER_YML))
}

/// The `_server.yml` of `dir`, if it holds one (any case; the first in sorted order).
pub fn server_yml_of(dir: &Path) -> Option<PathBuf> {
    let mut hits: Vec<PathBuf> =
        std::fs::read_dir(dir).ok()?.flatten().map(|e| e.path()).filter(|p| is_server_yml(p) && p.is_file()).collect();
    hits.sort();
    hits.into_iter().next()
}

/// The engine a `_server.yml`'s text names, or why it names none.
pub fn read_engine(text: &str) -> Result<String, EngineProblem> {
    let docs = YamlLoader::load_from_str(text).map_err(|e| {
        EngineProblem::NotYaml(format!(
            "{} at line {}, column {}",
            e.info(),
            e.marker().line().max(1),
            e.marker().col() + 1
        ))
    })?;
    let Some(map @ Yaml::Hash(_)) = docs.first() else { return Err(EngineProblem::NoEngine(None)) };
    match &map["engine"] {
        Yaml::String(engine) if valid_package(engine) => Ok(engine.clone()),
        Yaml::BadValue => Err(EngineProblem::NoEngine(None)),
        other => Err(EngineProblem::NoEngine(Some(shown(other)))),
    }
}

/// What is wrong with a `_server.yml`.
#[derive(Debug, PartialEq, Eq)]
pub enum EngineProblem {
    /// It is not YAML: the parser's message, with line and column.
    NotYaml(String),
    /// It has no `engine` (`None`), or one that is not a package name.
    NoEngine(Option<String>),
}

/// An R package name: letters, digits and dots, starting with a letter, not ending with a dot.
fn valid_package(name: &str) -> bool {
    name.len() >= 2
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && !name.ends_with('.')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '.')
}

fn shown(value: &Yaml) -> String {
    match value {
        Yaml::String(s) => format!("{s:?}"),
        Yaml::Integer(i) => i.to_string(),
        Yaml::Real(r) => r.clone(),
        Yaml::Boolean(b) => b.to_string(),
        Yaml::Array(_) => "a list".into(),
        Yaml::Hash(_) => "a mapping".into(),
        Yaml::Null => "nothing".into(),
        _ => "something else".into(),
    }
}

/// Reads `path` (a `_server.yml`) and returns the engine it names.
pub fn engine_of(path: &Path) -> Result<String, ConfigError> {
    let shown = path.display().to_string();
    let bytes =
        std::fs::read(path).map_err(|e| ConfigError::Unreadable { path: shown.clone(), reason: e.to_string() })?;
    read_engine(&String::from_utf8_lossy(&bytes)).map_err(|problem| match problem {
        EngineProblem::NotYaml(reason) => ConfigError::BadServerYml { path: shown, reason },
        EngineProblem::NoEngine(found) => ConfigError::NoEngine {
            path: shown,
            found: found.map(|f| format!(" (it says `engine: {f}`, not an R package's name)")).unwrap_or_default(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_is_read_from_the_yaml() {
        assert_eq!(read_engine("engine: plumber2\nroutes:\n  - api.R\n").unwrap(), "plumber2");
        assert_eq!(read_engine("# a comment\nengine: 'fiery.app'\n").unwrap(), "fiery.app");
        assert_eq!(read_engine("constructor: x.R\nengine: \"plumber2\"\n").unwrap(), "plumber2", "first or not");
    }

    #[test]
    fn a_file_without_a_string_engine_says_so() {
        assert_eq!(read_engine("routes: [api.R]\n"), Err(EngineProblem::NoEngine(None)));
        assert_eq!(read_engine(""), Err(EngineProblem::NoEngine(None)), "an empty file");
        assert_eq!(read_engine("- a list\n"), Err(EngineProblem::NoEngine(None)));
        assert_eq!(read_engine("engine: 42\n"), Err(EngineProblem::NoEngine(Some("42".into()))));
        assert_eq!(read_engine("engine: [a, b]\n"), Err(EngineProblem::NoEngine(Some("a list".into()))));
        assert_eq!(read_engine("engine:\n"), Err(EngineProblem::NoEngine(Some("nothing".into()))));
        assert_eq!(
            read_engine("engine: not a package\n"),
            Err(EngineProblem::NoEngine(Some("\"not a package\"".into())))
        );
    }

    #[test]
    fn a_file_that_is_not_yaml_names_the_line() {
        let Err(EngineProblem::NotYaml(reason)) = read_engine("engine: plumber2\nroutes: [api.R\n") else {
            panic!("not YAML")
        };
        assert!(reason.contains("line"), "{reason}");
        let Err(EngineProblem::NotYaml(reason)) = read_engine("engine: plumber2\n  bad: indent\n") else {
            panic!("not YAML")
        };
        assert!(reason.contains("line 2"), "{reason}");
    }

    #[test]
    fn the_file_is_found_in_any_case() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(server_yml_of(d.path()), None);
        std::fs::write(d.path().join("_Server.YML"), "engine: x1\n").unwrap();
        assert_eq!(server_yml_of(d.path()), Some(d.path().join("_Server.YML")));
        let e = engine_of(&d.path().join("nope.yml")).unwrap_err();
        assert!(matches!(e, ConfigError::Unreadable { .. }), "{e}");
        std::fs::write(d.path().join("_Server.YML"), "port: 8000\n").unwrap();
        let e = engine_of(&d.path().join("_Server.YML")).unwrap_err().to_string();
        assert!(e.contains("_Server.YML") && e.contains("engine:"), "{e}");
    }
}
