//! Publishing's settings as the configuration holds them: plain data,
//! below everything else of publishing (the server settings carry them).

use std::path::PathBuf;

/// How publishing is set up (`publish_dir` given).
#[derive(Clone, Debug, PartialEq)]
pub struct Publishing {
    /// Where published apps and their versions live.
    pub dir: PathBuf,
    /// Who may publish (read and checked with the configuration; the
    /// publishing API reads it again whenever it changes).
    pub keys_file: PathBuf,
    /// The publishing API on an address of its own, besides the admin listener.
    pub addr: Option<String>,
    /// Versions kept per app (the active one always).
    pub keep: usize,
    /// How a manifest's package versions must match what the app's R loads.
    pub versions: VersionRule,
    /// The largest bundle, compressed or unpacked, in bytes.
    pub max_size: u64,
    /// The most files (and folders) a bundle may hold.
    pub max_files: u64,
}

/// How a bundle's package versions must match the ones the app's R loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VersionRule {
    /// The same version.
    Exact,
    /// The same version or a later one.
    AtLeast,
    /// Installed at all.
    Any,
}

impl VersionRule {
    pub fn parse(value: &str) -> Option<VersionRule> {
        match value {
            "exact" => Some(VersionRule::Exact),
            "at-least" => Some(VersionRule::AtLeast),
            "any" => Some(VersionRule::Any),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            VersionRule::Exact => "exact",
            VersionRule::AtLeast => "at-least",
            VersionRule::Any => "any",
        }
    }

    /// Whether `installed` satisfies `wanted` (R's version numbers: parts
    /// split on `.` and `-`, compared as numbers).
    pub fn admits(self, wanted: &str, installed: &str) -> bool {
        let parts = |v: &str| -> Vec<u64> { v.split(['.', '-']).map(|p| p.trim().parse().unwrap_or(0)).collect() };
        let (w, i) = (parts(wanted), parts(installed));
        let len = w.len().max(i.len());
        let pad = |mut v: Vec<u64>| {
            v.resize(len, 0);
            v
        };
        let (w, i) = (pad(w), pad(i));
        match self {
            VersionRule::Exact => w == i,
            VersionRule::AtLeast => i >= w,
            VersionRule::Any => true,
        }
    }
}
