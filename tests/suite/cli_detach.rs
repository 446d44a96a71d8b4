//! Detached sessions as a tmux or nohup user expects them (issue 33, item
//! 2), through the real client on a real PTY, locally and over a real
//! sshd: the detach key (`~.`), a closed terminal (SIGHUP) and SIGTERM
//! leave the job running; the printed reattach command works as printed
//! (connection flags included); `attach` of a job that already exited
//! shows its output and exits with its status; tokens of sessions that
//! ended or expired are removed.

use executor_tests::cli::*;
use executor_tests::*;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::time::Duration;

/// Drives `argv` on a new PTY (its controlling terminal). Steps, from the
/// environment: `SEND_AFTER` a `|`-separated list of `WAIT=>KEYS` pairs
/// (type KEYS, `\r` as Enter, once WAIT appeared); then `HANGUP=1` closes
/// the terminal (SIGHUP), else it reads until the client exits. Prints
/// the screen; exits with the client's status (99 when it had to be
/// killed).
const DRIVER: &str = r#"
import os, pty, sys, time
pid, fd = pty.fork()
if pid == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
seen = b""
def until(token, secs=25):
    global seen
    deadline = time.time() + secs
    while token not in seen and time.time() < deadline:
        try:
            seen += os.read(fd, 4096)
        except OSError:
            return False
    return token in seen
for step in filter(None, os.environ.get("SEND_AFTER", "").split("|")):
    wait, keys = step.split("=>")
    if not until(wait.encode()):
        break
    time.sleep(0.3)
    os.write(fd, keys.replace("\\r", "\r").encode())
if os.environ.get("HANGUP") == "1":
    until(os.environ["HANGUP_AFTER"].encode())
    os.close(fd)
else:
    until(b"\x00never", 20)
deadline = time.time() + 10
done, status = os.waitpid(pid, os.WNOHANG)
while done == 0 and time.time() < deadline:
    time.sleep(0.05)
    done, status = os.waitpid(pid, os.WNOHANG)
if done == 0:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    seen += b"\n[driver: the client did not exit; killed]"
    status = 99 << 8
sys.stdout.write(seen.decode(errors="replace"))
sys.exit(os.waitstatus_to_exitcode(status) & 0xff)
"#;

/// A private (0700) `XDG_RUNTIME_DIR`: the client's tokens and the local
/// agent's session sockets, apart from other tests'.
fn private_runtime(tag: &str) -> std::path::PathBuf {
    let d = unique_tempdir(tag);
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

/// The client with `via`'s flags and `args` on a PTY (see [`DRIVER`]).
fn on_pty(
    via: &Via,
    runtime: &std::path::Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Option<i32>, String) {
    on_pty_with(via, &[], runtime, args, env)
}

/// [`on_pty`] with `flags` before `via`'s.
fn on_pty_with(
    via: &Via,
    flags: &[&str],
    runtime: &std::path::Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Option<i32>, String) {
    let mut cmd = std::process::Command::new("python3");
    cmd.arg("-c")
        .arg(DRIVER)
        .arg(client_bin())
        .args(flags)
        .args(via.flags())
        .args(args)
        .env("XDG_RUNTIME_DIR", runtime)
        .env_remove("EXECUTOR_TARGET")
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("python3");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The reattach command the client printed.
fn reattach_command(screen: &str) -> String {
    let at = screen
        .find("reattach: ")
        .unwrap_or_else(|| panic!("no reattach command on the screen: {screen}"));
    let line = screen[at + "reattach: ".len()..].lines().next().unwrap();
    line.trim_end_matches('\r').to_string()
}

/// Runs the printed reattach command as a user pastes it into a shell.
fn run_verbatim(command: &str, runtime: &std::path::Path) -> std::process::Output {
    std::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .env("XDG_RUNTIME_DIR", runtime)
        .env_remove("EXECUTOR_TARGET")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn tokens(runtime: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(runtime.join("executor-client"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_detach_key_leaves_the_job_running_and_the_printed_command_reattaches() {
    for via in Via::both() {
        let runtime = private_runtime("detach-key");
        let script = "echo ready; read line; echo got:$line; sleep 2; echo two; exit 4";
        // An ssh configuration file (-F) whose path needs quoting: the
        // reattach command carries it, quoted.
        let config = runtime.join("my ssh config");
        std::fs::write(&config, "# nothing\n").unwrap();
        let (code, screen) = on_pty_with(
            &via,
            &["-F", config.to_str().unwrap()],
            &runtime,
            &["run", "--detach", "60", "--", "sh", "-c", script],
            &[("SEND_AFTER", "ready=>hello\\r|got:hello=>~.\\r")],
        );
        assert_eq!(code, Some(0), "{}: {screen}", via.name());
        assert!(screen.contains("~.: detached; the job runs on"), "{screen}");
        assert!(
            !screen.contains("two"),
            "left before the job ended: {screen}"
        );
        let command = reattach_command(&screen);
        assert!(
            command.contains(&format!("-F '{}'", config.display())),
            "{command}"
        );
        if let Via::Ssh(_) = via {
            for flag in ["-i ", "-p ", "--target 127.0.0.1"] {
                assert!(command.contains(flag), "{flag}: {command}");
            }
        }
        assert_eq!(tokens(&runtime).len(), 1, "the token is kept");
        let out = run_verbatim(&command, &runtime);
        assert_eq!(out.status.code(), Some(4), "{}: {}", via.name(), text(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "ready\ngot:hello\ntwo\n"
        );
        assert!(
            tokens(&runtime).is_empty(),
            "the session ended: its token goes"
        );
        // With -t the keys go raw: `~.` needs no Enter.
        let (code, screen) = on_pty(
            &via,
            &runtime,
            &[
                "run",
                "-t",
                "--detach",
                "60",
                "--",
                "sh",
                "-c",
                "echo ready; sleep 2; exit 5",
            ],
            &[("SEND_AFTER", "ready=>\\r~.")],
        );
        assert_eq!(code, Some(0), "{}: {screen}", via.name());
        let out = run_verbatim(&reattach_command(&screen), &runtime);
        assert_eq!(out.status.code(), Some(5), "{}: {}", via.name(), text(&out));
    }
}

#[test]
fn a_closed_terminal_or_sigterm_detaches_and_attach_shows_a_finished_job() {
    for via in Via::both() {
        let runtime = private_runtime("detach-hup");
        let done = runtime.join("done");
        let script = format!(
            "echo ready; sleep 2; echo two; touch {}; exit 4",
            done.display()
        );
        let (code, screen) = on_pty(
            &via,
            &runtime,
            &["run", "--detach", "60", "--", "sh", "-c", &script],
            &[("HANGUP", "1"), ("HANGUP_AFTER", "ready")],
        );
        // The client left on SIGHUP, with status 0 (and the job did not
        // end with it).
        assert_eq!(code, Some(0), "{}: {screen}", via.name());
        let command = reattach_command(&screen);
        assert!(
            wait_for(Duration::from_secs(20), || done.exists()),
            "{}: the job did not run on after the terminal closed: {screen}",
            via.name()
        );
        // Attach after it ended: its output and status.
        let out = run_verbatim(&command, &runtime);
        assert_eq!(out.status.code(), Some(4), "{}: {}", via.name(), text(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "ready\ntwo\n");
        assert!(tokens(&runtime).is_empty());
        // The token is gone: a second attach says so.
        let out = run_verbatim(&command, &runtime);
        assert_eq!(out.status.code(), Some(255), "{}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("no token"),
            "{}",
            text(&out)
        );

        // SIGTERM (no terminal): the same.
        std::fs::remove_file(&done).unwrap();
        let mut child = via
            .cmd(&["run", "--detach", "60", "--", "sh", "-c", &script])
            .env("XDG_RUNTIME_DIR", &runtime)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line, "ready\n");
        signal(&child, nix::sys::signal::Signal::SIGTERM);
        let status = child.wait().unwrap();
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        assert_eq!(status.code(), Some(0), "{}: {err}", via.name());
        assert!(err.contains("SIGTERM: detached"), "{err}");
        let command = reattach_command(&err);
        let out = run_verbatim(&command, &runtime);
        assert_eq!(out.status.code(), Some(4), "{}: {}", via.name(), text(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "ready\ntwo\n");
        assert!(done.exists());
    }
}

#[test]
fn tokens_of_expired_or_unknown_sessions_are_removed() {
    let runtime = private_runtime("detach-tokens");
    let store = runtime.join("executor-client");
    std::fs::create_dir(&store).unwrap();
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o700)).unwrap();
    // A session whose TTL (60 s) ran out an hour after a client left it,
    // one the agent does not know (fresh), and one from an older client
    // (no TTL line, so the agent's largest, 24 h: kept).
    let expired = store.join("0123456789abcdef0123456789abcdef");
    let unknown = store.join("fedcba9876543210fedcba9876543210");
    let legacy = store.join("00000000000000000000000000000000");
    std::fs::write(&expired, "00112233445566778899aabbccddeeff\n60\n").unwrap();
    std::fs::write(&unknown, "00112233445566778899aabbccddeeff\n3600\n").unwrap();
    std::fs::write(&legacy, "00112233445566778899aabbccddeeff\n").unwrap();
    let hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::options()
        .append(true)
        .open(&expired)
        .unwrap()
        .set_modified(hour_ago)
        .unwrap();
    let out = Via::Local
        .cmd(&["attach", "fedcba9876543210fedcba9876543210"])
        .env("XDG_RUNTIME_DIR", &runtime)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(255), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("session"),
        "{}",
        text(&out)
    );
    assert!(!expired.exists(), "the expired session's token was swept");
    assert!(!unknown.exists(), "the agent said the session is gone");
    assert!(legacy.exists());
}
