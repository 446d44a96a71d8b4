//! The Codex dialect: `executor codex-exec-server --listen stdio` serves
//! Codex's exec-server protocol (newline-delimited JSON-RPC, see
//! docs/CODEX.md) as a codec and a mapping in front of the native agent.
//!
//! On `initialize` the native agent is started in-process on an
//! in-memory pipe ([`native::Native`]), asking for a detached session (or
//! resuming one), so everything a Codex request does goes through the
//! same method table, profile, limits, audit, sandbox gate and session
//! host as a native request: a Codex request becomes one or more native
//! requests, native notifications become Codex ones. Requests are handled
//! one at a time in the order they came, as the reference does, except
//! waits (`process/read` with `waitMs`, `http/request`), which run beside,
//! and `process/write`, which runs in its job's own lane ([`Lanes`]): in
//! order with the job's other writes, and with everything else while it
//! takes at most [`WRITE_IN_ORDER_MS`]; a write waiting longer for room in
//! the job's stdin stalls nothing else (the job's terminate included).
//!
//! May use every module of the agent (it sits above [`crate::host`]).

pub mod errors;
pub mod fs;
pub mod http;
pub mod native;
pub mod process;
pub mod sandbox;
pub mod uri;
pub mod wire;
pub mod ws;

use base64::Engine;
use native::Native;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use wire::{Line, Message, RpcError};

/// How long a session outlives its connection (the reference's TTL).
pub const DETACHED_TTL_MS: u64 = 30_000;
/// Lines queued for the client before the native side waits.
const OUT_QUEUE: usize = 1024;
/// How long the request loop waits for a `process/write` before it goes
/// on with the next request (the write goes on in its lane).
pub const WRITE_IN_ORDER_MS: u64 = 200;
/// Stdin data (base64 text) queued in one connection's write lanes at
/// most; a write past it is refused.
pub const MAX_QUEUED_WRITE_BYTES: usize = 64 << 20;

/// Where the connection is in its handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    New,
    Initialized,
    Ready,
}

/// One Codex connection once `initialize` started the native side.
#[allow(missing_debug_implementations)] // channels and tables
pub struct Conn {
    pub native: Arc<Native>,
    pub out: wire::Out,
    pub procs: Arc<process::Registry>,
    /// The connection's `fs/open` handles.
    pub files: fs::Handles,
    pub http: Arc<http::Streams>,
    /// One write lane a job.
    pub lanes: Lanes,
    /// The profile runs every job under its own intent (a request may only
    /// narrow it): every job is sandboxed, whatever a request asks.
    pub profile_sandbox: bool,
    /// Which variables a header may take its value from, asked before
    /// any is read (the native agent asks again).
    pub header_env: HeaderEnv,
    /// `fs/open` asks the session host for the opened file
    /// (`fs/passDescriptor`): the connection is the host's socket, the
    /// profile allows the method and no audit log is configured (the
    /// host refuses it then: every read is recorded as its own request).
    pub descriptors: bool,
    phase: Arc<Mutex<Phase>>,
}

/// The configuration's `http.header_env` rule under the connection's
/// profile.
#[derive(Debug)]
pub struct HeaderEnv {
    http: crate::config::HttpConfig,
    profile: crate::config::Profile,
}

impl HeaderEnv {
    /// Why `var` may not be read for a request to `url`, if it may not.
    pub fn refusal(&self, var: &str, url: &url::Url) -> Option<String> {
        self.http.header_env_refusal(&self.profile, var, url)
    }
}

/// The `process/write` lanes of one connection: one task a job with a
/// write pending (a lane ends once it has nothing queued), taking its
/// writes in the order they came; at most [`MAX_QUEUED_WRITE_BYTES`]
/// queued in all, counted with what each write holds
/// ([`process::PreparedWrite::size`]).
#[derive(Default, Debug)]
pub struct Lanes {
    inner: Mutex<LaneMap>,
    queued: std::sync::atomic::AtomicUsize,
}

#[derive(Default, Debug)]
struct LaneMap {
    closed: bool,
    /// The lane a generation: a lane that ended removes only itself.
    next: u64,
    /// By native job: (generation, sender).
    lanes: std::collections::HashMap<String, (u64, mpsc::UnboundedSender<LaneJob>)>,
}

#[derive(Debug)]
struct LaneJob {
    id: wire::Id,
    write: process::PreparedWrite,
    size: usize,
    done: tokio::sync::oneshot::Sender<()>,
}

impl Lanes {
    /// Queue `write` in its job's lane; the receiver fires once it is
    /// answered.
    fn enqueue(
        conn: &Arc<Conn>,
        id: wire::Id,
        write: process::PreparedWrite,
    ) -> Result<tokio::sync::oneshot::Receiver<()>, (wire::Id, RpcError)> {
        use std::sync::atomic::Ordering;
        let lanes = &conn.lanes;
        let size = write.size();
        let before = lanes.queued.fetch_add(size, Ordering::AcqRel);
        if before + size > MAX_QUEUED_WRITE_BYTES {
            lanes.queued.fetch_sub(size, Ordering::AcqRel);
            return Err((
                id,
                RpcError::internal(format!(
                    "limit_exceeded: more than {MAX_QUEUED_WRITE_BYTES} bytes of process/write \
                     data would wait for jobs' stdin on this connection"
                )),
            ));
        }
        let (done, fired) = tokio::sync::oneshot::channel();
        let key = write.native.clone();
        let job = LaneJob {
            id,
            write,
            size,
            done,
        };
        let mut g = lanes.inner.lock().expect("lanes lock");
        if g.closed {
            lanes.queued.fetch_sub(size, Ordering::AcqRel);
            return Err((job.id, RpcError::internal("the connection is closing")));
        }
        let generation = g.next;
        let map = &mut *g;
        let (_, tx) = map.lanes.entry(key.clone()).or_insert_with(|| {
            map.next += 1;
            let (tx, rx) = mpsc::unbounded_channel::<LaneJob>();
            tokio::spawn(Lanes::run(conn.clone(), key, generation, rx));
            (generation, tx)
        });
        if let Err(e) = tx.send(job) {
            lanes.queued.fetch_sub(size, Ordering::AcqRel);
            return Err((e.0.id, RpcError::internal("the connection is closing")));
        }
        Ok(fired)
    }

    /// One lane: its writes in order, until none is queued (checked under
    /// the map's lock, under which writes are queued, so none is left).
    async fn run(
        conn: Arc<Conn>,
        key: String,
        generation: u64,
        mut rx: mpsc::UnboundedReceiver<LaneJob>,
    ) {
        use std::sync::atomic::Ordering;
        use tokio::sync::mpsc::error::TryRecvError;
        loop {
            let j = match rx.try_recv() {
                Ok(j) => j,
                Err(TryRecvError::Disconnected) => return,
                Err(TryRecvError::Empty) => {
                    let mut g = conn.lanes.inner.lock().expect("lanes lock");
                    match rx.try_recv() {
                        Ok(j) => j,
                        Err(_) => {
                            if g.lanes.get(&key).is_some_and(|(n, _)| *n == generation) {
                                g.lanes.remove(&key);
                            }
                            return;
                        }
                    }
                }
            };
            let answer = process::perform_write(&conn, j.write).await;
            conn.lanes.queued.fetch_sub(j.size, Ordering::AcqRel);
            let _ = conn.out.send(wire::response(&j.id, answer)).await;
            let _ = j.done.send(());
        }
    }

    /// End every lane (each after the write it is doing): the connection
    /// is over.
    fn close(&self) {
        let mut g = self.inner.lock().expect("lanes lock");
        g.closed = true;
        g.lanes.clear();
    }

    /// How many lanes are open (each has a write queued or under way).
    pub fn open(&self) -> usize {
        self.inner.lock().expect("lanes lock").lanes.len()
    }
}

impl Conn {
    /// Refuse a request of `family` before `initialized` (the reference's
    /// message).
    pub fn ready(&self, family: &str) -> Result<(), RpcError> {
        check_phase(*self.phase.lock().expect("phase lock"), family)
    }
}

fn check_phase(phase: Phase, family: &str) -> Result<(), RpcError> {
    match phase {
        Phase::New => Err(RpcError::invalid_request(format!(
            "client must call initialize before using {family} methods"
        ))),
        Phase::Initialized => Err(RpcError::invalid_request(format!(
            "client must send initialized before using {family} methods"
        ))),
        Phase::Ready => Ok(()),
    }
}

/// Base64 (standard, padded) of `data`.
pub fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// A request's params as `T`, with serde's message (as the reference
/// answers) on failure.
pub fn decode<T: DeserializeOwned>(params: Value) -> Result<T, RpcError> {
    serde_json::from_value(params)
        .map_err(|e| RpcError::invalid_params(reference_words(&e.to_string())))
}

/// serde's "invalid type: integer `7`" as the reference words it
/// ("invalid type: number").
fn reference_words(message: &str) -> String {
    for kind in ["integer", "floating point"] {
        let head = format!("invalid type: {kind} `");
        if let Some(rest) = message.strip_prefix(&head) {
            if let Some((_, tail)) = rest.split_once('`') {
                return format!("invalid type: number{tail}");
            }
        }
    }
    message.to_owned()
}

/// The sandbox a Codex request asks for, as a native intent: `None` when
/// it asks for none (a profile's sandbox still applies). What has no
/// native form is refused (`-32602`), never run weaker. `tmpdir` is what a
/// `tmpdir` entry means: the job's `TMPDIR`, or the agent's for `fs/*`.
pub fn sandbox_request(
    sandbox: Option<&Value>,
    network: sandbox::NetworkRequest<'_>,
    cwd: &std::path::Path,
    tmpdir: Option<&std::path::Path>,
) -> Result<Option<executor_protocol::types::sandbox::SandboxIntent>, RpcError> {
    sandbox::translate(
        sandbox.unwrap_or(&Value::Null),
        network,
        cwd,
        sandbox::Host { tmpdir },
    )
    .map_err(|u| RpcError::new(u.code(), u.message))
}

/// The native scope of a Codex fs request's `sandbox`: none when it asks
/// for none (a profile's still applies); the translated intent otherwise
/// (relative to the sandbox's own `cwd`, else the agent's). What has no
/// native form is refused, never run weaker.
pub fn fs_scope(sandbox_param: Option<&Value>) -> Result<fs::Scope, RpcError> {
    let cwd = std::env::current_dir().unwrap_or_else(|_| "/".into());
    let tmpdir = std::env::var_os("TMPDIR")
        .map(std::path::PathBuf::from)
        .filter(|p| p.is_absolute());
    let intent = sandbox_request(
        sandbox_param,
        sandbox::NetworkRequest::default(),
        &cwd,
        tmpdir.as_deref(),
    )?;
    Ok(fs::Scope {
        sandbox: intent,
        cwd: None,
    })
}

/// Serve one Codex connection on `input`/`output` until the input ends.
pub async fn serve<R, W>(
    input: R,
    output: W,
    config: crate::config::Config,
    launch: crate::host::Launch,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (out, rx) = wire::Out::new(OUT_QUEUE);
    let writer = tokio::spawn(write_loop(output, rx));
    let mut input = BufReader::with_capacity(256 * 1024, input);
    let mut buf = Vec::new();
    let phase = Arc::new(Mutex::new(Phase::New));
    let mut conn: Option<Arc<Conn>> = None;
    let mut config = Some(config);
    let mut launch = Some(launch);
    loop {
        let line = wire::read_line(&mut input, &mut buf).await?;
        let (id, method, params) = match line {
            Line::End => break,
            Line::TooLong => {
                let m = wire::Malformed(format!(
                    "failed to parse JSON-RPC message from exec-server stdio: message exceeds {} bytes",
                    wire::MAX_LINE_BYTES
                ));
                let _ = out.send(wire::malformed(&m)).await;
                continue;
            }
            Line::Malformed(m) => {
                let _ = out.send(wire::malformed(&m)).await;
                continue;
            }
            Line::Message(Message::Response { id }) => {
                tracing::debug!(?id, "ignoring a response (no request was sent)");
                continue;
            }
            Line::Message(Message::Notification { method, .. }) => {
                let mut p = phase.lock().expect("phase lock");
                if method == "initialized" && *p == Phase::Initialized {
                    *p = Phase::Ready;
                    continue;
                }
                if method == "initialized" && *p == Phase::Ready {
                    continue;
                }
                // The reference ends the connection on any other
                // notification.
                tracing::info!(method, "unexpected notification: closing the connection");
                break;
            }
            Line::Message(Message::Request { id, method, params }) => (id, method, params),
        };
        if method == "initialize" {
            // Params that do not decode are answered without using up the
            // connection's one initialize.
            let parsed = decode::<InitializeParams>(params);
            let answer = match (&conn, parsed) {
                (Some(_), _) | (None, Ok(_)) if conn.is_some() || config.is_none() => Err(
                    RpcError::invalid_request("initialize may only be sent once per connection"),
                ),
                (None, Err(e)) => Err(e),
                (_, Ok(p)) => match initialize(
                    p,
                    config.take().expect("checked"),
                    launch.take().expect("checked"),
                    &out,
                    &phase,
                )
                .await
                {
                    Ok((c, v)) => {
                        conn = Some(c);
                        Ok(v)
                    }
                    Err(e) => Err(e),
                },
                (Some(_), Err(_)) => Err(RpcError::invalid_request(
                    "initialize may only be sent once per connection",
                )),
            };
            if out.send(wire::response(&id, answer)).await.is_err() {
                break;
            }
            continue;
        }
        let Some(c) = conn.clone() else {
            let answer = before_initialize(&method, params);
            if out.send(wire::response(&id, Err(answer))).await.is_err() {
                break;
            }
            continue;
        };
        if method == "http/request" {
            // Checked in order, then run beside; it answers itself (a
            // stream's head goes before its deltas).
            match http::prepare(&c, params) {
                Ok(p) => {
                    let out = out.clone();
                    tokio::spawn(async move {
                        if let Some(answer) = http::run(&c, &id, p).await {
                            let _ = out.send(wire::response(&id, answer)).await;
                        }
                    });
                }
                Err(e) => {
                    if out.send(wire::response(&id, Err(e))).await.is_err() {
                        break;
                    }
                }
            }
            continue;
        }
        if method == "process/write" {
            let queued = match process::prepare_write(&c, params) {
                Err(e) => Err((id, e)),
                Ok(Err(answer)) => {
                    if out.send(wire::response(&id, Ok(answer))).await.is_err() {
                        break;
                    }
                    continue;
                }
                Ok(Ok(write)) => Lanes::enqueue(&c, id, write),
            };
            match queued {
                Ok(done) => {
                    let wait = std::time::Duration::from_millis(WRITE_IN_ORDER_MS);
                    let _ = tokio::time::timeout(wait, done).await;
                }
                Err((id, e)) => {
                    if out.send(wire::response(&id, Err(e))).await.is_err() {
                        break;
                    }
                }
            }
            continue;
        }
        if runs_beside(&method, &params) {
            let out = out.clone();
            tokio::spawn(async move {
                let answer = dispatch(&c, &method, params).await;
                let _ = out.send(wire::response(&id, answer)).await;
            });
            continue;
        }
        let line = if method == "fs/readBlock" {
            // Answered as a line written from the agent's frames.
            fs::read_block(&c, &id, params).await
        } else {
            wire::response(&id, dispatch(&c, &method, params).await)
        };
        if out.send(line).await.is_err() {
            break;
        }
    }
    // The input ended: the native connection ends too (a detached session
    // lives on in its host, its jobs running), then what is queued is
    // written.
    if let Some(c) = conn.take() {
        c.lanes.close();
        fs::close_all(&c).await;
        // The client is gone: nothing more is pushed to it.
        c.native.stop();
    }
    drop(out);
    let _ = writer.await;
    Ok(())
}

/// Requests that wait on something outside the agent run beside the
/// others.
fn runs_beside(method: &str, params: &Value) -> bool {
    match method {
        "http/request" => true,
        "process/read" => params.get("waitMs").and_then(Value::as_u64).unwrap_or(0) > 0,
        _ => false,
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(mut output: W, mut rx: wire::OutRx) {
    // Each line's share of the budget goes back once it is written.
    while let Some((line, _share)) = rx.recv().await {
        if output.write_all(&line).await.is_err() {
            return;
        }
        while let Ok((line, _share)) = rx.try_recv() {
            if output.write_all(&line).await.is_err() {
                return;
            }
        }
        if output.flush().await.is_err() {
            return;
        }
    }
    let _ = output.flush().await;
}

/// The family a method belongs to, as the reference names it in its
/// handshake errors; `None` for a method it does not serve.
fn family(method: &str) -> Option<&'static str> {
    Some(match method {
        "environment/info" => "environment info",
        "environment/status" => "environment status",
        "environmentConfig/read" => "environment config",
        "capabilityRoots/discoverV1" => "capability discovery",
        m if m.starts_with("process/") => "exec",
        m if m.starts_with("fs/") => "filesystem",
        "http/request" => "http",
        _ => return None,
    })
}

/// The answer to a request before `initialize`.
fn before_initialize(method: &str, _params: Value) -> RpcError {
    match family(method) {
        Some(f) => check_phase(Phase::New, f).expect_err("not initialized"),
        None => not_implemented(method),
    }
}

fn not_implemented(method: &str) -> RpcError {
    RpcError::new(
        wire::code::METHOD_NOT_FOUND,
        format!("exec-server stub does not implement `{method}` yet"),
    )
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // decoded to refuse what the reference refuses
struct WatchMissingParams {
    watch_id: u64,
    missing: Vec<String>,
    #[serde(default)]
    present: Option<Value>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct InitializeParams {
    client_name: String,
    #[serde(default)]
    resume_session_id: Option<String>,
}

/// The native session behind a Codex `sessionId`: `<id>.<token>`.
fn split_session(s: &str) -> Option<(&str, &str)> {
    s.split_once('.')
}

async fn initialize(
    p: InitializeParams,
    config: crate::config::Config,
    launch: crate::host::Launch,
    out: &wire::Out,
    phase: &Arc<Mutex<Phase>>,
) -> Result<(Arc<Conn>, Value), RpcError> {
    let resume = match p.resume_session_id.as_deref() {
        None => None,
        Some(s) => match split_session(s) {
            Some((id, token)) => Some((id.to_owned(), token.to_owned())),
            None => return Err(RpcError::invalid_request(format!("unknown session id {s}"))),
        },
    };
    let procs = Arc::new(process::Registry::default());
    let conn_slot: Arc<Mutex<Option<std::sync::Weak<Conn>>>> = Arc::new(Mutex::new(None));
    let notes = Notes {
        conn: conn_slot.clone(),
        out: out.clone(),
    };
    let profile_sandbox = config.profile.sandbox.is_some();
    let audited = config.audit.file.is_some() || config.audit.syslog;
    let header_env = HeaderEnv {
        http: config.http.clone(),
        profile: config.profile.clone(),
    };
    let native = Native::start(config, launch, notes);
    let session = executor_protocol::types::session::SessionParams {
        resume: resume.as_ref().map(|(id, token)| {
            executor_protocol::types::session::ResumeParams {
                session_id: id.clone(),
                token: token.clone(),
            }
        }),
        detach_ttl_ms: Some(DETACHED_TTL_MS),
    };
    let init = executor_protocol::types::session::InitializeParams {
        protocol_version: executor_protocol::PROTOCOL_VERSION,
        client: executor_protocol::types::session::ClientInfo {
            name: p.client_name,
            version: String::new(),
        },
        session: Some(session),
        capabilities: Some(executor_protocol::types::session::ClientCapabilities {
            agent_requests: false,
            descriptors: true,
        }),
    };
    let r: executor_protocol::types::session::InitializeResult = match native
        .call(executor_protocol::methods::INITIALIZE, &init)
        .await
    {
        Ok(r) => r,
        Err(e) => {
            // Nothing is left running for a refused initialize.
            native.close();
            return Err(match e.code {
                executor_protocol::error::ErrorCode::SessionExpired if resume.is_some() => {
                    RpcError::invalid_request(format!(
                        "unknown session id {}",
                        p.resume_session_id.as_deref().unwrap_or_default()
                    ))
                }
                _ => errors::from_wire(&e),
            });
        }
    };
    let conn_native_on_host = native.on_host();
    let conn = Arc::new(Conn {
        native,
        out: out.clone(),
        procs,
        files: fs::Handles::default(),
        http: Arc::new(http::Streams::default()),
        lanes: Lanes::default(),
        profile_sandbox,
        header_env,
        descriptors: !audited
            && conn_native_on_host
            && r.methods
                .iter()
                .any(|m| m == executor_protocol::methods::FS_PASS_DESCRIPTOR),
        phase: phase.clone(),
    });
    *conn_slot.lock().expect("conn slot") = Some(Arc::downgrade(&conn));
    let learnt = match resume {
        Some(_) => process::relearn(&conn).await,
        None => Ok(()),
    };
    let info = match learnt {
        Ok(()) => environment_info(&conn).await,
        Err(e) => Err(e),
    };
    let info = match info {
        Ok(i) => i,
        Err(e) => {
            conn.native.close();
            return Err(e);
        }
    };
    *phase.lock().expect("phase lock") = Phase::Initialized;
    Ok((
        conn,
        json!({
            "sessionId": format!("{}.{}", r.session_id, r.resume_token),
            "environmentInfo": info,
        }),
    ))
}

/// Native notifications, turned into Codex lines on the reader task.
struct Notes {
    conn: Arc<Mutex<Option<std::sync::Weak<Conn>>>>,
    out: wire::Out,
}

impl native::Notes for Notes {
    fn note(&mut self, method: &str, params: rmpv::Value) -> Vec<Vec<u8>> {
        let conn = self
            .conn
            .lock()
            .expect("conn slot")
            .as_ref()
            .and_then(|w| w.upgrade());
        let Some(conn) = conn else {
            return vec![];
        };
        if method.starts_with("process/") {
            return conn.procs.note(&conn, method, params);
        }
        if method == executor_protocol::methods::HTTP_BODY_DELTA {
            return conn.http.note(params);
        }
        tracing::debug!(method, "native notification without a Codex counterpart");
        vec![]
    }
    fn out(&self) -> &wire::Out {
        &self.out
    }
    fn ended(&mut self) {
        tracing::debug!("the native session ended");
    }
}

async fn dispatch(conn: &Arc<Conn>, method: &str, params: Value) -> Result<Value, RpcError> {
    match method {
        "environment/info" => {
            conn.ready("environment info")?;
            environment_info(conn).await
        }
        "environment/status" => {
            conn.ready("environment status")?;
            Ok(json!({"status": "ready"}))
        }
        "process/start" => process::start(conn, params).await,
        "process/read" => process::read(conn, params).await,
        "process/write" => match process::prepare_write(conn, params)? {
            Ok(w) => process::perform_write(conn, w).await,
            Err(answer) => Ok(answer),
        },
        "process/signal" => process::signal(conn, params).await,
        "process/terminate" => process::terminate(conn, params).await,
        "fs/watchMissing" => {
            // Not advertised (`fsWatchMissing: false`): nothing is watched,
            // and the answer says so.
            let _: WatchMissingParams = decode(params)?;
            conn.ready("filesystem")?;
            Ok(json!({"watching": false}))
        }
        "fs/getMetadata" => fs::get_metadata(conn, params).await,
        "fs/readFile" => fs::read_file(conn, params).await,
        "fs/writeFile" => fs::write_file(conn, params).await,
        "fs/createDirectory" => fs::create_directory(conn, params).await,
        "fs/remove" => fs::remove(conn, params).await,
        "fs/canonicalize" => fs::canonicalize(conn, params).await,
        "fs/readDirectory" => fs::read_directory(conn, params).await,
        "fs/walk" => fs::walk(conn, params).await,
        "fs/open" => fs::open(conn, params).await,
        "fs/close" => fs::close(conn, params).await,
        "fs/copy" => fs::copy(conn, params).await,
        other => Err(not_implemented(other)),
    }
}

/// `environment/info`, from the native one: only what is implemented is
/// advertised.
async fn environment_info(conn: &Conn) -> Result<Value, RpcError> {
    let e: executor_protocol::types::session::EnvironmentInfo = conn
        .native
        .call(
            executor_protocol::methods::ENVIRONMENT_INFO,
            &executor_protocol::types::session::EnvironmentInfoParams {},
        )
        .await
        .map_err(|e| errors::from_wire(&e))?;
    // The home this agent runs with (as the reference reports it), else
    // the user's from the password database.
    let home = std::env::var_os("HOME")
        .map(std::path::PathBuf::from)
        .filter(|p| p.is_absolute())
        .unwrap_or_else(|| e.home.clone().into());
    let tmp = std::env::var_os("TMPDIR")
        .map(std::path::PathBuf::from)
        .filter(|p| p.is_absolute())
        .unwrap_or_else(|| "/tmp".into());
    Ok(json!({
        "shell": {"name": e.shell.name, "path": e.shell.path},
        "executorVersion": env!("CARGO_PKG_VERSION"),
        "providerId": concat!("executor:", env!("CARGO_PKG_VERSION")),
        "cwd": uri::from_path(std::path::Path::new(&e.cwd)),
        "userHomeDir": uri::from_path(&home),
        "platformOs": e.os,
        "prependPathDirs": [],
        "temporaryDirectories": [],
        "tempDir": uri::from_path(&tmp),
        "capabilities": capabilities(),
    }))
}

/// The capability flags of `environment/info`: true only for what this
/// dialect implements.
fn capabilities() -> Value {
    json!({
        "networkProxyLaunch": false,
        "networkProxyReviewDomains": false,
        "networkProxyTransparentTcp": false,
        "credentialMasking": false,
        "credentialMaskingCustomProviders": false,
        "capabilityDiscoverySandbox": false,
        "fsWatchMissing": false,
        "capabilityDiscoveryV2": false,
        "environmentConfigRead": false,
        "httpHeaderEnvVars": true,
        "sandboxedFileStreaming": false,
        "fileWriteStreaming": false,
        "shellSnapshotV2": false,
        "windowsMxc": false,
        "linuxRootWritePreservesDevices": false,
        "linuxApprovedRootWritePreservesRestrictions": false,
    })
}
