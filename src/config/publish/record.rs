//! What valve keeps of a published app in `publish_dir`: its record
//! (`<publish_dir>/<name>/app.json`: id, versions, the active one, who may
//! use it) beside its versions, each an unpacked bundle in `v<N>/`. The
//! config reads records on every load and reload; the publishing API writes
//! them (whole, through a rename, so a reader never sees half a record).

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The record's file name in an app's folder.
pub const RECORD: &str = "app.json";

/// A published app.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AppRecord {
    /// A number unique within this `publish_dir` (clients' application id).
    pub id: u64,
    /// A unique id (clients' content guid).
    pub guid: String,
    pub name: String,
    #[serde(default)]
    pub title: String,
    /// Unix seconds.
    pub created: u64,
    /// The key that created it (its name).
    pub created_by: String,
    /// The key that owns it (its name): it alone, and admin keys, may
    /// upload, deploy, roll back, change access and read its tasks. None
    /// (a record written before owners were recorded): admin keys only.
    #[serde(default)]
    pub owner: Option<String>,
    /// The version served; none before the first deployment.
    #[serde(default)]
    pub active: Option<u32>,
    /// Who may use it (`allow_users`, `allow_groups`); none: open.
    #[serde(default)]
    pub allow_users: Option<Vec<String>>,
    #[serde(default)]
    pub allow_groups: Option<Vec<String>>,
    /// Every version kept, oldest first.
    #[serde(default)]
    pub versions: Vec<VersionRecord>,
    /// The number the next upload gets.
    #[serde(default = "one")]
    pub next_version: u32,
    /// The record's format: a valve reads records of its format or older,
    /// and refuses one a newer valve wrote (valves sharing `publish_dir` at
    /// different versions).
    #[serde(default = "one")]
    pub format: u32,
}

/// The format of the records this valve writes.
pub const RECORD_FORMAT: u32 = 1;

fn one() -> u32 {
    1
}

/// One uploaded bundle, unpacked and checked.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VersionRecord {
    pub version: u32,
    /// Unix seconds.
    pub uploaded: u64,
    pub uploaded_by: String,
    /// The manifest's `metadata.appmode`.
    pub appmode: String,
    /// What valve found in it (`plumber-dir`, `shiny`, `static`...).
    pub kind: String,
    pub files: u64,
    pub bytes: u64,
    /// The manifest's packages: name and version.
    #[serde(default)]
    pub packages: Vec<(String, String)>,
    /// When it last became the active version, and by which key.
    #[serde(default)]
    pub activated: Option<u64>,
    #[serde(default)]
    pub activated_by: Option<String>,
}

impl AppRecord {
    pub fn version(&self, n: u32) -> Option<&VersionRecord> {
        self.versions.iter().find(|v| v.version == n)
    }

    pub fn version_mut(&mut self, n: u32) -> Option<&mut VersionRecord> {
        self.versions.iter_mut().find(|v| v.version == n)
    }

    /// The active version's record.
    pub fn current(&self) -> Option<&VersionRecord> {
        self.active.and_then(|n| self.version(n))
    }
}

/// The folder of app `name`.
pub fn app_dir(publish_dir: &Path, name: &str) -> PathBuf {
    publish_dir.join(name)
}

/// The folder of version `n` of the app in `app_dir`.
pub fn version_dir(app_dir: &Path, n: u32) -> PathBuf {
    app_dir.join(format!("v{n}"))
}

/// Reads the record in `app_dir`; `Ok(None)` when there is none (a folder
/// that is not an app's).
pub fn read_record(app_dir: &Path) -> Result<Option<AppRecord>, String> {
    let path = app_dir.join(RECORD);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let record: AppRecord = serde_json::from_str(&text).map_err(|e| {
        format!(
            "{} is not a record valve wrote ({e}): restore it, or remove its app's folder to unpublish the app",
            path.display()
        )
    })?;
    if record.format > RECORD_FORMAT {
        return Err(format!(
            "{} was written by a newer valve (record format {}; this valve reads up to {RECORD_FORMAT}): upgrade this valve, as every valve sharing publish_dir must run one version; nothing was changed",
            path.display(),
            record.format
        ));
    }
    Ok(Some(record))
}

/// Writes `record` in `app_dir`, whole: to a temporary file, then renamed.
pub fn write_record(app_dir: &Path, record: &AppRecord) -> std::io::Result<()> {
    let record = AppRecord { format: RECORD_FORMAT, ..record.clone() };
    let text = serde_json::to_string_pretty(&record).map_err(std::io::Error::other)?;
    let tmp = app_dir.join(format!(".{RECORD}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    // valve's alone (0600): no app's user reads another's record, or its own.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    std::io::Write::write_all(&mut file, text.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, app_dir.join(RECORD))
}

/// Every record in `publish_dir`, by name (hidden folders skipped).
pub fn read_records(publish_dir: &Path) -> Result<Vec<AppRecord>, String> {
    let entries = match std::fs::read_dir(publish_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("cannot read publish_dir {}: {e}", publish_dir.display())),
    };
    let mut dirs: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    let mut out = Vec::new();
    for dir in dirs {
        if let Some(record) = read_record(&dir)? {
            out.push(record);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_a_broken_one_is_named() {
        let d = tempfile::tempdir().unwrap();
        let dir = app_dir(d.path(), "sales");
        std::fs::create_dir(&dir).unwrap();
        assert_eq!(read_record(&dir).unwrap(), None);
        let record = AppRecord {
            id: 3,
            name: "sales".into(),
            active: Some(2),
            versions: vec![VersionRecord { version: 2, kind: "plumber-dir".into(), ..Default::default() }],
            next_version: 3,
            format: RECORD_FORMAT,
            ..Default::default()
        };
        write_record(&dir, &record).unwrap();
        assert_eq!(read_record(&dir).unwrap(), Some(record.clone()));
        assert_eq!(read_records(d.path()).unwrap(), vec![record.clone()]);
        assert_eq!(record.current().map(|v| v.kind.as_str()), Some("plumber-dir"));
        assert_eq!(version_dir(&dir, 2), dir.join("v2"));
        std::fs::write(dir.join(RECORD), "{").unwrap();
        let e = read_records(d.path()).unwrap_err();
        assert!(e.contains("app.json is not a record valve wrote"), "{e}");
        // One a newer valve wrote is refused, saying what to do; one of before formats were numbered reads.
        std::fs::write(
            dir.join(RECORD),
            r#"{"id": 3, "guid": "g", "name": "sales", "created": 0, "created_by": "k", "format": 2}"#,
        )
        .unwrap();
        let e = read_records(d.path()).unwrap_err();
        assert!(e.contains("written by a newer valve (record format 2") && e.contains("upgrade this valve"), "{e}");
        std::fs::write(dir.join(RECORD), r#"{"id": 3, "guid": "g", "name": "sales", "created": 0, "created_by": "k"}"#)
            .unwrap();
        assert_eq!(read_record(&dir).unwrap().map(|r| r.format), Some(1));
    }
}
