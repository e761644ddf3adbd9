//! Shiny apps: Shiny's own examples in a real headless Chromium, through valve.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::harness::{need_browser, need_program, pid_alive, shiny_example, wait_until, Valve};

fn browser_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser")
}

/// Runs tests/browser/shiny.mjs and returns its output, failing the test if it fails.
fn drive(mode: &str, url: &str, extra: &[&str]) -> String {
    need_browser();
    let out = Command::new("node")
        .arg("shiny.mjs")
        .arg(mode)
        .arg(url)
        .args(extra)
        .current_dir(browser_dir())
        .output()
        .expect("node runs (install nodejs and Debian's chromium; `npm ci` in tests/browser)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("[shiny.mjs {mode}] {text}");
    assert!(out.status.success(), "the {mode} check failed in Chromium: {text}");
    text
}

#[test]
fn hello_renders_its_plot_and_rerenders_on_input() {
    let valve = Valve::start(&["-f", &shiny_example("01_hello")]);
    let seen = drive("hello", &valve.url, &[]);
    assert!(seen.contains("\"rerendered\":true"));
    assert!(valve.log().contains("path=/websocket/ status=101"), "the WebSocket went through valve");
}

#[test]
fn six_upload_sessions_spread_over_three_workers_each_see_their_own_table() {
    // Two sessions per worker: valve grows the pool from one worker as sessions arrive.
    let valve = Valve::start(&["-f", &shiny_example("09_upload"), "-n", "3", "--max-sessions", "2", "--no-access-log"]);
    let seen = drive("upload", &valve.url, &["6"]);
    assert!(seen.contains("\"uploads\":6"), "{seen}");
    assert!(seen.contains("\"sessions\":[2,2,2]"), "sessions per worker: {seen}");
    assert_eq!(valve.workers().len(), 3);
}

#[test]
fn downloads_arrive_whole() {
    let valve = Valve::start(&["-f", &shiny_example("10_download"), "--no-access-log"]);
    let seen = drive("download", &valve.url, &[]);
    assert!(seen.contains("\"filename\":\"rock.csv\""), "{seen}");
    assert!(seen.contains("\"lines\":49"), "48 rows and a header: {seen}");
}

#[test]
fn a_reload_survives_the_death_of_the_sessions_worker() {
    need_browser();
    let valve = Valve::start(&["-f", &shiny_example("01_hello"), "--no-access-log"]);
    let mut node = Command::new("node")
        .args(["shiny.mjs", "survive", &valve.url])
        .current_dir(browser_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("node runs");
    let mut lines = BufReader::new(node.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a line from the browser").unwrap();
    assert!(first.contains("\"ready\":true"), "{first}");
    let victim = valve.workers()[0];
    unsafe { libc::kill(victim as i32, libc::SIGKILL) };
    wait_until("the session's worker to die", Duration::from_secs(5), || !pid_alive(victim));
    node.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = node.wait().unwrap();
    assert!(status.success() && rest.iter().any(|l| l.contains("\"survived\":true")), "{rest:?}");
    assert!(!valve.workers().contains(&victim));
}

#[test]
fn a_page_asked_for_as_its_worker_dies_is_served_by_another() {
    // The worker takes the connection and dies before answering (stopped, then
    // killed, so the race the page load meets in real life happens every time):
    // the page load must get the app from a new worker, not a 502.
    need_program("curl", "curl");
    let valve = Valve::start(&["-f", &shiny_example("01_hello"), "--no-access-log"]);
    let victim = valve.workers()[0];
    unsafe { libc::kill(victim as i32, libc::SIGSTOP) };
    let curl = Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}", "--max-time", "30", &valve.get("/")])
        .stdout(Stdio::piped())
        .spawn()
        .expect("curl runs");
    std::thread::sleep(Duration::from_millis(500));
    unsafe { libc::kill(victim as i32, libc::SIGKILL) };
    let out = curl.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.ends_with("\n200") && text.contains("shiny"), "{text}\n{}", valve.log());
    assert!(valve.log().contains("request to Shiny worker failed"), "the first worker took the request");
    assert!(!valve.workers().contains(&victim));
}

#[test]
fn sessions_are_counted_in_metrics_and_status() {
    let valve = Valve::start(&["-f", &shiny_example("01_hello"), "--no-access-log"]);
    drive("hello", &valve.url, &[]);
    let metrics = Command::new("curl").args(["-s", &valve.get("/__valve__/metrics")]).output().unwrap();
    let text = String::from_utf8_lossy(&metrics.stdout);
    assert!(text.contains("valve_shiny_sessions_opened_total{app=\"01_hello\"} 1"), "{text}");
}
