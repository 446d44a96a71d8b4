//! The agent's side of the spawner ([`executor_sandbox::spawner`]): the
//! small single-threaded process that forks every job's supervisor, asked
//! over a `SOCK_SEQPACKET` socketpair. The agent itself never forks for a
//! job.
//!
//! One spawner serves the agent at a time. It is started at agent start
//! ([`start`], from the main thread before the runtime) and again when it
//! is found dead (EOF on its socket, or a request it could not take): a
//! request that never reached it is retried once on the new one; a request
//! it took and died on is answered by the job's status channel (the
//! supervisor ran, or EOF: nothing ran, `internal`). Nothing waits on a
//! dead spawner.
//!
//! A reader task takes every reply off the socket: fork answers go to the
//! request that asked (by id), exits to the [`Supervisor`] of that pid.
//!
//! Depends on `executor_sandbox::spawner` (the messages), tokio and nix.

use executor_protocol::{ErrorCode, WireError};
use executor_sandbox::spawner::{Reply, Request, FORK_FDS, MSG_LEN};
use nix::sys::socket::{send, socketpair, AddressFamily, MsgFlags, SockFlag, SockType};
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::Interest;
use tokio::net::UnixDatagram;
use tokio::sync::oneshot;

/// A spawner process and the agent's end of its socket.
#[derive(Debug)]
struct Process {
    sock: OwnedFd,
    child: std::process::Child,
}

/// A connected spawner.
#[derive(Debug)]
struct Conn {
    /// A `SOCK_SEQPACKET` socket driven as tokio's datagram socket (the
    /// same send/recv calls; messages keep their boundaries; EOF reads 0).
    sock: UnixDatagram,
    state: Mutex<State>,
    next_id: AtomicU64,
    /// The spawner process (killed when it stops answering).
    pid: u32,
}

#[derive(Debug, Default)]
struct State {
    /// Fork requests sent and not yet answered.
    /// Fork requests sent and not yet answered, each with its start's
    /// [`turn`] (released with the answer: the spawner holds the request's
    /// descriptors until then).
    forks: HashMap<u64, (oneshot::Sender<Result<Forked, i32>>, Turn)>,
    /// Supervisors forked and not yet reaped.
    exits: HashMap<i32, oneshot::Sender<i32>>,
    dead: bool,
}

#[derive(Debug)]
struct Forked {
    pid: i32,
    exit: oneshot::Receiver<i32>,
}

/// Starts between their first descriptor and the spawner's answer: bounds
/// the descriptors a burst of starts holds at once (and those in flight to
/// the spawner, which the kernel counts against the agent's
/// `RLIMIT_NOFILE`).
static STARTING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(16);

/// A start's turn (`None` only if the semaphore were closed, which it
/// never is).
pub type Turn = Option<tokio::sync::SemaphorePermit<'static>>;

/// Wait for a turn to prepare a job's descriptors and ask the spawner;
/// [`fork`] takes it and releases it when the spawner answers.
pub async fn turn() -> Turn {
    STARTING.acquire().await.ok()
}

/// Started by [`start`], connected at the first job.
static EARLY: Mutex<Option<Process>> = Mutex::new(None);
static CURRENT: Mutex<Option<Arc<Conn>>> = Mutex::new(None);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Start the spawner now (the agent's `main`, before the async runtime).
pub fn start() -> io::Result<()> {
    let p = launch()?;
    *lock(&EARLY) = Some(p);
    Ok(())
}

/// `/proc/self/exe sandbox-exec --spawner` with its socket as fd 0, an
/// empty environment and cwd `/` (so no supervisor holds the agent's).
fn launch() -> io::Result<Process> {
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )?;
    let child = std::process::Command::new("/proc/self/exe")
        .arg0("executor")
        .args(["sandbox-exec", "--spawner"])
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::from(theirs))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?;
    Ok(Process { sock: ours, child })
}

fn internal(what: &str, e: impl std::fmt::Display) -> WireError {
    WireError::new(ErrorCode::Internal, format!("{what}: {e}"))
}

/// The live spawner, started or restarted as needed.
fn conn() -> Result<Arc<Conn>, WireError> {
    let mut current = lock(&CURRENT);
    if let Some(c) = current.as_ref().filter(|c| !lock(&c.state).dead) {
        return Ok(c.clone());
    }
    let early = lock(&EARLY).take();
    let p = match early {
        Some(p) => p,
        None => launch().map_err(|e| internal("cannot start the spawner", e))?,
    };
    let sock = std::os::unix::net::UnixDatagram::from(p.sock);
    sock.set_nonblocking(true)
        .map_err(|e| internal("spawner socket", e))?;
    let sock = UnixDatagram::from_std(sock).map_err(|e| internal("spawner socket", e))?;
    let c = Arc::new(Conn {
        sock,
        state: Mutex::new(State::default()),
        next_id: AtomicU64::new(1),
        pid: p.child.id(),
    });
    tokio::spawn(read_replies(c.clone(), p.child));
    *current = Some(c.clone());
    Ok(c)
}

impl Conn {
    /// Mark dead and fail everything that waits on it.
    fn die(&self) {
        let mut st = lock(&self.state);
        st.dead = true;
        st.forks.clear();
        st.exits.clear();
    }

    fn dispatch(&self, r: Reply) {
        let mut st = lock(&self.state);
        match r {
            Reply::Forked { id, result } => {
                let result = result.map(|pid| {
                    let (tx, exit) = oneshot::channel();
                    st.exits.insert(pid, tx);
                    Forked { pid, exit }
                });
                if let Some((tx, _turn)) = st.forks.remove(&id) {
                    let _ = tx.send(result);
                }
            }
            Reply::Exited { pid, raw } => {
                if let Some(tx) = st.exits.remove(&pid) {
                    let _ = tx.send(raw);
                }
            }
        }
    }
}

/// Every reply of one spawner, until it goes away; then reap it.
async fn read_replies(c: Arc<Conn>, mut child: std::process::Child) {
    let mut buf = [0u8; MSG_LEN];
    loop {
        let got = c.sock.recv(&mut buf).await;
        match got {
            Ok(MSG_LEN) => match Reply::decode(&buf) {
                Some(r) => c.dispatch(r),
                None => {
                    tracing::warn!("the spawner sent a malformed reply; restarting it");
                    break;
                }
            },
            Ok(0) => break,
            Ok(n) => {
                tracing::warn!(bytes = n, "the spawner sent a short reply; restarting it");
                break;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the spawner's replies; restarting it");
                break;
            }
        }
    }
    c.die();
    tracing::debug!(pid = child.id(), "spawner gone");
    let _ = tokio::task::spawn_blocking(move || {
        let _ = child.kill();
        child.wait()
    })
    .await;
}

/// A job's supervisor as the agent sees it: its pid and exit come from
/// the spawner that forked it. The spawner's answer to the fork is taken
/// when it is needed (to wait for or kill the supervisor, or to explain a
/// start that failed), not before the job's own status is read.
#[derive(Debug)]
pub struct Supervisor {
    /// The spawner's answer to the fork, until it is taken.
    answer: Option<oneshot::Receiver<Result<Forked, i32>>>,
    pid: Option<i32>,
    /// `fork`'s errno, when the spawner could not fork.
    fork_errno: Option<i32>,
    exit: Option<oneshot::Receiver<i32>>,
    status: Option<ExitStatus>,
    conn: Option<Arc<Conn>>,
}

impl Supervisor {
    /// Take the spawner's answer to the fork (once). A spawner that died
    /// without answering leaves the pid unknown: the job's status channel
    /// says whether it runs.
    async fn settle(&mut self) {
        let Some(answer) = self.answer.take() else {
            return;
        };
        match answer.await {
            Ok(Ok(f)) => {
                self.pid = Some(f.pid);
                self.exit = Some(f.exit);
            }
            Ok(Err(errno)) => self.fork_errno = Some(errno),
            Err(_) => {}
        }
    }

    /// The error of a fork the spawner could not make (then nothing ran:
    /// the job's descriptors were closed unused).
    pub async fn fork_error(&mut self) -> Option<WireError> {
        self.settle().await;
        self.fork_errno.map(|errno| {
            WireError::new(
                ErrorCode::Io,
                format!("starting the job: {}", io::Error::from_raw_os_error(errno)),
            )
            .with("errno", errno)
        })
    }

    /// Its exit status, once its spawner reaped it; an error when that
    /// spawner is gone or never forked it (the job's status channel is the
    /// real answer).
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        if let Some(st) = self.status {
            return Ok(st);
        }
        self.settle().await;
        let exit = self
            .exit
            .as_mut()
            .ok_or_else(|| io::Error::other("the supervisor's spawner did not answer"))?;
        let raw = exit
            .await
            .map_err(|_| io::Error::other("the spawner ended before the supervisor"))?;
        let st = ExitStatus::from_raw(raw);
        self.exit = None;
        self.status = Some(st);
        Ok(st)
    }

    /// A start that timed out: make sure the job never runs or runs no
    /// more. A fork the spawner answered is killed like any supervisor; one
    /// it has not answered may still sit in its queue (a stopped spawner),
    /// so the spawner itself is SIGKILLed (the queue dies with it) and the
    /// next start gets a new one. Waiting starts fail as with any dead
    /// spawner.
    pub async fn abandon(&mut self) {
        if let Some(mut answer) = self.answer.take() {
            match answer.try_recv() {
                Ok(Ok(f)) => {
                    self.pid = Some(f.pid);
                    self.exit = Some(f.exit);
                }
                Ok(Err(errno)) => self.fork_errno = Some(errno),
                // The spawner is gone already (its queue with it); its pid
                // may be another process's by now.
                Err(oneshot::error::TryRecvError::Closed) => return,
                Err(oneshot::error::TryRecvError::Empty) => {
                    if let Some(c) = &self.conn {
                        if lock(&c.state).dead {
                            return;
                        }
                        c.die();
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(c.pid as i32),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                    return;
                }
            }
        }
        self.kill().await;
    }

    /// SIGKILL it (through its spawner, which knows it is not reaped yet).
    pub async fn kill(&mut self) {
        self.settle().await;
        if let (Some(pid), Some(c), None) = (self.pid, &self.conn, self.status) {
            let _ = send(
                c.sock.as_raw_fd(),
                &Request::Kill { pid }.encode(),
                MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
            );
        }
    }
}

/// Ask the spawner to fork a supervisor for these descriptors (stdin,
/// stdout, stderr, lifeline read end, status write end, job spec, and the
/// egress socket for a job with egress by name, then `cgroups` descriptors
/// of the job's `cgroup.procs` files); `netns`: the job gets a
/// network namespace of its own (the spawner hands it a pair of its
/// namespace pool when it has one). Returns once the request
/// is sent (the descriptors are in flight: the caller closes its copies);
/// the spawner's answer is taken by the [`Supervisor`] when needed.
pub async fn fork(
    fds: &[BorrowedFd<'_>],
    cgroups: usize,
    netns: bool,
    turn: Turn,
) -> Result<Supervisor, WireError> {
    let mut turn = Some(turn);
    if cgroups > executor_sandbox::spawner::MAX_CGROUP_FDS {
        return Err(internal("a fork request with too many cgroups", cgroups));
    }
    let egress = match fds.len().checked_sub(cgroups) {
        Some(FORK_FDS) => false,
        Some(n) if n == FORK_FDS + 1 => true,
        n => {
            return Err(internal(
                "a fork request with the wrong number of descriptors",
                format!("{n:?}"),
            ))
        }
    };
    let cgroups = cgroups as u8;
    let mut last = None;
    // A second try only when the first spawner never took the request.
    for _ in 0..2 {
        let c = conn()?;
        let id = c.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, answer) = oneshot::channel();
        {
            let mut st = lock(&c.state);
            if st.dead {
                continue;
            }
            st.forks.insert(id, (tx, turn.take().flatten()));
        }
        let msg = Request::Fork {
            id,
            egress,
            netns,
            cgroups,
        }
        .encode();
        let sent = c
            .sock
            .async_io(Interest::WRITABLE, || {
                executor_sys::send_fds(c.sock.as_fd(), &msg, fds, MsgFlags::MSG_NOSIGNAL)
            })
            .await;
        if let Err(e) = sent {
            turn = lock(&c.state).forks.remove(&id).map(|(_, t)| t);
            let gone = matches!(
                e.raw_os_error(),
                Some(libc::EPIPE | libc::ECONNRESET | libc::ENOTCONN | libc::ECONNREFUSED)
            );
            if !gone {
                return Err(internal("cannot send the spawner a request", e));
            }
            c.die();
            last = Some(e);
            continue;
        }
        return Ok(Supervisor {
            answer: Some(answer),
            pid: None,
            fork_errno: None,
            exit: None,
            status: None,
            conn: Some(c),
        });
    }
    Err(internal(
        "the spawner went away twice before taking the request",
        last.map_or_else(|| "gone".to_string(), |e| e.to_string()),
    ))
}

/// Offer the spawner the next job's cgroup, made ahead (its
/// `cgroup.procs` descriptors): its standby supervisor joins it while it
/// waits, and the start whose cgroup it is skips the join. Synchronous
/// (the socket is non-blocking): the caller holds the lock that keeps
/// every start from using this cgroup until the offer is queued, ahead of
/// that start's fork request. No answer; a spawner that is not running,
/// busy or replaced before the start only costs that start the join.
pub fn offer_ready(procs: &[&OwnedFd]) {
    let Ok(cgroups) = u8::try_from(procs.len()) else {
        return;
    };
    if cgroups == 0 || usize::from(cgroups) > executor_sandbox::spawner::MAX_CGROUP_FDS {
        return;
    }
    let Some(c) = lock(&CURRENT)
        .as_ref()
        .filter(|c| !lock(&c.state).dead)
        .cloned()
    else {
        return;
    };
    let fds: Vec<BorrowedFd<'_>> = procs.iter().map(|f| f.as_fd()).collect();
    let msg = Request::Ready { cgroups }.encode();
    if let Err(e) = executor_sys::send_fds(
        c.sock.as_fd(),
        &msg,
        &fds,
        MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
    ) {
        tracing::debug!(error = %e, "cannot offer the spawner the next job's cgroup");
    }
}
