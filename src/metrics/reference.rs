//! The manual's reference page of metrics, rendered from what valve itself
//! writes: every family's name, type and help, and the labels its samples
//! carry, read back from `Registry::render` over a registry that has seen one
//! of everything (and, in `admin::reference`, the published apps' metrics
//! served beside them). A metric added is on the page once
//! `VALVE_BLESS=1 cargo test --release --lib reference` has run; a test fails
//! until it has.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::time::Duration;

use http::Method;

use super::{ExitReason, Gauges, Registry, Rejection, SessionEnd};
use crate::worker::WorkerId;

/// Labels whose values are open-ended (names, numbers): listed without values.
const OPEN_LABELS: &[&str] = &["app", "worker", "le", "version", "method", "status", "user"];

/// One family as the Prometheus text declares it.
struct Family {
    kind: String,
    help: String,
    labels: BTreeMap<String, BTreeSet<String>>,
    /// Sample lines seen: a family with none would be on the page without its labels.
    samples: usize,
}

/// The page, from a registry that has counted one of each thing it counts.
pub fn metrics_page(text: &str) -> String {
    let families = families(text);
    // valve's own families first, then the standard process_* ones.
    let mut names: Vec<&String> = families.keys().collect();
    names.sort_by_key(|n| (!n.starts_with("valve_"), n.as_str()));
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Metrics\n\n\
         <!-- Generated from src/metrics/ by src/metrics/reference.rs: do not edit. {bless} -->\n\n\
         valve serves these at `/__valve__/metrics` on its admin listener, in\n\
         Prometheus' text format (see [Admin endpoints](admin.md)). Every family is\n\
         listed with its type, its labels and its help text as valve writes them;\n\
         for labels that take a fixed set of values, the values. Histograms have the\n\
         usual `_bucket`, `_sum` and `_count` series. An app's series keep their\n\
         counts across reloads. The page is generated from the registry's own\n\
         output (`{bless}` rewrites it).\n\n\
         ## At a glance\n\n\
         | metric | type |\n|---|---|",
        bless = crate::config::reference::BLESS
    );
    for name in &names {
        let _ = writeln!(out, "| [`{name}`](#{name}) | {} |", families[*name].kind);
    }
    let _ = writeln!(out, "\n## Every metric");
    for name in &names {
        let f = &families[*name];
        let labels: Vec<String> = f
            .labels
            .iter()
            .map(|(label, values)| {
                if OPEN_LABELS.contains(&label.as_str()) || values.is_empty() {
                    format!("`{label}`")
                } else {
                    let values: Vec<String> = values.iter().map(|v| format!("`{v}`")).collect();
                    format!("`{label}` ({})", values.join(", "))
                }
            })
            .collect();
        let labels = if labels.is_empty() { "no labels".to_string() } else { format!("labels {}", labels.join(", ")) };
        let _ = writeln!(out, "\n### `{name}`\n\n{}, {labels}.\n\n{}", f.kind, f.help.replace('<', "&lt;"));
    }
    out
}

/// The text a registry that has seen one of everything renders.
pub fn exercised_text() -> String {
    exercised().render(&gauges(), 1, 4)
}

/// A registry with one app that has seen a request, a session, a worker with
/// memory and promises, an exit, a rejection and a Shiny session that
/// dropped, came back and ended.
fn exercised() -> Registry {
    let r = Registry::default();
    let m = r.app("app");
    let worker: WorkerId = 1;
    m.request(&Method::GET, 200, Duration::from_millis(3));
    m.queue_wait.observe(Duration::from_millis(1));
    m.spawn_duration.observe(Duration::from_secs(1));
    m.started("warm parent", Duration::from_millis(50));
    m.session_opened();
    m.user_request(Some("alice"));
    drop(m.session(worker, Some("alice")));
    m.worker_memory(worker, 1 << 20);
    m.worker_pending(worker, 1);
    m.set_memory_limit(Some(1 << 30));
    // Families labelled by reason write every reason, counted or not.
    m.exit(ExitReason::Idle);
    m.reject(Rejection::QueueFull);
    m.reconnects.dropped();
    m.reconnects.resumed(Duration::from_secs(1));
    m.reconnects.restarted();
    m.reconnects.refused();
    m.reconnects.overflowed();
    m.reconnects.buffered(1);
    m.reconnects.ended(SessionEnd::Left, Some(Duration::from_secs(1)));
    // HTTPS: a certificate served on the main port.
    let key = rcgen::KeyPair::generate().expect("a key");
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .and_then(|p| p.self_signed(&key))
        .expect("a certificate");
    let pair =
        crate::tls::certs::from_pem(cert.pem().as_bytes(), key.serialize_pem().as_bytes(), "c".as_ref(), "k".as_ref())
            .expect("it loads");
    let origin = crate::tls::Origin::Files { cert: "c".into(), key: "k".into() };
    r.tls.set(vec![("main", crate::tls::Store::new(pair, origin))]);
    r
}

fn gauges() -> BTreeMap<String, Gauges> {
    let g = Gauges {
        starting: 1,
        idle: 1,
        busy: 1,
        waiting: 1,
        pending: 1,
        waiting_load: 0.5,
        draining: 1,
        queued: 1,
        n_max: 4,
        sessions: 1,
    };
    BTreeMap::from([("app".to_string(), g)])
}

/// Families by name, with the labels (and their values) their samples carry.
fn families(text: &str) -> BTreeMap<String, Family> {
    let mut out: BTreeMap<String, Family> = BTreeMap::new();
    let mut helps: BTreeMap<String, String> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            helps.insert(name.to_string(), help.to_string());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            let help = helps.get(name).cloned().unwrap_or_default();
            out.insert(name.to_string(), Family { kind: kind.to_string(), help, labels: BTreeMap::new(), samples: 0 });
        } else if !line.starts_with('#') && !line.is_empty() {
            let series = line.split(' ').next().unwrap_or("");
            let (metric, labels) = series.split_once('{').unwrap_or((series, ""));
            let family = [metric, metric.trim_end_matches("_bucket"), metric.trim_end_matches("_sum")]
                .into_iter()
                .chain([metric.trim_end_matches("_count")])
                .find(|f| out.contains_key(*f))
                .map(str::to_string);
            let Some(family) = family.and_then(|f| out.get_mut(&f)) else { continue };
            family.samples += 1;
            for pair in labels.trim_end_matches('}').split("\",").filter(|p| !p.is_empty()) {
                let (label, value) = pair.split_once('=').unwrap_or((pair, ""));
                if label == "le" {
                    continue;
                }
                family.labels.entry(label.to_string()).or_default().insert(value.trim_matches('"').to_string());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_has_a_sample_so_its_labels_are_on_the_page() {
        let text = exercised().render(&gauges(), 1, 4);
        let families = families(&text);
        assert!(families.len() > 30, "{text}");
        for (name, f) in &families {
            assert!(f.samples > 0, "{name} has no sample in the exercised registry: exercise it in reference.rs");
        }
    }
}
