//! The agent's decision on a request's sandbox intent.
//!
//! Every intent is resolved first (symbols, canonical roots), so a root that
//! does not exist is `invalid_params` naming it, and nothing runs. Then,
//! because this agent version does not enforce intents yet, `required`
//! intents are refused with `sandbox_unavailable` (nothing runs), and
//! `required: false` ones run with everything listed in `sandbox_degraded`.
//! Never silently weaker.

use executor_protocol::types::sandbox::SandboxIntent;
use executor_protocol::{ErrorCode, WireError};
use executor_sandbox::policy::{resolve, Context, Policy};
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

/// Decide: `Ok(None)` without an intent, `Ok(Some(degraded))` to run
/// unconfined with the list of what was not enforced (`required: false`),
/// or `sandbox_unavailable`.
pub fn gate(
    intent: Option<&SandboxIntent>,
    cwd: Option<&Path>,
    param: &str,
) -> Result<Option<Vec<String>>, WireError> {
    let Some(intent) = intent else {
        return Ok(None);
    };
    resolve_intent(intent, cwd, param)?;
    if intent.required {
        return Err(WireError::new(
            ErrorCode::SandboxUnavailable,
            "this agent version cannot enforce a sandbox intent yet (filesystem and network confinement \
             are not implemented); nothing was run",
        ));
    }
    Ok(Some(vec![
        "filesystem: not enforced by this agent version".into(),
        "network: not enforced by this agent version".into(),
    ]))
}
