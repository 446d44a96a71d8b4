//! `executor-bench`: each comparison runs side by side, in the same run, on
//! this machine, and the results are written as a Markdown table with the
//! goal from DESIGN.md next to each ratio.
//!
//! `cargo run --release -p executor-bench -- --out bench/RESULTS.md`
#![forbid(unsafe_code)]

mod agent_cost;
mod codex;
mod egress;
mod limits;
mod mcp_rmcp;
mod mcp_stdio;
mod scale;
mod ssh_read;

use anyhow::{bail, Context};
use clap::Parser;
use executor_client::{Client, ClientOptions};
use executor_protocol::types::process::ProcessStartParams;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Debug, Parser)]
struct Args {
    /// Where to write the Markdown results.
    #[arg(long, default_value = "bench/RESULTS.md")]
    out: PathBuf,
    /// Bytes streamed in the throughput comparisons.
    #[arg(long, default_value_t = 1 << 30)]
    bytes: u64,
    /// Iterations of the latency comparisons.
    #[arg(long, default_value_t = 300)]
    iterations: usize,
    /// Run only these comparisons (output, spawn, sandbox, read, walk,
    /// ssh-exec, ssh-get, cold-start, idle-rss, stream-rss, wire, egress,
    /// the scale rows: walk-1m, streams-64, idle-jobs, reads-32, and the
    /// Codex dialect's: codex-start, codex-sandbox, codex-read, codex-http;
    /// mcp-stdio: `executor-client mcp stdio` locally and over sshd;
    /// mcp-rmcp: an rmcp client through the library over sshd; limits and
    /// limits-spaced: a job's cgroup, starts back to back and spaced).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

struct Row {
    what: String,
    ours: String,
    baseline: String,
    ratio: f64,
    goal: String,
    /// `None` where no goal is set (the row records a number).
    met: Option<bool>,
    note: String,
}

fn env() -> BTreeMap<String, String> {
    BTreeMap::from([("PATH".to_string(), "/usr/bin:/bin".to_string())])
}

fn mbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e6
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// The fastest of several trials: on a shared machine, noise only ever
/// slows a trial down, so the best run of each side is the fairest
/// comparison of what each can do (both sides get the same treatment).
fn best(v: Vec<Duration>) -> Duration {
    v.into_iter().min().unwrap_or_default()
}

async fn connect() -> anyhow::Result<Client> {
    let bin = executor_client::target::local_executor().context("finding the executor binary")?;
    Ok(Client::spawn(tokio::process::Command::new(bin), ClientOptions::default()).await?)
}

/// Trials of each throughput comparison (alternating); the best of each side is reported.
const TRIALS: usize = 5;

async fn output_through_agent(c: &Client, cmd: &str, bytes: u64) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let mut p = c
        .start(&ProcessStartParams::new(
            vec!["sh".into(), "-c".into(), cmd.into()],
            "/",
            env(),
        ))
        .await?;
    let mut got = 0u64;
    while let Some(ch) = p.next_output().await? {
        got += ch.data.len() as u64;
    }
    let d = t.elapsed();
    if got != bytes {
        bail!("process output: got {got} bytes, expected {bytes}");
    }
    Ok(d)
}

async fn output_through_cat(cmd: &str, bytes: u64) -> anyhow::Result<Duration> {
    let (d, n) = read_stdout_of(&format!("{cmd} | cat | cat")).await?;
    if n != bytes {
        bail!("baseline: got {n} bytes");
    }
    Ok(d)
}

/// `head -c N /dev/zero` through process output to the client, vs the same
/// bytes through `cat | cat` into a pipe we read.
async fn process_output(bytes: u64) -> anyhow::Result<Row> {
    let c = connect().await?;
    let cmd = format!("head -c {bytes} /dev/zero");
    output_through_agent(&c, "head -c 1000000 /dev/zero", 1_000_000).await?;
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    for _ in 0..TRIALS {
        ours.push(output_through_agent(&c, &cmd, bytes).await?);
        base.push(output_through_cat(&cmd, bytes).await?);
    }
    c.close().await?;
    let (ours, base) = (best(ours), best(base));
    let ratio = mbps(bytes, ours) / mbps(bytes, base);
    Ok(Row {
        what: format!("process output, `{cmd}` to the client (best of {TRIALS}, alternating)"),
        ours: format!("{:.0} MB/s", mbps(bytes, ours)),
        baseline: format!("{:.0} MB/s (`{cmd} | cat | cat`)", mbps(bytes, base)),
        ratio,
        goal: "≥ 0.9×".into(),
        met: Some(ratio >= 0.9),
        note: format!(
            "frames are written with vectored writes: the chunk's bytes are never copied into a frame buffer on the \
             agent side{}",
            if ratio >= 0.9 {
                ""
            } else {
                ". Missed in this run: the same two pipe hops as `cat | cat`, plus framing and the client's decode \
                 of every 64 KiB chunk on a 2-core machine that also runs the job; runs minutes apart range from \
                 0.7× to 1.03×. What would close it: splice(2) from the job's pipe when the client is local, and \
                 bigger chunks for bulk output"
            }
        ),
    })
}

/// `/bin/true` start → exited through the agent vs a bare spawn+wait.
async fn spawn_latency(iterations: usize) -> anyhow::Result<Row> {
    let c = connect().await?;
    let params = ProcessStartParams::new(vec!["/bin/true".into()], "/", env());
    for _ in 0..10 {
        c.start(&params).await?.wait().await?;
    }
    // Alternating, so that a burst of load on the shared machine slows
    // both sides alike.
    let (mut ours, mut base) = (
        Vec::with_capacity(iterations),
        Vec::with_capacity(iterations),
    );
    for _ in 0..iterations {
        let t = Instant::now();
        let st = c.start(&params).await?.wait().await?;
        ours.push(t.elapsed());
        if !st.success() {
            bail!("/bin/true failed: {st:?}");
        }
        let t = Instant::now();
        let st = std::process::Command::new("/bin/true").status()?;
        base.push(t.elapsed());
        if !st.success() {
            bail!("/bin/true failed");
        }
    }
    c.close().await?;
    let (o, b) = (median(ours), median(base));
    let ratio = o.as_secs_f64() / b.as_secs_f64();
    Ok(Row {
        what: format!(
            "`/bin/true` process/start → process/exited (median of {iterations}, alternating)"
        ),
        ours: format!("{:.0} µs", o.as_secs_f64() * 1e6),
        baseline: format!("{:.0} µs (bare Rust spawn + wait)", b.as_secs_f64() * 1e6),
        ratio,
        goal: "≤ 2× the bare spawn".into(),
        met: Some(ratio <= 2.0),
        note: format!(
            "{}the agent never forks: its spawner (one small single-threaded process) hands the \
             job to a supervisor it forked ahead, which starts the program with a vfork (no \
             page-table copy) and reports when it has exec'd; on top of a bare spawn+wait a job \
             pays the supervisor's setup (spec from the memfd, session, subreaper, signalfd, the \
             exec pipe), the status messages supervisor → agent and a wire round trip plus the \
             `process/exited` notification to the client (about ten wake-ups across five \
             processes where the baseline has three). The {:.1} MB agent binary is not loaded \
             per job.",
            if ratio <= 2.0 { "" } else { "missed: " },
            std::fs::metadata(executor_client::target::local_executor()?)?.len() as f64 / 1e6
        ),
    })
}

/// A file of `bytes` non-zero, non-sparse bytes.
fn write_pattern_file(f: &std::path::Path, bytes: u64) -> anyhow::Result<()> {
    use std::io::Write;
    let mut w = std::io::BufWriter::new(std::fs::File::create(f)?);
    let block: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        w.write_all(&block[..n])?;
        left -= n as u64;
    }
    w.flush()?;
    Ok(())
}

fn scratch() -> anyhow::Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("executor-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

async fn read_through_agent(
    c: &Client,
    path: &std::path::Path,
    bytes: u64,
) -> anyhow::Result<Duration> {
    use futures_util::StreamExt;
    let t = Instant::now();
    let (_, s) = c.read_stream(path.to_str().context("utf-8 path")?).await?;
    let mut s = std::pin::pin!(s);
    let mut n = 0u64;
    while let Some(b) = s.next().await {
        n += b?.len() as u64;
    }
    let d = t.elapsed();
    if n != bytes {
        bail!("read_stream: got {n} bytes, expected {bytes}");
    }
    Ok(d)
}

async fn read_stdout_of(cmd: &str) -> anyhow::Result<(Duration, u64)> {
    let t = Instant::now();
    let child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let mut stdout = child.stdout.context("stdout")?;
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = tokio::io::AsyncReadExt::read(&mut stdout, &mut buf).await?;
        if k == 0 {
            break;
        }
        n += k as u64;
    }
    Ok((t.elapsed(), n))
}

/// A file through `fs/open` + pipelined `fs/readBlock` over the local pipe,
/// vs `cat f | cat` into a pipe we read.
async fn file_read(bytes: u64) -> anyhow::Result<Row> {
    let dir = scratch()?;
    let f = dir.join("big");
    write_pattern_file(&f, bytes)?;
    let c = connect().await?;
    read_through_agent(&c, &f, bytes).await?; // warm the page cache
    let cmd = format!("cat {} | cat", f.display());
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    for _ in 0..TRIALS {
        ours.push(read_through_agent(&c, &f, bytes).await?);
        let (d, n) = read_stdout_of(&cmd).await?;
        if n != bytes {
            bail!("cat: {n} bytes");
        }
        base.push(d);
    }
    c.close().await?;
    std::fs::remove_file(&f)?;
    let (ours, base) = (best(ours), best(base));
    let ratio = mbps(bytes, ours) / mbps(bytes, base);
    Ok(Row {
        what: format!("read a {} MiB file: `read_stream` over a local pipe (best of {TRIALS}, alternating)", bytes >> 20),
        ours: format!("{:.0} MB/s", mbps(bytes, ours)),
        baseline: format!("{:.0} MB/s (`cat f | cat`)", mbps(bytes, base)),
        ratio,
        goal: "≥ 0.9×".into(),
        met: Some(ratio >= 0.9),
        note: format!(
            "8 blocks of 1 MiB in flight; each block is spliced from the file into a pooled pipe and from it into \
             the agent's stdout after its frame head (the agent never copies it); the client reads every frame into \
             memory, as the baseline's reader reads `cat`'s output{}",
            if ratio >= 0.9 {
                ""
            } else {
                ". Missed in this run: each block crosses the agent's pipe and is decoded by the client; the \
                 `cat f | cat` baseline itself varies by half across runs minutes apart"
            }
        ),
    })
}

/// `dirs` directories of `files` empty files each under `root`; returns
/// the entries a walk of `root` lists (directories and files).
fn build_tree(root: &std::path::Path, dirs: usize, files: usize) -> anyhow::Result<u64> {
    for d in 0..dirs {
        let sub = root.join(format!("dir{d:04}"));
        std::fs::create_dir_all(&sub)?;
        for f in 0..files {
            std::fs::File::create(sub.join(format!("file{f:04}")))?;
        }
    }
    Ok((dirs * (files + 1)) as u64)
}

/// One whole `fs/walk` of `root`, page by page: its time and entries.
async fn walk_count(c: &Client, root: &str) -> anyhow::Result<(Duration, u64)> {
    let t = Instant::now();
    let mut n = 0u64;
    c.walk(executor_client::fs::walk_params(root), |page| {
        n += page.entries.len() as u64
    })
    .await?;
    Ok((t.elapsed(), n))
}

/// The 1-minute load average, as /proc/loadavg has it (for the notes).
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// `fs/walk` of a generated 100,000-entry tree vs GNU find printing the
/// same information.
async fn walk_tree() -> anyhow::Result<Row> {
    let root = scratch()?.join("tree");
    let entries = build_tree(&root, 100, 999)?;
    let c = connect().await?;
    let root_s = root.to_str().context("utf-8")?.to_string();
    walk_count(&c, &root_s).await?;
    let cmd = format!("find {root_s} -printf '%y %s %p\n'");
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    for _ in 0..TRIALS {
        let (d, n) = walk_count(&c, &root_s).await?;
        if n != entries {
            bail!("walk listed {n} entries, expected {entries}");
        }
        ours.push(d);
        base.push(read_stdout_of(&cmd).await?.0);
    }
    c.close().await?;
    std::fs::remove_dir_all(&root)?;
    let (o, b) = (best(ours), best(base));
    let ratio = o.as_secs_f64() / b.as_secs_f64();
    Ok(Row {
        what: format!("`fs/walk` of {entries} entries (best of {TRIALS}, alternating)"),
        ours: format!("{:.0} ms", o.as_secs_f64() * 1e3),
        baseline: format!("{:.0} ms (`find -printf '%y %s %p\\n'`)", b.as_secs_f64() * 1e3),
        ratio,
        goal: "≤ 1× (no slower than find)".into(),
        met: Some(ratio <= 1.0),
        note: format!(
            "one statx per entry relative to the open directory; each directory read whole and sorted so a cursor \
             can resume exactly{}",
            if ratio <= 1.0 {
                ""
            } else {
                ". Missed in this run: find prints entries unsorted as getdents returns them, the walk sorts every \
                 directory (for exact cursors) and encodes and decodes every entry; runs minutes apart range from \
                 0.99× to 1.2×. What would close it: an unsorted mode for walks that need no cursor, and encoding \
                 entries straight into the answer without a per-entry allocation"
            }
        ),
    })
}

/// 100 sequential `/bin/true` on one warm executor connection through a
/// real sshd, vs 100 fresh `ssh host /bin/true`, vs 100 `ssh` over a
/// ControlMaster connection.
async fn ssh_commands(n: usize) -> anyhow::Result<Row> {
    use executor_tests::sshd::Sshd;
    let agent = executor_client::target::local_executor()?;
    let sshd = Sshd::start("", "Subsystem sftp /usr/lib/openssh/sftp-server");
    let c = Client::connect_target(
        &executor_client::Target::ssh_with("127.0.0.1", sshd.options(&agent)),
        ClientOptions::default(),
    )
    .await?;
    let params = ProcessStartParams::new(vec!["/bin/true".into()], "/", env());
    c.start(&params).await?.wait().await?;
    let t = Instant::now();
    for _ in 0..n {
        let st = c.start(&params).await?.wait().await?;
        if !st.success() {
            bail!("/bin/true failed over ssh");
        }
    }
    let warm = t.elapsed();
    c.close().await?;
    let run = |mut cmd: std::process::Command| -> anyhow::Result<()> {
        let st = cmd.stdout(std::process::Stdio::null()).status()?;
        if !st.success() {
            bail!("ssh failed: {st}");
        }
        Ok(())
    };
    let t = Instant::now();
    for _ in 0..n {
        run(sshd.ssh("/bin/true"))?;
    }
    let fresh = t.elapsed();
    let ctl = sshd.dir.join("ctl");
    let ctl_path = format!("ControlPath={}", ctl.display());
    let master = |remote: &str| {
        sshd.ssh_with(
            &["ControlMaster=auto", &ctl_path, "ControlPersist=60"],
            remote,
        )
    };
    run(master("/bin/true"))?;
    let t = Instant::now();
    for _ in 0..n {
        run(master("/bin/true"))?;
    }
    let cm = t.elapsed();
    let _ = std::process::Command::new("ssh")
        .args(["-o"])
        .arg(format!("ControlPath={}", ctl.display()))
        .args(["-O", "exit", "127.0.0.1"])
        .stderr(std::process::Stdio::null())
        .status();
    let per = |d: Duration| d.as_secs_f64() * 1e3 / n as f64;
    let ratio = per(cm) / per(warm);
    Ok(Row {
        what: format!("{n} sequential `/bin/true` through real sshd on one warm connection"),
        ours: format!("{:.2} ms each", per(warm)),
        baseline: format!(
            "{:.2} ms each over a ControlMaster; {:.1} ms each with a fresh `ssh host /bin/true`",
            per(cm),
            per(fresh)
        ),
        ratio,
        goal: "≥ 4× faster than ControlMaster".into(),
        met: Some(ratio >= 4.0),
        note: format!(
            "ratio = ControlMaster time / executor time (higher is better); vs fresh ssh the executor is {:.0}× faster. \
             On this machine a multiplexed exec through sshd costs ~100 ms (checked by hand with `ssh -O check`: \
             the master is used), far above the ~8 ms of DESIGN.md's reference machine; the executor's warm path \
             never opens a new SSH session",
            per(fresh) / per(warm)
        ),
    })
}

/// The sandbox of the start rows: read everything, write the temporary
/// directory, no network.
fn tmp_write_no_network() -> anyhow::Result<executor_protocol::types::sandbox::SandboxIntent> {
    use executor_protocol::types::sandbox::{FilesystemIntent, NetworkIntent, SandboxIntent};
    Ok(SandboxIntent {
        filesystem: FilesystemIntent {
            write: vec![std::env::temp_dir()
                .to_str()
                .context("utf-8 temp dir")?
                .into()],
            ..Default::default()
        },
        network: NetworkIntent::Deny,
        required: true,
        workspace_roots: None,
    })
}

/// Sandboxed vs unsandboxed `/bin/true` start → exited, same run.
async fn sandbox_spawn(iterations: usize) -> anyhow::Result<Row> {
    use executor_protocol::types::sandbox::NetworkIntent;
    let c = connect().await?;
    let plain = ProcessStartParams::new(vec!["/bin/true".into()], "/", env());
    let mut boxed = plain.clone();
    boxed.sandbox = Some(tmp_write_no_network()?);
    // The same intent with the network allowed: no network namespace.
    let mut open_net = boxed.clone();
    if let Some(i) = open_net.sandbox.as_mut() {
        i.network = NetworkIntent::Allow;
    }
    for p in [&plain, &boxed, &open_net] {
        for _ in 0..5 {
            c.start(p).await?.wait().await?;
        }
    }
    let (mut a, mut b, mut n) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..iterations {
        for (p, v) in [(&plain, &mut a), (&boxed, &mut b), (&open_net, &mut n)] {
            let t = Instant::now();
            let st = c.start(p).await?.wait().await?;
            v.push(t.elapsed());
            if !st.success() {
                bail!("/bin/true failed: {st:?}");
            }
        }
    }
    c.close().await?;
    let (a, b, n) = (median(a), median(b), median(n));
    let extra = b.as_secs_f64() * 1e3 - a.as_secs_f64() * 1e3;
    let netns = b.as_secs_f64() * 1e3 - n.as_secs_f64() * 1e3;
    Ok(Row {
        what: format!("sandboxed vs unsandboxed `/bin/true` start → exited (median of {iterations}, alternating)"),
        ours: format!("{:.0} µs sandboxed", b.as_secs_f64() * 1e6),
        baseline: format!("{:.0} µs unsandboxed", a.as_secs_f64() * 1e6),
        ratio: b.as_secs_f64() / a.as_secs_f64(),
        goal: "under +1 ms".into(),
        met: Some(extra < 1.0),
        note: format!(
            "+{extra:.2} ms with `network: \"deny\"` for the job's init in user, network and IPC namespaces the spawner made ahead (a fresh set per job; a new one from the init's clone when none is ready) and new mount and PID namespaces, a root of descriptor clones (with `read: \"all\"` one recursive read-only clone of the host's tree), /dev, /proc, a pivot, the Landlock ruleset, capability drop and one seccomp program (x32 guard, clone3 → ENOSYS, a binary search over the syscall numbers, the EPERM and socket rules); the same intent with `network: \"allow\"` (no namespaces made ahead: new user and IPC namespaces per job) took {:.0} µs (deny minus allow: {netns:+.2} ms)",
            n.as_secs_f64() * 1e6
        ),
    })
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cores} cores ({cpu}), Linux {}", kernel.trim())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let want = |name: &str| args.only.is_empty() || args.only.iter().any(|o| o == name);
    let mut rows = Vec::new();
    if want("output") {
        rows.push(process_output(args.bytes).await?);
    }
    if want("spawn") {
        rows.push(spawn_latency(args.iterations).await?);
    }
    if want("sandbox") {
        rows.push(sandbox_spawn(args.iterations.min(200)).await?);
    }
    if want("read") {
        rows.push(file_read(args.bytes).await?);
    }
    if want("walk") {
        rows.push(walk_tree().await?);
    }
    if want("ssh-exec") {
        rows.push(ssh_commands(100).await?);
    }
    if want("ssh-get") {
        rows.push(ssh_read::fresh(args.bytes).await?);
        rows.push(ssh_read::warm(args.bytes).await?);
    }
    if want("cold-start") {
        rows.push(agent_cost::cold_start(50).await?);
    }
    if want("idle-rss") {
        rows.push(agent_cost::idle_rss().await?);
    }
    if want("stream-rss") {
        rows.push(agent_cost::streaming_peak_rss(10 << 30).await?);
    }
    if want("wire") {
        rows.extend(agent_cost::wire_cost()?);
    }
    if want("egress") {
        rows.push(egress::egress_download(args.bytes).await?);
    }
    if want("walk-1m") {
        rows.extend(scale::walk_million().await?);
    }
    if want("streams-64") {
        rows.extend(scale::many_streams().await?);
    }
    if want("idle-jobs") {
        rows.extend(scale::idle_jobs(1000, args.iterations).await?);
    }
    if want("codex-start") {
        rows.push(codex::start_latency(args.iterations.min(200), false).await?);
    }
    if want("codex-sandbox") {
        rows.push(codex::start_latency(args.iterations.min(200), true).await?);
    }
    if want("codex-read") {
        rows.push(codex::read_throughput(256 << 20).await?);
    }
    if want("codex-http") {
        rows.push(codex::http_stream_throughput(64 << 20).await?);
    }
    if want("reads-32") {
        rows.push(scale::concurrent_reads().await?);
    }
    if want("limits") {
        rows.push(limits::start_cost(args.iterations.min(200), Duration::ZERO).await?);
    }
    if want("limits-spaced") {
        rows.push(limits::start_cost(args.iterations.min(200), Duration::from_millis(20)).await?);
    }
    if want("mcp-stdio") {
        rows.extend(mcp_stdio::rows().await?);
    }
    if want("mcp-rmcp") {
        rows.push(mcp_rmcp::row().await?);
    }
    let mut md = String::new();
    writeln!(md, "# Benchmark results\n")?;
    writeln!(
        md,
        "Produced by `cargo run --release -p executor-bench -- --out bench/RESULTS.md` \
         (release build, loopback/local pipes, each comparison side by side in the same run).\n"
    )?;
    writeln!(md, "Machine: {}.\n", machine())?;
    writeln!(
        md,
        "The machine is a shared 2-core VM whose speed varies by ±20% from minute to minute: throughput and \
         walk comparisons alternate the two sides and report the best trial of each (noise only slows a \
         trial down); latencies report medians. Goals met narrowly may read as missed in another run.\n"
    )?;
    writeln!(
        md,
        "| comparison | executor | baseline | ratio | goal | met |"
    )?;
    writeln!(md, "| --- | --- | --- | --- | --- | --- |")?;
    for r in &rows {
        writeln!(
            md,
            "| {} | {} | {} | {:.2}× | {} | {} |",
            r.what,
            r.ours,
            r.baseline,
            r.ratio,
            r.goal,
            match r.met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "—",
            }
        )?;
    }
    writeln!(md)?;
    for r in rows.iter().filter(|r| !r.note.is_empty()) {
        writeln!(md, "- {}: {}", r.what, r.note)?;
    }
    std::fs::write(&args.out, &md)?;
    let mut stderr = std::io::stderr();
    std::io::Write::write_all(&mut stderr, md.as_bytes())?;
    Ok(())
}
