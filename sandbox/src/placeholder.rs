//! Placeholders: empty directories the agent creates where a carve-out
//! inside a write root does not exist yet (`deny_write: [".env",
//! ".git/hooks"]` on a fresh checkout), so that the job's root can cover
//! them like any carve-out: read-only for `deny_write`, an inaccessible
//! tmpfs for `deny_read`. The job meets an existing name (`EEXIST`,
//! `EISDIR`, `EROFS`) and cannot create it; the sandbox is never weaker and
//! the intent never refused for it. Missing parents between the nearest
//! existing directory and the carve-out are created too, as ordinary
//! directories the job may use (and pinned, like every ancestor of a
//! carve-out).
//!
//! Every directory made is written to a *record* in the jobs' directory
//! ([`crate::plan::jobs_parent`]) before the job starts, and the record is
//! held under an exclusive `flock` for the job's life, so:
//! - at the job's end the agent removes what it made, children first,
//!   each only while it is still the same inode and empty (`rmdir` is
//!   atomic about emptiness: what the job filled stays);
//! - a placeholder another job is still using is not removed (removing a
//!   mount point on the host would detach it in that job's namespace): a
//!   plan that meets an existing placeholder of a live record holds it in
//!   its own record, and the last holder removes it;
//! - an agent killed mid-job leaves a record whose lock nobody holds;
//!   [`sweep`] (at every agent start) removes its leftovers.
//!
//! All of it happens under one lock file, so two agents of one user never
//! interleave. Paths are opened one component at a time with
//! `O_NOFOLLOW` and every directory is made and removed relative to its
//! parent's descriptor: a job that swaps a parent for a symlink makes the
//! agent fail, never act elsewhere.
//!
//! Depends on `std`, `nix` and [`crate::plan`]'s jobs directory only.

use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::fcntl::{Flock, FlockArg, OFlag};
use nix::sys::stat::Mode;
use nix::unistd::UnlinkatFlags;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

/// One directory a job made (or holds): where, and which inode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub path: PathBuf,
    pub dev: u64,
    pub ino: u64,
}

/// The placeholders of one job, held under its record's lock until
/// [`Placeholders::remove`] or drop.
#[derive(Debug)]
pub struct Placeholders {
    record: Option<Flock<File>>,
    record_path: PathBuf,
    entries: Vec<Entry>,
}

const LOCK: &str = "placeholders.lock";
const SUFFIX: &str = ".placeholders";

fn errno(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// The global lock of `dir` (the jobs' directory), held while it lives.
pub(crate) fn global_lock(dir: &Path) -> io::Result<Flock<File>> {
    let path = dir.join(LOCK);
    let f = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)?;
    ours(&f, &path)?;
    Flock::lock(f, FlockArg::LockExclusive).map_err(|(_, e)| errno(e))
}

/// A regular file of this user (a FIFO or another user's file in the jobs'
/// directory is never read, locked or trusted).
fn ours(f: &File, path: &Path) -> io::Result<()> {
    let m = f.metadata()?;
    if !m.is_file() || m.uid() != nix::unistd::geteuid().as_raw() {
        return Err(io::Error::other(format!(
            "{} is not a regular file of this user",
            path.display()
        )));
    }
    Ok(())
}

/// `path` (absolute) opened as a directory one component at a time, never
/// following a symlink.
fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut fd = nix::fcntl::open("/", flags, Mode::empty()).map_err(errno)?;
    for c in path.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(name) => {
                fd = nix::fcntl::openat(&fd, name, flags, Mode::empty()).map_err(errno)?;
            }
            _ => {
                return Err(io::Error::other(format!(
                    "{} is not a canonical path",
                    path.display()
                )))
            }
        }
    }
    Ok(fd)
}

fn identity(fd: impl AsFd) -> io::Result<(u64, u64)> {
    let st = nix::sys::stat::fstat(fd).map_err(errno)?;
    Ok((st.st_dev as u64, st.st_ino))
}

fn parse(text: &str) -> Vec<Entry> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ' ');
            let dev = it.next()?.parse().ok()?;
            let ino = it.next()?.parse().ok()?;
            let hex = it.next()?;
            let bytes: Option<Vec<u8>> = (0..hex.len())
                .step_by(2)
                .map(|i| {
                    hex.get(i..i + 2)
                        .and_then(|h| u8::from_str_radix(h, 16).ok())
                })
                .collect();
            Some(Entry {
                path: PathBuf::from(OsStr::from_bytes(&bytes?)),
                dev,
                ino,
            })
        })
        .collect()
}

fn line(e: &Entry) -> String {
    let hex: String = e
        .path
        .as_os_str()
        .as_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{} {} {hex}\n", e.dev, e.ino)
}

/// The entries of every record of `dir` whose lock someone holds, but
/// `except` (a record of ours, which this process holds too).
fn live_entries(dir: &Path, except: Option<&Path>) -> io::Result<Vec<Entry>> {
    let mut out = Vec::new();
    for (path, mut f) in records(dir)? {
        if Some(path.as_path()) == except {
            continue;
        }
        // A second open of the file is a second lock owner: it fails to
        // lock while the record's owner (in this process or another) lives.
        let mut text = String::new();
        f.read_to_string(&mut text)?;
        match Flock::lock(f, FlockArg::LockSharedNonblock) {
            Ok(_unlocked_on_drop) => {}
            Err((_, Errno::EWOULDBLOCK)) => out.extend(parse(&text)),
            Err((_, e)) => return Err(errno(e)),
        }
    }
    Ok(out)
}

fn records(dir: &Path) -> io::Result<Vec<(PathBuf, File)>> {
    let mut out = Vec::new();
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for e in rd.flatten() {
        let name = e.file_name();
        if !name.as_bytes().ends_with(SUFFIX.as_bytes()) {
            continue;
        }
        let path = e.path();
        match File::options()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
        {
            // Anything else is not a record of ours: skipped.
            Ok(f) if ours(&f, &path).is_ok() => out.push((path, f)),
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Remove `e` if it is still the inode recorded and empty (`true`); it
/// stays when it is gone, another inode, or not empty (the job's data).
fn remove_entry(e: &Entry) -> io::Result<bool> {
    let (Some(parent), Some(name)) = (e.path.parent(), e.path.file_name()) else {
        return Ok(false);
    };
    let dir = match open_dir(parent) {
        Ok(d) => d,
        // Its parent is gone, was swapped for a link, or was closed to us
        // (by the job that used it): nothing left we could remove.
        Err(err)
            if matches!(
                err.raw_os_error(),
                Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP | libc::EACCES | libc::EPERM)
            ) =>
        {
            return Ok(false)
        }
        Err(err) => {
            return Err(io::Error::new(
                err.kind(),
                format!("opening {}: {err}", parent.display()),
            ))
        }
    };
    let st = match nix::sys::stat::fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Ok(false),
        Err(err) => return Err(errno(err)),
    };
    if (st.st_dev as u64, st.st_ino) != (e.dev, e.ino) {
        return Ok(false);
    }
    match nix::unistd::unlinkat(&dir, name, UnlinkatFlags::RemoveDir) {
        Ok(()) => Ok(true),
        Err(Errno::ENOENT | Errno::ENOTEMPTY | Errno::EEXIST | Errno::EBUSY) => Ok(false),
        Err(err) => Err(io::Error::new(
            errno(err).kind(),
            format!("removing {}: {}", e.path.display(), errno(err)),
        )),
    }
}

/// Remove `entries` (parents first in the list: removed last) unless a
/// live record still lists them; what was removed, or the first error
/// after trying all.
fn remove_unheld(entries: &[Entry], live: &[Entry]) -> io::Result<Vec<PathBuf>> {
    let mut first = None;
    let mut removed = Vec::new();
    for e in entries.iter().rev() {
        if live.iter().any(|l| (l.dev, l.ino) == (e.dev, e.ino)) {
            continue;
        }
        match remove_entry(e) {
            Ok(true) => removed.push(e.path.clone()),
            Ok(false) => {}
            Err(err) => {
                first.get_or_insert(err);
            }
        }
    }
    match first {
        Some(e) => Err(e),
        None => Ok(removed),
    }
}

impl Placeholders {
    /// A new, empty record in `dir` (the jobs' directory, which exists),
    /// locked for as long as the value lives.
    fn new(dir: &Path) -> io::Result<Placeholders> {
        let name = crate::plan::random_name()?;
        let record_path = dir.join(format!("job-{name}{SUFFIX}"));
        let f = File::options()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&record_path)?;
        let record = Flock::lock(f, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| errno(e))?;
        Ok(Placeholders {
            record: Some(record),
            record_path,
            entries: Vec::new(),
        })
    }

    fn push(&mut self, e: Entry) -> io::Result<()> {
        let rec = self.record.as_mut().expect("record held until removal");
        rec.write_all(line(&e).as_bytes())?;
        self.entries.push(e);
        Ok(())
    }

    /// What this job made or holds, parents first.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Remove what no other live job holds, then the record; say why not
    /// (the agent logs it). A drop does the same silently.
    pub fn remove(mut self) -> io::Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> io::Result<()> {
        let Some(record) = self.record.take() else {
            return Ok(());
        };
        let dir = self.record_path.parent().unwrap_or(Path::new("/"));
        let result = (|| {
            let _lock = global_lock(dir)?;
            let live = live_entries(dir, Some(&self.record_path))?;
            // On an error the record stays (its lock goes with this value):
            // the next sweep tries again.
            remove_unheld(&self.entries, &live)?;
            std::fs::remove_file(&self.record_path)
        })();
        drop(record);
        result
    }
}

impl Drop for Placeholders {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// Making placeholders for one plan, under the global lock.
#[derive(Debug)]
pub struct Maker {
    // Dropped first: a `made` dropped after it takes the lock again.
    _lock: Flock<File>,
    dir: PathBuf,
    live: Vec<Entry>,
    /// The record, made at the first entry (most plans need none).
    made: Option<Placeholders>,
}

impl Maker {
    /// Start, with `dir` the jobs' directory (which exists and is private).
    pub fn start(dir: &Path) -> io::Result<Maker> {
        let lock = global_lock(dir)?;
        // Read before our record exists: nothing after it can fail (a
        // record dropped here would take the lock this value holds).
        let live = live_entries(dir, None)?;
        Ok(Maker {
            _lock: lock,
            dir: dir.to_path_buf(),
            live,
            made: None,
        })
    }

    fn push(&mut self, e: Entry) -> io::Result<()> {
        if self.made.is_none() {
            self.made = Some(Placeholders::new(&self.dir)?);
        }
        self.made.as_mut().expect("made above").push(e)
    }

    fn is_ours(&self, id: (u64, u64)) -> bool {
        self.made
            .as_ref()
            .is_some_and(|m| m.entries.iter().any(|l| (l.dev, l.ino) == id))
    }

    /// Hold `path` and its ancestors below `within` (a write root) that a
    /// live job made as placeholders, parents first, so that job's end
    /// does not leave them behind for good (the last holder removes them).
    pub fn hold(&mut self, within: &Path, path: &Path) -> io::Result<()> {
        let mut chain: Vec<&Path> = path
            .ancestors()
            .take_while(|a| *a != within && a.starts_with(within))
            .collect();
        chain.reverse();
        for a in chain {
            let Ok(m) = std::fs::symlink_metadata(a) else {
                continue;
            };
            let id = (m.dev(), m.ino());
            let live = self.live.iter().any(|l| (l.dev, l.ino) == id);
            let ours = self.is_ours(id);
            if live && !ours {
                self.push(Entry {
                    path: a.to_path_buf(),
                    dev: id.0,
                    ino: id.1,
                })?;
            }
        }
        Ok(())
    }

    /// Make `missing` (absolute, canonical up to `existing`, its nearest
    /// existing ancestor) and the directories between, each recorded
    /// before the next is made; the identity of `missing`.
    pub fn make(
        &mut self,
        within: &Path,
        existing: &Path,
        missing: &Path,
    ) -> io::Result<(u64, u64)> {
        self.hold(within, existing)?;
        let rest = missing.strip_prefix(existing).map_err(|_| {
            io::Error::other(format!(
                "{} is not below {}",
                missing.display(),
                existing.display()
            ))
        })?;
        let mut dir = open_dir(existing)?;
        let mut at = existing.to_path_buf();
        let mut id = identity(&dir)?;
        for c in rest.components() {
            let Component::Normal(name) = c else {
                return Err(io::Error::other(format!(
                    "{} is not a canonical path",
                    missing.display()
                )));
            };
            at.push(name);
            let made = match nix::sys::stat::mkdirat(&dir, name, Mode::from_bits_truncate(0o755)) {
                Ok(()) => true,
                Err(Errno::EEXIST) => false,
                Err(e) => return Err(errno(e)),
            };
            let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
            let next = nix::fcntl::openat(&dir, name, flags, Mode::empty()).map_err(errno)?;
            id = identity(&next)?;
            if made {
                self.push(Entry {
                    path: at.clone(),
                    dev: id.0,
                    ino: id.1,
                })?;
            } else {
                self.hold(within, &at)?;
            }
            dir = next;
        }
        Ok(id)
    }

    /// Done: the placeholders (`None` if none were needed).
    pub fn finish(self) -> Option<Placeholders> {
        let Maker { _lock, made, .. } = self;
        made
    }
}

/// Remove the leftovers of jobs whose agent died (records nobody holds),
/// in the jobs' directory `dir`. Safe to run while other agents of the
/// user run jobs: a held record is never touched, nor a placeholder it
/// lists. Returns what was removed, for the log.
pub fn sweep(dir: &Path) -> io::Result<Vec<PathBuf>> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let _lock = global_lock(dir)?;
    let mut dead = Vec::new();
    let mut live = Vec::new();
    for (path, mut f) in records(dir)? {
        let mut text = String::new();
        f.read_to_string(&mut text)?;
        match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
            Ok(held) => dead.push((path, parse(&text), held)),
            Err((_, Errno::EWOULDBLOCK)) => live.extend(parse(&text)),
            Err((_, e)) => return Err(errno(e)),
        }
    }
    let mut removed = Vec::new();
    let mut first = Ok(());
    for (path, entries, held) in dead {
        match remove_unheld(&entries, &live) {
            Ok(gone) => {
                removed.extend(gone);
                std::fs::remove_file(&path)?;
            }
            Err(e) if first.is_ok() => first = Err(e),
            Err(_) => {}
        }
        drop(held);
    }
    first.map(|()| removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "executor-placeholder-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("jobs")).unwrap();
        std::fs::create_dir_all(d.join("root")).unwrap();
        d.canonicalize().unwrap()
    }

    #[test]
    fn records_round_trip_any_path_bytes() {
        let e = Entry {
            path: PathBuf::from(OsStr::from_bytes(b"/w/odd name\n\xff")),
            dev: 7,
            ino: 42,
        };
        assert_eq!(parse(&line(&e)), vec![e]);
        assert_eq!(parse("garbage\n1 2 zz\n"), vec![]);
    }

    #[test]
    fn made_parents_and_placeholder_are_removed_unless_filled() {
        let d = scratch("made");
        let (jobs, root) = (d.join("jobs"), d.join("root"));
        let mut m = Maker::start(&jobs).unwrap();
        m.make(&root, &root, &root.join("a/b/hooks")).unwrap();
        let p = m.finish().unwrap();
        assert_eq!(p.entries().len(), 3);
        std::fs::write(root.join("a/kept"), "the job's").unwrap();
        p.remove().unwrap();
        assert!(!root.join("a/b").exists());
        assert!(root.join("a/kept").exists(), "a filled parent stays");
        assert_eq!(
            std::fs::read_dir(&jobs).unwrap().count(),
            1,
            "only the lock"
        );
    }

    #[test]
    fn a_symlinked_parent_is_never_followed() {
        let d = scratch("link");
        let (jobs, root) = (d.join("jobs"), d.join("root"));
        std::fs::create_dir_all(d.join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(d.join("elsewhere"), root.join("l")).unwrap();
        let mut m = Maker::start(&jobs).unwrap();
        let err = m
            .make(&root, &root.join("l"), &root.join("l/x"))
            .unwrap_err();
        assert!(
            matches!(err.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)),
            "{err}"
        );
        assert!(!d.join("elsewhere/x").exists());
    }

    #[test]
    fn sweep_removes_only_unheld_records() {
        let d = scratch("sweep");
        let (jobs, root) = (d.join("jobs"), d.join("root"));
        let mut m = Maker::start(&jobs).unwrap();
        m.make(&root, &root, &root.join("live")).unwrap();
        let live = m.finish().unwrap();
        let mut m = Maker::start(&jobs).unwrap();
        m.make(&root, &root, &root.join("dead")).unwrap();
        let mut dead = m.finish().unwrap();
        // An agent killed mid-job: its record stays, its lock goes.
        drop(dead.record.take());
        assert_eq!(sweep(&jobs).unwrap(), vec![root.join("dead")]);
        assert!(root.join("live").is_dir());
        live.remove().unwrap();
        assert!(!root.join("live").exists());
    }

    #[test]
    fn a_placeholder_held_by_two_jobs_goes_with_the_last() {
        let d = scratch("held");
        let (jobs, root) = (d.join("jobs"), d.join("root"));
        let mut m = Maker::start(&jobs).unwrap();
        m.make(&root, &root, &root.join("p/q")).unwrap();
        let first = m.finish().unwrap();
        let mut m = Maker::start(&jobs).unwrap();
        m.hold(&root, &root.join("p/q")).unwrap();
        let second = m.finish().unwrap();
        assert_eq!(second.entries().len(), 2, "parent and placeholder held");
        first.remove().unwrap();
        assert!(root.join("p/q").is_dir());
        second.remove().unwrap();
        assert!(!root.join("p").exists());
    }

    #[test]
    fn planted_non_files_are_skipped_never_waited_on() {
        let d = scratch("planted");
        let (jobs, root) = (d.join("jobs"), d.join("root"));
        std::fs::create_dir(jobs.join("evil.placeholders")).unwrap();
        nix::unistd::mkfifo(
            &jobs.join("fifo.placeholders"),
            Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        let mut m = Maker::start(&jobs).unwrap();
        m.make(&root, &root, &root.join("p")).unwrap();
        let p = m.finish().unwrap();
        assert_eq!(sweep(&jobs).unwrap(), Vec::<PathBuf>::new());
        p.remove().unwrap();
        assert!(!root.join("p").exists());
        // A lock file that is not a regular file is refused, not waited on.
        let d = scratch("planted-lock");
        nix::unistd::mkfifo(&d.join("jobs").join(LOCK), Mode::from_bits_truncate(0o600)).unwrap();
        assert!(Maker::start(&d.join("jobs")).is_err());
    }
}
