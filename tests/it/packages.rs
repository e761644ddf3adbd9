//! Package restores: an app that names its packages (an `renv.lock` in its
//! folder, a published bundle's manifest) gets each at the exact version
//! named, from a real CRAN-like repository ([`crate::cran`]) served over
//! HTTP, in a library of its own; two apps hold two versions of one package;
//! what a restore built once is taken from the cache after; what cannot be
//! restored is refused naming the package, and what served keeps serving.

use std::path::Path;

use crate::cran::{self, WITH_C};
use crate::harness::{app_dir, as_root, client, need_r_packages, valve_bin, wait_until, Valve};
use crate::lifecycle::processes_with_env;
use crate::publish::{deploy_app, follow, get, new_key, tarball};

/// An API that says which bitops it loaded, that it works (compiled code),
/// whether it can see shiny (which it does not name) and its library paths.
const API: &str = r#"#* @get /v
function() {
  list(bitops = utils::packageDescription("bitops")$Version,
       and = bitops::bitAnd(12L, 10L),
       shiny = requireNamespace("shiny", quietly = TRUE),
       shiny_loaded = "shiny" %in% loadedNamespaces(),
       paths = .libPaths())
}
"#;

/// An `renv.lock` naming `packages` from the repository CRAN at `url`.
fn renv_lock(url: &str, packages: &[(&str, &str)]) -> String {
    let listed: serde_json::Map<String, serde_json::Value> = packages
        .iter()
        .map(|(n, v)| {
            let p = serde_json::json!({"Package": n, "Version": v, "Source": "Repository", "Repository": "CRAN"});
            (n.to_string(), p)
        })
        .collect();
    let lock = serde_json::json!({
        "R": {"Version": "4.2.2", "Repositories": [{"Name": "CRAN", "URL": url}]},
        "Packages": listed,
    });
    serde_json::to_string_pretty(&lock).unwrap()
}

fn app(site: &Path, name: &str, lock: &str) {
    let dir = site.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("plumber.R"), API).unwrap();
    std::fs::write(dir.join("renv.lock"), lock).unwrap();
}

async fn versions(valve: &Valve, app: &str) -> serde_json::Value {
    let (code, body) = get(&valve.get(&format!("/{app}/v"))).await;
    assert_eq!(code, 200, "{app}: {body}\n{}", valve.log());
    serde_json::from_str(&body).unwrap()
}

/// Source tarballs the repository gave.
fn fetched(served: &cran::Served) -> Vec<String> {
    served.requests().into_iter().filter(|r| r.starts_with("200 ") && r.ends_with(".tar.gz")).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn two_site_apps_get_two_versions_of_one_package_and_a_restart_builds_nothing() {
    need_r_packages(&["plumber"]);
    let repo = cran::repo();
    let served = repo.serve();
    let archived = repo.archived_versions(WITH_C)[0].to_string();
    let current = repo.current_version(WITH_C).to_string();
    let work = app_dir();
    let site = work.path().join("site");
    app(&site, "old", &renv_lock(served.url(), &[("bitops", &archived), ("plumber", "1.2.1")]));
    app(&site, "new", &renv_lock(served.url(), &[("bitops", &current), ("plumber", "1.2.1"), ("zeallot", "0.1.0")]));
    app(&site, "gone", &renv_lock(served.url(), &[("zeallot", "9.9.9"), ("plumber", "1.2.1")]));
    let cache = work.path().join("cache");
    let args = ["--site", site.to_str().unwrap(), "--package-cache", cache.to_str().unwrap()];

    let valve = Valve::start(&args);
    let old = versions(&valve, "old").await;
    let new = versions(&valve, "new").await;
    assert_eq!((old["bitops"][0].as_str(), old["and"][0].as_i64()), (Some(archived.as_str()), Some(8)), "{old}");
    assert_eq!(new["bitops"][0].as_str(), Some(current.as_str()), "{new}");
    // Only what it named (and what that needs): not the server's shiny.
    assert_eq!((old["shiny"][0].as_bool(), old["shiny_loaded"][0].as_bool()), (Some(false), Some(false)), "{old}");
    let paths = old["paths"].to_string();
    assert!(!paths.contains("site-library"), "the server's site library is not on the app's paths: {paths}");
    let log = valve.log();
    for said in [
        format!("bitops {archived}: built from source"),
        format!("bitops {current}: built from source"),
        "plumber 1.2.1: from R's library".to_string(),
        "zeallot 0.1.0: built from source".to_string(),
    ] {
        assert!(log.contains(&said), "the log says {said:?}:\n{log}");
    }
    assert!(
        fetched(&served).iter().any(|r| r.contains(&format!("Archive/bitops/bitops_{archived}.tar.gz"))),
        "an older version comes from the Archive: {:?}",
        served.requests()
    );
    // A fork of the warm parent serves them (what it loaded and they did
    // not name unloaded first), not a fresh R.
    assert!(!log.contains("start as fresh R"), "{log}");
    // What cannot be restored is named, and the other apps serve.
    assert!(log.contains("zeallot 9.9.9"), "{log}");
    assert_ne!(get(&valve.get("/gone/v")).await.0, 200);
    // ... and the status and the dashboard's table say so, with why.
    let apps: serde_json::Value = valve
        .admin_client()
        .get(format!("{}/__valve__/apps", valve.admin_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let gone = apps["not_served"].as_array().and_then(|l| l.iter().find(|f| f["name"] == "gone"));
    assert!(gone.is_some_and(|f| f["error"].as_str().is_some_and(|e| e.contains("zeallot"))), "{apps}");
    drop(valve);

    let before = fetched(&served).len();
    let valve = Valve::start(&args);
    assert_eq!(versions(&valve, "old").await["bitops"][0].as_str(), Some(archived.as_str()));
    assert_eq!(versions(&valve, "new").await["bitops"][0].as_str(), Some(current.as_str()));
    let log = valve.log();
    assert!(log.contains("were restored before"), "{log}");
    assert!(!log.contains("built from source"), "a restart builds nothing: {log}");
    assert_eq!(fetched(&served).len(), before, "a restart fetches nothing");

    // What the status page, the metrics and `valve packages` say.
    let admin = valve.admin_url();
    let status: serde_json::Value = valve
        .admin_client()
        .get(format!("{admin}/__valve__/apps/new/status"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let p = &status["app"]["packages"];
    // bitops and zeallot built; plumber and what it needs from R's library.
    assert_eq!((p["file"].as_str(), p["built"].as_u64()), (Some("renv.lock"), Some(2)), "{p}");
    assert!(p["from_r_library"].as_u64() > Some(1), "{p}");
    let metrics =
        valve.admin_client().get(format!("{admin}/__valve__/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("valve_package_restores_total{result=\"hit\"} 2"), "{metrics}");
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(valve_bin())
            .args(args)
            .args(["--admin", &admin])
            .env("VALVE_ADMIN_TOKEN_FILE", valve.token_file())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let listed = cli(&["packages"]);
    let row =
        |version: &str| listed.lines().find(|l| l.starts_with("bitops ") && l.contains(version)).map(str::to_string);
    assert!(row(&archived).is_some_and(|l| l.ends_with(" old")), "{listed}");
    assert!(row(&current).is_some_and(|l| l.ends_with(" new")), "{listed}");
    // An app folder gone: a prune removes what it alone used.
    std::fs::remove_dir_all(site.join("new")).unwrap();
    let pruned = cli(&["packages", "--prune"]);
    assert!(pruned.contains(&format!("bitops {current}")) && pruned.contains("zeallot 0.1.0"), "{pruned}");
    assert!(!pruned.contains(&format!("bitops {archived}")), "{pruned}");
    let listed = cli(&["packages"]);
    assert!(listed.contains(&archived) && !listed.contains(&current), "{listed}");
    assert_eq!(versions(&valve, "old").await["bitops"][0].as_str(), Some(archived.as_str()));
}

/// A valve in `w` that publishes (the keys file holding `key_line`) beside
/// a site of one static app, its package cache in `w/cache`.
fn publishing_valve(w: &Path, key_line: &str) -> Valve {
    std::fs::write(w.join("keys"), format!("{key_line}\n")).unwrap();
    std::fs::create_dir_all(w.join("site/front")).unwrap();
    std::fs::write(w.join("site/front/index.html"), "<h1>front</h1>").unwrap();
    Valve::start(&[
        "--site",
        w.join("site").to_str().unwrap(),
        "--publish-dir",
        w.join("published").to_str().unwrap(),
        "--publish-keys-file",
        w.join("keys").to_str().unwrap(),
        "--package-cache",
        w.join("cache").to_str().unwrap(),
    ])
}

/// A bundle as rsconnect sends it: a plumber API whose manifest names
/// `packages` (name, version) from the repository at `url`.
fn bundle(url: &str, packages: &[(&str, &str)]) -> Vec<u8> {
    let listed: serde_json::Map<String, serde_json::Value> = packages
        .iter()
        .map(|(n, v)| {
            let p = serde_json::json!({"Source": "CRAN", "Repository": url,
                "description": {"Package": n, "Version": v}});
            (n.to_string(), p)
        })
        .collect();
    let manifest = serde_json::json!({
        "version": 1,
        "metadata": {"appmode": "api", "entrypoint": "plumber.R"},
        "packages": listed,
        "files": {"plumber.R": {"checksum": "x"}},
    });
    tarball(&[("manifest.json", manifest.to_string().as_bytes()), ("plumber.R", API.as_bytes())])
}

#[tokio::test(flavor = "multi_thread")]
async fn a_published_bundle_gets_its_versions_a_redeploy_takes_them_from_the_cache_and_a_failed_build_changes_nothing()
{
    need_r_packages(&["plumber"]);
    let mut repo = cran::repo();
    repo.add_broken("broken", "0.1");
    let served = repo.serve();
    let archived = repo.archived_versions(WITH_C)[0].to_string();
    let work = app_dir();
    let w = work.path();
    let (key, line) = new_key("laptop");
    let valve = publishing_valve(w, &line);
    let api = format!("{}/__api__", valve.admin_url());
    let auth = format!("Key {key}");
    let call = |method: reqwest::Method, path: &str| {
        client().request(method, format!("{api}{path}")).header("Authorization", &auth)
    };
    let resp =
        call(reqwest::Method::POST, "/v1/content").json(&serde_json::json!({"name": "calc"})).send().await.unwrap();
    assert_eq!(resp.status(), 201);
    let guid = resp.json::<serde_json::Value>().await.unwrap()["guid"].as_str().unwrap().to_string();
    let deploy = |bytes: Vec<u8>| {
        let (call, guid, api, auth) = (&call, &guid, &api, &auth);
        async move {
            let resp =
                call(reqwest::Method::POST, &format!("/v1/content/{guid}/bundles")).body(bytes).send().await.unwrap();
            assert_eq!(resp.status(), 200);
            let id = resp.json::<serde_json::Value>().await.unwrap()["id"].as_str().unwrap().to_string();
            let resp = call(reqwest::Method::POST, &format!("/v1/content/{guid}/deploy"))
                .json(&serde_json::json!({"bundle_id": id}))
                .send()
                .await
                .unwrap();
            let task = resp.json::<serde_json::Value>().await.unwrap()["task_id"].as_str().unwrap().to_string();
            follow(api, auth, &task).await
        }
    };

    let wanted = [("bitops", archived.as_str()), ("plumber", "1.2.1")];
    let (done, output) = deploy(bundle(served.url(), &wanted)).await;
    assert_eq!(done["code"], 0, "{done}\n{output:?}");
    let said = output.join("\n");
    assert!(said.contains(&format!("bitops {archived}: built from source")), "{said}");
    assert!(said.contains("plumber 1.2.1: from R's library"), "{said}");
    assert_eq!(versions(&valve, "calc").await["bitops"][0].as_str(), Some(archived.as_str()));

    // The same packages again: from the cache, nothing fetched or built.
    let before = fetched(&served).len();
    let (done, output) = deploy(bundle(served.url(), &wanted)).await;
    assert_eq!(done["code"], 0, "{done}\n{output:?}");
    let said = output.join("\n");
    assert!(said.contains("were restored before"), "{said}");
    assert!(!said.contains("built from source"), "{said}");
    assert_eq!(fetched(&served).len(), before);

    // A package that does not build: the deployment fails naming it and
    // its compiler's words; the version that served serves on.
    let (done, output) = deploy(bundle(served.url(), &[("broken", "0.1"), ("plumber", "1.2.1")])).await;
    assert_ne!(done["code"], 0, "{done}\n{output:?}");
    let error = format!("{} {}", done["error"], output.join("\n"));
    assert!(error.contains("broken 0.1 failed to build"), "{error}");
    assert!(error.contains("nothing changed"), "{error}");
    assert_eq!(versions(&valve, "calc").await["bitops"][0].as_str(), Some(archived.as_str()));

    // A package from a Git host (valve fetches none): named, with what to do.
    let manifest = serde_json::json!({
        "version": 1,
        "metadata": {"appmode": "api", "entrypoint": "plumber.R"},
        "packages": {"mine": {"Source": "github", "Repository": null,
            "description": {"Package": "mine", "Version": "0.1", "RemoteUsername": "me", "RemoteRepo": "mine"}}},
    });
    let git = tarball(&[("manifest.json", manifest.to_string().as_bytes()), ("plumber.R", API.as_bytes())]);
    let (done, output) = deploy(git).await;
    let error = format!("{} {}", done["error"], output.join("\n"));
    assert!(error.contains("mine 0.1 comes from github (me/mine)"), "{error}");
    assert!(error.contains("nothing changed"), "{error}");

    // A package the repository does not have: named, with where it looked.
    let (done, output) = deploy(bundle(served.url(), &[("bitops", "0.0-1"), ("plumber", "1.2.1")])).await;
    assert_ne!(done["code"], 0, "{done}\n{output:?}");
    let error = format!("{} {}", done["error"], output.join("\n"));
    assert!(error.contains("bitops 0.0-1"), "{error}");
    assert_eq!(versions(&valve, "calc").await["bitops"][0].as_str(), Some(archived.as_str()));
}

/// A `configure` script runs as the app, in its own view of the files: what
/// it writes outside its build folder never reaches the server, and another
/// app's files are not there to read, and what it leaves running in the
/// background is killed when the build ends.
#[tokio::test(flavor = "multi_thread")]
async fn a_configure_script_cannot_write_outside_its_build_folder_nor_read_another_apps_files() {
    assert!(as_root(), "this test checks the sandbox valve gives builds as root: run the tests as root, as CI does");
    configure_cannot_escape(None).await;
}

/// The same under Landlock: valve as an ordinary user (nobody), every folder
/// the script tries its user's own, so only the app's ruleset stops it.
#[tokio::test(flavor = "multi_thread")]
async fn under_landlock_a_configure_script_cannot_write_outside_its_build_folder_nor_read_another_apps_files() {
    assert!(as_root(), "this test switches to an ordinary user: run the tests as root, as CI does");
    configure_cannot_escape(Some(65534)).await;
}

async fn configure_cannot_escape(as_user: Option<u32>) {
    need_r_packages(&["plumber"]);
    let outside =
        std::env::temp_dir().join(format!("valve-configure-wrote-{}-{}", std::process::id(), as_user.unwrap_or(0)));
    let _ = std::fs::remove_file(&outside);
    let work = app_dir();
    let site = work.path().join("site");
    std::fs::create_dir_all(site.join("other")).unwrap();
    std::fs::write(site.join("other/index.html"), "<p>other</p>").unwrap();
    let secret = site.join("other/secret.txt");
    std::fs::write(&secret, "the other app's secret").unwrap();
    let script = format!(
        "#!/bin/sh\nmkdir -p inst\n\
         if cat {secret} > inst/seen.txt 2>/dev/null; then echo READ >> inst/seen.txt; else echo unreadable > inst/seen.txt; fi\n\
         if echo x > {outside} 2>/dev/null; then echo WROTE >> inst/seen.txt; fi\n\
         echo x > $HOME/.in-home 2>/dev/null\n\
         setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $! > inst/sleeper.txt\nexit 0\n",
        secret = secret.display(),
        outside = outside.display()
    );
    let mut repo = cran::repo();
    repo.add_with_configure("nosy", "0.1", &script);
    let served = repo.serve();
    app(&site, "nosy", &renv_lock(served.url(), &[("nosy", "0.1"), ("plumber", "1.2.1")]));
    std::fs::write(
        site.join("nosy/plumber.R"),
        "#* @get /seen\nfunction() readLines(system.file(\"seen.txt\", package = \"nosy\"))\n\
         #* @get /sleeper\nfunction() readLines(system.file(\"sleeper.txt\", package = \"nosy\"))\n",
    )
    .unwrap();
    if let Some(uid) = as_user {
        let chown = std::process::Command::new("chown")
            .args(["-R", &format!("{uid}:{uid}"), work.path().to_str().unwrap()])
            .status()
            .unwrap();
        assert!(chown.success());
    }
    let (state, cache) = (work.path().join("state"), work.path().join("cache"));
    let valve = Valve::start_as(
        as_user,
        &["--site", site.to_str().unwrap(), "--package-cache", cache.to_str().unwrap()],
        &[("VALVE_STATE_DIR", state.to_str().unwrap())],
        None,
        |_| {},
    );
    if as_user.is_some() {
        assert_eq!(valve.status()["isolation"]["level"], "valve's user, Landlock");
    }
    let (code, seen) = get(&valve.get("/nosy/seen")).await;
    assert_eq!(code, 200, "{seen}\n{}", valve.log());
    assert!(valve.log().contains("nosy 0.1: built from source"), "{}", valve.log());
    assert!(seen.contains("unreadable"), "the script ran and says what it saw: {seen}");
    assert!(!seen.contains("secret") && !seen.contains("READ"), "the build read another app's file: {seen}");
    assert!(!seen.contains("WROTE") || !outside.exists(), "{seen}");
    assert!(!outside.exists(), "the build wrote {} on the server", outside.display());
    if as_user.is_none() {
        // What the build left running, out of its process group, is killed
        // when the build ends: as root, by the privileged spawner, asked by
        // valve's server, which may not signal a builder's uid itself.
        let (code, pid) = get(&valve.get("/nosy/sleeper")).await;
        assert_eq!(code, 200, "{pid}");
        let pid: u32 = pid.trim_matches(|c: char| !c.is_ascii_digit()).parse().expect("the sleeper's pid");
        wait_until("the build's background process to be killed", std::time::Duration::from_secs(60), || {
            std::fs::read_to_string(format!("/proc/{pid}/cmdline")).map_or(true, |c| !c.starts_with("sleep"))
        });
    }
}

/// valve SIGKILLed while it builds a package leaves no half package: the next
/// start builds what was missing and the app answers.
#[tokio::test(flavor = "multi_thread")]
async fn a_restore_killed_midway_and_run_again_gives_a_working_library() {
    need_r_packages(&["plumber"]);
    let repo = cran::repo();
    let served = repo.serve();
    let current = repo.current_version(WITH_C).to_string();
    let work = app_dir();
    let site = work.path().join("site");
    app(&site, "calc", &renv_lock(served.url(), &[("bitops", &current), ("plumber", "1.2.1")]));
    let (state, cache) = (work.path().join("state"), work.path().join("cache"));
    let args = [
        "--site",
        site.to_str().unwrap(),
        "--package-cache",
        cache.to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
    ];
    let mut child = std::process::Command::new(valve_bin())
        .args(["--port", "0"])
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stderr.take().unwrap()));
    let mut said = String::new();
    while !said.contains("building from source") {
        match lines.next() {
            Some(Ok(line)) => said.push_str(&(line + "\n")),
            _ => panic!("valve ended before it built anything:\n{said}"),
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let app_env = format!("VALVE_APP={}", site.join("calc").display());
    wait_until("the build's R to end with valve", std::time::Duration::from_secs(10), || {
        processes_with_env(&app_env).is_empty()
    });

    let valve = Valve::start(&args);
    let v = versions(&valve, "calc").await;
    assert_eq!((v["bitops"][0].as_str(), v["and"][0].as_i64()), (Some(current.as_str()), Some(8)), "{v}");
}

/// Debian's rsconnect 0.8.29 publishes an API whose manifest names a bitops
/// the server's R does not have (the archived one, installed on the
/// client from the repository): the app answers with that version.
#[tokio::test(flavor = "multi_thread")]
async fn rsconnect_publishes_an_api_with_a_package_version_the_server_lacks_and_it_answers_with_it() {
    need_r_packages(&["rsconnect", "plumber"]);
    let repo = cran::repo();
    let served = repo.serve();
    let archived = repo.archived_versions(WITH_C)[0].to_string();
    let work = app_dir();
    let w = work.path();
    // The author's machine: bitops installed from the repository, which
    // R's options name (rsconnect records both in the manifest).
    let (home, lib) = (w.join("home"), w.join("lib"));
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    let tarball = repo.path().join(repo.relative(WITH_C, &archived));
    let built = std::process::Command::new("R")
        .args(["CMD", "INSTALL", "-l", lib.to_str().unwrap(), tarball.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    std::fs::write(home.join(".Rprofile"), format!("options(repos = c(CRAN = \"{}\"))\n", served.url())).unwrap();
    let api = w.join("api");
    std::fs::create_dir_all(&api).unwrap();
    std::fs::write(api.join("plumber.R"), API).unwrap();

    let (key, line) = new_key("ci");
    let valve = publishing_valve(w, &line);
    let admin = valve.admin_url();
    let (ok, said) = tokio::task::spawn_blocking({
        let (home, admin, key, api, lib) = (home.clone(), admin.clone(), key.clone(), api.clone(), lib.clone());
        move || deploy_app(&home, &admin, &key, &api, "calc", Some(&lib))
    })
    .await
    .unwrap();
    assert!(ok, "{said}");
    assert!(said.contains(&format!("bitops {archived}: built from source")), "{said}");
    assert!(said.contains("plumber 1.2.1: from R's library"), "{said}");
    let v = versions(&valve, "calc").await;
    assert_eq!((v["bitops"][0].as_str(), v["and"][0].as_i64()), (Some(archived.as_str()), Some(8)), "{v}");
}
