//! A job's own `:tmp` (issue 29.7): whatever the job leaves in it (a tree
//! deeper than 256 levels or than PATH_MAX, directories and files with no
//! permissions, a `/tmp` it made unwritable and sticky, symlinks to the
//! host) is gone when the job ends, and what a killed agent's job left is
//! gone when the next agent of the user starts; a symlink's target
//! outside stays untouched. The layer: the agent's removal of the job's
//! directory (`executor_sandbox::tree`), at the job's end and in the sweep
//! at every start. As root and as an unprivileged user.

use executor_client::{Client, ClientOptions};
use executor_protocol::types::process::ProcessStartParams;
use executor_protocol::types::sandbox::{
    FilesystemIntent, NetworkIntent, ReadRoots, SandboxIntent,
};
use executor_tests::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Read everything, write only the job's own `:tmp`.
fn tmp_only() -> SandboxIntent {
    SandboxIntent {
        filesystem: FilesystemIntent {
            read: ReadRoots::All,
            write: vec![":tmp".into()],
            ..Default::default()
        },
        network: NetworkIntent::Deny,
        required: true,
        workspace_roots: None,
    }
}

struct Case {
    c: Client,
    uid: u32,
    base: PathBuf,
    /// A host directory with a file, for the job's symlinks to point at.
    outside: PathBuf,
}

async fn case(unprivileged: bool) -> Case {
    let base = unique_tempdir(if unprivileged {
        "jtmp-user"
    } else {
        "jtmp-root"
    });
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
    let outside = base.join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("keep"), "KEEP\n").unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (cmd, uid) = agent_command(unprivileged);
    let c = Client::spawn(cmd, ClientOptions::default())
        .await
        .expect("agent");
    Case {
        c,
        uid,
        base,
        outside,
    }
}

fn jobs_parent(uid: u32) -> PathBuf {
    std::env::temp_dir().join(format!("executor-jobs-{uid}"))
}

/// The job's directory on the host: the one of `uid`'s job directories
/// that holds `marker` (the job made it first).
async fn find_job_dir(uid: u32, marker: &str, within: Duration) -> PathBuf {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(rd) = std::fs::read_dir(jobs_parent(uid)) {
            for e in rd.flatten() {
                if e.path().join(marker).exists() {
                    return e.path();
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "no job directory with {marker} in {}",
            jobs_parent(uid).display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The agent's pid, from an unconfined job (its supervisor's spawner's
/// parent).
async fn agent_pid(e: &Case) -> u32 {
    let probe =
        e.c.start(&ProcessStartParams::new(
            vec!["sleep".into(), "0.2".into()],
            "/",
            path_env(),
        ))
        .await
        .unwrap();
    let agent = agent_of_job(probe.pid());
    probe.wait().await.unwrap();
    agent
}

/// SIGKILL to the agent while `job` runs: the job dies with it, the client
/// is dropped, and (the positive control) the job's :tmp `dir` is left.
async fn kill_the_agent_mid_job(agent: u32, job: executor_client::Process, c: Client, dir: &Path) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(
        wait_dead(job.pid(), Duration::from_secs(10)).await,
        "the job outlived its agent"
    );
    drop(job);
    drop(c);
    assert!(
        dir.is_dir(),
        "positive control: the killed agent's job left its :tmp"
    );
}

/// A job under `tmp_only()` running `perl -e script` in its `/tmp`, which
/// then says `made` and waits for its stdin to close;
/// returned once it said `made` (the positive control: the tree is
/// there), with its directory on the host.
async fn job_making(e: &Case, tag: &str, script: &str) -> (PathBuf, executor_client::Process) {
    let marker = format!("marker-{tag}-{}", std::process::id());
    let sh = format!("cd /tmp && : > {marker} && /usr/bin/perl -e '{script}' && echo made && cat");
    let mut p = ProcessStartParams::new(vec!["/bin/sh".into(), "-c".into(), sh], "/", path_env());
    p.sandbox = Some(tmp_only());
    let mut job = e.c.start(&p).await.expect("start");
    let mut out = Vec::new();
    while !String::from_utf8_lossy(&out).contains("made") {
        match job.next_output().await.unwrap() {
            Some(ch) => out.extend_from_slice(&ch.data),
            None => panic!(
                "positive control: the job did not make its tree: {} ({:?})",
                String::from_utf8_lossy(&out),
                job.exit_status()
            ),
        }
    }
    let dir = find_job_dir(e.uid, &marker, Duration::from_secs(10)).await;
    (dir, job)
}

/// Let the job end (status 0).
async fn end(job: executor_client::Process) {
    job.close_stdin().await.unwrap();
    let st = job.wait().await.unwrap();
    assert_eq!(st.code, Some(0), "the job ended well");
}

fn gone(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_err()
}

fn outside_intact(e: &Case) {
    let m = std::fs::metadata(&e.outside).expect("the link target outside stays");
    assert_eq!(
        m.mode() & 0o7777,
        0o755,
        "the link target's mode is untouched"
    );
    assert_eq!(
        std::fs::read_to_string(e.outside.join("keep")).unwrap(),
        "KEEP\n",
        "the link target's file stays"
    );
}

/// Perl: `n` nested `d` directories from the cwd, ending in the deepest.
fn descend(n: usize) -> String {
    format!("for (1..{n}) {{ mkdir q(d) or die qq(mkdir: $!); chdir q(d) or die qq(chdir: $!) }}")
}

/// Perl: back up `n` levels.
fn up(n: usize) -> String {
    format!("for (1..{n}) {{ chdir q(..) or die qq(up: $!) }}")
}

async fn removed_at_the_end(e: &Case, tag: &str, script: &str) {
    let (dir, job) = job_making(e, tag, script).await;
    assert!(
        dir.is_dir(),
        "positive control: the job's :tmp is there while it runs"
    );
    end(job).await;
    assert!(
        gone(&dir),
        "{tag}: the job's :tmp {} outlived its job (the agent's removal at the job's end)",
        dir.display()
    );
    outside_intact(e);
}

// The tree: 300 levels, a mode-000 directory at the bottom.
root_and_unprivileged!(
    deeper_than_256_with_a_locked_bottom,
    |unprivileged: bool| async move {
        let e = case(unprivileged).await;
        let s = format!("{}; mkdir q(locked), 0 or die", descend(300));
        removed_at_the_end(&e, "bottom", &s).await;
    }
);

// A mode-000 directory in the middle of a deep tree (its subtree below),
// a file with no permissions in a read-only directory, and symlinks to a
// host directory and file (their targets stay, mode and content).
root_and_unprivileged!(
    locked_middle_unreadable_file_and_links_out,
    |unprivileged: bool| async move {
        let e = case(unprivileged).await;
        let o = e.outside.display();
        let s = format!(
            "symlink q({o}), q(out) or die; {}; symlink q({o}/keep), q(kf) or die; \
             open(my $f, q(>), q(nothing)) or die; close $f; chmod 0, q(nothing) or die; \
             mkdir q(ro) or die; symlink q({o}), q(ro/out) or die; chmod 0500, q(ro) or die; \
             {}; {}; chmod 0, q(d) or die",
            descend(300),
            up(150),
            up(1)
        );
        removed_at_the_end(&e, "middle", &s).await;
    }
);

// Deeper than PATH_MAX (5000 levels of `d/`: 10,000 bytes), every tenth
// level locked from the bottom up.
root_and_unprivileged!(deeper_than_path_max, |unprivileged: bool| async move {
    let e = case(unprivileged).await;
    let s = format!(
        "{}; for my $i (1..5000) {{ chdir q(..) or die; chmod 0, q(d) or die if $i % 10 == 0 }}",
        descend(5000)
    );
    removed_at_the_end(&e, "pathmax", &s).await;
});

// A variant: every level of a 400-level chain locked (mode 000 from the
// bottom up), a FIFO, names with a newline and a non-UTF-8 byte, a
// symlink loop, and the job's /tmp itself made unwritable and sticky.
root_and_unprivileged!(
    every_level_locked_odd_names_and_a_sticky_readonly_tmp,
    |unprivileged: bool| async move {
        let e = case(unprivileged).await;
        let s = format!(
            "use POSIX; mkfifo(q(fifo), 0) or die; mkdir qq(new\\nline) or die; \
             mkdir qq(\\xff\\xfe) or die; open(my $f, q(>), qq(\\xff\\xfe/x\\ny)) or die; close $f; \
             symlink q(loop), q(loop) or die; {}; \
             for (1..400) {{ chdir q(..) or die; chmod 0, q(d) or die }}; \
             chmod 01555, q(.) or die",
            descend(400)
        );
        removed_at_the_end(&e, "sticky", &s).await;
    }
);

// An agent killed mid-job leaves the job's :tmp (deep, locked at the
// bottom and in the middle, /tmp sticky and read-only); the next agent of
// the same user removes it when it starts.
root_and_unprivileged!(
    the_sweep_after_a_killed_agent_removes_it,
    |unprivileged: bool| async move {
        let e = case(unprivileged).await;
        let s = format!(
            "{}; mkdir q(locked), 0 or die; {}; chmod 0, q(d) or die; {}; chmod 01555, q(.) or die",
            descend(1200),
            up(600),
            up(600)
        );
        let agent = agent_pid(&e).await;
        let (dir, job) = job_making(&e, "sweep", &s).await;
        kill_the_agent_mid_job(agent, job, e.c, &dir).await;
        let (cmd, _) = agent_command(unprivileged);
        // The sweep runs before the agent answers `initialize`.
        let next = Client::spawn(cmd, ClientOptions::default())
            .await
            .expect("agent");
        assert!(
            gone(&dir),
            "the killed agent's job's :tmp {} survived the next agent's start (the sweep)",
            dir.display()
        );
        let m = std::fs::metadata(&e.outside).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o755);
        drop(next);
    }
);

// A variant: a mount inside a job's :tmp (the host's root bound a
// directory there while the job ran). The removal never crosses into it
// (the mounted files stay), removes everything else, logs and leaves the
// mount point; once it is unmounted, the sweep at the next job's end
// removes what was left.
root_and_unprivileged!(
    never_crosses_a_mount_and_retries_later,
    |unprivileged: bool| async move {
        if current_uid() != 0 {
            return prerequisite_missing("root (to bind-mount into a job's :tmp)");
        }
        let e = case(unprivileged).await;
        let mounted = e.base.join("mounted");
        std::fs::create_dir(&mounted).unwrap();
        std::fs::write(mounted.join("precious"), "P\n").unwrap();
        let s = format!(
            "mkdir q(mnt) or die; {}; mkdir q(locked), 0 or die",
            descend(300)
        );
        let (dir, job) = job_making(&e, "mount", &s).await;
        let mnt = dir.join("mnt");
        let st = std::process::Command::new("mount")
            .arg("--bind")
            .arg(&mounted)
            .arg(&mnt)
            .status()
            .expect("mount");
        assert!(st.success(), "mount --bind");
        end(job).await;
        let umount = || {
            std::process::Command::new("umount")
                .arg(&mnt)
                .status()
                .expect("umount")
        };
        let crossed = !mounted.join("precious").exists();
        let left = (dir.join("mnt").is_dir(), gone(&dir.join("d")));
        let st = umount();
        assert!(
            !crossed,
            "the removal crossed into a mount inside the job's :tmp"
        );
        assert!(st.success(), "umount");
        assert_eq!(
            left,
            (true, true),
            "the mount point stays, the rest of the tree is removed"
        );
        // Another job's end sweeps again.
        let mut p = ProcessStartParams::new(vec!["true".into()], "/", path_env());
        p.sandbox = Some(tmp_only());
        e.c.start(&p).await.unwrap().wait().await.unwrap();
        assert!(
            gone(&dir),
            "what a job left is removed by the sweep at a later job's end"
        );
        assert_eq!(
            std::fs::read_to_string(mounted.join("precious")).unwrap(),
            "P\n"
        );
    }
);

// A wide directory: 20,000 non-empty subdirectories side by side (made in
// a second or two). Their removal must take time linear in what the job
// left: a removal that read the directory again after each subdirectory
// it emptied took 318 s for this tree (N²/2 entries read), holding the
// job's `process/exited` (and, in a sweep, the jobs' lock) all along.
root_and_unprivileged!(
    a_wide_directory_is_removed_in_linear_time,
    |unprivileged: bool| async move {
        let e = case(unprivileged).await;
        let s = "mkdir q(w) or die; for my $i (1..20000) { mkdir qq(w/$i) or die; mkdir qq(w/$i/x) or die }";
        let (dir, job) = job_making(&e, "wide", s).await;
        assert!(
            dir.join("w/20000/x").is_dir(),
            "positive control: the wide tree is there"
        );
        let t = Instant::now();
        job.close_stdin().await.unwrap();
        let st = tokio::time::timeout(Duration::from_secs(60), job.wait())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "the job's end took over 60 s: the agent's removal of its :tmp (20,000 \
                     non-empty subdirectories) is not linear"
                )
            })
            .unwrap();
        assert_eq!(st.code, Some(0));
        assert!(
            gone(&dir),
            "the wide :tmp {} outlived its job",
            dir.display()
        );
        eprintln!("removed in {:?}", t.elapsed());
        outside_intact(&e);
    }
);

// A variant of the sweep: the job took every permission away from its own
// `/tmp` (the top of its directory on the host), then its agent was
// killed. The next agent's sweep could not open it to test its lock (as
// an unprivileged user: EACCES) and skipped it silently, for ever.
root_and_unprivileged!(
    the_sweep_removes_a_tmp_whose_top_is_mode_000,
    |unprivileged: bool| async move {
        let e = case(unprivileged).await;
        let s = format!(
            "{}; mkdir q(locked), 0 or die; {}; chmod 0, q(.) or die",
            descend(20),
            up(20)
        );
        let agent = agent_pid(&e).await;
        let (dir, job) = job_making(&e, "top000", &s).await;
        assert_eq!(
            std::fs::metadata(&dir).unwrap().mode() & 0o777,
            0,
            "positive control: the job's :tmp top is mode 000"
        );
        kill_the_agent_mid_job(agent, job, e.c, &dir).await;
        let (cmd, _) = agent_command(unprivileged);
        let next = Client::spawn(cmd, ClientOptions::default())
            .await
            .expect("agent");
        assert!(
            gone(&dir),
            "the killed agent's job's :tmp {} (its top mode 000) survived the next agent's \
             start (the sweep could not open it to test its lock)",
            dir.display()
        );
        drop(next);
    }
);

// Its control: a live job's mode-000 `/tmp` is left to it by another
// agent's sweep (the lock is held), its mode put back as the job set it.
root_and_unprivileged!(
    the_sweep_leaves_a_live_jobs_mode_000_tmp_as_it_was,
    |unprivileged: bool| async move {
        let e = case(unprivileged).await;
        let (dir, job) = job_making(&e, "live000", "mkdir q(x) or die; chmod 0, q(.) or die").await;
        let (cmd, _) = agent_command(unprivileged);
        let next = Client::spawn(cmd, ClientOptions::default())
            .await
            .expect("agent");
        let m = std::fs::metadata(&dir).expect("a live job's :tmp stays through a sweep");
        assert_eq!(
            m.mode() & 0o7777,
            0,
            "the live job's :tmp keeps the mode it set"
        );
        assert!(
            dir.join("x").is_dir(),
            "the live job's :tmp keeps what it holds"
        );
        drop(next);
        end(job).await;
        assert!(gone(&dir), "removed at the job's end");
    }
);
