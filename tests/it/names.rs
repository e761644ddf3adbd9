//! What a bundle or a lockfile names is checked before it is a path or a
//! URL (a boundary: a publisher's manifest, an app's own renv.lock). A
//! package named by a path, with a NUL, a version with letters, or a
//! `file://` repository is refused at upload naming the entry, and nothing
//! is written anywhere; an app that writes such an renv.lock into its own
//! folder gets it refused at the next reload, and no chain of a lockfile
//! and a link in its home reads a root-only file for it.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde_json::{json, Value};

use crate::harness::{as_root, client, fixture, need_r_packages, Valve};
use crate::publish::tarball;
use crate::published::{create, site, upload};

/// A manifest naming one package `name` at `version` from repository `url`.
fn manifest(name: &str, version: &str, url: &str) -> Vec<u8> {
    let mut packages = serde_json::Map::new();
    packages.insert(
        name.to_string(),
        json!({"Source": "CRAN", "Repository": url, "description": {"Package": name, "Version": version}}),
    );
    serde_json::to_vec(&json!({"metadata": {"appmode": "api"}, "packages": packages})).unwrap()
}

/// Every file under `dir`.
fn files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(p);
            } else {
                out.push(p.display().to_string());
            }
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bundle_naming_a_package_by_a_path_a_bad_version_or_a_file_repository_is_refused_at_upload() {
    let (dir, keys) = site("", "[[app]]\nname = \"docs\"\npath = \"/docs\"\nstatic = \"docs\"\n", &[("ann", "")]);
    let config = dir.path().join("valve.toml");
    let cache = dir.path().join("cache");
    let valve = Valve::start(&["--config", config.to_str().unwrap(), "--package-cache", cache.to_str().unwrap()]);
    let (admin, ann) = (valve.admin_url(), keys[0].1.clone());
    let guid = create(&admin, &ann, "api").await;
    let target = dir.path().join("target");
    std::fs::create_dir(&target).unwrap();
    let escape = format!("../../../../../../../..{}/pwn", target.display());
    let cran = "https://cloud.r-project.org";
    for (name, version, url, says) in [
        (escape.as_str(), "1.0", cran, "is refused (it holds a slash)".to_string()),
        ("R6/../../x", "2.5.1", cran, "\"R6/../../x\" is refused (it holds a slash)".into()),
        ("a\0b", "1.0", cran, "\"a\\0b\" is refused (it holds a NUL)".into()),
        ("R6", "2.5.1a", cran, "the package R6 has the version \"2.5.1a\"".into()),
        ("R6", "../../2.5", cran, "the package R6 has the version \"../../2.5\"".into()),
        ("R6", "2.5.1", "file:///root", "from the repository CRAN at \"file:///root\", which is refused".into()),
    ] {
        let bundle =
            tarball(&[("manifest.json", &manifest(name, version, url)), ("plumber.R", b"#* @get /\nfunction() 1\n")]);
        let (code, body) = upload(&admin, &ann, &guid, bundle).await;
        assert_eq!(code, 400, "{name:?} {version} {url}: {body}");
        let error = body["error"].as_str().unwrap();
        assert!(
            error.contains("manifest.json") && error.contains(&says) && error.contains("refused"),
            "{name:?}: {error}\n(wanted {says})"
        );
    }
    assert!(files(&target).is_empty(), "nothing written where a name pointed: {:?}", files(&target));
    assert!(files(&cache).is_empty(), "nothing fetched or kept: {:?}", files(&cache));
    let app = dir.path().join("published/api");
    let kept: Vec<String> =
        std::fs::read_dir(&app).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into()).collect();
    assert_eq!(kept, ["app.json"], "no refused bundle is kept");
}

/// An renv.lock naming `name` at `version` from the repository LOCAL at `url`.
fn renv_lock(name: &str, version: &str, url: &str) -> String {
    let mut packages = serde_json::Map::new();
    packages.insert(
        name.to_string(),
        json!({"Package": name, "Version": version, "Source": "Repository", "Repository": "LOCAL"}),
    );
    serde_json::to_string(&json!({
        "R": {"Version": "4.2.2", "Repositories": [{"Name": "LOCAL", "URL": url}]},
        "Packages": packages,
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_renv_lock_an_app_writes_into_its_own_folder_is_refused_at_reload_and_reads_no_root_file() {
    need_r_packages(&["plumber"]);
    assert!(as_root(), "this test plants links to root's files: run the tests as root, as CI does");
    let work = crate::harness::app_dir();
    // A root-only secret, in a root-only folder.
    let secret_dir = work.path().join("root-only");
    std::fs::create_dir(&secret_dir).unwrap();
    std::fs::write(secret_dir.join("secretpkg_1.0.tar.gz"), "root-secret-5f2e\n").unwrap();
    std::fs::set_permissions(secret_dir.join("secretpkg_1.0.tar.gz"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(&secret_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let app = work.path().join("writer");
    std::fs::create_dir(&app).unwrap();
    std::fs::copy(fixture("attacker/plumber.R"), app.join("plumber.R")).unwrap();
    let config = work.path().join("valve.toml");
    std::fs::write(
        &config,
        format!("[[app]]\nname = \"writer\"\nfile = \"{}\"\nn_max = 1\n", app.join("plumber.R").display()),
    )
    .unwrap();
    let cache = work.path().join("cache");
    let valve = Valve::start(&["--config", config.to_str().unwrap(), "--package-cache", cache.to_str().unwrap()]);
    let me: Value = client().get(valve.get("/whoami")).send().await.unwrap().json().await.unwrap();
    // Its folder is its user's to write, as valve's start-up warning advises.
    let uid = me["uid"].as_u64().unwrap() as u32;
    std::os::unix::fs::chown(&app, Some(uid), Some(uid)).unwrap();
    let home = me["home"].as_str().unwrap().to_string();
    // A link in its home to the root-only folder, and lockfiles that name it.
    let made: Value = client()
        .get(valve.get(&format!("/link?target={}&at={home}/pkgs", secret_dir.display())))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(made["made"], "yes", "{made}");
    let escape = format!("../../../../../../../..{home}/stolen");
    for (lock, says) in [
        (renv_lock(&escape, "1.0", &format!("file://{home}/pkgs")), "is refused (it holds a slash)".to_string()),
        (
            renv_lock("secretpkg", "1.0", &format!("file://{home}/pkgs")),
            format!("\"file://{home}/pkgs\", which is refused"),
        ),
    ] {
        let wrote: Value =
            client().post(valve.get("/write?path=renv.lock")).body(lock).send().await.unwrap().json().await.unwrap();
        assert_eq!(wrote["written"], "yes", "the app can write its own folder: {wrote}");
        let reloaded = valve.admin_client().post(valve.admin("/__valve__/reload")).send().await.unwrap();
        assert_eq!(reloaded.status(), 200);
        crate::harness::wait_until("the restore to be refused", std::time::Duration::from_secs(60), || {
            valve.log().contains(&says)
        });
        // The old generation serves on.
        assert_eq!(client().get(valve.get("/whoami")).send().await.unwrap().status(), 200);
    }
    let log = valve.log();
    assert!(log.contains("renv.lock"), "the file is named: {log}");
    // Nothing of the secret anywhere the app (or anyone) could read it.
    for place in [Path::new(&home), cache.as_path(), app.as_path()] {
        for f in files(place) {
            let text = std::fs::read(&f).unwrap_or_default();
            assert!(!String::from_utf8_lossy(&text).contains("root-secret-5f2e"), "{f} holds root's secret");
        }
    }
    let read: Value = client()
        .get(valve.get(&format!("/read?path={home}/pkgs/secretpkg_1.0.tar.gz")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(read["text"].as_str().unwrap().starts_with("ERROR"), "{read}");
}
