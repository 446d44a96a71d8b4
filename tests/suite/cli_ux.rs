//! What a new user of `executor-client` trips on (issue 33, items 1, 4, 5
//! and 8), through the real binaries, locally and over a real sshd: the
//! job's own exit status whatever it prints, ssh's flags after the verb,
//! modes kept by `get -r`/`put -r`, and errors said once, with the status
//! the man page gives.

use executor_tests::cli::*;
use executor_tests::sshd::Sshd;
use executor_tests::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

// Issue 33, item 1: a sandboxed job that prints "permission denied" and
// exits 2 makes the CLI exit 2 (the agent's `sandbox_denied` guess is a
// note on stderr); 125 only when the sandbox could not be set up or the
// request was refused before anything ran. Variants: a job the sandbox
// really denied (touch's own 1), a cwd the job's root does not hold
// (sandbox_unavailable), an fs request outside the read roots
// (sandbox_denied of the request).
#[test]
fn issue33_a_sandboxed_job_exits_with_its_own_status() {
    for via in Via::both() {
        let d = unique_tempdir("ux-status");
        let out = via.output(&[
            "run",
            "--rw",
            s(&d),
            "--",
            "sh",
            "-c",
            "echo 'permission denied' >&2; exit 2",
        ]);
        assert_eq!(out.status.code(), Some(2), "{} {}", via.name(), text(&out));
        assert!(stderr(&out).contains("note:"), "{}", text(&out));
        // The same job unconfined: no note (the agent guesses only for a
        // sandboxed job).
        let out = via.output(&[
            "run",
            "--",
            "sh",
            "-c",
            "echo 'permission denied' >&2; exit 2",
        ]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(!stderr(&out).contains("note:"), "{}", text(&out));
        // Really denied: touch's status, and the note.
        let out = via.output(&["run", "--rw", s(&d), "--", "touch", "/etc/executor-ux-x"]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert!(
            stderr(&out).contains("sandbox may have denied"),
            "{}",
            text(&out)
        );
        assert!(!Path::new("/etc/executor-ux-x").exists());
        // Refused before running: 125.
        let out = via.output(&["run", "--ro", "/usr", "--cwd", s(&d), "--", "/usr/bin/true"]);
        assert_eq!(out.status.code(), Some(125), "{}", text(&out));
        assert!(
            stderr(&out).contains("sandbox_unavailable"),
            "{}",
            text(&out)
        );
        let out = via.output(&["cat", "--ro", "/usr", "/etc/hostname"]);
        assert_eq!(out.status.code(), Some(125), "{}", text(&out));
        assert!(stderr(&out).contains("sandbox_denied"), "{}", text(&out));
    }
}

/// `ssh` wrapped by a script that logs its argv, one line per call.
fn logging_ssh(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let log = dir.join("argv");
    let wrapper = dir.join("ssh-wrapper");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nprintf '%s|' \"$@\" >> {}\necho >> {}\nexec ssh \"$@\"\n",
            log.display(),
            log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    (wrapper, log)
}

// Issue 33, item 4: ssh's flags after the verb, as `--target` is taken
// there (`run --target box -F cfg`), and `-o "Key Value"` as ssh takes it;
// every `-o` of both sides reaches ssh. Variants: every flag after the
// verb (-F with a Host alias; -i -p -l), `-o` on both sides, `get -p`
// still get's own, a malformed `-o` (bad usage, 2, naming it).
#[test]
fn issue33_connection_flags_are_taken_after_the_verb() {
    let sshd = Sshd::start("", "");
    let dir = unique_tempdir("ux-flags");
    let config = dir.join("config");
    std::fs::write(
        &config,
        format!(
            "Host box\n  HostName 127.0.0.1\n  Port {}\n  User {}\n  IdentityFile {}\n",
            sshd.port,
            sshd.user,
            sshd.client_key.display(),
        ),
    )
    .unwrap();
    let (wrapper, log) = logging_ssh(&dir);
    let exe = executor_bin().to_string_lossy().into_owned();
    // `-o "Key Value"`: the test server's options in ssh's other form.
    let spaced: Vec<String> = sshd
        .ssh_o_options()
        .iter()
        .map(|o| o.replacen('=', " ", 1))
        .collect();
    let mut after: Vec<String> = vec!["--target".into(), "box".into(), "run".into()];
    after.extend(["-F".into(), s(&config).into()]);
    after.extend(["--remote-command".into(), exe.clone()]);
    for o in &spaced {
        after.extend(["-o".into(), o.clone()]);
    }
    after.extend(["--", "sh", "-c", "echo via-$SSH_CONNECTION"].map(String::from));
    let out = Command::new(client_bin())
        .args(&after)
        .env("EXECUTOR_SSH", &wrapper)
        .env_remove("EXECUTOR_TARGET")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("via-127.0.0.1"),
        "{}",
        text(&out)
    );
    let argv = std::fs::read_to_string(&log).unwrap();
    assert!(
        argv.contains(&format!("-F|{}|", config.display())),
        "{argv}"
    );
    assert!(argv.contains("|-o|BatchMode=yes|"), "{argv}");
    // -i -p -l after the verb (`run` has no such letter of its own).
    let mut args: Vec<String> = vec!["--target".into(), "127.0.0.1".into(), "run".into()];
    args.extend(["-i".into(), s(&sshd.client_key).into()]);
    args.extend([
        "-p".into(),
        sshd.port.to_string(),
        "-l".into(),
        sshd.user.clone(),
    ]);
    args.extend(["--remote-command".into(), exe.clone()]);
    for o in sshd.ssh_o_options() {
        args.extend(["-o".into(), o]);
    }
    args.extend(["--", "sh", "-c", "echo via-$SSH_CONNECTION"].map(String::from));
    let out = Command::new(client_bin())
        .args(&args)
        .env_remove("EXECUTOR_TARGET")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("via-127.0.0.1"),
        "{}",
        text(&out)
    );
    // After `get`, -p is get's (modes and times), the port before it.
    let file = dir.join("stamped");
    std::fs::write(&file, "x").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&file)
        .unwrap()
        .set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_234_567_890))
        .unwrap();
    let got = dir.join("got");
    let out = Command::new(client_bin())
        .args(ssh_flags(&sshd, &exe))
        .args(["get", "-p", s(&file), s(&got)])
        .env_remove("EXECUTOR_TARGET")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(std::fs::metadata(&got).unwrap().mtime(), 1_234_567_890);
    // Both sides: the -o before the verb and the one after both reach ssh.
    std::fs::write(&log, "").unwrap();
    let (first, rest) = spaced.split_first().unwrap();
    let mut args: Vec<String> = vec!["-o".into(), first.clone(), "-F".into(), s(&config).into()];
    args.extend(["--target", "box", "info"].map(String::from));
    for o in rest {
        args.extend(["-o".into(), o.clone()]);
    }
    args.extend(["--remote-command".into(), exe.clone()]);
    let out = Command::new(client_bin())
        .args(&args)
        .env("EXECUTOR_SSH", &wrapper)
        .env_remove("EXECUTOR_TARGET")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let argv = std::fs::read_to_string(&log).unwrap();
    for o in sshd.ssh_o_options() {
        assert!(argv.contains(&format!("|-o|{o}|")), "{o}: {argv}");
    }
    // Malformed: bad usage naming it, before ssh runs (before or after
    // the verb, whatever the target).
    for args in [
        &["-o", "NoValue", "--target", "box", "info"][..],
        &["--target", "box", "info", "-o", "NoValue"][..],
        &["info", "-o", "NoValue"][..],
        &[
            "-o",
            "User=x\nProxyCommand=touch /tmp/x",
            "--target",
            "box",
            "info",
        ][..],
    ] {
        std::fs::write(&log, "").unwrap();
        let out = Command::new(client_bin())
            .args(args)
            .env("EXECUTOR_SSH", &wrapper)
            .env_remove("EXECUTOR_TARGET")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        let bad = args[args.iter().position(|a| *a == "-o").unwrap() + 1];
        let shown = format!("{bad:?}");
        assert!(stderr(&out).contains(&shown), "{shown}: {}", text(&out));
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "", "ssh not run");
    }
}

/// `path`'s permission bits.
fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

/// `executor-client` under umask 022 (the copy's local side applies it).
fn umask_022(via: &Via, args: &[&str]) -> std::process::Output {
    Command::new("sh")
        .arg("-c")
        .arg("umask 022; exec \"$0\" \"$@\"")
        .arg(client_bin())
        .args(via.flags())
        .args(args)
        .env_remove("EXECUTOR_TARGET")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

// Issue 33, item 5: `get -r`/`put -r` without -p keep modes as scp and cp
// do (755 stayed 644 before); -p keeps mtimes too. Variants: an
// executable, a private file and a private directory, both ways, over
// both transports; with and without -p.
#[test]
fn issue33_get_r_and_put_r_keep_modes_and_p_keeps_times() {
    for via in Via::both() {
        let d = unique_tempdir("ux-modes");
        let src = d.join("src");
        std::fs::create_dir_all(src.join("private")).unwrap();
        std::fs::write(src.join("run.sh"), "#!/bin/sh\n").unwrap();
        std::fs::write(src.join("private/key"), "k").unwrap();
        std::fs::set_permissions(src.join("run.sh"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        std::fs::set_permissions(
            src.join("private/key"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        std::fs::set_permissions(src.join("private"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
        let old = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
        for f in ["run.sh", "private/key"] {
            std::fs::File::options()
                .write(true)
                .open(src.join(f))
                .unwrap()
                .set_modified(old)
                .unwrap();
        }
        let check = |root: &Path, times: bool| {
            assert_eq!(
                mode(&root.join("run.sh")),
                0o755,
                "{} {}",
                via.name(),
                root.display()
            );
            assert_eq!(mode(&root.join("private")), 0o700, "{}", root.display());
            assert_eq!(mode(&root.join("private/key")), 0o600, "{}", root.display());
            let mtime = std::fs::metadata(root.join("private/key")).unwrap().mtime();
            assert_eq!(
                mtime == 1_000_000_000,
                times,
                "{} mtime {mtime}",
                root.display()
            );
        };
        for (flags, times) in [(&["-r"][..], false), (&["-r", "-p"][..], true)] {
            let tag = if times { "p" } else { "plain" };
            let put_to = d.join(format!("put-{tag}"));
            let got = d.join(format!("got-{tag}"));
            let args = [&["put"], flags, &[s(&src), s(&put_to)]].concat();
            let out = umask_022(&via, &args);
            assert!(out.status.success(), "{args:?}: {}", text(&out));
            check(&put_to, times);
            let args = [&["get"], flags, &[s(&put_to), s(&got)]].concat();
            let out = umask_022(&via, &args);
            assert!(out.status.success(), "{args:?}: {}", text(&out));
            check(&got, times);
        }
    }
}

// Issue 33, item 8: an ssh failure printed once (ssh's own line, no
// `\x0d`), usage errors exit 2 naming the value, `put` into /proc says
// what happened (not `not_found`), `-v` shows the ssh command run. (A
// second Ctrl-C exits 130: cli_jobs'
// stdin_is_forwarded_unless_n_and_ctrl_c_interrupts_the_job.)
#[test]
fn issue33_errors_are_said_once_with_the_documented_status() {
    let out = Command::new(client_bin())
        .args([
            "-o",
            "BatchMode=yes",
            "--target",
            "ssh://nobody@127.0.0.1:1",
            "info",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(255), "{}", text(&out));
    let err = stderr(&out);
    assert_eq!(err.matches("Connection refused").count(), 1, "{err}");
    assert!(!err.contains("\\x0d") && !err.contains('\r'), "{err:?}");
    assert!(
        err.contains("ssh exited 255 before the agent started"),
        "{err}"
    );
    // Usage errors: 2, naming the value.
    let d = unique_tempdir("ux-usage");
    let bad_json = d.join("intent.json");
    std::fs::write(&bad_json, "{\"filesystem\": ").unwrap();
    let unknown_key = d.join("unknown.json");
    std::fs::write(&unknown_key, "{\"filesystem\": {\"deny_reads\": []}}").unwrap();
    for (args, named) in [
        (vec!["-o", "Foo", "info"], "\"Foo\""),
        (
            vec!["run", "--sandbox", s(&bad_json), "--", "true"],
            s(&bad_json),
        ),
        (
            vec!["run", "--sandbox", s(&unknown_key), "--", "true"],
            "deny_reads",
        ),
        (vec!["run", "--env", "NOEQUALS", "--", "true"], "NOEQUALS"),
        (vec!["run", "--env", "=x", "--", "true"], "\"=x\""),
        (
            vec!["--connect-timeout", "nan", "info"],
            "--connect-timeout NaN",
        ),
    ] {
        let out = Via::Local.output(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(stderr(&out).contains(named), "{named}: {}", text(&out));
    }
    // `put` into /proc: the filesystem takes no new files.
    let f = d.join("f");
    std::fs::write(&f, "x").unwrap();
    for via in Via::both() {
        let out = via.output(&["put", s(&f), "/proc/executor-ux"]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        let err = stderr(&out);
        assert!(!err.contains("not_found"), "{err}");
        assert!(
            err.contains("permission_denied")
                && err.contains("/proc/executor-ux")
                && err.contains("proc filesystem"),
            "{err}"
        );
        let out = via.output(&["mkdir", "/proc/executor-ux"]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert!(stderr(&out).contains("proc filesystem"), "{}", text(&out));
    }
    // -v: the ssh command line run, once.
    let via = Via::Ssh(Sshd::start("", ""));
    let out = via.output(&["-v", "info"]);
    assert!(out.status.success(), "{}", text(&out));
    let err = stderr(&out);
    let line = err
        .lines()
        .find(|l| l.contains("running ssh"))
        .unwrap_or_else(|| panic!("no ssh command logged: {err}"));
    let Via::Ssh(sshd) = &via else { unreachable!() };
    assert!(
        line.contains("ssh -T")
            && line.contains(&format!("-p {}", sshd.port))
            && line.contains("BatchMode=yes"),
        "{line}"
    );
    assert!(!line.contains("resume_token"), "{line}");
}
