//! # executor-client
//!
//! A thin async client for the `executor` agent. It speaks the wire protocol
//! of `executor-protocol` over any `AsyncRead + AsyncWrite` pair, or over the
//! stdio of a command it spawns: a [`Target`] is a list of transports (the
//! local `executor`, `ssh devbox executor`, any command) tried in turn. It
//! does `initialize` for you. The `executor-client` command line is another
//! crate (`executor-cli`): this one depends on no command-line crate
//! (`tests/deps.rs` checks).
//!
//! - every request as [`Client::call`]`(&params)`; the other methods of
//!   [`Client`] add behaviour: jobs as [`Process`] handles, streamed reads
//!   and writes ([`fs`]), walks, the fs helpers under the client's sandbox
//!   intent ([`Client::with_sandbox`]), streamed HTTP ([`http`]), sessions
//!   resumed on a new transport ([`Client::reconnect`]);
//! - many requests in flight, matched by id ([`Client::request`]), or
//!   typed by the protocol's method table: [`Client::call`] takes any
//!   params type and answers its result type (`client.call(&StatParams {
//!   .. })` is `fs/stat`, answered as a `StatResult`);
//! - notifications by subscription ([`Client::subscribe`]);
//! - typed errors: [`Error::Remote`] carries the agent's [`WireError`] and its
//!   [`ErrorCode`]; transport trouble is [`Error::Io`] / [`Error::Closed`];
//! - a login shell's banner before the agent's preamble is skipped (up to
//!   64 KiB; beyond that, or at EOF, [`Error::Preamble`] quotes what it saw).
//!
//! ```
//! # // The examples run against the workspace's own agent (build it first:
//! # // `cargo build --workspace --bins`).
//! # std::env::set_var("EXECUTOR_BIN", concat!(env!("CARGO_MANIFEST_DIR"), "/../target/debug/executor"));
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use executor_client::{Client, Target};
//! use executor_protocol::types::process::ProcessStartParams;
//! use executor_protocol::types::session::EnvironmentInfoParams;
//!
//! let client = Client::connect_target(&Target::local(), Default::default()).await?;
//! // Any request: its params type names the method and the result type.
//! let info = client.call(&EnvironmentInfoParams {}).await?;
//! assert_eq!(info.path_separator, "/");
//!
//! // Run a command and collect its output.
//! let env = [("PATH".to_string(), "/usr/bin:/bin".to_string())].into();
//! let argv = vec!["sh".into(), "-c".into(), "echo hello; exit 3".into()];
//! let mut job = client.start(&ProcessStartParams::new(argv, "/", env)).await?;
//! let mut out = Vec::new();
//! while let Some(chunk) = job.next_output().await? {
//!     out.extend_from_slice(&chunk.data);
//! }
//! assert_eq!(out, b"hello\n");
//! assert_eq!(job.exit_status().unwrap().code, Some(3));
//!
//! // Files: write atomically, read back.
//! let path = std::env::temp_dir().join(format!("executor-doc-{}", std::process::id()));
//! client.write_file(path.to_str().unwrap(), b"data").await?;
//! assert_eq!(client.read_file(path.to_str().unwrap()).await?, b"data");
//! # std::fs::remove_file(&path).unwrap();
//! client.close().await?;
//! # Ok::<(), executor_client::Error>(()) }).unwrap();
//! ```
//!
//! Sandboxed, as `landrun --rw DIR cmd`: build an intent with
//! [`sandbox::Intent`], give it to a job (`ProcessStartParams::sandbox`) or
//! to every fs request of a client ([`Client::with_sandbox`]).
//!
//! ```
//! # std::env::set_var("EXECUTOR_BIN", concat!(env!("CARGO_MANIFEST_DIR"), "/../target/debug/executor"));
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use executor_client::sandbox::{Intent, Net};
//! use executor_client::{Client, ErrorCode, Target};
//! use executor_protocol::types::process::ProcessStartParams;
//!
//! let work = std::env::temp_dir().join(format!("executor-doc-sbx-{}", std::process::id()));
//! std::fs::create_dir_all(&work).unwrap();
//! let work = work.to_str().unwrap().to_string();
//! let intent = Intent::new().write(work.as_str()).net(Net::Deny).build();
//! let client = Client::connect_target(&Target::local(), Default::default()).await?;
//!
//! let env = [("PATH".to_string(), "/usr/bin:/bin".to_string())].into();
//! let script = format!("touch {work}/ok && touch /etc/not-ok");
//! let mut params = ProcessStartParams::new(vec!["sh".into(), "-c".into(), script], "/", env);
//! params.sandbox = Some(intent.clone());
//! let job = client.start(&params).await?;
//! assert!(job.sandbox_degraded().is_empty(), "all of it enforced");
//! let status = job.wait().await?;
//! assert!(status.sandbox_denied && !status.success());
//!
//! // The fs helpers under the same intent.
//! let confined = client.with_sandbox(Some(intent));
//! confined.write_file(format!("{work}/f").as_str(), b"in").await?;
//! let denied = confined.write_file("/etc/executor-doc", b"out").await.unwrap_err();
//! assert_eq!(denied.code(), Some(ErrorCode::SandboxDenied));
//! # std::fs::remove_dir_all(&work).unwrap();
//! client.close().await?;
//! # Ok::<(), executor_client::Error>(()) }).unwrap();
//! ```
#![forbid(unsafe_code)]

/// The README's Rust snippets, as doc tests: each compiles, and those not
/// marked `no_run` run against the workspace's `target/debug/executor`.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

pub mod bootstrap;
pub mod egress;
pub mod fs;
pub mod http;
#[cfg(feature = "mcp")]
pub mod mcp;
#[cfg(feature = "native-ssh")]
pub mod native_ssh;
mod process;
pub mod sandbox;
mod sink;
mod stderr_relay;
pub mod target;

pub use executor_protocol as protocol;
pub use executor_protocol::{ErrorCode, WireError};
pub use process::{ExitStatus, Output, Process, ProcessControl};
pub use target::{SshOptions, Target, Transport};

use bytes::{Bytes, BytesMut};
use executor_protocol::codec::{self, FrameDecoder};
use executor_protocol::limits::MAX_FRAME_BYTES;
use executor_protocol::message::{encode_notification, encode_request};
use executor_protocol::types::fs::ReadStreamResult;
use executor_protocol::types::session::{
    ClientInfo, InitializeParams, InitializeResult, SessionParams,
};
use executor_protocol::{methods, MAX_PREAMBLE_NOISE, PREAMBLE, PROTOCOL_VERSION};
use rmpv::Value;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

/// `s` with its line breaks as `\n` / `\r`: an agent's message (which may
/// quote a name a job chose) never forges a line of its own.
fn one_line(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains(['\n', '\r']) {
        std::borrow::Cow::Owned(s.replace('\n', "\\n").replace('\r', "\\r"))
    } else {
        std::borrow::Cow::Borrowed(s)
    }
}

/// Everything that can go wrong talking to an agent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The agent answered with an error. Its message is shown on one
    /// line: a line break in it (a remote name holding one) is `\n`.
    #[error("agent error {}: {}", .0.code, one_line(&.0.message))]
    Remote(WireError),
    /// Reading or writing the transport failed.
    #[error("transport I/O: {0}")]
    Io(#[from] std::io::Error),
    /// No preamble where one was expected.
    #[error("no executor preamble: {reason}; first bytes seen: {seen:?}")]
    Preamble { reason: String, seen: String },
    /// The connection is closed.
    #[error("connection closed: {0}")]
    Closed(String),
    /// The agent sent something that is not the protocol.
    #[error("protocol violation from the agent: {0}")]
    Protocol(String),
    /// A result did not have the expected shape.
    #[error("unexpected result for {method}: {message}")]
    Decode { method: String, message: String },
    /// A request could not be encoded (too large for a frame).
    #[error("cannot send {method}: {message}")]
    Encode { method: String, message: String },
    /// The transport command (`ssh`, the local `executor`) ended before
    /// the agent answered `initialize` (a configuration error, a refused
    /// profile, no agent on the host, ssh's own failure): its exit code
    /// (`None` when a signal ended it), its status as text and the last of
    /// its stderr (already passed on to ours). `ssh` exits 255 for its own
    /// failures and passes on 127 from a remote shell that did not find the
    /// command.
    #[error("{program} exited {} before the agent started: {stderr}", .code.map_or_else(|| status.clone(), |c| c.to_string()))]
    Exited {
        program: String,
        code: Option<i32>,
        status: String,
        stderr: String,
    },
    /// The transport command could not be started.
    #[error("cannot start {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    /// The preamble or `initialize` did not arrive in time
    /// ([`ClientOptions::connect_timeout`]).
    #[error("no answer from the agent within {after:?} ({what})")]
    Timeout {
        what: &'static str,
        after: std::time::Duration,
    },
    /// The agent's preamble names another wire version.
    #[error("the agent speaks wire {agent}, this client speaks {PROTOCOL_VERSION}")]
    WireVersion { agent: String },
    /// No transport of a [`Target`] connected (it had none, or several
    /// that all failed): each transport as text, with its error.
    #[error("no transport reached an agent: {}", transports_failed(.0))]
    Transports(Vec<(String, Error)>),
    /// Writing the descriptor given to [`Client::read_stream_into`]
    /// failed (`BrokenPipe` when its reader is gone), or it is not one
    /// open for writing.
    #[error("writing the sink: {0}")]
    Sink(#[source] std::io::Error),
}

fn transports_failed(failed: &[(String, Error)]) -> String {
    if failed.is_empty() {
        return "the target has no transport".into();
    }
    let each: Vec<String> = failed.iter().map(|(t, e)| format!("{t}: {e}")).collect();
    each.join("; ")
}

impl Error {
    /// The wire code when the agent answered with an error.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Remote(e) => Some(e.code),
            _ => None,
        }
    }
}

/// A notification from the agent. Its params are decoded on demand,
/// straight from the frame into the type asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct Notification {
    pub method: String,
    process_id: Option<String>,
    stream_id: Option<u64>,
    frame: Bytes,
}

#[derive(serde::Deserialize)]
struct ParamsOf<T> {
    params: T,
}

#[derive(serde::Deserialize)]
struct ResultOf<T> {
    result: T,
}

impl Notification {
    /// Decode the params into their typed form.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, Error> {
        rmp_serde::from_slice::<ParamsOf<T>>(&self.frame)
            .map(|p| p.params)
            .map_err(|e| Error::Decode {
                method: self.method.clone(),
                message: e.to_string(),
            })
    }

    /// Decode the params into their typed form.
    pub fn into_decoded<T: DeserializeOwned>(self) -> Result<T, Error> {
        self.decode()
    }

    /// The params as a MessagePack value.
    pub fn params(&self) -> Result<Value, Error> {
        self.decode()
    }

    /// Decode the params in one pass into a type that may borrow from the
    /// frame (e.g. `data: &serde_bytes::Bytes`); turn borrowed bytes into
    /// owned ones without copying with [`Notification::share`].
    pub fn decode_borrowed<'a, T: serde::Deserialize<'a>>(&'a self) -> Result<T, Error> {
        rmp_serde::from_slice::<ParamsOf<T>>(&self.frame)
            .map(|p| p.params)
            .map_err(|e| Error::Decode {
                method: self.method.clone(),
                message: e.to_string(),
            })
    }

    /// A part of this notification's frame as `Bytes` sharing it (no copy).
    pub fn share(&self, part: &[u8]) -> Bytes {
        self.frame.slice_ref(part)
    }

    /// `params.process_id`, when there is one.
    pub fn process_id(&self) -> Option<&str> {
        self.process_id.as_deref()
    }

    /// `params.stream_id`, when there is one.
    pub fn stream_id(&self) -> Option<u64> {
        self.stream_id
    }
}

/// How [`Client::reconnect`] retries: `attempts` tries in all, waiting
/// `initial`, then twice as long each time, at most `max`.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub attempts: u32,
    pub initial: std::time::Duration,
    pub max: std::time::Duration,
}

impl Default for Backoff {
    /// 8 attempts over about a minute.
    fn default() -> Self {
        Backoff {
            attempts: 8,
            initial: std::time::Duration::from_millis(250),
            max: std::time::Duration::from_secs(15),
        }
    }
}

/// Options for connecting.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Reported to the agent in `initialize`.
    pub client_name: String,
    /// Session options sent with `initialize`.
    pub session: Option<SessionParams>,
    /// The bound on the preamble and on the `initialize` answer, each
    /// ([`Error::Timeout`] past it); `None` waits for ever. Default 30 s.
    pub connect_timeout: Option<std::time::Duration>,
    /// Answers the agent's `network/policyRequest` (jobs with egress by
    /// name and `"ask": true`); with it, `initialize` declares
    /// `capabilities.agent_requests`.
    pub egress_policy: Option<egress::EgressPolicy>,
}

/// The default [`ClientOptions::connect_timeout`].
pub const DEFAULT_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            client_name: "executor-client".into(),
            session: None,
            connect_timeout: Some(DEFAULT_CONNECT_TIMEOUT),
            egress_policy: None,
        }
    }
}

/// Ask for a pipe buffer of 1 MiB (the unprivileged maximum by default)
/// instead of 64 KiB on a transport pipe: the transport (ssh) writes a
/// block in one go and the reader wakes once per block, not sixteen times.
/// Best effort: anything but a pipe keeps what it has.
fn widen_pipe(fd: &impl std::os::fd::AsFd) {
    #[cfg(target_os = "linux")]
    {
        let _ = nix::fcntl::fcntl(fd.as_fd(), nix::fcntl::FcntlArg::F_SETPIPE_SZ(1 << 20));
    }
    #[cfg(not(target_os = "linux"))]
    let _ = fd;
}

/// `fut`, bounded by `limit` when there is one.
async fn bounded<T>(
    limit: Option<std::time::Duration>,
    what: &'static str,
    fut: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    match limit {
        Some(after) => tokio::time::timeout(after, fut)
            .await
            .map_err(|_| Error::Timeout { what, after })?,
        None => fut.await,
    }
}

type Reply = Result<Bytes, WireError>;
struct Subscriber {
    id: u64,
    methods: Vec<String>,
    process_id: Option<String>,
    stream_id: Option<u64>,
    tx: mpsc::UnboundedSender<Notification>,
}

#[derive(Default)]
struct Shared {
    next_sub: u64,
    pending: HashMap<u64, oneshot::Sender<Reply>>,
    subscribers: Vec<Subscriber>,
    /// `fs/readStream` requests of [`Client::read_stream_into`] not yet
    /// answered, by request id: their answer registers the sink.
    sink_requests: HashMap<u64, sink::SinkEntry>,
    /// Read streams whose data the reader gives to a sink, by stream id.
    sinks: HashMap<u64, sink::SinkEntry>,
    closed: Option<String>,
}

impl Shared {
    /// The connection is gone: dropping the senders wakes every waiter
    /// with `Closed`.
    fn close(&mut self) {
        self.pending.clear();
        self.subscribers.clear();
        self.sink_requests.clear();
        self.sinks.clear();
    }
}

struct Inner {
    next_id: AtomicU64,
    shared: Mutex<Shared>,
    max_frame: usize,
    /// The reader takes frames from a pipe it can `splice(2)` from.
    splice: bool,
    /// Answers requests from the agent, on the writer's queue (weak: the
    /// connection closes when the client lets go of it).
    answers: Option<(egress::EgressPolicy, mpsc::WeakSender<Vec<u8>>)>,
}

struct Conn {
    inner: Arc<Inner>,
    /// The only sender to the writer task: taking it closes our side.
    out: Mutex<Option<mpsc::Sender<Vec<u8>>>>,
    init: InitializeResult,
    child: Mutex<Option<tokio::process::Child>>,
    /// The relay of the spawned transport's stderr, drained by
    /// [`Client::close`] once the transport exited.
    relay: Mutex<Option<stderr_relay::Relay>>,
    /// What the transport needs kept (a native SSH session).
    #[allow(dead_code)]
    keep: Mutex<Option<Box<dyn std::any::Any + Send>>>,
}

/// A connection to an agent, initialized and ready. Cheap to clone: clones
/// share the connection (and [`Process`] handles hold one).
#[derive(Clone)]
pub struct Client {
    conn: Arc<Conn>,
    /// The intent the fs helpers send ([`Client::with_sandbox`]).
    intent: Option<Arc<executor_protocol::types::sandbox::SandboxIntent>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("session_id", &self.conn.init.session_id)
            .finish_non_exhaustive()
    }
}

/// A request sent and not yet answered.
#[derive(Debug)]
pub struct Call {
    id: u64,
    method: String,
    rx: oneshot::Receiver<Reply>,
}

impl Call {
    /// The request's id (for `$/cancel`).
    pub fn id(&self) -> u64 {
        self.id
    }

    async fn frame(self) -> Result<(String, Bytes), Error> {
        match self.rx.await {
            Ok(Ok(frame)) => Ok((self.method, frame)),
            Ok(Err(e)) => Err(Error::Remote(e)),
            Err(_) => Err(Error::Closed(format!(
                "no answer to {} (id {})",
                self.method, self.id
            ))),
        }
    }

    /// Wait for the answer as a raw value.
    pub async fn value(self) -> Result<Value, Error> {
        self.result().await
    }

    /// Wait for the answer as its frame, to decode in one pass into a type
    /// borrowing from it ([`RawResult::decode`]).
    pub async fn raw(self) -> Result<RawResult, Error> {
        let (method, frame) = self.frame().await?;
        Ok(RawResult { method, frame })
    }

    /// Wait for the answer in its typed form (decoded straight from the
    /// frame: no intermediate value tree).
    pub async fn result<R: DeserializeOwned>(self) -> Result<R, Error> {
        let (method, frame) = self.frame().await?;
        rmp_serde::from_slice::<ResultOf<R>>(&frame)
            .map(|r| r.result)
            .map_err(|e| Error::Decode {
                method,
                message: e.to_string(),
            })
    }
}

/// An answer kept as its frame.
#[derive(Debug, Clone)]
pub struct RawResult {
    method: String,
    frame: Bytes,
}

impl RawResult {
    /// Decode `result` in one pass; `T` may borrow from the frame.
    pub fn decode<'a, T: serde::Deserialize<'a>>(&'a self) -> Result<T, Error> {
        rmp_serde::from_slice::<ResultOf<T>>(&self.frame)
            .map(|r| r.result)
            .map_err(|e| Error::Decode {
                method: self.method.clone(),
                message: e.to_string(),
            })
    }

    /// A part of the frame as `Bytes` sharing it (no copy).
    pub fn share(&self, part: &[u8]) -> Bytes {
        self.frame.slice_ref(part)
    }
}

/// A stream of notifications; ends when the connection closes.
#[derive(Debug)]
pub struct Subscription {
    id: u64,
    backlog: std::collections::VecDeque<Notification>,
    rx: mpsc::UnboundedReceiver<Notification>,
}

impl Subscription {
    /// The next notification, `None` once the connection is closed.
    pub async fn recv(&mut self) -> Option<Notification> {
        if let Some(n) = self.backlog.pop_front() {
            return Some(n);
        }
        self.rx.recv().await
    }
}

impl Client {
    /// Connect over a byte stream pair: skip noise up to the preamble, then
    /// `initialize`.
    pub async fn connect<R, W>(
        reader: R,
        writer: W,
        options: ClientOptions,
    ) -> Result<Client, Error>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        Client::connect_transport(AnyTransport(reader), writer, options).await
    }

    async fn connect_transport<R, W>(
        mut reader: R,
        writer: W,
        options: ClientOptions,
    ) -> Result<Client, Error>
    where
        R: ByteSource,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let limit = options.connect_timeout;
        let leftover = bounded(
            limit,
            "waiting for the preamble",
            read_preamble(&mut reader),
        )
        .await?;
        let (out_tx, out_rx) = mpsc::channel::<Vec<u8>>(1024);
        let inner = Arc::new(Inner {
            next_id: AtomicU64::new(1),
            shared: Mutex::new(Shared::default()),
            max_frame: MAX_FRAME_BYTES as usize,
            splice: reader.splices(),
            answers: options
                .egress_policy
                .clone()
                .map(|p| (p, out_tx.downgrade())),
        });
        tokio::spawn(write_loop(writer, out_rx, Arc::downgrade(&inner)));
        tokio::spawn(read_loop(reader, leftover, inner.clone()));
        let params = InitializeParams {
            protocol_version: PROTOCOL_VERSION,
            client: ClientInfo {
                name: options.client_name.clone(),
                version: env!("CARGO_PKG_VERSION").into(),
            },
            session: options.session.clone(),
            capabilities: options.egress_policy.is_some().then_some(
                executor_protocol::types::session::ClientCapabilities {
                    agent_requests: true,
                    descriptors: false,
                },
            ),
        };
        let init: InitializeResult = bounded(limit, "waiting for the initialize answer", async {
            send_call(&inner, &out_tx, methods::INITIALIZE, &params, None)
                .await?
                .result()
                .await
        })
        .await?;
        Ok(Client {
            conn: Arc::new(Conn {
                inner,
                out: Mutex::new(Some(out_tx)),
                init,
                child: Mutex::new(None),
                relay: Mutex::new(None),
                keep: Mutex::new(None),
            }),
            intent: None,
        })
    }

    /// This client (the same connection) with `intent` sent on every
    /// request of its fs helpers (`stat`, `read_stream`, `write_stream`,
    /// `walk`, …); `None` sends none (the profile's default intent applies).
    pub fn with_sandbox(
        &self,
        intent: Option<executor_protocol::types::sandbox::SandboxIntent>,
    ) -> Client {
        Client {
            conn: self.conn.clone(),
            intent: intent.map(Arc::new),
        }
    }

    /// The intent the fs helpers send.
    pub fn sandbox(&self) -> Option<&executor_protocol::types::sandbox::SandboxIntent> {
        self.intent.as_deref()
    }

    pub(crate) fn intent(&self) -> Option<executor_protocol::types::sandbox::SandboxIntent> {
        self.intent.as_deref().cloned()
    }

    /// Spawn `command` (which must speak the protocol on its stdio, e.g. the
    /// local `executor` or `ssh host executor`) and connect to it. Its stderr
    /// is passed on to ours (see `stderr_relay`); when it ends before the
    /// agent answered, the error is [`Error::Exited`] with its own words.
    pub async fn spawn(
        mut command: tokio::process::Command,
        options: ClientOptions,
    ) -> Result<Client, Error> {
        let program = command
            .as_std()
            .get_program()
            .to_string_lossy()
            .into_owned();
        command
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let child = command.spawn().map_err(|source| Error::Spawn {
            program: program.clone(),
            source,
        })?;
        Client::from_child(child, &program, options).await
    }

    /// Connect to a transport command already spawned with piped stdin and
    /// stdout (for a caller that must act between the spawn and the
    /// preamble, e.g. hand it the terminal). When the connection fails
    /// because the command exited first, the error is [`Error::Exited`]
    /// with its exit status (and the last of its stderr when it is piped).
    pub async fn from_child(
        mut child: tokio::process::Child,
        program: &str,
        options: ClientOptions,
    ) -> Result<Client, Error> {
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| Error::Closed("child has no stdin".into()))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| Error::Closed("child has no stdout".into()))?;
        let relay = child.stderr.take().map(stderr_relay::Relay::start);
        widen_pipe(&stdout);
        widen_pipe(&stdin);
        // Our end of the pipe as a tokio pipe: the reader may splice from it.
        let stdout = tokio::net::unix::pipe::Receiver::from_owned_fd(stdout.into_owned_fd()?)?;
        let client = match Client::connect_transport(stdout, stdin, options).await {
            Ok(c) => c,
            Err(e) if !ended_early(&e) => return Err(e),
            Err(e) => {
                return Err(match relay {
                    Some(r) => r.explain(&mut child, program, e).await,
                    None => stderr_relay::explain_inherited(&mut child, program, e).await,
                })
            }
        };
        *client.conn.child.lock().expect("child lock") = Some(child);
        *client.conn.relay.lock().expect("relay lock") = relay;
        Ok(client)
    }

    /// Connect to a [`Target`]: its transports in turn, each spawned as
    /// [`Client::spawn`] does, until one connects. A transport that cannot
    /// start, ends before the agent answered or does not answer in time
    /// passes to the next (logged at info); an agent's answer
    /// ([`Error::Remote`]: a refused session, a wrong resume token) is
    /// final. When none connects, a target of one transport fails with its
    /// error, one of several with [`Error::Transports`] naming each.
    pub async fn connect_target(target: &Target, options: ClientOptions) -> Result<Client, Error> {
        let mut failed = Vec::new();
        for transport in target.transports() {
            let attempt = match transport.command() {
                Ok(cmd) => Client::spawn(cmd, options.clone()).await,
                Err(e) => Err(e),
            };
            match attempt {
                Ok(c) => return Ok(c),
                Err(e @ Error::Remote(_)) => return Err(e),
                Err(e) => {
                    tracing::info!(%transport, error = %e, "transport failed");
                    failed.push((transport.to_string(), e));
                }
            }
        }
        match failed.len() {
            1 => Err(failed.remove(0).1),
            _ => Err(Error::Transports(failed)),
        }
    }

    /// Keep `what` (part of the transport) alive as long as the connection.
    #[allow(dead_code)]
    pub(crate) fn keep_alive(&self, what: Box<dyn std::any::Any + Send>) {
        *self.conn.keep.lock().expect("keep lock") = Some(what);
    }

    /// The pid of the transport command this client spawned (the local
    /// `executor`, or `ssh`), while it runs.
    pub fn transport_pid(&self) -> Option<u32> {
        self.conn
            .child
            .lock()
            .expect("child lock")
            .as_ref()
            .and_then(|c| c.id())
    }

    /// The options that resume this client's session (id and token) on a
    /// new transport; the session must have been started with
    /// `detach_ttl_ms`.
    pub fn resume_options(&self) -> ClientOptions {
        ClientOptions {
            session: Some(SessionParams {
                resume: Some(executor_protocol::types::session::ResumeParams {
                    session_id: self.conn.init.session_id.clone(),
                    token: self.conn.init.resume_token.clone(),
                }),
                detach_ttl_ms: None,
            }),
            ..ClientOptions::default()
        }
    }

    /// Resume this client's (detached) session on a new transport that
    /// `connect` makes from the options it is given (for example
    /// `|o| Client::connect_target(&target, o)`), retrying failures of the
    /// transport (and `session_busy`) with exponential backoff. Any other
    /// answer of the agent (`session_expired`: unknown, expired, wrong
    /// token, other profile) is final and returned at once. A job's
    /// [`Process`] goes on on the new client with [`Process::resume_on`]
    /// (its output from the first chunk not yet received). Requests in
    /// flight when the transport died are not sent again: a start or a
    /// write the caller retries happens once if it carries a key
    /// ([`ProcessStartParams::with_idempotency_key`],
    /// [`Process::write_once`]).
    ///
    /// [`ProcessStartParams::with_idempotency_key`]: executor_protocol::types::process::ProcessStartParams::with_idempotency_key
    pub async fn reconnect<F, Fut>(&self, mut connect: F, backoff: Backoff) -> Result<Client, Error>
    where
        F: FnMut(ClientOptions) -> Fut,
        Fut: std::future::Future<Output = Result<Client, Error>>,
    {
        let mut delay = backoff.initial;
        let mut attempt = 1;
        loop {
            match connect(self.resume_options()).await {
                Ok(c) => return Ok(c),
                // `session_busy` passes (another resume is being set up);
                // any other answer of the agent is final.
                Err(e @ Error::Remote(_)) if e.code() != Some(ErrorCode::SessionBusy) => {
                    return Err(e)
                }
                Err(e) if attempt >= backoff.attempts => return Err(e),
                Err(e) => {
                    tracing::info!(attempt, error = %e, ?delay, "reconnect failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(backoff.max);
                    attempt += 1;
                }
            }
        }
    }

    /// What `initialize` answered.
    pub fn initialize_result(&self) -> &InitializeResult {
        &self.conn.init
    }

    fn sender(&self) -> Result<mpsc::Sender<Vec<u8>>, Error> {
        self.conn
            .out
            .lock()
            .expect("client lock")
            .clone()
            .ok_or_else(|| Error::Closed("the client was closed".into()))
    }

    /// Send a request by method name; the returned [`Call`] resolves to its
    /// answer; its id is what [`Client::cancel`] takes.
    pub async fn start_call<P: Serialize>(&self, method: &str, params: &P) -> Result<Call, Error> {
        send_call(&self.conn.inner, &self.sender()?, method, params, None).await
    }

    /// [`Client::start_call`] of an `fs/readStream` whose data the
    /// connection reader writes into `sink` (the answer registers it).
    pub(crate) async fn start_call_into<P: Serialize>(
        &self,
        method: &str,
        params: &P,
        sink: sink::SinkEntry,
    ) -> Result<Call, Error> {
        send_call(
            &self.conn.inner,
            &self.sender()?,
            method,
            params,
            Some(sink),
        )
        .await
    }

    /// Whether the reader can splice from the transport.
    pub(crate) fn splices(&self) -> bool {
        self.conn.inner.splice
    }

    /// Stop giving stream `stream_id`'s frames to a sink.
    pub(crate) fn unregister_sink(&self, stream_id: u64) {
        let mut shared = self.conn.inner.shared.lock().expect("client lock");
        shared.sinks.remove(&stream_id);
    }

    /// Send a request and wait for its typed result.
    pub async fn request<P: Serialize, R: DeserializeOwned>(
        &self,
        method: &str,
        params: &P,
    ) -> Result<R, Error> {
        self.start_call(method, params).await?.result().await
    }

    /// Send the request `params` belong to (the method comes from the
    /// protocol's table, [`executor_protocol::methods::Request`]) and wait
    /// for its typed result: `client.call(&StatParams { .. })` is
    /// `fs/stat`, answered as a `StatResult`.
    pub async fn call<P: executor_protocol::methods::Request>(
        &self,
        params: &P,
    ) -> Result<P::Result, Error> {
        self.request(P::METHOD, params).await
    }

    /// Send a notification.
    pub async fn notify<P: Serialize>(&self, method: &str, params: &P) -> Result<(), Error> {
        let mut frame = Vec::new();
        encode_notification(&mut frame, method, params, self.conn.inner.max_frame).map_err(
            |e| Error::Encode {
                method: method.into(),
                message: e.to_string(),
            },
        )?;
        self.sender()?
            .send(frame)
            .await
            .map_err(|_| Error::Closed("writer stopped".into()))
    }

    /// Cancel a request in flight (`$/cancel`); it is answered `cancelled`.
    pub async fn cancel(&self, id: u64) -> Result<(), Error> {
        self.notify(
            methods::CANCEL,
            &executor_protocol::types::session::CancelParams { id },
        )
        .await
    }

    /// Receive the notifications whose method is in `methods` (all when empty).
    pub fn subscribe(&self, methods: &[&str]) -> Subscription {
        self.subscribe_filtered(methods, None)
    }

    /// Like [`Client::subscribe`], only for notifications whose
    /// `params.process_id` is `process_id`.
    pub(crate) fn subscribe_process(&self, methods: &[&str], process_id: &str) -> Subscription {
        self.subscribe_filtered(methods, Some(process_id.to_string()))
    }

    fn subscribe_filtered(&self, methods: &[&str], process_id: Option<String>) -> Subscription {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut shared = self.conn.inner.shared.lock().expect("client lock");
        shared.next_sub += 1;
        let id = shared.next_sub;
        if shared.closed.is_none() {
            shared.subscribers.push(Subscriber {
                id,
                methods: methods.iter().map(|m| m.to_string()).collect(),
                process_id,
                stream_id: None,
                tx,
            });
        }
        Subscription {
            id,
            backlog: Default::default(),
            rx,
        }
    }

    /// Narrow a subscription made before a process id was known (so that
    /// nothing pushed before the `process/start` answer is lost) to that
    /// process: what it already holds for other processes is dropped.
    pub(crate) fn narrow_to_process(
        &self,
        mut sub: Subscription,
        process_id: &str,
    ) -> Subscription {
        let mut shared = self.conn.inner.shared.lock().expect("client lock");
        if let Some(s) = shared.subscribers.iter_mut().find(|s| s.id == sub.id) {
            s.process_id = Some(process_id.to_string());
        }
        // Under the lock nothing new is delivered: drain and filter.
        let mut keep = std::mem::take(&mut sub.backlog);
        keep.retain(|n| n.process_id() == Some(process_id));
        while let Ok(n) = sub.rx.try_recv() {
            if n.process_id() == Some(process_id) {
                keep.push_back(n);
            }
        }
        sub.backlog = keep;
        sub
    }

    /// Narrow a subscription made before a stream id was known (an
    /// `http/request` with `stream`) to that stream, like
    /// [`Client::narrow_to_process`].
    pub(crate) fn narrow_to_stream(&self, mut sub: Subscription, stream_id: u64) -> Subscription {
        let mut shared = self.conn.inner.shared.lock().expect("client lock");
        if let Some(s) = shared.subscribers.iter_mut().find(|s| s.id == sub.id) {
            s.stream_id = Some(stream_id);
        }
        let mut keep = std::mem::take(&mut sub.backlog);
        keep.retain(|n| n.stream_id() == Some(stream_id));
        while let Ok(n) = sub.rx.try_recv() {
            if n.stream_id() == Some(stream_id) {
                keep.push_back(n);
            }
        }
        sub.backlog = keep;
        sub
    }

    /// Close the connection: the agent sees EOF and ends the session; wait
    /// for a spawned transport to exit.
    pub async fn close(self) -> Result<(), Error> {
        let child = self.conn.child.lock().expect("child lock").take();
        self.conn.out.lock().expect("client lock").take();
        if let Some(mut child) = child {
            // The writer task drops stdin once the last sender is gone.
            match tokio::time::timeout(std::time::Duration::from_secs(10), child.wait()).await {
                Ok(status) => {
                    status?;
                }
                Err(_) => {
                    let _ = child.kill().await;
                }
            }
        }
        // What the transport wrote on stderr before it exited reaches ours
        // before we return (the caller may exit at once); bounded, as an
        // ssh ControlMaster started by the transport may hold the pipe.
        let relay = self.conn.relay.lock().expect("relay lock").take();
        if let Some(relay) = relay {
            relay.drain(std::time::Duration::from_millis(500)).await;
        }
        Ok(())
    }
}

async fn send_call<P: Serialize>(
    inner: &Arc<Inner>,
    out: &mpsc::Sender<Vec<u8>>,
    method: &str,
    params: &P,
    sink: Option<sink::SinkEntry>,
) -> Result<Call, Error> {
    let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
    let mut frame = Vec::new();
    encode_request(&mut frame, id, method, params, inner.max_frame).map_err(|e| Error::Encode {
        method: method.into(),
        message: e.to_string(),
    })?;
    let (tx, rx) = oneshot::channel();
    {
        let mut shared = inner.shared.lock().expect("client lock");
        if let Some(reason) = &shared.closed {
            return Err(Error::Closed(reason.clone()));
        }
        shared.pending.insert(id, tx);
        if let Some(sink) = sink {
            shared.sink_requests.insert(id, sink);
        }
    }
    if out.send(frame).await.is_err() {
        let mut shared = inner.shared.lock().expect("client lock");
        shared.pending.remove(&id);
        shared.sink_requests.remove(&id);
        return Err(Error::Closed("writer stopped".into()));
    }
    Ok(Call {
        id,
        method: method.into(),
        rx,
    })
}

/// Read up to and including the preamble; return what followed it.
async fn read_preamble<R: AsyncRead + Unpin>(reader: &mut R) -> Result<BytesMut, Error> {
    let mut buf = BytesMut::with_capacity(8 * 1024);
    loop {
        if let Some(agent) = other_wire_version(&buf) {
            return Err(Error::WireVersion { agent });
        }
        if let Some(at) = find(&buf, PREAMBLE) {
            if at > MAX_PREAMBLE_NOISE {
                return Err(preamble_error(
                    &buf,
                    "more than 64 KiB of output before the preamble",
                ));
            }
            let _ = buf.split_to(at + PREAMBLE.len());
            return Ok(buf);
        }
        if buf.len() > MAX_PREAMBLE_NOISE + PREAMBLE.len() {
            return Err(preamble_error(
                &buf,
                "more than 64 KiB of output before the preamble",
            ));
        }
        buf.reserve(8 * 1024);
        let n = reader.read_buf(&mut buf).await?;
        if n == 0 {
            return Err(preamble_error(&buf, ENDED_BEFORE_PREAMBLE));
        }
    }
}

const ENDED_BEFORE_PREAMBLE: &str = "the stream ended before the preamble";

/// Whether `e` says the transport ended (then its exit status and stderr
/// say why), not that it spoke something else.
fn ended_early(e: &Error) -> bool {
    match e {
        Error::Preamble { reason, .. } => reason == ENDED_BEFORE_PREAMBLE,
        Error::Closed(_) | Error::Io(_) => true,
        _ => false,
    }
}

/// The version of a preamble of another wire version in `buf`
/// (`\0EXECUTOR-WIRE<N>\n`, N not ours), once its newline arrived.
fn other_wire_version(buf: &[u8]) -> Option<String> {
    let stem = &PREAMBLE[..PREAMBLE.len() - 2];
    let at = find(buf, stem)?;
    let rest = &buf[at + stem.len()..];
    let end = rest.iter().take(12).position(|&b| b == b'\n')?;
    let version = &rest[..end];
    (!version.is_empty()
        && version.iter().all(u8::is_ascii_digit)
        && version != PROTOCOL_VERSION.to_string().as_bytes())
    .then(|| String::from_utf8_lossy(version).into_owned())
}

fn preamble_error(seen: &[u8], reason: &str) -> Error {
    let head = &seen[..seen.len().min(200)];
    Error::Preamble {
        reason: reason.into(),
        seen: String::from_utf8_lossy(head).into_owned(),
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Answer a request from the agent (only `network/policyRequest` exists),
/// in a task of its own: the reader goes on meanwhile.
fn answer_agent(inner: &Inner, id: u64, method: &str, frame: &[u8]) {
    let Some((policy, out)) = inner.answers.clone() else {
        tracing::debug!(
            method,
            "ignoring a request from the agent (no agent_requests capability)"
        );
        return;
    };
    let max = inner.max_frame;
    let params = (method == methods::NETWORK_POLICY_REQUEST)
        .then(|| executor_protocol::message::Incoming::decode(frame).ok())
        .flatten()
        .and_then(|m| match m {
            executor_protocol::message::Incoming::Request { params, .. } => {
                executor_protocol::message::from_params::<
                    executor_protocol::types::network::PolicyRequestParams,
                >(params)
                .ok()
            }
            _ => None,
        });
    let method = method.to_string();
    tokio::spawn(async move {
        let mut bytes = Vec::new();
        let encoded = match params {
            Some(p) => {
                let answer = policy.decide(p).await;
                executor_protocol::message::encode_response(&mut bytes, Some(id), &answer, max)
            }
            None => executor_protocol::message::encode_error(
                &mut bytes,
                Some(id),
                &WireError::method_not_found(&method),
                max,
            ),
        };
        if encoded.is_ok() {
            if let Some(tx) = out.upgrade() {
                let _ = tx.send(bytes).await;
            }
        }
    });
}

/// The byte stream the connection reader takes frames from.
trait ByteSource: AsyncRead + Unpin + Send + 'static {
    /// The pipe under it, when `splice(2)` may take bytes from it.
    fn pipe(&self) -> Option<&tokio::net::unix::pipe::Receiver> {
        None
    }

    fn splices(&self) -> bool {
        cfg!(target_os = "linux") && self.pipe().is_some()
    }
}

/// Any byte stream ([`Client::connect`]): frames are read into memory.
struct AnyTransport<R>(R);

impl<R: AsyncRead + Unpin> AsyncRead for AnyTransport<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<R: AsyncRead + Unpin + Send + 'static> ByteSource for AnyTransport<R> {}

/// The stdout pipe of a transport command.
impl ByteSource for tokio::net::unix::pipe::Receiver {
    fn pipe(&self) -> Option<&tokio::net::unix::pipe::Receiver> {
        Some(self)
    }
}

/// Bytes read at a time right after a spliced frame, where the next one
/// most likely starts: about one `fs/readStream/data` head (4 + 68 bytes
/// for a 1 MiB block below 4 GiB), so that hardly any of its data is read
/// into memory.
const HEAD_READ: usize = 72;

/// The rest of a frame's payload the reader could not write itself, read
/// into memory for the stream's task (or dropped when that is gone).
struct Tail {
    entry: sink::SinkEntry,
    offset: u64,
    left: usize,
}

/// What to do with the frame at the start of the buffer.
enum Direct {
    /// Give its payload to this sink (`head`: the bytes before the data).
    Take {
        entry: sink::SinkEntry,
        head: usize,
        offset: u64,
        data_len: usize,
    },
    /// Its head may be one, more bytes tell.
    NeedHead,
    /// Read it the normal way.
    No,
}

/// Whether the frame at the start of `buf`, not all of it there yet, is
/// a `fs/readStream/data` of a stream with a sink the reader may write now.
fn direct_frame(inner: &Inner, buf: &[u8]) -> Direct {
    use executor_protocol::message::{read_stream_data_head, DataHead};
    if !inner.splice || buf.len() < codec::LEN_PREFIX {
        return Direct::No;
    }
    let declared = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if declared == 0 || declared > inner.max_frame || buf.len() >= codec::LEN_PREFIX + declared {
        return Direct::No;
    }
    let shared = inner.shared.lock().expect("client lock");
    if shared.sinks.is_empty() {
        return Direct::No;
    }
    match read_stream_data_head(&buf[codec::LEN_PREFIX..], declared) {
        DataHead::Found {
            stream_id,
            offset,
            len,
            data_len,
        } => match shared.sinks.get(&stream_id) {
            Some(entry) if entry.state.reader_may_write() => Direct::Take {
                entry: entry.clone(),
                head: len,
                offset,
                data_len,
            },
            _ => Direct::No,
        },
        DataHead::Short => Direct::NeedHead,
        DataHead::Other => Direct::No,
    }
}

/// Write the payload of the frame at the start of `buf` (its head is
/// there) into its sink: what is buffered, then the rest spliced from the
/// transport. Leaves `buf` empty; returns what is still to read into
/// memory.
#[cfg(target_os = "linux")]
async fn take_direct(
    src: &tokio::net::unix::pipe::Receiver,
    buf: &mut BytesMut,
    entry: sink::SinkEntry,
    head: usize,
    offset: u64,
    data_len: usize,
) -> std::io::Result<Option<Tail>> {
    use bytes::Buf;
    buf.advance(codec::LEN_PREFIX + head);
    let buffered = buf.split().freeze();
    let taken = sink::splice_payload(src, &entry.state, buffered, data_len).await?;
    if taken.written > 0 {
        let _ = entry.tx.send(sink::SinkEvent::Wrote {
            offset,
            len: taken.written as u64,
        });
    }
    let mut at = offset + taken.written as u64;
    if let Some(e) = taken.failed {
        // The rest of the payload is read and dropped.
        entry.state.closed.store(true, Ordering::Release);
        let _ = entry.tx.send(sink::SinkEvent::Failed(e));
    }
    let unwritten = taken.unwritten.len() as u64;
    entry.queue(at, taken.unwritten);
    at += unwritten;
    Ok((taken.left > 0).then_some(Tail {
        entry,
        offset: at,
        left: taken.left,
    }))
}

#[cfg(not(target_os = "linux"))]
async fn take_direct(
    _src: &tokio::net::unix::pipe::Receiver,
    _buf: &mut BytesMut,
    _entry: sink::SinkEntry,
    _head: usize,
    _offset: u64,
    _data_len: usize,
) -> std::io::Result<Option<Tail>> {
    unreachable!("no splice: ByteSource::splices is false")
}

async fn read_loop<R: ByteSource>(mut reader: R, mut buf: BytesMut, inner: Arc<Inner>) {
    use bytes::BufMut;
    let mut decoder = FrameDecoder::new(inner.max_frame);
    let mut tail: Option<Tail> = None;
    // The next read stops at about a frame head.
    let mut head_read = false;
    let reason = 'outer: loop {
        loop {
            if let Some(t) = tail.take() {
                if buf.len() < t.left {
                    tail = Some(t);
                    break;
                }
                let data = buf.split_to(t.left).freeze();
                t.entry.queue(t.offset, data);
            }
            if let Some(src) = reader.pipe() {
                match direct_frame(&inner, &buf) {
                    Direct::Take {
                        entry,
                        head,
                        offset,
                        data_len,
                    } => {
                        match take_direct(src, &mut buf, entry, head, offset, data_len).await {
                            Ok(t) => tail = t,
                            Err(e) => break 'outer format!("reading from the agent failed: {e}"),
                        }
                        head_read = true;
                        continue;
                    }
                    Direct::NeedHead => {
                        head_read = true;
                        break;
                    }
                    Direct::No => {}
                }
            }
            match decoder.decode(&mut buf) {
                Ok(Some(frame)) => {
                    if let Err(e) = deliver(&inner, frame) {
                        break 'outer e;
                    }
                }
                Ok(None) => break,
                Err(e) => break 'outer format!("bad frame from the agent: {e}"),
            }
        }
        let read = match &tail {
            Some(t) => {
                buf.reserve(t.left - buf.len());
                reader.read_buf(&mut buf).await
            }
            None if std::mem::take(&mut head_read) => {
                buf.reserve(HEAD_READ);
                reader.read_buf(&mut (&mut buf).limit(HEAD_READ)).await
            }
            None => {
                if buf.capacity() - buf.len() < 64 * 1024 {
                    buf.reserve(256 * 1024);
                }
                reader.read_buf(&mut buf).await
            }
        };
        match read {
            Ok(0) if buf.is_empty() && tail.is_none() => {
                break "the agent closed the connection".to_string()
            }
            Ok(0) => {
                break format!(
                    "the agent's output ended inside a frame ({} bytes)",
                    buf.len()
                )
            }
            Ok(_) => {}
            Err(e) => break format!("reading from the agent failed: {e}"),
        }
    };
    tracing::debug!(%reason, "client connection closed");
    let mut shared = inner.shared.lock().expect("client lock");
    shared.closed = Some(reason);
    shared.close();
}

#[derive(serde::Deserialize)]
struct PeekParams {
    #[serde(default)]
    process_id: Option<String>,
    #[serde(default)]
    stream_id: Option<u64>,
}

/// What routing needs of a frame; everything else is skipped unparsed.
#[derive(serde::Deserialize)]
struct Peek {
    #[serde(default)]
    id: Option<u64>,
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    params: Option<PeekParams>,
    #[serde(default)]
    result: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    error: Option<WireError>,
}

fn deliver(inner: &Inner, frame: BytesMut) -> Result<(), String> {
    let frame = frame.freeze();
    let peek: Peek = rmp_serde::from_slice(&frame)
        .map_err(|e| format!("undecodable message from the agent: {e}"))?;
    let mut shared = inner.shared.lock().expect("client lock");
    if let Some(method) = peek.method {
        if let Some(id) = peek.id {
            drop(shared);
            answer_agent(inner, id, &method, &frame);
            return Ok(());
        }
        let (process_id, stream_id) = peek
            .params
            .map_or((None, None), |p| (p.process_id, p.stream_id));
        let note = Notification {
            method,
            process_id,
            stream_id,
            frame,
        };
        if let Some(note) = to_sink(&mut shared, note) {
            deliver_note(&mut shared, note);
        }
        return Ok(());
    }
    match (peek.id, peek.error) {
        (Some(id), Some(err)) => {
            shared.sink_requests.remove(&id);
            if let Some(tx) = shared.pending.remove(&id) {
                let _ = tx.send(Err(err));
            }
        }
        (None, Some(err)) => {
            tracing::warn!(error = %err, "agent answered a request it could not read")
        }
        (Some(id), None) if peek.result.is_some() => {
            if let Some(entry) = shared.sink_requests.remove(&id) {
                // Registered before the answer is passed on: the stream's
                // first block follows it at once.
                match rmp_serde::from_slice::<ResultOf<ReadStreamResult>>(&frame) {
                    Ok(r) => {
                        shared.sinks.insert(r.result.stream_id, entry);
                    }
                    Err(e) => {
                        tracing::debug!(id, error = %e, "fs/readStream answer without a stream id")
                    }
                }
            }
            if let Some(tx) = shared.pending.remove(&id) {
                let _ = tx.send(Ok(frame));
            } else {
                tracing::debug!(id, "answer to no pending request");
            }
        }
        _ => {
            return Err("a message from the agent is neither a response nor a notification".into())
        }
    }
    Ok(())
}

/// A read stream's frame goes to its sink's task (its end unregisters the
/// sink); any other notification is given back.
fn to_sink(shared: &mut Shared, note: Notification) -> Option<Notification> {
    let data = note.method == methods::FS_READ_STREAM_DATA;
    if !data && note.method != methods::FS_READ_STREAM_END {
        return Some(note);
    }
    let Some(stream_id) = note.stream_id else {
        return Some(note);
    };
    let entry = if data {
        shared.sinks.get(&stream_id).cloned()
    } else {
        shared.sinks.remove(&stream_id)
    };
    match entry {
        Some(entry) => {
            entry.frame(note, data);
            None
        }
        None => Some(note),
    }
}

/// Hand a notification to every subscriber that wants it.
fn deliver_note(shared: &mut Shared, note: Notification) {
    let pid = note.process_id.clone();
    let pid = pid.as_deref();
    let wanted: Vec<usize> = shared
        .subscribers
        .iter()
        .enumerate()
        .filter(|(_, sub)| {
            (sub.methods.is_empty() || sub.methods.contains(&note.method))
                && sub.process_id.as_deref().is_none_or(|p| Some(p) == pid)
                && sub.stream_id.is_none_or(|s| Some(s) == note.stream_id)
        })
        .map(|(i, _)| i)
        .collect();
    for &i in &wanted {
        // Clones share the frame (reference-counted), never copy it.
        let _ = shared.subscribers[i].tx.send(note.clone());
    }
    shared.subscribers.retain(|sub| !sub.tx.is_closed());
}

async fn write_loop<W: AsyncWrite + Unpin>(
    mut writer: W,
    mut rx: mpsc::Receiver<Vec<u8>>,
    inner: std::sync::Weak<Inner>,
) {
    let mut batch = Vec::with_capacity(1 << 20);
    while let Some(first) = rx.recv().await {
        batch.extend_from_slice(&first);
        while batch.len() < (1 << 20) {
            match rx.try_recv() {
                Ok(f) => batch.extend_from_slice(&f),
                Err(_) => break,
            }
        }
        if let Err(e) = async {
            writer.write_all(&batch).await?;
            writer.flush().await
        }
        .await
        {
            if let Some(inner) = inner.upgrade() {
                let mut shared = inner.shared.lock().expect("client lock");
                shared
                    .closed
                    .get_or_insert_with(|| format!("writing to the agent failed: {e}"));
                shared.pending.clear();
            }
            return;
        }
        batch.clear();
    }
    let _ = writer.shutdown().await;
}
