//! A fake worker for the supervisor's unit tests: an in-process HTTP server
//! on an in-memory pipe, started, crashed, hung and stopped at the test's will,
//! on tokio's (paused) clock. Only for tests; integration tests use real R.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::sync::watch;

use crate::worker::{
    BoxFuture, Conn, Connect, Exit, Launch, Launched, MemoryProbe, Process, StartError, Stop, WorkerId,
};

/// How one launched fake behaves.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// How long it takes to answer its first probe.
    pub ready_after: Duration,
    /// Exits with this code before it ever answers.
    pub fail: Option<i32>,
    /// Takes no notice of SIGTERM (only SIGKILL ends it).
    pub ignore_term: bool,
}

/// One fake worker process.
pub struct FakeWorker {
    pub id: WorkerId,
    plan: Plan,
    exit: watch::Sender<Option<Exit>>,
    /// Every signal it was sent, and whether it had exited by then.
    pub signals: Mutex<Vec<(Stop, bool)>>,
    /// Stops answering (as if SIGSTOPped).
    pub mute: AtomicBool,
    /// Held while it answers: like R, it answers one request at a time.
    r: tokio::sync::Mutex<()>,
}

impl FakeWorker {
    pub fn pid(&self) -> u32 {
        10_000 + self.id as u32
    }

    /// Ends the process the way `exit` says.
    pub fn end(&self, exit: Exit) {
        self.exit.send_if_modified(|e| {
            if e.is_none() {
                *e = Some(exit);
                true
            } else {
                false
            }
        });
    }

    pub fn alive(&self) -> bool {
        self.exit.borrow().is_none()
    }

    pub fn signals(&self) -> Vec<(Stop, bool)> {
        self.signals.lock().unwrap().clone()
    }
}

/// Launches fakes, following plans queued by the test (default: ready at once).
#[derive(Default)]
pub struct FakeLauncher {
    pub plans: Mutex<VecDeque<Plan>>,
    pub workers: Mutex<Vec<Arc<FakeWorker>>>,
    /// When each launch happened, on tokio's clock.
    pub launched_at: Mutex<Vec<tokio::time::Instant>>,
}

impl FakeLauncher {
    pub fn worker(&self, id: WorkerId) -> Arc<FakeWorker> {
        self.workers.lock().unwrap().iter().find(|w| w.id == id).cloned().expect("a worker with that id was launched")
    }

    pub fn alive(&self) -> Vec<Arc<FakeWorker>> {
        self.workers.lock().unwrap().iter().filter(|w| w.alive()).cloned().collect()
    }
}

impl Launch for Arc<FakeLauncher> {
    fn launch(&self, id: WorkerId) -> BoxFuture<'_, Result<Launched, StartError>> {
        Box::pin(async move {
            let plan = self.plans.lock().unwrap().pop_front().unwrap_or_default();
            let (exit, _) = watch::channel(None);
            let worker = Arc::new(FakeWorker {
                id,
                plan,
                exit,
                signals: Mutex::new(Vec::new()),
                mute: AtomicBool::new(false),
                r: tokio::sync::Mutex::new(()),
            });
            self.workers.lock().unwrap().push(worker.clone());
            self.launched_at.lock().unwrap().push(tokio::time::Instant::now());
            Ok(Launched {
                process: Box::new(FakeProcess { worker: worker.clone(), exit: worker.exit.subscribe() }),
                connector: Arc::new(FakeConnector { worker }),
            })
        })
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

struct FakeProcess {
    worker: Arc<FakeWorker>,
    exit: watch::Receiver<Option<Exit>>,
}

impl Process for FakeProcess {
    fn pid(&self) -> Option<u32> {
        Some(self.worker.pid())
    }

    fn ready<'a>(
        &'a mut self,
        connector: &'a dyn Connect,
        _timeout: Duration,
    ) -> BoxFuture<'a, Result<Conn, StartError>> {
        Box::pin(async move {
            tokio::time::sleep(self.worker.plan.ready_after).await;
            if let Some(code) = self.worker.plan.fail {
                self.worker.end(Exit::Code(code));
                return Err(StartError::Exited {
                    status: format!("exit code {code}"),
                    code: Some(code),
                    tail: vec!["R: boom".into()],
                });
            }
            connector.probe().await.map_err(StartError::Io)
        })
    }

    fn exited(&mut self) -> BoxFuture<'_, Exit> {
        Box::pin(async move {
            let exit = self.exit.wait_for(Option::is_some).await.map(|e| e.clone()).ok().flatten();
            exit.unwrap_or(Exit::Unknown)
        })
    }

    fn signal(&self, stop: Stop) {
        let gone = !self.worker.alive();
        self.worker.signals.lock().unwrap().push((stop, gone));
        match stop {
            Stop::Term if !self.worker.plan.ignore_term => self.worker.end(Exit::Signal(15)),
            Stop::Kill => self.worker.end(Exit::Signal(9)),
            Stop::Term => {}
        }
    }

    fn memory(&self) -> Option<MemoryProbe> {
        None
    }
}

struct FakeConnector {
    worker: Arc<FakeWorker>,
}

impl Connect for FakeConnector {
    fn connect(&self, upgradable: bool) -> BoxFuture<'_, std::io::Result<Conn>> {
        Box::pin(async move {
            if !self.worker.alive() {
                return Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
            }
            let (client, server) = tokio::io::duplex(1 << 16);
            let worker = self.worker.clone();
            tokio::spawn(async move {
                let w = worker.clone();
                let service = hyper::service::service_fn(move |req| answer(w.clone(), req));
                let conn = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(server), service);
                let mut exit = worker.exit.subscribe();
                // The connection dies with the worker.
                tokio::select! {
                    _ = conn => {}
                    _ = exit.wait_for(Option::is_some) => {}
                }
            });
            Conn::handshake(client, upgradable).await
        })
    }
}

/// What a fake worker answers: its ping, `/sleep?ms=N`, `/crash` (killed from
/// outside mid-request), `/quit` (R's `quit()` in the endpoint), anything else
/// `ok`. Like R, it finishes a request even when its client has gone.
async fn answer(
    worker: Arc<FakeWorker>,
    req: http::Request<Incoming>,
) -> Result<http::Response<Full<Bytes>>, std::convert::Infallible> {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let _r = worker.r.lock().await;
        if worker.mute.load(Ordering::Relaxed) {
            std::future::pending::<()>().await;
        }
        let body = match path.as_str() {
            "/__valve__/ping" => format!("valve-worker-ready {}", worker.pid()),
            "/sleep" => {
                let ms: u64 = query.strip_prefix("ms=").and_then(|m| m.parse().ok()).unwrap_or(100);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                format!("slept {}", worker.pid())
            }
            "/crash" => return worker.end(Exit::Signal(9)),
            "/quit" => return worker.end(Exit::Code(0)),
            _ => format!("ok {}", worker.pid()),
        };
        let _ = tx.send(body);
    });
    match rx.await {
        Ok(body) => Ok(http::Response::new(Full::new(Bytes::from(body)))),
        // The worker died: its connection goes with it.
        Err(_) => std::future::pending().await,
    }
}
