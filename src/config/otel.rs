//! Traces: where valve sends its spans (an OTLP/HTTP collector) and the name
//! it gives itself there, from `--otlp-endpoint` (`VALVE_OTLP_ENDPOINT`, the
//! `otlp_endpoint` key) or OpenTelemetry's own variables
//! (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `OTEL_EXPORTER_OTLP_ENDPOINT`,
//! `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_SDK_DISABLED`,
//! `OTEL_EXPORTER_OTLP_PROTOCOL`), read here and nowhere else.

/// Where and as what valve exports its spans.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Otlp {
    /// The URL spans are POSTed to, as valve resolved it (for messages and logs).
    pub url: String,
    /// What to connect to.
    pub host: String,
    pub port: u16,
    /// What to name in `Host`.
    pub authority: String,
    /// The path and query POSTed to, such as `/v1/traces`.
    pub path: String,
    /// The `service.name` of valve's spans (`OTEL_SERVICE_NAME`; by default `valve`).
    pub service: String,
    /// Further resource attributes (`OTEL_RESOURCE_ATTRIBUTES`), `service.name` left out.
    pub resource: Vec<(String, String)>,
}

/// The path OTLP/HTTP takes traces at, under a collector's base URL.
const TRACES_PATH: &str = "/v1/traces";

/// The form an endpoint is written in, for messages.
const FORM: &str = "an http:// URL such as \"http://127.0.0.1:4318\" (a collector's OTLP/HTTP port)";

/// What valve's spans are named when nothing names them.
const DEFAULT_SERVICE: &str = "valve";

/// Where the endpoint was given, for messages and for how its path is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Given {
    /// `--otlp-endpoint` or `VALVE_OTLP_ENDPOINT`.
    Flag,
    /// The config file's `otlp_endpoint`.
    Key,
}

impl Given {
    fn name(self) -> &'static str {
        match self {
            Given::Flag => "--otlp-endpoint",
            Given::Key => "otlp_endpoint",
        }
    }
}

/// The trace settings: valve's own setting (`given`) first, else
/// OpenTelemetry's variables as `env` reads them (`None`: unset). valve's
/// setting `off` (or empty) turns traces off whatever the variables say;
/// `OTEL_SDK_DISABLED=true` turns them off whatever valve's setting says.
/// `Err` is a message naming the setting, the value and what to try.
pub(super) fn otlp(given: Option<(Given, &str)>, env: impl Fn(&str) -> Option<String>) -> Result<Option<Otlp>, String> {
    let var = |name: &str| env(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    let (setting, url, path) = match given {
        Some((_, v)) if is_off(v) => return Ok(None),
        Some((g, v)) => (g.name(), v.trim().to_string(), Path::TracesIfBare),
        None => match (var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), var("OTEL_EXPORTER_OTLP_ENDPOINT")) {
            (Some(v), _) => ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", v, Path::AsGiven),
            (None, Some(v)) => ("OTEL_EXPORTER_OTLP_ENDPOINT", v, Path::Traces),
            (None, None) => return Ok(None),
        },
    };
    let protocol = var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"));
    if let Some(p) = protocol.filter(|p| p.eq_ignore_ascii_case("grpc")) {
        return Err(format!(
            "OTEL_EXPORTER_OTLP_PROTOCOL (or _TRACES_PROTOCOL) is {p:?}, but valve exports over OTLP/HTTP only: point {setting} at the collector's OTLP/HTTP port (usually 4318, not gRPC's 4317) and unset the variable or set it to \"http/json\""
        ));
    }
    let mut otlp = endpoint(&url, path).map_err(|why| format!("{setting} {url:?}: {why}"))?;
    let resource = match var("OTEL_RESOURCE_ATTRIBUTES") {
        None => Vec::new(),
        Some(v) => resource_attributes(&v).map_err(|why| {
            format!("OTEL_RESOURCE_ATTRIBUTES {v:?}: {why} (write key=value pairs separated by commas, values %-encoded, or unset it)")
        })?,
    };
    let named = resource.iter().find(|(k, _)| k == "service.name").map(|(_, v)| v.clone());
    otlp.service = var("OTEL_SERVICE_NAME").or(named).unwrap_or_else(|| DEFAULT_SERVICE.into());
    otlp.resource = resource.into_iter().filter(|(k, _)| k != "service.name").collect();
    Ok(Some(otlp))
}

fn is_off(value: &str) -> bool {
    matches!(value.trim(), "" | "off" | "none")
}

/// How an endpoint's path is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// valve's own setting: a bare collector address gets `/v1/traces`, a
    /// URL with a path is used as written.
    TracesIfBare,
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`: as written.
    AsGiven,
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`: a base URL, `/v1/traces` appended to its path.
    Traces,
}

/// An OTLP/HTTP endpoint: `http://host[:port][/path]`. Not https: valve has
/// no TLS client, so the collector runs beside valve (and forwards over TLS).
fn endpoint(value: &str, how: Path) -> Result<Otlp, String> {
    let v = value.trim();
    if v.len() >= 8 && v[..8].eq_ignore_ascii_case("https://") {
        return Err(format!("https is not supported (valve has no TLS client): run a collector beside valve (the OpenTelemetry Collector, Jaeger) and give {FORM}"));
    }
    let Some(rest) = v.get(7..).filter(|_| v[..7].eq_ignore_ascii_case("http://")) else {
        return Err(format!("not {FORM}"));
    };
    if v.bytes().any(|b| b.is_ascii_control() || b == b' ' || b == b'#') {
        return Err(format!("not {FORM}: no spaces, control characters or fragments"));
    }
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, given_path) = rest.split_at(split);
    if authority.is_empty() || authority.contains('@') {
        return Err(format!("not {FORM}: give a host (and port), without a user or password"));
    }
    let parsed: http::uri::Authority = authority.parse().map_err(|_| format!("not {FORM}: no host"))?;
    let bare = given_path.is_empty() || given_path == "/";
    let path = match how {
        Path::TracesIfBare if bare => TRACES_PATH.to_string(),
        Path::Traces => format!("{}{TRACES_PATH}", given_path.trim_end_matches('/')),
        _ if bare => "/".to_string(),
        _ if given_path.starts_with('?') => format!("/{given_path}"),
        _ => given_path.to_string(),
    };
    let host = parsed.host().trim_start_matches('[').trim_end_matches(']').to_string();
    let port = parsed.port_u16().unwrap_or(80);
    Ok(Otlp {
        url: format!("http://{authority}{path}"),
        host,
        port,
        authority: authority.to_string(),
        path,
        service: DEFAULT_SERVICE.into(),
        resource: Vec::new(),
    })
}

/// `OTEL_RESOURCE_ATTRIBUTES`: `key=value` pairs separated by commas, each
/// value percent-decoded (the OpenTelemetry resource SDK's rule).
fn resource_attributes(value: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for pair in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((k, v)) = pair.split_once('=') else { return Err(format!("{pair:?} has no `=`")) };
        let k = k.trim();
        if k.is_empty() {
            return Err(format!("{pair:?} has no key"));
        }
        let v = percent_decode(v.trim()).ok_or_else(|| format!("{pair:?} has a bad %-escape"))?;
        out.push((k.to_string(), v));
    }
    Ok(out)
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The process's own environment, for `otlp`.
pub(super) fn environment(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
    }

    fn resolved(given: Option<(Given, &str)>, vars: &[(&str, &str)]) -> Result<Option<Otlp>, String> {
        otlp(given, with(vars))
    }

    #[test]
    fn valves_setting_takes_a_collector_address_or_a_full_url_and_beats_the_variables() {
        let vars = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://elsewhere:4318")];
        let o = resolved(Some((Given::Flag, "http://127.0.0.1:4318")), &vars).unwrap().unwrap();
        assert_eq!((o.host.as_str(), o.port, o.path.as_str()), ("127.0.0.1", 4318, "/v1/traces"));
        assert_eq!(o.url, "http://127.0.0.1:4318/v1/traces");
        let o = resolved(Some((Given::Key, "http://c:9000/otlp/v1/traces")), &[]).unwrap().unwrap();
        assert_eq!((o.port, o.path.as_str(), o.authority.as_str()), (9000, "/otlp/v1/traces", "c:9000"));
        assert_eq!(resolved(Some((Given::Flag, "off")), &vars), Ok(None), "off beats the variables");
        assert_eq!(resolved(None, &[]), Ok(None), "nothing set: no traces");
    }

    #[test]
    fn opentelemetrys_variables_follow_the_exporter_specification() {
        let base = |v| resolved(None, &[("OTEL_EXPORTER_OTLP_ENDPOINT", v)]).unwrap().unwrap().path;
        assert_eq!(base("http://c:4318"), "/v1/traces");
        assert_eq!(base("http://c:4318/"), "/v1/traces");
        assert_eq!(base("http://c:4318/prefix/"), "/prefix/v1/traces");
        let vars =
            [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:1"), ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://b:2/x")];
        let o = resolved(None, &vars).unwrap().unwrap();
        assert_eq!((o.host.as_str(), o.path.as_str()), ("b", "/x"), "the traces endpoint is used as written");
        let o = resolved(None, &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://[::1]")]).unwrap().unwrap();
        assert_eq!((o.host.as_str(), o.port, o.path.as_str()), ("::1", 80, "/"));
        let off = [("OTEL_SDK_DISABLED", "TRUE"), ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:1")];
        assert_eq!(resolved(Some((Given::Flag, "http://a:1")), &off), Ok(None));
    }

    #[test]
    fn the_service_name_and_resource_come_from_the_variables() {
        let flag = Some((Given::Flag, "http://c:4318"));
        assert_eq!(resolved(flag, &[]).unwrap().unwrap().service, "valve");
        let vars = [("OTEL_RESOURCE_ATTRIBUTES", "service.name=shop, deployment.environment=prod%20eu,team=r")];
        let o = resolved(flag, &vars).unwrap().unwrap();
        assert_eq!(o.service, "shop");
        assert_eq!(
            o.resource,
            [("deployment.environment".to_string(), "prod eu".to_string()), ("team".into(), "r".into())]
        );
        let vars = [("OTEL_RESOURCE_ATTRIBUTES", "service.name=shop"), ("OTEL_SERVICE_NAME", "front")];
        assert_eq!(resolved(flag, &vars).unwrap().unwrap().service, "front", "OTEL_SERVICE_NAME wins");
        let e = resolved(flag, &[("OTEL_RESOURCE_ATTRIBUTES", "a=1,broken")]).unwrap_err();
        assert!(e.starts_with("OTEL_RESOURCE_ATTRIBUTES \"a=1,broken\": \"broken\" has no `=`"), "{e}");
    }

    #[test]
    fn bad_endpoints_are_refused_naming_the_setting_the_value_and_what_to_give() {
        for (given, bad) in [
            (Given::Flag, "https://collector:4318"),
            (Given::Flag, "collector:4318"),
            (Given::Key, "http://"),
            (Given::Key, "http://u:p@c/"),
            (Given::Flag, "http://c/a b"),
        ] {
            let e = resolved(Some((given, bad)), &[]).unwrap_err();
            assert!(e.starts_with(&format!("{} {bad:?}: ", given.name())), "{e}");
            assert!(e.contains("http://127.0.0.1:4318"), "{e}");
        }
        assert!(resolved(Some((Given::Flag, "https://c")), &[]).unwrap_err().contains("TLS"));
        let grpc = [("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")];
        let e = resolved(Some((Given::Flag, "http://c:4317")), &grpc).unwrap_err();
        assert!(e.contains("OTLP/HTTP") && e.contains("4318"), "{e}");
        let e = resolved(None, &[("OTEL_EXPORTER_OTLP_ENDPOINT", "grpc://c:4317")]).unwrap_err();
        assert!(e.starts_with("OTEL_EXPORTER_OTLP_ENDPOINT \"grpc://c:4317\": "), "{e}");
    }
}
