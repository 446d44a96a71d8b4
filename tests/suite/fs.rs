//! Filesystem (docs/PROTOCOL.md §5) against the real binary.

use executor_client::fs::walk_params;
use executor_client::{Client, ClientOptions, ErrorCode};
use executor_protocol::types::fs::*;
use executor_tests::*;
use futures_util::StreamExt;
use serde_bytes::ByteBuf;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use executor_tests::wire_path as p;

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn sha256(data: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, data)
        .as_ref()
        .to_vec()
}

#[tokio::test]
async fn all_256_byte_values_round_trip() {
    let c = local_client().await;
    all_256_byte_values_round_trip_on(&c).await;
    c.close().await.unwrap();
}

/// Run by every transport (tests/suite/transports.rs).
pub async fn all_256_byte_values_round_trip_on(c: &Client) {
    let d = unique_tempdir("bytes");
    let data: Vec<u8> = (0..=255u8).cycle().take(256 * 17).collect();
    let f = d.join("all");
    c.write_file(p(&f), &data).await.unwrap();
    assert_eq!(std::fs::read(&f).unwrap(), data);
    assert_eq!(c.read_file(p(&f)).await.unwrap(), data);
    // Streamed too.
    let g = d.join("streamed");
    c.write_stream(p(&g), &data[..], None).await.unwrap();
    let (_, s) = c.read_stream(p(&g)).await.unwrap();
    let blocks: Vec<_> = s.collect().await;
    let got: Vec<u8> = blocks
        .into_iter()
        .flat_map(|b| b.unwrap().to_vec())
        .collect();
    assert_eq!(got, data);
    // No temp files anywhere.
    assert_eq!(names(&d), vec!["all", "streamed"]);
}

#[tokio::test]
async fn atomic_writes_and_uncommitted_closes_leave_no_temp_files() {
    let c = local_client().await;
    let d = unique_tempdir("temp");
    let f = d.join("x");
    for i in 0..5 {
        c.write_file(p(&f), format!("v{i}").as_bytes())
            .await
            .unwrap();
    }
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "v4");
    let h: HandleResult = c
        .call(&OpenWriteParams {
            path: p(&d.join("y")),
            mode: None,
            create_parents: false,
            mtime_ns: None,
            atime_ns: None,
            sandbox: None,
            cwd: None,
        })
        .await
        .unwrap();
    c.call(&WriteBlockParams {
        handle: h.handle,
        offset: 0,
        data: ByteBuf::from(b"secret".to_vec()),
        sandbox: None,
        cwd: None,
    })
    .await
    .unwrap();
    assert_eq!(names(&d).len(), 2, "a temp file exists while writing");
    c.call(&CloseParams {
        handle: h.handle,
        sandbox: None,
        cwd: None,
    })
    .await
    .unwrap();
    assert_eq!(names(&d), vec!["x"]);
    // The end of the session discards uncommitted writes too.
    let h: HandleResult = c
        .call(&OpenWriteParams {
            path: p(&d.join("z")),
            mode: None,
            create_parents: false,
            mtime_ns: None,
            atime_ns: None,
            sandbox: None,
            cwd: None,
        })
        .await
        .unwrap();
    let _ = h;
    c.close().await.unwrap();
    assert_eq!(names(&d), vec!["x"]);
}

#[tokio::test]
async fn open_write_content_is_invisible_before_commit() {
    let c = local_client().await;
    open_write_content_is_invisible_before_commit_on(&c).await;
    c.close().await.unwrap();
}

/// Run by every transport (tests/suite/transports.rs).
pub async fn open_write_content_is_invisible_before_commit_on(c: &Client) {
    let d = unique_tempdir("commit");
    let f = d.join("target");
    std::fs::write(&f, "old").unwrap();
    let h: HandleResult = c
        .call(&OpenWriteParams {
            path: p(&f),
            mode: Some(0o640),
            create_parents: false,
            mtime_ns: None,
            atime_ns: None,
            sandbox: None,
            cwd: None,
        })
        .await
        .unwrap();
    for (i, chunk) in [&b"new "[..], b"content"].iter().enumerate() {
        let offset = if i == 0 { 0 } else { 4 };
        c.call(&WriteBlockParams {
            handle: h.handle,
            offset,
            data: ByteBuf::from(chunk.to_vec()),
            sandbox: None,
            cwd: None,
        })
        .await
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(&f).unwrap(),
            "old",
            "invisible before commit"
        );
    }
    let r: CommitResult = c
        .call(&HandleParams {
            handle: h.handle,
            sandbox: None,
            cwd: None,
        })
        .await
        .unwrap();
    assert_eq!(r.size, 11);
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "new content");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&f).unwrap().permissions().mode() & 0o7777,
        0o640
    );
    assert_eq!(names(&d), vec!["target"]);
    // Close after commit (a client's `finally`): `{}` once, then unknown;
    // the committed file stays.
    let close = |handle| async move {
        c.call(&CloseParams {
            handle,
            sandbox: None,
            cwd: None,
        })
        .await
    };
    close(h.handle).await.unwrap();
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "new content");
    let w = remote(close(h.handle).await.unwrap_err());
    assert_eq!(w.code, ErrorCode::UnknownHandle, "a second close");
    let w = remote(close(h.handle + 1000).await.unwrap_err());
    assert_eq!(w.code, ErrorCode::UnknownHandle, "never opened");
}

#[tokio::test]
async fn errors_name_the_path() {
    let c = local_client().await;
    errors_name_the_path_on(&c).await;
    c.close().await.unwrap();
}

/// Run by every transport (tests/suite/transports.rs).
pub async fn errors_name_the_path_on(c: &Client) {
    let d = unique_tempdir("errors");
    let missing = d.join("missing");
    let w = remote(c.read_file(p(&missing)).await.unwrap_err());
    assert_eq!(w.code, ErrorCode::NotFound);
    assert_eq!(
        w.data_get("path").and_then(|v| v.as_str()),
        missing.to_str()
    );
    assert_eq!(w.data_get("errno").and_then(|v| v.as_i64()), Some(2));
    let w = remote(c.read_file(p(&d)).await.unwrap_err());
    assert_eq!(w.code, ErrorCode::IsADirectory);
    assert_eq!(w.data_get("path").and_then(|v| v.as_str()), d.to_str());
    let w = remote(c.write_file(p(&d), b"x").await.unwrap_err());
    assert_eq!(w.code, ErrorCode::IsADirectory);
    let w = remote(
        c.write_file(p(&d.join("no/such/parent")), b"x")
            .await
            .unwrap_err(),
    );
    assert_eq!(w.code, ErrorCode::NotFound);
    let w = remote(
        c.call(&CreateDirectoryParams {
            path: p(&d),
            recursive: false,
            mode: None,
            sandbox: None,
            cwd: None,
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(w.code, ErrorCode::AlreadyExists);
    let file = d.join("file");
    std::fs::write(&file, "x").unwrap();
    let w = remote(c.stat(p(&file.join("below"))).await.unwrap_err());
    assert_eq!(w.code, ErrorCode::NotADirectory);
    let w = remote(c.stat("relative/path").await.unwrap_err());
    assert_eq!(w.code, ErrorCode::InvalidParams);
    assert_eq!(w.data_get("field").and_then(|v| v.as_str()), Some("path"));
}

#[tokio::test]
async fn permission_denied_names_the_path() {
    // The agent runs unprivileged here (root bypasses file permissions).
    let d = unique_tempdir("perm");
    let secret = d.join("secret");
    std::fs::write(&secret, "x").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    let is_root = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"));
    let mut cmd = if is_root {
        let mut c = tokio::process::Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(executor_bin());
        c
    } else {
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o000)).unwrap();
        tokio::process::Command::new(executor_bin())
    };
    cmd.env_remove("HOME");
    let c = Client::spawn(cmd, ClientOptions::default()).await.unwrap();
    let w = remote(c.read_file(p(&secret)).await.unwrap_err());
    assert_eq!(w.code, ErrorCode::PermissionDenied);
    assert_eq!(w.data_get("path").and_then(|v| v.as_str()), secret.to_str());
    assert_eq!(w.data_get("errno").and_then(|v| v.as_i64()), Some(13));
    let w = remote(c.write_file(p(&d.join("new")), b"x").await.unwrap_err());
    assert_eq!(w.code, ErrorCode::PermissionDenied);
}

#[tokio::test]
async fn non_utf8_names_are_walked_and_read_back() {
    let c = local_client().await;
    non_utf8_names_are_walked_and_read_back_on(&c).await;
    c.close().await.unwrap();
}

/// Run by every transport (tests/suite/transports.rs).
pub async fn non_utf8_names_are_walked_and_read_back_on(c: &Client) {
    let d = unique_tempdir("utf8");
    let name = OsStr::from_bytes(b"caf\xe9-\xff.txt");
    let f = d.join(name);
    std::fs::write(&f, "bytes").unwrap();
    let page = c.call(&walk_params(p(&d))).await.unwrap();
    assert_eq!(page.entries.len(), 1);
    let e = &page.entries[0];
    assert_eq!(e.path.as_bytes(), name.as_bytes());
    assert!(e.path.as_str().is_none(), "travels as bin");
    let back = d.join(OsStr::from_bytes(e.path.as_bytes()));
    assert_eq!(c.read_file(p(&back)).await.unwrap(), b"bytes");
    // Write and stat through a bin path too.
    let g = d.join(OsStr::from_bytes(b"\x80new"));
    c.write_file(p(&g), b"1").await.unwrap();
    assert_eq!(std::fs::read(&g).unwrap(), b"1");
    assert_eq!(c.stat(p(&g)).await.unwrap().size, 1);
    let canon: PathResult = c
        .call(&CanonicalizeParams {
            path: p(&g),
            sandbox: None,
            cwd: None,
        })
        .await
        .unwrap();
    assert!(canon.path.as_bytes().ends_with(b"\x80new"));
}

/// A tree: 3 dirs of 40 files, plus nested dirs 4 deep.
fn make_tree(d: &Path) -> usize {
    let mut n = 0;
    for i in 0..3 {
        let sub = d.join(format!("d{i}"));
        std::fs::create_dir(&sub).unwrap();
        n += 1;
        for j in 0..40 {
            std::fs::write(sub.join(format!("f{j:02}")), "x").unwrap();
            n += 1;
        }
    }
    let mut deep = d.to_path_buf();
    for k in 0..4 {
        deep = deep.join(format!("n{k}"));
        std::fs::create_dir(&deep).unwrap();
        n += 1;
    }
    std::fs::write(deep.join("leaf"), "y").unwrap();
    n + 1
}

#[tokio::test]
async fn walk_limits_truncate_and_cursors_resume_exactly() {
    let c = local_client().await;
    walk_limits_truncate_and_cursors_resume_exactly_on(&c).await;
    c.close().await.unwrap();
}

/// Run by every transport (tests/suite/transports.rs).
pub async fn walk_limits_truncate_and_cursors_resume_exactly_on(c: &Client) {
    let d = unique_tempdir("walk");
    let total = make_tree(&d);
    // Everything at once.
    let all = c.call(&walk_params(p(&d))).await.unwrap();
    assert!(!all.truncated, "{:?}", all.truncated_by);
    assert_eq!(all.entries.len(), total);
    // Breadth-first: depth-1 entries first.
    assert!(all.entries[..4]
        .iter()
        .all(|e| !e.path.as_bytes().contains(&b'/')));
    let mut want: Vec<Vec<u8>> = all
        .entries
        .iter()
        .map(|e| e.path.as_bytes().to_vec())
        .collect();
    want.sort();

    for (limit, field) in [
        (TruncatedBy::MaxEntries, "max_entries"),
        (TruncatedBy::MaxResponseBytes, "max_response_bytes"),
        (TruncatedBy::MaxDirectories, "max_directories"),
    ] {
        let mut params = walk_params(p(&d));
        match limit {
            TruncatedBy::MaxEntries => params.max_entries = 7,
            TruncatedBy::MaxResponseBytes => params.max_response_bytes = 2000,
            TruncatedBy::MaxDirectories => params.max_directories = 2,
            _ => unreachable!(),
        }
        let mut got: Vec<Vec<u8>> = Vec::new();
        let mut pages = 0;
        let mut saw_limit = false;
        c.walk(params, |page| {
            pages += 1;
            if page.truncated_by == Some(limit) {
                saw_limit = true;
                assert!(page.next_cursor.is_some(), "{field} gives a cursor");
            }
            got.extend(page.entries.iter().map(|e| e.path.as_bytes().to_vec()));
        })
        .await
        .unwrap();
        assert!(saw_limit, "{field} truncates");
        assert!(pages > 1, "{field}");
        got.sort();
        assert_eq!(got, want, "{field}: every entry exactly once across pages");
    }
    // max_depth: one level, truncated_by max_depth, no cursor.
    let mut params = walk_params(p(&d));
    params.max_depth = 1;
    let page = c.call(&params).await.unwrap();
    assert_eq!(page.entries.len(), 4);
    assert_eq!(page.truncated_by, Some(TruncatedBy::MaxDepth));
    assert!(page.next_cursor.is_none());
    // A cursor from another root is refused.
    let mut params = walk_params(p(&d));
    params.max_entries = 3;
    let first = c.call(&params).await.unwrap();
    let mut other = walk_params(p(&d.join("d0")));
    other.cursor = first.next_cursor;
    let w = remote(c.call(&other).await.unwrap_err());
    assert_eq!(w.data_get("field").and_then(|v| v.as_str()), Some("cursor"));
}

#[tokio::test]
async fn walk_reports_symlinks_without_following_and_survives_loops() {
    let c = local_client().await;
    let d = unique_tempdir("loops");
    std::fs::create_dir(d.join("sub")).unwrap();
    std::os::unix::fs::symlink(&d, d.join("sub/up")).unwrap();
    std::os::unix::fs::symlink("self", d.join("self")).unwrap();
    std::os::unix::fs::symlink("/", d.join("root")).unwrap();
    let page = tokio::time::timeout(WAIT, c.call(&walk_params(p(&d))))
        .await
        .unwrap()
        .unwrap();
    let mut got: Vec<(String, FileKind)> = page
        .entries
        .iter()
        .map(|e| (e.path.display(), e.kind))
        .collect();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        got,
        vec![
            ("root".into(), FileKind::Symlink),
            ("self".into(), FileKind::Symlink),
            ("sub".into(), FileKind::Dir),
            ("sub/up".into(), FileKind::Symlink),
        ]
    );
}

#[tokio::test]
async fn unreadable_directories_are_errors_and_the_walk_goes_on() {
    let d = unique_tempdir("unreadable");
    std::fs::create_dir(d.join("closed")).unwrap();
    std::fs::write(d.join("closed/hidden"), "x").unwrap();
    std::fs::create_dir(d.join("open")).unwrap();
    std::fs::write(d.join("open/visible"), "x").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(d.join("closed"), std::fs::Permissions::from_mode(0o000)).unwrap();
    // Unprivileged agent (root would read it anyway).
    let mut cmd = tokio::process::Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(executor_bin());
    let c = match Client::spawn(cmd, ClientOptions::default()).await {
        Ok(c) => c,
        Err(_) => local_client().await, // not root: setpriv cannot switch, run as self
    };
    let page = c.call(&walk_params(p(&d))).await.unwrap();
    let paths: Vec<String> = page.entries.iter().map(|e| e.path.display()).collect();
    assert!(paths.contains(&"closed".to_string()), "{paths:?}");
    assert!(paths.contains(&"open/visible".to_string()), "{paths:?}");
    assert!(!paths.contains(&"closed/hidden".to_string()));
    assert_eq!(page.errors.len(), 1, "{:?}", page.errors);
    assert_eq!(page.errors[0].path.display(), "closed");
    assert_eq!(page.errors[0].code, ErrorCode::PermissionDenied);
    std::fs::set_permissions(d.join("closed"), std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[tokio::test]
async fn a_5_mib_file_read_in_blocks_matches_its_sha256() {
    let c = local_client().await;
    a_5_mib_file_read_in_blocks_matches_its_sha256_on(&c).await;
    c.close().await.unwrap();
}

/// Run by every transport (tests/suite/transports.rs).
pub async fn a_5_mib_file_read_in_blocks_matches_its_sha256_on(c: &Client) {
    let d = unique_tempdir("sha");
    let data: Vec<u8> = (0..5 * 1024 * 1024 + 123)
        .map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(d.join("f"), &data).unwrap();
    let (size, s) = c.read_stream(p(&d.join("f"))).await.unwrap();
    assert_eq!(size, data.len() as u64);
    let mut got = Vec::new();
    let mut s = std::pin::pin!(s);
    while let Some(b) = s.next().await {
        got.extend_from_slice(&b.unwrap());
    }
    assert_eq!(sha256(&got), sha256(&data));
    // eof is set on a read ending exactly at the end.
    let o: OpenResult = c
        .call(&OpenParams {
            path: p(&d.join("f")),
            sandbox: None,
            cwd: None,
        })
        .await
        .unwrap();
    let len = 1000u64;
    let r: ReadBlockResult = c
        .call(&ReadBlockParams {
            handle: o.handle,
            offset: data.len() as u64 - len,
            length: len,
            sandbox: None,
            cwd: None,
        })
        .await
        .unwrap();
    assert_eq!(r.data.len() as u64, len);
    assert!(r.eof);
    let r: ReadBlockResult = c
        .call(&ReadBlockParams {
            handle: o.handle,
            offset: 0,
            length: 10,
            sandbox: None,
            cwd: None,
        })
        .await
        .unwrap();
    assert!(!r.eof);
    let w = remote(
        c.call(&ReadBlockParams {
            handle: o.handle,
            offset: 0,
            length: (1 << 20) + 1,
            sandbox: None,
            cwd: None,
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(w.code, ErrorCode::LimitExceeded);
    assert_eq!(
        w.data_get("limit").and_then(|v| v.as_str()),
        Some("max_block_bytes")
    );
}

#[tokio::test]
async fn reads_continue_from_the_old_inode_after_a_rename_over_the_path() {
    let c = local_client().await;
    let d = unique_tempdir("inode");
    let f = d.join("f");
    std::fs::write(&f, "original content").unwrap();
    let o: OpenResult = c
        .call(&OpenParams {
            path: p(&f),
            sandbox: None,
            cwd: None,
        })
        .await
        .unwrap();
    std::fs::write(d.join("new"), "REPLACED").unwrap();
    std::fs::rename(d.join("new"), &f).unwrap();
    let r: ReadBlockResult = c
        .call(&ReadBlockParams {
            handle: o.handle,
            offset: 0,
            length: 100,
            sandbox: None,
            cwd: None,
        })
        .await
        .unwrap();
    assert_eq!(&r.data[..], b"original content");
    assert!(r.eof);
}

#[tokio::test]
async fn the_129th_handle_is_limit_exceeded_and_closing_frees_a_slot() {
    let c = local_client().await;
    the_129th_handle_is_limit_exceeded_and_closing_frees_a_slot_on(&c).await;
    c.close().await.unwrap();
}

/// Run by every transport (tests/suite/transports.rs).
pub async fn the_129th_handle_is_limit_exceeded_and_closing_frees_a_slot_on(c: &Client) {
    let d = unique_tempdir("handles");
    let f = d.join("f");
    std::fs::write(&f, "x").unwrap();
    let mut handles = Vec::new();
    for _ in 0..128 {
        let o: OpenResult = c
            .call(&OpenParams {
                path: p(&f),
                sandbox: None,
                cwd: None,
            })
            .await
            .unwrap();
        handles.push(o.handle);
    }
    let w = remote(
        c.call(&OpenParams {
            path: p(&f),
            sandbox: None,
            cwd: None,
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(w.code, ErrorCode::LimitExceeded);
    assert_eq!(
        w.data_get("limit").and_then(|v| v.as_str()),
        Some("max_open_files")
    );
    assert_eq!(w.data_get("max").and_then(|v| v.as_u64()), Some(128));
    let w = remote(
        c.call(&OpenWriteParams {
            path: p(&d.join("w")),
            mode: None,
            create_parents: false,
            mtime_ns: None,
            atime_ns: None,
            sandbox: None,
            cwd: None,
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(w.code, ErrorCode::LimitExceeded);
    c.call(&CloseParams {
        handle: handles[5],
        sandbox: None,
        cwd: None,
    })
    .await
    .unwrap();
    c.call(&OpenParams {
        path: p(&f),
        sandbox: None,
        cwd: None,
    })
    .await
    .unwrap();
    // A closed handle is unknown.
    let w = remote(
        c.call(&ReadBlockParams {
            handle: handles[5],
            offset: 0,
            length: 1,
            sandbox: None,
            cwd: None,
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(w.code, ErrorCode::UnknownHandle);
    assert_eq!(
        names(&d),
        vec!["f"],
        "no temp file from the refused openWrite"
    );
}

#[tokio::test]
async fn read_file_is_bounded_and_ranges_within_the_bound_work() {
    let c = local_client().await;
    read_file_is_bounded_and_ranges_within_the_bound_work_on(&c).await;
    c.close().await.unwrap();
}

/// Run by every transport (tests/suite/transports.rs).
pub async fn read_file_is_bounded_and_ranges_within_the_bound_work_on(c: &Client) {
    let d = unique_tempdir("bound");
    let f = d.join("big");
    let file = std::fs::File::create(&f).unwrap();
    file.set_len(9 << 20).unwrap();
    let w = remote(c.read_file(p(&f)).await.unwrap_err());
    assert_eq!(w.code, ErrorCode::LimitExceeded);
    assert_eq!(
        w.data_get("limit").and_then(|v| v.as_str()),
        Some("max_read_file_bytes")
    );
    assert!(w.message.contains("fs/open"), "{}", w.message);
    let r: ReadFileResult = c
        .call(&ReadFileParams {
            path: p(&f),
            offset: Some(1 << 20),
            length: Some(1000),
            sandbox: None,
            cwd: None,
        })
        .await
        .unwrap();
    assert_eq!((r.data.len(), r.size), (1000, 9 << 20));
}

#[tokio::test]
async fn mode_is_exact_and_remove_never_follows_symlinks() {
    let c = local_client().await;
    let d = unique_tempdir("mode");
    c.call(&WriteFileParams {
        path: p(&d.join("sub/x")),
        data: ByteBuf::from(b"x".to_vec()),
        mode: Some(0o777),
        create_parents: true,
        atomic: true,
        sandbox: None,
        cwd: None,
    })
    .await
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(d.join("sub/x"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o777,
        "not masked by the umask"
    );
    // A symlink at the path is replaced, not written through.
    let outside = unique_tempdir("outside");
    std::fs::write(outside.join("keep"), "keep").unwrap();
    std::os::unix::fs::symlink(outside.join("keep"), d.join("link")).unwrap();
    c.write_file(p(&d.join("link")), b"new").await.unwrap();
    assert_eq!(
        std::fs::read_to_string(outside.join("keep")).unwrap(),
        "keep"
    );
    assert!(!std::fs::symlink_metadata(d.join("link"))
        .unwrap()
        .file_type()
        .is_symlink());
    // Recursive remove of a tree holding a symlink to outside: the outside stays.
    std::os::unix::fs::symlink(&outside, d.join("sub/out")).unwrap();
    c.call(&RemoveParams {
        path: p(&d.join("sub")),
        recursive: true,
        sandbox: None,
        cwd: None,
    })
    .await
    .unwrap();
    assert!(!d.join("sub").exists());
    assert_eq!(
        std::fs::read_to_string(outside.join("keep")).unwrap(),
        "keep"
    );
    // Non-recursive removal of a non-empty dir fails; a symlink to a dir is removed as a link.
    std::fs::create_dir_all(d.join("full/x")).unwrap();
    let w = remote(
        c.call(&RemoveParams {
            path: p(&d.join("full")),
            recursive: false,
            sandbox: None,
            cwd: None,
        })
        .await
        .unwrap_err(),
    );
    assert_eq!(
        w.data_get("path").and_then(|v| v.as_str()),
        d.join("full").to_str()
    );
    std::os::unix::fs::symlink(&outside, d.join("dirlink")).unwrap();
    c.call(&RemoveParams {
        path: p(&d.join("dirlink")),
        recursive: true,
        sandbox: None,
        cwd: None,
    })
    .await
    .unwrap();
    assert!(outside.join("keep").exists());
    // rename
    c.call(&RenameParams {
        from: p(&d.join("full")),
        to: p(&d.join("moved")),
        sandbox: None,
        cwd: None,
    })
    .await
    .unwrap();
    assert!(d.join("moved/x").is_dir());
}

#[tokio::test]
async fn streaming_a_2_gib_sparse_file_keeps_the_agent_rss_flat() {
    let d = unique_tempdir("sparse");
    let f = d.join("sparse");
    std::fs::File::create(&f).unwrap().set_len(2 << 30).unwrap();
    let mut a = RawAgent::spawn().await;
    let pid = a.child.id().unwrap();
    // Drive the agent through the client library over the raw agent's pipes.
    let stdin = a.stdin.take().unwrap();
    let stdout = std::mem::replace(&mut a.stdout, {
        // A placeholder; the real stdout moves into the client.
        let (_r, w) = tokio::net::unix::pipe::pipe().unwrap();
        drop(w);
        tokio::process::Command::new("true")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap()
            .stdout
            .take()
            .unwrap()
    });
    // The preamble was consumed by RawAgent::spawn: re-prefix it.
    let reader = tokio::io::AsyncReadExt::chain(&executor_protocol::PREAMBLE[..], stdout);
    let c = Client::connect(reader, stdin, ClientOptions::default())
        .await
        .unwrap();
    let (size, s) = c.read_stream(p(&f)).await.unwrap();
    assert_eq!(size, 2 << 30);
    let mut total = 0u64;
    let mut s = std::pin::pin!(s);
    while let Some(b) = s.next().await {
        total += b.unwrap().len() as u64;
    }
    assert_eq!(total, 2 << 30);
    let peak = status_kib(pid, "VmHWM");
    assert!(
        peak > 0 && peak < 64 * 1024,
        "agent peak RSS {peak} KiB while streaming 2 GiB"
    );
    c.close().await.unwrap();
    std::fs::remove_file(&f).unwrap();
}

/// The transport-independent tests, by their test names.
pub mod on {
    pub use super::a_5_mib_file_read_in_blocks_matches_its_sha256_on as a_5_mib_file_read_in_blocks_matches_its_sha256;
    pub use super::all_256_byte_values_round_trip_on as all_256_byte_values_round_trip;
    pub use super::errors_name_the_path_on as errors_name_the_path;
    pub use super::non_utf8_names_are_walked_and_read_back_on as non_utf8_names_are_walked_and_read_back;
    pub use super::open_write_content_is_invisible_before_commit_on as open_write_content_is_invisible_before_commit;
    pub use super::read_file_is_bounded_and_ranges_within_the_bound_work_on as read_file_is_bounded_and_ranges_within_the_bound_work;
    pub use super::the_129th_handle_is_limit_exceeded_and_closing_frees_a_slot_on as the_129th_handle_is_limit_exceeded_and_closing_frees_a_slot;
    pub use super::walk_limits_truncate_and_cursors_resume_exactly_on as walk_limits_truncate_and_cursors_resume_exactly;
}

// Issue 16: links are read and made as bytes (a target that is not UTF-8
// round-trips), never followed, and an existing entry is `already_exists`.
#[tokio::test]
async fn symlinks_are_read_and_made_as_bytes_never_followed() {
    let c = local_client().await;
    let d = unique_tempdir("links");
    let odd = OsStr::from_bytes(b"caf\xe9/../t\x01arget");
    std::os::unix::fs::symlink(odd, d.join("odd")).unwrap();
    let got = c.read_link(p(&d.join("odd"))).await.unwrap();
    assert_eq!(got.as_bytes(), odd.as_bytes());
    c.create_symlink(p(&d.join("copy")), got).await.unwrap();
    assert_eq!(std::fs::read_link(d.join("copy")).unwrap().as_os_str(), odd);
    // An existing dangling link is not followed: its target is not made.
    std::os::unix::fs::symlink(d.join("would-be"), d.join("dangling")).unwrap();
    let w = remote(
        c.create_symlink(p(&d.join("dangling")), "x")
            .await
            .unwrap_err(),
    );
    assert_eq!(w.code, ErrorCode::AlreadyExists, "{w:?}");
    assert!(w.message.contains("dangling"), "{w:?}");
    assert!(!d.join("would-be").exists());
    // A link to a directory is read as the link, not what it points to.
    std::os::unix::fs::symlink(&d, d.join("self")).unwrap();
    let got = c.read_link(p(&d.join("self"))).await.unwrap();
    assert_eq!(got.as_bytes(), d.as_os_str().as_bytes());
    // A file is no link; a missing path is not_found.
    std::fs::write(d.join("plain"), "x").unwrap();
    let w = remote(c.read_link(p(&d.join("plain"))).await.unwrap_err());
    assert_eq!(w.code, ErrorCode::Io, "{w:?}");
    let w = remote(c.read_link(p(&d.join("missing"))).await.unwrap_err());
    assert_eq!(w.code, ErrorCode::NotFound, "{w:?}");
    // A target longer than the kernel stores is limit_exceeded.
    let long = "a".repeat(4096);
    let w = remote(
        c.create_symlink(p(&d.join("long")), long.as_str())
            .await
            .unwrap_err(),
    );
    assert_eq!(w.code, ErrorCode::LimitExceeded, "{w:?}");
    c.close().await.unwrap();
}

// Issue 16 (`put -p`): a streamed write can give the committed file its
// mtime and atime (before the epoch too); without them the kernel's stand.
#[tokio::test]
async fn open_write_sets_the_times_it_is_given() {
    use std::os::unix::fs::MetadataExt;
    let c = local_client().await;
    let d = unique_tempdir("times");
    let meta = executor_client::fs::NewFile {
        mode: Some(0o640),
        mtime_ns: Some(1_000_000_000_123_456_789),
        atime_ns: Some(-86_400_000_000_001),
    };
    c.write_stream_with(p(&d.join("f")), &b"data"[..], meta)
        .await
        .unwrap();
    let m = std::fs::metadata(d.join("f")).unwrap();
    assert_eq!((m.mtime(), m.mtime_nsec()), (1_000_000_000, 123_456_789));
    assert_eq!((m.atime(), m.atime_nsec()), (-86_401, 999_999_999));
    assert_eq!(m.mode() & 0o7777, 0o640);
    // Only the mtime: the atime is left to the kernel.
    let only = executor_client::fs::NewFile {
        mtime_ns: Some(5_000_000_000),
        ..Default::default()
    };
    c.write_stream_with(p(&d.join("g")), &b"data"[..], only)
        .await
        .unwrap();
    let m = std::fs::metadata(d.join("g")).unwrap();
    assert_eq!(m.mtime(), 5);
    assert!(m.atime() > 1_700_000_000, "{}", m.atime());
    // None: the time of the write.
    c.write_stream(p(&d.join("h")), &b"data"[..], None)
        .await
        .unwrap();
    assert!(std::fs::metadata(d.join("h")).unwrap().mtime() > 1_700_000_000);
    c.close().await.unwrap();
}

/// `fs/passDescriptor` (docs/PROTOCOL.md §5) is never offered over stdio:
/// the stdio agent refuses an `initialize` declaring
/// `capabilities.descriptors` (plain, or asking for a detached session or a
/// resume, whose bytes it would relay), and without it the method is
/// `invalid_request` while `fs/readBlock` reads the same handle.
#[tokio::test]
async fn descriptors_are_not_offered_over_stdio() {
    use executor_protocol::methods as m;
    use executor_protocol::types::session::{ClientCapabilities, SessionParams};
    let asking = |session: Option<SessionParams>| {
        let mut p = init_params();
        p.session = session;
        p.capabilities = Some(ClientCapabilities {
            agent_requests: false,
            descriptors: true,
        });
        p
    };
    let detached = SessionParams {
        resume: None,
        detach_ttl_ms: Some(5_000),
    };
    let resuming = SessionParams {
        resume: Some(executor_protocol::types::session::ResumeParams {
            session_id: "0".repeat(32),
            token: "0".repeat(32),
        }),
        detach_ttl_ms: None,
    };
    for p in [asking(None), asking(Some(detached)), asking(Some(resuming))] {
        let mut a = RawAgent::spawn().await;
        let r = a.request(0, m::INITIALIZE, &p).await;
        assert_eq!(error_code(&r), Some("invalid_request"), "{r:?}");
        let msg = path(&r, "error.message").and_then(|v| v.as_str());
        assert!(
            msg.is_some_and(|m| m.contains("capabilities.descriptors")),
            "{r:?}"
        );
    }
    let d = unique_tempdir("no-descriptors");
    std::fs::write(d.join("f"), b"hello").unwrap();
    let mut a = RawAgent::initialized().await;
    let r = a
        .request(
            1,
            m::FS_OPEN,
            &OpenParams {
                path: p(&d.join("f")),
                sandbox: None,
                cwd: None,
            },
        )
        .await;
    let handle = path(&r, "result.handle").and_then(|v| v.as_u64()).unwrap();
    let r = a
        .request(
            2,
            m::FS_PASS_DESCRIPTOR,
            &PassDescriptorParams {
                handle,
                sandbox: None,
                cwd: None,
            },
        )
        .await;
    assert_eq!(error_code(&r), Some("invalid_request"), "{r:?}");
    let msg = path(&r, "error.message").and_then(|v| v.as_str());
    assert!(
        msg.is_some_and(|m| m.contains("takes no descriptors")),
        "{r:?}"
    );
    let r = a
        .request(
            3,
            m::FS_READ_BLOCK,
            &ReadBlockParams {
                handle,
                offset: 0,
                length: 5,
                sandbox: None,
                cwd: None,
            },
        )
        .await;
    assert_eq!(
        path(&r, "result.data").and_then(|v| v.as_slice()),
        Some(&b"hello"[..]),
        "{r:?}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}
