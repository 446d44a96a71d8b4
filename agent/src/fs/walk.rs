//! `fs/walk`: breadth-first, bounded, resumable.
//!
//! Each directory is read whole and its entries sorted by name (bytes), so a
//! walk is deterministic and a cursor can say exactly where to go on: the
//! queue of directories still to list (the first one partly listed) and the
//! last name given from it. Symlinks are entries, never followed. A
//! directory that cannot be read is an entry (from its parent's listing) and
//! an error; the walk goes on. A directory's names are read into one
//! buffer (no allocation per name), then one `fstatat` per entry relative
//! to the open directory, nothing else. Directories are opened beneath the walk's
//! root by descriptor without following any symlink, so a walk never
//! leaves its root, whatever is renamed while it runs.

use super::confine::openat2;
use super::confine::{confined, Confinement, Open};
use super::{blocking, io_error};
use crate::session::Session;
use executor_protocol::types::fs::*;
use executor_protocol::{ErrorCode, WireError, WirePath};
use nix::dir::Dir;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstatat, FileStat};
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use std::collections::VecDeque;
use std::ffi::{CStr, OsStr};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
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

/// A directory's names, read through its own descriptor: one buffer of
/// NUL-terminated names (`.` and `..` left out) and where each starts,
/// sorted by name bytes. Nothing is allocated per name.
struct Listing {
    /// The directory (read-only): its names are `stat`ed relative to it.
    fd: OwnedFd,
    names: Vec<u8>,
    /// (start, length without the NUL) of each name in `names`.
    spans: Vec<(usize, usize)>,
}

impl Listing {
    fn len(&self) -> usize {
        self.spans.len()
    }

    fn name(&self, i: usize) -> &[u8] {
        let (start, len) = self.spans[i];
        &self.names[start..start + len]
    }

    /// Name `i`'s metadata, relative to the directory, never following a
    /// symlink.
    fn stat(&self, i: usize) -> nix::Result<FileStat> {
        let (start, len) = self.spans[i];
        let name = CStr::from_bytes_with_nul(&self.names[start..=start + len])
            .map_err(|_| nix::errno::Errno::EINVAL)?;
        fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW)
    }
}

/// Directory `rel` beneath the walk's root, opened without following any
/// symlink (a directory swapped for a link after it was listed is an
/// error, never a way out), and listed through its descriptor.
fn list_dir(root_fd: &OwnedFd, rel: &[u8]) -> std::io::Result<Listing> {
    let rel = if rel.is_empty() { b".".as_slice() } else { rel };
    let fd = openat2(
        root_fd,
        OsStr::from_bytes(rel),
        OpenHow::new()
            .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(
                ResolveFlag::RESOLVE_BENEATH
                    | ResolveFlag::RESOLVE_NO_SYMLINKS
                    | ResolveFlag::RESOLVE_NO_MAGICLINKS,
            ),
    )?;
    // The stream reads through a duplicate of the descriptor (the same
    // open directory), which it closes; `fd` stays for the `stat`s.
    let mut dir = Dir::from_fd(fd.try_clone()?)?;
    let (mut names, mut spans) = (Vec::new(), Vec::new());
    for e in dir.iter() {
        let e = e?;
        let name = e.file_name().to_bytes_with_nul();
        if name == b".\0" || name == b"..\0" {
            continue;
        }
        spans.push((names.len(), name.len() - 1));
        names.extend_from_slice(name);
    }
    spans.sort_unstable_by(|&(a, al), &(b, bl)| names[a..a + al].cmp(&names[b..b + bl]));
    Ok(Listing { fd, names, spans })
}

/// The wire kind of a `stat` mode (symlinks are never followed here).
fn kind_of_mode(mode: libc::mode_t) -> FileKind {
    match mode & libc::S_IFMT {
        libc::S_IFLNK => FileKind::Symlink,
        libc::S_IFDIR => FileKind::Dir,
        libc::S_IFREG => FileKind::File,
        _ => FileKind::Other,
    }
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
        let list = match list_dir(self.root_fd, &rel) {
            Ok(l) => l,
            Err(e) if rel.is_empty() => return Err(io_error(&e, &abs, "cannot walk")),
            Err(e) => {
                let w = io_error(&e, &abs, "cannot read directory");
                self.error(rel, w.code, w.message);
                return Ok(Next::Continue);
            }
        };
        let start = match &self.after {
            None => 0,
            Some(a) => list
                .spans
                .partition_point(|&(s, l)| &list.names[s..s + l] <= a.as_slice()),
        };
        // The last name given (where a cursor resumes) is copied once per
        // directory, not once per entry.
        let mut given: Option<&[u8]> = None;
        let mut stop = None;
        for i in start..list.len() {
            let name = list.name(i);
            if !self.p.include_hidden && name.first() == Some(&b'.') {
                continue;
            }
            if self.entries.len() as u64 >= self.max_entries {
                stop = Some(TruncatedBy::MaxEntries);
                break;
            }
            let path = join(&rel, name);
            let room = self.size_est + self.queue_est;
            if room + encoded_size(&path, true) + encoded_size(&path, false) > self.max_bytes {
                stop = Some(TruncatedBy::MaxResponseBytes);
                break;
            }
            self.add(&abs, path, name, list.stat(i), depth);
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
        stat: nix::Result<FileStat>,
        depth: u32,
    ) {
        let (kind, size, mtime, linked) = match stat {
            Ok(st) => (
                kind_of_mode(st.st_mode),
                st.st_size as u64,
                st.st_mtime
                    .saturating_mul(1_000_000_000)
                    .saturating_add(st.st_mtime_nsec),
                // Another name of a file a deny_read carve-out holds.
                self.confinement.is_some_and(|c| {
                    c.refuses_identity(&st, super::confine::Access::Read)
                        .is_some()
                }),
            ),
            Err(e) => {
                let e = std::io::Error::from(e);
                // Vanished between listing and stat: report, go on.
                let w = io_error(&e, &abs.join(OsStr::from_bytes(name)), "cannot stat");
                self.error(path, w.code, w.message);
                return;
            }
        };
        let hidden = linked
            || self
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
                self.depth_cut = list_dir(self.root_fd, &path).is_ok_and(|d| d.len() > 0);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStringExt;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    use std::path::PathBuf;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("walk-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn root_fd(root: &Path) -> OwnedFd {
        std::fs::File::options()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
            .open(root)
            .unwrap()
            .into()
    }

    fn params(root: &Path, max_entries: u64, cursor: Option<ByteBuf>) -> WalkParams {
        WalkParams {
            root: WirePath::from(root),
            max_depth: 64,
            max_entries,
            max_directories: 10_000,
            max_response_bytes: 12 << 20,
            include_hidden: true,
            cursor,
            sandbox: None,
            cwd: None,
        }
    }

    /// One page from `cursor` (the root when `None`).
    fn page(root: &Path, max_entries: u64, cursor: Option<ByteBuf>) -> WalkResult {
        let p = params(root, max_entries, cursor);
        walk_blocking(root, &root_fd(root), &p, max_entries, 12 << 20, None).unwrap()
    }

    fn paths(entries: &[WalkEntry]) -> Vec<String> {
        entries.iter().map(|e| e.path.display()).collect()
    }

    /// root: dirs `a` (a1..a3) and `b` (b1, b2), files `c` and `d`.
    fn tree(tag: &str) -> PathBuf {
        let d = scratch(tag);
        for (dir, files) in [("a", 3), ("b", 2)] {
            std::fs::create_dir(d.join(dir)).unwrap();
            for i in 1..=files {
                std::fs::write(d.join(format!("{dir}/{dir}{i}")), "x").unwrap();
            }
        }
        std::fs::write(d.join("c"), "cc").unwrap();
        std::fs::write(d.join("d"), "ddd").unwrap();
        d
    }

    const ORDER: [&str; 9] = ["a", "b", "c", "d", "a/a1", "a/a2", "a/a3", "b/b1", "b/b2"];

    #[test]
    fn a_listing_is_sorted_by_bytes_without_dot_entries_and_stats_each_name() {
        let d = scratch("listing");
        let odd = std::ffi::OsString::from_vec(b"z\xff".to_vec());
        std::fs::write(d.join(&odd), "12345").unwrap();
        std::fs::write(d.join("B"), "").unwrap();
        std::fs::create_dir(d.join("a")).unwrap();
        std::os::unix::fs::symlink("/nowhere", d.join(".link")).unwrap();
        let l = list_dir(&root_fd(&d), b"").unwrap();
        let names: Vec<&[u8]> = (0..l.len()).map(|i| l.name(i)).collect();
        assert_eq!(names, [&b".link"[..], b"B", b"a", b"z\xff"]);
        let kinds: Vec<FileKind> = (0..l.len())
            .map(|i| kind_of_mode(l.stat(i).unwrap().st_mode))
            .collect();
        assert_eq!(
            kinds,
            [
                FileKind::Symlink,
                FileKind::File,
                FileKind::Dir,
                FileKind::File
            ]
        );
        let st = l.stat(3).unwrap();
        let m = std::fs::symlink_metadata(d.join(&odd)).unwrap();
        assert_eq!(st.st_size, 5);
        assert_eq!((st.st_mtime, st.st_mtime_nsec), (m.mtime(), m.mtime_nsec()));
        // An empty directory lists nothing (not even `.` and `..`).
        assert_eq!(list_dir(&root_fd(&d), b"a").unwrap().len(), 0);
        // A name that is not a directory, or a symlink, is not listed.
        assert!(list_dir(&root_fd(&d), b"B").is_err());
        assert!(list_dir(&root_fd(&d), b".link").is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Every page size from 1 to the whole tree: pages split inside a
    /// directory, at its end and across directories, and joined they are
    /// the one-page walk, in the same order, each entry once.
    #[test]
    fn pages_of_every_size_join_to_the_whole_walk() {
        let d = tree("pages");
        let whole = page(&d, 100, None);
        assert!(!whole.truncated);
        assert_eq!(paths(&whole.entries), ORDER);
        for k in 1..=ORDER.len() as u64 {
            let (mut got, mut cursor, mut pages) = (Vec::new(), None, 0);
            loop {
                let r = page(&d, k, cursor.take());
                pages += 1;
                assert!(r.entries.len() as u64 <= k, "page size {k}");
                assert!(r.errors.is_empty(), "{:?}", r.errors);
                got.extend(paths(&r.entries));
                match r.next_cursor {
                    Some(c) => {
                        assert_eq!(r.truncated_by, Some(TruncatedBy::MaxEntries));
                        cursor = Some(c);
                    }
                    None => break,
                }
                assert!(pages <= ORDER.len(), "page size {k}: no progress");
            }
            assert_eq!(got, ORDER, "page size {k}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Between two pages the tree changes: a name sorting before where the
    /// cursor stopped is not listed, one after it is, a removed name is
    /// gone without an error, a removed queued directory is an error and
    /// the walk goes on, and a queued directory swapped for a symlink out
    /// of the root is an error, never followed.
    #[test]
    fn a_tree_changing_between_pages_is_walked_from_where_the_cursor_stopped() {
        let d = tree("changing");
        let outside = scratch("changing-outside");
        std::fs::write(outside.join("secret"), "s").unwrap();
        let first = page(&d, 2, None);
        assert_eq!(paths(&first.entries), ["a", "b"]);
        std::fs::write(d.join("a0"), "").unwrap();
        std::fs::write(d.join("e"), "").unwrap();
        std::fs::remove_file(d.join("c")).unwrap();
        std::fs::remove_dir_all(d.join("a")).unwrap();
        std::fs::remove_dir_all(d.join("b")).unwrap();
        std::os::unix::fs::symlink(&outside, d.join("b")).unwrap();
        let (mut got, mut errors, mut cursor) = (Vec::new(), Vec::new(), first.next_cursor);
        while let Some(c) = cursor.take() {
            let r = page(&d, 2, Some(c));
            got.extend(paths(&r.entries));
            errors.extend(r.errors.iter().map(|e| (e.path.display(), e.code)));
            cursor = r.next_cursor;
        }
        assert_eq!(got, ["d", "e"]);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert_eq!(errors[0], ("a".to_string(), ErrorCode::NotFound));
        assert_eq!(errors[1].0, "b");
        std::fs::remove_dir_all(&d).unwrap();
        std::fs::remove_dir_all(&outside).unwrap();
    }
}
