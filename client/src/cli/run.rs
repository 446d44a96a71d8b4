//! `run`, `shell` and `attach`: a job on the host, its output streamed,
//! stdin forwarded (`-n`: /dev/null), the terminal's size followed with
//! `-t`; the first Ctrl-C interrupts the job (`process/signal`), a second
//! one disconnects (status 130). The status is the job's own, always; the
//! agent's `sandbox_denied` (a heuristic on its output) is only a note.

use super::exit::{self, Outside, Usage};
use super::sandbox::{report_degraded, SandboxArgs};
use super::signals::{Caught, Signals};
use anyhow::Context;
use executor_client::protocol::methods;
use executor_client::protocol::types::process::{
    EnvBase, OutputStream, ProcessResizeParams, ProcessSignalParams, ProcessStartParams,
    ProcessWriteParams, PtySize, SignalName, StdinMode,
};
use executor_client::protocol::types::session::{EnvironmentInfo, ResumeParams, SessionParams};
use executor_client::{Client, Error, ErrorCode, Process};
use std::collections::BTreeMap;
use std::io::Write;
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
    /// Working directory on the host (default: the agent's).
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
    /// Keep the session for SECS after the connection drops (the job runs
    /// on); `executor-client attach` resumes it.
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
    /// Size of a sandboxed job's --tmp (its own tmpfs; default 1G).
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
        let info = client.environment_info().await?;
        let (env, env_base) = self.environment(&info)?;
        let cwd = self.cwd.clone().unwrap_or_else(|| info.cwd.clone());
        let mut params = ProcessStartParams::new(self.argv.clone(), cwd.as_str(), env);
        params.env_base = env_base;
        params.sandbox = self.sandbox.intent(&cwd)?;
        params.limits = self.limits.limits();
        // The agent runs no login shell for a sandboxed job (its dotfiles
        // would run unconfined): start from the agent's own environment
        // instead.
        if params.sandbox.is_some() && env_base == EnvBase::Login {
            params.env_base = EnvBase::Agent;
        }
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
        let path = token_path(&self.session)?;
        let token = std::fs::read_to_string(&path).with_context(|| {
            format!("no token for session {} ({})", self.session, path.display())
        })?;
        Ok(SessionParams {
            resume: Some(ResumeParams {
                session_id: self.session.clone(),
                token: token.trim().to_string(),
            }),
            detach_ttl_ms: None,
        })
    }
}

fn local_term() -> String {
    std::env::var("TERM").unwrap_or_else(|_| "xterm-256color".into())
}

/// `run`
pub async fn run(client: &Client, args: RunArgs, signals: &mut Signals) -> anyhow::Result<i32> {
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
    if args.detach.is_some() {
        save_token(client, proc.id())?;
    }
    let raw = (args.tty && std::io::IsTerminal::is_terminal(&std::io::stdin()))
        .then(RawMode::enable)
        .flatten();
    let code = pump(proc, !args.no_stdin, args.tty, signals).await;
    drop(raw);
    code
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
    let info = client.environment_info().await?;
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
    let code = pump(proc, true, true, signals).await;
    drop(raw);
    code
}

/// `attach`: follow a job of a resumed session, from its first retained
/// output.
pub async fn attach(
    client: &Client,
    args: AttachArgs,
    signals: &mut Signals,
) -> anyhow::Result<i32> {
    let id = match args.process {
        Some(id) => id,
        None => {
            let running: Vec<_> = client
                .process_list()
                .await?
                .processes
                .into_iter()
                .filter(|p| p.running)
                .collect();
            match running.as_slice() {
                [only] => only.process_id.clone(),
                [] => return Err(Outside(format!("session {} runs no job", args.session)).into()),
                _ => {
                    let ids: Vec<_> = running.iter().map(|p| p.process_id.as_str()).collect();
                    return Err(Outside(format!(
                        "session {} runs {}: name one",
                        args.session,
                        ids.join(", ")
                    ))
                    .into());
                }
            }
        }
    };
    let proc = client.attach_process(&id).await?;
    pump(proc, false, false, signals).await
}

/// Where `run --detach` keeps a session's resume token (mode 0600).
fn token_path(session: &str) -> anyhow::Result<std::path::PathBuf> {
    if session.is_empty()
        || !session
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(Outside(format!("{session:?} is not a session id")).into());
    }
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cache")))
        .context("neither XDG_RUNTIME_DIR nor HOME is set")?;
    Ok(base.join("executor-client").join(session))
}

fn save_token(client: &Client, process_id: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let init = client.initialize_result();
    let path = token_path(&init.session_id)?;
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("writing {}", path.display()))?;
    writeln!(f, "{}", init.resume_token)?;
    say!(
        "executor-client: session {} outlives the connection; resume: executor-client attach {} {}",
        init.session_id,
        init.session_id,
        process_id
    );
    Ok(())
}

/// Stream output to our stdout/stderr, forward stdin (and window size
/// changes for a tty), turn signals into `process/signal`; return the
/// remote exit as a shell exit code.
async fn pump(
    mut proc: Process,
    forward_stdin: bool,
    tty: bool,
    signals: &mut Signals,
) -> anyhow::Result<i32> {
    let job = Job::new(&proc);
    let mut tasks = Vec::new();
    if forward_stdin {
        tasks.push(tokio::spawn(forward(Job::new(&proc))));
    }
    if tty {
        tasks.push(tokio::spawn(follow_size(Job::new(&proc))));
    }
    let result = output_until_exit(&mut proc, &job, signals).await;
    for t in tasks {
        t.abort();
    }
    if let Some(code) = result? {
        return Ok(code);
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
    Ok(status.shell_code())
}

/// Output until the job exits (`None`), or the status a signal ends the
/// client with.
async fn output_until_exit(
    proc: &mut Process,
    job: &Job,
    signals: &mut Signals,
) -> anyhow::Result<Option<i32>> {
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    let mut interrupted = false;
    loop {
        tokio::select! {
            chunk = proc.next_output() => {
                let Some(chunk) = chunk? else { return Ok(None) };
                let sink: &mut dyn Write = match chunk.stream {
                    OutputStream::Stderr => &mut err,
                    _ => &mut out,
                };
                sink.write_all(&chunk.data)?;
                sink.flush()?;
            }
            sig = signals.recv() => match sig {
                Caught::Interrupt if !interrupted => {
                    interrupted = true;
                    tracing::info!(process_id = %job.id, "interrupting the job (again to disconnect)");
                    job.signal(SignalName::Interrupt).await?;
                }
                Caught::Interrupt => {
                    say!("executor-client: interrupted twice: disconnected");
                    return Ok(Some(Caught::Interrupt.exit_code()));
                }
                other => {
                    let _ = job.signal(SignalName::Terminate).await;
                    return Ok(Some(other.exit_code()));
                }
            }
        }
    }
}

/// Our stdin to the job's, then EOF. When stdin is the terminal this is
/// its only reader: a question of the CLI's own (`--net ask`) gets the
/// next line instead of the job (`tty_question`).
async fn forward(job: Job) {
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
    let mut stdin = tokio::io::stdin();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match stdin.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = job.write(&[], true).await;
                return;
            }
            Ok(n) => {
                let data = if terminal {
                    super::tty_question::route(&buf[..n])
                } else {
                    std::borrow::Cow::Borrowed(&buf[..n])
                };
                if !data.is_empty() && job.write(&data, false).await.is_err() {
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
