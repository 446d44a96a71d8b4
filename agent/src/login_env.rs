//! The environment a job's `env` is applied on top of (`env_base`,
//! docs/PROTOCOL.md §3): nothing, the agent's own, or a snapshot of the
//! user's login-shell environment, taken once per session by running the
//! passwd shell as a login shell, `-NAME -c 'printf MARK; exec env -0'`
//! (argv\[0\] starting with `-`, as login(1) and sshd start one: bash, zsh,
//! dash, fish and tcsh all read their login files then, where `-l -c` is
//! an error for tcsh), with a time bound, and cached for the session
//! ([`LoginEnv`]).
//!
//! A bottom module: it depends on no other module of the agent.

use executor_protocol::types::process::EnvBase;
use executor_protocol::types::session::LoginEnvInfo;
use executor_protocol::{ErrorCode, WireError};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the login shell may take.
pub const LOGIN_SHELL_TIMEOUT: Duration = Duration::from_secs(10);
/// The most output the login shell may produce.
pub const LOGIN_SHELL_MAX_OUTPUT: usize = 1 << 20;
/// What separates a profile's own output from the environment.
const MARK: &str = "\\000executor-login-env\\000";
const MARK_BYTES: &[u8] = b"\0executor-login-env\0";

type Vars = Arc<BTreeMap<String, String>>;

/// A session's login-shell snapshot: taken on first use, then cached
/// (a failure too: the shell is run once per session).
#[derive(Debug, Default)]
pub struct LoginEnv {
    cell: tokio::sync::OnceCell<(Result<Vars, String>, Duration)>,
}

impl LoginEnv {
    /// The snapshot, taking it on first use.
    pub async fn get(&self) -> Result<Vars, WireError> {
        let (result, _) = self
            .cell
            .get_or_init(|| async {
                let started = Instant::now();
                let result = snapshot().await;
                let took = started.elapsed();
                match &result {
                    Ok(vars) => tracing::info!(
                        variables = vars.len(),
                        duration_ms = took.as_millis() as u64,
                        "login-shell environment taken"
                    ),
                    Err(e) => tracing::warn!(error = %e, "login-shell environment failed"),
                }
                (result, took)
            })
            .await;
        result
            .clone()
            .map_err(|e| WireError::new(ErrorCode::Io, e).with("field", "env_base"))
    }

    /// What `environment/info` reports.
    pub fn info(&self) -> LoginEnvInfo {
        match self.cell.get() {
            None => LoginEnvInfo::default(),
            Some((result, took)) => LoginEnvInfo {
                taken: result.is_ok(),
                duration_ms: Some(took.as_millis() as u64),
                error: result.as_ref().err().cloned(),
            },
        }
    }
}

/// `env` on top of `base`. `confined`: the session's profile confines every
/// job, so the login shell (which runs the user's dotfiles unconfined) is
/// refused.
pub async fn compose(
    base: EnvBase,
    env: &BTreeMap<String, String>,
    login: &LoginEnv,
    confined: bool,
) -> Result<BTreeMap<String, String>, WireError> {
    let mut out = match base {
        EnvBase::None => BTreeMap::new(),
        EnvBase::Agent => std::env::vars().collect(),
        EnvBase::Login if confined => return Err(WireError::new(
            ErrorCode::PolicyDenied,
            "env_base \"login\" runs the login shell unconfined; not for a sandboxed job (a sandbox intent, or a profile that confines every job)",
        )
        .with("field", "env_base")),
        EnvBase::Login => (*login.get().await?).clone(),
    };
    out.extend(env.iter().map(|(k, v)| (k.clone(), v.clone())));
    Ok(out)
}

/// The passwd shell and home of the agent's user.
fn shell_and_home() -> (String, Option<std::path::PathBuf>) {
    let user = nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten();
    match user {
        Some(u) => (u.shell.to_string_lossy().into_owned(), Some(u.dir)),
        None => (
            std::env::var("SHELL").unwrap_or_else(|_| "/bin/sh".into()),
            std::env::var_os("HOME").map(Into::into),
        ),
    }
}

async fn snapshot() -> Result<Vars, String> {
    use tokio::io::AsyncReadExt;
    let (shell, home) = shell_and_home();
    let name = std::path::Path::new(&shell)
        .file_name()
        .map_or_else(|| shell.clone(), |n| n.to_string_lossy().into_owned());
    let mut cmd = tokio::process::Command::new(&shell);
    cmd.arg0(format!("-{name}"))
        .arg("-c")
        .arg(format!("printf '{MARK}'; exec env -0"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(home) = home.filter(|h| h.is_dir()) {
        cmd.current_dir(home);
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run the login shell {shell}: {e}"))?;
    let mut stdout = child.stdout.take().ok_or("the login shell has no stdout")?;
    let mut out = Vec::new();
    let read = async {
        let mut limited = (&mut stdout).take(LOGIN_SHELL_MAX_OUTPUT as u64 + 1);
        limited.read_to_end(&mut out).await?;
        child.wait().await
    };
    let status = match tokio::time::timeout(LOGIN_SHELL_TIMEOUT, read).await {
        Ok(Ok(status)) => status,
        Ok(Err(e)) => return Err(format!("reading the login shell {shell}: {e}")),
        Err(_) => {
            if let Some(pid) = child.id() {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            return Err(format!(
                "the login shell {shell} did not finish within {} s",
                LOGIN_SHELL_TIMEOUT.as_secs()
            ));
        }
    };
    if out.len() > LOGIN_SHELL_MAX_OUTPUT {
        return Err(format!(
            "the login shell {shell} printed more than {LOGIN_SHELL_MAX_OUTPUT} bytes"
        ));
    }
    if !status.success() {
        return Err(format!("the login shell {shell} exited with {status}"));
    }
    parse(&out).map(Arc::new).ok_or_else(|| {
        format!("the login shell {shell} printed no environment (`env -0` after its profile)")
    })
}

/// The `KEY=VALUE\0` entries after the mark (what the profile printed
/// before it is skipped); entries that are not UTF-8 are left out.
fn parse(out: &[u8]) -> Option<BTreeMap<String, String>> {
    let at = out
        .windows(MARK_BYTES.len())
        .rposition(|w| w == MARK_BYTES)?;
    let vars = out[at + MARK_BYTES.len()..]
        .split(|&b| b == 0)
        .filter_map(|entry| std::str::from_utf8(entry).ok())
        .filter_map(|entry| entry.split_once('='))
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Some(vars)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_skips_what_the_profile_printed() {
        let mut out = b"Welcome\n".to_vec();
        out.extend_from_slice(MARK_BYTES);
        out.extend_from_slice(b"PATH=/a:/b\0EMPTY=\0X=a=b\nc\0");
        let vars = parse(&out).unwrap();
        assert_eq!(vars["PATH"], "/a:/b");
        assert_eq!(vars["EMPTY"], "");
        assert_eq!(vars["X"], "a=b\nc");
        assert_eq!(vars.len(), 3);
        assert!(parse(b"PATH=/x\0").is_none());
    }
}
