//! Parse helpers the flags share with the config file reader: R package
//! lists, publishing's settings, `memory_limit`, and valve's own account.

use std::path::Path;

use crate::config::error::{parse_size, ConfigError};
use crate::config::model::admin_addr;
use crate::config::publish::{self, Publishing, VersionRule};
use crate::config::users::{Account, AccountKind, Kernel};

/// `preload_packages`: R package names, comma-separated.
pub(in crate::config) fn package_list(value: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '.')
            && !name.ends_with('.');
        if !valid {
            return Err(format!(
                "{name:?} is not an R package name (letters, digits and dots, starting with a letter)"
            ));
        }
        out.push(name.to_string());
    }
    Ok(out)
}

/// Publishing's settings from their values, checked; the keys file is read.
pub(in crate::config) fn publishing(
    dir: &Path,
    keys_file: &Path,
    addr: Option<String>,
    keep: usize,
    versions: &str,
    max_size: u64,
    max_files: u64,
) -> Result<Option<Publishing>, ConfigError> {
    let bad = ConfigError::Published;
    if keep == 0 {
        return Err(bad("publish_keep must be at least 1 (the active version is always kept)".into()));
    }
    let versions = VersionRule::parse(versions)
        .ok_or_else(|| bad(format!("publish_versions {versions:?}: use \"exact\", \"at-least\" or \"any\"")))?;
    std::fs::create_dir_all(dir).map_err(|e| {
        bad(format!("publish_dir {}: cannot create it: {e} (valve's user must be able to write there)", dir.display()))
    })?;
    let dir = std::fs::canonicalize(dir).map_err(|e| bad(format!("publish_dir {}: {e}", dir.display())))?;
    let keys = publish::read_keys(keys_file).map_err(bad)?;
    if keys.is_empty() {
        return Err(bad(format!(
            "publish_keys_file {} holds no key: add a line with `valve publish-key NAME`",
            keys_file.display()
        )));
    }
    Ok(Some(Publishing {
        dir,
        keys_file: keys_file.to_path_buf(),
        addr: addr.and_then(|a| admin_addr(&a)),
        keep,
        versions,
        max_size,
        max_files: max_files.max(1),
    }))
}

/// The account an app has until its own is settled: valve's.
pub(in crate::config) fn valves_own(kernel: &Kernel) -> Account {
    Account {
        uid: kernel.uid,
        gid: kernel.gid,
        groups: Vec::new(),
        name: kernel.uid.to_string(),
        home: None,
        kind: AccountKind::Valve,
    }
}

/// The least `memory_limit` valve accepts: R with plumber or Shiny loaded
/// takes ~75MB of data before an app loads anything.
pub(in crate::config) const MIN_MEMORY_LIMIT: u64 = 100 << 20;

/// `--memory-limit` / `memory_limit`: a size of at least 100MB.
pub(in crate::config) fn parse_memory_limit(flag: &'static str, value: &str) -> Result<u64, ConfigError> {
    let n = parse_size(flag, value)?;
    if n < MIN_MEMORY_LIMIT {
        return Err(ConfigError::OutOfRange {
            flag,
            value: value.to_string(),
            range: "100MB or more (R with plumber or Shiny loaded takes ~75MB before the app loads anything)",
        });
    }
    Ok(n)
}
