//! `executor-client` as ssh users expect it: ssh's flags, ssh's exit
//! statuses, a bounded connect (issue 16, items 1-3), through the real
//! binaries, locally and over a real sshd.

use executor_tests::cli::*;
use executor_tests::sshd::Sshd;
use executor_tests::*;
use std::process::Command;
use std::time::{Duration, Instant};

/// A shell script at a fresh path.
fn script(tag: &str, body: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = unique_tempdir(tag).join("agent.sh");
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn ssh_flags_reach_ssh_as_ssh_takes_them() {
    let sshd = Sshd::start("", "");
    let via = Via::Ssh(Sshd::start("", ""));
    // -i -p -l -o --remote-command: SSH_CONNECTION proves sshd ran it.
    let out = via.output(&["run", "--", "sh", "-c", "echo $SSH_CONNECTION"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("127.0.0.1"),
        "{}",
        text(&out)
    );
    // -F with a Host alias, -J through a jump host (the same sshd), and
    // EXECUTOR_SSH naming the ssh program (a wrapper that logs its argv).
    let dir = unique_tempdir("ssh-config");
    let config = dir.join("config");
    std::fs::write(
        &config,
        format!(
            "Host box jump\n  HostName 127.0.0.1\n  Port {}\n  User {}\n  IdentityFile {}\n  \
             StrictHostKeyChecking no\n  UserKnownHostsFile {}\n  BatchMode yes\n  LogLevel ERROR\n",
            sshd.port,
            sshd.user,
            sshd.client_key.display(),
            dir.join("known_hosts").display()
        ),
    )
    .unwrap();
    let log = dir.join("argv");
    let wrapper = script(
        "ssh-wrapper",
        &format!("echo \"$@\" >> {}\nexec ssh \"$@\"", log.display()),
    );
    let exe = executor_bin().to_string_lossy().into_owned();
    let out = Command::new(client_bin())
        .args([
            "-F",
            config.to_str().unwrap(),
            "-J",
            "jump",
            "--remote-command",
            &exe,
        ])
        .args(["--target", "box", "run", "--", "sh", "-c", "echo via-box"])
        .env("EXECUTOR_SSH", &wrapper)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "via-box\n");
    let argv = std::fs::read_to_string(&log).unwrap();
    assert!(
        argv.contains("-F ") && argv.contains("-J jump") && argv.contains("box"),
        "{argv}"
    );
    // EXECUTOR_TARGET is the default target; ssh://user@host:port works.
    let mut flags = ssh_flags(&sshd, &exe);
    flags.truncate(flags.len() - 2); // drop --target 127.0.0.1
    let out = Command::new(client_bin())
        .args(&flags)
        .args(["run", "--", "sh", "-c", "echo $SSH_CONNECTION"])
        .env(
            "EXECUTOR_TARGET",
            format!("ssh://{}@127.0.0.1:{}", sshd.user, sshd.port),
        )
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("127.0.0.1"),
        "{}",
        text(&out)
    );
    // A smuggled option (a newline) is refused before ssh runs: bad usage.
    let out = Command::new(client_bin())
        .args([
            "-o",
            "User=x\nProxyCommand=touch /tmp/x",
            "--target",
            "box",
            "info",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("ProxyCommand"),
        "{}",
        text(&out)
    );
}

#[test]
fn the_subsystem_flag_asks_for_the_subsystem() {
    let sshd = Sshd::start(
        "",
        &format!("Subsystem executor {}", executor_bin().display()),
    );
    let mut flags = ssh_flags(&sshd, "executor");
    flags.push("--subsystem".into());
    let out = Command::new(client_bin())
        .args(&flags)
        .args(["run", "--", "sh", "-c", "echo sub"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "sub\n",
        "{}",
        text(&out)
    );
}

/// The pids whose parent is `pid`.
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| {
            // A process may end between the listing and the read.
            std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|stat| {
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                    .and_then(|pp| pp.parse::<u32>().ok())
                    == Some(pid)
            })
        })
        .collect()
}

#[test]
fn exit_statuses_follow_ssh() {
    let dir = unique_tempdir("exit-codes");
    let plain = dir.join("not-executable");
    std::fs::write(&plain, "#!/bin/sh\n").unwrap();
    for via in Via::both() {
        let code = |args: &[&str]| via.output(args).status.code();
        assert_eq!(
            code(&["run", "--", "sh", "-c", "exit 7"]),
            Some(7),
            "{}",
            via.name()
        );
        assert_eq!(code(&["run", "--", "sh", "-c", "kill -TERM $$"]), Some(143));
        let out = via.output(&["run", "--", "no-such-program-x"]);
        assert_eq!(out.status.code(), Some(127), "{}", text(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains("no-such-program-x"));
        assert_eq!(code(&["run", "--", plain.to_str().unwrap()]), Some(126));
        // A failed request: 1, naming the path.
        let out = via.output(&["cat", dir.join("missing").to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains("missing"));
        // The connection dropped mid-run (the transport, agent or ssh,
        // killed): 255, not 1.
        let mut child = via
            .cmd(&["run", "--", "sh", "-c", "echo up; exec sleep 30"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line, "up\n");
        for pid in children(child.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(255), "{}", via.name());
        // The sandbox denied a write: touch's own status, and a note
        // (issue 33: 125 only when nothing ran).
        let out = via.output(&[
            "run",
            "--rw",
            dir.to_str().unwrap(),
            "--",
            "touch",
            "/etc/executor-cli-test",
        ]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("sandbox may have denied"),
            "{}",
            text(&out)
        );
    }
    // ssh failing before the agent starts: 255, the target as typed.
    let out = Command::new(client_bin())
        .args([
            "-o",
            "BatchMode=yes",
            "--target",
            "ssh://nobody@127.0.0.1:1",
            "info",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(255));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("connecting to ssh://nobody@127.0.0.1:1"),
        "{err}"
    );
    assert!(
        err.contains("ssh exited 255 before the agent started"),
        "{err}"
    );
    assert!(!err.contains("Ssh {"), "no debug text: {err}");
}

#[test]
fn a_missing_remote_agent_suggests_bootstrap() {
    let sshd = Sshd::start("", "");
    let out = Command::new(client_bin())
        .args(ssh_flags(&sshd, "/nonexistent/executor"))
        .arg("info")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(255), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("exited 127"), "{err}");
    assert!(
        err.contains("executor-client bootstrap") && err.contains("--remote-command"),
        "{err}"
    );
}

#[test]
fn connecting_is_bounded_and_names_another_wire_version() {
    let silent = script("silent", "exec sleep 30");
    let mute = script("mute", "printf '\\000EXECUTOR-WIRE1\\n'; exec sleep 30");
    let wire2 = script(
        "wire2",
        "printf 'motd\\n\\000EXECUTOR-WIRE2\\n'; exec sleep 30",
    );
    let sshd = Sshd::start("", "");
    for (agent, expect) in [
        (&silent, "waiting for the preamble"),
        (&mute, "waiting for the initialize answer"),
        (&wire2, "the agent speaks wire 2, this client speaks 1"),
    ] {
        // Locally (EXECUTOR_BIN) and over ssh (--remote-command).
        let local = {
            let mut c = Command::new(client_bin());
            c.args(["--connect-timeout", "1", "info"])
                .env("EXECUTOR_BIN", agent);
            c
        };
        let remote = {
            let mut c = Command::new(client_bin());
            // ssh's own handshake takes part of the bound.
            c.args(ssh_flags(&sshd, &agent.to_string_lossy())).args([
                "--connect-timeout",
                "4",
                "info",
            ]);
            c
        };
        for mut cmd in [local, remote] {
            let started = Instant::now();
            let out = cmd.stdin(std::process::Stdio::null()).output().unwrap();
            assert!(started.elapsed() < Duration::from_secs(10), "bounded");
            assert_eq!(out.status.code(), Some(255), "{}", text(&out));
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains(expect), "{err}");
        }
    }
}
