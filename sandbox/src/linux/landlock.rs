//! Landlock, the second layer over the fresh root (steps 5a and the
//! enforcement in 5b of [`super`]): a ruleset built from the descriptors
//! the root was built from (nothing is looked up by path again but the
//! job root's own `/dev` and `/proc`), handling every filesystem access
//! of the plan's ABI, TCP ports for a network that is not `allow`
//! ([`crate::LANDLOCK_ABI_NET`]), and signal and abstract-socket scoping
//! ([`crate::LANDLOCK_ABI_SCOPE`]). Fails closed: a ruleset the kernel
//! does not fully enforce stops the job.
//!
//! Depends on the `landlock` crate and [`crate::plan`].

use super::{at, identity, open_here, Prepared, Step, StepResult};
use crate::plan::{WireNet, WirePlan};
use landlock::{
    Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, Ruleset,
    RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use std::io;
use std::os::fd::{AsFd, OwnedFd};

/// Step 5a: the Landlock ruleset (created, not yet enforced), from the
/// descriptors opened before the pivot and the job root's own devices.
pub(super) fn ruleset(p: &WirePlan, prep: Prepared) -> StepResult<landlock::RulesetCreated> {
    let abi = ABI::from(p.landlock_abi as i32);
    let err = |e: landlock::RulesetError| (Step::Landlock, io::Error::other(e.to_string()));
    let mut rs = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(abi))
        .map_err(err)?;
    if p.net != WireNet::Allow && p.landlock_abi >= crate::LANDLOCK_ABI_NET {
        rs = rs.handle_access(AccessNet::from_all(abi)).map_err(err)?;
    }
    if p.landlock_abi >= crate::LANDLOCK_ABI_SCOPE {
        rs = rs.scope(Scope::from_all(abi)).map_err(err)?;
    }
    let mut created = rs.create().map_err(err)?;
    let add =
        |created: landlock::RulesetCreated, fd: OwnedFd, access: landlock::BitFlags<AccessFs>| {
            let is_dir = identity(fd.as_fd()).map(|(_, _, d)| d).unwrap_or(false);
            let access = if is_dir {
                access
            } else {
                access & AccessFs::from_file(abi)
            };
            created
                .add_rule(PathBeneath::new(fd, access))
                .map_err(|e| (Step::Landlock, io::Error::other(e.to_string())))
        };
    let open = |path: &str| open_here(path).map_err(at(Step::Landlock));
    let read = AccessFs::from_read(abi);
    match &p.read {
        None => created = add(created, open("/")?, read)?,
        Some(_) => {
            for fd in prep.grants.read {
                created = add(created, fd, read)?;
            }
            created = add(created, open("/proc")?, read)?;
        }
    }
    for fd in prep.grants.write {
        created = add(created, fd, AccessFs::from_all(abi))?;
    }
    let rw_dev = AccessFs::ReadFile | AccessFs::WriteFile;
    created = add(created, open("/dev/null")?, rw_dev)?;
    for dev in ["/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"] {
        created = add(created, open(dev)?, AccessFs::ReadFile.into())?;
    }
    created = add(created, open("/dev/shm")?, AccessFs::from_all(abi))?;
    // A root `/dev`: the job's own. Written, the devices beneath become
    // writable too (null, zero, full, random, urandom: any user's on any
    // host; tty: writable already with a terminal, ENXIO without).
    match prep.dev_root {
        Some(true) => created = add(created, open("/dev")?, AccessFs::from_all(abi))?,
        Some(false) => created = add(created, open("/dev")?, AccessFs::ReadDir.into())?,
        None => {}
    }
    if prep.tty {
        let tty_access = if p.landlock_abi >= 5 {
            rw_dev | AccessFs::IoctlDev
        } else {
            rw_dev
        };
        created = add(created, open("/dev/tty")?, tty_access)?;
        if let Ok(t) = std::fs::read_link("/proc/self/fd/0") {
            if let Some(t) = t.to_str().filter(|t| t.starts_with("/dev/pts/")) {
                created = add(created, open(t)?, tty_access)?;
            }
        }
    }
    let ports = match &p.net {
        WireNet::Tcp(ports) => ports.clone(),
        WireNet::Egress { port } => vec![*port],
        WireNet::Deny | WireNet::Allow => Vec::new(),
    };
    if p.landlock_abi >= crate::LANDLOCK_ABI_NET {
        for port in ports {
            created = created
                .add_rule(NetPort::new(port, AccessNet::ConnectTcp))
                .map_err(err)?;
        }
    }
    Ok(created)
}

/// Enforce `ruleset` on the calling process (after `no_new_privs`): fails
/// unless the kernel enforces all of it.
pub(super) fn enforce(ruleset: landlock::RulesetCreated) -> StepResult<()> {
    let status = ruleset
        .restrict_self()
        .map_err(|e| (Step::LandlockRestrict, io::Error::other(e.to_string())))?;
    if status.ruleset != RulesetStatus::FullyEnforced || !status.no_new_privs {
        return Err((
            Step::LandlockRestrict,
            io::Error::other(format!("Landlock not fully enforced: {:?}", status.ruleset)),
        ));
    }
    Ok(())
}
