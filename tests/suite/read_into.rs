//! `Client::read_stream_into` against the real binary, locally and through
//! a real sshd: every edge of the block size and random content into a
//! regular file, a pipe, `/dev/null` and a PTY (the fallback) arrive byte
//! for byte; the data never enters the client (its thread reads only the
//! frame heads); two streams into two sinks with requests between them;
//! a pipe nobody reads stalls neither the connection nor another stream;
//! a sink closed mid-stream ends that stream only; a sink `splice(2)`
//! refuses (`O_APPEND`) and one not open for writing.

use executor_client::fs::BLOCK;
use executor_client::{Client, ClientOptions, Error};
use executor_tests::sshd::Sshd;
use executor_tests::*;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use executor_tests::wire_path as p;

/// Bound on a whole stream: a hang fails instead of waiting for ever (no
/// speed is asserted).
const HANG: Duration = Duration::from_secs(120);

fn random(len: usize, seed: u64) -> Vec<u8> {
    Rng(seed | 1).bytes(len)
}

/// The sizes at every edge of the block size, and several MiB.
fn sizes() -> [usize; 6] {
    let b = BLOCK as usize;
    [0, 1, b - 1, b, b + 1, 5 * b + 3]
}

/// Files of every size of [`sizes`], random content each.
fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    sizes()
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let data = random(len, 0x5eed + i as u64);
            let f = dir.join(format!("f{len}"));
            std::fs::write(&f, &data).unwrap();
            (f, data)
        })
        .collect()
}

/// A pipe nobody else holds: close-on-exec, so that no child another test
/// spawns meanwhile (the suite runs its tests in parallel, in this one
/// process) keeps either end open (a reader's end never seen, a closed
/// read end that still has a reader).
fn own_pipe() -> (OwnedFd, OwnedFd) {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap()
}

/// A pipe whose read end a thread drains (after `wait` says go, when
/// given); `join` gives what it read.
struct Drained {
    w: Option<OwnedFd>,
    reader: std::thread::JoinHandle<Vec<u8>>,
}

impl Drained {
    fn new(wait: Option<std::sync::mpsc::Receiver<()>>) -> Drained {
        let (r, w) = own_pipe();
        let reader = std::thread::spawn(move || {
            if let Some(go) = wait {
                let _ = go.recv();
            }
            let mut got = Vec::new();
            std::fs::File::from(r).read_to_end(&mut got).unwrap();
            got
        });
        Drained { w: Some(w), reader }
    }

    fn join(mut self) -> Vec<u8> {
        self.w.take();
        self.reader.join().unwrap()
    }
}

/// Bytes this thread has read with read(2) and the like (splice(2)
/// counts none).
fn thread_rchar() -> u64 {
    std::fs::read_to_string("/proc/thread-self/io")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

async fn into(c: &Client, f: &Path, sink: impl AsFd) -> Result<u64, Error> {
    tokio::time::timeout(HANG, c.read_stream_into(p(f), sink))
        .await
        .unwrap_or_else(|_| panic!("read_stream_into of {} hung for {HANG:?}", f.display()))
}

/// What is wrong with stream `name`'s result (`None`: `want.len()` bytes
/// reported).
fn wrong_result(name: &str, r: &Result<u64, Error>, want: &[u8]) -> Option<String> {
    match r {
        Ok(n) if *n == want.len() as u64 => None,
        Ok(n) => Some(format!(
            "stream {name}: {n} bytes reported, {} in the file",
            want.len()
        )),
        Err(e) => Some(format!(
            "stream {name} ({} bytes) failed: {e} ({e:?})",
            want.len()
        )),
    }
}

/// What is wrong with what stream `name`'s sink received (`None`: `want`
/// exactly): the lengths and the first offset where they differ.
fn wrong_bytes(name: &str, got: &[u8], want: &[u8]) -> Option<String> {
    if got == want {
        return None;
    }
    let at = got
        .iter()
        .zip(want)
        .position(|(g, w)| g != w)
        .unwrap_or(got.len().min(want.len()));
    Some(format!(
        "stream {name}: the sink received {} bytes, {} sent; the first difference at offset {at} (block {} + {})",
        got.len(),
        want.len(),
        at / BLOCK as usize,
        at % BLOCK as usize
    ))
}

/// Every file of [`files`] into a file, a pipe, /dev/null and a PTY.
async fn every_sink(c: &Client, dir: &Path) {
    for (f, data) in files(dir) {
        let len = data.len();
        let out = dir.join("out");
        let file = std::fs::File::create(&out).unwrap();
        assert_eq!(into(c, &f, &file).await.unwrap(), len as u64);
        drop(file);
        let got = std::fs::read(&out).unwrap();
        assert_eq!(wrong_bytes(&format!("file, len {len}"), &got, &data), None);

        let pipe = Drained::new(None);
        assert_eq!(
            into(c, &f, pipe.w.as_ref().unwrap()).await.unwrap(),
            len as u64
        );
        assert_eq!(
            wrong_bytes(&format!("pipe, len {len}"), &pipe.join(), &data),
            None
        );

        let null = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .unwrap();
        assert_eq!(into(c, &f, &null).await.unwrap(), len as u64);

        let (slave, reader) = raw_pty_reader(len);
        assert_eq!(into(c, &f, &slave).await.unwrap(), len as u64);
        let got = reader.join().unwrap().unwrap();
        assert_eq!(wrong_bytes(&format!("pty, len {len}"), &got, &data), None);
    }
}

#[tokio::test]
async fn every_size_arrives_whole_in_a_file_a_pipe_dev_null_and_a_pty() {
    let c = local_client().await;
    let d = unique_tempdir("into-sizes");
    every_sink(&c, &d).await;
    c.close().await.unwrap();
    std::fs::remove_dir_all(&d).unwrap();
}

#[tokio::test]
async fn every_size_arrives_whole_through_a_real_sshd() {
    let sshd = Sshd::start("", "");
    let c = Client::connect_target(
        &executor_client::Target::ssh_with("127.0.0.1", sshd.options(&executor_bin())),
        ClientOptions::default(),
    )
    .await
    .unwrap();
    let d = unique_tempdir("into-ssh");
    every_sink(&c, &d).await;
    two_streams_and_requests_between(&c, &d).await;
    c.close().await.unwrap();
    std::fs::remove_dir_all(&d).unwrap();
}

#[tokio::test]
async fn the_data_is_spliced_past_the_client_only_heads_are_read() {
    // The test's runtime has one thread: the connection reader's reads
    // are this thread's.
    let c = local_client().await;
    let d = unique_tempdir("into-splice");
    let len = 32 * BLOCK as usize;
    let f = d.join("big");
    std::fs::write(&f, random(len, 7)).unwrap();
    let null = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/null")
        .unwrap();
    let out = d.join("out");
    let file = std::fs::File::create(&out).unwrap();
    for sink in [null.as_fd(), file.as_fd()] {
        let before = thread_rchar();
        assert_eq!(into(&c, &f, sink).await.unwrap(), len as u64);
        let read = thread_rchar() - before;
        assert!(
            read < len as u64 / 16,
            "the client read {read} bytes of a {len}-byte stream itself"
        );
    }
    assert_eq!(std::fs::metadata(&out).unwrap().len(), len as u64);
    // The positive control: `read_stream` takes every byte into memory.
    use futures_util::StreamExt;
    let before = thread_rchar();
    let (_, s) = c.read_stream(p(&f)).await.unwrap();
    let n: usize = s
        .map(|b| b.unwrap().len())
        .fold(0, |a, n| async move { a + n })
        .await;
    assert_eq!(n, len);
    assert!(thread_rchar() - before >= len as u64);
    c.close().await.unwrap();
    std::fs::remove_dir_all(&d).unwrap();
}

/// Two streams at once into two pipes, requests answered between.
async fn two_streams_and_requests_between(c: &Client, d: &Path) {
    let (a, b) = (d.join("two-a"), d.join("two-b"));
    let (da, db) = (
        random(3 * BLOCK as usize + 17, 1),
        random(4 * BLOCK as usize, 2),
    );
    std::fs::write(&a, &da).unwrap();
    std::fs::write(&b, &db).unwrap();
    let (pa, pb) = (Drained::new(None), Drained::new(None));
    let requests = async {
        let mut wrong = Vec::new();
        for i in 0..20 {
            match c.stat(p(&a)).await {
                Ok(st) if st.size == da.len() as u64 => {}
                Ok(st) => wrong.push(format!("stat {i}: size {}", st.size)),
                Err(e) => wrong.push(format!("stat {i}: {e} ({e:?})")),
            }
        }
        wrong
    };
    let (ra, rb, mut wrong) = tokio::join!(
        into(c, &a, pa.w.as_ref().unwrap()),
        into(c, &b, pb.w.as_ref().unwrap()),
        requests
    );
    wrong.extend(wrong_result("a", &ra, &da));
    wrong.extend(wrong_result("b", &rb, &db));
    // Named before the sinks are joined: a failed stream's pipe may never
    // see its end.
    assert!(wrong.is_empty(), "{}", wrong.join("; "));
    let (ga, gb) = (pa.join(), pb.join());
    wrong.extend(wrong_bytes("a", &ga, &da));
    wrong.extend(wrong_bytes("b", &gb, &db));
    assert!(wrong.is_empty(), "{}", wrong.join("; "));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_streams_into_two_sinks_with_requests_between() {
    let c = local_client().await;
    let d = unique_tempdir("into-two");
    two_streams_and_requests_between(&c, &d).await;
    c.close().await.unwrap();
    std::fs::remove_dir_all(&d).unwrap();
}

#[tokio::test]
async fn a_pipe_nobody_reads_stalls_neither_another_stream_nor_requests() {
    let c = local_client().await;
    let d = unique_tempdir("into-stall");
    let (slow, other) = (d.join("slow"), d.join("other"));
    let ds = random(12 * BLOCK as usize + 5, 3);
    std::fs::write(&slow, &ds).unwrap();
    // More than a window: it only ends if its credit keeps coming back.
    std::fs::write(&other, random(24 * BLOCK as usize, 4)).unwrap();
    let (go, wait) = std::sync::mpsc::channel();
    let pipe = Drained::new(Some(wait));
    let null = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/null")
        .unwrap();
    let stalled = into(&c, &slow, pipe.w.as_ref().unwrap());
    let meanwhile = async {
        // The slow stream's pipe fills (64 KiB) and stays full meanwhile.
        let n = into(&c, &other, &null).await.unwrap();
        let info = c
            .call(&executor_protocol::types::session::EnvironmentInfoParams {})
            .await
            .unwrap();
        go.send(()).unwrap();
        (n, info.path_separator)
    };
    let (r, (n, sep)) = tokio::join!(stalled, meanwhile);
    assert_eq!((n, sep.as_str()), (24 * BLOCK, "/"));
    assert_eq!(r.unwrap(), ds.len() as u64);
    assert!(pipe.join() == ds);
    c.close().await.unwrap();
    std::fs::remove_dir_all(&d).unwrap();
}

#[tokio::test]
async fn a_sink_closed_mid_stream_ends_that_stream_and_the_connection_survives() {
    let c = local_client().await;
    let d = unique_tempdir("into-epipe");
    let f = d.join("f");
    std::fs::write(&f, random(16 * BLOCK as usize, 5)).unwrap();
    let (r, w) = own_pipe();
    let reader = std::thread::spawn(move || {
        let mut r = std::fs::File::from(r);
        let mut some = vec![0u8; 100_000];
        r.read_exact(&mut some).unwrap();
        // The read end closes here.
    });
    let e = into(&c, &f, &w).await.unwrap_err();
    reader.join().unwrap();
    match &e {
        Error::Sink(io) => assert_eq!(io.kind(), std::io::ErrorKind::BrokenPipe, "{e}"),
        _ => panic!("not a sink error: {e:?}"),
    }
    // The same connection reads on, and answers requests.
    let small = d.join("small");
    let data = random(BLOCK as usize + 1, 6);
    std::fs::write(&small, &data).unwrap();
    let pipe = Drained::new(None);
    assert_eq!(
        into(&c, &small, pipe.w.as_ref().unwrap()).await.unwrap(),
        data.len() as u64
    );
    assert!(pipe.join() == data);
    assert_eq!(
        c.call(&executor_protocol::types::session::EnvironmentInfoParams {})
            .await
            .unwrap()
            .path_separator,
        "/"
    );
    c.close().await.unwrap();
    std::fs::remove_dir_all(&d).unwrap();
}

#[tokio::test]
async fn an_append_only_file_is_written_without_splice_and_a_read_only_fd_is_refused() {
    let c = local_client().await;
    let d = unique_tempdir("into-append");
    let f = d.join("f");
    let data = random(3 * BLOCK as usize + 9, 8);
    std::fs::write(&f, &data).unwrap();
    let out = d.join("out");
    std::fs::write(&out, b"head:").unwrap();
    let append = std::fs::OpenOptions::new().append(true).open(&out).unwrap();
    assert_eq!(into(&c, &f, &append).await.unwrap(), data.len() as u64);
    let mut want = b"head:".to_vec();
    want.extend_from_slice(&data);
    assert!(std::fs::read(&out).unwrap() == want);
    // Not open for writing: a sink error before anything is asked.
    let ro = std::fs::File::open(&f).unwrap();
    match into(&c, &f, &ro).await {
        Err(Error::Sink(e)) => assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput),
        other => panic!("{other:?}"),
    }
    // A missing file is the agent's error, named.
    let gone = d.join("missing");
    let null = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/null")
        .unwrap();
    let e = into(&c, &gone, &null).await.unwrap_err();
    assert_eq!(e.code(), Some(executor_client::ErrorCode::NotFound), "{e}");
    c.close().await.unwrap();
    std::fs::remove_dir_all(&d).unwrap();
}
