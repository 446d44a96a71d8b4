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

use crate::config::Profile;
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
    workspace_roots: &[PathBuf],
    param: &str,
) -> Result<Policy, WireError> {
    let ctx = Context {
        cwd: cwd.map(Path::to_path_buf),
        workspace_roots: workspace_roots.to_vec(),
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
    /// private directory (its `:tmp` and carve-out file; remove it when the
    /// job ends); `degraded` lists
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

fn under(path: &Path, roots: &[Root]) -> bool {
    roots
        .iter()
        .any(|r| matches!(r, Root::Path(root) if path.starts_with(root)))
}

/// A request's policy inside the profile's: read and write roots within
/// the profile's, ports within its ports; the profile's carve-outs added.
/// Anything wider is `policy_denied` naming the field.
fn narrow(mut req: Policy, profile: Policy, param: &str) -> Result<Policy, WireError> {
    let wider = |field: String, what: String| {
        WireError::new(
            ErrorCode::PolicyDenied,
            format!("{field}: {what} is wider than this profile's sandbox allows"),
        )
        .with("field", field)
    };
    if let Some(allowed) = &profile.read {
        match &req.read {
            None => return Err(wider(format!("{param}.filesystem.read"), "\"all\"".into())),
            Some(roots) => {
                for (i, r) in roots.iter().enumerate() {
                    if let Root::Path(p) = r {
                        if !under(p, allowed) {
                            return Err(wider(
                                format!("{param}.filesystem.read.{i}"),
                                p.display().to_string(),
                            ));
                        }
                    }
                }
            }
        }
    }
    for (i, r) in req.write.iter().enumerate() {
        if let Root::Path(p) = r {
            if !under(p, &profile.write) {
                return Err(wider(
                    format!("{param}.filesystem.write.{i}"),
                    p.display().to_string(),
                ));
            }
        }
    }
    let ok_net = match (&profile.network, &req.network) {
        (NetworkIntent::Allow, _) | (_, NetworkIntent::Deny) => true,
        (NetworkIntent::AllowTcpConnect(allowed), NetworkIntent::AllowTcpConnect(asked)) => {
            asked.iter().all(|p| allowed.contains(p))
        }
        _ => false,
    };
    if !ok_net {
        return Err(wider(
            format!("{param}.network"),
            format!("{:?}", req.network),
        ));
    }
    req.deny_read.extend(profile.deny_read);
    req.deny_write.extend(profile.deny_write);
    req.required |= profile.required;
    Ok(req)
}

/// The policy a request runs under: its own intent, the profile's default
/// intent, or its own narrowed to the profile's; `None` without either.
pub fn effective_policy(
    intent: Option<&SandboxIntent>,
    cwd: Option<&Path>,
    param: &str,
    profile: &Profile,
) -> Result<Option<Policy>, WireError> {
    let roots = &profile.workspace_roots;
    Ok(match (intent, profile.sandbox.as_ref()) {
        (None, None) => None,
        (Some(i), None) => Some(resolve_intent(i, cwd, roots, param)?),
        (None, Some(p)) => Some(resolve_intent(p, cwd, roots, "profile sandbox")?),
        (Some(i), Some(p)) => Some(narrow(
            resolve_intent(i, cwd, roots, param)?,
            resolve_intent(p, cwd, roots, "profile sandbox")?,
            param,
        )?),
    })
}

/// Decide for a job started with `intent` in `cwd`, under the profile's
/// default intent and workspace roots.
pub fn gate(
    caps: &Capabilities,
    intent: Option<&SandboxIntent>,
    cwd: Option<&Path>,
    param: &str,
    profile: &Profile,
) -> Result<Decision, WireError> {
    let Some(policy) = effective_policy(intent, cwd, param, profile)? else {
        return Ok(Decision::Unconfined);
    };
    let required = policy.required;
    let mut degraded = Vec::new();
    if !caps.enforceable() {
        let why = caps.to_wire().reason.unwrap_or_default();
        if required {
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
                if required {
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
    // Carve-outs. An existing directory is covered by an empty tmpfs, an
    // existing file by an empty mode-000 file; one that does not exist yet
    // is kept from being created by making its nearest existing ancestor
    // read-only (stricter for that ancestor's other entries; refused when
    // the ancestor is a whole write root, which would void the intent).
    let write_roots: Vec<&Path> = policy
        .write
        .iter()
        .filter_map(|r| match r {
            Root::Path(p) => Some(p.as_path()),
            Root::Tmp => None,
        })
        .collect();
    let mut deny_read = Vec::new();
    let mut deny_read_files = Vec::new();
    let mut deny_write = Vec::new();
    let mut read_only_extra: Vec<ByteBuf> = Vec::new();
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
    for (field, d, is_read) in carve_outs {
        match std::fs::symlink_metadata(d) {
            Ok(m) if is_read && m.is_dir() => deny_read.push(bytes(d)),
            Ok(_) if is_read => deny_read_files.push(bytes(d)),
            Ok(_) => deny_write.push(bytes(d)),
            Err(_) => {
                let ancestor = d
                    .ancestors()
                    .skip(1)
                    .find(|a| a.exists())
                    .unwrap_or(Path::new("/"));
                let under_write = write_roots.iter().any(|w| ancestor.starts_with(w));
                if !under_write {
                    // Already read-only in the sandbox: it cannot be created.
                    continue;
                }
                if write_roots.contains(&ancestor) {
                    let what = format!(
                        "{field}: {} does not exist and its nearest existing parent is the write root {}; \
                         protecting it would make the whole root read-only",
                        d.display(),
                        ancestor.display()
                    );
                    if required {
                        return Err(unavailable(what));
                    }
                    degraded.push(format!("filesystem: {what}; not enforced"));
                    continue;
                }
                read_only_extra.push(bytes(ancestor));
            }
        }
    }
    let needs_tmp = policy.write.contains(&Root::Tmp)
        || policy.read.as_ref().is_some_and(|r| r.contains(&Root::Tmp));
    let job_dir = if needs_tmp || !deny_read_files.is_empty() {
        Some(private_tmp()?)
    } else {
        None
    };
    let tmp = match (&job_dir, needs_tmp) {
        (Some(dir), true) => {
            let t = dir.join("tmp");
            std::fs::create_dir(&t).map_err(|e| {
                WireError::new(ErrorCode::Io, format!("cannot create the job's :tmp: {e}"))
            })?;
            Some(t)
        }
        _ => None,
    };
    let hidden_file = match (&job_dir, deny_read_files.is_empty()) {
        (Some(dir), false) => {
            use std::os::unix::fs::OpenOptionsExt;
            let f = dir.join("hidden");
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o000)
                .open(&f)
                .map_err(|e| {
                    WireError::new(
                        ErrorCode::Io,
                        format!("cannot create the carve-out file: {e}"),
                    )
                })?;
            Some(bytes(&f))
        }
        _ => None,
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
        deny_read_files,
        hidden_file,
        read_only_extra,
        net,
    };
    Ok(Decision::Enforce {
        policy: wire.encode(),
        tmp: job_dir,
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
