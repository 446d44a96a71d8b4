//! Streaming handles: `fs/open` + `fs/readBlock`, `fs/openWrite` +
//! `fs/writeBlock` + `fs/commit`, and `fs/close`.
//!
//! A read handle keeps the opened file (not the path): reads continue from
//! the same inode after the path is replaced. A write handle writes a temp
//! file beside its target; `fs/commit` fsyncs and renames it into place (the
//! handle is then released), and `fs/close` or the end of the session
//! removes an uncommitted temp file. A committed handle's id is remembered
//! (the last [`COMMITTED_KEPT`]) so that its `fs/close` answers `{}` once.

use super::confine::{confined, confined_creating, Access};
use super::{blocking, create_temp, io_error, read_at_most, TempFile};
use crate::session::Session;
use bytes::Bytes;
use executor_protocol::types::fs::*;
use executor_protocol::types::Empty;
use executor_protocol::{ErrorCode, WireError};
use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// An uncommitted write: its temp file (made in the target's directory,
/// held open by descriptor) goes away with it.
#[derive(Debug)]
pub struct WriteHandle {
    temp: TempFile,
    mode: Option<u32>,
    done: AtomicBool,
}

impl Drop for WriteHandle {
    fn drop(&mut self) {
        if !self.done.load(Ordering::SeqCst) {
            self.temp.discard();
        }
    }
}

#[derive(Debug, Clone)]
enum Handle {
    Read {
        file: Arc<std::fs::File>,
        path: PathBuf,
    },
    Write(Arc<WriteHandle>),
}

/// The session's open handles.
#[derive(Debug, Default)]
pub struct HandleTable {
    map: Mutex<HashMap<u64, Handle>>,
    /// Ids of committed write handles not closed yet, oldest first.
    committed: Mutex<std::collections::VecDeque<u64>>,
    next: AtomicU64,
}

/// How many committed-but-not-closed handle ids are remembered (ids only;
/// a client that never closes cannot grow the table past this).
pub const COMMITTED_KEPT: usize = 4096;

impl HandleTable {
    fn room(map: &HashMap<u64, Handle>, max: u64) -> Result<(), WireError> {
        if map.len() as u64 >= max {
            return Err(WireError::limit("max_open_files", max, None));
        }
        Ok(())
    }

    /// Fail early (before creating anything) when no handle slot is free.
    fn check_room(&self, max: u64) -> Result<(), WireError> {
        Self::room(&self.map.lock().expect("handle table"), max)
    }

    fn insert(&self, h: Handle, max: u64) -> Result<u64, WireError> {
        let mut map = self.map.lock().expect("handle table");
        Self::room(&map, max)?;
        let id = self.next.fetch_add(1, Ordering::SeqCst) + 1;
        map.insert(id, h);
        Ok(id)
    }

    /// A read handle (`invalid_params` for a write handle).
    fn reader(&self, id: u64) -> Result<(Arc<std::fs::File>, PathBuf), WireError> {
        match self.map.lock().expect("handle table").get(&id) {
            Some(Handle::Read { file, path }) => Ok((file.clone(), path.clone())),
            Some(Handle::Write(_)) => Err(wrong_kind(id, "writing")),
            None => Err(unknown(id)),
        }
    }

    /// A write handle, kept open (`invalid_params` for a read handle).
    fn writer(&self, id: u64) -> Result<Arc<WriteHandle>, WireError> {
        match self.map.lock().expect("handle table").get(&id) {
            Some(Handle::Write(h)) => Ok(h.clone()),
            Some(Handle::Read { .. }) => Err(wrong_kind(id, "reading")),
            None => Err(unknown(id)),
        }
    }

    /// A write handle, released from the table.
    fn take_writer(&self, id: u64) -> Result<Arc<WriteHandle>, WireError> {
        let mut map = self.map.lock().expect("handle table");
        match map.get(&id) {
            Some(Handle::Write(_)) => match map.remove(&id) {
                Some(Handle::Write(h)) => Ok(h),
                _ => Err(unknown(id)),
            },
            Some(Handle::Read { .. }) => Err(wrong_kind(id, "reading")),
            None => Err(unknown(id)),
        }
    }

    /// Remember `id` as committed (its close answers `{}` once).
    fn committed(&self, id: u64) {
        let mut c = self.committed.lock().expect("committed handles");
        if c.len() >= COMMITTED_KEPT {
            c.pop_front();
        }
        c.push_back(id);
    }

    /// The handle, released; `None` for a committed one (forgotten now).
    fn take(&self, id: u64) -> Result<Option<Handle>, WireError> {
        if let Some(h) = self.map.lock().expect("handle table").remove(&id) {
            return Ok(Some(h));
        }
        let mut c = self.committed.lock().expect("committed handles");
        match c.iter().position(|&x| x == id) {
            Some(i) => {
                c.remove(i);
                Ok(None)
            }
            None => Err(unknown(id)),
        }
    }

    /// Close everything (end of session): temp files of uncommitted writes go.
    pub fn close_all(&self) {
        self.map.lock().expect("handle table").clear();
    }
}

fn wrong_kind(id: u64, opened_for: &str) -> WireError {
    WireError::invalid_params("handle", format!("handle {id} was opened for {opened_for}"))
}

fn unknown(id: u64) -> WireError {
    WireError::new(
        ErrorCode::UnknownHandle,
        format!("no open handle {id} in this session"),
    )
    .with("handle", id)
}

fn check_block(len: u64, s: &Session) -> Result<(), WireError> {
    let max = s.limits().max_block_bytes;
    if len > max {
        return Err(WireError::limit("max_block_bytes", max, Some(len)));
    }
    Ok(())
}

/// `fs/open`
pub async fn open(s: &Arc<Session>, p: OpenParams) -> Result<OpenResult, WireError> {
    let path = confined(s.profile(), &p, &p.path, "path", Access::Read, true)?;
    let (file, size, path) = blocking({
        move || {
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
        }
    })
    .await?;
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
pub async fn read_block(s: &Arc<Session>, p: ReadBlockParams) -> Result<(bool, Bytes), WireError> {
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
        Ok((eof, Bytes::from(data)))
    })
    .await
}

/// `fs/openWrite`
pub async fn open_write(s: &Arc<Session>, p: OpenWriteParams) -> Result<HandleResult, WireError> {
    super::check_mode(p.mode)?;
    // No temp file (nor parent directory) when no slot is free.
    s.handles().check_room(s.limits().max_open_files)?;
    let target = confined_creating(
        s.profile(),
        &p,
        &p.path,
        "path",
        Access::Write,
        false,
        p.create_parents,
    )?;
    super::check_confined_mode(p.mode, &target)?;
    let h = blocking(move || {
        Ok(WriteHandle {
            temp: create_temp(target)?,
            mode: p.mode,
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
pub async fn commit(s: &Arc<Session>, p: HandleParams) -> Result<CommitResult, WireError> {
    let h = s.handles().take_writer(p.handle)?;
    s.handles().committed(p.handle);
    blocking(move || {
        let size = h
            .temp
            .file
            .metadata()
            .map_err(|e| io_error(&e, &h.temp.target, "cannot stat"))?
            .len();
        let r = h.temp.finish(h.mode);
        // Committed or failed (then finish_temp removed the temp): either
        // way the temp file is no longer ours to delete.
        h.done.store(true, Ordering::SeqCst);
        r?;
        Ok(CommitResult { size })
    })
    .await
}

/// `fs/close`
pub async fn close(s: &Arc<Session>, p: HandleParams) -> Result<Empty, WireError> {
    let h = s.handles().take(p.handle)?;
    // Dropping a write handle removes its uncommitted temp file.
    blocking(move || {
        drop(h);
        Ok(Empty {})
    })
    .await
}
