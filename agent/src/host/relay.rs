//! The stdio relay: the `executor` sshd started serves its connection
//! in-process, or, when the first request asks for a detached session or
//! a resume, starts (or finds) the session host, passes its handshake (its
//! layout: `handshake`) and hands it the connection: its stdin and stdout
//! themselves when they are pipes or sockets ([`Carry::Fds`]), else the
//! bytes, relayed over the host's Unix socket.
//!
//! Part of [`crate::host`]: it uses the host's handshake constants and
//! [`HostArgs`], [`crate::conn`] and [`crate::session`].

use super::*;
use std::os::fd::{AsFd, BorrowedFd};

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

/// Whether the first frame is an `initialize` declaring
/// `capabilities.descriptors`.
fn asks_for_descriptors(frame: &[u8]) -> bool {
    match Incoming::decode(frame) {
        Ok(Incoming::Request { method, params, .. }) if method == methods::INITIALIZE => {
            executor_protocol::message::from_params::<
                executor_protocol::types::session::InitializeParams,
            >(params)
            .ok()
            .and_then(|p| p.capabilities)
            .is_some_and(|c| c.descriptors)
        }
        _ => false,
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

/// A side of the stdio agent's connection that may be handed to a session
/// host ([`Carry::Fds`]): its descriptor when it is one the host can serve
/// directly (a pipe or a socket driven by the event loop).
pub trait HandOver {
    fn hand_over(&self) -> Option<BorrowedFd<'_>> {
        None
    }
}

impl HandOver for tokio::net::unix::pipe::Receiver {
    fn hand_over(&self) -> Option<BorrowedFd<'_>> {
        Some(self.as_fd())
    }
}

impl HandOver for tokio::net::unix::pipe::Sender {
    fn hand_over(&self) -> Option<BorrowedFd<'_>> {
        Some(self.as_fd())
    }
}

/// Tokio's portable stdio (a terminal, a file): relayed as bytes.
impl HandOver for tokio::io::Stdin {}
impl HandOver for tokio::io::Stdout {}

/// The stdio agent: serve in-process, or hand the connection to a session
/// host when the first request asks for a detached session or a resume
/// (its descriptors when it can, else relaying its bytes).
pub async fn serve_stdio<R, W>(
    mut input: R,
    mut output: W,
    config: Config,
    launch: Launch,
) -> std::io::Result<Ending>
where
    R: AsyncRead + HandOver + Unpin + Send + 'static,
    W: crate::conn::Output + HandOver,
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
    // Descriptors cannot reach the client through the relay (the SSH
    // side's pipes carry none): a client that asks for them is served
    // here, where its initialize is refused (`Session::initialize`), and
    // no session host starts.
    let refusal = if first.as_deref().is_some_and(asks_for_descriptors) {
        None
    } else {
        let carry = match (input.hand_over(), output.hand_over()) {
            (Some(_), Some(_)) => Carry::Fds,
            _ => Carry::Bytes,
        };
        match route(first.as_deref(), &config, &launch, carry).await {
            Route::Host(stream) if carry == Carry::Fds => {
                match hand_over(stream, &replay, &input, &output).await {
                    Ok(ending) => return Ok(ending),
                    // Not taken: this process still has the connection,
                    // and answers the request itself.
                    Err(why) => Some(Refusal::new(
                        ErrorCode::SessionExpired,
                        format!("the session host did not take the connection: {why}"),
                    )),
                }
            }
            Route::Host(stream) => return relay(stream, replay, input, output).await,
            Route::Here(refusal) => refusal,
        }
    };
    let session = Arc::new(Session::from_config(config, Mode::Plain { refusal })?);
    let input = std::io::Cursor::new(replay).chain(input);
    let ending = serve_on(&session, input, output, false).await;
    session.shutdown().await;
    Ok(ending)
}

/// Where a connection is served, as its first frame decides.
pub enum Route {
    /// By a session host: its socket, past the handshake (the first frame
    /// is still to be sent on it).
    Host(UnixStream),
    /// In this process, the first request refused with this when it asked
    /// for a session that could not be had.
    Here(Option<Refusal>),
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Route::Host(_) => f.write_str("Route::Host"),
            Route::Here(r) => write!(f, "Route::Here(refused: {})", r.is_some()),
        }
    }
}

/// Route a connection whose first frame (without its length prefix) is
/// `first`: a detach starts a session host, a resume finds one; either is
/// connected to and its handshake passed, saying that the connection will
/// be carried as `carry`. What fails becomes the refusal of the request
/// served here.
pub async fn route(first: Option<&[u8]>, config: &Config, launch: &Launch, carry: Carry) -> Route {
    let wants = first.map_or(Wants::Plain, wants);
    let profile = launch.profile.clone().unwrap_or_default();
    let expired = |why: String| Refusal::new(ErrorCode::SessionExpired, why);
    let env = RuntimeEnv::current();
    let refusal = match wants {
        Wants::Plain => None,
        Wants::Detach => {
            match start_host(launch, &env, config.limits.max_detached_sessions).await {
                Ok((socket, secret)) => {
                    match connect(&socket, Attach::First(&secret), carry, &profile).await {
                        Ok(stream) => return Route::Host(stream),
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
            }
        }
        Wants::Resume { session_id, token } => {
            let attach = Attach::Resume {
                session_id: &session_id,
                token: &token,
            };
            match env.find_socket(&session_id) {
                Some(s) => match connect(&s, attach, carry, &profile).await {
                    Ok(stream) => return Route::Host(stream),
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
    Route::Here(refusal)
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
    // It inherits this agent's raised open files limit: its jobs get the
    // one this agent was started with.
    if let Some(n) = crate::limits::jobs_open_files() {
        cmd.arg("--jobs-open-files").arg(n.to_string());
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
async fn connect(
    socket: &Path,
    attach: Attach<'_>,
    carry: Carry,
    profile: &str,
) -> Result<UnixStream, Refusal> {
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
    let hello = handshake(attach, carry, profile).map_err(io)?;
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

/// A relay's handshake: [`MAGIC`], the kind, the [`Carry`] (0 bytes, 1
/// descriptors), the profile name's length (one byte) and the name; then
/// for a first attach the 32-byte secret, for a resume the session id
/// (one-byte length, then the id) and the token (two-byte big-endian
/// length, then the token).
fn handshake(attach: Attach<'_>, carry: Carry, profile: &str) -> std::io::Result<Vec<u8>> {
    let too_long = |what: &str| std::io::Error::other(format!("{what} too long"));
    let profile = profile.as_bytes();
    let mut head = Vec::with_capacity(7 + profile.len() + SECRET_LEN);
    head.extend_from_slice(MAGIC);
    head.push(match attach {
        Attach::First(_) => FIRST_ATTACH,
        Attach::Resume { .. } => RESUME,
    });
    head.push(match carry {
        Carry::Bytes => 0,
        Carry::Fds => 1,
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
    handshake(Attach::Resume { session_id, token }, Carry::Bytes, profile)
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
    connect(
        socket,
        Attach::Resume { session_id, token },
        Carry::Bytes,
        profile,
    )
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

/// Hand the SSH side's descriptors to the host ([`Carry::Fds`]) with what
/// was read of its input first; once the host says it took them, wait, out
/// of the data path, until it says how the connection ended (or dies).
/// This process stays until then: sshd ends the channel's input when its
/// command exits. Why not, when the host did not take them (this process
/// still has the connection, the replay unsent to anyone).
async fn hand_over<R, W>(
    mut stream: UnixStream,
    replay: &[u8],
    input: &R,
    output: &W,
) -> Result<Ending, String>
where
    R: HandOver,
    W: HandOver,
{
    let (Some(in_fd), Some(out_fd)) = (input.hand_over(), output.hand_over()) else {
        return Err("nothing to hand over".into());
    };
    let len = u32::try_from(replay.len())
        .map_err(|_| "the first request is too long to hand over".to_string())?
        .to_be_bytes();
    let sent = async {
        loop {
            stream.writable().await?;
            let r = stream.try_io(tokio::io::Interest::WRITABLE, || {
                executor_sys::send_fds(
                    stream.as_fd(),
                    &len,
                    &[in_fd, out_fd],
                    nix::sys::socket::MsgFlags::MSG_DONTWAIT
                        | nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
                )
            });
            match r {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Ok(n) => break stream.write_all(&len[n..]).await?,
                Err(e) => return Err(e),
            }
        }
        stream.write_all(replay).await?;
        let mut answer = [0u8; 1];
        stream.read_exact(&mut answer).await?;
        Ok::<_, std::io::Error>(answer[0])
    };
    // No timeout of its own: the host answers within its own bound or
    // closes, and a relay that stopped waiting could not know whether the
    // host serves the descriptors (two readers of one stdin).
    match sent.await {
        Ok(super::TAKEN) => {}
        Ok(_) => return Err("it refused the descriptors (see its log)".into()),
        Err(e) => return Err(e.to_string()),
    }
    let mut said = [0u8; 1];
    let ending = match stream.read(&mut said).await {
        Ok(1) => super::ending_of(Some(said[0])),
        _ => super::ending_of(None),
    };
    Ok(ending)
}

/// A resume's handshake bytes, for the host's tests.
#[cfg(test)]
pub(super) fn handshake_for_test(session_id: &str, token: &str, profile: &str) -> Vec<u8> {
    handshake(Attach::Resume { session_id, token }, Carry::Bytes, profile).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use executor_protocol::message::encode_request;
    use executor_protocol::types::session::{
        ClientInfo, InitializeParams, ResumeParams, SessionParams,
    };

    fn first_frame(session: Option<SessionParams>) -> Vec<u8> {
        let p = InitializeParams {
            protocol_version: executor_protocol::PROTOCOL_VERSION,
            client: ClientInfo {
                name: "t".into(),
                version: "0".into(),
            },
            session,
            capabilities: None,
        };
        let mut f = Vec::new();
        encode_request(&mut f, 1, methods::INITIALIZE, &p, 1 << 20).unwrap();
        f[4..].to_vec()
    }

    #[test]
    fn the_first_frame_says_whether_to_relay() {
        assert!(matches!(wants(&first_frame(None)), Wants::Plain));
        let detach = SessionParams {
            detach_ttl_ms: Some(1000),
            ..Default::default()
        };
        assert!(matches!(wants(&first_frame(Some(detach))), Wants::Detach));
        let zero = SessionParams {
            detach_ttl_ms: Some(0),
            ..Default::default()
        };
        assert!(matches!(wants(&first_frame(Some(zero))), Wants::Plain));
        let resume = SessionParams {
            resume: Some(ResumeParams {
                session_id: "s".into(),
                token: "t".into(),
            }),
            ..Default::default()
        };
        assert!(matches!(
            wants(&first_frame(Some(resume))),
            Wants::Resume { session_id, token } if session_id == "s" && token == "t"
        ));
        assert!(matches!(wants(b"\x90"), Wants::Plain));
    }
}
