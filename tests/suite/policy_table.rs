//! The protocol's method table as the agent enforces and records it
//! (issue 29, items 1, 4 and 5), checked by observing the host:
//! - under a `read_only` profile every method of the table, sent with
//!   valid params, changes nothing on the host (no entry, content, mode or
//!   link target changes, no process runs, nothing reaches the network),
//!   and the same sweep without the profile does change it (the control);
//! - a profile's roots never depend on a request's `cwd`: a profile whose
//!   intent needs one is refused at start (exit 78 naming the key), and
//!   two requests with different `cwd` get the same roots;
//! - the audit line comes from what the agent validated and did, never
//!   from keys a request adds; an unknown key in a request that can run
//!   code or change the host is `invalid_params` naming the key.
//!
//! Each case runs with the agent as root and as an unprivileged user.

use executor_protocol::methods::{self as m, ALL_REQUESTS};
use executor_tests::root_and_unprivileged as both;
use executor_tests::*;
use rmpv::Value;
use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use executor_tests::msgpack_map as map;

fn s(p: &Path) -> Value {
    Value::from(p.to_str().unwrap())
}

fn env_map() -> Value {
    map(&[("PATH", "/usr/bin:/bin".into())])
}

fn sh(script: &str) -> Value {
    Value::Array(vec!["/bin/sh".into(), "-c".into(), script.into()])
}

/// A base directory (owned by `uid`) holding `ws/` with a file, a
/// subdirectory, a symlink and a file only its owner may read.
fn tree(tag: &str, uid: u32) -> (PathBuf, PathBuf) {
    let base = unique_tempdir(tag);
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
    let ws = base.join("ws");
    std::fs::create_dir_all(ws.join("sub")).unwrap();
    std::fs::write(ws.join("f.txt"), "original\n").unwrap();
    std::fs::write(ws.join("sub/g.txt"), "in sub\n").unwrap();
    std::fs::write(ws.join("sub/h.txt"), "to rename\n").unwrap();
    std::fs::write(ws.join("private"), "owner only\n").unwrap();
    std::fs::set_permissions(ws.join("private"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::symlink("f.txt", ws.join("link")).unwrap();
    if uid != current_uid() {
        chown_r(&base, uid);
    }
    (base, ws)
}

/// Every entry below `root`: its kind, mode, owner, size, content or link
/// target (symlinks never followed).
fn snapshot(root: &Path) -> BTreeMap<PathBuf, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, String>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for p in entries {
            let md = std::fs::symlink_metadata(&p).unwrap();
            let ft = md.file_type();
            let what = if ft.is_symlink() {
                format!("link -> {:?}", std::fs::read_link(&p).unwrap())
            } else if ft.is_dir() {
                walk(root, &p, out);
                "dir".to_string()
            } else if ft.is_file() {
                format!("file {:?}", std::fs::read(&p).unwrap())
            } else {
                "other".to_string()
            };
            out.insert(
                p.strip_prefix(root).unwrap().to_path_buf(),
                format!(
                    "{what} mode {:o} owner {}:{}",
                    md.mode(),
                    md.uid(),
                    md.gid()
                ),
            );
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// What the sweep has learnt from earlier answers (a read handle, a write
/// handle, a read stream).
#[derive(Default)]
struct Held {
    handle: u64,
    write_handle: u64,
    stream: u64,
}

/// Valid params for `method`: paths in `ws`, scripts that would create a
/// file in `base`, HTTP to `url`. A method of the table without params
/// here fails the sweep (a new method must be swept too).
fn valid_params(method: &str, base: &Path, ws: &Path, url: &str, h: &Held) -> Value {
    let marker = |what: &str| format!("touch {}", base.join(format!("ran-{what}")).display());
    match method {
        m::ENVIRONMENT_INFO | m::TOOLS_LIST | m::PROCESS_LIST => map(&[]),
        m::PROCESS_START => map(&[
            ("argv", sh(&marker("process-start"))),
            ("cwd", s(ws)),
            ("env", env_map()),
        ]),
        m::PROCESS_READ => map(&[("process_id", "p-1".into()), ("wait_ms", 0.into())]),
        m::PROCESS_WRITE => map(&[
            ("process_id", "p-1".into()),
            ("data", Value::Binary(marker("stdin").into_bytes())),
        ]),
        m::PROCESS_SIGNAL => map(&[("process_id", "p-1".into()), ("signal", "kill".into())]),
        m::PROCESS_RESIZE => map(&[
            ("process_id", "p-1".into()),
            ("rows", 10.into()),
            ("cols", 10.into()),
        ]),
        m::EXEC_COMMAND => map(&[
            ("command", sh(&marker("exec"))),
            ("cwd", s(ws)),
            ("env", env_map()),
            ("yield_time_ms", 5000.into()),
        ]),
        m::WRITE_STDIN => map(&[
            ("process_id", "p-1".into()),
            ("input", format!("{}\n", marker("write-stdin")).into()),
        ]),
        m::FS_STAT | m::FS_CANONICALIZE | m::FS_READ_FILE | m::FS_OPEN => {
            map(&[("path", s(&ws.join("f.txt")))])
        }
        m::FS_READ_LINK => map(&[("path", s(&ws.join("link")))]),
        m::FS_WALK => map(&[("root", s(ws))]),
        m::FS_WRITE_FILE => map(&[
            ("path", s(&ws.join("f.txt"))),
            ("data", Value::Binary(b"overwritten".to_vec())),
        ]),
        m::FS_CREATE_DIRECTORY => map(&[("path", s(&ws.join("newdir")))]),
        m::FS_REMOVE => map(&[("path", s(&ws.join("sub/g.txt")))]),
        m::FS_RENAME => map(&[
            ("from", s(&ws.join("sub/h.txt"))),
            ("to", s(&ws.join("renamed"))),
        ]),
        m::FS_CREATE_SYMLINK => map(&[
            ("path", s(&ws.join("planted-link"))),
            ("target", "/etc/shadow".into()),
        ]),
        m::FS_COPY => map(&[
            ("source", s(&ws.join("f.txt"))),
            ("destination", s(&ws.join("copied"))),
        ]),
        m::FS_READ_BLOCK => map(&[
            ("handle", h.handle.into()),
            ("offset", 0.into()),
            ("length", 4.into()),
        ]),
        m::FS_READ_STREAM => map(&[
            ("path", s(&ws.join("f.txt"))),
            ("block_bytes", 4096.into()),
            ("credit_bytes", 65536.into()),
        ]),
        m::FS_READ_CREDIT => map(&[("stream_id", h.stream.into()), ("bytes", 1.into())]),
        m::FS_READ_CANCEL => map(&[("stream_id", h.stream.into())]),
        m::FS_OPEN_WRITE => map(&[("path", s(&ws.join("written")))]),
        m::FS_WRITE_BLOCK => map(&[
            ("handle", h.write_handle.into()),
            ("offset", 0.into()),
            ("data", Value::Binary(b"block".to_vec())),
        ]),
        m::FS_COMMIT => map(&[("handle", h.write_handle.into())]),
        m::FS_CLOSE | m::FS_PASS_DESCRIPTOR => map(&[("handle", h.handle.into())]),
        m::HTTP_REQUEST => map(&[
            ("method", "POST".into()),
            ("url", url.into()),
            ("timeout_ms", 1000.into()),
        ]),
        m::HTTP_CANCEL => map(&[("stream_id", 1.into())]),
        other => panic!("the sweep has no params for {other}: add them"),
    }
}

/// The uid the agent runs as: 65534 for the unprivileged run as root,
/// else the current user.
fn agent_uid(unprivileged: bool) -> u32 {
    if unprivileged && current_uid() == 0 {
        65534
    } else {
        current_uid()
    }
}

/// A config in `base` that writes the audit log to `base/audit.jsonl`:
/// (the log, the config).
fn audit_config(base: &Path) -> (PathBuf, PathBuf) {
    let log = base.join("audit.jsonl");
    let config = write_config(
        base,
        &format!("[audit]\nfile = {:?}\n", log.to_str().unwrap()),
    );
    (log, config)
}

/// An agent (as root or as uid 65534) with `--config config` and
/// `--profile`, initialized.
async fn agent(unprivileged: bool, config: &Path, profile: Option<&str>) -> (RawAgent, String) {
    let (mut cmd, _) = agent_command(unprivileged);
    cmd.arg("--config").arg(config).current_dir("/");
    if let Some(p) = profile {
        cmd.args(["--profile", p]);
    }
    let mut a = RawAgent::spawn_command(cmd).await;
    let r = a.request(0, m::INITIALIZE, &init_params()).await;
    let session = path(&r, "result.session_id")
        .and_then(|v| v.as_str())
        .unwrap_or_else(|| panic!("initialize failed: {r:?}"))
        .to_string();
    (a, session)
}

fn write_config(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("config.toml");
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    p
}

/// Send every method of the table in its order; the answers by method.
async fn sweep(a: &mut RawAgent, base: &Path, ws: &Path, url: &str) -> BTreeMap<String, Value> {
    let mut held = Held::default();
    let mut answers = BTreeMap::new();
    for (i, method) in ALL_REQUESTS.iter().enumerate() {
        let params = valid_params(method, base, ws, url, &held);
        let r = a.request(100 + i as u64, method, &params).await;
        let num = |k: &str| path(&r, k).and_then(|v| v.as_u64());
        match *method {
            m::FS_OPEN => held.handle = num("result.handle").unwrap_or(0),
            m::FS_OPEN_WRITE => held.write_handle = num("result.handle").unwrap_or(0),
            m::FS_READ_STREAM => held.stream = num("result.stream_id").unwrap_or(0),
            _ => {}
        }
        answers.insert(method.to_string(), r);
    }
    answers
}

/// A listener that counts the connections made to it.
fn listener() -> (std::net::TcpListener, String) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let url = format!("http://{}/hit", l.local_addr().unwrap());
    (l, url)
}

fn reached(l: &std::net::TcpListener) -> bool {
    l.accept().is_ok()
}

// Issue 29.1: a `read_only` key planted `ws/planted-link -> /etc/shadow`
// with fs/createSymlink, absent from a hand-kept deny-list. The sweep sends
// every method of the table with valid params (a new method without params
// fails it) and compares the whole tree, the markers a process would make,
// and the listener an HTTP request would reach. Layer: agent policy (the
// profile gate, from the method table).
both!(
    read_only_changes_nothing_on_the_host,
    |unprivileged: bool| async move {
        let uid = agent_uid(unprivileged);
        // Control: without read_only the same sweep changes the host.
        {
            let (base, ws) = tree("ro-control", uid);
            let config = write_config(&base, "[profiles.rw]\n");
            let (l, url) = listener();
            let before = snapshot(&base);
            let (mut a, _) = agent(unprivileged, &config, Some("rw")).await;
            sweep(&mut a, &base, &ws, &url).await;
            a.close_and_wait().await;
            // process/start's marker is made by a job that may end after the sweep.
            for _ in 0..100 {
                if base.join("ran-process-start").exists() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let after = snapshot(&base);
            assert_ne!(
                before, after,
                "control: the sweep changes nothing even without read_only"
            );
            for made in [
                "ws/planted-link",
                "ran-process-start",
                "ran-exec",
                "ws/newdir",
                "ws/renamed",
                "ws/copied",
            ] {
                assert!(
                    after.contains_key(Path::new(made)),
                    "control: {made} not made: {after:#?}"
                );
            }
            assert!(
                reached(&l),
                "control: http/request did not reach the listener"
            );
        }
        let (base, ws) = tree("ro", uid);
        let config = write_config(&base, "[profiles.ro]\nread_only = true\n");
        let (l, url) = listener();
        let before = snapshot(&base);
        let (mut a, _) = agent(unprivileged, &config, Some("ro")).await;
        let answers = sweep(&mut a, &base, &ws, &url).await;
        // The connection survives the refusals.
        let r = a
            .request(9, m::FS_READ_FILE, &map(&[("path", s(&ws.join("f.txt")))]))
            .await;
        assert!(get(&r, "result").is_some(), "{r:?}");
        a.close_and_wait().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let after = snapshot(&base);
        let changed: Vec<_> = after
            .iter()
            .filter(|(k, v)| before.get(*k) != Some(v))
            .map(|(k, v)| format!("{}: {v}", k.display()))
            .chain(
                before
                    .keys()
                    .filter(|k| !after.contains_key(*k))
                    .map(|k| format!("{}: removed", k.display())),
            )
            .collect();
        assert!(
        changed.is_empty(),
        "agent policy (read_only): the host changed under a read_only profile: {changed:#?}\nanswers: {answers:#?}"
    );
        assert!(
            !reached(&l),
            "agent policy (read_only): http/request reached the network"
        );
        read_only_answers_name_the_method_and_the_rule(&answers);
    }
);

/// Each method the table does not mark read-only is `policy_denied` naming
/// the method and the rule; each read-only one is not refused by policy.
fn read_only_answers_name_the_method_and_the_rule(answers: &BTreeMap<String, Value>) {
    for (method, r) in answers {
        let refused = error_code(r) == Some("policy_denied");
        let read_only = m::facts(method).expect("in the table").is_read_only();
        assert_eq!(refused, !read_only, "{method}: {r:?}");
        if refused {
            let msg = path(r, "error.message")
                .and_then(|v| v.as_str())
                .unwrap_or("");
            assert!(
                msg.contains(method.as_str()) && msg.contains("read_only"),
                "{method}: {msg}"
            );
            assert_eq!(
                path(r, "error.data.method").and_then(|v| v.as_str()),
                Some(method.as_str())
            );
        }
    }
}

// Issue 29.1, the decision on http/request: it touches the network, so a
// read_only profile refuses it unless `methods.allow` names it; named, it
// runs (the control).
both!(
    read_only_allows_a_network_method_only_by_name,
    |unprivileged: bool| async move {
        let uid = agent_uid(unprivileged);
        let (base, _) = tree("ro-http", uid);
        let config = write_config(
        &base,
        "[profiles.ro]\nread_only = true\n\n[profiles.ro_http]\nread_only = true\nmethods.allow = [\"http/request\", \"fs/*\"]\n",
    );
        let (l, url) = listener();
        let req = map(&[
            ("method", "GET".into()),
            ("url", url.clone().into()),
            ("timeout_ms", 500.into()),
        ]);
        let (mut a, _) = agent(unprivileged, &config, Some("ro")).await;
        let r = a.request(1, m::HTTP_REQUEST, &req).await;
        assert_eq!(error_code(&r), Some("policy_denied"), "{r:?}");
        a.close_and_wait().await;
        assert!(
            !reached(&l),
            "agent policy (read_only): http/request reached the listener"
        );
        let (mut a, _) = agent(unprivileged, &config, Some("ro_http")).await;
        let r = a.request(1, m::HTTP_REQUEST, &req).await;
        assert_ne!(
            error_code(&r),
            Some("policy_denied"),
            "named in methods.allow: {r:?}"
        );
        assert!(
            reached(&l),
            "named in methods.allow: http/request did not reach the listener"
        );
        a.close_and_wait().await;
    }
);

/// `executor --config CONFIG --profile p`'s exit status and stderr.
async fn start_status(unprivileged: bool, config: &Path) -> (Option<i32>, String) {
    let (mut cmd, _) = agent_command(unprivileged);
    cmd.arg("--config")
        .arg(config)
        .args(["--profile", "p"])
        .current_dir("/");
    cmd.stdin(std::process::Stdio::null());
    let out = tokio::time::timeout(WAIT, cmd.output())
        .await
        .unwrap()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

// Issue 29.4: a profile intent with `:cwd`, or `:workspace_roots` without
// `workspace_roots`, took its roots from the request's cwd, so the client
// chose the write root the profile imposes. Such a profile is refused at
// start (exit 78 naming the key); variants: `:cwd` in a carve-out (the
// client would move the carve-out away) and in `read`. Layer: agent
// configuration.
both!(
    a_profile_whose_roots_need_a_request_cwd_is_refused_at_start,
    |unprivileged: bool| async move {
        let dir = unique_tempdir("profile-cwd");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        for (intent, key) in [
            (
                "filesystem = { write = [\":cwd\"] }",
                "profiles.p.sandbox.filesystem.write[0]",
            ),
            (
                "filesystem = { write = [\"/srv\", \":workspace_roots\"] }",
                "profiles.p.sandbox.filesystem.write[1]",
            ),
            (
                "filesystem = { write = [\"/srv\"], deny_read = [\":cwd\"] }",
                "profiles.p.sandbox.filesystem.deny_read[0]",
            ),
            (
                "filesystem = { read = [\"/usr\", \":cwd\"] }",
                "profiles.p.sandbox.filesystem.read[1]",
            ),
            (
                "filesystem = { deny_write = [\":workspace_roots\"] }",
                "profiles.p.sandbox.filesystem.deny_write[0]",
            ),
        ] {
            let config = write_config(&dir, &format!("[profiles.p]\nsandbox = {{ {intent} }}\n"));
            let (code, err) = start_status(unprivileged, &config).await;
            assert_eq!(
                code,
                Some(78),
                "agent configuration: {intent} accepted: {err}"
            );
            assert!(err.contains(key), "{intent}: the key is not named: {err}");
        }
        // Controls: the agent's own context (`:workspace_roots` configured,
        // `:home`, `:tmp`, absolute roots) is accepted.
        let config = write_config(
        &dir,
        "[profiles.p]\nworkspace_roots = [\"/srv\"]\nsandbox = { filesystem = { write = [\":workspace_roots\", \":tmp\"], deny_read = [\":home\"] } }\n",
    );
        let (mut cmd, _) = agent_command(unprivileged);
        cmd.arg("--config")
            .arg(&config)
            .args(["--profile", "p"])
            .current_dir("/");
        let mut a = RawAgent::spawn_command(cmd).await;
        let r = a.request(0, m::INITIALIZE, &init_params()).await;
        assert!(get(&r, "result").is_some(), "control refused: {r:?}");
        a.close_and_wait().await;
    }
);

// Issue 29.4: under one profile, two requests with different `cwd` get the
// same roots, for jobs and for fs/*. Layer: the sandbox (jobs: mount
// namespace and Landlock) and the agent's fs confinement.
both!(
    two_cwds_under_one_profile_get_the_same_roots,
    |unprivileged: bool| async move {
        let uid = agent_uid(unprivileged);
        let (base, ws) = tree("profile-roots", uid);
        let other = base.join("other");
        std::fs::create_dir(&other).unwrap();
        if uid != current_uid() {
            chown_r(&other, uid);
        }
        let config = write_config(
        &base,
        &format!(
            "[profiles.p]\nworkspace_roots = [{:?}]\nsandbox = {{ filesystem = {{ write = [\":workspace_roots\"] }}, network = \"deny\" }}\n",
            ws.to_str().unwrap()
        ),
    );
        let (mut a, _) = agent(unprivileged, &config, Some("p")).await;
        let info = a.request(1, m::ENVIRONMENT_INFO, &map(&[])).await;
        if path(&info, "result.sandbox.enforceable").and_then(|v| v.as_bool()) != Some(true) {
            a.close_and_wait().await;
            prerequisite_missing("an enforceable sandbox");
            return;
        }
        for (n, cwd) in [(0, &ws), (1, &other)] {
            let script = format!(
                "touch {ws}/job-in-{n}; touch {other}/job-out-{n}; exit 0",
                ws = ws.display(),
                other = other.display()
            );
            let r = a
                .request(
                    10 + n,
                    m::EXEC_COMMAND,
                    &map(&[
                        ("command", sh(&script)),
                        ("cwd", s(cwd)),
                        ("env", env_map()),
                        ("yield_time_ms", 10_000.into()),
                    ]),
                )
                .await;
            assert!(get(&r, "result").is_some(), "cwd {}: {r:?}", cwd.display());
            assert!(
                ws.join(format!("job-in-{n}")).exists(),
                "control: the job (cwd {}) could not write the profile's root",
                cwd.display()
            );
            assert!(
            !other.join(format!("job-out-{n}")).exists(),
            "sandbox (mount namespace, Landlock): a job with cwd {} wrote outside the profile's roots",
            cwd.display()
        );
            for (name, dir, ok) in [("fs-in", &ws, true), ("fs-out", &other, false)] {
                let target = dir.join(format!("{name}-{n}"));
                let r = a
                    .request(
                        20 + n,
                        m::FS_WRITE_FILE,
                        &map(&[
                            ("path", s(&target)),
                            ("data", Value::Binary(b"x".to_vec())),
                            ("cwd", s(cwd)),
                        ]),
                    )
                    .await;
                assert_eq!(
                    target.exists(),
                    ok,
                    "agent fs confinement: fs/writeFile {} with cwd {}: {r:?}",
                    target.display(),
                    cwd.display()
                );
                if !ok {
                    assert_eq!(error_code(&r), Some("sandbox_denied"), "{r:?}");
                }
            }
        }
        a.close_and_wait().await;
    }
);

/// The audit log's lines, by request id.
fn audit_lines(log: &Path) -> BTreeMap<u64, serde_json::Value> {
    let text = std::fs::read_to_string(log).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("one JSON object per line"))
        .filter_map(|e| e["id"].as_u64().map(|id| (id, e)))
        .collect()
}

// Issue 29.5: request params overwrote the audit line's own fields: a
// forged `session_id`, a decoy `command` next to the real `argv`, a dummy
// `sandbox_permissions` logging an unconfined request as sandboxed.
// Variants: forged `process_id`/`handle`/`tty` on a request that touches
// no job or handle, the same keys in other cases, a decoy `argv` on a
// request that spawns nothing, and a duplicated `argv` key. Layer: the
// agent's audit log.
both!(
    the_audit_line_is_what_the_agent_did,
    |unprivileged: bool| async move {
        let uid = agent_uid(unprivileged);
        let (base, ws) = tree("audit-forge", uid);
        let (log, config) = audit_config(&base);
        let (mut a, session) = agent(unprivileged, &config, None).await;
        let real = sh("echo real-argv");
        let decoy = Value::Array(vec!["decoy-argv".into()]);
        let fake_intent = map(&[("filesystem", map(&[("write", Value::Array(vec![]))]))]);
        let f = s(&ws.join("f.txt"));
        let requests: Vec<(u64, &str, Value)> = vec![
            // The reported forgeries.
            (
                1,
                m::FS_STAT,
                map(&[("path", f.clone()), ("session_id", "forged-session".into())]),
            ),
            (
                2,
                m::PROCESS_START,
                map(&[
                    ("argv", real.clone()),
                    ("cwd", s(&ws)),
                    ("env", env_map()),
                    ("command", decoy.clone()),
                ]),
            ),
            (
                3,
                m::FS_READ_FILE,
                map(&[
                    ("path", f.clone()),
                    ("sandbox_permissions", fake_intent.clone()),
                ]),
            ),
            (
                4,
                m::PROCESS_START,
                map(&[
                    ("argv", real.clone()),
                    ("cwd", s(&ws)),
                    ("env", env_map()),
                    ("sandbox_permissions", fake_intent.clone()),
                ]),
            ),
            // Variants.
            (
                5,
                m::FS_STAT,
                map(&[
                    ("path", f.clone()),
                    ("process_id", "p-forged".into()),
                    ("handle", 4242.into()),
                    ("tty", true.into()),
                ]),
            ),
            (
                6,
                m::FS_STAT,
                map(&[
                    ("path", f.clone()),
                    ("Session_Id", "forged-case".into()),
                    ("SANDBOXED", true.into()),
                    ("outcome", "ok".into()),
                ]),
            ),
            (
                7,
                m::PROCESS_LIST,
                map(&[("argv", decoy.clone()), ("command", decoy.clone())]),
            ),
            (
                8,
                m::PROCESS_START,
                Value::Map(vec![
                    ("argv".into(), real.clone()),
                    ("cwd".into(), s(&ws)),
                    ("env".into(), env_map()),
                    ("argv".into(), decoy.clone()),
                ]),
            ),
            // Controls: an unconfined job and a plain read.
            (
                9,
                m::PROCESS_START,
                map(&[("argv", real.clone()), ("cwd", s(&ws)), ("env", env_map())]),
            ),
            (10, m::FS_STAT, map(&[("path", f.clone())])),
        ];
        let mut outcomes = BTreeMap::new();
        for (id, method, params) in &requests {
            let r = a.request(*id, method, params).await;
            outcomes.insert(*id, r);
        }
        // Control: a job that is confined is logged so.
        let info = a.request(11, m::ENVIRONMENT_INFO, &map(&[])).await;
        let enforceable =
            path(&info, "result.sandbox.enforceable").and_then(|v| v.as_bool()) == Some(true);
        if enforceable {
            let intent = map(&[("filesystem", map(&[("write", Value::Array(vec![s(&ws)]))]))]);
            let p = map(&[
                ("argv", real.clone()),
                ("cwd", s(&ws)),
                ("env", env_map()),
                ("sandbox", intent),
            ]);
            let r = a.request(12, m::PROCESS_START, &p).await;
            assert!(get(&r, "result").is_some(), "{r:?}");
        }
        a.close_and_wait().await;
        let lines = audit_lines(&log);
        let line = |id: u64| {
            lines
                .get(&id)
                .unwrap_or_else(|| panic!("no audit line for request {id}: {lines:#?}"))
        };
        let decoy_json = serde_json::json!(["decoy-argv"]);
        let real_json = serde_json::json!(["/bin/sh", "-c", "echo real-argv"]);
        for (id, method, _) in &requests {
            let l = line(*id);
            let top = l.as_object().unwrap();
            assert_eq!(
                l["session_id"],
                session.as_str(),
                "audit: request {id} forged the session: {l}"
            );
            assert_eq!(l["method"], *method, "{l}");
            assert_ne!(
                l["argv"], decoy_json,
                "audit: request {id} logged the decoy as the argv: {l}"
            );
            for forged in ["forged-session", "forged-case", "p-forged"] {
                assert!(
                    !top.values().any(|v| v == forged),
                    "audit: request {id}: {forged} at the top level: {l}"
                );
            }
            assert!(
                !top.contains_key("Session_Id") && !top.contains_key("SANDBOXED"),
                "{l}"
            );
            let answered = &outcomes[id];
            let code = error_code(answered).unwrap_or("ok");
            assert_eq!(
                l["outcome"], code,
                "audit: request {id}'s outcome is not the agent's: {l}"
            );
            if l["argv"].is_array() {
                assert_eq!(l["argv"], real_json, "{l}");
            }
        }
        // Nothing spawned carries no argv; a read touches no job or handle.
        for id in [1, 3, 5, 6, 7, 10] {
            let l = line(id);
            assert!(
                l.get("argv").is_none()
                    && l.get("process_id").is_none()
                    && l.get("handle").is_none()
                    && l.get("tty").is_none(),
                "audit: request {id}: {l}"
            );
        }
        // The unconfined fs read and the unconfined job are logged unconfined.
        assert_eq!(
            line(3)["sandboxed"],
            false,
            "audit: an unconfined read logged as sandboxed: {}",
            line(3)
        );
        if error_code(&outcomes[&4]).is_none() {
            assert_eq!(
                line(4)["sandboxed"],
                false,
                "audit: an unconfined job logged as sandboxed: {}",
                line(4)
            );
        }
        // The control job: the argv spawned, unconfined, with its pid.
        let l = line(9);
        assert_eq!(l["outcome"], "ok", "{l}");
        assert_eq!(l["argv"], real_json, "{l}");
        assert_eq!(l["sandboxed"], false, "{l}");
        assert!(l["pid"].is_u64() && l["process_id"].is_string(), "{l}");
        assert_eq!(
            line(10)["path"],
            ws.join("f.txt").to_str().unwrap(),
            "{}",
            line(10)
        );
        if enforceable {
            assert_eq!(
                line(12)["sandboxed"],
                true,
                "audit: a confined job logged unconfined: {}",
                line(12)
            );
        } else {
            prerequisite_missing("an enforceable sandbox (the audit test's confined control)");
        }
    }
);

// Issue 29.5: an unknown key in a request that can run code or change the
// host is `invalid_params` naming the key (`data.field`), for every such
// method of the table, and nothing runs; the same request without it is
// accepted (the control). Variants: a key differing from a real one only
// by case, and an unknown key inside a nested map.
both!(
    unknown_keys_in_requests_that_act_are_refused,
    |unprivileged: bool| async move {
        let uid = agent_uid(unprivileged);
        let (base, ws) = tree("unknown-keys", uid);
        let config = write_config(&base, "[profiles.rw]\n");
        let (l, url) = listener();
        let (mut a, _) = agent(unprivileged, &config, Some("rw")).await;
        let held = Held::default();
        let with = |v: Value, k: &str, x: Value| match v {
            Value::Map(mut e) => {
                e.push((k.into(), x));
                Value::Map(e)
            }
            _ => unreachable!(),
        };
        let mut id = 1;
        for method in ALL_REQUESTS {
            if m::facts(method).unwrap().is_read_only() {
                continue;
            }
            for key in ["zz_unknown", "Cwd"] {
                let p = with(valid_params(method, &base, &ws, &url, &held), key, 1.into());
                let r = a.request(id, method, &p).await;
                id += 1;
                assert_eq!(
                    error_code(&r),
                    Some("invalid_params"),
                    "{method} with {key}: {r:?}"
                );
                assert_eq!(
                    path(&r, "error.data.field").and_then(|v| v.as_str()),
                    Some(key),
                    "{method}: {r:?}"
                );
                let msg = path(&r, "error.message")
                    .and_then(|v| v.as_str())
                    .unwrap_or("");
                assert!(msg.contains(key), "{method}: {msg}");
            }
        }
        // Nested: an unknown key in pty_size.
        let p = map(&[
            ("argv", sh("true")),
            ("cwd", s(&ws)),
            ("env", env_map()),
            ("tty", true.into()),
            (
                "pty_size",
                map(&[("rows", 5.into()), ("cols", 5.into()), ("depth", 1.into())]),
            ),
        ]);
        let r = a.request(id, m::PROCESS_START, &p).await;
        assert_eq!(error_code(&r), Some("invalid_params"), "{r:?}");
        assert_eq!(
            path(&r, "error.data.field").and_then(|v| v.as_str()),
            Some("pty_size.depth"),
            "{r:?}"
        );
        let before = snapshot(&base);
        assert!(
            !before.keys().any(|k| k.starts_with("ran-")),
            "a refused request ran: {before:#?}"
        );
        assert!(
            !before.contains_key(Path::new("ws/planted-link")),
            "{before:#?}"
        );
        assert!(!reached(&l), "a refused http/request reached the listener");
        // Controls: the same requests without the extra key run.
        for (i, method) in [
            m::FS_CREATE_SYMLINK,
            m::EXEC_COMMAND,
            m::FS_WRITE_FILE,
            m::HTTP_REQUEST,
        ]
        .iter()
        .enumerate()
        {
            let r = a
                .request(
                    1000 + i as u64,
                    method,
                    &valid_params(method, &base, &ws, &url, &held),
                )
                .await;
            // The listener never answers: the control http/request times out
            // after reaching it.
            if *method == m::HTTP_REQUEST {
                assert_eq!(error_code(&r), Some("timeout"), "control {method}: {r:?}");
            } else {
                assert!(get(&r, "result").is_some(), "control {method}: {r:?}");
            }
        }
        assert!(ws.join("planted-link").is_symlink());
        assert!(base.join("ran-exec").exists());
        assert!(reached(&l));
        a.close_and_wait().await;
    }
);

/// The pids of live processes whose command line holds `marker`.
fn marked(marker: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let zombie = stat
            .rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('Z'));
        if !zombie && String::from_utf8_lossy(&cmd).contains(marker) {
            out.push(pid);
        }
    }
    out
}

// Review of issue 29.5 (a request that fails mid-way after spawning): a
// `$/cancel` that lands while `process/start` waits for its job's first
// status dropped the start after the program ran. The job kept running,
// listed nowhere (`process/list`), unreachable by `process/signal`, its
// `max_processes` slot given back, and its audit line said `cancelled`
// with no pid. Variant: `exec_command` (the same start under another
// name). Layer: the agent's process table and audit log.
both!(
    a_cancelled_start_leaves_no_job_running_unlisted,
    |unprivileged: bool| async move {
        let uid = agent_uid(unprivileged);
        let (base, _ws) = tree("cancel-start", uid);
        let (log, config) = audit_config(&base);
        let (mut a, _) = agent(unprivileged, &config, None).await;
        let tag = format!("cancel-mark-{}-{unprivileged}", std::process::id());
        let mut cancelled = Vec::new();
        for n in 0..120u64 {
            let id = 1000 + n;
            let marker = format!("{tag}-{n}");
            let (method, params) = if n % 2 == 0 {
                (
                    m::PROCESS_START,
                    map(&[
                        (
                            "argv",
                            Value::Array(vec![
                                "/bin/sh".into(),
                                "-c".into(),
                                "sleep 300; :".into(),
                                marker.as_str().into(),
                            ]),
                        ),
                        ("cwd", "/".into()),
                        ("env", env_map()),
                    ]),
                )
            } else {
                (
                    m::EXEC_COMMAND,
                    map(&[
                        (
                            "command",
                            Value::Array(vec![
                                "/bin/sh".into(),
                                "-c".into(),
                                "sleep 300; :".into(),
                                marker.as_str().into(),
                            ]),
                        ),
                        ("cwd", "/".into()),
                        ("env", env_map()),
                        ("yield_time_ms", 10.into()),
                    ]),
                )
            };
            a.send_request(id, method, &params).await;
            tokio::time::sleep(Duration::from_micros(250 * (n / 2) % 20_000)).await;
            let mut b = Vec::new();
            executor_protocol::message::encode_notification(
                &mut b,
                m::CANCEL,
                &map(&[("id", id.into())]),
                1 << 20,
            )
            .unwrap();
            a.send_raw(&b).await;
            let r = a.response(id).await;
            if error_code(&r) == Some("cancelled") {
                cancelled.push((n, marker));
            }
        }
        // Each cancelled start whose job runs: listed (a start still under
        // way when its request was cancelled is given a moment to end),
        // and audited with its pid (a late line of its own when it
        // registered after the answer).
        let mut running: Vec<(u64, Vec<u32>)> = Vec::new();
        let mut orphans: Vec<(u64, Vec<u32>)> = Vec::new();
        for attempt in 0..50 {
            let list = a.request(9_000 + attempt, m::PROCESS_LIST, &map(&[])).await;
            let listed = format!("{list:?}");
            running.clear();
            orphans.clear();
            for (n, marker) in &cancelled {
                let pids = marked(&format!("{marker}\0"));
                if pids.is_empty() {
                    continue;
                }
                if !listed.contains(&format!("\"{marker}\"")) {
                    orphans.push((*n, pids.clone()));
                }
                running.push((*n, pids));
            }
            if orphans.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for (_, pids) in &orphans {
            for p in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(*p as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        a.close_and_wait().await;
        let lines = audit_lines(&log);
        let unaudited: Vec<u64> = running
            .iter()
            .filter(|(n, pids)| {
                !lines
                    .get(&(1000 + n))
                    .and_then(|l| l["pid"].as_u64())
                    .is_some_and(|p| pids.contains(&(p as u32)))
            })
            .map(|(n, _)| *n)
            .collect();
        eprintln!(
            "{} of 120 answered cancelled, {} of them running",
            cancelled.len(),
            running.len()
        );
        assert!(
            orphans.is_empty(),
            "agent process table: {} cancelled starts left their job running, unlisted: \
             {orphans:?}",
            orphans.len()
        );
        assert!(
            unaudited.is_empty(),
            "agent audit log: cancelled starts whose job runs have no line with its pid: \
             {unaudited:?}"
        );
        // The race was run: some cancelled starts did start their job.
        assert!(
            !running.is_empty(),
            "no cancelled start had started its job"
        );
    }
);

// Review of issue 29.5: a `$/cancel` landing while a request that
// changes the host runs answered `cancelled` ("its work is dropped") and
// audited it so, while the work (run on a blocking thread that cannot be
// stopped) went on: the file was written anyway. Variants: fs/remove and
// fs/createDirectory. Layer: the agent's connection (answers) and audit.
both!(
    a_cancelled_write_is_answered_with_what_it_did,
    |unprivileged: bool| async move {
        let uid = agent_uid(unprivileged);
        let (base, ws) = tree("cancel-write", uid);
        let (_, config) = audit_config(&base);
        let (mut a, _) = agent(unprivileged, &config, None).await;
        let data = Value::Binary(vec![b'x'; 4 << 20]);
        let mut lies = Vec::new();
        let mut answered_cancelled = 0;
        for n in 0..90u64 {
            let id = 2000 + n;
            let target = ws.join(format!("w{n}"));
            if n % 3 == 1 {
                std::fs::write(&target, "to remove").unwrap();
                chown_r(&target, uid);
            }
            let (method, params) = match n % 3 {
                0 => (
                    m::FS_WRITE_FILE,
                    map(&[("path", s(&target)), ("data", data.clone())]),
                ),
                1 => (m::FS_REMOVE, map(&[("path", s(&target))])),
                _ => (m::FS_CREATE_DIRECTORY, map(&[("path", s(&target))])),
            };
            a.send_request(id, method, &params).await;
            tokio::time::sleep(Duration::from_micros(100 * (n / 3))).await;
            let mut b = Vec::new();
            executor_protocol::message::encode_notification(
                &mut b,
                m::CANCEL,
                &map(&[("id", id.into())]),
                1 << 20,
            )
            .unwrap();
            a.send_raw(&b).await;
            let r = a.response(id).await;
            // Let any blocking work end before looking.
            tokio::time::sleep(Duration::from_millis(20)).await;
            let changed = match n % 3 {
                1 => !target.exists(),
                _ => target.exists(),
            };
            if error_code(&r) == Some("cancelled") {
                answered_cancelled += 1;
                if changed {
                    lies.push((n, method));
                }
            }
        }
        a.close_and_wait().await;
        eprintln!(
            "{answered_cancelled} of 90 answered cancelled, {} of them done",
            lies.len()
        );
        assert!(
            lies.is_empty(),
            "agent connection: requests answered `cancelled` whose change was made: {lies:?}"
        );
    }
);

/// The terminal pairs that exist on the host now (`/dev/pts` entries).
fn pts_names() -> std::collections::BTreeSet<String> {
    std::fs::read_dir("/dev/pts")
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

// Issue 29.1, a variant found by the review: a read acts on the host when
// what it opens is a device (`/dev/ptmx` makes a terminal pair for as
// long as the handle is held; a watchdog arms, a tape rewinds), so a
// `read_only` key changed the host through `fs/open`. Every method that
// opens content refuses a device (and, as before, a FIFO or socket): the
// agent's fs methods serve files. Layer: the agent's fs open (the object
// is looked at through its `O_PATH` descriptor before it is opened).
both!(no_read_opens_a_device, |unprivileged: bool| async move {
    let uid = agent_uid(unprivileged);
    let (base, ws) = tree("ro-dev", uid);
    let config = write_config(&base, "[profiles.ro]\nread_only = true\n");
    let (mut a, _) = agent(unprivileged, &config, Some("ro")).await;
    // Positive control: a regular file is read and held.
    let r = a
        .request(1, m::FS_OPEN, &map(&[("path", s(&ws.join("f.txt")))]))
        .await;
    assert!(path(&r, "result.handle").is_some(), "control: {r:?}");
    let before = pts_names();
    let mut id = 10;
    for dev in ["/dev/ptmx", "/dev/null", "/dev/zero", "/dev/urandom"] {
        for method in [m::FS_OPEN, m::FS_READ_FILE, m::FS_READ_STREAM] {
            id += 1;
            let mut params = vec![("path", Value::from(dev))];
            if method == m::FS_READ_STREAM {
                params.extend([("block_bytes", 4096.into()), ("credit_bytes", 65536.into())]);
            }
            let r = a.request(id, method, &map(&params)).await;
            let code = path(&r, "error.code").and_then(|v| v.as_str().map(str::to_owned));
            let msg = path(&r, "error.message")
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            assert_eq!(
                code.as_deref(),
                Some("io"),
                "agent fs open: {method} of {dev} was not refused: {r:?}"
            );
            assert!(
                msg.contains(dev) && msg.contains("a device"),
                "the refusal names the path and why: {msg}"
            );
        }
    }
    let after = pts_names();
    assert_eq!(
        before, after,
        "agent fs open: a read_only key made a terminal pair on the host"
    );
    // The connection survives and still reads files.
    let r = a
        .request(99, m::FS_READ_FILE, &map(&[("path", s(&ws.join("f.txt")))]))
        .await;
    assert!(get(&r, "result").is_some(), "{r:?}");
    a.close_and_wait().await;
});
