//! A bundle (a gzipped tar) unpacked safely into a new folder: every path
//! relative and inside it (no absolute path, no `..`), no link that leads
//! out (a link's target is relative and never climbs), nothing written
//! through a link, no hard link, device, pipe or socket, within a size and
//! a file count. A bundle that breaks any rule is refused with the rule and
//! the path, and nothing of it is left. The path rules are pure functions
//! (`entry_path`, `link_target`); `unpack` reads the archive and writes.

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io::{BufReader, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

/// How much a bundle may hold.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Bytes of file contents, unpacked.
    pub max_bytes: u64,
    /// Files, folders and links.
    pub max_files: u64,
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
    #[error("the bundle holds more than {0} files and folders (publish_max_files): leave files out of it (an renv library belongs on the server), or raise publish_max_files")]
    TooMany(u64),
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
pub fn unpack(tar_gz: &Path, into: &Path, limits: Limits) -> Result<Unpacked, Refused> {
    std::fs::create_dir(into).map_err(|error| Refused::Io { path: into.display().to_string(), error })?;
    let result = unpack_into(tar_gz, into, limits);
    if result.is_err() {
        let _ = std::fs::remove_dir_all(into);
    }
    result
}

fn unpack_into(tar_gz: &Path, into: &Path, limits: Limits) -> Result<Unpacked, Refused> {
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
    for entry in archive.entries().map_err(not_tar)? {
        let mut entry = entry.map_err(not_tar)?;
        let raw = entry.path_bytes().into_owned();
        let rel = entry_path(&raw)?;
        if rel.as_os_str().is_empty() {
            continue;
        }
        done.files += 1;
        if done.files > limits.max_files {
            return Err(Refused::TooMany(limits.max_files));
        }
        let kind = entry.header().entry_type();
        let dest = into.join(&rel);
        parents(into, &rel)?;
        let io = |error: std::io::Error| Refused::Io { path: rel.display().to_string(), error };
        let twice = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::AlreadyExists => Refused::Twice(rel.display().to_string()),
            _ => io(e),
        };
        match kind {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let mode = entry.header().mode().unwrap_or(0o644) & 0o755 | 0o644;
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
            tar::EntryType::Directory => match std::fs::symlink_metadata(&dest) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(Refused::Twice(rel.display().to_string())),
                Err(_) => std::fs::create_dir(&dest).map_err(twice)?,
            },
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

/// Makes the folders above `rel` inside `root`, one at a time, refusing to
/// go through anything that is not a plain folder (a link unpacked earlier).
fn parents(root: &Path, rel: &Path) -> Result<(), Refused> {
    let mut at = root.to_path_buf();
    let mut so_far = PathBuf::new();
    let Some(parent) = rel.parent() else { return Ok(()) };
    for part in parent.components() {
        at.push(part);
        so_far.push(part);
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
                std::fs::create_dir(&at).map_err(|error| Refused::Io { path: so_far.display().to_string(), error })?
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits { max_bytes: 1 << 20, max_files: 100 };

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
        let got = unpack(b.path(), &into, LIMITS).unwrap();
        assert_eq!(got, Unpacked { files: 5, bytes: 13 });
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
            let e = unpack(b.path(), &into, LIMITS).unwrap_err().to_string();
            assert!(e.contains(why), "{why}: {e}");
            assert!(!into.exists(), "{why}: nothing is left");
            assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0, "{why}: nothing beside it either");
        }
        let big = vec![0u8; 2 << 20];
        let e =
            unpack(bundle(&[("big", Regular, &big)]).path(), &tempfile::tempdir().unwrap().path().join("v"), LIMITS)
                .unwrap_err();
        assert!(matches!(e, Refused::TooBig(_)), "{e}");
        let many: Vec<String> = (0..101).map(|i| format!("f{i}")).collect();
        let entries: Vec<(&str, tar::EntryType, &[u8])> =
            many.iter().map(|n| (n.as_str(), Regular, &b""[..])).collect();
        let e = unpack(bundle(&entries).path(), &tempfile::tempdir().unwrap().path().join("v"), LIMITS).unwrap_err();
        assert!(matches!(e, Refused::TooMany(100)), "{e}");
        let junk = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(junk.path(), b"not a tarball").unwrap();
        let e = unpack(junk.path(), &tempfile::tempdir().unwrap().path().join("v"), LIMITS).unwrap_err();
        assert!(e.to_string().contains("not a gzipped tar"), "{e}");
    }
}
