//! The target and the ssh options (OpenSSH's flags where they mean the same
//! thing; also after the verb, as `--target` is, but `-i` after `http` and
//! `-p` after `get`, `put` and `mkdir`, which are theirs), and
//! connecting: bounded by `--connect-timeout`, with the terminal handed to
//! ssh while it may prompt; `-v` logs the ssh command line run.

use super::exit::{Outside, Usage};
use super::logging::LogArgs;
use super::target::CliTarget;
use anyhow::Context;
use executor_client::protocol::types::session::SessionParams;
use executor_client::{Backoff, Client, ClientOptions, Error, SshOptions, Transport};
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
    /// ssh: the identity (private key) file (for `http`, before the verb:
    /// `-i` after it is `http`'s own).
    #[arg(short = 'i', value_name = "IDENTITY_FILE", global = true)]
    pub identity: Option<PathBuf>,
    /// ssh: an option in ssh_config form (repeatable), `-o KEY=VALUE` or
    /// `-o "KEY VALUE"`, e.g. `-o StrictHostKeyChecking=accept-new`.
    #[arg(short = 'o', value_name = "KEY=VALUE", global = true)]
    pub options: Vec<String>,
    /// ssh: the configuration file (instead of ~/.ssh/config).
    #[arg(short = 'F', value_name = "CONFIG", global = true)]
    pub config: Option<PathBuf>,
    /// ssh: jump through these hosts (ProxyJump), `[user@]host[:port][,...]`.
    #[arg(short = 'J', value_name = "DESTINATION", global = true)]
    pub jump: Option<String>,
    /// ssh: the port (instead of the target's, or ssh's default; for `get`,
    /// `put` and `mkdir`, before the verb: `-p` after it is theirs).
    #[arg(short = 'p', value_name = "PORT", global = true)]
    pub port: Option<u16>,
    /// ssh: the remote user (instead of the target's, or ssh's default).
    #[arg(short = 'l', value_name = "LOGIN", global = true)]
    pub login: Option<String>,
    /// ssh: ask for the `executor` subsystem (`ssh -s`) instead of running
    /// a command.
    #[arg(long, global = true)]
    pub subsystem: bool,
    /// ssh: the agent's path on the host (a plain path; default
    /// `executor`), or the subsystem's name with --subsystem.
    #[arg(long, value_name = "PATH", default_value = "executor", global = true)]
    pub remote_command: String,
    /// How long to wait for the agent's preamble, and then for its
    /// `initialize` answer, in seconds (0: for ever).
    #[arg(long, value_name = "SECS", default_value_t = 30.0, global = true)]
    pub connect_timeout: f64,
}

impl ConnectArgs {
    /// Every `-o` of the command line: `before` (those given before the
    /// verb, [`options_before_verb`]) and then the verb's own, when clap
    /// kept those instead.
    pub fn merge_options(&mut self, before: Vec<String>) {
        if !before.is_empty() && self.options != before {
            let after = std::mem::take(&mut self.options);
            self.options = before.into_iter().chain(after).collect();
        }
    }

    fn client_options(&self, session: Option<SessionParams>) -> anyhow::Result<ClientOptions> {
        let secs = self.connect_timeout;
        if !(secs.is_finite() && secs >= 0.0) {
            return Err(Usage(format!(
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

    fn target(&self) -> anyhow::Result<CliTarget> {
        CliTarget::parse(&self.target).map_err(|e| Outside(e).into())
    }

    /// Whether the target is `local` (a transport that does not drop).
    pub fn is_local(&self) -> bool {
        matches!(self.target(), Ok(CliTarget::Local))
    }

    /// The `-o` options as ssh_config's `KEY=VALUE`, each checked: bad
    /// usage names the first that is not an option.
    fn ssh_options(&self) -> Result<Vec<String>, Usage> {
        self.options.iter().map(|o| ssh_option(o)).collect()
    }

    /// The ssh options for the target's `user` and `port`; the `-o`
    /// options as `KEY=VALUE` (checked before: [`ConnectArgs::ssh_options`];
    /// one that is not an option is left for the library to refuse).
    fn ssh(&self, user: Option<String>, port: Option<u16>, log: &LogArgs) -> SshOptions {
        let mut options: Vec<String> = self
            .options
            .iter()
            .map(|o| ssh_option(o).unwrap_or_else(|_| o.clone()))
            .collect();
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

/// `cmd` (the CLI) with its global ssh flags kept out of the verbs that
/// have a flag of the same letter (`get -p`, `http -i`): such a verb gets a
/// hidden, long-only placeholder under the ssh flag's id, and clap does not
/// propagate a global to a command that has an argument of its id.
pub fn keep_verbs_letters(cmd: clap::Command) -> clap::Command {
    fn shadow(mut sub: clap::Command) -> clap::Command {
        let placeholders: [(char, fn() -> clap::Arg); 2] = [
            ('p', || {
                clap::Arg::new("port")
                    .long("ssh-port")
                    .value_parser(clap::value_parser!(u16))
            }),
            ('i', || {
                clap::Arg::new("identity")
                    .long("ssh-identity")
                    .value_parser(clap::value_parser!(PathBuf))
            }),
        ];
        for (letter, placeholder) in placeholders {
            if sub.get_arguments().any(|a| a.get_short() == Some(letter)) {
                sub = sub.arg(placeholder().hide(true));
            }
        }
        let nested: Vec<String> = sub
            .get_subcommands()
            .map(|s| s.get_name().to_string())
            .collect();
        for name in nested {
            sub = sub.mut_subcommand(name, shadow);
        }
        sub
    }
    let verbs: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    verbs
        .into_iter()
        .fold(cmd, |cmd, name| cmd.mut_subcommand(name, shadow))
}

/// The `-o` values given before the verb in `argv`. `-o` is a global flag,
/// and clap keeps only the verb's values of a global given on both sides;
/// ssh takes every `-o` (the first value of an option wins), so the ones
/// before the verb are put back in front ([`ConnectArgs::merge_options`]).
/// The top-level flags that take a value are read from `cmd`, so a value
/// is never taken for a flag or the verb.
pub fn options_before_verb(cmd: &clap::Command, argv: &[std::ffi::OsString]) -> Vec<String> {
    let verbs: Vec<&str> = cmd
        .get_subcommands()
        .flat_map(|s| std::iter::once(s.get_name()).chain(s.get_all_aliases()))
        .collect();
    let takes_value = |a: &&clap::Arg| a.get_action().takes_values();
    let long_value = |name: &str| {
        cmd.get_arguments()
            .filter(takes_value)
            .any(|a| a.get_long() == Some(name))
    };
    let short_value = |c: char| {
        cmd.get_arguments()
            .filter(takes_value)
            .any(|a| a.get_short() == Some(c))
    };
    let mut out = Vec::new();
    let mut words = argv.iter().skip(1).map(|w| w.to_string_lossy());
    while let Some(w) = words.next() {
        if w == "--" || verbs.contains(&w.as_ref()) {
            break;
        }
        if let Some(long) = w.strip_prefix("--") {
            if !long.contains('=') && long_value(long) {
                words.next();
            }
        } else if let Some(shorts) = w.strip_prefix('-') {
            for (i, c) in shorts.char_indices() {
                if !short_value(c) {
                    continue;
                }
                let rest = &shorts[i + c.len_utf8()..];
                let value = match rest {
                    "" => words.next().map(|v| v.into_owned()),
                    rest => Some(rest.to_string()),
                };
                if let (Some(v), 'o') = (value, c) {
                    out.push(v);
                }
                break;
            }
        }
    }
    out
}

/// One `-o` as ssh reads it (`KEY=VALUE`, `KEY VALUE`, `KEY = VALUE`:
/// the keyword, then blanks and at most one `=`), as `KEY=VALUE`. The
/// keyword is letters and digits; the value is not empty and holds no
/// control character (a newline would start another option).
fn ssh_option(raw: &str) -> Result<String, Usage> {
    let bad = |why: &str| Usage(format!("-o {raw:?}: {why}"));
    let s = raw.trim_start_matches([' ', '\t']);
    let key_end = s.find(['=', ' ', '\t']).unwrap_or(s.len());
    let (key, rest) = s.split_at(key_end);
    if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(bad(
            "not an ssh option (KEY=VALUE or \"KEY VALUE\", KEY an ssh_config keyword)",
        ));
    }
    let rest = rest.trim_start_matches([' ', '\t']);
    let value = rest
        .strip_prefix('=')
        .unwrap_or(rest)
        .trim_start_matches([' ', '\t']);
    if value.is_empty() {
        return Err(bad("no value"));
    }
    if value.chars().any(char::is_control) {
        return Err(bad("a control character in the value"));
    }
    Ok(format!("{key}={value}"))
}

/// A command line as a shell would take it back (each word quoted where
/// needed), for a log line.
fn shown_command(cmd: &tokio::process::Command) -> String {
    let std = cmd.as_std();
    std::iter::once(std.get_program())
        .chain(std.get_args())
        .map(|w| super::quote::shell_escape(w.as_encoded_bytes()).into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Connect to the target, as typed in the error messages.
pub async fn connect(
    args: &ConnectArgs,
    log: &LogArgs,
    session: Option<SessionParams>,
) -> anyhow::Result<Client> {
    let options = args.client_options(session)?;
    // Bad usage whatever the target (a local one passes no -o to ssh).
    args.ssh_options()?;
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
    target: &CliTarget,
    options: ClientOptions,
) -> Result<Client, Error> {
    match target {
        CliTarget::Local => {
            let mut cmd = Transport::Local.command()?;
            cmd.envs(log.remote_env());
            Client::spawn(cmd, options).await
        }
        CliTarget::Ssh { user, host, port } => {
            let ssh = args.ssh(user.clone(), *port, log);
            let cmd = ssh.command(host)?;
            // ssh's argv holds no secret of ours (the session's token
            // travels inside the connection): shown at -v.
            tracing::info!(command = %shown_command(&cmd), "running ssh");
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
    let CliTarget::Ssh { user, host, port } = args.target()? else {
        return Err(Outside(
            "bootstrap needs an ssh --target (ssh://[user@]host[:port] or a host)".into(),
        )
        .into());
    };
    args.ssh_options()?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn o_takes_both_of_ssh_forms_and_names_a_bad_one() {
        for given in [
            "BatchMode=yes",
            "BatchMode yes",
            "BatchMode = yes",
            " BatchMode\t=yes",
        ] {
            assert_eq!(ssh_option(given).unwrap(), "BatchMode=yes", "{given:?}");
        }
        assert_eq!(
            ssh_option("SetEnv A=1 B=2").unwrap(),
            "SetEnv=A=1 B=2",
            "the value keeps its own = and blanks"
        );
        for bad in [
            "",
            "=yes",
            "Batch-Mode=yes",
            "-oProxyCommand=x",
            "NoValue",
            "User=x\nHost=y",
        ] {
            let e = ssh_option(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn the_o_options_before_the_verb_are_found_whatever_their_form() {
        let argv = |words: &[&str]| -> Vec<std::ffi::OsString> {
            std::iter::once("executor-client")
                .chain(words.iter().copied())
                .map(Into::into)
                .collect()
        };
        let cmd = super::super::command();
        assert_eq!(
            options_before_verb(
                &cmd,
                &argv(&["-oA=1", "-vo", "B 2", "--target", "run", "-o", "C=3", "run", "-o", "D=4"])
            ),
            vec!["A=1", "B 2", "C=3"],
            "--target's value `run` is not the verb"
        );
        assert!(options_before_verb(&cmd, &argv(&["info", "-o", "A=1"])).is_empty());
    }
}
