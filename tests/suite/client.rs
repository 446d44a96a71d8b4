//! The client library against the real agent.

use executor_client::{Client, ClientOptions, Error, ErrorCode, Target};
use executor_protocol::types::Empty;
use executor_tests::executor_bin;

fn shell_with_noise(noise_bytes: usize) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(format!(
            "head -c {noise_bytes} /dev/zero | tr '\\0' 'N'; printf 'Welcome to devbox\\n'; exec \"$0\"",
        ))
        .arg(executor_bin());
    cmd
}

#[tokio::test]
async fn local_target_connects_and_initializes() {
    // `local` finds the `executor` next to the running binary (here the
    // test binary in target/*/deps, one level below it).
    let c = Client::connect_target(&Target::local(), ClientOptions::default())
        .await
        .expect("connect");
    assert_eq!(c.initialize_result().protocol_version, 1);
    let info = c
        .call(&executor_protocol::types::session::EnvironmentInfoParams {})
        .await
        .unwrap();
    assert_eq!(info.path_separator, "/");
    assert_eq!(info.uid, executor_tests::current_uid());
    c.close().await.unwrap();
}

/// A target's transports are tried in turn (issue 33): one that cannot
/// start or ends before the agent answers passes to the next; when none
/// connects, the error names each with its own failure.
#[tokio::test]
async fn a_target_tries_its_transports_in_turn() {
    let missing = "/nonexistent/executor-transport";
    let target = Target::command([missing])
        .or(Target::command([
            "/bin/sh",
            "-c",
            "echo no agent here >&2; exit 7",
        ]))
        .or(Target::command([executor_bin()]));
    let c = Client::connect_target(&target, ClientOptions::default())
        .await
        .expect("the third transport connects");
    assert_eq!(c.initialize_result().protocol_version, 1);
    c.close().await.unwrap();

    let none = Target::command([missing]).or(Target::command(["/bin/sh", "-c", "exit 7"]));
    let e = Client::connect_target(&none, ClientOptions::default())
        .await
        .unwrap_err();
    let Error::Transports(failed) = &e else {
        panic!("not Error::Transports: {e:?}");
    };
    assert_eq!(failed.len(), 2, "{e}");
    assert!(matches!(failed[0].1, Error::Spawn { .. }), "{e}");
    assert!(
        matches!(failed[1].1, Error::Exited { code: Some(7), .. }),
        "{e}"
    );
    assert!(e.to_string().contains(missing), "{e}");

    // One transport: its own error, not a list.
    let e = Client::connect_target(&Target::command([missing]), ClientOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Spawn { .. }), "{e:?}");
}

/// An agent's answer is final: a refused resume is not retried on the next
/// transport.
#[tokio::test]
async fn an_agents_refusal_ends_the_transport_list() {
    use executor_protocol::types::session::{ResumeParams, SessionParams};
    let marker = executor_tests::unique_tempdir("transport-list").join("second-ran");
    let second = format!("touch {}; exit 9", marker.display());
    let target = Target::command([executor_bin()]).or(Target::command(["/bin/sh", "-c", &second]));
    let resume = ClientOptions {
        session: Some(SessionParams {
            resume: Some(ResumeParams {
                session_id: "0".repeat(32),
                token: "1".repeat(32),
            }),
            detach_ttl_ms: None,
        }),
        ..ClientOptions::default()
    };
    let e = Client::connect_target(&target, resume).await.unwrap_err();
    assert!(matches!(e, Error::Remote(_)), "an agent's answer: {e:?}");
    assert!(!marker.exists(), "the second transport was not tried");
}

#[tokio::test]
async fn preamble_after_ten_kib_of_banner_noise() {
    let c = Client::spawn(shell_with_noise(10 * 1024), ClientOptions::default())
        .await
        .expect("noise before the preamble is skipped");
    c.call(&executor_protocol::types::session::ToolsListParams {})
        .await
        .unwrap();
    c.close().await.unwrap();
}

#[tokio::test]
async fn noise_over_64_kib_fails_quoting_it() {
    let err = Client::spawn(shell_with_noise(70 * 1024), ClientOptions::default())
        .await
        .expect_err("too much noise");
    match &err {
        Error::Preamble { seen, reason } => {
            assert!(seen.starts_with("NNNNNNNN"), "{seen:?}");
            assert!(reason.contains("64 KiB"), "{reason}");
        }
        other => panic!("expected a preamble error, got {other:?}"),
    }
    assert!(err.to_string().contains("NNNN"));
}

#[tokio::test]
async fn eof_before_the_preamble_fails_quoting_what_was_seen() {
    let mut cmd = tokio::process::Command::new("/bin/sh");
    cmd.arg("-c").arg("echo 'executor: command not found'");
    let err = Client::spawn(cmd, ClientOptions::default())
        .await
        .expect_err("no agent");
    match err {
        Error::Preamble { seen, reason } => {
            assert!(seen.contains("command not found"), "{seen:?}");
            assert!(reason.contains("ended"), "{reason}");
        }
        other => panic!("expected a preamble error, got {other:?}"),
    }
}

#[tokio::test]
async fn errors_are_typed_and_many_requests_fly_at_once() {
    let c = Client::spawn(
        tokio::process::Command::new(executor_bin()),
        ClientOptions::default(),
    )
    .await
    .unwrap();
    let err = c
        .request::<_, Empty>("no/such", &Empty {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::MethodNotFound));
    let mut calls = Vec::new();
    for _ in 0..500 {
        calls.push(
            c.start_call(executor_protocol::methods::ENVIRONMENT_INFO, &Empty {})
                .await
                .unwrap(),
        );
    }
    let ids: std::collections::BTreeSet<u64> = calls.iter().map(|c| c.id()).collect();
    assert_eq!(ids.len(), 500);
    for call in calls {
        let info: executor_protocol::types::session::EnvironmentInfo = call.result().await.unwrap();
        assert_eq!(info.path_separator, "/");
    }
    c.close().await.unwrap();
}

#[tokio::test]
async fn requests_after_the_agent_died_fail_as_closed() {
    let c = Client::spawn(
        tokio::process::Command::new(executor_bin()),
        ClientOptions::default(),
    )
    .await
    .unwrap();
    // Break framing on purpose: the agent closes.
    c.notify("x", &Empty {}).await.unwrap();
    let big = vec![0u8; 1];
    let _ = c
        .request::<_, Empty>("tools/list", &serde_bytes::ByteBuf::from(big))
        .await;
    // The agent is still fine after a bad-params request.
    let r = c
        .call(&executor_protocol::types::session::ToolsListParams {})
        .await;
    assert!(r.is_ok(), "{r:?}");
    c.close().await.unwrap();
}
