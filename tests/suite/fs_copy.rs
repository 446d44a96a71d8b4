//! `fs/copy` (issue 30, docs/PROTOCOL.md §5) over the real agent, as root
//! and as an unprivileged user: a file, a tree, symlinks copied as links
//! (never followed), special files skipped in a tree and refused as the
//! source, a directory never copied into itself, setuid/setgid never
//! copied, the bounds (`max_walk_entries`, `max_copy_bytes`) reported, and
//! the sandbox (read roots, write roots, carve-outs, hard links) holding
//! with a positive control beside each denial.

use executor_client::sandbox::Intent;
use executor_client::{Client, ClientOptions, Error, ErrorCode};
use executor_protocol::types::fs::CopyResult;
use executor_tests::*;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

fn code(e: &Error) -> Option<ErrorCode> {
    e.code()
}

fn field(e: &Error) -> Option<String> {
    match e {
        Error::Remote(w) => w
            .data_get("field")
            .and_then(|v| v.as_str())
            .map(str::to_string),
        _ => None,
    }
}

/// A tree under a fresh directory owned by the agent's uid:
/// `src/{a (4755), sub/ (2755) {b}, link -> a, abs -> /etc/passwd, fifo}`.
/// Returns the base directory and a client of the agent.
async fn case(tag: &str, unprivileged: bool) -> (PathBuf, Client) {
    let base = unique_tempdir(tag);
    chmod(&base, 0o755);
    let src = base.join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("a"), "AAA").unwrap();
    std::fs::write(src.join("sub/b"), "BBBB").unwrap();
    std::os::unix::fs::symlink("a", src.join("link")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", src.join("abs")).unwrap();
    nix::unistd::mkfifo(
        &src.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    // A character device (what /dev/null is): never opened by a copy.
    nix::sys::stat::mknod(
        &src.join("dev"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(1, 3),
    )
    .expect("mknod (the tests run as root)");
    let (cmd, uid) = agent_command(unprivileged);
    chown_r(&base, uid);
    // After the chown (which clears set-id bits).
    chmod(&src.join("a"), 0o4755);
    chmod(&src.join("sub"), 0o2755);
    let c = Client::spawn(cmd, ClientOptions::default())
        .await
        .expect("agent");
    (base, c)
}

root_and_unprivileged!(
    copies_files_trees_and_symlinks_without_set_id_bits,
    |unprivileged: bool| async move {
        let (base, c) = case("copy", unprivileged).await;
        let (src, at) = (base.join("src"), |n: &str| base.join(n));

        // A file: its bytes and permission bits, never setuid.
        let r = c
            .copy(src.join("a").as_path(), at("f1").as_path(), false)
            .await
            .unwrap();
        assert_eq!(
            r,
            CopyResult {
                entries: 1,
                bytes: 3,
                skipped: 0
            }
        );
        assert_eq!(std::fs::read_to_string(at("f1")).unwrap(), "AAA");
        assert_eq!(mode(&at("f1")), 0o755, "setuid dropped, the rest kept");

        // A symlink: copied as a link, never followed.
        c.copy(src.join("link").as_path(), at("l1").as_path(), false)
            .await
            .unwrap();
        assert_eq!(std::fs::read_link(at("l1")).unwrap(), Path::new("a"));

        // A directory needs recursive.
        let e = c
            .copy(src.as_path(), at("d0").as_path(), false)
            .await
            .unwrap_err();
        assert_eq!(field(&e).as_deref(), Some("recursive"), "{e}");
        assert!(!at("d0").exists());

        // A tree: files, directories, links as links, the FIFO left out.
        let r = c
            .copy(src.as_path(), at("d").as_path(), true)
            .await
            .unwrap();
        assert_eq!(r.bytes, 7);
        assert_eq!(r.skipped, 2, "the FIFO and the device: {r:?}");
        assert_eq!(r.entries, 6, "d, a, abs, link, sub, sub/b: {r:?}");
        assert_eq!(std::fs::read_to_string(at("d/a")).unwrap(), "AAA");
        assert_eq!(std::fs::read_to_string(at("d/sub/b")).unwrap(), "BBBB");
        assert_eq!(std::fs::read_link(at("d/link")).unwrap(), Path::new("a"));
        assert_eq!(
            std::fs::read_link(at("d/abs")).unwrap(),
            Path::new("/etc/passwd")
        );
        for special in ["d/fifo", "d/dev"] {
            assert!(std::fs::symlink_metadata(at(special)).is_err(), "{special}");
        }
        assert_eq!(mode(&at("d/a")), 0o755);
        assert_eq!(mode(&at("d/sub")), 0o755, "setgid dropped on a directory");
        assert_eq!(mode(&at("d")), mode(&src));

        // Into an existing directory: merged (a file replaced, a link's
        // name taken is already_exists).
        std::fs::write(at("d/a"), "old").unwrap();
        let e = c
            .copy(src.as_path(), at("d").as_path(), true)
            .await
            .unwrap_err();
        assert_eq!(code(&e), Some(ErrorCode::AlreadyExists), "{e}");
        assert_eq!(std::fs::read_to_string(at("d/a")).unwrap(), "AAA");

        // A FIFO or a device as the source is refused (never opened).
        for special in [
            src.join("fifo"),
            src.join("dev"),
            PathBuf::from("/dev/null"),
        ] {
            let e = c
                .copy(special.as_path(), at("ff").as_path(), false)
                .await
                .unwrap_err();
            assert_eq!(field(&e).as_deref(), Some("source"), "{special:?}: {e}");
            assert!(std::fs::symlink_metadata(at("ff")).is_err());
        }

        // A directory into itself or below it is refused, nothing made.
        for dest in [src.join("sub/in"), src.clone(), src.join("sub/../sub/x")] {
            let e = c
                .copy(src.as_path(), dest.as_path(), true)
                .await
                .unwrap_err();
            assert_eq!(field(&e).as_deref(), Some("destination"), "{dest:?}: {e}");
        }
        assert!(!src.join("sub/in").exists() && !src.join("sub/x").exists());
        // ... also through a symlink naming the source.
        std::os::unix::fs::symlink(&src, at("alias")).unwrap();
        let e = c
            .copy(src.as_path(), at("alias/sub/y").as_path(), true)
            .await
            .unwrap_err();
        assert_eq!(field(&e).as_deref(), Some("destination"), "{e}");

        // The destination's parent must exist.
        let e = c
            .copy(src.join("a").as_path(), at("nope/x").as_path(), false)
            .await
            .unwrap_err();
        assert_eq!(code(&e), Some(ErrorCode::NotFound), "{e}");

        // An existing file is replaced; a symlink at the destination is
        // replaced, never written through.
        std::fs::write(at("victim"), "VICTIM").unwrap();
        std::os::unix::fs::symlink(at("victim"), at("trap")).unwrap();
        c.copy(src.join("a").as_path(), at("trap").as_path(), false)
            .await
            .unwrap();
        assert_eq!(std::fs::read_to_string(at("victim")).unwrap(), "VICTIM");
        assert!(std::fs::symlink_metadata(at("trap"))
            .unwrap()
            .file_type()
            .is_file());
        c.copy(src.join("sub/b").as_path(), at("f1").as_path(), false)
            .await
            .unwrap();
        assert_eq!(std::fs::read_to_string(at("f1")).unwrap(), "BBBB");
        // A file onto a directory, a directory onto a file.
        let e = c
            .copy(src.join("a").as_path(), at("d").as_path(), false)
            .await
            .unwrap_err();
        assert_eq!(code(&e), Some(ErrorCode::IsADirectory), "{e}");
        let e = c
            .copy(src.join("sub").as_path(), at("f1").as_path(), true)
            .await
            .unwrap_err();
        assert_eq!(code(&e), Some(ErrorCode::AlreadyExists), "{e}");
        // No temp file is left anywhere.
        let left: Vec<_> = std::fs::read_dir(&base)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains(".executor-"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        assert!(std::fs::symlink_metadata(src.join("fifo"))
            .unwrap()
            .file_type()
            .is_fifo());
        c.close().await.unwrap();
    }
);

#[tokio::test]
async fn a_copy_over_its_bounds_is_limit_exceeded() {
    let base = unique_tempdir("copy-limits");
    let c = client_with_config("[limits]\nmax_walk_entries = 5\nmax_copy_bytes = 1000\n").await;
    let (small, big) = (base.join("small"), base.join("big"));
    std::fs::create_dir_all(&small).unwrap();
    std::fs::create_dir_all(&big).unwrap();
    for i in 0..4 {
        std::fs::write(small.join(format!("f{i}")), "x").unwrap();
    }
    for i in 0..10 {
        std::fs::write(big.join(format!("f{i}")), "x").unwrap();
    }
    std::fs::write(base.join("kb"), vec![7u8; 1000]).unwrap();
    std::fs::write(base.join("over"), vec![7u8; 1001]).unwrap();
    // Positive controls: at the bounds.
    let r = c
        .copy(small.as_path(), base.join("small2").as_path(), true)
        .await
        .unwrap();
    assert_eq!(r.entries, 5);
    let r = c
        .copy(base.join("kb").as_path(), base.join("kb2").as_path(), false)
        .await
        .unwrap();
    assert_eq!(r.bytes, 1000);
    // Over them.
    let e = c
        .copy(big.as_path(), base.join("big2").as_path(), true)
        .await
        .unwrap_err();
    assert_eq!(code(&e), Some(ErrorCode::LimitExceeded), "{e}");
    let w = remote(e);
    assert_eq!(
        w.data_get("limit").and_then(|v| v.as_str()),
        Some("max_walk_entries")
    );
    let e = c
        .copy(
            base.join("over").as_path(),
            base.join("over2").as_path(),
            false,
        )
        .await
        .unwrap_err();
    let w = remote(e);
    assert_eq!(w.code, ErrorCode::LimitExceeded);
    assert_eq!(
        w.data_get("limit").and_then(|v| v.as_str()),
        Some("max_copy_bytes")
    );
    assert!(!base.join("over2").exists());
    // The bytes bound is per request: two files at the bound together exceed it.
    std::fs::create_dir(base.join("two")).unwrap();
    std::fs::write(base.join("two/a"), vec![1u8; 600]).unwrap();
    std::fs::write(base.join("two/b"), vec![1u8; 600]).unwrap();
    let e = c
        .copy(
            base.join("two").as_path(),
            base.join("two2").as_path(),
            true,
        )
        .await
        .unwrap_err();
    assert_eq!(
        remote(e).data_get("limit").and_then(|v| v.as_str()),
        Some("max_copy_bytes")
    );
    // Deeper than 128 directories.
    let mut deep = base.join("deep");
    for _ in 0..130 {
        deep = deep.join("d");
    }
    std::fs::create_dir_all(&deep).unwrap();
    let c2 = local_client().await;
    let e = c2
        .copy(
            base.join("deep").as_path(),
            base.join("deep2").as_path(),
            true,
        )
        .await
        .unwrap_err();
    assert_eq!(
        remote(e).data_get("limit").and_then(|v| v.as_str()),
        Some("max_copy_depth")
    );
    let mut fine = base.join("fine");
    for _ in 0..100 {
        fine = fine.join("d");
    }
    std::fs::create_dir_all(&fine).unwrap();
    let r = c2
        .copy(
            base.join("fine").as_path(),
            base.join("fine2").as_path(),
            true,
        )
        .await
        .unwrap();
    assert_eq!(r.entries, 101, "the control: 100 levels below the top");
    c2.close().await.unwrap();
    let left: Vec<_> = std::fs::read_dir(base.join("two2"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        left,
        vec![std::ffi::OsString::from("a")],
        "no temp file left"
    );
    c.close().await.unwrap();
}

// A workspace `W` (the write root) with `src/{a, private/key}`,
// `secrets/key`, `.git/config`, `pub/.git/`, and `outside/` beside it.
root_and_unprivileged!(
    the_sandbox_holds_for_both_ends_of_a_copy,
    |unprivileged: bool| async move {
        let base = unique_tempdir("copy-sbx");
        chmod(&base, 0o755);
        let w = base.join("ws");
        for d in [
            "src/private",
            "secrets",
            ".git",
            "pub/.git",
            "outside",
            "out",
        ] {
            let d = if d == "outside" {
                base.join(d)
            } else {
                w.join(d)
            };
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(w.join("src/a"), "AAA").unwrap();
        std::fs::write(w.join("src/private/key"), "PRIVATE").unwrap();
        std::fs::write(w.join("secrets/key"), "TOPSECRET").unwrap();
        std::fs::write(w.join(".git/config"), "[core]\n").unwrap();
        std::fs::create_dir(w.join("tree")).unwrap();
        std::fs::write(w.join("tree/t"), "T").unwrap();
        let (cmd, uid) = agent_command(unprivileged);
        chown_r(&base, uid);
        let c = Client::spawn(cmd, ClientOptions::default()).await.unwrap();
        let intent = Intent::new()
            .write(w.as_path())
            .deny_read(w.join("secrets").as_path())
            .deny_read(w.join("src/private").as_path())
            .deny_write(w.join(".git").as_path())
            .deny_write(w.join("pub/.git").as_path())
            .build();
        let s = c.with_sandbox(Some(intent));
        let denied = |e: Error| {
            assert_eq!(e.code(), Some(ErrorCode::SandboxDenied), "{e}");
        };

        // Positive control: inside the write root.
        s.copy(w.join("src/a").as_path(), w.join("out/a").as_path(), false)
            .await
            .unwrap();
        assert_eq!(std::fs::read_to_string(w.join("out/a")).unwrap(), "AAA");
        s.copy(w.join("tree").as_path(), w.join("out/tree").as_path(), true)
            .await
            .unwrap();
        assert_eq!(std::fs::read_to_string(w.join("out/tree/t")).unwrap(), "T");
        // Into another directory of the root that holds no carve-out.
        s.copy(w.join("tree").as_path(), w.join("out").as_path(), true)
            .await
            .unwrap();
        assert!(w.join("out/t").exists());

        // Out of the write root.
        denied(
            s.copy(
                w.join("src/a").as_path(),
                base.join("outside/a").as_path(),
                false,
            )
            .await
            .unwrap_err(),
        );
        assert!(!base.join("outside/a").exists());
        // Into a deny_write carve-out.
        denied(
            s.copy(w.join("src/a").as_path(), w.join(".git/a").as_path(), false)
                .await
                .unwrap_err(),
        );
        assert!(!w.join(".git/a").exists());
        // Over the carve-out itself.
        denied(
            s.copy(w.join("tree").as_path(), w.join(".git").as_path(), true)
                .await
                .unwrap_err(),
        );
        // A tree into a directory that holds a carve-out.
        std::fs::create_dir(w.join("tree/.git")).unwrap();
        chown_r(&w.join("tree"), uid);
        std::fs::write(w.join("tree/.git/config"), "[evil]\n").unwrap();
        denied(
            s.copy(w.join("tree").as_path(), w.join("pub").as_path(), true)
                .await
                .unwrap_err(),
        );
        assert!(!w.join("pub/t").exists() && !w.join("pub/.git/config").exists());
        // Out of a deny_read carve-out, or of a tree that holds one.
        denied(
            s.copy(
                w.join("secrets/key").as_path(),
                w.join("out/key").as_path(),
                false,
            )
            .await
            .unwrap_err(),
        );
        denied(
            s.copy(w.join("src").as_path(), w.join("out/src").as_path(), true)
                .await
                .unwrap_err(),
        );
        assert!(!w.join("out/key").exists() && !w.join("out/src").exists());
        // A hard link to a file of a deny_read carve-out, inside a tree.
        std::fs::create_dir(w.join("linked")).unwrap();
        std::fs::hard_link(w.join("secrets/key"), w.join("linked/notes")).unwrap();
        chown_r(&w.join("linked"), uid);
        denied(
            s.copy(
                w.join("linked").as_path(),
                w.join("out/linked").as_path(),
                true,
            )
            .await
            .unwrap_err(),
        );
        assert!(!w.join("out/linked/notes").exists());
        // A symlink in a copied tree is copied as a link: what it points
        // to (a carve-out, outside the roots) is not read.
        std::os::unix::fs::symlink(w.join("secrets/key"), w.join("tree/sneaky")).unwrap();
        std::fs::remove_dir_all(w.join("tree/.git")).unwrap();
        s.copy(
            w.join("tree").as_path(),
            w.join("out/tree2").as_path(),
            true,
        )
        .await
        .unwrap();
        assert!(std::fs::symlink_metadata(w.join("out/tree2/sneaky"))
            .unwrap()
            .file_type()
            .is_symlink());

        // Read roots limited to W: a source outside them is denied.
        let r = c.with_sandbox(Some(
            Intent::new()
                .read(w.as_path())
                .write(w.join("out").as_path())
                .build(),
        ));
        denied(
            r.copy(Path::new("/etc/hostname"), w.join("out/h").as_path(), false)
                .await
                .unwrap_err(),
        );
        assert!(!w.join("out/h").exists());
        r.copy(w.join("src/a").as_path(), w.join("out/a2").as_path(), false)
            .await
            .unwrap();
        assert!(w.join("out/a2").exists());
        c.close().await.unwrap();
    }
);

/// Every file found under `dir` (not following symlinks), with its bytes.
fn files_under(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let ft = e.file_type().unwrap();
        if ft.is_dir() {
            out.extend(files_under(&e.path()));
        } else if ft.is_file() {
            out.push((e.path(), std::fs::read(e.path()).unwrap()));
        }
    }
    out
}

// A source swapped under the copy: a directory of the tree, and the
// source itself, turned into a symlink to a directory outside the
// intent's read roots and back, as fast as a thread can, while the agent
// (root) copies under an intent that reads only the workspace. Each entry
// is judged by fstat of the descriptor it is then read through: a swapped
// name is copied as a symlink or as the directory, never as what the
// link points to. Layer: the agent's fs confinement (descriptors, no
// second lookup).
#[tokio::test]
async fn a_source_swapped_for_a_symlink_mid_copy_never_copies_what_it_points_to() {
    let base = unique_tempdir("copy-swap");
    let (w, outside) = (base.join("w"), base.join("outside"));
    std::fs::create_dir_all(w.join("src/x")).unwrap();
    std::fs::create_dir_all(w.join("top/x")).unwrap();
    std::fs::create_dir_all(w.join("out")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    for i in 0..20 {
        std::fs::write(w.join(format!("src/x/f{i}")), "inside").unwrap();
        std::fs::write(w.join(format!("top/x/f{i}")), "inside").unwrap();
        std::fs::write(outside.join(format!("f{i}")), "OUTSIDE").unwrap();
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The swappers stop when the test ends, passed or failed.
    struct Stop(std::sync::Arc<std::sync::atomic::AtomicBool>);
    impl Drop for Stop {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let _stop = Stop(stop.clone());
    let swapper = |name: PathBuf| {
        let (stop, outside) = (stop.clone(), outside.clone());
        std::thread::spawn(move || {
            let parked = name.with_extension("parked");
            let mut swaps = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::fs::rename(&name, &parked).unwrap();
                std::os::unix::fs::symlink(&outside, &name).unwrap();
                std::thread::yield_now();
                std::fs::remove_file(&name).unwrap();
                std::fs::rename(&parked, &name).unwrap();
                swaps += 1;
            }
            swaps
        })
    };
    let threads = [swapper(w.join("src/x")), swapper(w.join("top"))];
    let c = local_client().await;
    let s = c.with_sandbox(Some(
        Intent::new()
            .read(w.as_path())
            .write(w.join("out").as_path())
            .build(),
    ));
    let (mut copied, mut failed) = (0, 0);
    for i in 0..150 {
        for src in ["src", "top"] {
            match s
                .copy(
                    w.join(src).as_path(),
                    w.join(format!("out/{src}{i}")).as_path(),
                    true,
                )
                .await
            {
                Ok(_) => copied += 1,
                Err(e) => {
                    // A name gone for a moment, or the source a symlink
                    // when a tree was asked for: never anything else.
                    assert!(
                        matches!(
                            e.code(),
                            Some(ErrorCode::NotFound | ErrorCode::AlreadyExists)
                        ),
                        "{e}"
                    );
                    failed += 1;
                }
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let swaps: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    eprintln!("{copied} copies, {failed} failed, {swaps} swaps");
    assert!(swaps > 100, "the swappers ran");
    assert!(copied > 0, "the positive control: copies succeed meanwhile");
    for (path, data) in files_under(&w.join("out")) {
        assert_eq!(data, b"inside", "{path:?} holds what a link pointed to");
    }
    c.close().await.unwrap();
}
