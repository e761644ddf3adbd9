//! valve-shiny/1, the messages between valve and its client script
//! (docs/design/shiny-reconnect.md, 3.3), and the numbering on each side:
//! pure, no I/O.
//!
//! Data is numbered 1, 2, 3… per direction and session: text as
//! `m<seq>:<payload>`, binary as the byte `m`, the number (u64, big-endian)
//! and the payload. Acknowledgements name the last number received.

use std::collections::VecDeque;

use bytes::Bytes;
use tokio_tungstenite::tungstenite::Message;

/// A message's content, as Shiny sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Payload {
    Text(String),
    Binary(Bytes),
}

impl Payload {
    pub fn len(&self) -> usize {
        match self {
            Payload::Text(t) => t.len(),
            Payload::Binary(b) => b.len(),
        }
    }

    /// As the worker gets it (or sent it).
    pub fn plain(self) -> Message {
        match self {
            Payload::Text(t) => Message::text(t),
            Payload::Binary(b) => Message::binary(b),
        }
    }

    /// Numbered, for the browser.
    pub fn numbered(&self, seq: u64) -> Message {
        match self {
            Payload::Text(t) => Message::text(format!("m{seq}:{t}")),
            Payload::Binary(b) => {
                let mut framed = Vec::with_capacity(9 + b.len());
                framed.push(b'm');
                framed.extend_from_slice(&seq.to_be_bytes());
                framed.extend_from_slice(b);
                Message::binary(framed)
            }
        }
    }
}

/// What the browser's script says.
#[derive(Debug, PartialEq, Eq)]
pub enum FromBrowser {
    /// First message on a resume: the session, its secret, the last message it got.
    Hello {
        sid: String,
        token: String,
        last: u64,
    },
    Data {
        seq: u64,
        payload: Payload,
    },
    Ack(u64),
    Ping,
    Bye,
}

/// A message valve cannot read (a protocol error).
#[derive(Debug, PartialEq, Eq)]
pub struct Garbled(pub &'static str);

/// Reads one browser message; `None` for WebSocket control frames.
pub fn parse(msg: Message) -> Result<Option<FromBrowser>, Garbled> {
    match msg {
        Message::Text(t) => parse_text(t.as_str()).map(Some),
        Message::Binary(b) => {
            if b.len() < 9 || b[0] != b'm' {
                return Err(Garbled("a binary message without its number"));
            }
            let seq = u64::from_be_bytes(b[1..9].try_into().unwrap_or_default());
            Ok(Some(FromBrowser::Data { seq, payload: Payload::Binary(b.slice(9..)) }))
        }
        Message::Ping(_) | Message::Pong(_) | Message::Close(_) | Message::Frame(_) => Ok(None),
    }
}

fn parse_text(t: &str) -> Result<FromBrowser, Garbled> {
    let number = |s: &str| s.parse::<u64>().map_err(|_| Garbled("a number that is not one"));
    match t.as_bytes().first() {
        Some(b'm') => {
            let (seq, payload) = t[1..].split_once(':').ok_or(Garbled("a data message without ':'"))?;
            Ok(FromBrowser::Data { seq: number(seq)?, payload: Payload::Text(payload.to_string()) })
        }
        Some(b'a') => Ok(FromBrowser::Ack(number(&t[1..])?)),
        _ if t == "p" => Ok(FromBrowser::Ping),
        _ if t == "b" => Ok(FromBrowser::Bye),
        Some(b'h') => {
            let mut words = t.split(' ');
            match (words.next(), words.next(), words.next(), words.next(), words.next()) {
                (Some("h"), Some(sid), Some(token), Some(last), None) => {
                    Ok(FromBrowser::Hello { sid: sid.to_string(), token: token.to_string(), last: number(last)? })
                }
                _ => Err(Garbled("a hello that is not `h <sid> <token> <last>`")),
            }
        }
        _ => Err(Garbled("an unknown message")),
    }
}

/// valve's first message on a new session's socket.
pub fn started(sid: &str, token: &str, window_ms: u128) -> Message {
    Message::text(format!("s {sid} {token} {window_ms}"))
}

/// valve's first message on a resumed socket.
pub fn welcome(last: u64, window_ms: u128) -> Message {
    Message::text(format!("w {last} {window_ms}"))
}

pub fn ack(last: u64) -> Message {
    Message::text(format!("a{last}"))
}

pub fn pong() -> Message {
    Message::text("q")
}

/// What the browser sent, in order: the number of the last message the
/// worker got.
#[derive(Debug, Default)]
pub struct Inbox {
    pub last: u64,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Arrival {
    /// The next one: hand it to the worker.
    Next,
    /// Sent again after a resume; the worker has it.
    Again,
    /// One is missing: the browser broke the protocol.
    Gap,
}

impl Inbox {
    pub fn arrive(&mut self, seq: u64) -> Arrival {
        if seq <= self.last {
            Arrival::Again
        } else if seq == self.last + 1 {
            self.last = seq;
            Arrival::Next
        } else {
            Arrival::Gap
        }
    }
}

/// What the worker sent the browser and the browser has not acknowledged:
/// kept to be sent again after a resume, within a bound.
#[derive(Debug)]
pub struct Outbox {
    /// The number the next message gets.
    next: u64,
    held: VecDeque<(u64, Payload)>,
    bytes: usize,
    /// Messages up to this number were let go unacknowledged (over the
    /// bound): a browser that did not get them cannot resume.
    lost_up_to: u64,
}

/// An acknowledgement of a message never sent.
#[derive(Debug, PartialEq, Eq)]
pub struct AckTooHigh;

impl Default for Outbox {
    fn default() -> Self {
        Outbox { next: 1, held: VecDeque::new(), bytes: 0, lost_up_to: 0 }
    }
}

impl Outbox {
    /// Numbers and holds a message; returns its number.
    pub fn push(&mut self, payload: Payload) -> u64 {
        let seq = self.next;
        self.next += 1;
        self.bytes += payload.len();
        self.held.push_back((seq, payload));
        seq
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// The number of the last message pushed (0: none yet).
    pub fn last_sent(&self) -> u64 {
        self.next - 1
    }

    /// The browser has everything up to `n`: let it go. Returns the bytes freed.
    pub fn ack(&mut self, n: u64) -> Result<usize, AckTooHigh> {
        if n > self.last_sent() {
            return Err(AckTooHigh);
        }
        let mut freed = 0;
        while self.held.front().is_some_and(|(seq, _)| *seq <= n) {
            if let Some((_, p)) = self.held.pop_front() {
                freed += p.len();
            }
        }
        self.bytes -= freed;
        Ok(freed)
    }

    /// Lets the oldest messages go until at most `max_bytes` and `max_held`
    /// remain (always keeping the newest). Returns the bytes freed.
    pub fn shed(&mut self, max_bytes: usize, max_held: usize) -> usize {
        let mut freed = 0;
        while self.held.len() > 1 && (self.bytes - freed > max_bytes || self.held.len() > max_held) {
            if let Some((seq, p)) = self.held.pop_front() {
                freed += p.len();
                self.lost_up_to = seq;
            }
        }
        self.bytes -= freed;
        freed
    }

    /// What to send a browser that got everything up to `last`, or `None`
    /// if some of it was let go (it must start a new session).
    pub fn resend_after(&self, last: u64) -> Option<impl Iterator<Item = &(u64, Payload)>> {
        (last >= self.lost_up_to && last <= self.last_sent()).then(|| self.held.iter().filter(move |(s, _)| *s > last))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Payload {
        Payload::Text(s.to_string())
    }

    #[test]
    fn browser_messages_parse_and_garbage_is_refused() {
        assert_eq!(
            parse(Message::text("m12:{\"a\":1}")),
            Ok(Some(FromBrowser::Data { seq: 12, payload: text("{\"a\":1}") }))
        );
        assert_eq!(parse(Message::text("m3:")), Ok(Some(FromBrowser::Data { seq: 3, payload: text("") })));
        assert_eq!(
            parse(Message::text("m4:a:b")),
            Ok(Some(FromBrowser::Data { seq: 4, payload: text("a:b") })),
            "only the first ':' separates"
        );
        assert_eq!(parse(Message::text("a7")), Ok(Some(FromBrowser::Ack(7))));
        assert_eq!(parse(Message::text("p")), Ok(Some(FromBrowser::Ping)));
        assert_eq!(parse(Message::text("b")), Ok(Some(FromBrowser::Bye)));
        assert_eq!(
            parse(Message::text("h ab12 cd34 9")),
            Ok(Some(FromBrowser::Hello { sid: "ab12".into(), token: "cd34".into(), last: 9 }))
        );
        let mut bin = vec![b'm'];
        bin.extend_from_slice(&5u64.to_be_bytes());
        bin.extend_from_slice(b"\x00\x01");
        assert_eq!(
            parse(Message::binary(bin)),
            Ok(Some(FromBrowser::Data { seq: 5, payload: Payload::Binary(Bytes::from_static(b"\x00\x01")) }))
        );
        for bad in ["m1", "mx:y", "a", "a-1", "h a b", "h a b c d", "hello", "x", "", "{\"method\":\"init\"}"] {
            assert!(parse(Message::text(bad)).is_err(), "{bad:?} is refused");
        }
        assert!(parse(Message::binary(b"m\x00".to_vec())).is_err());
        assert!(parse(Message::binary(b"x\x00\x00\x00\x00\x00\x00\x00\x01".to_vec())).is_err());
        assert_eq!(parse(Message::Ping(Bytes::new())), Ok(None));
    }

    #[test]
    fn numbered_messages_round_trip() {
        for p in [text("{\"values\":{}}"), Payload::Binary(Bytes::from_static(b"\x01\x02\x03"))] {
            let seq = 4_000_000_001;
            assert_eq!(parse(p.numbered(seq)), Ok(Some(FromBrowser::Data { seq, payload: p.clone() })));
        }
    }

    #[test]
    fn the_inbox_takes_each_message_once_in_order() {
        let mut inbox = Inbox::default();
        assert_eq!(inbox.arrive(1), Arrival::Next);
        assert_eq!(inbox.arrive(2), Arrival::Next);
        assert_eq!(inbox.arrive(1), Arrival::Again, "resent after a resume");
        assert_eq!(inbox.arrive(2), Arrival::Again);
        assert_eq!(inbox.arrive(4), Arrival::Gap);
        assert_eq!(inbox.last, 2);
        assert_eq!(inbox.arrive(3), Arrival::Next);
    }

    #[test]
    fn the_outbox_holds_until_acknowledged_and_resends_what_is_missing() {
        let mut out = Outbox::default();
        for m in ["one", "two", "three"] {
            out.push(text(m));
        }
        assert_eq!(out.bytes(), 11);
        assert_eq!(out.ack(1), Ok(3));
        assert_eq!(out.ack(0), Ok(0), "an old acknowledgement changes nothing");
        assert_eq!(out.ack(9), Err(AckTooHigh));
        let again: Vec<u64> = out.resend_after(1).unwrap().map(|(s, _)| *s).collect();
        assert_eq!(again, [2, 3]);
        let again: Vec<u64> = out.resend_after(3).unwrap().map(|(s, _)| *s).collect();
        assert!(again.is_empty());
        assert!(out.resend_after(4).is_none(), "the browser claims a message never sent");
        assert_eq!(out.ack(3), Ok(8));
        assert_eq!((out.bytes(), out.held()), (0, 0));
    }

    #[test]
    fn shedding_keeps_the_bound_and_refuses_a_resume_that_needs_what_was_shed() {
        let mut out = Outbox::default();
        for _ in 0..10 {
            out.push(text("0123456789"));
        }
        assert_eq!(out.shed(35, 1000), 70);
        assert_eq!((out.bytes(), out.held()), (30, 3));
        assert!(out.resend_after(5).is_none(), "messages 6 and 7 are gone");
        assert_eq!(out.resend_after(7).unwrap().count(), 3);
        assert_eq!(out.shed(1000, 2), 10);
        assert_eq!(out.held(), 2);
        let mut big = Outbox::default();
        big.push(text(&"x".repeat(100)));
        assert_eq!(big.shed(10, 10), 0, "the newest message stays, even over the bound");
    }
}
