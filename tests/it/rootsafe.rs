//! Root never follows a name an app controls. As root, valve makes and
//! opens files in each app's run folder (`RUN/apps/NAME`: its workers'
//! FIFOs, their environment files, a package check's list, a document's
//! render folder). An app's own R tries to put links there under those
//! names, pointing at a root-owned file and a root-owned folder outside
//! (tests/fixtures/rootsafe); across many worker starts, a reload that
//! renders a document again and a published bundle's package check, the
//! links are refused, nothing outside is written or given away, and no
//! worker holds a root-owned file open for writing. Also: valve's own
//! environment does not reach an isolated app's R, only what it allows and
//! the app's own `env`. Run with fresh R (the warm parent's forks) and with
//! VALVE_PRELOAD=true (the app's own preload parent's forks). And the warm
//! parent keeps only CAP_SETUID, CAP_SETGID (and for views CAP_SYS_ADMIN,
//! CAP_DAC_READ_SEARCH) of root's rights; its forks keep none.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::harness::{
    app_dir, as_root, client, fixture, need_r_packages, valve_bin, wait_until, Valve, START_DEADLINE,
};
use crate::rmarkdown::{get, need_rmarkdown};

const BAIT: &str = "root's own file, never to be written by valve for an app\n";

/// The root-owned targets of the app's links: a file and a folder.
struct Targets {
    bait: PathBuf,
    outside: PathBuf,
}

impl Targets {
    fn new(site: &Path) -> Targets {
        let bait = site.join("bait.txt");
        std::fs::write(&bait, BAIT).unwrap();
        std::fs::set_permissions(&bait, std::fs::Permissions::from_mode(0o644)).unwrap();
        let outside = site.join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o755)).unwrap();
        Targets { bait, outside }
    }

    /// The file and the folder are as the test made them.
    fn untouched(&self, when: &str) {
        let meta = std::fs::metadata(&self.bait).unwrap();
        assert_eq!(std::fs::read_to_string(&self.bait).unwrap(), BAIT, "{when}: the root-owned file was written");
        assert_eq!((meta.uid(), meta.gid(), meta.mode() & 0o7777), (0, 0, 0o644), "{when}: the file's owner or mode");
        let meta = std::fs::metadata(&self.outside).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid(), meta.mode() & 0o7777),
            (0, 0, 0o755),
            "{when}: the folder outside was given to an app"
        );
        assert_eq!(std::fs::read_dir(&self.outside).unwrap().count(), 0, "{when}: something was made outside");
    }
}

/// A folder for an app (0755, root's), with the fixture's files and plant.R.
fn app_folder(site: &Path, name: &str) -> PathBuf {
    let dir = site.join(name);
    std::fs::create_dir(&dir).unwrap();
    for entry in std::fs::read_dir(fixture(&format!("rootsafe/{name}"))).unwrap().flatten() {
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    std::fs::copy(fixture("rootsafe/plant.R"), dir.join("plant.R")).unwrap();
    for entry in std::fs::read_dir(&dir).unwrap().flatten() {
        std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// valve's run directory, from its R processes.
fn run_dir(v: &Valve) -> PathBuf {
    crate::harness::run_dir_of(v.r_processes()).expect("no R process of valve's names its run directory")
}

/// No worker holds a root-owned regular file open for writing (its stdout
/// and stderr are its FIFO or pipes; what it reads, such as the launcher, may be root's).
fn no_worker_writes_a_root_file(v: &Valve, when: &str) {
    for pid in v.workers() {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { continue };
        for fd in fds.flatten() {
            let Ok(meta) = std::fs::metadata(fd.path()) else { continue };
            if !meta.is_file() || meta.uid() != 0 {
                continue;
            }
            let n = fd.file_name().to_string_lossy().to_string();
            let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{n}")).unwrap_or_default();
            let flags = info
                .lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
                .unwrap_or(0);
            let target = std::fs::read_link(fd.path()).unwrap_or_default();
            assert_eq!(
                flags & 3,
                0,
                "{when}: worker {pid} holds root's {} open for writing (fd {n})",
                target.display()
            );
        }
    }
}

fn json(url: &str) -> serde_json::Value {
    let (code, body) = get(url);
    assert_eq!(code, 200, "GET {url}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {url}: not JSON ({e}): {body}"))
}

/// The ids of app `name`'s workers in valve's status.
fn worker_ids(v: &Valve, name: &str) -> Vec<u64> {
    let status = v.status();
    let apps = status["apps"].as_array().cloned().unwrap_or_default();
    let app = apps.iter().find(|a| a["name"] == name).cloned().unwrap_or_default();
    app["workers"].as_array().map(|w| w.iter().filter_map(|w| w["id"].as_u64()).collect()).unwrap_or_default()
}

/// Links under valve's names in `run` for ids 0..=to, by the app at `prefix`.
fn plant(v: &Valve, prefix: &str, run: &Path, t: &Targets, to: u64) -> (u64, u64) {
    let said = json(&v.get(&format!(
        "{prefix}/plant?run={}&bait={}&outside={}&from=0&to={to}",
        run.display(),
        t.bait.display(),
        t.outside.display()
    )));
    (said["made"].as_u64().unwrap(), said["refused"].as_u64().unwrap())
}

fn config(site: &Path, api: &Path, doc: &Path, t: &Targets) -> PathBuf {
    let keys = site.join("keys");
    let file = site.join("valve.toml");
    std::fs::write(
        &file,
        format!(
            "publish_dir = \"{}\"\npublish_keys_file = \"{}\"\npublish_versions = \"at-least\"\n\n\
             [[app]]\nname = \"api\"\npath = \"/api\"\nfile = \"{}\"\nn_max = 1\n\
             env = {{ APP_OWN = \"from-config\" }}\n\n\
             [[app]]\nname = \"doc\"\npath = \"/doc\"\nfile = \"{}\"\nn_max = 1\n\
             env = {{ ROOTSAFE_BAIT = \"{}\", ROOTSAFE_OUTSIDE = \"{}\" }}\n",
            site.join("published").display(),
            keys.display(),
            api.display(),
            doc.join("doc.Rmd").display(),
            t.bait.display(),
            t.outside.display()
        ),
    )
    .unwrap();
    file
}

/// A new publishing key (the key, its line for the keys file).
fn new_key() -> (String, String) {
    let out = std::process::Command::new(valve_bin()).args(["publish-key", "ci"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    (lines[0].to_string(), lines[1].to_string())
}

/// A gzipped tar of files.
fn tarball(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    for (path, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        h.set_cksum();
        b.append_data(&mut h, path, *data).unwrap();
    }
    b.into_inner().unwrap().finish().unwrap()
}

/// Deploys `bundle` as content `guid` through the v1 calls: the task's last
/// answer and every line it said.
async fn deploy(api: &str, auth: &str, guid: &str, bundle: Vec<u8>) -> (serde_json::Value, Vec<String>) {
    let call = |method: reqwest::Method, path: &str| {
        client().request(method, format!("{api}{path}")).header("Authorization", auth)
    };
    let resp = call(reqwest::Method::POST, &format!("/v1/content/{guid}/bundles")).body(bundle).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let id = resp.json::<serde_json::Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    let resp = call(reqwest::Method::POST, &format!("/v1/content/{guid}/deploy"))
        .json(&serde_json::json!({ "bundle_id": id }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let task = resp.json::<serde_json::Value>().await.unwrap()["task_id"].as_str().unwrap().to_string();
    let (mut first, mut lines) = (0, Vec::new());
    for _ in 0..200 {
        let t: serde_json::Value = call(reqwest::Method::GET, &format!("/v1/tasks/{task}?first={first}&wait=1"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        lines.extend(t["output"].as_array().into_iter().flatten().filter_map(|l| l.as_str()).map(String::from));
        if t["finished"] == true {
            return (t, lines);
        }
        first = t["last"].as_u64().unwrap_or(first);
    }
    panic!("the deployment of {guid} did not end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_apps_links_under_valves_names_in_its_run_folder_are_refused_and_never_followed() {
    need_r_packages(&["plumber"]);
    need_rmarkdown();
    assert!(as_root(), "this test checks what valve does as root: run the tests as root, as CI does");
    let site_dir = app_dir();
    let site = site_dir.path();
    let t = Targets::new(site);
    let (api, doc) = (app_folder(site, "api"), app_folder(site, "doc"));
    let (key, line) = new_key();
    std::fs::write(site.join("keys"), format!("{line}\n")).unwrap();
    let file = config(site, &api, &doc, &t);
    let v = Valve::start(&["--config", file.to_str().unwrap()]);
    let run = run_dir(&v);
    t.untouched("at start");

    // The document planted links for the next renders when it was rendered:
    // refused (its run folder is valve's), and said so in its render's output.
    v.wait_for_log("rootsafe-planted", START_DEADLINE);
    assert!(v.log().contains("rootsafe-planted made=0 refused="), "the document's links were refused");

    // The API plants links for every id to come, then ends its worker again
    // and again: each new worker's FIFO, environment file and socket are valve's.
    let api_run = run.join("apps/api");
    for round in 0..5 {
        let next = worker_ids(&v, "api").into_iter().max().unwrap_or(0) + 40;
        let (made, refused) = plant(&v, "/api", &api_run, &t, next);
        assert_eq!(made, 0, "round {round}: the app made links in its run folder ({refused} refused)");
        assert!(refused > 0);
        let before = worker_ids(&v, "api");
        let _ = get(&v.get("/api/quit"));
        wait_until("a new worker of the API", START_DEADLINE, || {
            let now = worker_ids(&v, "api");
            !now.is_empty() && now != before && get(&v.get("/api/env?name=APP_OWN")).0 == 200
        });
        t.untouched(&format!("after worker start {round}"));
        no_worker_writes_a_root_file(&v, &format!("after worker start {round}"));
    }

    // A reload renders the document again, into a new render folder.
    let text = std::fs::read_to_string(doc.join("doc.Rmd")).unwrap();
    std::fs::write(doc.join("doc.Rmd"), text.replace("Rendered.", "Rendered again.")).unwrap();
    v.signal(libc::SIGHUP);
    wait_until("the document rendered again", START_DEADLINE, || {
        let (code, page) = get(&v.get("/doc/"));
        code == 200 && page.contains("Rendered again.")
    });
    let renders = v.log().matches("rootsafe-planted").count();
    assert_eq!(renders, 2, "rendered again on the reload, into a new render folder");
    t.untouched("after the reload");
    no_worker_writes_a_root_file(&v, "after the reload");

    // A published API plants links for the package checks to come; the next
    // deployment checks its packages.
    let api_url = format!("{}/__api__", v.admin_url());
    let auth = format!("Key {key}");
    let resp = client()
        .post(format!("{api_url}/v1/content"))
        .header("Authorization", &auth)
        .json(&serde_json::json!({ "name": "pub" }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let guid = resp.json::<serde_json::Value>().await.unwrap()["guid"].as_str().unwrap().to_string();
    // The jsonlite the server's R holds: the deployment's restore takes it
    // from there (the app's R lists its library as the check did).
    let held = std::process::Command::new("Rscript")
        .args(["-e", "cat(utils::packageDescription('jsonlite')$Version)"])
        .output()
        .unwrap();
    let held = String::from_utf8_lossy(&held.stdout).trim().to_string();
    let manifest = serde_json::json!({"version": 1, "metadata": {"appmode": "api"},
        "packages": {"jsonlite": {"Source": "CRAN", "description": {"Package": "jsonlite", "Version": held}}}})
    .to_string();
    let manifest = manifest.as_bytes();
    let plumber = std::fs::read(api.join("plumber.R")).unwrap();
    let planter = std::fs::read(api.join("plant.R")).unwrap();
    let bundle = || tarball(&[("manifest.json", manifest), ("plumber.R", &plumber), ("plant.R", &planter)]);
    let (done, _) = deploy(&api_url, &auth, &guid, bundle()).await;
    assert_eq!(done["code"], 0, "the first deployment: {done}");
    let pub_run = std::fs::read_dir(run.join("apps"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| n != "api" && n != "doc"))
        .expect("the published app's run folder");
    let (made, _) = plant(&v, "/pub", &pub_run, &t, 60);
    assert_eq!(made, 0, "the published app made links in its run folder");
    let (done, said) = deploy(&api_url, &auth, &guid, bundle()).await;
    assert_eq!(done["code"], 0, "the second deployment: {done}");
    assert!(
        said.iter().any(|l| l.starts_with("jsonlite ") && l.contains("from R's library")),
        "its packages were restored: {said:?}"
    );
    t.untouched("after the package checks");
    no_worker_writes_a_root_file(&v, "after the package checks");
    wait_until("the published API serves", Duration::from_secs(30), || get(&v.get("/pub/env?name=PATH")).0 == 200);
}

#[test]
fn valves_own_environment_does_not_reach_an_isolated_apps_r_but_its_own_env_does() {
    need_r_packages(&["plumber"]);
    assert!(as_root(), "this test checks what valve does as root: run the tests as root, as CI does");
    let site_dir = app_dir();
    let site = site_dir.path();
    let api = app_folder(site, "api");
    let file = site.join("valve.toml");
    std::fs::write(
        &file,
        format!(
            "[[app]]\nname = \"api\"\npath = \"/api\"\nfile = \"{}\"\nn_max = 1\nenv = {{ APP_OWN = \"from-config\" }}\n",
            api.display()
        ),
    )
    .unwrap();
    let v = Valve::start_with_env(&["--config", file.to_str().unwrap()], &[("SITE_SECRET", "xyz"), ("LC_TIME", "C")]);
    let env = |name: &str| json(&v.get(&format!("/api/env?name={name}")))["value"].as_str().unwrap().to_string();
    assert_eq!(env("SITE_SECRET"), "<unset>", "a variable of valve's own reached the app's R");
    assert_eq!(env("APP_OWN"), "from-config", "the app's own env");
    assert_eq!(env("LC_TIME"), "C", "the locale is allowed through");
    assert!(env("PATH").contains("/usr/bin"), "the search path is allowed through");
    assert!(env("HOME").ends_with("/apps/api/home"), "HOME is the app's private home");
    // Nor what the warm parent set for itself.
    assert_eq!(env("VALVE_PRELOAD_PACKAGES"), "<unset>");
    assert_eq!(env("VALVE_LOG"), "<unset>", "valve's own settings are not the app's");
}

#[test]
fn a_fork_that_cannot_enter_its_sandbox_is_noticed_at_once_and_a_fresh_r_tried() {
    need_r_packages(&["plumber"]);
    assert!(as_root(), "this test checks what valve does as root: run the tests as root, as CI does");
    if crate::harness::preloading() {
        eprintln!("with --preload the app's own parent forks its workers, inside its sandbox already: nothing to try");
        return;
    }
    let site_dir = app_dir();
    let site = site_dir.path();
    let api = app_folder(site, "api");
    // A library folder in the app's view (a folder under /tmp is placed in
    // it by its own mount), gone before the next fork enters the sandbox.
    let lib = site.join("lib");
    std::fs::create_dir(&lib).unwrap();
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = site.join("valve.toml");
    std::fs::write(
        &file,
        format!(
            "[[app]]\nname = \"api\"\npath = \"/api\"\nfile = \"{}\"\nn_max = 1\nstart_timeout = 600\n\
             env = {{ R_LIBS = \"{}\" }}\n",
            api.display(),
            lib.display()
        ),
    )
    .unwrap();
    let v = Valve::start(&["--config", file.to_str().unwrap()]);
    v.wait_for_log("valve-zygote-ready", START_DEADLINE);
    assert_eq!(get(&v.get("/api/env?name=R_LIBS")).0, 200);
    std::fs::remove_dir(&lib).unwrap();
    let _ = get(&v.get("/api/quit"));
    // Said by the fork on the warm parent's output before it had a FIFO, and
    // heard at once: far sooner than the app's start timeout of ten minutes.
    v.wait_for_log("a fork could not enter the app's sandbox", START_DEADLINE);
    let log = v.log();
    assert!(log.contains(&format!("{}: errno 2", lib.display())), "the step and its error are named: {log}");
    assert!(log.contains("the app's workers start as fresh R, not from the warm parent"), "{log}");
}

/// A capability set of `pid` (`CapEff`, `CapBnd`...) from /proc/PID/status.
fn cap_set(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(&format!("{field}:"))).unwrap_or_else(|| panic!("{field}"));
    u64::from_str_radix(line[field.len() + 1..].trim(), 16).unwrap()
}

#[test]
fn as_root_the_warm_parent_holds_only_what_switching_users_needs_and_its_forks_nothing() {
    need_r_packages(&["plumber"]);
    assert!(as_root(), "this test checks what valve does as root: run the tests as root, as CI does");
    if crate::harness::preloading() {
        eprintln!(
            "with --preload the app's own parent forks its workers, inside its sandbox already: nothing to check"
        );
        return;
    }
    let site_dir = app_dir();
    let site = site_dir.path();
    let api = app_folder(site, "api");
    let file = site.join("valve.toml");
    std::fs::write(&file, format!("[[app]]\nname = \"api\"\npath = \"/api\"\nfile = \"{}\"\n", api.display())).unwrap();
    let v = Valve::start(&["--config", file.to_str().unwrap()]);
    v.wait_for_log("valve-zygote-ready", START_DEADLINE);
    assert_eq!(get(&v.get("/api/env?name=HOME")).0, 200);
    let parent = v.preload_parent().expect("valve's warm parent");
    // CAP_SETGID and CAP_SETUID; where valve has CAP_SYS_ADMIN (private
    // views: its forks make their view before they switch) that and
    // CAP_DAC_READ_SEARCH (covers over hidden paths in folders not root's).
    let mut want = (1u64 << 6) | (1 << 7);
    if cap_set(v.pid(), "CapEff") & (1 << 21) != 0 {
        want |= (1 << 21) | (1 << 2);
    }
    for field in ["CapEff", "CapPrm", "CapBnd"] {
        assert_eq!(cap_set(parent, field), want, "the warm parent's {field}: {:x}", cap_set(parent, field));
    }
    assert_eq!(cap_set(parent, "CapInh"), 0, "nothing inheritable");
    assert_eq!(cap_set(parent, "CapAmb"), 0, "nothing ambient");
    let forks: Vec<u32> = v.workers().into_iter().filter(|p| *p != parent).collect();
    assert!(!forks.is_empty(), "the app's worker is a fork of the warm parent");
    for fork in forks {
        let uid = std::fs::metadata(format!("/proc/{fork}")).unwrap().uid();
        assert_ne!(uid, 0, "a fork runs as its app's user");
        assert_eq!((cap_set(fork, "CapEff"), cap_set(fork, "CapPrm")), (0, 0), "a fork {fork} holds no capability");
    }
    assert!(!v.log().contains("keeps all of root's capabilities"), "{}", v.log());
}
