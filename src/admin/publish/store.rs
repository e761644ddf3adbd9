//! The publishing API's writes to `publish_dir`: apps created, bundles
//! uploaded (unpacked safely into the next version's folder), the active
//! version and the allow lists changed, old versions removed. Callers hold
//! the publisher's records lock around each read-modify-write; the record
//! itself is written whole (`config::publish::write_record`).

use std::path::{Path, PathBuf};

use http::StatusCode;

use super::unpack::{self, Limits, Modes};
use crate::config::publish::{
    app_dir, bundle_source, read_record, read_records, version_dir, write_record, AppRecord, Publishing, VersionRecord,
};
use crate::config::valid_name;

/// Why a call could not be done: the HTTP status and what to tell the client.
#[derive(Debug)]
pub struct Fail {
    pub status: StatusCode,
    pub message: String,
}

impl Fail {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Fail {
        Fail { status, message: message.into() }
    }

    pub fn io(what: &str, e: std::io::Error) -> Fail {
        Fail::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{what}: {e} (check publish_dir's permissions and free space)"),
        )
    }
}

/// Unix seconds now.
pub fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// `secs` as an RFC 3339 time in UTC (`2026-11-26T13:20:00Z`).
pub fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// A new random id in the usual 8-4-4-4-12 shape.
fn guid() -> String {
    let mut b = [0u8; 16];
    let _ = rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty());
    let h = crate::mac::hex(&b);
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

/// Whether `name` can be a published app's name (and its path, `/<name>/`).
pub fn publishable_name(name: &str) -> bool {
    valid_name(name) && name.len() <= 64 && !name.starts_with('.') && !name.starts_with("__")
}

/// Every record.
pub fn all(p: &Publishing) -> Result<Vec<AppRecord>, Fail> {
    read_records(&p.dir).map_err(|e| Fail::new(StatusCode::INTERNAL_SERVER_ERROR, e))
}

/// The record of app `name`, or 404.
pub fn by_name(p: &Publishing, name: &str) -> Result<AppRecord, Fail> {
    if !publishable_name(name) {
        return Err(Fail::new(StatusCode::NOT_FOUND, format!("no published app is named {name:?}")));
    }
    read_record(&app_dir(&p.dir, name))
        .map_err(|e| Fail::new(StatusCode::INTERNAL_SERVER_ERROR, e))?
        .ok_or_else(|| Fail::new(StatusCode::NOT_FOUND, format!("no published app is named {name:?}")))
}

/// The record whose id (a number) or guid is `id`, or 404.
pub fn by_id(p: &Publishing, id: &str) -> Result<AppRecord, Fail> {
    all(p)?
        .into_iter()
        .find(|r| r.id.to_string() == id || r.guid == id)
        .ok_or_else(|| Fail::new(StatusCode::NOT_FOUND, format!("no published app has the id {id:?}")))
}

/// Creates app `name` (no version yet). `taken` says why a configured app
/// already has the name or its paths, if one does.
pub fn create(
    p: &Publishing,
    name: &str,
    title: &str,
    key: &str,
    taken: impl Fn(&str) -> Option<String>,
) -> Result<AppRecord, Fail> {
    if !publishable_name(name) {
        return Err(Fail::new(
            StatusCode::BAD_REQUEST,
            format!("{name:?} cannot be a published app's name: use 1 to 64 letters, digits, `-`, `_` or `.` (it becomes the path /{name}/)"),
        ));
    }
    if let Some(why) = taken(name) {
        return Err(Fail::new(
            StatusCode::CONFLICT,
            format!("{why}: publish under another name (deployApp(appName = ...)), or have the operator mount the configured app under a path of its own (path = \"/NAME\" in its [[app]])"),
        ));
    }
    let records = all(p)?;
    if records.iter().any(|r| r.name == name) {
        return Err(Fail::new(
            StatusCode::CONFLICT,
            format!("an app named {name:?} is already published: deploy to it"),
        ));
    }
    let dir = app_dir(&p.dir, name);
    std::fs::create_dir(&dir).map_err(|e| Fail::io(&format!("cannot create {}", dir.display()), e))?;
    let record = AppRecord {
        id: records.iter().map(|r| r.id).max().unwrap_or(0) + 1,
        guid: guid(),
        name: name.to_string(),
        title: title.to_string(),
        created: now(),
        created_by: key.to_string(),
        owner: Some(key.to_string()),
        next_version: 1,
        ..AppRecord::default()
    };
    write_record(&dir, &record).map_err(|e| Fail::io("cannot write the app's record", e))?;
    Ok(record)
}

/// Takes the next version number of app `name` (it is never given twice,
/// even if its upload then fails).
pub fn next_version(p: &Publishing, name: &str) -> Result<u32, Fail> {
    let mut record = by_name(p, name)?;
    let n = record.next_version.max(1);
    record.next_version = n + 1;
    write_record(&app_dir(&p.dir, name), &record).map_err(|e| Fail::io("cannot write the app's record", e))?;
    Ok(n)
}

/// Unpacks `tarball` as version `n` of app `name` (into a hidden folder,
/// renamed once checked), reads its manifest and checks its kind. Nothing
/// is left of a refused bundle.
pub fn unpack_version(
    p: &Publishing,
    name: &str,
    n: u32,
    tarball: &Path,
    key: &str,
    modes: Modes,
    repos: &crate::restore::plan::Repositories,
) -> Result<VersionRecord, Fail> {
    let dir = app_dir(&p.dir, name);
    let partial = dir.join(format!(".v{n}.partial"));
    let _ = std::fs::remove_dir_all(&partial);
    let refused = |why: String| Fail::new(StatusCode::BAD_REQUEST, format!("the bundle was refused: {why}"));
    let limits = Limits {
        max_bytes: p.max_size,
        max_files: p.max_files,
        max_depth: unpack::MAX_DEPTH,
        max_path: unpack::MAX_PATH,
    };
    let unpacked = unpack::unpack(tarball, &partial, limits, modes).map_err(|e| refused(e.to_string()))?;
    let checked = manifest(&partial).and_then(|(appmode, packages)| {
        let source = bundle_source(&partial, &appmode)?;
        // What the bundle names of packages: every name, version and
        // repository checked now, before anything uses them.
        if let Some(lock) = crate::restore::lock::read(&partial).map_err(|e| strip_dir(&e, &partial))? {
            repos.check_client_urls(&lock)?;
        }
        Ok((appmode, packages, source.kind().to_string()))
    });
    let (appmode, packages, kind) = match checked {
        Ok(c) => c,
        Err(why) => {
            let _ = std::fs::remove_dir_all(&partial);
            return Err(refused(why));
        }
    };
    let to = version_dir(&dir, n);
    if let Err(e) = std::fs::rename(&partial, &to) {
        let _ = std::fs::remove_dir_all(&partial);
        return Err(Fail::io(&format!("cannot move the bundle into {}", to.display()), e));
    }
    Ok(VersionRecord {
        version: n,
        uploaded: now(),
        uploaded_by: key.to_string(),
        appmode,
        kind,
        files: unpacked.files,
        bytes: unpacked.bytes,
        packages,
        activated: None,
        activated_by: None,
    })
}

/// A message about a file of the unpacked bundle, naming it as the bundle
/// does (`manifest.json`, not the folder valve unpacked it in).
fn strip_dir(message: &str, dir: &Path) -> String {
    message.replace(&format!("{}/", dir.display()), "")
}

/// Gives the tree at `dir` (an unpacked version) to root and group `gid`:
/// the bundle's files readable by that group alone (0640, 0750 if
/// executable), its folders the group's to add to but not to take from
/// (01770: the app writes logs or a database beside its code, and cannot
/// replace or remove a file of the bundle). Done before an app with a user
/// of its own serves the version (its R reads it through its group), and
/// again at start: what the app made there (its user's) is left as it is;
/// everything goes through handles, no link is followed.
pub fn give_group(dir: &Path, gid: u32) -> std::io::Result<()> {
    let top = crate::worker::sandbox::safe::open_dir(dir)?;
    give_tree(&top, gid, 0)
}

/// How deep a bundle's folders go before valve stops giving them.
const MAX_DEPTH: usize = 64;

fn give_tree(dir: &std::os::fd::OwnedFd, gid: u32, depth: usize) -> std::io::Result<()> {
    use rustix::fs::{FileType, Gid, Mode, OFlags, Uid};
    let me = rustix::process::geteuid();
    let give = |fd: &std::os::fd::OwnedFd, mode: u32| -> std::io::Result<()> {
        rustix::fs::fchown(fd, Some(Uid::ROOT), Some(Gid::from_raw(gid)))?;
        rustix::fs::fchmod(fd, Mode::from_raw_mode(mode))?;
        Ok(())
    };
    if rustix::fs::fstat(dir)?.st_uid != me.as_raw() || depth > MAX_DEPTH {
        return Ok(());
    }
    give(dir, 0o1770)?;
    let names: Vec<std::ffi::CString> = rustix::fs::Dir::read_from(dir)?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_owned())
        .filter(|n| n.as_bytes() != b"." && n.as_bytes() != b"..")
        .collect();
    for name in names {
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd = match rustix::fs::openat(dir, name.as_c_str(), flags, Mode::empty()) {
            Ok(fd) => fd,
            // A link: never followed, left as it is.
            Err(rustix::io::Errno::LOOP) => continue,
            Err(e) => return Err(e.into()),
        };
        let st = rustix::fs::fstat(&fd)?;
        if st.st_uid != me.as_raw() {
            continue; // the app's own (a log it wrote): left as it made it
        }
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => give_tree(&fd, gid, depth + 1)?,
            FileType::RegularFile => give(&fd, if st.st_mode & 0o100 != 0 { 0o750 } else { 0o640 })?,
            _ => {}
        }
    }
    Ok(())
}

/// Makes `dir` (the publish folder, or an app's folder above its versions)
/// passable but not listable by others: 0711.
pub fn unlisted(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
}

/// Adds a version to app `name`'s record.
pub fn add_version(p: &Publishing, name: &str, version: VersionRecord) -> Result<(), Fail> {
    let mut record = by_name(p, name)?;
    record.versions.retain(|v| v.version != version.version);
    record.versions.push(version);
    record.versions.sort_by_key(|v| v.version);
    write_record(&app_dir(&p.dir, name), &record).map_err(|e| Fail::io("cannot write the app's record", e))
}

/// A bundle's manifest: its appmode and its packages (name, version).
fn manifest(dir: &Path) -> Result<(String, Vec<(String, String)>), String> {
    let path = dir.join("manifest.json");
    let text = std::fs::read_to_string(&path).map_err(|_| {
        "it holds no manifest.json at its top: publish with rsconnect::deployApp() or valve::valve_deploy(), which write one (or rsconnect::writeManifest())".to_string()
    })?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("its manifest.json is not JSON ({e})"))?;
    let appmode = json["metadata"]["appmode"]
        .as_str()
        .ok_or("its manifest.json has no metadata.appmode (api, shiny, rmd-shiny, static...)")?
        .to_string();
    let mut packages: Vec<(String, String)> = json["packages"]
        .as_object()
        .map(|o| {
            o.iter()
                .map(|(name, p)| {
                    let version = p["description"]["Version"].as_str().or(p["Version"].as_str()).unwrap_or("");
                    (name.clone(), version.to_string())
                })
                .collect()
        })
        .unwrap_or_default();
    packages.sort();
    Ok((appmode, packages))
}

/// Makes version `n` app `name`'s active one, by `key`; returns the
/// previous active version.
pub fn activate(p: &Publishing, name: &str, n: Option<u32>, key: &str) -> Result<Option<u32>, Fail> {
    let mut record = by_name(p, name)?;
    let previous = record.active;
    record.active = n;
    if let Some(v) = n.and_then(|n| record.version_mut(n)) {
        v.activated = Some(now());
        v.activated_by = Some(key.to_string());
    }
    write_record(&app_dir(&p.dir, name), &record).map_err(|e| Fail::io("cannot write the app's record", e))?;
    Ok(previous)
}

/// Sets app `name`'s allow lists (`None`: that list is not set).
pub fn set_access(
    p: &Publishing,
    name: &str,
    users: Option<Vec<String>>,
    groups: Option<Vec<String>>,
) -> Result<AppRecord, Fail> {
    let mut record = by_name(p, name)?;
    record.allow_users = users;
    record.allow_groups = groups;
    write_record(&app_dir(&p.dir, name), &record).map_err(|e| Fail::io("cannot write the app's record", e))?;
    Ok(record)
}

/// Which of a record's versions to remove so that at most `keep` remain,
/// oldest first; never the active one, the newest upload (a deployment may
/// be about to use it), nor one a live generation still serves from
/// (`in_use`: serving, starting or winding down). Uploads never deployed
/// count like the others. Pure: the caller removes them.
pub fn prunable(record: &AppRecord, keep: usize, in_use: &[u32]) -> Vec<u32> {
    let newest = record.versions.iter().map(|v| v.version).max();
    let mut left = record.versions.len();
    let mut out = Vec::new();
    for v in record.versions.iter().map(|v| v.version) {
        if left <= keep {
            break;
        }
        if Some(v) == record.active || Some(v) == newest || in_use.contains(&v) {
            continue;
        }
        out.push(v);
        left -= 1;
    }
    out
}

/// Removes app `name`'s versions `prunable` names, given the paths live
/// generations serve from; returns the versions removed.
pub fn prune(p: &Publishing, name: &str, in_use: &[PathBuf]) -> Result<Vec<u32>, Fail> {
    let mut record = by_name(p, name)?;
    let dir = app_dir(&p.dir, name);
    let used: Vec<u32> = record
        .versions
        .iter()
        .map(|v| v.version)
        .filter(|n| in_use.iter().any(|path| path.starts_with(version_dir(&dir, *n))))
        .collect();
    let removed = prunable(&record, p.keep, &used);
    for n in &removed {
        let folder = version_dir(&dir, *n);
        if let Err(e) = std::fs::remove_dir_all(&folder) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(folder = %folder.display(), error = %e, "cannot remove an old published version");
            }
        }
    }
    if !removed.is_empty() {
        record.versions.retain(|v| !removed.contains(&v.version));
        write_record(&dir, &record).map_err(|e| Fail::io("cannot write the app's record", e))?;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::publish::VersionRule;

    fn settings(dir: &Path) -> Publishing {
        Publishing {
            dir: dir.to_path_buf(),
            keys_file: dir.join("keys"),
            addr: None,
            keep: 2,
            versions: VersionRule::Exact,
            max_size: 1 << 20,
            max_files: 100,
        }
    }

    fn bundle(files: &[(&str, &str)]) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().unwrap();
        let gz = flate2::write::GzEncoder::new(file.reopen().unwrap(), flate2::Compression::fast());
        let mut b = tar::Builder::new(gz);
        for (path, text) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(text.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, path, text.as_bytes()).unwrap();
        }
        b.into_inner().unwrap().finish().unwrap();
        file
    }

    const MANIFEST: &str = r#"{"metadata": {"appmode": "api"},
        "packages": {"plumber": {"Source": "CRAN", "description": {"Package": "plumber", "Version": "1.2.1"}}}}"#;

    #[test]
    fn versions_are_numbered_unpacked_activated_and_pruned() {
        let d = tempfile::tempdir().unwrap();
        let p = settings(d.path());
        let free = |_: &str| None;
        let app = create(&p, "sales", "Sales", "alice", free).unwrap();
        assert_eq!((app.id, app.active, app.guid.len()), (1, None, 36));
        let e = create(&p, "sales", "", "bob", free).unwrap_err();
        assert_eq!(e.status, StatusCode::CONFLICT);
        let e =
            create(&p, "docs", "", "bob", |_| Some("the path /docs/ belongs to the app `docs`".into())).unwrap_err();
        assert!(e.message.contains("belongs to the app `docs`") && e.message.contains("another name"), "{}", e.message);
        assert_eq!(create(&p, "../x", "", "bob", free).unwrap_err().status, StatusCode::BAD_REQUEST);
        assert_eq!(create(&p, "hr", "", "bob", free).unwrap().id, 2);

        for round in 1..=3 {
            let n = next_version(&p, "sales").unwrap();
            assert_eq!(n, round);
            let b = bundle(&[("manifest.json", MANIFEST), ("plumber.R", "#* @get /\nfunction() 1\n")]);
            let v = unpack_version(&p, "sales", n, b.path(), "alice", Modes::Open, &Default::default()).unwrap();
            assert_eq!((v.appmode.as_str(), v.kind.as_str(), v.files), ("api", "plumber-dir", 2));
            assert_eq!(v.packages, [("plumber".to_string(), "1.2.1".to_string())]);
            add_version(&p, "sales", v).unwrap();
            activate(&p, "sales", Some(n), "alice").unwrap();
        }
        assert_eq!(activate(&p, "sales", Some(1), "bob").unwrap(), Some(3), "the previous active version");
        assert_eq!(prune(&p, "sales", &[]).unwrap(), [2], "the oldest one that is not active");
        let r = by_name(&p, "sales").unwrap();
        assert_eq!(r.versions.iter().map(|v| v.version).collect::<Vec<_>>(), [1, 3]);
        assert_eq!(r.current().and_then(|v| v.activated_by.as_deref()), Some("bob"));
        assert!(!version_dir(&app_dir(d.path(), "sales"), 2).exists());
        assert_eq!(by_id(&p, "1").unwrap().name, "sales");
        assert_eq!(by_id(&p, &r.guid).unwrap().name, "sales");
        assert_eq!(by_id(&p, "9").unwrap_err().status, StatusCode::NOT_FOUND);
    }

    #[test]
    fn a_refused_bundle_leaves_nothing_and_says_why() {
        let d = tempfile::tempdir().unwrap();
        let p = settings(d.path());
        create(&p, "api", "", "alice", |_| None).unwrap();
        for (files, why) in [
            (vec![("plumber.R", "1")], "no manifest.json"),
            (vec![("manifest.json", r#"{"metadata": {"appmode": "shiny"}}"#), ("plumber.R", "1")], "app.R or server.R"),
            (vec![("manifest.json", "{")], "not JSON"),
            (
                vec![
                    (
                        "manifest.json",
                        r#"{"metadata": {"appmode": "api"}, "packages": {"../../../../tmp/x/pwn": {"Source": "CRAN", "description": {"Version": "1.0"}}}}"#,
                    ),
                    ("plumber.R", "1"),
                ],
                "manifest.json: the package name \"../../../../tmp/x/pwn\" is refused",
            ),
            (
                vec![
                    (
                        "manifest.json",
                        r#"{"metadata": {"appmode": "api"}, "packages": {"R6": {"Source": "CRAN", "description": {"Version": "2.5.1a"}}}}"#,
                    ),
                    ("plumber.R", "1"),
                ],
                "R6 has the version \"2.5.1a\"",
            ),
            (
                vec![
                    (
                        "manifest.json",
                        r#"{"metadata": {"appmode": "api"}, "packages": {"R6": {"Source": "CRAN", "Repository": "file:///root", "description": {"Version": "2.5.1"}}}}"#,
                    ),
                    ("plumber.R", "1"),
                ],
                "the package R6 comes from the repository CRAN at \"file:///root\", which is refused",
            ),
        ] {
            let n = next_version(&p, "api").unwrap();
            let e = unpack_version(&p, "api", n, bundle(&files).path(), "alice", Modes::Open, &Default::default())
                .unwrap_err();
            assert!(e.message.starts_with("the bundle was refused: ") && e.message.contains(why), "{}", e.message);
            let left: Vec<_> =
                std::fs::read_dir(app_dir(d.path(), "api")).unwrap().flatten().map(|e| e.file_name()).collect();
            assert_eq!(left, ["app.json"], "{why}");
        }
    }

    #[test]
    fn pruning_spares_the_active_the_newest_and_every_version_a_live_generation_uses() {
        let record = |active: Option<u32>, versions: &[u32]| AppRecord {
            active,
            versions: versions.iter().map(|&version| VersionRecord { version, ..Default::default() }).collect(),
            ..Default::default()
        };
        // keep = 1: v1 still drains after v2 and v3 were deployed.
        assert_eq!(prunable(&record(Some(3), &[1, 2, 3]), 1, &[1, 3]), [2]);
        assert_eq!(prunable(&record(Some(3), &[1, 3]), 1, &[3]), [1], "once it has drained");
        // Uploads never deployed count, oldest first; the active one and the newest stay.
        assert_eq!(prunable(&record(Some(1), &[1, 2, 3, 4]), 1, &[1]), [2, 3]);
        assert_eq!(prunable(&record(None, &[5, 6, 7]), 2, &[]), [5]);
        assert_eq!(prunable(&record(Some(2), &[1, 2, 3]), 3, &[]), Vec::<u32>::new(), "within keep");
    }

    #[test]
    fn giving_a_version_to_its_group_never_follows_a_link_out_of_it() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let d = tempfile::tempdir().unwrap();
        let outside = d.path().join("outside.txt");
        std::fs::write(&outside, "x").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o604)).unwrap();
        let v = d.path().join("v1");
        std::fs::create_dir_all(v.join("R")).unwrap();
        std::fs::write(v.join("R/a.R"), "1").unwrap();
        std::os::unix::fs::symlink(&outside, v.join("link")).unwrap();
        let before = std::fs::metadata(&outside).unwrap();
        give_group(&v, before.gid()).unwrap();
        let after = std::fs::metadata(&outside).unwrap();
        assert_eq!((after.mode(), after.uid(), after.gid()), (before.mode(), before.uid(), before.gid()));
        assert_eq!(std::fs::metadata(v.join("R/a.R")).unwrap().mode() & 0o7777, 0o640);
        assert_eq!(std::fs::metadata(v.join("R")).unwrap().mode() & 0o7777, 0o1770, "the app may add, not take away");
        assert_eq!(std::fs::metadata(&v).unwrap().mode() & 0o7777, 0o1770);
        // What the app made there is its own: left as it is (as root, where the test can make one).
        if rustix::process::geteuid().is_root() {
            std::fs::create_dir(v.join("logs")).unwrap();
            std::os::unix::fs::chown(v.join("logs"), Some(65534), Some(65534)).unwrap();
            std::fs::set_permissions(v.join("logs"), std::fs::Permissions::from_mode(0o755)).unwrap();
            give_group(&v, before.gid()).unwrap();
            let logs = std::fs::metadata(v.join("logs")).unwrap();
            assert_eq!((logs.uid(), logs.mode() & 0o7777), (65534, 0o755));
        }
    }

    #[test]
    fn times_are_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_795_000_000), "2026-11-18T11:06:40Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }
}
