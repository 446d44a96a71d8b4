//! Codex's `fs/*` methods over the native filesystem methods: each Codex
//! request is decoded strictly (camelCase, an unknown key refused), its
//! `sandbox` translated once ([`super::fs_scope`]), and answered from one
//! or more native requests (so every path is resolved and confined by the
//! native agent, under the profile, with its audit), with the reference
//! server's shapes, defaults, bounds and error messages (docs/CODEX.md,
//! "Filesystem").
//!
//! Client-chosen `handleId`s of `fs/open` map to native read handles, per
//! connection (closed when it ends). Where the session host passes a read
//! handle's open file (`fs/passDescriptor`, checked to be the file the
//! host opened: [`Passed::check`]), `fs/readBlock` reads it here, with no
//! native request per block; otherwise each block is a native
//! `fs/readBlock`. Either way the file was resolved, confined and opened
//! once, by the native agent. Uses the dialect's wire, uri and errors
//! modules, [`super::native`], the agent's [`crate::fs`] error words and
//! the protocol crate.

use super::errors::from_wire;
use super::wire::{self, code, Id, RpcError};
use super::{b64, decode, Conn};
use base64::Engine;
use executor_protocol::error::{ErrorCode, WireError};
use executor_protocol::methods as m;
use executor_protocol::types::fs::{
    CanonicalizeParams, CloseParams, CommitParams, CommitResult, CopyParams, CopyResult,
    CreateDirectoryParams, FileKind, OpenParams, OpenResult, OpenWriteParams, PathResult,
    ReadBlockParams, ReadBlockResult, ReadFileParams, ReadFileResult, RemoveParams, StatParams,
    StatResult, TruncatedBy, WalkParams, WalkResult, WriteBlockParams, WriteFileParams,
};
use executor_protocol::types::sandbox::SandboxIntent;
use executor_protocol::types::Empty;
use executor_protocol::WirePath;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The largest file `fs/readFile` returns (the reference's bound).
pub const MAX_READ_FILE_BYTES: u64 = 512 << 20;
/// The largest `len` of `fs/readBlock`.
pub const MAX_READ_BLOCK_BYTES: u64 = 1 << 20;
/// At most this many `fs/open` handles per connection.
pub const MAX_HANDLES: usize = 128;
/// The longest `handleId`, in bytes.
pub const MAX_HANDLE_ID_BYTES: usize = 32;
/// At most this many entries in an `fs/readDirectory` answer.
pub const MAX_DIRECTORY_ENTRIES: usize = 50_000;
/// `fs/walk` option bounds (above them the request is refused).
pub const WALK_MAX_DEPTH: u64 = 64;
pub const WALK_MAX_DIRECTORIES: u64 = 10_000;
pub const WALK_MAX_ENTRIES: u64 = 50_000;
/// The estimated JSON size of an `fs/walk` answer stays under this.
pub const WALK_MAX_RESPONSE_BYTES: usize = 4 << 20;
/// Data up to this size is written by one native `fs/writeFile`; larger
/// data goes through `fs/openWrite` in blocks (a native frame is bounded).
const WRITE_FILE_DIRECT_BYTES: usize = 1 << 20;
/// The first block size tried for chunked native reads and writes (the
/// native default `max_block_bytes`; a lower configured one is learnt
/// from its `limit_exceeded`).
const NATIVE_BLOCK: u64 = 1 << 20;
/// Entries asked of one native `fs/walk` page.
const WALK_PAGE: u64 = 65_536;

/// The `fs/open` handles of one connection: Codex id → what it opened.
#[derive(Debug, Default)]
pub struct Handles {
    map: Mutex<HashMap<String, Opened>>,
}

/// One `fs/open` handle: its native read handle, and the open file itself
/// when the session host passed it.
#[derive(Debug, Clone)]
struct Opened {
    native: u64,
    passed: Option<std::sync::Arc<Passed>>,
}

/// A read handle's open file, passed by the session host and checked.
#[derive(Debug)]
struct Passed {
    file: std::fs::File,
    /// The path it was opened by (for error messages).
    path: PathBuf,
}

impl Passed {
    /// `fd` as a [`Passed`] if it is the file the host said it opened
    /// (`dev`, `ino`): a regular file, open for reading only; why not
    /// otherwise.
    fn check(
        fd: std::os::fd::OwnedFd,
        id: executor_protocol::types::fs::PassDescriptorResult,
        path: &Path,
    ) -> Result<Passed, String> {
        use nix::fcntl::{fcntl, FcntlArg, OFlag};
        use std::os::unix::fs::MetadataExt;
        let file = std::fs::File::from(fd);
        let m = file
            .metadata()
            .map_err(|e| format!("cannot stat it: {e}"))?;
        if (m.dev(), m.ino()) != (id.dev, id.ino) {
            return Err(format!(
                "it is inode {}:{}, the host opened {}:{}",
                m.dev(),
                m.ino(),
                id.dev,
                id.ino
            ));
        }
        if !m.is_file() {
            return Err("it is not a regular file".into());
        }
        let flags = fcntl(&file, FcntlArg::F_GETFL).map_err(|e| format!("F_GETFL: {e}"))?;
        if OFlag::from_bits_truncate(flags) & OFlag::O_ACCMODE != OFlag::O_RDONLY {
            return Err("it is not open for reading only".into());
        }
        Ok(Passed {
            file,
            path: path.to_owned(),
        })
    }

    /// Up to `len` bytes at `offset` (fewer at the end of the file) into
    /// `buf`, as the native `fs/readBlock` reads.
    fn read(&self, offset: u64, len: usize, buf: &mut Vec<u8>) -> Result<usize, WireError> {
        use std::os::unix::fs::FileExt;
        buf.resize(len, 0);
        let mut got = 0;
        while got < len {
            match self.file.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(crate::fs::io_error(&e, &self.path, "cannot read")),
            }
        }
        Ok(got)
    }
}

/// The session host's open file of native read handle `handle`, when the
/// connection takes descriptors and the host passes it; `None` (reads go
/// through native `fs/readBlock`) otherwise.
async fn passed(conn: &Conn, handle: u64, path: &Path) -> Option<std::sync::Arc<Passed>> {
    if !conn.descriptors {
        return None;
    }
    match conn.native.pass_descriptor(handle).await {
        Ok((id, fd)) => match Passed::check(fd, id, path) {
            Ok(p) => Some(std::sync::Arc::new(p)),
            Err(why) => {
                tracing::warn!(
                    handle,
                    why,
                    "refusing the descriptor the session host passed"
                );
                None
            }
        },
        Err(e) => {
            tracing::debug!(error = %e, handle, "no descriptor passed: reading by fs/readBlock");
            None
        }
    }
}

/// The native `sandbox` and `cwd` of one Codex fs request.
#[derive(Debug, Default, Clone)]
pub struct Scope {
    pub sandbox: Option<SandboxIntent>,
    pub cwd: Option<WirePath>,
}

fn wire(p: &Path) -> WirePath {
    super::uri::wire_path(p)
}

fn path_of(p: &WirePath) -> PathBuf {
    PathBuf::from(OsStr::from_bytes(p.as_bytes()))
}

async fn call<P: Serialize, R: DeserializeOwned>(
    conn: &Conn,
    method: &str,
    params: &P,
) -> Result<R, WireError> {
    conn.native.call(method, params).await
}

fn not_a_file(path: &Path) -> RpcError {
    RpcError::invalid_request(format!("path `{}` is not a file", path.display()))
}

/// The native refusal to read something that is not a regular file: a
/// directory, or a FIFO, socket or device (`io` without an errno, never
/// opened).
fn is_not_a_file(e: &WireError) -> bool {
    match e.code {
        ErrorCode::IsADirectory => true,
        ErrorCode::Io => e
            .data_get("errno")
            .and_then(|v| v.as_i64())
            .is_none_or(|n| n == 0),
        _ => false,
    }
}

/// An OS error as the reference words it (its C library's text: ELOOP
/// is musl's "Symbolic link loop").
fn os_error(errno: i32) -> RpcError {
    let code = if errno == libc::ENOENT {
        code::NOT_FOUND
    } else {
        code::INTERNAL
    };
    let message = if errno == libc::ELOOP {
        format!("Symbolic link loop (os error {errno})")
    } else {
        std::io::Error::from_raw_os_error(errno).to_string()
    };
    RpcError::new(code, message)
}

/// `followSymlinks: false`: no component of `path` may be a symlink (the
/// reference's rule). The final one is looked at with a no-follow stat,
/// the others by canonicalizing the parent. The check is advisory (the
/// request itself is then made as its method makes it: writes never
/// follow a final symlink anyway), since the native side resolves again.
async fn refuse_symlinks(
    conn: &Conn,
    path: &Path,
    scope: &Scope,
    final_link: RpcError,
) -> Result<Option<StatResult>, RpcError> {
    if let Some(parent) = path.parent().filter(|p| *p != Path::new("/")) {
        let canon: Result<PathResult, _> = call(
            conn,
            m::FS_CANONICALIZE,
            &CanonicalizeParams {
                path: wire(parent),
                sandbox: scope.sandbox.clone(),
                cwd: scope.cwd.clone(),
            },
        )
        .await;
        match canon {
            Ok(c) if path_of(&c.path) != parent => return Err(os_error(libc::ENOTDIR)),
            Ok(_) => {}
            Err(e) => return Err(from_wire(&e)),
        }
    }
    let st: Result<StatResult, _> = call(conn, m::FS_STAT, &stat_params(path, false, scope)).await;
    match st {
        Ok(st) if st.kind == FileKind::Symlink => Err(final_link),
        Ok(st) => Ok(Some(st)),
        Err(e) if e.code == ErrorCode::NotFound => Ok(None),
        Err(e) => Err(from_wire(&e)),
    }
}

fn stat_params(path: &Path, follow: bool, scope: &Scope) -> StatParams {
    StatParams {
        path: wire(path),
        follow_symlinks: follow,
        sandbox: scope.sandbox.clone(),
        cwd: scope.cwd.clone(),
    }
}

/// Milliseconds since the epoch (0 before it, as the reference).
fn millis(ns: i64) -> i64 {
    ns.max(0) / 1_000_000
}

#[derive(Deserialize)]
#[serde(
    expecting = "struct WireFsGetMetadataParams",
    rename_all = "camelCase",
    deny_unknown_fields
)]
struct MetadataParams {
    path: String,
    #[serde(default)]
    follow_symlinks: Option<bool>,
    #[serde(default)]
    sandbox: Option<Value>,
}

pub async fn get_metadata(conn: &Conn, params: Value) -> Result<Value, RpcError> {
    let p: MetadataParams = decode(params)?;
    let path = super::uri::to_path(&p.path)?;
    conn.ready("filesystem")?;
    let scope = super::fs_scope(p.sandbox.as_ref())?;
    let (st, is_symlink) = if p.follow_symlinks == Some(false) {
        let link = RpcError::invalid_request("path contains a symbolic link");
        match refuse_symlinks(conn, &path, &scope, link).await? {
            Some(st) => (st, false),
            None => return Err(os_error(libc::ENOENT)),
        }
    } else {
        let st: StatResult = call(conn, m::FS_STAT, &stat_params(&path, true, &scope))
            .await
            .map_err(|e| from_wire(&e))?;
        let link: StatResult = call(conn, m::FS_STAT, &stat_params(&path, false, &scope))
            .await
            .map_err(|e| from_wire(&e))?;
        (st, link.kind == FileKind::Symlink)
    };
    Ok(json!({
        "isDirectory": st.kind == FileKind::Dir,
        "isFile": st.kind == FileKind::File,
        "isSymlink": is_symlink,
        "size": st.size,
        "createdAtMs": 0,
        "modifiedAtMs": millis(st.mtime_ns),
    }))
}

#[derive(Deserialize)]
#[serde(
    expecting = "struct WireFsReadFileParams",
    rename_all = "camelCase",
    deny_unknown_fields
)]
struct ReadParams {
    path: String,
    #[serde(default)]
    follow_symlinks: Option<bool>,
    #[serde(default)]
    sandbox: Option<Value>,
}

fn too_large() -> RpcError {
    RpcError::invalid_request(format!(
        "file is too large to read: limit is {MAX_READ_FILE_BYTES} bytes"
    ))
}

pub async fn read_file(conn: &Conn, params: Value) -> Result<Value, RpcError> {
    let p: ReadParams = decode(params)?;
    let path = super::uri::to_path(&p.path)?;
    conn.ready("filesystem")?;
    let scope = super::fs_scope(p.sandbox.as_ref())?;
    let nofollow = p.follow_symlinks == Some(false);
    let refuse = |e: &WireError| {
        if is_not_a_file(e) {
            if nofollow {
                RpcError::invalid_request("path is not a regular file")
            } else {
                not_a_file(&path)
            }
        } else {
            from_wire(e)
        }
    };
    if nofollow {
        refuse_symlinks(conn, &path, &scope, os_error(libc::ELOOP)).await?;
    }
    let whole: Result<ReadFileResult, _> = call(
        conn,
        m::FS_READ_FILE,
        &ReadFileParams {
            path: wire(&path),
            offset: None,
            length: None,
            sandbox: scope.sandbox.clone(),
            cwd: scope.cwd.clone(),
        },
    )
    .await;
    let data = match whole {
        Ok(r) if r.data.len() as u64 > MAX_READ_FILE_BYTES => return Err(too_large()),
        Ok(r) => r.data.into_vec(),
        // Above the native `max_read_file_bytes`: read by handle, once
        // opened, in blocks.
        Err(e) if e.code == ErrorCode::LimitExceeded => read_by_handle(conn, &path, &scope)
            .await
            .map_err(|e| match e {
            Big::TooLarge => too_large(),
            Big::Wire(e) => refuse(&e),
        })?,
        Err(e) => return Err(refuse(&e)),
    };
    Ok(json!({"dataBase64": b64(&data)}))
}

enum Big {
    TooLarge,
    Wire(WireError),
}

/// A native block size learnt from a `limit_exceeded` (its `max`).
fn lower_block(e: &WireError, block: u64) -> Option<u64> {
    if e.code != ErrorCode::LimitExceeded {
        return None;
    }
    e.data_get("max")
        .and_then(|v| v.as_u64())
        .filter(|&max| max > 0 && max < block)
}

async fn read_by_handle(conn: &Conn, path: &Path, scope: &Scope) -> Result<Vec<u8>, Big> {
    let opened: OpenResult = call(
        conn,
        m::FS_OPEN,
        &OpenParams {
            path: wire(path),
            sandbox: scope.sandbox.clone(),
            cwd: scope.cwd.clone(),
        },
    )
    .await
    .map_err(Big::Wire)?;
    let out = read_blocks(conn, opened).await;
    let _: Result<Empty, _> = call(
        conn,
        m::FS_CLOSE,
        &CloseParams {
            handle: opened.handle,
            sandbox: None,
            cwd: None,
        },
    )
    .await;
    out
}

async fn read_blocks(conn: &Conn, opened: OpenResult) -> Result<Vec<u8>, Big> {
    if opened.size > MAX_READ_FILE_BYTES {
        return Err(Big::TooLarge);
    }
    let mut data = Vec::with_capacity(opened.size as usize);
    let mut block = NATIVE_BLOCK;
    loop {
        let r: Result<ReadBlockResult, _> = call(
            conn,
            m::FS_READ_BLOCK,
            &ReadBlockParams {
                handle: opened.handle,
                offset: data.len() as u64,
                length: block,
                sandbox: None,
                cwd: None,
            },
        )
        .await;
        let r = match r {
            Ok(r) => r,
            Err(e) => match lower_block(&e, block) {
                Some(b) => {
                    block = b;
                    continue;
                }
                None => return Err(Big::Wire(e)),
            },
        };
        let n = r.data.len() as u64;
        if data.len() as u64 + n > MAX_READ_FILE_BYTES {
            return Err(Big::TooLarge);
        }
        data.extend_from_slice(&r.data);
        // Until a short read: a file that grew is read on (bounded).
        if n < block {
            return Ok(data);
        }
    }
}

#[derive(Deserialize)]
#[serde(
    expecting = "struct WireFsWriteFileParams",
    rename_all = "camelCase",
    deny_unknown_fields
)]
struct WriteParams {
    path: String,
    data_base64: String,
    #[serde(default)]
    follow_symlinks: Option<bool>,
    #[serde(default)]
    sandbox: Option<Value>,
}

pub async fn write_file(conn: &Conn, params: Value) -> Result<Value, RpcError> {
    let p: WriteParams = decode(params)?;
    let path = super::uri::to_path(&p.path)?;
    conn.ready("filesystem")?;
    let data = base64::engine::general_purpose::STANDARD
        .decode(p.data_base64.as_bytes())
        .map_err(|e| {
            RpcError::invalid_request(format!(
                "fs/writeFile requires valid base64 dataBase64: {e}"
            ))
        })?;
    let scope = super::fs_scope(p.sandbox.as_ref())?;
    let nofollow = p.follow_symlinks == Some(false);
    if nofollow {
        refuse_symlinks(conn, &path, &scope, os_error(libc::ELOOP)).await?;
    }
    if data.len() <= WRITE_FILE_DIRECT_BYTES {
        // In place, as the reference writes (through a final symlink,
        // keeping the file's inode and mode); without following a final
        // symlink when asked not to.
        let _: Empty = call(
            conn,
            m::FS_WRITE_FILE,
            &WriteFileParams {
                path: wire(&path),
                data: ByteBuf::from(data),
                mode: None,
                create_parents: false,
                atomic: nofollow,
                sandbox: scope.sandbox.clone(),
                cwd: scope.cwd.clone(),
            },
        )
        .await
        .map_err(|e| from_wire(&e))?;
        return Ok(json!({}));
    }
    write_by_handle(conn, &path, &scope, &data)
        .await
        .map_err(|e| from_wire(&e))?;
    Ok(json!({}))
}

/// Data too large for one native frame: a native write handle, blocks,
/// then the commit (the file appears whole at `path`).
async fn write_by_handle(
    conn: &Conn,
    path: &Path,
    scope: &Scope,
    data: &[u8],
) -> Result<(), WireError> {
    let h: executor_protocol::types::fs::HandleResult = call(
        conn,
        m::FS_OPEN_WRITE,
        &OpenWriteParams {
            path: wire(path),
            mode: None,
            create_parents: false,
            mtime_ns: None,
            atime_ns: None,
            sandbox: scope.sandbox.clone(),
            cwd: scope.cwd.clone(),
        },
    )
    .await?;
    let mut block = NATIVE_BLOCK as usize;
    let mut at = 0usize;
    while at < data.len() {
        let end = (at + block).min(data.len());
        let r: Result<Empty, _> = call(
            conn,
            m::FS_WRITE_BLOCK,
            &WriteBlockParams {
                handle: h.handle,
                offset: at as u64,
                data: ByteBuf::from(data[at..end].to_vec()),
                sandbox: None,
                cwd: None,
            },
        )
        .await;
        match r {
            Ok(_) => at = end,
            Err(e) => match lower_block(&e, block as u64) {
                Some(b) => block = b as usize,
                None => {
                    let _: Result<Empty, _> = call(
                        conn,
                        m::FS_CLOSE,
                        &CloseParams {
                            handle: h.handle,
                            sandbox: None,
                            cwd: None,
                        },
                    )
                    .await;
                    return Err(e);
                }
            },
        }
    }
    let _: CommitResult = call(
        conn,
        m::FS_COMMIT,
        &CommitParams {
            handle: h.handle,
            sandbox: None,
            cwd: None,
        },
    )
    .await?;
    Ok(())
}

#[derive(Deserialize)]
#[serde(
    expecting = "struct WireFsCreateDirectoryParams",
    rename_all = "camelCase",
    deny_unknown_fields
)]
struct CreateDirParams {
    path: String,
    #[serde(default)]
    recursive: Option<bool>,
    #[serde(default)]
    follow_symlinks: Option<bool>,
    #[serde(default)]
    sandbox: Option<Value>,
}

pub async fn create_directory(conn: &Conn, params: Value) -> Result<Value, RpcError> {
    let p: CreateDirParams = decode(params)?;
    let path = super::uri::to_path(&p.path)?;
    conn.ready("filesystem")?;
    let scope = super::fs_scope(p.sandbox.as_ref())?;
    if p.follow_symlinks == Some(false) {
        refuse_symlinks(conn, &path, &scope, os_error(libc::ENOTDIR)).await?;
    }
    let recursive = p.recursive.unwrap_or(true);
    let r: Result<Empty, _> = call(
        conn,
        m::FS_CREATE_DIRECTORY,
        &CreateDirectoryParams {
            path: wire(&path),
            recursive,
            mode: None,
            sandbox: scope.sandbox.clone(),
            cwd: scope.cwd.clone(),
        },
    )
    .await;
    match r {
        Ok(_) => Ok(json!({})),
        // `mkdir -p` as the reference has it: a symlink to a directory is
        // one; a file on the way is "not a directory".
        Err(e) if recursive && e.code == ErrorCode::AlreadyExists => {
            let st: Result<StatResult, _> =
                call(conn, m::FS_STAT, &stat_params(&path, true, &scope)).await;
            match st {
                Ok(st) if st.kind == FileKind::Dir => Ok(json!({})),
                Err(s) if s.code == ErrorCode::NotADirectory => Err(os_error(libc::ENOTDIR)),
                _ => Err(from_wire(&e)),
            }
        }
        Err(e) => Err(from_wire(&e)),
    }
}

#[derive(Deserialize)]
#[serde(
    expecting = "struct WireFsRemoveParams",
    rename_all = "camelCase",
    deny_unknown_fields
)]
struct RemoveArgs {
    path: String,
    #[serde(default)]
    recursive: Option<bool>,
    #[serde(default)]
    force: Option<bool>,
    #[serde(default)]
    follow_symlinks: Option<bool>,
    #[serde(default)]
    sandbox: Option<Value>,
}

pub async fn remove(conn: &Conn, params: Value) -> Result<Value, RpcError> {
    let p: RemoveArgs = decode(params)?;
    let path = super::uri::to_path(&p.path)?;
    conn.ready("filesystem")?;
    let scope = super::fs_scope(p.sandbox.as_ref())?;
    let recursive = p.recursive.unwrap_or(true);
    if p.follow_symlinks == Some(false) && recursive {
        return Err(RpcError::internal(
            "recursive no-follow removal is unsupported",
        ));
    }
    // The native removal never follows a symlink (a final one is removed
    // itself), so `followSymlinks` changes nothing else.
    let r: Result<Empty, _> = call(
        conn,
        m::FS_REMOVE,
        &RemoveParams {
            path: wire(&path),
            recursive,
            sandbox: scope.sandbox.clone(),
            cwd: scope.cwd.clone(),
        },
    )
    .await;
    match r {
        Ok(_) => Ok(json!({})),
        Err(e) if e.code == ErrorCode::NotFound && p.force.unwrap_or(true) => Ok(json!({})),
        Err(e) => Err(from_wire(&e)),
    }
}

#[derive(Deserialize)]
#[serde(
    expecting = "struct WireFsCanonicalizeParams",
    rename_all = "camelCase",
    deny_unknown_fields
)]
struct CanonicalizeArgs {
    path: String,
    #[serde(default)]
    sandbox: Option<Value>,
}

#[derive(Deserialize)]
#[serde(
    expecting = "struct WireFsReadDirectoryParams",
    rename_all = "camelCase",
    deny_unknown_fields
)]
struct ReadDirectoryArgs {
    path: String,
    #[serde(default)]
    sandbox: Option<Value>,
}

pub async fn canonicalize(conn: &Conn, params: Value) -> Result<Value, RpcError> {
    let p: CanonicalizeArgs = decode(params)?;
    let path = super::uri::to_path(&p.path)?;
    conn.ready("filesystem")?;
    let scope = super::fs_scope(p.sandbox.as_ref())?;
    let r: PathResult = call(
        conn,
        m::FS_CANONICALIZE,
        &CanonicalizeParams {
            path: wire(&path),
            sandbox: scope.sandbox.clone(),
            cwd: scope.cwd.clone(),
        },
    )
    .await
    .map_err(|e| from_wire(&e))?;
    Ok(json!({"path": super::uri::from_wire(&r.path)}))
}

/// One native listing page of `dir` (its entries only, not entered).
async fn list_page(
    conn: &Conn,
    dir: &Path,
    scope: &Scope,
    cursor: Option<ByteBuf>,
) -> Result<WalkResult, WireError> {
    call(
        conn,
        m::FS_WALK,
        &WalkParams {
            root: wire(dir),
            max_depth: 1,
            max_entries: WALK_PAGE,
            max_directories: 1,
            max_response_bytes: executor_protocol::limits::MAX_WALK_RESPONSE_BYTES,
            include_hidden: true,
            cursor,
            sandbox: scope.sandbox.clone(),
            cwd: scope.cwd.clone(),
        },
    )
    .await
}

/// What a listed name is once a symlink is followed (`None`: dangling or
/// unreadable).
async fn followed_kind(conn: &Conn, path: &Path, scope: &Scope) -> Option<FileKind> {
    let st: Result<StatResult, _> = call(conn, m::FS_STAT, &stat_params(path, true, scope)).await;
    st.ok().map(|s| s.kind)
}

pub async fn read_directory(conn: &Conn, params: Value) -> Result<Value, RpcError> {
    let p: ReadDirectoryArgs = decode(params)?;
    let path = super::uri::to_path(&p.path)?;
    conn.ready("filesystem")?;
    let scope = super::fs_scope(p.sandbox.as_ref())?;
    let mut entries = Vec::new();
    let mut count = 0usize;
    let mut cursor = None;
    loop {
        let page = list_page(conn, &path, &scope, cursor.take())
            .await
            .map_err(|e| from_wire(&e))?;
        for e in &page.entries {
            let name = e.path.as_bytes();
            let kind = match e.kind {
                FileKind::Symlink if count < MAX_DIRECTORY_ENTRIES => {
                    match followed_kind(conn, &path.join(OsStr::from_bytes(name)), &scope).await {
                        Some(k) => k,
                        // The reference leaves out what it cannot stat.
                        None => continue,
                    }
                }
                k => k,
            };
            count += 1;
            if count <= MAX_DIRECTORY_ENTRIES {
                entries.push(json!({
                    "fileName": String::from_utf8_lossy(name),
                    "isDirectory": kind == FileKind::Dir,
                    "isFile": kind == FileKind::File,
                }));
            }
        }
        match page.next_cursor {
            Some(c) if page.truncated => cursor = Some(c),
            _ => break,
        }
    }
    if count > MAX_DIRECTORY_ENTRIES {
        return Err(RpcError::internal(format!(
            "fs/readDirectory returned {count} entries; limit is {MAX_DIRECTORY_ENTRIES}"
        )));
    }
    Ok(json!({"entries": entries}))
}

#[derive(Deserialize)]
#[serde(
    expecting = "struct WireFsWalkParams",
    rename_all = "camelCase",
    deny_unknown_fields
)]
struct WalkArgs {
    path: String,
    options: WalkOptions,
    #[serde(default)]
    sandbox: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WalkOptions {
    max_depth: u64,
    max_directories: u64,
    max_entries: u64,
    follow_directory_symlinks: bool,
    #[serde(default)]
    prune_hidden_directories: bool,
}

/// The OS part of a native error's message (`cannot open /x: Permission
/// denied (os error 13)` → `Permission denied (os error 13)`).
fn os_message(message: &str) -> &str {
    match message.rfind(": ") {
        Some(i) if message.ends_with(')') && message[i..].contains("os error") => &message[i + 2..],
        _ => message,
    }
}

/// The answer being built by `fs/walk`.
struct Walk {
    entries: Vec<Value>,
    errors: Vec<Value>,
    bytes: usize,
    truncated: bool,
    /// Names met that count toward `maxEntries`: as the reference counts,
    /// every name whose (followed) stat succeeds, listed or not (a
    /// symlink not followed, a FIFO); not a dangling symlink.
    seen: usize,
    max_entries: usize,
}

impl Walk {
    /// Count one name toward `maxEntries`; false once the bound is
    /// reached (the walk stops, truncated).
    fn count(&mut self) -> bool {
        if self.seen >= self.max_entries {
            self.truncated = true;
            return false;
        }
        self.seen += 1;
        true
    }
    /// Add an entry (counted already); false once the answer is full.
    fn entry(&mut self, path: &Path, kind: &str) -> bool {
        let uri = super::uri::from_path(path);
        let size = uri.len() + kind.len() + 32;
        if self.bytes + size > WALK_MAX_RESPONSE_BYTES {
            self.truncated = true;
            return false;
        }
        self.bytes += size;
        self.entries.push(json!({"path": uri, "kind": kind}));
        true
    }
    fn error(&mut self, path: &Path, message: &str) -> bool {
        let uri = super::uri::from_path(path);
        let size = uri.len() + message.len() + 32;
        if self.bytes + size > WALK_MAX_RESPONSE_BYTES {
            self.truncated = true;
            return false;
        }
        self.bytes += size;
        self.errors
            .push(json!({"path": uri, "message": os_message(message)}));
        true
    }
    fn new(max_entries: usize) -> Walk {
        Walk {
            entries: Vec::new(),
            errors: Vec::new(),
            bytes: 64,
            truncated: false,
            seen: 0,
            max_entries,
        }
    }
    fn answer(self) -> Value {
        json!({"entries": self.entries, "errors": self.errors, "truncated": self.truncated})
    }
}

pub async fn walk(conn: &Conn, params: Value) -> Result<Value, RpcError> {
    let p: WalkArgs = decode(params)?;
    let root = super::uri::to_path(&p.path)?;
    conn.ready("filesystem")?;
    let o = p.options;
    if o.max_depth > WALK_MAX_DEPTH
        || o.max_directories > WALK_MAX_DIRECTORIES
        || o.max_entries > WALK_MAX_ENTRIES
    {
        return Err(RpcError::invalid_request(format!(
            "filesystem walk limits exceed maximums: depth={WALK_MAX_DEPTH}, directories={WALK_MAX_DIRECTORIES}, entries={WALK_MAX_ENTRIES}"
        )));
    }
    if o.max_directories == 0 || o.max_entries == 0 {
        return Err(RpcError::invalid_request(
            "filesystem walk limits must be greater than zero",
        ));
    }
    let scope = super::fs_scope(p.sandbox.as_ref())?;
    let mut out = Walk::new(o.max_entries as usize);
    // The root: a directory, or a symlink to one when links are followed;
    // anything else has nothing to list.
    let st: StatResult = call(conn, m::FS_STAT, &stat_params(&root, false, &scope))
        .await
        .map_err(|e| from_wire(&e))?;
    let is_dir = match st.kind {
        FileKind::Dir => true,
        FileKind::Symlink if o.follow_directory_symlinks => {
            followed_kind(conn, &root, &scope).await == Some(FileKind::Dir)
        }
        _ => false,
    };
    if !is_dir {
        return Ok(out.answer());
    }
    if !o.follow_directory_symlinks && !o.prune_hidden_directories {
        if let Some(answer) = walk_at_once(conn, &root, &scope, &o, &mut out).await? {
            return Ok(answer);
        }
        out = Walk::new(o.max_entries as usize);
    }
    let canon: PathResult = call(
        conn,
        m::FS_CANONICALIZE,
        &CanonicalizeParams {
            path: wire(&root),
            sandbox: scope.sandbox.clone(),
            cwd: scope.cwd.clone(),
        },
    )
    .await
    .map_err(|e| from_wire(&e))?;
    // Directories read, by canonical path: a followed link to one already
    // read is left out, and a directory is read once.
    let mut read: HashSet<PathBuf> = HashSet::new();
    let mut queue: VecDeque<(PathBuf, PathBuf, u64)> = VecDeque::new();
    queue.push_back((root, path_of(&canon.path), 0));
    let mut directories = 0u64;
    'dirs: while let Some((dir, canon, depth)) = queue.pop_front() {
        if read.contains(&canon) {
            continue;
        }
        if directories >= o.max_directories {
            out.truncated = true;
            break;
        }
        directories += 1;
        read.insert(canon.clone());
        let mut cursor = None;
        loop {
            let page = match list_page(conn, &dir, &scope, cursor.take()).await {
                Ok(page) => page,
                Err(e) => {
                    if !out.error(&dir, &from_wire(&e).message) {
                        break 'dirs;
                    }
                    continue 'dirs;
                }
            };
            for e in &page.entries {
                let name = OsStr::from_bytes(e.path.as_bytes());
                let path = dir.join(name);
                let hidden = name.as_bytes().first() == Some(&b'.');
                let enter = depth < o.max_depth && !(o.prune_hidden_directories && hidden);
                // What a symlink leads to (a dangling one is skipped,
                // not counted).
                let followed = match e.kind {
                    FileKind::Symlink => match followed_kind(conn, &path, &scope).await {
                        Some(k) => Some(k),
                        None => continue,
                    },
                    _ => None,
                };
                if !out.count() {
                    break 'dirs;
                }
                match e.kind {
                    FileKind::File if !out.entry(&path, "file") => break 'dirs,
                    FileKind::File => {}
                    FileKind::Dir => {
                        if !out.entry(&path, "directory") {
                            break 'dirs;
                        }
                        if enter {
                            queue.push_back((path, canon.join(name), depth + 1));
                        }
                    }
                    FileKind::Symlink
                        if o.follow_directory_symlinks && followed == Some(FileKind::Dir) =>
                    {
                        let c: Result<PathResult, _> = call(
                            conn,
                            m::FS_CANONICALIZE,
                            &CanonicalizeParams {
                                path: wire(&path),
                                sandbox: scope.sandbox.clone(),
                                cwd: scope.cwd.clone(),
                            },
                        )
                        .await;
                        let Ok(c) = c else { continue };
                        let target = path_of(&c.path);
                        if read.contains(&target) {
                            continue;
                        }
                        if !out.entry(&path, "directory") {
                            break 'dirs;
                        }
                        if enter {
                            queue.push_back((path, target, depth + 1));
                        }
                    }
                    // Symlinks not followed, FIFOs, sockets, devices: not
                    // listed (the reference's kinds are directory and file).
                    _ => {}
                }
            }
            for e in &page.errors {
                if !out.error(&dir.join(OsStr::from_bytes(e.path.as_bytes())), &e.message) {
                    break 'dirs;
                }
            }
            match page.next_cursor {
                Some(c) if page.truncated => cursor = Some(c),
                _ => break,
            }
        }
    }
    Ok(out.answer())
}

/// The walk as one native walk (no link followed, nothing pruned: the
/// native walk lists the same directories in the same order, breadth
/// first, each sorted). `None` when one native page does not hold it
/// (more than [`WALK_PAGE`] names, links and special files included):
/// the caller walks directory by directory instead.
async fn walk_at_once(
    conn: &Conn,
    root: &Path,
    scope: &Scope,
    o: &WalkOptions,
    out: &mut Walk,
) -> Result<Option<Value>, RpcError> {
    let page: WalkResult = call(
        conn,
        m::FS_WALK,
        &WalkParams {
            root: wire(root),
            // The native depth counts the root's children as 1.
            max_depth: (o.max_depth + 1) as u32,
            max_entries: WALK_PAGE,
            max_directories: o.max_directories,
            max_response_bytes: executor_protocol::limits::MAX_WALK_RESPONSE_BYTES,
            include_hidden: true,
            cursor: None,
            sandbox: scope.sandbox.clone(),
            cwd: scope.cwd.clone(),
        },
    )
    .await
    .map_err(|e| from_wire(&e))?;
    let cut_by_directories = page.truncated_by == Some(TruncatedBy::MaxDirectories);
    if page.next_cursor.is_some() && !cut_by_directories {
        return Ok(None);
    }
    for e in &page.entries {
        let path = root.join(OsStr::from_bytes(e.path.as_bytes()));
        if e.kind == FileKind::Symlink && followed_kind(conn, &path, scope).await.is_none() {
            continue;
        }
        if !out.count() {
            return Ok(Some(std::mem::replace(out, Walk::new(0)).answer()));
        }
        let kind = match e.kind {
            FileKind::File => "file",
            FileKind::Dir => "directory",
            _ => continue,
        };
        if !out.entry(&path, kind) {
            return Ok(Some(std::mem::replace(out, Walk::new(0)).answer()));
        }
    }
    for e in &page.errors {
        if !out.error(&root.join(OsStr::from_bytes(e.path.as_bytes())), &e.message) {
            break;
        }
    }
    out.truncated |= cut_by_directories;
    Ok(Some(std::mem::replace(out, Walk::new(0)).answer()))
}

#[derive(Deserialize)]
#[serde(
    expecting = "struct WireFsOpenParams",
    rename_all = "camelCase",
    deny_unknown_fields
)]
struct OpenArgs {
    handle_id: String,
    path: String,
    #[serde(default)]
    mode: Option<OpenMode>,
    #[serde(default)]
    sandbox: Option<Value>,
}

#[derive(Deserialize, PartialEq)]
#[serde(rename_all = "lowercase")]
enum OpenMode {
    Read,
    Replace,
}

pub async fn open(conn: &Conn, params: Value) -> Result<Value, RpcError> {
    let p: OpenArgs = decode(params)?;
    let path = super::uri::to_path(&p.path)?;
    conn.ready("filesystem")?;
    if p.handle_id.len() > MAX_HANDLE_ID_BYTES {
        return Err(RpcError::invalid_request(format!(
            "file handle ID must not exceed {MAX_HANDLE_ID_BYTES} bytes"
        )));
    }
    {
        let map = conn.files.map.lock().expect("handles lock");
        if map.contains_key(&p.handle_id) {
            return Err(RpcError::invalid_request(format!(
                "file handle `{}` already exists",
                p.handle_id
            )));
        }
        if map.len() >= MAX_HANDLES {
            return Err(RpcError::invalid_request(format!(
                "at most {MAX_HANDLES} file handles may be open per connection"
            )));
        }
    }
    if p.mode == Some(OpenMode::Replace) {
        return Err(RpcError::invalid_request(
            "fs/open mode `replace` is not supported by this exec-server (fileWriteStreaming is not advertised)",
        ));
    }
    let scope = super::fs_scope(p.sandbox.as_ref())?;
    let r: OpenResult = call(
        conn,
        m::FS_OPEN,
        &OpenParams {
            path: wire(&path),
            sandbox: scope.sandbox.clone(),
            cwd: scope.cwd.clone(),
        },
    )
    .await
    .map_err(|e| {
        if is_not_a_file(&e) {
            not_a_file(&path)
        } else {
            from_wire(&e)
        }
    })?;
    let passed = passed(conn, r.handle, &path).await;
    // Requests are handled one at a time: the id is still free.
    conn.files.map.lock().expect("handles lock").insert(
        p.handle_id.clone(),
        Opened {
            native: r.handle,
            passed,
        },
    );
    Ok(json!({"handleId": p.handle_id}))
}

#[derive(Deserialize)]
#[serde(
    expecting = "struct FsReadBlockParams",
    rename_all = "camelCase",
    deny_unknown_fields
)]
struct ReadBlockArgs {
    handle_id: String,
    offset: u64,
    len: u64,
}

/// `fs/readBlock`'s answer line to request `id`: the base64 of the data is
/// written straight from the agent's frames into the line (no JSON value
/// holds it).
pub async fn read_block(conn: &Conn, id: &Id, params: Value) -> Vec<u8> {
    let (p, opened) = match read_block_args(conn, params) {
        Ok(a) => a,
        Err(e) => return wire::response(id, Err(e)),
    };
    if let Some(file) = opened.passed {
        return read_passed(file, id.clone(), p).await;
    }
    match read_block_data(conn, opened.native, p).await {
        Ok((pieces, eof)) => wire::chunk_response(id, &pieces, eof),
        Err(e) => wire::response(id, Err(e)),
    }
}

/// `fs/readBlock`'s params, checked, and the handle they name.
fn read_block_args(conn: &Conn, params: Value) -> Result<(ReadBlockArgs, Opened), RpcError> {
    let p: ReadBlockArgs = decode(params)?;
    conn.ready("filesystem")?;
    if p.len == 0 || p.len > MAX_READ_BLOCK_BYTES {
        return Err(RpcError::invalid_request(format!(
            "file read block length must be between 1 and {MAX_READ_BLOCK_BYTES}"
        )));
    }
    let Some(opened) = conn
        .files
        .map
        .lock()
        .expect("handles lock")
        .get(&p.handle_id)
        .cloned()
    else {
        return Err(RpcError::new(
            code::NOT_FOUND,
            format!("unknown file handle `{}`", p.handle_id),
        ));
    };
    Ok((p, opened))
}

/// `fs/readBlock` through the passed file: read and encoded into the
/// answer line on a blocking thread (a slow disk stalls no task), into a
/// buffer that thread keeps (no fresh 1 MiB per block).
async fn read_passed(file: std::sync::Arc<Passed>, id: Id, p: ReadBlockArgs) -> Vec<u8> {
    thread_local! {
        static BLOCK: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let answering = id.clone();
    let work = move || {
        BLOCK.with_borrow_mut(|buf| {
            // At most MAX_READ_BLOCK_BYTES (checked): fits usize.
            match file.read(p.offset, p.len as usize, buf) {
                Ok(got) => wire::chunk_response_from(&id, &buf[..got], (got as u64) < p.len),
                Err(e) => wire::response(&id, Err(from_wire(&e))),
            }
        })
    };
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| {
        wire::response(
            &answering,
            Err(RpcError::internal(format!(
                "internal error (a bug): the block read failed: {e}"
            ))),
        )
    })
}

/// The data `fs/readBlock` answers with, as the agent's frames hold it,
/// and whether it ends the file.
async fn read_block_data(
    conn: &Conn,
    handle: u64,
    p: ReadBlockArgs,
) -> Result<(Vec<bytes::Bytes>, bool), RpcError> {
    let mut pieces = Vec::new();
    let mut got = 0u64;
    let mut block = p.len;
    while got < p.len {
        let want = block.min(p.len - got);
        let r = conn
            .native
            .read_block(&ReadBlockParams {
                handle,
                offset: p.offset.saturating_add(got),
                length: want,
                sandbox: None,
                cwd: None,
            })
            .await;
        match r {
            Ok((_, data)) => {
                let short = (data.len() as u64) < want;
                got += data.len() as u64;
                pieces.push(data);
                if short {
                    break;
                }
            }
            Err(e) => match lower_block(&e, want) {
                Some(b) => block = b,
                None => return Err(from_wire(&e)),
            },
        }
    }
    // End of file: the read came back short.
    Ok((pieces, got < p.len))
}

#[derive(Deserialize)]
#[serde(
    expecting = "struct FsCloseParams",
    rename_all = "camelCase",
    deny_unknown_fields
)]
struct CloseArgs {
    handle_id: String,
}

pub async fn close(conn: &Conn, params: Value) -> Result<Value, RpcError> {
    let p: CloseArgs = decode(params)?;
    conn.ready("filesystem")?;
    let handle = conn
        .files
        .map
        .lock()
        .expect("handles lock")
        .remove(&p.handle_id);
    if let Some(opened) = handle {
        close_native(conn, opened.native).await;
    }
    // Closing an unknown handle is not an error (as the reference).
    Ok(json!({}))
}

async fn close_native(conn: &Conn, handle: u64) {
    let r: Result<Empty, _> = call(
        conn,
        m::FS_CLOSE,
        &CloseParams {
            handle,
            sandbox: None,
            cwd: None,
        },
    )
    .await;
    if let Err(e) = r {
        tracing::debug!(error = %e, handle, "closing a native handle");
    }
}

/// Close every handle of the connection (it ended: the native session
/// may live on, detached, and its handles with it).
pub async fn close_all(conn: &Conn) {
    let all: Vec<u64> = conn
        .files
        .map
        .lock()
        .expect("handles lock")
        .drain()
        .map(|(_, h)| h.native)
        .collect();
    for h in all {
        close_native(conn, h).await;
    }
}

#[derive(Deserialize)]
#[serde(
    expecting = "struct WireFsCopyParams",
    rename_all = "camelCase",
    deny_unknown_fields
)]
struct CopyArgs {
    source_path: String,
    destination_path: String,
    recursive: bool,
    #[serde(default)]
    sandbox: Option<Value>,
}

pub async fn copy(conn: &Conn, params: Value) -> Result<Value, RpcError> {
    let p: CopyArgs = decode(params)?;
    let source = super::uri::to_path(&p.source_path)?;
    let destination = super::uri::to_path(&p.destination_path)?;
    conn.ready("filesystem")?;
    let scope = super::fs_scope(p.sandbox.as_ref())?;
    let r: Result<CopyResult, _> = call(
        conn,
        m::FS_COPY,
        &CopyParams {
            source: wire(&source),
            destination: wire(&destination),
            recursive: p.recursive,
            sandbox: scope.sandbox.clone(),
            cwd: scope.cwd.clone(),
        },
    )
    .await;
    match r {
        Ok(_) => Ok(json!({})),
        Err(e) if e.code == ErrorCode::InvalidParams => {
            let field = e.data_get("field").and_then(|v| v.as_str());
            Err(match field {
                Some("recursive") => RpcError::invalid_request(
                    "fs/copy requires recursive: true when sourcePath is a directory",
                ),
                Some("destination") => RpcError::invalid_request(
                    "fs/copy cannot copy a directory to itself or one of its descendants",
                ),
                Some("source") => RpcError::invalid_request(
                    "fs/copy only supports regular files, directories, and symlinks",
                ),
                _ => from_wire(&e),
            })
        }
        Err(e) => Err(from_wire(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A descriptor is read through only if it is the inode the host said
    /// it opened, a regular file, open for reading only; reads then give
    /// what `fs/readBlock` gives.
    #[test]
    fn a_passed_descriptor_is_checked_against_the_file_the_host_opened() {
        use executor_protocol::types::fs::PassDescriptorResult;
        use std::os::unix::fs::MetadataExt;
        let dir = std::env::temp_dir().join(format!("executor-passed-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (f, g) = (dir.join("f"), dir.join("g"));
        std::fs::write(&f, b"hello world").unwrap();
        std::fs::write(&g, b"other").unwrap();
        let id_of = |p: &Path| {
            let m = std::fs::metadata(p).unwrap();
            PassDescriptorResult {
                dev: m.dev(),
                ino: m.ino(),
            }
        };
        let open = |p: &Path| std::os::fd::OwnedFd::from(std::fs::File::open(p).unwrap());
        let passed = Passed::check(open(&f), id_of(&f), &f).unwrap();
        let mut buf = Vec::new();
        assert_eq!(passed.read(6, 100, &mut buf).unwrap(), 5);
        assert_eq!(&buf[..5], b"world");
        assert_eq!(passed.read(100, 10, &mut buf).unwrap(), 0);
        let e = Passed::check(open(&g), id_of(&f), &f).unwrap_err();
        assert!(e.contains("the host opened"), "{e}");
        let rw = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&f)
            .unwrap();
        let e = Passed::check(rw.into(), id_of(&f), &f).unwrap_err();
        assert!(e.contains("reading only"), "{e}");
        let e = Passed::check(open(&dir), id_of(&dir), &dir).unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn os_messages_and_millis() {
        assert_eq!(
            os_message("cannot open /x: y: Permission denied (os error 13)"),
            "Permission denied (os error 13)"
        );
        assert_eq!(os_message("something else"), "something else");
        assert_eq!(millis(-5), 0);
        assert_eq!(millis(1_796_316_300_918_123_456), 1_796_316_300_918);
    }

    #[test]
    fn not_a_file_is_a_directory_or_an_unopened_special_file() {
        assert!(is_not_a_file(&WireError::new(ErrorCode::IsADirectory, "d")));
        assert!(is_not_a_file(&WireError::new(
            ErrorCode::Io,
            "/dev/null is a device, not a file"
        )));
        assert!(!is_not_a_file(
            &WireError::new(ErrorCode::Io, "read").with("errno", 5)
        ));
        assert_eq!(
            os_error(libc::ENOENT),
            RpcError::new(-32004, "No such file or directory (os error 2)")
        );
        assert_eq!(
            os_error(libc::ELOOP),
            RpcError::new(-32603, "Symbolic link loop (os error 40)")
        );
    }
}
