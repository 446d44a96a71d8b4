//! The session's open file handles ([`HandleTable`]): read handles hold
//! the opened file, write handles their temp file ([`TempFile`], removed
//! with an uncommitted handle).
//!
//! Below the session: it uses the protocol's types and the OS, nothing of
//! the agent above it. The `fs/open` … `fs/close` handlers are in
//! [`crate::fs::handles`].

use executor_protocol::{ErrorCode, WireError};
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A temp file made for an atomic replace of `target`, in the directory
/// that holds it (`O_EXCL`, never through a symlink). Made and finished in
/// [`crate::fs`].
#[derive(Debug)]
pub struct TempFile {
    pub file: std::fs::File,
    pub dir: OwnedFd,
    pub tmp: std::ffi::OsString,
    pub name: std::ffi::OsString,
    /// For messages.
    pub target: PathBuf,
    /// Made under a sandbox intent: a mode taken from the file it replaces
    /// keeps no setuid or setgid bit.
    pub confined: bool,
}

impl TempFile {
    /// Remove the temp file (an uncommitted or failed write).
    pub fn discard(&self) {
        let _ = nix::unistd::unlinkat(
            &self.dir,
            self.tmp.as_os_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        );
    }
}

/// The modification and access times a committed write gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileTimes {
    pub mtime_ns: Option<i64>,
    pub atime_ns: Option<i64>,
}

/// An uncommitted write: its temp file (made in the target's directory,
/// held open by descriptor) goes away with it.
#[derive(Debug)]
pub struct WriteHandle {
    pub temp: TempFile,
    /// The mode the committed file gets.
    pub mode: Option<u32>,
    /// The times it gets (ns since the epoch; `None`: as the kernel sets them).
    pub times: FileTimes,
    /// Committed (or failed): the temp file is no longer ours to delete.
    pub done: AtomicBool,
}

impl Drop for WriteHandle {
    fn drop(&mut self) {
        if !self.done.load(Ordering::SeqCst) {
            self.temp.discard();
        }
    }
}

/// An open handle.
#[derive(Debug, Clone)]
pub enum Handle {
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
    pub fn check_room(&self, max: u64) -> Result<(), WireError> {
        Self::room(&self.map.lock().expect("handle table"), max)
    }

    pub fn insert(&self, h: Handle, max: u64) -> Result<u64, WireError> {
        let mut map = self.map.lock().expect("handle table");
        Self::room(&map, max)?;
        let id = self.next.fetch_add(1, Ordering::SeqCst) + 1;
        map.insert(id, h);
        Ok(id)
    }

    /// A read handle (`invalid_params` for a write handle).
    pub fn reader(&self, id: u64) -> Result<(Arc<std::fs::File>, PathBuf), WireError> {
        match self.map.lock().expect("handle table").get(&id) {
            Some(Handle::Read { file, path }) => Ok((file.clone(), path.clone())),
            Some(Handle::Write(_)) => Err(wrong_kind(id, "writing")),
            None => Err(unknown(id)),
        }
    }

    /// A write handle, kept open (`invalid_params` for a read handle).
    pub fn writer(&self, id: u64) -> Result<Arc<WriteHandle>, WireError> {
        match self.map.lock().expect("handle table").get(&id) {
            Some(Handle::Write(h)) => Ok(h.clone()),
            Some(Handle::Read { .. }) => Err(wrong_kind(id, "reading")),
            None => Err(unknown(id)),
        }
    }

    /// A write handle, released from the table.
    pub fn take_writer(&self, id: u64) -> Result<Arc<WriteHandle>, WireError> {
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
    pub fn committed(&self, id: u64) {
        let mut c = self.committed.lock().expect("committed handles");
        if c.len() >= COMMITTED_KEPT {
            c.pop_front();
        }
        c.push_back(id);
    }

    /// The handle, released; `None` for a committed one (forgotten now).
    pub fn take(&self, id: u64) -> Result<Option<Handle>, WireError> {
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
