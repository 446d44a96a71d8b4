//! The raw system calls of the sandbox, each turned into `io::Result`.

use std::io;

/// `LANDLOCK_CREATE_RULESET_VERSION`: ask for the ABI instead of creating.
const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1 << 0;

/// The Landlock ABI version of the running kernel.
pub fn landlock_abi() -> io::Result<u32> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: with a NULL attr, size 0 and the VERSION flag the kernel
        // only returns the ABI number; no memory is read or written.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                std::ptr::null::<libc::c_void>(),
                0usize,
                LANDLOCK_CREATE_RULESET_VERSION,
            )
        };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        u32::try_from(ret).map_err(|_| io::Error::other("landlock ABI out of range"))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = LANDLOCK_CREATE_RULESET_VERSION;
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
}

/// Whether seccomp filter mode exists (`PR_GET_SECCOMP` answers, and the
/// kernel lists filter actions).
pub fn seccomp_filter_available() -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: PR_GET_SECCOMP takes no pointer arguments and only
        // returns the calling thread's seccomp mode.
        let ret = unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) };
        ret >= 0 && std::path::Path::new("/proc/sys/kernel/seccomp/actions_avail").exists()
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}
