//! The package cache, shared by all apps (`package_cache`):
//!
//! ```text
//! src/NAME_VERSION-URLHASH.tar.gz      tarballs as fetched, by the URL's repository
//! built/R-VERSION-PLATFORM/NAME/VERSION-SHA/NAME   installed packages, by the tarball's content
//! libs/KEY/                            an app library: links into built/ (or R's own
//!                                      library), and .valve-library.json, what each is
//! runtime/R-VERSION-PLATFORM-HASH/     links to what valve's launcher needs
//! tmp/                                 builds and libraries on their way in
//! ```
//!
//! Every entry is made in `tmp/` and renamed into place whole: one that
//! exists is complete, and a restore killed halfway leaves only `tmp/`.

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Where a package in an app's library comes from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum From {
    /// R's own library or the server's site library held this exact version.
    System,
    /// Built before (for this app or another): taken from the cache.
    Cache,
    /// Built from source by this restore, in this many seconds.
    Built(f64),
}

/// One package of an app's library.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub name: String,
    pub version: String,
    pub from: From,
    /// The installed package the library's link points to.
    pub path: PathBuf,
}

impl Entry {
    /// What the deployment log says of it.
    pub fn said(&self) -> String {
        match &self.from {
            From::System => {
                format!("{} {}: from R's library ({}), not rebuilt", self.name, self.version, self.path.display())
            }
            From::Cache => format!("{} {}: installed from cache", self.name, self.version),
            From::Built(s) => format!("{} {}: built from source ({s:.1} s)", self.name, self.version),
        }
    }
}

/// What an app library holds (its `.valve-library.json`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The file that named the packages (`manifest.json`, `renv.lock`).
    pub file: String,
    pub r_version: String,
    pub packages: Vec<Entry>,
}

pub const SUMMARY: &str = ".valve-library.json";

/// The cache at its folder.
#[derive(Clone, Debug)]
pub struct Cache {
    pub root: PathBuf,
}

impl Cache {
    /// Opens the cache, making its folders (readable by every app's user:
    /// what is in it are packages, no secrets).
    pub fn open(root: &Path) -> io::Result<Cache> {
        use std::os::unix::fs::PermissionsExt;
        for sub in ["", "src", "built", "libs", "runtime", "tmp"] {
            let dir = root.join(sub);
            std::fs::create_dir_all(&dir)?;
            let mode = if sub == "tmp" { 0o711 } else { 0o755 };
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))?;
        }
        Ok(Cache { root: root.to_path_buf() })
    }

    pub fn src(&self) -> PathBuf {
        self.root.join("src")
    }

    pub fn tmp(&self) -> PathBuf {
        self.root.join("tmp")
    }

    pub fn libs(&self) -> PathBuf {
        self.root.join("libs")
    }

    pub fn runtime(&self) -> PathBuf {
        self.root.join("runtime")
    }

    /// Where the build of `name` `version` from a tarball with hash `sha`
    /// for the R `rkey` goes (the package itself is `NAME` in it).
    pub fn built(&self, rkey: &str, name: &str, version: &str, sha: &str) -> PathBuf {
        self.root.join("built").join(rkey).join(name).join(format!("{version}-{}", &sha[..sha.len().min(16)]))
    }

    /// A new unique folder name in `tmp/`.
    pub fn fresh(&self, what: &str) -> PathBuf {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(1);
        // Replicas sharing the cache may have the same pid (each is PID 1 of its container).
        static TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        let tag = TAG.get_or_init(|| {
            let mut b = [0u8; 6];
            let _ = rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty());
            b.iter().map(|x| format!("{x:02x}")).collect()
        });
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        self.tmp().join(format!("{what}-{}-{tag}-{n}", std::process::id()))
    }
}

/// Reads a complete app library's summary (`None`: not there or not whole).
pub fn summary(lib: &Path) -> Option<Summary> {
    let text = std::fs::read_to_string(lib.join(SUMMARY)).ok()?;
    serde_json::from_str(&text).ok()
}

/// Puts the folder `from` at `to` whole (its parent made first); if
/// another restore put one there meanwhile, that one stays and `from` goes.
pub fn put(from: &Path, to: &Path) -> io::Result<()> {
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::rename(from, to) {
        Ok(()) => Ok(()),
        Err(e) if to.exists() => {
            let _ = std::fs::remove_dir_all(from);
            tracing::debug!(error = %e, path = %to.display(), "another restore made it first");
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// The Version of the package installed at `dir` (its DESCRIPTION).
pub fn installed_version(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("DESCRIPTION")).ok()?;
    super::dcf::field(&super::dcf::parse(&text), "Version").map(str::to_string)
}

/// The SHA-256 of `bytes` in hex: the cache's keys.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    crate::mac::hex(&sha2::Sha256::digest(bytes))
}
