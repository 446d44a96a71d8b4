//! The Codex dialect against Codex's own exec-server, through one client:
//! a small NDJSON JSON-RPC driver of a stdio server (as Codex's client
//! drives it), run on `executor codex-exec-server --listen stdio` and on
//! `codex exec-server --listen stdio` (@openai/codex 0.171.0, from
//! `EXECUTOR_CODEX_BIN` or /opt/codex-ref), alternating the two sides.

use super::{best, median, Row};
use anyhow::{bail, Context};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// The data fields of bulk lines (`fs/readBlock`'s `chunk`, a body
/// delta's `deltaBase64`): taken out of the line and decoded as bytes,
/// not parsed into a JSON string.
const DATA_KEYS: [&[u8]; 2] = [b"\"chunk\":\"", b"\"deltaBase64\":\""];
/// A data field is looked for in this many first bytes of a line (both
/// servers put it right after the envelope's first keys).
const DATA_KEY_WITHIN: usize = 256;
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

fn codex_bin() -> PathBuf {
    std::env::var_os("EXECUTOR_CODEX_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/opt/codex-ref/node_modules/.bin/codex".into())
}

/// One stdio exec-server and its lines.
struct Server {
    child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
    line: Vec<u8>,
    /// The decoded data field of the last line read (see [`DATA_KEYS`]).
    data: Vec<u8>,
    next_id: i64,
    /// Which server this is, in errors.
    name: &'static str,
    /// Notifications read while waiting for an answer, in order.
    pending: std::collections::VecDeque<Value>,
}

impl Server {
    async fn start(reference: bool, home: &std::path::Path) -> anyhow::Result<Server> {
        let mut cmd = if reference {
            let mut c = Command::new(codex_bin());
            c.args(["exec-server", "--listen", "stdio"])
                .env("CODEX_HOME", home);
            c
        } else {
            let bin =
                executor_client::target::local_executor().context("finding the executor binary")?;
            let mut c = Command::new(bin);
            c.args(["codex-exec-server", "--listen", "stdio"]);
            c
        };
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true);
        let mut child = cmd.spawn().context("starting an exec-server")?;
        let stdin = child.stdin.take().context("stdin")?;
        let out = BufReader::with_capacity(4 << 20, child.stdout.take().context("stdout")?);
        let mut s = Server {
            child,
            stdin,
            out,
            line: Vec::new(),
            data: Vec::new(),
            name: if reference {
                "codex exec-server"
            } else {
                "executor"
            },
            next_id: 1,
            pending: Default::default(),
        };
        s.call("initialize", json!({"clientName": "bench"})).await?;
        s.send(json!({"method": "initialized", "params": {}}))
            .await?;
        Ok(s)
    }

    async fn send(&mut self, v: Value) -> anyhow::Result<()> {
        let mut line = serde_json::to_vec(&v)?;
        line.push(b'\n');
        self.stdin.write_all(&line).await?;
        Ok(())
    }

    async fn next(&mut self) -> anyhow::Result<Value> {
        if let Some(v) = self.pending.pop_front() {
            return Ok(v);
        }
        self.read().await
    }

    /// The next line as JSON; a data field (see [`DATA_KEYS`]) is decoded
    /// into `self.data` and left as `""` in the value.
    async fn read(&mut self) -> anyhow::Result<Value> {
        self.line.clear();
        self.data.clear();
        let read = self.out.read_until(b'\n', &mut self.line);
        let Ok(n) = tokio::time::timeout(Duration::from_secs(30), read).await else {
            bail!("{}: no line for 30 s", self.name);
        };
        if n? == 0 {
            bail!("{}: the server ended", self.name);
        }
        let line = &self.line[..];
        let head = &line[..line.len().min(DATA_KEY_WITHIN)];
        let found = DATA_KEYS.iter().find_map(|k| {
            head.windows(k.len())
                .position(|w| w == *k)
                .map(|at| at + k.len())
        });
        let Some(start) = found else {
            return Ok(serde_json::from_slice(line)?);
        };
        let len = memchr::memchr(b'"', &line[start..]).context("an unterminated data field")?;
        // base64-simd for both servers' lines alike: the client's decode
        // is a cost both sides share, kept small so that the servers' own
        // work is what the ratio shows.
        base64_simd::STANDARD.decode_append(&line[start..start + len], &mut self.data)?;
        let mut rest = Vec::with_capacity(line.len() - len);
        rest.extend_from_slice(&line[..start]);
        rest.extend_from_slice(&line[start + len..]);
        Ok(serde_json::from_slice(&rest)?)
    }

    async fn call(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(json!({"id": id, "method": method, "params": params}))
            .await?;
        loop {
            // A notification may come before the answer (a job's exit
            // before its start's answer): kept for `next`.
            let v = self.read().await?;
            if v["id"] == json!(id) {
                if let Some(e) = v.get("error") {
                    bail!("{method}: {e}");
                }
                return Ok(v["result"].clone());
            }
            if v.get("id").is_none() && !self.data.is_empty() {
                bail!("{method}: a notification with data came before its answer");
            }
            if v.get("id").is_none() {
                self.pending.push_back(v);
            }
        }
    }

    /// `/bin/true` started and seen closed.
    async fn true_once(&mut self, n: usize, sandbox: &Value) -> anyhow::Result<Duration> {
        let pid = format!("p{n}");
        let t = Instant::now();
        self.call(
            "process/start",
            json!({"processId": pid, "argv": ["/bin/true"], "cwd": "file:///tmp",
                   "env": {"PATH": "/usr/bin:/bin"}, "tty": false, "sandbox": sandbox}),
        )
        .await?;
        loop {
            let v = self.next().await?;
            if v["method"] == json!("process/closed") && v["params"]["processId"] == json!(pid) {
                break;
            }
        }
        let took = t.elapsed();
        self.call("process/terminate", json!({"processId": pid}))
            .await?;
        Ok(took)
    }

    /// `path` read whole through `fs/open` + 1 MiB `fs/readBlock`s.
    async fn read_whole(&mut self, n: usize, path: &str) -> anyhow::Result<(Duration, u64)> {
        let h = format!("h{n}");
        let t = Instant::now();
        self.call("fs/open", json!({"handleId": h, "path": path}))
            .await?;
        let (mut offset, mut total) = (0u64, 0u64);
        loop {
            let r = self
                .call(
                    "fs/readBlock",
                    json!({"handleId": h, "offset": offset, "len": 1 << 20}),
                )
                .await?;
            anyhow::ensure!(r["chunk"] == json!(""), "fs/readBlock: no chunk");
            let n = self.data.len() as u64;
            offset += n;
            total += n;
            if r["eof"] == json!(true) || n == 0 {
                break;
            }
        }
        let took = t.elapsed();
        self.call("fs/close", json!({"handleId": h})).await?;
        Ok((took, total))
    }

    async fn end(mut self) {
        drop(self.stdin);
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
    }
}

fn home() -> anyhow::Result<PathBuf> {
    let h = std::env::temp_dir()
        .parent()
        .unwrap_or(std::path::Path::new("/"))
        .join(format!(
            "var/tmp/executor-bench-codex-{}",
            std::process::id()
        ));
    let h = if h.starts_with("/var/tmp") {
        h
    } else {
        PathBuf::from(format!(
            "/var/tmp/executor-bench-codex-{}",
            std::process::id()
        ))
    };
    std::fs::create_dir_all(&h)?;
    Ok(h)
}

/// `/bin/true` start → closed, median of `n` each, alternating; with
/// `sandbox` (Codex's read-only profile) when `sandboxed`.
pub async fn start_latency(n: usize, sandboxed: bool) -> anyhow::Result<Row> {
    let home = home()?;
    let sandbox = if sandboxed {
        read_only_sandbox()
    } else {
        Value::Null
    };
    let mut ours = Server::start(false, &home).await?;
    let mut theirs = Server::start(true, &home).await?;
    for i in 0..5 {
        ours.true_once(100_000 + i, &sandbox).await?;
        theirs.true_once(100_000 + i, &sandbox).await?;
    }
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for i in 0..n {
        a.push(
            ours.true_once(i, &sandbox)
                .await
                .with_context(|| format!("start {i} of {n}"))?,
        );
        b.push(
            theirs
                .true_once(i, &sandbox)
                .await
                .with_context(|| format!("start {i} of {n}"))?,
        );
    }
    ours.end().await;
    theirs.end().await;
    let (a, b) = (median(a), median(b));
    let ratio = b.as_secs_f64() / a.as_secs_f64();
    Ok(Row {
        what: format!(
            "Codex dialect: {}`/bin/true` process/start → process/closed (median of {n}, alternating)",
            if sandboxed { "sandboxed (Codex's read-only profile) " } else { "" }
        ),
        ours: format!("{} µs", a.as_micros()),
        baseline: format!("{} µs (`codex exec-server` 0.171.0)", b.as_micros()),
        ratio,
        goal: "≥ 2× faster".into(),
        met: Some(ratio >= 2.0),
        note: "both servers driven by the same NDJSON client over stdio pipes; ratio = Codex's time / executor's (higher is better)".into(),
    })
}

/// Codex's read-only permission profile as 0.171.0 sends it (the cwd and
/// roots adapted to /tmp; the reference requires `windowsSandboxLevel`
/// and `useLegacyLandlock`).
fn read_only_sandbox() -> Value {
    json!({
        "permissions": {"type": "managed", "file_system": {"type": "restricted", "entries": [
            {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"}
        ]}, "network": "restricted"},
        "cwd": "file:///tmp", "workspaceRoots": ["file:///tmp"],
        "windowsSandboxLevel": "disabled", "useLegacyLandlock": false
    })
}

/// A `bytes` file read whole through fs/open + fs/readBlock, best of 3
/// each, alternating.
pub async fn read_throughput(bytes: u64) -> anyhow::Result<Row> {
    let home = home()?;
    let file = home.join("read.bin");
    {
        let f = std::fs::File::create(&file)?;
        f.set_len(bytes)?;
    }
    // In the page cache before either side reads it (the first side to
    // read would otherwise pay for filling it).
    std::io::copy(&mut std::fs::File::open(&file)?, &mut std::io::sink())?;
    let uri = format!("file://{}", file.display());
    let mut ours = Server::start(false, &home).await?;
    let mut theirs = Server::start(true, &home).await?;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for i in 0..3 {
        let (t, n) = ours.read_whole(i, &uri).await?;
        anyhow::ensure!(n == bytes, "executor read {n} of {bytes} bytes");
        a.push(t);
        let (t, n) = theirs.read_whole(i, &uri).await?;
        anyhow::ensure!(n == bytes, "codex read {n} of {bytes} bytes");
        b.push(t);
    }
    ours.end().await;
    theirs.end().await;
    let _ = std::fs::remove_file(&file);
    let (a, b) = (best(a), best(b));
    let mbs = |d: Duration| bytes as f64 / d.as_secs_f64() / 1e6;
    let ratio = mbs(a) / mbs(b);
    Ok(Row {
        what: format!(
            "Codex dialect: read {} MiB through fs/open + 1 MiB fs/readBlock (best of 3, alternating)",
            bytes >> 20
        ),
        ours: format!("{:.0} MB/s", mbs(a)),
        baseline: format!("{:.0} MB/s (`codex exec-server` 0.171.0)", mbs(b)),
        ratio,
        goal: "≥ 3× faster".into(),
        met: Some(ratio >= 3.0),
        note: "JSON + base64 on both sides; the same client decodes every block".into(),
    })
}

/// A loopback HTTP/1.1 server answering every request with `bytes` bytes
/// (written 1 MiB at a time); its port.
fn body_server(bytes: u64) -> anyhow::Result<u16> {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {bytes}\r\nConnection: close\r\n\r\n"
                );
                if conn.write_all(answer.as_bytes()).is_err() {
                    return;
                }
                let block = vec![0x5au8; 1 << 20];
                let mut left = bytes;
                while left > 0 {
                    let n = left.min(block.len() as u64) as usize;
                    if conn.write_all(&block[..n]).is_err() {
                        return;
                    }
                    left -= n as u64;
                }
            });
        }
    });
    Ok(port)
}

impl Server {
    /// One streamed `http/request` of `url`: the body's bytes counted from
    /// its deltas until the last (the answer may come before or after
    /// them).
    async fn stream_once(&mut self, n: usize, url: &str) -> anyhow::Result<(Duration, u64)> {
        let id = self.next_id;
        self.next_id += 1;
        let rid = format!("r{n}");
        let t = Instant::now();
        self.send(json!({"id": id, "method": "http/request", "params": {
            "method": "GET", "url": url, "requestId": rid, "streamResponse": true}}))
            .await?;
        let (mut total, mut answered, mut done) = (0u64, false, false);
        while !(answered && done) {
            let v = self.read().await?;
            if v["id"] == json!(id) {
                if let Some(e) = v.get("error") {
                    bail!("http/request: {e}");
                }
                anyhow::ensure!(
                    v["result"]["status"] == json!(200),
                    "http/request: {}",
                    v["result"]
                );
                answered = true;
            } else if v["method"] == json!("http/request/bodyDelta")
                && v["params"]["requestId"] == json!(rid)
            {
                total += self.data.len() as u64;
                if let Some(e) = v["params"]["error"].as_str() {
                    bail!("http/request body: {e}");
                }
                done = v["params"]["done"] == json!(true);
            }
        }
        Ok((t.elapsed(), total))
    }
}

/// A `bytes` body streamed from a loopback server through `http/request`
/// (`streamResponse: true`), best of 3 each, alternating.
pub async fn http_stream_throughput(bytes: u64) -> anyhow::Result<Row> {
    let home = home()?;
    let url = format!("http://127.0.0.1:{}/body", body_server(bytes)?);
    let mut ours = Server::start(false, &home).await?;
    let mut theirs = Server::start(true, &home).await?;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for i in 0..3 {
        let (t, n) = ours.stream_once(i, &url).await?;
        anyhow::ensure!(n == bytes, "executor streamed {n} of {bytes} bytes");
        a.push(t);
        let (t, n) = theirs.stream_once(i, &url).await?;
        anyhow::ensure!(n == bytes, "codex streamed {n} of {bytes} bytes");
        b.push(t);
    }
    ours.end().await;
    theirs.end().await;
    let (a, b) = (best(a), best(b));
    let mbs = |d: Duration| bytes as f64 / d.as_secs_f64() / 1e6;
    let ratio = mbs(a) / mbs(b);
    Ok(Row {
        what: format!(
            "Codex dialect: a {} MiB body streamed from a loopback server through http/request (streamResponse, best of 3, alternating)",
            bytes >> 20
        ),
        ours: format!("{:.0} MB/s", mbs(a)),
        baseline: format!("{:.0} MB/s (`codex exec-server` 0.171.0)", mbs(b)),
        ratio,
        goal: "none set (issue 30 names the row)".into(),
        met: None,
        note: "JSON + base64 deltas on both sides; the same client decodes every delta".into(),
    })
}
