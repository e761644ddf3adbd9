//! The publishing keys file (`publish_keys_file`): one key a line, `NAME KEY`
//! or `NAME sha256:HEX` (the key's SHA-256, so the file need hold no secret),
//! and `admin` after it for a key that may act on every published app (the
//! others act on the apps they created); `#` starts a comment. valve keeps only the hashes in memory and compares
//! them whole, in constant time.

use std::path::Path;

use crate::config::secret_file::{hex, unhex32};
use sha2::{Digest, Sha256};

/// The shortest key valve accepts in the file: a guessable key is no key.
pub const MIN_KEY_CHARS: usize = 20;

/// The keys that may publish, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PublishKeys {
    keys: Vec<PublishKey>,
}

/// One key: its name (in logs and records, never the key) and its SHA-256.
#[derive(Clone, PartialEq, Eq)]
pub struct PublishKey {
    pub name: String,
    /// Marked `admin`: may act on every published app.
    pub admin: bool,
    sha256: [u8; 32],
}

impl std::fmt::Debug for PublishKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PublishKey({})", self.name)
    }
}

impl PublishKeys {
    /// The name of the key `presented`, if it is one of these. Every stored
    /// hash is compared whole, so the time taken says nothing about which
    /// came close.
    pub fn name_of(&self, presented: &str) -> Option<&str> {
        self.key_of(presented).map(|k| k.name.as_str())
    }

    /// The key `presented`, if it is one of these (compared as `name_of` does).
    pub fn key_of(&self, presented: &str) -> Option<&PublishKey> {
        let hash: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = None;
        for key in &self.keys {
            let differ = key.sha256.iter().zip(hash.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b));
            if differ == 0 && found.is_none() {
                found = Some(key);
            }
        }
        found
    }

    /// The names, in the file's order; a key's number (its account id for
    /// clients) is its place here, from 1.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|k| k.name.as_str())
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// Reads and checks the keys file; the error names the file, the line and what to write.
pub fn read_keys(path: &Path) -> Result<PublishKeys, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        let why = match e.kind() {
            std::io::ErrorKind::NotFound => "not found".to_string(),
            std::io::ErrorKind::PermissionDenied => "permission denied (valve's user must read it)".to_string(),
            _ => e.to_string(),
        };
        format!("publish_keys_file {}: {why} (one key a line: `NAME KEY` or `NAME sha256:HEX`; `valve publish-key NAME` makes one)", path.display())
    })?;
    super::super::secret_file::check(path, "publish_keys_file", holds(&text))?;
    parse_keys(&text).map_err(|e| format!("publish_keys_file {}:{e}", path.display()))
}

/// Parses a keys file; an error reads `LINE: why`.
pub fn parse_keys(text: &str) -> Result<PublishKeys, String> {
    let mut keys: Vec<PublishKey> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let (Some(name), Some(secret), marker, None) = (words.next(), words.next(), words.next(), words.next()) else {
            return Err(format!(
                "{n}: write `NAME KEY` or `NAME sha256:HEX` (two words, and `admin` for a key that may act on every app), not {:?}",
                shorten(line)
            ));
        };
        let admin = match marker {
            None => false,
            Some("admin") => true,
            Some(other) => {
                return Err(format!(
                    "{n}: the third word after the key of {name:?} must be `admin` (a key that may act on every published app), not {:?}",
                    shorten(other)
                ))
            }
        };
        if !super::super::model::valid_name(name) {
            return Err(format!("{n}: the key name {name:?} must be letters, digits, `-`, `_` or `.`"));
        }
        if keys.iter().any(|k| k.name == name) {
            return Err(format!("{n}: the key name {name:?} is used twice: give each key its own name"));
        }
        let sha256 = match secret.strip_prefix("sha256:") {
            Some(hex) => unhex32(hex).ok_or_else(|| {
                format!("{n}: sha256:{} is not a SHA-256 (64 hexadecimal digits)", shorten(hex))
            })?,
            None if secret.chars().count() < MIN_KEY_CHARS => {
                return Err(format!(
                    "{n}: the key of {name:?} is shorter than {MIN_KEY_CHARS} characters: make one with `valve publish-key {name}`"
                ))
            }
            None => Sha256::digest(secret.as_bytes()).into(),
        };
        keys.push(PublishKey { name: name.to_string(), admin, sha256 });
    }
    Ok(PublishKeys { keys })
}

/// What a keys file holds: a plain key on any line without a `sha256:` word
/// makes it a secret only its owner may read.
fn holds(text: &str) -> super::super::secret_file::Holds {
    let plain = text
        .lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .any(|l| !l.trim().is_empty() && !l.split_whitespace().any(|w| w.starts_with("sha256:")));
    if plain {
        super::super::secret_file::Holds::Plain
    } else {
        super::super::secret_file::Holds::NoSecret
    }
}

/// A new random key for `name` and the line that lets it publish (its hash:
/// the file holds no secret).
pub fn new_key(name: &str) -> Result<(String, String), String> {
    if !super::super::model::valid_name(name) {
        return Err(format!(
            "the key name {name:?} must be letters, digits, `-`, `_` or `.` (such as alice or ci-deploy)"
        ));
    }
    let mut bytes = [0u8; 24];
    match rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty()) {
        Ok(24) => {}
        _ => return Err("the kernel's random source (getrandom) failed: no key was made".into()),
    }
    let key = format!("valve_{}", hex(&bytes));
    let line = format!("{name} sha256:{}", hex(&Sha256::digest(key.as_bytes())));
    Ok((key, line))
}

fn shorten(s: &str) -> String {
    s.chars().take(40).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_hashed_keys_name_their_holder_and_nothing_else_does() {
        let (key, line) = new_key("ci").unwrap();
        let text = format!("# who may publish\nalice a-long-enough-secret-key-1234  # laptop\n\n{line}\n");
        let keys = parse_keys(&text).unwrap();
        assert_eq!(keys.names().collect::<Vec<_>>(), ["alice", "ci"]);
        assert_eq!(keys.name_of("a-long-enough-secret-key-1234"), Some("alice"));
        assert_eq!(keys.name_of(&key), Some("ci"), "the hashed line takes the key it was made for");
        assert_eq!(keys.name_of(&line), None);
        assert_eq!(keys.name_of(""), None);
        assert_eq!(keys.name_of("a-long-enough-secret-key-123"), None);
        assert!(!format!("{keys:?}").contains("secret"), "no key in debug output");
        assert!(key.starts_with("valve_") && key.len() > MIN_KEY_CHARS);
        assert_ne!(new_key("ci").unwrap().0, key, "random");
        assert!(!keys.key_of(&key).unwrap().admin, "two words: not an admin key");
    }

    #[test]
    fn a_third_word_admin_marks_an_admin_key_and_nothing_else_is_taken() {
        let long = "k".repeat(30);
        let keys = parse_keys(&format!("ops {long} admin # may act on every app\nann {long}x\n")).unwrap();
        assert_eq!(keys.key_of(&long).map(|k| (k.name.as_str(), k.admin)), Some(("ops", true)));
        assert_eq!(keys.key_of(&format!("{long}x")).map(|k| (k.name.as_str(), k.admin)), Some(("ann", false)));
        let e = parse_keys(&format!("ops {long} root\n")).unwrap_err();
        assert!(e.starts_with("1: the third word after the key of \"ops\" must be `admin`"), "{e}");
        let e = parse_keys(&format!("ops {long} admin extra\n")).unwrap_err();
        assert!(e.starts_with("1: write `NAME KEY`"), "{e}");
    }

    #[test]
    fn bad_lines_are_named_with_what_to_write() {
        let e = parse_keys("alice\n").unwrap_err();
        assert!(e.starts_with("1: write `NAME KEY`"), "{e}");
        let e = parse_keys("ok sha256:00\n").unwrap_err();
        assert!(e.starts_with("1: sha256:00 is not a SHA-256"), "{e}");
        let e = parse_keys("\nbob short\n").unwrap_err();
        assert!(e.starts_with("2: the key of \"bob\" is shorter than 20"), "{e}");
        assert!(e.contains("valve publish-key bob"), "{e}");
        let long = "x".repeat(30);
        let e = parse_keys(&format!("a {long}\na {long}y\n")).unwrap_err();
        assert!(e.starts_with("2: the key name \"a\" is used twice"), "{e}");
        let e = parse_keys(&format!("a/b {long}\n")).unwrap_err();
        assert!(e.contains("letters, digits"), "{e}");
        assert!(new_key("no way").is_err());
        let e = read_keys(Path::new("/nonexistent/keys")).unwrap_err();
        assert!(e.contains("/nonexistent/keys: not found") && e.contains("valve publish-key"), "{e}");
    }
}
