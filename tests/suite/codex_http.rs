//! `executor codex-exec-server`: Codex's `http/request` against a real
//! loopback HTTP server (buffered, streamed deltas, redirects, duplicate
//! stream ids, `valueEnvVar` headers read on the executor host and never
//! logged, timeouts, the destination policy), and `--listen ws://`: the
//! URL line, requests over websocket frames, `Origin` refused, `/readyz`,
//! with the listener as root and as an unprivileged user (uid 65534).

use base64::Engine;
use executor_tests::executor_bin;
use executor_tests::http::TestServer;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

fn unb64(v: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(v.as_str().unwrap_or_else(|| panic!("base64 text: {v}")))
        .expect("valid base64")
}

/// A loopback HTTP server (tests/src/http.rs) on its own runtime.
fn web() -> (tokio::runtime::Runtime, TestServer) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(TestServer::start());
    (rt, server)
}

/// A configuration whose only change is room for many detached sessions:
/// every Codex connection leaves one for 30 s, and other tests on this
/// host (as this user) count against the default 16.
fn roomy_config() -> std::path::PathBuf {
    let dir = executor_tests::unique_tempdir("codex-http-config");
    let path = dir.join("config.toml");
    std::fs::write(&path, "[limits]\nmax_detached_sessions = 1024\n").unwrap();
    path
}

/// A running `executor codex-exec-server --listen stdio`.
struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<Value>,
}

impl Server {
    fn start(env: &[(&str, &str)], stderr: Stdio) -> Server {
        let config = roomy_config();
        Server::start_with(env, stderr, &["--config".as_ref(), config.as_os_str()])
    }

    /// Started with these arguments after `--listen stdio`.
    fn start_with(env: &[(&str, &str)], stderr: Stdio, args: &[&std::ffi::OsStr]) -> Server {
        let mut child = Command::new(executor_bin())
            .args(["codex-exec-server", "--listen", "stdio"])
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start executor codex-exec-server");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout");
        // Bounded: a test that stops taking lines stops the reading of
        // stdout too.
        let (tx, lines) = mpsc::sync_channel(16);
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
        let mut s = Server {
            child,
            stdin,
            lines,
        };
        let r = s.request(1, "initialize", json!({"clientName": "test"}));
        assert!(r["result"]["sessionId"].is_string(), "{r}");
        assert_eq!(
            r["result"]["environmentInfo"]["capabilities"]["httpHeaderEnvVars"],
            json!(true)
        );
        s.send(json!({"method": "initialized", "params": {}}));
        s
    }

    fn send(&mut self, v: Value) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{v}").expect("write a line");
        stdin.flush().unwrap();
    }

    fn next(&self) -> Value {
        self.lines
            .recv_timeout(Duration::from_secs(20))
            .expect("a line from the server within 20 s")
    }

    /// The answer to `id`, with the lines seen before it.
    fn answer(&self, id: Value) -> (Value, Vec<Value>) {
        let mut notes = Vec::new();
        loop {
            let v = self.next();
            if v.get("id") == Some(&id) {
                return (v, notes);
            }
            notes.push(v);
        }
    }

    fn request(&mut self, id: i64, method: &str, params: Value) -> Value {
        self.send(json!({"id": id, "method": method, "params": params}));
        self.answer(json!(id)).0
    }

    fn http(&mut self, id: i64, params: Value) -> Value {
        self.request(id, "http/request", params)
    }

    fn close(mut self) {
        self.stdin.take();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "exit at the end of input: {status}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn error(v: &Value) -> (i64, String) {
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

fn header<'a>(r: &'a Value, name: &str) -> Option<&'a str> {
    r["result"]["headers"]
        .as_array()?
        .iter()
        .find(|h| h["name"] == name)
        .and_then(|h| h["value"].as_str())
}

#[test]
fn buffered_requests_and_redirect_policies() {
    let (_rt, web) = web();
    let base = format!("http://{}", web.addr);
    let mut s = Server::start(&[], Stdio::inherit());
    let r = s.http(
        2,
        json!({"method": "POST", "url": format!("{base}/echo"), "requestId": "a",
               "headers": [{"name": "x-rep", "value": "one"}, {"name": "x-rep", "value": "two"}],
               "bodyBase64": b64(b"hello")}),
    );
    assert_eq!(r["result"]["status"], json!(200), "{r}");
    assert_eq!(unb64(&r["result"]["bodyBase64"]), b"hello");
    assert_eq!(header(&r, "x-method"), Some("POST"));
    let echoed: Vec<&str> = r["result"]["headers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["name"] == "x-rep-echo")
        .map(|h| h["value"].as_str().unwrap())
        .collect();
    assert_eq!(echoed, ["one", "two"], "repeated headers kept in order");
    let redirect = format!("{base}/redirect?code=302&to=/echo");
    let stop = s.http(
        3,
        json!({"method": "GET", "url": redirect, "requestId": "b", "redirectPolicy": "stop"}),
    );
    assert_eq!(stop["result"]["status"], json!(302), "{stop}");
    assert_eq!(header(&stop, "location"), Some("/echo"));
    let follow = s.http(
        4,
        json!({"method": "GET", "url": redirect, "requestId": "c"}),
    );
    assert_eq!(
        follow["result"]["status"],
        json!(200),
        "follow by default: {follow}"
    );
    assert_eq!(header(&follow, "x-method"), Some("GET"));
    // Refusals, each naming what is wrong; the connection survives them.
    let bad = s.http(
        5,
        json!({"method": "GET", "url": base, "requestId": "d", "bogus": 1}),
    );
    let (code, message) = error(&bad);
    assert_eq!(code, -32602);
    assert!(message.contains("unknown field `bogus`"), "{message}");
    let bad = s.http(
        6,
        json!({"method": "GET", "url": "ftp://h/", "requestId": "e"}),
    );
    assert_eq!(
        error(&bad),
        (
            -32602,
            "http/request only supports http and https URLs, got ftp".into()
        )
    );
    // Executor's destination policy applies: no cloud metadata address.
    let meta = s.http(
        7,
        json!({"method": "GET", "url": "http://169.254.169.254/latest", "requestId": "f"}),
    );
    let (code, message) = error(&meta);
    assert_eq!(code, -32600, "{meta}");
    assert!(message.contains("metadata"), "{message}");
    s.close();
}

#[test]
fn a_streamed_body_comes_after_its_answer_in_ordered_deltas() {
    let (_rt, web) = web();
    let (n, size) = (6u64, 3000usize);
    let url = format!("http://{}/chunks?n={n}&size={size}&delay_ms=20", web.addr);
    let mut s = Server::start(&[], Stdio::inherit());
    s.send(json!({"id": 2, "method": "http/request", "params": {
        "method": "GET", "url": url, "requestId": "s1", "streamResponse": true}}));
    let first = s.next();
    assert_eq!(first["id"], json!(2), "the answer comes first: {first}");
    assert_eq!(first["result"]["status"], json!(200));
    assert_eq!(first["result"]["bodyBase64"], json!(""));
    let mut body = Vec::new();
    let mut want_seq = 1;
    loop {
        let d = s.next();
        assert_eq!(d["method"], json!("http/request/bodyDelta"), "{d}");
        let p = &d["params"];
        assert_eq!(p["requestId"], json!("s1"));
        assert_eq!(p["seq"], json!(want_seq), "seqs from 1, consecutive");
        want_seq += 1;
        let data = unb64(&p["deltaBase64"]);
        assert!(data.len() <= 1 << 20);
        if p["done"] == json!(true) {
            assert!(data.is_empty());
            assert_eq!(p["error"], Value::Null, "{d}");
            break;
        }
        body.extend_from_slice(&data);
    }
    let expected: Vec<u8> = (0..n).flat_map(|i| vec![(i % 251) as u8; size]).collect();
    assert_eq!(body.len(), expected.len());
    assert!(body == expected, "every byte, in order");
    s.close();
}

#[test]
fn a_client_that_stops_reading_slows_the_server_not_the_dialects_memory() {
    let (_rt, web) = web();
    let total: u64 = 192 << 20;
    // One body with a length: the agent reads it in large pieces.
    let url = format!("http://{}/bytes?n={total}", web.addr);
    let mut s = Server::start(&[], Stdio::inherit());
    s.send(json!({"id": 2, "method": "http/request", "params": {
        "method": "GET", "url": url, "requestId": "big", "streamResponse": true}}));
    // Nothing is read from the dialect's stdout beyond its pipe and the
    // reader thread's 16 lines. What the pipeline holds then stays: 1024
    // queued lines of at most 32 KiB each (about 45 MiB), pipes and socket
    // buffers; measured 65 MiB resident, steady. With deltas of up to
    // 1 MiB (the agent's pieces of this body, up to 400 KiB) it grew past
    // 200 MiB.
    std::thread::sleep(Duration::from_secs(10));
    let rss_mib = executor_tests::status_kib(s.child.id(), "VmRSS") >> 10;
    assert!(rss_mib < 128, "the dialect holds {rss_mib} MiB");
    // Reading resumes the stream where it stopped.
    let mut seq = 0;
    for _ in 0..200 {
        let d = s.next();
        if d["method"] == json!("http/request/bodyDelta") {
            seq += 1;
            assert_eq!(d["params"]["seq"], json!(seq));
            assert!(unb64(&d["params"]["deltaBase64"]).len() <= 32 << 10);
        }
    }
}

#[test]
fn a_streamed_request_id_is_refused_while_its_stream_is_open() {
    let (_rt, web) = web();
    let base = format!("http://{}", web.addr);
    let mut s = Server::start(&[], Stdio::inherit());
    s.send(json!({"id": 2, "method": "http/request", "params": {
        "method": "GET", "url": format!("{base}/slow?ms=1500"), "requestId": "d",
        "streamResponse": true}}));
    let dup = s.http(
        3,
        json!({"method": "GET", "url": format!("{base}/echo"), "requestId": "d",
               "streamResponse": true}),
    );
    assert_eq!(
        error(&dup),
        (
            -32602,
            "http/request streamResponse requestId `d` is already active".into()
        )
    );
    // A buffered request has no stream: its id is not checked (as the
    // reference).
    let buffered = s.http(
        4,
        json!({"method": "GET", "url": format!("{base}/echo"), "requestId": "d"}),
    );
    assert_eq!(buffered["result"]["status"], json!(200), "{buffered}");
    let (head, _) = s.answer(json!(2));
    assert_eq!(head["result"]["status"], json!(200), "{head}");
    loop {
        let d = s.next();
        if d["params"]["done"] == json!(true) {
            assert_eq!(d["params"]["requestId"], json!("d"));
            break;
        }
    }
    // Once its stream ended the id is free again.
    let again = s.http(
        5,
        json!({"method": "GET", "url": format!("{base}/echo"), "requestId": "d",
               "streamResponse": true}),
    );
    assert_eq!(again["result"]["status"], json!(200), "{again}");
    s.close();
}

#[test]
fn env_headers_come_from_the_executor_host_protected_names_refused_never_logged() {
    let (_rt, web) = web();
    let url = format!("http://{}/headers", web.addr);
    let dir = executor_tests::unique_tempdir("codex-http-env");
    let log = dir.join("stderr");
    let secret = "s3cret-from-the-host";
    let mut s = Server::start(
        &[
            ("CODEX_HTTP_TEST_TOKEN", secret),
            ("OPENAI_API_KEY", "sk-should-never-leave"),
            ("CODEX_HTTP_TEST_EMPTY", ""),
            ("RUST_LOG", "trace"),
        ],
        Stdio::from(std::fs::File::create(&log).unwrap()),
    );
    let r = s.http(
        2,
        json!({"method": "GET", "url": url, "requestId": "e", "headers": [
            {"name": "Authorization", "value": "Bearer ", "valueEnvVar": "CODEX_HTTP_TEST_TOKEN"}]}),
    );
    let seen = String::from_utf8(unb64(&r["result"]["bodyBase64"])).unwrap();
    assert!(
        seen.contains(&format!("authorization: Bearer {secret}\n")),
        "{seen}"
    );
    for (id, var) in [
        (3, "OPENAI_API_KEY"),
        (4, "codex_exec_server_noise_auth_token"),
    ] {
        let r = s.http(
            id,
            json!({"method": "GET", "url": url, "requestId": "e", "headers": [
                {"name": "X-Key", "value": "", "valueEnvVar": var}]}),
        );
        assert_eq!(
            error(&r),
            (
                -32602,
                format!("http/request header X-Key cannot use executor environment variable {var}")
            )
        );
    }
    let r = s.http(
        5,
        json!({"method": "GET", "url": url, "requestId": "e", "headers": [
            {"name": "X-Key", "value": "", "valueEnvVar": "CODEX_HTTP_TEST_MISSING"}]}),
    );
    assert_eq!(
        error(&r),
        (
            -32602,
            "http/request header X-Key requires executor environment variable CODEX_HTTP_TEST_MISSING".into()
        )
    );
    let r = s.http(
        6,
        json!({"method": "GET", "url": url, "requestId": "e", "headers": [
            {"name": "X-Key", "value": "", "valueEnvVar": "CODEX_HTTP_TEST_EMPTY"}]}),
    );
    assert_eq!(error(&r).0, -32602);
    // A Host header from a variable would be echoed in the refusal of a
    // mismatched Host: refused before it gets there.
    let r = s.http(
        7,
        json!({"method": "GET", "url": url, "requestId": "e", "headers": [
            {"name": "Host", "value": "", "valueEnvVar": "CODEX_HTTP_TEST_TOKEN"}]}),
    );
    let (code, message) = error(&r);
    assert_eq!(code, -32602);
    assert!(!message.contains(secret), "{message}");
    s.close();
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("TRACE"),
        "trace logging was on, so the check below means something: {logged}"
    );
    assert!(!logged.contains(secret), "the value is never logged");
    assert!(!logged.contains("sk-should-never-leave"));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn timeouts_bound_the_request_and_none_means_none() {
    let (_rt, web) = web();
    let base = format!("http://{}", web.addr);
    let mut s = Server::start(&[], Stdio::inherit());
    let started = Instant::now();
    let r = s.http(
        2,
        json!({"method": "GET", "url": format!("{base}/slow?ms=5000"), "requestId": "t",
               "timeoutMs": 300}),
    );
    let (code, message) = error(&r);
    assert_eq!(code, -32603, "{r}");
    assert!(message.starts_with("http/request failed: "), "{message}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    let r = s.http(
        3,
        json!({"method": "GET", "url": format!("{base}/slow?ms=400"), "requestId": "u",
               "timeoutMs": null}),
    );
    assert_eq!(r["result"]["status"], json!(200), "no timeout: {r}");
    // Streamed, the timeout bounds each silence of the body: the stream
    // ends with a last delta carrying the error.
    s.send(json!({"id": 4, "method": "http/request", "params": {
        "method": "GET", "url": format!("{base}/chunks?n=3&size=10&delay_ms=3000"),
        "requestId": "v", "streamResponse": true, "timeoutMs": 300}}));
    let (head, _) = s.answer(json!(4));
    assert_eq!(head["result"]["status"], json!(200), "{head}");
    let last = loop {
        let d = s.next();
        if d["params"]["done"] == json!(true) {
            break d;
        }
    };
    let error = last["params"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("timeout_ms 300"), "{last}");
    s.close();
}

// ---- websocket ----

/// `executor codex-exec-server --listen ws://127.0.0.1:0` and its address.
struct WsServer {
    child: Child,
    addr: String,
    /// The URL's path: the secret only the holder of the URL line knows.
    path: String,
}

impl Drop for WsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `executor` as uid 65534 (through `setpriv`) when `unprivileged` and
/// this process is root, else as this process's user.
fn executor_as(unprivileged: bool) -> Command {
    if unprivileged && executor_tests::current_uid() == 0 {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(executor_tests::executor_bin_for_any_user());
        c
    } else {
        Command::new(executor_bin())
    }
}

fn ws_server(unprivileged: bool) -> WsServer {
    let mut child = executor_as(unprivileged)
        .args([
            "codex-exec-server",
            "--listen",
            "ws://127.0.0.1:0",
            "--config",
        ])
        .arg(roomy_config())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start executor codex-exec-server --listen ws://");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let rest = line
        .trim_end()
        .strip_prefix("ws://127.0.0.1:")
        .unwrap_or_else(|| panic!("the URL line comes first: {line:?}"));
    let (port, path) = rest
        .split_once('/')
        .unwrap_or_else(|| panic!("the URL has a secret path: {line:?}"));
    let port: u16 = port.parse().expect("a port");
    assert_ne!(port, 0, "the bound port, not the asked 0");
    // The listener runs as the user asked for.
    let want_uid = if unprivileged && executor_tests::current_uid() == 0 {
        65534
    } else {
        executor_tests::current_uid()
    };
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|u| u.parse::<u32>().ok());
    assert_eq!(uid, Some(want_uid), "the listener's uid");
    assert_eq!(path.len(), 32, "a 128-bit secret: {line:?}");
    WsServer {
        child,
        addr: format!("127.0.0.1:{port}"),
        path: format!("/{path}"),
    }
}

/// One plain HTTP request: the status code and the whole answer.
fn http_get(addr: &str, path: &str, extra: &str) -> (u16, String) {
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(tcp, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}\r\n").unwrap();
    let mut text = String::new();
    let _ = tcp.read_to_string(&mut text);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("an HTTP answer: {text:?}"));
    (status, text)
}

const UPGRADE: &str = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";

/// A minimal websocket client (RFC 6455), independent of the server's
/// library.
struct Ws {
    tcp: TcpStream,
    buf: Vec<u8>,
}

impl Ws {
    fn connect(server: &WsServer) -> Ws {
        let (addr, path) = (&server.addr, &server.path);
        let mut tcp = TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        write!(tcp, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{UPGRADE}\r\n").unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let end = loop {
            let n = tcp.read(&mut chunk).unwrap();
            assert!(n > 0, "the server closed during the handshake");
            buf.extend_from_slice(&chunk[..n]);
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
        assert!(head.starts_with("http/1.1 101"), "{head}");
        // RFC 6455 §1.3: the accept value of this key.
        assert!(
            head.contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="),
            "{head}"
        );
        Ws {
            tcp,
            buf: buf[end..].to_vec(),
        }
    }

    fn send(&mut self, opcode: u8, data: &[u8]) {
        let mut frame = vec![0x80 | opcode];
        match data.len() {
            n if n < 126 => frame.push(0x80 | n as u8),
            n if n < 65536 => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                frame.push(0x80 | 127);
                frame.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        let mask = [0x12, 0x34, 0x56, 0x78];
        frame.extend_from_slice(&mask);
        frame.extend(data.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.tcp.write_all(&frame).unwrap();
    }

    fn need(&mut self, n: usize) -> Vec<u8> {
        let mut chunk = [0u8; 65536];
        while self.buf.len() < n {
            let got = self.tcp.read(&mut chunk).expect("a frame within 20 s");
            assert!(got > 0, "the server closed the connection");
            self.buf.extend_from_slice(&chunk[..got]);
        }
        self.buf.drain(..n).collect()
    }

    /// The next frame: its opcode and payload (server frames are unmasked).
    fn frame(&mut self) -> (u8, Vec<u8>) {
        let h = self.need(2);
        assert_eq!(h[1] & 0x80, 0, "server frames are not masked");
        let len = match h[1] & 0x7f {
            126 => u16::from_be_bytes(self.need(2).try_into().unwrap()) as usize,
            127 => u64::from_be_bytes(self.need(8).try_into().unwrap()) as usize,
            n => n as usize,
        };
        (h[0] & 0x0f, self.need(len))
    }

    /// The next JSON message (a text frame), pings and pongs skipped.
    fn json(&mut self) -> Value {
        loop {
            let (op, data) = self.frame();
            match op {
                1 => return serde_json::from_slice(&data).expect("a JSON text frame"),
                9 | 10 => continue,
                other => panic!("opcode {other}: {data:?}"),
            }
        }
    }

    fn request(&mut self, id: i64, method: &str, params: Value) -> Value {
        let line = json!({"id": id, "method": method, "params": params}).to_string();
        self.send(1, line.as_bytes());
        loop {
            let v = self.json();
            if v["id"] == json!(id) {
                return v;
            }
        }
    }
}

/// `$name::as_root` and `$name::as_unprivileged_user`: the body run with
/// the listener as this process's user, and as uid 65534 when root.
macro_rules! as_root_and_unprivileged {
    ($name:ident, $body:ident) => {
        mod $name {
            #[test]
            fn as_root() {
                super::$body(false);
            }
            #[test]
            fn as_unprivileged_user() {
                super::$body(true);
            }
        }
    };
}

as_root_and_unprivileged!(ws_url_line_readyz_and_origin_refused, ws_listener_checks);

fn ws_listener_checks(unprivileged: bool) {
    let server = ws_server(unprivileged);
    let addr = server.addr.as_str();
    assert_eq!(http_get(addr, "/readyz", "").0, 200);
    assert_eq!(
        http_get(addr, "/readyz", "Origin: http://evil.example\r\n").0,
        403
    );
    assert_eq!(http_get(addr, "/nope", "").0, 404);
    let path = server.path.as_str();
    let (status, text) = http_get(addr, path, "");
    assert_eq!(status, 400, "a GET that is no upgrade: {text}");
    let (status, text) = http_get(
        addr,
        path,
        &format!("{UPGRADE}Origin: http://localhost\r\n"),
    );
    assert_eq!(status, 403, "a browser's upgrade: {text}");
    // Review of issue 30: any local process (another user, a job whose
    // network is the host's) could open a session on the listener. Without
    // the URL's secret path, an upgrade is refused: at `/`, at a guessed
    // path, at a prefix of the secret. Layer: the dialect's listener.
    for guess in ["/", "/x", &path[..path.len() - 1]] {
        let (status, text) = http_get(addr, guess, UPGRADE);
        assert_eq!(status, 404, "an upgrade at {guess:?}: {text}");
    }
    // Still serving.
    assert_eq!(http_get(addr, "/readyz", "").0, 200);
    // No listener but on loopback, and none under a forced command.
    for (listen, forced) in [
        ("ws://0.0.0.0:0", None),
        ("ws://127.0.0.1:0", Some("executor codex-exec-server")),
    ] {
        let mut c = executor_as(unprivileged);
        c.args(["codex-exec-server", "--listen", listen]);
        if let Some(f) = forced {
            c.env("SSH_ORIGINAL_COMMAND", f);
        }
        let out = c.stdin(Stdio::null()).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{listen} {forced:?}");
        assert!(out.stdout.is_empty(), "no URL line");
        let why = String::from_utf8_lossy(&out.stderr);
        assert!(
            why.contains("loopback") || why.contains("forced command"),
            "{why}"
        );
    }
}

as_root_and_unprivileged!(ws_connections_serve_the_dialect, ws_serves_the_dialect);

fn ws_serves_the_dialect(unprivileged: bool) {
    let (_rt, web) = web();
    let server = ws_server(unprivileged);
    let mut a = Ws::connect(&server);
    let r = a.request(1, "initialize", json!({"clientName": "ws"}));
    let sid = r["result"]["sessionId"]
        .as_str()
        .expect("a session")
        .to_owned();
    // A binary frame carries JSON too; a line break inside a message is
    // only whitespace.
    a.send(2, br#"{"method": "initialized", "params": {}}"#);
    a.send(
        1,
        b"{\"id\": 2,\n \"method\": \"environment/status\",\r\n \"params\": {}}",
    );
    assert_eq!(a.json(), json!({"id": 2, "result": {"status": "ready"}}));
    let r = a.request(
        3,
        "http/request",
        json!({"method": "POST", "url": format!("http://{}/echo", web.addr),
               "requestId": "w", "bodyBase64": b64(b"over ws")}),
    );
    assert_eq!(unb64(&r["result"]["bodyBase64"]), b"over ws", "{r}");
    a.send(1, b"not json");
    let bad = a.json();
    assert_eq!(
        (bad["id"].clone(), bad["error"]["code"].clone()),
        (json!(-1), json!(-32600))
    );
    // A ping is answered with its payload.
    a.send(9, b"keepalive?");
    loop {
        let (op, data) = a.frame();
        if op == 10 {
            assert_eq!(data, b"keepalive?");
            break;
        }
    }
    // A second connection is a connection of its own.
    let mut b = Ws::connect(&server);
    let r = b.request(1, "initialize", json!({"clientName": "ws2"}));
    assert_ne!(r["result"]["sessionId"].as_str(), Some(sid.as_str()), "{r}");
    b.send(1, br#"{"method": "initialized"}"#);
    let r = b.request(2, "environment/status", json!({}));
    assert_eq!(r["result"]["status"], json!("ready"));
    let r = a.request(4, "environment/status", json!({}));
    assert_eq!(
        r["result"]["status"],
        json!("ready"),
        "the first one still serves"
    );
}

/// `valueEnvVar` under a profile reads only the variables its
/// `http.header_env` names (the native agent's rule, `policy_denied`
/// before any connection): a profile without the key reads none, even a
/// variable another profile may read; the executor's own credentials
/// never. The audit line names the variable, never its value.
#[test]
fn a_profile_names_the_variables_a_header_may_read() {
    let (_rt, web) = web();
    let url = format!("http://{}/headers", web.addr);
    let dir = executor_tests::unique_tempdir("codex-http-env-profile");
    let audit = dir.join("audit.jsonl");
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[limits]\nmax_detached_sessions = 1024\n[audit]\nfile = {audit:?}\n\
             [profiles.bare]\n[profiles.tokens.http]\nheader_env = [\"CODEX_HTTP_TEST_*\"]\n"
        ),
    )
    .unwrap();
    let secret = "s3cret-for-the-profile";
    let env = [
        ("CODEX_HTTP_TEST_TOKEN", secret),
        ("OTHER_HOST_SECRET", "other-s3cret"),
        ("OPENAI_API_KEY", "sk-never"),
    ];
    let header = |var: &str| {
        json!({"method": "GET", "url": url, "requestId": "e", "headers": [
            {"name": "Authorization", "value": "Bearer ", "valueEnvVar": var}]})
    };
    let start = |profile: &str| {
        Server::start_with(
            &env,
            Stdio::inherit(),
            &[
                "--config".as_ref(),
                config.as_os_str(),
                "--profile".as_ref(),
                profile.as_ref(),
            ],
        )
    };
    let mut bare = start("bare");
    for (id, var) in [(2, "CODEX_HTTP_TEST_TOKEN"), (3, "OTHER_HOST_SECRET")] {
        let (code, message) = error(&bare.http(id, header(var)));
        assert_eq!(code, -32600, "{message}");
        assert!(
            message.contains("profile bare names no variable in http.header_env"),
            "{message}"
        );
    }
    bare.close();
    let mut tokens = start("tokens");
    // Positive control: the variable the profile names.
    let r = tokens.http(2, header("CODEX_HTTP_TEST_TOKEN"));
    let seen = String::from_utf8(unb64(&r["result"]["bodyBase64"])).unwrap();
    assert!(
        seen.contains(&format!("authorization: Bearer {secret}\n")),
        "{seen}"
    );
    let (code, message) = error(&tokens.http(3, header("OTHER_HOST_SECRET")));
    assert_eq!(code, -32600, "{message}");
    assert!(
        message.contains("OTHER_HOST_SECRET is not in http.header_env of profile tokens"),
        "{message}"
    );
    // Whether a variable the profile does not name is set is not told:
    // an unset one is refused in the same words.
    let (code, message) = error(&tokens.http(5, header("NOPE_NEVER_SET")));
    assert_eq!(code, -32600, "{message}");
    assert!(
        message.contains("NOPE_NEVER_SET is not in http.header_env of profile tokens"),
        "{message}"
    );
    // A prefix rule does not reach the credentials it would match.
    let (code, _) = error(&tokens.http(4, header("OPENAI_API_KEY")));
    assert_eq!(code, -32602);
    tokens.close();
    let lines = std::fs::read_to_string(&audit).unwrap();
    assert!(
        !lines.contains(secret) && !lines.contains("other-s3cret") && !lines.contains("sk-never")
    );
    let read: Vec<Value> = lines
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["method"] == json!("http/request"))
        .collect();
    assert!(
        read.iter()
            .any(|v| v["header_env"] == json!(["CODEX_HTTP_TEST_TOKEN"])),
        "{lines}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A client that asks and does not read: what waits for it is bounded in
/// bytes, not only in lines. Two hundred 1 MiB `fs/readBlock`s (1.4 MB
/// answers each) sent while nothing is read: once the server stops making
/// progress its memory is within its 64 MiB budget and a few lines in
/// flight (before, 1,024 lines of any size could wait: 280 MB here), and
/// once the client reads again every answer arrives, whole and in order.
#[test]
fn answers_waiting_for_a_client_that_does_not_read_are_bounded_in_bytes() {
    let dir = executor_tests::unique_tempdir("codex-out-budget");
    let f = dir.join("big");
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + i / 4099) as u8).collect();
    std::fs::write(&f, &data).unwrap();
    let mut s = Server::start(&[], Stdio::inherit());
    let pid = s.child.id();
    let r = s.request(
        2,
        "fs/open",
        json!({"handleId": "h", "path": format!("file://{}", f.display())}),
    );
    assert!(r.get("result").is_some(), "{r}");
    let n = 200;
    for id in 0..n {
        s.send(json!({"id": 100 + id, "method": "fs/readBlock",
                      "params": {"handleId": "h", "offset": 0, "len": 1 << 20}}));
    }
    // Until the server stops growing (it waits for the client, or it is
    // done): no sample above the bound.
    let (mut last, mut still, started) = (0, 0, Instant::now());
    while still < 4 && started.elapsed() < Duration::from_secs(90) {
        std::thread::sleep(Duration::from_millis(500));
        let rss = executor_tests::status_kib(pid, "VmRSS");
        assert!(
            rss < 200 * 1024,
            "the server holds {rss} KiB for a client that reads nothing"
        );
        still = if rss.abs_diff(last) < 2048 {
            still + 1
        } else {
            0
        };
        last = rss;
    }
    let want = b64(&data);
    for id in 0..n {
        let v = s.next();
        assert_eq!(v["id"], json!(100 + id));
        assert!(
            v["result"]["chunk"].as_str() == Some(want.as_str()),
            "answer {id}"
        );
    }
    s.close();
    let _ = std::fs::remove_dir_all(dir);
}
