//! `fs/readStream` (docs/PROTOCOL.md §5) against the real binary: whole
//! files at every edge of the block size (over a pipe, where blocks are
//! spliced, and over a socket), files cut while they stream, a filesystem
//! that cannot splice, the credit window observed from the wire, cancel, a
//! stream of a handle's range, and every bound and bad value a typed error
//! naming it. (The sandbox cases are in sandbox.rs beside fs/readFile's,
//! the dropped connection in session.rs.)

use executor_client::fs::BLOCK;
use executor_client::ErrorCode;
use executor_protocol::methods as m;
use executor_protocol::types::fs::*;
use executor_tests::*;
use futures_util::StreamExt;
use rmpv::Value;
use std::path::Path;

use executor_tests::wire_path as p;

fn sha256(data: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, data)
        .as_ref()
        .to_vec()
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i % 251) as u8 ^ (i >> 16) as u8)
        .collect()
}

fn params(path: &Path, block: u64, credit: u64) -> ReadStreamParams {
    ReadStreamParams {
        path: Some(p(path)),
        handle: None,
        offset: 0,
        length: None,
        block_bytes: block,
        credit_bytes: credit,
        sandbox: None,
        cwd: None,
    }
}

/// `len` random bytes.
fn random(rng: &mut Rng, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len.div_ceil(8))
        .flat_map(|_| rng.next_u64().to_le_bytes())
        .collect();
    v.truncate(len);
    v
}

/// Files of random bytes at every edge of the block size read whole through
/// `c`: byte for byte, every block but the last whole.
async fn files_at_every_edge_arrive_whole(c: &executor_client::Client, tag: &str) {
    let d = unique_tempdir(tag);
    let b = BLOCK as usize;
    let mut rng = Rng(0x0dd_b10c);
    for len in [0, 1, b - 1, b, b + 1, 5 * b + 3, 9 * b + 4097] {
        let data = random(&mut rng, len);
        let f = d.join(format!("f{len}"));
        std::fs::write(&f, &data).unwrap();
        let (size, s) = c.read_stream(p(&f)).await.unwrap();
        assert_eq!(size, len as u64);
        let blocks: Vec<bytes::Bytes> = s.map(|b| b.unwrap()).collect().await;
        assert!(blocks.iter().all(|x| !x.is_empty() && x.len() <= b));
        // Every block but the last is whole.
        assert!(blocks.iter().rev().skip(1).all(|x| x.len() == b));
        assert_eq!(blocks.len(), len.div_ceil(b), "len {len}");
        let got: Vec<u8> = blocks.concat();
        assert_eq!(got.len(), len);
        assert_eq!(sha256(&got), sha256(&data), "len {len}");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[tokio::test]
async fn whole_files_at_every_edge_of_the_block_size_arrive_whole() {
    let c = local_client().await;
    files_at_every_edge_arrive_whole(&c, "rs-sizes").await;
    c.close().await.unwrap();
}

/// The agent's stdin and stdout one Unix socket (as some transports give
/// it): blocks are spliced into a socket, and arrive whole.
#[tokio::test]
async fn whole_files_arrive_whole_over_a_socket() {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let theirs = std::os::fd::OwnedFd::from(theirs);
    let mut cmd = tokio::process::Command::new(executor_bin());
    cmd.stdin(std::process::Stdio::from(theirs.try_clone().unwrap()))
        .stdout(std::process::Stdio::from(theirs))
        .kill_on_drop(true);
    let child = cmd.spawn().unwrap();
    ours.set_nonblocking(true).unwrap();
    let (r, w) = tokio::net::UnixStream::from_std(ours).unwrap().into_split();
    let c = executor_client::Client::connect(r, w, Default::default())
        .await
        .unwrap();
    files_at_every_edge_arrive_whole(&c, "rs-socket").await;
    c.close().await.unwrap();
    drop(child);
}

/// Read `f` whole with `read_stream`, calling `cut` once after `after`
/// blocks arrived: what arrived, and the stream's error if it ended with one.
async fn read_cutting(
    c: &executor_client::Client,
    f: &Path,
    after: usize,
    cut: impl FnOnce(),
) -> (Vec<u8>, Option<executor_client::Error>) {
    let (_, s) = c.read_stream(p(f)).await.unwrap();
    let mut s = Box::pin(s);
    let (mut got, mut blocks, mut cut) = (Vec::new(), 0, Some(cut));
    if after == 0 {
        (cut.take().unwrap())();
    }
    while let Some(b) = s.next().await {
        match b {
            Ok(b) => {
                assert!(!b.is_empty());
                got.extend_from_slice(&b);
                blocks += 1;
                if blocks == after {
                    (cut.take().unwrap())();
                }
            }
            Err(e) => return (got, Some(e)),
        }
    }
    (got, None)
}

/// What a stream of a file cut to `kept` bytes while it streamed may have
/// delivered: at least the bytes kept, exactly; beyond them, what the file
/// held (a block pinned before the cut) or zeros (the kernel clears the
/// page the cut falls in); nothing past the original end.
fn check_cut(got: &[u8], data: &[u8], kept: usize, failed: Option<executor_client::Error>) {
    if let Some(e) = failed {
        // A read may fail as the file shrinks; the error is the read's.
        assert_eq!(e.code(), Some(ErrorCode::Io), "{e}");
        assert!(got.len() <= data.len());
    } else {
        assert!(got.len() >= kept, "{} < {kept}", got.len());
        assert!(got.len() <= data.len());
    }
    let below = got.len().min(kept);
    assert!(
        got[..below] == data[..below],
        "the bytes kept arrive as they were"
    );
    let beyond = got.iter().zip(data).skip(kept);
    assert!(
        beyond.clone().all(|(g, d)| g == d || *g == 0),
        "a byte beyond the cut is neither the file's nor zero"
    );
}

/// A file cut shorter while it streams (at a random point, after a random
/// number of blocks; then shrunk step by step by another thread) never
/// breaks the framing: the stream ends, its bytes are the file's, and the
/// same connection answers the next request.
#[tokio::test]
async fn a_file_cut_while_it_streams_never_breaks_the_connection() {
    const LEN: usize = 12 << 20;
    let c = local_client().await;
    let d = unique_tempdir("rs-cut");
    let mut rng = Rng(0x5eed_0c07);
    let data = random(&mut rng, LEN);
    for round in 0..16 {
        let f = d.join(format!("f{round}"));
        std::fs::write(&f, &data).unwrap();
        let kept = if round % 2 == 0 {
            // One cut, after 0..4 blocks arrived.
            let kept = rng.below(LEN);
            let cut_at = f.clone();
            let (got, failed) = read_cutting(&c, &f, rng.below(4), move || {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&cut_at)
                    .unwrap()
                    .set_len(kept as u64)
                    .unwrap();
            })
            .await;
            check_cut(&got, &data, kept, failed);
            kept
        } else {
            // Shrunk in steps by a thread while the stream runs.
            let step = (64 << 10) + rng.below(1 << 20);
            let file = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
            let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let stop = done.clone();
            let shrinking = std::thread::spawn(move || {
                let mut len = LEN;
                while len > step && !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    len -= step;
                    file.set_len(len as u64).unwrap();
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                len
            });
            let (got, failed) = read_cutting(&c, &f, 0, || {}).await;
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            let kept = shrinking.join().unwrap();
            check_cut(&got, &data, kept, failed);
            kept
        };
        // The connection lives on: the next request is answered.
        let st: StatResult = c
            .call(&StatParams {
                path: p(&f),
                follow_symlinks: true,
                sandbox: None,
                cwd: None,
            })
            .await
            .unwrap();
        assert_eq!(st.size, kept as u64, "round {round}");
    }
    // And a whole file still arrives whole on it.
    let f = d.join("whole");
    std::fs::write(&f, &data).unwrap();
    let (got, failed) = read_cutting(&c, &f, usize::MAX, || {}).await;
    assert!(failed.is_none());
    assert!(got == data);
    std::fs::remove_dir_all(&d).unwrap();
    c.close().await.unwrap();
}

/// procfs files cannot be spliced (`EINVAL`): such a file streams through
/// `pread` instead, whole.
#[tokio::test]
async fn a_file_whose_filesystem_cannot_splice_streams_whole() {
    // Several blocks of a file splice refuses; the same bytes for every
    // reader with the same credentials.
    let f = Path::new("/proc/kallsyms");
    let Ok(want) = std::fs::read(f) else {
        return prerequisite_missing("/proc/kallsyms");
    };
    let probe = std::fs::File::open(f).unwrap();
    let (r, w) = nix::unistd::pipe().unwrap();
    use std::os::fd::AsFd;
    let refused = executor_sys::splice_file_to_pipe(probe.as_fd(), 0, w.as_fd(), 4096);
    assert_eq!(
        refused.map_err(|e| e.raw_os_error()),
        Err(Some(libc::EINVAL)),
        "positive control: procfs refuses splice"
    );
    drop((r, w));
    assert!(want.len() > BLOCK as usize, "{} bytes", want.len());
    let c = local_client().await;
    let (got, failed) = read_cutting(&c, f, usize::MAX, || {}).await;
    assert!(failed.is_none(), "{failed:?}");
    assert!(got == want, "{} bytes, {} wanted", got.len(), want.len());
    // A file of a filesystem that splices, on the same connection, still
    // arrives whole.
    files_at_every_edge_arrive_whole(&c, "rs-after-proc").await;
    c.close().await.unwrap();
}

/// What arrived, as the raw wire shows it.
#[derive(Debug, Default)]
struct Seen {
    data: Vec<(u64, usize)>,
    end: Option<Value>,
    answers: Vec<(u64, Value)>,
}

impl Seen {
    /// Read frames until `done` holds.
    async fn until(&mut self, a: &mut RawAgent, done: impl Fn(&Seen) -> bool) {
        while !done(self) {
            let v = a.recv().await.expect("agent closed");
            match get(&v, "method").and_then(|x| x.as_str()) {
                Some(m::FS_READ_STREAM_DATA) => {
                    let off = path(&v, "params.offset").and_then(|x| x.as_u64()).unwrap();
                    let len = match path(&v, "params.data") {
                        Some(Value::Binary(b)) => b.len(),
                        other => panic!("data is not bin: {other:?}"),
                    };
                    self.data.push((off, len));
                }
                Some(m::FS_READ_STREAM_END) => self.end = Some(v),
                Some(other) => panic!("unexpected notification {other}"),
                None => {
                    let id = get(&v, "id").and_then(|x| x.as_u64()).unwrap();
                    self.answers.push((id, v));
                }
            }
        }
    }

    fn answer(&self, id: u64) -> Option<&Value> {
        self.answers.iter().find(|(i, _)| *i == id).map(|(_, v)| v)
    }
}

#[tokio::test]
async fn the_agent_never_has_more_than_the_credit_outstanding() {
    let mut a = RawAgent::initialized().await;
    let d = unique_tempdir("rs-credit");
    let f = d.join("f");
    std::fs::write(&f, pattern(10 * 4096)).unwrap();
    a.send_request(1, m::FS_READ_STREAM, &params(&f, 4096, 8192))
        .await;
    let mut seen = Seen::default();
    // Two blocks fit the window of 8192; no credit is returned.
    seen.until(&mut a, |s| s.answer(1).is_some() && s.data.len() == 2)
        .await;
    let head = seen.answer(1).unwrap();
    let id = path(head, "result.stream_id")
        .and_then(|x| x.as_u64())
        .unwrap();
    assert_eq!(
        path(head, "result.size").and_then(|x| x.as_u64()),
        Some(40960)
    );
    assert_eq!(seen.data, vec![(0, 4096), (4096, 4096)]);
    // One block back: exactly one more comes.
    let credit = |bytes| ReadCreditParams {
        stream_id: id,
        bytes,
        sandbox: None,
        cwd: None,
    };
    a.send_request(2, m::FS_READ_CREDIT, &credit(4096)).await;
    seen.until(&mut a, |s| s.answer(2).is_some() && s.data.len() == 3)
        .await;
    assert!(get(seen.answer(2).unwrap(), "result").is_some());
    // Returning more than is outstanding (8192) is refused, and widens
    // nothing.
    a.send_request(3, m::FS_READ_CREDIT, &credit(8193)).await;
    seen.until(&mut a, |s| s.answer(3).is_some()).await;
    let e = seen.answer(3).unwrap();
    assert_eq!(error_code(e), Some("limit_exceeded"), "{e:?}");
    assert_eq!(
        path(e, "error.data.limit").and_then(|x| x.as_str()),
        Some("credit_bytes")
    );
    assert_eq!(
        path(e, "error.data.max").and_then(|x| x.as_u64()),
        Some(8192)
    );
    assert_eq!(
        path(e, "error.data.outstanding").and_then(|x| x.as_u64()),
        Some(8192)
    );
    // Cancel: the end says so, and nothing beyond the window was sent.
    a.send_request(
        4,
        m::FS_READ_CANCEL,
        &ReadCancelParams {
            stream_id: id,
            sandbox: None,
            cwd: None,
        },
    )
    .await;
    seen.until(&mut a, |s| s.answer(4).is_some() && s.end.is_some())
        .await;
    let end = seen.end.clone().unwrap();
    assert_eq!(
        path(&end, "params.total").and_then(|x| x.as_u64()),
        Some(3 * 4096)
    );
    assert_eq!(
        path(&end, "params.error.code").and_then(|x| x.as_str()),
        Some("cancelled")
    );
    assert_eq!(seen.data, vec![(0, 4096), (4096, 4096), (8192, 4096)]);
    // The stream is gone: its id is named.
    a.send_request(5, m::FS_READ_CREDIT, &credit(1)).await;
    seen.until(&mut a, |s| s.answer(5).is_some()).await;
    let e = seen.answer(5).unwrap();
    assert_eq!(error_code(e), Some("unknown_stream"), "{e:?}");
    assert_eq!(
        path(e, "error.data.stream_id").and_then(|x| x.as_u64()),
        Some(id)
    );
    // The connection lives on.
    let r = a
        .request(
            6,
            m::FS_STAT,
            &StatParams {
                path: p(&f),
                follow_symlinks: true,
                sandbox: None,
                cwd: None,
            },
        )
        .await;
    assert!(get(&r, "result").is_some(), "{r:?}");
    a.close_and_wait().await;
}

#[tokio::test]
async fn a_handles_range_streams_and_the_handle_stays_open() {
    let c = local_client().await;
    let d = unique_tempdir("rs-handle");
    let f = d.join("f");
    let data = pattern(100_000);
    std::fs::write(&f, &data).unwrap();
    let h: OpenResult = c
        .call(&OpenParams {
            path: p(&f),
            sandbox: None,
            cwd: None,
        })
        .await
        .unwrap();
    let mut sub = c.subscribe(&[m::FS_READ_STREAM_DATA, m::FS_READ_STREAM_END]);
    let head: ReadStreamResult = c
        .call(&ReadStreamParams {
            path: None,
            handle: Some(h.handle),
            offset: 1000,
            length: Some(50_000),
            block_bytes: 7000,
            credit_bytes: 70_000,
            sandbox: None,
            cwd: None,
        })
        .await
        .unwrap();
    assert_eq!(head.size, 100_000);
    let mut got = Vec::new();
    let end = loop {
        let n = sub.recv().await.unwrap();
        if n.method == m::FS_READ_STREAM_END {
            break n.decode::<ReadStreamEnd>().unwrap();
        }
        let b: ReadStreamData = n.decode().unwrap();
        assert_eq!(b.offset, 1000 + got.len() as u64);
        got.extend_from_slice(&b.data);
    };
    assert_eq!(
        (end.stream_id, end.total, end.error),
        (head.stream_id, 50_000, None)
    );
    assert_eq!(got, &data[1000..51_000]);
    // The handle was not closed by the stream.
    let r: ReadBlockResult = c
        .call(&ReadBlockParams {
            handle: h.handle,
            offset: 99_999,
            length: 10,
            sandbox: None,
            cwd: None,
        })
        .await
        .unwrap();
    assert_eq!(&r.data[..], &data[99_999..]);
    c.close().await.unwrap();
}

/// Pipe descriptors `pid` holds.
fn pipe_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().starts_with("pipe:"))
        })
        .count()
}

fn data_str<'a>(e: &'a executor_protocol::WireError, key: &str) -> Option<&'a str> {
    e.data_get(key).and_then(|v| v.as_str())
}

#[tokio::test]
async fn bounds_are_limit_exceeded_and_bad_values_are_named() {
    let c = client_with_config("[limits]\nmax_read_streams = 2\n").await;
    let l = c.initialize_result().limits.clone();
    assert_eq!(l.max_read_streams, 2);
    let d = unique_tempdir("rs-limits");
    let f = d.join("f");
    std::fs::write(&f, pattern(1 << 20)).unwrap();
    let refuse = |params: ReadStreamParams| {
        let c = c.clone();
        async move { remote(c.call(&params).await.unwrap_err()) }
    };
    let e = refuse(params(&f, l.max_block_bytes + 1, l.max_read_credit_bytes)).await;
    assert_eq!(e.code, ErrorCode::LimitExceeded);
    assert_eq!(data_str(&e, "limit"), Some("max_block_bytes"));
    assert_eq!(
        e.data_get("requested").and_then(|v| v.as_u64()),
        Some(l.max_block_bytes + 1)
    );
    let e = refuse(params(&f, 4096, l.max_read_credit_bytes + 1)).await;
    assert_eq!(e.code, ErrorCode::LimitExceeded);
    assert_eq!(data_str(&e, "limit"), Some("max_read_credit_bytes"));
    let e = refuse(params(&f, 0, 4096)).await;
    assert_eq!(
        (e.code, data_str(&e, "field")),
        (ErrorCode::InvalidParams, Some("block_bytes"))
    );
    let e = refuse(params(&f, 4096, 4095)).await;
    assert_eq!(
        (e.code, data_str(&e, "field")),
        (ErrorCode::InvalidParams, Some("credit_bytes"))
    );
    assert!(
        e.message.contains("4095") && e.message.contains("4096"),
        "{}",
        e.message
    );
    let mut neither = params(&f, 4096, 4096);
    neither.path = None;
    let e = refuse(neither.clone()).await;
    assert_eq!(
        (e.code, data_str(&e, "field")),
        (ErrorCode::InvalidParams, Some("path"))
    );
    let mut both = params(&f, 4096, 4096);
    both.handle = Some(1);
    let e = refuse(both).await;
    assert_eq!(
        (e.code, data_str(&e, "field")),
        (ErrorCode::InvalidParams, Some("handle"))
    );
    neither.handle = Some(77);
    let e = refuse(neither).await;
    assert_eq!(e.code, ErrorCode::UnknownHandle);
    let mut relative = params(&f, 4096, 4096);
    relative.path = Some("relative/f".into());
    let e = refuse(relative).await;
    assert_eq!(
        (e.code, data_str(&e, "field")),
        (ErrorCode::InvalidParams, Some("path"))
    );
    let e = refuse(params(&d, 4096, 4096)).await;
    assert_eq!(e.code, ErrorCode::IsADirectory);
    let mut past = params(&f, 4096, 4096);
    past.offset = u64::MAX;
    past.length = Some(2);
    let e = refuse(past).await;
    assert_eq!(
        (e.code, data_str(&e, "field")),
        (ErrorCode::InvalidParams, Some("length"))
    );
    for method in [m::FS_READ_CREDIT, m::FS_READ_CANCEL] {
        let e = remote(
            c.request::<_, Value>(
                method,
                &ReadCreditParams {
                    stream_id: 4242,
                    bytes: 1,
                    sandbox: None,
                    cwd: None,
                },
            )
            .await
            .unwrap_err(),
        );
        assert_eq!(e.code, ErrorCode::UnknownStream, "{method}");
        assert_eq!(e.data_get("stream_id").and_then(|v| v.as_u64()), Some(4242));
    }
    // Two streams that stall (no credit back) hold both slots.
    let mut held = Vec::new();
    for _ in 0..2 {
        let r: ReadStreamResult = c.call(&params(&f, 4096, 4096)).await.unwrap();
        held.push(r.stream_id);
    }
    let e = refuse(params(&f, 4096, 4096)).await;
    assert_eq!(e.code, ErrorCode::LimitExceeded);
    assert_eq!(data_str(&e, "limit"), Some("max_read_streams"));
    assert_eq!(e.data_get("max").and_then(|v| v.as_u64()), Some(2));
    // A cancelled one frees its slot once it has ended.
    let mut sub = c.subscribe(&[m::FS_READ_STREAM_END]);
    let _: executor_protocol::types::Empty = c
        .call(&ReadCancelParams {
            stream_id: held[0],
            sandbox: None,
            cwd: None,
        })
        .await
        .unwrap();
    let end: ReadStreamEnd = sub.recv().await.unwrap().decode().unwrap();
    assert_eq!(end.stream_id, held[0]);
    c.call(&params(&f, 4096, 4096)).await.unwrap();
}

/// All of a session's read streams share one read-ahead: 32 streams with
/// whole-file windows on a connection nobody reads hold about one window
/// (16 MiB) in the agent, not every window (128 MiB); read, everything
/// arrives.
#[tokio::test]
async fn streams_on_a_connection_nobody_reads_share_one_read_ahead() {
    const STREAMS: u64 = 32;
    const LEN: usize = 4 << 20;
    let mut a = RawAgent::initialized().await;
    let d = unique_tempdir("rs-ahead");
    let f = d.join("f");
    std::fs::write(&f, pattern(LEN)).unwrap();
    let pid = a.child.id().unwrap();
    let before = status_kib(pid, "VmRSS");
    let pipes_before = pipe_fds(pid);
    for id in 1..=STREAMS {
        // A block more than the file: the short read that ends the stream
        // needs room in the window too.
        a.send_request(
            id,
            m::FS_READ_STREAM,
            &params(&f, 1 << 20, (LEN + (1 << 20)) as u64),
        )
        .await;
    }
    // Nothing is read from the agent while it works through the requests.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let grown_mib = status_kib(pid, "VmHWM").saturating_sub(before) / 1024;
    assert!(
        grown_mib < 48,
        "the agent grew by {grown_mib} MiB holding blocks nobody read"
    );
    // The blocks waiting are pinned in pipes (two descriptors each), no
    // more than the session's pipes allow.
    let pipes = pipe_fds(pid) - pipes_before;
    assert!(
        pipes >= 2,
        "positive control: blocks wait in pipes ({pipes} fds)"
    );
    assert!(pipes <= 2 * 32, "{pipes} pipe descriptors");
    // Control: every byte of every stream arrives once read.
    let mut seen = Seen::default();
    let mut ends = 0;
    while ends < STREAMS {
        let v = a.recv().await.expect("agent closed");
        match get(&v, "method").and_then(|x| x.as_str()) {
            Some(m::FS_READ_STREAM_DATA) => match path(&v, "params.data") {
                Some(Value::Binary(b)) => seen.data.push((0, b.len())),
                other => panic!("data is not bin: {other:?}"),
            },
            Some(m::FS_READ_STREAM_END) => ends += 1,
            _ => {}
        }
    }
    let total: usize = seen.data.iter().map(|(_, n)| n).sum();
    assert_eq!(total as u64, STREAMS * LEN as u64);
    std::fs::remove_dir_all(&d).unwrap();
}
