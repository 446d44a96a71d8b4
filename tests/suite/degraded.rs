//! Old or locked-down kernels (issue 17): the agent runs under
//! `executor-test-deny`, a launcher of this crate that installs a seccomp
//! filter making a kernel interface fail as such a kernel does (Landlock
//! calls → ENOSYS; `clone`/`unshare` with `CLONE_NEWUSER` → EPERM), then
//! execs the real agent. The agent's own probe meets the failure; nothing
//! inside the agent knows about the test.

use executor_client::{Client, ClientOptions, ErrorCode};
use executor_protocol::types::exec::ExecCommandParams;
use executor_protocol::types::sandbox::SandboxIntent;
use executor_tests::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn launcher() -> PathBuf {
    executor_bin().with_file_name("executor-test-deny")
}

/// The real agent started under a filter denying `what`.
async fn agent_without(what: &str) -> Client {
    let mut cmd = tokio::process::Command::new(launcher());
    cmd.arg(what).arg("--").arg(executor_bin());
    Client::spawn(cmd, ClientOptions::default())
        .await
        .expect("the agent starts on a degraded kernel")
}

fn touch(marker: &Path, sandbox: Option<SandboxIntent>) -> ExecCommandParams {
    ExecCommandParams {
        command: vec!["touch".into(), marker.to_str().unwrap().into()],
        cwd: "/".into(),
        env: BTreeMap::from([("PATH".to_string(), "/usr/bin:/bin".to_string())]),
        tty: false,
        yield_time_ms: 5000,
        max_output_tokens: 100,
        sandbox_permissions: sandbox,
        additional_permissions: None,
        additional_permissions_preapproved: false,
        justification: None,
        exec_approval_requirement: None,
        env_base: Default::default(),
        limits: None,
    }
}

/// `initialize.sandbox` names what is missing (`expect`, each), a
/// `required` intent is refused with nothing spawned, a non-required one
/// runs degraded and says so, and an unsandboxed request is served.
async fn degrades_honestly(what: &str, expect: &[&str]) {
    let c = agent_without(what).await;
    let sb = &c.initialize_result().sandbox;
    assert!(!sb.enforceable, "{sb:?}");
    // Only the mechanisms of a job's limits, which every job gets.
    assert!(
        sb.mechanisms
            .iter()
            .all(|m| m.starts_with("cgroup_v") || m == "rlimit"),
        "{sb:?}"
    );
    let reason = sb.reason.as_deref().unwrap_or_default();
    for e in expect {
        assert!(reason.contains(e), "{e:?} not in the reason {reason:?}");
    }
    let dir = unique_tempdir(&format!("degraded-{what}"));
    let marker = dir.join("marker");
    // required (the default): refused, nothing spawned.
    let e = c
        .call(&touch(&marker, Some(SandboxIntent::default())))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::SandboxUnavailable), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("nothing was run"), "{msg}");
    assert!(
        msg.contains(expect[0]),
        "the refusal names the cause: {msg}"
    );
    assert!(!marker.exists(), "nothing ran");
    assert!(c
        .call(&executor_protocol::types::process::ProcessListParams {})
        .await
        .unwrap()
        .processes
        .is_empty());
    // Positive controls: unsandboxed, and explicitly not required.
    let r = c.call(&touch(&marker, None)).await.unwrap();
    assert_eq!(r.exit_code, Some(0));
    assert!(marker.exists());
    std::fs::remove_file(&marker).unwrap();
    let r = c
        .call(&touch(
            &marker,
            Some(SandboxIntent {
                required: false,
                ..Default::default()
            }),
        ))
        .await
        .unwrap();
    assert_eq!(r.exit_code, Some(0));
    assert!(marker.exists());
    let degraded = r.sandbox_degraded.unwrap_or_default().join("; ");
    assert!(degraded.contains(expect[0]), "{degraded}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn without_landlock_the_sandbox_is_refused_naming_landlock() {
    degrades_honestly(
        "landlock",
        &[
            "Landlock is not available",
            "landlock_create_ruleset answered ENOSYS",
        ],
    )
    .await;
}

#[tokio::test]
async fn without_user_namespaces_the_sandbox_is_refused_naming_them() {
    degrades_honestly(
        "userns",
        &[
            "user namespaces are not available",
            "clone(CLONE_NEWUSER) answered EPERM",
        ],
    )
    .await;
}

#[tokio::test]
async fn with_seccomp_only_both_missing_mechanisms_are_named() {
    degrades_honestly(
        "landlock,userns",
        &[
            "Landlock is not available",
            "user namespaces are not available",
        ],
    )
    .await;
}

/// The launcher itself: the filter really is in force on what it starts
/// (positive control for the tests above: without it they would test
/// nothing).
#[test]
fn the_launcher_filter_is_inherited() {
    let out = std::process::Command::new(launcher())
        .args(["userns", "--", "unshare", "--user", "true"])
        .output()
        .expect("run the launcher");
    assert!(
        !out.status.success(),
        "unshare --user succeeded under the filter"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Operation not permitted"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = std::process::Command::new("unshare")
        .args(["--user", "true"])
        .output()
        .expect("run unshare");
    assert!(
        out.status.success(),
        "without the filter, unshare --user works here"
    );
}

/// A script that connects to 127.0.0.1:`port` with Python (exit 0 when it
/// connected, 3 with the error when it could not).
fn connect_to(port: u16, sandbox: Option<SandboxIntent>) -> ExecCommandParams {
    let script = format!(
        "import socket,sys\ntry:\n socket.create_connection(('127.0.0.1',{port}),5).close()\n\
         except OSError as e:\n print('connect:',e); sys.exit(3)\n"
    );
    ExecCommandParams {
        command: vec!["python3".into(), "-c".into(), script],
        ..touch(Path::new("/"), sandbox)
    }
}

/// Connections accepted so far on `l` (non-blocking).
fn accepted(l: &std::net::TcpListener) -> usize {
    l.set_nonblocking(true).unwrap();
    std::iter::from_fn(|| l.accept().ok()).count()
}

/// `allow_hosts` with `required: false` where no network namespace can be
/// made (§8): the job runs, but with its network denied, never with the
/// host's; `sandbox_degraded` says exactly that. Positive controls: the
/// same connect works unsandboxed and under a degraded `network: "allow"`.
#[tokio::test]
async fn a_degraded_allow_hosts_intent_denies_the_network_instead_of_allowing_it() {
    use executor_protocol::types::sandbox::{EgressIntent, NetworkIntent};
    if std::process::Command::new("python3")
        .arg("-V")
        .output()
        .is_err()
    {
        prerequisite_missing("python3");
        return;
    }
    let c = agent_without("userns").await;
    assert!(!c.initialize_result().sandbox.enforceable);
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let hosts = |required| SandboxIntent {
        network: NetworkIntent::AllowHosts(EgressIntent {
            allow_hosts: vec![format!("127.0.0.1:{port}")],
            ask: false,
            ask_timeout_ms: 1000,
        }),
        required,
        ..Default::default()
    };
    // Positive control: the connect works where the network is allowed.
    let r = c.call(&connect_to(port, None)).await.unwrap();
    assert_eq!(r.exit_code, Some(0), "{}", r.output);
    assert_eq!(accepted(&l), 1);
    let allow = SandboxIntent {
        network: NetworkIntent::Allow,
        required: false,
        ..Default::default()
    };
    let r = c.call(&connect_to(port, Some(allow))).await.unwrap();
    assert_eq!(r.exit_code, Some(0), "{}", r.output);
    assert_eq!(accepted(&l), 1);
    // required (the default): refused, nothing run.
    let e = c
        .call(&connect_to(port, Some(hosts(true))))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::SandboxUnavailable), "{e}");
    // Not required: it runs, and cannot connect even to the allowed host.
    let r = c.call(&connect_to(port, Some(hosts(false)))).await.unwrap();
    assert_eq!(r.exit_code, Some(3), "{}", r.output);
    assert!(r.output.contains("Operation not permitted"), "{}", r.output);
    assert_eq!(accepted(&l), 0, "the degraded job reached the listener");
    let degraded = r.sandbox_degraded.unwrap_or_default();
    assert_eq!(degraded.len(), 2, "{degraded:?}");
    assert!(
        degraded[0].starts_with("filesystem: not enforced (")
            && degraded[0].contains("user namespaces are not available"),
        "{degraded:?}"
    );
    assert!(
        degraded[1].starts_with("network: allow_hosts not enforced (")
            && degraded[1].contains("network denied instead"),
        "{degraded:?}"
    );
    // The job itself ran (its filesystem is not confined: it is degraded,
    // not refused).
    let dir = unique_tempdir("degraded-egress");
    let marker = dir.join("marker");
    let r = c.call(&touch(&marker, Some(hosts(false)))).await.unwrap();
    assert_eq!(r.exit_code, Some(0), "{}", r.output);
    assert!(marker.exists());
    let _ = std::fs::remove_dir_all(&dir);
}
