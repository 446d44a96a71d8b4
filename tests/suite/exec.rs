//! The unified-exec tool contract (docs/PROTOCOL.md §4).

use executor_protocol::types::exec::*;
use executor_tests::*;
use std::collections::BTreeMap;

fn cmd(argv: &[&str], yield_ms: u64, tokens: u64) -> ExecCommandParams {
    ExecCommandParams {
        command: argv.iter().map(|s| s.to_string()).collect(),
        cwd: "/".into(),
        env: BTreeMap::from([("PATH".to_string(), "/usr/bin:/bin".to_string())]),
        tty: false,
        yield_time_ms: yield_ms,
        max_output_tokens: tokens,
        sandbox_permissions: None,
        additional_permissions: None,
        additional_permissions_preapproved: false,
        justification: None,
        exec_approval_requirement: None,
        env_base: Default::default(),
        limits: None,
    }
}

#[tokio::test]
async fn a_short_command_returns_its_exit_code_and_no_process_id() {
    let c = local_client().await;
    let r = c
        .call(&cmd(&["sh", "-c", "echo hi; exit 4"], 10_000, 1000))
        .await
        .unwrap();
    assert_eq!(r.output, "hi\n");
    assert_eq!(r.exit_code, Some(4));
    assert_eq!(r.process_id, None);
    assert!(!r.truncated);
    assert_eq!(r.original_token_count, 1);
}

#[tokio::test]
async fn a_long_command_yields_a_process_id_then_write_stdin_collects_the_rest() {
    let c = local_client().await;
    let r = c
        .call(&cmd(
            &[
                "sh",
                "-c",
                "echo first; read line; echo got:$line; sleep 0.3; echo last",
            ],
            300,
            1000,
        ))
        .await
        .unwrap();
    assert_eq!(r.output, "first\n");
    assert_eq!(r.exit_code, None);
    let id = r.process_id.expect("still running");
    // It is a process like any other (and pushes no notifications).
    assert!(c
        .call(&executor_protocol::types::process::ProcessListParams {})
        .await
        .unwrap()
        .processes
        .iter()
        .any(|p| p.process_id == id));
    let r = c
        .call(&WriteStdinParams {
            process_id: id.clone(),
            input: "abc\n".into(),
            yield_time_ms: 10_000,
            max_output_tokens: 1000,
        })
        .await
        .unwrap();
    assert_eq!(r.output, "got:abc\nlast\n");
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(r.process_id, None);
}

#[tokio::test]
async fn empty_input_is_a_plain_poll() {
    let c = local_client().await;
    let r = c
        .call(&cmd(&["sh", "-c", "sleep 0.3; echo done"], 50, 100))
        .await
        .unwrap();
    let id = r.process_id.unwrap();
    let r = c
        .call(&WriteStdinParams {
            process_id: id,
            input: String::new(),
            yield_time_ms: 5000,
            max_output_tokens: 100,
        })
        .await
        .unwrap();
    assert_eq!((r.output.as_str(), r.exit_code), ("done\n", Some(0)));
}

#[tokio::test]
async fn truncation_keeps_head_and_tail() {
    let c = local_client().await;
    let r = c
        .call(&cmd(&["seq", "1", "10000"], 10_000, 50))
        .await
        .unwrap();
    assert!(r.truncated);
    assert!(r.output.starts_with("1\n2\n3\n"), "{}", r.output);
    assert!(r.output.ends_with("9999\n10000\n"), "{}", r.output);
    assert!(r.output.contains("tokens truncated"));
    let full: usize = (1..=10000).map(|n: u32| n.to_string().len() + 1).sum();
    assert_eq!(r.original_token_count, (full as u64).div_ceil(4));
    assert!(r.output.len() < 400);
}

#[tokio::test]
async fn ctrl_c_input_interrupts_a_non_tty_process() {
    let c = local_client().await;
    let r = c
        .call(&cmd(
            &[
                "sh",
                "-c",
                "trap 'echo got-int; exit 7' INT; echo ready; while :; do sleep 0.05; done",
            ],
            300,
            100,
        ))
        .await
        .unwrap();
    assert_eq!(r.output, "ready\n");
    let r = c
        .call(&WriteStdinParams {
            process_id: r.process_id.unwrap(),
            input: "\u{3}".into(),
            yield_time_ms: 10_000,
            max_output_tokens: 100,
        })
        .await
        .unwrap();
    assert_eq!(r.output, "got-int\n");
    assert_eq!(r.exit_code, Some(7));
}

#[tokio::test]
async fn tools_list_advertises_both_tools_with_schemas() {
    let c = local_client().await;
    let tools = c
        .call(&executor_protocol::types::session::ToolsListParams {})
        .await
        .unwrap()
        .tools;
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, vec!["exec_command", "write_stdin"]);
    for t in &tools {
        let schema = &t.input_schema;
        assert_eq!(
            path(schema, "type").and_then(|v| v.as_str()),
            Some("object")
        );
        let required = path(schema, "required").and_then(|v| v.as_array()).unwrap();
        assert!(!required.is_empty());
    }
    let exec = &tools[0].input_schema;
    assert_eq!(
        path(exec, "properties.command.type").and_then(|v| v.as_str()),
        Some("array")
    );
}

/// An agent whose probe reports Landlock ABI `abi` (0: absent): the
/// documented test-only hook.
pub async fn agent_with_landlock_abi(abi: u32) -> executor_client::Client {
    let mut cmd = tokio::process::Command::new(executor_bin());
    cmd.env("EXECUTOR_TEST_LANDLOCK_ABI", abi.to_string());
    executor_client::Client::spawn(cmd, executor_client::ClientOptions::default())
        .await
        .unwrap()
}

#[tokio::test]
async fn a_sandbox_that_cannot_be_enforced_runs_nothing() {
    let c = agent_with_landlock_abi(0).await;
    assert!(!c.initialize_result().sandbox.enforceable);
    assert!(c
        .initialize_result()
        .sandbox
        .reason
        .as_deref()
        .unwrap_or("")
        .contains("Landlock"));
    let dir = std::env::temp_dir().join(format!("exec-sbx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let marker = dir.join("marker");
    let mut p = cmd(&["touch", marker.to_str().unwrap()], 5000, 100);
    p.sandbox_permissions = Some(Default::default());
    let e = c.call(&p).await.unwrap_err();
    assert_eq!(
        e.code(),
        Some(executor_client::ErrorCode::SandboxUnavailable)
    );
    assert!(!marker.exists(), "nothing ran");
    assert!(c
        .call(&executor_protocol::types::process::ProcessListParams {})
        .await
        .unwrap()
        .processes
        .is_empty());
    // Positive control: the same command without a sandbox runs.
    let r = c
        .call(&cmd(&["touch", marker.to_str().unwrap()], 5000, 100))
        .await
        .unwrap();
    assert_eq!(r.exit_code, Some(0));
    assert!(marker.exists());
}

#[tokio::test]
async fn a_missing_or_broken_sandbox_root_is_invalid_params_naming_it() {
    use executor_protocol::types::sandbox::{FilesystemIntent, SandboxIntent};
    let c = local_client().await;
    let d = unique_tempdir("badroot");
    let broken = d.join("broken");
    std::os::unix::fs::symlink(d.join("nowhere"), &broken).unwrap();
    let marker = d.join("marker");
    for root in [d.join("missing"), broken] {
        for required in [true, false] {
            let mut p = cmd(&["touch", marker.to_str().unwrap()], 5000, 100);
            p.sandbox_permissions = Some(SandboxIntent {
                filesystem: FilesystemIntent {
                    write: vec![d.to_str().unwrap().into(), root.to_str().unwrap().into()],
                    ..Default::default()
                },
                required,
                ..Default::default()
            });
            let e = c.call(&p).await.unwrap_err();
            let executor_client::Error::Remote(w) = e else {
                panic!()
            };
            assert_eq!(w.code, executor_client::ErrorCode::InvalidParams, "{w:?}");
            assert_eq!(
                w.data_get("field").and_then(|v| v.as_str()),
                Some("sandbox_permissions.filesystem.write.1")
            );
            assert!(w.message.contains(root.to_str().unwrap()), "{}", w.message);
        }
    }
    assert!(!marker.exists(), "nothing ran");
    assert!(c
        .call(&executor_protocol::types::process::ProcessListParams {})
        .await
        .unwrap()
        .processes
        .is_empty());
    // `required: false` on a host that cannot enforce: runs, and says
    // what was not enforced.
    let c = agent_with_landlock_abi(0).await;
    let mut p = cmd(&["true"], 5000, 100);
    p.sandbox_permissions = Some(SandboxIntent {
        required: false,
        ..Default::default()
    });
    let r = c.call(&p).await.unwrap();
    assert_eq!(r.exit_code, Some(0));
    assert!(r
        .sandbox_degraded
        .unwrap()
        .iter()
        .any(|d| d.starts_with("filesystem")));
}
