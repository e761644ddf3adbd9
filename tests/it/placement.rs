//! Where new Shiny sessions go: to a worker whose R is not busy (busy-aware placement).
//! Sessions are played over a WebSocket the way shiny.js does (page, cookie,
//! `/websocket/`, `init`), by a minimal client below, so that seven sessions
//! can arrive at once without seven browsers.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::harness::{fixture, need_r_packages, wait_until, Valve};

const DEADLINE: Duration = Duration::from_secs(90);

/// One Shiny session against valve at `addr` (host:port): loads the page,
/// opens the WebSocket with the sticky cookie, sends `init`, says so on
/// `opened`, and returns the first output's text and how long it took from
/// the page request on.
fn session(addr: &str, opened: Option<mpsc::Sender<()>>) -> (String, Duration) {
    let start = Instant::now();
    let (status, head, _) = http_get(addr, "/", None);
    assert_eq!(status, 200, "the page: {head}");
    let cookie = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase().starts_with("set-cookie: valve_worker=").then(|| l[12..].trim().to_string())
        })
        .map(|c| c.split(';').next().unwrap().to_string());
    let mut ws = ws_connect(addr, "/websocket/", cookie.as_deref());
    ws_send(
        &mut ws,
        r#"{"method":"init","data":{".clientdata_output_burnt_hidden":false,".clientdata_url_pathname":"/"}}"#,
    );
    if let Some(tx) = opened {
        let _ = tx.send(());
    }
    loop {
        let msg = ws_read(&mut ws);
        if msg.contains("\"values\"") && msg.contains("\"burnt\"") {
            let text = msg.split("\"burnt\":\"").nth(1).and_then(|r| r.split('"').next()).unwrap_or("").to_string();
            return (text, start.elapsed());
        }
        assert!(!msg.contains("\"burnt\":{\"message\""), "the output failed in R: {msg}");
    }
}

fn http_get(addr: &str, path: &str, cookie: Option<&str>) -> (u16, String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).expect("connect to valve");
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    let cookie = cookie.map(|c| format!("Cookie: {c}\r\n")).unwrap_or_default();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{cookie}Connection: close\r\n\r\n").unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).expect("the page arrives");
    let split = all.windows(4).position(|w| w == b"\r\n\r\n").expect("a response head") + 4;
    let head = String::from_utf8_lossy(&all[..split]).to_string();
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, head, all[split..].to_vec())
}

fn ws_connect(addr: &str, path: &str, cookie: Option<&str>) -> BufReader<TcpStream> {
    let mut s = TcpStream::connect(addr).expect("connect to valve");
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    let cookie = cookie.map(|c| format!("Cookie: {c}\r\n")).unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{cookie}Connection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let mut status = String::new();
    r.read_line(&mut status).unwrap();
    assert!(status.contains(" 101 "), "WebSocket upgrade refused: {status}");
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        if line == "\r\n" || line.is_empty() {
            return r;
        }
    }
}

/// One masked text frame (RFC 6455: every client frame is masked).
fn ws_send(ws: &mut BufReader<TcpStream>, text: &str) {
    let mask = [0x12u8, 0x34, 0x56, 0x78];
    let mut frame = vec![0x81u8];
    match text.len() {
        n if n < 126 => frame.push(0x80 | n as u8),
        n if n < 65536 => {
            frame.push(0x80 | 126);
            frame.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            frame.push(0x80 | 127);
            frame.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    frame.extend_from_slice(&mask);
    frame.extend(text.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    ws.get_mut().write_all(&frame).unwrap();
}

/// The next text message from the server (continuation frames joined; pings skipped).
fn ws_read(ws: &mut BufReader<TcpStream>) -> String {
    let mut message = Vec::new();
    loop {
        let mut h = [0u8; 2];
        ws.read_exact(&mut h).expect("a frame from the worker");
        let mut len = u64::from(h[1] & 0x7f);
        if len == 126 {
            let mut b = [0u8; 2];
            ws.read_exact(&mut b).unwrap();
            len = u64::from(u16::from_be_bytes(b));
        } else if len == 127 {
            let mut b = [0u8; 8];
            ws.read_exact(&mut b).unwrap();
            len = u64::from_be_bytes(b);
        }
        let mut payload = vec![0u8; len as usize];
        ws.read_exact(&mut payload).unwrap();
        let opcode = h[0] & 0x0f;
        assert_ne!(opcode, 0x8, "the worker closed the session");
        if matches!(opcode, 0x0..=0x2) {
            message.extend(payload);
            if h[0] & 0x80 != 0 {
                return String::from_utf8_lossy(&message).to_string();
            }
        }
    }
}

/// Six sessions that each burn 2 s of CPU arrive at once; once all six have
/// sent `init`, a seventh arrives. How long it waits for its first output,
/// and how many workers the pool had then.
fn seventh_session_wait(extra: &[&str]) -> (Duration, usize) {
    need_r_packages(&["shiny"]);
    let app = fixture("shiny_burn");
    let mut args = vec!["-f", app.to_str().unwrap(), "--no-access-log", "-n", "4"];
    args.extend_from_slice(extra);
    let valve = Valve::start(&args);
    let addr = valve.url.trim_start_matches("http://").trim_end_matches('/').to_string();
    let (tx, rx) = mpsc::channel();
    let six: Vec<_> = (0..6)
        .map(|_| {
            let (addr, tx) = (addr.clone(), tx.clone());
            std::thread::spawn(move || session(&addr, Some(tx)))
        })
        .collect();
    for _ in 0..6 {
        rx.recv_timeout(DEADLINE).expect("six sessions open");
    }
    // Placement by load sees R busy only once a CPU sample says so (with
    // --busy-threshold 0 it never looks).
    let threshold = valve.status()["config"]["busy_threshold"].as_f64().unwrap_or(0.0);
    if threshold > 0.0 {
        wait_until("a CPU sample to find the sessions' R busy", DEADLINE, || {
            let status = valve.status();
            status["workers"].as_array().is_some_and(|w| w.iter().any(|w| w["cpu"].as_f64() >= Some(threshold)))
        });
    }
    let (_, seventh) = session(&addr, None);
    let workers = valve.workers().len();
    for s in six {
        s.join().expect("a session failed");
    }
    (seventh, workers)
}

#[test]
fn a_seventh_session_behind_six_busy_ones_gets_its_output_far_sooner_than_by_session_count() {
    // Today's rule (--busy-threshold 0): all seven on the one running worker,
    // below --max-sessions 20. Busy-aware: new browsers go to a worker whose R
    // is not busy, and the pool grows to 4 while they wait.
    // The rule is checked by what it does (the pool grows instead of piling
    // sessions on one busy R); how much sooner the 7th gets its output depends
    // on free CPUs, which bench/shiny-load measures.
    let (by_count, count_workers) = seventh_session_wait(&["--busy-threshold", "0"]);
    let (busy_aware, aware_workers) = seventh_session_wait(&[]);
    eprintln!(
        "placement: the 7th session's first output after {by_count:?} on {count_workers} worker(s) by session count, \
         {busy_aware:?} on {aware_workers} busy-aware"
    );
    assert_eq!(count_workers, 1, "by session count, all seven sessions fit on the one worker");
    assert!(
        aware_workers >= 3,
        "busy-aware placement grew the pool for sessions behind busy R: {aware_workers} workers"
    );
}

#[test]
fn shiny_forks_share_what_the_preload_parent_loaded() {
    need_r_packages(&["shiny"]);
    let app = fixture("shiny_burn");
    let mut args = vec!["-f", app.to_str().unwrap(), "-n", "2", "--n-min", "2", "--no-access-log"];
    if !crate::harness::preloading() {
        args.push("--preload");
    }
    let valve = Valve::start_with_env(&args, &[("BURN_SECONDS", "1")]);
    let addr = valve.url.trim_start_matches("http://").trim_end_matches('/').to_string();
    let two: Vec<_> = (0..2)
        .map(|_| {
            let addr = addr.clone();
            std::thread::spawn(move || session(&addr, None).0)
        })
        .collect();
    let texts: Vec<String> = two.into_iter().map(|t| t.join().unwrap()).collect();
    let parent = valve.preload_parent().expect("a preload parent runs");
    let pids: std::collections::BTreeSet<&str> = texts.iter().filter_map(|t| t.split_whitespace().nth(2)).collect();
    assert_eq!(pids.len(), 2, "two busy sessions went to two forks: {texts:?}");
    for t in &texts {
        assert!(t.ends_with(&format!("loaded by {parent}")), "the app was loaded once, in the parent {parent}: {t}");
    }
}
