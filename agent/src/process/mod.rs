//! Processes (docs/PROTOCOL.md §3): start, output, read, write, signal, resize,
//! list. The jobs themselves (their state, output buffer and table) are in
//! [`crate::tables::jobs`]; this module starts them and serves the
//! `process/*` methods.
//!
//! Each job has its own tasks: one per output stream draining it into the
//! bounded output buffer (so a child never blocks on a full pipe, whatever
//! the client does), and one waiting for its exit. Output is pushed as
//! `process/output` only while the connection's notification queue has
//! room; otherwise the job is marked lagged, `process/lagged` is sent once,
//! and the client catches up with `process/read`.
//!
//! A handler module: it uses the session, its job table, `outbound` and
//! [`crate::sandbox_gate`]; nothing above it.

mod egress;
pub mod spawn;
pub mod spawner;

use crate::outbound::Outbound;
use crate::session::Session;
pub use crate::tables::jobs::{signal_name, Exit, Proc, LAG_PATIENCE, REAP_AFTER, TERM_GRACE};
use crate::tables::jobs::{Live, ProcessTable, Slot, StdinSink};
use crate::tables::once;
pub use crate::tables::output;
use bytes::BytesMut;
use executor_protocol::limits::{MAX_IDEMPOTENCY_KEY_BYTES, MAX_OUTPUT_BUFFER_BYTES};
use executor_protocol::methods as m;
use executor_protocol::types::process::*;
use executor_protocol::types::Empty;
use executor_protocol::{ErrorCode, WireError};
use nix::sys::signal::Signal;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::io::AsyncReadExt;

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
    /// What `env` is applied on top of ([`crate::login_env`]).
    pub env_base: executor_protocol::types::process::EnvBase,
    /// The request's resource limits ([`crate::limits`]).
    pub limits: Option<&'a executor_protocol::types::process::JobLimits>,
}

/// A started job, and what of its sandbox intent was not enforced (only
/// with `required: false`).
#[allow(missing_debug_implementations)] // `Proc` holds descriptors and tasks
pub struct Started {
    pub proc: Arc<Proc>,
    pub sandbox_degraded: Option<Vec<String>>,
    /// With egress by name: where the job's proxy listens.
    pub egress: Option<executor_protocol::types::network::EgressInfo>,
    /// What of the job's limits is not enforced as asked.
    pub limits_degraded: Option<Vec<String>>,
}

/// Start a job and its tasks; register it in the session. The request is
/// checked (argv, cwd, limits, a `max_processes` slot) before its sandbox
/// is planned, so a refused start leaves nothing on the host.
pub async fn start(s: &Arc<Session>, o: StartOptions<'_>) -> Result<Started, WireError> {
    let cap = check_options(s, &o)?;
    let resolved = crate::limits::resolve(
        o.limits,
        &s.limits().job,
        &s.profile().configured_job_limits,
        s.profile().name.as_deref(),
        "limits",
    )?;
    let table = s.processes();
    let slot = table.reserve_slot(s.limits().max_processes)?;
    // A login shell runs the user's dotfiles (and a sandboxed job may have
    // written them): for a job that is to be confined, inside its sandbox.
    let confined = s.profile().sandbox.is_some() || o.intent.is_some();
    let cwd = PathBuf::from(std::ffi::OsStr::from_bytes(o.cwd.as_bytes()));
    // Decided first: a sandbox that cannot be had is the answer, before
    // any login shell runs.
    let mut decision = crate::sandbox_gate::gate(
        s.capabilities(),
        o.intent,
        Some(&cwd),
        o.intent_param,
        s.profile(),
    )?;
    let in_sandbox = |sh| login_shell_confined(s, o.intent, o.intent_param, &cwd, sh);
    let mut env = crate::login_env::compose(
        o.env_base,
        o.env,
        &cwd,
        s.login_env(),
        confined,
        Some(in_sandbox),
    )
    .await?;
    let egress_rules = decision.take_egress();
    let (mut confinement, files, sandbox_degraded) = decision.into_parts();
    if let Some(plan) = confinement.plan_mut().filter(|p| p.tmp.is_some()) {
        plan.tmp_bytes = resolved.tmp_bytes;
    }
    // The job's cgroup (or its rlimits) before anything runs: a limit that
    // cannot be enforced refuses the start here.
    let limits = crate::limits::prepare(&resolved, confinement.plan().is_some(), "limits")?;
    // The audit line says what is enforced: a plan, or nothing.
    crate::audit::note_sandboxed(confinement.plan().is_some());
    if let Some(d) = &sandbox_degraded {
        crate::audit::note_degraded(d);
    }
    // Egress by name: the job's environment names its proxy (§8).
    let egress_port = match confinement.plan().map(|p| &p.net) {
        Some(executor_sandbox::plan::WireNet::Egress { port }) => Some(*port),
        _ => None,
    };
    if let Some(port) = egress_port {
        env = crate::egress::job_env(&env, port);
    }
    // From here the start runs in a task of its own: once the spawner is
    // asked to fork, a `$/cancel` (or the connection's end) that drops
    // this request must not leave the job running outside the table
    // (unlisted, unsignalable, its `max_processes` slot given back, its
    // audit line without a pid). A dropped request only loses its answer.
    let job = Unborn {
        argv: o.argv.to_vec(),
        cwd,
        env,
        arg0: o.arg0.map(str::to_owned),
        tty: o.tty,
        pty_size: o.pty_size,
        stdin_null: o.stdin_null,
        confinement,
        egress_rules,
        files,
        tag: o.tag,
        notify: o.notify,
        cap,
        slot,
        cgroup: limits.cgroup,
        rlimits: limits.rlimits,
    };
    let notes = crate::audit::Notes::current();
    let session = s.clone();
    let registered = tokio::spawn(async move {
        let run = register(&session, job);
        match notes {
            Some(n) => n.scope(true, run).await,
            None => run.await,
        }
    });
    let proc = registered.await.map_err(|e| {
        WireError::new(
            ErrorCode::Internal,
            format!("internal error (a bug) while starting the job: {e}"),
        )
    })??;
    Ok(Started {
        proc,
        sandbox_degraded,
        egress: egress_port.map(|port| executor_protocol::types::network::EgressInfo {
            proxy: crate::egress::proxy_url(port),
        }),
        limits_degraded: limits.degraded,
    })
}

/// Run the login shell (`env_base: "login"` of a job that is to be
/// confined) as the job runs: inside its own sandbox (its intent under the
/// profile, planned for its cwd, in which the shell runs too), or, where
/// the intent allows running without one (`required: false` on a host
/// that cannot enforce it), as degraded as the job.
async fn login_shell_confined(
    s: &Session,
    intent: Option<&executor_protocol::types::sandbox::SandboxIntent>,
    intent_param: &str,
    cwd: &std::path::Path,
    sh: crate::login_env::LoginShell,
) -> crate::login_env::ShellRun {
    use crate::login_env::{check_output, timed_out, LOGIN_SHELL_MAX_OUTPUT, LOGIN_SHELL_TIMEOUT};
    use crate::sandbox_gate::Decision;
    use tokio::io::AsyncReadExt;
    let decision = crate::sandbox_gate::gate(
        s.capabilities(),
        intent,
        Some(cwd),
        intent_param,
        s.profile(),
    )
    .map_err(|e| crate::login_env::ShellError {
        code: e.code,
        message: format!("the login shell's sandbox: {}", e.message),
    })?;
    if let Decision::Unconfined = &decision {
        return Err("internal: a confined job without a sandbox decision".into());
    }
    let (confinement, files, _) = decision.into_parts();
    let req = spawn::SpawnRequest {
        argv: &sh.argv,
        cwd,
        env: &sh.env,
        arg0: Some(&sh.arg0),
        tty: None,
        stdin_null: true,
        confinement: &confinement,
        // No cgroup of its own: the login shell is bounded by its timeout,
        // its sandbox's PID namespace (it all ends with the init) and the
        // default processes limit, counted in its user namespace.
        cgroup: None,
        rlimits: executor_sandbox::spec::Rlimits {
            address_space: None,
            processes: Some(executor_protocol::limits::JOB_PROCESSES),
            open_files: None,
        },
    };
    let result = async {
        // The job's own refusal (its sandbox cannot be set up here, its
        // cwd is not granted) is what the request gets, with its code.
        let mut spawned = spawn::spawn(&req)
            .await
            .map_err(|e| crate::login_env::ShellError {
                code: e.code,
                message: format!(
                    "cannot run the login shell {} in the job's sandbox: {}",
                    sh.shell, e.message
                ),
            })?;
        let (mut stdout, stderr) = (spawned.stdout.take(), spawned.stderr.take());
        let mut out = Vec::new();
        let read = async {
            // stderr is drained and discarded, so the shell never blocks on it.
            let drain = async {
                if let Some(mut e) = stderr {
                    let _ = tokio::io::copy(&mut e, &mut tokio::io::sink()).await;
                }
            };
            let take = async {
                if let Some(o) = stdout.as_mut() {
                    let mut limited = o.take(LOGIN_SHELL_MAX_OUTPUT as u64 + 1);
                    let _ = limited.read_to_end(&mut out).await;
                }
            };
            tokio::join!(drain, take);
        };
        if tokio::time::timeout(LOGIN_SHELL_TIMEOUT, read)
            .await
            .is_err()
        {
            spawned.supervisor.kill().await;
            return Err(timed_out(&sh.shell).into());
        }
        let (exit, _) = job_exit(&mut spawned).await;
        check_output(&sh.shell, &out)?;
        if exit.code != Some(0) {
            return Err(format!(
                "the login shell {} exited with {} in the job's sandbox",
                sh.shell,
                match (exit.code, exit.signal) {
                    (Some(c), _) => format!("status {c}"),
                    (_, Some(sig)) => format!("signal {sig}"),
                    _ => "no status".into(),
                }
            )
            .into());
        }
        Ok(out)
    }
    .await;
    let files_left = tokio::task::spawn_blocking(move || files.remove()).await;
    if let Ok(Err(e)) = files_left {
        tracing::warn!(error = %e, "cannot remove the login shell's sandbox directory");
    }
    result
}

/// Refuse a start whose argv, cwd, buffer size or terminal size is bad
/// (before anything is reserved); the output buffer's size otherwise.
fn check_options(s: &Session, o: &StartOptions<'_>) -> Result<u64, WireError> {
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
    let cap = o
        .output_buffer_bytes
        .unwrap_or(s.limits().output_buffer_bytes);
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
    Ok(cap)
}

type PtyReader = tokio::net::unix::pipe::Receiver;
/// A job's stdin sink, its PTY master (kept for resize) and the master's
/// reader.
type JobIo = (Option<StdinSink>, Option<OwnedFd>, Option<PtyReader>);

/// The job's stdin sink, and for a terminal job the PTY master as three
/// fds: a writer (the stdin sink), the master kept for resize, a reader.
/// (tokio's pipe types drive any non-blocking fd safely; a PTY master
/// reads and writes like a pipe, and EIO means the job side closed.)
/// A job planned and checked, not yet started: what [`register`] needs,
/// owned (it runs in a task of its own).
struct Unborn {
    argv: Vec<String>,
    cwd: PathBuf,
    env: std::collections::BTreeMap<String, String>,
    arg0: Option<String>,
    tty: bool,
    pty_size: Option<PtySize>,
    stdin_null: bool,
    confinement: executor_sandbox::spec::Confinement,
    egress_rules: Option<crate::egress::Rules>,
    files: executor_sandbox::plan::JobFiles,
    tag: Option<String>,
    notify: bool,
    cap: u64,
    slot: Slot,
    cgroup: Option<crate::limits::CgroupPlan>,
    rlimits: executor_sandbox::spec::Rlimits,
}

/// Start `job` and register it in the session's table (with its tasks):
/// run to the end once begun, whatever becomes of the request.
async fn register(s: &Arc<Session>, job: Unborn) -> Result<Arc<Proc>, WireError> {
    let req = spawn::SpawnRequest {
        argv: &job.argv,
        cwd: &job.cwd,
        env: &job.env,
        arg0: job.arg0.as_deref(),
        tty: job.tty.then(|| job.pty_size.unwrap_or_default()),
        stdin_null: job.stdin_null,
        confinement: &job.confinement,
        cgroup: job.cgroup,
        rlimits: job.rlimits,
    };
    // On an error the job's files are dropped here, and removed (and its
    // cgroup: killed and removed).
    let mut spawned = spawn::spawn(&req).await?;
    let cgroup = spawned.cgroup.take();
    let table = s.processes();
    let id = table.next_id();
    let egress = match (job.egress_rules, spawned.egress_listener.take()) {
        (Some(rules), Some(listener)) => egress::serve(s, &id, rules, listener),
        _ => None,
    };
    let (stdin, pty, pty_reader) = split_terminal(&mut spawned)?;
    let streams = if pty.is_some() { 1 } else { 2 };
    let proc = Arc::new(Proc {
        id,
        pid: spawned.pid,
        argv: job.argv.clone(),
        tag: job.tag,
        tty: job.tty,
        sandboxed: job.confinement.plan().is_some(),
        notify: job.notify,
        live: Live::new(job.cap as usize, streams, stdin, pty),
        cgroup: cgroup.clone(),
    });
    table.insert(proc.clone());
    crate::audit::note_spawned(spawned.pid, &proc.id);
    tracing::info!(
        session_id = s.id().unwrap_or_default(),
        process_id = %proc.id,
        pid = spawned.pid,
        argv = ?job.argv,
        cwd = %job.cwd.display(),
        tty = job.tty,
        "process started"
    );
    start_pumps(s, &proc, &mut spawned, pty_reader);
    tokio::spawn(wait_job(
        proc.clone(),
        spawned,
        s.outbound().clone(),
        Arc::downgrade(s.processes()),
        job.slot,
        JobHeld {
            files: job.files,
            egress,
            cgroup,
        },
    ));
    Ok(proc)
}

fn split_terminal(spawned: &mut spawn::Spawned) -> Result<JobIo, WireError> {
    let Some(master) = spawned.pty_master.take() else {
        return Ok((spawned.stdin.take().map(StdinSink::Pipe), None, None));
    };
    drop(spawned.stdin.take()); // the terminal is the job's stdin
    let io = |e: std::io::Error| WireError::new(ErrorCode::Io, format!("pseudo-terminal: {e}"));
    let r = master.try_clone().map_err(io)?;
    let w = master.try_clone().map_err(io)?;
    let reader = PtyReader::from_owned_fd_unchecked(r).map_err(io)?;
    let writer = tokio::net::unix::pipe::Sender::from_owned_fd_unchecked(w).map_err(io)?;
    Ok((Some(StdinSink::Pty(writer)), Some(master), Some(reader)))
}

/// One task per output stream, draining it into the job's buffer.
fn start_pumps(
    s: &Session,
    proc: &Arc<Proc>,
    spawned: &mut spawn::Spawned,
    pty_reader: Option<PtyReader>,
) {
    let chunk = s.limits().max_output_chunk_bytes.clamp(1024, 1 << 20) as usize;
    let outbound = s.outbound();
    let pump = |stream, r| pump(proc.clone(), stream, r, outbound.clone(), chunk);
    if let Some(r) = pty_reader {
        tokio::spawn(pump(OutputStream::Pty, r));
        return;
    }
    let pipes = [
        (OutputStream::Stdout, spawned.stdout.take()),
        (OutputStream::Stderr, spawned.stderr.take()),
    ];
    for (stream, r) in pipes {
        match r {
            Some(r) => {
                tokio::spawn(pump(stream, r));
            }
            None => proc.stream_closed(),
        }
    }
}

/// A read's bytes as a chunk to retain: a read that filled less than
/// half of its buffer is copied into one of its own size, so a retained
/// chunk never holds more than twice its bytes (the output buffer's bound
/// counts bytes: a job printing a line at a time must not pin a whole
/// read buffer per line).
fn seal(buf: BytesMut) -> bytes::Bytes {
    if buf.len() * 2 < buf.capacity() {
        bytes::Bytes::copy_from_slice(&buf)
    } else {
        buf.freeze()
    }
}

/// Drain one output stream. The read buffer is taken only once the
/// stream is readable, so an idle job holds no buffer.
async fn pump(
    proc: Arc<Proc>,
    stream: OutputStream,
    r: PtyReader,
    outbound: Outbound,
    chunk: usize,
) {
    loop {
        if let Err(e) = r.readable().await {
            tracing::debug!(process_id = %proc.id, error = %e, "output ended");
            break;
        }
        let mut buf = BytesMut::with_capacity(chunk);
        match r.try_read_buf(&mut buf) {
            Ok(0) => break,
            Ok(_) => proc.append(stream, seal(buf), &outbound).await,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            Err(e) => {
                // EIO from a PTY master: the job side is closed.
                tracing::debug!(process_id = %proc.id, error = %e, "output ended");
                break;
            }
        }
    }
    proc.stream_closed();
}

/// How the job ended: as its supervisor reported it, or (when the
/// supervisor died without reporting, killed from outside) the
/// supervisor's own status; and whether it reported. A supervisor that
/// reported is not waited for (its spawner reaps it); it reports once it
/// has killed and reaped every descendant of the job (the job's PID
/// namespace, or all re-parented to it as their subreaper).
async fn job_exit(spawned: &mut spawn::Spawned) -> (Exit, bool) {
    use executor_sandbox::trampoline::{decode_wait_status, Status};
    let mut msg = [0u8; Status::LEN];
    let reported = match spawned.status.read_exact(&mut msg).await {
        Ok(_) => match Status::decode(msg) {
            Some(Status::Exited { raw }) => Some(raw),
            _ => None,
        },
        _ => None,
    };
    match reported {
        Some(raw) => {
            let (code, signal) = decode_wait_status(raw);
            let exit = Exit {
                code,
                signal,
                usage: None,
                limit_hit: None,
            };
            (exit, true)
        }
        None => {
            use std::os::unix::process::ExitStatusExt;
            let st = spawned.supervisor.wait().await.ok();
            let exit = Exit {
                code: st.and_then(|s| s.code()),
                signal: st.and_then(|s| s.signal()),
                usage: None,
                limit_hit: None,
            };
            (exit, false)
        }
    }
}

/// What a job owns on the agent's side until it ends: its files on the
/// host, and its egress proxy.
struct JobHeld {
    files: executor_sandbox::plan::JobFiles,
    egress: Option<crate::egress::Server>,
    cgroup: Option<Arc<executor_sandbox::cgroup::JobCgroup>>,
}

/// Set when what a job left on the host could not all be removed (each
/// failure is logged with its path and errno): the next job's end sweeps
/// the jobs' directory again, as every agent start does.
static LEFTOVERS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Remove a finished job's directory and placeholders; then, if an earlier
/// removal left something, sweep again (blocking: on a blocking thread).
fn remove_job_files(process_id: &str, files: executor_sandbox::plan::JobFiles) {
    use std::sync::atomic::Ordering;
    let retry = LEFTOVERS.swap(false, Ordering::SeqCst);
    if let Err(e) = files.remove() {
        LEFTOVERS.store(true, Ordering::SeqCst);
        tracing::warn!(process_id, error = %e, "cannot remove the job's directory or placeholders; the next sweep tries again");
    }
    if retry {
        match executor_sandbox::plan::sweep() {
            Ok(gone) if !gone.is_empty() => {
                tracing::info!(removed = ?gone, "removed what earlier jobs left")
            }
            Ok(_) => {}
            Err(e) => {
                LEFTOVERS.store(true, Ordering::SeqCst);
                tracing::warn!(error = %e, "cannot remove what earlier jobs left; the next sweep tries again");
            }
        }
    }
}

async fn wait_job(
    proc: Arc<Proc>,
    mut spawned: spawn::Spawned,
    outbound: Outbound,
    table: Weak<ProcessTable>,
    slot: Slot,
    held: JobHeld,
) {
    let JobHeld {
        files,
        egress,
        cgroup,
    } = held;
    let (mut exit, reported) = job_exit(&mut spawned).await;
    // The job ends whole. A supervisor that reported left nothing of the
    // job: its account is read here, a few small reads (a hop to a
    // blocking thread cost more, on a busy host, than the reads). One
    // that died without reporting (killed from outside) may have left
    // some: SIGKILL to whatever is in the job's cgroup first, on a
    // blocking thread. Either way, killing what is left, waiting for it
    // to be gone and removing the cgroup happen after the exit is
    // reported (they cost milliseconds on v1).
    if let Some(cg) = cgroup {
        let account = if reported {
            Some(crate::limits::account(&cg, false))
        } else {
            let account = cg.clone();
            tokio::task::spawn_blocking(move || crate::limits::account(&account, true))
                .await
                .ok()
        };
        if let Some((usage, hit)) = account {
            exit.usage = Some(usage);
            exit.limit_hit = hit;
        }
        let id = proc.id.clone();
        drop(tokio::task::spawn_blocking(move || {
            crate::limits::finish(&id, &cg)
        }));
    }
    // The job is gone: its proxy stops, and its namespace with it.
    drop(egress);
    drop(slot);
    // A finished job's record stays readable for a while; its descriptors
    // must not (a thousand finished jobs would hold a thousand fds).
    proc.release_io().await;
    if !files.is_empty() {
        let id = proc.id.clone();
        let _ = tokio::task::spawn_blocking(move || remove_job_files(&id, files)).await;
    }
    // All output first: `process/exited` follows the last `process/output`.
    let (final_seq, lag_note) = proc.record_exit(exit).await;
    tracing::info!(process_id = %proc.id, exit_code = exit.code, signal = exit.signal, "process exited");
    if !proc.notify {
        return;
    }
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
        usage: exit.usage,
        limit_hit: exit.limit_hit,
    };
    if outbound.notify(m::PROCESS_EXITED, &note).await.is_ok() {
        if let Some(table) = table.upgrade() {
            table.delivered(&proc);
        }
    }
}

// ---- handlers -------------------------------------------------------------

/// `process/start`. With an `idempotency_key`, the start happens once per
/// key in the session ([`crate::tables::once`]): a retry with the same key
/// and params answers the first start's result (the same job), one with
/// other params is refused.
pub async fn handle_start(
    s: &Arc<Session>,
    p: ProcessStartParams,
) -> Result<ProcessStartResult, WireError> {
    let Some(key) = p.idempotency_key.clone() else {
        return start_now(s, p).await;
    };
    once::check_key(&key, "idempotency_key", MAX_IDEMPOTENCY_KEY_BYTES)?;
    let params = start_digest(&p)?;
    let session = s.clone();
    let notes = crate::audit::Notes::current();
    let work = async move {
        let run = start_now(&session, p);
        match notes {
            Some(n) => n.scope(true, run).await,
            None => run.await,
        }
    };
    let mut replayed = false;
    let r = s
        .start_keys()
        .run(&key, params, "idempotency_key", || replayed = true, work)
        .await;
    if replayed {
        crate::audit::note_replayed(r.as_ref().ok().map(|r| (r.pid, r.process_id.as_str())));
    }
    r
}

/// The digest of a start's params, its key left out: a key reused with
/// anything else different is refused.
fn start_digest(p: &ProcessStartParams) -> Result<once::Digest, WireError> {
    let mut keyless = p.clone();
    keyless.idempotency_key = None;
    let bytes = rmp_serde::to_vec_named(&keyless).map_err(|e| {
        WireError::new(
            ErrorCode::Internal,
            format!("internal error (a bug): cannot encode the start's params: {e}"),
        )
    })?;
    Ok(once::digest(&[&bytes]))
}

/// Start the job `p` asks for.
async fn start_now(
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
            env_base: p.env_base,
            limits: p.limits.as_ref(),
        },
    )
    .await?;
    Ok(ProcessStartResult {
        process_id: started.proc.id.clone(),
        pid: started.proc.pid,
        sandbox_degraded: started.sandbox_degraded,
        egress: started.egress,
        limits_degraded: started.limits_degraded,
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
        let may_wait = tokio::time::Instant::now() < deadline;
        if let Some(r) = proc.read(p.after_seq, max_bytes, may_wait) {
            if r.exited.is_some() {
                s.processes().delivered(&proc);
            }
            return Ok(r);
        }
        proc.changed_until(&mut rx, deadline).await;
    }
}

/// `process/write`. With a `write_id`, the write happens once per id in
/// the process ([`crate::tables::once`]): once begun it runs to its end
/// in a task of its own, and a write with an id already seen answers as
/// that write did, writing nothing, whatever its data (as Codex's
/// exec-server does: the id alone names the write).
pub async fn handle_write(s: &Arc<Session>, p: ProcessWriteParams) -> Result<Empty, WireError> {
    let proc = s.processes().get(&p.process_id)?;
    let Some(id) = p.write_id else {
        proc.write_stdin(&p.data, p.close_stdin).await?;
        return Ok(Empty {});
    };
    once::check_key(&id, "write_id", MAX_IDEMPOTENCY_KEY_BYTES)?;
    // The id alone names the write: no params digest to compare.
    let params = once::digest(&[]);
    let job = proc.clone();
    let work = async move { job.write_stdin(&p.data, p.close_stdin).await };
    let mut replayed = false;
    let r = proc
        .live
        .write_ids
        .run(&id, params, "write_id", || replayed = true, work)
        .await;
    if replayed {
        crate::audit::note_replayed(None);
    }
    r.map(|()| Empty {})
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
    proc.resize(p.rows, p.cols)?;
    Ok(Empty {})
}

/// `process/list`
pub async fn handle_list(
    s: &Arc<Session>,
    _p: ProcessListParams,
) -> Result<ProcessListResult, WireError> {
    let procs = s.processes().all();
    // Each running job's account is a few cgroup files: read on a
    // blocking thread (a thousand jobs are some milliseconds of reads).
    let list = move || {
        procs
            .into_iter()
            .map(|p| ProcessInfo {
                process_id: p.id.clone(),
                pid: p.pid,
                argv: p.argv.clone(),
                tag: p.tag.clone(),
                running: p.running(),
                usage: p.usage(),
            })
            .collect()
    };
    let processes = tokio::task::spawn_blocking(list).await.map_err(|e| {
        WireError::new(
            ErrorCode::Internal,
            format!("internal error (a bug) while listing processes: {e}"),
        )
    })?;
    Ok(ProcessListResult { processes })
}

#[cfg(test)]
mod tests {
    use super::*;
    use executor_protocol::WirePath;
    use std::collections::BTreeMap;

    #[test]
    fn a_bad_start_is_refused_naming_its_field_before_anything_is_reserved() {
        let s = crate::session::test_session();
        let env = BTreeMap::new();
        let (argv, cwd) = (vec!["true".to_string()], WirePath::from("/"));
        let options = |argv, cwd| StartOptions {
            argv,
            cwd,
            env: &env,
            arg0: None,
            tty: false,
            pty_size: None,
            stdin_null: true,
            notify: false,
            output_buffer_bytes: None,
            tag: None,
            intent: None,
            intent_param: "sandbox",
            argv_param: "command",
            env_base: Default::default(),
            limits: None,
        };
        let field = |r: Result<u64, WireError>| {
            let e = r.unwrap_err();
            e.data_get("field")
                .or_else(|| e.data_get("limit"))
                .and_then(|v| v.as_str().map(str::to_string))
        };
        assert_eq!(
            field(check_options(&s, &options(&[], &cwd))),
            Some("command".into())
        );
        let relative = WirePath::from("tmp");
        assert_eq!(
            field(check_options(&s, &options(&argv, &relative))),
            Some("cwd".into())
        );
        let mut big = options(&argv, &cwd);
        big.output_buffer_bytes = Some(MAX_OUTPUT_BUFFER_BYTES + 1);
        assert_eq!(
            field(check_options(&s, &big)),
            Some("output_buffer_bytes".into())
        );
        let mut flat = options(&argv, &cwd);
        flat.pty_size = Some(PtySize { rows: 0, cols: 80 });
        assert_eq!(
            field(check_options(&s, &flat)),
            Some("pty_size.rows".into())
        );
        // The positive control: the default buffer size.
        let ok = check_options(&s, &options(&argv, &cwd)).unwrap();
        assert_eq!(ok, s.limits().output_buffer_bytes);
        assert!(s.processes().all().is_empty());
    }

    #[test]
    fn a_retained_chunk_holds_at_most_twice_its_bytes() {
        // What a chunk pins is its allocation, not its length: a short
        // read is copied out of the 64 KiB read buffer.
        let held = |b: bytes::Bytes| b.try_into_mut().expect("unique").capacity();
        for n in [1usize, 100, 32 * 1024 - 1] {
            let mut buf = BytesMut::with_capacity(64 * 1024);
            buf.extend_from_slice(&vec![7u8; n]);
            let chunk = seal(buf);
            assert_eq!(chunk.len(), n);
            assert!(held(chunk) <= 2 * n, "a {n}-byte chunk holds too much");
        }
        // A read that filled the buffer keeps it (no copy).
        let mut full = BytesMut::with_capacity(64 * 1024);
        full.extend_from_slice(&[1u8; 40 * 1024]);
        let ptr = full.as_ptr();
        let chunk = seal(full);
        assert_eq!(chunk.as_ptr(), ptr);
    }

    #[test]
    fn wire_signal_names_map_to_their_host_signals() {
        assert_eq!(to_signal(SignalName::Terminate), Signal::SIGTERM);
        assert_eq!(to_signal(SignalName::Interrupt), Signal::SIGINT);
        assert_eq!(signal_name(9), "SIGKILL");
        assert_eq!(
            Exit {
                code: None,
                signal: Some(15),
                usage: None,
                limit_hit: None,
            }
            .shell_code(),
            143
        );
    }
}
