//! `GET /__valve__/apps/NAME/logs`: an app's log as text (one line each,
//! `TIME [worker N stderr] ...`, `TIME [valve WARN] ...`) or JSON
//! (`?format=json`), one worker's only (`?worker=N`), or followed
//! (`?follow=1`): what the log holds now, then each new line until the
//! client leaves. A follower is a task that reads the app's ring by sequence
//! number and holds no lock across a write; a client slower than the app's
//! output misses lines and is told how many.

use bytes::Bytes;
use http::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS};
use http::{Response, StatusCode};
use tokio::sync::mpsc;

use super::query::{bad, Query};
use crate::applog::{AppLog, Batch};
use crate::http::reply::{text, ReplyBody};
use crate::worker::WorkerId;

/// The most text one read of the ring copies (a follower's chunk).
const CHUNK: usize = 64 * 1024;
/// Chunks waiting for one follower's client at most.
const CHUNKS: usize = 8;

/// How a log is written out.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    Text,
    Json,
}

/// Answers a log request for app `name`.
pub fn answer(name: &str, log: std::sync::Arc<AppLog>, query: Option<&str>) -> Response<ReplyBody> {
    let q = Query::parse(query);
    if let Some(refused) = q.refuse_unknown(&["format", "worker", "follow"]) {
        return refused.answer();
    }
    let format = match q.choice("format", &["text", "json"]) {
        Ok("json") => Format::Json,
        Ok(_) => Format::Text,
        Err(refused) => return refused.answer(),
    };
    let worker: Option<WorkerId> = match q.get("worker") {
        None => None,
        Some(w) => match w.parse() {
            Ok(id) => Some(id),
            Err(_) => {
                let want = format!(
                    "a worker's id, a whole number as /__valve__/apps/{name}/status lists them (0: the preload parent or a document's render)"
                );
                return bad("worker", w, &want).answer();
            }
        },
    };
    let follow = match q.flag("follow") {
        Ok(f) => f,
        Err(refused) => return refused.answer(),
    };
    if follow {
        return followed(log, worker, format);
    }
    let batch = log.read(1, worker, usize::MAX);
    match format {
        Format::Text => {
            let mut out = String::new();
            if batch.missed > 0 {
                out.push_str(&earlier(batch.missed));
            }
            for line in &batch.lines {
                out.push_str(&line.to_text());
                out.push('\n');
            }
            text(StatusCode::OK, "text/plain; charset=utf-8", out)
        }
        Format::Json => {
            let (bytes, bound) = log.size();
            let body = serde_json::json!({
                "app": name,
                "worker": worker,
                "let_go": batch.missed,
                "bytes": bytes,
                "log_buffer": bound,
                "lines": batch.lines.iter().map(|l| l.to_json()).collect::<Vec<_>>(),
            });
            text(StatusCode::OK, "application/json", body.to_string())
        }
    }
}

/// The note for lines the log let go before this reader came.
fn earlier(n: u64) -> String {
    format!("[valve] {n} earlier lines were let go (the app's log keeps log_buffer bytes)\n")
}

/// What the log holds, then each new line, as a stream.
fn followed(log: std::sync::Arc<AppLog>, worker: Option<WorkerId>, format: Format) -> Response<ReplyBody> {
    let (tx, rx) = mpsc::channel::<Bytes>(CHUNKS);
    tokio::spawn(async move {
        let mut changes = log.subscribe();
        let mut from = 1;
        let mut first = true;
        loop {
            changes.borrow_and_update();
            let batch = log.read(from, worker, CHUNK);
            from = batch.next;
            let chunk = render(&batch, format, first);
            first = false;
            // The only wait on the client; no lock is held here.
            if !chunk.is_empty() && tx.send(Bytes::from(chunk)).await.is_err() {
                return;
            }
            if batch.more {
                continue;
            }
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                _ = tx.closed() => return,
            }
        }
    });
    let mut resp = Response::new(ReplyBody::Live(rx));
    let h = resp.headers_mut();
    let kind = match format {
        Format::Text => "text/plain; charset=utf-8",
        Format::Json => "application/x-ndjson",
    };
    h.insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // Browsers show the lines as they come instead of sniffing the first bytes.
    h.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    resp
}

/// A follower's chunk: the lines, after a note on any it missed.
fn render(batch: &Batch, format: Format, first: bool) -> String {
    let mut out = String::new();
    if batch.missed > 0 {
        match format {
            Format::Text if first => out.push_str(&earlier(batch.missed)),
            Format::Text => out.push_str(&format!(
                "[valve] {} lines dropped: this reader fell behind the app's output\n",
                batch.missed
            )),
            Format::Json => {
                let note = serde_json::json!({ "dropped": batch.missed, "before_this_reader": first });
                out.push_str(&note.to_string());
                out.push('\n');
            }
        }
    }
    for line in &batch.lines {
        match format {
            Format::Text => out.push_str(&line.to_text()),
            Format::Json => out.push_str(&line.to_json().to_string()),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::applog::Origin;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn a_slow_follower_is_told_what_it_missed_and_a_gone_one_ends_its_task() {
        let log = std::sync::Arc::new(AppLog::new(4096));
        log.push(Some(1), None, Origin::Valve("INFO"), "before");
        let mut body = answer("api", log.clone(), Some("follow=1")).into_body();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert!(String::from_utf8_lossy(&first).contains("[valve INFO] before"));
        // The client reads nothing while the app prints far more than the log keeps.
        for i in 0..1000 {
            log.push(Some(1), None, Origin::Valve("INFO"), &format!("line {i}"));
        }
        let mut seen = String::new();
        while !seen.contains("line 999") {
            let chunk = body.frame().await.unwrap().unwrap().into_data().unwrap();
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
        assert!(seen.contains("lines dropped: this reader fell behind"), "{seen}");
        // The client leaves: its task ends, with no new line to wake it.
        assert_eq!(log.followers(), 1);
        drop(body);
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while log.followers() > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the follower's task ended");
    }
}
