//! Namespaces made ahead: the spawner's pool of namespace sets for the
//! jobs that get a network namespace of their own.
//!
//! Creating namespaces is most of a sandboxed start's namespace work (a
//! network namespace's loopback device and sysctl tables, a mount
//! namespace's copy of the mount table, an IPC namespace's sysctls: about
//! 0.9 ms of the `clone` here). The spawner keeps up to [`TARGET`] sets
//! made before any job asks, each a fresh user namespace with the agent's
//! uid and gid mapped (`setgroups` denied) and a network (`lo` down), IPC
//! and mount namespace it owns, nothing in any of them (the mount
//! namespace is a copy of the agent's mount table, its mounts slaves of
//! the host's: mounts made on the host meanwhile still appear in it). A
//! set is handed to exactly one job: its supervisor enters the user and
//! network namespaces (`setns`) and creates the job's init in a new PID
//! namespace from there; the init enters the IPC and mount namespaces
//! first thing, and holds its capabilities over all of them, as after a
//! fresh `clone`. The spawner closes its copy at the fork, every other
//! process it forks closes what it inherited of the pool first thing, and
//! a set is never made twice: nothing of one job is ever in another's
//! namespaces.
//!
//! A maker is a short-lived child of the spawner: it unshares the four
//! namespaces, writes its maps, sends the namespace descriptors over a
//! `SOCK_SEQPACKET` socket pair and exits. The spawner refills while idle; a job
//! that finds the pool empty gets fresh namespaces from its own `clone`,
//! as it would without a pool. A maker that fails (no user namespaces
//! here) turns the pool off for the spawner's life: every job then reports
//! the real failure of its own `clone`.
//!
//! Depends on [`crate::sys`] and [`crate::linux`] (the id maps).

use crate::sys;
use nix::sched::CloneFlags;
use nix::sys::socket::{socketpair, AddressFamily, MsgFlags, SockFlag, SockType};
use nix::unistd::ForkResult;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

/// Sets kept ready: enough for a job started while the previous one's
/// set is being replaced.
pub const TARGET: usize = 2;

/// A user namespace and the network, IPC and mount namespaces it owns, as
/// descriptors.
#[derive(Debug)]
pub struct NsSet {
    pub user: OwnedFd,
    pub net: OwnedFd,
    pub ipc: OwnedFd,
    pub mnt: OwnedFd,
}

/// The namespaces of a set the job's init enters itself.
#[derive(Debug)]
pub struct InitNs {
    ipc: OwnedFd,
    mnt: OwnedFd,
}

impl NsSet {
    /// In the supervisor: enter the user and network namespaces (user
    /// first: it owns the other). Returns what the init enters. Must be
    /// called single-threaded, before the init is cloned.
    pub fn enter(self) -> io::Result<InitNs> {
        nix::sched::setns(self.user.as_fd(), CloneFlags::CLONE_NEWUSER)?;
        nix::sched::setns(self.net.as_fd(), CloneFlags::CLONE_NEWNET)?;
        Ok(InitNs {
            ipc: self.ipc,
            mnt: self.mnt,
        })
    }
}

impl InitNs {
    /// In the init: enter the IPC and mount namespaces (the supervisor
    /// stays in the host's mount namespace: the init pivots its own).
    pub fn enter(self) -> io::Result<()> {
        nix::sched::setns(self.ipc.as_fd(), CloneFlags::CLONE_NEWIPC)?;
        nix::sched::setns(self.mnt.as_fd(), CloneFlags::CLONE_NEWNS)?;
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
            .flat_map(|p| {
                [
                    p.user.as_raw_fd(),
                    p.net.as_raw_fd(),
                    p.ipc.as_raw_fd(),
                    p.mnt.as_raw_fd(),
                ]
            })
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
            Ok(ForkResult::Parent { .. }) => self.making = Some(ours),
            Err(_) => self.off = true,
        }
    }

    /// The maker answered (its socket is readable): keep the set it sent,
    /// or turn the pool off if it sent none.
    pub fn collect(&mut self) {
        let Some(sock) = self.making.take() else {
            return;
        };
        let mut tag = [0u8; 1];
        match sys::recv_fds::<4>(sock.as_fd(), &mut tag, MsgFlags::empty()) {
            Ok(m) if m.bytes == 1 && tag == *b"N" && !m.truncated && m.fds.len() == 4 => {
                let mut fds = m.fds.into_iter();
                if let (Some(user), Some(net), Some(ipc), Some(mnt)) =
                    (fds.next(), fds.next(), fds.next(), fds.next())
                {
                    self.ready.push(NsSet {
                        user,
                        net,
                        ipc,
                        mnt,
                    });
                }
            }
            _ => self.off = true,
        }
    }
}

/// In the maker: new user, network, IPC and mount namespaces, the ids
/// mapped, all four sent to the spawner.
fn make(uid: u32, gid: u32, to: BorrowedFd<'_>) -> io::Result<()> {
    nix::sched::unshare(
        CloneFlags::CLONE_NEWUSER
            | CloneFlags::CLONE_NEWNET
            | CloneFlags::CLONE_NEWIPC
            | CloneFlags::CLONE_NEWNS,
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
    let mnt = open("/proc/self/ns/mnt")?;
    sys::send_fds(
        to,
        b"N",
        &[user.as_fd(), net.as_fd(), ipc.as_fd(), mnt.as_fd()],
        MsgFlags::empty(),
    )?;
    Ok(())
}
