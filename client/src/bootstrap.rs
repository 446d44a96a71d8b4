//! `bootstrap`: install the agent on a host over SSH, for hosts without the
//! package and without network access of their own.
//!
//! One SSH connection does it all: the remote side prints `uname -sm`, the
//! client picks the matching binary from a local folder of release builds
//! (`DIST/<os>-<arch>/executor`, e.g. `dist/linux-x86_64/executor`, so a
//! macOS or Linux client can install a Linux agent of the right
//! architecture), or takes the one binary it was given after checking its
//! header names the host's platform ([`binary_platform`]: ELF or Mach-O;
//! [`BootstrapError::WrongPlatform`] otherwise), sends its SHA-256 (computed here with `ring`) and its
//! bytes; the host writes them to a temporary file beside the versioned
//! path (`~/.local/lib/executor/<version>/executor` by default), checks the
//! digest with `sha256sum` and only then renames it into place. A corrupted
//! upload is deleted, never installed.
//!
//! The directory is made and checked writable before anything is sent (a
//! refusal is [`BootstrapError::RemoteDir`] with the host's message); a
//! platform without a build is [`BootstrapError::NoBuild`] naming the
//! `packaging/build-dist.sh` target that makes it. Later connections find
//! the installed copy through `executor_protocol::launch` (see
//! `SshOptions::remote_command`); [`check`] reports what a host has
//! without installing.
//!
//! The remote script is this module's own text; the only values put into
//! it are the version and a base directory that is checked to be a plain
//! path (it never carries input as shell code).

use crate::{Error, SshOptions};
use std::path::{Path, PathBuf};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// The default base directory on the host (`<base>/<version>/executor`).
pub const DEFAULT_REMOTE_DIR: &str = "$HOME/.local/lib/executor";

/// Why a bootstrap failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BootstrapError {
    #[error("ssh: {0}")]
    Transport(#[from] Error),
    #[error("ssh I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("the host answered {0:?} instead of `uname -sm` output")]
    Probe(String),
    #[error("no agent build for {platform} in {dist} (expected {expected}; have: {available}); build it with `packaging/build-dist.sh {target}` on a machine with that Rust target (see the README's install section)")]
    NoBuild {
        platform: String,
        dist: PathBuf,
        expected: PathBuf,
        available: String,
        /// The `build-dist.sh` argument that makes the missing build.
        target: String,
    },
    #[error("{path} is a {binary} build, but the host is {host}: give its {host} build, or a folder of release builds holding {host}/executor")]
    WrongPlatform {
        path: PathBuf,
        binary: String,
        host: String,
    },
    #[error("{path} is not an agent build this client can place (not a folder of release builds, and {why})")]
    NotABuild { path: PathBuf, why: String },
    #[error("this key may only run the executor (a forced command on the host), so bootstrap cannot install there: install the package on the host, or bootstrap with a key that may run commands")]
    ForcedCommand,
    #[error("cannot install into {dir} on the host: {message}")]
    RemoteDir { dir: String, message: String },
    #[error("the upload was corrupted in transit: {0}")]
    ChecksumMismatch(String),
    #[error("{0:?} is not a plain directory path")]
    BadRemoteDir(String),
    #[error("the installer failed (exit {code:?}): {stderr}")]
    Failed { code: Option<i32>, stderr: String },
}

/// What was installed where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// `<os>-<arch>` of the host, as the dist folder names it.
    pub platform: String,
    /// The installed agent's path on the host (give it to
    /// `SshOptions::remote_command`).
    pub path: String,
    /// Its SHA-256, hex.
    pub sha256: String,
    /// What the installed agent printed for `--version`.
    pub version_line: String,
}

/// `uname -sm` → `linux-x86_64`, `linux-aarch64`, `darwin-aarch64`, ...
/// (`None` for words of anything but letters, digits and `_`: the host's
/// answer becomes a path below the dist folder).
pub fn platform_of(uname: &str) -> Option<String> {
    let mut it = uname.split_whitespace();
    let (os, arch) = (it.next()?, it.next()?);
    let plain = |w: &str| w.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !plain(os) || !plain(arch) {
        return None;
    }
    let arch = match arch {
        "arm64" => "aarch64",
        "amd64" => "x86_64",
        a => a,
    };
    Some(format!("{}-{arch}", os.to_ascii_lowercase()))
}

/// The `packaging/build-dist.sh` target that builds `platform`
/// (`linux-aarch64` → `aarch64-unknown-linux-gnu.2.17`).
pub fn build_target(platform: &str) -> String {
    match platform.split_once('-') {
        Some(("linux", arch)) => format!("{arch}-unknown-linux-gnu.2.17"),
        Some(("darwin", arch)) => format!("{arch}-apple-darwin"),
        _ => format!("<the Rust target of {platform}>"),
    }
}

fn sha256_hex(data: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, data)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn script(remote_dir: &str) -> Result<String, BootstrapError> {
    let plain = remote_dir
        .strip_prefix("$HOME/")
        .map_or(remote_dir, |rest| rest);
    let ok = !remote_dir.is_empty()
        && (remote_dir.starts_with('/') || remote_dir.starts_with("$HOME/"))
        && plain
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+".contains(c));
    if !ok {
        return Err(BootstrapError::BadRemoteDir(remote_dir.into()));
    }
    let version = env!("CARGO_PKG_VERSION");
    Ok(one_line_sh(&[
        "set -e",
        "umask 077",
        &format!("d=\"{remote_dir}/{version}\""),
        "err=$(mkdir -p \"$d\" 2>&1) || { echo \"$err\" >&2; exit 4; }",
        "[ -w \"$d\" ] || { echo \"$d is not writable by $(id -un)\" >&2; exit 4; }",
        // Another user must not be able to swap what is installed here.
        "[ -O \"$d\" ] || { echo \"$d is not owned by $(id -un); nothing installed\" >&2; exit 4; }",
        "case $(ls -ld \"$d\") in ?????w*|????????w*) echo \"$d is writable by others; nothing installed\" >&2; exit 4;; esac",
        "uname -sm",
        "IFS= read -r want || { rmdir \"$d\" 2>/dev/null || true; exit 5; }",
        "t=$(mktemp \"$d/.executor.upload.XXXXXX\")",
        "trap \"rm -f -- \\\"$t\\\"\" EXIT",
        "cat > \"$t\"",
        SHA256_FN,
        "got=$(sha256 \"$t\")",
        "[ \"$got\" = \"$want\" ] || { echo \"checksum mismatch: expected $want, got $got; nothing installed\" >&2; exit 3; }",
        "chmod 0755 \"$t\"",
        "mv -f \"$t\" \"$d/executor\"",
        "trap - EXIT",
        "echo \"$d/executor\"",
        "\"$d/executor\" --version",
    ]))
}

/// A shell function `sha256 FILE` printing the hex digest: `sha256sum`
/// (GNU, BusyBox) or `shasum -a 256` (macOS, BSD).
const SHA256_FN: &str = "sha256() { if command -v sha256sum >/dev/null 2>&1; then sha256sum \"$1\"; else shasum -a 256 \"$1\"; fi | cut -d\" \" -f1; }";

/// `sh -c '<statements joined by "; ">'`: one line with no `'`, `!` or
/// `\\`, so that the same text reaches `sh` whatever the user's login
/// shell is (sshd runs the command with it): bash, zsh and dash, fish
/// (which would not parse POSIX syntax itself) and tcsh (which refuses a
/// newline inside quotes and expands `!` for history).
fn one_line_sh(statements: &[&str]) -> String {
    let body = statements.join("; ");
    format!("sh -c '{body}'")
}

/// The `<os>-<arch>` an executable was built for, from its header: ELF
/// (`linux-`, by `e_machine`) or 64-bit Mach-O (`darwin-`, by `cputype`);
/// why not otherwise.
pub fn binary_platform(bytes: &[u8]) -> Result<String, String> {
    let u16le = |at: usize| {
        bytes
            .get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32le = |at: usize| {
        bytes
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    if bytes.starts_with(b"\x7fELF") {
        // EI_DATA 1: little-endian, as every target the agent is built for.
        if bytes.get(5) != Some(&1) {
            return Err("it is a big-endian ELF file".into());
        }
        let arch = match u16le(18) {
            Some(0x3e) => "x86_64",
            Some(0xb7) => "aarch64",
            Some(0x03) => "i686",
            Some(0x28) => "armv7l",
            Some(0xf3) => "riscv64",
            Some(0x15) => "ppc64le",
            Some(0x16) => "s390x",
            Some(m) => return Err(format!("it is an ELF file for machine {m:#x}")),
            None => return Err("it is a truncated ELF file".into()),
        };
        return Ok(format!("linux-{arch}"));
    }
    if u32le(0) == Some(0xfeed_facf) {
        let arch = match u32le(4) {
            Some(0x0100_0007) => "x86_64",
            Some(0x0100_000c) => "aarch64",
            Some(c) => return Err(format!("it is a Mach-O file for CPU type {c:#x}")),
            None => return Err("it is a truncated Mach-O file".into()),
        };
        return Ok(format!("darwin-{arch}"));
    }
    Err("it is neither an ELF nor a 64-bit Mach-O executable".into())
}

/// Install the agent on `host` from `from` (see the module docs): a
/// folder of release builds (`<os>-<arch>/executor`), or one agent binary,
/// which must be built for the host's platform.
pub async fn bootstrap(
    host: &str,
    ssh: &SshOptions,
    from: &Path,
    remote_dir: Option<&str>,
) -> Result<Installed, BootstrapError> {
    if !from.is_dir() {
        let bytes = std::fs::read(from)?;
        let binary = binary_platform(&bytes).map_err(|why| BootstrapError::NotABuild {
            path: from.into(),
            why,
        })?;
        return install_with(host, ssh, remote_dir, |platform| {
            if binary != platform {
                return Err(BootstrapError::WrongPlatform {
                    path: from.into(),
                    binary,
                    host: platform.into(),
                });
            }
            let digest = sha256_hex(&bytes);
            Ok((bytes, digest))
        })
        .await;
    }
    let dist = from;
    install_with(host, ssh, remote_dir, |platform| {
        let expected = dist.join(platform).join("executor");
        match std::fs::read(&expected) {
            Ok(bytes) => {
                let digest = sha256_hex(&bytes);
                Ok((bytes, digest))
            }
            Err(_) => {
                let available = std::fs::read_dir(dist)
                    .map(|d| {
                        d.filter_map(|e| e.ok())
                            .filter(|e| e.path().join("executor").is_file())
                            .map(|e| e.file_name().to_string_lossy().into_owned())
                            .collect::<Vec<_>>()
                            .join(", ")
                    })
                    .unwrap_or_default();
                Err(BootstrapError::NoBuild {
                    target: build_target(platform),
                    platform: platform.into(),
                    dist: dist.into(),
                    expected,
                    available: if available.is_empty() {
                        "none".into()
                    } else {
                        available
                    },
                })
            }
        }
    })
    .await
}

/// What `bootstrap --check` found on a host; nothing is installed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// `<os>-<arch>` from `uname -sm` (`None` under a forced command).
    pub platform: Option<String>,
    /// The agent a connection starts: the bootstrapped copy for this
    /// client's version, else `executor` on the PATH (`None`: neither, or
    /// a forced command hides it).
    pub path: Option<String>,
    /// Whether `path` is the bootstrapped copy.
    pub installed: bool,
    /// Its SHA-256, hex.
    pub sha256: Option<String>,
    /// The key only runs the executor (`authorized_keys` forced command).
    pub forced_command: bool,
    /// The agent's `initialize` answer: version and sandbox capabilities
    /// (`None` when no agent started; then `error` says why).
    pub agent: Option<executor_protocol::types::session::InitializeResult>,
    /// Why no agent answered.
    pub error: Option<String>,
}

impl Check {
    /// The report as JSON (what `bootstrap --check` prints).
    pub fn to_json(&self) -> serde_json::Value {
        let agent = self.agent.as_ref();
        serde_json::json!({
            "platform": self.platform,
            "path": self.path,
            "source": match (&self.path, self.installed) {
                (None, _) => None,
                (Some(_), true) => Some("bootstrapped copy"),
                (Some(_), false) => Some("PATH"),
            },
            "sha256": self.sha256,
            "forced_command": self.forced_command,
            "version": agent.map(|a| &a.agent.version),
            "sandbox": agent.map(|a| &a.sandbox),
            "error": self.error,
        })
    }
}

fn check_script(remote_dir: &str) -> Result<String, BootstrapError> {
    // The same validation as the installer's directory.
    script(remote_dir)?;
    let version = env!("CARGO_PKG_VERSION");
    Ok(one_line_sh(&[
        "uname -sm",
        &format!("p=\"{remote_dir}/{version}/executor\""),
        "if [ -x \"$p\" ]; then echo \"installed $p\"; elif p=$(command -v executor); then echo \"path $p\"; else echo none; exit 0; fi",
        SHA256_FN,
        "sha256 \"$p\"",
    ]))
}

/// Report what `host` has, without installing: the agent a connection
/// would start (the bootstrapped copy in `remote_dir`, default
/// [`DEFAULT_REMOTE_DIR`], else the PATH), its SHA-256, and what it
/// answers to `initialize` (version, sandbox capabilities).
pub async fn check(
    host: &str,
    ssh: &SshOptions,
    remote_dir: Option<&str>,
) -> Result<Check, BootstrapError> {
    let text = check_script(remote_dir.unwrap_or(DEFAULT_REMOTE_DIR))?;
    let mut cmd = ssh.base_command(host)?;
    cmd.arg(text).stdin(std::process::Stdio::null());
    let out = cmd.output().await.map_err(|source| Error::Spawn {
        program: ssh.ssh_program.display().to_string(),
        source,
    })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let mut found = Check {
        platform: None,
        path: None,
        installed: false,
        sha256: None,
        forced_command: false,
        agent: None,
        error: None,
    };
    if out.status.code() == Some(2) && stderr.contains("may only run the executor") {
        found.forced_command = true;
    } else if !out.status.success() {
        return Err(BootstrapError::Failed {
            code: out.status.code(),
            stderr: stderr.trim().to_string(),
        });
    } else {
        let mut lines = stdout.lines();
        found.platform = lines.next().and_then(platform_of);
        match lines.next().and_then(|l| l.split_once(' ')) {
            Some((kind, path)) => {
                found.installed = kind == "installed";
                found.path = Some(path.to_string());
                found.sha256 = lines.next().map(str::to_string);
            }
            None => {
                found.error = Some("no bootstrapped copy and no executor on the PATH".into());
                return Ok(found);
            }
        }
    }
    let mut at = ssh.clone();
    if let Some(p) = &found.path {
        at.remote_command = p.clone();
        at.subsystem = false;
    }
    match crate::Client::connect_target(
        &crate::Target::ssh_with(host, at),
        crate::ClientOptions::default(),
    )
    .await
    {
        Ok(c) => {
            found.agent = Some(c.initialize_result().clone());
            let _ = c.close().await;
        }
        Err(e) => found.error = Some(e.to_string()),
    }
    Ok(found)
}

impl crate::Client {
    /// [`Client::connect_target`](crate::Client::connect_target) of
    /// [`Target::ssh_with`](crate::Target::ssh_with)`(host, ssh)`, installing the agent first when the host has none or
    /// one of another version: a failed start (no such command) or an agent
    /// whose version differs from this client's leads to [`bootstrap`] from
    /// `dist` into `remote_dir` (default [`DEFAULT_REMOTE_DIR`]), then to a
    /// connection to the installed agent. An agent error (a refused resume,
    /// a profile) is returned as it is, and a forced command refuses the
    /// install with a message saying why.
    pub async fn connect_ssh_bootstrapping(
        host: &str,
        ssh: &SshOptions,
        options: crate::ClientOptions,
        dist: &Path,
        remote_dir: Option<&str>,
    ) -> Result<(crate::Client, Option<Installed>), BootstrapError> {
        let ours = env!("CARGO_PKG_VERSION");
        match crate::Client::connect_target(
            &crate::Target::ssh_with(host, ssh.clone()),
            options.clone(),
        )
        .await
        {
            Ok(c) if c.initialize_result().agent.version == ours => return Ok((c, None)),
            Ok(c) => {
                tracing::info!(
                    theirs = %c.initialize_result().agent.version,
                    ours,
                    "the host's agent is another version: installing this one"
                );
                let _ = c.close().await;
            }
            Err(e @ Error::Remote(_)) => return Err(e.into()),
            Err(e) => tracing::info!(error = %e, "no agent on the host: installing it"),
        }
        let installed = bootstrap(host, ssh, dist, remote_dir).await?;
        let mut at = ssh.clone();
        at.remote_command = installed.path.clone();
        at.subsystem = false;
        let c = crate::Client::connect_target(&crate::Target::ssh_with(host, at), options).await?;
        Ok((c, Some(installed)))
    }
}

/// The installer over one SSH connection; `pick` chooses the bytes and the
/// digest announced for them once the platform is known. (Tests announce a
/// digest that does not match, as a corrupted transfer would.)
pub async fn install_with<F>(
    host: &str,
    ssh: &SshOptions,
    remote_dir: Option<&str>,
    pick: F,
) -> Result<Installed, BootstrapError>
where
    F: FnOnce(&str) -> Result<(Vec<u8>, String), BootstrapError>,
{
    let text = script(remote_dir.unwrap_or(DEFAULT_REMOTE_DIR))?;
    let mut cmd = ssh.base_command(host)?;
    cmd.arg(text)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|source| Error::Spawn {
        program: ssh.ssh_program.display().to_string(),
        source,
    })?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut stderr = child.stderr.take().expect("piped stderr");
    let err_task = tokio::spawn(async move {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s).await;
        s
    });
    let mut uname = String::new();
    stdout.read_line(&mut uname).await?;
    let platform = platform_of(&uname);
    let Some(platform) = platform.filter(|_| uname.split_whitespace().count() == 2) else {
        drop(stdin);
        let status = child.wait().await?;
        let stderr = err_task.await.unwrap_or_default();
        if status.code() == Some(2) && stderr.contains("may only run the executor") {
            return Err(BootstrapError::ForcedCommand);
        }
        if status.code() == Some(4) {
            return Err(BootstrapError::RemoteDir {
                dir: remote_dir.unwrap_or(DEFAULT_REMOTE_DIR).to_string(),
                message: stderr.trim().to_string(),
            });
        }
        if !status.success() {
            return Err(BootstrapError::Failed {
                code: status.code(),
                stderr: stderr.trim().to_string(),
            });
        }
        return Err(BootstrapError::Probe(uname.trim().to_string()));
    };
    let (bytes, digest) = match pick(&platform) {
        Ok(b) => b,
        Err(e) => {
            // End of input: the host removes the version directory it
            // made and exits.
            drop(stdin);
            let wait = std::time::Duration::from_secs(5);
            if tokio::time::timeout(wait, child.wait()).await.is_err() {
                let _ = child.kill().await;
            }
            return Err(e);
        }
    };
    // A host that stops reading (a full disk, a killed shell) shows as a
    // broken pipe here: its exit status and stderr say why.
    let sent = async {
        stdin.write_all(format!("{digest}\n").as_bytes()).await?;
        stdin.write_all(&bytes).await?;
        stdin.shutdown().await
    }
    .await;
    drop(stdin);
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).await?;
    let status = child.wait().await?;
    let stderr = err_task.await.unwrap_or_default();
    if let Err(e) = sent {
        if status.success() {
            return Err(e.into());
        }
    }
    match status.code() {
        Some(0) => {
            let mut lines = rest.lines();
            let path = lines.next().unwrap_or_default().to_string();
            let version_line = lines.next().unwrap_or_default().to_string();
            Ok(Installed {
                platform,
                path,
                sha256: sha256_hex(&bytes),
                version_line,
            })
        }
        Some(3) => Err(BootstrapError::ChecksumMismatch(stderr.trim().to_string())),
        code => Err(BootstrapError::Failed {
            code,
            stderr: stderr.trim().to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binary_names_its_platform_by_its_header() {
        let mut elf = b"\x7fELF\x02\x01\x01".to_vec();
        elf.resize(64, 0);
        elf[18] = 0xb7;
        assert_eq!(binary_platform(&elf).unwrap(), "linux-aarch64");
        elf[18] = 0x3e;
        assert_eq!(binary_platform(&elf).unwrap(), "linux-x86_64");
        let mut macho = 0xfeed_facf_u32.to_le_bytes().to_vec();
        macho.extend_from_slice(&0x0100_000c_u32.to_le_bytes());
        assert_eq!(binary_platform(&macho).unwrap(), "darwin-aarch64");
        assert!(binary_platform(b"#!/bin/sh\n").is_err());
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(
            binary_platform(&me).unwrap(),
            format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH)
        );
    }

    #[test]
    fn platforms_and_remote_dirs() {
        assert_eq!(
            platform_of("Linux x86_64\n").as_deref(),
            Some("linux-x86_64")
        );
        assert_eq!(
            platform_of("Darwin arm64").as_deref(),
            Some("darwin-aarch64")
        );
        assert_eq!(platform_of("").as_deref(), None);
        assert_eq!(platform_of("Linux ../../x").as_deref(), None);
        assert!(script("$HOME/.local/lib/executor").is_ok());
        assert!(script("/opt/executor").is_ok());
        for bad in [
            "",
            "relative",
            "/x; rm -rf /",
            "$(id)",
            "/a b",
            "$HOME/../`x`",
        ] {
            assert!(script(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn remote_scripts_are_one_line_for_any_login_shell() {
        for text in [
            script("$HOME/.local/lib/executor").unwrap(),
            check_script("/opt/executor").unwrap(),
        ] {
            let body = text
                .strip_prefix("sh -c '")
                .and_then(|b| b.strip_suffix('\''))
                .expect(&text);
            assert!(!body.contains(['\'', '!', '\n']), "{body}");
            assert!(!body.contains("\\\\"), "{body}");
        }
    }
}
