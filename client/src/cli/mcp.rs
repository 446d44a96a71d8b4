//! `mcp`: `mcp stdio` here; `mcp http` in [`super::mcp_http`].
//!
//! `mcp stdio`: an MCP stdio server run on the host as a job (pipes, no
//! terminal), its newline-delimited JSON-RPC relayed message by message
//! between this process's stdin/stdout and the job's. Local stdout carries
//! only whole lines of the server's stdout; the server's stderr goes to the
//! local stderr. The local stdin closing ends the job gracefully (its stdin
//! closed, then `terminate`, then `kill`, `--grace` apart); a job that ends
//! on its own ends the bridge with a non-zero status and the reason on
//! stderr, so the MCP client sees an error instead of waiting. Uses the
//! client library's [`Process`] (output complete and in seq order, a lag
//! caught up with `process/read`) and `run`'s start parameters.

use super::exit;
use super::run::RunArgs;
use super::sandbox::{report_degraded, SandboxArgs};
use super::signals::Signals;
use executor_client::protocol::types::process::{OutputStream, SignalName};
use executor_client::{Client, Process, ProcessControl};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

/// The longest line (message) relayed either way; a longer one ends the
/// bridge with an error naming the bound.
pub const MAX_LINE: usize = 64 * 1024 * 1024;

/// Whole lines from stdin sent in one `process/write` when they were read
/// together, up to this many bytes.
const BATCH: usize = 1024 * 1024;

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
    /// Working directory on the host (default: the agent's).
    #[arg(long)]
    pub cwd: Option<String>,
    /// An environment entry, on top of the host user's login environment
    /// (the agent's own under a sandbox); repeatable.
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// Only the --env entries, plus a standard PATH and HOME.
    #[arg(long)]
    pub clean_env: bool,
    /// Seconds between closing the server's stdin, terminating it and
    /// killing it, once the local stdin closed.
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    pub grace: f64,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    #[command(flatten)]
    pub limits: super::run::LimitArgs,
    /// The server's program and arguments (no shell is added).
    #[arg(required = true, last = true)]
    pub argv: Vec<String>,
}

/// `mcp …`
pub async fn mcp(client: &Client, cmd: McpCmd, signals: &mut Signals) -> anyhow::Result<i32> {
    match cmd {
        McpCmd::Stdio(args) => stdio(client, args, signals).await,
        McpCmd::Http(args) => super::mcp_http::http(client, args, signals).await,
    }
}

async fn stdio(client: &Client, args: StdioArgs, signals: &mut Signals) -> anyhow::Result<i32> {
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
    let (params, cwd) = run.start_params(client).await?;
    let mut proc = match client.start(&params).await {
        Ok(p) => p,
        Err(e) => return super::run::start_failure(e, &cwd),
    };
    report_degraded("mcp stdio", proc.sandbox_degraded());
    let closed = Arc::new(AtomicBool::new(false));
    let input = tokio::spawn(forward_lines(proc.control(), closed.clone(), grace));
    let relayed = tokio::select! {
        r = relay_output(&mut proc) => r,
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

/// The job's output until it exited: stdout lines to our stdout, whole
/// lines only (a trailing unfinished line is dropped and reported),
/// stderr as it comes to our stderr.
async fn relay_output(proc: &mut Process) -> anyhow::Result<()> {
    let mut out = tokio::io::stdout();
    let mut err = std::io::stderr();
    let mut pending: Vec<u8> = Vec::new();
    while let Some(chunk) = proc.next_output().await? {
        if chunk.stream == OutputStream::Stderr {
            err.write_all(&chunk.data)?;
            err.flush()?;
            continue;
        }
        pending.extend_from_slice(&chunk.data);
        if let Some(end) = pending.iter().rposition(|&b| b == b'\n') {
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
    job: ProcessControl,
    closed: Arc<AtomicBool>,
    grace: Duration,
) -> Option<anyhow::Error> {
    let mut stdin = tokio::io::BufReader::with_capacity(64 * 1024, tokio::io::stdin());
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
        if let Err(e) = job.write(&line).await {
            return Some(e.into());
        }
    }
    closed.store(true, Ordering::SeqCst);
    if let Err(e) = job.close_stdin().await {
        tracing::debug!(error = %e, "closing the MCP server's stdin");
    }
    tokio::time::sleep(grace).await;
    tracing::info!(process_id = %job.id(), "the MCP server outlived its stdin: terminating it");
    let _ = job.signal(SignalName::Terminate).await;
    tokio::time::sleep(grace).await;
    tracing::info!(process_id = %job.id(), "killing the MCP server");
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
