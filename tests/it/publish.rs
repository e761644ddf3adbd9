//! Publishing: the real rsconnect (Debian's 0.8.29) publishes to the real
//! valve, which serves what it published beside its configured apps,
//! redeploys without failing a request, refuses what it must, rolls back,
//! and serves it all again after a restart; and the v1 calls of rsconnect
//! 1.x, sent as it sends them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::{client, need_r_packages, valve_bin, wait_until, Valve};

/// A new key from `valve publish-key NAME`: (key, line for the keys file).
pub(crate) fn new_key(name: &str) -> (String, String) {
    let out = Command::new(valve_bin()).args(["publish-key", name]).output().expect("valve runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(lines.len(), 2, "the key, then its line: {text}");
    assert!(lines[1].starts_with(&format!("{name} sha256:")), "{text}");
    (lines[0].to_string(), lines[1].to_string())
}

/// A folder holding one file.
fn folder(parent: &Path, name: &str, file: &str, text: &str) -> PathBuf {
    let dir = parent.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(file), text).unwrap();
    dir
}

/// `rsconnect::deployApp()` of `app_dir` as `name`, from an R with a
/// private home and config folder (and `r_libs` on its library path):
/// (whether it succeeded, what it printed).
pub(crate) fn deploy_app(
    home: &Path,
    admin: &str,
    key: &str,
    app_dir: &Path,
    name: &str,
    r_libs: Option<&Path>,
) -> (bool, String) {
    let script = home.join("deploy.R");
    std::fs::write(
        &script,
        r#"args <- commandArgs(TRUE)
suppressPackageStartupMessages(library(rsconnect))
rsconnect::addServer(paste0(args[1], "/__api__"), name = "valve", quiet = TRUE)
rsconnect::connectApiUser(account = "ci", server = "valve", apiKey = args[2], quiet = TRUE)
ok <- rsconnect::deployApp(args[3], appName = args[4], server = "valve", account = "ci",
                           launch.browser = FALSE, forceUpdate = TRUE, lint = FALSE)
cat("valve-test-deployed:", ok, "\n")
"#,
    )
    .unwrap();
    let mut cmd = Command::new("Rscript");
    cmd.arg(&script)
        .args([admin, key, app_dir.to_str().unwrap(), name])
        .env("HOME", home)
        .env("R_USER_CONFIG_DIR", home.join("config"))
        .env("R_USER_DATA_DIR", home.join("data"))
        .env("R_USER_CACHE_DIR", home.join("cache"))
        .env_remove("R_LIBS_USER");
    if let Some(libs) = r_libs {
        cmd.env("R_LIBS", libs);
    }
    let out = cmd.output().expect("Rscript runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!(
        "[rsconnect {name}] {}",
        text.lines().filter(|l| !l.contains("repository")).collect::<Vec<_>>().join("\n[rsconnect] ")
    );
    (text.contains("valve-test-deployed: TRUE"), text)
}

pub(crate) async fn get(url: &str) -> (u16, String) {
    match crate::harness::get_url(url).send().await {
        Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
        Err(e) => (0, e.to_string()),
    }
}

/// A gzipped tar of raw entries (any path goes in, however bad).
pub(crate) fn tarball(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    for (path, data) in entries {
        let mut h = tar::Header::new_old();
        h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        h.set_cksum();
        b.append(&h, *data).unwrap();
    }
    b.into_inner().unwrap().finish().unwrap()
}

/// Follows a task as rsconnect 1.x does: from the last line read, waiting up
/// to a second for more; returns its last answer and every line.
pub(crate) async fn follow(api: &str, auth: &str, task_id: &str) -> (serde_json::Value, Vec<String>) {
    let (mut first, mut lines) = (0, Vec::new());
    for _ in 0..100 {
        let t: serde_json::Value = client()
            .get(format!("{api}/v1/tasks/{task_id}?first={first}&wait=1"))
            .header("Authorization", auth)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        lines.extend(t["output"].as_array().unwrap().iter().map(|l| l.as_str().unwrap().to_string()));
        first = t["last"].as_u64().unwrap();
        if t["finished"] == true {
            return (t, lines);
        }
    }
    panic!("task {task_id} did not end: {lines:?}");
}

const API_V1: &str = "#* @get /version\nfunction() list(version = 1)\n";

const SHINY: &str = r#"library(shiny)
ui <- fluidPage(titlePanel("published with rsconnect"), textOutput("x"))
server <- function(input, output) output$x <- renderText("hi")
shinyApp(ui, server)
"#;

#[tokio::test(flavor = "multi_thread")]
async fn rsconnect_publishes_redeploys_without_a_failed_request_refuses_and_rolls_back_and_a_restart_keeps_it() {
    need_r_packages(&["rsconnect", "plumber", "shiny"]);
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let (key, line) = new_key("ci");
    std::fs::write(w.join("keys"), format!("# who may publish\n{line}\n")).unwrap();
    let docs = folder(w, "docs", "index.html", "<h1>configured docs</h1>");
    std::fs::write(
        w.join("valve.toml"),
        format!(
            "publish_dir = \"{}\"\npublish_keys_file = \"{}\"\npublish_keep = 3\n\n[[app]]\nname = \"docs\"\npath = \"/docs\"\nstatic = \"{}\"\n",
            w.join("published").display(),
            w.join("keys").display(),
            docs.display()
        ),
    )
    .unwrap();
    let config = w.join("valve.toml");
    let valve = Valve::start(&["--config", config.to_str().unwrap()]);
    let admin = valve.admin_url();
    let home = w.join("home");
    std::fs::create_dir_all(&home).unwrap();

    // No key, or one valve does not know: 401, with a short JSON body.
    for auth in [None, Some("Key not-a-key-valve-knows-at-all"), Some(&*format!("Bearer {key}"))] {
        let mut req = client().get(format!("{admin}/__api__/users/current"));
        if let Some(a) = auth {
            req = req.header("Authorization", a);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 401, "{auth:?}");
        let body: serde_json::Value = resp.json().await.unwrap();
        assert!(body["error"].as_str().unwrap().contains("Authorization: Key"), "{body}");
    }
    // The publishing API is not on the main port.
    let (code, _) = get(&valve.get("/__api__/users/current")).await;
    assert_eq!(code, 404, "publishing is on the admin address, not the public port");

    // deployApp() publishes a plumber API and a Shiny app; each answers at its URL.
    let api = folder(w, "api", "plumber.R", API_V1);
    let (ok, said) = deploy_app(&home, &admin, &key, &api, "api", None);
    assert!(ok, "{said}");
    for step in ["Packages: all", "switched", "successfully deployed to"] {
        assert!(said.contains(step), "the task's log reaches the client's console: {step}: {said}");
    }
    assert_eq!(get(&valve.get("/api/version")).await, (200, "{\"version\":[1]}".into()));
    let shiny = folder(w, "shinyapp", "app.R", SHINY);
    let (ok, said) = deploy_app(&home, &admin, &key, &shiny, "hello-shiny", None);
    assert!(ok, "{said}");
    let (code, page) = get(&valve.get("/hello-shiny/")).await;
    assert_eq!(code, 200, "{page}");
    assert!(page.contains("published with rsconnect"), "{page}");
    assert_eq!(get(&valve.get("/docs/")).await.0, 200, "the configured app still serves");

    // A second deployApp() of a changed API switches under steady load, failing no request.
    std::fs::write(api.join("plumber.R"), API_V1.replace("version = 1", "version = 2")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (served, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut load = Vec::new();
    for _ in 0..4 {
        let (stop, served, failed, url) = (stop.clone(), served.clone(), failed.clone(), valve.get("/api/version"));
        load.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            let started = Instant::now();
            while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(300) {
                match get(&url).await {
                    (200, body) => {
                        served.fetch_add(1, Ordering::Relaxed);
                        if seen.last() != Some(&body) {
                            seen.push(body);
                        }
                    }
                    (code, body) => {
                        eprintln!("failed during the redeploy: {code} {body}");
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            seen
        }));
    }
    wait_until("the load to be served", Duration::from_secs(10), || served.load(Ordering::Relaxed) > 20);
    let (home2, admin2, key2, api2) = (home.clone(), admin.clone(), key.clone(), api.clone());
    let (ok, said) =
        tokio::task::spawn_blocking(move || deploy_app(&home2, &admin2, &key2, &api2, "api", None)).await.unwrap();
    let before = served.load(Ordering::Relaxed);
    wait_until("requests after the switch", Duration::from_secs(10), || served.load(Ordering::Relaxed) > before + 20);
    stop.store(true, Ordering::Relaxed);
    let mut orders = Vec::new();
    for l in load {
        orders.push(l.await.unwrap());
    }
    assert!(ok, "{said}");
    assert_eq!(failed.load(Ordering::Relaxed), 0, "no request failed while the new version took over");
    for seen in &orders {
        assert_eq!(seen.last().map(String::as_str), Some("{\"version\":[2]}"), "the new version serves: {seen:?}");
        let after_switch: Vec<&String> = seen.iter().skip_while(|s| !s.contains("[2]")).collect();
        assert!(after_switch.iter().all(|s| s.contains("[2]")), "once switched, never back: {seen:?}");
    }
    assert_eq!(get(&valve.get("/api/version")).await, (200, "{\"version\":[2]}".into()));

    // A bundle needing a package valve's R lacks fails in the client, naming it; the old version serves.
    let lib = w.join("client-lib");
    let pkg = folder(w, "valvenothere", "DESCRIPTION", "Package: valvenothere\nVersion: 0.0.1\nTitle: Only the client has it\nDescription: Only the client has it.\nLicense: MIT\nAuthors@R: person(\"a\", \"b\", email = \"a@b.c\", role = c(\"aut\", \"cre\"))\n");
    std::fs::write(pkg.join("NAMESPACE"), "export(hello)\n").unwrap();
    folder(&pkg, "R", "hello.R", "hello <- function() 1\n");
    std::fs::create_dir_all(&lib).unwrap();
    let built = Command::new("R")
        .args(["CMD", "INSTALL", "-l", lib.to_str().unwrap(), pkg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    std::fs::write(
        api.join("plumber.R"),
        API_V1.replace("list(version = 1)", "list(version = valvenothere::hello() + 2)"),
    )
    .unwrap();
    let (ok, said) = deploy_app(&home, &admin, &key, &api, "api", Some(&lib));
    assert!(!ok, "{said}");
    assert!(said.contains("deployment failed with error") && said.contains("valvenothere 0.0.1"), "{said}");
    assert!(said.contains("nothing changed"), "{said}");
    assert_eq!(get(&valve.get("/api/version")).await, (200, "{\"version\":[2]}".into()), "the old version serves");

    // A bundle with a path that climbs out of its folder is refused, and nothing of it is left.
    let auth = format!("Key {key}");
    let apps: serde_json::Value = client()
        .get(format!("{admin}/__api__/applications?filter=name:api&count=100&offset=0"))
        .header("Authorization", &auth)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!((apps["count"].as_u64(), apps["total"].as_u64()), (Some(1), Some(1)), "{apps}");
    let id = apps["applications"][0]["id"].as_u64().unwrap();
    let published = w.join("published/api");
    let before: Vec<_> = std::fs::read_dir(&published).unwrap().flatten().map(|e| e.file_name()).collect();
    let evil = tarball(&[("manifest.json", br#"{"metadata":{"appmode":"api"}}"#), ("../../evil.R", b"system('id')")]);
    let resp = client()
        .post(format!("{admin}/__api__/applications/{id}/upload"))
        .header("Authorization", &auth)
        .header("Content-Type", "application/x-gzip")
        .body(evil)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert!(body["error"].as_str().unwrap().contains("\"../../evil.R\" climbs out of the bundle's folder"), "{body}");
    let after: Vec<_> = std::fs::read_dir(&published).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(before, after, "nothing left of the refused bundle");
    assert!(!w.join("evil.R").exists() && !w.join("published/evil.R").exists());
    // A name that is a configured app's is refused too.
    let resp = client()
        .post(format!("{admin}/__api__/applications"))
        .header("Authorization", &auth)
        .json(&serde_json::json!({"name": "docs", "title": "mine"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 409);
    assert!(resp.text().await.unwrap().contains("belongs to the app `docs` in valve's configuration"));

    // A rollback (valve activate, against the admin address) serves the old version again.
    let cli = |args: &[&str]| {
        let out = Command::new(valve_bin())
            .args(args)
            .args(["--admin", &admin])
            .env("VALVE_ADMIN_TOKEN_FILE", valve.token_file())
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
    };
    let (code, listed) = cli(&["versions", "api"]);
    assert_eq!(code, Some(0), "{listed}");
    assert!(listed.contains("* 2 "), "version 2 is the active one: {listed}");
    let (code, said) = cli(&["activate", "api", "1"]);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("switched"), "{said}");
    assert_eq!(get(&valve.get("/api/version")).await, (200, "{\"version\":[1]}".into()), "rolled back");
    let (code, said) = cli(&["activate", "api", "9"]);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("api has no version 9"), "{said}");
    // Who may use it, set later with `valve access`: from the next request on.
    let (code, said) = cli(&["access", "api", "--users", "ann"]);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(get(&valve.get("/api/version")).await.0, 403);
    let (code, said) = cli(&["access", "api", "--open"]);
    assert_eq!((code, said.contains("open to everyone")), (Some(0), true), "{said}");
    assert_eq!(get(&valve.get("/api/version")).await.0, 200);

    // Status and metrics say what each published app serves, and by which key.
    let status = valve.status();
    let app = status["apps"].as_array().unwrap().iter().find(|a| a["name"] == "api").unwrap().clone();
    assert_eq!(
        (app["published"]["version"].as_u64(), app["published"]["activated_by"].as_str()),
        (Some(1), Some("admin"))
    );
    let metrics = get(&valve.admin("/__valve__/metrics")).await.1;
    assert!(metrics.contains("valve_published_info{app=\"hello-shiny\",version=\"1\",key=\"ci\"} 1"), "{metrics}");
    assert!(metrics.contains("valve_publish_deployments_total{app=\"api\",result=\"failed\"} 1"), "{metrics}");
    // Every call was logged with the key's name, never with the key.
    valve.wait_for_log("key=ci", Duration::from_secs(1));
    assert!(!valve.log().contains(&key), "the key itself is never logged");

    // After a restart valve serves the published apps again, at their active versions.
    drop(valve);
    let valve = Valve::start(&["--config", config.to_str().unwrap()]);
    let names: Vec<&str> = valve.ready["apps"].as_array().unwrap().iter().filter_map(|a| a["name"].as_str()).collect();
    assert_eq!(names, ["docs", "api", "hello-shiny"], "{}", valve.ready);
    assert_eq!(get(&valve.get("/api/version")).await, (200, "{\"version\":[1]}".into()));
    assert!(get(&valve.get("/hello-shiny/")).await.1.contains("published with rsconnect"));
}

/// Sends what rsconnect 1.x sends (its v1 calls, written from the API's
/// documentation) to publish static content, which needs no R at all.
#[tokio::test(flavor = "multi_thread")]
async fn the_v1_calls_publish_static_content_with_no_r_roll_back_and_set_who_may_use_it() {
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let (key, line) = new_key("laptop");
    std::fs::write(w.join("keys"), format!("{line}\n")).unwrap();
    let site = w.join("site");
    folder(&site, "front", "index.html", "<h1>front</h1>");
    let publish_addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let valve = Valve::start(&[
        "--site",
        site.to_str().unwrap(),
        "--publish-dir",
        w.join("published").to_str().unwrap(),
        "--publish-keys-file",
        w.join("keys").to_str().unwrap(),
        "--publish-addr",
        &publish_addr,
    ]);
    // The publishing API on its own address (for laptops): it alone.
    let api = format!("http://{publish_addr}/__api__");
    assert_eq!(get(&format!("http://{publish_addr}/__valve__/status")).await.0, 404);
    let auth = format!("Key {key}");
    let call = |method: reqwest::Method, path: &str| {
        client().request(method, format!("{api}{path}")).header("Authorization", &auth)
    };

    let user: serde_json::Value = call(reqwest::Method::GET, "/v1/user").send().await.unwrap().json().await.unwrap();
    assert_eq!(user["username"], "laptop");
    let none: serde_json::Value =
        call(reqwest::Method::GET, "/v1/content?name=notes").send().await.unwrap().json().await.unwrap();
    assert_eq!(none, serde_json::json!([]));
    let resp = call(reqwest::Method::POST, "/v1/content")
        .json(&serde_json::json!({"name": "notes", "title": "Team notes", "access_type": "acl"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let content: serde_json::Value = resp.json().await.unwrap();
    let guid = content["guid"].as_str().unwrap().to_string();
    assert_eq!(content["content_url"], valve.get("/notes/"));

    let manifest = br#"{"version": 1, "metadata": {"appmode": "static", "primary_html": "index.html"}, "files": {"index.html": {"checksum": "x"}}}"#;
    let mut task_output = Vec::new();
    for (n, page) in [(1, "first notes"), (2, "second notes")] {
        let html = format!("<h1>{page}</h1>");
        let bundle = tarball(&[("manifest.json", manifest), ("index.html", html.as_bytes())]);
        let resp = call(reqwest::Method::POST, &format!("/v1/content/{guid}/bundles"))
            .header("Content-Type", "application/x-tar")
            .body(bundle)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let b: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(b["id"], n.to_string());
        let resp = call(reqwest::Method::POST, &format!("/v1/content/{guid}/deploy"))
            .json(&serde_json::json!({"bundle_id": n.to_string()}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 202);
        let task_id = resp.json::<serde_json::Value>().await.unwrap()["task_id"].as_str().unwrap().to_string();
        let (done, output) = follow(&api, &auth, &task_id).await;
        task_output.extend(output);
        assert_eq!((done["code"].as_i64(), done["error"].as_str()), (Some(0), Some("")), "{done}");
        assert_eq!(get(&valve.get("/notes/")).await, (200, html));
    }
    assert!(task_output.iter().any(|l| l.contains("Static content: no R")), "{task_output:?}");
    assert!(task_output.iter().any(|l| l.contains("switched")), "{task_output:?}");
    assert!(valve.workers().is_empty(), "static content starts no R");

    let bundles: serde_json::Value =
        call(reqwest::Method::GET, &format!("/v1/content/{guid}/bundles")).send().await.unwrap().json().await.unwrap();
    let active: Vec<bool> = bundles.as_array().unwrap().iter().map(|b| b["active"].as_bool().unwrap()).collect();
    assert_eq!(active, [false, true]);
    // Deploying an earlier bundle is a rollback.
    let resp = call(reqwest::Method::POST, &format!("/v1/content/{guid}/deploy"))
        .json(&serde_json::json!({"bundle_id": "1"}))
        .send()
        .await
        .unwrap();
    let task_id = resp.json::<serde_json::Value>().await.unwrap()["task_id"].as_str().unwrap().to_string();
    let (done, _) = follow(&api, &auth, &task_id).await;
    assert_eq!(done["code"], 0, "{done}");
    let (code, body) = get(&valve.get("/notes/")).await;
    assert_eq!((code, body.contains("first notes")), (200, true), "{body}");

    // Who may use it, set later: the next request meets the allow list.
    let resp = call(reqwest::Method::PATCH, &format!("/v1/content/{guid}"))
        .json(&serde_json::json!({"allow_users": ["alice"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(get(&valve.get("/notes/")).await.0, 403);

    // A link that leads out of the bundle is refused.
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    b.append_link(&mut h, "index.html", "/etc/passwd").unwrap();
    let resp = call(reqwest::Method::POST, &format!("/v1/content/{guid}/bundles"))
        .body(b.into_inner().unwrap().finish().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    assert!(resp.text().await.unwrap().contains("leads out of the bundle's folder"));
    assert!(valve.log().contains("key=laptop"));
}

#[test]
fn a_keys_file_others_can_change_or_whose_plain_keys_they_can_read_is_refused_naming_it_and_the_fix() {
    use std::os::unix::fs::PermissionsExt;
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    folder(&w.join("site"), "front", "index.html", "<h1>front</h1>");
    let keys = w.join("keys");
    let check = |mode: u32, text: &str| {
        std::fs::write(&keys, text).unwrap();
        std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(mode)).unwrap();
        let (site, published) = (w.join("site"), w.join("published"));
        let args = [site.to_str().unwrap(), published.to_str().unwrap(), keys.to_str().unwrap()];
        let args = ["--check", "--site", args[0], "--publish-dir", args[1], "--publish-keys-file", args[2]];
        Valve::run_to_exit(&args, Duration::from_secs(30))
    };
    let (_, hashed) = new_key("ci");
    let plain = "laptop a-plain-key-long-enough-to-use-1234\n";
    let path = keys.display().to_string();
    // Anyone may change it: refused, even holding only hashes, with exit 2 as for any bad setting.
    let writable = check(0o666, &format!("{hashed}\n"));
    assert_eq!(writable.status.code(), Some(2), "{}", writable.stderr);
    assert!(
        writable.stderr.contains(&format!("publish_keys_file {path}: its mode 0666 lets other users change it"))
            && writable.stderr.contains(&format!("chmod 600 {path}")),
        "{}",
        writable.stderr
    );
    // Plain keys others may read: refused; private: used.
    let readable = check(0o644, plain);
    assert_eq!(readable.status.code(), Some(2), "{}", readable.stderr);
    assert!(readable.stderr.contains("its mode 0644 lets other users read the secret it holds"), "{}", readable.stderr);
    let private = check(0o600, plain);
    assert_eq!(private.status.code(), Some(0), "{}", private.stderr);
    // Only hashes: no secret to read, so others may.
    let hashes = check(0o644, &format!("{hashed}\n"));
    assert_eq!(hashes.status.code(), Some(0), "{}", hashes.stderr);
}
