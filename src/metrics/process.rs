//! valve's own `process_*` metrics, read from /proc/self.

use std::fmt::Write;

use super::family::header;

/// A metric with one unlabelled sample.
pub(super) fn single(out: &mut String, name: &str, kind: &str, help: &str, value: f64) {
    header(out, name, kind, help);
    let _ = writeln!(out, "{name} {value}");
}

/// The standard `process_*` metrics of valve itself, from /proc/self.
pub(super) fn process_metrics(out: &mut String) {
    let ticks = 100.0; // USER_HZ on Linux
    let page = rustix::param::page_size() as f64;
    if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
        let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
        let num = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        // Fields after the command: state is 0, so utime (14th of the line) is 11.
        single(out, "process_cpu_seconds_total", "counter", "CPU time valve used.", (num(11) + num(12)) / ticks);
        single(out, "process_virtual_memory_bytes", "gauge", "valve's virtual memory.", num(20));
        single(out, "process_resident_memory_bytes", "gauge", "valve's resident memory.", num(21) * page);
        if let Some(boot) = boot_time() {
            single(
                out,
                "process_start_time_seconds",
                "gauge",
                "When valve started (Unix time).",
                boot + num(19) / ticks,
            );
        }
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        single(out, "process_open_fds", "gauge", "File descriptors valve has open.", fds.count() as f64);
    }
    if let Some(max) = max_fds() {
        single(out, "process_max_fds", "gauge", "The most file descriptors valve may open.", max);
    }
}

fn boot_time() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines().find_map(|l| l.strip_prefix("btime "))?.trim().parse().ok()
}

fn max_fds() -> Option<f64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}
