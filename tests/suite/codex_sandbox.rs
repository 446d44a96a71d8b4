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
        limits: None,
    };
    let r = c.call(&p).await.expect("exec_command");
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

/// The reference exec-server (`codex exec-server --listen stdio` of
/// @openai/codex 0.171.0), if installed.
fn reference_codex() -> Option<std::path::PathBuf> {
    let p = std::env::var_os("CODEX_REF_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/opt/codex-ref/node_modules/.bin/codex".into());
    p.is_file().then_some(p)
}

/// One NDJSON JSON-RPC connection to the reference server.
struct Reference {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    next: u64,
}

impl Reference {
    async fn start(bin: &Path, home: &Path) -> Reference {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new(bin)
            .args(["exec-server", "--listen", "stdio"])
            .env("CODEX_HOME", home)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("the reference exec-server");
        let stdin = child.stdin.take().unwrap();
        let lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let mut r = Reference {
            child,
            stdin,
            lines,
            next: 1,
        };
        r.call(
            "initialize",
            serde_json::json!({"clientName": "executor-tests"}),
        )
        .await
        .expect("initialize");
        r.send(serde_json::json!({"method": "initialized", "params": {}}))
            .await;
        r
    }

    async fn send(&mut self, v: serde_json::Value) {
        use tokio::io::AsyncWriteExt;
        let mut line = serde_json::to_vec(&v).unwrap();
        line.push(b'\n');
        self.stdin.write_all(&line).await.unwrap();
    }

    /// The result, or the error's (code, message).
    async fn call(
        &mut self,
        method: &str,
        params: serde_json::Value,
    ) -> Result<serde_json::Value, (i64, String)> {
        let id = self.next;
        self.next += 1;
        self.send(serde_json::json!({"id": id, "method": method, "params": params}))
            .await;
        loop {
            let line = tokio::time::timeout(WAIT, self.lines.next_line())
                .await
                .expect("an answer in time")
                .unwrap()
                .expect("the reference answered");
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            if v["id"] != serde_json::json!(id) {
                continue;
            }
            if let Some(e) = v.get("error") {
                return Err((
                    e["code"].as_i64().unwrap(),
                    e["message"].as_str().unwrap().to_string(),
                ));
            }
            return Ok(v["result"].clone());
        }
    }
}

/// Differential: the shapes the reference refuses, sent to the reference
/// itself, answer exactly as the translation's refusal (code and message);
/// the captured shapes (positive controls) are accepted by both.
#[tokio::test]
async fn bad_sandboxes_are_refused_in_the_references_words() {
    use serde_json::json;
    let Some(bin) = reference_codex() else {
        prerequisite_missing("the reference codex 0.171.0 (/opt/codex-ref)");
        return;
    };
    // A fresh CODEX_HOME outside /tmp.
    let home = executor_bin()
        .parent()
        .unwrap()
        .join(format!("codex-home-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    let ws = unique_tempdir("codex-ref-sbx");
    let mut r = Reference::start(&bin, &home).await;
    let uri = format!("file://{}", ws.display());
    let sandbox = |entries: serde_json::Value| {
        json!({"permissions": {"type": "managed",
                               "file_system": {"type": "restricted", "entries": entries},
                               "network": "enabled"},
               "cwd": uri, "workspaceRoots": [uri],
               "windowsSandboxLevel": "disabled", "useLegacyLandlock": false})
    };
    let root_read =
        json!({"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"});
    let proxy = |domains: serde_json::Value, mode: &str| {
        json!({"proxy": {"enabled": true, "enableSocks5": false, "enableSocks5Udp": false,
                         "allowUpstreamProxy": false, "dangerouslyAllowAllUnixSockets": false,
                         "mode": mode, "domains": domains, "unixSockets": null,
                         "allowLocalBinding": false}})
    };
    let refused: Vec<(serde_json::Value, Option<serde_json::Value>)> = vec![
        (
            sandbox(
                json!([{"path": {"type": "special", "value": {"kind": "root"}}, "access": "bogus"}]),
            ),
            None,
        ),
        (
            sandbox(
                json!([{"path": {"type": "special", "value": {"kind": "weird"}}, "access": "read"}]),
            ),
            None,
        ),
        (json!({"permissions": {"type": "weird"}, "cwd": uri}), None),
        (
            sandbox(
                json!([root_read.clone(), {"path": {"type": "path", "path": format!("{uri}/x")}, "access": "write", "missing_path_behavior": "bogus"}]),
            ),
            None,
        ),
        (
            sandbox(
                json!([root_read.clone(), {"path": {"type": "path", "path": "relative/x"}, "access": "write"}]),
            ),
            None,
        ),
        (
            sandbox(json!([root_read.clone()])),
            Some(proxy(json!([{"pattern": "x"}]), "full")),
        ),
        (
            sandbox(json!([root_read.clone()])),
            Some(proxy(json!({"x.test": "maybe"}), "full")),
        ),
        (
            sandbox(json!([root_read.clone()])),
            Some(proxy(json!({"x.test": "allow"}), "weird")),
        ),
        (
            sandbox(json!([root_read.clone()])),
            Some(json!({"proxy": {"enabled": true}})),
        ),
    ];
    for (i, (sb, px)) in refused.iter().enumerate() {
        let mut params = json!({"processId": format!("bad-{i}"), "argv": ["/bin/true"],
                                "cwd": uri, "env": {}, "tty": false, "pipeStdin": false,
                                "arg0": null, "sandbox": sb, "enforceManagedNetwork": px.is_some(),
                                "managedNetwork": null});
        if let Some(px) = px {
            params["networkProxy"] = px.clone();
        }
        let theirs = r.call("process/start", params).await.unwrap_err();
        let ours = translate(
            sb,
            NetworkRequest {
                enforce_managed: px.is_some(),
                proxy: px.as_ref(),
                managed: None,
            },
            &ws,
            Host::default(),
        )
        .unwrap_err();
        assert_eq!(
            (ours.code(), ours.message.clone()),
            theirs,
            "case {i}: {sb}"
        );
    }
    // Positive controls: the captured shapes start on the reference and
    // translate.
    for (i, name) in ["read_only.process_start", "workspace_write.process_start"]
        .iter()
        .enumerate()
    {
        let sb = captured(name, &ws);
        let params = json!({"processId": format!("good-{i}"), "argv": ["/bin/true"],
                            "cwd": uri, "env": {}, "tty": false, "pipeStdin": false,
                            "arg0": null, "sandbox": sb, "enforceManagedNetwork": false,
                            "managedNetwork": null});
        let ok = r.call("process/start", params).await;
        assert!(ok.is_ok(), "{name}: {ok:?}");
        assert!(translate(&sb, NetworkRequest::default(), &ws, Host::default()).is_ok());
    }
    let _ = r.child.start_kill();
    let _ = std::fs::remove_dir_all(&home);
}

// `enforceManagedNetwork` without a proxy the translation can express
// fails closed: the job of the captured network-enabled shape cannot reach
// a listener on the host's loopback (EPERM: seccomp refuses the IP socket
// of `network: "deny"`). Control: the same shape unmanaged reaches it.
executor_tests::root_and_unprivileged!(
    managed_network_without_a_proxy_is_no_network,
    |unprivileged: bool| async move {
        let base = unique_tempdir("codex-net");
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
        let ws = base.join("workspace");
        std::fs::create_dir_all(&ws).unwrap();
        let (cmd, uid) = agent_command(unprivileged);
        if uid != current_uid() {
            chown_r(&base, uid);
        }
        let c = Client::spawn(cmd, ClientOptions::default())
            .await
            .expect("agent");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for s in listener.incoming() {
                drop(s);
            }
        });
        let sb = captured("workspace_write_network.process_start", &ws);
        let script = format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo CONNECTED");
        let bash = |i: Option<SandboxIntent>| {
            let c = &c;
            let ws = &ws;
            let script = script.clone();
            async move {
                let p = ExecCommandParams {
                    command: vec!["/bin/bash".into(), "-c".into(), script],
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
                    limits: None,
                };
                let r = c.call(&p).await.expect("exec_command");
                (r.output, r.exit_code.expect("finished"))
            }
        };
        let open = translate(&sb, NetworkRequest::default(), &ws, Host::default()).unwrap();
        let (out, code) = bash(open).await;
        assert_eq!((out.as_str(), code), ("CONNECTED\n", 0), "positive control");
        let managed = NetworkRequest {
            enforce_managed: true,
            ..Default::default()
        };
        let closed = translate(&sb, managed, &ws, Host::default()).unwrap();
        let (out, code) = bash(closed).await;
        assert_ne!(code, 0, "{out}");
        // EPERM: seccomp refuses the IP socket itself.
        assert!(
            !out.contains("CONNECTED") && out.contains("socket: Operation not permitted"),
            "{out}"
        );
    }
);

// Through the dialect, end to end: `.git`, `.agents` and `.codex` stay
// read-only under every writable root of a Codex sandbox (a project root
// and a `path` entry), existing or not, and cannot be moved away (the
// carve-outs' read-only binds and pinned ancestors); what else the roots
// hold is writable (positive control). The shared /tmp gets none.
executor_tests::root_and_unprivileged!(
    protected_metadata_under_every_writable_root,
    |unprivileged: bool| async move {
        use serde_json::json;
        let base = unique_tempdir("codex-meta");
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
        let (ws, extra) = (base.join("ws"), base.join("extra"));
        std::fs::create_dir_all(&ws).unwrap();
        // A file granted by itself: writable, nothing to carve below it.
        let one = base.join("one.txt");
        std::fs::write(&one, "old\n").unwrap();
        std::fs::create_dir_all(extra.join(".git/hooks")).unwrap();
        let (mut s, uid) = crate::codex_dialect::Server::start_as(unprivileged);
        if uid != current_uid() {
            chown_r(&base, uid);
        }
        s.handshake(None);
        let uri = |p: &Path| format!("file://{}", p.display());
        let sandbox = json!({
            "permissions": {"type": "managed", "network": "restricted",
                "file_system": {"type": "restricted", "entries": [
                    {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
                    {"path": {"type": "special", "value": {"kind": "project_roots"}}, "access": "write"},
                    {"path": {"type": "path", "path": uri(&extra)}, "access": "write"},
                    {"path": {"type": "path", "path": uri(&one)}, "access": "write"},
                    {"path": {"type": "special", "value": {"kind": "slash_tmp"}}, "access": "write"}]}},
            "cwd": uri(&ws), "workspaceRoots": [uri(&ws)],
            "windowsSandboxLevel": "disabled", "useLegacyLandlock": false});
        let mut id = 10;
        let mut run = |script: &str| {
            id += 1;
            s.sh(id, &ws, &sandbox, script)
        };
        let e = extra.display();
        for denied in [
            format!("echo x > {e}/.git/hooks/pre-commit"),
            format!("echo x > {e}/.git/config"),
            format!("mv {e}/.git {e}/git-old"),
            format!("mkdir {e}/.codex"),
            format!("mkdir -p {e}/.agents/skills && touch {e}/.agents/skills/x"),
            "mkdir .git && touch .git/config".into(),
            "mkdir -p .codex && echo x > .codex/config.toml".into(),
            "touch .agents".into(),
        ] {
            let (out, code) = run(&denied);
            assert_ne!(code, 0, "{denied}: {out}");
        }
        assert!(!extra.join(".git/hooks/pre-commit").exists());
        assert!(!extra.join(".git/config").exists() && extra.join(".git").is_dir());
        for name in [".codex", ".agents"] {
            assert!(!extra.join(name).exists(), "{name} left in extra");
        }
        for name in [".git", ".codex", ".agents"] {
            assert!(!ws.join(name).exists(), "{name} left in the workspace");
        }
        // Positive control: the roots are writable, other dot names too,
        // and the file granted by itself.
        let (out, code) = run(&format!(
            "echo x > {e}/file && mkdir {e}/.codex2 && echo x > made && mkdir .github \
             && echo new > {} && echo ok",
            one.display()
        ));
        assert_eq!((out.as_str(), code), ("ok\n", 0));
        assert_eq!(std::fs::read_to_string(&one).unwrap(), "new\n");
        // The shared /tmp keeps no placeholders and gets no carve-outs: a
        // planted /tmp/.codex of anyone's is no concern of the job's.
        let tmp_meta = Path::new("/tmp/.codex");
        if !tmp_meta.exists() {
            let (out, code) = run(
                "ls -lad /tmp/.codex /tmp/.codex/* 2>&1; grep -w tmp /proc/self/mountinfo; true",
            );
            assert!(out.contains("No such file"), "{out} ({code})");
        }
        // The agent's own writes under the same sandbox: a file of a
        // root (positive control), not a protected name.
        let r = s.request(
            90,
            "fs/writeFile",
            json!({"path": uri(&extra.join("file2")), "dataBase64": "bmV3ZXIK", "sandbox": sandbox}),
        );
        assert!(r.get("result").is_some(), "{r}");
        assert_eq!(
            std::fs::read_to_string(extra.join("file2")).unwrap(),
            "newer\n"
        );
        let r = s.request(
            91,
            "fs/writeFile",
            json!({"path": uri(&extra.join(".git/config")), "dataBase64": "eAo=", "sandbox": sandbox}),
        );
        assert!(r.get("error").is_some(), "{r}");
        assert!(!extra.join(".git/config").exists());
        drop(s);
        std::fs::remove_dir_all(&base).unwrap();
    }
);

// A `.git` file names the repository elsewhere (`--separate-git-dir`, a
// worktree, a submodule): through the dialect, that repository's config
// and hooks, and a worktree's common directory, stay read-only when the
// root with the `.git` file is writable, even when the repository lies in
// another writable root (the carve-out's read-only bind). Found by attack:
// a job wrote `core.fsmonitor` into the separate git dir, and the host's
// next `git status` ran it. Positive control: the work tree is writable.
executor_tests::root_and_unprivileged!(
    a_git_file_protects_the_repository_it_names,
    |unprivileged: bool| async move {
        use serde_json::json;
        let base = unique_tempdir("codex-gitfile");
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
        let git = |args: &[&str]| {
            let st = std::process::Command::new("git")
                .args(args)
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .env("HOME", &base)
                .output()
                .expect("git");
            assert!(st.status.success(), "git {args:?}: {st:?}");
        };
        // A separate git dir inside the same writable parent.
        let solo = base.join("solo");
        let real = base.join("solo-git");
        git(&[
            "init",
            "-q",
            "--separate-git-dir",
            real.to_str().unwrap(),
            solo.to_str().unwrap(),
        ]);
        // A worktree whose main repository is writable too.
        let main = base.join("main");
        git(&["init", "-q", main.to_str().unwrap()]);
        git(&[
            "-C",
            main.to_str().unwrap(),
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "x",
        ]);
        let wt = base.join("wt");
        git(&[
            "-C",
            main.to_str().unwrap(),
            "worktree",
            "add",
            "-q",
            wt.to_str().unwrap(),
        ]);
        let (mut s, uid) = crate::codex_dialect::Server::start_as(unprivileged);
        if uid != current_uid() {
            chown_r(&base, uid);
        }
        s.handshake(None);
        let uri = |p: &Path| format!("file://{}", p.display());
        let sandbox = |ws: &Path| {
            json!({
            "permissions": {"type": "managed", "network": "restricted",
                "file_system": {"type": "restricted", "entries": [
                    {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
                    {"path": {"type": "special", "value": {"kind": "project_roots"}}, "access": "write"},
                    {"path": {"type": "path", "path": uri(&base)}, "access": "write"}]}},
            "cwd": uri(ws), "workspaceRoots": [uri(ws)],
            "windowsSandboxLevel": "disabled", "useLegacyLandlock": false})
        };
        let mut id = 10;
        let mut run = |ws: &Path, script: &str| {
            id += 1;
            s.sh(id, ws, &sandbox(ws), script)
        };
        let cfg = |d: &Path| std::fs::read_to_string(d.join("config")).unwrap();
        let before = (cfg(&real), cfg(&main.join(".git")));
        for (ws, script) in [
            (
                &solo,
                format!(
                    "printf '[core]\\n\\tfsmonitor = touch {}/PWNED\\n' >> {}/config",
                    base.display(),
                    real.display()
                ),
            ),
            (
                &solo,
                format!(
                    "mkdir -p {0}/hooks && echo 'touch {1}/PWNED' > {0}/hooks/pre-commit",
                    real.display(),
                    base.display()
                ),
            ),
            (&wt, format!("echo x >> {}/.git/config", main.display())),
            (
                &wt,
                format!(
                    "echo /tmp/evil > {}/.git/worktrees/wt/commondir",
                    main.display()
                ),
            ),
        ] {
            let (out, code) = run(ws, &script);
            assert_ne!(code, 0, "{script}: {out}");
        }
        assert_eq!((cfg(&real), cfg(&main.join(".git"))), before);
        assert!(!real.join("hooks/pre-commit").exists());
        assert!(!base.join("PWNED").exists());
        // Positive control: the work trees themselves are writable.
        let (out, code) = run(&solo, "echo x > file && echo ok");
        assert_eq!((out.as_str(), code), ("ok\n", 0));
        let (out, code) = run(&wt, "echo x > file && echo ok");
        assert_eq!((out.as_str(), code), ("ok\n", 0));
        drop(s);
        std::fs::remove_dir_all(&base).unwrap();
    }
);
