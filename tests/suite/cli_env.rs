//! `run`'s environment and working directory (issue 33, item 3): one rule
//! for sandboxed and unsandboxed jobs, as `ssh host CMD` gives them (the
//! host user's login environment, the home directory), nothing of the
//! client's environment, and the login shell run once for many local
//! runs (the agent's disk cache), locally and over a real sshd.

use executor_tests::cli::*;
use executor_tests::*;
use std::os::unix::fs::PermissionsExt;

/// A private (0700) directory for `XDG_RUNTIME_DIR`: the local agent's
/// login-environment cache and session sockets, apart from other tests'.
fn private_runtime(tag: &str) -> std::path::PathBuf {
    let d = unique_tempdir(tag);
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

/// `pwd` and the sorted environment of a job, without the variables that
/// differ per connection (SSH_CONNECTION, SSH_CLIENT: the client's port).
fn job_view(via: &Via, runtime: &std::path::Path, flags: &[&str]) -> (String, Vec<String>) {
    let mut args = vec!["run"];
    args.extend_from_slice(flags);
    args.extend(["--", "sh", "-c", "pwd; env"]);
    let out = via
        .cmd(&args)
        .env("XDG_RUNTIME_DIR", runtime)
        .env("EXECUTOR_TEST_CLIENT_ONLY", "leaked")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{} {flags:?}: {}",
        via.name(),
        text(&out)
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = stdout.lines();
    let pwd = lines.next().unwrap_or_default().to_string();
    let mut env: Vec<String> = lines
        .filter(|l| !l.starts_with("SSH_CONNECTION=") && !l.starts_with("SSH_CLIENT="))
        .map(str::to_string)
        .collect();
    env.sort();
    (pwd, env)
}

#[test]
fn sandboxed_and_unsandboxed_runs_see_one_environment_and_cwd_and_nothing_of_the_client() {
    for via in Via::both() {
        let runtime = private_runtime("env-rule");
        // Sandboxed first: its login shell runs inside its sandbox (and is
        // not cached on disk); then the unconfined one runs its own.
        let boxed = job_view(&via, &runtime, &["--net", "deny"]);
        let plain = job_view(&via, &runtime, &[]);
        assert_eq!(boxed, plain, "{}", via.name());
        let (pwd, env) = plain;
        let home = env
            .iter()
            .find_map(|l| l.strip_prefix("HOME="))
            .unwrap_or_else(|| panic!("{}: no HOME in {env:?}", via.name()));
        assert_eq!(pwd, home, "{}: the home directory is the cwd", via.name());
        assert!(env.contains(&format!("PWD={home}")), "{env:?}");
        for line in &env {
            assert!(
                !line.contains("EXECUTOR_TEST_CLIENT_ONLY") && !line.contains("executor-client"),
                "{}: the client's environment reached the job: {line}",
                via.name()
            );
        }
        // --cwd and --env still win, sandboxed or not.
        for flags in [&[][..], &["--net", "deny"][..]] {
            let mut args = vec!["run", "--cwd", "/tmp", "--env", "PWD=/x", "--env", "K=v"];
            args.extend_from_slice(flags);
            args.extend(["--", "sh", "-c", "echo $(pwd) $K"]);
            let out = via.output(&args);
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                "/tmp v\n",
                "{}",
                text(&out)
            );
        }
    }
}

#[test]
fn a_second_local_run_reads_the_login_environment_from_the_cache() {
    let runtime = private_runtime("env-cache");
    let run = || {
        Via::Local
            .cmd(&["-v", "run", "--", "sh", "-c", "echo $HOME"])
            .env("XDG_RUNTIME_DIR", &runtime)
            .output()
            .unwrap()
    };
    let (first, second) = (run(), run());
    for out in [&first, &second] {
        assert!(out.status.success(), "{}", text(out));
    }
    assert_eq!(first.stdout, second.stdout);
    let (first, second) = (
        String::from_utf8_lossy(&first.stderr),
        String::from_utf8_lossy(&second.stderr),
    );
    assert!(first.contains("login-shell environment taken"), "{first}");
    assert!(
        second.contains("login-shell environment read from the cache")
            && !second.contains("login-shell environment taken"),
        "the second run ran the login shell again: {second}"
    );
    // The cache is the user's alone.
    let mode = std::fs::read_dir(runtime.join("executor"))
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with("login-env-"))
        .expect("a cache file")
        .metadata()
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "{mode:o}");
    // Another starting environment (the locale sshd passes) is another
    // key; a snapshot older than its 5 minutes is not used.
    let out = Via::Local
        .cmd(&["-v", "run", "--", "true"])
        .env("XDG_RUNTIME_DIR", &runtime)
        .env("LC_MESSAGES", "C")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("login-shell environment taken"), "{err}");
    let cache_file = |runtime: &std::path::Path| {
        std::fs::read_dir(runtime.join("executor"))
            .unwrap()
            .flatten()
            .find(|e| e.file_name().to_string_lossy().starts_with("login-env-"))
            .expect("a cache file")
    };
    let stale = cache_file(&runtime).path();
    let taken = run();
    assert!(
        String::from_utf8_lossy(&taken.stderr).contains("login-shell environment taken"),
        "the LC_MESSAGES snapshot replaced this one"
    );
    std::fs::File::options()
        .append(true)
        .open(&stale)
        .unwrap()
        .set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(301))
        .unwrap();
    let out = run();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("login-shell environment taken"), "{err}");
    let cache = cache_file(&runtime);
    // A cache file another hand made readable to others is not used.
    std::fs::set_permissions(cache.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    let third = run();
    let third = String::from_utf8_lossy(&third.stderr);
    assert!(third.contains("login-shell environment taken"), "{third}");
}

/// Removes the login file it names (and the marker) when dropped.
struct LoginFile(Vec<std::path::PathBuf>);
impl Drop for LoginFile {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// A user's login file runs inside a sandboxed job's sandbox (it cannot
/// write what the job cannot), and unconfined for an unconfined job; its
/// environment reaches both. The user is `executor-ci` (`.ci/run` makes
/// it): its `~/.bash_profile` exists only during this test.
#[tokio::test]
async fn a_sandboxed_jobs_login_files_run_inside_its_sandbox() {
    use executor_client::protocol::types::process::{EnvBase, ProcessStartParams};
    let user = nix::unistd::User::from_name("executor-ci").ok().flatten();
    let (Some(user), 0) = (user, current_uid()) else {
        prerequisite_missing("root and the user executor-ci (.ci/run makes it)");
        return;
    };
    let marker = user.dir.join("executor-login-wrote");
    let profile = user.dir.join(".bash_profile");
    let _cleanup = LoginFile(vec![profile.clone(), marker.clone()]);
    let _ = std::fs::remove_file(&marker);
    std::fs::write(
        &profile,
        format!(
            ". ~/.profile 2>/dev/null; touch {} 2>/dev/null; export EXECUTOR_LOGIN_MARK=seen\n",
            marker.display()
        ),
    )
    .unwrap();
    nix::unistd::chown(&profile, Some(user.uid), Some(user.gid)).unwrap();
    let agent = || {
        let mut cmd = tokio::process::Command::new("setpriv");
        cmd.arg(format!("--reuid={}", user.uid))
            .arg(format!("--regid={}", user.gid))
            .args(["--clear-groups", "--"])
            .arg(executor_bin_for_any_user())
            .current_dir("/")
            .env_remove("XDG_RUNTIME_DIR");
        executor_client::Client::spawn(cmd, Default::default())
    };
    let job = |sandboxed: bool| {
        let mut p = ProcessStartParams::new(
            vec![
                "/bin/sh".into(),
                "-c".into(),
                "printf %s \"$EXECUTOR_LOGIN_MARK\"".into(),
            ],
            "/tmp",
            Default::default(),
        );
        p.env_base = EnvBase::Login;
        if sandboxed {
            p.sandbox = Some(
                executor_client::sandbox::Intent::new()
                    .write("/tmp")
                    .build(),
            );
        }
        p
    };
    async fn output(c: &executor_client::Client, p: &ProcessStartParams) -> String {
        let mut job = c.start(p).await.unwrap();
        let mut out = Vec::new();
        while let Some(chunk) = job.next_output().await.unwrap() {
            out.extend_from_slice(&chunk.data);
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    let c = agent().await.unwrap();
    assert_eq!(output(&c, &job(true)).await, "seen");
    assert!(
        !marker.exists(),
        "the login file wrote outside the job's sandbox"
    );
    c.close().await.unwrap();
    let c = agent().await.unwrap();
    assert_eq!(output(&c, &job(false)).await, "seen");
    assert!(
        marker.exists(),
        "the control: unconfined, the login file writes"
    );
    c.close().await.unwrap();
}
