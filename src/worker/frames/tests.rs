//! The frames transport against a fake worker on a real loopback socket:
//! hello checks, exchanges, abandoned answers, garbage.

use std::io::Read;

use http_body_util::{BodyExt, Full};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::net::TcpStream;

use std::os::unix::ffi::OsStrExt;

use tokio::sync::mpsc;

use super::answer::{self, FrameHeader, HEADER_LEN};
use super::hub::{same_secret, FrameConnector};
use super::*;
use crate::worker::conn::{Conn, Connect};
use crate::worker::wire::{SendError, Spooled, WireBody, WorkerId};

fn hello(id: &str, pid: u32, token: &str) -> Vec<u8> {
    let head = format!("valve-frames/2\n{id}\n{pid}\n{token}\n");
    let mut out =
        FrameHeader { kind: answer::HELLO, flags: 0, id: 0, head_len: head.len() as u32, body_len: 0 }.bytes().to_vec();
    out.extend(head.as_bytes());
    out
}

/// An answer frame as loop.R writes it.
fn answer_frame(flags: u8, status: i32, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut head = status.to_be_bytes().to_vec();
    head.extend((headers.len() as u32).to_be_bytes());
    for (n, v) in headers {
        head.extend((n.len() as u32).to_be_bytes());
        head.extend((v.len() as u32).to_be_bytes());
    }
    for (n, v) in headers {
        head.extend(n.as_bytes());
        head.extend(v.as_bytes());
    }
    let mut out =
        FrameHeader { kind: answer::ANSWER, flags, id: 0, head_len: head.len() as u32, body_len: body.len() as u64 }
            .bytes()
            .to_vec();
    out.extend(head);
    out.extend(body);
    out
}

async fn read_frame(s: &mut TcpStream) -> io::Result<(FrameHeader, Vec<u8>, Vec<u8>)> {
    let mut raw = [0u8; HEADER_LEN];
    s.read_exact(&mut raw).await?;
    let h = FrameHeader::parse(&raw);
    let mut head = vec![0u8; h.head_len as usize];
    s.read_exact(&mut head).await?;
    let mut body = vec![0u8; h.body_len as usize];
    s.read_exact(&mut body).await?;
    Ok((h, head, body))
}

async fn pong(s: &mut TcpStream, nonce: &[u8]) {
    let mut out = FrameHeader { kind: answer::PONG, flags: 0, id: 0, head_len: 12, body_len: 0 }.bytes().to_vec();
    out.extend(nonce);
    out.extend(std::process::id().to_be_bytes());
    s.write_all(&out).await.unwrap();
}

/// A fake worker: says hello as worker `id`, answers pings, and answers each
/// request with what `answer` makes of it.
async fn fake_worker(
    hub: &FrameHub,
    id: &str,
    mut answer: impl FnMut(FrameHeader, Vec<u8>, Vec<u8>) -> Vec<u8> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    let mut s = TcpStream::connect(("127.0.0.1", hub.port)).await.unwrap();
    s.write_all(&hello(id, std::process::id(), &hub.token(id.parse().unwrap()))).await.unwrap();
    tokio::spawn(async move {
        while let Ok((h, head, body)) = read_frame(&mut s).await {
            if h.kind == answer::PING {
                pong(&mut s, &head).await;
            } else {
                // Answers carry their request's id, as loop.R's do (unless the
                // fake set one of its own).
                let mut out = answer(h, head, body);
                if out.len() >= HEADER_LEN && out[0] == answer::ANSWER && out[2..4] == [0, 0] {
                    out[2..4].copy_from_slice(&h.id.to_be_bytes());
                }
                if s.write_all(&out).await.is_err() {
                    return;
                }
            }
        }
    })
}

async fn ready(
    hub: &FrameHub,
    id: WorkerId,
    answer: impl FnMut(FrameHeader, Vec<u8>, Vec<u8>) -> Vec<u8> + Send + 'static,
) -> (FrameConnector, Conn) {
    let connector = hub.connector(id, "test".into());
    connector.expect_pid(std::process::id());
    let _worker = fake_worker(hub, &id.to_string(), answer).await;
    let conn = tokio::time::timeout(Duration::from_secs(5), connector.probe()).await.unwrap().unwrap();
    (connector, conn)
}

fn get(path: &str) -> http::Request<WireBody> {
    let mut req = http::Request::new(Full::new(Bytes::new()).map_err(|never| match never {}).boxed());
    *req.uri_mut() = path.parse().unwrap();
    req
}

#[tokio::test]
async fn a_request_becomes_a_frame_and_its_answer_http() {
    let hub = FrameHub::start().unwrap();
    let (_c, mut conn) = ready(&hub, 7, |h, head, _| {
        assert_eq!(h.kind, answer::REQUEST);
        assert!(head.starts_with(b"X\n"), "the head is R serialization");
        answer_frame(0, 201, &[("Content-Type", "text/plain"), ("Set-Cookie", "a=1"), ("Set-Cookie", "b=2")], b"hello")
    })
    .await;
    for _ in 0..3 {
        let resp = conn.send(get("/x?y=1")).await.unwrap();
        assert_eq!(resp.status(), 201);
        assert_eq!(resp.headers().get_all("set-cookie").iter().count(), 2);
        assert_eq!(resp.headers()["content-length"], "5");
        assert_eq!(resp.into_body().collect().await.unwrap().to_bytes(), "hello");
    }
    assert_eq!(conn.ping().await.unwrap(), Some(std::process::id()));
}

#[tokio::test]
async fn gzip_when_the_client_accepts_it() {
    let hub = FrameHub::start().unwrap();
    let body = "x".repeat(200_000);
    let sent = body.clone();
    let (_c, mut conn) = ready(&hub, 1, move |_, _, _| answer_frame(0, 200, &[], sent.as_bytes())).await;
    let mut req = get("/");
    req.headers_mut().insert("accept-encoding", http::HeaderValue::from_static("gzip, deflate"));
    let resp = conn.send(req).await.unwrap();
    assert_eq!(resp.headers()["content-encoding"], "gzip");
    let zipped = resp.into_body().collect().await.unwrap().to_bytes();
    let mut plain = String::new();
    flate2::read::GzDecoder::new(&zipped[..]).read_to_string(&mut plain).unwrap();
    assert_eq!(plain, body);
}

#[tokio::test]
async fn an_answer_nobody_reads_is_drained_before_the_next_exchange() {
    let hub = FrameHub::start().unwrap();
    let (_c, mut conn) = ready(&hub, 2, |_, _, _| answer_frame(0, 200, &[], &vec![b'z'; 3_000_000])).await;
    // The client left: the answer is dropped unread.
    drop(conn.send(get("/big")).await.unwrap());
    // The stream is still in step: a ping, then a whole answer.
    assert_eq!(conn.ping().await.unwrap(), Some(std::process::id()));
    let body = conn.send(get("/big")).await.unwrap().into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), 3_000_000);
}

#[tokio::test]
async fn garbage_fails_the_request_and_ends_the_link() {
    let hub = FrameHub::start().unwrap();
    for (i, bad) in [
        b"not a frame at all".to_vec(),
        FrameHeader { kind: b'Z', flags: 0, id: 0, head_len: 0, body_len: 0 }.bytes().to_vec(),
        [FrameHeader { kind: answer::ANSWER, flags: 0, id: 0, head_len: 9, body_len: 0 }.bytes().to_vec(), vec![0; 9]]
            .concat(),
        FrameHeader { kind: answer::ANSWER, flags: 0, id: 0, head_len: u32::MAX, body_len: 0 }.bytes().to_vec(),
    ]
    .into_iter()
    .enumerate()
    {
        let (_c, mut conn) = ready(&hub, 100 + i as u64, move |_, _, _| bad.clone()).await;
        let Err(err) = tokio::time::timeout(Duration::from_secs(5), conn.send(get("/"))).await.unwrap() else {
            panic!("case {i}: garbage was taken for an answer");
        };
        assert!(matches!(err, SendError::Garbage(_)), "case {i}: {err}");
        assert!(conn.ready().await.is_err(), "the link is gone");
    }
}

#[tokio::test]
async fn an_owned_answer_file_is_sent_then_deleted() {
    let hub = FrameHub::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("answer.txt");
    let p = path.clone();
    let (_c, mut conn) = ready(&hub, 3, move |_, _, _| {
        std::fs::write(&p, b"from a file").unwrap();
        answer_frame(answer::BODY_FILE | answer::FILE_OWNED, 200, &[], p.as_os_str().as_bytes())
    })
    .await;
    let resp = conn.send(get("/file")).await.unwrap();
    assert_eq!(resp.headers()["content-length"], "11");
    assert_eq!(resp.into_body().collect().await.unwrap().to_bytes(), "from a file");
    // Deleted by the link once it has read the file to its end.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while path.exists() {
        assert!(std::time::Instant::now() < deadline, "owned files are deleted after sending");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_spooled_request_body_goes_as_its_path() {
    let hub = FrameHub::start().unwrap();
    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    let (_c, mut conn) = ready(&hub, 4, move |h, _, body| {
        let _ = seen_tx.send((h.flags, body));
        answer_frame(answer::NO_BODY, 204, &[], b"")
    })
    .await;
    let mut req = get("/upload");
    let keep: Arc<dyn std::any::Any + Send + Sync> = Arc::new(());
    req.extensions_mut().insert(Spooled { path: "/tmp/valve-x/body".into(), keep });
    let resp = conn.send(req).await.unwrap();
    assert_eq!(resp.status(), 204);
    assert!(resp.headers().get("content-length").is_none());
    let (flags, body) = seen.recv().await.unwrap();
    assert_eq!((flags, body.as_slice()), (answer::REQ_BODY_FILE, &b"/tmp/valve-x/body"[..]));
}

#[tokio::test]
async fn hellos_are_checked() {
    let hub = FrameHub::start().unwrap();
    let connector = hub.connector(9, "test".into());
    connector.expect_pid(std::process::id());
    // A wrong token, an id valve is not starting, and a connection that says nothing.
    let mut wrong = TcpStream::connect(("127.0.0.1", hub.port)).await.unwrap();
    wrong.write_all(&hello("9", std::process::id(), &"0".repeat(64))).await.unwrap();
    let mut stranger = TcpStream::connect(("127.0.0.1", hub.port)).await.unwrap();
    stranger.write_all(&hello("12345", std::process::id(), &hub.token(12345))).await.unwrap();
    // Another worker's token does not open this worker's door.
    let mut borrowed = TcpStream::connect(("127.0.0.1", hub.port)).await.unwrap();
    borrowed.write_all(&hello("9", std::process::id(), &hub.token(10))).await.unwrap();
    let _silent = TcpStream::connect(("127.0.0.1", hub.port)).await.unwrap();
    for s in [&mut wrong, &mut stranger, &mut borrowed] {
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await.unwrap().unwrap_or(0);
        assert_eq!(n, 0, "refused connections are closed");
    }
    assert!(connector.current().is_none());
    // The real worker still gets in.
    let _w = fake_worker(&hub, "9", |_, _, _| answer_frame(0, 200, &[], b"")).await;
    let conn = tokio::time::timeout(Duration::from_secs(5), connector.probe()).await.unwrap();
    assert!(conn.is_ok());
    // A second hello for the same id is refused.
    let mut again = TcpStream::connect(("127.0.0.1", hub.port)).await.unwrap();
    again.write_all(&hello("9", std::process::id(), &hub.token(9))).await.unwrap();
    let mut buf = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(5), again.read(&mut buf)).await.unwrap().unwrap_or(0);
    assert_eq!(n, 0);
}

#[tokio::test]
async fn a_hello_from_another_process_is_not_believed() {
    let hub = FrameHub::start().unwrap();
    let connector = hub.connector(5, "test".into());
    connector.expect_pid(1); // pid 1 never counts as an ancestor
    let _w = fake_worker(&hub, "5", |_, _, _| answer_frame(0, 200, &[], b"")).await;
    let got = tokio::time::timeout(Duration::from_secs(5), connector.probe()).await.unwrap();
    assert!(got.is_err());
}

#[test]
fn secrets_compare_whole() {
    assert!(same_secret(b"abc", b"abc"));
    assert!(!same_secret(b"abc", b"abd"));
    assert!(!same_secret(b"abc", b"abcd"));
}

/// Counts what a link tells a request's `Park`.
#[derive(Default)]
struct Counted {
    parked: std::sync::atomic::AtomicUsize,
    settled: std::sync::atomic::AtomicUsize,
}

impl crate::worker::wire::Parking for Counted {
    fn parked(&self) -> bool {
        self.parked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        true
    }

    fn settled(&self) {
        self.settled.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

fn frame(kind: u8, id: u16) -> Vec<u8> {
    FrameHeader { kind, flags: 0, id, head_len: 0, body_len: 0 }.bytes().to_vec()
}

#[tokio::test]
async fn requests_waiting_on_promises_are_answered_in_any_order_and_stray_frames_lose_nothing() {
    let hub = FrameHub::start().unwrap();
    let mut first = None;
    let (connector, mut conn) = ready(&hub, 9, move |h, _, _| match first {
        None => {
            first = Some(h.id);
            // WAITING for it, then a WAITING for a request never sent and an
            // answer for one never sent: both are dropped, with a log line.
            let mut out = frame(answer::WAITING, h.id);
            out.extend(frame(answer::WAITING, 999));
            let mut stray = answer_frame(0, 200, &[], b"nobody's");
            stray[2..4].copy_from_slice(&4242u16.to_be_bytes());
            out.extend(stray);
            out
        }
        Some(id) => {
            // The second is answered first; then the first's promise settles.
            let mut out = answer_frame(0, 200, &[], b"second");
            out[2..4].copy_from_slice(&h.id.to_be_bytes());
            let mut later = answer_frame(0, 200, &[], b"first");
            later[2..4].copy_from_slice(&id.to_be_bytes());
            out.extend(later);
            out
        }
    })
    .await;
    let mut other = connector.connect(false).await.unwrap();
    let park = Arc::new(Counted::default());
    let mut req = get("/first");
    req.extensions_mut().insert(crate::worker::wire::Park(park.clone()));
    let first =
        tokio::spawn(async move { conn.send(req).await.unwrap().into_body().collect().await.unwrap().to_bytes() });
    // Once it is parked, a second request goes on the same link.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while park.parked.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(std::time::Instant::now() < deadline, "the WAITING reached the request's Park");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let second = other.send(get("/second")).await.unwrap().into_body().collect().await.unwrap().to_bytes();
    assert_eq!(second, "second");
    assert_eq!(first.await.unwrap(), "first", "each answer matched to its request by id");
    assert_eq!(park.parked.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(park.settled.load(std::sync::atomic::Ordering::SeqCst), 1, "settled once, when answered");
    assert!(other.ready().await.is_ok(), "stray frames did not end the link");
}

#[tokio::test]
async fn a_parked_request_given_up_is_settled_at_once_and_its_late_answer_dropped() {
    let hub = FrameHub::start().unwrap();
    let mut parked_id = None;
    let (_c, mut conn) = ready(&hub, 10, move |h, _, _| match parked_id {
        None => {
            parked_id = Some(h.id);
            frame(answer::WAITING, h.id)
        }
        Some(id) => {
            // The late answer of the first, then the second's own.
            let mut late = answer_frame(0, 200, &[], b"late");
            late[2..4].copy_from_slice(&id.to_be_bytes());
            let mut out = answer_frame(0, 200, &[], b"mine");
            out[2..4].copy_from_slice(&h.id.to_be_bytes());
            late.extend(out);
            late
        }
    })
    .await;
    let park = Arc::new(Counted::default());
    let mut req = get("/never");
    req.extensions_mut().insert(crate::worker::wire::Park(park.clone()));
    // A timeout gives the request up while it waits on its promise.
    let gave_up = tokio::time::timeout(Duration::from_millis(300), conn.send(req)).await;
    assert!(gave_up.is_err());
    assert_eq!(park.parked.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(park.settled.load(std::sync::atomic::Ordering::SeqCst), 1, "settled when given up");
    let body = conn.send(get("/next")).await.unwrap().into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "mine", "the late answer went nowhere");
    assert_eq!(park.settled.load(std::sync::atomic::Ordering::SeqCst), 1, "and settled nothing twice");
}
