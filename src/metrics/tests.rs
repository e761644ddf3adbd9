//! The registry's text and the dashboard's history, from known traffic.

use super::*;

#[test]
fn saturation_counts_a_worker_waiting_on_promises_by_its_pending_share() {
    let g = Gauges { busy: 1, waiting: 2, pending: 3, waiting_load: 0.75, queued: 1, n_max: 4, ..Gauges::default() };
    assert_eq!(g.saturation(), (1.0 + 0.75 + 1.0) / 4.0);
    let r = Registry::default();
    r.app("api");
    let mut gauges = BTreeMap::new();
    gauges.insert("api".to_string(), g);
    let text = r.render(&gauges, 1, 4);
    assert!(text.contains("valve_pending_requests{app=\"api\"} 3"), "{text}");
    assert!(text.contains("valve_workers{app=\"api\",state=\"waiting\"} 2"));
    assert!(text.contains("valve_saturation{app=\"api\"} 0.6875"));
    r.app("api").worker_pending(7, 2);
    let text = r.render(&gauges, 1, 4);
    assert!(text.contains("valve_worker_pending_requests{app=\"api\",worker=\"7\"} 2"), "{text}");
}

#[test]
fn histogram_buckets_are_cumulative_and_labelled_by_app() {
    let r = Registry::default();
    let m = r.app("api");
    m.request(&Method::GET, 200, Duration::from_micros(800));
    m.request(&Method::GET, 200, Duration::from_millis(30));
    m.request(&Method::POST, 502, Duration::from_secs(2));
    let mut gauges = BTreeMap::new();
    gauges.insert("api".to_string(), Gauges { busy: 1, queued: 2, n_max: 4, ..Gauges::default() });
    let text = r.render(&gauges, 1, 4);
    assert!(text.contains("valve_requests_total{app=\"api\",method=\"GET\",status=\"200\"} 2"));
    assert!(text.contains("valve_requests_total{app=\"api\",method=\"POST\",status=\"502\"} 1"));
    assert!(text.contains("valve_request_duration_seconds_bucket{app=\"api\",le=\"0.001\"} 1"));
    assert!(text.contains("valve_request_duration_seconds_bucket{app=\"api\",le=\"0.05\"} 2"));
    assert!(text.contains("valve_request_duration_seconds_bucket{app=\"api\",le=\"+Inf\"} 3"));
    assert!(text.contains("valve_saturation{app=\"api\"} 0.7500"));
    assert!(text.contains("valve_build_info{version=\""));
    assert!(text.contains("process_resident_memory_bytes "));
}

#[test]
fn no_gauge_is_named_after_a_counters_stem() {
    let r = Registry::default();
    r.app("a");
    let text = r.render(&BTreeMap::new(), 0, 1);
    let families: Vec<&str> =
        text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split(' ').next()).collect();
    for f in &families {
        if let Some(stem) = f.strip_suffix("_total") {
            assert!(!families.contains(&stem), "{stem} collides with {f} under OpenMetrics");
        }
    }
}

#[test]
fn history_turns_counters_into_rates_and_quantiles() {
    let m = AppMetrics::new("api");
    for _ in 0..99 {
        m.request(&Method::GET, 200, Duration::from_millis(2));
    }
    m.request(&Method::GET, 200, Duration::from_millis(400));
    m.tick(&Gauges { busy: 1, idle: 2, ..Gauges::default() });
    m.tick(&Gauges { idle: 3, ..Gauges::default() });
    let h = m.history();
    assert_eq!(h[0].requests, 100);
    assert_eq!(h[0].p50, Some(0.0025));
    assert_eq!(h[0].p99, Some(0.0025));
    assert_eq!(h[1].requests, 0);
    assert_eq!(h[1].p50, None);
}

#[test]
fn resumable_shiny_sessions_are_counted_by_app_and_why_they_ended() {
    let r = Registry::default();
    let m = r.app("explorer");
    m.reconnects.dropped();
    m.reconnects.resumed(Duration::from_millis(1500));
    m.reconnects.restarted();
    m.reconnects.refused();
    m.reconnects.buffered(4096);
    m.reconnects.buffered(-1024);
    m.reconnects.ended(SessionEnd::Window, Some(Duration::from_secs(120)));
    m.reconnects.ended(SessionEnd::Left, None);
    let text = r.render(&BTreeMap::new(), 1, 4);
    for line in [
        "valve_shiny_connections_dropped_total{app=\"explorer\"} 1",
        "valve_shiny_sessions_resumed_total{app=\"explorer\"} 1",
        "valve_shiny_sessions_restarted_total{app=\"explorer\"} 1",
        "valve_shiny_resumes_refused_total{app=\"explorer\"} 1",
        "valve_shiny_buffer_overflows_total{app=\"explorer\"} 0",
        "valve_shiny_sessions_ended_total{app=\"explorer\",reason=\"window\"} 1",
        "valve_shiny_sessions_ended_total{app=\"explorer\",reason=\"left\"} 1",
        "valve_shiny_sessions_ended_total{app=\"explorer\",reason=\"worker\"} 0",
        "valve_shiny_buffered_bytes{app=\"explorer\"} 3072",
        "valve_shiny_disconnected_seconds_bucket{app=\"explorer\",le=\"2.5\"} 1",
        "valve_shiny_disconnected_seconds_count{app=\"explorer\"} 2",
    ] {
        assert!(text.contains(line), "{line} in:\n{text}");
    }
    let parsed = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
    assert!(parsed.samples.iter().any(|s| s.metric == "valve_shiny_sessions_resumed_total"));
}
