//! `executor sandbox-exec`: the one path every job takes from the agent to
//! its program.
//!
//! The agent never forks for a job: its spawner ([`crate::spawner`], a
//! small single-threaded process with an empty environment) forks the
//! job's **supervisor**, which runs [`run`] directly; `executor
//! sandbox-exec --lifeline FD --status FD [--egress FD] --spec FD` runs the same
//! function as a command (for tests and tools). Either way the supervisor
//! gets descriptor numbers only: what to run comes in a sealed memfd
//! ([`crate::spec::JobSpec`]), so nothing of the request reaches its
//! environment, its loader or `/proc/PID/cmdline`. Being single-threaded,
//! it can prepare everything, fork the program and stay as its supervisor:
//!
//! - it watches a *lifeline* pipe whose write end only the agent holds: when
//!   the agent dies (even by SIGKILL) the pipe hangs up and the supervisor
//!   kills the whole job. (`PR_SET_PDEATHSIG` is not used for that link: it
//!   fires when the agent's *thread* that forked exits, and covers only the
//!   direct child. A sandboxed job's init has one, tied to its supervisor,
//!   which is single-threaded: a supervisor killed from outside takes the
//!   init, and with it the job's PID namespace.)
//! - a sandboxed job runs under an init of its own, created by `clone` in
//!   new namespaces ([`crate::linux`]): the init confines itself, forks the
//!   program (pid 2 of the new PID namespace), and when the program exits
//!   kills and reaps everything left in the namespace before it reports
//!   the exit to the supervisor (which reports it to the agent at once,
//!   then closes its end of the init's socket: only then does the init
//!   exit, and its exit tears the namespaces down; the supervisor reaps
//!   it). Killing the init kills the job.
//! - the program's process starts as a `vfork` (`clone(CLONE_VM |
//!   CLONE_VFORK)`, [`start_program`]): it shares the supervisor's (or the
//!   init's) memory until its `execve`, so nothing is copied and the
//!   parent resumes once the program runs; everything it needs (argv,
//!   envp, the signals to reset) is prepared before, and it makes only
//!   system calls. A sandboxed program sends its credentials to the
//!   supervisor before its exec, so its host pid arrives translated by the
//!   kernel (no look-up in `/proc`).
//! - an unconfined job is started directly; the supervisor is a child
//!   subreaper, so descendants that double-fork or `setsid` are re-parented
//!   to it and killed when the program exits. Unconfined with
//!   `deny_network` (a degraded `allow_hosts` intent,
//!   [`crate::spec::Confinement`]) the forked job installs the seccomp
//!   filters of `network: "deny"` before its exec.
//!
//! The status pipe carries 5-byte messages to the agent: `P` + pid (the job
//! runs; its pid as the agent sees it), `E` + errno (exec failed, nothing
//! ran), `S` + step << 16 | errno (the sandbox could not be set up, nothing
//! ran), `X` + raw wait status.

use crate::spec::{Confinement, JobSpec};
use executor_sys as sys;
use nix::sys::signal::{killpg, SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitid, waitpid, Id, WaitPidFlag, WaitStatus};
#[cfg(not(target_os = "linux"))]
use nix::unistd::ForkResult;
use nix::unistd::Pid;
use std::ffi::{CString, OsString};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// What the supervisor tells the agent on the status pipe: first one of
/// `Started`, `ExecFailed`, `SandboxFailed`; after `Started`, `Exited`.
/// Each is [`Status::LEN`] bytes: a tag and a big-endian `i32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// The program runs, with this host pid.
    Started { pid: u32 },
    /// The program could not be executed (`errno` of `execve` or of a step
    /// before it); nothing ran.
    ExecFailed { errno: i32 },
    /// The sandbox could not be set up at `step` ([`crate::linux::Step`]);
    /// nothing ran.
    SandboxFailed { step: u8, errno: i32 },
    /// The program ended: its raw wait status ([`decode_wait_status`]).
    Exited { raw: i32 },
}

impl Status {
    pub const LEN: usize = 5;

    pub fn encode(self) -> [u8; Status::LEN] {
        let (tag, value) = match self {
            Status::Started { pid } => (b'P', pid as i32),
            Status::ExecFailed { errno } => (b'E', errno),
            Status::SandboxFailed { step, errno } => {
                (b'S', (i32::from(step) << 16) | (errno & 0xffff))
            }
            Status::Exited { raw } => (b'X', raw),
        };
        let mut msg = [0u8; Status::LEN];
        msg[0] = tag;
        msg[1..].copy_from_slice(&value.to_be_bytes());
        msg
    }

    /// `None` for bytes no supervisor sends.
    pub fn decode(msg: [u8; Status::LEN]) -> Option<Status> {
        let v = i32::from_be_bytes([msg[1], msg[2], msg[3], msg[4]]);
        Some(match msg[0] {
            b'P' => Status::Started { pid: v as u32 },
            b'E' => Status::ExecFailed { errno: v },
            b'S' => Status::SandboxFailed {
                step: (v >> 16) as u8,
                errno: v & 0xffff,
            },
            b'X' => Status::Exited { raw: v },
            _ => return None,
        })
    }
}

/// The trampoline's command line: descriptor numbers only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// Read end of the agent's lifeline pipe.
    pub lifeline: Option<RawFd>,
    /// Write end of this job's status pipe.
    pub status: Option<RawFd>,
    /// The sealed memfd holding the [`JobSpec`].
    pub spec: RawFd,
    /// With egress by name: a Unix socket on which the job's init sends the
    /// agent the proxy's listening socket (`SCM_RIGHTS`).
    pub egress: Option<RawFd>,
    /// A user namespace and the network and IPC namespaces it owns, from
    /// the spawner's pool ([`crate::nspool`]), for this job alone (only a
    /// fork of the spawner has them).
    pub namespaces: Option<[RawFd; 3]>,
    /// `cgroup.procs` of each of the job's cgroups, open for writing: the
    /// supervisor joins them first thing ([`crate::cgroup`]).
    pub cgroups: Vec<RawFd>,
}

/// Errors of the trampoline's setup, each naming its step.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("sandbox-exec usage: {0}")]
    Usage(String),
    #[error("closing inherited file descriptors: {0}")]
    CloseFds(io::Error),
    #[error("reading the job spec: {0}")]
    BadSpec(io::Error),
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
    #[error("sandbox policies cannot be enforced on this platform; refusing to run unconfined")]
    PolicyUnsupported,
    #[error("compiling the seccomp filters that deny the job's network: {0}")]
    NetworkFilter(io::Error),
}

impl Spec {
    /// Parse `[--lifeline FD] [--status FD] [--egress FD] [--cgroup FD]...
    /// --spec FD`.
    pub fn parse(args: &[OsString]) -> Result<Spec, Error> {
        let mut spec = Spec {
            lifeline: None,
            status: None,
            spec: -1,
            egress: None,
            namespaces: None,
            cgroups: Vec::new(),
        };
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
                Some("--spec") => spec.spec = fd(it.next(), "--spec")?,
                Some("--egress") => spec.egress = Some(fd(it.next(), "--egress")?),
                Some("--cgroup") => spec.cgroups.push(fd(it.next(), "--cgroup")?),
                _ => return Err(Error::Usage(format!("unexpected argument {a:?}"))),
            }
        }
        if spec.spec < 0 {
            return Err(Error::Usage("--spec FD is required".into()));
        }
        Ok(spec)
    }
}

fn send(status: &mut Option<std::fs::File>, s: Status) {
    if let Some(f) = status {
        // The agent may be gone: then nobody is left to tell.
        let _ = f.write_all(&s.encode());
    }
}

fn cstring(b: &[u8], what: &str) -> Result<CString, Error> {
    CString::new(b).map_err(|_| Error::Usage(format!("{what} contains NUL")))
}

/// What `execve` needs, prepared before the program's process starts (it
/// runs in the supervisor's or the init's memory until it execs, and
/// allocates nothing: see [`start_program`]).
struct Exec {
    path: CString,
    /// `argv` and `envp` as `execve` takes them: pointers to the strings
    /// of the two vectors below (whose heap buffers never move), each list
    /// ended by a null pointer.
    argv_ptrs: Vec<*const libc::c_char>,
    envp_ptrs: Vec<*const libc::c_char>,
    argv: Vec<CString>,
    #[allow(dead_code)] // owns what `envp_ptrs` points to
    envp: Vec<CString>,
    tty: bool,
    /// The job's working directory, entered in the forked child (unconfined
    /// jobs; a sandboxed job's init enters it in the job's own root).
    cwd: Option<CString>,
    /// [`sys::ignored_signals`], read before the program's process starts.
    ignored_signals: u64,
    /// `RLIMIT_AS` of the program (the memory limit's fallback), set in its
    /// own process just before its exec: the supervisor and the init stay
    /// outside it.
    address_space: Option<u64>,
    /// The program's soft `RLIMIT_NOFILE` ([`crate::spec::Rlimits`]).
    open_files: Option<u64>,
}

impl Exec {
    fn new(
        path: CString,
        argv: Vec<CString>,
        envp: Vec<CString>,
        tty: bool,
        cwd: Option<CString>,
    ) -> Exec {
        let ptrs = |v: &[CString]| {
            v.iter()
                .map(|c| c.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect()
        };
        Exec {
            argv_ptrs: ptrs(&argv),
            envp_ptrs: ptrs(&envp),
            path,
            argv,
            envp,
            tty,
            cwd,
            ignored_signals: sys::ignored_signals(),
            address_space: None,
            open_files: None,
        }
    }
}

/// Start the program's process, in which `child` runs: it execs, or
/// returns the exit code of a failure it has reported. On Linux the
/// process shares this one's memory until it execs, and this one waits
/// meanwhile ([`sys::vfork_exec`]): nothing is copied, so `child` must not
/// allocate (everything is prepared in [`Exec`]). Elsewhere a `fork`.
///
/// # Safety
/// The caller is single-threaded, and `child` keeps [`sys::vfork_exec`]'s
/// contract (system calls and prepared memory only, no unwinding).
unsafe fn start_program(child: &mut dyn FnMut() -> libc::c_int) -> io::Result<Pid> {
    #[cfg(target_os = "linux")]
    {
        let mut stack = sys::ChildStack::new()?;
        // SAFETY: forwarded from the caller's contract.
        unsafe { sys::vfork_exec(&mut stack, child) }
    }
    #[cfg(not(target_os = "linux"))]
    {
        // SAFETY: forwarded from the caller's contract.
        match unsafe { sys::fork_single_threaded() }? {
            ForkResult::Child => {
                let code = child();
                // SAFETY: only async-signal-safe exit: no destructors.
                unsafe { libc::_exit(code) }
            }
            ForkResult::Parent { child } => Ok(child),
        }
    }
}

/// In the program's process, after a failure: its record on the exec
/// pipe and a line on the job's stderr (system calls only).
fn report_failure(exec_w: RawFd, failure: &[u8; 8]) -> libc::c_int {
    const SAID: &[u8] = b"executor sandbox-exec: exec failed\n";
    // SAFETY: both buffers are valid for their lengths; short writes only
    // shorten what is said (an 8-byte pipe write is atomic).
    unsafe {
        libc::write(exec_w, failure.as_ptr().cast(), failure.len());
        libc::write(2, SAID.as_ptr().cast(), SAID.len());
    }
    127
}

/// [`run`], with a setup error said on stderr (the job's stderr: it names
/// who failed) and turned into exit code 126. The body of both ways into a
/// supervisor: `executor sandbox-exec --lifeline FD --status FD --spec FD`
/// and a fork of the spawner ([`crate::spawner`]).
pub fn run_reporting(spec: Result<Spec, Error>) -> i32 {
    match spec.and_then(run) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("executor sandbox-exec: {e}");
            126
        }
    }
}

/// Run the trampoline: set up, fork the job, supervise it. Returns the
/// process exit code for the trampoline itself.
///
/// Must be called while the process is single-threaded (before any runtime).
pub fn run(spec: Spec) -> Result<i32, Error> {
    // 1. Own our fds, and close everything else a multithreaded agent may
    //    have leaked into us (another job's pipes): only 0-2 reach the job.
    let keep: Vec<RawFd> = spec
        .lifeline
        .iter()
        .chain(spec.status.iter())
        .chain(spec.egress.iter())
        .chain(spec.namespaces.iter().flatten())
        .chain(spec.cgroups.iter())
        .chain(std::iter::once(&spec.spec))
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
    // SAFETY: as above.
    let job_fd = unsafe { sys::own_inherited_fd(spec.spec) };
    // SAFETY: as above.
    let egress: Option<OwnedFd> = spec.egress.map(|fd| unsafe { sys::own_inherited_fd(fd) });
    #[cfg(target_os = "linux")]
    // SAFETY: as above (the spawner's fork passes the set's numbers).
    let set = spec.namespaces.map(|[user, net, ipc]| unsafe {
        crate::nspool::NsSet {
            user: sys::own_inherited_fd(user),
            net: sys::own_inherited_fd(net),
            ipc: sys::own_inherited_fd(ipc),
        }
    });
    for fd in lifeline
        .iter()
        .map(|f| f.as_fd())
        .chain(status.iter().map(|f| f.as_fd()))
        .chain(egress.iter().map(|f| f.as_fd()))
    {
        // Our own fds must not reach the job either.
        let _ = nix::fcntl::fcntl(
            fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        );
    }

    // 2. Join the job's cgroups, before anything of the job exists:
    //    everything it forks is in them (its limits, its account, and its
    //    end: the agent kills whatever is left there).
    for fd in &spec.cgroups {
        // SAFETY: as above.
        let procs = std::fs::File::from(unsafe { sys::own_inherited_fd(*fd) });
        // `0`: the writing process.
        if let Err(e) = (&procs).write_all(b"0") {
            send(
                &mut status,
                Status::SandboxFailed {
                    step: STEP_CGROUP,
                    errno: errno_of(&e),
                },
            );
            return Ok(127);
        }
    }

    // 3. What to run, and under which plan: a bad spec fails before any
    //    fork (never run unconfined what was asked to be confined).
    let job = JobSpec::read_from(job_fd).map_err(Error::BadSpec)?;
    #[cfg(not(target_os = "linux"))]
    if job.confinement.plan().is_some() {
        return Err(Error::PolicyUnsupported);
    }

    // 4. Leave the agent's session and process group: a terminal signal
    //    aimed at the agent must not reach the supervisor, and vice versa.
    nix::unistd::setsid().map_err(|e| Error::Setsid(e.into()))?;

    // 5. Become the subreaper of everything an unconfined job starts.
    nix::sys::prctl::set_child_subreaper(true).map_err(|e| Error::Subreaper(e.into()))?;

    // 6. Learn about child exits through a signalfd (SIGCHLD blocked here;
    //    the job's mask is reset before exec).
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    mask.thread_block().map_err(|e| Error::SignalFd(e.into()))?;
    let sigfd = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(|e| Error::SignalFd(e.into()))?;

    // 7. Everything exec needs, prepared before the fork. The job's env is
    //    used here, at the final execve, and nowhere before.
    let mut exec = Exec::new(
        cstring(&job.exec, "the program path")?,
        job.argv
            .iter()
            .map(|a| cstring(a, "an argument"))
            .collect::<Result<_, _>>()?,
        job.env
            .iter()
            .map(|e| cstring(e, "an environment entry"))
            .collect::<Result<_, _>>()?,
        job.tty,
        match job.confinement.plan() {
            None => Some(cstring(&job.cwd, "the working directory")?),
            Some(_) => None,
        },
    );
    exec.address_space = job.rlimits.address_space;
    exec.open_files = job.rlimits.open_files;
    if exec.argv.is_empty() {
        return Err(Error::Usage("the job spec has an empty argv".into()));
    }
    let (mut exec_r, exec_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map(|(r, w)| (std::fs::File::from(r), w))
        .map_err(|e| Error::Pipe(e.into()))?;

    let deny_network = match &job.confinement {
        #[cfg(target_os = "linux")]
        Confinement::Sandboxed(plan) => {
            let cwd = PathBuf::from(std::ffi::OsStr::from_bytes(&job.cwd));
            let job = Job {
                plan,
                cwd: &cwd,
                exec: &exec,
                egress,
                set,
                processes: job.rlimits.processes,
            };
            return sandboxed(job, exec_r, exec_w, status, lifeline, sigfd);
        }
        #[cfg(not(target_os = "linux"))]
        Confinement::Sandboxed(_) => return Err(Error::PolicyUnsupported),
        Confinement::Unconfined { deny_network } => *deny_network,
    };
    // Only a sandboxed plan has egress by name (or pooled namespaces).
    drop(egress);
    #[cfg(target_os = "linux")]
    drop(set);
    // A degraded `allow_hosts` job: no namespaces, but no network either.
    let net_filters = if deny_network {
        Some(network_denial()?)
    } else {
        None
    };

    // 8. Start the job's process. Both ends of the exec pipe are
    //    close-on-exec: EOF once the program runs, a record if it failed.
    let exec_fd = exec_w.as_raw_fd();
    let mut program = || {
        let failure = match net_filters.as_deref().map(deny_network_here) {
            Some(Err(e)) => failure(FAIL_SANDBOX, SECCOMP_STEP, errno_of(&e)),
            _ => exec_job(&exec),
        };
        report_failure(exec_fd, &failure)
    };
    // SAFETY: `run` is documented to be called single-threaded (the
    // `executor sandbox-exec` entry point starts no threads); the closure
    // makes system calls on prepared memory only.
    let child = unsafe { start_program(&mut program) }.map_err(Error::Fork)?;
    drop(exec_w);
    if report_start(&mut exec_r, &mut status, || Some(child)).is_err() {
        let _ = waitpid(child, None);
        return Ok(127);
    }
    drop(exec_r);
    release_stdio();

    // 9. Supervise: until the job's main process exits, or the agent dies.
    let raw_status = supervise(child, lifeline.as_ref(), &sigfd);
    send(&mut status, Status::Exited { raw: raw_status });
    Ok(0)
}

/// The seccomp filters of `network: "deny"`, ready before the fork
/// (compiled by the spawner, or here).
#[cfg(target_os = "linux")]
fn network_denial() -> Result<std::borrow::Cow<'static, [seccompiler::BpfProgram]>, Error> {
    crate::linux::seccomp_programs(&crate::plan::WireNet::Deny).map_err(Error::NetworkFilter)
}

#[cfg(not(target_os = "linux"))]
fn network_denial() -> Result<Vec<Vec<u8>>, Error> {
    Err(Error::PolicyUnsupported)
}

#[cfg(target_os = "linux")]
const SECCOMP_STEP: u8 = crate::linux::Step::Seccomp as u8;
#[cfg(target_os = "linux")]
const STEP_CGROUP: u8 = crate::linux::Step::Cgroup as u8;
#[cfg(not(target_os = "linux"))]
const STEP_CGROUP: u8 = 0;
#[cfg(target_os = "linux")]
const STEP_RLIMITS: u8 = crate::linux::Step::Rlimits as u8;
#[cfg(not(target_os = "linux"))]
const STEP_RLIMITS: u8 = 0;
#[cfg(not(target_os = "linux"))]
const SECCOMP_STEP: u8 = 0;

/// In the forked job, before exec: `no_new_privs` and the filters.
#[cfg(target_os = "linux")]
fn deny_network_here(filters: &[seccompiler::BpfProgram]) -> io::Result<()> {
    nix::sys::prctl::set_no_new_privs()?;
    filters.iter().try_for_each(|f| sys::install_bpf(f))
}

#[cfg(not(target_os = "linux"))]
fn deny_network_here(_: &[Vec<u8>]) -> io::Result<()> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

/// Read the exec pipe: a failure record (reported, `Err`), or EOF when the
/// program runs (`P` + the pid `pid()` finds).
fn report_start(
    exec_r: &mut std::fs::File,
    status: &mut Option<std::fs::File>,
    pid: impl FnOnce() -> Option<Pid>,
) -> Result<(), ()> {
    let mut failure = [0u8; 8];
    match exec_r.read_exact(&mut failure) {
        Ok(()) => {
            let errno = i32::from_be_bytes([failure[4], failure[5], failure[6], failure[7]]);
            if failure[0] == FAIL_SANDBOX {
                send(
                    status,
                    Status::SandboxFailed {
                        step: failure[1],
                        errno,
                    },
                );
            } else {
                send(status, Status::ExecFailed { errno });
            }
            Err(())
        }
        Err(_) => match pid() {
            Some(p) => {
                send(
                    status,
                    Status::Started {
                        pid: p.as_raw() as u32,
                    },
                );
                Ok(())
            }
            None => {
                send(status, Status::ExecFailed { errno: libc::ESRCH });
                Err(())
            }
        },
    }
}

/// The job holds the terminal or pipes now; the supervisor lets go so
/// that EOF on them follows the job alone.
fn release_stdio() {
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        let _ = nix::unistd::dup2_stdin(&null);
        let _ = nix::unistd::dup2_stdout(&null);
        let _ = nix::unistd::dup2_stderr(&null);
    }
}

const FAIL_EXEC: u8 = 0;
const FAIL_SANDBOX: u8 = 1;

fn failure(kind: u8, step: u8, errno: i32) -> [u8; 8] {
    let e = errno.to_be_bytes();
    [kind, step, 0, 0, e[0], e[1], e[2], e[3]]
}

/// The errno a failure reports (only the step and this number reach the
/// agent): the system call's own, else one for the error's kind (an error
/// that names its path keeps the kind of the one it wraps).
fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(match e.kind() {
        io::ErrorKind::NotFound => libc::ENOENT,
        io::ErrorKind::PermissionDenied => libc::EACCES,
        io::ErrorKind::NotADirectory => libc::ENOTDIR,
        io::ErrorKind::ReadOnlyFilesystem => libc::EROFS,
        _ => libc::EPERM,
    })
}

/// What the job's init needs.
#[cfg(target_os = "linux")]
struct Job<'a> {
    plan: &'a crate::plan::WirePlan,
    cwd: &'a std::path::Path,
    exec: &'a Exec,
    /// Where the egress listener goes (`--egress`).
    egress: Option<OwnedFd>,
    /// The pool's namespaces for this job, if the spawner had a set.
    set: Option<crate::nspool::NsSet>,
    /// `RLIMIT_NPROC` in the job's user namespace (the rlimits fallback).
    processes: Option<u64>,
}

/// The sandboxed path: an init in new namespaces confines itself and forks
/// the program; the supervisor reports and waits for the init.
#[cfg(target_os = "linux")]
fn sandboxed(
    mut job: Job<'_>,
    mut exec_r: std::fs::File,
    exec_w: OwnedFd,
    mut status: Option<std::fs::File>,
    lifeline: Option<OwnedFd>,
    sigfd: SignalFd,
) -> Result<i32, Error> {
    use std::os::unix::net::UnixStream;
    let (ctl, ctl_init) = UnixStream::pair().map_err(Error::Pipe)?;
    // The program announces itself on `ctl` with its credentials: its pid
    // arrives translated into this PID namespace.
    nix::sys::socket::setsockopt(&ctl, nix::sys::socket::sockopt::PassCred, &true)
        .map_err(|e| Error::Pipe(e.into()))?;
    let (uid, gid) = (
        nix::unistd::getuid().as_raw(),
        nix::unistd::getgid().as_raw(),
    );
    let mut flags = crate::linux::namespace_flags(job.plan);
    // A set of the spawner's pool replaces the user, network and IPC
    // namespaces: the init is cloned from inside its user and network
    // namespaces into new PID and mount namespaces (the mount namespace is
    // never made ahead: it is a copy of the host's mount table as it is
    // now) and enters the IPC namespace itself, holding its capabilities
    // there as after a fresh clone; the ids are mapped already.
    let mut ids = Some((uid, gid));
    let mut init_ns = None;
    let entered = match job.set.take() {
        Some(set) if flags & libc::CLONE_NEWNET != 0 => set.enter().map(|ns| {
            flags = libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::CLONE_NEWCGROUP;
            ids = None;
            init_ns = Some(ns);
        }),
        // A job without a namespace of its own leaves the set unused.
        _ => Ok(()),
    };
    // SAFETY: `run` is documented to be called single-threaded.
    let init = match entered.and_then(|()| unsafe { sys::fork_into_namespaces(flags) }) {
        Ok(Some(pid)) => pid,
        Ok(None) => {
            drop(exec_r);
            drop(ctl);
            let code = job_init(job, ids, init_ns, exec_w, ctl_init);
            std::process::exit(code);
        }
        Err(e) => {
            send(
                &mut status,
                Status::SandboxFailed {
                    step: crate::linux::Step::Namespaces as u8,
                    errno: errno_of(&e),
                },
            );
            return Ok(127);
        }
    };
    drop(exec_w);
    drop(ctl_init);
    // The init has its own copies; the supervisor never needs them.
    drop(job.egress);
    drop(init_ns);
    // The program sent its credentials before its exec, so at EOF on the
    // exec pipe they are queued; if they are not (it was killed before it
    // sent them), the pid is looked up in /proc.
    let program = || sys::recv_sender_pid(ctl.as_fd()).or_else(|| program_of(init));
    if report_start(&mut exec_r, &mut status, program).is_err() {
        let _ = nix::sys::signal::kill(init, Signal::SIGKILL);
        let _ = waitpid(init, None);
        return Ok(127);
    }
    drop(exec_r);
    // The init waits for this before it reaps the program (so the pid
    // reported above cannot be reused yet).
    let mut ctl = ctl;
    let _ = ctl.write_all(b"g");
    release_stdio();
    let raw = supervise_init(init, &mut ctl, lifeline.as_ref(), &sigfd);
    send(&mut status, Status::Exited { raw });
    // The init reported (or is gone): let it exit (it waits for this end
    // to close) and reap it (its namespaces' teardown) after the agent
    // heard of the exit.
    drop(ctl);
    let _ = wait_for(init);
    Ok(0)
}

/// `waitpid(pid)`, blocking, retried when a signal interrupts it.
#[cfg(target_os = "linux")]
fn wait_for(pid: Pid) -> nix::Result<WaitStatus> {
    loop {
        match waitpid(pid, None) {
            Err(nix::errno::Errno::EINTR) => continue,
            st => return st,
        }
    }
}

/// The program's pid as the agent sees it: the init's child that is pid 2
/// in the job's PID namespace (the init forks it first).
#[cfg(target_os = "linux")]
fn program_of(init: Pid) -> Option<Pid> {
    let children = children_of(init);
    children
        .iter()
        .copied()
        .find(|c| {
            std::fs::read_to_string(format!("/proc/{c}/status"))
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find(|l| l.starts_with("NSpid:"))
                        .and_then(|l| l.split_whitespace().last().map(|p| p == "2"))
                })
                .unwrap_or(false)
        })
        .or_else(|| children.first().copied())
}

/// The job's init (pid 1 of its PID namespace): confine itself
/// ([`confine_init`]), fork the program, wait for it, report its status,
/// exit (which kills whatever is left in the namespace). Returns the
/// init's exit code.
#[cfg(target_os = "linux")]
fn job_init(
    mut job: Job<'_>,
    ids: Option<(u32, u32)>,
    pooled: Option<crate::nspool::InitNs>,
    exec_w: OwnedFd,
    mut ctl: std::os::unix::net::UnixStream,
) -> i32 {
    let mut w = std::fs::File::from(exec_w);
    // The one place a failed step becomes the record the supervisor
    // reports (the step and the errno).
    let fail = |w: &mut std::fs::File, step: crate::linux::Step, e: &io::Error| {
        let _ = w.write_all(&failure(FAIL_SANDBOX, step as u8, errno_of(e)));
        127
    };
    match confine_init(&mut job, ids, pooled, &ctl) {
        Ok(Supervised::Yes) => {}
        // The supervisor is gone already: nobody to report to.
        Ok(Supervised::Gone) => return 127,
        Err((step, e)) => return fail(&mut w, step, &e),
    }
    let exec = job.exec;
    // The program: pid 2 of the namespace. It tells the supervisor its pid
    // (credentials on `ctl`) and execs; `ctl` and the exec pipe are
    // close-on-exec.
    let (exec_fd, ctl_fd) = (w.as_raw_fd(), ctl.as_raw_fd());
    let mut child = || match sys::send_own_credentials(ctl_fd) {
        Ok(()) => report_failure(exec_fd, &exec_job(exec)),
        Err(e) => report_failure(
            exec_fd,
            &failure(FAIL_SANDBOX, crate::linux::Step::Fork as u8, errno_of(&e)),
        ),
    };
    // SAFETY: the init is single-threaded (forked from the single-threaded
    // supervisor); the closure makes system calls on prepared memory only.
    let program = match unsafe { start_program(&mut child) } {
        Ok(child) => child,
        Err(e) => return fail(&mut w, crate::linux::Step::Fork, &e),
    };
    drop(w);
    release_stdio();
    let mut go = [0u8; 1];
    let _ = ctl.read(&mut go);
    let raw = loop {
        match waitpid(Pid::from_raw(-1), None) {
            Ok(st) if st.pid() == Some(program) => match raw_wait_status(st) {
                Some(raw) => break raw,
                None => continue,
            },
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => break 0,
        }
    };
    end_namespace();
    // Nothing of the job runs any more: the supervisor may report the exit
    // now.
    let _ = ctl.write_all(&raw.to_be_bytes());
    // The init's exit tears the namespaces down (the mount table, the
    // network namespace): it waits until the supervisor has reported the
    // exit and closed its end, so that work never competes with the
    // report for a core. (A supervisor that dies closes its end too.)
    let _ = ctl.read(&mut go);
    0
}

/// Whether the init's supervisor is still there to report to.
#[cfg(target_os = "linux")]
enum Supervised {
    Yes,
    Gone,
}

/// The init's confinement, step by step, each named by its mechanism and
/// failing closed: the first that fails is the [`crate::linux::Step`]
/// the job reports, and the program never runs.
#[cfg(target_os = "linux")]
fn confine_init(
    job: &mut Job<'_>,
    ids: Option<(u32, u32)>,
    pooled: Option<crate::nspool::InitNs>,
    ctl: &std::os::unix::net::UnixStream,
) -> crate::linux::StepResult<Supervised> {
    use crate::linux::{self, at, Step};
    // Namespaces: with a set of the spawner's pool, its IPC namespace
    // (the user and network ones were entered before the clone).
    if let Some(ns) = pooled {
        ns.enter().map_err(at(Step::Namespaces))?;
    }
    // The fresh root (ids mapped, mounts, /dev, /proc, pivot, cwd).
    let prep = linux::build_root(job.plan, ids, job.exec.tty, job.cwd)?;
    // Egress by name: the proxy's listener goes to the agent now, while
    // the init may still bring `lo` up and listen (confinement forbids
    // both); the socket to the agent is closed before the program forks.
    hand_over_egress(&job.plan.net, job.egress.take())?;
    // Its /proc entries become root's: the job cannot read its init.
    sys::set_not_dumpable().map_err(at(Step::Capabilities))?;
    // The init dies with its supervisor: a supervisor killed from outside
    // must not leave the job running unwatched (the init's death kills
    // every process of its PID namespace).
    if !dies_with_supervisor(ctl).map_err(at(Step::Supervisor))? {
        return Ok(Supervised::Gone);
    }
    // Landlock, capabilities, no_new_privs, seccomp.
    linux::confine(job.plan, prep)?;
    // The rlimits fallback of `processes`: counted in the job's own user
    // namespace, so the job's processes alone (the init is one of them).
    if let Some(n) = job.processes {
        let n = n.saturating_add(1);
        nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NPROC, n, n)
            .map_err(at(Step::Rlimits))?;
    }
    Ok(Supervised::Yes)
}

/// Egress by name: hand the proxy's listener to the agent over `to_agent`
/// (`--egress`); nothing for any other network.
#[cfg(target_os = "linux")]
fn hand_over_egress(
    net: &crate::plan::WireNet,
    to_agent: Option<OwnedFd>,
) -> crate::linux::StepResult<()> {
    use crate::linux::Step;
    match (net, to_agent) {
        (crate::plan::WireNet::Egress { port }, Some(to_agent)) => {
            crate::linux::hand_over_egress_listener(*port, to_agent.as_fd())
        }
        (crate::plan::WireNet::Egress { .. }, None) => Err((
            Step::Egress,
            io::Error::other("egress by name without a socket to the agent (--egress)"),
        )),
        _ => Ok(()),
    }
}

/// In the job's init: SIGKILL when the supervisor (the thread that cloned
/// it: the supervisor is single-threaded) exits. Set after the init's last
/// credential change that clears it (entering its user namespace; the
/// capability drop and Landlock that follow only narrow its credentials,
/// which keeps it). `false` if the supervisor died before: its end of
/// `ctl` is closed then (`getppid` cannot tell: the parent is outside the
/// init's PID namespace).
#[cfg(target_os = "linux")]
fn dies_with_supervisor(ctl: &std::os::unix::net::UnixStream) -> io::Result<bool> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
    // A Unix stream socket whose peer closed polls as POLLHUP (always
    // reported, whatever is asked).
    let mut fds = [PollFd::new(ctl.as_fd(), PollFlags::POLLIN)];
    poll(&mut fds, PollTimeout::ZERO)?;
    Ok(!fds[0]
        .revents()
        .is_some_and(|r| r.contains(PollFlags::POLLHUP)))
}

/// In the job's init (pid 1 of its PID namespace): SIGKILL every other
/// process of the namespace and reap them all, so that none is left when
/// the init reports the program's exit (what the kernel does at the init's
/// exit anyway, done before the report instead of after it).
#[cfg(target_os = "linux")]
fn end_namespace() {
    loop {
        // kill(-1) from a PID namespace's init reaches every process of the
        // namespace but the init; none can fork once it is signalled.
        let _ = nix::sys::signal::kill(Pid::from_raw(-1), Signal::SIGKILL);
        match waitpid(Pid::from_raw(-1), None) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            // ECHILD: every process of the namespace descends from the init
            // (orphans are re-parented to it), so none is left.
            Err(_) => return,
        }
    }
}

/// Wait for the init, killing it (and with it the whole job) if the agent
/// goes away. Returns the program's raw wait status.
#[cfg(target_os = "linux")]
fn supervise_init(
    init: Pid,
    ctl: &mut std::os::unix::net::UnixStream,
    lifeline: Option<&OwnedFd>,
    sigfd: &SignalFd,
) -> i32 {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let finish = |ctl: &mut std::os::unix::net::UnixStream, st: WaitStatus| {
        let mut raw = [0u8; 4];
        match ctl.read_exact(&mut raw) {
            Ok(()) => i32::from_be_bytes(raw),
            Err(_) => match st {
                WaitStatus::Signaled(_, sig, _) => sig as i32,
                WaitStatus::Exited(_, code) => (code & 0xff) << 8,
                _ => 0,
            },
        }
    };
    loop {
        match waitpid(init, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => {}
            Ok(st) => return finish(ctl, st),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return 0,
        }
        let mut fds = vec![
            PollFd::new(sigfd.as_fd(), PollFlags::POLLIN),
            PollFd::new(ctl.as_fd(), PollFlags::POLLIN),
        ];
        if let Some(l) = lifeline {
            fds.push(PollFd::new(l.as_fd(), PollFlags::POLLIN));
        }
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => {
                let _ = nix::sys::signal::kill(init, Signal::SIGKILL);
            }
        }
        let ready = |i: usize| {
            fds.get(i)
                .and_then(|f| f.revents())
                .is_some_and(|r| !r.is_empty())
        };
        let (reported, agent_gone) = (ready(1), ready(2));
        while let Ok(Some(_)) = sigfd.read_signal() {}
        if agent_gone {
            let _ = nix::sys::signal::kill(init, Signal::SIGKILL);
        } else if reported {
            // The init wrote the program's status after every other process
            // of the job was reaped (or hung up: it died). The status is the
            // answer; the init's own exit (the namespaces' teardown) is
            // reaped after the report.
            let mut raw = [0u8; 4];
            if ctl.read_exact(&mut raw).is_ok() {
                return i32::from_be_bytes(raw);
            }
            return match wait_for(init) {
                Ok(st) => finish(ctl, st),
                Err(_) => 0,
            };
        }
    }
}

/// In the forked child: become the job's session and exec. Returns what
/// failed (the job never runs then).
fn exec_job(exec: &Exec) -> [u8; 8] {
    // A new session: the job leads its own process group (signals reach the
    // whole job) and, with a tty, gets the PTY as controlling terminal.
    if let Err(e) = nix::unistd::setsid() {
        return failure(FAIL_EXEC, 0, e as i32);
    }
    if exec.tty {
        // SAFETY: fd 0 is the job's terminal here (the spawner or the
        // command line made it so), open for the call.
        let stdin = unsafe { std::os::fd::BorrowedFd::borrow_raw(0) };
        if let Err(e) = sys::set_controlling_tty(stdin) {
            return failure(FAIL_EXEC, 0, e.raw_os_error().unwrap_or(libc::EIO));
        }
    }
    if let Some(cwd) = &exec.cwd {
        if let Err(e) = nix::unistd::chdir(cwd.as_c_str()) {
            return failure(FAIL_EXEC, 0, e as i32);
        }
    }
    if let Some(bytes) = exec.address_space {
        let r = nix::sys::resource::Resource::RLIMIT_AS;
        if let Err(e) = nix::sys::resource::setrlimit(r, bytes, bytes) {
            return failure(FAIL_SANDBOX, STEP_RLIMITS, e as i32);
        }
    }
    if let Some(soft) = exec.open_files {
        // Lowered only (a soft limit above the hard one is refused): the
        // agent's own as it was started, not the one it raised for itself.
        let r = nix::sys::resource::Resource::RLIMIT_NOFILE;
        if let Ok((now, hard)) = nix::sys::resource::getrlimit(r) {
            if soft < now {
                if let Err(e) = nix::sys::resource::setrlimit(r, soft, hard) {
                    return failure(FAIL_SANDBOX, STEP_RLIMITS, e as i32);
                }
            }
        }
    }
    // Default dispositions and an empty mask, whatever the agent had.
    sys::reset_signals(exec.ignored_signals);
    // SAFETY: the path and both lists are NUL-terminated strings and
    // null-terminated pointer arrays prepared in `Exec::new`, alive here.
    unsafe {
        libc::execve(
            exec.path.as_ptr(),
            exec.argv_ptrs.as_ptr(),
            exec.envp_ptrs.as_ptr(),
        )
    };
    failure(FAIL_EXEC, 0, nix::errno::Errno::last_raw())
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
        // Drain the signalfd; the main process's exit is collected by
        // `main_exited` (first: its exit needs no look at the others).
        while let Ok(Some(_)) = sigfd.read_signal() {}
        if let Some(raw) = main_exited(main) {
            return raw;
        }
        reap_others(main);
        if agent_gone {
            kill_job(main);
            return reap_main(main);
        }
    }
}

/// If the main process has exited: kill its group while it is still a
/// zombie (so its pgid cannot have been reused), reap it, and clean up.
fn main_exited(main: Pid) -> Option<i32> {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    match waitid(Id::Pid(main), flags) {
        Ok(WaitStatus::StillAlive) => None,
        Ok(_) => {
            // Its descendants outside the group were re-parented to this
            // subreaper when it exited: `reap_main` kills and reaps them.
            let _ = killpg(main, Signal::SIGKILL);
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
            Ok(st) => match raw_wait_status(st) {
                Some(raw) => break raw,
                None => continue,
            },
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => break 0,
        }
    };
    // No child left (the common end of a job): nothing else to kill. The
    // main process's children were re-parented to this subreaper when it
    // exited, so any live descendant has a live ancestor that is our child.
    if let Err(nix::errno::Errno::ECHILD) = waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
        return raw;
    }
    // Without a `/proc` of this PID namespace no process can be named
    // safely: what is left goes on to the next subreaper.
    if !sys::proc_is_ours() {
        return raw;
    }
    // Everything else dies: kill what is re-parented to us (whole
    // subtrees), reap, repeat until none is left.
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
    let roots: Vec<Pid> = children_of(nix::unistd::getpid())
        .into_iter()
        .filter(|c| Some(*c) != except)
        .collect();
    end_subtrees(&roots);
}

/// Stop, then kill, every process of the subtrees whose roots are
/// `roots` (children of this process): each pass walks the subtrees
/// through the `children` lists of every task, opens each process found
/// as a pidfd (checked to still have the parent it was listed under, so
/// that a reused number is never signalled) and stops it; passes repeat
/// until one finds nothing new (a stopped process forks no more, so a
/// tree that forks as fast as it can is caught whole, however deep); then
/// every one is killed. Killing only the direct children, round after
/// round, let a deep tree under `RLIMIT_NPROC` refill what was killed.
/// Bounded: 100 passes, 100,000 processes. Nothing is done where `/proc`
/// is another PID namespace's ([`sys::proc_is_ours`]).
pub(crate) fn end_subtrees(roots: &[Pid]) {
    if roots.is_empty() || !sys::proc_is_ours() {
        return;
    }
    let me = nix::unistd::getpid().as_raw();
    let mut held: std::collections::HashMap<i32, OwnedFd> = std::collections::HashMap::new();
    for _ in 0..100 {
        let mut found = false;
        let mut stack: Vec<(i32, i32)> = roots.iter().map(|r| (r.as_raw(), me)).collect();
        while let Some((pid, parent)) = stack.pop() {
            if held.len() >= 100_000 {
                break;
            }
            if let std::collections::hash_map::Entry::Vacant(slot) = held.entry(pid) {
                let Ok(fd) = sys::pidfd_open(pid) else {
                    continue; // gone
                };
                if parent_of(pid) != Some(parent) {
                    continue; // gone, and its number another's
                }
                let _ = sys::pidfd_send_signal(fd.as_fd(), libc::SIGSTOP);
                slot.insert(fd);
                found = true;
            }
            for child in all_tasks_children(pid) {
                stack.push((child, pid));
            }
        }
        if !found {
            break;
        }
    }
    for fd in held.values() {
        let _ = sys::pidfd_send_signal(fd.as_fd(), libc::SIGKILL);
    }
}

/// The parent of `pid` (`/proc/PID/stat`), `None` if it is gone.
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The children of every thread of `pid` (a thread's children are listed
/// under that thread), else by a scan of `/proc`.
fn all_tasks_children(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for t in tasks.flatten() {
        let path = t.path().join("children");
        match std::fs::read_to_string(&path) {
            Ok(list) => out.extend(
                list.split_whitespace()
                    .filter_map(|c| c.parse::<i32>().ok()),
            ),
            Err(_) => {
                return children_of(Pid::from_raw(pid))
                    .into_iter()
                    .map(|p| p.as_raw())
                    .collect()
            }
        }
    }
    out
}

/// Direct children of `parent`: from `/proc/PID/task/PID/children` (the
/// supervisor is single-threaded, so its main task has all of them), else
/// by scanning `/proc/*/stat` on kernels without CONFIG_PROC_CHILDREN.
pub(crate) fn children_of(parent: Pid) -> Vec<Pid> {
    if !sys::proc_is_ours() {
        return Vec::new();
    }
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

/// The raw wait status (as `waitpid(2)` stores it) of an exit or a death
/// by signal; `None` for other states.
pub fn raw_wait_status(st: WaitStatus) -> Option<i32> {
    match st {
        WaitStatus::Exited(_, code) => Some((code & 0xff) << 8),
        WaitStatus::Signaled(_, sig, core) => Some((sig as i32) | if core { 0x80 } else { 0 }),
        _ => None,
    }
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
        let args: Vec<OsString> = ["--lifeline", "5", "--status", "7", "--spec", "9"]
            .iter()
            .map(OsString::from)
            .collect();
        let s = Spec::parse(&args).unwrap();
        assert_eq!(s.lifeline, Some(5));
        assert_eq!(s.status, Some(7));
        assert_eq!(s.spec, 9);
        assert!(Spec::parse(&[OsString::from("--status"), OsString::from("1")]).is_err());
        assert!(
            Spec::parse(&[OsString::from("pol")]).is_err(),
            "no policy argument any more"
        );
        assert!(Spec::parse(&args[..4]).is_err(), "--spec is required");
    }

    #[test]
    fn status_messages_round_trip() {
        for st in [
            Status::Started { pid: 4_194_303 },
            Status::ExecFailed {
                errno: libc::ENOENT,
            },
            Status::SandboxFailed {
                step: 18,
                errno: libc::EPERM,
            },
            Status::Exited { raw: 9 | 0x80 },
        ] {
            assert_eq!(Status::decode(st.encode()), Some(st));
        }
        assert_eq!(Status::decode(*b"Z\0\0\0\0"), None);
    }

    #[test]
    fn wait_status_decoding() {
        assert_eq!(decode_wait_status(7 << 8), (Some(7), None));
        assert_eq!(decode_wait_status(15), (None, Some(15)));
        assert_eq!(decode_wait_status(9 | 0x80), (None, Some(9)));
    }
}
