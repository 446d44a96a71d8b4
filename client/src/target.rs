//! Where the agent runs: a [`Target`] is an ordered list of [`Transport`]s,
//! each a way to start an agent speaking on stdio (the local `executor`,
//! the system `ssh`, any command), tried in turn by
//! [`Client::connect_target`](crate::Client::connect_target). Parsing a
//! command line's `--target` is the CLI's business (`executor-cli`), not
//! this module's.

use crate::Error;
use std::ffi::OsString;

/// One way to start an agent that speaks the protocol on its stdio.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Transport {
    /// The local `executor`: `$EXECUTOR_BIN`, else the one next to the
    /// running program ([`local_executor`]), in its own process group.
    Local,
    /// `ssh -T [options] -- [user@]host executor` with the system ssh
    /// ([`SshOptions::command`]).
    Ssh { host: String, options: SshOptions },
    /// Any command (its argv; the first word is the program), e.g. an
    /// agent in a container: `["docker", "exec", "-i", "box", "executor"]`.
    Command(Vec<OsString>),
}

impl Transport {
    /// The command that starts the agent.
    pub fn command(&self) -> Result<tokio::process::Command, Error> {
        match self {
            Transport::Local => {
                let mut cmd = tokio::process::Command::new(local_executor()?);
                // Its own process group: a Ctrl-C on the terminal reaches
                // the client only, which decides what the jobs get.
                cmd.process_group(0);
                Ok(cmd)
            }
            Transport::Ssh { host, options } => options.command(host),
            Transport::Command(argv) => {
                let (program, args) = argv.split_first().ok_or_else(|| Error::Spawn {
                    program: String::new(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        "an empty command line",
                    ),
                })?;
                let mut cmd = tokio::process::Command::new(program);
                cmd.args(args);
                Ok(cmd)
            }
        }
    }
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Transport::Local => f.write_str("local"),
            Transport::Ssh { host, options } => match &options.user {
                Some(u) => write!(f, "ssh {u}@{host}"),
                None => write!(f, "ssh {host}"),
            },
            Transport::Command(argv) => {
                let words: Vec<_> = argv.iter().map(|a| a.to_string_lossy()).collect();
                write!(f, "command {:?}", words.join(" "))
            }
        }
    }
}

/// A place to run the agent: the transports to it, tried in order until
/// one connects.
///
/// ```
/// use executor_client::target::{Target, Transport};
///
/// let devbox = Target::ssh("me@devbox");
/// // A container's agent first, then the host's over ssh.
/// let either = Target::command(["docker", "exec", "-i", "box", "executor"]).or(devbox);
/// assert_eq!(either.transports().len(), 2);
/// assert!(matches!(Target::local().transports(), [Transport::Local]));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    transports: Vec<Transport>,
}

impl Target {
    /// These transports, in the order they are tried.
    pub fn new(transports: Vec<Transport>) -> Target {
        Target { transports }
    }

    /// The local `executor` ([`Transport::Local`]).
    pub fn local() -> Target {
        Target::new(vec![Transport::Local])
    }

    /// The agent on `destination`, `[user@]host` as ssh takes it (a Host
    /// alias of `~/.ssh/config` included), over the system `ssh` with its
    /// defaults. Checked when connecting: a host or user that ssh could
    /// take for an option, or that holds anything but letters, digits and
    /// `._-[]:`, is refused then ([`Error::Spawn`], naming it).
    pub fn ssh(destination: &str) -> Target {
        let (user, host) = match destination.rsplit_once('@') {
            Some((u, h)) => (Some(u.to_string()), h),
            None => (None, destination),
        };
        Target::ssh_with(
            host,
            SshOptions {
                user,
                ..SshOptions::default()
            },
        )
    }

    /// The agent on `host` over the system `ssh` with `options` (port,
    /// identity, `-o` options, a subsystem, the remote command…).
    pub fn ssh_with(host: impl Into<String>, options: SshOptions) -> Target {
        Target::new(vec![Transport::Ssh {
            host: host.into(),
            options,
        }])
    }

    /// The agent a command starts (`argv[0]` is the program).
    pub fn command<I, S>(argv: I) -> Target
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        Target::new(vec![Transport::Command(
            argv.into_iter().map(Into::into).collect(),
        )])
    }

    /// This target's transports, then `next`'s: tried when none of these
    /// connects.
    pub fn or(mut self, next: Target) -> Target {
        self.transports.extend(next.transports);
        self
    }

    /// The transports, in the order they are tried.
    pub fn transports(&self) -> &[Transport] {
        &self.transports
    }
}

impl From<Transport> for Target {
    fn from(t: Transport) -> Target {
        Target::new(vec![t])
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

    fn args(cmd: &tokio::process::Command) -> Vec<String> {
        cmd.as_std()
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn targets_are_transports_in_order() {
        let t = Target::ssh("me@box").or(Target::local());
        assert_eq!(
            t.transports(),
            &[
                Transport::Ssh {
                    host: "box".into(),
                    options: SshOptions {
                        user: Some("me".into()),
                        ..SshOptions::default()
                    }
                },
                Transport::Local
            ]
        );
        assert_eq!(t.transports()[0].to_string(), "ssh me@box");
        let c = Target::command(["docker", "exec", "-i", "box", "executor"]);
        let cmd = c.transports()[0].command().unwrap();
        assert_eq!(cmd.as_std().get_program(), "docker");
        assert_eq!(args(&cmd), ["exec", "-i", "box", "executor"]);
        let empty = Target::command(Vec::<String>::new());
        assert!(matches!(
            empty.transports()[0].command(),
            Err(Error::Spawn { .. })
        ));
        // Checked when the command is made: nothing ssh takes for an option.
        assert!(matches!(
            Target::ssh("-oProxyCommand=x").transports()[0].command(),
            Err(Error::Spawn { .. })
        ));
        assert!(Target::ssh("a b").transports()[0].command().is_err());
    }

    #[test]
    fn ssh_command_lines() {
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
        assert_eq!(
            args(&cmd),
            vec!["-T", "-p", "22", "-s", "--", "box", "executor"]
        );
        // Not a subsystem, no path given: the launcher (installed copy first).
        let cmd = SshOptions::default().command("box").unwrap();
        let last = args(&cmd).pop().unwrap();
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
        let o = SshOptions {
            jump: Some("-oProxyCommand=x".into()),
            ..Default::default()
        };
        assert!(o.command("box").is_err());
        let o = SshOptions {
            user: Some("me".into()),
            ..Default::default()
        };
        let cmd = o.command("::1").unwrap();
        assert!(args(&cmd).contains(&"me@::1".to_string()));
    }
}
