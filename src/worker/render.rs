//! The one render of a `shiny_prerendered` document: one R process
//! (`launcher.R` in `render` mode) that renders the document to its HTML
//! beside it (a Quarto document through `quarto render`), started before any worker of its generation, so workers never
//! race each other on the same files (they run with
//! `RMARKDOWN_RUN_PRERENDER=0`). Renders of one document never overlap, even
//! across generations (a reload while the previous one still renders).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::process::Signal;
use tokio_util::sync::CancellationToken;

use super::job::Io;
use super::output::{forward, Tail, NOT_A_WORKER};
use super::process::{Exit, RenderError, StartError};
use super::spawn::{Spawner, Spec};

/// Why a render failed, kept by the generation (every worker launch reports it).
#[derive(Clone, Debug)]
pub(super) struct Failed {
    message: String,
    code: Option<i32>,
    tail: Vec<String>,
}

impl Failed {
    fn new(message: impl Into<String>) -> Failed {
        Failed { message: message.into(), code: None, tail: Vec::new() }
    }

    pub(super) fn error(&self, spec: &Spec) -> StartError {
        StartError::Render(Box::new(RenderError {
            doc: spec.app.path().display().to_string(),
            message: self.message.clone(),
            code: self.code,
            tail: self.tail.clone(),
        }))
    }
}

/// One lock per document: renders of the same files wait for each other.
fn lock_for(doc: PathBuf) -> Arc<tokio::sync::Mutex<()>> {
    static LOCKS: Mutex<Option<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>> = Mutex::new(None);
    let mut locks = LOCKS.lock().unwrap_or_else(|p| p.into_inner());
    locks.get_or_insert_with(HashMap::new).entry(doc).or_default().clone()
}

/// Renders the document of `spec` once, within `spec.render_timeout`;
/// stopped (its process group killed) when `stop` is cancelled.
pub(super) async fn prerender(spec: &Spec, spawner: &Spawner, stop: &CancellationToken) -> Result<(), Failed> {
    let doc = spec.app.path().display().to_string();
    let lock = lock_for(spec.app.path().to_path_buf());
    let _one = tokio::select! {
        one = lock.lock() => one,
        _ = stop.cancelled() => return Err(Failed::new("stopped before it was rendered")),
    };
    tracing::info!(app = %spec.name, doc = %doc, "rendering the shiny_prerendered document once, before its workers start");
    let started = Instant::now();
    let mut cmd = spec.command("render").map_err(|e| Failed::new(e.to_string()))?;
    cmd.stdin(Io::Null);
    if spec.app.quarto() {
        let quarto = quarto_binary().map_err(|path| Failed::new(format!("quarto is not on the PATH ({path})")))?;
        cmd.env("VALVE_QUARTO", quarto);
    }
    let mut child = spawner.spawn(&spec.r_bin, cmd).await.map_err(|e| Failed::new(e.to_string()))?;
    let tail = Arc::new(Tail::default());
    let readers = forward(&mut child, &spec.sink(NOT_A_WORKER, tail.clone()));
    let ended = tokio::select! {
        status = child.wait() => Ok(status),
        _ = tokio::time::sleep(spec.render_timeout) => Err(format!(
            "it did not finish within {:?} (raise --start-timeout if the document takes longer to render)",
            spec.render_timeout
        )),
        _ = stop.cancelled() => Err("valve stopped the render".to_string()),
    };
    let status = match ended {
        Ok(status) => status,
        Err(message) => {
            // Not reaped yet: the group it leads is still its own.
            child.signal_group(Signal::KILL);
            let _ = child.wait().await;
            return Err(Failed { message, code: None, tail: tail.lines() });
        }
    };
    // The rest of its output (the error's last words).
    for reader in readers.into_iter().flatten() {
        let _ = tokio::time::timeout(Duration::from_secs(2), reader).await;
    }
    let lines = tail.lines();
    let exit = status.map(Exit::from_status).unwrap_or(Exit::Unknown);
    match exit {
        Exit::Code(0) => {
            let said = lines.iter().rev().find_map(|l| l.strip_prefix("valve-render: ")).unwrap_or("rendered");
            tracing::info!(app = %spec.name, doc = %doc, seconds = started.elapsed().as_secs_f64(), "{said}");
            Ok(())
        }
        exit => {
            let said = |marker: &str| lines.iter().rev().find_map(|l| l.split_once(marker).map(|(_, m)| m.to_string()));
            let message = said("valve-render-failed: ")
                .or_else(|| said("valve: "))
                .unwrap_or_else(|| format!("R ended ({}) without saying why", exit.describe()));
            let code = match exit {
                Exit::Code(c) => Some(c),
                _ => None,
            };
            // The message is in the error already; the rest of the output explains it.
            let tail = lines.into_iter().filter(|l| !l.contains("valve-render-failed: ")).collect();
            Err(Failed { message, code, tail })
        }
    }
}

/// The Quarto CLI, found as the quarto R package finds it: `QUARTO_PATH`,
/// else `quarto` on the PATH. Otherwise the PATH searched, for the message.
pub(super) fn quarto_binary() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("QUARTO_PATH").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return if path.is_file() { Ok(path) } else { Err(format!("QUARTO_PATH={} is no file", path.display())) };
    }
    let searched = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&searched)
        .map(|dir| dir.join("quarto"))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("searched {}", searched.to_string_lossy()))
}
