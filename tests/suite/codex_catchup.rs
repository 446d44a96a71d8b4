//! `executor codex-exec-server` pushing every byte of a job once, in order,
//! with consecutive seqs, where the dialect must read output back from the
//! native job instead of pushing it live: a job whose first output and
//! exit come before its start's answer, and a client that stops reading
//! until the job is done (its queue overflows: live chunks are dropped and
//! read back).

use crate::codex_dialect::Server;
use executor_tests::codex::unbase64;
use executor_tests::executor_bin;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A configuration with `extra` limits and room for the detached sessions
/// every Codex connection leaves behind.
fn config(tag: &str, extra: &str) -> std::path::PathBuf {
    let dir = executor_tests::unique_tempdir(tag);
    let path = dir.join("config.toml");
    std::fs::write(
        &path,
        format!("[limits]\nmax_detached_sessions = 1024\n{extra}"),
    )
    .unwrap();
    path
}

/// What a client saw of one job: its chunks by seq (each stream's bytes),
/// its exit and close seqs.
#[derive(Default, Debug)]
struct Seen {
    chunks: Vec<(u64, String, Vec<u8>)>,
    exited: Option<(u64, i64)>,
    closed: Option<u64>,
}

impl Seen {
    /// Note a notification; whether it was this job's close.
    fn note(&mut self, v: &Value) -> bool {
        let p = &v["params"];
        let seq = p["seq"].as_u64().expect("a seq");
        match v["method"].as_str() {
            Some("process/output") => {
                let data = unbase64(p["chunk"].as_str().expect("a chunk")).expect("base64");
                let stream = p["stream"].as_str().expect("a stream").to_owned();
                self.chunks.push((seq, stream, data));
            }
            Some("process/exited") => {
                assert!(self.exited.is_none(), "a second exit: {v}");
                self.exited = Some((seq, p["exitCode"].as_i64().expect("exitCode")));
            }
            Some("process/closed") => {
                assert!(self.closed.is_none(), "a second close: {v}");
                self.closed = Some(seq);
                return true;
            }
            other => panic!("unexpected notification {other:?}: {v}"),
        }
        false
    }

    /// The seqs are 1..=n in arrival order (output, then exit, then
    /// close): nothing missing, nothing twice. The bytes of `stream`.
    fn checked(&self, what: &str, stream: &str) -> Vec<u8> {
        let mut seqs: Vec<u64> = self.chunks.iter().map(|c| c.0).collect();
        seqs.extend(self.exited.map(|e| e.0));
        seqs.extend(self.closed);
        let want: Vec<u64> = (1..=seqs.len() as u64).collect();
        assert!(
            seqs == want,
            "{what}: seqs in arrival order {seqs:?} (want 1..={})",
            want.len()
        );
        self.chunks
            .iter()
            .filter(|c| c.1 == stream)
            .flat_map(|c| c.2.iter().copied())
            .collect()
    }
}

/// Jobs that write and exit at once: their output and exit may reach the
/// dialect before their start's answer names them. 400 started in one
/// burst each push their two streams' bytes and their exit exactly once,
/// seqs 1..=4 (before, an early job's notifications were dropped: its
/// output was never pushed and its exit never came).
#[test]
fn jobs_heard_of_before_their_starts_answer_are_pushed_whole() {
    let cfg = config("codex-catchup-early", "");
    let mut s = Server::start_with(&["--config".as_ref(), cfg.as_os_str()]);
    s.handshake(None);
    const JOBS: usize = 400;
    for i in 0..JOBS {
        s.send(json!({"id": 10 + i, "method": "process/start", "params": {
            "processId": format!("j{i}"),
            "argv": ["/bin/sh", "-c", format!("echo out-{i}; echo err-{i} >&2; exit 3")],
            "cwd": format!("file://{}", std::env::temp_dir().display()),
            "env": {}, "tty": false, "pipeStdin": false, "arg0": null,
        }}));
    }
    let mut seen: BTreeMap<String, Seen> = BTreeMap::new();
    let (mut answers, mut closed) = (0, 0);
    while answers < JOBS || closed < JOBS {
        let v = s.next();
        if v.get("id").is_some() {
            assert!(v.get("result").is_some(), "a start failed: {v}");
            answers += 1;
            continue;
        }
        let id = v["params"]["processId"]
            .as_str()
            .expect("processId")
            .to_owned();
        if seen.entry(id).or_default().note(&v) {
            closed += 1;
        }
    }
    assert_eq!(seen.len(), JOBS);
    for (id, job) in &seen {
        let i = &id[1..];
        // Two streams: their chunks' relative order is the pipes'.
        assert_eq!(
            job.checked(id, "stdout"),
            format!("out-{i}\n").as_bytes(),
            "{id}"
        );
        assert_eq!(
            job.checked(id, "stderr"),
            format!("err-{i}\n").as_bytes(),
            "{id}"
        );
        assert_eq!(job.exited.map(|e| e.1), Some(3), "{id}");
        assert_eq!(job.chunks.len(), 2, "{id}: {job:?}");
    }
    // Nothing else comes (no chunk or exit pushed twice later).
    s.send(json!({"id": 1000, "method": "environment/status", "params": {}}));
    let (_, extra) = s.answer(json!(1000));
    assert!(extra.is_empty(), "pushed after every close: {extra:?}");
}

/// A client that stops reading while a job writes 16 MB in 1 KiB chunks:
/// the dialect's queue (1024 lines) and the pipe fill, the native side
/// marks the job lagged, live chunks are dropped and later read back from
/// the job's buffer (64 MiB here, so nothing is lost to it). Once the
/// client reads again it gets every byte once, in order, seqs 1..=n
/// without a gap, the exit and close after the last chunk.
#[test]
fn a_client_that_stops_reading_gets_every_byte_once_in_order() {
    let cfg = config(
        "codex-catchup-lag",
        "output_buffer_bytes = 67108864\nmax_output_chunk_bytes = 1024\n",
    );
    let dir = executor_tests::unique_tempdir("codex-catchup-lag-run");
    let done = dir.join("done");
    let mut child = Command::new(executor_bin())
        .args(["codex-exec-server", "--listen", "stdio", "--config"])
        .arg(&cfg)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start executor codex-exec-server");
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut send = move |v: Value| {
        writeln!(stdin, "{v}").unwrap();
        stdin.flush().unwrap();
    };
    let mut line = String::new();
    let mut next = |line: &mut String| -> Value {
        line.clear();
        assert!(out.read_line(line).unwrap() > 0, "the server ended early");
        serde_json::from_str(line).expect("a JSON line")
    };
    send(json!({"id": 1, "method": "initialize", "params": {"clientName": "lag"}}));
    let init = next(&mut line);
    assert!(init.get("result").is_some(), "{init}");
    send(json!({"method": "initialized", "params": {}}));
    const LINES: u64 = 2_000_000;
    send(json!({"id": 2, "method": "process/start", "params": {
        "processId": "big",
        "argv": ["/bin/sh", "-c", format!("seq -w 1 {LINES}; : > {}", done.display())],
        "cwd": format!("file://{}", dir.display()),
        "env": {}, "tty": false, "pipeStdin": false, "arg0": null,
    }}));
    // Nothing is read until the job is done: all 16 MB were written while
    // the client was not reading (far more than the queues hold).
    let start = Instant::now();
    while !done.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the job did not finish within 120 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    let mut job = Seen::default();
    let mut answered = false;
    loop {
        let v = next(&mut line);
        if v.get("id").is_some() {
            assert_eq!(v["result"]["processId"], "big", "{v}");
            answered = true;
            continue;
        }
        assert_eq!(v["params"]["processId"], "big", "{v}");
        if job.note(&v) {
            break;
        }
    }
    assert!(answered, "the start's answer came");
    let want: Vec<u8> = (1..=LINES)
        .flat_map(|n| format!("{n:07}\n").into_bytes())
        .collect();
    let got = job.checked("big", "stdout");
    assert_eq!(got.len(), want.len(), "every byte, once");
    assert!(got == want, "the bytes in order");
    assert!(job.chunks.iter().all(|c| c.1 == "stdout"));
    assert_eq!(job.exited.map(|e| e.1), Some(0));
    drop(send);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
}
