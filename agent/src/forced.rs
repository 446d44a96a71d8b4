//! Running as an `authorized_keys` forced command
//! (`command="executor --profile ci",restrict`): sshd runs us whatever the
//! client asked, and puts the client's request in `SSH_ORIGINAL_COMMAND`.
//! Only a tiny grammar is accepted, so a key meant for the executor cannot
//! be used to run anything else through us:
//!
//! - empty (no command requested), or
//! - `executor` or any path ending in `/executor`, with no arguments
//!   (serve) or exactly `--version`.
//!
//! Anything else is refused before the preamble, with a message on stderr.

/// What to do with the client's original command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forced {
    /// Serve the protocol.
    Serve,
    /// Print the version and exit.
    Version,
    /// Refuse, with the reason.
    Refuse(String),
}

/// Judge `SSH_ORIGINAL_COMMAND`.
pub fn judge(original: &str) -> Forced {
    let words: Vec<&str> = original.split_whitespace().collect();
    let Some((program, args)) = words.split_first() else {
        return Forced::Serve;
    };
    let named_executor = *program == "executor" || program.ends_with("/executor");
    let plain = |w: &str| {
        w.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-~+".contains(&b))
    };
    if !named_executor || !plain(program) {
        return Forced::Refuse(format!(
            "this key may only run the executor agent; refused command {original:?}"
        ));
    }
    match args {
        [] => Forced::Serve,
        ["--version"] => Forced::Version,
        _ => Forced::Refuse(format!(
            "this key may only run the executor agent without arguments (or --version); refused command {original:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grammar() {
        assert_eq!(judge(""), Forced::Serve);
        assert_eq!(judge("   "), Forced::Serve);
        assert_eq!(judge("executor"), Forced::Serve);
        assert_eq!(judge("/usr/local/bin/executor"), Forced::Serve);
        assert_eq!(judge("~/.local/lib/executor/0.1.0/executor"), Forced::Serve);
        assert_eq!(judge("executor --version"), Forced::Version);
        for bad in [
            "rm -rf /",
            "executor; rm -rf /",
            "executor --config /tmp/evil.toml",
            "executor sandbox-exec --exec /bin/sh '' -- sh",
            "/bin/executorx",
            "bash -c executor",
            "$(executor)",
            "executor&&id",
        ] {
            assert!(matches!(judge(bad), Forced::Refuse(_)), "{bad}");
        }
    }
}
