//! Architecture invariants that are rules about source text, checked without
//! R or a build: which modules may start or signal processes, read flags and
//! `VALVE_*` variables, or do I/O and read clocks. Each test names the rule
//! of ARCHITECTURE.md it guards.

use std::path::{Path, PathBuf};

/// Every `.rs` file under src/, as (path relative to src/, text without test
/// code: files named tests.rs or fake.rs, and everything from a file's first
/// `#[cfg(test)]` on, which by this crate's habit closes a file).
fn sources() -> Vec<(String, String)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
        let mut entries: Vec<PathBuf> =
            std::fs::read_dir(dir).expect("src/ is readable").flatten().map(|e| e.path()).collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(root, &path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                if name == "tests.rs" || name == "fake.rs" {
                    continue;
                }
                let text = std::fs::read_to_string(&path).expect("a source file is readable");
                let code = text.split("#[cfg(test)]").next().unwrap_or_default();
                let code: String = code
                    .lines()
                    .map(|l| match l.find("//") {
                        Some(i) => &l[..i],
                        None => l,
                    })
                    .collect::<Vec<_>>()
                    .join("\n");
                let rel = path.strip_prefix(root).expect("under src/").to_string_lossy().into_owned();
                out.push((rel, code));
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    walk(&root, &root, &mut out);
    assert!(out.len() > 20, "src/ holds valve's sources: found {}", out.len());
    out
}

/// The places in `files` where any of `needles` occurs, as `file: needle`.
fn find(files: &[(String, String)], needles: &[&str], allowed: impl Fn(&str) -> bool) -> Vec<String> {
    let mut hits = Vec::new();
    for (file, code) in files {
        if allowed(file) {
            continue;
        }
        for needle in needles {
            if code.contains(needle) {
                hits.push(format!("{file}: {needle}"));
            }
        }
    }
    hits
}

#[test]
fn only_the_worker_module_starts_or_signals_processes() {
    let hits = find(
        &sources(),
        &[
            "Command::new",
            "process::Command",
            "kill_process",
            "pidfd_send_signal",
            "libc::kill",
            "process::kill(",
            "fork(",
        ],
        |file| file.starts_with("worker/"),
    );
    assert!(hits.is_empty(), "process creation or signals outside src/worker/ (ARCHITECTURE.md): {hits:#?}");
}

#[test]
fn only_main_decides_exit_codes() {
    let hits = find(&sources(), &["process::exit", "ExitCode"], |file| file == "main.rs");
    assert!(hits.is_empty(), "exit codes decided outside src/main.rs (ARCHITECTURE.md): {hits:#?}");
}

#[test]
fn only_config_reads_flags_and_valve_variables() {
    // main.rs reads VALVE_LOG_FORMAT (so even a flag error is logged in the
    // chosen format) and hands the raw command line to config; log.rs reads
    // NO_COLOR and VALVE_LOG (not a setting: tracing's filter).
    let hits = find(&sources(), &["clap::", "var(\"VALVE_", "var_os(\"VALVE_", "Args::parse"], |file| {
        file.starts_with("config/") || file == "main.rs" || file == "log.rs"
    });
    assert!(hits.is_empty(), "flags or VALVE_* settings read outside src/config/ (ARCHITECTURE.md): {hits:#?}");
    // OpenTelemetry's variables (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME...)
    // are settings too: config::otel reads them; nothing else names one.
    let otel = find(&sources(), &["\"OTEL_", "var(\"OTEL", "var_os(\"OTEL"], |file| file.starts_with("config/"));
    assert!(otel.is_empty(), "OTEL_* variables read outside src/config/ (ARCHITECTURE.md): {otel:#?}");
    let config: Vec<_> = sources().into_iter().filter(|(f, _)| f.starts_with("config/")).collect();
    for name in ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SERVICE_NAME"] {
        assert!(
            !find(&config, &[&format!("\"{name}\"")], |_| false).is_empty(),
            "config reads {name}, as ARCHITECTURE.md says"
        );
    }
}

#[test]
fn the_pool_the_budget_and_the_verdict_do_no_io_and_read_no_clock() {
    let pure = |file: &str| file.starts_with("app/pool/") || file == "app/budget.rs" || file == "app/verdict.rs";
    let files: Vec<_> = sources().into_iter().filter(|(f, _)| pure(f)).collect();
    assert!(
        files.len() >= 7,
        "the pure rooms are where ARCHITECTURE.md says: {:?}",
        files.iter().map(|f| &f.0).collect::<Vec<_>>()
    );
    let hits = find(
        &files,
        &[
            "Instant::now",
            "SystemTime",
            "tokio::",
            ".await",
            "async ",
            "std::fs",
            "std::net",
            "std::process",
            "Mutex",
            "tracing::",
        ],
        |_| false,
    );
    assert!(hits.is_empty(), "I/O, clocks, locks or logging in the pure decisions (ARCHITECTURE.md): {hits:#?}");
}

#[test]
fn the_supervisor_reads_only_tokios_clock() {
    let files: Vec<_> =
        sources().into_iter().filter(|(f, _)| f.starts_with("app/supervisor/") || f == "worker/watch.rs").collect();
    assert!(
        files.len() >= 8,
        "the supervisor's rooms and the watcher: {:?}",
        files.iter().map(|f| &f.0).collect::<Vec<_>>()
    );
    let mut hits = find(&files, &["SystemTime", "std::thread::sleep", "std::time::Instant::now"], |_| false);
    for (file, code) in &files {
        // `Instant::now()` is tokio's when written so, or when the file takes `Instant` from tokio.
        let bare = code.matches("Instant::now()").count() - code.matches("tokio::time::Instant::now()").count();
        if bare > 0 && !code.contains("use tokio::time::Instant") {
            hits.push(format!("{file}: Instant::now() from std"));
        }
    }
    assert!(
        hits.is_empty(),
        "the supervisor and the watcher time everything on tokio's clock, so paused-clock tests reach every timer: {hits:#?}"
    );
}
