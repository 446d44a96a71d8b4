//! Escape cases at the kernel's interface (issue 29, items 3 and 12, and
//! the roots `/`, `/dev` and a cwd under `/tmp`): set-id modes refused by
//! seccomp and nothing set-id left on the host, terminal ioctls that change
//! the line discipline or inject input refused, and roots the fresh root
//! could not be built from. Each case runs with the agent as root and as
//! uid 65534 (`both!` of the escape suite), each denial with its control.

use super::*;

/// The helper of these cases (sandbox_kernel.c), compiled once, executable
/// by any user.
fn helper() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| compile_for_any_user("hostile-kernel", "suite/sandbox_kernel.c", "kernel"))
        .clone()
}

/// The helper's lines `NAME RESULT` as a map.
fn verdicts(out: &str) -> std::collections::BTreeMap<String, String> {
    out.lines()
        .filter_map(|l| l.trim().split_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Every file and directory below `root` (not following links) whose mode
/// has S_ISUID or S_ISGID, with its mode.
fn set_id_below(root: &Path) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let mut found = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(p) = todo.pop() {
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if m.mode() & 0o6000 != 0 {
            found.push(format!("{} {:o}", p.display(), m.mode()));
        }
        if m.is_dir() {
            for e in std::fs::read_dir(&p).unwrap().flatten() {
                todo.push(e.path());
            }
        }
    }
    found
}

// Set-id modes (issue 29, item 3): every call that sets a mode refuses
// S_ISUID and S_ISGID (seccomp, EPERM): chmod, fchmod, fchmodat,
// fchmodat2, and the modes of mkdir, mknod and of open/openat/creat with
// O_CREAT or O_TMPFILE; openat2 (whose mode seccomp cannot read) is ENOSYS,
// so libc falls back to openat. Variants: bits the kernel drops around the
// set-id ones (the upper word, bits above umode_t), the magic link of a
// descriptor, an O_TMPFILE given a name by linkat, `cp -p`, `install -m`,
// `tar -xp` and `chmod u+s`/`g+s` of the shell's tools, a hard link to a
// set-id file of the host (EXDEV: another mount), file capabilities by
// xattr (EPERM: capabilities dropped). Then the write root is walked on the
// host: nothing in it is set-id. Controls: modes without set-id bits
// (0755, 0644, sticky 01777, a fifo) succeed, and open's mode without
// O_CREAT is not read.
both!(setid_modes_never_reach_the_host, |e: Env| async move {
    let w = e.ws.join("setid");
    std::fs::create_dir(&w).unwrap();
    // A set-uid program of the host, outside the write root, to copy,
    // archive and link.
    let suid = e.outside.join("suid-true");
    std::fs::copy("/bin/true", &suid).unwrap();
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let tar = e.outside.join("suid.tar");
    let st = std::process::Command::new("tar")
        .arg("-cpf")
        .arg(&tar)
        .arg("-C")
        .arg(&e.outside)
        .arg("suid-true")
        .status()
        .unwrap();
    assert!(st.success(), "tar -c");
    if e.uid != current_uid() {
        chown_r(&e.base, e.uid);
        // chown clears the bits: set them again, as the agent's user's.
        std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    }
    let out = e
        .hostile_kernel(Some(e.ws_write()), &format!("setid {}", w.display()))
        .await;
    let v = verdicts(&out);
    let refused = [
        "chmod-4755",
        "chmod-2755",
        "chmod-6755",
        "chmod-high-bits",
        "chmod-upper-word",
        "fchmod-4755",
        "fchmod-2711",
        "fchmodat-4755",
        "fchmodat2-2755",
        "chmod-proc-fd",
        "mkdir-2755",
        "mkdirat-6755",
        "mknod-reg-4755",
        "mknodat-reg-2755",
        "open-creat-4755",
        "openat-creat-2755",
        "creat-4755",
        "open-tmpfile-4755",
        "io_uring_setup",
    ];
    for name in refused {
        assert_eq!(
            v.get(name).map(String::as_str),
            Some(EPERM),
            "{name} must be refused by seccomp (EPERM): {out}"
        );
    }
    assert_eq!(
        v.get("openat2-creat-4755").map(String::as_str),
        Some("errno=38"),
        "openat2 must be ENOSYS (seccomp: its mode is out of reach): {out}"
    );
    assert_eq!(
        v.get("setxattr-capability").map(String::as_str),
        Some(EPERM),
        "file capabilities need CAP_SETFCAP (dropped): {out}"
    );
    for (name, verdict) in &v {
        if name.starts_with("control-") {
            assert_eq!(verdict, "ok", "positive control {name}: {out}");
        }
    }
    assert!(
        v.len() > refused.len() + 10,
        "the helper ran every try: {out}"
    );
    // The shell's tools: each fails or copies without the bits (stderr
    // into stdout's pipe: two pipes would interleave mid-line).
    let (w_, s_, t_) = (w.display(), suid.display(), tar.display());
    let script = format!(
        "exec 2>&1; touch {w_}/u {w_}/g; mkdir {w_}/gd; \
         chmod u+s {w_}/u; echo chmod-u+s=$?; chmod g+s {w_}/g; echo chmod-g+s=$?; \
         chmod g+s {w_}/gd; echo chmod-g+s-dir=$?; \
         mkdir -m 2755 {w_}/mkdir-m; echo mkdir-m=$?; \
         cp -p {s_} {w_}/cp-p; echo cp-p=$?; \
         install -m 4755 /bin/true {w_}/installed; echo install-m=$?; \
         mkdir {w_}/untar && tar -xpf {t_} -C {w_}/untar; echo tar-xp=$?; \
         ln {s_} {w_}/hardlink; echo hardlink=$?; \
         cp -a {s_} {w_}/cp-a; echo cp-a=$?; true"
    );
    let (out, code) = e.sh(Some(e.ws_write()), &script).await;
    assert_eq!(code, 0, "{out}");
    for tool in ["chmod-u+s", "chmod-g+s", "chmod-g+s-dir", "hardlink"] {
        assert!(
            out.lines()
                .any(|l| l.starts_with(tool) && !l.ends_with("=0")),
            "{tool} must fail (seccomp EPERM; a link: EXDEV, another mount): {out}"
        );
    }
    assert!(
        w.join("cp-p").exists() && w.join("installed").exists(),
        "control: the copies are made, without the bits: {out}"
    );
    let left = set_id_below(&e.ws);
    assert!(
        left.is_empty(),
        "set-id files or directories left on the host by a job (seccomp must refuse the mode): {left:?}\n{out}"
    );
    // Control: the host-side set-uid file the job copied is still set-uid
    // (the walk can see a set-id bit).
    assert_eq!(
        set_id_below(&e.outside).len(),
        1,
        "control: the walk sees set-id bits"
    );
});

// Terminal ioctls (issue 29, item 12): on a PTY job's terminal, changing
// the line discipline (TIOCSETD: loads and runs a discipline's kernel code),
// injecting input (TIOCSTI, TIOCLINUX), redirecting the console (TIOCCONS)
// and reconfiguring serial hardware (TIOCSSERIAL) are refused by seccomp
// (EPERM); variant: TIOCSETD with bits in the upper word, which the kernel
// drops. Controls: TIOCGETD, TIOCGWINSZ and tcgetattr/tcsetattr work.
both!(
    tty_ioctls_that_change_or_inject_are_refused,
    |e: Env| async move {
        let mut p = ProcessStartParams::new(
            vec![helper().display().to_string(), "tty".into()],
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
        let out = String::from_utf8_lossy(&out).replace('\r', "");
        let v = verdicts(&out);
        for name in [
            "TIOCSETD",
            "TIOCSTI",
            "TIOCLINUX",
            "TIOCCONS",
            "TIOCSSERIAL",
            "TIOCSETD-upper-word",
        ] {
            assert_eq!(
                v.get(name).map(String::as_str),
                Some(EPERM),
                "{name} must be refused by seccomp (EPERM): {out}"
            );
        }
        for name in [
            "control-TIOCGETD",
            "control-TIOCGWINSZ",
            "control-tcgetattr",
            "control-tcsetattr",
        ] {
            assert_eq!(
                v.get(name).map(String::as_str),
                Some("ok"),
                "positive control {name}: {out}"
            );
        }
        assert_eq!(proc.exit_status().unwrap().code, Some(0), "{out}");
    }
);

impl Env {
    /// Run the kernel helper with `args`; its output.
    async fn hostile_kernel(&self, intent: Option<SandboxIntent>, args: &str) -> String {
        let (out, _) = self
            .sh(intent, &format!("{} {args}", helper().display()))
            .await;
        out
    }
}

/// `executor-client ARGS` run as the agent's user of `e` (through
/// `setpriv` when that is not this process's), cwd `cwd`, stdin from
/// /dev/null; (exit code, stdout, stderr).
fn cli_as(e: &Env, cwd: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let client = executor_tests::cli::client_bin();
    let mut c = if e.uid != current_uid() {
        let mut c = std::process::Command::new("setpriv");
        c.arg(format!("--reuid={}", e.uid))
            .arg(format!("--regid={}", e.uid))
            .args(["--clear-groups", "--"])
            .arg(&client);
        c
    } else {
        std::process::Command::new(&client)
    };
    // uid 65534 has no login environment (its shell is nologin, its home
    // /nonexistent): its runs take only a standard PATH and HOME.
    let mut args: Vec<&str> = args.to_vec();
    if e.uid != current_uid() && args.first() == Some(&"run") {
        args.insert(1, "--clean-env");
    }
    let out = c
        .args(["--target", "local"])
        .args(&args)
        .current_dir(cwd)
        .env("EXECUTOR_BIN", executor_bin_for_any_user())
        .env("RUST_BACKTRACE", "0")
        .env_remove("EXECUTOR_TARGET")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("executor-client");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A device of the host that no job's /dev has (the job gets null, zero,
/// full, random, urandom, tty, its pts and shm).
fn host_only_device() -> Option<&'static str> {
    [
        "/dev/kmsg",
        "/dev/loop-control",
        "/dev/console",
        "/dev/ptmx",
    ]
    .into_iter()
    .find(|d| Path::new(d).exists())
}

// Roots at `/` and `/dev` (issue 29, functional): a read root `/` is
// `read: "all"` (the host's tree read-only, the job's own /dev and /proc
// over the host's); a root `/dev`, read or write, is the job's own /dev
// (a write root makes that tmpfs writable, never the host's /dev nor a
// device it does not have); a write root `/` makes the host's tree
// writable, still with the job's own /dev and /proc. Before, every one
// failed to start ("binding the roots: Operation not permitted"). Through
// the CLI (`--ro /`, `--ro /dev`, `--rw /dev`) and through intents.
// Controls: a device of the host is not in the job's /dev, a file made in
// the job's /dev is not on the host, a carve-out under a root `/` holds.
both!(roots_at_slash_and_dev_start, |e: Env| async move {
    let dev = host_only_device().expect("a host device no job has");
    let ws = e.ws.display().to_string();
    let made = format!("/dev/executor-made-{}", std::process::id());
    let system: Vec<executor_protocol::WirePath> = ["/usr", "/bin", "/lib", "/lib64", "/etc"]
        .iter()
        .filter(|p| Path::new(p).exists())
        .map(|p| (*p).into())
        .collect();
    let with = |read: Option<Vec<executor_protocol::WirePath>>,
                write: Vec<executor_protocol::WirePath>| {
        let mut i = e.ws_write();
        if let Some(r) = read {
            i.filesystem.read = ReadRoots::Paths(r);
        }
        i.filesystem.write = write;
        i
    };
    let plus = |extra: &str| -> Vec<executor_protocol::WirePath> {
        system.iter().cloned().chain([extra.into()]).collect()
    };
    // A carve-out in the host's /dev needs nothing: none of it is there.
    let mut dev_carved = with(None, vec!["/dev".into(), wp(&e.ws)]);
    dev_carved.filesystem.deny_read = vec![dev.into()];
    let mut slash_rw = with(None, vec!["/".into()]);
    slash_rw.filesystem.deny_write = vec![wp(&e.ws.join("src"))];
    let cases = [
        (
            "read /",
            with(Some(vec!["/".into()]), vec![wp(&e.ws)]),
            format!("cat /etc/hostname >/dev/null && touch {ws}/by-read-slash && test -c /dev/null && test ! -e {dev} && test -d /proc/self/fd && ! touch /etc/x"),
        ),
        (
            "read /dev",
            with(Some(plus("/dev")), vec![wp(&e.ws)]),
            format!("test -c /dev/null && ls /dev >/dev/null && test ! -e {dev} && ! touch {made}"),
        ),
        (
            "write /dev",
            with(None, vec!["/dev".into(), wp(&e.ws)]),
            format!("touch {made} && test -f {made} && echo x > /dev/null && test ! -e {dev} && test -d /dev/shm"),
        ),
        (
            "write /dev, fresh root",
            with(Some(system.clone()), vec!["/dev".into(), wp(&e.ws)]),
            format!("mkdir /dev/d && touch /dev/d/f && test ! -e {dev}"),
        ),
        (
            "write /dev, deny_read of a host device",
            dev_carved,
            format!("test ! -e {dev} && touch {made}"),
        ),
        (
            "write /",
            slash_rw,
            format!("touch {ws}/by-write-slash && test ! -e {dev} && test -d /proc/self/fd && ! touch {ws}/src/x && ! touch {made}"),
        ),
    ];
    for (name, intent, script) in cases {
        let (out, code) = e.sh(Some(intent), &format!("{script} && echo RAN")).await;
        assert_eq!((code, out.contains("RAN")), (0, true), "{name}: {out}");
    }
    assert!(e.ws.join("by-read-slash").exists() && e.ws.join("by-write-slash").exists());
    assert!(
        !Path::new(&made).exists(),
        "a file made in the job's /dev is on the host"
    );
    assert!(
        !e.ws.join("src/x").exists(),
        "deny_write under a write root /"
    );
    // The CLI's flags.
    for (args, script) in [
        (
            &["--ro", "/"][..],
            format!("cat /etc/hostname >/dev/null && test ! -e {dev}"),
        ),
        (
            &["--ro", "/usr", "--ro", "/dev"][..],
            "test -c /dev/null".to_string(),
        ),
        (
            &["--rw", "/dev"][..],
            format!("touch {made} && test ! -e {dev}"),
        ),
    ] {
        let mut argv: Vec<&str> = vec!["run", "--cwd", "/"];
        argv.extend(args);
        argv.extend(["--", "/usr/bin/sh", "-c", &script]);
        let (code, out, err) = cli_as(&e, &e.ws, &argv);
        assert_eq!(code, Some(0), "{args:?}: {out}{err}");
    }
    assert!(
        !Path::new(&made).exists(),
        "a file made in the job's /dev is on the host"
    );
});

// A cwd under /tmp with the job's own :tmp (issue 29, functional): a root
// at or above /tmp (`read: "all"`, a write root `/tmp`) grants the cwd,
// but the job's /tmp is its own: the cwd is bound at its place over it,
// with the access that root gives, its carve-outs covered. Before, every
// such start failed ("entering the working directory: No such file or
// directory", no path named): the README's test command in a clone under
// /tmp (`executor-client run --tmp` from there). A cwd the job cannot
// enter is `sandbox_unavailable` naming it and what to grant: one no root
// grants; one inside a deny_read directory (variant: never exposed by the
// binding); one in the jobs' directory (variant: another job's :tmp is
// never bound). Controls: the job's /tmp is still its own, the rest of the
// host's /tmp stays hidden.
both!(
    a_granted_cwd_under_tmp_is_entered_with_its_own_tmp,
    |e: Env| async move {
        let ws = e.ws.display().to_string();
        let (out, code) = e
            .sh(None, &format!("echo host > {}/beside", e.base.display()))
            .await;
        assert_eq!(code, 0, "{out}");
        let tmp_all = {
            let mut i = e.ws_write();
            i.filesystem.write = vec![":tmp".into()];
            i
        };
        let mut tmp_all_carved = tmp_all.clone();
        tmp_all_carved.filesystem.deny_read = vec![wp(&e.ws.join("secrets"))];
        let mut tmp_rw = e.ws_write();
        tmp_rw.filesystem.write = vec!["/tmp".into(), ":tmp".into()];
        tmp_rw.filesystem.deny_write = vec![wp(&e.ws.join(".git"))];
        let beside = e.base.join("beside").display().to_string();
        let cases = [
        (
            "read all, :tmp",
            tmp_all,
            format!("test \"$(pwd)\" = {ws} && cat src/main.rs >/dev/null && ! touch new && touch /tmp/own && test ! -e {beside}"),
        ),
        (
            "read all, :tmp, deny_read in the cwd",
            tmp_all_carved,
            "! cat secrets/key && cat src/main.rs >/dev/null".to_string(),
        ),
        (
            "write /tmp, :tmp, deny_write in the cwd",
            tmp_rw,
            format!("test \"$(pwd)\" = {ws} && touch new && ! touch .git/x && test ! -e {beside}"),
        ),
    ];
        for (name, intent, script) in cases {
            let (out, code) = e.sh(Some(intent), &format!("{script} && echo RAN")).await;
            assert_eq!((code, out.contains("RAN")), (0, true), "{name}: {out}");
        }
        assert!(
            e.ws.join("new").exists(),
            "written through the write root /tmp"
        );
        assert!(!e.ws.join(".git/x").exists(), "deny_write in the cwd");
        // Cwds the job cannot enter: the error names the cwd and what to grant.
        let mut system_only = e.ws_write();
        system_only.filesystem.read = ReadRoots::Paths(
            ["/usr", "/bin", "/lib", "/lib64", "/etc"]
                .iter()
                .filter(|p| Path::new(p).exists())
                .map(|p| (*p).into())
                .collect(),
        );
        system_only.filesystem.write = vec![":tmp".into()];
        let mut in_secrets = e.ws_write();
        in_secrets.filesystem.write = vec![":tmp".into()];
        in_secrets.filesystem.deny_read = vec![wp(&e.ws.join("secrets"))];
        let mut no_tmp = system_only.clone();
        no_tmp.filesystem.write = vec![wp(&e.ws)];
        let jobs = std::path::PathBuf::from(format!("/tmp/executor-jobs-{}", e.uid));
        let mut in_jobs = e.ws_write();
        in_jobs.filesystem.write = vec![":tmp".into()];
        for (name, intent, cwd) in [
            ("no root grants it", system_only, e.ws.clone()),
            (
                "outside every root (found by the init)",
                no_tmp,
                e.outside.clone(),
            ),
            (
                "inside a deny_read directory",
                in_secrets,
                e.ws.join("secrets"),
            ),
            ("the jobs' directory", in_jobs, jobs.clone()),
        ] {
            if !cwd.is_dir() {
                prerequisite_missing(&format!("{} (made by the agent)", cwd.display()));
                continue;
            }
            let p = exec_params(vec!["/bin/cat".into(), "key".into()], &cwd, Some(intent));
            let err = remote(e.c.call(&p).await.expect_err(name));
            assert_eq!(err.code, ErrorCode::SandboxUnavailable, "{name}: {err:?}");
            assert!(
                err.message.contains(&cwd.display().to_string()) && err.message.contains("grant"),
                "{name}: the error names the cwd and what to grant: {}",
                err.message
            );
            assert!(!err.message.contains("TOPSECRET"), "{name}");
            assert!(
                !err.message.contains("  "),
                "{name}: the message reads as one sentence: {}",
                err.message
            );
        }
        // The CLI with a cwd under /tmp (a clone there): `run --tmp` enters
        // it (runs start in the home directory unless `--cwd` says).
        let ws_arg = e.ws.display().to_string();
        let (code, out, err) = cli_as(
            &e,
            &e.ws,
            &["run", "--tmp", "--cwd", &ws_arg, "--", "/bin/pwd"],
        );
        assert_eq!((code, out.trim()), (Some(0), ws.as_str()), "{err}");
    }
);

// The kernel's interfaces under a write root `/` (review of the roots `/`
// and `/dev`): a write root `/` grants the host's files, not its kernel's
// settings. Before, the writable clone kept the host's /sys (and its
// cgroup trees) writable and the job's own /proc was writable too, and
// Landlock's grant of `/` covered both: as root, a job rewrote the whole
// host's sysctls (/proc/sys/vm/swappiness) and sysfs
// (/sys/kernel/mm/...), as any user its /proc/self files. Now every mount
// of a kernel interface in the clone (sysfs, cgroup, tracefs, bpf, ...,
// with what is beneath) and the job's /proc are read-only (mount
// namespace: EROFS). Variant: the same with `read: "all"` and a write
// root elsewhere (Landlock and the read-only clone). Controls: the write
// root is written, /proc and /sys are read.
both!(
    a_write_root_slash_leaves_kernel_interfaces_read_only,
    |e: Env| async move {
        let ws = e.ws.display().to_string();
        let mut slash = e.ws_write();
        slash.filesystem.write = vec!["/".into()];
        let mut all = e.ws_write();
        all.filesystem.write = vec![wp(&e.ws)];
        let script = format!(
            "v=$(cat /proc/sys/vm/swappiness); echo $v > /proc/sys/vm/swappiness && echo SYSCTL-WRITTEN; \
             echo renamed > /proc/self/comm && echo PROC-SELF-WRITTEN; \
             for f in /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/profiling /sys/module/printk/parameters/time; do \
               test -f $f && (: >> $f) 2>/dev/null && echo SYSFS-WRITTEN $f; done; \
             while read -r id parent mm root point opts rest; do t=${{rest#*- }}; t=${{t%% *}}; \
               case ' proc sysfs cgroup cgroup2 securityfs debugfs tracefs bpf pstore configfs efivarfs fusectl binfmt_misc ' in \
                 *\" $t \"*) case \"$opts\" in ro|ro,*) ;; *) echo \"RW-KERNEL $point $t\";; esac;; esac; \
             done < /proc/self/mountinfo; \
             touch {ws}/by-slash-kernel && cat /proc/self/status >/dev/null && ls /sys >/dev/null && echo CONTROL-OK"
        );
        for (name, intent) in [("write /", slash), ("read all, write the workspace", all)] {
            let _ = std::fs::remove_file(e.ws.join("by-slash-kernel"));
            let (out, _) = e.sh(Some(intent), &script).await;
            assert!(
                out.contains("CONTROL-OK") && e.ws.join("by-slash-kernel").exists(),
                "{name}: control: the write root is written, /proc and /sys read: {out}"
            );
            for bad in [
                "SYSCTL-WRITTEN",
                "PROC-SELF-WRITTEN",
                "SYSFS-WRITTEN",
                "RW-KERNEL",
            ] {
                assert!(
                    !out.contains(bad),
                    "{name}: {bad}: the kernel's interfaces must stay read-only (mount namespace: \
                     read-only /proc and kernel filesystems; Landlock): {out}"
                );
            }
        }
    }
);

// Set-id bits through the agent's own writes (review of item 3): a job
// that rewrites a set-id file loses the bits (the kernel clears them on a
// write by a process without CAP_FSETID), but the agent's `fs/writeFile`
// without `mode` gave the new version "the existing file's permission
// bits" by fchmod, set-id bits included, so a confined client turned a
// set-uid program of a write root into its own code, still set-uid.
// Under an intent the agent keeps the permission bits only (agent
// policy): atomic `fs/writeFile`, the variants `atomic: false` (the file
// written in place by an agent holding CAP_FSETID as root) and
// `fs/openWrite` + `fs/commit`. Controls: the rest of the mode is kept,
// the content is the new one, and without an intent the bits are kept as
// documented (the check can see them).
both!(
    confined_fs_writes_never_keep_set_id_bits,
    |e: Env| async move {
        use executor_protocol::types::fs::*;
        use std::os::unix::fs::MetadataExt;
        if e.uid != current_uid() {
            chown_r(&e.base, e.uid);
        }
        let f = e.ws.join("setid-program");
        let reset = |mode: u32| {
            std::fs::write(&f, b"#!/bin/sh\ntrue\n").unwrap();
            std::os::unix::fs::chown(&f, Some(e.uid), Some(e.uid)).unwrap();
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(std::fs::metadata(&f).unwrap().mode() & 0o7777, mode);
        };
        let data = b"#!/bin/sh\necho planted\n";
        let intent = e.ws_write();
        for mode in [0o4755, 0o2755, 0o6750] {
            for way in ["writeFile atomic", "writeFile in place", "openWrite+commit"] {
                reset(mode);
                match way {
                    "openWrite+commit" => {
                        let h: HandleResult =
                            e.c.call(&OpenWriteParams {
                                path: wp(&f),
                                mode: None,
                                create_parents: false,
                                mtime_ns: None,
                                atime_ns: None,
                                sandbox: Some(intent.clone()),
                                cwd: None,
                            })
                            .await
                            .unwrap();
                        e.c.call(&WriteBlockParams {
                            handle: h.handle,
                            offset: 0,
                            data: serde_bytes::ByteBuf::from(data.to_vec()),
                            sandbox: Some(intent.clone()),
                            cwd: None,
                        })
                        .await
                        .unwrap();
                        e.c.call(&CommitParams {
                            handle: h.handle,
                            sandbox: Some(intent.clone()),
                            cwd: None,
                        })
                        .await
                        .unwrap();
                    }
                    _ => {
                        let atomic = way == "writeFile atomic";
                        e.c.call(&write_params(&f, data, atomic, &intent))
                            .await
                            .unwrap();
                    }
                }
                let m = std::fs::metadata(&f).unwrap().mode() & 0o7777;
                assert_eq!(std::fs::read(&f).unwrap(), data, "{way}: the new content");
                assert_eq!(
                    format!("{m:o}"),
                    format!("{:o}", mode & 0o777),
                    "{way} {mode:o}: a confined write leaves no set-id bit (agent policy), \
                     the permission bits stay"
                );
            }
        }
        // Control: without an intent the existing mode is kept, bits
        // included (the check sees them).
        reset(0o4755);
        let mut p = write_params(&f, data, true, &intent);
        p.sandbox = None;
        e.c.call(&p).await.unwrap();
        assert_eq!(
            format!("{:o}", std::fs::metadata(&f).unwrap().mode() & 0o7777),
            "4755",
            "control: unconfined, the existing mode is kept"
        );
        reset(0o755);
    }
);

// The kernel's interfaces through the agent's own writes (review of the
// root `/`): under a write root `/`, `fs/writeFile` in place
// (`atomic: false`) opened and wrote a sysfs file as the agent itself,
// with every capability of a root agent (here the host's
// transparent_hugepage setting, given its current value back). Jobs under
// the same intent see /sys read-only; the agent's fs confinement now
// carves /sys out of a write root that holds it (agent policy:
// sandbox_denied), as it does /proc and /dev for every access. Variant:
// `fs/openWrite` there. Controls: /sys is still read under the intent, the
// same in-place write lands in the workspace.
both!(
    a_write_root_slash_does_not_reach_sysfs_through_the_agent,
    |e: Env| async move {
        use executor_protocol::types::fs::*;
        if e.uid != current_uid() {
            chown_r(&e.base, e.uid);
        }
        let knob = Path::new("/sys/kernel/mm/transparent_hugepage/enabled");
        let Ok(now) = std::fs::read_to_string(knob) else {
            prerequisite_missing(&knob.display().to_string());
            return;
        };
        let value = now
            .split('[')
            .nth(1)
            .and_then(|s| s.split(']').next())
            .unwrap_or("madvise")
            .to_string();
        let mut slash = e.ws_write();
        slash.filesystem.write = vec!["/".into()];
        let err = remote(
            e.c.call(&write_params(knob, value.as_bytes(), false, &slash))
                .await
                .expect_err("a sysfs write through the agent"),
        );
        assert_eq!(
            err.code,
            ErrorCode::SandboxDenied,
            "fs/writeFile in place into /sys under write / (agent policy): {err:?}"
        );
        let err = remote(
            e.c.call(&OpenWriteParams {
                path: wp(Path::new("/sys/kernel/executor-made")),
                mode: None,
                create_parents: false,
                mtime_ns: None,
                atime_ns: None,
                sandbox: Some(slash.clone()),
                cwd: None,
            })
            .await
            .expect_err("fs/openWrite in /sys"),
        );
        assert_eq!(err.code, ErrorCode::SandboxDenied, "{err:?}");
        // Controls.
        let r: ReadFileResult =
            e.c.call(&ReadFileParams {
                path: wp(knob),
                offset: None,
                length: None,
                sandbox: Some(slash.clone()),
                cwd: None,
            })
            .await
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&r.data), now);
        let f = e.ws.join("in-place");
        e.c.call(&write_params(&f, b"x", false, &slash))
            .await
            .unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"x");
    }
);

// The jobs' private directory through the agent's own requests (review of
// the cwd under /tmp): jobs never see /tmp/executor-jobs-<uid> (other
// jobs' :tmp, the placeholder records and locks), but the agent's fs
// requests under an intent with a write root `/tmp` (or `/`) wrote and
// listed there. Now it is a carve-out of every confined fs request (agent
// policy: sandbox_denied), as for jobs. Variants: a listing, a read, and
// the write root `/`. Control: the same write in the workspace succeeds.
both!(
    confined_fs_requests_never_reach_the_jobs_directory,
    |e: Env| async move {
        use executor_protocol::types::fs::*;
        if e.uid != current_uid() {
            chown_r(&e.base, e.uid);
        }
        let jobs = PathBuf::from(format!("/tmp/executor-jobs-{}", e.uid));
        if !jobs.is_dir() {
            prerequisite_missing(&format!("{} (made by the agent)", jobs.display()));
            return;
        }
        let planted = jobs.join("planted-by-a-request");
        for root in ["/tmp", "/"] {
            let mut i = e.ws_write();
            i.filesystem.write = vec![root.into()];
            let err = remote(
                e.c.call(&write_params(&planted, b"x", true, &i))
                    .await
                    .expect_err("a write in the jobs' directory"),
            );
            assert_eq!(
                err.code,
                ErrorCode::SandboxDenied,
                "write root {root}: a write in the jobs' directory (agent policy): {err:?}"
            );
            let mut walk = executor_client::fs::walk_params(wp(&jobs));
            walk.sandbox = Some(i.clone());
            let err = remote(e.c.call(&walk).await.expect_err("a listing"));
            assert_eq!(err.code, ErrorCode::SandboxDenied, "{root}: {err:?}");
            let err = remote(
                e.c.call(&ReadFileParams {
                    path: wp(&jobs.join("placeholders.lock")),
                    offset: None,
                    length: None,
                    sandbox: Some(i.clone()),
                    cwd: None,
                })
                .await
                .expect_err("a read"),
            );
            assert_eq!(err.code, ErrorCode::SandboxDenied, "{root}: {err:?}");
            // Control.
            e.c.call(&write_params(&e.ws.join("beside-jobs"), b"x", true, &i))
                .await
                .unwrap();
        }
        assert!(!planted.exists(), "planted in the jobs' directory");
    }
);
