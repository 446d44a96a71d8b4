//! Filesystem (docs/PROTOCOL.md §5). A request's path is resolved once (under
//! its sandbox, if any: see [`confine`]) and every operation acts on the
//! descriptors that resolution opened.
//!
//! Blocking file I/O runs on the runtime's blocking pool, never on its core
//! threads. Writes are atomic by default: a temp file beside the target,
//! fsync, rename. Streaming handles are bounded per session.
//!
//! A handler module: it uses the session, its handle table
//! ([`crate::tables::handles`]), [`crate::config`] and
//! [`crate::sandbox_gate`] (through [`confine`]); nothing above it.

pub mod confine;
pub mod copy;
pub mod handles;
pub mod stream;
pub mod walk;

use crate::session::Session;
use confine::{Open, Resolved};
use executor_protocol::types::fs::*;
use executor_protocol::types::Empty;
use executor_protocol::{ErrorCode, WireError, WirePath};
use serde_bytes::ByteBuf;
use std::ffi::OsStr;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A request acting on one path, in its `path` field.
pub trait OnePath: executor_protocol::types::fs::Scoped {
    fn path(&self) -> &WirePath;
}

macro_rules! one_path {
    ($($t:ty),*) => {
        $(impl OnePath for $t {
            fn path(&self) -> &WirePath {
                &self.path
            }
        })*
    };
}

one_path!(
    StatParams,
    CanonicalizeParams,
    ReadFileParams,
    WriteFileParams,
    CreateDirectoryParams,
    RemoveParams,
    OpenParams,
    OpenWriteParams,
    ReadLinkParams,
    CreateSymlinkParams
);

/// The request's `path`, resolved once under its sandbox and the
/// session's profile ([`confine::confined`]).
pub fn target(s: &Session, p: &impl OnePath, open: Open) -> Result<Resolved, WireError> {
    confine::confined(s.profile(), p, p.path(), "path", open)
}

/// Map an I/O error on `path` to its wire error (`data.path`, `data.errno`).
pub fn io_error(e: &io::Error, path: &Path, what: &str) -> WireError {
    let errno = e.raw_os_error().unwrap_or(0);
    let code = match errno {
        libc::ENOENT => ErrorCode::NotFound,
        // A read-only filesystem refuses the write as a permission does.
        libc::EACCES | libc::EPERM | libc::EROFS => ErrorCode::PermissionDenied,
        libc::EEXIST | libc::ENOTEMPTY => ErrorCode::AlreadyExists,
        libc::ENOTDIR => ErrorCode::NotADirectory,
        libc::EISDIR => ErrorCode::IsADirectory,
        _ => match e.kind() {
            io::ErrorKind::NotFound => ErrorCode::NotFound,
            io::ErrorKind::PermissionDenied => ErrorCode::PermissionDenied,
            io::ErrorKind::AlreadyExists => ErrorCode::AlreadyExists,
            _ => ErrorCode::Io,
        },
    };
    let code = if errno == libc::ENOTEMPTY {
        ErrorCode::Io
    } else {
        code
    };
    WireError::new(code, format!("{what} {}: {e}", path.display()))
        .with("path", wire_path_value(path))
        .with("errno", errno)
}

/// An error making a new entry (`what` it was, for `path`) in the opened
/// directory `dir`. ENOENT there, while the directory is still linked, is
/// not a missing path: the filesystem takes no new names (procfs, sysfs
/// answer so): `permission_denied` saying which filesystem; anything else
/// as [`io_error`].
pub fn create_error(e: nix::errno::Errno, dir: &OwnedFd, path: &Path, what: &str) -> WireError {
    let still_linked = nix::sys::stat::fstat(dir).is_ok_and(|st| st.st_nlink > 0);
    if e != nix::errno::Errno::ENOENT || !still_linked {
        return io_error(&e.into(), path, what);
    }
    let fs = nix::sys::statfs::fstatfs(dir)
        .map(|s| fs_name(s.filesystem_type()))
        .unwrap_or("its");
    let dir_shown = path.parent().unwrap_or(path).display();
    WireError::new(
        ErrorCode::PermissionDenied,
        format!(
            "{what} {}: {dir_shown} takes no new files ({fs} filesystem; ENOENT); nothing was written",
            path.display()
        ),
    )
    .with("path", wire_path_value(path))
    .with("errno", libc::ENOENT)
}

/// A filesystem's name by its `statfs` magic, for messages.
fn fs_name(kind: nix::sys::statfs::FsType) -> &'static str {
    use nix::sys::statfs::*;
    match kind {
        PROC_SUPER_MAGIC => "the proc",
        SYSFS_MAGIC => "the sysfs",
        CGROUP2_SUPER_MAGIC => "the cgroup2",
        DEBUGFS_MAGIC => "the debugfs",
        _ => "its",
    }
}

/// A path as a wire value: str when UTF-8, bin otherwise.
pub fn wire_path_value(p: &Path) -> rmpv::Value {
    match p.to_str() {
        Some(s) => rmpv::Value::from(s),
        None => rmpv::Value::Binary(p.as_os_str().as_bytes().to_vec()),
    }
}

/// A request path: must be absolute.
pub fn req_path(p: &WirePath, field: &str) -> Result<PathBuf, WireError> {
    if !p.is_absolute() {
        return Err(WireError::invalid_params(
            field,
            format!("{field} must be an absolute path, got {:?}", p.display()),
        ));
    }
    if p.as_bytes().contains(&0) {
        return Err(WireError::invalid_params(
            field,
            format!("{field} contains a NUL byte"),
        ));
    }
    Ok(PathBuf::from(OsStr::from_bytes(p.as_bytes())))
}

/// A requested file mode: permission bits (with setuid/setgid/sticky) only.
pub fn check_mode(mode: Option<u32>) -> Result<(), WireError> {
    match mode {
        Some(m) if m > 0o7777 => Err(WireError::invalid_params(
            "mode",
            format!("mode {m:o} has bits beyond 07777"),
        )),
        _ => Ok(()),
    }
}

/// The setuid and setgid bits of a mode.
const SET_ID: u32 = 0o6000;

/// Under a sandbox, no setuid or setgid file is made.
pub fn check_confined_mode(mode: Option<u32>, r: &confine::Resolved) -> Result<(), WireError> {
    match mode {
        Some(m) if r.confined && m & SET_ID != 0 => Err(WireError::invalid_params(
            "mode",
            format!("mode {m:o} sets setuid or setgid, which a sandboxed request may not"),
        )),
        _ => Ok(()),
    }
}

/// Run blocking filesystem work off the runtime's core threads.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, WireError> + Send + 'static,
) -> Result<T, WireError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| WireError::new(ErrorCode::Internal, format!("filesystem task failed: {e}")))?
}

/// The wire kind of a file type (symlinks are never followed here).
pub(crate) fn kind_of(ft: std::fs::FileType) -> FileKind {
    if ft.is_symlink() {
        FileKind::Symlink
    } else if ft.is_dir() {
        FileKind::Dir
    } else if ft.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    }
}

/// Modification time in ns since the epoch.
pub fn mtime_ns(m: &std::fs::Metadata) -> i64 {
    m.mtime()
        .saturating_mul(1_000_000_000)
        .saturating_add(m.mtime_nsec())
}

/// `fs/stat`
pub async fn stat(s: &Arc<Session>, p: StatParams) -> Result<StatResult, WireError> {
    let path = target(s, &p, Open::read(p.follow_symlinks))?;
    blocking(move || {
        let m = node_metadata(&path)?;
        Ok(StatResult {
            kind: kind_of(m.file_type()),
            size: m.len(),
            mode: m.mode(),
            mtime_ns: mtime_ns(&m),
            uid: m.uid(),
            gid: m.gid(),
        })
    })
    .await
}

/// `fs/canonicalize`
pub async fn canonicalize(
    s: &Arc<Session>,
    p: CanonicalizeParams,
) -> Result<PathResult, WireError> {
    let path = target(s, &p, Open::read(true))?;
    blocking(move || {
        let fd = path.node()?;
        let c = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .map_err(|e| io_error(&e, &path.path, "cannot canonicalize"))?;
        Ok(PathResult {
            path: WirePath::from_bytes(c.into_os_string().into_vec()),
        })
    })
    .await
}

use std::os::unix::ffi::OsStringExt;

/// `fs/readLink`: the bytes of the symlink the resolution opened (its last
/// component never followed), read through that descriptor.
pub async fn read_link(s: &Arc<Session>, p: ReadLinkParams) -> Result<ReadLinkResult, WireError> {
    let path = target(s, &p, Open::read(false))?;
    blocking(move || {
        let fd = path.node()?;
        let st = nix::sys::stat::fstat(fd)
            .map_err(|e| io_error(&e.into(), &path.path, "cannot stat"))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFLNK {
            return Err(WireError::new(
                ErrorCode::Io,
                format!(
                    "cannot read the link {}: not a symbolic link",
                    path.path.display()
                ),
            )
            .with("path", wire_path_value(&path.path))
            .with("errno", libc::EINVAL));
        }
        // An empty name: the link the O_PATH descriptor itself is.
        let target = nix::fcntl::readlinkat(fd, "")
            .map_err(|e| io_error(&e.into(), &path.path, "cannot read the link"))?;
        Ok(ReadLinkResult {
            target: WirePath::from_bytes(target.into_vec()),
        })
    })
    .await
}

/// The longest symlink target the kernel stores (PATH_MAX less the NUL).
const MAX_LINK_TARGET: usize = libc::PATH_MAX as usize - 1;

/// `fs/createSymlink`: a new link named by `path` (resolved for writing,
/// never through an existing final component: one there is
/// `already_exists`), holding `target` as given. The target is bytes, not
/// resolved here: every later request through the link resolves it anew
/// under that request's own intent.
pub async fn create_symlink(s: &Arc<Session>, p: CreateSymlinkParams) -> Result<Empty, WireError> {
    let link = p.target.as_bytes();
    if link.is_empty() || link.contains(&0) {
        return Err(WireError::invalid_params(
            "target",
            format!(
                "target {:?} is empty or holds a NUL byte",
                p.target.display()
            ),
        ));
    }
    if link.len() > MAX_LINK_TARGET {
        return Err(
            WireError::limit("PATH_MAX", MAX_LINK_TARGET as u64, Some(link.len() as u64))
                .with("field", "target"),
        );
    }
    let path = target(s, &p, Open::write(false))?;
    blocking(move || {
        nix::unistd::symlinkat(
            OsStr::from_bytes(p.target.as_bytes()),
            &path.parent,
            path.name()?,
        )
        .map_err(|e| io_error(&e.into(), &path.path, "cannot create the symlink"))?;
        Ok(Empty {})
    })
    .await
}

/// Read up to `len` bytes at `offset` (fewer only at EOF).
pub fn read_at_most(f: &std::fs::File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        match f.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    buf.truncate(got);
    Ok(buf)
}

/// `fs/readFile`
pub async fn read_file(s: &Arc<Session>, p: ReadFileParams) -> Result<ReadFileResult, WireError> {
    let path = target(s, &p, Open::read(true))?;
    let max = s.limits().max_read_file_bytes;
    blocking(move || {
        let f = path.reopen(libc::O_RDONLY | libc::O_CLOEXEC)?;
        let path = path.path;
        let m = f.metadata().map_err(|e| io_error(&e, &path, "cannot stat"))?;
        if m.is_dir() {
            return Err(io_error(&io::Error::from_raw_os_error(libc::EISDIR), &path, "cannot read"));
        }
        let size = m.len();
        let offset = p.offset.unwrap_or(0);
        let want = match p.length {
            Some(l) => l,
            None => size.saturating_sub(offset),
        };
        if want > max {
            return Err(WireError::new(
                ErrorCode::LimitExceeded,
                format!(
                    "reading {want} bytes of {} exceeds max_read_file_bytes ({max}); use fs/open and fs/readBlock to stream it",
                    path.display()
                ),
            )
            .with("limit", "max_read_file_bytes")
            .with("max", max)
            .with("requested", want)
            .with("path", wire_path_value(&path)));
        }
        let data = read_at_most(&f, offset, want as usize).map_err(|e| io_error(&e, &path, "cannot read"))?;
        Ok(ReadFileResult {
            data: ByteBuf::from(data),
            size,
        })
    })
    .await
}

/// The metadata of the resolved object (a final symlink itself unless it
/// was followed).
fn node_metadata(r: &confine::Resolved) -> Result<std::fs::Metadata, WireError> {
    let fd = r
        .node()?
        .try_clone()
        .map_err(|e| io_error(&e, &r.path, "cannot stat"))?;
    std::fs::File::from(fd)
        .metadata()
        .map_err(|e| io_error(&e, &r.path, "cannot stat"))
}

/// A temp file name beside `name`, unique and hidden.
pub fn temp_name(name: &OsStr) -> Result<std::ffi::OsString, WireError> {
    let mut tmp = Vec::from(b".".as_slice());
    tmp.extend_from_slice(name.as_bytes());
    tmp.extend_from_slice(b".executor-");
    tmp.extend_from_slice(crate::session::random_hex::<8>()?.as_bytes());
    tmp.extend_from_slice(b".tmp");
    Ok(std::ffi::OsString::from_vec(tmp))
}

/// What `name` in `dir` is now, without following a symlink.
fn stat_at(dir: &OwnedFd, name: &OsStr) -> Option<nix::sys::stat::FileStat> {
    nix::sys::stat::fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW).ok()
}

pub use crate::tables::handles::{FileTimes, TempFile};

/// Create a temp file beside the resolved `target`.
pub fn create_temp(target: confine::Resolved) -> Result<TempFile, WireError> {
    let name = target.name()?.to_os_string();
    if stat_at(&target.parent, &name).is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR) {
        return Err(io_error(
            &io::Error::from_raw_os_error(libc::EISDIR),
            &target.path,
            "cannot write",
        ));
    }
    let tmp = temp_name(&name)?;
    let fd = nix::fcntl::openat(
        &target.parent,
        tmp.as_os_str(),
        nix::fcntl::OFlag::O_WRONLY
            | nix::fcntl::OFlag::O_CREAT
            | nix::fcntl::OFlag::O_EXCL
            | nix::fcntl::OFlag::O_NOFOLLOW
            | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
    )
    .map_err(|e| {
        create_error(
            e,
            &target.parent,
            &target.path,
            "cannot create a temp file beside",
        )
    })?;
    Ok(TempFile {
        file: std::fs::File::from(fd),
        dir: target.parent,
        tmp,
        name,
        target: target.path,
        confined: target.confined,
    })
}

/// Finishing an atomic replace (the type is the handle table's).
impl TempFile {
    /// Set the mode and the times given, fsync, rename over the target in
    /// the same directory; removes the temp on failure.
    pub fn finish(&self, mode: Option<u32>, times: FileTimes) -> Result<(), WireError> {
        let target = &self.target;
        let r = (|| {
            // The mode a new version gets: `mode` if given, else the
            // existing file's permission bits (under a sandbox without
            // setuid and setgid, as the kernel clears them on a write by
            // a process without CAP_FSETID), else 0666 less the umask.
            let kept = if self.confined { !SET_ID } else { 0o7777 };
            let mode = mode.or_else(|| {
                stat_at(&self.dir, &self.name)
                    .filter(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG)
                    .map(|st| st.st_mode & 0o7777 & kept)
            });
            if let Some(mode) = mode {
                // Exactly this mode: fchmod is not subject to the umask.
                self.file
                    .set_permissions(std::fs::Permissions::from_mode(mode))
                    .map_err(|e| io_error(&e, target, "cannot set the mode of"))?;
            }
            set_times(&self.file, times)
                .map_err(|e| io_error(&e, target, "cannot set the times of"))?;
            self.file
                .sync_all()
                .map_err(|e| io_error(&e, target, "cannot fsync"))?;
            // A symlink at the target is replaced, not written through.
            nix::fcntl::renameat(
                &self.dir,
                self.tmp.as_os_str(),
                &self.dir,
                self.name.as_os_str(),
            )
            .map_err(|e| io_error(&e.into(), target, "cannot rename into place"))
        })();
        if r.is_err() {
            self.discard();
        }
        r
    }
}

/// A time in ns since the epoch (before it when negative).
fn system_time(ns: i64) -> std::time::SystemTime {
    let d = std::time::Duration::from_nanos(ns.unsigned_abs());
    if ns < 0 {
        std::time::UNIX_EPOCH - d
    } else {
        std::time::UNIX_EPOCH + d
    }
}

/// Set the times given on the open file (`futimens`: the descriptor, not a
/// path); an absent one is left as it is.
fn set_times(f: &std::fs::File, times: FileTimes) -> io::Result<()> {
    if times == FileTimes::default() {
        return Ok(());
    }
    let mut t = std::fs::FileTimes::new();
    if let Some(ns) = times.mtime_ns {
        t = t.set_modified(system_time(ns));
    }
    if let Some(ns) = times.atime_ns {
        t = t.set_accessed(system_time(ns));
    }
    f.set_times(t)
}

/// `fs/writeFile`
pub async fn write_file(s: &Arc<Session>, p: WriteFileParams) -> Result<Empty, WireError> {
    check_mode(p.mode)?;
    let path = target(s, &p, Open::write(p.create_parents))?;
    check_confined_mode(p.mode, &path)?;
    blocking(move || {
        if p.atomic {
            let mut t = create_temp(path)?;
            if let Err(e) = t.file.write_all(&p.data) {
                t.discard();
                return Err(io_error(&e, &t.target, "cannot write"));
            }
            t.finish(p.mode, FileTimes::default())?;
        } else {
            // In place; under a sandbox never through a final symlink,
            // and only into the object the resolution checked: the name
            // is looked up again here, so what it opens must be that
            // object (or, where there was none, a file this open made),
            // and it is truncated only once that holds.
            use nix::fcntl::OFlag;
            let mut flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_CLOEXEC;
            let expected = match (&path.node, path.confined) {
                (_, false) => {
                    flags |= OFlag::O_TRUNC;
                    None
                }
                (None, true) => {
                    flags |= OFlag::O_NOFOLLOW | OFlag::O_EXCL;
                    None
                }
                (Some(node), true) => {
                    flags |= OFlag::O_NOFOLLOW;
                    let st = nix::sys::stat::fstat(node)
                        .map_err(|e| io_error(&e.into(), &path.path, "cannot stat"))?;
                    Some((st.st_dev, st.st_ino))
                }
            };
            // A FIFO without a reader fails (ENXIO) instead of blocking.
            flags |= OFlag::O_NONBLOCK;
            let fd = match nix::fcntl::openat(
                &path.parent,
                path.name()?,
                flags,
                nix::sys::stat::Mode::from_bits_truncate(p.mode.unwrap_or(0o666)),
            ) {
                Ok(fd) => fd,
                // Through a final symlink the intent refuses: say so.
                Err(nix::errno::Errno::ELOOP) if path.link_out.is_some() => {
                    return Err(path.link_out.clone().expect("checked"))
                }
                Err(e) => {
                    return Err(create_error(
                        e,
                        &path.parent,
                        &path.path,
                        "cannot open for writing",
                    ))
                }
            };
            if path.confined {
                let st = nix::sys::stat::fstat(&fd)
                    .map_err(|e| io_error(&e.into(), &path.path, "cannot stat"))?;
                if expected.is_some_and(|id| id != (st.st_dev, st.st_ino)) {
                    return Err(io_error(
                        &io::Error::from_raw_os_error(libc::EAGAIN),
                        &path.path,
                        "replaced while it was opened for writing; not written",
                    ));
                }
                if st.st_mode & libc::S_IFMT == libc::S_IFREG {
                    nix::unistd::ftruncate(&fd, 0)
                        .map_err(|e| io_error(&e.into(), &path.path, "cannot truncate"))?;
                }
            }
            let mut f = std::fs::File::from(fd);
            let confined = path.confined;
            let path = path.path;
            // Under a sandbox, a file written in place keeps no setuid or
            // setgid bit (this agent may hold CAP_FSETID, which keeps them
            // through its write): dropped before the first byte.
            if confined && p.mode.is_none() {
                let m = f
                    .metadata()
                    .map_err(|e| io_error(&e, &path, "cannot stat"))?
                    .permissions()
                    .mode();
                if m & SET_ID != 0 {
                    f.set_permissions(std::fs::Permissions::from_mode(m & 0o7777 & !SET_ID))
                        .map_err(|e| io_error(&e, &path, "cannot set the mode of"))?;
                }
            }
            if let Some(mode) = p.mode {
                f.set_permissions(std::fs::Permissions::from_mode(mode))
                    .map_err(|e| io_error(&e, &path, "cannot set the mode of"))?;
            }
            f.write_all(&p.data)
                .map_err(|e| io_error(&e, &path, "cannot write"))?;
            f.sync_all()
                .map_err(|e| io_error(&e, &path, "cannot fsync"))?;
        }
        Ok(Empty {})
    })
    .await
}

/// `fs/createDirectory`
pub async fn create_directory(
    s: &Arc<Session>,
    p: CreateDirectoryParams,
) -> Result<Empty, WireError> {
    check_mode(p.mode)?;
    let path = target(s, &p, Open::write(p.recursive))?;
    check_confined_mode(p.mode, &path)?;
    blocking(move || {
        match nix::sys::stat::mkdirat(
            &path.parent,
            path.name()?,
            nix::sys::stat::Mode::from_bits_truncate(0o777),
        ) {
            // The mode asked for, exactly (fchmod is not subject to the
            // umask), on the directory just made, opened without following
            // a link put in its place.
            Ok(()) if p.mode.is_some() => {
                use nix::fcntl::OFlag;
                let mode = p.mode.unwrap_or(0o777);
                nix::fcntl::openat(
                    &path.parent,
                    path.name()?,
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    nix::sys::stat::Mode::empty(),
                )
                .and_then(|fd| {
                    nix::sys::stat::fchmod(&fd, nix::sys::stat::Mode::from_bits_truncate(mode))
                })
                .map_err(|e| io_error(&e.into(), &path.path, "cannot set the mode of"))?;
            }
            Ok(()) => {}
            // `recursive` is `mkdir -p`: an existing directory is fine.
            Err(nix::errno::Errno::EEXIST)
                if p.recursive
                    && stat_at(&path.parent, path.name()?)
                        .is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR) => {}
            Err(e) => {
                return Err(create_error(
                    e,
                    &path.parent,
                    &path.path,
                    "cannot create directory",
                ))
            }
        }
        Ok(Empty {})
    })
    .await
}

/// `fs/remove`: a symlink is removed itself, never what it points to;
/// recursive removal never follows symlinks out of the tree.
pub async fn remove(s: &Arc<Session>, p: RemoveParams) -> Result<Empty, WireError> {
    let path = target(s, &p, Open::moved())?;
    blocking(move || {
        let name = path.name()?;
        let st =
            nix::sys::stat::fstatat(&path.parent, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
                .map_err(|e| io_error(&e.into(), &path.path, "cannot remove"))?;
        let r = if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            if p.recursive {
                // std's remove_dir_all does not follow symlinks (openat +
                // O_NOFOLLOW); its path goes through the parent's
                // descriptor, so the parent is not looked up again.
                std::fs::remove_dir_all(path.via_parent()?)
            } else {
                nix::unistd::unlinkat(&path.parent, name, nix::unistd::UnlinkatFlags::RemoveDir)
                    .map_err(io::Error::from)
            }
        } else {
            nix::unistd::unlinkat(&path.parent, name, nix::unistd::UnlinkatFlags::NoRemoveDir)
                .map_err(io::Error::from)
        };
        r.map_err(|e| io_error(&e, &path.path, "cannot remove"))?;
        Ok(Empty {})
    })
    .await
}

/// `fs/rename`
pub async fn rename(s: &Arc<Session>, p: RenameParams) -> Result<Empty, WireError> {
    let from = confine::confined(s.profile(), &p, &p.from, "from", Open::moved())?;
    let to = confine::confined(s.profile(), &p, &p.to, "to", Open::moved())?;
    blocking(move || {
        nix::fcntl::renameat(&from.parent, from.name()?, &to.parent, to.name()?).map_err(|e| {
            let mut w = io_error(&e.into(), &from.path, "cannot rename");
            w = w.with("to", wire_path_value(&to.path));
            w
        })?;
        Ok(Empty {})
    })
    .await
}
