//! Processes (docs/PROTOCOL.md §3): start, output, read, write, signal, resize,
//! list, and the end of every job when the session ends.
//!
//! Each job has its own tasks: one per output stream draining it into the
//! bounded [`output::OutputBuffer`] (so a child never blocks on a full
//! pipe, whatever the client does), and one waiting for its exit. Output is
//! pushed as `process/output` only while the connection's notification
//! queue has room; otherwise the job is marked lagged, `process/lagged` is
//! sent once, and the client catches up with `process/read`.

pub mod output;
pub mod spawn;

use crate::outbound::{NotifyError, OutFrame, Outbound};
use crate::session::Session;
use bytes::{Bytes, BytesMut};
use executor_protocol::limits::MAX_OUTPUT_BUFFER_BYTES;
use executor_protocol::message::encode_output_head;
use executor_protocol::methods as m;
use executor_protocol::types::process::*;
use executor_protocol::types::Empty;
use executor_protocol::{ErrorCode, WireError};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use output::{Chunk, OutputBuffer};
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

/// How long an exited process stays readable after a client saw its exit.
pub const REAP_AFTER: Duration = Duration::from_secs(30);
/// How long a job's output push may wait for room in the notification
/// queue before the job is marked lagged (the client is not reading).
pub const LAG_PATIENCE: Duration = Duration::from_millis(500);
/// Grace between SIGTERM and SIGKILL when a session ends.
pub const TERM_GRACE: Duration = Duration::from_secs(2);

/// How a job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl Exit {
    /// The conventional signal name (`SIGTERM`).
    pub fn signal_name(&self) -> Option<String> {
        self.signal.map(signal_name)
    }
    /// A shell-style code: the exit code, or 128 + the signal number.
    pub fn shell_code(&self) -> i32 {
        self.code.unwrap_or_else(|| 128 + self.signal.unwrap_or(0))
    }
    fn info(&self) -> ExitInfo {
        ExitInfo {
            exit_code: self.code,
            signal: self.signal_name(),
        }
    }
}

/// `SIGTERM` for 15, `SIG42` for what nix does not name.
pub fn signal_name(n: i32) -> String {
    Signal::try_from(n)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("SIG{n}"))
}

enum StdinSink {
    Pipe(tokio::process::ChildStdin),
    /// The PTY master (a dup), written as a stream.
    Pty(tokio::net::unix::pipe::Sender),
}

struct State {
    out: OutputBuffer,
    exit: Option<Exit>,
    streams_open: usize,
    lagged: bool,
    /// The task queueing `process/lagged`: `process/exited` waits for it.
    lag_note: Option<tokio::task::JoinHandle<()>>,
    delivered: bool,
    /// Next seq that `exec_command`/`write_stdin` will hand out.
    pub exec_cursor: u64,
}

/// One job of the session.
pub struct Proc {
    pub id: String,
    pub pid: u32,
    pub argv: Vec<String>,
    pub tag: Option<String>,
    pub tty: bool,
    /// Started under an enforced sandbox policy.
    pub sandboxed: bool,
    notify: bool,
    state: Mutex<State>,
    changed: watch::Sender<u64>,
    push_order: tokio::sync::Mutex<()>,
    stdin: tokio::sync::Mutex<Option<StdinSink>>,
    /// The PTY master, kept for `process/resize`.
    /// The PTY master (for resize); released when the job ends.
    pty: Mutex<Option<OwnedFd>>,
}

impl std::fmt::Debug for Proc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proc")
            .field("id", &self.id)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

impl Proc {
    fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Whether the job is still running.
    pub fn running(&self) -> bool {
        self.state.lock().expect("proc state").exit.is_none()
    }

    /// The exit, once the job ended *and* all its output is buffered.
    pub fn finished(&self) -> Option<Exit> {
        let st = self.state.lock().expect("proc state");
        if st.streams_open == 0 {
            st.exit
        } else {
            None
        }
    }

    /// Buffer a chunk, then push it as `process/output` if the client keeps
    /// up. While the notification queue is full the pump waits (the child
    /// is slowed, nothing is lost) up to [`LAG_PATIENCE`]; past that the job
    /// is marked lagged, `process/lagged` is sent once, and output is only
    /// retained (bounded) until the client reads it.
    async fn append(&self, stream: OutputStream, data: Bytes, outbound: &Outbound) {
        // Per job, pushes leave in seq order (stdout and stderr pumps race).
        let _order = self.push_order.lock().await;
        let (seq, push) = {
            let mut st = self.state.lock().expect("proc state");
            let seq = st.out.push(stream, data.clone());
            (seq, self.notify && !st.lagged)
        };
        self.bump();
        if !push {
            return;
        }
        let mut head = Vec::with_capacity(96);
        if encode_output_head(
            &mut head,
            &self.id,
            seq,
            stream,
            data.len(),
            outbound.max_frame(),
        )
        .is_err()
        {
            return;
        }
        let frame = OutFrame {
            tail: Some(data),
            ..OutFrame::new(head)
        };
        if let Err(NotifyError::Full) = outbound.notify_frame_within(frame, LAG_PATIENCE).await {
            tracing::debug!(process_id = %self.id, seq, "client not keeping up: process lagged");
            let mut st = self.state.lock().expect("proc state");
            st.lagged = true;
            let outbound = outbound.clone();
            let lagged = ProcessLagged {
                process_id: self.id.clone(),
                next_seq: seq,
            };
            let previous = st.lag_note.take();
            st.lag_note = Some(tokio::spawn(async move {
                // In order: a lag notice is queued after the previous one.
                if let Some(p) = previous {
                    let _ = p.await;
                }
                let _ = outbound.notify(m::PROCESS_LAGGED, &lagged).await;
            }));
        }
    }

    fn stream_closed(&self) {
        self.state.lock().expect("proc state").streams_open -= 1;
        self.bump();
    }

    /// Wait until the state changes or `deadline` passes.
    pub async fn changed_until(
        &self,
        rx: &mut watch::Receiver<u64>,
        deadline: tokio::time::Instant,
    ) -> bool {
        tokio::time::timeout_at(deadline, rx.changed())
            .await
            .is_ok()
    }

    /// A receiver of state changes (new output, exit).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Take the output not yet handed to `exec_command`/`write_stdin`, and
    /// how many chunks were dropped from the buffer before they could be.
    pub fn take_exec_output(&self) -> (Vec<Chunk>, u64) {
        let mut st = self.state.lock().expect("proc state");
        let cursor = st.exec_cursor;
        let missed = st.out.first_seq().saturating_sub(cursor);
        let chunks = st.out.read(cursor.checked_sub(1), usize::MAX);
        st.exec_cursor = st.out.next_seq();
        (chunks, missed)
    }

    /// The documented `sandbox_denied` heuristic: a sandboxed job that
    /// ended unsuccessfully and whose recent output shows a permission-style
    /// error (EPERM, EACCES, EROFS and their messages). Kernel audit records
    /// would be exact but are not readable by an unprivileged agent.
    pub fn sandbox_denied(&self) -> Option<bool> {
        if !self.sandboxed {
            return None;
        }
        let st = self.state.lock().expect("proc state");
        let exit = st.exit?;
        if exit.code == Some(0) {
            return None;
        }
        let chunks = st.out.read(st.out.next_seq().checked_sub(64), usize::MAX);
        let mut tail = Vec::new();
        for c in &chunks {
            tail.extend_from_slice(&c.data);
        }
        let text =
            String::from_utf8_lossy(&tail[tail.len().saturating_sub(64 * 1024)..]).to_lowercase();
        const MARKERS: &[&str] = &[
            "permission denied",
            "operation not permitted",
            "read-only file system",
            "eacces",
            "eperm",
            "erofs",
        ];
        MARKERS.iter().any(|m| text.contains(m)).then_some(true)
    }

    /// Mark the exit as given to a client: reaping starts.
    pub fn mark_delivered(self: &Arc<Self>, session: &Arc<Session>) {
        let first = {
            let mut st = self.state.lock().expect("proc state");
            let first = !st.delivered;
            st.delivered = true;
            first
        };
        if first {
            let weak = Arc::downgrade(session);
            let id = self.id.clone();
            tokio::spawn(async move {
                tokio::time::sleep(REAP_AFTER).await;
                if let Some(s) = weak.upgrade() {
                    s.processes().remove(&id);
                }
            });
        }
    }

    /// Send `signal` to the job's process group (no-op once it exited).
    pub fn signal(&self, signal: Signal) -> Result<(), WireError> {
        if !self.running() {
            return Ok(());
        }
        match killpg(Pid::from_raw(self.pid as i32), signal) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
            Err(e) => Err(WireError::new(
                ErrorCode::Io,
                format!("cannot signal process {} (pid {}): {e}", self.id, self.pid),
            )
            .with("errno", e as i32)),
        }
    }

    /// Write to the job's stdin (pipe or PTY).
    pub async fn write_stdin(&self, data: &[u8], close: bool) -> Result<(), WireError> {
        let mut guard = self.stdin.lock().await;
        let closed_err = || {
            WireError::new(
                ErrorCode::Io,
                format!("stdin of process {} is closed", self.id),
            )
            .with("errno", libc::EPIPE)
        };
        if !data.is_empty() {
            match guard.as_mut() {
                None => return Err(closed_err()),
                Some(StdinSink::Pipe(p)) => p.write_all(data).await.map_err(|e| {
                    WireError::new(
                        ErrorCode::Io,
                        format!("writing to stdin of process {}: {e}", self.id),
                    )
                    .with("errno", e.raw_os_error().unwrap_or(0))
                })?,
                Some(StdinSink::Pty(fd)) => fd.write_all(data).await.map_err(|e| {
                    WireError::new(
                        ErrorCode::Io,
                        format!("writing to the terminal of process {}: {e}", self.id),
                    )
                    .with("errno", e.raw_os_error().unwrap_or(0))
                })?,
            }
        }
        if close {
            match guard.take() {
                // EOF for a terminal is the line discipline's EOF character.
                Some(StdinSink::Pty(mut fd)) => {
                    let _ = fd.write_all(b"\x04").await;
                }
                Some(StdinSink::Pipe(mut p)) => {
                    let _ = p.shutdown().await;
                }
                None => {}
            }
        }
        Ok(())
    }
}

/// The session's jobs.
#[derive(Debug, Default)]
pub struct ProcessTable {
    map: Mutex<HashMap<String, Arc<Proc>>>,
    next_id: AtomicU64,
    running: Arc<AtomicUsize>,
}

impl ProcessTable {
    /// Look up a job by id.
    pub fn get(&self, id: &str) -> Result<Arc<Proc>, WireError> {
        self.map
            .lock()
            .expect("process table")
            .get(id)
            .cloned()
            .ok_or_else(|| {
                WireError::new(
                    ErrorCode::UnknownProcess,
                    format!("no process {id:?} in this session"),
                )
                .with("process_id", id)
            })
    }

    fn remove(&self, id: &str) {
        self.map.lock().expect("process table").remove(id);
    }

    /// Every job.
    pub fn all(&self) -> Vec<Arc<Proc>> {
        let mut v: Vec<_> = self
            .map
            .lock()
            .expect("process table")
            .values()
            .cloned()
            .collect();
        v.sort_by_key(|p| p.id.trim_start_matches("proc-").parse::<u64>().unwrap_or(0));
        v
    }

    /// SIGTERM every running job, SIGKILL what is left after the grace.
    pub async fn terminate_all(&self) {
        let procs: Vec<_> = self.all().into_iter().filter(|p| p.running()).collect();
        if procs.is_empty() {
            return;
        }
        for p in &procs {
            let _ = p.signal(Signal::SIGTERM);
        }
        let deadline = tokio::time::Instant::now() + TERM_GRACE;
        for p in &procs {
            let mut rx = p.subscribe();
            while p.running() && p.changed_until(&mut rx, deadline).await {}
        }
        for p in &procs {
            let _ = p.signal(Signal::SIGKILL);
        }
        let deadline = tokio::time::Instant::now() + TERM_GRACE;
        for p in &procs {
            let mut rx = p.subscribe();
            while p.running() && p.changed_until(&mut rx, deadline).await {}
        }
    }
}

/// Options of a start that `process/start` and `exec_command` share.
#[derive(Debug)]
pub struct StartOptions<'a> {
    pub argv: &'a [String],
    pub cwd: &'a executor_protocol::WirePath,
    pub env: &'a std::collections::BTreeMap<String, String>,
    pub arg0: Option<&'a str>,
    pub tty: bool,
    pub pty_size: Option<PtySize>,
    pub stdin_null: bool,
    pub notify: bool,
    pub output_buffer_bytes: Option<u64>,
    pub tag: Option<String>,
    /// The request's sandbox intent and the field that holds it (for
    /// messages); the profile's applies too (see [`crate::sandbox_gate`]).
    pub intent: Option<&'a executor_protocol::types::sandbox::SandboxIntent>,
    pub intent_param: &'a str,
    /// The request field holding `argv` (`argv`, `command`), for messages.
    pub argv_param: &'a str,
}

/// A started job, and what of its sandbox intent was not enforced (only
/// with `required: false`).
#[allow(missing_debug_implementations)] // `Proc` holds descriptors and tasks
pub struct Started {
    pub proc: Arc<Proc>,
    pub sandbox_degraded: Option<Vec<String>>,
    /// With egress by name: where the job's proxy listens.
    pub egress: Option<executor_protocol::types::network::EgressInfo>,
}

/// Start a job and its tasks; register it in the session. The request is
/// checked (argv, cwd, limits, a `max_processes` slot) before its sandbox
/// is planned, so a refused start leaves nothing on the host.
pub async fn start(s: &Arc<Session>, o: StartOptions<'_>) -> Result<Started, WireError> {
    use std::os::unix::ffi::OsStrExt;
    if o.argv.is_empty() {
        return Err(WireError::invalid_params(
            o.argv_param,
            format!("{} must not be empty", o.argv_param),
        ));
    }
    if !o.cwd.is_absolute() {
        return Err(WireError::invalid_params(
            "cwd",
            format!("cwd must be an absolute path, got {:?}", o.cwd.display()),
        ));
    }
    let limits = s.limits();
    let cap = o.output_buffer_bytes.unwrap_or(limits.output_buffer_bytes);
    if cap > MAX_OUTPUT_BUFFER_BYTES {
        return Err(WireError::limit(
            "output_buffer_bytes",
            MAX_OUTPUT_BUFFER_BYTES,
            Some(cap),
        ));
    }
    if let Some(size) = o.pty_size {
        if size.rows == 0 || size.cols == 0 {
            return Err(WireError::invalid_params(
                if size.rows == 0 {
                    "pty_size.rows"
                } else {
                    "pty_size.cols"
                },
                "pty_size rows and cols must be at least 1",
            ));
        }
    }
    let table = s.processes();
    // Reserve a slot first, so concurrent starts cannot overshoot.
    let running = table.running.fetch_add(1, Ordering::SeqCst);
    if running as u64 >= limits.max_processes {
        table.running.fetch_sub(1, Ordering::SeqCst);
        return Err(WireError::limit(
            "max_processes",
            limits.max_processes,
            None,
        ));
    }
    let slot = SlotGuard(table.running.clone(), true);
    let cwd = PathBuf::from(std::ffi::OsStr::from_bytes(o.cwd.as_bytes()));
    let mut decision = crate::sandbox_gate::gate(
        s.capabilities(),
        o.intent,
        Some(&cwd),
        o.intent_param,
        s.profile(),
    )?;
    let egress_rules = decision.take_egress();
    let (sandbox, files, sandbox_degraded) = decision.into_parts();
    // Egress by name: the job's environment names its proxy (§8).
    let egress_port = match sandbox.as_ref().map(|p| &p.net) {
        Some(executor_sandbox::plan::WireNet::Egress { port }) => Some(*port),
        _ => None,
    };
    let job_env = egress_port.map(|port| crate::egress::job_env(o.env, port));
    let req = spawn::SpawnRequest {
        argv: o.argv,
        cwd: &cwd,
        env: job_env.as_ref().unwrap_or(o.env),
        arg0: o.arg0,
        tty: o.tty.then(|| o.pty_size.unwrap_or_default()),
        stdin_null: o.stdin_null,
        sandbox: sandbox.as_ref(),
    };
    // On an error the job's files are dropped here, and removed.
    let mut spawned = spawn::spawn(&req).await?;
    let id = format!("proc-{}", table.next_id.fetch_add(1, Ordering::SeqCst) + 1);
    let egress = match (egress_rules, spawned.egress_listener.take()) {
        (Some(rules), Some(listener)) => start_egress(s, &id, rules, listener),
        _ => None,
    };
    // The PTY master as three fds: a reader, a writer, and one for resize.
    // (tokio's pipe types drive any non-blocking fd safely; a PTY master
    // reads and writes like a pipe, and EIO means the job side closed.)
    let mut pty_reader = None;
    let mut stdin = spawned.stdin.map(StdinSink::Pipe);
    let pty = match spawned.pty_master {
        Some(master) => {
            let io =
                |e: std::io::Error| WireError::new(ErrorCode::Io, format!("pseudo-terminal: {e}"));
            let r = master.try_clone().map_err(io)?;
            let w = master.try_clone().map_err(io)?;
            pty_reader =
                Some(tokio::net::unix::pipe::Receiver::from_owned_fd_unchecked(r).map_err(io)?);
            stdin = Some(StdinSink::Pty(
                tokio::net::unix::pipe::Sender::from_owned_fd_unchecked(w).map_err(io)?,
            ));
            Some(master)
        }
        None => None,
    };
    let streams = if pty.is_some() { 1 } else { 2 };
    let (changed, _) = watch::channel(0u64);
    let proc = Arc::new(Proc {
        id: id.clone(),
        pid: spawned.pid,
        argv: o.argv.to_vec(),
        tag: o.tag,
        tty: o.tty,
        sandboxed: sandbox.is_some(),
        notify: o.notify,
        state: Mutex::new(State {
            out: OutputBuffer::new(cap as usize),
            exit: None,
            streams_open: streams,
            lagged: false,
            lag_note: None,
            delivered: false,
            exec_cursor: 0,
        }),
        changed,
        push_order: tokio::sync::Mutex::new(()),
        stdin: tokio::sync::Mutex::new(stdin),
        pty: Mutex::new(pty),
    });
    table
        .map
        .lock()
        .expect("process table")
        .insert(id.clone(), proc.clone());
    tracing::info!(
        session_id = ?s.id(),
        process_id = %id,
        pid = spawned.pid,
        argv = ?o.argv,
        cwd = %o.cwd.display(),
        tty = o.tty,
        "process started"
    );

    let chunk = s.limits().max_output_chunk_bytes.clamp(1024, 1 << 20) as usize;
    let outbound = s.outbound().clone();
    if let Some(r) = pty_reader {
        tokio::spawn(pump(
            proc.clone(),
            OutputStream::Pty,
            r,
            outbound.clone(),
            chunk,
        ));
    } else {
        if let Some(out) = spawned.stdout {
            tokio::spawn(pump(
                proc.clone(),
                OutputStream::Stdout,
                out,
                outbound.clone(),
                chunk,
            ));
        }
        if let Some(err) = spawned.stderr {
            tokio::spawn(pump(
                proc.clone(),
                OutputStream::Stderr,
                err,
                outbound.clone(),
                chunk,
            ));
        }
    }
    tokio::spawn(wait_job(
        proc.clone(),
        spawned.supervisor,
        spawned.status,
        outbound,
        Arc::downgrade(s),
        slot,
        JobHeld { files, egress },
    ));
    Ok(Started {
        proc,
        sandbox_degraded,
        egress: egress_port.map(|port| executor_protocol::types::network::EgressInfo {
            proxy: crate::egress::proxy_url(port),
        }),
    })
}

/// Serve a job's egress proxy on the listener its init handed over; every
/// decision is also an audit line. `None` (logged) if it cannot be served:
/// the job then reaches nothing at all.
fn start_egress(
    s: &Arc<Session>,
    process_id: &str,
    rules: crate::egress::Rules,
    listener: OwnedFd,
) -> Option<crate::egress::Server> {
    let session = Arc::downgrade(s);
    let audit: crate::egress::AuditSink = Arc::new(move |d| {
        let Some(s) = session.upgrade() else { return };
        if !s.audit().enabled() {
            return;
        }
        use executor_protocol::types::network::{DecisionSource, EgressVerdict};
        let outcome = match (d.decision, d.source) {
            (EgressVerdict::Allow, _) => None,
            (EgressVerdict::Deny, DecisionSource::Policy) => Some(ErrorCode::PolicyDenied),
            (EgressVerdict::Deny, _) => Some(ErrorCode::SandboxDenied),
        };
        let mut details = serde_json::Map::new();
        details.insert("process_id".into(), d.process_id.clone().into());
        details.insert("host".into(), d.host.clone().into());
        details.insert("port".into(), d.port.into());
        details.insert("decision".into(), d.decision.as_str().into());
        details.insert("source".into(), d.source.as_str().into());
        details.insert("addresses".into(), d.addresses.clone().into());
        s.audit().record(crate::audit::Event {
            session_id: s.id(),
            method: m::NETWORK_DECISION,
            id: None,
            details,
            outcome,
            elapsed: Duration::ZERO,
        });
    });
    let job = crate::egress::Job {
        process_id: process_id.to_string(),
        rules,
        allow: s.http().config.allow.clone(),
        outbound: s.outbound().clone(),
        audit,
        max_connections: s.limits().max_egress_connections,
    };
    match crate::egress::serve(listener, job) {
        Ok(server) => Some(server),
        Err(e) => {
            tracing::error!(process_id, error = %e, "cannot serve the job's egress proxy; the job reaches nothing");
            None
        }
    }
}

/// Releases a `max_processes` slot when the job ends (or never started).
struct SlotGuard(Arc<AtomicUsize>, bool);
impl Drop for SlotGuard {
    fn drop(&mut self) {
        if self.1 {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

async fn pump<R: AsyncRead + Unpin>(
    proc: Arc<Proc>,
    stream: OutputStream,
    mut r: R,
    outbound: Outbound,
    chunk: usize,
) {
    loop {
        let mut buf = BytesMut::with_capacity(chunk);
        match r.read_buf(&mut buf).await {
            Ok(0) => break,
            Ok(_) => proc.append(stream, buf.freeze(), &outbound).await,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // EIO from a PTY master: the job side is closed.
                tracing::debug!(process_id = %proc.id, error = %e, "output ended");
                break;
            }
        }
    }
    proc.stream_closed();
}

/// What a job owns on the agent's side until it ends: its files on the
/// host, and its egress proxy.
struct JobHeld {
    files: executor_sandbox::plan::JobFiles,
    egress: Option<crate::egress::Server>,
}

async fn wait_job(
    proc: Arc<Proc>,
    mut supervisor: tokio::process::Child,
    mut status: tokio::net::unix::pipe::Receiver,
    outbound: Outbound,
    session: std::sync::Weak<Session>,
    slot: SlotGuard,
    held: JobHeld,
) {
    let JobHeld { files, egress } = held;
    let mut msg = [0u8; executor_sandbox::trampoline::Status::LEN];
    let reported = match status.read_exact(&mut msg).await {
        Ok(_) => match executor_sandbox::trampoline::Status::decode(msg) {
            Some(executor_sandbox::trampoline::Status::Exited { raw }) => Some(raw),
            _ => None,
        },
        _ => None,
    };
    let sup = supervisor.wait().await;
    // The job is gone: its proxy stops, and its namespace with it.
    drop(egress);
    let exit = match reported {
        Some(raw) => {
            let (code, signal) = executor_sandbox::trampoline::decode_wait_status(raw);
            Exit { code, signal }
        }
        None => {
            // The supervisor died without reporting (killed from outside).
            use std::os::unix::process::ExitStatusExt;
            let st = sup.ok();
            Exit {
                code: st.and_then(|s| s.code()),
                signal: st.and_then(|s| s.signal()),
            }
        }
    };
    drop(slot);
    // A finished job's record stays readable for a while; its descriptors
    // must not (a thousand finished jobs would hold a thousand fds).
    proc.stdin.lock().await.take();
    proc.pty.lock().expect("pty lock").take();
    if !files.is_empty() {
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || files.remove()).await {
            tracing::warn!(process_id = %proc.id, error = %e, "cannot remove the job's directory or placeholders");
        }
    }
    // All output first: `process/exited` follows the last `process/output`.
    let mut rx = proc.subscribe();
    loop {
        {
            let mut st = proc.state.lock().expect("proc state");
            if st.streams_open == 0 {
                st.exit = Some(exit);
                break;
            }
        }
        if rx.changed().await.is_err() {
            break;
        }
    }
    proc.bump();
    tracing::info!(process_id = %proc.id, exit_code = ?exit.code, signal = ?exit.signal, "process exited");
    if proc.notify {
        let (final_seq, lag_note) = {
            let mut st = proc.state.lock().expect("proc state");
            (st.out.next_seq().checked_sub(1), st.lag_note.take())
        };
        // `process/lagged` (if any) goes out before `process/exited`.
        if let Some(t) = lag_note {
            let _ = t.await;
        }
        let note = ProcessExited {
            process_id: proc.id.clone(),
            exit_code: exit.code,
            signal: exit.signal_name(),
            signal_number: exit.signal,
            final_seq,
            sandbox_denied: proc.sandbox_denied(),
        };
        if outbound.notify(m::PROCESS_EXITED, &note).await.is_ok() {
            if let Some(s) = session.upgrade() {
                proc.mark_delivered(&s);
            }
        }
    }
}

// ---- handlers -------------------------------------------------------------

/// `process/start`
pub async fn handle_start(
    s: &Arc<Session>,
    p: ProcessStartParams,
) -> Result<ProcessStartResult, WireError> {
    let started = start(
        s,
        StartOptions {
            argv: &p.argv,
            cwd: &p.cwd,
            env: &p.env,
            arg0: p.arg0.as_deref(),
            tty: p.tty,
            pty_size: p.pty_size,
            stdin_null: p.stdin == StdinMode::Null,
            notify: p.notify,
            output_buffer_bytes: p.output_buffer_bytes,
            tag: p.tag,
            intent: p.sandbox.as_ref(),
            intent_param: "sandbox",
            argv_param: "argv",
        },
    )
    .await?;
    Ok(ProcessStartResult {
        process_id: started.proc.id.clone(),
        pid: started.proc.pid,
        sandbox_degraded: started.sandbox_degraded,
        egress: started.egress,
    })
}

/// `process/read`
pub async fn handle_read(
    s: &Arc<Session>,
    p: ProcessReadParams,
) -> Result<ProcessReadResult, WireError> {
    let proc = s.processes().get(&p.process_id)?;
    let max_bytes = p
        .max_bytes
        .unwrap_or(1 << 20)
        .min(s.limits().max_frame_bytes / 2)
        .max(1) as usize;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(p.wait_ms.unwrap_or(0));
    let mut rx = proc.subscribe();
    loop {
        let result = {
            let mut st = proc.state.lock().expect("proc state");
            let chunks = st.out.read(p.after_seq, max_bytes);
            let finished = st.streams_open == 0 && st.exit.is_some();
            if chunks.is_empty() && !finished && tokio::time::Instant::now() < deadline {
                None
            } else {
                st.lagged = false;
                let exited = if finished {
                    st.exit.map(|e| e.info())
                } else {
                    None
                };
                Some(ProcessReadResult {
                    chunks: chunks
                        .into_iter()
                        .map(|c| OutputChunk {
                            seq: c.seq,
                            stream: c.stream,
                            data: serde_bytes::ByteBuf::from(c.data.to_vec()),
                        })
                        .collect(),
                    next_seq: st.out.next_seq(),
                    exited,
                    dropped_before: st.out.dropped_before(),
                })
            }
        };
        if let Some(r) = result {
            if r.exited.is_some() {
                proc.mark_delivered(s);
            }
            return Ok(r);
        }
        proc.changed_until(&mut rx, deadline).await;
    }
}

/// `process/write`
pub async fn handle_write(s: &Arc<Session>, p: ProcessWriteParams) -> Result<Empty, WireError> {
    let proc = s.processes().get(&p.process_id)?;
    proc.write_stdin(&p.data, p.close_stdin).await?;
    Ok(Empty {})
}

/// The host signal for a wire signal name.
pub fn to_signal(n: SignalName) -> Signal {
    match n {
        SignalName::Interrupt => Signal::SIGINT,
        SignalName::Terminate => Signal::SIGTERM,
        SignalName::Kill => Signal::SIGKILL,
        SignalName::Hangup => Signal::SIGHUP,
        SignalName::Quit => Signal::SIGQUIT,
        SignalName::User1 => Signal::SIGUSR1,
        SignalName::User2 => Signal::SIGUSR2,
        SignalName::Continue => Signal::SIGCONT,
        SignalName::Stop => Signal::SIGSTOP,
    }
}

/// `process/signal`
pub async fn handle_signal(s: &Arc<Session>, p: ProcessSignalParams) -> Result<Empty, WireError> {
    let proc = s.processes().get(&p.process_id)?;
    tracing::info!(process_id = %proc.id, signal = %p.signal, "signal");
    proc.signal(to_signal(p.signal))?;
    Ok(Empty {})
}

/// `process/resize`
pub async fn handle_resize(s: &Arc<Session>, p: ProcessResizeParams) -> Result<Empty, WireError> {
    let proc = s.processes().get(&p.process_id)?;
    if !proc.tty {
        return Err(WireError::invalid_params(
            "process_id",
            format!("process {} has no terminal (started without tty)", proc.id),
        ));
    }
    if p.rows == 0 || p.cols == 0 {
        return Err(WireError::invalid_params(
            if p.rows == 0 { "rows" } else { "cols" },
            "rows and cols must be at least 1",
        ));
    }
    let pty = proc.pty.lock().expect("pty lock");
    let Some(fd) = pty.as_ref() else {
        return Err(WireError::invalid_params(
            "process_id",
            format!("process {} has exited: its terminal is gone", proc.id),
        ));
    };
    use std::os::fd::AsFd;
    executor_sandbox::sys::set_winsize(fd.as_fd(), p.rows, p.cols).map_err(|e| {
        WireError::new(
            ErrorCode::Io,
            format!("resizing the terminal of {}: {e}", proc.id),
        )
    })?;
    Ok(Empty {})
}

/// `process/list`
pub async fn handle_list(s: &Arc<Session>, _p: Empty) -> Result<ProcessListResult, WireError> {
    Ok(ProcessListResult {
        processes: s
            .processes()
            .all()
            .into_iter()
            .map(|p| ProcessInfo {
                process_id: p.id.clone(),
                pid: p.pid,
                argv: p.argv.clone(),
                tag: p.tag.clone(),
                running: p.running(),
            })
            .collect(),
    })
}
