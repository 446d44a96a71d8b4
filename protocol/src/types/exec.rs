//! The unified-exec tool contract (docs/PROTOCOL.md §4).

use super::sandbox::SandboxIntent;
use crate::path::WirePath;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Default `yield_time_ms` when absent (PROTOCOL.md is silent).
pub const DEFAULT_YIELD_TIME_MS: u64 = 10_000;
/// Default `max_output_tokens` when absent (PROTOCOL.md is silent).
pub const DEFAULT_MAX_OUTPUT_TOKENS: u64 = 10_000;
/// One token is counted as this many bytes of output.
pub const BYTES_PER_TOKEN: u64 = 4;

fn default_yield() -> u64 {
    DEFAULT_YIELD_TIME_MS
}
fn default_tokens() -> u64 {
    DEFAULT_MAX_OUTPUT_TOKENS
}

#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecCommandParams {
    pub command: Vec<String>,
    pub cwd: WirePath,
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub tty: bool,
    #[serde(default = "default_yield")]
    pub yield_time_ms: u64,
    #[serde(default = "default_tokens")]
    pub max_output_tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_permissions: Option<SandboxIntent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub additional_permissions: Option<SandboxIntent>,
    #[serde(default)]
    pub additional_permissions_preapproved: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub justification: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec_approval_requirement: Option<rmpv::Value>,
    /// What `env` is applied on top of (as in `process/start`).
    #[serde(default, skip_serializing_if = "super::process::EnvBase::is_none")]
    pub env_base: super::process::EnvBase,
    /// The job's resource limits (as in `process/start`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<super::process::JobLimits>,
}

impl std::fmt::Debug for ExecCommandParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecCommandParams")
            .field("command", &self.command)
            .field("cwd", &self.cwd)
            .field("env_keys", &self.env.keys().collect::<Vec<_>>())
            .field("tty", &self.tty)
            .field("yield_time_ms", &self.yield_time_ms)
            .field("max_output_tokens", &self.max_output_tokens)
            .field("env_base", &self.env_base)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteStdinParams {
    pub process_id: String,
    #[serde(default)]
    pub input: String,
    #[serde(default = "default_yield")]
    pub yield_time_ms: u64,
    #[serde(default = "default_tokens")]
    pub max_output_tokens: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ExecResult {
    pub output: String,
    pub original_token_count: u64,
    pub truncated: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_id: Option<String>,
    pub wall_time_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_denied: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_degraded: Option<Vec<String>>,
    /// With egress by name: where the job's proxy listens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::types::network::EgressInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits_degraded: Option<Vec<String>>,
    /// When the command ended within the call: its account, and the limit
    /// it ran into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<super::process::JobUsage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_hit: Option<super::process::LimitHit>,
}
