//! Namespaces made ahead: the spawner's pool of namespace sets for the
//! jobs that get a network namespace of their own.
//!
//! Creating namespaces is much of a sandboxed start's namespace work (a
//! network namespace's loopback device and sysctl tables, an IPC
//! namespace's sysctls: about 0.7 ms of the `clone` here). The spawner
//! keeps up to [`TARGET`] sets made before any job asks, each a fresh user
//! namespace with the agent's uid and gid mapped (`setgroups` denied) and
//! a network (`lo` down) and IPC namespace it owns, nothing in any of
//! them: none holds anything of the host's that could change between the
//! making and the job. (A mount namespace does: one copied ahead is the
//! host's mount table as it was then, without a read-only remount, a
//! cover or an unmount made since; so the job's mount namespace is always
//! new, copied when its init is cloned.) A set is handed to exactly one
//! job: its supervisor enters the user and network namespaces (`setns`)
//! and clones the job's init into new PID and mount namespaces from there;
//! the init enters the IPC namespace first thing, and holds its
//! capabilities over all of them, as after a fresh `clone`. The spawner
//! closes its copy at the fork, every other process it forks closes what
//! it inherited of the pool first thing, and a set is never made twice:
//! nothing of one job is ever in another's namespaces.
//!
//! A maker is a short-lived child of the spawner: it unshares the three
//! namespaces, writes its maps, sends the namespace descriptors over a
//! `SOCK_SEQPACKET` socket pair and exits. The spawner refills while idle; a job
//! that finds the pool empty gets fresh namespaces from its own `clone`,
//! as it would without a pool. A maker that fails (no user namespaces
//! here) turns the pool off for the spawner's life: every job then reports
//! the real failure of its own `clone`.
//!
//! Depends on [`executor_sys`] and [`crate::linux`] (the id maps).

use executor_sys as sys;
use nix::sched::CloneFlags;
use nix::sys::socket::{socketpair, AddressFamily, MsgFlags, SockFlag, SockType};
use nix::unistd::ForkResult;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

/// Sets kept ready: enough for a job started while the previous one's
/// set is being replaced.
pub const TARGET: usize = 2;

/// A user namespace and the network and IPC namespaces it owns, as
/// descriptors.
#[derive(Debug)]
pub struct NsSet {
    pub user: OwnedFd,
    pub net: OwnedFd,
    pub ipc: OwnedFd,
}

/// The namespace of a set the job's init enters itself.
#[derive(Debug)]
pub struct InitNs {
    ipc: OwnedFd,
}

impl NsSet {
    /// In the supervisor: enter the user and network namespaces (user
    /// first: it owns the other). Returns what the init enters. Must be
    /// called single-threaded, before the init is cloned.
    pub fn enter(self) -> io::Result<InitNs> {
        nix::sched::setns(self.user.as_fd(), CloneFlags::CLONE_NEWUSER)?;
        nix::sched::setns(self.net.as_fd(), CloneFlags::CLONE_NEWNET)?;
        Ok(InitNs { ipc: self.ipc })
    }
}

impl InitNs {
    /// In the init: enter the IPC namespace (the supervisor never shares
    /// the job's).
    pub fn enter(self) -> io::Result<()> {
        nix::sched::setns(self.ipc.as_fd(), CloneFlags::CLONE_NEWIPC)?;
        Ok(())
    }
}

/// The spawner's pool.
#[derive(Debug, Default)]
pub struct Pool {
    ready: Vec<NsSet>,
    /// The socket of the maker at work.
    making: Option<OwnedFd>,
    /// A maker failed: no more are started.
    off: bool,
    /// The pids of makers forked and not yet reaped (the spawner's
    /// children that are neither supervisors nor orphans).
    makers: Vec<i32>,
}

impl Pool {
    /// A set for one job, if one is ready. The caller owns it alone.
    pub fn take(&mut self) -> Option<NsSet> {
        self.ready.pop()
    }

    /// The socket to poll while a maker is at work.
    pub fn maker_socket(&self) -> Option<BorrowedFd<'_>> {
        self.making.as_ref().map(|s| s.as_fd())
    }

    /// Every descriptor the pool holds (for a forked child to close).
    pub fn descriptors(&self) -> Vec<RawFd> {
        self.ready
            .iter()
            .flat_map(|p| [p.user.as_raw_fd(), p.net.as_raw_fd(), p.ipc.as_raw_fd()])
            .chain(self.making.iter().map(|s| s.as_raw_fd()))
            .collect()
    }

    /// Start a maker unless one is at work, the pool is full or off (the
    /// maker closes every descriptor but its socket first thing).
    ///
    /// # Safety
    /// The caller must be single-threaded (it forks and the child runs
    /// Rust code).
    pub unsafe fn refill(&mut self) {
        if self.off || self.making.is_some() || self.ready.len() >= TARGET {
            return;
        }
        let Ok((ours, theirs)) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        ) else {
            self.off = true;
            return;
        };
        let (uid, gid) = (
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
        );
        // SAFETY: the caller is single-threaded (this function's contract).
        match unsafe { sys::fork_single_threaded() } {
            Ok(ForkResult::Child) => {
                // Made ahead, for a later job: the namespaces' creation
                // (about 1.5 ms of CPU, most of it the network namespace)
                // must not take a core from the job that just started, so
                // the maker runs at the lowest priority (nice 19, not
                // SCHED_IDLE: it takes the network stack's locks, which a
                // starved holder would keep from other jobs).
                sys::lowest_priority();
                // Nothing of the spawner's (its socket to the agent, the
                // pool's other sets) stays in the maker.
                let code = match sys::close_fds_except(&[theirs.as_raw_fd()]) {
                    Ok(()) => make(uid, gid, theirs.as_fd()).map_or(1, |()| 0),
                    Err(_) => 1,
                };
                std::process::exit(code)
            }
            // The spawner reaps it as any child (and reports only its
            // supervisors).
            Ok(ForkResult::Parent { child }) => {
                self.making = Some(ours);
                self.makers.push(child.as_raw());
            }
            Err(_) => self.off = true,
        }
    }

    /// Whether `pid` is a maker of this pool, not yet reaped.
    pub fn is_maker(&self, pid: i32) -> bool {
        self.makers.contains(&pid)
    }

    /// The spawner reaped `pid` (a maker's pid is forgotten then).
    pub fn reaped(&mut self, pid: i32) {
        self.makers.retain(|&m| m != pid);
    }

    /// The maker answered (its socket is readable): keep the set it sent,
    /// or turn the pool off if it sent none.
    pub fn collect(&mut self) {
        let Some(sock) = self.making.take() else {
            return;
        };
        let mut tag = [0u8; 1];
        match sys::recv_fds::<3>(sock.as_fd(), &mut tag, MsgFlags::empty()) {
            Ok(m) if m.bytes == 1 && tag == *b"N" && !m.truncated && m.fds.len() == 3 => {
                let mut fds = m.fds.into_iter();
                if let (Some(user), Some(net), Some(ipc)) = (fds.next(), fds.next(), fds.next()) {
                    self.ready.push(NsSet { user, net, ipc });
                }
            }
            _ => self.off = true,
        }
    }
}

/// In the maker: new user, network and IPC namespaces, the ids mapped,
/// all three sent to the spawner.
fn make(uid: u32, gid: u32, to: BorrowedFd<'_>) -> io::Result<()> {
    nix::sched::unshare(
        CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNET | CloneFlags::CLONE_NEWIPC,
    )?;
    crate::linux::write_id_maps(uid, gid)?;
    let open = |p: &str| -> io::Result<OwnedFd> {
        Ok(nix::fcntl::open(
            p,
            nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )?)
    };
    let user = open("/proc/self/ns/user")?;
    let net = open("/proc/self/ns/net")?;
    let ipc = open("/proc/self/ns/ipc")?;
    sys::send_fds(
        to,
        b"N",
        &[user.as_fd(), net.as_fd(), ipc.as_fd()],
        MsgFlags::empty(),
    )?;
    Ok(())
}
