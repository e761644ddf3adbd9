//! Ports for tests, and the HTTP client they send with (carrying the operator
//! token to a running valve's admin address).

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::time::Duration;

/// A loopback port free now, for a process that binds it later: taken below
/// the kernel's ephemeral range (net.ipv4.ip_local_port_range), where no
/// outgoing connection's source port and no bind to port 0 (valves and R
/// workers of tests running meanwhile) can take it first; never the same
/// port twice in one test run. Only for plain plumber, which cannot be told
/// port 0: valve binds port 0 and prints what it got (`Valve::admin_url`).
pub fn free_port() -> u16 {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let ephemeral_low: u32 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    if ephemeral_low > 12000 {
        let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
        let span = u64::from(ephemeral_low - 10000);
        for attempt in 0..500u32 {
            // std's randomly keyed hasher as the dice: the bind below is the real check.
            let port = (10000 + RandomState::new().hash_one(attempt) % span) as u16;
            if given.contains(&port) {
                continue;
            }
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                given.push(port);
                return port;
            }
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A loopback port nothing listens on, for as long as the returned socket
/// lives: it is bound (so no one else can take the port) but not listening,
/// so a connection to it is refused.
pub fn closed_port() -> (tokio::net::TcpSocket, u16) {
    let socket = tokio::net::TcpSocket::new_v4().expect("a TCP socket");
    socket.bind("127.0.0.1:0".parse().expect("an address")).expect("bind to port 0");
    let port = socket.local_addr().expect("a bound address").port();
    (socket, port)
}

/// Each running valve's admin address and operator token, for helpers that
/// are handed a URL alone (`for_url`).
pub(super) static ADMINS: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

/// The operator token of the running valve whose admin address `url` is on.
pub fn token_for(url: &str) -> Option<String> {
    ADMINS.lock().unwrap().iter().find(|(admin, _)| url.starts_with(admin.as_str())).map(|(_, t)| t.clone())
}

/// A GET of `url` (as `client()`), carrying the operator token when `url`
/// is on a running valve's admin address.
pub fn get_url(url: &str) -> reqwest::RequestBuilder {
    let token = token_for(url);
    let req = client().get(url);
    match token {
        Some(t) => req.bearer_auth(t),
        None => req,
    }
}

/// A client that neither follows redirects nor keeps cookies, and opens a fresh
/// connection per request (keep-alive to plain httpuv stalls 40 ms a request).
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// Sends one request to `base` and returns its status, its headers but those
/// that differ by design between two servers (`date`, `connection`,
/// `keep-alive`), and its body: what the fidelity tests compare.
pub async fn comparable(
    base: &str,
    method: &reqwest::Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> (reqwest::StatusCode, Vec<(String, String)>, Vec<u8>) {
    let mut req = client().request(method.clone(), format!("{base}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if let Some(body) = body {
        req = req.body(body.to_vec());
    }
    let resp = req.send().await.unwrap_or_else(|e| panic!("{method} {path} to {base}: {e}"));
    let status = resp.status();
    let headers = resp
        .headers()
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "date" | "connection" | "keep-alive"))
        .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).to_string()))
        .collect();
    (status, headers, resp.bytes().await.unwrap().to_vec())
}
