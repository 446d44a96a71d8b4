//! Filesystem (PROTOCOL.md §5), without a sandbox (requests that carry one
//! are refused with `sandbox_unavailable` until enforcement lands).
//!
//! Blocking file I/O runs on the runtime's blocking pool, never on its core
//! threads. Writes are atomic by default: a temp file beside the target,
//! fsync, rename. Streaming handles are bounded per session.

pub mod confine;
pub mod handles;
pub mod walk;

use crate::session::Session;
use executor_protocol::types::fs::*;
use executor_protocol::types::Empty;
use executor_protocol::{ErrorCode, WireError, WirePath};
use serde_bytes::ByteBuf;
use std::ffi::OsStr;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Map an I/O error on `path` to its wire error (`data.path`, `data.errno`).
pub fn io_error(e: &io::Error, path: &Path, what: &str) -> WireError {
    let errno = e.raw_os_error().unwrap_or(0);
    let code = match errno {
        libc::ENOENT => ErrorCode::NotFound,
        libc::EACCES | libc::EPERM => ErrorCode::PermissionDenied,
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
    let path = confine::confined(
        s.profile(),
        &p,
        &p.path,
        "path",
        confine::Access::Read,
        p.follow_symlinks,
    )?;
    blocking(move || {
        let m = if p.follow_symlinks {
            std::fs::metadata(&path)
        } else {
            std::fs::symlink_metadata(&path)
        }
        .map_err(|e| io_error(&e, &path, "cannot stat"))?;
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
    let path = confine::confined(
        s.profile(),
        &p,
        &p.path,
        "path",
        confine::Access::Read,
        true,
    )?;
    blocking(move || {
        let c =
            std::fs::canonicalize(&path).map_err(|e| io_error(&e, &path, "cannot canonicalize"))?;
        Ok(PathResult {
            path: WirePath::from_bytes(c.into_os_string().into_vec()),
        })
    })
    .await
}

use std::os::unix::ffi::OsStringExt;

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
    let path = confine::confined(
        s.profile(),
        &p,
        &p.path,
        "path",
        confine::Access::Read,
        true,
    )?;
    let max = s.limits().max_read_file_bytes;
    blocking(move || {
        let f = std::fs::File::open(&path).map_err(|e| io_error(&e, &path, "cannot open"))?;
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

/// A temp file name beside `target`, unique and hidden.
pub fn temp_beside(target: &Path) -> Result<PathBuf, WireError> {
    use ring::rand::{SecureRandom, SystemRandom};
    let mut r = [0u8; 8];
    SystemRandom::new().fill(&mut r).map_err(|_| {
        WireError::new(ErrorCode::Internal, "the OS random number generator failed")
    })?;
    let name = target.file_name().ok_or_else(|| {
        WireError::invalid_params("path", format!("{} has no file name", target.display()))
    })?;
    let mut tmp = Vec::from(b".".as_slice());
    tmp.extend_from_slice(name.as_bytes());
    tmp.extend_from_slice(b".executor-");
    for b in r {
        tmp.extend_from_slice(format!("{b:02x}").as_bytes());
    }
    tmp.extend_from_slice(b".tmp");
    Ok(target.with_file_name(OsStr::from_bytes(&tmp)))
}

/// The mode a new version of `target` gets: `mode` if given, else the
/// existing file's permission bits, else 0666 less the umask (by `open`).
fn existing_mode(target: &Path) -> Option<u32> {
    std::fs::metadata(target)
        .ok()
        .filter(|m| m.is_file())
        .map(|m| m.mode() & 0o7777)
}

/// Create a temp file beside `target` for an atomic replace.
pub fn create_temp(
    target: &Path,
    create_parents: bool,
) -> Result<(std::fs::File, PathBuf), WireError> {
    if create_parents {
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| io_error(&e, parent, "cannot create directory"))?;
        }
    }
    if std::fs::metadata(target)
        .map(|m| m.is_dir())
        .unwrap_or(false)
    {
        return Err(io_error(
            &io::Error::from_raw_os_error(libc::EISDIR),
            target,
            "cannot write",
        ));
    }
    let tmp = temp_beside(target)?;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o666)
        .open(&tmp)
        .map_err(|e| io_error(&e, target, "cannot create a temp file beside"))?;
    Ok((f, tmp))
}

/// fsync, set the mode, rename over `target`; removes the temp on failure.
pub fn finish_temp(
    f: &std::fs::File,
    tmp: &Path,
    target: &Path,
    mode: Option<u32>,
) -> Result<(), WireError> {
    let r = (|| {
        let mode = mode.or_else(|| existing_mode(target));
        if let Some(mode) = mode {
            // Exactly this mode: fchmod is not subject to the umask.
            f.set_permissions(std::fs::Permissions::from_mode(mode))
                .map_err(|e| io_error(&e, target, "cannot set the mode of"))?;
        }
        f.sync_all()
            .map_err(|e| io_error(&e, target, "cannot fsync"))?;
        // A symlink at `target` is replaced, not written through.
        std::fs::rename(tmp, target).map_err(|e| io_error(&e, target, "cannot rename into place"))
    })();
    if r.is_err() {
        let _ = std::fs::remove_file(tmp);
    }
    r
}

/// `fs/writeFile`
pub async fn write_file(s: &Arc<Session>, p: WriteFileParams) -> Result<Empty, WireError> {
    let path = confine::confined(
        s.profile(),
        &p,
        &p.path,
        "path",
        confine::Access::Write,
        false,
    )?;
    check_mode(p.mode)?;
    blocking(move || {
        if p.atomic {
            let (mut f, tmp) = create_temp(&path, p.create_parents)?;
            if let Err(e) = f.write_all(&p.data) {
                let _ = std::fs::remove_file(&tmp);
                return Err(io_error(&e, &path, "cannot write"));
            }
            finish_temp(&f, &tmp, &path, p.mode)?;
        } else {
            if p.create_parents {
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent)
                        .map_err(|e| io_error(&e, parent, "cannot create directory"))?;
                }
            }
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(p.mode.unwrap_or(0o666))
                .open(&path)
                .map_err(|e| io_error(&e, &path, "cannot open for writing"))?;
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
    let path = confine::confined(
        s.profile(),
        &p,
        &p.path,
        "path",
        confine::Access::Write,
        false,
    )?;
    blocking(move || {
        let r = if p.recursive {
            std::fs::create_dir_all(&path)
        } else {
            std::fs::create_dir(&path)
        };
        r.map_err(|e| io_error(&e, &path, "cannot create directory"))?;
        Ok(Empty {})
    })
    .await
}

/// `fs/remove`: a symlink is removed itself, never what it points to;
/// recursive removal never follows symlinks out of the tree.
pub async fn remove(s: &Arc<Session>, p: RemoveParams) -> Result<Empty, WireError> {
    let path = confine::confined(
        s.profile(),
        &p,
        &p.path,
        "path",
        confine::Access::Write,
        false,
    )?;
    blocking(move || {
        let m =
            std::fs::symlink_metadata(&path).map_err(|e| io_error(&e, &path, "cannot remove"))?;
        let r = if m.is_dir() {
            if p.recursive {
                // std's remove_dir_all does not follow symlinks (openat +
                // O_NOFOLLOW), so links inside are removed as links.
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_dir(&path)
            }
        } else {
            std::fs::remove_file(&path)
        };
        r.map_err(|e| io_error(&e, &path, "cannot remove"))?;
        Ok(Empty {})
    })
    .await
}

/// `fs/rename`
pub async fn rename(s: &Arc<Session>, p: RenameParams) -> Result<Empty, WireError> {
    let from = confine::confined(
        s.profile(),
        &p,
        &p.from,
        "from",
        confine::Access::Write,
        false,
    )?;
    let to = confine::confined(s.profile(), &p, &p.to, "to", confine::Access::Write, false)?;
    blocking(move || {
        std::fs::rename(&from, &to).map_err(|e| {
            let mut w = io_error(&e, &from, "cannot rename");
            w = w.with("to", wire_path_value(&to));
            w
        })?;
        Ok(Empty {})
    })
    .await
}
