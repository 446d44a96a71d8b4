//! From a resolved [`Policy`] to the plan the trampoline applies: every
//! root and carve-out carried by identity (device and inode, checked again
//! by the trampoline on a descriptor it opens without following symlinks),
//! the ancestors of carve-outs to pin, the symlinks to recreate in the
//! job's fresh root, placeholders for carve-outs that do not exist yet
//! ([`crate::placeholder`]), and the job's private directory; what the job
//! owns on the host is a [`JobFiles`] value that removes it when dropped.
//!
//! Depends on [`crate::policy`], [`crate::placeholder`] and
//! [`crate::Capabilities`] only; the agent
//! calls [`plan`] and hands [`Plan::wire`] to the trampoline inside the job
//! spec ([`crate::spec`]).

use crate::placeholder::{Maker, Placeholders};
use crate::policy::{root_paths, Checked, Policy, Root};
use crate::Capabilities;
use executor_protocol::types::sandbox::NetworkIntent;
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Network part of a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireNet {
    /// A network namespace of its own (only `lo`), `AF_UNIX` stream and
    /// seqpacket sockets without connect or bind.
    Deny,
    Allow,
    /// TCP stream sockets to these ports (Landlock), nothing else.
    Tcp(Vec<u16>),
    /// Egress by name (docs/PROTOCOL.md §8): a network namespace of its own
    /// with `lo` up, where the job's init listens on `127.0.0.1:port` and
    /// hands the listener to the agent (the job never holds it); TCP stream
    /// sockets as for `Tcp`, connecting only to `port` (Landlock, where the
    /// ABI has network rules). Nothing but the agent's proxy is reachable.
    Egress {
        port: u16,
    },
}

impl WireNet {
    /// The job gets a network namespace of its own.
    pub fn own_namespace(&self) -> bool {
        matches!(self, WireNet::Deny | WireNet::Egress { .. })
    }
}

/// Ports the egress proxy listens on inside a job's network namespace
/// (below the kernel's default ephemeral range, 32768-60999): any is free,
/// the namespace is new.
pub const EGRESS_PORTS: std::ops::Range<u16> = 10_000..30_000;

fn egress_port() -> Result<u16, PlanError> {
    let mut r = [0u8; 2];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut r))
        .map_err(|source| PlanError::Io {
            what: "reading /dev/urandom for the egress port".into(),
            source,
        })?;
    let span = EGRESS_PORTS.end - EGRESS_PORTS.start;
    Ok(EGRESS_PORTS.start + u16::from_be_bytes(r) % span)
}

/// A path the agent checked, with the identity it had then.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub path: ByteBuf,
    pub dev: u64,
    pub ino: u64,
}

impl Node {
    /// The node at `path` now (not following a final symlink).
    pub fn at(path: &Path) -> std::io::Result<Node> {
        let m = std::fs::symlink_metadata(path)?;
        Ok(Node {
            path: ByteBuf::from(path.as_os_str().as_bytes().to_vec()),
            dev: m.dev(),
            ino: m.ino(),
        })
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        Path::new(std::ffi::OsStr::from_bytes(&self.path))
    }
}

/// What the trampoline applies (inside the job spec).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WirePlan {
    /// Landlock ABI to build the second layer for.
    pub landlock_abi: u32,
    /// Read roots; `None`: everything the host has (but `/dev`, `/proc`).
    pub read: Option<Vec<Node>>,
    pub write: Vec<Node>,
    /// The job's private directory, seen by the job at `/tmp`.
    pub tmp: Option<Node>,
    /// With `tmp`: the job's `/tmp` is a tmpfs of its own of at most this
    /// many bytes (the job's `limits.tmp_bytes`) instead of `tmp` bound
    /// from the host, so the job cannot fill the host's /tmp.
    #[serde(default)]
    pub tmp_bytes: Option<u64>,
    /// Bound read-only over themselves.
    pub deny_write: Vec<Node>,
    /// Covered: a directory by an empty inaccessible tmpfs, a file by an
    /// empty mode-000 file.
    pub deny_read: Vec<Node>,
    /// Ancestors of carve-outs inside write roots, bound onto themselves so
    /// that renaming, exchanging or removing them fails with `EBUSY`.
    pub pin: Vec<Node>,
    /// Symlinks to recreate in the fresh root: (where, what it points to).
    pub symlinks: Vec<(ByteBuf, ByteBuf)>,
    pub net: WireNet,
    /// Bound read-only where `read` is `None` (everything readable) and
    /// the job's own `:tmp` covers the host's /tmp: the request's cwd
    /// there ([`cwd_over_tmp`]).
    pub read_over_tmp: Vec<Node>,
}

/// Why no plan can be made; `Unavailable` means "this host cannot enforce
/// it" (the wire's `sandbox_unavailable`), `Io` that setting up failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    #[error("{0}")]
    Unavailable(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

/// The job's private directory, held under a `flock` of its own for the
/// job's life (so [`sweep`] knows a dead agent's from a live one's);
/// removed when dropped.
#[derive(Debug)]
pub struct JobDir {
    path: PathBuf,
    _held: nix::fcntl::Flock<std::fs::File>,
}

/// 64 random bits from the kernel, as 16 hex digits (unique names in the
/// jobs' directory).
pub(crate) fn random_name() -> std::io::Result<String> {
    let mut r = [0u8; 8];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut r)?;
    Ok(r.iter().map(|b| format!("{b:02x}")).collect())
}

impl JobDir {
    fn create() -> Result<JobDir, PlanError> {
        let name = random_name().map_err(|source| PlanError::Io {
            what: "reading /dev/urandom for the job's directory name".into(),
            source,
        })?;
        let parent = private_jobs_parent()?;
        // Made and locked under the jobs' lock: a sweep never sees it unheld.
        let _lock = crate::placeholder::global_lock(&parent).map_err(|source| PlanError::Io {
            what: format!("locking {}", parent.display()),
            source,
        })?;
        let dir = parent.join(format!("job-{name}"));
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|source| PlanError::Io {
                what: format!("creating the job's :tmp {}", dir.display()),
                source,
            })?;
        let held = std::fs::File::open(&dir)
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
            .and_then(|f| {
                nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock)
                    .map_err(|(_, e)| e as i32)
            })
            .map_err(|e| PlanError::Io {
                what: format!("locking the job's :tmp {}", dir.display()),
                source: std::io::Error::from_raw_os_error(e),
            })?;
        Ok(JobDir {
            path: dir,
            _held: held,
        })
    }

    /// Its path on the host.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Where job directories and placeholder records live: one private
/// directory per user, covered in every job's root.
pub fn jobs_parent() -> PathBuf {
    std::env::temp_dir().join(format!("executor-jobs-{}", nix::unistd::geteuid()))
}

/// Remove what agents killed mid-job left in [`jobs_parent`]: job
/// directories and placeholders whose lock nobody holds (see
/// [`crate::placeholder`]). Safe while other agents of the user run jobs.
/// Returns what was removed, for the log.
pub fn sweep() -> std::io::Result<Vec<PathBuf>> {
    // Made at the agent's start, before any job could make it its own.
    let dir = private_jobs_parent().map_err(|e| std::io::Error::other(e.to_string()))?;
    let mut removed = crate::placeholder::sweep(&dir)?;
    if !dir.is_dir() {
        return Ok(removed);
    }
    let _lock = crate::placeholder::global_lock(&dir)?;
    let mut first = Ok(());
    for e in std::fs::read_dir(&dir)?.flatten() {
        let name = e.file_name();
        let is_job_dir =
            name.as_bytes().starts_with(b"job-") && e.file_type().is_ok_and(|t| t.is_dir());
        if !is_job_dir {
            continue;
        }
        let (f, taken) = match open_to_lock(&e.path()) {
            Ok(v) => v,
            Err(err) => {
                tracing::warn!(path = %e.path().display(), error = %err, "cannot open a job's directory to test its lock; the next sweep tries again");
                if first.is_ok() {
                    first = Err(err);
                }
                continue;
            }
        };
        match nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(held) => {
                // One tree that stays (each failure logged) does not keep
                // the others: the next sweep tries it again.
                match remove_tree(&e.path()) {
                    Ok(()) => removed.push(e.path()),
                    Err(err) if first.is_ok() => first = Err(err),
                    Err(_) => {}
                }
                drop(held);
            }
            // A live job's: the mode its job gave it is put back.
            Err((f, _)) => {
                if let Some(mode) = taken {
                    let _ =
                        nix::sys::stat::fchmod(&f, nix::sys::stat::Mode::from_bits_truncate(mode));
                }
            }
        }
    }
    first.map(|()| removed)
}

/// The job directory `p` opened (read-only, never through a symlink) to
/// test its lock. A job may have taken its own `/tmp`'s permissions away:
/// then `u+rwx` is given back through an `O_PATH` descriptor first, and
/// the mode it had is returned (to put back when a live job holds it).
fn open_to_lock(p: &Path) -> std::io::Result<(std::fs::File, Option<u32>)> {
    use nix::fcntl::OFlag;
    use std::os::fd::AsFd;
    let flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let path = nix::fcntl::open(p, flags | OFlag::O_PATH, nix::sys::stat::Mode::empty())
        .map_err(|e| std::io::Error::from_raw_os_error(e as i32))?;
    let st =
        nix::sys::stat::fstat(&path).map_err(|e| std::io::Error::from_raw_os_error(e as i32))?;
    let mode = st.st_mode & 0o7777;
    let taken = if mode & 0o500 != 0o500 {
        executor_sys::chmod_fd(path.as_fd(), mode | 0o700)?;
        Some(mode)
    } else {
        None
    };
    // The inode the O_PATH descriptor names, opened for reading.
    let fd = nix::fcntl::openat(
        &path,
        ".",
        flags | OFlag::O_RDONLY,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| std::io::Error::from_raw_os_error(e as i32))?;
    Ok((std::fs::File::from(fd), taken))
}

/// [`jobs_parent`], created if needed, and checked to be this user's own
/// private directory (in a shared /tmp the name could be taken).
pub fn private_jobs_parent() -> Result<PathBuf, PlanError> {
    use std::os::unix::fs::DirBuilderExt;
    let parent = jobs_parent();
    let io = |what: String| move |source| PlanError::Io { what, source };
    match std::fs::DirBuilder::new().mode(0o700).create(&parent) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(format!("creating {}", parent.display()))(e)),
    }
    let m =
        std::fs::symlink_metadata(&parent).map_err(io(format!("checking {}", parent.display())))?;
    if !m.is_dir() || m.uid() != nix::unistd::geteuid().as_raw() || m.mode() & 0o077 != 0 {
        return Err(PlanError::Unavailable(format!(
            "{} is not a private directory of this user; refusing to put job directories there",
            parent.display()
        )));
    }
    Ok(parent)
}

impl JobDir {
    /// Remove it now, saying why not (the agent logs that); a drop does the
    /// same silently.
    pub fn remove(mut self) -> std::io::Result<()> {
        // Taken: the drop that follows has nothing left to remove.
        remove_tree(&std::mem::take(&mut self.path))
    }
}

/// Remove the tree `p` (see [`crate::tree`]: any depth, by descriptor,
/// the owner's permissions restored, each failure logged).
fn remove_tree(p: &Path) -> std::io::Result<()> {
    let (Some(parent), Some(name)) = (p.parent(), p.file_name()) else {
        return Err(std::io::Error::other(format!(
            "{} is not a job directory",
            p.display()
        )));
    };
    crate::tree::remove_tree(parent, name).map_err(std::io::Error::other)
}

impl Drop for JobDir {
    fn drop(&mut self) {
        if !self.path.as_os_str().is_empty() {
            let _ = remove_tree(&self.path);
        }
    }
}

/// What a job owns on the host: its private directory and the
/// placeholders made for it. Removed by [`JobFiles::remove`] when the job
/// ends, or on drop (a job that never started).
#[derive(Debug, Default)]
pub struct JobFiles {
    pub tmp: Option<JobDir>,
    pub placeholders: Option<Placeholders>,
}

impl JobFiles {
    /// Remove both now; the first error, after trying both.
    pub fn remove(self) -> std::io::Result<()> {
        let a = self.tmp.map_or(Ok(()), JobDir::remove);
        let b = self.placeholders.map_or(Ok(()), Placeholders::remove);
        a.and(b)
    }

    /// Whether there is nothing to remove.
    pub fn is_empty(&self) -> bool {
        self.tmp.is_none() && self.placeholders.is_none()
    }
}

/// A plan: what the trampoline applies, what the job owns, what was not
/// enforced (only with `required: false`).
#[derive(Debug)]
pub struct Plan {
    pub wire: WirePlan,
    pub files: JobFiles,
    pub degraded: Vec<String>,
}

fn node(p: &Path, what: &str) -> Result<Node, PlanError> {
    Node::at(p).map_err(|source| PlanError::Io {
        what: format!("{what} {}", p.display()),
        source,
    })
}

fn bytes(p: &Path) -> ByteBuf {
    ByteBuf::from(p.as_os_str().as_bytes().to_vec())
}

/// The host's `/dev`: as a root, the job's own `/dev` stands for it.
pub const HOST_DEV: &str = "/dev";

/// The deepest write root that contains `p`.
fn enclosing<'a>(p: &Path, write: &'a [PathBuf]) -> Option<&'a PathBuf> {
    write
        .iter()
        .filter(|w| p.starts_with(w))
        .max_by_key(|w| w.as_os_str().len())
}

/// The network part of the plan: a port allow-list the host's Landlock
/// cannot enforce fails (`required`) or degrades to allowed.
fn network_plan(
    policy: &Policy,
    abi: u32,
    degraded: &mut Vec<String>,
) -> Result<WireNet, PlanError> {
    Ok(match &policy.network {
        NetworkIntent::Deny => WireNet::Deny,
        NetworkIntent::Allow => WireNet::Allow,
        NetworkIntent::AllowTcpConnect(ports) => {
            if abi < crate::LANDLOCK_ABI_NET {
                let what = format!(
                    "a TCP port allow-list needs Landlock ABI {}, this host has {abi}",
                    crate::LANDLOCK_ABI_NET
                );
                if policy.required {
                    return Err(PlanError::Unavailable(what));
                }
                degraded.push(format!(
                    "network: port allow-list {ports:?} not enforced ({what}); network allowed"
                ));
                WireNet::Allow
            } else {
                WireNet::Tcp(ports.clone())
            }
        }
        NetworkIntent::AllowHosts(_) => WireNet::Egress {
            port: egress_port()?,
        },
    })
}

/// What of the host is in the job's root at all (what is not there needs
/// no carve-out, and covering it would fail: it would not be the checked
/// inode). With :tmp the job's /tmp is its own directory, over the host's.
struct Visible<'a> {
    write: &'a [PathBuf],
    read: Option<Vec<PathBuf>>,
    own_tmp: bool,
    /// Roots in the host's /tmp bound over the job's own (the cwd).
    over_tmp: Vec<PathBuf>,
}

impl Visible<'_> {
    /// Whether `p` is in the job's root. With its own :tmp, the host's
    /// /tmp is reachable only through a root strictly below it (bound over
    /// the job's /tmp); a root at or above /tmp (`/tmp`, `/`) is covered
    /// there by the job's own. The host's /dev likewise: the job's /dev is
    /// its own, so only a root strictly below /dev reaches into it.
    fn contains(&self, p: &Path) -> bool {
        let (tmp, dev) = (Path::new("/tmp"), Path::new(HOST_DEV));
        let covered = |p: &Path, under: &Path, own: bool, r: Option<&PathBuf>| {
            let strictly_below = r.is_some_and(|r| r.starts_with(under) && r.as_path() != under);
            own && p.starts_with(under) && !strictly_below
        };
        let hidden =
            |r: Option<&PathBuf>| covered(p, tmp, self.own_tmp, r) || covered(p, dev, true, r);
        let through = |r: &PathBuf| p.starts_with(r) && !hidden(Some(r));
        self.write.iter().any(through)
            || self.over_tmp.iter().any(through)
            || match &self.read {
                None => !hidden(None),
                Some(r) => r.iter().any(through),
            }
    }
}

/// How the request's cwd is in the job's root when the job's own `:tmp`
/// covers the host's /tmp.
#[derive(Debug, PartialEq, Eq)]
enum CwdOverTmp {
    /// Visible already (outside /tmp, /tmp itself, or inside a root
    /// strictly below /tmp), or missing (the spawn reports that).
    AsIs,
    /// Granted by a root at or above /tmp: bound at its place over the
    /// job's /tmp, writable when a write root grants it (and no
    /// `deny_write` holds it).
    Bind {
        node: crate::policy::Checked,
        write: bool,
    },
}

/// With the job's own `:tmp` at /tmp, the host's /tmp is not in the job's
/// root, though a root at or above it (`read: "all"`, `/`, `/tmp`) grants
/// what it holds: a cwd there is bound over the job's /tmp with the access
/// that root gives, its carve-outs covered as in any root. A cwd there
/// that nothing grants, inside a `deny_read` path, or in the jobs'
/// directory (other jobs' `:tmp`) cannot be entered: `Unavailable`, naming
/// it and what to grant. Never wider than the policy: only what a root
/// grants is bound.
fn cwd_over_tmp(
    cwd: &Path,
    policy: &Policy,
    visible: &Visible<'_>,
) -> Result<CwdOverTmp, PlanError> {
    let tmp = Path::new("/tmp");
    let Some(c) = crate::policy::existing(cwd) else {
        return Ok(CwdOverTmp::AsIs);
    };
    if !visible.own_tmp || !c.path.starts_with(tmp) || c.path == tmp || visible.contains(&c.path) {
        return Ok(CwdOverTmp::AsIs);
    }
    let refuse = |why: String| {
        PlanError::Unavailable(format!(
            "the working directory {} is not in the job's sandbox ({why}): its own :tmp is mounted over the host's /tmp, so grant the directory itself (a read or write root at it or below /tmp, e.g. --ro/--rw {}) or run from a granted directory",
            cwd.display(),
            c.path.display()
        ))
    };
    if c.path.starts_with(jobs_parent()) {
        return Err(refuse("it is in the jobs' private directory".into()));
    }
    if let Some(d) = policy.deny_read.iter().find(|d| c.path.starts_with(d)) {
        return Err(refuse(format!("deny_read covers {}", d.display())));
    }
    let above = |r: &PathBuf| c.path.starts_with(r) && !(r.starts_with(tmp) && r != tmp);
    let denied_write = policy.deny_write.iter().any(|d| c.path.starts_with(d));
    let write = !denied_write && visible.write.iter().any(above);
    let read = match &visible.read {
        None => true,
        Some(roots) => roots.iter().any(above),
    };
    if !write && !read {
        return Err(refuse("no read or write root grants it".into()));
    }
    Ok(CwdOverTmp::Bind { node: c, write })
}

/// The error of making or holding a placeholder for the carve-out `d`.
fn placeholder_io(d: &Path) -> impl FnOnce(std::io::Error) -> PlanError {
    let what = format!("making a placeholder for the carve-out {}", d.display());
    move |source| PlanError::Io { what, source }
}

/// The carve-outs of a plan, gathered one by one.
struct CarveOuts<'a> {
    write_paths: &'a [PathBuf],
    /// The `deny_read` carve-outs: no name inside one is ever reported.
    hidden: &'a [PathBuf],
    required: bool,
    deny_write: Vec<Node>,
    deny_read: Vec<Node>,
    /// Carve-outs whose ancestors inside a write root are pinned.
    pinned_below: Vec<PathBuf>,
    /// Placeholders for carve-outs not there yet, made under the lock of
    /// the jobs' directory (started at the first carve-out in a write root).
    maker: Option<Maker>,
}

impl<'a> CarveOuts<'a> {
    /// No carve-outs yet, for a job with these write roots.
    fn new(write_paths: &'a [PathBuf], hidden: &'a [PathBuf], required: bool) -> Self {
        CarveOuts {
            write_paths,
            hidden,
            required,
            deny_write: Vec::new(),
            deny_read: Vec::new(),
            pinned_below: Vec::new(),
            maker: None,
        }
    }

    /// The placeholder maker, started (and the jobs' directory locked) on first use.
    fn maker(&mut self, d: &Path) -> Result<&mut Maker, PlanError> {
        if self.maker.is_none() {
            let dir = private_jobs_parent()?;
            self.maker = Some(Maker::start(&dir).map_err(placeholder_io(d))?);
        }
        Ok(self.maker.as_mut().expect("started above"))
    }

    /// Record the carve-out `n` at `d` (deny_read when `is_read`), its ancestors to pin.
    fn push(&mut self, n: Node, d: &Path, is_read: bool) {
        if is_read {
            self.deny_read.push(n);
        } else {
            self.deny_write.push(n);
        }
        self.pinned_below.push(d.to_path_buf());
    }

    /// Add the carve-out `d` named `field`, existing or not, if the job sees it.
    fn add(
        &mut self,
        field: &str,
        d: &Path,
        is_read: bool,
        visible: &Visible<'_>,
        degraded: &mut Vec<String>,
    ) -> Result<(), PlanError> {
        match std::fs::symlink_metadata(d) {
            Ok(_) if !visible.contains(d) => Ok(()),
            Ok(m) => self.add_existing(field, d, &m, is_read, degraded),
            Err(_) => self.add_missing(d, is_read),
        }
    }

    /// An existing carve-out: covered by the identity `m` has; one whose
    /// data has other names ([`linked_names`]) fails (`required`) or is
    /// reported as degraded.
    fn add_existing(
        &mut self,
        field: &str,
        d: &Path,
        m: &std::fs::Metadata,
        is_read: bool,
        degraded: &mut Vec<String>,
    ) -> Result<(), PlanError> {
        if let Some(what) = linked_names(field, d, m, is_read, self.hidden) {
            if self.required {
                return Err(PlanError::Unavailable(what));
            }
            degraded.push(format!("filesystem: {what}"));
        }
        if let Some(w) = enclosing(d, self.write_paths) {
            // It may be another live job's placeholder: hold it.
            self.maker(d)?.hold(w, d).map_err(placeholder_io(d))?;
        }
        // The identity the hard-link check saw (one look-up for both).
        let n = Node {
            path: bytes(d),
            dev: m.dev(),
            ino: m.ino(),
        };
        self.push(n, d, is_read);
        Ok(())
    }

    /// A carve-out not there yet: inside a write root it gets a placeholder
    /// (or, below a non-directory, that is covered read-only); elsewhere
    /// it cannot be created and needs nothing.
    fn add_missing(&mut self, d: &Path, is_read: bool) -> Result<(), PlanError> {
        let (ancestor, kind) = nearest_existing(d)?;
        let Some(w) = enclosing(ancestor, self.write_paths) else {
            // Read-only in the sandbox: it cannot be created.
            return Ok(());
        };
        if !kind.is_dir() && ancestor == w.as_path() {
            // The write root itself is not a directory: the job's mount
            // point, which it can neither rename nor remove (EBUSY), so
            // nothing can ever be created below it.
            return Ok(());
        }
        if !kind.is_dir() {
            // A file or a link where a directory would have to be
            // (a git worktree's `.git` file): it is covered
            // read-only, so it cannot be replaced by a directory
            // holding the carve-out.
            self.deny_write
                .push(node(ancestor, "the nearest existing part of a carve-out")?);
            self.pinned_below.push(ancestor.to_path_buf());
            return Ok(());
        }
        let (dev, ino) = self
            .maker(d)?
            .make(w, ancestor, d)
            .map_err(placeholder_io(d))?;
        let n = Node {
            path: bytes(d),
            dev,
            ino,
        };
        self.push(n, d, is_read);
        Ok(())
    }

    /// Symlinks on the way to carve-outs, inside write roots: covered
    /// read-only, so the names cannot be swapped (`rm .env` of a `.env`
    /// link to the protected file is `EBUSY`). Each keeps the identity of
    /// the link the policy's walk went through (never looked up again
    /// here): a link swapped back for a directory since makes the job's
    /// start fail instead of leaving the real directory uncovered.
    fn add_links(&mut self, links: &[Checked], visible: &Visible<'_>) {
        for link in links {
            let path = link.path.as_path();
            if visible.contains(path) && enclosing(path, self.write_paths).is_some() {
                let covered = self.deny_write.iter().any(|n| n.path() == path);
                if !covered {
                    self.deny_write.push(Node {
                        path: bytes(path),
                        dev: link.dev,
                        ino: link.ino,
                    });
                    self.pinned_below.push(path.to_path_buf());
                }
            }
        }
    }

    /// Pins: every ancestor between a carve-out and its write root, except
    /// those inside a read-only (deny_write) tree, which cannot be renamed
    /// anyway and must not be bound writable over it.
    fn pins(&self) -> Result<Vec<Node>, PlanError> {
        let read_only: Vec<PathBuf> = self
            .deny_write
            .iter()
            .map(|n| n.path().to_path_buf())
            .collect();
        let mut pin: Vec<Node> = Vec::new();
        let mut pin_paths: Vec<PathBuf> = Vec::new();
        for carve in &self.pinned_below {
            let Some(w) = enclosing(carve, self.write_paths) else {
                continue;
            };
            for a in carve.ancestors().skip(1) {
                if a == w.as_path() || !a.starts_with(w) {
                    break;
                }
                if read_only.iter().any(|r| a.starts_with(r)) {
                    continue;
                }
                if !pin_paths.iter().any(|p| p == a) {
                    pin_paths.push(a.to_path_buf());
                    pin.push(node(a, "ancestor of a carve-out")?);
                }
            }
        }
        Ok(pin)
    }
}

/// Why the existing carve-out `d` (field `field`, node `m`) would not
/// protect its data: a file with other hard links, a directory holding a
/// file with names outside it ([`crate::holds`]), or a directory too large
/// (or changing too fast) to examine. `None`: no other name reaches it.
/// No name inside a `deny_read` carve-out (`d` itself when `is_read`, or
/// one of `hidden` a `deny_write` directory holds) is ever in the answer.
fn linked_names(
    field: &str,
    d: &Path,
    m: &std::fs::Metadata,
    is_read: bool,
    hidden: &[PathBuf],
) -> Option<String> {
    let stays = if is_read { "readable" } else { "writable" };
    if !m.is_dir() {
        return (m.nlink() > 1).then(|| {
            format!(
                "{field}: {} has {} hard links; it stays {stays} through the others",
                d.display(),
                m.nlink(),
            )
        });
    }
    #[cfg(not(target_os = "linux"))]
    return {
        let _ = hidden;
        Some(format!(
            "{field}: {} cannot be examined for hard links on this platform",
            d.display()
        ))
    };
    #[cfg(target_os = "linux")]
    let is_hidden = |p: &Path| is_read || hidden.iter().any(|h| p.starts_with(h));
    #[cfg(target_os = "linux")]
    match crate::holds::linked_out(d, Some((m.dev(), m.ino())), crate::holds::MAX_ENTRIES) {
        // Nothing inside a deny_read carve-out is named (its names are
        // part of what it hides).
        Ok(l) => l.first().map(|first| {
            // A file outside every deny_read path is named, if there is one.
            let f = l.iter().find(|f| !is_hidden(&f.path)).unwrap_or(first);
            let which = if is_hidden(&f.path) {
                format!("a file ({} hard links)", f.nlink)
            } else {
                format!("{} ({} hard links)", f.path.display(), f.nlink)
            };
            format!(
                "{field}: {} holds {which}, {} file(s) in all with names outside it; they stay {stays} through those",
                d.display(),
                l.len(),
            )
        }),
        Err(e) => {
            let hide = match &e {
                crate::holds::ScanError::Io { path, .. }
                | crate::holds::ScanError::Changed { path } => is_hidden(path),
                _ => is_read,
            };
            let why = match e {
                crate::holds::ScanError::TooMany { .. } => e.to_string(),
                _ if hide => format!(
                    "{} cannot be examined for hard links (it changed, or cannot be read)",
                    d.display()
                ),
                _ => e.to_string(),
            };
            Some(format!(
                "{field}: {why}; a file in it with other hard links would stay {stays} through those"
            ))
        }
    }
}

/// The nearest existing ancestor of the missing `d` and its file type (`/` if none).
fn nearest_existing(d: &Path) -> Result<(&Path, std::fs::FileType), PlanError> {
    Ok(d.ancestors()
        .skip(1)
        .find_map(|a| {
            std::fs::symlink_metadata(a)
                .ok()
                .map(|m| (a, m.file_type()))
        })
        .unwrap_or((
            Path::new("/"),
            std::fs::metadata("/")
                .map_err(|source| PlanError::Io {
                    what: "stat /".into(),
                    source,
                })?
                .file_type(),
        )))
}

/// Symlinks met on the way to the roots, and the host's top-level links
/// into granted roots (`/bin` -> `usr/bin` when `/usr` is granted).
fn job_symlinks(policy: &Policy, write_paths: &[PathBuf]) -> Vec<(ByteBuf, ByteBuf)> {
    let mut symlinks: Vec<(ByteBuf, ByteBuf)> = Vec::new();
    let mut push_link = |at: &Path, to: &Path| {
        let entry = (bytes(at), bytes(to));
        if !symlinks.contains(&entry) {
            symlinks.push(entry);
        }
    };
    for (at, to) in &policy.links {
        push_link(at, to);
    }
    if let Some(roots) = &policy.read {
        let granted: Vec<PathBuf> = root_paths(roots)
            .into_iter()
            .chain(write_paths.to_vec())
            .collect();
        if let Ok(dir) = std::fs::read_dir("/") {
            for e in dir.flatten() {
                let at = e.path();
                let Ok(to) = std::fs::read_link(&at) else {
                    continue;
                };
                if let Ok(real) = std::fs::canonicalize(&at) {
                    if granted.iter().any(|g| real.starts_with(g)) {
                        push_link(&at, &to);
                    }
                }
            }
        }
    }
    symlinks
}

/// Make the plan for `policy` on a host with `caps`; `param` names the
/// request field of the intent, for messages (`sandbox`).
pub fn plan(
    policy: &Policy,
    caps: &Capabilities,
    param: &str,
    cwd: Option<&Path>,
) -> Result<Plan, PlanError> {
    let mut degraded = Vec::new();
    let abi = caps.landlock_abi.unwrap_or(0);
    let net = network_plan(policy, abi, &mut degraded)?;
    let write_paths = root_paths(&policy.write);
    // The roots keep the identity the policy's one look-up found: the
    // trampoline mounts that node or nothing.
    let checked = |roots: &[Root]| -> Vec<Node> {
        roots
            .iter()
            .filter_map(|r| match r {
                Root::Path(c) => Some(Node {
                    path: bytes(&c.path),
                    dev: c.dev,
                    ino: c.ino,
                }),
                Root::Tmp => None,
            })
            .collect()
    };
    // A root `/` (read or write) is the host's whole tree: `read: None`.
    let slash = |roots: &[Root]| {
        roots
            .iter()
            .any(|r| matches!(r, Root::Path(c) if c.path == Path::new("/")))
    };
    let everything = slash(&policy.write) || policy.read.as_deref().is_some_and(slash);
    let mut read = match policy.read.as_deref() {
        Some(roots) if !everything => Some(checked(roots)),
        _ => None,
    };
    let mut write = checked(&policy.write);
    // A root `/dev` is the job's own /dev (the init binds nothing of the
    // host's there): nothing of the host's /dev is visible, writable, or
    // gets a placeholder.
    let mut write_paths: Vec<PathBuf> = write_paths
        .into_iter()
        .filter(|p| p != Path::new(HOST_DEV))
        .collect();
    let read_paths = match policy.read.as_deref() {
        Some(roots) if !everything => Some(
            root_paths(roots)
                .into_iter()
                .filter(|p| p != Path::new(HOST_DEV))
                .collect(),
        ),
        _ => None,
    };

    let needs_tmp = policy.write.contains(&Root::Tmp)
        || policy.read.as_ref().is_some_and(|r| r.contains(&Root::Tmp));
    // The cwd, decided against what the roots alone make visible.
    let cwd_bind = match cwd {
        Some(cwd) => cwd_over_tmp(
            cwd,
            policy,
            &Visible {
                write: &write_paths,
                read: read_paths.clone(),
                own_tmp: needs_tmp,
                over_tmp: Vec::new(),
            },
        )?,
        None => CwdOverTmp::AsIs,
    };
    let mut over_tmp = Vec::new();
    let mut read_over_tmp = Vec::new();
    if let CwdOverTmp::Bind { node, write: w } = cwd_bind {
        let n = Node {
            path: bytes(&node.path),
            dev: node.dev,
            ino: node.ino,
        };
        match (w, read.as_mut()) {
            (true, _) => write.push(n),
            (false, Some(list)) => list.push(n),
            (false, None) => read_over_tmp.push(n),
        }
        if w {
            // A write root of its own: its carve-outs get placeholders and
            // pins as in any write root.
            write_paths.push(node.path.clone());
        }
        over_tmp.push(node.path);
    }
    let visible = Visible {
        write: &write_paths,
        read: read_paths,
        own_tmp: needs_tmp,
        over_tmp,
    };
    let mut carve = CarveOuts::new(&write_paths, &policy.deny_read, policy.required);
    for (i, d) in policy.deny_read.iter().enumerate() {
        let field = format!("{param}.filesystem.deny_read.{i}");
        carve.add(&field, d, true, &visible, &mut degraded)?;
    }
    for (i, d) in policy.deny_write.iter().enumerate() {
        let field = format!("{param}.filesystem.deny_write.{i}");
        carve.add(&field, d, false, &visible, &mut degraded)?;
    }
    let placeholders = carve.maker.take().and_then(Maker::finish);
    carve.add_links(&policy.carve_out_links, &visible);
    let pin = carve.pins()?;

    // Other jobs' private directories are never visible to a job.
    // (Made now if it is missing: a job must never be the one to make it.)
    if visible.contains(&jobs_parent()) {
        let jobs = private_jobs_parent()?;
        carve.deny_read.push(node(&jobs, "the jobs' directory")?);
    }

    let job_dir = if needs_tmp {
        Some(JobDir::create()?)
    } else {
        None
    };
    let tmp = match &job_dir {
        Some(d) => Some(node(d.path(), "the job's :tmp")?),
        None => None,
    };
    let symlinks = job_symlinks(policy, &write_paths);

    Ok(Plan {
        wire: WirePlan {
            landlock_abi: abi,
            read,
            write,
            tmp,
            tmp_bytes: None,
            deny_write: carve.deny_write,
            deny_read: carve.deny_read,
            pin,
            symlinks,
            net,
            read_over_tmp,
        },
        files: JobFiles {
            tmp: job_dir,
            placeholders,
        },
        degraded,
    })
}
