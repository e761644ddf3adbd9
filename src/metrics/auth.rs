//! The forward-auth service's counters (`valve_auth_requests_total`):
//! valve-wide, since `auth_url` is one for every app.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// How valve learnt (or failed to learn) who a request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthResult {
    /// The service answered 2xx.
    Allowed,
    /// The service answered 401 or 403: no identity.
    Denied,
    /// Any other answer, a timeout, or no connection: the request got 503.
    Error,
    /// The answer for the same credentials was still in the cache.
    Cached,
    /// No `Cookie` and no `Authorization`: not asked, no identity.
    Skipped,
}

impl AuthResult {
    const ALL: [AuthResult; 5] =
        [AuthResult::Allowed, AuthResult::Denied, AuthResult::Error, AuthResult::Cached, AuthResult::Skipped];

    fn as_str(self) -> &'static str {
        match self {
            AuthResult::Allowed => "allowed",
            AuthResult::Denied => "denied",
            AuthResult::Error => "error",
            AuthResult::Cached => "cached",
            AuthResult::Skipped => "skipped",
        }
    }
}

#[derive(Default)]
pub struct AuthCounts([AtomicU64; AuthResult::ALL.len()]);

impl AuthCounts {
    pub fn count(&self, result: AuthResult) {
        self.0[result as usize].fetch_add(1, Relaxed);
    }

    pub(super) fn render(&self, out: &mut String) {
        super::family::header(
            out,
            "valve_auth_requests_total",
            "counter",
            "Requests checked with the forward-auth service (auth_url), by result.",
        );
        for r in AuthResult::ALL {
            let _ = writeln!(
                out,
                "valve_auth_requests_total{{result=\"{}\"}} {}",
                r.as_str(),
                self.0[r as usize].load(Relaxed)
            );
        }
    }
}
