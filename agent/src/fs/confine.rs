//! Filesystem requests under a sandbox intent: every path is resolved
//! *beneath* an allowed root by the kernel (`openat2` with
//! `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`), so `..`, symlinks leading out
//! of the roots and `/proc/self/root`-style magic links are refused with
//! `sandbox_denied`, never judged by string prefixes. The resolved path then
//! has no symlink left in it, and carve-outs are checked on it.
//!
//! A path is looked up once: the result ([`Resolved`]) holds the opened
//! directory that contains it and the object itself, and every operation
//! acts on those descriptors (`openat`, `mkdirat`, `renameat`, `unlinkat`,
//! `O_NOFOLLOW` on the last component, temp files made `O_EXCL` in that
//! directory), so a directory swapped after the check changes nothing. The
//! root of a sandbox is itself readable (a walk of it stays inside it).

use super::io_error;
use crate::config::Profile;
use crate::sandbox_gate::effective_policy;
use executor_protocol::types::fs::Scoped;
use executor_protocol::{ErrorCode, WireError, WirePath};
use executor_sandbox::policy::root_paths;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// How often a lookup that raced a rename is tried again.
const RACED_LOOKUP_TRIES: u32 = 64;

/// `openat2(2)`, tried again when the kernel answers EAGAIN: with
/// `RESOLVE_BENEATH`/`RESOLVE_IN_ROOT` it does so when a rename or a mount
/// raced the lookup, and asks the caller to retry. Every try resolves from
/// the same directory descriptor with the same flags; a lookup that keeps
/// racing is reported (EAGAIN) after [`RACED_LOOKUP_TRIES`].
pub(super) fn openat2<P: ?Sized + nix::NixPath, Fd: std::os::fd::AsFd>(
    dirfd: Fd,
    path: &P,
    how: OpenHow,
) -> nix::Result<OwnedFd> {
    let dirfd = dirfd.as_fd();
    let mut tries = 1;
    loop {
        match nix::fcntl::openat2(dirfd, path, how) {
            Err(nix::errno::Errno::EAGAIN) if tries < RACED_LOOKUP_TRIES => tries += 1,
            r => return r,
        }
    }
}

/// What a request does with its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
    /// Renamed or removed: also refused when a carve-out lies below it
    /// (moving `.git` away would take `.git/config`'s protection with it).
    Move,
}

/// The roots and carve-outs an fs request is confined to.
#[derive(Debug, Clone)]
pub struct Confinement {
    read: Vec<PathBuf>,
    write: Vec<PathBuf>,
    deny_read: Vec<PathBuf>,
    deny_write: Vec<PathBuf>,
}

fn denied(path: &Path, rule: String) -> WireError {
    WireError::new(
        ErrorCode::SandboxDenied,
        format!("{}: {rule}", path.display()),
    )
    .with("path", super::wire_path_value(path))
    .with("rule", rule)
}

/// Beneath a root with `flags` (always close-on-exec). For the root `/`
/// (`read: "all"`) absolute symlinks resolve as the host resolves them
/// (`RESOLVE_IN_ROOT` of `/`); below any other root they are refused.
fn how_in(root: &Path, flags: OFlag) -> OpenHow {
    let scope = if root == Path::new("/") {
        ResolveFlag::RESOLVE_IN_ROOT
    } else {
        ResolveFlag::RESOLVE_BENEATH
    };
    OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .resolve(scope | ResolveFlag::RESOLVE_NO_MAGICLINKS)
}

/// Beneath the directory opened (a last component, or one step of
/// `create_parents`).
fn how_beneath(flags: OFlag) -> OpenHow {
    OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS)
}

fn real_path(fd: &OwnedFd) -> std::io::Result<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

impl Confinement {
    /// The confinement of a request's intent, or `None` without one.
    pub fn of(profile: &Profile, request: &impl Scoped) -> Result<Option<Confinement>, WireError> {
        let (intent, cwd) = (request.sandbox(), request.cwd());
        if intent.is_none() && profile.sandbox.is_none() {
            return Ok(None);
        }
        let cwd = match cwd {
            Some(c) => Some(super::req_path(c, "cwd")?),
            None => None,
        };
        let Some(policy) = effective_policy(intent, cwd.as_deref(), "sandbox", profile)? else {
            return Ok(None);
        };
        // :tmp belongs to a process; an fs request has none.
        let paths = root_paths;
        let write = paths(&policy.write);
        let mut read = match &policy.read {
            None => vec![PathBuf::from("/")],
            Some(r) => paths(r),
        };
        read.extend(write.iter().cloned());
        // The agent's /proc and /dev are not the job's (a job gets its own
        // /proc and a minimal /dev): under an intent they are never read
        // through the agent (its environment, its memory, raw disks).
        let mut deny_read = policy.deny_read;
        deny_read.extend([PathBuf::from("/proc"), PathBuf::from("/dev")]);
        // Nor the jobs' private directory (other jobs' :tmp, placeholder
        // records and locks), which no job sees either.
        let jobs = executor_sandbox::plan::jobs_parent();
        deny_read.push(std::fs::canonicalize(&jobs).unwrap_or(jobs));
        // A carve-out named through a symlink keeps its name: the link
        // itself is protected too.
        let mut deny_write = policy.deny_write;
        deny_write.extend(policy.carve_out_links.into_iter().map(|l| l.path));
        // The kernel's interfaces (sysfs and the cgroup, tracing, BPF and
        // firmware trees mounted in it) are not files a root above them
        // grants: read, never written through the agent, which may hold
        // every capability (a job under the same intent sees them
        // read-only). A write root at or below /sys names them itself.
        let sys = Path::new("/sys");
        if write
            .iter()
            .any(|r| sys.starts_with(r) && r.as_path() != sys)
        {
            deny_write.push(sys.to_path_buf());
        }
        Ok(Some(Confinement {
            read,
            write,
            deny_read,
            deny_write,
        }))
    }

    /// Resolve `path` beneath a root allowing `access`, once: the opened
    /// directory that holds it, its name there and the object itself (or
    /// `denied`). `open.follow` says whether a final symlink is followed;
    /// `open.create_parents` makes missing directories on the way (each checked
    /// against the carve-outs before it is made).
    pub fn resolve(&self, path: &Path, open: Open) -> Result<Resolved, WireError> {
        let access = open.access;
        let roots = match access {
            Access::Read => &self.read,
            Access::Write | Access::Move => &self.write,
        };
        let mut escaped = None;
        for root in roots {
            let Ok(rel) = path.strip_prefix(root) else {
                continue;
            };
            match self.resolve_in(root, rel, path, open)? {
                InRoot::Found(r) => return Ok(r),
                InRoot::Escaped => escaped = Some(root.clone()),
                InRoot::NotHere => {}
            }
        }
        let what = match access {
            Access::Read => "read",
            Access::Write | Access::Move => "write",
        };
        Err(match escaped {
            Some(root) => denied(
                path,
                format!(
                    "resolves out of the {what} root {} (.., symlink or magic link)",
                    root.display()
                ),
            ),
            None => denied(path, format!("outside every {what} root of the sandbox")),
        })
    }

    /// Resolve `path` (`rel` below `root`) beneath `root`.
    fn resolve_in(
        &self,
        root: &Path,
        rel: &Path,
        path: &Path,
        open: Open,
    ) -> Result<InRoot, WireError> {
        let root_fd: OwnedFd =
            open_sandbox_root(root).map_err(|e| io_error(&e, root, "cannot open sandbox root"))?;
        if rel.as_os_str().is_empty() {
            // The root itself: readable as a whole, never replaced.
            if open.access != Access::Read {
                return Err(denied(
                    path,
                    "is a write root itself; only what is inside it may be changed".into(),
                ));
            }
            self.check_carve_outs(path, root, open.access)?;
            return Resolved::whole(root, root_fd, true).map(InRoot::Found);
        }
        let (rel_parent, name) = match (rel.parent(), rel.file_name()) {
            (Some(p), Some(n)) => (p, n.to_os_string()),
            _ => return Ok(InRoot::NotHere),
        };
        let parent_fd =
            match self.open_parent(&root_fd, root, rel_parent, open.access, open.create_parents) {
                Ok(fd) => fd,
                Err(Step::Escaped) => return Ok(InRoot::Escaped),
                Err(Step::Denied(w) | Step::Failed(w)) => return Err(w),
            };
        let Some((node, real)) =
            open_node(&root_fd, root, rel, &parent_fd, &name, open.follow, path)?
        else {
            return Ok(InRoot::Escaped);
        };
        if !real.starts_with(root) {
            return Ok(InRoot::Escaped);
        }
        self.check_carve_outs(path, &real, open.access)?;
        Ok(InRoot::Found(Resolved {
            path: real,
            parent: parent_fd,
            name: Some(name),
            node,
            confined: true,
        }))
    }

    fn check_carve_outs(&self, path: &Path, real: &Path, access: Access) -> Result<(), WireError> {
        let carve_outs = match access {
            Access::Read => self.deny_read.iter().collect::<Vec<_>>(),
            Access::Write | Access::Move => self
                .deny_read
                .iter()
                .chain(self.deny_write.iter())
                .collect(),
        };
        if let Some(d) = carve_outs.iter().find(|d| real.starts_with(d)) {
            return Err(denied(
                path,
                format!("inside the carve-out {}", d.display()),
            ));
        }
        if access == Access::Move {
            if let Some(d) = carve_outs.iter().find(|d| d.starts_with(real)) {
                return Err(denied(
                    path,
                    format!(
                        "holds the carve-out {}; it cannot be renamed or removed",
                        d.display()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The directory `rel` (relative, maybe empty) beneath `root_fd`,
    /// opened; with `create`, missing components are made one at a time
    /// relative to the last opened one.
    fn open_parent(
        &self,
        root_fd: &OwnedFd,
        root: &Path,
        rel: &Path,
        access: Access,
        create: bool,
    ) -> Result<OwnedFd, Step> {
        let dir_how = || how_beneath(OFlag::O_PATH | OFlag::O_DIRECTORY);
        let target = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        let fail = |e: nix::errno::Errno, at: &Path| {
            Step::Failed(io_error(
                &std::io::Error::from(e),
                &root.join(at),
                "cannot resolve",
            ))
        };
        match openat2(
            root_fd,
            target,
            how_in(root, OFlag::O_PATH | OFlag::O_DIRECTORY),
        ) {
            Ok(fd) => return Ok(fd),
            Err(nix::errno::Errno::EXDEV) | Err(nix::errno::Errno::ELOOP) => {
                return Err(Step::Escaped)
            }
            Err(nix::errno::Errno::ENOENT) if create => {}
            Err(e) => return Err(fail(e, rel)),
        }
        let mut cur = root_fd
            .try_clone()
            .map_err(|e| Step::Failed(io_error(&e, root, "cannot resolve")))?;
        let mut at = PathBuf::new();
        for c in rel.components() {
            at.push(c);
            let name = c.as_os_str();
            match openat2(&cur, name, dir_how()) {
                Ok(fd) => {
                    cur = fd;
                    continue;
                }
                Err(nix::errno::Errno::ENOENT) => {}
                Err(nix::errno::Errno::EXDEV) | Err(nix::errno::Errno::ELOOP) => {
                    return Err(Step::Escaped)
                }
                Err(e) => return Err(fail(e, &at)),
            }
            let real = real_path(&cur)
                .map_err(|e| Step::Failed(io_error(&e, &root.join(&at), "cannot resolve")))?
                .join(name);
            if !real.starts_with(root) {
                return Err(Step::Escaped);
            }
            self.check_carve_outs(&root.join(&at), &real, access)
                .map_err(Step::Denied)?;
            match nix::sys::stat::mkdirat(
                &cur,
                name,
                nix::sys::stat::Mode::from_bits_truncate(0o777),
            ) {
                Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
                Err(e) => {
                    return Err(Step::Failed(io_error(
                        &std::io::Error::from(e),
                        &root.join(&at),
                        "cannot create directory",
                    )))
                }
            }
            cur = match openat2(&cur, name, dir_how()) {
                Ok(fd) => fd,
                Err(nix::errno::Errno::EXDEV) | Err(nix::errno::Errno::ELOOP) => {
                    return Err(Step::Escaped)
                }
                Err(e) => return Err(fail(e, &at)),
            };
        }
        Ok(cur)
    }

    /// Whether a directory met during a walk is hidden by a carve-out.
    pub fn hidden(&self, real: &Path) -> bool {
        self.deny_read.iter().any(|d| real.starts_with(d))
    }
}

enum Step {
    Escaped,
    Denied(WireError),
    Failed(WireError),
}

/// A root of the policy (canonical: the policy's one walk resolved every
/// symlink in it), opened without following any: a name swapped for a
/// symlink since (by a job allowed to write its parent) is `ELOOP`, never
/// the place the link points to.
fn open_sandbox_root(root: &Path) -> std::io::Result<OwnedFd> {
    Ok(nix::fcntl::openat2(
        nix::fcntl::AT_FDCWD,
        root,
        OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS),
    )?)
}

fn open_root(root: &Path) -> std::io::Result<OwnedFd> {
    Ok(std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(root)?
        .into())
}

/// A request path resolved once; every operation acts on these
/// descriptors, never on the path again.
#[derive(Debug)]
pub struct Resolved {
    /// For messages: the real path under a sandbox, else the request's.
    pub path: PathBuf,
    /// The directory holding it (`O_PATH`); the object itself for a root.
    pub parent: OwnedFd,
    /// Its name in `parent`; `None` for a root (or `/`).
    pub name: Option<std::ffi::OsString>,
    /// The object (`O_PATH`; a final symlink followed when asked), if it exists.
    pub node: Option<OwnedFd>,
    /// Under a sandbox: a final symlink is never written through.
    pub confined: bool,
}

impl Resolved {
    /// A directory with no name in a parent (a root, or `/`): it is both.
    fn whole(path: &Path, fd: OwnedFd, confined: bool) -> Result<Resolved, WireError> {
        let parent = fd
            .try_clone()
            .map_err(|e| io_error(&e, path, "cannot open"))?;
        Ok(Resolved {
            path: path.to_path_buf(),
            parent,
            name: None,
            node: Some(fd),
            confined,
        })
    }

    /// The object, or `not_found` naming the path.
    pub fn node(&self) -> Result<&OwnedFd, WireError> {
        self.node.as_ref().ok_or_else(|| {
            io_error(
                &std::io::Error::from_raw_os_error(libc::ENOENT),
                &self.path,
                "cannot open",
            )
        })
    }

    /// Its name in `parent` (`invalid_params` for a root).
    pub fn name(&self) -> Result<&std::ffi::OsStr, WireError> {
        self.name.as_deref().ok_or_else(|| {
            WireError::invalid_params(
                "path",
                format!("{} has no name in a parent directory", self.path.display()),
            )
        })
    }

    /// The object opened again with `flags` (through its descriptor: no
    /// path is looked up).
    pub fn reopen(&self, flags: i32) -> Result<std::fs::File, WireError> {
        let fd = self.node()?;
        // A FIFO or socket would block the open (and a blocking-pool
        // thread) until a peer appears: refused.
        let st = nix::sys::stat::fstat(fd)
            .map_err(|e| io_error(&e.into(), &self.path, "cannot stat"))?;
        if matches!(st.st_mode & libc::S_IFMT, libc::S_IFIFO | libc::S_IFSOCK) {
            return Err(WireError::new(
                ErrorCode::Io,
                format!("{} is a FIFO or socket, not a file", self.path.display()),
            )
            .with("path", super::wire_path_value(&self.path)));
        }
        std::fs::File::options()
            .read(flags & libc::O_ACCMODE != libc::O_WRONLY)
            .write(flags & libc::O_ACCMODE != libc::O_RDONLY)
            .custom_flags(flags & !libc::O_ACCMODE)
            .open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .map_err(|e| io_error(&e, &self.path, "cannot open"))
    }

    /// `parent/name` as a path through the parent's descriptor (for the
    /// few std calls that take a path: the parent is not looked up again).
    pub fn via_parent(&self) -> Result<PathBuf, WireError> {
        Ok(Path::new(&format!("/proc/self/fd/{}", self.parent.as_raw_fd())).join(self.name()?))
    }
}

/// What resolving beneath one root found.
enum InRoot {
    Found(Resolved),
    /// The path leads out of the root (`..`, a symlink, a magic link).
    Escaped,
    /// The path cannot be named below this root.
    NotHere,
}

/// `name` in `parent_fd` (without following a final symlink unless
/// `follow`; a final symlink out of the directory is followed beneath
/// the root): its descriptor (`None`: it does not exist yet) and its real
/// path; `None` when it leads out of the root.
fn open_node(
    root_fd: &OwnedFd,
    root: &Path,
    rel: &Path,
    parent_fd: &OwnedFd,
    name: &std::ffi::OsStr,
    follow: bool,
    path: &Path,
) -> Result<Option<(Option<OwnedFd>, PathBuf)>, WireError> {
    let resolve_err = |e: std::io::Error| io_error(&e, path, "cannot resolve");
    let real_parent = real_path(parent_fd).map_err(resolve_err)?;
    let flags = if follow {
        OFlag::O_PATH
    } else {
        OFlag::O_PATH | OFlag::O_NOFOLLOW
    };
    Ok(Some(match openat2(parent_fd, name, how_beneath(flags)) {
        Ok(fd) if follow => {
            let real = real_path(&fd).map_err(resolve_err)?;
            (Some(fd), real)
        }
        Ok(fd) => (Some(fd), real_parent.join(name)),
        Err(nix::errno::Errno::ENOENT) => (None, real_parent.join(name)),
        Err(nix::errno::Errno::EXDEV) | Err(nix::errno::Errno::ELOOP) => {
            // A final symlink out of this directory: follow it beneath the
            // root instead.
            match openat2(root_fd, rel, how_in(root, OFlag::O_PATH)) {
                Ok(fd) => {
                    let real = real_path(&fd).map_err(resolve_err)?;
                    (Some(fd), real)
                }
                Err(_) => return Ok(None),
            }
        }
        Err(e) => return Err(resolve_err(std::io::Error::from(e))),
    }))
}

/// How a request opens its path: what it does with it, whether a final
/// symlink is followed, whether missing parent directories are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Open {
    pub access: Access,
    pub follow: bool,
    pub create_parents: bool,
}

impl Open {
    /// Read what the path names, following a final symlink if `follow`.
    pub fn read(follow: bool) -> Open {
        Open {
            access: Access::Read,
            follow,
            create_parents: false,
        }
    }

    /// Create or replace the path itself (never through a final symlink),
    /// making missing parents first if `create_parents`.
    pub fn write(create_parents: bool) -> Open {
        Open {
            access: Access::Write,
            follow: false,
            create_parents,
        }
    }

    /// Rename or remove the path itself.
    pub fn moved() -> Open {
        Open {
            access: Access::Move,
            follow: false,
            create_parents: false,
        }
    }
}

/// A request path (its field `field`), absolute, resolved once under the
/// request's sandbox and the profile's (if any; without one, from `/`
/// following symlinks as the host does).
pub fn confined(
    profile: &Profile,
    request: &impl Scoped,
    p: &WirePath,
    field: &str,
    open: Open,
) -> Result<Resolved, WireError> {
    let path = super::req_path(p, field)?;
    // `..` is resolved by the kernel beneath a root, never here.
    match Confinement::of(profile, request)? {
        None => unconfined(&path, open.follow, open.create_parents),
        Some(c) => c.resolve(&path, open),
    }
}

fn unconfined(path: &Path, follow: bool, create_parents: bool) -> Result<Resolved, WireError> {
    let (parent, name) = match (path.parent(), path.file_name()) {
        (Some(p), Some(n)) => (p, n.to_os_string()),
        _ => {
            let fd = open_root(path).map_err(|e| io_error(&e, path, "cannot open"))?;
            return Resolved::whole(path, fd, false);
        }
    };
    if create_parents {
        std::fs::create_dir_all(parent)
            .map_err(|e| io_error(&e, parent, "cannot create directory"))?;
    }
    let parent_fd = open_root(parent).map_err(|e| io_error(&e, path, "cannot resolve"))?;
    let flags = if follow {
        OFlag::O_PATH | OFlag::O_CLOEXEC
    } else {
        OFlag::O_PATH | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW
    };
    let node = match nix::fcntl::openat(
        &parent_fd,
        name.as_os_str(),
        flags,
        nix::sys::stat::Mode::empty(),
    ) {
        Ok(fd) => Some(fd),
        Err(nix::errno::Errno::ENOENT) => None,
        Err(e) => return Err(io_error(&std::io::Error::from(e), path, "cannot resolve")),
    };
    Ok(Resolved {
        path: path.to_path_buf(),
        parent: parent_fd,
        name: Some(name),
        node,
        confined: false,
    })
}
