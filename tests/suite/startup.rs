//! Startup errors (issue 17): whatever stops the agent at start stops it
//! before the preamble, with its exit status, and the client reports the
//! agent's own message (not a missing answer to `initialize`).

use executor_client::{Client, ClientOptions, Error};
use executor_tests::*;

/// The agent with `config` (and `--profile`): its exit status and stdout
/// when run directly, and the client's error when connecting.
async fn refused(config: &str, profile: Option<&str>) -> (Option<i32>, Vec<u8>, String) {
    let dir = unique_tempdir("startup");
    let path = dir.join("config.toml");
    std::fs::write(&path, config).unwrap();
    let mut args = vec!["--config".to_string(), path.display().to_string()];
    if let Some(p) = profile {
        args.extend(["--profile".to_string(), p.to_string()]);
    }
    let out = std::process::Command::new(executor_bin())
        .args(&args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let mut cmd = tokio::process::Command::new(executor_bin());
    cmd.args(&args);
    let e = Client::spawn(cmd, ClientOptions::default())
        .await
        .expect_err("the agent refuses to start");
    assert!(matches!(e, Error::Exited { .. }), "{e:?}");
    (out.status.code(), out.stdout, e.to_string())
}

#[tokio::test]
async fn a_relative_sandbox_root_is_a_startup_error_naming_file_line_and_key() {
    let (code, stdout, e) = refused(
        "[profiles.ci]\nsandbox = { filesystem = { write = [\"src\"] } }\n",
        Some("ci"),
    )
    .await;
    assert_eq!(code, Some(78));
    assert!(
        stdout.is_empty(),
        "nothing, not even the preamble, on stdout"
    );
    assert!(e.contains("exited 78 before the agent started"), "{e}");
    assert!(
        e.contains(
            "config.toml:2: profiles.ci.sandbox.filesystem.write[0]: \"src\" is not absolute"
        ),
        "{e}"
    );
    // Positive control: the same profile with an absolute root serves.
    let dir = unique_tempdir("startup-ok");
    let path = dir.join("config.toml");
    std::fs::write(
        &path,
        "[profiles.ci]\nsandbox = { filesystem = { write = [\"/tmp\"] } }\n",
    )
    .unwrap();
    let mut cmd = tokio::process::Command::new(executor_bin());
    cmd.arg("--config").arg(&path).args(["--profile", "ci"]);
    let c = Client::spawn(cmd, ClientOptions::default()).await.unwrap();
    c.close().await.unwrap();
}

#[tokio::test]
async fn a_bad_type_names_its_key() {
    let (code, _, e) = refused("[profiles.a]\nallow_root = \"yes\"\n", Some("a")).await;
    assert_eq!(code, Some(78));
    assert!(e.contains(":2: profiles.a.allow_root: invalid type"), "{e}");
}

#[tokio::test]
async fn an_audit_file_that_cannot_be_written_stops_the_agent_before_the_preamble() {
    let (code, stdout, e) = refused(
        "[audit]\nfile = \"/proc/executor-nowhere/audit.log\"\n",
        None,
    )
    .await;
    assert_eq!(code, Some(73));
    assert!(stdout.is_empty(), "no preamble");
    assert!(e.contains("exited 73 before the agent started"), "{e}");
    assert!(
        e.contains("audit file /proc/executor-nowhere/audit.log"),
        "{e}"
    );
}

#[tokio::test]
async fn a_profile_refusing_root_stops_the_agent_before_the_preamble() {
    if !nix::unistd::geteuid().is_root() {
        prerequisite_missing("running as root (a profile refusing root)");
        return;
    }
    let (code, stdout, e) = refused("[profiles.user]\nallow_root = false\n", Some("user")).await;
    assert_eq!(code, Some(77));
    assert!(stdout.is_empty(), "no preamble");
    assert!(
        e.contains("profile user does not allow running as root"),
        "{e}"
    );
}

/// The job supervisor (the trampoline the agent starts through
/// `/proc/self/exe`) shows as `executor sandbox-exec` in `ps`: argv[0]
/// and comm, not `exe`.
#[tokio::test]
async fn the_trampoline_shows_as_executor_sandbox_exec() {
    use executor_protocol::types::process::ProcessStartParams;
    let c = local_client().await;
    let p = c
        .start(&ProcessStartParams::new(
            vec!["sleep".into(), "5".into()],
            "/",
            path_env(),
        ))
        .await
        .unwrap();
    let sup = parent_pid(p.pid());
    let comm = std::fs::read_to_string(format!("/proc/{sup}/comm")).unwrap();
    let cmdline = std::fs::read(format!("/proc/{sup}/cmdline")).unwrap();
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    assert_eq!(comm.trim(), "executor");
    assert_eq!(args[..2], ["executor", "sandbox-exec"], "{args:?}");
    let ps = std::process::Command::new("ps")
        .args(["-o", "args=", "-p", &sup.to_string()])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&ps.stdout).starts_with("executor sandbox-exec "),
        "{}",
        String::from_utf8_lossy(&ps.stdout)
    );
    p.signal(executor_protocol::types::process::SignalName::Kill)
        .await
        .unwrap();
}

/// Started on a terminal, the agent says on stderr what it is; stdout
/// carries the preamble only. Under a pipe (a client, sshd) it says nothing.
#[tokio::test]
async fn on_a_terminal_the_agent_says_what_it_is_on_stderr_only() {
    use std::io::Read;
    use std::process::Stdio;
    let pty = nix::pty::openpty(None, None).unwrap();
    // The master stays ours alone (the agent must see the hangup).
    nix::fcntl::fcntl(
        &pty.master,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )
    .unwrap();
    let mut child = std::process::Command::new(executor_bin())
        .stdin(Stdio::from(pty.slave))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut pre = [0u8; 16];
    stdout.read_exact(&mut pre).unwrap();
    assert_eq!(&pre, executor_protocol::PREAMBLE);
    // Ending the terminal ends the agent.
    drop(pty.master);
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let _ = child.wait();
    assert!(rest.is_empty(), "stdout is the protocol's only: {rest:?}");
    assert!(err.contains("the agent of executor-client"), "{err}");
    assert!(err.contains("executor --help"), "{err}");
    // Positive control: with stdin a pipe nothing is said.
    let out = std::process::Command::new(executor_bin())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("the agent of executor-client"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The audit file the agent creates is its owner's only (it names paths,
/// commands and hosts), whatever the umask it was started with.
#[tokio::test]
async fn an_audit_file_the_agent_creates_is_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = unique_tempdir("audit-mode");
    let log = dir.join("audit.log");
    let config = dir.join("config.toml");
    std::fs::write(&config, format!("[audit]\nfile = \"{}\"\n", log.display())).unwrap();
    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg("-c")
        .arg("umask 000; exec \"$0\" --config \"$1\"")
        .arg(executor_bin())
        .arg(&config);
    let c = Client::spawn(cmd, ClientOptions::default()).await.unwrap();
    let info = c
        .call(&executor_protocol::types::session::EnvironmentInfoParams {})
        .await
        .unwrap();
    assert!(!info.home.is_empty());
    c.close().await.unwrap();
    let mode = std::fs::metadata(&log).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "audit log mode {mode:o}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("environment/info"), "{text}");
    // Control: the umask really was 000 (a file the shell makes is 0666).
    let probe = dir.join("probe");
    let st = std::process::Command::new("sh")
        .arg("-c")
        .arg("umask 000; : > \"$0\"")
        .arg(&probe)
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(
        std::fs::metadata(&probe).unwrap().permissions().mode() & 0o777,
        0o666
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An agent started by a parent that ignores SIGCHLD (inherited across
/// exec: the kernel would reap every child itself) still reports its jobs'
/// real exit codes, sandboxed or not, and takes its login snapshot.
#[test]
fn an_ignored_sigchld_from_the_parent_does_not_hide_exit_codes() {
    let client = executor_bin().with_file_name("executor-client");
    let run = |args: &[&str]| {
        std::process::Command::new("python3")
            .arg("-c")
            .arg("import os, signal, sys\nsignal.signal(signal.SIGCHLD, signal.SIG_IGN)\nos.execv(sys.argv[1], sys.argv[1:])")
            .arg(&client)
            .args(args)
            .env("EXECUTOR_BIN", executor_bin())
            .output()
            .expect("python3")
    };
    for args in [
        &["run", "--", "sh", "-c", "exit 3"][..],
        &["run", "--tmp", "--", "sh", "-c", "exit 3"][..],
        &["run", "--clean-env", "--", "/bin/sh", "-c", "exit 3"][..],
    ] {
        let out = run(args);
        assert_eq!(
            out.status.code(),
            Some(3),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
