//! A batch of spans as an OTLP/HTTP request body in JSON
//! (`application/json`: the protobuf messages of
//! `opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest` in
//! the protobuf JSON mapping, with OTLP's exceptions: trace and span ids in
//! hex, enums as numbers). Pure: spans in, bytes out.

use serde::Serialize;

use super::{Event, Kind, Span, Value};

/// Who sent the spans: the resource's attributes, built once.
pub struct Resource(Vec<(String, String)>);

impl Resource {
    /// `service.name`, `service.version` and `service.instance.id` (a random
    /// id per valve process), then `extra` (`OTEL_RESOURCE_ATTRIBUTES`), which
    /// may replace the latter two.
    pub fn new(service: &str, instance: &str, extra: &[(String, String)]) -> Resource {
        let mut attrs = vec![
            ("service.name".to_string(), service.to_string()),
            ("service.version".to_string(), env!("CARGO_PKG_VERSION").to_string()),
            ("service.instance.id".to_string(), instance.to_string()),
        ];
        for (k, v) in extra {
            match attrs.iter_mut().find(|(key, _)| key == k) {
                Some((_, old)) => *old = v.clone(),
                None => attrs.push((k.clone(), v.clone())),
            }
        }
        Resource(attrs)
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Request<'a> {
    resource_spans: [ResourceSpans<'a>; 1],
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResourceSpans<'a> {
    resource: JsonResource<'a>,
    scope_spans: [ScopeSpans<'a>; 1],
}

#[derive(Serialize)]
struct JsonResource<'a> {
    attributes: Vec<KeyValue<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ScopeSpans<'a> {
    scope: Scope,
    spans: Vec<JsonSpan<'a>>,
}

#[derive(Serialize)]
struct Scope {
    name: &'static str,
    version: &'static str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonSpan<'a> {
    trace_id: String,
    span_id: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    parent_span_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    trace_state: Option<&'a str>,
    name: &'a str,
    kind: u8,
    start_time_unix_nano: String,
    end_time_unix_nano: String,
    attributes: Vec<KeyValue<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    events: Vec<JsonEvent<'a>>,
    status: Status<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonEvent<'a> {
    time_unix_nano: String,
    name: &'a str,
    attributes: Vec<KeyValue<'a>>,
}

#[derive(Serialize)]
struct Status<'a> {
    /// 0: unset, 2: error.
    code: u8,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<&'a str>,
}

#[derive(Serialize)]
struct KeyValue<'a> {
    key: &'a str,
    value: AnyValue<'a>,
}

/// Serialized as `{"stringValue": "…"}` and so on; 64-bit integers as
/// strings, as the protobuf JSON mapping writes them.
#[derive(Serialize)]
enum AnyValue<'a> {
    #[serde(rename = "stringValue")]
    Str(&'a str),
    #[serde(rename = "intValue")]
    Int(String),
    #[serde(rename = "doubleValue")]
    Float(f64),
    #[serde(rename = "boolValue")]
    Bool(bool),
}

fn value(v: &Value) -> AnyValue<'_> {
    match v {
        Value::Str(s) => AnyValue::Str(s),
        Value::Int(i) => AnyValue::Int(i.to_string()),
        // JSON has no NaN or infinity; valve's figures are finite anyway.
        Value::Float(f) if f.is_finite() => AnyValue::Float(*f),
        Value::Float(_) => AnyValue::Float(0.0),
        Value::Bool(b) => AnyValue::Bool(*b),
    }
}

fn attributes<'a>(list: &'a [(&'static str, Value)]) -> Vec<KeyValue<'a>> {
    list.iter().map(|(k, v)| KeyValue { key: k, value: value(v) }).collect()
}

fn event(e: &Event) -> JsonEvent<'_> {
    JsonEvent { time_unix_nano: e.at.to_string(), name: e.name, attributes: attributes(&e.attributes) }
}

fn span(s: &Span) -> JsonSpan<'_> {
    JsonSpan {
        trace_id: s.trace.hex(),
        span_id: s.span.hex(),
        parent_span_id: s.parent.map(|p| p.hex()).unwrap_or_default(),
        trace_state: s.tracestate.as_deref(),
        name: &s.name,
        kind: match s.kind {
            Kind::Internal => 1,
            Kind::Server => 2,
        },
        start_time_unix_nano: s.start.to_string(),
        end_time_unix_nano: s.end.to_string(),
        attributes: attributes(&s.attributes),
        events: s.events.iter().map(event).collect(),
        status: match &s.error {
            Some(message) => Status { code: 2, message: Some(message.as_str()).filter(|m| !m.is_empty()) },
            None => Status { code: 0, message: None },
        },
    }
}

/// The request body exporting `spans` from `resource`.
pub fn encode(resource: &Resource, spans: &[Span]) -> Vec<u8> {
    let request = Request {
        resource_spans: [ResourceSpans {
            resource: JsonResource {
                attributes: resource.0.iter().map(|(k, v)| KeyValue { key: k, value: AnyValue::Str(v) }).collect(),
            },
            scope_spans: [ScopeSpans {
                scope: Scope { name: "valve", version: env!("CARGO_PKG_VERSION") },
                spans: spans.iter().map(span).collect(),
            }],
        }],
    };
    serde_json::to_vec(&request).unwrap_or_default()
}

/// How many spans a collector's answer says it rejected (OTLP partial
/// success); 0 when it says nothing or is not JSON.
pub fn rejected(answer: &[u8]) -> u64 {
    serde_json::from_slice::<serde_json::Value>(answer)
        .ok()
        .and_then(|v| {
            let n = &v["partialSuccess"]["rejectedSpans"];
            n.as_u64().or_else(|| n.as_str()?.parse().ok())
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::super::{SpanId, TraceId};
    use super::*;
    use serde_json::json;

    #[test]
    fn a_batch_has_the_shape_of_an_otlp_export_request() {
        let resource = Resource::new("shop", "abc", &[("deployment.environment".into(), "prod".into())]);
        let spans = [
            Span {
                trace: TraceId([0x4b; 16]),
                span: SpanId([0x01; 8]),
                parent: Some(SpanId([0xf0; 8])),
                tracestate: Some("rojo=1".into()),
                name: "GET /sales/*".into(),
                kind: Kind::Server,
                start: 1_700_000_000_000_000_000,
                end: 1_700_000_000_250_000_000,
                attributes: vec![
                    ("http.request.method", Value::Str("GET".into())),
                    ("http.response.status_code", Value::Int(502)),
                    ("valve.queue.wait_ms", Value::Float(1.5)),
                    ("valve.shiny.resumable", Value::Bool(true)),
                ],
                events: vec![Event { name: "resumed", at: 1_700_000_000_100_000_000, attributes: vec![] }],
                error: Some("502".into()),
            },
            Span {
                trace: TraceId([0x4b; 16]),
                span: SpanId([0x02; 8]),
                parent: None,
                tracestate: None,
                name: "shiny session".into(),
                kind: Kind::Internal,
                start: 5,
                end: 6,
                attributes: vec![],
                events: vec![],
                error: None,
            },
        ];
        let got: serde_json::Value = serde_json::from_slice(&encode(&resource, &spans)).unwrap();
        let want = json!({"resourceSpans": [{
            "resource": {"attributes": [
                {"key": "service.name", "value": {"stringValue": "shop"}},
                {"key": "service.version", "value": {"stringValue": env!("CARGO_PKG_VERSION")}},
                {"key": "service.instance.id", "value": {"stringValue": "abc"}},
                {"key": "deployment.environment", "value": {"stringValue": "prod"}},
            ]},
            "scopeSpans": [{
                "scope": {"name": "valve", "version": env!("CARGO_PKG_VERSION")},
                "spans": [
                    {
                        "traceId": "4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b",
                        "spanId": "0101010101010101",
                        "parentSpanId": "f0f0f0f0f0f0f0f0",
                        "traceState": "rojo=1",
                        "name": "GET /sales/*",
                        "kind": 2,
                        "startTimeUnixNano": "1700000000000000000",
                        "endTimeUnixNano": "1700000000250000000",
                        "attributes": [
                            {"key": "http.request.method", "value": {"stringValue": "GET"}},
                            {"key": "http.response.status_code", "value": {"intValue": "502"}},
                            {"key": "valve.queue.wait_ms", "value": {"doubleValue": 1.5}},
                            {"key": "valve.shiny.resumable", "value": {"boolValue": true}},
                        ],
                        "events": [{"timeUnixNano": "1700000000100000000", "name": "resumed", "attributes": []}],
                        "status": {"code": 2, "message": "502"},
                    },
                    {
                        "traceId": "4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b",
                        "spanId": "0202020202020202",
                        "name": "shiny session",
                        "kind": 1,
                        "startTimeUnixNano": "5",
                        "endTimeUnixNano": "6",
                        "attributes": [],
                        "status": {"code": 0},
                    },
                ],
            }],
        }]});
        assert_eq!(got, want);
    }

    #[test]
    fn the_resource_takes_the_variables_attributes_over_valves_own() {
        let r = Resource::new("valve", "id", &[("service.version".into(), "9".into()), ("team".into(), "r".into())]);
        let keys: Vec<_> = r.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(keys, ["service.name=valve", "service.version=9", "service.instance.id=id", "team=r"]);
    }

    #[test]
    fn partial_success_counts_rejected_spans() {
        assert_eq!(rejected(br#"{"partialSuccess":{"rejectedSpans":"3","errorMessage":"x"}}"#), 3);
        assert_eq!(rejected(br#"{"partialSuccess":{"rejectedSpans":2}}"#), 2);
        assert_eq!(rejected(b"{}"), 0);
        assert_eq!(rejected(b""), 0);
        assert_eq!(rejected(b"\x0a\x00"), 0, "a protobuf answer says nothing valve reads");
    }
}
