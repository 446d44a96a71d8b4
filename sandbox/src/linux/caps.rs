//! Capabilities (step 5b of [`super`]): what the job's init gives up of
//! its privileges before the job runs. In its own user namespace the init
//! holds every capability over that namespace's objects (it needed them
//! for the mounts of the fresh root); it drops all of them for good
//! (securebits locked, so uid 0 regains nothing at exec; bounding,
//! ambient, effective, permitted and inheritable sets emptied:
//! [`executor_sys::drop_all_capabilities`]) and sets `no_new_privs` (no
//! set-id or file-capability gain at exec; what Landlock and seccomp
//! require of an unprivileged process).
//!
//! Depends on [`executor_sys`] and `nix`.

use super::{at, Step, StepResult};
use executor_sys as sys;

/// Drop every capability of the calling process, for good.
pub(super) fn drop_all() -> StepResult<()> {
    sys::drop_all_capabilities().map_err(at(Step::Capabilities))
}

/// `no_new_privs` on the calling process (reported as the Landlock
/// enforcement step, which it precedes and which needs it).
pub(super) fn no_new_privs() -> StepResult<()> {
    nix::sys::prctl::set_no_new_privs().map_err(at(Step::LandlockRestrict))
}
