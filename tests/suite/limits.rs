//! Resource limits and whole-job accounting (docs/PROTOCOL.md §4.7),
//! through the real `executor` binary. Every case runs four ways:
//! - `as_root`: the agent as root, in this machine's own cgroups (v1
//!   controllers on a hybrid host, the v2 hierarchy for the kill and the
//!   CPU account);
//! - `delegated`: the agent as uid 65534 in a subtree of each hierarchy the
//!   test made and gave to that user (as systemd's `Delegate=yes` does);
//! - `no_cgroup`: the agent as uid 65534 with nothing delegated: the
//!   rlimits fallback, or a refusal naming the limit;
//! - `v1_only`: the agent as root with the unified hierarchy covered, as
//!   on a host of v1 hierarchies only (the end is a kill loop by pidfds).
//!
//! Self-stopping: every job ends on its own within seconds, every forked
//! process sleeps a bounded time, and each test checks that nothing of its
//! jobs is left on the host (by a marker in their argv).

use executor_client::{Client, ClientOptions, ErrorCode, ExitStatus};
use executor_protocol::types::process::{JobLimits, LimitHit, ProcessStartParams};
use executor_protocol::types::sandbox::{FilesystemIntent, ReadRoots, SandboxIntent};
use executor_tests::*;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Root,
    Delegated,
    NoCgroup,
    /// As root, with the unified hierarchy covered (a host with v1
    /// hierarchies only): a job's end is `pids.max` at 0 and a kill loop
    /// by pidfds, not `cgroup.kill`.
    V1Only,
}

/// A subtree of each cgroup hierarchy this process is in, given to a
/// user; removed (after what the agent left in it) when dropped.
struct Delegation {
    dirs: Vec<PathBuf>,
}

impl Drop for Delegation {
    fn drop(&mut self) {
        for d in &self.dirs {
            // The agent removed its own directory at its exit; a job's
            // leftover would show as a failure of the test that made it.
            for _ in 0..200 {
                if std::fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                if let Ok(rd) = std::fs::read_dir(d) {
                    for e in rd.flatten() {
                        if e.path().is_dir() {
                            let _ = std::fs::remove_dir(e.path());
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// This process's directory in each hierarchy a job's cgroup uses.
fn own_cgroup_dirs() -> Vec<PathBuf> {
    use executor_sandbox::cgroup::{locate, parse_mountinfo, parse_proc_cgroup};
    let read = |p| std::fs::read_to_string(p).unwrap();
    let l = locate(
        &parse_mountinfo(&read("/proc/self/mountinfo")),
        &parse_proc_cgroup(&read("/proc/self/cgroup")),
    );
    let mut dirs: Vec<PathBuf> = l.v2.into_iter().collect();
    for d in l.v1.into_values() {
        if !dirs.contains(&d) {
            dirs.push(d);
        }
    }
    dirs
}

/// Make `executor-test-N` under each of this process's cgroups, owned by
/// `uid` (the directory and its files, as systemd delegates a subtree).
fn delegate(uid: u32) -> Delegation {
    let name = format!("executor-test-{}-{}", std::process::id(), unique());
    let mut dirs = Vec::new();
    for own in own_cgroup_dirs() {
        let d = own.join(&name);
        std::fs::create_dir(&d).unwrap_or_else(|e| panic!("mkdir {}: {e}", d.display()));
        chown_r(&d, uid);
        dirs.push(d);
    }
    Delegation { dirs }
}

struct Agent {
    c: Client,
    _delegation: Option<Delegation>,
}

/// An agent for `mode`, with `config` (TOML) if given; `None` when the
/// mode cannot be had here (not root): a prerequisite missing.
async fn agent(mode: Mode, config: Option<&str>) -> Option<Agent> {
    if current_uid() != 0 {
        prerequisite_missing("root, to delegate cgroups and start an agent as another user");
        return None;
    }
    let mut args: Vec<String> = Vec::new();
    if let Some(toml) = config {
        let dir = unique_tempdir("limits-config");
        let p = dir.join("config.toml");
        std::fs::write(&p, toml).unwrap();
        chown_r(&dir, 65534);
        args.push("--config".into());
        args.push(p.display().to_string());
    }
    let bin = executor_bin_for_any_user();
    let (cmd, delegation) = match mode {
        Mode::Root => {
            let mut c = tokio::process::Command::new(executor_bin());
            c.args(&args);
            (c, None)
        }
        Mode::V1Only => {
            let unified = std::path::Path::new("/sys/fs/cgroup/unified");
            if !unified.join("cgroup.procs").exists() {
                prerequisite_missing(
                    "a hybrid host (v1 hierarchies and the unified one at /sys/fs/cgroup/unified)",
                );
                return None;
            }
            let mut c = tokio::process::Command::new("unshare");
            c.args(["-m", "--propagation", "private", "sh", "-c"])
                .arg("mount -t tmpfs none /sys/fs/cgroup/unified && exec \"$0\" \"$@\"")
                .arg(executor_bin())
                .args(&args);
            (c, None)
        }
        Mode::NoCgroup => {
            let mut c = tokio::process::Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                .arg(&bin)
                .args(&args);
            (c, None)
        }
        Mode::Delegated => {
            let d = delegate(65534);
            // Root moves the shell into the delegated cgroups, then it
            // becomes the user and execs the agent there.
            let joins: String = d
                .dirs
                .iter()
                .map(|p| format!("echo $$ > '{}/cgroup.procs' || exit 99; ", p.display()))
                .collect();
            let mut c = tokio::process::Command::new("sh");
            c.arg("-c").arg(format!(
                "{joins}exec setpriv --reuid=65534 --regid=65534 --clear-groups -- \"$@\""
            ));
            c.arg("sh").arg(&bin).args(&args);
            (c, Some(d))
        }
    };
    let c = Client::spawn(cmd, ClientOptions::default())
        .await
        .expect("agent");
    if mode == Mode::V1Only {
        let mech = mechanisms(&c).await;
        assert!(
            mech.contains(&"cgroup_v1".to_string()) && !mech.contains(&"cgroup_v2".to_string()),
            "an agent with v1 hierarchies only: {mech:?}"
        );
    }
    Some(Agent {
        c,
        _delegation: delegation,
    })
}

/// A number no other test of this run has.
fn unique() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    Rng(t
        ^ (u64::from(std::process::id()) << 32)
        ^ N.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    .next_u64()
}

/// A unique marker for this test's processes (in their argv).
pub(crate) fn marker() -> String {
    format!("limits-marker-{}", unique())
}

/// Pids of live processes whose argv holds `marker`.
pub(crate) fn marked(marker: &str) -> Vec<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| *p != me)
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(marker))
                .unwrap_or(false)
        })
        // Zombies are gone already for this purpose.
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .map(|s| {
                    !s.rsplit(')')
                        .next()
                        .unwrap_or("")
                        .trim_start()
                        .starts_with('Z')
                })
                .unwrap_or(false)
        })
        .collect()
}

/// Wait up to 10 s until `n` shells `sh -c SCRIPT` holding `marker` run
/// their `sleep` (a child whose name is `sleep`); the pids of those seen
/// last. A process forked but not yet exec'd carries its parent's argv:
/// counting marked processes, or even those with the shell's whole
/// command line (a shell's child on its way to exec `sleep` has it too),
/// can see a job's shells all there before they are.
pub(crate) async fn shells_running(marker: &str, script: &str, n: usize) -> Vec<u32> {
    let argv = format!("sh\0-c\0{script}\0{marker}\0");
    let sleeping = |p: u32| {
        std::fs::read_dir("/proc").is_ok_and(|d| {
            d.flatten().any(|e| {
                let q = e.file_name();
                let q = q.to_string_lossy();
                q.parse::<u32>().is_ok()
                    && std::fs::read_to_string(format!("/proc/{q}/stat")).is_ok_and(|st| {
                        st.rsplit_once(')')
                            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                            .is_some_and(|pp| pp == p.to_string())
                    })
                    && std::fs::read_to_string(format!("/proc/{q}/comm"))
                        .is_ok_and(|c| c.trim_end() == "sleep")
            })
        })
    };
    let running = || -> Vec<u32> {
        marked(marker)
            .into_iter()
            .filter(|&p| {
                std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c == argv.as_bytes())
                    && sleeping(p)
            })
            .collect()
    };
    for _ in 0..500 {
        let seen = running();
        if seen.len() >= n {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    running()
}

/// Wait until no process holds `marker`; the pids still there after 5 s.
pub(crate) async fn none_left(marker: &str) -> Vec<u32> {
    for _ in 0..100 {
        let left = marked(marker);
        if left.is_empty() {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    marked(marker)
}

fn sandboxed() -> SandboxIntent {
    SandboxIntent {
        filesystem: FilesystemIntent {
            read: ReadRoots::All,
            write: vec![],
            ..Default::default()
        },
        ..Default::default()
    }
}

pub(crate) fn params(
    argv: &[&str],
    limits: JobLimits,
    sandbox: Option<SandboxIntent>,
) -> ProcessStartParams {
    let mut p = ProcessStartParams::new(
        argv.iter().map(|s| s.to_string()).collect(),
        "/",
        path_env(),
    );
    p.limits = Some(limits);
    p.sandbox = sandbox;
    p
}

/// Run to the end: its status, its stdout+stderr, its `limits_degraded`.
pub(crate) async fn run(
    c: &Client,
    p: &ProcessStartParams,
) -> Result<(ExitStatus, String, Vec<String>), executor_client::Error> {
    let mut proc = c.start(p).await?;
    let degraded = proc.limits_degraded().to_vec();
    let mut out = Vec::new();
    let read = async {
        while let Some(o) = proc.next_output().await.expect("output") {
            out.extend_from_slice(&o.data);
        }
    };
    tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .expect("the job ends within 60 s");
    let st = proc.exit_status().expect("exit status");
    Ok((st, String::from_utf8_lossy(&out).into_owned(), degraded))
}

/// Python that forks up to 200 children (each sleeping 30 s, its argv
/// holding `marker` as python's own does), prints how many it got, and
/// exits leaving them.
fn fork_bomb(marker: &str) -> Vec<String> {
    let code = "import os,time,sys\nn=0\nwhile n<200:\n  try: pid=os.fork()\n  except OSError: break\n  if pid==0:\n    time.sleep(30); os._exit(0)\n  n+=1\nprint(n, flush=True)\nos._exit(0)\n";
    vec!["python3".into(), "-c".into(), code.into(), marker.into()]
}

pub(crate) async fn mechanisms(c: &Client) -> Vec<String> {
    c.call(&executor_protocol::types::session::EnvironmentInfoParams {})
        .await
        .unwrap()
        .sandbox
        .mechanisms
}

async fn fork_bomb_stops_at_the_limit(mode: Mode) {
    let Some(a) = agent(mode, None).await else {
        return;
    };
    let mech = mechanisms(&a.c).await;
    if mode != Mode::NoCgroup {
        assert!(
            mech.iter().any(|m| m.starts_with("cgroup_v")),
            "{mode:?}: no cgroup mechanism in {mech:?}"
        );
    } else {
        assert!(!mech.iter().any(|m| m.starts_with("cgroup_v")), "{mech:?}");
    }
    let m = marker();
    let argv = fork_bomb(&m);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let limits = JobLimits {
        processes: Some(32),
        ..Default::default()
    };
    // Without a cgroup the processes limit holds for a sandboxed job
    // alone (RLIMIT_NPROC in its own user namespace).
    let intent = (mode == Mode::NoCgroup).then(sandboxed);
    let (st, out, degraded) = run(&a.c, &params(&argv, limits, intent)).await.unwrap();
    assert_eq!(st.code, Some(0), "{mode:?}: {out}");
    let forked: u64 = out.trim().parse().unwrap_or_else(|_| panic!("{out:?}"));
    // The job's own processes: python and its children (32 in all).
    assert!(
        (24..=31).contains(&forked),
        "{mode:?}: {forked} children under processes: 32"
    );
    assert!(degraded.is_empty(), "{degraded:?}");
    if mode != Mode::NoCgroup {
        assert_eq!(st.limit_hit, Some(LimitHit::Processes), "{st:?}");
        let peak = st
            .usage
            .and_then(|u| u.processes_peak)
            .expect("processes_peak");
        assert!((25..=32).contains(&peak), "{mode:?}: peak {peak}");
    }
    // Its children outlived it (re-parented): the job's end killed them.
    assert_eq!(
        none_left(&m).await,
        Vec::<u32>::new(),
        "{mode:?}: left on the host"
    );
    // Positive control: with room, it forks all 200 (and leaves nothing).
    let m = marker();
    let argv = fork_bomb(&m);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let room = JobLimits {
        processes: Some(400),
        ..Default::default()
    };
    let intent = (mode == Mode::NoCgroup).then(sandboxed);
    let (st, out, _) = run(&a.c, &params(&argv, room, intent)).await.unwrap();
    assert_eq!((st.code, out.trim()), (Some(0), "200"), "{mode:?}");
    assert_eq!(st.limit_hit, None);
    assert_eq!(
        none_left(&m).await,
        Vec::<u32>::new(),
        "{mode:?}: left on the host"
    );
}

async fn a_memory_hog_is_killed_alone(mode: Mode) {
    let Some(a) = agent(mode, None).await else {
        return;
    };
    let hog = [
        "python3",
        "-c",
        "b=bytearray(256<<20); print('survived', len(b))",
    ];
    let limits = JobLimits {
        memory_bytes: Some(64 << 20),
        ..Default::default()
    };
    if mode == Mode::NoCgroup {
        // No memory cgroup: refused, naming the limit...
        let e = run(&a.c, &params(&hog, limits, None)).await.unwrap_err();
        let e = remote(e);
        assert_eq!(e.code, ErrorCode::SandboxUnavailable, "{e:?}");
        assert!(e.message.contains("limits.memory_bytes"), "{}", e.message);
        // ...or, not required, run with each process's address space
        // bounded, and said so.
        let soft = JobLimits {
            required: Some(false),
            ..limits
        };
        let (st, out, degraded) = run(&a.c, &params(&hog, soft, None)).await.unwrap();
        assert!(out.contains("MemoryError"), "{out}");
        assert_ne!(st.code, Some(0));
        assert!(
            degraded.iter().any(|d| d.contains("RLIMIT_AS")),
            "{degraded:?}"
        );
        return;
    }
    let (st, out, _) = run(&a.c, &params(&hog, limits, None)).await.unwrap();
    assert_eq!(
        st.signal.as_deref(),
        Some("SIGKILL"),
        "{mode:?}: {st:?} {out}"
    );
    assert_eq!(st.limit_hit, Some(LimitHit::Memory));
    let peak = st
        .usage
        .and_then(|u| u.peak_memory_bytes)
        .expect("peak memory");
    assert!(peak <= 64 << 20, "{peak}");
    // The agent and its other jobs live on; with room the same job runs.
    let room = JobLimits {
        memory_bytes: Some(1 << 30),
        ..Default::default()
    };
    let (st, out, _) = run(&a.c, &params(&hog, room, None)).await.unwrap();
    assert_eq!(
        (st.code, out.trim()),
        (Some(0), "survived 268435456"),
        "{mode:?}"
    );
    assert_eq!(st.limit_hit, None);
}

/// CPU seconds a spinner gets in 1.5 s of wall time under `limits`.
async fn spin(c: &Client, limits: JobLimits) -> f64 {
    let code = "import time\nt=time.time()\nwhile time.time()-t<1.5: pass\n";
    let (st, _, _) = run(c, &params(&["python3", "-c", code], limits, None))
        .await
        .unwrap();
    let u = st.usage.expect("usage");
    (u.cpu_user_us.unwrap() + u.cpu_system_us.unwrap()) as f64 / 1e6
}

async fn a_cpu_quota_is_a_share(mode: Mode) {
    let Some(a) = agent(mode, None).await else {
        return;
    };
    let quota = JobLimits {
        cpu_millis_per_sec: Some(100),
        ..Default::default()
    };
    if mode == Mode::NoCgroup {
        let e = remote(
            run(&a.c, &params(&["true"], quota, None))
                .await
                .unwrap_err(),
        );
        assert_eq!(e.code, ErrorCode::SandboxUnavailable);
        assert!(
            e.message.contains("limits.cpu_millis_per_sec"),
            "{}",
            e.message
        );
        return;
    }
    // Measured by the job's own account, not timed: a tenth of a core for
    // 1.5 s is about 0.15 s of CPU; unbounded, a spinner gets far more.
    let limited = spin(&a.c, quota).await;
    let free = spin(&a.c, JobLimits::default()).await;
    assert!(
        limited < 0.3,
        "{mode:?}: {limited:.3}s of CPU under 100 ms/s"
    );
    assert!(
        free > 2.0 * limited && free > 0.4,
        "{mode:?}: {free:.3}s free vs {limited:.3}s"
    );
}

/// With a cgroup the job's end is its cgroup's kill; without one (the
/// `no_cgroup` case) it is the spawner's: it is its jobs' subreaper, so
/// what the dead supervisor left is re-parented to it and killed.
async fn nothing_survives_a_killed_supervisor(mode: Mode) {
    let Some(a) = agent(mode, None).await else {
        return;
    };
    detached_job_ends_with_its_killed_supervisor(&a.c, JobLimits::default(), &format!("{mode:?}"))
        .await;
}

/// Variant, without a cgroup: the detached process keeps forking (a new
/// `sleep` every 50 ms, each bearing the marker) while and after its
/// supervisor is killed, so that orphans keep arriving at the spawner
/// while it kills: none is left within 5 s. The layer is the spawner as
/// its jobs' subreaper (no cgroup here).
#[tokio::test]
async fn a_forking_orphan_ends_with_its_killed_supervisor_without_a_cgroup() {
    let Some(a) = agent(Mode::NoCgroup, None).await else {
        return;
    };
    let m = format!("40.{:09}", unique() % 1_000_000_000);
    let script = "setsid sh -c 'while :; do sleep \"$0\" & sleep 0.05; done' \"$0\" & sleep \"$0\"";
    let p = params(&["sh", "-c", script, &m], JobLimits::default(), None);
    let mut proc = a.c.start(&p).await.unwrap();
    forking_job_ends_with_its_killed_supervisor(&mut proc, &m, 5).await;
}

/// Once at least `at_least` processes hold `marker` (the job's tree has
/// grown), SIGKILL the job's supervisor: its end is reported within 20 s
/// and nothing holding `marker` is left 5 s later (what is, is stopped and
/// killed before the test fails).
async fn forking_job_ends_with_its_killed_supervisor(
    proc: &mut executor_client::Process,
    marker: &str,
    at_least: usize,
) {
    let mut seen = 0;
    for _ in 0..500 {
        seen = marked(marker).len();
        if seen >= at_least {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(seen >= at_least, "the job's tree grows: {seen}");
    kill_supervisor_and_see_the_job_end_whole(proc, marker, "a forking job").await;
}

/// SIGKILL the job's supervisor from outside: the job's end is reported
/// within 20 s and nothing holding `marker` is left 5 s later (what is,
/// is stopped and killed before the test fails).
async fn kill_supervisor_and_see_the_job_end_whole(
    proc: &mut executor_client::Process,
    marker: &str,
    what: &str,
) {
    let supervisor = parent_pid(proc.pid());
    assert_eq!(comm(supervisor), "executor", "{what}: the job's supervisor");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(supervisor as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        while proc.next_output().await.unwrap().is_some() {}
    })
    .await;
    assert!(ended.is_ok(), "{what}: the job's end is reported");
    let left = none_left(marker).await;
    stop_and_kill(&left);
    assert_eq!(left, Vec::<u32>::new(), "{what}: left on the host");
}

/// Whatever a test's outcome, nothing of its jobs stays on the machine.
fn stop_and_kill(pids: &[u32]) {
    for sig in [
        nix::sys::signal::Signal::SIGSTOP,
        nix::sys::signal::Signal::SIGKILL,
    ] {
        for p in pids {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*p as i32), sig);
        }
    }
}

/// Variant, without a cgroup: a detached tree in which every process
/// forks as fast as it can (its children too), bounded only by the job's
/// `RLIMIT_NPROC` of 150: killing the spawner's direct children round
/// after round let the deeper levels refill the slots for tens of seconds.
/// The spawner stops each orphan subtree whole, then kills it: none is
/// left within 5 s. The layer is the spawner as subreaper.
#[tokio::test]
async fn a_deep_forking_orphan_tree_ends_with_its_killed_supervisor_without_a_cgroup() {
    let Some(a) = agent(Mode::NoCgroup, None).await else {
        return;
    };
    let m = marker();
    let bomb = "import os,time\nwhile True:\n  try: pid=os.fork()\n  except OSError: time.sleep(0.01); continue\n  if pid: time.sleep(0.005)\n";
    // `RLIMIT_NPROC` counts all of the user's processes (other tests'
    // too, and zombies until reaped): 150 above those.
    let theirs = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_to_string(e.path().join("status")).is_ok_and(|st| {
                st.lines()
                    .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("65534"))
            })
        })
        .count();
    let script = format!(
        "setsid prlimit --nproc={} python3 -c '{bomb}' \"$0\" & sleep 30; :",
        theirs + 150
    );
    let p = params(&["sh", "-c", &script, &m], JobLimits::default(), None);
    let mut proc = a.c.start(&p).await.unwrap();
    forking_job_ends_with_its_killed_supervisor(&mut proc, &m, 50).await;
}

/// An agent started under a low soft open files limit (64, hard 4096;
/// a login's is commonly 1024) runs 40 jobs at once, each holding a few
/// of its descriptors (it refused them past about 15 with `EMFILE`): it
/// raised its own soft limit to the hard one. Each job's program, sandboxed
/// or not, gets the 64 back, the hard limit kept.
#[tokio::test]
async fn many_jobs_run_under_a_low_soft_open_files_limit() {
    if current_uid() != 0 {
        prerequisite_missing("root, to start an agent under prlimit as it would be");
        return;
    }
    let mut cmd = tokio::process::Command::new("prlimit");
    cmd.arg("--nofile=64:4096").arg("--").arg(executor_bin());
    let c = Client::spawn(cmd, ClientOptions::default())
        .await
        .expect("agent");
    let m = marker();
    let mut jobs = Vec::new();
    for i in 0..40 {
        let p = params(&["sh", "-c", "sleep 20; :", &m], JobLimits::default(), None);
        match c.start(&p).await {
            Ok(j) => jobs.push(j),
            Err(e) => panic!("job {i} of 40 under a soft limit of 64: {e}"),
        }
    }
    for intent in [None, Some(sandboxed())] {
        let p = params(
            &["sh", "-c", "ulimit -Sn; ulimit -Hn"],
            JobLimits::default(),
            intent.clone(),
        );
        let (st, out, _) = run(&c, &p).await.unwrap();
        assert_eq!(
            (st.code, out.as_str()),
            (Some(0), "64\n4096\n"),
            "sandboxed: {}",
            intent.is_some()
        );
    }
    drop(jobs);
    drop(c);
    assert_eq!(none_left(&m).await, Vec::<u32>::new());
}

/// An unsandboxed job whose grandchild detached (a session of its own; no
/// parent-death signal is set for an unconfined job's descendants) and
/// whose supervisor is SIGKILLed from outside: its end is reported and
/// nothing of it is left on the host.
pub(crate) async fn detached_job_ends_with_its_killed_supervisor(
    c: &Client,
    limits: JobLimits,
    what: &str,
) {
    let m = marker();
    let script = "setsid sh -c 'sleep 30; :' \"$0\" & sh -c 'sleep 30; :' \"$0\"";
    let p = params(&["sh", "-c", script, &m], limits, None);
    let mut proc = c.start(&p).await.unwrap();
    // Up to 10 s: the suite's other agents load the machine meanwhile.
    let shells = shells_running(&m, "sleep 30; :", 2).await;
    assert_eq!(
        shells.len(),
        2,
        "{what}: the job's two inner shells run: {shells:?} of {:?}",
        marked(&m)
    );
    kill_supervisor_and_see_the_job_end_whole(&mut proc, &m, what).await;
}

async fn list_shows_current_usage(mode: Mode) {
    if mode == Mode::NoCgroup {
        return;
    }
    let Some(a) = agent(mode, None).await else {
        return;
    };
    let p = params(
        &["sh", "-c", "sleep 3 & sleep 3 & wait"],
        JobLimits::default(),
        None,
    );
    let proc = a.c.start(&p).await.unwrap();
    let mut seen = None;
    for _ in 0..50 {
        let l =
            a.c.call(&executor_protocol::types::process::ProcessListParams {})
                .await
                .unwrap();
        let me = l
            .processes
            .into_iter()
            .find(|x| x.process_id == proc.id())
            .unwrap();
        let u = me.usage.expect("usage of a running job");
        if u.processes == Some(3) {
            seen = Some(u);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let u = seen.expect("sh and its two sleeps counted");
    assert!(u.memory_bytes.is_some_and(|m| m > 0), "{u:?}");
    let st = proc.wait().await.unwrap();
    assert_eq!(st.code, Some(0));
    assert_eq!(st.usage.and_then(|u| u.processes_peak), Some(3));
}

macro_rules! three_ways {
    ($name:ident) => {
        mod $name {
            use super::*;
            #[tokio::test]
            async fn as_root() {
                super::$name(Mode::Root).await;
            }
            #[tokio::test]
            async fn delegated() {
                super::$name(Mode::Delegated).await;
            }
            #[tokio::test]
            async fn no_cgroup() {
                super::$name(Mode::NoCgroup).await;
            }
            #[tokio::test]
            async fn v1_only() {
                super::$name(Mode::V1Only).await;
            }
        }
    };
}

three_ways!(fork_bomb_stops_at_the_limit);
three_ways!(a_memory_hog_is_killed_alone);
three_ways!(a_cpu_quota_is_a_share);
three_ways!(nothing_survives_a_killed_supervisor);
three_ways!(list_shows_current_usage);

#[tokio::test]
async fn a_profile_caps_what_a_request_may_ask() {
    let config = "[limits.job]\nmemory_bytes = 268435456\nprocesses = 64\n";
    let Some(a) = agent(Mode::Root, Some(config)).await else {
        return;
    };
    let info = a.c.initialize_result().limits.job;
    assert_eq!(
        (info.memory_bytes, info.processes),
        (Some(256 << 20), Some(64)),
        "initialize reports the profile's limits"
    );
    let above = JobLimits {
        processes: Some(65),
        ..Default::default()
    };
    let e = remote(
        run(&a.c, &params(&["true"], above, None))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, ErrorCode::PolicyDenied, "{e:?}");
    assert!(
        e.message.contains("limits.processes is 65"),
        "{}",
        e.message
    );
    // Narrower is fine; silent takes the profile's.
    let narrower = JobLimits {
        processes: Some(8),
        ..Default::default()
    };
    let (st, _, _) = run(&a.c, &params(&["true"], narrower, None)).await.unwrap();
    assert_eq!(st.code, Some(0));
    let m = marker();
    let argv = fork_bomb(&m);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let (st, out, _) = run(&a.c, &params(&argv, JobLimits::default(), None))
        .await
        .unwrap();
    let forked: u64 = out.trim().parse().unwrap();
    assert!(forked <= 63, "the profile's 64 hold: {forked}");
    assert_eq!(st.limit_hit, Some(LimitHit::Processes));
    assert!(none_left(&m).await.is_empty());
    // Bad values name the field.
    for (bad, field) in [
        (
            JobLimits {
                processes: Some(0),
                ..Default::default()
            },
            "limits.processes",
        ),
        (
            JobLimits {
                memory_bytes: Some(4096),
                ..Default::default()
            },
            "limits.memory_bytes",
        ),
        (
            JobLimits {
                cpu_millis_per_sec: Some(1),
                ..Default::default()
            },
            "limits.cpu_millis_per_sec",
        ),
    ] {
        let e = remote(run(&a.c, &params(&["true"], bad, None)).await.unwrap_err());
        assert_eq!(e.code, ErrorCode::InvalidParams, "{field}: {e:?}");
        assert!(e.message.contains(field), "{}", e.message);
    }
}

#[tokio::test]
async fn a_killed_agents_cgroups_are_swept_at_the_next_start() {
    let Some(a) = agent(Mode::Root, None).await else {
        return;
    };
    let m = marker();
    let p = params(&["sh", "-c", "sleep 30; :", &m], JobLimits::default(), None);
    let proc = a.c.start(&p).await.unwrap();
    let agent_pid = agent_of_job(proc.pid());
    let own: Vec<PathBuf> = std::fs::read_to_string(format!("/proc/{}/cgroup", proc.pid()))
        .unwrap()
        .lines()
        .filter(|l| l.contains("/executor-"))
        .map(|l| l.splitn(3, ':').nth(2).unwrap().to_string())
        .map(PathBuf::from)
        .collect();
    assert!(!own.is_empty(), "the job is in the agent's cgroups");
    let dirs: Vec<PathBuf> = own_cgroup_dirs()
        .into_iter()
        .flat_map(|d| std::fs::read_dir(d).unwrap().flatten().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("executor-{agent_pid}-")))
        })
        .collect();
    assert!(!dirs.is_empty(), "the agent's directories");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent_pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(wait_dead(agent_pid, Duration::from_secs(10)).await);
    // The supervisor kills the job when the agent dies; its directories
    // stay until an agent starts.
    assert!(none_left(&m).await.is_empty());
    // Its directories stay until an agent of this user starts (another
    // test's agent, running in parallel, may be the one that sweeps them).
    let b = agent(Mode::Root, None).await.unwrap();
    b.c.call(&executor_protocol::types::session::EnvironmentInfoParams {})
        .await
        .unwrap();
    for d in &dirs {
        assert!(!d.exists(), "{} swept", d.display());
    }
}

/// A sandboxed job sees its own cgroup as the root (its cgroup namespace)
/// and cannot move itself out of it nor raise its limit: cgroupfs is not
/// among its write roots (the read-only bind of the host's tree: EROFS).
/// Positive control: the same writes from an unsandboxed root job succeed
/// (root is root: limits bind such a job only as long as it cooperates).
#[tokio::test]
async fn a_sandboxed_job_cannot_leave_or_widen_its_cgroup() {
    let Some(a) = agent(Mode::Root, None).await else {
        return;
    };
    let pids = own_cgroup_dirs()
        .into_iter()
        .find(|d| d.join("pids.max").exists() || d.ends_with("pids"))
        .expect("a pids hierarchy");
    let script = format!(
        "grep -c ':/$' /proc/self/cgroup; \
         (echo $$ > {root}/cgroup.procs) 2>&1 | grep -c 'Read-only file system'; \
         n=0; t=0; for f in {root}/executor-*/job-*/pids.max; do t=$((t+1)); \
         (echo 100000 > $f) 2>/dev/null && n=$((n+1)); done; echo widened=$n of $t",
        root = pids.display()
    );
    let limits = JobLimits {
        processes: Some(16),
        ..Default::default()
    };
    let (st, out, _) = run(
        &a.c,
        &params(&["sh", "-c", &script], limits, Some(sandboxed())),
    )
    .await
    .unwrap();
    assert_eq!(st.code, Some(0), "{out}");
    let lines: Vec<&str> = out.lines().collect();
    // Every hierarchy's line ends in "/": its own cgroup is its root.
    let hierarchies = std::fs::read_to_string("/proc/self/cgroup")
        .unwrap()
        .lines()
        .count();
    assert_eq!(lines[0], hierarchies.to_string(), "{out}");
    assert_eq!(lines[1], "1", "moving out: EROFS ({out})");
    // Its own job's pids.max is among the targets (seen through the
    // read-only tree), and none could be written.
    let (widened, of) = lines[2]
        .strip_prefix("widened=")
        .and_then(|r| r.split_once(" of "))
        .expect("widened= line");
    assert_eq!(widened, "0", "{out}");
    assert!(of.parse::<u32>().unwrap() >= 1, "{out}");
    // The control: unsandboxed root leaves its cgroup.
    let control = format!(
        "echo $$ > {root}/cgroup.procs; echo move=$?; grep ':pids:' /proc/self/cgroup",
        root = pids.display()
    );
    let (_, out, _) = run(&a.c, &params(&["sh", "-c", &control], limits, None))
        .await
        .unwrap();
    assert!(out.contains("move=0"), "{out}");
}

/// A sandboxed job's `:tmp` is a tmpfs of `tmp_bytes`: a write past it
/// gets ENOSPC and the host's /tmp holds nothing of it; with room the same
/// write succeeds. Enforced without a cgroup too (the tmpfs's own size).
async fn tmp_is_bounded(mode: Mode) {
    let Some(a) = agent(mode, None).await else {
        return;
    };
    let intent = SandboxIntent {
        filesystem: FilesystemIntent {
            read: ReadRoots::All,
            write: vec![":tmp".into()],
            ..Default::default()
        },
        ..Default::default()
    };
    // head's error on the same stream as the rest (two pipes' chunks may
    // arrive in either order).
    let write = "head -c 12582912 /dev/zero 2>&1 > /tmp/big; echo rc=$?; \
                 df -k /tmp | tail -n 1 | tr -s ' ' | cut -d' ' -f2";
    let small = JobLimits {
        tmp_bytes: Some(8 << 20),
        ..Default::default()
    };
    let (st, out, _) = run(
        &a.c,
        &params(&["sh", "-c", write], small, Some(intent.clone())),
    )
    .await
    .unwrap();
    assert_eq!(st.code, Some(0), "{out}");
    assert!(out.contains("No space left on device"), "{mode:?}: {out}");
    assert!(out.contains("rc=1"), "{mode:?}: {out}");
    assert!(out.trim_end().ends_with("8192"), "an 8 MiB tmpfs: {out}");
    // Positive control: 16 MiB holds the 12 MiB file. Without tmp_bytes
    // :tmp is the job's directory on the host's disk (not a tmpfs of 8 or
    // 16 MiB: the host's file system's size).
    let room = JobLimits {
        tmp_bytes: Some(16 << 20),
        ..Default::default()
    };
    let (_, out, _) = run(
        &a.c,
        &params(&["sh", "-c", write], room, Some(intent.clone())),
    )
    .await
    .unwrap();
    assert!(out.contains("rc=0"), "{mode:?}: {out}");
    let (_, out, _) = run(
        &a.c,
        &params(&["sh", "-c", write], JobLimits::default(), Some(intent)),
    )
    .await
    .unwrap();
    assert!(out.contains("rc=0"), "{mode:?}: {out}");
    let size: u64 = out
        .trim_end()
        .rsplit('\n')
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(size > 16 * 1024, "the host's file system: {out}");
}

three_ways!(tmp_is_bounded);

// Hostile jobs and requests against the limits (a security review).

/// The `job-*` directories under `own` (a hierarchy's directory, or a
/// delegated subtree) of agents named `prefix` (`executor-` for any,
/// `executor-PID-` for one).
fn job_dirs_under(own: &std::path::Path, prefix: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(own) else {
        return out;
    };
    for e in rd.flatten() {
        if !e.file_name().to_string_lossy().starts_with(prefix) {
            continue;
        }
        for j in std::fs::read_dir(e.path()).into_iter().flatten().flatten() {
            if j.file_name().to_string_lossy().starts_with("job-") {
                out.push(j.path());
            }
        }
    }
    out
}

/// Whether `dir` holds the spawner's standby supervisor alone (the next
/// job's cgroup, made ahead and joined while it waits).
fn holds_the_standby_alone(dir: &std::path::Path) -> bool {
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    let pids: Vec<&str> = procs.split_whitespace().collect();
    !pids.is_empty()
        && pids.iter().all(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm"))
                .is_ok_and(|c| c.trim_end() == "executor-ready")
        })
}

/// The `job-*` directories of jobs (not the one made ahead for the next
/// job, once the standby holds it: waited for, up to 5 s) in `dirs` (from
/// [`job_dirs_under`]). Every hierarchy's directory of the one made ahead
/// is left out (its name is the same in each).
async fn jobs_only(list: impl Fn() -> Vec<PathBuf>) -> Vec<PathBuf> {
    for _ in 0..250 {
        let dirs = list();
        let ahead: Vec<std::ffi::OsString> = dirs
            .iter()
            .filter(|d| holds_the_standby_alone(d))
            .filter_map(|d| d.file_name().map(ToOwned::to_owned))
            .collect();
        if !ahead.is_empty() {
            let mut jobs: Vec<PathBuf> = dirs
                .into_iter()
                .filter(|d| d.file_name().is_none_or(|n| !ahead.iter().any(|a| a == n)))
                .collect();
            jobs.sort();
            return jobs;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "no job's cgroup made ahead holds the standby supervisor: {:?}",
        list()
    );
}

/// The `job-*` directories of the agent `agent_pid`'s jobs, in every
/// hierarchy (see [`jobs_only`]).
async fn job_dirs_of(agent_pid: u32) -> Vec<PathBuf> {
    jobs_only(|| {
        own_cgroup_dirs()
            .iter()
            .flat_map(|own| job_dirs_under(own, &format!("executor-{agent_pid}-")))
            .collect()
    })
    .await
}

/// The next job's cgroup is made ahead and joined by the spawner's
/// standby supervisor while it waits: the next start runs in it (the one
/// the standby held), with its own limits; starts at once each get a
/// cgroup of their own and their own limits whichever supervisor took
/// them; nothing of any is left after.
async fn the_next_jobs_cgroup_is_made_ahead(mode: Mode) {
    let Some(a) = agent(mode, None).await else {
        return;
    };
    let m = marker();
    let keep =
        a.c.start(&params(
            &["sh", "-c", "sleep 20; :", &m],
            JobLimits::default(),
            None,
        ))
        .await
        .unwrap();
    let agent_pid = agent_of_job(keep.pid());
    let mut bases = own_cgroup_dirs();
    if let Some(d) = &a._delegation {
        bases.extend(d.dirs.iter().cloned());
    }
    let prefix = format!("executor-{agent_pid}-");
    let all = || -> Vec<PathBuf> {
        bases
            .iter()
            .flat_map(|b| job_dirs_under(b, &prefix))
            .collect()
    };
    let mut ahead = None;
    for _ in 0..250 {
        ahead = all()
            .into_iter()
            .find(|d| holds_the_standby_alone(d))
            .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()));
        if ahead.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ahead = ahead.expect("a cgroup made ahead, held by the standby");
    // The job prints its pids cgroup and that cgroup's pids.max.
    let script = "p=$(grep ':pids:' /proc/self/cgroup | cut -d: -f3); \
                  echo $p; cat /sys/fs/cgroup/pids$p/pids.max";
    let limits = |n| JobLimits {
        processes: Some(n),
        ..Default::default()
    };
    let (st, out, _) = run(&a.c, &params(&["sh", "-c", script], limits(7), None))
        .await
        .unwrap();
    assert_eq!(st.code, Some(0), "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].ends_with(&format!("/{ahead}")),
        "the job runs in the cgroup made ahead ({ahead}): {out}"
    );
    assert_eq!(lines[1], "8", "7 and its supervisor: {out}");
    // Eight starts at once, each its own limit.
    let starts = (10..18u64).map(|n| {
        let c = &a.c;
        async move {
            let (st, out, _) = run(c, &params(&["sh", "-c", script], limits(n), None))
                .await
                .unwrap();
            (n, st, out)
        }
    });
    let mut seen = std::collections::HashSet::new();
    for (n, st, out) in futures_util::future::join_all(starts).await {
        assert_eq!(st.code, Some(0), "{out}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[1], (n + 1).to_string(), "limit {n}: {out}");
        assert!(
            seen.insert(lines[0].to_string()),
            "a cgroup of its own: {out}"
        );
    }
    keep.signal(executor_protocol::types::process::SignalName::Kill)
        .await
        .unwrap();
    assert!(none_left(&m).await.is_empty());
    // Only the next job's, made ahead, is left.
    let mut left = Vec::new();
    for _ in 0..250 {
        left = jobs_only(&all).await;
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(left.is_empty(), "left: {left:?}");
}

#[tokio::test]
async fn the_next_jobs_cgroup_is_made_ahead_as_root() {
    the_next_jobs_cgroup_is_made_ahead(Mode::Root).await;
}

#[tokio::test]
async fn the_next_jobs_cgroup_is_made_ahead_delegated() {
    the_next_jobs_cgroup_is_made_ahead(Mode::Delegated).await;
}

/// With v1 hierarchies only: concurrent starts racing the next cgroup's
/// offer to the standby each run in a cgroup of their own, with their own
/// limit, and the end (a kill loop by pidfds) leaves nothing.
#[tokio::test]
async fn the_next_jobs_cgroup_is_made_ahead_v1_only() {
    the_next_jobs_cgroup_is_made_ahead(Mode::V1Only).await;
}

/// An agent running with a real-time policy (`chrt -f`) starts jobs with
/// the default limits: a real-time process may not join a v1 cpu cgroup
/// without a real-time budget (EINVAL), and a job without a CPU quota
/// does not join one (every start once failed so, `sandbox_unavailable`).
/// A quota is refused with that reason, nothing run.
#[tokio::test]
async fn a_real_time_agent_runs_jobs_without_a_quota() {
    if current_uid() != 0 {
        prerequisite_missing("root, for a real-time policy");
        return;
    }
    let mut cmd = tokio::process::Command::new("chrt");
    cmd.args(["-f", "1"]).arg(executor_bin());
    let c = Client::spawn(cmd, ClientOptions::default())
        .await
        .expect("agent");
    let m = marker();
    for sb in [None, Some(sandboxed())] {
        for _ in 0..3 {
            let (st, out, _) = run(
                &c,
                &params(
                    &["sh", "-c", "echo ran", &m],
                    JobLimits::default(),
                    sb.clone(),
                ),
            )
            .await
            .unwrap();
            assert_eq!((st.code, out.as_str()), (Some(0), "ran\n"));
        }
    }
    let quota = JobLimits {
        cpu_millis_per_sec: Some(500),
        ..Default::default()
    };
    match run(&c, &params(&["sh", "-c", "echo ran", &m], quota, None)).await {
        // Where the kernel does not schedule real-time tasks by group.
        Ok((st, out, _)) => assert_eq!((st.code, out.as_str()), (Some(0), "ran\n")),
        Err(e) => {
            let e = remote(e);
            assert_eq!(e.code, ErrorCode::SandboxUnavailable, "{e:?}");
            assert!(e.message.contains("cgroup"), "{}", e.message);
        }
    }
    assert!(none_left(&m).await.is_empty());
}

/// Starts refused after the job's cgroup was made (cwd missing, program
/// missing, a limit the kernel rejects) leave no cgroup; limits beyond
/// what a cgroup takes are `invalid_params` naming the field, not an I/O
/// error at the start (a `cpu_millis_per_sec` of u64::MAX once became a
/// quota `cpu.cfs_quota_us` refused with EINVAL).
#[tokio::test]
async fn failed_starts_leave_no_cgroup() {
    let Some(a) = agent(Mode::Root, None).await else {
        return;
    };
    let m = marker();
    let p = params(&["sh", "-c", "sleep 20; :", &m], JobLimits::default(), None);
    let keep = a.c.start(&p).await.unwrap();
    let agent_pid = agent_of_job(keep.pid());
    let before = job_dirs_of(agent_pid).await;
    assert!(!before.is_empty(), "the running job's cgroup");
    let mut missing_cwd = params(&["true"], JobLimits::default(), None);
    missing_cwd.cwd = "/nonexistent-limits-review".into();
    let e = remote(run(&a.c, &missing_cwd).await.unwrap_err());
    assert_eq!(e.code, ErrorCode::NotFound, "{e:?}");
    let no_prog = params(
        &["/nonexistent-limits-review/prog"],
        JobLimits::default(),
        None,
    );
    let e = remote(run(&a.c, &no_prog).await.unwrap_err());
    assert_eq!(e.code, ErrorCode::NotFound, "{e:?}");
    for (bad, field) in [
        (
            JobLimits {
                cpu_millis_per_sec: Some(u64::MAX),
                ..Default::default()
            },
            "limits.cpu_millis_per_sec",
        ),
        (
            JobLimits {
                cpu_millis_per_sec: Some(200_000_000_000),
                ..Default::default()
            },
            "limits.cpu_millis_per_sec",
        ),
    ] {
        let e = remote(run(&a.c, &params(&["true"], bad, None)).await.unwrap_err());
        assert_eq!(e.code, ErrorCode::InvalidParams, "{field}: {e:?}");
        assert!(e.message.contains(field), "{}", e.message);
    }
    // The largest CPU share still runs (one million cores' worth).
    let most = JobLimits {
        cpu_millis_per_sec: Some(1_000_000_000),
        ..Default::default()
    };
    let (st, _, _) = run(&a.c, &params(&["true"], most, None)).await.unwrap();
    assert_eq!(st.code, Some(0));
    let huge_memory = JobLimits {
        memory_bytes: Some(u64::MAX),
        ..Default::default()
    };
    let (st, _, _) = run(&a.c, &params(&["true"], huge_memory, None))
        .await
        .unwrap();
    assert_eq!(st.code, Some(0));
    // The ended jobs' cgroups go after their `process/exited`: waited for.
    let mut now = Vec::new();
    for _ in 0..250 {
        now = job_dirs_of(agent_pid).await;
        if now == before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(now, before, "only the running job's");
    drop(keep);
}

/// No descriptor of a job (sandboxed or not) is a cgroup file: the
/// supervisor closed the `cgroup.procs` it joined by.
#[tokio::test]
async fn a_job_holds_no_cgroup_descriptor() {
    let Some(a) = agent(Mode::Root, None).await else {
        return;
    };
    let script = "for f in /proc/self/fd/*; do echo \"$f -> $(readlink $f)\"; done";
    for sb in [None, Some(sandboxed())] {
        let (_, out, _) = run(
            &a.c,
            &params(&["sh", "-c", script], JobLimits::default(), sb),
        )
        .await
        .unwrap();
        assert!(out.contains("/proc/self/fd/2 -> "), "{out}");
        assert!(!out.contains("cgroup"), "{out}");
    }
}

/// A write root on the cgroup tree (`/sys/fs/cgroup`, or one hierarchy)
/// grants a sandboxed job no cgroup write either: it neither raises its
/// own `pids.max` nor moves out of its cgroup (EROFS), as under a write
/// root `/`. Before the fix both writes succeeded (`8:pids:/../..`).
#[tokio::test]
async fn a_write_root_on_cgroupfs_does_not_widen_the_job() {
    let Some(a) = agent(Mode::Root, None).await else {
        return;
    };
    let pids = own_cgroup_dirs()
        .into_iter()
        .find(|d| d.join("pids.max").exists() || d.ends_with("pids"))
        .expect("a pids hierarchy");
    let script = format!(
        "t=0; for f in {root}/executor-*/job-*/pids.max; do t=$((t+1)); \
         (echo 100000 > $f) 2>/dev/null && echo WROTE $f; done; echo targets=$t; \
         (echo $$ > {root}/cgroup.procs) 2>/dev/null && echo MOVED; \
         (echo 1 > {root}/cgroup.clone_children) 2>&1 | grep -c 'Read-only file system'",
        root = pids.display()
    );
    let limits = JobLimits {
        processes: Some(16),
        ..Default::default()
    };
    let parent = pids
        .parent()
        .expect("the pids hierarchy's parent")
        .to_path_buf();
    for write in [pids.clone(), parent] {
        let mut intent = sandboxed();
        intent.filesystem.write = vec![write.display().to_string().into()];
        let (st, out, _) = run(&a.c, &params(&["sh", "-c", &script], limits, Some(intent)))
            .await
            .unwrap();
        assert_eq!(st.code, Some(0), "{}: {out}", write.display());
        assert!(!out.contains("WROTE"), "{}: {out}", write.display());
        assert!(!out.contains("MOVED"), "{}: {out}", write.display());
        assert!(
            !out.contains("targets=0"),
            "its own pids.max is seen: {out}"
        );
        assert!(out.trim_end().ends_with('1'), "EROFS: {out}");
    }
}

/// An unsandboxed job's detached, SIGHUP- and SIGTERM-ignoring grandchild
/// ends when the agent is SIGKILLed (no agent starts after it).
#[tokio::test]
async fn a_detached_process_ends_with_a_killed_agent() {
    let Some(a) = agent(Mode::Root, None).await else {
        return;
    };
    let m = marker();
    let script = "setsid sh -c 'trap \"\" HUP TERM; sleep 25; :' \"$0\" & sleep 25; :";
    let p = params(&["sh", "-c", script, &m], JobLimits::default(), None);
    let proc = a.c.start(&p).await.unwrap();
    let detached = shells_running(&m, "trap \"\" HUP TERM; sleep 25; :", 1).await;
    assert_eq!(detached.len(), 1, "the job's detached shell: {detached:?}");
    let agent_pid = agent_of_job(proc.pid());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent_pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(wait_dead(agent_pid, Duration::from_secs(10)).await);
    // Its supervisor ends the job whole, before any next agent's sweep.
    assert_eq!(none_left(&m).await, Vec::<u32>::new(), "left on the host");
}

/// An unsandboxed job of a delegated agent (its job cgroup is its user's)
/// makes a child cgroup of its own job's in every hierarchy and moves a
/// process there: the end kills it too and removes the whole subtree (it
/// was left, `EBUSY`, and no sweep removed it; on a host without v2's
/// `cgroup.kill` the process outlived the end).
#[tokio::test]
async fn a_child_cgroup_of_the_job_ends_with_it() {
    let Some(a) = agent(Mode::Delegated, None).await else {
        return;
    };
    let m = marker();
    let dir = "d=$(grep -E \":$h:\" /proc/self/cgroup | cut -d: -f3); \
               [ $h = unified ] && d=$(grep '^0::' /proc/self/cgroup | cut -d: -f3); \
               d=/sys/fs/cgroup/$h$d";
    let script = format!(
        "for h in pids memory unified; do {dir}; mkdir $d/sub && echo made; done; \
         sh -c 'for h in pids memory unified; do {dir}; echo $$ > $d/sub/cgroup.procs && echo moved; done; \
         sleep 25; :' \"$0\" & sleep 1"
    );
    let p = params(&["sh", "-c", &script, &m], JobLimits::default(), None);
    let mut proc = a.c.start(&p).await.unwrap();
    let mut out = Vec::new();
    while let Some(o) = proc.next_output().await.unwrap() {
        out.extend_from_slice(&o.data);
    }
    let out = String::from_utf8_lossy(&out).into_owned();
    assert_eq!(out.matches("made").count(), 3, "{out}");
    assert_eq!(out.matches("moved").count(), 3, "{out}");
    assert!(
        none_left(&m).await.is_empty(),
        "the moved process is killed"
    );
    let delegated = &a._delegation.as_ref().expect("delegated").dirs;
    // Removed after `process/exited` (on a blocking thread): waited for.
    let mut left = Vec::new();
    for _ in 0..250 {
        left = jobs_only(|| {
            delegated
                .iter()
                .flat_map(|d| job_dirs_under(d, "executor-"))
                .collect()
        })
        .await;
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(left.is_empty(), "left: {left:?}");
}

/// An agent in a PID namespace of its own sharing the host's cgroups (its
/// `executor-PID-START` names a pid that is another process, or none, in
/// the host's namespace) keeps its jobs when an agent of the host's
/// namespace starts and sweeps: its lock on its directory says it is
/// alive. (Its job was SIGKILLed by the sweep before.)
#[tokio::test]
async fn an_agent_of_another_pid_namespace_is_not_swept() {
    if current_uid() != 0 {
        prerequisite_missing("root, for a PID namespace and the host's cgroups");
        return;
    }
    let mut c = tokio::process::Command::new("unshare");
    c.args(["--pid", "--fork", "--mount-proc", "--"])
        .arg(executor_bin());
    let inner = Client::spawn(c, ClientOptions::default())
        .await
        .expect("an agent in its own PID namespace");
    let m = marker();
    let p = params(&["sh", "-c", "sleep 20; :", &m], JobLimits::default(), None);
    let proc = inner.start(&p).await.unwrap();
    assert!(
        proc.pid() < 100,
        "a pid of the inner namespace: {}",
        proc.pid()
    );
    for _ in 0..100 {
        if !marked(&m).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!marked(&m).is_empty(), "the inner agent's job runs");
    let outer = agent(Mode::Root, None).await.unwrap();
    outer
        .c
        .call(&executor_protocol::types::session::EnvironmentInfoParams {})
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !marked(&m).is_empty(),
        "the outer agent's sweep left it alone"
    );
    drop(proc);
    drop(inner);
    assert!(none_left(&m).await.is_empty(), "it ends with its agent");
}

/// A stopped process (SIGSTOP) left by a job, sandboxed or not, ends
/// with it; a full `:tmp` tmpfs counts towards the job's memory (the
/// memory limit, not the tmpfs's larger size, ends a job that fills it).
#[tokio::test]
async fn stopped_processes_and_a_full_tmp_end_with_the_job() {
    let Some(a) = agent(Mode::Root, None).await else {
        return;
    };
    let m = marker();
    let stop = "sleep 30 & kill -STOP $!; sh -c 'kill -STOP $$' \"$0\" & sleep 0.2; :";
    for sb in [None, Some(sandboxed())] {
        let sandboxed = sb.is_some();
        let (st, _, _) = run(
            &a.c,
            &params(&["sh", "-c", stop, &m], JobLimits::default(), sb),
        )
        .await
        .unwrap();
        assert_eq!(st.code, Some(0), "sandboxed {sandboxed}");
        assert!(none_left(&m).await.is_empty(), "sandboxed {sandboxed}");
    }
    let mut intent = sandboxed();
    intent.filesystem.write = vec![":tmp".into()];
    let l = JobLimits {
        memory_bytes: Some(32 << 20),
        tmp_bytes: Some(128 << 20),
        ..Default::default()
    };
    let fill = "head -c 100000000 /dev/zero > /tmp/x; echo rc=$?";
    let (st, out, _) = run(&a.c, &params(&["sh", "-c", fill], l, Some(intent)))
        .await
        .unwrap();
    assert_eq!(st.limit_hit, Some(LimitHit::Memory), "{st:?} {out}");
    assert!(
        st.usage
            .and_then(|u| u.peak_memory_bytes)
            .is_some_and(|p| p <= 32 << 20),
        "{st:?}"
    );
}

/// Without a cgroup: the memory limit's fallback bounds the program
/// (its `RLIMIT_AS`, set just before its exec), not its supervisor, so a
/// small limit still starts the job; and a limit the configuration file
/// set is required even when it equals the built-in default.
#[tokio::test]
async fn without_a_cgroup_the_fallbacks_bind_the_job_and_the_file_is_required() {
    let Some(a) = agent(Mode::NoCgroup, None).await else {
        return;
    };
    let small = JobLimits {
        memory_bytes: Some(16 << 20),
        required: Some(false),
        ..Default::default()
    };
    let (st, out, degraded) = run(&a.c, &params(&["sh", "-c", "ulimit -v"], small, None))
        .await
        .unwrap();
    assert_eq!((st.code, out.trim()), (Some(0), "16384"), "{out}");
    assert!(
        degraded.iter().any(|d| d.contains("RLIMIT_AS")),
        "{degraded:?}"
    );
    drop(a);
    // The file's processes = 4096 (the built-in default's value) is the
    // file's: an unsandboxed job cannot have it here, so it is refused.
    let config = "[limits.job]\nprocesses = 4096\n";
    let Some(a) = agent(Mode::NoCgroup, Some(config)).await else {
        return;
    };
    let e = remote(
        run(&a.c, &params(&["true"], JobLimits::default(), None))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, ErrorCode::SandboxUnavailable, "{e:?}");
    assert!(e.message.contains("limits.processes"), "{}", e.message);
    // Without the file, the same start runs, the default reported.
    let Some(b) = agent(Mode::NoCgroup, None).await else {
        return;
    };
    let (st, _, degraded) = run(&b.c, &params(&["true"], JobLimits::default(), None))
        .await
        .unwrap();
    assert_eq!(st.code, Some(0));
    assert!(
        degraded
            .iter()
            .any(|d| d.contains("limits.processes (the agent's default)")),
        "{degraded:?}"
    );
}

/// The pid of the spawner's standby supervisor and the name of the
/// cgroup made ahead it holds alone (waited for, up to 5 s), among the
/// `job-*` directories `list` gives.
async fn the_standby(list: impl Fn() -> Vec<PathBuf>) -> (u32, String) {
    for _ in 0..250 {
        for d in list() {
            if holds_the_standby_alone(&d) {
                let procs = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
                if let (Some(pid), Some(name)) = (
                    procs.split_whitespace().next().and_then(|p| p.parse().ok()),
                    d.file_name(),
                ) {
                    return (pid, name.to_string_lossy().into_owned());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no standby supervisor in a cgroup made ahead: {:?}", list());
}

/// Adversarial pass on the cgroup made ahead: another job's end does not
/// reach the standby supervisor waiting in the next job's cgroup (it is
/// alive and still there after a job ended by `cgroup.kill`); a standby
/// SIGKILLed from outside is replaced, and the next start still runs in
/// the cgroup made ahead with its own limit, alone there (no other job's
/// process, no second supervisor); the start after it runs in a cgroup of
/// its own; nothing is left after.
#[tokio::test]
async fn a_standby_killed_from_outside_or_by_another_jobs_end_costs_no_job_its_cgroup() {
    let Some(a) = agent(Mode::Root, None).await else {
        return;
    };
    let m = marker();
    let limits = |n| JobLimits {
        processes: Some(n),
        ..Default::default()
    };
    let keep =
        a.c.start(&params(&["sh", "-c", "sleep 20; :", &m], limits(5), None))
            .await
            .unwrap();
    let agent_pid = agent_of_job(keep.pid());
    let prefix = format!("executor-{agent_pid}-");
    let all = || -> Vec<PathBuf> {
        own_cgroup_dirs()
            .iter()
            .flat_map(|b| job_dirs_under(b, &prefix))
            .collect()
    };
    let (standby, ahead) = the_standby(&all).await;
    // Another job's end (its cgroup killed whole) leaves the standby be.
    keep.signal(executor_protocol::types::process::SignalName::Kill)
        .await
        .unwrap();
    assert!(none_left(&m).await.is_empty());
    let keep_gone = jobs_only(&all).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        alive(standby),
        "the standby {standby} outlived another job's end"
    );
    let (still, still_in) = the_standby(&all).await;
    assert_eq!((still, still_in.as_str()), (standby, ahead.as_str()));
    // Killed from outside: replaced; the next start runs in the cgroup
    // made ahead all the same, with its limit, alone.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(standby as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(wait_dead(standby, Duration::from_secs(5)).await);
    let script = "p=$(grep ':pids:' /proc/self/cgroup | cut -d: -f3); \
                  echo $p; cat /sys/fs/cgroup/pids$p/pids.max; \
                  wc -w < /sys/fs/cgroup/pids$p/cgroup.procs";
    let (st, out, _) = run(&a.c, &params(&["sh", "-c", script], limits(7), None))
        .await
        .unwrap();
    assert_eq!(st.code, Some(0), "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].ends_with(&format!("/{ahead}")),
        "the job runs in the cgroup made ahead ({ahead}): {out}"
    );
    assert_eq!(lines[1], "8", "7 and its supervisor: {out}");
    // sh, its command substitution's or wc's process, and the supervisor:
    // nothing else (no dead standby's replacement, no other job).
    let n: u32 = lines[2].trim().parse().unwrap();
    assert!((2..=3).contains(&n), "processes in the job's cgroup: {out}");
    // A new standby waits in a new cgroup made ahead; the next start runs
    // there.
    let (again, next) = the_standby(&all).await;
    assert_ne!(again, standby);
    assert_ne!(next, ahead);
    let (st, out, _) = run(&a.c, &params(&["sh", "-c", script], limits(5), None))
        .await
        .unwrap();
    assert_eq!(st.code, Some(0), "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].ends_with(&format!("/{next}")), "{next}: {out}");
    assert_eq!(lines[1], "6", "{out}");
    // Nothing of any job is left.
    let mut left = Vec::new();
    for _ in 0..250 {
        left = jobs_only(&all).await;
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(left.is_empty(), "left: {left:?} (before: {keep_gone:?})");
}

/// An agent that exits right after a start (the next job's cgroup being
/// made ahead on a blocking thread) leaves no directory of its own in any
/// hierarchy and no standby supervisor or spawner behind: its exit ends
/// the cgroup made ahead with the standby in it.
#[tokio::test]
async fn an_agents_exit_right_after_a_start_leaves_no_cgroup_and_no_standby() {
    for _ in 0..3 {
        let Some(a) = agent(Mode::Root, None).await else {
            return;
        };
        let m = marker();
        let first =
            a.c.start(&params(
                &["sh", "-c", "sleep 1; :", &m],
                JobLimits::default(),
                None,
            ))
            .await
            .unwrap();
        let agent_pid = agent_of_job(first.pid());
        let prefix = format!("executor-{agent_pid}-");
        let all = || -> Vec<PathBuf> {
            own_cgroup_dirs()
                .iter()
                .flat_map(|b| job_dirs_under(b, &prefix))
                .collect()
        };
        let (standby, _) = the_standby(&all).await;
        let spawner = parent_pid(standby);
        // The exit comes while the refill after this start is under way.
        let last =
            a.c.start(&params(
                &["sh", "-c", "exit 0", &m],
                JobLimits::default(),
                None,
            ))
            .await
            .unwrap();
        drop(last);
        drop(first);
        let own: Vec<PathBuf> = own_cgroup_dirs()
            .into_iter()
            .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&prefix))
            })
            .collect();
        assert!(!own.is_empty(), "the agent's own directories");
        let Agent { c, _delegation } = a;
        c.close().await.unwrap();
        assert!(wait_dead(agent_pid, Duration::from_secs(10)).await);
        assert!(none_left(&m).await.is_empty());
        for p in [standby, spawner] {
            assert!(wait_dead(p, Duration::from_secs(5)).await, "{p} left");
        }
        let mut left = own.clone();
        for _ in 0..100 {
            left.retain(|d| d.exists());
            if left.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let procs: Vec<String> = left
            .iter()
            .flat_map(|d| {
                std::fs::read_dir(d)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| {
                        format!(
                            "{}: {:?}",
                            e.path().display(),
                            std::fs::read_to_string(e.path().join("cgroup.procs"))
                        )
                    })
            })
            .collect();
        assert!(left.is_empty(), "left: {left:?} {procs:?}");
    }
}

/// Adversarial pass: on a host of v1 hierarchies only where the agent has
/// the cpu hierarchy (alone, or with cpuacct) and neither memory nor pids
/// (covered here by tmpfs mounts, as the unified hierarchy), a job without
/// a CPU quota is still in a cgroup its end kills: with its supervisor
/// (the child subreaper) SIGKILLed, a detached grandchild still ends with
/// the job. It once did not: such a job joined no cpu cgroup (the cpu
/// hierarchy is joined only for a quota) while the end listed the job's
/// members in the cpu hierarchy (the first v1 one) and found none; with
/// cpu alone the job joined no cgroup at all. Under a real-time policy
/// (`chrt -f`: the standby cannot join a v1 cpu cgroup) every supervisor
/// is outside the job's cpu cgroup, as a fresh one is for starts at once.
/// Positive control: with a quota (the job joins the cpu hierarchy) too.
#[tokio::test]
async fn a_job_without_a_quota_ends_whole_where_cpu_is_the_first_v1_hierarchy() {
    if current_uid() != 0 {
        prerequisite_missing("root, to cover cgroup hierarchies in a mount namespace");
        return;
    }
    if !std::path::Path::new("/sys/fs/cgroup/unified/cgroup.procs").exists()
        || !std::path::Path::new("/sys/fs/cgroup/cpu/cgroup.procs").exists()
    {
        prerequisite_missing("a hybrid host with a v1 cpu hierarchy at /sys/fs/cgroup/cpu");
        return;
    }
    for (covered, realtime) in [
        ("unified memory pids cpuacct", false),
        ("unified memory pids", true),
    ] {
        let mounts: String = covered
            .split(' ')
            .map(|h| format!("mount -t tmpfs none /sys/fs/cgroup/{h} && "))
            .collect();
        let mut c = tokio::process::Command::new(if realtime { "chrt" } else { "unshare" });
        if realtime {
            c.args(["-f", "1", "unshare"]);
        }
        c.args(["-m", "--propagation", "private", "sh", "-c"])
            .arg(format!("{mounts}exec \"$0\" \"$@\""))
            .arg(executor_bin());
        let c = Client::spawn(c, ClientOptions::default())
            .await
            .expect("agent");
        let mech = mechanisms(&c).await;
        assert!(
            mech.contains(&"cgroup_v1".to_string()) && !mech.contains(&"cgroup_v2".to_string()),
            "{covered}: {mech:?}"
        );
        let quota = JobLimits {
            cpu_millis_per_sec: Some(500),
            ..Default::default()
        };
        let cases = if realtime {
            vec![JobLimits::default()]
        } else {
            vec![JobLimits::default(), quota]
        };
        for limits in cases {
            detached_job_ends_with_its_killed_supervisor(
                &c,
                limits,
                &format!("{covered}, {limits:?}"),
            )
            .await;
        }
        c.close().await.unwrap();
    }
}
