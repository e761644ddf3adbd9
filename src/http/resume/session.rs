//! One resumable session's task: it owns the worker's socket for the
//! session's whole life and the browser's socket while one is attached.
//! Worker messages are numbered and held until the browser acknowledges
//! them; browser messages reach the worker once each, in order.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::bound::Held;
use super::wire::{self, Arrival, FromBrowser, Inbox, Outbox, Payload};
use crate::app::Supervisor;
use crate::http::spans;
use crate::metrics::{SessionEnd, SessionUse};
use crate::worker::WorkerId;

pub type Ws = WebSocketStream<TokioIo<Upgraded>>;

/// The session is gone: start a new one.
pub const GONE: u16 = 4700;
/// A newer socket took this one's place.
const REPLACED: u16 = 4600;
/// The app ended the session on purpose: stay closed.
const ENDED: u16 = 4500;

/// Acknowledge browser messages this long after the first unacknowledged one…
const ACK_DELAY: Duration = Duration::from_millis(250);
/// …or at once when this many are unacknowledged.
const ACK_EVERY: u64 = 64;
/// A browser socket silent this long is taken for dead (the script pings every 15 s).
const SILENCE: Duration = Duration::from_secs(45);
/// The longest a write to a browser may take before its socket is taken for dead.
const WRITE_WAIT: Duration = Duration::from_secs(10);
/// Most messages held for one browser, whatever their size.
const MAX_HELD: usize = 10_000;

/// A browser's socket coming back, with the last message it got.
pub struct Attach {
    pub socket: Ws,
    pub last: u64,
}

pub struct Session {
    pub sid: String,
    pub window: Duration,
    pub sup: Arc<Supervisor>,
    pub worker_id: WorkerId,
    /// What every session holds, against the shared bound.
    pub held: Arc<Held>,
    /// Fired when valve stops holding sessions (the drain gave up).
    pub close: tokio_util::sync::CancellationToken,
    /// Fired when valve drains: a browser away now cannot come back here.
    pub drain: tokio_util::sync::CancellationToken,
    /// The session's length and reconnects, for metrics and the usage list (counted when the session ends).
    pub usage: SessionUse,
    /// The session's span, when traces are on: its resumes and how it ended.
    pub span: Option<crate::trace::Live>,
}

/// How the loop ended, and what the browser is told.
enum End {
    Because(SessionEnd),
    /// The worker closed the session with a close frame.
    Closed,
}

/// Waits for the next message from the browser, or forever if none is attached.
async fn from_browser(browser: &mut Option<Ws>) -> Option<Result<Message, tokio_tungstenite::tungstenite::Error>> {
    match browser {
        Some(ws) => ws.next().await,
        None => std::future::pending().await,
    }
}

/// Closes a socket with a code the script acts on.
pub async fn close_with(mut ws: Ws, code: u16, reason: &'static str) {
    let frame = CloseFrame { code: CloseCode::from(code), reason: reason.into() };
    let _ = tokio::time::timeout(WRITE_WAIT, ws.close(Some(frame))).await;
}

impl Session {
    pub async fn run(mut self, mut worker: Ws, first: Ws, token: &str, mut attached: mpsc::Receiver<Attach>) {
        let app = self.sup.settings.name.clone();
        let metrics = self.sup.metrics.clone();
        let bound = self.held.bounds.session;
        let window_ms = self.window.as_millis();
        let mut out = Outbox::default();
        let mut inbox = Inbox::default();
        let mut browser = Some(first);
        let mut away: Option<Instant> = None;
        let mut heard = Instant::now();
        let mut unacked = 0u64;
        let mut ack_at: Option<Instant> = None;
        let mut overflowing = false;

        self.send(&mut browser, wire::started(&self.sid, token, window_ms)).await;
        let end = loop {
            if browser.is_none() && away.is_none() {
                // Dropped (closed, broken, silent, or a write that failed): hold the session.
                away = Some(Instant::now());
                (unacked, ack_at) = (0, None);
                metrics.reconnects.dropped();
                tracing::debug!(app = %app, session = %self.sid, "a Shiny session's browser connection dropped; holding the session");
            }
            let deadline = [ack_at, away.map(|t| t + self.window), browser.as_ref().map(|_| heard + SILENCE)]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                _ = self.close.cancelled() => break End::Because(SessionEnd::Shutdown),
                _ = self.drain.cancelled(), if browser.is_none() => break End::Because(SessionEnd::Shutdown),
                msg = worker.next() => {
                    let payload = match msg {
                        Some(Ok(Message::Text(t))) => Payload::Text(t.to_string()),
                        Some(Ok(Message::Binary(b))) => Payload::Binary(b),
                        Some(Ok(Message::Close(_))) => break End::Closed,
                        Some(Ok(_)) => continue,
                        Some(Err(tokio_tungstenite::tungstenite::Error::Capacity(e))) => {
                            tracing::warn!(app = %app, session = %self.sid, error = %e,
                                "the app sent a WebSocket message larger than valve takes (64 MiB); ending the session");
                            break End::Because(SessionEnd::Overflow);
                        }
                        None | Some(Err(_)) => break End::Because(SessionEnd::Worker),
                    };
                    let len = payload.len();
                    let numbered = browser.as_ref().map(|_| payload.numbered(out.last_sent() + 1));
                    out.push(payload);
                    let fits = self.hold(len);
                    if !fits || out.bytes() > bound || out.held() > MAX_HELD {
                        if browser.is_none() {
                            tracing::warn!(app = %app, session = %self.sid, held_bytes = out.bytes(), bound_bytes = bound,
                                "a Shiny session's buffer passed its bound while its browser was away; ending the session (see --shiny-session-buffer, --shiny-buffer-total)");
                            metrics.reconnects.overflowed();
                            break End::Because(SessionEnd::Overflow);
                        }
                        // Attached: what the browser has not acknowledged is let go;
                        // only a resume that needs it is refused.
                        let freed = out.shed(bound / 2, MAX_HELD / 2);
                        self.release(freed);
                        if !overflowing {
                            tracing::warn!(app = %app, session = %self.sid, bound_bytes = bound,
                                "a Shiny session's browser acknowledges too slowly for its buffer; a dropped connection now starts a new session (see --shiny-session-buffer)");
                            metrics.reconnects.overflowed();
                            overflowing = true;
                        }
                    } else if out.bytes() < bound / 2 {
                        overflowing = false;
                    }
                    if let Some(m) = numbered {
                        self.send(&mut browser, m).await;
                    }
                }
                msg = from_browser(&mut browser) => {
                    let msg = match msg {
                        // 1001: the browser closes the socket because its page goes away
                        // (navigated, reloaded, closed): the session ends now, even if the
                        // script's goodbye did not make it out first.
                        Some(Ok(Message::Close(Some(f)))) if f.code == CloseCode::Away => {
                            break End::Because(SessionEnd::Left)
                        }
                        Some(Ok(Message::Close(_))) | None | Some(Err(_)) => {
                            browser = None;
                            continue;
                        }
                        Some(Ok(m)) => m,
                    };
                    heard = Instant::now();
                    let said = match wire::parse(msg) {
                        Ok(Some(said)) => said,
                        Ok(None) => continue,
                        Err(wire::Garbled(what)) => {
                            tracing::warn!(app = %app, session = %self.sid, problem = what, "a Shiny session's browser broke valve's protocol; ending the session");
                            break End::Because(SessionEnd::Protocol);
                        }
                    };
                    match said {
                        FromBrowser::Data { seq, payload } => match inbox.arrive(seq) {
                            Arrival::Next => {
                                // R may not read for a while (a long computation): valve
                                // waits, but never past its own shutdown.
                                let sent = tokio::select! {
                                    sent = worker.send(payload.plain()) => sent.is_ok(),
                                    _ = self.close.cancelled() => break End::Because(SessionEnd::Shutdown),
                                };
                                if !sent {
                                    break End::Because(SessionEnd::Worker);
                                }
                                unacked += 1;
                                if unacked >= ACK_EVERY {
                                    ack_at = Some(Instant::now());
                                } else {
                                    ack_at.get_or_insert(Instant::now() + ACK_DELAY);
                                }
                            }
                            Arrival::Again => {}
                            Arrival::Gap => {
                                tracing::warn!(app = %app, session = %self.sid, seq, expected = inbox.last + 1, "a Shiny session's browser skipped a message; ending the session");
                                break End::Because(SessionEnd::Protocol);
                            }
                        },
                        FromBrowser::Ack(n) => match out.ack(n) {
                            Ok(freed) => {
                                self.release(freed);
                            }
                            Err(_) => {
                                tracing::warn!(app = %app, session = %self.sid, ack = n, sent = out.last_sent(), "a Shiny session's browser acknowledged a message never sent; ending the session");
                                break End::Because(SessionEnd::Protocol);
                            }
                        },
                        FromBrowser::Ping => {
                            self.send(&mut browser, wire::pong()).await;
                        }
                        FromBrowser::Bye => break End::Because(SessionEnd::Left),
                        FromBrowser::Hello { .. } => {
                            tracing::warn!(app = %app, session = %self.sid, "a hello on an attached socket; ending the session");
                            break End::Because(SessionEnd::Protocol);
                        }
                    }
                }
                Some(back) = attached.recv() => {
                    if let Some(old) = browser.take() {
                        tokio::spawn(close_with(old, REPLACED, "replaced by a newer connection"));
                    }
                    let Some(resend) = out.resend_after(back.last) else {
                        let why = if back.last > out.last_sent() { SessionEnd::Protocol } else { SessionEnd::Overflow };
                        tracing::warn!(app = %app, session = %self.sid, last = back.last, sent = out.last_sent(),
                            "a browser came back missing messages valve no longer holds; ending the session");
                        tokio::spawn(close_with(back.socket, GONE, "session gone"));
                        break End::Because(why);
                    };
                    let resend: Vec<Message> = resend.map(|(seq, p)| p.numbered(*seq)).collect();
                    if let Ok(freed) = out.ack(back.last) {
                        self.release(freed);
                    }
                    browser = Some(back.socket);
                    let mut welcomed = self.send(&mut browser, wire::welcome(inbox.last, window_ms)).await;
                    for m in resend {
                        welcomed = welcomed && self.send(&mut browser, m).await;
                    }
                    (unacked, ack_at, heard) = (0, None, Instant::now());
                    if welcomed {
                        let was_away = away.take().map(|t| t.elapsed()).unwrap_or_default();
                        metrics.reconnects.resumed(was_away);
                        self.usage.reconnected();
                        if let Some(span) = &mut self.span {
                            spans::resumed(span, was_away);
                        }
                        tracing::debug!(app = %app, session = %self.sid, away_s = was_away.as_secs_f64(), "a browser came back to its Shiny session");
                    }
                }
                _ = tokio::time::sleep_until(deadline) => {
                    let now = Instant::now();
                    if ack_at.is_some_and(|t| t <= now) {
                        ack_at = None;
                        unacked = 0;
                        self.send(&mut browser, wire::ack(inbox.last)).await;
                    }
                    if away.is_some_and(|t| t + self.window <= now) {
                        tracing::info!(app = %app, session = %self.sid, window_s = self.window.as_secs_f64(),
                            "a Shiny session's browser stayed away past the reconnect window; ending the session");
                        break End::Because(SessionEnd::Window);
                    }
                    if browser.is_some() && heard + SILENCE <= now {
                        tracing::debug!(app = %app, session = %self.sid, "a Shiny session's browser went silent; holding the session");
                        browser = None;
                    }
                }
            }
        };

        // Browsers that were coming back as it ended start anew.
        attached.close();
        while let Ok(back) = attached.try_recv() {
            tokio::spawn(close_with(back.socket, GONE, "session gone"));
        }
        let why = match end {
            End::Closed => SessionEnd::Worker,
            End::Because(why) => why,
        };
        if let Some(ws) = browser.take() {
            match end {
                End::Closed => close_with(ws, ENDED, "the app ended the session").await,
                End::Because(SessionEnd::Left) => {}
                End::Because(_) => close_with(ws, GONE, "session gone").await,
            }
        }
        if !matches!(end, End::Closed | End::Because(SessionEnd::Worker)) {
            // Shiny ends the R session (onSessionEnded runs) on a close.
            let _ = tokio::time::timeout(WRITE_WAIT, worker.close(None)).await;
        }
        let held = out.bytes();
        self.release(held);
        metrics.reconnects.ended(why, away.map(|t| t.elapsed()));
        if let Some(span) = &mut self.span {
            spans::ended(span, why.as_str());
        }
        tracing::debug!(app = %app, session = %self.sid, worker = self.worker_id, reason = why.as_str(), "Shiny session ended");
    }

    /// Counts bytes held for the browser, in the shared bound and the app's
    /// gauge; false if the shared bound is passed.
    fn hold(&self, bytes: usize) -> bool {
        self.sup.metrics.reconnects.buffered(bytes as i64);
        self.held.hold(bytes)
    }

    fn release(&self, bytes: usize) {
        self.sup.metrics.reconnects.buffered(-(bytes as i64));
        self.held.release(bytes);
    }

    /// Writes to the attached browser; on failure (or no write within
    /// `WRITE_WAIT`) the browser is taken for gone. False if it is.
    async fn send(&self, browser: &mut Option<Ws>, msg: Message) -> bool {
        let Some(ws) = browser.as_mut() else { return false };
        match tokio::time::timeout(WRITE_WAIT, ws.send(msg)).await {
            Ok(Ok(())) => true,
            _ => {
                *browser = None;
                false
            }
        }
    }
}
