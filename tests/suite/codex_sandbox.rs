//! Codex's captured sandbox shapes (tests/fixtures/codex/, from `codex exec
//! --sandbox ...` of Codex 0.171.0) translated by
//! `executor_agent::codex::sandbox` and enforced by the real `executor`
//! binary natively: the read-only role stays read-only (a write is EROFS,
//! the job's read-only mount), workspace-write writes the workspace but not
//! its `.git` (EROFS, the carve-out's read-only bind) nor outside it and
//! /tmp (EROFS, the read-only mount), though it may write /tmp as Codex grants;
//! danger-full-access is unconfined; the agent's own fs requests under the
//! same shapes are `sandbox_denied` outside them. As root and as an
//! unprivileged user.

use executor_agent::codex::sandbox::{translate, Host, NetworkRequest};
use executor_client::{Client, ClientOptions};
use executor_protocol::types::exec::ExecCommandParams;
use executor_protocol::types::sandbox::SandboxIntent;
use executor_tests::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// The captured request's `sandbox`, its workspace (`/home/user/...`)
/// moved to `ws`.
fn captured(name: &str, ws: &Path) -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/codex")
        .join(format!("sandbox_{name}.json"));
    let text = std::fs::read_to_string(p)
        .unwrap()
        .replace("/home/user/workspace", ws.to_str().unwrap());
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["sandbox"].clone()
}

fn intent(name: &str, ws: &Path) -> Option<SandboxIntent> {
    translate(
        &captured(name, ws),
        NetworkRequest::default(),
        ws,
        Host::default(),
    )
    .expect("translates")
}

async fn sh(c: &Client, ws: &Path, i: Option<SandboxIntent>, script: &str) -> (String, i32) {
    let p = ExecCommandParams {
        command: vec!["/bin/sh".into(), "-c".into(), script.into()],
        cwd: wire_path(ws),
        env: path_env(),
        tty: false,
        yield_time_ms: 30_000,
        max_output_tokens: 100_000,
        sandbox_permissions: i,
        additional_permissions: None,
        additional_permissions_preapproved: false,
        justification: None,
        exec_approval_requirement: None,
        env_base: Default::default(),
    };
    let r = c.exec_command(&p).await.expect("exec_command");
    (r.output, r.exit_code.expect("finished"))
}

executor_tests::root_and_unprivileged!(
    captured_codex_sandboxes_are_enforced,
    |unprivileged: bool| async move {
        let base = unique_tempdir("codex-sbx");
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
        let ws = base.join("workspace");
        std::fs::create_dir_all(ws.join(".git")).unwrap();
        std::fs::write(ws.join("README"), "hello\n").unwrap();
        let (cmd, uid) = agent_command(unprivileged);
        if uid != current_uid() {
            chown_r(&base, uid);
        }
        let c = Client::spawn(cmd, ClientOptions::default())
            .await
            .expect("agent");

        // read-only: reads, but a write in the workspace is EROFS.
        let ro = intent("read_only.process_start", &ws);
        assert!(ro.is_some());
        let (out, code) = sh(&c, &ws, ro.clone(), "cat README").await;
        assert_eq!((out.as_str(), code), ("hello\n", 0), "positive control");
        let (out, code) = sh(&c, &ws, ro, "echo x > created.txt").await;
        assert_ne!(code, 0, "{out}");
        assert!(out.contains("Read-only file system"), "{out}");
        assert!(!ws.join("created.txt").exists());

        // workspace-write: the workspace is writable (positive control),
        // its .git and what is beside it are not.
        let ww = intent("workspace_write.process_start", &ws);
        let (out, code) = sh(&c, &ws, ww.clone(), "echo x > created.txt && echo ok").await;
        assert_eq!((out.as_str(), code), ("ok\n", 0));
        assert!(ws.join("created.txt").exists());
        let (out, code) = sh(&c, &ws, ww.clone(), "echo x > .git/config").await;
        assert_ne!(code, 0, "{out}");
        assert!(out.contains("Read-only file system"), "{out}");
        // Outside the workspace and /tmp (/var/tmp, writable by anyone
        // unconfined): the job's read-only mount (EROFS).
        let outside = format!("/var/tmp/codex-sandbox-test-{}", std::process::id());
        let (out, code) = sh(&c, &ws, ww.clone(), &format!("echo x > {outside}")).await;
        assert_ne!(code, 0, "{out}");
        assert!(out.contains("Read-only file system"), "{out}");
        assert!(!Path::new(&outside).exists());
        // /tmp (the host's, shared) is writable, as Codex grants it
        // (this workspace is in /tmp: its neighbour is too).
        let (out, code) = sh(
            &c,
            &ws,
            ww,
            &format!("echo x > {}/beside && echo ok", base.display()),
        )
        .await;
        assert_eq!((out.as_str(), code), ("ok\n", 0));
        std::fs::remove_file(base.join("beside")).unwrap();

        // The same shapes on the agent's own fs requests (`fs/writeFile`'s
        // captured sandbox): refused by the agent's confinement
        // (`sandbox_denied`), the workspace written (positive control).
        let fs_ww = c.with_sandbox(intent("workspace_write.fs_write_file", &ws));
        fs_ww
            .write_file(wire_path(&ws.join("patched.txt")), b"p\n")
            .await
            .expect("the workspace is writable");
        assert_eq!(std::fs::read(ws.join("patched.txt")).unwrap(), b"p\n");
        let outside = format!("/var/tmp/codex-sandbox-fs-{}", std::process::id());
        for denied in [ws.join(".git/config"), Path::new(&outside).to_path_buf()] {
            let e = remote(
                fs_ww
                    .write_file(wire_path(&denied), b"x")
                    .await
                    .unwrap_err(),
            );
            assert_eq!(
                e.code,
                executor_client::ErrorCode::SandboxDenied,
                "{denied:?}: {e}"
            );
        }
        assert!(!Path::new(&outside).exists());
        let fs_ro = c.with_sandbox(intent("read_only.process_start", &ws));
        assert_eq!(
            fs_ro
                .read_file(wire_path(&ws.join("README")))
                .await
                .unwrap(),
            b"hello\n"
        );
        let e = remote(
            fs_ro
                .write_file(wire_path(&ws.join("ro.txt")), b"x")
                .await
                .unwrap_err(),
        );
        assert_eq!(e.code, executor_client::ErrorCode::SandboxDenied, "{e}");
        assert!(!ws.join("ro.txt").exists());

        // danger-full-access: no intent, the write happens.
        let full = intent("danger_full_access.process_start", &ws);
        assert!(full.is_none());
        let (_, code) = sh(
            &c,
            &ws,
            full,
            &format!("echo x > {}/beside", base.display()),
        )
        .await;
        assert_eq!(code, 0);
        assert!(base.join("beside").exists());
    }
);
