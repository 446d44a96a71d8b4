//! macOS enforcement: a Seatbelt (SBPL) profile generated from a resolved
//! policy, run with `/usr/bin/sandbox-exec -p PROFILE -- argv…`.
//!
//! The generator is pure and platform-independent so it is tested here (on
//! Linux) with golden files; macOS cannot be run or even compile-checked on
//! this project's machines, so the `cfg(target_os = "macos")` part is only
//! the path of `sandbox-exec`.
//!
//! Shape of a profile: deny by default; a small base for any process to
//! start (exec, fork, its own signals, sysctl reads, terminal ioctls); read
//! and write rules from the roots; carve-outs *after* the allows (later
//! rules win in SBPL), plus `file-write-unlink` denied on the ancestors of
//! every carve-out so a denied path cannot be moved away by renaming a
//! parent; network only when allowed.

use crate::policy::{Policy, Root};
use executor_protocol::types::sandbox::NetworkIntent;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// `sandbox-exec` on macOS.
#[cfg(target_os = "macos")]
pub const SANDBOX_EXEC: &str = "/usr/bin/sandbox-exec";

/// Why a profile cannot be generated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("path {0:?} is not valid UTF-8 and cannot be written in a Seatbelt profile")]
    NotUtf8(PathBuf),
    #[error("the policy uses :tmp but no temp dir was given")]
    NoTmp,
}

/// `/var`, `/tmp` and `/etc` are symlinks into `/private` on macOS, and
/// Seatbelt matches the resolved path.
pub fn macos_canonical(p: &Path) -> PathBuf {
    for top in ["/var", "/tmp", "/etc"] {
        if p == Path::new(top) || p.starts_with(top) {
            return Path::new("/private").join(p.strip_prefix("/").unwrap_or(p));
        }
    }
    p.to_path_buf()
}

/// An SBPL string literal.
fn quote(p: &Path) -> Result<String, Error> {
    let s = p.to_str().ok_or_else(|| Error::NotUtf8(p.to_path_buf()))?;
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    Ok(out)
}

fn root_path(r: &Root, tmp: Option<&Path>) -> Result<PathBuf, Error> {
    match r {
        Root::Path(p) => Ok(macos_canonical(&p.path)),
        Root::Tmp => tmp.map(macos_canonical).ok_or(Error::NoTmp),
    }
}

const BASE: &str = "\
(version 1)
(deny default)
; any process must be able to start and run
(allow process-exec)
(allow process-fork)
(allow signal (target same-sandbox))
(allow sysctl-read)
(allow file-read-metadata)
(allow file-ioctl (literal \"/dev/tty\") (regex #\"^/dev/ttys[0-9]+$\"))
(allow pseudo-tty)
(allow file-read* file-write-data (literal \"/dev/null\") (literal \"/dev/tty\") (regex #\"^/dev/ttys[0-9]+$\"))
(allow file-read* (literal \"/dev/zero\") (literal \"/dev/random\") (literal \"/dev/urandom\"))
";

/// Generate the profile for `policy`; `tmp` is the process's private temp
/// dir when the policy uses `:tmp`.
pub fn profile(policy: &Policy, tmp: Option<&Path>) -> Result<String, Error> {
    let mut out = String::from(BASE);
    // Reads (a write root may also be read; a read root may also be executed).
    match &policy.read {
        None => out.push_str("(allow file-read*)\n"),
        Some(roots) => {
            let mut all: Vec<PathBuf> = Vec::new();
            for r in roots.iter().chain(policy.write.iter()) {
                let p = root_path(r, tmp)?;
                if !all.contains(&p) {
                    all.push(p);
                }
            }
            if !all.is_empty() {
                out.push_str("(allow file-read*");
                for p in &all {
                    write!(out, "\n    (subpath {})", quote(p)?).ok();
                }
                out.push_str(")\n");
            }
        }
    }
    if !policy.write.is_empty() {
        out.push_str("(allow file-write*");
        for r in &policy.write {
            write!(out, "\n    (subpath {})", quote(&root_path(r, tmp)?)?).ok();
        }
        out.push_str(")\n");
    }
    // Carve-outs after the allows: later rules win.
    for (kind, list) in [
        ("file-read*", &policy.deny_read),
        ("file-write*", &policy.deny_write),
    ] {
        for p in list {
            let p = macos_canonical(p);
            writeln!(out, "(deny {kind} (subpath {}))", quote(&p)?).ok();
        }
    }
    // A carve-out cannot be moved away by renaming one of its ancestors.
    let mut ancestors: Vec<PathBuf> = Vec::new();
    for p in policy.deny_read.iter().chain(policy.deny_write.iter()) {
        let p = macos_canonical(p);
        for a in p.ancestors().skip(1) {
            if a != Path::new("/") && !ancestors.iter().any(|x| x == a) {
                ancestors.push(a.to_path_buf());
            }
        }
    }
    if !ancestors.is_empty() {
        out.push_str("(deny file-write-unlink");
        for a in &ancestors {
            write!(out, "\n    (literal {})", quote(a)?).ok();
        }
        out.push_str(")\n");
    }
    match &policy.network {
        // Egress by name needs the job's own network namespace (Linux):
        // here it is "deny" (the agent refuses or reports it degraded).
        NetworkIntent::Deny | NetworkIntent::AllowHosts(_) => {}
        NetworkIntent::Allow => {
            out.push_str("(allow network-outbound)\n(allow network-inbound)\n(allow system-socket)\n(allow mach-lookup)\n")
        }
        NetworkIntent::AllowTcpConnect(ports) => {
            if !ports.is_empty() {
                out.push_str("(allow network-outbound");
                for port in ports {
                    write!(out, "\n    (remote tcp \"*:{port}\")").ok();
                }
                out.push_str(")\n");
            }
        }
    }
    Ok(out)
}

/// The command line that runs `argv` under `profile` on macOS.
pub fn command_line(profile: &str, argv: &[String]) -> Vec<String> {
    let mut v = vec![
        "/usr/bin/sandbox-exec".to_string(),
        "-p".into(),
        profile.to_string(),
        "--".into(),
    ];
    v.extend(argv.iter().cloned());
    v
}
