//! One session: what `initialize` established (identity, limits, profile,
//! how it lives) and what it owns (the [`crate::tables`], the HTTP
//! context, the audit log, the [`Outbound`] its notifications leave by);
//! `initialize`, `environment/info`, and the end of a session.
//!
//! Above the tables, below the handlers: it uses `outbound`, `tables`,
//! `config`, `audit` and `http_client`; the handlers get a `&Arc<Session>`.

use crate::audit::Audit;
use crate::config::Profile;
use crate::http_client::HttpContext;
use crate::outbound::pipes::PipePool;
use crate::outbound::Outbound;
use crate::tables::handles::HandleTable;
use crate::tables::jobs::ProcessTable;
use crate::tables::once::Once;
use crate::tables::streams::Streams;
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
    /// A random key and the token's tag under it: a presented token is
    /// checked with `hmac::verify` (constant time).
    token_key: ring::hmac::Key,
    token_tag: ring::hmac::Tag,
}

impl Identity {
    fn new(session_id: String) -> Result<Identity, WireError> {
        let resume_token = random_hex::<16>()?;
        let rng = ring::rand::SystemRandom::new();
        let token_key = ring::hmac::Key::generate(ring::hmac::HMAC_SHA256, &rng).map_err(|_| {
            WireError::new(ErrorCode::Internal, "the OS random number generator failed")
        })?;
        let token_tag = ring::hmac::sign(&token_key, resume_token.as_bytes());
        Ok(Identity {
            session_id,
            resume_token,
            token_key,
            token_tag,
        })
    }

    fn token_matches(&self, presented: &str) -> bool {
        ring::hmac::verify(
            &self.token_key,
            presented.as_bytes(),
            self.token_tag.as_ref(),
        )
        .is_ok()
    }
}

/// How a session lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// In the stdio process: it ends with its one connection. `refusal`
    /// explains why a resume (or a detach) cannot be served here.
    Plain { refusal: Option<Refusal> },
    /// In a session host: it outlives connections (until its TTL runs out
    /// while detached) and is resumed by id and token.
    Host { session_id: String },
}

/// Why a stdio agent could not hand a resume (or a detach) to a session
/// host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Answered with `code` (`session_expired`, `session_busy`).
    Code { code: ErrorCode, why: String },
    /// A bound was reached: `limit_exceeded` naming it.
    Limit {
        name: &'static str,
        max: u64,
        why: String,
    },
}

impl Refusal {
    /// A refusal answered with `code`.
    pub fn new(code: ErrorCode, why: String) -> Refusal {
        Refusal::Code { code, why }
    }

    /// The reason, for a person.
    pub fn why(&self) -> &str {
        match self {
            Refusal::Code { why, .. } | Refusal::Limit { why, .. } => why,
        }
    }

    /// The answer to a request that needed what was refused; `context`
    /// says which request.
    fn to_wire(&self, context: &str) -> WireError {
        match self {
            Refusal::Code { code, why } => WireError::new(*code, format!("{context}: {why}")),
            Refusal::Limit { name, max, why } => {
                let mut e = WireError::limit(name, *max, None);
                e.message = format!("{context}: {why}: {}", e.message);
                e
            }
        }
    }
}

/// Which connection holds the session, and since when none does.
#[derive(Debug)]
struct Link {
    generation: u64,
    attached: bool,
    since: std::time::Instant,
}

/// One session: what `initialize` established and what the session owns.
pub struct Session {
    mode: Mode,
    link: std::sync::Mutex<Link>,
    ttl: std::sync::Mutex<std::time::Duration>,
    limits: Limits,
    caps: Capabilities,
    outbound: Outbound,
    identity: OnceLock<Identity>,
    processes: Arc<ProcessTable>,
    /// The `idempotency_key`s of `process/start`, and what each start
    /// answered.
    start_keys: Once<executor_protocol::types::process::ProcessStartResult>,
    handles: HandleTable,
    http: Arc<HttpContext>,
    streams: Arc<Streams>,
    read_streams: Arc<Streams>,
    /// Bytes the session's read streams hold, read and not yet written to
    /// the connection (all streams together).
    read_ahead: Arc<tokio::sync::Semaphore>,
    /// The pipes the read streams' blocks travel in (within the
    /// read-ahead's bytes).
    pipes: Arc<PipePool>,
    profile: Profile,
    audit: Audit,
    login_env: crate::login_env::LoginEnv,
}

/// How many bytes all of a session's read streams may hold at once, read
/// and not yet written: one stream's largest window (`max_read_credit_bytes`),
/// and at least one block, so that `max_read_streams` streams waiting on a
/// slow connection hold no more than one stream could.
pub fn read_ahead_bytes(l: &Limits) -> usize {
    let bytes = l.max_read_credit_bytes.max(l.max_block_bytes);
    usize::try_from(bytes)
        .unwrap_or(usize::MAX)
        .min(tokio::sync::Semaphore::MAX_PERMITS)
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("session_id", &self.identity.get().map(|i| &i.session_id))
            .finish_non_exhaustive()
    }
}

impl Session {
    /// A session from the agent's configuration (opens the audit log).
    pub fn from_config(config: crate::config::Config, mode: Mode) -> std::io::Result<Session> {
        let crate::config::Config {
            limits,
            http,
            profile,
            audit,
        } = config;
        let audit = Audit::open(&audit, profile.name.as_deref()).map_err(|e| {
            tracing::error!(error = %e, "cannot open the audit log");
            std::io::Error::other(e)
        })?;
        let outbound = Outbound::new(limits.max_frame_bytes as usize);
        let http = Arc::new(HttpContext::new(http));
        Ok(Session::new(limits, http, profile, audit, outbound, mode))
    }

    /// A fresh, uninitialized session.
    pub fn new(
        limits: Limits,
        http: Arc<HttpContext>,
        profile: Profile,
        audit: Audit,
        outbound: Outbound,
        mode: Mode,
    ) -> Self {
        Session {
            mode,
            link: std::sync::Mutex::new(Link {
                generation: 0,
                attached: false,
                since: std::time::Instant::now(),
            }),
            ttl: std::sync::Mutex::new(std::time::Duration::ZERO),
            caps: Capabilities::probe(),
            outbound,
            identity: OnceLock::new(),
            processes: Arc::default(),
            // A failed start started nothing: retried, it tries again.
            start_keys: Once::new(executor_protocol::limits::MAX_START_KEYS, true),
            handles: HandleTable::default(),
            http,
            streams: Arc::new(Streams::new(limits.max_http_streams, "max_http_streams")),
            read_streams: Arc::new(Streams::new(limits.max_read_streams, "max_read_streams")),
            read_ahead: Arc::new(tokio::sync::Semaphore::new(read_ahead_bytes(&limits))),
            pipes: PipePool::new(read_ahead_bytes(&limits)),
            limits,
            profile,
            audit,
            login_env: Default::default(),
        }
    }

    /// The session's login-shell environment snapshot (`env_base`).
    pub fn login_env(&self) -> &crate::login_env::LoginEnv {
        &self.login_env
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
    pub fn http_streams(&self) -> &Arc<Streams> {
        &self.streams
    }

    /// The session's `fs/readStream`s.
    pub fn read_streams(&self) -> &Arc<Streams> {
        &self.read_streams
    }

    /// The read streams' shared read-ahead: a block takes its size in
    /// permits before it is read and gives them back once written.
    pub fn read_ahead(&self) -> &Arc<tokio::sync::Semaphore> {
        &self.read_ahead
    }

    /// The kernel pipes read streams pin their blocks in (as many bytes of
    /// them at most as the read-ahead).
    pub fn pipes(&self) -> &Arc<PipePool> {
        &self.pipes
    }

    /// Whether `initialize` succeeded.
    pub fn is_initialized(&self) -> bool {
        self.identity.get().is_some()
    }

    /// A connection takes the session (after its `initialize` or resume):
    /// notifications go to it from now on, and the generation it gets
    /// tells it when another connection took over. `splices`: the
    /// connection's writer moves piped blocks inside the kernel.
    pub fn attach(
        &self,
        notes: tokio::sync::mpsc::Sender<crate::outbound::OutFrame>,
        splices: bool,
    ) -> u64 {
        let mut link = self.link.lock().expect("link lock");
        if link.attached {
            // A takeover: the read streams of the connection taken over end
            // with it, as on detach (their messages could only go to it).
            self.read_streams.cancel_all();
        }
        link.generation += 1;
        link.attached = true;
        self.outbound.attach(notes, splices);
        link.generation
    }

    /// The connection of `generation` ended.
    pub fn detach(
        &self,
        generation: u64,
        notes: &tokio::sync::mpsc::Sender<crate::outbound::OutFrame>,
    ) {
        let mut link = self.link.lock().expect("link lock");
        if link.generation == generation {
            link.attached = false;
            link.since = std::time::Instant::now();
            self.outbound.detach(notes);
            // Streamed HTTP responses and read streams end with the
            // connection (a read stream's file is closed).
            self.streams.cancel_all();
            self.read_streams.cancel_all();
        }
    }

    /// The generation of the connection holding the session.
    pub fn generation(&self) -> u64 {
        self.link.lock().expect("link lock").generation
    }

    /// `None` while attached; how long it has been detached otherwise.
    pub fn detached_for(&self) -> Option<std::time::Duration> {
        let link = self.link.lock().expect("link lock");
        (!link.attached).then(|| link.since.elapsed())
    }

    /// How long a detached session waits for a resume.
    pub fn ttl(&self) -> std::time::Duration {
        *self.ttl.lock().expect("ttl lock")
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
    pub fn processes(&self) -> &Arc<ProcessTable> {
        &self.processes
    }

    /// The session's `process/start` idempotency keys.
    pub fn start_keys(&self) -> &Once<executor_protocol::types::process::ProcessStartResult> {
        &self.start_keys
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
        let mut caps = self.caps.to_wire();
        // Every job's limits, sandboxed or not: its cgroups, or rlimits.
        caps.mechanisms.extend(crate::limits::mechanisms());
        caps
    }

    /// `initialize`
    pub fn initialize(&self, p: InitializeParams) -> Result<InitializeResult, WireError> {
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
        let ttl = p.session.as_ref().and_then(|s| s.detach_ttl_ms);
        if let Some(ttl) = ttl {
            if ttl > self.limits.max_detach_ttl_ms {
                return Err(WireError::limit(
                    "max_detach_ttl_ms",
                    self.limits.max_detach_ttl_ms,
                    Some(ttl),
                ));
            }
        }
        // Descriptors go only over a session host's own socket: a stdio
        // agent's connection (served here, or relayed) cannot carry them.
        // (A session asked for and refused is answered with its refusal.)
        if matches!(self.mode, Mode::Plain { refusal: None })
            && p.capabilities.is_some_and(|c| c.descriptors)
        {
            return Err(WireError::new(
                ErrorCode::InvalidRequest,
                "capabilities.descriptors: descriptors are passed only to a client on a \
                 session host's own socket, not through the stdio agent",
            ));
        }
        if let Some(resume) = p.session.as_ref().and_then(|s| s.resume.as_ref()) {
            return self.resume(resume, ttl);
        }
        let session_id = match (&self.mode, ttl) {
            (Mode::Host { session_id }, Some(t)) if t > 0 && !self.is_initialized() => {
                *self.ttl.lock().expect("ttl lock") = std::time::Duration::from_millis(t);
                session_id.clone()
            }
            (Mode::Host { .. }, _) => {
                return Err(WireError::new(
                    ErrorCode::SessionExpired,
                    "this session host serves one detached session: resume it with session.resume",
                ))
            }
            (Mode::Plain { refusal }, Some(t)) if t > 0 => {
                let context = format!("detach_ttl_ms {t}: cannot keep this session detached");
                if let Some(r @ Refusal::Limit { .. }) = refusal {
                    return Err(r.to_wire(&context));
                }
                let why = refusal
                    .as_ref()
                    .map_or("no session host could be started", |r| r.why());
                return Err(
                    WireError::new(ErrorCode::InvalidParams, format!("{context}: {why}"))
                        .with("field", "session.detach_ttl_ms"),
                );
            }
            (Mode::Plain { .. }, _) => random_hex::<16>()?,
        };
        if self.is_initialized() {
            return Err(WireError::new(
                ErrorCode::InvalidRequest,
                "initialize was already done on this connection",
            ));
        }
        let identity = Identity::new(session_id)?;
        let result = self.initialize_result(&identity, false);
        tracing::info!(
            session_id = %identity.session_id,
            client = %p.client.name,
            client_version = %p.client.version,
            detached = ttl.is_some_and(|t| t > 0),
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

    /// `initialize` with `session.resume`: the id and the token (compared in
    /// constant time) must match this session's.
    fn resume(
        &self,
        resume: &executor_protocol::types::session::ResumeParams,
        ttl: Option<u64>,
    ) -> Result<InitializeResult, WireError> {
        let expired = |why: String| {
            WireError::new(
                ErrorCode::SessionExpired,
                format!("cannot resume session {:?}: {why}", resume.session_id),
            )
        };
        let identity = match (&self.mode, self.identity.get()) {
            (Mode::Host { .. }, Some(identity)) => identity,
            (Mode::Plain { refusal: None }, _) => {
                return Err(expired("no such session on this host".into()))
            }
            (Mode::Plain { refusal: Some(r) }, _) => {
                return Err(r.to_wire(&format!("cannot resume session {:?}", resume.session_id)))
            }
            (Mode::Host { .. }, None) => return Err(expired("it never started".into())),
        };
        if !self.resume_verifies(&resume.session_id, &resume.token) {
            tracing::warn!(session_id = %identity.session_id, "resume refused: wrong token");
            return Err(expired("wrong session id or token".into()));
        }
        if let Some(t) = ttl.filter(|t| *t > 0) {
            *self.ttl.lock().expect("ttl lock") = std::time::Duration::from_millis(t);
        }
        tracing::info!(session_id = %identity.session_id, "session resumed");
        Ok(self.initialize_result(identity, true))
    }

    /// Whether `session_id` and `token` are this session's: the id is not
    /// secret (it names the socket); the token is checked by HMAC
    /// verification, in constant time. False before `initialize`.
    pub fn resume_verifies(&self, session_id: &str, token: &str) -> bool {
        self.identity
            .get()
            .is_some_and(|i| i.session_id == session_id && i.token_matches(token))
    }

    fn initialize_result(&self, identity: &Identity, resumed: bool) -> InitializeResult {
        InitializeResult {
            protocol_version: PROTOCOL_VERSION,
            agent: AgentInfo {
                name: AGENT_NAME.into(),
                version: AGENT_VERSION.into(),
            },
            session_id: identity.session_id.clone(),
            resume_token: identity.resume_token.clone(),
            resumed,
            // What this profile may call.
            methods: executor_protocol::methods::ALL_REQUESTS
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
        }
    }

    /// End the session: release everything it owns.
    pub async fn shutdown(&self) {
        // Every job: SIGTERM, then SIGKILL after the grace period.
        self.processes.terminate_all().await;
        // Every handle: uncommitted writes lose their temp files.
        self.handles.close_all();
        // Every HTTP stream: a final `cancelled` delta, connection closed.
        self.streams.cancel_all();
        self.read_streams.cancel_all();
        tracing::debug!(session_id = self.id().unwrap_or_default(), "session ended");
    }
}

/// `N` bytes from the OS RNG, as `2N` hex digits: the agent's one way to
/// make ids, tokens and unique names.
pub fn random_hex<const N: usize>() -> Result<String, WireError> {
    use ring::rand::{SecureRandom, SystemRandom};
    let mut bytes = [0u8; N];
    SystemRandom::new().fill(&mut bytes).map_err(|_| {
        WireError::new(ErrorCode::Internal, "the OS random number generator failed")
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A plain session with the default limits and profile, no audit log and
/// no connection: for unit tests of what sits on a session.
#[cfg(test)]
pub(crate) fn test_session() -> Arc<Session> {
    let limits = Limits::default();
    let outbound = Outbound::new(limits.max_frame_bytes as usize);
    let http = Arc::new(HttpContext::new(Default::default()));
    Arc::new(Session::new(
        limits,
        http,
        Profile::default(),
        Audit::disabled(),
        outbound,
        Mode::Plain { refusal: None },
    ))
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
        login_env: Some(s.login_env().info()),
    })
}
