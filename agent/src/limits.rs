//! A job's resource limits (docs/PROTOCOL.md §3.1): resolved from the
//! request, the profile's (defaults a request may only narrow) and the
//! agent's defaults; enforced by a cgroup per job
//! ([`executor_sandbox::cgroup`]) where the agent has one, else by rlimits
//! where they can stand in, else refused (`required`) or reported in
//! `limits_degraded`. At the job's end its cgroup is killed whole, its
//! account read, and its directories removed.
//!
//! Uses the sandbox crate's cgroup module and the protocol's types; the
//! process module calls it around a start and at a job's end.

use executor_protocol::types::process::{JobLimits, JobUsage, LimitHit};
use executor_protocol::{ErrorCode, WireError};
use executor_sandbox::cgroup::{Cgroups, Controller, JobCgroup, Limits, Procs};
use executor_sandbox::spec::Rlimits;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

static CGROUPS: OnceLock<Cgroups> = OnceLock::new();

/// Find and prepare this agent's cgroups (sweeping what dead agents left).
/// Call it single-threaded, before the spawner starts (see
/// [`Cgroups::setup`]).
pub fn setup() {
    let cg = CGROUPS.get_or_init(Cgroups::setup);
    for n in &cg.notes {
        tracing::info!(note = %n, "a cgroup hierarchy is not used for jobs");
    }
}

/// The soft `RLIMIT_NOFILE` this agent was started with, where it raised
/// its own (its jobs get this one back).
static JOBS_OPEN_FILES: OnceLock<u64> = OnceLock::new();

/// Raise this agent's soft `RLIMIT_NOFILE` to its hard limit: every
/// running job holds a few of the agent's descriptors (its pipes, its
/// pidfd, its cgroup's), and under the soft 1024 a login usually gets
/// the agent would refuse jobs at a few hundred. `started_with` (a
/// session host's: the stdio agent's original, passed on) is what the
/// jobs get back, else the limit as found. The jobs' programs get it
/// back just before their exec ([`jobs_open_files`]), so that a program
/// using `select` sees what it would have seen without the agent.
pub fn raise_open_files(started_with: Option<u64>) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource, RLIM_INFINITY};
    let r = Resource::RLIMIT_NOFILE;
    let Ok((soft, hard)) = getrlimit(r) else {
        return;
    };
    let original = started_with.unwrap_or(soft).min(soft);
    // The kernel refuses more than `fs.nr_open`, even under an infinite
    // hard limit.
    let ceiling = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(1 << 20);
    let target = if hard == RLIM_INFINITY {
        ceiling
    } else {
        hard.min(ceiling)
    };
    if target > soft {
        if let Err(e) = setrlimit(r, target, hard) {
            tracing::debug!(error = %e, soft, hard, "cannot raise the agent's open files limit");
            return;
        }
        tracing::debug!(
            from = soft,
            to = target,
            "the agent's open files limit raised"
        );
    }
    if target > original {
        let _ = JOBS_OPEN_FILES.set(original);
    }
}

/// The soft `RLIMIT_NOFILE` a job's program gets, where the agent raised
/// its own ([`raise_open_files`]).
pub fn jobs_open_files() -> Option<u64> {
    JOBS_OPEN_FILES.get().copied()
}

/// Removes this agent's own cgroup directories when dropped (at the end of
/// `main`).
#[derive(Debug)]
pub struct Teardown;

impl Drop for Teardown {
    fn drop(&mut self) {
        // The cgroup made ahead holds the standby supervisor: ended (killed
        // and removed) before this agent's own directories can go.
        if let Some(a) = ahead().take() {
            drop(a.procs);
            let _ = a.cgroup.end();
        }
        if let Some(cg) = CGROUPS.get() {
            cg.remove_own();
        }
    }
}

fn cgroups() -> &'static Cgroups {
    CGROUPS.get_or_init(Cgroups::default)
}

/// `initialize.sandbox.mechanisms` entries: the cgroup hierarchies in use,
/// and `rlimit` (the fallback, always there).
pub fn mechanisms() -> Vec<String> {
    let mut m: Vec<String> = cgroups()
        .mechanisms()
        .into_iter()
        .map(str::to_owned)
        .collect();
    m.push("rlimit".into());
    m
}

/// Smallest values a request may give: below them nothing runs at all
/// (a process needs a few MiB; the CPU quota's granularity is 1 ms per
/// 100 ms period).
const MIN_MEMORY_BYTES: u64 = 4 << 20;
const MIN_CPU_MILLIS: u64 = 10;
const MIN_TMP_BYTES: u64 = 1 << 20;
/// 1 PiB: far above any host's memory, well inside what tmpfs's `size=`
/// parses.
const MAX_TMP_BYTES: u64 = 1 << 50;
/// The largest CPU share a request may give: a million cores. Far past any
/// host, and within what the kernel takes as a quota (`cpu.max`,
/// `cpu.cfs_quota_us` refuse more than 2^44 - 1 µs per period).
const MAX_CPU_MILLIS: u64 = 1_000_000_000;
/// The most processes a request may give: the kernel's own ceiling on
/// pids (`PID_MAX_LIMIT`); `pids.max` refuses more.
const MAX_PROCESSES: u64 = 4 << 20;

/// A job's limits once resolved, and whether each came from the request
/// or profile (enforced or refused) or from the agent's defaults (enforced
/// where possible, else reported).
#[derive(Debug, Clone, Copy, Default)]
pub struct Resolved {
    pub limits: Limits,
    /// A sandboxed job's `:tmp` size (a tmpfs: enforced wherever `:tmp`
    /// is, with or without a cgroup).
    pub tmp_bytes: Option<u64>,
    /// Per field (memory, processes, cpu): asked for by the request or the
    /// profile.
    asked: [bool; 3],
    required: bool,
}

/// Resolve a request's `limits` (field `param`) against the profile's and
/// the agent's defaults. A request value above the profile's is refused
/// (`policy_denied` naming the field); a bad value is `invalid_params`.
pub fn resolve(
    request: Option<&JobLimits>,
    profile: &JobLimits,
    configured: &JobLimits,
    profile_name: Option<&str>,
    param: &str,
) -> Result<Resolved, WireError> {
    let req = request.copied().unwrap_or_default();
    let who = profile_name.unwrap_or("(default)");
    // `cap`: the limit in force (the file's, else the built-in default),
    // the most a request may ask. `set`: the file set it: a cap that is
    // required; the built-in default is a cap too, but one a host without
    // the means to enforce it reports instead of refusing.
    let field = |name: &str,
                 asked: Option<u64>,
                 cap: Option<u64>,
                 set: Option<u64>,
                 min: u64,
                 max: u64|
     -> Result<(Option<u64>, bool), WireError> {
        if let Some(v) = asked {
            if v < min {
                return Err(WireError::invalid_params(
                    &format!("{param}.{name}"),
                    format!("{param}.{name} is {v}; the least this agent runs a job with is {min}"),
                ));
            }
            if v > max {
                return Err(WireError::invalid_params(
                    &format!("{param}.{name}"),
                    format!("{param}.{name} is {v}; the most a job's limit can be is {max}"),
                ));
            }
            if let Some(c) = cap.filter(|c| v > *c) {
                return Err(WireError::new(
                    ErrorCode::PolicyDenied,
                    format!("{param}.{name} is {v}, above profile {who}'s limits.{name} of {c}; a request may only narrow it"),
                )
                .with("field", format!("{param}.{name}")));
            }
            return Ok((Some(v), true));
        }
        Ok(match set {
            Some(c) => (Some(c), true),
            None => (cap, false),
        })
    };
    let (memory_bytes, m) = field(
        "memory_bytes",
        req.memory_bytes,
        profile.memory_bytes,
        configured.memory_bytes,
        MIN_MEMORY_BYTES,
        u64::MAX,
    )?;
    let (processes, p) = field(
        "processes",
        req.processes,
        profile.processes,
        configured.processes,
        1,
        MAX_PROCESSES,
    )?;
    let (cpu_millis_per_sec, c) = field(
        "cpu_millis_per_sec",
        req.cpu_millis_per_sec,
        profile.cpu_millis_per_sec,
        configured.cpu_millis_per_sec,
        MIN_CPU_MILLIS,
        MAX_CPU_MILLIS,
    )?;
    let (tmp_bytes, _) = field(
        "tmp_bytes",
        req.tmp_bytes,
        profile.tmp_bytes,
        configured.tmp_bytes,
        MIN_TMP_BYTES,
        MAX_TMP_BYTES,
    )?;
    Ok(Resolved {
        limits: Limits {
            memory_bytes,
            processes,
            cpu_millis_per_sec,
        },
        tmp_bytes,
        asked: [m, p, c],
        required: req.required.unwrap_or(true),
    })
}

/// What a start needs of its limits: the job's cgroup to make (at the
/// start, [`job_cgroup`]), the rlimits standing in where there is no
/// cgroup, and what is not enforced.
#[derive(Debug, Default)]
pub struct Prepared {
    pub cgroup: Option<CgroupPlan>,
    pub rlimits: Rlimits,
    pub degraded: Option<Vec<String>>,
}

/// The cgroup a job gets: its limits, and the agent's processes in it
/// (its supervisor, and an init when sandboxed) that its `processes`
/// limit and account leave out.
#[derive(Debug, Clone, Copy)]
pub struct CgroupPlan {
    pub limits: Limits,
    pub overhead: u64,
}

/// Resolve how `r` is enforced here: by a cgroup (made at the start), by
/// rlimits standing in, or refused (`required`) or reported as degraded.
/// `sandboxed`: the job has its own user namespace (where `RLIMIT_NPROC`
/// counts it alone) and an init (one more process of its own).
pub fn prepare(r: &Resolved, sandboxed: bool, param: &str) -> Result<Prepared, WireError> {
    let cg = cgroups();
    let mut out = Prepared::default();
    if cg.usable() {
        out.cgroup = Some(CgroupPlan {
            limits: r.limits,
            overhead: 1 + u64::from(sandboxed),
        });
    }
    let mut degraded = Vec::new();
    let mut refused = None;
    let mut short = |i: usize, name: &str, why: String| {
        let asked = r.asked[i];
        if asked && r.required && refused.is_none() {
            refused = Some(format!("{param}.{name}: {why}"));
        }
        let origin = if asked { "" } else { " (the agent's default)" };
        degraded.push(format!("{param}.{name}{origin}: {why}"));
    };
    if let Some(m) = r.limits.memory_bytes {
        if !cg.has(Controller::Memory) {
            out.rlimits.address_space = Some(m);
            short(
                0,
                "memory_bytes",
                "no memory cgroup here: each process's address space is bounded (RLIMIT_AS), not the job's total".into(),
            );
        }
    }
    if let Some(n) = r.limits.processes {
        if !cg.has(Controller::Pids) {
            if sandboxed {
                // Counted in the job's own user namespace: the job alone.
                out.rlimits.processes = Some(n);
            } else {
                short(
                    1,
                    "processes",
                    "no pids cgroup here, and an unsandboxed job shares its user's process count"
                        .into(),
                );
            }
        }
    }
    if r.limits.cpu_millis_per_sec.is_some() && !cg.has(Controller::Cpu) {
        short(2, "cpu_millis_per_sec", "no cpu cgroup here".into());
    }
    if let Some(why) = refused {
        return Err(WireError::new(
            ErrorCode::SandboxUnavailable,
            format!("{why}; nothing was run (limits.required: false runs it with what this host enforces)"),
        ));
    }
    out.degraded = (!degraded.is_empty()).then_some(degraded);
    Ok(out)
}

/// Job cgroups made by this agent (their directories' names).
static JOBS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A job's cgroup made ahead (no limits yet), with its `cgroup.procs`
/// open; the spawner's standby supervisor was offered it before it was
/// put here, so no start can ask for it before the standby has it.
#[derive(Debug)]
struct Ahead {
    cgroup: JobCgroup,
    procs: Vec<Procs>,
}

static AHEAD: Mutex<Option<Ahead>> = Mutex::new(None);
/// A refill is under way.
static REFILLING: AtomicBool = AtomicBool::new(false);

fn ahead() -> std::sync::MutexGuard<'static, Option<Ahead>> {
    AHEAD.lock().unwrap_or_else(|p| p.into_inner())
}

fn new_job(cg: &Cgroups) -> std::io::Result<(JobCgroup, Vec<Procs>)> {
    let n = JOBS.fetch_add(1, Ordering::Relaxed);
    let job = cg.make_job(&format!("job-{n}"))?;
    let procs = job.procs()?;
    Ok((job, procs))
}

/// The job's cgroup, its limits written, and its `cgroup.procs` for the
/// supervisor: the one made ahead (which the standby supervisor has
/// likely joined already: the start then costs no migration), else a new
/// one. Called right before the spawner is asked (nothing between can
/// fail and drop it: a cgroup the standby joined is never killed for a
/// start that did not happen); [`refill`] once the job runs.
pub fn job_cgroup(plan: &CgroupPlan) -> Result<(Arc<JobCgroup>, Vec<OwnedFd>), WireError> {
    let io = |what: &str, e: std::io::Error| {
        WireError::new(
            ErrorCode::Io,
            format!("cannot {what} the job's cgroup: {e}; nothing was run"),
        )
    };
    let taken = ahead().take();
    let from_ahead = taken.is_some();
    let (mut job, procs) = match taken {
        Some(a) => (a.cgroup, a.procs),
        None => new_job(cgroups()).map_err(|e| io("make", e))?,
    };
    if let Err(e) = job.set_limits(&plan.limits, plan.overhead) {
        // Back where it was, unlimited again, rather than killed: the
        // standby in it may be handed another start's job any moment.
        if from_ahead && job.clear_limits().is_ok() {
            let mut slot = ahead();
            if slot.is_none() {
                *slot = Some(Ahead { cgroup: job, procs });
            }
        }
        return Err(io("limit", e));
    }
    // The cpu hierarchy only for a quota: a job without one stays in the
    // cpu cgroup its supervisor is in (unlimited: the one made ahead, or
    // the agent's).
    let quota = plan.limits.cpu_millis_per_sec.is_some();
    let procs = procs
        .into_iter()
        .filter(|p| quota || !p.cpu_only)
        .map(|p| p.fd)
        .collect();
    Ok((Arc::new(job), procs))
}

/// Make the next job's cgroup ahead, on a blocking thread (no-op while one
/// waits or is being made): `offer` gives it to the spawner's standby
/// first (the process module's, passed in: limits is the lowest layer),
/// then it is put where [`job_cgroup`] takes it.
pub fn refill(offer: fn(&[&OwnedFd])) {
    let cg = cgroups();
    if !cg.usable() || REFILLING.swap(true, Ordering::AcqRel) {
        return;
    }
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        REFILLING.store(false, Ordering::Release);
        return;
    };
    rt.spawn_blocking(move || {
        if ahead().is_none() {
            match new_job(cg) {
                Ok((cgroup, procs)) => {
                    let mut slot = ahead();
                    // Offered under the lock: no start takes it before the
                    // offer is queued on the spawner's socket, ahead of
                    // that start's fork request.
                    if slot.is_none() {
                        let fds: Vec<&OwnedFd> = procs.iter().map(|p| &p.fd).collect();
                        offer(&fds);
                        *slot = Some(Ahead { cgroup, procs });
                    }
                }
                Err(e) => tracing::debug!(error = %e, "cannot make the next job's cgroup ahead"),
            }
        }
        REFILLING.store(false, Ordering::Release);
    });
}

/// The protocol's view of an account.
pub fn usage_of(u: &executor_sandbox::cgroup::Usage) -> JobUsage {
    JobUsage {
        cpu_user_us: u.cpu_user_us,
        cpu_system_us: u.cpu_system_us,
        peak_memory_bytes: u.peak_memory_bytes,
        processes_peak: u.processes_peak,
        memory_bytes: None,
        processes: None,
    }
}

/// A running job's account for `process/list`.
pub fn current(cg: &JobCgroup) -> JobUsage {
    let u = cg.current();
    JobUsage {
        memory_bytes: u.memory_bytes,
        processes: u.processes,
        ..usage_of(&u)
    }
}

/// At a job's end, its account (a few small cgroupfs reads), after
/// SIGKILL to whatever of the job is left in its cgroup when `kill`
/// (blocking then: on a blocking thread). The limit it hit: memory for an
/// OOM kill, processes for a fork refused at the limit.
pub fn account(cg: &JobCgroup, kill: bool) -> (JobUsage, Option<LimitHit>) {
    if kill {
        if let Err(e) = cg.kill_now() {
            tracing::warn!(error = %e, "cannot signal what is left of the job's cgroup");
        }
    }
    let u = cg.usage();
    let hit = if u.oom_killed {
        Some(LimitHit::Memory)
    } else if u.processes_limited {
        Some(LimitHit::Processes)
    } else {
        None
    };
    (usage_of(&u), hit)
}

/// Then (blocking, after the exit was reported): wait until nothing of the
/// job is left in its cgroup (killing again what is), and remove it.
pub fn finish(id: &str, cg: &JobCgroup) {
    if let Err(e) = cg.end() {
        tracing::warn!(process_id = id, error = %e, "cannot end the job's cgroup whole; the next agent start sweeps it");
    }
}
