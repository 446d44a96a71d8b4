//! Linux enforcement: what the job's init applies before it forks the job.
//!
//! The trampoline creates the job's init with `clone` into new user, mount,
//! PID and IPC namespaces (and a network namespace for `network: "deny"`
//! and `allow_hosts`; for those the user, network and IPC namespaces
//! usually come from a fresh set the spawner made ahead,
//! [`crate::nspool`], entered with `setns` by the supervisor before the
//! `clone` and by the init after it),
//! so the job cannot see, signal or trace anything outside its PID
//! namespace, nor touch another SysV/POSIX IPC object, whatever the
//! Landlock ABI. The init then, failing closed at the first step that does
//! not succeed (the job never runs then):
//!
//! 1. maps its uid/gid and makes every mount private;
//! 2. opens every root and carve-out of the plan with `openat2`
//!    (`RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`) and checks the device
//!    and inode the agent recorded: nothing is looked up by path again;
//! 3. builds a fresh root (a tmpfs) from what was granted, bubblewrap's
//!    way: read roots bound read-only (`read: "all"`: the root is one
//!    read-only recursive clone of the host's tree instead, the job's own
//!    `/dev` and `/proc` over the host's), write roots writable, `:tmp` at
//!    `/tmp`, the ancestors of carve-outs pinned (bound onto themselves, so
//!    renaming them fails with `EBUSY`), `deny_write` read-only, `deny_read`
//!    covered; a minimal `/dev` and a `/proc` of the new PID namespace; all
//!    mounts are clones of descriptors (`open_tree`, `move_mount`);
//! 4. pivots into it;
//! 5. builds a Landlock ruleset from the same descriptors (the second
//!    layer), drops every capability, sets `no_new_privs`, enforces
//!    Landlock, and installs the seccomp filters (other syscall ABIs killed
//!    or refused, socket types by allow-list, set-id modes and the
//!    terminal ioctls that inject input or change the line discipline
//!    refused).
//!
//! The job inherits all of it. Depends on [`crate::plan`] and [`executor_sys`].
//!
//! ## Layout, by mechanism
//!
//! - `root`: the fresh root (steps 1-4: id maps, private mounts, the
//!   roots and carve-outs opened by identity and mounted, `:tmp`, `/dev`,
//!   `/proc`, the pivot);
//! - `landlock`: the second layer's ruleset (step 5a) and its enforcement;
//! - `caps`: the capability drop and `no_new_privs` (step 5b);
//! - `seccomp`: the filter (step 5c): its head, the number dispatch, and
//!   the refused syscalls as data, each with the escape it prevents;
//! - this module: the [`Step`] a failure is reported at, the namespaces,
//!   the egress listener's hand-over and [`confine`], the order in which
//!   steps 5a-5c are applied.
//!
//! The job's cgroup is not applied here: the supervisor joins it before
//! the init exists ([`crate::cgroup`], [`crate::trampoline`]).

mod caps;
mod landlock;
mod root;
mod seccomp;

pub(crate) use root::write_id_maps;
pub use root::{build_root, Prepared};
pub use seccomp::{precompile_seccomp, seccomp_programs};

use crate::plan::WirePlan;
use executor_sys as sys;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::fstat;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The step that failed, for the report to the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Step {
    Namespaces = 1,
    IdMaps = 2,
    PrivateMounts = 3,
    Identity = 4,
    NewRoot = 5,
    Roots = 6,
    Pins = 7,
    DenyWrite = 8,
    DenyRead = 9,
    Dev = 10,
    Proc = 11,
    PivotRoot = 12,
    Cwd = 13,
    Landlock = 14,
    Capabilities = 15,
    LandlockRestrict = 16,
    Seccomp = 17,
    Fork = 18,
    Egress = 19,
    Supervisor = 20,
    Cgroup = 21,
    Rlimits = 22,
}

impl Step {
    /// Name of a step number.
    pub fn name(n: u8) -> &'static str {
        match n {
            1 => "creating the job's namespaces",
            2 => "writing uid/gid maps",
            3 => "making mounts private",
            4 => "opening a root or carve-out by identity (it changed since the agent checked it)",
            5 => "creating the job's root",
            6 => "binding the roots",
            7 => "pinning the ancestors of carve-outs",
            8 => "binding deny_write paths read-only",
            9 => "covering deny_read paths",
            10 => "building /dev",
            11 => "mounting /proc",
            12 => "entering the job's root",
            13 => "entering the working directory",
            14 => "building the Landlock ruleset",
            15 => "dropping capabilities",
            16 => "enforcing Landlock",
            17 => "installing the seccomp filter",
            18 => "forking the job",
            19 => "opening the egress proxy port in the job's network namespace",
            20 => "tying the job's init to its supervisor (parent-death signal)",
            21 => "joining the job's cgroup",
            22 => "setting the job's rlimits",
            _ => "an unknown sandbox step",
        }
    }
}

pub type StepResult<T> = Result<T, (Step, io::Error)>;

/// Map an error to `(step, error)`, the form every step of the init fails in.
pub(crate) fn at<E: Into<io::Error>>(step: Step) -> impl FnOnce(E) -> (Step, io::Error) {
    move |e| (step, e.into())
}

/// The namespaces the job's init is created in (`clone` flags).
pub fn namespace_flags(p: &WirePlan) -> libc::c_int {
    // The cgroup namespace: the job sees its own cgroup (which the
    // supervisor joined before this clone) as the root of every
    // hierarchy, nothing of the host's layout above it.
    let mut f = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWCGROUP;
    if p.net.own_namespace() {
        f |= libc::CLONE_NEWNET;
    }
    f
}

/// The mechanisms a plan puts in force (for `initialize.sandbox`).
pub const NAMESPACES: [&str; 6] = [
    "user_namespace",
    "mount_namespace",
    "pid_namespace",
    "ipc_namespace",
    "cgroup_namespace",
    "network_namespace",
];

fn no_follow() -> OpenHow {
    OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS)
}

fn identity(fd: BorrowedFd<'_>) -> io::Result<(u64, u64, bool)> {
    let st = fstat(fd)?;
    let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
    Ok((st.st_dev, st.st_ino, is_dir))
}

fn open_here(p: &str) -> io::Result<OwnedFd> {
    Ok(openat2(nix::fcntl::AT_FDCWD, p, no_follow())?)
}

/// Egress by name, in the init (inside the job's network namespace, still
/// holding its capabilities there, before any confinement): `lo` up, a
/// listener on `127.0.0.1:port` sent to the agent over `to_agent`, and
/// closed here, so that only the agent accepts on it and the job never
/// holds it.
pub fn hand_over_egress_listener(port: u16, to_agent: BorrowedFd<'_>) -> StepResult<()> {
    sys::loopback_up().map_err(at(Step::Egress))?;
    let listener = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port))
        .map_err(at(Step::Egress))?;
    sys::send_fds(
        to_agent,
        b"L",
        &[listener.as_fd()],
        nix::sys::socket::MsgFlags::empty(),
    )
    .map_err(at(Step::Egress))?;
    drop(listener);
    Ok(())
}

/// Step 5: the second layer, capabilities, no_new_privs and seccomp, on
/// the calling process (the init; the job inherits it). Everything that
/// can fail without effect (building the ruleset, fetching the filter) is
/// done before the first irreversible change.
pub fn confine(p: &WirePlan, prep: Prepared) -> StepResult<()> {
    let ruleset = if p.landlock_abi > 0 {
        Some(self::landlock::ruleset(p, prep)?)
    } else {
        None
    };
    let filters = seccomp::seccomp_programs(&p.net).map_err(at(Step::Seccomp))?;
    caps::drop_all()?;
    caps::no_new_privs()?;
    if let Some(ruleset) = ruleset {
        self::landlock::enforce(ruleset)?;
    }
    seccomp::install(&filters)
}

/// A C string of a path, for exec.
pub fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}
