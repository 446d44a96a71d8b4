//! Where the agent runs: locally, or over the system `ssh`.

use crate::Error;

/// A place to run the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The `executor` next to the running binary (or `$EXECUTOR_BIN`).
    Local,
    /// `ssh -T [-p PORT] [USER@]HOST executor`.
    Ssh {
        user: Option<String>,
        host: String,
        port: Option<u16>,
    },
}

impl Target {
    /// Parse `local`, `ssh://[user@]host[:port]` or a plain `[user@]host`.
    pub fn parse(s: &str) -> Result<Target, String> {
        if s == "local" {
            return Ok(Target::Local);
        }
        let rest = s.strip_prefix("ssh://").unwrap_or(s);
        let rest = rest.trim_end_matches('/');
        let (user, hostport) = match rest.rsplit_once('@') {
            Some((u, h)) => (Some(u.to_string()), h),
            None => (None, rest),
        };
        let (host, port) = match hostport.strip_prefix('[') {
            // `[v6]` or `[v6]:port`: the brackets are the URL's, not ssh's.
            Some(inner) => {
                let (h, after) = inner
                    .split_once(']')
                    .ok_or_else(|| format!("unclosed [ in target {s:?}"))?;
                let port = match after {
                    "" => None,
                    p => Some(
                        p.strip_prefix(':')
                            .and_then(|p| p.parse::<u16>().ok())
                            .ok_or_else(|| format!("invalid port {p:?} in target {s:?}"))?,
                    ),
                };
                (h.to_string(), port)
            }
            None => match hostport.rsplit_once(':') {
                Some((h, p)) if !h.contains(':') => {
                    let port = p
                        .parse::<u16>()
                        .map_err(|_| format!("invalid port {p:?} in target {s:?}"))?;
                    (h.to_string(), Some(port))
                }
                _ => (hostport.to_string(), None),
            },
        };
        let valid = |v: &str| {
            !v.is_empty()
                && !v.starts_with('-')
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-[]:".contains(c))
        };
        if !valid(&host) {
            return Err(format!("invalid host {host:?} in target {s:?}"));
        }
        if let Some(u) = &user {
            if !valid(u) {
                return Err(format!("invalid user {u:?} in target {s:?}"));
            }
        }
        Ok(Target::Ssh { user, host, port })
    }

    /// The command that starts an agent speaking on its stdio.
    pub fn command(&self) -> Result<tokio::process::Command, Error> {
        match self {
            Target::Local => {
                let bin = local_executor()?;
                let mut cmd = tokio::process::Command::new(bin);
                // Its own process group: a Ctrl-C on the terminal reaches
                // the client only, which decides what the jobs get.
                cmd.process_group(0);
                Ok(cmd)
            }
            Target::Ssh { user, host, port } => {
                let opts = SshOptions {
                    user: user.clone(),
                    port: *port,
                    ..SshOptions::default()
                };
                opts.command(host)
            }
        }
    }
}

/// How to reach an agent with the system `ssh` (so `~/.ssh/config`,
/// ProxyJump, certificates, agents and ControlMaster all keep working).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshOptions {
    /// Remote user (else ssh's default).
    pub user: Option<String>,
    /// Remote port (else ssh's default).
    pub port: Option<u16>,
    /// `-i IDENTITY`.
    pub identity: Option<std::path::PathBuf>,
    /// Extra `-o KEY=VALUE` options, each passed as its own argument.
    pub options: Vec<String>,
    /// `-F CONFIG`: the ssh configuration file.
    pub config: Option<std::path::PathBuf>,
    /// `-J DESTINATION[,…]`: ProxyJump hosts.
    pub jump: Option<String>,
    /// Request the `executor` subsystem (`ssh -s`) instead of a command.
    pub subsystem: bool,
    /// The remote command (or subsystem name): a plain path, never a shell
    /// string. Default `executor`, which runs the launcher of
    /// `executor_protocol::launch`: the copy `bootstrap` installed for this
    /// client's version (`~/.local/lib/executor/<version>/executor`) if the
    /// host has it, else `executor` from the PATH (the one used is logged
    /// at info level, target `executor_client`).
    pub remote_command: String,
    /// The ssh program. Default `ssh`.
    pub ssh_program: std::path::PathBuf,
}

impl Default for SshOptions {
    fn default() -> Self {
        SshOptions {
            user: None,
            port: None,
            identity: None,
            options: Vec::new(),
            config: None,
            jump: None,
            subsystem: false,
            remote_command: "executor".into(),
            ssh_program: "ssh".into(),
        }
    }
}

fn bad(what: &str, v: &str) -> Error {
    Error::Spawn {
        program: "ssh".into(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("invalid {what} {v:?}"),
        ),
    }
}

/// What the host is asked to run (or the subsystem's name): `remote` must
/// be one plain word (the remote shell would split or expand anything
/// else); the default `executor` (not as a subsystem) becomes the launcher
/// of `executor_protocol::launch`, which runs the bootstrapped copy for this
/// client's version when the host has it. Both transports send this text.
pub(crate) fn remote_command_text(remote: &str, subsystem: bool) -> Result<String, Error> {
    if remote.is_empty()
        || remote.starts_with('-')
        || !remote
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-~+".contains(c))
    {
        return Err(bad("remote command", remote));
    }
    match executor_protocol::launch::command(env!("CARGO_PKG_VERSION")) {
        Some(launcher) if remote == "executor" && !subsystem => {
            tracing::debug!(
                installed = %executor_protocol::launch::installed_path(env!("CARGO_PKG_VERSION")),
                "starting the agent: the bootstrapped copy if the host has it, else executor from the PATH"
            );
            Ok(launcher)
        }
        _ => Ok(remote.to_string()),
    }
}

impl SshOptions {
    /// The `ssh` command line for `host`. Every part is validated: the
    /// remote side receives one plain word (the remote shell would split or
    /// expand anything else), and nothing can be taken for an ssh option.
    pub fn command(&self, host: &str) -> Result<tokio::process::Command, Error> {
        let text = remote_command_text(&self.remote_command, self.subsystem)?;
        let mut cmd = self.base_command(host)?;
        cmd.arg(text);
        Ok(cmd)
    }

    /// `ssh -T [options] [-s] -- [user@]host`, without the remote command.
    pub(crate) fn base_command(&self, host: &str) -> Result<tokio::process::Command, Error> {
        let word = |v: &str| {
            !v.is_empty()
                && !v.starts_with('-')
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-[]:".contains(c))
        };
        if !word(host) {
            return Err(bad("host", host));
        }
        if let Some(u) = &self.user {
            if !word(u) {
                return Err(bad("user", u));
            }
        }
        let mut cmd = tokio::process::Command::new(&self.ssh_program);
        cmd.arg("-T");
        if let Some(p) = self.port {
            cmd.arg("-p").arg(p.to_string());
        }
        if let Some(i) = &self.identity {
            cmd.arg("-i").arg(i);
        }
        if let Some(f) = &self.config {
            cmd.arg("-F").arg(f);
        }
        if let Some(j) = &self.jump {
            if j.is_empty() || j.starts_with('-') || j.chars().any(char::is_whitespace) {
                return Err(bad("ProxyJump", j));
            }
            cmd.arg("-J").arg(j);
        }
        for o in &self.options {
            if !o.contains('=') || o.contains('\n') || o.starts_with('-') {
                return Err(bad("ssh option", o));
            }
            cmd.arg("-o").arg(o);
        }
        if self.subsystem {
            cmd.arg("-s");
        }
        let dest = match &self.user {
            Some(u) => format!("{u}@{host}"),
            None => host.to_string(),
        };
        cmd.arg("--").arg(dest);
        Ok(cmd)
    }
}

/// `$EXECUTOR_BIN`, else `executor` next to the current executable (or one
/// directory up, for test binaries in `target/*/deps`).
pub fn local_executor() -> Result<std::path::PathBuf, Error> {
    if let Some(p) = std::env::var_os("EXECUTOR_BIN") {
        return Ok(p.into());
    }
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().map(|p| p.to_path_buf());
    for _ in 0..2 {
        if let Some(d) = dir {
            let candidate = d.join("executor");
            if candidate.is_file() {
                return Ok(candidate);
            }
            dir = d.parent().map(|p| p.to_path_buf());
        }
    }
    Err(Error::Spawn {
        program: "executor".into(),
        source: std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!(
                "no `executor` binary next to {} (set EXECUTOR_BIN)",
                exe.display()
            ),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_targets() {
        assert_eq!(Target::parse("local").unwrap(), Target::Local);
        assert_eq!(
            Target::parse("ssh://me@box:2222").unwrap(),
            Target::Ssh {
                user: Some("me".into()),
                host: "box".into(),
                port: Some(2222)
            }
        );
        assert_eq!(
            Target::parse("devbox").unwrap(),
            Target::Ssh {
                user: None,
                host: "devbox".into(),
                port: None
            }
        );
        assert!(Target::parse("-oProxyCommand=x").is_err());
        let o = SshOptions {
            remote_command: "executor; rm -rf /".into(),
            ..Default::default()
        };
        assert!(o.command("box").is_err());
        let o = SshOptions {
            options: vec!["-oProxyCommand=x".into()],
            ..Default::default()
        };
        assert!(o.command("box").is_err());
        let o = SshOptions {
            port: Some(22),
            subsystem: true,
            ..Default::default()
        };
        let cmd = o.command("box").unwrap();
        let args: Vec<_> = cmd
            .as_std()
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(args, vec!["-T", "-p", "22", "-s", "--", "box", "executor"]);
        // Not a subsystem, no path given: the launcher (installed copy first).
        let cmd = SshOptions::default().command("box").unwrap();
        let last = cmd
            .as_std()
            .get_args()
            .last()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert_eq!(
            executor_protocol::launch::version_of(&last),
            Some(env!("CARGO_PKG_VERSION"))
        );
        // A path given: exactly that.
        let o = SshOptions {
            remote_command: "/opt/executor".into(),
            ..Default::default()
        };
        let cmd = o.command("box").unwrap();
        assert_eq!(cmd.as_std().get_args().last().unwrap(), "/opt/executor");
        assert!(Target::parse("ssh://a b").is_err());
        assert_eq!(
            Target::parse("ssh://me@[::1]:2222").unwrap(),
            Target::Ssh {
                user: Some("me".into()),
                host: "::1".into(),
                port: Some(2222)
            }
        );
        assert_eq!(
            Target::parse("[::1]").unwrap(),
            Target::Ssh {
                user: None,
                host: "::1".into(),
                port: None
            }
        );
        let o = SshOptions {
            jump: Some("-oProxyCommand=x".into()),
            ..Default::default()
        };
        assert!(o.command("box").is_err());
    }
}
