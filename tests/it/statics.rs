//! Static content: a folder with an `index.html` and no R, served
//! by valve itself beside R apps, in a `--site`, as `static = "dir"` in a
//! config file, as `-f DIR`, and across reloads; never an R process for it.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use reqwest::header::HeaderMap;

use crate::harness::{client, fixture, shiny_example, wait_until, Valve};

/// Every byte value, repeated: a file whose slices are easy to check.
fn data_bin() -> Vec<u8> {
    (0..3000u32).map(|i| (i % 251) as u8).collect()
}

/// A static folder at `dir`, with a file outside it (`outside/secret.txt`)
/// that two symlinks in it point at.
fn make_static_folder(dir: &Path, outside: &Path) {
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::create_dir_all(dir.join("empty")).unwrap();
    std::fs::write(dir.join("index.html"), "<!doctype html><title>Docs</title><h1>Docs</h1>\n").unwrap();
    std::fs::write(dir.join("style.css"), "h1 { color: teal }\n").unwrap();
    std::fs::write(dir.join("app.js"), "console.log('docs');\n").unwrap();
    std::fs::write(dir.join("logo.svg"), "<svg xmlns=\"http://www.w3.org/2000/svg\"/>\n").unwrap();
    std::fs::write(dir.join("data.json"), "{\"a\": 1}\n").unwrap();
    std::fs::write(dir.join("report.pdf"), "%PDF-1.4\n").unwrap();
    std::fs::write(dir.join("data.bin"), data_bin()).unwrap();
    std::fs::write(dir.join("sub/index.html"), "<p>sub</p>\n").unwrap();
    std::fs::write(dir.join(".hidden"), "TOP SECRET hidden\n").unwrap();
    std::fs::create_dir_all(outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "TOP SECRET outside\n").unwrap();
    std::os::unix::fs::symlink(outside.join("secret.txt"), dir.join("leak.txt")).unwrap();
    std::os::unix::fs::symlink(outside, dir.join("elsewhere")).unwrap();
    std::os::unix::fs::symlink(dir.join("style.css"), dir.join("alias.css")).unwrap();
}

/// A site: `api` (the test API), `hello` (Shiny's 01_hello) and `docs` (static).
fn site() -> (tempfile::TempDir, PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let site = root.path().join("site");
    std::fs::create_dir_all(site.join("api")).unwrap();
    std::fs::copy(fixture("api.R"), site.join("api/plumber.R")).unwrap();
    std::os::unix::fs::symlink(shiny_example("01_hello"), site.join("hello")).unwrap();
    make_static_folder(&site.join("docs"), &root.path().join("outside"));
    (root, site)
}

async fn get(url: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut req = client().get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

fn header(h: &HeaderMap, name: &str) -> String {
    h.get(name).map(|v| v.to_str().unwrap().to_string()).unwrap_or_default()
}

/// One request written as given (no client tidies its path): status and body.
fn raw(valve: &Valve, method: &str, path: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(valve.url.trim_start_matches("http://")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "{method} {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut all = Vec::new();
    let _ = s.read_to_end(&mut all);
    let text = String::from_utf8_lossy(&all).into_owned();
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, text)
}

/// The R processes of `valve` that run in `dir` (their working directory).
fn r_processes_in(valve: &Valve, dir: &Path) -> usize {
    let dir = std::fs::canonicalize(dir).unwrap();
    valve
        .r_processes()
        .into_iter()
        .filter(|p| std::fs::read_link(format!("/proc/{p}/cwd")).is_ok_and(|c| c == dir))
        .count()
}

/// Peak memory of a process (VmHWM), in bytes.
fn peak_memory(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

#[tokio::test(flavor = "multi_thread")]
async fn a_static_folder_in_a_site_is_served_by_valve_beside_an_api_and_a_shiny_app_with_no_r() {
    let (_root, site) = site();
    let valve = Valve::start(&["--site", site.to_str().unwrap(), "--n-min", "1"]);
    let docs = |p: &str| valve.get(&format!("/docs{p}"));

    // The R apps serve as before.
    assert_eq!(get(&valve.get("/api/pid"), &[]).await.status(), 200);
    assert_eq!(get(&valve.get("/hello/"), &[]).await.status(), 200);

    // Content types, and what every file answer carries.
    for (path, want) in [
        ("/", "text/html; charset=utf-8"),
        ("/index.html", "text/html; charset=utf-8"),
        ("/style.css", "text/css; charset=utf-8"),
        ("/app.js", "text/javascript; charset=utf-8"),
        ("/logo.svg", "image/svg+xml"),
        ("/data.json", "application/json"),
        ("/report.pdf", "application/pdf"),
        ("/data.bin", "application/octet-stream"),
        ("/sub/", "text/html; charset=utf-8"),
        ("/alias.css", "text/css; charset=utf-8"),
    ] {
        let resp = get(&docs(path), &[]).await;
        assert_eq!(resp.status(), 200, "{path}");
        let h = resp.headers().clone();
        assert_eq!(header(&h, "content-type"), want, "{path}");
        assert_eq!(header(&h, "accept-ranges"), "bytes", "{path}");
        assert_eq!(header(&h, "cache-control"), "no-cache", "{path}");
        assert!(header(&h, "etag").starts_with('"'), "{path}: {h:?}");
        assert!(header(&h, "last-modified").ends_with(" GMT"), "{path}: {h:?}");
        let len: usize = header(&h, "content-length").parse().unwrap();
        assert_eq!(resp.bytes().await.unwrap().len(), len, "{path}");
    }
    let page = get(&docs("/"), &[]).await.text().await.unwrap();
    assert!(page.contains("<h1>Docs</h1>"), "{page}");

    // ETag and Last-Modified: an unchanged file is a 304, without a body.
    let first = get(&docs("/style.css"), &[]).await;
    let (etag, modified) = (header(first.headers(), "etag"), header(first.headers(), "last-modified"));
    let again = get(&docs("/style.css"), &[("if-none-match", &etag)]).await;
    assert_eq!(again.status(), 304);
    assert_eq!(header(again.headers(), "etag"), etag);
    assert!(again.bytes().await.unwrap().is_empty());
    assert_eq!(get(&docs("/style.css"), &[("if-modified-since", &modified)]).await.status(), 304);
    assert_eq!(get(&docs("/style.css"), &[("if-none-match", "\"stale\"")]).await.status(), 200);
    let long_ago = "Thu, 01 Jan 1970 00:00:01 GMT";
    assert_eq!(get(&docs("/style.css"), &[("if-modified-since", long_ago)]).await.status(), 200);

    // Range: one range is 206 with exactly those bytes; past the end is 416.
    let bytes = data_bin();
    for (range, from, to) in [("bytes=0-99", 0, 100), ("bytes=2990-", 2990, 3000), ("bytes=-10", 2990, 3000)] {
        let resp = get(&docs("/data.bin"), &[("range", range)]).await;
        assert_eq!(resp.status(), 206, "{range}");
        assert_eq!(header(resp.headers(), "content-range"), format!("bytes {from}-{}/3000", to - 1));
        assert_eq!(resp.bytes().await.unwrap().as_ref(), &bytes[from..to], "{range}");
    }
    let resp = get(&docs("/data.bin"), &[("range", "bytes=5000-")]).await;
    assert_eq!(resp.status(), 416);
    assert_eq!(header(resp.headers(), "content-range"), "bytes */3000");
    let resp = get(&docs("/data.bin"), &[("range", "bytes=0-1,5-6")]).await;
    assert_eq!((resp.status().as_u16(), resp.bytes().await.unwrap().len()), (200, 3000), "several ranges: all");
    let resp = get(&docs("/data.bin"), &[("range", "bytes=0-9"), ("if-range", "\"old\"")]).await;
    assert_eq!(resp.status(), 200, "a range for another version of the file: all of it");

    // HEAD: the headers alone; other methods: 405 naming the two.
    let head = client().head(docs("/data.bin")).send().await.unwrap();
    assert_eq!((head.status().as_u16(), header(head.headers(), "content-length")), (200, "3000".to_string()));
    assert!(head.bytes().await.unwrap().is_empty());
    let post = client().post(docs("/")).body("x").send().await.unwrap();
    assert_eq!(post.status(), 405);
    assert_eq!(header(post.headers(), "allow"), "GET, HEAD");
    assert!(post.text().await.unwrap().contains("\"error\""), "valve's JSON error");

    // Folders: the slash is added; no listing, ever.
    for (path, location) in [("/docs", "/docs/"), ("/docs/sub", "/docs/sub/"), ("/docs/sub?x=1", "/docs/sub/?x=1")] {
        let resp = get(&valve.get(path), &[]).await;
        assert_eq!((resp.status().as_u16(), header(resp.headers(), "location")), (307, location.into()), "{path}");
    }
    let empty = get(&docs("/empty/"), &[]).await;
    assert_eq!(empty.status(), 404, "a folder without index.html is not listed");
    assert!(empty.text().await.unwrap().contains("\"error\""));

    // Every way out of the folder, or into what it hides, is refused.
    for path in [
        "/docs/../api/plumber.R",
        "/docs/%2e%2e/api/plumber.R",
        "/docs/%2E%2E%2Fapi%2Fplumber.R",
        "/docs/..%5capi%5cplumber.R",
        "/docs/sub/../../api/plumber.R",
        "/docs/index.html%00.txt",
        "/docs/.hidden",
        "/docs/%2ehidden",
        "/docs/leak.txt",
        "/docs/elsewhere/secret.txt",
        "/docs//etc/passwd",
        "/docs/missing.html",
    ] {
        let (status, text) = raw(&valve, "GET", path);
        assert!(matches!(status, 400 | 404), "{path}: {text}");
        assert!(!text.contains("TOP SECRET") && !text.contains("@get"), "{path}: {text}");
    }
    let (status, text) = raw(&valve, "GET", "/docs/a\\b");
    assert!(matches!(status, 400 | 404), "a backslash: {text}");

    // A large file streams (valve never holds it whole), and a range deep in it is cheap.
    let big = site.join("docs/big.bin");
    std::fs::File::create(&big).unwrap().set_len(1 << 30).unwrap();
    let before = peak_memory(valve.pid());
    let mut resp = get(&docs("/big.bin"), &[]).await;
    assert_eq!(header(resp.headers(), "content-length"), (1u64 << 30).to_string());
    let mut got = 0u64;
    while let Some(chunk) = resp.chunk().await.unwrap() {
        got += chunk.len() as u64;
    }
    assert_eq!(got, 1 << 30);
    let grew = peak_memory(valve.pid()).saturating_sub(before);
    assert!(grew < 128 << 20, "serving 1 GiB took {} MiB of valve's memory", grew >> 20);
    let tail = get(&docs("/big.bin"), &[("range", "bytes=-5")]).await;
    assert_eq!(tail.bytes().await.unwrap().as_ref(), &[0u8; 5]);

    // The site's page, the status and the metrics show it, with no worker.
    let listing = get(&valve.get("/"), &[]).await.text().await.unwrap();
    assert!(listing.contains("href=\"/docs/\">docs</a> <small>static content</small>"), "{listing}");
    let status: serde_json::Value =
        valve.admin_client().get(valve.admin("/__valve__/status")).send().await.unwrap().json().await.unwrap();
    let app = status["apps"].as_array().unwrap().iter().find(|a| a["name"] == "docs").unwrap().clone();
    assert_eq!(
        (&app["kind"], &app["ready"], &app["workers"]),
        (&"static".into(), &true.into(), &serde_json::json!([]))
    );
    assert_eq!((&app["pool"]["n_min"], &app["pool"]["n_max"]), (&0.into(), &0.into()));
    let metrics =
        valve.admin_client().get(valve.admin("/__valve__/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("valve_requests_total{app=\"docs\",method=\"GET\",status=\"200\"}"), "{metrics}");
    assert!(metrics.contains("valve_requests_total{app=\"docs\",method=\"GET\",status=\"304\"}"), "{metrics}");
    assert!(metrics.contains("valve_workers_max{app=\"docs\"} 0"), "{metrics}");
    let ready = valve.ready["apps"].as_array().unwrap().iter().find(|a| a["name"] == "docs").unwrap().clone();
    assert_eq!(
        (&ready["kind"], &ready["n_max"], &ready["docs"]),
        (&"static".into(), &0.into(), &serde_json::Value::Null)
    );
    assert_eq!(valve.ready["max_workers"], 6, "the R apps' --n-max added up: the static one adds none");

    // No R process for it: every R worker valve runs is one of the R apps'
    // (how many those have is the pool's business: a worker still busy with
    // its start-up may make a new browser's page start another), none runs
    // in the folder.
    let fresh: serde_json::Value =
        valve.admin_client().get(valve.admin("/__valve__/status")).send().await.unwrap().json().await.unwrap();
    let r_apps: Vec<u64> = fresh["apps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["name"] != "docs")
        .flat_map(|a| a["workers"].as_array().unwrap().iter().filter_map(|w| w["pid"].as_u64()))
        .collect();
    for pid in valve.workers() {
        assert!(r_apps.contains(&(pid as u64)), "worker {pid} belongs to an R app: {fresh}");
    }
    assert_eq!(r_processes_in(&valve, &site.join("docs")), 0);
}

/// A config file serving the API at /api and `docs` (static) at `prefix`.
fn config(dir: &Path, with_docs: bool) -> PathBuf {
    let mut text =
        format!("[[app]]\nname = \"api\"\npath = \"/api\"\nfile = {:?}\nn_min = 1\nn_max = 1\n", fixture("api.R"));
    if with_docs {
        text.push_str("\n[[app]]\nname = \"manual\"\npath = \"/manual\"\nstatic = \"docs\"\n");
    }
    let path = dir.join("valve.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread")]
async fn a_static_folder_in_a_config_file_is_checked_and_served_under_its_path() {
    let dir = tempfile::tempdir().unwrap();
    make_static_folder(&dir.path().join("docs"), &dir.path().join("outside"));
    let path = config(dir.path(), true);
    let out = Command::new(crate::harness::valve_bin())
        .args(["--config", path.to_str().unwrap(), "--check"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        said.contains("manual at /manual (static, no R)") && said.contains("api at /api (plumber-file, 1-1 workers)"),
        "{said}"
    );

    let valve = Valve::start(&["--config", path.to_str().unwrap()]);
    let resp = get(&valve.get("/manual/"), &[]).await;
    assert_eq!(header(resp.headers(), "content-type"), "text/html; charset=utf-8");
    assert!(resp.text().await.unwrap().contains("<h1>Docs</h1>"));
    let css = get(&valve.get("/manual/style.css"), &[]).await;
    let etag = header(css.headers(), "etag");
    assert_eq!(get(&valve.get("/manual/style.css"), &[("if-none-match", &etag)]).await.status(), 304);
    let moved = get(&valve.get("/manual/sub"), &[]).await;
    assert_eq!(header(moved.headers(), "location"), "/manual/sub/", "the slash, under the prefix");
    assert_eq!(raw(&valve, "GET", "/manual/../api/pid").0, 404, "no way out through the prefix");
    assert_eq!(get(&valve.get("/api/pid"), &[]).await.status(), 200);
    assert_eq!(valve.workers().len(), 1, "the API's one worker: {:?}", valve.r_processes());

    // A `static` that cannot be served is a --check error with its place.
    std::fs::write(&path, "[[app]]\nname = \"manual\"\nstatic = \"nowhere\"\n").unwrap();
    let out = Valve::run_to_exit(&["--config", path.to_str().unwrap(), "--check"], Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(2));
    let want = format!("{}:3:10: static = \"nowhere\": static folder not found", path.display());
    assert!(out.stderr.contains(&want), "{want} in {}", out.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_static_folder_alone_with_f_runs_no_r_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let docs = dir.path().join("docs");
    make_static_folder(&docs, &dir.path().join("outside"));
    let valve = Valve::start(&["-f", docs.to_str().unwrap()]);
    assert_eq!((&valve.ready["apps"][0]["kind"], &valve.ready["workers"]), (&"static".into(), &0.into()));
    assert_eq!(get(&valve.get("/"), &[]).await.status(), 200);
    assert_eq!(get(&valve.get("/sub"), &[]).await.headers()["location"], "/sub/");
    assert!(matches!(raw(&valve, "GET", "//evil.example/").0, 400 | 404), "never a redirect off the site");
    assert_eq!(get(&valve.get("/__valve__/readyz"), &[]).await.status(), 200, "ready at once");
    assert!(valve.r_processes().is_empty(), "{:?}", valve.r_processes());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reload_adds_and_removes_a_static_app_and_its_edits_need_none() {
    let dir = tempfile::tempdir().unwrap();
    make_static_folder(&dir.path().join("docs"), &dir.path().join("outside"));
    let path = config(dir.path(), false);
    let valve = Valve::start(&["--config", path.to_str().unwrap()]);
    let workers = valve.r_processes();
    assert_eq!(get(&valve.get("/manual/"), &[]).await.status(), 404);
    let reload = || async {
        let resp = valve.admin_client().post(valve.admin("/__valve__/reload")).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        resp.json::<serde_json::Value>().await.unwrap()
    };

    config(dir.path(), true);
    let plan = reload().await;
    assert_eq!(plan["apps"]["added"], serde_json::json!(["manual"]), "{plan}");
    valve.wait_for_log("app added: it serves", Duration::from_secs(10));
    assert_eq!(get(&valve.get("/manual/"), &[]).await.status(), 200);

    // An edit is served at once, with a new ETag, and is no change to reload.
    let before = header(get(&valve.get("/manual/"), &[]).await.headers(), "etag");
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(dir.path().join("docs/index.html"), "<h1>Docs, edited</h1>\n").unwrap();
    let resp = get(&valve.get("/manual/"), &[("if-none-match", &before)]).await;
    assert_eq!(resp.status(), 200, "the old tag no longer matches");
    assert!(resp.text().await.unwrap().contains("edited"));
    let plan = reload().await;
    assert_eq!(plan["apps"]["unchanged"], serde_json::json!(["api", "manual"]), "{plan}");

    config(dir.path(), false);
    let plan = reload().await;
    assert_eq!(plan["apps"]["removed"], serde_json::json!(["manual"]), "{plan}");
    wait_until("the static app to be gone", Duration::from_secs(10), || raw(&valve, "GET", "/manual/").0 == 404);
    assert_eq!(get(&valve.get("/api/pid"), &[]).await.status(), 200);
    assert_eq!(valve.r_processes(), workers, "the API's worker, the same one, and no other R");
}

#[test]
fn the_readmes_example_site_holds_an_api_and_static_docs() {
    let site = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/site");
    let out =
        Command::new(crate::harness::valve_bin()).args(["--site", site.to_str().unwrap(), "--check"]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("api at /api (plumber-dir, 1-3 workers); docs at /docs (static, no R)"), "{said}");
    // As the manual runs it (docs/src/static.md): a path relative to where valve starts (the
    // repository, the tests' working directory), the API in its private view.
    let valve = crate::harness::Valve::start(&["--site", "examples/site", "--n-min", "1", "-n", "1"]);
    let (status, body) = crate::rmarkdown::get(&valve.get("/api/echo?msg=relative"));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("relative"), "{body}");
}
