//! Published apps kept apart and bounded, through valve's publishing API
//! (what rsconnect sends, without rsconnect): a key cannot take a
//! configured app's paths nor change another key's app; bundles of deep
//! paths are refused at their limits; a version a draining generation
//! serves stays on disk until it drains, and uploads never deployed are
//! pruned; without a private view, an app cannot read another's bundle.

use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use crate::harness::{app_dir, as_root, client, need_r_packages, wait_until, Valve};
use crate::publish::{follow, get, new_key, tarball};

/// A folder holding `valve.toml` (publishing on, with `extra` and
/// `apps`) and a keys file of `keys` (name, marker): (folder, keys by name).
pub(crate) fn site(extra: &str, apps: &str, keys: &[(&str, &str)]) -> (tempfile::TempDir, Vec<(String, String)>) {
    let dir = app_dir();
    let w = dir.path();
    let mut lines = String::new();
    let mut made = Vec::new();
    for (name, marker) in keys {
        let (key, line) = new_key(name);
        lines.push_str(&format!("{line} {marker}\n"));
        made.push((name.to_string(), key));
    }
    std::fs::write(w.join("keys"), lines).unwrap();
    std::fs::create_dir_all(w.join("docs")).unwrap();
    std::fs::write(w.join("docs/index.html"), "<h1>docs</h1>").unwrap();
    std::fs::write(
        w.join("valve.toml"),
        format!(
            "publish_dir = \"{}\"\npublish_keys_file = \"{}\"\n{extra}\n{apps}",
            w.join("published").display(),
            w.join("keys").display()
        ),
    )
    .unwrap();
    (dir, made)
}

/// A publishing call with key `key`: (status, JSON body).
pub(crate) async fn call(admin: &str, key: &str, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut req =
        client().request(method, format!("{admin}/__api__{path}")).header("Authorization", format!("Key {key}"));
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

pub(crate) async fn upload(admin: &str, key: &str, guid: &str, bundle: Vec<u8>) -> (u16, Value) {
    let resp = client()
        .post(format!("{admin}/__api__/v1/content/{guid}/bundles"))
        .header("Authorization", format!("Key {key}"))
        .body(bundle)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Creates app `name` as `key`: its guid.
pub(crate) async fn create(admin: &str, key: &str, name: &str) -> String {
    let (code, body) = call(admin, key, Method::POST, "/v1/content", Some(json!({ "name": name }))).await;
    assert_eq!(code, 201, "{body}");
    body["guid"].as_str().unwrap().to_string()
}

/// Uploads `bundle` and deploys it as `key`: the version number.
pub(crate) async fn publish(admin: &str, key: &str, guid: &str, bundle: Vec<u8>) -> String {
    let (code, b) = upload(admin, key, guid, bundle).await;
    assert_eq!(code, 200, "{b}");
    let version = b["id"].as_str().unwrap().to_string();
    let (code, t) =
        call(admin, key, Method::POST, &format!("/v1/content/{guid}/deploy"), Some(json!({ "bundle_id": version })))
            .await;
    assert_eq!(code, 202, "{t}");
    let (done, lines) =
        follow(&format!("{admin}/__api__"), &format!("Key {key}"), t["task_id"].as_str().unwrap()).await;
    assert_eq!(done["code"], 0, "{done} {lines:?}");
    version
}

const STATIC: &[u8] = br#"{"metadata": {"appmode": "static"}}"#;
const API: &[u8] = br#"{"metadata": {"appmode": "api"}}"#;

fn versions_on_disk(app: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(app)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('v'))
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_cannot_take_a_configured_apps_paths_nor_change_another_keys_app() {
    let apps = "[[app]]\nname = \"docs\"\npath = \"/docs\"\nstatic = \"docs\"\n\n\
                [[app]]\nname = \"tools\"\npath = \"/team/tools\"\nstatic = \"docs\"\n";
    let (dir, keys) = site("", apps, &[("ann", ""), ("bob", ""), ("ops", "admin")]);
    let config = dir.path().join("valve.toml");
    let valve = Valve::start(&["--config", config.to_str().unwrap()]);
    let admin = valve.admin_url();
    let (ann, bob, ops) = (&keys[0].1, &keys[1].1, &keys[2].1);

    // A name whose path a configured app has, or is under: 409, naming the app, its path and what to do.
    for (name, app, at) in [("docs", "docs", "/docs"), ("team", "tools", "/team/tools")] {
        let (code, body) = call(&admin, ann, Method::POST, "/v1/content", Some(json!({ "name": name }))).await;
        let error = body["error"].as_str().unwrap_or_default();
        assert_eq!(code, 409, "{body}");
        assert!(error.contains(&format!("the app `{app}` in valve's configuration")) && error.contains(at), "{error}");
        assert!(error.contains("another name") && error.contains("under a path of its own"), "{error}");
    }
    assert_eq!(get(&valve.get("/team/tools/")).await.0, 200, "the configured app keeps its paths");

    // ann's app: bob may look it up (as rsconnect does) but not change it, nor read its tasks.
    let guid = create(&admin, ann, "notes").await;
    let bundle = |text: &str| tarball(&[("manifest.json", STATIC), ("index.html", text.as_bytes())]);
    publish(&admin, ann, &guid, bundle("ann's notes")).await;
    let (code, listed) = call(&admin, bob, Method::GET, "/applications?filter=name:notes", None).await;
    assert_eq!((code, listed["total"].as_u64()), (200, Some(1)), "{listed}");
    let (code, body) = upload(&admin, bob, &guid, bundle("bob was here")).await;
    assert_eq!(code, 403, "{body}");
    assert!(body["error"].as_str().unwrap().contains("`notes` belongs to the key `ann`, not to `bob`"), "{body}");
    let deploy = json!({ "bundle_id": "1" });
    let (code, _) = call(&admin, bob, Method::POST, &format!("/v1/content/{guid}/deploy"), Some(deploy)).await;
    assert_eq!(code, 403);
    let open = json!({ "allow_users": ["bob"] });
    let (code, _) = call(&admin, bob, Method::PATCH, &format!("/v1/content/{guid}"), Some(open)).await;
    assert_eq!(code, 403);
    let again = json!({ "bundle_id": "1" });
    let (_, t) = call(&admin, ann, Method::POST, &format!("/v1/content/{guid}/deploy"), Some(again)).await;
    let task = t["task_id"].as_str().unwrap().to_string();
    let (code, _) = call(&admin, bob, Method::GET, &format!("/v1/tasks/{task}?first=0"), None).await;
    assert_eq!(code, 403, "a deployment's log is its app's");
    assert_eq!(get(&valve.get("/notes/")).await, (200, "ann's notes".into()), "bob changed nothing");
    // An admin key may act on it.
    publish(&admin, ops, &guid, bundle("fixed by ops")).await;
    assert_eq!(get(&valve.get("/notes/")).await, (200, "fixed by ops".into()));

    // An app recorded before owners were: admin keys only.
    let record = dir.path().join("published/notes/app.json");
    let mut r: Value = serde_json::from_str(&std::fs::read_to_string(&record).unwrap()).unwrap();
    r.as_object_mut().unwrap().remove("owner");
    std::fs::write(&record, r.to_string()).unwrap();
    let (code, body) = upload(&admin, ann, &guid, bundle("mine again?")).await;
    assert_eq!(code, 403, "{body}");
    assert!(body["error"].as_str().unwrap().contains("only an admin key"), "{body}");
    assert_eq!(upload(&admin, ops, &guid, bundle("ops")).await.0, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bundle_of_deep_paths_is_refused_at_its_limits() {
    let apps = "[[app]]\nname = \"docs\"\npath = \"/docs\"\nstatic = \"docs\"\n";
    let (dir, keys) = site("publish_max_files = 50", apps, &[("ann", "")]);
    let config = dir.path().join("valve.toml");
    let valve = Valve::start(&["--config", config.to_str().unwrap()]);
    let (admin, ann) = (valve.admin_url(), &keys[0].1);
    let guid = create(&admin, ann, "deep").await;
    let app = dir.path().join("published/deep");
    let before = std::fs::read_dir(&app).unwrap().count();

    // 33 folders down: over the depth limit (32).
    let deep = format!("{}x.R", "d/".repeat(33));
    let (code, body) = upload(&admin, ann, &guid, tarball(&[("manifest.json", STATIC), (&deep, b"1")])).await;
    assert_eq!(code, 400, "{body}");
    assert!(body["error"].as_str().unwrap().contains("is more than 32 folders deep"), "{body}");
    // Six files, each 20 folders down: 128 things on disk from 8 entries, over publish_max_files.
    let paths: Vec<String> = (0..6).map(|i| format!("{i}/{}x.R", "d/".repeat(19))).collect();
    let mut entries: Vec<(&str, &[u8])> = vec![("manifest.json", STATIC), ("index.html", b"hi")];
    entries.extend(paths.iter().map(|p| (p.as_str(), &b"1"[..])));
    let (code, body) = upload(&admin, ann, &guid, tarball(&entries)).await;
    assert_eq!(code, 400, "{body}");
    assert!(body["error"].as_str().unwrap().contains("more than 50 files and folders"), "{body}");
    assert_eq!(std::fs::read_dir(&app).unwrap().count(), before, "nothing is left of a refused bundle");
    // The same bundle, less deep, is taken.
    let paths: Vec<String> = (0..6).map(|i| format!("{i}/d/x.R")).collect();
    let mut entries: Vec<(&str, &[u8])> = vec![("manifest.json", STATIC), ("index.html", b"hi")];
    entries.extend(paths.iter().map(|p| (p.as_str(), &b"1"[..])));
    assert_eq!(upload(&admin, ann, &guid, tarball(&entries)).await.0, 200);
}

/// A plumber API answering its version; `/hold` answers once the file
/// `release` is in its home.
pub(crate) fn held_api(version: u32) -> Vec<u8> {
    let api = format!(
        "#* @get /version\nfunction() {version}\n\n#* @get /hold\nfunction() {{\n  while (!file.exists(file.path(Sys.getenv(\"HOME\"), \"release\"))) Sys.sleep(0.05)\n  {version}\n}}\n"
    );
    tarball(&[("manifest.json", API), ("plumber.R", api.as_bytes())])
}

/// `held_api` whose workers take 4 s to start: a deployment of it lasts long
/// enough that another one sent at the same moment meets it, however busy the
/// machine (two deployments that never overlap would not wait for each other).
pub(crate) fn slow_api(version: u32) -> Vec<u8> {
    let held = format!("Sys.sleep(4)\n\n#* @get /version\nfunction() {version}\n");
    tarball(&[("manifest.json", API), ("plumber.R", held.as_bytes())])
}

#[tokio::test(flavor = "multi_thread")]
async fn a_version_a_draining_generation_serves_stays_until_it_drains_and_uploads_never_deployed_are_pruned() {
    need_r_packages(&["plumber"]);
    let apps = "[[app]]\nname = \"docs\"\npath = \"/docs\"\nstatic = \"docs\"\n";
    let (dir, keys) = site("publish_keep = 1\nn_max = 1\nmax_workers = 6", apps, &[("ann", "")]);
    let config = dir.path().join("valve.toml");
    let valve = Valve::start(&["--config", config.to_str().unwrap()]);
    let (admin, ann) = (valve.admin_url(), &keys[0].1);
    let guid = create(&admin, ann, "held").await;
    let app = dir.path().join("published/held");
    publish(&admin, ann, &guid, held_api(1)).await;
    let _ = std::fs::remove_file(valve.home("held").join("release"));

    // A request held on version 1's generation while versions 2 and 3 are deployed.
    let url = valve.get("/held/hold");
    let held = tokio::spawn(async move { get(&url).await });
    valve.wait_for_requests(1, 0);
    publish(&admin, ann, &guid, held_api(2)).await;
    publish(&admin, ann, &guid, held_api(3)).await;
    assert_eq!(get(&valve.get("/held/version")).await, (200, "[3]".into()));
    assert!(app.join("v1").is_dir(), "version 1 still serves a request: {:?}", versions_on_disk(&app));
    std::fs::write(valve.home("held").join("release"), "").unwrap();
    assert_eq!(held.await.unwrap(), (200, "[1]".into()), "the held request completes on version 1");
    wait_until("version 1 to be removed once drained", Duration::from_secs(30), || !app.join("v1").exists());

    // Uploads never deployed count against publish_keep: the active version and the newest upload stay.
    for n in 4..=6 {
        assert_eq!(upload(&admin, ann, &guid, held_api(n)).await.0, 200);
        let on_disk = versions_on_disk(&app);
        assert!(on_disk.len() <= 2 && on_disk.contains(&"v3".to_string()), "{on_disk:?}");
    }
    assert_eq!(versions_on_disk(&app), ["v3", "v6"]);
}

/// A plumber API that reads any file it is asked for.
fn reader_api(secret: &str) -> Vec<u8> {
    let api = "#* @get /read\nfunction(path) tryCatch(paste(readLines(path), collapse = \"\"), error = function(e) \"unreadable\", warning = function(w) \"unreadable\")\n";
    tarball(&[("manifest.json", API), ("plumber.R", api.as_bytes()), ("secret.txt", secret.as_bytes())])
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_private_view_an_app_cannot_read_another_apps_published_files() {
    need_r_packages(&["plumber"]);
    assert!(as_root(), "this test checks what valve does as root: run the tests as root, as CI does");
    let apps = "[[app]]\nname = \"docs\"\npath = \"/docs\"\nstatic = \"docs\"\n";
    let (dir, keys) = site("n_max = 1", apps, &[("ann", "")]);
    let config = dir.path().join("valve.toml");
    // Root without CAP_SYS_ADMIN: each app its own user, no private view (isolation "own user").
    let valve =
        Valve::start_wrapped(&["setpriv", "--bounding-set=-sys_admin", "--"], &["--config", config.to_str().unwrap()]);
    let (admin, ann) = (valve.admin_url(), &keys[0].1);
    let published: PathBuf = dir.path().join("published");
    for name in ["alpha", "beta"] {
        let guid = create(&admin, ann, name).await;
        publish(&admin, ann, &guid, reader_api(&format!("{name}-secret\n"))).await;
    }
    let status = valve.status();
    let alpha = status["apps"].as_array().unwrap().iter().find(|a| a["name"] == "alpha").unwrap().clone();
    assert_eq!(alpha["isolation"], "own user", "no private view here: {alpha}");
    let read = |app: &str, of: &str| {
        let file = published.join(of).join("v1/secret.txt");
        let url = valve.get(&format!("/{app}/read?path={}", file.display()));
        async move { get(&url).await }
    };
    assert_eq!(read("alpha", "alpha").await, (200, "[\"alpha-secret\"]".into()), "an app reads its own");
    assert_eq!(read("beta", "beta").await, (200, "[\"beta-secret\"]".into()));
    assert_eq!(read("alpha", "beta").await, (200, "[\"unreadable\"]".into()), "but not another's");
    assert_eq!(read("beta", "alpha").await, (200, "[\"unreadable\"]".into()));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_name_removed_and_published_by_another_key_gets_a_fresh_uid_and_an_empty_home() {
    need_r_packages(&["plumber"]);
    assert!(as_root(), "this test checks whom valve runs apps as: run the tests as root, as CI does");
    let apps = "[[app]]\nname = \"docs\"\npath = \"/docs\"\nstatic = \"docs\"\n";
    let (dir, keys) = site("n_max = 1", apps, &[("ann", ""), ("bob", "")]);
    let config = dir.path().join("valve.toml");
    let valve = Valve::start(&["--config", config.to_str().unwrap()]);
    let (admin, ann, bob) = (valve.admin_url(), keys[0].1.clone(), keys[1].1.clone());
    let attacker = std::fs::read(crate::harness::fixture("attacker/plumber.R")).unwrap();
    let bundle = || tarball(&[("manifest.json", API), ("plumber.R", &attacker)]);
    let uid_of = |valve: &Valve| {
        let status = valve.status();
        let app = status["apps"].as_array().unwrap().iter().find(|a| a["name"] == "notes").cloned().unwrap();
        app["uid"].as_u64().unwrap()
    };
    let guid = create(&admin, &ann, "notes").await;
    publish(&admin, &ann, &guid, bundle()).await;
    let me: Value = client().get(valve.get("/notes/whoami")).send().await.unwrap().json().await.unwrap();
    let home = me["home"].as_str().unwrap().to_string();
    let wrote: Value = client()
        .post(valve.get(&format!("/notes/write?path={home}/ann.txt")))
        .body("ann's notes")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(wrote["written"], "yes", "{wrote}");
    let ann_uid = uid_of(&valve);

    // An operator removes the app; another key publishes the name anew.
    std::fs::remove_dir_all(dir.path().join("published/notes")).unwrap();
    let reloaded = valve.admin_client().post(valve.admin("/__valve__/reload")).send().await.unwrap();
    assert_eq!(reloaded.status(), 200);
    let guid = create(&admin, &bob, "notes").await;
    publish(&admin, &bob, &guid, bundle()).await;
    assert!(valve.log().contains("its old uid is retired"), "{}", valve.log());
    let bob_uid = uid_of(&valve);
    assert_ne!(bob_uid, ann_uid, "a fresh uid");
    let me: Value = client().get(valve.get("/notes/whoami")).send().await.unwrap().json().await.unwrap();
    assert_eq!(me["uid"].as_u64(), Some(bob_uid));
    let read: Value = client()
        .get(valve.get(&format!("/notes/read?path={}/ann.txt", me["home"].as_str().unwrap())))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(read["text"].as_str().unwrap().starts_with("ERROR"), "bob's app reads ann's home: {read}");
    let kept: Vec<String> = std::fs::read_dir(Path::new(&home).parent().unwrap())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(kept.iter().any(|n| n.starts_with(".home-of-")), "ann's home is set aside, not removed: {kept:?}");
}
