//! The warm parent: one R process shared by apps, with the packages apps
//! load already loaded; each new worker is a fork of it that becomes its
//! app's own worker as a fresh R would (its user, folder, `.Renviron`,
//! `.Rprofile`, seed and temporary folder). An app whose library holds
//! another version of what the parent loaded starts a fresh R; the parent's
//! death loses no request.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::harness::{app_dir, as_root, fixture, need_r_packages, pid_alive, preloading, wait_until, Valve};
use crate::rmarkdown::{get, need_rmarkdown};

fn json(url: &str) -> serde_json::Value {
    let (code, body) = get(url);
    assert_eq!(code, 200, "GET {url}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {url}: not JSON ({e}): {body}"))
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// The installed digest package, copied into `lib` with its version changed.
fn older_digest(lib: &Path) {
    let out = Command::new("Rscript").args(["-e", "cat(system.file(package = 'digest'))"]).output().unwrap();
    let installed = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(installed.is_dir(), "digest is installed (scripts/install-deps)");
    copy_dir(&installed, &lib.join("digest"));
    let desc = lib.join("digest/DESCRIPTION");
    let text = std::fs::read_to_string(&desc).unwrap();
    let text: String = text
        .lines()
        .map(|l| if l.starts_with("Version:") { "Version: 0.0.1".to_string() } else { l.to_string() })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(desc, text + "\n").unwrap();
    // R reads an installed package's version from its Meta/package.rds.
    let meta = lib.join("digest/Meta/package.rds");
    let edit = format!("m <- readRDS('{0}'); m$DESCRIPTION[['Version']] <- '0.0.1'; saveRDS(m, '{0}')", meta.display());
    assert!(Command::new("Rscript").args(["-e", &edit]).status().unwrap().success());
}

type About = std::collections::BTreeMap<String, String>;

/// What a worker says it read at start: `key=value;` pairs from "renviron=" on.
fn about_line(text: &str) -> Option<About> {
    let at = text.find("renviron=")?;
    let line = &text[at..text[at..].find(['<', '\n']).map_or(text.len(), |e| at + e)];
    let pairs = line
        .split(';')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Some(pairs)
}

/// What a Shiny app's page says its worker read at start.
fn about_page(url: &str) -> About {
    let (code, page) = get(url);
    assert_eq!(code, 200, "GET {url}: {page}");
    about_line(&page).unwrap_or_else(|| panic!("GET {url}: no about line: {page}"))
}

/// Pages of `url` until two workers answered (a page that opened no session
/// holds its worker a while, so the next one goes to the other).
fn two_workers(url: &str) -> Vec<About> {
    let mut seen: Vec<About> = Vec::new();
    for _ in 0..12 {
        let about = about_page(url);
        if !seen.iter().any(|s| s["pid"] == about["pid"]) {
            seen.push(about);
        }
        if seen.len() == 2 {
            return seen;
        }
    }
    panic!("GET {url}: one worker answered every page: {seen:?}");
}

fn status_app(v: &Valve, name: &str) -> serde_json::Value {
    let status = v.status();
    status["apps"].as_array().unwrap().iter().find(|a| a["name"] == name).unwrap().clone()
}

#[test]
fn each_fork_of_the_warm_parent_is_its_apps_own_worker_and_an_app_that_needs_a_fresh_r_gets_one() {
    need_r_packages(&["plumber", "shiny", "digest"]);
    need_rmarkdown();
    if preloading() {
        // --preload forks from each app's own parent instead: tested by preload::.
        return;
    }
    let site = app_dir();
    for app in ["api", "app", "doc", "newer"] {
        copy_dir(&fixture(&format!("warm/{app}")), &site.path().join(app));
    }
    older_digest(&site.path().join("newer/lib"));
    let config = site.path().join("valve.toml");
    std::fs::write(
        &config,
        format!(
            "preload_packages = [\"digest\"]\nmax_workers = 7\n\
             [[app]]\nname = \"api\"\nfile = \"{0}/api\"\nn_min = 2\nn_max = 2\nmemory_limit = \"150MB\"\n\
             env = {{ WARM_FROM_CONFIG = \"config\" }}\n\
             [[app]]\nname = \"app\"\nfile = \"{0}/app\"\nn_min = 2\nn_max = 2\n\
             [[app]]\nname = \"doc\"\nfile = \"{0}/doc\"\nn_min = 2\nn_max = 2\n\
             [[app]]\nname = \"newer\"\nfile = \"{0}/newer\"\n",
            site.path().display()
        ),
    )
    .unwrap();
    let v = Valve::start(&["--config", config.to_str().unwrap()]);

    // Every worker but newer's is a fork of the warm parent.
    for app in ["api", "app", "doc"] {
        let a = status_app(&v, app);
        for w in a["workers"].as_array().unwrap() {
            assert_eq!(w["started_by"], "warm parent", "{app}: {w}");
        }
    }
    let parent = v.preload_parent().expect("the warm parent runs");
    assert!(std::fs::read_to_string(format!("/proc/{parent}/cmdline")).unwrap().contains("zygote.R"));

    // api's two workers: each its app's own, as a fresh R would be, and individuals.
    // Two requests at once, one on each worker.
    let both: Vec<_> = (0..2)
        .map(|_| {
            let url = v.get("/api/about?sleep=0.5");
            std::thread::spawn(move || json(&url))
        })
        .collect();
    let seen: Vec<serde_json::Value> = both.into_iter().map(|t| t.join().unwrap()).collect();
    assert_ne!(seen[0]["pid"], seen[1]["pid"], "two workers answered: {seen:?}");
    let api_folder = site.path().join("api").display().to_string();
    for about in &seen {
        assert_eq!(about["wd"], api_folder, "its folder is its working directory: {about}");
        assert_eq!(about["renviron"], "api-own", "its .Renviron: {about}");
        assert_eq!(about["rprofile"], "api's own", "its .Rprofile: {about}");
        assert_eq!(about["env"], "config", "its env: {about}");
        // R's byte-code JIT on, as in a fresh R (R's own fork turns it off).
        assert_eq!(about["jit"], 3, "R's JIT level: {about}");
        if as_root() {
            assert_eq!(about["uid"], status_app(&v, "api")["uid"], "its own user: {about}");
            assert!(about["home"].as_str().unwrap().ends_with("/apps/api/home"), "its private home: {about}");
        }
    }
    // Its memory_limit (150MB) bounds it as it would a fresh R (about 71MB with
    // plumber loaded): what the parent loaded for every app is not charged to it.
    assert_eq!(json(&v.get("/api/alloc?mb=50"))["result"], "allocated");
    assert_eq!(get(&v.get("/api/alloc?mb=400")).0, 500, "past its memory_limit");
    assert_ne!(seen[0]["draw"], seen[1]["draw"], "a seed of its own");
    assert_ne!(seen[0]["tempdir"], seen[1]["tempdir"], "a temporary folder of its own");
    // The Shiny app's and the document's workers, each with what it read at start.
    for (app, renviron, rprofile) in [("app", "app-own", "app's own"), ("doc", "doc-own", "doc's own")] {
        let folder = site.path().join(app).display().to_string();
        let seen = if app == "app" {
            two_workers(&v.get(&format!("/{app}/")))
        } else {
            // A document is knitted for a browser's session: its workers note
            // what they read at start in their home instead (its .Rprofile).
            assert_eq!(get(&v.get("/doc/")).0, 200, "the interactive document serves");
            let log = v.home("doc").join("workers.log");
            let lines = || std::fs::read_to_string(&log).unwrap_or_default();
            wait_until("both doc workers' notes", Duration::from_secs(30), || lines().lines().count() >= 2);
            lines().lines().filter_map(about_line).collect()
        };
        for about in &seen {
            assert_eq!(about["wd"], folder, "{app}: its folder is its working directory: {about:?}");
            assert_eq!(about["renviron"], renviron, "{app}: its .Renviron: {about:?}");
            assert_eq!(about["rprofile"], rprofile, "{app}: its .Rprofile: {about:?}");
            if as_root() {
                assert_eq!(about["uid"], status_app(&v, app)["uid"].to_string(), "{app}: its own user: {about:?}");
            }
        }
        assert_ne!(seen[0]["draw"], seen[1]["draw"], "{app}: a seed of its own");
        assert_ne!(seen[0]["tempdir"], seen[1]["tempdir"], "{app}: a temporary folder of its own");
        if app == "app" {
            // The parent has plumber attached for plumber's forks; a Shiny worker, as in a fresh R, shiny only.
            assert_eq!(seen[0]["attached"], "package:shiny", "{app}: {:?}", seen[0]);
        }
    }
    if as_root() {
        let (api_uid, app_uid) = (status_app(&v, "api")["uid"].clone(), status_app(&v, "app")["uid"].clone());
        assert_ne!(api_uid, app_uid, "forks of one parent, two users");
    }

    // newer's library holds digest 0.0.1; the parent loaded another: a fresh R, its own version.
    let newer = json(&v.get("/newer/version"));
    assert_eq!(newer["digest"], "0.0.1", "the app's own version: {newer}");
    assert_eq!(status_app(&v, "newer")["workers"][0]["started_by"], "fresh R");
    assert!(v.log().contains("its library has digest 0.0.1"), "valve says why");

    // The parent dies: no request is lost, and it comes back.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let url = v.get("/api/about");
    let load = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut failed = Vec::new();
            let mut ok = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match get(&url) {
                    (200, _) => ok += 1,
                    other => failed.push(other),
                }
            }
            (ok, failed)
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    unsafe { libc::kill(parent as i32, libc::SIGKILL) };
    v.wait_for_log("the warm parent exited", Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed) = load.join().unwrap();
    assert!(ok > 3 && failed.is_empty(), "{ok} answered, failed: {failed:?}");
    assert!(!pid_alive(parent));
    wait_until("the warm parent back", Duration::from_secs(30), || v.log().matches("warm parent started").count() >= 2);
}
