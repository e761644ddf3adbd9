//! The names of a config file's settings: which keys an `[[app]]` table and
//! the top level hold, the flag each stands for in messages, and the
//! nearest known key to a misspelt one.

/// Keys an `[[app]]` table may hold that also work at the top level, as defaults.
pub(super) const APP_KEYS: &[&str] = &[
    "n_min",
    "n_max",
    "max_age",
    "preload",
    "request_timeout",
    "queue_size",
    "queue_timeout",
    "max_body_size",
    "max_requests",
    "max_worker_memory",
    "max_sessions",
    "max_pending",
    "busy_threshold",
    "reconnect_window",
    "r_bin",
    "start_timeout",
    "env",
    "run_as",
    "memory_limit",
    "log_buffer",
];

/// Who may use an app: in an `[[app]]` table (static ones too) and at the
/// top level, as defaults.
pub(super) const ACCESS_KEYS: &[&str] = &["allow_users", "allow_groups"];

/// Keys only an `[[app]]` table holds.
pub(super) const APP_ONLY: &[&str] = &["name", "path", "file", "static", "hostname"];

/// Server settings (top level only).
pub(super) const SERVER_KEYS: &[&str] = &[
    "host",
    "port",
    "workers",
    "max_workers",
    "check_unused",
    "graceful_timeout",
    "header_timeout",
    "drain_delay",
    "admin_addr",
    "admin_on_main",
    "admin_token_file",
    "admin_users",
    "admin_groups",
    "no_access_log",
    "log_format",
    "worker_transport",
    "shiny_session_buffer",
    "shiny_buffer_total",
    "trusted_proxies",
    "user_header",
    "email_header",
    "groups_header",
    "sign_in_url",
    "auth_url",
    "auth_cache",
    "publish_dir",
    "publish_keys_file",
    "publish_addr",
    "publish_keep",
    "publish_versions",
    "publish_max_size",
    "publish_max_files",
    "state_dir",
    "uid_range",
    "isolation",
    "warm_parent",
    "preload_packages",
    "usage_log",
    "usage_anonymize",
    "otlp_endpoint",
    "package_cache",
    "package_builds",
    "package_build_timeout",
    "repositories",
    "repositories_only",
    "site_library",
    "tls_cert",
    "tls_key",
    "tls_acme_domains",
    "tls_acme_contact",
    "tls_acme_directory",
    "tls_acme_ca",
    "tls_acme_dir",
    "http_port",
    "hsts",
    "admin_tls",
    "admin_tls_cert",
    "admin_tls_key",
];

/// The flag a key stands for, for messages about flag values.
pub(super) fn flag_name(key: &str) -> &'static str {
    match key {
        "max_age" => "--max-age",
        "request_timeout" => "--request-timeout",
        "queue_timeout" => "--queue-timeout",
        "start_timeout" => "--start-timeout",
        "graceful_timeout" => "--graceful-timeout",
        "header_timeout" => "--header-timeout",
        "drain_delay" => "--drain-delay",
        "check_unused" => "--check-unused",
        "max_body_size" => "--max-body-size",
        "max_worker_memory" => "--max-worker-memory",
        "reconnect_window" => "--shiny-reconnect-window",
        "shiny_session_buffer" => "--shiny-session-buffer",
        "shiny_buffer_total" => "--shiny-buffer-total",
        "auth_cache" => "--auth-cache",
        "publish_max_size" => "--publish-max-size",
        "memory_limit" => "--memory-limit",
        "log_buffer" => "--log-buffer",
        "package_build_timeout" => "--package-build-timeout",
        _ => "a setting",
    }
}

pub(super) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}
