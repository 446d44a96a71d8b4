//! What the agent itself costs: cold start to the `initialize` answer, idle
//! RSS, peak RSS while streaming 10 GiB, and the wire encoding of a 1 MiB
//! block against JSON with base64 (the reference protocol's encoding).

use crate::{best, connect, median, Row};
use anyhow::bail;
use executor_client::{Client, ClientOptions};
use std::time::{Duration, Instant};

fn status_kib(pid: u32, field: &str) -> u64 {
    executor_tests::status_kib(pid, field)
}

/// Spawn → `initialize` answered, vs spawn → exit of `/bin/true`.
pub async fn cold_start(iterations: usize) -> anyhow::Result<Row> {
    let bin = executor_client::target::local_executor()?;
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    for _ in 0..iterations {
        let t = Instant::now();
        let c = Client::spawn(tokio::process::Command::new(&bin), ClientOptions::default()).await?;
        ours.push(t.elapsed());
        c.close().await?;
        let t = Instant::now();
        tokio::process::Command::new("/bin/true").status().await?;
        base.push(t.elapsed());
    }
    let (ours, base) = (median(ours), median(base));
    let ms = ours.as_secs_f64() * 1e3;
    Ok(Row {
        what: format!("cold start: spawn → `initialize` answered (median of {iterations})"),
        ours: format!("{ms:.2} ms"),
        baseline: format!("{:.2} ms (spawn+exit of `/bin/true`)", base.as_secs_f64() * 1e3),
        ratio: ours.as_secs_f64() / base.as_secs_f64(),
        goal: "< 10 ms".into(),
        met: Some(ms < 10.0),
        note: "includes the preamble, the client's `initialize` request and the sandbox capability probe".into(),
    })
}

/// RSS of an initialized, idle agent vs an idle `sleep` process.
pub async fn idle_rss() -> anyhow::Result<Row> {
    let c = connect().await?;
    c.call(&executor_protocol::types::session::EnvironmentInfoParams {})
        .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = c.transport_pid().unwrap_or(0);
    let ours = status_kib(pid, "VmRSS");
    let mut sleeper = tokio::process::Command::new("sleep").arg("5").spawn()?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let base = status_kib(sleeper.id().unwrap_or(0), "VmRSS");
    sleeper.kill().await?;
    c.close().await?;
    if ours == 0 || base == 0 {
        bail!("could not read RSS (agent {ours} KiB, sleep {base} KiB)");
    }
    Ok(Row {
        what: "idle RSS of an initialized agent".into(),
        ours: format!("{:.1} MiB", ours as f64 / 1024.0),
        baseline: format!("{:.1} MiB (`sleep`)", base as f64 / 1024.0),
        ratio: ours as f64 / base as f64,
        goal: "< 8 MiB".into(),
        met: Some(ours < 8 * 1024),
        note: "sshd's own per-connection process is about 10 MB".into(),
    })
}

/// Peak RSS (VmHWM) while 10 GiB of process output stream to the client.
pub async fn streaming_peak_rss(bytes: u64) -> anyhow::Result<Row> {
    let c = connect().await?;
    let pid = c.transport_pid().unwrap_or(0);
    let cmd = format!("head -c {bytes} /dev/zero");
    let took = crate::output_through_agent(&c, &cmd, bytes).await?;
    let peak = status_kib(pid, "VmHWM");
    c.close().await?;
    let mut sleeper = tokio::process::Command::new("sleep").arg("5").spawn()?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let base = status_kib(sleeper.id().unwrap_or(0), "VmHWM");
    sleeper.kill().await?;
    Ok(Row {
        what: format!("peak agent RSS while `{cmd}` streams to the client"),
        ours: format!("{:.1} MiB", peak as f64 / 1024.0),
        baseline: format!("{:.1} MiB (`sleep`)", base as f64 / 1024.0),
        ratio: peak as f64 / base.max(1) as f64,
        goal: "< 64 MiB".into(),
        met: Some(peak > 0 && peak < 64 * 1024),
        note: format!(
            "{} GiB in {:.1} s; the retained output buffer (1 MiB) and the bounded notification queue are the only buffers",
            bytes >> 30,
            took.as_secs_f64()
        ),
    })
}

#[derive(serde::Serialize, serde::Deserialize)]
struct BinBlock {
    eof: bool,
    #[serde(with = "serde_bytes")]
    data: Vec<u8>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct B64Block {
    eof: bool,
    data: String,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Response<T> {
    id: u64,
    result: T,
}

/// One 1 MiB `fs/readBlock` answer: MessagePack `bin` vs JSON + base64,
/// bytes on the wire and encode+decode time.
pub fn wire_cost() -> anyhow::Result<Vec<Row>> {
    use base64::Engine as _;
    const N: usize = 50;
    let data: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let (mut mp_times, mut js_times) = (Vec::new(), Vec::new());
    let (mut mp_len, mut js_len) = (0, 0);
    for _ in 0..N {
        let t = Instant::now();
        let frame = rmp_serde::to_vec_named(&Response {
            id: 7,
            result: BinBlock {
                eof: false,
                data: data.clone(),
            },
        })?;
        let back: Response<BinBlock> = rmp_serde::from_slice(&frame)?;
        mp_times.push(t.elapsed());
        mp_len = frame.len();
        if back.result.data != data {
            bail!("msgpack round trip differs");
        }
        let t = Instant::now();
        let text = serde_json::to_vec(&Response {
            id: 7,
            result: B64Block {
                eof: false,
                data: base64::engine::general_purpose::STANDARD.encode(&data),
            },
        })?;
        let back: Response<B64Block> = serde_json::from_slice(&text)?;
        let decoded = base64::engine::general_purpose::STANDARD.decode(back.result.data)?;
        js_times.push(t.elapsed());
        js_len = text.len();
        if decoded != data {
            bail!("json round trip differs");
        }
    }
    let (mp, js) = (best(mp_times), best(js_times));
    Ok(vec![
        Row {
            what: "wire bytes of one 1 MiB `fs/readBlock` answer".into(),
            ours: format!("{mp_len} B (MessagePack `bin`)"),
            baseline: format!("{js_len} B (JSON + base64)"),
            ratio: mp_len as f64 / js_len as f64,
            goal: "≤ 0.76× (no base64 inflation)".into(),
            met: Some((mp_len as f64) < 0.76 * js_len as f64),
            note: format!("{} bytes of envelope around the 1,048,576 data bytes", mp_len - (1 << 20)),
        },
        Row {
            what: format!("encode+decode of one 1 MiB block (best of {N})"),
            ours: format!("{:.0} µs (rmp-serde, `bin`)", mp.as_secs_f64() * 1e6),
            baseline: format!("{:.0} µs (serde_json + base64)", js.as_secs_f64() * 1e6),
            ratio: mp.as_secs_f64() / js.as_secs_f64(),
            goal: "faster (< 1×)".into(),
            met: Some(mp < js),
            note: "both sides copy the block once into the message and once out; the agent's own path writes blocks after a prepared head without that copy".into(),
        },
    ])
}
