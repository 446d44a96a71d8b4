//! seccomp (step 5c of [`super`]): one classic BPF program per job,
//! compiled once by the spawner for each network shape and inherited.
//! Its [`program_head`] checks the architecture (and, on x86_64, the x32
//! bit) before any number and answers ENOSYS to `clone3` and `openat2`;
//! a binary search over the numbers ([`number_dispatch`]) then refuses
//! the syscalls of [`DENIED`] outright and sends those with argument
//! rules to their block of seccompiler's chain: terminal ioctls, set-id
//! modes, namespace flags of `clone`, and the socket triples and calls of
//! the plan's network shape.
//!
//! The syscalls refused whatever their arguments ([`DENIED`]) and the
//! refused terminal ioctls ([`REFUSED_IOCTLS`]) are data, each entry
//! with the escape it prevents; the rules on arguments (set-id modes,
//! `clone`'s namespace flags, socket triples, TCP Fast Open) are built by
//! the functions below, each saying why.
//!
//! Depends on `seccompiler` (rules and the compiler), [`executor_sys`]
//! (installing the program) and [`crate::plan`] (the network shape).

use super::{at, Step, StepResult};
use crate::plan::WireNet;
use executor_sys as sys;
use seccompiler::{
    SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
};
use std::collections::BTreeMap;
use std::io;

fn rule(conds: Vec<SeccompCondition>) -> io::Result<SeccompRule> {
    SeccompRule::new(conds).map_err(|e| io::Error::other(e.to_string()))
}

fn cond(arg: u8, op: SeccompCmpOp, v: u64) -> io::Result<SeccompCondition> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, v)
        .map_err(|e| io::Error::other(e.to_string()))
}

fn cond64(arg: u8, op: SeccompCmpOp, v: u64) -> io::Result<SeccompCondition> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, v)
        .map_err(|e| io::Error::other(e.to_string()))
}

/// Deny every socket type (`type & SOCK_TYPE_MASK`: four bits, 16 values;
/// the kernel refuses any other bit but `SOCK_NONBLOCK` and
/// `SOCK_CLOEXEC`) but `allowed`: an allow-list, as a few masked
/// comparisons of argument 1's low four bits that together match every
/// other type and never an allowed one (a cover of the refused values by
/// bit patterns: for stream and seqpacket, bit 3 set, or bit 3 clear and
/// bit 1 set, or bits 3, 1 and 0 clear; three rules instead of one per
/// refused type, so a shorter program for the kernel to convert and JIT
/// at every job's start).
fn types_except(allowed: &[u64]) -> io::Result<Vec<SeccompRule>> {
    type_patterns(allowed)?
        .into_iter()
        .map(|(mask, value)| rule(vec![cond(1, SeccompCmpOp::MaskedEq(mask), value)?]))
        .collect()
}

/// `(mask, value)` pairs over the four type bits such that a type `t` is
/// outside `allowed` exactly when `t & mask == value` for one of them
/// (greedy: each pattern the one matching the most refused types left;
/// `(0xf, t)` always matches a refused `t`, so every one is covered). An
/// allowed value beyond the four bits is an error: it could not be told
/// apart from the type its low bits name.
fn type_patterns(allowed: &[u64]) -> io::Result<Vec<(u64, u64)>> {
    if let Some(bad) = allowed.iter().find(|&&a| a > 0xf) {
        return Err(io::Error::other(format!(
            "socket type {bad:#x} is not a type"
        )));
    }
    let hits = |(mask, value): (u64, u64), t: u64| t & mask == value;
    let candidates: Vec<(u64, u64)> = (0..16u64)
        .flat_map(|mask| (0..16u64).map(move |value| (mask, value)))
        .filter(|&(mask, value)| value & !mask == 0)
        .filter(|&p| !allowed.iter().any(|&a| hits(p, a)))
        .collect();
    let mut left: Vec<u64> = (0..16).filter(|t| !allowed.contains(t)).collect();
    let mut out = Vec::new();
    while !left.is_empty() {
        let best = candidates
            .iter()
            .copied()
            .max_by_key(|&p| left.iter().filter(|&&t| hits(p, t)).count())
            .filter(|&p| left.iter().any(|&t| hits(p, t)))
            .ok_or_else(|| io::Error::other("no pattern covers the refused socket types"))?;
        left.retain(|&t| !hits(best, t));
        out.push(best);
    }
    Ok(out)
}

/// This build's `AUDIT_ARCH_*` (`seccomp_data.arch` of a native syscall).
#[cfg(target_arch = "x86_64")]
pub const NATIVE_AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
pub const NATIVE_AUDIT_ARCH: u32 = 0xc000_00b7;
#[cfg(target_arch = "riscv64")]
pub const NATIVE_AUDIT_ARCH: u32 = 0xc000_00f3;

/// The head of the job's one seccomp program, checks seccompiler cannot
/// express (it checks only the architecture, and gives one action to all
/// its rules), falling through to the rule list after it:
/// - (x86_64) the x32 guard: any architecture but x86_64 (i386 through
///   `int 0x80`) kills the process, and a syscall number with
///   `__X32_SYSCALL_BIT` set is refused with EPERM;
/// - `clone3` answers ENOSYS, so libc falls back to `clone`, whose flags
///   the rule list can read;
/// - `openat2` answers ENOSYS, so callers fall back to `openat`, whose
///   flags and mode the rule list can read (set-id modes,
///   [`set_id_modes`]).
///
/// One program instead of one per check: the kernel converts and JITs it
/// once per job, and runs one filter per system call of the job. In one
/// program the first answer wins (across filters the strictest did): the
/// head's EPERM and ENOSYS take precedence over the rule list, whose
/// answers are all EPERM today; a stricter rule (KILL, TRAP) for clone3 or
/// an x32 number would have to go in the head.
pub fn program_head() -> Vec<seccompiler::sock_filter> {
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const RET_K: u16 = 0x06;
    let ins = |code, jt, jf, k| seccompiler::sock_filter { code, jt, jf, k };
    let mut head = vec![
        ins(LD_W_ABS, 0, 0, 4), // seccomp_data.arch
        // The native architecture: any other (a compat ABI) is killed
        // before a number is looked at.
        ins(JEQ_K, 1, 0, NATIVE_AUDIT_ARCH),
        ins(RET_K, 0, 0, libc::SECCOMP_RET_KILL_PROCESS),
        ins(LD_W_ABS, 0, 0, 0), // seccomp_data.nr
    ];
    #[cfg(target_arch = "x86_64")]
    {
        const JGE_K: u16 = 0x35;
        const X32_SYSCALL_BIT: u32 = 0x4000_0000;
        head.extend([
            ins(JGE_K, 0, 1, X32_SYSCALL_BIT),
            ins(RET_K, 0, 0, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
        ]);
    }
    head.extend([
        ins(JEQ_K, 0, 1, libc::SYS_clone3 as u32),
        ins(RET_K, 0, 0, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
        ins(JEQ_K, 0, 1, libc::SYS_openat2 as u32),
        ins(RET_K, 0, 0, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
    ]);
    head
}

/// A binary search over the syscall numbers the rules name (`keys`,
/// sorted; `true`: refused whatever the arguments), placed between
/// [`program_head`] (which leaves the number in the accumulator) and the
/// rule list: a number without rules is allowed, and one always refused
/// is refused with EPERM, after about log2(len) comparisons instead of a
/// walk down seccompiler's linear chain (two instructions per syscall it
/// names); a number with argument rules jumps to its own block of the
/// chain (`blocks`, [`chain_blocks`]: the block's `JEQ` matches the number
/// still in the accumulator, and its rules decide as before), or falls
/// through to the chain's start when it has no known block. It changes no answer (a test runs this
/// program and the chain alone on every number and the rules' argument
/// values), only the work: each of the job's syscalls, and the kernel's
/// emulation of the program for every syscall number when the filter is
/// installed (its action cache: about half of the install's cost before).
/// `None` when the search would not fit conditional jumps (over 255
/// instructions); the chain alone then decides everything.
pub fn number_dispatch(
    keys: &[(u32, bool)],
    blocks: &BTreeMap<u32, usize>,
) -> Option<Vec<seccompiler::sock_filter>> {
    const JEQ_K: u16 = 0x15;
    const JGE_K: u16 = 0x35;
    const JA: u16 = 0x05;
    const RET_K: u16 = 0x06;
    const RET_ALLOW: u32 = 0x7fff_0000;
    /// A jump to the end of the search (the chain), resolved once the
    /// length is known.
    const TO_CHAIN: u8 = u8::MAX;
    /// Jumps to a syscall's own block of the chain: (index of the `JA`,
    /// the block's offset in the chain), resolved once the length is known.
    type Fixups = Vec<(usize, usize)>;
    fn emit(
        keys: &[(u32, bool)],
        blocks: &BTreeMap<u32, usize>,
        out: &mut Vec<seccompiler::sock_filter>,
        fix: &mut Fixups,
    ) -> Option<()> {
        let ins = |code, jt, jf, k| seccompiler::sock_filter { code, jt, jf, k };
        if keys.len() <= 4 {
            for &(k, refused) in keys {
                if refused {
                    out.push(ins(JEQ_K, 0, 1, k));
                    out.push(ins(
                        RET_K,
                        0,
                        0,
                        libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
                    ));
                } else if let Some(&block) = blocks.get(&k) {
                    // Straight to the syscall's block (its `JEQ` matches
                    // the number still in the accumulator), not down the
                    // chain's comparisons of every syscall before it.
                    out.push(ins(JEQ_K, 0, 1, k));
                    fix.push((out.len(), block));
                    out.push(ins(JA, 0, 0, 0));
                } else {
                    out.push(ins(JEQ_K, TO_CHAIN, 0, k));
                }
            }
            out.push(ins(RET_K, 0, 0, RET_ALLOW));
            return Some(());
        }
        let (left, right) = keys.split_at(keys.len() / 2);
        let at = out.len();
        // A >= right[0]: the right half (after the left half's code).
        out.push(ins(JGE_K, 0, 0, right[0].0));
        emit(left, blocks, out, fix)?;
        out[at].jt = u8::try_from(out.len() - at - 1).ok()?;
        emit(right, blocks, out, fix)
    }
    if keys.is_empty() {
        return None;
    }
    let mut out = Vec::new();
    let mut fix = Vec::new();
    emit(keys, blocks, &mut out, &mut fix)?;
    let len = out.len();
    for (i, f) in out.iter_mut().enumerate() {
        if f.code == JEQ_K && f.jt == TO_CHAIN && f.jf == 0 {
            f.jt = u8::try_from(len - i - 1).ok()?;
        }
    }
    for (i, block) in fix {
        out[i].k = u32::try_from(len - i - 1 + block).ok()?;
    }
    Some(out)
}

/// Where each syscall's block starts in seccompiler's program `rules`,
/// compiled from `deny` (blocks follow the load of the number, one per
/// syscall in number order: its `JEQ`, each rule's two jumps, conditions
/// and return, the block's return); `None` when the program is not laid
/// out so (each block is checked to start with its `JEQ`).
fn chain_blocks(
    rules: &[seccompiler::sock_filter],
    deny: &DenyMap,
) -> Option<BTreeMap<u32, usize>> {
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    let mut at = rules.iter().position(|f| f.code == LD_W_ABS && f.k == 0)? + 1;
    let mut out = BTreeMap::new();
    for (&nr, chain) in deny {
        let nr = u32::try_from(nr).ok()?;
        let f = rules.get(at)?;
        if (f.code, f.k) != (JEQ_K, nr) {
            return None;
        }
        out.insert(nr, at);
        let body: usize = if chain.is_empty() {
            3
        } else {
            chain
                .iter()
                .map(|r| seccompiler::BpfProgram::from(r.clone()).len() + 1)
                .sum()
        };
        at += 1 + body + 1;
    }
    (at < rules.len()).then_some(out)
}

/// `open_tree_attr` (Linux 6.15; the number is the same on every
/// architecture since 5.1's common table; not in the libc crate yet).
const SYS_OPEN_TREE_ATTR: libc::c_long = 467;

/// Syscalls refused (EPERM) to every job, whatever its arguments, each
/// with the escape or the attack surface it removes.
pub const DENIED: &[(libc::c_long, &str)] = &[
    (libc::SYS_ptrace, "tracing another process of the job: reading and writing its memory and registers"),
    (libc::SYS_process_vm_readv, "reading another process's memory without tracing it"),
    (libc::SYS_process_vm_writev, "writing another process's memory without tracing it"),
    (libc::SYS_pidfd_getfd, "copying another process's descriptor in (the agent's sockets, for a job outside the namespaces: a degraded `allow_hosts` job)"),
    (libc::SYS_io_uring_setup, "io_uring opens files and sockets without the syscalls filtered here"),
    (libc::SYS_io_uring_enter, "io_uring opens files and sockets without the syscalls filtered here"),
    (libc::SYS_io_uring_register, "io_uring opens files and sockets without the syscalls filtered here"),
    (libc::SYS_mount, "changing the job's mount table: a cover lifted off a `deny_read` carve-out, a read-only bind made writable"),
    (libc::SYS_umount2, "unmounting a cover or a read-only bind to reach what is beneath"),
    (libc::SYS_pivot_root, "changing the job's root"),
    (libc::SYS_chroot, "changing the root (with a directory kept open outside it: the classic chroot escape)"),
    (libc::SYS_unshare, "new namespaces: a new user namespace gives back every capability, over new mounts"),
    (libc::SYS_setns, "joining another namespace through a descriptor"),
    (libc::SYS_keyctl, "the kernel keyrings, which the job's namespaces do not separate (the user's keys and tokens)"),
    (libc::SYS_add_key, "the kernel keyrings, which the job's namespaces do not separate"),
    (libc::SYS_request_key, "the kernel keyrings, which the job's namespaces do not separate"),
    (libc::SYS_bpf, "loading BPF programs and maps into the kernel (attack surface)"),
    (libc::SYS_perf_event_open, "observing other processes and the kernel (side channels; attack surface)"),
    (libc::SYS_userfaultfd, "stalling the kernel on a page fault mid-copy: the race window of many kernel exploits"),
    (libc::SYS_kexec_load, "loading a new kernel"),
    (libc::SYS_kexec_file_load, "loading a new kernel"),
    (libc::SYS_init_module, "loading kernel code"),
    (libc::SYS_finit_module, "loading kernel code"),
    (libc::SYS_delete_module, "unloading kernel code"),
    (libc::SYS_open_by_handle_at, "opening a file by handle, around paths, binds and covers (the \"shocker\" container escape)"),
    (libc::SYS_name_to_handle_at, "making the handles `open_by_handle_at` takes"),
    (libc::SYS_fsopen, "the new mount API: what `mount` does"),
    (libc::SYS_fsmount, "the new mount API: what `mount` does"),
    (libc::SYS_fsconfig, "the new mount API: what `mount` does"),
    (libc::SYS_fspick, "the new mount API: reconfiguring an existing mount"),
    (libc::SYS_move_mount, "the new mount API: moving a mount, a cover off its carve-out"),
    (libc::SYS_open_tree, "the new mount API: cloning a mount, with other attributes"),
    (SYS_OPEN_TREE_ATTR, "the new mount API: cloning a mount with other attributes"),
    (libc::SYS_mount_setattr, "the new mount API: making a read-only mount writable"),
    (libc::SYS_fanotify_init, "watching what was granted is fine; fanotify needs privileges the job does not have, refused outright for clarity"),
];

/// Terminal ioctls refused to every job (EPERM), each with what it would
/// let the job do. `TIOCSCTTY` stays allowed: the job takes its terminal
/// with it after the filter is in force.
pub const REFUSED_IOCTLS: [(u64, &str); 5] = [
    (libc::TIOCSTI, "faking input into the terminal's other readers (the shell the job was started from)"),
    (libc::TIOCLINUX, "a virtual console's selection paste: faked input, as TIOCSTI"),
    (libc::TIOCSETD, "changing the line discipline: the kernel loads and runs its code, a module autoloaded on demand on many hosts (n_gsm, n_hdlc and others had exploitable bugs)"),
    (libc::TIOCCONS, "redirecting the console"),
    (libc::TIOCSSERIAL, "reconfiguring serial hardware"),
];

/// `fchmodat2` (Linux 6.6; the same number on every architecture).
const SYS_FCHMODAT2: libc::c_long = 452;

/// The bits of a mode that confer privileges on whoever runs the file.
const SET_ID_BITS: [u64; 2] = [libc::S_ISUID as u64, libc::S_ISGID as u64];

/// The flags under which `open` reads its mode: `O_CREAT`, and
/// `O_TMPFILE`'s own bit (an unnamed file a later `linkat` names).
const OPEN_MODE_FLAGS: [u64; 2] = [libc::O_CREAT as u64, 0o20_000_000];

/// Set-id bits refused in every mode a job gives (EPERM): a set-uid or
/// set-gid file made in a write root runs as the agent's user for anyone
/// on the host who can reach it. The mode changes (`chmod`, `fchmod`,
/// `fchmodat`, `fchmodat2`) and the modes of what is made (`mkdir`,
/// `mkdirat`, `mknod`, `mknodat`; `open`, `openat` with `O_CREAT` or
/// `O_TMPFILE`, `creat`). The mode is compared in its low 32 bits (a
/// `umode_t` of 16 for the kernel): bits above cannot hide the set-id
/// ones. `openat2` takes its mode in a structure seccomp cannot read: it
/// is ENOSYS in [`program_head`] instead, and libc falls back to `openat`.
/// `io_uring` (which opens files itself) is refused outright, and file
/// capabilities need `CAP_SETFCAP`, which the job does not have.
fn set_id_modes(deny: &mut DenyMap) -> io::Result<()> {
    use libc::*;
    let bits = |arg: u8| -> io::Result<Vec<SeccompRule>> {
        SET_ID_BITS
            .iter()
            .map(|&b| rule(vec![cond(arg, SeccompCmpOp::MaskedEq(b), b)?]))
            .collect()
    };
    let mut mode_args: Vec<(c_long, u8)> = vec![
        (SYS_fchmod, 1),
        (SYS_fchmodat, 2),
        (SYS_FCHMODAT2, 2),
        (SYS_mkdirat, 2),
        (SYS_mknodat, 2),
    ];
    #[cfg(target_arch = "x86_64")]
    mode_args.extend([
        (SYS_chmod, 1),
        (SYS_mkdir, 1),
        (SYS_mknod, 1),
        (SYS_creat, 1),
    ]);
    for (nr, arg) in mode_args {
        deny.insert(nr, bits(arg)?);
    }
    let mut open_args: Vec<(c_long, u8, u8)> = vec![(SYS_openat, 2, 3)];
    #[cfg(target_arch = "x86_64")]
    open_args.push((SYS_open, 1, 2));
    for (nr, flags, mode) in open_args {
        let mut rules = Vec::new();
        for f in OPEN_MODE_FLAGS {
            for b in SET_ID_BITS {
                rules.push(rule(vec![
                    cond(flags, SeccompCmpOp::MaskedEq(f), f)?,
                    cond(mode, SeccompCmpOp::MaskedEq(b), b)?,
                ])?);
            }
        }
        deny.insert(nr, rules);
    }
    Ok(())
}

/// The `clone` flags that make new namespaces, refused to every job.
const CLONE_NAMESPACE_FLAGS: &[libc::c_int] = &[
    libc::CLONE_NEWNS,
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWCGROUP,
];

/// The socket types a job may make `AF_UNIX` sockets of.
const UNIX_TYPES: &[u64] = &[libc::SOCK_STREAM as u64, libc::SOCK_SEQPACKET as u64];

/// Syscall number to the rules under which it is refused (no rule: always).
type DenyMap = BTreeMap<i64, Vec<SeccompRule>>;

/// The rules every job gets, whatever its network.
fn base_denials() -> io::Result<DenyMap> {
    use libc::*;
    let mut deny = DenyMap::new();
    for &(nr, _) in DENIED {
        deny.insert(nr, vec![]);
    }
    // Terminal ioctls (the command is 32 bits: the kernel drops the
    // upper word, and so does a `Dword` comparison).
    deny.insert(
        SYS_ioctl,
        REFUSED_IOCTLS
            .iter()
            .map(|&(cmd, _)| rule(vec![cond(1, SeccompCmpOp::Eq, cmd)?]))
            .collect::<io::Result<_>>()?,
    );
    set_id_modes(&mut deny)?;
    // New namespaces through clone flags.
    let mut clone_rules = Vec::new();
    for &f in CLONE_NAMESPACE_FLAGS {
        clone_rules.push(rule(vec![cond(
            0,
            SeccompCmpOp::MaskedEq(f as u64),
            f as u64,
        )?])?);
    }
    deny.insert(SYS_clone, clone_rules);
    Ok(deny)
}

/// Anything but `AF_UNIX` sockets of [`UNIX_TYPES`] refused.
fn unix_only() -> io::Result<Vec<SeccompRule>> {
    let mut rules = vec![rule(vec![cond(
        0,
        SeccompCmpOp::Ne,
        libc::AF_UNIX as u64,
    )?])?];
    rules.extend(types_except(UNIX_TYPES)?);
    Ok(rules)
}

/// `network: "deny"`: no socket can address anything.
fn deny_network(deny: &mut DenyMap) -> io::Result<()> {
    use libc::*;
    // AF_UNIX only, stream and seqpacket only: without connect or
    // bind, such a socket can address nothing (a name on sendto /
    // sendmsg is refused or ignored for these types); no datagram
    // socket, which could send to any pathname socket by name.
    let rules = unix_only()?;
    deny.insert(SYS_socket, rules.clone());
    deny.insert(SYS_socketpair, rules);
    for nr in [SYS_connect, SYS_bind, SYS_listen, SYS_accept, SYS_accept4] {
        deny.insert(nr, vec![]);
    }
    // A destination address on sendto, whatever the socket.
    deny.insert(
        SYS_sendto,
        vec![rule(vec![cond64(4, SeccompCmpOp::Ne, 0)?])?],
    );
    Ok(())
}

/// Port allow-lists and egress: outgoing TCP streams only.
fn tcp_connect_only(deny: &mut DenyMap) -> io::Result<()> {
    use libc::*;
    // TCP stream sockets (Landlock limits their ports; with egress
    // the namespace has nothing but the proxy), IPv4 and
    // IPv6, protocol 0 or IPPROTO_TCP (not MPTCP, not SCTP); Unix
    // sockets only as connected pairs (connect is allowed here and
    // could reach a pathname socket).
    let mut rules = vec![rule(vec![
        cond(0, SeccompCmpOp::Ne, AF_INET as u64)?,
        cond(0, SeccompCmpOp::Ne, AF_INET6 as u64)?,
    ])?];
    rules.extend(types_except(&[SOCK_STREAM as u64])?);
    rules.push(rule(vec![
        cond(2, SeccompCmpOp::Ne, 0)?,
        cond(2, SeccompCmpOp::Ne, IPPROTO_TCP as u64)?,
    ])?);
    deny.insert(SYS_socket, rules);
    deny.insert(SYS_socketpair, unix_only()?);
    for nr in [SYS_listen, SYS_accept, SYS_accept4] {
        deny.insert(nr, vec![]);
    }
    deny_tcp_fastopen(deny)
}

/// TCP Fast Open connects from a send call, around Landlock's connect
/// rule: refused on the send calls and as a socket option.
fn deny_tcp_fastopen(deny: &mut DenyMap) -> io::Result<()> {
    use libc::*;
    let fastopen = MSG_FASTOPEN as u64;
    for (nr, flags_arg) in [(SYS_sendto, 3), (SYS_sendmsg, 2), (SYS_sendmmsg, 3)] {
        deny.insert(
            nr,
            vec![rule(vec![cond(
                flags_arg,
                SeccompCmpOp::MaskedEq(fastopen),
                fastopen,
            )?])?],
        );
    }
    const TCP_FASTOPEN_CONNECT: u64 = 30;
    deny.insert(
        SYS_setsockopt,
        vec![
            rule(vec![
                cond(1, SeccompCmpOp::Eq, IPPROTO_TCP as u64)?,
                cond(2, SeccompCmpOp::Eq, TCP_FASTOPEN_CONNECT)?,
            ])?,
            rule(vec![
                cond(1, SeccompCmpOp::Eq, IPPROTO_TCP as u64)?,
                cond(2, SeccompCmpOp::Eq, TCP_FASTOPEN as u64)?,
            ])?,
        ],
    );
    Ok(())
}

/// A filter allowing everything but `rules`, which get `errno`.
fn filter(rules: DenyMap, errno: i32, arch: seccompiler::TargetArch) -> io::Result<SeccompFilter> {
    SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        arch,
    )
    .map_err(|e| io::Error::other(e.to_string()))
}

/// The network shapes the seccomp programs differ by (a port list is
/// Landlock's, not seccomp's): allow, deny, TCP connect only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NetShape {
    Allow = 0,
    Deny = 1,
    TcpOnly = 2,
}

impl NetShape {
    const ALL: [NetShape; 3] = [NetShape::Allow, NetShape::Deny, NetShape::TcpOnly];

    fn of(net: &WireNet) -> NetShape {
        match net {
            WireNet::Allow => NetShape::Allow,
            WireNet::Deny => NetShape::Deny,
            WireNet::Tcp(_) | WireNet::Egress { .. } => NetShape::TcpOnly,
        }
    }
}

/// The programs of every [`NetShape`], compiled once by
/// [`precompile_seccomp`] (the spawner, before it forks any supervisor;
/// every job's init inherits them by fork).
static PROGRAMS: std::sync::OnceLock<[Vec<seccompiler::BpfProgram>; 3]> =
    std::sync::OnceLock::new();

/// Compile the seccomp programs of every network shape now, so that a job
/// installs them without compiling (the spawner calls this once; the
/// programs are the ones [`seccomp_programs`] would compile per job).
pub fn precompile_seccomp() -> io::Result<()> {
    let [a, d, t] = NetShape::ALL;
    let all = [
        compile_seccomp(a)?,
        compile_seccomp(d)?,
        compile_seccomp(t)?,
    ];
    let _ = PROGRAMS.set(all);
    Ok(())
}

/// Step 5c: the seccomp program ([`program_head`], then the EPERM list
/// and socket allow-lists; one program in a list of one): precompiled when [`precompile_seccomp`] ran in this process
/// or an ancestor it forked from, else compiled now.
pub fn seccomp_programs(
    net: &WireNet,
) -> io::Result<std::borrow::Cow<'static, [seccompiler::BpfProgram]>> {
    let shape = NetShape::of(net);
    match PROGRAMS.get() {
        Some(all) => Ok(std::borrow::Cow::Borrowed(&all[shape as usize])),
        None => compile_seccomp(shape).map(std::borrow::Cow::Owned),
    }
}

fn compile_seccomp(shape: NetShape) -> io::Result<Vec<seccompiler::BpfProgram>> {
    compile_seccomp_with(shape, true)
}

/// [`compile_seccomp`], with or without the [`number_dispatch`] (without:
/// the reference its answers are tested against).
fn compile_seccomp_with(
    shape: NetShape,
    dispatch: bool,
) -> io::Result<Vec<seccompiler::BpfProgram>> {
    let mut deny = base_denials()?;
    match shape {
        NetShape::Allow => {}
        NetShape::Deny => deny_network(&mut deny)?,
        NetShape::TcpOnly => tcp_connect_only(&mut deny)?,
    }
    let arch = seccompiler::TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| io::Error::other(e.to_string()))?;
    let keys: Vec<(u32, bool)> = deny
        .iter()
        .map(|(&nr, rules)| (nr as u32, rules.is_empty()))
        .collect();
    let compile = |deny: DenyMap| -> io::Result<seccompiler::BpfProgram> {
        filter(deny, libc::EPERM, arch)?
            .try_into()
            .map_err(|e: seccompiler::BackendError| io::Error::other(e.to_string()))
    };
    // The search refuses the syscalls without rules itself: the chain need
    // not name them.
    let mut with_rules = deny.clone();
    with_rules.retain(|_, rules| !rules.is_empty());
    let chain = compile(with_rules.clone())?;
    let dispatch = match chain_blocks(&chain, &with_rules) {
        Some(blocks) if dispatch => number_dispatch(&keys, &blocks),
        _ => None,
    };
    let rules = match dispatch {
        Some(_) => chain,
        None => compile(deny)?,
    };
    // The head falls through to the rules (BPF jumps are relative and go
    // forward only, so the rules' own jumps are unchanged behind it).
    let mut program = program_head();
    program.extend(dispatch.unwrap_or_default());
    program.extend(rules);
    if program.len() > BPF_MAXINSNS {
        return Err(io::Error::other(format!(
            "the seccomp program has {} instructions, over the kernel's {BPF_MAXINSNS}",
            program.len()
        )));
    }
    Ok(vec![program])
}

/// The kernel's bound on a classic BPF program's length.
const BPF_MAXINSNS: usize = 4096;

/// Install the job's `filters` on the calling process (after
/// `no_new_privs`; the job inherits them).
pub(super) fn install(filters: &[seccompiler::BpfProgram]) -> StepResult<()> {
    for f in filters.iter() {
        sys::install_bpf(f).map_err(at(Step::Seccomp))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run a classic BPF seccomp program (the instructions seccompiler
    /// and the head use) on one `seccomp_data`; the action and the number
    /// of instructions run.
    fn run_bpf(
        prog: &[seccompiler::sock_filter],
        arch: u32,
        nr: u32,
        args: [u64; 6],
    ) -> (u32, usize) {
        let word = |off: u32| -> u32 {
            match off {
                0 => nr,
                4 => arch,
                8 | 12 => 0,
                o if (16..64).contains(&o) && o % 4 == 0 => {
                    let a = args[((o - 16) / 8) as usize];
                    if (o - 16) % 8 == 0 {
                        a as u32
                    } else {
                        (a >> 32) as u32
                    }
                }
                o => panic!("load at {o}"),
            }
        };
        let (mut a, mut pc, mut steps) = (0u32, 0usize, 0usize);
        loop {
            let f = &prog[pc];
            steps += 1;
            let (jt, jf) = (usize::from(f.jt), usize::from(f.jf));
            pc += 1;
            match f.code {
                0x20 => a = word(f.k),
                0x54 => a &= f.k,
                0x05 => pc += f.k as usize,
                0x06 => return (f.k, steps),
                0x15 => pc += if a == f.k { jt } else { jf },
                0x25 => pc += if a > f.k { jt } else { jf },
                0x35 => pc += if a >= f.k { jt } else { jf },
                0x45 => pc += if a & f.k != 0 { jt } else { jf },
                c => panic!("instruction {c:#x} at {}", pc - 1),
            }
        }
    }

    // The socket calls' answers under every network shape, against a
    // plain statement of what each allows: every domain the filters name
    // and a few they do not, every one of the 16 types with each flag, the
    // protocols they name.
    #[test]
    fn socket_calls_are_refused_outside_the_allowed_triples_only() {
        use libc::*;
        const ALLOW: u32 = 0x7fff_0000;
        let eperm = SECCOMP_RET_ERRNO | EPERM as u32;
        for shape in NetShape::ALL {
            let prog = compile_seccomp(shape).unwrap().remove(0);
            for nr in [SYS_socket, SYS_socketpair] {
                for domain in [AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_PACKET, AF_VSOCK] {
                    for t in 0..16 {
                        for flags in [0, SOCK_NONBLOCK, SOCK_CLOEXEC, SOCK_NONBLOCK | SOCK_CLOEXEC]
                        {
                            for proto in [0, IPPROTO_TCP, IPPROTO_UDP, IPPROTO_MPTCP, IPPROTO_SCTP]
                            {
                                let unix =
                                    domain == AF_UNIX && [SOCK_STREAM, SOCK_SEQPACKET].contains(&t);
                                let tcp = [AF_INET, AF_INET6].contains(&domain)
                                    && t == SOCK_STREAM
                                    && [0, IPPROTO_TCP].contains(&proto);
                                let allowed = match (shape, nr) {
                                    (NetShape::Allow, _) => true,
                                    (NetShape::Deny, _) => unix,
                                    (NetShape::TcpOnly, n) if n == SYS_socket => tcp,
                                    (NetShape::TcpOnly, _) => unix,
                                };
                                // Bits the type's check must not read: the
                                // high word, and bits the kernel refuses.
                                for extra in [0, 1 << 32, 0xffff_ffff << 32, 0x10, 1 << 31] {
                                    let ty = (t | flags) as u64 | extra;
                                    let args = [domain as u64, ty, proto as u64, 0, 0, 0];
                                    let (action, _) =
                                        run_bpf(&prog, NATIVE_AUDIT_ARCH, nr as u32, args);
                                    assert_eq!(
                                        action,
                                        if allowed { ALLOW } else { eperm },
                                        "{shape:?} nr {nr} domain {domain} type {ty:#x} proto {proto}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
        // The cover is the allow-list's complement, for every list of
        // types; a value beyond the type bits is refused.
        for set in 0..1u32 << 16 {
            let allowed: Vec<u64> = (0..16).filter(|t| set & 1 << t != 0).collect();
            let pats = type_patterns(&allowed).unwrap();
            for t in 0..16u64 {
                let refused = pats.iter().any(|&(m, v)| t & m == v);
                assert_eq!(refused, !allowed.contains(&t), "{allowed:?} type {t}");
            }
        }
        assert!(type_patterns(&[17]).is_err());
        assert!(type_patterns(&[1, 0x801]).is_err());
        assert_eq!(type_patterns(UNIX_TYPES).unwrap().len(), 3);
        assert_eq!(type_patterns(&[libc::SOCK_STREAM as u64]).unwrap().len(), 4);
        // 371 and 416 instructions with one rule per refused type (240 and
        // 285 with the cover; 490 and 538 with the set-id modes and the
        // dispatch's jumps into each syscall's block).
        let len = |s| compile_seccomp(s).unwrap()[0].len();
        assert!(len(NetShape::Deny) <= 490, "{}", len(NetShape::Deny));
        assert!(len(NetShape::TcpOnly) <= 538, "{}", len(NetShape::TcpOnly));
    }

    /// Set-id bits in any mode a job gives are refused (EPERM), whatever
    /// else the mode or the register holds; other modes, and open's mode
    /// without `O_CREAT`/`O_TMPFILE`, are not; `openat2` is ENOSYS; the
    /// refused terminal ioctls are refused with any upper word, others not.
    #[test]
    fn set_id_modes_and_tty_ioctls_are_refused_in_every_shape() {
        use libc::*;
        const ALLOW: u32 = 0x7fff_0000;
        let eperm = SECCOMP_RET_ERRNO | EPERM as u32;
        let enosys = SECCOMP_RET_ERRNO | ENOSYS as u32;
        let mut modes: Vec<u64> = (0..0o10000).step_by(7).collect();
        modes.extend([0o4000, 0o2000, 0o6755, 0o1777, 0o777, 0o644]);
        let extras = [0, 0xffff_0000, 1 << 32, 0xffff_ffff << 32];
        let tmpfile = 0o20_000_000u64;
        for shape in NetShape::ALL {
            let prog = compile_seccomp(shape).unwrap().remove(0);
            let run =
                |nr: c_long, args: [u64; 6]| run_bpf(&prog, NATIVE_AUDIT_ARCH, nr as u32, args).0;
            let mut mode_arg: Vec<(c_long, usize)> = vec![
                (SYS_fchmod, 1),
                (SYS_fchmodat, 2),
                (SYS_FCHMODAT2, 2),
                (SYS_mkdirat, 2),
                (SYS_mknodat, 2),
            ];
            #[cfg(target_arch = "x86_64")]
            mode_arg.extend([
                (SYS_chmod, 1),
                (SYS_mkdir, 1),
                (SYS_mknod, 1),
                (SYS_creat, 1),
            ]);
            for &m in &modes {
                let set_id = m & 0o6000 != 0;
                for x in extras {
                    for &(nr, i) in &mode_arg {
                        let mut args = [3, 0x1000, 0, 0, 0, 0];
                        args[i] = m | x;
                        let want = if set_id { eperm } else { ALLOW };
                        assert_eq!(run(nr, args), want, "{shape:?} nr {nr} mode {:#o}", m | x);
                    }
                    let mut opens: Vec<(c_long, usize, usize)> = vec![(SYS_openat, 2, 3)];
                    #[cfg(target_arch = "x86_64")]
                    opens.push((SYS_open, 1, 2));
                    for &(nr, fi, mi) in &opens {
                        for flags in [
                            O_RDONLY as u64,
                            O_WRONLY as u64 | O_TRUNC as u64,
                            O_CREAT as u64 | O_WRONLY as u64,
                            O_CREAT as u64 | O_EXCL as u64 | O_CLOEXEC as u64,
                            tmpfile | O_DIRECTORY as u64 | O_RDWR as u64,
                        ] {
                            let mut args = [AT_FDCWD as u64, 0x1000, 0x1000, 0, 0, 0];
                            args[fi] = flags | x;
                            args[mi] = m | x;
                            let creates = (flags | x) & (O_CREAT as u64 | tmpfile) != 0;
                            let want = if set_id && creates { eperm } else { ALLOW };
                            assert_eq!(
                                run(nr, args),
                                want,
                                "{shape:?} nr {nr} flags {flags:#o} mode {:#o}",
                                m | x
                            );
                        }
                    }
                }
            }
            assert_eq!(run(SYS_openat2, [0; 6]), enosys, "{shape:?}");
            for (cmd, _) in REFUSED_IOCTLS {
                for x in [0, 1 << 32, 0xffff_ffff << 32] {
                    assert_eq!(run(SYS_ioctl, [0, cmd | x, 0, 0, 0, 0]), eperm, "{cmd:#x}");
                }
            }
            for cmd in [
                TIOCGWINSZ, TIOCSWINSZ, TIOCGETD, TCGETS, TCSETS, TIOCSCTTY, FIONREAD,
            ] {
                assert_eq!(run(SYS_ioctl, [0, cmd, 0, 0, 0, 0]), ALLOW, "{cmd:#x}");
            }
        }
    }

    #[test]
    fn the_number_dispatch_changes_no_answer_and_shortens_the_path() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for shape in NetShape::ALL {
            let with = compile_seccomp_with(shape, true).unwrap().remove(0);
            let without = compile_seccomp_with(shape, false).unwrap().remove(0);
            assert!(
                with.len() != without.len()
                    && with[..program_head().len()] == without[..program_head().len()],
                "{shape:?}: no dispatch"
            );
            // Every constant the programs compare with, as an argument.
            let mut values: Vec<u64> = vec![0, 1, u64::MAX, 1 << 32];
            for f in &without {
                values.extend([
                    u64::from(f.k),
                    u64::from(f.k) << 32,
                    u64::from(f.k) | 1 << 40,
                ]);
            }
            values.sort_unstable();
            values.dedup();
            let numbers = (0..1024u32)
                .chain((0..1024).map(|n| n | 0x4000_0000))
                .chain([u32::MAX, 0x8000_0000, 0x3fff_ffff]);
            let mut checked = 0;
            for nr in numbers {
                for arch in [NATIVE_AUDIT_ARCH, 0x4000_0003, 0xc000_0028] {
                    let mut cases: Vec<[u64; 6]> = vec![[0; 6]];
                    if arch == NATIVE_AUDIT_ARCH && nr < 1024 {
                        for i in 0..6 {
                            for &v in &values {
                                let mut a = [0; 6];
                                a[i] = v;
                                cases.push(a);
                            }
                        }
                        for _ in 0..16 {
                            cases.push(std::array::from_fn(|_| next()));
                        }
                    }
                    for args in cases {
                        let (x, _) = run_bpf(&with, arch, nr, args);
                        let (y, _) = run_bpf(&without, arch, nr, args);
                        assert_eq!(x, y, "{shape:?} arch {arch:#x} nr {nr} args {args:?}");
                        checked += 1;
                    }
                }
            }
            assert!(checked > 100_000, "{checked}");
            // A syscall without rules is answered after a few comparisons.
            let (action, steps) = run_bpf(&with, NATIVE_AUDIT_ARCH, libc::SYS_read as u32, [0; 6]);
            let (_, before) = run_bpf(&without, NATIVE_AUDIT_ARCH, libc::SYS_read as u32, [0; 6]);
            assert_eq!(action, 0x7fff_0000);
            assert!(
                steps <= 20 && steps * 3 < before,
                "{shape:?}: {steps} vs {before}"
            );
            // One with rules (openat, the commonest) goes straight to its
            // block: 67 to 87 instructions down the chain, 31 or 32 so.
            let args = [
                libc::AT_FDCWD as u64,
                0x1000,
                libc::O_RDONLY as u64,
                0,
                0,
                0,
            ];
            let (action, steps) = run_bpf(&with, NATIVE_AUDIT_ARCH, libc::SYS_openat as u32, args);
            assert_eq!(action, 0x7fff_0000);
            assert!(steps <= 36, "{shape:?}: openat in {steps}");
        }
    }

    /// What a job installs is the same program whether the spawner
    /// compiled it ahead or the job compiles it, for every network intent
    /// (a port list changes Landlock's rules, not seccomp's).
    /// Every refused syscall and ioctl is named once and says why; each
    /// refused syscall is refused (EPERM) in every shape whatever its
    /// arguments.
    #[test]
    fn each_refusal_is_listed_once_with_its_reason() {
        let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
        let mut nrs: Vec<libc::c_long> = DENIED.iter().map(|&(nr, _)| nr).collect();
        nrs.sort_unstable();
        nrs.dedup();
        assert_eq!(nrs.len(), DENIED.len(), "a syscall listed twice");
        let mut cmds: Vec<u64> = REFUSED_IOCTLS.iter().map(|&(c, _)| c).collect();
        cmds.sort_unstable();
        cmds.dedup();
        assert_eq!(cmds.len(), REFUSED_IOCTLS.len(), "an ioctl listed twice");
        for (what, why) in DENIED.iter().map(|&(nr, why)| (nr.to_string(), why)).chain(
            REFUSED_IOCTLS
                .iter()
                .map(|&(c, why)| (format!("{c:#x}"), why)),
        ) {
            assert!(why.len() > 10, "{what}: no reason");
        }
        for shape in NetShape::ALL {
            let prog = compile_seccomp(shape).unwrap().remove(0);
            for &(nr, _) in DENIED {
                for args in [[0; 6], [u64::MAX; 6]] {
                    let (action, _) = run_bpf(&prog, NATIVE_AUDIT_ARCH, nr as u32, args);
                    assert_eq!(action, eperm, "{shape:?} nr {nr}");
                }
            }
        }
    }

    #[test]
    fn precompiled_seccomp_programs_are_the_compiled_ones() {
        let nets = [
            WireNet::Allow,
            WireNet::Deny,
            WireNet::Tcp(vec![443]),
            WireNet::Tcp(Vec::new()),
            WireNet::Egress { port: 8080 },
        ];
        let fresh: Vec<Vec<seccompiler::BpfProgram>> = nets
            .iter()
            .map(|n| seccomp_programs(n).unwrap().into_owned())
            .collect();
        for (n, f) in nets.iter().zip(&fresh) {
            // One program, the head's checks first, within the kernel's bound.
            assert_eq!(f.len(), 1, "{n:?}");
            let head = program_head();
            assert!(f[0].len() <= BPF_MAXINSNS, "{n:?}: {}", f[0].len());
            assert!(
                f[0].iter()
                    .zip(&head)
                    .all(|(x, y)| (x.code, x.jt, x.jf, x.k) == (y.code, y.jt, y.jf, y.k)),
                "{n:?}"
            );
        }
        precompile_seccomp().unwrap();
        for (n, f) in nets.iter().zip(&fresh) {
            let pre = seccomp_programs(n).unwrap();
            assert!(matches!(pre, std::borrow::Cow::Borrowed(_)), "{n:?}");
            let same = pre.len() == f.len()
                && pre.iter().zip(f).all(|(a, b)| {
                    a.len() == b.len()
                        && a.iter()
                            .zip(b)
                            .all(|(x, y)| (x.code, x.jt, x.jf, x.k) == (y.code, y.jt, y.jf, y.k))
                });
            assert!(same, "{n:?}");
        }
        // Allow, deny and a port list are three different programs.
        let size = |i: usize| fresh[i].iter().map(|p| p.len()).sum::<usize>();
        assert!(
            size(0) < size(1) && size(0) < size(2),
            "{:?}",
            [size(0), size(1), size(2)]
        );
    }
}
