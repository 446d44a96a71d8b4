//! `executor-client`: drive an executor agent from the command line. The
//! flags (clap) and the verbs, one module per verb family, over the client
//! library (`executor-client`, the crate): this crate is the only one that
//! pulls clap, clap_mangen, clap_complete, indicatif, crossterm, hyper's
//! server and tracing-subscriber, so a program using the library does not.
//!
//! - `connect`: the ssh options; connecting, bounded; `target`: the
//!   `--target` grammar.
//! - `exit`: exit statuses (ssh's convention) and error messages.
//! - `run`: `run`, `shell`, `attach` (jobs, stdin, signals); `detach`:
//!   leaving a detached session (signals, the detach key, resume tokens).
//! - `files`: `cat`, `walk`, `stat`, `rm`, `mv`, `mkdir`, `realpath`.
//! - `transfer`: `get`, `put` (scp habits; no leftovers).
//! - `web`: `http`.
//! - `mcp`: `mcp stdio` (an MCP stdio server on the host, bridged);
//!   `mcp_http`: `mcp http` (an MCP HTTP server the host reaches, served
//!   on local loopback).
//! - `sandbox`: the sandbox flags shared by the verbs.
//! - `quote`: remote names as a terminal shows them.
//! - `logging`, `signals`, `man`.

#![forbid(unsafe_code)]

/// `eprintln!` for the CLI's messages: what a remote sends (file names,
/// error messages, an agent's text) is shown with its control characters
/// escaped ([`exit::say`]), so nothing remote writes onto the terminal.
macro_rules! say {
    ($($t:tt)*) => {
        super::exit::say(&format!($($t)*))
    };
}

mod connect;
mod detach;
mod exit;
mod files;
mod logging;
mod man;
mod mcp;
mod mcp_http;
mod quote;
mod run;
mod sandbox;
mod signals;
mod target;
mod transfer;
mod tty_question;
mod web;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use executor_client::Client;

/// Drive an executor agent, locally or over ssh: run commands (optionally
/// sandboxed), copy files, make HTTP requests from the agent's host.
#[derive(Debug, Parser)]
#[command(name = "executor-client", version, after_help = exit::SUMMARY)]
pub struct Cli {
    #[command(flatten)]
    pub conn: connect::ConnectArgs,
    #[command(flatten)]
    pub log: logging::LogArgs,
    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Show the agent's initialize answer and environment as JSON.
    Info,
    /// Run a command on the agent's host, in the home directory and the
    /// host user's login environment (as `ssh host CMD`; sandboxed too),
    /// streaming its output and forwarding stdin; exits with its exit code
    /// (128+n when killed by signal n).
    Run(run::RunArgs),
    /// An interactive login shell in a terminal on the host.
    Shell,
    /// Resume a detached session (see `run --detach`) and follow its job;
    /// for a job that already ended, print its output and exit with its
    /// status.
    Attach(run::AttachArgs),
    /// Write remote files to stdout.
    Cat(files::CatArgs),
    /// Copy remote files to a local path (`-` for stdout), like scp.
    Get(transfer::GetArgs),
    /// Copy local files (`-` for stdin) to a remote path, like scp.
    Put(transfer::PutArgs),
    /// List a remote tree, one `KIND SIZE PATH` line per entry (on a
    /// terminal, names quoted as `ls` does: `'a b'`, `$'\e]0;x\a'`).
    Walk(files::WalkArgs),
    /// Show a remote path's metadata.
    Stat(files::StatArgs),
    /// Remove remote files or directories.
    Rm(files::RmArgs),
    /// Rename a remote path (replacing an existing file at the target).
    Mv(files::MvArgs),
    /// Create remote directories.
    Mkdir(files::MkdirArgs),
    /// Print remote paths with every symlink, `.` and `..` resolved.
    Realpath(files::RealpathArgs),
    /// Make an HTTP request from the agent's host; the body goes to stdout
    /// as it arrives.
    Http(web::HttpArgs),
    /// Bridge MCP to a server on the agent's host (`mcp stdio -- CMD…`) or
    /// one it reaches (`mcp http URL`).
    #[command(subcommand)]
    Mcp(mcp::McpCmd),
    /// Install the agent on the `--target` host over SSH (no network needed
    /// there): after probing `uname -sm`, takes the FROM binary (when it is
    /// built for the host's platform) or picks `FROM/<os>-<arch>/executor`,
    /// uploads it, checks its SHA-256 on the host, then renames it into
    /// `~/.local/lib/executor/<version>/executor`, which later connections
    /// to the host try before `executor` on its PATH.
    Bootstrap {
        /// The agent binary (e.g. `/usr/bin/executor`, for a host of this
        /// machine's platform), or a folder of release builds:
        /// `<os>-<arch>/executor` (e.g. `linux-x86_64/executor`).
        #[arg(long, value_name = "BINARY|DIR", required_unless_present = "check")]
        from: Option<std::path::PathBuf>,
        /// Install nothing: report the host's agent (path, SHA-256, version
        /// and sandbox capabilities) as JSON.
        #[arg(long)]
        check: bool,
        /// The base directory on the host.
        #[arg(long, value_name = "DIR", default_value = executor_client::bootstrap::DEFAULT_REMOTE_DIR)]
        remote_dir: String,
    },
    /// Print the man page (`man`) or a shell completion script (`bash`,
    /// `zsh`, `fish`): `generate bash > ~/.local/share/bash-completion/completions/executor-client`.
    Generate { kind: String },
}

/// The command line's grammar: [`Cli`]'s, the ssh flags kept out of the
/// verbs with a flag of the same letter.
pub fn command() -> clap::Command {
    connect::keep_verbs_letters(Cli::command())
}

fn main() {
    std::process::exit(run_cli());
}

/// Parse, run, and return the exit status.
fn run_cli() -> i32 {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let parsed = command()
        .try_get_matches_from(&argv)
        .and_then(|m| Cli::from_arg_matches(&m));
    let mut cli = match parsed {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { exit::USAGE } else { 0 };
        }
    };
    cli.conn
        .merge_options(connect::options_before_verb(&command(), &argv));
    logging::init(&cli.log);
    if let Cmd::Generate { kind } = &cli.command {
        return exit::report(man::generate(kind).map(|()| 0));
    }
    // `mcp stdio` relays one message at a time between a few tasks: on one
    // thread each hand-over is a task switch, not a wake-up of another
    // worker thread (issue 31's latency).
    let mut builder = match &cli.command {
        Cmd::Mcp(mcp::McpCmd::Stdio(_)) => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return exit::report(Err(anyhow::anyhow!("starting the async runtime: {e}"))),
    };
    let code = exit::report(rt.block_on(dispatch(cli)));
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    code
}

async fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    // A SIGCHLD ignored by whoever started us (inherited across exec) would
    // make the kernel reap the agent and ssh before we wait for them
    // (ECHILD). Registering a handler replaces the ignored disposition (and
    // stays installed for the process's life), without unsafe code.
    drop(tokio::signal::unix::signal(
        tokio::signal::unix::SignalKind::child(),
    )?);
    let mut signals = signals::Signals::install()?;
    if let Cmd::Bootstrap {
        from,
        check,
        remote_dir,
    } = &cli.command
    {
        let from = from.as_deref().filter(|_| !check);
        return connect::bootstrap(&cli.conn, from, remote_dir).await;
    }
    let session = match &cli.command {
        Cmd::Run(r) => r.session_params(),
        Cmd::Attach(a) => Some(a.session_params()?),
        Cmd::Mcp(m) => m.session_params(&cli.conn),
        _ => None,
    };
    let client = tokio::select! {
        c = connect::connect(&cli.conn, &cli.log, session) => match (c, &cli.command) {
            (Ok(c), _) => c,
            (Err(e), Cmd::Attach(a)) => {
                run::attach_failed(&a.session, &e);
                return Err(e);
            }
            (Err(e), _) => return Err(e),
        },
        sig = signals.recv() => return Ok(sig.exit_code()),
    };
    let code = match cli.command {
        Cmd::Run(args) => run::run(&client, &cli.conn, args, &mut signals).await,
        Cmd::Shell => run::shell(&client, &mut signals).await,
        Cmd::Attach(args) => run::attach(&client, &cli.conn, args, &mut signals).await,
        Cmd::Mcp(cmd) => mcp::mcp(&client, cmd, &cli.conn, &cli.log, &mut signals).await,
        other => interruptible(&client, other, &mut signals).await,
    };
    // The connection ends with this client's clones; the agent ends the
    // session (and removes what an unfinished transfer left).
    let closed = client.close().await;
    let code = code?;
    closed?;
    Ok(code)
}

/// A verb that a signal stops: its future is dropped (so its temp files
/// are removed) and the status is 128 + the signal.
async fn interruptible(
    client: &Client,
    cmd: Cmd,
    signals: &mut signals::Signals,
) -> anyhow::Result<i32> {
    let verb = async {
        match cmd {
            Cmd::Info => files::info(client).await,
            Cmd::Cat(a) => files::cat(client, a).await,
            Cmd::Get(a) => transfer::get(client, a).await,
            Cmd::Put(a) => transfer::put(client, a).await,
            Cmd::Walk(a) => files::walk(client, a).await,
            Cmd::Stat(a) => files::stat(client, a).await,
            Cmd::Rm(a) => files::rm(client, a).await,
            Cmd::Mv(a) => files::mv(client, a).await,
            Cmd::Mkdir(a) => files::mkdir(client, a).await,
            Cmd::Realpath(a) => files::realpath(client, a).await,
            Cmd::Http(a) => web::http(client, a).await,
            Cmd::Run(_)
            | Cmd::Shell
            | Cmd::Attach(_)
            | Cmd::Mcp(_)
            | Cmd::Bootstrap { .. }
            | Cmd::Generate { .. } => unreachable!("dispatched before"),
        }
    };
    tokio::select! {
        r = verb => r,
        sig = signals.recv() => {
            tracing::debug!(signal = sig.name(), "interrupted");
            Ok(sig.exit_code())
        }
    }
}
