//! Names a job chose, printed by `executor-client` (issue 29.11): on a
//! terminal (a real PTY, the client's stdout and stderr) `walk` and
//! `realpath` quote them as GNU `ls --quoting-style=shell-escape` does, so
//! no byte a terminal acts on is written (an `ESC ]0;…BEL` retitle, a CSI,
//! a `\r`, a forged `\n` line, C1, bidi overrides, non-UTF-8) and bash
//! reads every quoted name back to its exact bytes; plain names print as
//! they are. On a pipe the listing is byte-exact, `-0` and `--json` exact
//! everywhere; messages on stderr quote the remote names they hold. The
//! layer: the CLI's output (`cli/src/quote.rs`).

use executor_tests::cli::*;
use executor_tests::*;
use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// Names a job could leave in a tree it wrote.
fn hostile_names() -> Vec<Vec<u8>> {
    vec![
        b"\x1b]0;PWNED\x07".to_vec(),
        b"x\nf 0 forged-line".to_vec(),
        b"cr\rZ".to_vec(),
        b"\xff\xfe-not-utf8".to_vec(),
        b"-n".to_vec(),
        b"it's a $(name)".to_vec(),
        "\u{202e}txt.exe".as_bytes().to_vec(),
        "\u{9b}31mred".as_bytes().to_vec(),
        b"tab\there\x7f".to_vec(),
    ]
}

/// A tree with the hostile names (files, and a directory with a file),
/// a plain file; the set of `KIND SIZE RELATIVE` entries `walk` lists.
fn tree() -> (PathBuf, BTreeSet<Vec<u8>>) {
    let d = unique_tempdir("quoting");
    let mut want = BTreeSet::new();
    let entry = |kind: &str, size: usize, rel: &[u8]| {
        let mut v = format!("{kind} {size} ").into_bytes();
        v.extend_from_slice(rel);
        v
    };
    std::fs::write(d.join("plain"), "p").unwrap();
    want.insert(entry("f", 1, b"plain"));
    for n in hostile_names() {
        std::fs::write(d.join(OsStr::from_bytes(&n)), "xy").unwrap();
        want.insert(entry("f", 2, &n));
    }
    let sub = b"sub\x1b[2J".to_vec();
    std::fs::create_dir(d.join(OsStr::from_bytes(&sub))).unwrap();
    let size = std::fs::metadata(d.join(OsStr::from_bytes(&sub)))
        .unwrap()
        .len() as usize;
    want.insert(entry("d", size, &sub));
    let mut inner = sub.clone();
    inner.extend_from_slice(b"/\x1b[31minner");
    std::fs::write(d.join(OsStr::from_bytes(&inner)), "").unwrap();
    want.insert(entry("f", 0, &inner));
    (d, want)
}

/// `argv` on a new PTY (stdout and stderr the terminal): every byte the
/// terminal received, and the exit code.
fn on_a_terminal(argv: &[&OsStr]) -> (Vec<u8>, Option<i32>) {
    let mut full: Vec<std::ffi::OsString> = vec![client_bin().into()];
    full.extend(Via::Local.flags().into_iter().map(Into::into));
    full.extend(argv.iter().map(|a| a.to_os_string()));
    on_a_terminal_raw(&full)
}

/// One line of `walk --json` as the tree's entry `K SIZE PATH` (the path
/// from `path_bytes` where it is not UTF-8).
fn walk_json_entry(l: &[u8]) -> Vec<u8> {
    let v: serde_json::Value = serde_json::from_slice(l).expect("one JSON object per line");
    let path: Vec<u8> = match v.get("path_bytes") {
        Some(b) => serde_json::from_value(b.clone()).unwrap(),
        None => v["path"].as_str().unwrap().as_bytes().to_vec(),
    };
    let kind = &v["kind"].as_str().unwrap()[..1];
    let mut e = format!("{kind} {} ", v["size"]).into_bytes();
    e.extend(path);
    e
}

fn have_tools() -> bool {
    for tool in ["python3", "bash"] {
        if std::process::Command::new(tool)
            .arg("--version")
            .output()
            .is_err()
        {
            prerequisite_missing(tool);
            return false;
        }
    }
    true
}

/// No byte a terminal acts on: C0 but the PTY's `\r\n`, DEL; valid UTF-8
/// without C1 controls or bidi overrides.
fn assert_inert(screen: &[u8], what: &str) {
    for (i, &b) in screen.iter().enumerate() {
        assert!(
            (b >= 0x20 && b != 0x7f) || b == b'\n' || b == b'\r',
            "{what}: raw control byte {b:#04x} at {i} written to the terminal: {:?}",
            String::from_utf8_lossy(screen)
        );
        if b == b'\r' {
            assert_eq!(
                screen.get(i + 1),
                Some(&b'\n'),
                "{what}: a bare \\r reached the terminal"
            );
        }
    }
    let text = std::str::from_utf8(screen)
        .unwrap_or_else(|e| panic!("{what}: bytes that are not UTF-8 reached the terminal: {e}"));
    for c in text.chars() {
        assert!(
            !(('\u{202a}'..='\u{202e}').contains(&c) || c.is_control() && c != '\n' && c != '\r'),
            "{what}: {c:?} reached the terminal"
        );
    }
}

/// `screen` without what the client's own progress bar draws (cursor up
/// and down, erase line, a carriage return to redraw it).
fn without_the_progress_bar(screen: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(screen.len());
    let mut i = 0;
    while i < screen.len() {
        let rest = &screen[i..];
        if let Some(seq) = [&b"\x1b[1A"[..], b"\x1b[1B", b"\x1b[2K"]
            .iter()
            .find(|s| rest.starts_with(s))
        {
            i += seq.len();
            continue;
        }
        if rest[0] == b'\r' && rest.get(1) != Some(&b'\n') {
            i += 1;
            continue;
        }
        out.push(rest[0]);
        i += 1;
    }
    out
}

/// What bash makes of `quoted` (a shell word): its bytes.
fn unquoted(quoted: &str) -> Vec<u8> {
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("printf %s {quoted}"))
        .output()
        .expect("bash");
    assert!(out.status.success(), "bash could not read {quoted:?}");
    out.stdout
}

fn lines(screen: &[u8]) -> Vec<&[u8]> {
    screen
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn walk_on_a_terminal_quotes_every_hostile_name_and_bash_reads_them_back() {
    if !have_tools() {
        return;
    }
    let (d, want) = tree();
    let (screen, code) = on_a_terminal(&[OsStr::new("walk"), d.as_os_str()]);
    assert_eq!(code, Some(0), "{}", String::from_utf8_lossy(&screen));
    assert_inert(&screen, "walk");
    let got: BTreeSet<Vec<u8>> = lines(&screen)
        .into_iter()
        .map(|l| {
            let l = std::str::from_utf8(l).unwrap();
            let mut parts = l.splitn(3, ' ');
            let (kind, size, quoted) = (
                parts.next().unwrap(),
                parts.next().unwrap(),
                parts.next().unwrap(),
            );
            let mut v = format!("{kind} {size} ").into_bytes();
            v.extend(unquoted(quoted));
            v
        })
        .collect();
    assert_eq!(
        got.iter()
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect::<Vec<_>>(),
        want.iter()
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect::<Vec<_>>(),
        "one line per entry (none forged), each name read back exactly"
    );
    assert_eq!(got, want);
    // Positive control: a plain name is printed as it is.
    assert!(
        lines(&screen).contains(&&b"f 1 plain"[..]),
        "a plain name is not quoted: {}",
        String::from_utf8_lossy(&screen)
    );
    assert!(
        String::from_utf8_lossy(&screen).contains("f 2 -n\r\n"),
        "a name starting with '-' needs no quotes (as ls shows it)"
    );
}

#[test]
fn piped_null_and_json_listings_stay_exact() {
    let (d, want) = tree();
    let out = Via::Local.output(&["walk", d.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    for w in &want {
        let mut line = w.clone();
        line.push(b'\n');
        assert!(
            out.stdout.windows(line.len()).any(|x| x == &line[..]),
            "piped: {:?} is printed byte for byte",
            String::from_utf8_lossy(w)
        );
    }
    let out = Via::Local.output(&["walk", "-0", d.to_str().unwrap()]);
    let got: BTreeSet<Vec<u8>> = out
        .stdout
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    assert_eq!(got, want, "-0: exact");
    let out = Via::Local.output(&["walk", "--json", d.to_str().unwrap()]);
    let got: BTreeSet<Vec<u8>> = out
        .stdout
        .split(|&b| b == b'\n')
        .filter(|s| !s.is_empty())
        .map(walk_json_entry)
        .collect();
    assert_eq!(got, want, "--json: exact (path_bytes where not UTF-8)");
}

#[test]
fn realpath_on_a_terminal_quotes_and_piped_stays_exact() {
    if !have_tools() {
        return;
    }
    let (d, _) = tree();
    let d = d.canonicalize().unwrap();
    // The CLI takes remote paths as UTF-8 arguments (clap refuses other
    // bytes): the non-UTF-8 name is listed by `walk` above only.
    for n in hostile_names()
        .into_iter()
        .filter(|n| std::str::from_utf8(n).is_ok())
    {
        let p = d.join(OsStr::from_bytes(&n));
        let (screen, code) = on_a_terminal(&[OsStr::new("realpath"), p.as_os_str()]);
        assert_eq!(code, Some(0), "{}", String::from_utf8_lossy(&screen));
        assert_inert(&screen, "realpath");
        let ls = lines(&screen);
        assert_eq!(
            ls.len(),
            1,
            "one line: {}",
            String::from_utf8_lossy(&screen)
        );
        assert_eq!(
            unquoted(std::str::from_utf8(ls[0]).unwrap()),
            p.as_os_str().as_bytes()
        );
        let out = Via::Local.cmd(&["realpath"]).arg(&p).output().unwrap();
        let mut exact = p.as_os_str().as_bytes().to_vec();
        exact.push(b'\n');
        assert_eq!(out.stdout, exact, "piped: exact");
    }
    let plain = d.join("plain");
    let (screen, _) = on_a_terminal(&[OsStr::new("realpath"), plain.as_os_str()]);
    assert_eq!(
        lines(&screen),
        vec![plain.as_os_str().as_bytes()],
        "positive control: a plain path as it is"
    );
}

/// Messages on the terminal (stderr) that name a remote path: `get -r`
/// skipping a FIFO with a hostile name, an agent's error about a path
/// holding a newline and an escape.
#[test]
fn errors_naming_remote_paths_write_nothing_the_terminal_acts_on() {
    if !have_tools() {
        return;
    }
    let d = unique_tempdir("quoting-err");
    let src = d.join("src");
    std::fs::create_dir(&src).unwrap();
    let fifo = b"fifo\x1b]0;T\x07\nf 0 forged".to_vec();
    nix::unistd::mkfifo(
        &src.join(OsStr::from_bytes(&fifo)),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let dest = d.join("dest");
    let (screen, code) = on_a_terminal(&[
        OsStr::new("get"),
        OsStr::new("-r"),
        src.as_os_str(),
        dest.as_os_str(),
    ]);
    assert_eq!(code, Some(0), "{}", String::from_utf8_lossy(&screen));
    let screen = without_the_progress_bar(&screen);
    assert_inert(&screen, "get -r");
    let s = String::from_utf8_lossy(&screen).into_owned();
    let quoted = s
        .split("get -r: ")
        .nth(1)
        .and_then(|r| r.split(": not a regular file").next())
        .unwrap_or_else(|| panic!("the skipped FIFO is named: {s}"));
    let mut want = src.as_os_str().as_bytes().to_vec();
    want.push(b'/');
    want.extend_from_slice(&fifo);
    assert_eq!(
        unquoted(quoted),
        want,
        "the message's name reads back exactly"
    );

    let missing: PathBuf = d.join(OsStr::from_bytes(b"gone\x1b]0;T\x07\nf 0 forged/x"));
    let (screen, code) = on_a_terminal(&[OsStr::new("cat"), missing.as_os_str()]);
    assert_eq!(code, Some(1), "{}", String::from_utf8_lossy(&screen));
    assert_inert(&screen, "cat's error");
    assert!(
        !lines(&screen).iter().any(|l| l.starts_with(b"f 0 forged")),
        "a name's newline forged a line on stderr: {}",
        String::from_utf8_lossy(&screen)
    );
    assert!(
        String::from_utf8_lossy(&screen).contains("not_found"),
        "positive control: the error is shown: {}",
        String::from_utf8_lossy(&screen)
    );
}

/// A variant: `get -r` of a tree whose names are hostile (a name that is
/// not UTF-8 among them) copies every name byte for byte (the remote
/// path is built from the walk's bytes, never from a lossy rendering).
#[test]
fn get_r_copies_hostile_names_exactly() {
    let (d, want) = tree();
    let dest = unique_tempdir("quoting-get").join("copy");
    let out = Via::Local.output(&["get", "-r", d.to_str().unwrap(), dest.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let names = |root: &std::path::Path| -> BTreeSet<Vec<u8>> {
        let mut all = BTreeSet::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).unwrap().flatten() {
                let p = e.path();
                all.insert(
                    p.strip_prefix(root)
                        .unwrap()
                        .as_os_str()
                        .as_bytes()
                        .to_vec(),
                );
                if e.file_type().unwrap().is_dir() {
                    stack.push(p);
                }
            }
        }
        all
    };
    assert_eq!(names(&dest), names(&d), "every name copied exactly");
    assert_eq!(names(&d).len(), want.len());
}

/// `walk` of a tree with unreadable directories whose names hold a line
/// break and a bidi override (the reported forgery), and a variant with
/// the Arabic letter mark, a bidi isolate and U+2028: the agent's error
/// message names the path again, as it is, and the client showed it raw
/// on stderr (a forged `executor-client:` line, U+202E reordering it).
/// Run by an unprivileged user (root reads a mode-000 directory).
#[test]
fn walk_errors_quoting_the_agent_message_stay_on_one_line_and_inert() {
    if !have_tools() {
        return;
    }
    let d = unique_tempdir("quoting-walkerr");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    let names: [&[u8]; 2] = [
        "a\nexecutor-client: FORGED\u{202e}gpj.exe".as_bytes(),
        "b\u{61c}\u{2067}x\u{2028}executor-client: FORGED2".as_bytes(),
    ];
    for n in names {
        let p = d.join(OsStr::from_bytes(n));
        std::fs::create_dir(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o000)).unwrap();
    }
    std::fs::write(d.join("plain"), "p").unwrap();
    let mut argv: Vec<std::ffi::OsString> = Vec::new();
    if current_uid() == 0 {
        if std::process::Command::new("setpriv")
            .arg("--version")
            .output()
            .is_err()
        {
            return prerequisite_missing("setpriv");
        }
        nix::unistd::chown(&d, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
        for a in [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ] {
            argv.push(a.into());
        }
    }
    argv.push(client_bin().into());
    argv.extend(Via::Local.flags().into_iter().map(Into::into));
    argv.push("walk".into());
    argv.push(d.clone().into());
    let (screen, _) = on_a_terminal_raw(&argv);
    let s = String::from_utf8_lossy(&screen).into_owned();
    assert!(
        s.contains("f 1 plain"),
        "positive control: the readable part is listed: {s}"
    );
    assert!(
        s.contains("executor-client: walk:"),
        "positive control: the unreadable directories are reported: {s}"
    );
    assert!(
        !lines(&screen)
            .iter()
            .any(|l| l.starts_with(b"executor-client: FORGED")),
        "an agent's message forged a line on stderr (the CLI's output): {s}"
    );
    for c in ['\u{202e}', '\u{61c}', '\u{2067}', '\u{2028}'] {
        assert!(
            !s.contains(c),
            "{c:?} reached the terminal in a message (the CLI's output): {s}"
        );
    }
    // The client's own log line is coloured on a terminal (SGR only).
    let mut plain = screen.clone();
    for sgr in [&b"\x1b[0m"[..], b"\x1b[2m", b"\x1b[3m", b"\x1b[33m"] {
        while let Some(i) = plain.windows(sgr.len()).position(|w| w == sgr) {
            plain.drain(i..i + sgr.len());
        }
    }
    assert_inert(&plain, "walk's errors");
    for n in names {
        let p = d.join(OsStr::from_bytes(n));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
}

/// A full argv (its first word the program) on a new PTY.
fn on_a_terminal_raw(argv: &[std::ffi::OsString]) -> (Vec<u8>, Option<i32>) {
    const DRIVER: &str = r#"
import os, pty, sys
pid, fd = pty.fork()
if pid == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
seen = b""
while True:
    try:
        d = os.read(fd, 65536)
    except OSError:
        break
    if not d:
        break
    seen += d
_, status = os.waitpid(pid, 0)
sys.stdout.buffer.write(seen)
sys.exit(os.waitstatus_to_exitcode(status) & 0xff)
"#;
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(DRIVER)
        .args(argv)
        .env("RUST_BACKTRACE", "0")
        .env_remove("EXECUTOR_TARGET")
        .output()
        .expect("python3");
    (out.stdout, out.status.code())
}

/// `walk --json` on a terminal: JSON escapes C0 controls but wrote C1
/// (U+009B, a CSI for terminals that honour 8-bit controls), DEL and bidi
/// overrides raw. On a terminal they are `\u` escapes: the same JSON
/// value (exact), nothing a terminal acts on.
#[test]
fn walk_json_on_a_terminal_is_exact_and_inert() {
    if !have_tools() {
        return;
    }
    let (d, want) = tree();
    let (screen, code) = on_a_terminal(&[OsStr::new("walk"), OsStr::new("--json"), d.as_os_str()]);
    assert_eq!(code, Some(0), "{}", String::from_utf8_lossy(&screen));
    assert_inert(&screen, "walk --json");
    let got: BTreeSet<Vec<u8>> = lines(&screen).into_iter().map(walk_json_entry).collect();
    assert_eq!(got, want, "--json on a terminal: the same values, exact");
}
