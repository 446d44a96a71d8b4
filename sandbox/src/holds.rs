//! What a carve-out holds, by identity: the files at or below a carve-out
//! path that have names outside it (hard links). A carve-out protects
//! data, not names: a file of a `deny_read` directory with a second name
//! elsewhere in a granted root is readable through that name, one of a
//! `deny_write` directory writable. [`crate::plan`] refuses (or, without
//! `required`, reports) a carve-out holding such a file; the agent's own
//! `fs/*` confinement refuses a file whose identity is one of them.
//!
//! The examination is bounded ([`MAX_ENTRIES`]) and goes through
//! descriptors only, one directory open at a time (however deep the
//! tree): each directory is listed whole, its subdirectories entered one
//! by one from its descriptor without following symlinks, and left by
//! opening `..`, whose identity must be the one the walk came from (a
//! directory moved meanwhile is [`ScanError::Changed`], never a walk of
//! somewhere else). Depends on `std`, `nix` and `thiserror`.

use nix::dir::Dir;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, fstatat, FileStat, Mode};
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Entries (of every kind, at every depth) one carve-out may hold for its
/// hard links to be examined; over it, what it holds is not known.
pub const MAX_ENTRIES: usize = 100_000;

/// A file of a carve-out with names outside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Linked {
    /// One of its names inside the carve-out.
    pub path: PathBuf,
    pub dev: u64,
    pub ino: u64,
    /// Its link count, of which fewer were found inside the carve-out.
    pub nlink: u64,
}

/// Why what a carve-out holds is not known.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScanError {
    #[error("{} holds more than {max} entries, too many to examine for hard links", path.display())]
    TooMany { path: PathBuf, max: usize },
    #[error("{} cannot be examined for hard links: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} changed while it was examined for hard links", path.display())]
    Changed { path: PathBuf },
}

fn io(path: &Path) -> impl Fn(nix::errno::Errno) -> ScanError + '_ {
    move |e| ScanError::Io {
        path: path.to_path_buf(),
        source: e.into(),
    }
}

/// The files at or below the carve-out `path` (canonical, absolute) with
/// names outside it: every non-directory whose link count is more than
/// the names of it met inside. Nothing there is nothing held. With
/// `expect`, the carve-out must still be the node of that identity.
pub fn linked_out(
    path: &Path,
    expect: Option<(u64, u64)>,
    max: usize,
) -> Result<Vec<Linked>, ScanError> {
    // The canonical path again, no symlink followed: what the policy's
    // walk resolved, or an error (never where a swapped-in link points).
    let fd = match nix::fcntl::openat2(
        nix::fcntl::AT_FDCWD,
        path,
        OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS),
    ) {
        Ok(fd) => fd,
        // Not there (or a file where a directory of it would be).
        Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ENOTDIR) if expect.is_none() => {
            return Ok(Vec::new())
        }
        Err(e) => return Err(io(path)(e)),
    };
    let st = fstat(&fd).map_err(io(path))?;
    if expect.is_some_and(|id| id != (st.st_dev, st.st_ino)) {
        return Err(ScanError::Changed {
            path: path.to_path_buf(),
        });
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Ok(if nlink(&st) > 1 {
            vec![linked(path.to_path_buf(), &st)]
        } else {
            Vec::new()
        });
    }
    let dir = nix::fcntl::openat(
        &fd,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io(path))?;
    drop(fd);
    Scan {
        top: path,
        max,
        seen: 0,
        inodes: HashMap::new(),
    }
    .run(dir, (st.st_dev, st.st_ino))
}

fn linked(path: PathBuf, st: &FileStat) -> Linked {
    Linked {
        path,
        dev: st.st_dev,
        ino: st.st_ino,
        nlink: nlink(st),
    }
}

/// The link count of `st` (`nlink_t` is narrower on some architectures).
#[allow(clippy::unnecessary_cast)]
fn nlink(st: &FileStat) -> u64 {
    st.st_nlink as u64
}

/// A directory being examined: its identity and the subdirectories still
/// to enter (name, identity from the listing).
struct Frame {
    id: (u64, u64),
    pending: Vec<(OsString, (u64, u64))>,
}

struct Scan<'a> {
    top: &'a Path,
    max: usize,
    seen: usize,
    /// Non-directories with more than one link: (a name, stat, names met).
    inodes: HashMap<(u64, u64), (PathBuf, FileStat, u64)>,
}

impl Scan<'_> {
    fn run(mut self, top: OwnedFd, id: (u64, u64)) -> Result<Vec<Linked>, ScanError> {
        let mut at = self.top.to_path_buf();
        let mut stack = vec![self.list(&top, &at, id)?];
        let mut cur = top;
        while let Some(frame) = stack.last_mut() {
            if let Some((name, child_id)) = frame.pending.pop() {
                at.push(&name);
                let child = nix::fcntl::openat(
                    &cur,
                    name.as_os_str(),
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
                .map_err(io(&at))?;
                self.check(&child, child_id, &at)?;
                let frame = self.list(&child, &at, child_id)?;
                cur = child;
                stack.push(frame);
                continue;
            }
            stack.pop();
            at.pop();
            if let Some(parent) = stack.last() {
                // Back up one level: `..` must be the directory the walk
                // came from.
                let up = nix::fcntl::openat(
                    &cur,
                    "..",
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
                .map_err(io(&at))?;
                self.check(&up, parent.id, &at)?;
                cur = up;
            }
        }
        let mut out: Vec<Linked> = self
            .inodes
            .into_values()
            .filter(|(_, st, met)| nlink(st) > *met)
            .map(|(p, st, _)| linked(p, &st))
            .collect();
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    fn check(&self, fd: &OwnedFd, id: (u64, u64), at: &Path) -> Result<(), ScanError> {
        let st = fstat(fd).map_err(io(at))?;
        if (st.st_dev, st.st_ino) != id {
            return Err(ScanError::Changed {
                path: at.to_path_buf(),
            });
        }
        Ok(())
    }

    /// List the directory `fd` (at `at`): its non-directories recorded,
    /// its subdirectories returned to be entered.
    fn list(&mut self, fd: &OwnedFd, at: &Path, id: (u64, u64)) -> Result<Frame, ScanError> {
        let mut names: Vec<OsString> = Vec::new();
        let mut dir = Dir::from_fd(fd.try_clone().map_err(|source| ScanError::Io {
            path: at.to_path_buf(),
            source,
        })?)
        .map_err(io(at))?;
        for e in dir.iter() {
            let e = e.map_err(io(at))?;
            let name = e.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            self.seen += 1;
            if self.seen > self.max {
                return Err(ScanError::TooMany {
                    path: self.top.to_path_buf(),
                    max: self.max,
                });
            }
            names.push(OsStr::from_bytes(name).to_os_string());
        }
        let mut pending = Vec::new();
        for name in names {
            let st = match fstatat(fd, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                // Gone since the listing: nothing held under that name.
                Err(nix::errno::Errno::ENOENT) => continue,
                Err(e) => return Err(io(&at.join(&name))(e)),
            };
            if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                pending.push((name, (st.st_dev, st.st_ino)));
            } else if nlink(&st) > 1 {
                let entry = self
                    .inodes
                    .entry((st.st_dev, st.st_ino))
                    .or_insert_with(|| (at.join(&name), st, 0));
                entry.2 += 1;
            }
        }
        Ok(Frame { id, pending })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn dir(test: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sbx-holds-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("c/sub/deeper")).unwrap();
        std::fs::create_dir_all(d.join("out")).unwrap();
        std::fs::canonicalize(d).unwrap()
    }

    #[test]
    fn names_outside_are_found_names_inside_are_not() {
        let d = dir("found");
        let c = d.join("c");
        std::fs::write(c.join("sub/deeper/token"), "T").unwrap();
        std::fs::write(c.join("alone"), "A").unwrap();
        std::fs::write(c.join("twice"), "2").unwrap();
        // Two names, both inside: nothing reaches it from outside.
        std::fs::hard_link(c.join("twice"), c.join("sub/twice")).unwrap();
        std::fs::hard_link(c.join("sub/deeper/token"), d.join("out/notes")).unwrap();
        let got = linked_out(&c, None, MAX_ENTRIES).unwrap();
        let m = std::fs::metadata(d.join("out/notes")).unwrap();
        assert_eq!(
            got,
            vec![Linked {
                path: c.join("sub/deeper/token"),
                dev: m.dev(),
                ino: m.ino(),
                nlink: 2
            }]
        );
        // A file carve-out with another name is held itself; a missing
        // one holds nothing.
        assert_eq!(linked_out(&d.join("out/notes"), None, 10).unwrap().len(), 1);
        assert!(linked_out(&d.join("nothing"), None, 10).unwrap().is_empty());
        assert!(linked_out(&c.join("alone/below"), None, 10)
            .unwrap()
            .is_empty());
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn over_the_bound_or_changed_is_an_error() {
        let d = dir("bound");
        let c = d.join("c");
        for i in 0..10 {
            std::fs::write(c.join(format!("f{i}")), "x").unwrap();
        }
        // 10 files + sub + deeper.
        assert!(linked_out(&c, None, 12).is_ok());
        let e = linked_out(&c, None, 11).unwrap_err();
        assert!(matches!(e, ScanError::TooMany { max: 11, .. }), "{e}");
        let e = linked_out(&c, Some((0, 0)), 100).unwrap_err();
        assert!(matches!(e, ScanError::Changed { .. }), "{e}");
        // A symlink as the carve-out path is not followed: the link
        // itself holds nothing (what it points to has a link outside).
        std::fs::hard_link(c.join("f0"), d.join("out/f0")).unwrap();
        assert_eq!(linked_out(&c, None, 100).unwrap().len(), 1);
        std::os::unix::fs::symlink(&c, d.join("link")).unwrap();
        assert!(linked_out(&d.join("link"), None, 100).unwrap().is_empty());
        let _ = std::fs::remove_dir_all(d);
    }

    // A tree deeper than the descriptors the process may hold: one
    // directory open at a time (in a forked child with RLIMIT_NOFILE 32).
    #[test]
    fn a_deep_tree_is_examined_with_one_descriptor_at_a_time() {
        let d = dir("deep");
        let mut bottom = d.join("c");
        for _ in 0..100 {
            bottom.push("d");
        }
        std::fs::create_dir_all(&bottom).unwrap();
        std::fs::write(bottom.join("token"), "T").unwrap();
        std::fs::hard_link(bottom.join("token"), d.join("out/token")).unwrap();
        let c = d.join("c");
        let child = || -> Result<(), String> {
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, 32, 32)
                .map_err(|e| e.to_string())?;
            let got = linked_out(&c, None, MAX_ENTRIES).map_err(|e| e.to_string())?;
            match got.as_slice() {
                [l] if l.path == bottom.join("token") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        };
        executor_sys::in_forked_child(child).unwrap();
        let _ = std::fs::remove_dir_all(d);
    }
}
