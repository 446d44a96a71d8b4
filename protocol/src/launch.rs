//! The remote command that starts the agent over SSH when the client was
//! given no path: the copy `bootstrap` installed for the client's version
//! (`$HOME/.local/lib/executor/<version>/executor`) if it is there and
//! executable, else `executor` from the PATH. Before it execs, the remote
//! side writes one [`MARKER`] line on stderr naming which it runs; the
//! client takes that line out of the agent's stderr and logs it.
//!
//! The command is `sh -c '…'` so that it means the same under any login
//! shell (bash, zsh, fish, tcsh): only single quotes reach that shell. The
//! agent, run as an `authorized_keys` forced command, recognises exactly
//! this text in `SSH_ORIGINAL_COMMAND` ([`version_of`]) and serves (the
//! forced command already chose the binary).
//!
//! Pure text: no I/O here, like the rest of this crate.

/// The start of the stderr line naming the program the launcher runs.
pub const MARKER: &str = "executor-launch: ";

/// Where `bootstrap` installs the agent of `version` by default (a shell
/// word: `$HOME` is expanded on the host).
pub fn installed_path(version: &str) -> String {
    format!("$HOME/.local/lib/executor/{version}/executor")
}

fn plain_version(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 64
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._+-".contains(&b))
}

/// The remote command for a client of `version` (which must be a plain
/// version string: digits, letters, `.`, `_`, `+`, `-`).
pub fn command(version: &str) -> Option<String> {
    plain_version(version).then(|| {
        format!(
            "sh -c 'p=\"{path}\"; if [ -x \"$p\" ]; then echo \"{MARKER}$p\" >&2; exec \"$p\"; fi; \
             echo \"{MARKER}executor from the PATH\" >&2; exec executor'",
            path = installed_path(version)
        )
    })
}

/// The version a launcher command was made for, when `text` is exactly
/// [`command`] of some version.
pub fn version_of(text: &str) -> Option<&str> {
    let rest = text.strip_prefix("sh -c 'p=\"$HOME/.local/lib/executor/")?;
    let version = rest.split('/').next()?;
    (command(version)? == text).then_some(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_only_exact_text() {
        let c = command("0.1.0").unwrap();
        assert_eq!(version_of(&c), Some("0.1.0"));
        assert!(c.contains("$HOME/.local/lib/executor/0.1.0/executor"));
        assert_eq!(command("0.1.0; rm -rf /"), None);
        assert_eq!(command("$(id)"), None);
        assert_eq!(command(""), None);
        for bad in [
            format!("{c}; id"),
            c.replace("exec executor", "exec sh"),
            c.replace("0.1.0", "0.1.0/../../x"),
            "sh -c 'p=\"$HOME/.local/lib/executor/".to_string(),
        ] {
            assert_eq!(version_of(&bad), None, "{bad}");
        }
    }
}
