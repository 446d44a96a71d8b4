//! `executor-test-deny MECHANISM[,MECHANISM] -- PROGRAM [ARGS...]`: run
//! PROGRAM (the agent, in the degraded-kernel tests) under a seccomp filter
//! that makes a kernel interface fail as an old or locked-down kernel's
//! does, so the agent's own probe meets the real failure:
//!
//! - `landlock`: every `landlock_*` call returns ENOSYS (a kernel before
//!   5.13, or built without Landlock);
//! - `userns`: `unshare` and `clone` with `CLONE_NEWUSER` return EPERM (RHEL
//!   7's default, `user.max_user_namespaces = 0`), and `clone3` ENOSYS so
//!   libc falls back to `clone`, whose flags a filter can read.
//!
//! The filter is installed here, before `exec`, and inherited by the agent
//! and everything it starts; nothing inside the agent knows about it.
//! Test-only: part of the test crate, never shipped.

use seccompiler::{
    SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
};
use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;

fn filter(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    errno: i32,
) -> Result<seccompiler::BpfProgram, String> {
    let arch =
        seccompiler::TargetArch::try_from(std::env::consts::ARCH).map_err(|e| e.to_string())?;
    let f = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        arch,
    )
    .map_err(|e| e.to_string())?;
    f.try_into()
        .map_err(|e: seccompiler::BackendError| e.to_string())
}

fn new_user_flag() -> Result<Vec<SeccompRule>, String> {
    let flag = libc::CLONE_NEWUSER as u64;
    let cond = SeccompCondition::new(
        0,
        SeccompCmpArgLen::Qword,
        SeccompCmpOp::MaskedEq(flag),
        flag,
    )
    .map_err(|e| e.to_string())?;
    Ok(vec![
        SeccompRule::new(vec![cond]).map_err(|e| e.to_string())?
    ])
}

fn programs(what: &str) -> Result<Vec<seccompiler::BpfProgram>, String> {
    let mut out = Vec::new();
    for mechanism in what.split(',') {
        match mechanism {
            "landlock" => out.push(filter(
                BTreeMap::from([
                    (libc::SYS_landlock_create_ruleset, vec![]),
                    (libc::SYS_landlock_add_rule, vec![]),
                    (libc::SYS_landlock_restrict_self, vec![]),
                ]),
                libc::ENOSYS,
            )?),
            "userns" => {
                out.push(filter(
                    BTreeMap::from([
                        (libc::SYS_unshare, new_user_flag()?),
                        (libc::SYS_clone, new_user_flag()?),
                    ]),
                    libc::EPERM,
                )?);
                out.push(filter(
                    BTreeMap::from([(libc::SYS_clone3, vec![])]),
                    libc::ENOSYS,
                )?);
            }
            other => return Err(format!("unknown mechanism {other:?} (landlock, userns)")),
        }
    }
    Ok(out)
}

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let (what, program) = match args.as_slice() {
        [what, dash, program, ..] if dash == "--" => (what.to_string_lossy().into_owned(), program),
        _ => {
            eprintln!("usage: executor-test-deny landlock|userns[,...] -- PROGRAM [ARGS...]");
            std::process::exit(2);
        }
    };
    let progs = programs(&what).unwrap_or_else(|e| {
        eprintln!("executor-test-deny: {e}");
        std::process::exit(2)
    });
    for p in &progs {
        // Sets no_new_privs first, as unprivileged filters need.
        if let Err(e) = seccompiler::apply_filter(p) {
            eprintln!("executor-test-deny: installing the filter: {e}");
            std::process::exit(2);
        }
    }
    let e = std::process::Command::new(program).args(&args[3..]).exec();
    eprintln!(
        "executor-test-deny: exec {}: {e}",
        program.to_string_lossy()
    );
    std::process::exit(127);
}
