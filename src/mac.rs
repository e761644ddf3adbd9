//! valve's keyed MACs: HMAC-SHA-256 under keys drawn from the kernel's
//! random source when valve starts, kept in valve's memory only (never in
//! a worker's environment or files, never logged). Whatever valve signs or
//! hashes with a secret goes through here: the Shiny sticky cookie, the
//! forward-auth cache's keys, each frames worker's hello token, and the
//! keyed hash `usage_anonymize` stores instead of a user. That last key is
//! the one kept in a file (`Key::persistent`, mode 0600, beside the usage
//! log), so that a user hashes the same across restarts.

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// One secret key. Each use gets its own (a cookie key never keys a cache).
#[derive(Clone)]
pub struct Key([u8; 32]);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

impl Key {
    /// A new random key. The kernel's random source cannot fail on Linux
    /// once booted; if it did, valve could not keep any secret, so it stops.
    pub fn random() -> Key {
        let mut k = [0u8; 32];
        if rustix::rand::getrandom(&mut k, rustix::rand::GetRandomFlags::empty()).ok() != Some(32) {
            panic!("the kernel's random source (getrandom) failed: valve cannot make its keys");
        }
        Key(k)
    }

    /// The key kept in `path` (64 hex digits), or a new random one written
    /// there first (created mode 0600, never overwritten;
    /// an existing one is used only while no other user can read or change it). For a hash that
    /// must stay the same across restarts; any other key stays in memory.
    pub fn persistent(path: &std::path::Path) -> Result<Key, KeyFileError> {
        // The key file is checked before use (root's or valve's, mode 0600).
        crate::config::secret_file::key_in(path, "the key file").map(Key).map_err(|why| KeyFileError {
            path: path.display().to_string(),
            why: why.strip_prefix(&format!("the key file {}: ", path.display())).unwrap_or(&why).to_string(),
        })
    }

    /// The full 256-bit tag of `parts`, each length-prefixed so that no two
    /// different lists of parts give the same input.
    pub fn tag(&self, parts: &[&[u8]]) -> [u8; 32] {
        let mut mac = <HmacSha256 as Mac>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        for part in parts {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac.finalize().into_bytes().into()
    }

    /// The first 128 bits of the tag, as a number (a cache key, say).
    pub fn tag128(&self, parts: &[&[u8]]) -> u128 {
        let t = self.tag(parts);
        let mut first = [0u8; 16];
        first.copy_from_slice(&t[..16]);
        u128::from_be_bytes(first)
    }

    /// The first 128 bits of the tag in lowercase hex (32 characters).
    pub fn tag_hex(&self, parts: &[&[u8]]) -> String {
        hex(&self.tag(parts)[..16])
    }

    /// Whether `tag_hex` is this key's tag of `parts`, compared in constant time.
    pub fn verify_hex(&self, parts: &[&[u8]], tag_hex: &str) -> bool {
        same(self.tag_hex(parts).as_bytes(), tag_hex.as_bytes())
    }
}

/// Why a key file could not be used.
#[derive(Debug, thiserror::Error)]
#[error("the key file {path}: {why}")]
pub struct KeyFileError {
    pub path: String,
    pub why: String,
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Compares two secrets without leaking where they differ; lengths may differ.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_hmac_sha256_of_length_prefixed_parts() {
        let key = Key([7u8; 32]);
        let mut mac = <HmacSha256 as Mac>::new_from_slice(&[7u8; 32]).unwrap();
        mac.update(&3u64.to_be_bytes());
        mac.update(b"abc");
        let want: [u8; 32] = mac.finalize().into_bytes().into();
        assert_eq!(key.tag(&[b"abc"]), want);
        assert_ne!(key.tag(&[b"ab", b"c"]), key.tag(&[b"a", b"bc"]), "parts are framed");
        assert_eq!(key.tag_hex(&[b"abc"]).len(), 32, "128 bits");
        assert!(key.verify_hex(&[b"abc"], &key.tag_hex(&[b"abc"])));
        assert!(!key.verify_hex(&[b"abd"], &key.tag_hex(&[b"abc"])));
        assert!(!key.verify_hex(&[b"abc"], &key.tag_hex(&[b"abc"])[..31]));
    }

    #[test]
    fn a_persistent_key_is_created_0600_once_and_read_back_the_same() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage.key");
        let first = Key::persistent(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let again = Key::persistent(&path).unwrap();
        assert_eq!(first.tag(&[b"alice"]), again.tag(&[b"alice"]), "the same key after a restart");
        std::fs::write(&path, "not a key").unwrap();
        let err = Key::persistent(&path).unwrap_err().to_string();
        assert!(err.contains("usage.key") && err.contains("64 hex digits"), "{err}");
        let err = Key::persistent(&dir.path().join("no/such/dir/k")).unwrap_err().to_string();
        assert!(err.contains("cannot create it"), "{err}");
    }

    #[test]
    fn keys_differ_and_never_print() {
        let (a, b) = (Key::random(), Key::random());
        assert_ne!(a.tag(&[b"x"]), b.tag(&[b"x"]));
        assert_eq!(format!("{a:?}"), "Key(..)");
    }
}
