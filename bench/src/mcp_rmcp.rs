//! `mcp-rmcp`: the latency of a trivial MCP `tools/call` from an rmcp
//! client in this process, through the client library's transport
//! ([`JobTransport`] over the native SSH transport to the test sshd,
//! which starts the agent), against the same rmcp client on
//! `ssh host python3 server.py` (OpenSSH, a connection of its own), the
//! way an rmcp user names a remote server today. One cipher for both
//! (`chacha20-poly1305@openssh.com`, russh's first choice); both
//! connections are up and `initialize` answered before the clock starts.
//!
//! Each side's path per call: ours, rmcp → russh → sshd → agent → the
//! server's pipes; the baseline, rmcp → pipes → ssh → sshd → the server's
//! pipes. The same number of processes between client and server.

use crate::mcp_stdio::{server, summary};
use crate::ssh_read::write_ssh_config;
use crate::Row;
use anyhow::{bail, Context};
use executor_client::mcp::rmcp::model::CallToolRequestParams;
use executor_client::mcp::rmcp::service::RoleClient;
use executor_client::mcp::rmcp::transport::IntoTransport;
use executor_client::mcp::rmcp::ServiceExt;
use executor_client::mcp::{JobCommand, JobTransport};
use executor_client::{Client, ClientOptions};
use executor_tests::sshd::Sshd;
use std::time::{Duration, Instant};

/// Sequential calls per trial.
const CALLS: usize = 1000;
/// Trials of each side (alternating); the best median is reported.
const TRIALS: usize = 3;
/// The cipher both sides use.
const CIPHER: &str = "chacha20-poly1305@openssh.com";

/// `calls` sequential `tools/call`s of `add` through rmcp on `transport`,
/// after its `initialize`: the time of each.
async fn calls<T, E, A>(transport: T, calls: usize, what: &str) -> anyhow::Result<Vec<Duration>>
where
    T: IntoTransport<RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    let service = ().serve(transport).await.with_context(|| format!("{what}: the MCP handshake"))?;
    let mut times = Vec::with_capacity(calls);
    for i in 1..=calls as u64 {
        let serde_json::Value::Object(args) = serde_json::json!({"a": i, "b": 1}) else {
            unreachable!("an object literal");
        };
        let p = CallToolRequestParams::new("add").with_arguments(args);
        let t = Instant::now();
        let r = service
            .call_tool(p)
            .await
            .with_context(|| format!("{what}: call {i}"))?;
        times.push(t.elapsed());
        let got = r
            .content
            .first()
            .and_then(|c| c.as_text())
            .map(|t| t.text.clone())
            .unwrap_or_default();
        if got != (i + 1).to_string() {
            bail!("{what}: call {i} answered {got:?}, not {}", i + 1);
        }
    }
    service.cancel().await.context("closing the MCP session")?;
    Ok(times)
}

/// The row.
pub async fn row() -> anyhow::Result<Row> {
    let (python, server) = server()?;
    let agent = executor_client::target::local_executor()?;
    let sshd = Sshd::start("", "");
    let cfg = write_ssh_config(&sshd)?;
    let native = sshd.native_options(&agent);
    let ours = |n: usize| {
        let (native, python, server) = (native.clone(), python.clone(), server.clone());
        async move {
            let client =
                Client::connect_native_ssh("127.0.0.1", &native, ClientOptions::default()).await?;
            let t = JobTransport::start(&client, JobCommand::new(&python).arg(&server)).await?;
            let times = calls(t, n, "rmcp through the library").await?;
            client.close().await?;
            anyhow::Ok(times)
        }
    };
    let base = |n: usize| {
        let (cfg, python, server) = (cfg.clone(), python.clone(), server.clone());
        async move {
            let mut child = tokio::process::Command::new("ssh")
                .arg("-F")
                .arg(&cfg)
                .args(["-T", "-o", &format!("Ciphers={CIPHER}"), "bench"])
                .args([&python, &server])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .context("starting ssh")?;
            let stdout = child.stdout.take().context("stdout")?;
            let stdin = child.stdin.take().context("stdin")?;
            let times = calls((stdout, stdin), n, "rmcp on `ssh host server.py`").await?;
            let _ = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
            anyhow::Ok(times)
        }
    };
    // One untimed short session of each warms caches (and the imports).
    ours(20).await?;
    base(20).await?;
    let (mut o, mut b) = (Vec::new(), Vec::new());
    for _ in 0..TRIALS {
        o.push(summary(ours(CALLS).await?));
        b.push(summary(base(CALLS).await?));
    }
    let pick = |v: Vec<(Duration, Duration)>| v.into_iter().min().unwrap_or_default();
    let ((o, op99), (b, bp99)) = (pick(o), pick(b));
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let ratio = o.as_secs_f64() / b.as_secs_f64();
    Ok(Row {
        what: format!(
            "MCP `tools/call` latency over real sshd, {CALLS} sequential calls, an rmcp client in-process: \
             the client library's `JobTransport` over its native SSH transport vs rmcp on `ssh host python3 \
             server.py` (best median of {TRIALS}, alternating)"
        ),
        ours: format!("{:.3} ms median, {:.3} ms p99", ms(o), ms(op99)),
        baseline: format!("{:.3} ms median, {:.3} ms p99", ms(b), ms(bp99)),
        ratio,
        goal: "faster than ssh (< 1×)".into(),
        met: Some(ratio < 1.0),
        note: format!(
            "one rmcp client for both sides, one cipher ({CIPHER}); each side's connection is its own, up and \
             `initialize` answered before the clock starts; the agent serves the job in the process sshd \
             started (no detached session)"
        ),
    })
}
