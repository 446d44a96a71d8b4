//! # executor-sandbox
//!
//! Enforces an orchestrator's `SandboxIntent` with the host's own mechanism.
//! Below the agent: its `sandbox_gate` turns a request's intent into a
//! [`plan`], its spawn hands the plan to [`trampoline`] in a job spec, and
//! the trampoline applies it before `execve`; this crate uses only the
//! protocol crate's types.
//! - [`Capabilities::probe`]: what this kernel can enforce (Landlock ABI,
//!   seccomp filter mode, unprivileged user namespaces), reported in
//!   `initialize.sandbox`;
//! - [`policy`]: an intent resolved for one request (symbols, canonical
//!   roots; a missing root is an error naming it);
//! - [`plan`]: a policy turned into what the trampoline applies (roots and
//!   carve-outs by identity, pins, the job's private directory);
//! - [`spec`]: the job spec the agent hands the trampoline in a sealed memfd;
//! - [`linux`]: the enforcement the job's init applies before it forks the
//!   program (user, mount, PID, IPC and network namespaces, a fresh root,
//!   Landlock, capabilities, seccomp);
//! - [`seatbelt`]: the macOS profile generator (pure, golden-tested);
//! - [`trampoline`]: `executor sandbox-exec`, the one path of every job.
//!
//! Test hook, compiled only with the cargo feature `test-hooks` (which the
//! test suite enables and release builds never do):
//! `EXECUTOR_TEST_LANDLOCK_ABI=N` in the agent's environment makes the probe
//! report Landlock ABI `N` (0: absent), to prove that what cannot be
//! enforced is refused before anything runs. Without the feature the
//! variable is ignored.
//!
//! All `unsafe` of the workspace lives in this crate (in [`sys`], and the
//! few descriptor hand-overs of [`trampoline`]), each block with a
//! `// SAFETY:` comment.

#[cfg(target_os = "linux")]
pub mod linux;
pub mod placeholder;
pub mod plan;
pub mod policy;
pub mod seatbelt;
pub mod spec;
pub mod sys;
pub mod trampoline;

use executor_protocol::types::session::SandboxCapabilities;

/// Landlock ABI from which TCP connect/bind rules exist.
pub const LANDLOCK_ABI_NET: u32 = 4;
/// Landlock ABI from which signal and abstract-socket scoping exist (a
/// third layer: the PID and network namespaces already give both).
pub const LANDLOCK_ABI_SCOPE: u32 = 6;

/// The Landlock ABI the probe reports: the kernel's, or with the
/// `test-hooks` feature, at most `EXECUTOR_TEST_LANDLOCK_ABI`.
fn probed_landlock_abi() -> Option<u32> {
    let real = sys::landlock_abi().ok();
    #[cfg(feature = "test-hooks")]
    if let Some(n) = std::env::var("EXECUTOR_TEST_LANDLOCK_ABI")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
    {
        return if n == 0 { None } else { real.map(|r| r.min(n)) };
    }
    real
}

/// What this host offers, as probed from the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// `None` when Landlock is absent or disabled.
    pub landlock_abi: Option<u32>,
    /// seccomp in filter mode is available.
    pub seccomp_filter: bool,
    /// An unprivileged process may create a user namespace.
    pub user_namespaces: bool,
}

impl Capabilities {
    /// Probe the running kernel. Cheap: a few syscalls and `/proc` reads.
    pub fn probe() -> Self {
        Capabilities {
            landlock_abi: probed_landlock_abi(),
            seccomp_filter: sys::seccomp_filter_available(),
            user_namespaces: user_namespaces_allowed(),
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
        if self.landlock_abi.is_none() {
            missing.push("Landlock is not available in this kernel");
        }
        if !self.seccomp_filter {
            missing.push("seccomp filter mode is not available");
        }
        if !self.user_namespaces {
            missing.push("unprivileged user namespaces are disabled (needed for the job's own root, PID, IPC and network namespaces)");
        }
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

fn user_namespaces_allowed() -> bool {
    if !cfg!(target_os = "linux") {
        return false;
    }
    let max = read_trimmed("/proc/sys/user/max_user_namespaces")
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0);
    // Debian/Ubuntu knob; absent on mainline kernels (= allowed).
    let clone_ok =
        read_trimmed("/proc/sys/kernel/unprivileged_userns_clone").is_none_or(|s| s != "0");
    // Ubuntu 24.04's AppArmor restriction.
    let apparmor_ok = read_trimmed("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
        .is_none_or(|s| s != "1");
    max > 0 && clone_ok && apparmor_ok
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
