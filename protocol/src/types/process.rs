//! Processes (docs/PROTOCOL.md §3).

use super::sandbox::SandboxIntent;
use crate::path::WirePath;
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PtySize {
    pub rows: u16,
    pub cols: u16,
}

impl Default for PtySize {
    fn default() -> Self {
        PtySize { rows: 24, cols: 80 }
    }
}

crate::wire_enum! {
    pub enum StdinMode {
        Pipe = "pipe",
        Null = "null",
    }
}

crate::wire_enum! {
    /// What a request's `env` is applied on top of (docs/PROTOCOL.md §3).
    pub enum EnvBase {
        /// Nothing: `env` is the complete environment (the default).
        None = "none",
        /// The agent's own environment.
        Agent = "agent",
        /// The user's login-shell environment, snapshot once per session.
        Login = "login",
    }
}

#[allow(clippy::derivable_impls)] // the variant lives in a macro
impl Default for EnvBase {
    fn default() -> Self {
        EnvBase::None
    }
}

impl EnvBase {
    /// `none` (skipped when serializing: the default).
    pub fn is_none(&self) -> bool {
        *self == EnvBase::None
    }
}

/// Never log `env` values: they may hold secrets.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessStartParams {
    pub argv: Vec<String>,
    pub cwd: WirePath,
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arg0: Option<String>,
    #[serde(default)]
    pub tty: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty_size: Option<PtySize>,
    #[serde(default)]
    pub stdin: StdinMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxIntent>,
    #[serde(default = "super::yes")]
    pub notify: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_buffer_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    #[serde(default, skip_serializing_if = "EnvBase::is_none")]
    pub env_base: EnvBase,
    /// A start retried with the same key in the same session (its answer
    /// lost with a connection) starts nothing and answers the first
    /// start's result; 1..=128 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The job's resource limits (docs/PROTOCOL.md §3.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<JobLimits>,
}

/// A job's resource limits: each optional; the profile's and the agent's
/// defaults fill in what a request leaves out, and a request may only
/// narrow the profile's (docs/PROTOCOL.md §3.1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobLimits {
    /// Memory of all the job's processes together (an OOM kill past it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// Processes (and threads) of the job at once: a fork past it fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<u64>,
    /// CPU time per second of wall time, in milliseconds (1000: one core).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_millis_per_sec: Option<u64>,
    /// A sandboxed job's `:tmp`: a tmpfs of its own of at most this many
    /// bytes (a write past it gets `ENOSPC`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tmp_bytes: Option<u64>,
    /// Default `true`: a limit of the request this host cannot enforce
    /// refuses the start (`sandbox_unavailable`); `false`: the job runs
    /// and `limits_degraded` says what was not enforced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required: Option<bool>,
}

/// What a job used (`process/exited`, `process/list`, `process/read`):
/// each part present where this host accounts for it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobUsage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_user_us: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_system_us: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_memory_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes_peak: Option<u64>,
    /// `process/list` of a running job: its memory and processes now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<u64>,
}

crate::wire_enum! {
    /// The limit a job ran into: `memory` (a process of it was OOM-killed),
    /// `processes` (a fork of it failed at the limit).
    pub enum LimitHit {
        Memory = "memory",
        Processes = "processes",
    }
}

impl std::fmt::Debug for ProcessStartParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessStartParams")
            .field("argv", &self.argv)
            .field("cwd", &self.cwd)
            .field("env_keys", &self.env.keys().collect::<Vec<_>>())
            .field("arg0", &self.arg0)
            .field("tty", &self.tty)
            .field("stdin", &self.stdin)
            .field("sandbox", &self.sandbox)
            .field("tag", &self.tag)
            .field("env_base", &self.env_base)
            .field("idempotency_key", &self.idempotency_key)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl ProcessStartParams {
    /// Params for `argv` in `cwd` with `env`, everything else default.
    pub fn new(argv: Vec<String>, cwd: impl Into<WirePath>, env: BTreeMap<String, String>) -> Self {
        ProcessStartParams {
            argv,
            cwd: cwd.into(),
            env,
            arg0: None,
            tty: false,
            pty_size: None,
            stdin: StdinMode::Pipe,
            sandbox: None,
            notify: true,
            output_buffer_bytes: None,
            tag: None,
            env_base: EnvBase::None,
            idempotency_key: None,
            limits: None,
        }
    }

    /// The same params with an idempotency key: retried with the same
    /// key in the same session, the start happens once.
    pub fn with_idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessStartResult {
    pub process_id: String,
    pub pid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_degraded: Option<Vec<String>>,
    /// With egress by name: where the job's proxy listens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::types::network::EgressInfo>,
    /// What of the job's limits is not enforced as asked (only with
    /// `limits.required: false`, or for the agent's own defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits_degraded: Option<Vec<String>>,
}

crate::wire_enum! {
    pub enum OutputStream {
        Stdout = "stdout",
        Stderr = "stderr",
        Pty = "pty",
    }
}

/// `process/output` notification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessOutput {
    pub process_id: String,
    pub seq: u64,
    pub stream: OutputStream,
    pub data: ByteBuf,
}

/// `process/exited` notification.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ProcessExited {
    pub process_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal_number: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_seq: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_denied: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<JobUsage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_hit: Option<LimitHit>,
}

/// `process/lagged` notification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessLagged {
    pub process_id: String,
    pub next_seq: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessReadParams {
    pub process_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_seq: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputChunk {
    pub seq: u64,
    pub stream: OutputStream,
    pub data: ByteBuf,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ExitInfo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<JobUsage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_hit: Option<LimitHit>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessReadResult {
    pub chunks: Vec<OutputChunk>,
    pub next_seq: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exited: Option<ExitInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropped_before: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessWriteParams {
    pub process_id: String,
    pub data: ByteBuf,
    #[serde(default)]
    pub close_stdin: bool,
    /// A write whose id this process already had answers as that write
    /// did, writing nothing; 1..=128 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_id: Option<String>,
}

crate::wire_enum! {
    /// The nine signal names of `process/signal`.
    pub enum SignalName {
        Interrupt = "interrupt",
        Terminate = "terminate",
        Kill = "kill",
        Hangup = "hangup",
        Quit = "quit",
        User1 = "user1",
        User2 = "user2",
        Continue = "continue",
        Stop = "stop",
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessSignalParams {
    pub process_id: String,
    pub signal: SignalName,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessResizeParams {
    pub process_id: String,
    pub rows: u16,
    pub cols: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    pub process_id: String,
    pub pid: u32,
    pub argv: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    pub running: bool,
    /// Its account: now while it runs, final once it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<JobUsage>,
}

/// `process/list` params: none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessListParams {}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessListResult {
    pub processes: Vec<ProcessInfo>,
}

#[allow(clippy::derivable_impls)] // the variant lives in a macro
impl Default for StdinMode {
    fn default() -> Self {
        StdinMode::Pipe
    }
}
