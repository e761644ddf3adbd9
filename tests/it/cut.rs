//! A TCP proxy on loopback whose connections a test can cut and whose
//! network it can take down and bring back: what a wifi blip, a proxy's idle
//! timeout or an outage does to a browser's connections (the Shiny reconnect tests
//! drive real pages through it). Its own tests check it against a real valve.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::harness::{client, fixture, Valve};

/// The proxy: `url` in front of `target` (host:port).
pub struct Cuttable {
    pub url: String,
    /// Bumped to cut every connection open now.
    generation: watch::Sender<u64>,
    /// While down, new connections are closed at once.
    down: Arc<AtomicBool>,
    /// Connections accepted while up, in all.
    pub accepted: Arc<AtomicU64>,
    acceptor: tokio::task::JoinHandle<()>,
}

impl Cuttable {
    /// Listens on a free loopback port and forwards to `target`.
    pub async fn start(target: &str) -> Cuttable {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (generation, _) = watch::channel(0u64);
        let down = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicU64::new(0));
        let target =
            target.trim_start_matches("http://").trim_start_matches("https://").trim_end_matches('/').to_string();
        let acceptor = tokio::spawn({
            let (generation, down, accepted) = (generation.clone(), down.clone(), accepted.clone());
            async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    if down.load(Ordering::SeqCst) {
                        drop(inbound);
                        continue;
                    }
                    accepted.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(relay(inbound, target.clone(), generation.subscribe()));
                }
            }
        });
        Cuttable { url, generation, down, accepted, acceptor }
    }

    /// Cuts every connection open now (both sides see it close).
    pub fn cut(&self) {
        self.generation.send_modify(|g| *g += 1);
    }

    /// Takes the network down (cutting what is open) or brings it back.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
        if down {
            self.cut();
        }
    }
}

impl Drop for Cuttable {
    fn drop(&mut self) {
        self.acceptor.abort();
        self.cut();
    }
}

/// Copies both ways until both sides have closed (one side's close is passed
/// on as a half-close, so what the other side still sends arrives: a
/// browser's last WebSocket frame before it leaves) or the connection is cut.
async fn relay(mut inbound: TcpStream, target: String, mut cut: watch::Receiver<u64>) {
    let Ok(mut outbound) = TcpStream::connect(&target).await else { return };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (mut ri, mut wi) = inbound.split();
    let (mut ro, mut wo) = outbound.split();
    let up = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match ri.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if wo.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = wo.shutdown().await;
    };
    let down = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match ro.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if wi.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = wi.shutdown().await;
    };
    tokio::select! {
        _ = async { tokio::join!(up, down) } => {}
        _ = cut.changed() => {}
    }
    // Dropping both streams closes both connections.
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cuttable_proxy_passes_traffic_cuts_open_connections_and_goes_down_and_up() {
    let valve = Valve::start(&["-f", fixture("api.R").to_str().unwrap(), "-n", "1"]);
    let proxy = Cuttable::start(&valve.url).await;
    assert_eq!(client().get(format!("{}/pid", proxy.url)).send().await.unwrap().status(), 200);

    // A connection open through the proxy is closed by a cut.
    let addr = proxy.url.trim_start_matches("http://").to_string();
    let mut open = TcpStream::connect(&addr).await.unwrap();
    open.write_all(b"GET /pid HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut first = vec![0u8; 12];
    open.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    proxy.cut();
    let mut rest = Vec::new();
    let _ = open.read_to_end(&mut rest).await;
    let mut again = [0u8; 1];
    assert_eq!(open.read(&mut again).await.unwrap_or(0), 0, "the cut connection is closed");

    // Down: a new connection is closed at once, unanswered.
    proxy.set_down(true);
    let accepted = proxy.accepted.load(Ordering::SeqCst);
    assert!(client().get(format!("{}/pid", proxy.url)).send().await.is_err(), "no answer while down");
    assert_eq!(proxy.accepted.load(Ordering::SeqCst), accepted);

    // Back up: traffic flows again.
    proxy.set_down(false);
    assert_eq!(client().get(format!("{}/pid", proxy.url)).send().await.unwrap().status(), 200);
}
