//! `mcp`: `mcp stdio` here; `mcp http` in [`super::mcp_http`].
//!
//! `mcp stdio`: an MCP stdio server run on the host as a job (pipes, no
//! terminal), its newline-delimited JSON-RPC relayed message by message
//! between this process's stdin/stdout and the job's. Local stdout carries
//! only whole lines of the server's stdout; the server's stderr goes to the
//! local stderr. The local stdin closing ends the job gracefully (its stdin
//! closed, then `terminate`, then `kill`, `--grace` apart); a job that ends
//! on its own ends the bridge with a non-zero status and the reason on
//! stderr, so the MCP client sees an error instead of waiting. With
//! `--reconnect` (on by default over ssh) the session outlives its
//! transport for that long: when the connection ends under the bridge it
//! connects again, resumes the session and goes on where it stopped, each
//! message relayed once (output by seq, each stdin write with a `write_id`
//! the agent does once); past the window it ends with an error and the
//! host ends the session. Uses the client library's [`Process`] (output
//! complete and in seq order, a lag caught up with `process/read`, taken
//! up on a resumed connection with [`Process::resume_on`]),
//! [`connect::reconnect`] and `run`'s start parameters.

use super::connect::{self, ConnectArgs};
use super::exit;
use super::logging::LogArgs;
use super::run::RunArgs;
use super::sandbox::{report_degraded, SandboxArgs};
use super::signals::Signals;
use executor_client::protocol::methods;
use executor_client::protocol::types::process::{
    OutputStream, ProcessSignalParams, ProcessWriteParams, SignalName,
};
use executor_client::protocol::types::session::SessionParams;
use executor_client::protocol::types::Empty;
use executor_client::{Backoff, Client, Process};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::sync::watch;

/// The longest line (message) relayed either way; a longer one ends the
/// bridge with an error naming the bound.
pub const MAX_LINE: usize = 64 * 1024 * 1024;

/// Whole lines from stdin sent in one `process/write` when they were read
/// together, up to this many bytes.
const BATCH: usize = 1024 * 1024;

/// `--reconnect`'s default over ssh, in seconds.
pub const DEFAULT_RECONNECT_SECS: u64 = 60;

/// The server's output the agent keeps while the session is detached
/// (with `--reconnect`): a 10 MiB tool result written during a drop is
/// still there after the resume.
const DETACHED_OUTPUT_BYTES: u64 = 16 * 1024 * 1024;

// Parsed once per run: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, clap::Subcommand)]
pub enum McpCmd {
    /// Run an MCP stdio server on the host and relay its JSON-RPC lines
    /// between this stdin/stdout and the server's (name this command in an
    /// MCP client's configuration). Closing stdin ends the server: its
    /// stdin is closed, then after `--grace` it is terminated, then killed.
    Stdio(StdioArgs),
    /// Serve a local MCP Streamable HTTP endpoint (loopback only, its URL
    /// the first line on stdout) that forwards every request to the MCP
    /// server at URL from the agent's host, responses streamed back as they
    /// come (name the printed URL in an MCP client's configuration).
    Http(super::mcp_http::HttpArgs),
}

#[derive(Debug, clap::Args)]
pub struct StdioArgs {
    /// Working directory on the host (default: the home directory; under a
    /// sandbox that grants nothing there, its first --rw root, else its
    /// first --ro root), as for `run`.
    #[arg(long)]
    pub cwd: Option<String>,
    /// An environment entry, on top of the host user's login environment
    /// (taken inside the server's sandbox when it has one); repeatable.
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// Only the --env entries, plus a standard PATH and HOME.
    #[arg(long)]
    pub clean_env: bool,
    /// Seconds between closing the server's stdin, terminating it and
    /// killing it, once the local stdin closed.
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    pub grace: f64,
    /// Keep the session SECS after the connection drops (the server runs
    /// on) and connect again within them, resuming it where it stopped,
    /// each message relayed once; a longer drop ends the bridge (status
    /// 255) and, on the host, the server. 0 turns it off. Default: 60 over
    /// ssh, 0 for the local target.
    #[arg(long, value_name = "SECS")]
    pub reconnect: Option<u64>,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    #[command(flatten)]
    pub limits: super::run::LimitArgs,
    /// The server's program and arguments (no shell is added).
    #[arg(required = true, last = true)]
    pub argv: Vec<String>,
}

impl McpCmd {
    /// The session options: `mcp stdio` with `--reconnect` keeps its
    /// session that long after a drop.
    pub fn session_params(&self, conn: &ConnectArgs) -> Option<SessionParams> {
        let McpCmd::Stdio(args) = self else {
            return None;
        };
        let secs = args.reconnect_secs(conn);
        (secs > 0).then(|| SessionParams {
            resume: None,
            detach_ttl_ms: Some(secs.saturating_mul(1000)),
        })
    }
}

impl StdioArgs {
    fn reconnect_secs(&self, conn: &ConnectArgs) -> u64 {
        self.reconnect.unwrap_or(if conn.is_local() {
            0
        } else {
            DEFAULT_RECONNECT_SECS
        })
    }
}

/// `mcp …`; `conn` and `log` say how to connect again (`mcp stdio
/// --reconnect`).
pub async fn mcp(
    client: &Client,
    cmd: McpCmd,
    conn: &ConnectArgs,
    log: &LogArgs,
    signals: &mut Signals,
) -> anyhow::Result<i32> {
    match cmd {
        McpCmd::Stdio(args) => {
            let resume = Resume {
                within: Duration::from_secs(args.reconnect_secs(conn)),
                conn,
                log,
            };
            // The connection in use: the first, then each resumed one.
            let current = watch::Sender::new(client.clone());
            let code = stdio(&current, args, &resume, signals).await;
            // The last connection ends as the first would (the caller
            // closes the first).
            let last = current.borrow().clone();
            if let Err(e) = last.close().await {
                tracing::debug!(error = %e, "closing the connection");
            }
            code
        }
        McpCmd::Http(args) => super::mcp_http::http(client, args, signals).await,
    }
}

/// `--reconnect`: how to connect again, and for how long to try.
struct Resume<'a> {
    /// Zero: no resume (the session ends with its connection).
    within: Duration,
    conn: &'a ConnectArgs,
    log: &'a LogArgs,
}

impl Resume<'_> {
    /// After the connection under `proc` ended: connect again, resume the
    /// session and take `proc` up on the new connection (then published in
    /// `current`), trying for at most `within` (the session's detach TTL:
    /// past it the host ends the session and the server with it).
    async fn resume(
        &self,
        proc: &mut Process,
        current: &watch::Sender<Client>,
        why: &executor_client::Error,
    ) -> anyhow::Result<()> {
        let target = &self.conn.target;
        let id = proc.id().to_string();
        let session = current.borrow().initialize_result().session_id.clone();
        say!(
            "executor-client: the connection to {target} ended ({why}); resuming session {session} of the MCP server {id}"
        );
        let backoff = Backoff {
            attempts: u32::MAX,
            initial: Duration::from_millis(100),
            max: Duration::from_secs(2),
        };
        let resumed = async {
            loop {
                let old = current.borrow().clone();
                let new = connect::reconnect(self.conn, self.log, &old, backoff).await?;
                // The dead transport's process is reaped apart.
                tokio::spawn(old.close());
                current.send_replace(new.clone());
                match proc.resume_on(&new).await {
                    // The new connection ended too: again.
                    Err(e) if is_transport(&e) => {
                        tracing::info!(error = %e, "the resumed connection ended");
                    }
                    r => return r.map_err(anyhow::Error::from),
                }
            }
        };
        match tokio::time::timeout(self.within, resumed).await {
            Ok(Ok(())) => {
                tracing::info!(process_id = %id, "session resumed");
                Ok(())
            }
            Ok(Err(e)) => Err(e.context(format!("the MCP server {id}"))),
            Err(_) => Err(exit::Outside(format!(
                "could not resume session {session} of the MCP server {id} on {target} within \
                 --reconnect {} s; the host ends it (and the server) once that long detached",
                self.within.as_secs()
            ))
            .into()),
        }
    }
}

/// Whether `e` is the connection ending (not an answer of the agent).
fn is_transport(e: &executor_client::Error) -> bool {
    matches!(
        e,
        executor_client::Error::Closed(_) | executor_client::Error::Io(_)
    )
}

async fn stdio(
    current: &watch::Sender<Client>,
    args: StdioArgs,
    resume: &Resume<'_>,
    signals: &mut Signals,
) -> anyhow::Result<i32> {
    if !(args.grace.is_finite() && (0.0..=3600.0).contains(&args.grace)) {
        return Err(exit::Outside(format!(
            "--grace {}: not a number of seconds between 0 and 3600",
            args.grace
        ))
        .into());
    }
    let grace = Duration::from_secs_f64(args.grace);
    let run = RunArgs {
        tty: false,
        no_stdin: false,
        cwd: args.cwd,
        env: args.env,
        clean_env: args.clean_env,
        inherit_env: false,
        detach: None,
        sandbox: args.sandbox,
        limits: args.limits,
        argv: args.argv,
    };
    let client = current.borrow().clone();
    let (mut params, cwd) = run.start_params(&client).await?;
    if !resume.within.is_zero() {
        params.output_buffer_bytes = Some(DETACHED_OUTPUT_BYTES);
    }
    let mut proc = match client.start(&params).await {
        Ok(p) => p,
        Err(e) => return super::run::start_failure(e, &cwd),
    };
    report_degraded("mcp stdio", proc.sandbox_degraded());
    let closed = Arc::new(AtomicBool::new(false));
    let job = Job {
        current: current.subscribe(),
        resumable: !resume.within.is_zero(),
        id: proc.id().to_string(),
        writes: 0,
    };
    let (local_in, local_out) = local_stdio();
    let input = tokio::spawn(forward_lines(local_in, job, closed.clone(), grace));
    let relayed = tokio::select! {
        r = relay_output(&mut proc, local_out, current, resume) => r,
        sig = signals.recv() => {
            tracing::debug!(signal = sig.name(), "ending the MCP server");
            let _ = proc.signal(SignalName::Terminate).await;
            input.abort();
            return Ok(sig.exit_code());
        }
    };
    input.abort();
    let input = input.await.ok().flatten();
    tracing::debug!(
        stdin_closed = closed.load(Ordering::SeqCst),
        "the MCP server exited"
    );
    if let Err(e) = relayed {
        let _ = proc.signal(SignalName::Kill).await;
        return Err(e);
    }
    if let Some(e) = input {
        // The server could not be written to: it ended, or the line was
        // refused. Its exit (below) says which; say this too.
        tracing::debug!(error = %e, "writing to the MCP server");
    }
    let id = proc.id().to_string();
    let status = proc
        .exit_status()
        .ok_or_else(|| exit::Outside(format!("{id} ended without an exit status")))?;
    if status.sandbox_denied {
        say!(
            "executor-client: the sandbox denied the MCP server {id} something (its exit status: {})",
            status.shell_code()
        );
        return Ok(exit::SANDBOX);
    }
    let code = status.shell_code();
    if closed.load(Ordering::SeqCst) {
        return Ok(code);
    }
    say!(
        "executor-client: the MCP server {id} ended before its client closed stdin (exit status {code})"
    );
    Ok(if code == 0 { exit::FAILED } else { code })
}

/// This process's stdin, read as it comes.
type LocalIn = Box<dyn tokio::io::AsyncRead + Unpin + Send>;
/// This process's stdout.
type LocalOut = Box<dyn tokio::io::AsyncWrite + Unpin + Send>;

/// This process's stdin and stdout for the relay: when both are pipes or
/// sockets (an MCP client spawned us), non-blocking and driven by the
/// runtime's event loop, each message read or written in the task that
/// relays it; otherwise (a terminal, a file) tokio's stdio, which reads
/// and writes on a blocking thread (a thread hand-over each way per
/// message). See [`executor_sys::stream_stdio`].
fn local_stdio() -> (LocalIn, LocalOut) {
    let pipes = executor_sys::stream_stdio().and_then(|(input, output)| {
        let input = tokio::net::unix::pipe::Receiver::from_owned_fd_unchecked(input).ok()?;
        let output = tokio::net::unix::pipe::Sender::from_owned_fd_unchecked(output).ok()?;
        Some((input, output))
    });
    match pipes {
        Some((input, output)) => (Box::new(input), Box::new(output)),
        None => (Box::new(tokio::io::stdin()), Box::new(tokio::io::stdout())),
    }
}

/// The job's output until it exited: stdout lines to our stdout, whole
/// lines only (a trailing unfinished line is dropped and reported),
/// stderr as it comes to our stderr. The connection ending under it is
/// resumed (with `--reconnect`) and the relay goes on from the next chunk
/// by seq: a line cut by the drop is completed, not sent twice.
async fn relay_output(
    proc: &mut Process,
    mut out: LocalOut,
    current: &watch::Sender<Client>,
    resume: &Resume<'_>,
) -> anyhow::Result<()> {
    let mut err = std::io::stderr();
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let chunk = match proc.next_output().await {
            Ok(Some(c)) => c,
            Ok(None) => break,
            Err(e) if is_transport(&e) && !resume.within.is_zero() => {
                resume.resume(proc, current, &e).await?;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if chunk.stream == OutputStream::Stderr {
            err.write_all(&chunk.data)?;
            err.flush()?;
            continue;
        }
        // Only the new bytes can hold a newline: a long line arriving in
        // many chunks is scanned once, not once per chunk.
        let last_newline = chunk.data.iter().rposition(|&b| b == b'\n');
        let before = pending.len();
        pending.extend_from_slice(&chunk.data);
        if let Some(end) = last_newline.map(|i| before + i) {
            out.write_all(&pending[..=end]).await?;
            out.flush().await?;
            pending.drain(..=end);
        }
        if pending.len() > MAX_LINE {
            return Err(exit::Outside(format!(
                "the MCP server {} wrote a line longer than {MAX_LINE} bytes",
                proc.id()
            ))
            .into());
        }
    }
    if !pending.is_empty() {
        say!(
            "executor-client: the MCP server {} ended in the middle of a line ({} bytes not relayed)",
            proc.id(),
            pending.len()
        );
    }
    Ok(())
}

/// Our stdin to the job's, one whole line (one message) per
/// `process/write`; at EOF (an unfinished last line is still sent) the
/// job's stdin is closed and `closed` set, then the job is terminated
/// after `grace` and killed after another. Returns the write error that
/// stopped it, if one did.
async fn forward_lines(
    input: LocalIn,
    mut job: Job,
    closed: Arc<AtomicBool>,
    grace: Duration,
) -> Option<anyhow::Error> {
    let mut stdin = tokio::io::BufReader::with_capacity(64 * 1024, input);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = match read_line(&mut stdin, &mut line).await {
            Ok(n) => n,
            Err(e) => {
                say!("executor-client: reading stdin: {e}; ending the MCP server");
                0
            }
        };
        if n == 0 {
            break;
        }
        // Whole lines already read behind it go in the same write (a
        // client pipelining requests pays one round trip for them).
        let buffered = stdin.buffer();
        if let Some(end) = buffered.iter().rposition(|&b| b == b'\n') {
            if line.len() + end < BATCH {
                line.extend_from_slice(&buffered[..=end]);
                stdin.consume(end + 1);
            }
        }
        if let Err(e) = job.write(&line, false).await {
            return Some(e.into());
        }
    }
    closed.store(true, Ordering::SeqCst);
    if let Err(e) = job.write(&[], true).await {
        tracing::debug!(error = %e, "closing the MCP server's stdin");
    }
    tokio::time::sleep(grace).await;
    tracing::info!(process_id = %job.id, "the MCP server outlived its stdin: terminating it");
    let _ = job.signal(SignalName::Terminate).await;
    tokio::time::sleep(grace).await;
    tracing::info!(process_id = %job.id, "killing the MCP server");
    let _ = job.signal(SignalName::Kill).await;
    None
}

/// One line (with its newline, if it had one) into `line`, at most
/// [`MAX_LINE`] bytes: 0 at EOF.
async fn read_line(
    r: &mut (impl tokio::io::AsyncBufRead + Unpin),
    line: &mut Vec<u8>,
) -> std::io::Result<usize> {
    loop {
        let buf = r.fill_buf().await?;
        if buf.is_empty() {
            return Ok(line.len());
        }
        let (take, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        if line.len() + take > MAX_LINE {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a line on stdin longer than {MAX_LINE} bytes"),
            ));
        }
        line.extend_from_slice(&buf[..take]);
        r.consume(take);
        if done {
            return Ok(line.len());
        }
    }
}

/// The job's stdin and signals, apart from its output, on the connection
/// in use.
struct Job {
    current: watch::Receiver<Client>,
    /// A request the connection's end cut off is sent again once the
    /// output side resumed the session (`--reconnect`).
    resumable: bool,
    id: String,
    /// Writes made so far (the next `write_id`).
    writes: u64,
}

impl Job {
    /// Write `data` (then close stdin with `close`), once: every write
    /// carries a `write_id`, so one the agent got before the connection
    /// ended is not done again when sent again after the resume.
    async fn write(&mut self, data: &[u8], close: bool) -> Result<(), executor_client::Error> {
        self.writes += 1;
        let params = ProcessWriteParams {
            process_id: self.id.clone(),
            data: serde_bytes::ByteBuf::from(data.to_vec()),
            close_stdin: close,
            write_id: Some(format!("mcp-{}", self.writes)),
        };
        self.request(methods::PROCESS_WRITE, &params).await
    }

    async fn signal(&mut self, signal: SignalName) -> Result<(), executor_client::Error> {
        let params = ProcessSignalParams {
            process_id: self.id.clone(),
            signal,
        };
        self.request(methods::PROCESS_SIGNAL, &params).await
    }

    /// `method` on the connection in use; cut off by its end, sent again on
    /// the resumed one (when there is a resume: else the error).
    async fn request<P: serde::Serialize>(
        &mut self,
        method: &str,
        params: &P,
    ) -> Result<(), executor_client::Error> {
        loop {
            let client = self.current.borrow_and_update().clone();
            match client.request::<_, Empty>(method, params).await {
                Err(e) if self.resumable && is_transport(&e) => {
                    tracing::debug!(error = %e, method, "cut off: sent again once resumed");
                    // A bridge that cannot resume ends (and this task).
                    if self.current.changed().await.is_err() {
                        return Err(e);
                    }
                }
                r => return r.map(|_| ()),
            }
        }
    }
}
