//! The job's fresh root (steps 1-4 of [`super`]), bubblewrap's way: a
//! tmpfs (or one read-only clone of the host's tree for `read: "all"`)
//! holding only what the plan grants, every root and carve-out opened by
//! identity (`openat2`, checked device and inode) and mounted from its
//! descriptor (`open_tree`, `move_mount`); `:tmp` at `/tmp`, pins,
//! `deny_write` read-only, `deny_read` covered, a minimal `/dev` and a
//! `/proc` of the job's PID namespace; then the pivot into it.
//!
//! Runs in the job's init, still holding its capabilities in the job's
//! user namespace. Depends on [`crate::plan`] and [`executor_sys`].

use super::{at, identity, no_follow, open_here, Step, StepResult};
use crate::plan::{Node, WirePlan};
use executor_sys as sys;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;
use std::ffi::{CStr, OsStr};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

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
pub(super) struct Grants {
    pub(super) read: Vec<OwnedFd>,
    pub(super) write: Vec<OwnedFd>,
}

/// What the init holds open across the pivot.
#[derive(Debug)]
pub struct Prepared {
    pub(super) grants: Grants,
    pub(super) tty: bool,
    /// A root `/dev` (`Some(true)`: a write root), see [`Opened`].
    pub(super) dev_root: Option<bool>,
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
    if !root_writable {
        // A write root on or above a kernel interface (`/sys/fs/cgroup`,
        // `/sys`) grants no more than a write root `/` does: its kernel
        // file systems stay read-only (a job never writes its own or any
        // cgroup's limits, nor moves out of its cgroup).
        kernel_interfaces_read_only(root.as_fd()).map_err(at(Step::Roots))?;
    }
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
/// mounts them) in the staged clone `root` of the host's tree, or beneath
/// a fresh root among the roots attached there, made read-only with what
/// is mounted beneath: a write root `/` (or `/sys`, `/sys/fs/cgroup`)
/// grants the host's files, never its kernel's settings. A mount hidden under another
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
            // Out of the job's reach too: the agent cannot enter it, or it
            // is hidden under another mount at a parent (the job's /dev).
            Err(
                nix::errno::Errno::EACCES | nix::errno::Errno::ENOENT | nix::errno::Errno::ENOTDIR,
            ) => continue,
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
}
