//! What `--check` prints of a valid configuration: one summary line and a
//! table with a row per app, readable with two apps or two hundred. Long
//! names, paths and users are shortened in the middle (both ends tell apps
//! apart), so that a row fits a terminal; a site of many apps is summed up by
//! kind below the table rather than listed on one line.

use std::collections::BTreeMap;

use super::Config;

/// The widest a shortened column (app, path, user) gets, in characters.
pub const CELL_MAX: usize = 30;

/// Apps the summary line names one by one; past this it only counts them.
const SUMMARY_APPS: usize = 8;

/// `text` in at most `max` characters: whole if it fits, else its start and
/// end around an ellipsis.
pub fn shorten(text: &str, max: usize) -> String {
    let n = text.chars().count();
    if n <= max || max < 3 {
        return text.to_string();
    }
    let tail = (max - 1) / 2;
    let head = max - 1 - tail;
    let start: String = text.chars().take(head).collect();
    let end: String = text.chars().skip(n - tail).collect();
    format!("{start}…{end}")
}

/// One line on what a valid configuration serves, with the kind of each app
/// as discovery found it (`plumber-dir`, `shiny`, `shiny-rmd`...), when
/// there are few; many are only counted (the table lists them).
pub fn summary(config: &Config) -> String {
    let (n, max) = (config.apps.len(), config.server.max_workers);
    if n > SUMMARY_APPS {
        return format!("{n} app(s), at most {max} R workers (each in the table below)");
    }
    let apps: Vec<String> = config
        .apps
        .iter()
        .map(|a| {
            let workers = if a.is_static() { "no R".to_string() } else { format!("{}-{} workers", a.n_min, a.n_max) };
            format!(
                "{} at {}{} ({}, {workers})",
                a.name,
                a.hostname.as_deref().unwrap_or(""),
                a.prefix,
                a.source.kind()
            )
        })
        .collect();
    format!("{n} app(s), at most {max} R workers: {}", apps.join("; "))
}

/// The table: one row per app, with whom its R runs as; for more than one
/// app, a last line counting them by kind.
pub fn table(config: &Config) -> String {
    let mut rows: Vec<[String; 6]> =
        vec![["APP", "PATH", "KIND", "WORKERS", "RUNS AS", "MEMORY LIMIT"].map(String::from)];
    let mut shortened = false;
    let mut cut = |text: String| {
        let short = shorten(&text, CELL_MAX);
        shortened |= short != text;
        short
    };
    for a in &config.apps {
        let r = !a.is_static();
        rows.push([
            cut(a.name.clone()),
            cut(format!("{}{}", a.hostname.as_deref().unwrap_or(""), a.prefix)),
            a.source.kind().to_string(),
            if r { format!("{}-{}", a.n_min, a.n_max) } else { "no R".into() },
            if r { format!("{} (uid {})", cut(a.account.name.clone()), a.account.uid) } else { "-".into() },
            a.memory_limit.map(|b| format!("{}MB", b >> 20)).unwrap_or_else(|| "-".into()),
        ]);
    }
    let widths: Vec<usize> = (0..6).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    let mut out = format!("isolation: {}\n", config.server.isolation.label());
    if let super::Isolation::Landlock(abi) = config.server.isolation {
        out.push_str(&format!("  {}\n", super::LandlockCoverage::of(abi).describe()));
    }
    for row in rows {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out.push_str("  ");
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    if config.apps.len() > 1 {
        let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
        for a in &config.apps {
            *kinds.entry(a.source.kind()).or_default() += 1;
        }
        let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
        let at_start: usize = config.apps.iter().map(|a| a.n_min).sum();
        out.push_str(&format!(
            "  {} apps: {}; {at_start} R workers at start, at most {} at once\n",
            config.apps.len(),
            kinds.join(", "),
            config.server.max_workers
        ));
    }
    if shortened {
        out.push_str(&format!(
            "  (names past {CELL_MAX} characters are shortened in the middle; /__valve__/apps lists them whole)\n"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_keeps_both_ends_within_the_width() {
        assert_eq!(shorten("api", 30), "api");
        let long = "a-very-long-application-name-for-the-quarterly-sales-dashboard-2024";
        let short = shorten(long, 30);
        assert_eq!(short.chars().count(), 30);
        assert!(short.starts_with("a-very-long-ap") && short.ends_with("dashboard-2024"), "{short}");
        assert!(short.contains('…'));
        assert_eq!(shorten("ééééééééé", 5), "éé…éé", "characters, not bytes");
    }
}
