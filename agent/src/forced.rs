//! Running as an `authorized_keys` forced command
//! (`command="executor --profile ci",restrict`): sshd runs us whatever the
//! client asked, and puts the client's request in `SSH_ORIGINAL_COMMAND`.
//! Only a tiny grammar is accepted, so a key meant for the executor cannot
//! be used to run anything else through us:
//!
//! - empty (no command requested), or
//! - `executor` or any path ending in `/executor`, with no arguments
//!   (serve) or exactly `--version`, or
//! - exactly the client's launcher (`executor_protocol::launch`: try the
//!   bootstrapped copy, then the PATH): serve, or
//! - `executor codex-exec-server`, alone or with `--listen stdio`: serve
//!   the Codex dialect (the key's `--profile` applies to it all the same).
//!
//! Anything else is refused before the preamble, with one line on stderr
//! (the refused command shown cut to 80 characters).

/// What to do with the client's original command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forced {
    /// Serve the protocol.
    Serve,
    /// Serve the Codex dialect on stdio.
    ServeCodex,
    /// Print the version and exit.
    Version,
    /// Refuse, with the reason.
    Refuse(String),
}

/// Judge `SSH_ORIGINAL_COMMAND`.
pub fn judge(original: &str) -> Forced {
    if executor_protocol::launch::version_of(original.trim()).is_some() {
        return Forced::Serve;
    }
    let shown = shorten(original);
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
            "this key may only run the executor agent; refused command {shown}"
        ));
    }
    match args {
        [] => Forced::Serve,
        ["--version"] => Forced::Version,
        ["codex-exec-server"]
        | ["codex-exec-server", "--listen", "stdio" | "stdio://"]
        | ["codex-exec-server", "--listen=stdio" | "--listen=stdio://"] => Forced::ServeCodex,
        _ => Forced::Refuse(format!(
            "this key may only run the executor agent without arguments (or --version); refused command {shown}"
        )),
    }
}

/// `original` quoted, on one line, at most 80 characters of it.
fn shorten(original: &str) -> String {
    let one_line = original.split_whitespace().collect::<Vec<_>>().join(" ");
    match one_line.char_indices().nth(80) {
        Some((at, _)) => format!("{:?}…", &one_line[..at]),
        None => format!("{one_line:?}"),
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
        assert_eq!(judge("executor codex-exec-server"), Forced::ServeCodex);
        assert_eq!(
            judge("/opt/bin/executor codex-exec-server --listen stdio"),
            Forced::ServeCodex
        );
        assert!(matches!(
            judge("executor codex-exec-server --listen ws://0.0.0.0:9"),
            Forced::Refuse(_)
        ));
        for ws in [
            "executor codex-exec-server --listen ws://127.0.0.1:0",
            "executor codex-exec-server --listen=ws://127.0.0.1:0",
            "executor codex-exec-server --listen stdio --listen ws://127.0.0.1:0",
        ] {
            assert!(matches!(judge(ws), Forced::Refuse(_)), "{ws}");
        }
        assert!(matches!(
            judge("executor codex-exec-server --config /tmp/x"),
            Forced::Refuse(_)
        ));
        let launcher = executor_protocol::launch::command("0.1.0").unwrap();
        assert_eq!(judge(&launcher), Forced::Serve);
        assert!(matches!(
            judge(&format!("{launcher}; id")),
            Forced::Refuse(_)
        ));
        let Forced::Refuse(long) = judge(&format!("set -e\n{}", "x ".repeat(500))) else {
            panic!()
        };
        assert!(long.len() < 250 && !long.contains('\n'), "{long}");
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
