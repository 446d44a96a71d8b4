//! From a resolved [`Policy`] to the plan the trampoline applies: every
//! root and carve-out carried by identity (device and inode, checked again
//! by the trampoline on a descriptor it opens without following symlinks),
//! the ancestors of carve-outs to pin, the symlinks to recreate in the
//! job's fresh root, and the job's private directory, owned by a value
//! that removes it when dropped.
//!
//! Depends on [`crate::policy`] and [`crate::Capabilities`] only; the agent
//! calls [`plan`] and hands [`Plan::wire`] to the trampoline inside the job
//! spec ([`crate::spec`]).

use crate::policy::{root_paths, Policy, Root};
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

/// The job's private directory; removed when dropped.
#[derive(Debug)]
pub struct JobDir(PathBuf);

impl JobDir {
    fn create() -> Result<JobDir, PlanError> {
        use std::os::unix::fs::DirBuilderExt;
        let mut r = [0u8; 8];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut r))
            .map_err(|source| PlanError::Io {
                what: "reading /dev/urandom for the job's directory name".into(),
                source,
            })?;
        let name: String = r.iter().map(|b| format!("{b:02x}")).collect();
        let parent = jobs_parent();
        let io = |what: String| move |source| PlanError::Io { what, source };
        match std::fs::DirBuilder::new().mode(0o700).create(&parent) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io(format!("creating {}", parent.display()))(e)),
        }
        // In a shared /tmp the name could have been taken by someone else.
        let m = std::fs::symlink_metadata(&parent)
            .map_err(io(format!("checking {}", parent.display())))?;
        if !m.is_dir() || m.uid() != nix::unistd::geteuid().as_raw() || m.mode() & 0o077 != 0 {
            return Err(PlanError::Unavailable(format!(
                "{} is not a private directory of this user; refusing to put job directories there",
                parent.display()
            )));
        }
        let dir = parent.join(format!("job-{name}"));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|source| PlanError::Io {
                what: format!("creating the job's :tmp {}", dir.display()),
                source,
            })?;
        Ok(JobDir(dir))
    }

    /// Its path on the host.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

/// Where job directories live: one private directory per user, covered in
/// every job's root.
pub fn jobs_parent() -> PathBuf {
    std::env::temp_dir().join(format!("executor-jobs-{}", nix::unistd::geteuid()))
}

/// Give the owner full access to every directory below `p` (a job may have
/// taken its own away, to make its directory outlive it).
fn writable_tree(p: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(m) = std::fs::symlink_metadata(p) else {
        return;
    };
    if !m.is_dir() {
        return;
    }
    let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700));
    if let Ok(entries) = std::fs::read_dir(p) {
        for e in entries.flatten() {
            writable_tree(&e.path());
        }
    }
}

impl JobDir {
    /// Remove it now, saying why not (the agent logs that); a drop does the
    /// same silently.
    pub fn remove(mut self) -> std::io::Result<()> {
        // Taken: the drop that follows has nothing left to remove.
        remove_tree(&std::mem::take(&mut self.0))
    }
}

fn remove_tree(p: &Path) -> std::io::Result<()> {
    writable_tree(p);
    match std::fs::remove_dir_all(p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

impl Drop for JobDir {
    fn drop(&mut self) {
        if !self.0.as_os_str().is_empty() {
            let _ = remove_tree(&self.0);
        }
    }
}

/// A plan: what the trampoline applies, what the job owns, what was not
/// enforced (only with `required: false`).
#[derive(Debug)]
pub struct Plan {
    pub wire: WirePlan,
    pub job_dir: Option<JobDir>,
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

/// The deepest write root that contains `p`.
fn enclosing<'a>(p: &Path, write: &'a [PathBuf]) -> Option<&'a PathBuf> {
    write
        .iter()
        .filter(|w| p.starts_with(w))
        .max_by_key(|w| w.as_os_str().len())
}

/// Make the plan for `policy` on a host with `caps`; `param` names the
/// request field of the intent, for messages (`sandbox`).
pub fn plan(policy: &Policy, caps: &Capabilities, param: &str) -> Result<Plan, PlanError> {
    let required = policy.required;
    let mut degraded = Vec::new();
    let abi = caps.landlock_abi.unwrap_or(0);
    let net = match &policy.network {
        NetworkIntent::Deny => WireNet::Deny,
        NetworkIntent::Allow => WireNet::Allow,
        NetworkIntent::AllowTcpConnect(ports) => {
            if abi < crate::LANDLOCK_ABI_NET {
                let what = format!(
                    "a TCP port allow-list needs Landlock ABI {}, this host has {abi}",
                    crate::LANDLOCK_ABI_NET
                );
                if required {
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
    };
    let paths = root_paths;
    let write_paths = paths(&policy.write);
    let read = match &policy.read {
        None => None,
        Some(roots) => Some(
            paths(roots)
                .iter()
                .map(|p| node(p, "read root"))
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    let write = write_paths
        .iter()
        .map(|p| node(p, "write root"))
        .collect::<Result<Vec<_>, _>>()?;

    let mut deny_write = Vec::new();
    let mut deny_read = Vec::new();
    let mut pinned_below: Vec<PathBuf> = Vec::new();
    let carve_outs = policy
        .deny_read
        .iter()
        .enumerate()
        .map(|(i, d)| (format!("{param}.filesystem.deny_read.{i}"), d, true))
        .chain(
            policy
                .deny_write
                .iter()
                .enumerate()
                .map(|(i, d)| (format!("{param}.filesystem.deny_write.{i}"), d, false)),
        );
    // Whether `p` is in the job's root at all (what is not there needs no
    // carve-out, and covering it would fail: it would not be the checked
    // inode). With :tmp the job's /tmp is its own directory, over the host's.
    let needs_tmp = policy.write.contains(&Root::Tmp)
        || policy.read.as_ref().is_some_and(|r| r.contains(&Root::Tmp));
    let read_paths = policy.read.as_deref().map(paths);
    let visible = |p: &Path| -> bool {
        write_paths.iter().any(|w| p.starts_with(w))
            || match &read_paths {
                None => !(needs_tmp && p.starts_with("/tmp")),
                Some(r) => r.iter().any(|r| p.starts_with(r)),
            }
    };
    for (field, d, is_read) in carve_outs {
        match std::fs::symlink_metadata(d) {
            Ok(_) if !visible(d) => {}
            Ok(m) => {
                if !m.is_dir() && m.nlink() > 1 {
                    let what = format!(
                        "{field}: {} has {} hard links; it stays {} through the others",
                        d.display(),
                        m.nlink(),
                        if is_read { "readable" } else { "writable" }
                    );
                    if required {
                        return Err(PlanError::Unavailable(what));
                    }
                    degraded.push(format!("filesystem: {what}"));
                }
                let n = node(d, "carve-out")?;
                if is_read {
                    deny_read.push(n);
                } else {
                    deny_write.push(n);
                }
                pinned_below.push(d.to_path_buf());
            }
            Err(_) => {
                let ancestor = d
                    .ancestors()
                    .skip(1)
                    .find(|a| a.exists())
                    .unwrap_or(Path::new("/"));
                if enclosing(ancestor, &write_paths).is_none() {
                    // Read-only in the sandbox: it cannot be created.
                    continue;
                }
                if write_paths.iter().any(|w| w == ancestor) {
                    let what = format!(
                        "{field}: {} does not exist and its nearest existing parent is the write root {}; \
                         protecting it would make the whole root read-only",
                        d.display(),
                        ancestor.display()
                    );
                    if required {
                        return Err(PlanError::Unavailable(what));
                    }
                    degraded.push(format!("filesystem: {what}; not enforced"));
                    continue;
                }
                deny_write.push(node(ancestor, "parent of a carve-out")?);
                pinned_below.push(ancestor.to_path_buf());
            }
        }
    }

    // Pins: every ancestor between a carve-out and its write root, except
    // those inside a read-only (deny_write) tree, which cannot be renamed
    // anyway and must not be bound writable over it.
    let read_only: Vec<PathBuf> = deny_write.iter().map(|n| n.path().to_path_buf()).collect();
    let mut pin: Vec<Node> = Vec::new();
    let mut pin_paths: Vec<PathBuf> = Vec::new();
    for carve in &pinned_below {
        let Some(w) = enclosing(carve, &write_paths) else {
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

    // Other jobs' private directories are never visible to a job.
    let jobs = jobs_parent();
    if visible(&jobs) && jobs.is_dir() {
        deny_read.push(node(&jobs, "the jobs' directory")?);
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

    // Symlinks met on the way to the roots, and the host's top-level links
    // into granted roots (`/bin` -> `usr/bin` when `/usr` is granted).
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
        let granted: Vec<PathBuf> = paths(roots)
            .into_iter()
            .chain(write_paths.clone())
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

    Ok(Plan {
        wire: WirePlan {
            landlock_abi: abi,
            read,
            write,
            tmp,
            deny_write,
            deny_read,
            pin,
            symlinks,
            net,
        },
        job_dir,
        degraded,
    })
}
