//! `executor-client bootstrap` and what follows it, over a real sshd
//! (issue 17): the host's session gets an empty home and a PATH without any
//! `executor` (sshd's `SetEnv`), the CLI the real `ssh` (configured by a
//! `-F` file through a wrapper named `ssh` first on its PATH).

use executor_tests::sshd::Sshd;
use executor_tests::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn client_bin() -> PathBuf {
    executor_bin().with_file_name("executor-client")
}

/// A host whose sessions run with `HOME=home` and a PATH of only the tools
/// the installer, the launcher and the agent's login-shell snapshot
/// (`printf`, `env`: builtins of bash and fish, not of tcsh) use (plus
/// `extra` programs).
struct Host {
    sshd: Sshd,
    /// Removed with the host (it holds an installed agent).
    base: PathBuf,
    home: PathBuf,
    /// The CLI's PATH: the `ssh` wrapper first.
    client_path: String,
}

fn host(tag: &str, extra: &[(&str, &Path)]) -> Host {
    host_as(tag, extra, None)
}

/// [`host`], logging in as `user` (whose login shell sshd runs the
/// remote command with) instead of the test's own user.
fn host_as(tag: &str, extra: &[(&str, &Path)], user: Option<&str>) -> Host {
    let base = unique_tempdir(tag);
    let home = base.join("home");
    let bin = base.join("bin");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&bin).unwrap();
    for tool in [
        "sh",
        "uname",
        "mkdir",
        "rmdir",
        "cat",
        "sha256sum",
        "cut",
        "chmod",
        "mv",
        "rm",
        "id",
        "ls",
        "mktemp",
        "printf",
        "env",
    ] {
        let real = ["/usr/bin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(tool))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("no {tool} on this machine"));
        std::os::unix::fs::symlink(real, bin.join(tool)).unwrap();
    }
    for (name, target) in extra {
        std::os::unix::fs::symlink(target, bin.join(name)).unwrap();
    }
    let mut sshd = Sshd::start(
        "",
        &format!("SetEnv HOME={} PATH={}", home.display(), bin.display()),
    );
    if let Some(user) = user {
        sshd.user = user.to_string();
        let uid = nix::unistd::User::from_name(user)
            .unwrap()
            .expect("the user exists")
            .uid;
        chown_r(&home, uid.as_raw());
    }
    // The client side: `ssh` is the real one with this server's settings.
    let wrap = base.join("client-bin");
    std::fs::create_dir_all(&wrap).unwrap();
    let mut cfg = format!(
        "Host 127.0.0.1\n  User {}\n  IdentityFile {}\n",
        sshd.user,
        sshd.client_key.display()
    );
    for o in sshd.ssh_o_options() {
        let (k, v) = o.split_once('=').unwrap();
        cfg.push_str(&format!("  {k} {v}\n"));
    }
    std::fs::write(base.join("ssh_config"), cfg).unwrap();
    let ssh = wrap.join("ssh");
    std::fs::write(
        &ssh,
        format!(
            "#!/bin/sh\nexec /usr/bin/ssh -F {} \"$@\"\n",
            base.join("ssh_config").display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&ssh, std::fs::Permissions::from_mode(0o755)).unwrap();
    let client_path = format!("{}:{}", wrap.display(), std::env::var("PATH").unwrap());
    Host {
        sshd,
        base,
        home,
        client_path,
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

impl Host {
    /// `bootstrap --from DIST --remote-dir BASE`.
    fn bootstrap_into(&self, dist: &Path, base: &Path) -> Output {
        self.cli(&[
            "bootstrap",
            "--from",
            dist.to_str().unwrap(),
            "--remote-dir",
            base.to_str().unwrap(),
        ])
    }

    fn target(&self) -> String {
        format!("ssh://127.0.0.1:{}", self.sshd.port)
    }

    /// `executor-client --target … ARGS`, info logs on.
    fn cli(&self, args: &[&str]) -> Output {
        Command::new(client_bin())
            .arg("--target")
            .arg(self.target())
            .args(args)
            .env("PATH", &self.client_path)
            .env("RUST_LOG", "executor_client=info")
            .env_remove("EXECUTOR_BIN")
            .output()
            .expect("run executor-client")
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A dist folder (in the host's folder) holding this build's agent for
/// this machine (a link: bootstrap reads the bytes).
fn dist(h: &Host) -> PathBuf {
    let dist = h.base.join("dist");
    let platform = format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH);
    std::fs::create_dir_all(dist.join(&platform)).unwrap();
    std::os::unix::fs::symlink(executor_bin(), dist.join(&platform).join("executor")).unwrap();
    dist
}

#[test]
fn after_bootstrap_into_an_empty_home_run_works_with_no_other_flag() {
    let h = host("boot-empty", &[]);
    // Before: the host has no agent anywhere; the error is the host's own.
    let out = h.cli(&["run", "--", "true"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("executor: not found"), "{err}");
    assert!(err.contains("exited 127 before the agent started"), "{err}");
    // Install.
    let dist = dist(&h);
    let out = h.cli(&["bootstrap", "--from", dist.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let installed = h
        .home
        .join(".local/lib/executor")
        .join(env!("CARGO_PKG_VERSION"))
        .join("executor");
    assert!(installed.is_file(), "{}", text(&out.stdout));
    // After: the same command line works, through the installed copy.
    let out = h.cli(&["run", "--", "sh", "-c", "echo ran-remotely"]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(text(&out.stdout), "ran-remotely\n");
    assert!(err.contains("the host runs this agent"), "{err}");
    assert!(err.contains(installed.to_str().unwrap()), "{err}");
    // The launcher's marker lines are taken out (the ssh command `-v`
    // logs holds the launcher's text, not a marker line).
    assert!(
        !err.lines().any(|l| l.starts_with("executor-launch:")),
        "the marker is taken out: {err}"
    );
    // --check reports it without installing anything.
    let before = std::fs::metadata(&installed).unwrap().modified().unwrap();
    let out = h.cli(&["bootstrap", "--check"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["path"], installed.to_str().unwrap(), "{report}");
    assert_eq!(report["source"], "bootstrapped copy");
    let sha: String = ring::digest::digest(
        &ring::digest::SHA256,
        &std::fs::read(executor_bin()).unwrap(),
    )
    .as_ref()
    .iter()
    .map(|b| format!("{b:02x}"))
    .collect();
    assert_eq!(report["sha256"], sha);
    assert_eq!(report["version"], env!("CARGO_PKG_VERSION"));
    assert!(report["sandbox"]["enforceable"].is_boolean(), "{report}");
    assert_eq!(
        std::fs::metadata(&installed).unwrap().modified().unwrap(),
        before
    );
}

/// The installer, `--check` and the launcher are `sh -c '…'` one-liners:
/// they work for a user whose login shell is fish or tcsh (neither parses
/// POSIX `if`/`case`; tcsh refuses a newline inside quotes). `.ci/run`
/// creates the users `executor-fish` and `executor-tcsh`.
#[test]
fn bootstrap_check_and_run_work_under_fish_and_tcsh_login_shells() {
    if current_uid() != 0 {
        return prerequisite_missing("root (to log in as executor-fish / executor-tcsh)");
    }
    for (user, shell) in [("executor-fish", "fish"), ("executor-tcsh", "tcsh")] {
        match nix::unistd::User::from_name(user) {
            Ok(Some(u)) if u.shell.ends_with(shell) => {}
            _ => {
                prerequisite_missing(&format!(
                    "user {user} with login shell {shell} (.ci/run creates it)"
                ));
                continue;
            }
        }
        let h = host_as(&format!("boot-{shell}"), &[], Some(user));
        // The login shell really is the one under test (fish and tcsh set
        // `$version`; a POSIX shell does not).
        let out = h.sshd.ssh("echo $version").output().expect("ssh");
        assert!(
            !text(&out.stdout).trim().is_empty(),
            "{user}'s login shell is not {shell}: {}",
            text(&out.stderr)
        );
        let dist = dist(&h);
        let out = h.cli(&["bootstrap", "--from", dist.to_str().unwrap()]);
        assert!(out.status.success(), "{shell}: {}", text(&out.stderr));
        let installed = h
            .home
            .join(".local/lib/executor")
            .join(env!("CARGO_PKG_VERSION"))
            .join("executor");
        assert!(installed.is_file(), "{shell}: {}", text(&out.stdout));
        let out = h.cli(&["run", "--", "sh", "-c", "id -un"]);
        let err = text(&out.stderr);
        assert!(out.status.success(), "{shell}: {err}");
        assert_eq!(text(&out.stdout), format!("{user}\n"));
        assert!(err.contains(installed.to_str().unwrap()), "{shell}: {err}");
        let out = h.cli(&["bootstrap", "--check"]);
        assert!(out.status.success(), "{shell}: {}", text(&out.stderr));
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["source"], "bootstrapped copy", "{shell}: {report}");
        assert_eq!(
            report["sha256"].as_str().map(str::len),
            Some(64),
            "{report}"
        );
    }
}

#[test]
fn without_a_bootstrapped_copy_the_path_executor_is_used_and_said() {
    let h = host("boot-path", &[("executor", &executor_bin())]);
    let out = h.cli(&["run", "--", "true"]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("executor from the PATH"), "{err}");
    let out = h.cli(&["bootstrap", "--check"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["source"], "PATH", "{report}");
}

#[test]
fn an_unwritable_remote_dir_names_the_remote_error() {
    let h = host("boot-unwritable", &[]);
    let dist = dist(&h);
    let out = h.bootstrap_into(&dist, Path::new("/proc/executor-nowhere"));
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("cannot install into /proc/executor-nowhere on the host: mkdir"),
        "{err}"
    );
    assert!(!err.contains("Broken pipe"), "{err}");
}

/// A directory others can write (where another user could swap the agent
/// between its check and its first run) is refused, and nothing is put in
/// it; the same directory made private works (the positive control).
#[test]
fn a_remote_dir_writable_by_others_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let h = host("boot-shared", &[]);
    let dist = dist(&h);
    let base = h.base.join("shared");
    let dir = base.join(env!("CARGO_PKG_VERSION"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let install = || h.bootstrap_into(&dist, &base);
    let out = install();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("is writable by others; nothing installed"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "nothing left in it"
    );
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let out = install();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(dir.join("executor").is_file());
}

#[test]
fn a_missing_build_names_the_build_to_make() {
    let h = host("boot-nobuild", &[]);
    let empty = h.base.join("empty-dist");
    std::fs::create_dir_all(&empty).unwrap();
    let out = h.cli(&["bootstrap", "--from", empty.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    let want = format!(
        "packaging/build-dist.sh {}-unknown-linux-gnu.2.17",
        std::env::consts::ARCH
    );
    assert!(err.contains(&want), "{err}");
    let version_dir = h
        .home
        .join(".local/lib/executor")
        .join(env!("CARGO_PKG_VERSION"));
    assert!(!version_dir.exists(), "nothing left on the host");
}

/// A version directory owned by another user is refused even when the
/// installing user may write to it (root may write anywhere): its owner
/// could swap the installed agent.
#[test]
fn a_remote_dir_owned_by_another_user_is_refused() {
    if current_uid() != 0 {
        return prerequisite_missing("root (to make a directory another user owns)");
    }
    let h = host("boot-owned", &[]);
    let dist = dist(&h);
    let base = h.base.join("owned");
    let dir = base.join(env!("CARGO_PKG_VERSION"));
    std::fs::create_dir_all(&dir).unwrap();
    chown_r(&dir, 65534);
    let install = || h.bootstrap_into(&dist, &base);
    let out = install();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("is not owned by root; nothing installed"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "nothing in it");
    // Control: the same directory, owned by the installing user.
    chown_r(&dir, 0);
    let out = install();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(dir.join("executor").is_file());
}

/// The native (russh) transport asked for the default `executor` sends the
/// same launcher as the OpenSSH one: after a bootstrap it starts the
/// installed copy on a host whose PATH has no `executor`.
#[test]
fn the_native_transport_starts_the_bootstrapped_copy_by_default() {
    use executor_client::{Client, ClientOptions};
    let h = host("boot-native", &[]);
    // The default remote command: the bootstrapped copy when there is one.
    let opts = h.sshd.native_options(std::path::Path::new("executor"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let connect = || {
        rt.block_on(async {
            let c =
                Client::connect_native_ssh("127.0.0.1", &opts, ClientOptions::default()).await?;
            let version = c.initialize_result().agent.version.clone();
            c.close().await?;
            Ok::<_, executor_client::Error>(version)
        })
    };
    // Control: before the install there is no agent to start (the host's
    // PATH has no `executor`).
    let e = connect().expect_err("no agent before the install");
    assert!(e.to_string().contains("executor"), "{e}");
    let dist = dist(&h);
    let out = h.cli(&["bootstrap", "--from", dist.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let version = connect().expect("the launcher started the installed copy");
    assert_eq!(version, env!("CARGO_PKG_VERSION"));
}

/// Issue 33, item 7: `--from` takes a plain agent binary too (no
/// `<os>-<arch>/` folder made by hand), and refuses one built for another
/// platform, naming both.
#[test]
fn bootstrap_takes_a_plain_binary_of_the_hosts_platform_and_refuses_another() {
    let h = host("boot-plain", &[]);
    let here = format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH);
    // Another architecture: the same file with its ELF e_machine changed.
    let other_arch = if std::env::consts::ARCH == "aarch64" {
        ("x86_64", 0x3e_u8)
    } else {
        ("aarch64", 0xb7_u8)
    };
    let foreign = h.base.join("executor-foreign");
    let mut bytes = std::fs::read(executor_bin()).unwrap();
    bytes[18] = other_arch.1;
    bytes[19] = 0;
    std::fs::write(&foreign, &bytes).unwrap();
    let out = h.cli(&["bootstrap", "--from", foreign.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!(
            "is a linux-{} build, but the host is {here}",
            other_arch.0
        )),
        "{err}"
    );
    let version_dir = h
        .home
        .join(".local/lib/executor")
        .join(env!("CARGO_PKG_VERSION"));
    assert!(!version_dir.exists(), "nothing left on the host");
    // Not an executable at all.
    let script = h.base.join("not-a-build");
    std::fs::write(&script, "#!/bin/sh\n").unwrap();
    let out = h.cli(&["bootstrap", "--from", script.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("neither an ELF"),
        "{}",
        text(&out.stderr)
    );
    // This machine's own agent binary, as it is.
    let out = h.cli(&["bootstrap", "--from", executor_bin().to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(&here), "{}", text(&out.stdout));
    assert!(version_dir.join("executor").is_file());
    let out = h.cli(&["run", "--", "sh", "-c", "echo ran-remotely"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "ran-remotely\n");
}
