//! No client, however slow, malformed or noisy, takes an R worker out of
//! service: each test reproduces an attack with real R.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::harness::{accept_backlog, client, fixture, pid_alive, unread_by_server, wait_until, Valve};

fn api() -> String {
    fixture("api.R").to_str().unwrap().to_string()
}

/// Sends raw bytes and returns what came back (until close or `wait`).
fn raw(url: &str, payload: &[u8], wait: Duration) -> String {
    let mut s = TcpStream::connect(url.trim_start_matches("http://")).unwrap();
    s.set_read_timeout(Some(wait)).unwrap();
    s.write_all(payload).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).to_string()
}

fn status_line(answer: &str) -> &str {
    answer.lines().next().unwrap_or("")
}

/// valve's peak resident memory so far (VmHWM), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_r_cannot_parse_are_answered_by_valve_and_kill_no_worker() {
    let valve = Valve::start(&["-f", &api(), "-n", "2", "--n-min", "2"]);
    let workers = valve.workers();
    let huge = format!("GET /pid HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "a".repeat(80 * 1024));
    let cases: [(&[u8], &str); 5] = [
        (b"FOO /pid HTTP/1.1\r\nHost: x\r\n\r\n", "405"),
        (b"get /pid HTTP/1.1\r\nHost: x\r\n\r\n", "405"),
        (b"CONNECT example.org:443 HTTP/1.1\r\nHost: example.org:443\r\n\r\n", "405"),
        (b"PROPFIND /pid HTTP/1.1\r\nHost: x\r\n\r\n", "405"),
        (huge.as_bytes(), "431"),
    ];
    for _ in 0..3 {
        for (payload, want) in &cases {
            let answer = raw(&valve.url, payload, Duration::from_secs(10));
            assert!(
                status_line(&answer).contains(want),
                "{want} for {:?}: {}",
                String::from_utf8_lossy(&payload[..20]),
                status_line(&answer)
            );
        }
    }
    assert!(workers.iter().all(|p| pid_alive(*p)), "no worker was killed");
    assert!(!valve.log().contains("worker exited"), "{}", valve.log());
    assert_eq!(client().get(valve.get("/__valve__/readyz")).send().await.unwrap().status(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn clients_that_never_read_their_answers_hold_no_worker() {
    let valve = Valve::start(&["-f", &api(), "-n", "2", "--n-min", "2", "--request-timeout", "30"]);
    // Three clients ask for 20 MB each and never read a byte of it.
    let stalled: Vec<TcpStream> = (0..3)
        .map(|_| {
            let mut s = TcpStream::connect(valve.url.trim_start_matches("http://")).unwrap();
            s.write_all(b"GET /big?mb=20 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            s
        })
        .collect();
    // R builds the three answers; valve reads them whole and frees the workers,
    // while the clients still have read nothing.
    let busy = || {
        let out = std::process::Command::new("curl")
            .args(["-s", "-H", &valve.bearer(), &valve.admin("/__valve__/status")])
            .output()
            .unwrap();
        serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .map(|s| s["pool"]["busy"].as_u64().unwrap_or(9))
            .unwrap_or(9)
    };
    wait_until("the workers free again", Duration::from_secs(60), || busy() == 0);
    let start = Instant::now();
    for _ in 0..5 {
        assert_eq!(client().get(valve.get("/pid")).send().await.unwrap().status(), 200);
    }
    assert!(start.elapsed() < Duration::from_secs(2), "workers were free for others: {:?}", start.elapsed());
    drop(stalled);
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_uploads_hold_no_worker_and_a_timeout_kills_no_healthy_one() {
    let valve = Valve::start(&["-f", &api(), "-n", "2", "--n-min", "2", "--request-timeout", "2"]);
    let workers = valve.workers();
    // Three clients send a body one byte a second (the pause is the attack, not a wait).
    let (tx, rx) = std::sync::mpsc::channel();
    let slow: Vec<_> = (0..3)
        .map(|_| {
            let addr = valve.url.trim_start_matches("http://").to_string();
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                s.write_all(b"POST /size HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\n").unwrap();
                let _ = tx.send(s.local_addr().unwrap().port());
                for _ in 0..5 {
                    std::thread::sleep(Duration::from_secs(1));
                    if s.write_all(b"x").is_err() {
                        break;
                    }
                }
            })
        })
        .collect();
    // valve has read every slow client's head: a valve that gave them workers would have by now.
    let port = valve.ready["port"].as_u64().unwrap() as u16;
    let clients: Vec<u16> =
        (0..3).map(|_| rx.recv_timeout(Duration::from_secs(10)).expect("a slow client connects")).collect();
    wait_until("valve to read the slow uploads' heads", Duration::from_secs(10), || {
        clients.iter().all(|c| unread_by_server(port, *c) == Some(0))
    });
    let start = Instant::now();
    for _ in 0..5 {
        assert_eq!(client().get(valve.get("/pid")).send().await.unwrap().status(), 200);
    }
    assert!(start.elapsed() < Duration::from_secs(2), "workers were free for others: {:?}", start.elapsed());
    for t in slow {
        t.join().unwrap();
    }
    // Past --request-timeout: still no worker was blamed for a slow client.
    assert!(workers.iter().all(|p| pid_alive(*p)), "healthy workers were killed");
    assert!(!valve.log().contains("timed out"), "{}", valve.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_printing_huge_lines_cannot_grow_valves_memory() {
    let valve = Valve::start(&["-f", &api(), "-n", "1", "--request-timeout", "120"]);
    for _ in 0..3 {
        assert_eq!(client().get(valve.get("/spew?mb=50&times=4")).send().await.unwrap().status(), 200);
    }
    valve.wait_for_log("[line cut:", Duration::from_secs(20));
    let peak = peak_rss(valve.pid());
    assert!(peak < 100 << 20, "valve's memory peaked at {} MB", peak >> 20);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_log_reader_that_stalls_never_freezes_valve() {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    // valve's stderr goes to a pipe nobody reads: it fills after a few hundred lines.
    let mut child = Command::new(crate::harness::valve_bin())
        .args(["-f", &api(), "--port", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let ready: serde_json::Value = serde_json::from_str(&line).unwrap();
    let url = ready["url"].as_str().unwrap().to_string();
    let admin = ready["admin_url"].as_str().unwrap().to_string();
    let _stderr = child.stderr.take(); // held open, never read
    let c = client();
    // A worker printing thousands of lines fills the pipe and valve's queue of log lines.
    for i in 0..6 {
        let resp =
            tokio::time::timeout(Duration::from_secs(20), c.get(format!("{url}/spew?mb=0.0001&times=3000")).send())
                .await;
        assert!(matches!(resp, Ok(Ok(ref r)) if r.status() == 200), "request {i} stalled behind the log");
    }
    for i in 0..200 {
        let resp = tokio::time::timeout(Duration::from_secs(5), c.get(format!("{url}/pid")).send()).await;
        assert!(matches!(resp, Ok(Ok(ref r)) if r.status() == 200), "request {i} stalled behind the log");
    }
    assert_eq!(c.get(format!("{url}/__valve__/healthz")).send().await.unwrap().status(), 200);
    let token = std::fs::read_to_string(ready["admin_token_file"].as_str().unwrap()).unwrap();
    let metrics = c
        .get(format!("{admin}/__valve__/metrics"))
        .bearer_auth(token.trim())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let dropped: f64 =
        metrics.lines().find_map(|l| l.strip_prefix("valve_log_dropped_total ")).unwrap().parse().unwrap();
    assert!(dropped > 0.0, "the lines that could not be written were dropped and counted");
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_connections_to_the_admin_listener_cannot_starve_the_main_port() {
    let valve = Valve::start(&["-f", &api()]);
    let admin = valve.admin_url().trim_start_matches("http://").to_string();
    let held: Vec<TcpStream> = (0..1100).filter_map(|_| TcpStream::connect(&admin).ok()).collect();
    assert!(held.len() > 1000, "the admin port accepted (and closed) them");
    // valve took every one of them off the listener (keeping or closing it).
    let admin_port: u16 = admin.rsplit(':').next().unwrap().parse().unwrap();
    wait_until("valve to accept every admin connection", Duration::from_secs(10), || {
        accept_backlog(admin_port) == Some(0)
    });
    assert!(open_fds(valve.pid()) < 300, "valve holds {} descriptors", open_fds(valve.pid()));
    for _ in 0..5 {
        assert_eq!(client().get(valve.get("/pid")).send().await.unwrap().status(), 200, "the main port serves");
    }
    drop(held);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connection_header_cannot_strip_host() {
    let valve = Valve::start(&["-f", &api()]);
    let answer = raw(
        &valve.url,
        b"GET /headers HTTP/1.1\r\nHost: example.org\r\nConnection: Host, close\r\n\r\n",
        Duration::from_secs(10),
    );
    assert!(status_line(&answer).contains("200"), "{answer}");
    assert!(answer.contains("\"HTTP_HOST\":[\"example.org\"]"), "R saw the Host header: {answer}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_worker_that_stops_answering_is_replaced_before_it_costs_a_request() {
    let valve = Valve::start(&["-f", &api(), "-n", "2", "--n-min", "2"]);
    let workers = valve.workers();
    let victim = workers[0];
    unsafe { libc::kill(victim as i32, libc::SIGSTOP) };
    wait_until("the stopped worker replaced", Duration::from_secs(15), || !pid_alive(victim));
    valve.wait_for_log("did not answer a liveness probe", Duration::from_secs(5));
    let start = Instant::now();
    for _ in 0..4 {
        assert_eq!(client().get(valve.get("/pid")).send().await.unwrap().status(), 200);
    }
    assert!(start.elapsed() < Duration::from_secs(5), "no request waited on the stopped worker");
}
