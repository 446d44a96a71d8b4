//! The agent's decision on a request's sandbox intent.
//!
//! Every intent is resolved first (symbols, canonical roots), so a root that
//! does not exist is `invalid_params` naming it, and nothing runs. Then:
//! - what this host can enforce is enforced (the trampoline applies the
//!   policy to the job before exec; see `executor_sandbox::linux`);
//! - with `required: true` (the default), anything that cannot be enforced
//!   is `sandbox_unavailable` and nothing runs;
//! - with `required: false`, the job runs with what can be enforced and
//!   the answer lists the rest in `sandbox_degraded`.
//!
//! Never silently weaker.

use executor_protocol::types::sandbox::{NetworkIntent, SandboxIntent};
use executor_protocol::{ErrorCode, WireError};
use executor_sandbox::policy::{resolve, Context, Policy, Root};
use executor_sandbox::Capabilities;
use serde_bytes::ByteBuf;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

fn home() -> Option<PathBuf> {
    nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .map(|u| u.dir)
        .filter(|d| d.is_absolute())
}

/// Resolve `intent` for a request whose cwd is `cwd`; `param` names the
/// request field holding the intent (`sandbox`, `sandbox_permissions`).
pub fn resolve_intent(
    intent: &SandboxIntent,
    cwd: Option<&Path>,
    param: &str,
) -> Result<Policy, WireError> {
    let ctx = Context {
        cwd: cwd.map(Path::to_path_buf),
        workspace_roots: Vec::new(),
        home: home(),
    };
    resolve(intent, &ctx).map_err(|e| {
        let field = e.field().replacen("sandbox", param, 1);
        WireError::invalid_params(&field, e.to_string().replacen("sandbox", param, 1))
    })
}

/// What to do with a job.
#[derive(Debug)]
pub enum Decision {
    /// No intent: run as is.
    Unconfined,
    /// Enforce `policy` (the trampoline's argument); `tmp` is the job's
    /// private temp dir (remove it when the job ends); `degraded` lists
    /// what was not enforced (only with `required: false`).
    Enforce {
        policy: String,
        tmp: Option<PathBuf>,
        degraded: Option<Vec<String>>,
    },
    /// Nothing can be enforced here and the intent allows that.
    Degraded(Vec<String>),
}

fn unavailable(what: String) -> WireError {
    WireError::new(
        ErrorCode::SandboxUnavailable,
        format!("{what}; nothing was run"),
    )
}

fn bytes(p: &Path) -> ByteBuf {
    ByteBuf::from(p.as_os_str().as_bytes().to_vec())
}

/// A private temp dir for one job (0700).
fn private_tmp() -> Result<PathBuf, WireError> {
    use ring::rand::{SecureRandom, SystemRandom};
    use std::os::unix::fs::DirBuilderExt;
    let mut r = [0u8; 8];
    SystemRandom::new().fill(&mut r).map_err(|_| {
        WireError::new(ErrorCode::Internal, "the OS random number generator failed")
    })?;
    let name: String = r.iter().map(|b| format!("{b:02x}")).collect();
    let dir = std::env::temp_dir().join(format!("executor-job-{name}"));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| {
            WireError::new(
                ErrorCode::Io,
                format!("cannot create the job's :tmp {}: {e}", dir.display()),
            )
        })?;
    Ok(dir)
}

/// Decide for a job started with `intent` in `cwd`.
pub fn gate(
    caps: &Capabilities,
    intent: Option<&SandboxIntent>,
    cwd: Option<&Path>,
    param: &str,
) -> Result<Decision, WireError> {
    let Some(intent) = intent else {
        return Ok(Decision::Unconfined);
    };
    let policy = resolve_intent(intent, cwd, param)?;
    let mut degraded = Vec::new();
    if !caps.enforceable() {
        let why = caps.to_wire().reason.unwrap_or_default();
        if intent.required {
            return Err(unavailable(format!(
                "this host cannot enforce a sandbox ({why})"
            )));
        }
        return Ok(Decision::Degraded(vec![
            format!("filesystem: not enforced ({why})"),
            format!("network: not enforced ({why})"),
        ]));
    }
    let abi = caps.landlock_abi.unwrap_or(0);
    let net = match &policy.network {
        NetworkIntent::Deny => executor_sandbox::linux::WireNet::Deny,
        NetworkIntent::Allow => executor_sandbox::linux::WireNet::Allow,
        NetworkIntent::AllowTcpConnect(ports) => {
            if abi < executor_sandbox::LANDLOCK_ABI_NET {
                if intent.required {
                    return Err(unavailable(format!(
                        "a TCP port allow-list needs Landlock ABI 4, this host has {abi}"
                    )));
                }
                degraded.push(format!("network: port allow-list {ports:?} not enforced (Landlock ABI {abi} < 4); network allowed"));
                executor_sandbox::linux::WireNet::Allow
            } else {
                executor_sandbox::linux::WireNet::Tcp(ports.clone())
            }
        }
    };
    // Carve-outs: what can be covered by a mount today.
    let mut deny_read = Vec::new();
    for (i, d) in policy.deny_read.iter().enumerate() {
        match std::fs::metadata(d) {
            Ok(m) if m.is_dir() => deny_read.push(bytes(d)),
            _ if intent.required => {
                return Err(unavailable(format!(
                    "{param}.filesystem.deny_read.{i}: {} is not an existing directory; hiding files and paths \
                     that do not exist yet is not supported by this agent version",
                    d.display()
                )))
            }
            _ => degraded.push(format!("filesystem: deny_read {} not enforced", d.display())),
        }
    }
    let mut deny_write = Vec::new();
    for (i, d) in policy.deny_write.iter().enumerate() {
        if d.exists() {
            deny_write.push(bytes(d));
        } else if intent.required {
            return Err(unavailable(format!(
                "{param}.filesystem.deny_write.{i}: {} does not exist; protecting a path that does not exist yet \
                 is not supported by this agent version",
                d.display()
            )));
        } else {
            degraded.push(format!(
                "filesystem: deny_write {} not enforced",
                d.display()
            ));
        }
    }
    let needs_tmp = policy.write.contains(&Root::Tmp)
        || policy.read.as_ref().is_some_and(|r| r.contains(&Root::Tmp));
    let tmp = if needs_tmp {
        Some(private_tmp()?)
    } else {
        None
    };
    let root = |r: &Root| -> ByteBuf {
        match r {
            Root::Path(p) => bytes(p),
            Root::Tmp => bytes(tmp.as_deref().unwrap_or(Path::new("/nonexistent"))),
        }
    };
    let wire = executor_sandbox::linux::WirePolicy {
        v: 1,
        landlock_abi: abi,
        read: policy.read.as_ref().map(|r| r.iter().map(root).collect()),
        write: policy.write.iter().map(root).collect(),
        deny_read,
        deny_write,
        net,
    };
    Ok(Decision::Enforce {
        policy: wire.encode(),
        tmp,
        degraded: (!degraded.is_empty()).then_some(degraded),
    })
}

impl Decision {
    /// (policy argument, private tmp, degraded list) for a spawn.
    pub fn into_parts(self) -> (String, Option<PathBuf>, Option<Vec<String>>) {
        match self {
            Decision::Unconfined => (String::new(), None, None),
            Decision::Enforce {
                policy,
                tmp,
                degraded,
            } => (policy, tmp, degraded),
            Decision::Degraded(d) => (String::new(), None, Some(d)),
        }
    }
}
