//! valve's answers are plumber's answers: compared byte for byte with a plain
//! plumber process on plumber's own example APIs and on a test API.

use reqwest::{Method, StatusCode};

use crate::harness::{client, comparable, fixture, need_r_packages, plumber_example, Plumber, Valve};

/// One request to send to both, and what to leave out of the comparison.
struct Case {
    method: Method,
    path: &'static str,
    headers: &'static [(&'static str, &'static str)],
    body: Option<&'static [u8]>,
    /// Answers that differ by design (random numbers, encrypted cookies).
    ignore_body: bool,
    /// Set-Cookie values that are encrypted with a random nonce: compare names only.
    random_cookie: bool,
    /// A gzip answer: compare it decompressed (compressors and framing differ).
    gunzip: bool,
}

fn get(path: &'static str) -> Case {
    Case {
        method: Method::GET,
        path,
        headers: &[],
        body: None,
        ignore_body: false,
        random_cookie: false,
        gunzip: false,
    }
}

fn post(path: &'static str, content_type: &'static str, body: &'static [u8]) -> Case {
    let headers: &'static [(&'static str, &'static str)] = match content_type {
        "json" => &[("content-type", "application/json")],
        _ => &[("content-type", "application/x-www-form-urlencoded")],
    };
    Case {
        method: Method::POST,
        path,
        headers,
        body: Some(body),
        ignore_body: false,
        random_cookie: false,
        gunzip: false,
    }
}

/// A POST with its own content type.
fn post_as(path: &'static str, content_type: &'static str, body: &'static [u8]) -> Case {
    let headers: &'static [(&'static str, &'static str)] = Box::leak(Box::new([("content-type", content_type)]));
    Case { headers, ..post(path, "json", body) }
}

/// A summary of an answer that must match: status, headers but `date`, bytes.
async fn fetch(base: &str, case: &Case) -> (StatusCode, Vec<(String, String)>, String) {
    let (status, mut headers, mut body) = comparable(base, &case.method, case.path, case.headers, case.body).await;
    if case.random_cookie {
        for (k, v) in headers.iter_mut() {
            if k == "set-cookie" {
                *v = v.split('=').next().unwrap_or_default().to_string();
            }
        }
    }
    if case.gunzip {
        headers.retain(|(k, _)| k != "content-length" && k != "transfer-encoding");
        let mut plain = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&body[..]), &mut plain)
            .unwrap_or_else(|e| panic!("{} {} from {base}: not gzip: {e}", case.method, case.path));
        body = plain;
    }
    if case.ignore_body {
        headers.retain(|(k, _)| k != "set-cookie" && k != "content-length");
        return (status, headers, String::new());
    }
    (status, headers, describe(&body))
}

/// Bytes as text when they are text, else as a length and a checksum (short assertion messages).
fn describe(body: &[u8]) -> String {
    match std::str::from_utf8(body) {
        Ok(text) if text.len() < 2000 => text.to_string(),
        _ => {
            let sum = body.iter().fold(0u64, |h, b| h.wrapping_mul(1_099_511_628_211).wrapping_add(u64::from(*b)));
            format!("{} bytes, checksum {sum:x}", body.len())
        }
    }
}

async fn compare(api: &std::path::Path, cases: &[Case]) {
    compare_with(api, &[], cases).await;
}

/// Compares with valve started with `flags` besides `-f API`.
async fn compare_with(api: &std::path::Path, flags: &[&str], cases: &[Case]) {
    let plumber = Plumber::start(api);
    let mut args = vec!["-f", api.to_str().unwrap()];
    args.extend_from_slice(flags);
    let valve = Valve::start(&args);
    for case in cases {
        let direct = fetch(&plumber.url, case).await;
        let proxied = fetch(&valve.url, case).await;
        assert_eq!(proxied, direct, "{} {} differs through valve ({})", case.method, case.path, api.display());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn test_api_answers_match_plain_plumber() {
    compare(
        &fixture("api.R"),
        &[
            get("/cookies"),
            get("/bytes"),
            get("/error"),
            get("/no/such/route"),
            get("/relative"),
            post("/form", "form", b"name=ada&n=21"),
            post("/form", "json", br#"{"name":"ada","n":21}"#),
            Case { method: Method::HEAD, ..get("/bytes") },
            Case { method: Method::DELETE, ..get("/pid") },
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn plumber_examples_answer_as_without_valve() {
    compare(
        &plumber_example("01-append"),
        &[post("/append", "json", br#"{"val": 42}"#), get("/tail?n=1"), get("/graph")],
    )
    .await;
    compare(
        &plumber_example("02-filters"),
        &[get("/about"), get("/me"), get("/me?username=kim"), get("/me?username=nobody")],
    )
    .await;
    compare(
        &plumber_example("05-static"),
        &[get("/"), get("/a.html"), get("/static/b.txt"), get("/static/missing.txt")],
    )
    .await;
    compare(
        &plumber_example("06-sessions"),
        &[
            Case { headers: &[("cookie", "visitcounter=3")], ..get("/counter") },
            Case { ignore_body: true, ..get("/sessionCounter") },
            get("/iframe.html"),
        ],
    )
    .await;
    // The PDF embeds its creation time, so only its status and headers can match.
    compare(
        &plumber_example("09-content-type"),
        &[Case { ignore_body: true, ..get("/pdf") }, get("/text"), get("/html"), get("/download-binary")],
    )
    .await;
    compare(&plumber_example("10-welcome"), &[get("/")]).await;
    compare(&plumber_example("12-entrypoint"), &[Case { random_cookie: true, ..get("/counter") }]).await;
    // These answer with the current time: compare everything but the bytes.
    compare(
        &plumber_example("16-attachment"),
        &[
            Case { ignore_body: true, ..get("/name") },
            Case { ignore_body: true, ..get("/no_name") },
            Case { ignore_body: true, ..get("/inline") },
        ],
    )
    .await;
    compare(
        &plumber_example("17-arguments"),
        &[post("/good-practice/1/2?c=3", "form", b"d=4"), post("/bad-practice/1/2", "form", b"")],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_and_several_cookies_survive_the_trip() {
    let valve = Valve::start(&["-f", fixture("api.R").to_str().unwrap()]);
    let resp = client().get(valve.get("/cookies")).send().await.unwrap();
    let cookies: Vec<_> =
        resp.headers().get_all("set-cookie").iter().map(|v| v.to_str().unwrap().to_string()).collect();
    assert_eq!(cookies.len(), 2, "both Set-Cookie headers arrive: {cookies:?}");
    assert!(cookies[0].starts_with("first=1") && cookies[1].starts_with("second=two"), "{cookies:?}");

    let api = plumber_example("06-sessions");
    let valve = Valve::start(&["-f", api.to_str().unwrap(), "-n", "2", "--n-min", "2"]);
    let c = client();
    let first = c.get(valve.get("/sessionCounter")).send().await.unwrap();
    let cookie = first.headers()["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_string();
    assert_eq!(first.text().await.unwrap(), r#"["This is visit #0"]"#);
    let second = c.get(valve.get("/sessionCounter")).header("cookie", cookie).send().await.unwrap();
    assert_eq!(second.text().await.unwrap(), r#"["This is visit #1"]"#, "the encrypted session cookie round-trips");
}

#[tokio::test(flavor = "multi_thread")]
async fn forwards_client_address_and_appends_to_x_forwarded_for() {
    let valve = Valve::start(&["-f", fixture("api.R").to_str().unwrap()]);
    let seen: serde_json::Value = client()
        .get(valve.get("/headers"))
        .header("x-forwarded-for", "203.0.113.7")
        .header("connection", "keep-alive, x-secret")
        .header("x-secret", "hop-by-hop")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(seen["HTTP_X_FORWARDED_FOR"][0], "203.0.113.7, 127.0.0.1");
    assert_eq!(seen["HTTP_X_FORWARDED_PROTO"][0], "http");
    assert_eq!(seen["HTTP_X_FORWARDED_HOST"][0], valve.url.trim_start_matches("http://"));
    assert!(seen.get("HTTP_X_SECRET").is_none(), "headers named in Connection are not forwarded: {seen}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_cannot_name_itself_a_user() {
    let valve = Valve::start(&["-f", fixture("api.R").to_str().unwrap()]);
    let seen: serde_json::Value = client()
        .get(valve.get("/headers"))
        .header("x-forwarded-user", "mallory")
        .header("x_forwarded_email", "mallory@example.org")
        .header("x-forwarded-groups", "admin")
        .header("shiny-server-credentials", r#"{"user":"mallory","groups":["admin"]}"#)
        .header("x-app-header", "kept")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for key in
        ["HTTP_X_FORWARDED_USER", "HTTP_X_FORWARDED_EMAIL", "HTTP_X_FORWARDED_GROUPS", "HTTP_SHINY_SERVER_CREDENTIALS"]
    {
        assert!(seen.get(key).is_none(), "{key} reached R from a client: {seen}");
    }
    assert_eq!(seen["HTTP_X_APP_HEADER"][0], "kept", "other headers still arrive: {seen}");
}

#[tokio::test(flavor = "multi_thread")]
async fn large_and_chunked_bodies_arrive_whole() {
    let valve = Valve::start(&["-f", fixture("api.R").to_str().unwrap()]);
    let big = vec![b'x'; 8 * 1024 * 1024];
    let seen: serde_json::Value =
        client().post(valve.get("/size")).body(big).send().await.unwrap().json().await.unwrap();
    assert_eq!(seen["bytes"][0], 8 * 1024 * 1024);
    let chunks = futures::stream::iter((0..64).map(|_| Ok::<_, std::io::Error>(vec![b'y'; 1000])));
    let seen: serde_json::Value = client()
        .post(valve.get("/size"))
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(seen["bytes"][0], 64_000, "a chunked upload arrives whole");
}

#[tokio::test(flavor = "multi_thread")]
async fn root_redirects_to_docs_unless_the_api_has_its_own() {
    let valve = Valve::start(&["-f", fixture("api.R").to_str().unwrap()]);
    let resp = client().get(valve.get("/")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::TEMPORARY_REDIRECT);
    assert_eq!(resp.headers()["location"], "/__docs__/");
    let docs = client().get(valve.get("/__docs__/")).send().await.unwrap();
    assert_eq!(docs.status(), StatusCode::OK);
    assert!(docs.text().await.unwrap().contains("<html"), "plumber's docs are served");

    let welcome = Valve::start(&["-f", plumber_example("10-welcome").to_str().unwrap()]);
    let resp = client().get(welcome.get("/")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "the API's own / route wins");
}

/// A body of `n` bytes of every value, for uploads.
fn bytes(n: usize) -> &'static [u8] {
    Box::leak((0..n).map(|i| (i * 7 % 251) as u8).collect::<Vec<u8>>().into_boxed_slice())
}

/// A multipart form with a text field and two files, as browsers send it.
fn multipart() -> &'static [u8] {
    let mut body = Vec::new();
    body.extend_from_slice(b"--XyZ\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\nhello\r\n");
    body.extend_from_slice(b"--XyZ\r\nContent-Disposition: form-data; name=\"data\"; filename=\"d.bin\"\r\n");
    body.extend_from_slice(b"Content-Type: application/octet-stream\r\n\r\n");
    body.extend_from_slice(bytes(5000));
    body.extend_from_slice(b"\r\n--XyZ\r\nContent-Disposition: form-data; name=\"csv\"; filename=\"t.csv\"\r\n");
    body.extend_from_slice(b"Content-Type: text/csv\r\n\r\na,b\n1,2\n\r\n--XyZ--\r\n");
    Box::leak(body.into_boxed_slice())
}

/// The frames protocol: what a worker without an HTTP server must still do as plumber
/// does: async endpoints, static assets, uploads (inline and spooled to a
/// file), image serializers, answers given as files, no-body answers, gzip.
#[tokio::test(flavor = "multi_thread")]
async fn async_static_uploads_and_images_answer_as_without_valve() {
    need_r_packages(&["promises", "future", "digest"]);
    compare(
        &fixture("fidelity.R"),
        &[
            get("/async-later"),
            get("/async-future"),
            get("/async-error"),
            get("/assets/hello.txt"),
            get("/assets/page.html"),
            get("/assets/data.bin"),
            get("/assets/missing.txt"),
            Case { method: Method::HEAD, ..get("/assets/hello.txt") },
            post_as("/upload", "application/octet-stream", bytes(100)),
            // Past 1 MiB valve spools the body; the worker reads it from the file.
            post_as("/upload", "application/octet-stream", bytes(1_500_000)),
            post_as("/upload", "text/plain", b"line one\nline two\nline three"),
            post_as("/multipart", "multipart/form-data; boundary=XyZ", multipart()),
            get("/plot.png"),
            get("/plot.jpeg"),
            get("/plot.svg"),
            get("/file"),
            get("/nobody"),
            get("/cookies"),
            get("/query?a=1&a=2&b=%20x%C3%A9"),
            get("/query?"),
            get("/utf8"),
            Case { headers: &[("accept-encoding", "gzip, deflate")], gunzip: true, ..get("/query?a=zipped") },
            Case { headers: &[("accept-encoding", "gzip")], gunzip: true, ..get("/assets/data.bin") },
        ],
    )
    .await;
    // plumber's own async example (its /async takes 5 s; its answers carry the time).
    compare(
        &plumber_example("13-promises"),
        &[Case { ignore_body: true, ..get("/async") }, Case { ignore_body: true, ..get("/sync") }, get("/sync-bad")],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn later_runs_between_requests_and_plumbers_size_limit_holds() {
    need_r_packages(&["promises", "future", "digest"]);
    let valve = Valve::start(&["-f", fixture("fidelity.R").to_str().unwrap()]);
    let c = client();
    assert!(c.get(valve.get("/later-arm")).send().await.unwrap().status().is_success());
    // The timer fires while the worker waits for its next request.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let text = c.get(valve.get("/later-check")).send().await.unwrap().text().await.unwrap();
        if text.contains("true") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "a later() timer armed by a request never fired: {text}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // plumber.maxRequestSize (2 MB here): plumber's own 413, from onHeaders.
    let resp = c.post(valve.get("/upload")).body(bytes(3_000_000)).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
}

/// The httpuv road stays for APIs that need it.
#[tokio::test(flavor = "multi_thread")]
async fn worker_transport_httpuv_still_answers_as_plumber() {
    compare_with(
        &fixture("api.R"),
        &["--worker-transport", "httpuv"],
        &[
            get("/cookies"),
            get("/bytes"),
            get("/error"),
            post("/form", "json", br#"{"name":"ada","n":21}"#),
            Case { method: Method::HEAD, ..get("/bytes") },
        ],
    )
    .await;
    let valve = Valve::start(&["-f", fixture("api.R").to_str().unwrap(), "--worker-transport", "httpuv"]);
    let seen: serde_json::Value =
        client().post(valve.get("/size")).body(vec![b'x'; 3 << 20]).send().await.unwrap().json().await.unwrap();
    assert_eq!(seen["bytes"][0], 3 << 20);
}
