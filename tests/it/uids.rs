//! An app's own uid never moves once given (as root, as CI runs): two app
//! names whose hashes land on one uid of `uid_range`, added in either order,
//! by a reload or across restarts, each keep the uid they were first given,
//! as their R workers' processes show; and the table that keeps them, read
//! back by `--check`, which writes nothing.

use std::collections::BTreeMap;
use std::path::Path;

use crate::harness::{app_dir, as_root, need_r_packages, wait_until, Valve, START_DEADLINE};

const START: u32 = 1_900_000_000;
const RANGE: &str = "1900000000-1900000999";

/// FNV-1a, 64 bits: how valve placed an app's uid before it kept a table.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

fn legacy_uid(name: &str) -> u32 {
    START + (fnv1a(name.as_bytes()) % 1000) as u32
}

/// Two names on one legacy uid, the first before the second in order (the
/// one valve used to let keep the uid).
fn colliding_names() -> (String, String) {
    let mut seen: BTreeMap<u32, String> = BTreeMap::new();
    for i in 0.. {
        let name = format!("app{i}");
        if let Some(other) = seen.insert(legacy_uid(&name), name.clone()) {
            return if other < name { (other, name) } else { (name, other) };
        }
    }
    unreachable!()
}

/// A folder of plumber apps, one per name, and a config serving `names`.
struct Site {
    dir: tempfile::TempDir,
}

impl Site {
    fn new(names: &[&str]) -> Site {
        let dir = app_dir();
        for name in names {
            let folder = dir.path().join(name);
            std::fs::create_dir(&folder).unwrap();
            std::fs::write(folder.join("plumber.R"), "#* @get /\nfunction() 1\n").unwrap();
        }
        Site { dir }
    }

    /// Writes the config with `names` in this order; returns its path.
    fn config(&self, names: &[&str]) -> String {
        let mut text = format!("uid_range = \"{RANGE}\"\nmax_workers = 4\n");
        for name in names {
            text.push_str(&format!(
                "\n[[app]]\nname = \"{name}\"\npath = \"/{name}\"\nfile = \"{}\"\nn_min = 1\nn_max = 1\n",
                self.dir.path().join(name).join("plumber.R").display()
            ));
        }
        let path = self.dir.path().join("valve.toml");
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }
}

/// Each app's uid as the status says it and as its worker's process has it.
fn uids(v: &Valve) -> BTreeMap<String, u32> {
    let status = v.status();
    let mut out = BTreeMap::new();
    for app in status["apps"].as_array().unwrap() {
        let name = app["name"].as_str().unwrap().to_string();
        let said = app["uid"].as_u64().unwrap_or_else(|| panic!("{name}'s uid in the status: {app}")) as u32;
        let pid = app["workers"][0]["pid"].as_u64().unwrap_or_else(|| panic!("{name}'s worker: {app}")) as u32;
        let proc = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let real: u32 =
            proc.lines().find(|l| l.starts_with("Uid:")).unwrap().split_whitespace().nth(1).unwrap().parse().unwrap();
        assert_eq!(said, real, "{name}: the status names the uid its R runs as");
        out.insert(name, real);
    }
    out
}

fn start(config: &str, state: &Path) -> Valve {
    Valve::start_with_env(&["--config", config], &[("VALVE_STATE_DIR", state.to_str().unwrap())])
}

#[test]
fn two_apps_whose_names_collide_keep_their_uids_in_either_order_across_reloads_and_restarts() {
    need_r_packages(&["plumber"]);
    assert!(as_root(), "this test checks the uids valve gives as root: run the tests as root, as CI does");
    let (a, b) = colliding_names();
    let shared = legacy_uid(&a);
    assert_eq!(shared, legacy_uid(&b));
    let site = Site::new(&[&a, &b]);

    // b alone first: it gets the uid valve gave it before the table (upgrading moves no app's files).
    let state = tempfile::tempdir().unwrap();
    let v = start(&site.config(&[&b]), state.path());
    assert_eq!(uids(&v)[&b], shared, "a first run keeps the uid valve gave {b} before");
    // a comes by a reload: its hash lands on b's uid, which b keeps.
    site.config(&[&a, &b]);
    v.signal(libc::SIGHUP);
    wait_until(&format!("{a}'s worker after the reload"), START_DEADLINE, || {
        v.status()["apps"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["name"] == a.as_str() && x["workers"][0]["pid"].is_u64())
    });
    let after = uids(&v);
    assert_eq!(after[&b], shared, "{b} keeps its uid when {a} comes, though {a} sorts first: {after:?}");
    assert_ne!(after[&a], shared, "{after:?}");
    assert!((START..START + 1000).contains(&after[&a]), "{after:?}");
    let table = state.path().join("uids");
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(&table).expect("the uid table is written in the state folder");
    assert_eq!((meta.mode() & 0o777, meta.uid()), (0o600, 0), "root's, private");
    drop(v);

    // Restarted, the apps listed the other way round: the same uids.
    let v = start(&site.config(&[&b, &a]), state.path());
    assert_eq!(uids(&v), after, "across a restart");
    drop(v);
    // --check reads the table, says the same uids and writes nothing.
    let before = std::fs::read(&table).unwrap();
    let check = Valve::run_to_exit_with_env(
        &["--check", "--config", &site.config(&[&a, &b])],
        &[("VALVE_STATE_DIR", state.path().to_str().unwrap())],
        START_DEADLINE,
    );
    assert_eq!(check.status.code(), Some(0), "{}", check.stderr);
    assert_eq!(std::fs::read(&table).unwrap(), before, "--check writes nothing");

    // The other order: a alone first keeps its uid when b comes, at a restart.
    let state = tempfile::tempdir().unwrap();
    let v = start(&site.config(&[&a]), state.path());
    assert_eq!(uids(&v)[&a], shared);
    drop(v);
    let v = start(&site.config(&[&a, &b]), state.path());
    let other = uids(&v);
    assert_eq!(other[&a], shared, "{a} keeps its uid when {b} comes: {other:?}");
    assert_ne!(other[&b], shared, "{other:?}");
}
