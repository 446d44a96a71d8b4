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

use crate::plan::{Node, WireNet, WirePlan};
use executor_sys as sys;
use landlock::{
    Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, Ruleset,
    RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, Mode};
use seccompiler::{
    SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
};
use std::collections::BTreeMap;
use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

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

fn at<E: Into<io::Error>>(step: Step) -> impl FnOnce(E) -> (Step, io::Error) {
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

/// Open what the agent checked, by identity.
fn open_node(n: &Node) -> io::Result<OwnedFd> {
    let fd = openat2(nix::fcntl::AT_FDCWD, n.path(), no_follow())?;
    let (dev, ino, _) = identity(fd.as_fd())?;
    if (dev, ino) != (n.dev, n.ino) {
        return Err(io::Error::other(format!(
            "{} is not what the agent checked (device {dev} inode {ino}, expected {} {})",
            n.path().display(),
            n.dev,
            n.ino
        )));
    }
    Ok(fd)
}

fn relative(p: &Path) -> PathBuf {
    p.components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect()
}

/// Open `rel` beneath `root`, creating missing directories (and, when
/// `file`, the last component as an empty file). Returns the descriptor and
/// whether the last component existed already.
///
/// Only `root`'s own mount (the job's fresh tmpfs, its `/dev`: `root`
/// must be one of the job's own mounts, what is made directly in it is
/// not checked) and the mounts in `also` (the job's `:tmp` directory) get
/// anything made in them: beneath a mount bound from the host's tree (a write root) a
/// missing component means what the agent checked is gone, and is
/// `ENOENT`, never a file or directory made on the host.
fn ensure(
    root: BorrowedFd<'_>,
    rel: &Path,
    file: bool,
    also: &[u64],
) -> io::Result<(OwnedFd, bool)> {
    let how = || {
        OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
            .resolve(
                ResolveFlag::RESOLVE_NO_SYMLINKS
                    | ResolveFlag::RESOLVE_NO_MAGICLINKS
                    | ResolveFlag::RESOLVE_BENEATH,
            )
    };
    let parts: Vec<_> = rel.components().collect();
    // Most of the job's root exists already (the clone of the host's
    // tree, a root inside another): one look-up of the whole path first.
    if parts.len() > 1 {
        if let Ok(fd) = openat2(root, rel, how()) {
            return Ok((fd, true));
        }
    }
    // The directory walked so far; `None`: `root` itself.
    let mut cur: Option<OwnedFd> = None;
    let mut root_mount = None;
    let mut existed = true;
    for (i, c) in parts.iter().enumerate() {
        let name = c.as_os_str();
        let last = i + 1 == parts.len();
        let dir = cur.as_ref().map_or(root, |f| f.as_fd());
        let next = match openat2(dir, name, how()) {
            Ok(fd) => {
                existed = true;
                fd
            }
            Err(nix::errno::Errno::ENOENT) => {
                existed = false;
                // `root` itself is its own mount; below it, a look-up.
                if cur.is_some() {
                    let root_mount = match root_mount {
                        Some(m) => m,
                        None => *root_mount.insert(sys::mount_id(root)?),
                    };
                    if !job_owns(dir, root_mount, also)? {
                        return Err(io::Error::from_raw_os_error(libc::ENOENT));
                    }
                }
                if last && file {
                    drop(new_file(dir, name)?);
                } else {
                    nix::sys::stat::mkdirat(dir, name, Mode::from_bits_truncate(0o755))?;
                }
                openat2(dir, name, how())?
            }
            Err(e) => return Err(e.into()),
        };
        cur = Some(next);
    }
    match cur {
        Some(fd) => Ok((fd, existed)),
        None => Ok((root.try_clone_to_owned()?, true)),
    }
}

/// Whether `dir` is on one of the job's own mounts: the root's
/// (`root_mount`) or one in `also`.
fn job_owns(dir: BorrowedFd<'_>, root_mount: u64, also: &[u64]) -> io::Result<bool> {
    let here = sys::mount_id(dir)?;
    Ok(here == root_mount || also.contains(&here))
}

/// A new empty file `name` in `dir` (`O_EXCL`: never one that is there).
fn new_file(dir: BorrowedFd<'_>, name: &std::ffi::OsStr) -> io::Result<OwnedFd> {
    Ok(nix::fcntl::openat(
        dir,
        name,
        OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o644),
    )?)
}

/// Attach `tree` (a detached clone of `src`) at `rel` beneath `root`. An
/// existing target must be the source itself (a root inside another
/// root, or a root in the clone of the host's tree): anything else means
/// the tree changed. `over` is the exception: `rel` is a fixed name the
/// source is put over (`:tmp` at `/tmp`), not the source's own path.
fn bind_at(
    root: BorrowedFd<'_>,
    rel: &Path,
    src: BorrowedFd<'_>,
    tree: BorrowedFd<'_>,
    over: bool,
    also: &[u64],
) -> io::Result<()> {
    let (sdev, sino, is_dir) = identity(src)?;
    let (target, existed) = ensure(root, rel, !is_dir, also)?;
    if existed && !over {
        let (tdev, tino, _) = identity(target.as_fd())?;
        if (tdev, tino) != (sdev, sino) {
            return Err(io::Error::other(format!(
                "/{} in the job's root is not the checked source",
                rel.display()
            )));
        }
    }
    sys::attach(tree, target.as_fd())
}

/// A detached, recursive clone of `src` with mount attributes `set`.
fn clone_with(src: BorrowedFd<'_>, set: u64) -> io::Result<OwnedFd> {
    let tree = sys::clone_tree(src, true)?;
    if set != 0 {
        sys::set_mount_attr(tree.as_fd(), true, set, 0)?;
    }
    Ok(tree)
}

/// One mount of the fresh root, in the order they are made.
#[derive(Debug)]
struct Mount {
    rel: PathBuf,
    fd: OwnedFd,
    kind: Kind,
    /// The detached clone to attach (none for what is covered).
    tree: Option<OwnedFd>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Read,
    Write,
    Tmp,
    Pin,
    DenyWrite,
    DenyRead,
}

impl Kind {
    /// Mount attributes of the clone (`None`: covered, not cloned).
    fn attrs(self) -> Option<u64> {
        match self {
            Kind::Read | Kind::DenyWrite => Some(RO),
            Kind::Write | Kind::Tmp => Some(RW),
            Kind::Pin => Some(RW),
            Kind::DenyRead => None,
        }
    }

    fn step(self) -> Step {
        match self {
            Kind::Read | Kind::Write | Kind::Tmp => Step::Roots,
            Kind::Pin => Step::Pins,
            Kind::DenyWrite => Step::DenyWrite,
            Kind::DenyRead => Step::DenyRead,
        }
    }
}

/// The descriptors the second layer (Landlock) is built from.
#[derive(Debug)]
struct Grants {
    read: Vec<OwnedFd>,
    write: Vec<OwnedFd>,
}

/// What the init holds open across the pivot.
#[derive(Debug)]
pub struct Prepared {
    grants: Grants,
    tty: bool,
    /// A root `/dev` (`Some(true)`: a write root), see [`Opened`].
    dev_root: Option<bool>,
}

const RO: u64 = sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV;
const RW: u64 = sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV;

/// Map the agent's uid and gid (only) in the user namespace this process
/// just created; `setgroups` denied.
pub(crate) fn write_id_maps(uid: u32, gid: u32) -> io::Result<()> {
    std::fs::write("/proc/self/setgroups", "deny")?;
    std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
    std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1"))
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

/// The host's device nodes every job gets.
const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// The empty mode-000 file bound over `deny_read` files, made in the fresh
/// root and unlinked from it once bound.
const HIDDEN: &str = ".executor-hidden";

/// Steps 1-4, in the init (pid 1 of the new PID namespace, still holding
/// its capabilities in the new user namespace). `ids` are the agent's
/// uid and gid, read before the clone, to map; `None` when the user
/// namespace came from the spawner's pool with them mapped already. On
/// return the process is inside the job's root, in `cwd`.
pub fn build_root(
    p: &WirePlan,
    ids: Option<(u32, u32)>,
    tty: bool,
    cwd: &Path,
) -> StepResult<Prepared> {
    if let Some((uid, gid)) = ids {
        write_id_maps(uid, gid).map_err(at(Step::IdMaps))?;
    }
    make_mounts_private()?;

    // Everything is opened before the first mount changes the tree.
    let Opened {
        mut mounts,
        symlinks,
        grants,
        root_writable,
        dev_root,
    } = open_mounts(p)?;
    let devices = open_devices()?;
    // The job's own pts, opened in this mount namespace (fd 0 belongs to
    // the agent's, which cannot be cloned from here) and checked to be fd 0.
    let pts = if tty {
        own_pts().map_err(at(Step::Dev))?
    } else {
        None
    };

    // Every clone is made before the staging mount below exists (a
    // recursive clone of the host's /tmp would otherwise contain it).
    let mut grants = grants;
    if let Some(tmp_root) = clone_trees(&mut mounts, p.tmp_bytes)? {
        // A size-bounded tmpfs stands for :tmp: Landlock grants its root
        // (the host's job directory is not what the job sees).
        grants.write.push(tmp_root);
    }
    let root = match &p.read {
        _ if root_writable => {
            let root = stage_host_root(RW)?;
            kernel_interfaces_read_only(root.as_fd()).map_err(at(Step::NewRoot))?;
            root
        }
        Some(roots) if !roots.iter().any(|n| n.path() == Path::new("/")) => stage_fresh_root()?,
        _ => stage_host_root(RO)?,
    };
    // /dev is a tmpfs of the job's own in either root; it holds the
    // hidden file while the carve-outs are covered.
    let dev = mount_dev_tmpfs(root.as_fd()).map_err(at(Step::Dev))?;
    let hidden = make_hidden(dev.as_fd())?;
    // The job's own mounts beneath its root, where mount points may be
    // made: its /dev (a read root such as /dev/null lands there), then
    // its :tmp.
    let dev_mount = sys::mount_id(dev.as_fd()).map_err(at(Step::Dev))?;
    let own = attach_mounts(root.as_fd(), &mounts, hidden.as_fd(), vec![dev_mount])?;
    make_symlinks(root.as_fd(), &symlinks, &own)?;
    drop(hidden);
    nix::unistd::unlinkat(dev.as_fd(), HIDDEN, nix::unistd::UnlinkatFlags::NoRemoveDir)
        .map_err(at(Step::DenyRead))?;
    make_dev(dev.as_fd(), &devices, pts.as_ref()).map_err(at(Step::Dev))?;
    // Nothing more is created in /dev (but with a write root `/dev`: then
    // in that tmpfs of the job's own only) or in the root itself (but with
    // a write root `/`).
    if dev_root != Some(true) {
        sys::set_mount_attr(dev.as_fd(), false, sys::MOUNT_ATTR_RDONLY, 0)
            .map_err(at(Step::Dev))?;
    }
    drop(dev);
    mount_proc(root.as_fd())?;
    if !root_writable {
        sys::set_mount_attr(root.as_fd(), false, sys::MOUNT_ATTR_RDONLY, 0)
            .map_err(at(Step::NewRoot))?;
    }
    enter_root(&root, cwd)?;
    Ok(Prepared {
        grants,
        tty,
        dev_root,
    })
}

/// Step 1: every mount of the new mount namespace made private.
fn make_mounts_private() -> StepResult<()> {
    use nix::mount::{mount, MsFlags};
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(at(Step::PrivateMounts))
}

/// What step 2 opens: the mounts of the fresh root, the symlinks to
/// recreate in it, and the roots Landlock grants.
struct Opened {
    mounts: Vec<Mount>,
    symlinks: Vec<(PathBuf, PathBuf)>,
    grants: Grants,
    /// A write root `/`: the clone of the host's tree stays writable.
    root_writable: bool,
    /// A root `/dev` (`Some(true)`: a write root): the job's own /dev
    /// stands for it, granted to Landlock after the pivot.
    dev_root: Option<bool>,
}

impl Opened {
    /// Open the checked node `n` by identity, to mount at `rel` as `kind`.
    fn open(&mut self, n: &Node, rel: PathBuf, kind: Kind) -> StepResult<BorrowedFd<'_>> {
        let fd = open_node(n).map_err(at(Step::Identity))?;
        self.mounts.push(Mount {
            rel,
            fd,
            kind,
            tree: None,
        });
        Ok(self.mounts.last().expect("pushed above").fd.as_fd())
    }

    /// Open the root `n` as [`Opened::open`] does and grant it to Landlock
    /// (`write`: writable).
    fn grant(&mut self, n: &Node, rel: PathBuf, kind: Kind, write: bool) -> StepResult<()> {
        let fd = self
            .open(n, rel, kind)?
            .try_clone_to_owned()
            .map_err(at(Step::Identity))?;
        let list = if write {
            &mut self.grants.write
        } else {
            &mut self.grants.read
        };
        list.push(fd);
        Ok(())
    }
}

/// Step 2: open every root and carve-out of the plan by identity, the
/// mounts sorted in the order they are made.
fn open_mounts(p: &WirePlan) -> StepResult<Opened> {
    let mut o = Opened {
        mounts: Vec::new(),
        symlinks: p
            .symlinks
            .iter()
            .map(|(a, b)| {
                (
                    PathBuf::from(OsStr::from_bytes(a)),
                    PathBuf::from(OsStr::from_bytes(b)),
                )
            })
            .collect(),
        grants: Grants {
            read: Vec::new(),
            write: Vec::new(),
        },
        root_writable: false,
        dev_root: None,
    };
    // `read: "all"` opens nothing here: the host's whole tree is cloned at
    // once by [`stage_host_root`]. A root `/` is that clone (writable for
    // a write root: granted to Landlock, nothing mounted); a root `/dev`
    // is the job's own /dev (nothing of the host's is bound there).
    let roots = p.read.iter().flatten().map(|n| (n, false));
    for (n, write) in roots.chain(p.write.iter().map(|n| (n, true))) {
        if n.path() == Path::new(crate::plan::HOST_DEV) {
            open_node(n).map_err(at(Step::Identity))?;
            o.dev_root = Some(o.dev_root.unwrap_or(false) || write);
        } else if n.path() == Path::new("/") {
            let fd = open_node(n).map_err(at(Step::Identity))?;
            o.root_writable |= write;
            if write {
                o.grants.write.push(fd);
            } else {
                o.grants.read.push(fd);
            }
        } else if write {
            o.grant(n, relative(n.path()), Kind::Write, true)?;
        } else {
            o.grant(n, relative(n.path()), Kind::Read, false)?;
        }
    }
    if let Some(n) = &p.tmp {
        o.grant(n, PathBuf::from("tmp"), Kind::Tmp, true)?;
    }
    for n in &p.read_over_tmp {
        o.grant(n, relative(n.path()), Kind::Read, false)?;
    }
    for (list, kind) in [
        (&p.pin, Kind::Pin),
        (&p.deny_write, Kind::DenyWrite),
        (&p.deny_read, Kind::DenyRead),
    ] {
        for n in list {
            o.open(n, relative(n.path()), kind)?;
        }
    }
    // Parents before children; at one path, roots before what covers them.
    o.mounts.sort_by(|a, b| {
        (a.rel.components().count(), a.kind).cmp(&(b.rel.components().count(), b.kind))
    });
    Ok(o)
}

/// The host's [`DEVICES`], opened without following.
fn open_devices() -> StepResult<Vec<(&'static str, OwnedFd)>> {
    let mut devices = Vec::new();
    for d in DEVICES {
        let fd = openat2(
            nix::fcntl::AT_FDCWD,
            Path::new("/dev").join(d).as_path(),
            no_follow(),
        )
        .map_err(at(Step::Dev))?;
        devices.push((d, fd));
    }
    Ok(devices)
}

/// The error of mounting `rel` at `step`, naming the path.
fn mount_error(step: Step, rel: &Path, e: io::Error) -> (Step, io::Error) {
    (
        step,
        io::Error::new(e.kind(), format!("/{}: {e}", rel.display())),
    )
}

/// The detached clone of every mount that is bound (not covered), with
/// its kind's attributes; with `tmp_bytes`, `:tmp` is instead a new tmpfs
/// of that size (its root returned, for Landlock).
fn clone_trees(mounts: &mut [Mount], tmp_bytes: Option<u64>) -> StepResult<Option<OwnedFd>> {
    let mut tmp_root = None;
    let read_only: Vec<PathBuf> = mounts
        .iter()
        .filter(|m| m.kind == Kind::DenyWrite)
        .map(|m| m.rel.clone())
        .collect();
    for m in mounts {
        if let Some(mut set) = m.kind.attrs() {
            // Never writable inside a read-only carve-out.
            if read_only.iter().any(|r| m.rel.starts_with(r)) {
                set |= sys::MOUNT_ATTR_RDONLY;
            }
            let tree = match (m.kind, tmp_bytes) {
                (Kind::Tmp, Some(bytes)) => {
                    let size =
                        std::ffi::CString::new(bytes.to_string()).expect("digits have no NUL");
                    let tree =
                        sys::new_mount(c"tmpfs", &[(c"mode", c"1777"), (c"size", &size)], set);
                    tree.and_then(|t| {
                        tmp_root = Some(t.try_clone()?);
                        Ok(t)
                    })
                }
                _ => clone_with(m.fd.as_fd(), set),
            }
            .map_err(|e| mount_error(m.kind.step(), &m.rel, e))?;
            m.tree = Some(tree);
        }
    }
    Ok(tmp_root)
}

/// Step 3's fresh root: a tmpfs, attached at /tmp of this (private) mount
/// namespace only long enough to pivot into it.
fn stage_fresh_root() -> StepResult<OwnedFd> {
    let root_mnt = sys::new_mount(c"tmpfs", &[(c"mode", c"0755"), (c"size", c"1m")], RW)
        .map_err(at(Step::NewRoot))?;
    stage(root_mnt)
}

/// Step 3's root for `read: "all"`: one recursive clone of the
/// host's whole tree, read-only (`attrs` [`RO`]; [`RW`] for a write root
/// `/`, where the host's own read-only mounts stay read-only) (what `/dev`, `/proc` and `:tmp` cover stays beneath
/// the job's own, which nothing in the job can unmount), staged as
/// [`stage_fresh_root`] stages its tmpfs. One clone instead of one per
/// top-level entry: the mounts of a job's start are most of its cost.
fn stage_host_root(attrs: u64) -> StepResult<OwnedFd> {
    let host = open_here("/").map_err(at(Step::NewRoot))?;
    let tree = clone_with(host.as_fd(), attrs).map_err(at(Step::NewRoot))?;
    stage(tree)
}

/// Attach `tree` at /tmp of this (private) mount namespace and open it.
fn stage(tree: OwnedFd) -> StepResult<OwnedFd> {
    let staging = openat2(nix::fcntl::AT_FDCWD, "/tmp", no_follow()).map_err(at(Step::NewRoot))?;
    sys::attach(tree.as_fd(), staging.as_fd()).map_err(at(Step::NewRoot))?;
    drop(staging);
    openat2(nix::fcntl::AT_FDCWD, "/tmp", no_follow()).map_err(at(Step::NewRoot))
}

/// Filesystems that are the kernel's interfaces rather than files: sysctls,
/// devices, cgroups, tracing, BPF, firmware variables, security modules.
/// Not autofs: its mount points hold the automounted file systems (homes
/// over NFS) that a write root `/` grants.
const KERNEL_FS: &[&str] = &[
    "proc",
    "sysfs",
    "cgroup",
    "cgroup2",
    "securityfs",
    "debugfs",
    "tracefs",
    "bpf",
    "pstore",
    "configfs",
    "efivarfs",
    "fusectl",
    "binfmt_misc",
    "selinuxfs",
    "smackfs",
    "rpc_pipefs",
    "nfsd",
    "devtmpfs",
    "devpts",
    "mqueue",
    "resctrl",
];

/// A mount point of /proc/self/mountinfo, its octal escapes (`\040`)
/// decoded.
fn unescape_mount_point(s: &str) -> PathBuf {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) if b[i] == b'\\' => {
                out.push(d.iter().fold(0u8, |a, c| a.wrapping_mul(8) + (c - b'0')));
                i += 4;
            }
            _ => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    PathBuf::from(OsStr::from_bytes(&out))
}

/// Every mount of the kernel's interfaces ([`KERNEL_FS`]: the host's /sys
/// and its cgroup, tracing, BPF and firmware trees, wherever the host
/// mounts them) in the staged clone `root` of the host's tree made
/// read-only, with what is mounted beneath: a write root `/` grants the
/// host's files, never its kernel's settings. A mount hidden under another
/// at its place is out of the job's reach and left as it is; one the agent
/// cannot reach (EACCES) the job cannot reach either.
fn kernel_interfaces_read_only(root: BorrowedFd<'_>) -> io::Result<()> {
    let top = sys::mount_id(root)?;
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    // (id, parent, mount point, filesystem type)
    let mounts: Vec<(u64, u64, PathBuf, &str)> = info
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let id = f.next()?.parse().ok()?;
            let parent = f.next()?.parse().ok()?;
            let point = unescape_mount_point(f.nth(2)?);
            let fstype = l.split(" - ").nth(1)?.split(' ').next()?;
            Some((id, parent, point, fstype))
        })
        .collect();
    let base = mounts
        .iter()
        .find(|m| m.0 == top)
        .map(|m| m.2.clone())
        .ok_or_else(|| io::Error::other("the staged root is not in /proc/self/mountinfo"))?;
    let mut inside = std::collections::BTreeSet::from([top]);
    loop {
        let before = inside.len();
        for m in &mounts {
            if inside.contains(&m.1) {
                inside.insert(m.0);
            }
        }
        if inside.len() == before {
            break;
        }
    }
    for (id, _, point, fstype) in &mounts {
        if *id == top || !inside.contains(id) || !KERNEL_FS.contains(fstype) {
            continue;
        }
        let rel = point.strip_prefix(&base).map_err(|_| {
            io::Error::other(format!("{} outside the staged root", point.display()))
        })?;
        let fd = match openat2(root, rel, no_follow()) {
            Ok(fd) => fd,
            Err(nix::errno::Errno::EACCES) => continue,
            Err(e) => {
                return Err(io::Error::new(
                    io::Error::from(e).kind(),
                    format!("/{}: {e}", rel.display()),
                ))
            }
        };
        if sys::mount_id(fd.as_fd())? != *id {
            continue;
        }
        sys::set_mount_attr(fd.as_fd(), true, sys::MOUNT_ATTR_RDONLY, 0)?;
    }
    Ok(())
}

/// A new tmpfs (no exec) of `mode` and `size` at the directory `rel`
/// beneath `dir`, made if missing.
fn tmpfs_at(dir: BorrowedFd<'_>, rel: &str, mode: &CStr, size: &CStr) -> io::Result<()> {
    let (target, _) = ensure(dir, Path::new(rel), false, &[])?;
    let m = sys::new_mount(
        c"tmpfs",
        &[(c"mode", mode), (c"size", size)],
        RW | sys::MOUNT_ATTR_NOEXEC,
    )?;
    sys::attach(m.as_fd(), target.as_fd())
}

/// A small tmpfs at `/dev` of `root` (made read-only once populated).
fn mount_dev_tmpfs(root: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    tmpfs_at(root, "dev", c"0755", c"64k")?;
    Ok(openat2(
        root,
        "dev",
        no_follow().resolve(
            ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS
                | ResolveFlag::RESOLVE_BENEATH,
        ),
    )?)
}

/// The [`HIDDEN`] file in `dir` (the job's /dev while it is built),
/// opened without following.
fn make_hidden(dir: BorrowedFd<'_>) -> StepResult<OwnedFd> {
    nix::fcntl::openat(
        dir,
        HIDDEN,
        OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .and_then(|f| {
        drop(f);
        nix::fcntl::openat(
            dir,
            HIDDEN,
            OFlag::O_PATH | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
            Mode::empty(),
        )
    })
    .map_err(at(Step::DenyRead))
}

/// Bind every cloned mount into `root`, cover the rest with `hidden`.
/// `own` holds the ids of the job's own mounts beneath `root` (where
/// mount points may be made); the job's `:tmp` is added once bound, and
/// the list returned.
fn attach_mounts(
    root: BorrowedFd<'_>,
    mounts: &[Mount],
    hidden: BorrowedFd<'_>,
    mut own: Vec<u64>,
) -> StepResult<Vec<u64>> {
    for m in mounts {
        let step = m.kind.step();
        match &m.tree {
            Some(tree) => bind_at(
                root,
                &m.rel,
                m.fd.as_fd(),
                tree.as_fd(),
                m.kind == Kind::Tmp,
                &own,
            )
            .and_then(|()| {
                if m.kind == Kind::Tmp {
                    own.push(sys::mount_id(tree.as_fd())?);
                }
                Ok(())
            }),
            None => cover(root, &m.rel, m.fd.as_fd(), hidden, &own),
        }
        .map_err(|e| mount_error(step, &m.rel, e))?;
    }
    Ok(own)
}

/// Recreate the plan's symlinks in `root` where the job's own mounts hold
/// them (one already there, or in a mount bound from the host, is left as
/// it is: nothing is made in the host's tree).
fn make_symlinks(
    root: BorrowedFd<'_>,
    symlinks: &[(PathBuf, PathBuf)],
    own: &[u64],
) -> StepResult<()> {
    let root_mount = sys::mount_id(root).map_err(at(Step::NewRoot))?;
    for (at_, to) in symlinks {
        let rel = relative(at_);
        let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
            continue;
        };
        let dir = match ensure(root, parent, false, own) {
            Ok((dir, _)) => dir,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) => return Err((Step::NewRoot, e)),
        };
        if !job_owns(dir.as_fd(), root_mount, own).map_err(at(Step::NewRoot))? {
            continue;
        }
        match nix::unistd::symlinkat(to.as_path(), dir.as_fd(), name) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) | Err(nix::errno::Errno::EROFS) => {}
            Err(e) => return Err((Step::NewRoot, e.into())),
        }
    }
    Ok(())
}

/// A `/proc` of the new PID namespace in `root`, without exec.
fn mount_proc(root: BorrowedFd<'_>) -> StepResult<()> {
    let (proc_dir, _) = ensure(root, Path::new("proc"), false, &[]).map_err(at(Step::Proc))?;
    // Read-only: its files are the kernel's interfaces (sysctls of the
    // whole host under /proc/sys), never data a root grants.
    let attrs = RW | sys::MOUNT_ATTR_NOEXEC | sys::MOUNT_ATTR_RDONLY;
    let proc_mnt = sys::new_mount(c"proc", &[], attrs).map_err(at(Step::Proc))?;
    sys::attach(proc_mnt.as_fd(), proc_dir.as_fd()).map_err(at(Step::Proc))
}

/// Step 4: pivot into `root`, detach the old root, enter `cwd`.
///
/// `cwd` is the request's and may name a link a job made: it is resolved
/// inside the new root only (`RESOLVE_IN_ROOT`), never through a magic
/// link (`RESOLVE_NO_MAGICLINKS`): this process still holds descriptors of
/// the tree before the pivot (the grants Landlock is built from), and
/// `/proc/self/fd/N/..` would lead a plain `chdir` there, out of the
/// job's root and past its covers.
fn enter_root(root: &OwnedFd, cwd: &Path) -> StepResult<()> {
    nix::unistd::fchdir(root).map_err(at(Step::PivotRoot))?;
    sys::pivot_root_here().map_err(at(Step::PivotRoot))?;
    nix::mount::umount2(".", nix::mount::MntFlags::MNT_DETACH).map_err(at(Step::PivotRoot))?;
    std::env::set_current_dir("/").map_err(at(Step::PivotRoot))?;
    let new_root = open_here("/").map_err(at(Step::PivotRoot))?;
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    openat2(new_root.as_fd(), cwd, how)
        .and_then(|dir| nix::unistd::fchdir(&dir))
        .map_err(|e| {
            let e = io::Error::from(e);
            (
                Step::Cwd,
                io::Error::new(e.kind(), format!("{}: {e}", cwd.display())),
            )
        })
}

/// Cover `rel` (the carve-out `src`): a directory with the empty,
/// inaccessible tmpfs, a file with an empty mode-000 file.
fn cover(
    root: BorrowedFd<'_>,
    rel: &Path,
    src: BorrowedFd<'_>,
    hidden: BorrowedFd<'_>,
    also: &[u64],
) -> io::Result<()> {
    let (sdev, sino, is_dir) = identity(src)?;
    let (target, _) = ensure(root, rel, !is_dir, also)?;
    let (tdev, tino, _) = identity(target.as_fd())?;
    if (tdev, tino) != (sdev, sino) {
        return Err(io::Error::other(
            "the carve-out in the job's root is not the checked one",
        ));
    }
    if is_dir {
        let m = sys::new_mount(
            c"tmpfs",
            &[(c"mode", c"0000"), (c"size", c"4k")],
            RO | sys::MOUNT_ATTR_NOEXEC,
        )?;
        return sys::attach(m.as_fd(), target.as_fd());
    }
    let tree = sys::clone_tree(hidden, false)?;
    sys::set_mount_attr(tree.as_fd(), false, RO | sys::MOUNT_ATTR_NOEXEC, 0)?;
    sys::attach(tree.as_fd(), target.as_fd())
}

fn own_pts() -> io::Result<Option<(PathBuf, OwnedFd)>> {
    let Ok(t) = std::fs::read_link("/proc/self/fd/0") else {
        return Ok(None);
    };
    let Ok(rel) = t.strip_prefix("/dev/pts") else {
        return Ok(None);
    };
    let fd = openat2(nix::fcntl::AT_FDCWD, t.as_path(), no_follow())?;
    let stdin = std::io::stdin();
    let (d0, i0, _) = identity(stdin.as_fd())?;
    let (d1, i1, _) = identity(fd.as_fd())?;
    if (d0, i0) != (d1, i1) {
        return Err(io::Error::other(format!(
            "{} is not the job's terminal",
            t.display()
        )));
    }
    Ok(Some((rel.to_path_buf(), fd)))
}

/// `/dev` (the tmpfs `dev`): the few devices every program needs, bound
/// from the host, the job's own pts (with a tty), a private `/dev/shm`,
/// and the usual links.
fn make_dev(
    dev: BorrowedFd<'_>,
    devices: &[(&str, OwnedFd)],
    own_pts: Option<&(PathBuf, OwnedFd)>,
) -> io::Result<()> {
    // The job's /dev is a tmpfs made for it: each device's mount point is
    // made directly, and the descriptor that made it is the target
    // (`move_mount` attaches to the object an fd names); one there already
    // (a read root such as /dev/null) is opened.
    for (name, fd) in devices {
        let target = match new_file(dev, std::ffi::OsStr::new(name)) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                ensure(dev, Path::new(name), true, &[])?.0
            }
            made => made?,
        };
        let tree = sys::clone_tree(fd.as_fd(), false)?;
        sys::attach(tree.as_fd(), target.as_fd())?;
    }
    ensure(dev, Path::new("pts"), false, &[])?;
    if let Some((n, fd)) = own_pts {
        // Looked up from /dev itself: a `pts` bound from the host (a read
        // root `/dev/pts`) is another mount, where nothing is made.
        let (target, _) = ensure(dev, &Path::new("pts").join(relative(n)), true, &[])?;
        let tree = sys::clone_tree(fd.as_fd(), false)?;
        sys::attach(tree.as_fd(), target.as_fd())?;
    }
    tmpfs_at(dev, "shm", c"1777", c"64m")?;
    for (name, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        nix::unistd::symlinkat(to, dev, name)?;
    }
    Ok(())
}

fn open_here(p: &str) -> io::Result<OwnedFd> {
    Ok(openat2(nix::fcntl::AT_FDCWD, p, no_follow())?)
}

/// Step 5a: the Landlock ruleset (created, not yet enforced), from the
/// descriptors opened before the pivot and the job root's own devices.
fn landlock_ruleset(p: &WirePlan, prep: Prepared) -> StepResult<landlock::RulesetCreated> {
    let abi = ABI::from(p.landlock_abi as i32);
    let err = |e: landlock::RulesetError| (Step::Landlock, io::Error::other(e.to_string()));
    let mut rs = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(abi))
        .map_err(err)?;
    if p.net != WireNet::Allow && p.landlock_abi >= crate::LANDLOCK_ABI_NET {
        rs = rs.handle_access(AccessNet::from_all(abi)).map_err(err)?;
    }
    if p.landlock_abi >= crate::LANDLOCK_ABI_SCOPE {
        rs = rs.scope(Scope::from_all(abi)).map_err(err)?;
    }
    let mut created = rs.create().map_err(err)?;
    let add =
        |created: landlock::RulesetCreated, fd: OwnedFd, access: landlock::BitFlags<AccessFs>| {
            let is_dir = identity(fd.as_fd()).map(|(_, _, d)| d).unwrap_or(false);
            let access = if is_dir {
                access
            } else {
                access & AccessFs::from_file(abi)
            };
            created
                .add_rule(PathBeneath::new(fd, access))
                .map_err(|e| (Step::Landlock, io::Error::other(e.to_string())))
        };
    let open = |path: &str| open_here(path).map_err(at(Step::Landlock));
    let read = AccessFs::from_read(abi);
    match &p.read {
        None => created = add(created, open("/")?, read)?,
        Some(_) => {
            for fd in prep.grants.read {
                created = add(created, fd, read)?;
            }
            created = add(created, open("/proc")?, read)?;
        }
    }
    for fd in prep.grants.write {
        created = add(created, fd, AccessFs::from_all(abi))?;
    }
    let rw_dev = AccessFs::ReadFile | AccessFs::WriteFile;
    created = add(created, open("/dev/null")?, rw_dev)?;
    for dev in ["/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"] {
        created = add(created, open(dev)?, AccessFs::ReadFile.into())?;
    }
    created = add(created, open("/dev/shm")?, AccessFs::from_all(abi))?;
    // A root `/dev`: the job's own. Written, the devices beneath become
    // writable too (null, zero, full, random, urandom: any user's on any
    // host; tty: writable already with a terminal, ENXIO without).
    match prep.dev_root {
        Some(true) => created = add(created, open("/dev")?, AccessFs::from_all(abi))?,
        Some(false) => created = add(created, open("/dev")?, AccessFs::ReadDir.into())?,
        None => {}
    }
    if prep.tty {
        let tty_access = if p.landlock_abi >= 5 {
            rw_dev | AccessFs::IoctlDev
        } else {
            rw_dev
        };
        created = add(created, open("/dev/tty")?, tty_access)?;
        if let Ok(t) = std::fs::read_link("/proc/self/fd/0") {
            if let Some(t) = t.to_str().filter(|t| t.starts_with("/dev/pts/")) {
                created = add(created, open(t)?, tty_access)?;
            }
        }
    }
    let ports = match &p.net {
        WireNet::Tcp(ports) => ports.clone(),
        WireNet::Egress { port } => vec![*port],
        WireNet::Deny | WireNet::Allow => Vec::new(),
    };
    if p.landlock_abi >= crate::LANDLOCK_ABI_NET {
        for port in ports {
            created = created
                .add_rule(NetPort::new(port, AccessNet::ConnectTcp))
                .map_err(err)?;
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

fn cond64(arg: u8, op: SeccompCmpOp, v: u64) -> io::Result<SeccompCondition> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, v)
        .map_err(|e| io::Error::other(e.to_string()))
}

/// Deny every socket type (`type & SOCK_TYPE_MASK`: four bits, 16 values;
/// the kernel refuses any other bit but `SOCK_NONBLOCK` and
/// `SOCK_CLOEXEC`) but `allowed`: an allow-list, as a few masked
/// comparisons of argument 1's low four bits that together match every
/// other type and never an allowed one (a cover of the refused values by
/// bit patterns: for stream and seqpacket, bit 3 set, or bit 3 clear and
/// bit 1 set, or bits 3, 1 and 0 clear; three rules instead of one per
/// refused type, so a shorter program for the kernel to convert and JIT
/// at every job's start).
fn types_except(allowed: &[u64]) -> io::Result<Vec<SeccompRule>> {
    type_patterns(allowed)?
        .into_iter()
        .map(|(mask, value)| rule(vec![cond(1, SeccompCmpOp::MaskedEq(mask), value)?]))
        .collect()
}

/// `(mask, value)` pairs over the four type bits such that a type `t` is
/// outside `allowed` exactly when `t & mask == value` for one of them
/// (greedy: each pattern the one matching the most refused types left;
/// `(0xf, t)` always matches a refused `t`, so every one is covered). An
/// allowed value beyond the four bits is an error: it could not be told
/// apart from the type its low bits name.
fn type_patterns(allowed: &[u64]) -> io::Result<Vec<(u64, u64)>> {
    if let Some(bad) = allowed.iter().find(|&&a| a > 0xf) {
        return Err(io::Error::other(format!(
            "socket type {bad:#x} is not a type"
        )));
    }
    let hits = |(mask, value): (u64, u64), t: u64| t & mask == value;
    let candidates: Vec<(u64, u64)> = (0..16u64)
        .flat_map(|mask| (0..16u64).map(move |value| (mask, value)))
        .filter(|&(mask, value)| value & !mask == 0)
        .filter(|&p| !allowed.iter().any(|&a| hits(p, a)))
        .collect();
    let mut left: Vec<u64> = (0..16).filter(|t| !allowed.contains(t)).collect();
    let mut out = Vec::new();
    while !left.is_empty() {
        let best = candidates
            .iter()
            .copied()
            .max_by_key(|&p| left.iter().filter(|&&t| hits(p, t)).count())
            .filter(|&p| left.iter().any(|&t| hits(p, t)))
            .ok_or_else(|| io::Error::other("no pattern covers the refused socket types"))?;
        left.retain(|&t| !hits(best, t));
        out.push(best);
    }
    Ok(out)
}

/// This build's `AUDIT_ARCH_*` (`seccomp_data.arch` of a native syscall).
#[cfg(target_arch = "x86_64")]
pub const NATIVE_AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
pub const NATIVE_AUDIT_ARCH: u32 = 0xc000_00b7;
#[cfg(target_arch = "riscv64")]
pub const NATIVE_AUDIT_ARCH: u32 = 0xc000_00f3;

/// The head of the job's one seccomp program, checks seccompiler cannot
/// express (it checks only the architecture, and gives one action to all
/// its rules), falling through to the rule list after it:
/// - (x86_64) the x32 guard: any architecture but x86_64 (i386 through
///   `int 0x80`) kills the process, and a syscall number with
///   `__X32_SYSCALL_BIT` set is refused with EPERM;
/// - `clone3` answers ENOSYS, so libc falls back to `clone`, whose flags
///   the rule list can read;
/// - `openat2` answers ENOSYS, so callers fall back to `openat`, whose
///   flags and mode the rule list can read (set-id modes,
///   [`set_id_modes`]).
///
/// One program instead of one per check: the kernel converts and JITs it
/// once per job, and runs one filter per system call of the job. In one
/// program the first answer wins (across filters the strictest did): the
/// head's EPERM and ENOSYS take precedence over the rule list, whose
/// answers are all EPERM today; a stricter rule (KILL, TRAP) for clone3 or
/// an x32 number would have to go in the head.
pub fn program_head() -> Vec<seccompiler::sock_filter> {
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const RET_K: u16 = 0x06;
    let ins = |code, jt, jf, k| seccompiler::sock_filter { code, jt, jf, k };
    let mut head = vec![
        ins(LD_W_ABS, 0, 0, 4), // seccomp_data.arch
        // The native architecture: any other (a compat ABI) is killed
        // before a number is looked at.
        ins(JEQ_K, 1, 0, NATIVE_AUDIT_ARCH),
        ins(RET_K, 0, 0, libc::SECCOMP_RET_KILL_PROCESS),
        ins(LD_W_ABS, 0, 0, 0), // seccomp_data.nr
    ];
    #[cfg(target_arch = "x86_64")]
    {
        const JGE_K: u16 = 0x35;
        const X32_SYSCALL_BIT: u32 = 0x4000_0000;
        head.extend([
            ins(JGE_K, 0, 1, X32_SYSCALL_BIT),
            ins(RET_K, 0, 0, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
        ]);
    }
    head.extend([
        ins(JEQ_K, 0, 1, libc::SYS_clone3 as u32),
        ins(RET_K, 0, 0, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
        ins(JEQ_K, 0, 1, libc::SYS_openat2 as u32),
        ins(RET_K, 0, 0, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
    ]);
    head
}

/// A binary search over the syscall numbers the rules name (`keys`,
/// sorted; `true`: refused whatever the arguments), placed between
/// [`program_head`] (which leaves the number in the accumulator) and the
/// rule list: a number without rules is allowed, and one always refused
/// is refused with EPERM, after about log2(len) comparisons instead of a
/// walk down seccompiler's linear chain (two instructions per syscall it
/// names); a number with argument rules jumps to its own block of the
/// chain (`blocks`, [`chain_blocks`]: the block's `JEQ` matches the number
/// still in the accumulator, and its rules decide as before), or falls
/// through to the chain's start when it has no known block. It changes no answer (a test runs this
/// program and the chain alone on every number and the rules' argument
/// values), only the work: each of the job's syscalls, and the kernel's
/// emulation of the program for every syscall number when the filter is
/// installed (its action cache: about half of the install's cost before).
/// `None` when the search would not fit conditional jumps (over 255
/// instructions); the chain alone then decides everything.
pub fn number_dispatch(
    keys: &[(u32, bool)],
    blocks: &BTreeMap<u32, usize>,
) -> Option<Vec<seccompiler::sock_filter>> {
    const JEQ_K: u16 = 0x15;
    const JGE_K: u16 = 0x35;
    const JA: u16 = 0x05;
    const RET_K: u16 = 0x06;
    const RET_ALLOW: u32 = 0x7fff_0000;
    /// A jump to the end of the search (the chain), resolved once the
    /// length is known.
    const TO_CHAIN: u8 = u8::MAX;
    /// Jumps to a syscall's own block of the chain: (index of the `JA`,
    /// the block's offset in the chain), resolved once the length is known.
    type Fixups = Vec<(usize, usize)>;
    fn emit(
        keys: &[(u32, bool)],
        blocks: &BTreeMap<u32, usize>,
        out: &mut Vec<seccompiler::sock_filter>,
        fix: &mut Fixups,
    ) -> Option<()> {
        let ins = |code, jt, jf, k| seccompiler::sock_filter { code, jt, jf, k };
        if keys.len() <= 4 {
            for &(k, refused) in keys {
                if refused {
                    out.push(ins(JEQ_K, 0, 1, k));
                    out.push(ins(
                        RET_K,
                        0,
                        0,
                        libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
                    ));
                } else if let Some(&block) = blocks.get(&k) {
                    // Straight to the syscall's block (its `JEQ` matches
                    // the number still in the accumulator), not down the
                    // chain's comparisons of every syscall before it.
                    out.push(ins(JEQ_K, 0, 1, k));
                    fix.push((out.len(), block));
                    out.push(ins(JA, 0, 0, 0));
                } else {
                    out.push(ins(JEQ_K, TO_CHAIN, 0, k));
                }
            }
            out.push(ins(RET_K, 0, 0, RET_ALLOW));
            return Some(());
        }
        let (left, right) = keys.split_at(keys.len() / 2);
        let at = out.len();
        // A >= right[0]: the right half (after the left half's code).
        out.push(ins(JGE_K, 0, 0, right[0].0));
        emit(left, blocks, out, fix)?;
        out[at].jt = u8::try_from(out.len() - at - 1).ok()?;
        emit(right, blocks, out, fix)
    }
    if keys.is_empty() {
        return None;
    }
    let mut out = Vec::new();
    let mut fix = Vec::new();
    emit(keys, blocks, &mut out, &mut fix)?;
    let len = out.len();
    for (i, f) in out.iter_mut().enumerate() {
        if f.code == JEQ_K && f.jt == TO_CHAIN && f.jf == 0 {
            f.jt = u8::try_from(len - i - 1).ok()?;
        }
    }
    for (i, block) in fix {
        out[i].k = u32::try_from(len - i - 1 + block).ok()?;
    }
    Some(out)
}

/// Where each syscall's block starts in seccompiler's program `rules`,
/// compiled from `deny` (blocks follow the load of the number, one per
/// syscall in number order: its `JEQ`, each rule's two jumps, conditions
/// and return, the block's return); `None` when the program is not laid
/// out so (each block is checked to start with its `JEQ`).
fn chain_blocks(
    rules: &[seccompiler::sock_filter],
    deny: &DenyMap,
) -> Option<BTreeMap<u32, usize>> {
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    let mut at = rules.iter().position(|f| f.code == LD_W_ABS && f.k == 0)? + 1;
    let mut out = BTreeMap::new();
    for (&nr, chain) in deny {
        let nr = u32::try_from(nr).ok()?;
        let f = rules.get(at)?;
        if (f.code, f.k) != (JEQ_K, nr) {
            return None;
        }
        out.insert(nr, at);
        let body: usize = if chain.is_empty() {
            3
        } else {
            chain
                .iter()
                .map(|r| seccompiler::BpfProgram::from(r.clone()).len() + 1)
                .sum()
        };
        at += 1 + body + 1;
    }
    (at < rules.len()).then_some(out)
}

/// `open_tree_attr` (Linux 6.15; the number is the same on every
/// architecture since 5.1's common table; not in the libc crate yet).
const SYS_OPEN_TREE_ATTR: libc::c_long = 467;

/// Syscalls refused (EPERM) to every job, whatever its arguments.
const ALWAYS_DENIED: &[libc::c_long] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    // Another process's descriptor, copied in (the agent's sockets, for a
    // job outside the namespaces: a degraded `allow_hosts` job).
    libc::SYS_pidfd_getfd,
    // io_uring opens files and sockets without the syscalls filtered here.
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_fsopen,
    libc::SYS_fsmount,
    libc::SYS_fsconfig,
    libc::SYS_fspick,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    SYS_OPEN_TREE_ATTR,
    libc::SYS_mount_setattr,
    // Watching what was granted is fine; fanotify needs privileges the
    // job does not have, refused outright for clarity.
    libc::SYS_fanotify_init,
];

/// Terminal ioctls refused to every job (EPERM): faking input into the
/// terminal's other readers (`TIOCSTI`; `TIOCLINUX`, whose selection
/// paste does the same on a virtual console), changing the line
/// discipline (`TIOCSETD`: the kernel loads and runs the discipline's
/// code, a module autoloaded on demand on many hosts: n_gsm, n_hdlc and
/// others had exploitable bugs), redirecting the console (`TIOCCONS`) and
/// reconfiguring serial hardware (`TIOCSSERIAL`). `TIOCSCTTY` stays
/// allowed: the job takes its terminal with it after the filter is in
/// force.
const REFUSED_IOCTLS: [u64; 5] = [
    libc::TIOCSTI,
    libc::TIOCLINUX,
    libc::TIOCSETD,
    libc::TIOCCONS,
    libc::TIOCSSERIAL,
];

/// `fchmodat2` (Linux 6.6; the same number on every architecture).
const SYS_FCHMODAT2: libc::c_long = 452;

/// The bits of a mode that confer privileges on whoever runs the file.
const SET_ID_BITS: [u64; 2] = [libc::S_ISUID as u64, libc::S_ISGID as u64];

/// The flags under which `open` reads its mode: `O_CREAT`, and
/// `O_TMPFILE`'s own bit (an unnamed file a later `linkat` names).
const OPEN_MODE_FLAGS: [u64; 2] = [libc::O_CREAT as u64, 0o20_000_000];

/// Set-id bits refused in every mode a job gives (EPERM): a set-uid or
/// set-gid file made in a write root runs as the agent's user for anyone
/// on the host who can reach it. The mode changes (`chmod`, `fchmod`,
/// `fchmodat`, `fchmodat2`) and the modes of what is made (`mkdir`,
/// `mkdirat`, `mknod`, `mknodat`; `open`, `openat` with `O_CREAT` or
/// `O_TMPFILE`, `creat`). The mode is compared in its low 32 bits (a
/// `umode_t` of 16 for the kernel): bits above cannot hide the set-id
/// ones. `openat2` takes its mode in a structure seccomp cannot read: it
/// is ENOSYS in [`program_head`] instead, and libc falls back to `openat`.
/// `io_uring` (which opens files itself) is refused outright, and file
/// capabilities need `CAP_SETFCAP`, which the job does not have.
fn set_id_modes(deny: &mut DenyMap) -> io::Result<()> {
    use libc::*;
    let bits = |arg: u8| -> io::Result<Vec<SeccompRule>> {
        SET_ID_BITS
            .iter()
            .map(|&b| rule(vec![cond(arg, SeccompCmpOp::MaskedEq(b), b)?]))
            .collect()
    };
    let mut mode_args: Vec<(c_long, u8)> = vec![
        (SYS_fchmod, 1),
        (SYS_fchmodat, 2),
        (SYS_FCHMODAT2, 2),
        (SYS_mkdirat, 2),
        (SYS_mknodat, 2),
    ];
    #[cfg(target_arch = "x86_64")]
    mode_args.extend([
        (SYS_chmod, 1),
        (SYS_mkdir, 1),
        (SYS_mknod, 1),
        (SYS_creat, 1),
    ]);
    for (nr, arg) in mode_args {
        deny.insert(nr, bits(arg)?);
    }
    let mut open_args: Vec<(c_long, u8, u8)> = vec![(SYS_openat, 2, 3)];
    #[cfg(target_arch = "x86_64")]
    open_args.push((SYS_open, 1, 2));
    for (nr, flags, mode) in open_args {
        let mut rules = Vec::new();
        for f in OPEN_MODE_FLAGS {
            for b in SET_ID_BITS {
                rules.push(rule(vec![
                    cond(flags, SeccompCmpOp::MaskedEq(f), f)?,
                    cond(mode, SeccompCmpOp::MaskedEq(b), b)?,
                ])?);
            }
        }
        deny.insert(nr, rules);
    }
    Ok(())
}

/// The `clone` flags that make new namespaces, refused to every job.
const CLONE_NAMESPACE_FLAGS: &[libc::c_int] = &[
    libc::CLONE_NEWNS,
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWCGROUP,
];

/// The socket types a job may make `AF_UNIX` sockets of.
const UNIX_TYPES: &[u64] = &[libc::SOCK_STREAM as u64, libc::SOCK_SEQPACKET as u64];

/// Syscall number to the rules under which it is refused (no rule: always).
type DenyMap = BTreeMap<i64, Vec<SeccompRule>>;

/// The rules every job gets, whatever its network.
fn base_denials() -> io::Result<DenyMap> {
    use libc::*;
    let mut deny = DenyMap::new();
    for &nr in ALWAYS_DENIED {
        deny.insert(nr, vec![]);
    }
    // Terminal ioctls (the command is 32 bits: the kernel drops the
    // upper word, and so does a `Dword` comparison).
    deny.insert(
        SYS_ioctl,
        REFUSED_IOCTLS
            .iter()
            .map(|&cmd| rule(vec![cond(1, SeccompCmpOp::Eq, cmd)?]))
            .collect::<io::Result<_>>()?,
    );
    set_id_modes(&mut deny)?;
    // New namespaces through clone flags.
    let mut clone_rules = Vec::new();
    for &f in CLONE_NAMESPACE_FLAGS {
        clone_rules.push(rule(vec![cond(
            0,
            SeccompCmpOp::MaskedEq(f as u64),
            f as u64,
        )?])?);
    }
    deny.insert(SYS_clone, clone_rules);
    Ok(deny)
}

/// Anything but `AF_UNIX` sockets of [`UNIX_TYPES`] refused.
fn unix_only() -> io::Result<Vec<SeccompRule>> {
    let mut rules = vec![rule(vec![cond(
        0,
        SeccompCmpOp::Ne,
        libc::AF_UNIX as u64,
    )?])?];
    rules.extend(types_except(UNIX_TYPES)?);
    Ok(rules)
}

/// `network: "deny"`: no socket can address anything.
fn deny_network(deny: &mut DenyMap) -> io::Result<()> {
    use libc::*;
    // AF_UNIX only, stream and seqpacket only: without connect or
    // bind, such a socket can address nothing (a name on sendto /
    // sendmsg is refused or ignored for these types); no datagram
    // socket, which could send to any pathname socket by name.
    let rules = unix_only()?;
    deny.insert(SYS_socket, rules.clone());
    deny.insert(SYS_socketpair, rules);
    for nr in [SYS_connect, SYS_bind, SYS_listen, SYS_accept, SYS_accept4] {
        deny.insert(nr, vec![]);
    }
    // A destination address on sendto, whatever the socket.
    deny.insert(
        SYS_sendto,
        vec![rule(vec![cond64(4, SeccompCmpOp::Ne, 0)?])?],
    );
    Ok(())
}

/// Port allow-lists and egress: outgoing TCP streams only.
fn tcp_connect_only(deny: &mut DenyMap) -> io::Result<()> {
    use libc::*;
    // TCP stream sockets (Landlock limits their ports; with egress
    // the namespace has nothing but the proxy), IPv4 and
    // IPv6, protocol 0 or IPPROTO_TCP (not MPTCP, not SCTP); Unix
    // sockets only as connected pairs (connect is allowed here and
    // could reach a pathname socket).
    let mut rules = vec![rule(vec![
        cond(0, SeccompCmpOp::Ne, AF_INET as u64)?,
        cond(0, SeccompCmpOp::Ne, AF_INET6 as u64)?,
    ])?];
    rules.extend(types_except(&[SOCK_STREAM as u64])?);
    rules.push(rule(vec![
        cond(2, SeccompCmpOp::Ne, 0)?,
        cond(2, SeccompCmpOp::Ne, IPPROTO_TCP as u64)?,
    ])?);
    deny.insert(SYS_socket, rules);
    deny.insert(SYS_socketpair, unix_only()?);
    for nr in [SYS_listen, SYS_accept, SYS_accept4] {
        deny.insert(nr, vec![]);
    }
    deny_tcp_fastopen(deny)
}

/// TCP Fast Open connects from a send call, around Landlock's connect
/// rule: refused on the send calls and as a socket option.
fn deny_tcp_fastopen(deny: &mut DenyMap) -> io::Result<()> {
    use libc::*;
    let fastopen = MSG_FASTOPEN as u64;
    for (nr, flags_arg) in [(SYS_sendto, 3), (SYS_sendmsg, 2), (SYS_sendmmsg, 3)] {
        deny.insert(
            nr,
            vec![rule(vec![cond(
                flags_arg,
                SeccompCmpOp::MaskedEq(fastopen),
                fastopen,
            )?])?],
        );
    }
    const TCP_FASTOPEN_CONNECT: u64 = 30;
    deny.insert(
        SYS_setsockopt,
        vec![
            rule(vec![
                cond(1, SeccompCmpOp::Eq, IPPROTO_TCP as u64)?,
                cond(2, SeccompCmpOp::Eq, TCP_FASTOPEN_CONNECT)?,
            ])?,
            rule(vec![
                cond(1, SeccompCmpOp::Eq, IPPROTO_TCP as u64)?,
                cond(2, SeccompCmpOp::Eq, TCP_FASTOPEN as u64)?,
            ])?,
        ],
    );
    Ok(())
}

/// A filter allowing everything but `rules`, which get `errno`.
fn filter(rules: DenyMap, errno: i32, arch: seccompiler::TargetArch) -> io::Result<SeccompFilter> {
    SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        arch,
    )
    .map_err(|e| io::Error::other(e.to_string()))
}

/// The network shapes the seccomp programs differ by (a port list is
/// Landlock's, not seccomp's): allow, deny, TCP connect only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NetShape {
    Allow = 0,
    Deny = 1,
    TcpOnly = 2,
}

impl NetShape {
    const ALL: [NetShape; 3] = [NetShape::Allow, NetShape::Deny, NetShape::TcpOnly];

    fn of(net: &WireNet) -> NetShape {
        match net {
            WireNet::Allow => NetShape::Allow,
            WireNet::Deny => NetShape::Deny,
            WireNet::Tcp(_) | WireNet::Egress { .. } => NetShape::TcpOnly,
        }
    }
}

/// The programs of every [`NetShape`], compiled once by
/// [`precompile_seccomp`] (the spawner, before it forks any supervisor;
/// every job's init inherits them by fork).
static PROGRAMS: std::sync::OnceLock<[Vec<seccompiler::BpfProgram>; 3]> =
    std::sync::OnceLock::new();

/// Compile the seccomp programs of every network shape now, so that a job
/// installs them without compiling (the spawner calls this once; the
/// programs are the ones [`seccomp_programs`] would compile per job).
pub fn precompile_seccomp() -> io::Result<()> {
    let [a, d, t] = NetShape::ALL;
    let all = [
        compile_seccomp(a)?,
        compile_seccomp(d)?,
        compile_seccomp(t)?,
    ];
    let _ = PROGRAMS.set(all);
    Ok(())
}

/// Step 5c: the seccomp program ([`program_head`], then the EPERM list
/// and socket allow-lists; one program in a list of one): precompiled when [`precompile_seccomp`] ran in this process
/// or an ancestor it forked from, else compiled now.
pub fn seccomp_programs(
    net: &WireNet,
) -> io::Result<std::borrow::Cow<'static, [seccompiler::BpfProgram]>> {
    let shape = NetShape::of(net);
    match PROGRAMS.get() {
        Some(all) => Ok(std::borrow::Cow::Borrowed(&all[shape as usize])),
        None => compile_seccomp(shape).map(std::borrow::Cow::Owned),
    }
}

fn compile_seccomp(shape: NetShape) -> io::Result<Vec<seccompiler::BpfProgram>> {
    compile_seccomp_with(shape, true)
}

/// [`compile_seccomp`], with or without the [`number_dispatch`] (without:
/// the reference its answers are tested against).
fn compile_seccomp_with(
    shape: NetShape,
    dispatch: bool,
) -> io::Result<Vec<seccompiler::BpfProgram>> {
    let mut deny = base_denials()?;
    match shape {
        NetShape::Allow => {}
        NetShape::Deny => deny_network(&mut deny)?,
        NetShape::TcpOnly => tcp_connect_only(&mut deny)?,
    }
    let arch = seccompiler::TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| io::Error::other(e.to_string()))?;
    let keys: Vec<(u32, bool)> = deny
        .iter()
        .map(|(&nr, rules)| (nr as u32, rules.is_empty()))
        .collect();
    let compile = |deny: DenyMap| -> io::Result<seccompiler::BpfProgram> {
        filter(deny, libc::EPERM, arch)?
            .try_into()
            .map_err(|e: seccompiler::BackendError| io::Error::other(e.to_string()))
    };
    // The search refuses the syscalls without rules itself: the chain need
    // not name them.
    let mut with_rules = deny.clone();
    with_rules.retain(|_, rules| !rules.is_empty());
    let chain = compile(with_rules.clone())?;
    let dispatch = match chain_blocks(&chain, &with_rules) {
        Some(blocks) if dispatch => number_dispatch(&keys, &blocks),
        _ => None,
    };
    let rules = match dispatch {
        Some(_) => chain,
        None => compile(deny)?,
    };
    // The head falls through to the rules (BPF jumps are relative and go
    // forward only, so the rules' own jumps are unchanged behind it).
    let mut program = program_head();
    program.extend(dispatch.unwrap_or_default());
    program.extend(rules);
    if program.len() > BPF_MAXINSNS {
        return Err(io::Error::other(format!(
            "the seccomp program has {} instructions, over the kernel's {BPF_MAXINSNS}",
            program.len()
        )));
    }
    Ok(vec![program])
}

/// The kernel's bound on a classic BPF program's length.
const BPF_MAXINSNS: usize = 4096;

/// Step 5: the second layer, capabilities, no_new_privs and seccomp, on
/// the calling process (the init; the job inherits it).
pub fn confine(p: &WirePlan, prep: Prepared) -> StepResult<()> {
    let ruleset = if p.landlock_abi > 0 {
        Some(landlock_ruleset(p, prep)?)
    } else {
        None
    };
    let filters = seccomp_programs(&p.net).map_err(at(Step::Seccomp))?;
    sys::drop_all_capabilities().map_err(at(Step::Capabilities))?;
    nix::sys::prctl::set_no_new_privs().map_err(at(Step::LandlockRestrict))?;
    if let Some(ruleset) = ruleset {
        let status = ruleset
            .restrict_self()
            .map_err(|e| (Step::LandlockRestrict, io::Error::other(e.to_string())))?;
        if status.ruleset != RulesetStatus::FullyEnforced || !status.no_new_privs {
            return Err((
                Step::LandlockRestrict,
                io::Error::other(format!("Landlock not fully enforced: {:?}", status.ruleset)),
            ));
        }
    }
    for f in filters.iter() {
        sys::install_bpf(f).map_err(at(Step::Seccomp))?;
    }
    Ok(())
}

/// A C string of a path, for exec.
pub fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ensure` beneath a host directory bound into a fresh root (a write
    /// root): a missing name is `ENOENT` and nothing is made on the host;
    /// in the root's own tmpfs missing directories are made (control).
    /// In a forked child, in new user and mount namespaces.
    #[test]
    fn ensure_makes_nothing_beneath_a_mount_bound_from_the_host() {
        let base = std::env::temp_dir().join(format!("sbx-ensure-{}", std::process::id()));
        let ws = base.join("ws");
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        let ws = std::fs::canonicalize(ws).unwrap();
        let tmp = base.join("own-tmp");
        std::fs::create_dir_all(&tmp).unwrap();
        let (uid, gid) = (
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
        );
        let child = || -> Result<(), String> {
            let step = |what: &'static str| move |e: io::Error| format!("{what}: {e}");
            nix::sched::unshare(
                nix::sched::CloneFlags::CLONE_NEWUSER | nix::sched::CloneFlags::CLONE_NEWNS,
            )
            .map_err(|e| format!("unshare: {e}"))?;
            write_id_maps(uid, gid).map_err(step("id maps"))?;
            make_mounts_private().map_err(|(_, e)| format!("private: {e}"))?;
            let src = open_here(ws.to_str().unwrap()).map_err(step("open ws"))?;
            let tree = clone_with(src.as_fd(), RW).map_err(step("clone ws"))?;
            let own = open_here(tmp.to_str().unwrap()).map_err(step("open tmp"))?;
            let own_tree = clone_with(own.as_fd(), RW).map_err(step("clone tmp"))?;
            let root = stage_fresh_root().map_err(|(_, e)| format!("stage: {e}"))?;
            let rel = relative(&ws);
            bind_at(root.as_fd(), &rel, src.as_fd(), tree.as_fd(), false, &[])
                .map_err(step("bind ws"))?;
            for file in [true, false] {
                match ensure(root.as_fd(), &rel.join("gone"), file, &[]) {
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                    other => return Err(format!("beneath the bound ws (file {file}): {other:?}")),
                }
            }
            // The job's own `:tmp` (a host directory of its own) may get
            // mount points: its mount id is passed in `also`.
            bind_at(
                root.as_fd(),
                Path::new("own-tmp"),
                own.as_fd(),
                own_tree.as_fd(),
                true,
                &[],
            )
            .map_err(step("bind tmp"))?;
            let also = [sys::mount_id(own_tree.as_fd()).map_err(step("mount id"))?];
            match ensure(root.as_fd(), Path::new("own-tmp/made"), false, &[]) {
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                other => return Err(format!("in :tmp without its id: {other:?}")),
            }
            ensure(root.as_fd(), Path::new("own-tmp/made"), false, &also)
                .map_err(step("control: in the job's :tmp"))?;
            let (_, existed) = ensure(root.as_fd(), &rel.join("sub"), false, &[])
                .map_err(step("control: an existing name beneath ws"))?;
            let (_, made) = ensure(root.as_fd(), Path::new("skeleton/dir"), false, &[])
                .map_err(step("control: the root's own tmpfs"))?;
            if !existed || made {
                return Err(format!("existed {existed}, made {made}"));
            }
            Ok(())
        };
        executor_sys::in_forked_child(child).unwrap();
        assert!(
            std::fs::symlink_metadata(ws.join("gone")).is_err(),
            "made on the host"
        );
        assert!(tmp.join("made").is_dir(), "control: made in :tmp");
        let _ = std::fs::remove_dir_all(base);
    }

    /// What a job installs is the same program whether the spawner
    /// compiled it ahead or the job compiles it, for every network intent
    /// (a port list changes Landlock's rules, not seccomp's).
    /// Run a classic BPF seccomp program (the instructions seccompiler
    /// and the head use) on one `seccomp_data`; the action and the number
    /// of instructions run.
    fn run_bpf(
        prog: &[seccompiler::sock_filter],
        arch: u32,
        nr: u32,
        args: [u64; 6],
    ) -> (u32, usize) {
        let word = |off: u32| -> u32 {
            match off {
                0 => nr,
                4 => arch,
                8 | 12 => 0,
                o if (16..64).contains(&o) && o % 4 == 0 => {
                    let a = args[((o - 16) / 8) as usize];
                    if (o - 16) % 8 == 0 {
                        a as u32
                    } else {
                        (a >> 32) as u32
                    }
                }
                o => panic!("load at {o}"),
            }
        };
        let (mut a, mut pc, mut steps) = (0u32, 0usize, 0usize);
        loop {
            let f = &prog[pc];
            steps += 1;
            let (jt, jf) = (usize::from(f.jt), usize::from(f.jf));
            pc += 1;
            match f.code {
                0x20 => a = word(f.k),
                0x54 => a &= f.k,
                0x05 => pc += f.k as usize,
                0x06 => return (f.k, steps),
                0x15 => pc += if a == f.k { jt } else { jf },
                0x25 => pc += if a > f.k { jt } else { jf },
                0x35 => pc += if a >= f.k { jt } else { jf },
                0x45 => pc += if a & f.k != 0 { jt } else { jf },
                c => panic!("instruction {c:#x} at {}", pc - 1),
            }
        }
    }

    // The socket calls' answers under every network shape, against a
    // plain statement of what each allows: every domain the filters name
    // and a few they do not, every one of the 16 types with each flag, the
    // protocols they name.
    #[test]
    fn socket_calls_are_refused_outside_the_allowed_triples_only() {
        use libc::*;
        const ALLOW: u32 = 0x7fff_0000;
        let eperm = SECCOMP_RET_ERRNO | EPERM as u32;
        for shape in NetShape::ALL {
            let prog = compile_seccomp(shape).unwrap().remove(0);
            for nr in [SYS_socket, SYS_socketpair] {
                for domain in [AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_PACKET, AF_VSOCK] {
                    for t in 0..16 {
                        for flags in [0, SOCK_NONBLOCK, SOCK_CLOEXEC, SOCK_NONBLOCK | SOCK_CLOEXEC]
                        {
                            for proto in [0, IPPROTO_TCP, IPPROTO_UDP, IPPROTO_MPTCP, IPPROTO_SCTP]
                            {
                                let unix =
                                    domain == AF_UNIX && [SOCK_STREAM, SOCK_SEQPACKET].contains(&t);
                                let tcp = [AF_INET, AF_INET6].contains(&domain)
                                    && t == SOCK_STREAM
                                    && [0, IPPROTO_TCP].contains(&proto);
                                let allowed = match (shape, nr) {
                                    (NetShape::Allow, _) => true,
                                    (NetShape::Deny, _) => unix,
                                    (NetShape::TcpOnly, n) if n == SYS_socket => tcp,
                                    (NetShape::TcpOnly, _) => unix,
                                };
                                // Bits the type's check must not read: the
                                // high word, and bits the kernel refuses.
                                for extra in [0, 1 << 32, 0xffff_ffff << 32, 0x10, 1 << 31] {
                                    let ty = (t | flags) as u64 | extra;
                                    let args = [domain as u64, ty, proto as u64, 0, 0, 0];
                                    let (action, _) =
                                        run_bpf(&prog, NATIVE_AUDIT_ARCH, nr as u32, args);
                                    assert_eq!(
                                        action,
                                        if allowed { ALLOW } else { eperm },
                                        "{shape:?} nr {nr} domain {domain} type {ty:#x} proto {proto}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
        // The cover is the allow-list's complement, for every list of
        // types; a value beyond the type bits is refused.
        for set in 0..1u32 << 16 {
            let allowed: Vec<u64> = (0..16).filter(|t| set & 1 << t != 0).collect();
            let pats = type_patterns(&allowed).unwrap();
            for t in 0..16u64 {
                let refused = pats.iter().any(|&(m, v)| t & m == v);
                assert_eq!(refused, !allowed.contains(&t), "{allowed:?} type {t}");
            }
        }
        assert!(type_patterns(&[17]).is_err());
        assert!(type_patterns(&[1, 0x801]).is_err());
        assert_eq!(type_patterns(UNIX_TYPES).unwrap().len(), 3);
        assert_eq!(type_patterns(&[libc::SOCK_STREAM as u64]).unwrap().len(), 4);
        // 371 and 416 instructions with one rule per refused type (240 and
        // 285 with the cover; 490 and 538 with the set-id modes and the
        // dispatch's jumps into each syscall's block).
        let len = |s| compile_seccomp(s).unwrap()[0].len();
        assert!(len(NetShape::Deny) <= 490, "{}", len(NetShape::Deny));
        assert!(len(NetShape::TcpOnly) <= 538, "{}", len(NetShape::TcpOnly));
    }

    /// Mount points of mountinfo with octal escapes decode to the path;
    /// a backslash without three octal digits stays as it is.
    #[test]
    fn mount_points_are_unescaped() {
        assert_eq!(
            unescape_mount_point("/a\\040b\\011c\\012d\\134e"),
            Path::new("/a b\tc\nd\\e")
        );
        assert_eq!(unescape_mount_point("/x\\09y\\"), Path::new("/x\\09y\\"));
        assert_eq!(
            unescape_mount_point("/sys/fs/cgroup"),
            Path::new("/sys/fs/cgroup")
        );
    }

    /// Set-id bits in any mode a job gives are refused (EPERM), whatever
    /// else the mode or the register holds; other modes, and open's mode
    /// without `O_CREAT`/`O_TMPFILE`, are not; `openat2` is ENOSYS; the
    /// refused terminal ioctls are refused with any upper word, others not.
    #[test]
    fn set_id_modes_and_tty_ioctls_are_refused_in_every_shape() {
        use libc::*;
        const ALLOW: u32 = 0x7fff_0000;
        let eperm = SECCOMP_RET_ERRNO | EPERM as u32;
        let enosys = SECCOMP_RET_ERRNO | ENOSYS as u32;
        let mut modes: Vec<u64> = (0..0o10000).step_by(7).collect();
        modes.extend([0o4000, 0o2000, 0o6755, 0o1777, 0o777, 0o644]);
        let extras = [0, 0xffff_0000, 1 << 32, 0xffff_ffff << 32];
        let tmpfile = 0o20_000_000u64;
        for shape in NetShape::ALL {
            let prog = compile_seccomp(shape).unwrap().remove(0);
            let run =
                |nr: c_long, args: [u64; 6]| run_bpf(&prog, NATIVE_AUDIT_ARCH, nr as u32, args).0;
            let mut mode_arg: Vec<(c_long, usize)> = vec![
                (SYS_fchmod, 1),
                (SYS_fchmodat, 2),
                (SYS_FCHMODAT2, 2),
                (SYS_mkdirat, 2),
                (SYS_mknodat, 2),
            ];
            #[cfg(target_arch = "x86_64")]
            mode_arg.extend([
                (SYS_chmod, 1),
                (SYS_mkdir, 1),
                (SYS_mknod, 1),
                (SYS_creat, 1),
            ]);
            for &m in &modes {
                let set_id = m & 0o6000 != 0;
                for x in extras {
                    for &(nr, i) in &mode_arg {
                        let mut args = [3, 0x1000, 0, 0, 0, 0];
                        args[i] = m | x;
                        let want = if set_id { eperm } else { ALLOW };
                        assert_eq!(run(nr, args), want, "{shape:?} nr {nr} mode {:#o}", m | x);
                    }
                    let mut opens: Vec<(c_long, usize, usize)> = vec![(SYS_openat, 2, 3)];
                    #[cfg(target_arch = "x86_64")]
                    opens.push((SYS_open, 1, 2));
                    for &(nr, fi, mi) in &opens {
                        for flags in [
                            O_RDONLY as u64,
                            O_WRONLY as u64 | O_TRUNC as u64,
                            O_CREAT as u64 | O_WRONLY as u64,
                            O_CREAT as u64 | O_EXCL as u64 | O_CLOEXEC as u64,
                            tmpfile | O_DIRECTORY as u64 | O_RDWR as u64,
                        ] {
                            let mut args = [AT_FDCWD as u64, 0x1000, 0x1000, 0, 0, 0];
                            args[fi] = flags | x;
                            args[mi] = m | x;
                            let creates = (flags | x) & (O_CREAT as u64 | tmpfile) != 0;
                            let want = if set_id && creates { eperm } else { ALLOW };
                            assert_eq!(
                                run(nr, args),
                                want,
                                "{shape:?} nr {nr} flags {flags:#o} mode {:#o}",
                                m | x
                            );
                        }
                    }
                }
            }
            assert_eq!(run(SYS_openat2, [0; 6]), enosys, "{shape:?}");
            for cmd in REFUSED_IOCTLS {
                for x in [0, 1 << 32, 0xffff_ffff << 32] {
                    assert_eq!(run(SYS_ioctl, [0, cmd | x, 0, 0, 0, 0]), eperm, "{cmd:#x}");
                }
            }
            for cmd in [
                TIOCGWINSZ, TIOCSWINSZ, TIOCGETD, TCGETS, TCSETS, TIOCSCTTY, FIONREAD,
            ] {
                assert_eq!(run(SYS_ioctl, [0, cmd, 0, 0, 0, 0]), ALLOW, "{cmd:#x}");
            }
        }
    }

    #[test]
    fn the_number_dispatch_changes_no_answer_and_shortens_the_path() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for shape in NetShape::ALL {
            let with = compile_seccomp_with(shape, true).unwrap().remove(0);
            let without = compile_seccomp_with(shape, false).unwrap().remove(0);
            assert!(
                with.len() != without.len()
                    && with[..program_head().len()] == without[..program_head().len()],
                "{shape:?}: no dispatch"
            );
            // Every constant the programs compare with, as an argument.
            let mut values: Vec<u64> = vec![0, 1, u64::MAX, 1 << 32];
            for f in &without {
                values.extend([
                    u64::from(f.k),
                    u64::from(f.k) << 32,
                    u64::from(f.k) | 1 << 40,
                ]);
            }
            values.sort_unstable();
            values.dedup();
            let numbers = (0..1024u32)
                .chain((0..1024).map(|n| n | 0x4000_0000))
                .chain([u32::MAX, 0x8000_0000, 0x3fff_ffff]);
            let mut checked = 0;
            for nr in numbers {
                for arch in [NATIVE_AUDIT_ARCH, 0x4000_0003, 0xc000_0028] {
                    let mut cases: Vec<[u64; 6]> = vec![[0; 6]];
                    if arch == NATIVE_AUDIT_ARCH && nr < 1024 {
                        for i in 0..6 {
                            for &v in &values {
                                let mut a = [0; 6];
                                a[i] = v;
                                cases.push(a);
                            }
                        }
                        for _ in 0..16 {
                            cases.push(std::array::from_fn(|_| next()));
                        }
                    }
                    for args in cases {
                        let (x, _) = run_bpf(&with, arch, nr, args);
                        let (y, _) = run_bpf(&without, arch, nr, args);
                        assert_eq!(x, y, "{shape:?} arch {arch:#x} nr {nr} args {args:?}");
                        checked += 1;
                    }
                }
            }
            assert!(checked > 100_000, "{checked}");
            // A syscall without rules is answered after a few comparisons.
            let (action, steps) = run_bpf(&with, NATIVE_AUDIT_ARCH, libc::SYS_read as u32, [0; 6]);
            let (_, before) = run_bpf(&without, NATIVE_AUDIT_ARCH, libc::SYS_read as u32, [0; 6]);
            assert_eq!(action, 0x7fff_0000);
            assert!(
                steps <= 20 && steps * 3 < before,
                "{shape:?}: {steps} vs {before}"
            );
            // One with rules (openat, the commonest) goes straight to its
            // block: 67 to 87 instructions down the chain, 31 or 32 so.
            let args = [
                libc::AT_FDCWD as u64,
                0x1000,
                libc::O_RDONLY as u64,
                0,
                0,
                0,
            ];
            let (action, steps) = run_bpf(&with, NATIVE_AUDIT_ARCH, libc::SYS_openat as u32, args);
            assert_eq!(action, 0x7fff_0000);
            assert!(steps <= 36, "{shape:?}: openat in {steps}");
        }
    }

    #[test]
    fn precompiled_seccomp_programs_are_the_compiled_ones() {
        let nets = [
            WireNet::Allow,
            WireNet::Deny,
            WireNet::Tcp(vec![443]),
            WireNet::Tcp(Vec::new()),
            WireNet::Egress { port: 8080 },
        ];
        let fresh: Vec<Vec<seccompiler::BpfProgram>> = nets
            .iter()
            .map(|n| seccomp_programs(n).unwrap().into_owned())
            .collect();
        for (n, f) in nets.iter().zip(&fresh) {
            // One program, the head's checks first, within the kernel's bound.
            assert_eq!(f.len(), 1, "{n:?}");
            let head = program_head();
            assert!(f[0].len() <= BPF_MAXINSNS, "{n:?}: {}", f[0].len());
            assert!(
                f[0].iter()
                    .zip(&head)
                    .all(|(x, y)| (x.code, x.jt, x.jf, x.k) == (y.code, y.jt, y.jf, y.k)),
                "{n:?}"
            );
        }
        precompile_seccomp().unwrap();
        for (n, f) in nets.iter().zip(&fresh) {
            let pre = seccomp_programs(n).unwrap();
            assert!(matches!(pre, std::borrow::Cow::Borrowed(_)), "{n:?}");
            let same = pre.len() == f.len()
                && pre.iter().zip(f).all(|(a, b)| {
                    a.len() == b.len()
                        && a.iter()
                            .zip(b)
                            .all(|(x, y)| (x.code, x.jt, x.jf, x.k) == (y.code, y.jt, y.jf, y.k))
                });
            assert!(same, "{n:?}");
        }
        // Allow, deny and a port list are three different programs.
        let size = |i: usize| fresh[i].iter().map(|p| p.len()).sum::<usize>();
        assert!(
            size(0) < size(1) && size(0) < size(2),
            "{:?}",
            [size(0), size(1), size(2)]
        );
    }
}
