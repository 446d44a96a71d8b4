//! Starts and writes retried after a lost answer happen once (issue 30,
//! docs/PROTOCOL.md §3): `process/start` with an `idempotency_key` (per
//! session) and `process/write` with a `write_id` (per process), over the
//! real agent, across a dropped transport and a resume of a detached
//! session, under concurrent duplicates, and refused when a key is
//! reused with other params.

use executor_client::{Client, ClientOptions, Error, ErrorCode};
use executor_protocol::methods as m;
use executor_protocol::types::process::{
    ProcessListParams, ProcessStartParams, ProcessStartResult, ProcessWriteParams,
};
use executor_protocol::types::session::{ResumeParams, SessionParams};
use executor_tests::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Private places for session host sockets (`$XDG_RUNTIME_DIR`,
/// `$TMPDIR`, `$HOME`), under a short root (a socket path must fit
/// `sun_path`): this module's hosts are the only ones its agents count.
fn places() -> &'static PathBuf {
    static ROOT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ROOT.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("exi-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for d in ["xdg", "tmp", "home"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
            std::fs::set_permissions(root.join(d), std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        root
    })
}

fn agent() -> tokio::process::Command {
    let root = places();
    let mut c = tokio::process::Command::new(executor_bin());
    c.env("XDG_RUNTIME_DIR", root.join("xdg"))
        .env("TMPDIR", root.join("tmp"))
        .env("HOME", root.join("home"));
    c
}

fn detach() -> ClientOptions {
    ClientOptions {
        session: Some(SessionParams {
            resume: None,
            detach_ttl_ms: Some(60_000),
        }),
        ..ClientOptions::default()
    }
}

fn resume(c: &Client) -> ClientOptions {
    ClientOptions {
        session: Some(SessionParams {
            resume: Some(ResumeParams {
                session_id: c.initialize_result().session_id.clone(),
                token: c.initialize_result().resume_token.clone(),
            }),
            detach_ttl_ms: None,
        }),
        ..ClientOptions::default()
    }
}

fn kill9(pid: u32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
}

fn field(e: &Error) -> Option<String> {
    match e {
        Error::Remote(w) => w
            .data_get("field")
            .and_then(|v| v.as_str())
            .map(str::to_string),
        _ => None,
    }
}

/// A job that appends its pid to `dir/pids`, then sleeps: how many jobs
/// ran, and which, is on the host.
fn pid_logger(dir: &Path, key: &str) -> ProcessStartParams {
    let script = format!("echo $$ >> {}/pids; exec sleep 30", dir.display());
    let mut p =
        ProcessStartParams::new(vec!["/bin/sh".into(), "-c".into(), script], "/", path_env())
            .with_idempotency_key(key);
    p.tag = Some(format!("idem-{key}"));
    p
}

/// The pids the jobs logged in `dir/pids`.
fn logged(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("pids"))
        .unwrap_or_default()
        .lines()
        .map(|l| l.parse().expect("a pid"))
        .collect()
}

/// Wait until `cond` holds (or fail after [`WAIT`]).
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The session's jobs tagged `tag`.
async fn tagged(c: &Client, tag: &str) -> Vec<String> {
    let l = c.call(&ProcessListParams {}).await.unwrap();
    l.processes
        .into_iter()
        .filter(|p| p.tag.as_deref() == Some(tag))
        .map(|p| p.process_id)
        .collect()
}

#[tokio::test]
async fn a_start_whose_answer_was_lost_with_the_transport_is_retried_after_resume_once() {
    let dir = unique_tempdir("idem-start");
    let a = Client::spawn(agent(), detach()).await.unwrap();
    let params = pid_logger(&dir, "s1");
    // The start is sent; its answer is never read: the transport dies
    // (as when SSH drops) once the job runs.
    let pending = a.start_call(m::PROCESS_START, &params).await.unwrap();
    until("the job to run", || logged(&dir).len() == 1).await;
    kill9(a.transport_pid().unwrap());
    drop(pending);
    let b = Client::spawn(agent(), resume(&a)).await.unwrap();
    assert!(b.initialize_result().resumed);
    // The retry starts nothing and answers the job the first start made.
    let r: ProcessStartResult = b.call(&params).await.unwrap();
    assert_eq!(logged(&dir), vec![r.pid], "one job, the one answered");
    assert_eq!(tagged(&b, "idem-s1").await, vec![r.process_id.clone()]);
    let again: ProcessStartResult = b.call(&params).await.unwrap();
    assert_eq!(again, r);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(logged(&dir).len(), 1);

    // The same key with other params is refused, naming the key, and
    // starts nothing: another argv, another env, another tty.
    let mut other = params.clone();
    other.argv[2] = format!("echo $$ >> {}/pids", dir.display());
    let mut env = params.clone();
    env.env.insert("X".into(), "1".into());
    let mut tty = params.clone();
    tty.tty = true;
    for p in [other, env, tty] {
        let e = b.call(&p).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::InvalidParams), "{e}");
        assert_eq!(field(&e).as_deref(), Some("idempotency_key"), "{e}");
    }
    // A key of 0 or more than 128 bytes is refused naming it.
    for key in [String::new(), "k".repeat(129)] {
        let e = b
            .call(&params.clone().with_idempotency_key(key))
            .await
            .unwrap_err();
        assert_eq!(field(&e).as_deref(), Some("idempotency_key"), "{e}");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(logged(&dir).len(), 1, "no refused start ran");
    // Positive control: another key (128 bytes) starts another job.
    let second: ProcessStartResult = b.call(&pid_logger(&dir, &"k".repeat(128))).await.unwrap();
    assert_ne!(second.process_id, r.process_id);
    until("the second job", || logged(&dir).len() == 2).await;
    kill9(r.pid);
    kill9(second.pid);
    b.close().await.unwrap();
}

#[tokio::test]
async fn concurrent_starts_with_one_key_start_one_job() {
    let dir = unique_tempdir("idem-race");
    let c = local_client().await;
    let params = pid_logger(&dir, "race");
    let answers =
        futures_util::future::join_all((0..16).map(|_| c.call::<ProcessStartParams>(&params)))
            .await;
    let first = answers[0].as_ref().unwrap().clone();
    for a in &answers {
        assert_eq!(a.as_ref().unwrap(), &first);
    }
    until("the job to run", || !logged(&dir).is_empty()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(logged(&dir), vec![first.pid], "16 starts, one job");
    assert_eq!(tagged(&c, "idem-race").await.len(), 1);
    // Control: without a key, two starts are two jobs.
    let mut plain = params.clone();
    plain.idempotency_key = None;
    let x: ProcessStartResult = c.call(&plain).await.unwrap();
    let y: ProcessStartResult = c.call(&plain).await.unwrap();
    assert_ne!(x.pid, y.pid);
    until("the keyless jobs", || logged(&dir).len() == 3).await;
    for p in [first.pid, x.pid, y.pid] {
        kill9(p);
    }
    c.close().await.unwrap();
}

#[tokio::test]
async fn a_start_that_failed_is_not_remembered() {
    let c = local_client().await;
    let mut bad = ProcessStartParams::new(vec!["/nonexistent/prog".into()], "/", path_env())
        .with_idempotency_key("f1");
    bad.tag = Some("idem-f1".into());
    let e = c.call(&bad).await.unwrap_err();
    assert!(e.code().is_some(), "{e}");
    assert!(tagged(&c, "idem-f1").await.is_empty());
    // The key is free: a start with it (other params) runs.
    let good =
        ProcessStartParams::new(vec!["true".into()], "/", path_env()).with_idempotency_key("f1");
    let r: ProcessStartResult = c.call(&good).await.unwrap();
    assert!(r.pid > 0);
    c.close().await.unwrap();
}

/// A job copying its stdin to `dir/out`.
fn stdin_to_file(dir: &Path) -> ProcessStartParams {
    let script = format!("cat > {}/out", dir.display());
    ProcessStartParams::new(vec!["/bin/sh".into(), "-c".into(), script], "/", path_env())
}

fn out(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("out")).unwrap_or_default()
}

fn write(id: &str, data: &[u8], close: bool, write_id: Option<&str>) -> ProcessWriteParams {
    ProcessWriteParams {
        process_id: id.to_string(),
        data: serde_bytes::ByteBuf::from(data.to_vec()),
        close_stdin: close,
        write_id: write_id.map(str::to_string),
    }
}

#[tokio::test]
async fn a_write_retried_with_its_id_is_written_once_also_after_resume() {
    let dir = unique_tempdir("idem-write");
    let a = Client::spawn(agent(), detach()).await.unwrap();
    let p = a.start(&stdin_to_file(&dir)).await.unwrap();
    let id = p.id().to_string();
    p.write_once(b"one\n", "w1").await.unwrap();
    p.write_once(b"one\n", "w1").await.unwrap();
    until("one", || out(&dir) == "one\n").await;
    // The id alone names the write (as Codex's exec-server has it): the
    // same id with other data, or closing, answers as the first did and
    // writes (and closes) nothing.
    a.call(&write(&id, b"uno\n", false, Some("w1")))
        .await
        .unwrap();
    a.call(&write(&id, b"", true, Some("w1"))).await.unwrap();
    for bad in [String::new(), "w".repeat(129)] {
        let e = a
            .call(&write(&id, b"x", false, Some(&bad)))
            .await
            .unwrap_err();
        assert_eq!(field(&e).as_deref(), Some("write_id"), "{e}");
    }
    // A write whose answer is lost with the transport.
    let pending = a
        .start_call(m::PROCESS_WRITE, &write(&id, b"two\n", false, Some("w2")))
        .await
        .unwrap();
    until("two", || out(&dir) == "one\ntwo\n").await;
    kill9(a.transport_pid().unwrap());
    drop(pending);
    let b = Client::spawn(agent(), resume(&a)).await.unwrap();
    let p = b.attach_process(&id).await.unwrap();
    // Retried after the resume, both earlier ids write nothing.
    p.write_once(b"two\n", "w2").await.unwrap();
    p.write_once(b"one\n", "w1").await.unwrap();
    // Closing with data, once: the retry answers as the first did (not
    // "stdin is closed").
    b.call(&write(&id, b"three\n", true, Some("c1")))
        .await
        .unwrap();
    b.call(&write(&id, b"three\n", true, Some("c1")))
        .await
        .unwrap();
    // Control: a write without an id after the close fails.
    let e = b
        .call(&write(&id, b"four\n", false, None))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Io), "{e}");
    let exit = p.wait().await.unwrap();
    assert_eq!(exit.code, Some(0));
    assert_eq!(out(&dir), "one\ntwo\nthree\n");
    b.close().await.unwrap();
}

/// A retry answered with an earlier start's job is audited as such: its
/// line says `replayed` and names that job; the first start's line names
/// the job it spawned, without `replayed`.
#[tokio::test]
async fn a_replayed_start_is_audited_as_replayed() {
    let dir = unique_tempdir("idem-audit");
    let log = dir.join("audit.jsonl");
    let c = client_with_config(&format!("[audit]\nfile = {:?}\n", log.to_str().unwrap())).await;
    let params = pid_logger(&dir, "audited");
    let first: ProcessStartResult = c.call(&params).await.unwrap();
    let again: ProcessStartResult = c.call(&params).await.unwrap();
    assert_eq!(first, again);
    let w = c.start(&stdin_to_file(&dir)).await.unwrap();
    w.write_once(b"x\n", "a1").await.unwrap();
    w.write_once(b"x\n", "a1").await.unwrap();
    kill9(first.pid);
    c.close().await.unwrap();
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let of = |method: &str| -> Vec<&serde_json::Value> {
        lines.iter().filter(|l| l["method"] == method).collect()
    };
    let starts: Vec<_> = of(m::PROCESS_START)
        .into_iter()
        .filter(|l| l["idempotency_key"] == "audited")
        .collect();
    assert_eq!(starts.len(), 2, "{lines:#?}");
    assert_eq!(starts[0]["pid"], first.pid, "{}", starts[0]);
    assert!(starts[0].get("replayed").is_none(), "{}", starts[0]);
    assert_eq!(starts[1]["replayed"], true, "{}", starts[1]);
    assert_eq!(starts[1]["pid"], first.pid, "{}", starts[1]);
    assert_eq!(starts[1]["process_id"], first.process_id.as_str());
    let writes = of(m::PROCESS_WRITE);
    assert_eq!(writes.len(), 2, "{lines:#?}");
    assert!(writes[0].get("replayed").is_none() && writes[0]["write_id"] == "a1");
    assert_eq!(writes[1]["replayed"], true, "{}", writes[1]);
}

/// A write with an id that waits on a full pipe when its transport dies
/// runs to its end (it is not cancelled with the connection's requests),
/// and its retry on the resumed session waits for it: the job reads the
/// data exactly once.
#[tokio::test]
async fn a_write_blocked_on_a_full_pipe_outlives_its_connection_and_is_written_once() {
    let dir = unique_tempdir("idem-blocked");
    let a = Client::spawn(agent(), detach()).await.unwrap();
    let script = format!("sleep 3; cat > {}/out", dir.display());
    let p = a
        .start(&ProcessStartParams::new(
            vec!["/bin/sh".into(), "-c".into(), script],
            "/",
            path_env(),
        ))
        .await
        .unwrap();
    let id = p.id().to_string();
    let data = vec![b'z'; 1 << 20];
    let pending = a
        .start_call(m::PROCESS_WRITE, &write(&id, &data, false, Some("big")))
        .await
        .unwrap();
    // The pipe holds 64 KiB: the write is blocked when the transport dies.
    tokio::time::sleep(Duration::from_millis(300)).await;
    kill9(a.transport_pid().unwrap());
    drop(pending);
    let b = Client::spawn(agent(), resume(&a)).await.unwrap();
    let started = Instant::now();
    b.call(&write(&id, &data, false, Some("big")))
        .await
        .unwrap();
    assert!(
        started.elapsed() > Duration::from_millis(500),
        "the retry waited for the first write"
    );
    b.call(&write(&id, b"", true, Some("eof"))).await.unwrap();
    let exit = b.attach_process(&id).await.unwrap().wait().await.unwrap();
    assert_eq!(exit.code, Some(0));
    assert_eq!(
        std::fs::metadata(dir.join("out")).unwrap().len(),
        1 << 20,
        "written exactly once"
    );
    b.close().await.unwrap();
}
