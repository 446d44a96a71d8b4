//! The intent additions of issue 30 (docs/PROTOCOL.md §7), hostile cases
//! through the real `executor` binary, each with its positive control, as
//! root and as an unprivileged user: request-level `workspace_roots` (a
//! request only narrows a profile's), `:minimal` (the platform's read set),
//! `?ROOT` (a root that may be missing: skipped, never granted later) and
//! `:workspace_roots/SUBPATH` (plain names only, staying in the root).
//!
//! Layers: the agent's resolution (`invalid_params` / `policy_denied`
//! before anything runs), the job's mount namespace (ENOENT for what was
//! not granted, EROFS for a read-only root).

use super::*;
use executor_protocol::WireError;

/// `exec_command` of `script` under `i` in `cwd`: the refusal, or the
/// output and exit code.
async fn run_in(
    c: &Client,
    cwd: &Path,
    i: &SandboxIntent,
    script: &str,
) -> Result<(String, i32), WireError> {
    let p = exec_params(
        vec!["/bin/sh".into(), "-c".into(), script.into()],
        cwd,
        Some(i.clone()),
    );
    match c.call(&p).await {
        Ok(r) => Ok((r.output, r.exit_code.unwrap_or(-1))),
        Err(e) => Err(remote(e)),
    }
}

fn intent(read: Option<Vec<WirePath>>, write: Vec<WirePath>) -> SandboxIntent {
    SandboxIntent {
        filesystem: FilesystemIntent {
            read: read.map_or(ReadRoots::All, ReadRoots::Paths),
            write,
            ..Default::default()
        },
        ..Default::default()
    }
}

fn sym(s: &str) -> WirePath {
    s.into()
}

fn opt(p: &Path) -> WirePath {
    format!("?{}", p.display()).as_str().into()
}

use executor_protocol::WirePath;

fn field(e: &WireError) -> String {
    e.data_get("field")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_string()
}

// `:minimal` gives a job what it needs to run (a shell, /etc) and nothing
// else: the workspace's neighbours and the home directory are not there
// (ENOENT, the mount namespace). Not a write root.
both!(
    minimal_runs_a_shell_and_shows_nothing_else,
    |e: Env| async move {
        let i = intent(Some(vec![sym(":minimal")]), vec![wp(&e.ws)]);
        // Positive control: the shell runs, reads /etc, writes the workspace.
        let (out, code) = run_in(
            &e.c,
            &e.ws,
            &i,
            "cat /etc/passwd >/dev/null && echo ok > made && cat made",
        )
        .await
        .expect("runs");
        assert_eq!((out.as_str(), code), ("ok\n", 0));
        let (out, code) = run_in(
            &e.c,
            &e.ws,
            &i,
            &format!("cat {}/secret", e.outside.display()),
        )
        .await
        .unwrap();
        assert_ne!(code, 0);
        assert!(out.contains("No such file or directory"), "{out}");
        let e2 = run_in(&e.c, &e.ws, &intent(None, vec![sym(":minimal")]), "true")
            .await
            .unwrap_err();
        assert_eq!(field(&e2), "sandbox_permissions.filesystem.write.0", "{e2}");
    }
);

// A `?` root missing at the start is skipped: a job runs, and what appears
// at that name on the host while it runs (a symlink to a secret) is not in
// its root (ENOENT). Control: the same root present at the start is read.
// Without `?` the missing root is `invalid_params` and nothing runs.
both!(
    a_missing_ok_root_is_never_granted_later,
    |e: Env| async move {
        let later = e.base.join("later");
        let i = intent(Some(vec![sym(":minimal"), opt(&later)]), vec![wp(&e.ws)]);
        let script = format!(
            "while [ ! -e go ]; do sleep 0.02; done; cat {}/secret; echo rc=$?",
            later.display()
        );
        let (job, ()) = tokio::join!(run_in(&e.c, &e.ws, &i, &script), async {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            std::os::unix::fs::symlink(&e.outside, &later).unwrap();
            std::fs::write(e.ws.join("go"), "").unwrap();
        });
        let (out, code) = job.expect("runs");
        assert_eq!(code, 0, "{out}");
        assert!(
            out.contains("No such file or directory") && !out.contains("OUTSIDE-SECRET"),
            "{out}"
        );
        // Control: present at the start (the same link), it is granted.
        let (out, _) = run_in(&e.c, &e.ws, &i, &format!("cat {}/secret", later.display()))
            .await
            .unwrap();
        assert_eq!(out, "OUTSIDE-SECRET\n");
        // Without `?`: refused, naming the root, and nothing ran.
        std::fs::remove_file(&later).unwrap();
        let strict = intent(Some(vec![sym(":minimal"), wp(&later)]), vec![wp(&e.ws)]);
        let err = run_in(&e.c, &e.ws, &strict, "echo ran > ran")
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidParams, "{err}");
        assert_eq!(field(&err), "sandbox_permissions.filesystem.read.1");
        assert!(!e.ws.join("ran").exists());
        // An existing write root that is a symlink is refused, `?` or not.
        let err = run_in(
            &e.c,
            &e.ws,
            &intent(None, vec![opt(&e.ws.join("src/link-to-key"))]),
            "true",
        )
        .await
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidParams, "{err}");
    }
);

// `:workspace_roots/SUBPATH`: plain names only (`..`, `.`, empty refused,
// naming the entry, before anything runs); a subpath leaving its root
// through a symlink is refused. Control: a subpath is writable and the
// rest of the workspace, read-only, is EROFS.
both!(subpaths_stay_in_their_root, |e: Env| async move {
    std::os::unix::fs::symlink(&e.outside, e.ws.join("esc")).unwrap();
    let mut i = intent(
        Some(vec![sym(":minimal"), wp(&e.ws)]),
        vec![sym(":workspace_roots/src")],
    );
    i.workspace_roots = Some(vec![wp(&e.ws)]);
    let (out, code) = run_in(
        &e.c,
        &e.ws,
        &i,
        "echo a > src/new && cat src/new && echo b > top",
    )
    .await
    .unwrap();
    assert_ne!(code, 0);
    // stdout and stderr are two pipes: their order between them is the
    // scheduler's.
    assert!(
        out.lines().any(|l| l == "a") && out.contains("Read-only file system"),
        "{out}"
    );
    assert!(!e.ws.join("top").exists());
    for bad in [
        ":workspace_roots/../outside",
        ":workspace_roots/src/../../outside",
        ":workspace_roots/./src",
        ":workspace_roots//tmp",
        // Through the link `esc` to the outside directory: a write root
        // below it would be the outside `sub`.
        ":workspace_roots/esc/sub",
    ] {
        let mut i = i.clone();
        i.filesystem.write = vec![sym(bad)];
        let err = run_in(&e.c, &e.ws, &i, "echo ran > ran").await.unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidParams, "{bad}: {err}");
        assert_eq!(
            field(&err),
            "sandbox_permissions.filesystem.write.0",
            "{bad}: {err}"
        );
        assert!(!e.ws.join("ran").exists(), "{bad}");
    }
    // A read root through the link: refused as well (the outside secret
    // is not readable through the workspace's name for it).
    let mut r = i.clone();
    r.filesystem.read = ReadRoots::Paths(vec![sym(":minimal"), sym(":workspace_roots/esc")]);
    r.filesystem.write = vec![wp(&e.ws)];
    let err = run_in(&e.c, &e.ws, &r, "cat esc/secret").await.unwrap_err();
    assert_eq!(
        field(&err),
        "sandbox_permissions.filesystem.read.1",
        "{err}"
    );
    assert!(!e.outside.join("sub/ran").exists());
});

/// An agent whose profile `p` has `workspace_roots = [ws]` (readable by
/// the agent's user).
async fn with_profile_roots(e: &Env, unprivileged: bool) -> Client {
    let config = e.base.join("roots.toml");
    std::fs::write(
        &config,
        format!("[profiles.p]\nworkspace_roots = [\"{}\"]\n", e.ws.display()),
    )
    .unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (mut cmd, _) = agent_command(unprivileged);
    cmd.arg("--config").arg(&config).args(["--profile", "p"]);
    Client::spawn(cmd, ClientOptions::default())
        .await
        .expect("agent with a profile")
}

// A request's workspace roots only narrow the profile's: one outside them,
// directly or through a symlink inside the workspace, is `policy_denied`
// naming `workspace_roots.N`, and nothing runs. Control: one inside is
// what `:workspace_roots` means (writable there, read-only beside it).
async fn request_roots_narrow(e: Env, unprivileged: bool) {
    std::os::unix::fs::symlink(&e.outside, e.ws.join("esc")).unwrap();
    let c = with_profile_roots(&e, unprivileged).await;
    let mut i = intent(
        Some(vec![sym(":minimal"), wp(&e.ws)]),
        vec![sym(":workspace_roots")],
    );
    i.workspace_roots = Some(vec![wp(&e.ws.join("src"))]);
    let (out, code) = run_in(&c, &e.ws, &i, "echo a > src/n && cat src/n && echo b > top")
        .await
        .unwrap();
    assert_ne!(code, 0);
    // stdout and stderr are two pipes: their order between them is the
    // scheduler's.
    assert!(
        out.lines().any(|l| l == "a") && out.contains("Read-only file system"),
        "{out}"
    );
    for (roots, idx) in [
        (vec![wp(&e.ws.join("src")), wp(&e.outside)], 1),
        (vec![wp(&e.ws.join("esc"))], 0),
        (vec![sym("/")], 0),
    ] {
        let mut i = i.clone();
        i.workspace_roots = Some(roots);
        i.filesystem.read = ReadRoots::Paths(vec![sym(":minimal"), sym(":workspace_roots")]);
        i.filesystem.write = vec![wp(&e.ws.join("src"))];
        let err = run_in(&c, &e.ws, &i, "echo ran > ran").await.unwrap_err();
        assert_eq!(err.code, ErrorCode::PolicyDenied, "{err}");
        assert_eq!(
            field(&err),
            format!("sandbox_permissions.workspace_roots.{idx}")
        );
        assert!(!e.ws.join("ran").exists());
    }
    // Not absolute: invalid.
    let mut bad = i.clone();
    bad.workspace_roots = Some(vec![sym(":cwd")]);
    let err = run_in(&c, &e.ws, &bad, "true").await.unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidParams, "{err}");
    // Without profile roots, a request's own roots are what it says.
    let mut own = intent(
        Some(vec![sym(":minimal"), wp(&e.ws)]),
        vec![sym(":workspace_roots")],
    );
    own.workspace_roots = Some(vec![wp(&e.outside.join("sub"))]);
    let (out, code) = run_in(
        &e.c,
        &e.ws,
        &own,
        &format!("echo w > {}/sub/w && echo ok", e.outside.display()),
    )
    .await
    .unwrap();
    assert_eq!((out.as_str(), code), ("ok\n", 0));
}

mod request_workspace_roots_only_narrow_a_profile {
    use super::*;
    #[tokio::test]
    async fn as_root_or_self() {
        request_roots_narrow(env(false, None).await, false).await;
    }
    #[tokio::test]
    async fn as_unprivileged_user() {
        request_roots_narrow(env(true, None).await, true).await;
    }
}
