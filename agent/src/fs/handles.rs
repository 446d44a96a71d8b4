//! Streaming handles: `fs/open` + `fs/readBlock` (or `fs/passDescriptor`),
//! `fs/openWrite` + `fs/writeBlock` + `fs/commit`, and `fs/close`.
//!
//! A read handle keeps the opened file (not the path): reads continue from
//! the same inode after the path is replaced. A write handle writes a temp
//! file beside its target; `fs/commit` fsyncs and renames it into place (the
//! handle is then released), and `fs/close` or the end of the session
//! removes an uncommitted temp file. A committed handle's id is remembered
//! (the last [`COMMITTED_KEPT`]) so that its `fs/close` answers `{}` once.

use super::confine::Open;
use super::{blocking, create_temp, io_error, read_at_most, target};
use crate::outbound::Reply;
use crate::session::Session;
pub use crate::tables::handles::{FileTimes, Handle, HandleTable, WriteHandle, COMMITTED_KEPT};
use bytes::Bytes;
use executor_protocol::types::fs::*;
use executor_protocol::types::Empty;
use executor_protocol::WireError;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

fn check_block(len: u64, s: &Session) -> Result<(), WireError> {
    let max = s.limits().max_block_bytes;
    if len > max {
        return Err(WireError::limit("max_block_bytes", max, Some(len)));
    }
    Ok(())
}

/// The file `path` resolved to, opened for reading (never a directory):
/// what `fs/open` and `fs/readStream` read from, and its size.
pub async fn open_resolved(
    path: super::confine::Resolved,
) -> Result<(std::fs::File, u64, std::path::PathBuf), WireError> {
    blocking(move || {
        let f = path.reopen(libc::O_RDONLY | libc::O_CLOEXEC)?;
        let path = path.path;
        let m = f
            .metadata()
            .map_err(|e| io_error(&e, &path, "cannot stat"))?;
        if m.is_dir() {
            return Err(io_error(
                &std::io::Error::from_raw_os_error(libc::EISDIR),
                &path,
                "cannot open",
            ));
        }
        Ok((f, m.len(), path))
    })
    .await
}

/// `fs/open`
pub async fn open(s: &Arc<Session>, p: OpenParams) -> Result<OpenResult, WireError> {
    let (file, size, path) = open_resolved(target(s, &p, Open::read(true))?).await?;
    let handle = s.handles().insert(
        Handle::Read {
            file: Arc::new(file),
            path,
        },
        s.limits().max_open_files,
    )?;
    Ok(OpenResult { handle, size })
}

/// `fs/readBlock`: the data (sent by reference) and whether the read
/// reached the end of the file.
pub async fn read_block(s: &Arc<Session>, p: ReadBlockParams) -> Result<Reply, WireError> {
    check_block(p.length, s)?;
    let (file, path) = s.handles().reader(p.handle)?;
    blocking(move || {
        let data = read_at_most(&file, p.offset, p.length as usize)
            .map_err(|e| io_error(&e, &path, "cannot read"))?;
        let eof = if (data.len() as u64) < p.length {
            true
        } else {
            let size = file
                .metadata()
                .map_err(|e| io_error(&e, &path, "cannot stat"))?
                .len();
            p.offset + data.len() as u64 >= size
        };
        Ok(Reply::Block {
            eof,
            data: Bytes::from(data),
        })
    })
    .await
}

/// `fs/passDescriptor`: a duplicate of the read handle's open file (read
/// only, as `fs/open` opened it) and its identity; the connection decides
/// whether it may be sent (`conn::admit`), its writer sends it with the
/// answer. The path is not looked up again: the handle's file is.
pub async fn pass_descriptor(
    s: &Arc<Session>,
    p: PassDescriptorParams,
) -> Result<Reply, WireError> {
    use std::os::unix::fs::MetadataExt;
    let (file, path) = s.handles().reader(p.handle)?;
    blocking(move || {
        let m = file
            .metadata()
            .map_err(|e| io_error(&e, &path, "cannot stat"))?;
        let dup = file
            .try_clone()
            .map_err(|e| io_error(&e, &path, "cannot duplicate the descriptor of"))?;
        Ok(Reply::Descriptor {
            value: Box::new(PassDescriptorResult {
                dev: m.dev(),
                ino: m.ino(),
            }),
            fd: dup.into(),
        })
    })
    .await
}

/// `fs/openWrite`
pub async fn open_write(s: &Arc<Session>, p: OpenWriteParams) -> Result<HandleResult, WireError> {
    super::check_mode(p.mode)?;
    // No temp file (nor parent directory) when no slot is free.
    s.handles().check_room(s.limits().max_open_files)?;
    let target = target(s, &p, Open::write(p.create_parents))?;
    super::check_confined_mode(p.mode, &target)?;
    let h = blocking(move || {
        Ok(WriteHandle {
            temp: create_temp(target)?,
            mode: p.mode,
            times: FileTimes {
                mtime_ns: p.mtime_ns,
                atime_ns: p.atime_ns,
            },
            done: AtomicBool::new(false),
        })
    })
    .await?;
    let handle = s
        .handles()
        .insert(Handle::Write(Arc::new(h)), s.limits().max_open_files)?;
    Ok(HandleResult { handle })
}

/// `fs/writeBlock`
pub async fn write_block(s: &Arc<Session>, p: WriteBlockParams) -> Result<Empty, WireError> {
    check_block(p.data.len() as u64, s)?;
    let h = s.handles().writer(p.handle)?;
    blocking(move || {
        h.temp
            .file
            .write_all_at(&p.data, p.offset)
            .map_err(|e| io_error(&e, &h.temp.target, "cannot write"))?;
        Ok(Empty {})
    })
    .await
}

/// `fs/commit`: fsync, rename into place, release the handle.
pub async fn commit(s: &Arc<Session>, p: CommitParams) -> Result<CommitResult, WireError> {
    let h = s.handles().take_writer(p.handle)?;
    s.handles().committed(p.handle);
    blocking(move || {
        let size = h
            .temp
            .file
            .metadata()
            .map_err(|e| io_error(&e, &h.temp.target, "cannot stat"))?
            .len();
        let r = h.temp.finish(h.mode, h.times);
        // Committed or failed (then finish_temp removed the temp): either
        // way the temp file is no longer ours to delete.
        h.done.store(true, Ordering::SeqCst);
        r?;
        Ok(CommitResult { size })
    })
    .await
}

/// `fs/close`
pub async fn close(s: &Arc<Session>, p: CloseParams) -> Result<Empty, WireError> {
    let h = s.handles().take(p.handle)?;
    // Dropping a write handle removes its uncommitted temp file.
    blocking(move || {
        drop(h);
        Ok(Empty {})
    })
    .await
}
