//! `fs/walk`: breadth-first, bounded, resumable.
//!
//! Each directory is read whole and its entries sorted by name (bytes), so a
//! walk is deterministic and a cursor can say exactly where to go on: the
//! queue of directories still to list (the first one partly listed) and the
//! last name given from it. Symlinks are entries, never followed. A
//! directory that cannot be read is an entry (from its parent's listing) and
//! an error; the walk goes on. One `statx` per entry (relative to the open
//! directory), nothing else. Directories are opened beneath the walk's
//! root by descriptor without following any symlink, so a walk never
//! leaves its root, whatever is renamed while it runs.

use super::confine::openat2;
use super::confine::{confined, Confinement, Open};
use super::{blocking, io_error, kind_of, mtime_ns};
use crate::session::Session;
use executor_protocol::types::fs::*;
use executor_protocol::{ErrorCode, WireError, WirePath};
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use std::collections::VecDeque;
use std::ffi::OsStr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::sync::Arc;

/// Fixed bytes of a result besides its entries (keys, flags, slack).
const RESULT_OVERHEAD: u64 = 256;
/// Upper bound of an entry's encoding besides its path bytes.
const ENTRY_OVERHEAD: u64 = 64;

/// Directories still to list (relative path, depth).
type Queue = VecDeque<(Vec<u8>, u32)>;

#[derive(Debug, Serialize, Deserialize)]
struct Cursor {
    v: u8,
    root: ByteBuf,
    /// Directories still to list, relative to the root, with their depth.
    queue: Vec<(ByteBuf, u32)>,
    /// The last name already given from `queue[0]`.
    after: Option<ByteBuf>,
}

fn join(rel: &[u8], name: &[u8]) -> Vec<u8> {
    if rel.is_empty() {
        name.to_vec()
    } else {
        let mut v = Vec::with_capacity(rel.len() + 1 + name.len());
        v.extend_from_slice(rel);
        v.push(b'/');
        v.extend_from_slice(name);
        v
    }
}

/// `fs/walk`
pub async fn walk(s: &Arc<Session>, p: WalkParams) -> Result<WalkResult, WireError> {
    let resolved = confined(s.profile(), &p, &p.root, "root", Open::read(true))?;
    let confinement = Confinement::of(s.profile(), &p)?;
    let max_entries = p.max_entries.min(s.limits().max_walk_entries);
    let max_bytes = p.max_response_bytes.min(s.limits().max_walk_response_bytes);
    blocking(move || {
        let root_fd = resolved.node()?;
        walk_blocking(
            &resolved.path,
            root_fd,
            &p,
            max_entries,
            max_bytes,
            confinement.as_ref(),
        )
    })
    .await
}

/// Directory `rel` beneath the walk's root, opened without following any
/// symlink (a directory swapped for a link after it was listed is an
/// error, never a way out), and listed through its descriptor.
fn list_dir(root_fd: &OwnedFd, rel: &[u8]) -> std::io::Result<Vec<(Vec<u8>, std::fs::DirEntry)>> {
    let rel = if rel.is_empty() { b".".as_slice() } else { rel };
    let dir = openat2(
        root_fd,
        OsStr::from_bytes(rel),
        OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(
                ResolveFlag::RESOLVE_BENEATH
                    | ResolveFlag::RESOLVE_NO_SYMLINKS
                    | ResolveFlag::RESOLVE_NO_MAGICLINKS,
            ),
    )?;
    std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd())).and_then(|rd| {
        rd.map(|e| e.map(|e| (e.file_name().into_vec(), e)))
            .collect::<Result<Vec<_>, _>>()
    })
}

/// Where a walk starts: the root alone, or where `cursor` says a previous
/// page of the same walk stopped (the directories still to list, the last
/// name given from the first).
fn start_from(root: &Path, cursor: Option<&[u8]>) -> Result<(Queue, Option<Vec<u8>>), WireError> {
    let Some(c) = cursor else {
        return Ok((VecDeque::from([(Vec::new(), 0u32)]), None));
    };
    let c: Cursor = rmp_serde::from_slice(c).map_err(|e| {
        WireError::invalid_params("cursor", format!("not a cursor of fs/walk: {e}"))
    })?;
    if c.v != 1 || c.root.as_slice() != root.as_os_str().as_bytes() {
        return Err(WireError::invalid_params(
            "cursor",
            "the cursor belongs to another walk (pass it back with the same root)",
        ));
    }
    // A cursor comes from the client: every directory in it must be a
    // plain relative path (no `.`, `..` or `/` at the start).
    for (r, _) in &c.queue {
        let plain = Path::new(OsStr::from_bytes(r))
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !plain {
            return Err(WireError::invalid_params(
                "cursor",
                format!(
                    "the cursor names {:?}, not a directory below the walk's root",
                    String::from_utf8_lossy(r)
                ),
            ));
        }
    }
    let queue = c
        .queue
        .into_iter()
        .map(|(r, d)| (r.into_vec(), d))
        .collect();
    Ok((queue, c.after.map(|a| a.into_vec())))
}

/// Upper bound of the encoding of `path` in an answer: as an entry (or an
/// error entry, besides its message) and as a directory in the cursor.
fn encoded_size(path: &[u8], as_entry: bool) -> u64 {
    /// Upper bound of a queued directory's encoding besides its path bytes.
    const QUEUED_OVERHEAD: u64 = 16;
    path.len() as u64
        + if as_entry {
            ENTRY_OVERHEAD
        } else {
            QUEUED_OVERHEAD
        }
}

/// A walk in progress: the directories still to list, what it found, and
/// the estimated size of its answer (entries and errors so far, plus the
/// cursor the queue would make).
struct Walk<'a> {
    root: &'a Path,
    root_fd: &'a OwnedFd,
    p: &'a WalkParams,
    max_entries: u64,
    max_bytes: u64,
    confinement: Option<&'a Confinement>,
    queue: Queue,
    after: Option<Vec<u8>>,
    entries: Vec<WalkEntry>,
    errors: Vec<WalkErrorEntry>,
    size_est: u64,
    queue_est: u64,
    dirs_read: u64,
    truncated_by: Option<TruncatedBy>,
    depth_cut: bool,
}

/// Whether the walk goes on after a directory.
enum Next {
    Continue,
    Stop(TruncatedBy),
}

impl Walk<'_> {
    fn error(&mut self, path: Vec<u8>, code: ErrorCode, message: String) {
        self.size_est += encoded_size(&path, true) + message.len() as u64;
        self.errors.push(WalkErrorEntry {
            path: WirePath::from_bytes(path),
            code,
            message,
        });
    }

    fn hidden_error(&mut self, path: Vec<u8>) {
        let message = format!(
            "{}: hidden by a deny_read carve-out",
            String::from_utf8_lossy(&path)
        );
        self.error(path, ErrorCode::SandboxDenied, message);
    }

    fn enqueue(&mut self, rel: Vec<u8>, depth: u32) {
        self.queue_est += encoded_size(&rel, false);
        self.queue.push_back((rel, depth));
    }

    /// The first queued directory is done.
    fn dequeue(&mut self) {
        if let Some((rel, _)) = self.queue.pop_front() {
            self.queue_est -= encoded_size(&rel, false);
        }
        self.after = None;
    }

    fn run(&mut self) -> Result<(), WireError> {
        while let Some((rel, depth)) = self.queue.front().cloned() {
            if self.dirs_read >= self.p.max_directories {
                self.truncated_by = Some(TruncatedBy::MaxDirectories);
                return Ok(());
            }
            self.dirs_read += 1;
            if let Next::Stop(by) = self.list(rel, depth)? {
                self.truncated_by = Some(by);
                return Ok(());
            }
            self.dequeue();
        }
        Ok(())
    }

    /// List directory `rel` (from after the last name given), adding its
    /// entries until a bound is reached.
    fn list(&mut self, rel: Vec<u8>, depth: u32) -> Result<Next, WireError> {
        let abs = if rel.is_empty() {
            self.root.to_path_buf()
        } else {
            self.root.join(OsStr::from_bytes(&rel))
        };
        // (A cursor may name any directory: carve-outs are checked here
        // too, not only when a directory is queued.)
        if !rel.is_empty() && self.confinement.is_some_and(|c| c.hidden(&abs)) {
            self.hidden_error(rel);
            return Ok(Next::Continue);
        }
        let mut list = match list_dir(self.root_fd, &rel) {
            Ok(l) => l,
            Err(e) if rel.is_empty() => return Err(io_error(&e, &abs, "cannot walk")),
            Err(e) => {
                let w = io_error(&e, &abs, "cannot read directory");
                self.error(rel, w.code, w.message);
                return Ok(Next::Continue);
            }
        };
        list.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let start = match &self.after {
            None => 0,
            Some(a) => list.partition_point(|e| e.0.as_slice() <= a.as_slice()),
        };
        // The last name given (where a cursor resumes) is copied once per
        // directory, not once per entry.
        let mut given: Option<&[u8]> = None;
        let mut stop = None;
        for (name, entry) in &list[start..] {
            if !self.p.include_hidden && name.first() == Some(&b'.') {
                continue;
            }
            let path = join(&rel, name);
            if self.entries.len() as u64 >= self.max_entries {
                stop = Some(TruncatedBy::MaxEntries);
                break;
            }
            let room = self.size_est + self.queue_est;
            if room + encoded_size(&path, true) + encoded_size(&path, false) > self.max_bytes {
                stop = Some(TruncatedBy::MaxResponseBytes);
                break;
            }
            self.add(&abs, path, name, entry, depth);
            given = Some(name);
        }
        if let Some(name) = given {
            self.after = Some(name.to_vec());
        }
        Ok(stop.map_or(Next::Continue, Next::Stop))
    }

    /// One listed entry: an entry (a carve-out by name only, never
    /// entered), an error if it vanished, a directory queued below the
    /// depth bound.
    fn add(
        &mut self,
        abs: &Path,
        path: Vec<u8>,
        name: &[u8],
        entry: &std::fs::DirEntry,
        depth: u32,
    ) {
        let (kind, size, mtime) = match entry.metadata() {
            Ok(m) => (kind_of(m.file_type()), m.len(), mtime_ns(&m)),
            Err(e) => {
                // Vanished between listing and stat: report, go on.
                let w = io_error(&e, &abs.join(OsStr::from_bytes(name)), "cannot stat");
                self.error(path, w.code, w.message);
                return;
            }
        };
        let hidden = self
            .confinement
            .is_some_and(|c| c.hidden(&abs.join(OsStr::from_bytes(name))));
        let (size, mtime) = if hidden { (0, 0) } else { (size, mtime) };
        if hidden {
            self.hidden_error(path.clone());
        } else if kind == FileKind::Dir {
            let child_depth = depth + 1;
            if child_depth < self.p.max_depth {
                self.enqueue(path.clone(), child_depth);
            } else if !self.depth_cut {
                self.depth_cut = list_dir(self.root_fd, &path).is_ok_and(|d| !d.is_empty());
            }
        }
        self.size_est += encoded_size(&path, true);
        self.entries.push(WalkEntry {
            path: WirePath::from_bytes(path),
            kind,
            size,
            mtime_ns: mtime,
        });
    }

    /// The answer: what was found, and a cursor if a bound cut the walk.
    fn finish(self) -> Result<WalkResult, WireError> {
        let next_cursor = match self.truncated_by {
            Some(_) => {
                let c = Cursor {
                    v: 1,
                    root: ByteBuf::from(self.root.as_os_str().as_bytes().to_vec()),
                    queue: self
                        .queue
                        .into_iter()
                        .map(|(r, d)| (ByteBuf::from(r), d))
                        .collect(),
                    after: self.after.map(ByteBuf::from),
                };
                Some(ByteBuf::from(rmp_serde::to_vec(&c).map_err(|e| {
                    WireError::new(
                        ErrorCode::Internal,
                        format!("cannot encode the walk cursor: {e}"),
                    )
                })?))
            }
            None => None,
        };
        let truncated_by = match self.truncated_by {
            None if self.depth_cut => Some(TruncatedBy::MaxDepth),
            by => by,
        };
        Ok(WalkResult {
            entries: self.entries,
            errors: self.errors,
            truncated: truncated_by.is_some(),
            truncated_by,
            next_cursor,
        })
    }
}

fn walk_blocking(
    root: &Path,
    root_fd: &OwnedFd,
    p: &WalkParams,
    max_entries: u64,
    max_bytes: u64,
    confinement: Option<&Confinement>,
) -> Result<WalkResult, WireError> {
    let (queue, after) = start_from(root, p.cursor.as_ref().map(|c| c.as_slice()))?;
    let queue_est = queue.iter().map(|(r, _)| encoded_size(r, false)).sum();
    let mut walk = Walk {
        root,
        root_fd,
        p,
        max_entries,
        max_bytes,
        confinement,
        queue,
        after,
        entries: Vec::new(),
        errors: Vec::new(),
        size_est: RESULT_OVERHEAD + root.as_os_str().len() as u64,
        queue_est,
        dirs_read: 0,
        truncated_by: None,
        depth_cut: false,
    };
    walk.run()?;
    walk.finish()
}
