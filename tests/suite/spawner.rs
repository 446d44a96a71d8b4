//! The spawner (`executor sandbox-exec --spawner`): the agent's one small
//! process that forks every job's supervisor. Whatever happens to the agent
//! or to the spawner, no job, supervisor or spawner is left behind, and no
//! request hangs.

use executor_client::Client;
use executor_protocol::types::process::{ProcessStartParams, SignalName};
use executor_tests::{
    alive, children, client_with_config, comm, fd_links, local_client, path_env, spawner_of,
    RawAgent, WAIT,
};
use std::collections::HashSet;
use std::time::Duration;

/// A name no other test's process has, for argv[0].
fn marker(tag: &str) -> String {
    format!(
        "spawner-{tag}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

fn sleeper(arg0: &str, secs: &str) -> ProcessStartParams {
    let mut p = ProcessStartParams::new(vec!["sleep".into(), secs.into()], "/", path_env());
    p.arg0 = Some(arg0.into());
    p
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
        .collect()
}

/// Live processes whose argv[0] is `arg0`.
fn with_arg0(arg0: &str) -> Vec<u32> {
    all_pids()
        .into_iter()
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .map(|c| c.split(|b| *b == 0).next() == Some(arg0.as_bytes()))
                .unwrap_or(false)
                && alive(*p)
        })
        .collect()
}

/// The pipe inodes `pid` holds open.
fn pipes_of(pid: u32) -> HashSet<String> {
    fd_links(pid)
        .into_iter()
        .filter(|l| l.starts_with("pipe:"))
        .collect()
}

/// Live processes holding any of `pipes`.
fn holding(pipes: &HashSet<String>) -> Vec<u32> {
    all_pids()
        .into_iter()
        .filter(|p| alive(*p) && !pipes_of(*p).is_disjoint(pipes))
        .collect()
}

/// Poll `check` until it is true or `WAIT` passes; whether it became true.
async fn eventually(mut check: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        if check() {
            return true;
        }
        if std::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// The agent SIGKILLed while its spawner is forking supervisors for a burst
// of starts: every job, every supervisor (those forked after the agent died
// too) and the spawner go.
#[tokio::test]
async fn sigkill_of_the_agent_while_the_spawner_forks_leaves_nothing() {
    let mut a = RawAgent::initialized().await;
    let agent = a.child.id().unwrap();
    let name = marker("agent-kill");
    let first = a.request(1, "process/start", &sleeper(&name, "1000")).await;
    let job = executor_tests::path(&first, "result.pid")
        .and_then(|v| v.as_u64())
        .unwrap_or_else(|| panic!("first start: {first:?}")) as u32;
    let supervisor = executor_tests::parent_pid(job);
    let spawner = executor_tests::parent_pid(supervisor);
    assert_eq!(comm(supervisor), "executor");
    assert_eq!(comm(spawner), "executor-spawn");
    assert_eq!(executor_tests::parent_pid(spawner), agent);
    // The lifeline (and the first job's status pipe): held by the agent
    // and by every supervisor it has.
    let shared: HashSet<String> = pipes_of(agent)
        .intersection(&pipes_of(supervisor))
        .cloned()
        .collect();
    assert!(
        !shared.is_empty(),
        "the supervisor holds the agent's lifeline"
    );
    for id in 2..102 {
        a.send_request(id, "process/start", &sleeper(&name, "1000"))
            .await;
    }
    // Kill once the spawner is busy with the burst.
    assert!(
        eventually(|| children(spawner).len() >= 3).await,
        "the spawner forks for the burst"
    );
    a.child.start_kill().unwrap();
    a.wait().await;
    assert!(
        eventually(|| with_arg0(&name).is_empty()).await,
        "jobs survived the agent: {:?}",
        with_arg0(&name)
    );
    assert!(
        eventually(|| holding(&shared).is_empty()).await,
        "supervisors survived the agent: {:?}",
        holding(&shared)
    );
    assert!(
        eventually(|| !alive(spawner)).await,
        "the spawner {spawner} survived the agent"
    );
}

/// Open descriptors of `pid`.
fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// The agent behind a local client: the parent of the spawner that forked
/// the supervisor of a job it starts.
async fn agent_and_spawner(c: &Client) -> (u32, u32) {
    let job = c.start(&sleeper("probe", "1000")).await.unwrap();
    let agent = executor_tests::agent_of_job(job.pid());
    job.signal(SignalName::Kill).await.unwrap();
    job.wait().await.unwrap();
    (agent, spawner_of(agent).expect("the agent has a spawner"))
}

// 1,000 starts at once on one connection: each runs (and exits 0) or is
// refused with limit_exceeded by max_processes; afterwards the agent holds
// no more descriptors than before and the spawner no child.
#[tokio::test]
async fn a_thousand_concurrent_starts_run_or_hit_the_limit_and_leak_nothing() {
    let c = client_with_config("[limits]\nmax_processes = 100\n").await;
    let (agent, spawner) = agent_and_spawner(&c).await;
    // Let the probe's record release its descriptors first.
    let settled = fd_count(agent);
    let name = marker("thousand");
    let starts = (0..1000).map(|_| {
        let c = c.clone();
        let p = sleeper(&name, "0.5");
        tokio::spawn(async move {
            match c.start(&p).await {
                Ok(job) => Ok(job.wait().await.expect("exit reported")),
                Err(e) => Err(e),
            }
        })
    });
    let results = tokio::time::timeout(
        Duration::from_secs(120),
        futures_util::future::join_all(starts),
    )
    .await
    .expect("every start is answered and every job's exit reported");
    let (mut ran, mut refused) = (0, 0);
    for r in results {
        match r.unwrap() {
            Ok(st) => {
                assert_eq!(st.code, Some(0), "{st:?}");
                ran += 1;
            }
            Err(e) => {
                assert_eq!(
                    e.code(),
                    Some(executor_protocol::ErrorCode::LimitExceeded),
                    "{e}"
                );
                refused += 1;
            }
        }
    }
    assert!(ran >= 100, "at least max_processes ran: {ran}");
    assert_eq!(ran + refused, 1000);
    // Every supervisor is gone; the one standby (forked ahead for the next
    // job, `executor-ready` until it has one) is all the spawner keeps.
    let supervisors = || -> Vec<(u32, String)> {
        children(spawner)
            .into_iter()
            .map(|p| (p, comm(p)))
            .filter(|(_, c)| c != "executor-ready")
            .collect()
    };
    assert!(
        eventually(|| supervisors().is_empty()).await,
        "the spawner still has supervisors: {:?}",
        supervisors()
    );
    assert!(
        children(spawner).len() <= 1,
        "one standby at most: {:?}",
        children(spawner)
    );
    assert!(
        eventually(|| fd_count(agent) <= settled).await,
        "the agent holds {} descriptors, {settled} before the burst",
        fd_count(agent)
    );
    assert!(with_arg0(&name).is_empty());
    // Control: the agent still starts jobs.
    let again = c.start(&sleeper(&name, "0")).await.unwrap();
    assert_eq!(again.wait().await.unwrap().code, Some(0));
    c.close().await.unwrap();
}

// A spawner killed from outside: the next start is answered (run by a new
// spawner, or `internal`), never left waiting; the one after runs; a job
// that was running keeps its supervisor and its exit is still reported.
#[tokio::test]
async fn a_killed_spawner_is_replaced_and_no_request_hangs() {
    let c = local_client().await;
    let (agent, spawner) = agent_and_spawner(&c).await;
    let name = marker("respawn");
    let running = c.start(&sleeper(&name, "1000")).await.unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(spawner as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(eventually(|| !alive(spawner)).await);
    let next = tokio::time::timeout(WAIT, c.start(&sleeper(&name, "0")))
        .await
        .expect("a start after the spawner's death is answered");
    match next {
        Ok(job) => assert_eq!(job.wait().await.unwrap().code, Some(0)),
        Err(e) => assert_eq!(
            e.code(),
            Some(executor_protocol::ErrorCode::Internal),
            "{e}"
        ),
    }
    let after = tokio::time::timeout(WAIT, c.start(&sleeper(&name, "1000")))
        .await
        .expect("answered")
        .expect("a new spawner runs the job");
    let respawned = executor_tests::parent_pid(executor_tests::parent_pid(after.pid()));
    assert_ne!(respawned, spawner);
    assert_eq!(executor_tests::parent_pid(respawned), agent);
    assert_eq!(comm(respawned), "executor-spawn");
    after.signal(SignalName::Kill).await.unwrap();
    assert_eq!(after.wait().await.unwrap().signal_number, Some(9));
    // The job started by the dead spawner is still supervised.
    running.signal(SignalName::Kill).await.unwrap();
    let st = tokio::time::timeout(WAIT, running.wait())
        .await
        .expect("the orphaned supervisor reports the exit")
        .unwrap();
    assert_eq!(st.signal.as_deref(), Some("SIGKILL"), "{st:?}");
    c.close().await.unwrap();
    assert!(eventually(|| with_arg0(&name).is_empty()).await);
}

/// A start that times out (the spawner stopped, SIGSTOP) answers that
/// nothing ran, and nothing does: the stopped spawner is killed with the
/// request in its queue, so a SIGCONT runs nothing; the next start gets a
/// new spawner. (The start's bound is 30 s: this test takes that long.)
#[tokio::test]
async fn a_start_that_times_out_never_runs_its_job_later() {
    let c = local_client().await;
    let (_agent, spawner) = agent_and_spawner(&c).await;
    let dir = executor_tests::unique_tempdir("spawn-timeout");
    let flag = dir.join("ran");
    let stopped = nix::unistd::Pid::from_raw(spawner as i32);
    nix::sys::signal::kill(stopped, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let p = ProcessStartParams::new(
        vec!["touch".into(), flag.to_string_lossy().into_owned()],
        "/",
        path_env(),
    );
    let e = tokio::time::timeout(Duration::from_secs(60), c.start(&p))
        .await
        .expect("the start is answered within its bound")
        .expect_err("a stopped spawner starts nothing");
    assert!(e.to_string().contains("nothing was run"), "{e}");
    // Were it alive, this would let it fork the queued request.
    let _ = nix::sys::signal::kill(stopped, nix::sys::signal::Signal::SIGCONT);
    assert!(
        eventually(|| !alive(spawner)).await,
        "the stopped spawner is killed"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!flag.exists(), "the timed-out start ran later");
    // Control: the next start runs, through a new spawner.
    let job = tokio::time::timeout(WAIT, c.start(&p))
        .await
        .expect("answered")
        .expect("a new spawner runs the job");
    assert_eq!(job.wait().await.unwrap().code, Some(0));
    assert!(flag.exists());
    c.close().await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `(fd, target)` of every descriptor `pid` holds.
fn fds_of(pid: u32) -> Vec<(u32, String)> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let fd = e.file_name().to_str()?.parse().ok()?;
            Some((
                fd,
                std::fs::read_link(e.path())
                    .ok()?
                    .to_string_lossy()
                    .into_owned(),
            ))
        })
        .collect()
}

/// The spawner's standby supervisor (`executor-ready`), other than `not`.
async fn standby_of(spawner: u32, not: Option<u32>) -> Option<u32> {
    let find = || {
        children(spawner)
            .into_iter()
            .find(|&p| Some(p) != not && comm(p) == "executor-ready")
    };
    eventually(|| find().is_some()).await;
    find()
}

// The supervisor the spawner forks ahead while it is idle: it holds nothing
// but the spawner's stdio, its own socket and the `cgroup.procs` of the
// next job's cgroup it joined (no lifeline, no job's pipe, no namespace of
// the pool), the next job runs under it, a standby killed from
// outside costs the next start a fork and nothing else, and the standby
// goes when the agent does.
#[tokio::test]
async fn the_standby_supervisor_holds_nothing_and_is_replaced() {
    let c = local_client().await;
    let (agent, spawner) = agent_and_spawner(&c).await;
    let standby = standby_of(spawner, None).await.expect("a standby");
    let spawner_fds = fds_of(spawner);
    let mut sockets = 0;
    for (fd, target) in fds_of(standby) {
        if fd <= 2 {
            assert!(
                spawner_fds.contains(&(fd, target.clone())),
                "fd {fd} is the spawner's: {target}"
            );
        } else if let Some(dir) = target.strip_suffix("/cgroup.procs") {
            // The next job's cgroup, made ahead, which it joined while it
            // waits: kept open until its job comes, and nothing else.
            let job = dir.rsplit('/').next().unwrap_or_default();
            assert!(job.starts_with("job-"), "fd {fd}: {target}");
            let own = std::fs::read_to_string(format!("/proc/{standby}/cgroup")).unwrap();
            assert!(
                own.lines().any(|l| l.ends_with(&format!("/{job}"))),
                "fd {fd}: {target} is the cgroup it is in: {own}"
            );
        } else {
            assert!(target.starts_with("socket:"), "fd {fd}: {target}");
            sockets += 1;
        }
    }
    assert_eq!(sockets, 1, "its own socket only: {:?}", fds_of(standby));
    // So no lifeline and no job's pipe: what it shares with the agent is
    // the spawner's own stdio (the agent's stderr).
    let shared: HashSet<String> = pipes_of(agent)
        .intersection(&pipes_of(standby))
        .cloned()
        .collect();
    assert!(
        shared.is_subset(&pipes_of(spawner)),
        "no lifeline or job pipe before it has a job: {shared:?}"
    );
    // The next job runs under it, and the next standby is forked.
    let name = marker("standby");
    let job = c.start(&sleeper(&name, "1000")).await.unwrap();
    assert_eq!(executor_tests::parent_pid(job.pid()), standby);
    assert_eq!(comm(standby), "executor");
    let next = standby_of(spawner, Some(standby))
        .await
        .expect("the next standby");
    // Killed from outside: the next start forks its supervisor itself.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(next as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(eventually(|| !alive(next)).await);
    let forked = c.start(&sleeper(&name, "1000")).await.unwrap();
    assert_ne!(executor_tests::parent_pid(forked.pid()), next);
    forked.signal(SignalName::Kill).await.unwrap();
    assert_eq!(forked.wait().await.unwrap().signal_number, Some(9));
    let last = standby_of(spawner, Some(next))
        .await
        .expect("a standby again");
    job.signal(SignalName::Kill).await.unwrap();
    job.wait().await.unwrap();
    c.close().await.unwrap();
    assert!(eventually(|| !alive(agent)).await, "the agent exits");
    assert!(
        eventually(|| !alive(last)).await,
        "the standby goes with it"
    );
    assert!(with_arg0(&name).is_empty());
}

// A standby that died (killed from outside) was reaped; its pid may be
// another process's by the time the next start finds the standby gone, and
// that process must not be signalled. The dead standby's pid is handed to
// an unrelated `sleep` (`ns_last_pid`, root only); the next start runs and
// the sleep lives.
#[tokio::test]
async fn a_dead_standbys_pid_is_never_signalled() {
    if executor_tests::current_uid() != 0 {
        return executor_tests::prerequisite_missing("root (ns_last_pid)");
    }
    let c = local_client().await;
    let (_, spawner) = agent_and_spawner(&c).await;
    let standby = standby_of(spawner, None).await.expect("a standby");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(standby as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(
        eventually(|| !std::path::Path::new(&format!("/proc/{standby}")).exists()).await,
        "the spawner reaps its dead standby"
    );
    // The standby's pid for a process of ours (other processes may take it
    // first: a few tries).
    let mut victim = None;
    for _ in 0..20 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (standby - 1).to_string()).unwrap();
        let mut sleep = std::process::Command::new("sleep")
            .arg("1000")
            .spawn()
            .unwrap();
        if sleep.id() == standby {
            victim = Some(sleep);
            break;
        }
        sleep.kill().unwrap();
        sleep.wait().unwrap();
    }
    let mut victim = victim.expect("the dead standby's pid for a new process");
    let job = c.start(&sleeper(&marker("stale"), "0")).await.unwrap();
    assert_eq!(job.wait().await.unwrap().code, Some(0));
    assert!(
        victim.try_wait().unwrap().is_none(),
        "the process that has the dead standby's pid was signalled"
    );
    victim.kill().unwrap();
    victim.wait().unwrap();
    c.close().await.unwrap();
}
