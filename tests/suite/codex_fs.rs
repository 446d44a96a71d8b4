//! `executor codex-exec-server`'s `fs/*`: each method's answers, defaults,
//! bounds and error codes and messages as codex 0.171.0's exec-server
//! gives them (measured line by line against it), names that are not
//! UTF-8 through `%FF` URIs, the client-named handles and their bounds,
//! files past the native `max_read_file_bytes`, and a profile that
//! confines fs: a symlink leading out of it is refused as natively.

use crate::codex_dialect::{error, Server};
use base64::Engine;
use executor_tests::unique_tempdir;
use serde_json::{json, Value};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The `file:` URI of `p`, every byte but unreserved ones and `/` escaped.
fn uri(p: &Path) -> String {
    let mut s = String::from("file://");
    for &b in p.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s
}

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

fn unb64(v: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(v.as_str().unwrap_or_else(|| panic!("base64 text: {v}")))
        .unwrap()
}

/// A server past its handshake, and a request counter.
struct Fs {
    s: Server,
    id: i64,
    session: String,
}

impl Fs {
    fn start() -> Fs {
        Fs::start_with(&[])
    }

    fn start_with(args: &[&OsStr]) -> Fs {
        Fs::connect(args, None)
    }

    /// A connection resuming `session` when given.
    fn connect(args: &[&OsStr], session: Option<&str>) -> Fs {
        let mut s = Server::start_with(args);
        let session = s.handshake(session);
        Fs {
            s,
            id: 100,
            session,
        }
    }

    fn call(&mut self, method: &str, params: Value) -> Value {
        self.id += 1;
        self.s.request(self.id, method, params)
    }

    fn ok(&mut self, method: &str, params: Value) -> Value {
        let r = self.call(method, params.clone());
        match r.get("result") {
            Some(v) => v.clone(),
            None => panic!("{method} {params}: {r}"),
        }
    }

    fn err(&mut self, method: &str, params: Value) -> (i64, String) {
        error(&self.call(method, params))
    }
}

fn tree(tag: &str) -> PathBuf {
    let d = unique_tempdir(tag);
    std::fs::create_dir_all(d.join("d/sub")).unwrap();
    std::fs::write(d.join("f"), "hello\n").unwrap();
    std::fs::write(d.join("d/a"), "x").unwrap();
    std::os::unix::fs::symlink("f", d.join("lf")).unwrap();
    std::os::unix::fs::symlink("d", d.join("ld")).unwrap();
    std::os::unix::fs::symlink("nope", d.join("dangle")).unwrap();
    d
}

const NOT_FOUND: (i64, &str) = (-32004, "No such file or directory (os error 2)");

fn is(got: (i64, String), want: (i64, &str)) {
    assert_eq!((got.0, got.1.as_str()), want);
}

#[test]
fn metadata_reads_writes_and_directories_answer_as_the_reference() {
    let t = tree("codex-fs-basic");
    let mut c = Fs::start();
    let p = |rel: &str| json!(uri(&t.join(rel)));

    // getMetadata: followed by default, isSymlink from a second stat.
    let m = c.ok("fs/getMetadata", json!({"path": p("f"), "sandbox": null}));
    assert_eq!(m["isFile"], json!(true));
    assert_eq!(m["isSymlink"], json!(false));
    assert_eq!(m["size"], json!(6));
    assert_eq!(m["createdAtMs"], json!(0));
    assert!(
        m["modifiedAtMs"].as_i64().unwrap() > 1_600_000_000_000,
        "{m}"
    );
    let m = c.ok("fs/getMetadata", json!({"path": p("lf")}));
    assert_eq!(
        (&m["isFile"], &m["isSymlink"], &m["size"]),
        (&json!(true), &json!(true), &json!(6))
    );
    let m = c.ok("fs/getMetadata", json!({"path": p("d")}));
    assert_eq!(m["isDirectory"], json!(true));
    let m = c.ok("fs/getMetadata", json!({"path": "file:///dev/null"}));
    assert_eq!(
        (&m["isFile"], &m["isDirectory"]),
        (&json!(false), &json!(false))
    );
    let no_link = (-32600, "path contains a symbolic link");
    is(
        c.err(
            "fs/getMetadata",
            json!({"path": p("lf"), "followSymlinks": false}),
        ),
        no_link,
    );
    let not_dir = (-32603, "Not a directory (os error 20)");
    is(
        c.err(
            "fs/getMetadata",
            json!({"path": p("ld/a"), "followSymlinks": false}),
        ),
        not_dir,
    );
    is(
        c.err("fs/getMetadata", json!({"path": p("dangle")})),
        NOT_FOUND,
    );
    is(c.err("fs/getMetadata", json!({"path": p("f/x")})), not_dir);
    is(
        c.err("fs/getMetadata", json!({})),
        (-32602, "missing field `path`"),
    );
    is(
        c.err("fs/getMetadata", Value::Null),
        (
            -32602,
            "invalid type: null, expected struct WireFsGetMetadataParams",
        ),
    );
    is(
        c.err("fs/getMetadata", json!({"path": t.join("f")})),
        (-32602, "invalid URI: relative URL without a base"),
    );
    // Deliberately stricter than the reference: an unknown key is refused.
    let (code, msg) = c.err("fs/getMetadata", json!({"path": p("f"), "zz": 1}));
    assert_eq!(code, -32602);
    assert!(msg.contains("unknown field `zz`"), "{msg}");
    // Nothing runs weaker than asked: a sandbox is not ignored (a
    // malformed one is refused in the reference's words).
    let (code, _) = c.err(
        "fs/getMetadata",
        json!({"path": p("f"), "sandbox": {"permissions": {}}}),
    );
    assert_eq!(code, -32602);

    // readFile.
    let r = c.ok("fs/readFile", json!({"path": p("lf")}));
    assert_eq!(unb64(&r["dataBase64"]), b"hello\n");
    let not_file = format!("path `{}` is not a file", t.join("d").display());
    is(
        c.err("fs/readFile", json!({"path": p("d")})),
        (-32600, not_file.as_str()),
    );
    is(
        c.err("fs/readFile", json!({"path": "file:///dev/null"})),
        (-32600, "path `/dev/null` is not a file"),
    );
    is(
        c.err(
            "fs/readFile",
            json!({"path": p("d"), "followSymlinks": false}),
        ),
        (-32600, "path is not a regular file"),
    );
    is(
        c.err(
            "fs/readFile",
            json!({"path": p("lf"), "followSymlinks": false}),
        ),
        (-32603, "Symbolic link loop (os error 40)"),
    );
    is(
        c.err("fs/readFile", json!({"path": p("missing")})),
        NOT_FOUND,
    );

    // writeFile: in place, through a final symlink as the reference.
    c.ok(
        "fs/writeFile",
        json!({"path": p("lf"), "dataBase64": b64(b"hi")}),
    );
    assert_eq!(std::fs::read(t.join("f")).unwrap(), b"hi");
    assert!(t.join("lf").symlink_metadata().unwrap().is_symlink());
    c.ok(
        "fs/writeFile",
        json!({"path": p("dangle"), "dataBase64": b64(b"made")}),
    );
    assert_eq!(std::fs::read(t.join("nope")).unwrap(), b"made");
    is(
        c.err(
            "fs/writeFile",
            json!({"path": p("lf"), "dataBase64": "aGk=", "followSymlinks": false}),
        ),
        (-32603, "Symbolic link loop (os error 40)"),
    );
    is(
        c.err(
            "fs/writeFile",
            json!({"path": p("nodir/x"), "dataBase64": "aGk="}),
        ),
        NOT_FOUND,
    );
    is(
        c.err(
            "fs/writeFile",
            json!({"path": p("d"), "dataBase64": "aGk="}),
        ),
        (-32603, "Is a directory (os error 21)"),
    );
    is(
        c.err(
            "fs/writeFile",
            json!({"path": p("new"), "dataBase64": "!!"}),
        ),
        (
            -32600,
            "fs/writeFile requires valid base64 dataBase64: Invalid symbol 33, offset 0.",
        ),
    );
    is(
        c.err("fs/writeFile", json!({"path": p("new")})),
        (-32602, "missing field `dataBase64`"),
    );

    // createDirectory: recursive unless told otherwise.
    c.ok("fs/createDirectory", json!({"path": p("x/y/z")}));
    assert!(t.join("x/y/z").is_dir());
    c.ok("fs/createDirectory", json!({"path": p("x/y/z")}));
    c.ok(
        "fs/createDirectory",
        json!({"path": p("ld"), "recursive": true}),
    );
    is(
        c.err(
            "fs/createDirectory",
            json!({"path": p("d"), "recursive": false}),
        ),
        (-32603, "File exists (os error 17)"),
    );
    is(
        c.err(
            "fs/createDirectory",
            json!({"path": p("q/r"), "recursive": false}),
        ),
        NOT_FOUND,
    );
    is(
        c.err("fs/createDirectory", json!({"path": p("f")})),
        (-32603, "File exists (os error 17)"),
    );
    is(
        c.err("fs/createDirectory", json!({"path": p("f/sub")})),
        not_dir,
    );
    is(
        c.err(
            "fs/createDirectory",
            json!({"path": p("ld/q"), "followSymlinks": false}),
        ),
        not_dir,
    );

    // canonicalize.
    let r = c.ok("fs/canonicalize", json!({"path": p("ld/a")}));
    let canon = std::fs::canonicalize(t.join("d/a")).unwrap();
    assert_eq!(r["path"], json!(uri(&canon)));
    std::os::unix::fs::symlink("gone", t.join("dangle2")).unwrap();
    is(
        c.err("fs/canonicalize", json!({"path": p("dangle2")})),
        NOT_FOUND,
    );

    // remove: recursive and forced unless told otherwise.
    c.ok("fs/remove", json!({"path": p("missing")}));
    c.ok("fs/remove", json!({"path": p("missing/x")}));
    is(
        c.err("fs/remove", json!({"path": p("missing"), "force": false})),
        NOT_FOUND,
    );
    is(
        c.err("fs/remove", json!({"path": p("x"), "recursive": false})),
        (-32603, "Directory not empty (os error 39)"),
    );
    is(
        c.err(
            "fs/remove",
            json!({"path": p("x"), "followSymlinks": false}),
        ),
        (-32603, "recursive no-follow removal is unsupported"),
    );
    c.ok("fs/remove", json!({"path": p("ld")}));
    assert!(t.join("d/a").exists(), "a symlink is removed, not followed");
    c.ok("fs/remove", json!({"path": p("x")}));
    assert!(!t.join("x").exists());
    c.ok(
        "fs/remove",
        json!({"path": p("nope"), "recursive": false, "followSymlinks": false}),
    );
    c.s.close_stdin_and_wait();
    std::fs::remove_dir_all(&t).unwrap();
}

#[test]
fn names_that_are_not_utf8_travel_as_percent_escapes() {
    let t = unique_tempdir("codex-fs-bytes");
    let name = OsStr::from_bytes(b"\xffname");
    let file = t.join(name);
    let mut c = Fs::start();
    let u = uri(&file);
    assert!(u.ends_with("/%FFname"), "{u}");
    c.ok(
        "fs/writeFile",
        json!({"path": u, "dataBase64": b64(b"raw")}),
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"raw");
    let r = c.ok("fs/readFile", json!({"path": u}));
    assert_eq!(unb64(&r["dataBase64"]), b"raw");
    assert_eq!(c.ok("fs/getMetadata", json!({"path": u}))["size"], json!(3));
    let r = c.ok("fs/canonicalize", json!({"path": u}));
    assert!(r["path"].as_str().unwrap().ends_with("/%FFname"), "{r}");
    // readDirectory's names are text: the byte becomes U+FFFD.
    let r = c.ok("fs/readDirectory", json!({"path": uri(&t)}));
    assert_eq!(
        r["entries"],
        json!([{"fileName": "\u{fffd}name", "isDirectory": false, "isFile": true}])
    );
    // walk's URIs keep the byte (the reference loses it: an error entry).
    let r = c.ok(
        "fs/walk",
        json!({"path": uri(&t), "options": {"maxDepth": 1, "maxDirectories": 10,
            "maxEntries": 10, "followDirectorySymlinks": false}}),
    );
    assert_eq!(r["entries"], json!([{"path": u, "kind": "file"}]));
    assert_eq!(r["errors"], json!([]));
    c.ok("fs/remove", json!({"path": u}));
    assert!(!file.exists());
    c.s.close_stdin_and_wait();
    std::fs::remove_dir_all(&t).unwrap();
}

#[test]
fn read_directory_and_walk_list_as_the_reference() {
    let t = tree("codex-fs-walk");
    std::fs::create_dir_all(t.join(".hid")).unwrap();
    std::fs::write(t.join(".hid/z"), "z").unwrap();
    std::fs::create_dir_all(t.join("d/sub/deep")).unwrap();
    std::fs::write(t.join("d/sub/deep/q"), "q").unwrap();
    std::os::unix::fs::symlink("../d", t.join("d/sub/back")).unwrap();
    nix::unistd::mkfifo(
        &t.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let out = unique_tempdir("codex-fs-walk-out");
    std::fs::create_dir_all(out.join("od")).unwrap();
    std::fs::write(out.join("od/o"), "o").unwrap();
    std::os::unix::fs::symlink(&out, t.join("d/out")).unwrap();
    let mut c = Fs::start();
    let p = |rel: &str| uri(&t.join(rel));

    // readDirectory: symlinks followed for the kinds, a dangling one left
    // out, a FIFO neither a file nor a directory.
    let r = c.ok("fs/readDirectory", json!({"path": uri(&t)}));
    let mut got: Vec<(String, bool, bool)> = r["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["fileName"].as_str().unwrap().to_owned(),
                e["isDirectory"].as_bool().unwrap(),
                e["isFile"].as_bool().unwrap(),
            )
        })
        .collect();
    got.sort();
    let want: Vec<(String, bool, bool)> = [
        (".hid", true, false),
        ("d", true, false),
        ("f", false, true),
        ("fifo", false, false),
        ("ld", true, false),
        ("lf", false, true),
    ]
    .iter()
    .map(|(n, d, f)| (n.to_string(), *d, *f))
    .collect();
    assert_eq!(got, want);
    is(
        c.err("fs/readDirectory", json!({"path": p("f")})),
        (-32603, "Not a directory (os error 20)"),
    );
    is(
        c.err("fs/readDirectory", json!({"path": p("missing")})),
        NOT_FOUND,
    );

    let walk =
        |c: &mut Fs, root: &str, o: Value| c.call("fs/walk", json!({"path": root, "options": o}));
    let listed = |r: &Value| -> Vec<(String, String)> {
        r["result"]["entries"]
            .as_array()
            .unwrap_or_else(|| panic!("{r}"))
            .iter()
            .map(|e| {
                let u = e["path"].as_str().unwrap();
                let rel = u.strip_prefix(&uri(&t)).unwrap_or(u).to_owned();
                (rel, e["kind"].as_str().unwrap().to_owned())
            })
            .collect()
    };
    let opts = |depth: u64, dirs: u64, entries: u64, follow: bool| {
        json!({"maxDepth": depth, "maxDirectories": dirs, "maxEntries": entries,
               "followDirectorySymlinks": follow})
    };
    let e = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    // Breadth first, sorted; symlinks, FIFOs left out; maxDepth 0 lists
    // the root's children.
    let r = walk(&mut c, &uri(&t), opts(0, 100, 1000, false));
    assert_eq!(
        listed(&r),
        e(&[("/.hid", "directory"), ("/d", "directory"), ("/f", "file")])
    );
    assert_eq!(r["result"]["truncated"], json!(false));
    let r = walk(&mut c, &uri(&t), opts(1, 100, 1000, false));
    assert_eq!(
        listed(&r),
        e(&[
            ("/.hid", "directory"),
            ("/d", "directory"),
            ("/f", "file"),
            ("/.hid/z", "file"),
            ("/d/a", "file"),
            ("/d/sub", "directory"),
        ])
    );
    // Hidden directories listed, not entered.
    let mut o = opts(64, 100, 1000, false);
    o["pruneHiddenDirectories"] = json!(true);
    let r = walk(&mut c, &uri(&t), o);
    let l = listed(&r);
    assert!(l.contains(&("/.hid".into(), "directory".into())));
    assert!(!l.iter().any(|(p, _)| p.starts_with("/.hid/")), "{l:?}");
    assert!(l.contains(&("/d/sub/deep/q".into(), "file".into())));
    // Followed links to directories: a directory already read is left
    // out (d/sub/back), one not read yet is listed once (ld), one out of
    // the tree is entered (d/out).
    let r = walk(&mut c, &uri(&t), opts(64, 100, 1000, true));
    assert_eq!(
        listed(&r),
        e(&[
            ("/.hid", "directory"),
            ("/d", "directory"),
            ("/f", "file"),
            ("/ld", "directory"),
            ("/.hid/z", "file"),
            ("/d/a", "file"),
            ("/d/out", "directory"),
            ("/d/sub", "directory"),
            ("/d/out/od", "directory"),
            ("/d/sub/deep", "directory"),
            ("/d/out/od/o", "file"),
            ("/d/sub/deep/q", "file"),
        ])
    );
    // Bounds: truncated, and the reference's refusals.
    let r = walk(&mut c, &uri(&t), opts(64, 1, 1000, false));
    assert_eq!(listed(&r).len(), 3);
    assert_eq!(r["result"]["truncated"], json!(true));
    let r = walk(&mut c, &uri(&t), opts(64, 100, 2, false));
    assert_eq!(
        listed(&r),
        e(&[("/.hid", "directory"), ("/d", "directory")])
    );
    assert_eq!(r["result"]["truncated"], json!(true));
    let over = "filesystem walk limits exceed maximums: depth=64, directories=10000, entries=50000";
    for o in [
        opts(65, 1, 1, false),
        opts(1, 10_001, 1, false),
        opts(1, 1, 50_001, false),
    ] {
        is(error(&walk(&mut c, &uri(&t), o)), (-32600, over));
    }
    for o in [opts(1, 0, 1, false), opts(1, 1, 0, false)] {
        is(
            error(&walk(&mut c, &uri(&t), o)),
            (-32600, "filesystem walk limits must be greater than zero"),
        );
    }
    is(
        c.err("fs/walk", json!({"path": uri(&t)})),
        (-32602, "missing field `options`"),
    );
    is(
        c.err("fs/walk", json!({"path": uri(&t), "options": {"maxDepth": 1, "maxDirectories": 1, "maxEntries": 1}})),
        (-32602, "missing field `followDirectorySymlinks`"),
    );
    // A file, or a link not followed, has nothing to list.
    let r = walk(&mut c, &p("f"), opts(1, 1, 1, false));
    assert_eq!(
        r["result"],
        json!({"entries": [], "errors": [], "truncated": false})
    );
    let r = walk(&mut c, &p("ld"), opts(1, 1, 1, false));
    assert_eq!(r["result"]["entries"], json!([]));
    is(
        error(&walk(&mut c, &p("missing"), opts(1, 1, 1, false))),
        NOT_FOUND,
    );

    // maxEntries counts every name that stats, listed or not (a symlink
    // not followed, a FIFO), but not a dangling symlink: a b bb [bbb]
    // bbbb c d e, both ways of walking (at once; directory by directory
    // when pruning).
    let r8 = t.join("count");
    std::fs::create_dir_all(r8.join("c")).unwrap();
    for f in ["a", "d", "e"] {
        std::fs::write(r8.join(f), "").unwrap();
    }
    std::os::unix::fs::symlink("c", r8.join("b")).unwrap();
    std::os::unix::fs::symlink("a", r8.join("bb")).unwrap();
    std::os::unix::fs::symlink("nope", r8.join("bbb")).unwrap();
    nix::unistd::mkfifo(
        &r8.join("bbbb"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    for prune in [false, true] {
        for (max, want, truncated) in [
            (1, vec!["a"], true),
            (4, vec!["a"], true),
            (5, vec!["a", "c"], true),
            (6, vec!["a", "c", "d"], true),
            (7, vec!["a", "c", "d", "e"], false),
        ] {
            let mut o = opts(0, 10, max, false);
            o["pruneHiddenDirectories"] = json!(prune);
            let r = walk(&mut c, &uri(&r8), o);
            let names: Vec<&str> = r["result"]["entries"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["path"].as_str().unwrap().rsplit('/').next().unwrap())
                .collect();
            assert_eq!(names, want, "maxEntries {max}, prune {prune}");
            assert_eq!(
                r["result"]["truncated"],
                json!(truncated),
                "maxEntries {max}"
            );
        }
    }

    // readDirectory's bound: 50,000 entries.
    let many = t.join("many");
    std::fs::create_dir(&many).unwrap();
    for i in 0..50_000 {
        std::fs::File::create(many.join(format!("{i:05}"))).unwrap();
    }
    let r = c.ok("fs/readDirectory", json!({"path": uri(&many)}));
    assert_eq!(r["entries"].as_array().unwrap().len(), 50_000);
    std::fs::File::create(many.join("one-more")).unwrap();
    is(
        c.err("fs/readDirectory", json!({"path": uri(&many)})),
        (
            -32603,
            "fs/readDirectory returned 50001 entries; limit is 50000",
        ),
    );
    c.s.close_stdin_and_wait();
    std::fs::remove_dir_all(&t).unwrap();
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn handles_are_client_named_and_bounded() {
    let t = tree("codex-fs-handles");
    let mut c = Fs::start();
    let f = uri(&t.join("f"));
    assert_eq!(
        c.ok("fs/open", json!({"handleId": "h", "path": f}))["handleId"],
        json!("h")
    );
    is(
        c.err("fs/open", json!({"handleId": "h", "path": f})),
        (-32600, "file handle `h` already exists"),
    );
    let read = |c: &mut Fs, offset: u64, len: u64| {
        c.ok(
            "fs/readBlock",
            json!({"handleId": "h", "offset": offset, "len": len}),
        )
    };
    // eof: the read came back short (a read ending at the end is not).
    let r = read(&mut c, 0, 3);
    assert_eq!(
        (unb64(&r["chunk"]), &r["eof"]),
        (b"hel".to_vec(), &json!(false))
    );
    let r = read(&mut c, 3, 3);
    assert_eq!(
        (unb64(&r["chunk"]), &r["eof"]),
        (b"lo\n".to_vec(), &json!(false))
    );
    let r = read(&mut c, 3, 10);
    assert_eq!(
        (unb64(&r["chunk"]), &r["eof"]),
        (b"lo\n".to_vec(), &json!(true))
    );
    let r = read(&mut c, 100, 10);
    assert_eq!((unb64(&r["chunk"]), &r["eof"]), (vec![], &json!(true)));
    let len_bound = (
        -32600,
        "file read block length must be between 1 and 1048576",
    );
    for len in [0, 1_048_577] {
        is(
            c.err(
                "fs/readBlock",
                json!({"handleId": "h", "offset": 0, "len": len}),
            ),
            len_bound,
        );
    }
    is(
        c.err(
            "fs/readBlock",
            json!({"handleId": "nope", "offset": 0, "len": 1}),
        ),
        (-32004, "unknown file handle `nope`"),
    );
    // The length is checked before the handle, the URI before the id.
    is(
        c.err(
            "fs/readBlock",
            json!({"handleId": "nope", "offset": 0, "len": 0}),
        ),
        len_bound,
    );
    is(
        c.err(
            "fs/open",
            json!({"handleId": "x".repeat(33), "path": "relative"}),
        ),
        (-32602, "invalid URI: relative URL without a base"),
    );
    is(
        c.err("fs/readBlock", json!({"handleId": "h", "offset": 0})),
        (-32602, "missing field `len`"),
    );
    // The handle keeps the file it opened.
    std::fs::rename(t.join("d/a"), t.join("f")).unwrap();
    let r = read(&mut c, 0, 100);
    assert_eq!(unb64(&r["chunk"]), b"hello\n");
    c.ok("fs/close", json!({"handleId": "h"}));
    c.ok("fs/close", json!({"handleId": "h"}));
    is(
        c.err(
            "fs/readBlock",
            json!({"handleId": "h", "offset": 0, "len": 1}),
        ),
        (-32004, "unknown file handle `h`"),
    );
    // Ids: at most 32 bytes (17 two-byte characters are 34).
    let too_long = (-32600, "file handle ID must not exceed 32 bytes");
    is(
        c.err("fs/open", json!({"handleId": "x".repeat(33), "path": f})),
        too_long,
    );
    is(
        c.err("fs/open", json!({"handleId": "é".repeat(17), "path": f})),
        too_long,
    );
    c.ok("fs/open", json!({"handleId": "x".repeat(32), "path": f}));
    c.ok("fs/open", json!({"handleId": "", "path": f}));
    let not_file = format!("path `{}` is not a file", t.join("d").display());
    is(
        c.err(
            "fs/open",
            json!({"handleId": "d", "path": uri(&t.join("d"))}),
        ),
        (-32600, not_file.as_str()),
    );
    is(
        c.err(
            "fs/open",
            json!({"handleId": "m", "path": uri(&t.join("missing"))}),
        ),
        NOT_FOUND,
    );
    let (code, _) = c.err(
        "fs/open",
        json!({"handleId": "w", "path": f, "mode": "replace"}),
    );
    assert_eq!(code, -32600, "write streams are not advertised");
    is(
        c.err(
            "fs/open",
            json!({"handleId": "w", "path": f, "mode": "write"}),
        ),
        (
            -32602,
            "unknown variant `write`, expected `read` or `replace`",
        ),
    );
    // 128 open at most (two are open): a closed one frees its slot.
    for i in 0..126 {
        c.ok(
            "fs/open",
            json!({"handleId": format!("k{i}"), "path": f, "mode": "read"}),
        );
    }
    let full = (
        -32600,
        "at most 128 file handles may be open per connection",
    );
    is(
        c.err("fs/open", json!({"handleId": "k126", "path": f})),
        full,
    );
    is(
        c.err("fs/open", json!({"handleId": "k0", "path": f})),
        (-32600, "file handle `k0` already exists"),
    );
    c.ok("fs/close", json!({"handleId": "k0"}));
    c.ok("fs/open", json!({"handleId": "k126", "path": f}));
    is(
        c.err("fs/open", json!({"handleId": "k127", "path": f})),
        full,
    );
    // The handles close with the connection: one resuming its session
    // opens 128 again (the native session's own bound, 128, would refuse
    // them otherwise: native handles outlive a detach).
    c.s.close_stdin_and_wait();
    let mut c = Fs::connect(&[], Some(&c.session));
    for i in 0..128 {
        c.ok("fs/open", json!({"handleId": format!("n{i}"), "path": f}));
    }
    c.s.close_stdin_and_wait();
    std::fs::remove_dir_all(&t).unwrap();
}

#[test]
fn files_past_the_native_read_bound_are_read_and_written_whole() {
    let t = unique_tempdir("codex-fs-big");
    let mut c = Fs::start();
    // 20 MiB: above the native max_read_file_bytes (8 MiB) and frame.
    let data: Vec<u8> = (0..20u32 << 20).map(|i| (i % 251) as u8).collect();
    let big = t.join("big");
    std::fs::write(&big, &data).unwrap();
    let r = c.ok("fs/readFile", json!({"path": uri(&big)}));
    assert!(
        unb64(&r["dataBase64"]) == data,
        "the 20 MiB read back differs"
    );
    // 3 MiB written (above one native frame's worth of writeFile).
    let written = t.join("written");
    let chunk = &data[..3 << 20];
    c.ok(
        "fs/writeFile",
        json!({"path": uri(&written), "dataBase64": b64(chunk)}),
    );
    assert!(std::fs::read(&written).unwrap() == chunk);
    // Above 512 MiB (sparse): refused before anything is read.
    let huge = t.join("huge");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len((512 << 20) + 1)
        .unwrap();
    is(
        c.err("fs/readFile", json!({"path": uri(&huge)})),
        (
            -32600,
            "file is too large to read: limit is 536870912 bytes",
        ),
    );
    c.s.close_stdin_and_wait();
    std::fs::remove_dir_all(&t).unwrap();
}

#[test]
fn copy_maps_onto_the_native_copy() {
    let t = tree("codex-fs-copy");
    nix::unistd::mkfifo(
        &t.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let mut c = Fs::start();
    let p = |rel: &str| json!(uri(&t.join(rel)));
    let copy = |c: &mut Fs, from: &str, to: &str, recursive: bool| {
        c.call(
            "fs/copy",
            json!({"sourcePath": p(from), "destinationPath": p(to), "recursive": recursive}),
        )
    };
    assert_eq!(copy(&mut c, "f", "f2", false)["result"], json!({}));
    assert_eq!(std::fs::read(t.join("f2")).unwrap(), b"hello\n");
    assert_eq!(copy(&mut c, "lf", "lf2", false)["result"], json!({}));
    assert_eq!(std::fs::read_link(t.join("lf2")).unwrap(), Path::new("f"));
    is(
        error(&copy(&mut c, "lf", "lf2", false)),
        (-32603, "File exists (os error 17)"),
    );
    is(
        error(&copy(&mut c, "d", "d2", false)),
        (
            -32600,
            "fs/copy requires recursive: true when sourcePath is a directory",
        ),
    );
    assert_eq!(copy(&mut c, "d", "d2", true)["result"], json!({}));
    assert_eq!(std::fs::read(t.join("d2/a")).unwrap(), b"x");
    is(
        error(&copy(&mut c, "d", "d/sub/in", true)),
        (
            -32600,
            "fs/copy cannot copy a directory to itself or one of its descendants",
        ),
    );
    is(
        error(&copy(&mut c, "fifo", "x", false)),
        (
            -32600,
            "fs/copy only supports regular files, directories, and symlinks",
        ),
    );
    is(error(&copy(&mut c, "missing", "x", false)), NOT_FOUND);
    is(error(&copy(&mut c, "f", "nodir/x", false)), NOT_FOUND);
    is(
        error(&copy(&mut c, "f", "d", false)),
        (-32603, "Is a directory (os error 21)"),
    );
    is(
        c.err(
            "fs/copy",
            json!({"sourcePath": p("f"), "destinationPath": p("g")}),
        ),
        (-32602, "missing field `recursive`"),
    );
    c.s.close_stdin_and_wait();
    std::fs::remove_dir_all(&t).unwrap();
}

/// A profile confining fs to one directory: a symlink inside it leading
/// to a file outside is refused by every method that would follow it, as
/// the native agent refuses it (nothing of the file is answered).
#[test]
fn a_profile_confining_fs_refuses_a_symlink_leading_out() {
    let inside = unique_tempdir("codex-fs-jail");
    let outside = unique_tempdir("codex-fs-secret");
    std::fs::write(outside.join("secret"), "top secret").unwrap();
    std::fs::create_dir(outside.join("dir")).unwrap();
    std::fs::write(outside.join("dir/x"), "x").unwrap();
    std::fs::write(inside.join("mine"), "mine").unwrap();
    std::os::unix::fs::symlink(outside.join("secret"), inside.join("link")).unwrap();
    std::os::unix::fs::symlink(outside.join("dir"), inside.join("dirlink")).unwrap();
    let config = inside.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[profiles.jail.sandbox.filesystem]\nread = [{0:?}]\nwrite = [{0:?}]\n",
            inside.display().to_string()
        ),
    )
    .unwrap();
    let mut c = Fs::start_with(&[
        OsStr::new("--config"),
        config.as_os_str(),
        OsStr::new("--profile"),
        OsStr::new("jail"),
    ]);
    let r = c.ok("fs/readFile", json!({"path": uri(&inside.join("mine"))}));
    assert_eq!(unb64(&r["dataBase64"]), b"mine");
    let refused = |r: &Value| {
        let (code, msg) = error(r);
        assert_eq!(code, -32600, "refused as the native sandbox_denied: {r}");
        assert!(!msg.contains("top secret"));
    };
    refused(&c.call("fs/readFile", json!({"path": uri(&inside.join("link"))})));
    refused(&c.call(
        "fs/open",
        json!({"handleId": "h", "path": uri(&inside.join("link"))}),
    ));
    refused(&c.call("fs/getMetadata", json!({"path": uri(&inside.join("link"))})));
    refused(&c.call("fs/readFile", json!({"path": uri(&outside.join("secret"))})));
    refused(&c.call(
        "fs/copy",
        json!({"sourcePath": uri(&outside.join("secret")),
               "destinationPath": uri(&inside.join("stolen")), "recursive": false}),
    ));
    assert!(!inside.join("stolen").exists());
    // Listing never follows a link out: the links are left out.
    let r = c.ok(
        "fs/walk",
        json!({"path": uri(&inside), "options": {"maxDepth": 4, "maxDirectories": 10,
            "maxEntries": 100, "followDirectorySymlinks": true}}),
    );
    let paths: Vec<&str> = r["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert!(!paths.iter().any(|p| p.contains("dirlink")), "{paths:?}");
    let r = c.ok("fs/readDirectory", json!({"path": uri(&inside)}));
    assert!(!r.to_string().contains("\"link\""), "{r}");
    c.s.close_stdin_and_wait();
    std::fs::remove_dir_all(&inside).unwrap();
    std::fs::remove_dir_all(&outside).unwrap();
}

/// Whether process `pid` holds `file` open (by device and inode).
fn holds(pid: u32, (dev, ino): (u64, u64)) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(|e| std::fs::metadata(e.ok()?.path()).ok())
        .any(|m| (m.dev(), m.ino()) == (dev, ino))
}

fn identity(p: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(p).unwrap();
    (m.dev(), m.ino())
}

/// `len`-byte blocks of the open `handle` from `offset` to the end:
/// the data, and whether only the last block said `eof`.
fn read_all(c: &mut Fs, handle: &str, len: u64) -> (Vec<u8>, bool) {
    let (mut data, mut eof_last) = (Vec::new(), true);
    loop {
        let r = c.ok(
            "fs/readBlock",
            json!({"handleId": handle, "offset": data.len(), "len": len}),
        );
        data.extend(unb64(&r["chunk"]));
        if r["eof"] == json!(true) {
            return (data, eof_last);
        }
        eof_last &= (unb64(&r["chunk"]).len() as u64) == len;
    }
}

/// With no audit log, `fs/open` gets the session host's open file
/// (`fs/passDescriptor`): the dialect's process holds the inode the host
/// opened and reads it itself, byte for byte what is there, block
/// bounds and `eof` as before; a file replaced or removed after the open
/// is still read from the opened inode (the path is not looked up
/// again); `fs/close` lets go of it.
#[test]
fn read_blocks_go_through_the_descriptor_the_host_opened() {
    let t = unique_tempdir("codex-fs-passed");
    let data: Vec<u8> = (0..(3 << 20) + 123u32)
        .map(|i| (i.wrapping_mul(7) % 251) as u8)
        .collect();
    let big = t.join("big");
    std::fs::write(&big, &data).unwrap();
    let opened = identity(&big);
    let mut c = Fs::start();
    let pid = c.s.child.id();
    assert!(!holds(pid, opened), "nothing is open before fs/open");
    c.ok("fs/open", json!({"handleId": "b", "path": uri(&big)}));
    assert!(
        holds(pid, opened),
        "the dialect holds the file the session host opened"
    );
    let (got, eof_last) = read_all(&mut c, "b", 1 << 20);
    assert!(
        got == data,
        "the blocks read are the file ({} bytes)",
        got.len()
    );
    assert!(eof_last, "only the last (short) block says eof");
    let r = c.ok(
        "fs/readBlock",
        json!({"handleId": "b", "offset": 1_000_001, "len": 1000}),
    );
    assert_eq!(unb64(&r["chunk"]), &data[1_000_001..1_001_001]);
    assert_eq!(r["eof"], json!(false));
    // The bounds are the dialect's, as before; bad input is answered and
    // the connection goes on reading.
    is(
        c.err(
            "fs/readBlock",
            json!({"handleId": "b", "offset": 0, "len": 1_048_577}),
        ),
        (
            -32600,
            "file read block length must be between 1 and 1048576",
        ),
    );
    let (code, _) = c.err(
        "fs/readBlock",
        json!({"handleId": "b", "offset": -1, "len": 1}),
    );
    assert_eq!(code, -32602);
    c.s.send_raw("{\"id\": 7, \"method\": \"fs/readBlock\", \"params\": {\"handleId\"");
    let r = c.s.next();
    assert!(
        r.get("error").is_some(),
        "a malformed line is answered: {r}"
    );
    let r = c.ok(
        "fs/readBlock",
        json!({"handleId": "b", "offset": (3 << 20) + 100, "len": 100}),
    );
    assert_eq!(
        (unb64(&r["chunk"]), &r["eof"]),
        (data[(3 << 20) + 100..].to_vec(), &json!(true))
    );
    // Replaced, then removed: the opened inode is read.
    std::fs::write(t.join("other"), b"replaced").unwrap();
    std::fs::rename(t.join("other"), &big).unwrap();
    let r = c.ok(
        "fs/readBlock",
        json!({"handleId": "b", "offset": 0, "len": 16}),
    );
    assert_eq!(unb64(&r["chunk"]), &data[..16]);
    std::fs::remove_file(&big).unwrap();
    let (got, _) = read_all(&mut c, "b", 1 << 20);
    assert!(got == data, "read after removal");
    c.ok("fs/close", json!({"handleId": "b"}));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while holds(pid, opened) {
        assert!(
            std::time::Instant::now() < deadline,
            "fs/close lets go of the descriptor"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // The connection goes on: a missing file is refused, another opens.
    let (code, _) = c.err(
        "fs/open",
        json!({"handleId": "b", "path": uri(&t.join("missing"))}),
    );
    assert_eq!(code, NOT_FOUND.0);
    std::fs::write(t.join("small"), b"small").unwrap();
    c.ok(
        "fs/open",
        json!({"handleId": "b", "path": uri(&t.join("small"))}),
    );
    let r = c.ok(
        "fs/readBlock",
        json!({"handleId": "b", "offset": 0, "len": 100}),
    );
    assert_eq!(
        (unb64(&r["chunk"]), &r["eof"]),
        (b"small".to_vec(), &json!(true))
    );
    c.s.close_stdin_and_wait();
    std::fs::remove_dir_all(&t).unwrap();
}

/// The methods of the audit log's records (one JSON line each).
fn audited_methods(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let v: Value = serde_json::from_str(l).ok()?;
            v["method"].as_str().map(str::to_owned)
        })
        .collect()
}

/// With an audit log configured no descriptor is asked for or passed:
/// every block is a native `fs/readBlock`, each recorded, and the reads
/// answer the same.
#[test]
fn with_an_audit_log_each_block_is_a_recorded_native_read() {
    let t = unique_tempdir("codex-fs-audited");
    let data: Vec<u8> = (0..(1u32 << 20) + 5).map(|i| (i % 253) as u8).collect();
    std::fs::write(t.join("f"), &data).unwrap();
    let audit = t.join("audit.jsonl");
    let config = t.join("config.toml");
    std::fs::write(&config, format!("[audit]\nfile = {audit:?}\n")).unwrap();
    let mut c = Fs::start_with(&[OsStr::new("--config"), config.as_os_str()]);
    let pid = c.s.child.id();
    c.ok(
        "fs/open",
        json!({"handleId": "h", "path": uri(&t.join("f"))}),
    );
    assert!(!holds(pid, identity(&t.join("f"))), "no descriptor passed");
    let (got, _) = read_all(&mut c, "h", 1 << 20);
    assert!(got == data, "the blocks read are the file");
    c.ok("fs/close", json!({"handleId": "h"}));
    c.s.close_stdin_and_wait();
    let methods = audited_methods(&audit);
    let count = |m: &str| methods.iter().filter(|x| *x == m).count();
    assert_eq!(count("fs/open"), 1, "{methods:?}");
    assert_eq!(count("fs/readBlock"), 2, "{methods:?}");
    assert_eq!(count("fs/passDescriptor"), 0, "{methods:?}");
    std::fs::remove_dir_all(&t).unwrap();
}

/// A profile that denies `fs/readBlock` denies reading through the dialect
/// as before: no descriptor is passed around the rule (the table makes
/// `fs/passDescriptor` its alias), the block is refused, nothing of the
/// file is answered.
#[test]
fn a_profile_denying_read_block_passes_no_descriptor() {
    let t = unique_tempdir("codex-fs-noblocks");
    std::fs::write(t.join("f"), b"top secret").unwrap();
    let config = t.join("config.toml");
    std::fs::write(
        &config,
        "[profiles.noblocks]\nmethods.deny = [\"fs/readBlock\"]\n",
    )
    .unwrap();
    let mut c = Fs::start_with(&[
        OsStr::new("--config"),
        config.as_os_str(),
        OsStr::new("--profile"),
        OsStr::new("noblocks"),
    ]);
    let pid = c.s.child.id();
    c.ok(
        "fs/open",
        json!({"handleId": "h", "path": uri(&t.join("f"))}),
    );
    assert!(!holds(pid, identity(&t.join("f"))), "no descriptor passed");
    let r = c.call(
        "fs/readBlock",
        json!({"handleId": "h", "offset": 0, "len": 100}),
    );
    let (code, msg) = error(&r);
    assert!(code < 0 && msg.contains("fs/readBlock"), "{r}");
    assert!(!r.to_string().contains("dG9wIHNlY3JldA"), "{r}");
    c.s.close_stdin_and_wait();
    std::fs::remove_dir_all(&t).unwrap();
}
