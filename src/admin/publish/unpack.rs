//! A bundle (a gzipped tar) unpacked safely into a new folder: every path
//! relative and inside it (no absolute path, no `..`), no link that leads
//! out (a link's target is relative and never climbs), nothing written
//! through a link, no hard link, device, pipe or socket, within a size and
//! a file count (folders made for deep paths count too), a depth and a
//! path length. A bundle that breaks any rule is refused with the rule and
//! the path, and nothing of it is left. The path rules are pure functions
//! (`entry_path`, `link_target`, `within`); `unpack` reads the archive and
//! writes, checking each folder on disk once (a set of the folders it made),
//! so deep paths cost no quadratic walk. With `Modes::Group` (apps with
//! users of their own) nothing is readable by others: files 0640 (0750 if
//! executable), folders 0750; the deployment gives them the app's group.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io::{BufReader, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

/// How much a bundle may hold.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Bytes of file contents, unpacked.
    pub max_bytes: u64,
    /// Files, folders and links (the folders made for a deep path too).
    pub max_files: u64,
    /// Folders a path may go down (`a/b/c.R` is 3 deep).
    pub max_depth: usize,
    /// Bytes in a path.
    pub max_path: usize,
}

/// The deepest path a bundle may hold, by default.
pub const MAX_DEPTH: usize = 32;

/// The longest path a bundle may hold, in bytes, by default.
pub const MAX_PATH: usize = 1024;

/// Who may read what is unpacked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Modes {
    /// As before isolation: files at least 0644, folders as the umask gives.
    Open,
    /// Nobody but the owner and the group: files 0640 (0750 if executable),
    /// folders 0750. For apps that run as users of their own.
    Group,
}

/// What was unpacked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unpacked {
    pub files: u64,
    pub bytes: u64,
}

/// Why a bundle was refused.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("{0:?} is an absolute path: a bundle's paths start at its top folder")]
    Absolute(String),
    #[error("{0:?} climbs out of the bundle's folder (`..`)")]
    Climbs(String),
    #[error("{0:?} is not a usable path (a NUL byte, or not a plain name)")]
    BadPath(String),
    #[error("{path:?} is a link to {target:?}, which leads out of the bundle's folder (a link must name a relative path without `..`)")]
    LinkOut { path: String, target: String },
    #[error("{0:?} is a hard link: a bundle holds files, folders and links within it")]
    HardLink(String),
    #[error("{path:?} is a {kind}: a bundle holds files, folders and links within it")]
    Special { path: String, kind: &'static str },
    #[error("{path:?} would be written through the link {link:?}")]
    ThroughLink { path: String, link: String },
    #[error("{0:?} appears twice in the bundle")]
    Twice(String),
    #[error(
        "the bundle unpacks to more than {0} bytes (publish_max_size): leave data out of it, or raise publish_max_size"
    )]
    TooBig(u64),
    #[error("the bundle holds more than {0} files and folders (publish_max_files; folders made for deep paths count too): leave files out of it (an renv library belongs on the server), or raise publish_max_files")]
    TooMany(u64),
    #[error(
        "{path:?} is more than {max} folders deep: a bundle's paths may go at most {max} folders down; flatten it"
    )]
    TooDeep { path: String, max: usize },
    #[error("{path:?} is longer than {max} bytes: a bundle's paths may be at most {max} bytes; shorten its names")]
    TooLong { path: String, max: usize },
    #[error("the bundle is not a gzipped tar file ({0})")]
    NotTar(String),
    #[error("cannot write {path}: {error}")]
    Io { path: String, error: std::io::Error },
}

fn shown(raw: &[u8]) -> String {
    String::from_utf8_lossy(raw).chars().take(200).collect()
}

/// Where an entry named `raw` goes, relative to the bundle's folder (empty
/// for the folder itself): `./` and `.` parts dropped; absolute paths, `..`
/// and NUL bytes refused.
pub fn entry_path(raw: &[u8]) -> Result<PathBuf, Refused> {
    if raw.contains(&0) {
        return Err(Refused::BadPath(shown(raw)));
    }
    let path = Path::new(OsStr::from_bytes(raw));
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::RootDir | Component::Prefix(_) => return Err(Refused::Absolute(shown(raw))),
            Component::ParentDir => return Err(Refused::Climbs(shown(raw))),
            Component::CurDir => {}
            Component::Normal(name) => out.push(name),
        }
    }
    Ok(out)
}

/// Checks a path against the depth and length limits (the path shown cut
/// to 200 characters).
pub fn within(rel: &Path, limits: &Limits) -> Result<(), Refused> {
    let bytes = rel.as_os_str().as_bytes();
    if bytes.len() > limits.max_path {
        return Err(Refused::TooLong { path: shown(bytes), max: limits.max_path });
    }
    if rel.components().count() > limits.max_depth {
        return Err(Refused::TooDeep { path: shown(bytes), max: limits.max_depth });
    }
    Ok(())
}

/// Checks a link's target: relative, and without `..` (so that, followed
/// from anywhere inside the folder through any other such links, it stays
/// inside).
pub fn link_target(path: &Path, target: &[u8]) -> Result<PathBuf, Refused> {
    let out = || Refused::LinkOut { path: path.display().to_string(), target: shown(target) };
    if target.is_empty() || target.contains(&0) {
        return Err(out());
    }
    let t = Path::new(OsStr::from_bytes(target));
    if t.components().any(|c| !matches!(c, Component::Normal(_) | Component::CurDir)) {
        return Err(out());
    }
    Ok(t.to_path_buf())
}

/// A reader that fails once more than `left` bytes were read: a gzip bomb
/// (or a tar whose headers claim gigabytes) stops at the limit.
struct Bounded<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.left = self.left.checked_sub(n as u64).ok_or_else(|| std::io::Error::other(TOO_BIG))?;
        Ok(n)
    }
}

const TOO_BIG: &str = "valve: bundle over its size limit";

/// Unpacks `tar_gz` into `into` (created here; it must not exist). On a
/// refusal nothing of it is left.
pub fn unpack(tar_gz: &Path, into: &Path, limits: Limits, modes: Modes) -> Result<Unpacked, Refused> {
    folder(into, modes).map_err(|error| Refused::Io { path: into.display().to_string(), error })?;
    let result = unpack_into(tar_gz, into, limits, modes);
    if result.is_err() {
        let _ = std::fs::remove_dir_all(into);
    }
    result
}

/// Makes one folder, 0750 with `Modes::Group`.
fn folder(path: &Path, modes: Modes) -> std::io::Result<()> {
    let mut b = std::fs::DirBuilder::new();
    if modes == Modes::Group {
        b.mode(0o750);
    }
    b.create(path)
}

fn unpack_into(tar_gz: &Path, into: &Path, limits: Limits, modes: Modes) -> Result<Unpacked, Refused> {
    let file = File::open(tar_gz).map_err(|error| Refused::Io { path: tar_gz.display().to_string(), error })?;
    // Contents, plus a header (and padding) for each entry, plus room for long names.
    let stream_limit = limits.max_bytes.saturating_add(limits.max_files.saturating_mul(2048)).saturating_add(16 << 20);
    let gz = flate2::read::GzDecoder::new(BufReader::new(file));
    let mut archive = tar::Archive::new(Bounded { inner: gz, left: stream_limit });
    let not_tar = |e: std::io::Error| {
        if e.to_string().contains(TOO_BIG) {
            Refused::TooBig(limits.max_bytes)
        } else {
            Refused::NotTar(e.to_string())
        }
    };
    let mut done = Unpacked::default();
    // The folders made so far (relative paths): each is checked on disk once.
    let mut made: HashSet<PathBuf> = HashSet::new();
    for entry in archive.entries().map_err(not_tar)? {
        let mut entry = entry.map_err(not_tar)?;
        let raw = entry.path_bytes().into_owned();
        let rel = entry_path(&raw)?;
        if rel.as_os_str().is_empty() {
            continue;
        }
        within(&rel, &limits)?;
        let kind = entry.header().entry_type();
        let dest = into.join(&rel);
        parents(into, &rel, &mut made, &mut done, &limits, modes)?;
        if !(kind == tar::EntryType::Directory && made.contains(&rel)) {
            count(&mut done, &limits)?;
        }
        let io = |error: std::io::Error| Refused::Io { path: rel.display().to_string(), error };
        let twice = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::AlreadyExists => Refused::Twice(rel.display().to_string()),
            _ => io(e),
        };
        match kind {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let asked = entry.header().mode().unwrap_or(0o644);
                let mode = match modes {
                    Modes::Open => asked & 0o755 | 0o644,
                    Modes::Group if asked & 0o100 != 0 => 0o750,
                    Modes::Group => 0o640,
                };
                let mut out = OpenOptions::new().write(true).create_new(true).mode(mode).open(&dest).map_err(twice)?;
                let mut buf = vec![0u8; 64 << 10];
                loop {
                    let n = entry.read(&mut buf).map_err(not_tar)?;
                    if n == 0 {
                        break;
                    }
                    done.bytes += n as u64;
                    if done.bytes > limits.max_bytes {
                        return Err(Refused::TooBig(limits.max_bytes));
                    }
                    out.write_all(&buf[..n]).map_err(io)?;
                }
            }
            tar::EntryType::Directory if made.contains(&rel) => {}
            tar::EntryType::Directory => {
                folder(&dest, modes).map_err(twice)?;
                made.insert(rel.clone());
            }
            tar::EntryType::Symlink => {
                let target = entry.link_name_bytes().map(|t| t.into_owned()).unwrap_or_default();
                let target = link_target(&rel, &target)?;
                std::os::unix::fs::symlink(&target, &dest).map_err(twice)?;
            }
            tar::EntryType::Link => return Err(Refused::HardLink(rel.display().to_string())),
            other => {
                let kind = match other {
                    tar::EntryType::Char => "character device",
                    tar::EntryType::Block => "block device",
                    tar::EntryType::Fifo => "named pipe",
                    _ => "kind of entry valve does not unpack",
                };
                return Err(Refused::Special { path: rel.display().to_string(), kind });
            }
        }
    }
    Ok(done)
}

/// Counts one more file, folder or link.
fn count(done: &mut Unpacked, limits: &Limits) -> Result<(), Refused> {
    done.files += 1;
    if done.files > limits.max_files {
        return Err(Refused::TooMany(limits.max_files));
    }
    Ok(())
}

/// Makes the folders above `rel` inside `root` that are not made yet, one at
/// a time (each counted), refusing to go through anything that is not a
/// plain folder (a link or a file unpacked earlier). Folders already in
/// `made` are not looked at again.
fn parents(
    root: &Path,
    rel: &Path,
    made: &mut HashSet<PathBuf>,
    done: &mut Unpacked,
    limits: &Limits,
    modes: Modes,
) -> Result<(), Refused> {
    let Some(parent) = rel.parent().filter(|p| !p.as_os_str().is_empty()) else { return Ok(()) };
    if made.contains(parent) {
        return Ok(());
    }
    let mut so_far = PathBuf::new();
    for part in parent.components() {
        so_far.push(part);
        if made.contains(&so_far) {
            continue;
        }
        let at = root.join(&so_far);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => {}
            Ok(m) if m.file_type().is_symlink() => {
                return Err(Refused::ThroughLink {
                    path: rel.display().to_string(),
                    link: so_far.display().to_string(),
                })
            }
            Ok(_) => return Err(Refused::Twice(so_far.display().to_string())),
            Err(_) => {
                count(done, limits)?;
                folder(&at, modes).map_err(|error| Refused::Io { path: so_far.display().to_string(), error })?;
            }
        }
        made.insert(so_far.clone());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits { max_bytes: 1 << 20, max_files: 100, max_depth: 8, max_path: 60 };

    /// A tar.gz of (path, kind, contents or link target), headers written
    /// raw so that any path, however bad, goes in.
    fn bundle(entries: &[(&str, tar::EntryType, &[u8])]) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().unwrap();
        let gz = flate2::write::GzEncoder::new(file.reopen().unwrap(), flate2::Compression::fast());
        let mut b = tar::Builder::new(gz);
        for (path, kind, data) in entries {
            let mut h = tar::Header::new_old();
            h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
            h.set_entry_type(*kind);
            h.set_mode(0o644);
            if *kind == tar::EntryType::Symlink || *kind == tar::EntryType::Link {
                h.as_old_mut().linkname[..data.len()].copy_from_slice(data);
                h.set_size(0);
                h.set_cksum();
                b.append(&h, std::io::empty()).unwrap();
            } else {
                h.set_size(data.len() as u64);
                h.set_cksum();
                b.append(&h, *data).unwrap();
            }
        }
        b.into_inner().unwrap().finish().unwrap();
        file
    }

    fn files_in(dir: &Path) -> Vec<String> {
        let mut out: Vec<String> =
            walk(dir).iter().map(|p| p.strip_prefix(dir).unwrap().display().to_string()).collect();
        out.sort();
        out
    }

    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            out.push(e.path());
            if e.file_type().unwrap().is_dir() {
                out.extend(walk(&e.path()));
            }
        }
        out
    }

    #[test]
    fn paths_stay_inside_the_folder() {
        assert_eq!(entry_path(b"./app/plumber.R").unwrap(), PathBuf::from("app/plumber.R"));
        assert_eq!(entry_path(b"./").unwrap(), PathBuf::new());
        assert!(matches!(entry_path(b"/etc/passwd"), Err(Refused::Absolute(_))));
        assert!(matches!(entry_path(b"../x"), Err(Refused::Climbs(_))));
        assert!(matches!(entry_path(b"a/../../x"), Err(Refused::Climbs(_))));
        assert!(matches!(entry_path(b"a/b/.."), Err(Refused::Climbs(_))), "even one that would land inside");
        assert!(matches!(entry_path(b"a\0b"), Err(Refused::BadPath(_))));
        let here = Path::new("www/logo.png");
        assert_eq!(link_target(here, b"img/logo.png").unwrap(), PathBuf::from("img/logo.png"));
        for bad in [&b"/etc/passwd"[..], b"../secret", b"a/../../b", b"", b"x\0"] {
            assert!(
                matches!(link_target(here, bad), Err(Refused::LinkOut { .. })),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn a_good_bundle_unpacks_with_its_links_inside() {
        use tar::EntryType::*;
        let b = bundle(&[
            ("./", Directory, b""),
            ("./manifest.json", Regular, b"{}"),
            ("./www/", Directory, b""),
            ("./www/a.txt", Regular, b"hello"),
            ("./www/b.txt", Symlink, b"a.txt"),
            ("./R/helpers.R", Regular, b"f <- 1"),
        ]);
        let out = tempfile::tempdir().unwrap();
        let into = out.path().join("v1");
        let got = unpack(b.path(), &into, LIMITS, Modes::Open).unwrap();
        assert_eq!(got, Unpacked { files: 6, bytes: 13 }, "R/ made for R/helpers.R counts too");
        assert_eq!(files_in(&into), ["R", "R/helpers.R", "manifest.json", "www", "www/a.txt", "www/b.txt"]);
        assert_eq!(std::fs::read_to_string(into.join("www/b.txt")).unwrap(), "hello");
    }

    #[test]
    fn a_bundle_that_breaks_a_rule_is_refused_and_nothing_is_left() {
        use tar::EntryType::*;
        type Entries<'a> = Vec<(&'a str, tar::EntryType, &'a [u8])>;
        let cases: Vec<(Entries, &str)> = vec![
            (vec![("ok.R", Regular, b"1"), ("../../evil.R", Regular, b"x")], "climbs out"),
            (vec![("/tmp/evil.R", Regular, b"x")], "absolute path"),
            (vec![("out", Symlink, b"../..")], "leads out"),
            (vec![("out", Symlink, b"/etc")], "leads out"),
            (vec![("d", Symlink, b"sub"), ("sub/", Directory, b""), ("d/x.R", Regular, b"x")], "through the link"),
            (vec![("a.R", Regular, b"x"), ("b.R", Link, b"a.R")], "hard link"),
            (vec![("dev", Char, b"")], "character device"),
            (vec![("fifo", Fifo, b"")], "named pipe"),
            (vec![("a.R", Regular, b"x"), ("a.R", Regular, b"y")], "twice"),
        ];
        for (entries, why) in cases {
            let b = bundle(&entries);
            let out = tempfile::tempdir().unwrap();
            let into = out.path().join("v1");
            let e = unpack(b.path(), &into, LIMITS, Modes::Open).unwrap_err().to_string();
            assert!(e.contains(why), "{why}: {e}");
            assert!(!into.exists(), "{why}: nothing is left");
            assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0, "{why}: nothing beside it either");
        }
        let big = vec![0u8; 2 << 20];
        let e = unpack(
            bundle(&[("big", Regular, &big)]).path(),
            &tempfile::tempdir().unwrap().path().join("v"),
            LIMITS,
            Modes::Open,
        )
        .unwrap_err();
        assert!(matches!(e, Refused::TooBig(_)), "{e}");
        let many: Vec<String> = (0..101).map(|i| format!("f{i}")).collect();
        let entries: Vec<(&str, tar::EntryType, &[u8])> =
            many.iter().map(|n| (n.as_str(), Regular, &b""[..])).collect();
        let e = unpack(bundle(&entries).path(), &tempfile::tempdir().unwrap().path().join("v"), LIMITS, Modes::Open)
            .unwrap_err();
        assert!(matches!(e, Refused::TooMany(100)), "{e}");
        let junk = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(junk.path(), b"not a tarball").unwrap();
        let e = unpack(junk.path(), &tempfile::tempdir().unwrap().path().join("v"), LIMITS, Modes::Open).unwrap_err();
        assert!(e.to_string().contains("not a gzipped tar"), "{e}");
    }

    #[test]
    fn folders_made_for_deep_paths_count_and_depth_and_length_are_bounded() {
        use tar::EntryType::*;
        let into = |d: &tempfile::TempDir| d.path().join("v");
        // 20 files, 7 folders above each: 160 things on disk from 20 entries.
        let deep: Vec<String> = (0..20).map(|i| format!("d{i}/a/b/c/d/e/f/x.R")).collect();
        let entries: Vec<(&str, tar::EntryType, &[u8])> =
            deep.iter().map(|n| (n.as_str(), Regular, &b"1"[..])).collect();
        let d = tempfile::tempdir().unwrap();
        let e = unpack(bundle(&entries).path(), &into(&d), LIMITS, Modes::Open).unwrap_err();
        assert!(matches!(e, Refused::TooMany(100)), "{e}");
        assert!(!into(&d).exists());
        // Within the limit, a folder named again (or given as an entry) is counted once.
        let entries: Vec<(&str, tar::EntryType, &[u8])> =
            vec![("a/b/x.R", Regular, b"1"), ("a/b/", Directory, b""), ("a/b/y.R", Regular, b"2")];
        let d = tempfile::tempdir().unwrap();
        assert_eq!(unpack(bundle(&entries).path(), &into(&d), LIMITS, Modes::Open).unwrap().files, 4);
        let nine = "a/b/c/d/e/f/g/h/i.R";
        let d = tempfile::tempdir().unwrap();
        let e = unpack(bundle(&[(nine, Regular, b"1")]).path(), &into(&d), LIMITS, Modes::Open).unwrap_err();
        assert!(e.to_string().contains("is more than 8 folders deep") && e.to_string().contains(nine), "{e}");
        let long = format!("{}/x.R", "n".repeat(70));
        let d = tempfile::tempdir().unwrap();
        let e = unpack(bundle(&[(long.as_str(), Regular, b"1")]).path(), &into(&d), LIMITS, Modes::Open).unwrap_err();
        assert!(e.to_string().contains("is longer than 60 bytes"), "{e}");
        assert!(!into(&d).exists());
    }

    #[test]
    fn group_modes_leave_nothing_readable_by_others() {
        use std::os::unix::fs::PermissionsExt;
        use tar::EntryType::*;
        let mut b = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
        for (path, mode, kind) in [("www/", 0o777, Directory), ("app.R", 0o666, Regular), ("run.sh", 0o777, Regular)] {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            h.set_mode(mode);
            h.set_size(0);
            b.append_data(&mut h, path, std::io::empty()).unwrap();
        }
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(0);
        b.append_data(&mut h, "R/deep/f.R", std::io::empty()).unwrap();
        let gz = b.into_inner().unwrap().finish().unwrap();
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), gz).unwrap();
        let d = tempfile::tempdir().unwrap();
        let into = d.path().join("v");
        unpack(file.path(), &into, LIMITS, Modes::Group).unwrap();
        let mode = |p: &str| std::fs::metadata(into.join(p)).unwrap().permissions().mode() & 0o7777;
        for (path, want) in [
            ("", 0o750),
            ("www", 0o750),
            ("R", 0o750),
            ("R/deep", 0o750),
            ("app.R", 0o640),
            ("run.sh", 0o750),
            ("R/deep/f.R", 0o640),
        ] {
            assert_eq!(mode(path), want, "{path:?}");
        }
    }
}
