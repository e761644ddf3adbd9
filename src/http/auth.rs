//! Forward auth (`auth_url`, the pattern of nginx `auth_request` and Traefik
//! ForwardAuth): before the gate, valve asks the auth service about a request
//! to an app with its `Cookie` and `Authorization` and learns who it is
//! (`Named::ByAuth`), or that the service cannot say (the front answers 503
//! and no worker is taken). Answers are cached briefly by a keyed hash of
//! the credentials, never by the credentials themselves. What an answer
//! means (`verdict`) and the cache are pure; `Asker` does the I/O.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::client::conn::http1::SendRequest;

use super::access::{self, Named};
use super::forwarded::origin;
use super::identity::{from_auth_answer, Identity};
use crate::config::{AuthService, Trust};
use crate::metrics::{AuthResult, Registry};

/// The longest valve waits for the auth service (connecting included).
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(5);

/// The most answers the cache holds; when full, expired ones go, and if
/// none had expired, all of them.
pub const CACHE_ENTRIES: usize = 10_000;

/// Idle connections to the auth service kept for the next question.
const IDLE_CONNECTIONS: usize = 32;

/// The most of an answer's body valve reads (and throws away).
const MAX_ANSWER_BODY: usize = 64 * 1024;

/// How often, at most, a failing auth service is logged.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The auth service could not say who is calling: the request gets 503.
#[derive(Debug)]
pub struct Unavailable;

/// What an answer says: who (`None`: nobody) or that it says nothing valve can use.
pub fn verdict(status: StatusCode, headers: &HeaderMap, trust: &Trust) -> Result<Option<Identity>, String> {
    match status.as_u16() {
        200..=299 => from_auth_answer(headers, trust).map_err(|bad| format!("its answer's identity header: {bad:?}")),
        401 | 403 => Ok(None),
        other => Err(format!("it answered {other}")),
    }
}

/// Recent answers, by a keyed 128-bit hash of (auth URL, Cookie, Authorization).
struct Cache {
    entries: HashMap<u128, (Instant, Option<Identity>)>,
    key: crate::mac::Key,
}

impl Cache {
    fn new() -> Self {
        Cache { entries: HashMap::new(), key: crate::mac::Key::random() }
    }

    fn key(&self, url: &str, cookie: &[u8], authorization: &[u8]) -> u128 {
        self.key.tag128(&[url.as_bytes(), cookie, authorization])
    }

    fn get(&mut self, key: u128, now: Instant, ttl: Duration) -> Option<Option<Identity>> {
        match self.entries.get(&key) {
            Some((at, who)) if now.saturating_duration_since(*at) < ttl => Some(who.clone()),
            Some(_) => {
                self.entries.remove(&key);
                None
            }
            None => None,
        }
    }

    fn put(&mut self, key: u128, now: Instant, ttl: Duration, who: Option<Identity>) {
        if self.entries.len() >= CACHE_ENTRIES && !self.entries.contains_key(&key) {
            self.entries.retain(|_, (at, _)| now.saturating_duration_since(*at) < ttl);
            if self.entries.len() >= CACHE_ENTRIES {
                self.entries.clear();
            }
        }
        self.entries.insert(key, (now, who));
    }
}

/// Asks the auth service, keeps its connections and its recent answers.
pub struct Asker {
    cache: Mutex<Cache>,
    idle: Mutex<Vec<(String, SendRequest<Empty<Bytes>>)>>,
    registry: Arc<Registry>,
    last_warning: Mutex<Option<Instant>>,
    unlogged: AtomicU64,
}

/// The request being asked about.
pub struct Question<'a> {
    pub method: &'a Method,
    pub headers: &'a HeaderMap,
    /// Its path and query.
    pub target: &'a str,
    pub peer: SocketAddr,
}

impl Asker {
    pub fn new(registry: Arc<Registry>) -> Self {
        Asker {
            cache: Mutex::new(Cache::new()),
            idle: Mutex::new(Vec::new()),
            registry,
            last_warning: Mutex::new(None),
            unlogged: AtomicU64::new(0),
        }
    }

    /// Where this request's identity comes from under `trust`: its headers
    /// (no `auth_url`), or what the auth service says of its credentials.
    pub async fn named(&self, trust: &Trust, q: &Question<'_>) -> Result<Named, Unavailable> {
        let Some(service) = &trust.auth else { return Ok(Named::ByHeaders) };
        let credential = |name| {
            q.headers.get_all(name).iter().fold(Vec::new(), |mut all, v| {
                all.extend_from_slice(v.as_bytes());
                all.push(b'\n');
                all
            })
        };
        let (cookie, authorization) = (credential(header::COOKIE), credential(header::AUTHORIZATION));
        if cookie.is_empty() && authorization.is_empty() {
            // Nothing to vouch for: an auth service would answer 401.
            self.registry.auth.count(AuthResult::Skipped);
            return Ok(Named::ByAuth(None));
        }
        let ttl = service.cache;
        let key = {
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            let key = cache.key(&service.url, &cookie, &authorization);
            if !ttl.is_zero() {
                if let Some(who) = cache.get(key, Instant::now(), ttl) {
                    self.registry.auth.count(AuthResult::Cached);
                    return Ok(Named::ByAuth(who));
                }
            }
            key
        };
        let asked = tokio::time::timeout(AUTH_TIMEOUT, self.ask(service, trust, q)).await;
        let who = match asked.unwrap_or_else(|_| Err(format!("no answer within {} s", AUTH_TIMEOUT.as_secs()))) {
            Ok(who) => who,
            Err(why) => {
                self.registry.auth.count(AuthResult::Error);
                self.warn(service, &why);
                return Err(Unavailable);
            }
        };
        self.registry.auth.count(if who.is_some() { AuthResult::Allowed } else { AuthResult::Denied });
        if !ttl.is_zero() {
            self.cache.lock().unwrap_or_else(|p| p.into_inner()).put(key, Instant::now(), ttl, who.clone());
        }
        Ok(Named::ByAuth(who))
    }

    /// One question over a kept connection, or a new one; a kept connection
    /// the service had closed meanwhile is tried once more on a new one.
    async fn ask(&self, service: &AuthService, trust: &Trust, q: &Question<'_>) -> Result<Option<Identity>, String> {
        let question = || build(service, trust, q);
        let answer = match self.kept(service) {
            Some(mut sender) => match sender.send_request(question()?).await {
                Ok(answer) => Ok((answer, sender)),
                Err(_) => self.fresh(service, question()?).await,
            },
            None => self.fresh(service, question()?).await,
        };
        let (answer, sender) = answer?;
        let (parts, body) = answer.into_parts();
        // Read the body to its end, so the connection can take the next question.
        if Limited::new(body, MAX_ANSWER_BODY).collect().await.is_ok() {
            self.keep(service, sender);
        }
        verdict(parts.status, &parts.headers, trust)
    }

    async fn fresh(
        &self,
        service: &AuthService,
        req: Request<Empty<Bytes>>,
    ) -> Result<(http::Response<hyper::body::Incoming>, SendRequest<Empty<Bytes>>), String> {
        let mut sender = crate::client::connect(&service.host, service.port, "auth").await?;
        let answer = sender.send_request(req).await.map_err(|e| e.to_string())?;
        Ok((answer, sender))
    }

    fn kept(&self, service: &AuthService) -> Option<SendRequest<Empty<Bytes>>> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(i) = idle.iter().rposition(|(authority, _)| *authority == service.authority) {
            let (_, sender) = idle.swap_remove(i);
            if sender.is_ready() {
                return Some(sender);
            }
        }
        None
    }

    fn keep(&self, service: &AuthService, sender: SendRequest<Empty<Bytes>>) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        idle.retain(|(_, s)| !s.is_closed());
        if idle.len() < IDLE_CONNECTIONS {
            idle.push((service.authority.clone(), sender));
        }
    }

    /// One warning per `WARN_EVERY` at most, saying how many went unlogged.
    fn warn(&self, service: &AuthService, why: &str) {
        let now = Instant::now();
        let mut last = self.last_warning.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|at| now.saturating_duration_since(at) < WARN_EVERY) {
            self.unlogged.fetch_add(1, Ordering::Relaxed);
            return;
        }
        *last = Some(now);
        let unlogged = self.unlogged.swap(0, Ordering::Relaxed);
        tracing::warn!(auth_url = %service.url, error = %why, unlogged, "the forward-auth service could not say who is calling; answering 503");
    }
}

/// The question for the auth service: GET its URL with the request's
/// credentials and where it was going, as Traefik's ForwardAuth asks.
fn build(service: &AuthService, trust: &Trust, q: &Question) -> Result<Request<Empty<Bytes>>, String> {
    let trusted = trust.trusts(q.peer.ip());
    let mut req = Request::get(service.path.as_str())
        .body(Empty::new())
        .map_err(|e| format!("{} is not a URL valve can ask: {e}", service.url))?;
    let h = req.headers_mut();
    let put = |h: &mut HeaderMap, name: &'static str, value: &str| {
        if let Ok(v) = HeaderValue::from_str(value) {
            h.insert(HeaderName::from_static(name), v);
        }
    };
    if let Ok(host) = HeaderValue::from_str(&service.authority) {
        h.insert(header::HOST, host);
    }
    for name in [header::COOKIE, header::AUTHORIZATION] {
        for v in q.headers.get_all(&name) {
            h.append(name.clone(), v.clone());
        }
    }
    let (proto, host) = origin(q.headers, trusted).unwrap_or_else(|| ("http".into(), String::new()));
    put(h, "x-forwarded-method", q.method.as_str());
    put(h, "x-forwarded-proto", &proto);
    put(h, "x-forwarded-host", &host);
    put(h, "x-forwarded-uri", q.target);
    put(h, "x-forwarded-for", &access::client(trust, q.peer, q.headers).ip().to_string());
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_names_the_caller_nobody_or_nothing_usable() {
        let t = Trust::default();
        let mut h = HeaderMap::new();
        h.insert("x-auth-request-user", HeaderValue::from_static("alice"));
        assert_eq!(verdict(StatusCode::ACCEPTED, &h, &t).unwrap().unwrap().user, "alice");
        assert_eq!(verdict(StatusCode::OK, &HeaderMap::new(), &t), Ok(None), "2xx naming nobody");
        for denied in [StatusCode::UNAUTHORIZED, StatusCode::FORBIDDEN] {
            assert_eq!(verdict(denied, &h, &t), Ok(None), "{denied}: no identity, whatever the headers");
        }
        for broken in [StatusCode::FOUND, StatusCode::NOT_FOUND, StatusCode::INTERNAL_SERVER_ERROR] {
            assert!(verdict(broken, &h, &t).is_err(), "{broken}");
        }
        h.insert("x-auth-request-user", HeaderValue::from_bytes(b"al\xffice").unwrap());
        assert!(verdict(StatusCode::OK, &h, &t).is_err(), "an identity valve cannot pass on");
    }

    #[test]
    fn the_cache_keeps_answers_for_their_time_and_stays_bounded() {
        let mut c = Cache::new();
        let (now, ttl) = (Instant::now(), Duration::from_secs(5));
        let alice = Some(Identity { user: "alice".into(), email: None, groups: vec![] });
        let k = c.key("http://a/auth", b"session=alice\n", b"");
        assert_ne!(k, c.key("http://a/auth", b"session=bob\n", b""));
        assert_ne!(k, c.key("http://b/auth", b"session=alice\n", b""), "another service: another key");
        c.put(k, now, ttl, alice.clone());
        assert_eq!(c.get(k, now + Duration::from_secs(4), ttl), Some(alice));
        assert_eq!(c.get(k, now + ttl, ttl), None, "expired");
        assert!(c.entries.is_empty(), "an expired answer is dropped when seen");
        for i in 0..CACHE_ENTRIES as u128 {
            c.put(i, now, ttl, None);
        }
        c.put(u128::MAX, now + ttl, ttl, None);
        assert_eq!(c.entries.len(), 1, "full of expired answers: they go");
        for i in 0..CACHE_ENTRIES as u128 {
            c.put(i, now, ttl, None);
        }
        c.put(u128::MAX - 1, now, ttl, None);
        assert!(c.entries.len() <= CACHE_ENTRIES, "full of live answers: cleared, never past the bound");
    }
}
