//! Interactive R Markdown documents (`runtime: shiny`,
//! `runtime: shiny_prerendered`) served as Shiny Server serves them
//! (`rmarkdown::run()` on valve's private socket), through real HTTP and
//! real Chromium (tests/browser/reconnect.mjs's `eval`). A prerendered
//! document is rendered once before its workers start: the tutorial fixture
//! appends a line to `VALVE_TEST_RENDERS` (in its user's home, named in the
//! copy's `.Renviron`: valve's own environment does not reach an isolated
//! app's R) each time it is rendered.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::json;

use crate::harness::{as_root, fixture, need_program, need_r_packages, valve_bin, wait_until, Valve};
use crate::reconnect::Page;

/// What an interactive document needs besides R and Shiny.
pub fn need_rmarkdown() {
    need_r_packages(&["shiny", "rmarkdown", "knitr"]);
    need_program("pandoc", "pandoc");
}

/// A copy of a fixture folder (rendering writes beside the document).
fn copy_of(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let to = tmp.path().join(name);
    std::fs::create_dir(&to).unwrap();
    for entry in std::fs::read_dir(fixture(name)).unwrap().flatten() {
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
    (tmp, to)
}

/// A copy of the tutorial that notes its renders in `RENDERS`.
fn tutorial_noting_renders() -> (tempfile::TempDir, PathBuf) {
    let (tmp, dir) = copy_of("rmd_tutorial");
    std::fs::write(dir.join(".Renviron"), format!("VALVE_TEST_RENDERS={RENDERS}\n")).unwrap();
    (tmp, dir)
}

/// Where the tutorial notes its renders: in its user's home, which its R may
/// write and the test may read (`Valve::home`).
const RENDERS: &str = "~/renders.log";

fn renders(log: &Path) -> usize {
    std::fs::read_to_string(log).map(|t| t.lines().count()).unwrap_or(0)
}

pub fn get(url: &str) -> (u16, String) {
    let mut cmd = Command::new("curl");
    if let Some(token) = crate::harness::token_for(url) {
        cmd.args(["-H", &format!("Authorization: Bearer {token}")]);
    }
    let out = cmd.args(["-s", "--max-time", "60", "-w", "\n%{http_code}", url]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.parse().unwrap_or(0), body.to_string())
}

/// JavaScript for `eval`: waits (up to 30 s) until `cond` (an expression) holds, then gives `value`.
pub fn wait_js(cond: &str, value: &str) -> String {
    format!(
        "new Promise((ok, no) => {{ const t0 = Date.now(); const poll = () => {{ \
           try {{ if ({cond}) return ok({value}); }} catch (e) {{}} \
           if (Date.now() - t0 > 30000) return no(new Error('timed out waiting for: {}')); \
           setTimeout(poll, 50); }}; poll(); }})",
        cond.replace('\'', "\\'")
    )
}

/// The text of the first Shiny text output that contains `needle`, once there is one.
pub fn output_with(needle: &str) -> String {
    let find = format!(
        "Array.from(document.querySelectorAll('.shiny-text-output')).map(e => e.textContent).find(t => t.includes('{needle}'))"
    );
    wait_js(&format!("{find} !== undefined"), &find)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_runtime_shiny_document_renders_per_session_and_answers_its_input_in_chromium() {
    need_rmarkdown();
    let (_tmp, dir) = copy_of("rmd_shiny");
    let valve = Valve::start(&["-f", dir.to_str().unwrap(), "-n", "2", "--no-access-log"]);
    assert_eq!(valve.ready["apps"][0]["kind"], "shiny", "a Shiny app to everything outside the launcher");
    let (status, page) = get(&valve.get("/"));
    assert_eq!(status, 200);
    assert!(page.contains("__reactivedoc__"), "rmarkdown::run()'s page for a runtime: shiny document: {page}");
    assert!(page.contains("shiny-reconnect.js"), "valve's reconnect script is in the page");

    let mut browser = Page::open(&valve.url).await;
    // The document is knitted for the session, then its input appears.
    let typed = wait_js(
        "document.querySelector('#name.shiny-bound-input')",
        "(() => { const el = document.getElementById('name'); el.value = 'valve'; \
           el.dispatchEvent(new Event('input', { bubbles: true })); $(el).trigger('change'); return true; })()",
    );
    browser.ask(json!({"op": "eval", "js": typed})).await;
    let answer = browser.ask(json!({"op": "eval", "js": output_with("Hello, valve!")})).await;
    let text = answer["value"].as_str().unwrap_or_default().to_string();
    let pid: u32 = text.split("worker ").nth(1).and_then(|r| r.trim_end_matches(')').parse().ok()).unwrap_or(0);
    assert!(valve.workers().contains(&pid), "answered by one of valve's workers: {text}");
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_prerendered_tutorial_is_rendered_once_for_three_workers_and_its_server_chunk_answers_in_chromium() {
    need_rmarkdown();
    let (_tmp, dir) = tutorial_noting_renders();
    let valve = Valve::start(&["-f", dir.to_str().unwrap(), "-n", "3", "--n-min", "3", "--no-access-log"]);
    let log = valve.home("rmd_tutorial").join("renders.log");
    assert_eq!(renders(&log), 1, "rendered once, not once per worker");
    assert_eq!(valve.workers().len(), 3);
    let render_pid: u32 = std::fs::read_to_string(&log).unwrap().trim().parse().unwrap();
    assert!(!valve.workers().contains(&render_pid), "rendered by its own R process, before the workers");
    // Where rmarkdown::run() finds it: beside the document when the folder is
    // the app's user's to write, else in the app's own render folder.
    assert_eq!(
        dir.join("tutorial.html").is_file(),
        !as_root(),
        "the HTML beside the document only if the app may write there"
    );
    let (status, page) = get(&valve.get("/"));
    assert_eq!(status, 200);
    assert!(page.contains("<title>A shiny_prerendered tutorial</title>"), "{page}");
    assert!(!page.contains("output$square"), "the server chunk stays on the server");

    let mut browser = Page::open(&valve.url).await;
    let first = browser.ask(json!({"op": "eval", "js": output_with("square: 9")})).await;
    assert!(first["value"].as_str().unwrap().starts_with("square: 9 (worker "), "{first}");
    browser.ask(json!({"op": "eval", "js": "$('#n').data('ionRangeSlider').update({ from: 7 }); true"})).await;
    browser.ask(json!({"op": "eval", "js": output_with("square: 49")})).await;
    browser.close().await;
    // Browsers and workers come and go; the document is not rendered again.
    assert_eq!(renders(&log), 1);
}

#[test]
fn a_document_that_fails_to_render_stops_valve_naming_the_file_and_knitrs_message() {
    need_rmarkdown();
    let (_tmp, dir) = copy_of("rmd_broken");
    let out = Valve::run_to_exit(&["--port", "0", "-f", dir.to_str().unwrap(), "-n", "2"], Duration::from_secs(120));
    assert_eq!(out.status.code(), Some(1), "a start-up error: {}", out.stderr);
    let doc = dir.join("broken.Rmd").display().to_string();
    assert!(
        out.stderr.contains(&format!("rendering {doc} failed: this fixture fails to knit on purpose")),
        "the file and knitr's message: {}",
        out.stderr
    );
    assert!(out.stderr.contains("Quitting from lines 8-9"), "where knitr stopped: {}", out.stderr);
    assert!(out.stderr.contains("rmarkdown::render("), "how to see more: {}", out.stderr);
    assert!(!dir.join("broken.html").exists());
}

#[test]
fn a_document_without_a_shiny_runtime_is_refused_saying_what_to_add() {
    let tmp = tempfile::tempdir().unwrap();
    let doc = tmp.path().join("notes.Rmd");
    std::fs::write(&doc, "---\ntitle: Notes\noutput: html_document\n---\n\nJust text.\n").unwrap();
    let out = Valve::run_to_exit(&["--port", "0", "-f", doc.to_str().unwrap()], Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("notes.Rmd") && out.stderr.contains("add `runtime: shiny`"), "{}", out.stderr);
    std::fs::write(&doc, "---\ntitle: [Notes\nruntime: shiny\n---\n").unwrap();
    let out = Valve::run_to_exit(&["--port", "0", "-f", doc.to_str().unwrap()], Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("cannot read the YAML front matter of") && out.stderr.contains("line"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_changed_document_is_rendered_again_on_reload_and_a_broken_one_leaves_the_old_one_serving() {
    need_rmarkdown();
    let (_tmp, dir) = tutorial_noting_renders();
    let valve = Valve::start(&["-f", dir.to_str().unwrap(), "--no-access-log"]);
    let log = valve.home("rmd_tutorial").join("renders.log");
    assert_eq!(renders(&log), 1);
    let doc = dir.join("tutorial.Rmd");
    let text = std::fs::read_to_string(&doc).unwrap();

    // Nothing changed (valve's own render wrote tutorial.html): no new generation.
    valve.signal(libc::SIGHUP);
    valve.wait_for_log("unchanged=1", Duration::from_secs(10));
    assert_eq!(renders(&log), 1);

    std::fs::write(&doc, text.replace("A shiny_prerendered tutorial", "A tutorial, edited")).unwrap();
    valve.signal(libc::SIGHUP);
    wait_until("the edited document served", Duration::from_secs(60), || {
        get(&valve.get("/")).1.contains("<title>A tutorial, edited</title>")
    });
    assert_eq!(renders(&log), 2, "rendered again, once");

    std::fs::write(&doc, format!("{text}\n```{{r}}\nstop(\"broken on reload\")\n```\n")).unwrap();
    valve.signal(libc::SIGHUP);
    valve.wait_for_log("broken on reload", Duration::from_secs(60));
    valve.wait_for_log("the previous version keeps serving", Duration::from_secs(10));
    let (status, page) = get(&valve.get("/"));
    assert_eq!(status, 200);
    assert!(page.contains("<title>A tutorial, edited</title>"), "the old generation serves on");
}

#[test]
fn a_site_serves_both_kinds_of_document_and_check_names_their_kinds() {
    need_rmarkdown();
    let site = tempfile::tempdir().unwrap();
    for (name, to) in [("rmd_shiny", "live"), ("rmd_tutorial", "tutorial")] {
        std::fs::create_dir(site.path().join(to)).unwrap();
        for entry in std::fs::read_dir(fixture(name)).unwrap().flatten() {
            std::fs::copy(entry.path(), site.path().join(to).join(entry.file_name())).unwrap();
        }
    }
    std::fs::create_dir(site.path().join("notes")).unwrap();
    std::fs::write(site.path().join("notes/INDEX.rmd"), "---\ntitle: static\n---\n").unwrap();
    let site_dir = site.path().to_str().unwrap();

    let out = Command::new(valve_bin()).args(["--site", site_dir, "--check"]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}{}", String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("live at /live (shiny-rmd,"), "{said}");
    assert!(said.contains("tutorial at /tutorial (shiny-prerendered,"), "{said}");
    assert!(!said.contains("notes"), "a static document is no app: {said}");

    let valve = Valve::start(&["--site", site_dir, "--no-access-log"]);
    valve.wait_for_log("notes/INDEX.rmd has no `runtime: shiny`", Duration::from_secs(5));
    let (_, listing) = get(&valve.get("/"));
    assert!(listing.contains("live</a> <small>interactive document"), "the site's listing: {listing}");
    let (status, page) = get(&valve.get("/live/"));
    assert_eq!(status, 200);
    assert!(page.contains("__reactivedoc__"), "{page}");
    let (status, page) = get(&valve.get("/tutorial/"));
    assert_eq!(status, 200);
    assert!(page.contains("<title>A shiny_prerendered tutorial</title>"), "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_preload_documents_are_served_by_forks_of_one_parent() {
    need_rmarkdown();
    let (_tmp, dir) = tutorial_noting_renders();
    let valve = Valve::start(&["-f", dir.to_str().unwrap(), "--preload", "-n", "2", "--n-min", "2", "--no-access-log"]);
    let log = valve.home("rmd_tutorial").join("renders.log");
    assert_eq!(renders(&log), 1);
    let parent = valve.preload_parent().expect("a preload parent");
    assert_eq!(crate::harness::children(parent).len(), 2, "two forks of the parent");
    let mut browser = Page::open(&valve.url).await;
    let answer = browser.ask(json!({"op": "eval", "js": output_with("square: 9")})).await;
    let text = answer["value"].as_str().unwrap_or_default().to_string();
    let pid: u32 = text.split("worker ").nth(1).and_then(|r| r.trim_end_matches(')').parse().ok()).unwrap_or(0);
    assert!(crate::harness::children(parent).contains(&pid), "a fork answered: {text}");
    browser.close().await;

    let (_tmp, live) = copy_of("rmd_shiny");
    let valve = Valve::start(&["-f", live.to_str().unwrap(), "--preload", "--no-access-log"]);
    assert!(valve.preload_parent().is_some());
    let mut browser = Page::open(&valve.url).await;
    browser
        .ask(json!({"op": "eval", "js": wait_js("document.querySelector('#name.shiny-bound-input')", "true")}))
        .await;
    browser.close().await;
}

/// Quarto documents with `server: shiny` (the Quarto CLI is not in Debian):
/// found as documents are, named by `--check`, and without `quarto` a
/// start-up error naming the file and saying to install Quarto.
#[test]
fn a_quarto_document_with_server_shiny_is_detected_and_without_quarto_valve_says_to_install_it() {
    let site = tempfile::tempdir().unwrap();
    std::fs::create_dir(site.path().join("dash")).unwrap();
    std::fs::write(
        site.path().join("dash/Index.qmd"),
        "---\ntitle: A dashboard\nserver:\n  type: shiny\n---\n\n```{r}\nsliderInput('n', 'n', 1, 10, 3)\n```\n",
    )
    .unwrap();
    std::fs::create_dir(site.path().join("notes")).unwrap();
    std::fs::write(site.path().join("notes/notes.qmd"), "---\ntitle: static\n---\n").unwrap();
    let dash = site.path().join("dash");

    let out = Command::new(valve_bin()).args(["-f", dash.to_str().unwrap(), "--check"]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && said.contains("dash at / (quarto-shiny, 1-3 workers)"), "{said}");
    // The manual's example (docs/src/documents.md).
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/quarto");
    let out = Command::new(valve_bin()).args(["-f", example.to_str().unwrap(), "--check"]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && said.contains("quarto at / (quarto-shiny, 1-3 workers)"), "{said}");
    let out = Command::new(valve_bin()).args(["--site", site.path().to_str().unwrap(), "--check"]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("dash at /dash (quarto-shiny,") && !said.contains("notes at"), "{said}");
    let out = Command::new(valve_bin()).args(["-f", site.path().join("notes").to_str().unwrap()]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("notes.qmd is a Quarto document without `server: shiny`"), "{said}");

    // No `quarto` on this PATH (an empty folder) and no QUARTO_PATH.
    let empty = tempfile::tempdir().unwrap();
    let out = Valve::run_to_exit_with_env(
        &["-f", dash.to_str().unwrap(), "--port", "0"],
        &[("PATH", empty.path().to_str().unwrap()), ("QUARTO_PATH", "")],
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(1), "a start-up error: {}", out.stderr);
    assert!(out.stderr.contains("Index.qmd is a Quarto document"), "names the file: {}", out.stderr);
    assert!(out.stderr.contains("`quarto` is not on the PATH"), "{}", out.stderr);
    assert!(out.stderr.contains("install Quarto (https://quarto.org/docs/get-started/)"), "{}", out.stderr);
}
