//! Method names. The agent and the client use these constants, never literals.

pub const INITIALIZE: &str = "initialize";
pub const ENVIRONMENT_INFO: &str = "environment/info";
pub const TOOLS_LIST: &str = "tools/list";
pub const CANCEL: &str = "$/cancel";
pub const ERROR: &str = "$/error";

pub const PROCESS_START: &str = "process/start";
pub const PROCESS_READ: &str = "process/read";
pub const PROCESS_WRITE: &str = "process/write";
pub const PROCESS_SIGNAL: &str = "process/signal";
pub const PROCESS_RESIZE: &str = "process/resize";
pub const PROCESS_LIST: &str = "process/list";
pub const PROCESS_OUTPUT: &str = "process/output";
pub const PROCESS_EXITED: &str = "process/exited";
pub const PROCESS_LAGGED: &str = "process/lagged";

pub const EXEC_COMMAND: &str = "exec_command";
pub const WRITE_STDIN: &str = "write_stdin";

pub const FS_STAT: &str = "fs/stat";
pub const FS_CANONICALIZE: &str = "fs/canonicalize";
pub const FS_READ_FILE: &str = "fs/readFile";
pub const FS_WRITE_FILE: &str = "fs/writeFile";
pub const FS_CREATE_DIRECTORY: &str = "fs/createDirectory";
pub const FS_REMOVE: &str = "fs/remove";
pub const FS_RENAME: &str = "fs/rename";
pub const FS_WALK: &str = "fs/walk";
pub const FS_OPEN: &str = "fs/open";
pub const FS_READ_BLOCK: &str = "fs/readBlock";
pub const FS_OPEN_WRITE: &str = "fs/openWrite";
pub const FS_WRITE_BLOCK: &str = "fs/writeBlock";
/// Finishes a write (fsync, rename into place) and releases its temp file.
pub const FS_COMMIT: &str = "fs/commit";
/// Releases a handle: an uncommitted write's temp file is removed. Closing
/// a committed write handle answers `{}` (clients close in a `finally`;
/// both orders are safe); a second close of the same handle, or of one
/// never opened, is `unknown_handle`.
pub const FS_CLOSE: &str = "fs/close";

pub const HTTP_REQUEST: &str = "http/request";
pub const HTTP_CANCEL: &str = "http/cancel";
pub const HTTP_BODY_DELTA: &str = "http/request/bodyDelta";

/// The one request the agent sends (to clients that declared
/// `capabilities.agent_requests`): may a job reach this destination?
pub const NETWORK_POLICY_REQUEST: &str = "network/policyRequest";
/// Every egress decision of a job (notification).
pub const NETWORK_DECISION: &str = "network/decision";

/// Every request method of protocol v1 other than `initialize`.
pub const ALL_REQUESTS: &[&str] = &[
    ENVIRONMENT_INFO,
    TOOLS_LIST,
    PROCESS_START,
    PROCESS_READ,
    PROCESS_WRITE,
    PROCESS_SIGNAL,
    PROCESS_RESIZE,
    PROCESS_LIST,
    EXEC_COMMAND,
    WRITE_STDIN,
    FS_STAT,
    FS_CANONICALIZE,
    FS_READ_FILE,
    FS_WRITE_FILE,
    FS_CREATE_DIRECTORY,
    FS_REMOVE,
    FS_RENAME,
    FS_WALK,
    FS_OPEN,
    FS_READ_BLOCK,
    FS_OPEN_WRITE,
    FS_WRITE_BLOCK,
    FS_COMMIT,
    FS_CLOSE,
    HTTP_REQUEST,
    HTTP_CANCEL,
];
