//! The spawner's namespace pool against the host's mounts: a job that
//! gets a set made ahead sees the host's mount table as it is when the
//! job starts, never as it was when the set was made (a mount namespace
//! copied ahead was such a stale table: a read-only remount, a cover or an
//! unmount made on the host meanwhile did not reach it; found by a review
//! of the pool, so mount namespaces are never made ahead). Each case runs
//! with the agent as root and as an unprivileged user (65534 via setpriv);
//! they change the host's mounts, so they need root (the escape suite's
//! unprivileged run, `sandbox::`, does not include them). A job with
//! `network: "allow"` (no set of the pool) is the control.

use executor_client::{Client, ClientOptions};
use executor_protocol::types::exec::ExecCommandParams;
use executor_protocol::types::process::ProcessStartParams;
use executor_protocol::types::sandbox::{
    FilesystemIntent, NetworkIntent, ReadRoots, SandboxIntent,
};
use executor_tests::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

struct Env {
    c: Client,
    uid: u32,
}

fn is_root() -> bool {
    current_uid() == 0
}

async fn env(unprivileged: bool) -> Env {
    let (mut cmd, uid) = agent_command(unprivileged);
    cmd.current_dir("/");
    let c = Client::spawn(cmd, ClientOptions::default())
        .await
        .expect("agent");
    let probe = c
        .start(&ProcessStartParams::new(
            vec!["true".into()],
            "/",
            path_env(),
        ))
        .await
        .unwrap();
    probe.wait().await.unwrap();
    Env { c, uid }
}

fn intent(write: &[&Path], net: NetworkIntent) -> SandboxIntent {
    SandboxIntent {
        filesystem: FilesystemIntent {
            read: ReadRoots::All,
            write: write.iter().map(|p| wire_path(p)).collect(),
            ..Default::default()
        },
        network: net,
        required: true,
        workspace_roots: None,
    }
}

impl Env {
    async fn sh(&self, i: SandboxIntent, script: &str) -> (String, i32) {
        let p = ExecCommandParams {
            command: vec!["/bin/sh".into(), "-c".into(), script.into()],
            cwd: wire_path(Path::new("/")),
            env: path_env(),
            tty: false,
            yield_time_ms: 30_000,
            max_output_tokens: 100_000,
            sandbox_permissions: Some(i),
            additional_permissions: None,
            additional_permissions_preapproved: false,
            justification: None,
            exec_approval_requirement: None,
            env_base: Default::default(),
            limits: None,
        };
        let r = self.c.call(&p).await.expect("exec_command");
        (r.output, r.exit_code.unwrap_or(-1))
    }

    /// One job with a network namespace of its own: the spawner refills
    /// its pool after it; then time for the maker.
    async fn fill_pool(&self) {
        let (out, code) = self.sh(intent(&[], NetworkIntent::Deny), "true").await;
        assert_eq!(code, 0, "{out}");
        tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    }
}

fn sh_host(script: &str) {
    let st = Command::new("/bin/sh")
        .arg("-c")
        .arg(script)
        .status()
        .unwrap();
    assert!(st.success(), "host: {script}");
}

fn base(tag: &str, uid: u32) -> PathBuf {
    let b = unique_tempdir(tag);
    std::fs::set_permissions(&b, std::fs::Permissions::from_mode(0o755)).unwrap();
    for d in ["data", "outside", "vol"] {
        std::fs::create_dir_all(b.join(d)).unwrap();
    }
    std::fs::write(b.join("outside/secret"), "OUTSIDE-SECRET\n").unwrap();
    chown_r(&b, uid);
    b
}

use executor_tests::root_and_unprivileged as both;

/// A host-mount case's directory for the agent's user (root or 65534),
/// `None` (after saying so) where the test cannot change host mounts.
fn host_case(tag: &str, unpriv: bool) -> Option<PathBuf> {
    if !is_root() {
        prerequisite_missing("root (host mounts)");
        return None;
    }
    Some(base(tag, if unpriv { 65534 } else { 0 }))
}

/// `cmd`'s output in a read-all job with a fresh clone of the host's mount
/// table (network `allow`: the control) and in one whose namespaces come
/// from the pool (network `deny`).
async fn fresh_and_pooled(e: &Env, cmd: &str) -> (String, String) {
    let (fresh, _) = e.sh(intent(&[], NetworkIntent::Allow), cmd).await;
    let (pooled, _) = e.sh(intent(&[], NetworkIntent::Deny), cmd).await;
    (fresh, pooled)
}

// 1. The host makes a writable bind mount read-only (remount,bind,ro)
// after the pool was filled: a pooled job with it as a write root still
// writes through it; a fresh clone (control) gets EROFS.
both!(
    a_host_read_only_remount_holds_for_a_pooled_job,
    |unpriv: bool| async move {
        let Some(b) = host_case("atk-ro", unpriv) else {
            return;
        };
        let data = b.join("data");
        sh_host(&format!("mount --bind {0} {0}", data.display()));
        let e = env(unpriv).await;
        e.fill_pool().await;
        sh_host(&format!("mount -o remount,bind,ro {0}", data.display()));
        let host_try = Command::new("/bin/sh")
            .arg("-c")
            .arg(format!("echo x > {}/host-try", data.display()))
            .status()
            .unwrap();
        assert!(!host_try.success(), "the host's mount is read-only now");
        // Control first (network allow: a fresh clone of the current table).
        let (ctl, ctl_code) = e
            .sh(
                intent(&[&data], NetworkIntent::Allow),
                &format!("echo ctl > {}/fresh; echo rc=$?", data.display()),
            )
            .await;
        let (out, code) = e
            .sh(
                intent(&[&data], NetworkIntent::Deny),
                &format!("echo pwned > {}/pooled; echo rc=$?", data.display()),
            )
            .await;
        let pooled = std::fs::read_to_string(data.join("pooled")).ok();
        let fresh = std::fs::read_to_string(data.join("fresh")).ok();
        let _ = Command::new("umount").arg(&data).status();
        let _ = std::fs::remove_dir_all(&b);
        let _ = (ctl, ctl_code, code, e.uid);
        assert_eq!(
            fresh, None,
            "control: the fresh clone sees the read-only mount"
        );
        assert_eq!(
            pooled, None,
            "a pooled job wrote through a mount the host made read-only: {out}"
        );
    }
);

// 2. The host hides a directory under a new mount after the pool was
// filled: a pooled read-all job still reads what is beneath; a fresh
// clone (control) sees the cover.
both!(
    what_the_host_covered_since_is_covered_for_a_pooled_job,
    |unpriv: bool| async move {
        let Some(b) = host_case("atk-hide", unpriv) else {
            return;
        };
        let outside = b.join("outside");
        let e = env(unpriv).await;
        e.fill_pool().await;
        sh_host(&format!(
            "mount -t tmpfs -o mode=755 hide {}",
            outside.display()
        ));
        let (ctl, out) = fresh_and_pooled(&e, &format!("cat {}/secret", outside.display())).await;
        let _ = Command::new("umount").arg(&outside).status();
        let _ = std::fs::remove_dir_all(&b);
        assert!(!ctl.contains("OUTSIDE-SECRET"), "control: {ctl}");
        assert!(
            !out.contains("OUTSIDE-SECRET"),
            "a pooled job read what the host covered after the pool was made: {out}"
        );
    }
);

// 3. The host unmounts a filesystem after the pool was filled (a
// revoked volume): a pooled read-all job still reads it.
both!(
    a_volume_the_host_unmounted_is_gone_for_a_pooled_job,
    |unpriv: bool| async move {
        let Some(b) = host_case("atk-vol", unpriv) else {
            return;
        };
        let vol = b.join("vol");
        sh_host(&format!(
            "mount -t tmpfs -o mode=755 vol {0} && echo VOLUME-SECRET > {0}/s && chmod 644 {0}/s",
            vol.display()
        ));
        let e = env(unpriv).await;
        e.fill_pool().await;
        sh_host(&format!("umount {}", vol.display()));
        let (ctl, out) = fresh_and_pooled(&e, &format!("cat {}/s", vol.display())).await;
        let _ = std::fs::remove_dir_all(&b);
        assert!(!ctl.contains("VOLUME-SECRET"), "control: {ctl}");
        assert!(
            !out.contains("VOLUME-SECRET"),
            "a pooled job read a volume the host unmounted after the pool was made: {out}"
        );
    }
);
