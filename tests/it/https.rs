//! HTTPS on its own: a certificate from files (a Pebble-issued one is in
//! `acme`), HTTP/2 beside HTTP/1.1, the redirecting plain port, secure
//! defaults, and the bounds on bad TLS clients. Real valve, real R, real
//! curl, openssl and Chromium.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::{fixture, free_port, need_browser, plumber_example, shiny_example, wait_until, Valve};

/// A self-signed certificate for localhost and 127.0.0.1, as cert.pem and key.pem in `dir`.
pub fn write_cert(dir: &Path, cn: &str, days: i64) -> (PathBuf, PathBuf) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    params.distinguished_name.push(rcgen::DnType::CommonName, cn);
    let now = std::time::SystemTime::now();
    params.not_before = (now - Duration::from_secs(3600)).into();
    params.not_after = if days >= 0 {
        (now + Duration::from_secs(days as u64 * 86400)).into()
    } else {
        (now - Duration::from_secs((-days) as u64 * 86400)).into()
    };
    let cert = params.self_signed(&key).unwrap();
    let (c, k) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (c, k)
}

/// valve serving `app` over HTTPS with `cert` and `key`, with `extra` flags.
fn start_tls(app: &Path, cert: &Path, key: &Path, extra: &[&str]) -> Valve {
    let mut args =
        vec!["-f", app.to_str().unwrap(), "--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap()];
    args.extend_from_slice(extra);
    Valve::start(&args)
}

/// curl with `args`: (HTTP status or 0, body, headers and stderr).
pub fn curl(args: &[&str]) -> (u16, String, String) {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "30", "-D", "/dev/stderr", "-w", "\n%{http_code} %{http_version}"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("curl runs");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, tail) = stdout.rsplit_once('\n').unwrap_or(("", &stdout));
    let code = tail.split_whitespace().next().and_then(|c| c.parse().ok()).unwrap_or(0);
    let version = tail.split_whitespace().nth(1).unwrap_or("").to_string();
    (code, body.to_string(), format!("http_version={version}\n{}", String::from_utf8_lossy(&out.stderr)))
}

/// What `openssl x509 -noout FIELD` (`-subject`, `-serial`) says of the
/// certificate served on `port` to a new connection.
pub fn served(port: u16, field: &str) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo | openssl s_client -connect 127.0.0.1:{port} -servername localhost 2>/dev/null | openssl x509 -noout {field}"
        ))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

pub fn three_apps_with(dir: &Path, extra: &str) -> PathBuf {
    let www = dir.join("www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::write(www.join("index.html"), "<p>static over HTTPS</p>\n").unwrap();
    std::fs::copy(fixture("static/hello.txt"), www.join("hello.txt")).unwrap();
    let text = format!(
        "{extra}\n[[app]]\nname = \"api\"\npath = \"/api\"\nfile = {:?}\n\n[[app]]\nname = \"hello\"\npath = \"/hello\"\nfile = {:?}\n\n[[app]]\nname = \"files\"\npath = \"/files\"\nstatic = {:?}\n\n[[app]]\nname = \"sessions\"\npath = \"/sessions\"\nfile = {:?}\n",
        fixture("api.R"),
        shiny_example("01_hello"),
        www,
        plumber_example("06-sessions"),
    );
    let path = dir.join("valve.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Shiny's 01_hello over valve's HTTPS in Chromium: (its JSON line, the whole output).
pub fn shiny_in_chromium(url: &str, http1: bool) -> (serde_json::Value, String) {
    let mut cmd = Command::new("node");
    cmd.args(["https.mjs", "hello", url]).current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser"));
    if http1 {
        cmd.env("VALVE_BROWSER_HTTP1", "1");
    }
    let out = cmd.output().expect("node runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "Shiny over HTTPS in Chromium: {text}");
    let line = text.lines().find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).expect("a JSON line");
    (line, text)
}

/// The checks every HTTPS valve passes, whatever its certificate: plumber
/// over HTTP/1.1 and HTTP/2 with the same answers, R told the scheme, static
/// files, the sticky cookie `Secure`, HSTS, Shiny in Chromium on HTTP/2
/// (its WebSocket by extended CONNECT) and on HTTP/1.1.
pub fn serves_every_kind_over_https(valve: &Valve, base: &str, ca: &Path) {
    let ca = ca.to_str().unwrap();
    let at = |path: &str| format!("{base}{path}");
    let echo = at("/api/headers");
    let (c1, b1, h1) = curl(&["--http1.1", "--cacert", ca, &echo]);
    let (c2, b2, h2) = curl(&["--http2", "--cacert", ca, &echo]);
    assert_eq!((c1, c2), (200, 200), "{h1}\n{h2}");
    assert!(h1.contains("http_version=1.1") && h2.contains("http_version=2"), "{h1}\n{h2}");
    let strip = |b: &str| {
        let mut v: serde_json::Value = serde_json::from_str(b).unwrap();
        v.as_object_mut().unwrap().retain(|k, _| k != "HTTP_X_VALVE_REMOTE_PORT");
        v
    };
    assert_eq!(strip(&b1)["HTTP_X_FORWARDED_PROTO"], serde_json::json!(["https"]), "{b1}");
    assert_eq!(strip(&b2)["HTTP_X_FORWARDED_PROTO"], serde_json::json!(["https"]), "{b2}");
    assert!(h1.to_lowercase().contains("strict-transport-security: max-age=31536000"), "{h1}");
    // A client's claim of the scheme does not stand over valve's TLS.
    let (_, scheme, _) = curl(&["--http2", "--cacert", ca, "-H", "X-Forwarded-Proto: http", &at("/api/scheme")]);
    let scheme: serde_json::Value = serde_json::from_str(&scheme).unwrap();
    assert_eq!(scheme, serde_json::json!({"url_scheme": ["https"], "forwarded_proto": ["https"]}));
    let (c, body, _) = curl(&["--http2", "--cacert", ca, &at("/files/hello.txt")]);
    assert_eq!(c, 200);
    assert_eq!(body, std::fs::read_to_string(fixture("static/hello.txt")).unwrap());
    // plumber's own sessions example: its cookie round-trips over HTTP/2.
    let jar = tempfile::NamedTempFile::new().unwrap();
    let jar = jar.path().to_str().unwrap();
    for _ in 0..2 {
        let (c, _, h) = curl(&["--http2", "--cacert", ca, "-c", jar, "-b", jar, &at("/sessions/sessionCounter")]);
        assert_eq!(c, 200, "{h}");
    }
    let (_, body, _) = curl(&["--http2", "--cacert", ca, "-c", jar, "-b", jar, &at("/sessions/sessionCounter")]);
    assert!(body.contains("visit #2"), "plumber's session counter counts over HTTP/2: {body}");
    // valve's sticky cookie for the Shiny app, only over TLS.
    let (_, _, head) = curl(&["--http2", "--cacert", ca, &at("/hello/")]);
    let sticky = head.lines().find(|l| l.to_lowercase().starts_with("set-cookie: valve_worker=")).unwrap_or("");
    assert!(sticky.ends_with("; Secure") || sticky.contains("; Secure"), "the sticky cookie is Secure: {head}");
    let (seen, text) = shiny_in_chromium(&at("/hello/"), false);
    assert_eq!(seen["url_protocol"], "https:", "{text}");
    assert_eq!(seen["http"], "h2", "{text}");
    valve.wait_for_log("path=/hello/websocket/ http=2 status=101", Duration::from_secs(5));
    let (seen, text) = shiny_in_chromium(&at("/hello/"), true);
    assert_eq!(seen["http"], "http/1.1", "{text}");
    valve.wait_for_log("path=/hello/websocket/ http=1.1 status=101", Duration::from_secs(5));
}

#[test]
fn https_from_files_serves_plumber_shiny_and_static_over_http1_and_http2() {
    need_browser();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = write_cert(dir.path(), "files-one", 30);
    let http_port = free_port();
    let config = three_apps_with(
        dir.path(),
        &format!("tls_cert = {cert:?}\ntls_key = {key:?}\nhttp_port = {http_port}\nadmin_tls = true\n"),
    );
    let valve = Valve::start(&["--config", config.to_str().unwrap()]);
    assert!(valve.url.starts_with("https://"), "{}", valve.url);
    serves_every_kind_over_https(&valve, &valve.url, &cert);
    // The plain port redirects, keeping the path and query; ACME's path is its own.
    let port = valve.url.rsplit(':').next().unwrap().to_string();
    let (c, _, head) = curl(&[&format!("http://localhost:{http_port}/api/headers?x=1")]);
    assert_eq!(c, 308, "{head}");
    assert!(head.contains(&format!("location: https://localhost:{port}/api/headers?x=1")), "{head}");
    let (c, body, _) = curl(&[&format!("http://127.0.0.1:{http_port}/.well-known/acme-challenge/nothing")]);
    assert_eq!(c, 404, "no check under way: {body}");
    // Plain HTTP to the TLS port: a plain answer that says what to do.
    let (c, body, _) = curl(&[&format!("http://127.0.0.1:{port}/api/headers")]);
    assert_eq!(c, 400);
    assert!(body.contains("this port speaks HTTPS"), "{body}");
    // The admin listener speaks HTTPS too; the status page names the certificate.
    assert!(valve.admin_url().starts_with("https://"), "{}", valve.admin_url());
    let (c, status, _) =
        curl(&["--cacert", cert.to_str().unwrap(), "-H", &valve.bearer(), &valve.admin("/__valve__/status")]);
    assert_eq!(c, 200);
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["tls"]["main"]["source"], "files");
    assert_eq!(status["tls"]["main"]["names"], serde_json::json!(["localhost", "127.0.0.1"]));
    let days = status["tls"]["main"]["days_left"].as_f64().unwrap();
    assert!((29.0..30.1).contains(&days), "{days}");
    let (_, metrics, _) =
        curl(&["--cacert", cert.to_str().unwrap(), "-H", &valve.bearer(), &valve.admin("/__valve__/metrics")]);
    assert!(metrics.contains("valve_tls_certificate_renewal_failing{listener=\"main\"} 0"), "{metrics}");
}

#[test]
fn a_certificate_replaced_on_disk_is_served_to_the_next_connection_and_none_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = write_cert(dir.path(), "before", 30);
    let valve = start_tls(&fixture("api.R"), &cert, &key, &[]);
    let port: u16 = valve.url.rsplit(':').next().unwrap().parse().unwrap();
    assert!(served(port, "-subject").contains("before"));
    // A container's HEALTHCHECK (`valve --healthcheck`, plain by default) finds the TLS port answering.
    let health = Command::new(env!("CARGO_BIN_EXE_valve")).args(["--healthcheck", "-p", &port.to_string()]).output();
    assert!(health.unwrap().status.success());
    // One keep-alive connection asking all along, across the replacement.
    let urls: Vec<String> = (0..300).map(|_| valve.get("/pid")).collect();
    let mut args = vec!["-s", "-k", "--http1.1", "--rate", "30/s", "-w", "%{http_code} %{num_connects}\n"];
    args.extend(urls.iter().flat_map(|u| ["-o", "/dev/null", u.as_str()]));
    let busy = Command::new("curl").args(&args).stdout(Stdio::piped()).spawn().unwrap();
    std::thread::sleep(Duration::from_secs(2));
    // The new pair lands as tools write it: the certificate first, the key a moment later.
    let new = tempfile::tempdir().unwrap();
    let (c2, k2) = write_cert(new.path(), "after", 60);
    std::fs::copy(&c2, &cert).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    std::fs::copy(&k2, &key).unwrap();
    wait_until("the new certificate served", Duration::from_secs(10), || served(port, "-subject").contains("after"));
    // A bad one (a key that is not the certificate's) keeps "after" serving, said in the log.
    let other = tempfile::tempdir().unwrap();
    let (_, k3) = write_cert(other.path(), "stray", 60);
    std::fs::copy(&k3, &key).unwrap();
    valve.wait_for_log("TLS certificate not replaced", Duration::from_secs(10));
    assert!(valve.log().contains("is not the key of the certificate in"), "{}", valve.log());
    assert!(served(port, "-subject").contains("after"));
    // SIGHUP reads the files again: the right key back, at once.
    std::fs::copy(&k2, &key).unwrap();
    valve.signal(libc::SIGHUP);
    let out = busy.wait_with_output().unwrap();
    let lines = String::from_utf8_lossy(&out.stdout).to_string();
    let codes: Vec<&str> = lines.lines().map(|l| l.split(' ').next().unwrap_or("")).collect();
    assert_eq!(codes.len(), 300, "{lines}");
    assert!(codes.iter().all(|c| *c == "200"), "every request answered across the replacement: {lines}");
    let connects: u32 = lines.lines().filter_map(|l| l.split(' ').nth(1)?.parse::<u32>().ok()).sum();
    assert_eq!(connects, 1, "one connection, never dropped: {lines}");
}

#[test]
fn a_bad_certificate_at_start_is_named_and_valve_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, _) = write_cert(dir.path(), "old", -3);
    let key = dir.path().join("key.pem");
    let api = fixture("api.R");
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_valve")).args(args).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).to_string())
    };
    let (c, k) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let (code, err) = run(&["-f", api.to_str().unwrap(), "--check", "--tls-cert", c, "--tls-key", k]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains(&format!("the certificate in {c} expired 3 days ago")), "{err}");
    let other = tempfile::tempdir().unwrap();
    let (fresh, _) = write_cert(other.path(), "fresh", 30);
    let (code, err) = run(&["-f", api.to_str().unwrap(), "--tls-cert", fresh.to_str().unwrap(), "--tls-key", k]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("is not the key of the certificate in"), "{err}");
    let (code, err) = run(&["-f", api.to_str().unwrap(), "--tls-cert", "/nowhere/cert.pem", "--tls-key", k]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("cannot read /nowhere/cert.pem"), "{err}");
    let (code, err) = run(&["-f", api.to_str().unwrap(), "--tls-cert", c]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--tls-key"), "{err}");
}

/// Whether the connection was closed by valve within `within` (reads to EOF or a reset).
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {
                return false
            }
            Err(_) => return true,
        }
    }
}

#[test]
fn bad_tls_clients_each_cost_one_connection_and_no_worker_for_a_bounded_time() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = write_cert(dir.path(), "bounds", 30);
    let valve = start_tls(&fixture("api.R"), &cert, &key, &["--header-timeout", "2", "-n", "1"]);
    let addr = valve.url.trim_start_matches("https://").to_string();
    let start = Instant::now();
    // Garbage: closed at once.
    let mut garbage = TcpStream::connect(&addr).unwrap();
    garbage.write_all(&[0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5, 0xff, 0xff, 0xff]).unwrap();
    assert!(closed_within(&mut garbage, Duration::from_secs(3)), "garbage closed");
    // A huge ClientHello (a record past TLS's limit): closed at once.
    let mut huge = TcpStream::connect(&addr).unwrap();
    let mut hello = vec![0x16, 0x03, 0x01, 0xff, 0xff, 0x01, 0xff, 0xff, 0xff];
    hello.resize(70_000, 0x41);
    let _ = huge.write_all(&hello);
    assert!(closed_within(&mut huge, Duration::from_secs(3)), "huge ClientHello closed");
    // Stops mid-handshake, and says nothing at all: closed at the header timeout.
    let mut half = TcpStream::connect(&addr).unwrap();
    half.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00]).unwrap();
    let mut silent = TcpStream::connect(&addr).unwrap();
    let waited = Instant::now();
    assert!(closed_within(&mut half, Duration::from_secs(8)), "a half handshake closed");
    assert!(closed_within(&mut silent, Duration::from_secs(8)), "a silent client closed");
    assert!(waited.elapsed() >= Duration::from_millis(1500), "not before the header timeout");
    // Meanwhile and after, the one worker serves everyone else.
    let (c, _, h) = curl(&["--cacert", cert.to_str().unwrap(), &valve.get("/pid")]);
    assert_eq!(c, 200, "{h}");
    assert!(start.elapsed() < Duration::from_secs(30));
    assert_eq!(valve.status()["pool"]["busy"], 0);
}

/// An HTTP/2 client over TLS trusting `ca`, on `addr`: its sender.
async fn h2_client<B>(addr: &str, ca: &Path) -> hyper::client::conn::http2::SendRequest<B>
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut roots = rustls::RootCertStore::empty();
    let pem = std::fs::read(ca).unwrap();
    use rustls::pki_types::pem::PemObject;
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await.unwrap();
    let (send, conn) = hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
        .handshake(hyper_util::rt::TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    send
}

type StalledBody = futures_util::stream::Pending<Result<hyper::body::Frame<bytes::Bytes>, std::io::Error>>;

#[tokio::test(flavor = "multi_thread")]
async fn http2_clients_with_100_stalled_streams_or_a_flood_of_resets_hold_no_worker() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = write_cert(dir.path(), "streams", 30);
    let valve = start_tls(&fixture("api.R"), &cert, &key, &["-n", "1"]);
    let addr = valve.url.trim_start_matches("https://").to_string();
    let mut send = h2_client::<http_body_util::StreamBody<StalledBody>>(&addr, &cert).await;
    let mut stalled = Vec::new();
    for _ in 0..100 {
        send.ready().await.unwrap();
        let req = http::Request::post(valve.get("/size"))
            .header("content-length", "1000")
            .body(http_body_util::StreamBody::new(futures_util::stream::pending()))
            .unwrap();
        stalled.push(tokio::spawn(send.send_request(req)));
    }
    // Another connection opens streams and resets them at once, 1000 times
    // (the "rapid reset" attack): valve closes that connection (h2's limit on
    // resets of streams not yet taken) or serves and forgets them; either
    // way the worker is free again at once and everyone else is served.
    let mut flood = h2_client::<http_body_util::Empty<bytes::Bytes>>(&addr, &cert).await;
    let mut sent = 0;
    for _ in 0..1000 {
        if flood.ready().await.is_err() {
            break;
        }
        let req = http::Request::get(valve.get("/pid")).body(http_body_util::Empty::new()).unwrap();
        let _ = tokio::time::timeout(Duration::from_micros(50), flood.send_request(req)).await;
        sent += 1;
    }
    eprintln!("resets sent before valve closed the connection (1000: never closed): {sent}");
    valve.wait_for_requests(0, 0);
    // The one worker is free for everyone else, over HTTP/2 and HTTP/1.1.
    for v in ["--http2", "--http1.1"] {
        let (c, _, h) = curl(&[v, "--cacert", cert.to_str().unwrap(), &valve.get("/pid")]);
        assert_eq!(c, 200, "{h}");
    }
    let status = valve.status();
    assert_eq!(status["pool"]["busy"], 0, "{status}");
    assert_eq!(status["queue"]["waiting"], 0, "{status}");
    drop(send);
    for s in stalled {
        s.abort();
    }
}

/// The reconnect layer over TLS: the connection (TLS and all) is cut twice
/// under a burst of inputs, and the page resumes the same R session with
/// every input once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_reconnect_layer_resumes_a_shiny_session_over_https_after_cuts() {
    use crate::reconnect::{expected, same_session, seen, Page};
    use serde_json::json;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = write_cert(dir.path(), "reconnect", 30);
    let app = fixture("shiny_reconnect");
    let valve = start_tls(&app, &cert, &key, &[]);
    let proxy = crate::cut::Cuttable::start(&valve.url).await;
    let mut page = Page::open(&proxy.url.replace("http://", "https://")).await;
    page.ask(json!({"op": "type", "text": "typed before"})).await;
    let before = page.state().await;
    page.ask(json!({"op": "burst", "n": 30, "tag": "s"})).await;
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        proxy.cut();
    }
    page.wait_resumed(&before).await;
    let after = page.ask(json!({"op": "waitCount", "n": 30, "timeout": 60})).await;
    same_session(&before, &after);
    assert_eq!(seen(&after), expected("s", 30), "R got each input once, in order: {after}");
    assert_eq!(after["name"], "typed before");
    page.close().await;
}
