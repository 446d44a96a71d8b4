//! The dialect's side of the native connection: the agent serves the
//! native protocol ([`crate::host::serve_stdio`], in-process or relayed to
//! a session host) on an in-memory pipe, and this is its client. Requests
//! are framed with the protocol crate and matched to their answers by id;
//! notifications go, in order, to the dialect's handler, which runs on the
//! reader task (so a hook attached to an answer runs before any later
//! frame is looked at).
//!
//! Uses the protocol crate, [`crate::host`] and [`crate::config`].

use bytes::{Bytes, BytesMut};
use executor_protocol::codec::FrameDecoder;
use executor_protocol::error::{ErrorCode, WireError};
use executor_protocol::message::{self, Incoming};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

/// The largest frame the dialect reads from the agent (the agent's own
/// frames are bounded by its `max_frame_bytes`, at most 64 MiB).
const MAX_FRAME: usize = 80 << 20;

/// A hook run on the reader task with an answer's result before later
/// frames are handled.
pub type Hook = Box<dyn FnOnce(&rmpv::Value) + Send>;

/// An answer of the agent: a decoded value, or an `fs/readBlock` result
/// recognised in its frame and kept there (its data not copied).
enum Answer {
    Value(rmpv::Value),
    Block { eof: bool, data: Bytes },
}

impl Answer {
    fn into_value(self) -> rmpv::Value {
        match self {
            Answer::Value(v) => v,
            Answer::Block { eof, data } => rmpv::Value::Map(vec![
                ("eof".into(), eof.into()),
                ("data".into(), rmpv::Value::Binary(data.to_vec())),
            ]),
        }
    }
}

struct Pending {
    tx: oneshot::Sender<Result<Answer, WireError>>,
    hook: Option<Hook>,
}

/// A client of the in-process native agent.
#[allow(missing_debug_implementations)] // channels
pub struct Native {
    /// `None` once closed.
    to_agent: Mutex<Option<mpsc::Sender<Vec<u8>>>>,
    /// Set once the reader task is started: [`Native::stop`] aborts it.
    reader: Mutex<Option<tokio::task::AbortHandle>>,
    pending: Mutex<Option<HashMap<u64, Pending>>>,
    next_id: AtomicU64,
}

/// What the native agent sends that is not an answer.
pub trait Notes: Send + 'static {
    /// The lines a notification becomes, pushed to [`Notes::out`] in
    /// order (the reader waits for room: the agent's own queue then fills
    /// and it reports the lag, which the dialect catches up on).
    fn note(&mut self, method: &str, params: rmpv::Value) -> Vec<Vec<u8>>;
    /// Where the lines go.
    fn out(&self) -> &super::wire::Out;
    /// The native connection ended (the agent is gone).
    fn ended(&mut self);
}

impl Native {
    /// Start the native agent on an in-memory pipe and its client;
    /// notifications go to `notes`.
    pub fn start(
        config: crate::config::Config,
        launch: crate::host::Launch,
        notes: impl Notes,
    ) -> Arc<Native> {
        let (agent_in, mut to_agent_w) = tokio::io::duplex(1 << 20);
        let (from_agent_w, mut from_agent) = tokio::io::duplex(1 << 20);
        tokio::spawn(async move {
            match crate::host::serve_stdio(agent_in, from_agent_w, config, launch).await {
                Ok(ending) => tracing::debug!(?ending, "native side ended"),
                Err(e) => tracing::debug!(error = %e, "native side ended"),
            }
        });
        let (tx, mut rx) = mpsc::channel::<Vec<u8>>(256);
        tokio::spawn(async move {
            while let Some(frame) = rx.recv().await {
                if to_agent_w.write_all(&frame).await.is_err() {
                    break;
                }
            }
            let _ = to_agent_w.shutdown().await;
        });
        let native = Arc::new(Native {
            to_agent: Mutex::new(Some(tx)),
            reader: Mutex::new(None),
            pending: Mutex::new(Some(HashMap::new())),
            next_id: AtomicU64::new(1),
        });
        let reader = native.clone();
        let task = tokio::spawn(async move {
            let mut notes = notes;
            if let Err(e) = reader.read_loop(&mut from_agent, &mut notes).await {
                tracing::debug!(error = %e, "native read ended");
            }
            reader.fail_all();
            notes.ended();
        });
        *native.reader.lock().expect("reader lock") = Some(task.abort_handle());
        native
    }

    async fn read_loop(
        &self,
        from_agent: &mut tokio::io::DuplexStream,
        notes: &mut impl Notes,
    ) -> std::io::Result<()> {
        let mut preamble = [0u8; executor_protocol::PREAMBLE.len()];
        from_agent.read_exact(&mut preamble).await?;
        if &preamble != executor_protocol::PREAMBLE {
            return Err(std::io::Error::other("the native agent sent no preamble"));
        }
        let mut decoder = FrameDecoder::new(MAX_FRAME);
        let mut buf = BytesMut::with_capacity(256 * 1024);
        loop {
            while let Some(frame) = decoder
                .decode(&mut buf)
                .map_err(|e| std::io::Error::other(e.to_string()))?
            {
                if let Some((id, eof, start)) = message::read_block_response(&frame) {
                    let data = frame.freeze().slice(start..);
                    self.answer(id, Ok(Answer::Block { eof, data }));
                    continue;
                }
                match Incoming::decode(&frame) {
                    Ok(Incoming::Response {
                        id: Some(id),
                        result,
                    }) => self.answer(id, result.map(Answer::Value)),
                    Ok(Incoming::Response { id: None, result }) => {
                        tracing::warn!(?result, "native answer without an id");
                    }
                    Ok(Incoming::Notification { method, params }) => {
                        for line in notes.note(&method, params) {
                            if notes.out().send(line).await.is_err() {
                                return Ok(());
                            }
                        }
                    }
                    Ok(Incoming::Request { method, .. }) => {
                        tracing::debug!(method, "ignoring an agent request (none is asked for)");
                    }
                    Err(e) => tracing::warn!(error = %e, "undecodable native frame"),
                }
            }
            if from_agent.read_buf(&mut buf).await? == 0 {
                return Ok(());
            }
        }
    }

    fn answer(&self, id: u64, result: Result<Answer, WireError>) {
        let p = self
            .pending
            .lock()
            .expect("pending lock")
            .as_mut()
            .and_then(|m| m.remove(&id));
        if let Some(p) = p {
            let result = match (p.hook, result) {
                (Some(hook), Ok(a)) => {
                    let v = a.into_value();
                    hook(&v);
                    Ok(Answer::Value(v))
                }
                (_, r) => r,
            };
            let _ = p.tx.send(result);
        }
    }

    fn fail_all(&self) {
        let all = self.pending.lock().expect("pending lock").take();
        for (_, p) in all.into_iter().flatten() {
            let _ = p.tx.send(Err(gone()));
        }
    }

    /// Send `method` with `params`; the answer, decoded as `R`.
    pub async fn call<P: Serialize, R: DeserializeOwned>(
        &self,
        method: &str,
        params: &P,
    ) -> Result<R, WireError> {
        let v = self.call_value(method, params, None).await?;
        rmpv::ext::from_value(v).map_err(|e| {
            WireError::new(
                ErrorCode::Internal,
                format!(
                    "internal error (a bug): the agent's answer to {method} did not decode: {e}"
                ),
            )
        })
    }

    /// Send `method`; `hook` runs on the answer (when it is a result)
    /// before any later frame of the agent is handled.
    pub async fn call_value<P: Serialize>(
        &self,
        method: &str,
        params: &P,
        hook: Option<Hook>,
    ) -> Result<rmpv::Value, WireError> {
        self.ask(method, params, hook).await.map(Answer::into_value)
    }

    /// `fs/readBlock`: whether the read reached the end of the file, and
    /// the data as it came in the agent's frame (not copied).
    pub async fn read_block(
        &self,
        params: &executor_protocol::types::fs::ReadBlockParams,
    ) -> Result<(bool, Bytes), WireError> {
        match self
            .ask(executor_protocol::methods::FS_READ_BLOCK, params, None)
            .await?
        {
            Answer::Block { eof, data } => Ok((eof, data)),
            Answer::Value(v) => {
                let r: executor_protocol::types::fs::ReadBlockResult =
                    rmpv::ext::from_value(v).map_err(|e| {
                        WireError::new(
                            ErrorCode::Internal,
                            format!(
                                "internal error (a bug): the agent's answer to fs/readBlock did not decode: {e}"
                            ),
                        )
                    })?;
                Ok((r.eof, Bytes::from(r.data.into_vec())))
            }
        }
    }

    async fn ask<P: Serialize>(
        &self,
        method: &str,
        params: &P,
        hook: Option<Hook>,
    ) -> Result<Answer, WireError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut frame = Vec::new();
        message::encode_request(&mut frame, id, method, params, MAX_FRAME).map_err(|e| {
            WireError::new(ErrorCode::LimitExceeded, format!("request too large: {e}"))
        })?;
        let (tx, rx) = oneshot::channel();
        match self.pending.lock().expect("pending lock").as_mut() {
            Some(m) => {
                m.insert(id, Pending { tx, hook });
            }
            None => return Err(gone()),
        }
        let Some(to_agent) = self.sender() else {
            return Err(gone());
        };
        if to_agent.send(frame).await.is_err() {
            return Err(gone());
        }
        rx.await.unwrap_or_else(|_| Err(gone()))
    }

    /// Send a notification (`$/cancel`).
    pub async fn notify<P: Serialize>(&self, method: &str, params: &P) {
        let mut frame = Vec::new();
        if message::encode_notification(&mut frame, method, params, MAX_FRAME).is_ok() {
            if let Some(to_agent) = self.sender() {
                let _ = to_agent.send(frame).await;
            }
        }
    }

    fn sender(&self) -> Option<mpsc::Sender<Vec<u8>>> {
        self.to_agent.lock().expect("sender lock").clone()
    }

    /// End the native connection (the agent sees its input end: a
    /// detached session lives on in its host); what is in flight is still
    /// answered.
    pub fn close(&self) {
        self.to_agent.lock().expect("sender lock").take();
    }

    /// End the native connection both ways: nothing more is read from the
    /// agent (its relay then ends at once; a detached session lives on in
    /// its host), what was asked and not answered fails.
    pub fn stop(&self) {
        self.close();
        if let Some(reader) = self.reader.lock().expect("reader lock").take() {
            reader.abort();
        }
        self.fail_all();
    }
}

fn gone() -> WireError {
    WireError::new(
        ErrorCode::Internal,
        "the agent's session ended (its connection to the session host closed)",
    )
}
