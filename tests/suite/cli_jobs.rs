//! `executor-client run/shell/attach/http` as ssh, landrun and curl users
//! expect them: sandbox flags, stdin and Ctrl-C, the host's login
//! environment, detached sessions, HTTP exit statuses, logs and man pages
//! (issue 16, items 5, 6, 8, 9, 10), locally and over a real sshd.

use executor_client::protocol::types::exec::ExecCommandParams;
use executor_client::protocol::types::process::{EnvBase, ProcessStartParams};
use executor_tests::cli::*;
use executor_tests::sshd::Sshd;
use executor_tests::*;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::Duration;

fn s(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn sandbox_flags_deny_a_write_and_allow_it_in_a_write_root() {
    for via in Via::both() {
        let d = unique_tempdir("sbx-flags");
        let (root, other) = (d.join("root"), d.join("other"));
        std::fs::create_dir_all(root.join("protected")).unwrap();
        std::fs::create_dir(&other).unwrap();
        std::fs::write(root.join("secret"), "s3cret").unwrap();
        let run = |flags: &[&str], script: &str| {
            let mut args = vec!["run"];
            args.extend_from_slice(flags);
            args.extend(["--", "sh", "-c", script]);
            via.output(&args)
        };
        let rw = ["--rw", s(&root)];
        let out = run(&rw, &format!("echo in > {}/inside", root.display()));
        assert!(out.status.success(), "{} {}", via.name(), text(&out));
        assert!(root.join("inside").exists());
        // Denied: the job's own status (sh's failed redirection: 2 for
        // dash, 1 for bash), the agent's guess a note.
        let out = run(&rw, &format!("echo out > {}/outside", other.display()));
        assert!(matches!(out.status.code(), Some(1 | 2)), "{}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("note:"),
            "{}",
            text(&out)
        );
        assert!(!other.join("outside").exists());
        let prot = format!("{}/protected", root.display());
        let out = run(
            &["--rw", s(&root), "--deny-write", &prot],
            &format!("touch {prot}/x"),
        );
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        let secret = format!("{}/secret", root.display());
        let out = run(&["--deny-read", &secret], &format!("cat {secret}"));
        assert_ne!(out.status.code(), Some(0));
        assert!(!String::from_utf8_lossy(&out.stdout).contains("s3cret"));
        // --tmp: a private /tmp, gone with the job.
        let name = format!("/tmp/executor-cli-private-{}", std::process::id());
        let out = run(&["--tmp"], &format!("echo t > {name} && cat {name}"));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "t\n",
            "{}",
            text(&out)
        );
        assert!(!std::path::Path::new(&name).exists());
        // --sandbox FILE.json: a whole intent; an unknown key is an error.
        let json = d.join("intent.json");
        std::fs::write(
            &json,
            format!("{{\"filesystem\": {{\"write\": [{:?}]}}}}", s(&root)),
        )
        .unwrap();
        let out = run(
            &["--sandbox", s(&json)],
            &format!("echo out > {}/outside", other.display()),
        );
        assert!(matches!(out.status.code(), Some(1 | 2)), "{}", text(&out));
        assert!(!other.join("outside").exists());
        std::fs::write(&json, "{\"filesystem\": {\"deny_reads\": []}}").unwrap();
        let out = run(&["--sandbox", s(&json)], "true");
        assert_eq!(out.status.code(), Some(2), "bad usage: {}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("deny_reads"),
            "{}",
            text(&out)
        );
        // The fs verbs take the same flags.
        let src = d.join("src");
        std::fs::write(&src, "data").unwrap();
        let out = via.output(&[
            "put",
            "--rw",
            s(&root),
            s(&src),
            &format!("{}/put", root.display()),
        ]);
        assert!(out.status.success(), "{}", text(&out));
        let out = via.output(&[
            "put",
            "--rw",
            s(&root),
            s(&src),
            &format!("{}/put", other.display()),
        ]);
        assert_eq!(out.status.code(), Some(125), "{}", text(&out));
        assert!(!other.join("put").exists());
        let out = via.output(&["cat", "--deny-read", &secret, &secret]);
        assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    }
}

#[test]
fn net_flags_deny_and_allow_a_loopback_port() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let connect =
        format!("import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5)");
    for via in Via::both() {
        let out = via.output(&["run", "--net", "deny", "--", "python3", "-c", &connect]);
        assert_ne!(out.status.code(), Some(0), "{} {}", via.name(), text(&out));
        let tcp = format!("tcp:{port}");
        let out = via.output(&["run", "--net", &tcp, "--", "python3", "-c", &connect]);
        assert_eq!(out.status.code(), Some(0), "{} {}", via.name(), text(&out));
    }
    let out = Via::Local.output(&["run", "--net", "tcp:0", "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "a port of 0 is bad usage");
}

/// Spawn as a shell's foreground job (its own process group), stdout piped;
/// returns after the job printed `ready`.
fn spawn_ready(
    via: &Via,
    args: &[&str],
) -> (std::process::Child, BufReader<std::process::ChildStdout>) {
    let mut child = via
        .cmd(args)
        .stdout(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n", "{}", via.name());
    (child, out)
}

fn ctrl_c(child: &std::process::Child) {
    killpg(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
}

#[test]
fn stdin_is_forwarded_unless_n_and_ctrl_c_interrupts_the_job() {
    for via in Via::both() {
        // -n: /dev/null, even with a pipe that stays open.
        let mut child = via
            .cmd(&["run", "-n", "--", "cat"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let _keep_open = child.stdin.take();
        assert!(
            wait_for(Duration::from_secs(20), || child
                .try_wait()
                .unwrap()
                .is_some()),
            "-n: cat ended"
        );
        assert!(child.wait().unwrap().success());
        // The first Ctrl-C is the job's SIGINT.
        let script = "trap 'echo got-int; exit 3' INT; echo ready; while :; do sleep 0.1; done";
        let (mut child, mut out) = spawn_ready(&via, &["run", "--", "sh", "-c", script]);
        ctrl_c(&child);
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
        assert_eq!(rest, "got-int\n", "{}", via.name());
        assert_eq!(child.wait().unwrap().code(), Some(3), "{}", via.name());
        // A job that ignores it: the second Ctrl-C disconnects (130, as
        // the man page says).
        let script = "trap 'echo int' INT; echo ready; while :; do sleep 0.1; done";
        let (mut child, mut out) = spawn_ready(&via, &["run", "--", "sh", "-c", script]);
        ctrl_c(&child);
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line, "int\n");
        ctrl_c(&child);
        assert!(wait_for(Duration::from_secs(20), || child
            .try_wait()
            .unwrap()
            .is_some()));
        assert_eq!(child.wait().unwrap().code(), Some(130), "{}", via.name());
    }
}

/// All of a job's output.
async fn output_of(mut job: executor_client::Process) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(chunk) = job.next_output().await.unwrap() {
        out.extend_from_slice(&chunk.data);
    }
    out
}

/// The login shell of the current user (passwd).
fn login_shell() -> String {
    let out = std::process::Command::new("getent")
        .args(["passwd", &current_uid().to_string()])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .rsplit(':')
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn run_uses_the_hosts_login_environment_and_clean_env_does_not() {
    let shell = login_shell();
    // The login shell starts from what sshd gives a login, not from the
    // caller's environment.
    let home = std::env::var("HOME").unwrap();
    let expected = std::process::Command::new("env")
        .args([
            "-i",
            &format!("HOME={home}"),
            "PATH=/usr/local/bin:/usr/bin:/bin:/usr/games",
        ])
        .args([&shell, "-l", "-c", "printf %s \"$PATH\""])
        .current_dir(&home)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let out = Via::Local.output(&["run", "--", "sh", "-c", "printf %s \"$PATH\""]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&expected.stdout),
        "{}",
        text(&out)
    );
    for via in Via::both() {
        let out = via.output(&[
            "run",
            "--clean-env",
            "--",
            "sh",
            "-c",
            "printf %s \"$PATH\"",
        ]);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        );
        let out = via.output(&[
            "run",
            "--env",
            "EXTRA=1",
            "--",
            "sh",
            "-c",
            "echo $EXTRA; test -n \"$HOME\"",
        ]);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "1\n",
            "{} {}",
            via.name(),
            text(&out)
        );
    }
}

#[tokio::test]
async fn env_base_is_taken_once_per_session_and_reported() {
    let c = local_client().await;
    let info = c
        .call(&executor_protocol::types::session::EnvironmentInfoParams {})
        .await
        .unwrap();
    assert_eq!(info.login_env.as_ref().map(|l| l.taken), Some(false));
    let mut p = ProcessStartParams::new(
        vec![
            "/bin/sh".into(),
            "-c".into(),
            "printf %s \"$HOME:$X\"".into(),
        ],
        "/",
        [("X".to_string(), "on-top".to_string())].into(),
    );
    p.env_base = EnvBase::Login;
    let out = output_of(c.start(&p).await.unwrap()).await;
    assert_eq!(
        String::from_utf8_lossy(&out),
        format!("{}:on-top", info.home)
    );
    let first = c
        .call(&executor_protocol::types::session::EnvironmentInfoParams {})
        .await
        .unwrap()
        .login_env
        .unwrap();
    assert!(first.taken && first.duration_ms.is_some(), "{first:?}");
    // exec_command takes it too; the snapshot is not taken again.
    let r = c
        .call(&ExecCommandParams {
            command: vec!["sh".into(), "-c".into(), "printf %s \"$HOME\"".into()],
            cwd: "/".into(),
            env: Default::default(),
            tty: false,
            yield_time_ms: 10_000,
            max_output_tokens: 1000,
            sandbox_permissions: None,
            additional_permissions: None,
            additional_permissions_preapproved: false,
            justification: None,
            exec_approval_requirement: None,
            env_base: EnvBase::Login,
            limits: None,
        })
        .await
        .unwrap();
    assert_eq!(r.output, info.home);
    assert_eq!(
        c.call(&executor_protocol::types::session::EnvironmentInfoParams {})
            .await
            .unwrap()
            .login_env
            .unwrap(),
        first
    );
    c.close().await.unwrap();
    // "agent": the agent's own environment under the request's.
    let mut cmd = tokio::process::Command::new(executor_bin());
    cmd.env("EXECUTOR_TEST_MARK", "from-agent");
    let c = executor_client::Client::spawn(cmd, Default::default())
        .await
        .unwrap();
    p.env_base = EnvBase::Agent;
    p.argv = vec![
        "/bin/sh".into(),
        "-c".into(),
        "printf %s \"$EXECUTOR_TEST_MARK:$X\"".into(),
    ];
    let out = output_of(c.start(&p).await.unwrap()).await;
    assert_eq!(out, b"from-agent:on-top");
    p.env_base = EnvBase::None;
    let out = output_of(c.start(&p).await.unwrap()).await;
    assert_eq!(out, b":on-top", "none: only the request's env");
    c.close().await.unwrap();
    // A job that is to be confined (a profile that confines every job, or
    // the request's intent) gets the login environment too, taken by a
    // login shell run inside the job's sandbox (a dotfile an earlier
    // sandboxed job wrote must not run unconfined): the shell's cwd is
    // the job's, which the sandbox must hold.
    let dir = unique_tempdir("login-profile");
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        "[profiles.jail.sandbox.filesystem]\nwrite = [\"/tmp\"]\n",
    )
    .unwrap();
    let mut cmd = tokio::process::Command::new(executor_bin());
    cmd.arg("--config").arg(&config).args(["--profile", "jail"]);
    let c = executor_client::Client::spawn(cmd, Default::default())
        .await
        .unwrap();
    let mut p = ProcessStartParams::new(
        vec![
            "/bin/sh".into(),
            "-c".into(),
            "printf %s \"$HOME:$PWD\"".into(),
        ],
        "/tmp",
        Default::default(),
    );
    p.env_base = EnvBase::Login;
    let out = output_of(c.start(&p).await.unwrap()).await;
    assert_eq!(String::from_utf8_lossy(&out), format!("{}:/tmp", info.home));
    assert!(
        c.call(&executor_protocol::types::session::EnvironmentInfoParams {})
            .await
            .unwrap()
            .login_env
            .unwrap()
            .taken
    );
    c.close().await.unwrap();
    // The request's own intent: the same.
    let c = executor_client::Client::spawn(
        tokio::process::Command::new(executor_bin()),
        Default::default(),
    )
    .await
    .unwrap();
    let mut p = ProcessStartParams::new(
        vec!["/bin/sh".into(), "-c".into(), "printf %s \"$HOME\"".into()],
        "/tmp",
        Default::default(),
    );
    p.env_base = EnvBase::Login;
    p.sandbox = Some(
        executor_client::sandbox::Intent::new()
            .write("/tmp")
            .build(),
    );
    let out = output_of(c.start(&p).await.unwrap()).await;
    assert_eq!(String::from_utf8_lossy(&out), info.home);
    c.close().await.unwrap();
}

#[test]
fn attach_resumes_a_detached_session() {
    for via in Via::both() {
        // Private (0700): the local agent's session host puts its socket
        // here, apart from other tests' hosts.
        let runtime = unique_tempdir("attach-runtime");
        std::fs::set_permissions(
            &runtime,
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .unwrap();
        let script = "echo ready; read _ </dev/null; sleep 1; echo two; exit 4";
        let mut cmd = via.cmd(&["run", "--detach", "60", "--", "sh", "-c", script]);
        cmd.env("XDG_RUNTIME_DIR", &runtime).stderr(Stdio::piped());
        let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line, "ready\n");
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut hint = String::new();
        err.read_line(&mut hint).unwrap();
        let words: Vec<&str> = hint.split_whitespace().collect();
        let at = words.iter().position(|w| *w == "attach").expect(&hint);
        let (session, process) = (words[at + 1].to_string(), words[at + 2].to_string());
        child.kill().unwrap();
        let _ = child.wait();
        let out = via
            .cmd(&["attach", &session, &process])
            .env("XDG_RUNTIME_DIR", &runtime)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(4), "{} {}", via.name(), text(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "ready\ntwo\n");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_posts_with_data_and_tells_http_errors_from_connection_failures() {
    // The server runs on this runtime; the client blocks another worker.
    let server = executor_tests::http::TestServer::start().await;
    let (echo, nope) = (server.url("/echo"), server.url("/nope"));
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for via in Via::both() {
        let out = via.output(&["http", "-i", "-d", "hello", &echo]);
        assert!(out.status.success(), "{} {}", via.name(), text(&out));
        assert_eq!(out.stdout, b"hello");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("x-method: POST"),
            "{}",
            text(&out)
        );
        let out = via.output(&["http", &nope]);
        assert_eq!(out.status.code(), Some(22));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("HTTP 404"),
            "{}",
            text(&out)
        );
        let out = via.output(&["http", &format!("http://127.0.0.1:{closed}/")]);
        assert_eq!(out.status.code(), Some(7), "{}", text(&out));
        // The network of the request's intent: denied is the sandbox's 125.
        let out = via.output(&["http", "--net", "deny", &echo]);
        assert_eq!(
            out.status.code(),
            Some(125),
            "{} {}",
            via.name(),
            text(&out)
        );
    }
}

#[test]
fn logs_are_json_fields_without_colours_and_reach_the_agent() {
    let sshd = Sshd::start("", "AcceptEnv RUST_LOG EXECUTOR_LOG_JSON");
    for via in [Via::Local, Via::Ssh(sshd)] {
        let out = via.output(&["-vv", "--log-json", "run", "--", "true"]);
        assert!(out.status.success(), "{}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains('\u{1b}'), "no ANSI into a pipe: {err}");
        let events: Vec<serde_json::Value> = err
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        assert!(!events.is_empty(), "{err}");
        // The agent logged at debug too (its level came from -vv), and
        // its session id is a string, not a Debug rendering.
        let agent: Vec<&serde_json::Value> = events
            .iter()
            .filter(|e| {
                e["target"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("executor_agent"))
            })
            .collect();
        assert!(
            agent.iter().any(|e| e["level"] == "DEBUG"),
            "{} {err}",
            via.name()
        );
        assert!(!err.contains("Some("), "no Debug text in fields: {err}");
    }
}

#[test]
fn man_pages_have_the_sections_and_name_no_unshipped_page() {
    for (bin, args) in [
        (client_bin(), vec!["generate", "man"]),
        (executor_bin(), vec!["--generate", "man"]),
    ] {
        let out = std::process::Command::new(&bin)
            .args(&args)
            .output()
            .unwrap();
        assert!(out.status.success());
        let page = String::from_utf8_lossy(&out.stdout);
        for section in [
            ".SH NAME",
            ".SH SYNOPSIS",
            ".SH \"EXIT STATUS\"",
            ".SH ENVIRONMENT",
            ".SH FILES",
            ".SH EXAMPLES",
        ] {
            assert!(page.contains(section), "{}: {section}", bin.display());
        }
        assert!(
            !page.contains("\\-run(1)") && !page.contains("-run(1)"),
            "{page}"
        );
    }
    let out = std::process::Command::new(client_bin())
        .args(["run", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--ro",
        "--rw",
        "--deny-read",
        "--deny-write",
        "--tmp",
        "--net",
        "--sandbox",
        "--best-effort",
        "-t, --tty",
        "-n, --no-stdin",
    ] {
        assert!(help.contains(flag), "{flag}: {help}");
    }
    let out = std::process::Command::new(client_bin())
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "-i <IDENTITY_FILE>",
        "-o <KEY=VALUE>",
        "-F <CONFIG>",
        "-J <DESTINATION>",
        "-p <PORT>",
        "--connect-timeout",
        "Exit status",
    ] {
        assert!(help.contains(flag), "{flag}: {help}");
    }
}

#[tokio::test]
async fn a_failed_login_snapshot_is_an_error_once_and_a_bad_env_base_is_refused() {
    // Another env_base is invalid_params, naming the field.
    let mut a = RawAgent::initialized().await;
    let r = a
        .request(
            1,
            "process/start",
            &rmpv::Value::Map(vec![
                ("argv".into(), rmpv::Value::Array(vec!["true".into()])),
                ("cwd".into(), "/".into()),
                ("env".into(), rmpv::Value::Map(vec![])),
                ("env_base".into(), "root".into()),
            ]),
        )
        .await;
    assert_eq!(error_code(&r), Some("invalid_params"), "{r:?}");
    // A user whose login shell is nologin: the snapshot fails, is
    // reported, and is not retried.
    if current_uid() != 0 {
        prerequisite_missing("root, to run the agent as nobody (shell /usr/sbin/nologin)");
        return;
    }
    let mut cmd = tokio::process::Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(executor_bin_for_any_user())
        .current_dir("/");
    let c = executor_client::Client::spawn(cmd, Default::default())
        .await
        .unwrap();
    let mut p = ProcessStartParams::new(vec!["/bin/true".into()], "/", Default::default());
    p.env_base = EnvBase::Login;
    let e = remote(c.start(&p).await.unwrap_err());
    assert_eq!(e.code, executor_client::ErrorCode::Io, "{e:?}");
    assert!(e.message.contains("login shell"), "{e:?}");
    let info = c
        .call(&executor_protocol::types::session::EnvironmentInfoParams {})
        .await
        .unwrap()
        .login_env
        .unwrap();
    assert!(
        !info.taken && info.error.is_some() && info.duration_ms.is_some(),
        "{info:?}"
    );
    let again = remote(c.start(&p).await.unwrap_err());
    assert_eq!(again.message, e.message);
    assert_eq!(
        c.call(&executor_protocol::types::session::EnvironmentInfoParams {})
            .await
            .unwrap()
            .login_env
            .unwrap(),
        info,
        "not run again"
    );
    // Without the login base the same user runs fine.
    p.env_base = EnvBase::None;
    assert!(c.start(&p).await.unwrap().wait().await.unwrap().success());
    c.close().await.unwrap();
}

#[test]
fn best_effort_runs_unconfined_where_nothing_can_be_enforced_and_says_so() {
    // The agent's documented test hook: a host without Landlock.
    let d = unique_tempdir("best-effort");
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "--rw", s(&d)];
        args.extend_from_slice(extra);
        args.extend(["--", "true"]);
        let mut cmd = Via::Local.cmd(&args);
        cmd.env("EXECUTOR_TEST_LANDLOCK_ABI", "0");
        cmd.output().unwrap()
    };
    let out = run(&[]);
    assert_eq!(
        out.status.code(),
        Some(125),
        "sandbox_unavailable: {}",
        text(&out)
    );
    let out = run(&["--best-effort"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("sandbox not enforced: filesystem"), "{err}");
    // fs and http requests on the same host: the agent enforces their
    // intent itself, whole, so `--best-effort` still denies and has
    // nothing to report.
    let inside = d.join("inside");
    std::fs::create_dir(&inside).unwrap();
    std::fs::write(inside.join("f"), "in\n").unwrap();
    std::fs::write(d.join("out"), "out\n").unwrap();
    let verb = |args: &[&str]| {
        let mut cmd = Via::Local.cmd(args);
        cmd.env("EXECUTOR_TEST_LANDLOCK_ABI", "0");
        cmd.output().unwrap()
    };
    let ro = ["--best-effort", "--ro", s(&inside)];
    for (args, code) in [
        ([&["cat"][..], &ro, &[s(&inside.join("f"))]].concat(), 0),
        ([&["cat"][..], &ro, &[s(&d.join("out"))]].concat(), 125),
        (
            [&["get"][..], &ro, &[s(&d.join("out")), s(&d.join("got"))]].concat(),
            125,
        ),
        ([&["walk"][..], &ro, &[s(&inside)]].concat(), 0),
        (
            [
                &["put"][..],
                &ro,
                &[s(&d.join("out")), s(&inside.join("put"))],
            ]
            .concat(),
            125,
        ),
        (
            vec![
                "http",
                "--best-effort",
                "--net",
                "deny",
                "http://127.0.0.1:9/",
            ],
            125,
        ),
    ] {
        let out = verb(&args);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("not enforced"), "{args:?}: {err}");
    }
    assert_eq!(
        verb(&[&["cat"][..], &ro, &[s(&inside.join("f"))]].concat()).stdout,
        b"in\n"
    );
    assert!(!d.join("got").exists() && !inside.join("put").exists());
}

/// Run `argv` on a new PTY (its controlling terminal), wait for `ready`,
/// type Ctrl-C, and return its exit status and what the terminal showed.
fn ctrl_c_on_a_terminal(argv: &[String]) -> (Option<i32>, String) {
    const DRIVER: &str = r#"
import os, pty, sys, time
pid, fd = pty.fork()
if pid == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
seen = b""
def until(token):
    global seen
    deadline = time.time() + 20
    while token not in seen and time.time() < deadline:
        try:
            seen += os.read(fd, 4096)
        except OSError:
            break
until(b"ready")
time.sleep(0.3)
os.write(fd, b"\x03")
until(b"got-int")
_, status = os.waitpid(pid, 0)
sys.stdout.write(seen.decode(errors="replace"))
sys.exit(os.waitstatus_to_exitcode(status) & 0xff)
"#;
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(DRIVER)
        .args(argv)
        .output()
        .expect("python3");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn ctrl_c_on_a_terminal_reaches_the_job_and_not_ssh() {
    // ssh gets the terminal while it connects and gives it back: the
    // Ctrl-C typed afterwards is the client's, which interrupts the job.
    let script = "trap 'echo got-int; exit 3' INT; echo ready; while :; do sleep 0.1; done";
    for via in Via::both() {
        let mut argv = vec![client_bin().to_string_lossy().into_owned()];
        argv.extend(via.flags());
        argv.extend(["run", "-n", "--", "sh", "-c", script].map(String::from));
        let (code, screen) = ctrl_c_on_a_terminal(&argv);
        assert!(screen.contains("got-int"), "{}: {screen}", via.name());
        assert_eq!(code, Some(3), "{}: {screen}", via.name());
    }
}

#[test]
fn net_host_allows_the_named_host_and_net_ask_denies_without_a_terminal() {
    if std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_err()
    {
        prerequisite_missing("curl");
        return;
    }
    let port = tiny_http_server();
    // Through the job's proxy by address (a name for loopback reaches
    // nothing, §8; NO_PROXY names 127.0.0.1: -x forces the proxy).
    let curl = format!(
        "curl -sS -o /dev/null -w '%{{http_code}}' --noproxy '' -x \"$HTTP_PROXY\" http://127.0.0.1:{port}/"
    );
    let run = |net: &str| {
        let mut cmd = Via::Local.cmd(&["run", "--net", net, "--", "sh", "-c", &curl]);
        // No controlling terminal: a question cannot be asked.
        cmd.process_group(0);
        let out = std::process::Command::new("setsid")
            .arg("-w")
            .arg(cmd.get_program())
            .args(cmd.get_args())
            .envs(cmd.get_envs().filter_map(|(k, v)| v.map(|v| (k, v))))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            text(&out),
        )
    };
    let (code, all) = run(&format!("host:127.0.0.1:{port}"));
    assert_eq!(code, "200", "the named host is reached: {all}");
    let (code, all) = run("host:mirror.invalid");
    assert_eq!(code, "403", "another host is refused by the proxy: {all}");
    let (code, all) = run("ask");
    assert_eq!(code, "403", "ask without a terminal denies: {all}");
}

/// A job starts with default signal dispositions and an empty mask,
/// whatever the agent inherited: signals its caller ignores (`nohup`, a
/// shell's `trap ''`), the SIGPIPE Rust ignores, and the internal signals
/// 32 and 33 that glibc's `posix_spawn` leaves ignored in the agent and the
/// spawner (an ignored disposition survives `execve`). Unconfined and
/// sandboxed; the control shows the caller's trap is really inherited.
#[test]
fn a_job_starts_with_no_signal_ignored_or_blocked() {
    let traps = "trap '' HUP INT QUIT TERM USR1 PIPE; exec \"$@\"";
    let under_traps = |argv: &[&str]| {
        std::process::Command::new("sh")
            .arg("-c")
            .arg(traps)
            .arg("sh")
            .args(argv)
            .output()
            .unwrap()
    };
    let control = under_traps(&["grep", "^SigIgn:", "/proc/self/status"]);
    let control = String::from_utf8_lossy(&control.stdout).into_owned();
    let ignored = u64::from_str_radix(control.trim_start_matches("SigIgn:").trim(), 16).unwrap();
    // HUP, INT, QUIT, USR1, PIPE, TERM: bits 0, 1, 2, 9, 12, 14.
    assert_eq!(
        ignored & 0x5207,
        0x5207,
        "control: the traps are inherited by what the shell execs ({control})"
    );
    let client = client_bin();
    let client = client.to_str().unwrap();
    for sandbox in [
        &[][..],
        &["--net", "deny"][..],
        &["--net", "allow", "--tmp"][..],
    ] {
        let mut argv = vec![client, "run"];
        argv.extend(sandbox);
        argv.extend(["--", "grep", "-E", "^Sig(Ign|Blk):", "/proc/self/status"]);
        let out = under_traps(&argv);
        assert_eq!(out.status.code(), Some(0), "{sandbox:?}: {}", text(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n",
            "{sandbox:?}"
        );
    }
}
