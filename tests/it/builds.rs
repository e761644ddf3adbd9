//! One publisher's bundle cannot poison the package cache another app
//! loads from (a boundary: a bundle's own files, an app's running R, the
//! cache every app shares). Publisher A's bundle carries an `.Rprofile`
//! whose `.Last` writes into every package a build of it installs, and A's
//! running workers try to write into every folder of the cache; publisher
//! B's app, and a configured app, then name the same package at the same
//! version and get it from the cache: untouched. As root and under Landlock.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::cran;
use crate::harness::{as_root, client, fixture, need_r_packages, wait_until, Valve};
use crate::publish::tarball;
use crate::published::{create, publish, site};

/// What A's build would run, were a bundle's profile run in a build: at
/// the end of every R session in the app's folder, a file written into
/// every package the session's install left (old valve's VALVE_INSTALL_OUT,
/// R CMD INSTALL's R_PACKAGE_DIR), and a sign that it ran.
const TAMPER: &str = r#".Last <- function() {
  for (out in c(Sys.getenv("VALVE_INSTALL_OUT"), dirname(Sys.getenv("R_PACKAGE_DIR")), .libPaths()[1])) {
    if (!nzchar(out) || !dir.exists(out)) next
    for (p in list.dirs(out, recursive = FALSE)) try(writeLines("alice was here", file.path(p, "tampered.txt")), silent = TRUE)
  }
  try(writeLines("ran", "/tmp/valve-builds-rprofile-ran"), silent = TRUE)
}
"#;

/// An API that says whether the zeallot it loads was tampered with.
const CHECK: &str = "#* @get /check\n#* @serializer unboxedJSON\nfunction() list(version = as.character(utils::packageVersion(\"zeallot\")), tampered = nzchar(system.file(\"tampered.txt\", package = \"zeallot\")))\n";

fn manifest(repo: &str, with_description: bool) -> Vec<u8> {
    let description = if with_description { json!({"Package": "zeallot", "Version": "0.1.0"}) } else { json!({}) };
    serde_json::to_vec(&json!({
        "metadata": {"appmode": "api"},
        "packages": {"zeallot": {"Source": "CRAN", "Repository": repo, "description": description}},
    }))
    .unwrap()
}

async fn check(valve: &Valve, app: &str) -> Value {
    let resp = client().get(valve.get(&format!("/{app}/check"))).send().await.unwrap();
    let status = resp.status();
    let body = resp.text().await.unwrap();
    assert_eq!(status, 200, "{app}: {body}\n{}", valve.log());
    serde_json::from_str(&body).unwrap()
}

fn renv_lock(url: &str) -> String {
    serde_json::to_string(&json!({
        "R": {"Version": "4.2.2", "Repositories": [{"Name": "CRAN", "URL": url}]},
        "Packages": {"zeallot": {"Package": "zeallot", "Version": "0.1.0", "Source": "Repository", "Repository": "CRAN"}},
    }))
    .unwrap()
}

async fn one_site(as_nobody: bool) {
    let _ = std::fs::remove_file("/tmp/valve-builds-rprofile-ran");
    let repo = cran::repo();
    let served = repo.serve();
    let apps = format!(
        "[[app]]\nname = \"attacker\"\npath = \"/attacker\"\nfile = \"{}\"\nn_max = 1\n",
        fixture("attacker/plumber.R").display()
    );
    let (dir, keys) = site("max_workers = 8\nn_max = 1", &apps, &[("ann", ""), ("bob", "")]);
    let w = dir.path();
    let cache = w.join("cache");
    let state = w.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let (ann, bob) = (keys[0].1.clone(), keys[1].1.clone());
    let config = w.join("valve.toml");
    let args = ["--config", config.to_str().unwrap(), "--package-cache", cache.to_str().unwrap()];
    let envs = [("VALVE_STATE_DIR", state.to_str().unwrap().to_string()), ("HOME", w.to_str().unwrap().to_string())];
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let valve = if as_nobody {
        crate::landlock::give_to_nobody(w);
        Valve::start_as(Some(65534), &args, &envs, None, |_| {})
    } else {
        Valve::start_with_env(&args, &envs)
    };
    let admin = valve.admin_url();

    // A publishes first: its build of zeallot (were its profile run) would tamper with it.
    let alice = create(&admin, &ann, "alice").await;
    let bundle = tarball(&[
        ("manifest.json", &manifest(served.url(), true)),
        ("plumber.R", CHECK.as_bytes()),
        (".Rprofile", TAMPER.as_bytes()),
    ]);
    publish(&admin, &ann, &alice, bundle).await;
    assert!(valve.log().contains("zeallot 0.1.0: built from source"), "{}", valve.log());
    assert_eq!(check(&valve, "alice").await["tampered"], false, "A's own build ran no profile of A's");
    assert!(!Path::new("/tmp/valve-builds-rprofile-ran").exists(), "no build ran A's .Rprofile");

    // A's running R (any app's) writes nowhere in the shared cache.
    let tamper: Value = client()
        .get(valve.get(&format!("/attacker/tamper?dir={}", cache.display())))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(tamper["tampered"], 0, "an app wrote into the package cache: {tamper}");

    // B's app and a configured app get A's build from the cache: untouched.
    let bobs = create(&admin, &bob, "bob").await;
    publish(
        &admin,
        &bob,
        &bobs,
        tarball(&[("manifest.json", &manifest(served.url(), true)), ("plumber.R", CHECK.as_bytes())]),
    )
    .await;
    let said = valve.log();
    assert!(said.contains("zeallot 0.1.0: installed from cache"), "B's app takes A's build: {said}");
    assert_eq!(check(&valve, "bob").await, json!({"version": "0.1.0", "tampered": false}));
    let conf = w.join("conf");
    std::fs::create_dir(&conf).unwrap();
    std::fs::write(conf.join("plumber.R"), CHECK).unwrap();
    std::fs::write(conf.join("renv.lock"), renv_lock(served.url())).unwrap();
    if as_nobody {
        crate::landlock::give_to_nobody(w);
    }
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!(
        "\n[[app]]\nname = \"conf\"\npath = \"/conf\"\nfile = \"{}\"\n",
        conf.join("plumber.R").display()
    ));
    std::fs::write(&config, text).unwrap();
    let reloaded = valve.admin_client().post(valve.admin("/__valve__/reload")).send().await.unwrap();
    assert_eq!(reloaded.status(), 200);
    wait_until("the configured app to serve", Duration::from_secs(120), || {
        crate::rmarkdown::get(&valve.get("/conf/check")).0 == 200
    });
    assert_eq!(check(&valve, "conf").await, json!({"version": "0.1.0", "tampered": false}));
    let builds = valve.log().matches("zeallot 0.1.0: built from source").count();
    assert_eq!(builds, 1, "built once, for every app");
}

#[tokio::test(flavor = "multi_thread")]
async fn one_publishers_profile_or_running_r_never_reaches_another_apps_packages_from_the_cache() {
    need_r_packages(&["plumber"]);
    assert!(as_root(), "this test runs valve as root and as nobody: run the tests as root, as CI does");
    one_site(false).await;
    one_site(true).await;
}
