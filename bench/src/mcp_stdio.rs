//! `mcp-stdio`: the latency of a trivial MCP `tools/call` through
//! `executor-client mcp stdio` against the same server started the usual
//! way, with one small client for every side: newline-delimited JSON-RPC
//! written to the command's stdin, each answer read from its stdout by id,
//! 1,000 calls one after the other after `initialize`.
//!
//! - **local**: `executor-client --target local mcp stdio -- python3
//!   server.py` vs `python3 server.py` run directly;
//! - **ssh**: `executor-client -F cfg --target bench mcp stdio -- python3
//!   server.py` vs `ssh -F cfg bench python3 server.py`, both through one
//!   ControlMaster opened before the clock starts, to the test sshd.
//!
//! The server is the test suite's Python MCP SDK server
//! (`tests/suite/mcp_stdio/server.py`, its `add` tool); it needs `python3`
//! with the `mcp` package.

use crate::ssh_read::write_ssh_config;
use crate::{median, scratch, Row};
use anyhow::{bail, Context};
use executor_tests::sshd::Sshd;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SERVER: &str = include_str!("../../tests/suite/mcp_stdio/server.py");

/// Sequential calls per trial.
const CALLS: usize = 1000;
/// Trials of each side (alternating); the best median is reported.
const TRIALS: usize = 3;

/// The Python interpreter that imports the MCP SDK (absolute: a job or an
/// ssh command gets the host user's PATH, which may not hold it).
fn python() -> anyhow::Result<String> {
    let out = Command::new("python3")
        .args(["-c", "import sys, mcp; print(sys.executable)"])
        .output()
        .context("running python3")?;
    if !out.status.success() {
        bail!("python3 cannot import the MCP SDK (python3 -m pip install \"mcp>=1.0\")");
    }
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

/// The Python that imports the SDK, and the server script written to the
/// bench's scratch directory.
pub(crate) fn server() -> anyhow::Result<(String, String)> {
    let python = python()?;
    let server = scratch()?.join("mcp_server.py");
    std::fs::write(&server, SERVER)?;
    Ok((python, server.to_str().context("utf-8 path")?.to_string()))
}

/// Start `cmd` as an MCP stdio server, `initialize` it, then make `calls`
/// sequential `tools/call`s of `add`: the time of each call (request
/// written to its answer read).
fn session(mut cmd: Command, calls: usize, what: &str) -> anyhow::Result<Vec<Duration>> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    let mut stdin = child.stdin.take().context("stdin")?;
    let mut stdout = BufReader::new(child.stdout.take().context("stdout")?);
    let mut line = String::new();
    // The answer to request `id` (notifications and other lines skipped).
    let mut answer = |id: u64, line: &mut String| -> anyhow::Result<serde_json::Value> {
        loop {
            line.clear();
            if stdout.read_line(line)? == 0 {
                bail!("{what} closed its stdout before answering request {id}");
            }
            let v: serde_json::Value = serde_json::from_str(line)
                .with_context(|| format!("{what} wrote a line that is not JSON: {line:?}"))?;
            if v["id"] == id {
                if v.get("error").is_some() {
                    bail!("{what} answered request {id} with an error: {line}");
                }
                return Ok(v);
            }
        }
    };
    let init = serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "executor-bench", "version": "1"}}});
    writeln!(stdin, "{init}")?;
    stdin.flush()?;
    answer(0, &mut line)?;
    writeln!(
        stdin,
        "{}",
        serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
    )?;
    let mut times = Vec::with_capacity(calls);
    for i in 1..=calls as u64 {
        let req = serde_json::json!({"jsonrpc": "2.0", "id": i, "method": "tools/call",
            "params": {"name": "add", "arguments": {"a": i, "b": 1}}});
        let t = Instant::now();
        writeln!(stdin, "{req}")?;
        stdin.flush()?;
        let v = answer(i, &mut line)?;
        times.push(t.elapsed());
        let got = v["result"]["content"][0]["text"].as_str().unwrap_or("");
        if got != (i + 1).to_string() {
            bail!("{what}: call {i} answered {got:?}, not {}", i + 1);
        }
    }
    drop(stdin);
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.wait();
    Ok(times)
}

/// The best (lowest) per-call median and its p99 over alternating trials
/// of `ours` and `base`.
fn compare(
    ours: &dyn Fn() -> Command,
    base: &dyn Fn() -> Command,
) -> anyhow::Result<((Duration, Duration), (Duration, Duration))> {
    // One untimed short session of each warms caches (and the imports).
    session(ours(), 20, "executor-client mcp stdio")?;
    session(base(), 20, "the server")?;
    let (mut o, mut b) = (Vec::new(), Vec::new());
    for _ in 0..TRIALS {
        o.push(summary(session(
            ours(),
            CALLS,
            "executor-client mcp stdio",
        )?));
        b.push(summary(session(base(), CALLS, "the server")?));
    }
    let pick = |v: Vec<(Duration, Duration)>| v.into_iter().min().unwrap_or_default();
    Ok((pick(o), pick(b)))
}

/// The median and the 99th percentile of `times`.
pub(crate) fn summary(mut times: Vec<Duration>) -> (Duration, Duration) {
    times.sort();
    let p99 = times[(times.len() * 99 / 100).min(times.len() - 1)];
    (median(times), p99)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Both rows: local, then over the test sshd.
pub async fn rows() -> anyhow::Result<Vec<Row>> {
    tokio::task::spawn_blocking(|| {
        let (python, server) = server()?;
        let agent = executor_client::target::local_executor()?;
        let client = agent.with_file_name("executor-client");
        let mut rows = Vec::new();

        let ours = || {
            let mut c = Command::new(&client);
            c.args(["--target", "local", "mcp", "stdio", "--"])
                .args([&python, &server])
                .env_remove("EXECUTOR_TARGET");
            c
        };
        let base = || {
            let mut c = Command::new(&python);
            c.arg(&server);
            c
        };
        let ((o, op99), (b, bp99)) = compare(&ours, &base)?;
        let ratio = o.as_secs_f64() / b.as_secs_f64();
        rows.push(Row {
            what: format!(
                "MCP `tools/call` latency, {CALLS} sequential calls of a trivial tool (Python SDK server): \
                 `executor-client --target local mcp stdio -- python3 server.py` vs `python3 server.py` \
                 (best median of {TRIALS}, alternating)"
            ),
            ours: format!("{:.3} ms median, {:.3} ms p99", ms(o), ms(op99)),
            baseline: format!("{:.3} ms median, {:.3} ms p99", ms(b), ms(bp99)),
            ratio,
            goal: "≤ 1.5× the server run directly".into(),
            met: Some(ratio <= 1.5),
            note: "one client for both sides: JSON-RPC lines written to the command's stdin, each answer read \
                   by id from its stdout; timed from the request written to its answer read, after `initialize`"
                .into(),
        });

        let sshd = Sshd::start("", "");
        let cfg = write_ssh_config(&sshd)?;
        let ctl = [
            format!("ControlPath={}", sshd.dir.join("mcp-ctl").display()),
            "ControlMaster=auto".to_string(),
            "ControlPersist=120".to_string(),
        ];
        let mut master = Command::new("ssh");
        master.arg("-F").arg(&cfg).arg("-T");
        for o in &ctl {
            master.arg("-o").arg(o);
        }
        let st = master
            .args(["bench", "true"])
            .stdout(Stdio::null())
            .status()?;
        if !st.success() {
            bail!("opening the ControlMaster: {st}");
        }
        let ours = || {
            let mut c = Command::new(&client);
            c.arg("-F").arg(&cfg);
            for o in &ctl {
                c.arg("-o").arg(o);
            }
            c.arg("--remote-command")
                .arg(&agent)
                .args(["--target", "bench", "mcp", "stdio", "--"])
                .args([&python, &server])
                .env_remove("EXECUTOR_TARGET");
            c
        };
        let base = || {
            let mut c = Command::new("ssh");
            c.arg("-F").arg(&cfg).arg("-T");
            for o in &ctl {
                c.arg("-o").arg(o);
            }
            c.args(["bench", &python, &server]);
            c
        };
        let compared = compare(&ours, &base);
        // The same executor side against `ssh host CMD` as an MCP client
        // configuration names it (no ControlMaster: its own connection,
        // opened before the clock starts, as every side's is).
        let plain = || {
            let mut c = Command::new("ssh");
            c.arg("-F").arg(&cfg).arg("-T");
            c.args(["bench", &python, &server]);
            c
        };
        let plain_compared = compared.as_ref().ok().map(|_| compare(&ours, &plain));
        let mut exit = Command::new("ssh");
        exit.arg("-F").arg(&cfg);
        for o in &ctl {
            exit.arg("-o").arg(o);
        }
        let _ = exit
            .args(["-O", "exit", "bench"])
            .stderr(Stdio::null())
            .status();
        let ((o, op99), (b, bp99)) = compared?;
        let ((po, pop99), (pb, pbp99)) = plain_compared.context("not run")??;
        let ratio = o.as_secs_f64() / b.as_secs_f64();
        rows.push(Row {
            what: format!(
                "MCP `tools/call` latency over real sshd, {CALLS} sequential calls: `executor-client --target host \
                 mcp stdio -- python3 server.py` vs `ssh host python3 server.py` as the MCP command, one warm \
                 ControlMaster for both (best median of {TRIALS}, alternating)"
            ),
            ours: format!("{:.3} ms median, {:.3} ms p99", ms(o), ms(op99)),
            baseline: format!("{:.3} ms median, {:.3} ms p99", ms(b), ms(bp99)),
            ratio,
            goal: "faster than ssh (< 1×)".into(),
            met: Some(ratio < 1.0),
            note: "the same client as the local row; both commands go through the same ControlMaster (opened \
                   before the clock starts); the executor side adds the agent between sshd and the server"
                .into(),
        });
        let ratio = po.as_secs_f64() / pb.as_secs_f64();
        rows.push(Row {
            what: format!(
                "MCP `tools/call` latency over real sshd, {CALLS} sequential calls: `executor-client --target host \
                 mcp stdio -- python3 server.py` through a warm ControlMaster vs `ssh host python3 server.py` with \
                 a connection of its own (best median of {TRIALS}, alternating)"
            ),
            ours: format!("{:.3} ms median, {:.3} ms p99", ms(po), ms(pop99)),
            baseline: format!("{:.3} ms median, {:.3} ms p99", ms(pb), ms(pbp99)),
            ratio,
            goal: "faster than ssh (< 1×)".into(),
            met: Some(ratio < 1.0),
            note: "the baseline as an MCP client configuration names it (`ssh host CMD`, no ControlMaster); both \
                   connections are up before the clock starts (after `initialize`), so neither side's handshake \
                   is in the time"
                .into(),
        });
        Ok(rows)
    })
    .await?
}
