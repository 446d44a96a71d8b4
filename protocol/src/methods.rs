//! The method table, written once below (`method_table!`): from it come
//! the method-name constants (the agent and the client use these, never
//! literals), [`ALL_REQUESTS`], [`validate_params`], every request's
//! [`Facts`] ([`facts`], [`REQUEST_FACTS`]: whether it changes the host,
//! spawns, reaches the network, takes a sandbox intent, is answered before
//! `initialize`), and an `impl Request for XParams` (the method a params
//! type is sent with, and the type of its result) for every request, and
//! an `impl Notification` for every notification.
//!
//! Every per-method fact the agent acts on lives here: its `read_only`
//! profiles allow exactly the methods whose facts are
//! [`Facts::is_read_only`], its audit log and `executor --list-methods`
//! read the facts, and a request line without them does not compile.
//!
//! Adding a method is one line here (with its facts), its types in
//! [`crate::types`], its handler in the agent's dispatch table, and its
//! section in docs/PROTOCOL.md (a test checks each).

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

/// What a request does to the host, as the agent's policy and audit see
/// it. Read-only ([`Facts::is_read_only`]) means: changes nothing on the
/// host, starts nothing, reaches no network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// Changes files or state on the host: writes, creates, removes,
    /// renames or links an entry, or acts on a running job (its input,
    /// its signals, its terminal).
    pub changes_host: bool,
    /// Starts a process (which may do anything its sandbox allows).
    pub spawns: bool,
    /// Reaches the network.
    pub network: bool,
    /// The params field holding a sandbox intent the agent resolves for
    /// this request (`sandbox`, `sandbox_permissions`), if any.
    pub intent: Option<&'static str>,
    /// Answered before `initialize` (every other request is
    /// `not_initialized` until then).
    pub before_initialize: bool,
    /// The methods this one does the work of under another name
    /// (`exec_command` starts a job as `process/start` does): a profile
    /// rule denying one of them denies this one too.
    pub aliases: &'static [&'static str],
    /// Once begun, its work runs to its end (a filesystem call on a
    /// blocking thread, which nothing can stop): `$/cancel` does not cut
    /// its answer short, which says what was done.
    pub runs_to_end: bool,
}

impl Facts {
    /// Changes nothing on the host, starts nothing, reaches no network:
    /// what a `read_only` profile allows.
    pub const fn is_read_only(&self) -> bool {
        !self.changes_host && !self.spawns && !self.network
    }

    /// The same facts, with a sandbox intent in `field`.
    pub const fn with_intent(self, field: &'static str) -> Facts {
        Facts {
            intent: Some(field),
            ..self
        }
    }

    /// The same facts, doing the work of `methods` under another name.
    pub const fn alias_of(self, methods: &'static [&'static str]) -> Facts {
        Facts {
            aliases: methods,
            ..self
        }
    }

    /// The facts as `executor --list-methods` prints them:
    /// `read-only` or the effects (`changes-host`, `spawns`, `network`),
    /// then `intent=FIELD` and `before-initialize` where they apply.
    pub fn describe(&self) -> String {
        let mut words: Vec<String> = Vec::new();
        if self.is_read_only() {
            words.push("read-only".into());
        }
        for (on, word) in [
            (self.changes_host, "changes-host"),
            (self.spawns, "spawns"),
            (self.network, "network"),
            (self.before_initialize, "before-initialize"),
        ] {
            if on {
                words.push(word.into());
            }
        }
        if let Some(field) = self.intent {
            words.push(format!("intent={field}"));
        }
        if self.runs_to_end {
            words.push("runs-to-end".into());
        }
        for m in self.aliases {
            words.push(format!("alias-of={m}"));
        }
        words.join(",")
    }
}

/// Reads (or acts only on what the session itself holds: a read handle,
/// a read stream, an HTTP stream's cancellation).
const READS: Facts = Facts {
    changes_host: false,
    spawns: false,
    network: false,
    intent: None,
    before_initialize: false,
    aliases: &[],
    runs_to_end: false,
};
/// Changes the host.
const WRITES: Facts = Facts {
    changes_host: true,
    ..READS
};
/// Changes files on the host, on a blocking thread: runs to its end.
const FS_WRITES: Facts = Facts {
    runs_to_end: true,
    ..WRITES
};
/// Starts a process: changes the host (the job may).
const SPAWNS: Facts = Facts {
    changes_host: true,
    spawns: true,
    ..READS
};
/// Reaches the network (and whatever listens there: a POST may change a
/// local service).
const NETWORK: Facts = Facts {
    network: true,
    ..READS
};

macro_rules! method_table {
    (
        initialize { $(#[$idoc:meta])* $iconst:ident = $iname:literal, $iparams:ty => $iresult:ty, $ifacts:expr; }
        requests { $($(#[$doc:meta])* $konst:ident = $name:literal, $params:ty => $result:ty, $facts:expr;)* }
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

        /// Every request of [`ALL_REQUESTS`] with its facts, in the same
        /// order.
        pub const REQUEST_FACTS: &[(&str, Facts)] = &[$(($konst, $facts)),*];

        /// The facts of a request method (`initialize` included); `None`
        /// for a name outside the table.
        pub fn facts(method: &str) -> Option<Facts> {
            match method {
                $iconst => Some($ifacts),
                $($konst => Some($facts),)*
                _ => None,
            }
        }

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
        INITIALIZE = "initialize", session::InitializeParams => session::InitializeResult, Facts {
            before_initialize: true,
            ..READS
        };
    }
    requests {
    ENVIRONMENT_INFO = "environment/info", session::EnvironmentInfoParams => session::EnvironmentInfo, READS;
    TOOLS_LIST = "tools/list", session::ToolsListParams => session::ToolsListResult, READS;
    PROCESS_START = "process/start", process::ProcessStartParams => process::ProcessStartResult, SPAWNS.with_intent("sandbox");
    PROCESS_READ = "process/read", process::ProcessReadParams => process::ProcessReadResult, READS;
    PROCESS_WRITE = "process/write", process::ProcessWriteParams => Empty, WRITES;
    PROCESS_SIGNAL = "process/signal", process::ProcessSignalParams => Empty, WRITES;
    PROCESS_RESIZE = "process/resize", process::ProcessResizeParams => Empty, WRITES;
    PROCESS_LIST = "process/list", process::ProcessListParams => process::ProcessListResult, READS;
    EXEC_COMMAND = "exec_command", exec::ExecCommandParams => exec::ExecResult, SPAWNS.with_intent("sandbox_permissions").alias_of(&[PROCESS_START]);
    WRITE_STDIN = "write_stdin", exec::WriteStdinParams => exec::ExecResult, WRITES.alias_of(&[PROCESS_WRITE]);
    FS_STAT = "fs/stat", fs::StatParams => fs::StatResult, READS.with_intent("sandbox");
    FS_CANONICALIZE = "fs/canonicalize", fs::CanonicalizeParams => fs::PathResult, READS.with_intent("sandbox");
    FS_READ_FILE = "fs/readFile", fs::ReadFileParams => fs::ReadFileResult, READS.with_intent("sandbox");
    FS_WRITE_FILE = "fs/writeFile", fs::WriteFileParams => Empty, FS_WRITES.with_intent("sandbox");
    FS_CREATE_DIRECTORY = "fs/createDirectory", fs::CreateDirectoryParams => Empty, FS_WRITES.with_intent("sandbox");
    FS_REMOVE = "fs/remove", fs::RemoveParams => Empty, FS_WRITES.with_intent("sandbox");
    FS_RENAME = "fs/rename", fs::RenameParams => Empty, FS_WRITES.with_intent("sandbox");
    FS_WALK = "fs/walk", fs::WalkParams => fs::WalkResult, READS.with_intent("sandbox");
    /// What a symlink holds, the link itself never followed.
    FS_READ_LINK = "fs/readLink", fs::ReadLinkParams => fs::ReadLinkResult, READS.with_intent("sandbox");
    /// A new symlink; an existing entry at `path` is `already_exists`.
    FS_CREATE_SYMLINK = "fs/createSymlink", fs::CreateSymlinkParams => Empty, FS_WRITES.with_intent("sandbox");
    /// A file, a symlink or (`recursive`) a tree, copied beneath the
    /// destination by descriptor; never follows a symlink.
    FS_COPY = "fs/copy", fs::CopyParams => fs::CopyResult, FS_WRITES.with_intent("sandbox");
    FS_OPEN = "fs/open", fs::OpenParams => fs::OpenResult, READS.with_intent("sandbox");
    FS_READ_BLOCK = "fs/readBlock", fs::ReadBlockParams => fs::ReadBlockResult, READS;
    /// A read handle's open file itself, passed with the answer
    /// (`SCM_RIGHTS`) to a client on the session host's own socket that
    /// declared `capabilities.descriptors`: its reads then need no
    /// `fs/readBlock`, which a rule denying it denies this one too.
    FS_PASS_DESCRIPTOR = "fs/passDescriptor", fs::PassDescriptorParams => fs::PassDescriptorResult, READS.alias_of(&[FS_READ_BLOCK]);
    /// One request for a whole file: the agent pushes its blocks
    /// (`fs/readStream/data`) within a credit the client returns.
    FS_READ_STREAM = "fs/readStream", fs::ReadStreamParams => fs::ReadStreamResult, READS.with_intent("sandbox");
    /// Returns consumed bytes to a read stream's window.
    FS_READ_CREDIT = "fs/readCredit", fs::ReadCreditParams => Empty, READS;
    /// Ends a read stream early.
    FS_READ_CANCEL = "fs/readCancel", fs::ReadCancelParams => Empty, READS;
    FS_OPEN_WRITE = "fs/openWrite", fs::OpenWriteParams => fs::HandleResult, FS_WRITES.with_intent("sandbox");
    FS_WRITE_BLOCK = "fs/writeBlock", fs::WriteBlockParams => Empty, FS_WRITES;
    /// Finishes a write (fsync, rename into place) and releases its temp file.
    FS_COMMIT = "fs/commit", fs::CommitParams => fs::CommitResult, FS_WRITES;
    /// Releases a handle: an uncommitted write's temp file is removed. Closing
    /// a committed write handle answers `{}` (clients close in a `finally`;
    /// both orders are safe); a second close of the same handle, or of one
    /// never opened, is `unknown_handle`.
    FS_CLOSE = "fs/close", fs::CloseParams => Empty, READS;
    HTTP_REQUEST = "http/request", http::HttpRequestParams => http::HttpRequestResult, NETWORK.with_intent("sandbox");
    HTTP_CANCEL = "http/cancel", http::HttpCancelParams => Empty, READS;
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
        assert_eq!(ALL_REQUESTS.len(), 33);
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

/// The classification, checked against what each method is known to do
/// (a method added without a line here fails).
#[cfg(test)]
mod facts_tests {
    use super::*;

    #[test]
    fn every_request_has_facts_and_only_reads_are_read_only() {
        assert_eq!(REQUEST_FACTS.len(), ALL_REQUESTS.len());
        for (i, m) in ALL_REQUESTS.iter().enumerate() {
            assert_eq!(REQUEST_FACTS[i].0, *m);
            let f = facts(m).unwrap_or_else(|| panic!("{m} has no facts"));
            let read_only = match *m {
                ENVIRONMENT_INFO | TOOLS_LIST | PROCESS_READ | PROCESS_LIST | FS_STAT
                | FS_CANONICALIZE | FS_READ_FILE | FS_WALK | FS_READ_LINK | FS_OPEN
                | FS_READ_BLOCK | FS_PASS_DESCRIPTOR | FS_READ_STREAM | FS_READ_CREDIT
                | FS_READ_CANCEL | FS_CLOSE | HTTP_CANCEL => true,
                PROCESS_START | PROCESS_WRITE | PROCESS_SIGNAL | PROCESS_RESIZE | EXEC_COMMAND
                | WRITE_STDIN | FS_WRITE_FILE | FS_CREATE_DIRECTORY | FS_REMOVE | FS_RENAME
                | FS_CREATE_SYMLINK | FS_COPY | FS_OPEN_WRITE | FS_WRITE_BLOCK | FS_COMMIT
                | HTTP_REQUEST => false,
                other => panic!("{other} is not classified in this test"),
            };
            assert_eq!(f.is_read_only(), read_only, "{m}: {f:?}");
            assert!(!f.before_initialize, "{m}");
        }
        assert!(facts(INITIALIZE).unwrap().before_initialize);
        assert_eq!(facts("fs/nope"), None);
        let spawns: Vec<&str> = REQUEST_FACTS
            .iter()
            .filter(|(_, f)| f.spawns)
            .map(|(m, _)| *m)
            .collect();
        assert_eq!(spawns, [PROCESS_START, EXEC_COMMAND]);
        assert_eq!(
            facts(HTTP_REQUEST).unwrap().describe(),
            "network,intent=sandbox"
        );
        assert_eq!(
            facts(FS_CREATE_SYMLINK).unwrap().describe(),
            "changes-host,intent=sandbox,runs-to-end"
        );
        assert_eq!(facts(FS_READ_BLOCK).unwrap().describe(), "read-only");
        // What runs on a blocking thread and changes the host runs to its
        // end; a job's input (which may wait on a full pipe) does not.
        for (m, f) in REQUEST_FACTS {
            let fs_write = m.starts_with("fs/") && f.changes_host;
            assert_eq!(f.runs_to_end, fs_write, "{m}");
        }
    }
}

/// Unknown keys: refused, naming the key, in every request the table does
/// not mark read-only and in `fs/passDescriptor`; ignored in the other
/// read-only ones (docs/PROTOCOL.md §1).
#[cfg(test)]
mod unknown_key_tests {
    use super::*;
    use rmpv::Value;

    fn map(entries: &[(&str, Value)]) -> Value {
        Value::Map(
            entries
                .iter()
                .map(|(k, v)| (Value::from(*k), v.clone()))
                .collect(),
        )
    }

    /// Valid params for every request (a new method must be given some).
    fn sample(method: &str) -> Value {
        let path = || ("path", Value::from("/tmp/x"));
        let pid = || ("process_id", Value::from("p-1"));
        let handle = || ("handle", Value::from(1));
        let stream = || ("stream_id", Value::from(1));
        let argv = Value::Array(vec!["true".into()]);
        match method {
            ENVIRONMENT_INFO | TOOLS_LIST | PROCESS_LIST => map(&[]),
            PROCESS_START => map(&[("argv", argv), ("cwd", "/".into()), ("env", map(&[]))]),
            EXEC_COMMAND => map(&[("command", argv), ("cwd", "/".into()), ("env", map(&[]))]),
            PROCESS_READ | WRITE_STDIN => map(&[pid()]),
            PROCESS_WRITE => map(&[pid(), ("data", Value::Binary(vec![]))]),
            PROCESS_SIGNAL => map(&[pid(), ("signal", "kill".into())]),
            PROCESS_RESIZE => map(&[pid(), ("rows", 1.into()), ("cols", 1.into())]),
            FS_STAT | FS_CANONICALIZE | FS_READ_FILE | FS_CREATE_DIRECTORY | FS_REMOVE
            | FS_READ_LINK | FS_OPEN | FS_OPEN_WRITE => map(&[path()]),
            FS_READ_STREAM => map(&[
                path(),
                ("block_bytes", 4096.into()),
                ("credit_bytes", 65536.into()),
            ]),
            FS_WRITE_FILE => map(&[path(), ("data", Value::Binary(vec![]))]),
            FS_RENAME => map(&[("from", "/a".into()), ("to", "/b".into())]),
            FS_COPY => map(&[("source", "/a".into()), ("destination", "/b".into())]),
            FS_WALK => map(&[("root", "/".into())]),
            FS_CREATE_SYMLINK => map(&[path(), ("target", "/etc".into())]),
            FS_READ_BLOCK => map(&[handle(), ("offset", 0.into()), ("length", 1.into())]),
            FS_WRITE_BLOCK => map(&[
                handle(),
                ("offset", 0.into()),
                ("data", Value::Binary(vec![])),
            ]),
            FS_COMMIT | FS_CLOSE | FS_PASS_DESCRIPTOR => map(&[handle()]),
            FS_READ_CREDIT => map(&[stream(), ("bytes", 1.into())]),
            FS_READ_CANCEL | HTTP_CANCEL => map(&[stream()]),
            HTTP_REQUEST => map(&[("method", "GET".into()), ("url", "http://h/".into())]),
            other => panic!("no sample params for {other}"),
        }
    }

    fn with(v: Value, key: &str) -> Value {
        let Value::Map(mut e) = v else { unreachable!() };
        e.push((key.into(), 1.into()));
        Value::Map(e)
    }

    #[test]
    fn requests_that_act_refuse_unknown_keys_naming_them() {
        for (method, f) in REQUEST_FACTS {
            validate_params(method, sample(method)).unwrap_or_else(|e| panic!("{method}: {e}"));
            for key in ["zz_unknown", "Argv"] {
                let got = validate_params(method, with(sample(method), key));
                // A descriptor hand-over refuses what it does not know,
                // read-only as it is.
                if f.is_read_only() && *method != FS_PASS_DESCRIPTOR {
                    got.unwrap_or_else(|e| panic!("{method} (read-only) refused {key}: {e}"));
                } else {
                    let e = got.expect_err(method);
                    assert_eq!(e.code, crate::ErrorCode::InvalidParams, "{method}");
                    assert_eq!(
                        e.data_get("field").and_then(|v| v.as_str()),
                        Some(key),
                        "{method}: {e:?}"
                    );
                    assert!(e.message.contains(key), "{method}: {}", e.message);
                }
            }
        }
        // Nested: a terminal size with an extra key.
        let mut p = sample(PROCESS_START);
        if let Value::Map(e) = &mut p {
            e.push((
                "pty_size".into(),
                map(&[("rows", 1.into()), ("cols", 1.into()), ("depth", 1.into())]),
            ));
        }
        let e = validate_params(PROCESS_START, p).unwrap_err();
        assert_eq!(
            e.data_get("field").and_then(|v| v.as_str()),
            Some("pty_size.depth"),
            "{e:?}"
        );
    }
}
