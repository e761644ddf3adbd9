//! A config file of several apps, in TOML: server settings and per-app
//! defaults at the top level (the flags' names in snake_case), one `[[app]]`
//! table per app. Every problem found is reported with the file, line and
//! column, all of them at once, so `valve --check` lists everything to fix.
//!
//! Precedence for an app's setting: its own `[[app]]` key, then a flag or
//! `VALVE_*` variable given explicitly, then the file's top-level key, then
//! the flag's default. Server settings: flag, then file, then default.
//!
//! Here the file is read and resolved as a whole; beside it `server` (the top
//! level's server settings), `app` (one `[[app]]` table), `values` (a key's
//! value of one type), `access`, `publish` and `packages` (apps' packages:
//! the cache, the builds, `[repositories]`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use toml::Spanned;

use super::error::ConfigError;
use super::flags::Args;
use super::keys::{edit_distance, ACCESS_KEYS, APP_KEYS, APP_ONLY, SERVER_KEYS};
use super::model::{AppConfig, Config};
use super::problems::{line_col, Problem, Problems};
use super::publish::Candidate;
use super::settle::{settle, PublishedCheck, Unfit};
use super::uid_store::Store;

type Val = Spanned<toml::Value>;

type Table = BTreeMap<String, Val>;

#[derive(serde::Deserialize)]
struct Apps {
    #[serde(default)]
    app: Vec<Spanned<Table>>,
}

/// Reads, checks and resolves a config file against the flags.
pub fn load(path: &Path, args: &Args) -> Result<Config, Problems> {
    load_with(path, args, None)
}

/// As `load`, with one published app at `candidate`'s version.
pub(super) fn load_with(path: &Path, args: &Args, candidate: Option<&Candidate>) -> Result<Config, Problems> {
    let fail =
        |line, col, message: String| Problems { file: path.to_path_buf(), list: vec![Problem { line, col, message }] };
    let text = std::fs::read_to_string(path).map_err(|e| {
        fail(0, 0, format!("cannot read the config file: {e} (check the path given to --config / VALVE_CONFIG)"))
    })?;
    let base = std::fs::canonicalize(path).ok().and_then(|p| p.parent().map(Path::to_path_buf)).unwrap_or_default();
    let parse_error = |e: toml::de::Error| {
        let (line, col) = e.span().map(|s| line_col(&text, s.start)).unwrap_or((0, 0));
        fail(line, col, e.message().trim().to_string())
    };
    let top: Table = toml::from_str(&text).map_err(parse_error)?;
    let apps: Apps = toml::from_str(&text).map_err(parse_error)?;
    let mut cx = Cx { text: &text, args, top: &top, problems: Vec::new(), candidate, base: base.clone() };
    let config = cx.resolve(&apps.app, &base, path);
    match (config, cx.problems.is_empty()) {
        (Some(c), true) => Ok(c),
        _ => {
            let mut list = cx.problems;
            list.sort_by_key(|p| (p.line, p.col));
            list.dedup();
            Err(Problems { file: path.to_path_buf(), list })
        }
    }
}

/// The resolution of one file: what it says, what the flags say, what is wrong.
struct Cx<'a> {
    text: &'a str,
    args: &'a Args,
    top: &'a Table,
    problems: Vec<Problem>,
    /// A deployment's version to load for one published app.
    candidate: Option<&'a Candidate>,
    /// The config file's folder: relative paths start there.
    base: PathBuf,
}

impl<'a> Cx<'a> {
    fn at(&mut self, span: std::ops::Range<usize>, message: String) {
        let (line, col) = line_col(self.text, span.start);
        self.problems.push(Problem { line, col, message });
    }

    /// Where `key` is written on the line of its value (else the value).
    fn key_span(&self, key: &str, value: std::ops::Range<usize>) -> std::ops::Range<usize> {
        let line_start = self.text[..value.start.min(self.text.len())].rfind('\n').map(|i| i + 1).unwrap_or(0);
        match self.text[line_start..value.start.min(self.text.len())].find(key) {
            Some(i) => line_start + i..line_start + i + key.len(),
            None => value,
        }
    }

    fn nowhere(&mut self, message: String) {
        self.problems.push(Problem { line: 0, col: 0, message });
    }

    /// The file's value for `key` when it wins over the flag: the app's own,
    /// else (unless the flag was given) the top level's.
    fn pick<'v>(&self, key: &str, app: Option<&'v Table>) -> Option<&'v Val>
    where
        'a: 'v,
    {
        if let Some(v) = app.and_then(|t| t.get(key)) {
            return Some(v);
        }
        if self.args.explicit.contains(key) {
            return None;
        }
        self.top.get(key)
    }

    fn unknown_keys(&mut self, table: &Table, allowed: &[&[&str]], place: &str) {
        for (key, v) in table {
            if allowed.iter().any(|set| set.contains(&key.as_str())) {
                continue;
            }
            let mut known: Vec<&str> = allowed.iter().flat_map(|s| s.iter().copied()).collect();
            known.sort();
            let hint = known
                .iter()
                .map(|k| (edit_distance(k, key), *k))
                .filter(|(d, _)| *d <= 2)
                .min()
                .map(|(_, k)| format!(" (did you mean `{k}`?)"))
                .unwrap_or_default();
            let message = format!("unknown key `{key}` {place}{hint}; known keys: {}", known.join(", "));
            self.at(self.key_span(key, v.span()), message);
        }
    }

    fn resolve(&mut self, apps: &[Spanned<Table>], base: &Path, file: &Path) -> Option<Config> {
        let top = self.top;
        self.unknown_keys(top, &[SERVER_KEYS, APP_KEYS, ACCESS_KEYS, &["app"]], "at the top level");
        if let Some(v) = top.get("app") {
            if !matches!(v.get_ref(), toml::Value::Array(_)) {
                self.at(v.span(), "`app` must be a list of tables: write each app as an [[app]] table".into());
            }
        }
        if apps.is_empty() {
            self.nowhere("no apps: add an [[app]] table with at least `file` (and `path` for its URL prefix)".into());
        }
        let mut resolved: Vec<(AppConfig, std::ops::Range<usize>)> = Vec::new();
        for (i, app) in apps.iter().enumerate() {
            self.unknown_keys(app.get_ref(), &[APP_KEYS, APP_ONLY, ACCESS_KEYS], "in [[app]]");
            if let Some(a) = self.app(i, app, base, apps.len()) {
                resolved.push((a, app.span()));
            }
        }
        // Names and mount points are each used once.
        for (i, (a, span)) in resolved.iter().enumerate() {
            if let Some((_, first)) = resolved[..i].iter().find(|(b, _)| b.name == a.name) {
                let (line, _) = line_col(self.text, first.start);
                let message = format!(
                    "app name `{}` is already used by the app at line {line}: give each app its own `name`",
                    a.name
                );
                self.at(span.clone(), message);
            }
            if let Some((b, first)) =
                resolved[..i].iter().find(|(b, _)| b.prefix == a.prefix && b.hostname == a.hostname)
            {
                let (line, _) = line_col(self.text, first.start);
                let message = format!(
                    "path `{}` is already served by app `{}` (line {line}): give each app its own `path`{}",
                    a.prefix,
                    b.name,
                    if a.hostname.is_some() { " or `hostname`" } else { "" }
                );
                self.at(span.clone(), message);
            }
        }
        let spans: Vec<std::ops::Range<usize>> = resolved.iter().map(|(_, s)| s.clone()).collect();
        let mut apps: Vec<AppConfig> = resolved.into_iter().map(|(a, _)| a).collect();
        let publish = self.publishing();
        if let Some(Some(p)) = &publish {
            self.published(p, &mut apps, base);
        }
        let private = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_path_buf());
        let server = self.server(&apps, base, private, publish?)?;
        let mut said = Default::default();
        let mut builders = Vec::new();
        if let Some(range) = self.uid_range() {
            let publish_dir = server.publish.as_ref().map(|p| p.dir.as_path());
            let store = Store::of_site(&server.state_dir, publish_dir, !self.args.check);
            let published = PublishedCheck {
                dir: server.publish.as_ref().map(|p| p.dir.as_path()),
                checked: self.candidate.filter(|c| c.checked).map(|c| c.app.as_str()),
            };
            let settled = settle(&mut apps, &self.args.kernel, range, &store, published, server.packages.builds);
            said = settled.said;
            builders = settled.builders;
            for (i, why) in settled.unfit {
                // The app's own run_as, else the top level's; a folder problem at the app's table
                // (a published app has none: said without a place).
                match why {
                    Unfit::RunAs(m) => {
                        let place = i
                            .and_then(|i| spans.get(i))
                            .and_then(|span| app_tables_key(self.text, span, "run_as"))
                            .or_else(|| self.top.get("run_as").map(|v| v.span()));
                        match place {
                            Some(span) => self.at(span, m),
                            None => self.nowhere(m),
                        }
                    }
                    Unfit::Folder(m) | Unfit::Uid(m) => match i.and_then(|i| spans.get(i)) {
                        Some(span) => self.at(span.clone(), m),
                        None => self.nowhere(m),
                    },
                }
            }
        }
        let n_min: usize = apps.iter().map(|a| a.n_min).sum();
        if n_min > server.max_workers {
            let message = format!(
                "the apps' n_min add up to {n_min}, above max_workers = {}: raise max_workers or lower some n_min",
                server.max_workers
            );
            match top.get("max_workers") {
                Some(v) => self.at(v.span(), message),
                None => self.nowhere(message),
            }
        }
        let mut server = server;
        server.builder_uids = builders;
        Some(Config { server, apps, notes: Vec::new(), uids: said })
    }

    /// A flag's value, or its error noted (it has no place in the file).
    fn flag_result<T>(&mut self, r: Result<T, ConfigError>) -> Option<T> {
        r.map_err(|e| self.nowhere(e.to_string())).ok()
    }
}

/// Where `key` is written inside an app's table (the table's text span), if it is.
fn app_tables_key(text: &str, table: &std::ops::Range<usize>, key: &str) -> Option<std::ops::Range<usize>> {
    let body = text.get(table.clone())?;
    let mut at = 0;
    for line in body.split_inclusive('\n') {
        let trimmed = line.trim_start();
        if trimmed.starts_with(key) && trimmed[key.len()..].trim_start().starts_with('=') {
            let start = table.start + at + (line.len() - trimmed.len());
            return Some(start..start + key.len());
        }
        at += line.len();
    }
    None
}

mod access;
mod app;
mod packages;
mod publish;
mod server;
mod tls;
mod values;

#[cfg(test)]
mod tests;
