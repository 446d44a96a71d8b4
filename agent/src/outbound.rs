//! Frames on their way out: [`OutFrame`] (bytes, a zero-copy tail, the
//! request's in-flight permit), and [`Outbound`], where a session's
//! notifications go (the connection attached to it, if any).
//!
//! The bottom layer of the agent: it depends on the protocol crate only;
//! handlers, the session and the connection all use it, it uses none of
//! them.

use executor_protocol::message::encode_notification;
use executor_protocol::ErrorCode;
use std::sync::Arc;
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
