//! Frames on their way out, the only place the agent encodes a message:
//! [`OutFrame`] (bytes, a zero-copy tail, the request's in-flight permit);
//! [`Reply`], what a handler answers (a value, a value with a zero-copy
//! tail, or a stream's head) and [`reply_frame`] / [`error_frame`], which
//! frame it; and [`Outbound`], where a session's notifications go (the
//! connection attached to it, if any), with typed pushes for bulk data
//! ([`Outbound::notify_output`], [`Outbound::notify_body_delta`]).
//! The agent's own requests to the client (`network/policyRequest`, §8)
//! go out and their answers come back here too ([`Outbound::request`],
//! [`Outbound::deliver`]).
//!
//! A read stream's block may travel in a kernel pipe instead of memory
//! ([`pipes`], [`OutFrame::piped`], [`Outbound::notify_read_data_piped`]),
//! when the attached connection's writer can splice ([`Outbound::splices`]).
//!
//! The bottom layer of the agent: it depends on the protocol crate (and
//! the sandbox crate's system calls, for [`pipes`]) only; the tables, the
//! session, the handlers, dispatch and the connection all use it, it uses
//! none of them.

pub mod pipes;

use bytes::Bytes;
use executor_protocol::message::{
    encode_body_delta_head, encode_error, encode_notification, encode_output_head,
    encode_read_block_head, encode_read_stream_data_head, encode_request, encode_response,
    EncodeError,
};
use executor_protocol::types::process::OutputStream;
use executor_protocol::{ErrorCode, WireError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, OwnedSemaphorePermit};

/// A framed message on its way to the writer: `bytes`, then `tail` (bulk
/// data sent by reference with a vectored write, never copied), then what
/// `piped` holds (moved from its pipe to the connection inside the
/// kernel). A frame has at most one of `tail` and `piped`.
#[derive(Debug)]
pub struct OutFrame {
    pub bytes: Vec<u8>,
    pub tail: Option<bytes::Bytes>,
    /// A block pinned in a pipe, its length already in `bytes` (the head).
    pub piped: Option<pipes::PooledPipe>,
    /// Released when written: bounds requests between arrival and answer,
    /// and the read streams' read-ahead (`Session::read_ahead`).
    pub permit: Option<OwnedSemaphorePermit>,
    /// Fired once the connection's writer has taken the frame: what is
    /// queued after that (a stream's notifications) is written after it.
    /// Queued alone is not enough: a channel hands out its messages in the
    /// order their senders claimed a slot, so a response still being
    /// queued by another task holds back one queued after it, and the
    /// writer takes the next notification first.
    pub on_taken: Option<tokio::sync::oneshot::Sender<()>>,
    /// The error code when this frame answers with an error (for the
    /// audit log).
    pub error: Option<ErrorCode>,
    /// A descriptor sent with the frame's first bytes (`SCM_RIGHTS`,
    /// `fs/passDescriptor`); dropped unsent by a writer that cannot pass
    /// descriptors.
    pub fd: Option<std::os::fd::OwnedFd>,
}

impl OutFrame {
    /// A frame held in one buffer.
    pub fn new(bytes: Vec<u8>) -> Self {
        OutFrame {
            bytes,
            tail: None,
            piped: None,
            permit: None,
            on_taken: None,
            error: None,
            fd: None,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
            + self.tail.as_ref().map_or(0, |t| t.len())
            + self.piped.as_ref().map_or(0, |p| p.held())
    }
}

/// Where a session's notifications go: the connection attached to it, if
/// any. Shared by everything that pushes (process pumps, HTTP streams);
/// a detached session's notifications are dropped (the client catches up
/// with `process/read` after a resume), a resumed one's go to the new
/// connection.
#[derive(Debug, Clone)]
pub struct Outbound {
    notes: Arc<std::sync::RwLock<Option<mpsc::Sender<OutFrame>>>>,
    /// Whether the attached connection's writer splices piped blocks (it
    /// copies them otherwise).
    splices: Arc<AtomicBool>,
    /// Which connection is attached: changed (under the `notes` lock) at
    /// every attach.
    attachment: Arc<AtomicU64>,
    max_frame: usize,
    requests: Arc<AgentRequests>,
}

/// The agent's requests awaiting an answer, and which connection may be
/// asked (the one whose `initialize` declared `agent_requests`).
#[derive(Debug, Default)]
struct AgentRequests {
    next_id: AtomicU64,
    pending: Mutex<HashMap<u64, tokio::sync::oneshot::Sender<Result<rmpv::Value, WireError>>>>,
    answering: std::sync::RwLock<Option<mpsc::Sender<OutFrame>>>,
}

/// Why a request to the client got no answer.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestError {
    /// No connection is attached, or the attached one did not declare
    /// `capabilities.agent_requests`.
    NoClient,
    /// No answer in time.
    Timeout,
    /// The client answered with an error.
    Answered(WireError),
}

/// Why a notification could not be queued.
#[derive(Debug, PartialEq, Eq)]
pub enum NotifyError {
    /// The queue is full: the client is not keeping up.
    Full,
    /// No connection is attached.
    Closed,
    /// The notification cannot be framed (larger than the frame limit).
    Unencodable(String),
}

/// A handler's result, encoded once the request id is known.
pub trait ReplyValue: Send {
    /// The response frame answering request `id`.
    fn encode(&self, id: u64, max_frame: usize) -> Result<Vec<u8>, EncodeError>;
}

impl<T: serde::Serialize + Send> ReplyValue for T {
    fn encode(&self, id: u64, max_frame: usize) -> Result<Vec<u8>, EncodeError> {
        let mut bytes = Vec::new();
        encode_response(&mut bytes, Some(id), self, max_frame)?;
        Ok(bytes)
    }
}

/// What a handler answers with. Handlers never see frames: dispatch turns
/// a typed result into a `Reply` ([`IntoReply`]) and the connection frames
/// it with [`reply_frame`].
#[allow(missing_debug_implementations)] // holds a type-erased result
pub enum Reply {
    /// A result value.
    Value(Box<dyn ReplyValue>),
    /// `{eof, data}` with `data` sent by reference after the frame head
    /// (`fs/readBlock`): a value with a zero-copy tail.
    Block { eof: bool, data: Bytes },
    /// A value sent with a descriptor (`fs/passDescriptor`).
    Descriptor {
        value: Box<dyn ReplyValue>,
        fd: std::os::fd::OwnedFd,
    },
    /// A stream's head; `started` fires once the writer has taken it, so
    /// what the stream pushes next (its notifications) follows it on the
    /// wire.
    Stream {
        head: Box<dyn ReplyValue>,
        started: tokio::sync::oneshot::Sender<()>,
    },
}

impl Reply {
    /// A plain result value.
    pub fn value<T: serde::Serialize + Send + 'static>(v: T) -> Reply {
        Reply::Value(Box::new(v))
    }
}

/// A handler's result type, made a [`Reply`].
pub trait IntoReply {
    fn into_reply(self) -> Reply;
}

impl IntoReply for Reply {
    fn into_reply(self) -> Reply {
        self
    }
}

impl<T: serde::Serialize + Send + 'static> IntoReply for T {
    fn into_reply(self) -> Reply {
        Reply::value(self)
    }
}

/// The frame answering request `id` with `outcome`.
pub fn reply_frame(id: u64, outcome: Result<Reply, WireError>, max_frame: usize) -> OutFrame {
    let internal = |e: EncodeError| {
        let err = WireError::new(
            ErrorCode::Internal,
            format!("cannot encode the result: {e}"),
        );
        error_frame(id, &err, max_frame)
    };
    match outcome {
        Ok(Reply::Value(v)) => match v.encode(id, max_frame) {
            Ok(bytes) => OutFrame::new(bytes),
            Err(e) => internal(e),
        },
        Ok(Reply::Block { eof, data }) => {
            let mut head = Vec::with_capacity(48);
            match encode_read_block_head(&mut head, id, eof, data.len(), max_frame) {
                Ok(()) => OutFrame {
                    tail: Some(data),
                    ..OutFrame::new(head)
                },
                Err(e) => error_frame(
                    id,
                    &WireError::new(ErrorCode::Internal, e.to_string()),
                    max_frame,
                ),
            }
        }
        Ok(Reply::Descriptor { value, fd }) => match value.encode(id, max_frame) {
            Ok(bytes) => OutFrame {
                fd: Some(fd),
                ..OutFrame::new(bytes)
            },
            Err(e) => internal(e),
        },
        Ok(Reply::Stream { head, started }) => match head.encode(id, max_frame) {
            Ok(bytes) => OutFrame {
                on_taken: Some(started),
                ..OutFrame::new(bytes)
            },
            Err(e) => internal(e),
        },
        Err(err) => error_frame(id, &err, max_frame),
    }
}

/// An error response frame (`id` is `None` when the request's id could
/// not be read).
pub fn error_frame(id: impl Into<Option<u64>>, err: &WireError, max_frame: usize) -> OutFrame {
    let id = id.into();
    let mut bytes = Vec::new();
    if encode_error(&mut bytes, id, err, max_frame).is_err() {
        // Only an enormous message could fail; send the code alone.
        let short = WireError::new(err.code, "error message too large to send");
        let _ = encode_error(&mut bytes, id, &short, max_frame);
    }
    OutFrame {
        error: Some(err.code),
        ..OutFrame::new(bytes)
    }
}

/// A notification frame (`None`, logged, when it cannot be encoded).
pub fn notification_frame<P: serde::Serialize>(
    method: &str,
    params: &P,
    max_frame: usize,
) -> Option<OutFrame> {
    let mut bytes = Vec::new();
    match encode_notification(&mut bytes, method, params, max_frame) {
        Ok(()) => Some(OutFrame::new(bytes)),
        Err(e) => {
            tracing::error!(method, error = %e, "cannot encode notification");
            None
        }
    }
}

/// A frame head followed by `data` by reference.
fn with_tail(head: Vec<u8>, data: Bytes) -> OutFrame {
    OutFrame {
        tail: Some(data),
        ..OutFrame::new(head)
    }
}

impl Outbound {
    /// A sink with no connection yet.
    pub fn new(max_frame: usize) -> Self {
        Outbound {
            notes: Arc::new(std::sync::RwLock::new(None)),
            splices: Arc::new(AtomicBool::new(false)),
            attachment: Arc::new(AtomicU64::new(0)),
            max_frame,
            requests: Arc::new(AgentRequests::default()),
        }
    }

    /// Record whether the connection whose notifications go to `tx` answers
    /// the agent's requests (its `initialize` capabilities).
    pub(crate) fn set_answers_requests(&self, tx: &mpsc::Sender<OutFrame>, yes: bool) {
        *self.requests.answering.write().expect("answering lock") = yes.then(|| tx.clone());
    }

    /// Whether the attached connection answers the agent's requests.
    pub fn client_answers_requests(&self) -> bool {
        self.answering_channel().is_some()
    }

    fn answering_channel(&self) -> Option<mpsc::Sender<OutFrame>> {
        let notes = self.notes.read().expect("notes lock");
        let answering = self.requests.answering.read().expect("answering lock");
        match (notes.as_ref(), answering.as_ref()) {
            (Some(n), Some(a)) if n.same_channel(a) => Some(n.clone()),
            _ => None,
        }
    }

    /// Send the client the request `method` and wait at most `timeout` for
    /// its answer (queueing counts against the same time).
    pub async fn request<P: serde::Serialize>(
        &self,
        method: &str,
        params: &P,
        timeout: Duration,
    ) -> Result<rmpv::Value, RequestError> {
        let tx = self.answering_channel().ok_or(RequestError::NoClient)?;
        let id = self.requests.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let mut bytes = Vec::new();
        if let Err(e) = encode_request(&mut bytes, id, method, params, self.max_frame) {
            tracing::error!(method, error = %e, "cannot encode a request to the client");
            return Err(RequestError::NoClient);
        }
        let (otx, orx) = tokio::sync::oneshot::channel();
        self.requests
            .pending
            .lock()
            .expect("pending lock")
            .insert(id, otx);
        let exchange = async {
            tx.send(OutFrame::new(bytes))
                .await
                .map_err(|_| RequestError::NoClient)?;
            orx.await.map_err(|_| RequestError::NoClient)
        };
        let out = match tokio::time::timeout(timeout, exchange).await {
            Ok(Ok(Ok(v))) => Ok(v),
            Ok(Ok(Err(e))) => Err(RequestError::Answered(e)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(RequestError::Timeout),
        };
        self.requests
            .pending
            .lock()
            .expect("pending lock")
            .remove(&id);
        out
    }

    /// A response from the client: to the request `id` if one waits for it
    /// (`false`: nobody asked, or it timed out).
    pub fn deliver(&self, id: u64, result: Result<rmpv::Value, WireError>) -> bool {
        let waiting = self
            .requests
            .pending
            .lock()
            .expect("pending lock")
            .remove(&id);
        match waiting {
            Some(tx) => tx.send(result).is_ok(),
            None => false,
        }
    }

    /// Largest frame this session sends.
    pub fn max_frame(&self) -> usize {
        self.max_frame
    }

    /// Notifications go to `tx` from now on; `splices`: its writer moves
    /// piped blocks inside the kernel.
    pub(crate) fn attach(&self, tx: mpsc::Sender<OutFrame>, splices: bool) {
        let mut notes = self.notes.write().expect("notes lock");
        *notes = Some(tx);
        self.splices.store(splices, Ordering::Relaxed);
        self.attachment.fetch_add(1, Ordering::Relaxed);
    }

    /// The attached connection, as a number no other attach has: what a
    /// stream that belongs to one connection sends goes to it only
    /// ([`Outbound::notify_read_data`]).
    pub fn attachment(&self) -> u64 {
        let _notes = self.notes.read().expect("notes lock");
        self.attachment.load(Ordering::Relaxed)
    }

    /// Whether blocks are worth sending piped: the attached connection's
    /// writer splices them into its output (a frame that reaches another
    /// writer, after a takeover, is copied there: correct, only slower).
    pub fn splices(&self) -> bool {
        self.splices.load(Ordering::Relaxed)
    }

    /// Detach `tx`, unless another connection took its place.
    pub(crate) fn detach(&self, tx: &mpsc::Sender<OutFrame>) {
        let mut slot = self.notes.write().expect("notes lock");
        if slot.as_ref().is_some_and(|cur| cur.same_channel(tx)) {
            *slot = None;
        }
    }

    fn current(&self) -> Result<mpsc::Sender<OutFrame>, NotifyError> {
        self.notes
            .read()
            .expect("notes lock")
            .clone()
            .ok_or(NotifyError::Closed)
    }

    /// Queue `process/output` (`data` by reference after its head),
    /// waiting at most `patience` for room: a client that drains its input
    /// slows the job down (no loss); one that stalls longer gets `Full`.
    pub async fn notify_output(
        &self,
        process_id: &str,
        seq: u64,
        stream: OutputStream,
        data: Bytes,
        patience: Duration,
    ) -> Result<(), NotifyError> {
        let mut head = Vec::with_capacity(96);
        encode_output_head(
            &mut head,
            process_id,
            seq,
            stream,
            data.len(),
            self.max_frame,
        )
        .map_err(|e| NotifyError::Unencodable(e.to_string()))?;
        self.notify_frame_within(with_tail(head, data), patience)
            .await
    }

    /// Queue a non-final `http/request/bodyDelta` (`data` by reference
    /// after its head), waiting for room as long as it takes.
    pub async fn notify_body_delta(
        &self,
        stream_id: u64,
        seq: u64,
        data: Bytes,
    ) -> Result<(), NotifyError> {
        let mut head = Vec::with_capacity(64);
        encode_body_delta_head(&mut head, stream_id, seq, data.len(), self.max_frame)
            .map_err(|e| NotifyError::Unencodable(e.to_string()))?;
        self.notify_frame(with_tail(head, data)).await
    }

    /// Queue `fs/readStream/data` (`data` by reference after its head) to
    /// the connection of `attachment` only (`Closed` once another took its
    /// place), waiting for room as long as it takes.
    pub async fn notify_read_data(
        &self,
        attachment: u64,
        stream_id: u64,
        offset: u64,
        data: Bytes,
        held: OwnedSemaphorePermit,
    ) -> Result<(), NotifyError> {
        let head = self.read_data_head(stream_id, offset, data.len())?;
        let mut frame = with_tail(head, data);
        frame.permit = Some(held);
        self.notify_frame_to(attachment, frame).await
    }

    /// Queue `fs/readStream/data` whose data is what `pipe` holds (its
    /// length fixed before the head is made), as
    /// [`Outbound::notify_read_data`] does.
    pub async fn notify_read_data_piped(
        &self,
        attachment: u64,
        stream_id: u64,
        offset: u64,
        pipe: pipes::PooledPipe,
        held: OwnedSemaphorePermit,
    ) -> Result<(), NotifyError> {
        let head = self.read_data_head(stream_id, offset, pipe.held())?;
        let frame = OutFrame {
            piped: Some(pipe),
            permit: Some(held),
            ..OutFrame::new(head)
        };
        self.notify_frame_to(attachment, frame).await
    }

    /// Queue a notification to the connection of `attachment` only,
    /// waiting for room.
    pub async fn notify_to<P: serde::Serialize>(
        &self,
        attachment: u64,
        method: &str,
        params: &P,
    ) -> Result<(), NotifyError> {
        let Some(frame) = notification_frame(method, params, self.max_frame) else {
            return Ok(());
        };
        self.notify_frame_to(attachment, frame).await
    }

    /// Queue a prepared frame to the connection of `attachment` only,
    /// waiting for room as long as it takes.
    async fn notify_frame_to(&self, attachment: u64, frame: OutFrame) -> Result<(), NotifyError> {
        let tx = {
            let notes = self.notes.read().expect("notes lock");
            if self.attachment.load(Ordering::Relaxed) != attachment {
                return Err(NotifyError::Closed);
            }
            notes.clone().ok_or(NotifyError::Closed)?
        };
        tx.send(frame).await.map_err(|_| NotifyError::Closed)
    }

    fn read_data_head(
        &self,
        stream_id: u64,
        offset: u64,
        len: usize,
    ) -> Result<Vec<u8>, NotifyError> {
        let mut head = Vec::with_capacity(64);
        encode_read_stream_data_head(&mut head, stream_id, offset, len, self.max_frame)
            .map_err(|e| NotifyError::Unencodable(e.to_string()))?;
        Ok(head)
    }

    /// Queue a prepared notification frame, waiting at most `patience` for
    /// room.
    async fn notify_frame_within(
        &self,
        frame: OutFrame,
        patience: Duration,
    ) -> Result<(), NotifyError> {
        // The common case queues under the read lock, without cloning the
        // sender; only a full queue (waiting) takes a clone.
        let frame = {
            let slot = self.notes.read().expect("notes lock");
            let Some(notes) = slot.as_ref() else {
                return Err(NotifyError::Closed);
            };
            match notes.try_send(frame) {
                Ok(()) => return Ok(()),
                Err(mpsc::error::TrySendError::Closed(_)) => return Err(NotifyError::Closed),
                Err(mpsc::error::TrySendError::Full(frame)) => frame,
            }
        };
        match tokio::time::timeout(patience, self.current()?.send(frame)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(NotifyError::Closed),
            Err(_) => Err(NotifyError::Full),
        }
    }

    /// Queue a prepared notification frame, waiting for room as long as it
    /// takes (the producer is paused meanwhile: backpressure, no loss).
    async fn notify_frame(&self, frame: OutFrame) -> Result<(), NotifyError> {
        self.current()?
            .send(frame)
            .await
            .map_err(|_| NotifyError::Closed)
    }

    /// Queue a notification, waiting at most `patience` for room.
    pub async fn notify_within<P: serde::Serialize>(
        &self,
        method: &str,
        params: &P,
        patience: Duration,
    ) -> Result<(), NotifyError> {
        let Some(frame) = notification_frame(method, params, self.max_frame) else {
            return Ok(());
        };
        self.notify_frame_within(frame, patience).await
    }

    /// Queue a notification, waiting for room (for rare, must-deliver ones).
    pub async fn notify<P: serde::Serialize>(
        &self,
        method: &str,
        params: &P,
    ) -> Result<(), NotifyError> {
        let Some(frame) = notification_frame(method, params, self.max_frame) else {
            return Ok(());
        };
        self.notify_frame(frame).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use executor_protocol::message::{encode_response, Incoming};

    fn whole(f: &OutFrame) -> Vec<u8> {
        let mut v = f.bytes.clone();
        v.extend_from_slice(f.tail.as_deref().unwrap_or_default());
        v
    }

    #[test]
    fn a_block_reply_is_the_bytes_of_its_value_with_the_data_by_reference() {
        #[derive(serde::Serialize)]
        struct Block {
            eof: bool,
            #[serde(with = "serde_bytes")]
            data: Vec<u8>,
        }
        let data = Bytes::from_static(b"0123456789");
        let f = reply_frame(
            7,
            Ok(Reply::Block {
                eof: true,
                data: data.clone(),
            }),
            1 << 20,
        );
        assert_eq!(f.tail.as_ref(), Some(&data), "sent by reference");
        let mut want = Vec::new();
        let value = Block {
            eof: true,
            data: data.to_vec(),
        };
        encode_response(&mut want, Some(7), &value, 1 << 20).unwrap();
        assert_eq!(whole(&f), want);
        assert!(f.error.is_none() && f.on_taken.is_none());
    }

    #[test]
    fn a_stream_reply_fires_when_taken_and_errors_carry_their_code() {
        let (tx, _rx) = tokio::sync::oneshot::channel();
        let f = reply_frame(
            1,
            Ok(Reply::Stream {
                head: Box::new(5u8),
                started: tx,
            }),
            1 << 20,
        );
        assert!(f.on_taken.is_some());
        let e = WireError::new(ErrorCode::NotFound, "gone");
        let f = reply_frame(2, Err(e), 1 << 20);
        assert_eq!(f.error, Some(ErrorCode::NotFound));
        match Incoming::decode(&f.bytes[4..]).unwrap() {
            Incoming::Response {
                id: Some(2),
                result: Err(e),
            } => assert_eq!(e.message, "gone"),
            other => panic!("{other:?}"),
        }
        // A result above the frame limit is answered `internal`.
        let f = reply_frame(3, Ok(Reply::value(vec![0u8; 64])), 16);
        assert_eq!(f.error, Some(ErrorCode::Internal));
    }

    #[tokio::test]
    async fn a_detached_session_drops_notifications() {
        let out = Outbound::new(1 << 20);
        let pushed = out
            .notify_output(
                "proc-1",
                0,
                OutputStream::Stdout,
                Bytes::new(),
                Duration::ZERO,
            )
            .await;
        assert_eq!(pushed, Err(NotifyError::Closed));
        let (tx, mut rx) = tokio::sync::mpsc::channel(1);
        out.attach(tx.clone(), false);
        out.notify_body_delta(4, 0, Bytes::from_static(b"x"))
            .await
            .unwrap();
        assert_eq!(rx.recv().await.unwrap().tail.as_deref(), Some(&b"x"[..]));
        out.detach(&tx);
        assert_eq!(
            out.notify_body_delta(4, 1, Bytes::new()).await,
            Err(NotifyError::Closed)
        );
    }
}
