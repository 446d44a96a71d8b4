//! Filesystem (docs/PROTOCOL.md §5). Every request takes an optional `sandbox`
//! and an optional absolute `cwd` (what `:cwd` means in that intent).

use super::sandbox::SandboxIntent;
use crate::path::WirePath;
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

/// Default `fs/walk` bounds.
pub const WALK_MAX_DEPTH: u32 = 64;
pub const WALK_MAX_DIRECTORIES: u64 = 10_000;

macro_rules! fs_params {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident : $t:ty,)* }) => {
        #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
        $(#[$m])*
        pub struct $name {
            $($(#[$fm])* pub $f: $t,)*
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub sandbox: Option<SandboxIntent>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub cwd: Option<WirePath>,
        }

        impl Scoped for $name {
            fn sandbox(&self) -> Option<&SandboxIntent> {
                self.sandbox.as_ref()
            }
            fn cwd(&self) -> Option<&WirePath> {
                self.cwd.as_ref()
            }
        }
    };
}

/// What every filesystem request carries besides its own fields: the
/// optional sandbox intent and the cwd that `:cwd` means in it.
pub trait Scoped {
    fn sandbox(&self) -> Option<&SandboxIntent>;
    fn cwd(&self) -> Option<&WirePath>;
}

fn yes() -> bool {
    true
}

crate::wire_enum! {
    pub enum FileKind {
        File = "file",
        Dir = "dir",
        Symlink = "symlink",
        Other = "other",
    }
}

fs_params! {
    pub struct StatParams {
        pub path: WirePath,
        #[serde(default = "yes")]
        pub follow_symlinks: bool,
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatResult {
    pub kind: FileKind,
    pub size: u64,
    pub mode: u32,
    pub mtime_ns: i64,
    pub uid: u32,
    pub gid: u32,
}

fs_params! {
    pub struct CanonicalizeParams {
        pub path: WirePath,
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathResult {
    pub path: WirePath,
}

fs_params! {
    pub struct ReadFileParams {
        pub path: WirePath,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub offset: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub length: Option<u64>,
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadFileResult {
    pub data: ByteBuf,
    pub size: u64,
}

fs_params! {
    /// Changes the host: an unknown key is an error naming it.
    #[serde(deny_unknown_fields)]
    pub struct WriteFileParams {
        pub path: WirePath,
        pub data: ByteBuf,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub mode: Option<u32>,
        #[serde(default)]
        pub create_parents: bool,
        #[serde(default = "yes")]
        pub atomic: bool,
    }
}

fs_params! {
    /// Changes the host: an unknown key is an error naming it.
    #[serde(deny_unknown_fields)]
    pub struct CreateDirectoryParams {
        pub path: WirePath,
        #[serde(default)]
        pub recursive: bool,
        /// The permission bits of the directory this request makes (exactly:
        /// the umask does not apply); absent: 0777 less the umask. An
        /// existing directory keeps its own.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub mode: Option<u32>,
    }
}

fs_params! {
    /// Changes the host: an unknown key is an error naming it.
    #[serde(deny_unknown_fields)]
    pub struct RemoveParams {
        pub path: WirePath,
        #[serde(default)]
        pub recursive: bool,
    }
}

fs_params! {
    /// Changes the host: an unknown key is an error naming it.
    #[serde(deny_unknown_fields)]
    pub struct RenameParams {
        pub from: WirePath,
        pub to: WirePath,
    }
}

fn d_depth() -> u32 {
    WALK_MAX_DEPTH
}
fn d_entries() -> u64 {
    crate::limits::MAX_WALK_ENTRIES
}
fn d_dirs() -> u64 {
    WALK_MAX_DIRECTORIES
}
fn d_bytes() -> u64 {
    crate::limits::MAX_WALK_RESPONSE_BYTES
}

fs_params! {
    pub struct WalkParams {
        pub root: WirePath,
        #[serde(default = "d_depth")]
        pub max_depth: u32,
        #[serde(default = "d_entries")]
        pub max_entries: u64,
        #[serde(default = "d_dirs")]
        pub max_directories: u64,
        #[serde(default = "d_bytes")]
        pub max_response_bytes: u64,
        #[serde(default = "yes")]
        pub include_hidden: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub cursor: Option<ByteBuf>,
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalkEntry {
    pub path: WirePath,
    pub kind: FileKind,
    pub size: u64,
    pub mtime_ns: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalkErrorEntry {
    pub path: WirePath,
    pub code: crate::error::ErrorCode,
    pub message: String,
}

crate::wire_enum! {
    pub enum TruncatedBy {
        MaxDepth = "max_depth",
        MaxEntries = "max_entries",
        MaxDirectories = "max_directories",
        MaxResponseBytes = "max_response_bytes",
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalkResult {
    pub entries: Vec<WalkEntry>,
    pub errors: Vec<WalkErrorEntry>,
    pub truncated: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated_by: Option<TruncatedBy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<ByteBuf>,
}

fs_params! {
    pub struct OpenParams {
        pub path: WirePath,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenResult {
    pub handle: u64,
    pub size: u64,
}

fs_params! {
    pub struct ReadBlockParams {
        pub handle: u64,
        pub offset: u64,
        pub length: u64,
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadBlockResult {
    pub data: ByteBuf,
    pub eof: bool,
}

fs_params! {
    /// `fs/passDescriptor`: the open file of read handle `handle`.
    #[serde(deny_unknown_fields)]
    pub struct PassDescriptorParams {
        pub handle: u64,
    }
}

/// `fs/passDescriptor`'s answer; the descriptor itself travels beside the
/// frame (`SCM_RIGHTS`, with its first byte). `dev` and `ino` name the
/// file the host opened: the receiver checks the descriptor it got is that
/// file before it reads through it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PassDescriptorResult {
    pub dev: u64,
    pub ino: u64,
}

fs_params! {
    /// `fs/readStream`: exactly one of `path` (resolved as `fs/open`
    /// resolves it) and `handle` (a read handle of `fs/open`).
    pub struct ReadStreamParams {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub path: Option<WirePath>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub handle: Option<u64>,
        #[serde(default)]
        pub offset: u64,
        /// Bytes to read at most; to the end of the file when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub length: Option<u64>,
        /// 1..=`max_block_bytes`.
        pub block_bytes: u64,
        /// The window: `block_bytes`..=`max_read_credit_bytes`.
        pub credit_bytes: u64,
    }
}

/// What `fs/readStream` answers; its blocks follow as notifications.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadStreamResult {
    pub stream_id: u64,
    /// The file's size when the stream started.
    pub size: u64,
}

/// `fs/readStream/data`: `data` is the file's bytes at `offset`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadStreamData {
    pub stream_id: u64,
    pub offset: u64,
    pub data: ByteBuf,
}

/// `fs/readStream/end`: the last message of a stream. `total` is the
/// number of data bytes sent; `error` says why it ended early.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadStreamEnd {
    pub stream_id: u64,
    pub total: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<crate::error::WireError>,
}

fs_params! {
    /// `fs/readCredit`: the client consumed `bytes` more of the stream.
    pub struct ReadCreditParams {
        pub stream_id: u64,
        pub bytes: u64,
    }
}

fs_params! {
    /// `fs/readCancel`: end the stream now (its end carries `cancelled`).
    pub struct ReadCancelParams {
        pub stream_id: u64,
    }
}

fs_params! {
    /// Changes the host: an unknown key is an error naming it.
    #[serde(deny_unknown_fields)]
    pub struct OpenWriteParams {
        pub path: WirePath,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub mode: Option<u32>,
        #[serde(default)]
        pub create_parents: bool,
        /// The committed file's modification time, ns since the epoch
        /// (absent: the time of the last write).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub mtime_ns: Option<i64>,
        /// The committed file's access time, ns since the epoch (absent:
        /// left as the kernel keeps it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub atime_ns: Option<i64>,
    }
}

fs_params! {
    /// `fs/readLink`: what a symlink holds (never followed).
    pub struct ReadLinkParams {
        pub path: WirePath,
    }
}

/// The answer of `fs/readLink`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadLinkResult {
    /// The link's bytes as stored (not resolved; may be relative).
    pub target: WirePath,
}

fs_params! {
    /// `fs/createSymlink`: a new symlink at `path` holding `target`.
    /// Changes the host: an unknown key is an error naming it.
    #[serde(deny_unknown_fields)]
    pub struct CreateSymlinkParams {
        pub path: WirePath,
        pub target: WirePath,
    }
}

fs_params! {
    /// `fs/copy`: a file, a symlink (copied as a link, never followed) or,
    /// with `recursive`, a directory tree. Changes the host: an unknown key
    /// is an error naming it.
    #[serde(deny_unknown_fields)]
    pub struct CopyParams {
        pub source: WirePath,
        pub destination: WirePath,
        #[serde(default)]
        pub recursive: bool,
    }
}

/// What `fs/copy` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CopyResult {
    /// Entries made at the destination (files, directories, symlinks).
    pub entries: u64,
    /// File bytes copied.
    pub bytes: u64,
    /// Special files (FIFOs, sockets, devices) left out of a tree.
    pub skipped: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandleResult {
    pub handle: u64,
}

fs_params! {
    /// Changes the host: an unknown key is an error naming it.
    #[serde(deny_unknown_fields)]
    pub struct WriteBlockParams {
        pub handle: u64,
        pub offset: u64,
        pub data: ByteBuf,
    }
}

fs_params! {
    /// `fs/commit`.
    /// Changes the host: an unknown key is an error naming it.
    #[serde(deny_unknown_fields)]
    pub struct CommitParams {
        pub handle: u64,
    }
}

fs_params! {
    /// `fs/close`.
    pub struct CloseParams {
        pub handle: u64,
    }
}

/// The params of `fs/commit` (and, with the same fields, `fs/close`), by
/// the name they had when both methods shared one type.
pub type HandleParams = CommitParams;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitResult {
    pub size: u64,
}
