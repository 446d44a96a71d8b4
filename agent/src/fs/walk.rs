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

use super::confine::{confined, Access, Confinement};
use super::{blocking, io_error, kind_of, mtime_ns};
use crate::session::Session;
use executor_protocol::types::fs::*;
use executor_protocol::{ErrorCode, WireError, WirePath};
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
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
    let resolved = confined(s.profile(), &p, &p.root, "root", Access::Read, true)?;
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

fn walk_blocking(
    root: &Path,
    root_fd: &OwnedFd,
    p: &WalkParams,
    max_entries: u64,
    max_bytes: u64,
    confinement: Option<&Confinement>,
) -> Result<WalkResult, WireError> {
    let (mut queue, mut after): (Queue, Option<Vec<u8>>) = match &p.cursor {
        None => (VecDeque::from([(Vec::new(), 0u32)]), None),
        Some(c) => {
            let c: Cursor = rmp_serde::from_slice(c).map_err(|e| {
                WireError::invalid_params("cursor", format!("not a cursor of fs/walk: {e}"))
            })?;
            if c.v != 1 || c.root.as_slice() != root.as_os_str().as_bytes() {
                return Err(WireError::invalid_params(
                    "cursor",
                    "the cursor belongs to another walk (pass it back with the same root)",
                ));
            }
            // A cursor comes from the client: every directory in it must
            // be a plain relative path (no `.`, `..` or `/` at the start).
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
            (
                c.queue
                    .into_iter()
                    .map(|(r, d)| (r.into_vec(), d))
                    .collect(),
                c.after.map(|a| a.into_vec()),
            )
        }
    };
    let mut entries: Vec<WalkEntry> = Vec::new();
    let mut errors: Vec<WalkErrorEntry> = Vec::new();
    let mut size_est = RESULT_OVERHEAD + root.as_os_str().len() as u64;
    let mut queue_est: u64 = queue.iter().map(|(r, _)| r.len() as u64 + 16).sum();
    let mut dirs_read = 0u64;
    let mut truncated_by = None;
    let mut depth_cut = false;

    'dirs: while let Some((rel, depth)) = queue.front().cloned() {
        if dirs_read >= p.max_directories {
            truncated_by = Some(TruncatedBy::MaxDirectories);
            break;
        }
        dirs_read += 1;
        let abs = if rel.is_empty() {
            root.to_path_buf()
        } else {
            root.join(OsStr::from_bytes(&rel))
        };
        // (A cursor may name any directory: carve-outs are checked here
        // too, not only when a directory is queued.)
        if !rel.is_empty() && confinement.is_some_and(|c| c.hidden(&abs)) {
            let message = format!(
                "{}: hidden by a deny_read carve-out",
                String::from_utf8_lossy(&rel)
            );
            size_est += rel.len() as u64 + ENTRY_OVERHEAD + message.len() as u64;
            errors.push(WalkErrorEntry {
                path: WirePath::from_bytes(rel.clone()),
                code: ErrorCode::SandboxDenied,
                message,
            });
            queue.pop_front();
            queue_est -= rel.len() as u64 + 16;
            after = None;
            continue;
        }
        let read = list_dir(root_fd, &rel);
        let mut list = match read {
            Ok(l) => l,
            Err(e) if rel.is_empty() => return Err(io_error(&e, &abs, "cannot walk")),
            Err(e) => {
                let w = io_error(&e, &abs, "cannot read directory");
                size_est += rel.len() as u64 + ENTRY_OVERHEAD + w.message.len() as u64;
                errors.push(WalkErrorEntry {
                    path: WirePath::from_bytes(rel.clone()),
                    code: w.code,
                    message: w.message,
                });
                queue.pop_front();
                queue_est -= rel.len() as u64 + 16;
                after = None;
                continue;
            }
        };
        list.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let start = match &after {
            None => 0,
            Some(a) => list.partition_point(|e| e.0.as_slice() <= a.as_slice()),
        };
        for (name, entry) in &list[start..] {
            let name = name.as_slice();
            if !p.include_hidden && name.first() == Some(&b'.') {
                continue;
            }
            let path = join(&rel, name);
            let est = path.len() as u64 + ENTRY_OVERHEAD;
            if entries.len() as u64 >= max_entries {
                truncated_by = Some(TruncatedBy::MaxEntries);
                break 'dirs;
            }
            if size_est + queue_est + est + path.len() as u64 + 16 > max_bytes {
                truncated_by = Some(TruncatedBy::MaxResponseBytes);
                break 'dirs;
            }
            let (kind, size, mtime) = match entry.metadata() {
                Ok(m) => (kind_of(m.file_type()), m.len(), mtime_ns(&m)),
                Err(e) => {
                    // Vanished between listing and stat: report, go on.
                    let w = io_error(&e, &abs.join(OsStr::from_bytes(name)), "cannot stat");
                    size_est += est + w.message.len() as u64;
                    errors.push(WalkErrorEntry {
                        path: WirePath::from_bytes(path),
                        code: w.code,
                        message: w.message,
                    });
                    after = Some(name.to_vec());
                    continue;
                }
            };
            // A carve-out is listed by name only (no size, no time) and
            // never entered.
            let hidden = confinement.is_some_and(|c| c.hidden(&abs.join(OsStr::from_bytes(name))));
            let (size, mtime) = if hidden { (0, 0) } else { (size, mtime) };
            if hidden {
                let message = format!(
                    "{}: hidden by a deny_read carve-out",
                    String::from_utf8_lossy(&path)
                );
                size_est += est + message.len() as u64;
                errors.push(WalkErrorEntry {
                    path: WirePath::from_bytes(path.clone()),
                    code: ErrorCode::SandboxDenied,
                    message,
                });
            } else if kind == FileKind::Dir {
                let child_depth = depth + 1;
                if child_depth < p.max_depth {
                    queue_est += path.len() as u64 + 16;
                    queue.push_back((path.clone(), child_depth));
                } else if !depth_cut {
                    depth_cut = list_dir(root_fd, &path).is_ok_and(|d| !d.is_empty());
                }
            }
            size_est += est;
            entries.push(WalkEntry {
                path: WirePath::from_bytes(path),
                kind,
                size,
                mtime_ns: mtime,
            });
            after = Some(name.to_vec());
        }
        queue.pop_front();
        queue_est -= rel.len() as u64 + 16;
        after = None;
    }

    let next_cursor = match truncated_by {
        Some(_) => {
            let c = Cursor {
                v: 1,
                root: ByteBuf::from(root.as_os_str().as_bytes().to_vec()),
                queue: queue
                    .into_iter()
                    .map(|(r, d)| (ByteBuf::from(r), d))
                    .collect(),
                after: after.map(ByteBuf::from),
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
    if truncated_by.is_none() && depth_cut {
        truncated_by = Some(TruncatedBy::MaxDepth);
    }
    Ok(WalkResult {
        entries,
        errors,
        truncated: truncated_by.is_some(),
        truncated_by,
        next_cursor,
    })
}
