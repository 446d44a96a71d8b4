//! One connection: framing, concurrency, flow control.
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

use crate::audit::{self, Event};
use crate::config::Config;
use crate::dispatch;
pub use crate::outbound::{NotifyError, OutFrame, Outbound};
use crate::session::Session;
use bytes::BytesMut;
use executor_protocol::codec::{FrameDecoder, FrameError};
use executor_protocol::message::{encode_error, encode_notification, DecodeError, Incoming};
use executor_protocol::types::session::CancelParams;
use executor_protocol::{methods, ErrorCode, WireError, PREAMBLE};
use futures_util::FutureExt;
use std::collections::HashMap;
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
    async fn respond(&self, mut frame: OutFrame) {
        let queued = frame.on_queued.take();
        // Fails only when the writer is gone; nothing left to tell then.
        if self.tx.send(frame).await.is_ok() {
            if let Some(signal) = queued {
                let _ = signal.send(());
            }
        }
    }

    async fn respond_error(&self, id: Option<u64>, error: &WireError) {
        let mut bytes = Vec::new();
        if encode_error(&mut bytes, id, error, self.max_frame).is_ok() {
            self.respond(OutFrame {
                error: Some(error.code),
                ..OutFrame::new(bytes)
            })
            .await;
        }
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

/// Serve one connection until EOF or lost framing, then end the session.
pub async fn serve<R, W>(input: R, output: W, config: Config) -> std::io::Result<Ending>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
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
    W: AsyncWrite + Unpin + Send + 'static,
{
    let limits = session.limits().clone();
    let max_frame = limits.max_frame_bytes as usize;
    let max_in_flight = limits.max_requests_in_flight as usize;
    let (resp_tx, resp_rx) = mpsc::channel::<OutFrame>(max_in_flight + RESPONSE_QUEUE_SLACK);
    let (note_tx, note_rx) = mpsc::channel::<OutFrame>(NOTIFICATION_QUEUE);
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
    };
    let mut decoder = FrameDecoder::new(max_frame);
    let mut buf = BytesMut::with_capacity(256 * 1024);

    let ending = 'read: loop {
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(frame)) => {
                    // Back-pressure: no more input is read until the
                    // requests being handled leave room for this one (a
                    // frame larger than the whole budget waits for all).
                    let kib = u32::try_from(frame.len().div_ceil(1024))
                        .unwrap_or(u32::MAX)
                        .clamp(1, conn.bytes_total);
                    let Ok(held) = conn.bytes.clone().acquire_many_owned(kib).await else {
                        break 'read Ending::OutputClosed;
                    };
                    handle_frame(&frame, &mut conn, held).await
                }
                Ok(None) => break,
                Err(e) => {
                    report_frame_error(&conn.responder, &e).await;
                    break 'read Ending::BadLength;
                }
            }
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

    // Let what is in flight finish briefly, then cancel the rest. (Every
    // slot back means every answer was written.)
    let (slots, all) = (conn.slots.clone(), conn.max_in_flight as u32);
    if tokio::time::timeout(EOF_GRACE, slots.acquire_many(all))
        .await
        .is_err()
    {
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
    if let Some(generation) = conn.generation {
        session.detach(generation, &conn.notes);
    }
    drop(conn);
    // The writer ends once every sender is gone and its queues are drained.
    let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
    ending
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
    let mut bytes = Vec::new();
    if encode_notification(&mut bytes, methods::ERROR, &error, responder.max_frame).is_ok() {
        responder.respond(OutFrame::new(bytes)).await;
    }
}

async fn handle_frame(frame: &[u8], conn: &mut Conn<'_>, bytes: OwnedSemaphorePermit) {
    let session = conn.session;
    let responder = &conn.responder;
    let in_flight = &conn.in_flight;
    let incoming = match Incoming::decode(frame) {
        Ok(m) => m,
        Err(DecodeError { id, error }) => {
            tracing::debug!(?id, error = %error, "undecodable message");
            responder.respond_error(id, &error).await;
            return;
        }
    };
    match incoming {
        Incoming::Request { id, method, params } => {
            let started = std::time::Instant::now();
            let audited = session.audit().enabled();
            let details = if audited {
                audit::describe(&method, &params)
            } else {
                Default::default()
            };
            let record = |outcome: Option<ErrorCode>, details| {
                session.audit().record(Event {
                    session_id: session.id(),
                    method: &method,
                    id: Some(id),
                    details,
                    outcome,
                    elapsed: started.elapsed(),
                })
            };
            let taken_over = conn.generation.is_some_and(|g| g != session.generation());
            if method == methods::INITIALIZE && !taken_over {
                let answers_requests = declares_agent_requests(&params);
                let frame = if conn.generation.is_some() {
                    dispatch::error_frame(
                        id,
                        &WireError::new(
                            ErrorCode::InvalidRequest,
                            "initialize was already done on this connection",
                        ),
                        responder.max_frame,
                    )
                } else {
                    dispatch::initialize(session, id, params)
                };
                if frame.error.is_none() {
                    // This connection now holds the session (taking it
                    // over from any other).
                    conn.generation = Some(session.attach(conn.notes.clone()));
                    session
                        .outbound()
                        .set_answers_requests(&conn.notes, answers_requests);
                }
                record(frame.error, details);
                responder.respond(frame).await;
                return;
            }
            let refusal = if taken_over {
                Some(WireError::new(
                    ErrorCode::SessionTakenOver,
                    "the session was resumed by another connection; this one may only close",
                ))
            } else if conn.generation.is_none() {
                Some(WireError::new(
                    ErrorCode::NotInitialized,
                    format!("{method:?} before initialize: send initialize first"),
                ))
            } else if let Err(rule) = session.profile().check(&method) {
                Some(WireError::new(ErrorCode::PolicyDenied, rule).with("method", method.as_str()))
            } else {
                None
            };
            if let Some(e) = refusal {
                record(Some(e.code), details);
                responder.respond_error(Some(id), &e).await;
                return;
            }
            let Ok(permit) = conn.slots.clone().try_acquire_owned() else {
                let e = WireError::limit("max_requests_in_flight", conn.max_in_flight as u64, None);
                record(Some(e.code), details);
                responder.respond_error(Some(id), &e).await;
                return;
            };
            let token = CancellationToken::new();
            let duplicate = match in_flight.lock().expect("in-flight lock").tokens.entry(id) {
                std::collections::hash_map::Entry::Occupied(_) => true,
                std::collections::hash_map::Entry::Vacant(slot) => {
                    slot.insert(token.clone());
                    false
                }
            };
            if duplicate {
                let e = WireError::new(
                    ErrorCode::InvalidRequest,
                    format!("request id {id} is already in flight"),
                );
                responder.respond_error(Some(id), &e).await;
                return;
            }
            let session = session.clone();
            let responder = responder.clone();
            let in_flight = in_flight.clone();
            tokio::spawn(async move {
                // The request's share of the byte budget, until it is done.
                let _bytes = bytes;
                let work = AssertUnwindSafe(dispatch::dispatch(&session, id, &method, params))
                    .catch_unwind();
                let mut frame = tokio::select! {
                    r = work => match r {
                        Ok(frame) => frame,
                        Err(panic) => {
                            let what = panic
                                .downcast_ref::<&str>()
                                .map(|s| s.to_string())
                                .or_else(|| panic.downcast_ref::<String>().cloned())
                                .unwrap_or_default();
                            tracing::error!(method, panic = %what, "handler panicked");
                            let e = WireError::new(
                                ErrorCode::Internal,
                                format!("internal error (a bug) while handling {method:?}: {what}"),
                            );
                            dispatch::error_frame(id, &e, responder.max_frame)
                        }
                    },
                    _ = token.cancelled() => {
                        let e = WireError::new(ErrorCode::Cancelled, format!("request {id} ({method}) was cancelled"));
                        dispatch::error_frame(id, &e, responder.max_frame)
                    }
                };
                in_flight.lock().expect("in-flight lock").tokens.remove(&id);
                if session.audit().enabled() {
                    session.audit().record(Event {
                        session_id: session.id(),
                        method: &method,
                        id: Some(id),
                        details,
                        outcome: frame.error,
                        elapsed: started.elapsed(),
                    });
                }
                frame.permit = Some(permit);
                responder.respond(frame).await;
            });
        }
        Incoming::Notification { method, params } => {
            if method == methods::CANCEL {
                match executor_protocol::message::from_params::<CancelParams>(params) {
                    Ok(CancelParams { id }) => {
                        if let Some(t) = in_flight.lock().expect("in-flight lock").tokens.get(&id) {
                            t.cancel();
                        } else {
                            tracing::debug!(id, "$/cancel for a request not in flight");
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "malformed $/cancel"),
                }
            } else {
                tracing::debug!(method, "ignoring unknown notification");
            }
        }
        Incoming::Response { id, result } => {
            // An answer to the agent's own request (`network/policyRequest`),
            // from the connection attached now.
            let current = conn.generation.is_some_and(|g| g == session.generation());
            let delivered = current && id.is_some_and(|id| session.outbound().deliver(id, result));
            if !delivered {
                tracing::debug!(?id, "ignoring a response to no pending agent request");
            }
        }
    }
}

/// `initialize.capabilities.agent_requests`, read leniently (a malformed
/// value is `initialize`'s to refuse).
fn declares_agent_requests(params: &rmpv::Value) -> bool {
    let field = |v: &rmpv::Value, name: &str| -> Option<rmpv::Value> {
        v.as_map()?
            .iter()
            .find(|(k, _)| k.as_str() == Some(name))
            .map(|(_, v)| v.clone())
    };
    field(params, "capabilities")
        .and_then(|c| field(&c, "agent_requests"))
        .and_then(|v| v.as_bool())
        .unwrap_or(false)
}

async fn write_loop<W: AsyncWrite + Unpin>(
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
        batch.push(first);
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
            batch.push(next);
        }
        if let Err(e) = write_frames(&mut out, &batch).await {
            tracing::debug!(error = %e, "output closed");
            return;
        }
        // Written: in-flight slots are released with the frames.
        batch.clear();
    }
    let _ = out.flush().await;
}

/// Write frames (head, then tail, of each) with vectored writes.
async fn write_frames<W: AsyncWrite + Unpin>(
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
    out.flush().await
}
