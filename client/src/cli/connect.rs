//! The target and the ssh options (OpenSSH's flags where they mean the same
//! thing), and connecting: bounded by `--connect-timeout`, with the terminal
//! handed to ssh while it may prompt.

use super::exit::Outside;
use super::logging::LogArgs;
use anyhow::Context;
use executor_client::protocol::types::session::SessionParams;
use executor_client::{Backoff, Client, ClientOptions, Error, SshOptions, Target};
use std::io::Write;
use std::path::PathBuf;

/// Where the agent runs, and how ssh reaches it.
#[derive(Debug, clap::Args)]
pub struct ConnectArgs {
    /// `local` (the executor next to this binary, or $EXECUTOR_BIN),
    /// `ssh://[user@]host[:port]` (`ssh://[::1]:22` for IPv6), or an ssh
    /// host (a Host alias of ~/.ssh/config).
    #[arg(long, global = true, env = "EXECUTOR_TARGET", default_value = "local")]
    pub target: String,
    /// ssh: the identity (private key) file.
    #[arg(short = 'i', value_name = "IDENTITY_FILE")]
    pub identity: Option<PathBuf>,
    /// ssh: an option in ssh_config form (repeatable), e.g. `-o
    /// StrictHostKeyChecking=accept-new`.
    #[arg(short = 'o', value_name = "KEY=VALUE")]
    pub options: Vec<String>,
    /// ssh: the configuration file (instead of ~/.ssh/config).
    #[arg(short = 'F', value_name = "CONFIG")]
    pub config: Option<PathBuf>,
    /// ssh: jump through these hosts (ProxyJump), `[user@]host[:port][,...]`.
    #[arg(short = 'J', value_name = "DESTINATION")]
    pub jump: Option<String>,
    /// ssh: the port (instead of the target's, or ssh's default).
    #[arg(short = 'p', value_name = "PORT")]
    pub port: Option<u16>,
    /// ssh: the remote user (instead of the target's, or ssh's default).
    #[arg(short = 'l', value_name = "LOGIN")]
    pub login: Option<String>,
    /// ssh: ask for the `executor` subsystem (`ssh -s`) instead of running
    /// a command.
    #[arg(long)]
    pub subsystem: bool,
    /// ssh: the agent's path on the host (a plain path; default
    /// `executor`), or the subsystem's name with --subsystem.
    #[arg(long, value_name = "PATH", default_value = "executor")]
    pub remote_command: String,
    /// How long to wait for the agent's preamble, and then for its
    /// `initialize` answer, in seconds (0: for ever).
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    pub connect_timeout: f64,
}

impl ConnectArgs {
    fn client_options(&self, session: Option<SessionParams>) -> anyhow::Result<ClientOptions> {
        let secs = self.connect_timeout;
        if !(secs.is_finite() && secs >= 0.0) {
            return Err(Outside(format!(
                "--connect-timeout {secs} is not a number of seconds"
            ))
            .into());
        }
        Ok(ClientOptions {
            session,
            connect_timeout: (secs > 0.0).then(|| std::time::Duration::from_secs_f64(secs)),
            // Jobs of `--net ask` put destinations to the terminal.
            egress_policy: Some(super::sandbox::terminal_egress_policy()),
            ..ClientOptions::default()
        })
    }

    fn target(&self) -> anyhow::Result<Target> {
        Target::parse(&self.target).map_err(|e| Outside(e).into())
    }

    /// Whether the target is `local` (a transport that does not drop).
    pub fn is_local(&self) -> bool {
        matches!(self.target(), Ok(Target::Local))
    }

    /// The ssh options for the target's `user` and `port`.
    fn ssh(&self, user: Option<String>, port: Option<u16>, log: &LogArgs) -> SshOptions {
        let mut options = self.options.clone();
        // Honoured where sshd accepts them (`AcceptEnv RUST_LOG EXECUTOR_LOG_JSON`).
        // One SetEnv with every variable: ssh takes an option's first value.
        let env: Vec<String> = log
            .remote_env()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        if !env.is_empty() {
            options.push(format!("SetEnv={}", env.join(" ")));
        }
        SshOptions {
            user: self.login.clone().or(user),
            port: self.port.or(port),
            identity: self.identity.clone(),
            options,
            config: self.config.clone(),
            jump: self.jump.clone(),
            subsystem: self.subsystem,
            remote_command: self.remote_command.clone(),
            ssh_program: std::env::var_os("EXECUTOR_SSH")
                .map(PathBuf::from)
                .unwrap_or_else(|| "ssh".into()),
        }
    }
}

/// Connect to the target, as typed in the error messages.
pub async fn connect(
    args: &ConnectArgs,
    log: &LogArgs,
    session: Option<SessionParams>,
) -> anyhow::Result<Client> {
    let options = args.client_options(session)?;
    let target = args.target()?;
    connect_with(args, log, &target, options)
        .await
        .with_context(|| format!("connecting to {}", args.target))
}

/// Resume `client`'s (detached) session on a new connection to the same
/// target with the same options ([`Client::reconnect`]: transport failures
/// retried with `backoff`, a refusal of the agent returned at once).
pub async fn reconnect(
    args: &ConnectArgs,
    log: &LogArgs,
    client: &Client,
    backoff: Backoff,
) -> anyhow::Result<Client> {
    let base = args.client_options(None)?;
    let target = &args.target()?;
    let connect = |resume: ClientOptions| {
        let options = ClientOptions {
            session: resume.session,
            ..base.clone()
        };
        connect_with(args, log, target, options)
    };
    client
        .reconnect(connect, backoff)
        .await
        .with_context(|| format!("resuming the session on {}", args.target))
}

/// Connect to `target` with `options`.
async fn connect_with(
    args: &ConnectArgs,
    log: &LogArgs,
    target: &Target,
    options: ClientOptions,
) -> Result<Client, Error> {
    match target {
        Target::Local => {
            let mut cmd = Target::Local.command()?;
            cmd.envs(log.remote_env());
            Client::spawn(cmd, options).await
        }
        Target::Ssh { user, host, port } => {
            let ssh = args.ssh(user.clone(), *port, log);
            let cmd = ssh.command(host)?;
            spawn_ssh(cmd, options).await
        }
    }
}

/// Start ssh in its own process group, so that a Ctrl-C reaches this
/// client only once connected; until then ssh holds the terminal (for a
/// passphrase or password prompt, and a Ctrl-C then stops the connection).
async fn spawn_ssh(
    mut cmd: tokio::process::Command,
    options: ClientOptions,
) -> Result<Client, Error> {
    let program = cmd.as_std().get_program().to_string_lossy().into_owned();
    // stderr through the client's relay: the launcher's line is taken out
    // (and logged), and an early exit is reported with ssh's own words.
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    let child = cmd.spawn().map_err(|source| Error::Spawn {
        program: program.clone(),
        source,
    })?;
    let terminal = terminal::Handoff::give(child.id());
    let client = Client::from_child(child, &program, options).await;
    drop(terminal);
    client
}

/// `bootstrap`: install the agent on the ssh target.
pub async fn bootstrap(
    args: &ConnectArgs,
    from: Option<&std::path::Path>,
    remote_dir: &str,
) -> anyhow::Result<i32> {
    let Target::Ssh { user, host, port } = args.target()? else {
        return Err(Outside(
            "bootstrap needs an ssh --target (ssh://[user@]host[:port] or a host)".into(),
        )
        .into());
    };
    let ssh = args.ssh(user, port, &LogArgs::default());
    let Some(from) = from else {
        let found = executor_client::bootstrap::check(&host, &ssh, Some(remote_dir))
            .await
            .with_context(|| format!("checking {}", args.target))?;
        let mut out = std::io::stdout().lock();
        serde_json::to_writer_pretty(&mut out, &found.to_json())?;
        writeln!(out)?;
        return Ok(0);
    };
    let installed = executor_client::bootstrap::bootstrap(&host, &ssh, from, Some(remote_dir))
        .await
        .with_context(|| format!("bootstrapping {}", args.target))?;
    writeln!(
        std::io::stdout().lock(),
        "installed {} ({}, sha256 {}): {}",
        installed.path,
        installed.platform,
        installed.sha256,
        installed.version_line
    )?;
    Ok(0)
}

#[cfg(unix)]
mod terminal {
    use nix::sys::signal::{killpg, pthread_sigmask, SigSet, SigmaskHow, Signal};
    use nix::unistd::{getpgrp, tcgetpgrp, tcsetpgrp, Pid};

    /// The terminal's foreground given to a child's process group, and
    /// taken back on drop.
    #[derive(Debug)]
    pub struct Handoff {
        tty: std::fs::File,
        ours: Pid,
    }

    impl Handoff {
        /// Give the terminal to `pid`'s group, when this process holds it.
        pub fn give(pid: Option<u32>) -> Option<Handoff> {
            let pid = Pid::from_raw(i32::try_from(pid?).ok()?);
            let tty = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/tty")
                .ok()?;
            let ours = getpgrp();
            if tcgetpgrp(&tty).ok()? != ours {
                return None;
            }
            tcsetpgrp(&tty, pid).ok()?;
            // It may have stopped reading the terminal before it had it.
            let _ = killpg(pid, Signal::SIGCONT);
            Some(Handoff { tty, ours })
        }
    }

    impl Drop for Handoff {
        fn drop(&mut self) {
            // From the background, tcsetpgrp raises SIGTTOU unless the
            // calling thread blocks it.
            let mut block = SigSet::empty();
            block.add(Signal::SIGTTOU);
            let mut old = SigSet::empty();
            if pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&block), Some(&mut old)).is_ok() {
                let _ = tcsetpgrp(&self.tty, self.ours);
                let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
            }
        }
    }
}
