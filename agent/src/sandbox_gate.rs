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
use executor_sandbox::plan::{JobFiles, Plan, PlanError};
use executor_sandbox::policy::{resolve, Context, Policy, Root};
use executor_sandbox::spec::Confinement;
use executor_sandbox::Capabilities;
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
/// `workspace_roots` are the profile's: what `:workspace_roots` means
/// unless the intent names its own (`workspace_roots`), which must then
/// lie within them (when there are any) where they are used.
pub fn resolve_intent(
    intent: &SandboxIntent,
    cwd: Option<&Path>,
    workspace_roots: &[PathBuf],
    param: &str,
) -> Result<Policy, WireError> {
    let rename = |s: &str| s.replacen("sandbox", param, 1);
    let (roots, request_roots_within) = match &intent.workspace_roots {
        None => (workspace_roots.to_vec(), None),
        Some(asked) => {
            let mut roots = Vec::with_capacity(asked.len());
            for (j, r) in asked.iter().enumerate() {
                if !r.is_absolute() || r.as_bytes().contains(&0) {
                    let e = executor_sandbox::policy::PolicyError::NotAbsoluteWorkspaceRoot {
                        field: format!("sandbox.workspace_roots.{j}"),
                        path: r.display(),
                    };
                    return Err(WireError::invalid_params(
                        &rename(e.field()),
                        rename(&e.to_string()),
                    ));
                }
                roots.push(PathBuf::from(std::ffi::OsStr::from_bytes(r.as_bytes())));
            }
            // The profile's roots, canonical (configured paths; a missing
            // one bounds nothing).
            let within = (!workspace_roots.is_empty()).then(|| {
                workspace_roots
                    .iter()
                    .filter_map(|r| executor_sandbox::policy::existing(r).map(|c| c.path))
                    .collect::<Vec<_>>()
            });
            (roots, Some(within))
        }
    };
    let ctx = Context {
        cwd: cwd.map(Path::to_path_buf),
        workspace_roots: roots,
        home: home(),
        request_roots_within,
    };
    resolve(intent, &ctx).map_err(|e| {
        let field = rename(e.field());
        if e.is_wider_than_profile() {
            WireError::new(ErrorCode::PolicyDenied, rename(&e.to_string())).with("field", field)
        } else {
            WireError::invalid_params(&field, rename(&e.to_string()))
        }
    })
}

/// What to do with a job.
#[derive(Debug)]
pub enum Decision {
    /// No intent: run as is.
    Unconfined,
    /// Enforce the plan (it owns the job's private directory and
    /// placeholders until the job ends), with the egress rules of a
    /// `network: {"allow_hosts": ...}` intent (§8).
    Enforce(Box<Plan>, Option<Box<crate::egress::Rules>>),
    /// Nothing can be enforced here and the intent allows that: what was
    /// not enforced, and whether the job's network is denied anyway (an
    /// `allow_hosts` intent, §8: seccomp alone).
    Degraded(Vec<String>, DenyNetwork),
}

fn unavailable(what: String) -> WireError {
    WireError::new(
        ErrorCode::SandboxUnavailable,
        format!("{what}; nothing was run"),
    )
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
        // Hosts by name within the profile's: each pattern one of the
        // profile's (as written), and no `ask` unless the profile asks.
        (NetworkIntent::AllowHosts(allowed), NetworkIntent::AllowHosts(asked)) => {
            asked
                .allow_hosts
                .iter()
                .all(|h| allowed.allow_hosts.contains(h))
                && (allowed.ask || !asked.ask)
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
    executor_sandbox::policy::drop_nested(&mut req.deny_read, &mut req.deny_write);
    // The links on the way to the profile's carve-outs are pinned as for
    // the request's own (a `.git` link to the real git directory).
    for l in profile.carve_out_links {
        if !req.carve_out_links.iter().any(|r| r.path == l.path) {
            req.carve_out_links.push(l);
        }
    }
    req.required |= profile.required;
    Ok(req)
}

/// The policy a request runs under: its own intent, the profile's default
/// intent, or its own narrowed to the profile's; `None` without either.
///
/// The profile's intent is resolved without the request's cwd: a
/// profile's roots never depend on a request field (the configuration
/// refuses a profile intent that would need one, `:cwd` or
/// `:workspace_roots` without `workspace_roots`; one built otherwise
/// fails here, whatever the request says).
pub fn effective_policy(
    intent: Option<&SandboxIntent>,
    cwd: Option<&Path>,
    param: &str,
    profile: &Profile,
) -> Result<Option<Policy>, WireError> {
    let roots = &profile.workspace_roots;
    let policy = match (intent, profile.sandbox.as_ref()) {
        (None, None) => None,
        (Some(i), None) => Some(resolve_intent(i, cwd, roots, param)?),
        (None, Some(p)) => Some(resolve_intent(p, None, roots, "profile sandbox")?),
        (Some(i), Some(p)) => Some(narrow(
            resolve_intent(i, cwd, roots, param)?,
            resolve_intent(p, None, roots, "profile sandbox")?,
            param,
        )?),
    };
    crate::audit::note_sandboxed(policy.is_some());
    Ok(policy)
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
    // A bad pattern is invalid_params whatever this host can enforce.
    let egress = match &policy.network {
        NetworkIntent::AllowHosts(e) => {
            Some(Box::new(crate::egress::Rules::from_intent(e, param)?))
        }
        _ => None,
    };
    let required = policy.required;
    if !caps.enforceable() {
        let why = caps.to_wire().reason.unwrap_or_default();
        if required {
            return Err(unavailable(format!(
                "this host cannot enforce a sandbox ({why})"
            )));
        }
        if egress.is_some() {
            return degraded_egress(caps, &why);
        }
        return Ok(Decision::Degraded(
            vec![
                format!("filesystem: not enforced ({why})"),
                format!("network: not enforced ({why})"),
            ],
            DenyNetwork(false),
        ));
    }
    match executor_sandbox::plan::plan(&policy, caps, param, cwd) {
        Ok(plan) => Ok(Decision::Enforce(Box::new(plan), egress)),
        Err(PlanError::Unavailable(what)) => Err(unavailable(what)),
        Err(e @ PlanError::Io { .. }) => Err(WireError::new(ErrorCode::Io, e.to_string())),
        Err(e) => Err(WireError::new(ErrorCode::Internal, e.to_string())),
    }
}

/// Whether a degraded job's network is denied by seccomp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DenyNetwork(pub bool);

/// `allow_hosts` with `required: false` where no network namespace can be
/// made (§8): the job runs with its filesystem unconfined but its network
/// denied (the seccomp filters of `network: "deny"`), never with the
/// host's network; where seccomp is missing too, nothing runs.
fn degraded_egress(caps: &Capabilities, why: &str) -> Result<Decision, WireError> {
    if !caps.seccomp_filter {
        return Err(unavailable(format!(
            "this host cannot enforce a sandbox ({why}), and without seccomp the \
             network of an allow_hosts intent cannot be denied either"
        )));
    }
    Ok(Decision::Degraded(
        vec![
            format!("filesystem: not enforced ({why})"),
            format!(
                "network: allow_hosts not enforced ({why}); network denied instead \
                 (seccomp: no IP sockets, no connect)"
            ),
        ],
        DenyNetwork(true),
    ))
}

impl Decision {
    /// The egress rules of the job, taken out (before [`Decision::into_parts`]).
    pub fn take_egress(&mut self) -> Option<crate::egress::Rules> {
        match self {
            Decision::Enforce(_, e) => e.take().map(|e| *e),
            _ => None,
        }
    }

    /// (the job's confinement for the trampoline: its plan, or none and
    /// whether its network is denied; what the job owns on the host; what
    /// was not enforced) for a spawn.
    pub fn into_parts(self) -> (Confinement, JobFiles, Option<Vec<String>>) {
        match self {
            Decision::Unconfined => (
                Confinement::Unconfined {
                    deny_network: false,
                },
                JobFiles::default(),
                None,
            ),
            Decision::Enforce(p, _) => {
                let p = *p;
                (
                    Confinement::Sandboxed(Box::new(p.wire)),
                    p.files,
                    (!p.degraded.is_empty()).then_some(p.degraded),
                )
            }
            Decision::Degraded(d, DenyNetwork(deny_network)) => (
                Confinement::Unconfined { deny_network },
                JobFiles::default(),
                Some(d),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use executor_protocol::types::sandbox::FilesystemIntent;
    use executor_protocol::WirePath;

    fn profile(write: &str, roots: &[&str]) -> Profile {
        Profile {
            workspace_roots: roots.iter().map(PathBuf::from).collect(),
            sandbox: Some(SandboxIntent {
                filesystem: FilesystemIntent {
                    write: vec![WirePath::from(write)],
                    ..Default::default()
                },
                ..Default::default()
            }),
            ..Profile::default()
        }
    }

    /// Issue 29.4: a profile intent naming `:cwd` (or `:workspace_roots`
    /// without roots) took the request's cwd as the profile's root. Built
    /// past the configuration's check, it is refused for every cwd.
    #[test]
    fn a_profile_intent_never_takes_the_request_cwd() {
        for p in [profile(":cwd", &[]), profile(":workspace_roots", &[])] {
            for cwd in ["/srv/a", "/tmp"] {
                let e = effective_policy(None, Some(Path::new(cwd)), "sandbox", &p).unwrap_err();
                assert_eq!(e.code, ErrorCode::InvalidParams, "{e}");
                assert!(e.message.contains("profile sandbox"), "{e}");
            }
        }
        // Control: configured roots, the same for two cwds.
        let p = profile(":workspace_roots", &["/usr"]);
        let a = effective_policy(None, Some(Path::new("/srv/a")), "sandbox", &p).unwrap();
        let b = effective_policy(None, Some(Path::new("/tmp")), "sandbox", &p).unwrap();
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a.write, b.write);
        assert!(matches!(&a.write[..], [Root::Path(r)] if r.path == Path::new("/usr")));
    }
}
