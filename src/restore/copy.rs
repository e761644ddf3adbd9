//! Copies a package a build installed (in a folder the builder owns and
//! could change while valve reads it) into the cache, valve's own: every
//! entry opened through its folder's handle, never following a link; only
//! regular files and folders the builder owns, files with one name, are
//! copied, so no link or hard link can make valve read what the builder
//! could not, and nothing of anyone else's enters the cache.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, OpenOptionsExt};
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

const MAX_DEPTH: usize = 32;
const MAX_ENTRIES: usize = 200_000;

/// Copies `name` in the folder `parent` to `dest` (which must not exist),
/// trusting only what `uid` (the builder) owns. Returns the bytes copied.
pub fn copy_out(parent: BorrowedFd<'_>, name: &str, dest: &Path, uid: u32) -> io::Result<u64> {
    let mut budget = MAX_ENTRIES;
    copy_at(parent, name, dest, uid, 0, &mut budget)
}

fn copy_at(
    parent: BorrowedFd<'_>,
    name: &str,
    dest: &Path,
    uid: u32,
    depth: usize,
    budget: &mut usize,
) -> io::Result<u64> {
    let st = rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW)?;
    *budget = budget.checked_sub(1).ok_or_else(|| io::Error::other(format!("more than {MAX_ENTRIES} entries")))?;
    if st.st_uid != uid {
        return Err(io::Error::other(format!("{name} is owned by uid {}, not the build's", st.st_uid)));
    }
    match FileType::from_raw_mode(st.st_mode) {
        FileType::Directory => {
            if depth >= MAX_DEPTH {
                return Err(io::Error::other(format!("{name}: more than {MAX_DEPTH} folders deep")));
            }
            let dir: OwnedFd = rustix::fs::openat(
                parent,
                name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            std::fs::create_dir(dest)?;
            let mut names = Vec::new();
            for entry in rustix::fs::Dir::read_from(&dir)? {
                let n = entry?.file_name().to_string_lossy().into_owned();
                if n != "." && n != ".." {
                    names.push(n);
                }
            }
            let mut bytes = 0;
            for n in names {
                bytes += copy_at(dir.as_fd(), &n, &dest.join(&n), uid, depth + 1, budget)?;
            }
            Ok(bytes)
        }
        FileType::RegularFile => {
            let fd: OwnedFd =
                rustix::fs::openat(parent, name, OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?;
            let st = rustix::fs::fstat(&fd)?;
            if st.st_nlink != 1 || st.st_uid != uid {
                return Err(io::Error::other(format!("{name} has {} names or another owner", st.st_nlink)));
            }
            let mode = if st.st_mode & 0o111 != 0 { 0o755 } else { 0o644 };
            let mut from = File::from(fd);
            let mut to = std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(dest)?;
            let mut buf = vec![0u8; 64 * 1024];
            let mut bytes = 0u64;
            loop {
                let n = from.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                to.write_all(&buf[..n])?;
                bytes += n as u64;
            }
            to.sync_all()?;
            Ok(bytes)
        }
        FileType::Symlink => {
            // Copied as a link: whoever follows it later does so as themselves.
            let target = rustix::fs::readlinkat(parent, name, Vec::new())?;
            symlink(std::ffi::OsStr::from_bytes(target.as_bytes()), dest)?;
            Ok(0)
        }
        _ => Ok(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_is_copied_with_its_links_as_links_and_a_hard_link_is_refused() {
        let src = tempfile::tempdir().unwrap();
        let pkg = src.path().join("pkg");
        std::fs::create_dir_all(pkg.join("R")).unwrap();
        std::fs::write(pkg.join("DESCRIPTION"), "Package: pkg\n").unwrap();
        std::fs::write(pkg.join("R/pkg"), "x <- 1\n").unwrap();
        symlink("/etc/passwd", pkg.join("R/link")).unwrap();
        let dest = tempfile::tempdir().unwrap();
        let parent = rustix::fs::open(src.path(), OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        let me = rustix::process::geteuid().as_raw();
        let bytes = copy_out(parent.as_fd(), "pkg", &dest.path().join("pkg"), me).unwrap();
        assert_eq!(bytes, 20);
        assert_eq!(std::fs::read_link(dest.path().join("pkg/R/link")).unwrap(), Path::new("/etc/passwd"));
        std::fs::hard_link(pkg.join("DESCRIPTION"), pkg.join("again")).unwrap();
        let err = copy_out(parent.as_fd(), "pkg", &dest.path().join("pkg2"), me).unwrap_err();
        assert!(err.to_string().contains("2 names"), "{err}");
    }
}
