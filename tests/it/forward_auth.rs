//! Forward auth (`auth_url`): valve asks a real auth service
//! written here (oauth2-proxy's `/oauth2/auth` in miniature) who is calling,
//! with the request's cookies; its answer names the user to R, the allow
//! lists decide, answers are cached, and a service that cannot say gets 503
//! before any worker is taken.

use std::convert::Infallible;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

use crate::harness::{client, closed_port, fixture, Valve};

/// The auth service: 200 naming alice for the cookie `session=alice`, 500
/// for `session=broken`, 401 for anything else; it counts its calls and
/// keeps the last question's headers.
struct AuthService {
    url: String,
    calls: Arc<AtomicUsize>,
    last: Arc<Mutex<HeaderMap>>,
}

impl AuthService {
    async fn start() -> AuthService {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/oauth2/auth", listener.local_addr().unwrap());
        let calls = Arc::new(AtomicUsize::new(0));
        let last = Arc::new(Mutex::new(HeaderMap::new()));
        let (c, l) = (calls.clone(), last.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let (c, l) = (c.clone(), l.clone());
                let service = service_fn(move |req: Request<Incoming>| {
                    c.fetch_add(1, Ordering::SeqCst);
                    *l.lock().unwrap() = req.headers().clone();
                    let cookie = req.headers().get("cookie").and_then(|v| v.to_str().ok()).unwrap_or("");
                    let resp = if cookie.contains("session=alice") {
                        Response::builder()
                            .status(202)
                            .header("x-auth-request-user", "alice")
                            .header("x-auth-request-email", "alice@example.org")
                            .header("x-auth-request-groups", "staff,admins")
                    } else if cookie.contains("session=broken") {
                        Response::builder().status(500)
                    } else {
                        Response::builder().status(401)
                    };
                    async move { Ok::<_, Infallible>(resp.body(Full::new(Bytes::from_static(b"auth"))).unwrap()) }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        AuthService { url, calls, last }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn last(&self, name: &str) -> String {
        self.last.lock().unwrap().get(name).map(|v| v.to_str().unwrap().to_string()).unwrap_or_default()
    }
}

/// Every request valve handed to a worker so far, over every app.
fn handed_to_workers(valve: &Valve) -> u64 {
    let status = valve.status();
    status["workers"].as_array().expect("status lists workers").iter().filter_map(|w| w["requests"].as_u64()).sum()
}

async fn ask(valve: &Valve, path: &str, headers: &[(&str, &str)]) -> (u16, String, String) {
    let mut req = client().get(valve.get(path));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let location = resp.headers().get("location").map(|l| l.to_str().unwrap().to_string()).unwrap_or_default();
    (resp.status().as_u16(), location, resp.text().await.unwrap())
}

fn write_config(dir: &Path, auth_url: &str) -> std::path::PathBuf {
    let docs = dir.join("docs");
    std::fs::create_dir_all(&docs).unwrap();
    std::fs::write(docs.join("index.html"), "<h1>docs</h1>").unwrap();
    let text = format!(
        r#"
trusted_proxies = ["127.0.0.1"]
auth_url = "{auth_url}"
auth_cache = 60
sign_in_url = "http://127.0.0.1:4180/oauth2/start?rd={{url}}"

[[app]]
name = "api"
file = "{api}"
allow_users = ["alice"]

[[app]]
name = "docs"
static = "{docs}"
"#,
        api = fixture("whoami.R").display(),
        docs = docs.display()
    );
    let path = dir.join("valve.toml");
    std::fs::write(&path, text).unwrap();
    path
}

const SPOOF: [(&str, &str); 3] =
    [("x-forwarded-user", "mallory"), ("x-auth-request-user", "mallory"), ("x-forwarded-groups", "admin")];

#[tokio::test(flavor = "multi_thread")]
async fn the_auth_service_names_the_caller_and_the_allow_lists_decide() {
    let auth = AuthService::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &auth.url);
    let valve = Valve::start(&["-c", config.to_str().unwrap(), "--n-min", "1"]);
    let before = handed_to_workers(&valve);

    // Not signed in: a browser is sent to sign in (the full URL to come back to), anything else 403.
    let html = [("accept", "text/html"), ("cookie", "session=bob")];
    let (code, location, _) = ask(&valve, "/api/who?x=1", &html).await;
    assert_eq!(code, 302);
    let port = valve.url.rsplit(':').next().unwrap();
    assert_eq!(
        location,
        format!("http://127.0.0.1:4180/oauth2/start?rd=http%3A//127.0.0.1%3A{port}/api/who%3Fx%3D1"),
        "the sign-in URL carries the full URL asked for"
    );
    assert_eq!(auth.calls(), 1);
    assert_eq!(
        (auth.last("x-forwarded-method"), auth.last("x-forwarded-uri"), auth.last("x-forwarded-proto")),
        ("GET".into(), "/api/who?x=1".into(), "http".into())
    );
    assert_eq!(
        (auth.last("x-forwarded-host"), auth.last("x-forwarded-for")),
        (format!("127.0.0.1:{port}"), "127.0.0.1".into())
    );
    assert_eq!(auth.last("cookie"), "session=bob");
    // Identity headers are never believed with auth_url, not even from a trusted proxy.
    let (code, _, body) = ask(&valve, "/api/who", &[&SPOOF[..], &[("accept", "application/json")]].concat()).await;
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("\"status\":403"), "{body}");
    assert_eq!(auth.calls(), 1, "no Cookie, no Authorization: the service is not asked");
    let upgrade = [("cookie", "session=bob"), ("connection", "Upgrade"), ("upgrade", "websocket")];
    assert_eq!(ask(&valve, "/api/who", &upgrade).await.0, 403);
    assert_eq!(handed_to_workers(&valve), before, "no refused request reached a worker");
    // The open app is served anonymously.
    assert_eq!(ask(&valve, "/docs/", &[("cookie", "session=bob")]).await.0, 200);

    // Signed in: the service's answer names alice to R, whatever the client claims.
    let alice = [&SPOOF[..], &[("cookie", "theme=dark; session=alice")]].concat();
    let calls = auth.calls();
    let (code, _, body) = ask(&valve, "/api/who", &alice).await;
    assert_eq!(code, 200, "{body}");
    let seen: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (&seen["user"], &seen["email"], &seen["groups"], &seen["custom"]),
        (&"alice".into(), &"alice@example.org".into(), &"staff,admins".into(), &"".into()),
        "{seen}"
    );
    assert_eq!(auth.calls(), calls + 1);
    // Within auth_cache (60 s) the same credentials are not asked about again.
    assert_eq!(ask(&valve, "/api/who", &alice).await.0, 200);
    assert_eq!(auth.calls(), calls + 1, "the second request was answered from the cache");
    valve.wait_for_log("user=alice", Duration::from_secs(10));

    // An answer that is neither 2xx nor 401/403: 503, no worker taken.
    let before = handed_to_workers(&valve);
    let (code, _, body) = ask(&valve, "/api/who", &[("cookie", "session=broken")]).await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("forward-auth service"), "{body}");
    assert_eq!(handed_to_workers(&valve), before);
    valve.wait_for_log("the forward-auth service could not say who is calling", Duration::from_secs(10));

    let metrics =
        valve.admin_client().get(valve.admin("/__valve__/metrics")).send().await.unwrap().text().await.unwrap();
    for line in [
        r#"valve_auth_requests_total{result="allowed"} 1"#,
        r#"valve_auth_requests_total{result="denied"} 1"#,
        // bob's upgrade and his page of docs, alice's second request.
        r#"valve_auth_requests_total{result="cached"} 3"#,
        r#"valve_auth_requests_total{result="skipped"} 1"#,
        r#"valve_auth_requests_total{result="error"} 1"#,
        r#"valve_rejected_requests_total{app="api",reason="auth_unavailable"} 1"#,
    ] {
        assert!(
            metrics.contains(line),
            "{line} in {}",
            metrics.lines().filter(|l| l.contains("auth")).collect::<Vec<_>>().join("\n")
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn with_no_cache_every_request_asks_the_service() {
    let auth = AuthService::start().await;
    let whoami = fixture("whoami.R").display().to_string();
    let valve = Valve::start(&["-f", &whoami, "--auth-url", &auth.url, "--auth-cache", "0"]);
    for n in 1..=3 {
        let (code, _, body) = ask(&valve, "/who", &[("cookie", "session=alice")]).await;
        assert!(code == 200 && body.contains("\"user\":\"alice\""), "{code} {body}");
        assert_eq!(auth.calls(), n, "--auth-cache 0: asked every time");
    }
    let (code, _, body) = ask(&valve, "/who", &[("cookie", "session=bob")]).await;
    assert!(code == 200 && body.contains("\"user\":\"\""), "an open app serves the unknown anonymously: {body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_auth_service_that_is_down_gets_503_and_takes_no_worker() {
    let (_held, port) = closed_port();
    let whoami = fixture("whoami.R").display().to_string();
    let url = format!("http://127.0.0.1:{port}/oauth2/auth");
    let valve = Valve::start(&["-f", &whoami, "--auth-url", &url, "--n-min", "1"]);
    let before = handed_to_workers(&valve);
    for _ in 0..5 {
        let (code, _, body) = ask(&valve, "/who", &[("cookie", "session=alice")]).await;
        assert_eq!(code, 503, "{body}");
        assert!(body.contains("\"status\":503") && body.contains("auth_url"), "{body}");
    }
    assert_eq!(handed_to_workers(&valve), before, "no request reached a worker");
    valve.wait_for_log("the forward-auth service could not say who is calling", Duration::from_secs(10));
    let warnings = valve.log().matches("the forward-auth service could not say").count();
    // One warning per 10 s at most: five quick refusals (connection refused) are not five warnings.
    assert!((1..5).contains(&warnings), "not one warning per request: {warnings}");
}
