//! Filesystem requests under a sandbox intent: every path is resolved
//! *beneath* an allowed root one component at a time, each looked up by the
//! kernel in the directory the previous one opened (`openat2` with
//! `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`, never following), symlinks
//! expanded from the link opened and `..` never above the root, so `..`,
//! symlinks leading out of the roots and `/proc` magic links are refused
//! with `sandbox_denied`, never judged by string prefixes. Nothing is
//! looked up inside a `deny_read` carve-out: below one, every answer is
//! `sandbox_denied`. The resolved path has no symlink left in it, and
//! carve-outs are checked on it; a file with other hard links is checked
//! by identity against what the carve-outs hold (carve-outs protect data,
//! not names: [`executor_sandbox::holds`]).
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
use std::ffi::{OsStr, OsString};
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
#[derive(Debug)]
pub struct Confinement {
    read: Vec<PathBuf>,
    write: Vec<PathBuf>,
    deny_read: Vec<PathBuf>,
    deny_write: Vec<PathBuf>,
    /// The intent's own `deny_read` carve-outs (not the agent's `/proc`
    /// and `/dev`), examined for hard links when first needed.
    held_read: Held,
    /// Its `deny_write` carve-outs (and the links on the way to them).
    held_write: Held,
}

/// (device, inode) of a file with names outside a carve-out, and that carve-out.
type HeldFiles = Vec<((u64, u64), PathBuf)>;

/// The files of some carve-outs that have names outside them
/// ([`executor_sandbox::holds`]), found once per request, and only when a
/// file with more than one link is met: carve-outs protect data, not
/// names, so such a name is refused as the carve-out itself is.
#[derive(Debug)]
struct Held {
    carve_outs: Vec<PathBuf>,
    /// (device, inode) -> the carve-out holding it; or why a carve-out
    /// could not be examined (then every file with other links is refused).
    found: std::sync::OnceLock<Result<HeldFiles, String>>,
}

impl Held {
    fn new(carve_outs: Vec<PathBuf>) -> Held {
        Held {
            carve_outs,
            found: std::sync::OnceLock::new(),
        }
    }

    fn found(&self) -> &Result<HeldFiles, String> {
        self.found.get_or_init(|| {
            let mut out = Vec::new();
            for c in &self.carve_outs {
                let held =
                    executor_sandbox::holds::linked_out(c, None, executor_sandbox::holds::MAX_ENTRIES)
                        .map_err(|e| match e {
                            executor_sandbox::holds::ScanError::TooMany { max, .. } => format!(
                                "the carve-out {} holds more than {max} entries, too many to examine for hard links",
                                c.display()
                            ),
                            _ => format!(
                                "the carve-out {} cannot be examined for hard links",
                                c.display()
                            ),
                        })?;
                out.extend(held.into_iter().map(|l| ((l.dev, l.ino), c.clone())));
            }
            Ok(out)
        })
    }

    /// Why the file of identity `id` (a non-directory with other links)
    /// must be refused, if it must.
    fn refuses(&self, id: (u64, u64)) -> Option<String> {
        if self.carve_outs.is_empty() {
            return None;
        }
        match self.found() {
            Ok(found) => found.iter().find(|(i, _)| *i == id).map(|(_, c)| {
                format!(
                    "another name (hard link) of a file inside the carve-out {}",
                    c.display()
                )
            }),
            Err(why) => Some(format!("has other hard links, and {why}")),
        }
    }
}

/// `sandbox_denied` for `path`, saying which `rule` refused it.
pub fn denied(path: &Path, rule: String) -> WireError {
    WireError::new(
        ErrorCode::SandboxDenied,
        format!("{}: {rule}", path.display()),
    )
    .with("path", super::wire_path_value(path))
    .with("rule", rule)
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
        let held_read = Held::new(policy.deny_read.clone());
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
        let held_write = Held::new(deny_write.clone());
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
            held_read,
            held_write,
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

    /// Resolve `path` (`rel` below `root`) beneath `root`, one component
    /// at a time ([`Beneath`]): nothing inside a `deny_read` carve-out is
    /// ever looked up, so what is below one answers `sandbox_denied`
    /// whatever it holds (never `not_found` or `not_a_directory` by what
    /// a name inside it is).
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
        if rel.file_name().is_none() {
            return Ok(InRoot::NotHere);
        }
        let mut walk = Beneath {
            conf: self,
            root,
            root_fd: &root_fd,
            path,
            access: open.access,
            hops: 0,
        };
        let (parent, name, node) = match walk.run(rel, open.follow, open.create_parents) {
            Ok(found) => found,
            Err(Step::Escaped) => return Ok(InRoot::Escaped),
            Err(Step::Denied(w) | Step::Failed(w)) => return Err(w),
        };
        let resolve_err = |e: std::io::Error| io_error(&e, path, "cannot resolve");
        let real = match &node {
            Some(fd) => real_path(fd).map_err(resolve_err)?,
            None => real_path(&parent).map_err(resolve_err)?.join(&name),
        };
        if !real.starts_with(root) {
            return Ok(InRoot::Escaped);
        }
        self.check_carve_outs(path, &real, open.access)?;
        if let Some(fd) = &node {
            self.check_identity(path, fd, open.access)?;
        }
        // A final symlink not followed: where it leads, for an operation
        // that would go through it (an in-place write refuses it).
        let mut link_out = None;
        if open.access == Access::Write && !open.follow && node.as_ref().is_some_and(is_symlink) {
            let through = Open {
                follow: true,
                create_parents: false,
                ..open
            };
            if let Err(w) = self.resolve(path, through) {
                if w.code == ErrorCode::SandboxDenied {
                    link_out = Some(w);
                }
            }
        }
        Ok(InRoot::Found(Resolved {
            path: real,
            parent,
            name: Some(name),
            node,
            confined: true,
            link_out,
        }))
    }

    /// A file with other names (hard links) whose identity is one a
    /// carve-out holds is refused as the carve-out itself: checked on the
    /// descriptor the operation acts on, so a name swapped meanwhile
    /// changes nothing.
    pub fn check_identity(
        &self,
        path: &Path,
        fd: &impl std::os::fd::AsFd,
        access: Access,
    ) -> Result<(), WireError> {
        let st = nix::sys::stat::fstat(fd).map_err(|e| io_error(&e.into(), path, "cannot stat"))?;
        if let Some(rule) = self.refuses_identity(&st, access) {
            return Err(denied(path, rule));
        }
        Ok(())
    }

    /// Why a node of this `stat` is refused for `access` by the inode rule.
    pub fn refuses_identity(
        &self,
        st: &nix::sys::stat::FileStat,
        access: Access,
    ) -> Option<String> {
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR || st.st_nlink <= 1 {
            return None;
        }
        let id = (st.st_dev, st.st_ino);
        self.held_read.refuses(id).or_else(|| match access {
            Access::Read => None,
            Access::Write | Access::Move => self.held_write.refuses(id),
        })
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

    /// A carve-out at or below `real` that a request acting on the whole
    /// tree there with `access` must not reach (an `fs/copy` reads every
    /// entry below its source and writes below its destination).
    pub fn carve_out_within(&self, real: &Path, access: Access) -> Option<&Path> {
        let write = match access {
            Access::Read => &[][..],
            Access::Write | Access::Move => &self.deny_write[..],
        };
        self.deny_read
            .iter()
            .chain(write)
            .find(|d| d.starts_with(real))
            .map(PathBuf::as_path)
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
    /// The final component is a symlink (not followed) that leads where
    /// the intent refuses: the answer of an operation that would go
    /// through it (`sandbox_denied`, not the `ELOOP` of `O_NOFOLLOW`).
    pub link_out: Option<WireError>,
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
            link_out: None,
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
        // thread) until a peer appears; a device's open acts on the host
        // (`/dev/ptmx` makes a terminal pair, a watchdog arms, a tape
        // rewinds), which no read may do (a `read_only` key included), and
        // a block device's bytes are past every carve-out: all refused.
        let st = nix::sys::stat::fstat(fd)
            .map_err(|e| io_error(&e.into(), &self.path, "cannot stat"))?;
        let kind = match st.st_mode & libc::S_IFMT {
            libc::S_IFIFO | libc::S_IFSOCK => Some("a FIFO or socket"),
            libc::S_IFCHR | libc::S_IFBLK => Some("a device"),
            _ => None,
        };
        if let Some(kind) = kind {
            return Err(WireError::new(
                ErrorCode::Io,
                format!("{} is {kind}, not a file", self.path.display()),
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

/// Whether `fd` is a symlink (opened without following it).
fn is_symlink(fd: &OwnedFd) -> bool {
    nix::sys::stat::fstat(fd).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFLNK)
}

/// Symlinks followed in one resolution (the kernel's 40) before it is
/// refused as a loop.
const MAX_LINKS: usize = 40;

/// One resolution beneath a root, one component at a time, each looked up
/// in the directory the previous one opened (`openat2` with
/// `RESOLVE_BENEATH`, never following anything): a symlink's target is
/// read from the link opened and its components resolved in turn (an
/// absolute one from the root under `read: "all"`, refused below any
/// other root, as `RESOLVE_BENEATH` refuses it); `..` reopens the
/// directories already resolved from the root
/// (`RESOLVE_NO_SYMLINKS`), never above it. Before any name is looked up
/// in a directory, the directory is checked against the `deny_read`
/// carve-outs: nothing inside one is looked up.
struct Beneath<'a> {
    conf: &'a Confinement,
    root: &'a Path,
    root_fd: &'a OwnedFd,
    path: &'a Path,
    access: Access,
    hops: usize,
}

impl Beneath<'_> {
    fn fail(&self, e: nix::errno::Errno, at: &Path) -> Step {
        Step::Failed(io_error(
            &std::io::Error::from(e),
            &self.root.join(at),
            "cannot resolve",
        ))
    }

    /// The directory `rel` (plain names, already resolved) from the root.
    fn reopen(&self, rel: &[OsString]) -> Result<OwnedFd, Step> {
        let at: PathBuf = rel.iter().collect();
        let target = if rel.is_empty() { Path::new(".") } else { &at };
        openat2(
            self.root_fd,
            target,
            OpenHow::new()
                .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
                .resolve(
                    ResolveFlag::RESOLVE_BENEATH
                        | ResolveFlag::RESOLVE_NO_SYMLINKS
                        | ResolveFlag::RESOLVE_NO_MAGICLINKS,
                ),
        )
        .map_err(|e| match e {
            nix::errno::Errno::EXDEV | nix::errno::Errno::ELOOP => Step::Escaped,
            e => self.fail(e, &at),
        })
    }

    /// Refused before `name` is looked up in `dir`: `dir` is inside a
    /// `deny_read` carve-out (by the real path of the directory opened),
    /// or `name` is one and more follows it (a file carve-out, or one
    /// that does not exist, is not looked into either).
    fn may_look_in(&self, dir: &OwnedFd, name: &OsStr, last: bool) -> Result<(), Step> {
        let real =
            real_path(dir).map_err(|e| Step::Failed(io_error(&e, self.path, "cannot resolve")))?;
        let below = |d: &&PathBuf| real.starts_with(d) || (!last && real.join(name).starts_with(d));
        if let Some(d) = self.conf.deny_read.iter().find(below) {
            return Err(Step::Denied(denied(
                self.path,
                format!("inside the carve-out {}", d.display()),
            )));
        }
        Ok(())
    }

    /// Resolve `rel`: the directory holding its last component, that
    /// component's name, and the object (`None`: it does not exist). A
    /// final symlink is followed when `follow`; missing directories on the
    /// way are made when `create` (each checked against the carve-outs
    /// first).
    fn run(
        &mut self,
        rel: &Path,
        follow: bool,
        create: bool,
    ) -> Result<(OwnedFd, OsString, Option<OwnedFd>), Step> {
        use std::collections::VecDeque;
        use std::path::Component;
        fn names(p: &Path) -> impl Iterator<Item = OsString> + '_ {
            p.components().filter_map(|c| match c {
                Component::Normal(_) | Component::ParentDir => Some(c.as_os_str().to_os_string()),
                _ => None,
            })
        }
        let in_root = self.root == Path::new("/");
        let mut queue: VecDeque<OsString> = names(rel).collect();
        let mut done: Vec<OsString> = Vec::new();
        let mut cur = self.reopen(&done)?;
        while let Some(name) = queue.pop_front() {
            let last = queue.is_empty();
            if name == ".." {
                if done.pop().is_none() && !in_root {
                    return Err(Step::Escaped);
                }
                cur = self.reopen(&done)?;
                continue;
            }
            self.may_look_in(&cur, &name, last)?;
            let at: PathBuf = done.iter().chain([&name]).collect();
            let how = how_beneath(OFlag::O_PATH | OFlag::O_NOFOLLOW);
            let fd = match openat2(&cur, name.as_os_str(), how) {
                Ok(fd) => fd,
                Err(nix::errno::Errno::ENOENT) if last => return Ok((cur, name, None)),
                Err(nix::errno::Errno::ENOENT) if create => {
                    cur = self.make_dir(&cur, &at, &name)?;
                    done.push(name);
                    continue;
                }
                Err(nix::errno::Errno::EXDEV) | Err(nix::errno::Errno::ELOOP) => {
                    return Err(Step::Escaped)
                }
                Err(e) => return Err(self.fail(e, &at)),
            };
            let st = nix::sys::stat::fstat(&fd).map_err(|e| self.fail(e, &at))?;
            match st.st_mode & libc::S_IFMT {
                libc::S_IFLNK if !last || follow => {
                    self.hops += 1;
                    if self.hops > MAX_LINKS || on_procfs(&cur) {
                        return Err(Step::Escaped);
                    }
                    let to = nix::fcntl::readlinkat(&fd, "").map_err(|e| self.fail(e, &at))?;
                    let to = PathBuf::from(to);
                    if to.is_absolute() {
                        if !in_root {
                            return Err(Step::Escaped);
                        }
                        done.clear();
                        cur = self.reopen(&done)?;
                    }
                    let ahead: Vec<OsString> = names(&to).collect();
                    if ahead.is_empty() && last {
                        // A link to `/` (or to `.`): the directory itself.
                        queue.push_back(".".into());
                    }
                    for c in ahead.into_iter().rev() {
                        queue.push_front(c);
                    }
                }
                _ if last => return Ok((cur, name, Some(fd))),
                libc::S_IFDIR => {
                    done.push(name);
                    cur = fd;
                }
                _ => return Err(self.fail(nix::errno::Errno::ENOTDIR, &at)),
            }
        }
        // The path ends in `..` (or a link to a directory ends so): the
        // object is the directory reached, named in its parent.
        let Some(name) = done.pop() else {
            return Err(Step::Escaped);
        };
        let parent = self.reopen(&done)?;
        Ok((parent, name, Some(cur)))
    }

    /// Make the missing directory `name` in `cur` (at `at` below the
    /// root), checked against the carve-outs first, and open it.
    fn make_dir(&self, cur: &OwnedFd, at: &Path, name: &OsStr) -> Result<OwnedFd, Step> {
        let real = real_path(cur)
            .map_err(|e| Step::Failed(io_error(&e, &self.root.join(at), "cannot resolve")))?
            .join(name);
        if !real.starts_with(self.root) {
            return Err(Step::Escaped);
        }
        self.conf
            .check_carve_outs(&self.root.join(at), &real, self.access)
            .map_err(Step::Denied)?;
        match nix::sys::stat::mkdirat(cur, name, nix::sys::stat::Mode::from_bits_truncate(0o777)) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => {
                return Err(Step::Failed(io_error(
                    &std::io::Error::from(e),
                    &self.root.join(at),
                    "cannot create directory",
                )))
            }
        }
        match openat2(
            cur,
            name,
            how_beneath(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW),
        ) {
            Ok(fd) => Ok(fd),
            Err(nix::errno::Errno::EXDEV) | Err(nix::errno::Errno::ELOOP) => Err(Step::Escaped),
            Err(e) => Err(self.fail(e, at)),
        }
    }
}

/// Whether `dir` is on a procfs (whose symlinks are magic links).
fn on_procfs(dir: &OwnedFd) -> bool {
    nix::sys::statfs::fstatfs(dir).map_or(true, |fs| {
        fs.filesystem_type() == nix::sys::statfs::PROC_SUPER_MAGIC
    })
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
        link_out: None,
    })
}
