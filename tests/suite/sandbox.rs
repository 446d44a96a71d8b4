//! The sandbox escape suite (shared/SANDBOX_TESTS.md), through the real
//! `executor` binary. Every denial has its positive control; every case
//! runs twice: with the agent as root and as an unprivileged user (when the
//! tests run as root, the agent is started under uid/gid 65534 with
//! `setpriv`; otherwise both runs use the current user).
//!
//! Expected errnos name the layer: EPERM (1) seccomp, EACCES (13) Landlock,
//! EROFS (30) the read-only mount, EXDEV (18) a link across bind mounts.

use executor_client::{Client, ClientOptions, ErrorCode};
use executor_protocol::types::exec::ExecCommandParams;
use executor_protocol::types::process::ProcessStartParams;
use executor_protocol::types::sandbox::{
    FilesystemIntent, NetworkIntent, ReadRoots, SandboxIntent,
};
use executor_tests::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

const EPERM: &str = "errno=1";
const EACCES: &str = "errno=13";
const ESRCH: &str = "errno=3";

fn is_root() -> bool {
    current_uid() == 0
}

/// `cc -O1` of `src` (below the crate) into `out_name` next to the
/// `executor` binary, executable by any user.
fn compile_for_any_user(out_name: &str, src: &str, what: &str) -> PathBuf {
    let dir = executor_bin_for_any_user().parent().unwrap().to_path_buf();
    let out = dir.join(out_name);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(src);
    let st = std::process::Command::new("cc")
        .arg("-O1")
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status()
        .expect("cc");
    assert!(st.success(), "compiling the {what} helper");
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o755)).unwrap();
    out
}

/// The hostile helper, compiled once, executable by any user.
fn hostile() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| compile_for_any_user("hostile", "hostile/hostile.c", "hostile"))
        .clone()
}

struct Env {
    c: Client,
    base: PathBuf,
    ws: PathBuf,
    outside: PathBuf,
    uid: u32,
    agent_pid: u32,
}

async fn env(unprivileged: bool, hook_abi: Option<u32>) -> Env {
    let base = unique_tempdir(if unprivileged { "sbx-user" } else { "sbx-root" });
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
    let ws = base.join("ws");
    let outside = base.join("outside");
    for d in ["ws/src", "ws/.git/hooks", "ws/secrets", "outside/sub"] {
        std::fs::create_dir_all(base.join(d)).unwrap();
    }
    std::fs::write(ws.join("src/main.rs"), "fn main() {}\n").unwrap();
    std::fs::write(ws.join(".git/config"), "[core]\n").unwrap();
    std::fs::write(ws.join("secrets/key"), "TOPSECRET\n").unwrap();
    std::fs::write(outside.join("f"), "outside\n").unwrap();
    std::fs::write(outside.join("secret"), "OUTSIDE-SECRET\n").unwrap();
    std::os::unix::fs::symlink("../.git/config", ws.join("src/link-to-git-config")).unwrap();
    std::os::unix::fs::symlink("../secrets/key", ws.join("src/link-to-key")).unwrap();
    let (mut cmd, uid) = agent_command(unprivileged);
    if uid != current_uid() {
        chown_r(&base, uid);
    }
    if let Some(abi) = hook_abi {
        cmd.env("EXECUTOR_TEST_LANDLOCK_ABI", abi.to_string());
    }
    let c = Client::spawn(cmd, ClientOptions::default())
        .await
        .expect("agent");
    // The agent's pid: above a job's supervisor and the spawner (a job
    // that runs until it is killed: a short one could end, under a loaded
    // suite, before its parents are read).
    let probe = c
        .start(&ProcessStartParams::new(
            vec!["sleep".into(), "60".into()],
            "/",
            path_env(),
        ))
        .await
        .unwrap();
    let agent_pid = executor_tests::agent_of_job(probe.pid());
    probe
        .signal(executor_protocol::types::process::SignalName::Kill)
        .await
        .unwrap();
    probe.wait().await.unwrap();
    Env {
        c,
        base,
        ws,
        outside,
        uid,
        agent_pid,
    }
}

use executor_tests::parent_pid as ppid;

/// `exec_command` params for `command` in `cwd` under `intent`.
fn exec_params(
    command: Vec<String>,
    cwd: &Path,
    intent: Option<SandboxIntent>,
) -> ExecCommandParams {
    ExecCommandParams {
        command,
        cwd: wp(cwd),
        env: path_env(),
        tty: false,
        yield_time_ms: 30_000,
        max_output_tokens: 100_000,
        sandbox_permissions: intent,
        additional_permissions: None,
        additional_permissions_preapproved: false,
        justification: None,
        exec_approval_requirement: None,
        env_base: Default::default(),
        limits: None,
    }
}

use executor_tests::wire_path as wp;

impl Env {
    /// Read everything, write the workspace, no network.
    fn ws_write(&self) -> SandboxIntent {
        SandboxIntent {
            filesystem: FilesystemIntent {
                read: ReadRoots::All,
                write: vec![wp(&self.ws)],
                ..Default::default()
            },
            network: NetworkIntent::Deny,
            required: true,
            workspace_roots: None,
        }
    }

    async fn sh(&self, intent: Option<SandboxIntent>, script: &str) -> (String, i32) {
        let p = exec_params(
            vec!["/bin/sh".into(), "-c".into(), script.into()],
            &self.ws,
            intent,
        );
        let r = self.c.call(&p).await.expect("exec_command");
        (r.output, r.exit_code.expect("finished"))
    }

    /// Run the hostile helper with `args`; its one-line verdict.
    async fn hostile(&self, intent: Option<SandboxIntent>, args: &str) -> String {
        let (out, _) = self
            .sh(intent, &format!("{} {args}", hostile().display()))
            .await;
        out.trim().to_string()
    }
}

macro_rules! both {
    ($name:ident, $body:expr) => {
        mod $name {
            use super::*;
            #[tokio::test]
            async fn as_root_or_self() {
                let e = env(false, None).await;
                ($body)(e).await;
            }
            #[tokio::test]
            async fn as_unprivileged_user() {
                let e = env(true, None).await;
                ($body)(e).await;
            }
        }
    };
}

// 1. Reads outside every read root: not there (the job's root is built
// from the grants: ENOENT from the mount namespace), for cat and stat alike.
both!(c01_read_outside_read_roots, |e: Env| async move {
    let mut i = e.ws_write();
    i.filesystem.read = ReadRoots::Paths(vec!["/usr".into(), wp(&e.ws)]);
    for cmd in ["cat", "stat"] {
        let (out, code) = e
            .sh(
                Some(i.clone()),
                &format!("{cmd} {}/secret", e.outside.display()),
            )
            .await;
        assert_ne!(code, 0);
        assert!(out.contains("No such file or directory"), "{cmd}: {out}");
    }
    let (out, code) = e.sh(Some(i.clone()), "cat /etc/hostname").await;
    assert_ne!(code, 0, "/etc was not granted: {out}");
    let (out, code) = e.sh(Some(i), "cat src/main.rs").await;
    assert_eq!(
        (out.as_str(), code),
        ("fn main() {}\n", 0),
        "positive control"
    );
});

// 2 + 3. Writes, truncation and namespace changes under a read-only root:
// EROFS (mount); all succeed in the writable root.
both!(c02_c03_writes_under_read_only_roots, |e: Env| async move {
    let o = e.outside.display();
    for op in [
        format!("echo x > {o}/f"),
        format!(": > {o}/f"),
        format!("truncate -s 0 {o}/f"),
        format!("touch {o}/new"),
        format!("rm {o}/f"),
        format!("mkdir {o}/d"),
        format!("mkfifo {o}/fifo"),
        format!("ln -s x {o}/l"),
        format!("mv {o}/f {o}/g"),
        format!("chmod 777 {o}/f"),
    ] {
        let (out, code) = e.sh(Some(e.ws_write()), &op).await;
        assert_ne!(code, 0, "{op} must fail: {out}");
        assert!(out.contains("Read-only file system"), "{op}: {out}");
    }
    assert_eq!(
        std::fs::read_to_string(e.outside.join("f")).unwrap(),
        "outside\n"
    );
    let (out, code) = e
        .sh(
            Some(e.ws_write()),
            "echo x > f && : > f && truncate -s 0 f && touch n && rm n && mkdir d && mkfifo p && ln -s x l && mv f g && chmod 600 g && echo done",
        )
        .await;
    assert_eq!((out.trim(), code), ("done", 0), "positive control");
});

// 4. deny_read inside a readable root: hidden.
both!(c04_deny_read_carve_out, |e: Env| async move {
    let mut i = e.ws_write();
    i.filesystem.deny_read = vec![wp(&e.ws.join("secrets"))];
    for op in ["cat secrets/key", "ls secrets", "cat src/link-to-key"] {
        let (out, code) = e.sh(Some(i.clone()), op).await;
        assert_ne!(code, 0, "{op}: {out}");
        assert!(!out.contains("TOPSECRET"), "{op}: {out}");
    }
    let (out, code) = e.sh(Some(i), "cat src/main.rs").await;
    assert_eq!((out.as_str(), code), ("fn main() {}\n", 0));
});

// 5. A writable sub-path under a read-only parent.
both!(c05_writable_sub_path, |e: Env| async move {
    let mut i = e.ws_write();
    i.filesystem.write = vec![wp(&e.outside.join("sub"))];
    let o = e.outside.display();
    let (out, code) = e
        .sh(
            Some(i.clone()),
            &format!("echo y > {o}/sub/x && cat {o}/sub/x"),
        )
        .await;
    assert_eq!((out.as_str(), code), ("y\n", 0));
    let (out, code) = e.sh(Some(i), &format!("echo y > {o}/y")).await;
    assert_ne!(code, 0);
    assert!(out.contains("Read-only"), "{out}");
});

// 6 + 7. deny_write inside the writable root, also through a symlink.
both!(c06_c07_deny_write_and_symlinks, |e: Env| async move {
    let mut i = e.ws_write();
    i.filesystem.deny_write = vec![wp(&e.ws.join(".git"))];
    for op in [
        "echo x >> .git/config",
        "touch .git/hooks/x",
        "echo x > src/link-to-git-config",
        "rm .git/config",
    ] {
        let (out, code) = e.sh(Some(i.clone()), op).await;
        assert_ne!(code, 0, "{op}: {out}");
        assert!(out.contains("Read-only"), "{op}: {out}");
    }
    assert_eq!(
        std::fs::read_to_string(e.ws.join(".git/config")).unwrap(),
        "[core]\n"
    );
    let (out, code) = e
        .sh(
            Some(i),
            "echo ok > src/new && cat .git/config && cat src/new",
        )
        .await;
    assert_eq!(
        (out.as_str(), code),
        ("[core]\nok\n", 0),
        "reads of .git and writes to src work"
    );
});

// 9 + 10. Links and moves across the boundary.
both!(c09_c10_hard_links_and_moves, |e: Env| async move {
    let mut i = e.ws_write();
    i.filesystem.deny_write = vec![wp(&e.ws.join(".git"))];
    let o = e.outside.display();
    for op in [
        "ln .git/config src/hardlink".to_string(),
        format!("ln src/main.rs {o}/hardlink"),
        format!("mv src/main.rs {o}/moved"),
        format!("ln {o}/f src/hl-from-outside"),
    ] {
        let (out, code) = e.sh(Some(i.clone()), &op).await;
        assert_ne!(code, 0, "{op}: {out}");
    }
    assert!(e.ws.join("src/main.rs").exists());
    let (_, code) = e
        .sh(Some(i), "ln src/main.rs src/hl && mv src/hl src/hl2")
        .await;
    assert_eq!(code, 0, "positive control");
});

// 11. /proc/self/root and /proc/1/root lead nowhere new.
both!(c11_proc_root_paths, |e: Env| async move {
    let mut i = e.ws_write();
    i.filesystem.deny_read = vec![wp(&e.ws.join("secrets"))];
    let key = e.ws.join("secrets/key");
    for op in [
        format!("cat /proc/self/root{}", key.display()),
        format!("cat /proc/1/root{}", key.display()),
        format!("echo x > /proc/1/root{}/f", e.outside.display()),
    ] {
        let (out, code) = e.sh(Some(i.clone()), &op).await;
        assert_ne!(code, 0, "{op}: {out}");
        assert!(!out.contains("TOPSECRET"));
    }
    assert_eq!(
        std::fs::read_to_string(e.outside.join("f")).unwrap(),
        "outside\n"
    );
});

// 12, 14, 15. Only fds 0-2; no_new_privs, seccomp, no capabilities; a
// setuid binary does not elevate.
both!(c12_c14_c15_process_state, |e: Env| async move {
    // The shell's own fds (no pipeline: its pipe would show up while `ls`
    // runs).
    let (out, _) = e.sh(Some(e.ws_write()), "ls /proc/$$/fd").await;
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        vec!["0", "1", "2"],
        "{out}"
    );
    let (out, _) = e
        .sh(
            Some(e.ws_write()),
            "grep -E '^(NoNewPrivs|Seccomp|CapEff|CapPrm|CapBnd):' /proc/self/status",
        )
        .await;
    assert!(out.contains("NoNewPrivs:\t1"), "{out}");
    assert!(out.contains("Seccomp:\t2"), "{out}");
    assert!(out.contains("CapEff:\t0000000000000000"), "{out}");
    assert!(out.contains("CapPrm:\t0000000000000000"), "{out}");
    assert!(out.contains("CapBnd:\t0000000000000000"), "{out}");
    // A setuid-root copy of `id`: stays the agent's uid.
    let suid = e.base.join("suid-id");
    std::fs::copy("/usr/bin/id", &suid).unwrap();
    if is_root() {
        let _ = std::process::Command::new("chown")
            .arg("0:0")
            .arg(&suid)
            .status();
    }
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let (out, _) = e
        .sh(Some(e.ws_write()), &format!("{} -u", suid.display()))
        .await;
    assert_eq!(out.trim(), e.uid.to_string());
});

// 16-19. Network deny: TCP, /dev/tcp, UDP, other families; socketpair works.
both!(c16_c19_network_deny, |e: Env| async move {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    assert_eq!(
        e.hostile(None, &format!("connect {port}")).await,
        "ok",
        "positive control"
    );
    assert_eq!(
        e.hostile(Some(e.ws_write()), &format!("connect {port}"))
            .await,
        EPERM
    );
    let (out, code) = e
        .sh(
            Some(e.ws_write()),
            &format!("bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}' 2>&1"),
        )
        .await;
    assert_ne!(code, 0, "{out}");
    let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let uport = u.local_addr().unwrap().port();
    assert_eq!(e.hostile(None, &format!("udp {uport}")).await, "ok");
    assert_eq!(
        e.hostile(Some(e.ws_write()), &format!("udp {uport}")).await,
        EPERM
    );
    assert_eq!(
        e.hostile(Some(e.ws_write()), "udp 53").await,
        EPERM,
        "no DNS"
    );
    for (fam, ty, proto) in [(10, 1, 0), (17, 3, 0), (16, 3, 0), (2, 3, 1)] {
        assert_eq!(
            e.hostile(Some(e.ws_write()), &format!("socket {fam} {ty} {proto}"))
                .await,
            EPERM,
            "family {fam}"
        );
    }
    assert_eq!(e.hostile(Some(e.ws_write()), "socketpair").await, "ok");
    drop(l);
});

// 16-19, 36, 38 again under egress by name (§8): the job's only way out
// is the proxy of its own network namespace; TCP to the host's listener,
// UDP, DNS, raw/packet/netlink sockets and Unix datagrams to a host socket
// all fail; the proxy's port is the positive control inside.
both!(
    c16_c19_c36_c38_network_under_allow_hosts,
    |e: Env| async move {
        let mut i = e.ws_write();
        i.network = NetworkIntent::AllowHosts(executor_protocol::types::sandbox::EgressIntent {
            allow_hosts: vec!["mirror.test".into()],
            ask: false,
            ask_timeout_ms: 1000,
        });
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert_eq!(
            e.hostile(None, &format!("connect {port}")).await,
            "ok",
            "positive control"
        );
        let direct = e.hostile(Some(i.clone()), &format!("connect {port}")).await;
        assert!(
            direct == EACCES || direct == "errno=111",
            "Landlock (EACCES) or nothing there (ECONNREFUSED): {direct}"
        );
        let (out, code) = e
            .sh(
                Some(i.clone()),
                &format!("{} connect ${{HTTP_PROXY##*:}}", hostile().display()),
            )
            .await;
        assert_eq!((out.trim(), code), ("ok", 0), "the proxy is reachable");
        let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let uport = u.local_addr().unwrap().port();
        assert_eq!(e.hostile(None, &format!("udp {uport}")).await, "ok");
        for target in [uport, 53] {
            assert_eq!(
                e.hostile(Some(i.clone()), &format!("udp {target}")).await,
                EPERM,
                "UDP / DNS to {target}: seccomp"
            );
        }
        let (out, code) = e.sh(Some(i.clone()), "getent hosts example.com").await;
        assert_ne!(code, 0, "no name resolution inside: {out}");
        for (fam, ty, proto) in [
            (17, 3, 0),
            (16, 3, 0),
            (2, 3, 1),
            (10, 3, 58),
            (10, 2, 0),
            (1, 1, 0),
        ] {
            assert_eq!(
                e.hostile(Some(i.clone()), &format!("socket {fam} {ty} {proto}"))
                    .await,
                EPERM,
                "family {fam} type {ty}"
            );
        }
        for call in ["mptcp", "fastopen"] {
            assert_eq!(
                e.hostile(Some(i.clone()), &format!("{call} {port}")).await,
                EPERM,
                "{call}: seccomp"
            );
        }
        assert_eq!(e.hostile(Some(i.clone()), "socketpair").await, "ok");
        let (_, dgram, rx) = outside_dgram_socket(&e, "egress-sockets").await;
        let d = dgram.display();
        let mut buf = [0u8; 4];
        for call in ["dgram-sendto", "dgram-sendmsg", "seqpacket-connect"] {
            assert_eq!(
                e.hostile(Some(i.clone()), &format!("{call} {d}")).await,
                EPERM,
                "{call}: seccomp"
            );
        }
        assert!(rx.recv(&mut buf).is_err(), "nothing was delivered");
        drop(l);
    }
);

// 20. A TCP port allow-list: that port only, no bind.
both!(c20_allow_tcp_connect, |e: Env| async move {
    let allowed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (p, q) = (
        allowed.local_addr().unwrap().port(),
        other.local_addr().unwrap().port(),
    );
    let mut i = e.ws_write();
    i.network = NetworkIntent::AllowTcpConnect(vec![p]);
    assert_eq!(
        e.hostile(Some(i.clone()), &format!("connect {p}")).await,
        "ok"
    );
    assert_eq!(
        e.hostile(Some(i.clone()), &format!("connect {q}")).await,
        EACCES,
        "Landlock"
    );
    assert_eq!(
        e.hostile(Some(i.clone()), "bind 0").await,
        EACCES,
        "Landlock"
    );
    assert_eq!(
        e.hostile(Some(i.clone()), &format!("udp {p}")).await,
        EPERM,
        "seccomp: TCP only"
    );
    assert_eq!(
        e.hostile(Some(i), "socket 1 1 0").await,
        EPERM,
        "seccomp: no Unix sockets"
    );
});

// 21 + 22. Signals and ptrace out of the sandbox: ESRCH, nothing outside
// the job's PID namespace exists for it; pid 1 is the job's own init.
both!(c21_c22_signals_and_ptrace, |e: Env| async move {
    let a = e.agent_pid;
    let mut outside = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    assert_eq!(
        e.hostile(None, &format!("kill {}", outside.id())).await,
        if e.uid == current_uid() { "ok" } else { EPERM },
        "positive control: without a sandbox"
    );
    for pid in [a, outside.id()] {
        assert_eq!(
            e.hostile(Some(e.ws_write()), &format!("kill {pid}")).await,
            ESRCH,
            "PID namespace: {pid}"
        );
    }
    let _ = outside.kill();
    let _ = outside.wait();
    assert_eq!(
        e.hostile(Some(e.ws_write()), "kill 1").await,
        "ok",
        "pid 1 is the job's init (same uid, same Landlock domain)"
    );
    let (out, _) = e
        .sh(
            Some(e.ws_write()),
            &format!("{} kill $$", hostile().display()),
        )
        .await;
    assert_eq!(out.trim(), "ok", "positive control: its own process");
    assert_eq!(
        e.hostile(Some(e.ws_write()), &format!("ptrace {a}")).await,
        EPERM
    );
});

// 23-25. Namespaces, mounts, and the dangerous syscalls (pidfd_getfd too:
// another process's descriptors): EPERM (seccomp).
both!(c23_c25_dangerous_syscalls, |e: Env| async move {
    for call in [
        "unshare-user",
        "unshare-ns",
        "setns",
        "clone-newuser",
        "mount",
        "umount /proc",
        // With read "all" the host's own /dev is beneath the job's.
        "umount /dev",
        "pivot_root",
        "chroot",
        "keyctl",
        "add_key",
        "bpf",
        "perf",
        "userfaultfd",
        "kexec",
        "init_module",
        "io_uring",
        "pidfd_getfd",
        "open_tree",
        "open_tree_attr",
    ] {
        assert_eq!(e.hostile(Some(e.ws_write()), call).await, EPERM, "{call}");
    }
    // Control: unconfined, both open (open_tree_attr is ENOSYS before
    // Linux 6.15): seccomp denies them, not the kernel.
    assert_eq!(e.hostile(None, "open_tree").await, "ok");
    let attr = e.hostile(None, "open_tree_attr").await;
    assert!(attr == "ok" || attr == "errno=38", "{attr}");
    // Control: unconfined, copying a descriptor in works (seccomp denies
    // it, not the kernel).
    assert_eq!(e.hostile(None, "pidfd_getfd").await, "ok");
    // Without a sandbox, unsharing a user namespace works (the filter made
    // the difference, not the host).
    if std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .map(|s| s.trim() != "0")
        .unwrap_or(false)
    {
        assert_eq!(e.hostile(None, "unshare-user").await, "ok");
    }
});

// 28. The restriction lands on the child only.
both!(c28_agent_unaffected, |e: Env| async move {
    let (_, code) = e.sh(Some(e.ws_write()), "true").await;
    assert_eq!(code, 0);
    let target = e.outside.join("written-by-agent");
    e.c.write_file(wp(&target), b"free").await.unwrap();
    assert_eq!(std::fs::read_to_string(target).unwrap(), "free");
});

// 31. Pathname Unix sockets outside the roots (a docker.sock stand-in).
both!(c31_unix_socket_outside, |e: Env| async move {
    let sock = e.base.join("docker.sock");
    let l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert_eq!(
        e.hostile(None, &format!("unix {}", sock.display())).await,
        "ok"
    );
    assert_eq!(
        e.hostile(Some(e.ws_write()), &format!("unix {}", sock.display()))
            .await,
        EPERM
    );
    drop(l);
});

// 33. A sandboxed tty keeps its terminal; arg0 is what the program sees.
both!(c33_tty_and_arg0, |e: Env| async move {
    let mut p = ProcessStartParams::new(
        vec![
            "/bin/sh".into(),
            "-c".into(),
            "tty && echo via-tty > /dev/tty && stty size".into(),
        ],
        wp(&e.ws),
        path_env(),
    );
    p.tty = true;
    p.sandbox = Some(e.ws_write());
    let mut proc = e.c.start(&p).await.unwrap();
    let mut out = Vec::new();
    while let Some(ch) = proc.next_output().await.unwrap() {
        out.extend_from_slice(&ch.data);
    }
    let out = String::from_utf8_lossy(&out);
    assert!(
        out.contains("/dev/pts/") && out.contains("via-tty") && out.contains("24 80"),
        "{out}"
    );
    assert_eq!(proc.exit_status().unwrap().code, Some(0));
    let mut p = ProcessStartParams::new(vec!["sleep".into(), "5".into()], wp(&e.ws), path_env());
    p.arg0 = Some("sandboxed-sleep".into());
    p.sandbox = Some(e.ws_write());
    let proc = e.c.start(&p).await.unwrap();
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", proc.pid())).unwrap();
    assert!(cmdline.starts_with(b"sandboxed-sleep\0"));
    proc.signal(executor_protocol::types::process::SignalName::Kill)
        .await
        .unwrap();
});

// 34. A read-only intent blocks writes, reads work.
both!(c34_read_only_intent, |e: Env| async move {
    let mut i = e.ws_write();
    i.filesystem.write = vec![];
    let (out, code) = e.sh(Some(i.clone()), "echo x > src/new").await;
    assert_ne!(code, 0);
    assert!(out.contains("Read-only"), "{out}");
    let (out, code) = e.sh(Some(i), "cat src/main.rs").await;
    assert_eq!((out.as_str(), code), ("fn main() {}\n", 0));
});

// 29 + 30. Fail closed: a host that cannot enforce runs nothing.
#[tokio::test]
async fn c29_c30_fail_closed_with_the_probe_hook() {
    for (abi, network) in [
        (0, NetworkIntent::Deny),
        (3, NetworkIntent::AllowTcpConnect(vec![443])),
    ] {
        let e = env(false, Some(abi)).await;
        let marker = e.ws.join("marker");
        let mut i = e.ws_write();
        i.network = network;
        let p = exec_params(
            vec!["touch".into(), marker.to_str().unwrap().into()],
            &e.ws,
            Some(i),
        );
        let err = e.c.call(&p).await.unwrap_err();
        assert_eq!(
            err.code(),
            Some(ErrorCode::SandboxUnavailable),
            "abi {abi}: {err}"
        );
        assert!(!marker.exists(), "nothing ran");
        let running: Vec<_> =
            e.c.call(&executor_protocol::types::process::ProcessListParams {})
                .await
                .unwrap()
                .processes
                .into_iter()
                .filter(|p| p.running)
                .collect();
        assert!(running.is_empty());
    }
}

// 27 (sandboxed). Closing the transport kills a sandboxed job too.
#[tokio::test]
async fn c27_sandboxed_job_dies_with_the_transport() {
    let e = env(false, None).await;
    let mut p = ProcessStartParams::new(vec!["sleep".into(), "1000".into()], wp(&e.ws), path_env());
    p.sandbox = Some(e.ws_write());
    let proc = e.c.start(&p).await.unwrap();
    let pid = proc.pid();
    drop(proc);
    e.c.close().await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "sandboxed job {pid} survived"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

// The policy reaches the program even when exec fails inside the sandbox.
#[tokio::test]
async fn exec_outside_read_roots_is_refused_and_reported() {
    let e = env(false, None).await;
    let mut i = e.ws_write();
    i.filesystem.read = ReadRoots::Paths(vec![wp(&e.ws)]);
    let p = exec_params(vec!["/bin/true".into()], &e.ws, Some(i));
    let err = e.c.call(&p).await.unwrap_err();
    // Not granted, so not there in the job's root.
    assert_eq!(err.code(), Some(ErrorCode::NotFound), "{err}");
}

use executor_tests::remote as fs_err;

// 13. The agent's own fs requests resolve beneath the roots.
#[tokio::test]
async fn c13_agent_fs_requests_resolve_beneath_the_roots() {
    use executor_protocol::types::fs::*;
    let e = env(false, None).await;
    std::os::unix::fs::symlink(e.outside.join("secret"), e.ws.join("src/link-out")).unwrap();
    let mut i = e.ws_write();
    i.filesystem.read = ReadRoots::Paths(vec![wp(&e.ws)]);
    let read = |path: String| ReadFileParams {
        path: path.as_str().into(),
        offset: None,
        length: None,
        sandbox: Some(i.clone()),
        cwd: None,
    };
    let ok: ReadFileResult =
        e.c.call(&read(format!("{}/src/main.rs", e.ws.display())))
            .await
            .unwrap();
    assert_eq!(&ok.data[..], b"fn main() {}\n", "positive control");
    for bad in [
        format!("{}/secret", e.outside.display()),
        format!("{}/../outside/secret", e.ws.display()),
        format!("{}/src/link-out", e.ws.display()),
        format!("/proc/self/root{}/src/main.rs", e.ws.display()),
    ] {
        let w = fs_err(e.c.call(&read(bad.clone())).await.unwrap_err());
        assert_eq!(w.code, ErrorCode::SandboxDenied, "{bad}: {w:?}");
        assert!(w.data_get("rule").is_some());
    }
    // With everything readable, /proc/self/root is still a magic link.
    let mut all = e.ws_write();
    all.filesystem.deny_read = vec![wp(&e.ws.join("secrets"))];
    let w = fs_err(
        e.c.call(&ReadFileParams {
            path: format!("/proc/self/root{}/secrets/key", e.ws.display())
                .as_str()
                .into(),
            offset: None,
            length: None,
            sandbox: Some(all.clone()),
            cwd: None,
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(w.code, ErrorCode::SandboxDenied);
    let w = fs_err(
        e.c.call(&ReadFileParams {
            path: format!("{}/secrets/key", e.ws.display()).as_str().into(),
            offset: None,
            length: None,
            sandbox: Some(all.clone()),
            cwd: None,
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(w.code, ErrorCode::SandboxDenied, "deny_read carve-out");
    // Walks list the carve-out but never enter it.
    let mut params = executor_client::fs::walk_params(wp(&e.ws));
    params.sandbox = Some(all);
    let page = e.c.call(&params).await.unwrap();
    let paths: Vec<String> = page.entries.iter().map(|x| x.path.display()).collect();
    assert!(paths.contains(&"src/main.rs".to_string()), "{paths:?}");
    assert!(
        !paths.iter().any(|p| p.starts_with("secrets/")),
        "{paths:?}"
    );
    assert!(page
        .errors
        .iter()
        .any(|x| x.code == ErrorCode::SandboxDenied));
    // :cwd needs the request's cwd.
    let mut cwd_intent = e.ws_write();
    cwd_intent.filesystem.write = vec![":cwd".into()];
    let w = fs_err(
        e.c.call(&StatParams {
            path: wp(&e.ws),
            follow_symlinks: true,
            sandbox: Some(cwd_intent),
            cwd: None,
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(w.code, ErrorCode::InvalidParams);
}

// 13b. `fs/readStream` resolves its path exactly as `fs/readFile` and
// `fs/open` do: beneath the roots, carve-outs honoured.
#[tokio::test]
async fn c13b_read_streams_resolve_beneath_the_roots_like_read_block() {
    use executor_protocol::types::fs::*;
    use futures_util::StreamExt;
    let e = env(false, None).await;
    std::os::unix::fs::symlink(e.outside.join("secret"), e.ws.join("src/link-out")).unwrap();
    let mut i = e.ws_write();
    i.filesystem.read = ReadRoots::Paths(vec![wp(&e.ws)]);
    let stream = |path: String, intent: &SandboxIntent| ReadStreamParams {
        path: Some(path.as_str().into()),
        handle: None,
        offset: 0,
        length: None,
        block_bytes: 4096,
        credit_bytes: 8192,
        sandbox: Some(intent.clone()),
        cwd: None,
    };
    // Positive control: inside the root, the whole file.
    let confined = e.c.with_sandbox(Some(i.clone()));
    let (_, s) = confined
        .read_stream(wp(&e.ws.join("src/main.rs")))
        .await
        .unwrap();
    let got: Vec<u8> = s.map(|b| b.unwrap().to_vec()).concat().await;
    assert_eq!(got, b"fn main() {}\n");
    for bad in [
        format!("{}/secret", e.outside.display()),
        format!("{}/../outside/secret", e.ws.display()),
        format!("{}/src/link-out", e.ws.display()),
        format!("/proc/self/root{}/src/main.rs", e.ws.display()),
    ] {
        let w = fs_err(e.c.call(&stream(bad.clone(), &i)).await.unwrap_err());
        assert_eq!(w.code, ErrorCode::SandboxDenied, "{bad}: {w:?}");
        assert!(w.data_get("rule").is_some());
        // The same answer as fs/open gives it.
        let o = fs_err(
            e.c.call(&OpenParams {
                path: bad.as_str().into(),
                sandbox: Some(i.clone()),
                cwd: None,
            })
            .await
            .unwrap_err(),
        );
        assert_eq!((o.code, o.data_get("rule")), (w.code, w.data_get("rule")));
    }
    // A deny_read carve-out with everything else readable.
    let mut all = e.ws_write();
    all.filesystem.deny_read = vec![wp(&e.ws.join("secrets"))];
    let key = format!("{}/secrets/key", e.ws.display());
    let w = fs_err(e.c.call(&stream(key.clone(), &all)).await.unwrap_err());
    assert_eq!(w.code, ErrorCode::SandboxDenied, "deny_read carve-out");
    let w = fs_err(
        e.c.call(&stream(format!("{}/src/link-to-key", e.ws.display()), &all))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        w.code,
        ErrorCode::SandboxDenied,
        "carve-out through a symlink"
    );
    // Positive control: the same intent reads beside the carve-out.
    let (_, s) =
        e.c.with_sandbox(Some(all))
            .read_stream(wp(&e.ws.join(".git/config")))
            .await
            .unwrap();
    let got: Vec<u8> = s.map(|b| b.unwrap().to_vec()).concat().await;
    assert_eq!(got, b"[core]\n");
}

// 34. A read-only intent: fs writes are denied, reads and walks work.
#[tokio::test]
async fn c34_read_only_intent_on_fs_requests() {
    use executor_protocol::types::fs::*;
    use serde_bytes::ByteBuf;
    let e = env(false, None).await;
    let mut ro = e.ws_write();
    ro.filesystem.write = vec![];
    let target = e.ws.join("src/new");
    let w = fs_err(
        e.c.call(&WriteFileParams {
            path: wp(&target),
            data: ByteBuf::from(b"x".to_vec()),
            mode: None,
            create_parents: false,
            atomic: true,
            sandbox: Some(ro.clone()),
            cwd: None,
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(w.code, ErrorCode::SandboxDenied);
    let w = fs_err(
        e.c.call(&OpenWriteParams {
            path: wp(&target),
            mode: None,
            create_parents: false,
            mtime_ns: None,
            atime_ns: None,
            sandbox: Some(ro.clone()),
            cwd: None,
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(w.code, ErrorCode::SandboxDenied);
    assert!(!target.exists());
    let r: ReadFileResult =
        e.c.call(&ReadFileParams {
            path: wp(&e.ws.join("src/main.rs")),
            offset: None,
            length: None,
            sandbox: Some(ro.clone()),
            cwd: None,
        })
        .await
        .unwrap();
    assert_eq!(&r.data[..], b"fn main() {}\n");
    let mut params = executor_client::fs::walk_params(wp(&e.ws));
    params.sandbox = Some(ro);
    assert!(!e.c.call(&params).await.unwrap().entries.is_empty());
    // Positive control: the same write with the workspace writable.
    e.c.call(&WriteFileParams {
        path: wp(&target),
        data: ByteBuf::from(b"x".to_vec()),
        mode: None,
        create_parents: false,
        atomic: true,
        sandbox: Some(e.ws_write()),
        cwd: None,
    })
    .await
    .unwrap();
    assert_eq!(std::fs::read(&target).unwrap(), b"x");
    // deny_write: writes into .git are denied through fs too.
    let mut i = e.ws_write();
    i.filesystem.deny_write = vec![wp(&e.ws.join(".git"))];
    let w = fs_err(
        e.c.call(&WriteFileParams {
            path: wp(&e.ws.join(".git/config")),
            data: ByteBuf::from(b"x".to_vec()),
            mode: None,
            create_parents: false,
            atomic: true,
            sandbox: Some(i),
            cwd: None,
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(w.code, ErrorCode::SandboxDenied);
    assert_eq!(
        std::fs::read_to_string(e.ws.join(".git/config")).unwrap(),
        "[core]\n"
    );
}

// Denials are reported: `sandbox_denied` on a denied write, not on an
// ordinary failure, not without a sandbox.
#[tokio::test]
async fn sandbox_denied_is_reported_only_for_denials() {
    let e = env(false, None).await;
    let run = |intent: Option<SandboxIntent>, script: &str| {
        let p = exec_params(
            vec!["/bin/sh".into(), "-c".into(), script.into()],
            &e.ws,
            intent,
        );
        let c = e.c.clone();
        async move { c.call(&p).await.unwrap() }
    };
    let o = e.outside.display();
    let r = run(Some(e.ws_write()), &format!("echo x > {o}/f")).await;
    assert_ne!(r.exit_code, Some(0));
    assert_eq!(r.sandbox_denied, Some(true), "{}", r.output);
    let r = run(Some(e.ws_write()), "echo just failing; exit 3").await;
    assert_eq!((r.exit_code, r.sandbox_denied), (Some(3), None));
    let r = run(None, "echo 'Permission denied' >&2; exit 1").await;
    assert_eq!(r.sandbox_denied, None, "no sandbox, no sandbox denial");
    // process/exited carries it too.
    let mut p = ProcessStartParams::new(
        vec!["/bin/sh".into(), "-c".into(), format!("touch {o}/new")],
        wp(&e.ws),
        path_env(),
    );
    p.sandbox = Some(e.ws_write());
    let mut sub = e.c.subscribe(&["process/exited"]);
    let proc = e.c.start(&p).await.unwrap();
    let note = loop {
        let n = sub.recv().await.unwrap();
        if n.process_id() == Some(proc.id()) {
            break n;
        }
    };
    let ex: executor_protocol::types::process::ProcessExited = note.decode().unwrap();
    assert_eq!(ex.sandbox_denied, Some(true));
}

// 4 + 6, the rest: a single file hidden, and carve-outs that do not exist
// yet cannot be created.
both!(c04_c06_file_and_future_carve_outs, |e: Env| async move {
    std::fs::write(e.ws.join(".env"), "API_KEY=hunter2\n").unwrap();
    if e.uid != current_uid() {
        chown_r(&e.ws.join(".env"), e.uid);
    }
    let mut i = e.ws_write();
    i.filesystem.deny_read = vec![wp(&e.ws.join(".env")), wp(&e.ws.join("secrets/later"))];
    i.filesystem.deny_write = vec![wp(&e.ws.join(".git/hooks/pre-commit"))];
    for op in [
        "cat .env",
        "touch .git/hooks/pre-commit",
        "echo k > secrets/later",
    ] {
        let (out, code) = e.sh(Some(i.clone()), op).await;
        assert_ne!(code, 0, "{op}: {out}");
        assert!(!out.contains("hunter2"), "{op}: {out}");
    }
    assert!(!e.ws.join(".git/hooks/pre-commit").exists());
    assert!(!e.ws.join("secrets/later").exists());
    let (out, code) = e
        .sh(Some(i), "cat src/main.rs && touch src/fine && echo ok")
        .await;
    assert_eq!(
        (out.as_str(), code),
        ("fn main() {}\nok\n", 0),
        "positive control"
    );
});

// ---- Found by the adversarial pass (SANDBOX_TESTS.md 35-45) -------------

/// Compile a shared library from C source into `dir`, readable by anyone.
fn shared_object(dir: &Path, name: &str, src: &str) -> PathBuf {
    let c = dir.join(format!("{name}.c"));
    let so = dir.join(format!("{name}.so"));
    std::fs::write(&c, src).unwrap();
    let st = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&c)
        .status()
        .unwrap();
    assert!(st.success(), "cc {name}");
    std::fs::set_permissions(&so, std::fs::Permissions::from_mode(0o755)).unwrap();
    so
}

// 35. The request's env runs nothing before confinement: a library planted
// in the write root and preloaded (LD_PRELOAD, LD_AUDIT) runs in the job,
// confined, never in the trampoline; the trampoline's environment is empty
// and its command line holds no policy.
both!(c35_env_reaches_only_the_job, |e: Env| async move {
    let outside_marker = e.outside.join("preloaded-outside");
    let inside_marker = e.ws.join("preloaded-inside");
    let src = format!(
        "#include <fcntl.h>\n#include <unistd.h>\n\
         static void mark(const char *p) {{ int fd = open(p, O_WRONLY|O_CREAT, 0644); if (fd >= 0) close(fd); }}\n\
         __attribute__((constructor)) static void init(void) {{ mark(\"{}\"); mark(\"{}\"); }}\n\
         unsigned int la_version(unsigned int v) {{ return v; }}\n",
        outside_marker.display(),
        inside_marker.display()
    );
    let so = shared_object(&e.ws, "planted", &src);
    if e.uid != current_uid() {
        chown_r(&e.ws, e.uid);
        chown_r(&e.outside, e.uid);
    }
    for var in ["LD_PRELOAD", "LD_AUDIT"] {
        let _ = std::fs::remove_file(&inside_marker);
        let mut p = exec_params(vec!["/bin/true".into()], &e.ws, Some(e.ws_write()));
        p.env.insert(var.into(), so.to_str().unwrap().into());
        for (k, v) in [
            ("LD_LIBRARY_PATH", e.ws.to_str().unwrap()),
            ("GCONV_PATH", e.ws.to_str().unwrap()),
            ("MALLOC_CHECK_", "3"),
            ("MALLOC_PERTURB_", "85"),
            ("GLIBC_TUNABLES", "glibc.malloc.check=3"),
        ] {
            p.env.insert(k.into(), v.into());
        }
        let r = e.c.call(&p).await.expect("exec_command");
        assert_eq!(r.exit_code, Some(0), "{var}: {}", r.output);
        assert!(
            inside_marker.exists(),
            "positive control: {var} ran in the job (confined)"
        );
        assert!(
            !outside_marker.exists(),
            "{var} wrote outside every root: it ran before confinement"
        );
    }
    // What other processes of the user can read of the trampoline and the
    // job's init: no environment, no policy, no paths.
    let mut p = ProcessStartParams::new(vec!["sleep".into(), "5".into()], wp(&e.ws), path_env());
    p.env.insert("SECRET_MARKER".into(), "s3cr3t-v4lue".into());
    p.sandbox = Some(e.ws_write());
    let job = e.c.start(&p).await.unwrap();
    let init = ppid(job.pid());
    let supervisor = ppid(init);
    for pid in [supervisor, init] {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        assert!(!cmdline.contains(e.ws.to_str().unwrap()), "{cmdline}");
        assert!(!cmdline.contains("s3cr3t"), "{cmdline}");
        if let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) {
            assert!(
                env.is_empty(),
                "pid {pid} environ: {:?}",
                String::from_utf8_lossy(&env)
            );
        }
    }
    let env = std::fs::read(format!("/proc/{}/environ", job.pid())).unwrap_or_default();
    assert!(
        e.uid != current_uid() || String::from_utf8_lossy(&env).contains("s3cr3t-v4lue"),
        "positive control: the job itself has its env"
    );
    job.signal(executor_protocol::types::process::SignalName::Kill)
        .await
        .ok();
});

/// A datagram socket outside every root (a stand-in for `/dev/log`) in a
/// new world-writable directory `name` of the test's base, and the
/// positive control: an unsandboxed job's `sendto` is delivered to it.
async fn outside_dgram_socket(
    e: &Env,
    name: &str,
) -> (PathBuf, PathBuf, std::os::unix::net::UnixDatagram) {
    let dir = e.base.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let dgram = dir.join("log.sock");
    let rx = std::os::unix::net::UnixDatagram::bind(&dgram).unwrap();
    std::fs::set_permissions(&dgram, std::fs::Permissions::from_mode(0o777)).unwrap();
    rx.set_nonblocking(true).unwrap();
    assert_eq!(
        e.hostile(None, &format!("dgram-sendto {}", dgram.display()))
            .await,
        "ok",
        "positive control"
    );
    let mut buf = [0u8; 4];
    assert!(rx.recv(&mut buf).is_ok(), "positive control: delivered");
    (dir, dgram, rx)
}

// 36. Network deny: no datagram, stream or seqpacket reaches a pathname
// Unix socket outside the roots (EPERM: seccomp's socket-type allow-list
// and connect ban); the abstract namespace is the job's own (network
// namespace).
both!(c36_unix_sockets_under_deny, |e: Env| async move {
    let (dir, dgram, rx) = outside_dgram_socket(&e, "sockets").await;
    let d = dgram.display();
    let mut buf = [0u8; 4];
    for call in ["dgram-sendto", "dgram-sendmsg"] {
        assert_eq!(
            e.hostile(Some(e.ws_write()), &format!("{call} {d}")).await,
            EPERM,
            "{call}: seccomp (no AF_UNIX datagram socket)"
        );
    }
    assert!(rx.recv(&mut buf).is_err(), "nothing was delivered");
    assert_eq!(
        e.hostile(Some(e.ws_write()), &format!("seqpacket-sendmsg {d}"))
            .await,
        "ok",
        "a seqpacket pair works, and its send names no one (went to the peer)"
    );
    assert!(rx.recv(&mut buf).is_err(), "nothing was delivered");
    let seq = dir.join("seq.sock");
    let _l = std::os::unix::net::UnixListener::bind(&seq).unwrap();
    assert_eq!(
        e.hostile(
            Some(e.ws_write()),
            &format!("seqpacket-connect {}", seq.display())
        )
        .await,
        EPERM,
        "seccomp: no connect"
    );
    // An abstract socket of the host is not in the job's network namespace.
    let name = format!(
        "executor-test-abstract-{}",
        e.base.file_name().unwrap().to_string_lossy()
    );
    let addr =
        <std::os::unix::net::SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(
            name.as_bytes(),
        )
        .unwrap();
    let _abs = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    let (out, _) = e.sh(None, "cat /proc/net/unix").await;
    assert!(
        out.contains(&name),
        "positive control: visible without a sandbox"
    );
    let (out, code) = e.sh(Some(e.ws_write()), "cat /proc/net/unix").await;
    assert_eq!(code, 0, "{out}");
    assert!(
        !out.contains(&name),
        "network namespace: the host's abstract sockets are not there"
    );
});

// 37. SysV IPC of other processes is out of reach (ENOENT: the job's own
// IPC namespace), and what a job makes does not outlive it.
both!(c37_ipc_namespace, |e: Env| async move {
    // A key no object of the host has (an earlier run's, another user's:
    // creating on it would fail with EACCES), removed again at the end.
    let in_use = |key: i32| {
        ["shm", "msg", "sem"].iter().any(|kind| {
            std::fs::read_to_string(format!("/proc/sysvipc/{kind}"))
                .unwrap_or_default()
                .lines()
                .skip(1)
                .any(|l| l.split_whitespace().next() == Some(key.to_string().as_str()))
        })
    };
    let mut key = 0x4500_0000
        + (std::process::id() as i32 & 0xffff)
        + if e.uid == current_uid() { 0 } else { 0x10000 };
    while in_use(key) || in_use(key + 1) {
        key += 0x20000;
    }
    struct Remove(i32);
    impl Drop for Remove {
        fn drop(&mut self) {
            for flag in ["-M", "-Q", "-S"] {
                let _ = std::process::Command::new("ipcrm")
                    .arg(flag)
                    .arg(self.0.to_string())
                    .stderr(std::process::Stdio::null())
                    .status();
            }
        }
    }
    let _remove = Remove(key);
    // Objects of an unsandboxed process of the same user.
    for (create, call) in [
        ("shm-create", "shm-write"),
        ("msg-create", "msg-send"),
        ("sem-create", "sem-bump"),
    ] {
        assert_eq!(e.hostile(None, &format!("{create} {key}")).await, "ok");
        assert_eq!(
            e.hostile(None, &format!("{call} {key}")).await,
            "ok",
            "positive control: {call}"
        );
        assert_eq!(
            e.hostile(Some(e.ws_write()), &format!("{call} {key}"))
                .await,
            "errno=2",
            "{call}: IPC namespace (no such object)"
        );
    }
    // A segment the job makes is gone with it.
    let key2 = key + 1;
    assert_eq!(
        e.hostile(Some(e.ws_write()), &format!("shm-create {key2}"))
            .await,
        "ok"
    );
    assert_eq!(
        e.hostile(None, &format!("shm-write {key2}")).await,
        "errno=2"
    );
});

// 38. A port allow-list: TCP stream sockets only (no MPTCP), no Fast Open,
// IPv4 and IPv6; an empty list connects nowhere.
both!(c38_port_list_is_tcp_only, |e: Env| async move {
    let allowed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let p = allowed.local_addr().unwrap().port();
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let q = other.local_addr().unwrap().port();
    let v6 = std::net::TcpListener::bind(("::1", p)).ok();
    let mut i = e.ws_write();
    i.network = NetworkIntent::AllowTcpConnect(vec![p]);
    assert_eq!(
        e.hostile(Some(i.clone()), &format!("connect {p}")).await,
        "ok",
        "positive control"
    );
    for call in [
        "mptcp",
        "fastopen",
        "fastopen6",
        "fastopen-sendmsg",
        "fastopen-connect",
    ] {
        for port in [p, q] {
            assert_eq!(
                e.hostile(Some(i.clone()), &format!("{call} {port}")).await,
                EPERM,
                "{call} {port}: seccomp"
            );
        }
    }
    if v6.is_some() {
        assert_eq!(
            e.hostile(Some(i.clone()), &format!("connect6 {p}")).await,
            "ok",
            "IPv6, allowed port"
        );
    }
    assert_eq!(
        e.hostile(Some(i.clone()), &format!("connect6 {q}")).await,
        EACCES,
        "IPv6: Landlock"
    );
    let mut none = e.ws_write();
    none.network = NetworkIntent::AllowTcpConnect(vec![]);
    for call in ["connect", "mptcp", "fastopen"] {
        let want = if call == "connect" { EACCES } else { EPERM };
        assert_eq!(
            e.hostile(Some(none.clone()), &format!("{call} {p}")).await,
            want,
            "empty list: {call}"
        );
    }
    assert_eq!(
        e.hostile(None, &format!("mptcp {p}")).await,
        "ok",
        "positive control: MPTCP works here"
    );
});

// 39. Carve-outs survive renames, exchanges and removals of their
// ancestors inside a write root (EBUSY: each ancestor is pinned), parent
// and grandparent, in the job and for the next job.
both!(c39_carve_out_ancestors_are_pinned, |e: Env| async move {
    std::fs::create_dir_all(e.ws.join("config/sub/secrets")).unwrap();
    std::fs::write(e.ws.join("config/sub/secrets/k"), "PINNED-SECRET\n").unwrap();
    std::fs::create_dir_all(e.ws.join("other")).unwrap();
    if e.uid != current_uid() {
        chown_r(&e.ws, e.uid);
    }
    let mut i = e.ws_write();
    i.filesystem.deny_write = vec![wp(&e.ws.join(".git/config")), wp(&e.ws.join(".git/hooks"))];
    i.filesystem.deny_read = vec![wp(&e.ws.join("config/sub/secrets"))];
    for (call, want) in [
        ("rename .git .git-old", "errno=16"),
        ("exchange .git other", "errno=16"),
        // (an exchange across the pin's mount is EXDEV, as good as EBUSY)
        ("rename config config.old", "errno=16"),
        ("rename config/sub config/sub2", "errno=16"),
        ("exchange config/sub other", "errno=18"),
        ("rmdir config/sub", "errno=16"),
        ("rename other other2", "ok"),
    ] {
        assert_eq!(e.hostile(Some(i.clone()), call).await, want, "{call}");
    }
    let (out, _) = e
        .sh(Some(i.clone()), "mv .git .git-old; mkdir -p .git/hooks; echo x > .git/hooks/pre-commit; cat config/sub/secrets/k; ls -d .git-old")
        .await;
    assert!(!out.contains("PINNED-SECRET"), "{out}");
    assert!(
        !e.ws.join(".git-old").exists(),
        "the job could not move .git away"
    );
    assert!(!e.ws.join(".git/hooks/pre-commit").exists());
    let (out, _) = e.sh(Some(i), "cat config/sub/secrets/k").await;
    assert!(!out.contains("PINNED-SECRET"), "the next job: {out}");
});

// 40. A root swapped for a symlink between the request and the spawn is
// never followed: a race loop from outside while jobs start. (The agent's
// check that a write root is not a symlink and its canonicalization were
// two look-ups: about one start in 800 was bound where the link pointed.
// Both are one walk now; policy::tests::a_write_root_swapped_... races the
// walk itself 20,000 times.)
both!(c40_swapped_root_is_not_followed, |e: Env| async move {
    let sub = e.ws.join("sub");
    let parked = e.ws.join("sub-real");
    std::fs::create_dir_all(&sub).unwrap();
    if e.uid != current_uid() {
        chown_r(&e.ws, e.uid);
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (s2, sub2, parked2, target) = (
        stop.clone(),
        sub.clone(),
        parked.clone(),
        e.outside.join("sub"),
    );
    let swapper = std::thread::spawn(move || {
        while !s2.load(std::sync::atomic::Ordering::Relaxed) {
            if std::fs::rename(&sub2, &parked2).is_ok() {
                let _ = std::os::unix::fs::symlink(&target, &sub2);
                std::thread::yield_now();
                let _ = std::fs::remove_file(&sub2);
                let _ = std::fs::rename(&parked2, &sub2);
            }
        }
    });
    let mut ran = 0;
    for n in 0..100 {
        let mut i = e.ws_write();
        i.filesystem.write = vec![wp(&sub)];
        let p = exec_params(
            vec![
                "/bin/sh".into(),
                "-c".into(),
                format!("echo {n} > marker-{n}"),
            ],
            &e.ws.join("sub"),
            Some(i),
        );
        let mut p = p;
        p.cwd = wp(&sub);
        if let Ok(r) = e.c.call(&p).await {
            if r.exit_code == Some(0) {
                ran += 1;
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    swapper.join().unwrap();
    let leaked: Vec<_> = std::fs::read_dir(e.outside.join("sub"))
        .unwrap()
        .flatten()
        .map(|d| d.file_name())
        .collect();
    assert!(
        leaked.is_empty(),
        "written through the swapped link: {leaked:?} ({ran} ran)"
    );
    // Positive control, and a write root that is a symlink is refused.
    let link = e.ws.join("link-root");
    std::os::unix::fs::symlink(&e.outside, &link).unwrap();
    let mut i = e.ws_write();
    i.filesystem.write = vec![wp(&link)];
    let err =
        e.c.call(&exec_params(vec!["/bin/true".into()], &e.ws, Some(i)))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidParams), "{err}");
    assert!(
        err.to_string()
            .contains("sandbox_permissions.filesystem.write.0"),
        "{err}"
    );
});

// 41. An older Landlock ABI does not weaken the intent: signals and
// abstract sockets stay out of reach by the namespaces alone.
#[tokio::test]
async fn c41_old_landlock_abi_keeps_isolation() {
    for abi in [1, 4, 5] {
        let e = env(false, Some(abi)).await;
        let a = e.agent_pid;
        assert_eq!(
            e.hostile(Some(e.ws_write()), &format!("kill {a}")).await,
            ESRCH,
            "ABI {abi}: the PID namespace"
        );
        let (out, code) = e.sh(Some(e.ws_write()), "cat /proc/net/unix | wc -l").await;
        assert_eq!(
            (out.trim(), code),
            ("1", 0),
            "ABI {abi}: only the header, no socket of the host"
        );
    }
}

// 42. Other syscall ABIs: x32 numbers are refused (EPERM from the guard,
// where the host would say ENOSYS or run them), i386 `int 0x80` kills.
both!(c42_other_syscall_abis, |e: Env| async move {
    let free = e.hostile(None, "x32").await;
    assert_ne!(
        free, EPERM,
        "positive control: the host itself does not refuse with EPERM"
    );
    assert_eq!(
        e.hostile(Some(e.ws_write()), "x32").await,
        EPERM,
        "x32 guard"
    );
    // clone3 → ENOSYS (glibc then uses clone, whose flags are filtered):
    // the host itself refuses the empty call with EINVAL.
    assert_eq!(
        e.hostile(None, "clone3").await,
        "errno=22",
        "positive control"
    );
    assert_eq!(
        e.hostile(Some(e.ws_write()), "clone3").await,
        "errno=38",
        "seccomp: clone3 answers ENOSYS"
    );
    let (out, code) = e
        .sh(
            Some(e.ws_write()),
            &format!("{} int80; echo status=$?", hostile().display()),
        )
        .await;
    assert!(
        out.contains("status=159"),
        "killed by SIGSYS: {out} ({code})"
    );
});

// 43. Nothing outside the grants can be watched or listed, and another
// job's terminal is not there.
both!(c43_nothing_outside_the_grants, |e: Env| async move {
    let mut i = e.ws_write();
    i.filesystem.read = ReadRoots::Paths(vec![
        "/usr".into(),
        wp(&e.ws),
        wp(hostile().parent().unwrap()),
    ]);
    let o = e.outside.display().to_string();
    assert_eq!(
        e.hostile(None, &format!("inotify {o}")).await,
        "ok",
        "positive control"
    );
    assert_eq!(
        e.hostile(Some(i.clone()), &format!("inotify {o}")).await,
        "errno=2",
        "mount namespace"
    );
    assert_eq!(
        e.hostile(Some(i.clone()), &format!("inotify {}", e.ws.display()))
            .await,
        "ok"
    );
    let (out, code) = e.sh(Some(i), "cat /proc/self/mountinfo").await;
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains(&o), "{out}");
    assert!(out.contains(e.ws.to_str().unwrap()), "{out}");
    // Another job's terminal, with the default read roots ("all").
    let mut t = ProcessStartParams::new(vec!["sleep".into(), "10".into()], "/", path_env());
    t.tty = true;
    let other = e.c.start(&t).await.unwrap();
    let pts = std::fs::read_link(format!("/proc/{}/fd/0", other.pid())).unwrap();
    let (out, _) = e
        .sh(
            Some(e.ws_write()),
            &format!("ls /dev/pts/; cat {} ; echo end", pts.display()),
        )
        .await;
    assert!(out.contains("No such file"), "{out}");
    // The host's other devices are not there either (its /dev is beneath
    // the job's own with read "all"); the job's own are (control).
    let own = [
        "null", "zero", "full", "random", "urandom", "tty", "pts", "shm", "fd", "stdin", "stdout",
        "stderr",
    ];
    let host_only: Vec<String> = std::fs::read_dir("/dev")
        .unwrap()
        .flatten()
        .map(|d| d.file_name().to_string_lossy().into_owned())
        .filter(|n| !own.contains(&n.as_str()))
        .take(3)
        .collect();
    assert!(
        !host_only.is_empty(),
        "the host's /dev has only the job's own"
    );
    let script = host_only
        .iter()
        .map(|n| format!("ls -d /dev/{n};"))
        .collect::<String>();
    let (out, _) = e
        .sh(Some(e.ws_write()), &format!("{script} ls /dev; echo end"))
        .await;
    assert_eq!(
        out.matches("No such file").count(),
        host_only.len(),
        "{out}"
    );
    assert!(out.contains("urandom") && out.contains("end"), "{out}");
    other
        .signal(executor_protocol::types::process::SignalName::Kill)
        .await
        .ok();
});

// 44. A deny_read file with another hard link: refused, naming it (or
// reported as degraded with required: false).
both!(c44_hard_linked_secret, |e: Env| async move {
    std::fs::hard_link(e.ws.join("secrets/key"), e.ws.join("src/key-link")).unwrap();
    let mut i = e.ws_write();
    i.filesystem.deny_read = vec![wp(&e.ws.join("secrets/key"))];
    let p = exec_params(
        vec!["/bin/cat".into(), "src/key-link".into()],
        &e.ws,
        Some(i.clone()),
    );
    let err = e.c.call(&p).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::SandboxUnavailable), "{err}");
    assert!(err.to_string().contains("secrets/key"), "{err}");
    i.required = false;
    let p = exec_params(vec!["/bin/true".into()], &e.ws, Some(i));
    let r = e.c.call(&p).await.unwrap();
    let d = r.sandbox_degraded.unwrap_or_default().join("; ");
    assert!(d.contains("hard link"), "{d}");
});

// Found attacking the namespaced sandbox: a deeper carve-out must not make
// part of a deny_write tree writable (its pins stay read-only); a
// deny_write on a dangling symlink protects what it points to (with a
// placeholder, gone after the job); another job's :tmp is not
// there, and a job cannot make its own outlive it.
both!(
    c39b_carve_outs_hold_against_their_own_pins,
    |e: Env| async move {
        std::fs::write(e.ws.join(".git/hooks/token"), "T\n").unwrap();
        std::os::unix::fs::symlink("later", e.ws.join("dangling")).unwrap();
        if e.uid != current_uid() {
            chown_r(&e.ws, e.uid);
        }
        let mut i = e.ws_write();
        i.filesystem.deny_write = vec![wp(&e.ws.join(".git"))];
        i.filesystem.deny_read = vec![wp(&e.ws.join(".git/hooks/token"))];
        let (out, code) = e
            .sh(Some(i.clone()), "echo evil > .git/hooks/post-checkout")
            .await;
        assert_ne!(code, 0, "{out}");
        assert!(!e.ws.join(".git/hooks/post-checkout").exists());
        let (out, code) = e.sh(Some(i), "touch src/ok && echo fine").await;
        assert_eq!((out.trim(), code), ("fine", 0), "positive control");
        let mut j = e.ws_write();
        j.filesystem.deny_write = vec![wp(&e.ws.join("dangling"))];
        let p = exec_params(
            vec!["/bin/sh".into(), "-c".into(), "echo x > dangling".into()],
            &e.ws,
            Some(j),
        );
        let r = e.c.call(&p).await.unwrap();
        assert_ne!(r.exit_code, Some(0), "{}", r.output);
        assert!(r.output.contains("Is a directory"), "{}", r.output);
        assert!(!e.ws.join("later").exists());
        // :tmp of a running job is not there for another job (read "all").
        let mut a = e.ws_write();
        a.filesystem.write = vec![":tmp".into()];
        let mut pa = ProcessStartParams::new(
            vec![
                "/bin/sh".into(),
                "-c".into(),
                "echo JOB-A-SECRET > /tmp/s; mkdir -p /tmp/p/k; chmod 0311 /tmp/p; sleep 3".into(),
            ],
            "/",
            path_env(),
        );
        pa.sandbox = Some(a);
        let job_a = e.c.start(&pa).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let (out, _) = e
            .sh(
                Some(e.ws_write()),
                "cat /tmp/executor-job*/s /tmp/executor-jobs-*/*/s; echo end",
            )
            .await;
        assert!(!out.contains("JOB-A-SECRET"), "{out}");
        job_a.wait().await.unwrap();
        let parent = std::env::temp_dir().join(format!("executor-jobs-{}", e.uid));
        // (the lock of placeholder records stays; it holds nothing). The
        // directory is the uid's: when both variants run as the same user
        // (an unprivileged run), the other one's job may still be there for
        // its few seconds, so this waits for the directory to empty.
        let listing = || -> Vec<_> {
            std::fs::read_dir(&parent)
                .map(|d| {
                    d.flatten()
                        .map(|e| e.file_name())
                        .filter(|n| n != "placeholders.lock")
                        .collect()
                })
                .unwrap_or_default()
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut left = listing();
        while !left.is_empty() && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            left = listing();
        }
        assert!(left.is_empty(), "job directories left behind: {left:?}");
    }
);

// A carve-out of something the job was not granted (a profile's deny_read
// of a path outside a request's narrower read roots, or under the host's
// /tmp when the job has its own) needs nothing: the job runs, and the path
// is still not there.
both!(c43b_carve_outs_outside_the_grants, |e: Env| async move {
    let secret = e.outside.join("secret");
    let mut narrow = e.ws_write();
    narrow.filesystem.read = ReadRoots::Paths(vec!["/usr".into(), wp(&e.ws)]);
    narrow.filesystem.deny_read = vec![wp(&secret)];
    let mut own_tmp = e.ws_write();
    own_tmp.filesystem.write = vec![wp(&e.ws), ":tmp".into()];
    own_tmp.filesystem.deny_read = vec![wp(&secret)];
    for i in [narrow, own_tmp] {
        let (out, code) = e
            .sh(
                Some(i),
                &format!("cat src/main.rs; cat {}", secret.display()),
            )
            .await;
        // stdout and stderr are merged in arrival order: the positive
        // control is anywhere in it.
        assert!(out.contains("fn main() {}\n"), "positive control: {out}");
        assert!(!out.contains("OUTSIDE-SECRET"), "{out}");
        assert_ne!(code, 0, "{out}");
    }
});

/// Whether any of `names` is left in `ws` (placeholders must be gone).
fn left(ws: &Path, names: &[&str]) -> Vec<String> {
    names
        .iter()
        .filter(|n| std::fs::symlink_metadata(ws.join(n)).is_ok())
        .map(|n| n.to_string())
        .collect()
}

// 45. Carve-outs that do not exist yet inside a write root (right under it,
// and below parents that do not exist either) cannot be created, renamed
// into being or exchanged into place; the placeholders the agent made are
// gone after the job, and what the job put in a parent it was given stays.
both!(c45_carve_outs_that_do_not_exist_yet, |e: Env| async move {
    std::fs::create_dir_all(e.ws.join("other")).unwrap();
    if e.uid != current_uid() {
        chown_r(&e.ws, e.uid);
    }
    let mut i = e.ws_write();
    i.filesystem.deny_write = vec![wp(&e.ws.join(".env")), wp(&e.ws.join("build/.git/hooks"))];
    i.filesystem.deny_read = vec![wp(&e.ws.join("secrets/later"))];
    let names = [".env", "build", "secrets/later"];
    for op in [
        "echo k > .env",
        "rm -rf .env",
        "mkdir -p build/.git/hooks && touch build/.git/hooks/pre-commit",
        "echo k > secrets/later",
        "ls secrets/later",
        "mkdir x && touch x/pre-commit && rm -rf build/.git/hooks && mv x build/.git/hooks",
    ] {
        let (out, code) = e.sh(Some(i.clone()), op).await;
        assert_ne!(code, 0, "{op}: {out}");
        assert_eq!(left(&e.ws, &names), Vec::<String>::new(), "after {op}");
    }
    // The parents made for the job are pinned like any ancestor, and the
    // names cannot be swapped for the job's own.
    for (call, want) in [
        ("rename build build-old", "errno=16"),
        ("rename build/.git build/git-old", "errno=16"),
        ("exchange .env other", "errno=16"),
        ("exchange build other", "errno=16"),
        ("rename other .env", "errno=16"),
        ("rmdir .env", "errno=16"),
        ("rename other other2", "ok"),
    ] {
        assert_eq!(e.hostile(Some(i.clone()), call).await, want, "{call}");
        assert_eq!(left(&e.ws, &names), Vec::<String>::new(), "after {call}");
    }
    std::fs::rename(e.ws.join("other2"), e.ws.join("other")).unwrap();
    // Positive control: the parents are ordinary directories of the job;
    // what it leaves there stays, the placeholders do not.
    let (out, code) = e
        .sh(
            Some(i.clone()),
            "touch build/.git/HEAD && touch src/fine && ls -d .env && echo ok",
        )
        .await;
    assert_eq!((out.as_str(), code), (".env\nok\n", 0), "positive control");
    assert!(e.ws.join("build/.git/HEAD").exists());
    assert_eq!(
        left(&e.ws, &[".env", "build/.git/hooks", "secrets/later"]),
        Vec::<String>::new()
    );
    std::fs::remove_dir_all(e.ws.join("build")).unwrap();

    // Two jobs with the same intent at once: the first to end leaves the
    // placeholder the other still relies on; the last removes it.
    let mut p = ProcessStartParams::new(
        vec![
            "/bin/sh".into(),
            "-c".into(),
            "sleep 1.5; echo k > .env && echo created; touch build/.git/hooks/x && echo hooked; true".into(),
        ],
        wp(&e.ws),
        path_env(),
    );
    p.sandbox = Some(i.clone());
    let mut long = e.c.start(&p).await.unwrap();
    let (out, code) = e.sh(Some(i.clone()), "echo short").await;
    assert_eq!((out.as_str(), code), ("short\n", 0));
    assert!(
        e.ws.join(".env").is_dir(),
        "the long job's placeholder stays while it runs"
    );
    let mut out = Vec::new();
    while let Some(ch) = long.next_output().await.unwrap() {
        out.extend_from_slice(&ch.data);
    }
    let out = String::from_utf8_lossy(&out);
    assert!(!out.contains("created") && !out.contains("hooked"), "{out}");
    assert_eq!(left(&e.ws, &names), Vec::<String>::new());
    // A refused start (empty argv, relative cwd) leaves nothing behind.
    let mut p = exec_params(vec![], &e.ws, Some(i.clone()));
    let err = e.c.call(&p).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidParams), "{err}");
    assert!(
        err.to_string().contains("command must not be empty"),
        "{err}"
    );
    p.command = vec!["true".into()];
    p.cwd = "ws".into();
    let err = e.c.call(&p).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidParams), "{err}");
    assert_eq!(left(&e.ws, &names), Vec::<String>::new());
});

// 45, a variant: an agent killed mid-job leaves its placeholders; the next
// agent of the same user removes them when it starts (and never those of a
// live agent's job).
#[tokio::test]
async fn c45_leftovers_of_a_killed_agent_are_removed_at_the_next_start() {
    for unprivileged in [false, true] {
        let e = env(unprivileged, None).await;
        let live = env(unprivileged, None).await;
        let mut i = e.ws_write();
        i.filesystem.deny_write = vec![wp(&e.ws.join(".env"))];
        let mut li = live.ws_write();
        li.filesystem.deny_write = vec![wp(&live.ws.join(".env"))];
        let mut p =
            ProcessStartParams::new(vec!["sleep".into(), "30".into()], wp(&live.ws), path_env());
        p.sandbox = Some(li);
        let live_job = live.c.start(&p).await.unwrap();
        let mut p =
            ProcessStartParams::new(vec!["sleep".into(), "30".into()], wp(&e.ws), path_env());
        p.sandbox = Some(i);
        let job = e.c.start(&p).await.unwrap();
        assert!(e.ws.join(".env").is_dir());
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(e.agent_pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        // The job dies with its agent (its lifeline).
        let gone = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            !Path::new(&format!("/proc/{}", job.pid())).exists()
        });
        assert!(gone, "the job outlived its agent");
        // A new agent of the same user sweeps what the dead one left.
        let next = env(unprivileged, None).await;
        assert!(
            !e.ws.join(".env").exists(),
            "the placeholder of a killed agent's job is removed at the next start"
        );
        assert!(
            live.ws.join(".env").is_dir(),
            "a live agent's job keeps its placeholder"
        );
        live_job
            .signal(executor_protocol::types::process::SignalName::Kill)
            .await
            .unwrap();
        live_job.wait().await.unwrap();
        assert!(!live.ws.join(".env").exists());
        drop(next);
    }
}

/// `fs/writeFile` params for `path` under `intent`.
fn write_params(
    path: &Path,
    data: &[u8],
    atomic: bool,
    intent: &SandboxIntent,
) -> executor_protocol::types::fs::WriteFileParams {
    executor_protocol::types::fs::WriteFileParams {
        path: wp(path),
        data: serde_bytes::ByteBuf::from(data.to_vec()),
        mode: None,
        atomic,
        create_parents: false,
        sandbox: Some(intent.clone()),
        cwd: None,
    }
}

// Issue 14.1: the agent's confined fs requests act on what the resolution
// opened: a final symlink is never written through (atomic or not, to an
// existing file, a dangling name, a carve-out), and a directory swapped for
// a link to outside in a loop never lets a write land outside.
both!(
    c46_agent_fs_writes_act_on_descriptors,
    |e: Env| async move {
        let victim = e.outside.join("victim");
        std::fs::write(&victim, "untouched\n").unwrap();
        std::os::unix::fs::symlink(&victim, e.ws.join("src/to-victim")).unwrap();
        std::os::unix::fs::symlink(e.outside.join("created"), e.ws.join("src/dangling")).unwrap();
        std::os::unix::fs::symlink("../.git/config", e.ws.join("src/to-config")).unwrap();
        if e.uid != current_uid() {
            chown_r(&e.base, e.uid);
        }
        let mut i = e.ws_write();
        i.filesystem.deny_write = vec![wp(&e.ws.join(".git"))];
        for atomic in [false, true] {
            for link in ["src/to-victim", "src/dangling", "src/to-config"] {
                let r =
                    e.c.call(&write_params(&e.ws.join(link), b"EVIL\n", atomic, &i))
                        .await;
                if atomic {
                    // Atomic: the link itself is replaced by the new file.
                    r.unwrap_or_else(|err| panic!("atomic {link}: {err}"));
                    assert_eq!(std::fs::read(e.ws.join(link)).unwrap(), b"EVIL\n");
                } else {
                    assert!(r.is_err(), "in place through {link}");
                }
                assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched\n");
                assert!(
                    !e.outside.join("created").exists(),
                    "{link} atomic={atomic}"
                );
                assert_eq!(
                    std::fs::read_to_string(e.ws.join(".git/config")).unwrap(),
                    "[core]\n"
                );
            }
            // Put the links back for the in-place round.
            for (link, to) in [
                ("src/to-victim", victim.clone()),
                ("src/dangling", e.outside.join("created")),
                ("src/to-config", PathBuf::from("../.git/config")),
            ] {
                let _ = std::fs::remove_file(e.ws.join(link));
                std::os::unix::fs::symlink(to, e.ws.join(link)).unwrap();
            }
        }
        // Positive control: a plain file in the root, both ways.
        for atomic in [false, true] {
            e.c.call(&write_params(&e.ws.join("src/new"), b"fine\n", atomic, &i))
                .await
                .unwrap();
            assert_eq!(std::fs::read(e.ws.join("src/new")).unwrap(), b"fine\n");
        }

        // A race: `ws/sub` flips between a directory and a link to outside
        // while writes into it (atomic, in place, with parents) keep coming.
        let sub = e.ws.join("sub");
        let real = e.ws.join("sub-real");
        let link = e.ws.join("sub-link");
        std::fs::create_dir_all(&real).unwrap();
        std::os::unix::fs::symlink(&e.outside, &link).unwrap();
        std::fs::rename(&real, &sub).unwrap();
        if e.uid != current_uid() {
            chown_r(&sub, e.uid);
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flipper = {
            let (stop, sub, real, link) = (stop.clone(), sub.clone(), real.clone(), link.clone());
            std::thread::spawn(move || {
                let mut flips = 0u64;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    // sub (dir) -> sub-real, sub-link -> sub, then back.
                    if std::fs::rename(&sub, &real).is_ok() {
                        let _ = std::fs::rename(&link, &sub);
                        let _ = std::fs::rename(&sub, &link);
                        let _ = std::fs::rename(&real, &sub);
                        flips += 1;
                    }
                }
                flips
            })
        };
        let mut landed = 0;
        for n in 0..300 {
            let mut p = write_params(&sub.join(format!("f{n}")), b"x", n % 2 == 0, &i);
            p.create_parents = n % 3 == 0;
            if e.c.call(&p).await.is_ok() {
                landed += 1;
            }
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let flips = flipper.join().unwrap();
        let outside: Vec<_> = std::fs::read_dir(&e.outside)
            .unwrap()
            .flatten()
            .map(|x| x.file_name())
            .filter(|n| {
                let n = n.to_string_lossy();
                n.contains("executor")
                    || n.strip_prefix('f')
                        .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            })
            .collect();
        assert!(outside.is_empty(), "writes landed outside: {outside:?}");
        assert!(
            flips > 10 && landed > 0,
            "the race ran: {flips} flips, {landed} writes inside"
        );
    }
);

// Issue 14.2: the root of a sandbox is itself readable: `fs/stat` and
// `fs/walk` of a read root (and of `:cwd` with `cwd` = the root) work, and
// the walk never leaves it (a link out is an entry, not followed).
both!(c47_the_root_of_a_sandbox_is_readable, |e: Env| async move {
    use executor_protocol::types::fs::*;
    std::os::unix::fs::symlink(&e.outside, e.ws.join("out")).unwrap();
    if e.uid != current_uid() {
        chown_r(&e.base, e.uid);
    }
    let mut i = e.ws_write();
    i.filesystem.read = ReadRoots::Paths(vec![wp(&e.ws)]);
    i.filesystem.write = vec![];
    let st: StatResult =
        e.c.call(&StatParams {
            path: wp(&e.ws),
            follow_symlinks: true,
            sandbox: Some(i.clone()),
            cwd: None,
        })
        .await
        .unwrap();
    assert_eq!(st.kind, FileKind::Dir);
    let mut cwd_intent = i.clone();
    cwd_intent.filesystem.read = ReadRoots::Paths(vec![":cwd".into()]);
    for (intent, cwd) in [(i.clone(), None), (cwd_intent, Some(wp(&e.ws)))] {
        let mut params = executor_client::fs::walk_params(wp(&e.ws));
        params.sandbox = Some(intent);
        params.cwd = cwd;
        let page = e.c.call(&params).await.unwrap();
        let paths: Vec<String> = page.entries.iter().map(|x| x.path.display()).collect();
        assert!(paths.contains(&"src/main.rs".to_string()), "{paths:?}");
        assert!(paths.contains(&"out".to_string()), "{paths:?}");
        assert!(
            !paths.iter().any(|p| p.starts_with("out/")),
            "the walk left its root: {paths:?}"
        );
    }
    // A forged cursor cannot name a carve-out or a way out of the root.
    let mut hid = i.clone();
    hid.filesystem.deny_read = vec![wp(&e.ws.join("secrets"))];
    let forged = |dirs: &[&str]| {
        let queue = dirs
            .iter()
            .map(|d| rmpv::Value::Array(vec![rmpv::Value::Binary(d.as_bytes().to_vec()), 0.into()]))
            .collect();
        let c = rmpv::Value::Array(vec![
            1.into(),
            rmpv::Value::Binary(e.ws.to_str().unwrap().as_bytes().to_vec()),
            rmpv::Value::Array(queue),
            rmpv::Value::Nil,
        ]);
        let mut bytes = Vec::new();
        rmpv::encode::write_value(&mut bytes, &c).unwrap();
        let mut params = executor_client::fs::walk_params(wp(&e.ws));
        params.sandbox = Some(hid.clone());
        params.cursor = Some(serde_bytes::ByteBuf::from(bytes));
        params
    };
    let page = e.c.call(&forged(&["secrets", "src"])).await.unwrap();
    let paths: Vec<String> = page.entries.iter().map(|x| x.path.display()).collect();
    assert!(
        !paths.iter().any(|p| p.starts_with("secrets/")),
        "{paths:?}"
    );
    assert!(
        paths.contains(&"src/main.rs".to_string()),
        "positive control: {paths:?}"
    );
    assert!(page
        .errors
        .iter()
        .any(|x| x.code == ErrorCode::SandboxDenied));
    for bad in ["../outside", "/etc", "src/../secrets", "./secrets"] {
        let err = e.c.call(&forged(&[bad])).await.unwrap_err();
        assert_eq!(fs_err(err).code, ErrorCode::InvalidParams, "{bad}");
    }
    // Control: the parent of the root is still outside it.
    let mut params = executor_client::fs::walk_params(wp(&e.base));
    params.sandbox = Some(i.clone());
    let err = e.c.call(&params).await.unwrap_err();
    assert_eq!(fs_err(err).code, ErrorCode::SandboxDenied);
});

// A carve-out below a write root that is a file (`--rw F --deny-write
// F/.git`, what a Codex sandbox asks for a file it grants) needs nothing:
// the file is the job's mount point, which it can neither remove, move
// nor exchange for a directory (EBUSY, the mount) even when the directory
// around it is writable too; the file itself stays writable (positive
// control; before, the carve-out covered the whole file read-only).
both!(c45c_carve_outs_below_a_file_root, |e: Env| async move {
    let f = e.ws.join("granted");
    std::fs::write(&f, "old\n").unwrap();
    std::fs::create_dir_all(e.ws.join("d")).unwrap();
    if e.uid != current_uid() {
        chown_r(&e.ws, e.uid);
    }
    let mut i = e.ws_write();
    i.filesystem.write = vec![wp(&f)];
    i.filesystem.deny_write = vec![wp(&f.join(".git")), wp(&f.join(".codex/x"))];
    let (out, code) = e.sh(Some(i.clone()), "echo new > granted && echo ok").await;
    assert_eq!((out.as_str(), code), ("ok\n", 0), "positive control");
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "new\n");
    // The directory around it writable too.
    i.filesystem.write = vec![wp(&e.ws), wp(&f)];
    for (call, want) in [
        ("rename granted other", "errno=16"),
        ("exchange d granted", "errno=16"),
        ("unlink granted", "errno=16"),
    ] {
        assert_eq!(e.hostile(Some(i.clone()), call).await, want, "{call}");
    }
    let (out, code) = e
        .sh(
            Some(i.clone()),
            "echo newer > granted && mkdir -p d/.git && echo ok",
        )
        .await;
    assert_eq!((out.as_str(), code), ("ok\n", 0), "positive control");
    assert!(f.is_file() && !e.ws.join("other").exists());
});

// 45, found by an attack on the placeholders: a carve-out named through a
// symlink (the carve-out itself, or a parent) keeps its name: the link
// cannot be removed or replaced; a file where a parent directory would
// have to be is covered, not a reason to refuse.
both!(
    c45b_carve_outs_named_through_links_keep_their_names,
    |e: Env| async move {
        std::os::unix::fs::symlink("nowhere", e.ws.join(".env")).unwrap();
        std::fs::create_dir_all(e.ws.join("realrepo/.git")).unwrap();
        std::os::unix::fs::symlink("realrepo", e.ws.join("repo")).unwrap();
        std::fs::write(e.ws.join("build"), "gitdir: /x\n").unwrap();
        if e.uid != current_uid() {
            chown_r(&e.ws, e.uid);
        }
        let mut i = e.ws_write();
        i.filesystem.deny_write = vec![
            wp(&e.ws.join(".env")),
            wp(&e.ws.join("repo/.git/hooks")),
            wp(&e.ws.join("build/.git/hooks")),
        ];
        for op in [
            "rm .env",
            "echo PWN > .env",
            "rm repo",
            "mv repo repo-old",
            "mkdir -p repo/.git/hooks && echo x > repo/.git/hooks/pre-commit",
            "rm build",
            "mkdir -p build/.git/hooks",
        ] {
            let (out, code) = e.sh(Some(i.clone()), op).await;
            assert_ne!(code, 0, "{op}: {out}");
        }
        assert!(std::fs::symlink_metadata(e.ws.join(".env"))
            .unwrap()
            .file_type()
            .is_symlink());
        assert!(!e.ws.join("nowhere").exists(), "its placeholder is gone");
        assert!(std::fs::symlink_metadata(e.ws.join("repo"))
            .unwrap()
            .file_type()
            .is_symlink());
        assert!(!e.ws.join("realrepo/.git/hooks").exists());
        assert_eq!(
            std::fs::read_to_string(e.ws.join("build")).unwrap(),
            "gitdir: /x\n"
        );
        // Positive control: the rest of the root stays writable.
        let (out, code) = e
            .sh(Some(i), "touch realrepo/.git/HEAD src/fine && echo ok")
            .await;
        assert_eq!((out.as_str(), code), ("ok\n", 0), "positive control");
    }
);

// Found by an attack on the fs descriptors (issue 14.1): under an intent,
// the agent's own fs requests cannot move or remove what holds a carve-out,
// swap a carve-out's link, read its /proc or /dev, hang on a FIFO, or make
// setuid files; absolute links resolve as the host's with `read: "all"`.
both!(c48_agent_fs_requests_keep_carve_outs, |e: Env| async move {
    use executor_protocol::types::fs::*;
    std::os::unix::fs::symlink("nowhere", e.ws.join(".env")).unwrap();
    std::fs::create_dir_all(e.ws.join("realrepo/.git")).unwrap();
    std::os::unix::fs::symlink("realrepo", e.ws.join("repo")).unwrap();
    std::fs::create_dir_all(e.ws.join("other")).unwrap();
    std::os::unix::fs::symlink(e.ws.join("src/main.rs"), e.ws.join("src/abs")).unwrap();
    nix::unistd::mkfifo(
        &e.ws.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    if e.uid != current_uid() {
        chown_r(&e.ws, e.uid);
    }
    let mut i = e.ws_write();
    i.filesystem.deny_read = vec![wp(&e.ws.join("secrets/key"))];
    i.filesystem.deny_write = vec![
        wp(&e.ws.join(".git/config")),
        wp(&e.ws.join(".env")),
        wp(&e.ws.join("repo/.git/hooks")),
    ];
    let rename = |from: &str, to: &str| RenameParams {
        from: wp(&e.ws.join(from)),
        to: wp(&e.ws.join(to)),
        sandbox: Some(i.clone()),
        cwd: None,
    };
    for (from, to) in [
        ("secrets", "pub"),
        (".git", "old-git"),
        ("other", ".git"),
        ("repo", "repo-old"),
    ] {
        let err = e.c.call(&rename(from, to)).await.unwrap_err();
        assert_eq!(
            fs_err(err).code,
            ErrorCode::SandboxDenied,
            "rename {from} {to}"
        );
    }
    let err =
        e.c.call(&RemoveParams {
            path: wp(&e.ws.join(".git")),
            recursive: true,
            sandbox: Some(i.clone()),
            cwd: None,
        })
        .await
        .unwrap_err();
    assert_eq!(fs_err(err).code, ErrorCode::SandboxDenied, "remove .git");
    assert!(e.ws.join(".git/config").exists());
    let err =
        e.c.call(&write_params(&e.ws.join(".env"), b"PWN", true, &i))
            .await
            .unwrap_err();
    assert_eq!(
        fs_err(err).code,
        ErrorCode::SandboxDenied,
        "atomic over the .env link"
    );
    assert!(std::fs::symlink_metadata(e.ws.join(".env"))
        .unwrap()
        .file_type()
        .is_symlink());
    // Positive control: what holds no carve-out moves.
    e.c.call(&rename("other", "other2")).await.unwrap();
    let read = |path: &str| ReadFileParams {
        path: path.into(),
        offset: None,
        length: Some(64),
        sandbox: Some(i.clone()),
        cwd: None,
    };
    for path in ["/proc/self/environ", "/dev/zero"] {
        let err = e.c.call(&read(path)).await.unwrap_err();
        assert_eq!(fs_err(err).code, ErrorCode::SandboxDenied, "{path}");
    }
    let fifo = e.ws.join("fifo");
    let r = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        e.c.call(&read(fifo.to_str().unwrap())),
    )
    .await
    .expect("a FIFO does not hang the request");
    assert_eq!(fs_err(r.unwrap_err()).code, ErrorCode::Io);
    let abs = e.ws.join("src/abs");
    let ok: ReadFileResult = e.c.call(&read(abs.to_str().unwrap())).await.unwrap();
    assert_eq!(
        &ok.data[..],
        b"fn main() {}\n",
        "an absolute link, read: all"
    );
    let mut p = write_params(&e.ws.join("src/suid"), b"x", true, &i);
    p.mode = Some(0o4755);
    let err = e.c.call(&p).await.unwrap_err();
    assert_eq!(fs_err(err).code, ErrorCode::InvalidParams);
    // A root inside a carve-out is not a way around it.
    let mut inner = e.ws_write();
    inner.filesystem.read = ReadRoots::Paths(vec![wp(&e.ws.join("secrets"))]);
    inner.filesystem.deny_read = vec![wp(&e.ws.join("secrets"))];
    let err =
        e.c.call(&StatParams {
            path: wp(&e.ws.join("secrets")),
            follow_symlinks: true,
            sandbox: Some(inner),
            cwd: None,
        })
        .await
        .unwrap_err();
    assert_eq!(
        fs_err(err).code,
        ErrorCode::SandboxDenied,
        "root inside a carve-out"
    );
});

// Issue 16 (`-r` keeps symlinks): `fs/readLink` and `fs/createSymlink`
// resolve as every fs request does. A link is read only beneath a read
// root, made only beneath a write root (never through a parent that is a
// link out of it, never in a carve-out, never over an existing entry); a
// link made to a path outside the roots gives nothing, because every later
// request through it is resolved beneath the roots again.
both!(
    c49_symlink_requests_resolve_beneath_the_roots,
    |e: Env| async move {
        use executor_protocol::types::fs::*;
        let mut i = e.ws_write();
        i.filesystem.read = ReadRoots::Paths(vec![wp(&e.ws)]);
        i.filesystem.deny_write = vec![wp(&e.ws.join(".git"))];
        let read_link = |path: &Path| ReadLinkParams {
            path: wp(path),
            sandbox: Some(i.clone()),
            cwd: None,
        };
        let create = |path: &Path, target: &[u8]| CreateSymlinkParams {
            path: wp(path),
            target: executor_protocol::WirePath::from_bytes(target.to_vec()),
            sandbox: Some(i.clone()),
            cwd: None,
        };
        std::os::unix::fs::symlink("main.rs", e.ws.join("src/rel")).unwrap();
        std::os::unix::fs::symlink("f", e.outside.join("lnk")).unwrap();
        std::os::unix::fs::symlink(&e.outside, e.ws.join("up")).unwrap();
        // Positive control: a link inside the root is read as stored.
        let r: ReadLinkResult = e.c.call(&read_link(&e.ws.join("src/rel"))).await.unwrap();
        assert_eq!(r.target.as_bytes(), b"main.rs");
        // Reading a link outside the read roots, directly or through a
        // parent that leads out, is denied.
        for bad in [e.outside.join("lnk"), e.ws.join("up/lnk")] {
            let w = fs_err(e.c.call(&read_link(&bad)).await.unwrap_err());
            assert_eq!(w.code, ErrorCode::SandboxDenied, "{bad:?}: {w:?}");
            assert!(w.data_get("rule").is_some(), "{w:?}");
        }
        // A file that is no link: `io` naming it.
        let w = fs_err(
            e.c.call(&read_link(&e.ws.join("src/main.rs")))
                .await
                .unwrap_err(),
        );
        assert_eq!(w.code, ErrorCode::Io, "{w:?}");
        assert!(w.message.contains("not a symbolic link"), "{w:?}");
        // Creating outside the write roots, through a parent link out of
        // the root, in a carve-out, or as the root itself: denied, nothing
        // made.
        for bad in [
            e.outside.join("made"),
            e.ws.join("up/made"),
            e.ws.join(".git/made"),
            e.ws.clone(),
        ] {
            let w = fs_err(e.c.call(&create(&bad, b"x")).await.unwrap_err());
            assert_eq!(w.code, ErrorCode::SandboxDenied, "{bad:?}: {w:?}");
        }
        assert!(!e.outside.join("made").exists());
        assert!(std::fs::symlink_metadata(e.ws.join(".git/made")).is_err());
        // An existing entry is never replaced or followed: already_exists
        // naming it (a link, a dangling link, a file).
        std::os::unix::fs::symlink(e.outside.join("dangling-target"), e.ws.join("src/dangling"))
            .unwrap();
        for existing in ["src/rel", "src/dangling", "src/main.rs"] {
            let w = fs_err(
                e.c.call(&create(&e.ws.join(existing), b"elsewhere"))
                    .await
                    .unwrap_err(),
            );
            assert_eq!(w.code, ErrorCode::AlreadyExists, "{existing}: {w:?}");
            assert!(w.data_get("path").is_some(), "{w:?}");
        }
        assert!(!e.outside.join("dangling-target").exists());
        assert_eq!(
            std::fs::read_link(e.ws.join("src/rel")).unwrap(),
            Path::new("main.rs")
        );
        // A bad target is invalid_params naming it.
        let w = fs_err(
            e.c.call(&create(&e.ws.join("src/nul"), b"a\0b"))
                .await
                .unwrap_err(),
        );
        assert_eq!(w.code, ErrorCode::InvalidParams, "{w:?}");
        assert_eq!(
            w.data_get("field")
                .and_then(|f| f.as_str().map(String::from)),
            Some("target".to_string())
        );
        // Positive control: a link inside the write root, then a link to
        // a file outside every root: made (a target is bytes), but reading
        // through it under the same intent is denied.
        e.c.call(&create(&e.ws.join("src/made"), b"main.rs"))
            .await
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(e.ws.join("src/made")).unwrap(),
            "fn main() {}\n"
        );
        e.c.call(&create(&e.ws.join("src/to-passwd"), b"/etc/passwd"))
            .await
            .unwrap();
        e.c.call(&create(
            &e.ws.join("src/to-secret"),
            wp(&e.outside.join("secret")).as_bytes(),
        ))
        .await
        .unwrap();
        let read_file = |path: &Path| ReadFileParams {
            path: wp(path),
            offset: None,
            length: None,
            sandbox: Some(i.clone()),
            cwd: None,
        };
        let ok: ReadFileResult = e.c.call(&read_file(&e.ws.join("src/made"))).await.unwrap();
        assert_eq!(&ok.data[..], b"fn main() {}\n", "positive control");
        for through in ["src/to-passwd", "src/to-secret"] {
            let w = fs_err(e.c.call(&read_file(&e.ws.join(through))).await.unwrap_err());
            assert_eq!(w.code, ErrorCode::SandboxDenied, "{through}: {w:?}");
        }
        // Writing through the link is no way out either: an atomic write
        // replaces the link itself.
        e.c.call(&write_params(&e.ws.join("src/to-secret"), b"new", true, &i))
            .await
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(e.outside.join("secret")).unwrap(),
            "OUTSIDE-SECRET\n"
        );
    }
);

// 50. When a sandboxed job's exit is reported, nothing it started is left:
// a descendant that left the job's session and process group (setsid)
// and holds a lock is gone (its init kills and reaps every process of the
// namespace before it reports; the supervisor no longer waits for the
// namespaces' teardown). The control: while the job runs, the lock is held.
both!(
    c50_nothing_of_a_job_outlives_its_reported_exit,
    |e: Env| async move {
        if !std::path::Path::new("/usr/bin/python3").exists() {
            prerequisite_missing("python3, for a descendant that holds a lock");
            return;
        }
        let lock = e.ws.join("held.lock");
        std::fs::write(&lock, b"").unwrap();
        if e.uid != current_uid() {
            chown_r(&lock, e.uid);
        }
        let holder = "import fcntl,time; f=open('held.lock','w'); fcntl.flock(f, fcntl.LOCK_EX); \
                  print('held', flush=True); time.sleep(1000)";
        let mut p = ProcessStartParams::new(
            vec![
                "/bin/sh".into(),
                "-c".into(),
                format!("setsid /usr/bin/python3 -c \"{holder}\" </dev/null & read x"),
            ],
            wp(&e.ws),
            path_env(),
        );
        p.sandbox = Some(e.ws_write());
        let mut proc = e.c.start(&p).await.expect("start");
        let ch = proc.next_output().await.unwrap().unwrap();
        assert_eq!(&ch.data[..], b"held\n");
        let try_lock = || {
            let f = std::fs::File::open(&lock).unwrap();
            nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock).is_ok()
        };
        assert!(
            !try_lock(),
            "positive control: the descendant holds the lock"
        );
        proc.write(b"\n").await.unwrap();
        let st = proc.wait().await.unwrap();
        assert!(st.success(), "{st:?}");
        assert!(try_lock(), "a descendant outlived the reported exit");
    }
);

// 51. `fs/createSymlink` and `fs/readLink` against a parent swapped, in a
// loop, between a directory inside the write root and a link out of it
// (renameat2 RENAME_EXCHANGE by another thread, between the agent's
// check and its act): every link is made inside the root (in the
// directory, under whichever name it has by then) and no link outside is
// ever read. `..` out of the root and a target longer than PATH_MAX are
// refused (sandbox_denied, limit_exceeded naming the field). A link made
// to a file outside the read roots gives a sandboxed job nothing. Controls:
// both outcomes of the race happen (made and denied), a link inside is
// read, the same job reads a file inside.
both!(
    c51_symlink_requests_race_a_swapped_parent,
    |e: Env| async move {
        use executor_protocol::types::fs::*;
        let mut i = e.ws_write();
        i.filesystem.read = ReadRoots::Paths(vec![wp(&e.ws)]);
        let create = |path: &Path, target: &[u8], i: &SandboxIntent| CreateSymlinkParams {
            path: wp(path),
            target: executor_protocol::WirePath::from_bytes(target.to_vec()),
            sandbox: Some(i.clone()),
            cwd: None,
        };
        let (sw, alt) = (e.ws.join("sw"), e.ws.join("alt"));
        std::fs::create_dir(&sw).unwrap();
        std::os::unix::fs::chown(&sw, Some(e.uid), None).unwrap();
        std::os::unix::fs::symlink("f", e.outside.join("out-link")).unwrap();
        std::os::unix::fs::symlink(&e.outside, &alt).unwrap();
        let listing = executor_tests::cli::listing;
        let before = listing(&e.outside);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let swapper = {
            let (sw, alt, stop) = (sw.clone(), alt.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    nix::fcntl::renameat2(
                        nix::fcntl::AT_FDCWD,
                        &sw,
                        nix::fcntl::AT_FDCWD,
                        &alt,
                        nix::fcntl::RenameFlags::RENAME_EXCHANGE,
                    )
                    .unwrap();
                }
            })
        };
        let (mut made, mut denied) = (0, 0);
        for n in 0..3000 {
            if n >= 200 && made > 0 && denied > 0 {
                break;
            }
            match e.c.call(&create(&sw.join(format!("l{n}")), b"f", &i)).await {
                Ok(executor_protocol::types::Empty {}) => made += 1,
                Err(err) => {
                    let w = fs_err(err);
                    assert_eq!(w.code, ErrorCode::SandboxDenied, "{w:?}");
                    denied += 1;
                }
            }
            let read = ReadLinkParams {
                path: wp(&sw.join("out-link")),
                sandbox: Some(i.clone()),
                cwd: None,
            };
            if let Ok(r) = e.c.call(&read).await {
                let r: ReadLinkResult = r;
                panic!("read the link outside the roots: {:?}", r.target);
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        swapper.join().unwrap();
        assert!(made > 0 && denied > 0, "made {made}, denied {denied}");
        assert_eq!(listing(&e.outside), before, "nothing made outside");
        // Whichever of the two names the directory has now: the links.
        let dir = if std::fs::symlink_metadata(&sw).unwrap().is_dir() {
            &sw
        } else {
            &alt
        };
        assert_eq!(listing(dir).len(), made, "every link made is inside");
        // `..` out of the root, and an over-long target.
        let up = e.ws.join("src/../../outside/up");
        let w = fs_err(e.c.call(&create(&up, b"x", &i)).await.unwrap_err());
        assert_eq!(w.code, ErrorCode::SandboxDenied, "{w:?}");
        assert!(std::fs::symlink_metadata(e.outside.join("up")).is_err());
        let long = vec![b'a'; 4096];
        let w = fs_err(
            e.c.call(&create(&e.ws.join("src/long"), &long, &i))
                .await
                .unwrap_err(),
        );
        assert_eq!(w.code, ErrorCode::LimitExceeded, "{w:?}");
        assert_eq!(
            w.data_get("field")
                .and_then(|f| f.as_str().map(String::from)),
            Some("target".to_string())
        );
        assert!(std::fs::symlink_metadata(e.ws.join("src/long")).is_err());
        // A sandboxed job reading through a link made to a file outside
        // its read roots gets nothing; the control beside it is read.
        let mut ro = e.ws_write();
        ro.filesystem.read = ReadRoots::Paths(vec!["/usr".into(), wp(&e.ws)]);
        e.c.call(&create(
            &e.ws.join("src/to-secret"),
            wp(&e.outside.join("secret")).as_bytes(),
            &i,
        ))
        .await
        .unwrap();
        e.c.call(&create(&e.ws.join("src/to-main"), b"main.rs", &i))
            .await
            .unwrap();
        let (out, code) = e.sh(Some(ro.clone()), "cat src/to-main").await;
        assert_eq!(
            (out.as_str(), code),
            ("fn main() {}\n", 0),
            "positive control"
        );
        let (out, code) = e.sh(Some(ro), "cat src/to-secret").await;
        assert_ne!(code, 0, "{out}");
        assert!(!out.contains("OUTSIDE-SECRET"), "{out}");
    }
);

/// The namespace links (`net:[N]`, `user:[N]`, `ipc:[N]`) the process
/// `pid` holds open (the spawner's namespace pool).
fn held_namespaces(pid: u32) -> Vec<String> {
    fd_links(pid)
        .into_iter()
        .filter(|l| {
            ["net:[", "user:[", "ipc:["]
                .iter()
                .any(|n| l.starts_with(n))
        })
        .collect()
}

// 52. Namespaces made ahead (the spawner's pool of user, network and IPC
// namespaces) are never shared: ten jobs with a network namespace of their
// own, alive together (six started one after another, four at once), are
// each in a user, network, IPC and mount namespace of their own, none the
// agent's; a set the spawner held is the next job's and then gone from
// the pool (so the pool is what was tested); the uid is the agent's.
// Control: a job with `network: "allow"` is in the host's network
// namespace. (tests/suite/pool.rs: what the host mounts meanwhile.)
both!(
    c52_pooled_namespaces_are_never_shared,
    |e: Env| async move {
        if e.uid != current_uid() {
            chown_r(&e.ws, e.uid);
        }
        let host_net = std::fs::read_link("/proc/self/ns/net")
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let host: Vec<String> = ["net", "user", "ipc", "mnt"]
            .iter()
            .map(|n| {
                std::fs::read_link(format!("/proc/{}/ns/{n}", e.agent_pid))
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        let spawner = spawner_of(e.agent_pid).expect("the agent's spawner");
        let start = |i: usize, intent: SandboxIntent| {
            let script = format!(
                "{{ readlink /proc/self/ns/net /proc/self/ns/user /proc/self/ns/ipc \
             /proc/self/ns/mnt; id -u; }} > ns.{i}.tmp && mv ns.{i}.tmp ns.{i}; \
             exec sleep 30"
            );
            let mut p = ProcessStartParams::new(
                vec!["/bin/sh".into(), "-c".into(), script],
                wp(&e.ws),
                path_env(),
            );
            p.sandbox = Some(intent);
            let c = &e.c;
            async move { c.start(&p).await.unwrap() }
        };
        let read = |i: usize| {
            let f = e.ws.join(format!("ns.{i}"));
            async move {
                for _ in 0..300 {
                    if let Ok(t) = std::fs::read_to_string(&f) {
                        return t;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                panic!("{} never written", f.display());
            }
        };
        let (mut jobs, mut seen, mut from_pool) = (Vec::new(), Vec::<String>::new(), 0);
        for i in 0..10 {
            if i < 6 {
                // Time for the spawner to refill between requests.
                tokio::time::sleep(std::time::Duration::from_millis(150)).await;
            }
            let pooled = held_namespaces(spawner);
            jobs.push(start(i, e.ws_write()).await);
            if i >= 6 {
                continue;
            }
            let net = read(i).await.lines().next().unwrap_or_default().to_string();
            if pooled.contains(&net) {
                from_pool += 1;
                assert!(
                    !held_namespaces(spawner).contains(&net),
                    "{net} still pooled"
                );
            }
        }
        for i in 0..10 {
            let out = read(i).await;
            let lines: Vec<&str> = out.lines().collect();
            assert_eq!(lines.len(), 5, "{out}");
            assert_eq!(lines[4], e.uid.to_string(), "the agent's uid: {out}");
            for l in &lines[..4] {
                assert!(!host.contains(&l.to_string()), "the host's {l}: {out}");
                assert!(!seen.iter().any(|s| s == l), "{l} shared by two jobs");
                seen.push(l.to_string());
            }
        }
        assert!(
            from_pool >= 3,
            "only {from_pool} of 6 jobs had a pooled pair"
        );
        let mut open = e.ws_write();
        open.network = NetworkIntent::Allow;
        let control = start(10, open).await;
        let out = read(10).await;
        assert_eq!(
            out.lines().next(),
            Some(host_net.as_str()),
            "control: {out}"
        );
        for j in jobs.iter().chain(std::iter::once(&control)) {
            j.signal(executor_protocol::types::process::SignalName::Kill)
                .await
                .ok();
        }
    }
);

// 53. The request's cwd is entered inside the job's root only: a job
// flips a name in its write root between a directory and a magic link
// into the init's pre-pivot tree (`/proc/self/fd/N/../../..`, N among the
// descriptors the init holds while it builds the root); a second job whose
// cwd is that name never starts outside its root (no host /proc, no
// deny_read carve-out read), whichever of the two it finds. Control: the
// same job with the directory as cwd runs there. (Found by a review: the
// init entered cwd with a plain chdir, which follows magic links.)
both!(c53_cwd_never_leaves_the_root, |e: Env| async move {
    std::fs::create_dir_all(e.ws.join("real")).unwrap();
    if e.uid != current_uid() {
        chown_r(&e.ws, e.uid);
    }
    let ws = e.ws.display().to_string();
    let flip = format!(
        "cd {ws}; end=$(($(date +%s)+20)); while [ $(date +%s) -lt $end ]; do \
         for n in 3 4 5 6 7 8; do ln -sfn {ws}/real l1; mv -T l1 c; \
         ln -sfn /proc/self/fd/$n/../../.. l2; mv -T l2 c; done; done"
    );
    let mut p = ProcessStartParams::new(
        vec!["/bin/sh".into(), "-c".into(), flip],
        wp(&e.ws),
        path_env(),
    );
    p.sandbox = Some(e.ws_write());
    let flipper = e.c.start(&p).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let secret = e.outside.join("secret");
    let mut i = e.ws_write();
    i.filesystem.deny_read = vec![wp(&e.outside)];
    let probe = format!(
        "pwd; ls /proc | grep -c '^[0-9]'; cat {} .{} 2>&1; echo end",
        secret.display(),
        secret.display()
    );
    let (mut started, mut refused) = (0, 0);
    for _ in 0..30 {
        let r =
            e.c.call(&exec_params(
                vec!["/bin/sh".into(), "-c".into(), probe.clone()],
                &e.ws.join("c"),
                Some(i.clone()),
            ))
            .await;
        match r {
            Ok(r) => {
                started += 1;
                assert!(!r.output.contains("OUTSIDE-SECRET"), "{}", r.output);
                // Only the job's own processes (its shell, ls, grep).
                let pids: u32 = r
                    .output
                    .lines()
                    .nth(1)
                    .and_then(|l| l.trim().parse().ok())
                    .unwrap_or(0);
                assert!(pids <= 4, "the host's /proc: {}", r.output);
            }
            Err(_) => refused += 1,
        }
    }
    flipper
        .signal(executor_protocol::types::process::SignalName::Kill)
        .await
        .ok();
    assert!(started + refused == 30);
    let (out, code) = e.sh(Some(e.ws_write()), "cd real && pwd").await;
    assert_eq!(code, 0, "{out}");
    assert!(out.trim().ends_with("/real"), "control: {out}");
});

// 54. A supervisor killed from outside takes its sandboxed job with it: the
// job's init has a parent-death signal (set after its last credential
// change, then a check that the supervisor was still there), and the
// init's death kills its PID namespace. Twice: the agent's first job (its
// namespaces made by its own clone) and one whose user and network
// namespaces come from the spawner's pool. Control: each job lives while
// its supervisor does.
both!(
    c54_a_killed_supervisor_takes_its_sandboxed_job,
    |e: Env| async move {
        let spawner = spawner_of(e.agent_pid).expect("the agent's spawner");
        for pooled in [false, true] {
            let held = if pooled {
                let deadline = std::time::Instant::now() + WAIT;
                while held_namespaces(spawner).is_empty() && std::time::Instant::now() < deadline {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                held_namespaces(spawner)
            } else {
                Vec::new()
            };
            let mut p =
                ProcessStartParams::new(vec!["sleep".into(), "1000".into()], wp(&e.ws), path_env());
            p.sandbox = Some(e.ws_write());
            let proc = e.c.start(&p).await.unwrap();
            let job = proc.pid();
            let init = ppid(job);
            let supervisor = ppid(init);
            assert_eq!(comm(supervisor), "executor");
            if pooled {
                let net = std::fs::read_link(format!("/proc/{job}/ns/net"))
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                assert!(
                    held.contains(&net),
                    "the job's {net} came from the pool {held:?}"
                );
            }
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            assert!(alive(job) && alive(init), "control: the job runs");
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(supervisor as i32),
                nix::sys::signal::Signal::SIGKILL,
            )
            .unwrap();
            assert!(
                wait_dead(init, WAIT).await,
                "pooled {pooled}: the init outlived its supervisor"
            );
            assert!(
                wait_dead(job, WAIT).await,
                "pooled {pooled}: the job outlived its supervisor"
            );
        }
    }
);

// 55. A node the agent checked that is gone from a write root by the time
// the job starts (a pinned directory, a `deny_write` file) fails the start
// at the identity step, and nothing is made on the host in its place.
// Driven through `executor sandbox-exec` with a plan made of nodes that
// were checked, then removed. (One gone between that step and its mount
// is `ensure`'s case: it makes mount points only in the job's own tmpfs,
// never beneath a write root; linux::root::tests::ensure_makes_nothing_...)
// Control: the same plan with the nodes in place starts and runs.
#[test]
fn c55_the_init_makes_nothing_on_the_host() {
    use executor_sandbox::plan::{Node, WireNet, WirePlan};
    use executor_sandbox::spec::{Confinement, JobSpec};
    use executor_sandbox::trampoline::Status;
    use serde_bytes::ByteBuf;
    use std::os::fd::AsRawFd;
    let base = unique_tempdir("sbx-gone");
    let ws = base.join("ws");
    let (dir, file) = (ws.join("pinned"), ws.join("protected"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(&file, "x").unwrap();
    let abi = executor_sandbox::Capabilities::probe()
        .landlock_abi
        .expect("Landlock");
    let plan = WirePlan {
        landlock_abi: abi,
        read: None,
        write: vec![Node::at(&ws).unwrap()],
        tmp: None,
        tmp_bytes: None,
        deny_write: vec![Node::at(&file).unwrap()],
        deny_read: vec![],
        pin: vec![Node::at(&dir).unwrap()],
        symlinks: vec![],
        net: WireNet::Deny,
        read_over_tmp: vec![],
    };
    let bytes = |s: &str| ByteBuf::from(s.as_bytes().to_vec());
    let start = |plan: &WirePlan| -> Status {
        let spec = JobSpec {
            exec: bytes("/bin/true"),
            argv: vec![bytes("true")],
            env: vec![],
            cwd: bytes("/"),
            tty: false,
            confinement: Confinement::Sandboxed(Box::new(plan.clone())),
            rlimits: Default::default(),
        };
        let memfd = spec.to_memfd().unwrap();
        let (life_r, life_w) = nix::unistd::pipe().unwrap();
        let (status_r, status_w) = nix::unistd::pipe().unwrap();
        for fd in [&memfd, &life_r, &status_w] {
            nix::fcntl::fcntl(
                fd,
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
            )
            .unwrap();
        }
        let mut child = std::process::Command::new(executor_bin())
            .arg("sandbox-exec")
            .args(["--lifeline", &life_r.as_raw_fd().to_string()])
            .args(["--status", &status_w.as_raw_fd().to_string()])
            .args(["--spec", &memfd.as_raw_fd().to_string()])
            .spawn()
            .unwrap();
        drop((memfd, life_r, status_w));
        let mut msg = [0u8; Status::LEN];
        std::io::Read::read_exact(&mut std::fs::File::from(status_r), &mut msg).unwrap();
        child.wait().unwrap();
        drop(life_w);
        Status::decode(msg).expect("a status")
    };
    // Control: everything the plan names is there.
    assert!(
        matches!(start(&plan), Status::Started { .. }),
        "control: the plan starts"
    );
    // The start fails at the identity step and `gone` is not made again.
    let fails_without = |plan: &WirePlan, gone: &Path, what: &str| {
        let identity = executor_sandbox::linux::Step::Identity as u8;
        let st = start(plan);
        assert!(
            matches!(st, Status::SandboxFailed { step, .. } if step == identity),
            "{what}: {st:?}"
        );
        assert!(
            std::fs::symlink_metadata(gone).is_err(),
            "the {what} was made again on the host"
        );
    };
    std::fs::remove_dir(&dir).unwrap();
    fails_without(&plan, &dir, "pinned directory");
    std::fs::create_dir(&dir).unwrap();
    let mut plan = plan;
    plan.pin = vec![Node::at(&dir).unwrap()];
    std::fs::remove_file(&file).unwrap();
    fails_without(&plan, &file, "protected file");
}

// 56. Roots whose mount points lie in the job's own mounts still start:
// under its /dev (`/dev/null`, `/dev/shm`), under its `:tmp` (a workspace
// in the host's /tmp next to `:tmp`), a file root, nested write roots, a
// read root inside a write root. (The init makes mount points only in the
// job's own tmpfs root, /dev and `:tmp`, never beneath a mount bound from
// the host: c55 and linux::root::tests::ensure_makes_nothing_...)
both!(c56_roots_in_the_jobs_own_mounts, |e: Env| async move {
    std::fs::write(e.ws.join("file-root"), "FILEROOT\n").unwrap();
    std::fs::create_dir_all(e.ws.join("src/inner")).unwrap();
    if e.uid != current_uid() {
        chown_r(&e.ws, e.uid);
    }
    let system: Vec<executor_protocol::WirePath> = ["/usr", "/bin", "/lib", "/lib64", "/etc"]
        .iter()
        .filter(|p| Path::new(p).exists())
        .map(|p| (*p).into())
        .collect();
    let fresh = |read: Vec<executor_protocol::WirePath>,
                 write: Vec<executor_protocol::WirePath>| {
        let mut i = e.ws_write();
        i.filesystem.read = ReadRoots::Paths(system.iter().cloned().chain(read).collect());
        i.filesystem.write = write;
        i
    };
    let mut all_shm = e.ws_write();
    all_shm.filesystem.write = vec![wp(&e.ws), "/dev/shm".into()];
    let mut all_tmp = e.ws_write();
    all_tmp.filesystem.write = vec![wp(&e.ws), ":tmp".into()];
    let mut tmp_and_own = e.ws_write();
    tmp_and_own.filesystem.write = vec!["/tmp".into(), ":tmp".into()];
    let mut ro_in_rw = fresh(vec![wp(&e.ws.join("src/inner"))], vec![wp(&e.ws)]);
    ro_in_rw.filesystem.deny_write = vec![wp(&e.ws.join("src/inner"))];
    let file = e.ws.join("file-root");
    let cases = [
        (
            "read /dev/null",
            fresh(vec!["/dev/null".into()], vec![wp(&e.ws)]),
            "cat /dev/null".to_string(),
        ),
        (
            "read /dev/shm",
            fresh(vec!["/dev/shm".into()], vec![wp(&e.ws)]),
            "true".into(),
        ),
        ("read all, write /dev/shm", all_shm, "true".into()),
        (
            "fresh root, :tmp, ws under /tmp",
            fresh(vec![], vec![wp(&e.ws), ":tmp".into()]),
            "touch /tmp/x".into(),
        ),
        (
            "read all, :tmp, ws under /tmp",
            all_tmp,
            "touch /tmp/x src/y".into(),
        ),
        (
            "a file read root",
            fresh(vec![wp(&file)], vec![]),
            format!("cat {}", file.display()),
        ),
        (
            "nested write roots",
            fresh(vec![], vec![wp(&e.ws), wp(&e.ws.join("src"))]),
            "touch src/x".into(),
        ),
        (
            "a read root in a write root",
            ro_in_rw,
            "! touch src/inner/x".into(),
        ),
    ];
    for (name, intent, script) in cases {
        let (out, code) = e.sh(Some(intent), &format!("{script} && echo RAN")).await;
        assert_eq!((code, out.contains("RAN")), (0, true), "{name}: {out}");
    }
    // A root at /tmp with the job's own :tmp over it: the host's /tmp (the
    // workspace, the jobs' directory) is not there, so nothing in it needs
    // covering (it made every such start fail); run from `/`.
    let tmp_cases = [
        (
            "write /tmp and :tmp (the job's own /tmp over it)",
            tmp_and_own,
            "touch /tmp/x && test \"$(ls -A /tmp)\" = x",
        ),
        (
            "read /tmp and :tmp",
            fresh(vec!["/tmp".into()], vec![":tmp".into()]),
            "touch /tmp/x",
        ),
    ];
    for (name, intent, script) in tmp_cases {
        let p = exec_params(
            vec![
                "/bin/sh".into(),
                "-c".into(),
                format!("{script} && echo RAN"),
            ],
            Path::new("/"),
            Some(intent),
        );
        let r = e.c.call(&p).await.expect(name);
        assert_eq!(
            (r.exit_code, r.output.contains("RAN")),
            (Some(0), true),
            "{name}: {}",
            r.output
        );
    }
});

#[path = "sandbox_carve.rs"]
mod carve;
#[path = "sandbox_kernel.rs"]
mod kernel;

#[path = "sandbox_intent_additions.rs"]
mod intent_additions;
