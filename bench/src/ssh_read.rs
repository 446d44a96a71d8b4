//! Reading a file from a host over SSH, measured the two ways users see it,
//! each side the same way as its baseline:
//!
//! - **fresh**: a whole command from a shell, connection set-up included —
//!   `executor-client -F cfg --target bench cat F > /dev/null` against
//!   `ssh -F cfg bench cat F > /dev/null` and `sftp -F cfg -b batch bench`
//!   (a `get F /dev/null`): one ssh config file, one cipher, one sink, every
//!   process started anew per trial;
//! - **warm**: over a connection opened before the clock starts — the
//!   library's `read_stream_into` on an initialized `Client` writing
//!   `/dev/null`, against `ssh cat F > /dev/null` through a ControlMaster
//!   opened beforehand (what an orchestrator that keeps connections does).
//!
//! CPU (fresh only) is read from `/proc/self/stat`'s waited-for-children
//! times, so a trial counts the client and the ssh it starts.

use crate::{best, mbps, scratch, write_pattern_file, Row};
use anyhow::{bail, Context};
use executor_client::{Client, ClientOptions};
use executor_tests::sshd::Sshd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CIPHER: &str = "aes128-gcm@openssh.com";
const TRIALS: usize = 3;

/// The test sshd as a `Host bench` entry of an ssh config file, so that
/// every client (ours, ssh, sftp) is given exactly the same options.
pub(crate) fn write_ssh_config(sshd: &Sshd) -> anyhow::Result<PathBuf> {
    let cfg = sshd.dir.join("bench_ssh_config");
    let mut text = format!(
        "Host bench\n  HostName 127.0.0.1\n  Port {}\n  User {}\n  IdentityFile {}\n  Ciphers {CIPHER}\n",
        sshd.port,
        sshd.user,
        sshd.client_key.display()
    );
    for o in sshd.ssh_o_options() {
        let (k, v) = o.split_once('=').context("ssh option")?;
        text.push_str(&format!("  {k} {v}\n"));
    }
    std::fs::write(&cfg, text)?;
    Ok(cfg)
}

/// Seconds of CPU (user + system) of this process's waited-for children.
fn children_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at ") ".
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
    let f: Vec<f64> = rest.split(' ').map(|x| x.parse().unwrap_or(0.0)).collect();
    // 0-based after the name: cutime 13, cstime 14, in USER_HZ (100) ticks.
    let at = |i: usize| f.get(i).copied().unwrap_or(0.0) / 100.0;
    at(13) + at(14)
}

struct Trial {
    wall: Duration,
    cpu: f64,
}

/// Runs `cmd` with stdout to /dev/null; wall time and the CPU it (and what
/// it started) used.
fn run_to_null(mut cmd: Command, what: &str) -> anyhow::Result<Trial> {
    let c0 = children_cpu_seconds();
    let t = Instant::now();
    let st = cmd
        .stdout(Stdio::null())
        .status()
        .with_context(|| what.to_string())?;
    let wall = t.elapsed();
    if !st.success() {
        bail!("{what}: {st}");
    }
    Ok(Trial {
        wall,
        cpu: children_cpu_seconds() - c0,
    })
}

fn ssh(cfg: &Path, extra: &[String], remote: &str) -> Command {
    let mut c = Command::new("ssh");
    c.arg("-F").arg(cfg).arg("-T");
    for o in extra {
        c.arg("-o").arg(o);
    }
    c.arg("bench").arg(remote);
    c
}

fn best_trial(v: &[Trial]) -> (Duration, f64) {
    let wall = best(v.iter().map(|t| t.wall).collect());
    let cpu = v.iter().map(|t| t.cpu).fold(f64::INFINITY, f64::min);
    (wall, cpu)
}

/// The fresh row: three whole commands, alternating.
pub async fn fresh(bytes: u64) -> anyhow::Result<Row> {
    let dir = scratch()?;
    let f = dir.join("ssh-fresh");
    write_pattern_file(&f, bytes)?;
    let agent = executor_client::target::local_executor()?;
    let client = agent.with_file_name("executor-client");
    let sshd = Sshd::start("", "Subsystem sftp /usr/lib/openssh/sftp-server");
    let cfg = write_ssh_config(&sshd)?;
    let batch = dir.join("sftp-batch");
    std::fs::write(&batch, format!("get {} /dev/null\n", f.display()))?;
    let ours_cmd = || {
        let mut c = Command::new(&client);
        c.arg("-F")
            .arg(&cfg)
            .arg("--remote-command")
            .arg(&agent)
            .args(["--target", "bench", "cat"])
            .arg(&f);
        c
    };
    let sftp_cmd = || {
        let mut c = Command::new("sftp");
        c.arg("-q")
            .arg("-F")
            .arg(&cfg)
            .arg("-b")
            .arg(&batch)
            .arg("bench");
        c
    };
    let cat = format!("cat {}", f.display());
    // One untimed round of each warms the page cache and sshd.
    run_to_null(ours_cmd(), "executor-client cat")?;
    run_to_null(ssh(&cfg, &[], &cat), "ssh cat")?;
    let (mut ours, mut base, mut sftp) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..TRIALS {
        ours.push(run_to_null(ours_cmd(), "executor-client cat")?);
        base.push(run_to_null(ssh(&cfg, &[], &cat), "ssh cat")?);
        sftp.push(run_to_null(sftp_cmd(), "sftp get")?);
    }
    std::fs::remove_file(&f)?;
    let ((o, oc), (k, kc), (s, _)) = (best_trial(&ours), best_trial(&base), best_trial(&sftp));
    let ratio = mbps(bytes, o) / mbps(bytes, k);
    let met = ratio >= 0.95 && o < s;
    Ok(Row {
        what: format!(
            "fresh `executor-client --target host cat` of {} MiB through real sshd, aes128-gcm, connection set-up included (best of {TRIALS}, alternating)",
            bytes >> 20
        ),
        ours: format!("{:.0} MB/s, {oc:.2} s client CPU", mbps(bytes, o)),
        baseline: format!(
            "{:.0} MB/s, {kc:.2} s CPU `ssh host cat f`; {:.0} MB/s `sftp get`",
            mbps(bytes, k),
            mbps(bytes, s)
        ),
        ratio,
        goal: "≥ 0.95× ssh cat, and faster than sftp".into(),
        met: Some(met),
        note: format!(
            "all three read one ssh config (`-F`), write to /dev/null and start every process anew; CPU is the \
             client and the ssh it starts (user+system). vs sftp: {:.2}×; client CPU {:.2}× of ssh cat's",
            mbps(bytes, o) / mbps(bytes, s),
            oc / kc.max(0.01)
        ),
    })
}

/// `read_stream_into` of `path` on an open connection, into /dev/null
/// (the sink `ssh cat` is given).
async fn read_to_null(c: &Client, path: &str, bytes: u64) -> anyhow::Result<Duration> {
    let sink = std::fs::OpenOptions::new().write(true).open("/dev/null")?;
    let t = Instant::now();
    let n = c.read_stream_into(path, &sink).await?;
    let wall = t.elapsed();
    if n != bytes {
        bail!("read_stream: got {n} bytes, expected {bytes}");
    }
    Ok(wall)
}

/// The warm row: an open `Client` against a ControlMaster, alternating.
pub async fn warm(bytes: u64) -> anyhow::Result<Row> {
    let dir = scratch()?;
    let f = dir.join("ssh-warm");
    write_pattern_file(&f, bytes)?;
    let agent = executor_client::target::local_executor()?;
    let sshd = Sshd::start("", "Subsystem sftp /usr/lib/openssh/sftp-server");
    let cfg = write_ssh_config(&sshd)?;
    let mut opts = sshd.options(&agent);
    opts.options.push(format!("Ciphers={CIPHER}"));
    let c = Client::connect_target(
        &executor_client::Target::ssh_with("127.0.0.1", opts.clone()),
        ClientOptions::default(),
    )
    .await?;
    let ctl = vec![
        format!("ControlPath={}", sshd.dir.join("ctl").display()),
        "ControlMaster=auto".to_string(),
        "ControlPersist=120".to_string(),
    ];
    run_to_null(ssh(&cfg, &ctl, "true"), "ssh ControlMaster")?;
    let path = f.to_str().context("utf-8 path")?.to_string();
    let cat = format!("cat {}", f.display());
    read_to_null(&c, &path, bytes).await?;
    run_to_null(ssh(&cfg, &ctl, &cat), "ssh cat over ControlMaster")?;
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    for _ in 0..TRIALS {
        ours.push(read_to_null(&c, &path, bytes).await?);
        base.push(run_to_null(ssh(&cfg, &ctl, &cat), "ssh cat over ControlMaster")?.wall);
    }
    c.close().await?;
    let mut exit = ssh(&cfg, &ctl, "true");
    exit.args(["-O", "exit"]).stderr(Stdio::null());
    let _ = exit.status();
    std::fs::remove_file(&f)?;
    let (o, k) = (best(ours), best(base));
    let ratio = mbps(bytes, o) / mbps(bytes, k);
    Ok(Row {
        what: format!(
            "warm read of {} MiB through real sshd, aes128-gcm: `read_stream_into` on an open connection vs `ssh cat` over a ControlMaster (best of {TRIALS}, alternating)",
            bytes >> 20
        ),
        ours: format!("{:.0} MB/s", mbps(bytes, o)),
        baseline: format!("{:.0} MB/s `ssh -o ControlPath=… host cat f`", mbps(bytes, k)),
        ratio,
        goal: "≥ 0.95× ssh cat over a ControlMaster".into(),
        met: Some(ratio >= 0.95),
        note: "both sides write every byte to /dev/null over a connection opened before the clock starts; no CPU \
               column: the ControlMaster writes the bytes itself (its mux client passes its stdout over), so the \
               two clients' CPU cannot be read the same way"
            .into(),
    })
}
