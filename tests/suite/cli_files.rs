//! `executor-client get/put/cat/walk/stat/rm/mv/mkdir/realpath` with scp's
//! and find's habits, and no leftovers after an error or a signal (issue
//! 16, items 4, 7, 9, 10), locally and over a real sshd.

use executor_tests::cli::*;
use executor_tests::*;
use nix::sys::signal::Signal;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A sparse file of `len` bytes (fast to make, long to copy).
fn sparse(path: &Path, len: u64) {
    std::fs::File::create(path).unwrap().set_len(len).unwrap();
}

#[test]
fn cat_and_get_are_byte_identical_into_a_file_a_pipe_dev_null_and_a_pty() {
    use std::process::Stdio;
    let b = executor_client::fs::BLOCK as usize;
    for via in Via::both() {
        let d = unique_tempdir("cat-sinks");
        for (i, len) in [0, 1, b - 1, b, b + 1, 5 * b + 3].into_iter().enumerate() {
            let data = Rng(0xca7 + i as u64).bytes(len);
            let f = d.join(format!("f{len}"));
            std::fs::write(&f, &data).unwrap();
            let what = format!("{} len {len}", via.name());
            // Into a regular file (spliced).
            let out = d.join("out");
            let file = std::fs::File::create(&out).unwrap();
            let st = via.cmd(&["cat", s(&f)]).stdout(file).status().unwrap();
            assert!(st.success(), "{what}");
            assert!(std::fs::read(&out).unwrap() == data, "cat > file, {what}");
            // Into a pipe (spliced).
            let got = via.output(&["cat", s(&f)]);
            assert!(got.status.success(), "{what}: {}", text(&got));
            assert!(got.stdout == data, "cat | …, {what}");
            // Into /dev/null.
            let st = via
                .cmd(&["cat", s(&f)])
                .stdout(Stdio::null())
                .status()
                .unwrap();
            assert!(st.success(), "cat > /dev/null, {what}");
            // Onto a terminal (written, not spliced).
            let (slave, reader) = raw_pty_reader(len);
            let st = via
                .cmd(&["cat", s(&f)])
                .stdout(Stdio::from(slave))
                .status()
                .unwrap();
            assert!(st.success(), "{what}");
            assert!(
                reader.join().unwrap().unwrap() == data,
                "cat on a pty, {what}"
            );
            // `get` into its temp file, then renamed.
            let to = d.join("got");
            let got = via.output(&["get", s(&f), s(&to)]);
            assert!(got.status.success(), "{what}: {}", text(&got));
            assert!(std::fs::read(&to).unwrap() == data, "get, {what}");
            std::fs::remove_file(&to).unwrap();
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
}

#[test]
fn cat_into_a_pipe_closed_early_exits_quietly_and_onto_dev_full_says_why() {
    use std::io::Read;
    for via in Via::both() {
        let d = unique_tempdir("cat-epipe");
        let f = d.join("f");
        sparse(&f, 64 << 20);
        // `executor-client cat f | head -c 100000`: the reader goes early.
        let mut child = via
            .cmd(&["cat", s(&f)])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = child.stdout.take().unwrap();
        let mut some = vec![0u8; 100_000];
        out.read_exact(&mut some).unwrap();
        drop(out);
        let got = child.wait_with_output().unwrap();
        assert_eq!(got.status.code(), Some(0), "{}: {}", via.name(), text(&got));
        assert!(some.iter().all(|&b| b == 0));
        // A sink that refuses every write (/dev/full): the error says why.
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let got = via.cmd(&["cat", s(&f)]).stdout(full).output().unwrap();
        assert!(!got.status.success(), "{}", via.name());
        assert!(text(&got).contains("No space left"), "{}", text(&got));
        std::fs::remove_dir_all(&d).unwrap();
    }
}

#[test]
fn an_interrupted_get_leaves_no_temp_file() {
    for via in Via::both() {
        let d = unique_tempdir("get-int");
        let (src, dest) = (d.join("big"), d.join("dest"));
        std::fs::create_dir(&dest).unwrap();
        sparse(&src, 8 << 30);
        let mut child = via.cmd(&["get", s(&src), s(&dest)]).spawn().unwrap();
        assert!(
            wait_for(Duration::from_secs(20), || listing(&dest)
                .iter()
                .any(|n| n.starts_with(".big.part"))),
            "the transfer started"
        );
        signal(&child, Signal::SIGINT);
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(130), "{}", via.name());
        assert_eq!(listing(&dest), Vec::<String>::new(), "{}", via.name());
    }
}

#[test]
fn an_interrupted_put_leaves_no_remote_temp_file() {
    for via in Via::both() {
        let d = unique_tempdir("put-int");
        let (src, dest) = (d.join("big"), d.join("dest"));
        std::fs::create_dir(&dest).unwrap();
        sparse(&src, 8 << 30);
        // In a process group of its own, as a shell's foreground job.
        let mut child = std::os::unix::process::CommandExt::process_group(
            &mut via.cmd(&["put", s(&src), &format!("{}/", dest.display())]),
            0,
        )
        .spawn()
        .unwrap();
        assert!(
            wait_for(Duration::from_secs(20), || !listing(&dest).is_empty()),
            "the agent's temp file appeared"
        );
        // Ctrl-C on a terminal reaches the whole foreground group: the
        // client and, were it in that group, the local agent.
        nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(child.id() as i32),
            Signal::SIGINT,
        )
        .unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(130), "{}", via.name());
        assert!(
            wait_for(Duration::from_secs(10), || listing(&dest).is_empty()),
            "{}: left {:?}",
            via.name(),
            listing(&dest)
        );
    }
}

#[test]
fn a_failed_get_names_the_path_and_leaves_nothing() {
    let d = unique_tempdir("get-fail");
    std::fs::write(d.join("src"), vec![7u8; 3 << 20]).unwrap();
    let via = Via::Local;
    // A directory in the way (`out/src`, for `get src out/`).
    std::fs::create_dir_all(d.join("out/src/x")).unwrap();
    let out = via.output(&["get", s(&d.join("src")), &format!("{}/out/", d.display())]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("out/src"),
        "{}",
        text(&out)
    );
    assert_eq!(listing(&d.join("out")), vec!["src".to_string()]);
    assert_eq!(listing(&d.join("out/src")), vec!["x".to_string()]);
    // No space left: the message names the file, nothing is left.
    let small = d.join("small");
    std::fs::create_dir(&small).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs", s(&small)])
        .status()
        .is_ok_and(|st| st.success());
    if !mounted {
        prerequisite_missing("mounting a 1 MiB tmpfs (needs root)");
        return;
    }
    let out = via.output(&["get", s(&d.join("src")), s(&small)]);
    let _ = std::process::Command::new("umount").arg(&small).status();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(s(&small)) && err.contains(".src.part"),
        "{err}"
    );
    assert_eq!(listing(&small), Vec::<String>::new());
}

#[test]
fn get_and_put_have_scps_habits() {
    for via in Via::both() {
        let d = unique_tempdir("scp");
        let data = b"some bytes\n".repeat(1000);
        std::fs::write(d.join("f"), &data).unwrap();
        std::fs::set_permissions(d.join("f"), std::fs::Permissions::from_mode(0o751)).unwrap();
        let old = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        std::fs::File::options()
            .write(true)
            .open(d.join("f"))
            .unwrap()
            .set_modified(old)
            .unwrap();
        // `get X .` takes the name; -p keeps mode and mtime.
        std::fs::create_dir(d.join("here")).unwrap();
        let out = via
            .cmd(&["get", "-p", s(&d.join("f")), "."])
            .current_dir(d.join("here"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let meta = std::fs::metadata(d.join("here/f")).unwrap();
        assert_eq!(std::fs::read(d.join("here/f")).unwrap(), data);
        assert_eq!(meta.permissions().mode() & 0o7777, 0o751, "{}", via.name());
        assert_eq!(meta.modified().unwrap(), old);
        // `-` is stdout.
        let out = via.output(&["get", s(&d.join("f")), "-"]);
        assert_eq!(out.stdout, data);
        // `put f DIR/` takes the name, -p keeps the mode; `-` is stdin.
        std::fs::create_dir(d.join("there")).unwrap();
        let out = via.output(&[
            "put",
            "-p",
            s(&d.join("f")),
            &format!("{}/", d.join("there").display()),
        ]);
        assert!(out.status.success(), "{}", text(&out));
        assert_eq!(std::fs::read(d.join("there/f")).unwrap(), data);
        let mode = std::fs::metadata(d.join("there/f"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o751);
        let meta = std::fs::metadata(d.join("there/f")).unwrap();
        assert_eq!(meta.modified().unwrap(), old, "put -p keeps the mtime");
        let mut child = via
            .cmd(&["put", "-", s(&d.join("there/from-stdin"))])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"piped\n").unwrap();
        assert!(child.wait().unwrap().success());
        assert_eq!(
            std::fs::read(d.join("there/from-stdin")).unwrap(),
            b"piped\n"
        );
        // A relative remote path is taken against the remote home.
        let home = std::path::PathBuf::from(std::env::var("HOME").unwrap());
        let name = format!("executor-cli-rel-{}-{}", std::process::id(), via.name());
        let out = via.output(&["put", s(&d.join("f")), &name]);
        assert!(out.status.success(), "{}", text(&out));
        assert_eq!(std::fs::read(home.join(&name)).unwrap(), data);
        let out = via.output(&["rm", &name]);
        assert!(out.status.success(), "{}", text(&out));
        assert!(!home.join(&name).exists());
        // A directory needs -r; -r copies trees both ways.
        let tree = d.join("tree");
        std::fs::create_dir_all(tree.join("a/b")).unwrap();
        std::fs::write(tree.join("top"), "top").unwrap();
        std::fs::write(tree.join("a/b/deep"), "deep").unwrap();
        let out = via.output(&["get", s(&tree), s(&d.join("copy"))]);
        assert_eq!(out.status.code(), Some(1));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("-r"),
            "{}",
            text(&out)
        );
        let out = via.output(&["get", "-r", s(&tree), s(&d.join("copy"))]);
        assert!(out.status.success(), "{}", text(&out));
        assert_eq!(std::fs::read(d.join("copy/a/b/deep")).unwrap(), b"deep");
        assert_eq!(std::fs::read(d.join("copy/top")).unwrap(), b"top");
        let out = via.output(&["put", "-r", s(&d.join("copy")), s(&d.join("back"))]);
        assert!(out.status.success(), "{}", text(&out));
        assert_eq!(std::fs::read(d.join("back/a/b/deep")).unwrap(), b"deep");
        assert_eq!(
            listing(&d.join("back")),
            vec!["a".to_string(), "top".to_string()]
        );
        // A local directory given to `put` without -r is named as such.
        let out = via.output(&["put", s(&tree), s(&d.join("nope"))]);
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(s(&tree)) && err.contains("directory") && !err.contains("transport"),
            "{err}"
        );
    }
}

#[test]
fn walk_and_stat_for_machines() {
    for via in Via::both() {
        let d = unique_tempdir("walk0");
        std::fs::write(d.join("new\nline"), "x").unwrap();
        std::os::unix::fs::symlink("new\nline", d.join("link")).unwrap();
        let out = via.output(&["walk", "-0", s(&d)]);
        assert!(out.status.success(), "{}", text(&out));
        let records: Vec<&[u8]> = out
            .stdout
            .split(|&b| b == 0)
            .filter(|r| !r.is_empty())
            .collect();
        assert!(
            records.contains(&&b"f 1 new\nline"[..]),
            "{:?}",
            String::from_utf8_lossy(&out.stdout)
        );
        let out = via.output(&["walk", "--json", s(&d)]);
        let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(lines
            .iter()
            .any(|v| v["path"] == "new\nline" && v["kind"] == "file" && v["size"] == 1));
        // stat: octal mode, readable mtime, --no-follow describes the link.
        let out = via.output(&["stat", "--no-follow", s(&d.join("link"))]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["kind"], "symlink", "{v}");
        assert_eq!(v["mode"], "120777", "{v}");
        let mtime = v["mtime"].as_str().unwrap();
        assert!(
            mtime.len() == 30 && mtime.ends_with('Z') && mtime.as_bytes()[10] == b'T',
            "{mtime}"
        );
        let out = via.output(&["stat", s(&d.join("link"))]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["kind"], "file");
        assert_eq!(v["permissions"].as_str().unwrap().len(), 4);
    }
}

#[test]
fn rm_mv_mkdir_realpath() {
    for via in Via::both() {
        let d = unique_tempdir("verbs");
        let p = |rel: &str| format!("{}/{rel}", d.display());
        assert!(via.output(&["mkdir", "-p", &p("a/b/c")]).status.success());
        assert!(d.join("a/b/c").is_dir());
        let out = via.output(&["mkdir", &p("a/b/c")]);
        assert_eq!(out.status.code(), Some(1), "exists: {}", text(&out));
        assert!(via.output(&["mv", &p("a/b/c"), &p("a/d")]).status.success());
        assert!(d.join("a/d").is_dir() && !d.join("a/b/c").exists());
        let out = via.output(&["realpath", &p("a/b/../d")]);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            std::fs::canonicalize(d.join("a/d"))
                .unwrap()
                .to_str()
                .unwrap()
        );
        let out = via.output(&["rm", &p("a")]);
        assert_eq!(out.status.code(), Some(1), "not empty: {}", text(&out));
        assert!(via.output(&["rm", "-r", &p("a")]).status.success());
        assert!(!d.join("a").exists());
        assert_eq!(via.output(&["rm", &p("a")]).status.code(), Some(1));
        assert!(via.output(&["rm", "-f", &p("a")]).status.success());
    }
}

#[test]
fn walk_exits_1_when_an_entry_cannot_be_read() {
    if current_uid() != 0 {
        prerequisite_missing("root, to run the agent as nobody through EXECUTOR_BIN");
        return;
    }
    let d = unique_tempdir("walk-unreadable");
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir(d.join("closed")).unwrap();
    std::fs::write(d.join("closed/inside"), "x").unwrap();
    std::fs::set_permissions(d.join("closed"), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(d.join("open"), "x").unwrap();
    let wrapper = d.join("agent-as-nobody.sh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\ncd /\nexec setpriv --reuid=65534 --regid=65534 --clear-groups -- {}\n",
            executor_bin_for_any_user().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Via::Local
        .cmd(&["walk", s(&d)])
        .env("EXECUTOR_BIN", &wrapper)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("f 1 open\n"),
        "{}",
        text(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("closed"),
        "{}",
        text(&out)
    );
    // The positive control: as root every entry is read, exit 0.
    let out = Via::Local.output(&["walk", s(&d)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// The link at `p`'s target, asserting it is a link.
fn link_at(p: &Path) -> std::path::PathBuf {
    let m = std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    assert!(m.file_type().is_symlink(), "{} is not a link", p.display());
    std::fs::read_link(p).unwrap()
}

// Issue 16, item 7: `-r` keeps symlinks as links both ways (never
// followed: what a link points to is not copied), `-p` keeps each file's
// mode and mtime both ways; no temp file is left.
#[test]
fn r_keeps_symlinks_and_p_keeps_mode_and_mtime_both_ways() {
    for via in Via::both() {
        let d = unique_tempdir("cli-links");
        let tree = d.join("tree");
        std::fs::create_dir_all(tree.join("sub")).unwrap();
        std::fs::create_dir(d.join("outside")).unwrap();
        std::fs::write(d.join("outside/secret"), "secret").unwrap();
        let f = tree.join("sub/f");
        std::fs::write(&f, "f").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
        let old = std::time::UNIX_EPOCH + Duration::from_nanos(1_234_567_890_123_456_789);
        std::fs::File::options()
            .write(true)
            .open(&f)
            .unwrap()
            .set_modified(old)
            .unwrap();
        std::os::unix::fs::symlink("sub/f", tree.join("rel")).unwrap();
        std::os::unix::fs::symlink("/nonexistent/abs", tree.join("dangling")).unwrap();
        std::os::unix::fs::symlink(d.join("outside"), tree.join("sub/out")).unwrap();
        let check = |root: &Path, what: &str| {
            assert_eq!(link_at(&root.join("rel")), Path::new("sub/f"), "{what}");
            assert_eq!(
                link_at(&root.join("dangling")),
                Path::new("/nonexistent/abs"),
                "{what}"
            );
            assert_eq!(link_at(&root.join("sub/out")), d.join("outside"), "{what}");
            assert_eq!(listing(root), vec!["dangling", "rel", "sub"], "{what}");
            assert_eq!(listing(&root.join("sub")), vec!["f", "out"], "{what}");
            let m = std::fs::metadata(root.join("sub/f")).unwrap();
            assert_eq!(m.permissions().mode() & 0o7777, 0o640, "{what}");
            assert_eq!(m.modified().unwrap(), old, "{what}");
            assert_eq!(std::fs::read(root.join("rel")).unwrap(), b"f", "{what}");
        };
        let copy = d.join("copy");
        let out = via.output(&["get", "-r", "-p", s(&tree), s(&copy)]);
        assert!(out.status.success(), "{}: {}", via.name(), text(&out));
        check(&copy, &format!("get -r, {}", via.name()));
        let back = d.join("back");
        let out = via.output(&["put", "-r", "-p", s(&copy), s(&back)]);
        assert!(out.status.success(), "{}: {}", via.name(), text(&out));
        check(&back, &format!("put -r, {}", via.name()));
        // What the links point to was never copied.
        assert_eq!(listing(&d.join("outside")), vec!["secret"]);
        assert_eq!(listing(&d), vec!["back", "copy", "outside", "tree"]);
    }
}

// `put -r` under a sandbox: the tree (its links too) is made only inside a
// `--rw` root; the same copy outside it is denied (exit 125) and leaves
// nothing; a link made to /etc/passwd gives nothing under the same sandbox.
#[test]
fn put_r_makes_links_only_inside_a_rw_root() {
    let via = Via::Local;
    let d = unique_tempdir("cli-links-rw");
    let tree = d.join("tree");
    std::fs::create_dir_all(&tree).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", tree.join("pw")).unwrap();
    std::fs::create_dir(d.join("root")).unwrap();
    std::fs::create_dir(d.join("elsewhere")).unwrap();
    let rw = d.join("root");
    let out = via.output(&[
        "put",
        "-r",
        "--rw",
        s(&rw),
        s(&tree),
        s(&d.join("elsewhere/t")),
    ]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("sandbox"),
        "{}",
        text(&out)
    );
    assert_eq!(listing(&d.join("elsewhere")), Vec::<String>::new());
    // Positive control: into the root, the link is made as it was.
    let out = via.output(&["put", "-r", "--rw", s(&rw), s(&tree), s(&rw.join("t"))]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(link_at(&rw.join("t/pw")), Path::new("/etc/passwd"));
    // Reading through it under the same sandbox gives nothing.
    let out = via.output(&["cat", "--ro", s(&rw), "--rw", s(&rw), s(&rw.join("t/pw"))]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(out.stdout.is_empty(), "{}", text(&out));
}

// A remote tree's link is never written through by the local side of a
// `get -r`: two sources with one name (`a/d` and `b/d` into `dest/`), the
// first's `d/sub` a link to a directory outside `dest`, the second's
// `d/sub` a directory holding `f` and `g` (a link): nothing appears
// outside `dest`, the copy is refused naming the link in the way, and the
// link is left as it was made. Positive control: the second tree alone
// copies whole into a fresh destination.
#[test]
fn get_r_never_writes_through_a_link_it_made() {
    let via = Via::Local;
    let d = unique_tempdir("cli-get-through");
    let (a, b, out) = (d.join("a/d"), d.join("b/d"), d.join("outside"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(b.join("sub")).unwrap();
    std::fs::create_dir(&out).unwrap();
    std::os::unix::fs::symlink(&out, a.join("sub")).unwrap();
    std::fs::write(b.join("sub/f"), "remote").unwrap();
    std::os::unix::fs::symlink("f", b.join("sub/g")).unwrap();
    let dest = d.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let out_dest = format!("{}/", s(&dest));
    let got = via.output(&["get", "-r", s(&a), s(&b), &out_dest]);
    assert!(!got.status.success(), "{}", text(&got));
    assert!(
        text(&got).contains("sub") && text(&got).contains("link"),
        "{}",
        text(&got)
    );
    assert_eq!(listing(&out), Vec::<String>::new(), "{}", text(&got));
    assert_eq!(link_at(&dest.join("d/sub")), out);
    // Positive control: the second tree alone, into a fresh destination.
    let fresh = d.join("fresh");
    std::fs::create_dir(&fresh).unwrap();
    let got = via.output(&["get", "-r", s(&b), &format!("{}/", s(&fresh))]);
    assert!(got.status.success(), "{}", text(&got));
    assert_eq!(std::fs::read(fresh.join("d/sub/f")).unwrap(), b"remote");
    assert_eq!(link_at(&fresh.join("d/sub/g")), Path::new("f"));
    assert_eq!(listing(&out), Vec::<String>::new());
}

// What a remote sends never writes control characters onto the user's
// terminal: a remote FIFO (skipped by `get -r`) and a missing file (an
// error from the agent, `cat`) named with an escape sequence and a BEL
// are shown with them escaped (a remote name quoted as `ls` does, see
// cli_quoting.rs). Control: the names are shown, escaped.
#[test]
fn remote_names_reach_the_terminal_with_control_characters_escaped() {
    let via = Via::Local;
    let d = unique_tempdir("cli-escapes");
    let tree = d.join("tree");
    std::fs::create_dir(&tree).unwrap();
    let evil = "a\u{1b}]0;pwned\u{7}b";
    nix::unistd::mkfifo(
        &tree.join(evil),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let got = via.output(&["get", "-r", s(&tree), s(&d.join("copy"))]);
    let err = String::from_utf8_lossy(&got.stderr).into_owned();
    assert!(got.status.success(), "{}", text(&got));
    assert!(
        err.contains("/a\\E]0;pwned\\ab'") && err.contains("$'") && err.contains("skipped"),
        "{err:?}"
    );
    assert!(!err.contains('\u{1b}') && !err.contains('\u{7}'), "{err:?}");
    let missing = format!("{}/\u{1b}[31mred\u{9b}", s(&d));
    let got = via.output(&["cat", &missing]);
    let err = String::from_utf8_lossy(&got.stderr).into_owned();
    assert!(!got.status.success());
    assert!(err.contains("\\x1b[31mred\\u{9b}"), "{err:?}");
    assert!(
        !err.contains('\u{1b}') && !err.contains('\u{9b}'),
        "{err:?}"
    );
}
