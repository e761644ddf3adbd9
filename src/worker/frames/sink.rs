//! Where an answer's body goes as a link reads it: to the request's reader
//! (gzip-compressed if asked), or nowhere once nobody wants it, always read
//! to its end so the stream stays in step; and the files an answer names.

use std::io::{self, Write};
use std::sync::Arc;

use bytes::Bytes;
use flate2::write::GzEncoder;
use tokio::io::{AsyncReadExt, BufReader};
use tokio::net::tcp::OwnedReadHalf;
use tokio::sync::mpsc;

/// How much of an answer body is read (and passed on) at a time.
pub(super) const CHUNK: usize = 64 * 1024;

/// Where an answer's body goes: the reader of the answer (gzip-compressed if
/// asked), or nowhere once that reader is gone (or never wanted it).
pub(super) struct Sink {
    pub(super) tx: Option<mpsc::Sender<io::Result<Bytes>>>,
    pub(super) gzip: Option<Gzip>,
}

impl Sink {
    async fn push(&mut self, chunk: Bytes) {
        let Some(tx) = &self.tx else { return };
        let chunk = match self.gzip.as_mut() {
            Some(gz) => gz.push(&chunk),
            None => chunk,
        };
        if !chunk.is_empty() && tx.send(Ok(chunk)).await.is_err() {
            self.tx = None;
        }
    }

    async fn finish(mut self) {
        if let (Some(tx), Some(gz)) = (self.tx.take(), self.gzip.take()) {
            match gz.finish() {
                Ok(tail) => {
                    let _ = tx.send(Ok(tail)).await;
                }
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                }
            }
        }
    }

    async fn fail(mut self, e: io::Error) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(Err(e)).await;
        }
    }

    /// Reads `len` bytes of body off the worker's socket: always all of them,
    /// so the stream stays in step.
    pub(super) async fn socket(mut self, rd: &mut BufReader<OwnedReadHalf>, len: u64) -> io::Result<()> {
        let mut left = len;
        while left > 0 {
            let n = left.min(CHUNK as u64) as usize;
            let mut buf = vec![0u8; n];
            let got = match rd.read(&mut buf).await {
                Ok(0) => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the worker closed mid-answer")),
                Ok(got) => Ok(got),
                Err(e) => Err(e),
            };
            match got {
                Ok(got) => {
                    buf.truncate(got);
                    left -= got as u64;
                    self.push(Bytes::from(buf)).await;
                }
                Err(e) => {
                    let copy = io::Error::new(e.kind(), e.to_string());
                    self.fail(copy).await;
                    return Err(e);
                }
            }
        }
        self.finish().await;
        Ok(())
    }

    /// Streams a file the app named, off the async threads; deletes it
    /// afterwards if the app handed it over.
    pub(super) async fn file(mut self, mut f: AnswerFile) {
        let Some(file) = f.file.take() else { return };
        let file = Arc::new(file);
        let mut offset = 0u64;
        while self.tx.is_some() {
            let file = file.clone();
            let read = tokio::task::spawn_blocking(move || {
                use std::os::unix::fs::FileExt;
                let mut buf = vec![0u8; CHUNK];
                let n = file.read_at(&mut buf, offset)?;
                buf.truncate(n);
                Ok::<_, io::Error>(buf)
            })
            .await
            .map_err(io::Error::other)
            .and_then(|r| r);
            match read {
                Ok(buf) if buf.is_empty() => break,
                Ok(buf) => {
                    offset += buf.len() as u64;
                    self.push(Bytes::from(buf)).await;
                }
                Err(e) => return self.fail(e).await,
            }
        }
        self.finish().await;
    }
}

/// A file an answer named; deleted when dropped if the app handed it over
/// (httpuv's `owned = TRUE`).
pub(super) struct AnswerFile {
    pub(super) file: Option<std::fs::File>,
    /// Where it is, as the worker sees it (valve deletes it as the worker would).
    pub(super) place: Option<super::named::Place>,
    pub(super) owned: bool,
}

impl Drop for AnswerFile {
    fn drop(&mut self) {
        if let (true, Some(place)) = (self.owned, &self.place) {
            let _ = place.remove();
        }
    }
}

/// gzip (zlib's default level) of a body that arrives in pieces.
pub(super) struct Gzip(GzEncoder<Vec<u8>>);

impl Gzip {
    pub(super) fn new() -> Gzip {
        Gzip(GzEncoder::new(Vec::new(), flate2::Compression::default()))
    }

    fn push(&mut self, chunk: &[u8]) -> Bytes {
        // Writing into a Vec cannot fail.
        let _ = self.0.write_all(chunk);
        Bytes::from(std::mem::take(self.0.get_mut()))
    }

    fn finish(self) -> io::Result<Bytes> {
        self.0.finish().map(Bytes::from)
    }
}
