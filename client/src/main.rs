//! `executor-client`: drive an executor agent from the command line.
#![forbid(unsafe_code)]

use anyhow::Context;
use clap::{Parser, Subcommand};
use executor_client::{Client, ClientOptions, Process, Target};
use executor_protocol::types::fs::FileKind;
use executor_protocol::types::process::{OutputStream, ProcessStartParams, PtySize, StdinMode};
use futures_util::StreamExt;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use tokio::io::AsyncReadExt;

/// Drive an executor agent, locally or over ssh.
#[derive(Debug, Parser)]
#[command(name = "executor-client", version, about)]
struct Cli {
    /// `local` (the executor next to this binary), `ssh://[user@]host[:port]`, or a host.
    #[arg(long, short, default_value = "local", global = true)]
    target: String,
    #[command(subcommand)]
    command: Cmd,
}

/// The environment sent when none is given: enough to find programs.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Show the agent's initialize answer and environment as JSON.
    Info,
    /// Run a command on the agent's host, streaming its output; exits with
    /// its exit code (128+n when killed by signal n).
    Run {
        /// Give it a terminal (output arrives as one stream).
        #[arg(long)]
        tty: bool,
        /// Working directory on the host (default: the agent's).
        #[arg(long)]
        cwd: Option<String>,
        /// Environment entries; the command gets exactly these (plus PATH
        /// and HOME unless given, and TERM with --tty).
        #[arg(long = "env", value_name = "K=V")]
        env: Vec<String>,
        /// Send this machine's whole environment instead.
        #[arg(long)]
        inherit_env: bool,
        /// Program and arguments (no shell is added).
        #[arg(required = true, last = true)]
        argv: Vec<String>,
    },
    /// An interactive login shell in a terminal on the host.
    Shell,
    /// Write a remote file to stdout.
    Cat { path: String },
    /// Copy a remote file to a local path (atomically: a temp file, then rename).
    Get { remote: String, local: PathBuf },
    /// Copy a local file to a remote path (atomically: the remote file
    /// appears whole or not at all).
    Put { local: PathBuf, remote: String },
    /// List a remote tree, one `KIND SIZE PATH` line per entry.
    Walk {
        root: String,
        #[arg(long)]
        max_depth: Option<u32>,
    },
    /// Show a remote path's metadata as JSON.
    Stat { path: String },
    /// Make an HTTP request from the agent's host; the body goes to stdout
    /// as it arrives. Exits 0 for a 2xx status, 1 otherwise.
    Http {
        /// The method.
        #[arg(short = 'X', long = "request", default_value = "GET")]
        method: String,
        /// A header, `Name: value` (repeatable; order kept).
        #[arg(short = 'H', long = "header", value_name = "NAME: VALUE")]
        headers: Vec<String>,
        /// The body: a literal string, or `@FILE` for a local file's bytes.
        #[arg(short = 'd', long = "data")]
        data: Option<String>,
        /// Print the status line and headers to stderr.
        #[arg(short = 'i', long)]
        include: bool,
        /// Follow up to N redirects.
        #[arg(short = 'L', long, value_name = "N", default_value_t = 0)]
        follow: u32,
        /// Deadline for the head and each idle gap of the body, in ms.
        #[arg(long, default_value_t = 30_000)]
        timeout_ms: u64,
        url: String,
    },
    /// Install the agent on the `--target` host over SSH (no network needed
    /// there): picks `FROM/<os>-<arch>/executor` after probing `uname -sm`,
    /// uploads it, checks its SHA-256 on the host, then renames it into
    /// `~/.local/lib/executor/<version>/executor`, which later connections
    /// to the host try before `executor` on its PATH.
    Bootstrap {
        /// A folder of release builds: `<os>-<arch>/executor` (e.g. `linux-x86_64/executor`).
        #[arg(long, value_name = "DIR", required_unless_present = "check")]
        from: Option<PathBuf>,
        /// Install nothing: report the host's agent (path, SHA-256, version
        /// and sandbox capabilities) as JSON.
        #[arg(long)]
        check: bool,
        /// The base directory on the host.
        #[arg(long, value_name = "DIR", default_value = executor_client::bootstrap::DEFAULT_REMOTE_DIR)]
        remote_dir: String,
    },
    /// Print the man page (`man`) or a shell completion script (`bash`,
    /// `zsh`, `fish`), for packaging.
    #[command(hide = true)]
    Generate { kind: String },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Cmd::Generate { kind } = &cli.command {
        use clap::CommandFactory;
        let (mut cmd, mut text) = (Cli::command(), Vec::new());
        match kind.as_str() {
            "man" => clap_mangen::Man::new(cmd).render(&mut text)?,
            shell => {
                let shell: clap_complete::Shell = shell
                    .parse()
                    .map_err(|_| anyhow::anyhow!("{shell:?} is not man, bash, zsh or fish"))?;
                clap_complete::generate(shell, &mut cmd, "executor-client", &mut text);
            }
        }
        std::io::stdout().lock().write_all(&text)?;
        return Ok(());
    }
    let target = Target::parse(&cli.target).map_err(anyhow::Error::msg)?;
    if let Cmd::Bootstrap {
        from,
        check,
        remote_dir,
    } = &cli.command
    {
        let Target::Ssh { user, host, port } = &target else {
            anyhow::bail!("bootstrap needs an ssh --target (ssh://[user@]host[:port])");
        };
        let ssh = executor_client::SshOptions {
            user: user.clone(),
            port: *port,
            ..Default::default()
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        let Some(from) = from.as_deref().filter(|_| !check) else {
            let found = rt.block_on(executor_client::bootstrap::check(
                host,
                &ssh,
                Some(remote_dir),
            ))?;
            let mut out = std::io::stdout().lock();
            serde_json::to_writer_pretty(&mut out, &found.to_json())?;
            writeln!(out)?;
            return Ok(());
        };
        let installed = rt.block_on(executor_client::bootstrap::bootstrap(
            host,
            &ssh,
            from,
            Some(remote_dir),
        ))?;
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "installed {} ({}, sha256 {}): {}",
            installed.path, installed.platform, installed.sha256, installed.version_line
        )?;
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let code = match rt.block_on(run(target, cli.command)) {
        Ok(code) => code,
        // Like ripgrep: a closed stdout (`| head`) is a clean exit.
        Err(e) if is_broken_pipe(&e) => 0,
        Err(e) => return Err(e),
    };
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    std::process::exit(code);
}

async fn run(target: Target, cmd: Cmd) -> anyhow::Result<i32> {
    let client = Client::connect_target(&target, ClientOptions::default())
        .await
        .with_context(|| format!("connecting to {target:?}"))?;
    let code = match cmd {
        Cmd::Info => {
            let init = client.initialize_result();
            let mut init_json = serde_json::to_value(init)?;
            init_json["resume_token"] = serde_json::Value::String("<redacted>".into());
            let env = client.environment_info().await?;
            let out = serde_json::json!({ "initialize": init_json, "environment": env });
            let mut stdout = std::io::stdout().lock();
            serde_json::to_writer_pretty(&mut stdout, &out)?;
            writeln!(stdout)?;
            0
        }
        Cmd::Run {
            tty,
            cwd,
            env,
            inherit_env,
            argv,
        } => {
            let info = client.environment_info().await?;
            let mut vars: BTreeMap<String, String> = if inherit_env {
                std::env::vars().collect()
            } else {
                BTreeMap::new()
            };
            vars.entry("PATH".into())
                .or_insert_with(|| DEFAULT_PATH.into());
            vars.entry("HOME".into())
                .or_insert_with(|| info.home.clone());
            if tty {
                vars.entry("TERM".into()).or_insert_with(|| {
                    std::env::var("TERM").unwrap_or_else(|_| "xterm-256color".into())
                });
            }
            for kv in env {
                let (k, v) = kv
                    .split_once('=')
                    .with_context(|| format!("--env {kv:?} is not K=V"))?;
                vars.insert(k.into(), v.into());
            }
            let mut params = ProcessStartParams::new(argv, cwd.unwrap_or(info.cwd), vars);
            params.tty = tty;
            if tty {
                params.pty_size = terminal_size();
            }
            let interactive = std::io::IsTerminal::is_terminal(&std::io::stdin());
            if !tty && interactive {
                params.stdin = StdinMode::Null;
            }
            let proc = client.start(&params).await?;
            let raw = if tty && interactive {
                RawMode::enable()
            } else {
                None
            };
            let code = pump(proc, tty || !interactive, tty).await;
            drop(raw);
            code?
        }
        Cmd::Shell => {
            let info = client.environment_info().await?;
            let mut vars = BTreeMap::new();
            vars.insert("PATH".to_string(), DEFAULT_PATH.to_string());
            vars.insert("HOME".to_string(), info.home.clone());
            vars.insert("USER".to_string(), info.user.clone());
            vars.insert("SHELL".to_string(), info.shell.path.clone());
            vars.insert(
                "TERM".to_string(),
                std::env::var("TERM").unwrap_or_else(|_| "xterm-256color".into()),
            );
            let mut params = ProcessStartParams::new(
                vec![info.shell.path.clone(), "-l".into()],
                info.home.clone(),
                vars,
            );
            params.tty = true;
            params.pty_size = terminal_size();
            let proc = client.start(&params).await?;
            let raw = RawMode::enable();
            let code = pump(proc, true, true).await;
            drop(raw);
            code?
        }
        Cmd::Http {
            method,
            headers,
            data,
            include,
            follow,
            timeout_ms,
            url,
        } => {
            use executor_client::http::HttpRequest;
            let mut request = HttpRequest::new(method, url)
                .stream(true)
                .follow_redirects(follow)
                .timeout_ms(timeout_ms);
            for h in &headers {
                let (name, value) = h
                    .split_once(':')
                    .with_context(|| format!("header {h:?} is not `Name: value`"))?;
                request = request.header(name.trim(), value.trim_start());
            }
            if let Some(data) = data {
                let bytes = match data.strip_prefix('@') {
                    Some(file) => std::fs::read(file).with_context(|| format!("reading {file}"))?,
                    None => data.into_bytes(),
                };
                request = request.body(bytes);
            }
            let mut response = client.http_request(request).await?;
            if include {
                let mut err = std::io::stderr().lock();
                writeln!(err, "{} {}", response.status, response.url)?;
                for (k, v) in &response.headers {
                    writeln!(err, "{k}: {v}")?;
                }
                writeln!(err)?;
            }
            let mut out = std::io::stdout().lock();
            while let Some(chunk) = response.body.next_chunk().await {
                out.write_all(&chunk?)?;
                out.flush()?;
            }
            if (200..300).contains(&response.status) {
                0
            } else {
                1
            }
        }
        Cmd::Cat { path } => {
            let (_, stream) = client.read_stream(path.as_str()).await?;
            let mut stream = std::pin::pin!(stream);
            let mut out = std::io::stdout().lock();
            while let Some(block) = stream.next().await {
                out.write_all(&block?)?;
            }
            out.flush()?;
            0
        }
        Cmd::Get { remote, local } => {
            let (size, stream) = client.read_stream(remote.as_str()).await?;
            let mut stream = std::pin::pin!(stream);
            let bar = progress(size, &format!("get {remote}"));
            let dir = local
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."));
            let mut tmp = tempfile_in(dir, &local)?;
            while let Some(block) = stream.next().await {
                let block = block?;
                tmp.1.write_all(&block)?;
                bar.inc(block.len() as u64);
            }
            tmp.1.sync_all()?;
            std::fs::rename(&tmp.0, &local)
                .with_context(|| format!("renaming into {}", local.display()))?;
            bar.finish_and_clear();
            0
        }
        Cmd::Put { local, remote } => {
            let file = tokio::fs::File::open(&local)
                .await
                .with_context(|| format!("opening {}", local.display()))?;
            let size = file.metadata().await?.len();
            let bar = progress(size, &format!("put {remote}"));
            let reader = bar.wrap_async_read(file);
            client.write_stream(remote.as_str(), reader, None).await?;
            bar.finish_and_clear();
            0
        }
        Cmd::Walk { root, max_depth } => {
            let mut params = executor_client::fs::walk_params(root.as_str());
            if let Some(d) = max_depth {
                params.max_depth = d;
            }
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            let mut failed = Ok(());
            client
                .walk(params, |page| {
                    for e in &page.entries {
                        let kind = match e.kind {
                            FileKind::File => 'f',
                            FileKind::Dir => 'd',
                            FileKind::Symlink => 'l',
                            _ => '?',
                        };
                        if let Err(err) = writeln!(out, "{kind} {} {}", e.size, e.path.display()) {
                            failed = Err(err);
                        }
                    }
                    for e in &page.errors {
                        tracing::warn!(path = %e.path.display(), code = %e.code, "{}", e.message);
                    }
                })
                .await?;
            failed?;
            out.flush()?;
            0
        }
        Cmd::Generate { .. } | Cmd::Bootstrap { .. } => unreachable!("handled before connecting"),
        Cmd::Stat { path } => {
            let st = client.stat(path.as_str()).await?;
            let mut out = std::io::stdout().lock();
            serde_json::to_writer_pretty(&mut out, &st)?;
            writeln!(out)?;
            0
        }
    };
    client.close().await?;
    Ok(code)
}

/// A progress bar on a terminal (stderr), hidden otherwise.
fn progress(len: u64, what: &str) -> indicatif::ProgressBar {
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}

/// A new temp file beside `target` (removed by the caller's rename).
fn tempfile_in(
    dir: &std::path::Path,
    target: &std::path::Path,
) -> anyhow::Result<(PathBuf, std::fs::File)> {
    let name = target
        .file_name()
        .context("the local path has no file name")?;
    for n in 0..1000u32 {
        let tmp = dir.join(format!(
            ".{}.part{}-{n}",
            name.to_string_lossy(),
            std::process::id()
        ));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
        {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("creating {}", tmp.display())),
        }
    }
    anyhow::bail!("cannot create a temp file in {}", dir.display())
}

fn terminal_size() -> Option<PtySize> {
    crossterm::terminal::size()
        .ok()
        .map(|(cols, rows)| PtySize { rows, cols })
}

/// Raw mode on the local terminal for as long as this lives.
struct RawMode;
impl RawMode {
    fn enable() -> Option<RawMode> {
        crossterm::terminal::enable_raw_mode().ok().map(|_| RawMode)
    }
}
impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = crossterm::terminal::disable_raw_mode();
    }
}

/// Stream output to our stdout/stderr, forward stdin (and window size
/// changes for a tty); return the remote exit as a shell exit code.
async fn pump(mut proc: Process, forward_stdin: bool, tty: bool) -> anyhow::Result<i32> {
    let id = proc.id().to_string();
    let (stdin_client, stdin_task) = if forward_stdin {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Option<Vec<u8>>>(16);
        let task = tokio::spawn(async move {
            let mut stdin = tokio::io::stdin();
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match stdin.read(&mut buf).await {
                    Ok(0) | Err(_) => {
                        let _ = tx.send(None).await;
                        break;
                    }
                    Ok(n) => {
                        if tx.send(Some(buf[..n].to_vec())).await.is_err() {
                            break;
                        }
                    }
                }
            }
        });
        let writer = ProcessWriter::new(&proc);
        let fwd = tokio::spawn(async move {
            while let Some(msg) = rx.recv().await {
                match msg {
                    Some(data) => {
                        if writer.write(&data).await.is_err() {
                            break;
                        }
                    }
                    None => {
                        let _ = writer.close().await;
                        break;
                    }
                }
            }
        });
        (Some(fwd), Some(task))
    } else {
        (None, None)
    };
    let resize = if tty {
        let writer = ProcessWriter::new(&proc);
        Some(tokio::spawn(async move {
            let Ok(mut winch) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
            else {
                return;
            };
            while winch.recv().await.is_some() {
                if let Some(size) = terminal_size() {
                    let _ = writer.resize(size.rows, size.cols).await;
                }
            }
        }))
    } else {
        None
    };
    let mut out = std::io::stdout();
    let mut err = std::io::stderr();
    while let Some(chunk) = proc.next_output().await? {
        match chunk.stream {
            OutputStream::Stderr => {
                err.write_all(&chunk.data)?;
                err.flush()?;
            }
            _ => {
                out.write_all(&chunk.data)?;
                out.flush()?;
            }
        }
    }
    for t in [stdin_client, stdin_task, resize].into_iter().flatten() {
        t.abort();
    }
    let status = proc
        .exit_status()
        .with_context(|| format!("{id} ended without an exit status"))?;
    Ok(status.shell_code())
}

/// A detached writer for a process (its stdin and terminal size).
struct ProcessWriter {
    client: Client,
    id: String,
}

impl ProcessWriter {
    fn new(p: &Process) -> Self {
        ProcessWriter {
            client: p.client().clone(),
            id: p.id().to_string(),
        }
    }
    async fn write(&self, data: &[u8]) -> Result<(), executor_client::Error> {
        self.client
            .request::<_, executor_protocol::types::Empty>(
                executor_protocol::methods::PROCESS_WRITE,
                &executor_protocol::types::process::ProcessWriteParams {
                    process_id: self.id.clone(),
                    data: serde_bytes::ByteBuf::from(data.to_vec()),
                    close_stdin: false,
                },
            )
            .await
            .map(|_| ())
    }
    async fn close(&self) -> Result<(), executor_client::Error> {
        self.client
            .request::<_, executor_protocol::types::Empty>(
                executor_protocol::methods::PROCESS_WRITE,
                &executor_protocol::types::process::ProcessWriteParams {
                    process_id: self.id.clone(),
                    data: serde_bytes::ByteBuf::new(),
                    close_stdin: true,
                },
            )
            .await
            .map(|_| ())
    }
    async fn resize(&self, rows: u16, cols: u16) -> Result<(), executor_client::Error> {
        self.client
            .request::<_, executor_protocol::types::Empty>(
                executor_protocol::methods::PROCESS_RESIZE,
                &executor_protocol::types::process::ProcessResizeParams {
                    process_id: self.id.clone(),
                    rows,
                    cols,
                },
            )
            .await
            .map(|_| ())
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            || c.downcast_ref::<serde_json::Error>()
                .and_then(|j| j.io_error_kind())
                .is_some_and(|k| k == std::io::ErrorKind::BrokenPipe)
    })
}
