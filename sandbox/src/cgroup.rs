//! A cgroup per job: its limits (memory, processes, CPU), its account
//! (CPU time, peak memory, peak processes, which limit it hit) and its end
//! (every process in it killed, whoever its parent).
//!
//! The agent finds its own cgroup in each hierarchy ([`locate`], from
//! `/proc/self/mountinfo` and `/proc/self/cgroup`): the unified (v2)
//! hierarchy, and the v1 hierarchies of the `memory`, `pids`, `cpu` and
//! `cpuacct` controllers where a hybrid host still mounts them. Where its
//! cgroup is writable (root, or a subtree delegated to its user) it makes
//! a directory of its own there, `executor-PID-START` (its pid and start
//! time, and locked with `flock` for its life, so that [`Cgroups::setup`]
//! at the next start can tell a dead agent's directory from a live one's,
//! in its PID namespace or another, and sweep it), and one directory per
//! job below it. An unprivileged agent whose own v2 cgroup is not writable
//! (a login session's scope) asks the user's systemd for a scope of its
//! own with `Delegate=yes` ([`systemd`]) and uses that; a dead agent's
//! scope is swept as its directories are.
//! A controller found in neither hierarchy is not enforced
//! here (the agent falls back to rlimits and says so). The agent never
//! writes its own cgroup's limits, only its children's; on v2 it may move
//! itself into a leaf of its own cgroup so that controllers can be enabled
//! for its children (the "no internal processes" rule), as rootless
//! container runtimes do.
//!
//! The job's supervisor joins the job's cgroups before anything of the job
//! runs, by writing `0` into the `cgroup.procs` descriptors the agent
//! opened ([`JobCgroup::procs`]); everything the job forks inherits them.
//! The agent makes the next job's cgroup ahead ([`Cgroups::make_job`],
//! every hierarchy, no limits) for the spawner's standby supervisor to
//! join while it waits, and writes the job's limits into it at the start
//! ([`JobCgroup::set_limits`]).
//! At the job's end the agent kills what is left ([`JobCgroup::kill`]:
//! `cgroup.kill` on v2, else the processes listed, their `pids.max` set to
//! 0 first so that none is added meanwhile), reads the account and removes
//! the directories.
//!
//! Plain file operations on cgroupfs: no `unsafe`. Depends on `libc`/`nix`
//! and [`executor_sys`] (pidfds).

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The controllers a job's limits and account use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Controller {
    Memory,
    Pids,
    Cpu,
    /// v1 only: the CPU account (on v2 `cpu.stat` is always there).
    Cpuacct,
}

impl Controller {
    pub fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Cpu => "cpu",
            Controller::Cpuacct => "cpuacct",
        }
    }

    const ALL: [Controller; 4] = [
        Controller::Memory,
        Controller::Pids,
        Controller::Cpu,
        Controller::Cpuacct,
    ];
}

/// One line of `/proc/self/mountinfo` that mounts a cgroup hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    /// The hierarchy's directory shown at the mount point.
    pub root: String,
    pub mount_point: PathBuf,
    /// `None`: the unified (v2) hierarchy; else the v1 hierarchy's
    /// controllers (and `name=` entries).
    pub v1: Option<Vec<String>>,
}

/// The controllers a v1 mount's options can name (the rest of its
/// options, as `clone_children` or `release_agent=`, are not controllers).
const V1_CONTROLLERS: [&str; 14] = [
    "cpu",
    "cpuacct",
    "cpuset",
    "memory",
    "devices",
    "freezer",
    "net_cls",
    "net_prio",
    "blkio",
    "perf_event",
    "hugetlb",
    "pids",
    "rdma",
    "misc",
];

/// Unescape mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let digits = std::str::from_utf8(&b[i + 1..i + 4]).ok();
            if let Some(v) = digits.and_then(|d| u8::from_str_radix(d, 8).ok()) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup mounts of a `/proc/self/mountinfo` text.
pub fn parse_mountinfo(text: &str) -> Vec<CgroupMount> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let pre: Vec<&str> = pre.split(' ').collect();
        let post: Vec<&str> = post.split(' ').collect();
        if pre.len() < 5 || post.len() < 3 {
            continue;
        }
        let (root, mount_point) = (unescape(pre[3]), PathBuf::from(unescape(pre[4])));
        match post[0] {
            "cgroup2" => out.push(CgroupMount {
                root,
                mount_point,
                v1: None,
            }),
            "cgroup" => {
                let ctl = post[2]
                    .split(',')
                    .filter(|o| V1_CONTROLLERS.contains(o) || o.starts_with("name="))
                    .map(str::to_owned)
                    .collect();
                out.push(CgroupMount {
                    root,
                    mount_point,
                    v1: Some(ctl),
                })
            }
            _ => {}
        }
    }
    out
}

/// One line of `/proc/self/cgroup`: the controllers (empty for v2) and the
/// process's path in that hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    pub controllers: Vec<String>,
    pub path: String,
    pub unified: bool,
}

/// The lines of a `/proc/self/cgroup` text.
pub fn parse_proc_cgroup(text: &str) -> Vec<Membership> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ':');
            let (id, ctl, path) = (it.next()?, it.next()?, it.next()?);
            Some(Membership {
                controllers: ctl
                    .split(',')
                    .filter(|c| !c.is_empty())
                    .map(str::to_owned)
                    .collect(),
                path: path.to_owned(),
                unified: id == "0" && ctl.is_empty(),
            })
        })
        .collect()
}

/// Where this process's cgroup directories are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Located {
    /// Its directory in the unified hierarchy.
    pub v2: Option<PathBuf>,
    /// Its directory in the v1 hierarchy of each controller (two
    /// controllers may share one, as `cpu,cpuacct`).
    pub v1: BTreeMap<Controller, PathBuf>,
}

/// The directory of `path` (a process's path in a hierarchy) under a mount
/// of that hierarchy whose root is `root`; `None` when the mount does not
/// show it (a container's mount of another subtree).
fn under_mount(m: &CgroupMount, path: &str) -> Option<PathBuf> {
    let rel = if m.root == "/" {
        path.strip_prefix('/')?
    } else {
        let rest = path.strip_prefix(m.root.as_str())?;
        if !(rest.is_empty() || rest.starts_with('/')) {
            return None;
        }
        rest.trim_start_matches('/')
    };
    if rel.split('/').any(|c| c == "..") {
        return None;
    }
    Some(if rel.is_empty() {
        m.mount_point.clone()
    } else {
        m.mount_point.join(rel)
    })
}

/// Pair the mounts with the process's memberships.
pub fn locate(mounts: &[CgroupMount], member: &[Membership]) -> Located {
    let mut out = Located::default();
    for m in mounts {
        match &m.v1 {
            None => {
                if out.v2.is_some() {
                    continue;
                }
                if let Some(me) = member.iter().find(|x| x.unified) {
                    out.v2 = under_mount(m, &me.path);
                }
            }
            Some(ctl) => {
                let mut mine: Vec<&String> = ctl.iter().collect();
                mine.sort();
                let Some(me) = member.iter().find(|x| {
                    let mut c: Vec<&String> = x.controllers.iter().collect();
                    c.sort();
                    !x.unified && c == mine
                }) else {
                    continue;
                };
                let Some(dir) = under_mount(m, &me.path) else {
                    continue;
                };
                for c in Controller::ALL {
                    if ctl.iter().any(|x| x == c.name()) {
                        out.v1.entry(c).or_insert_with(|| dir.clone());
                    }
                }
            }
        }
    }
    out
}

/// What the agent's probe found: the directories its jobs' cgroups go in.
#[derive(Debug, Clone, Default)]
pub struct Cgroups {
    /// The agent's own directory in the unified hierarchy, and the
    /// controllers enabled for its children there.
    v2: Option<(PathBuf, Vec<Controller>)>,
    /// The agent's own directory in each v1 hierarchy it uses (only for
    /// controllers v2 does not give).
    v1: BTreeMap<Controller, PathBuf>,
    /// Why a hierarchy is not used (for the agent's log).
    pub notes: Vec<String>,
}

mod systemd;

/// Where this process's cgroups are now.
fn locate_self() -> Located {
    let read = |p| fs::read_to_string(p).unwrap_or_default();
    locate(
        &parse_mountinfo(&read("/proc/self/mountinfo")),
        &parse_proc_cgroup(&read("/proc/self/cgroup")),
    )
}

/// Whether to ask the user's systemd for a scope: not root, and the
/// agent's own v2 cgroup (a cgroup2 directory) is not writable, as a
/// login session's scope is not.
fn wants_a_scope(own: &Path) -> bool {
    !nix::unistd::geteuid().is_root()
        && nix::sys::statfs::statfs(own)
            .is_ok_and(|st| st.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
        && nix::unistd::access(own, nix::unistd::AccessFlags::W_OK).is_err()
}

/// Ask the user's systemd (its private socket under `$XDG_RUNTIME_DIR`,
/// else `/run/user/UID`) for the scope `executor-PID-START.scope` holding
/// this process, delegated; wait (2 s at most) until `/proc/self/cgroup`
/// shows the move, and return the scope's v2 directory.
fn join_user_scope() -> io::Result<PathBuf> {
    let euid = nix::unistd::geteuid();
    let runtime = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .unwrap_or_else(|| PathBuf::from(format!("/run/user/{euid}")));
    // This user's own directory, as the manager makes it: not a link,
    // nobody else may write in it.
    let st = fs::symlink_metadata(&runtime)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", runtime.display())))?;
    {
        use std::os::unix::fs::MetadataExt;
        if !st.is_dir() || st.uid() != euid.as_raw() || st.mode() & 0o022 != 0 {
            return Err(io::Error::other(format!(
                "{}: not a directory of uid {euid} that only it may write (uid {}, mode {:o})",
                runtime.display(),
                st.uid(),
                st.mode() & 0o7777
            )));
        }
    }
    let socket = runtime.join("systemd/private");
    let unit = format!("{}.scope", agent_dir_name());
    systemd::start_scope(&socket, &unit, Duration::from_secs(2))
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", socket.display())))?;
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        if let Some(d) = locate_self()
            .v2
            .filter(|d| d.file_name() == Some(unit.as_ref()))
        {
            return Ok(d);
        }
        if Instant::now() > deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the manager took {unit} but did not move this process into it within 2 s"),
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A process's start time in clock ticks since boot (field 22 of
/// `/proc/PID/stat`), `None` if it is gone or a zombie (dead, not yet
/// reaped by its parent).
fn start_time(pid: i32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command (field 2) may hold spaces and parentheses: after the last ')'.
    let rest = &s[s.rfind(')')? + 2..];
    let mut fields = rest.split(' ');
    if matches!(fields.next(), Some("Z" | "X")) {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// The name of this agent's own directory in each hierarchy.
fn agent_dir_name() -> String {
    let pid = std::process::id() as i32;
    format!("executor-{pid}-{}", start_time(pid).unwrap_or(0))
}

/// Whether the `executor-PID-START` directory `dir` (named `name`, or
/// `executor-PID-START.scope`) belongs to a live agent: its pid runs with that start time, or (an
/// agent of another PID namespace, whose pid means another process here)
/// it holds the directory's lock ([`hold`]).
fn owner_alive(dir: &Path, name: &str) -> bool {
    // A scope the user's systemd made for an agent is named after it.
    let name = name.strip_suffix(".scope").unwrap_or(name);
    let Some(rest) = name.strip_prefix("executor-") else {
        return true;
    };
    let Some((pid, start)) = rest.split_once('-') else {
        return true;
    };
    let (Ok(pid), Ok(start)) = (pid.parse::<i32>(), start.parse::<u64>()) else {
        return true;
    };
    if start_time(pid) == Some(start) {
        return true;
    }
    // Unlocked: dead (a lock goes with its holder's last descriptor).
    // Unopenable: not known to be dead.
    let Ok(f) = fs::File::open(dir) else {
        return true;
    };
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockSharedNonblock).is_err()
}

/// This agent's locks on its own directories (held for its life).
static HELD: std::sync::Mutex<Vec<nix::fcntl::Flock<fs::File>>> = std::sync::Mutex::new(Vec::new());

/// Lock this agent's own directory `dir` for its life: another agent's
/// sweep then knows it alive whatever PID namespace either runs in.
fn hold(dir: &Path) {
    // Only this user may open it (and so lock it): no other user's
    // process can hold its lock to make it look alive, or to delay this
    // (others may still pass through it: 0711).
    let _ = fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o711));
    let locked = fs::File::open(dir).and_then(|f| {
        // Another agent's sweep may hold a shared lock on it for the
        // moment of its check (it never keeps one): retried for 1 s, never
        // waited on without bound.
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut f = f;
        loop {
            match nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock) {
                Ok(l) => return Ok(l),
                Err((back, nix::errno::Errno::EWOULDBLOCK)) if Instant::now() < deadline => {
                    f = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err((_, e)) => return Err(io::Error::from(e)),
            }
        }
    });
    match locked {
        Ok(l) => HELD.lock().unwrap_or_else(|p| p.into_inner()).push(l),
        Err(e) => {
            tracing::debug!(dir = %dir.display(), error = %e, "cannot lock the agent's cgroup directory")
        }
    }
}

fn write_file(path: &Path, value: &str) -> io::Result<()> {
    let mut f = fs::OpenOptions::new().write(true).open(path)?;
    f.write_all(value.as_bytes())
}

/// Kill everything in the cgroup directories `dirs` (all of one job) and
/// remove them, deepest first. Bounded: gives up after `within`.
fn kill_and_remove(v2: Option<&Path>, v1: &[&Path], within: Duration) -> io::Result<()> {
    kill_all(v2, v1, within)?;
    let deadline = Instant::now() + within;
    for d in v2.into_iter().chain(v1.iter().copied()) {
        remove_dir_retrying(d, deadline)?;
    }
    Ok(())
}

/// `d` and every cgroup beneath it (a job with write access to its own
/// directory, unsandboxed in a delegated subtree, may make children and
/// move into them), deepest first, `d` last.
fn subtree(d: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![d.to_path_buf()];
    while let Some(dir) = stack.pop() {
        if let Ok(rd) = fs::read_dir(&dir) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
        out.push(dir);
    }
    out.reverse();
    out
}

/// `rmdir` of `d` and the cgroups beneath it, each retried while the last
/// processes are being reaped (`EBUSY`).
fn remove_dir_retrying(d: &Path, deadline: Instant) -> io::Result<()> {
    for dir in subtree(d) {
        remove_one_retrying(&dir, deadline)?;
    }
    Ok(())
}

fn remove_one_retrying(d: &Path, deadline: Instant) -> io::Result<()> {
    loop {
        match fs::remove_dir(d) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", d.display()))),
        }
    }
}

/// The pids listed in a `cgroup.procs`.
fn procs(dir: &Path) -> io::Result<Vec<i32>> {
    Ok(fs::read_to_string(dir.join("cgroup.procs"))?
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect())
}

/// The pids in `dir` and every cgroup beneath it.
fn procs_beneath(dir: &Path) -> io::Result<Vec<i32>> {
    let mut all = procs(dir)?;
    for d in subtree(dir) {
        if d != dir {
            // A child removed meanwhile holds nothing.
            all.extend(procs(&d).unwrap_or_default());
        }
    }
    Ok(all)
}

/// SIGKILL the processes `pids` that are in `listed` (a job's cgroup, or
/// beneath it). A number read from `cgroup.procs` may have exited and been
/// reused by another process by now: each process is named by a pidfd
/// first, and membership read after, so a signal goes to a process that
/// was a member when it was named, never to a later holder of its number.
fn kill_members(listed: &Path, pids: &[i32]) -> io::Result<()> {
    if pids.is_empty() {
        return Ok(());
    }
    // ESRCH: exited already, nothing to kill.
    let named: Vec<(i32, OwnedFd)> = pids
        .iter()
        .filter_map(|&p| executor_sys::pidfd_open(p).ok().map(|fd| (p, fd)))
        .collect();
    let members = procs_beneath(listed)?;
    for (p, fd) in &named {
        if members.contains(p) {
            let _ = executor_sys::pidfd_send_signal(fd.as_fd(), libc::SIGKILL);
        }
    }
    Ok(())
}

/// Kill every process of a job's cgroup: `cgroup.kill` where v2 has it;
/// else, with `pids.max` at 0 (nothing new can fork), SIGKILL whatever is
/// listed until nothing is. Nothing when none is listed (an empty cgroup
/// gains no process but by a migration into it, which only its owner can
/// write; [`JobCgroup::kill_now`] says why the write is avoided).
fn kill_all(v2: Option<&Path>, v1: &[&Path], within: Duration) -> io::Result<()> {
    let Some(listed) = v2.or_else(|| v1.first().copied()) else {
        return Ok(());
    };
    if procs_beneath(listed)?.is_empty() {
        return Ok(());
    }
    if let Some(d) = v2 {
        match write_file(&d.join("cgroup.kill"), "1") {
            Ok(()) => return wait_empty(d, within),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    for d in v1 {
        // Only the pids hierarchy has it; elsewhere the write fails.
        let _ = write_file(&d.join("pids.max"), "0");
    }
    let deadline = Instant::now() + within;
    loop {
        let pids = procs_beneath(listed)?;
        if pids.is_empty() {
            return Ok(());
        }
        kill_members(listed, &pids)?;
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{}: processes left after SIGKILL", listed.display()),
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Wait until a v2 cgroup has no process left.
fn wait_empty(d: &Path, within: Duration) -> io::Result<()> {
    let deadline = Instant::now() + within;
    while !procs_beneath(d)?.is_empty() {
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{}: processes left after cgroup.kill", d.display()),
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// Whether a live agent has its own directory where an agent started by
/// the one whose cgroup this is makes it (a detached session's host,
/// spawned in the agent's scope or its `agent` leaf): `dir/executor-*`,
/// `dir/agent/executor-*` or `dir/*/agent/executor-*`, never inside a
/// job's directory. A dead agent's directory holding one is left to that
/// agent's life (what the dead one left there with it). Only a name that
/// parses, whose pid runs with that start time or which a live agent
/// holds locked, counts ([`owner_known_alive`]).
fn holds_a_live_agent(dir: &Path) -> bool {
    let agents_in = |d: &Path| -> Vec<PathBuf> {
        fs::read_dir(d)
            .map(|r| {
                r.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("executor-"))
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut places = vec![dir.to_path_buf(), dir.join("agent")];
    places.extend(agents_in(dir).into_iter().map(|d| d.join("agent")));
    places.iter().flat_map(|p| agents_in(p)).any(|d| {
        d.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| owner_known_alive(&d, n))
    })
}

/// [`owner_alive`] without its benefit of the doubt: a name that does not
/// parse, or a directory that cannot be opened, is not a live agent's.
fn owner_known_alive(dir: &Path, name: &str) -> bool {
    let name = name.strip_suffix(".scope").unwrap_or(name);
    let Some((pid, start)) = name
        .strip_prefix("executor-")
        .and_then(|rest| rest.split_once('-'))
    else {
        return false;
    };
    let (Ok(pid), Ok(start)) = (pid.parse::<i32>(), start.parse::<u64>()) else {
        return false;
    };
    if start_time(pid) == Some(start) {
        return true;
    }
    fs::File::open(dir).is_ok_and(|f| {
        matches!(
            nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockSharedNonblock),
            Err((_, nix::errno::Errno::EWOULDBLOCK))
        )
    })
}

/// Make one of this agent's own directories: mode 0711, so that other
/// users may pass through to a job's cgroup files (a program that reads
/// its own limits after changing user) but not open it, and so not lock
/// it ([`hold`]).
fn make_own_dir(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new().mode(0o711).create(path)
}

/// Remove what dead agents left in `own` (a directory of this user's, in
/// one hierarchy): their `executor-PID-START` directories and the jobs in
/// them, killing what still runs there. Returns what was removed.
fn sweep(own: &Path, unified: bool) -> Vec<PathBuf> {
    let mut gone = Vec::new();
    let Ok(entries) = fs::read_dir(own) else {
        return gone;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("executor-")
            || owner_alive(&e.path(), &name)
            || holds_a_live_agent(&e.path())
        {
            continue;
        }
        let dir = e.path();
        let jobs: Vec<PathBuf> = fs::read_dir(&dir)
            .map(|r| {
                r.flatten()
                    .filter(|j| j.path().is_dir())
                    .map(|j| j.path())
                    .collect()
            })
            .unwrap_or_default();
        for j in jobs {
            let r = if unified {
                kill_and_remove(Some(&j), &[], Duration::from_secs(2))
            } else {
                kill_and_remove(None, &[&j], Duration::from_secs(2))
            };
            if r.is_ok() {
                gone.push(j);
            }
        }
        if remove_dir_retrying(&dir, Instant::now() + Duration::from_secs(1)).is_ok() {
            gone.push(dir);
        }
    }
    gone
}

impl Cgroups {
    /// Find this agent's cgroups, sweep what dead agents left there, and
    /// make its own directory in each usable hierarchy. Call it while the
    /// process is single-threaded and before the spawner starts (on v2 it
    /// may move this process into a leaf, and the spawner must follow).
    pub fn setup() -> Cgroups {
        let mut located = locate_self();
        let mut notes = Vec::new();
        let mut scope = None;
        if let Some(own) = located.v2.clone().filter(|d| wants_a_scope(d)) {
            match join_user_scope() {
                Ok(dir) => {
                    tracing::info!(scope = %dir.display(), "the user's systemd delegated a scope to this agent");
                    // Locked at once, as the agent's own directories are:
                    // another agent's sweep then knows it live.
                    hold(&dir);
                    located = locate_self();
                    scope = Some(dir);
                }
                Err(e) => notes.push(format!(
                    "cgroup v2 {}: not writable, and no scope from the user's systemd: {e}",
                    own.display()
                )),
            }
        }
        let mut cg = Cgroups::setup_in(located);
        if let Some(dir) = scope {
            // A dead agent's scope (what its jobs left keeps it) is swept
            // by the next agent of the user, beside its own.
            if let Some(parent) = dir.parent() {
                sweep(parent, true);
            }
        }
        cg.notes.extend(notes);
        cg
    }

    fn setup_in(located: Located) -> Cgroups {
        let mut cg = Cgroups::default();
        let name = agent_dir_name();
        // A hierarchy the mount table names may be covered by another
        // mount at its place (a tmpfs over it, as a container may have):
        // its directory must be that kind of cgroup filesystem now.
        let is = |d: &Path, magic: nix::sys::statfs::FsType| {
            nix::sys::statfs::statfs(d).is_ok_and(|st| st.filesystem_type() == magic)
        };
        let mut located = located;
        if let Some(own) = located.v2.take() {
            if is(&own, nix::sys::statfs::CGROUP2_SUPER_MAGIC) {
                located.v2 = Some(own);
            } else {
                cg.notes.push(format!(
                    "cgroup v2 {}: not a cgroup2 filesystem (covered by another mount)",
                    own.display()
                ));
            }
        }
        located.v1.retain(|c, own| {
            let ok = is(own, nix::sys::statfs::CGROUP_SUPER_MAGIC);
            if !ok {
                cg.notes.push(format!(
                    "cgroup v1 {} ({}): not a cgroup filesystem (covered by another mount)",
                    own.display(),
                    c.name()
                ));
            }
            ok
        });
        if let Some(own) = located.v2 {
            match setup_v2(&own, &name) {
                Ok(enabled) => {
                    hold(&own.join(&name));
                    sweep(&own, true);
                    cg.v2 = Some((own.join(&name), enabled));
                }
                Err(e) => cg.notes.push(format!("cgroup v2 {}: {e}", own.display())),
            }
        }
        let on_v2: Vec<Controller> = cg.v2.as_ref().map(|v| v.1.clone()).unwrap_or_default();
        let mut made: BTreeMap<PathBuf, bool> = BTreeMap::new();
        for (c, own) in located.v1 {
            // On v2 `cpu.stat` gives the CPU account: no cpuacct needed.
            let covered = on_v2.contains(&c) || (c == Controller::Cpuacct && cg.v2.is_some());
            if covered {
                continue;
            }
            let ok = *made.entry(own.clone()).or_insert_with(|| {
                sweep(&own, false);
                match make_own_dir(&own.join(&name)) {
                    Ok(()) => {
                        hold(&own.join(&name));
                        true
                    }
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => true,
                    Err(e) => {
                        cg.notes.push(format!("cgroup v1 {}: {e}", own.display()));
                        false
                    }
                }
            });
            if ok {
                cg.v1.insert(c, own.join(&name));
            }
        }
        cg
    }

    /// What `initialize.sandbox.mechanisms` names: `cgroup_v2` (a job's
    /// kill and account, and the controllers enabled there), `cgroup_v1`
    /// (controllers of a hybrid host).
    pub fn mechanisms(&self) -> Vec<&'static str> {
        let mut m = Vec::new();
        if self.v2.is_some() {
            m.push("cgroup_v2");
        }
        if !self.v1.is_empty() {
            m.push("cgroup_v1");
        }
        m
    }

    /// Remove this agent's own directories (at its exit; what jobs left
    /// there keeps them, and the next agent's sweep removes them).
    pub fn remove_own(&self) {
        let dirs = self.v2.iter().map(|v| &v.0).chain(self.v1.values());
        for d in dirs {
            let _ = fs::remove_dir(d);
        }
    }

    /// Whether a controller is enforced by some hierarchy.
    pub fn has(&self, c: Controller) -> bool {
        self.v2.as_ref().is_some_and(|v| v.1.contains(&c)) || self.v1.contains_key(&c)
    }

    /// Whether any hierarchy is usable (the job then ends whole).
    pub fn usable(&self) -> bool {
        self.v2.is_some() || !self.v1.is_empty()
    }

    /// Make job `id`'s cgroup with these limits. `processes` counts the
    /// job's own processes: `overhead` (its supervisor, its init) is added.
    pub fn create_job(&self, id: &str, limits: &Limits, overhead: u64) -> io::Result<JobCgroup> {
        let mut job = self.make_job(id)?;
        match job.set_limits(limits, overhead) {
            Ok(()) => Ok(job),
            Err(e) => {
                let _ = job.end();
                Err(e)
            }
        }
    }

    /// Make job `id`'s cgroup without limits (unlimited, as its parent),
    /// in every hierarchy this agent uses (the cpu one too, which a job
    /// joins only for a quota: [`Procs::cpu_only`]).
    pub fn make_job(&self, id: &str) -> io::Result<JobCgroup> {
        let mut job = JobCgroup {
            v2: None,
            v2_controllers: Vec::new(),
            v1: Vec::new(),
            ended: Default::default(),
            overhead: 0,
            open: Default::default(),
        };
        let result = (|| {
            if let Some((base, enabled)) = &self.v2 {
                let d = base.join(id);
                fs::create_dir(&d)?;
                job.v2 = Some(d);
                job.v2_controllers.clone_from(enabled);
            }
            for (c, base) in &self.v1 {
                let d = base.join(id);
                if !job.v1.iter().any(|(_, p)| *p == d) {
                    fs::create_dir(&d)?;
                }
                if *c == Controller::Cpu {
                    // The quota's period, once here: a quota is then one
                    // write at the start.
                    write_file(&d.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
                }
                job.v1.push((*c, d));
            }
            Ok(())
        })();
        match result {
            Ok(()) => {
                job.open_files();
                Ok(job)
            }
            Err(e) => {
                let _ = job.end();
                Err(e)
            }
        }
    }
}

/// Enable the controllers a job needs for the children of `own` (its own
/// v2 directory) and of this agent's directory `name` under it; if `own`
/// has processes (the no-internal-processes rule refuses), and they are
/// this agent's alone, move this process into `name/agent` first. Returns
/// the controllers enabled (may be none: the v2 cgroup still gives the
/// kill and the CPU account).
fn setup_v2(own: &Path, name: &str) -> io::Result<Vec<Controller>> {
    let mine = own.join(name);
    match make_own_dir(&mine) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let available = fs::read_to_string(own.join("cgroup.controllers")).unwrap_or_default();
    let wanted: Vec<Controller> = [Controller::Memory, Controller::Pids, Controller::Cpu]
        .into_iter()
        .filter(|c| available.split_whitespace().any(|a| a == c.name()))
        .collect();
    if wanted.is_empty() {
        return Ok(wanted);
    }
    let plus: String = wanted.iter().map(|c| format!("+{} ", c.name())).collect();
    let enable = |d: &Path| write_file(&d.join("cgroup.subtree_control"), plus.trim_end());
    if let Err(e) = enable(own) {
        let me = std::process::id() as i32;
        let alone = procs(own).map(|p| p == [me]).unwrap_or(false);
        if e.raw_os_error() != Some(libc::EBUSY) || !alone {
            tracing::debug!(dir = %own.display(), error = %e, "cannot enable controllers for the jobs' cgroups");
            return Ok(Vec::new());
        }
        let leaf = mine.join("agent");
        let _ = fs::create_dir(&leaf);
        write_file(&leaf.join("cgroup.procs"), "0")?;
        if enable(own).is_err() {
            return Ok(Vec::new());
        }
    }
    if enable(&mine).is_err() {
        return Ok(Vec::new());
    }
    Ok(wanted)
}

/// A job's limits, as the agent resolved them (request, profile, defaults).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub memory_bytes: Option<u64>,
    pub processes: Option<u64>,
    pub cpu_millis_per_sec: Option<u64>,
}

/// The CFS period the CPU quota is expressed in: 100 ms.
const CPU_PERIOD_US: u64 = 100_000;

fn apply(
    job: &JobCgroup,
    d: &Path,
    c: Controller,
    v2: bool,
    l: &Limits,
    overhead: u64,
) -> io::Result<()> {
    let w = |file: &str, v: String| {
        job.write(&d.join(file), &v)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", d.join(file).display())))
    };
    match c {
        Controller::Memory => {
            if let Some(m) = l.memory_bytes {
                if v2 {
                    w("memory.max", m.to_string())?;
                    // No swap past the limit either.
                    let _ = w("memory.swap.max", "0".into());
                } else {
                    w("memory.limit_in_bytes", m.to_string())?;
                    // Swap accounting may be off (the file is absent).
                    let _ = w("memory.memsw.limit_in_bytes", m.to_string());
                }
            }
        }
        Controller::Pids => {
            if let Some(p) = l.processes {
                w("pids.max", p.saturating_add(overhead).to_string())?;
            }
        }
        Controller::Cpu => {
            if let Some(ms) = l.cpu_millis_per_sec {
                let quota = ms.saturating_mul(CPU_PERIOD_US) / 1000;
                if v2 {
                    w("cpu.max", format!("{quota} {CPU_PERIOD_US}"))?;
                } else {
                    // The period was written when the directory was made.
                    w("cpu.cfs_quota_us", quota.to_string())?;
                }
            }
        }
        Controller::Cpuacct => {}
    }
    Ok(())
}

/// A job cgroup's `cgroup.procs` in one hierarchy, open for writing.
#[derive(Debug)]
pub struct Procs {
    pub fd: OwnedFd,
    /// The v1 hierarchy of the cpu controller alone: needed only for a
    /// CPU quota (joining it is refused to a real-time process where the
    /// kernel schedules real-time tasks by group, and costs a migration).
    /// Never the job's only hierarchy: a job is always in a cgroup its end
    /// lists and kills.
    pub cpu_only: bool,
}

/// One job's cgroup: a directory in the unified hierarchy and/or in v1
/// hierarchies. Removed by [`JobCgroup::end`] (or on drop, best effort).
#[derive(Debug, Default)]
pub struct JobCgroup {
    v2: Option<PathBuf>,
    /// The controllers enabled in `v2`.
    v2_controllers: Vec<Controller>,
    v1: Vec<(Controller, PathBuf)>,
    /// [`JobCgroup::end`] ran (or a failed create cleaned up).
    ended: std::sync::atomic::AtomicBool,
    /// Processes of the agent's in it (the supervisor, an init): not
    /// counted in the account.
    overhead: u64,
    /// Its limit files, opened when it was made (ahead, off the start's
    /// path) and closed once the limits are written: the start then looks
    /// no path up. A lookup on cgroupfs waits behind any `mkdir` or
    /// `rmdir` in the same hierarchy (the kernel's kernfs lock), which the
    /// last job's removal keeps busy right after its end.
    open: std::sync::Mutex<Vec<OpenFile>>,
}

/// A limit file of a job's cgroup, open for writing.
#[derive(Debug)]
struct OpenFile {
    path: PathBuf,
    file: fs::File,
}

/// What a job used (`process/exited.usage`); each part `None` where no
/// hierarchy accounts for it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub cpu_user_us: Option<u64>,
    pub cpu_system_us: Option<u64>,
    pub peak_memory_bytes: Option<u64>,
    pub processes_peak: Option<u64>,
    /// Processes now (for `process/list`).
    pub processes: Option<u64>,
    pub memory_bytes: Option<u64>,
    /// The memory limit killed a process (OOM kill).
    pub oom_killed: bool,
    /// A fork failed at the processes limit.
    pub processes_limited: bool,
}

/// `key value` lines (cpu.stat, memory.events, pids.events).
pub fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

fn read_u64(p: &Path) -> Option<u64> {
    fs::read_to_string(p).ok()?.trim().parse().ok()
}

impl JobCgroup {
    /// Write the job's limits (into a cgroup [`Cgroups::make_job`] made:
    /// unlimited until now). `processes` counts the job's own processes:
    /// `overhead` (its supervisor, its init) is added.
    pub fn set_limits(&mut self, limits: &Limits, overhead: u64) -> io::Result<()> {
        self.overhead = overhead;
        if let Some(d) = &self.v2 {
            for c in &self.v2_controllers {
                apply(self, d, *c, true, limits, overhead)?;
            }
        }
        for (c, d) in &self.v1 {
            apply(self, d, *c, false, limits, overhead)?;
        }
        self.files().clear();
        Ok(())
    }

    /// Undo [`JobCgroup::set_limits`]: every limit back to unlimited (as a
    /// cgroup [`Cgroups::make_job`] made), for a cgroup made ahead whose
    /// start failed and that waits for the next.
    pub fn clear_limits(&mut self) -> io::Result<()> {
        let w = |d: &Path, file: &str, v: &str| match self.write(&d.join(file), v) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        };
        if let Some(d) = &self.v2 {
            for c in &self.v2_controllers {
                match c {
                    Controller::Memory => {
                        w(d, "memory.max", "max")?;
                        w(d, "memory.swap.max", "max")?;
                    }
                    Controller::Pids => w(d, "pids.max", "max")?,
                    Controller::Cpu => w(d, "cpu.max", "max")?,
                    Controller::Cpuacct => {}
                }
            }
        }
        for (c, d) in &self.v1 {
            match c {
                Controller::Memory => {
                    // The swap limit first: it may not fall below the other.
                    w(d, "memory.memsw.limit_in_bytes", "-1")?;
                    w(d, "memory.limit_in_bytes", "-1")?;
                }
                Controller::Pids => w(d, "pids.max", "max")?,
                Controller::Cpu => w(d, "cpu.cfs_quota_us", "-1")?,
                Controller::Cpuacct => {}
            }
        }
        self.overhead = 0;
        Ok(())
    }

    /// `cgroup.procs` of each directory, open for writing: the supervisor
    /// writes `0` in each to join.
    pub fn procs(&self) -> io::Result<Vec<Procs>> {
        let mut dirs: Vec<&PathBuf> = self.v2.iter().collect();
        for (_, d) in &self.v1 {
            if !dirs.contains(&d) {
                dirs.push(d);
            }
        }
        dirs.into_iter()
            .map(|d| {
                let cpu_only = self.is_cpu_only(d);
                fs::OpenOptions::new()
                    .write(true)
                    .open(d.join("cgroup.procs"))
                    .map(|f| Procs {
                        fd: OwnedFd::from(f),
                        cpu_only,
                    })
            })
            .collect()
    }

    fn files(&self) -> std::sync::MutexGuard<'_, Vec<OpenFile>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Open the files [`JobCgroup::set_limits`] writes (those that
    /// exist: `memory.memsw.*` only with swap accounting); one that cannot
    /// be opened is written by its path. The account files are read by
    /// path at the end: held open for a job's life they would cost every
    /// running job five descriptors more.
    fn open_files(&mut self) {
        // The files `apply` writes, for each controller of each hierarchy.
        let files = |c: Controller, v2: bool| -> &'static [&'static str] {
            match (c, v2) {
                (Controller::Memory, true) => &["memory.max", "memory.swap.max"],
                (Controller::Memory, false) => {
                    &["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"]
                }
                (Controller::Pids, _) => &["pids.max"],
                (Controller::Cpu, true) => &["cpu.max"],
                (Controller::Cpu, false) => &["cpu.cfs_quota_us"],
                (Controller::Cpuacct, _) => &[],
            }
        };
        let v2 = self
            .v2
            .iter()
            .flat_map(|d| self.v2_controllers.iter().map(move |c| (*c, d, true)));
        let v1 = self.v1.iter().map(|(c, d)| (*c, d, false));
        let want: Vec<PathBuf> = v2
            .chain(v1)
            .flat_map(|(c, d, v2)| files(c, v2).iter().map(move |f| d.join(f)))
            .collect();
        let open: Vec<OpenFile> = want
            .into_iter()
            .filter_map(|path| {
                let file = fs::OpenOptions::new().write(true).open(&path).ok()?;
                Some(OpenFile { path, file })
            })
            .collect();
        *self.files() = open;
    }

    /// Write a limit file of this cgroup: through its open descriptor,
    /// else by its path.
    fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        {
            let files = self.files();
            if let Some(f) = files.iter().find(|f| f.path == path) {
                return (&f.file).write_all(value.as_bytes());
            }
        }
        write_file(path, value)
    }

    fn v1_dir(&self, c: Controller) -> Option<&Path> {
        self.v1
            .iter()
            .find(|(x, _)| *x == c)
            .map(|(_, d)| d.as_path())
    }

    /// A running job's account, cheaply (`process/list`): its CPU time,
    /// memory and processes now, three files at most.
    pub fn current(&self) -> Usage {
        let mut u = Usage::default();
        if let Some(d) = &self.v2 {
            if let Ok(stat) = fs::read_to_string(d.join("cpu.stat")) {
                u.cpu_user_us = keyed(&stat, "user_usec");
                u.cpu_system_us = keyed(&stat, "system_usec");
            }
        }
        if u.cpu_user_us.is_none() {
            if let Some(d) = self.v1_dir(Controller::Cpuacct) {
                if let Ok(stat) = fs::read_to_string(d.join("cpuacct.stat")) {
                    // USER_HZ ticks (100 per second on Linux).
                    u.cpu_user_us = keyed(&stat, "user").map(|t| t * 10_000);
                    u.cpu_system_us = keyed(&stat, "system").map(|t| t * 10_000);
                }
            }
        }
        u.memory_bytes = match (self.v1_dir(Controller::Memory), &self.v2) {
            (Some(d), _) => read_u64(&d.join("memory.usage_in_bytes")),
            (None, Some(d)) => read_u64(&d.join("memory.current")),
            _ => None,
        };
        u.processes = match (self.v1_dir(Controller::Pids), &self.v2) {
            (Some(d), _) => read_u64(&d.join("pids.current")),
            (None, Some(d)) => read_u64(&d.join("pids.current")),
            _ => None,
        }
        .map(|p| p.saturating_sub(self.overhead));
        u
    }

    /// The account so far: the totals and peaks, and the limits hit
    /// (what it holds now is [`JobCgroup::current`]'s).
    pub fn usage(&self) -> Usage {
        let mut u = Usage::default();
        let v2 = self.v2.as_deref();
        if let Some(d) = v2 {
            if let Ok(stat) = fs::read_to_string(d.join("cpu.stat")) {
                u.cpu_user_us = keyed(&stat, "user_usec");
                u.cpu_system_us = keyed(&stat, "system_usec");
            }
            // Only the files of the controllers enabled there exist.
            if self.v2_controllers.contains(&Controller::Memory) {
                u.peak_memory_bytes = read_u64(&d.join("memory.peak"));
                if let Ok(ev) = fs::read_to_string(d.join("memory.events")) {
                    u.oom_killed |= keyed(&ev, "oom_kill").unwrap_or(0) > 0;
                }
            }
            if self.v2_controllers.contains(&Controller::Pids) {
                u.processes_peak = read_u64(&d.join("pids.peak"));
                if let Ok(ev) = fs::read_to_string(d.join("pids.events")) {
                    u.processes_limited |= keyed(&ev, "max").unwrap_or(0) > 0;
                }
            }
        }
        if let Some(d) = self
            .v1_dir(Controller::Cpuacct)
            .filter(|_| u.cpu_user_us.is_none())
        {
            u.cpu_user_us = read_u64(&d.join("cpuacct.usage_user")).map(|ns| ns / 1000);
            u.cpu_system_us = read_u64(&d.join("cpuacct.usage_sys")).map(|ns| ns / 1000);
        }
        if let Some(d) = self.v1_dir(Controller::Memory) {
            u.peak_memory_bytes = read_u64(&d.join("memory.max_usage_in_bytes"));
            if let Ok(oc) = fs::read_to_string(d.join("memory.oom_control")) {
                u.oom_killed |= keyed(&oc, "oom_kill").unwrap_or(0) > 0;
            }
        }
        if let Some(d) = self.v1_dir(Controller::Pids) {
            u.processes_peak = read_u64(&d.join("pids.peak")).or(u.processes_peak);
            if let Ok(ev) = fs::read_to_string(d.join("pids.events")) {
                u.processes_limited |= keyed(&ev, "max").unwrap_or(0) > 0;
            }
        }
        // The job's own: the supervisor (and an init) are the agent's.
        u.processes_peak = u.processes_peak.map(|p| p.saturating_sub(self.overhead));
        u.processes = u.processes.map(|p| p.saturating_sub(self.overhead));
        u
    }

    /// Send every process of the job's cgroup SIGKILL now, one pass over
    /// those listed, each named by a pidfd first ([`kill_members`]),
    /// without waiting for them to be gone: [`JobCgroup::end`] then kills
    /// what forked meanwhile and waits. Reads and signals only, no write
    /// to cgroupfs: `cgroup.kill` (and `pids.max`, whose refusals would
    /// read as the job's own `limit_hit`) wait here on the kernel's cgroup
    /// lock, which a migration elsewhere (the standby joining the next
    /// job's cgroup) holds for an RCU grace period after an idle spell,
    /// milliseconds before `process/exited`.
    pub fn kill_now(&self) -> io::Result<()> {
        let Some(listed) = self
            .v2
            .as_deref()
            .or_else(|| self.v1_listed().first().copied())
        else {
            return Ok(());
        };
        kill_members(listed, &procs_beneath(listed)?)
    }

    pub fn kill(&self) -> io::Result<()> {
        kill_all(
            self.v2.as_deref(),
            &self.v1_listed(),
            Duration::from_secs(5),
        )
    }

    /// Whether `d` (one of this job's directories) is of the v1 cpu
    /// hierarchy alone, which a job joins only for a CPU quota: never when
    /// no other hierarchy of the job is joined by every job (then it is
    /// the job's only cgroup, and its end's list of members).
    fn is_cpu_only(&self, d: &Path) -> bool {
        let cpu_alone = |d: &Path| {
            self.v2.as_deref() != Some(d)
                && self
                    .v1
                    .iter()
                    .filter(|(_, x)| x == d)
                    .all(|(c, _)| *c == Controller::Cpu)
        };
        cpu_alone(d) && (self.v2.is_some() || self.v1.iter().any(|(_, x)| !cpu_alone(x)))
    }

    /// The v1 directories, one each, a directory every job joins first:
    /// the end lists the job's members in the first (a job without a CPU
    /// quota is not in its cpu-only one, [`Procs::cpu_only`]).
    fn v1_listed(&self) -> Vec<&Path> {
        let mut dirs: Vec<&Path> = Vec::new();
        for (_, d) in &self.v1 {
            if !dirs.contains(&d.as_path()) {
                dirs.push(d);
            }
        }
        dirs.sort_by_key(|d| self.is_cpu_only(d));
        dirs
    }

    /// Kill what is left and remove the directories (once: a second call
    /// does nothing). The account is read before ([`JobCgroup::usage`]).
    pub fn end(&self) -> io::Result<()> {
        if self.ended.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Ok(());
        }
        self.files().clear();
        let killed = self.kill();
        let removed = self.remove();
        killed.and(removed)
    }

    fn remove(&self) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut first = Ok(());
        let mut dirs: Vec<&PathBuf> = self.v2.iter().collect();
        for (_, d) in &self.v1 {
            if !dirs.contains(&d) {
                dirs.push(d);
            }
        }
        for d in dirs {
            if let Err(e) = remove_dir_retrying(d, deadline) {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }
}

impl Drop for JobCgroup {
    fn drop(&mut self) {
        let _ = self.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Recorded on a hybrid host (this project's CI machine: v1 controllers,
    // an empty unified hierarchy, the memory cgroup a container's subtree).
    const HYBRID_MOUNTINFO: &str = "\
1390 1389 0:77 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - tmpfs tmpfs rw,mode=755
1391 1390 0:78 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
1392 1390 0:79 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
1393 1390 0:80 /process_api /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
1394 1390 0:81 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
1395 1390 0:82 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
1396 1390 0:83 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const HYBRID_CGROUP: &str = "\
9:name=systemd:/
8:pids:/
4:memory:/process_api/171c
2:cpuacct:/
1:cpu:/
0::/
";
    // A systemd host with the unified hierarchy only, the agent in a
    // user's session scope.
    const UNIFIED_MOUNTINFO: &str = "\
35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";
    const UNIFIED_CGROUP: &str = "0::/user.slice/user-1000.slice/session-3.scope\n";
    // A CentOS 7 style host: cpu and cpuacct mounted together.
    const CO_MOUNTED: &str = "\
25 18 0:22 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpuacct,cpu
26 18 0:23 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
";
    const CO_MOUNTED_CGROUP: &str = "3:cpuacct,cpu:/user.slice\n2:pids:/user.slice\n";

    #[test]
    fn a_hybrid_host_is_located_controller_by_controller() {
        let l = locate(
            &parse_mountinfo(HYBRID_MOUNTINFO),
            &parse_proc_cgroup(HYBRID_CGROUP),
        );
        assert_eq!(l.v2, Some(PathBuf::from("/sys/fs/cgroup/unified")));
        assert_eq!(
            l.v1.get(&Controller::Memory),
            Some(&PathBuf::from("/sys/fs/cgroup/memory/171c"))
        );
        assert_eq!(
            l.v1.get(&Controller::Pids),
            Some(&PathBuf::from("/sys/fs/cgroup/pids"))
        );
        assert_eq!(
            l.v1.get(&Controller::Cpuacct),
            Some(&PathBuf::from("/sys/fs/cgroup/cpuacct"))
        );
    }

    #[test]
    fn a_unified_host_and_a_co_mounted_one() {
        let l = locate(
            &parse_mountinfo(UNIFIED_MOUNTINFO),
            &parse_proc_cgroup(UNIFIED_CGROUP),
        );
        assert_eq!(
            l.v2,
            Some(PathBuf::from(
                "/sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope"
            ))
        );
        assert!(l.v1.is_empty());
        let l = locate(
            &parse_mountinfo(CO_MOUNTED),
            &parse_proc_cgroup(CO_MOUNTED_CGROUP),
        );
        let cpu = PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/user.slice");
        assert_eq!(l.v1.get(&Controller::Cpu), Some(&cpu));
        assert_eq!(l.v1.get(&Controller::Cpuacct), Some(&cpu));
        assert_eq!(l.v2, None);
    }

    #[test]
    fn a_path_the_mount_does_not_show_is_not_used() {
        let m =
            parse_mountinfo("1 0 0:1 /other /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n");
        let l = locate(&m, &parse_proc_cgroup("4:memory:/process_api/x\n"));
        assert!(l.v1.is_empty());
        let l = locate(&m, &parse_proc_cgroup("4:memory:/otherwise\n"));
        assert!(
            l.v1.is_empty(),
            "a sibling with the root as prefix is not under it"
        );
        let l = locate(&m, &parse_proc_cgroup("4:memory:/other/../../etc\n"));
        assert!(l.v1.is_empty());
    }

    #[test]
    fn escaped_mount_points_are_unescaped() {
        let m = parse_mountinfo("1 0 0:1 / /sys/fs/cgroup/my\\040dir rw - cgroup2 cgroup2 rw\n");
        assert_eq!(m[0].mount_point, PathBuf::from("/sys/fs/cgroup/my dir"));
    }

    #[test]
    fn keyed_files_parse() {
        // Recorded cpu.stat (v2), memory.events, pids.events, oom_control.
        let cpu = "usage_usec 1520\nuser_usec 1000\nsystem_usec 520\nnr_periods 0\n";
        assert_eq!(keyed(cpu, "user_usec"), Some(1000));
        assert_eq!(keyed(cpu, "system_usec"), Some(520));
        let ev = "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(keyed(ev, "oom_kill"), Some(1));
        assert_eq!(keyed("max 3\n", "max"), Some(3));
        let oc = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!(keyed(oc, "oom_kill"), Some(2));
        assert_eq!(keyed(oc, "absent"), None);
    }

    #[test]
    fn a_subtree_is_removed_deepest_first() {
        let base = std::env::temp_dir().join(format!("cgroup-subtree-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        for d in ["a/b/c", "a/d", "e"] {
            fs::create_dir_all(base.join(d)).unwrap();
        }
        let order = subtree(&base);
        assert_eq!(order.last(), Some(&base), "{order:?}");
        let at = |p: &str| order.iter().position(|x| *x == base.join(p)).unwrap();
        assert!(at("a/b/c") < at("a/b") && at("a/b") < at("a") && at("a/d") < at("a"));
        remove_dir_retrying(&base, Instant::now() + Duration::from_secs(1)).unwrap();
        assert!(!base.exists());
    }

    /// Hostile: another process holds a shared lock on the directory an
    /// agent is to hold (another user could, on a directory it may open):
    /// `hold` gives up after its 1 s instead of waiting without bound, and
    /// the directory is made this user's alone. Control: free, it is held.
    #[test]
    fn a_lock_held_elsewhere_delays_hold_a_bounded_time() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("executor-hold-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        let other = nix::fcntl::Flock::lock(
            fs::File::open(&dir).unwrap(),
            nix::fcntl::FlockArg::LockSharedNonblock,
        )
        .unwrap();
        let held = || HELD.lock().unwrap().len();
        let before = held();
        let t = Instant::now();
        hold(&dir);
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_millis(900) && waited < Duration::from_secs(3),
            "{waited:?}"
        );
        assert_eq!(held(), before, "not held while another holds it");
        let mode = fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o711);
        drop(other);
        hold(&dir);
        assert_eq!(held(), before + 1, "control: held once free");
        HELD.lock().unwrap().pop();
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_agent_directory_names_a_live_agent() {
        let mine = agent_dir_name();
        let base = std::env::temp_dir().join(format!("cgroup-owner-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        fs::create_dir_all(&base).unwrap();
        let dir = |n: &str| {
            let d = base.join(n);
            fs::create_dir_all(&d).unwrap();
            d
        };
        let owner_alive = |n: &str| owner_alive(&dir(n), n);
        assert!(owner_alive(&mine), "{mine}");
        assert!(!owner_alive("executor-999999999-1"));
        // An agent of another PID namespace: its pid names another process
        // (or none) here, its lock says it is alive.
        let other = "executor-999999998-1";
        let held = nix::fcntl::Flock::lock(
            fs::File::open(dir(other)).unwrap(),
            nix::fcntl::FlockArg::LockExclusiveNonblock,
        )
        .unwrap();
        assert!(owner_alive(other), "locked: alive");
        drop(held);
        assert!(!owner_alive(other), "unlocked: dead");
        let me = std::process::id();
        assert!(
            !owner_alive(&format!("executor-{me}-1")),
            "a reused pid is not the owner"
        );
        assert!(owner_alive("not-ours"));
        fs::remove_dir_all(&base).unwrap();
    }
}
