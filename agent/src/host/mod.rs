//! Detached sessions: the session host and the stdio relay in front of it.
//!
//! `initialize` with `session.detach_ttl_ms` > 0 makes the stdio `executor`
//! (the one sshd started) start a **session host**: the same binary as
//! `executor session-host`, in a process group of its own, listening on a
//! Unix socket named by version and session id in a 0700 directory of the
//! user's (the first of `$XDG_RUNTIME_DIR/executor`, `/tmp/executor-<uid>`
//! and `~/.cache/executor/run` that is the user's own: see [`dirs`]). The
//! stdio process then only relays bytes. When the SSH connection drops, the
//! host keeps the session (processes run on, output is retained) until a
//! new `ssh devbox executor` resumes it with `session.resume`, or until
//! `detach_ttl_ms` passes without one, when every job is killed and the
//! host exits.
//!
//! Who may attach: the host checks the peer's uid (`SO_PEERCRED`); the
//! first attach must present a 32-byte secret the relay handed the host on
//! its stdin (never on disk, never in argv or the environment); later
//! attaches are resumes, whose handshake carries the session id and resume
//! token of their `initialize`: the host verifies them (the token in
//! constant time) before anything else, refuses a resume under another
//! configuration profile, and checks them again in `initialize`. Only a
//! resume whose credentials verified can hold the one slot of a resume
//! being set up (others get `session_busy` meanwhile); a wrong token, or a
//! handshake that stalls (it must be complete within [`HANDSHAKE_WITHIN`]),
//! never delays a right one.
//!
//! At most `max_detached_sessions` hosts of a user live at once: the relay
//! counts the live ones ([`RuntimeEnv::live_hosts`]) before it starts one.

use crate::config::Config;
use crate::conn::{serve_on, Ending};
use crate::session::{Mode, Refusal, Session};
use bytes::BytesMut;
pub use dirs::{HostLock, NoSocketDir, RuntimeEnv};
use executor_protocol::codec::FrameDecoder;
use executor_protocol::message::Incoming;
use executor_protocol::ErrorCode;
use executor_protocol::{methods, PREAMBLE};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

pub mod dirs;

/// First bytes of a relay's handshake (its layout: [`handshake`]).
const MAGIC: &[u8; 4] = b"EXR2";
const FIRST_ATTACH: u8 = 0;
const RESUME: u8 = 1;
/// Handshake answers.
const ACCEPTED: u8 = 0;
const OTHER_PROFILE: u8 = 1;
const REFUSED: u8 = 2;
const BUSY: u8 = 3;
const WRONG_CREDENTIALS: u8 = 4;
/// How long a verified resume may take from its handshake to its
/// `initialize` answer before another resume may start.
pub const RESUME_SETUP: Duration = Duration::from_secs(10);
/// A connection's whole handshake must arrive within this long.
pub const HANDSHAKE_WITHIN: Duration = Duration::from_secs(5);
const SECRET_LEN: usize = 32;
/// The longest resume token a handshake carries (the agent's are 32 hex
/// digits; a longer one cannot be right).
const MAX_TOKEN_LEN: usize = 256;
/// A host nobody attached to within this long exits (its relay died).
const FIRST_ATTACH_WITHIN: Duration = Duration::from_secs(30);

/// The socket of `session_id` (an id is 32 hex digits: nothing else can
/// name a path).
pub fn socket_path(dir: &Path, session_id: &str) -> Option<PathBuf> {
    let ok = session_id.len() == 32 && session_id.bytes().all(|b| b.is_ascii_hexdigit());
    ok.then(|| {
        dir.join(format!(
            "{}-{session_id}.sock",
            crate::session::AGENT_VERSION
        ))
    })
}

/// What the relay hands the host on its stdin: one line.
pub struct HostArgs {
    pub session_id: String,
    pub secret: [u8; SECRET_LEN],
    pub socket: PathBuf,
}

impl std::fmt::Debug for HostArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostArgs")
            .field("session_id", &self.session_id)
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl HostArgs {
    fn line(&self) -> String {
        format!(
            "{} {} {}\n",
            self.session_id,
            hex(&self.secret),
            self.socket.display()
        )
    }

    /// Parse the line read from stdin.
    pub fn parse(line: &str) -> Result<HostArgs, String> {
        let mut parts = line.trim_end().splitn(3, ' ');
        let (Some(id), Some(secret), Some(socket)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err("expected `SESSION_ID SECRET SOCKET` on stdin".into());
        };
        let raw: Vec<u8> = (0..secret.len())
            .step_by(2)
            .filter_map(|i| u8::from_str_radix(secret.get(i..i + 2)?, 16).ok())
            .collect();
        let secret: [u8; SECRET_LEN] = raw
            .try_into()
            .map_err(|_| "the secret must be 64 hex digits".to_string())?;
        Ok(HostArgs {
            session_id: id.to_string(),
            secret,
            socket: PathBuf::from(socket),
        })
    }
}

/// `executor session-host`: serve one detached session on its socket until
/// its TTL passes while detached.
pub async fn run_host(config: Config, args: HostArgs) -> std::io::Result<()> {
    // SIGHUP (the login session ending) must not end the host.
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    tokio::spawn(async move { while hangup.recv().await.is_some() {} });
    let profile = config.profile.name.clone().unwrap_or_default();
    let session = Arc::new(Session::from_config(
        config,
        Mode::Host {
            session_id: args.session_id.clone(),
        },
    )?);
    // Held from before "ready" (the relay counts it from then on, under its
    // starting lock) until this host is done.
    let lock = HostLock::take(&args.socket)?;
    let listener = UnixListener::bind(&args.socket)?;
    std::fs::set_permissions(&args.socket, std::fs::Permissions::from_mode(0o600))?;
    // Ready: the relay waits for this line.
    {
        let mut out = std::io::stdout().lock();
        std::io::Write::write_all(&mut out, b"ready\n")?;
        std::io::Write::flush(&mut out)?;
    }
    let key = ring::hmac::Key::generate(ring::hmac::HMAC_SHA256, &ring::rand::SystemRandom::new())
        .map_err(|_| std::io::Error::other("the OS random number generator failed"))?;
    let secret_tag = ring::hmac::sign(&key, &args.secret);
    let first_attach_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Connections past their handshake and still open.
    let active = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let pending: Arc<std::sync::Mutex<Option<Pending>>> = Arc::default();
    let mut next_connection = 0u64;
    let started = std::time::Instant::now();
    tracing::info!(session_id = %args.session_id, socket = %args.socket.display(), "session host up");
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        continue;
                    }
                };
                let session = session.clone();
                let (key, tag) = (key.clone(), secret_tag.as_ref().to_vec());
                let first = first_attach_done.clone();
                let profile = profile.clone();
                let pending = pending.clone();
                let active = active.clone();
                next_connection += 1;
                let me = next_connection;
                tokio::spawn(async move {
                    let checks = Checks {
                        key: &key,
                        secret_tag: &tag,
                        first_attach_done: &first,
                        profile: &profile,
                        pending: &pending,
                        active: &active,
                        me,
                    };
                    if let Err(e) = attach(stream, session, checks).await {
                        tracing::warn!(error = %e, "attach refused");
                    }
                });
            }
            _ = tokio::time::sleep(Duration::from_millis(200)) => {
                let never_attached = !first_attach_done.load(std::sync::atomic::Ordering::SeqCst)
                    && started.elapsed() > FIRST_ATTACH_WITHIN;
                let expired = session.is_initialized()
                    && session.detached_for().is_some_and(|d| d >= session.ttl());
                // The first connection ended without a session (its
                // `initialize` failed): nothing will ever resume it.
                let abandoned = first_attach_done.load(std::sync::atomic::Ordering::SeqCst)
                    && !session.is_initialized()
                    && active.load(std::sync::atomic::Ordering::SeqCst) == 0;
                if never_attached || expired || abandoned {
                    tracing::info!(session_id = %args.session_id, never_attached, abandoned, "session host ending");
                    break;
                }
            }
        }
    }
    let _ = std::fs::remove_file(&args.socket);
    session.shutdown().await;
    // The log beside the socket goes with it.
    let _ = std::fs::remove_file(
        args.socket
            .with_file_name(format!("{}.log", args.session_id)),
    );
    // Last: until now this host counts against `max_detached_sessions`.
    drop(lock);
    Ok(())
}

/// A resume between its handshake and its `initialize` answer.
#[derive(Debug)]
struct Pending {
    connection: u64,
    since: std::time::Instant,
    /// The session's attachment generation when it started: a successful
    /// resume changes it.
    generation: u64,
}

/// What a connection to the host is checked against.
struct Checks<'a> {
    key: &'a ring::hmac::Key,
    secret_tag: &'a [u8],
    first_attach_done: &'a std::sync::atomic::AtomicBool,
    profile: &'a str,
    pending: &'a std::sync::Mutex<Option<Pending>>,
    /// Connections being served.
    active: &'a std::sync::atomic::AtomicUsize,
    /// This connection's number.
    me: u64,
}

/// One connection to the host: check the peer and the handshake, then
/// serve it.
async fn attach(
    mut stream: UnixStream,
    session: Arc<Session>,
    checks: Checks<'_>,
) -> std::io::Result<()> {
    let Checks {
        key,
        secret_tag,
        first_attach_done,
        profile,
        pending,
        active,
        me: this,
    } = checks;
    // Counted from before the handshake (the first attach marks itself
    // done there) until the connection ends.
    struct Active<'a>(&'a std::sync::atomic::AtomicUsize);
    impl Drop for Active<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
    active.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let _active = Active(active);
    let me = nix::unistd::getuid().as_raw();
    let peer = stream.peer_cred()?.uid();
    if peer != me {
        return Err(std::io::Error::other(format!(
            "peer uid {peer} is not this session's uid {me}"
        )));
    }
    // The whole handshake within a bound: a stalled one holds nothing.
    let hello = match tokio::time::timeout(HANDSHAKE_WITHIN, read_hello(&mut stream)).await {
        Ok(Ok(hello)) => hello,
        Ok(Err(e)) => {
            let _ = stream.write_all(&[REFUSED]).await;
            return Err(e);
        }
        Err(_) => return Err(std::io::Error::other("handshake timed out")),
    };
    let verdict = match hello {
        // Verified first, before it may hold the slot of a resume being
        // set up: a wrong token is answered at once and delays nobody.
        Hello::Resume {
            session_id, token, ..
        } if !session.resume_verifies(&session_id, &token) => WRONG_CREDENTIALS,
        Hello::FirstAttach {
            profile: theirs, ..
        }
        | Hello::Resume {
            profile: theirs, ..
        } if theirs != profile.as_bytes() => OTHER_PROFILE,
        Hello::FirstAttach { secret, .. } => {
            let ok = ring::hmac::verify(key, &secret, secret_tag).is_ok()
                && !first_attach_done.swap(true, std::sync::atomic::Ordering::SeqCst);
            if ok {
                ACCEPTED
            } else {
                REFUSED
            }
        }
        Hello::Resume { .. } => {
            // Only one verified resume may be in its setup at a time.
            let mut p = pending.lock().expect("pending lock");
            let generation = session.generation();
            let busy = p
                .as_ref()
                .is_some_and(|p| p.since.elapsed() < RESUME_SETUP && p.generation == generation);
            if busy {
                BUSY
            } else {
                *p = Some(Pending {
                    connection: this,
                    since: std::time::Instant::now(),
                    generation,
                });
                ACCEPTED
            }
        }
    };
    stream.write_all(&[verdict]).await?;
    if verdict != ACCEPTED {
        return Err(std::io::Error::other(format!(
            "handshake refused ({verdict})"
        )));
    }
    let (reader, writer) = stream.into_split();
    let ending = serve_on(&session, reader, writer, false).await;
    let mut p = pending.lock().expect("pending lock");
    if p.as_ref().is_some_and(|p| p.connection == this) {
        *p = None;
    }
    tracing::info!(?ending, "a connection to the session host ended");
    Ok(())
}

/// A relay's handshake, as the host read it. No `Debug`: a resume's
/// token is secret.
enum Hello {
    FirstAttach {
        profile: Vec<u8>,
        secret: [u8; SECRET_LEN],
    },
    Resume {
        profile: Vec<u8>,
        session_id: String,
        token: String,
    },
}

/// Read one handshake (its layout: [`handshake`]).
async fn read_hello(stream: &mut UnixStream) -> std::io::Result<Hello> {
    let bad = |what: &str| std::io::Error::other(format!("bad handshake: {what}"));
    let mut head = [0u8; 6];
    stream.read_exact(&mut head).await?;
    if &head[..4] != MAGIC {
        return Err(bad("not a relay's"));
    }
    let (kind, profile_len) = (head[4], head[5] as usize);
    let mut profile = vec![0u8; profile_len];
    stream.read_exact(&mut profile).await?;
    match kind {
        FIRST_ATTACH => {
            let mut secret = [0u8; SECRET_LEN];
            stream.read_exact(&mut secret).await?;
            Ok(Hello::FirstAttach { profile, secret })
        }
        RESUME => {
            let id_len = stream.read_u8().await? as usize;
            let mut id = vec![0u8; id_len];
            stream.read_exact(&mut id).await?;
            let token_len = stream.read_u16().await? as usize;
            if token_len > MAX_TOKEN_LEN {
                return Err(bad("token too long"));
            }
            let mut token = vec![0u8; token_len];
            stream.read_exact(&mut token).await?;
            Ok(Hello::Resume {
                profile,
                session_id: String::from_utf8(id).map_err(|_| bad("session id not UTF-8"))?,
                token: String::from_utf8(token).map_err(|_| bad("token not UTF-8"))?,
            })
        }
        _ => Err(bad("unknown kind")),
    }
}

/// What a relay attaches as.
#[derive(Clone, Copy)]
enum Attach<'a> {
    /// The relay that started the host, with the secret it handed it.
    First(&'a [u8; SECRET_LEN]),
    /// A resume, with the credentials of its `initialize`.
    Resume { session_id: &'a str, token: &'a str },
}

/// The first frame of a connection, if it asks for a detached session.
/// No `Debug`: a resume's token is secret.
enum Wants {
    Detach,
    Resume { session_id: String, token: String },
    Plain,
}

fn wants(frame: &[u8]) -> Wants {
    match Incoming::decode(frame) {
        Ok(Incoming::Request { method, params, .. }) if method == methods::INITIALIZE => {
            let p: Result<executor_protocol::types::session::InitializeParams, _> =
                executor_protocol::message::from_params(params);
            match p.ok().and_then(|p| p.session) {
                Some(s) if s.resume.is_some() => {
                    let r = s.resume.expect("checked");
                    Wants::Resume {
                        session_id: r.session_id,
                        token: r.token,
                    }
                }
                Some(s) if s.detach_ttl_ms.is_some_and(|t| t > 0) => Wants::Detach,
                _ => Wants::Plain,
            }
        }
        _ => Wants::Plain,
    }
}

/// Why resumes cannot work on this host, when it says so: systemd-logind
/// set to kill a user's processes at logout.
fn logind_kills_processes() -> bool {
    let mut files = vec![PathBuf::from("/etc/systemd/logind.conf")];
    if let Ok(dir) = std::fs::read_dir("/etc/systemd/logind.conf.d") {
        files.extend(dir.filter_map(|e| e.ok()).map(|e| e.path()));
    }
    let mut kill = false;
    for f in files {
        for line in std::fs::read_to_string(f).unwrap_or_default().lines() {
            if let Some(v) = line.trim().strip_prefix("KillUserProcesses=") {
                kill = matches!(v.trim(), "yes" | "true" | "1");
            }
        }
    }
    kill
}

/// How the stdio process was started, to start a host the same way.
#[derive(Debug, Clone, Default)]
pub struct Launch {
    pub config_path: Option<PathBuf>,
    pub profile: Option<String>,
}

/// The stdio agent: serve in-process, or relay to a session host when the
/// first request asks for a detached session or a resume.
pub async fn serve_stdio<R, W>(
    mut input: R,
    mut output: W,
    config: Config,
    launch: Launch,
) -> std::io::Result<Ending>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    output.write_all(PREAMBLE).await?;
    output.flush().await?;
    // The first frame decides; it (and whatever came with it) is replayed.
    let mut decoder = FrameDecoder::new(config.limits.max_frame_bytes as usize);
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let first = loop {
        match decoder.decode(&mut buf) {
            Ok(Some(frame)) => break Some(frame),
            Ok(None) => {}
            Err(_) => break None,
        }
        if input.read_buf(&mut buf).await? == 0 {
            break None;
        }
    };
    let mut replay = Vec::with_capacity(buf.len() + 4 + first.as_ref().map_or(0, |f| f.len()));
    if let Some(f) = &first {
        replay.extend_from_slice(&(f.len() as u32).to_be_bytes());
        replay.extend_from_slice(f);
    }
    replay.extend_from_slice(&buf);
    let wants = first.as_deref().map_or(Wants::Plain, wants);
    let profile = launch.profile.clone().unwrap_or_default();
    let expired = |why: String| Refusal::new(ErrorCode::SessionExpired, why);
    let env = RuntimeEnv::current();
    let refusal = match wants {
        Wants::Plain => None,
        Wants::Detach => match start_host(&launch, &env, config.limits.max_detached_sessions).await
        {
            Ok((socket, secret)) => {
                match connect(&socket, Attach::First(&secret), &profile).await {
                    Ok(stream) => return relay(stream, replay, input, output).await,
                    Err(e) => Some(expired(format!(
                        "the session host did not take the connection: {}",
                        e.why()
                    ))),
                }
            }
            Err(StartError::Limit { live, max }) => Some(Refusal::Limit {
                name: "max_detached_sessions",
                max,
                why: format!("{live} session hosts of this user are alive"),
            }),
            Err(e) => Some(expired(format!("cannot start a session host: {e}"))),
        },
        Wants::Resume { session_id, token } => {
            let attach = Attach::Resume {
                session_id: &session_id,
                token: &token,
            };
            match env.find_socket(&session_id) {
                Some(s) => match connect(&s, attach, &profile).await {
                    Ok(stream) => return relay(stream, replay, input, output).await,
                    Err(e) => Some(e),
                },
                None => {
                    let mut why = "no such session on this host (it expired, or it never existed)"
                        .to_string();
                    if logind_kills_processes() {
                        why.push_str(
                            "; note: this host's systemd-logind kills a user's processes at logout \
                             (KillUserProcesses=yes), which ends detached sessions: \
                             `loginctl enable-linger USER` keeps them",
                        );
                    }
                    Some(expired(why))
                }
            }
        }
    };
    let session = Arc::new(Session::from_config(config, Mode::Plain { refusal })?);
    let input = std::io::Cursor::new(replay).chain(input);
    let ending = serve_on(&session, input, output, false).await;
    session.shutdown().await;
    Ok(ending)
}

/// Why no session host was started.
#[derive(Debug, thiserror::Error)]
enum StartError {
    #[error("{live} session hosts of this user are alive (max_detached_sessions {max})")]
    Limit { live: usize, max: u64 },
    #[error(transparent)]
    NoDir(#[from] NoSocketDir),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Start `executor session-host` detached, unless `max_hosts` of the
/// user's are alive; its socket and secret.
async fn start_host(
    launch: &Launch,
    env: &RuntimeEnv,
    max_hosts: u64,
) -> Result<(PathBuf, [u8; SECRET_LEN]), StartError> {
    use ring::rand::SecureRandom;
    let rng = ring::rand::SystemRandom::new();
    let mut secret = [0u8; SECRET_LEN];
    let mut id = [0u8; 16];
    rng.fill(&mut secret)
        .and_then(|()| rng.fill(&mut id))
        .map_err(|_| std::io::Error::other("the OS random number generator failed"))?;
    let session_id = hex(&id);
    let dir = env.socket_dir()?;
    // Counted and started under one lock: the host takes its own lock
    // before it says it is ready, so the next relay counts it.
    let _starting = dirs::StartingLock::take(&dir).await?;
    let live = env.live_hosts();
    if live as u64 >= max_hosts {
        return Err(StartError::Limit {
            live,
            max: max_hosts,
        });
    }
    let socket = socket_path(&dir, &session_id).expect("a fresh id is valid");
    let args = HostArgs {
        session_id,
        secret,
        socket: socket.clone(),
    };
    let log_path = dir.join(format!("{}.log", args.session_id));
    let log = std::fs::OpenOptions::new()
        .create_new(true)
        .append(true)
        .mode_0600()
        .open(&log_path)?;
    let mut cmd = tokio::process::Command::new("/proc/self/exe");
    cmd.arg0("executor").arg("session-host");
    if let Some(c) = &launch.config_path {
        cmd.arg("--config").arg(c);
    }
    if let Some(p) = &launch.profile {
        cmd.arg("--profile").arg(p);
    }
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(log)
        // Its own process group: a signal to the stdio agent's group (or
        // the SSH session's) does not reach it.
        .process_group(0)
        .kill_on_drop(false);
    let mut child = cmd.spawn()?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin.write_all(args.line().as_bytes()).await?;
    drop(stdin);
    let mut stdout = child.stdout.take().expect("piped stdout");
    let mut ready = [0u8; 6];
    let not_started =
        |why: String| std::io::Error::other(format!("{why} (its log: {})", log_path.display()));
    tokio::time::timeout(Duration::from_secs(10), stdout.read_exact(&mut ready))
        .await
        .map_err(|_| not_started("the session host did not start in time".into()))?
        .map_err(|e| not_started(format!("the session host did not start: {e}")))?;
    if &ready != b"ready\n" {
        return Err(not_started("the session host did not start".into()).into());
    }
    // Reaped by whoever adopts it; never waited for here.
    drop(child);
    Ok((socket, secret))
}

trait Mode0600 {
    fn mode_0600(&mut self) -> &mut Self;
}

impl Mode0600 for std::fs::OpenOptions {
    fn mode_0600(&mut self) -> &mut Self {
        std::os::unix::fs::OpenOptionsExt::mode(self, 0o600)
    }
}

/// Connect to a session host and pass its handshake.
async fn connect(socket: &Path, attach: Attach<'_>, profile: &str) -> Result<UnixStream, Refusal> {
    let io = |e: std::io::Error| {
        Refusal::new(
            ErrorCode::SessionExpired,
            format!("the session host is unreachable: {e}"),
        )
    };
    let refused = |code, why: &str| Err(Refusal::new(code, why.to_string()));
    let wrong = "wrong session id or token";
    if matches!(attach, Attach::Resume { token, .. } if token.len() > MAX_TOKEN_LEN) {
        return refused(ErrorCode::SessionExpired, wrong);
    }
    let hello = handshake(attach, profile).map_err(io)?;
    let mut stream = UnixStream::connect(socket).await.map_err(io)?;
    let host_uid = stream.peer_cred().map_err(io)?.uid();
    let me = nix::unistd::getuid().as_raw();
    if host_uid != me {
        return Err(Refusal::new(
            ErrorCode::SessionExpired,
            format!("the session host runs as uid {host_uid}, not {me}"),
        ));
    }
    stream.write_all(&hello).await.map_err(io)?;
    let mut verdict = [0u8; 1];
    stream.read_exact(&mut verdict).await.map_err(io)?;
    match verdict[0] {
        ACCEPTED => Ok(stream),
        WRONG_CREDENTIALS => refused(ErrorCode::SessionExpired, wrong),
        OTHER_PROFILE => refused(
            ErrorCode::SessionExpired,
            "the session was created under another configuration profile",
        ),
        BUSY => refused(
            ErrorCode::SessionBusy,
            "another resume of this session is being set up; retry",
        ),
        _ => refused(
            ErrorCode::SessionExpired,
            "the session host refused the connection",
        ),
    }
}

/// A relay's handshake: [`MAGIC`], the kind, the profile name's length
/// (one byte) and the name; then for a first attach the 32-byte secret,
/// for a resume the session id (one-byte length, then the id) and the
/// token (two-byte big-endian length, then the token).
fn handshake(attach: Attach<'_>, profile: &str) -> std::io::Result<Vec<u8>> {
    let too_long = |what: &str| std::io::Error::other(format!("{what} too long"));
    let profile = profile.as_bytes();
    let mut head = Vec::with_capacity(6 + profile.len() + SECRET_LEN);
    head.extend_from_slice(MAGIC);
    head.push(match attach {
        Attach::First(_) => FIRST_ATTACH,
        Attach::Resume { .. } => RESUME,
    });
    head.push(u8::try_from(profile.len()).map_err(|_| too_long("profile name"))?);
    head.extend_from_slice(profile);
    match attach {
        Attach::First(secret) => head.extend_from_slice(secret),
        Attach::Resume { session_id, token } => {
            head.push(u8::try_from(session_id.len()).map_err(|_| too_long("session id"))?);
            head.extend_from_slice(session_id.as_bytes());
            if token.len() > MAX_TOKEN_LEN {
                return Err(too_long("token"));
            }
            head.extend_from_slice(&(token.len() as u16).to_be_bytes());
            head.extend_from_slice(token.as_bytes());
        }
    }
    Ok(head)
}

/// The handshake a resume of `session_id` with `token` sends under
/// `profile`. For tests (a handshake cut short) and diagnostics.
pub fn resume_handshake(profile: &str, session_id: &str, token: &str) -> std::io::Result<Vec<u8>> {
    handshake(Attach::Resume { session_id, token }, profile)
}

/// Start a resume of the session at `socket` and stop before its
/// `initialize`. When the id and token verify, the host counts it as a
/// resume being set up (and answers other resumes `session_busy`) until
/// this connection's `initialize` succeeds or it closes, or
/// [`RESUME_SETUP`] passes; otherwise it is refused at once. For tests and
/// diagnostics.
pub async fn begin_resume(
    socket: &Path,
    profile: &str,
    session_id: &str,
    token: &str,
) -> std::io::Result<UnixStream> {
    connect(socket, Attach::Resume { session_id, token }, profile)
        .await
        .map_err(|r| std::io::Error::other(r.why().to_string()))
}

/// Bytes both ways between the SSH side and the host, until either ends.
async fn relay<R, W>(
    stream: UnixStream,
    replay: Vec<u8>,
    mut input: R,
    mut output: W,
) -> std::io::Result<Ending>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (mut from_host, mut to_host) = stream.into_split();
    let up = tokio::spawn(async move {
        to_host.write_all(&replay).await?;
        tokio::io::copy(&mut input, &mut to_host).await?;
        // Our input ended (the SSH side closed): the host detaches.
        to_host.shutdown().await
    });
    let down = tokio::io::copy(&mut from_host, &mut output).await;
    let _ = output.flush().await;
    up.abort();
    down.map(|_| Ending::Eof)
}
