//! The `executor` binary: with no arguments, serves one connection on
//! stdin/stdout. Stdout carries protocol bytes only; logs go to stderr.
#![forbid(unsafe_code)]

use anyhow::Context;
use clap::Parser;

/// The executor agent: runs commands, reads files and makes HTTP calls on this
/// host for a remote orchestrator, speaking the executor wire protocol on
/// stdin/stdout (`ssh devbox executor`).
#[derive(Debug, Parser)]
#[command(name = "executor", version, about, long_about = None)]
struct Cli {
    /// Log as JSON lines (to stderr) instead of text.
    #[arg(long)]
    log_json: bool,
    /// Configuration file (default /etc/executor/config.toml; a missing
    /// default file means the built-in defaults).
    #[arg(long, value_name = "PATH")]
    config: Option<std::path::PathBuf>,
    /// The configuration profile this connection runs under (for an
    /// authorized_keys forced command: `command="executor --profile ci"`).
    #[arg(long, value_name = "NAME")]
    profile: Option<String>,
    /// Print every request method of the protocol, one per line, and exit.
    #[arg(long)]
    list_methods: bool,
    /// Print the man page (`man`) or a shell completion script (`bash`,
    /// `zsh`, `fish`) and exit (for packaging).
    #[arg(long, value_name = "KIND", hide = true)]
    generate: Option<String>,
    /// With `codex-exec-server`: where to serve Codex's exec-server
    /// protocol: `stdio` (the default) or `ws://IP:PORT` (a loopback
    /// address; port 0 picks one, printed as the first line on stdout).
    #[arg(long, value_name = "stdio|ws://IP:PORT")]
    listen: Option<String>,
    /// With `session-host`: the soft open files limit the stdio agent that
    /// started it was started with (its jobs get it back).
    #[arg(long, value_name = "N", hide = true)]
    jobs_open_files: Option<u64>,
}

/// `$serve(input, output, config, launch)` on this process's stdin and
/// stdout: driven directly when they are pipes or sockets
/// ([`stream_stdio`]), through tokio's stdio otherwise.
macro_rules! on_stdio {
    ($serve:path, $config:expr, $launch:expr) => {
        async {
            match stream_stdio() {
                Some((input, output)) => $serve(input, output, $config, $launch).await,
                None => $serve(tokio::io::stdin(), tokio::io::stdout(), $config, $launch).await,
            }
        }
    };
}

fn main() -> anyhow::Result<()> {
    // The trampoline must run single-threaded: dispatch to it before
    // anything else (no runtime, no logging threads).
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // Every mode waits for children it starts: not with an ignored SIGCHLD
    // inherited from whoever started the agent.
    executor_sys::default_sigchld();
    if args.get(1).and_then(|a| a.to_str()) == Some("sandbox-exec") {
        name_this_process();
        sandbox_exec(&args[2..]);
    }
    let forced = answer_forced_command()?;
    if forced == Some(false) {
        return Ok(());
    }
    // `executor session-host [--config P] [--profile N]`: started by a stdio
    // agent for a detached session (see `executor_agent::host`).
    let host_mode = args.get(1).and_then(|a| a.to_str()) == Some("session-host");
    if host_mode {
        name_this_process();
    }
    // `executor codex-exec-server [--listen stdio]`: Codex's dialect (also
    // when a forced command's original command asks for it).
    let codex_mode = args.get(1).and_then(|a| a.to_str()) == Some("codex-exec-server");
    let cli = if host_mode || codex_mode {
        Cli::parse_from(args[..1].iter().chain(&args[2..]))
    } else {
        Cli::parse()
    };
    let codex_mode = codex_mode || forced == Some(true);
    let mut listen = executor_agent::codex::ws::Listen::Stdio;
    if let Some(text) = &cli.listen {
        if !codex_mode {
            anyhow::bail!("--listen is an option of `executor codex-exec-server`");
        }
        match executor_agent::codex::ws::parse_listen(text) {
            // Under an authorized_keys forced command the connection is
            // the ssh channel: no listener, whatever the key's command says.
            Ok(executor_agent::codex::ws::Listen::Ws(_))
                if std::env::var_os("SSH_ORIGINAL_COMMAND").is_some() =>
            {
                eprintln!(
                    "executor codex-exec-server: --listen {text:?}: a forced command serves stdio only"
                );
                std::process::exit(2);
            }
            Ok(l) => listen = l,
            Err(e) => {
                eprintln!("executor codex-exec-server: {e}");
                std::process::exit(2);
            }
        }
    }
    // EXECUTOR_LOG_JSON=1: JSON logs for a client that cannot pass flags
    // (over ssh, where the remote command is one word).
    init_tracing(cli.log_json || std::env::var_os("EXECUTOR_LOG_JSON").is_some_and(|v| v == "1"));
    if !host_mode && !codex_mode && cli.generate.is_none() && !cli.list_methods {
        greet_a_terminal();
    }
    if let Some(kind) = &cli.generate {
        generate(kind)?;
        return Ok(());
    }
    if cli.list_methods {
        return print_methods();
    }
    if cli.jobs_open_files.is_some() && !host_mode {
        anyhow::bail!("--jobs-open-files is an option of `executor session-host`");
    }
    let config = usable_config(&cli);
    sweep_leftovers();
    executor_agent::limits::raise_open_files(cli.jobs_open_files);
    // The jobs' cgroups: found (and dead agents' swept) while the agent is
    // single-threaded and before the spawner starts (on cgroup v2 the
    // agent may move into a leaf of its own, and the spawner follows).
    executor_agent::limits::setup();
    // The login environment's disk cache: in the session hosts' socket
    // directory when that is `$XDG_RUNTIME_DIR/executor` (never /tmp).
    let dirs_env = executor_agent::host::RuntimeEnv::current();
    executor_agent::login_env::set_cache_dir(dirs_env.xdg_runtime_dir.clone().and_then(|xdg| {
        let dir = dirs_env.socket_dir().ok()?;
        (dir == xdg.join("executor")).then_some(dir)
    }));
    let _own_cgroups = executor_agent::limits::Teardown;
    // The process that forks every job's supervisor, started from the main
    // thread (its parent-death signal follows the thread that started it,
    // and this one lives as long as the agent). A failure here is retried
    // at the first job, and reported there.
    if let Err(e) = executor_agent::process::spawner::start() {
        tracing::warn!(error = %e, "cannot start the spawner");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    if host_mode {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
        let host_args = executor_agent::host::HostArgs::parse(&line).map_err(anyhow::Error::msg)?;
        runtime.block_on(executor_agent::host::run_host(config, host_args))?;
        runtime.shutdown_timeout(std::time::Duration::from_millis(100));
        return Ok(());
    }
    let launch = executor_agent::host::Launch {
        config_path: cli.config.clone(),
        profile: cli.profile.clone(),
    };
    if let (true, executor_agent::codex::ws::Listen::Ws(addr)) = (codex_mode, listen) {
        runtime.block_on(executor_agent::codex::ws::listen(addr, config, launch))?;
        runtime.shutdown_timeout(std::time::Duration::from_millis(100));
        return Ok(());
    }
    if codex_mode {
        runtime.block_on(on_stdio!(executor_agent::codex::serve, config, launch))?;
        runtime.shutdown_timeout(std::time::Duration::from_millis(100));
        return Ok(());
    }
    let ending = runtime.block_on(on_stdio!(executor_agent::host::serve_stdio, config, launch))?;
    tracing::debug!(?ending, "agent exiting");
    // Blocked stdin reads on the runtime's blocking pool must not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    // Exit status: 0 when the input ended (at a frame boundary, or inside a
    // frame: the peer is gone either way); 2 when the peer broke framing with
    // a bad length prefix; 0 when our output was closed by the peer.
    match ending {
        executor_agent::conn::Ending::BadLength => std::process::exit(2),
        _ => Ok(()),
    }
}

/// Under an authorized_keys forced command, the client's own request is in
/// SSH_ORIGINAL_COMMAND: accept only the executor itself. `None`: no
/// forced command or serve the native protocol; `Some(true)`: serve the
/// Codex dialect; `Some(false)`: answered here, nothing more to do.
fn answer_forced_command() -> anyhow::Result<Option<bool>> {
    if let Some(original) = std::env::var_os("SSH_ORIGINAL_COMMAND") {
        use executor_agent::forced::{judge, Forced};
        match judge(&original.to_string_lossy()) {
            Forced::Serve => {}
            Forced::ServeCodex => return Ok(Some(true)),
            Forced::Version => {
                let mut out = std::io::stdout();
                std::io::Write::write_all(
                    &mut out,
                    format!("executor {}\n", env!("CARGO_PKG_VERSION")).as_bytes(),
                )?;
                return Ok(Some(false));
            }
            Forced::Refuse(why) => {
                eprintln!("executor: {why}");
                std::process::exit(2);
            }
        }
    }
    Ok(None)
}

/// `--list-methods`: every request method of the protocol, one per line,
/// with its facts from the protocol's table after a tab (`read-only`, or
/// `changes-host`, `spawns`, `network`; `intent=FIELD`): what a
/// `read_only` profile allows is what is marked `read-only`.
fn print_methods() -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    for (m, facts) in executor_protocol::methods::REQUEST_FACTS {
        let line = format!("{m}\t{}\n", facts.describe());
        std::io::Write::write_all(&mut out, line.as_bytes())?;
    }
    Ok(())
}

/// The configuration this connection runs under, or the agent exits with
/// the reason (a bad file, root where the profile forbids it, an audit log
/// that cannot be written).
fn usable_config(cli: &Cli) -> executor_agent::config::Config {
    // A configuration that cannot be used stops the agent before it serves
    // anything: the message names the file, the line and the key.
    let config =
        match executor_agent::config::Config::load(cli.config.as_deref(), cli.profile.as_deref()) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("executor: invalid configuration: {e}");
                std::process::exit(78); // EX_CONFIG
            }
        };
    if !config.profile.allow_root && nix::unistd::geteuid().is_root() {
        eprintln!(
            "executor: profile {} does not allow running as root (allow_root = false)",
            config.profile.name.as_deref().unwrap_or("")
        );
        std::process::exit(77); // EX_NOPERM
    }
    // An audit log that cannot be written stops the agent here, before the
    // preamble, so the client gets this message and the exit status (the
    // session opens it again for its own use).
    if let Err(e) =
        executor_agent::audit::Audit::open(&config.audit, config.profile.name.as_deref())
    {
        eprintln!("executor: cannot start: {e}");
        std::process::exit(73); // EX_CANTCREAT
    }
    config
}

/// What an agent killed mid-job left (job directories, placeholders of
/// carve-outs), removed; never what a live agent's job holds.
fn sweep_leftovers() {
    match executor_sandbox::plan::sweep() {
        Ok(gone) if !gone.is_empty() => {
            tracing::info!(removed = ?gone, "removed what a killed agent's jobs left")
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "cannot remove what a killed agent's jobs left"),
    }
}

/// The agent's helpers are started through `/proc/self/exe`, whose name
/// (`exe`) the kernel gives them as comm: `executor` instead, so `ps -e`
/// and `top` show what they are (argv[0] is `executor` already).
fn name_this_process() {
    let _ = nix::sys::prctl::set_name(c"executor");
}

/// Started by hand on a terminal (stdin a tty), say on stderr what this
/// is and how to use it; stdout stays the protocol's. Under ssh or a
/// client stdin is a pipe and nothing is printed.
fn greet_a_terminal() {
    if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        eprintln!(
            "executor {}: the agent of executor-client, speaking its binary protocol on stdin/stdout.\n\
             It is meant to be started by a client, e.g. `executor-client --target ssh://HOST run -- CMD`\n\
             (or `ssh HOST executor` from a program). `executor --help` lists its options;\n\
             press Ctrl-D to end this session.",
            env!("CARGO_PKG_VERSION")
        );
    }
}

/// `executor sandbox-exec [--lifeline FD] [--status FD] --spec FD`:
/// the trampoline (see `executor_sandbox::trampoline`); `executor
/// sandbox-exec --spawner`: the process that forks every job's supervisor
/// (see `executor_sandbox::spawner`), started by the agent.
fn sandbox_exec(args: &[std::ffi::OsString]) -> ! {
    use executor_sandbox::{spawner, trampoline};
    if args.len() == 1 && args[0] == "--spawner" {
        std::process::exit(match spawner::serve() {
            Ok(code) => code,
            Err(e) => {
                eprintln!("executor sandbox-exec --spawner: {e}");
                126
            }
        });
    }
    std::process::exit(trampoline::run_reporting(trampoline::Spec::parse(args)))
}

/// When stdin and stdout are pipes or sockets (under sshd, or a spawning
/// client), drive them directly on the runtime (non-blocking, vectored
/// writes) instead of through tokio's blocking-thread stdio, which copies
/// every write. A terminal or a regular file keeps the portable path (and
/// is never switched to non-blocking mode): see
/// [`executor_sys::stream_stdio`].
fn stream_stdio() -> Option<(
    tokio::net::unix::pipe::Receiver,
    tokio::net::unix::pipe::Sender,
)> {
    let (input, output) = executor_sys::stream_stdio()?;
    let input = tokio::net::unix::pipe::Receiver::from_owned_fd_unchecked(input).ok()?;
    let output = tokio::net::unix::pipe::Sender::from_owned_fd_unchecked(output).ok()?;
    Some((input, output))
}

/// The man page or a completion script, from the CLI definition.
fn generate(kind: &str) -> anyhow::Result<()> {
    use clap::CommandFactory;
    let (mut cmd, mut text) = (Cli::command(), Vec::new());
    match kind {
        "man" => man_page(cmd, &mut text)?,
        shell => {
            let shell: clap_complete::Shell = shell.parse().map_err(|_| {
                anyhow::anyhow!("--generate: {shell:?} is not man, bash, zsh or fish")
            })?;
            clap_complete::generate(shell, &mut cmd, "executor", &mut text);
        }
    }
    std::io::Write::write_all(&mut std::io::stdout().lock(), &text)?;
    Ok(())
}

/// The man page as `executor-client`'s is made: clap_mangen for NAME,
/// SYNOPSIS, DESCRIPTION and OPTIONS, then EXIT STATUS, ENVIRONMENT, FILES
/// and EXAMPLES written here (naming no page that is not shipped).
fn man_page(cmd: clap::Command, out: &mut Vec<u8>) -> std::io::Result<()> {
    let man = clap_mangen::Man::new(cmd);
    man.render_title(out)?;
    man.render_name_section(out)?;
    man.render_synopsis_section(out)?;
    man.render_description_section(out)?;
    man.render_options_section(out)?;
    out.extend_from_slice(MAN_SECTIONS.as_bytes());
    man.render_version_section(out)
}

const MAN_SECTIONS: &str = r#".SH "EXIT STATUS"
.TP
\fB0\fR
The connection ended (the client closed it).
.TP
\fB2\fR
Bad usage, a forced command refused (SSH_ORIGINAL_COMMAND), or a framing error on the connection.
.TP
\fB77\fR
The profile does not allow running as root (allow_root = false).
.TP
\fB78\fR
The configuration cannot be used (the message names the file, line and key).
.SH ENVIRONMENT
.TP
\fBRUST_LOG\fR
The log filter (default warn); logs go to stderr, never stdout.
.TP
\fBEXECUTOR_LOG_JSON\fR
\fB1\fR: logs as JSON lines, as with \fB\-\-log\-json\fR.
.TP
\fBSSH_ORIGINAL_COMMAND\fR
Set by sshd under an authorized_keys forced command: only \fBexecutor\fR (or \fBexecutor \-\-version\fR) is served.
.TP
\fBXDG_RUNTIME_DIR\fR, \fBHOME\fR
Where detached sessions keep their sockets.
.SH FILES
.TP
\fI/etc/executor/config.toml\fR
The configuration (limits, HTTP policy, profiles, audit); a missing default file means the built-in defaults.
.TP
\fI$XDG_RUNTIME_DIR/executor/\fR, \fI/tmp/executor\-UID/\fR, \fI~/.cache/executor/run/\fR
Sockets of detached sessions (the first private one).
.TP
\fI$XDG_RUNTIME_DIR/executor/login\-env\-VERSION\fR
The user's login\-shell environment (mode 0600), taken for an unsandboxed job and read by later sessions for 5 minutes while the shell, its starting environment and the login files (\fI~/.profile\fR, \fI~/.bashrc\fR, \fI/etc/profile.d/\fR, the zsh, fish and csh ones) are unchanged; only where \fB$XDG_RUNTIME_DIR\fR holds the sockets.
.SH EXAMPLES
.TP
\fBssh devbox executor\fR
What a client runs: the agent speaks the protocol on stdin/stdout.
.TP
\fBcommand="executor \-\-profile ci",restrict ssh\-ed25519 AAAA...\fR
An authorized_keys line that serves only the agent, under profile ci.
.TP
\fBexecutor \-\-list\-methods\fR
Print every request method.
"#;

fn init_tracing(json: bool) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}
