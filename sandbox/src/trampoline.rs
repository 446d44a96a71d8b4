//! `executor sandbox-exec`: the one path every job takes from the agent to
//! its program.
//!
//! The agent (multithreaded, async) spawns this trampoline with a plain
//! `spawn` (no code between its fork and exec). The trampoline is
//! single-threaded, so it can prepare everything, fork the job and stay as
//! its **supervisor**:
//!
//! - it is a child subreaper, so descendants that double-fork or `setsid`
//!   are re-parented to it, not to init;
//! - it watches a *lifeline* pipe whose write end only the agent holds: when
//!   the agent dies (even by SIGKILL) the pipe hangs up and the supervisor
//!   kills the whole job. (`PR_SET_PDEATHSIG` is not used: it fires when the
//!   agent's *thread* that forked exits, and covers only the direct child.)
//! - when the job's main process exits, whatever it left behind is killed,
//!   its exit status is reported, and the supervisor exits.
//!
//! The status pipe carries 5-byte messages to the agent: `P` + pid (the job
//! runs), `E` + errno (exec failed, nothing ran), `X` + raw wait status.

use crate::sys;
use nix::sys::signal::{killpg, SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitid, waitpid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::{ForkResult, Pid};
use std::ffi::{CString, OsString};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// Status message tags.
pub const MSG_STARTED: u8 = b'P';
pub const MSG_EXEC_FAILED: u8 = b'E';
pub const MSG_EXITED: u8 = b'X';
/// The sandbox could not be set up; nothing ran. Value: step << 16 | errno.
pub const MSG_SANDBOX_FAILED: u8 = b'S';

/// What the agent asks of the trampoline (parsed from its command line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// Read end of the agent's lifeline pipe.
    pub lifeline: Option<RawFd>,
    /// Write end of this job's status pipe.
    pub status: Option<RawFd>,
    /// Make fd 0 (a PTY slave) the job's controlling terminal.
    pub tty: bool,
    /// The program to execute (already resolved by the agent).
    pub exec: PathBuf,
    /// The argv the program sees (`argv[0]` may be a custom `arg0`).
    pub argv: Vec<OsString>,
    /// The sandbox policy (empty: none).
    pub policy: String,
}

/// Errors of the trampoline's setup, each naming its step.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("sandbox-exec usage: {0}")]
    Usage(String),
    #[error("closing inherited file descriptors: {0}")]
    CloseFds(io::Error),
    #[error("becoming a session leader: {0}")]
    Setsid(io::Error),
    #[error("becoming a child subreaper: {0}")]
    Subreaper(io::Error),
    #[error("watching SIGCHLD: {0}")]
    SignalFd(io::Error),
    #[error("creating the exec pipe: {0}")]
    Pipe(io::Error),
    #[error("forking the job: {0}")]
    Fork(io::Error),
    #[error("the sandbox policy argument is malformed (refusing to run unconfined)")]
    BadPolicy,
    #[error("sandbox policies cannot be enforced on this platform; refusing to run unconfined")]
    PolicyUnsupported,
}

impl Spec {
    /// Parse `[--lifeline FD] [--status FD] [--tty] --exec PATH POLICY -- ARGV...`.
    pub fn parse(args: &[OsString]) -> Result<Spec, Error> {
        let mut spec = Spec {
            lifeline: None,
            status: None,
            tty: false,
            exec: PathBuf::new(),
            argv: Vec::new(),
            policy: String::new(),
        };
        let mut policy = None;
        let mut it = args.iter();
        let fd = |v: Option<&OsString>, name: &str| -> Result<RawFd, Error> {
            v.and_then(|v| v.to_str())
                .and_then(|v| v.parse::<RawFd>().ok())
                .filter(|fd| *fd > 2)
                .ok_or_else(|| {
                    Error::Usage(format!("{name} needs a file descriptor number above 2"))
                })
        };
        while let Some(a) = it.next() {
            match a.to_str() {
                Some("--lifeline") => spec.lifeline = Some(fd(it.next(), "--lifeline")?),
                Some("--status") => spec.status = Some(fd(it.next(), "--status")?),
                Some("--tty") => spec.tty = true,
                Some("--exec") => {
                    spec.exec = it
                        .next()
                        .map(PathBuf::from)
                        .ok_or_else(|| Error::Usage("--exec needs a path".into()))?
                }
                Some("--") => {
                    spec.argv = it.by_ref().cloned().collect();
                    break;
                }
                _ if policy.is_none() => policy = Some(a.to_string_lossy().into_owned()),
                _ => return Err(Error::Usage(format!("unexpected argument {a:?}"))),
            }
        }
        spec.policy = policy.unwrap_or_default();
        if spec.argv.is_empty() {
            return Err(Error::Usage("no program after --".into()));
        }
        if spec.exec.as_os_str().is_empty() {
            spec.exec = PathBuf::from(&spec.argv[0]);
        }
        Ok(spec)
    }
}

fn send(status: &mut Option<std::fs::File>, tag: u8, value: i32) {
    if let Some(f) = status {
        let mut msg = [0u8; 5];
        msg[0] = tag;
        msg[1..].copy_from_slice(&value.to_be_bytes());
        // The agent may be gone: then nobody is left to tell.
        let _ = f.write_all(&msg);
    }
}

/// Run the trampoline: set up, fork the job, supervise it. Returns the
/// process exit code for the trampoline itself.
///
/// Must be called while the process is single-threaded (before any runtime).
pub fn run(spec: Spec) -> Result<i32, Error> {
    // 1. Own our two fds, and close everything else a multithreaded agent
    //    may have leaked into us (another job's pipes): only 0-2 reach the job.
    let keep: Vec<RawFd> = spec
        .lifeline
        .iter()
        .chain(spec.status.iter())
        .copied()
        .collect();
    sys::close_fds_except(&keep).map_err(Error::CloseFds)?;
    // SAFETY: the agent passed these numbers for us alone; they are open
    // (kept above) and nothing else in this process owns them.
    let lifeline: Option<OwnedFd> = spec.lifeline.map(|fd| unsafe { sys::own_inherited_fd(fd) });
    // SAFETY: as above.
    let mut status: Option<std::fs::File> = spec
        .status
        .map(|fd| unsafe { sys::own_inherited_fd(fd) }.into());
    for fd in lifeline
        .iter()
        .map(|f| f.as_fd())
        .chain(status.iter().map(|f| f.as_fd()))
    {
        // Our own fds must not reach the job either.
        let _ = nix::fcntl::fcntl(
            fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        );
    }

    // 2. Decode the sandbox policy now, so a bad one fails before any fork
    //    (never run unconfined what was asked to be confined).
    #[cfg(target_os = "linux")]
    let policy = match spec.policy.as_str() {
        "" => None,
        s => Some(crate::linux::WirePolicy::decode(s).ok_or(Error::BadPolicy)?),
    };
    #[cfg(not(target_os = "linux"))]
    if !spec.policy.is_empty() {
        return Err(Error::PolicyUnsupported);
    }

    // 3. Leave the agent's session and process group: a terminal signal
    //    aimed at the agent must not reach the supervisor, and vice versa.
    nix::unistd::setsid().map_err(|e| Error::Setsid(e.into()))?;

    // 4. Become the subreaper of everything the job starts.
    nix::sys::prctl::set_child_subreaper(true).map_err(|e| Error::Subreaper(e.into()))?;

    // 5. Learn about child exits through a signalfd (SIGCHLD blocked here;
    //    the job's mask is reset before exec).
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    mask.thread_block().map_err(|e| Error::SignalFd(e.into()))?;
    let sigfd = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(|e| Error::SignalFd(e.into()))?;

    // 6. Everything exec needs, prepared before the fork.
    let path = CString::new(spec.exec.as_os_str().as_bytes())
        .map_err(|_| Error::Usage("program path contains NUL".into()))?;
    let argv: Vec<CString> = spec
        .argv
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(|_| Error::Usage("argument contains NUL".into()))?;
    let envp: Vec<CString> = std::env::vars_os()
        .filter_map(|(k, v)| {
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            CString::new(kv).ok()
        })
        .collect();
    let (mut exec_r, exec_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map(|(r, w)| (std::fs::File::from(r), w))
        .map_err(|e| Error::Pipe(e.into()))?;

    // 7. Fork the job.
    // SAFETY: `run` is documented to be called single-threaded (the
    // `executor sandbox-exec` entry point starts no threads).
    let child = match unsafe { sys::fork_single_threaded() }.map_err(Error::Fork)? {
        ForkResult::Child => {
            drop(exec_r);
            #[cfg(target_os = "linux")]
            let failure = exec_job(&spec, policy.as_ref(), &path, &argv, &envp);
            #[cfg(not(target_os = "linux"))]
            let failure = exec_job(&spec, &path, &argv, &envp);
            let mut w = std::fs::File::from(exec_w);
            let _ = w.write_all(&failure);
            // Only async-signal-safe exit: no destructors, no atexit.
            nix::unistd::write(std::io::stderr(), b"executor sandbox-exec: exec failed\n").ok();
            std::process::exit(127);
        }
        ForkResult::Parent { child } => child,
    };
    drop(exec_w);
    let mut failure = [0u8; 8];
    match exec_r.read_exact(&mut failure) {
        Ok(()) => {
            let errno = i32::from_be_bytes([failure[4], failure[5], failure[6], failure[7]]);
            if failure[0] == FAIL_SANDBOX {
                send(
                    &mut status,
                    MSG_SANDBOX_FAILED,
                    (i32::from(failure[1]) << 16) | (errno & 0xffff),
                );
            } else {
                send(&mut status, MSG_EXEC_FAILED, errno);
            }
            let _ = waitpid(child, None);
            return Ok(127);
        }
        Err(_) => send(&mut status, MSG_STARTED, child.as_raw()),
    }
    drop(exec_r);

    // 8. The job holds the terminal or pipes now; the supervisor lets go so
    //    that EOF on them follows the job alone.
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        let _ = nix::unistd::dup2_stdin(&null);
        let _ = nix::unistd::dup2_stdout(&null);
        let _ = nix::unistd::dup2_stderr(&null);
    }

    // 9. Supervise: until the job's main process exits, or the agent dies.
    let raw_status = supervise(child, lifeline.as_ref(), &sigfd);
    send(&mut status, MSG_EXITED, raw_status);
    Ok(0)
}

const FAIL_EXEC: u8 = 0;
const FAIL_SANDBOX: u8 = 1;

fn failure(kind: u8, step: u8, errno: i32) -> [u8; 8] {
    let e = errno.to_be_bytes();
    [kind, step, 0, 0, e[0], e[1], e[2], e[3]]
}

/// In the forked child: become the job, confine it, then exec. Returns
/// what failed (the job never runs then).
fn exec_job(
    spec: &Spec,
    #[cfg(target_os = "linux")] policy: Option<&crate::linux::WirePolicy>,
    path: &CString,
    argv: &[CString],
    envp: &[CString],
) -> [u8; 8] {
    // A new session: the job leads its own process group (signals reach the
    // whole job) and, with a tty, gets the PTY as controlling terminal.
    if let Err(e) = nix::unistd::setsid() {
        return failure(FAIL_EXEC, 0, e as i32);
    }
    if spec.tty {
        if let Err(e) = sys::set_controlling_tty(std::io::stdin().as_fd()) {
            return failure(FAIL_EXEC, 0, e.raw_os_error().unwrap_or(libc::EIO));
        }
    }
    // The sandbox, last before exec (see `linux::apply` for the order).
    #[cfg(target_os = "linux")]
    if let Some(p) = policy {
        if let Err((step, e)) = crate::linux::apply(p) {
            return failure(
                FAIL_SANDBOX,
                step as u8,
                e.raw_os_error().unwrap_or(libc::EPERM),
            );
        }
    }
    // Default dispositions and an empty mask, whatever the agent had.
    sys::reset_signals();
    match nix::unistd::execve(path, argv, envp) {
        Err(e) => failure(FAIL_EXEC, 0, e as i32),
        Ok(never) => match never {},
    }
}

/// Wait for the main process, killing the job if the agent goes away;
/// then kill whatever the job left behind. Returns the raw wait status.
fn supervise(main: Pid, lifeline: Option<&OwnedFd>, sigfd: &SignalFd) -> i32 {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    loop {
        if let Some(raw) = main_exited(main) {
            return raw;
        }
        let mut fds = vec![PollFd::new(sigfd.as_fd(), PollFlags::POLLIN)];
        if let Some(l) = lifeline {
            fds.push(PollFd::new(l.as_fd(), PollFlags::POLLIN));
        }
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => {
                // Cannot wait safely: end the job rather than leak it.
                kill_job(main);
                return reap_main(main);
            }
        }
        let agent_gone = fds.get(1).and_then(|f| f.revents()).is_some_and(|r| {
            r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLIN)
        });
        // Drain the signalfd; exits are collected by `main_exited`.
        while let Ok(Some(_)) = sigfd.read_signal() {}
        reap_others(main);
        if agent_gone {
            kill_job(main);
            return reap_main(main);
        }
    }
}

/// If the main process has exited: kill its group while it is still a
/// zombie (so its pgid cannot have been reused), clean up, and reap it.
fn main_exited(main: Pid) -> Option<i32> {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    match waitid(Id::Pid(main), flags) {
        Ok(WaitStatus::StillAlive) => None,
        Ok(_) => {
            kill_job(main);
            Some(reap_main(main))
        }
        Err(_) => Some(0),
    }
}

/// SIGKILL the job's process group and every descendant re-parented to us.
fn kill_job(main: Pid) {
    let _ = killpg(main, Signal::SIGKILL);
    kill_children_except(Some(main));
}

fn reap_main(main: Pid) -> i32 {
    // Reap the main process first (its status is the answer), then every
    // remaining descendant.
    let raw = loop {
        match waitpid(main, None) {
            Ok(WaitStatus::Exited(_, code)) => break (code & 0xff) << 8,
            Ok(WaitStatus::Signaled(_, sig, core)) => {
                break (sig as i32) | if core { 0x80 } else { 0 }
            }
            Ok(_) => continue,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => break 0,
        }
    };
    // Everything else dies: kill what is re-parented to us, reap, repeat
    // (killing a parent re-parents its children to us) until none is left.
    for _ in 0..10_000 {
        kill_children_except(None);
        match waitpid(Pid::from_raw(-1), None) {
            Ok(_) => continue,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => break, // ECHILD: nobody left
        }
    }
    raw
}

/// Reap re-parented descendants that exited on their own (never `main`).
fn reap_others(main: Pid) {
    for child in children_of(nix::unistd::getpid()) {
        if child != main {
            let _ = waitpid(child, Some(WaitPidFlag::WNOHANG));
        }
    }
}

fn kill_children_except(except: Option<Pid>) {
    for child in children_of(nix::unistd::getpid()) {
        if Some(child) != except {
            let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
        }
    }
}

/// Direct children of `parent`: from `/proc/PID/task/PID/children` (the
/// supervisor is single-threaded, so its main task has all of them), else
/// by scanning `/proc/*/stat` on kernels without CONFIG_PROC_CHILDREN.
fn children_of(parent: Pid) -> Vec<Pid> {
    let p = parent.as_raw();
    if let Ok(list) = std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")) {
        return list
            .split_whitespace()
            .filter_map(|c| c.parse::<i32>().ok())
            .map(Pid::from_raw)
            .collect();
    }
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The command name may contain spaces and parentheses: parse after
        // the last ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let ppid = rest
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<i32>().ok());
        if ppid == Some(parent.as_raw()) {
            out.push(Pid::from_raw(pid));
        }
    }
    out
}

/// Decode a raw wait status into (exit code, signal number).
pub fn decode_wait_status(raw: i32) -> (Option<i32>, Option<i32>) {
    let sig = raw & 0x7f;
    if sig == 0 {
        (Some((raw >> 8) & 0xff), None)
    } else {
        (None, Some(sig))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_command_line() {
        let args: Vec<OsString> = [
            "--lifeline",
            "5",
            "--status",
            "7",
            "--tty",
            "--exec",
            "/bin/echo",
            "",
            "--",
            "hi",
            "x",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        let s = Spec::parse(&args).unwrap();
        assert_eq!(s.lifeline, Some(5));
        assert_eq!(s.status, Some(7));
        assert!(s.tty);
        assert_eq!(s.exec, PathBuf::from("/bin/echo"));
        assert_eq!(s.argv, vec![OsString::from("hi"), OsString::from("x")]);
        assert!(s.policy.is_empty());
        assert!(Spec::parse(&[OsString::from("--status"), OsString::from("1")]).is_err());
        assert!(Spec::parse(&[OsString::from("pol")]).is_err());
    }

    #[test]
    fn wait_status_decoding() {
        assert_eq!(decode_wait_status(7 << 8), (Some(7), None));
        assert_eq!(decode_wait_status(15), (None, Some(15)));
        assert_eq!(decode_wait_status(9 | 0x80), (None, Some(9)));
    }
}
