//! `executor sandbox-exec --spawner`: the one small process that forks every
//! job's supervisor, so that a job costs a fork of a small single-threaded
//! process plus the exec of the program (no fork of the multithreaded agent,
//! no reload of the agent binary per job). The fork happens ahead: after
//! each start (and at its own start) the spawner forks the next job's
//! supervisor, a *standby* ([`Standby`], `executor-ready`) that holds
//! nothing but its own socket and waits there for a job's descriptors; a
//! start hands them over in one message and forks only when no standby is
//! alive.
//!
//! The agent starts it once (before its async runtime, again after it
//! died), with an empty environment, cwd `/` and its end of a
//! `SOCK_SEQPACKET` socketpair as fd 0. Each request is one message: a
//! [`Request`] and, for a fork, [`FORK_FDS`] descriptors by `SCM_RIGHTS`
//! (the job's stdin, stdout, stderr, the lifeline's read end, the status
//! channel's write end, the sealed job-spec memfd), and a seventh for a job
//! with egress by name (the socket on which its init hands the agent the
//! proxy's listener). The spawner holds them only until it has forked: the
//! child closes the spawner's socket and signalfd first thing, makes the
//! three stdio descriptors its 0-2 and runs [`crate::trampoline::run`] on
//! the others, exactly what `executor sandbox-exec --lifeline FD --status
//! FD [--egress FD] --spec FD` runs. Nothing of a request is read here: the
//! spec stays sealed in its memfd.
//!
//! `Ready` gives the spawner the next job's cgroup, made ahead by the agent
//! (its `cgroup.procs` descriptors): the standby joins it while it waits
//! (each join is a cgroup migration, whose cost is mostly the kernel's
//! wait for an RCU grace period: paid while nothing waits), and keeps
//! those descriptors open. At a start, the job's own `cgroup.procs`
//! descriptors that are the same files (device and inode) are not joined
//! again; a job in another cgroup gets a fork of its own, and the standby
//! keeps waiting for the job of the one it joined.
//!
//! Replies ([`Reply`]): `Forked` with the supervisor's pid (or the errno of
//! `fork`) for every fork request, in order; `Exited` with the raw wait
//! status when a supervisor it forked is reaped (the agent's `wait` of the
//! supervisor). `Kill` SIGKILLs a supervisor that is still an unreaped
//! child (its pid cannot have been reused).
//!
//! At start it compiles the seccomp programs of every network shape
//! ([`crate::linux::precompile_seccomp`]): each job's init inherits them by
//! fork and installs them without compiling.
//!
//! It is its jobs' subreaper (`PR_SET_CHILD_SUBREAPER`): what a job left
//! when its supervisor was killed from outside is re-parented here, not
//! to the host's init, and killed at once ([`kill_orphans`]), cgroup or
//! not.
//!
//! It dies with the agent: `PR_SET_PDEATHSIG` (SIGKILL), and EOF on its
//! socket (the agent alone holds the other end). Jobs do not depend on it:
//! each supervisor watches the agent's lifeline itself, so a spawner that
//! is killed leaves its running jobs supervised and reporting.
//!
//! Depends on [`executor_sys`] and [`crate::trampoline`] only.

use crate::nspool::{NsSet, Pool};
use executor_sys as sys;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{send, MsgFlags};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{ForkResult, Pid};
use std::collections::HashSet;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, IntoRawFd, OwnedFd};

/// Descriptors a fork request carries, in this order: stdin, stdout,
/// stderr, lifeline (read end), status (write end), job spec; then, with
/// `egress`, the egress socket (so at most `FORK_FDS + 1`).
pub const FORK_FDS: usize = 6;

/// The most `cgroup.procs` descriptors a fork request carries after the
/// others (one per hierarchy of the job's cgroup: v2, and v1's memory,
/// pids, cpu and cpuacct).
pub const MAX_CGROUP_FDS: usize = 5;

/// Bytes of every message, both ways: a tag, a big-endian `u64`, a
/// big-endian `i32`.
pub const MSG_LEN: usize = 13;

/// What the agent asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// Fork a supervisor for the [`FORK_FDS`] descriptors of the message
    /// (one more with `egress`); `id` comes back in the reply. `netns`: the
    /// job gets a network namespace of its own (the supervisor takes a
    /// set of the namespace pool, [`crate::nspool`], if one is ready).
    /// `cgroups`: that many `cgroup.procs` descriptors follow the others
    /// (at most [`MAX_CGROUP_FDS`]), for the supervisor to join.
    Fork {
        id: u64,
        egress: bool,
        netns: bool,
        cgroups: u8,
    },
    /// SIGKILL this supervisor if it is still an unreaped child.
    Kill { pid: i32 },
    /// The next job's cgroup, made ahead: its `cgroups` `cgroup.procs`
    /// descriptors follow (1 to [`MAX_CGROUP_FDS`]). The standby
    /// supervisor joins it while it waits; no reply.
    Ready { cgroups: u8 },
}

/// What the spawner answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// The answer to `Fork { id }`: the supervisor's pid, or `fork`'s errno.
    Forked { id: u64, result: Result<i32, i32> },
    /// A supervisor was reaped: its raw wait status.
    Exited { pid: i32, raw: i32 },
}

fn encode(tag: u8, a: u64, b: i32) -> [u8; MSG_LEN] {
    let mut m = [0u8; MSG_LEN];
    m[0] = tag;
    m[1..9].copy_from_slice(&a.to_be_bytes());
    m[9..].copy_from_slice(&b.to_be_bytes());
    m
}

fn fields(m: &[u8; MSG_LEN]) -> (u8, u64, i32) {
    let mut a = [0u8; 8];
    a.copy_from_slice(&m[1..9]);
    let mut b = [0u8; 4];
    b.copy_from_slice(&m[9..]);
    (m[0], u64::from_be_bytes(a), i32::from_be_bytes(b))
}

impl Request {
    pub fn encode(self) -> [u8; MSG_LEN] {
        match self {
            Request::Fork {
                id,
                egress,
                netns,
                cgroups,
            } => encode(
                b'F',
                id,
                i32::from(egress) | (i32::from(netns) << 1) | (i32::from(cgroups) << 2),
            ),
            Request::Kill { pid } => encode(b'K', pid as u32 as u64, 0),
            Request::Ready { cgroups } => encode(b'R', 0, i32::from(cgroups)),
        }
    }

    /// `None` for bytes the agent never sends.
    pub fn decode(m: &[u8; MSG_LEN]) -> Option<Request> {
        match fields(m) {
            (b'F', id, e @ 0..=31) if (e >> 2) as usize <= MAX_CGROUP_FDS => Some(Request::Fork {
                id,
                egress: e & 1 == 1,
                netns: e & 2 == 2,
                cgroups: (e >> 2) as u8,
            }),
            (b'K', pid, 0) => i32::try_from(pid)
                .ok()
                .filter(|p| *p > 0)
                .map(|pid| Request::Kill { pid }),
            (b'R', 0, n @ 1..) if n as usize <= MAX_CGROUP_FDS => {
                Some(Request::Ready { cgroups: n as u8 })
            }
            _ => None,
        }
    }
}

impl Reply {
    pub fn encode(self) -> [u8; MSG_LEN] {
        match self {
            Reply::Forked { id, result } => encode(b'F', id, result.unwrap_or_else(|e| -e)),
            Reply::Exited { pid, raw } => encode(b'X', pid as u32 as u64, raw),
        }
    }

    /// `None` for bytes no spawner sends.
    pub fn decode(m: &[u8; MSG_LEN]) -> Option<Reply> {
        match fields(m) {
            (b'F', id, v) if v > 0 => Some(Reply::Forked { id, result: Ok(v) }),
            (b'F', id, v) if v < 0 => Some(Reply::Forked {
                id,
                result: Err(-v),
            }),
            (b'X', pid, raw) => i32::try_from(pid)
                .ok()
                .filter(|p| *p > 0)
                .map(|pid| Reply::Exited { pid, raw }),
            _ => None,
        }
    }
}

/// Serve the agent on the socket at fd 0 until it goes away. Returns the
/// spawner's exit code (0: the agent closed its end).
///
/// Must be called while the process is single-threaded (it forks and the
/// children run Rust code).
pub fn serve() -> io::Result<i32> {
    // Die with the agent, even if it is SIGKILLed (the socket's EOF is the
    // second signal, and covers a parent gone before this call).
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)?;
    // The socket leaves fd 0 (for /dev/null) for a close-on-exec number
    // above 2, and must be ours.
    let sock = nix::fcntl::fcntl(
        std::io::stdin().as_fd(),
        nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(3),
    )
    .map_err(io::Error::from)?;
    // SAFETY: fcntl just returned this new descriptor; nothing owns it.
    let sock = unsafe { OwnedFd::from_raw_fd(sock) };
    let ty = nix::sys::socket::getsockopt(&sock, nix::sys::socket::sockopt::SockType)
        .map_err(io::Error::from)?;
    if ty != nix::sys::socket::SockType::SeqPacket {
        return Err(io::Error::other("fd 0 is not a SOCK_SEQPACKET socket"));
    }
    let null = std::fs::OpenOptions::new().read(true).open("/dev/null")?;
    nix::unistd::dup2_stdin(&null).map_err(io::Error::from)?;
    drop(null);
    sys::close_fds_except(&[sock.as_raw_fd()])?;
    // Signals aimed at the agent's process group or terminal are not ours.
    let _ = nix::unistd::setsid();
    // Every job's orphans come here when its supervisor dies without
    // ending it ([`kill_orphans`]), not to the host's init.
    nix::sys::prctl::set_child_subreaper(true).map_err(io::Error::from)?;
    // Supervisors wait for their jobs (and this process for them): an
    // inherited ignored SIGCHLD would make every wait ECHILD.
    sys::default_sigchld();
    sys::set_process_name(c"executor-spawn");
    // Once here instead of in every job's init (each inherits them).
    #[cfg(target_os = "linux")]
    crate::linux::precompile_seccomp()?;
    // Read once here, after the last change to this process's signal
    // dispositions; every supervisor and init inherits the answers.
    sys::ignored_signals();
    sys::cap_last_cap();
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    mask.thread_block().map_err(io::Error::from)?;
    let sigfd = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(io::Error::from)?;
    let mut children = HashSet::new();
    let mut pool = Pool::default();
    // SAFETY: the spawner is single-threaded (`serve`'s contract).
    let mut standby = unsafe { Standby::fork(&sock, &sigfd, &pool) };
    // The next job's cgroup, made ahead, while no standby has it.
    let mut next_cgroup: Option<Vec<OwnedFd>> = None;
    loop {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let ready = |f: &PollFd<'_>| f.revents().is_some_and(|r| !r.is_empty());
        let (sock_ready, made) = {
            let mut fds = vec![
                PollFd::new(sigfd.as_fd(), PollFlags::POLLIN),
                PollFd::new(sock.as_fd(), PollFlags::POLLIN),
            ];
            fds.extend(
                pool.maker_socket()
                    .map(|m| PollFd::new(m, PollFlags::POLLIN)),
            );
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
            (ready(&fds[1]), fds.get(2).is_some_and(ready))
        };
        if made {
            pool.collect();
            // Up to the pool's target, one maker after another.
            // SAFETY: the spawner is single-threaded (`serve`'s contract).
            unsafe { pool.refill() };
        }
        while let Ok(Some(_)) = sigfd.read_signal() {}
        let served = reap(&sock, &mut children, &mut standby, &mut pool).and_then(|()| {
            Ok(!sock_ready
                || answer(
                    &sock,
                    &sigfd,
                    &mut children,
                    &mut pool,
                    &mut standby,
                    &mut next_cgroup,
                )?)
        });
        match served {
            Ok(true) => {
                if standby.is_none() {
                    // The standby died waiting (its cgroup made ahead
                    // was ended): another, given the next job's cgroup
                    // if one waits.
                    // SAFETY: the spawner is single-threaded (`serve`'s
                    // contract).
                    standby = unsafe { Standby::fork(&sock, &sigfd, &pool) };
                    if let (Some(s), Some(r)) = (standby.as_mut(), next_cgroup.as_ref()) {
                        if s.offer(r) {
                            next_cgroup = None;
                        }
                    }
                }
            }
            Ok(false) => return Ok(0),
            // The agent is gone (it exited with replies unread): the end of
            // the spawner's work, not an error to print on the user's
            // terminal.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
                ) =>
            {
                return Ok(0)
            }
            Err(e) => return Err(e),
        }
    }
}

/// Reap every child that exited and report each supervisor's exit (a
/// pool maker's exit is not reported: the agent never asked for it, nor a
/// standby's that died waiting, nor an orphan's: they are forgotten).
/// Orphans may have come here meanwhile when a child was killed by a
/// signal (a supervisor that ends normally has killed and reaped its job's
/// processes first; one killed from outside has not), or an orphan died:
/// they are ended ([`kill_orphans`]) before any exit is reported.
fn reap(
    sock: &OwnedFd,
    children: &mut HashSet<i32>,
    standby: &mut Option<Standby>,
    pool: &mut Pool,
) -> io::Result<()> {
    let mut orphans_may_come = false;
    let mut exited = Vec::new();
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => break,
            Ok(st) => {
                if let (Some(pid), Some(raw)) = (st.pid(), crate::trampoline::raw_wait_status(st)) {
                    let pid = pid.as_raw();
                    let maker = pool.is_maker(pid);
                    pool.reaped(pid);
                    let is_standby = standby.as_ref().is_some_and(|s| s.pid == pid);
                    let supervisor = children.remove(&pid);
                    orphans_may_come |= matches!(st, WaitStatus::Signaled(..))
                        || !(maker || is_standby || supervisor);
                    if !supervisor {
                        if is_standby {
                            *standby = None;
                        }
                        continue;
                    }
                    exited.push(Reply::Exited { pid, raw });
                }
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => break, // ECHILD: none left
        }
    }
    // What a supervisor killed from outside left dies before its exit is
    // reported.
    if orphans_may_come {
        kill_orphans(|pid| {
            children.contains(&pid)
                || standby.as_ref().is_some_and(|s| s.pid == pid)
                || pool.is_maker(pid)
        });
    }
    for r in exited {
        reply(sock, r)?;
    }
    Ok(())
}

/// End every child of the spawner that `known` does not name, with all
/// its descendants: the spawner is its jobs' subreaper, so those are
/// processes of a job whose supervisor died without ending it (killed
/// from outside), re-parented here, whichever session they made and
/// whatever parent-death signal they cleared. Their subtrees are stopped
/// whole, then killed ([`crate::trampoline::end_subtrees`]): a tree that
/// keeps forking is caught however deep. A child's pid cannot be reused
/// while it is an unreaped child, and only this single-threaded process
/// reaps. Nothing is done where `/proc` is another PID namespace's (its
/// numbers are not this one's).
fn kill_orphans(known: impl Fn(i32) -> bool) {
    // (`children_of` lists nothing where `/proc` is not this namespace's.)
    let roots: Vec<Pid> = crate::trampoline::children_of(nix::unistd::getpid())
        .into_iter()
        .filter(|p| !known(p.as_raw()))
        .collect();
    crate::trampoline::end_subtrees(&roots);
}

fn reply(sock: &OwnedFd, r: Reply) -> io::Result<()> {
    loop {
        match send(sock.as_raw_fd(), &r.encode(), MsgFlags::MSG_NOSIGNAL) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Take one request off the socket and answer it; `false` at EOF.
fn answer(
    sock: &OwnedFd,
    sigfd: &SignalFd,
    children: &mut HashSet<i32>,
    pool: &mut Pool,
    standby: &mut Option<Standby>,
    ready: &mut Option<Vec<OwnedFd>>,
) -> io::Result<bool> {
    let mut buf = [0u8; MSG_LEN];
    let msg = match sys::recv_fds::<{ FORK_FDS + 1 + MAX_CGROUP_FDS }>(
        sock.as_fd(),
        &mut buf,
        MsgFlags::empty(),
    ) {
        Ok(m) => m,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
            ) =>
        {
            return Ok(true)
        }
        Err(e) => return Err(e),
    };
    let sys::Received {
        bytes: len,
        truncated,
        fds,
    } = msg;
    if len == 0 && fds.is_empty() {
        return Ok(false);
    }
    let request = (len == MSG_LEN && !truncated)
        .then(|| Request::decode(&buf))
        .flatten();
    match request {
        Some(Request::Fork {
            id,
            egress,
            netns,
            cgroups,
        }) => {
            // Every start takes the place of the next job made ahead: the
            // agent sends the next one after it.
            *ready = None;
            if fds.len() != FORK_FDS + usize::from(egress) + usize::from(cgroups) {
                let result = Err(libc::EINVAL);
                return reply(sock, Reply::Forked { id, result }).map(|()| true);
            }
            let set = if netns { pool.take() } else { None };
            // A standby that joined the cgroup made ahead waits for the
            // job that is to run there; another job gets a fork of its own.
            let job_cgroups = &fds[fds.len() - usize::from(cgroups)..];
            let handed = match standby.take() {
                Some(s) if s.suits(job_cgroups) => s.hand_over(&fds, egress, cgroups, set.as_ref()),
                kept => {
                    *standby = kept;
                    None
                }
            };
            let result = match handed {
                Some(pid) => Ok(pid),
                // SAFETY: the spawner is single-threaded (`serve`'s
                // contract).
                None => match unsafe { sys::fork_single_threaded() } {
                    Ok(ForkResult::Child) => {
                        close_spawner_fds(sock, sigfd, pool);
                        supervisor(fds, egress, set, &[])
                    }
                    Ok(ForkResult::Parent { child }) => Ok(child.as_raw()),
                    Err(e) => Err(e.raw_os_error().unwrap_or(libc::EAGAIN)),
                },
            };
            if let Ok(pid) = result {
                children.insert(pid);
            }
            // The set is the supervisor's alone: the spawner's copy goes.
            drop(set);
            drop(fds);
            reply(sock, Reply::Forked { id, result })?;
            // The next job's supervisor, forked now that this one is
            // answered (unless the standby was kept).
            if standby.is_none() {
                // SAFETY: the spawner is single-threaded (`serve`'s contract).
                *standby = unsafe { Standby::fork(sock, sigfd, pool) };
            }
            if let (Some(s), Some(r)) = (standby.as_mut(), ready.as_ref()) {
                if s.offer(r) {
                    *ready = None;
                }
            }
            if netns {
                // SAFETY: the spawner is single-threaded (`serve`'s
                // contract).
                unsafe { pool.refill() };
            }
        }
        Some(Request::Kill { pid }) => {
            if children.contains(&pid) {
                let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        Some(Request::Ready { cgroups }) if fds.len() == usize::from(cgroups) => {
            // To the standby now (it joins while it waits), else to the
            // next one forked.
            let offered = standby.as_mut().is_some_and(|s| s.offer(&fds));
            *ready = (!offered).then_some(fds);
        }
        Some(Request::Ready { .. }) => {
            let mut e = std::io::stderr();
            let _ = std::io::Write::write_all(
                &mut e,
                b"executor sandbox-exec --spawner: ignored a ready cgroup with the wrong number of descriptors\n",
            );
        }
        None => {
            // Not something the agent sends: dropped (with its fds).
            let mut e = std::io::stderr();
            let _ = std::io::Write::write_all(
                &mut e,
                b"executor sandbox-exec --spawner: ignored a malformed request\n",
            );
        }
    }
    Ok(true)
}

/// A supervisor forked ahead of its job, while the spawner had nothing to
/// do: it waits on its own socket for the job's descriptors, so that a
/// start costs the spawner one message instead of a fork (and the job none
/// of the fork's page-table copy). It is a fork of the spawner like any
/// supervisor, holds nothing of the spawner's, the pool's or another job's
/// (it closes them first thing), and ends when the spawner's end of its
/// socket closes (the spawner exited) or when it was never handed a job.
/// Until then it is `executor-ready`; with a job, `executor`.
struct Standby {
    pid: i32,
    sock: OwnedFd,
    /// The identities of the `cgroup.procs` of the cgroup made ahead it
    /// was offered (and has joined, or joins at its job's start).
    ahead: Vec<(u64, u64)>,
}

impl Standby {
    /// Fork a standby supervisor (`None` if the fork failed: the next job
    /// is forked for then).
    ///
    /// # Safety
    /// The caller is single-threaded (the child runs Rust code).
    unsafe fn fork(sock: &OwnedFd, sigfd: &SignalFd, pool: &Pool) -> Option<Standby> {
        use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .ok()?;
        // SAFETY: forwarded from the caller's contract.
        match unsafe { sys::fork_single_threaded() } {
            Ok(ForkResult::Child) => {
                drop(ours);
                close_spawner_fds(sock, sigfd, pool);
                wait_for_job(theirs)
            }
            Ok(ForkResult::Parent { child }) => Some(Standby {
                pid: child.as_raw(),
                sock: ours,
                ahead: Vec::new(),
            }),
            Err(_) => None,
        }
    }

    /// Send the next job's cgroup (its `cgroup.procs` descriptors) for the
    /// standby to join while it waits; `false` if it is gone.
    fn offer(&mut self, procs: &[OwnedFd]) -> bool {
        let all: Vec<_> = procs.iter().map(|f| f.as_fd()).collect();
        let Ok(cgroups) = u8::try_from(all.len()) else {
            return false;
        };
        let msg = Request::Ready { cgroups }.encode();
        let sent = matches!(
            sys::send_fds(self.sock.as_fd(), &msg, &all, MsgFlags::MSG_NOSIGNAL),
            Ok(MSG_LEN)
        );
        if sent {
            self.ahead = procs.iter().filter_map(identity).collect();
        }
        sent
    }

    /// Whether it is the supervisor for a job in the cgroups of `procs`:
    /// it was offered none made ahead, or this job's is that one.
    fn suits(&self, procs: &[OwnedFd]) -> bool {
        self.ahead.is_empty()
            || procs
                .iter()
                .filter_map(identity)
                .any(|id| self.ahead.contains(&id))
    }

    /// Send the job's descriptors (and the pool's set for it): the pid of
    /// the supervisor that has them, or `None` if the standby is gone. It
    /// is never signalled: a standby that died was reaped (and not
    /// reported: the agent never asked for it), so its pid may be another
    /// process's now; one that is alive and could not be sent to ends at
    /// the EOF of its socket, closed here.
    fn hand_over(
        self,
        fds: &[OwnedFd],
        egress: bool,
        cgroups: u8,
        set: Option<&NsSet>,
    ) -> Option<i32> {
        let mut all: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
        if let Some(set) = set {
            all.extend([set.user.as_fd(), set.net.as_fd(), set.ipc.as_fd()]);
        }
        let msg = Request::Fork {
            id: 0,
            egress,
            netns: set.is_some(),
            cgroups,
        }
        .encode();
        match sys::send_fds(self.sock.as_fd(), &msg, &all, MsgFlags::MSG_NOSIGNAL) {
            Ok(MSG_LEN) => Some(self.pid),
            _ => None,
        }
    }
}

/// In a child of the spawner, first thing: nothing of the spawner reaches
/// the job (nor the pool's sets, which are other jobs').
fn close_spawner_fds(sock: &OwnedFd, sigfd: &SignalFd, pool: &Pool) {
    // SAFETY: these are the spawner's own descriptors, open, and this
    // child never uses them again (the borrowed owners are never dropped:
    // the child leaves by `exit`).
    unsafe {
        libc::close(sock.as_raw_fd());
        libc::close(sigfd.as_fd().as_raw_fd());
        for fd in pool.descriptors() {
            libc::close(fd);
        }
    }
}

/// The standby's life: wait for one job's descriptors on `mine`, then be
/// its supervisor. Before them may come the next job's cgroup, made ahead
/// ([`Request::Ready`]): it joins it at once (the migration is paid while
/// nothing waits) and keeps those `cgroup.procs` open, so that the job's
/// own descriptors, if they are the same files, need no join at its start.
/// EOF (the spawner is gone) or anything but a well-formed message ends it.
fn wait_for_job(mine: OwnedFd) -> ! {
    sys::set_process_name(c"executor-ready");
    let mut joined: Vec<OwnedFd> = Vec::new();
    let mut buf = [0u8; MSG_LEN];
    loop {
        let msg = match sys::recv_fds::<{ FORK_FDS + 4 + MAX_CGROUP_FDS }>(
            mine.as_fd(),
            &mut buf,
            MsgFlags::empty(),
        ) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => other,
        };
        let Ok(sys::Received {
            bytes: MSG_LEN,
            truncated: false,
            mut fds,
        }) = msg
        else {
            std::process::exit(0)
        };
        match Request::decode(&buf) {
            Some(Request::Ready { cgroups }) if fds.len() == usize::from(cgroups) => {
                // Those it could not join are joined (or their error
                // reported) at the job's start, as without one made ahead.
                joined = fds.into_iter().filter(join).collect();
            }
            Some(Request::Fork {
                egress,
                netns: set,
                cgroups,
                ..
            }) => {
                drop(mine);
                if fds.len()
                    != FORK_FDS + usize::from(egress) + usize::from(cgroups) + 3 * usize::from(set)
                {
                    std::process::exit(126);
                }
                let set = set.then(|| {
                    let mut take = || fds.pop().expect("counted above");
                    let (ipc, net, user) = (take(), take(), take());
                    NsSet { user, net, ipc }
                });
                supervisor(fds, egress, set, &joined)
            }
            _ => std::process::exit(126),
        }
    }
}

/// Join the cgroup whose `cgroup.procs` is `procs` (`0`: the writer).
fn join(procs: &OwnedFd) -> bool {
    matches!(nix::unistd::write(procs, b"0"), Ok(1))
}

/// The identity of an open file.
// The casts: `dev_t` and `ino_t` are not `u64` on every target.
#[allow(clippy::unnecessary_cast)]
fn identity(f: &OwnedFd) -> Option<(u64, u64)> {
    nix::sys::stat::fstat(f)
        .ok()
        .map(|st| (st.st_dev as u64, st.st_ino as u64))
}

/// In a child of the spawner that holds nothing of it any more: become
/// the job's supervisor. `fds` holds [`FORK_FDS`] descriptors, then the
/// egress socket (with `egress`), then the job's `cgroup.procs`
/// descriptors; `set`, the namespaces of the pool this job alone enters;
/// `joined`, the `cgroup.procs` of the cgroups this process is in already
/// (a standby's, made ahead): a job's descriptor that is the same file is
/// not joined again.
fn supervisor(fds: Vec<OwnedFd>, egress: bool, set: Option<NsSet>, joined: &[OwnedFd]) -> ! {
    // `executor` as every helper of the agent (the spawner alone is
    // `executor-spawn`); argv stays the spawner's (`executor sandbox-exec
    // --spawner`).
    sys::set_process_name(c"executor");
    let mut fds = fds.into_iter();
    let (Some(stdin), Some(stdout), Some(stderr), Some(lifeline), Some(status), Some(spec)) = (
        fds.next(),
        fds.next(),
        fds.next(),
        fds.next(),
        fds.next(),
        fds.next(),
    ) else {
        std::process::exit(126)
    };
    let egress = if egress { fds.next() } else { None };
    // The rest: the job's `cgroup.procs` descriptors, less those of the
    // cgroups joined ahead (the same file: same device and inode, held
    // open since the join, so neither can be another's now).
    let ahead: Vec<_> = joined.iter().filter_map(identity).collect();
    let cgroups: Vec<_> = fds
        .filter(|f| identity(f).is_none_or(|id| !ahead.contains(&id)))
        .map(IntoRawFd::into_raw_fd)
        .collect();
    let stdio = nix::unistd::dup2_stdin(&stdin)
        .and_then(|()| nix::unistd::dup2_stdout(&stdout))
        .and_then(|()| nix::unistd::dup2_stderr(&stderr));
    if stdio.is_err() {
        std::process::exit(126);
    }
    drop((stdin, stdout, stderr));
    let spec = crate::trampoline::Spec {
        lifeline: Some(lifeline.into_raw_fd()),
        status: Some(status.into_raw_fd()),
        spec: spec.into_raw_fd(),
        egress: egress.map(IntoRawFd::into_raw_fd),
        cgroups,
        namespaces: set.map(|s| {
            [
                s.user.into_raw_fd(),
                s.net.into_raw_fd(),
                s.ipc.into_raw_fd(),
            ]
        }),
    };
    std::process::exit(crate::trampoline::run_reporting(Ok(spec)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        for r in [
            Request::Fork {
                id: u64::MAX,
                egress: false,
                netns: false,
                cgroups: 0,
            },
            Request::Fork {
                id: 1,
                egress: true,
                netns: false,
                cgroups: 5,
            },
            Request::Fork {
                id: 2,
                egress: true,
                netns: true,
                cgroups: 2,
            },
            Request::Fork {
                id: 3,
                egress: false,
                netns: true,
                cgroups: 1,
            },
            Request::Kill { pid: 4_194_303 },
            Request::Ready { cgroups: 1 },
            Request::Ready { cgroups: 5 },
        ] {
            assert_eq!(Request::decode(&r.encode()), Some(r));
        }
        // More cgroup descriptors than a job has hierarchies: not a request.
        assert_eq!(Request::decode(&encode(b'F', 1, 6 << 2)), None);
        // A cgroup made ahead has 1 to MAX_CGROUP_FDS descriptors, no id.
        for bad in [0, 6, -1] {
            assert_eq!(Request::decode(&encode(b'R', 0, bad)), None, "{bad}");
        }
        assert_eq!(Request::decode(&encode(b'R', 1, 1)), None);
        for r in [
            Reply::Forked {
                id: 7,
                result: Ok(123),
            },
            Reply::Forked {
                id: 8,
                result: Err(libc::EAGAIN),
            },
            Reply::Exited {
                pid: 99,
                raw: 9 | 0x80,
            },
        ] {
            assert_eq!(Reply::decode(&r.encode()), Some(r));
        }
        assert_eq!(Request::decode(&encode(b'K', 0, 0)), None, "pid 0");
        assert_eq!(Request::decode(&encode(b'K', 1 << 40, 0)), None);
        assert_eq!(Request::decode(&encode(b'Z', 1, 0)), None);
        for bad in [6 << 2, 32, 63, -1, i32::MIN] {
            assert_eq!(Request::decode(&encode(b'F', 1, bad)), None, "flags {bad}");
        }
        assert_eq!(
            Reply::decode(&encode(b'F', 1, 0)),
            None,
            "neither pid nor errno"
        );
    }
}
