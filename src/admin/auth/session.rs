//! The dashboard's sessions: a random cookie value for each sign-in, kept
//! in memory only by its keyed hash (a valve that restarts forgets them: its
//! users sign in again), each with who signed in and the session's CSRF
//! token; bounded in number and in time.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::who::Who;
use crate::mac::Key;

/// The session cookie's name.
pub const COOKIE_NAME: &str = "valve_admin";

/// How long a session lasts after its sign-in.
pub const SESSION_LIFE: Duration = Duration::from_secs(12 * 3600);

/// The most sessions kept at once (the oldest goes first).
const MAX_SESSIONS: usize = 4096;

struct Session {
    who: Who,
    csrf: String,
    began: Instant,
}

/// Every live session, by the keyed hash of its cookie.
pub struct Sessions {
    key: Key,
    live: Mutex<HashMap<u128, Session>>,
}

impl Default for Sessions {
    fn default() -> Self {
        Sessions::new()
    }
}

impl Sessions {
    pub fn new() -> Sessions {
        Sessions { key: Key::random(), live: Mutex::new(HashMap::new()) }
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<u128, Session>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new session for `who`: its cookie value and its CSRF token.
    pub fn create(&self, who: Who) -> Option<(String, String)> {
        let (cookie, csrf) = (random_hex()?, random_hex()?);
        let mut live = self.live();
        live.retain(|_, s| s.began.elapsed() < SESSION_LIFE);
        if live.len() >= MAX_SESSIONS {
            if let Some(oldest) = live.iter().min_by_key(|(_, s)| s.began).map(|(k, _)| *k) {
                live.remove(&oldest);
            }
        }
        live.insert(self.key.tag128(&[cookie.as_bytes()]), Session { who, csrf: csrf.clone(), began: Instant::now() });
        Some((cookie, csrf))
    }

    /// Who the session of `cookie` is and its CSRF token, while it lasts.
    pub fn get(&self, cookie: &str) -> Option<(Who, String)> {
        let id = self.key.tag128(&[cookie.as_bytes()]);
        let mut live = self.live();
        match live.get(&id) {
            Some(s) if s.began.elapsed() < SESSION_LIFE => Some((s.who.clone(), s.csrf.clone())),
            Some(_) => {
                live.remove(&id);
                None
            }
            None => None,
        }
    }

    /// Ends the session of `cookie`.
    pub fn end(&self, cookie: &str) {
        self.live().remove(&self.key.tag128(&[cookie.as_bytes()]));
    }
}

/// 32 random bytes in hex, from the kernel's random source.
fn random_hex() -> Option<String> {
    let mut b = [0u8; 32];
    (rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()).ok() == Some(32))
        .then(|| crate::mac::hex(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_found_by_its_cookie_alone_and_ends_when_asked() {
        let s = Sessions::new();
        let (cookie, csrf) = s.create(Who::Operator("token".into())).unwrap();
        assert_ne!(cookie, csrf);
        assert_eq!(s.get(&cookie), Some((Who::Operator("token".into()), csrf)));
        assert_eq!(s.get("not-a-cookie"), None);
        s.end(&cookie);
        assert_eq!(s.get(&cookie), None);
        for _ in 0..MAX_SESSIONS + 10 {
            s.create(Who::Publisher("ann".into()));
        }
        assert!(s.live().len() <= MAX_SESSIONS, "bounded");
    }
}
