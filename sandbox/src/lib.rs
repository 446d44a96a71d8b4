//! # executor-sandbox
//!
//! Enforces an orchestrator's `SandboxIntent` with the host's own mechanism.
//! This first slice is the **probe**: what this kernel can enforce (Landlock
//! ABI, seccomp filter mode, unprivileged user namespaces), reported in
//! `initialize.sandbox`. Enforcement itself lands with the Sandbox issue;
//! until then [`Capabilities::to_wire`] says `enforceable: false` with the
//! reason, and the agent refuses every sandboxed request with
//! `sandbox_unavailable` rather than running it unconfined.
//!
//! All `unsafe` of the workspace lives in this crate, in [`sys`], each block
//! with a `// SAFETY:` comment.

pub mod policy;
pub mod seatbelt;
pub mod sys;
pub mod trampoline;

use executor_protocol::types::session::SandboxCapabilities;

/// Landlock ABI from which TCP connect/bind rules exist.
pub const LANDLOCK_ABI_NET: u32 = 4;
/// Landlock ABI from which signal and abstract-socket scoping exist.
pub const LANDLOCK_ABI_SCOPE: u32 = 6;

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
            landlock_abi: sys::landlock_abi().ok(),
            seccomp_filter: sys::seccomp_filter_available(),
            user_namespaces: user_namespaces_allowed(),
        }
    }

    /// The mechanisms present on this host.
    pub fn mechanisms(&self) -> Vec<String> {
        let mut m = Vec::new();
        if self.user_namespaces {
            m.push("mount_namespace".to_string());
        }
        if self.landlock_abi.is_some() {
            m.push("landlock".to_string());
        }
        if self.seccomp_filter {
            m.push("seccomp".to_string());
        }
        m
    }

    /// What `initialize.sandbox` reports. Enforcement is not built yet, so
    /// nothing is claimed enforceable, whatever the kernel offers.
    pub fn to_wire(&self) -> SandboxCapabilities {
        let mut missing = Vec::new();
        if self.landlock_abi.is_none() {
            missing.push("Landlock is not available in this kernel");
        }
        if !self.seccomp_filter {
            missing.push("seccomp filter mode is not available");
        }
        if !self.user_namespaces {
            missing.push("unprivileged user namespaces are disabled");
        }
        missing.push("this agent version does not implement sandbox enforcement yet");
        SandboxCapabilities {
            enforceable: false,
            mechanisms: self.mechanisms(),
            landlock_abi: self.landlock_abi,
            network_rules: self.landlock_abi.is_some_and(|a| a >= LANDLOCK_ABI_NET)
                && self.seccomp_filter,
            reason: Some(missing.join("; ")),
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
        assert!(!wire.enforceable);
        assert!(wire.reason.unwrap().contains("does not implement"));
    }
}
