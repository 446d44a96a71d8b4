//! # executor-sandbox
//!
//! Enforces an orchestrator's `SandboxIntent` with the host's own mechanism.
//! Below the agent: its `sandbox_gate` turns a request's intent into a
//! [`plan`], its spawn hands the plan to [`trampoline`] in a job spec, and
//! the trampoline applies it before `execve`. Depends on the protocol
//! crate's types and on `executor-sys` for every raw system call.
//! - [`Capabilities::probe`]: what this kernel can enforce (Landlock ABI,
//!   seccomp filter mode, unprivileged user namespaces), reported in
//!   `initialize.sandbox`;
//! - [`policy`]: an intent resolved for one request (symbols, canonical
//!   roots; a missing root is an error naming it);
//! - [`plan`]: a policy turned into what the trampoline applies (roots and
//!   carve-outs by identity, pins, the job's private directory);
//! - [`holds`]: what a carve-out holds by identity (its files with hard
//!   links outside it), for the plan and the agent's fs confinement;
//! - [`tree`]: removing a job's private directory whatever it left there;
//! - [`spec`]: the job spec the agent hands the trampoline in a sealed memfd;
//! - [`linux`]: the enforcement the job's init applies before it forks the
//!   program (user, mount, PID, IPC and network namespaces, a fresh root,
//!   Landlock, capabilities, seccomp);
//! - [`seatbelt`]: the macOS profile generator (pure, golden-tested);
//! - [`trampoline`]: `executor sandbox-exec`, the one path of every job;
//! - [`spawner`]: `executor sandbox-exec --spawner`, the small process that
//!   forks every job's supervisor (which runs the trampoline's code).
//!
//! Test hook, compiled only with the cargo feature `test-hooks` (which the
//! test suite enables and release builds never do):
//! `EXECUTOR_TEST_LANDLOCK_ABI=N` in the agent's environment makes the probe
//! report Landlock ABI `N` (0: absent), to prove that what cannot be
//! enforced is refused before anything runs. Without the feature the
//! variable is ignored.
//!
//! All `unsafe` of the workspace lives in `executor-sys` and, in this
//! crate, in the few descriptor hand-overs and forks of [`trampoline`],
//! [`spawner`] and [`nspool`], each block with a `// SAFETY:` comment.

#[cfg(target_os = "linux")]
pub mod cgroup;
#[cfg(target_os = "linux")]
pub mod holds;
#[cfg(target_os = "linux")]
pub mod linux;
#[cfg(target_os = "linux")]
pub mod nspool;
pub mod placeholder;
pub mod plan;
pub mod policy;
pub mod seatbelt;
pub mod spawner;
pub mod spec;
pub mod trampoline;
#[cfg(target_os = "linux")]
pub mod tree;

use executor_protocol::types::session::SandboxCapabilities;
use executor_sys as sys;

/// Landlock ABI from which TCP connect/bind rules exist.
pub const LANDLOCK_ABI_NET: u32 = 4;
/// Landlock ABI from which signal and abstract-socket scoping exist (a
/// third layer: the PID and network namespaces already give both).
pub const LANDLOCK_ABI_SCOPE: u32 = 6;

/// The Landlock ABI the probe reports (the kernel's, or with the
/// `test-hooks` feature, at most `EXECUTOR_TEST_LANDLOCK_ABI`), or why
/// there is none.
fn probed_landlock_abi() -> Result<u32, String> {
    let real = sys::landlock_abi().map_err(|e| landlock_missing(&e));
    #[cfg(feature = "test-hooks")]
    if let Some(n) = std::env::var("EXECUTOR_TEST_LANDLOCK_ABI")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
    {
        return match n {
            0 => Err(
                "Landlock is not available in this kernel (EXECUTOR_TEST_LANDLOCK_ABI=0)".into(),
            ),
            n => real.map(|r| r.min(n)),
        };
    }
    real
}

/// What the failed Landlock probe (`landlock_create_ruleset(VERSION)`)
/// means.
fn landlock_missing(e: &std::io::Error) -> String {
    let why = match e.raw_os_error() {
        Some(libc::ENOSYS) => "no Landlock in this kernel: older than Linux 5.13, or built without CONFIG_SECURITY_LANDLOCK".to_string(),
        Some(libc::EOPNOTSUPP) => "Landlock is built in but disabled at boot (add landlock to the lsm= kernel parameter)".to_string(),
        _ if !cfg!(target_os = "linux") => "Landlock is a Linux mechanism".to_string(),
        _ => format!("the kernel refused the probe: {e}"),
    };
    format!(
        "Landlock is not available: landlock_create_ruleset answered {} ({why})",
        errno_name(e)
    )
}

/// `ENOSYS (Function not implemented)`-style text for an OS error.
fn errno_name(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => format!("{}", nix::errno::Errno::from_raw(n)),
        None => e.to_string(),
    }
}

/// What this host offers, as probed from the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// `None` when Landlock is absent or disabled.
    pub landlock_abi: Option<u32>,
    /// seccomp in filter mode is available.
    pub seccomp_filter: bool,
    /// This agent may create a user namespace (tried, not guessed).
    pub user_namespaces: bool,
    /// For each mechanism above that is missing, what the probe met: the
    /// call, the kernel's answer and the likely cause.
    pub missing: Vec<String>,
}

impl Capabilities {
    /// Probe the running kernel. Cheap: a few syscalls and `/proc` reads.
    pub fn probe() -> Self {
        let mut missing = Vec::new();
        let landlock_abi = probed_landlock_abi().map_err(|m| missing.push(m)).ok();
        let seccomp_filter = sys::seccomp_filter_available();
        if !seccomp_filter {
            missing.push("seccomp filter mode is not available (PR_GET_SECCOMP failed or /proc/sys/kernel/seccomp/actions_avail is absent: a kernel without CONFIG_SECCOMP_FILTER)".into());
        }
        let user_namespaces = user_namespaces().map_err(|m| missing.push(m)).is_ok();
        Capabilities {
            landlock_abi,
            seccomp_filter,
            user_namespaces,
            missing,
        }
    }

    /// The mechanisms a sandboxed job gets on this host (the network
    /// namespace with `network: "deny"`); empty when nothing is enforceable.
    pub fn mechanisms(&self) -> Vec<String> {
        let mut m = Vec::new();
        if !self.enforceable() {
            return m;
        }
        #[cfg(target_os = "linux")]
        m.extend(linux::NAMESPACES.iter().map(|s| s.to_string()));
        m.push("landlock".to_string());
        m.push("seccomp".to_string());
        if cfg!(target_arch = "x86_64") {
            m.push("seccomp_x32_guard".to_string());
        }
        m
    }

    /// Whether every filesystem and network-deny part of an intent can be
    /// enforced here (ports need [`LANDLOCK_ABI_NET`] on top).
    pub fn enforceable(&self) -> bool {
        cfg!(target_os = "linux")
            && self.landlock_abi.is_some()
            && self.seccomp_filter
            && self.user_namespaces
    }

    /// What `initialize.sandbox` reports.
    pub fn to_wire(&self) -> SandboxCapabilities {
        let mut missing = Vec::new();
        if !cfg!(target_os = "linux") {
            missing.push("this agent enforces sandboxes on Linux only");
        }
        missing.extend(self.missing.iter().map(String::as_str));
        let enforceable = self.enforceable();
        let network_rules = enforceable && self.landlock_abi.is_some_and(|a| a >= LANDLOCK_ABI_NET);
        if enforceable && !network_rules {
            missing.push("Landlock ABI below 4: TCP port allow-lists cannot be enforced");
        }
        SandboxCapabilities {
            enforceable,
            mechanisms: self.mechanisms(),
            landlock_abi: self.landlock_abi,
            network_rules,
            reason: (!missing.is_empty()).then(|| missing.join("; ")),
        }
    }
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// Whether this agent can create the job's user namespace: tried with
/// [`sys::try_user_namespace`]; on failure, the kernel's answer and the
/// knobs that explain it.
fn user_namespaces() -> Result<(), String> {
    #[cfg(target_os = "linux")]
    {
        let Err(e) = sys::try_user_namespace() else {
            return Ok(());
        };
        let mut causes = Vec::new();
        if read_trimmed("/proc/sys/user/max_user_namespaces").is_some_and(|s| s == "0") {
            causes.push("user.max_user_namespaces is 0 (RHEL 7's default)");
        }
        // Debian/Ubuntu knob; absent on mainline kernels.
        if read_trimmed("/proc/sys/kernel/unprivileged_userns_clone").is_some_and(|s| s == "0") {
            causes.push("kernel.unprivileged_userns_clone is 0");
        }
        // Ubuntu 24.04's AppArmor restriction.
        if read_trimmed("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
            .is_some_and(|s| s == "1")
        {
            causes.push("kernel.apparmor_restrict_unprivileged_userns is 1");
        }
        let seccomp_mode = read_trimmed("/proc/self/status").and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Seccomp:").map(|v| v.trim().to_string()))
        });
        if causes.is_empty() && seccomp_mode.as_deref() == Some("2") {
            causes.push("a seccomp filter this agent runs under refuses it: a container runtime's or a parent's");
        }
        if causes.is_empty() {
            causes.push("a security module or a container runtime refuses it");
        }
        Err(format!(
            "user namespaces are not available to this agent: clone(CLONE_NEWUSER) answered {} ({}); a sandboxed job needs one for its own root, PID, IPC and network namespaces",
            errno_name(&e),
            causes.join("; ")
        ))
    }
    #[cfg(not(target_os = "linux"))]
    {
        Err("user namespaces are a Linux mechanism".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_matches_proc() {
        let caps = Capabilities::probe();
        // The kernel's own view of seccomp availability.
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        assert_eq!(caps.seccomp_filter, status.contains("Seccomp:"));
        let wire = caps.to_wire();
        assert_eq!(wire.enforceable, caps.enforceable());
        assert_eq!(
            wire.reason.is_none(),
            wire.enforceable && wire.network_rules
        );
    }
}
