//! Shiny sessions that survive the network and the worker (docs/design/shiny-reconnect.md). Real
//! Chromium (tests/browser/reconnect.mjs) drives tests/fixtures/shiny_reconnect
//! (and Shiny's own examples) through a proxy whose connections the test cuts
//! (`cut::Cuttable`); valve and R are the real ones. Deadlines here are
//! generous limits, not figures: bench/reconnect measures how fast.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::cut::Cuttable;
use crate::harness::{fixture, need_browser, pid_alive, shiny_example, wait_until, Valve};

/// One browser page, driven line by line.
pub struct Page {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Page {
    pub async fn open(url: &str) -> Page {
        need_browser();
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
        let mut child = Command::new("node")
            .args(["reconnect.mjs", url])
            .current_dir(dir)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("node runs (install nodejs and Debian's chromium; `npm ci` in tests/browser)");
        let stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = next_json(&mut lines).await;
        assert_eq!(first["ready"], true, "the page connected: {first}");
        Page { child, stdin, lines }
    }

    /// Sends one command and returns the driver's answer.
    pub async fn ask(&mut self, command: Value) -> Value {
        self.stdin.write_all(format!("{command}\n").as_bytes()).await.unwrap();
        let answer = next_json(&mut self.lines).await;
        assert!(answer.get("error").is_none(), "{command} failed in the page: {answer}");
        answer
    }

    pub async fn state(&mut self) -> Value {
        self.ask(json!({"op": "state"})).await
    }

    /// After a cut: waits until the page has resumed once more than it had in
    /// `before` and is back on the same session. (Waiting for "the same
    /// session" alone can end before the page has noticed the cut.)
    pub async fn wait_resumed(&mut self, before: &Value) -> Value {
        let min = before["resumes"].as_u64().unwrap_or(0) + 1;
        self.ask(json!({"op": "wait", "for": "same", "timeout": 60, "min_resumes": min})).await
    }

    pub async fn close(mut self) {
        drop(self.stdin);
        let _ = tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await;
    }
}

async fn next_json(lines: &mut Lines<BufReader<ChildStdout>>) -> Value {
    loop {
        let line = tokio::time::timeout(Duration::from_secs(120), lines.next_line())
            .await
            .expect("the driver answers within 2 minutes")
            .expect("the driver's output")
            .expect("the driver is still running");
        if let Ok(v) = serde_json::from_str::<Value>(&line) {
            return v;
        }
    }
}

fn app() -> String {
    fixture("shiny_reconnect").display().to_string()
}

/// The value of one sample in valve's metrics (0 if absent).
fn metric(valve: &Valve, sample: &str) -> f64 {
    let text = reqwest_blocking(&valve.admin("/__valve__/metrics"));
    text.lines().find_map(|l| l.strip_prefix(sample).and_then(|v| v.trim().parse().ok())).unwrap_or(0.0)
}

fn reqwest_blocking(url: &str) -> String {
    let mut cmd = std::process::Command::new("curl");
    if let Some(token) = crate::harness::token_for(url) {
        cmd.args(["-H", &format!("Authorization: Bearer {token}")]);
    }
    let out = cmd.args(["-s", url]).output().expect("curl runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn seen(state: &Value) -> Vec<String> {
    state["seen"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str().map(String::from)).collect())
        .unwrap_or_default()
}

pub fn expected(tag: &str, n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("{tag}{i}")).collect()
}

/// Shared checks: the same session, nothing lost or repeated, no reload, no grey overlay.
pub fn same_session(before: &Value, after: &Value) {
    assert_eq!(after["token"], before["token"], "the same R session: {after}");
    assert_eq!(after["marker_ok"], true, "no page reload: {after}");
    assert_eq!(after["overlay_seen"], false, "Shiny's grey overlay never showed: {after}");
    assert_eq!(after["ticks"]["ok"], true, "every message R sent arrived once, in order: {after}");
    assert_eq!(after["restarts"], 0, "{after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_blip_resumes_the_same_session_with_every_message_once_in_order() {
    let valve = Valve::start(&["-f", &app(), "--no-access-log"]);
    let proxy = Cuttable::start(&valve.url).await;
    let mut page = Page::open(&proxy.url).await;
    page.ask(json!({"op": "type", "text": "typed before"})).await;
    let before = page.state().await;
    // 50 inputs over 2 s, with the connection cut twice while they go.
    page.ask(json!({"op": "burst", "n": 50, "tag": "a"})).await;
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(600)).await;
        proxy.cut();
    }
    let back = page.wait_resumed(&before).await;
    let after = page.ask(json!({"op": "waitCount", "n": 50, "timeout": 60})).await;
    same_session(&before, &after);
    assert_eq!(seen(&after), expected("a", 50), "R got each input once, in order: {after}");
    assert_eq!(after["name"], "typed before");
    assert!(after["resumes"].as_u64().unwrap() >= 1, "{after}");
    assert!(metric(&valve, "valve_shiny_sessions_resumed_total{app=\"shiny_reconnect\"}") >= 1.0);
    eprintln!("back after the blip in {} ms", back["ms"]);
    page.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_20_second_outage_resumes_the_same_session() {
    let valve = Valve::start(&["-f", &app(), "--no-access-log"]);
    let proxy = Cuttable::start(&valve.url).await;
    let mut page = Page::open(&proxy.url).await;
    page.ask(json!({"op": "slider", "value": 42})).await;
    let before = page.state().await;
    proxy.set_down(true);
    tokio::time::sleep(Duration::from_secs(20)).await;
    // R went on sending ticks meanwhile: they arrive once, in order.
    proxy.set_down(false);
    let back = page.wait_resumed(&before).await;
    let after = page.state().await;
    same_session(&before, &after);
    assert_eq!(after["notice_seen"], true, "the small notice showed while away: {after}");
    assert!(after["ticks"]["n"].as_u64() > before["ticks"]["n"].as_u64(), "{before} {after}");
    assert_eq!(after["n"], "42");
    eprintln!("back {} ms after the network returned", back["ms"]);
    page.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn past_the_window_a_new_session_starts_with_the_users_inputs() {
    let valve = Valve::start(&["-f", &app(), "--no-access-log", "--shiny-reconnect-window", "3"]);
    let proxy = Cuttable::start(&valve.url).await;
    let mut page = Page::open(&proxy.url).await;
    page.ask(json!({"op": "type", "text": "kept"})).await;
    page.ask(json!({"op": "slider", "value": 37})).await;
    page.ask(json!({"op": "click"})).await;
    let before = page.state().await;
    let old = before["token"].as_str().unwrap().to_string();
    proxy.set_down(true);
    tokio::time::sleep(Duration::from_secs(7)).await;
    valve.wait_for_log(&format!("session ended {old}"), Duration::from_secs(10));
    proxy.set_down(false);
    let after = page.ask(json!({"op": "wait", "for": "fresh", "timeout": 60})).await;
    assert_eq!(after["marker_ok"], true, "no page reload: {after}");
    assert_eq!((&after["name"], &after["n"]), (&json!("kept"), &json!("37")), "inputs restored: {after}");
    assert_eq!(after["go"], "0", "a restart never presses the button again: {after}");
    assert!(after["restarts"].as_u64().unwrap() >= 1, "{after}");
    assert!(metric(&valve, "valve_shiny_sessions_ended_total{app=\"shiny_reconnect\",reason=\"window\"}") >= 1.0);
    assert!(metric(&valve, "valve_shiny_sessions_restarted_total{app=\"shiny_reconnect\"}") >= 1.0);
    wait_until("one session left", Duration::from_secs(10), || valve.status()["apps"][0]["sessions"] == 1);
    page.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_worker_gives_a_new_session_on_another_worker_with_the_inputs() {
    let valve = Valve::start(&["-f", &app(), "--no-access-log", "-n", "2"]);
    let proxy = Cuttable::start(&valve.url).await;
    let mut page = Page::open(&proxy.url).await;
    page.ask(json!({"op": "type", "text": "survives a crash"})).await;
    page.ask(json!({"op": "slider", "value": 64})).await;
    let holder = valve.status()["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["sessions"] == 1)
        .and_then(|w| w["pid"].as_u64())
        .expect("the worker holding the session") as u32;
    unsafe { libc::kill(holder as i32, libc::SIGKILL) };
    wait_until("the session's worker to die", Duration::from_secs(5), || !pid_alive(holder));
    let after = page.ask(json!({"op": "wait", "for": "fresh", "timeout": 60})).await;
    assert_eq!(after["marker_ok"], true, "no page reload: {after}");
    assert_eq!(after["overlay_seen"], false, "no grey overlay: {after}");
    assert_eq!((&after["name"], &after["n"]), (&json!("survives a crash"), &json!("64")), "inputs restored: {after}");
    eprintln!("a new session with the inputs {} ms after the kill", after["ms"]);
    let pid = page.ask(json!({"op": "eval", "js": "document.getElementById('pid').textContent"})).await;
    assert_ne!(pid["value"], json!(holder.to_string()), "the new session is on a live worker");
    page.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leaving_the_page_ends_the_session_at_once_and_a_reload_of_the_app_keeps_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("shiny_reconnect");
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(fixture("shiny_reconnect/app.R"), dir.join("app.R")).unwrap();
    let app = dir.display().to_string();
    let valve = Valve::start(&["-f", &app, "--no-access-log"]);
    let proxy = Cuttable::start(&valve.url).await;
    let mut page = Page::open(&proxy.url).await;
    let before = page.state().await;
    // A reload of the app (its file changed): the session stays on its worker, resumable.
    let mut source = std::fs::read_to_string(dir.join("app.R")).unwrap();
    source.push_str("\n# changed\n");
    std::fs::write(dir.join("app.R"), source).unwrap();
    valve.signal(libc::SIGHUP);
    valve.wait_for_log("reload", Duration::from_secs(30));
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.cut();
    page.wait_resumed(&before).await;
    let after = page.state().await;
    same_session(&before, &after);
    // Leaving the page (here: reloading it) ends the R session now, not after the window.
    let old = after["token"].as_str().unwrap().to_string();
    page.ask(json!({"op": "reload"})).await;
    valve.wait_for_log(&format!("session ended {old}"), Duration::from_secs(10));
    wait_until("the session counted as left", Duration::from_secs(10), || {
        metric(&valve, "valve_shiny_sessions_ended_total{app=\"shiny_reconnect\",reason=\"left\"}") >= 1.0
    });
    page.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forged_or_borrowed_secret_never_attaches_to_a_session() {
    let valve = Valve::start(&["-f", &app(), "--no-access-log"]);
    let proxy = Cuttable::start(&valve.url).await;
    let mut alice = Page::open(&proxy.url).await;
    let mut bob = Page::open(&valve.url).await;
    let a = alice.state().await;
    let b = bob.state().await;
    let sid = a["sid"].as_str().expect("the page knows its session id").to_string();
    let bob_secret = b["secret"].as_str().expect("the driver saw Bob's secret").to_string();
    let forged = "0".repeat(32);
    for hello in [
        format!("h {sid} {forged} 0"),
        format!("h {sid} {bob_secret} 0"),
        format!("h {} {bob_secret} 0", "f".repeat(24)),
        "h x".into(),
    ] {
        let code = resume_with(&valve.url, &hello).await;
        assert_eq!(code, Some(4700), "{hello:?} is refused with 4700");
    }
    assert_eq!(metric(&valve, "valve_shiny_resumes_refused_total{app=\"shiny_reconnect\"}"), 4.0);
    // Alice's session is untouched and still resumes; Bob's too.
    proxy.cut();
    let after = alice.wait_resumed(&a).await;
    same_session(&a, &after);
    assert_eq!(bob.state().await["token"], b["token"]);
    alice.close().await;
    bob.close().await;
}

/// Opens a resume socket by hand, says `hello`, and returns the close code valve sends.
async fn resume_with(url: &str, hello: &str) -> Option<u16> {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::Message;
    let addr = url.trim_start_matches("http://").to_string();
    let mut req = format!("ws://{addr}/websocket/").into_client_request().unwrap();
    req.headers_mut().insert("Sec-WebSocket-Protocol", "valve-shiny.1, valve-resume".parse().unwrap());
    let stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (mut ws, resp) = tokio_tungstenite::client_async(req, stream).await.expect("valve answers the upgrade");
    assert_eq!(resp.headers()["sec-websocket-protocol"], "valve-shiny.1");
    ws.send(Message::text(hello)).await.unwrap();
    while let Some(Ok(msg)) = tokio::time::timeout(Duration::from_secs(15), ws.next()).await.ok().flatten() {
        if let Message::Close(frame) = msg {
            return frame.map(|f| u16::from(f.code));
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_over_its_buffer_while_away_ends_and_the_browser_starts_anew() {
    let valve = Valve::start(&["-f", &app(), "--no-access-log", "--shiny-session-buffer", "1MiB"]);
    let proxy = Cuttable::start(&valve.url).await;
    let mut page = Page::open(&proxy.url).await;
    page.ask(json!({"op": "type", "text": "after the flood"})).await;
    // R sends 8 MiB 1.5 s after it is asked; the network is down by then.
    page.ask(json!({"op": "flood", "kib": 8192})).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.set_down(true);
    valve.wait_for_log("buffer passed its bound while its browser was away", Duration::from_secs(30));
    proxy.set_down(false);
    let after = page.ask(json!({"op": "wait", "for": "fresh", "timeout": 60})).await;
    assert_eq!(after["name"], "after the flood", "inputs restored: {after}");
    assert!(metric(&valve, "valve_shiny_buffer_overflows_total{app=\"shiny_reconnect\"}") >= 1.0);
    assert!(metric(&valve, "valve_shiny_buffered_bytes{app=\"shiny_reconnect\"}") < 1048576.0 * 2.0);
    page.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn under_a_prefix_beside_another_app_a_blip_resumes_shinys_own_example() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("valve.toml");
    std::fs::write(
        &config,
        format!(
            "[[app]]\nname = \"hello\"\npath = \"/apps/hello\"\nfile = \"{}\"\n\n[[app]]\nname = \"mine\"\npath = \"/apps/mine\"\nfile = \"{}\"\n",
            shiny_example("01_hello"),
            app()
        ),
    )
    .unwrap();
    let valve = Valve::start(&["--config", config.to_str().unwrap(), "--no-access-log"]);
    let proxy = Cuttable::start(&valve.url).await;
    let mut hello = Page::open(&format!("{}/apps/hello/", proxy.url)).await;
    let mut mine = Page::open(&format!("{}/apps/mine/", proxy.url)).await;
    let h0 = hello.state().await;
    let m0 = mine.state().await;
    proxy.cut();
    let h1 = hello.wait_resumed(&h0).await;
    let m1 = mine.wait_resumed(&m0).await;
    assert_eq!(h1["token"], h0["token"], "{h1}");
    assert_eq!(h1["marker_ok"], true);
    same_session(&m0, &m1);
    // The example still answers its input in the resumed session.
    let plot = hello
        .ask(json!({"op": "eval", "js": "new Promise(r => { const old = document.querySelector('#distPlot img').src; Shiny.setInputValue('bins', 7); const t = setInterval(() => { const now = document.querySelector('#distPlot img').src; if (now !== old) { clearInterval(t); r(true); } }, 100); })"}))
        .await;
    assert_eq!(plot["value"], true);
    hello.close().await;
    mine.close().await;
}

#[test]
fn the_client_scripts_framing_reads_and_writes_what_valve_does() {
    crate::harness::need_program("node", "nodejs");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    let out = std::process::Command::new("node").arg("reconnect_framing.mjs").current_dir(dir).output().unwrap();
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_the_window_at_zero_pages_get_no_script_and_sockets_are_spliced_as_before() {
    let valve = Valve::start(&["-f", &app(), "--no-access-log", "--shiny-reconnect-window", "0"]);
    let page = crate::harness::client()
        .get(format!("{}/", valve.url))
        .header("Accept", "text/html")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("shiny.min.js") && !page.contains("shiny-reconnect.js"), "{page}");
    // A socket offering valve's protocol is a plain Shiny socket: no protocol in the 101.
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let addr = valve.url.trim_start_matches("http://").to_string();
    let mut req = format!("ws://{addr}/websocket/").into_client_request().unwrap();
    req.headers_mut().insert("Sec-WebSocket-Protocol", "valve-shiny.1".parse().unwrap());
    let stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let answer = tokio_tungstenite::client_async(req, stream).await;
    // tungstenite refuses a 101 without the offered protocol, as browsers do: the
    // script then opens a plain socket.
    assert!(answer.is_err(), "no valve protocol is spoken with reconnect off");
    let mut page = Page::open(&valve.url).await;
    let state = page.ask(json!({"op": "type", "text": "plain"})).await;
    assert_eq!(state["state"], Value::Null, "the script is absent: {state}");
    assert_eq!(state["name"], "plain", "Shiny's own socket works: {state}");
    page.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn past_the_window_with_valve_out_of_reach_shinys_own_overlay_shows_until_a_new_session_starts() {
    let valve = Valve::start(&["-f", &app(), "--no-access-log", "--shiny-reconnect-window", "2"]);
    let proxy = Cuttable::start(&valve.url).await;
    let mut page = Page::open(&proxy.url).await;
    page.ask(json!({"op": "type", "text": "still here"})).await;
    proxy.set_down(true);
    // 2 s of window, then 10 s of trying quietly, then Shiny's own overlay.
    tokio::time::sleep(Duration::from_secs(16)).await;
    let away = page.state().await;
    assert_eq!(away["overlay_seen"], true, "Shiny's overlay shows once a new session cannot start: {away}");
    proxy.set_down(false);
    let after = page.ask(json!({"op": "wait", "for": "fresh", "timeout": 60})).await;
    assert_eq!(after["name"], "still here", "inputs restored: {after}");
    assert_eq!(after["marker_ok"], true, "no page reload: {after}");
    let overlay = page
        .ask(json!({"op": "eval", "js": "(() => { const o = document.getElementById('shiny-disconnected-overlay'); return !!o && getComputedStyle(o).display !== 'none'; })()"}))
        .await;
    assert_eq!(overlay["value"], false, "the overlay is gone once the new session runs");
    page.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shinys_own_examples_come_back_to_the_same_session_after_a_blip() {
    // 03_reactivity (inputs and outputs), 08_html (its own www/index.html), 11_timer (R pushes every second).
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("valve.toml");
    let examples = ["03_reactivity", "08_html", "11_timer"];
    let apps: String = examples
        .iter()
        .map(|e| format!("[[app]]\nname = \"{e}\"\npath = \"/{e}\"\nfile = \"{}\"\n\n", shiny_example(e)))
        .collect();
    std::fs::write(&config, apps).unwrap();
    let valve = Valve::start(&["--config", config.to_str().unwrap(), "--no-access-log"]);
    let proxy = Cuttable::start(&valve.url).await;
    let mut pages = Vec::new();
    for e in examples {
        let mut page = Page::open(&format!("{}/{e}/", proxy.url)).await;
        let before = page.state().await;
        assert!(before["sid"].is_string(), "{e}: the script runs in the example's page: {before}");
        pages.push((e, page, before));
    }
    proxy.cut();
    for (e, page, before) in &mut pages {
        let after = page.wait_resumed(before).await;
        assert_eq!(after["token"], before["token"], "{e}: the same session: {after}");
        assert_eq!((&after["marker_ok"], &after["overlay_seen"]), (&json!(true), &json!(false)), "{e}: {after}");
        assert!(after["resumes"].as_u64().unwrap() >= 1, "{e}: {after}");
    }
    // The timer's output still moves in its resumed session.
    let timer = &mut pages[2].1;
    let moved = timer
        .ask(json!({"op": "eval", "js": "new Promise(r => { const el = document.getElementById('currentTime'); const old = el.textContent; const t = setInterval(() => { if (el.textContent !== old) { clearInterval(t); r(true); } }, 100); })"}))
        .await;
    assert_eq!(moved["value"], true);
    for (_, page, _) in pages {
        page.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_draining_valve_ends_the_sessions_whose_browsers_are_away_at_once() {
    // Its listener is closed: a browser away cannot come back to this valve,
    // so its session does not hold the drain for the grace period.
    let mut valve = Valve::start(&["-f", &app(), "--no-access-log", "--drain-delay", "0", "--graceful-timeout", "120"]);
    let proxy = Cuttable::start(&valve.url).await;
    let page = Page::open(&proxy.url).await;
    proxy.set_down(true);
    wait_until("the browser counted away", Duration::from_secs(30), || {
        metric(&valve, "valve_shiny_connections_dropped_total{app=\"shiny_reconnect\"}") >= 1.0
    });
    valve.signal(libc::SIGTERM);
    let status = valve.wait_exit(Duration::from_secs(60));
    assert!(status.success(), "valve drained cleanly: {status:?}\n{}", valve.log());
    assert!(!valve.log().contains("closing the Shiny sessions still open"), "nothing was left for the grace's end");
    page.close().await;
}
