//! Detached sessions as a tmux or nohup user expects them: `run --detach`
//! and `attach` leave the job running when the client's terminal goes
//! (SIGHUP), when it is told to stop (SIGTERM), and on the detach key
//! (`~.` at the start of a line, ssh's escape; `~~` sends one `~`); each
//! says how to reattach with a command that works as printed (the
//! connection flags as given). The resume tokens live in the client's
//! token store ([`TokenStore`]), one file per session, removed when the
//! session ended (its job's exit was shown, the agent said it expired) or
//! its TTL ran out.
//!
//! Depends on `connect` (the flags), `quote` (shell quoting) and the client
//! library's session types.

use super::connect::ConnectArgs;
use super::exit::Outside;
use anyhow::Context;
use executor_client::protocol::types::session::{ResumeParams, SessionParams};
use executor_client::Client;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// The TTL assumed for a token file without one (written by an older
/// client): the agent's largest (`max_detach_ttl_ms`).
const LEGACY_TTL: Duration = Duration::from_secs(24 * 3600);

/// The detach key's state: `~` then `.` at the start of a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Escape {
    /// After a newline (or at the start): a `~` may begin the escape.
    LineStart,
    /// A `~` at the start of a line, held back.
    Tilde,
    /// In a line.
    Text,
}

/// What a chunk of terminal input means.
#[derive(Debug, PartialEq, Eq)]
pub struct Scanned {
    /// The bytes for the job (the escape taken out).
    pub data: Vec<u8>,
    /// The detach key was typed (what followed it is dropped).
    pub detach: bool,
}

impl Escape {
    /// Scan `input`, as ssh does with its `~` escape: `~.` at the start of
    /// a line detaches, `~~` sends one `~`, a `~` followed by anything else
    /// is sent as it is with what follows.
    pub fn scan(&mut self, input: &[u8]) -> Scanned {
        let mut data = Vec::with_capacity(input.len());
        for &b in input {
            *self = match (*self, b) {
                (Escape::Tilde, b'.') => {
                    return Scanned { data, detach: true };
                }
                (Escape::Tilde, b'~') => {
                    data.push(b'~');
                    Escape::Text
                }
                (Escape::Tilde, b) => {
                    data.extend_from_slice(&[b'~', b]);
                    after(b)
                }
                (Escape::LineStart, b'~') => Escape::Tilde,
                (_, b) => {
                    data.push(b);
                    after(b)
                }
            };
        }
        Scanned {
            data,
            detach: false,
        }
    }
}

fn after(b: u8) -> Escape {
    if b == b'\r' || b == b'\n' {
        Escape::LineStart
    } else {
        Escape::Text
    }
}

/// The reattach command: this program as it was started, the connection
/// flags as given, `attach SESSION PROCESS`, each word shell-quoted.
pub fn reattach_command(conn: &ConnectArgs, session: &str, process: &str) -> String {
    let program = std::env::args_os()
        .next()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|| "executor-client".into());
    let mut words: Vec<String> = vec![program];
    let mut flag = |name: &str, value: String| {
        words.push(name.into());
        words.push(value);
    };
    if let Some(i) = &conn.identity {
        flag("-i", i.to_string_lossy().into_owned());
    }
    if let Some(f) = &conn.config {
        flag("-F", f.to_string_lossy().into_owned());
    }
    for o in &conn.options {
        flag("-o", o.clone());
    }
    if let Some(j) = &conn.jump {
        flag("-J", j.clone());
    }
    if let Some(p) = conn.port {
        flag("-p", p.to_string());
    }
    if let Some(l) = &conn.login {
        flag("-l", l.clone());
    }
    if conn.remote_command != "executor" {
        flag("--remote-command", conn.remote_command.clone());
    }
    if conn.connect_timeout != 30.0 {
        flag("--connect-timeout", conn.connect_timeout.to_string());
    }
    flag("--target", conn.target.clone());
    if conn.subsystem {
        words.push("--subsystem".into());
    }
    words.extend(["attach".into(), session.into(), process.into()]);
    words
        .iter()
        .map(|w| super::quote::shell_escape(w.as_bytes()).into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Tell the user (on stderr, which may be gone with the terminal: a
/// failed write is ignored) that the job runs on, and how to reattach.
pub fn tell_detached(why: &str, command: &str) {
    let _ = writeln!(
        std::io::stderr(),
        "executor-client: {why}: detached; the job runs on. Reattach: {}",
        super::exit::shown(command)
    );
}

/// The client's resume tokens: `$XDG_RUNTIME_DIR/executor-client/SESSION`
/// (else `~/.cache/executor-client/SESSION`), mode 0600 in a 0700
/// directory, holding the token and the session's TTL in seconds; the
/// file is written again whenever a client leaves the session, so its
/// mtime plus the TTL is when the agent ends the session unless resumed.
#[derive(Debug)]
pub struct TokenStore {
    dir: PathBuf,
}

impl TokenStore {
    pub fn open() -> anyhow::Result<TokenStore> {
        let base = std::env::var_os("XDG_RUNTIME_DIR")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .context("neither XDG_RUNTIME_DIR nor HOME is set")?;
        Ok(TokenStore {
            dir: base.join("executor-client"),
        })
    }

    fn path(&self, session: &str) -> anyhow::Result<PathBuf> {
        if session.is_empty()
            || !session
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(Outside(format!("{session:?} is not a session id")).into());
        }
        Ok(self.dir.join(session))
    }

    /// Keep the token of the client's session, whose TTL is `ttl`.
    pub fn save(&self, client: &Client, ttl: Duration) -> anyhow::Result<()> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        self.sweep();
        let init = client.initialize_result();
        let path = self.path(&init.session_id)?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .with_context(|| format!("creating {}", self.dir.display()))?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("writing {}", path.display()))?;
        writeln!(f, "{}\n{}", init.resume_token, ttl.as_secs())
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(())
    }

    /// The options that resume `session` (its token, as saved), and the
    /// session's TTL.
    pub fn resume(&self, session: &str) -> anyhow::Result<(SessionParams, Duration)> {
        self.sweep();
        let path = self.path(session)?;
        let text = std::fs::read_to_string(&path).map_err(|e| {
            Outside(format!(
                "no token for session {session} ({}: {e}); it ended, expired, or was started elsewhere",
                path.display()
            ))
        })?;
        let mut lines = text.lines();
        let token = lines.next().unwrap_or_default().trim().to_string();
        let ttl = lines
            .next()
            .and_then(|l| l.trim().parse::<u64>().ok())
            .map_or(LEGACY_TTL, Duration::from_secs);
        let params = SessionParams {
            resume: Some(ResumeParams {
                session_id: session.to_string(),
                token,
            }),
            detach_ttl_ms: None,
        };
        Ok((params, ttl))
    }

    /// `session` ended (or the agent no longer knows it): forget its token.
    pub fn remove(&self, session: &str) {
        if let Ok(path) = self.path(session) {
            match std::fs::remove_file(&path) {
                Ok(()) => tracing::debug!(session, "removed the session's resume token"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot remove a resume token")
                }
            }
        }
    }

    /// Remove the tokens whose session's TTL ran out since a client last
    /// left it.
    pub fn sweep(&self) {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in dir.flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if !meta.is_file() {
                continue;
            }
            let ttl = std::fs::read_to_string(&path)
                .ok()
                .and_then(|t| t.lines().nth(1).and_then(|l| l.trim().parse::<u64>().ok()))
                .map_or(LEGACY_TTL, Duration::from_secs);
            let expired = meta
                .modified()
                .ok()
                .and_then(|m| m.elapsed().ok())
                .is_some_and(|age| age > ttl);
            if expired {
                tracing::debug!(path = %path.display(), "removing an expired session's resume token");
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_escape_is_tilde_dot_at_the_start_of_a_line() {
        let mut e = Escape::LineStart;
        assert!(e.scan(b"~.").detach);
        let mut e = Escape::LineStart;
        let s = e.scan(b"a~.b\r~~x\r~y");
        assert!(!s.detach);
        assert_eq!(s.data, b"a~.b\r~x\r~y");
        // Split across reads.
        let mut e = Escape::Text;
        assert_eq!(e.scan(b"ls\r").data, b"ls\r");
        assert_eq!(e.scan(b"~").data, b"");
        let s = e.scan(b".rest");
        assert!(s.detach);
        assert!(s.data.is_empty());
    }
}
