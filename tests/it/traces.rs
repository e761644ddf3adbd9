//! Traces: a request's W3C trace reaches R (a plumber worker over frames, a
//! Shiny worker over HTTP) with valve's span as its parent, and valve's spans
//! (a request's, with its queue wait, worker and time in R; a Shiny
//! session's, across a reconnect) arrive at a real collector: Jaeger v2,
//! started here with an in-memory store on free loopback ports and read back
//! through its query API. With the collector down, requests are answered as
//! ever and the spans that could not go are counted.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use serde_json::Value;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;

type Ws = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

use crate::harness::{client, closed_port, fixture, free_port, go_tool, need_r_packages, Valve, START_DEADLINE};

/// How long a span may take to show in Jaeger: valve batches for a second,
/// Jaeger stores at once; seconds on a loaded machine.
const ARRIVAL_DEADLINE: Duration = Duration::from_secs(30);

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// The Jaeger binary scripts/install-deps builds (`VALVE_JAEGER` overrides).
fn jaeger_bin() -> PathBuf {
    go_tool("jaeger", "github.com/jaegertracing/jaeger", "VALVE_JAEGER")
}

/// Jaeger v2 with an in-memory store: OTLP/HTTP in, the query API out.
struct Jaeger {
    child: Child,
    /// Its OTLP/HTTP receiver's base URL (spans go to /v1/traces under it).
    otlp: String,
    query: String,
    _dir: tempfile::TempDir,
}

impl Jaeger {
    fn start() -> Jaeger {
        let bin = jaeger_bin();
        assert!(
            bin.is_file(),
            "this test needs Jaeger v2 at {}: run VALVE_WITH_BROWSER=1 scripts/install-deps (it builds it with Go), or set VALVE_JAEGER",
            bin.display()
        );
        let (otlp, query, grpc) = (free_port(), free_port(), free_port());
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("jaeger.yaml");
        std::fs::write(
            &config,
            format!(
                "service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_storage:
    backends:
      memory_store:
        memory:
          max_traces: 10000
  jaeger_query:
    storage:
      traces: memory_store
    http:
      endpoint: 127.0.0.1:{query}
    grpc:
      endpoint: 127.0.0.1:{grpc}
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{otlp}
exporters:
  jaeger_storage_exporter:
    trace_storage: memory_store
"
            ),
        )
        .unwrap();
        let mut child = Command::new(&bin)
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("jaeger starts");
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[jaeger] {line}");
            }
        });
        let jaeger = Jaeger {
            child,
            otlp: format!("http://127.0.0.1:{otlp}"),
            query: format!("http://127.0.0.1:{query}"),
            _dir: dir,
        };
        let start = Instant::now();
        loop {
            let receiving = std::net::TcpStream::connect(("127.0.0.1", otlp)).is_ok();
            let answering = std::process::Command::new("curl")
                .args(["-sf", "-o", "/dev/null", &format!("{}/api/services", jaeger.query)])
                .status()
                .is_ok_and(|s| s.success());
            if receiving && answering {
                return jaeger;
            }
            assert!(
                start.elapsed() < START_DEADLINE,
                "Jaeger did not listen within {START_DEADLINE:?} (its log is above)"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The trace `id` once Jaeger holds at least `spans` spans of it.
    async fn trace(&self, id: &str, spans: usize) -> Value {
        let url = format!("{}/api/traces/{id}", self.query);
        let start = Instant::now();
        let mut last = Value::Null;
        loop {
            if let Ok(resp) = client().get(&url).send().await {
                if let Ok(body) = resp.json::<Value>().await {
                    let n = body["data"][0]["spans"].as_array().map_or(0, Vec::len);
                    if n >= spans {
                        return body["data"][0].clone();
                    }
                    last = body;
                }
            }
            assert!(
                start.elapsed() < ARRIVAL_DEADLINE,
                "Jaeger did not hold {spans} span(s) of trace {id} within {ARRIVAL_DEADLINE:?}; last answer: {last}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Jaeger {
    fn drop(&mut self) {
        unsafe {
            libc::kill(-(self.child.id() as i32), libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

/// A span of a Jaeger trace by its operation name (exactly one).
fn span<'a>(trace: &'a Value, name: &str) -> &'a Value {
    let spans: Vec<&Value> = trace["spans"].as_array().unwrap().iter().filter(|s| s["operationName"] == name).collect();
    assert_eq!(spans.len(), 1, "one span named {name:?} in {trace}");
    spans[0]
}

/// A span's tag value.
fn tag<'a>(span: &'a Value, key: &str) -> &'a Value {
    span["tags"]
        .as_array()
        .and_then(|tags| tags.iter().find(|t| t["key"] == key))
        .map(|t| &t["value"])
        .unwrap_or_else(|| panic!("span {} has no tag {key}: {span}", span["operationName"]))
}

/// The span a Jaeger span names as its parent, if any.
fn parent(span: &Value) -> Option<String> {
    span["references"]
        .as_array()?
        .iter()
        .find(|r| r["refType"] == "CHILD_OF")
        .and_then(|r| r["spanID"].as_str())
        .map(str::to_string)
}

/// `traceparent` as (trace id, span id, flags), checked for form.
fn parts(traceparent: &str) -> (String, String, String) {
    let p: Vec<&str> = traceparent.split('-').collect();
    assert!(
        p.len() == 4 && p[0] == "00" && p[1].len() == 32 && p[2].len() == 16 && p[3].len() == 2,
        "a version-00 traceparent: {traceparent:?}"
    );
    assert!(traceparent.bytes().all(|b| b == b'-' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    (p[1].to_string(), p[2].to_string(), p[3].to_string())
}

async fn metric(valve: &Valve, sample: &str) -> f64 {
    let text = valve.admin_client().get(valve.admin("/__valve__/metrics")).send().await.unwrap().text().await.unwrap();
    text.lines().find_map(|l| l.strip_prefix(sample).and_then(|v| v.trim().parse().ok())).unwrap_or(0.0)
}

async fn wait_for_metric(valve: &Valve, sample: &str, at_least: f64) {
    let start = Instant::now();
    while metric(valve, sample).await < at_least {
        assert!(start.elapsed() < ARRIVAL_DEADLINE, "timed out waiting for {sample} >= {at_least}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// GET `url` with `headers`; the JSON R answered.
async fn get_json(url: String, headers: Vec<(&'static str, String)>) -> Value {
    let mut req = client().get(&url);
    for (k, v) in headers {
        req = req.header(k, v);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200, "{url}");
    resp.json().await.unwrap()
}

/// The next message valve sends on a socket, as text.
async fn next_text(ws: &mut Ws) -> String {
    let next = tokio::time::timeout(Duration::from_secs(30), ws.next()).await;
    next.expect("valve sends within 30 s").expect("the socket is open").unwrap().into_text().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_trace_runs_from_the_caller_through_valve_into_r_and_valves_spans_reach_jaeger() {
    need_r_packages(&["plumber", "shiny"]);
    let jaeger = Jaeger::start();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("valve.toml");
    std::fs::write(
        &config,
        format!(
            "[[app]]\nname = \"api\"\npath = \"/api\"\nfile = \"{}\"\nn_min = 1\nn_max = 1\n\n[[app]]\nname = \"shiny\"\npath = \"/shiny\"\nfile = \"{}\"\n",
            fixture("traced.R").display(),
            fixture("shiny_traced").display()
        ),
    )
    .unwrap();
    // OpenTelemetry's own variables name the collector and the service.
    let valve = Valve::start_with_env(
        &["-c", config.to_str().unwrap()],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &jaeger.otlp), ("OTEL_SERVICE_NAME", "valve-it")],
    );
    valve.wait_for_log("exporting traces", Duration::from_secs(5));
    let api = valve.get("/api/trace");

    // A caller's traced request waits in the queue behind a slow one (the
    // app has one worker), then R sleeps 0.2 s in it.
    let blocker = tokio::spawn(get_json(format!("{api}?sleep=1"), vec![]));
    wait_for_metric(&valve, "valve_workers{app=\"api\",state=\"busy\"}", 1.0).await;
    let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let traced = tokio::spawn(get_json(
        format!("{api}?sleep=0.2"),
        vec![("traceparent", caller.clone()), ("tracestate", "rojo=00f067aa0ba902b7".into())],
    ));
    wait_for_metric(&valve, "valve_queue_depth{app=\"api\"}", 1.0).await;
    blocker.await.unwrap();
    let r = traced.await.unwrap();
    let (trace, valves_span, flags) = parts(r["traceparent"].as_str().unwrap());
    assert_eq!((trace.as_str(), flags.as_str()), (CALLER_TRACE, "01"), "R continues the caller's trace: {r}");
    assert_ne!(valves_span, CALLER_SPAN, "R's parent is valve's span, not the caller's");
    assert_eq!(r["tracestate"], "rojo=00f067aa0ba902b7", "tracestate goes on with its trace");

    // No traceparent, or a malformed one: a new trace, and the caller's tracestate is dropped.
    let mut fresh = Vec::new();
    for sent in [None, Some("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01")] {
        let mut headers = vec![("tracestate", "rojo=1".to_string())];
        headers.extend(sent.map(|tp| ("traceparent", tp.to_string())));
        let r = get_json(api.clone(), headers).await;
        let (trace, span, flags) = parts(r["traceparent"].as_str().unwrap());
        assert!(trace != CALLER_TRACE && trace != CALLER_TRACE.to_uppercase() && flags == "01", "{r}");
        assert_eq!(r["tracestate"], "", "a new trace carries no tracestate");
        fresh.push((trace, span, r["worker"].as_str().unwrap().to_string()));
    }
    assert_ne!(fresh[0].0, fresh[1].0, "each request without a parent starts its own trace");

    // A Shiny worker (HTTP over its socket) gets valve's span too.
    let page = client()
        .get(valve.get("/shiny/"))
        .header("traceparent", &caller)
        .header("accept", "text/html")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let shown = page.split("<pre id=\"traceparent\">").nth(1).and_then(|s| s.split('<').next()).unwrap_or(&page);
    let (trace, page_span, _) = parts(shown);
    assert_eq!(trace, CALLER_TRACE);
    assert!(page_span != CALLER_SPAN && page_span != valves_span, "the page's request has its own span");

    // A resumable Shiny session, traced from its socket's request, whose
    // browser drops its connection, comes back, then leaves the page.
    let session_trace = "5bf92f3577b34da6a3ce929d0e0e4737";
    let addr = valve.url.trim_start_matches("http://").to_string();
    let open = |protocols: &'static str, traceparent: Option<String>| {
        let addr = addr.clone();
        async move {
            let mut req = format!("ws://{addr}/shiny/websocket/").into_client_request().unwrap();
            req.headers_mut().insert("sec-websocket-protocol", protocols.parse().unwrap());
            if let Some(tp) = traceparent {
                req.headers_mut().insert("traceparent", tp.parse().unwrap());
            }
            let stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
            let (ws, _) = tokio_tungstenite::client_async(req, stream).await.expect("valve answers the upgrade");
            ws
        }
    };
    let mut ws = open("valve-shiny.1", Some(format!("00-{session_trace}-{CALLER_SPAN}-01"))).await;
    let started = next_text(&mut ws).await;
    let words: Vec<&str> = started.split(' ').collect();
    assert_eq!(words[0], "s", "valve starts the session: {started}");
    drop(ws);
    let mut ws = open("valve-shiny.1, valve-resume", None).await;
    ws.send(Message::text(format!("h {} {} 0", words[1], words[2]))).await.unwrap();
    let welcome = next_text(&mut ws).await;
    assert!(welcome.starts_with("w "), "the browser is welcomed back: {welcome}");
    ws.send(Message::Close(Some(CloseFrame { code: CloseCode::Away, reason: "".into() }))).await.unwrap();

    // Jaeger holds valve's spans: the traced request's, a child of the caller's span ...
    let t = jaeger.trace(CALLER_TRACE, 2).await;
    let process = t["processes"].as_object().unwrap().values().next().unwrap();
    assert_eq!(process["serviceName"], "valve-it", "OTEL_SERVICE_NAME names valve's spans");
    let request = t["spans"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["spanID"] == valves_span.as_str())
        .unwrap_or_else(|| panic!("the span R was given ({valves_span}) is in Jaeger: {t}"));
    assert_eq!(request["operationName"], "GET /api/*");
    assert_eq!(parent(request).as_deref(), Some(CALLER_SPAN));
    assert_eq!(tag(request, "span.kind"), "server");
    assert_eq!(tag(request, "http.request.method"), "GET");
    assert_eq!(tag(request, "url.path"), "/api/trace");
    assert_eq!(tag(request, "http.route"), "/api/*");
    assert_eq!(tag(request, "http.response.status_code"), 200);
    assert_eq!(tag(request, "valve.app"), "api");
    assert_eq!(tag(request, "valve.worker.id").to_string(), r["worker"].as_str().unwrap(), "the worker R ran in");
    let wait = tag(request, "valve.queue.wait_ms").as_f64().unwrap();
    let in_r = tag(request, "valve.worker.time_ms").as_f64().unwrap();
    let whole = request["duration"].as_f64().unwrap() / 1e3;
    assert!(wait > 0.0, "it waited behind the slow request: {wait} ms");
    assert!(in_r >= 200.0, "R slept 0.2 s in it: {in_r} ms");
    assert!(wait + in_r <= whole + 1.0, "queue wait {wait} + time in R {in_r} within the span's {whole} ms");
    // ... the Shiny page's, under the same caller ...
    let page = t["spans"].as_array().unwrap().iter().find(|s| s["spanID"] == page_span.as_str()).unwrap();
    assert_eq!((page["operationName"].as_str(), parent(page).as_deref()), (Some("GET /shiny/*"), Some(CALLER_SPAN)));
    assert_eq!(tag(page, "valve.app"), "shiny");
    // ... the requests without a valid parent, each the root of its own trace ...
    for (trace, span, worker) in &fresh {
        let t = jaeger.trace(trace, 1).await;
        let root = &t["spans"][0];
        assert_eq!((root["spanID"].as_str(), parent(root)), (Some(span.as_str()), None));
        assert_eq!(tag(root, "valve.worker.id").to_string(), *worker);
    }
    // ... and the Shiny session, a child of its socket's request, across the reconnect.
    let t = jaeger.trace(session_trace, 2).await;
    let upgrade = span(&t, "GET /shiny/*");
    assert_eq!(tag(upgrade, "http.response.status_code"), 101);
    let session = span(&t, "shiny session");
    assert_eq!(parent(session), upgrade["spanID"].as_str().map(str::to_string));
    assert_eq!(tag(session, "valve.shiny.resumable"), true);
    assert_eq!(tag(session, "valve.shiny.resumes"), 1);
    assert_eq!(tag(session, "valve.shiny.end"), "left");
    assert_eq!(tag(session, "valve.worker.id"), tag(upgrade, "valve.worker.id"));
    let logs = session["logs"].as_array().unwrap();
    assert_eq!(logs.len(), 1, "one resume event: {session}");
    assert!(logs[0]["fields"].as_array().unwrap().iter().any(|f| f["value"] == "valve.shiny.resumed"));

    assert!(metric(&valve, "valve_trace_spans_exported_total").await >= 7.0);
    assert_eq!(metric(&valve, "valve_trace_spans_dropped_total{reason=\"export_failed\"}").await, 0.0);
    assert_eq!(metric(&valve, "valve_trace_spans_dropped_total{reason=\"queue_full\"}").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_the_collector_down_requests_are_answered_and_the_lost_spans_counted() {
    need_r_packages(&["plumber"]);
    let (_closed, port) = closed_port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let valve = Valve::start(&["-f", fixture("traced.R").to_str().unwrap(), "--otlp-endpoint", &endpoint]);
    let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    for _ in 0..20 {
        let r = get_json(valve.get("/trace"), vec![("traceparent", caller.clone())]).await;
        let (trace, span, _) = parts(r["traceparent"].as_str().unwrap());
        assert_eq!(trace, CALLER_TRACE);
        assert_ne!(span, CALLER_SPAN, "traces are on: R is given valve's span");
    }
    wait_for_metric(&valve, "valve_trace_spans_dropped_total{reason=\"export_failed\"}", 1.0).await;
    valve.wait_for_log("cannot export spans to the trace collector", Duration::from_secs(5));
    assert!(valve.log().contains(&format!("http://127.0.0.1:{port}/v1/traces")), "the warning names the endpoint");
    assert_eq!(metric(&valve, "valve_trace_spans_exported_total").await, 0.0);
    // Still answering while the exporter backs off.
    assert_eq!(client().get(valve.get("/echo")).send().await.unwrap().text().await.unwrap(), "ok");
}
