//! Certificates from a real ACME authority: Pebble (Let's Encrypt's test
//! server) issues valve a certificate over HTTP-01 on valve's plain-HTTP
//! port, valve renews it before it expires, and an authority that has gone
//! leaves the old certificate serving, said in the log, status and metrics.

use std::process::Command;
use std::time::Duration;

use crate::harness::{free_port, need_browser, wait_until, Valve};
use crate::https::{curl, served, serves_every_kind_over_https};
use crate::pebble::Pebble;

#[test]
fn pebble_issues_valve_a_certificate_valve_renews_it_and_a_failing_authority_leaves_the_old_one_serving() {
    need_browser();
    let http_port = free_port();
    let mut pebble = Pebble::start(http_port, free_port(), 30);
    let dir = tempfile::tempdir().unwrap();
    let acme_dir = dir.path().join("acme");
    let config = crate::https::three_apps_with(
        dir.path(),
        &format!(
            "worker_transport = \"httpuv\"\ntls_acme_domains = [\"localhost\"]\ntls_acme_contact = \"ops@example.org\"\ntls_acme_directory = {:?}\ntls_acme_ca = {:?}\ntls_acme_dir = {:?}\nhttp_port = {http_port}\n",
            pebble.directory(),
            pebble.ca(),
            acme_dir,
        ),
    );
    let valve = Valve::start(&["--config", config.to_str().unwrap()]);
    let port: u16 = valve.url.rsplit(':').next().unwrap().parse().unwrap();
    let root = dir.path().join("root.pem");
    std::fs::write(&root, pebble.root_pem()).unwrap();
    let base = format!("https://localhost:{port}");
    // The certificate chains to Pebble's root: curl checks it, for every kind of app.
    serves_every_kind_over_https(&valve, &base, &root);
    assert!(valve.log().contains("TLS certificate issued by the ACME authority"), "{}", valve.log());
    assert!(acme_dir.join("certificate.pem").is_file() && acme_dir.join("account.json").is_file());
    let status = valve.status();
    assert_eq!(status["tls"]["main"]["source"], "acme", "{status}");
    assert_eq!(status["tls"]["main"]["names"], serde_json::json!(["localhost"]));
    // The plain port redirects what is not a check.
    let (c, _, head) = curl(&[&format!("http://localhost:{http_port}/api/pid")]);
    assert_eq!(c, 308, "{head}");
    // Renewed with a third of its 30 s left, and served to the next connection.
    let first = served(port, "-serial");
    valve.wait_for_log("TLS certificate renewed by the ACME authority", Duration::from_secs(40));
    wait_until("the renewed certificate served", Duration::from_secs(30), || served(port, "-serial") != first);
    let renewed = served(port, "-serial");
    let (c, _, h) = curl(&["--cacert", root.to_str().unwrap(), &format!("{base}/api/pid")]);
    assert_eq!(c, 200, "the renewed certificate checks out: {h}");
    // The authority goes away: the next renewal fails, the renewed certificate serves on.
    pebble.stop();
    valve.wait_for_log("TLS certificate not renewed: the current one serves on", Duration::from_secs(40));
    assert_eq!(served(port, "-serial"), renewed);
    let (c, _, h) = curl(&["--cacert", root.to_str().unwrap(), &format!("{base}/api/pid")]);
    assert_eq!(c, 200, "{h}");
    let status = valve.status();
    assert!(status["tls"]["main"]["failing"].is_string(), "{status}");
    let metrics = String::from_utf8(
        Command::new("curl")
            .args(["-s", "-H", &valve.bearer(), &valve.admin("/__valve__/metrics")])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert!(metrics.contains("valve_tls_certificate_renewal_failing{listener=\"main\"} 1"), "{metrics}");
    assert!(metrics.contains("valve_tls_certificate_days_left{listener=\"main\"} 0.0"), "{metrics}");
}
