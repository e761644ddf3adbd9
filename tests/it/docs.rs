//! The manual in docs/src: every page is in its table of contents, every
//! link between pages and to a heading resolves, and every shell and R
//! example runs against the real valve with real R, unless its fence marks
//! why it cannot run here.
//!
//! A fenced block's info string is its language and attributes, comma-separated
//! (mdBook's own convention, as in `rust,ignore`):
//! - `sh` runs with bash (`set -euo pipefail`) in a scratch folder holding a
//!   copy of `examples/`, with the `valve` under test first on the PATH; each
//!   `#> text` line in it is a line its output must contain;
//! - `sh,serve` starts what it says (a valve) and keeps it for the page's next
//!   blocks, until the page's next `serve` block or its end;
//! - `r` blocks of a page run, in order, as one Rscript, with the R package
//!   from `r/` installed (without building valve: it uses this one);
//! - `fragment` (part of an app's file), `bench` (a benchmark: minutes), and
//!   `needs-WHAT` (a cluster, a container engine, the network, root, Quarto,
//!   ...) are shown, not run; any other attribute is an error, so a typo
//!   never skips an example.
//!
//! Port 3000 and 9090 in a page stand for free ports chosen per page, so the
//! examples read as a user types them and still run beside other tests.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::harness::{free_port, need_r_packages, valve_bin, START_DEADLINE};

/// How long one shell block may run (it may start R, install a package).
const BLOCK_DEADLINE: Duration = Duration::from_secs(180);

/// Attributes that show an example without running it.
const NOT_RUN: &[&str] = &["fragment", "bench"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn book() -> PathBuf {
    root().join("docs/src")
}

/// Every page of the book, by its path relative to docs/src.
fn pages() -> BTreeMap<String, String> {
    fn walk(dir: &Path, base: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).expect("docs/src is readable").flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, base, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                let rel = path.strip_prefix(base).expect("under docs/src").to_string_lossy().into_owned();
                out.insert(rel, std::fs::read_to_string(&path).expect("a page is UTF-8"));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(&book(), &book(), &mut out);
    out
}

/// One fenced code block.
struct Block {
    line: usize,
    lang: String,
    attrs: Vec<String>,
    code: String,
}

/// The fenced blocks of a page (fences may be indented, as in a list item).
fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<(usize, usize, String, Vec<String>)> = None;
    let mut code = String::new();
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        match &open {
            None if trimmed.starts_with("```") => {
                let info = trimmed.trim_start_matches('`').trim();
                let mut parts = info.split(',').map(|p| p.trim().to_string());
                let lang = parts.next().unwrap_or_default();
                open = Some((n + 1, indent, lang, parts.filter(|p| !p.is_empty()).collect()));
                code.clear();
            }
            Some((start, _, lang, attrs)) if trimmed.starts_with("```") => {
                out.push(Block { line: *start, lang: lang.clone(), attrs: attrs.clone(), code: code.clone() });
                open = None;
            }
            Some((_, indent, _, _)) => {
                let strip = line.len().min(*indent).min(line.len() - line.trim_start().len());
                code.push_str(&line[strip..]);
                code.push('\n');
            }
            None => {}
        }
    }
    out
}

/// The text outside fenced blocks and inline code, line by line (numbered).
fn prose(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut kept = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                kept.push_str(part);
            } else {
                kept.push_str("code");
            }
        }
        out.push((n + 1, kept));
    }
    out
}

/// The anchors mdBook gives a page's headings: the heading's text, lower
/// case, spaces as `-`, only letters, digits, `_` and `-` kept; a repeated
/// one gets `-1`, `-2`.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let heading = line.trim_start_matches('#').trim();
        // Link text stays, its target goes.
        let mut plain = String::new();
        let mut rest = heading;
        while let Some(i) = rest.find("](") {
            plain.push_str(&rest[..i]);
            rest = rest[i..].find(')').map(|j| &rest[i + j + 1..]).unwrap_or("");
        }
        plain.push_str(rest);
        let id: String = plain
            .chars()
            .filter_map(|c| {
                if c.is_alphanumeric() || c == '_' || c == '-' {
                    Some(c.to_ascii_lowercase())
                } else if c.is_whitespace() {
                    Some('-')
                } else {
                    None
                }
            })
            .collect();
        let n = seen.entry(id.clone()).or_insert(0);
        out.insert(if *n == 0 { id.clone() } else { format!("{id}-{n}") });
        *n += 1;
    }
    out
}

/// The targets of a line's Markdown links and images.
fn link_targets(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let end = after.find(')').unwrap_or(after.len());
        out.push(after[..end].split_whitespace().next().unwrap_or("").to_string());
        rest = &after[end..];
    }
    out
}

/// The page a relative link from `page` names, as a path under docs/src.
fn resolve(page: &str, target: &str) -> String {
    let mut parts: Vec<&str> =
        Path::new(page).parent().map(|p| p.to_str().unwrap_or("")).unwrap_or("").split('/').collect();
    parts.retain(|p| !p.is_empty());
    for part in target.split('/') {
        match part {
            "." | "" => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    parts.join("/")
}

#[test]
fn every_page_is_in_the_summary_and_every_internal_link_and_anchor_resolves() {
    let pages = pages();
    let summary = pages.get("SUMMARY.md").expect("docs/src/SUMMARY.md");
    let listed: BTreeSet<String> =
        summary.lines().flat_map(link_targets).filter(|t| !t.is_empty()).map(|t| resolve("SUMMARY.md", &t)).collect();
    let mut problems = Vec::new();
    for page in pages.keys().filter(|p| *p != "SUMMARY.md") {
        if !listed.contains(page) {
            problems.push(format!("docs/src/{page}: not in SUMMARY.md, so mdBook leaves it out of the book"));
        }
    }
    let ids: BTreeMap<&String, BTreeSet<String>> = pages.iter().map(|(p, t)| (p, anchors(t))).collect();
    let mut checked = 0;
    for (page, text) in &pages {
        for (n, line) in prose(text) {
            for target in link_targets(&line) {
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
                let resolved = if path.is_empty() { page.clone() } else { resolve(page, path) };
                let at = format!("docs/src/{page}:{n}: {target}");
                if path.ends_with(".html") {
                    // The R package's reference site, built beside the book by
                    // pkgdown; scripts/test checks its pages once built.
                    if !resolved.starts_with("r/") {
                        problems.push(format!("{at}: link to the page's .md, not its .html"));
                    }
                    continue;
                }
                if !path.is_empty() && !path.ends_with(".md") {
                    if !book().join(&resolved).is_file() {
                        problems.push(format!(
                            "{at}: no file docs/src/{resolved} (a link out of docs/src breaks in the built book)"
                        ));
                    }
                    continue;
                }
                match ids.get(&resolved) {
                    None => problems.push(format!("{at}: no page docs/src/{resolved}")),
                    Some(found) if !anchor.is_empty() && !found.contains(anchor) => {
                        problems.push(format!("{at}: no heading with anchor #{anchor} in docs/src/{resolved}"))
                    }
                    Some(_) => {}
                }
            }
        }
    }
    // The front page links into the manual: each link leads to a file, and an
    // anchor in a page of the manual to one of its headings.
    for front in ["README.md", "ARCHITECTURE.md"] {
        let text = std::fs::read_to_string(root().join(front)).expect("the front pages are readable");
        for (n, line) in prose(&text) {
            for target in link_targets(&line) {
                if target.is_empty() || target.contains("://") || target.starts_with('#') {
                    continue;
                }
                checked += 1;
                let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
                let at = format!("{front}:{n}: {target}");
                if !root().join(path).exists() {
                    problems.push(format!("{at}: no such file"));
                } else if let Some(page) = path.strip_prefix("docs/src/") {
                    if !anchor.is_empty() && !ids.get(&page.to_string()).is_some_and(|found| found.contains(anchor)) {
                        problems.push(format!("{at}: no heading with anchor #{anchor} in {path}"));
                    }
                }
            }
        }
    }
    assert!(checked > 100, "the link scan found only {checked} links: is docs/src there?");
    assert!(problems.is_empty(), "broken links in the manual:\n{}", problems.join("\n"));
}

/// A process group started from a `serve` block, stopped when dropped.
struct Served {
    child: Child,
}

impl Served {
    fn start(cmd: &mut Command, what: &str) -> Result<Served, String> {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(|e| format!("{what}: {e}"))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let mut stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.contains("\"event\":\"ready\"") {
                    let _ = tx.send(());
                }
            }
        });
        let log = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        let served = Served { child };
        match rx.recv_timeout(START_DEADLINE) {
            Ok(()) => Ok(served),
            Err(_) => {
                drop(served);
                let log = log.join().unwrap_or_default();
                Err(format!("{what}: not ready within {START_DEADLINE:?}; its log:\n{log}"))
            }
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let group = -(self.child.id() as i32);
        unsafe { libc::kill(group, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(40);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        unsafe { libc::kill(group, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// Runs a command to its end within `deadline`, its output (stdout then stderr) returned.
fn run(cmd: &mut Command, deadline: Duration) -> Result<String, String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| e.to_string())?;
    let mut out = child.stdout.take().expect("piped stdout");
    let mut err = child.stderr.take().expect("piped stderr");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = out.read_to_string(&mut text);
        text
    });
    let err_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = err.read_to_string(&mut text);
        text
    });
    let start = Instant::now();
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break Some(status);
        }
        if start.elapsed() > deadline {
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = format!("{}{}", reader.join().unwrap_or_default(), err_reader.join().unwrap_or_default());
    match status {
        Some(s) if s.success() => Ok(text),
        Some(s) => Err(format!("{s}; output:\n{text}")),
        None => Err(format!("still running after {deadline:?}; output:\n{text}")),
    }
}

/// The scratch folder the examples run in: a copy of examples/, a `bin`
/// with the valve under test, a home, a state folder, the R package.
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Scratch {
        // Not under /tmp: as root each app has a /tmp of its own, where a
        // symlink out of its folder (examples/site/api/plumber.R) leads nowhere.
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("a scratch folder");
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod 0755");
        let copied = Command::new("cp").arg("-r").arg(root().join("examples")).arg(dir.path()).status();
        assert!(copied.is_ok_and(|s| s.success()), "copy examples/ into {}", dir.path().display());
        // The apps' own users (valve as root) render documents beside them.
        let opened = Command::new("chmod").args(["-R", "a+rwX"]).arg(dir.path().join("examples")).status();
        assert!(opened.is_ok_and(|s| s.success()), "chmod the examples' copy");
        for sub in ["bin", "home", "state"] {
            std::fs::create_dir_all(dir.path().join(sub)).expect("a scratch folder");
        }
        std::os::unix::fs::symlink(valve_bin(), dir.path().join("bin/valve")).expect("link valve into bin/");
        Scratch { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A command run in the scratch folder with its environment.
    fn command(&self, program: &str, port: u16) -> Command {
        let mut cmd = Command::new(program);
        let path = format!("{}:{}", self.path().join("bin").display(), std::env::var("PATH").unwrap_or_default());
        cmd.current_dir(self.path())
            .env("PATH", path)
            .env("HOME", self.path().join("home"))
            .env("VALVE_PORT", port.to_string())
            .env("VALVE_STATE_DIR", self.path().join("state"))
            .env("VALVE_BINARY", valve_bin())
            .env("R_LIBS", self.path().join("rlib"))
            .env_remove("VALVE_PRELOAD");
        cmd
    }

    /// Installs the R package from r/ (without building valve) once.
    fn r_package(&self) -> Result<(), String> {
        let lib = self.path().join("rlib");
        if lib.join("valve").is_dir() {
            return Ok(());
        }
        std::fs::create_dir_all(&lib).map_err(|e| e.to_string())?;
        let mut cmd = self.command("R", 0);
        cmd.args(["CMD", "INSTALL", "--no-test-load", "-l"])
            .arg(&lib)
            .arg(root().join("r"))
            .env("VALVE_SKIP_BUILD", "1");
        run(&mut cmd, BLOCK_DEADLINE).map(|_| ()).map_err(|e| format!("installing the R package from r/: {e}"))
    }
}

#[test]
fn every_shell_and_r_example_in_the_manual_runs_or_says_why_not() {
    need_r_packages(&["plumber", "shiny", "rmarkdown", "processx", "cli", "rlang", "ps", "codetools", "curl"]);
    let scratch = Scratch::new();
    let mut failures = Vec::new();
    let mut ran = 0;
    let mut shown: BTreeMap<String, usize> = BTreeMap::new();
    for (page, text) in pages() {
        let (port, admin) = (free_port(), free_port());
        let ports = |code: &str| code.replace("3000", &port.to_string()).replace("9090", &admin.to_string());
        let mut server: Option<Served> = None;
        let mut r_script = String::new();
        let mut r_first = 0;
        for block in blocks(&text) {
            let at = format!("docs/src/{page}:{}", block.line);
            let shell = matches!(block.lang.as_str(), "sh" | "bash" | "shell" | "console");
            if !shell && block.lang != "r" {
                continue;
            }
            let mut skip = None;
            let mut serve = false;
            for attr in &block.attrs {
                if attr == "serve" && shell {
                    serve = true;
                } else if NOT_RUN.contains(&attr.as_str()) || attr.starts_with("needs-") {
                    skip = Some(attr.clone());
                } else {
                    failures.push(format!("{at}: unknown attribute `{attr}` (serve, fragment, bench or needs-WHAT)"));
                    skip = Some(attr.clone());
                }
            }
            if let Some(why) = skip {
                *shown.entry(why).or_default() += 1;
                continue;
            }
            ran += 1;
            if block.lang == "r" {
                if r_script.is_empty() {
                    r_first = block.line;
                }
                r_script.push_str(&format!("# {at}\n{}\n", block.code));
                continue;
            }
            let code = ports(&block.code);
            if serve {
                server = None;
                let mut cmd = scratch.command("bash", port);
                cmd.args(["-c", &code]);
                match Served::start(&mut cmd, &at) {
                    Ok(s) => server = Some(s),
                    Err(e) => failures.push(e),
                }
                continue;
            }
            let mut cmd = scratch.command("bash", port);
            cmd.args(["-c", &format!("set -euo pipefail\n{code}")]);
            match run(&mut cmd, BLOCK_DEADLINE) {
                Ok(out) => {
                    for expected in code.lines().filter_map(|l| l.trim_start().strip_prefix("#> ")) {
                        if !out.contains(expected.trim_end()) {
                            failures.push(format!("{at}: the output lacks `{expected}`; it was:\n{out}"));
                        }
                    }
                }
                Err(e) => failures.push(format!("{at}: {e}")),
            }
        }
        drop(server);
        if !r_script.is_empty() {
            let at = format!("docs/src/{page}:{r_first}");
            let result = scratch.r_package().and_then(|()| {
                let file = scratch.path().join("example.R");
                std::fs::write(&file, &r_script).map_err(|e| e.to_string())?;
                let mut cmd = scratch.command("Rscript", port);
                cmd.arg(&file);
                run(&mut cmd, BLOCK_DEADLINE)
            });
            if let Err(e) = result {
                failures.push(format!("{at} (the page's R blocks, as one script): {e}"));
            }
        }
    }
    eprintln!("docs: ran {ran} examples; shown, not run: {shown:?}");
    assert!(ran > 20, "only {ran} examples ran: is docs/src there?");
    assert!(failures.is_empty(), "examples in the manual that do not run:\n\n{}", failures.join("\n\n"));
}

/// The messages valve writes into its own error answers, read from src/:
/// the text of each string that follows a `StatusCode` in a call or a
/// `message:` field, up to its first `{` (the value), test modules aside.
fn error_messages() -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("src is readable").flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    const SUCCESS: &[&str] = &["OK", "FOUND", "ACCEPTED", "CREATED", "NO_CONTENT", "NOT_MODIFIED", "PARTIAL_CONTENT"];
    let mut files = Vec::new();
    walk(&root().join("src"), &mut files);
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("a source file is UTF-8");
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        let mut rest = code;
        while let Some(i) = rest.find("StatusCode::") {
            rest = &rest[i + "StatusCode::".len()..];
            let name: String = rest.chars().take_while(|c| c.is_ascii_uppercase() || *c == '_').collect();
            if name.is_empty() || SUCCESS.contains(&name.as_str()) {
                continue;
            }
            let mut after = rest[name.len()..].trim_start();
            if !after.starts_with(',') {
                continue;
            }
            after = after[1..].trim_start();
            for prefix in ["message:", "&format!(", "format!("] {
                after = after.strip_prefix(prefix).unwrap_or(after).trim_start();
            }
            let Some(literal) = after.strip_prefix('"') else { continue };
            let message = literal.split('"').next().unwrap_or("").split('{').next().unwrap_or("").trim();
            if message.len() >= 8 && message.contains(' ') {
                let at = file.strip_prefix(root()).unwrap_or(&file).display().to_string();
                out.push((at, message.to_string()));
            }
        }
    }
    out
}

#[test]
fn the_errors_page_names_every_answer_valve_gives_itself() {
    let page = std::fs::read_to_string(book().join("reference/errors.md")).expect("docs/src/reference/errors.md");
    let messages = error_messages();
    assert!(
        messages.len() > 30,
        "only {} messages found in src/: has the scan gone stale? {messages:?}",
        messages.len()
    );
    let missing: Vec<String> = messages
        .iter()
        .filter(|(_, message)| !page.contains(message.trim_end_matches(['(', ':', ' '])))
        .map(|(file, message)| format!("{file}: `{message}`"))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/src/reference/errors.md lacks messages valve gives (add each with what to do):\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_tests_architecture_and_its_invariants_name_exist() {
    fn sources(dir: &Path, out: &mut String) {
        for entry in std::fs::read_dir(dir).expect("a source folder is readable").flatten() {
            let path = entry.path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
            }
        }
    }
    let mut code = String::new();
    sources(&root().join("src"), &mut code);
    sources(&root().join("tests"), &mut code);
    let mut named = 0;
    let mut missing = Vec::new();
    for doc in ["ARCHITECTURE.md", "docs/design/invariants.md"] {
        let text = std::fs::read_to_string(root().join(doc)).expect("the architecture pages are readable");
        for span in text.split('`').skip(1).step_by(2) {
            // A test's path: `module::name` whose last part reads as a sentence.
            let Some((_, name)) = span.rsplit_once("::") else { continue };
            if name.matches('_').count() < 2
                || !name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            {
                continue;
            }
            named += 1;
            if !code.contains(&format!("fn {name}(")) {
                missing.push(format!("{doc}: {span}"));
            }
        }
    }
    assert!(named > 40, "only {named} tests named in ARCHITECTURE.md and docs/design/invariants.md");
    assert!(missing.is_empty(), "tests named as guards that do not exist (renamed?):\n{}", missing.join("\n"));
}

/// Every flag valve and its commands take, read from their `--help`.
fn known_flags() -> BTreeSet<String> {
    let help = |args: &[&str]| {
        let out = Command::new(valve_bin()).args(args).arg("--help").output().expect("valve --help runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let top = help(&[]);
    let mut text = top.clone();
    // The commands are listed under "Commands:", two spaces in, until a blank line.
    let commands: Vec<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect();
    assert!(!commands.is_empty(), "valve --help lists its commands:\n{top}");
    for command in &commands {
        text.push_str(&help(&[command]));
    }
    flag_tokens(&text)
}

/// The `--flag` tokens of a text.
fn flag_tokens(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("--") {
        if i > 0 && !text[..i].ends_with([' ', '[', '(', '\n', '`', '\t']) {
            continue;
        }
        let flag: String = text[i + 2..].chars().take_while(|c| c.is_ascii_lowercase() || *c == '-').collect();
        if flag.len() > 1 && !flag.ends_with('-') {
            out.insert(flag);
        }
    }
    out
}

/// Other programs whose flags the manual's commands also show.
const OTHER_PROGRAMS: &[&str] = &[
    "docker",
    "podman",
    "helm",
    "kubectl",
    "oauth2-proxy",
    "cargo",
    "curl",
    "R CMD",
    "Rscript",
    "mkdir",
    "git",
    "chromium",
];

#[test]
fn every_flag_and_config_key_the_manual_shows_is_one_valve_knows() {
    let flags = known_flags();
    assert!(flags.contains("n-max") && flags.contains("admin"), "flags from --help: {flags:?}");
    let scratch = tempfile::tempdir().expect("a scratch folder");
    let mut problems = Vec::new();
    let mut keys_checked = 0;
    for (page, text) in pages() {
        for block in blocks(&text) {
            let at = format!("docs/src/{page}:{}", block.line);
            let skipped = block.attrs.iter().any(|a| a.starts_with("needs-") && block.lang == "toml");
            if matches!(block.lang.as_str(), "sh" | "bash" | "shell" | "console") {
                // A command continued with `\` is one command.
                let joined = block.code.replace("\\\n", " ");
                for line in joined.lines() {
                    let command = line.split(" #").next().unwrap_or(line);
                    if !command.contains("valve ") || OTHER_PROGRAMS.iter().any(|p| command.contains(p)) {
                        continue;
                    }
                    for flag in flag_tokens(command) {
                        if !flags.contains(&flag) {
                            problems.push(format!("{at}: `--{flag}` is not a flag of valve (valve --help): {line}"));
                        }
                    }
                }
            } else if block.lang == "toml" && !skipped {
                // A fragment names files that are not there: only unknown keys count.
                keys_checked += 1;
                let file = scratch.path().join("fragment.toml");
                std::fs::write(&file, &block.code).expect("write the fragment");
                let out =
                    Command::new(valve_bin()).arg("--config").arg(&file).arg("--check").output().expect("valve runs");
                let said = String::from_utf8_lossy(&out.stderr);
                for line in said.lines().filter(|l| l.contains("unknown key")) {
                    problems.push(format!("{at}: {}", line.split("; known keys").next().unwrap_or(line)));
                }
            }
        }
    }
    assert!(keys_checked >= 5, "only {keys_checked} TOML blocks checked");
    assert!(problems.is_empty(), "the manual shows flags or keys valve does not know:\n{}", problems.join("\n"));
}
