//! # executor-sys
//!
//! The raw system calls of the executor, each turned into `io::Result`
//! (`-1`/errno becomes an `io::Error`): the Landlock and seccomp probes,
//! forks and the `vfork`-style start of a job's program, namespaces,
//! the new mount API and `pivot_root`, capabilities, signals, descriptor
//! passing (`SCM_RIGHTS`, `SCM_CREDENTIALS`), `splice`, `statx` and
//! `getifaddrs`.
//!
//! Its users: `executor-sandbox` (the enforcement a job's init applies),
//! the agent (descriptor passing, `splice` relays, the PTY window size,
//! the host's addresses, its stdio as non-blocking pipes) and the CLI
//! (`mcp stdio`'s stdio, the same way). It holds no policy: what to
//! mount, deny or drop is decided by the sandbox crate.
//!
//! Depends only on `libc`, `nix`, `seccompiler` (for the type of a
//! compiled filter, which [`install_bpf`] takes) and `bytes` (the buffer
//! [`recv_fds_into`] appends to). All `unsafe` of the
//! workspace lives here, apart from the few descriptor hand-overs and
//! forks of `executor-sandbox`'s trampoline, spawner and namespace pool;
//! each block carries a `// SAFETY:` comment naming the invariant it
//! relies on.

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

/// Try what a sandboxed job's start does first: create a child in a new
/// user namespace (`clone(CLONE_NEWUSER)`). The child exits at once; the
/// error is the kernel's answer (EPERM: refused by a sysctl, an LSM or a
/// seccomp filter; EINVAL/ENOSYS: not built in; ENOSPC: the namespace limit
/// is 0 or reached).
#[cfg(target_os = "linux")]
pub fn try_user_namespace() -> io::Result<()> {
    // SAFETY: a fork-like clone with no new stack; the child only calls
    // `_exit`, which is async-signal-safe, so no lock another thread held
    // at the clone matters to it.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    match ret {
        r if r < 0 => Err(io::Error::last_os_error()),
        // SAFETY: see above: the child ends here without touching shared state.
        0 => unsafe { libc::_exit(0) },
        pid => {
            let pid = nix::unistd::Pid::from_raw(pid as libc::pid_t);
            loop {
                match nix::sys::wait::waitpid(pid, None) {
                    Err(nix::errno::Errno::EINTR) => continue,
                    Ok(_) | Err(_) => return Ok(()),
                }
            }
        }
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

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// Take ownership of an fd number inherited from the agent.
///
/// # Safety
/// The caller must know that `fd` is open and owned by nobody else in this
/// process (an fd number passed on the command line by the agent).
pub unsafe fn own_inherited_fd(fd: RawFd) -> OwnedFd {
    // SAFETY: forwarded from the caller's contract.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Close every fd >= 3 except those in `keep` (inherited leftovers of a
/// multithreaded parent must not reach the job): `close_range(2)` over the
/// gaps between the kept numbers (Linux 5.9), or, where the kernel does
/// not have it, every number `/proc/self/fd` lists.
pub fn close_fds_except(keep: &[RawFd]) -> io::Result<()> {
    let mut kept: Vec<RawFd> = keep.iter().copied().filter(|&fd| fd > 2).collect();
    kept.sort_unstable();
    kept.dedup();
    #[cfg(target_os = "linux")]
    {
        let close_range = |first: RawFd, last: libc::c_uint| {
            // SAFETY: close_range takes two descriptor numbers and flags,
            // no pointers; the descriptors in the range are not kept, and
            // this process is single-threaded (no other owner can race).
            let ret =
                unsafe { libc::syscall(libc::SYS_close_range, first as libc::c_uint, last, 0u32) };
            if ret < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        };
        let mut first = 3;
        let mut ranges = Vec::with_capacity(kept.len() + 1);
        for &fd in &kept {
            if fd > first {
                ranges.push((first, (fd - 1) as libc::c_uint));
            }
            first = fd + 1;
        }
        ranges.push((first, libc::c_uint::MAX));
        match ranges.iter().try_for_each(|&(a, b)| close_range(a, b)) {
            Ok(()) => return Ok(()),
            // An old kernel, or one that refuses it: the portable way.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOSYS | libc::EINVAL | libc::EPERM)
                ) => {}
            Err(e) => return Err(e),
        }
    }
    let mut fds = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd")? {
        if let Some(fd) = entry?
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<RawFd>().ok())
        {
            if fd > 2 && kept.binary_search(&fd).is_err() {
                fds.push(fd);
            }
        }
    }
    for fd in fds {
        // SAFETY: `fd` was listed as open in this single-threaded process
        // and is not one we keep; closing an fd that the read_dir iterator
        // itself used (already closed) just fails with EBADF, ignored.
        unsafe { libc::close(fd) };
    }
    Ok(())
}

/// Make `fd` the controlling terminal of the calling session leader.
pub fn set_controlling_tty(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: TIOCSCTTY takes an integer argument (0: do not steal), no
    // pointer; the fd is borrowed and open for the call's duration.
    let ret = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSCTTY, 0) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Set a terminal's window size (`TIOCSWINSZ`); the foreground process
/// group gets SIGWINCH from the kernel.
pub fn set_winsize(fd: BorrowedFd<'_>, rows: u16, cols: u16) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one `winsize` through the pointer, which
    // points at a live, initialised local for the duration of the call.
    let ret = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// SIGCHLD back to its default disposition. Ignored (a parent's
/// `signal(SIGCHLD, SIG_IGN)` is inherited across exec) the kernel reaps
/// children itself and every wait answers ECHILD: jobs would be reported as
/// exiting 0 and the login-shell snapshot would fail. The agent and the
/// spawner wait for their children, so each sets it before it starts any.
pub fn default_sigchld() {
    // SAFETY: SIG_DFL installs no handler code; SIGCHLD is catchable, so
    // the call cannot fail.
    unsafe { libc::signal(libc::SIGCHLD, libc::SIG_DFL) };
}

/// The kernel's `struct sigaction` as `rt_sigaction(2)` reads and writes
/// it, with room to spare: the handler comes first on the architectures
/// the agent is built for (x86_64, aarch64), and all zeros is `SIG_DFL`
/// with no flags and an empty mask on every one. The raw system call
/// instead of libc's `sigaction`: glibc refuses its internal signals (32
/// and 33), which its `posix_spawn` leaves *ignored* in the processes it
/// starts (so in the agent and the spawner), and an ignored disposition
/// survives `execve`.
#[repr(C)]
#[derive(Clone, Copy)]
struct KernelSigaction([u64; 4]);

/// `rt_sigaction(sig, new, old)` with the kernel's 8-byte signal set.
fn rt_sigaction(
    sig: libc::c_int,
    new: Option<&KernelSigaction>,
    old: Option<&mut KernelSigaction>,
) -> bool {
    // SAFETY: both pointers are null or point at a KernelSigaction, which
    // is larger than the kernel's struct on every supported architecture.
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            sig,
            new.map_or(std::ptr::null(), |n| n as *const KernelSigaction),
            old.map_or(std::ptr::null_mut(), |o| o as *mut KernelSigaction),
            8usize,
        ) == 0
    }
}

/// The signals this process ignores (`SIG_IGN`), one bit each (bit
/// `n - 1` for signal `n`), read once per process: the spawner reads them
/// at its start, and every supervisor it forks inherits the answer. Only
/// an ignored disposition survives `execve` (handlers are reset by it), so
/// these are the ones a job must have reset ([`reset_signals`]). Read
/// before any fork; nothing changes a disposition to `SIG_IGN` after.
pub fn ignored_signals() -> u64 {
    static IGNORED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *IGNORED.get_or_init(|| {
        let mut set = 0u64;
        for sig in 1..=64 {
            let mut old = KernelSigaction([0; 4]);
            if rt_sigaction(sig, None, Some(&mut old)) && old.0[0] == libc::SIG_IGN as u64 {
                set |= 1 << (sig - 1);
            }
        }
        set
    })
}

/// Give the job default dispositions and an empty signal mask, whatever
/// the agent had (Rust programs ignore SIGPIPE; `nohup` ignores SIGHUP;
/// glibc's `posix_spawn` ignores 32 and 33): a job starts as if from a
/// fresh login. `ignored` is [`ignored_signals`], read before the fork:
/// handled signals need nothing, `execve` resets them. System calls only
/// (runs between `vfork` and `execve`).
pub fn reset_signals(ignored: u64) {
    let default = KernelSigaction([0; 4]);
    for sig in 1..=64 {
        if ignored & (1 << (sig - 1)) != 0 {
            rt_sigaction(sig, Some(&default), None);
        }
    }
    // SAFETY: an empty, initialised set is passed by pointer for reading
    // only; the old mask is not requested (null).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
    }
}

/// Run the calling process at the lowest scheduling priority (nice 19),
/// best effort: work done ahead must yield to the work of now.
pub fn lowest_priority() {
    // SAFETY: integer arguments only; `who` 0 is the calling process.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) };
}

/// `fork()` in a process known to be single-threaded.
///
/// # Safety
/// The caller must be single-threaded: then the child may run any code.
pub unsafe fn fork_single_threaded() -> io::Result<nix::unistd::ForkResult> {
    // SAFETY: forwarded from the caller's contract (no other thread can
    // hold a lock or be mid-allocation at the fork).
    unsafe { nix::unistd::fork() }.map_err(io::Error::from)
}

#[cfg(target_os = "linux")]
/// The stack a [`vfork_exec`] child runs on: its own mapping (the parent's
/// stack is live, suspended below the child), with an inaccessible guard
/// page at its low end so an overflow faults instead of writing into the
/// parent's memory.
#[derive(Debug)]
pub struct ChildStack {
    base: *mut libc::c_void,
    len: usize,
}

#[cfg(target_os = "linux")]
impl ChildStack {
    /// Bytes the child may use: the sandbox trampoline's `exec_job` frames,
    /// a few system calls and `execve` need a few KiB.
    const USABLE: usize = 64 << 10;
    const GUARD: usize = 4 << 10;

    pub fn new() -> io::Result<ChildStack> {
        let len = Self::USABLE + Self::GUARD;
        // SAFETY: a fresh anonymous private mapping at an address the
        // kernel chooses; no existing memory is touched.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = ChildStack { base, len };
        // SAFETY: the first page of the mapping just made, owned here.
        if unsafe { libc::mprotect(base, Self::GUARD, libc::PROT_NONE) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }
}

#[cfg(target_os = "linux")]
impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once; no child runs
        // on it any more (`vfork_exec` returns after the child left it).
        unsafe { libc::munmap(self.base, self.len) };
    }
}

#[cfg(target_os = "linux")]
/// Start a child that shares this process's memory until it calls
/// `execve` or exits (`clone(CLONE_VM | CLONE_VFORK)`, what `posix_spawn`
/// does): no page tables are copied and no copy-on-write faults follow,
/// and this process is suspended until the child has left its memory, so
/// when this returns the child has exec'd or exited. The child runs
/// `child` on `stack` and exits (`_exit`) with its return value if it
/// returns (a failed `execve`). Returns the child's pid.
///
/// # Safety
/// The caller is single-threaded. `child` runs in this process's memory
/// while it is suspended: it must only make system calls (no allocation,
/// no locks, no unwinding, no `std::process::exit`), use only memory
/// prepared before the call, and end in `execve` or by returning.
pub unsafe fn vfork_exec(
    stack: &mut ChildStack,
    child: &mut dyn FnMut() -> libc::c_int,
) -> io::Result<nix::unistd::Pid> {
    extern "C" fn entry(arg: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `arg` is the `&mut &mut dyn FnMut` below, alive for the
        // whole of the child's run (the parent is suspended meanwhile).
        let f = unsafe { &mut *(arg as *mut &mut dyn FnMut() -> libc::c_int) };
        f()
    }
    let mut f: &mut dyn FnMut() -> libc::c_int = child;
    // The stack grows down from the end of the mapping (16-byte aligned:
    // the mapping is page-aligned and its length a multiple of pages).
    // SAFETY: `base + len` is one past the mapping's end, the stack's top.
    let top = unsafe { stack.base.cast::<u8>().add(stack.len) }.cast::<libc::c_void>();
    // SAFETY: CLONE_VM | CLONE_VFORK: the child runs `entry` on its own
    // stack while this (single-threaded) process is suspended, so no lock
    // is held and no other thread sees the shared memory change; `f` and
    // everything it borrows outlive the child's use of them.
    let ret = unsafe {
        libc::clone(
            entry,
            top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&mut f as *mut &mut dyn FnMut() -> libc::c_int).cast::<libc::c_void>(),
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(nix::unistd::Pid::from_raw(ret))
}

/// Send one byte on a connected Unix socket with this process's
/// credentials attached (`SCM_CREDENTIALS`: its pid, uid and gid as it sees
/// them; the receiving kernel translates them into the receiver's
/// namespaces, so a job's pid 2 arrives as its host pid). System calls and
/// stack memory only: it runs between `vfork` and `execve`.
#[cfg(target_os = "linux")]
pub fn send_own_credentials(sock: RawFd) -> io::Result<()> {
    let creds = libc::ucred {
        pid: nix::unistd::getpid().as_raw(),
        uid: nix::unistd::getuid().as_raw(),
        gid: nix::unistd::getgid().as_raw(),
    };
    // CMSG_SPACE(sizeof(ucred)) is 32 bytes on 64-bit Linux; 64 to spare,
    // u64-aligned as a cmsghdr needs.
    let mut control = [0u64; 8];
    let byte = [b'p'];
    let mut iov = libc::iovec {
        iov_base: byte.as_ptr() as *mut libc::c_void,
        iov_len: 1,
    };
    // SAFETY: msghdr is plain data, all-zero valid; every pointer set below
    // points at stack memory alive for the sendmsg call, and the control
    // length (CMSG_SPACE of one ucred) fits the buffer.
    let ret = unsafe {
        let space = libc::CMSG_SPACE(std::mem::size_of::<libc::ucred>() as u32) as usize;
        debug_assert!(space <= std::mem::size_of_val(&control));
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_CREDENTIALS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::ucred>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::ucred>(), creds);
        libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL)
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Take the byte [`send_own_credentials`] sent, if it is queued, and the
/// sender's pid as this process sees it (the socket has `SO_PASSCRED`).
/// Never waits: `None` when nothing is queued (a sender killed before it
/// sent must not leave the caller blocked), at EOF, or without
/// credentials.
#[cfg(target_os = "linux")]
pub fn recv_sender_pid(sock: BorrowedFd<'_>) -> Option<nix::unistd::Pid> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, UnixCredentials};
    let mut byte = [0u8; 1];
    let mut iov = [io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!(UnixCredentials);
    loop {
        match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return None,
            Ok(msg) if msg.bytes == 0 => return None,
            Ok(msg) => {
                return msg.cmsgs().ok()?.find_map(|c| match c {
                    ControlMessageOwned::ScmCredentials(c) => {
                        Some(nix::unistd::Pid::from_raw(c.pid()))
                    }
                    _ => None,
                })
            }
        }
    }
}

/// `MOUNT_ATTR_RDONLY`.
pub const MOUNT_ATTR_RDONLY: u64 = 0x0000_0001;

/// The highest capability number the kernel knows
/// (`/proc/sys/kernel/cap_last_cap`; 40 if it cannot be read), read once
/// per process: the spawner reads it at its start and every job's init
/// inherits the answer.
pub fn cap_last_cap() -> libc::c_ulong {
    static LAST: std::sync::OnceLock<libc::c_ulong> = std::sync::OnceLock::new();
    *LAST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(40)
    })
}

/// Drop every capability for good: lock the securebits so root (uid 0,
/// also inside a user namespace) regains nothing at exec, empty the
/// bounding and ambient sets, then clear effective, permitted, inheritable.
pub fn drop_all_capabilities() -> io::Result<()> {
    let check = |ret: libc::c_int| {
        if ret < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    // SECBIT_NOROOT | _LOCKED, SECBIT_NO_SETUID_FIXUP | _LOCKED,
    // SECBIT_KEEP_CAPS_LOCKED, SECBIT_NO_CAP_AMBIENT_RAISE | _LOCKED.
    let securebits: libc::c_ulong = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80;
    // SAFETY: PR_SET_SECUREBITS takes an integer; no pointers.
    check(unsafe { libc::prctl(libc::PR_SET_SECUREBITS, securebits, 0, 0, 0) })?;
    for cap in 0..=cap_last_cap() {
        // SAFETY: PR_CAPBSET_DROP takes an integer capability number.
        check(unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) })?;
    }
    // SAFETY: integer arguments only.
    check(unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    })?;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: version 3 takes one header and two data structs, all live
    // and initialised for the duration of the call.
    check(unsafe {
        libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) as libc::c_int
    })
}

// ---- the mount API, on file descriptors (Linux 5.2+; mount_setattr 5.12+)

/// `OPEN_TREE_CLONE`: a detached copy of the mount at the path.
#[cfg(target_os = "linux")]
pub const OPEN_TREE_CLONE: libc::c_uint = 1;
/// `MOUNT_ATTR_NOSUID`.
pub const MOUNT_ATTR_NOSUID: u64 = 0x0000_0002;
/// `MOUNT_ATTR_NODEV`.
pub const MOUNT_ATTR_NODEV: u64 = 0x0000_0004;
/// `MOUNT_ATTR_NOEXEC`.
pub const MOUNT_ATTR_NOEXEC: u64 = 0x0000_0008;

/// `memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING)` as a raw system
/// call: glibc has the wrapper only from 2.27, and the portable build
/// links against 2.17 (Linux has the call since 3.17).
#[cfg(target_os = "linux")]
pub fn memfd_sealable(name: &std::ffi::CStr) -> io::Result<OwnedFd> {
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: a valid C string the kernel only reads, and integer flags;
    // the kernel returns a new descriptor or -1.
    fd_result(unsafe { libc::syscall(libc::SYS_memfd_create, name.as_ptr(), flags) })
}

#[cfg(target_os = "linux")]
fn fd_result(ret: libc::c_long) -> io::Result<OwnedFd> {
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = RawFd::try_from(ret).map_err(|_| io::Error::other("fd out of range"))?;
    // SAFETY: the kernel just returned this new descriptor to us; nothing
    // else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(target_os = "linux")]
fn unit_result(ret: libc::c_long) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A detached copy of the mount tree at `fd` (the object the fd names,
/// `AT_EMPTY_PATH`), recursive: `open_tree(fd, "", OPEN_TREE_CLONE |
/// AT_RECURSIVE)`. Never looks a path up.
#[cfg(target_os = "linux")]
pub fn clone_tree(fd: BorrowedFd<'_>, recursive: bool) -> io::Result<OwnedFd> {
    let mut flags =
        OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_EMPTY_PATH as libc::c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: the path is a valid empty C string; the fd is borrowed and
    // open for the call; the kernel returns a new fd or -1.
    fd_result(unsafe { libc::syscall(libc::SYS_open_tree, fd.as_raw_fd(), c"".as_ptr(), flags) })
}

/// The id of the mount `fd` is on (`statx` `STATX_MNT_ID`, Linux 5.8;
/// before that the `mnt_id` line of `/proc/self/fdinfo`). Bind mounts of
/// one filesystem share a device number; each has its own mount id.
#[cfg(target_os = "linux")]
pub fn mount_id(fd: BorrowedFd<'_>) -> io::Result<u64> {
    // SAFETY: statx is plain data; all-zero is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: a valid empty C string, a borrowed open fd and a pointer to
    // the live `stx`, which the kernel fills; the raw system call keeps
    // the binary free of glibc's 2.28 wrapper.
    let r = unsafe {
        libc::syscall(
            libc::SYS_statx,
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_MNT_ID,
            &mut stx as *mut libc::statx,
        )
    };
    if r == 0 && stx.stx_mask & libc::STATX_MNT_ID != 0 {
        return Ok(stx.stx_mnt_id);
    }
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))?;
    info.lines()
        .find_map(|l| l.strip_prefix("mnt_id:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| io::Error::other("no mnt_id in fdinfo"))
}

/// Attach the detached mount `from` onto the object `to` names
/// (`move_mount` with both `*_EMPTY_PATH` flags: no path lookup).
#[cfg(target_os = "linux")]
pub fn attach(from: BorrowedFd<'_>, to: BorrowedFd<'_>) -> io::Result<()> {
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x0000_0004;
    const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x0000_0040;
    // SAFETY: both fds are borrowed and open; the paths are valid empty C
    // strings; no memory is written.
    unit_result(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            from.as_raw_fd(),
            c"".as_ptr(),
            to.as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    })
}

/// `mount_setattr` on the mount `fd` names (and below it if `recursive`).
#[cfg(target_os = "linux")]
pub fn set_mount_attr(fd: BorrowedFd<'_>, recursive: bool, set: u64, clear: u64) -> io::Result<()> {
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    let attr = MountAttr {
        attr_set: set,
        attr_clr: clear,
        propagation: 0,
        userns_fd: 0,
    };
    let mut flags = libc::AT_EMPTY_PATH as libc::c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: `attr` is a live, initialised struct of the size passed, the
    // path a valid empty C string, the fd borrowed; the kernel only reads.
    unit_result(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            c"".as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })
}

/// A new, detached mount of `fstype` (`tmpfs`, `proc`) configured with
/// `options` (`mode=0755`), with mount attributes `attrs`.
#[cfg(target_os = "linux")]
pub fn new_mount(
    fstype: &std::ffi::CStr,
    options: &[(&std::ffi::CStr, &std::ffi::CStr)],
    attrs: u64,
) -> io::Result<OwnedFd> {
    const FSOPEN_CLOEXEC: libc::c_uint = 1;
    const FSCONFIG_SET_STRING: libc::c_uint = 1;
    const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
    const FSMOUNT_CLOEXEC: libc::c_uint = 1;
    // SAFETY: a valid C string and flags; returns a new fd or -1.
    let fs =
        fd_result(unsafe { libc::syscall(libc::SYS_fsopen, fstype.as_ptr(), FSOPEN_CLOEXEC) })?;
    for (k, v) in options {
        // SAFETY: the fs context fd is ours and open; key and value are
        // valid C strings the kernel only reads.
        unit_result(unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                fs.as_raw_fd(),
                FSCONFIG_SET_STRING,
                k.as_ptr(),
                v.as_ptr(),
                0,
            )
        })?;
    }
    // SAFETY: as above, with no key or value (null pointers are what the
    // CMD_CREATE command takes).
    unit_result(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    })?;
    // SAFETY: the context fd is open; returns a new mount fd or -1.
    fd_result(unsafe { libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), FSMOUNT_CLOEXEC, attrs) })
}

/// `pivot_root(".", ".")` (the new root is the cwd; the old one ends up
/// on top of it, to be detached by the caller).
#[cfg(target_os = "linux")]
pub fn pivot_root_here() -> io::Result<()> {
    // SAFETY: two valid C strings the kernel only reads.
    unit_result(unsafe { libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) })
}

/// `clone(flags | SIGCHLD)` with no new stack: a `fork` that also creates
/// the namespaces in `flags` for the child.
///
/// # Safety
/// As [`fork_single_threaded`]: the caller must be single-threaded. The
/// child returns `Ok(None)`.
#[cfg(target_os = "linux")]
pub unsafe fn fork_into_namespaces(flags: libc::c_int) -> io::Result<Option<nix::unistd::Pid>> {
    // SAFETY: with a null stack the child continues on a copy of the
    // parent's stack, exactly like fork(2); the caller guarantees no other
    // thread exists, so no lock is held across it.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    match ret {
        r if r < 0 => Err(io::Error::last_os_error()),
        0 => Ok(None),
        pid => Ok(Some(nix::unistd::Pid::from_raw(pid as libc::pid_t))),
    }
}

/// Install a classic BPF seccomp program on the calling thread (after
/// `no_new_privs`).
#[cfg(target_os = "linux")]
pub fn install_bpf(prog: &[seccompiler::sock_filter]) -> io::Result<()> {
    let fprog = libc::sock_fprog {
        len: u16::try_from(prog.len()).map_err(|_| io::Error::other("filter too long"))?,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `seccompiler::sock_filter` is `repr(C)` with the layout of
    // the kernel's `struct sock_filter`; `fprog` points at the live slice
    // for the duration of the call and the kernel copies it.
    unit_result(unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &fprog as *const libc::sock_fprog,
        ) as libc::c_long
    })
}

/// Make the calling process non-dumpable: its `/proc/PID` entries become
/// root's, so a job cannot read its init's memory or fds.
#[cfg(target_os = "linux")]
pub fn set_not_dumpable() -> io::Result<()> {
    // SAFETY: integer arguments only.
    unit_result(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } as libc::c_long)
}

/// Name the calling process as `ps`, `top` and `/proc/PID/comm` show it
/// (at most 15 bytes; longer names are cut by the kernel). The one place
/// the spawner and the supervisors it forks get their names.
pub fn set_process_name(name: &std::ffi::CStr) {
    // Only cosmetic: a kernel that refuses leaves the inherited name.
    let _ = nix::sys::prctl::set_name(name);
}

/// Bring the loopback interface of the calling process's network namespace
/// up (`SIOCSIFFLAGS` with `IFF_UP`; needs `CAP_NET_ADMIN` there, which a
/// job's init holds in its new user namespace until it confines itself).
#[cfg(target_os = "linux")]
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: socket() takes integers only; the result is checked.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor we just opened and own alone.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: `ifreq` is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    req.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads one `ifreq` through the pointer, which
    // points at a live, initialised local for the duration of the call.
    let ret = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Send one message with descriptors over a Unix socket (`SCM_RIGHTS`).
/// `data` must not be empty: a zero-length message carries no control data
/// on a stream socket, and reads as EOF on a `SOCK_SEQPACKET` one.
pub fn send_fds(
    sock: BorrowedFd<'_>,
    data: &[u8],
    fds: &[BorrowedFd<'_>],
    flags: nix::sys::socket::MsgFlags,
) -> io::Result<usize> {
    use nix::sys::socket::{sendmsg, ControlMessage};
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let iov = [io::IoSlice::new(data)];
    Ok(sendmsg::<()>(
        sock.as_raw_fd(),
        &iov,
        &[ControlMessage::ScmRights(&raw)],
        flags,
        None,
    )?)
}

/// One message taken by [`recv_fds`].
#[derive(Debug)]
pub struct Received {
    /// Bytes of data (0 with no descriptors: EOF).
    pub bytes: usize,
    /// The kernel cut the data or the descriptors to fit (`MSG_TRUNC`,
    /// `MSG_CTRUNC`): the message is not what the sender sent.
    pub truncated: bool,
    /// The descriptors it carried (close-on-exec), owned here: dropping
    /// the message closes them.
    pub fds: Vec<OwnedFd>,
}

/// Receive one message sent by [`send_fds`] with room for up to `N`
/// descriptors (close-on-exec). `flags` adds to `MSG_CMSG_CLOEXEC`, e.g.
/// `MSG_DONTWAIT` (then `WouldBlock` when nothing was sent). A message
/// the kernel cut (more descriptors than room, or more than this process
/// may open) says `truncated`, and the descriptors that did arrive are
/// owned here (closed with the message), never left open unowned.
pub fn recv_fds<const N: usize>(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    flags: nix::sys::socket::MsgFlags,
) -> io::Result<Received> {
    // A control buffer of at least CMSG_SPACE(N ints), u64-aligned as a
    // cmsghdr needs: 16 bytes of header and 4 per descriptor, rounded.
    let mut control = vec![0u64; (16 + 4 * N).div_ceil(8) + 1];
    // SAFETY: the iovec points at `buf` (writable, `buf.len()` bytes),
    // which outlives the call.
    unsafe {
        recvmsg_with_fds(
            sock,
            buf.as_mut_ptr(),
            buf.len(),
            N,
            &mut control,
            flags.bits(),
        )
    }
}

/// `recvmsg(2)` into `len` bytes at `base` with room for `max_fds`
/// descriptors in `control` (close-on-exec, `flags` added), retried on
/// `EINTR`. The control messages are walked by hand: nix's `cmsgs()`
/// refuses a message the kernel cut (`MSG_CTRUNC`) before it hands out
/// the descriptors that were installed, which would leave them open and
/// owned by nothing.
///
/// # Safety
///
/// `base` must be valid for writes of `len` bytes (possibly
/// uninitialised: the kernel only writes them) for the call.
unsafe fn recvmsg_with_fds(
    sock: BorrowedFd<'_>,
    base: *mut u8,
    len: usize,
    max_fds: usize,
    control: &mut [u64],
    flags: libc::c_int,
) -> io::Result<Received> {
    let mut iov = libc::iovec {
        iov_base: base.cast(),
        iov_len: len,
    };
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE((max_fds * std::mem::size_of::<libc::c_int>()) as u32) };
    assert!(
        space as usize <= std::mem::size_of_val(control),
        "the control buffer holds CMSG_SPACE of {max_fds} descriptors"
    );
    // SAFETY: msghdr is plain data, all-zero valid; its iovec points at
    // the caller's buffer (valid for `len` bytes, as this function's
    // contract says) and its control buffer at `control`, both alive for
    // the call.
    let (n, msg) = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        loop {
            let n = libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC | flags);
            if n >= 0 {
                break (n as usize, msg);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    };
    let mut fds = Vec::new();
    // SAFETY: the CMSG_* walk stays within `msg_controllen` bytes of
    // `control`, which the kernel filled; an SCM_RIGHTS message's data is
    // `(cmsg_len - CMSG_LEN(0)) / sizeof(int)` descriptors, installed in
    // this process by this call and known to nothing else, so each is
    // owned here once.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<libc::c_int>();
                let count = ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<libc::c_int>();
                for i in 0..count {
                    let fd = std::ptr::read_unaligned(data.add(i));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok(Received {
        bytes: n,
        truncated: msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0,
        fds,
    })
}

/// The most descriptors [`recv_fds_into`] takes with one read (more are
/// closed by the kernel and the read says `truncated`).
pub const RECV_FDS_MAX: usize = 4;

/// Read what a connected Unix stream socket holds into the free capacity
/// of `buf` (appended; at least one byte must be free), with the
/// descriptors sent with it (`SCM_RIGHTS`, close-on-exec, at most
/// [`RECV_FDS_MAX`]). Never waits: `WouldBlock` when nothing is queued;
/// `bytes` 0 at EOF. A descriptor comes with the read that takes the
/// bytes it was sent with, and that read ends with them.
#[cfg(target_os = "linux")]
pub fn recv_fds_into(sock: BorrowedFd<'_>, buf: &mut bytes::BytesMut) -> io::Result<Received> {
    use bytes::BufMut;
    let room = buf.chunk_mut();
    if room.len() == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "recv_fds_into: the buffer has no free capacity",
        ));
    }
    // CMSG_SPACE of RECV_FDS_MAX ints is 32 bytes on 64-bit Linux; 64 to
    // spare, u64-aligned as a cmsghdr needs.
    let mut control = [0u64; 8];
    // SAFETY: the free capacity of `buf` is writable for `room.len()`
    // bytes (uninitialised, which the kernel only writes) during the call.
    let got = unsafe {
        recvmsg_with_fds(
            sock,
            room.as_mut_ptr(),
            room.len(),
            RECV_FDS_MAX,
            &mut control,
            libc::MSG_DONTWAIT,
        )?
    };
    // SAFETY: the kernel wrote `got.bytes` bytes (at most `room.len()`)
    // at the start of the free capacity: they are initialised now.
    unsafe { buf.advance_mut(got.bytes) };
    Ok(got)
}

/// Move up to `len` bytes from `from` to `to` inside the kernel
/// (`splice(2)`, one of them a pipe), without blocking: `WouldBlock` when
/// the source has nothing or the destination has no room.
#[cfg(target_os = "linux")]
pub fn splice_nonblocking(
    from: BorrowedFd<'_>,
    to: BorrowedFd<'_>,
    len: usize,
) -> io::Result<usize> {
    // SAFETY: both descriptors are borrowed (open for the call); the
    // offsets are NULL (pipes and sockets have none), so no memory of
    // ours is read or written.
    let ret = unsafe {
        libc::splice(
            from.as_raw_fd(),
            std::ptr::null_mut(),
            to.as_raw_fd(),
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_NONBLOCK | libc::SPLICE_F_MOVE,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ret as usize)
}

/// Move up to `len` bytes of the file `from`, starting at `offset`, into
/// the pipe `to` (its write end) inside the kernel (`splice(2)`): for a
/// file in the page cache the pipe then holds references to its pages,
/// not copies. Never waits for room in the pipe (`WouldBlock` when it is
/// full); `Ok(0)` at the end of the file; `EINVAL` from a file whose
/// filesystem cannot splice. The file's own offset is not moved.
#[cfg(target_os = "linux")]
pub fn splice_file_to_pipe(
    from: BorrowedFd<'_>,
    offset: u64,
    to: BorrowedFd<'_>,
    len: usize,
) -> io::Result<usize> {
    let mut off =
        libc::loff_t::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: both descriptors are borrowed (open for the call); `off` is
    // a live local the kernel reads and advances, the only memory of ours
    // it touches (the output offset is NULL: a pipe has none).
    let ret = unsafe {
        libc::splice(
            from.as_raw_fd(),
            &mut off,
            to.as_raw_fd(),
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_NONBLOCK,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ret as usize)
}

/// Every IP address of this host's network interfaces (`getifaddrs(3)`),
/// up or down, in the network namespace of the calling thread.
#[cfg(target_os = "linux")]
pub fn host_addresses() -> io::Result<Vec<std::net::IpAddr>> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a live local the call fills with a list it
    // allocates; it is freed below with `freeifaddrs`, once.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not
        // freed yet; its `ifa_addr` is NULL or points to a sockaddr of the
        // family it names (sockaddr_in for AF_INET, sockaddr_in6 for
        // AF_INET6), read by value.
        unsafe {
            let a = (*cur).ifa_addr;
            if !a.is_null() {
                match i32::from((*a).sa_family) {
                    libc::AF_INET => {
                        let sin = std::ptr::read_unaligned(a.cast::<libc::sockaddr_in>());
                        out.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                            sin.sin_addr.s_addr,
                        ))));
                    }
                    libc::AF_INET6 => {
                        let sin6 = std::ptr::read_unaligned(a.cast::<libc::sockaddr_in6>());
                        out.push(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
                    }
                    _ => {}
                }
            }
            cur = (*cur).ifa_next;
        }
    }
    // SAFETY: `head` came from getifaddrs and is freed once; no pointer
    // into the list outlives this call.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// For tests that change what a process may do (namespaces, limits): run
/// `f` in a forked child and return what it said (`Err` carries its
/// message, printed by the child too). Public for the sandbox crate's unit
/// tests; nothing outside tests calls it.
#[doc(hidden)]
pub fn in_forked_child(f: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
    // SAFETY: the child only runs `f` (system calls and small allocations,
    // which glibc's fork keeps usable) and `_exit`s.
    match unsafe { nix::unistd::fork() }.map_err(|e| e.to_string())? {
        nix::unistd::ForkResult::Child => {
            let code = match f() {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("{e}");
                    1
                }
            };
            // SAFETY: ends the forked child without unwinding.
            unsafe { libc::_exit(code) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            match nix::sys::wait::waitpid(child, None).map_err(|e| e.to_string())? {
                nix::sys::wait::WaitStatus::Exited(_, 0) => Ok(()),
                st => Err(format!("the child ended {st:?} (its message is above)")),
            }
        }
    }
}

/// The mount id of the file `fd` refers to (`statx` with `STATX_MNT_ID`,
/// Linux 5.8), together with its device and inode; `None` for the mount id
/// where the kernel does not report it. Works on `O_PATH` descriptors.
#[cfg(target_os = "linux")]
pub fn identity_and_mount(fd: BorrowedFd<'_>) -> io::Result<(u64, u64, Option<u64>)> {
    let mut stx = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // The raw system call, not glibc's `statx` (glibc 2.28): the portable
    // build needs no symbol above GLIBC_2.17.
    // SAFETY: an empty NUL-terminated path with AT_EMPTY_PATH names `fd`
    // itself; the kernel writes at most size_of::<statx>() bytes into the
    // zeroed buffer, which outlives the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_statx,
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_INO | libc::STATX_MNT_ID,
            stx.as_mut_ptr(),
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the buffer was zeroed (a valid statx) and the kernel filled it.
    let stx = unsafe { stx.assume_init() };
    let dev = libc::makedev(stx.stx_dev_major, stx.stx_dev_minor);
    let mnt = (stx.stx_mask & libc::STATX_MNT_ID != 0).then_some(stx.stx_mnt_id);
    Ok((dev, stx.stx_ino, mnt))
}

/// Set the mode of the inode `fd` refers to (an `O_PATH` descriptor too,
/// which `fchmod` refuses): `fchmodat2(fd, "", mode, AT_EMPTY_PATH)`
/// (Linux 6.6), else `chmod` of the descriptor's `/proc/self/fd` link,
/// which names this inode whatever its path is now. Never a path lookup
/// by name: a directory swapped for a symlink is not followed.
#[cfg(target_os = "linux")]
pub fn chmod_fd(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    // SAFETY: fchmodat2 takes a descriptor, a NUL-terminated path (empty,
    // with AT_EMPTY_PATH: the descriptor itself), a mode and flags; no
    // memory is written.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_fchmodat2,
            fd.as_raw_fd(),
            c"".as_ptr(),
            mode as libc::mode_t,
            libc::AT_EMPTY_PATH,
        )
    };
    if ret == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if !matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EINVAL)) {
        return Err(e);
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        format!("/proc/self/fd/{}", fd.as_raw_fd()),
        std::fs::Permissions::from_mode(mode),
    )
}

/// Whether `/proc` is this process's PID namespace's (`/proc/self` names
/// this process's own pid): pids read there are then pids here. An agent
/// started in a PID namespace of its own without a `/proc` of it (`unshare
/// -p` without `--mount-proc`) reads another namespace's numbers there,
/// and must not signal by them.
pub fn proc_is_ours() -> bool {
    std::fs::read_link("/proc/self").is_ok_and(|p| {
        p.as_os_str().as_encoded_bytes() == std::process::id().to_string().as_bytes()
    })
}

/// `pidfd_open(pid, 0)`: a descriptor that names this process (not its
/// number): a signal sent through it never reaches a later process that
/// reused the number.
#[cfg(target_os = "linux")]
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags, no pointers; on success it
    // returns a new descriptor that nothing else owns.
    let ret = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0u32) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just returned by the kernel, owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(ret as RawFd) })
}

/// `pidfd_send_signal(pidfd, sig, NULL, 0)`: signal the process the
/// descriptor names (ESRCH once it has exited).
#[cfg(target_os = "linux")]
pub fn pidfd_send_signal(pidfd: BorrowedFd<'_>, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: a descriptor, a signal number, a NULL siginfo (the kernel
    // fills one as kill(2) would) and no flags: no memory is passed.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The pipe buffer [`stream_stdio`] asks for on stdin and stdout.
#[cfg(target_os = "linux")]
const STDIO_PIPE_BYTES: i32 = 1 << 20;

/// Copies of this process's stdin and stdout, switched to non-blocking
/// mode, when both are pipes or sockets (under sshd, or a spawning
/// client or MCP client), for a caller to drive them with its event loop
/// instead of a blocking thread per read and write. `None` (and nothing
/// changed) for a terminal or a regular file, or when stderr (the logs)
/// is the same open file as stdout: non-blocking mode belongs to the
/// open file, and a log write could then fail with `EAGAIN`.
#[cfg(target_os = "linux")]
pub fn stream_stdio() -> Option<(OwnedFd, OwnedFd)> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    use nix::sys::stat::{fstat, SFlag};
    use std::os::fd::AsFd;
    let input = io::stdin().as_fd().try_clone_to_owned().ok()?;
    let output = io::stdout().as_fd().try_clone_to_owned().ok()?;
    for fd in [&input, &output] {
        let kind = SFlag::from_bits_truncate(fstat(fd).ok()?.st_mode) & SFlag::S_IFMT;
        if kind != SFlag::S_IFIFO && kind != SFlag::S_IFSOCK {
            return None;
        }
    }
    let out_st = fstat(&output).ok()?;
    if let Ok(err_st) = fstat(io::stderr().as_fd()) {
        if (err_st.st_dev, err_st.st_ino) == (out_st.st_dev, out_st.st_ino) {
            return None;
        }
    }
    for fd in [&input, &output] {
        let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL).ok()?);
        fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK)).ok()?;
        // A pipe of 1 MiB (the unprivileged maximum by default) instead of
        // 64 KiB: a block goes out in one write, not sixteen wake-ups of
        // both sides. Best effort: a socket, or a lower
        // `fs.pipe-max-size`, keeps what it has.
        let _ = fcntl(fd, FcntlArg::F_SETPIPE_SZ(STDIO_PIPE_BYTES));
    }
    Some((input, output))
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// A message with more descriptors than room (MSG_CTRUNC) is reported
    /// cut short, and every descriptor the kernel installed is owned and
    /// closed with it: the write end of a pipe sent three times reaches
    /// EOF on its read end once the message and our copy are dropped (a
    /// leaked copy would keep it open: `EAGAIN`). Control: the same pipe
    /// sent twice with room for two arrives whole.
    #[test]
    fn a_cut_message_leaves_no_descriptor_open() {
        use nix::sys::socket::MsgFlags;
        for (sent, cut) in [(3, true), (2, false)] {
            let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
            let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_NONBLOCK).unwrap();
            let fds = vec![w.as_fd(); sent];
            send_fds(a.as_fd(), b"x", &fds, MsgFlags::empty()).unwrap();
            drop(fds);
            let mut buf = [0u8; 4];
            let got = recv_fds::<2>(b.as_fd(), &mut buf, MsgFlags::empty()).unwrap();
            assert_eq!(got.truncated, cut, "{sent} sent");
            assert_eq!(got.bytes, 1);
            assert!(got.fds.len() <= 2);
            drop((got, w));
            let mut one = [0u8; 1];
            assert_eq!(
                nix::unistd::read(&r, &mut one).map_err(|e| e.to_string()),
                Ok(0),
                "{sent} sent: a copy of the write end is still open"
            );
        }
    }

    /// A descriptor sent with a message arrives with the read that takes
    /// its bytes, the read ends there (bytes after it come with the next),
    /// and the descriptor is the same open file (its inode).
    #[test]
    fn recv_fds_into_takes_the_descriptor_with_its_bytes() {
        use std::os::unix::fs::MetadataExt;
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        let ino = file.metadata().unwrap().ino();
        std::io::Write::write_all(&mut &a, b"before").unwrap();
        send_fds(
            a.as_fd(),
            b"with",
            &[file.as_fd()],
            nix::sys::socket::MsgFlags::empty(),
        )
        .unwrap();
        std::io::Write::write_all(&mut &a, b"after").unwrap();
        let mut buf = bytes::BytesMut::with_capacity(64);
        let first = recv_fds_into(b.as_fd(), &mut buf).unwrap();
        assert_eq!(&buf[..], b"beforewith");
        assert!(!first.truncated);
        assert_eq!(first.fds.len(), 1);
        let got = std::fs::File::from(first.fds.into_iter().next().unwrap());
        assert_eq!(got.metadata().unwrap().ino(), ino);
        let second = recv_fds_into(b.as_fd(), &mut buf).unwrap();
        assert_eq!(&buf[..], b"beforewithafter");
        assert!(second.fds.is_empty(), "{second:?}");
        // Nothing more queued: never waits.
        let e = recv_fds_into(b.as_fd(), &mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        drop(a);
        assert_eq!(recv_fds_into(b.as_fd(), &mut buf).unwrap().bytes, 0);
    }
}
