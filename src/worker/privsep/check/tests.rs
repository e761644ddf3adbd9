use std::path::PathBuf;

use super::super::wire::{Kind, Request, Sandbox, Start};
use super::Rules;
use crate::worker::sandbox::view::{Cover, Steps};

fn rules() -> Rules {
    Rules {
        uid_range: (5000, 5999),
        server: Some((998, 997)),
        named: [1001].into(),
        builders: [6000].into(),
        apps: ["api".to_string(), "boss".to_string()].into(),
        root_apps: ["boss".to_string()].into(),
        r_bins: [(PathBuf::from("R"), PathBuf::from("/usr/bin/R"))].into(),
        warm_keep: Some(0b1100_0000),
        folders: vec![PathBuf::from("/srv/apps"), PathBuf::from("/tmp/valve-x")],
        probe_args: vec!["--vanilla".into(), "-e".into(), "1".into()],
    }
}

fn app(uid: u32) -> Start {
    Start {
        id: 1,
        kind: Kind::App,
        app: Some("api".into()),
        program: "R".into(),
        args: vec!["--file=/tmp/valve-x/lib/launcher.R".into()],
        env: vec![("VALVE_MODE".into(), "plain".into())],
        clear_env: true,
        cwd: Some("/srv/apps/api".into()),
        piped: [false, true, true],
        thp_off: false,
        group_dies: false,
        keep: None,
        sandbox: Some(Sandbox {
            steps: None,
            workdir: Some("/srv/apps/api".into()),
            data_limit: None,
            oom_score_adj: Some(500),
            ids: Some((uid, uid, vec![uid])),
        }),
    }
}

fn refused(start: &Start, says: &str) {
    let why = rules().check(start, &|n| (n == "published").then_some(5100)).expect_err("must be refused");
    assert!(why.contains(says), "{why:?} should say {says:?}");
}

#[test]
fn an_apps_process_is_started_as_one_of_its_uids_only() {
    let checked = rules().check(&app(5001), &|_| None).unwrap();
    assert_eq!(checked.program, PathBuf::from("/usr/bin/R"), "run as the spawner finds it");
    assert!(rules().check(&app(1001), &|_| None).is_ok(), "a run_as user");
    refused(&app(0), "root's");
    refused(&app(998), "valve's own");
    let mut g = app(5001);
    g.sandbox.as_mut().unwrap().ids = Some((5001, 997, vec![]));
    refused(&g, "valve's own");
    refused(&app(7000), "outside uid_range");
    let mut unknown = app(5001);
    unknown.app = Some("nobody".into());
    refused(&unknown, "know it");
    let mut published = app(5100);
    published.app = Some("published".into());
    assert!(rules().check(&published, &|n| (n == "published").then_some(5100)).is_ok());
    let mut root = app(5001);
    root.sandbox.as_mut().unwrap().ids = None;
    refused(&root, "needs a uid");
    root.app = Some("boss".into());
    assert!(rules().check(&root, &|_| None).is_ok(), "run_as = \"root\" is the settings' word");
    let mut caps = app(5001);
    caps.keep = Some(1);
    refused(&caps, "no capability");
}

#[test]
fn paths_outside_valves_folders_or_not_whole_are_refused() {
    let mut s = app(5001);
    s.cwd = Some("/srv/apps/../../root".into());
    refused(&s, "not a whole path");
    let mut s = app(5001);
    s.program = "/tmp/evil".into();
    refused(&s, "not an R binary");
    let mut s = app(5001);
    s.env.push(("A=B".into(), "c".into()));
    refused(&s, "not a name");
    let mut s = app(5001);
    s.sandbox.as_mut().unwrap().steps = Some(Steps {
        clones: vec!["/srv/apps/api".into()],
        covers: vec![Cover::Empty("/srv".into())],
        places: vec![(0, "/etc/cron.d/x".into())],
        inner: vec![],
    });
    refused(&s, "outside what it covered");
}

#[test]
fn the_warm_parent_keeps_no_more_than_forking_needs_and_sets_only_its_own_variables() {
    let mut w = app(5001);
    w.kind = Kind::WarmParent;
    w.app = None;
    w.sandbox = None;
    w.keep = Some(0b0100_0000);
    w.cwd = Some("/tmp/valve-x/zygote".into());
    w.args = ["--no-echo", "--no-restore", "--no-save", "--file=/tmp/valve-x/lib/zygote.R"].map(String::from).to_vec();
    assert!(rules().check(&w, &|_| None).is_ok());
    let mut more = Start { keep: Some(0b1_0000_0000), ..clone(&w) };
    refused(&more, "more than a warm parent");
    more.keep = None;
    refused(&more, "give up");
    let mut env = clone(&w);
    env.env.push(("LD_PRELOAD".into(), "/tmp/valve-x/evil.so".into()));
    refused(&env, "LD_PRELOAD");
    let mut lib = clone(&w);
    lib.env = vec![("VALVE_LOOP".into(), "/home/x/loop.R".into())];
    refused(&lib, "outside valve's folders");
    let mut code = clone(&w);
    code.args[3] = "--file=/home/x/zygote.R".into();
    refused(&code, "outside valve's folders");
    let mut cwd = clone(&w);
    cwd.cwd = Some("/root".into());
    refused(&cwd, "outside valve's folders");
    // Without CAP_SETPCAP valve cannot narrow them: the parent keeps what valve has, and asks nothing.
    let unnarrowed = Rules { warm_keep: None, ..rules() };
    assert!(unnarrowed.check(&Start { keep: None, ..clone(&w) }, &|_| None).is_ok());
    assert!(unnarrowed.check(&w, &|_| None).unwrap_err().contains("CAP_SETPCAP"));
    let mut probe = clone(&w);
    probe.kind = Kind::Probe;
    probe.keep = None;
    refused(&probe, "not valve's question");
}

#[test]
fn a_malformed_or_unknown_request_does_not_parse() {
    for bad in [
        "{",
        r#"{"ask":"start"}"#,
        r#"{"ask":"signal","id":1,"sig":9}"#,
        r#"{"ask":"signal","id":1,"sig":9,"group":true,"also":1}"#,
        r#"{"ask":"chown","path":"/etc"}"#,
    ] {
        assert!(serde_json::from_str::<Request>(bad).is_err(), "{bad}");
    }
}

fn clone(s: &Start) -> Start {
    serde_json::from_value(serde_json::to_value(s).unwrap()).unwrap()
}
