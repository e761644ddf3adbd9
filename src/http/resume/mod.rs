//! Shiny sessions that outlive their connections (design note:
//! docs/design/shiny-reconnect.md).
//!
//! valve's client script opens each socket offering the subprotocol
//! `valve-shiny.1`. For such a socket valve ends the WebSocket on both legs
//! instead of splicing bytes: the worker's socket belongs to a *session*
//! that lives on while its browser is away (up to the app's reconnect
//! window), every message is numbered and held until the browser
//! acknowledges it, and a browser that presents the session's secret on a
//! new socket (`valve-resume`) gets what it missed, in order, once. A
//! session's worker sees one plain Shiny socket throughout.
//!
//! Rooms: `wire` (the messages and the numbering, pure), `inject` (the
//! script tag in Shiny's pages, pure), `session` (one session's task).

mod bound;
mod inject;
mod session;
mod wire;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderValue};
use http::{Response, StatusCode};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::app::Supervisor;
use crate::http::reply::{error, ReplyBody};
use crate::worker::WorkerId;

pub use bound::Bounds;
use bound::Held;
pub use inject::{inject, script, script_src, wants_script, MAX_PAGE};
use session::{close_with, Attach, Session, Ws};

/// The subprotocol valve's client script offers on every socket.
pub const PROTOCOL: &str = "valve-shiny.1";
/// Offered beside it on a socket that comes back to a session.
const RESUME: &str = "valve-resume";
/// Offered beside it on a new session's socket that replaces one that is gone.
const RESTART: &str = "valve-restart";

/// How long a resume socket may take to say which session it wants.
const HELLO_WAIT: Duration = Duration::from_secs(10);
/// Resume sockets that have not said which session they want, at most;
/// past it, a resume is answered 503 (each may hold `BROWSER_MESSAGE` bytes).
const HELLOS_WAITING: usize = 16;
/// The largest message a browser may send (Shiny's inputs; uploads are HTTP).
const BROWSER_MESSAGE: usize = 8 << 20;
/// The largest message a worker may send.
const WORKER_MESSAGE: usize = 64 << 20;
/// How long a resume may wait for its session to take it (a session busy
/// writing to an R that does not read).
const ATTACH_WAIT: Duration = Duration::from_secs(10);

/// What a WebSocket upgrade asks of valve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offer {
    /// A plain Shiny socket (no script, or reconnect off): spliced as bytes.
    Plain,
    /// A new session; `restart`: it replaces one that was gone.
    New { restart: bool },
    /// Back to a session.
    Resume,
}

/// Reads the subprotocols a WebSocket upgrade offers.
pub fn offer(headers: &HeaderMap) -> Offer {
    let offered: Vec<&str> = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    if !offered.contains(&PROTOCOL) {
        Offer::Plain
    } else if offered.contains(&RESUME) {
        Offer::Resume
    } else {
        Offer::New { restart: offered.contains(&RESTART) }
    }
}

/// The worker gets a plain Shiny socket: no subprotocol, no compression.
pub fn plain_upgrade(headers: &mut HeaderMap) {
    headers.remove(header::SEC_WEBSOCKET_PROTOCOL);
    headers.remove(header::SEC_WEBSOCKET_EXTENSIONS);
}

/// Says in the browser's 101 that valve speaks the protocol.
pub fn speaks(headers: &mut HeaderMap) {
    headers.remove(header::SEC_WEBSOCKET_EXTENSIONS);
    headers.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(PROTOCOL));
}

/// A session as the table knows it: enough to check a resume and hand it over.
struct Entry {
    app: String,
    token: String,
    attach: mpsc::Sender<Attach>,
}

/// Every resumable session of this valve, by id.
pub struct Resumes {
    table: Mutex<HashMap<String, Entry>>,
    /// Bytes held for browsers now, across sessions.
    held: Arc<Held>,
    tasks: TaskTracker,
    close: CancellationToken,
    /// Fired when valve drains: no browser can come back to it any more.
    drain: CancellationToken,
    /// A place for each resume socket waiting for its hello (`HELLOS_WAITING`).
    hellos: Arc<tokio::sync::Semaphore>,
}

impl Resumes {
    pub fn new(bounds: Bounds, tasks: TaskTracker, close: CancellationToken) -> Self {
        Resumes {
            table: Mutex::new(HashMap::new()),
            held: Arc::new(Held::new(bounds)),
            tasks,
            close,
            drain: CancellationToken::new(),
            hellos: Arc::new(tokio::sync::Semaphore::new(HELLOS_WAITING)),
        }
    }

    /// valve stops accepting connections: sessions whose browser is away end
    /// now (it cannot come back here); attached ones serve on until the drain
    /// closes them (4700: their pages start anew elsewhere).
    pub fn draining(&self) {
        self.drain.cancel();
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new session: once both upgrades complete, its task runs until the
    /// session ends, counting on its worker all that time (and its span,
    /// if any, lasts as long).
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        self: &Arc<Self>,
        client: OnUpgrade,
        worker: OnUpgrade,
        sup: Arc<Supervisor>,
        id: WorkerId,
        browser: u64,
        window: Duration,
        restart: bool,
        user: Option<String>,
        span: Option<crate::trace::Live>,
    ) {
        let resumes = self.clone();
        self.tasks.spawn(async move {
            let (Ok(client), Ok(worker)) = tokio::join!(client, worker) else {
                if let Some(span) = span {
                    span.discard();
                }
                return;
            };
            let usage = sup.metrics.session(id, user.as_deref());
            let _user = user.map(|u| sup.signed_in(id, u));
            let client = socket(client, Role::Server, BROWSER_MESSAGE).await;
            let worker = socket(worker, Role::Client, WORKER_MESSAGE).await;
            sup.session(id, true, Some(browser));
            if restart {
                sup.metrics.reconnects.restarted();
            }
            let (sid, token) = (random_hex(12), random_hex(16));
            let (attach, attached) = mpsc::channel(4);
            resumes.table().insert(sid.clone(), Entry { app: sup.settings.name.clone(), token: token.clone(), attach });
            tracing::debug!(app = %sup.settings.name, worker = id, session = %sid, "Shiny session opened (resumable)");
            let session = Session {
                sid: sid.clone(),
                window,
                sup: sup.clone(),
                worker_id: id,
                held: resumes.held.clone(),
                close: resumes.close.clone(),
                drain: resumes.drain.clone(),
                usage,
                span,
            };
            session.run(worker, client, &token, attached).await;
            resumes.table().remove(&sid);
            sup.session(id, false, None);
        });
    }

    /// A browser coming back: valve answers the upgrade itself (no worker is
    /// asked), then hands the socket to its session if it names one of
    /// `app`'s with the right secret, else closes it with 4700.
    pub fn resume(self: &Arc<Self>, client: OnUpgrade, key: &HeaderValue, sup: Arc<Supervisor>) -> Response<ReplyBody> {
        let Ok(waiting) = self.hellos.clone().try_acquire_owned() else {
            let mut resp = error(StatusCode::SERVICE_UNAVAILABLE, "too many reconnects at once; try again");
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return resp;
        };
        let resumes = self.clone();
        self.tasks.spawn(async move {
            let Ok(client) = client.await else { return };
            let mut ws = socket(client, Role::Server, BROWSER_MESSAGE).await;
            let hello = tokio::time::timeout(HELLO_WAIT, futures_util::StreamExt::next(&mut ws)).await;
            drop(waiting);
            let said = match hello {
                Ok(Some(Ok(msg))) => wire::parse(msg).ok().flatten(),
                _ => None,
            };
            let app = &sup.settings.name;
            let Some(wire::FromBrowser::Hello { sid, token, last }) = said else {
                tracing::debug!(app = %app, "a resume socket said nothing valve understands; closed");
                sup.metrics.reconnects.refused();
                close_with(ws, session::GONE, "no such session").await;
                return;
            };
            // A session id is 24 hex digits; anything else names none (and is not logged).
            let plausible = sid.len() == 24 && sid.bytes().all(|b| b.is_ascii_hexdigit());
            let attach = plausible
                .then(|| {
                    resumes
                        .table()
                        .get(&sid)
                        .filter(|e| e.app == *app && same_secret(&e.token, &token))
                        .map(|e| e.attach.clone())
                })
                .flatten();
            if let Some(attach) = attach {
                match attach.send_timeout(Attach { socket: ws, last }, ATTACH_WAIT).await {
                    Ok(()) => return,
                    Err(mpsc::error::SendTimeoutError::Timeout(back) | mpsc::error::SendTimeoutError::Closed(back)) => {
                        // The session ended meanwhile (or is stuck): start anew.
                        sup.metrics.reconnects.refused();
                        close_with(back.socket, session::GONE, "no such session").await;
                        return;
                    }
                }
            }
            tracing::debug!(app = %app, session = %if plausible { sid.as_str() } else { "(not an id)" },
                "a resume named no open session of this app with that secret; the browser starts a new session");
            sup.metrics.reconnects.refused();
            close_with(ws, session::GONE, "no such session").await;
        });
        let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
        let mut resp = Response::new(ReplyBody::Empty);
        *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let h = resp.headers_mut();
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        if let Ok(accept) = HeaderValue::from_str(&accept) {
            h.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
        }
        speaks(h);
        resp
    }
}

/// A WebSocket over an upgraded connection, taking messages up to `max` bytes.
async fn socket(io: hyper::upgrade::Upgraded, role: Role, max: usize) -> Ws {
    let config = WebSocketConfig::default().max_message_size(Some(max)).max_frame_size(Some(max));
    WebSocketStream::from_raw_socket(TokioIo::new(io), role, Some(config)).await
}

/// `n` random bytes from the OS, in hex.
fn random_hex(n: usize) -> String {
    let mut bytes = vec![0u8; n];
    let mut filled = 0;
    while filled < n {
        match rustix::rand::getrandom(&mut bytes[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(k) => filled += k,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => panic!("the OS has no random numbers for a session secret: {e}"),
        }
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares secrets in time that does not depend on where they differ.
fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offered(values: &[&str]) -> Offer {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_str(v).unwrap());
        }
        offer(&h)
    }

    #[test]
    fn the_subprotocols_say_what_a_socket_wants() {
        assert_eq!(offered(&[]), Offer::Plain);
        assert_eq!(offered(&["chat"]), Offer::Plain);
        assert_eq!(offered(&["valve-resume"]), Offer::Plain, "resume without the protocol means nothing");
        assert_eq!(offered(&["valve-shiny.1"]), Offer::New { restart: false });
        assert_eq!(offered(&["valve-shiny.1, valve-restart"]), Offer::New { restart: true });
        assert_eq!(offered(&["valve-shiny.1", "valve-resume"]), Offer::Resume);
    }

    #[test]
    fn secrets_are_random_hex_and_compared_whole() {
        let (a, b) = (random_hex(16), random_hex(16));
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        assert!(same_secret(&a, &a.clone()));
        assert!(!same_secret(&a, &b));
        assert!(!same_secret(&a, &a[..31]));
        assert!(!same_secret("", "x"));
    }
}
