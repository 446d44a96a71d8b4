//! Filesystem requests under a sandbox intent: every path is resolved
//! *beneath* an allowed root by the kernel (`openat2` with
//! `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`), so `..`, symlinks leading out
//! of the roots and `/proc/self/root`-style magic links are refused with
//! `sandbox_denied`, never judged by string prefixes. The resolved path then
//! has no symlink left in it, and carve-outs are checked on it.
//!
//! Known limit: the operation itself runs on the resolved path after the
//! check, so a process that can write inside the same root could race a
//! directory swap in between (the jobs of a sandbox have their own,
//! kernel-enforced view and are not affected).

use super::io_error;
use crate::config::Profile;
use crate::sandbox_gate::effective_policy;
use executor_protocol::types::fs::Scoped;
use executor_protocol::{ErrorCode, WireError, WirePath};
use executor_sandbox::policy::root_paths;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// What a request does with its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
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

fn how() -> OpenHow {
    OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
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
        Ok(Some(Confinement {
            read,
            write,
            deny_read: policy.deny_read,
            deny_write: policy.deny_write,
        }))
    }

    /// Resolve `path` beneath a root allowing `access`; the resolved path
    /// (or `denied`). `follow` says whether a final symlink is followed.
    pub fn resolve(&self, path: &Path, access: Access, follow: bool) -> Result<PathBuf, WireError> {
        let roots = match access {
            Access::Read => &self.read,
            Access::Write => &self.write,
        };
        let (parent, name) = match (path.parent(), path.file_name()) {
            (Some(p), Some(n)) => (p, Some(n)),
            _ => (path, None),
        };
        let mut escaped = None;
        for root in roots {
            let Ok(rel_parent) = parent.strip_prefix(root) else {
                continue;
            };
            let root_fd: OwnedFd = std::fs::File::open(root)
                .map_err(|e| io_error(&e, root, "cannot open sandbox root"))?
                .into();
            let rel_parent = if rel_parent.as_os_str().is_empty() {
                Path::new(".")
            } else {
                rel_parent
            };
            let parent_fd = match openat2(
                &root_fd,
                rel_parent,
                how().flags(OFlag::O_PATH | OFlag::O_DIRECTORY),
            ) {
                Ok(fd) => fd,
                Err(nix::errno::Errno::EXDEV) | Err(nix::errno::Errno::ELOOP) => {
                    escaped = Some(root.clone());
                    continue;
                }
                Err(e) => return Err(io_error(&std::io::Error::from(e), path, "cannot resolve")),
            };
            let real_parent =
                real_path(&parent_fd).map_err(|e| io_error(&e, path, "cannot resolve"))?;
            let real = match name {
                None => real_parent,
                Some(n) => {
                    let flags = if follow {
                        OFlag::O_PATH
                    } else {
                        OFlag::O_PATH | OFlag::O_NOFOLLOW
                    };
                    match openat2(&parent_fd, n, how().flags(flags)) {
                        Ok(fd) if follow => {
                            real_path(&fd).map_err(|e| io_error(&e, path, "cannot resolve"))?
                        }
                        Ok(_) => real_parent.join(n),
                        Err(nix::errno::Errno::ENOENT) => real_parent.join(n),
                        Err(nix::errno::Errno::EXDEV) | Err(nix::errno::Errno::ELOOP) => {
                            // A final symlink out of this parent: resolve it
                            // beneath the root instead.
                            let rel = path.strip_prefix(root).unwrap_or(path);
                            match openat2(&root_fd, rel, how()) {
                                Ok(fd) => real_path(&fd)
                                    .map_err(|e| io_error(&e, path, "cannot resolve"))?,
                                Err(_) => {
                                    escaped = Some(root.clone());
                                    continue;
                                }
                            }
                        }
                        Err(e) => {
                            return Err(io_error(&std::io::Error::from(e), path, "cannot resolve"))
                        }
                    }
                }
            };
            if !real.starts_with(root) {
                escaped = Some(root.clone());
                continue;
            }
            let carve_outs = match access {
                Access::Read => self.deny_read.iter().collect::<Vec<_>>(),
                Access::Write => self
                    .deny_read
                    .iter()
                    .chain(self.deny_write.iter())
                    .collect(),
            };
            if let Some(d) = carve_outs.into_iter().find(|d| real.starts_with(d)) {
                return Err(denied(
                    path,
                    format!("inside the carve-out {}", d.display()),
                ));
            }
            return Ok(real);
        }
        let what = match access {
            Access::Read => "read",
            Access::Write => "write",
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

    /// Whether a directory met during a walk is hidden by a carve-out.
    pub fn hidden(&self, real: &Path) -> bool {
        self.deny_read.iter().any(|d| real.starts_with(d))
    }
}

/// A request path, absolute, resolved under the request's sandbox (if any).
pub fn confined(
    profile: &Profile,
    request: &impl Scoped,
    p: &WirePath,
    field: &str,
    access: Access,
    follow: bool,
) -> Result<PathBuf, WireError> {
    let path = super::req_path(p, field)?;
    // `..` is resolved by the kernel beneath a root, never here.
    match Confinement::of(profile, request)? {
        None => Ok(path),
        Some(c) => c.resolve(&path, access, follow),
    }
}
