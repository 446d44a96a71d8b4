//! An unprivileged agent whose own cgroup it cannot write (a login
//! session's scope belongs to root) gets one from the user's systemd: a
//! transient scope with `Delegate=yes` (docs/PROTOCOL.md §3.1), and its
//! jobs end whole there.
//!
//! The test runs a real `systemd --user` as uid 65534, as `user@.service`
//! runs one: in a cgroup subtree the test made and gave to that user (the
//! same path in the unified hierarchy and, on a hybrid host, in systemd's
//! own `name=systemd` one), in a mount namespace where
//! `/run/systemd/system` exists (this machine's PID 1 is not systemd, and
//! the manager refuses to start without that sign). The agent starts as
//! that user in `login`, a cgroup of that subtree owned by root.
//!
//! On this hybrid host the scope carries no controllers (they are bound to
//! the v1 hierarchies): what it gives is `cgroup.kill` and membership,
//! so a job ends whole. Where the host is unified and the user's manager
//! delegates controllers (as `user@.service` does for `memory pids`), the
//! same scope bounds the jobs too.

use super::limits::{
    detached_job_ends_with_its_killed_supervisor, marked, marker, mechanisms, none_left, params,
    run, shells_running,
};
use executor_client::{Client, ClientOptions};
use executor_protocol::types::process::JobLimits;
use executor_tests::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

const UID: u32 = 65534;

/// A `systemd --user` of `UID` in a delegated subtree; stopped, and the
/// subtree removed, when dropped.
struct UserManager {
    child: std::process::Child,
    /// The subtree in each hierarchy (the unified one first).
    trees: Vec<PathBuf>,
    runtime: PathBuf,
}

impl Drop for UserManager {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        for _ in 0..500 {
            if self.child.try_wait().ok().flatten().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        for t in &self.trees {
            remove_tree(t);
        }
    }
}

/// `rmdir` a cgroup subtree, deepest first, killing what is left in it
/// (retried while the last processes are being reaped).
fn remove_tree(t: &Path) {
    fn dirs(d: &Path, out: &mut Vec<PathBuf>) {
        if let Ok(rd) = std::fs::read_dir(d) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs(&e.path(), out);
                }
            }
        }
        out.push(d.to_path_buf());
    }
    let _ = std::fs::write(t.join("cgroup.kill"), "1");
    for _ in 0..300 {
        let mut all = Vec::new();
        dirs(t, &mut all);
        if all.iter().all(|d| std::fs::remove_dir(d).is_ok()) || !t.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The hierarchies a user's manager needs: the unified one, and on a
/// hybrid host systemd's own (`name=systemd`, where it reads its place).
/// `None` with what is missing.
fn hierarchies() -> Result<(PathBuf, Option<PathBuf>), &'static str> {
    use executor_sandbox::cgroup::{locate, parse_mountinfo, parse_proc_cgroup};
    let read = |p| std::fs::read_to_string(p).unwrap();
    let l = locate(
        &parse_mountinfo(&read("/proc/self/mountinfo")),
        &parse_proc_cgroup(&read("/proc/self/cgroup")),
    );
    let v2 = l.v2.ok_or("the unified cgroup hierarchy")?;
    let named = Path::new("/sys/fs/cgroup/systemd");
    let hybrid = named.join("cgroup.procs").exists()
        && read("/proc/self/cgroup")
            .lines()
            .any(|l| l.contains(":name=systemd:/"));
    Ok((v2, hybrid.then(|| named.to_path_buf())))
}

/// The manager's binary, where Debian and Fedora put it.
fn systemd_bin() -> Option<PathBuf> {
    ["/usr/lib/systemd/systemd", "/lib/systemd/systemd"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// Start `systemd --user` for `UID`; `None` when this machine cannot
/// (a prerequisite missing).
async fn user_manager() -> Option<UserManager> {
    if current_uid() != 0 {
        prerequisite_missing("root, to delegate a cgroup subtree and run a user's systemd");
        return None;
    }
    let Some(bin) = systemd_bin() else {
        prerequisite_missing("systemd's binary (apt install systemd), for a user's manager");
        return None;
    };
    let (v2, named) = match hierarchies() {
        Ok(h) => h,
        Err(what) => {
            prerequisite_missing(what);
            return None;
        }
    };
    let name = format!("executor-test-sd-{}-{}", std::process::id(), unique());
    // The manager finds its place by its path (in `name=systemd` on a
    // hybrid host, the unified hierarchy else): the same path in both.
    let mut trees = vec![v2.join(&name)];
    if let Some(n) = &named {
        let rel = v2
            .strip_prefix("/sys/fs/cgroup/unified")
            .or_else(|_| v2.strip_prefix("/sys/fs/cgroup"))
            .unwrap();
        trees.push(n.join(rel).join(&name));
    }
    for t in &trees {
        std::fs::create_dir_all(t).unwrap_or_else(|e| panic!("mkdir {}: {e}", t.display()));
        chown_r(t, UID);
    }
    let runtime = unique_tempdir("sd-runtime");
    chown_r(&runtime, UID);
    std::fs::set_permissions(
        &runtime,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let joins: String = trees
        .iter()
        .map(|t| format!("echo $$ > '{}/cgroup.procs' || exit 99; ", t.display()))
        .collect();
    let script = format!(
        "mkdir -p /run/systemd && mount -t tmpfs tmpfs /run/systemd && mkdir /run/systemd/system && \
         {joins}exec setpriv --reuid={UID} --regid={UID} --clear-groups -- \
         env -i XDG_RUNTIME_DIR='{r}' HOME='{r}' PATH=/usr/bin:/bin '{bin}' --user --log-target=console",
        r = runtime.display(),
        bin = bin.display()
    );
    let child = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("unshare");
    let m = UserManager {
        child,
        trees,
        runtime,
    };
    let socket = m.runtime.join("systemd/private");
    for _ in 0..1000 {
        if socket.exists() {
            return Some(m);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "the user's systemd made no {} within 10 s",
        socket.display()
    );
}

/// An agent of `UID` in `login` (a root-owned cgroup of the manager's
/// subtree, as a login session's scope is), with `runtime` as its
/// `XDG_RUNTIME_DIR`.
async fn agent_in_login(m: &UserManager, runtime: &Path) -> Client {
    let login = m.trees[0].join("login");
    std::fs::create_dir_all(&login).unwrap();
    agent_in(&login, runtime).await
}

/// An agent of `UID` started in the v2 cgroup `dir`.
async fn agent_in(dir: &Path, runtime: &Path) -> Client {
    let login = dir;
    let mut c = tokio::process::Command::new("sh");
    c.arg("-c").arg(format!(
        "echo $$ > '{}/cgroup.procs' || exit 99; exec setpriv --reuid={UID} --regid={UID} --clear-groups -- \
         env XDG_RUNTIME_DIR='{}' \"$@\"",
        login.display(),
        runtime.display()
    ));
    c.arg("sh").arg(executor_bin_for_any_user());
    Client::spawn(c, ClientOptions::default())
        .await
        .expect("agent")
}

/// The scopes named after an agent anywhere in `tree`.
fn scopes_in(tree: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![tree.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with("executor-") && n.ends_with(".scope") {
                    out.push(e.path());
                }
                stack.push(e.path());
            }
        }
    }
    out
}

/// The agent joins a scope of the user's manager, its jobs' cgroups are
/// made there, and a detached unconfined job ends whole with its killed
/// supervisor (`cgroup.kill` on the scope's subtree). When it exits, the
/// manager collects the scope. Control: the same agent with no manager
/// behind its `XDG_RUNTIME_DIR` has no v2 cgroup (its own is root's), and
/// says why in its log.
#[tokio::test]
async fn an_unprivileged_agent_gets_a_scope_from_the_users_systemd() {
    let Some(m) = user_manager().await else {
        return;
    };
    // Control: no manager to ask.
    let empty = unique_tempdir("sd-empty");
    chown_r(&empty, UID);
    let c = agent_in_login(&m, &empty).await;
    let mech = mechanisms(&c).await;
    assert!(
        !mech.contains(&"cgroup_v2".to_string()),
        "without a manager the agent's own cgroup is root's: {mech:?}"
    );
    drop(c);
    assert!(scopes_in(&m.trees[0]).is_empty());

    let c = agent_in_login(&m, &m.runtime).await;
    let mech = mechanisms(&c).await;
    assert!(
        mech.contains(&"cgroup_v2".to_string()),
        "the agent's scope from the user's systemd: {mech:?}"
    );
    let scopes = scopes_in(&m.trees[0]);
    assert_eq!(scopes.len(), 1, "one scope, the agent's: {scopes:?}");
    let scope = &scopes[0];
    let owner = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(scope).unwrap());
    assert_eq!(
        owner,
        UID,
        "{}: delegated to the agent's user",
        scope.display()
    );
    // A job's cgroup is under the scope.
    let p = params(&["cat", "/proc/self/cgroup"], JobLimits::default(), None);
    let (_, out, _) = run(&c, &p).await.unwrap();
    let rel = scope
        .strip_prefix(&m.trees[0])
        .unwrap()
        .display()
        .to_string();
    let v2_line = out.lines().find(|l| l.starts_with("0::")).unwrap_or("");
    assert!(
        v2_line.contains(&format!("{rel}/executor-")),
        "the job's cgroup is in the agent's scope {rel}: {out}"
    );
    detached_job_ends_with_its_killed_supervisor(
        &c,
        JobLimits::default(),
        "an agent in a scope from the user's systemd",
    )
    .await;
    drop(c);
    // The agent gone, its scope is empty and the manager collects it.
    let mut left = scopes_in(&m.trees[0]);
    for _ in 0..500 {
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        left = scopes_in(&m.trees[0]);
    }
    assert!(left.is_empty(), "the agent's scope outlived it: {left:?}");
}

/// An agent killed while a job's detached process runs, its supervisor
/// killed too (the agent and its spawner stopped first, so that nothing
/// of theirs ends the job): the process lives on in the dead agent's scope, which the
/// manager cannot collect while it holds a process. The next agent of the
/// user sweeps it: the process is killed and the scope goes.
#[tokio::test]
async fn a_dead_agents_scope_is_swept_by_the_next_agent() {
    let Some(m) = user_manager().await else {
        return;
    };
    let c = agent_in_login(&m, &m.runtime).await;
    let mk = marker();
    let script = "setsid sh -c 'sleep 30; :' \"$0\" & sleep 30; :";
    let p = params(&["sh", "-c", script, &mk], JobLimits::default(), None);
    let proc = c.start(&p).await.unwrap();
    let detached = shells_running(&mk, "sleep 30; :", 1).await;
    assert_eq!(detached.len(), 1, "the job's detached shell: {detached:?}");
    let dead_scope = scopes_in(&m.trees[0]);
    assert_eq!(dead_scope.len(), 1, "{dead_scope:?}");
    let supervisor = parent_pid(proc.pid());
    let spawner = parent_pid(supervisor);
    let agent = agent_of_job(proc.pid());
    let signal =
        |pid: u32, s| nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), s).unwrap();
    // Stopped, the agent and the spawner (the job's subreaper) cannot end
    // the job; the agent's SIGKILL takes the spawner with it.
    signal(agent, nix::sys::signal::Signal::SIGSTOP);
    signal(spawner, nix::sys::signal::Signal::SIGSTOP);
    signal(supervisor, nix::sys::signal::Signal::SIGKILL);
    assert!(wait_dead(supervisor, Duration::from_secs(10)).await);
    signal(agent, nix::sys::signal::Signal::SIGKILL);
    assert!(wait_dead(agent, Duration::from_secs(10)).await);
    drop(proc);
    drop(c);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !marked(&mk).is_empty(),
        "the detached process outlives its killed agent and supervisor"
    );
    assert!(dead_scope[0].exists(), "the dead agent's scope holds it");
    // The next agent sweeps it.
    let c = agent_in_login(&m, &m.runtime).await;
    assert!(mechanisms(&c).await.contains(&"cgroup_v2".to_string()));
    assert_eq!(none_left(&mk).await, Vec::<u32>::new(), "left on the host");
    let mut gone = false;
    for _ in 0..500 {
        if !dead_scope[0].exists() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(gone, "{} swept", dead_scope[0].display());
    assert_eq!(
        scopes_in(&m.trees[0]).len(),
        1,
        "only the live agent's scope"
    );
}

/// An agent started in another agent's scope (as a detached session's
/// host is, spawned by the agent whose connection it outlives) makes its
/// directory there; when the first agent exits, its scope lives on with
/// the second. The next agent's sweep must not take the scope for a dead
/// agent's: the second agent's job keeps running and it starts more.
/// (It killed the job and removed the second agent's directory, so that
/// its next start failed with `ENODEV`.) The dead agent's directory in
/// that scope stays until the live one is gone.
#[tokio::test]
async fn a_live_agent_in_a_dead_agents_scope_is_not_swept() {
    let Some(m) = user_manager().await else {
        return;
    };
    let first = agent_in_login(&m, &m.runtime).await;
    assert!(mechanisms(&first).await.contains(&"cgroup_v2".to_string()));
    let scopes = scopes_in(&m.trees[0]);
    assert_eq!(scopes.len(), 1, "{scopes:?}");
    let scope = scopes[0].clone();
    let first_pid: u32 = std::fs::read_dir(&scope)
        .unwrap()
        .flatten()
        .find_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.strip_prefix("executor-")?.split('-').next()?.parse().ok()
        })
        .expect("the first agent's directory in its scope");
    let second = agent_in(&scope, &m.runtime).await;
    assert!(mechanisms(&second).await.contains(&"cgroup_v2".to_string()));
    let agents_in_scope = || {
        std::fs::read_dir(&scope)
            .map(|r| {
                r.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("executor-"))
                    .count()
            })
            .unwrap_or(0)
    };
    assert_eq!(agents_in_scope(), 2, "both agents' directories");
    let mk = marker();
    let p = params(
        &["sh", "-c", "sleep 30; :", &mk],
        JobLimits::default(),
        None,
    );
    let job = second.start(&p).await.unwrap();
    assert_eq!(shells_running(&mk, "sleep 30; :", 1).await.len(), 1);
    // Killed (the client's drop): its directory stays for a sweep.
    drop(first);
    assert!(wait_dead(first_pid, Duration::from_secs(10)).await);
    // The next agent of the user sweeps at its start.
    let next = agent_in_login(&m, &m.runtime).await;
    assert!(mechanisms(&next).await.contains(&"cgroup_v2".to_string()));
    assert_eq!(
        scopes_in(&m.trees[0]).len(),
        2,
        "the first scope and the next agent's"
    );
    assert_eq!(
        agents_in_scope(),
        2,
        "the live agent's directory, and the dead one's with it"
    );
    assert_eq!(
        marked(&mk).len(),
        1,
        "the second agent's job runs on after the next agent's sweep"
    );
    let p = params(&["echo", "ok"], JobLimits::default(), None);
    let (st, out, _) = run(&second, &p).await.unwrap();
    assert_eq!(
        (st.code, out.as_str()),
        (Some(0), "ok\n"),
        "the second agent starts jobs"
    );
    drop(job);
    drop(second);
    drop(next);
    assert_eq!(none_left(&mk).await, Vec::<u32>::new());
}

/// Hostile: an agent in a PID namespace of its own (a container's) with
/// the user's manager outside it (its socket reachable, as a bind mount
/// would make it). The call names a pid, which the manager reads in its
/// own namespace: there the agent's pid is another process. The test
/// makes it one of the user's (`sleep`, on the host, whose pid the agent
/// is given in its namespace through `ns_last_pid`). The agent must not
/// ask: no scope, the other process stays where it was. The layer is the
/// agent's check of the manager's PID namespace (peer credentials).
/// Control: the same agent without the namespace gets its scope (the
/// first test).
#[tokio::test]
async fn a_manager_in_another_pid_namespace_is_not_asked() {
    let Some(m) = user_manager().await else {
        return;
    };
    let mk = marker();
    // The other process runs in a cgroup of the user's own (as a service
    // of its manager does), where the manager could move it.
    let joins: String = m
        .trees
        .iter()
        .map(|t| {
            let d = t.join("other");
            std::fs::create_dir_all(&d).unwrap();
            chown_r(&d, UID);
            format!("echo $$ > '{}/cgroup.procs' || exit 99; ", d.display())
        })
        .collect();
    let mut victim = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{joins}exec \"$@\""))
        .args([
            "sh",
            "setpriv",
            &format!("--reuid={UID}"),
            &format!("--regid={UID}"),
            "--clear-groups",
            "--",
            "sh",
            "-c",
            "sleep 30; :",
            &mk,
        ])
        .spawn()
        .unwrap();
    let n = victim.id();
    assert_eq!(shells_running(&mk, "sleep 30; :", 1).await, vec![n]);
    let cgroup_of = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let before = cgroup_of(n);
    assert!(before.contains("/other\n"), "{before}");
    let login = m.trees[0].join("login");
    std::fs::create_dir_all(&login).unwrap();
    // The namespace's first process sets the pid its next fork gets:
    // the agent's shell, which joins `login` and becomes the agent.
    let inner = format!(
        "echo $$ > \"$0/cgroup.procs\" && exec setpriv --reuid={UID} --regid={UID} --clear-groups -- \
         env XDG_RUNTIME_DIR=\"$1\" \"$2\""
    );
    let mut c = tokio::process::Command::new("unshare");
    c.args(["-p", "-f", "--mount-proc", "sh", "-c"])
        .arg("echo \"$0\" > /proc/sys/kernel/ns_last_pid && sh -c \"$1\" \"$2\" \"$3\" \"$4\"; exit $?")
        .arg((n - 1).to_string())
        .arg(inner)
        .arg(&login)
        .arg(&m.runtime)
        .arg(executor_bin_for_any_user());
    let c = Client::spawn(c, ClientOptions::default())
        .await
        .expect("agent");
    let p = params(
        &["sh", "-c", "echo $PPID; cat /proc/self/cgroup"],
        JobLimits::default(),
        None,
    );
    let (_, out, _) = run(&c, &p).await.unwrap();
    let mech = mechanisms(&c).await;
    assert_eq!(cgroup_of(n), before, "the user's other process was moved");
    assert!(
        scopes_in(&m.trees[0]).is_empty(),
        "no scope for an agent of another PID namespace: {out}"
    );
    assert!(!mech.contains(&"cgroup_v2".to_string()), "{mech:?}");
    drop(c);
    let _ = victim.kill();
    let _ = victim.wait();
}

/// A number no other test of this run has.
fn unique() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}
