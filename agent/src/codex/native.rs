//! The dialect's side of the native connection: the agent serves the
//! native protocol (a session host's, on its Unix socket, or one served
//! in-process on an in-memory pipe: [`crate::host::route`] decides), and
//! this is its client. Requests
//! are framed with the protocol crate and matched to their answers by id;
//! notifications go, in order, to the dialect's handler, which runs on the
//! reader task (so a hook attached to an answer runs before any later
//! frame is looked at).
//!
//! On a session host's socket the reader reads with `recvmsg`: the
//! descriptor an `fs/passDescriptor` answer carries (`SCM_RIGHTS`, with
//! the frame's first bytes) is taken with the bytes and handed to that
//! answer ([`Native::pass_descriptor`]). Descriptors are accepted on this
//! connection only: the dialect's own, to the session host it started or
//! resumed (the host checked it is the same uid).
//!
//! Uses the protocol crate, `executor-sys` (`recvmsg`), [`crate::host`]
//! and [`crate::config`].

use bytes::{Bytes, BytesMut};
use executor_protocol::codec::FrameDecoder;
use executor_protocol::error::{ErrorCode, WireError};
use executor_protocol::message::{self, Incoming};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

/// The largest frame the dialect reads from the agent (the agent's own
/// frames are bounded by its `max_frame_bytes`, at most 64 MiB).
const MAX_FRAME: usize = 80 << 20;

/// The reader's buffer grows by this much (a 1 MiB block's frame and the
/// next one's head fit).
const READ_BUF: usize = 2 << 20;

/// Descriptors received and not yet handed to their answers, at most
/// (the dialect asks for one at a time; a host sending more is broken).
const MAX_HELD_FDS: usize = 8;

/// A hook run on the reader task with an answer's result before later
/// frames are handled.
pub type Hook = Box<dyn FnOnce(&rmpv::Value) + Send>;

/// An answer of the agent: a decoded value, or an `fs/readBlock` result
/// recognised in its frame and kept there (its data not copied).
enum Answer {
    Value(rmpv::Value),
    Block {
        eof: bool,
        data: Bytes,
    },
    /// An `fs/passDescriptor` answer and the descriptor that came with it
    /// (`None` if none did).
    Descriptor {
        value: rmpv::Value,
        fd: Option<OwnedFd>,
    },
}

impl Answer {
    fn into_value(self) -> rmpv::Value {
        match self {
            Answer::Value(v) | Answer::Descriptor { value: v, .. } => v,
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
    /// A successful answer comes with a descriptor (`fs/passDescriptor`).
    fd: bool,
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
    /// Set once the connection is a session host's socket (descriptors
    /// can come on it).
    on_host: Arc<AtomicBool>,
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
    /// Start the native agent and its client; notifications go to
    /// `notes`. The first frame sent decides where the agent is: a detach
    /// or a resume connects this client straight to the session host's
    /// socket (no relay in between); otherwise the agent is served
    /// in-process on an in-memory pipe.
    pub fn start(
        config: crate::config::Config,
        launch: crate::host::Launch,
        notes: impl Notes,
    ) -> Arc<Native> {
        let (tx, rx) = mpsc::channel::<Vec<u8>>(256);
        let (link_tx, link_rx) = oneshot::channel::<Link>();
        let on_host = Arc::new(AtomicBool::new(false));
        tokio::spawn(link(config, launch, rx, link_tx, on_host.clone()));
        let native = Arc::new(Native {
            to_agent: Mutex::new(Some(tx)),
            reader: Mutex::new(None),
            pending: Mutex::new(Some(HashMap::new())),
            next_id: AtomicU64::new(1),
            on_host,
        });
        let reader = native.clone();
        let task = tokio::spawn(async move {
            let mut notes = notes;
            match link_rx.await {
                Ok(Link {
                    from_agent,
                    preamble,
                }) => {
                    if let Err(e) = reader.read_loop(from_agent, preamble, &mut notes).await {
                        tracing::debug!(error = %e, "native read ended");
                    }
                }
                Err(_) => tracing::debug!("the native agent was never reached"),
            }
            reader.fail_all();
            notes.ended();
        });
        *native.reader.lock().expect("reader lock") = Some(task.abort_handle());
        native
    }

    async fn read_loop(
        &self,
        mut from_agent: Source,
        preamble: bool,
        notes: &mut impl Notes,
    ) -> std::io::Result<()> {
        if preamble {
            let Source::Stream(from_agent) = &mut from_agent else {
                return Err(std::io::Error::other("a session host sends no preamble"));
            };
            let mut got = [0u8; executor_protocol::PREAMBLE.len()];
            from_agent.read_exact(&mut got).await?;
            if &got != executor_protocol::PREAMBLE {
                return Err(std::io::Error::other("the native agent sent no preamble"));
            }
        }
        let mut decoder = FrameDecoder::new(MAX_FRAME);
        let mut buf = BytesMut::with_capacity(READ_BUF);
        let mut fds = VecDeque::new();
        loop {
            while let Some(frame) = decoder
                .decode(&mut buf)
                .map_err(|e| std::io::Error::other(e.to_string()))?
            {
                if let Some((id, eof, start)) = message::read_block_response(&frame) {
                    let data = frame.freeze().slice(start..);
                    self.answer(id, Ok(Answer::Block { eof, data }), &mut fds);
                    continue;
                }
                match Incoming::decode(&frame) {
                    Ok(Incoming::Response {
                        id: Some(id),
                        result,
                    }) => self.answer(id, result.map(Answer::Value), &mut fds),
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
            if buf.capacity() - buf.len() < READ_BUF / 4 {
                buf.reserve(READ_BUF);
            }
            if from_agent.read_buf(&mut buf, &mut fds).await? == 0 {
                return Ok(());
            }
        }
    }

    /// Hand `result` to request `id`; an `fs/passDescriptor` answer takes
    /// the oldest descriptor received (the one sent with its frame).
    fn answer(&self, id: u64, result: Result<Answer, WireError>, fds: &mut VecDeque<OwnedFd>) {
        let p = self
            .pending
            .lock()
            .expect("pending lock")
            .as_mut()
            .and_then(|m| m.remove(&id));
        if let Some(p) = p {
            let result = match result {
                Ok(Answer::Value(value)) if p.fd => Ok(Answer::Descriptor {
                    value,
                    fd: fds.pop_front(),
                }),
                r => r,
            };
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
        decoded(method, v)
    }

    /// Whether descriptors can come on this connection (it is a session
    /// host's socket).
    pub fn on_host(&self) -> bool {
        self.on_host.load(Ordering::Acquire)
    }

    /// `fs/passDescriptor`: the read handle's open file, as the session
    /// host sent it, and the identity the host gave for it (the caller
    /// checks the descriptor against it).
    pub async fn pass_descriptor(
        &self,
        handle: u64,
    ) -> Result<(executor_protocol::types::fs::PassDescriptorResult, OwnedFd), WireError> {
        let method = executor_protocol::methods::FS_PASS_DESCRIPTOR;
        let params = executor_protocol::types::fs::PassDescriptorParams {
            handle,
            sandbox: None,
            cwd: None,
        };
        match self.ask_with(method, &params, None, true).await? {
            Answer::Descriptor {
                value,
                fd: Some(fd),
            } => Ok((decoded(method, value)?, fd)),
            _ => Err(WireError::new(
                ErrorCode::Internal,
                "the session host answered fs/passDescriptor without a descriptor",
            )),
        }
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
            Answer::Value(v) | Answer::Descriptor { value: v, .. } => {
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
        self.ask_with(method, params, hook, false).await
    }

    /// Send `method`; `fd`: its successful answer comes with a descriptor.
    async fn ask_with<P: Serialize>(
        &self,
        method: &str,
        params: &P,
        hook: Option<Hook>,
        fd: bool,
    ) -> Result<Answer, WireError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut frame = Vec::new();
        message::encode_request(&mut frame, id, method, params, MAX_FRAME).map_err(|e| {
            WireError::new(ErrorCode::LimitExceeded, format!("request too large: {e}"))
        })?;
        let (tx, rx) = oneshot::channel();
        match self.pending.lock().expect("pending lock").as_mut() {
            Some(m) => {
                m.insert(id, Pending { tx, hook, fd });
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

/// What the reader reads the agent's frames from.
enum Source {
    /// A session host's socket, read with `recvmsg` (descriptors kept in
    /// the order they came).
    Host(tokio::net::unix::OwnedReadHalf),
    /// An in-process agent's pipe.
    Stream(Box<dyn AsyncRead + Send + Unpin>),
}

impl Source {
    /// Append what is there to `buf` (0 at EOF); descriptors that came
    /// with it go to the back of `fds`.
    async fn read_buf(
        &mut self,
        buf: &mut BytesMut,
        fds: &mut VecDeque<OwnedFd>,
    ) -> std::io::Result<usize> {
        use std::os::fd::AsFd;
        let half = match self {
            Source::Stream(r) => return r.read_buf(buf).await,
            Source::Host(half) => half,
        };
        let sock: &tokio::net::UnixStream = half.as_ref();
        loop {
            sock.readable().await?;
            let r = sock.try_io(tokio::io::Interest::READABLE, || {
                executor_sys::recv_fds_into(sock.as_fd(), buf)
            });
            match r {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
                Ok(got) => {
                    if got.truncated {
                        return Err(std::io::Error::other(
                            "the session host sent more descriptors at once than are taken",
                        ));
                    }
                    if fds.len() + got.fds.len() > MAX_HELD_FDS {
                        return Err(std::io::Error::other(format!(
                            "the session host sent more than {MAX_HELD_FDS} descriptors no answer took"
                        )));
                    }
                    fds.extend(got.fds);
                    return Ok(got.bytes);
                }
            }
        }
    }
}

/// Where the reader reads the agent's frames from.
struct Link {
    from_agent: Source,
    /// Whether the agent's preamble comes first (an in-process agent
    /// writes it; a session host's socket carries frames only).
    preamble: bool,
}

/// Route the connection by its first frame ([`crate::host::route`]), hand
/// the reader its side, and write the frames of `rx` to the agent until
/// the client closes (then the agent sees its input end).
async fn link(
    config: crate::config::Config,
    launch: crate::host::Launch,
    mut rx: mpsc::Receiver<Vec<u8>>,
    reader: oneshot::Sender<Link>,
    on_host: Arc<AtomicBool>,
) {
    let Some(first) = rx.recv().await else {
        return;
    };
    let payload = first.get(4..).unwrap_or_default();
    let mut to_agent: Box<dyn AsyncWrite + Send + Unpin> = match crate::host::route(
        Some(payload),
        &config,
        &launch,
        crate::host::Carry::Bytes,
    )
    .await
    {
        crate::host::Route::Host(stream) => {
            let (from_host, to_host) = stream.into_split();
            on_host.store(true, Ordering::Release);
            let _ = reader.send(Link {
                from_agent: Source::Host(from_host),
                preamble: false,
            });
            Box::new(to_host)
        }
        crate::host::Route::Here(refusal) => {
            let session = match crate::session::Session::from_config(
                config,
                crate::session::Mode::Plain { refusal },
            ) {
                Ok(s) => Arc::new(s),
                Err(e) => {
                    tracing::warn!(error = %e, "the native agent could not start");
                    return;
                }
            };
            let (agent_in, to_agent_w) = tokio::io::duplex(1 << 20);
            let (from_agent_w, from_agent) = tokio::io::duplex(1 << 20);
            tokio::spawn(async move {
                let ending = crate::conn::serve_on(&session, agent_in, from_agent_w, true).await;
                tracing::debug!(?ending, "native side ended");
                session.shutdown().await;
            });
            let _ = reader.send(Link {
                from_agent: Source::Stream(Box::new(from_agent)),
                preamble: true,
            });
            Box::new(to_agent_w)
        }
    };
    let mut frame = Some(first);
    while let Some(f) = frame.take() {
        if to_agent.write_all(&f).await.is_err() {
            return;
        }
        frame = rx.recv().await;
    }
    let _ = to_agent.shutdown().await;
}

/// The agent's answer to `method`, decoded as `R`.
fn decoded<R: DeserializeOwned>(method: &str, v: rmpv::Value) -> Result<R, WireError> {
    rmpv::ext::from_value(v).map_err(|e| {
        WireError::new(
            ErrorCode::Internal,
            format!("internal error (a bug): the agent's answer to {method} did not decode: {e}"),
        )
    })
}

fn gone() -> WireError {
    WireError::new(
        ErrorCode::Internal,
        "the agent's session ended (its connection to the session host closed)",
    )
}
