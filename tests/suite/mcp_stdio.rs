//! `executor-client mcp stdio` (issue 31, the stdio bridge): the Python MCP
//! SDK's own stdio client, started on the bridge, talks to an SDK server run
//! on the host as a job (`mcp_stdio/server.py`, `mcp_stdio/client.py`); plus
//! the bridge's line framing, exit statuses and shutdown ladder with plain
//! shell servers.

use executor_tests::cli::*;
use executor_tests::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const SERVER: &str = include_str!("mcp_stdio/server.py");
const CLIENT: &str = include_str!("mcp_stdio/client.py");

/// Bound on one SDK scenario (its Python start-up included).
const SCENARIO: Duration = Duration::from_secs(120);

/// The Python interpreter (absolute: the job's environment is the host
/// user's, whose PATH may not hold it) when it imports the MCP SDK; `None`
/// (and a skip that `EXECUTOR_REQUIRE_ALL=1` fails) otherwise.
pub(crate) fn python_with_sdk() -> Option<String> {
    let out = Command::new("python3")
        .args(["-c", "import sys, mcp; print(sys.executable)"])
        .output();
    match out {
        Ok(o) if o.status.success() => Some(String::from_utf8(o.stdout).unwrap().trim().into()),
        _ => {
            prerequisite_missing("the Python MCP SDK (python3 -m pip install \"mcp>=1.0\")");
            None
        }
    }
}

/// A directory holding the SDK server and client scripts.
pub(crate) fn scripts() -> std::path::PathBuf {
    let d = unique_tempdir("mcp-stdio");
    std::fs::write(d.join("server.py"), SERVER).unwrap();
    std::fs::write(d.join("client.py"), CLIENT).unwrap();
    d
}

/// The bridge's arguments for the SDK server, `flags` between `stdio` and `--`.
fn bridge_args(python: &str, dir: &std::path::Path, flags: &[&str]) -> String {
    let mut args: Vec<String> = vec![
        "--target".into(),
        "local".into(),
        "mcp".into(),
        "stdio".into(),
    ];
    args.extend(flags.iter().map(|f| f.to_string()));
    args.push("--".into());
    args.push(python.into());
    args.push(dir.join("server.py").to_string_lossy().into_owned());
    serde_json::to_string(&args).unwrap()
}

/// The SDK client running `mode` through the bridge.
fn sdk_client(
    python: &str,
    dir: &std::path::Path,
    flags: &[&str],
    mode: &str,
    extra: &str,
) -> Child {
    sdk_client_with(python, dir, &bridge_args(python, dir, flags), mode, extra)
}

/// The SDK client running `mode` through the bridge started with `args`
/// (a JSON list).
fn sdk_client_with(
    python: &str,
    dir: &std::path::Path,
    args: &str,
    mode: &str,
    extra: &str,
) -> Child {
    Command::new(python)
        .arg(dir.join("client.py"))
        .arg(client_bin())
        .arg(args)
        .arg(mode)
        .arg(extra)
        .env("RUST_BACKTRACE", "0")
        .env_remove("EXECUTOR_TARGET")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the SDK client")
}

/// `child`'s output, killing it (and failing) past `within`.
fn finish(mut child: Child, within: Duration) -> Output {
    let deadline = Instant::now() + within;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("still running after {within:?}: {}", text(&out));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// The `key: value` lines of the SDK client's output.
fn results(out: &Output) -> std::collections::BTreeMap<String, String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn the_sdk_client_lists_calls_and_reads_through_the_bridge() {
    let Some(python) = python_with_sdk() else {
        return;
    };
    let dir = scripts();
    let out = finish(sdk_client(&python, &dir, &[], "full", "{}"), SCENARIO);
    assert!(out.status.success(), "{}", text(&out));
    let r = results(&out);
    let get = |k: &str| r.get(k).map(String::as_str);
    assert_eq!(
        get("tools"),
        Some("add,big,connect,crash,numbered,pid,progress,tick,ticks,write_file"),
        "{}",
        text(&out)
    );
    assert_eq!(get("add"), Some("42"));
    // 1 MiB of tool result, whole and unchanged.
    assert_eq!(get("big"), Some("1048576 True"));
    // The progress notifications arrive, in order, before the result.
    assert_eq!(get("progress"), Some("done 5 1/5 2/5 3/5 4/5 5/5"));
    assert_eq!(get("resource"), Some("hello from the host"));
    assert_eq!(get("pipelined"), Some("True"));
    assert_eq!(get("end"), Some("ok"));
    // The server's stderr reached the local stderr.
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("test-server: started"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_server_crashing_mid_call_gives_the_client_an_error() {
    let Some(python) = python_with_sdk() else {
        return;
    };
    let dir = scripts();
    let out = finish(sdk_client(&python, &dir, &[], "crash", "{}"), SCENARIO);
    let r = results(&out);
    let crash = r.get("crash").map(String::as_str).unwrap_or("");
    assert!(crash.starts_with("error"), "{}", text(&out));
    assert_eq!(
        r.get("end").map(String::as_str),
        Some("ok"),
        "{}",
        text(&out)
    );
    // The client waited on nothing: it learned of the crash, not a timeout.
    let elapsed: f64 = r["elapsed"].parse().unwrap();
    assert!(elapsed < 25.0, "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ended before its client closed stdin (exit status 3)"),
        "{}",
        text(&out)
    );
}

#[test]
fn sandbox_flags_confine_the_server() {
    let Some(python) = python_with_sdk() else {
        return;
    };
    let dir = scripts();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || for _ in listener.incoming() {});
    let target = dir.join("written");
    let extra = serde_json::json!({"path": target, "port": port}).to_string();
    // Positive control: unconfined, the same tools write and connect.
    let out = finish(sdk_client(&python, &dir, &[], "sandbox", &extra), SCENARIO);
    let r = results(&out);
    assert_eq!(
        r.get("write").map(String::as_str),
        Some("wrote"),
        "{}",
        text(&out)
    );
    assert_eq!(
        r.get("connect").map(String::as_str),
        Some("connected"),
        "{}",
        text(&out)
    );
    assert!(target.exists());
    std::fs::remove_file(&target).unwrap();
    let out = finish(
        sdk_client(
            &python,
            &dir,
            &["--ro", "/", "--net", "deny"],
            "sandbox",
            &extra,
        ),
        SCENARIO,
    );
    let r = results(&out);
    let write = r.get("write").map(String::as_str).unwrap_or("");
    let connect = r.get("connect").map(String::as_str).unwrap_or("");
    assert!(write.starts_with("error:"), "{}", text(&out));
    assert!(connect.starts_with("error:"), "{}", text(&out));
    assert!(!target.exists());
    assert_eq!(
        r.get("end").map(String::as_str),
        Some("ok"),
        "{}",
        text(&out)
    );
}

/// The pids of `parent`'s children.
fn children(parent: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|st| {
                    let (_, rest) = st.rsplit_once(')')?;
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(parent)
        })
        .collect()
}

#[test]
fn a_killed_client_leaves_no_job_on_the_host() {
    let Some(python) = python_with_sdk() else {
        return;
    };
    let dir = scripts();
    let mut client = sdk_client(&python, &dir, &[], "hold", "{}");
    let mut lines = BufReader::new(client.stdout.take().unwrap()).lines();
    let server: u32 = loop {
        let line = lines
            .next()
            .expect("the client ended before the server answered")
            .unwrap();
        if let Some(pid) = line.strip_prefix("pid: ") {
            break pid.parse().unwrap();
        }
    };
    assert!(alive(server));
    let bridges = children(client.id());
    assert_eq!(bridges.len(), 1, "the client's children: {bridges:?}");
    client.kill().unwrap();
    client.wait().unwrap();
    // The bridge's stdin closed: the server's too, and both end.
    let rt = tokio::runtime::Runtime::new().unwrap();
    assert!(
        rt.block_on(wait_dead(server, WAIT)),
        "the server {server} outlived its client"
    );
    assert!(
        rt.block_on(wait_dead(bridges[0], WAIT)),
        "the bridge outlived its client"
    );
}

/// The bridge on `script` (a `sh -c` server), stdin and stdout piped.
fn bridge(flags: &[&str], script: &str) -> Child {
    Command::new(client_bin())
        .args(["--target", "local", "mcp", "stdio"])
        .args(flags)
        .args(["--", "sh", "-c", script])
        .env("RUST_BACKTRACE", "0")
        .env_remove("EXECUTOR_TARGET")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the bridge")
}

#[test]
fn only_whole_lines_reach_stdout() {
    // A line written in two pieces a second apart arrives in one piece; an
    // unfinished last line is not relayed, and said so on stderr.
    let mut b = bridge(
        &[],
        "printf '{\"a\":'; sleep 1; printf '1}\\n{\"b\"'; sleep 0.5; printf ':2}\\ntail'",
    );
    let mut stdout = b.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 4096];
        loop {
            match stdout.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => tx.send((Instant::now(), buf[..n].to_vec())).unwrap(),
            }
        }
    });
    let started = Instant::now();
    let mut got = Vec::new();
    while let Ok((at, piece)) = rx.recv_timeout(WAIT) {
        assert_eq!(piece.last(), Some(&b'\n'), "a partial line: {piece:?}");
        assert!(
            at - started > Duration::from_millis(800),
            "early: {piece:?}"
        );
        got.extend(piece);
    }
    assert_eq!(String::from_utf8(got).unwrap(), "{\"a\":1}\n{\"b\":2}\n");
    let out = finish(b, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("in the middle of a line (4 bytes not relayed)"),
        "{err}"
    );
}

#[test]
fn stdin_closing_ends_the_job_with_its_own_status() {
    let mut b = bridge(&[], "cat; exit 7");
    let mut stdin = b.stdin.take().unwrap();
    stdin.write_all(b"{\"id\":1}\n{\"id\":2}").unwrap();
    drop(stdin);
    let out = finish(b, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(7), "{}", text(&out));
    // The unfinished last line was sent at EOF (and echoed without its end).
    assert_eq!(String::from_utf8_lossy(&out.stdout), "{\"id\":1}\n");
}

#[test]
fn a_server_deaf_to_eof_and_terminate_is_killed_after_the_grace() {
    let mut b = bridge(
        &["--grace", "0.5"],
        "trap '' TERM; while :; do sleep 0.1; done",
    );
    drop(b.stdin.take());
    let started = Instant::now();
    let out = finish(b, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(128 + 9), "{}", text(&out));
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_server_ending_on_its_own_fails_the_bridge() {
    let b = bridge(&[], "echo '{}'; exit 0");
    let out = finish(b, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "{}\n");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("ended before its client closed stdin"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_burst_read_late_arrives_whole_and_in_order() {
    // 200,000 lines (about 14 MB) written at once while nobody reads the
    // bridge's stdout for two seconds, locally and over a real sshd: every
    // line once, in order, each whole.
    for via in Via::both() {
        let script = "awk 'BEGIN { for (i = 1; i <= 200000; i++) \
                      printf \"{\\\"n\\\":%d,\\\"pad\\\":\\\"%s\\\"}\\n\", i, \
                      \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\" }'";
        let mut b = Command::new(client_bin())
            .args(via.flags())
            .args(["mcp", "stdio", "--", "sh", "-c", script])
            .env("RUST_BACKTRACE", "0")
            .env_remove("EXECUTOR_TARGET")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the bridge");
        std::thread::sleep(Duration::from_secs(2));
        let stdout = BufReader::new(b.stdout.take().unwrap());
        let mut n = 0u64;
        for line in stdout.lines() {
            let line = line.unwrap();
            n += 1;
            let v: serde_json::Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("{}: line {n} is not whole: {e}", via.name()));
            assert_eq!(v["n"], n, "{}", via.name());
        }
        assert_eq!(n, 200_000, "{}", via.name());
        // stdin held open: the job ended first, which fails the bridge.
        let stdin = b.stdin.take();
        let out = finish(b, Duration::from_secs(60));
        drop(stdin);
        assert_eq!(out.status.code(), Some(1), "{} {}", via.name(), text(&out));
    }
}

#[test]
fn a_killed_bridge_leaves_no_job_on_the_host() {
    // SIGKILL gives the bridge no chance to end the job: the agent ends
    // the session (and its jobs) when the connection goes with it.
    let mut b = bridge(&[], "echo $$; exec sleep 1000");
    let mut first = String::new();
    BufReader::new(b.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let job: u32 = first.trim().parse().expect("the job's pid");
    assert!(alive(job));
    b.kill().unwrap();
    b.wait().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    assert!(
        rt.block_on(wait_dead(job, WAIT)),
        "the job {job} outlived the bridge"
    );
}

#[test]
fn pipelined_lines_reach_the_server_whole_and_in_order() {
    // 10,000 requests written at once (sent in batches of whole lines) to
    // a server that echoes them: each arrives once, in order.
    let mut b = bridge(&[], "exec cat");
    let mut stdin = b.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        for i in 0..10_000 {
            writeln!(
                stdin,
                "{{\"jsonrpc\":\"2.0\",\"id\":{i},\"method\":\"ping\"}}"
            )
            .unwrap();
        }
    });
    let stdout = BufReader::new(b.stdout.take().unwrap());
    let mut n = 0u64;
    for line in stdout.lines() {
        let v: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        assert_eq!(v["id"], n);
        n += 1;
    }
    writer.join().unwrap();
    assert_eq!(n, 10_000);
    let out = finish(b, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

#[test]
fn a_10_mib_tool_result_arrives_whole() {
    let Some(python) = python_with_sdk() else {
        return;
    };
    let dir = scripts();
    let n = 10 * 1024 * 1024;
    let extra = serde_json::json!({ "n": n }).to_string();
    let out = finish(sdk_client(&python, &dir, &[], "big", &extra), SCENARIO);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        results(&out).get("big").map(String::as_str),
        Some(format!("{n} True").as_str()),
        "{}",
        text(&out)
    );
}

#[test]
fn a_thousand_concurrent_calls_are_each_answered_once_by_id() {
    let Some(python) = python_with_sdk() else {
        return;
    };
    let dir = scripts();
    let out = finish(
        sdk_client(&python, &dir, &[], "pipelined", r#"{"n": 1000}"#),
        SCENARIO,
    );
    assert!(out.status.success(), "{}", text(&out));
    // 1,000 answers, each the sum asked for by the request of its id.
    assert_eq!(
        results(&out).get("pipelined").map(String::as_str),
        Some("1000 1000"),
        "{}",
        text(&out)
    );
}

#[test]
fn net_deny_stops_the_server_connecting_out() {
    let Some(python) = python_with_sdk() else {
        return;
    };
    let dir = scripts();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        for _ in listener.incoming() {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    let extra = serde_json::json!({
        "calls": [["connect", {"host": "127.0.0.1", "port": port}]]
    })
    .to_string();
    let connect = |flags: &[&str]| {
        let out = finish(sdk_client(&python, &dir, flags, "calls", &extra), SCENARIO);
        assert!(out.status.success(), "{flags:?}: {}", text(&out));
        let r = results(&out);
        let v: serde_json::Value = serde_json::from_str(
            r.get("call0")
                .unwrap_or_else(|| panic!("{flags:?}: {}", text(&out))),
        )
        .unwrap();
        v["text"].as_str().unwrap().to_string()
    };
    // Positive control: without the flag the same tool connects.
    assert_eq!(connect(&[]), "connected");
    let before = accepted.load(std::sync::atomic::Ordering::SeqCst);
    assert!(before >= 1);
    let denied = connect(&["--net", "deny"]);
    assert!(denied.starts_with("error:"), "{denied}");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), before);
}

/// `@modelcontextprotocol/server-filesystem`'s entry point, installed with
/// `npm install --prefix /opt/mcp-fs @modelcontextprotocol/server-filesystem`
/// ($EXECUTOR_MCP_FS overrides the prefix), and node; `None` (and a skip
/// that `EXECUTOR_REQUIRE_ALL=1` fails) when either is missing.
fn server_filesystem() -> Option<(String, String)> {
    let prefix = std::env::var("EXECUTOR_MCP_FS").unwrap_or_else(|_| "/opt/mcp-fs".into());
    let entry = std::path::Path::new(&prefix)
        .join("node_modules/@modelcontextprotocol/server-filesystem/dist/index.js");
    let node = Command::new("sh")
        .args(["-c", "command -v node"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    match node {
        Some(node) if entry.is_file() => Some((
            std::fs::canonicalize(node)
                .unwrap()
                .to_string_lossy()
                .into_owned(),
            entry.to_string_lossy().into_owned(),
        )),
        _ => {
            prerequisite_missing(&format!(
                "node and @modelcontextprotocol/server-filesystem in {prefix} \
                 (npm install --prefix {prefix} @modelcontextprotocol/server-filesystem)"
            ));
            None
        }
    }
}

#[test]
fn server_filesystem_is_held_to_its_root_by_itself_and_by_the_sandbox() {
    let Some(python) = python_with_sdk() else {
        return;
    };
    let Some((node, entry)) = server_filesystem() else {
        return;
    };
    let dir = scripts();
    // d/root/inside.txt, d/outside.txt, d/root/link -> d/outside.txt.
    let d = std::fs::canonicalize(unique_tempdir("mcp-fs")).unwrap();
    let root = d.join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("inside.txt"), "inside").unwrap();
    std::fs::write(d.join("outside.txt"), "outside").unwrap();
    std::os::unix::fs::symlink(d.join("outside.txt"), root.join("link")).unwrap();
    let p = |f: &std::path::Path| f.to_string_lossy().into_owned();
    let read = |path: std::path::PathBuf| serde_json::json!(["read_text_file", {"path": path}]);
    let extra = serde_json::json!({ "calls": [
        read(root.join("inside.txt")),
        read(d.join("outside.txt")),
        read(root.join("link")),
    ]})
    .to_string();
    // What node and the server read, and `root`: nothing else of `d`.
    let prefix = std::path::Path::new(&entry).ancestors().nth(5).unwrap();
    let mut sandbox: Vec<String> = vec![];
    for r in ["/usr", "/lib", "/lib64", "/etc", "/bin"] {
        if std::path::Path::new(r).exists() {
            sandbox.extend(["--ro".into(), r.into()]);
        }
    }
    sandbox.extend(["--ro".into(), p(prefix), "--ro".into(), node.clone()]);
    sandbox.extend(["--rw".into(), p(&root), "--net".into(), "deny".into()]);
    // The server allowed `allowed`, in the sandbox `sandboxed` or not.
    let run = |allowed: &std::path::Path, sandboxed: bool| {
        let mut args: Vec<String> = vec![
            "--target".into(),
            "local".into(),
            "mcp".into(),
            "stdio".into(),
        ];
        if sandboxed {
            args.extend(sandbox.iter().cloned());
            args.extend(["--cwd".into(), p(&root)]);
        }
        args.extend(["--".into(), node.clone(), entry.clone(), p(allowed)]);
        let args = serde_json::to_string(&args).unwrap();
        let out = finish(
            sdk_client_with(&python, &dir, &args, "calls", &extra),
            SCENARIO,
        );
        assert!(out.status.success(), "{}", text(&out));
        let r = results(&out);
        (0..3)
            .map(|i| {
                let v: serde_json::Value = serde_json::from_str(
                    r.get(&format!("call{i}"))
                        .unwrap_or_else(|| panic!("call{i}: {}", text(&out))),
                )
                .unwrap();
                (
                    v["error"].as_bool().unwrap(),
                    v["text"].as_str().unwrap().to_string(),
                )
            })
            .collect::<Vec<_>>()
    };
    // Its own check, unconfined: allowed `root`, the server itself refuses
    // the file outside and the link out (it resolves the link).
    let own = run(&root, false);
    assert_eq!(own[0], (false, "inside".to_string()), "{own:?}");
    assert!(own[1].0 && own[1].1.contains("Access denied"), "{own:?}");
    assert!(
        own[2].0 && own[2].1.contains("Access denied - symlink target outside"),
        "{own:?}"
    );
    // The same under the sandbox granting `root`: inside still reads.
    let both = run(&root, true);
    assert_eq!(both[0], (false, "inside".to_string()), "{both:?}");
    assert!(both[1].0 && both[2].0, "{both:?}");
    // Allowed the whole of `d` and unconfined (the positive control), the
    // server follows the link and reads the file outside `root`.
    let wide = run(&d, false);
    assert_eq!(wide[1], (false, "outside".to_string()), "{wide:?}");
    assert_eq!(wide[2], (false, "outside".to_string()), "{wide:?}");
    // Allowed `d` but sandboxed to `root`: the server's check passes and
    // only the sandbox stops the reads outside, the link included.
    let confined = run(&d, true);
    assert_eq!(confined[0], (false, "inside".to_string()), "{confined:?}");
    for c in &confined[1..] {
        assert!(c.0, "{confined:?}");
        assert!(!c.1.contains("Access denied"), "{confined:?}");
    }
}

/// The pid of the one `ssh` the bridge under `parent` (the SDK client, or
/// the bridge itself when `parent` is one) runs now.
fn bridge_ssh(bridge: u32) -> u32 {
    let ssh: Vec<u32> = children(bridge)
        .into_iter()
        .filter(|&p| comm(p) == "ssh")
        .collect();
    assert_eq!(ssh.len(), 1, "the bridge's ssh: {ssh:?}");
    ssh[0]
}

fn sigkill(pid: u32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
}

/// A TCP relay on 127.0.0.1 to a port (the test sshd): the link between
/// the bridge's ssh and sshd, which the test can make fail as a network
/// does: [`Link::hold`] stops passing the server's bytes back (they are
/// read and lost), [`Link::cut`] then closes every connection open so far.
struct Link {
    port: u16,
    held: std::sync::Arc<std::sync::atomic::AtomicBool>,
    open: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl Link {
    fn to(upstream: u16) -> Link {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let link = Link {
            port,
            held: Default::default(),
            open: Default::default(),
        };
        let (held, open) = (link.held.clone(), link.open.clone());
        std::thread::spawn(move || {
            for down in listener.incoming() {
                let Ok(down) = down else { return };
                let up = std::net::TcpStream::connect(("127.0.0.1", upstream)).unwrap();
                open.lock()
                    .unwrap()
                    .extend([down.try_clone().unwrap(), up.try_clone().unwrap()]);
                let (mut up_r, mut down_w) = (up.try_clone().unwrap(), down.try_clone().unwrap());
                let (mut down_r, mut up_w) = (down, up);
                std::thread::spawn(move || std::io::copy(&mut down_r, &mut up_w));
                let held = held.clone();
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        match up_r.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(_) if held.load(Ordering::SeqCst) => {}
                            Ok(n) => {
                                if down_w.write_all(&buf[..n]).is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        link
    }

    fn hold(&self) {
        self.held.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Close the connections open so far; later ones pass freely.
    fn cut(&self) {
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        self.held.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn over_sshd_a_dropped_connection_is_resumed_with_each_message_once() {
    // The SDK client streams 150 numbered progress notifications from the
    // server while it sends batches of calls the other way, through a link
    // to sshd that fails mid-stream: first it loses everything coming
    // back for half a second (requests reach the server, their answers
    // and notifications are lost on the way), then it closes. The bridge
    // connects again and resumes the session: every number arrives once
    // and in order, every call reaches the server once (the write cut off
    // is not done twice) and gets its own answer, and the server ends with
    // the client.
    let Some(python) = python_with_sdk() else {
        return;
    };
    let dir = scripts();
    let sshd = executor_tests::sshd::Sshd::start("", "");
    let link = Link::to(sshd.port);
    let mut args = ssh_flags(&sshd, &executor_bin().to_string_lossy());
    let p = args.iter().position(|a| a == "-p").unwrap();
    args[p + 1] = link.port.to_string();
    args.extend(["mcp", "stdio", "--"].map(String::from));
    args.push(python.clone());
    args.push(dir.join("server.py").to_string_lossy().into_owned());
    let args = serde_json::to_string(&args).unwrap();
    let extra = r#"{"count": 150, "delay": 0.02}"#;
    let mut client = sdk_client_with(&python, &dir, &args, "numbered", extra);
    let mut lines = BufReader::new(client.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    loop {
        let line = lines
            .next()
            .expect("the client ended before the stream began")
            .unwrap();
        seen.push(line.clone());
        if line == "streaming: 1" {
            break;
        }
    }
    let server: u32 = seen
        .iter()
        .find_map(|l| l.strip_prefix("pid: "))
        .expect("the server's pid")
        .parse()
        .unwrap();
    link.hold();
    std::thread::sleep(Duration::from_millis(500));
    link.cut();
    // Read on in a thread: `finish` bounds the whole run.
    let rest = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());
    let out = finish(client, SCENARIO);
    seen.extend(rest.join().unwrap());
    let all = format!("{}\n{}", seen.join("\n"), text(&out));
    let r: std::collections::BTreeMap<_, _> =
        seen.iter().filter_map(|l| l.split_once(": ")).collect();
    assert!(out.status.success(), "{all}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("resuming session"),
        "no drop seen: {all}"
    );
    assert_eq!(r.get("numbered"), Some(&"done 150 150 True"), "{all}");
    // Sent, received by the server, distinct ids received: all equal.
    let ticks: Vec<u64> = r["ticks"].split(' ').map(|n| n.parse().unwrap()).collect();
    assert!(
        ticks[0] > 0 && ticks.iter().all(|&t| t == ticks[0]),
        "{all}"
    );
    assert_eq!(r.get("answers"), Some(&"True True"), "{all}");
    assert_eq!(r.get("end"), Some(&"ok"), "{all}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    assert!(
        rt.block_on(wait_dead(server, WAIT)),
        "the server {server} outlived its client"
    );
}

#[test]
fn over_sshd_a_drop_longer_than_reconnect_ends_the_bridge_and_the_job() {
    // The key is withdrawn from sshd, then the bridge's ssh killed: no
    // resume gets in within `--reconnect 2`, so the bridge exits 255
    // saying so, and the host ends the session (and the server) once it
    // was detached that long.
    let sshd = executor_tests::sshd::Sshd::start("", "");
    let mut b = Command::new(client_bin())
        .args(ssh_flags(&sshd, &executor_bin().to_string_lossy()))
        .args(["mcp", "stdio", "--reconnect", "2", "--"])
        .args(["sh", "-c", "echo $$; exec cat"])
        .env("RUST_BACKTRACE", "0")
        .env_remove("EXECUTOR_TARGET")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the bridge");
    let mut first = String::new();
    BufReader::new(b.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let job: u32 = first.trim().parse().expect("the job's pid");
    assert!(alive(job));
    let host = agent_of_job(job);
    let cmdline = std::fs::read(format!("/proc/{host}/cmdline")).unwrap();
    assert!(
        String::from_utf8_lossy(&cmdline).contains("session-host"),
        "not the session host: {cmdline:?}"
    );
    std::fs::write(sshd.dir.join("authorized_keys"), "").unwrap();
    sigkill(bridge_ssh(b.id()));
    let dropped = Instant::now();
    // stdin held open: only the drop ends the bridge.
    let stdin = b.stdin.take();
    let out = finish(b, Duration::from_secs(30));
    drop(stdin);
    let waited = dropped.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(255), "{}", text(&out));
    assert!(
        err.contains("could not resume session") && err.contains("within --reconnect 2 s"),
        "{err}"
    );
    assert!(waited >= Duration::from_secs(2), "{waited:?}");
    // The session's TTL (2 s) and the kill after SIGTERM (2 s) end the job,
    // and the session host with it.
    let rt = tokio::runtime::Runtime::new().unwrap();
    assert!(
        rt.block_on(wait_dead(job, WAIT)),
        "the job {job} outlived the session's TTL"
    );
    assert!(
        rt.block_on(wait_dead(host, WAIT)),
        "the session host {host} outlived its TTL"
    );
}
