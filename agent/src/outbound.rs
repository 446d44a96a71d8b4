//! Frames on their way out: [`OutFrame`] (bytes, a zero-copy tail, the
//! request's in-flight permit), and [`Outbound`], where a session's
//! notifications go (the connection attached to it, if any), and where the
//! agent's own requests to the client (`network/policyRequest`, §8) go and
//! their answers come back ([`Outbound::request`], [`Outbound::deliver`]).
//!
//! The bottom layer of the agent: it depends on the protocol crate only;
//! handlers, the session and the connection all use it, it uses none of
//! them.

use executor_protocol::message::{encode_notification, encode_request};
use executor_protocol::{ErrorCode, WireError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, OwnedSemaphorePermit};

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

    pub(crate) fn len(&self) -> usize {
        self.bytes.len() + self.tail.as_ref().map_or(0, |t| t.len())
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
}

impl Outbound {
    /// A sink with no connection yet.
    pub fn new(max_frame: usize) -> Self {
        Outbound {
            notes: Arc::new(std::sync::RwLock::new(None)),
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

    pub(crate) fn attach(&self, tx: mpsc::Sender<OutFrame>) {
        *self.notes.write().expect("notes lock") = Some(tx);
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
    pub async fn notify_frame(&self, frame: OutFrame) -> Result<(), NotifyError> {
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
        let Some(frame) = self.encode_note(method, params) else {
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
        let Some(frame) = self.encode_note(method, params) else {
            return Ok(());
        };
        self.notify_frame(frame).await
    }
}
