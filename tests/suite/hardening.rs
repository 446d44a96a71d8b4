//! Configuration profiles, the audit log, and faults: what a key may do is
//! explicit, and the agent loses nothing and leaks nothing under bad input,
//! faults and load.

use executor_client::http::HttpRequest;
use executor_client::{Client, ClientOptions, ErrorCode};
use executor_protocol::types::process::ProcessStartParams;
use executor_protocol::types::sandbox::{FilesystemIntent, NetworkIntent, SandboxIntent};
use executor_protocol::WirePath;
use executor_tests::http::TestServer;
use executor_tests::*;
use rmpv::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn write_config(tag: &str, text: &str) -> PathBuf {
    let path = unique_tempdir(tag).join("config.toml");
    std::fs::write(&path, text).unwrap();
    path
}

async fn client_with(config: &Path, profile: Option<&str>) -> Client {
    let mut cmd = tokio::process::Command::new(executor_bin());
    cmd.arg("--config").arg(config);
    if let Some(p) = profile {
        cmd.args(["--profile", p]);
    }
    Client::spawn(cmd, ClientOptions::default()).await.unwrap()
}

fn sh(script: &str) -> ProcessStartParams {
    ProcessStartParams::new(
        vec!["/bin/sh".into(), "-c".into(), script.into()],
        "/",
        BTreeMap::from([("PATH".to_string(), "/usr/bin:/bin".to_string())]),
    )
}

use executor_tests::msgpack_map as map;

#[tokio::test]
async fn a_profile_allowing_only_read_file_refuses_everything_else() {
    let dir = unique_tempdir("profile-reader");
    let file = dir.join("f.txt");
    std::fs::write(&file, b"readable").unwrap();
    let config = write_config(
        "profile-reader",
        "[profiles.reader]\nmethods.allow = [\"fs/readFile\"]\n",
    );
    let c = client_with(&config, Some("reader")).await;
    assert_eq!(c.initialize_result().methods, ["fs/readFile"]);
    // Positive control: the allowed method works.
    assert_eq!(c.read_file(file.as_path()).await.unwrap(), b"readable");
    let e = remote(c.start(&sh("true")).await.unwrap_err());
    assert_eq!(e.code, ErrorCode::PolicyDenied, "{e:?}");
    assert!(e.message.contains("not in methods.allow"), "{}", e.message);
    assert!(e.message.contains("reader"), "{}", e.message);
    assert_eq!(
        e.data_get("method").and_then(|v| v.as_str()),
        Some("process/start")
    );
    let e = remote(c.stat(file.as_path()).await.unwrap_err());
    assert_eq!(e.code, ErrorCode::PolicyDenied);
    // The connection goes on.
    assert_eq!(c.read_file(file.as_path()).await.unwrap(), b"readable");
    c.close().await.unwrap();
    // Without --profile the same file gives the defaults.
    let c = client_with(&config, None).await;
    assert!(c.initialize_result().methods.len() > 20);
    c.close().await.unwrap();
}

#[tokio::test]
async fn read_only_refuses_every_mutation_and_allows_reads() {
    let dir = unique_tempdir("profile-ro");
    let existing = dir.join("existing");
    std::fs::write(&existing, b"keep").unwrap();
    let config = write_config("profile-ro", "[profiles.ro]\nread_only = true\n");
    let c = client_with(&config, Some("ro")).await;
    let target = dir.join("new");
    let e = remote(c.write_file(target.as_path(), b"x").await.unwrap_err());
    assert_eq!(e.code, ErrorCode::PolicyDenied, "{e:?}");
    assert!(e.message.contains("read_only"), "{}", e.message);
    assert!(!target.exists());
    let e = remote(c.start(&sh("touch /tmp/never")).await.unwrap_err());
    assert_eq!(e.code, ErrorCode::PolicyDenied);
    for (method, params) in [
        (
            "fs/remove",
            map(&[("path", existing.to_str().unwrap().into())]),
        ),
        (
            "fs/rename",
            map(&[
                ("from", existing.to_str().unwrap().into()),
                ("to", target.to_str().unwrap().into()),
            ]),
        ),
        (
            "exec_command",
            map(&[
                ("command", Value::Array(vec!["true".into()])),
                ("cwd", "/".into()),
                ("env", Value::Map(vec![])),
            ]),
        ),
    ] {
        let e = remote(c.request::<_, Value>(method, &params).await.unwrap_err());
        assert_eq!(e.code, ErrorCode::PolicyDenied, "{method}: {e:?}");
    }
    assert_eq!(std::fs::read(&existing).unwrap(), b"keep");
    // Reads work.
    assert_eq!(c.read_file(existing.as_path()).await.unwrap(), b"keep");
    c.stat(existing.as_path()).await.unwrap();
    c.close().await.unwrap();
}

#[tokio::test]
async fn a_profile_sandbox_applies_by_default_and_requests_may_only_narrow() {
    let probe = local_client().await;
    let enforceable = probe.initialize_result().sandbox.enforceable;
    probe.close().await.unwrap();
    if !enforceable {
        prerequisite_missing("no sandbox on this host");
        return;
    }
    let work = unique_tempdir("profile-sandbox");
    let outside = unique_tempdir("profile-sandbox-outside");
    let config = write_config(
        "profile-sandbox",
        &format!(
            "[profiles.jail]\nworkspace_roots = [{:?}]\n\
             sandbox = {{ filesystem = {{ write = [\":workspace_roots\"] }}, network = \"deny\" }}\n",
            work.to_str().unwrap()
        ),
    );
    let c = client_with(&config, Some("jail")).await;
    // No intent in the request: the profile's applies. Writing inside the
    // workspace works (positive control), outside is refused by the
    // sandbox (the mount namespace's read-only view: EROFS).
    let script = format!(
        "echo in > {w}/in.txt; echo out > {o}/out.txt; echo rc=$?",
        w = work.display(),
        o = outside.display()
    );
    let mut p = c.start(&sh(&script)).await.unwrap();
    let mut out = Vec::new();
    let mut err = Vec::new();
    while let Some(ch) = p.next_output().await.unwrap() {
        match ch.stream {
            executor_protocol::types::process::OutputStream::Stderr => {
                err.extend_from_slice(&ch.data)
            }
            _ => out.extend_from_slice(&ch.data),
        }
    }
    let out = String::from_utf8_lossy(&out);
    let err = String::from_utf8_lossy(&err);
    assert!(work.join("in.txt").exists(), "inside: {out} {err}");
    assert!(!outside.join("out.txt").exists(), "outside was written");
    assert!(out.contains("rc=") && !out.contains("rc=0"), "{out}");
    assert!(err.contains("Read-only file system"), "{err}");
    // A request asking for more than the profile: policy_denied, nothing runs.
    let mut wider = sh("true");
    wider.sandbox = Some(SandboxIntent {
        filesystem: FilesystemIntent {
            write: vec![WirePath::from(outside.as_path())],
            ..Default::default()
        },
        ..Default::default()
    });
    let e = remote(c.start(&wider).await.unwrap_err());
    assert_eq!(e.code, ErrorCode::PolicyDenied, "{e:?}");
    assert_eq!(
        e.data_get("field").and_then(|v| v.as_str()),
        Some("sandbox.filesystem.write.0")
    );
    let mut net = sh("true");
    net.sandbox = Some(SandboxIntent {
        network: NetworkIntent::Allow,
        ..Default::default()
    });
    let e = remote(c.start(&net).await.unwrap_err());
    assert_eq!(e.code, ErrorCode::PolicyDenied, "{e:?}");
    // Narrower is fine: write only a subdirectory.
    let sub = work.join("sub");
    std::fs::create_dir(&sub).unwrap();
    let mut narrow = sh(&format!("echo n > {}/n.txt", sub.display()));
    narrow.sandbox = Some(SandboxIntent {
        filesystem: FilesystemIntent {
            write: vec![WirePath::from(sub.as_path())],
            ..Default::default()
        },
        ..Default::default()
    });
    let mut p = c.start(&narrow).await.unwrap();
    while p.next_output().await.unwrap().is_some() {}
    assert_eq!(p.exit_status().unwrap().code, Some(0));
    assert!(sub.join("n.txt").exists());
    // HTTP is under the profile's network "deny" as well.
    let server = TestServer::start().await;
    let e = remote(
        c.http_request(HttpRequest::get(server.url("/echo")))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, ErrorCode::PolicyDenied, "{e:?}");
    c.close().await.unwrap();
}

#[tokio::test]
async fn allow_root_false_refuses_to_start_as_root() {
    let config = write_config(
        "profile-root",
        "[profiles.nonroot]\nallow_root = false\n[profiles.any]\n",
    );
    let run = |profile: &'static str| {
        let config = config.clone();
        async move {
            tokio::process::Command::new(executor_bin())
                .arg("--config")
                .arg(&config)
                .args(["--profile", profile])
                .stdin(std::process::Stdio::null())
                .output()
                .await
                .unwrap()
        }
    };
    let out = run("nonroot").await;
    if current_uid() == 0 {
        assert_eq!(out.status.code(), Some(77));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("allow_root = false"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    } else {
        assert_eq!(out.status.code(), Some(0), "not root: it serves (EOF)");
    }
    // Positive control: another profile starts (and ends at EOF).
    assert_eq!(run("any").await.status.code(), Some(0));
}

#[tokio::test]
async fn the_audit_log_records_methods_and_outcomes_and_no_secrets() {
    let dir = unique_tempdir("audit");
    let log = dir.join("audit.jsonl");
    let config = write_config(
        "audit",
        &format!("[audit]\nfile = {:?}\n", log.to_str().unwrap()),
    );
    let server = TestServer::start().await;
    let mut cmd = tokio::process::Command::new(executor_bin());
    cmd.arg("--config")
        .arg(&config)
        .env("SSH_CLIENT", "192.0.2.7 50000 22")
        .env("SSH_CONNECTION", "192.0.2.7 50000 192.0.2.1 22");
    let c = Client::spawn(cmd, ClientOptions::default()).await.unwrap();
    let token = c.initialize_result().resume_token.clone();
    let session = c.initialize_result().session_id.clone();
    let mut p = sh("echo $SECRET_MARKER > /dev/null");
    p.env
        .insert("SECRET_MARKER".into(), "env-value-marker-7f3a".into());
    let mut proc = c.start(&p).await.unwrap();
    while proc.next_output().await.unwrap().is_some() {}
    let r = c
        .http_request(
            HttpRequest::new("POST", server.url("/echo?token=query-marker-91"))
                .header("Authorization", "Bearer auth-marker-c0ffee")
                .header("Cookie", "sid=cookie-marker-5e")
                .body(&b"body-marker-42"[..]),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let missing = dir.join("missing");
    let e = remote(c.read_file(missing.as_path()).await.unwrap_err());
    assert_eq!(e.code, ErrorCode::NotFound);
    c.write_file(dir.join("w").as_path(), b"file-data-marker-0d")
        .await
        .unwrap();
    c.close().await.unwrap();

    let text = std::fs::read_to_string(&log).unwrap();
    let events: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    let find = |method: &str| {
        events
            .iter()
            .find(|e| e["method"] == method)
            .unwrap_or_else(|| panic!("no {method} event in {text}"))
    };
    assert_eq!(find("initialize")["outcome"], "ok");
    let start = find("process/start");
    assert_eq!(start["outcome"], "ok");
    assert_eq!(start["argv"][0], "/bin/sh");
    assert_eq!(start["session_id"], session.as_str());
    assert_eq!(start["ssh_client"], "192.0.2.7 50000 22");
    let http = find("http/request");
    assert_eq!(http["outcome"], "ok");
    assert_eq!(http["http_method"], "POST");
    assert_eq!(http["url"], server.url("/echo"));
    let read = find("fs/readFile");
    assert_eq!(read["outcome"], "not_found");
    assert_eq!(read["path"], missing.to_str().unwrap());
    assert!(events.iter().all(|e| e["duration_us"].is_u64()));
    for secret in [
        token.as_str(),
        "env-value-marker-7f3a",
        "auth-marker-c0ffee",
        "cookie-marker-5e",
        "body-marker-42",
        "query-marker-91",
        "file-data-marker-0d",
    ] {
        assert!(!text.contains(secret), "the audit log holds {secret:?}");
    }
}

/// A sparse file of `size` bytes, opened by `a`, with `blocks` 1 MiB
/// `fs/readBlock` requests sent and not yet read.
async fn reads_in_flight(a: &mut RawAgent, tag: &str, size: u64, blocks: u64) {
    let big = unique_tempdir(tag).join("big");
    std::fs::File::create(&big).unwrap().set_len(size).unwrap();
    let r = a
        .request(
            2,
            executor_protocol::methods::FS_OPEN,
            &map(&[("path", big.to_str().unwrap().into())]),
        )
        .await;
    let handle = get(get(&r, "result").unwrap(), "handle").unwrap().clone();
    for i in 0..blocks {
        let params = map(&[
            ("handle", handle.clone()),
            ("offset", (i << 20).into()),
            ("length", (1u64 << 20).into()),
        ]);
        a.send_request(10 + i, "fs/readBlock", &params).await;
    }
}

#[tokio::test]
async fn sigkill_during_a_job_and_a_streaming_read_leaves_nothing_alive() {
    let mut a = RawAgent::initialized().await;
    let r = a
        .request(
            1,
            executor_protocol::methods::PROCESS_START,
            &sh("sleep 1000"),
        )
        .await;
    let pid = get(get(&r, "result").unwrap(), "pid")
        .unwrap()
        .as_u64()
        .unwrap() as u32;
    reads_in_flight(&mut a, "fault-kill", 256 << 20, 8).await;
    a.child.start_kill().unwrap();
    a.wait().await;
    assert!(
        wait_dead(pid, Duration::from_secs(5)).await,
        "job {pid} survived the agent's SIGKILL"
    );
}

#[tokio::test]
async fn closing_the_transport_mid_read_block_ends_the_agent_cleanly() {
    let mut a = RawAgent::initialized().await;
    reads_in_flight(&mut a, "fault-close", 64 << 20, 16).await;
    // Gone mid-stream: both of our pipe ends close.
    let pid = a.child.id().unwrap();
    let fds_open = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    assert!(fds_open > 3);
    drop(a.stdin.take());
    let RawAgent {
        mut child, stdout, ..
    } = a;
    drop(stdout);
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("the agent exits in time")
        .unwrap();
    assert_eq!(status.code(), Some(0), "a clean exit");
}

#[tokio::test]
async fn a_client_that_never_reads_keeps_the_agent_bounded() {
    let mut a = RawAgent::initialized().await;
    let pid = a.child.id().unwrap();
    a.send_request(
        1,
        executor_protocol::methods::PROCESS_START,
        &sh("head -c 1073741824 /dev/zero"),
    )
    .await;
    // Read nothing for 5 s while the job writes as fast as it can.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss = status_kib(pid, "VmRSS");
    eprintln!("client not reading while a job writes 1 GiB: agent RSS {rss} KiB");
    assert!(rss > 0 && rss < 64 * 1024, "agent RSS {rss} KiB");
    // Still serving: the start answer is there, and a new request is
    // answered.
    let r = a.response(1).await;
    assert!(get(&r, "result").is_some(), "{r:?}");
    a.send_request(2, executor_protocol::methods::ENVIRONMENT_INFO, &map(&[]))
        .await;
    let r = a.response(2).await;
    assert!(get(&r, "result").is_some(), "{r:?}");
}

#[tokio::test]
async fn a_thousand_pipelined_mixed_requests_are_all_answered() {
    let dir = unique_tempdir("pipelined");
    let file = dir.join("f");
    std::fs::write(&file, b"data").unwrap();
    let mut a = RawAgent::initialized().await;
    let path: Value = file.to_str().unwrap().into();
    let mut expected = std::collections::HashMap::new();
    let mut batch = Vec::new();
    for id in 1..=1000u64 {
        let (method, params, outcome): (&str, Value, Option<&str>) = match id % 7 {
            0 => ("environment/info", map(&[]), None),
            1 => ("fs/stat", map(&[("path", path.clone())]), None),
            2 => ("fs/readFile", map(&[("path", path.clone())]), None),
            3 => ("process/list", map(&[]), None),
            4 => ("no/such/method", map(&[]), Some("method_not_found")),
            5 => (
                "fs/stat",
                map(&[("path", 7.into())]),
                Some("invalid_params"),
            ),
            _ => (
                "fs/readFile",
                map(&[("path", "/nonexistent/x".into())]),
                Some("not_found"),
            ),
        };
        executor_protocol::message::encode_request(&mut batch, id, method, &params, 1 << 24)
            .unwrap();
        expected.insert(id, outcome);
    }
    a.send_raw(&batch).await;
    let mut seen = std::collections::HashSet::new();
    while seen.len() < 1000 {
        let v = tokio::time::timeout(Duration::from_secs(30), a.recv())
            .await
            .expect("answers in time")
            .expect("no EOF");
        let Some(id) = get(&v, "id").and_then(|i| i.as_u64()) else {
            continue; // a notification
        };
        assert!(seen.insert(id), "id {id} answered twice");
        let want = expected[&id];
        assert_eq!(error_code(&v), want, "id {id}: {v:?}");
    }
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

fn zombie_children(pid: u32) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            let Some((_, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let f: Vec<&str> = rest.split_whitespace().collect();
            f.first() == Some(&"Z") && f.get(1) == Some(&pid.to_string().as_str())
        })
        .count()
}

#[tokio::test]
async fn a_thousand_processes_leave_no_fd_or_zombie_behind() {
    let c = local_client().await;
    let pid = c.transport_pid().unwrap();
    // Warm up (the runtime's threads and pools), then measure.
    let mut p = c.start(&sh("true")).await.unwrap();
    while p.next_output().await.unwrap().is_some() {}
    let fds_before = fd_count(pid);
    for _ in 0..20 {
        let mut batch = Vec::new();
        for _ in 0..50 {
            batch.push(c.start(&sh("true")).await.unwrap());
        }
        for mut p in batch {
            while p.next_output().await.unwrap().is_some() {}
            assert_eq!(p.exit_status().unwrap().code, Some(0));
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let fds_after = fd_count(pid);
    let zombies = zombie_children(pid);
    eprintln!("1000 processes: agent fds {fds_before} -> {fds_after}, zombies {zombies}");
    assert!(
        fds_after <= fds_before + 2,
        "fd leak: {fds_before} -> {fds_after}"
    );
    assert_eq!(zombies, 0, "zombie children of the agent");
    c.close().await.unwrap();
}

#[test]
fn list_methods_prints_every_method() {
    let out = std::process::Command::new(executor_bin())
        .arg("--list-methods")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let listed: Vec<&str> = text
        .lines()
        .map(|l| l.split('\t').next().unwrap())
        .collect();
    assert_eq!(listed, executor_protocol::methods::ALL_REQUESTS);
    // Each with its facts from the table.
    for line in text.lines() {
        let (m, facts) = line.split_once('\t').expect("METHOD<TAB>FACTS");
        let f = executor_protocol::methods::facts(m).unwrap();
        assert_eq!(facts, f.describe(), "{line}");
    }
    assert!(text.contains("fs/createSymlink\tchanges-host"), "{text}");
    assert!(text.contains("fs/readFile\tread-only"), "{text}");
}

/// `process/start` params running `script` under the raw `sandbox` value.
fn start_raw(script: &str, sandbox: Value) -> Value {
    map(&[
        (
            "argv",
            Value::Array(vec!["/bin/sh".into(), "-c".into(), script.into()]),
        ),
        ("cwd", "/".into()),
        ("env", map(&[("PATH", "/usr/bin:/bin".into())])),
        ("sandbox", sandbox),
    ])
}

// Issue 14.4: an unknown key anywhere in a sandbox intent is `invalid_params`
// naming it, and nothing runs; a misspelt carve-out never silently vanishes.
#[tokio::test]
async fn misspelt_intent_keys_are_refused_naming_the_key() {
    let dir = unique_tempdir("strict-intent");
    let secret = dir.join("secret");
    std::fs::write(&secret, "HUNTER2\n").unwrap();
    let marker = dir.join("ran");
    let script = format!("touch {}; cat {}", marker.display(), secret.display());
    let s = || Value::from(secret.to_str().unwrap());
    let c = Client::spawn(
        tokio::process::Command::new(executor_bin()),
        ClientOptions::default(),
    )
    .await
    .unwrap();
    let fs = |entries: &[(&str, Value)]| map(&[("filesystem", map(entries))]);
    for (intent, key) in [
        (
            map(&[("deny_reads", Value::Array(vec![s()]))]),
            "deny_reads",
        ),
        (fs(&[("denyRead", Value::Array(vec![s()]))]), "denyRead"),
        (
            map(&[(
                "network",
                map(&[
                    ("allow_tcp_connect", Value::Array(vec![80.into()])),
                    ("ports", Value::Array(vec![443.into()])),
                ]),
            )]),
            "ports",
        ),
    ] {
        let e = c
            .start_call(
                executor_protocol::methods::PROCESS_START,
                &start_raw(&script, intent.clone()),
            )
            .await
            .unwrap()
            .result::<Value>()
            .await
            .unwrap_err();
        let e = remote(e);
        assert_eq!(e.code, ErrorCode::InvalidParams, "{key}: {e:?}");
        assert!(e.message.contains(key), "{key}: {}", e.message);
        assert!(!marker.exists(), "{key}: nothing runs");
        // The same strictness for exec_command's two intents and fs requests.
        for field in ["sandbox_permissions", "additional_permissions"] {
            let p = map(&[
                ("command", Value::Array(vec!["/bin/true".into()])),
                ("cwd", "/".into()),
                (field, intent.clone()),
            ]);
            let e = remote(
                c.start_call(executor_protocol::methods::EXEC_COMMAND, &p)
                    .await
                    .unwrap()
                    .result::<Value>()
                    .await
                    .unwrap_err(),
            );
            assert_eq!(e.code, ErrorCode::InvalidParams, "{field} {key}: {e:?}");
            assert!(e.message.contains(key), "{field} {key}: {}", e.message);
        }
        let p = map(&[("path", s()), ("sandbox", intent.clone())]);
        let e = remote(
            c.start_call(executor_protocol::methods::FS_READ_FILE, &p)
                .await
                .unwrap()
                .result::<Value>()
                .await
                .unwrap_err(),
        );
        assert_eq!(e.code, ErrorCode::InvalidParams, "fs {key}: {e:?}");
    }
    // Positive control: the right spelling runs, and the carve-out holds.
    let good = fs(&[
        ("write", Value::Array(vec![dir.to_str().unwrap().into()])),
        ("deny_read", Value::Array(vec![s()])),
    ]);
    let r: Value = c
        .start_call(
            executor_protocol::methods::PROCESS_START,
            &start_raw(&script, good),
        )
        .await
        .unwrap()
        .result()
        .await
        .unwrap();
    assert!(r.as_map().is_some(), "{r:?}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !marker.exists() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(marker.exists(), "the well-spelt intent runs");
    c.close().await.unwrap();
}

// Issue 14.4: the same for a profile's sandbox in the configuration file:
// an unknown key stops the agent at start with FILE:LINE.
#[tokio::test]
async fn a_misspelt_key_in_a_profile_sandbox_stops_the_agent() {
    let config = write_config(
        "strict-profile",
        "[profiles.p]\n\n[profiles.p.sandbox.filesystem]\nwrite = [\"/tmp\"]\ndenyRead = [\"/etc\"]\n",
    );
    let out = std::process::Command::new(executor_bin())
        .arg("--config")
        .arg(&config)
        .args(["--profile", "p"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(err.contains("denyRead"), "{err}");
    assert!(
        err.contains(&format!("{}:5", config.display())),
        "FILE:LINE of the key: {err}"
    );
    // Control: spelt right, the agent starts and serves.
    let config = write_config(
        "strict-profile-ok",
        "[profiles.p]\n\n[profiles.p.sandbox.filesystem]\nwrite = [\"/tmp\"]\ndeny_read = [\"/etc\"]\n",
    );
    let c = client_with(&config, Some("p")).await;
    c.close().await.unwrap();
}

// Issue 14.6: in-flight request payloads have a byte budget. 24 concurrent
// 4 MiB `process/write`s to a job that does not read yet: the agent stops
// reading its input past the budget instead of holding them all, and every
// write completes once the job drains its stdin.
#[tokio::test]
async fn in_flight_request_bytes_are_bounded_by_back_pressure() {
    const MIB: usize = 1 << 20;
    let c = client_with_config("[limits]\nmax_inflight_request_bytes = 4194304\n").await;
    assert_eq!(
        c.initialize_result().limits.max_inflight_request_bytes,
        4 * MIB as u64
    );
    let job = c.start(&sh("sleep 3; cat > /dev/null")).await.unwrap();
    let agent = executor_tests::agent_of_job(job.pid());
    let before = status_kib(agent, "VmRSS");
    let data = vec![b'x'; 4 * MIB];
    let writes = (0..24).map(|_| job.write(&data));
    let all = futures_util::future::join_all(writes);
    let results = tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("the writes complete once the job reads");
    for r in &results {
        r.as_ref().unwrap();
    }
    let peak = status_kib(agent, "VmHWM");
    assert!(
        peak < before + 48 * 1024,
        "agent peak RSS {peak} KiB (at start {before} KiB) for 96 MiB of writes"
    );
    // Control: the default budget (64 MiB) is reported.
    let d = local_client().await;
    assert_eq!(
        d.initialize_result().limits.max_inflight_request_bytes,
        64 * MIB as u64
    );
    d.close().await.unwrap();
    job.signal(executor_protocol::types::process::SignalName::Kill)
        .await
        .unwrap();
    c.close().await.unwrap();
}
