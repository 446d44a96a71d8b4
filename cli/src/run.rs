//! `run`, `shell` and `attach`: a job on the host, its output streamed,
//! stdin forwarded (`-n`: /dev/null), the terminal's size followed with
//! `-t`; the first Ctrl-C interrupts the job (`process/signal`), a second
//! one disconnects (status 130). The status is the job's own, always; the
//! agent's `sandbox_denied` (a heuristic on its output) is only a note. A
//! detached session (`run --detach`, `attach`) is left running on SIGHUP,
//! SIGTERM, a second Ctrl-C or the detach key ([`super::detach`]).

use super::connect::ConnectArgs;
use super::detach::{self, Escape, TokenStore};
use super::exit::{self, Outside, Usage};
use super::sandbox::{report_degraded, SandboxArgs};
use super::signals::{Caught, Signals};
use anyhow::Context;
use executor_client::protocol::methods;
use executor_client::protocol::types::process::{
    EnvBase, OutputStream, ProcessResizeParams, ProcessSignalParams, ProcessStartParams,
    ProcessWriteParams, PtySize, SignalName, StdinMode,
};
use executor_client::protocol::types::session::{EnvironmentInfo, SessionParams};
use executor_client::{Client, Error, ErrorCode, Process};
use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// The PATH of `--clean-env`.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Give it a terminal (output arrives as one stream; keys go raw).
    #[arg(short = 't', long)]
    pub tty: bool,
    /// Stdin from /dev/null instead of this client's stdin.
    #[arg(short = 'n', long = "no-stdin")]
    pub no_stdin: bool,
    /// Working directory on the host (default: the home directory, as ssh;
    /// under a sandbox that grants nothing there, its first --rw root, else
    /// its first --ro root).
    #[arg(long)]
    pub cwd: Option<String>,
    /// An environment entry, on top of the host user's login environment
    /// (repeatable).
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// Only the --env entries, plus a standard PATH and HOME (no login
    /// environment).
    #[arg(long, conflicts_with = "inherit_env")]
    pub clean_env: bool,
    /// This machine's whole environment instead of the host's.
    #[arg(long)]
    pub inherit_env: bool,
    /// Keep the session for SECS after this client leaves it (the job runs
    /// on): on SIGHUP, SIGTERM, a second Ctrl-C, `~.` typed at the start of
    /// a line, or a lost connection; the printed command (`attach`)
    /// resumes it.
    #[arg(long, value_name = "SECS")]
    pub detach: Option<u64>,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    /// Program and arguments (no shell is added).
    #[arg(required = true, last = true)]
    pub argv: Vec<String>,
}

/// A job's resource limits (what the host cannot enforce refuses the job).
#[derive(Debug, Clone, clap::Args)]
pub struct LimitArgs {
    /// Memory of all the job's processes together (K, M, G suffixes:
    /// 1024-based); past it a process of the job is OOM-killed.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub memory: Option<u64>,
    /// Processes (and threads) of the job at once; a fork past it fails.
    #[arg(long, value_name = "N")]
    pub processes: Option<u64>,
    /// CPU time per second of wall time, in cores (0.5: half a core).
    #[arg(long, value_name = "CORES", value_parser = parse_cpus)]
    pub cpus: Option<u64>,
    /// A sandboxed job's --tmp as a tmpfs of its own of SIZE (default: a
    /// private directory in the host's /tmp).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub tmp_size: Option<u64>,
}

impl LimitArgs {
    /// `process/start`'s `limits`, if any flag was given.
    pub fn limits(&self) -> Option<executor_client::protocol::types::process::JobLimits> {
        let l = executor_client::protocol::types::process::JobLimits {
            memory_bytes: self.memory,
            processes: self.processes,
            cpu_millis_per_sec: self.cpus,
            tmp_bytes: self.tmp_size,
            required: None,
        };
        (l != Default::default()).then_some(l)
    }
}

/// `64M`, `1G`, `4096`: bytes (1024-based suffixes K, M, G, T).
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(format!("{s:?}: a size is a number with K, M, G or T")),
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?}: a size is a number with K, M, G or T"))?;
    n.checked_shl(shift)
        .filter(|v| v >> shift == n)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// `0.5` cores: 500 ms of CPU per second.
fn parse_cpus(s: &str) -> Result<u64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("{s:?}: cores are a number (0.5, 2)"))?;
    if !(v.is_finite() && v > 0.0 && v <= 4096.0) {
        return Err(format!("{s:?}: cores are above 0 and at most 4096"));
    }
    Ok((v * 1000.0).round() as u64)
}

impl RunArgs {
    /// The session options of `--detach`.
    pub fn session_params(&self) -> Option<SessionParams> {
        self.detach.map(|secs| SessionParams {
            resume: None,
            detach_ttl_ms: Some(secs.saturating_mul(1000)),
        })
    }

    /// The job's `process/start` params (argv, cwd, environment, sandbox
    /// intent; no terminal) and its cwd.
    pub async fn start_params(
        &self,
        client: &Client,
    ) -> anyhow::Result<(ProcessStartParams, String)> {
        let info = client
            .call(&executor_client::protocol::types::session::EnvironmentInfoParams {})
            .await?;
        let (env, env_base) = self.environment(&info)?;
        // One rule, sandboxed or not, as `ssh host CMD`: the home
        // directory and the login environment (for a sandboxed job the
        // agent runs the login shell inside the job's sandbox). A sandbox
        // that grants nothing at home starts in its first write root
        // (else its first read root) instead: it could not enter home.
        let mut cwd = self.cwd.clone().unwrap_or_else(|| info.home.clone());
        let mut sandbox = self.sandbox.intent(&cwd)?;
        if let (None, Some(intent)) = (&self.cwd, &sandbox) {
            if let Some(root) = root_instead_of(intent, &cwd) {
                cwd = root;
                sandbox = self.sandbox.intent(&cwd)?;
            }
        }
        let mut params = ProcessStartParams::new(self.argv.clone(), cwd.as_str(), env);
        params.env_base = env_base;
        params.sandbox = sandbox;
        params.limits = self.limits.limits();
        Ok((params, cwd))
    }

    fn environment(
        &self,
        info: &EnvironmentInfo,
    ) -> anyhow::Result<(BTreeMap<String, String>, EnvBase)> {
        let (mut vars, base) = if self.inherit_env {
            (std::env::vars().collect(), EnvBase::None)
        } else if self.clean_env {
            let vars = BTreeMap::from([
                ("PATH".to_string(), DEFAULT_PATH.to_string()),
                ("HOME".to_string(), info.home.clone()),
            ]);
            (vars, EnvBase::None)
        } else {
            (BTreeMap::new(), EnvBase::Login)
        };
        if self.tty {
            vars.entry("TERM".into()).or_insert_with(local_term);
        }
        for kv in &self.env {
            let (k, v) = kv
                .split_once('=')
                .filter(|(k, _)| !k.is_empty())
                .ok_or_else(|| Usage(format!("--env {kv:?} is not K=V")))?;
            vars.insert(k.into(), v.into());
        }
        Ok((vars, base))
    }
}

#[derive(Debug, clap::Args)]
pub struct AttachArgs {
    /// The session, as `run --detach` printed it.
    pub session: String,
    /// The job to follow (default: the session's only running one).
    pub process: Option<String>,
}

impl AttachArgs {
    /// Resume with the token `run --detach` saved.
    pub fn session_params(&self) -> anyhow::Result<SessionParams> {
        Ok(TokenStore::open()?.resume(&self.session)?.0)
    }
}

/// The root to start in when `intent` grants no access to `home`: its
/// first write root, else its first read root (`None`: home is held, or
/// no root names a plain path).
fn root_instead_of(
    intent: &executor_client::protocol::types::sandbox::SandboxIntent,
    home: &str,
) -> Option<String> {
    use executor_client::protocol::types::sandbox::ReadRoots;
    let plain = |r: &executor_client::protocol::WirePath| {
        std::str::from_utf8(r.as_bytes())
            .ok()
            .filter(|p| p.starts_with('/'))
            .map(str::to_owned)
    };
    let fs = &intent.filesystem;
    let read: Vec<String> = match &fs.read {
        ReadRoots::All => return None,
        ReadRoots::Paths(roots) => roots.iter().filter_map(plain).collect(),
    };
    let write: Vec<String> = fs.write.iter().filter_map(plain).collect();
    let held = write
        .iter()
        .chain(&read)
        .any(|r| std::path::Path::new(home).starts_with(r));
    if held {
        return None;
    }
    write.into_iter().chain(read).next()
}

fn local_term() -> String {
    std::env::var("TERM").unwrap_or_else(|_| "xterm-256color".into())
}

/// `run`
pub async fn run(
    client: &Client,
    conn: &ConnectArgs,
    args: RunArgs,
    signals: &mut Signals,
) -> anyhow::Result<i32> {
    let (mut params, cwd) = args.start_params(client).await?;
    params.tty = args.tty;
    if args.tty {
        params.pty_size = terminal_size();
    }
    if args.no_stdin && !args.tty {
        params.stdin = StdinMode::Null;
    }
    let proc = match client.start(&params).await {
        Ok(p) => p,
        Err(e) => return start_failure(e, &cwd),
    };
    report_degraded("run", proc.sandbox_degraded());
    let detached = match args.detach {
        Some(secs) => {
            let d = Detachable::new(client, conn, proc.id(), Duration::from_secs(secs))?;
            say!(
                "executor-client: session {} outlives this client for {secs} s (detach: ~. at the start of a line, then Enter unless -t; or close the terminal); reattach: {}",
                d.session,
                d.command
            );
            Some(d)
        }
        None => None,
    };
    let raw = (args.tty && std::io::IsTerminal::is_terminal(&std::io::stdin()))
        .then(RawMode::enable)
        .flatten();
    let end = pump(proc, !args.no_stdin, args.tty, signals, detached.as_ref()).await;
    drop(raw);
    finish(end, detached.as_ref(), client).await
}

/// A session this client may leave running: its token is saved, and how
/// to come back is known.
struct Detachable {
    store: TokenStore,
    session: String,
    ttl: Duration,
    command: String,
}

impl Detachable {
    /// Save the client's session token (TTL `ttl`) for job `process`.
    fn new(
        client: &Client,
        conn: &ConnectArgs,
        process: &str,
        ttl: Duration,
    ) -> anyhow::Result<Self> {
        let store = TokenStore::open()?;
        store.save(client, ttl)?;
        let session = client.initialize_result().session_id.clone();
        let command = detach::reattach_command(conn, &session, process);
        Ok(Detachable {
            store,
            session,
            ttl,
            command,
        })
    }
}

/// How following a job ended.
enum End {
    /// The job exited (or a signal ended a session that is not kept): the
    /// status to exit with.
    Status(i32),
    /// This client left a detached session (why): the job runs on.
    Detached(&'static str),
}

/// The exit status for `end`; a detached session's token is saved again
/// (its TTL counts from now), and removed once the session has nothing
/// left to show (its job's exit was shown, and it runs no other job).
async fn finish(
    end: anyhow::Result<End>,
    detached: Option<&Detachable>,
    client: &Client,
) -> anyhow::Result<i32> {
    match (end?, detached) {
        (End::Status(code), None) => Ok(code),
        (End::Detached(_), None) => Ok(exit::CONNECTION),
        (End::Detached(why), Some(d)) => {
            d.store.save(client, d.ttl)?;
            detach::tell_detached(why, &d.command);
            Ok(0)
        }
        (End::Status(code), Some(d)) => {
            let others = client
                .call(&executor_client::protocol::types::process::ProcessListParams {})
                .await
                .map(|l| l.processes.iter().any(|p| p.running))
                .unwrap_or(true);
            if others {
                d.store.save(client, d.ttl)?;
            } else {
                d.store.remove(&d.session);
            }
            Ok(code)
        }
    }
}

/// 127 / 126 for a program that is missing / not executable (the message
/// names it), the error otherwise.
pub(super) fn start_failure(e: Error, cwd: &str) -> anyhow::Result<i32> {
    let Error::Remote(w) = &e else {
        return Err(e.into());
    };
    let path = w
        .data
        .as_ref()
        .and_then(|d| d.as_map())
        .and_then(|m| m.iter().find(|(k, _)| k.as_str() == Some("path")))
        .and_then(|(_, v)| v.as_str());
    let about_program = path.is_some_and(|p| p != cwd);
    let code = match w.code {
        ErrorCode::NotFound if about_program => exit::NOT_FOUND,
        ErrorCode::PermissionDenied if about_program => exit::NOT_EXECUTABLE,
        _ => return Err(e.into()),
    };
    say!("executor-client: {}", super::quote::message(&w.message));
    Ok(code)
}

/// `shell`: the user's login shell on a terminal.
pub async fn shell(client: &Client, signals: &mut Signals) -> anyhow::Result<i32> {
    let info = client
        .call(&executor_client::protocol::types::session::EnvironmentInfoParams {})
        .await?;
    let vars = BTreeMap::from([("TERM".to_string(), local_term())]);
    let mut params = ProcessStartParams::new(
        vec![info.shell.path.clone(), "-l".into()],
        info.home.as_str(),
        vars,
    );
    params.env_base = EnvBase::Login;
    params.tty = true;
    params.pty_size = terminal_size();
    let proc = match client.start(&params).await {
        Ok(p) => p,
        Err(e) => return start_failure(e, &info.home),
    };
    let raw = RawMode::enable();
    let end = pump(proc, true, true, signals, None).await;
    drop(raw);
    finish(end, None, client).await
}

/// `attach`: follow a job of a resumed session, from its first retained
/// output to its exit status (at once for a job that already exited);
/// the terminal's keys go to the job (with the detach key), other stdin
/// does not. A session the agent no longer knows loses its token.
pub async fn attach(
    client: &Client,
    conn: &ConnectArgs,
    args: AttachArgs,
    signals: &mut Signals,
) -> anyhow::Result<i32> {
    let store = TokenStore::open()?;
    let (_, ttl) = store.resume(&args.session)?;
    let jobs = client
        .call(&executor_client::protocol::types::process::ProcessListParams {})
        .await?
        .processes;
    let id = match args.process {
        Some(id) => id,
        None => {
            // The running job, else the one whose exit is still to be shown.
            let running: Vec<_> = jobs.iter().filter(|p| p.running).collect();
            let pick = if running.is_empty() {
                jobs.iter().collect()
            } else {
                running
            };
            match pick.as_slice() {
                [only] => only.process_id.clone(),
                [] => {
                    store.remove(&args.session);
                    return Err(Outside(format!("session {} has no job", args.session)).into());
                }
                _ => {
                    let ids: Vec<_> = pick.iter().map(|p| p.process_id.as_str()).collect();
                    return Err(Outside(format!(
                        "session {} has {}: name one",
                        args.session,
                        ids.join(", ")
                    ))
                    .into());
                }
            }
        }
    };
    let d = Detachable {
        command: detach::reattach_command(conn, &args.session, &id),
        session: args.session,
        store,
        ttl,
    };
    let proc = client.attach_process(&id).await?;
    let stdin = std::io::IsTerminal::is_terminal(&std::io::stdin());
    let end = pump(proc, stdin, false, signals, Some(&d)).await;
    finish(end, Some(&d), client).await
}

/// `attach`'s connection failed: a session the agent says is gone loses
/// its token.
pub fn attach_failed(session: &str, e: &anyhow::Error) {
    let expired = e.chain().any(|c| {
        matches!(
            c.downcast_ref::<Error>(),
            Some(Error::Remote(w)) if w.code == ErrorCode::SessionExpired
        )
    });
    if expired {
        if let Ok(store) = TokenStore::open() {
            store.remove(session);
        }
    }
}

/// Stream output to our stdout/stderr, forward stdin (and window size
/// changes for a tty), turn signals into `process/signal`; return the
/// remote exit as a shell exit code. With `detached` (a session kept for
/// the job) SIGHUP, SIGTERM, a second Ctrl-C and the detach key leave
/// instead.
async fn pump(
    mut proc: Process,
    forward_stdin: bool,
    tty: bool,
    signals: &mut Signals,
    detached: Option<&Detachable>,
) -> anyhow::Result<End> {
    let job = Job::new(&proc);
    let mut tasks = Vec::new();
    let (key_tx, mut key_rx) = tokio::sync::oneshot::channel();
    if forward_stdin {
        let key = detached.is_some().then_some(key_tx);
        tasks.push(tokio::spawn(forward(Job::new(&proc), key)));
    }
    if tty {
        tasks.push(tokio::spawn(follow_size(Job::new(&proc))));
    }
    let result = output_until_exit(&mut proc, &job, signals, detached.is_some(), &mut key_rx).await;
    for t in tasks {
        t.abort();
    }
    if let Some(end) = result? {
        return Ok(end);
    }
    let status = proc
        .exit_status()
        .with_context(|| format!("{} ended without an exit status", proc.id()))?;
    report_usage(proc.id(), &status);
    // The agent's guess from the job's last output (a permission-style
    // error); the job ran, so its status is what it says.
    if status.sandbox_denied {
        say!(
            "executor-client: note: {} exited {} after a permission error; the sandbox may have denied it something",
            proc.id(),
            status.shell_code()
        );
    }
    Ok(End::Status(status.shell_code()))
}

/// Output until the job exits (`None`), or how a signal or the detach key
/// (`key`) ended following it.
async fn output_until_exit(
    proc: &mut Process,
    job: &Job,
    signals: &mut Signals,
    detachable: bool,
    key: &mut tokio::sync::oneshot::Receiver<()>,
) -> anyhow::Result<Option<End>> {
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    let mut interrupted = false;
    let mut key_open = true;
    loop {
        tokio::select! {
            chunk = proc.next_output() => {
                let Some(chunk) = chunk? else { return Ok(None) };
                let sink: &mut dyn Write = match chunk.stream {
                    OutputStream::Stderr => &mut err,
                    _ => &mut out,
                };
                let written = sink.write_all(&chunk.data).and_then(|()| sink.flush());
                match written {
                    // The terminal hung up (EIO) or the reader left: a kept
                    // session runs on.
                    Err(e) if detachable && e.kind() != std::io::ErrorKind::Interrupted => {
                        tracing::debug!(error = %e, "cannot write the job's output");
                        return Ok(Some(End::Detached("the output is gone")));
                    }
                    r => r?,
                }
            }
            typed = &mut *key, if key_open => match typed {
                Ok(()) => return Ok(Some(End::Detached("~."))),
                Err(_) => key_open = false,
            },
            sig = signals.recv() => match sig {
                Caught::Interrupt if !interrupted => {
                    interrupted = true;
                    tracing::info!(process_id = %job.id, "interrupting the job (again to disconnect)");
                    job.signal(SignalName::Interrupt).await?;
                }
                Caught::Interrupt if detachable => return Ok(Some(End::Detached("interrupted twice"))),
                Caught::Interrupt => {
                    say!("executor-client: interrupted twice: disconnected");
                    return Ok(Some(End::Status(Caught::Interrupt.exit_code())));
                }
                other if detachable => return Ok(Some(End::Detached(other.name()))),
                other => {
                    let _ = job.signal(SignalName::Terminate).await;
                    return Ok(Some(End::Status(other.exit_code())));
                }
            }
        }
    }
}

/// Our stdin to the job's, then EOF. When stdin is the terminal this is
/// its only reader: a question of the CLI's own (`--net ask`) gets the
/// next line instead of the job (`tty_question`). With `detach_key` (a
/// detached session, stdin a terminal) the detach key is watched for:
/// typed, it is reported there and nothing more is read; the job's stdin
/// then stays open, for a later `attach`.
async fn forward(job: Job, detach_key: Option<tokio::sync::oneshot::Sender<()>>) {
    struct Forwarding(bool);
    impl Drop for Forwarding {
        fn drop(&mut self) {
            if self.0 {
                super::tty_question::forwarding_terminal(false);
            }
        }
    }
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stdin());
    let _forwarding = Forwarding(terminal);
    if terminal {
        super::tty_question::forwarding_terminal(true);
    }
    let mut escape = (terminal && detach_key.is_some()).then_some(Escape::LineStart);
    let mut stdin = tokio::io::stdin();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match stdin.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = job.write(&[], true).await;
                return;
            }
            Ok(n) => {
                let (read, detach) = match escape.as_mut() {
                    Some(e) => {
                        let s = e.scan(&buf[..n]);
                        (std::borrow::Cow::Owned(s.data), s.detach)
                    }
                    None => (std::borrow::Cow::Borrowed(&buf[..n]), false),
                };
                let data = if terminal {
                    std::borrow::Cow::Owned(super::tty_question::route(&read).into_owned())
                } else {
                    read
                };
                if !data.is_empty() && job.write(&data, false).await.is_err() {
                    return;
                }
                if detach {
                    if let Some(tx) = detach_key {
                        let _ = tx.send(());
                    }
                    return;
                }
            }
        }
    }
}

/// The local terminal's size, followed.
async fn follow_size(job: Job) {
    let Ok(mut winch) =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
    else {
        return;
    };
    while winch.recv().await.is_some() {
        if let Some(size) = terminal_size() {
            let _ = job.resize(size).await;
        }
    }
}

/// The local terminal's size; `None` (the agent's default size) without a
/// terminal or for one that reports 0 rows or columns (a fresh PTY whose
/// size was never set, as `script` or a CI runner makes).
fn terminal_size() -> Option<PtySize> {
    crossterm::terminal::size()
        .ok()
        .filter(|&(cols, rows)| cols > 0 && rows > 0)
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

/// A job's stdin, terminal and signals, apart from its output.
struct Job {
    client: Client,
    id: String,
}

impl Job {
    fn new(p: &Process) -> Self {
        Job {
            client: p.client().clone(),
            id: p.id().to_string(),
        }
    }

    async fn call<P: serde::Serialize>(&self, method: &str, params: &P) -> Result<(), Error> {
        self.client
            .request::<_, executor_client::protocol::types::Empty>(method, params)
            .await
            .map(|_| ())
    }

    async fn write(&self, data: &[u8], close: bool) -> Result<(), Error> {
        let params = ProcessWriteParams {
            process_id: self.id.clone(),
            data: serde_bytes::ByteBuf::from(data.to_vec()),
            close_stdin: close,
            write_id: None,
        };
        self.call(methods::PROCESS_WRITE, &params).await
    }

    async fn signal(&self, signal: SignalName) -> Result<(), Error> {
        let params = ProcessSignalParams {
            process_id: self.id.clone(),
            signal,
        };
        self.call(methods::PROCESS_SIGNAL, &params).await
    }

    async fn resize(&self, size: PtySize) -> Result<(), Error> {
        let params = ProcessResizeParams {
            process_id: self.id.clone(),
            rows: size.rows,
            cols: size.cols,
        };
        self.call(methods::PROCESS_RESIZE, &params).await
    }
}

/// The job's account, at `-v`; and on stderr always, the limit that ended
/// it (an OOM kill's SIGKILL alone would not say why).
fn report_usage(id: &str, status: &executor_client::ExitStatus) {
    use executor_client::protocol::types::process::LimitHit;
    if let Some(u) = &status.usage {
        let ms =
            |us: Option<u64>| us.map_or("-".to_string(), |v| format!("{:.3}s", v as f64 / 1e6));
        let mib = u.peak_memory_bytes.map_or("-".to_string(), |b| {
            format!("{:.1} MiB", b as f64 / 1048576.0)
        });
        let peak = u.processes_peak.map_or("-".to_string(), |p| p.to_string());
        tracing::info!(
            process_id = id,
            "usage: cpu {} user {} system, peak memory {mib}, peak processes {peak}",
            ms(u.cpu_user_us),
            ms(u.cpu_system_us),
        );
    }
    match status.limit_hit {
        Some(LimitHit::Memory) => say!(
            "executor-client: {id} ran out of its memory limit (--memory): the kernel killed it (exit status {})",
            status.shell_code()
        ),
        Some(LimitHit::Processes) => say!(
            "executor-client: {id} reached its processes limit (--processes): a fork of it failed"
        ),
        _ => {}
    }
}

#[cfg(test)]
mod limit_tests {
    use super::*;

    #[test]
    fn sizes_and_cores_parse() {
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("12Q").unwrap_err().contains("12Q"));
        assert!(parse_size("99999999999T")
            .unwrap_err()
            .contains("too large"));
        assert_eq!(parse_cpus("0.5"), Ok(500));
        assert!(parse_cpus("-1").is_err());
        assert!(parse_cpus("nan").is_err());
    }
}
