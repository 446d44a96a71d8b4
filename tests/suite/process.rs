//! Processes (docs/PROTOCOL.md §3) against the real binary.

use executor_client::{Client, ClientOptions, ErrorCode};
use executor_protocol::types::process::*;
use executor_protocol::types::Empty;
use executor_tests::*;
use std::collections::BTreeMap;
use std::time::Duration;

use executor_tests::path_env as env;

fn params(argv: &[&str]) -> ProcessStartParams {
    ProcessStartParams::new(argv.iter().map(|s| s.to_string()).collect(), "/", env())
}

/// Run to completion: (stdout, stderr, pty, exit).
async fn run(
    c: &Client,
    p: &ProcessStartParams,
) -> (String, String, String, executor_client::ExitStatus) {
    let mut proc = c.start(p).await.expect("start");
    let (mut out, mut err, mut pty) = (Vec::new(), Vec::new(), Vec::new());
    let mut seq = 0;
    while let Some(ch) = tokio::time::timeout(WAIT, proc.next_output())
        .await
        .expect("in time")
        .expect("output")
    {
        assert_eq!(ch.seq, seq, "seq from 0 without gaps");
        seq += 1;
        match ch.stream {
            OutputStream::Stdout => out.extend_from_slice(&ch.data),
            OutputStream::Stderr => err.extend_from_slice(&ch.data),
            OutputStream::Pty => pty.extend_from_slice(&ch.data),
        }
    }
    let s = |v: Vec<u8>| String::from_utf8_lossy(&v).into_owned();
    (s(out), s(err), s(pty), proc.exit_status().expect("exit"))
}

#[tokio::test]
async fn echo_exit_codes_and_streams() {
    let c = local_client().await;
    echo_exit_codes_and_streams_on(&c).await;
    c.close().await.unwrap();
}

/// Run by every transport (tests/suite/transports.rs).
pub async fn echo_exit_codes_and_streams_on(c: &Client) {
    let (out, err, _, st) = run(c, &params(&["sh", "-c", "echo out; echo err >&2; exit 3"])).await;
    assert_eq!((out.as_str(), err.as_str()), ("out\n", "err\n"));
    assert_eq!(st.code, Some(3));
    assert_eq!(st.signal, None);
    let (out, _, _, st) = run(c, &params(&["echo", "hello", "world"])).await;
    assert_eq!(out, "hello world\n");
    assert!(st.success());
}

#[tokio::test]
async fn death_by_signal_is_reported_as_signal() {
    let c = local_client().await;
    death_by_signal_is_reported_as_signal_on(&c).await;
    c.close().await.unwrap();
}

/// Run by every transport (tests/suite/transports.rs).
pub async fn death_by_signal_is_reported_as_signal_on(c: &Client) {
    let (_, _, _, st) = run(c, &params(&["sh", "-c", "kill -TERM $$"])).await;
    assert_eq!(st.code, None);
    assert_eq!(st.signal.as_deref(), Some("SIGTERM"));
    assert_eq!(st.signal_number, Some(15));
}

#[tokio::test]
async fn the_environment_is_exactly_the_requests() {
    // The agent has a marker in its own environment; the job must not.
    let mut agent = tokio::process::Command::new(executor_bin());
    agent.env("EXECUTOR_TEST_MARKER", "agent-only");
    let c = Client::spawn(agent, ClientOptions::default())
        .await
        .unwrap();
    let mut p = params(&["/usr/bin/env"]);
    p.env = BTreeMap::from([("A".to_string(), "1".to_string())]);
    let (out, _, _, st) = run(&c, &p).await;
    assert!(st.success());
    assert_eq!(out, "A=1\n");
}

#[tokio::test]
async fn cwd_and_arg0() {
    let c = local_client().await;
    let dir = std::env::temp_dir();
    let mut p = params(&["pwd"]);
    p.cwd = dir.to_str().unwrap().into();
    let (out, _, _, _) = run(&c, &p).await;
    assert_eq!(
        out.trim_end(),
        std::fs::canonicalize(&dir).unwrap().to_str().unwrap()
    );
    // arg0 is what the program sees; argv[0] names what runs.
    let mut p = params(&["sh", "-c", "echo $0"]);
    p.arg0 = Some("custom-name".into());
    let (out, _, _, _) = run(&c, &p).await;
    // `sh -c` prints its own $0 (the script name) which is argv[2]'s successor;
    // check through /proc instead.
    let _ = out;
    let mut p = params(&["sleep", "5"]);
    p.arg0 = Some("renamed-sleep".into());
    let proc = c.start(&p).await.unwrap();
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", proc.pid())).unwrap();
    assert!(
        cmdline.starts_with(b"renamed-sleep\0"),
        "{:?}",
        String::from_utf8_lossy(&cmdline)
    );
    let exe = std::fs::read_link(format!("/proc/{}/exe", proc.pid())).unwrap();
    assert!(exe.to_str().unwrap().ends_with("/sleep"), "{exe:?}");
    proc.signal(SignalName::Kill).await.unwrap();
    assert_eq!(
        proc.wait().await.unwrap().signal.as_deref(),
        Some("SIGKILL")
    );
}

#[tokio::test]
async fn missing_cwd_or_program_is_an_error_and_nothing_runs() {
    let c = local_client().await;
    let mut p = params(&["true"]);
    p.cwd = "/no/such/dir".into();
    let e = c.start(&p).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotFound));
    let Some(executor_client::Error::Remote(w)) = Some(e) else {
        unreachable!()
    };
    assert_eq!(
        w.data_get("path").and_then(|v| v.as_str()),
        Some("/no/such/dir")
    );
    let e = c
        .start(&params(&["no-such-program-xyz"]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotFound));
    let e = c.start(&params(&["/no/such/bin"])).await.unwrap_err();
    let executor_client::Error::Remote(w) = e else {
        panic!()
    };
    assert_eq!(
        w.data_get("path").and_then(|v| v.as_str()),
        Some("/no/such/bin")
    );
    // Not executable: exec fails in the trampoline, nothing runs.
    let dir = unique_tempdir("proc");
    let file = dir.join("not-executable");
    std::fs::write(&file, "#!/bin/sh\necho ran\n").unwrap();
    let e = c
        .start(&params(&[file.to_str().unwrap()]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::PermissionDenied));
    assert!(
        c.call(&executor_protocol::types::process::ProcessListParams {})
            .await
            .unwrap()
            .processes
            .is_empty(),
        "nothing was registered"
    );
    // Relative cwd and empty argv are invalid params naming the field.
    let mut p = params(&["true"]);
    p.cwd = "relative".into();
    let executor_client::Error::Remote(w) = c.start(&p).await.unwrap_err() else {
        panic!()
    };
    assert_eq!(w.data_get("field").and_then(|v| v.as_str()), Some("cwd"));
    let executor_client::Error::Remote(w) = c.start(&params(&[])).await.unwrap_err() else {
        panic!()
    };
    assert_eq!(w.data_get("field").and_then(|v| v.as_str()), Some("argv"));
}

#[tokio::test]
async fn cat_echoes_stdin_until_close() {
    let c = local_client().await;
    cat_echoes_stdin_until_close_on(&c).await;
    c.close().await.unwrap();
}

/// Run by every transport (tests/suite/transports.rs).
pub async fn cat_echoes_stdin_until_close_on(c: &Client) {
    let mut proc = c.start(&params(&["cat"])).await.unwrap();
    proc.write(b"hello ").await.unwrap();
    proc.write(b"there").await.unwrap();
    proc.close_stdin().await.unwrap();
    let mut got = Vec::new();
    while let Some(ch) = proc.next_output().await.unwrap() {
        got.extend_from_slice(&ch.data);
    }
    assert_eq!(got, b"hello there");
    assert!(proc.exit_status().unwrap().success());
    // stdin null: cat sees EOF at once.
    let mut p = params(&["cat"]);
    p.stdin = StdinMode::Null;
    let (out, _, _, st) = run(c, &p).await;
    assert_eq!((out.as_str(), st.code), ("", Some(0)));
}

#[tokio::test]
async fn tty_has_a_pts_and_resize_is_seen() {
    let c = local_client().await;
    tty_has_a_pts_and_resize_is_seen_on(&c).await;
    c.close().await.unwrap();
}

/// Run by every transport (tests/suite/transports.rs).
pub async fn tty_has_a_pts_and_resize_is_seen_on(c: &Client) {
    let mut p = params(&["sh", "-c", "tty; stty size"]);
    p.tty = true;
    p.pty_size = Some(PtySize {
        rows: 33,
        cols: 101,
    });
    let (out, err, pty, st) = run(c, &p).await;
    assert!(st.success(), "{pty}");
    assert!(out.is_empty() && err.is_empty());
    assert!(pty.starts_with("/dev/pts/"), "{pty:?}");
    assert!(pty.contains("33 101\r\n"), "{pty:?}");
    // Resize while running: `stty size` after the change sees it.
    let mut p = params(&["sh", "-c", "read x; stty size"]);
    p.tty = true;
    let mut proc = c.start(&p).await.unwrap();
    proc.resize(50, 132).await.unwrap();
    proc.write(b"go\n").await.unwrap();
    let mut got = Vec::new();
    while let Some(ch) = proc.next_output().await.unwrap() {
        assert_eq!(ch.stream, OutputStream::Pty);
        got.extend_from_slice(&ch.data);
    }
    assert!(
        String::from_utf8_lossy(&got).contains("50 132"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    // A pipe process has no terminal to resize.
    let proc = c.start(&params(&["sleep", "5"])).await.unwrap();
    let e = proc.resize(10, 10).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::InvalidParams));
    proc.signal(SignalName::Kill).await.unwrap();
}

#[tokio::test]
async fn interrupt_reaches_the_trap_and_its_exit_is_reported() {
    let c = local_client().await;
    interrupt_reaches_the_trap_and_its_exit_is_reported_on(&c).await;
    c.close().await.unwrap();
}

/// Run by every transport (tests/suite/transports.rs).
pub async fn interrupt_reaches_the_trap_and_its_exit_is_reported_on(c: &Client) {
    let mut proc = c
        .start(&params(&[
            "sh",
            "-c",
            "trap 'echo got-int; exit 7' INT; echo ready; while :; do sleep 0.05; done",
        ]))
        .await
        .unwrap();
    let first = proc.next_output().await.unwrap().unwrap();
    assert_eq!(&first.data[..], b"ready\n");
    proc.signal(SignalName::Interrupt).await.unwrap();
    let mut got = Vec::new();
    while let Some(ch) = tokio::time::timeout(WAIT, proc.next_output())
        .await
        .unwrap()
        .unwrap()
    {
        got.extend_from_slice(&ch.data);
    }
    assert_eq!(String::from_utf8_lossy(&got), "got-int\n");
    assert_eq!(proc.exit_status().unwrap().code, Some(7));
}

#[tokio::test]
async fn every_signal_name_is_delivered_to_the_group() {
    let c = local_client().await;
    every_signal_name_is_delivered_to_the_group_on(&c).await;
    c.close().await.unwrap();
}

/// Run by every transport (tests/suite/transports.rs).
pub async fn every_signal_name_is_delivered_to_the_group_on(c: &Client) {
    for (name, num) in [
        (SignalName::Terminate, 15),
        (SignalName::Hangup, 1),
        (SignalName::Quit, 3),
        (SignalName::User1, 10),
        (SignalName::User2, 12),
        (SignalName::Kill, 9),
    ] {
        let mut proc = c
            .start(&params(&["sh", "-c", "echo up; exec sleep 100"]))
            .await
            .unwrap();
        proc.next_output().await.unwrap();
        proc.signal(name).await.unwrap();
        let st = tokio::time::timeout(WAIT, proc.wait())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(st.signal_number, Some(num), "{name:?}");
    }
    // stop / continue: the job pauses and resumes.
    let mut proc = c
        .start(&params(&["sh", "-c", "echo a; read x; echo b"]))
        .await
        .unwrap();
    proc.next_output().await.unwrap();
    proc.signal(SignalName::Stop).await.unwrap();
    // kill(2) returns before the target is scheduled to stop: poll briefly.
    let state_of = |pid: u32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        stat.rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while state_of(proc.pid()) != "T" && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(state_of(proc.pid()), "T", "stopped");
    proc.signal(SignalName::Continue).await.unwrap();
    proc.write(b"\n").await.unwrap();
    let ch = proc.next_output().await.unwrap().unwrap();
    assert_eq!(&ch.data[..], b"b\n");
}

/// The main process exits on its own, leaving a child in its group and a
/// grandchild in a session of its own (`setsid`, re-parented to the
/// supervisor): both are killed once the exit is collected, and the exit
/// status is the main process's.
#[tokio::test]
async fn what_the_main_process_leaves_behind_dies_when_it_exits() {
    let c = local_client().await;
    let mut proc = c
        .start(&params(&[
            "sh",
            "-c",
            "sleep 1000 & echo $!; setsid sh -c 'sleep 1000 & echo $!; wait' & sleep 0.3; exit 7",
        ]))
        .await
        .unwrap();
    let mut out = String::new();
    while out.lines().count() < 2 {
        let ch = proc.next_output().await.unwrap().unwrap();
        out.push_str(&String::from_utf8_lossy(&ch.data));
    }
    let pids: Vec<u32> = out.lines().map(|l| l.trim().parse().unwrap()).collect();
    assert!(pids.iter().all(|p| alive(*p)), "{pids:?}");
    let st = proc.wait().await.unwrap();
    assert_eq!(st.code, Some(7), "{st:?}");
    for p in pids {
        assert!(
            wait_dead(p, Duration::from_secs(5)).await,
            "{p} survived the job"
        );
    }
}

#[tokio::test]
async fn a_grandchild_dies_with_its_group() {
    let c = local_client().await;
    let mut proc = c
        .start(&params(&["sh", "-c", "sleep 1000 & echo $!; wait"]))
        .await
        .unwrap();
    let ch = proc.next_output().await.unwrap().unwrap();
    let gc: u32 = String::from_utf8_lossy(&ch.data).trim().parse().unwrap();
    assert!(alive(gc));
    proc.signal(SignalName::Kill).await.unwrap();
    proc.wait().await.unwrap();
    assert!(
        wait_dead(gc, Duration::from_secs(5)).await,
        "grandchild {gc} survived"
    );
}

/// Start a job whose grandchild escapes the group and the session
/// (`setsid` + double fork); returns (agent, job pid, escaped pid).
async fn agent_with_escaping_grandchild() -> (RawAgent, u32, u32) {
    let dir = unique_tempdir("proc");
    let pidfile = dir.join("gc");
    let script = format!(
        "setsid sh -c '(sleep 1000 & echo $! > {}) ' ; echo started; sleep 1000",
        pidfile.display()
    );
    let mut a = RawAgent::initialized().await;
    let r = a
        .request(
            1,
            executor_protocol::methods::PROCESS_START,
            &params(&["sh", "-c", &script]),
        )
        .await;
    let pid = path(&r, "result.pid")
        .and_then(|v| v.as_u64())
        .expect("pid") as u32;
    let deadline = std::time::Instant::now() + WAIT;
    let gc = loop {
        if let Some(gc) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
        {
            break gc;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "grandchild pid never written"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(alive(pid) && alive(gc));
    (a, pid, gc)
}

#[tokio::test]
async fn closing_the_transport_kills_jobs_and_their_children() {
    let (mut a, pid, gc) = agent_with_escaping_grandchild().await;
    let start = std::time::Instant::now();
    assert_eq!(a.close_and_wait().await.code(), Some(0));
    assert!(
        wait_dead(pid, Duration::from_secs(5)).await,
        "job {pid} survived"
    );
    assert!(
        wait_dead(gc, Duration::from_secs(5)).await,
        "escaped grandchild {gc} survived"
    );
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn sigkill_of_the_agent_leaves_nothing_alive() {
    let (mut a, pid, gc) = agent_with_escaping_grandchild().await;
    a.child.start_kill().unwrap();
    a.wait().await;
    assert!(
        wait_dead(pid, Duration::from_secs(5)).await,
        "job {pid} survived the agent's SIGKILL"
    );
    assert!(
        wait_dead(gc, Duration::from_secs(5)).await,
        "escaped grandchild {gc} survived the agent's SIGKILL"
    );
}

#[tokio::test]
async fn a_job_ignoring_sigterm_is_killed_after_the_grace() {
    let mut a = RawAgent::initialized().await;
    let r = a
        .request(
            1,
            executor_protocol::methods::PROCESS_START,
            &params(&[
                "sh",
                "-c",
                "trap '' TERM; echo x; while :; do sleep 0.05; done",
            ]),
        )
        .await;
    let pid = path(&r, "result.pid").and_then(|v| v.as_u64()).unwrap() as u32;
    a.close_and_wait().await;
    assert!(wait_dead(pid, Duration::from_secs(5)).await);
}

/// Direct children of `pid`.
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .flatten()
                .flat_map(|t| {
                    std::fs::read_to_string(t.path().join("children"))
                        .unwrap_or_default()
                        .split_whitespace()
                        .filter_map(|p| p.parse().ok())
                        .collect::<Vec<u32>>()
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_flood_never_blocks_other_requests_and_memory_stays_bounded() {
    let mut a = RawAgent::initialized().await;
    let agent_pid = a.child.id().unwrap();
    a.send_request(
        1,
        executor_protocol::methods::PROCESS_START,
        &params(&["yes", "flood"]),
    )
    .await;
    // Do not read while `yes` writes 100 MiB: far more than the agent's
    // notification queue, output buffer and stdout pipe can hold together.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        // agent -> spawner -> supervisor -> yes
        let written = children(agent_pid)
            .into_iter()
            .flat_map(children)
            .flat_map(children)
            .map(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/io"))
                    .unwrap_or_default()
                    .lines()
                    .find_map(|l| {
                        l.strip_prefix("wchar: ")
                            .and_then(|v| v.parse::<u64>().ok())
                    })
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0);
        if written > 100 << 20 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the flood never got going ({written} bytes)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rss = status_kib(agent_pid, "VmRSS");
    assert!(
        rss < 64 * 1024,
        "agent RSS {rss} KiB while the client ignores a flood"
    );
    // Now ask for something else and the kill; both must be answered.
    a.send_request(2, executor_protocol::methods::PROCESS_LIST, &Empty {})
        .await;
    a.send_request(
        3,
        executor_protocol::methods::PROCESS_SIGNAL,
        &ProcessSignalParams {
            process_id: "proc-1".into(),
            signal: SignalName::Kill,
        },
    )
    .await;
    let mut lagged = false;
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut answered = std::collections::BTreeSet::new();
    let mut exited = false;
    while !(answered.contains(&2) && answered.contains(&3) && exited) {
        let v = a.recv().await.expect("agent alive");
        if let Some(id) = get(&v, "id").and_then(|v| v.as_u64()) {
            assert!(get(&v, "result").is_some(), "{v:?}");
            answered.insert(id);
        }
        let method = get(&v, "method").and_then(|m| m.as_str());
        *seen
            .entry(method.unwrap_or("response").to_string())
            .or_default() += 1;
        match method {
            Some("process/lagged") => lagged = true,
            Some("process/exited") => {
                assert_eq!(
                    path(&v, "params.signal").and_then(|s| s.as_str()),
                    Some("SIGKILL")
                );
                exited = true;
            }
            _ => {}
        }
    }
    if !lagged {
        let _ = a.child.start_kill();
        a.wait().await;
        let log = a.stderr().await;
        panic!("a flooding process is marked lagged; saw {seen:?}; agent log: {log}");
    }
    let rss = status_kib(agent_pid, "VmRSS");
    assert!(rss < 64 * 1024, "agent RSS {rss} KiB after the flood");
    // The buffer overflowed: reading from the start says what was dropped.
    let r = a
        .request(
            4,
            executor_protocol::methods::PROCESS_READ,
            &ProcessReadParams {
                process_id: "proc-1".into(),
                after_seq: None,
                max_bytes: Some(1024),
                wait_ms: None,
            },
        )
        .await;
    let dropped = path(&r, "result.dropped_before")
        .and_then(|v| v.as_u64())
        .expect("dropped_before");
    let first = path(&r, "result.chunks")
        .and_then(|c| c.as_array())
        .unwrap()[0]
        .clone();
    assert_eq!(get(&first, "seq").and_then(|v| v.as_u64()), Some(dropped));
    assert!(dropped > 0);
}

#[tokio::test]
async fn read_long_polls_and_cancel_answers_cancelled() {
    let mut a = RawAgent::initialized().await;
    let mut p = params(&["sh", "-c", "sleep 1; echo late"]);
    p.notify = false;
    let r = a
        .request(1, executor_protocol::methods::PROCESS_START, &p)
        .await;
    let id = path(&r, "result.process_id")
        .and_then(|v| v.as_str())
        .unwrap()
        .to_string();
    // A long poll returns when output arrives.
    let t = std::time::Instant::now();
    let r = a
        .request(
            2,
            executor_protocol::methods::PROCESS_READ,
            &ProcessReadParams {
                process_id: id.clone(),
                after_seq: None,
                max_bytes: None,
                wait_ms: Some(10_000),
            },
        )
        .await;
    assert!(t.elapsed() < Duration::from_secs(8));
    let chunks = path(&r, "result.chunks")
        .and_then(|v| v.as_array())
        .unwrap();
    assert_eq!(
        get(&chunks[0], "data"),
        Some(&rmpv::Value::Binary(b"late\n".to_vec()))
    );
    // A poll on a silent process, cancelled.
    let r = a
        .request(
            3,
            executor_protocol::methods::PROCESS_START,
            &params(&["sleep", "100"]),
        )
        .await;
    let id = path(&r, "result.process_id")
        .and_then(|v| v.as_str())
        .unwrap()
        .to_string();
    a.send_request(
        4,
        executor_protocol::methods::PROCESS_READ,
        &ProcessReadParams {
            process_id: id,
            after_seq: None,
            max_bytes: None,
            wait_ms: Some(60_000),
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Other requests are served meanwhile.
    let r = a
        .request(5, executor_protocol::methods::PROCESS_LIST, &Empty {})
        .await;
    assert!(get(&r, "result").is_some());
    a.send_value(&rmpv::Value::Map(vec![
        ("method".into(), "$/cancel".into()),
        (
            "params".into(),
            rmpv::Value::Map(vec![("id".into(), 4.into())]),
        ),
    ]))
    .await;
    let r = a.response(4).await;
    assert_eq!(error_code(&r), Some("cancelled"));
}

#[tokio::test]
async fn two_hundred_concurrent_processes_keep_their_own_output() {
    let c = local_client().await;
    two_hundred_concurrent_processes_keep_their_own_output_on(&c).await;
    c.close().await.unwrap();
}

/// Run by every transport (tests/suite/transports.rs).
pub async fn two_hundred_concurrent_processes_keep_their_own_output_on(c: &Client) {
    let mut tasks = Vec::new();
    for i in 0..200 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let script = format!(
                "for n in 1 2 3 4 5; do echo job{i}-$n; done; echo err{i} >&2; exit $(( {i} % 7 ))"
            );
            let (out, err, _, st) = run(&c, &params(&["sh", "-c", &script])).await;
            let want: String = (1..=5).map(|n| format!("job{i}-{n}\n")).collect();
            assert_eq!(out, want);
            assert_eq!(err, format!("err{i}\n"));
            assert_eq!(st.code, Some(i % 7));
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test]
async fn process_ids_are_unique_and_listed_with_tags() {
    let c = local_client().await;
    process_ids_are_unique_and_listed_with_tags_on(&c).await;
    c.close().await.unwrap();
}

/// Run by every transport (tests/suite/transports.rs).
pub async fn process_ids_are_unique_and_listed_with_tags_on(c: &Client) {
    let mut p = params(&["sleep", "100"]);
    p.tag = Some("my-tag".into());
    let a = c.start(&p).await.unwrap();
    let b = c.start(&params(&["true"])).await.unwrap();
    assert_ne!(a.id(), b.id());
    let list = c
        .call(&executor_protocol::types::process::ProcessListParams {})
        .await
        .unwrap();
    let entry = list
        .processes
        .iter()
        .find(|x| x.process_id == a.id())
        .unwrap();
    assert_eq!(entry.tag.as_deref(), Some("my-tag"));
    assert_eq!(entry.pid, a.pid());
    assert!(entry.running);
    assert_eq!(entry.argv, vec!["sleep", "100"]);
    let e = c
        .call(&ProcessSignalParams {
            process_id: "proc-999".into(),
            signal: SignalName::Kill,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::UnknownProcess));
    a.signal(SignalName::Kill).await.unwrap();
}

#[tokio::test]
async fn output_buffer_over_64_mib_is_limit_exceeded() {
    let c = local_client().await;
    let mut p = params(&["true"]);
    p.output_buffer_bytes = Some(65 << 20);
    let executor_client::Error::Remote(w) = c.start(&p).await.unwrap_err() else {
        panic!()
    };
    assert_eq!(w.code, ErrorCode::LimitExceeded);
    assert_eq!(
        w.data_get("limit").and_then(|v| v.as_str()),
        Some("output_buffer_bytes")
    );
}

#[tokio::test]
async fn pid_is_the_programs_own() {
    let c = local_client().await;
    let (out, _, _, _) = run(&c, &params(&["sh", "-c", "echo $$"])).await;
    let mut proc = c.start(&params(&["sh", "-c", "echo $$"])).await.unwrap();
    let ch = proc.next_output().await.unwrap().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&ch.data).trim(),
        proc.pid().to_string()
    );
    let _ = out;
}

/// The transport-independent tests, by their test names.
pub mod on {
    pub use super::cat_echoes_stdin_until_close_on as cat_echoes_stdin_until_close;
    pub use super::death_by_signal_is_reported_as_signal_on as death_by_signal_is_reported_as_signal;
    pub use super::echo_exit_codes_and_streams_on as echo_exit_codes_and_streams;
    pub use super::every_signal_name_is_delivered_to_the_group_on as every_signal_name_is_delivered_to_the_group;
    pub use super::interrupt_reaches_the_trap_and_its_exit_is_reported_on as interrupt_reaches_the_trap_and_its_exit_is_reported;
    pub use super::process_ids_are_unique_and_listed_with_tags_on as process_ids_are_unique_and_listed_with_tags;
    pub use super::tty_has_a_pts_and_resize_is_seen_on as tty_has_a_pts_and_resize_is_seen;
    pub use super::two_hundred_concurrent_processes_keep_their_own_output_on as two_hundred_concurrent_processes_keep_their_own_output;
}

/// An idle job costs the agent little memory: its output pumps take a read
/// buffer only once their pipe is readable. (When each pump held its
/// 64 KiB buffer while waiting, a resident page of each made about 16 KiB
/// per job in a release build; now it is about 8 KiB.) Measured as what a
/// second batch of jobs adds to the first: what the agent sets up once
/// (the spawner's first jobs, buffers grown for the first burst, all the
/// more under load) is paid by the first batch, not counted per job.
#[tokio::test]
async fn idle_jobs_hold_no_output_read_buffers() {
    const JOBS: u64 = 300;
    let c = Client::spawn(
        tokio::process::Command::new(executor_bin()),
        ClientOptions::default(),
    )
    .await
    .unwrap();
    let pid = c.transport_pid().unwrap();
    let params = ProcessStartParams::new(vec!["sleep".into(), "1000".into()], "/", env());
    let mut jobs = Vec::new();
    let mut rss = Vec::new();
    for batch in 1..=2 {
        for _ in 0..JOBS {
            jobs.push(c.start(&params).await.unwrap());
        }
        let listed = c
            .call(&executor_protocol::types::process::ProcessListParams {})
            .await
            .unwrap()
            .processes;
        assert_eq!(listed.len() as u64, batch * JOBS);
        assert!(listed.iter().all(|p| p.running));
        rss.push(status_kib(pid, "VmRSS"));
    }
    for j in &jobs {
        j.signal(SignalName::Kill).await.unwrap();
    }
    for j in jobs {
        j.wait().await.unwrap();
    }
    let (first, second) = (rss[0], rss[1]);
    assert!(first > 0 && second > 0, "RSS {first} KiB, {second} KiB");
    let per_job = second.saturating_sub(first) / JOBS;
    eprintln!("{JOBS} more idle jobs: agent RSS {first} KiB → {second} KiB, {per_job} KiB per job");
    assert!(
        per_job < 12,
        "{per_job} KiB of agent RSS per idle job ({JOBS} more jobs: {first} KiB → {second} KiB)"
    );
}
