//! Egress by name (docs/PROTOCOL.md §8): a download through a sandboxed
//! job's proxy vs the same download by an unsandboxed job.

use crate::{best, connect, env, mbps, Row, TRIALS};
use anyhow::bail;
use executor_client::Client;
use executor_protocol::types::process::ProcessStartParams;
use executor_protocol::types::sandbox::{
    EgressIntent, FilesystemIntent, NetworkIntent, ReadRoots, SandboxIntent,
};
use executor_tests::http::TestServer;
use std::time::{Duration, Instant};

/// `curl` of `url` to /dev/null in a job (under `sandbox`); the time from
/// start to exit, checked to have received `bytes`.
async fn download(
    c: &Client,
    url: &str,
    bytes: u64,
    sandbox: Option<SandboxIntent>,
) -> anyhow::Result<Duration> {
    let mut p = ProcessStartParams::new(
        vec![
            "curl".into(),
            "-sS".into(),
            "-o".into(),
            "/dev/null".into(),
            "-w".into(),
            "%{size_download}".into(),
            url.into(),
        ],
        "/",
        env(),
    );
    p.sandbox = sandbox;
    let t = Instant::now();
    let mut job = c.start(&p).await?;
    let mut out = Vec::new();
    while let Some(ch) = job.next_output().await? {
        out.extend_from_slice(&ch.data);
    }
    let d = t.elapsed();
    let text = String::from_utf8_lossy(&out);
    if text.trim() != bytes.to_string() {
        bail!("download of {url}: {text}");
    }
    Ok(d)
}

/// The intent of the sandboxed side: the server's address and port only.
fn intent_for(port: u16) -> SandboxIntent {
    SandboxIntent {
        filesystem: FilesystemIntent {
            read: ReadRoots::All,
            ..Default::default()
        },
        network: NetworkIntent::AllowHosts(EgressIntent {
            allow_hosts: vec![format!("127.0.0.2:{port}")],
            ask: false,
            ask_timeout_ms: 1000,
        }),
        required: true,
        workspace_roots: None,
    }
}

/// One trial of one side: a fresh loopback server (chunked, 64 KiB
/// chunks), `bytes` from it with `curl` to /dev/null, through the job's
/// proxy (`sandboxed`) or directly.
async fn trial(c: &Client, bytes: u64, sandboxed: bool) -> anyhow::Result<Duration> {
    // 127.0.0.2: loopback, but not in the job's NO_PROXY, so curl uses the
    // proxy the environment names.
    let server = TestServer::start_on("127.0.0.2:0").await;
    let port = server.addr.port();
    let url = format!("http://127.0.0.2:{port}/bytes-chunked?n={bytes}");
    download(c, &url, bytes, sandboxed.then(|| intent_for(port))).await
}

/// 1 GiB from a loopback server through the job's proxy, vs the same
/// `curl` without a sandbox: each trial with a fresh server, the two sides
/// alternating which goes first.
pub async fn egress_download(bytes: u64) -> anyhow::Result<Row> {
    let c = connect().await?;
    trial(&c, 1000, true).await?;
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    for i in 0..TRIALS {
        if i % 2 == 0 {
            ours.push(trial(&c, bytes, true).await?);
            base.push(trial(&c, bytes, false).await?);
        } else {
            base.push(trial(&c, bytes, false).await?);
            ours.push(trial(&c, bytes, true).await?);
        }
    }
    c.close().await?;
    let (o, b) = (best(ours), best(base));
    let ratio = mbps(bytes, o) / mbps(bytes, b);
    Ok(Row {
        what: format!(
            "`curl` of {} MiB from a loopback server through a sandboxed job's egress proxy (best of {TRIALS}, alternating, fresh server each)",
            bytes >> 20
        ),
        ours: format!("{:.0} MB/s", mbps(bytes, o)),
        baseline: format!("{:.0} MB/s (the same `curl` in an unsandboxed job)", mbps(bytes, b)),
        ratio,
        goal: "≥ 0.8×".into(),
        met: Some(ratio >= 0.8),
        note: format!(
            "each trial with a fresh server and a fresh job, the sides alternating which goes first; the \
             agent relays with splice(2) through one 64 KiB kernel pipe per direction (F_SETPIPE_SZ; the \
             bytes never enter its memory); each side includes the job's start and exit, the sandboxed one \
             its namespaces and the listener hand-over{}",
            if ratio >= 0.8 {
                ""
            } else {
                ". Missed in this run: a proxied download is three busy processes (server, agent, curl) and \
                 two loopback TCP connections where the baseline is two and one, on 2 cores. Handing the job \
                 the upstream socket after the decision would end the relay's work and its confinement with \
                 it: a TCP socket connected to AF_UNSPEC is disconnected and can then connect anywhere"
            }
        ),
    })
}
