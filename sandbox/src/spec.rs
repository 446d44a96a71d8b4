//! The job spec: what the trampoline runs and under which plan.
//!
//! The agent writes it into a sealed memfd and passes only the descriptor's
//! number: nothing of the request (its argv, env, paths, intent) is on the
//! trampoline's command line (readable by any process in `/proc/PID/cmdline`)
//! or in its environment (where `LD_PRELOAD` and friends would run code in
//! the unconfined trampoline). The job's `env` is applied at the final
//! `execve` alone.

use crate::plan::WirePlan;
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use std::io::{self, Read, Seek, Write};
use std::os::fd::OwnedFd;

/// Largest spec the trampoline reads (argv and env are bounded far below
/// this by the agent's frame limit).
pub const MAX_SPEC_BYTES: u64 = 64 << 20;

/// What the trampoline runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    /// The program to execute (already resolved by the agent).
    pub exec: ByteBuf,
    /// The argv the program sees (`argv[0]` may be a custom `arg0`).
    pub argv: Vec<ByteBuf>,
    /// `KEY=VALUE` entries: the job's whole environment.
    pub env: Vec<ByteBuf>,
    /// The job's working directory (as the job sees it).
    pub cwd: ByteBuf,
    /// Make fd 0 (a PTY slave) the job's controlling terminal.
    pub tty: bool,
    /// How the job is confined: a sandbox plan, or none (with its
    /// network denied or not).
    pub confinement: Confinement,
    /// Where the job has no cgroup for them: per-process rlimits (the
    /// fallback of `limits`, docs/PROTOCOL.md §4).
    #[serde(default)]
    pub rlimits: Rlimits,
}

/// How a job is confined, decided once (the agent's sandbox gate) and
/// read once (the trampoline). The spec is internal to one binary (the
/// agent and the trampoline are the same executable), so its encoding
/// needs no compatibility across versions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Confinement {
    /// The plan the job's init applies (namespaces, the fresh root,
    /// Landlock, seccomp).
    Sandboxed(Box<WirePlan>),
    /// No plan. `deny_network`: deny the job's network anyway, with the
    /// seccomp filters of `network: "deny"` (and `no_new_privs`): what a
    /// degraded `allow_hosts` intent gets where no network namespace can
    /// be made (docs/PROTOCOL.md §8), never unconfined network.
    Unconfined { deny_network: bool },
}

impl Confinement {
    /// The sandbox plan, if there is one.
    pub fn plan(&self) -> Option<&WirePlan> {
        match self {
            Confinement::Sandboxed(p) => Some(&**p),
            Confinement::Unconfined { .. } => None,
        }
    }

    /// The sandbox plan, to complete (the agent sets its `tmp_bytes`).
    pub fn plan_mut(&mut self) -> Option<&mut WirePlan> {
        match self {
            Confinement::Sandboxed(p) => Some(&mut **p),
            Confinement::Unconfined { .. } => None,
        }
    }
}

/// The rlimits fallback of a job's limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rlimits {
    /// `RLIMIT_AS` of every process of the job (set in the program's own
    /// process just before its exec, inherited by what it forks).
    pub address_space: Option<u64>,
    /// `RLIMIT_NPROC` inside a sandboxed job's own user namespace (set by
    /// its init, so that it counts the job's processes alone).
    pub processes: Option<u64>,
    /// The soft `RLIMIT_NOFILE` the program gets (set just before its
    /// exec, the hard limit kept): the agent's own soft limit as it was
    /// started, where the agent raised its own to the hard one.
    pub open_files: Option<u64>,
}

impl JobSpec {
    /// A sealed memfd holding this spec (close-on-exec: the caller clears
    /// the flag on the copy it hands to the trampoline).
    pub fn to_memfd(&self) -> io::Result<OwnedFd> {
        use nix::fcntl::{fcntl, FcntlArg, SealFlag};
        let bytes = rmp_serde::to_vec(self).map_err(io::Error::other)?;
        let fd = executor_sys::memfd_sealable(c"executor-job-spec")?;
        let mut f = std::fs::File::from(fd);
        f.write_all(&bytes)?;
        f.rewind()?;
        let fd = OwnedFd::from(f);
        fcntl(
            &fd,
            FcntlArg::F_ADD_SEALS(
                SealFlag::F_SEAL_WRITE
                    | SealFlag::F_SEAL_GROW
                    | SealFlag::F_SEAL_SHRINK
                    | SealFlag::F_SEAL_SEAL,
            ),
        )?;
        Ok(fd)
    }

    /// Read a spec from `fd` (bounded by [`MAX_SPEC_BYTES`]).
    pub fn read_from(fd: OwnedFd) -> io::Result<JobSpec> {
        let mut f = std::fs::File::from(fd);
        let len = f.metadata()?.len();
        if len > MAX_SPEC_BYTES {
            return Err(io::Error::other(format!(
                "the job spec is {len} bytes, more than {MAX_SPEC_BYTES}"
            )));
        }
        let mut bytes = Vec::with_capacity(len as usize);
        Read::by_ref(&mut f)
            .take(MAX_SPEC_BYTES)
            .read_to_end(&mut bytes)?;
        rmp_serde::from_slice(&bytes).map_err(|e| io::Error::other(format!("bad job spec: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_a_sealed_memfd() {
        let spec = JobSpec {
            exec: ByteBuf::from(b"/bin/echo".to_vec()),
            argv: vec![ByteBuf::from(b"echo".to_vec())],
            env: vec![ByteBuf::from(b"LD_PRELOAD=/x.so".to_vec())],
            cwd: ByteBuf::from(b"/".to_vec()),
            tty: false,
            confinement: Confinement::Unconfined { deny_network: true },
            rlimits: Rlimits {
                address_space: Some(64 << 20),
                processes: None,
                open_files: Some(1024),
            },
        };
        let fd = spec.to_memfd().unwrap();
        let copy = fd.try_clone().unwrap();
        // Sealed: nobody can change it after the agent wrote it.
        let mut w = std::fs::File::from(copy);
        assert!(w.write_all(b"x").is_err());
        assert_eq!(JobSpec::read_from(fd).unwrap(), spec);
    }
}
