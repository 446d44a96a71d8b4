//! Linux enforcement, applied by the trampoline to the job in the forked
//! child, just before `execve`. The agent resolves and checks the policy;
//! this module only applies it, failing closed at the first step that does
//! not succeed (the job then never runs).
//!
//! The layers, in order (each later one also holds if an earlier one has a
//! gap):
//! 1. a private user + mount namespace: mounts made private, the whole tree
//!    read-only, write roots bound writable, `deny_write` bound read-only,
//!    `deny_read` directories covered by an empty, inaccessible tmpfs
//!    (read-only mounts also stop `chmod`/`chown`/`utimes`, which Landlock
//!    does not cover);
//! 2. a Landlock ruleset built while still privileged in the namespace:
//!    read (and execute) on the read roots, everything on the write roots,
//!    the few devices every program needs, TCP connect ports from ABI 4,
//!    signal and abstract-socket scoping from ABI 6;
//! 3. every capability dropped for good (securebits locked, bounding and
//!    ambient sets emptied);
//! 4. `no_new_privs`, then Landlock `restrict_self` (must be FullyEnforced);
//! 5. seccomp: the dangerous-syscall deny list, and the network rules.

use crate::sys;
use landlock::{
    Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use seccompiler::{
    SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
};
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use std::collections::BTreeMap;
use std::ffi::{CString, OsStr};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Network part of a wire policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireNet {
    Deny,
    Allow,
    Tcp(Vec<u16>),
}

/// The policy as the trampoline receives it (hex of MessagePack in its
/// POLICY argument): absolute, canonical, existing paths only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WirePolicy {
    pub v: u8,
    pub landlock_abi: u32,
    pub read: Option<Vec<ByteBuf>>,
    pub write: Vec<ByteBuf>,
    /// Directories to cover with an empty, inaccessible tmpfs.
    pub deny_read: Vec<ByteBuf>,
    pub deny_write: Vec<ByteBuf>,
    /// Files to cover with `hidden_file` (an empty file, mode 000).
    #[serde(default)]
    pub deny_read_files: Vec<ByteBuf>,
    #[serde(default)]
    pub hidden_file: Option<ByteBuf>,
    /// Existing ancestors of carve-outs that do not exist yet, made
    /// read-only so the carve-out cannot be created.
    #[serde(default)]
    pub read_only_extra: Vec<ByteBuf>,
    pub net: WireNet,
}

impl WirePolicy {
    /// Encode for the command line.
    pub fn encode(&self) -> String {
        let bytes = rmp_serde::to_vec(self).unwrap_or_default();
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Decode from the command line.
    pub fn decode(s: &str) -> Option<WirePolicy> {
        if s.len() % 2 != 0 {
            return None;
        }
        let bytes: Option<Vec<u8>> = (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
            .collect();
        rmp_serde::from_slice(&bytes?).ok()
    }
}

fn path(b: &ByteBuf) -> PathBuf {
    PathBuf::from(OsStr::from_bytes(b))
}

/// The step that failed, for the report to the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Step {
    UserNamespace = 1,
    IdMaps = 2,
    PrivateMounts = 3,
    ReadOnlyTree = 4,
    WriteRoots = 5,
    DenyWrite = 6,
    DenyRead = 7,
    Landlock = 8,
    Capabilities = 9,
    LandlockRestrict = 10,
    Seccomp = 11,
}

impl Step {
    /// Name of a step number.
    pub fn name(n: u8) -> &'static str {
        match n {
            1 => "creating a user namespace",
            2 => "writing uid/gid maps",
            3 => "making mounts private",
            4 => "making the tree read-only",
            5 => "binding write roots writable",
            6 => "binding deny_write paths read-only",
            7 => "covering deny_read paths",
            8 => "building the Landlock ruleset",
            9 => "dropping capabilities",
            10 => "enforcing Landlock",
            11 => "installing the seccomp filter",
            _ => "an unknown sandbox step",
        }
    }
}

type StepResult<T> = Result<T, (Step, io::Error)>;

fn at<E: Into<io::Error>>(step: Step) -> impl FnOnce(E) -> (Step, io::Error) {
    move |e| (step, e.into())
}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn bind(p: &Path) -> io::Result<()> {
    use nix::mount::{mount, MsFlags};
    mount(
        Some(p),
        p,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(io::Error::from)
}

/// Step 1: the filesystem view, in a private user + mount namespace.
fn mount_namespace(p: &WirePolicy) -> StepResult<()> {
    use nix::mount::{mount, MsFlags};
    use nix::sched::{unshare, CloneFlags};
    let uid = nix::unistd::getuid();
    let gid = nix::unistd::getgid();
    // Our own user namespace: mount changes need no privilege outside it,
    // and a root agent's job gains nothing (capabilities are dropped below).
    unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS)
        .map_err(at(Step::UserNamespace))?;
    // The job keeps its own uid/gid inside.
    std::fs::write("/proc/self/setgroups", "deny").map_err(at(Step::IdMaps))?;
    std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1")).map_err(at(Step::IdMaps))?;
    std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1")).map_err(at(Step::IdMaps))?;
    // Nothing we do propagates back to the host.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(at(Step::PrivateMounts))?;
    // Everything read-only...
    sys::mount_setattr_recursive(c"/", sys::MOUNT_ATTR_RDONLY, 0)
        .map_err(at(Step::ReadOnlyTree))?;
    // ...but the write roots (shortest first, so nested roots stay on top).
    let mut writes: Vec<PathBuf> = p.write.iter().map(path).collect();
    writes.sort_by_key(|w| w.as_os_str().len());
    for w in &writes {
        bind(w).map_err(at(Step::WriteRoots))?;
        let c = cstr(w).map_err(at(Step::WriteRoots))?;
        sys::mount_setattr_recursive(&c, 0, sys::MOUNT_ATTR_RDONLY)
            .map_err(at(Step::WriteRoots))?;
    }
    // Carve-outs on top: read-only again.
    for d in p
        .deny_write
        .iter()
        .chain(p.read_only_extra.iter())
        .map(path)
    {
        bind(&d).map_err(at(Step::DenyWrite))?;
        let c = cstr(&d).map_err(at(Step::DenyWrite))?;
        sys::mount_setattr_recursive(&c, sys::MOUNT_ATTR_RDONLY, 0).map_err(at(Step::DenyWrite))?;
    }
    // Hidden: an empty tmpfs no one may enter (capabilities go below).
    for d in p.deny_read.iter().map(path) {
        mount(
            Some("tmpfs"),
            &d,
            Some("tmpfs"),
            MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            Some("mode=000,size=4k"),
        )
        .map_err(at(Step::DenyRead))?;
    }
    // Hidden files: an empty file no one may open, bound over each.
    if let Some(hidden) = &p.hidden_file {
        let hidden = path(hidden);
        for f in p.deny_read_files.iter().map(path) {
            mount(
                Some(&hidden),
                &f,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(at(Step::DenyRead))?;
            let c = cstr(&f).map_err(at(Step::DenyRead))?;
            sys::mount_setattr_recursive(&c, sys::MOUNT_ATTR_RDONLY, 0)
                .map_err(at(Step::DenyRead))?;
        }
    }
    Ok(())
}

/// The pts of fd 0, when it is a terminal.
fn own_tty() -> Option<PathBuf> {
    let t = std::fs::read_link("/proc/self/fd/0").ok()?;
    t.starts_with("/dev/pts/").then_some(t)
}

/// Step 2: the Landlock ruleset (created, not yet enforced).
fn landlock_ruleset(p: &WirePolicy) -> StepResult<landlock::RulesetCreated> {
    let abi = ABI::from(p.landlock_abi as i32);
    let err = |e: landlock::RulesetError| (Step::Landlock, io::Error::other(e.to_string()));
    let mut rs = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(abi))
        .map_err(err)?;
    if p.net != WireNet::Allow && p.landlock_abi >= 4 {
        rs = rs.handle_access(AccessNet::from_all(abi)).map_err(err)?;
    }
    if p.landlock_abi >= 6 {
        rs = rs.scope(Scope::from_all(abi)).map_err(err)?;
    }
    let mut created = rs.create().map_err(err)?;
    let add =
        |created: landlock::RulesetCreated, target: &Path, access: landlock::BitFlags<AccessFs>| {
            let fd = PathFd::new(target)
                .map_err(|e| (Step::Landlock, io::Error::other(e.to_string())))?;
            let is_dir = std::fs::metadata(target)
                .map(|m| m.is_dir())
                .unwrap_or(false);
            let access = if is_dir {
                access
            } else {
                access & AccessFs::from_file(abi)
            };
            created.add_rule(PathBeneath::new(fd, access)).map_err(|e| {
                (
                    Step::Landlock,
                    io::Error::other(format!("{}: {e}", target.display())),
                )
            })
        };
    let read = AccessFs::from_read(abi);
    match &p.read {
        None => created = add(created, Path::new("/"), read)?,
        Some(roots) => {
            for r in roots {
                created = add(created, &path(r), read)?;
            }
        }
    }
    for w in &p.write {
        created = add(created, &path(w), AccessFs::from_all(abi))?;
    }
    // What every program may use.
    let rw_dev = AccessFs::ReadFile | AccessFs::WriteFile;
    created = add(created, Path::new("/dev/null"), rw_dev)?;
    for dev in ["/dev/zero", "/dev/random", "/dev/urandom"] {
        created = add(created, Path::new(dev), AccessFs::ReadFile.into())?;
    }
    if let Some(tty) = own_tty() {
        let tty_access = if p.landlock_abi >= 5 {
            rw_dev | AccessFs::IoctlDev
        } else {
            rw_dev
        };
        created = add(created, Path::new("/dev/tty"), tty_access)?;
        created = add(created, &tty, tty_access)?;
    }
    if let WireNet::Tcp(ports) = &p.net {
        if p.landlock_abi >= 4 {
            for port in ports {
                created = created
                    .add_rule(NetPort::new(*port, AccessNet::ConnectTcp))
                    .map_err(err)?;
            }
        }
    }
    Ok(created)
}

fn rule(conds: Vec<SeccompCondition>) -> io::Result<SeccompRule> {
    SeccompRule::new(conds).map_err(|e| io::Error::other(e.to_string()))
}

fn cond(arg: u8, op: SeccompCmpOp, v: u64) -> io::Result<SeccompCondition> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, v)
        .map_err(|e| io::Error::other(e.to_string()))
}

/// Step 5: the seccomp filters (EPERM list, and clone3 → ENOSYS so libc
/// falls back to clone, whose flags can be inspected).
pub fn seccomp_programs(net: &WireNet) -> io::Result<Vec<seccompiler::BpfProgram>> {
    use libc::*;
    let mut deny: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    let always = [
        (SYS_ptrace, "reading or steering other processes"),
        (SYS_process_vm_readv, "reading another process's memory"),
        (SYS_process_vm_writev, "writing another process's memory"),
        (
            SYS_io_uring_setup,
            "io_uring opens files and sockets without the syscalls filtered here",
        ),
        (SYS_io_uring_enter, "io_uring, as above"),
        (SYS_io_uring_register, "io_uring, as above"),
        (
            SYS_mount,
            "remounting the sandbox's read-only tree writable",
        ),
        (
            SYS_umount2,
            "unmounting a carve-out to reveal what it covers",
        ),
        (
            SYS_pivot_root,
            "swapping the root for one outside the policy",
        ),
        (SYS_chroot, "chroot escapes"),
        (SYS_unshare, "new namespaces with fresh capabilities"),
        (SYS_setns, "joining another namespace"),
        (
            SYS_keyctl,
            "the kernel keyring (credentials of other sessions)",
        ),
        (SYS_add_key, "the kernel keyring"),
        (SYS_request_key, "the kernel keyring"),
        (SYS_bpf, "loading kernel programs"),
        (
            SYS_perf_event_open,
            "observing other processes and the kernel",
        ),
        (SYS_userfaultfd, "a common kernel exploitation primitive"),
        (SYS_kexec_load, "replacing the kernel"),
        (SYS_kexec_file_load, "replacing the kernel"),
        (SYS_init_module, "loading kernel modules"),
        (SYS_finit_module, "loading kernel modules"),
        (SYS_delete_module, "unloading kernel modules"),
        (
            SYS_open_by_handle_at,
            "opening files by handle, around path checks",
        ),
        (SYS_name_to_handle_at, "file handles, as above"),
        (SYS_fsopen, "new mount API: mounting"),
        (SYS_fsmount, "new mount API: mounting"),
        (SYS_move_mount, "new mount API: moving mounts"),
        (SYS_open_tree, "new mount API: cloning mounts"),
        (SYS_mount_setattr, "new mount API: clearing read-only"),
    ];
    for (nr, _escape) in always {
        deny.insert(nr, vec![]);
    }
    // Faking terminal input into the controlling terminal's other readers.
    deny.insert(
        SYS_ioctl,
        vec![rule(vec![cond(1, SeccompCmpOp::Eq, TIOCSTI)?])?],
    );
    // New namespaces through clone flags.
    let ns_flags = [
        CLONE_NEWNS,
        CLONE_NEWUSER,
        CLONE_NEWPID,
        CLONE_NEWNET,
        CLONE_NEWIPC,
        CLONE_NEWUTS,
        CLONE_NEWCGROUP,
    ];
    let mut clone_rules = Vec::new();
    for f in ns_flags {
        clone_rules.push(rule(vec![cond(
            0,
            SeccompCmpOp::MaskedEq(f as u64),
            f as u64,
        )?])?);
    }
    deny.insert(SYS_clone, clone_rules);
    match net {
        WireNet::Allow => {}
        WireNet::Deny => {
            // No socket but AF_UNIX; no connect/bind/listen/accept for any
            // family (so no pathname Unix socket either); socketpair works.
            deny.insert(
                SYS_socket,
                vec![rule(vec![cond(0, SeccompCmpOp::Ne, AF_UNIX as u64)?])?],
            );
            for nr in [SYS_connect, SYS_bind, SYS_listen, SYS_accept, SYS_accept4] {
                deny.insert(nr, vec![]);
            }
        }
        WireNet::Tcp(_) => {
            // Only TCP sockets (Landlock limits their ports): no UDP, so no
            // DNS; no raw, packet or netlink sockets; no Unix sockets.
            let mut rules = vec![rule(vec![
                cond(0, SeccompCmpOp::Ne, AF_INET as u64)?,
                cond(0, SeccompCmpOp::Ne, AF_INET6 as u64)?,
            ])?];
            for t in [
                SOCK_DGRAM,
                SOCK_RAW,
                SOCK_RDM,
                SOCK_SEQPACKET,
                SOCK_DCCP,
                10, /* SOCK_PACKET */
            ] {
                rules.push(rule(vec![cond(1, SeccompCmpOp::MaskedEq(0xf), t as u64)?])?);
            }
            deny.insert(SYS_socket, rules);
            for nr in [SYS_listen, SYS_accept, SYS_accept4] {
                deny.insert(nr, vec![]);
            }
        }
    }
    let arch = seccompiler::TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| io::Error::other(e.to_string()))?;
    let eperm = SeccompFilter::new(
        deny,
        SeccompAction::Allow,
        SeccompAction::Errno(EPERM as u32),
        arch,
    )
    .map_err(|e| io::Error::other(e.to_string()))?;
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(SYS_clone3, vec![])]),
        SeccompAction::Allow,
        SeccompAction::Errno(ENOSYS as u32),
        arch,
    )
    .map_err(|e| io::Error::other(e.to_string()))?;
    let mut out = Vec::new();
    for f in [eperm, clone3] {
        out.push(
            f.try_into()
                .map_err(|e: seccompiler::BackendError| io::Error::other(e.to_string()))?,
        );
    }
    Ok(out)
}

/// Apply `p` to the calling (single-threaded, forked) process.
pub fn apply(p: &WirePolicy) -> StepResult<()> {
    mount_namespace(p)?;
    // The working directory still points into the mounts as they were
    // before (read-only now, carve-outs not on top): walk to it again so
    // relative paths see the sandbox's view.
    let cwd = std::env::current_dir().map_err(at(Step::PrivateMounts))?;
    std::env::set_current_dir(&cwd).map_err(at(Step::PrivateMounts))?;
    let ruleset = landlock_ruleset(p)?;
    let filters = seccomp_programs(&p.net).map_err(at(Step::Seccomp))?;
    sys::drop_all_capabilities().map_err(at(Step::Capabilities))?;
    // restrict_self sets no_new_privs first.
    let status = ruleset
        .restrict_self()
        .map_err(|e| (Step::LandlockRestrict, io::Error::other(e.to_string())))?;
    if status.ruleset != RulesetStatus::FullyEnforced || !status.no_new_privs {
        return Err((
            Step::LandlockRestrict,
            io::Error::other(format!("Landlock not fully enforced: {:?}", status.ruleset)),
        ));
    }
    for f in &filters {
        seccompiler::apply_filter(f)
            .map_err(|e| (Step::Seccomp, io::Error::other(e.to_string())))?;
    }
    Ok(())
}
