//! Starting a job: resolve the program, then spawn it through the one
//! trampoline (`executor sandbox-exec`), with pipes or a PTY.
//!
//! This is the only module of the agent that spawns processes.

use executor_protocol::types::process::PtySize;
use executor_protocol::{ErrorCode, WireError};
use executor_sandbox::plan::WirePlan;
use executor_sandbox::spec::JobSpec;
use executor_sandbox::trampoline::Status;
use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
use serde_bytes::ByteBuf;
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout};

/// What to start.
#[derive(Debug)]
pub struct SpawnRequest<'a> {
    pub argv: &'a [String],
    pub cwd: &'a Path,
    pub env: &'a BTreeMap<String, String>,
    pub arg0: Option<&'a str>,
    pub tty: Option<PtySize>,
    pub stdin_null: bool,
    /// The sandbox plan for the trampoline (`None`: unconfined).
    pub sandbox: Option<&'a WirePlan>,
    /// Without a plan: deny the job's network anyway (a degraded
    /// `allow_hosts` intent).
    pub deny_network: bool,
}

/// A started job.
#[derive(Debug)]
pub struct Spawned {
    /// The trampoline (the job's supervisor).
    pub supervisor: Child,
    /// The program's own pid (also its process group and session id).
    pub pid: u32,
    /// Carries the job's exit status from the supervisor.
    pub status: pipe::Receiver,
    pub stdin: Option<ChildStdin>,
    pub stdout: Option<ChildStdout>,
    pub stderr: Option<ChildStderr>,
    /// The PTY master, for tty jobs.
    pub pty_master: Option<OwnedFd>,
    /// With egress by name: the proxy's listening socket, made by the job's
    /// init inside the job's network namespace and handed over before the
    /// program started (the job never holds it).
    pub egress_listener: Option<OwnedFd>,
}

/// The read end every supervisor inherits; the agent alone holds the write
/// end, so its death (however it dies) hangs the pipe up for all of them.
struct Lifeline {
    read: OwnedFd,
    _write: OwnedFd,
}

static LIFELINE: OnceLock<Result<Lifeline, String>> = OnceLock::new();

fn lifeline() -> Result<&'static Lifeline, WireError> {
    LIFELINE
        .get_or_init(|| {
            let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| e.to_string())?;
            // Supervisors inherit the read end; the write end stays ours.
            fcntl(&read, FcntlArg::F_SETFD(FdFlag::empty())).map_err(|e| e.to_string())?;
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

/// Spawn through the trampoline and wait until the program runs (or exec
/// failed, in which case nothing ran and the error says why).
pub async fn spawn(req: &SpawnRequest<'_>) -> Result<Spawned, WireError> {
    check_cwd(req.cwd)?;
    let program = resolve_program(&req.argv[0], req.cwd, req.env)?;
    let lifeline = lifeline()?;
    let (status_r, status_w) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| io_err("status pipe", e))?;
    fcntl(&status_w, FcntlArg::F_SETFD(FdFlag::empty())).map_err(|e| io_err("status pipe", e))?;

    // What to run travels in a sealed memfd; the trampoline gets an empty
    // environment and descriptor numbers only (nothing of the request may
    // run code in it, or be read in its /proc/PID/cmdline).
    let spec_fd = job_spec(req, &program)
        .to_memfd()
        .map_err(|e| io_err("writing the job spec", e))?;
    fcntl(&spec_fd, FcntlArg::F_SETFD(FdFlag::empty())).map_err(|e| io_err("job spec", e))?;
    // argv[0] `executor`: `ps` shows `executor sandbox-exec …`, not the
    // path it was started by (the trampoline also renames its comm).
    let mut cmd = tokio::process::Command::new("/proc/self/exe");
    cmd.arg0("executor")
        .arg("sandbox-exec")
        .arg("--lifeline")
        .arg(lifeline.read.as_raw_fd().to_string())
        .arg("--status")
        .arg(status_w.as_raw_fd().to_string())
        .arg("--spec")
        .arg(spec_fd.as_raw_fd().to_string());
    // Egress by name: a socket pair on which the init sends the listener.
    let egress = match req.sandbox.map(|p| &p.net) {
        Some(executor_sandbox::plan::WireNet::Egress { .. }) => {
            let (ours, theirs) = std::os::unix::net::UnixStream::pair()
                .map_err(|e| io_err("egress socket pair", e))?;
            fcntl(&theirs, FcntlArg::F_SETFD(FdFlag::empty()))
                .map_err(|e| io_err("egress socket pair", e))?;
            cmd.arg("--egress").arg(theirs.as_raw_fd().to_string());
            Some((ours, theirs))
        }
        _ => None,
    };
    cmd.env_clear().current_dir(req.cwd).kill_on_drop(false);
    let pty_master = attach_stdio(&mut cmd, req)?;
    let supervisor = cmd.spawn().map_err(|e| io_err("starting the job", e))?;
    // Our copies of the job's ends must go, or EOF would never come.
    drop(status_w);
    drop(spec_fd);
    drop(cmd);
    let egress = egress.map(|(ours, _theirs)| ours);
    let status = pipe::Receiver::from_owned_fd(status_r).map_err(|e| io_err("status pipe", e))?;
    let mut spawned = await_start(supervisor, status, pty_master, &program).await?;
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
    use std::os::fd::AsFd;
    match executor_sandbox::sys::recv_fd(sock.as_fd()) {
        Ok(fd) => Ok(fd),
        Err(e) => {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(spawned.pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = spawned.supervisor.wait().await;
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
        sandbox: req.sandbox.cloned(),
        deny_network: req.deny_network,
    }
}

/// The job's stdin, stdout and stderr: a new pseudo-terminal's slave
/// (its non-blocking master returned), or pipes (stdin null if asked).
fn attach_stdio(
    cmd: &mut tokio::process::Command,
    req: &SpawnRequest<'_>,
) -> Result<Option<OwnedFd>, WireError> {
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
        let slave = std::fs::File::from(pty.slave);
        let clone = |f: &std::fs::File| f.try_clone().map_err(|e| io_err("pty", e));
        cmd.stdin(Stdio::from(clone(&slave)?))
            .stdout(Stdio::from(clone(&slave)?))
            .stderr(Stdio::from(slave));
        return Ok(Some(pty.master));
    }
    cmd.stdin(if req.stdin_null {
        Stdio::null()
    } else {
        Stdio::piped()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    Ok(None)
}

/// Wait for the supervisor's first status message: the program runs (its
/// pid), or the sandbox or the exec failed (nothing ran: the error says
/// why), or the supervisor itself failed.
async fn await_start(
    mut supervisor: Child,
    mut status: pipe::Receiver,
    pty_master: Option<OwnedFd>,
    program: &Path,
) -> Result<Spawned, WireError> {
    let mut msg = [0u8; Status::LEN];
    let first = tokio::time::timeout(Duration::from_secs(30), status.read_exact(&mut msg))
        .await
        .map(|r| r.map(|_| Status::decode(msg)));
    match first {
        Ok(Ok(Some(Status::Started { pid }))) => Ok(Spawned {
            pid,
            status,
            stdin: supervisor.stdin.take(),
            stdout: supervisor.stdout.take(),
            stderr: supervisor.stderr.take(),
            supervisor,
            pty_master,
            egress_listener: None,
        }),
        Ok(Ok(Some(Status::SandboxFailed { step, errno }))) => {
            let _ = supervisor.wait().await;
            Err(WireError::new(
                ErrorCode::SandboxUnavailable,
                format!(
                    "the sandbox could not be set up ({}: {}); nothing was run",
                    executor_sandbox::linux::Step::name(step),
                    std::io::Error::from_raw_os_error(errno)
                ),
            )
            .with("errno", errno))
        }
        Ok(Ok(Some(Status::ExecFailed { errno }))) => {
            let _ = supervisor.wait().await;
            Err(errno_error(
                exec_errno_code(errno),
                program,
                errno,
                "cannot execute",
            ))
        }
        other => {
            let _ = supervisor.start_kill();
            let st = supervisor.wait().await.ok();
            let mut stderr = String::new();
            if let Some(mut e) = supervisor.stderr.take() {
                let _ = tokio::time::timeout(Duration::from_secs(1), e.read_to_string(&mut stderr))
                    .await;
            }
            Err(WireError::new(
                ErrorCode::Internal,
                format!(
                    "the job supervisor (executor sandbox-exec) failed before starting the program ({}; status {st:?}): {}",
                    match other {
                        Ok(Ok(_)) => "bad status message".to_string(),
                        Ok(Err(e)) => e.to_string(),
                        Err(_) => "timed out".into(),
                    },
                    stderr.trim()
                ),
            ))
        }
    }
}
