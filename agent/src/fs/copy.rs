//! `fs/copy`: a file, a symlink (copied as a link, never followed) or, with
//! `recursive`, a directory tree.
//!
//! Both paths are resolved once ([`super::confine`]: the source for
//! reading, the destination for writing, each under the request's sandbox
//! and the profile's); from there everything acts on descriptors. The
//! source tree is walked depth first, each entry opened `O_PATH |
//! O_NOFOLLOW` in the directory descriptor it was listed from and judged by
//! `fstat` of that descriptor (a name swapped meanwhile changes nothing:
//! what is copied is what was judged). A regular file is read through its
//! descriptor; a symlink's bytes are read from it and made anew; a
//! directory is opened from its descriptor; FIFOs, sockets and devices are
//! never opened (skipped in a tree, refused as the source). At the
//! destination every entry is made beneath the directory descriptor it
//! belongs in (`mkdirat`, `symlinkat`; a file into a temp file `O_EXCL |
//! O_NOFOLLOW` renamed over the name with `renameat`, or, in a directory
//! the copy made itself, straight into a new name `O_EXCL | O_NOFOLLOW`),
//! never through a symlink there.
//!
//! Modes: permission bits are kept, setuid and setgid never (nothing
//! set-id appears on the host through the agent). Owners and times are
//! not copied. Files are not fsynced one by one.
//!
//! Bounds: the entries listed (`max_walk_entries`), the file bytes copied
//! (`max_copy_bytes`) and the depth ([`MAX_COPY_DEPTH`]); past one the copy
//! stops with `limit_exceeded`, what was made before it staying (as after
//! any error in a tree).
//!
//! A handler module: it uses the session, [`super::confine`] and the
//! helpers of [`super`].

use super::confine::{confined, denied, Access, Confinement, Open, Resolved};
use super::{blocking, io_error, temp_name};
use crate::session::Session;
use executor_protocol::limits::MAX_COPY_DEPTH;
use executor_protocol::types::fs::{CopyParams, CopyResult};
use executor_protocol::{ErrorCode, WireError};
use nix::fcntl::OFlag;
use nix::sys::stat::{fstat, FileStat, Mode};
use std::ffi::{OsStr, OsString};
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The bits of a mode a copy keeps: permissions and the sticky bit, never
/// setuid or setgid.
const KEPT_MODE: u32 = 0o1777;

/// How many `..` steps the check that a destination is not inside its
/// source climbs at most (deeper than any real tree; past it the copy is
/// refused).
const MAX_ANCESTORS: usize = 4096;

/// `fs/copy`
pub async fn copy(s: &Arc<Session>, p: CopyParams) -> Result<CopyResult, WireError> {
    let source = confined(s.profile(), &p, &p.source, "source", Open::read(false))?;
    let dest = confined(
        s.profile(),
        &p,
        &p.destination,
        "destination",
        Open::write(false),
    )?;
    let confinement = Confinement::of(s.profile(), &p)?;
    let bounds = Bounds {
        entries: s.limits().max_walk_entries,
        bytes: s.limits().max_copy_bytes,
    };
    blocking(move || {
        let mut c = Copy {
            confinement: confinement.as_ref(),
            bounds,
            done: CopyResult::default(),
            listed: 0,
        };
        c.top(&source, &dest, p.recursive)?;
        Ok(c.done)
    })
    .await
}

#[derive(Debug, Clone, Copy)]
struct Bounds {
    entries: u64,
    bytes: u64,
}

/// A copy in progress: what it made so far, against its bounds.
struct Copy<'a> {
    confinement: Option<&'a Confinement>,
    bounds: Bounds,
    done: CopyResult,
    /// Entries of the source tree listed so far.
    listed: u64,
}

/// A directory being copied: its listing, where the copy is in it, and
/// the directory made for it.
struct Level {
    src: OwnedFd,
    dst: OwnedFd,
    names: Vec<OsString>,
    next: usize,
    /// Below the source (for messages and carve-out checks).
    rel: PathBuf,
    /// The mode to give `dst` once filled (`None`: it existed before).
    mode: Option<u32>,
}

fn errno(e: nix::errno::Errno) -> io::Error {
    io::Error::from(e)
}

fn kind(st: &FileStat) -> libc::mode_t {
    st.st_mode & libc::S_IFMT
}

fn id(st: &FileStat) -> (u64, u64) {
    (st.st_dev, st.st_ino)
}

/// `fd` (an `O_PATH` descriptor) opened again with `flags`, through
/// itself: the same object, no name looked up.
fn reopen(fd: &OwnedFd, flags: OFlag) -> io::Result<OwnedFd> {
    Ok(nix::fcntl::open(
        format!("/proc/self/fd/{}", fd.as_raw_fd()).as_str(),
        flags | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?)
}

/// Open the directory `fd` (`O_PATH`) for listing, through itself.
fn open_dir(fd: &OwnedFd) -> io::Result<OwnedFd> {
    Ok(nix::fcntl::openat(
        fd,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?)
}

impl Copy<'_> {
    /// Copy what `source` resolved to onto `dest`.
    fn top(
        &mut self,
        source: &Resolved,
        dest: &Resolved,
        recursive: bool,
    ) -> Result<(), WireError> {
        let node = source.node()?;
        let st = fstat(node).map_err(|e| io_error(&errno(e), &source.path, "cannot stat"))?;
        let name = dest.name()?;
        match kind(&st) {
            libc::S_IFLNK => self.link(node, &dest.parent, name, &dest.path),
            libc::S_IFREG => {
                let file = source.reopen(libc::O_RDONLY | libc::O_CLOEXEC)?;
                self.file(file, &st, &dest.parent, name, &dest.path, false)
            }
            libc::S_IFDIR => {
                if !recursive {
                    return Err(WireError::invalid_params(
                        "recursive",
                        format!(
                            "{} is a directory: copying it needs recursive: true",
                            source.path.display()
                        ),
                    ));
                }
                self.tree(source, &st, dest)
            }
            _ => Err(WireError::invalid_params(
                "source",
                format!(
                    "{} is a FIFO, socket or device: fs/copy copies files, directories and symlinks",
                    source.path.display()
                ),
            )
            .with("path", super::wire_path_value(&source.path))),
        }
    }

    /// One more entry listed (`limit_exceeded` past `max_walk_entries`).
    fn listed(&mut self) -> Result<(), WireError> {
        self.listed += 1;
        if self.listed > self.bounds.entries {
            return Err(
                WireError::limit("max_walk_entries", self.bounds.entries, None)
                    .with("operation", "fs/copy"),
            );
        }
        Ok(())
    }

    /// A symlink made anew at `name` in `dir` with the bytes of `link`.
    fn link(
        &mut self,
        link: &OwnedFd,
        dir: &OwnedFd,
        name: &OsStr,
        at: &Path,
    ) -> Result<(), WireError> {
        let target = nix::fcntl::readlinkat(link, "")
            .map_err(|e| io_error(&errno(e), at, "cannot read the link to copy to"))?;
        nix::unistd::symlinkat(target.as_os_str(), dir, name)
            .map_err(|e| io_error(&errno(e), at, "cannot create the symlink"))?;
        self.done.entries += 1;
        Ok(())
    }

    /// The file `src` (of `st`) copied to `name` in `dir`: into a temp
    /// file renamed over the name (a symlink there is replaced, never
    /// written through), or, in a directory this copy made (`fresh`:
    /// nothing was there), straight into a new file (`O_EXCL`).
    fn file(
        &mut self,
        src: std::fs::File,
        st: &FileStat,
        dir: &OwnedFd,
        name: &OsStr,
        at: &Path,
        fresh: bool,
    ) -> Result<(), WireError> {
        let left = self.bounds.bytes - self.done.bytes;
        let over = |got: u64| {
            WireError::limit(
                "max_copy_bytes",
                self.bounds.bytes,
                Some(self.done.bytes + got),
            )
            .with("path", super::wire_path_value(at))
        };
        if st.st_size as u64 > left {
            return Err(over(st.st_size as u64));
        }
        let made = if fresh {
            name.to_os_string()
        } else {
            temp_name(name)?
        };
        let fd = nix::fcntl::openat(
            dir,
            made.as_os_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| {
            let what = if fresh {
                "cannot create"
            } else {
                "cannot create a temp file beside"
            };
            io_error(&errno(e), at, what)
        })?;
        let mut out = std::fs::File::from(fd);
        let r = (|| {
            // At most one byte past the budget: a file that grew is caught.
            let n = io::copy(&mut (&src).take(left + 1), &mut out)
                .map_err(|e| io_error(&e, at, "cannot copy to"))?;
            if n > left {
                return Err(over(n));
            }
            out.set_permissions(std::fs::Permissions::from_mode(st.st_mode & KEPT_MODE))
                .map_err(|e| io_error(&e, at, "cannot set the mode of"))?;
            if !fresh {
                nix::fcntl::renameat(dir, made.as_os_str(), dir, name)
                    .map_err(|e| io_error(&errno(e), at, "cannot rename into place"))?;
            }
            Ok(n)
        })();
        match r {
            Ok(n) => {
                self.done.bytes += n;
                self.done.entries += 1;
                Ok(())
            }
            Err(e) => {
                // What this copy created goes (a name that was there
                // before was never opened).
                let _ = nix::unistd::unlinkat(
                    dir,
                    made.as_os_str(),
                    nix::unistd::UnlinkatFlags::NoRemoveDir,
                );
                Err(e)
            }
        }
    }

    /// The directory `name` in `dir`: made (mode 0700 until it is filled,
    /// then the source's), or an existing directory (copied into), opened
    /// without following a symlink. Returns it and whether it was made.
    fn make_dir(
        &mut self,
        dir: &OwnedFd,
        name: &OsStr,
        at: &Path,
    ) -> Result<(OwnedFd, bool), WireError> {
        let made = match nix::sys::stat::mkdirat(dir, name, Mode::from_bits_truncate(0o700)) {
            Ok(()) => true,
            Err(nix::errno::Errno::EEXIST) => false,
            Err(e) => return Err(io_error(&errno(e), at, "cannot create directory")),
        };
        let fd = match nix::fcntl::openat(
            dir,
            name,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            // Something other than a directory holds the name.
            Err(nix::errno::Errno::ENOTDIR | nix::errno::Errno::ELOOP) if !made => {
                return Err(io_error(
                    &io::Error::from_raw_os_error(libc::EEXIST),
                    at,
                    "cannot copy a directory onto",
                ))
            }
            Err(e) => return Err(io_error(&errno(e), at, "cannot open directory")),
        };
        if made {
            self.done.entries += 1;
        }
        Ok((fd, made))
    }

    /// The names in the directory `fd` (sorted, `.` and `..` left out),
    /// each counted against `max_walk_entries` as it is listed.
    fn list(&mut self, fd: &OwnedFd, at: &Path) -> Result<Vec<OsString>, WireError> {
        let dup = fd
            .try_clone()
            .map_err(|e| io_error(&e, at, "cannot list"))?;
        let mut dir =
            nix::dir::Dir::from_fd(dup).map_err(|e| io_error(&errno(e), at, "cannot list"))?;
        let mut names = Vec::new();
        for e in dir.iter() {
            let e = e.map_err(|e| io_error(&errno(e), at, "cannot list"))?;
            let n = e.file_name().to_bytes();
            if n == b"." || n == b".." {
                continue;
            }
            self.listed()?;
            names.push(OsStr::from_bytes(n).to_os_string());
        }
        names.sort_unstable();
        Ok(names)
    }

    /// A directory tree: checked (not into itself, no carve-out inside
    /// either side), then copied depth first.
    fn tree(&mut self, source: &Resolved, st: &FileStat, dest: &Resolved) -> Result<(), WireError> {
        let into_itself = || {
            WireError::invalid_params(
                "destination",
                format!(
                    "{} is the directory {} or inside it: a directory cannot be copied into itself",
                    dest.path.display(),
                    source.path.display()
                ),
            )
        };
        if let Some(node) = &dest.node {
            let d = fstat(node).map_err(|e| io_error(&errno(e), &dest.path, "cannot stat"))?;
            if id(&d) == id(st) {
                return Err(into_itself());
            }
        }
        if self.inside(&dest.parent, id(st), &dest.path)? {
            return Err(into_itself());
        }
        if let Some(c) = self.confinement {
            if let Some(d) = c.carve_out_within(&source.path, Access::Read) {
                return Err(denied(
                    &source.path,
                    format!("holds the carve-out {}; it cannot be copied", d.display()),
                ));
            }
            if let Some(d) = c.carve_out_within(&dest.path, Access::Write) {
                return Err(denied(
                    &dest.path,
                    format!(
                        "holds the carve-out {}; nothing may be copied into it",
                        d.display()
                    ),
                ));
            }
        }
        let src = open_dir(source.node()?)
            .map_err(|e| io_error(&e, &source.path, "cannot open directory"))?;
        let (dst, made) = self.make_dir(&dest.parent, dest.name()?, &dest.path)?;
        let names = self.list(&src, &source.path)?;
        let mut stack = vec![Level {
            src,
            dst,
            names,
            next: 0,
            rel: PathBuf::new(),
            mode: made.then_some(st.st_mode & KEPT_MODE),
        }];
        loop {
            let depth = stack.len() as u64;
            let Some(top) = stack.last_mut() else {
                break;
            };
            let Some(name) = top.names.get(top.next).cloned() else {
                let done = stack.pop().expect("a level");
                if let Some(mode) = done.mode {
                    nix::sys::stat::fchmod(&done.dst, Mode::from_bits_truncate(mode)).map_err(
                        |e| {
                            io_error(
                                &errno(e),
                                &dest.path.join(&done.rel),
                                "cannot set the mode of",
                            )
                        },
                    )?;
                }
                continue;
            };
            top.next += 1;
            let rel = top.rel.join(&name);
            let (from, to) = (source.path.join(&rel), dest.path.join(&rel));
            let fd = nix::fcntl::openat(
                &top.src,
                name.as_os_str(),
                OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| io_error(&errno(e), &from, "cannot open"))?;
            let est = fstat(&fd).map_err(|e| io_error(&errno(e), &from, "cannot stat"))?;
            match kind(&est) {
                libc::S_IFLNK => self.link(&fd, &top.dst, &name, &to)?,
                libc::S_IFREG => {
                    if let Some(rule) = self
                        .confinement
                        .and_then(|c| c.refuses_identity(&est, Access::Read))
                    {
                        return Err(denied(&from, rule));
                    }
                    let file = reopen(&fd, OFlag::O_RDONLY)
                        .map_err(|e| io_error(&e, &from, "cannot open"))?;
                    self.file(
                        std::fs::File::from(file),
                        &est,
                        &top.dst,
                        &name,
                        &to,
                        top.mode.is_some(),
                    )?;
                }
                libc::S_IFDIR => {
                    if depth >= MAX_COPY_DEPTH {
                        return Err(WireError::limit("max_copy_depth", MAX_COPY_DEPTH, None)
                            .with("path", super::wire_path_value(&from)));
                    }
                    let src =
                        open_dir(&fd).map_err(|e| io_error(&e, &from, "cannot open directory"))?;
                    let (dst, made) = self.make_dir(&top.dst, &name, &to)?;
                    let names = self.list(&src, &from)?;
                    stack.push(Level {
                        src,
                        dst,
                        names,
                        next: 0,
                        rel,
                        mode: made.then_some(est.st_mode & KEPT_MODE),
                    });
                }
                // A FIFO, socket or device: never opened, left out.
                _ => self.done.skipped += 1,
            }
        }
        Ok(())
    }

    /// Whether the directory `dir` is the directory of identity `source`
    /// or below it: its ancestors climbed by descriptor (`..`), up to `/`.
    fn inside(&self, dir: &OwnedFd, source: (u64, u64), at: &Path) -> Result<bool, WireError> {
        let fail = |e: nix::errno::Errno| io_error(&errno(e), at, "cannot check the ancestors of");
        let mut cur = dir
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| io_error(&e, at, "cannot check"))?;
        for _ in 0..MAX_ANCESTORS {
            let st = fstat(&cur).map_err(fail)?;
            if id(&st) == source {
                return Ok(true);
            }
            let up = nix::fcntl::openat(
                &cur,
                "..",
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(fail)?;
            let ust = fstat(&up).map_err(fail)?;
            if id(&ust) == id(&st) {
                return Ok(false);
            }
            cur = up;
        }
        Err(WireError::new(
            ErrorCode::LimitExceeded,
            format!(
                "{} is more than {MAX_ANCESTORS} directories deep; not copied",
                at.display()
            ),
        ))
    }
}
