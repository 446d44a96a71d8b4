//! Helpers shared by the integration tests: find and spawn the real
//! `executor` binary, and talk to it in raw frames.

pub mod cli;
pub mod codex;
pub mod codex_diff;
pub mod http;
pub mod sshd;

use bytes::BytesMut;
use executor_protocol::codec::FrameDecoder;
use executor_protocol::message::{encode_request, Incoming};
use executor_protocol::types::session::{ClientInfo, InitializeParams};
use executor_protocol::PREAMBLE;
use rmpv::Value;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// Generous bound for anything a test waits on.
pub const WAIT: Duration = Duration::from_secs(20);

/// The `executor` binary built by this workspace.
pub fn executor_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("EXECUTOR_BIN") {
        return p.into();
    }
    // tests run from target/<profile>/deps/<test-binary>
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let bin = dir.join("executor");
    assert!(
        bin.is_file(),
        "no executor binary at {} (cargo build first)",
        bin.display()
    );
    bin
}

/// A copy of the `executor` binary that any user can execute (the build
/// tree may sit under a home directory other users cannot traverse): for
/// tests that run the agent as an unprivileged user.
pub fn executor_bin_for_any_user() -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    static COPY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    COPY.get_or_init(|| {
        sweep_dead_test_dirs();
        let dir = std::env::temp_dir().join(format!("executor-tests-bin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let bin = dir.join("executor");
        let tmp = dir.join("executor.tmp");
        // Copied by a `cp` process, not by this one: a child another test
        // forks meanwhile would inherit a descriptor this process had open
        // for writing the copy, and until that child execs, executing the
        // copy fails with ETXTBSY ("Text file busy"). `cp` has exited, its
        // descriptors with it, before anything runs the copy.
        let st = std::process::Command::new("cp")
            .arg(executor_bin())
            .arg(&tmp)
            .status()
            .expect("cp");
        assert!(st.success(), "copying the executor binary: {st}");
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::rename(&tmp, &bin).expect("rename");
        bin
    })
    .clone()
}

/// The real agent, spoken to in raw frames.
#[derive(Debug)]
pub struct RawAgent {
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    pub stdout: ChildStdout,
    buf: BytesMut,
    decoder: FrameDecoder,
}

impl RawAgent {
    /// Spawn the agent and check its preamble.
    pub async fn spawn() -> RawAgent {
        RawAgent::spawn_with(&[]).await
    }

    /// Spawn the agent with arguments (`--config PATH`).
    pub async fn spawn_with(args: &[&std::ffi::OsStr]) -> RawAgent {
        let mut cmd = tokio::process::Command::new(executor_bin());
        cmd.args(args);
        RawAgent::spawn_command(cmd).await
    }

    /// Spawn the agent as `cmd` says (its arguments and environment).
    pub async fn spawn_command(mut cmd: tokio::process::Command) -> RawAgent {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn executor");
        let stdin = child.stdin.take();
        let mut stdout = child.stdout.take().expect("stdout");
        let mut pre = [0u8; 16];
        tokio::time::timeout(WAIT, stdout.read_exact(&mut pre))
            .await
            .expect("preamble in time")
            .expect("read preamble");
        assert_eq!(&pre, PREAMBLE);
        RawAgent {
            child,
            stdin,
            stdout,
            buf: BytesMut::new(),
            decoder: FrameDecoder::new(64 << 20),
        }
    }

    /// Spawn and initialize.
    pub async fn initialized() -> RawAgent {
        let mut a = RawAgent::spawn().await;
        let r = a
            .request(0, executor_protocol::methods::INITIALIZE, &init_params())
            .await;
        assert!(get(&r, "result").is_some(), "initialize failed: {r:?}");
        a
    }

    /// Write raw bytes.
    pub async fn send_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(bytes).await.expect("write to agent");
        stdin.flush().await.expect("flush");
    }

    /// Write one frame holding `payload`.
    pub async fn send_frame(&mut self, payload: &[u8]) {
        let mut b = (payload.len() as u32).to_be_bytes().to_vec();
        b.extend_from_slice(payload);
        self.send_raw(&b).await;
    }

    /// Write a value as one frame.
    pub async fn send_value(&mut self, v: &Value) {
        let mut payload = Vec::new();
        rmpv::encode::write_value(&mut payload, v).expect("encode");
        self.send_frame(&payload).await;
    }

    /// Send a request without waiting.
    pub async fn send_request<P: serde::Serialize>(&mut self, id: u64, method: &str, params: &P) {
        let mut b = Vec::new();
        encode_request(&mut b, id, method, params, 64 << 20).expect("encode");
        self.send_raw(&b).await;
    }

    /// Read the next frame as a map value; `None` at EOF.
    pub async fn recv(&mut self) -> Option<Value> {
        loop {
            if let Some(frame) = self.decoder.decode(&mut self.buf).expect("agent framing") {
                return Some(
                    rmpv::decode::read_value(&mut &frame[..]).expect("agent sent msgpack"),
                );
            }
            let n = tokio::time::timeout(WAIT, self.stdout.read_buf(&mut self.buf))
                .await
                .expect("agent answered in time")
                .expect("read agent stdout");
            if n == 0 {
                assert!(self.buf.is_empty(), "agent output ended inside a frame");
                return None;
            }
        }
    }

    /// Read frames until the answer to `id` (notifications are skipped).
    pub async fn response(&mut self, id: u64) -> Value {
        loop {
            let v = self.recv().await.expect("agent closed before answering");
            if get(&v, "id").and_then(|i| i.as_u64()) == Some(id) {
                return v;
            }
        }
    }

    /// Send a request and wait for its answer.
    pub async fn request<P: serde::Serialize>(
        &mut self,
        id: u64,
        method: &str,
        params: &P,
    ) -> Value {
        self.send_request(id, method, params).await;
        self.response(id).await
    }

    /// Close stdin and wait for the agent to exit.
    pub async fn close_and_wait(&mut self) -> std::process::ExitStatus {
        self.stdin.take();
        self.wait().await
    }

    /// Wait for the agent to exit.
    pub async fn wait(&mut self) -> std::process::ExitStatus {
        tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("agent exited in time")
            .expect("wait")
    }

    /// Everything the agent wrote to stderr (after it exited).
    pub async fn stderr(&mut self) -> String {
        let mut s = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = tokio::time::timeout(WAIT, e.read_to_string(&mut s)).await;
        }
        s
    }
}

/// A client on a freshly spawned local agent.
pub async fn local_client() -> executor_client::Client {
    executor_client::Client::spawn(
        tokio::process::Command::new(executor_bin()),
        executor_client::ClientOptions::default(),
    )
    .await
    .expect("connect to a local agent")
}

/// A `/proc/PID/status` field in KiB (`VmRSS`, `VmHWM`), 0 when gone.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The real uid of this (test) process.
pub fn current_uid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .expect("/proc/self/status")
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|u| u.parse().ok())
        .expect("a Uid line")
}

/// Removes what earlier test processes left under the temp dir
/// (`executor-test-TAG-PID-N` directories and `executor-tests-bin-PID`
/// copies of the agent) once their process is gone: a test that fails
/// leaves its files for a look, and the next run takes them away.
fn sweep_dead_test_dirs() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid = if let Some(rest) = name.strip_prefix("executor-tests-bin-") {
                rest.parse::<u32>().ok()
            } else if name.starts_with("executor-test-") {
                // executor-test-{tag}-{pid}-{nanos}: the pid is second to last.
                name.rsplit('-').nth(1).and_then(|p| p.parse::<u32>().ok())
            } else {
                None
            };
            let Some(pid) = pid else { continue };
            if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
                continue;
            }
            let _ = std::fs::remove_dir_all(e.path());
        }
    });
}

/// A fresh, uniquely named directory under the temp dir.
pub fn unique_tempdir(tag: &str) -> PathBuf {
    sweep_dead_test_dirs();
    let d = std::env::temp_dir().join(format!(
        "executor-test-{tag}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_nanos()
    ));
    std::fs::create_dir_all(&d).expect("create temp dir");
    d
}

/// Standard `initialize` params.
pub fn init_params() -> InitializeParams {
    InitializeParams {
        protocol_version: 1,
        client: ClientInfo {
            name: "tests".into(),
            version: "0".into(),
        },
        session: None,
        capabilities: None,
    }
}

/// Look up a key of a map value.
pub fn get<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    match v {
        Value::Map(m) => m
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v),
        _ => None,
    }
}

/// Follow a dotted path of keys.
pub fn path<'a>(v: &'a Value, dotted: &str) -> Option<&'a Value> {
    dotted.split('.').try_fold(v, |v, k| get(v, k))
}

/// The `error.code` of a response, if it is an error.
pub fn error_code(v: &Value) -> Option<&str> {
    path(v, "error.code").and_then(|c| c.as_str())
}

/// Decode a whole stream of frames (for checks on `Incoming`).
pub fn decode_all(bytes: &[u8]) -> Vec<Result<Incoming, String>> {
    let mut d = FrameDecoder::new(1 << 20);
    let mut b = BytesMut::from(bytes);
    let mut out = Vec::new();
    while let Ok(Some(f)) = d.decode(&mut b) {
        out.push(Incoming::decode(&f).map_err(|e| e.to_string()));
    }
    out
}

/// A client on a local agent started with `--config` holding `toml`.
pub async fn client_with_config(toml: &str) -> executor_client::Client {
    let dir = unique_tempdir("config");
    let path = dir.join("config.toml");
    std::fs::write(&path, toml).expect("write the config");
    let mut cmd = tokio::process::Command::new(executor_bin());
    cmd.arg("--config").arg(&path);
    executor_client::Client::spawn(cmd, executor_client::ClientOptions::default())
        .await
        .expect("connect to a configured agent")
}

/// Run `test` on a thread of its own inside a new network namespace where
/// only `lo` exists (brought up), on a current-thread runtime: every socket
/// it opens and every process it spawns (the agent) live there, so no
/// packet can leave the host. Panics in `test` propagate. Returns `false`
/// (and runs nothing) when this process may not create namespaces.
pub fn in_private_netns<F, Fut>(test: F) -> bool
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let outcome = std::thread::spawn(move || {
        // A network namespace is per thread: this one moves alone.
        if let Err(e) = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET) {
            eprintln!("cannot create a network namespace ({e}): needs root");
            return false;
        }
        let up = std::process::Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .status()
            .expect("run ip (iproute2)");
        assert!(up.success(), "ip link set lo up failed");
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(test());
        true
    })
    .join();
    match outcome {
        Ok(ran) => ran,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// Whether `pid` runs (a zombie does not count).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next());
            state != Some("Z")
        }
        Err(_) => false,
    }
}

/// Direct children of `pid`.
pub fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// The command name of `pid` (empty when gone).
pub fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The agent's spawner: its live child named `executor-spawn`.
pub fn spawner_of(agent: u32) -> Option<u32> {
    children(agent)
        .into_iter()
        .find(|c| comm(*c) == "executor-spawn" && alive(*c))
}

/// What each descriptor `pid` holds open points at (`pipe:[N]`,
/// `net:[N]`, a path), empty when it cannot be read.
pub fn fd_links(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .map(|l| l.to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Wait up to `within` for `pid` to be gone (or a zombie).
pub async fn wait_dead(pid: u32, within: Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        if !alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    !alive(pid)
}

/// A test's prerequisite is missing on this host (`what` says which). With
/// `EXECUTOR_REQUIRE_ALL=1` (set by `.ci/run`) that fails the test, so CI
/// is never green with a security test not run; elsewhere the test says it
/// skipped and returns.
pub fn prerequisite_missing(what: &str) {
    let required = std::env::var_os("EXECUTOR_REQUIRE_ALL").is_some_and(|v| v == "1");
    missing(what, required);
}

fn missing(what: &str, required: bool) {
    assert!(
        !required,
        "prerequisite missing: {what} (EXECUTOR_REQUIRE_ALL=1 makes this a failure)"
    );
    eprintln!("skipped: {what}");
}

/// The agent's error inside a client error (panics on any other error).
pub fn remote(e: executor_client::Error) -> executor_protocol::WireError {
    match e {
        executor_client::Error::Remote(w) => w,
        other => panic!("expected an agent error, got {other:?}"),
    }
}

/// The environment most test jobs get: `PATH` only.
pub fn path_env() -> std::collections::BTreeMap<String, String> {
    std::collections::BTreeMap::from([("PATH".to_string(), "/usr/bin:/bin".to_string())])
}

/// A local path as a wire path (any bytes).
pub fn wire_path(p: &std::path::Path) -> executor_protocol::WirePath {
    use std::os::unix::ffi::OsStrExt;
    executor_protocol::WirePath::from_bytes(p.as_os_str().as_bytes().to_vec())
}

/// The parent of process `pid` (from `/proc/PID/stat`).
pub fn parent_pid(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(1))
        .and_then(|p| p.parse().ok())
        .expect("a ppid in /proc/PID/stat")
}

/// The agent that runs the unconfined job `pid`: the job's parent is its
/// supervisor, whose parent is the agent's spawner, whose parent is the
/// agent.
pub fn agent_of_job(pid: u32) -> u32 {
    parent_pid(parent_pid(parent_pid(pid)))
}

/// `chown -R uid:uid p` (for a tree an unprivileged agent must own).
pub fn chown_r(p: &Path, uid: u32) {
    let st = std::process::Command::new("chown")
        .arg("-R")
        .arg(format!("{uid}:{uid}"))
        .arg(p)
        .status()
        .unwrap();
    assert!(st.success());
}

/// xorshift64*: a deterministic, dependency-free generator for the
/// fuzz-style tests (a failing seed replays exactly).
#[derive(Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// In `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// In `0..n`, as a u64.
    pub fn below_u64(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len())]
    }

    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(len + 8);
        while v.len() < len {
            v.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        v.truncate(len);
        v
    }
}

/// A PTY in raw mode (bytes pass unchanged): its slave to write, and a
/// thread reading `len` bytes from its master.
pub fn raw_pty_reader(
    len: usize,
) -> (
    std::os::fd::OwnedFd,
    std::thread::JoinHandle<std::io::Result<Vec<u8>>>,
) {
    use nix::sys::termios::{cfmakeraw, tcgetattr, tcsetattr, SetArg};
    use std::io::Read;
    let pty = nix::pty::openpty(None, None).expect("openpty");
    let mut t = tcgetattr(&pty.slave).expect("tcgetattr");
    cfmakeraw(&mut t);
    tcsetattr(&pty.slave, SetArg::TCSANOW, &t).expect("tcsetattr");
    let mut master = std::fs::File::from(pty.master);
    let reader = std::thread::spawn(move || {
        let mut got = vec![0u8; len];
        master.read_exact(&mut got)?;
        Ok(got)
    });
    (pty.slave, reader)
}

/// The command that starts an agent as uid 65534 (through `setpriv`) when
/// `unprivileged` and this process is root, else as this process's user;
/// and the uid it runs as.
pub fn agent_command(unprivileged: bool) -> (tokio::process::Command, u32) {
    if unprivileged && current_uid() == 0 {
        let mut c = tokio::process::Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(executor_bin_for_any_user());
        (c, 65534)
    } else {
        (tokio::process::Command::new(executor_bin()), current_uid())
    }
}

/// `both!(name, |unprivileged: bool| async move { ... })`: the body as two
/// tests, `name::as_root` (`false`) and `name::as_unprivileged_user`
/// (`true`), for suites whose agents [`agent_command`] starts.
#[macro_export]
macro_rules! root_and_unprivileged {
    ($name:ident, $body:expr) => {
        mod $name {
            use super::*;
            #[tokio::test]
            async fn as_root() {
                ($body)(false).await;
            }
            #[tokio::test]
            async fn as_unprivileged_user() {
                ($body)(true).await;
            }
        }
    };
}

/// A msgpack map of `entries` (string keys, in order), for request params
/// written by hand.
pub fn msgpack_map(entries: &[(&str, Value)]) -> Value {
    Value::Map(
        entries
            .iter()
            .map(|(k, v)| (Value::from(*k), v.clone()))
            .collect(),
    )
}

#[cfg(test)]
mod prerequisite_tests {
    #[test]
    #[should_panic(expected = "prerequisite missing: a sandbox")]
    fn a_missing_prerequisite_fails_when_all_are_required() {
        super::missing("a sandbox", true);
    }

    #[test]
    fn a_missing_prerequisite_skips_otherwise() {
        super::missing("a sandbox", false);
    }
}
