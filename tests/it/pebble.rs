//! Pebble, Let's Encrypt's test ACME server, for the TLS tests: started on
//! free loopback ports with a configuration written in a temporary folder,
//! issuing certificates valid for as few seconds as a test asks, so that a
//! test sees valve renew one. scripts/install-deps builds it
//! (tests/pebble/README.md says what was checked of it).
//!
//! Pebble validates HTTP-01 at `http://NAME:http_port/` and TLS-ALPN-01 at
//! `NAME:tls_port` (with NAME `localhost` or `127.0.0.1`, both of which it
//! issues for), so a test passes valve's own ports. Every order is
//! validated afresh (no authorization reuse), at once (no random sleeps).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::{fixture, free_port, go_tool, START_DEADLINE};

/// The Pebble binary scripts/install-deps builds (`VALVE_PEBBLE` overrides).
pub fn pebble_bin() -> PathBuf {
    go_tool("pebble", "github.com/letsencrypt/pebble/v2", "VALVE_PEBBLE")
}

/// A running Pebble, killed when dropped.
pub struct Pebble {
    child: Option<Child>,
    /// Its ACME API's port (HTTPS, under the certificate `ca()` trusts).
    port: u16,
    /// Its management API's port (HTTPS, the same certificate): the roots.
    management: u16,
    _dir: tempfile::TempDir,
}

impl Pebble {
    /// Starts Pebble, validating challenges at `http_port` (HTTP-01) and
    /// `tls_port` (TLS-ALPN-01) on the names ordered, and issuing
    /// certificates valid for `validity_secs`; returns once its directory
    /// answers.
    pub fn start(http_port: u16, tls_port: u16, validity_secs: u64) -> Pebble {
        let bin = pebble_bin();
        assert!(
            bin.is_file(),
            "this test needs Pebble at {}: run VALVE_WITH_BROWSER=1 scripts/install-deps (it builds it with Go), or set VALVE_PEBBLE",
            bin.display()
        );
        let (port, management) = (free_port(), free_port());
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("pebble.json");
        // One profile only: an order that names none gets a random one.
        let json = serde_json::json!({
            "pebble": {
                "listenAddress": format!("127.0.0.1:{port}"),
                "managementListenAddress": format!("127.0.0.1:{management}"),
                "certificate": fixture("pebble/cert.pem"),
                "privateKey": fixture("pebble/key.pem"),
                "httpPort": http_port,
                "tlsPort": tls_port,
                "keyAlgorithm": "ecdsa",
                "retryAfter": { "authz": 1, "order": 1 },
                "profiles": {
                    "default": { "description": "short-lived, for the TLS tests", "validityPeriod": validity_secs }
                }
            }
        });
        std::fs::write(&config, serde_json::to_vec_pretty(&json).unwrap()).unwrap();
        let mut child = Command::new(&bin)
            .arg("-config")
            .arg(&config)
            .env("PEBBLE_VA_NOSLEEP", "1")
            .env("PEBBLE_WFE_NONCEREJECT", "0")
            .env("PEBBLE_AUTHZREUSE", "0")
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("pebble starts");
        // Pebble logs to stdout (each request), its fatal errors to stderr.
        for out in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    eprintln!("[pebble] {line}");
                }
            });
        }
        let mut pebble = Pebble { child: Some(child), port, management, _dir: dir };
        let start = Instant::now();
        loop {
            if pebble.curl(&pebble.directory()).is_some() {
                return pebble;
            }
            if let Some(status) = pebble.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("Pebble exited at start ({status}; its log is above)");
            }
            assert!(
                start.elapsed() < START_DEADLINE,
                "Pebble's directory did not answer within {START_DEADLINE:?} (its log is above)"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The ACME directory URL (valve's `tls_acme_directory`).
    pub fn directory(&self) -> String {
        format!("https://127.0.0.1:{}/dir", self.port)
    }

    /// The PEM file of the CA that trusts Pebble's APIs (valve's `tls_acme_ca`).
    pub fn ca(&self) -> PathBuf {
        fixture("pebble/ca.pem")
    }

    /// The root the certificates Pebble issues chain to (the chain served is
    /// leaf + intermediate), made anew at each start: what a client that
    /// checks valve's certificate trusts.
    pub fn root_pem(&self) -> String {
        let url = format!("https://127.0.0.1:{}/roots/0", self.management);
        self.curl(&url).unwrap_or_else(|| panic!("Pebble's management API did not answer {url}"))
    }

    /// The body of a GET of `url` trusting `ca()`, if it succeeded.
    fn curl(&self, url: &str) -> Option<String> {
        let out = Command::new("curl")
            .args(["-sf", "--max-time", "10", "--cacert"])
            .arg(self.ca())
            .arg(url)
            .stdin(Stdio::null())
            .output()
            .expect("curl runs");
        out.status.success().then(|| String::from_utf8(out.stdout).expect("UTF-8"))
    }

    /// Kills Pebble now (a test of valve with its CA gone); dropping does too.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Pebble {
    fn drop(&mut self) {
        self.stop();
    }
}
