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

use crate::audit::{self, Audit, Event};
use crate::config::Config;
use crate::dispatch;
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

/// A framed message on its way to the writer: `bytes`, then `tail` (bulk
/// data sent by reference with a vectored write, never copied).
#[derive(Debug)]
pub struct OutFrame {
    pub bytes: Vec<u8>,
    pub tail: Option<bytes::Bytes>,
    /// Released when written: bounds requests between arrival and answer.
    pub permit: Option<OwnedSemaphorePermit>,
    /// Fired once the frame is queued: what is queued after it (a stream's
    /// notifications) is written after it.
    pub on_queued: Option<tokio::sync::oneshot::Sender<()>>,
    /// The error code when this frame answers with an error (for the
    /// audit log).
    pub error: Option<ErrorCode>,
}

impl OutFrame {
    /// A frame held in one buffer.
    pub fn new(bytes: Vec<u8>) -> Self {
        OutFrame {
            bytes,
            tail: None,
            permit: None,
            on_queued: None,
            error: None,
        }
    }

    fn len(&self) -> usize {
        self.bytes.len() + self.tail.as_ref().map_or(0, |t| t.len())
    }
}

/// The sending side of the connection, shared with handlers.
#[derive(Debug, Clone)]
pub struct Outbound {
    responses: mpsc::Sender<OutFrame>,
    notes: mpsc::Sender<OutFrame>,
    max_frame: usize,
}

/// Why `try_notify` could not queue a notification.
#[derive(Debug, PartialEq, Eq)]
pub enum NotifyError {
    /// The queue is full: the client is not keeping up.
    Full,
    /// The connection is gone.
    Closed,
}

impl Outbound {
    /// Largest frame this connection sends.
    pub fn max_frame(&self) -> usize {
        self.max_frame
    }

    fn encode_note<P: serde::Serialize>(&self, method: &str, params: &P) -> Option<OutFrame> {
        let mut bytes = Vec::new();
        match encode_notification(&mut bytes, method, params, self.max_frame) {
            Ok(()) => Some(OutFrame::new(bytes)),
            Err(e) => {
                tracing::error!(method, error = %e, "cannot encode notification");
                None
            }
        }
    }

    /// Queue a prepared notification frame, waiting at most `patience` for
    /// room: a client that drains its input slows the producer down (no
    /// loss); one that stalls longer than that gets `Full`.
    pub async fn notify_frame_within(
        &self,
        frame: OutFrame,
        patience: Duration,
    ) -> Result<(), NotifyError> {
        match self.notes.try_send(frame) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(NotifyError::Closed),
            Err(mpsc::error::TrySendError::Full(frame)) => {
                match tokio::time::timeout(patience, self.notes.send(frame)).await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(_)) => Err(NotifyError::Closed),
                    Err(_) => Err(NotifyError::Full),
                }
            }
        }
    }

    /// Queue a prepared notification frame, waiting for room as long as it
    /// takes (the producer is paused meanwhile: backpressure, no loss).
    pub async fn notify_frame(&self, frame: OutFrame) -> Result<(), NotifyError> {
        self.notes
            .send(frame)
            .await
            .map_err(|_| NotifyError::Closed)
    }

    /// Queue a notification, waiting for room (for rare, must-deliver ones).
    pub async fn notify<P: serde::Serialize>(
        &self,
        method: &str,
        params: &P,
    ) -> Result<(), NotifyError> {
        let Some(frame) = self.encode_note(method, params) else {
            return Ok(());
        };
        self.notes
            .send(frame)
            .await
            .map_err(|_| NotifyError::Closed)
    }

    async fn respond(&self, mut frame: OutFrame) {
        let queued = frame.on_queued.take();
        // Fails only when the writer is gone; nothing left to tell then.
        if self.responses.send(frame).await.is_ok() {
            if let Some(signal) = queued {
                let _ = signal.send(());
            }
        }
    }

    async fn respond_error(&self, id: Option<u64>, error: &WireError) {
        let mut bytes = Vec::new();
        if encode_error(&mut bytes, id, error, self.max_frame).is_ok() {
            self.respond(OutFrame::new(bytes)).await;
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
pub async fn serve<R, W>(mut input: R, output: W, config: Config) -> std::io::Result<Ending>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let Config {
        limits,
        http,
        profile,
        audit,
    } = config;
    let audit = match Audit::open(&audit, profile.name.as_deref()) {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(error = %e, "cannot open the audit log");
            return Err(std::io::Error::other(e));
        }
    };
    let max_frame = limits.max_frame_bytes as usize;
    let max_in_flight = limits.max_requests_in_flight as usize;
    let (resp_tx, resp_rx) = mpsc::channel::<OutFrame>(max_in_flight + RESPONSE_QUEUE_SLACK);
    let (note_tx, note_rx) = mpsc::channel::<OutFrame>(NOTIFICATION_QUEUE);
    let outbound = Outbound {
        responses: resp_tx,
        notes: note_tx,
        max_frame,
    };
    let writer = tokio::spawn(write_loop(output, resp_rx, note_rx));

    let http = Arc::new(crate::http::HttpContext::new(http));
    let session = Arc::new(Session::new(limits, http, profile, audit, outbound.clone()));
    let slots = Arc::new(Semaphore::new(max_in_flight));
    let in_flight = Arc::new(Mutex::new(InFlight::default()));
    let mut decoder = FrameDecoder::new(max_frame);
    let mut buf = BytesMut::with_capacity(256 * 1024);

    let ending = 'read: loop {
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(frame)) => {
                    handle_frame(
                        &frame,
                        &session,
                        &outbound,
                        &slots,
                        &in_flight,
                        max_in_flight,
                    )
                    .await;
                }
                Ok(None) => break,
                Err(e) => {
                    report_frame_error(&outbound, &e).await;
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
            _ = outbound.responses.closed() => break 'read Ending::OutputClosed,
        }
    };
    tracing::debug!(?ending, "connection input ended");

    // Let what is in flight finish briefly, then cancel the rest.
    let deadline = tokio::time::Instant::now() + EOF_GRACE;
    while slots.available_permits() < max_in_flight && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for token in in_flight.lock().expect("in-flight lock").tokens.values() {
        token.cancel();
    }
    let _ = tokio::time::timeout(EOF_GRACE, async {
        while slots.available_permits() < max_in_flight {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    session.shutdown().await;
    drop(session);
    drop(outbound);
    // The writer ends once every sender is gone and its queues are drained.
    let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
    Ok(ending)
}

async fn report_frame_error(outbound: &Outbound, e: &FrameError) {
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
    if encode_notification(&mut bytes, methods::ERROR, &error, outbound.max_frame).is_ok() {
        outbound.respond(OutFrame::new(bytes)).await;
    }
}

async fn handle_frame(
    frame: &[u8],
    session: &Arc<Session>,
    outbound: &Outbound,
    slots: &Arc<Semaphore>,
    in_flight: &Arc<Mutex<InFlight>>,
    max_in_flight: usize,
) {
    let incoming = match Incoming::decode(frame) {
        Ok(m) => m,
        Err(DecodeError { id, error }) => {
            tracing::debug!(?id, error = %error, "undecodable message");
            outbound.respond_error(id, &error).await;
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
            if method == methods::INITIALIZE {
                let frame = dispatch::initialize(session, id, params);
                record(frame.error, details);
                outbound.respond(frame).await;
                return;
            }
            let refusal = if !session.is_initialized() {
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
                outbound.respond_error(Some(id), &e).await;
                return;
            }
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                let e = WireError::limit("max_requests_in_flight", max_in_flight as u64, None);
                record(Some(e.code), details);
                outbound.respond_error(Some(id), &e).await;
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
                outbound.respond_error(Some(id), &e).await;
                return;
            }
            let session = session.clone();
            let outbound = outbound.clone();
            let in_flight = in_flight.clone();
            tokio::spawn(async move {
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
                            dispatch::error_frame(id, &e, outbound.max_frame())
                        }
                    },
                    _ = token.cancelled() => {
                        let e = WireError::new(ErrorCode::Cancelled, format!("request {id} ({method}) was cancelled"));
                        dispatch::error_frame(id, &e, outbound.max_frame())
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
                outbound.respond(frame).await;
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
        Incoming::Response { id, .. } => {
            tracing::debug!(?id, "ignoring a response: the agent sends no requests");
        }
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
    mut out: W,
    mut responses: mpsc::Receiver<OutFrame>,
    mut notes: mpsc::Receiver<OutFrame>,
) {
    if out.write_all(PREAMBLE).await.is_err() || out.flush().await.is_err() {
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
