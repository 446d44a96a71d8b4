//! Removing a tree the agent owns on the host (a job's private directory,
//! its `:tmp`) whatever the job left in it: any depth (thousands of levels,
//! paths far beyond `PATH_MAX`), directories whose owner took every
//! permission away (mode 000, unwritable and sticky), files with no
//! permissions, symlinks to anything.
//!
//! - No recursion: an explicit loop with one directory descriptor open at
//!   a time (plus the parent of the tree's root); the way back up is
//!   `openat(dir, "..")`, checked to be the directory (device, inode) the
//!   loop came down from, else the removal stops there (the tree moved).
//! - Everything by descriptor: entries are looked at with
//!   `fstatat(AT_SYMLINK_NOFOLLOW)`, directories opened `O_PATH |
//!   O_NOFOLLOW`, removed with `unlinkat` relative to their parent's
//!   descriptor. A symlink is removed, never followed; its target stays.
//! - Never into another mount: a directory on another device, or with
//!   another mount id (`statx`), is not entered (nor removed).
//! - A directory without `u+rwx` gets it back through its own descriptor
//!   ([`executor_sys::chmod_fd`]) before it is read.
//! - Never silent: every entry that stays is logged (`tracing`, with its
//!   path and errno, the first few of each tree) and the removal returns
//!   an error naming the first; the agent's next sweep tries again
//!   ([`crate::plan::sweep`]).
//!
//! Used by [`crate::plan`] (a job's `:tmp` at its end, the sweep of what a
//! killed agent left). Depends on `nix`, [`executor_sys`] and `tracing`.

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::Mode;
use nix::unistd::UnlinkatFlags;
use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// How many failures of one tree are logged one by one (then a count).
const LOGGED: usize = 16;

/// A tree that could not be removed entirely: the first entry that stays
/// and how many failed in all (each logged).
#[derive(Debug, thiserror::Error)]
#[error("removing {}: {count} entr{} could not be removed; the first, {}: {what}: {source}",
    root.display(), if *count == 1 { "y" } else { "ies" }, path.display())]
pub struct TreeError {
    pub root: PathBuf,
    pub path: PathBuf,
    pub what: &'static str,
    pub source: io::Error,
    pub count: usize,
}

const DIR_PATH: OFlag = OFlag::O_PATH
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

fn errno(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// Remove `parent/name` and everything below it (see the module's doc).
/// A missing `name` is not an error; a `name` that is not a directory is
/// removed as it is.
pub fn remove_tree(parent: &Path, name: &OsStr) -> Result<(), TreeError> {
    removal(parent, name).result()
}

/// The removal of `parent/name`, done, with what it met.
fn removal(parent: &Path, name: &OsStr) -> Remover {
    let mut r = Remover {
        root: parent.join(name),
        names: Vec::new(),
        skip: HashSet::new(),
        dev: 0,
        mnt: None,
        count: 0,
        first: None,
        listed: 0,
    };
    r.run(parent, name);
    r
}

/// Where the loop is: the names from the root down to the current
/// directory, and what stays (by identity, so that a directory that could
/// not be emptied is not entered again).
struct Remover {
    root: PathBuf,
    names: Vec<OsString>,
    skip: HashSet<(u64, u64)>,
    dev: u64,
    mnt: Option<u64>,
    count: usize,
    first: Option<(PathBuf, &'static str, io::Error)>,
    /// Directory entries read in all (linear in the tree's size).
    listed: usize,
}

enum Step {
    /// Enter this child (name, its `O_PATH` descriptor, its identity).
    Descend(OsString, OwnedFd, (u64, u64)),
    /// Nothing more can be removed in this directory.
    Done,
}

impl Remover {
    /// The path of `name` in the current directory (for messages only:
    /// nothing is ever looked up by it). Deep trees are shortened.
    fn shown(&self, name: Option<&OsStr>) -> PathBuf {
        let mut parts: Vec<&OsStr> = self.names.iter().map(|n| n.as_os_str()).collect();
        parts.extend(name);
        let mut p = self.root.clone();
        const KEEP: usize = 8;
        if parts.len() > 2 * KEEP {
            for n in &parts[..KEEP] {
                p.push(n);
            }
            p.push(format!("…({} levels)…", parts.len() - 2 * KEEP));
            for n in &parts[parts.len() - KEEP..] {
                p.push(n);
            }
        } else {
            for n in parts {
                p.push(n);
            }
        }
        p
    }

    fn fail(&mut self, name: Option<&OsStr>, what: &'static str, e: io::Error) {
        let path = self.shown(name);
        if self.count < LOGGED {
            tracing::warn!(
                path = %path.display(),
                errno = e.raw_os_error().unwrap_or(0),
                error = %e,
                "cannot remove a job's file or directory ({what}); the next sweep tries again"
            );
        }
        self.count += 1;
        if self.first.is_none() {
            self.first = Some((path, what, e));
        }
    }

    fn result(self) -> Result<(), TreeError> {
        if self.count > LOGGED {
            tracing::warn!(
                root = %self.root.display(),
                failures = self.count,
                "more entries of this tree could not be removed than were logged"
            );
        }
        match self.first {
            None => Ok(()),
            Some((path, what, source)) => Err(TreeError {
                root: self.root,
                path,
                what,
                source,
                count: self.count,
            }),
        }
    }

    fn run(&mut self, parent: &Path, name: &OsStr) {
        let base = match nix::fcntl::open(parent, DIR_PATH, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return,
            Err(e) => return self.fail(None, "opening its parent", errno(e)),
        };
        let root = match nix::fcntl::openat(&base, name, DIR_PATH, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return,
            // Not a directory (or a symlink): removed as it is.
            Err(Errno::ENOTDIR | Errno::ELOOP) => {
                match nix::unistd::unlinkat(&base, name, UnlinkatFlags::NoRemoveDir) {
                    Ok(()) | Err(Errno::ENOENT) => {}
                    Err(e) => self.fail(None, "removing it", errno(e)),
                }
                return;
            }
            Err(e) => return self.fail(None, "opening it", errno(e)),
        };
        let (dev, ino, mnt) = match executor_sys::identity_and_mount(root.as_fd()) {
            Ok(id) => id,
            Err(e) => return self.fail(None, "looking at it", e),
        };
        self.dev = dev;
        self.mnt = mnt;
        // ids[k], levels[k]: the directory at depth k (names[..k] below
        // the root) and where its emptying stands.
        let mut ids = vec![(dev, ino)];
        let mut levels = vec![Level::default()];
        let mut cur = root;
        loop {
            let level = levels.last_mut().expect("one level per directory");
            match self.empty(&cur, level) {
                Step::Descend(name, child, id) => {
                    self.names.push(name);
                    ids.push(id);
                    levels.push(Level::default());
                    cur = child;
                }
                Step::Done => {
                    let Some(done) = self.names.pop() else {
                        break;
                    };
                    let done_id = ids.pop().expect("one identity per level");
                    levels.pop();
                    let up = nix::fcntl::openat(
                        &cur,
                        "..",
                        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                        Mode::empty(),
                    )
                    .map_err(errno)
                    .and_then(|fd| {
                        let (d, i, _) = executor_sys::identity_and_mount(fd.as_fd())?;
                        if Some(&(d, i)) == ids.last() {
                            Ok(fd)
                        } else {
                            Err(io::Error::other(
                                "its parent is no longer the directory it was entered from (the tree moved)",
                            ))
                        }
                    });
                    cur = match up {
                        Ok(fd) => fd,
                        Err(e) => {
                            self.fail(Some(&done), "going back up", e);
                            return;
                        }
                    };
                    match nix::unistd::unlinkat(&cur, done.as_os_str(), UnlinkatFlags::RemoveDir) {
                        Ok(()) => {
                            levels.last_mut().expect("the parent's level").removed += 1;
                        }
                        Err(Errno::ENOENT) => {}
                        Err(e) => {
                            self.skip.insert(done_id);
                            self.fail(Some(&done), "removing the directory", errno(e));
                        }
                    }
                }
            }
        }
        drop(cur);
        match nix::unistd::unlinkat(&base, name, UnlinkatFlags::RemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(e) => self.fail(None, "removing the directory", errno(e)),
        }
    }

    /// Remove what can be removed in `dir` (an `O_PATH` descriptor of the
    /// current directory), going on from where `level` stopped, until a
    /// listing removes nothing; or the first subdirectory that needs
    /// emptying first (the rest of the listing stays in `level`: coming
    /// back up goes on with it, never reading the directory again from
    /// its start, so a wide directory costs linear time).
    fn empty(&mut self, dir: &OwnedFd, level: &mut Level) -> Step {
        loop {
            let Some((name, maybe_dir)) = level.pending.next() else {
                if level.listed && level.removed == 0 {
                    return Step::Done;
                }
                match nix::sys::stat::fstat(dir) {
                    Ok(st) if st.st_mode & 0o700 != 0o700 => {
                        if let Err(e) = executor_sys::chmod_fd(dir.as_fd(), 0o700) {
                            self.fail(None, "restoring the owner's permissions", e);
                            return Step::Done;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        self.fail(None, "looking at the directory", errno(e));
                        return Step::Done;
                    }
                }
                match read_names(dir) {
                    Ok(v) => {
                        self.listed += v.len();
                        level.pending = v.into_iter();
                        level.listed = true;
                        level.removed = 0;
                    }
                    Err(e) => {
                        self.fail(None, "reading the directory", e);
                        return Step::Done;
                    }
                }
                continue;
            };
            let name = name.as_os_str();
            if !maybe_dir {
                match nix::unistd::unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
                    Ok(()) => {
                        level.removed += 1;
                        continue;
                    }
                    Err(Errno::ENOENT) => continue,
                    // Swapped for a directory since it was listed.
                    Err(Errno::EISDIR) => {}
                    Err(e) => {
                        self.fail(Some(name), "removing the file", errno(e));
                        continue;
                    }
                }
            }
            let st = match nix::sys::stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::ENOENT) => continue,
                Err(e) => {
                    self.fail(Some(name), "looking at the entry", errno(e));
                    continue;
                }
            };
            let id = (st.st_dev, st.st_ino);
            if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
                match nix::unistd::unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
                    Ok(()) => level.removed += 1,
                    Err(Errno::ENOENT) => {}
                    Err(e) => self.fail(Some(name), "removing the file", errno(e)),
                }
                continue;
            }
            if self.skip.contains(&id) {
                continue;
            }
            if st.st_dev != self.dev {
                self.skip.insert(id);
                self.fail(
                    Some(name),
                    "another file system is mounted there; not entered",
                    io::Error::from_raw_os_error(libc::EXDEV),
                );
                continue;
            }
            match nix::unistd::unlinkat(dir, name, UnlinkatFlags::RemoveDir) {
                Ok(()) => {
                    level.removed += 1;
                    continue;
                }
                Err(Errno::ENOENT) => continue,
                Err(Errno::ENOTEMPTY | Errno::EEXIST) => {}
                Err(e) => {
                    self.skip.insert(id);
                    self.fail(Some(name), "removing the directory", errno(e));
                    continue;
                }
            }
            let child = match nix::fcntl::openat(dir, name, DIR_PATH, Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) => continue,
                Err(e) => {
                    self.skip.insert(id);
                    self.fail(Some(name), "opening the directory", errno(e));
                    continue;
                }
            };
            match executor_sys::identity_and_mount(child.as_fd()) {
                Ok((d, i, m)) if (d, i) == id && (m == self.mnt || m.is_none()) => {
                    return Step::Descend(name.to_os_string(), child, id);
                }
                Ok((d, i, _)) if (d, i) == id => {
                    self.skip.insert(id);
                    self.fail(
                        Some(name),
                        "a mount point; not entered",
                        io::Error::from_raw_os_error(libc::EXDEV),
                    );
                }
                Ok(_) => {
                    self.skip.insert(id);
                    self.fail(
                        Some(name),
                        "opening the directory",
                        io::Error::other("it changed while it was opened"),
                    );
                }
                Err(e) => {
                    self.skip.insert(id);
                    self.fail(Some(name), "looking at the directory", e);
                }
            }
        }
    }
}

/// Where the removal stands in one directory of the current path: what is
/// left of its latest listing, whether it was listed yet, and how many
/// entries that listing's pass removed (another listing follows when some
/// were: what failed may go now).
#[derive(Default)]
struct Level {
    pending: std::vec::IntoIter<(OsString, bool)>,
    listed: bool,
    removed: usize,
}

/// The names in the directory `dir` (an `O_PATH` descriptor, read through
/// a descriptor of its own closed before this returns), each with whether
/// it may be a directory (its type says so, or the file system does not
/// say).
fn read_names(dir: &OwnedFd) -> io::Result<Vec<(OsString, bool)>> {
    use nix::dir::Type;
    let fd = nix::fcntl::openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(errno)?;
    let mut d = nix::dir::Dir::from_fd(fd).map_err(errno)?;
    let mut out = Vec::new();
    for e in d.iter() {
        let e = e.map_err(errno)?;
        let name = e.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let maybe_dir = !matches!(
            e.file_type(),
            Some(
                Type::File
                    | Type::Symlink
                    | Type::Fifo
                    | Type::Socket
                    | Type::CharacterDevice
                    | Type::BlockDevice
            )
        );
        out.push((OsStr::from_bytes(name).to_os_string(), maybe_dir));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("executor-tree-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn mode(p: &Path, m: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    }

    /// `depth` nested `d` directories below `top`, made through
    /// descriptors (the path is longer than PATH_MAX); the deepest, open.
    fn deep(top: &Path, depth: usize) -> OwnedFd {
        let mut fd =
            nix::fcntl::open(top, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()).unwrap();
        for _ in 0..depth {
            nix::sys::stat::mkdirat(&fd, "d", Mode::from_bits_truncate(0o755)).unwrap();
            fd = nix::fcntl::openat(
                &fd,
                "d",
                OFlag::O_RDONLY | OFlag::O_DIRECTORY,
                Mode::empty(),
            )
            .unwrap();
        }
        fd
    }

    #[test]
    fn removes_a_deep_tree_with_locked_directories_and_keeps_link_targets() {
        let d = scratch("deep");
        let outside = d.join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "k").unwrap();
        let job = d.join("job");
        std::fs::create_dir(&job).unwrap();
        let bottom = deep(&job, 3000);
        nix::sys::stat::mkdirat(&bottom, "locked", Mode::empty()).unwrap();
        std::os::unix::fs::symlink(&outside, job.join("d/d/link")).unwrap();
        std::fs::write(job.join("d/nothing"), "x").unwrap();
        mode(&job.join("d/nothing"), 0);
        mode(&job.join("d/d/d"), 0o1000);
        mode(&job.join("d"), 0o500);
        mode(&job, 0o1555);
        drop(bottom);
        remove_tree(&d, OsStr::new("job")).unwrap();
        assert!(!job.exists());
        assert_eq!(std::fs::read(outside.join("keep")).unwrap(), b"k");
        assert!(outside.metadata().unwrap().permissions().mode() & 0o777 != 0);
        remove_tree(&d, OsStr::new("job")).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A wide directory (non-empty subdirectories side by side) costs
    /// linear time: each directory is read at most twice (its listing,
    /// then one more after a pass that removed something). Reading the
    /// parent again after each subdirectory read N²/2 entries (36 s for
    /// 5,000, 318 s for 20,000 before).
    #[test]
    fn a_wide_directory_is_read_a_bounded_number_of_times() {
        let d = scratch("wide");
        let job = d.join("job");
        std::fs::create_dir(&job).unwrap();
        let n = 3000;
        for i in 0..n {
            std::fs::create_dir_all(job.join(format!("{i}/x"))).unwrap();
            std::fs::write(job.join(format!("{i}/x/f")), "").unwrap();
        }
        let r = removal(&d, OsStr::new("job"));
        assert_eq!(r.count, 0, "every entry removed");
        assert!(!job.exists());
        // n + n + n entries in all, each read at most twice.
        assert!(
            r.listed <= 2 * 3 * n,
            "{} entries read for a tree of {} (reading a directory again from its start)",
            r.listed,
            3 * n
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_file_or_link_at_the_top_is_removed_as_it_is() {
        let d = scratch("top");
        std::fs::create_dir(d.join("target")).unwrap();
        std::os::unix::fs::symlink(d.join("target"), d.join("job")).unwrap();
        remove_tree(&d, OsStr::new("job")).unwrap();
        assert!(d.join("target").is_dir());
        assert!(std::fs::symlink_metadata(d.join("job")).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
