//! Files that hold secrets, or that decide what root does (the publishing
//! keys file, the usage log's anonymizing key, the app uid table and its
//! key): valve uses one only if no other user could have written it and, when
//! it holds a plain secret, no other user can read it. `judge` decides from
//! the mode and owner alone; `check` and `key_in` are its edge on the disk.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// What a file holds, for the rule on who may read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holds {
    /// A secret as it is (a key): only its owner may read it.
    Plain,
    /// Nothing secret (hashes, a table): others may read it, never write it.
    NoSecret,
}

/// Whether a file of `mode` owned by `owner` may be trusted by valve running
/// as `valve_uid`: `Err(what is wrong)`, in words for the message.
pub fn judge(mode: u32, owner: u32, valve_uid: u32, holds: Holds) -> Result<(), String> {
    if owner != 0 && owner != valve_uid {
        return Err(format!("it is owned by uid {owner}, not by root or valve's user, who can change it"));
    }
    if mode & 0o022 != 0 {
        return Err(format!("its mode {:04o} lets other users change it", mode & 0o7777));
    }
    if holds == Holds::Plain && mode & 0o044 != 0 {
        return Err(format!("its mode {:04o} lets other users read the secret it holds", mode & 0o7777));
    }
    Ok(())
}

/// Checks the file at `path` (`what` names it as the user wrote it, such as
/// `publish_keys_file`): the error names the path, what is wrong and the fix.
pub fn check(path: &Path, what: &str, holds: Holds) -> Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{what} {}: cannot read it: {e}", path.display()))?;
    judge_meta(path, what, &meta, holds)
}

/// `judge` of a file already open (its metadata), with the message `check` gives.
pub fn judge_meta(path: &Path, what: &str, meta: &std::fs::Metadata, holds: Holds) -> Result<(), String> {
    let valve_uid = rustix::process::geteuid().as_raw();
    judge(meta.mode(), meta.uid(), valve_uid, holds).map_err(|why| {
        let p = path.display();
        let owner = if valve_uid == 0 { "root".to_string() } else { valve_uid.to_string() };
        let mode = if meta.is_dir() { "go-w" } else { "600" };
        format!("{what} {p}: {why}: valve does not use it (run `chown {owner} {p} && chmod {mode} {p}`)")
    })
}

/// The 32-byte key kept in `path` (64 hex digits), or a new random one
/// written there first (mode 0600, never overwritten). An existing file is
/// read only if `judge` trusts it, from the same open file it is checked on.
pub fn key_in(path: &Path, what: &str) -> Result<[u8; 32], String> {
    let bad = |why: String| format!("{what} {}: {why}", path.display());
    let created =
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).custom_flags(libc::O_NOFOLLOW).open(path);
    match created {
        Ok(mut file) => {
            let mut key = [0u8; 32];
            if rustix::rand::getrandom(&mut key, rustix::rand::GetRandomFlags::empty()).ok() != Some(32) {
                let _ = std::fs::remove_file(path);
                return Err(bad("the kernel's random source (getrandom) failed: no key was made".into()));
            }
            file.write_all(format!("{}\n", hex(&key)).as_bytes())
                .and_then(|()| file.sync_all())
                .map_err(|e| bad(format!("cannot write it: {e}")))?;
            Ok(key)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(path)
                .map_err(|e| bad(format!("cannot read it: {e} (a symbolic link is not followed)")))?;
            let meta = file.metadata().map_err(|e| bad(format!("cannot read it: {e}")))?;
            judge_meta(path, what, &meta, Holds::Plain)?;
            let mut text = String::new();
            file.read_to_string(&mut text).map_err(|e| bad(format!("cannot read it: {e}")))?;
            unhex32(text.trim()).ok_or_else(|| {
                bad("it does not hold a key of 64 hex digits (move it away to start a new one: what it keyed then changes)"
                    .into())
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            let uid = rustix::process::geteuid().as_raw();
            let dir = path.parent().map(|d| d.display().to_string()).unwrap_or_default();
            Err(bad(format!(
                "cannot create it: {e} (valve runs as uid {uid}, which may not write in {dir}: give it that folder, or name one it may write with --state-dir)"
            )))
        }
        Err(e) => Err(bad(format!("cannot create it: {e}"))),
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// 32 bytes from 64 hex digits.
pub fn unhex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_trusted_only_if_no_other_user_can_change_it_nor_read_it_when_plain() {
        use Holds::*;
        // Root's or valve's own, written by the owner alone.
        assert_eq!(judge(0o100600, 0, 0, Plain), Ok(()));
        assert_eq!(judge(0o100400, 1000, 1000, Plain), Ok(()));
        // Readable by others: fine for hashes, not for plain secrets.
        assert_eq!(judge(0o100644, 0, 0, NoSecret), Ok(()));
        assert!(judge(0o100644, 0, 0, Plain).unwrap_err().contains("mode 0644 lets other users read"));
        assert!(judge(0o100640, 0, 0, Plain).unwrap_err().contains("0640"));
        // Writable by a group or by anyone: never.
        for mode in [0o100620, 0o100602, 0o100666, 0o100660] {
            let e = judge(mode, 0, 0, NoSecret).unwrap_err();
            assert!(e.contains(&format!("{:04o} lets other users change it", mode & 0o7777)), "{e}");
        }
        // Another user's file, however strict its mode.
        let e = judge(0o100600, 1000, 0, NoSecret).unwrap_err();
        assert!(e.contains("owned by uid 1000"), "{e}");
        assert!(judge(0o100600, 0, 1000, Plain).is_ok(), "root's file is trusted by valve as another user");
    }

    #[test]
    fn a_key_file_is_made_once_then_read_back_only_while_private() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("k.key");
        let k = key_in(&path, "the key").unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert_eq!(key_in(&path, "the key").unwrap(), k, "read back, never remade");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = key_in(&path, "the key").unwrap_err();
        assert!(e.contains(&path.display().to_string()) && e.contains("0644") && e.contains("chmod 600"), "{e}");
        let e = check(&path, "the key", Holds::Plain).unwrap_err();
        assert!(e.starts_with(&format!("the key {}", path.display())), "{e}");
        assert!(check(&path, "the key", Holds::NoSecret).is_ok());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, "nope\n").unwrap();
        assert!(key_in(&path, "the key").unwrap_err().contains("64 hex digits"));
        let link = d.path().join("link.key");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(key_in(&link, "the key").unwrap_err().contains("symbolic link"));
    }
}
