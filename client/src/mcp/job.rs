//! [`JobTransport`]: rmcp's `Transport<RoleClient>` over an MCP stdio
//! server run on the host as a job (`process/start` with pipes).
//!
//! Two tasks own the job once it started: the reader (the job's output in
//! seq order through [`Process`]: stdout cut into whole lines for
//! `receive`, stderr to the caller or this process's stderr; then the
//! exit) and the writer (each sent message written in the order `send` was
//! called; once the transport is closed or dropped, the shutdown ladder
//! through [`ProcessControl`]). The end is published on a watch channel
//! ([`JobExit`]).

use crate::process::{ExitStatus, Process, ProcessControl};
use crate::{Client, Error};
use bytes::Bytes;
use executor_protocol::types::process::{EnvBase, OutputStream, ProcessStartParams, SignalName};
use executor_protocol::types::sandbox::SandboxIntent;
use rmcp::service::{RoleClient, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};

/// The default longest line (one JSON-RPC message) taken from the
/// server's stdout, as the `mcp stdio` bridge's.
pub const DEFAULT_MAX_LINE: usize = 64 * 1024 * 1024;

/// The default time between closing the server's stdin, terminating it and
/// killing it (the `mcp stdio` bridge's `--grace`).
pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);

/// Largest piece of one `process/write` (well under a frame's 16 MiB).
const WRITE_PIECE: usize = 1024 * 1024;

/// Whole lines waiting for `receive` before the reader stops taking output
/// (then the agent buffers, then the job blocks on its stdout).
const LINES_QUEUED: usize = 64;

/// Stderr chunks held for a caller that took them; past it, chunks are
/// dropped (said once) rather than stalling the server's stdout.
const STDERR_QUEUED: usize = 256;

/// What to run: argv, cwd, environment, sandbox intent, shutdown grace,
/// line bound. The job has pipes (no terminal). Its environment is the
/// host user's login environment (the agent's own under a sandbox) plus
/// [`JobCommand::env`] entries, as with `executor-client mcp stdio`.
#[derive(Debug, Clone)]
pub struct JobCommand {
    argv: Vec<String>,
    cwd: Option<String>,
    env: BTreeMap<String, String>,
    clean_env: bool,
    sandbox: Option<SandboxIntent>,
    grace: Duration,
    max_line: usize,
    capture_stderr: bool,
}

impl JobCommand {
    /// `program` (looked up in the job's `PATH` on the host), no arguments.
    pub fn new(program: impl Into<String>) -> Self {
        JobCommand {
            argv: vec![program.into()],
            cwd: None,
            env: BTreeMap::new(),
            clean_env: false,
            sandbox: None,
            grace: DEFAULT_GRACE,
            max_line: DEFAULT_MAX_LINE,
            capture_stderr: false,
        }
    }

    /// One more argument.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.argv.push(arg.into());
        self
    }

    /// More arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.argv.extend(args.into_iter().map(Into::into));
        self
    }

    /// An environment entry, on top of the inherited environment.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    /// Only the [`JobCommand::env`] entries: nothing inherited (give
    /// `PATH` yourself).
    pub fn clean_env(mut self) -> Self {
        self.clean_env = true;
        self
    }

    /// The working directory on the host (default: the agent's).
    pub fn cwd(mut self, cwd: impl Into<String>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// Run confined by `intent`.
    pub fn sandbox(mut self, intent: SandboxIntent) -> Self {
        self.sandbox = Some(intent);
        self
    }

    /// Time between closing its stdin, terminating it and killing it once
    /// the transport is closed (default [`DEFAULT_GRACE`]).
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// The longest line taken from its stdout (default
    /// [`DEFAULT_MAX_LINE`]); a longer one ends the transport with
    /// [`JobTransportError::LineTooLong`].
    pub fn max_line(mut self, bytes: usize) -> Self {
        self.max_line = bytes;
        self
    }

    /// Keep its stderr for [`JobTransport::take_stderr`] instead of
    /// writing it to this process's stderr (the default, as rmcp's
    /// `TokioChildProcess` inherits it).
    pub fn capture_stderr(mut self) -> Self {
        self.capture_stderr = true;
        self
    }

    /// The `process/start` params (the agent's cwd asked when none was set).
    async fn params(&self, client: &Client) -> Result<ProcessStartParams, Error> {
        let cwd = match &self.cwd {
            Some(c) => c.clone(),
            None => {
                client
                    .call(&executor_protocol::types::session::EnvironmentInfoParams {})
                    .await?
                    .cwd
            }
        };
        let mut params = ProcessStartParams::new(self.argv.clone(), cwd.as_str(), self.env.clone());
        // No login shell runs for a sandboxed job (its dotfiles would run
        // unconfined): the agent's own environment instead.
        params.env_base = match (self.clean_env, &self.sandbox) {
            (true, _) => EnvBase::None,
            (false, Some(_)) => EnvBase::Agent,
            (false, None) => EnvBase::Login,
        };
        params.sandbox = self.sandbox.clone();
        Ok(params)
    }
}

/// A failure of [`JobTransport`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JobTransportError {
    /// The message could not be encoded as JSON.
    #[error("encoding an MCP message: {0}")]
    Encode(#[from] serde_json::Error),
    /// Writing to the job's stdin failed (the job or the connection ended).
    #[error("writing to MCP server job {process_id}: {source}")]
    Write {
        process_id: String,
        #[source]
        source: Error,
    },
    /// The transport was closed, or the job's stdin already was.
    #[error("the transport of MCP server job {0} is closed")]
    Closed(String),
    /// The server wrote a line longer than the bound: no more of its
    /// output was taken, and the job was ended.
    #[error("MCP server job {process_id} wrote a line longer than {max} bytes")]
    LineTooLong { process_id: String, max: usize },
    /// The job's exit was not learned (the connection ended first).
    #[error("the exit of MCP server job {process_id} is unknown: {reason}")]
    ExitUnknown { process_id: String, reason: String },
    /// The job outlived the shutdown ladder's deadline.
    #[error("MCP server job {process_id} still ran {waited:?} after the transport closed")]
    Outlived {
        process_id: String,
        waited: Duration,
    },
}

/// How the job's output ended, as the reader publishes it.
#[derive(Debug, Clone)]
enum End {
    Exited(ExitStatus),
    LineTooLong(usize),
    Unknown(String),
}

/// Watches the job's end; take it before handing the transport to rmcp.
#[derive(Debug, Clone)]
pub struct JobExit {
    process_id: String,
    rx: watch::Receiver<Option<End>>,
}

impl JobExit {
    /// The job's exit once it ended and all its output was read (`None`
    /// while it runs): its status, or why the transport failed it.
    pub fn get(&self) -> Option<Result<ExitStatus, JobTransportError>> {
        self.rx.borrow().clone().map(|e| self.lift(e))
    }

    /// Wait for [`JobExit::get`].
    pub async fn wait(&mut self) -> Result<ExitStatus, JobTransportError> {
        let end = match self.rx.wait_for(Option::is_some).await {
            Ok(end) => end.clone().expect("waited for Some"),
            Err(_) => End::Unknown("the reader of its output ended".into()),
        };
        self.lift(end)
    }

    fn lift(&self, end: End) -> Result<ExitStatus, JobTransportError> {
        let process_id = self.process_id.clone();
        match end {
            End::Exited(status) => Ok(status),
            End::LineTooLong(max) => Err(JobTransportError::LineTooLong { process_id, max }),
            End::Unknown(reason) => Err(JobTransportError::ExitUnknown { process_id, reason }),
        }
    }
}

/// One message for the job's stdin, and where to say how its write went.
struct Line {
    data: Vec<u8>,
    done: oneshot::Sender<Result<(), Error>>,
}

/// Where the job's stderr goes: this process's stderr, or a channel the
/// caller takes.
type StderrSink = Option<mpsc::Sender<Bytes>>;

/// rmcp's `Transport<RoleClient>` over an MCP stdio server run on the host
/// as a job: whole newline-delimited JSON messages each way, written in
/// the order `send` is called. Closing or dropping it closes the job's
/// stdin, terminates the job after the grace, then kills it after another.
#[derive(Debug)]
pub struct JobTransport {
    process_id: String,
    pid: u32,
    sandbox_degraded: Vec<String>,
    /// Whole lines, or the bound a longer one broke.
    lines: mpsc::Receiver<Result<Vec<u8>, usize>>,
    /// `None` once closed: the writer then runs the shutdown ladder.
    writes: Option<mpsc::UnboundedSender<Line>>,
    stderr: Option<mpsc::Receiver<Bytes>>,
    exit: JobExit,
    grace: Duration,
}

impl std::fmt::Debug for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Line({} bytes)", self.data.len())
    }
}

impl JobTransport {
    /// Start `command` on the agent's host and take over its pipes.
    pub async fn start(client: &Client, command: JobCommand) -> Result<Self, Error> {
        let params = command.params(client).await?;
        let process = client.start(&params).await?;
        Ok(Self::with_limits(
            process,
            command.grace,
            command.max_line,
            command.capture_stderr,
        ))
    }

    /// Take over a job already started with piped stdin and no terminal,
    /// whose output this handle has not read yet (its stderr to this
    /// process's stderr, the default bounds).
    pub fn from_process(process: Process) -> Self {
        Self::with_limits(process, DEFAULT_GRACE, DEFAULT_MAX_LINE, false)
    }

    fn with_limits(process: Process, grace: Duration, max_line: usize, capture: bool) -> Self {
        let process_id = process.id().to_string();
        let (lines_tx, lines) = mpsc::channel(LINES_QUEUED);
        let (stderr_tx, stderr) = match capture {
            true => {
                let (tx, rx) = mpsc::channel(STDERR_QUEUED);
                (Some(tx), Some(rx))
            }
            false => (None, None),
        };
        let (writes, writes_rx) = mpsc::unbounded_channel();
        let (end_tx, end_rx) = watch::channel(None);
        let exit = JobExit {
            process_id: process_id.clone(),
            rx: end_rx,
        };
        let transport = JobTransport {
            process_id,
            pid: process.pid(),
            sandbox_degraded: process.sandbox_degraded().to_vec(),
            lines,
            writes: Some(writes),
            stderr,
            exit: exit.clone(),
            grace,
        };
        let control = process.control();
        tokio::spawn(read_output(process, lines_tx, stderr_tx, max_line, end_tx));
        tokio::spawn(write_stdin(control, writes_rx, exit, grace));
        transport
    }

    /// The agent's id of the job.
    pub fn process_id(&self) -> &str {
        &self.process_id
    }

    /// The job's pid on the host.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// What of the sandbox intent was not enforced (only with
    /// `required: false`).
    pub fn sandbox_degraded(&self) -> &[String] {
        &self.sandbox_degraded
    }

    /// The job's stderr chunk by chunk, with [`JobCommand::capture_stderr`]
    /// (once; `None` after, and without it).
    pub fn take_stderr(&mut self) -> Option<mpsc::Receiver<Bytes>> {
        self.stderr.take()
    }

    /// A watch on the job's end, usable after the transport moved into
    /// rmcp and after it was dropped.
    pub fn exit(&self) -> JobExit {
        self.exit.clone()
    }
}

impl Transport<RoleClient> for JobTransport {
    type Error = JobTransportError;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        // Queued now, in call order; the future only waits for the write.
        let process_id = self.process_id.clone();
        let queued = serde_json::to_vec(&item)
            .map_err(JobTransportError::Encode)
            .and_then(|mut data| {
                data.push(b'\n');
                let (done, answer) = oneshot::channel();
                match &self.writes {
                    Some(w) if w.send(Line { data, done }).is_ok() => Ok(answer),
                    _ => Err(JobTransportError::Closed(process_id.clone())),
                }
            });
        async move {
            match queued?.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(source)) => Err(JobTransportError::Write { process_id, source }),
                Err(_) => Err(JobTransportError::Closed(process_id)),
            }
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            let line = match self.lines.recv().await? {
                Ok(line) => line,
                Err(max) => {
                    tracing::error!(process_id = %self.process_id, max,
                        "the MCP server wrote a line longer than {max} bytes: ending it");
                    return None;
                }
            };
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match serde_json::from_slice(&line) {
                Ok(message) => return Some(message),
                Err(e) => tracing::warn!(
                    process_id = %self.process_id,
                    error = %e,
                    line = %String::from_utf8_lossy(&line[..line.len().min(200)]),
                    "the MCP server wrote a line that is not a JSON-RPC message: skipped"
                ),
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        // The writer finishes what was queued, then runs the ladder; the
        // reader no longer waits for `receive` to take lines.
        self.writes = None;
        self.lines.close();
        let waited = self.grace * 2 + Duration::from_secs(10);
        let mut exit = self.exit.clone();
        match tokio::time::timeout(waited, exit.wait()).await {
            Ok(r) => r.map(|_| ()),
            Err(_) => Err(JobTransportError::Outlived {
                process_id: self.process_id.clone(),
                waited,
            }),
        }
    }
}

/// The reader: the job's output in order until it ended. Stdout goes to
/// `lines` as whole lines (an unfinished last one is dropped, said so);
/// a line past `max_line` ends the lines with `Err(max_line)` and the rest
/// of stdout is read and dropped. Stderr to `stderr` or this process's
/// stderr. Then the end.
async fn read_output(
    mut process: Process,
    lines: mpsc::Sender<Result<Vec<u8>, usize>>,
    stderr: StderrSink,
    max_line: usize,
    end: watch::Sender<Option<End>>,
) {
    let id = process.id().to_string();
    let mut lines = Some(lines);
    let mut partial: Vec<u8> = Vec::new();
    let mut stderr_full = false;
    let mut gave_up = None;
    let failed = loop {
        let chunk = match process.next_output().await {
            Ok(Some(c)) => c,
            Ok(None) => break None,
            Err(e) => break Some(e.to_string()),
        };
        if chunk.stream == OutputStream::Stderr {
            match &stderr {
                None => {
                    let mut err = std::io::stderr().lock();
                    let _ = err.write_all(&chunk.data);
                    let _ = err.flush();
                }
                Some(tx) => match tx.try_send(chunk.data) {
                    Err(mpsc::error::TrySendError::Full(_)) if !stderr_full => {
                        stderr_full = true;
                        tracing::warn!(process_id = %id,
                            "the MCP server's stderr is not being read: dropping it");
                    }
                    _ => {}
                },
            }
            continue;
        }
        let Some(tx) = &lines else {
            continue;
        };
        let mut data = &chunk.data[..];
        let mut open = true;
        while let Some(nl) = data.iter().position(|&b| b == b'\n') {
            partial.extend_from_slice(&data[..nl]);
            data = &data[nl + 1..];
            if partial.len() > max_line {
                break;
            }
            // Once the transport is gone the output is still read (to
            // the exit), just not kept.
            if tx.send(Ok(std::mem::take(&mut partial))).await.is_err() {
                open = false;
                break;
            }
        }
        if open {
            partial.extend_from_slice(data);
        }
        if open && partial.len() > max_line {
            gave_up = Some(max_line);
            let _ = tx.send(Err(max_line)).await;
            open = false;
        }
        if !open {
            lines = None;
            partial = Vec::new();
        }
    };
    if !partial.is_empty() {
        tracing::warn!(process_id = %id, bytes = partial.len(),
            "the MCP server ended in the middle of a line: not taken");
    }
    drop(lines);
    let status = match failed {
        None => process
            .exit_status()
            .ok_or_else(|| "its output ended without an exit report".to_string()),
        Some(reason) => Err(reason),
    };
    let state = match (gave_up, status) {
        (Some(max), _) => End::LineTooLong(max),
        (None, Ok(status)) => End::Exited(status),
        (None, Err(reason)) => End::Unknown(reason),
    };
    let _ = end.send(Some(state));
}

/// The writer: each queued message to the job's stdin, in order. Once the
/// transport is closed or dropped (its sender gone), the job's stdin is
/// closed, then after `grace` the job is terminated, then after another
/// killed, each step skipped once the job ended.
async fn write_stdin(
    job: ProcessControl,
    mut queue: mpsc::UnboundedReceiver<Line>,
    mut exit: JobExit,
    grace: Duration,
) {
    while let Some(line) = queue.recv().await {
        let mut result = Ok(());
        for piece in line.data.chunks(WRITE_PIECE) {
            result = job.write(piece).await;
            if result.is_err() {
                break;
            }
        }
        let _ = line.done.send(result);
    }
    if exit.get().is_some() {
        return;
    }
    if let Err(e) = job.close_stdin().await {
        tracing::debug!(process_id = %job.id(), error = %e, "closing the MCP server's stdin");
    }
    for signal in [SignalName::Terminate, SignalName::Kill] {
        if tokio::time::timeout(grace, exit.wait()).await.is_ok() {
            return;
        }
        tracing::info!(process_id = %job.id(), ?signal, "the MCP server outlived its stdin");
        if let Err(e) = job.signal(signal).await {
            tracing::debug!(process_id = %job.id(), error = %e, "signalling the MCP server");
        }
    }
}
