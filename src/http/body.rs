//! Bodies valve holds whole before passing them on, as nginx's request and
//! response buffering does: a client's upload is read completely before any
//! worker is taken, and a plumber worker's answer is read completely (at the
//! worker's speed) before the worker goes back to the pool, so no client,
//! however slow, holds an R worker longer than R's own work.
//!
//! A body lives in memory up to `MEMORY_UP_TO` bytes, and in memory at all only
//! while every body held in memory together stays under `MEMORY_BUDGET`;
//! beyond either it is spooled to a file in valve's private run directory
//! (deleted as soon as nobody holds it; named, so that a frames worker can
//! open a request body there instead of receiving its bytes).

use std::future::Future;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Empty, Full};

use crate::worker::{SpoolDir, WireBody};

/// The largest body held in memory; larger ones are spooled to a file.
pub const MEMORY_UP_TO: usize = 1 << 20;
/// The most memory all bodies held at once may take; beyond it, new bodies spool.
pub const MEMORY_BUDGET: usize = 64 << 20;
/// How much a spooled body is written or read at a time.
const CHUNK: usize = 256 * 1024;

/// Bytes held in memory by every `Payload` alive.
static HELD: AtomicUsize = AtomicUsize::new(0);

/// A share of `MEMORY_BUDGET`, given back when dropped.
#[derive(Debug)]
struct Held(usize);

impl Held {
    fn take(n: usize) -> Option<Held> {
        let before = HELD.fetch_add(n, Ordering::Relaxed);
        if before + n > MEMORY_BUDGET {
            HELD.fetch_sub(n, Ordering::Relaxed);
            return None;
        }
        Some(Held(n))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        HELD.fetch_sub(self.0, Ordering::Relaxed);
    }
}

/// A whole body: in memory or in a spool file. Cheap to clone (a retry sends it again).
#[derive(Clone, Debug)]
pub struct Payload {
    len: u64,
    store: Store,
}

#[derive(Clone, Debug)]
enum Store {
    Empty,
    /// The bytes, and their share of the memory budget (given back when the last clone drops).
    Memory {
        bytes: Bytes,
        _held: Arc<Held>,
    },
    File {
        file: Arc<std::fs::File>,
        /// Deletes the file when the last clone drops.
        path: Arc<tempfile::TempPath>,
    },
}

/// Why a body could not be read whole.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("the body is larger than the limit of {0} bytes")]
    TooLarge(u64),
    #[error("nothing arrived for {}s", .0.as_secs_f64())]
    Stalled(Duration),
    #[error("the body could not be read: {0}")]
    Broken(Box<dyn std::error::Error + Send + Sync>),
    #[error("cannot spool the body to disk: {0}")]
    Spool(io::Error),
}

impl Payload {
    pub fn empty() -> Payload {
        Payload { len: 0, store: Store::Empty }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether it was spooled to disk.
    pub fn spooled(&self) -> bool {
        matches!(self.store, Store::File { .. })
    }

    /// A spooled body's file, for a frames worker to read (kept until the
    /// returned value is dropped).
    pub fn spooled_file(&self) -> Option<crate::worker::Spooled> {
        match &self.store {
            Store::File { path, .. } => Some(crate::worker::Spooled { path: path.to_path_buf(), keep: path.clone() }),
            _ => None,
        }
    }

    /// The body as a worker receives it.
    pub fn wire(&self) -> WireBody {
        match &self.store {
            Store::Empty => Empty::new().map_err(|never| match never {}).boxed(),
            Store::Memory { bytes, .. } => Full::new(bytes.clone()).map_err(|never| match never {}).boxed(),
            Store::File { file, .. } => FileBody::new(file.clone(), self.len).boxed(),
        }
    }

    /// What the body holds, taken out of its store (for an answer to a
    /// client): its share of the memory budget goes now, hyper writes small
    /// answers out at once; a spool file's name goes now, the open file lives
    /// until the answer is sent.
    pub fn into_contents(self) -> Contents {
        match self.store {
            Store::Empty => Contents::Empty,
            Store::Memory { bytes, .. } => Contents::Memory(bytes),
            Store::File { file, .. } => Contents::File(FileBody::new(file, self.len)),
        }
    }
}

/// A body's contents, out of its store.
pub enum Contents {
    Empty,
    Memory(Bytes),
    File(FileBody),
}

/// Reads `body` whole: at most `limit` bytes, failing if nothing arrives for
/// `idle` (a stalled client), spooling to `spool` (a directory, and who must
/// own the file: the app's user, whose worker reads it) past memory.
pub async fn read_whole<B>(
    mut body: B,
    limit: Option<u64>,
    idle: Option<Duration>,
    spool: &SpoolDir,
) -> Result<Payload, ReadError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut memory = BytesMut::new();
    let mut held: Option<Held> = None;
    let mut file: Option<SpoolWriter> = None;
    let mut len: u64 = 0;
    loop {
        let next = match idle {
            Some(d) => tokio::time::timeout(d, body.frame()).await.map_err(|_| ReadError::Stalled(d))?,
            None => body.frame().await,
        };
        let frame = match next {
            None => break,
            Some(Err(e)) => return Err(ReadError::Broken(e.into())),
            Some(Ok(frame)) => frame,
        };
        let Ok(data) = frame.into_data() else { continue };
        len += data.len() as u64;
        if let Some(limit) = limit.filter(|l| len > *l) {
            return Err(ReadError::TooLarge(limit));
        }
        if let Some(w) = file.as_mut() {
            w.push(data).await?;
            continue;
        }
        let wanted = memory.len() + data.len();
        let fits = wanted <= MEMORY_UP_TO
            && match held.as_mut() {
                Some(h) => match Held::take(data.len()) {
                    Some(more) => {
                        h.0 += more.0;
                        std::mem::forget(more);
                        true
                    }
                    None => false,
                },
                None => Held::take(data.len()).map(|h| held = Some(h)).is_some(),
            };
        if fits {
            memory.extend_from_slice(&data);
        } else {
            let mut w = SpoolWriter::new(spool)?;
            w.push(memory.split().freeze()).await?;
            w.push(data).await?;
            held = None;
            file = Some(w);
        }
    }
    Ok(match (file, held) {
        (Some(w), _) => {
            let (file, path) = w.finish().await?;
            Payload { len, store: Store::File { file: Arc::new(file), path: Arc::new(path) } }
        }
        (None, Some(held)) => Payload { len, store: Store::Memory { bytes: memory.freeze(), _held: Arc::new(held) } },
        (None, None) => Payload::empty(),
    })
}

/// Writes a spooled body in chunks, off the async threads.
struct SpoolWriter {
    file: Option<std::fs::File>,
    path: Option<tempfile::TempPath>,
    pending: BytesMut,
}

impl SpoolWriter {
    fn new(spool: &SpoolDir) -> Result<Self, ReadError> {
        let (file, path) = tempfile::NamedTempFile::new_in(&spool.dir).map_err(ReadError::Spool)?.into_parts();
        if let Some((uid, gid)) = spool.owner {
            rustix::fs::fchown(&file, Some(rustix::fs::Uid::from_raw(uid)), Some(rustix::fs::Gid::from_raw(gid)))
                .map_err(|e| ReadError::Spool(e.into()))?;
        }
        Ok(SpoolWriter { file: Some(file), path: Some(path), pending: BytesMut::new() })
    }

    async fn push(&mut self, data: Bytes) -> Result<(), ReadError> {
        self.pending.extend_from_slice(&data);
        if self.pending.len() >= CHUNK {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), ReadError> {
        let chunk = self.pending.split().freeze();
        let Some(mut file) = self.file.take() else {
            return Err(ReadError::Spool(io::Error::other("spool file lost")));
        };
        let file = tokio::task::spawn_blocking(move || file.write_all(&chunk).map(|_| file))
            .await
            .map_err(|e| ReadError::Spool(io::Error::other(e)))?
            .map_err(ReadError::Spool)?;
        self.file = Some(file);
        Ok(())
    }

    async fn finish(mut self) -> Result<(std::fs::File, tempfile::TempPath), ReadError> {
        if !self.pending.is_empty() {
            self.flush().await?;
        }
        let lost = || ReadError::Spool(io::Error::other("spool file lost"));
        Ok((self.file.take().ok_or_else(lost)?, self.path.take().ok_or_else(lost)?))
    }
}

/// A spooled body (or a static file), read back in chunks off the async
/// threads; each reader keeps its own position, so the same file can be sent twice.
pub struct FileBody {
    file: Arc<std::fs::File>,
    offset: u64,
    end: u64,
    reading: Option<tokio::task::JoinHandle<io::Result<Bytes>>>,
}

impl FileBody {
    fn new(file: Arc<std::fs::File>, len: u64) -> Self {
        FileBody { file, offset: 0, end: len, reading: None }
    }

    /// Bytes `start..end` of `file`, read a chunk at a time as the client
    /// takes them (a static file, however large, is never held whole).
    pub fn part(file: std::fs::File, start: u64, end: u64) -> Self {
        FileBody { file: Arc::new(file), offset: start, end, reading: None }
    }
}

impl Body for FileBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = &mut *self;
        if this.offset >= this.end {
            return Poll::Ready(None);
        }
        let reading = this.reading.get_or_insert_with(|| {
            let file = this.file.clone();
            let (offset, n) = (this.offset, (this.end - this.offset).min(CHUNK as u64) as usize);
            tokio::task::spawn_blocking(move || {
                let mut buf = vec![0u8; n];
                file.read_exact_at(&mut buf, offset)?;
                Ok(Bytes::from(buf))
            })
        });
        match Pin::new(reading).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(joined) => {
                this.reading = None;
                let chunk = joined.map_err(io::Error::other).and_then(|r| r)?;
                this.offset += chunk.len() as u64;
                Poll::Ready(Some(Ok(Frame::data(chunk))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.offset >= self.end
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.end - self.offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Chunks = http_body_util::StreamBody<
        futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, std::convert::Infallible>>>,
    >;

    fn chunks(n: usize, size: usize) -> Chunks {
        let frames: Vec<_> = (0..n).map(|_| Ok(Frame::data(Bytes::from(vec![b'x'; size])))).collect();
        http_body_util::StreamBody::new(futures::stream::iter(frames))
    }

    fn spool(dir: &tempfile::TempDir) -> SpoolDir {
        SpoolDir { dir: dir.path().to_path_buf(), owner: None }
    }

    #[tokio::test]
    async fn small_bodies_stay_in_memory_large_ones_spool_and_read_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let small = read_whole(chunks(4, 1000), Some(1 << 30), None, &spool(&dir)).await.unwrap();
        assert_eq!((small.len(), small.spooled()), (4000, false));
        let big = read_whole(chunks(40, 100_000), Some(1 << 30), None, &spool(&dir)).await.unwrap();
        assert_eq!((big.len(), big.spooled()), (4_000_000, true));
        for _ in 0..2 {
            let back = big.wire().collect().await.unwrap().to_bytes();
            assert_eq!(back.len(), 4_000_000, "a spooled body can be sent again");
        }
        let err = read_whole(chunks(10, 1000), Some(5000), None, &spool(&dir)).await.unwrap_err();
        assert!(matches!(err, ReadError::TooLarge(5000)));
    }
}
