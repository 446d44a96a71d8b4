//! One connection: framing, admission, concurrency, flow control. Above
//! [`crate::dispatch`] (which it hands each admitted request) and the
//! session, below [`crate::host`].
//!
//! - The reader never waits for a handler: every request but `initialize` runs
//!   in its own task, so a long poll or a big walk never blocks new requests.
//!   `initialize` runs inline so that requests pipelined behind it see it done.
//! - Responses and notifications travel on two queues to one writer task,
//!   which always drains responses first. The notification queue is bounded
//!   (a job's output push waits a short while for room, then marks the job
//!   lagged and leaves the output in its retained buffer); the response queue is bounded too, and a request's in-flight
//!   slot is only released once its answer was written, so a client that
//!   stops reading stalls the agent's reader (backpressure) instead of
//!   growing its memory.
//! - A length prefix of 0 or above `max_frame_bytes` is answered with a
//!   `$/error` notification (`frame_too_large`) and the connection closes.
//! - The writer writes each frame whole before the next: its bytes and any
//!   zero-copy tail with vectored writes, a block pinned in a pipe with
//!   `splice(2)` into the output when the output is a pipe or a socket
//!   ([`Output`]), else read back and written.

use crate::audit::{self, Event};
use crate::config::Config;
use crate::dispatch;
use crate::outbound::pipes::PooledPipe;
use crate::outbound::{error_frame, notification_frame, reply_frame};
pub use crate::outbound::{NotifyError, OutFrame, Outbound};
use crate::session::Session;
use bytes::BytesMut;
use executor_protocol::codec::{FrameDecoder, FrameError};
use executor_protocol::message::{DecodeError, Incoming};
use executor_protocol::types::session::CancelParams;
use executor_protocol::{methods, ErrorCode, WireError, PREAMBLE};
use futures_util::FutureExt;
use std::collections::HashMap;
use std::future::Future;
use std::os::fd::BorrowedFd;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// Notifications queued for the writer before producers must back off.
pub const NOTIFICATION_QUEUE: usize = 256;
/// Extra response slots beyond the in-flight limit, for immediate errors.
const RESPONSE_QUEUE_SLACK: usize = 256;
/// How long in-flight requests may finish after the client closed its side.
const EOF_GRACE: Duration = Duration::from_secs(1);
/// The writer gathers up to this much before one write call.
const WRITE_BATCH: usize = 1 << 20;
/// At most this many frames per vectored write.
const MAX_BATCH_FRAMES: usize = 256;

/// One connection's answers: they go back on the connection that asked,
/// whatever is attached to the session by then.
#[derive(Debug, Clone)]
struct Responder {
    tx: mpsc::Sender<OutFrame>,
    max_frame: usize,
}

impl Responder {
    /// Queue `frame`; the writer fires its `on_taken` (dropped unfired
    /// when the writer is gone: nothing left to tell then).
    async fn respond(&self, frame: OutFrame) {
        let _ = self.tx.send(frame).await;
    }

    async fn respond_error(&self, id: Option<u64>, error: &WireError) {
        self.respond(error_frame(id, error, self.max_frame)).await;
    }
}

/// How a connection ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ending {
    /// EOF at a frame boundary.
    Eof,
    /// The input ended inside a frame, or reading it failed.
    FramingLost,
    /// A length prefix of 0 or above the maximum: framing cannot resume.
    BadLength,
    /// The output side failed (the client went away).
    OutputClosed,
}

#[derive(Default)]
struct InFlight {
    tokens: HashMap<u64, CancellationToken>,
}

/// A connection's output: where frames are written, and whether a block
/// pinned in a pipe can be moved into it inside the kernel.
pub trait Output: AsyncWrite + Unpin + Send + 'static {
    /// Whether [`Output::splice_from`] moves bytes (a pipe or a socket).
    fn splices(&self) -> bool {
        false
    }

    /// Move up to `len` bytes from the pipe `from` (its read end, holding
    /// at least `len`) into this output inside the kernel, waiting for room
    /// without blocking the thread; `Unsupported` when this output cannot.
    fn splice_from<'a>(
        &'a mut self,
        from: BorrowedFd<'a>,
        len: usize,
    ) -> impl Future<Output = std::io::Result<usize>> + Send + 'a {
        let _ = (from, len);
        std::future::ready(Err(std::io::ErrorKind::Unsupported.into()))
    }

    /// Whether [`Output::send_with_fd`] passes descriptors (a Unix
    /// socket).
    fn passes_fds(&self) -> bool {
        false
    }

    /// Send a first part of `data` (at least one byte, waiting for room)
    /// with `fd` attached (`SCM_RIGHTS`); how much of `data` went.
    /// `Unsupported` when this output cannot.
    fn send_with_fd<'a>(
        &'a mut self,
        data: &'a [u8],
        fd: BorrowedFd<'a>,
    ) -> impl Future<Output = std::io::Result<usize>> + Send + 'a {
        let _ = (data, fd);
        std::future::ready(Err(std::io::ErrorKind::Unsupported.into()))
    }
}

impl Output for tokio::net::unix::pipe::Sender {
    fn splices(&self) -> bool {
        true
    }

    async fn splice_from<'a>(
        &'a mut self,
        from: BorrowedFd<'a>,
        len: usize,
    ) -> std::io::Result<usize> {
        use std::os::fd::AsFd;
        loop {
            self.writable().await?;
            let out = self.as_fd();
            match self.try_io(|| executor_sys::splice_nonblocking(from, out, len)) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                r => return r,
            }
        }
    }
}

impl Output for tokio::net::unix::OwnedWriteHalf {
    fn splices(&self) -> bool {
        true
    }

    fn passes_fds(&self) -> bool {
        true
    }

    async fn send_with_fd<'a>(
        &'a mut self,
        data: &'a [u8],
        fd: BorrowedFd<'a>,
    ) -> std::io::Result<usize> {
        use nix::sys::socket::MsgFlags;
        use std::os::fd::AsFd;
        let sock: &tokio::net::UnixStream = self.as_ref();
        loop {
            sock.writable().await?;
            let r = sock.try_io(tokio::io::Interest::WRITABLE, || {
                executor_sys::send_fds(
                    sock.as_fd(),
                    data,
                    &[fd],
                    MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
                )
            });
            match r {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                r => return r,
            }
        }
    }

    async fn splice_from<'a>(
        &'a mut self,
        from: BorrowedFd<'a>,
        len: usize,
    ) -> std::io::Result<usize> {
        use std::os::fd::AsFd;
        let sock: &tokio::net::UnixStream = self.as_ref();
        loop {
            sock.writable().await?;
            let out = sock.as_fd();
            let r = sock.try_io(tokio::io::Interest::WRITABLE, || {
                executor_sys::splice_nonblocking(from, out, len)
            });
            match r {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                r => return r,
            }
        }
    }
}

/// Tokio's portable stdout (a terminal, a file): written, never spliced.
impl Output for tokio::io::Stdout {}

/// An in-memory pipe (tests, fuzzing): written, never spliced.
impl Output for tokio::io::DuplexStream {}

/// Serve one connection until EOF or lost framing, then end the session.
pub async fn serve<R, W>(input: R, output: W, config: Config) -> std::io::Result<Ending>
where
    R: AsyncRead + Unpin,
    W: Output,
{
    let session = Arc::new(Session::from_config(
        config,
        crate::session::Mode::Plain { refusal: None },
    )?);
    let ending = serve_on(&session, input, output, true).await;
    session.shutdown().await;
    Ok(ending)
}

/// `max_inflight_request_bytes` in KiB (at least 1).
fn budget_kib(limits: &executor_protocol::limits::Limits) -> u32 {
    u32::try_from(limits.max_inflight_request_bytes.div_ceil(1024))
        .unwrap_or(u32::MAX)
        .clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize) as u32)
}

/// What one connection's reader knows about itself.
struct Conn<'a> {
    session: &'a Arc<Session>,
    responder: Responder,
    notes: mpsc::Sender<OutFrame>,
    slots: Arc<Semaphore>,
    /// `max_inflight_request_bytes`, in KiB permits (a request holds its
    /// frame's share until its handler is done).
    bytes: Arc<Semaphore>,
    bytes_total: u32,
    in_flight: Arc<Mutex<InFlight>>,
    max_in_flight: usize,
    /// Set once this connection's `initialize` (or resume) succeeded: the
    /// session's attachment generation it holds.
    generation: Option<u64>,
    /// Whether this connection's writer splices piped blocks.
    splices: bool,
    /// Whether this connection's writer can pass descriptors (a session
    /// host's Unix socket).
    passes_fds: bool,
    /// Set by an `initialize` that declared `capabilities.descriptors` on
    /// a connection that [`Conn::passes_fds`]: `fs/passDescriptor` is
    /// served.
    descriptors: bool,
}

/// Serve one connection of `session` until EOF or lost framing, writing the
/// preamble first when `preamble` (a relay has written it already). The
/// session lives on (a session host keeps it for the next connection); the
/// caller decides whether to end it.
pub async fn serve_on<R, W>(
    session: &Arc<Session>,
    mut input: R,
    output: W,
    preamble: bool,
) -> Ending
where
    R: AsyncRead + Unpin,
    W: Output,
{
    let limits = session.limits().clone();
    let max_frame = limits.max_frame_bytes as usize;
    let max_in_flight = limits.max_requests_in_flight as usize;
    let (resp_tx, resp_rx) = mpsc::channel::<OutFrame>(max_in_flight + RESPONSE_QUEUE_SLACK);
    let (note_tx, note_rx) = mpsc::channel::<OutFrame>(NOTIFICATION_QUEUE);
    let splices = output.splices();
    let passes_fds = output.passes_fds();
    let writer = tokio::spawn(write_loop(output, resp_rx, note_rx, preamble));
    let mut conn = Conn {
        session,
        responder: Responder {
            tx: resp_tx,
            max_frame,
        },
        notes: note_tx,
        slots: Arc::new(Semaphore::new(max_in_flight)),
        bytes: Arc::new(Semaphore::new(budget_kib(&limits) as usize)),
        bytes_total: budget_kib(&limits),
        in_flight: Arc::new(Mutex::new(InFlight::default())),
        max_in_flight,
        generation: None,
        splices,
        passes_fds,
        descriptors: false,
    };
    let mut decoder = FrameDecoder::new(max_frame);
    let mut buf = BytesMut::with_capacity(256 * 1024);

    let ending = 'read: loop {
        if let Some(ending) = handle_buffered(&mut decoder, &mut buf, &mut conn).await {
            break 'read ending;
        }
        if buf.capacity() - buf.len() < 64 * 1024 {
            buf.reserve(256 * 1024);
        }
        tokio::select! {
            r = input.read_buf(&mut buf) => match r {
                Ok(0) => {
                    if buf.is_empty() {
                        break 'read Ending::Eof;
                    }
                    let e = decoder.decode_eof(&mut buf).err().unwrap_or(FrameError::Truncated { buffered: buf.len() });
                    tracing::warn!(error = %e, "input ended inside a frame");
                    break 'read Ending::FramingLost;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "reading input failed");
                    break 'read Ending::FramingLost;
                }
            },
            _ = conn.responder.tx.closed() => break 'read Ending::OutputClosed,
        }
    };
    tracing::debug!(?ending, "connection input ended");
    finish_in_flight(&conn).await;
    if let Some(generation) = conn.generation {
        session.detach(generation, &conn.notes);
    }
    drop(conn);
    // The writer ends once every sender is gone and its queues are drained;
    // one still stalled on an output nobody reads after 5 s is stopped
    // (and its output closed) rather than left holding it.
    let mut writer = writer;
    if tokio::time::timeout(Duration::from_secs(5), &mut writer)
        .await
        .is_err()
    {
        writer.abort();
        let _ = writer.await;
    }
    ending
}

/// Handle every whole frame in `buf`; the connection's end if framing is
/// lost or the output side closed.
async fn handle_buffered(
    decoder: &mut FrameDecoder,
    buf: &mut BytesMut,
    conn: &mut Conn<'_>,
) -> Option<Ending> {
    loop {
        match decoder.decode(buf) {
            Ok(Some(frame)) => {
                // Back-pressure: no more input is read until the requests
                // being handled leave room for this one (a frame larger
                // than the whole budget waits for all).
                let kib = u32::try_from(frame.len().div_ceil(1024))
                    .unwrap_or(u32::MAX)
                    .clamp(1, conn.bytes_total);
                let Ok(held) = conn.bytes.clone().acquire_many_owned(kib).await else {
                    return Some(Ending::OutputClosed);
                };
                handle_frame(&frame, conn, held).await
            }
            Ok(None) => return None,
            Err(e) => {
                report_frame_error(&conn.responder, &e).await;
                return Some(Ending::BadLength);
            }
        }
    }
}

/// Let what is in flight finish briefly, then cancel the rest. (Every
/// slot back means every answer was written.)
async fn finish_in_flight(conn: &Conn<'_>) {
    let (slots, all) = (conn.slots.clone(), conn.max_in_flight as u32);
    if tokio::time::timeout(EOF_GRACE, slots.acquire_many(all))
        .await
        .is_ok()
    {
        return;
    }
    for token in conn
        .in_flight
        .lock()
        .expect("in-flight lock")
        .tokens
        .values()
    {
        token.cancel();
    }
    let _ = tokio::time::timeout(EOF_GRACE, slots.acquire_many(all)).await;
}

async fn report_frame_error(responder: &Responder, e: &FrameError) {
    let error = match e {
        FrameError::TooLarge { declared, max } => WireError::new(
            ErrorCode::FrameTooLarge,
            format!("frame length {declared} is outside 1..={max}; closing the connection"),
        )
        .with("declared", *declared)
        .with("max", *max),
        FrameError::Truncated { buffered } => WireError::new(
            ErrorCode::ParseError,
            format!("input ended inside a frame ({buffered} bytes)"),
        ),
        other => WireError::new(ErrorCode::ParseError, other.to_string()),
    };
    tracing::warn!(error = %error, "framing lost");
    if let Some(frame) = notification_frame(methods::ERROR, &error, responder.max_frame) {
        responder.respond(frame).await;
    }
}

async fn handle_frame(frame: &[u8], conn: &mut Conn<'_>, bytes: OwnedSemaphorePermit) {
    match Incoming::decode(frame) {
        Ok(Incoming::Request { id, method, params }) => {
            handle_request(conn, id, method, params, bytes).await
        }
        Ok(Incoming::Notification { method, params }) => handle_notification(conn, &method, params),
        Ok(Incoming::Response { id, result }) => handle_response(conn, id, result),
        Err(DecodeError { id, error }) => {
            tracing::debug!(?id, error = %error, "undecodable message");
            conn.responder.respond_error(id, &error).await;
        }
    }
}

/// One request's audit record: what the agent noted while it ran
/// ([`audit::Notes`]: its decoded params, what its handler did), what its
/// raw params claimed (kept for a request refused before they were
/// decoded), and how long it took; [`RequestAudit::audit_event`] writes it.
struct RequestAudit {
    id: u64,
    method: String,
    claimed: serde_json::Map<String, serde_json::Value>,
    notes: audit::Notes,
    started: std::time::Instant,
}

impl RequestAudit {
    fn begin(session: &Session, id: u64, method: &str, params: &rmpv::Value) -> RequestAudit {
        RequestAudit {
            id,
            method: method.to_string(),
            claimed: if session.audit().enabled() {
                audit::describe(method, params)
            } else {
                Default::default()
            },
            notes: audit::Notes::default(),
            started: std::time::Instant::now(),
        }
    }

    /// Record the request's outcome (`None`: it succeeded).
    fn audit_event(self, session: &Arc<Session>, outcome: Option<ErrorCode>) {
        if !session.audit().enabled() {
            return;
        }
        // Work that outlives its answer (a job registered after the
        // request was cancelled) writes a line of its own.
        let late: audit::Late = {
            let (session, method, id) = (session.clone(), self.method.clone(), self.id);
            let started = self.started;
            Arc::new(move |details| {
                session.audit().record(Event {
                    session_id: session.id(),
                    method: &method,
                    id: Some(id),
                    details,
                    outcome,
                    elapsed: started.elapsed(),
                })
            })
        };
        let takes_intent = methods::facts(&self.method).is_some_and(|f| f.intent.is_some());
        let RequestAudit {
            id,
            method,
            claimed,
            notes,
            started,
        } = self;
        notes.close(late, |mut details, decoded| {
            // A method taking an intent says whether one was enforced: the
            // agent's decision, `false` unless a handler noted a policy.
            if decoded && takes_intent && !details.contains_key("sandboxed") {
                details.insert("sandboxed".into(), serde_json::Value::Bool(false));
            }
            if !decoded && !claimed.is_empty() {
                details.insert("request".into(), serde_json::Value::Object(claimed));
            }
            session.audit().record(Event {
                session_id: session.id(),
                method: &method,
                id: Some(id),
                details,
                outcome,
                elapsed: started.elapsed(),
            });
        });
    }
}

async fn handle_request(
    conn: &mut Conn<'_>,
    id: u64,
    method: String,
    params: rmpv::Value,
    bytes: OwnedSemaphorePermit,
) {
    let session = conn.session;
    let audit = RequestAudit::begin(session, id, &method, &params);
    let taken_over = conn.generation.is_some_and(|g| g != session.generation());
    if method == methods::INITIALIZE && !taken_over {
        let frame = initialize(conn, id, params);
        audit.audit_event(session, frame.error);
        conn.responder.respond(frame).await;
        return;
    }
    let admitted = admit(conn, &method).and_then(|()| reserve(conn, id));
    let (permit, token) = match admitted {
        Ok(reserved) => reserved,
        Err(Refused { error, audited }) => {
            if audited {
                audit.audit_event(session, Some(error.code));
            }
            conn.responder.respond_error(Some(id), &error).await;
            return;
        }
    };
    let request = Request {
        session: session.clone(),
        responder: conn.responder.clone(),
        in_flight: conn.in_flight.clone(),
        id,
        method,
        params,
        audit,
    };
    tokio::spawn(async move {
        // The request's share of the byte budget, until it is done.
        let _bytes = bytes;
        run_request(request, permit, token).await
    });
}

/// `initialize` on this connection: the session is attached to it when
/// it succeeds (taking the session over from any other connection).
fn initialize(conn: &mut Conn<'_>, id: u64, params: rmpv::Value) -> OutFrame {
    let session = conn.session;
    let max = conn.responder.max_frame;
    if conn.generation.is_some() {
        return error_frame(id, &dispatch::initialize_again(), max);
    }
    let answers_requests = declares_agent_requests(&params);
    let descriptors = declares(&params, "descriptors");
    let frame = reply_frame(id, dispatch::initialize(session, params), max);
    if frame.error.is_none() {
        conn.descriptors = descriptors && conn.passes_fds;
        conn.generation = Some(session.attach(conn.notes.clone(), conn.splices));
        session
            .outbound()
            .set_answers_requests(&conn.notes, answers_requests);
    }
    frame
}

/// An answer to the agent's own request (`network/policyRequest`), taken
/// only from the connection attached now.
fn handle_response(conn: &Conn<'_>, id: Option<u64>, result: Result<rmpv::Value, WireError>) {
    let session = conn.session;
    let current = conn.generation.is_some_and(|g| g == session.generation());
    let delivered = current && id.is_some_and(|id| session.outbound().deliver(id, result));
    if !delivered {
        tracing::debug!(?id, "ignoring a response to no pending agent request");
    }
}

/// `initialize.capabilities.agent_requests`, read leniently (a malformed
/// value is `initialize`'s to refuse).
fn declares_agent_requests(params: &rmpv::Value) -> bool {
    declares(params, "agent_requests")
}

/// `initialize.capabilities.<name>` is `true`, read leniently.
fn declares(params: &rmpv::Value, name: &str) -> bool {
    let field = |v: &rmpv::Value, name: &str| -> Option<rmpv::Value> {
        v.as_map()?
            .iter()
            .find(|(k, _)| k.as_str() == Some(name))
            .map(|(_, v)| v.clone())
    };
    field(params, "capabilities")
        .and_then(|c| field(&c, name))
        .and_then(|v| v.as_bool())
        .unwrap_or(false)
}

/// A request refused before it ran; `audited` unless it never had an id
/// of its own (a duplicate).
struct Refused {
    error: WireError,
    audited: bool,
}

impl From<WireError> for Refused {
    fn from(error: WireError) -> Refused {
        Refused {
            error,
            audited: true,
        }
    }
}

/// Whether this connection may send `method` now: it holds the session
/// (initialized, not taken over) and the profile allows the method.
fn admit(conn: &Conn<'_>, method: &str) -> Result<(), Refused> {
    let session = conn.session;
    if conn.generation.is_some_and(|g| g != session.generation()) {
        return Err(WireError::new(
            ErrorCode::SessionTakenOver,
            "the session was resumed by another connection; this one may only close",
        )
        .into());
    }
    if conn.generation.is_none() && !methods::facts(method).is_some_and(|f| f.before_initialize) {
        return Err(WireError::new(
            ErrorCode::NotInitialized,
            format!("{method:?} before initialize: send initialize first"),
        )
        .into());
    }
    if let Err(rule) = session.profile().check(method) {
        return Err(WireError::new(ErrorCode::PolicyDenied, rule)
            .with("method", method)
            .into());
    }
    if method == methods::FS_PASS_DESCRIPTOR {
        admit_descriptors(conn)?;
    }
    Ok(())
}

/// `fs/passDescriptor` is served only to a connection that asked for
/// descriptors and can carry them, and not while the audit log is on
/// (it records every `fs/readBlock`; reads through a passed descriptor
/// would go unrecorded).
fn admit_descriptors(conn: &Conn<'_>) -> Result<(), Refused> {
    if !conn.descriptors {
        let why = if conn.passes_fds {
            "its initialize did not declare capabilities.descriptors"
        } else {
            "its output is not a Unix socket that can carry them"
        };
        return Err(WireError::new(
            ErrorCode::InvalidRequest,
            format!("fs/passDescriptor: this connection takes no descriptors ({why})"),
        )
        .into());
    }
    if conn.session.audit().enabled() {
        return Err(WireError::new(
            ErrorCode::PolicyDenied,
            "fs/passDescriptor: the audit log is on and records every read (use fs/readBlock)",
        )
        .with("method", methods::FS_PASS_DESCRIPTOR)
        .into());
    }
    Ok(())
}

/// An in-flight slot and a cancellation token registered under `id`.
fn reserve(conn: &Conn<'_>, id: u64) -> Result<(OwnedSemaphorePermit, CancellationToken), Refused> {
    let Ok(permit) = conn.slots.clone().try_acquire_owned() else {
        return Err(
            WireError::limit("max_requests_in_flight", conn.max_in_flight as u64, None).into(),
        );
    };
    let token = CancellationToken::new();
    match conn
        .in_flight
        .lock()
        .expect("in-flight lock")
        .tokens
        .entry(id)
    {
        std::collections::hash_map::Entry::Occupied(_) => Err(Refused {
            error: WireError::new(
                ErrorCode::InvalidRequest,
                format!("request id {id} is already in flight"),
            ),
            audited: false,
        }),
        std::collections::hash_map::Entry::Vacant(slot) => {
            slot.insert(token.clone());
            Ok((permit, token))
        }
    }
}

/// An admitted request, on its way to its handler.
struct Request {
    session: Arc<Session>,
    responder: Responder,
    in_flight: Arc<Mutex<InFlight>>,
    id: u64,
    method: String,
    params: rmpv::Value,
    audit: RequestAudit,
}

/// Run an admitted request to its answer (its handler's reply, a panic
/// answered `internal`, or `cancelled`), audit it, send the answer; the
/// in-flight slot is released once the answer is written.
async fn run_request(r: Request, permit: OwnedSemaphorePermit, token: CancellationToken) {
    let Request {
        session,
        responder,
        in_flight,
        id,
        method,
        params,
        audit,
    } = r;
    let max = responder.max_frame;
    let notes = audit.notes.clone();
    let noting = session.audit().enabled();
    let work = AssertUnwindSafe(notes.scope(noting, dispatch::dispatch(&session, &method, params)))
        .catch_unwind();
    // Work that nothing can stop once begun (a filesystem change on a
    // blocking thread) is answered with what it did, never `cancelled`
    // while it goes on.
    let runs_to_end = methods::facts(&method).is_some_and(|f| f.runs_to_end);
    let outcome = if runs_to_end {
        work.await
            .unwrap_or_else(|panic| Err(panicked(&method, panic)))
    } else {
        tokio::select! {
            r = work => r.unwrap_or_else(|panic| Err(panicked(&method, panic))),
            _ = token.cancelled() => Err(WireError::new(
                ErrorCode::Cancelled,
                format!("request {id} ({method}) was cancelled"),
            )),
        }
    };
    let mut frame = reply_frame(id, outcome, max);
    in_flight.lock().expect("in-flight lock").tokens.remove(&id);
    audit.audit_event(&session, frame.error);
    frame.permit = Some(permit);
    responder.respond(frame).await;
}

/// The answer to a handler that panicked (a bug).
fn panicked(method: &str, panic: Box<dyn std::any::Any + Send>) -> WireError {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    tracing::error!(method, panic = %what, "handler panicked");
    WireError::new(
        ErrorCode::Internal,
        format!("internal error (a bug) while handling {method:?}: {what}"),
    )
}

/// `$/cancel` cancels a request in flight; other notifications are ignored.
fn handle_notification(conn: &Conn<'_>, method: &str, params: rmpv::Value) {
    if method != methods::CANCEL {
        tracing::debug!(method, "ignoring unknown notification");
        return;
    }
    match executor_protocol::message::from_params::<CancelParams>(params) {
        Ok(CancelParams { id }) => {
            let in_flight = conn.in_flight.lock().expect("in-flight lock");
            match in_flight.tokens.get(&id) {
                Some(t) => t.cancel(),
                None => tracing::debug!(id, "$/cancel for a request not in flight"),
            }
        }
        Err(e) => tracing::debug!(error = %e, "malformed $/cancel"),
    }
}

async fn write_loop<W: Output>(
    mut out: W,
    mut responses: mpsc::Receiver<OutFrame>,
    mut notes: mpsc::Receiver<OutFrame>,
    preamble: bool,
) {
    if preamble && (out.write_all(PREAMBLE).await.is_err() || out.flush().await.is_err()) {
        return;
    }
    let mut batch: Vec<OutFrame> = Vec::with_capacity(MAX_BATCH_FRAMES);
    let mut notes_open = true;
    loop {
        let first = tokio::select! {
            biased;
            r = responses.recv() => match r {
                Some(f) => f,
                None => {
                    // Responses are done: drain what notifications remain.
                    match notes.try_recv() {
                        Ok(f) => f,
                        Err(_) => break,
                    }
                }
            },
            r = notes.recv(), if notes_open => match r {
                Some(f) => f,
                None => { notes_open = false; continue; }
            },
        };
        let mut total = first.len();
        batch.push(taken(first));
        // Gather what is already queued, responses ahead of notifications.
        while total < WRITE_BATCH && batch.len() < MAX_BATCH_FRAMES {
            let next = match responses.try_recv() {
                Ok(f) => f,
                Err(_) => match notes.try_recv() {
                    Ok(f) => f,
                    Err(_) => break,
                },
            };
            total += next.len();
            batch.push(taken(next));
        }
        if let Err(e) = write_frames(&mut out, &mut batch).await {
            tracing::debug!(error = %e, "output closed");
            return;
        }
        // Written: in-flight slots are released with the frames.
        batch.clear();
    }
    let _ = out.flush().await;
}

/// `frame`, taken by the writer: what is queued from now on is written
/// after it (a stream's first notification after its head).
fn taken(mut frame: OutFrame) -> OutFrame {
    if let Some(signal) = frame.on_taken.take() {
        let _ = signal.send(());
    }
    frame
}

/// Write frames whole, in order: the bytes and tails of the frames up to
/// the next one with a piped block in vectored writes, then that block out
/// of its pipe, and so on.
async fn write_frames<W: Output>(out: &mut W, frames: &mut [OutFrame]) -> std::io::Result<()> {
    let mut start = 0;
    while start < frames.len() {
        // A frame with a descriptor goes first in its own write, which
        // carries the descriptor with the frame's first bytes.
        if frames[start].fd.is_some() && out.passes_fds() {
            let frame = &mut frames[start];
            let fd = frame.fd.take().expect("checked");
            let sent = out
                .send_with_fd(&frame.bytes, std::os::fd::AsFd::as_fd(&fd))
                .await?;
            drop(fd);
            frame.bytes.drain(..sent);
        }
        let end = frames[start + 1..]
            .iter()
            .position(|f| f.fd.is_some())
            .map_or(frames.len(), |i| start + 1 + i);
        let end = frames[start..end]
            .iter()
            .position(|f| f.piped.is_some())
            .map_or(end, |i| start + i + 1);
        write_vectored_all(out, &frames[start..end]).await?;
        if let Some(pipe) = frames[end - 1].piped.as_mut() {
            write_piped(out, pipe).await?;
        }
        start = end;
    }
    out.flush().await
}

/// What `pipe` holds, spliced into `out` (read back and written where
/// `out` cannot take a splice).
async fn write_piped<W: Output>(out: &mut W, pipe: &mut PooledPipe) -> std::io::Result<()> {
    while pipe.held() > 0 {
        let moved = if out.splices() {
            out.splice_from(pipe.source(), pipe.held()).await
        } else {
            Err(std::io::ErrorKind::Unsupported.into())
        };
        match moved {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => pipe.drained(n),
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
                let data = pipe.read_back()?;
                out.write_all(&data).await?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Write the bytes and tails of `frames` with vectored writes.
async fn write_vectored_all<W: AsyncWrite + Unpin>(
    out: &mut W,
    frames: &[OutFrame],
) -> std::io::Result<()> {
    let parts: Vec<&[u8]> = frames
        .iter()
        .flat_map(|f| std::iter::once(&f.bytes[..]).chain(f.tail.as_deref()))
        .filter(|p| !p.is_empty())
        .collect();
    let (mut idx, mut off) = (0usize, 0usize);
    while idx < parts.len() {
        let slices: Vec<std::io::IoSlice<'_>> =
            std::iter::once(std::io::IoSlice::new(&parts[idx][off..]))
                .chain(
                    parts[idx + 1..]
                        .iter()
                        .take(1023)
                        .map(|p| std::io::IoSlice::new(p)),
                )
                .collect();
        let mut n = out.write_vectored(&slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while n > 0 && idx < parts.len() {
            let left = parts[idx].len() - off;
            if n >= left {
                n -= left;
                idx += 1;
                off = 0;
            } else {
                off += n;
                n = 0;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream's head may sit queued behind a response another task is
    /// still sending (a channel hands out its messages in the order their
    /// senders claimed a slot, so the writer sees none of them and takes a
    /// notification first): the stream starts only once the writer took
    /// its head, and its first notification follows the head on the wire.
    #[tokio::test]
    async fn a_stream_starts_once_the_writer_took_its_head_not_once_it_is_queued() {
        let (resp_tx, resp_rx) = mpsc::channel(4);
        let (note_tx, note_rx) = mpsc::channel(4);
        let responder = Responder {
            tx: resp_tx,
            max_frame: 1 << 20,
        };
        let (started, mut start) = tokio::sync::oneshot::channel();
        responder
            .respond(OutFrame {
                on_taken: Some(started),
                ..OutFrame::new(b"head".to_vec())
            })
            .await;
        // Queued, and no writer has taken it: the stream may push nothing.
        assert_eq!(
            start.try_recv(),
            Err(tokio::sync::oneshot::error::TryRecvError::Empty)
        );
        let (out, mut wire) = tokio::io::duplex(1 << 16);
        let writer = tokio::spawn(write_loop(out, resp_rx, note_rx, false));
        tokio::time::timeout(Duration::from_secs(10), start)
            .await
            .expect("the writer took the head")
            .unwrap();
        note_tx.send(OutFrame::new(b"note".to_vec())).await.unwrap();
        drop((responder, note_tx));
        writer.await.unwrap();
        let mut got = Vec::new();
        wire.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"headnote");
    }
    use executor_protocol::message::encode_request;
    use executor_protocol::types::session::{ClientInfo, InitializeParams};
    use executor_protocol::PROTOCOL_VERSION;
    use tokio::io::DuplexStream;

    /// An agent connection on an in-memory pipe: the client's ends.
    struct Pipe {
        to_agent: DuplexStream,
        from_agent: DuplexStream,
        served: tokio::task::JoinHandle<Ending>,
    }

    fn pipe() -> Pipe {
        let (to_agent, agent_in) = tokio::io::duplex(1 << 16);
        let (agent_out, from_agent) = tokio::io::duplex(1 << 16);
        let session = crate::session::test_session();
        let served =
            tokio::spawn(async move { serve_on(&session, agent_in, agent_out, false).await });
        Pipe {
            to_agent,
            from_agent,
            served,
        }
    }

    impl Pipe {
        async fn send<P: serde::Serialize>(&mut self, id: u64, method: &str, params: &P) {
            let mut frame = Vec::new();
            encode_request(&mut frame, id, method, params, 1 << 20).unwrap();
            self.to_agent.write_all(&frame).await.unwrap();
        }

        async fn recv(&mut self) -> Incoming {
            let len = self.from_agent.read_u32().await.unwrap() as usize;
            let mut frame = vec![0; len];
            self.from_agent.read_exact(&mut frame).await.unwrap();
            let v = rmpv::decode::read_value(&mut frame.as_slice()).unwrap();
            Incoming::from_value(v).unwrap()
        }

        /// The error code answering `id` (panics on a success).
        async fn error_of(&mut self, id: u64) -> ErrorCode {
            match self.recv().await {
                Incoming::Response {
                    id: Some(got),
                    result: Err(e),
                } if got == id => e.code,
                other => panic!("expected an error answering {id}, got {other:?}"),
            }
        }
    }

    fn init() -> InitializeParams {
        InitializeParams {
            protocol_version: PROTOCOL_VERSION,
            client: ClientInfo {
                name: "conn-test".into(),
                version: "0".into(),
            },
            session: None,
            capabilities: None,
        }
    }

    #[tokio::test]
    async fn requests_are_admitted_only_after_one_initialize() {
        let mut c = pipe();
        let none = executor_protocol::types::session::EnvironmentInfoParams {};
        c.send(1, methods::ENVIRONMENT_INFO, &none).await;
        assert_eq!(c.error_of(1).await, ErrorCode::NotInitialized);
        c.send(2, methods::INITIALIZE, &init()).await;
        assert!(matches!(
            c.recv().await,
            Incoming::Response {
                id: Some(2),
                result: Ok(_)
            }
        ));
        c.send(3, methods::INITIALIZE, &init()).await;
        assert_eq!(c.error_of(3).await, ErrorCode::InvalidRequest);
        c.send(4, "no/such", &none).await;
        assert_eq!(c.error_of(4).await, ErrorCode::MethodNotFound);
        // Bad params: an error naming them, and the connection lives on.
        c.send(5, methods::FS_STAT, &7).await;
        assert_eq!(c.error_of(5).await, ErrorCode::InvalidParams);
        c.send(6, methods::ENVIRONMENT_INFO, &none).await;
        assert!(matches!(
            c.recv().await,
            Incoming::Response {
                id: Some(6),
                result: Ok(_)
            }
        ));
        drop(c.to_agent);
        assert_eq!(c.served.await.unwrap(), Ending::Eof);
    }

    #[tokio::test]
    async fn a_zero_length_prefix_is_reported_and_ends_the_connection() {
        let mut c = pipe();
        c.to_agent.write_all(&[0, 0, 0, 0]).await.unwrap();
        match c.recv().await {
            Incoming::Notification { method, params } => {
                assert_eq!(method, methods::ERROR);
                let e: WireError = executor_protocol::message::from_params(params).unwrap();
                assert_eq!(e.code, ErrorCode::FrameTooLarge);
            }
            other => panic!("expected $/error, got {other:?}"),
        }
        assert_eq!(c.served.await.unwrap(), Ending::BadLength);
    }

    #[tokio::test]
    async fn frames_and_their_tails_are_written_whole_and_in_order_through_short_writes() {
        // A pipe of 7 bytes: every write is partial.
        let (mut out, mut reader) = tokio::io::duplex(7);
        let frames: Vec<OutFrame> = (0u8..20)
            .map(|i| OutFrame {
                tail: (i % 2 == 0).then(|| bytes::Bytes::from(vec![i; i as usize * 3])),
                ..OutFrame::new(vec![100 + i; i as usize + 1])
            })
            .collect();
        let mut want = Vec::new();
        for f in &frames {
            want.extend_from_slice(&f.bytes);
            want.extend_from_slice(f.tail.as_deref().unwrap_or_default());
        }
        let read = tokio::spawn(async move {
            let mut got = Vec::new();
            reader.read_to_end(&mut got).await.unwrap();
            got
        });
        let mut frames = frames;
        write_frames(&mut out, &mut frames).await.unwrap();
        drop(out);
        assert_eq!(read.await.unwrap(), want);
    }

    /// A file of `len` bytes of a pattern, unlinked (the descriptor keeps it).
    fn pattern_file(len: usize) -> (std::fs::File, Vec<u8>) {
        use std::io::Write;
        let data: Vec<u8> = (0..len)
            .map(|i| (i % 249) as u8 ^ (i >> 12) as u8)
            .collect();
        // Unique per call: tests of this module run in parallel threads of
        // one process, and each removes its file once opened.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p =
            std::env::temp_dir().join(format!("executor-conn-{}-{len}-{n}", std::process::id()));
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        std::fs::remove_file(&p).unwrap();
        f.write_all(&data).unwrap();
        (f, data)
    }

    /// Frames of every kind in a row: plain, with a tail, and piped blocks
    /// (at an unaligned offset too), and what the reader must see.
    fn mixed_frames(pool: &Arc<crate::outbound::pipes::PipePool>) -> (Vec<OutFrame>, Vec<u8>) {
        use crate::outbound::pipes::capacity_for;
        let (file, data) = pattern_file(300_000);
        let mut frames = Vec::new();
        let mut want = Vec::new();
        for (i, (offset, len)) in [(0u64, 100_000usize), (4097, 65_536), (250_000, 80_000)]
            .into_iter()
            .enumerate()
        {
            let mut pipe = pool.take(capacity_for(offset, len)).unwrap();
            assert!(pipe.fill(&file, offset, len).unwrap());
            let end = (offset as usize + len).min(data.len());
            assert_eq!(pipe.held(), end - offset as usize);
            let head = vec![i as u8 + 1; 5];
            want.extend_from_slice(&head);
            want.extend_from_slice(&data[offset as usize..end]);
            frames.push(OutFrame {
                piped: Some(pipe),
                ..OutFrame::new(head)
            });
            let tail = bytes::Bytes::from(vec![0xee; 3 + i]);
            want.extend_from_slice(&[0xdd, i as u8]);
            want.extend_from_slice(&tail);
            frames.push(OutFrame {
                tail: Some(tail),
                ..OutFrame::new(vec![0xdd, i as u8])
            });
        }
        (frames, want)
    }

    #[tokio::test]
    async fn piped_blocks_are_spliced_whole_between_other_frames_into_a_small_pipe() {
        use std::os::fd::AsFd;
        let pool = crate::outbound::pipes::PipePool::new(4 << 20);
        let (mut frames, want) = mixed_frames(&pool);
        // One page of room: every splice is partial and waits for the reader.
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let _ = nix::fcntl::fcntl(&w, nix::fcntl::FcntlArg::F_SETPIPE_SZ(4096));
        let mut out = tokio::net::unix::pipe::Sender::from_owned_fd(w).unwrap();
        assert!(out.splices());
        let read = std::thread::spawn(move || {
            let mut got = Vec::new();
            std::io::Read::read_to_end(&mut std::fs::File::from(r), &mut got).unwrap();
            got
        });
        write_frames(&mut out, &mut frames).await.unwrap();
        assert!(frames
            .iter()
            .all(|f| f.piped.as_ref().is_none_or(|p| p.held() == 0)));
        drop(frames);
        drop(out);
        assert_eq!(read.join().unwrap(), want);
        // Every pipe went back empty: three idle pipes, none lost.
        assert_eq!(pool.usage().0, 3);
        let again = pool.take(4096).unwrap();
        assert_eq!(again.held(), 0);
        let _ = again.source().as_fd();
    }

    #[tokio::test]
    async fn piped_blocks_are_read_back_where_the_output_cannot_splice() {
        let pool = crate::outbound::pipes::PipePool::new(4 << 20);
        let (mut frames, want) = mixed_frames(&pool);
        let (mut out, mut reader) = tokio::io::duplex(1000);
        assert!(!out.splices());
        let read = tokio::spawn(async move {
            let mut got = Vec::new();
            reader.read_to_end(&mut got).await.unwrap();
            got
        });
        write_frames(&mut out, &mut frames).await.unwrap();
        drop(frames);
        drop(out);
        assert_eq!(read.await.unwrap(), want);
        assert_eq!(pool.usage().0, 3, "drained pipes are kept");
    }

    #[tokio::test]
    async fn a_piped_frame_dropped_unwritten_closes_its_pipe() {
        let pool = crate::outbound::pipes::PipePool::new(4 << 20);
        let (frames, _) = mixed_frames(&pool);
        let (_, bytes) = pool.usage();
        assert!(bytes > 0);
        // The connection went away with the frames queued.
        drop(frames);
        assert_eq!(pool.usage(), (0, 0), "no pipe holding bytes is kept");
    }

    #[test]
    fn a_panic_is_answered_internal_naming_the_method_and_the_message() {
        let e = panicked("fs/stat", Box::new("boom"));
        assert_eq!(e.code, ErrorCode::Internal);
        assert!(e.message.contains("\"fs/stat\"") && e.message.contains("boom"));
        let e = panicked("fs/walk", Box::new(String::from("owned")));
        assert!(e.message.contains("owned"), "{}", e.message);
    }
}
