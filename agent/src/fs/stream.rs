//! `fs/readStream`, `fs/readCredit`, `fs/readCancel` (docs/PROTOCOL.md §5):
//! one request for a whole file, its blocks pushed as
//! `fs/readStream/data` notifications within the window the client
//! returns, then one `fs/readStream/end`.
//!
//! A path is resolved and opened exactly as `fs/open` does it (the same
//! [`super::target`] under the request's sandbox intent); a handle is one
//! `fs/open` opened. The stream's task holds the file, a `max_read_streams`
//! slot and its [`Credit`]; it ends at the end of the range, on an error,
//! on `fs/readCancel`, or when the connection drops (the session cancels
//! its read streams on detach), and the file is closed with it.
//!
//! A block goes one of two ways ([`read_block`]). Pinned: spliced from the
//! file into a pipe of the session's [`PipePool`] on the blocking pool,
//! its length fixed before its frame head is made, and moved from there
//! to the connection inside the kernel by the writer (never copied by the
//! agent). Copied: read with `pread` into memory and written after its
//! head, when the block is small, the connection's writer cannot splice,
//! no pipe is free within the session's budget, or the file's filesystem
//! cannot splice (`EINVAL`: the stream copies from then on).

use super::confine::Open;
use super::handles::open_resolved;
use super::{blocking, io_error, read_at_most};
use crate::outbound::pipes::{self, PipePool, PooledPipe};
use crate::outbound::{NotifyError, Outbound, Reply};
use crate::session::Session;
use crate::tables::streams::{Credit, Streams};
use bytes::Bytes;
use executor_protocol::methods;
use executor_protocol::types::fs::{
    ReadCancelParams, ReadCreditParams, ReadStreamEnd, ReadStreamParams, ReadStreamResult,
};
use executor_protocol::types::Empty;
use executor_protocol::{ErrorCode, WireError};
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::{oneshot, OwnedSemaphorePermit};
use tokio_util::sync::CancellationToken;

/// `block_bytes` and `credit_bytes` within their bounds.
fn check_sizes(s: &Session, p: &ReadStreamParams) -> Result<(), WireError> {
    let l = s.limits();
    if p.block_bytes == 0 {
        return Err(WireError::invalid_params(
            "block_bytes",
            "block_bytes must be at least 1",
        ));
    }
    if p.block_bytes > l.max_block_bytes {
        return Err(WireError::limit(
            "max_block_bytes",
            l.max_block_bytes,
            Some(p.block_bytes),
        ));
    }
    if p.credit_bytes < p.block_bytes {
        return Err(WireError::invalid_params(
            "credit_bytes",
            format!(
                "credit_bytes {} is below block_bytes {}: not one block could be sent",
                p.credit_bytes, p.block_bytes
            ),
        ));
    }
    if p.credit_bytes > l.max_read_credit_bytes {
        return Err(WireError::limit(
            "max_read_credit_bytes",
            l.max_read_credit_bytes,
            Some(p.credit_bytes),
        ));
    }
    Ok(())
}

/// `fs/readStream`: the stream's head (its id and the file's size), queued
/// before its first block.
pub async fn read_stream(s: &Arc<Session>, p: ReadStreamParams) -> Result<Reply, WireError> {
    check_sizes(s, &p)?;
    let slot = s.read_streams().reserve_slot()?;
    let (file, size, path) = match (&p.path, p.handle) {
        (Some(path), None) => {
            let resolved =
                super::confine::confined(s.profile(), &p, path, "path", Open::read(true))?;
            let (file, size, path) = open_resolved(resolved).await?;
            (Arc::new(file), size, path)
        }
        (None, Some(handle)) => {
            let (file, path) = s.handles().reader(handle)?;
            let (file, size, path) = blocking(move || {
                let size = file
                    .metadata()
                    .map_err(|e| io_error(&e, &path, "cannot stat"))?
                    .len();
                Ok((file, size, path))
            })
            .await?;
            (file, size, path)
        }
        (Some(_), Some(_)) => {
            return Err(WireError::invalid_params(
                "handle",
                "give either path or handle, not both",
            ))
        }
        (None, None) => {
            return Err(WireError::invalid_params(
                "path",
                "give the path (or the handle) of the file to read",
            ))
        }
    };
    let end = match p.length {
        Some(len) => p.offset.checked_add(len).ok_or_else(|| {
            WireError::invalid_params(
                "length",
                format!("offset {} + length {len} overflows", p.offset),
            )
        })?,
        None => u64::MAX,
    };
    let (stream_id, token, credit) = s.read_streams().open_with_credit(p.credit_bytes);
    let (started, start) = oneshot::channel();
    let pump = Pump {
        streams: s.read_streams().clone(),
        outbound: s.outbound().clone(),
        attachment: s.outbound().attachment(),
        stream_id,
        file,
        path,
        offset: p.offset,
        end,
        block: p.block_bytes,
        credit,
        read_ahead: s.read_ahead().clone(),
        pipes: s.pipes().clone(),
        splice: true,
        token,
        _slot: slot,
    };
    tokio::spawn(pump.run(start));
    Ok(Reply::Stream {
        head: Box::new(ReadStreamResult { stream_id, size }),
        started,
    })
}

/// `fs/readCredit`
pub async fn read_credit(s: &Arc<Session>, p: ReadCreditParams) -> Result<Empty, WireError> {
    s.read_streams().give_back(p.stream_id, p.bytes)?;
    Ok(Empty {})
}

/// `fs/readCancel`
pub async fn read_cancel(s: &Arc<Session>, p: ReadCancelParams) -> Result<Empty, WireError> {
    s.read_streams().cancel(p.stream_id)?;
    Ok(Empty {})
}

/// One stream's task: read a block when the window has room for it, push
/// it, repeat; then the end.
struct Pump {
    streams: Arc<Streams>,
    outbound: Outbound,
    /// The connection that asked: the stream's messages go to it only.
    attachment: u64,
    stream_id: u64,
    file: Arc<std::fs::File>,
    path: PathBuf,
    offset: u64,
    /// One past the last byte to send (`u64::MAX`: to the end of the file).
    end: u64,
    block: u64,
    credit: Arc<Credit>,
    /// The session's read-ahead, shared by its streams.
    read_ahead: Arc<tokio::sync::Semaphore>,
    pipes: Arc<PipePool>,
    /// Whether the file may be spliced (false once its filesystem refused).
    splice: bool,
    token: CancellationToken,
    _slot: OwnedSemaphorePermit,
}

/// One block, read.
enum Block {
    /// Pinned in a pipe.
    Piped(PooledPipe),
    /// Copied into memory.
    Copied(Vec<u8>),
}

impl Block {
    fn len(&self) -> usize {
        match self {
            Block::Piped(p) => p.held(),
            Block::Copied(d) => d.len(),
        }
    }
}

/// Whether a splice error means the file can never be spliced (its
/// filesystem has no splice support), not that this read failed.
fn cannot_splice(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP)
    )
}

/// Read `want` bytes of `file` from `offset` (fewer at its end): into
/// `pipe` when one is given and the file splices, else with `pread`. The
/// second value is false when the file's filesystem refused to splice.
/// Blocks: call it on the blocking pool.
fn read_block(
    file: &std::fs::File,
    path: &std::path::Path,
    offset: u64,
    want: usize,
    pipe: Option<PooledPipe>,
) -> Result<(Block, bool), WireError> {
    let copy = |offset: u64, want: usize| {
        read_at_most(file, offset, want).map_err(|e| io_error(&e, path, "cannot read"))
    };
    let mut splices = true;
    if let Some(mut pipe) = pipe {
        match pipe.fill(file, offset, want) {
            Ok(true) => return Ok((Block::Piped(pipe), true)),
            Ok(false) => {
                // Pinned in part only (the pipe filled up, or the file
                // failed midway): the part read back, the rest copied.
                let mut data = pipe
                    .read_back()
                    .map_err(|e| io_error(&e, path, "cannot read back a spliced block"))?;
                let done = data.len();
                data.extend_from_slice(&copy(offset + done as u64, want - done)?);
                return Ok((Block::Copied(data), true));
            }
            // Nothing was spliced: `pread` says what is wrong, if anything.
            Err(e) => splices = !cannot_splice(&e),
        }
    }
    Ok((Block::Copied(copy(offset, want)?), splices))
}

/// How a stream's loop ended.
enum Ending {
    /// Tell the client (`None`: the whole range was sent).
    End(Option<WireError>),
    /// The connection is gone: nobody to tell.
    Gone,
}

impl Pump {
    async fn run(mut self, start: oneshot::Receiver<()>) {
        // The head must be queued before the first block; if it never is,
        // nobody knows this stream.
        if start.await.is_err() {
            self.streams.remove(self.stream_id);
            return;
        }
        let mut total = 0u64;
        let ending = self.pump(&mut total).await;
        self.streams.remove(self.stream_id);
        let Pump {
            file,
            outbound,
            attachment,
            stream_id,
            _slot: slot,
            ..
        } = self;
        // The file closes now (unless an `fs/open` handle still holds it),
        // and the slot is free before the end is told.
        drop(file);
        drop(slot);
        if let Ending::End(error) = ending {
            let end = ReadStreamEnd {
                stream_id,
                total,
                error,
            };
            let _ = outbound
                .notify_to(attachment, methods::FS_READ_STREAM_END, &end)
                .await;
        }
    }

    async fn pump(&mut self, total: &mut u64) -> Ending {
        loop {
            let want = self.block.min(self.end - self.offset);
            if want == 0 {
                return Ending::End(None);
            }
            tokio::select! {
                _ = self.credit.take(want) => {}
                _ = self.token.cancelled() => return Ending::End(Some(self.cancelled())),
            }
            // The session's read-ahead: the block's bytes are held from
            // before the read until its frame is written.
            let permits = u32::try_from(want).unwrap_or(u32::MAX);
            let held = tokio::select! {
                p = self.read_ahead.clone().acquire_many_owned(permits) => p,
                _ = self.token.cancelled() => {
                    self.credit.untake(want);
                    return Ending::End(Some(self.cancelled()));
                }
            };
            let Ok(held) = held else {
                return Ending::Gone;
            };
            let pipe = self.pipe_for(want);
            let (file, path, offset) = (self.file.clone(), self.path.clone(), self.offset);
            let read =
                blocking(move || read_block(&file, &path, offset, want as usize, pipe)).await;
            let block = match read {
                Ok((block, splices)) => {
                    self.splice &= splices;
                    block
                }
                Err(e) => return Ending::End(Some(e)),
            };
            let n = block.len() as u64;
            if n > 0 {
                // The data follows its frame head by reference or in its
                // pipe: never copied again.
                let (to, id) = (self.attachment, self.stream_id);
                let sent = tokio::select! {
                    r = async {
                        match block {
                            Block::Piped(p) => self.outbound.notify_read_data_piped(to, id, offset, p, held).await,
                            Block::Copied(d) => self.outbound.notify_read_data(to, id, offset, Bytes::from(d), held).await,
                        }
                    } => r,
                    _ = self.token.cancelled() => return Ending::End(Some(self.cancelled())),
                };
                match sent {
                    Ok(()) => {}
                    Err(NotifyError::Unencodable(e)) => {
                        return Ending::End(Some(WireError::new(ErrorCode::Internal, e)))
                    }
                    Err(_) => return Ending::Gone,
                }
            }
            *total += n;
            self.offset += n;
            if n < want {
                // The end of the file.
                self.credit.untake(want - n);
                return Ending::End(None);
            }
        }
    }

    /// A pipe to pin a block of `want` bytes at the stream's offset in, when
    /// that is worth it and possible now.
    fn pipe_for(&self, want: u64) -> Option<PooledPipe> {
        let want = usize::try_from(want).ok()?;
        let worth = self.splice && want >= pipes::MIN_SPLICE_BYTES && self.outbound.splices();
        worth
            .then(|| self.pipes.take(pipes::capacity_for(self.offset, want)))
            .flatten()
    }

    fn cancelled(&self) -> WireError {
        WireError::new(
            ErrorCode::Cancelled,
            format!("read stream {} was cancelled", self.stream_id),
        )
        .with("stream_id", self.stream_id)
    }
}
