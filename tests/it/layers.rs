//! The layering of src/ as a test: no import cycle between files or between
//! top-level modules, and every top-level module names only those below it.
//!
//! It reads src/**/*.rs as text, with comments and string literals stripped,
//! so it needs neither R nor a build of the library. It follows `mod`
//! declarations from lib.rs (main.rs is a crate of its own that imports
//! `valve::`), skips whatever is compiled only under `#[cfg(test)]`, and
//! resolves every path in `use` declarations and in code (`crate::`, `self::`,
//! `super::`, names brought in by `use`, globs) to the file that defines the
//! item, following `pub use` re-exports to the file they come from. A path to
//! a module alone is no edge; a path to an item is an edge to its file. A
//! `pub use` passes a name through (a mod.rs facade): it is an edge only where
//! its own file uses the name.
//!
//! `VALVE_LAYERS_SRC=DIR cargo test --test it -- layers` checks another tree;
//! `VALVE_LAYERS_EDGES=1` prints every edge it found.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;

/// The top-level modules of src/, from the bottom up. A module may name
/// modules on lower lines only; modules on one line are standalone and name
/// none of each other. `lib` is lib.rs, which composes everything.
const LAYERS: &[&[&str]] = &[
    &["tls"],
    &["config"],
    &["log", "shutdown", "healthcheck", "mac", "client"],
    &["worker"],
    &["applog", "usage", "restore"],
    &["metrics"],
    &["app", "trace"],
    &["http"],
    &["reload"],
    &["admin"],
    &["https"],
    &["lib"],
];

const CYCLE_HINT: &str = "break each cycle: move what both files share into a file below both, \
or hand the lower file a small handle (a channel, a trait the higher file implements) instead of \
naming the higher one (STYLE.md, \"Layers\")";

const UPWARD_HINT: &str = "a module names one at its level or above: move the item it needs down \
(a type two layers share lives in the lower one), or invert the dependency with a trait, a callback \
or a channel; if the order itself should change, change LAYERS in tests/it/layers.rs and ARCHITECTURE.md";

#[test]
fn layers_of_src_have_no_import_cycle_and_point_down() {
    let src = std::env::var_os("VALVE_LAYERS_SRC")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let sources = read_tree(&src);
    assert!(
        sources.contains_key("lib.rs"),
        "no lib.rs under {} (VALVE_LAYERS_SRC names the src/ directory)",
        src.display()
    );
    let graph = Graph::build(&sources);
    let findings = check(&graph, LAYERS);
    eprintln!(
        "layers: {} files, {} edges between files, under {}",
        graph.files.len(),
        graph.edges.len(),
        src.display()
    );
    if std::env::var_os("VALVE_LAYERS_EDGES").is_some() {
        for ((a, b), names) in &graph.edges {
            eprintln!("  {a} -> {b} ({})", names.iter().cloned().collect::<Vec<_>>().join(", "));
        }
    }
    assert!(findings.is_empty(), "the layering of {} is broken:\n{}", src.display(), findings.render(&graph, LAYERS));
}

/// Every `.rs` file under `dir`, by its path relative to `dir` with `/` between parts.
fn read_tree(dir: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(root, &path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(root).expect("under the root");
                let rel = rel.iter().map(|p| p.to_string_lossy()).collect::<Vec<_>>().join("/");
                let text =
                    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
                out.insert(rel, text);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

// ---------------------------------------------------------------------------
// Tokens: identifiers, `::` and punctuation; comments dropped, literals opaque.

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    Sep,
    Punct(char),
    /// A string literal's raw contents (read only by `#[path = "..."]`); empty
    /// for numbers, characters and lifetimes.
    Lit(String),
}

fn lex(src: &str) -> Vec<Tok> {
    let c: Vec<char> = src.chars().collect();
    let at = |k: usize| c.get(k).copied().unwrap_or('\0');
    let ident_start = |ch: char| ch == '_' || ch.is_alphabetic();
    let ident_char = |ch: char| ch == '_' || ch.is_alphanumeric();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            // Block comments nest.
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if ch == '"' {
            let (end, text) = quoted(&c, i);
            out.push(Tok::Lit(text));
            i = end;
        } else if ch == '\'' {
            i = char_or_lifetime(&c, i);
            out.push(Tok::Lit(String::new()));
        } else if matches!(ch, 'r' | 'b' | 'c') && prefixed_literal(&c, i).is_some() {
            let (end, tok) = prefixed_literal(&c, i).expect("checked");
            out.push(tok);
            i = end;
        } else if ident_start(ch) {
            let start = i;
            while i < c.len() && ident_char(c[i]) {
                i += 1;
            }
            out.push(Tok::Ident(c[start..i].iter().collect()));
        } else if ch.is_ascii_digit() {
            while i < c.len() && ident_char(c[i]) {
                i += 1;
                // A fraction, not a range (`1..2`) nor a method (`1.max(2)`).
                if at(i) == '.' && at(i + 1).is_ascii_digit() {
                    i += 1;
                }
            }
            out.push(Tok::Lit(String::new()));
        } else if ch == ':' && at(i + 1) == ':' {
            out.push(Tok::Sep);
            i += 2;
        } else {
            out.push(Tok::Punct(ch));
            i += 1;
        }
    }
    out
}

/// `c[i]` opens a string; returns the index past its closing quote and its contents.
fn quoted(c: &[char], i: usize) -> (usize, String) {
    let mut k = i + 1;
    while k < c.len() && c[k] != '"' {
        k += if c[k] == '\\' { 2 } else { 1 };
    }
    let end = k.min(c.len());
    (end + 1, c[i + 1..end].iter().collect())
}

/// `c[i]` is a quote: a character literal (`'a'`, `'\''`, `'\u{1F600}'`) or a
/// lifetime (`'a`, `'static`); returns the index past it.
fn char_or_lifetime(c: &[char], i: usize) -> usize {
    let at = |k: usize| c.get(k).copied().unwrap_or('\0');
    if at(i + 1) == '\\' {
        let mut k = i + 3;
        while k < c.len() && c[k] != '\'' {
            k += 1;
        }
        k + 1
    } else if at(i + 2) == '\'' {
        i + 3
    } else {
        let mut k = i + 1;
        while k < c.len() && (c[k] == '_' || c[k].is_alphanumeric()) {
            k += 1;
        }
        k
    }
}

/// A literal or raw identifier starting with a letter at `c[i]`: `r"..."`,
/// `r#"..."#`, `b"..."`, `br#"..."#`, `c"..."`, `b'x'`, `r#type`.
fn prefixed_literal(c: &[char], i: usize) -> Option<(usize, Tok)> {
    let at = |k: usize| c.get(k).copied().unwrap_or('\0');
    let mut j = i + 1;
    if matches!(c[i], 'b' | 'c') && at(j) == 'r' {
        j += 1;
    }
    let raw = c[i] == 'r' || j == i + 2;
    if !raw {
        return match at(j) {
            '"' => {
                let (end, text) = quoted(c, j);
                Some((end, Tok::Lit(text)))
            }
            '\'' if c[i] == 'b' => Some((char_or_lifetime(c, j), Tok::Lit(String::new()))),
            _ => None,
        };
    }
    let mut hashes = 0;
    while at(j + hashes) == '#' {
        hashes += 1;
    }
    let open = j + hashes;
    if at(open) == '"' {
        let mut k = open + 1;
        while k < c.len() && !(c[k] == '"' && (1..=hashes).all(|h| at(k + h) == '#')) {
            k += 1;
        }
        let end = k.min(c.len());
        return Some(((end + 1 + hashes).min(c.len()), Tok::Lit(c[open + 1..end].iter().collect())));
    }
    if c[i] == 'r' && hashes == 1 && (at(open) == '_' || at(open).is_alphabetic()) {
        let mut k = open;
        while k < c.len() && (c[k] == '_' || c[k].is_alphanumeric()) {
            k += 1;
        }
        return Some((k, Tok::Ident(c[open..k].iter().collect())));
    }
    None
}

fn ident(t: &[Tok], i: usize) -> Option<&str> {
    match t.get(i) {
        Some(Tok::Ident(s)) => Some(s),
        _ => None,
    }
}

fn punct(t: &[Tok], i: usize, p: char) -> bool {
    t.get(i) == Some(&Tok::Punct(p))
}

fn sep(t: &[Tok], i: usize) -> bool {
    t.get(i) == Some(&Tok::Sep)
}

fn opens(tok: &Tok) -> bool {
    matches!(tok, Tok::Punct('(' | '[' | '{'))
}

fn closes(tok: &Tok) -> bool {
    matches!(tok, Tok::Punct(')' | ']' | '}'))
}

/// `t[i]` opens a group; returns the index past the bracket that closes it.
fn group_end(t: &[Tok], i: usize) -> usize {
    let mut depth = 0;
    for (k, tok) in t.iter().enumerate().skip(i) {
        if opens(tok) {
            depth += 1;
        } else if closes(tok) {
            depth -= 1;
            if depth == 0 {
                return k + 1;
            }
        }
    }
    t.len()
}

/// The end of a statement or of an item without a body (`use`, `const`,
/// `type`, `let`): past the `;` outside any bracket, or at the bracket that
/// closes the enclosing group.
fn statement_end(t: &[Tok], i: usize, hi: usize) -> usize {
    let mut k = i;
    while k < hi {
        if opens(&t[k]) {
            k = group_end(t, k);
            continue;
        }
        if closes(&t[k]) {
            return k;
        }
        if punct(t, k, ';') {
            return k + 1;
        }
        k += 1;
    }
    hi
}

/// The end of an item that may have a body (`fn`, `struct`, `impl`, `mod`):
/// past its first `{...}` outside parentheses, or past its `;`.
fn item_end(t: &[Tok], i: usize, hi: usize) -> usize {
    let mut k = i;
    while k < hi {
        match &t[k] {
            Tok::Punct('{') => return group_end(t, k),
            Tok::Punct('(' | '[') => k = group_end(t, k),
            Tok::Punct(';') => return k + 1,
            tok if closes(tok) => return k,
            _ => k += 1,
        }
    }
    hi
}

/// The end of whatever an attribute at `i` is attached to: an item, a
/// statement, a field or a match arm.
fn attached_end(t: &[Tok], mut i: usize, hi: usize) -> usize {
    while punct(t, i, '#') && punct(t, i + 1, '[') {
        i = group_end(t, i + 1);
    }
    let mut k = i;
    if ident(t, k) == Some("pub") {
        k += 1;
        if punct(t, k, '(') {
            k = group_end(t, k);
        }
    }
    while matches!(ident(t, k), Some("async" | "unsafe" | "const" | "extern" | "default")) {
        k += 1;
    }
    match ident(t, k) {
        Some("fn" | "mod" | "impl" | "struct" | "enum" | "union" | "trait") => item_end(t, i, hi),
        _ if punct(t, i, '{') => group_end(t, i),
        _ => {
            // A field or a match arm ends at its comma, a statement at its `;`.
            let mut k = i;
            while k < hi {
                if opens(&t[k]) {
                    k = group_end(t, k);
                    continue;
                }
                if closes(&t[k]) {
                    return k;
                }
                if punct(t, k, ';') || punct(t, k, ',') {
                    return k + 1;
                }
                k += 1;
            }
            hi
        }
    }
}

/// A macro call at item level (`thread_local! { .. }`, `a::b!(..);`): the
/// index past it, or `None` if `t[i]` starts none.
fn macro_call_end(t: &[Tok], i: usize, hi: usize) -> Option<usize> {
    let mut k = i;
    while ident(t, k).is_some() && sep(t, k + 1) {
        k += 2;
    }
    ident(t, k)?;
    if !punct(t, k + 1, '!') || !t.get(k + 2).is_some_and(opens) {
        return None;
    }
    let end = group_end(t, k + 2).min(hi);
    Some(if punct(t, end, ';') { end + 1 } else { end })
}

/// Whether an attribute's tokens (inside `#[...]`) compile its item only in tests.
fn cfg_test(attr: &[Tok]) -> bool {
    ident(attr, 0) == Some("cfg")
        && attr.iter().any(|t| *t == Tok::Ident("test".into()))
        && !attr.iter().any(|t| *t == Tok::Ident("not".into()))
}

/// One name or glob a `use` declaration brings in: the path as written.
#[derive(Debug, Clone, PartialEq)]
struct UseLeaf {
    path: Vec<String>,
    /// The name it is bound to (`None` for globs and `as _`).
    bind: Option<String>,
    glob: bool,
}

/// Parses a use tree (`a::b::{c, d::e as f, g::*, self}`) from `t[*k]` up to `end`.
fn use_tree(t: &[Tok], k: &mut usize, end: usize, mut path: Vec<String>, out: &mut Vec<UseLeaf>) {
    if sep(t, *k) {
        if path.is_empty() {
            // `::name`: an external crate.
            path.push("::".into());
        }
        *k += 1;
    }
    while *k < end {
        match &t[*k] {
            Tok::Ident(s) => {
                path.push(s.clone());
                *k += 1;
                if sep(t, *k) {
                    *k += 1;
                    continue;
                }
                let mut bind = Some(s.clone());
                if ident(t, *k) == Some("as") {
                    bind = ident(t, *k + 1).filter(|n| *n != "_").map(str::to_string);
                    *k += 2;
                }
                if path.last().is_some_and(|s| s == "self") {
                    path.pop();
                    if bind.as_deref() == Some("self") {
                        bind = path.last().cloned();
                    }
                }
                out.push(UseLeaf { path, bind, glob: false });
                return;
            }
            Tok::Punct('*') => {
                *k += 1;
                out.push(UseLeaf { path, bind: None, glob: true });
                return;
            }
            Tok::Punct('{') => {
                *k += 1;
                while *k < end {
                    if punct(t, *k, '}') {
                        *k += 1;
                        return;
                    }
                    if punct(t, *k, ',') {
                        *k += 1;
                        continue;
                    }
                    let before = *k;
                    use_tree(t, k, end, path.clone(), out);
                    if *k == before {
                        *k += 1;
                    }
                }
                return;
            }
            _ => {
                *k += 1;
                return;
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The module tree, and the edges between files.

#[derive(Debug, Default)]
struct Module {
    file: String,
    /// Where `mod x;` in this module looks for x.rs and x/mod.rs.
    dir: String,
    parent: Option<usize>,
    children: BTreeMap<String, usize>,
    /// Items defined here: types, functions, constants, statics, macros.
    items: BTreeSet<String>,
    /// Names brought in by `use` at module level (private or `pub`), to the path as written.
    imports: BTreeMap<String, Vec<String>>,
    /// Names brought in by `use` inside bodies: consulted after the module's own.
    local_imports: BTreeMap<String, Vec<String>>,
    globs: Vec<Vec<String>>,
    /// Names of `imports` that come from `pub use`.
    reexports: BTreeSet<String>,
}

/// What a path names.
#[derive(Debug, Clone, PartialEq)]
enum Res {
    Module(usize),
    /// An item, by the module that defines it and its name there.
    Item(usize, String),
    /// Nothing in this crate: std, a dependency, a local name.
    Outside,
}

/// One file being read: its tokens, and which module owns each (`None`: test-only code).
struct FileCx {
    file: String,
    toks: Vec<Tok>,
    owner: Vec<Option<usize>>,
    /// Tokens of `use` declarations, whose paths are resolved as use trees.
    in_use: Vec<bool>,
}

/// Where a `use` declaration stands.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Use {
    /// At module level: its names are the module's, and using them is an edge.
    Module,
    /// `pub use` at module level: a name passed through for others, an edge
    /// only where this file itself uses it.
    Reexport,
    /// Inside a body.
    Local,
}

struct UseSite {
    module: usize,
    file: String,
    leaf: UseLeaf,
}

/// The files reached from lib.rs and the edges between them.
struct Graph {
    modules: Vec<Module>,
    files: BTreeSet<String>,
    /// (from, to) -> the names `from` uses from `to`.
    edges: BTreeMap<(String, String), BTreeSet<String>>,
    /// What the checker itself could not place: a missing file, a file no `mod` reaches.
    problems: Vec<String>,
}

struct Builder<'s> {
    sources: &'s BTreeMap<String, String>,
    modules: Vec<Module>,
    cxs: Vec<FileCx>,
    uses: Vec<UseSite>,
    /// Files, and directories (ending in `/`), declared only under `#[cfg(test)]`.
    test_only: Vec<String>,
    problems: Vec<String>,
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

fn parent_dir(file: &str) -> &str {
    file.rsplit_once('/').map_or("", |(d, _)| d)
}

/// Where the submodules of the module in `file` live.
fn dir_of_module_file(file: &str) -> String {
    if file == "lib.rs" || file == "mod.rs" || file.ends_with("/mod.rs") {
        parent_dir(file).to_string()
    } else {
        file.trim_end_matches(".rs").to_string()
    }
}

const KEYWORDS: &[&str] = &[
    "as", "async", "await", "break", "const", "continue", "crate", "dyn", "else", "enum", "extern", "false", "fn",
    "for", "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut", "pub", "ref", "return", "self", "Self",
    "static", "struct", "super", "trait", "true", "type", "unsafe", "use", "where", "while",
];

impl Builder<'_> {
    fn new_module(&mut self, parent: Option<usize>, name: &str, file: &str, dir: String) -> usize {
        let id = self.modules.len();
        self.modules.push(Module { file: file.to_string(), dir, parent, ..Module::default() });
        if let Some(p) = parent {
            self.modules[p].children.insert(name.to_string(), id);
        }
        id
    }

    fn load(&mut self, file: &str, module: usize) {
        let toks = lex(&self.sources[file]);
        let n = toks.len();
        let mut cx = FileCx { file: file.to_string(), toks, owner: vec![Some(module); n], in_use: vec![false; n] };
        self.walk_items(&mut cx, 0, n, module);
        self.cxs.push(cx);
    }

    /// `mod name;` in `module`, declared in `file`.
    fn load_child(&mut self, module: usize, name: &str, path_attr: Option<String>, file: &str) {
        let dir = self.modules[module].dir.clone();
        let candidates = match path_attr {
            Some(p) => vec![join(parent_dir(file), &p)],
            None => vec![join(&dir, &format!("{name}.rs")), join(&dir, &format!("{name}/mod.rs"))],
        };
        match candidates.iter().find(|c| self.sources.contains_key(c.as_str())) {
            Some(found) => {
                let found = found.clone();
                let child = self.new_module(Some(module), name, &found, dir_of_module_file(&found));
                self.load(&found, child);
            }
            None => self.problems.push(format!("{file}: `mod {name};` but none of {} exists", candidates.join(", "))),
        }
    }

    /// The items of `module` in `cx.toks[lo..hi]`.
    fn walk_items(&mut self, cx: &mut FileCx, lo: usize, hi: usize, module: usize) {
        let mut i = lo;
        while i < hi {
            let start = i;
            let (mut test, mut export, mut path_attr) = (false, false, None);
            // Attributes. An inner `#![cfg(test)]` makes the whole module test-only.
            while punct(&cx.toks, i, '#') {
                let inner = punct(&cx.toks, i + 1, '!');
                let open = if inner { i + 2 } else { i + 1 };
                if !punct(&cx.toks, open, '[') {
                    break;
                }
                let end = group_end(&cx.toks, open);
                let body = &cx.toks[open + 1..end.saturating_sub(1).max(open + 1)];
                if inner && cfg_test(body) {
                    cx.owner[lo..hi].iter_mut().for_each(|o| *o = None);
                    return;
                }
                test |= cfg_test(body);
                export |= ident(body, 0) == Some("macro_export");
                if ident(body, 0) == Some("path") && punct(body, 1, '=') {
                    if let Some(Tok::Lit(p)) = body.get(2) {
                        path_attr = Some(p.clone());
                    }
                }
                i = end;
            }
            let public = ident(&cx.toks, i) == Some("pub");
            if public {
                i += 1;
                if punct(&cx.toks, i, '(') {
                    i = group_end(&cx.toks, i);
                }
            }
            loop {
                let next = ident(&cx.toks, i + 1);
                match ident(&cx.toks, i) {
                    Some("async" | "unsafe" | "default") => i += 1,
                    Some("const") if matches!(next, Some("fn" | "unsafe" | "async" | "extern")) => i += 1,
                    Some("extern") if next != Some("crate") => {
                        i += 1;
                        if matches!(cx.toks.get(i), Some(Tok::Lit(_))) {
                            i += 1;
                        }
                    }
                    _ => break,
                }
            }
            let t = &cx.toks;
            let name = ident(t, i + 1).map(str::to_string);
            let end = match ident(t, i) {
                Some("use") => {
                    let end = statement_end(t, i, hi);
                    if !test {
                        self.use_declaration(cx, i, end, module, if public { Use::Reexport } else { Use::Module });
                    }
                    end
                }
                Some("mod") if punct(t, i + 2, ';') => {
                    let name = name.unwrap_or_default();
                    if test {
                        let dir = self.modules[module].dir.clone();
                        self.test_only.push(join(&dir, &format!("{name}.rs")));
                        self.test_only.push(join(&dir, &format!("{name}/")));
                    } else {
                        let file = cx.file.clone();
                        self.load_child(module, &name, path_attr, &file);
                    }
                    i + 3
                }
                Some("mod") if punct(t, i + 2, '{') => {
                    let end = group_end(t, i + 2);
                    if !test {
                        let name = name.unwrap_or_default();
                        let dir = join(&self.modules[module].dir, &name);
                        let file = cx.file.clone();
                        let child = self.new_module(Some(module), &name, &file, dir);
                        cx.owner[i..end].iter_mut().for_each(|o| *o = Some(child));
                        self.walk_items(cx, i + 3, end - 1, child);
                    }
                    end
                }
                Some("fn" | "struct" | "enum" | "union" | "trait" | "impl") => {
                    let end = item_end(t, i, hi);
                    if ident(t, i) != Some("impl") && !test {
                        self.modules[module].items.extend(name);
                    }
                    if !test {
                        self.walk_body(cx, i, end, module);
                    }
                    end
                }
                Some("type" | "const" | "static") => {
                    let name = if name.as_deref() == Some("mut") { ident(t, i + 2).map(str::to_string) } else { name };
                    if !test {
                        self.modules[module].items.extend(name);
                    }
                    let end = statement_end(t, i, hi);
                    if !test {
                        self.walk_body(cx, i, end, module);
                    }
                    end
                }
                Some("macro_rules") if punct(t, i + 1, '!') => {
                    // An exported macro lives at the crate's root, wherever it is written.
                    let home = if export { 0 } else { module };
                    if let Some(name) = ident(t, i + 2) {
                        if home == 0 && module != 0 {
                            // Named `crate::name!` it is defined in this file, not lib.rs.
                            self.modules[module].items.insert(name.to_string());
                            let path = self.module_path(module, name);
                            self.modules[0].imports.insert(name.to_string(), path);
                        } else {
                            self.modules[home].items.insert(name.to_string());
                        }
                    }
                    let end = group_end(t, i + 3);
                    if punct(t, end, ';') {
                        end + 1
                    } else {
                        end
                    }
                }
                Some("extern") => statement_end(t, i, hi),
                Some(_) if macro_call_end(t, i, hi).is_some() => {
                    let end = macro_call_end(t, i, hi).unwrap_or(hi);
                    if !test {
                        self.walk_body(cx, i, end, module);
                    }
                    end
                }
                _ => {
                    // Something this reader does not know: step over it.
                    let end = if punct(t, i, '{') { group_end(t, i) } else { attached_end(t, start, hi) };
                    let end = end.max(i + 1);
                    if !test {
                        self.walk_body(cx, i, end, module);
                    }
                    end
                }
            };
            let end = end.max(i + 1);
            if test {
                cx.owner[start..end.min(hi)].iter_mut().for_each(|o| *o = None);
            }
            i = end;
        }
    }

    /// `crate::a::b::name` for an item of `module`.
    fn module_path(&self, module: usize, name: &str) -> Vec<String> {
        let mut names = vec![name.to_string()];
        let mut m = module;
        while let Some(p) = self.modules[m].parent {
            let (n, _) = self.modules[p].children.iter().find(|(_, c)| **c == m).expect("a child of its parent");
            names.push(n.clone());
            m = p;
        }
        names.push("crate".into());
        names.reverse();
        names
    }

    /// Inside a body (a function, an impl, a constant): `use` declarations,
    /// and code attributed `#[cfg(test)]`, which is skipped.
    fn walk_body(&mut self, cx: &mut FileCx, lo: usize, hi: usize, module: usize) {
        let mut i = lo;
        while i < hi {
            if punct(&cx.toks, i, '#') && punct(&cx.toks, i + 1, '[') {
                let end = group_end(&cx.toks, i + 1);
                if cfg_test(&cx.toks[i + 2..end.saturating_sub(1).max(i + 2)]) {
                    let end = attached_end(&cx.toks, i, hi).max(end);
                    cx.owner[i..end].iter_mut().for_each(|o| *o = None);
                    i = end;
                } else {
                    i = end;
                }
                continue;
            }
            if ident(&cx.toks, i) == Some("use") && !punct(&cx.toks, i.wrapping_sub(1), '.') {
                let end = statement_end(&cx.toks, i, hi);
                self.use_declaration(cx, i, end, module, Use::Local);
                i = end;
                continue;
            }
            i += 1;
        }
    }

    /// `use ...;` at `cx.toks[at..end]`.
    fn use_declaration(&mut self, cx: &mut FileCx, at: usize, end: usize, module: usize, kind: Use) {
        cx.in_use[at..end].iter_mut().for_each(|u| *u = true);
        let mut leaves = Vec::new();
        let mut k = at + 1;
        use_tree(&cx.toks, &mut k, end, Vec::new(), &mut leaves);
        for leaf in leaves {
            if leaf.path.first().is_some_and(|s| s == "::") {
                continue;
            }
            let m = &mut self.modules[module];
            if leaf.glob {
                m.globs.push(leaf.path.clone());
            } else if let Some(bind) = &leaf.bind {
                let imports = if kind == Use::Local { &mut m.local_imports } else { &mut m.imports };
                imports.entry(bind.clone()).or_insert_with(|| leaf.path.clone());
                if kind == Use::Reexport {
                    m.reexports.insert(bind.clone());
                }
            }
            if kind != Use::Reexport {
                self.uses.push(UseSite { module, file: cx.file.clone(), leaf });
            }
        }
    }
}

impl Graph {
    fn build(sources: &BTreeMap<String, String>) -> Graph {
        let mut b = Builder {
            sources,
            modules: Vec::new(),
            cxs: Vec::new(),
            uses: Vec::new(),
            test_only: Vec::new(),
            problems: Vec::new(),
        };
        if sources.contains_key("lib.rs") {
            let root = b.new_module(None, "", "lib.rs", String::new());
            b.load("lib.rs", root);
        } else {
            b.problems.push("no lib.rs".into());
        }
        let files: BTreeSet<String> = b.cxs.iter().map(|cx| cx.file.clone()).collect();
        for file in sources.keys() {
            let placed = files.contains(file)
                || file == "main.rs"
                || file.starts_with("bin/")
                || b.test_only.iter().any(|t| t == file || (t.ends_with('/') && file.starts_with(t.as_str())));
            if !placed {
                b.problems.push(format!(
                    "{file}: no `mod` declaration reaches it from lib.rs, so this check cannot place it \
                     (declare it, or delete it if it is dead)"
                ));
            }
        }
        let mut graph = Graph { modules: b.modules, files, edges: BTreeMap::new(), problems: b.problems };
        for site in &b.uses {
            match graph.resolve(site.module, &site.leaf.path, 0) {
                Res::Item(m, name) => graph.edge(&site.file, m, name),
                Res::Module(_) | Res::Outside => {}
            }
        }
        for cx in &b.cxs {
            graph.scan_code(cx);
        }
        graph
    }

    fn edge(&mut self, from: &str, to_module: usize, name: String) {
        let to = &self.modules[to_module].file;
        if from != to {
            self.edges.entry((from.to_string(), to.clone())).or_default().insert(name);
        }
    }

    /// Paths in code: `crate::worker::cpu_time(..)`, `super::reply::ReplyBody`,
    /// `worker::reap::start()` after `mod worker;`, and bare names a glob brings in.
    fn scan_code(&mut self, cx: &FileCx) {
        let t = &cx.toks;
        let mut i = 0;
        while i < t.len() {
            let (Some(module), false, Some(first)) = (cx.owner[i], cx.in_use[i], ident(t, i)) else {
                i += 1;
                continue;
            };
            // Not a path's start: a field or method (`x.name`), or a later segment.
            if punct(t, i.wrapping_sub(1), '.') || sep(t, i.wrapping_sub(1)) {
                i += 1;
                continue;
            }
            let mut path = vec![first.to_string()];
            let mut j = i;
            while sep(t, j + 1) && ident(t, j + 2).is_some() && cx.owner[j + 2] == Some(module) {
                path.push(ident(t, j + 2).unwrap_or_default().to_string());
                j += 2;
            }
            if path.len() > 1 {
                if let Res::Item(m, name) = self.resolve(module, &path, 0) {
                    self.edge(&cx.file, m, name);
                }
            } else if !KEYWORDS.contains(&first) {
                let m = &self.modules[module];
                let found = if m.reexports.contains(first) && !m.items.contains(first) {
                    self.lookup(module, first, true, 0)
                } else {
                    self.through_globs(module, first)
                };
                if let Res::Item(m, name) = found {
                    self.edge(&cx.file, m, name);
                }
            }
            i = j + 1;
        }
    }

    /// A bare name that only a glob import of `module` can bring in.
    fn through_globs(&self, module: usize, name: &str) -> Res {
        let m = &self.modules[module];
        if m.globs.is_empty()
            || m.items.contains(name)
            || m.children.contains_key(name)
            || m.imports.contains_key(name)
            || m.local_imports.contains_key(name)
        {
            return Res::Outside;
        }
        self.lookup(module, name, true, 0)
    }

    /// What `path`, written in `base`, names.
    fn resolve(&self, base: usize, path: &[String], depth: usize) -> Res {
        if depth > 64 || path.is_empty() {
            return Res::Outside;
        }
        let (mut current, rest) = match path[0].as_str() {
            "crate" => (0, &path[1..]),
            "self" => (base, &path[1..]),
            "super" => {
                let mut m = base;
                let mut k = 0;
                while path.get(k).is_some_and(|s| s == "super") {
                    match self.modules[m].parent {
                        Some(p) => m = p,
                        None => return Res::Outside,
                    }
                    k += 1;
                }
                (m, &path[k..])
            }
            first => match self.lookup(base, first, path.len() == 1, depth) {
                Res::Module(m) => (m, &path[1..]),
                other => return other,
            },
        };
        for (k, segment) in rest.iter().enumerate() {
            match self.lookup(current, segment, k + 1 == rest.len(), depth) {
                Res::Module(m) => current = m,
                other => return other,
            }
        }
        Res::Module(current)
    }

    /// `name` in the scope of `module`: an item defined there, a submodule, a
    /// name it imports (followed to where it comes from), or a glob's.
    fn lookup(&self, module: usize, name: &str, last: bool, depth: usize) -> Res {
        let m = &self.modules[module];
        // A module and a function may share a name: a path goes on through the module.
        if m.items.contains(name) && (last || !m.children.contains_key(name)) {
            return Res::Item(module, name.to_string());
        }
        if let Some(&child) = m.children.get(name) {
            return Res::Module(child);
        }
        if let Some(path) = m.imports.get(name).or_else(|| m.local_imports.get(name)) {
            return self.resolve(module, path, depth + 1);
        }
        for glob in &m.globs {
            if let Res::Module(g) = self.resolve(module, glob, depth + 1) {
                if g != module {
                    let found = self.lookup(g, name, last, depth + 1);
                    if found != Res::Outside {
                        return found;
                    }
                }
            }
        }
        Res::Outside
    }
}

// ---------------------------------------------------------------------------
// The checks.

/// The top-level module a file belongs to: `app/pool.rs` -> `app`, `lib.rs` -> `lib`.
fn top(file: &str) -> &str {
    let first = file.split('/').next().unwrap_or(file);
    first.strip_suffix(".rs").unwrap_or(first)
}

fn level(layers: &[&[&str]], module: &str) -> Option<usize> {
    layers.iter().position(|line| line.contains(&module))
}

#[derive(Debug, Default)]
struct Findings {
    /// Each a shortest cycle through one edge: [a, b, c] for a -> b -> c -> a.
    file_cycles: Vec<Vec<String>>,
    module_cycles: Vec<Vec<String>>,
    /// Edges between files whose modules break the layer order.
    upward: Vec<(String, String)>,
    /// Top-level modules LAYERS does not place.
    undeclared: BTreeSet<String>,
    problems: Vec<String>,
}

impl Findings {
    fn is_empty(&self) -> bool {
        self.file_cycles.is_empty()
            && self.module_cycles.is_empty()
            && self.upward.is_empty()
            && self.undeclared.is_empty()
            && self.problems.is_empty()
    }

    fn render(&self, g: &Graph, layers: &[&[&str]]) -> String {
        let names = |a: &str, b: &str| {
            g.edges.get(&(a.to_string(), b.to_string())).map(|n| n.iter().cloned().collect::<Vec<_>>().join(", "))
        };
        let mut out = format!(
            "{} import cycle(s) between files, {} between top-level modules, {} edge(s) against the layer order\n",
            self.file_cycles.len(),
            self.module_cycles.len(),
            self.upward.len()
        );
        for p in &self.problems {
            out += &format!("cannot check: {p}\n");
        }
        if !self.upward.is_empty() {
            let order = layers.iter().map(|l| l.join(", ")).collect::<Vec<_>>().join("; ");
            out += &format!("\n{} edge(s) against the layer order (bottom to top: {order}):\n", self.upward.len());
            for (a, b) in &self.upward {
                let (ta, tb) = (top(a), top(b));
                out += &format!("  {a} -> {b} ({})  [{ta} may not name {tb}]\n", names(a, b).unwrap_or_default());
            }
            out += &format!("  hint: {UPWARD_HINT}\n");
        }
        out += &cycles_section("files", &self.file_cycles, g, |f| f.to_string());
        out += &cycles_section("top-level modules", &self.module_cycles, g, |f| top(f).to_string());
        if !self.undeclared.is_empty() {
            out += &format!(
                "\ntop-level modules missing from LAYERS in tests/it/layers.rs: {} (say where each sits)\n",
                self.undeclared.iter().cloned().collect::<Vec<_>>().join(", ")
            );
        }
        out
    }
}

/// The cycles as chains, then each edge between files that lies on one, once.
fn cycles_section(what: &str, cycles: &[Vec<String>], g: &Graph, node: impl Fn(&str) -> String) -> String {
    if cycles.is_empty() {
        return String::new();
    }
    let mut out =
        format!("\n{} import cycle(s) between {what} (the shortest through each edge on one):\n", cycles.len());
    let mut on_a_cycle = BTreeSet::new();
    for cycle in cycles {
        let mut ring = cycle.clone();
        ring.push(cycle[0].clone());
        out += &format!("  cycle: {}\n", ring.join(" -> "));
        on_a_cycle.extend(ring.windows(2).map(|w| (w[0].clone(), w[1].clone())));
    }
    out += "  made of these edges:\n";
    for ((a, b), names) in &g.edges {
        if on_a_cycle.contains(&(node(a), node(b))) {
            out += &format!("    {a} -> {b} ({})\n", names.iter().cloned().collect::<Vec<_>>().join(", "));
        }
    }
    out + &format!("  hint: {CYCLE_HINT}\n")
}

fn check(g: &Graph, layers: &[&[&str]]) -> Findings {
    let mut files: BTreeMap<String, BTreeSet<String>> = g.files.iter().map(|f| (f.clone(), BTreeSet::new())).collect();
    let mut modules: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut f = Findings { problems: g.problems.clone(), ..Findings::default() };
    for file in &g.files {
        modules.entry(top(file).to_string()).or_default();
        if level(layers, top(file)).is_none() {
            f.undeclared.insert(top(file).to_string());
        }
    }
    for (a, b) in g.edges.keys() {
        files.entry(a.clone()).or_default().insert(b.clone());
        let (ta, tb) = (top(a), top(b));
        if ta != tb {
            modules.entry(ta.to_string()).or_default().insert(tb.to_string());
            if let (Some(la), Some(lb)) = (level(layers, ta), level(layers, tb)) {
                if lb >= la {
                    f.upward.push((a.clone(), b.clone()));
                }
            }
        }
    }
    f.file_cycles = cycles(&files);
    f.module_cycles = cycles(&modules);
    f
}

/// For every edge on a cycle, the shortest cycle through it, each once
/// (rotated to start at its least node).
fn cycles(adj: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let mut found = BTreeSet::new();
    for (u, targets) in adj {
        for v in targets {
            // The shortest way back from v to u.
            let mut prev: BTreeMap<&str, &str> = BTreeMap::new();
            let mut queue = VecDeque::from([v.as_str()]);
            let mut seen = BTreeSet::from([v.as_str()]);
            while let Some(x) = queue.pop_front() {
                if x == u {
                    break;
                }
                for y in adj.get(x).into_iter().flatten() {
                    if seen.insert(y.as_str()) {
                        prev.insert(y, x);
                        queue.push_back(y);
                    }
                }
            }
            if !seen.contains(u.as_str()) {
                continue;
            }
            let mut back = vec![u.clone()];
            let mut x = u.as_str();
            while x != v {
                x = prev[x];
                back.push(x.to_string());
            }
            back.reverse(); // v .. u
            let mut cycle = vec![u.clone()];
            cycle.extend(back.into_iter().take_while(|n| n != u));
            let least = (0..cycle.len()).min_by_key(|&k| &cycle[k]).unwrap_or(0);
            cycle.rotate_left(least);
            found.insert(cycle);
        }
    }
    let mut found: Vec<Vec<String>> = found.into_iter().collect();
    found.sort_by_key(|c| c.len());
    found
}

// ---------------------------------------------------------------------------
// The checker, checked on small trees, so that it cannot pass by seeing nothing.

mod checker {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> Graph {
        let sources = files.iter().map(|(p, s)| (p.to_string(), s.to_string())).collect();
        let g = Graph::build(&sources);
        assert!(g.problems.is_empty(), "{:?}", g.problems);
        g
    }

    fn edges(g: &Graph) -> Vec<String> {
        g.edges
            .iter()
            .map(|((a, b), n)| format!("{a} -> {b} ({})", n.iter().cloned().collect::<Vec<_>>().join(", ")))
            .collect()
    }

    const AB: &[&[&str]] = &[&["b"], &["a"], &["lib"]];

    #[test]
    fn layers_checker_finds_a_cycle_between_files() {
        let g = tree(&[
            ("lib.rs", "pub mod a; pub mod b;"),
            ("a.rs", "use crate::b::B; pub struct A;"),
            ("b.rs", "pub struct B; pub fn make() -> crate::a::A { todo!() }"),
        ]);
        assert_eq!(edges(&g), ["a.rs -> b.rs (B)", "b.rs -> a.rs (A)"]);
        let f = check(&g, AB);
        assert_eq!(f.file_cycles, [vec!["a.rs".to_string(), "b.rs".to_string()]]);
        assert_eq!(f.module_cycles.len(), 1);
        assert_eq!(f.upward, [("b.rs".to_string(), "a.rs".to_string())]);
        let text = f.render(&g, AB);
        assert!(text.contains("cycle: a.rs -> b.rs -> a.rs"), "{text}");
        assert!(text.contains("b.rs -> a.rs (A)"), "{text}");
    }

    #[test]
    fn layers_checker_finds_a_longer_cycle_and_a_cycle_between_modules_only() {
        let g = tree(&[
            ("lib.rs", "mod x; mod y;"),
            ("x/mod.rs", "mod one; mod two;"),
            ("x/one.rs", "use crate::y::Why;"),
            ("x/two.rs", "pub struct Two;"),
            ("y.rs", "pub struct Why; fn f(_: super::x::two::Two) {}"),
        ]);
        let f = check(&g, &[&["x", "y"], &["lib"]]);
        assert!(f.file_cycles.is_empty(), "{:?}", f.file_cycles);
        assert_eq!(f.module_cycles, [vec!["x".to_string(), "y".to_string()]]);
        // Standalone modules on one line name none of each other.
        assert_eq!(f.upward.len(), 2);

        let g = tree(&[
            ("lib.rs", "mod a; mod b; mod c;"),
            ("a.rs", "pub fn a() { crate::b::b() }"),
            ("b.rs", "pub fn b() { crate::c::c() }"),
            ("c.rs", "pub fn c() { crate::a::a() }"),
        ]);
        let f = check(&g, &[&["a", "b", "c"], &["lib"]]);
        assert_eq!(f.file_cycles, [vec!["a.rs".to_string(), "b.rs".to_string(), "c.rs".to_string()]]);
    }

    #[test]
    fn layers_checker_follows_re_exports_to_the_defining_file() {
        let g = tree(&[
            ("lib.rs", "pub mod app; pub mod http;"),
            ("app/mod.rs", "pub mod lease;\npub use lease::Lease;\npub fn helper() {}"),
            // A re-export passes a name through: an edge only where the file uses it
            // itself. lease.rs has its own directory: app/lease/inner.rs.
            ("app/lease.rs", "mod inner;\npub use self::inner::Real as Lease;\npub fn make() -> Lease { todo!() }"),
            ("app/lease/inner.rs", "pub struct Real;"),
            ("http.rs", "use crate::app::{self, Lease};\nfn f() { app::helper(); let _ = crate::app::Lease; }"),
        ]);
        assert_eq!(
            edges(&g),
            [
                "app/lease.rs -> app/lease/inner.rs (Real)",
                "http.rs -> app/lease/inner.rs (Real)",
                "http.rs -> app/mod.rs (helper)"
            ]
        );
    }

    #[test]
    fn layers_checker_ignores_what_only_tests_compile() {
        let g = tree(&[
            ("lib.rs", "pub mod a; pub mod b;"),
            (
                "a.rs",
                "pub struct A;\n#[cfg(test)]\nmod tests { use crate::b::B; }\n#[cfg(test)]\nmod fake;\n\
                 #[cfg(test)]\nfn helper() -> crate::b::B { crate::b::B }\n\
                 impl A { #[cfg(test)] pub fn probe(&self) { crate::b::probe() } pub fn real(&self) {} }",
            ),
            ("a/fake.rs", "use crate::b::B;"),
            ("b.rs", "pub struct B; pub fn probe() {} pub fn f(_: crate::a::A) {}"),
        ]);
        assert_eq!(edges(&g), ["b.rs -> a.rs (A)"]);
        assert!(check(&g, &[&["a"], &["b"], &["lib"]]).is_empty());
    }

    #[test]
    fn layers_checker_parses_nested_use_groups() {
        let g = tree(&[
            ("lib.rs", "pub mod a; pub mod b; pub mod user; pub fn settings() {}"),
            ("a/mod.rs", "pub mod deep; pub struct A;"),
            ("a/deep.rs", "pub struct D; pub enum E { One }"),
            ("b/mod.rs", "pub mod c; pub mod g;"),
            ("b/c.rs", "pub struct C;"),
            ("b/g.rs", "pub struct G1; pub struct G2;"),
            (
                "user.rs",
                "use crate::{a::{self, deep::{D as Dee, E::*}}, b::{c::C as _, g::*}, settings};\n\
                 fn f() { let _ = (a::A, G1, One); }",
            ),
        ]);
        // The glob over module g brings in only what is named (G1, not G2).
        assert_eq!(
            edges(&g),
            [
                "user.rs -> a/deep.rs (D, E)",
                "user.rs -> a/mod.rs (A)",
                "user.rs -> b/c.rs (C)",
                "user.rs -> b/g.rs (G1)",
                "user.rs -> lib.rs (settings)",
            ]
        );
    }

    #[test]
    fn layers_checker_resolves_paths_in_code() {
        let g = tree(&[
            ("lib.rs", "pub mod worker; pub mod http; pub fn settings() {}\nfn run() { worker::reap::start(); }"),
            ("worker/mod.rs", "pub mod reap; pub fn cpu_time() {}"),
            ("worker/reap.rs", "pub fn start() {}"),
            ("http/mod.rs", "pub mod reply; pub mod forward;"),
            ("http/reply.rs", "pub struct ReplyBody; pub enum Kind { A }"),
            (
                "http/forward.rs",
                "mod inner {\n    fn f() -> super::super::reply::Kind { super::super::reply::Kind::A }\n}\n\
                 fn g(_: super::reply::ReplyBody) { let _ = crate::worker::cpu_time(); crate::settings(); }\n\
                 fn h() { self::g(Default::default()); Vec::<crate::http::reply::ReplyBody>::new(); }",
            ),
        ]);
        assert_eq!(
            edges(&g),
            [
                "http/forward.rs -> http/reply.rs (Kind, ReplyBody)",
                "http/forward.rs -> lib.rs (settings)",
                "http/forward.rs -> worker/mod.rs (cpu_time)",
                "lib.rs -> worker/reap.rs (start)",
            ]
        );
    }

    #[test]
    fn layers_checker_reads_no_path_in_comments_or_strings() {
        let g = tree(&[
            ("lib.rs", "pub mod a; pub mod b;"),
            (
                "a.rs",
                "// use crate::b::B;\n/* crate::b::B /* nested */ crate::b::B */\n/// crate::b::B\n\
                 const S: &str = \"crate::b::B \\\" crate::b::B\";\n\
                 const R: &str = r#\"crate::b::B \" crate::b::B\"#;\n\
                 const Q: char = '\"'; const L: &[u8] = b\"crate::b::B\";\n\
                 fn f<'a>(x: &'a str) -> &'a str { x }\n\
                 pub fn real() -> crate::b::Real { todo!() }",
            ),
            ("b.rs", "pub struct B; pub struct Real;"),
        ]);
        assert_eq!(edges(&g), ["a.rs -> b.rs (Real)"]);
    }

    #[test]
    fn layers_checker_names_the_edges_against_the_order() {
        let g = tree(&[
            ("lib.rs", "pub mod config; pub mod app;"),
            ("config.rs", "pub struct Config; pub fn f(_: crate::app::Lease) {}"),
            ("app/mod.rs", "mod lease; pub use lease::Lease;"),
            ("app/lease.rs", "pub struct Lease;"),
        ]);
        let layers: &[&[&str]] = &[&["config"], &["app"], &["lib"]];
        let f = check(&g, layers);
        assert!(f.file_cycles.is_empty());
        assert_eq!(f.upward, [("config.rs".to_string(), "app/lease.rs".to_string())]);
        let text = f.render(&g, layers);
        assert!(text.contains("config.rs -> app/lease.rs (Lease)"), "{text}");
        assert!(text.contains("hint:"), "{text}");
        // A module LAYERS does not place is a finding too.
        assert_eq!(check(&g, &[&["config"], &["lib"]]).undeclared, BTreeSet::from(["app".to_string()]));
    }

    #[test]
    fn layers_checker_reads_items_after_a_macro_call_and_an_inner_attribute() {
        let g = tree(&[
            ("lib.rs", "#![forbid(unsafe_code)]\npub mod a; pub mod b;"),
            ("a.rs", "std::thread_local! { static N: u8 = 0; }\nmacro_rules! m { () => {} }\npub struct A;"),
            ("b.rs", "pub fn f(_: crate::a::A) {}"),
        ]);
        assert_eq!(edges(&g), ["b.rs -> a.rs (A)"]);
    }

    #[test]
    fn layers_checker_says_when_it_cannot_place_a_file() {
        let sources =
            [("lib.rs", "pub mod a; mod gone;"), ("a.rs", ""), ("stray.rs", ""), ("main.rs", "use valve::a;")]
                .iter()
                .map(|(p, s)| (p.to_string(), s.to_string()))
                .collect();
        let g = Graph::build(&sources);
        assert_eq!(g.problems.len(), 2, "{:?}", g.problems);
        assert!(g.problems[0].contains("mod gone;"), "{:?}", g.problems);
        assert!(g.problems[1].starts_with("stray.rs"), "{:?}", g.problems);
        assert!(!check(&g, &[&["a"], &["lib"]]).is_empty());
    }
}
