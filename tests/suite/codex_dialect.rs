//! `executor codex-exec-server`: Codex's exec-server dialect served by the
//! real agent binary, checked line by line (the handshake's errors, a
//! job's seqs, exit and close, writes, terminate), and the session a
//! closed stdin leaves: its jobs run on and a new connection resumes it
//! and reads what they did (the reference loses both).

use executor_tests::executor_bin;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A running `executor codex-exec-server`, its lines read on a thread.
pub(crate) struct Server {
    pub(crate) child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<Value>,
}

impl Server {
    pub(crate) fn start() -> Server {
        Server::start_with(&[])
    }

    /// Started with more arguments (`--config`, `--profile`).
    pub(crate) fn start_with(args: &[&std::ffi::OsStr]) -> Server {
        Server::spawn(Command::new(executor_bin()), args)
    }

    /// Started as an unprivileged user (uid 65534) when `unprivileged`
    /// and this is root, as [`executor_tests::agent_command`] starts the
    /// native agent; the uid it runs as.
    pub(crate) fn start_as(unprivileged: bool) -> (Server, u32) {
        if unprivileged && executor_tests::current_uid() == 0 {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                .arg(executor_tests::executor_bin_for_any_user());
            (Server::spawn(c, &[]), 65534)
        } else {
            (Server::start(), executor_tests::current_uid())
        }
    }

    fn spawn(mut command: Command, args: &[&std::ffi::OsStr]) -> Server {
        let mut child = command
            .args(["codex-exec-server", "--listen", "stdio"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start executor codex-exec-server");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let v: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("stdout carries only JSON lines: {line:?}: {e}"));
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        Server {
            child,
            stdin,
            lines,
        }
    }

    pub(crate) fn send(&mut self, v: Value) {
        self.send_raw(&v.to_string());
    }

    pub(crate) fn send_raw(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{line}").expect("write a line");
        stdin.flush().unwrap();
    }

    pub(crate) fn next(&self) -> Value {
        self.lines
            .recv_timeout(Duration::from_secs(20))
            .expect("a line from the server within 20 s")
    }

    /// The answer to `id`, with the notifications seen before it.
    pub(crate) fn answer(&self, id: Value) -> (Value, Vec<Value>) {
        let mut notes = Vec::new();
        loop {
            let v = self.next();
            if v.get("id") == Some(&id) {
                return (v, notes);
            }
            notes.push(v);
        }
    }

    pub(crate) fn request(&mut self, id: i64, method: &str, params: Value) -> Value {
        self.send(json!({"id": id, "method": method, "params": params}));
        self.answer(json!(id)).0
    }

    /// `initialize` (resuming `resume`) and `initialized`: the session id.
    pub(crate) fn handshake(&mut self, resume: Option<&str>) -> String {
        let r = self.request(
            1,
            "initialize",
            json!({"clientName": "test", "resumeSessionId": resume}),
        );
        let sid = r["result"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("initialize answered {r}"))
            .to_owned();
        self.send(json!({"method": "initialized", "params": {}}));
        sid
    }

    /// `process/start` of `sh -c script` in `cwd` under `sandbox`, read to
    /// its close: (stdout and stderr as pushed, exit code).
    pub(crate) fn sh(
        &mut self,
        id: i64,
        cwd: &Path,
        sandbox: &Value,
        script: &str,
    ) -> (String, i64) {
        let pid = format!("sh-{id}");
        self.send(json!({"id": id, "method": "process/start", "params": {
            "processId": pid, "argv": ["/bin/sh", "-c", script],
            "cwd": format!("file://{}", cwd.display()), "env": {"PATH": "/usr/bin:/bin"},
            "tty": false, "sandbox": sandbox}}));
        // The job's lines may come before the answer.
        let (r, early) = self.answer(json!(id));
        assert!(r.get("result").is_some(), "process/start answered {r}");
        let mut early = early.into_iter();
        let (mut out, mut code) = (Vec::new(), None);
        loop {
            let v = early.next().unwrap_or_else(|| self.next());
            if v["params"]["processId"] != json!(pid) {
                continue;
            }
            match v["method"].as_str() {
                Some("process/output") => out.extend(
                    executor_tests::codex::unbase64(v["params"]["chunk"].as_str().unwrap())
                        .unwrap(),
                ),
                Some("process/exited") => code = v["params"]["exitCode"].as_i64(),
                Some("process/closed") => break,
                _ => {}
            }
        }
        (
            String::from_utf8_lossy(&out).into_owned(),
            code.expect("an exit"),
        )
    }

    pub(crate) fn close_stdin_and_wait(&mut self) {
        self.stdin.take();
        let status = self.child.wait().unwrap();
        assert!(
            status.success(),
            "the server exits 0 at the end of its input: {status}"
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn error(v: &Value) -> (i64, String) {
    (
        v["error"]["code"]
            .as_i64()
            .unwrap_or_else(|| panic!("an error: {v}")),
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

#[test]
fn the_handshake_answers_as_the_reference() {
    let mut s = Server::start();
    let r = s.request(1, "environment/info", json!({}));
    assert_eq!(
        error(&r),
        (
            -32600,
            "client must call initialize before using environment info methods".into()
        )
    );
    s.send_raw("garbage");
    let r = s.next();
    assert_eq!(r["id"], json!(-1));
    assert_eq!(
        error(&r),
        (
            -32600,
            "failed to parse JSON-RPC message from exec-server stdio: expected value at line 1 column 1"
                .into()
        )
    );
    let r = s.request(2, "initialize", json!({"clientName": "t"}));
    let info = &r["result"]["environmentInfo"];
    assert!(info["shell"]["path"].is_string(), "{r}");
    assert!(info["cwd"].as_str().unwrap().starts_with("file:///"));
    assert_eq!(info["capabilities"]["networkProxyLaunch"], json!(false));
    let r = s.request(3, "process/read", json!({"processId": "x"}));
    assert_eq!(
        error(&r),
        (
            -32600,
            "client must send initialized before using exec methods".into()
        )
    );
    s.send(json!({"method": "initialized", "params": {}}));
    s.send(json!({"id": "s", "method": "environment/status", "params": {}}));
    assert_eq!(s.answer(json!("s")).0["result"], json!({"status": "ready"}));
    let r = s.request(5, "initialize", json!({"clientName": "t"}));
    assert_eq!(
        error(&r),
        (
            -32600,
            "initialize may only be sent once per connection".into()
        )
    );
    let r = s.request(6, "nope/x", json!({}));
    assert_eq!(
        error(&r),
        (
            -32601,
            "exec-server stub does not implement `nope/x` yet".into()
        )
    );
    let r = s.request(7, "process/start", json!({"processId": "p", "argv": "x"}));
    assert_eq!(error(&r).0, -32602, "wrong types: {r}");
    // The connection survived all of it.
    s.send(json!({"id": 8, "method": "environment/status", "params": {}}));
    assert_eq!(s.answer(json!(8)).0["result"]["status"], json!("ready"));
    s.close_stdin_and_wait();
}

#[test]
fn a_jobs_output_exit_and_close_take_seqs_in_order() {
    let mut s = Server::start();
    s.handshake(None);
    s.send(json!({"id": 2, "method": "process/start", "params": {
        "processId": "p1", "argv": ["/bin/sh", "-c", "echo hi; echo err >&2; exit 3"],
        "cwd": "file:///tmp", "env": {}, "tty": false}}));
    // The job's notifications may come before the answer (a job that
    // ends at once: its output is read back once the answer names it).
    let (r, mut seen) = s.answer(json!(2));
    assert_eq!(
        r["result"],
        json!({"processId": "p1", "sandboxType": "none"})
    );
    while seen.len() < 4 {
        let v = s.next();
        seen.push(v);
    }
    let methods: Vec<&str> = seen.iter().map(|v| v["method"].as_str().unwrap()).collect();
    let seqs: Vec<i64> = seen
        .iter()
        .map(|v| v["params"]["seq"].as_i64().unwrap())
        .collect();
    // stdout and stderr are two pipes: their order between them is the
    // scheduler's, their seqs are 1 and 2 either way.
    assert_eq!(
        methods,
        [
            "process/output",
            "process/output",
            "process/exited",
            "process/closed"
        ]
    );
    assert_eq!(seqs, [1, 2, 3, 4]);
    assert_eq!(seen[2]["params"]["exitCode"], json!(3));
    let r = s.request(3, "process/read", json!({"processId": "p1"}));
    assert_eq!(r["result"]["nextSeq"], json!(5));
    assert_eq!(r["result"]["closed"], json!(true));
    assert_eq!(r["result"]["exitCode"], json!(3));
    let r = s.request(4, "process/read", json!({"processId": "p1", "afterSeq": 1}));
    assert_eq!(r["result"]["chunks"].as_array().unwrap().len(), 1);
    assert_eq!(r["result"]["chunks"][0]["seq"], json!(2));
    // Without pipeStdin the job's stdin is closed.
    let r = s.request(
        5,
        "process/write",
        json!({"processId": "p1", "chunk": "eA==", "writeId": "w"}),
    );
    assert_eq!(r["result"], json!({"status": "stdinClosed"}));
    let r = s.request(6, "process/terminate", json!({"processId": "p1"}));
    assert_eq!(r["result"], json!({"running": false}));
    let r = s.request(
        7,
        "process/start",
        json!({
        "processId": "p1", "argv": ["true"], "cwd": "file:///tmp", "env": {}, "tty": false}),
    );
    assert_eq!(error(&r), (-32600, "process p1 already exists".into()));
    let r = s.request(
        8,
        "process/write",
        json!({"processId": "nope", "chunk": "", "writeId": "w"}),
    );
    assert_eq!(r["result"], json!({"status": "unknownProcess"}));
    let r = s.request(
        9,
        "process/write",
        json!({"processId": "p1", "chunk": "", "writeId": ""}),
    );
    assert_eq!(error(&r), (-32602, "writeId must not be empty".into()));
    // A sleeper terminated: it was running, and exits 137 (killed).
    s.request(
        10,
        "process/start",
        json!({
        "processId": "p2", "argv": ["sleep", "300"], "cwd": "file:///tmp", "env": {}, "tty": false}),
    );
    s.send(json!({"id": 11, "method": "process/terminate", "params": {"processId": "p2"}}));
    // The exit may be pushed before the answer.
    let (r, mut pushed) = s.answer(json!(11));
    assert_eq!(r["result"], json!({"running": true}));
    while pushed.len() < 2 {
        pushed.push(s.next());
    }
    let exited = &pushed[0];
    assert_eq!(exited["method"], json!("process/exited"), "{pushed:?}");
    assert_eq!(exited["params"]["exitCode"], json!(137));
    assert_eq!(exited["params"]["seq"], json!(1));
    assert_eq!(pushed[1]["method"], json!("process/closed"));
    s.close_stdin_and_wait();
}

#[test]
fn a_closed_stdin_detaches_the_session_and_a_new_connection_resumes_it() {
    let dir = std::env::temp_dir().join(format!("executor-codex-resume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let marker = dir.join("ran-on");
    let mut s = Server::start();
    let sid = s.handshake(None);
    let script = format!(
        "sleep 1; echo after-the-drop; echo yes > {}",
        marker.display()
    );
    let r = s.request(
        2,
        "process/start",
        json!({
        "processId": "job", "argv": ["/bin/sh", "-c", script],
        "cwd": "file:///tmp", "env": {}, "tty": false}),
    );
    assert!(r["result"].is_object(), "{r}");
    s.close_stdin_and_wait();
    // The job runs on after the connection ended.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !marker.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the job did not run on after stdin closed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut again = Server::start();
    let sid2 = again.handshake(Some(&sid));
    assert_eq!(sid2, sid, "a resumed session keeps its id");
    let r = again.request(3, "process/read", json!({"processId": "job"}));
    let chunks = r["result"]["chunks"].as_array().unwrap();
    let text: String = chunks
        .iter()
        .map(|c| {
            use base64::Engine;
            String::from_utf8(
                base64::engine::general_purpose::STANDARD
                    .decode(c["chunk"].as_str().unwrap())
                    .unwrap(),
            )
            .unwrap()
        })
        .collect();
    assert_eq!(text, "after-the-drop\n");
    assert_eq!(r["result"]["exited"], json!(true));
    assert_eq!(r["result"]["closed"], json!(true));
    assert_eq!(r["result"]["nextSeq"], json!(4));
    // Its id is still taken in the resumed session.
    let r = again.request(
        4,
        "process/start",
        json!({
        "processId": "job", "argv": ["true"], "cwd": "file:///tmp", "env": {}, "tty": false}),
    );
    assert_eq!(error(&r), (-32600, "process job already exists".into()));
    again.close_stdin_and_wait();
    // A session id with a wrong secret resumes nothing.
    let mut third = Server::start();
    let r = third.request(
        1,
        "initialize",
        json!({"clientName": "t", "resumeSessionId": format!("{sid}0")}),
    );
    let (code, message) = error(&r);
    assert_eq!(code, -32600);
    assert!(message.starts_with("unknown session id "), "{message}");
    third.close_stdin_and_wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A write to a job that reads nothing waits for room in its stdin, and
/// nothing else waits with it: `environment/status`, a second job and the
/// job's `process/terminate` are answered meanwhile (before, the write held
/// the connection's one lane and the terminate Codex sends after every
/// command never came through). Writes to one job stay in order; the
/// blocked ones answer once the job is gone.
#[test]
fn a_write_that_waits_for_room_stalls_nothing_else() {
    let mut s = Server::start();
    s.handshake(None);
    start_deaf(&mut s);
    // Far more than a pipe holds: the first write cannot finish.
    let big = vec![b'x'; 4 << 20];
    s.send(json!({"id": 3, "method": "process/write",
                  "params": {"processId": "deaf", "chunk": b64(&big), "writeId": "w1"}}));
    s.send(json!({"id": 4, "method": "process/write",
                  "params": {"processId": "deaf", "chunk": b64(b"y"), "writeId": "w2"}}));
    s.send(json!({"id": 5, "method": "environment/status", "params": {}}));
    let (r, early) = s.answer(json!(5));
    assert_eq!(r["result"]["status"], json!("ready"), "{r}");
    assert!(
        early.iter().all(|v| v.get("id").is_none()),
        "no write answered while the job reads nothing: {early:?}"
    );
    let r = s.request(
        6,
        "process/start",
        json!({"processId": "other", "argv": ["true"], "cwd": "file:///tmp", "env": {}, "tty": false}),
    );
    assert!(r.get("result").is_some(), "{r}");
    // What waits is bounded: past 64 MiB queued, a write is refused at
    // once, naming the limit.
    let chunk = b64(&vec![b'z'; 6 << 20]);
    let mut refused = None;
    for id in 100..112 {
        s.send(json!({"id": id, "method": "process/write",
                      "params": {"processId": "deaf", "chunk": chunk, "writeId": format!("b{id}")}}));
        s.send(json!({"id": 1000 + id, "method": "environment/status", "params": {}}));
        let (_, early) = s.answer(json!(1000 + id));
        if let Some(e) = early.iter().find(|v| v.get("error").is_some()) {
            refused = Some((id, e.clone()));
            break;
        }
    }
    let (at, e) = refused.expect("a write past the bound is refused");
    assert!(at > 100, "the first writes wait: {e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("limit_exceeded"),
        "{e}"
    );
    s.send(json!({"id": 7, "method": "process/terminate", "params": {"processId": "deaf"}}));
    let mut answered = std::collections::BTreeMap::new();
    while !answered.contains_key(&7) || !answered.contains_key(&3) || !answered.contains_key(&4) {
        let v = s.next();
        if let Some(id) = v.get("id").and_then(Value::as_i64) {
            answered.insert(id, v);
        }
    }
    assert_eq!(answered[&7]["result"], json!({"running": true}));
    // The blocked writes end with the job, in order, neither accepted.
    for id in [3, 4] {
        assert!(
            answered[&id]["result"]["status"] == json!("stdinClosed")
                || answered[&id].get("error").is_some(),
            "{:?}",
            answered[&id]
        );
    }
    s.close_stdin_and_wait();
}

/// A profile that runs every job under its own intent: a Codex job that
/// asks for no sandbox is confined all the same (the profile's write root
/// only: elsewhere EROFS, the job's read-only mount) and reported as such
/// (`sandboxType: linuxSeccomp`, not `none`). Control: without the
/// profile the same request reports `none` and writes where it likes.
#[test]
fn a_profile_sandbox_confines_and_is_reported() {
    let dir = executor_tests::unique_tempdir("codex-profile-sbx");
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[profiles.jail.sandbox]\nnetwork = \"deny\"\n[profiles.jail.sandbox.filesystem]\nwrite = [{:?}]\n",
            dir.display().to_string()
        ),
    )
    .unwrap();
    let outside = format!("/var/tmp/codex-profile-sbx-{}", std::process::id());
    let script = format!("echo x > {}/inside; echo x > {outside}", dir.display());
    let start = |s: &mut Server| {
        s.send(json!({"id": 2, "method": "process/start", "params": {
            "processId": "p", "argv": ["/bin/sh", "-c", script], "cwd": format!("file://{}", dir.display()),
            "env": {"PATH": "/usr/bin:/bin"}, "tty": false}}));
        let (r, mut seen) = s.answer(json!(2));
        while !seen.iter().any(|v| v["method"] == json!("process/closed")) {
            seen.push(s.next());
        }
        r
    };
    let mut s = Server::start_with(&[
        "--config".as_ref(),
        config.as_os_str(),
        "--profile".as_ref(),
        "jail".as_ref(),
    ]);
    s.handshake(None);
    let r = start(&mut s);
    assert_eq!(r["result"]["sandboxType"], json!("linuxSeccomp"), "{r}");
    assert!(
        dir.join("inside").exists(),
        "the profile's root is writable"
    );
    assert!(!Path::new(&outside).exists(), "confined by the profile");
    s.close_stdin_and_wait();
    let mut s = Server::start();
    s.handshake(None);
    let r = start(&mut s);
    assert_eq!(r["result"]["sandboxType"], json!("none"), "{r}");
    assert!(Path::new(&outside).exists(), "control: unconfined");
    std::fs::remove_file(&outside).unwrap();
    s.close_stdin_and_wait();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Writes are checked before they wait: one with an unknown key (which
/// could carry anything) is refused at once, one to a job nobody started
/// answers `unknownProcess` at once and leaves nothing behind (no lane, no
/// memory: 20,000 of them with 1 KiB ids), all while another job's write
/// waits for room.
#[test]
fn writes_are_checked_before_they_wait_and_unknown_jobs_leave_nothing() {
    let mut s = Server::start();
    let pid = s.child.id();
    s.handshake(None);
    start_deaf(&mut s);
    s.send(json!({"id": 3, "method": "process/write",
                  "params": {"processId": "deaf", "chunk": b64(&vec![b'x'; 4 << 20]), "writeId": "w1"}}));
    let pad = "p".repeat(8 << 20);
    let r = s.request(
        4,
        "process/write",
        json!({"processId": "deaf", "chunk": "", "writeId": "w2", "pad": pad}),
    );
    assert_eq!(r["error"]["code"], json!(-32602), "{r}");
    let r = s.request(
        5,
        "process/write",
        json!({"processId": "deaf", "chunk": "!!", "writeId": "w3"}),
    );
    assert_eq!(r["error"]["code"], json!(-32602), "{r}");
    let before = executor_tests::status_kib(pid, "VmRSS");
    let long = "q".repeat(1024);
    for i in 0..20_000 {
        s.send(json!({"id": 10 + i, "method": "process/write",
                      "params": {"processId": format!("{long}{i}"), "chunk": "", "writeId": "w"}}));
    }
    for i in 0..20_000 {
        let (r, _) = s.answer(json!(10 + i));
        assert_eq!(r["result"]["status"], json!("unknownProcess"), "{r}");
    }
    let grown = executor_tests::status_kib(pid, "VmRSS").saturating_sub(before);
    assert!(
        grown < 48 * 1024,
        "20,000 writes to no job left {grown} KiB"
    );
    let r = s.request(6, "process/terminate", json!({"processId": "deaf"}));
    assert_eq!(r["result"], json!({"running": true}), "{r}");
    s.close_stdin_and_wait();
}

fn b64(d: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(d)
}

/// Job `deaf` (request 2): `sleep 300` with its stdin a pipe nobody reads.
fn start_deaf(s: &mut Server) {
    let r = s.request(
        2,
        "process/start",
        json!({"processId": "deaf", "argv": ["sleep", "300"], "cwd": "file:///tmp",
               "env": {}, "tty": false, "pipeStdin": true}),
    );
    assert!(r.get("result").is_some(), "{r}");
}
