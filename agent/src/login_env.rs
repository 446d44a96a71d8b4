//! The environment a job's `env` is applied on top of (`env_base`,
//! docs/PROTOCOL.md §3): nothing, the agent's own, or a snapshot of the
//! user's login-shell environment ([`LoginEnv`]).
//!
//! The snapshot runs the passwd shell as a login shell,
//! `-NAME -c 'printf MARK; exec env -0'` (argv\[0\] starting with `-`, as
//! login(1) and sshd start one: bash, zsh, dash, fish and tcsh all read
//! their login files then, where `-l -c` is an error for tcsh), in the
//! home directory, from an environment like the one sshd gives a login
//! ([`LoginShell::base_env`]: never the agent's whole environment, which
//! locally is the client's), with a time bound. How it runs is the
//! caller's ([`LoginEnv::get`] takes a runner): unconfined with
//! [`run_unconfined`], or inside a confined job's own sandbox (the agent's
//! `process` module), so a job that is to be confined never makes the
//! user's dotfiles run unconfined.
//!
//! It is cached for the session, and (unconfined snapshots only) on disk
//! for [`DISK_CACHE_TTL`] in `$XDG_RUNTIME_DIR/executor/` ([`disk`]), keyed
//! by the shell, the base environment and the login files' metadata, so a
//! new connection does not run the login shell again.
//!
//! A bottom module: it depends on no other module of the agent but
//! `host::dirs` (the private runtime directory).

use executor_protocol::types::process::EnvBase;
use executor_protocol::types::session::LoginEnvInfo;
use executor_protocol::{ErrorCode, WireError};
use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the login shell may take.
pub const LOGIN_SHELL_TIMEOUT: Duration = Duration::from_secs(10);
/// The most output the login shell may produce.
pub const LOGIN_SHELL_MAX_OUTPUT: usize = 1 << 20;
/// How long an unconfined snapshot on disk serves new sessions: bounds
/// how stale it gets through files the login files source that are not
/// tracked (`~/.bash_aliases`, a version manager's scripts) or state they
/// read (a running ssh-agent).
pub const DISK_CACHE_TTL: Duration = Duration::from_secs(300);
/// What separates a profile's own output from the environment.
const MARK: &str = "\\000executor-login-env\\000";
const MARK_BYTES: &[u8] = b"\0executor-login-env\0";
/// The PATH the login shell starts with (sshd's default for a user).
const BASE_PATH: &str = "/usr/local/bin:/usr/bin:/bin:/usr/games";
/// Variables of the agent's environment the login shell is also given, as
/// sshd gives them (the locale is what `AcceptEnv LANG LC_*` passes), and
/// the ones that differ per connection, set again on every use of a
/// snapshot ([`PER_CONNECTION`]).
const PASSED: &[&str] = &["LANG", "LANGUAGE", "TZ", "XDG_RUNTIME_DIR"];
const PER_CONNECTION: &[&str] = &["SSH_CONNECTION", "SSH_CLIENT", "SSH_AUTH_SOCK"];
/// Variables of the snapshot that describe the snapshot's shell, not a job:
/// left out (`PWD` is set to the job's cwd instead).
const DROPPED: &[&str] = &["_", "PWD", "OLDPWD"];

type Vars = Arc<BTreeMap<String, String>>;

/// How a run of the login shell ended: its stdout (at most
/// [`LOGIN_SHELL_MAX_OUTPUT`] + 1 bytes), or why it failed.
pub type ShellRun = Result<Vec<u8>, ShellError>;

/// Why the login shell gave no environment, with the error code a request
/// gets for it (`io`, or the sandbox's own refusal for a confined job's:
/// what the job itself would have got).
#[derive(Debug, Clone)]
pub struct ShellError {
    pub code: ErrorCode,
    pub message: String,
}

impl From<String> for ShellError {
    fn from(message: String) -> Self {
        ShellError {
            code: ErrorCode::Io,
            message,
        }
    }
}

impl From<&str> for ShellError {
    fn from(message: &str) -> Self {
        message.to_string().into()
    }
}

impl std::fmt::Display for ShellError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// What runs: the passwd shell as a login shell, in the home directory.
#[derive(Debug, Clone)]
pub struct LoginShell {
    pub shell: String,
    /// `-NAME`.
    pub arg0: String,
    pub argv: Vec<String>,
    pub home: Option<PathBuf>,
    /// What the shell starts from ([`LoginShell::base_env`]).
    pub env: BTreeMap<String, String>,
}

impl LoginShell {
    /// The agent's user's login shell.
    pub fn current() -> LoginShell {
        let (shell, home, user) = shell_and_home();
        let name = std::path::Path::new(&shell)
            .file_name()
            .map_or_else(|| shell.clone(), |n| n.to_string_lossy().into_owned());
        let env = Self::base_env(&shell, home.as_deref(), user.as_deref());
        LoginShell {
            argv: vec![
                shell.clone(),
                "-c".into(),
                format!("printf '{MARK}'; exec env -0"),
            ],
            arg0: format!("-{name}"),
            shell,
            home,
            env,
        }
    }

    /// What sshd gives a login: HOME, USER, LOGNAME, SHELL, a standard
    /// PATH, and [`PASSED`] from the agent's environment. Nothing else of
    /// the agent's (started locally, it holds the client's environment).
    fn base_env(
        shell: &str,
        home: Option<&std::path::Path>,
        user: Option<&str>,
    ) -> BTreeMap<String, String> {
        let mut env = BTreeMap::from([
            ("PATH".to_string(), BASE_PATH.to_string()),
            ("SHELL".to_string(), shell.to_string()),
        ]);
        if let Some(home) = home {
            env.insert("HOME".into(), home.to_string_lossy().into_owned());
        }
        if let Some(user) = user {
            env.insert("USER".into(), user.into());
            env.insert("LOGNAME".into(), user.into());
        }
        for (k, v) in std::env::vars() {
            if PASSED.contains(&k.as_str()) || k.starts_with("LC_") {
                env.insert(k, v);
            }
        }
        env
    }
}

/// A taken snapshot, and whether it was taken inside a job's sandbox.
#[derive(Debug, Clone)]
struct Taken {
    result: Result<Vars, ShellError>,
    took: Duration,
    confined: bool,
}

/// A session's login-shell snapshot: taken on first use (or read from the
/// disk cache), then cached for the session, a failure too (but not one
/// inside a job's sandbox, which a later job's may not repeat). An unconfined
/// request does not use a snapshot taken inside a sandbox (the login files
/// may have behaved otherwise there): it takes its own, once; a confined
/// request uses whichever exists, so the shell runs at most twice per
/// session.
#[derive(Debug, Default)]
pub struct LoginEnv {
    taken: tokio::sync::Mutex<Option<Taken>>,
    info: std::sync::Mutex<Option<Taken>>,
}

impl LoginEnv {
    /// The snapshot for a job that is `confined` or not; `run` runs the
    /// login shell when there is none to use (for a confined job, inside
    /// its sandbox). Per-connection variables ([`PER_CONNECTION`]) are set
    /// from the agent's environment.
    pub async fn get<F, Fut>(&self, confined: bool, run: F) -> Result<Vars, WireError>
    where
        F: FnOnce(LoginShell) -> Fut,
        Fut: Future<Output = ShellRun>,
    {
        let mut slot = self.taken.lock().await;
        let usable = slot.as_ref().is_some_and(|t| confined || !t.confined);
        let result = if usable {
            slot.as_ref().expect("usable").result.clone()
        } else {
            let taken = take(confined, run).await;
            *self.info.lock().unwrap_or_else(|e| e.into_inner()) = Some(taken.clone());
            let result = taken.result.clone();
            // A failure inside a job's sandbox is that sandbox's (a later
            // job's may grant what the shell needed): not kept.
            if result.is_ok() || !confined {
                *slot = Some(taken);
            }
            result
        };
        let vars =
            result.map_err(|e| WireError::new(e.code, e.message).with("field", "env_base"))?;
        let mut vars = (*vars).clone();
        for k in PER_CONNECTION {
            match std::env::var(k) {
                Ok(v) => vars.insert(k.to_string(), v),
                Err(_) => vars.remove(*k),
            };
        }
        Ok(Arc::new(vars))
    }

    /// What `environment/info` reports.
    pub fn info(&self) -> LoginEnvInfo {
        match &*self.info.lock().unwrap_or_else(|e| e.into_inner()) {
            None => LoginEnvInfo::default(),
            Some(t) => LoginEnvInfo {
                taken: t.result.is_ok(),
                duration_ms: Some(t.took.as_millis() as u64),
                error: t.result.as_ref().err().map(|e| e.message.clone()),
            },
        }
    }
}

/// Read the disk cache (an unconfined snapshot serves both kinds of job),
/// else run the shell; an unconfined success is written to the cache.
async fn take<F, Fut>(confined: bool, run: F) -> Taken
where
    F: FnOnce(LoginShell) -> Fut,
    Fut: Future<Output = ShellRun>,
{
    let shell = LoginShell::current();
    let key = disk::key(&shell);
    let started = Instant::now();
    if let Some(vars) = disk::load(key) {
        tracing::info!(
            variables = vars.len(),
            "login-shell environment read from the cache (the login shell was not run)"
        );
        return Taken {
            result: Ok(Arc::new(vars)),
            took: started.elapsed(),
            confined: false,
        };
    }
    let name = shell.shell.clone();
    let result = run(shell).await.and_then(|out| {
        parse(&out).ok_or_else(|| {
            format!("the login shell {name} printed no environment (`env -0` after its profile)")
                .into()
        })
    });
    let took = started.elapsed();
    match &result {
        Ok(vars) => {
            tracing::info!(
                variables = vars.len(),
                duration_ms = took.as_millis() as u64,
                confined,
                "login-shell environment taken"
            );
            if !confined {
                disk::store(key, vars);
            }
        }
        Err(e) => tracing::warn!(error = %e, confined, "login-shell environment failed"),
    }
    Taken {
        result: result.map(Arc::new),
        took,
        confined,
    }
}

/// `env` on top of `base`, for a job in `cwd` (`PWD` is set to it on a
/// login base). `confined`: the job is to be confined, so the login shell
/// runs through `confined_run` (inside the job's sandbox); `None` there
/// refuses the login base instead (`policy_denied`).
pub async fn compose<F, Fut>(
    base: EnvBase,
    env: &BTreeMap<String, String>,
    cwd: &std::path::Path,
    login: &LoginEnv,
    confined: bool,
    confined_run: Option<F>,
) -> Result<BTreeMap<String, String>, WireError>
where
    F: FnOnce(LoginShell) -> Fut,
    Fut: Future<Output = ShellRun>,
{
    let mut out = match base {
        EnvBase::None => BTreeMap::new(),
        EnvBase::Agent => std::env::vars().collect(),
        EnvBase::Login if confined => match confined_run {
            Some(run) => {
                let mut vars = (*login.get(true, run).await?).clone();
                vars.insert("PWD".into(), cwd.to_string_lossy().into_owned());
                vars
            }
            None => return Err(WireError::new(
                ErrorCode::PolicyDenied,
                "env_base \"login\" runs the login shell; here it cannot run inside the job's sandbox",
            )
            .with("field", "env_base")),
        },
        EnvBase::Login => {
            let mut vars = (*login.get(false, run_unconfined).await?).clone();
            vars.insert("PWD".into(), cwd.to_string_lossy().into_owned());
            vars
        }
    };
    out.extend(env.iter().map(|(k, v)| (k.clone(), v.clone())));
    Ok(out)
}

/// The passwd shell, home and name of the agent's user.
fn shell_and_home() -> (String, Option<PathBuf>, Option<String>) {
    let user = nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten();
    match user {
        Some(u) => (
            u.shell.to_string_lossy().into_owned(),
            Some(u.dir),
            Some(u.name),
        ),
        None => (
            std::env::var("SHELL").unwrap_or_else(|_| "/bin/sh".into()),
            std::env::var_os("HOME").map(Into::into),
            std::env::var("USER").ok(),
        ),
    }
}

/// Run the login shell unconfined: stdin `/dev/null`, stderr discarded, in
/// a process group of its own (killed at the time bound).
pub async fn run_unconfined(sh: LoginShell) -> ShellRun {
    use tokio::io::AsyncReadExt;
    let shell = sh.shell.clone();
    let mut cmd = tokio::process::Command::new(&sh.shell);
    cmd.arg0(&sh.arg0)
        .args(&sh.argv[1..])
        .env_clear()
        .envs(&sh.env)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(home) = sh.home.filter(|h| h.is_dir()) {
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
        Ok(Err(e)) => return Err(format!("reading the login shell {shell}: {e}").into()),
        Err(_) => {
            if let Some(pid) = child.id() {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            return Err(timed_out(&shell).into());
        }
    };
    check_output(&shell, &out)?;
    if !status.success() {
        return Err(format!("the login shell {shell} exited with {status}").into());
    }
    Ok(out)
}

/// The error of a login shell that ran past [`LOGIN_SHELL_TIMEOUT`].
pub fn timed_out(shell: &str) -> String {
    format!(
        "the login shell {shell} did not finish within {} s",
        LOGIN_SHELL_TIMEOUT.as_secs()
    )
}

/// Refuse output past [`LOGIN_SHELL_MAX_OUTPUT`].
pub fn check_output(shell: &str, out: &[u8]) -> Result<(), String> {
    if out.len() > LOGIN_SHELL_MAX_OUTPUT {
        return Err(format!(
            "the login shell {shell} printed more than {LOGIN_SHELL_MAX_OUTPUT} bytes"
        ));
    }
    Ok(())
}

/// The `KEY=VALUE\0` entries after the mark (what the profile printed
/// before it is skipped); entries that are not UTF-8 are left out, and so
/// are [`DROPPED`] and [`PER_CONNECTION`].
fn parse(out: &[u8]) -> Option<BTreeMap<String, String>> {
    let at = out
        .windows(MARK_BYTES.len())
        .rposition(|w| w == MARK_BYTES)?;
    Some(entries(&out[at + MARK_BYTES.len()..]))
}

fn entries(bytes: &[u8]) -> BTreeMap<String, String> {
    bytes
        .split(|&b| b == 0)
        .filter_map(|entry| std::str::from_utf8(entry).ok())
        .filter_map(|entry| entry.split_once('='))
        .filter(|(k, _)| !k.is_empty())
        .filter(|(k, _)| !DROPPED.contains(k) && !PER_CONNECTION.contains(k))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The unconfined snapshot on disk: `login-env-<version>` in
/// `$XDG_RUNTIME_DIR/executor/` (the user's private directory of session
/// sockets; a per-user tmpfs that a sandboxed job writes to only when
/// granted it). No file where that directory is not the one in use (no
/// `$XDG_RUNTIME_DIR`): then every session runs the shell once.
///
/// The file holds a key line and the `env -0` entries; it serves while it
/// is younger than [`DISK_CACHE_TTL`] and its key matches: a hash of the
/// uid, the shell and its base environment, and the path, size, mtime and
/// inode of each login file of the shells the agent knows (a file edited,
/// added or removed makes a new key).
/// Where the disk cache lives: the session hosts' socket directory when it
/// is `$XDG_RUNTIME_DIR/executor` (set once by the binary at start, which
/// knows the socket directories; never under /tmp). Unset: no disk cache.
static CACHE_DIR: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();

/// Name the disk cache's directory (`None`: none). The first call wins.
pub fn set_cache_dir(dir: Option<std::path::PathBuf>) {
    let _ = CACHE_DIR.set(dir);
}

mod disk {
    use super::{LoginShell, DISK_CACHE_TTL};
    use std::collections::BTreeMap;
    use std::hash::{Hash, Hasher};
    use std::io::Write;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    use std::path::{Path, PathBuf};

    /// System-wide login files (`/etc/profile.d` and `/etc/zsh` by their
    /// entries too).
    const SYSTEM: &[&str] = &[
        "/etc/passwd",
        "/etc/environment",
        "/etc/profile",
        "/etc/profile.d",
        "/etc/bash.bashrc",
        "/etc/bashrc",
        "/etc/zsh",
        "/etc/zshenv",
        "/etc/zprofile",
        "/etc/zshrc",
        "/etc/zlogin",
        "/etc/fish/config.fish",
        "/etc/csh.cshrc",
        "/etc/csh.login",
        "/etc/default/locale",
    ];
    /// The user's, under the home directory.
    const HOME: &[&str] = &[
        ".profile",
        ".bash_profile",
        ".bash_login",
        ".bashrc",
        ".zshenv",
        ".zprofile",
        ".zshrc",
        ".zlogin",
        ".config/fish/config.fish",
        ".login",
        ".cshrc",
        ".tcshrc",
        ".pam_environment",
    ];

    /// The cache key of `shell` as things are now.
    pub fn key(shell: &LoginShell) -> u64 {
        // `DefaultHasher::new()` has fixed keys: the same input hashes the
        // same in every process of this binary (the file name carries the
        // version; another build at worst misses the cache).
        let mut h = std::hash::DefaultHasher::new();
        nix::unistd::getuid().as_raw().hash(&mut h);
        shell.shell.hash(&mut h);
        shell.home.hash(&mut h);
        shell.env.hash(&mut h);
        let mut files: Vec<PathBuf> = SYSTEM.iter().map(PathBuf::from).collect();
        if let Some(home) = &shell.home {
            files.extend(HOME.iter().map(|f| home.join(f)));
        }
        for f in files {
            meta(&f, &mut h);
            if let Ok(dir) = std::fs::read_dir(&f) {
                let mut names: Vec<PathBuf> = dir.flatten().map(|e| e.path()).collect();
                names.sort();
                for n in names {
                    meta(&n, &mut h);
                }
            }
        }
        h.finish()
    }

    fn meta(path: &Path, h: &mut impl Hasher) {
        path.hash(h);
        match std::fs::metadata(path) {
            Ok(m) => (m.len(), m.mtime(), m.mtime_nsec(), m.ino()).hash(h),
            Err(_) => 0u8.hash(h),
        }
    }

    /// The cache file, where there is one ([`super::set_cache_dir`]).
    fn path() -> Option<PathBuf> {
        let dir = super::CACHE_DIR.get()?.as_ref()?;
        Some(dir.join(format!("login-env-{}", env!("CARGO_PKG_VERSION"))))
    }

    fn header(key: u64) -> String {
        format!("executor-login-env 1 {key:016x}\n")
    }

    /// The cached environment, when fresh and of `key`.
    pub fn load(key: u64) -> Option<BTreeMap<String, String>> {
        let path = path()?;
        let m = std::fs::symlink_metadata(&path).ok()?;
        let fresh = m
            .modified()
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age < DISK_CACHE_TTL);
        // Ours alone: a regular file of this user, not readable by others.
        let ours = m.file_type().is_file()
            && m.uid() == nix::unistd::getuid().as_raw()
            && m.mode() & 0o077 == 0;
        if !(fresh && ours) {
            return None;
        }
        let bytes = std::fs::read(&path).ok()?;
        let rest = bytes.strip_prefix(header(key).as_bytes())?;
        Some(super::entries(rest))
    }

    /// Write the environment (mode 0600, under a temporary name, then
    /// renamed); a failure is logged and otherwise ignored.
    pub fn store(key: u64, vars: &BTreeMap<String, String>) {
        let Some(path) = path() else { return };
        let mut tmp = path.clone().into_os_string();
        tmp.push(format!(".tmp{}", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            let mut buf = header(key).into_bytes();
            for (k, v) in vars {
                buf.extend_from_slice(k.as_bytes());
                buf.push(b'=');
                buf.extend_from_slice(v.as_bytes());
                buf.push(0);
            }
            f.write_all(&buf)?;
            std::fs::rename(&tmp, &path)
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            tracing::warn!(path = %path.display(), error = %e, "cannot cache the login-shell environment");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_skips_what_the_profile_printed() {
        let mut out = b"Welcome\n".to_vec();
        out.extend_from_slice(MARK_BYTES);
        out.extend_from_slice(b"PATH=/a:/b\0EMPTY=\0X=a=b\nc\0_=/usr/bin/env\0PWD=/root\0");
        let vars = parse(&out).unwrap();
        assert_eq!(vars["PATH"], "/a:/b");
        assert_eq!(vars["EMPTY"], "");
        assert_eq!(vars["X"], "a=b\nc");
        assert_eq!(vars.len(), 3, "{vars:?}");
        assert!(parse(b"PATH=/x\0").is_none());
    }
}
