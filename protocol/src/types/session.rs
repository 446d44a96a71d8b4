//! `initialize`, `environment/info`, `tools/list`, `$/cancel` (docs/PROTOCOL.md §2).

use crate::limits::Limits;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientInfo {
    pub name: String,
    pub version: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitializeParams {
    pub protocol_version: u32,
    pub client: ClientInfo,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionParams>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<ClientCapabilities>,
}

/// What the client can do beyond answering the agent's responses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ClientCapabilities {
    /// The client answers requests from the agent (`network/policyRequest`).
    #[serde(default)]
    pub agent_requests: bool,
    /// The client takes open files as descriptors (`fs/passDescriptor`):
    /// honoured only on a session host's own Unix socket (a stdio agent
    /// refuses an `initialize` that declares it).
    #[serde(default)]
    pub descriptors: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SessionParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<ResumeParams>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detach_ttl_ms: Option<u64>,
}

/// Never log this: `token` is a secret.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumeParams {
    pub session_id: String,
    pub token: String,
}

impl std::fmt::Debug for ResumeParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResumeParams")
            .field("session_id", &self.session_id)
            .field("token", &"<redacted>")
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentInfo {
    pub name: String,
    pub version: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    pub os: String,
    pub arch: String,
    pub hostname: String,
}

/// What this host can enforce of a `SandboxIntent`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxCapabilities {
    pub enforceable: bool,
    pub mechanisms: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub landlock_abi: Option<u32>,
    pub network_rules: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitializeResult {
    pub protocol_version: u32,
    pub agent: AgentInfo,
    pub session_id: String,
    /// Secret: never logged (see the `Debug` impl).
    pub resume_token: String,
    pub resumed: bool,
    pub methods: Vec<String>,
    pub limits: Limits,
    pub platform: Platform,
    pub sandbox: SandboxCapabilities,
}

impl std::fmt::Debug for InitializeResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InitializeResult")
            .field("protocol_version", &self.protocol_version)
            .field("agent", &self.agent)
            .field("session_id", &self.session_id)
            .field("resume_token", &"<redacted>")
            .field("resumed", &self.resumed)
            .field("methods", &self.methods)
            .field("limits", &self.limits)
            .field("platform", &self.platform)
            .field("sandbox", &self.sandbox)
            .finish()
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvironmentInfoParams {}

/// `tools/list` params: none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolsListParams {}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShellInfo {
    pub path: String,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvironmentInfo {
    pub os: String,
    pub arch: String,
    pub hostname: String,
    pub user: String,
    pub uid: u32,
    pub home: String,
    pub cwd: String,
    pub shell: ShellInfo,
    pub path_separator: String,
    pub agent_version: String,
    pub sandbox: SandboxCapabilities,
    /// The session's login-shell environment snapshot (`env_base: "login"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub login_env: Option<LoginEnvInfo>,
}

/// Whether this session took its login-shell environment snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LoginEnvInfo {
    /// A snapshot was taken (and is cached for the session).
    pub taken: bool,
    /// How long the login shell took, once it was run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Why the snapshot failed (then `env_base: "login"` is refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// A JSON Schema, as a MessagePack map.
    pub input_schema: rmpv::Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolsListResult {
    pub tools: Vec<ToolSpec>,
}

/// `$/cancel` params.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelParams {
    pub id: u64,
}
