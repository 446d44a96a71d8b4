//! Detached sessions: the session host (this file) and the stdio relay in
//! front of it ([`relay`]); where the socket goes is [`dirs`].
//!
//! `initialize` with `session.detach_ttl_ms` > 0 makes the stdio `executor`
//! (the one sshd started) start a **session host**: the same binary as
//! `executor session-host`, in a process group of its own, listening on a
//! Unix socket named by version and session id in a 0700 directory of the
//! user's (the first of `$XDG_RUNTIME_DIR/executor`, `/tmp/executor-<uid>`
//! and `~/.cache/executor/run` that is the user's own: see [`dirs`]). The
//! stdio process then hands its stdin and stdout to the host, which serves
//! them directly ([`Carry::Fds`]), or, on a terminal, relays bytes. When
//! the SSH connection drops, the
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
use tokio_util::sync::CancellationToken;

pub mod dirs;
pub mod relay;

pub use relay::{begin_resume, resume_handshake, route, serve_stdio, HandOver, Launch, Route};

/// The send buffer asked for on a session host's connections.
const SOCKET_BUFFER: usize = 2 << 20;

/// First bytes of a relay's handshake (its layout: [`handshake`]).
const MAGIC: &[u8; 4] = b"EXR3";
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
/// The most bytes a relay replays before handing its descriptors over
/// (the first frame and what came with it: a frame of at most
/// `max_frame_bytes` and one read's worth), past that frame's bound.
const REPLAY_SLACK: usize = 1 << 20;
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
                // Room for a whole 1 MiB block's frame in the socket (the
                // kernel caps it at net.core.wmem_max): one wake-up of
                // the reader per block rather than one per 200 KiB.
                if let Err(e) = nix::sys::socket::setsockopt(
                    &stream,
                    nix::sys::socket::sockopt::SndBuf,
                    &SOCKET_BUFFER,
                ) {
                    tracing::debug!(error = %e, "SO_SNDBUF not set");
                }
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
    let (carry, hello) = match tokio::time::timeout(HANDSHAKE_WITHIN, read_hello(&mut stream)).await
    {
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
    // From here on, however the connection ends, a resume slot it holds
    // is freed.
    struct Slot<'a>(&'a std::sync::Mutex<Option<Pending>>, u64);
    impl Drop for Slot<'_> {
        fn drop(&mut self) {
            let mut p = self.0.lock().expect("pending lock");
            if p.as_ref().is_some_and(|p| p.connection == self.1) {
                *p = None;
            }
        }
    }
    let _slot = Slot(pending, this);
    stream.write_all(&[verdict]).await?;
    if verdict != ACCEPTED {
        return Err(std::io::Error::other(format!(
            "handshake refused ({verdict})"
        )));
    }
    let ending = match carry {
        Carry::Bytes => {
            let (reader, writer) = stream.into_split();
            serve_on(&session, reader, writer, false).await
        }
        Carry::Fds => {
            let max_replay = session.limits().max_frame_bytes as usize + REPLAY_SLACK;
            let taken = tokio::time::timeout(HANDSHAKE_WITHIN, take_stdio(&mut stream, max_replay))
                .await
                .unwrap_or_else(|_| {
                    Err(std::io::Error::other(
                        "the relay's descriptors did not come in time",
                    ))
                });
            // The relay hears whether they were taken: if not, it still
            // has them and answers its client itself.
            let handed = match taken {
                Ok(h) => h,
                Err(e) => {
                    let _ = stream.write_all(&[NOT_TAKEN]).await;
                    return Err(e);
                }
            };
            stream.write_all(&[TAKEN]).await?;
            // The relay sends nothing after its hand-over: any read of its
            // socket is its end.
            let (mut from_relay, mut to_relay) = stream.into_split();
            let gone = CancellationToken::new();
            let watch = tokio::spawn({
                let gone = gone.clone();
                async move {
                    let _ = from_relay.read(&mut [0u8; 1]).await;
                    gone.cancel();
                }
            });
            let input = UntilRelayGone::new(
                std::io::Cursor::new(handed.replay).chain(handed.input),
                &gone,
            );
            let output = RelayedOutput::new(handed.output, &gone);
            // Served on the SSH side's own pipes; both are closed when
            // this returns, before the relay hears how it ended.
            let ending = serve_on(&session, input, output, false).await;
            // A writer still stalled on the SSH side's stdout (serve_on
            // gave up waiting for it) fails now and lets go of it.
            gone.cancel();
            watch.abort();
            let _ = to_relay.write_all(&[ending_byte(&ending)]).await;
            ending
        }
    };
    tracing::info!(?ending, ?carry, "a connection to the session host ended");
    Ok(())
}

/// How a relay's connection reaches the host once its handshake is
/// accepted (a byte of the handshake: 0 and 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carry {
    /// The relay moves the bytes both ways over the socket.
    Bytes,
    /// The relay hands over its stdin and stdout (the SSH side: pipes or
    /// stream sockets) by `SCM_RIGHTS` in one message whose 4 bytes are
    /// the big-endian length of what it read of stdin first, which follows
    /// on the socket. The host answers one byte, [`TAKEN`] or (anything
    /// else, or nothing) not: then the relay still serves its client. Once
    /// taken, the host serves them directly (the relay leaves the data
    /// path) and, when the connection ends, closes them and writes one
    /// byte saying how it ended ([`ending_byte`]).
    Fds,
}

/// A handed-over connection's input, which ends once its relay is gone
/// (`gone` cancelled): a relay killed ends the connection as it did when
/// it carried the bytes, whoever still holds the other ends of its pipes.
struct UntilRelayGone<R> {
    input: R,
    gone: std::pin::Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
}

impl<R> UntilRelayGone<R> {
    fn new(input: R, gone: &CancellationToken) -> Self {
        UntilRelayGone {
            input,
            gone: Box::pin(gone.clone().cancelled_owned()),
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for UntilRelayGone<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if std::future::Future::poll(self.gone.as_mut(), cx).is_ready() {
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut self.input).poll_read(cx, buf)
    }
}

/// A handed-over connection's output, which fails (`BrokenPipe`) once its
/// relay is gone, as the relay's socket did: a writer stalled on a pipe
/// nobody reads lets go of what it holds.
struct RelayedOutput {
    output: tokio::net::unix::pipe::Sender,
    token: CancellationToken,
    gone: std::pin::Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
}

impl RelayedOutput {
    fn new(output: tokio::net::unix::pipe::Sender, gone: &CancellationToken) -> Self {
        RelayedOutput {
            output,
            token: gone.clone(),
            gone: Box::pin(gone.clone().cancelled_owned()),
        }
    }

    fn check(&mut self, cx: &mut std::task::Context<'_>) -> std::io::Result<()> {
        if std::future::Future::poll(self.gone.as_mut(), cx).is_ready() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the relay is gone",
            ));
        }
        Ok(())
    }
}

impl AsyncWrite for RelayedOutput {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.check(cx)?;
        std::pin::Pin::new(&mut self.output).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.check(cx)?;
        std::pin::Pin::new(&mut self.output).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.output.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.check(cx)?;
        std::pin::Pin::new(&mut self.output).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.output).poll_shutdown(cx)
    }
}

impl crate::conn::Output for RelayedOutput {
    fn splices(&self) -> bool {
        true
    }

    async fn splice_from<'a>(
        &'a mut self,
        from: std::os::fd::BorrowedFd<'a>,
        len: usize,
    ) -> std::io::Result<usize> {
        let RelayedOutput { output, token, .. } = self;
        tokio::select! {
            biased;
            _ = token.cancelled() => Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the relay is gone",
            )),
            r = output.splice_from(from, len) => r,
        }
    }
}

/// The host's answer to a relay's descriptors ([`Carry::Fds`]): taken (the
/// host serves them), or not (the relay keeps its connection).
const TAKEN: u8 = b'T';
const NOT_TAKEN: u8 = b'N';

/// How a handed-over connection ended, as the relay hears it.
fn ending_byte(e: &Ending) -> u8 {
    match e {
        Ending::Eof => 0,
        Ending::FramingLost => 1,
        Ending::BadLength => 2,
        Ending::OutputClosed => 3,
    }
}

/// The [`Ending`] of a byte from [`ending_byte`]; a connection whose host
/// said nothing (it died) ended with its input.
fn ending_of(b: Option<u8>) -> Ending {
    match b {
        Some(1) => Ending::FramingLost,
        Some(2) => Ending::BadLength,
        Some(3) => Ending::OutputClosed,
        _ => Ending::Eof,
    }
}

/// A relay's stdin and stdout, handed over, and what it read of stdin
/// before.
struct Handed {
    replay: Vec<u8>,
    input: tokio::net::unix::pipe::Receiver,
    output: tokio::net::unix::pipe::Sender,
}

/// Take a relay's descriptors ([`Carry::Fds`]): exactly two, a pipe or a
/// socket each, the first open for reading and the second for writing;
/// anything else is refused (and closed).
async fn take_stdio(stream: &mut UnixStream, max_replay: usize) -> std::io::Result<Handed> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    use nix::sys::stat::{fstat, SFlag};
    use std::os::fd::AsFd;
    let bad = |what: String| std::io::Error::other(format!("the relay's hand-over: {what}"));
    let mut head = [0u8; 4];
    let got = loop {
        stream.readable().await?;
        let r = stream.try_io(tokio::io::Interest::READABLE, || {
            executor_sys::recv_fds::<2>(
                stream.as_fd(),
                &mut head,
                nix::sys::socket::MsgFlags::MSG_DONTWAIT,
            )
        });
        match r {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            r => break r?,
        }
    };
    if got.bytes == 0 {
        return Err(bad("the relay closed before it".into()));
    }
    if got.truncated || got.fds.len() != 2 {
        return Err(bad(format!(
            "{} descriptors{}, not stdin and stdout",
            got.fds.len(),
            if got.truncated { " (cut short)" } else { "" }
        )));
    }
    stream.read_exact(&mut head[got.bytes..]).await?;
    let len = u32::from_be_bytes(head) as usize;
    if len > max_replay {
        return Err(bad(format!(
            "a replay of {len} bytes (at most {max_replay})"
        )));
    }
    let mut replay = vec![0u8; len];
    stream.read_exact(&mut replay).await?;
    let mut fds = got.fds.into_iter();
    let (input, output) = (fds.next().expect("two"), fds.next().expect("two"));
    // Both checked before either is changed.
    let mut flags = Vec::with_capacity(2);
    for (fd, name, access) in [
        (&input, "stdin", [OFlag::O_RDONLY, OFlag::O_RDWR]),
        (&output, "stdout", [OFlag::O_WRONLY, OFlag::O_RDWR]),
    ] {
        let kind = SFlag::from_bits_truncate(fstat(fd.as_fd())?.st_mode) & SFlag::S_IFMT;
        let stream_socket = kind == SFlag::S_IFSOCK
            && nix::sys::socket::getsockopt(fd, nix::sys::socket::sockopt::SockType)
                .is_ok_and(|t| t == nix::sys::socket::SockType::Stream);
        if kind != SFlag::S_IFIFO && !stream_socket {
            return Err(bad(format!("its {name} is not a pipe or a stream socket")));
        }
        let f = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
        if !access.contains(&(f & OFlag::O_ACCMODE)) {
            return Err(bad(format!("its {name} is not open for that")));
        }
        flags.push(f);
    }
    for (fd, f) in [&input, &output].into_iter().zip(flags) {
        fcntl(fd, FcntlArg::F_SETFL(f | OFlag::O_NONBLOCK))?;
    }
    Ok(Handed {
        replay,
        input: tokio::net::unix::pipe::Receiver::from_owned_fd_unchecked(input)?,
        output: tokio::net::unix::pipe::Sender::from_owned_fd_unchecked(output)?,
    })
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
async fn read_hello(stream: &mut UnixStream) -> std::io::Result<(Carry, Hello)> {
    let bad = |what: &str| std::io::Error::other(format!("bad handshake: {what}"));
    let mut head = [0u8; 7];
    stream.read_exact(&mut head).await?;
    if &head[..4] != MAGIC {
        return Err(bad("not a relay's"));
    }
    let carry = match head[5] {
        0 => Carry::Bytes,
        1 => Carry::Fds,
        _ => return Err(bad("unknown carry")),
    };
    let (kind, profile_len) = (head[4], head[6] as usize);
    let mut profile = vec![0u8; profile_len];
    stream.read_exact(&mut profile).await?;
    match kind {
        FIRST_ATTACH => {
            let mut secret = [0u8; SECRET_LEN];
            stream.read_exact(&mut secret).await?;
            Ok((carry, Hello::FirstAttach { profile, secret }))
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
            Ok((
                carry,
                Hello::Resume {
                    profile,
                    session_id: String::from_utf8(id).map_err(|_| bad("session id not UTF-8"))?,
                    token: String::from_utf8(token).map_err(|_| bad("token not UTF-8"))?,
                },
            ))
        }
        _ => Err(bad("unknown kind")),
    }
}

#[cfg(test)]
mod tests {
    use super::relay::handshake_for_test;
    use super::*;

    #[test]
    fn a_socket_is_named_only_by_a_well_formed_session_id() {
        let dir = Path::new("/run/x");
        let id = "0123456789abcdef0123456789abcdef";
        let p = socket_path(dir, id).unwrap();
        assert!(p.starts_with(dir) && p.to_string_lossy().ends_with(&format!("-{id}.sock")));
        for bad in ["", "../../etc/passwd", &id[1..], &format!("{}g", &id[1..])] {
            assert!(socket_path(dir, bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn host_args_survive_their_line() {
        let args = HostArgs {
            session_id: "ab".repeat(16),
            secret: [7; SECRET_LEN],
            socket: PathBuf::from("/tmp/a socket"),
        };
        let back = HostArgs::parse(&args.line()).unwrap();
        assert_eq!(back.session_id, args.session_id);
        assert_eq!(back.secret, args.secret);
        assert_eq!(back.socket, args.socket);
        assert!(HostArgs::parse("id short /s").is_err());
        assert!(HostArgs::parse("just-one").is_err());
    }

    #[tokio::test]
    async fn a_handshake_reads_back_as_what_the_relay_sent() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let hello = handshake_for_test("sess", "tok", "reader");
        a.write_all(&hello).await.unwrap();
        match read_hello(&mut b).await.unwrap().1 {
            Hello::Resume {
                profile,
                session_id,
                token,
            } => {
                assert_eq!(profile, b"reader");
                assert_eq!((session_id.as_str(), token.as_str()), ("sess", "tok"));
            }
            Hello::FirstAttach { .. } => panic!("read as a first attach"),
        }
        // Not a relay's: refused.
        a.write_all(b"HTTP/1.1 ").await.unwrap();
        assert!(read_hello(&mut b).await.is_err());
    }
}
