//! Detached sessions (docs/PROTOCOL.md §2): a session host keeps the session
//! when the transport drops; `initialize` with `session.resume` takes it
//! back with no output lost.

use executor_agent::host::{self, RuntimeEnv};
use executor_client::{Client, ClientOptions, Error, ErrorCode, SshOptions};
use executor_protocol::types::process::{
    ExitInfo, ProcessReadParams, ProcessReadResult, ProcessStartParams,
};
use executor_protocol::types::session::{ResumeParams, SessionParams};
use executor_tests::sshd::Sshd;
use executor_tests::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use executor_tests::path_env as env;

fn detach(ttl_ms: u64) -> ClientOptions {
    ClientOptions {
        session: Some(SessionParams {
            resume: None,
            detach_ttl_ms: Some(ttl_ms),
        }),
        ..ClientOptions::default()
    }
}

fn resume(c: &Client) -> ClientOptions {
    resume_with(
        &c.initialize_result().session_id,
        &c.initialize_result().resume_token,
    )
}

fn resume_with(id: &str, token: &str) -> ClientOptions {
    ClientOptions {
        session: Some(SessionParams {
            resume: Some(ResumeParams {
                session_id: id.to_string(),
                token: token.to_string(),
            }),
            detach_ttl_ms: None,
        }),
        ..ClientOptions::default()
    }
}

/// The directories where agents look for a place for session host sockets
/// (`$XDG_RUNTIME_DIR`, `$TMPDIR`, `$HOME`), all private to a test: its
/// hosts are the only ones found and counted against
/// `max_detached_sessions` (other test runs share `/tmp/executor-<uid>`).
#[derive(Debug)]
struct Places {
    xdg: PathBuf,
    tmp: PathBuf,
    home: PathBuf,
}

impl Places {
    /// Under a short root: a socket's path must fit `sun_path` (108 bytes).
    fn new() -> Places {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let root = std::env::temp_dir().join(format!("exs-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir(&root).unwrap();
        let places = Places {
            xdg: root.join("xdg"),
            tmp: root.join("tmp"),
            home: root.join("home"),
        };
        for d in [&places.xdg, &places.tmp, &places.home] {
            std::fs::create_dir(d).unwrap();
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        places
    }

    /// The agent, with these places in its environment.
    fn agent(&self) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(executor_bin());
        c.env("XDG_RUNTIME_DIR", &self.xdg)
            .env("TMPDIR", &self.tmp)
            .env("HOME", &self.home);
        c
    }

    /// What the agent derives its socket directories from.
    fn runtime_env(&self) -> RuntimeEnv {
        RuntimeEnv {
            uid: current_uid(),
            xdg_runtime_dir: Some(self.xdg.clone()),
            tmp: self.tmp.clone(),
            home: Some(self.home.clone()),
        }
    }
}

/// The places of this test process's agents started by [`local`].
fn places() -> &'static Places {
    static PLACES: std::sync::OnceLock<Places> = std::sync::OnceLock::new();
    PLACES.get_or_init(Places::new)
}

fn local() -> tokio::process::Command {
    places().agent()
}

fn kill9(pid: u32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
}

fn code(e: Error) -> ErrorCode {
    e.code()
        .unwrap_or_else(|| panic!("expected an agent error: {e}"))
}

/// Everything after `after` until the process exited: (bytes, exit).
async fn read_rest(c: &Client, id: &str, mut after: Option<u64>) -> (Vec<u8>, ExitInfo) {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "the process did not finish");
        let r: ProcessReadResult = c
            .call(&ProcessReadParams {
                process_id: id.to_string(),
                after_seq: after,
                max_bytes: None,
                wait_ms: Some(2000),
            })
            .await
            .unwrap();
        assert_eq!(r.dropped_before, None, "output was lost");
        let empty = r.chunks.is_empty();
        for ch in r.chunks {
            assert_eq!(Some(ch.seq), after.map_or(Some(0), |a| Some(a + 1)), "gap");
            after = Some(ch.seq);
            out.extend_from_slice(&ch.data);
        }
        if empty {
            if let Some(exit) = r.exited {
                return (out, exit);
            }
        }
    }
}

const TICKER: &str = "for i in $(seq 1 40); do echo line-$i; sleep 0.1; done; exit 7";

fn expected_lines() -> String {
    (1..=40).map(|i| format!("line-{i}\n")).collect()
}

/// Start the ticker and read its first few lines: (process id, bytes read,
/// last seq seen).
async fn start_ticker(c: &Client) -> (String, Vec<u8>, u64) {
    let mut p = c
        .start(&ProcessStartParams::new(
            vec!["sh".into(), "-c".into(), TICKER.into()],
            "/",
            env(),
        ))
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut last = 0;
    while seen.iter().filter(|&&b| b == b'\n').count() < 5 {
        let ch = p.next_output().await.unwrap().expect("output");
        last = ch.seq;
        seen.extend_from_slice(&ch.data);
    }
    (p.id().to_string(), seen, last)
}

#[tokio::test]
async fn a_detached_session_survives_its_transport_and_resumes_with_no_output_lost() {
    let a = Client::spawn(local(), detach(60_000)).await.unwrap();
    assert!(!a.initialize_result().resumed);
    let (id, mut seen, last) = start_ticker(&a).await;
    // The transport dies (as when SSH drops): SIGKILL the stdio agent.
    kill9(a.transport_pid().unwrap());
    tokio::time::sleep(Duration::from_millis(700)).await;
    let b = Client::spawn(local(), resume(&a)).await.unwrap();
    assert!(b.initialize_result().resumed);
    assert_eq!(
        b.initialize_result().session_id,
        a.initialize_result().session_id
    );
    let (rest, exit) = read_rest(&b, &id, Some(last)).await;
    seen.extend_from_slice(&rest);
    assert_eq!(String::from_utf8(seen).unwrap(), expected_lines());
    assert_eq!(exit.exit_code, Some(7));
    b.close().await.unwrap();
}

#[tokio::test]
async fn a_wrong_token_is_refused_and_does_not_end_the_session() {
    let a = Client::spawn(local(), detach(60_000)).await.unwrap();
    let id = a.initialize_result().session_id.clone();
    let e = Client::spawn(local(), resume_with(&id, &"0".repeat(32)))
        .await
        .unwrap_err();
    assert_eq!(code(e), ErrorCode::SessionExpired);
    let e = Client::spawn(local(), resume_with(&"f".repeat(32), "x"))
        .await
        .unwrap_err();
    assert_eq!(code(e), ErrorCode::SessionExpired);
    // The right token still works, and takes the session over from `a`,
    // which may then only close.
    let b = Client::spawn(local(), resume(&a)).await.unwrap();
    assert!(b.initialize_result().resumed);
    let e = a
        .call(&executor_protocol::types::session::EnvironmentInfoParams {})
        .await
        .unwrap_err();
    assert_eq!(code(e), ErrorCode::SessionTakenOver);
    b.call(&executor_protocol::types::session::EnvironmentInfoParams {})
        .await
        .unwrap();
    b.close().await.unwrap();
    drop(a);
}

#[tokio::test]
async fn after_the_ttl_the_jobs_are_killed_and_resume_is_session_expired() {
    let a = Client::spawn(local(), detach(1500)).await.unwrap();
    let p = a
        .start(&ProcessStartParams::new(
            vec!["sleep".into(), "1000".into()],
            "/",
            env(),
        ))
        .await
        .unwrap();
    let pid = p.pid();
    kill9(a.transport_pid().unwrap());
    assert!(
        wait_dead(pid, Duration::from_secs(10)).await,
        "job {pid} outlived the TTL"
    );
    let e = Client::spawn(local(), resume(&a)).await.unwrap_err();
    assert_eq!(code(e), ErrorCode::SessionExpired);
}

#[tokio::test]
async fn without_detach_the_transport_ending_ends_the_session() {
    let a = local_client().await;
    let id = a.initialize_result().session_id.clone();
    let token = a.initialize_result().resume_token.clone();
    a.close().await.unwrap();
    let e = Client::spawn(local(), resume_with(&id, &token))
        .await
        .unwrap_err();
    assert_eq!(code(e), ErrorCode::SessionExpired);
}

#[tokio::test]
async fn a_session_resumes_only_under_the_profile_that_created_it() {
    let dir = unique_tempdir("session-profile");
    let config = dir.join("config.toml");
    std::fs::write(&config, "[profiles.a]\n[profiles.b]\n").unwrap();
    let with = |profile: &str| {
        let mut c = local();
        c.arg("--config").arg(&config).args(["--profile", profile]);
        c
    };
    let a = Client::spawn(with("a"), detach(60_000)).await.unwrap();
    let e = Client::spawn(with("b"), resume(&a)).await.unwrap_err();
    assert_eq!(code(e), ErrorCode::SessionExpired);
    assert!(
        e_message(&Client::spawn(with("b"), resume(&a)).await.unwrap_err()).contains("profile")
    );
    let b = Client::spawn(with("a"), resume(&a)).await.unwrap();
    assert!(b.initialize_result().resumed);
    b.close().await.unwrap();
}

fn e_message(e: &Error) -> String {
    match e {
        Error::Remote(w) => w.message.clone(),
        other => other.to_string(),
    }
}

/// Over a real sshd: kill the `ssh` client mid-stream, reconnect with
/// resume through a new `ssh`, and every line arrives exactly once, in
/// order, then the exit code.
#[tokio::test]
async fn over_sshd_killing_ssh_mid_stream_then_resuming_loses_nothing() {
    let sshd = Sshd::start("", "");
    let opts: SshOptions = sshd.options(&executor_bin());
    let a = Client::connect_target(
        &executor_client::Target::ssh_with("127.0.0.1", opts.clone()),
        detach(60_000),
    )
    .await
    .expect("connect over ssh");
    let (id, mut seen, last) = start_ticker(&a).await;
    // The ssh client process dies (a network drop, a laptop lid).
    kill9(a.transport_pid().unwrap());
    let b = Client::connect_target(
        &executor_client::Target::ssh_with("127.0.0.1", opts.clone()),
        resume(&a),
    )
    .await
    .expect("resume over ssh");
    assert!(b.initialize_result().resumed);
    let (rest, exit) = read_rest(&b, &id, Some(last)).await;
    seen.extend_from_slice(&rest);
    assert_eq!(String::from_utf8(seen).unwrap(), expected_lines());
    assert_eq!(exit.exit_code, Some(7));
    // A wrong token over ssh: refused.
    let e = Client::connect_target(
        &executor_client::Target::ssh_with("127.0.0.1", opts.clone()),
        resume_with(&a.initialize_result().session_id, &"1".repeat(32)),
    )
    .await
    .unwrap_err();
    assert_eq!(code(e), ErrorCode::SessionExpired);
    b.close().await.unwrap();
}

#[tokio::test]
async fn reconnect_retries_the_transport_with_backoff_and_stops_at_a_refusal() {
    use executor_client::Backoff;
    let a = Client::spawn(local(), detach(60_000)).await.unwrap();
    kill9(a.transport_pid().unwrap());
    let attempts = std::sync::atomic::AtomicU32::new(0);
    let backoff = Backoff {
        attempts: 5,
        initial: Duration::from_millis(20),
        max: Duration::from_millis(100),
    };
    // The first two transports fail to start (a network still down).
    let b = a
        .reconnect(
            |opts| {
                let n = attempts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async move {
                    let cmd = if n < 2 {
                        tokio::process::Command::new("/nonexistent/ssh")
                    } else {
                        local()
                    };
                    Client::spawn(cmd, opts).await
                }
            },
            backoff,
        )
        .await
        .unwrap();
    assert_eq!(attempts.load(std::sync::atomic::Ordering::SeqCst), 3);
    assert!(b.initialize_result().resumed);
    // A refusal is final: one attempt.
    let tries = std::sync::atomic::AtomicU32::new(0);
    let wrong = Client::spawn(local(), detach(60_000)).await.unwrap();
    let e = wrong
        .reconnect(
            |opts| {
                tries.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let opts = ClientOptions {
                    session: opts.session.map(|mut s| {
                        if let Some(r) = s.resume.as_mut() {
                            r.token = "0".repeat(32);
                        }
                        s
                    }),
                    ..opts
                };
                Client::spawn(local(), opts)
            },
            backoff,
        )
        .await
        .unwrap_err();
    assert_eq!(code(e), ErrorCode::SessionExpired);
    assert_eq!(tries.load(std::sync::atomic::Ordering::SeqCst), 1);
    b.close().await.unwrap();
}

#[tokio::test]
async fn a_resume_while_another_is_being_set_up_is_session_busy() {
    let a = Client::spawn(local(), detach(60_000)).await.unwrap();
    let id = a.initialize_result().session_id.clone();
    let token = a.initialize_result().resume_token.clone();
    let socket = places().runtime_env().find_socket(&id).expect("its socket");
    // One resume has done its handshake (with the right token) and not yet
    // sent `initialize`.
    let held = host::begin_resume(&socket, "", &id, &token).await.unwrap();
    let e = Client::spawn(local(), resume(&a)).await.unwrap_err();
    assert_eq!(code(e), ErrorCode::SessionBusy);
    // It goes away: the next resume takes the session over.
    drop(held);
    let mut tries = 0;
    let b = loop {
        match Client::spawn(local(), resume(&a)).await {
            Ok(b) => break b,
            Err(e) if tries < 40 && e.code() == Some(ErrorCode::SessionBusy) => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert!(b.initialize_result().resumed);
    // A completed resume never blocks the next one: that one takes over.
    let c = Client::spawn(local(), resume(&a)).await.unwrap();
    assert!(c.initialize_result().resumed);
    let e = b
        .call(&executor_protocol::types::session::EnvironmentInfoParams {})
        .await
        .unwrap_err();
    assert_eq!(code(e), ErrorCode::SessionTakenOver);
    c.close().await.unwrap();
    drop((a, b));
}

/// Children of `pid` (from /proc).
fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
            let ppid: u32 = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == pid).then_some(p)
        })
        .collect()
}

/// The session host a relay (a stdio agent) started.
fn session_host_of(relay: u32) -> u32 {
    children_of(relay)
        .into_iter()
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|&b| b == 0).any(|arg| arg == b"session-host"))
        })
        .expect("the relay started a session host")
}

#[tokio::test]
async fn a_session_host_whose_first_initialize_failed_exits_with_its_connection() {
    let mut a = RawAgent::spawn_command(local()).await;
    let mut params = init_params();
    params.protocol_version = 99;
    params.session = Some(SessionParams {
        resume: None,
        detach_ttl_ms: Some(600_000),
    });
    let r = a
        .request(1, executor_protocol::methods::INITIALIZE, &params)
        .await;
    assert_eq!(error_code(&r), Some("unsupported_version"), "{r:?}");
    let host = session_host_of(a.child.id().unwrap());
    // The client gives up: the host has no session to keep and exits
    // (long before its 10-minute TTL).
    a.close_and_wait().await;
    assert!(
        wait_dead(host, Duration::from_secs(5)).await,
        "session host {host} outlived its only, failed connection"
    );
}

/// Issue 14, item 5: a resume refused for its token never holds the slot
/// of a resume being set up, so the right token right after it succeeds,
/// even while the refused connection stays open.
#[tokio::test]
async fn a_wrong_token_does_not_delay_the_right_one() {
    let a = Client::spawn(local(), detach(60_000)).await.unwrap();
    let id = a.initialize_result().session_id.clone();
    let mut wrong_ones = Vec::new();
    for round in 0..3 {
        // Refused, and left open (a client that does not hang up).
        let mut wrong = RawAgent::spawn_command(local()).await;
        let mut params = init_params();
        params.session = resume_with(&id, &"0".repeat(32)).session;
        let r = wrong
            .request(1, executor_protocol::methods::INITIALIZE, &params)
            .await;
        assert_eq!(
            error_code(&r),
            Some("session_expired"),
            "round {round}: {r:?}"
        );
        wrong_ones.push(wrong);
        let b = Client::spawn(local(), resume(&a))
            .await
            .unwrap_or_else(|e| panic!("round {round}: the right token was refused: {e}"));
        assert!(b.initialize_result().resumed);
        b.call(&executor_protocol::types::session::EnvironmentInfoParams {})
            .await
            .unwrap();
        b.close().await.unwrap();
    }
    // Negative control: a wrong token through the client is still refused.
    let e = Client::spawn(local(), resume_with(&id, &"1".repeat(32)))
        .await
        .unwrap_err();
    assert_eq!(code(e), ErrorCode::SessionExpired);
    drop(wrong_ones);
}

/// Issue 14, item 5: connections to the host's socket that never finish
/// their handshake (nothing sent, a handshake cut short) or present a
/// wrong token do not block a right resume, while they stay open.
#[tokio::test]
async fn stalled_or_unverified_handshakes_do_not_block_a_right_resume() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let a = Client::spawn(local(), detach(60_000)).await.unwrap();
    let id = a.initialize_result().session_id.clone();
    let token = a.initialize_result().resume_token.clone();
    let socket = places().runtime_env().find_socket(&id).expect("its socket");
    let silent = tokio::net::UnixStream::connect(&socket).await.unwrap();
    let right = host::resume_handshake("", &id, &token).unwrap();
    let mut cut = tokio::net::UnixStream::connect(&socket).await.unwrap();
    cut.write_all(&right[..right.len() - 5]).await.unwrap();
    // A whole handshake with a wrong token, then part of a frame: refused
    // at once, with the host's answer on the socket.
    let wrong = host::resume_handshake("", &id, &"0".repeat(32)).unwrap();
    let mut unverified = tokio::net::UnixStream::connect(&socket).await.unwrap();
    unverified.write_all(&wrong).await.unwrap();
    let _ = unverified.write_all(&[0, 0, 0, 100, 0x80]).await;
    let mut verdict = [0u8; 1];
    tokio::time::timeout(WAIT, unverified.read_exact(&mut verdict))
        .await
        .expect("an answer in time")
        .unwrap();
    assert_ne!(verdict[0], 0, "a wrong token was accepted");
    let e = host::begin_resume(&socket, "", &id, &"0".repeat(32))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("wrong session id or token"), "{e}");
    // The right resume, at once, while all of them are open.
    let b = Client::spawn(local(), resume(&a)).await.unwrap();
    assert!(b.initialize_result().resumed);
    b.call(&executor_protocol::types::session::EnvironmentInfoParams {})
        .await
        .unwrap();
    // Positive control: a verified handshake does hold the slot.
    let held = host::begin_resume(&socket, "", &id, &token).await.unwrap();
    let e = Client::spawn(local(), resume(&a)).await.unwrap_err();
    assert_eq!(code(e), ErrorCode::SessionBusy);
    drop((held, silent, cut, unverified));
    b.close().await.unwrap();
}

/// A session host's socket directory, from the socket.
fn socket_dir_of(socket: &Path) -> PathBuf {
    socket.parent().unwrap().to_path_buf()
}

/// Issue 14, item 8: `/tmp/executor-<uid>` taken by another user (or with
/// a mode that lets others in, or a symlink) does not disable detached
/// sessions: the host goes to `~/.cache/executor/run`, and resume finds it
/// there.
#[tokio::test]
async fn a_taken_tmp_directory_falls_back_to_the_cache_and_resume_finds_it() {
    let mut variants = vec!["mode 0777", "symlink"];
    if current_uid() == 0 {
        variants.push("owned by 65534");
    }
    for variant in variants {
        let places = Places::new();
        let taken = places.tmp.join(format!("executor-{}", current_uid()));
        match variant {
            "symlink" => {
                let target = places.tmp.join("elsewhere");
                std::fs::create_dir(&target).unwrap();
                std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o700)).unwrap();
                std::os::unix::fs::symlink(&target, &taken).unwrap();
            }
            "mode 0777" => {
                std::fs::create_dir(&taken).unwrap();
                std::fs::set_permissions(&taken, std::fs::Permissions::from_mode(0o777)).unwrap();
            }
            _ => {
                std::fs::create_dir(&taken).unwrap();
                std::fs::set_permissions(&taken, std::fs::Permissions::from_mode(0o700)).unwrap();
                nix::unistd::chown(
                    &taken,
                    Some(nix::unistd::Uid::from_raw(65534)),
                    Some(nix::unistd::Gid::from_raw(65534)),
                )
                .unwrap();
            }
        }
        let agent = || {
            let mut c = places.agent();
            c.env_remove("XDG_RUNTIME_DIR");
            c
        };
        let a = Client::spawn(agent(), detach(60_000))
            .await
            .unwrap_or_else(|e| panic!("{variant}: no detached session: {e}"));
        let id = a.initialize_result().session_id.clone();
        let mut env = places.runtime_env();
        env.xdg_runtime_dir = None;
        let socket = env.find_socket(&id).expect("its socket");
        let cache = places.home.join(".cache/executor/run");
        assert_eq!(socket_dir_of(&socket), cache, "{variant}");
        let m = std::fs::symlink_metadata(&cache).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o700);
        // Nothing was put in the taken directory.
        assert!(
            std::fs::read_dir(&taken).unwrap().next().is_none(),
            "{variant}"
        );
        kill9(a.transport_pid().unwrap());
        let b = Client::spawn(agent(), resume(&a))
            .await
            .unwrap_or_else(|e| panic!("{variant}: resume did not find it: {e}"));
        assert!(b.initialize_result().resumed);
        b.call(&executor_protocol::types::session::EnvironmentInfoParams {})
            .await
            .unwrap();
        b.close().await.unwrap();
    }
}

/// Issue 14, item 8: with `$XDG_RUNTIME_DIR`, `/tmp/executor-<uid>` and
/// `~/.cache/executor/run` all refused, `detach_ttl_ms` is refused with
/// every path and why; a session without detach still works.
#[tokio::test]
async fn when_every_socket_directory_is_refused_the_error_names_each() {
    let places = Places::new();
    // $XDG_RUNTIME_DIR writable by the group.
    std::fs::set_permissions(&places.xdg, std::fs::Permissions::from_mode(0o770)).unwrap();
    let tmp = places.tmp.join(format!("executor-{}", current_uid()));
    std::fs::create_dir(&tmp).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
    // ~/.cache/executor/run is a symlink to a private directory.
    let target = places.home.join("target");
    std::fs::create_dir(&target).unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o700)).unwrap();
    let cache = places.home.join(".cache/executor/run");
    std::fs::create_dir_all(cache.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&target, &cache).unwrap();
    let e = Client::spawn(places.agent(), detach(60_000))
        .await
        .unwrap_err();
    let message = e_message(&e);
    assert_eq!(code(e), ErrorCode::InvalidParams);
    for (path, why) in [
        (
            format!("$XDG_RUNTIME_DIR {}", places.xdg.display()),
            "has mode 0770: group or others may write to it",
        ),
        (
            tmp.display().to_string(),
            "has mode 0755: group or others have access",
        ),
        (cache.display().to_string(), "is a symbolic link"),
    ] {
        assert!(message.contains(&format!("{path}: {why}")), "{message}");
    }
    assert!(std::fs::read_dir(&target).unwrap().next().is_none());
    // Positive control: without detach the agent serves.
    let c = Client::spawn(places.agent(), ClientOptions::default())
        .await
        .unwrap();
    c.call(&executor_protocol::types::session::EnvironmentInfoParams {})
        .await
        .unwrap();
    c.close().await.unwrap();
}

/// Issue 14, item 9: `max_detached_sessions` bounds the live session hosts
/// of the user; hosts that ended (at their TTL, or killed) do not count.
#[tokio::test]
async fn max_detached_sessions_bounds_live_session_hosts() {
    let places = Places::new();
    let config = places.home.join("config.toml");
    std::fs::write(&config, "[limits]\nmax_detached_sessions = 2\n").unwrap();
    let agent = || {
        let mut c = places.agent();
        c.arg("--config").arg(&config);
        c
    };
    let a = Client::spawn(agent(), detach(60_000)).await.unwrap();
    assert_eq!(a.initialize_result().limits.max_detached_sessions, 2);
    let b = Client::spawn(agent(), detach(1_500)).await.unwrap();
    let b_host = session_host_of(b.transport_pid().unwrap());
    let third = || async {
        let e = Client::spawn(agent(), detach(60_000)).await.unwrap_err();
        match e {
            Error::Remote(w) => w,
            other => panic!("expected an agent error: {other}"),
        }
    };
    let e = third().await;
    assert_eq!(e.code, ErrorCode::LimitExceeded, "{e:?}");
    assert_eq!(
        e.data_get("limit").and_then(|v| v.as_str()),
        Some("max_detached_sessions")
    );
    assert_eq!(e.data_get("max").and_then(|v| v.as_u64()), Some(2));
    assert!(e.message.contains("2 session hosts"), "{}", e.message);
    // Sessions without detach are not bounded by it.
    let plain = Client::spawn(agent(), ClientOptions::default())
        .await
        .unwrap();
    plain.close().await.unwrap();
    // Resumes neither.
    let a2 = Client::spawn(agent(), resume(&a)).await.unwrap();
    assert!(a2.initialize_result().resumed);
    // b detaches and its TTL passes: its host ends, and there is room.
    b.close().await.unwrap();
    assert!(
        wait_dead(b_host, Duration::from_secs(10)).await,
        "b's host outlived its TTL"
    );
    let c = Client::spawn(agent(), detach(60_000)).await.unwrap();
    assert_eq!(third().await.code, ErrorCode::LimitExceeded);
    // A host killed outright leaves its files; it does not count either.
    let c_host = session_host_of(c.transport_pid().unwrap());
    kill9(c_host);
    // Its lock is released once it is gone (not when the signal is sent).
    assert!(wait_dead(c_host, Duration::from_secs(10)).await);
    let d = Client::spawn(agent(), detach(60_000)).await.unwrap();
    assert!(!d.initialize_result().resumed);
    assert_eq!(third().await.code, ErrorCode::LimitExceeded);
    d.close().await.unwrap();
    a2.close().await.unwrap();
    drop((a, c));
}

/// `ask` while the session is detached (docs/PROTOCOL.md §8): there is no
/// one to ask, so a destination off the list is denied at once (source
/// `no_client`, an audit line), the job's connection is not held for
/// `ask_timeout_ms`, and the resuming client is not asked afterwards.
/// Positive control: attached, the same destination is put to the client
/// and allowed.
#[tokio::test]
async fn ask_while_detached_denies_at_once_with_an_audit_line() {
    use executor_client::egress::EgressPolicy;
    use executor_protocol::types::network::{EgressScope, EgressVerdict, PolicyRequestResult};
    use executor_protocol::types::sandbox::{
        EgressIntent, FilesystemIntent, NetworkIntent, ReadRoots, SandboxIntent,
    };
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    let counting = |n: Arc<AtomicU32>| {
        EgressPolicy::new(move |_req| {
            n.fetch_add(1, Ordering::SeqCst);
            async {
                PolicyRequestResult {
                    decision: EgressVerdict::Allow,
                    scope: EgressScope::Once,
                }
            }
        })
    };
    let dir = unique_tempdir("session-ask");
    let audit = dir.join("audit.jsonl");
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!("[audit]\nfile = \"{}\"\n", audit.display()),
    )
    .unwrap();
    let agent = || {
        let mut c = local();
        c.arg("--config").arg(&config);
        c
    };
    let asked_a = Arc::new(AtomicU32::new(0));
    let a = Client::spawn(
        agent(),
        ClientOptions {
            egress_policy: Some(counting(asked_a.clone())),
            ..detach(60_000)
        },
    )
    .await
    .unwrap();
    if !a.initialize_result().sandbox.enforceable {
        prerequisite_missing("an enforceable sandbox (user namespaces, Landlock, seccomp)");
        return;
    }
    // 127.0.0.2: loopback, but not in the job's NO_PROXY.
    let server = executor_tests::http::TestServer::start_on("127.0.0.2:0").await;
    let url = format!("http://127.0.0.2:{}/headers", server.addr.port());
    let intent = SandboxIntent {
        filesystem: FilesystemIntent {
            read: ReadRoots::All,
            ..Default::default()
        },
        network: NetworkIntent::AllowHosts(EgressIntent {
            allow_hosts: vec!["listed.test".into()],
            ask: true,
            ask_timeout_ms: 60_000,
        }),
        required: true,
        workspace_roots: None,
    };
    let curl = format!("curl -sS -o /dev/null -w '%{{http_code}} %{{time_total}}' {url}");
    let job = |script: String| {
        let mut p =
            ProcessStartParams::new(vec!["/bin/sh".into(), "-c".into(), script], "/", env());
        p.sandbox = Some(intent.clone());
        p
    };
    // Attached: asked, allowed.
    let mut p = a.start(&job(curl.clone())).await.unwrap();
    let mut out = Vec::new();
    while let Some(ch) = p.next_output().await.unwrap() {
        out.extend_from_slice(&ch.data);
    }
    let out = String::from_utf8(out).unwrap();
    assert!(out.starts_with("200 "), "{out}");
    assert_eq!(asked_a.load(Ordering::SeqCst), 1);
    // Detached before the job connects.
    let p = a.start(&job(format!("sleep 2; {curl}"))).await.unwrap();
    let id = p.id().to_string();
    kill9(a.transport_pid().unwrap());
    let started = Instant::now();
    let denied = |l: &serde_json::Value| {
        l["method"] == "network/decision"
            && l["host"] == "127.0.0.2"
            && l["decision"] == "deny"
            && l["source"] == "no_client"
            && l["outcome"] == "sandbox_denied"
            && l["process_id"] == id.as_str()
    };
    let line = loop {
        let found = std::fs::read_to_string(&audit)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(denied);
        if let Some(l) = found {
            break l;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no no_client audit line for the detached job: {}",
            std::fs::read_to_string(&audit).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(line["port"], server.addr.port());
    // Resumed: the job got its 403 promptly, and nobody is asked now.
    let asked_b = Arc::new(AtomicU32::new(0));
    let b = Client::spawn(
        agent(),
        ClientOptions {
            egress_policy: Some(counting(asked_b.clone())),
            ..resume(&a)
        },
    )
    .await
    .unwrap();
    assert!(b.initialize_result().resumed);
    let (out, exit) = read_rest(&b, &id, None).await;
    assert_eq!(exit.exit_code, Some(0));
    let out = String::from_utf8(out).unwrap();
    let (code, secs) = out.split_once(' ').expect("code and time");
    assert_eq!(code, "403", "{out}");
    let secs: f64 = secs.parse().unwrap();
    assert!(secs < 10.0, "held {secs} s (ask_timeout_ms is 60 s)");
    assert_eq!(asked_b.load(Ordering::SeqCst), 0);
    assert_eq!(asked_a.load(Ordering::SeqCst), 1);
    b.close().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Whether `pid` has a descriptor open on `file`.
fn holds_open(pid: u32, file: &Path) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.flatten()
                .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l == file))
        })
        .unwrap_or(false)
}

/// A read stream ends with its connection, even when the session lives on
/// detached: its file is closed in the session host.
#[tokio::test]
async fn a_dropped_connection_ends_its_read_streams_and_closes_their_files() {
    use futures_util::StreamExt;
    let c = Client::spawn(local(), detach(60_000)).await.unwrap();
    let relay = c.transport_pid().unwrap();
    let host = session_host_of(relay);
    let d = unique_tempdir("rs-drop");
    let f = std::fs::canonicalize(&d).unwrap().join("big");
    // Far more than one window: the stream stays open while nothing is taken.
    std::fs::write(&f, vec![7u8; 64 << 20]).unwrap();
    let (_, s) = c.read_stream(f.to_str().unwrap()).await.unwrap();
    let mut s = Box::pin(s);
    assert_eq!(s.next().await.unwrap().unwrap()[0], 7);
    assert!(
        holds_open(host, &f),
        "positive control: the stream holds its file"
    );
    kill9(relay);
    let deadline = Instant::now() + Duration::from_secs(10);
    while holds_open(host, &f) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !holds_open(host, &f),
        "the session host still holds {}",
        f.display()
    );
    // The session itself lives on, detached, and can be taken back.
    assert!(alive(host));
    let back = Client::spawn(local(), resume(&c)).await.unwrap();
    assert!(back.initialize_result().resumed);
    drop(s);
    back.close().await.unwrap();
    kill9(host);
}

/// Pipe descriptors `pid` holds.
fn pipe_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.flatten()
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|l| l.to_string_lossy().starts_with("pipe:"))
                })
                .count()
        })
        .unwrap_or(0)
}

/// Blocks a session host has pinned in pipes for a connection that stopped
/// reading, then dropped, never reach the resumed connection: their pipes
/// are closed, not reused, and a file read after the resume arrives byte
/// for byte.
#[tokio::test]
async fn blocks_pinned_when_the_connection_drops_never_reach_the_resumed_one() {
    use executor_protocol::methods as m;
    use executor_protocol::types::fs::ReadStreamParams;
    use futures_util::StreamExt;
    let d = unique_tempdir("rs-pinned");
    let d = std::fs::canonicalize(&d).unwrap();
    let big = d.join("big");
    std::fs::write(&big, vec![7u8; 40 << 20]).unwrap();
    // A relay whose output nobody reads: the host's writer stalls with
    // blocks pinned.
    let mut a = RawAgent::spawn_command(local()).await;
    let mut init = init_params();
    init.session = Some(SessionParams {
        resume: None,
        detach_ttl_ms: Some(60_000),
    });
    let r = a.request(0, m::INITIALIZE, &init).await;
    let text = |k: &str| {
        path(&r, &format!("result.{k}"))
            .and_then(|v| v.as_str())
            .unwrap_or_else(|| panic!("no {k} in {r:?}"))
            .to_string()
    };
    let (id, token) = (text("session_id"), text("resume_token"));
    let relay = a.child.id().unwrap();
    let host = session_host_of(relay);
    let pipes_before = pipe_fds(host);
    for i in 1..=4 {
        let params = ReadStreamParams {
            path: Some(big.to_str().unwrap().into()),
            handle: None,
            offset: 0,
            length: None,
            block_bytes: 1 << 20,
            credit_bytes: 16 << 20,
            sandbox: None,
            cwd: None,
        };
        a.send_request(i, m::FS_READ_STREAM, &params).await;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while pipe_fds(host) < pipes_before + 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pinned = pipe_fds(host) - pipes_before;
    assert!(
        pinned >= 2,
        "positive control: the host holds blocks in pipes ({pinned} fds)"
    );
    assert!(pinned <= 2 * 32, "{pinned} pipe descriptors");
    kill9(relay);
    let _ = a.wait().await;
    // The streams end with the connection; their pipes are closed.
    let deadline = Instant::now() + Duration::from_secs(10);
    while (holds_open(host, &big) || pipe_fds(host) > pipes_before) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!holds_open(host, &big), "the streams' file is closed");
    assert!(
        pipe_fds(host) <= pipes_before,
        "pipes holding unsent blocks are closed ({} fds, {pipes_before} before)",
        pipe_fds(host)
    );
    let back = Client::spawn(local(), resume_with(&id, &token))
        .await
        .unwrap();
    assert!(back.initialize_result().resumed);
    let mut rng = Rng(0xb10c_0ff5);
    let data: Vec<u8> = (0..(5 << 20) + 3).map(|_| rng.next_u64() as u8).collect();
    let small = d.join("small");
    std::fs::write(&small, &data).unwrap();
    for f in [&small, &big] {
        let (_, s) = back.read_stream(f.to_str().unwrap()).await.unwrap();
        let got: Vec<u8> = s.map(|b| b.unwrap()).collect::<Vec<_>>().await.concat();
        if f == &small {
            assert!(got == data, "{} bytes of {}", got.len(), data.len());
        } else {
            assert!(got.len() == 40 << 20 && got.iter().all(|&b| b == 7));
        }
    }
    back.close().await.unwrap();
    kill9(host);
    std::fs::remove_dir_all(&d).unwrap();
}

/// A resume that takes the session over while the old connection still
/// looks attached ends the old connection's read streams: none of their
/// blocks (or ends) reach the new connection, whose own streams arrive
/// whole.
#[tokio::test]
async fn a_takeover_ends_the_old_connections_read_streams_and_sends_it_none_of_them() {
    use executor_protocol::methods as m;
    use executor_protocol::types::fs::ReadStreamParams;
    use futures_util::StreamExt;
    let d = std::fs::canonicalize(unique_tempdir("rs-takeover")).unwrap();
    let big = d.join("big");
    std::fs::write(&big, vec![9u8; 48 << 20]).unwrap();
    let mut a = RawAgent::spawn_command(local()).await;
    let mut init = init_params();
    init.session = Some(SessionParams {
        resume: None,
        detach_ttl_ms: Some(60_000),
    });
    let r = a.request(0, m::INITIALIZE, &init).await;
    let text = |k: &str| {
        path(&r, &format!("result.{k}"))
            .and_then(|v| v.as_str())
            .unwrap_or_else(|| panic!("no {k} in {r:?}"))
            .to_string()
    };
    let (id, token) = (text("session_id"), text("resume_token"));
    let host = session_host_of(a.child.id().unwrap());
    let params = |block: u64, credit: u64| ReadStreamParams {
        path: Some(big.to_str().unwrap().into()),
        handle: None,
        offset: 0,
        length: None,
        block_bytes: block,
        credit_bytes: credit,
        sandbox: None,
        cwd: None,
    };
    // Two streams on the old connection, which is never read again: each
    // sends its window (one block, which the transport's buffers take
    // whole) and waits for credit that never comes.
    for i in 1..=2 {
        a.send_request(i, m::FS_READ_STREAM, &params(128 << 10, 128 << 10))
            .await;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while !holds_open(host, &big) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(holds_open(host, &big), "positive control: the streams run");
    // Taken over, the old transport alive.
    let back = Client::spawn(local(), resume_with(&id, &token))
        .await
        .unwrap();
    assert!(back.initialize_result().resumed);
    let mut everything = back.subscribe(&[m::FS_READ_STREAM_DATA, m::FS_READ_STREAM_END]);
    let mut rng = Rng(0x07a6_e0e5);
    let data: Vec<u8> = (0..(3 << 20) + 11).map(|_| rng.next_u64() as u8).collect();
    let small = d.join("small");
    std::fs::write(&small, &data).unwrap();
    let (_, s) = back.read_stream(small.to_str().unwrap()).await.unwrap();
    let got: Vec<u8> = s.map(|b| b.unwrap()).collect::<Vec<_>>().await.concat();
    assert!(got == data, "{} bytes of {}", got.len(), data.len());
    // The old streams ended: their file is closed.
    let deadline = Instant::now() + Duration::from_secs(10);
    while holds_open(host, &big) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !holds_open(host, &big),
        "the old streams still hold their file"
    );
    // Everything the new connection saw belongs to its own stream (ids 1
    // and 2 were the old connection's).
    let mut seen = Vec::new();
    while let Ok(Some(n)) =
        tokio::time::timeout(Duration::from_millis(200), everything.recv()).await
    {
        use executor_protocol::types::fs::{ReadStreamData, ReadStreamEnd};
        seen.push(if n.method == m::FS_READ_STREAM_END {
            n.decode::<ReadStreamEnd>().unwrap().stream_id
        } else {
            n.decode::<ReadStreamData>().unwrap().stream_id
        });
    }
    assert!(
        !seen.is_empty(),
        "positive control: the new stream's messages"
    );
    assert!(
        seen.iter().all(|&s| s > 2),
        "old streams' messages arrived: {seen:?}"
    );
    back.close().await.unwrap();
    drop(a);
    kill9(host);
    std::fs::remove_dir_all(&d).unwrap();
}

/// Adversarial pass on `fs/passDescriptor`: a native client whose stdio
/// agent relays it to a session host (a detached session, then a resume)
/// is on the host's own socket behind the relay, yet is passed no
/// descriptor: without `capabilities.descriptors` the host refuses the
/// method, and a resume declaring it is refused at `initialize`.
/// Positive control: `fs/readBlock` reads the same handle.
#[tokio::test]
async fn a_relayed_detached_or_resumed_session_is_passed_no_descriptor() {
    use executor_protocol::methods as m;
    use executor_protocol::types::fs::{OpenParams, PassDescriptorParams, ReadBlockParams};
    use executor_protocol::types::session::ClientCapabilities;
    let d = unique_tempdir("relayed-descriptor");
    std::fs::write(d.join("f"), b"hello").unwrap();
    let f = executor_protocol::WirePath::from(d.join("f").as_path());
    let pass = |handle| PassDescriptorParams {
        handle,
        sandbox: None,
        cwd: None,
    };
    let read = |handle| ReadBlockParams {
        handle,
        offset: 0,
        length: 5,
        sandbox: None,
        cwd: None,
    };
    async fn refused_then_read(
        a: &mut RawAgent,
        path: &executor_protocol::WirePath,
        id: u64,
        pass: impl Fn(u64) -> PassDescriptorParams,
        read: impl Fn(u64) -> ReadBlockParams,
    ) {
        let r = a
            .request(
                id,
                m::FS_OPEN,
                &OpenParams {
                    path: path.clone(),
                    sandbox: None,
                    cwd: None,
                },
            )
            .await;
        let handle = executor_tests::path(&r, "result.handle")
            .and_then(|v| v.as_u64())
            .unwrap_or_else(|| panic!("{r:?}"));
        let r = a
            .request(id + 1, m::FS_PASS_DESCRIPTOR, &pass(handle))
            .await;
        assert_eq!(error_code(&r), Some("invalid_request"), "{r:?}");
        let msg = executor_tests::path(&r, "error.message").and_then(|v| v.as_str());
        assert!(
            msg.is_some_and(|m| m.contains("its output is not a Unix socket")),
            "refused by the host (it serves the relay's pipes): {r:?}"
        );
        let r = a.request(id + 2, m::FS_READ_BLOCK, &read(handle)).await;
        assert_eq!(
            executor_tests::path(&r, "result.data").and_then(|v| v.as_slice()),
            Some(&b"hello"[..]),
            "{r:?}"
        );
    }
    let (mut a, id, token) = detached_raw(local(), 60_000).await;
    session_host_of(a.child.id().unwrap());
    refused_then_read(&mut a, &f, 2, pass, read).await;
    a.close_and_wait().await;
    // A resume declaring descriptors: refused, the session kept.
    let mut b = RawAgent::spawn_command(local()).await;
    let mut params = init_params();
    params.session = resume_with(&id, &token).session;
    params.capabilities = Some(ClientCapabilities {
        agent_requests: false,
        descriptors: true,
    });
    let r = b.request(1, m::INITIALIZE, &params).await;
    assert_eq!(error_code(&r), Some("invalid_request"), "{r:?}");
    b.close_and_wait().await;
    // Resumed without them: the host refuses the method again.
    let mut c = RawAgent::spawn_command(local()).await;
    params.capabilities = None;
    let r = c.request(1, m::INITIALIZE, &params).await;
    assert_eq!(
        executor_tests::path(&r, "result.resumed").and_then(|v| v.as_bool()),
        Some(true),
        "{r:?}"
    );
    refused_then_read(&mut c, &f, 2, pass, read).await;
    c.close_and_wait().await;
    std::fs::remove_dir_all(&d).unwrap();
}

/// A raw agent started by `cmd` whose `initialize` detached a session of
/// `ttl_ms`: the agent, the session id and the resume token.
async fn detached_raw(cmd: tokio::process::Command, ttl_ms: u64) -> (RawAgent, String, String) {
    let mut a = RawAgent::spawn_command(cmd).await;
    let mut params = init_params();
    params.session = detach(ttl_ms).session;
    let r = a
        .request(1, executor_protocol::methods::INITIALIZE, &params)
        .await;
    let text = |k: &str| {
        executor_tests::path(&r, &format!("result.{k}"))
            .and_then(|v| v.as_str())
            .unwrap_or_else(|| panic!("no {k} in {r:?}"))
            .to_string()
    };
    let (id, token) = (text("session_id"), text("resume_token"));
    (a, id, token)
}

/// A raw local agent that resumed the session `id` with `token`.
async fn resumed_raw(id: &str, token: &str) -> RawAgent {
    let mut b = RawAgent::spawn_command(local()).await;
    let mut params = init_params();
    params.session = resume_with(id, token).session;
    let r = b
        .request(1, executor_protocol::methods::INITIALIZE, &params)
        .await;
    assert_eq!(
        executor_tests::path(&r, "result.resumed").and_then(|v| v.as_bool()),
        Some(true),
        "{r:?}"
    );
    b
}

/// Start `argv` (pipes, in `/`) through a raw agent with request `id`:
/// its process id.
async fn start_raw(a: &mut RawAgent, id: u64, argv: &[&str]) -> String {
    let argv = argv.iter().map(|s| s.to_string()).collect();
    let p = ProcessStartParams::new(argv, "/", env());
    let r = a
        .request(id, executor_protocol::methods::PROCESS_START, &p)
        .await;
    executor_tests::path(&r, "result.process_id")
        .and_then(|v| v.as_str())
        .unwrap_or_else(|| panic!("{r:?}"))
        .to_string()
}

/// The inode of what `/proc/PID/fd/FD` names (`pipe:[N]`, `socket:[N]`).
fn fd_target(pid: u32, fd: &str) -> String {
    std::fs::read_link(format!("/proc/{pid}/fd/{fd}"))
        .map(|l| l.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Whether `pid` holds an open file named `target` (as [`fd_target`]).
fn holds_target(pid: u32, target: &str) -> bool {
    executor_tests::fd_links(pid).iter().any(|l| l == target)
}

/// The state letter of `pid` (`/proc/PID/stat`).
fn state_of(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// A detached (and then a resumed) session is served by the session host
/// on the stdio agent's own stdin and stdout, handed over by `SCM_RIGHTS`:
/// the stdio agent leaves the data path (stopped, it delays nothing), the
/// host holds the very pipes, no job inherits them, and the stdio agent
/// exits with the connection, with its exit status (2 for broken framing).
#[tokio::test]
async fn a_detached_connection_is_handed_to_the_host_and_the_relay_leaves_the_path() {
    use executor_protocol::methods as m;
    use executor_protocol::types::session::EnvironmentInfoParams;
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let (mut a, id, token) = detached_raw(local(), 60_000).await;
    let relay = a.child.id().unwrap();
    let host = session_host_of(relay);
    // The host holds the relay's stdin and stdout themselves.
    for fd in ["0", "1"] {
        let target = fd_target(relay, fd);
        assert!(target.starts_with("pipe:"), "relay fd {fd}: {target}");
        assert!(
            holds_target(host, &target),
            "the session host {host} does not hold the relay's fd {fd} ({target})"
        );
    }
    // Stopped, the relay delays nothing: the host answers on the pipes.
    kill(Pid::from_raw(relay as i32), Signal::SIGSTOP).unwrap();
    for _ in 0..100 {
        if state_of(relay) == Some('T') {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(state_of(relay), Some('T'), "the relay is stopped");
    let r = a
        .request(2, m::ENVIRONMENT_INFO, &EnvironmentInfoParams {})
        .await;
    assert!(executor_tests::path(&r, "result").is_some(), "{r:?}");
    // A job's descriptors are its own three: the handed pipes stay in the
    // host (close-on-exec).
    let pid = start_raw(&mut a, 3, &["sh", "-c", "ls /proc/$$/fd; :"]).await;
    let mut out = Vec::new();
    let mut after = None;
    let mut n = 10;
    loop {
        let r = a
            .request(
                n,
                m::PROCESS_READ,
                &ProcessReadParams {
                    process_id: pid.clone(),
                    after_seq: after,
                    max_bytes: None,
                    wait_ms: Some(2_000),
                },
            )
            .await;
        n += 1;
        let read: ProcessReadResult =
            rmpv::ext::from_value(executor_tests::path(&r, "result").unwrap().clone())
                .unwrap_or_else(|e| panic!("{e}: {r:?}"));
        for c in &read.chunks {
            out.extend_from_slice(&c.data);
            after = Some(c.seq);
        }
        if read.exited.is_some() {
            break;
        }
        assert!(n < 30, "the job did not end: {out:?}");
    }
    let fds: Vec<String> = String::from_utf8_lossy(&out)
        .split_whitespace()
        .map(String::from)
        .collect();
    assert_eq!(fds, ["0", "1", "2"], "the job's descriptors");
    kill(Pid::from_raw(relay as i32), Signal::SIGCONT).unwrap();
    // The connection ends: the relay exits with it (0), the session stays.
    let status = a.close_and_wait().await;
    assert_eq!(status.code(), Some(0), "the relay's exit");
    assert!(executor_tests::alive(host), "the session host lives on");
    // A resume is handed over too; broken framing reaches the relay's
    // exit status as it would in-process.
    let mut b = resumed_raw(&id, &token).await;
    let relay_b = b.child.id().unwrap();
    let target = fd_target(relay_b, "0");
    assert!(holds_target(host, &target), "the resumed relay's stdin");
    b.send_raw(&[0, 0, 0, 0]).await;
    let status = tokio::time::timeout(WAIT, b.wait())
        .await
        .expect("the relay exits with its connection");
    assert_eq!(status.code(), Some(2), "broken framing: the relay's exit");
    assert!(
        !holds_target(host, &target),
        "the host let go of the ended connection's stdin"
    );
    kill9(host);
}

/// Attacks on the hand-over, as a peer holding the session's credentials
/// (the same uid) would make them on the host's socket directly.
mod hand_over {
    use super::*;
    use executor_protocol::methods as m;
    use nix::sys::socket::MsgFlags;
    use std::io::{Read, Write};
    use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
    use std::os::unix::net::UnixStream as StdUnix;

    use executor_tests::fd_links as targets;

    fn own_target(fd: BorrowedFd<'_>) -> String {
        std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .unwrap()
            .to_string_lossy()
            .into_owned()
    }

    /// A detached session whose first relay has closed.
    async fn detached() -> (String, String, u32, PathBuf) {
        let (mut a, id, token) = detached_raw(local(), 120_000).await;
        let host = session_host_of(a.child.id().unwrap());
        assert_eq!(a.close_and_wait().await.code(), Some(0));
        let socket = places().runtime_env().find_socket(&id).expect("its socket");
        (id, token, host, socket)
    }

    /// Past a resume's handshake that announced descriptors.
    fn accepted(socket: &Path, id: &str, token: &str) -> StdUnix {
        let mut hello = host::resume_handshake("", id, token).unwrap();
        hello[5] = 1; // the carry byte: descriptors
        for _ in 0..50 {
            let mut s = StdUnix::connect(socket).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
            s.write_all(&hello).unwrap();
            let mut v = [0u8; 1];
            s.read_exact(&mut v).unwrap();
            if v[0] == 0 {
                return s;
            }
            assert_eq!(v[0], 3, "the verdict (busy, else accepted)");
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("never accepted");
    }

    /// Every malformed hand-over is answered "not taken" (`N`) and the
    /// socket closed, and none of its descriptors stays open in the host
    /// (three descriptors, one more than room: the kernel's cut message
    /// once left the two it installed open and owned by nothing); then the
    /// owner's resume works. Control: a well-formed hand-over is taken.
    #[tokio::test]
    async fn a_bad_hand_over_is_refused_and_leaves_nothing_open() {
        use nix::fcntl::{open, OFlag};
        use nix::sys::stat::Mode;
        let (id, token, host, socket) = detached().await;
        let scratch = unique_tempdir("hand-over");
        let regular = scratch.join("regular");
        std::fs::write(&regular, b"x").unwrap();
        let pipe = || nix::unistd::pipe().unwrap();
        let dgram = || {
            let (a, _b) = std::os::unix::net::UnixDatagram::pair().unwrap();
            OwnedFd::from(a)
        };
        type Case = (&'static str, Vec<OwnedFd>, [u8; 4]);
        let cases: Vec<Case> = vec![
            {
                let (_r, w) = pipe();
                let d = open(
                    &scratch,
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY,
                    Mode::empty(),
                )
                .unwrap();
                ("a directory as stdin", vec![d, w], [0; 4])
            },
            {
                let (r, _w) = pipe();
                let f = open(&regular, OFlag::O_WRONLY, Mode::empty()).unwrap();
                ("a regular file as stdout", vec![r, f], [0; 4])
            },
            {
                let (r, _w) = pipe();
                ("a datagram socket as stdout", vec![r, dgram()], [0; 4])
            },
            {
                let (r, w) = pipe();
                let (x, _xw) = pipe();
                ("three descriptors", vec![r, w, x], [0; 4])
            },
            {
                let (r, _w) = pipe();
                ("one descriptor", vec![r], [0; 4])
            },
            {
                let (r, w) = pipe();
                ("stdin and stdout swapped", vec![w, r], [0; 4])
            },
            {
                let (r, w) = pipe();
                ("a replay of 4 GiB", vec![r, w], [0xff; 4])
            },
        ];
        for (what, fds, head) in cases {
            let names: Vec<String> = fds.iter().map(|f| own_target(f.as_fd())).collect();
            let mut s = accepted(&socket, &id, &token);
            let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
            executor_sys::send_fds(s.as_fd(), &head, &borrowed, MsgFlags::empty()).unwrap();
            drop(borrowed);
            let mut answer = Vec::new();
            s.read_to_end(&mut answer).unwrap();
            assert_eq!(answer, b"N", "{what}: not taken, and the socket closed");
            drop(fds);
            let kept: Vec<&String> = names
                .iter()
                .filter(|n| !n.starts_with("/dev/"))
                .filter(|n| targets(host).contains(n))
                .collect();
            assert!(kept.is_empty(), "{what}: the host keeps {kept:?}");
        }
        // Control: a pipe pair is taken, and let go when its peer goes.
        let ((in_r, in_w), (out_r, out_w)) = (pipe(), pipe());
        let name = own_target(in_r.as_fd());
        let mut s = accepted(&socket, &id, &token);
        executor_sys::send_fds(
            s.as_fd(),
            &[0; 4],
            &[in_r.as_fd(), out_w.as_fd()],
            MsgFlags::empty(),
        )
        .unwrap();
        let mut taken = [0u8; 1];
        s.read_exact(&mut taken).unwrap();
        assert_eq!(&taken, b"T", "a well-formed hand-over is taken");
        assert!(targets(host).contains(&name), "the host holds it");
        drop((in_w, out_r, in_r, out_w));
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, [0], "the connection ended with its input (Eof)");
        assert!(!targets(host).contains(&name), "and the host let go");
        // The owner resumes.
        let mut b = resumed_raw(&id, &token).await;
        b.close_and_wait().await;
        kill9(host);
        std::fs::remove_dir_all(&scratch).unwrap();
    }

    /// A client that closes its input without ever reading its output:
    /// the host stops the writer stalled on the SSH side's stdout and lets
    /// go of it before the relay exits (no process but the host would
    /// otherwise hold the channel open).
    #[tokio::test]
    async fn a_stalled_output_is_let_go_when_the_connection_ends() {
        let (mut a, _, _) = detached_raw(local(), 120_000).await;
        let relay = a.child.id().unwrap();
        let host = session_host_of(relay);
        let out = std::fs::read_link(format!("/proc/{relay}/fd/1"))
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let pid = start_raw(&mut a, 2, &["head", "-c", "4000000", "/dev/zero"]).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        for i in 0..16u64 {
            let rp = ProcessReadParams {
                process_id: pid.clone(),
                after_seq: None,
                max_bytes: Some(1 << 20),
                wait_ms: Some(0),
            };
            a.send_request(100 + i, m::PROCESS_READ, &rp).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        a.stdin.take();
        let exited = tokio::time::timeout(Duration::from_secs(30), a.child.wait())
            .await
            .expect("the relay exits with its connection");
        assert!(exited.is_ok());
        assert!(
            !targets(host).contains(&out),
            "the relay is gone and the host still holds the SSH side's stdout"
        );
        kill9(host);
    }

    /// The host cannot take the descriptors (it is at its open-file limit:
    /// no attacker needed): the relay, which still has its connection,
    /// answers the resume's `initialize` itself with `session_expired`
    /// instead of leaving it unanswered, and the host holds none of its
    /// pipes.
    #[tokio::test]
    async fn a_hand_over_the_host_cannot_take_is_answered_by_the_relay() {
        let limited = || {
            let mut c = tokio::process::Command::new("prlimit");
            c.arg("--nofile=64:64").arg("--").arg(executor_bin());
            let p = places().runtime_env();
            c.env("XDG_RUNTIME_DIR", p.xdg_runtime_dir.unwrap())
                .env("TMPDIR", &p.tmp)
                .env("HOME", p.home.unwrap());
            c
        };
        let (mut a, id, token) = detached_raw(limited(), 60_000).await;
        let host = session_host_of(a.child.id().unwrap());
        // Fill the host's descriptor table with read handles, then leave
        // exactly one number free below 64: the accepted socket takes it,
        // and the hand-over's two descriptors find no room.
        let mut handles = Vec::new();
        for i in 0..100u64 {
            let r = a
                .request(
                    10 + i,
                    m::FS_OPEN,
                    &executor_protocol::types::fs::OpenParams {
                        path: "/etc/hostname".into(),
                        cwd: None,
                        sandbox: None,
                    },
                )
                .await;
            match executor_tests::path(&r, "result.handle").and_then(|v| v.as_u64()) {
                Some(h) => handles.push(h),
                None => break,
            }
        }
        let free = || {
            64 - std::fs::read_dir(format!("/proc/{host}/fd"))
                .unwrap()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().parse::<u32>().unwrap() < 64)
                .count()
        };
        let mut j = 0;
        while free() < 1 {
            let h = handles.pop().expect("a handle to close");
            let r = a
                .request(
                    500 + j,
                    m::FS_CLOSE,
                    &executor_protocol::types::fs::CloseParams {
                        handle: h,
                        cwd: None,
                        sandbox: None,
                    },
                )
                .await;
            assert!(executor_tests::path(&r, "result").is_some(), "{r:?}");
            j += 1;
        }
        let mut b = RawAgent::spawn_command(limited()).await;
        let b_pid = b.child.id().unwrap();
        let b_pipes: Vec<String> = ["0", "1"]
            .iter()
            .map(|fd| {
                std::fs::read_link(format!("/proc/{b_pid}/fd/{fd}"))
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        let mut params = init_params();
        params.session = resume_with(&id, &token).session;
        b.send_request(1, m::INITIALIZE, &params).await;
        let answer = b.recv().await.expect("the resume's initialize is answered");
        assert_eq!(error_code(&answer), Some("session_expired"), "{answer:?}");
        let held: Vec<&String> = b_pipes
            .iter()
            .filter(|p| targets(host).contains(p))
            .collect();
        assert!(
            held.is_empty(),
            "the host holds the refused relay's {held:?}"
        );
        b.close_and_wait().await;
        // The session is intact: the first connection still works.
        let r = a
            .request(
                900,
                m::ENVIRONMENT_INFO,
                &executor_protocol::types::session::EnvironmentInfoParams {},
            )
            .await;
        assert!(executor_tests::path(&r, "result").is_some(), "{r:?}");
        a.close_and_wait().await;
        kill9(host);
    }
}
