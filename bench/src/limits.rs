//! What a job's cgroup costs (issue 32): a sandboxed `/bin/true` start →
//! exited with the job's limits (a cgroup with memory, pids and cpu) and
//! with the default one (memory and pids), against the same agent binary
//! run where it finds no cgroup (a mount namespace of its own with an
//! empty tmpfs over /sys/fs/cgroup: the start of before issue 32), all
//! three alternating in one run; and the kernel's memory per idle job's
//! cgroup.
//!
//! Needs root (the mount namespace). Uses the bench's shared helpers
//! ([`crate`]) and the client library as users call it.

use crate::{connect, env, median, Row};
use anyhow::{bail, Context};
use executor_client::{Client, ClientOptions};
use executor_protocol::types::process::{JobLimits, ProcessStartParams};
use std::time::Instant;

/// The same agent, started where it finds no cgroup to use.
async fn connect_without_cgroups() -> anyhow::Result<Client> {
    let bin = executor_client::target::local_executor().context("finding the executor binary")?;
    let mut cmd = tokio::process::Command::new("unshare");
    cmd.args(["-m", "--propagation", "private", "sh", "-c"])
        .arg("mount -t tmpfs none /sys/fs/cgroup && exec \"$0\"")
        .arg(bin);
    Ok(Client::spawn(cmd, ClientOptions::default()).await?)
}

fn sandboxed(limits: Option<JobLimits>) -> anyhow::Result<ProcessStartParams> {
    let mut p = ProcessStartParams::new(vec!["/bin/true".into()], "/", env());
    p.sandbox = Some(crate::tmp_write_no_network()?);
    p.limits = limits;
    Ok(p)
}

/// Sandboxed start with limits vs without a cgroup, same run: starts one
/// right after the other's exit (`gap` zero: what is made ahead competes
/// with the next start for the two cores), or each after `gap` idle (as an
/// orchestrator's starts come: the cgroup made ahead and the previous
/// one's removal are done meanwhile), the same for every side.
pub async fn start_cost(iterations: usize, gap: std::time::Duration) -> anyhow::Result<Row> {
    let with = connect().await?;
    let without = connect_without_cgroups().await?;
    let mech = without
        .call(&executor_protocol::types::session::EnvironmentInfoParams {})
        .await?
        .sandbox
        .mechanisms;
    if mech.iter().any(|m| m.starts_with("cgroup_v")) {
        bail!("the agent without cgroups still found some: {mech:?}");
    }
    let mech = with
        .call(&executor_protocol::types::session::EnvironmentInfoParams {})
        .await?
        .sandbox
        .mechanisms;
    if !mech.iter().any(|m| m.starts_with("cgroup_v")) {
        bail!("the agent found no cgroup to use: {mech:?} (run as root)");
    }
    let full = sandboxed(Some(JobLimits {
        memory_bytes: Some(1 << 30),
        processes: Some(1000),
        cpu_millis_per_sec: Some(2000),
        ..Default::default()
    }))?;
    let default = sandboxed(None)?;
    let sides: [(&Client, &ProcessStartParams); 3] =
        [(&without, &default), (&with, &default), (&with, &full)];
    for (c, p) in sides {
        for _ in 0..5 {
            c.start(p).await?.wait().await?;
        }
    }
    let mut times = [Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..iterations {
        for (i, (c, p)) in sides.iter().enumerate() {
            if !gap.is_zero() {
                tokio::time::sleep(gap).await;
            }
            let t = Instant::now();
            let st = c.start(p).await?.wait().await?;
            times[i].push(t.elapsed());
            if !st.success() {
                bail!("/bin/true failed: {st:?}");
            }
        }
    }
    with.close().await?;
    without.close().await?;
    let [none, dflt, limited] = times.map(median);
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let extra = ms(limited) - ms(none);
    Ok(Row {
        what: format!(
            "sandboxed `/bin/true` start → exited with memory, processes and CPU limits vs the same agent finding no cgroup (median of {iterations}, alternating){}",
            if gap.is_zero() {
                ", back to back".to_string()
            } else {
                format!(", each start after {} ms idle", gap.as_millis())
            }
        ),
        ours: format!("{:.0} µs with limits", ms(limited) * 1e3),
        baseline: format!("{:.0} µs without a cgroup", ms(none) * 1e3),
        ratio: ms(limited) / ms(none),
        goal: "≤ +0.3 ms".into(),
        met: Some(extra <= 0.3),
        note: format!(
            "+{extra:.2} ms for the job's cgroup: made ahead (a directory in the v1 memory, pids and cpu hierarchies and the v2 one) and joined by the spawner's standby supervisor while it waited; at the start the limits written; at the end the account read before `process/exited` (the supervisor has killed and reaped the job by then), `cgroup.kill` and the directories' removal after it; with the default limits only (`processes`: the job stays out of the v1 cpu hierarchy): {:.0} µs ({:+.2} ms)",
            ms(dflt) * 1e3,
            ms(dflt) - ms(none)
        ),
    })
}
