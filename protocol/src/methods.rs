//! The method table, written once below (`method_table!`): from it come
//! the method-name constants (the agent and the client use these, never
//! literals), [`ALL_REQUESTS`], [`validate_params`], and an
//! `impl Request for XParams` (the method a params type is sent with, and
//! the type of its result) for every request, and an
//! `impl Notification` for every notification.
//!
//! Adding a method is one line here, its types in [`crate::types`], its
//! handler in the agent's dispatch table, and its section in
//! docs/PROTOCOL.md (a test checks each).

use crate::error::WireError;
use crate::message::from_params;
use crate::types::{exec, fs, http, network, process, session, Empty};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// A request's params type: the method it is sent with and what it
/// answers. `client.call(&params)` sends it and decodes the answer.
pub trait Request: Serialize + DeserializeOwned {
    /// The method name.
    const METHOD: &'static str;
    /// What a successful answer decodes into.
    type Result: Serialize + DeserializeOwned;
}

/// A notification's params type and the method it is sent with.
pub trait Notification: Serialize + DeserializeOwned {
    /// The method name.
    const METHOD: &'static str;
}

macro_rules! method_table {
    (
        initialize { $(#[$idoc:meta])* $iconst:ident = $iname:literal, $iparams:ty => $iresult:ty; }
        requests { $($(#[$doc:meta])* $konst:ident = $name:literal, $params:ty => $result:ty;)* }
        client_notifications { $($(#[$cdoc:meta])* $cconst:ident = $cname:literal, $cparams:ty;)* }
        agent_notifications { $($(#[$adoc:meta])* $aconst:ident = $aname:literal, $aparams:ty;)* }
        agent_requests { $($(#[$rdoc:meta])* $rconst:ident = $rname:literal, $rparams:ty => $rresult:ty;)* }
    ) => {
        $(#[$idoc])* pub const $iconst: &str = $iname;
        $($(#[$doc])* pub const $konst: &str = $name;)*
        $($(#[$cdoc])* pub const $cconst: &str = $cname;)*
        $($(#[$adoc])* pub const $aconst: &str = $aname;)*
        $($(#[$rdoc])* pub const $rconst: &str = $rname;)*

        /// Every request the agent sends to a client (only to clients that
        /// declared `capabilities.agent_requests`).
        pub const ALL_AGENT_REQUESTS: &[&str] = &[$($rconst),*];
        $(impl Request for $rparams {
            const METHOD: &'static str = $rconst;
            type Result = $rresult;
        })*

        /// Every request method of protocol v1 other than `initialize`.
        pub const ALL_REQUESTS: &[&str] = &[$($konst),*];

        /// Every notification method, both directions.
        pub const ALL_NOTIFICATIONS: &[&str] = &[$($cconst,)* $($aconst),*];

        impl Request for $iparams {
            const METHOD: &'static str = $iconst;
            type Result = $iresult;
        }
        $(impl Request for $params {
            const METHOD: &'static str = $konst;
            type Result = $result;
        })*
        $(impl Notification for $cparams {
            const METHOD: &'static str = $cconst;
        })*
        $(impl Notification for $aparams {
            const METHOD: &'static str = $aconst;
        })*

        /// Decode `params` into the type of `method` (a request, or a
        /// notification a client sends), discarding the value: used by the
        /// fuzzers and by tests to check that every method's params parse.
        pub fn validate_params(method: &str, params: rmpv::Value) -> Result<(), WireError> {
            fn v<T: DeserializeOwned>(p: rmpv::Value) -> Result<(), WireError> {
                from_params::<T>(p).map(|_| ())
            }
            match method {
                $iconst => v::<$iparams>(params),
                $($konst => v::<$params>(params),)*
                $($cconst => v::<$cparams>(params),)*
                other => Err(WireError::method_not_found(other)),
            }
        }
    };
}

method_table! {
    initialize {
        INITIALIZE = "initialize", session::InitializeParams => session::InitializeResult;
    }
    requests {
    ENVIRONMENT_INFO = "environment/info", session::EnvironmentInfoParams => session::EnvironmentInfo;
    TOOLS_LIST = "tools/list", session::ToolsListParams => session::ToolsListResult;
    PROCESS_START = "process/start", process::ProcessStartParams => process::ProcessStartResult;
    PROCESS_READ = "process/read", process::ProcessReadParams => process::ProcessReadResult;
    PROCESS_WRITE = "process/write", process::ProcessWriteParams => Empty;
    PROCESS_SIGNAL = "process/signal", process::ProcessSignalParams => Empty;
    PROCESS_RESIZE = "process/resize", process::ProcessResizeParams => Empty;
    PROCESS_LIST = "process/list", process::ProcessListParams => process::ProcessListResult;
    EXEC_COMMAND = "exec_command", exec::ExecCommandParams => exec::ExecResult;
    WRITE_STDIN = "write_stdin", exec::WriteStdinParams => exec::ExecResult;
    FS_STAT = "fs/stat", fs::StatParams => fs::StatResult;
    FS_CANONICALIZE = "fs/canonicalize", fs::CanonicalizeParams => fs::PathResult;
    FS_READ_FILE = "fs/readFile", fs::ReadFileParams => fs::ReadFileResult;
    FS_WRITE_FILE = "fs/writeFile", fs::WriteFileParams => Empty;
    FS_CREATE_DIRECTORY = "fs/createDirectory", fs::CreateDirectoryParams => Empty;
    FS_REMOVE = "fs/remove", fs::RemoveParams => Empty;
    FS_RENAME = "fs/rename", fs::RenameParams => Empty;
    FS_WALK = "fs/walk", fs::WalkParams => fs::WalkResult;
    /// What a symlink holds, the link itself never followed.
    FS_READ_LINK = "fs/readLink", fs::ReadLinkParams => fs::ReadLinkResult;
    /// A new symlink; an existing entry at `path` is `already_exists`.
    FS_CREATE_SYMLINK = "fs/createSymlink", fs::CreateSymlinkParams => Empty;
    FS_OPEN = "fs/open", fs::OpenParams => fs::OpenResult;
    FS_READ_BLOCK = "fs/readBlock", fs::ReadBlockParams => fs::ReadBlockResult;
    /// One request for a whole file: the agent pushes its blocks
    /// (`fs/readStream/data`) within a credit the client returns.
    FS_READ_STREAM = "fs/readStream", fs::ReadStreamParams => fs::ReadStreamResult;
    /// Returns consumed bytes to a read stream's window.
    FS_READ_CREDIT = "fs/readCredit", fs::ReadCreditParams => Empty;
    /// Ends a read stream early.
    FS_READ_CANCEL = "fs/readCancel", fs::ReadCancelParams => Empty;
    FS_OPEN_WRITE = "fs/openWrite", fs::OpenWriteParams => fs::HandleResult;
    FS_WRITE_BLOCK = "fs/writeBlock", fs::WriteBlockParams => Empty;
    /// Finishes a write (fsync, rename into place) and releases its temp file.
    FS_COMMIT = "fs/commit", fs::CommitParams => fs::CommitResult;
    /// Releases a handle: an uncommitted write's temp file is removed. Closing
    /// a committed write handle answers `{}` (clients close in a `finally`;
    /// both orders are safe); a second close of the same handle, or of one
    /// never opened, is `unknown_handle`.
    FS_CLOSE = "fs/close", fs::CloseParams => Empty;
    HTTP_REQUEST = "http/request", http::HttpRequestParams => http::HttpRequestResult;
    HTTP_CANCEL = "http/cancel", http::HttpCancelParams => Empty;
    }
    client_notifications {
        CANCEL = "$/cancel", session::CancelParams;
    }
    agent_notifications {
    ERROR = "$/error", WireError;
    PROCESS_OUTPUT = "process/output", process::ProcessOutput;
    PROCESS_EXITED = "process/exited", process::ProcessExited;
    PROCESS_LAGGED = "process/lagged", process::ProcessLagged;
    HTTP_BODY_DELTA = "http/request/bodyDelta", http::BodyDelta;
    /// A block of a read stream (data last, sent by reference).
    FS_READ_STREAM_DATA = "fs/readStream/data", fs::ReadStreamData;
    /// The last message of a read stream.
    FS_READ_STREAM_END = "fs/readStream/end", fs::ReadStreamEnd;
    /// Every egress decision of a job.
    NETWORK_DECISION = "network/decision", network::NetworkDecision;
    }
    agent_requests {
    /// May a job reach this destination? (`ask: true`, docs/PROTOCOL.md §8)
    NETWORK_POLICY_REQUEST = "network/policyRequest", network::PolicyRequestParams => network::PolicyRequestResult;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_name_is_listed_once() {
        let mut all: Vec<&str> = std::iter::once(INITIALIZE)
            .chain(ALL_REQUESTS.iter().copied())
            .chain(ALL_NOTIFICATIONS.iter().copied())
            .chain(ALL_AGENT_REQUESTS.iter().copied())
            .collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n);
        assert_eq!(ALL_REQUESTS.len(), 31);
    }

    #[test]
    fn a_params_type_names_its_method() {
        assert_eq!(<fs::StatParams as Request>::METHOD, "fs/stat");
        assert_eq!(<fs::CloseParams as Request>::METHOD, FS_CLOSE);
        assert_eq!(<fs::CommitParams as Request>::METHOD, FS_COMMIT);
        assert_eq!(
            <process::ProcessExited as Notification>::METHOD,
            PROCESS_EXITED
        );
        assert!(validate_params(FS_STAT, rmpv::Value::Map(vec![])).is_err());
        assert!(validate_params("fs/nope", rmpv::Value::Map(vec![])).is_err());
        assert!(validate_params(TOOLS_LIST, rmpv::Value::Map(vec![])).is_ok());
    }
}
