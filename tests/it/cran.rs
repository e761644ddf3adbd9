//! A CRAN-like package repository built from real CRAN source tarballs, for
//! the tests of package restores: `repo()` lays one out in a fresh folder,
//! `CranRepo::serve` serves it over `http://127.0.0.1`, and packages made to
//! fail (C that does not compile, a `configure` script of the test's own) can
//! be added to it.
//!
//! The tarballs are CRAN's own, taken from Debian's source packages by
//! `VALVE_WITH_PACKAGES=1 scripts/install-deps` (its `CRAN_TARBALLS` list,
//! read here too) into `$VALVE_TEST_CACHE/cran`. What they give a test:
//! - zeallot 0.1.0: pure R, not installed by Debian ([`PURE_R`]);
//! - bitops 1.0-9, and 1.0-7 in the Archive: C code, two versions, neither
//!   installed by Debian ([`WITH_C`], [`TWO_VERSIONS`]);
//! - base64url 1.4, which imports backports (>= 1.1.0), with backports 1.5.0:
//!   both C code, neither installed by Debian ([`WITH_DEPENDENCIES`]);
//! - R6 2.6.1, and 2.5.1 in the Archive: pure R; 2.5.1 is the version
//!   Debian installs (r-cran-r6), so a restore wanting it can take the
//!   system's copy ([`INSTALLED_BY_DEBIAN`]).

use std::convert::Infallible;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

use crate::harness::{app_dir, need_program, test_cache};

/// A package with R code only.
pub const PURE_R: &str = "zeallot";
/// A package with C code to compile.
pub const WITH_C: &str = "bitops";
/// A package with a current version and an older one in the Archive.
pub const TWO_VERSIONS: &str = "bitops";
/// A package that imports another package of the repository (backports).
pub const WITH_DEPENDENCIES: &str = "base64url";
/// A package whose archived version (2.5.1) is the one Debian installs.
pub const INSTALLED_BY_DEBIAN: &str = "R6";

/// One package at one version in the repository.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Package {
    pub name: String,
    pub version: String,
}

impl Package {
    /// `name_version.tar.gz`, as CRAN names a source tarball.
    pub fn file(&self) -> String {
        format!("{}_{}.tar.gz", self.name, self.version)
    }
}

/// A CRAN-like repository in a temporary folder anyone may read (mode
/// 0755): current versions in `src/contrib/` with the index
/// `tools::write_PACKAGES` writes, older ones in
/// `src/contrib/Archive/<name>/`. Removed when dropped.
pub struct CranRepo {
    dir: tempfile::TempDir,
    current: Vec<Package>,
    archived: Vec<Package>,
}

/// The repository of every tarball in `CRAN_TARBALLS`: for each package the
/// highest version is current, the others are archived.
pub fn repo() -> CranRepo {
    let cache = test_cache().join("cran");
    let mut all: Vec<Package> = tarballs_listed()
        .into_iter()
        .map(|file| {
            let path = cache.join(&file);
            assert!(
                path.is_file(),
                "this test needs CRAN's {file} at {}: run VALVE_WITH_PACKAGES=1 scripts/install-deps",
                path.display()
            );
            let (name, version) = file.strip_suffix(".tar.gz").and_then(|s| s.split_once('_')).expect("name_version");
            Package { name: name.into(), version: version.into() }
        })
        .collect();
    all.sort_by(|a, b| a.name.cmp(&b.name).then_with(|| version_key(&b.version).cmp(&version_key(&a.version))));
    let mut repo = CranRepo { dir: app_dir(), current: Vec::new(), archived: Vec::new() };
    for pkg in all {
        let is_current = !repo.current.iter().any(|p| p.name == pkg.name);
        let bytes = std::fs::read(cache.join(pkg.file())).expect("read a cached tarball");
        if is_current {
            repo.current.push(pkg.clone());
        } else {
            repo.archived.push(pkg.clone());
        }
        repo.place(&pkg, &bytes);
    }
    repo.write_index();
    repo
}

/// The files `scripts/install-deps` fetches: its `CRAN_TARBALLS` list.
fn tarballs_listed() -> Vec<String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install-deps");
    let text = std::fs::read_to_string(script).expect("scripts/install-deps exists");
    let start = text.find("CRAN_TARBALLS=(").expect("install-deps has a CRAN_TARBALLS=( ... ) list");
    text[start..]
        .lines()
        .skip(1)
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .take_while(|l| *l != ")")
        .filter_map(|l| l.trim_matches('"').split_whitespace().nth(2).map(str::to_string))
        .collect()
}

/// Orders versions as R does for these: numbers between `.` and `-`.
fn version_key(version: &str) -> Vec<u64> {
    version.split(['.', '-']).map(|part| part.parse().unwrap_or(0)).collect()
}

impl CranRepo {
    /// The repository's root (the folder that holds `src/contrib`).
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `file:///...`: what `install.packages(repos = )` takes for a local repository.
    pub fn url(&self) -> String {
        format!("file://{}", self.path().display())
    }

    /// The packages `PACKAGES` lists, one version each.
    pub fn current(&self) -> &[Package] {
        &self.current
    }

    /// The older versions, under `src/contrib/Archive/`.
    pub fn archived(&self) -> &[Package] {
        &self.archived
    }

    /// The current version of `name`.
    pub fn current_version(&self, name: &str) -> &str {
        let found = self.current.iter().find(|p| p.name == name);
        &found.unwrap_or_else(|| panic!("the repository has no package {name}")).version
    }

    /// The archived versions of `name`, newest first.
    pub fn archived_versions(&self, name: &str) -> Vec<&str> {
        self.archived.iter().filter(|p| p.name == name).map(|p| p.version.as_str()).collect()
    }

    /// Where `name` at `version` is, relative to the root: `src/contrib/x_1.0.tar.gz`
    /// or `src/contrib/Archive/x/x_0.9.tar.gz`.
    pub fn relative(&self, name: &str, version: &str) -> String {
        let pkg = Package { name: name.into(), version: version.into() };
        if self.current.contains(&pkg) {
            format!("src/contrib/{}", pkg.file())
        } else if self.archived.contains(&pkg) {
            format!("src/contrib/Archive/{name}/{}", pkg.file())
        } else {
            panic!("the repository has no {name} {version}")
        }
    }

    /// Adds a package whose C code does not compile (a valid DESCRIPTION,
    /// `NeedsCompilation: yes`, a `src/broken.c` with a syntax error) as a
    /// current version. Its build fails with a compiler error.
    pub fn add_broken(&mut self, name: &str, version: &str) -> Package {
        let files = [
            ("DESCRIPTION", description(name, version, "A Package Whose C Code Does Not Compile", true), 0o644),
            ("NAMESPACE", format!("useDynLib({name})\nexport(broken)\n"), 0o644),
            ("R/broken.R", "broken <- function() .Call(\"broken\")\n".into(), 0o644),
            ("src/broken.c", "#include <R.h>\nthis is not C, so the build fails here;\n".into(), 0o644),
        ];
        self.add_made(name, version, &files)
    }

    /// Adds a pure-R package with `configure` (mode 0755) holding `script`,
    /// which `R CMD INSTALL` runs first in the unpacked package's folder.
    pub fn add_with_configure(&mut self, name: &str, version: &str, script: &str) -> Package {
        let files = [
            ("DESCRIPTION", description(name, version, "A Package With A Configure Script", false), 0o644),
            ("NAMESPACE", "export(configured)\n".into(), 0o644),
            ("R/configured.R", "configured <- function() TRUE\n".into(), 0o644),
            ("configure", script.to_string(), 0o755),
        ];
        self.add_made(name, version, &files)
    }

    fn add_made(&mut self, name: &str, version: &str, files: &[(&str, String, u32)]) -> Package {
        assert!(!self.current.iter().any(|p| p.name == name), "the repository already has a package {name}");
        let pkg = Package { name: name.into(), version: version.into() };
        self.current.push(pkg.clone());
        self.place(&pkg, &tarball(name, files));
        self.write_index();
        pkg
    }

    /// Writes a tarball where `current`/`archived` say it belongs, readable by all.
    fn place(&self, pkg: &Package, bytes: &[u8]) {
        let contrib = self.path().join("src/contrib");
        let archive = contrib.join("Archive");
        let folder = if self.current.contains(pkg) { contrib.clone() } else { archive.join(&pkg.name) };
        std::fs::create_dir_all(&folder).expect("create a repository folder");
        for dir in [self.path().join("src"), contrib, archive.clone(), archive.join(&pkg.name)] {
            if dir.is_dir() {
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod 0755");
            }
        }
        let path = folder.join(pkg.file());
        std::fs::write(&path, bytes).expect("write a tarball");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod 0644");
    }

    /// `PACKAGES`, `PACKAGES.gz` and `PACKAGES.rds` in `src/contrib`, by R itself.
    fn write_index(&self) {
        need_program("Rscript", "r-base-core");
        let contrib = self.path().join("src/contrib");
        let out = Command::new("Rscript")
            .args(["--vanilla", "-e", "tools::write_PACKAGES(commandArgs(TRUE)[1], type = 'source')"])
            .arg(&contrib)
            .output()
            .expect("Rscript runs");
        assert!(out.status.success(), "write_PACKAGES failed: {}", String::from_utf8_lossy(&out.stderr));
        for entry in std::fs::read_dir(&contrib).expect("src/contrib").flatten() {
            if entry.file_name().to_string_lossy().starts_with("PACKAGES") {
                std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o644)).expect("chmod 0644");
            }
        }
    }

    /// Serves the repository's files over `http://127.0.0.1:PORT` (404 for
    /// anything else) from a thread of its own, until the `Served` is dropped.
    pub fn serve(&self) -> Served {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        listener.set_nonblocking(true).expect("a non-blocking listener");
        let url = format!("http://{}", listener.local_addr().expect("the bound address"));
        let root = Arc::new(self.path().to_path_buf());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let seen = requests.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
                let accept = async {
                    loop {
                        let Ok((stream, _)) = listener.accept().await else { continue };
                        let (root, seen) = (root.clone(), seen.clone());
                        let service = service_fn(move |req| answer(root.clone(), seen.clone(), req));
                        tokio::spawn(
                            hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service),
                        );
                    }
                };
                tokio::select! {
                    _ = accept => {}
                    _ = stopped => {}
                }
            });
        });
        Served { url, requests, stop: Some(stop), thread: Some(thread) }
    }
}

/// The repository served over HTTP; stops serving when dropped.
pub struct Served {
    url: String,
    requests: Arc<Mutex<Vec<String>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Served {
    /// `http://127.0.0.1:PORT`, the repository's root (no trailing slash).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Every path asked for so far, with its status: `"200 /src/contrib/PACKAGES.gz"`.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A file under `root` for GET and HEAD; 404 for anything that is not a
/// file there (folders, `..`), 405 for other methods.
async fn answer(
    root: Arc<PathBuf>,
    seen: Arc<Mutex<Vec<String>>>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    let status_and_body = if req.method() != Method::GET && req.method() != Method::HEAD {
        (StatusCode::METHOD_NOT_ALLOWED, Bytes::new())
    } else if path.split('/').any(|part| part == ".." || part == ".") {
        (StatusCode::NOT_FOUND, Bytes::new())
    } else {
        let file = root.join(path.trim_start_matches('/'));
        match tokio::fs::read(&file).await {
            Ok(bytes) if file.is_file() => (StatusCode::OK, Bytes::from(bytes)),
            _ => (StatusCode::NOT_FOUND, Bytes::from_static(b"not found\n")),
        }
    };
    let (status, body) = status_and_body;
    seen.lock().unwrap().push(format!("{} {path}", status.as_u16()));
    let length = body.len();
    let body = if req.method() == Method::HEAD { Bytes::new() } else { body };
    let response =
        Response::builder().status(status).header("content-length", length).body(Full::new(body)).expect("a response");
    Ok(response)
}

/// A DESCRIPTION that `R CMD INSTALL` and `write_PACKAGES` accept.
fn description(name: &str, version: &str, title: &str, compiled: bool) -> String {
    format!(
        "Package: {name}\nVersion: {version}\nTitle: {title}\n\
         Description: Made by valve's tests to see how a restore handles it.\n\
         License: GPL-3\nAuthor: valve's tests\nMaintainer: valve's tests <tests@valve.invalid>\n\
         NeedsCompilation: {}\n",
        if compiled { "yes" } else { "no" }
    )
}

/// A source tarball as `R CMD build` lays one out: every file under `name/`.
fn tarball(name: &str, files: &[(&str, String, u32)]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut builder = tar::Builder::new(gz);
    for (path, text, mode) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(text.len() as u64);
        header.set_mode(*mode);
        header.set_mtime(1_700_000_000);
        header.set_entry_type(tar::EntryType::Regular);
        builder.append_data(&mut header, format!("{name}/{path}"), text.as_bytes()).expect("a tar entry");
    }
    let mut gz = builder.into_inner().expect("the tar stream");
    gz.flush().expect("flush");
    gz.finish().expect("the gzip stream")
}

/// Runs an R expression with `args` (as `commandArgs(TRUE)`), failing the
/// test with R's output unless it succeeds; returns its standard output.
fn rscript(expr: &str, args: &[&str]) -> String {
    let out = Command::new("Rscript").args(["--vanilla", "-e", expr]).args(args).output().expect("Rscript runs");
    assert!(
        out.status.success(),
        "R failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The version of `name` installed in `lib`.
fn installed_version(lib: &Path, name: &str) -> String {
    let lib = lib.to_str().expect("a UTF-8 path");
    rscript("a <- commandArgs(TRUE); cat(utils::packageDescription(a[1], lib.loc = a[2])$Version)", &[name, lib])
        .trim()
        .into()
}

/// `R CMD INSTALL -l lib tarball`: whether it succeeded, and what it printed.
fn r_cmd_install(lib: &Path, tarball: &Path) -> (bool, String) {
    let out = Command::new("R").args(["CMD", "INSTALL", "-l"]).arg(lib).arg(tarball).output().expect("R runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[test]
fn real_cran_packages_install_from_the_repository_over_http() {
    let repo = repo();
    let served = repo.serve();
    let lib = app_dir();
    // Every current package, by name only: R reads the index over HTTP, finds
    // base64url's dependency (backports) there, and compiles the C code.
    let names = [PURE_R, WITH_C, WITH_DEPENDENCIES, INSTALLED_BY_DEBIAN];
    rscript(
        "a <- commandArgs(TRUE); install.packages(a[-(1:2)], repos = a[1], lib = a[2], type = 'source', quiet = TRUE)",
        &[&[served.url(), lib.path().to_str().unwrap()][..], &names[..]].concat(),
    );
    for pkg in repo.current() {
        assert_eq!(installed_version(lib.path(), &pkg.name), pkg.version, "{} from {}", pkg.name, served.url());
    }
    let and = rscript(
        "a <- commandArgs(TRUE); .libPaths(c(a[1], .libPaths())); cat(bitops::bitAnd(12L, 10L))",
        &[lib.path().to_str().unwrap()],
    );
    assert_eq!(and, "8", "bitops' C code answers");

    for pkg in repo.archived() {
        let path = repo.path().join(format!("src/contrib/Archive/{}/{}", pkg.name, pkg.file()));
        assert!(path.is_file(), "{} is in the Archive", path.display());
    }

    // The archived version, fetched over HTTP and installed with R CMD INSTALL.
    let old = repo.archived_versions(TWO_VERSIONS)[0].to_string();
    assert_ne!(old, repo.current_version(TWO_VERSIONS));
    let url = format!("{}/{}", served.url(), repo.relative(TWO_VERSIONS, &old));
    let fetched = app_dir();
    let file = fetched.path().join(format!("{TWO_VERSIONS}_{old}.tar.gz"));
    rscript("a <- commandArgs(TRUE); download.file(a[1], a[2], quiet = TRUE)", &[&url, file.to_str().unwrap()]);
    let old_lib = app_dir();
    let (ok, text) = r_cmd_install(old_lib.path(), &file);
    assert!(ok, "R CMD INSTALL {}:\n{text}", file.display());
    assert_eq!(installed_version(old_lib.path(), TWO_VERSIONS), old);
    assert!(served.requests().iter().any(|r| r.starts_with("200 /src/contrib/Archive/")), "{:?}", served.requests());
    let missing = rscript(
        "a <- commandArgs(TRUE); r <- try(download.file(a[1], tempfile(), quiet = TRUE), silent = TRUE); cat(inherits(r, 'try-error'))",
        &[&format!("{}/src/contrib/nothing_1.0.tar.gz", served.url())],
    );
    assert_eq!(missing, "TRUE", "a file the repository lacks is a 404");
}

#[test]
fn made_packages_fail_to_compile_and_run_their_configure_script() {
    let mut repo = repo();
    let broken = repo.add_broken("valvebroken", "0.1");
    let marker = app_dir();
    let script = format!("#!/bin/sh\necho configured > {}/ran\n", marker.path().display());
    let configured = repo.add_with_configure("valveconfigured", "0.2", &script);
    let index = std::fs::read_to_string(repo.path().join("src/contrib/PACKAGES")).unwrap();
    assert!(index.contains("Package: valvebroken") && index.contains("Package: valveconfigured"), "{index}");

    let lib = app_dir();
    let (ok, text) = r_cmd_install(lib.path(), &repo.path().join(repo.relative(&broken.name, &broken.version)));
    assert!(!ok && text.contains("broken.c"), "the broken package's build fails in its C file:\n{text}");

    // From the file:// repository, by name: R reads PACKAGES there.
    rscript(
        "a <- commandArgs(TRUE); install.packages(a[1], repos = a[2], lib = a[3], type = 'source', quiet = TRUE)",
        &[&configured.name, &repo.url(), lib.path().to_str().unwrap()],
    );
    assert_eq!(std::fs::read_to_string(marker.path().join("ran")).unwrap(), "configured\n");
    assert_eq!(installed_version(lib.path(), &configured.name), "0.2");
}
