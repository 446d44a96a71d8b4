//! Session state: `initialize`, `environment/info`, and the end of a session.

use crate::audit::Audit;
use crate::config::Profile;
use crate::conn::Outbound;
use crate::dispatch::ENABLED;
use crate::fs::handles::HandleTable;
use crate::http::{HttpContext, Streams};
use crate::process::ProcessTable;
use executor_protocol::limits::Limits;
use executor_protocol::types::session::{
    AgentInfo, EnvironmentInfo, EnvironmentInfoParams, InitializeParams, InitializeResult,
    Platform, SandboxCapabilities, ShellInfo,
};
use executor_protocol::{ErrorCode, WireError, PROTOCOL_VERSION};
use executor_sandbox::Capabilities;
use std::sync::{Arc, OnceLock};

/// The agent's name in `initialize`.
pub const AGENT_NAME: &str = "executor";
/// The agent's version.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Identity of an initialized session. The token is secret: no `Debug`.
struct Identity {
    session_id: String,
    resume_token: String,
}

/// One session: what `initialize` established and what the session owns.
pub struct Session {
    limits: Limits,
    caps: Capabilities,
    outbound: Outbound,
    identity: OnceLock<Identity>,
    processes: ProcessTable,
    handles: HandleTable,
    http: Arc<HttpContext>,
    streams: Streams,
    profile: Profile,
    audit: Audit,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("session_id", &self.identity.get().map(|i| &i.session_id))
            .finish_non_exhaustive()
    }
}

impl Session {
    /// A fresh, uninitialized session.
    pub fn new(
        limits: Limits,
        http: Arc<HttpContext>,
        profile: Profile,
        audit: Audit,
        outbound: Outbound,
    ) -> Self {
        Session {
            caps: Capabilities::probe(),
            outbound,
            identity: OnceLock::new(),
            processes: ProcessTable::default(),
            handles: HandleTable::default(),
            http,
            streams: Streams::new(limits.max_http_streams),
            limits,
            profile,
            audit,
        }
    }

    /// The configuration profile this session runs under.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// The audit log.
    pub fn audit(&self) -> &Audit {
        &self.audit
    }

    /// HTTP destination policy, trust and proxy.
    pub fn http(&self) -> &HttpContext {
        &self.http
    }

    /// The session's streamed HTTP responses.
    pub fn http_streams(&self) -> &Streams {
        &self.streams
    }

    /// Whether `initialize` succeeded.
    pub fn is_initialized(&self) -> bool {
        self.identity.get().is_some()
    }

    /// The largest frame this session sends.
    pub fn max_frame(&self) -> usize {
        self.outbound.max_frame()
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The connection's sending side.
    pub fn outbound(&self) -> &Outbound {
        &self.outbound
    }

    /// The session's jobs.
    pub fn processes(&self) -> &ProcessTable {
        &self.processes
    }

    /// The session's open file handles.
    pub fn handles(&self) -> &HandleTable {
        &self.handles
    }

    /// The session id, once initialized.
    pub fn id(&self) -> Option<&str> {
        self.identity.get().map(|i| i.session_id.as_str())
    }

    /// What this host can enforce.
    pub fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    /// What `initialize.sandbox` and `environment/info` report.
    pub fn sandbox_capabilities(&self) -> SandboxCapabilities {
        self.caps.to_wire()
    }

    /// `initialize`
    pub fn initialize(&self, p: InitializeParams) -> Result<InitializeResult, WireError> {
        if self.is_initialized() {
            return Err(WireError::new(
                ErrorCode::InvalidRequest,
                "initialize was already done on this connection",
            ));
        }
        if p.protocol_version != PROTOCOL_VERSION {
            return Err(WireError::new(
                ErrorCode::UnsupportedVersion,
                format!(
                    "client speaks protocol version {}, this agent speaks {PROTOCOL_VERSION}",
                    p.protocol_version
                ),
            )
            .with("client", p.protocol_version)
            .with(
                "agent",
                rmpv::Value::Array(vec![PROTOCOL_VERSION.into(), PROTOCOL_VERSION.into()]),
            ));
        }
        if let Some(session) = &p.session {
            if let Some(ttl) = session.detach_ttl_ms {
                if ttl > self.limits.max_detach_ttl_ms {
                    return Err(WireError::limit(
                        "max_detach_ttl_ms",
                        self.limits.max_detach_ttl_ms,
                        Some(ttl),
                    ));
                }
                if ttl > 0 {
                    return Err(WireError::invalid_params(
                        "session.detach_ttl_ms",
                        format!("detach_ttl_ms {ttl}: detached sessions are not supported by this agent version"),
                    ));
                }
            }
            if let Some(resume) = &session.resume {
                return Err(WireError::new(
                    ErrorCode::SessionExpired,
                    format!("no resumable session {:?} on this host", resume.session_id),
                ));
            }
        }
        let identity = Identity {
            session_id: random_hex()?,
            resume_token: random_hex()?,
        };
        let result = InitializeResult {
            protocol_version: PROTOCOL_VERSION,
            agent: AgentInfo {
                name: AGENT_NAME.into(),
                version: AGENT_VERSION.into(),
            },
            session_id: identity.session_id.clone(),
            resume_token: identity.resume_token.clone(),
            resumed: false,
            // What this profile may call.
            methods: ENABLED
                .iter()
                .filter(|m| self.profile.check(m).is_ok())
                .map(|m| m.to_string())
                .collect(),
            limits: self.limits.clone(),
            platform: Platform {
                os: std::env::consts::OS.into(),
                arch: std::env::consts::ARCH.into(),
                hostname: hostname(),
            },
            sandbox: self.sandbox_capabilities(),
        };
        tracing::info!(
            session_id = %identity.session_id,
            client = %p.client.name,
            client_version = %p.client.version,
            "session initialized"
        );
        if self.identity.set(identity).is_err() {
            return Err(WireError::new(
                ErrorCode::InvalidRequest,
                "initialize was already done on this connection",
            ));
        }
        Ok(result)
    }

    /// End the session: release everything it owns.
    pub async fn shutdown(&self) {
        // Every job: SIGTERM, then SIGKILL after the grace period.
        self.processes.terminate_all().await;
        // Every handle: uncommitted writes lose their temp files.
        self.handles.close_all();
        // Every HTTP stream: a final `cancelled` delta, connection closed.
        self.streams.cancel_all();
        tracing::debug!(session_id = ?self.id(), "session ended");
    }
}

/// 128 bits from the OS RNG, as 32 hex digits.
fn random_hex() -> Result<String, WireError> {
    use ring::rand::{SecureRandom, SystemRandom};
    let mut bytes = [0u8; 16];
    SystemRandom::new().fill(&mut bytes).map_err(|_| {
        WireError::new(ErrorCode::Internal, "the OS random number generator failed")
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default()
}

/// `environment/info`
pub async fn environment_info(
    s: &Arc<Session>,
    _p: EnvironmentInfoParams,
) -> Result<EnvironmentInfo, WireError> {
    let uid = nix::unistd::getuid();
    let user = nix::unistd::User::from_uid(uid).ok().flatten();
    let (name, home, shell) = match &user {
        Some(u) => (
            u.name.clone(),
            u.dir.to_string_lossy().into_owned(),
            u.shell.to_string_lossy().into_owned(),
        ),
        None => (
            std::env::var("USER").unwrap_or_default(),
            std::env::var("HOME").unwrap_or_default(),
            "/bin/sh".to_string(),
        ),
    };
    let shell_name = std::path::Path::new(&shell)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(EnvironmentInfo {
        os: std::env::consts::OS.into(),
        arch: std::env::consts::ARCH.into(),
        hostname: hostname(),
        user: name,
        uid: uid.as_raw(),
        home,
        cwd: std::env::current_dir()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default(),
        shell: ShellInfo {
            path: shell,
            name: shell_name,
        },
        path_separator: "/".into(),
        agent_version: AGENT_VERSION.into(),
        sandbox: s.sandbox_capabilities(),
    })
}
