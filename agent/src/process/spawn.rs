//! Starting a job: resolve the program, then have the spawner
//! ([`super::spawner`]) fork its supervisor, which runs the one trampoline
//! (`executor_sandbox::trampoline`) with pipes or a PTY.
//!
//! This is the only module of the agent that starts jobs; the agent never
//! forks for one.

use super::spawner::{self, Supervisor};
use executor_protocol::types::process::PtySize;
use executor_protocol::{ErrorCode, WireError};
use executor_sandbox::spec::{Confinement, JobSpec};
use executor_sandbox::trampoline::Status;
use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
use serde_bytes::ByteBuf;
use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio::process::ChildStdin;

/// What to start.
#[derive(Debug)]
pub struct SpawnRequest<'a> {
    pub argv: &'a [String],
    pub cwd: &'a Path,
    pub env: &'a BTreeMap<String, String>,
    pub arg0: Option<&'a str>,
    pub tty: Option<PtySize>,
    pub stdin_null: bool,
    /// The sandbox plan for the trampoline, or none (and whether the
    /// job's network is denied anyway: a degraded `allow_hosts` intent).
    pub confinement: &'a Confinement,
    /// The job's cgroup, made (or taken, made ahead) right before the
    /// spawner is asked: its supervisor is in it before anything of the
    /// job runs.
    pub cgroup: Option<crate::limits::CgroupPlan>,
    /// The rlimits fallback of the job's limits.
    pub rlimits: executor_sandbox::spec::Rlimits,
}

/// A started job.
#[derive(Debug)]
pub struct Spawned {
    /// The job's supervisor (forked by the spawner).
    pub supervisor: Supervisor,
    /// The program's own pid (also its process group and session id).
    pub pid: u32,
    /// Carries the job's exit status from the supervisor.
    pub status: pipe::Receiver,
    pub stdin: Option<ChildStdin>,
    /// The read ends of the job's stdout and stderr pipes, registered with
    /// the runtime once, here (the output pumps read them as they are).
    pub stdout: Option<pipe::Receiver>,
    pub stderr: Option<pipe::Receiver>,
    /// The PTY master, for tty jobs.
    pub pty_master: Option<OwnedFd>,
    /// With egress by name: the proxy's listening socket, made by the job's
    /// init inside the job's network namespace and handed over before the
    /// program started (the job never holds it).
    pub egress_listener: Option<OwnedFd>,
    /// The job's cgroup (ended, killed whole, when dropped).
    pub cgroup: Option<std::sync::Arc<executor_sandbox::cgroup::JobCgroup>>,
}

/// The read end every supervisor gets; the agent alone holds the write
/// end, so its death (however it dies) hangs the pipe up for all of them.
/// Both ends are close-on-exec: the read end travels to each supervisor
/// with its fork request.
struct Lifeline {
    read: OwnedFd,
    _write: OwnedFd,
}

static LIFELINE: OnceLock<Result<Lifeline, String>> = OnceLock::new();

fn lifeline() -> Result<&'static Lifeline, WireError> {
    LIFELINE
        .get_or_init(|| {
            let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| e.to_string())?;
            Ok(Lifeline {
                read,
                _write: write,
            })
        })
        .as_ref()
        .map_err(|e| {
            WireError::new(
                ErrorCode::Internal,
                format!("cannot create the lifeline pipe: {e}"),
            )
        })
}

fn errno_error(code: ErrorCode, path: &Path, errno: i32, what: &str) -> WireError {
    WireError::new(
        code,
        format!(
            "{what} {}: {}",
            path.display(),
            std::io::Error::from_raw_os_error(errno)
        ),
    )
    .with("path", path.to_string_lossy().as_ref())
    .with("errno", errno)
}

/// Map an errno of exec to the wire code.
fn exec_errno_code(errno: i32) -> ErrorCode {
    match errno {
        libc::ENOENT => ErrorCode::NotFound,
        libc::EACCES | libc::EPERM => ErrorCode::PermissionDenied,
        libc::ENOTDIR => ErrorCode::NotADirectory,
        _ => ErrorCode::Io,
    }
}

/// Find what `argv0` names: a path (relative to `cwd`) when it has a `/`,
/// else the first executable file of that name in the request's `PATH`.
pub fn resolve_program(
    argv0: &str,
    cwd: &Path,
    env: &BTreeMap<String, String>,
) -> Result<PathBuf, WireError> {
    if argv0.is_empty() {
        return Err(WireError::invalid_params("argv.0", "argv[0] is empty"));
    }
    if argv0.contains('/') {
        let p = if argv0.starts_with('/') {
            PathBuf::from(argv0)
        } else {
            cwd.join(argv0)
        };
        return match std::fs::metadata(&p) {
            Ok(_) => Ok(p),
            Err(e) => Err(errno_error(
                ErrorCode::NotFound,
                &p,
                e.raw_os_error().unwrap_or(libc::ENOENT),
                "program not found:",
            )),
        };
    }
    let Some(path_var) = env.get("PATH") else {
        return Err(WireError::new(
            ErrorCode::NotFound,
            format!(
                "program {argv0:?} has no '/' and the request's env has no PATH to look it up in"
            ),
        )
        .with("path", argv0)
        .with("errno", libc::ENOENT));
    };
    for dir in path_var.split(':') {
        let dir = if dir.is_empty() {
            cwd.to_path_buf()
        } else {
            cwd.join(dir)
        };
        let candidate = dir.join(argv0);
        if let Ok(meta) = std::fs::metadata(&candidate) {
            if meta.is_file() && meta.permissions().mode() & 0o111 != 0 {
                return Ok(candidate);
            }
        }
    }
    Err(WireError::new(
        ErrorCode::NotFound,
        format!("program {argv0:?} not found in the request's PATH ({path_var})"),
    )
    .with("path", argv0)
    .with("errno", libc::ENOENT))
}

/// Check that `cwd` is an existing directory.
pub fn check_cwd(cwd: &Path) -> Result<(), WireError> {
    match std::fs::metadata(cwd) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(errno_error(
            ErrorCode::NotADirectory,
            cwd,
            libc::ENOTDIR,
            "cwd is not a directory:",
        )),
        Err(e) => {
            let errno = e.raw_os_error().unwrap_or(libc::ENOENT);
            let code = if errno == libc::EACCES {
                ErrorCode::PermissionDenied
            } else {
                ErrorCode::NotFound
            };
            Err(errno_error(code, cwd, errno, "cwd not usable:"))
        }
    }
}

fn io_err(what: &str, e: impl std::fmt::Display) -> WireError {
    WireError::new(ErrorCode::Io, format!("{what}: {e}"))
}

/// The job's status channel: the agent reads, the supervisor writes
/// [`Status`] messages. Created and first read here alone.
fn status_channel() -> Result<(pipe::Receiver, OwnedFd), WireError> {
    let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| io_err("status pipe", e))?;
    let r = pipe::Receiver::from_owned_fd(r).map_err(|e| io_err("status pipe", e))?;
    Ok((r, w))
}

/// The supervisor's first message: how the start went (`None`: EOF or
/// bytes no supervisor sends).
async fn first_status(status: &mut pipe::Receiver) -> std::io::Result<Option<Status>> {
    let mut msg = [0u8; Status::LEN];
    status.read_exact(&mut msg).await?;
    Ok(Status::decode(msg))
}

/// The job's ends of its stdio (given to the supervisor) and the agent's.
struct Stdio {
    job: [OwnedFd; 3],
    stdin: Option<ChildStdin>,
    stdout: Option<pipe::Receiver>,
    stderr: Option<pipe::Receiver>,
    pty_master: Option<OwnedFd>,
}

fn stdio(req: &SpawnRequest<'_>) -> Result<Stdio, WireError> {
    if let Some(size) = req.tty {
        let ws = nix::pty::Winsize {
            ws_row: size.rows,
            ws_col: size.cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty =
            nix::pty::openpty(&ws, None).map_err(|e| io_err("opening a pseudo-terminal", e))?;
        for fd in [&pty.master, &pty.slave] {
            fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)).map_err(|e| io_err("pty", e))?;
        }
        let flags = fcntl(&pty.master, FcntlArg::F_GETFL).map_err(|e| io_err("pty", e))?;
        fcntl(
            &pty.master,
            FcntlArg::F_SETFL(OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK),
        )
        .map_err(|e| io_err("pty", e))?;
        let clone = |f: &OwnedFd| f.try_clone().map_err(|e| io_err("pty", e));
        return Ok(Stdio {
            job: [clone(&pty.slave)?, clone(&pty.slave)?, pty.slave],
            stdin: None,
            stdout: None,
            stderr: None,
            pty_master: Some(pty.master),
        });
    }
    let pipe = || nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| io_err("job pipe", e));
    let tokio_io = |e| io_err("job pipe", e);
    let (stdin_job, stdin) = if req.stdin_null {
        let null = std::fs::File::open("/dev/null").map_err(|e| io_err("/dev/null", e))?;
        (OwnedFd::from(null), None)
    } else {
        let (r, w) = pipe()?;
        let w = ChildStdin::from_std(std::process::ChildStdin::from(w)).map_err(tokio_io)?;
        (r, Some(w))
    };
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    Ok(Stdio {
        job: [stdin_job, out_w, err_w],
        stdin,
        stdout: Some(receiver(out_r)?),
        stderr: Some(receiver(err_r)?),
        pty_master: None,
    })
}

/// The agent's read end of a job's pipe, non-blocking and registered with
/// the runtime once (the output pumps read it as it is).
fn receiver(r: OwnedFd) -> Result<pipe::Receiver, WireError> {
    let err = |e| io_err("job pipe", e);
    let flags = fcntl(&r, FcntlArg::F_GETFL).map_err(err)?;
    fcntl(
        &r,
        FcntlArg::F_SETFL(OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK),
    )
    .map_err(err)?;
    // The pipe was made here and is non-blocking now: what `_unchecked`
    // asks of its caller.
    pipe::Receiver::from_owned_fd_unchecked(r).map_err(|e| io_err("job pipe", e))
}

/// Wait (boundedly) until the spawner has reaped a supervisor that is
/// ending on its own.
async fn reap(supervisor: &mut Supervisor) -> Option<std::process::ExitStatus> {
    tokio::time::timeout(Duration::from_secs(5), supervisor.wait())
        .await
        .ok()
        .and_then(Result::ok)
}

/// Bounds the start: the spawner's answer and the supervisor's first
/// message (a stopped spawner or supervisor must not hang the request).
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Start the job through the spawner and wait until the program runs (or
/// exec failed, in which case nothing ran and the error says why).
pub async fn spawn(req: &SpawnRequest<'_>) -> Result<Spawned, WireError> {
    check_cwd(req.cwd)?;
    let program = resolve_program(&req.argv[0], req.cwd, req.env)?;
    let lifeline = lifeline()?;
    // Bounded too: a spawner that stopped answering holds every turn until
    // a timed-out start replaces it.
    let turn = tokio::time::timeout(START_TIMEOUT, spawner::turn())
        .await
        .map_err(|_| {
            WireError::new(
                ErrorCode::Internal,
                format!(
                    "no job could be started within {}s (the spawner is not answering); nothing was run",
                    START_TIMEOUT.as_secs()
                ),
            )
        })?;
    let (mut status, status_w) = status_channel()?;

    // What to run travels in a sealed memfd; the supervisor gets
    // descriptors only (nothing of the request may run code in it, or be
    // read in its /proc/PID/cmdline or environ).
    let spec_fd = job_spec(req, &program)
        .to_memfd()
        .map_err(|e| io_err("writing the job spec", e))?;
    // Egress by name: a socket pair on which the job's init sends the
    // proxy's listener; the supervisor gets one end with the others.
    let egress = match req.confinement.plan().map(|p| &p.net) {
        Some(executor_sandbox::plan::WireNet::Egress { .. }) => Some(
            std::os::unix::net::UnixStream::pair().map_err(|e| io_err("egress socket pair", e))?,
        ),
        _ => None,
    };
    let Stdio {
        job: job_stdio,
        stdin,
        stdout,
        mut stderr,
        pty_master,
    } = stdio(req)?;

    // Kept outside the timed part: a start that times out still owns the
    // supervisor it asked for, and makes sure it never runs the job.
    let mut asked: Option<Supervisor> = None;
    let mut cgroup = None;
    let started = tokio::time::timeout(START_TIMEOUT, async {
        let [i, o, e] = &job_stdio;
        let mut fds = vec![
            i.as_fd(),
            o.as_fd(),
            e.as_fd(),
            lifeline.read.as_fd(),
            status_w.as_fd(),
            spec_fd.as_fd(),
        ];
        fds.extend(egress.as_ref().map(|(_, theirs)| theirs.as_fd()));
        let procs = match &req.cgroup {
            Some(plan) => {
                let (job, procs) = crate::limits::job_cgroup(plan)?;
                cgroup = Some(job);
                procs
            }
            None => Vec::new(),
        };
        fds.extend(procs.iter().map(|f| f.as_fd()));
        let netns = req
            .confinement
            .plan()
            .is_some_and(|p| p.net.own_namespace());
        let supervisor = spawner::fork(&fds, procs.len(), netns, turn).await;
        // Our copies of the job's ends must go, or EOF would never come.
        drop(fds);
        drop((job_stdio, status_w, spec_fd, procs));
        let supervisor = asked.insert(supervisor?);
        let first = first_status(&mut status).await;
        // No status: the spawner may have failed to fork (then it says
        // why), or the supervisor failed.
        if !matches!(first, Ok(Some(_))) {
            if let Some(e) = supervisor.fork_error().await {
                return Err(e);
            }
        }
        Ok::<_, WireError>(first)
    })
    .await;
    let egress = egress.map(|(ours, _theirs)| ours);
    let (mut supervisor, first) = match (started, asked) {
        (Ok(r), Some(s)) => (s, r?),
        // Only a failed fork leaves no supervisor.
        (Ok(r), None) => {
            return Err(r
                .err()
                .unwrap_or_else(|| WireError::new(ErrorCode::Internal, "no supervisor")))
        }
        (Err(_), asked) => {
            if let Some(mut s) = asked {
                s.abandon().await;
            }
            return Err(WireError::new(
                ErrorCode::Internal,
                format!(
                    "the job supervisor did not report within {}s; nothing was run",
                    START_TIMEOUT.as_secs()
                ),
            ));
        }
    };
    let pid = match first {
        Ok(Some(Status::Started { pid })) => {
            // The next job's cgroup, once this one's program runs: the
            // standby's joins (each a cgroup migration, which holds back
            // every fork on the host for an RCU grace period) then do not
            // stall this job's own clone and fork.
            if req.cgroup.is_some() {
                crate::limits::refill(spawner::offer_ready);
            }
            pid
        }
        first => {
            return Err(start_failed(first, &mut supervisor, stderr.as_mut(), req, &program).await)
        }
    };
    let mut spawned = Spawned {
        pid,
        status,
        stdin,
        stdout,
        stderr,
        supervisor,
        pty_master,
        egress_listener: None,
        cgroup,
    };
    if let Some(sock) = egress {
        spawned.egress_listener = Some(receive_egress_listener(&mut spawned, &sock).await?);
    }
    Ok(spawned)
}

/// The listener the job's init sent before it forked the program. When it
/// did not arrive, the program (its pid leads its group) is killed, the
/// init with it, and the supervisor reaped.
async fn receive_egress_listener(
    spawned: &mut Spawned,
    sock: &std::os::unix::net::UnixStream,
) -> Result<OwnedFd, WireError> {
    let mut byte = [0u8; 1];
    let got = executor_sys::recv_fds::<1>(
        sock.as_fd(),
        &mut byte,
        nix::sys::socket::MsgFlags::MSG_DONTWAIT,
    )
    .and_then(|m| {
        m.fds
            .into_iter()
            .next()
            .ok_or_else(|| std::io::Error::other("the message carried no descriptor"))
    });
    match got {
        Ok(fd) => Ok(fd),
        Err(e) => {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(spawned.pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = reap(&mut spawned.supervisor).await;
            Err(WireError::new(
                ErrorCode::Internal,
                format!("the job's init did not hand over the egress listener: {e}"),
            ))
        }
    }
}

/// What the trampoline runs: the resolved program, argv (with `arg0`),
/// the environment, cwd, terminal and sandbox plan.
fn job_spec(req: &SpawnRequest<'_>, program: &Path) -> JobSpec {
    let b = |s: &[u8]| ByteBuf::from(s.to_vec());
    JobSpec {
        exec: b(program.as_os_str().as_bytes()),
        argv: std::iter::once(req.arg0.unwrap_or(&req.argv[0]))
            .chain(req.argv[1..].iter().map(String::as_str))
            .map(|a| b(a.as_bytes()))
            .collect(),
        env: req
            .env
            .iter()
            .map(|(k, v)| b(format!("{k}={v}").as_bytes()))
            .collect(),
        cwd: b(req.cwd.as_os_str().as_bytes()),
        tty: req.tty.is_some(),
        confinement: req.confinement.clone(),
        rlimits: executor_sandbox::spec::Rlimits {
            open_files: crate::limits::jobs_open_files(),
            ..req.rlimits
        },
    }
}

/// The error of a start whose supervisor's first message was not
/// `Started`: the sandbox or the exec failed (nothing ran: the error says
/// why), or the supervisor itself failed (it is killed). The supervisor is
/// reaped in every case.
async fn start_failed(
    first: std::io::Result<Option<Status>>,
    supervisor: &mut Supervisor,
    stderr: Option<&mut pipe::Receiver>,
    req: &SpawnRequest<'_>,
    program: &Path,
) -> WireError {
    match first {
        Ok(Some(Status::SandboxFailed { step, errno }))
            if step == executor_sandbox::linux::Step::Cwd as u8 =>
        {
            reap(supervisor).await;
            WireError::new(
                ErrorCode::SandboxUnavailable,
                format!(
                    "the sandbox could not be set up (entering the working directory {}: {}): \
                     the job's root does not hold it; grant it (a read or write root at it or \
                     above it) or run from a granted directory; nothing was run",
                    req.cwd.display(),
                    std::io::Error::from_raw_os_error(errno)
                ),
            )
            .with("errno", errno)
            .with("path", req.cwd.to_string_lossy().as_ref())
        }
        Ok(Some(Status::SandboxFailed { step, errno })) => {
            reap(supervisor).await;
            WireError::new(
                ErrorCode::SandboxUnavailable,
                format!(
                    "the sandbox could not be set up ({}: {}); nothing was run",
                    executor_sandbox::linux::Step::name(step),
                    std::io::Error::from_raw_os_error(errno)
                ),
            )
            .with("errno", errno)
        }
        Ok(Some(Status::ExecFailed { errno })) => {
            reap(supervisor).await;
            // The job enters its cwd just before exec: it may have gone.
            if let Err(e) = check_cwd(req.cwd) {
                return e;
            }
            errno_error(exec_errno_code(errno), program, errno, "cannot execute")
        }
        other => {
            supervisor.kill().await;
            let st = reap(supervisor).await;
            let mut text = String::new();
            if let Some(e) = stderr {
                let _ =
                    tokio::time::timeout(Duration::from_secs(1), e.read_to_string(&mut text)).await;
            }
            WireError::new(
                ErrorCode::Internal,
                format!(
                    "the job supervisor (executor sandbox-exec) failed before starting the program ({}; status {st:?}): {}",
                    match other {
                        Ok(_) => "bad status message".to_string(),
                        Err(e) => e.to_string(),
                    },
                    text.trim()
                ),
            )
        }
    }
}
