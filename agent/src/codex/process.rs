//! Codex's `process/*` over the native jobs: client-chosen `processId`s
//! (a duplicate refused) kept as the native job's `tag`, output pushed as
//! Codex `process/output` with seqs from 1, the exit and the close taking
//! the next two seqs, `process/read` by `afterSeq`, `process/write` with
//! its `writeId`, `process/terminate` answering whether the job ran.
//!
//! A job's first notifications may come before its start's answer (the
//! native agent pumps output and waits for the exit as soon as the job
//! runs): they are not pushed then, only noted (an exit kept), and once
//! the answer names the job its output is read back and pushed, then its
//! exit, as after a lag.
//!
//! After a native `process/lagged`, or a gap in the seqs, the missing
//! chunks are read back (`process/read`, 4 MiB at a time, waiting for the
//! client) and pushed in order before anything later of that job; live
//! chunks are dropped meanwhile (read back too), so a job outrunning its
//! client costs no memory here. A catch-up ends only past every chunk
//! heard of (dropped, heard early, named by a lag notice or an exit's
//! final seq): an empty read-back answer can be older than a chunk whose
//! notification came before it. What the agent's own retained buffer (1
//! MiB per job by default, as the reference's) no longer holds is a gap in
//! the seqs the client sees.
//!
//! Uses the dialect's wire, uri, errors and native modules, and the
//! protocol crate.

use super::native::Native;
use super::wire::{self, RpcError};
use super::{b64, decode, Conn};
use base64::Engine;
use executor_protocol::methods as m;
use executor_protocol::types::process::{
    ProcessExited, ProcessLagged, ProcessListParams, ProcessListResult, ProcessOutput,
    ProcessReadParams, ProcessReadResult, ProcessStartResult, PtySize, StdinMode,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// What the dialect knows of each job it started, shared between the
/// request handlers and the native reader.
#[derive(Default)]
#[allow(missing_debug_implementations)] // holds the jobs' lines
pub struct Registry {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    by_codex: HashMap<String, Entry>,
    by_native: HashMap<String, String>,
    /// Native jobs heard of before their start's answer (at most
    /// [`MAX_EARLY`]).
    early: HashMap<String, Early>,
}

/// What was heard of a job before its start's answer.
#[derive(Default)]
struct Early {
    /// The native seq of the last chunk heard of.
    heard: Option<u64>,
    exit: Option<ProcessExited>,
}

/// How many jobs may be heard of before their start's answer (as many as
/// starts can be under way at once, and more).
const MAX_EARLY: usize = 1024;

/// What a native event asks of the caller: lines to push now (in order),
/// and a job whose missing chunks are to be read back.
#[derive(Default)]
struct Step {
    lines: Vec<Vec<u8>>,
    catch_up: Option<String>,
}

impl Step {
    fn lines(lines: Vec<Vec<u8>>) -> Self {
        Step {
            lines,
            catch_up: None,
        }
    }
    fn catch_up(codex: String) -> Self {
        Step {
            lines: Vec::new(),
            catch_up: Some(codex),
        }
    }
}

/// The later of two native seqs heard of.
fn later(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    a.max(b)
}

impl Inner {
    /// Note a notification about a native job not known (yet): the seq of
    /// a chunk it names, its exit.
    fn note_early(&mut self, native: &str, heard: Option<u64>, exit: Option<ProcessExited>) {
        if !self.early.contains_key(native) && self.early.len() >= MAX_EARLY {
            tracing::debug!(
                process_id = native,
                "notification for an unknown job dropped"
            );
            return;
        }
        let slot = self.early.entry(native.to_owned()).or_default();
        slot.heard = later(slot.heard, heard);
        if exit.is_some() {
            slot.exit = exit;
        }
    }

    /// The start of `codex` was answered: its native id is `native`.
    /// Whether the job was heard of before (then what it said is to be
    /// read back: live chunks are dropped and its exit held until then).
    fn started(&mut self, codex: &str, native: String) -> bool {
        self.by_native.insert(native.clone(), codex.to_owned());
        let early = self.early.remove(&native);
        let Some(e) = self.by_codex.get_mut(codex) else {
            return false;
        };
        e.native = native;
        let Some(early) = early else {
            return false;
        };
        e.held = Some(early.exit.into_iter().map(Held::Exited).collect());
        e.heard = early.heard;
        true
    }

    fn chunk(&mut self, native: &str, seq: u64, stream: &str, data: &[u8]) -> Step {
        let Some(codex) = self.by_native.get(native).cloned() else {
            self.note_early(native, Some(seq), None);
            return Step::default();
        };
        let Some(e) = self.by_codex.get_mut(&codex) else {
            return Step::default();
        };
        if e.held.is_some() {
            // Being read back: this chunk comes with the catch-up (nothing
            // of it is held here, so a job outrunning its client costs no
            // memory), which ends only past it.
            e.heard = later(e.heard, Some(seq));
            return Step::default();
        }
        if e.resumed && e.last_pushed.is_none() {
            e.last_pushed = seq.checked_sub(1);
        }
        let expected = e.last_pushed.map_or(0, |s| s + 1);
        if seq < expected {
            return Step::default();
        }
        if seq > expected {
            // A gap: read back what is missing, this chunk with it.
            e.held = Some(Vec::new());
            e.heard = later(e.heard, Some(seq));
            return Step::catch_up(codex);
        }
        e.last_pushed = Some(seq);
        Step::lines(vec![output_line(&codex, seq, stream, data)])
    }

    fn exited(&mut self, x: ProcessExited) -> Step {
        let Some(codex) = self.by_native.get(&x.process_id).cloned() else {
            let native = x.process_id.clone();
            self.note_early(&native, None, Some(x));
            return Step::default();
        };
        let Some(e) = self.by_codex.get_mut(&codex) else {
            return Step::default();
        };
        if let Some(held) = e.held.as_mut() {
            held.push(Held::Exited(x));
            return Step::default();
        }
        if e.resumed && e.last_pushed.is_none() {
            e.last_pushed = x.final_seq;
        }
        if x.final_seq.is_some() && x.final_seq != e.last_pushed {
            e.held = Some(vec![Held::Exited(x)]);
            return Step::catch_up(codex);
        }
        Step::lines(exit_lines(&codex, e, &x))
    }

    fn lagged(&mut self, l: &ProcessLagged) -> Step {
        // The lag notice names the first chunk not pushed.
        let Some(codex) = self.by_native.get(&l.process_id).cloned() else {
            self.note_early(&l.process_id, Some(l.next_seq), None);
            return Step::default();
        };
        let Some(e) = self.by_codex.get_mut(&codex) else {
            return Step::default();
        };
        e.heard = later(e.heard, Some(l.next_seq));
        if e.held.is_some() {
            return Step::default();
        }
        e.held = Some(Vec::new());
        Step::catch_up(codex)
    }

    /// Where the next read-back of `codex` starts: its native id and the
    /// native seq of the last chunk pushed (`None` once the job is gone).
    fn read_from(&self, codex: &str) -> Option<(String, Option<u64>)> {
        let e = self.by_codex.get(codex)?;
        Some((e.native.clone(), e.last_pushed))
    }

    /// A read-back's answer (`None`: it failed, nothing more can be read):
    /// the lines to push, and whether the catch-up is over (then what was
    /// held is among the lines, and live chunks are pushed again). `None`
    /// once the job is gone.
    fn read_back(
        &mut self,
        codex: &str,
        read: Option<ProcessReadResult>,
    ) -> Option<(Vec<Vec<u8>>, bool)> {
        let e = self.by_codex.get_mut(codex)?;
        let mut lines = Vec::new();
        if let Some(r) = &read {
            for c in &r.chunks {
                if e.last_pushed.is_none_or(|l| c.seq > l) {
                    e.last_pushed = Some(c.seq);
                    lines.push(output_line(codex, c.seq, c.stream.as_str(), &c.data));
                }
            }
            if !r.chunks.is_empty() {
                return Some((lines, false));
            }
            // Nothing past the last chunk pushed when the agent answered.
            // A chunk heard of that was not pushed is read again: its
            // notification can overtake an answer made before the chunk
            // was buffered (the agent buffers a chunk, then notifies it).
            // One below the answer's `nextSeq` that it did not return is
            // gone from the job's buffer: a gap the client sees.
            let exits = e.held.iter().flatten().map(|Held::Exited(x)| x.final_seq);
            let heard = exits.fold(e.heard, later);
            let missing =
                heard.is_some_and(|h| e.last_pushed.is_none_or(|l| h > l) && h >= r.next_seq);
            if missing {
                return Some((lines, false));
            }
        }
        // Nothing more to read: release what was held, in order, past
        // what was pushed.
        e.heard = None;
        for h in e.held.take().unwrap_or_default() {
            match h {
                Held::Exited(x) => lines.extend(exit_lines(codex, e, &x)),
            }
        }
        Some((lines, true))
    }
}

#[derive(Default)]
struct Entry {
    /// Empty while the start is under way.
    native: String,
    piped_stdin: bool,
    /// The native seq of the last chunk pushed.
    last_pushed: Option<u64>,
    /// `Some` while missing chunks are read back (then live chunks are
    /// dropped and the exit waits).
    held: Option<Vec<Held>>,
    /// While read back: the native seq of the last chunk heard of and not
    /// pushed (dropped live, heard before the start's answer, named by a
    /// lag notice). The catch-up ends past it, or once the job's buffer no
    /// longer holds it.
    heard: Option<u64>,
    /// Learnt from a resumed session: what the client read before is not
    /// known, so pushing starts at the first chunk that arrives.
    resumed: bool,
    exit: Option<Exit>,
    sandbox_denied: bool,
}

#[derive(Clone, Copy)]
struct Exit {
    code: i32,
    /// The Codex seq the exit took (the close takes the next).
    seq: u64,
}

/// What waits for a catch-up to end (live chunks are dropped meanwhile:
/// the catch-up reads them back).
enum Held {
    Exited(ProcessExited),
}

fn exit_code(e: &ProcessExited) -> i32 {
    e.exit_code
        .or(e.signal_number.map(|n| 128 + n))
        .unwrap_or(-1)
}

impl Registry {
    /// A native notification about a job, as Codex lines (pushed in order
    /// by the caller); a catch-up is started on the job when chunks are
    /// missing.
    pub fn note(self: &Arc<Self>, conn: &Conn, method: &str, params: rmpv::Value) -> Vec<Vec<u8>> {
        let step = {
            let mut g = self.inner.lock().expect("registry lock");
            match method {
                m::PROCESS_OUTPUT => match rmpv::ext::from_value::<ProcessOutput>(params) {
                    Ok(o) => g.chunk(&o.process_id, o.seq, o.stream.as_str(), &o.data),
                    Err(_) => Step::default(),
                },
                m::PROCESS_EXITED => match rmpv::ext::from_value::<ProcessExited>(params) {
                    Ok(x) => g.exited(x),
                    Err(_) => Step::default(),
                },
                m::PROCESS_LAGGED => match rmpv::ext::from_value::<ProcessLagged>(params) {
                    Ok(l) => g.lagged(&l),
                    Err(_) => Step::default(),
                },
                _ => Step::default(),
            }
        };
        if let Some(codex) = step.catch_up {
            self.catch_up(conn, codex);
        }
        step.lines
    }

    /// Read back the chunks of `codex` after the last one pushed and push
    /// them (live chunks are dropped meanwhile, so nothing overtakes
    /// them), until every chunk heard of is pushed; then what was held.
    fn catch_up(self: &Arc<Self>, conn: &Conn, codex: String) {
        let (registry, native, out) = (self.clone(), conn.native.clone(), conn.out.clone());
        tokio::spawn(async move {
            loop {
                let from = registry
                    .inner
                    .lock()
                    .expect("registry lock")
                    .read_from(&codex);
                let Some((native_id, after)) = from else {
                    return;
                };
                let read: Result<ProcessReadResult, _> = native
                    .call(
                        m::PROCESS_READ,
                        &ProcessReadParams {
                            process_id: native_id,
                            after_seq: after,
                            max_bytes: Some(4 << 20),
                            wait_ms: None,
                        },
                    )
                    .await;
                let read = read
                    .map_err(|e| tracing::debug!(error = %e, "catch-up read failed"))
                    .ok();
                let step = registry
                    .inner
                    .lock()
                    .expect("registry lock")
                    .read_back(&codex, read);
                let Some((lines, done)) = step else {
                    return;
                };
                for l in lines {
                    if out.send(l).await.is_err() {
                        return;
                    }
                }
                if done {
                    return;
                }
            }
        });
    }

    /// Forget everything and learn the jobs of a resumed session (their
    /// tags are the Codex ids).
    async fn relearn(&self, native: &Native) -> Result<(), RpcError> {
        let list: ProcessListResult = native
            .call(m::PROCESS_LIST, &ProcessListParams {})
            .await
            .map_err(|e| super::errors::from_wire(&e))?;
        let mut g = self.inner.lock().expect("registry lock");
        g.by_codex.clear();
        g.by_native.clear();
        // A resumed job pushes from its first chunk after this.
        g.early.clear();
        for p in list.processes {
            if let Some(tag) = p.tag {
                g.by_native.insert(p.process_id.clone(), tag.clone());
                g.by_codex.insert(
                    tag,
                    Entry {
                        native: p.process_id,
                        piped_stdin: true,
                        resumed: true,
                        ..Entry::default()
                    },
                );
            }
        }
        Ok(())
    }
}

fn output_line(codex: &str, seq: u64, stream: &str, data: &[u8]) -> Vec<u8> {
    wire::notification(
        "process/output",
        json!({
            "processId": codex,
            "seq": seq + 1,
            "stream": stream,
            "chunk": b64(data),
        }),
    )
}

fn exit_lines(codex: &str, e: &mut Entry, x: &ProcessExited) -> Vec<Vec<u8>> {
    if e.exit.is_some() {
        return vec![];
    }
    let seq = x.final_seq.map_or(1, |s| s + 2);
    let code = exit_code(x);
    e.exit = Some(Exit { code, seq });
    e.sandbox_denied = x.sandbox_denied.unwrap_or(false);
    vec![
        wire::notification(
            "process/exited",
            json!({
                "processId": codex,
                "seq": seq,
                "exitCode": code,
                "sandboxDenied": e.sandbox_denied,
            }),
        ),
        wire::notification(
            "process/closed",
            json!({"processId": codex, "seq": seq + 1}),
        ),
    ]
}

/// Learn the jobs of a resumed session.
pub async fn relearn(conn: &Conn) -> Result<(), RpcError> {
    conn.procs.relearn(&conn.native).await
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct EnvPolicy {
    inherit: Inherit,
    #[serde(default)]
    ignore_default_excludes: bool,
    #[serde(default)]
    exclude: Vec<String>,
    #[serde(default)]
    set: BTreeMap<String, String>,
    #[serde(default)]
    include_only: Vec<String>,
}

#[derive(Deserialize, Clone, Copy, PartialEq)]
#[serde(rename_all = "lowercase")]
enum Inherit {
    Core,
    All,
    None,
}

/// The variables `inherit: "core"` keeps (Codex's core set).
const CORE_VARS: &[&str] = &[
    "HOME", "LANG", "LOGNAME", "PATH", "SHELL", "USER", "USERNAME", "TMPDIR", "TEMP", "TMP",
];
/// Names dropped unless `ignoreDefaultExcludes`: likely secrets.
const DEFAULT_EXCLUDES: &[&str] = &["*KEY*", "*SECRET*", "*TOKEN*"];

/// `*` and `?` wildcards, ASCII case-insensitive (as Codex matches names).
fn wildmatch(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<u8>, Vec<u8>) = (
        pattern.bytes().map(|b| b.to_ascii_uppercase()).collect(),
        name.bytes().map(|b| b.to_ascii_uppercase()).collect(),
    );
    let (mut pi, mut ni, mut star, mut mark) = (0, 0, None, 0);
    while ni < n.len() {
        if pi < p.len() && (p[pi] == b'?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == b'*' {
        pi += 1;
    }
    pi == p.len()
}

/// The job's environment: the policy over this agent's own environment,
/// then the request's `env` on top.
fn compose_env(
    policy: Option<EnvPolicy>,
    env: BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Some(p) = policy {
        for (k, v) in std::env::vars_os() {
            let (Some(k), Some(v)) = (k.to_str(), v.to_str()) else {
                continue;
            };
            let keep = match p.inherit {
                Inherit::All => true,
                Inherit::Core => CORE_VARS.contains(&k),
                Inherit::None => false,
            };
            if !keep {
                continue;
            }
            if !p.ignore_default_excludes && DEFAULT_EXCLUDES.iter().any(|x| wildmatch(x, k)) {
                continue;
            }
            if p.exclude.iter().any(|x| wildmatch(x, k)) {
                continue;
            }
            if !p.include_only.is_empty() && !p.include_only.iter().any(|x| wildmatch(x, k)) {
                continue;
            }
            out.insert(k.to_owned(), v.to_owned());
        }
        out.extend(p.set);
    }
    out.extend(env);
    out
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct StartParams {
    process_id: String,
    argv: Vec<String>,
    cwd: String,
    #[serde(default)]
    env_policy: Option<EnvPolicy>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    tty: bool,
    #[serde(default)]
    pipe_stdin: bool,
    #[serde(default)]
    arg0: Option<String>,
    #[serde(default)]
    sandbox: Option<Value>,
    #[serde(default)]
    enforce_managed_network: bool,
    #[serde(default)]
    managed_network: Option<Value>,
    #[serde(default)]
    network_proxy: Option<Value>,
    /// Codex's bookkeeping (thread and tool-call ids): not acted on.
    #[serde(default)]
    #[allow(dead_code)]
    metadata: Option<Value>,
    /// Gated by `shellSnapshotV2`, which is not advertised: refused when set.
    #[serde(default)]
    shell_snapshot: Option<Value>,
}

/// The native start, as sent (so `idempotency_key` and `tag` ride along).
#[derive(Serialize)]
struct NativeStart<'a> {
    argv: &'a [String],
    cwd: executor_protocol::WirePath,
    env: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    arg0: Option<&'a str>,
    tty: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pty_size: Option<PtySize>,
    stdin: StdinMode,
    #[serde(skip_serializing_if = "Option::is_none")]
    sandbox: Option<executor_protocol::types::sandbox::SandboxIntent>,
    tag: &'a str,
}

pub async fn start(conn: &Conn, params: Value) -> Result<Value, RpcError> {
    let p: StartParams = decode(params)?;
    conn.ready("exec")?;
    if p.argv.is_empty() {
        return Err(RpcError::invalid_params("argv must not be empty"));
    }
    if p.shell_snapshot.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(RpcError::invalid_params(
            "shellSnapshot is not supported by this exec-server (shellSnapshotV2 is not advertised)",
        ));
    }
    let cwd = super::uri::to_path(&p.cwd)?;
    let env = compose_env(p.env_policy, p.env);
    let nonnull = |v: &Option<Value>| v.as_ref().filter(|v| !v.is_null()).cloned();
    let (proxy, managed) = (nonnull(&p.network_proxy), nonnull(&p.managed_network));
    let intent = super::sandbox_request(
        p.sandbox.as_ref(),
        super::sandbox::NetworkRequest {
            enforce_managed: p.enforce_managed_network,
            proxy: proxy.as_ref(),
            managed: managed.as_ref(),
        },
        &cwd,
        env.get("TMPDIR").map(std::path::Path::new),
    )?;
    // A bare program name is looked up in the job's PATH, or this agent's
    // when the job has none (as the reference's spawn does); the job
    // still sees the name it was given as its argv[0].
    let mut argv = p.argv.clone();
    let mut arg0 = p.arg0.clone();
    if !argv[0].contains('/') && !env.contains_key("PATH") {
        match find_program(&argv[0]) {
            Some(path) => {
                arg0.get_or_insert_with(|| argv[0].clone());
                argv[0] = path;
            }
            None => return Err(spawn_not_found()),
        }
    }
    {
        let mut g = conn.procs.inner.lock().expect("registry lock");
        if g.by_codex.contains_key(&p.process_id) {
            return Err(RpcError::invalid_request(format!(
                "process {} already exists",
                p.process_id
            )));
        }
        g.by_codex.insert(
            p.process_id.clone(),
            Entry {
                piped_stdin: p.pipe_stdin || p.tty,
                ..Entry::default()
            },
        );
    }
    let sandboxed = intent.is_some() || conn.profile_sandbox;
    let native_params = NativeStart {
        argv: &argv,
        cwd: super::uri::wire_path(&cwd),
        env: &env,
        arg0: arg0.as_deref(),
        tty: p.tty,
        pty_size: p.tty.then(PtySize::default),
        stdin: if p.pipe_stdin || p.tty {
            StdinMode::Pipe
        } else {
            StdinMode::Null
        },
        sandbox: intent,
        tag: &p.process_id,
    };
    // The job's id is learnt on the reader before its first output is
    // looked at.
    let (registry, codex) = (conn.procs.clone(), p.process_id.clone());
    let heard_early = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let heard = heard_early.clone();
    // What came before the answer is read back once the start is answered
    // (live chunks are dropped and the exit held until then).
    let hook: super::native::Hook = Box::new(move |v| {
        if let Ok(r) = rmpv::ext::from_value::<ProcessStartResult>(v.clone()) {
            let mut g = registry.inner.lock().expect("registry lock");
            if g.started(&codex, r.process_id) {
                heard.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
    });
    match conn
        .native
        .call_value(m::PROCESS_START, &native_params, Some(hook))
        .await
    {
        Ok(_) => {
            if heard_early.load(std::sync::atomic::Ordering::Relaxed) {
                conn.procs.catch_up(conn, p.process_id.clone());
            }
            Ok(json!({
                "processId": p.process_id,
                "sandboxType": if sandboxed { "linuxSeccomp" } else { "none" },
            }))
        }
        Err(e) => {
            conn.procs
                .inner
                .lock()
                .expect("registry lock")
                .by_codex
                .remove(&p.process_id);
            if e.code == executor_protocol::error::ErrorCode::NotFound
                && e.data_get("field").and_then(|f| f.as_str()) != Some("cwd")
            {
                return Err(spawn_not_found());
            }
            Err(super::errors::from_wire(&e))
        }
    }
}

/// A program that is not there, as the reference reports it.
fn spawn_not_found() -> RpcError {
    RpcError::internal("No such file or directory (os error 2)")
        .with_data(json!({"kind": "spawnNotFound"}))
}

/// `name` in this agent's PATH: the first executable regular file.
fn find_program(name: &str) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .filter(|d| d.is_absolute())
        .map(|d| d.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .and_then(|p| p.to_str().map(str::to_owned))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ReadParams {
    process_id: String,
    #[serde(default)]
    after_seq: Option<u64>,
    #[serde(default)]
    max_bytes: Option<u64>,
    #[serde(default)]
    wait_ms: Option<u64>,
}

fn native_of(conn: &Conn, codex: &str) -> Option<(String, bool, Option<Exit>, bool)> {
    let g = conn.procs.inner.lock().expect("registry lock");
    g.by_codex
        .get(codex)
        .filter(|e| !e.native.is_empty())
        .map(|e| (e.native.clone(), e.piped_stdin, e.exit, e.sandbox_denied))
}

pub async fn read(conn: &Conn, params: Value) -> Result<Value, RpcError> {
    let p: ReadParams = decode(params)?;
    conn.ready("exec")?;
    let Some((native, _, _, _)) = native_of(conn, &p.process_id) else {
        return Err(RpcError::invalid_request(format!(
            "unknown process id {}",
            p.process_id
        )));
    };
    let r: ProcessReadResult = conn
        .native
        .call(
            m::PROCESS_READ,
            &ProcessReadParams {
                process_id: native,
                after_seq: p.after_seq.and_then(|s| s.checked_sub(1)),
                max_bytes: p.max_bytes,
                wait_ms: p.wait_ms,
            },
        )
        .await
        .map_err(|e| super::errors::from_wire(&e))?;
    let (_, _, mut exit, denied) = native_of(conn, &p.process_id).unwrap_or_default();
    // The native `next_seq` is the seq the job's next chunk will get: with
    // the job exited, how many chunks it wrote.
    if let (None, Some(x)) = (exit, &r.exited) {
        // Exited while no connection was attached (or before its exit
        // notification was handled): the exit and the close take the two
        // seqs after its last chunk.
        let code = x.exit_code.unwrap_or_else(|| {
            x.signal
                .as_deref()
                .and_then(|s| s.parse::<nix::sys::signal::Signal>().ok())
                .map_or(-1, |s| 128 + s as i32)
        });
        let e = Exit {
            code,
            seq: r.next_seq + 1,
        };
        exit = Some(e);
        let mut g = conn.procs.inner.lock().expect("registry lock");
        if let Some(entry) = g.by_codex.get_mut(&p.process_id) {
            entry.exit.get_or_insert(e);
        }
    }
    let chunks: Vec<Value> = r
        .chunks
        .iter()
        .map(|c| json!({"seq": c.seq + 1, "stream": c.stream.as_str(), "chunk": b64(&c.data)}))
        .collect();
    let exited = r.exited.is_some();
    let code = exit.filter(|_| exited).map(|e| e.code);
    // How far this read went (native seqs): past its last chunk, or
    // everything there is when it returned none.
    let read_through = r.chunks.last().map_or(r.next_seq, |c| c.seq + 1);
    // Closed once the job exited and every chunk was read: the exit and
    // the close take the two seqs after the last chunk.
    let closed = exit.is_some_and(|e| exited && read_through + 1 >= e.seq);
    let next = match exit {
        Some(e) if closed => e.seq + 2,
        _ => read_through + 1,
    };
    Ok(json!({
        "chunks": chunks,
        "nextSeq": next,
        "exited": exited,
        "exitCode": code,
        "closed": closed,
        "failure": Value::Null,
        "sandboxDenied": denied,
    }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WriteParams {
    process_id: String,
    chunk: String,
    write_id: String,
}

#[derive(Serialize)]
struct NativeWrite<'a> {
    process_id: &'a str,
    #[serde(with = "serde_bytes")]
    data: &'a [u8],
    write_id: &'a str,
}

/// A `process/write` checked and decoded, ready for its job's lane.
#[derive(Debug)]
pub struct PreparedWrite {
    /// The native job (a lane a job: a client id reused after its job
    /// ended names another lane).
    pub native: String,
    data: Vec<u8>,
    write_id: String,
}

impl PreparedWrite {
    /// What it holds while it waits, counted against the connection's
    /// bound (with room for the lane and the request around it).
    pub fn size(&self) -> usize {
        self.data.len() + self.write_id.len() + self.native.len() + 4096
    }
}

/// `process/write` as far as it goes without the job: its params decoded
/// and checked (unknown keys, base64, an empty `writeId`), its job found.
/// `Ok(Err(answer))` is answered at once (an unknown job, stdin closed).
pub fn prepare_write(conn: &Conn, params: Value) -> Result<Result<PreparedWrite, Value>, RpcError> {
    let p: WriteParams = decode(params)?;
    conn.ready("exec")?;
    if p.write_id.is_empty() {
        return Err(RpcError::invalid_params("writeId must not be empty"));
    }
    let data = base64::engine::general_purpose::STANDARD
        .decode(p.chunk.as_bytes())
        .map_err(|e| RpcError::invalid_params(e.to_string()))?;
    let Some((native, piped, exit, _)) = native_of(conn, &p.process_id) else {
        return Ok(Err(json!({"status": "unknownProcess"})));
    };
    if !piped {
        return Ok(Err(json!({"status": "stdinClosed"})));
    }
    if exit.is_some() {
        return Err(RpcError::internal("failed to write to process stdin"));
    }
    Ok(Ok(PreparedWrite {
        native,
        data,
        write_id: p.write_id,
    }))
}

/// The write itself, once its lane takes it.
pub async fn perform_write(conn: &Conn, w: PreparedWrite) -> Result<Value, RpcError> {
    let r: Result<rmpv::Value, _> = conn
        .native
        .call_value(
            m::PROCESS_WRITE,
            &NativeWrite {
                process_id: &w.native,
                data: &w.data,
                write_id: &w.write_id,
            },
            None,
        )
        .await;
    match r {
        Ok(_) => Ok(json!({"status": "accepted"})),
        Err(e) if e.code == executor_protocol::error::ErrorCode::UnknownProcess => {
            Ok(json!({"status": "unknownProcess"}))
        }
        Err(e) if e.code == executor_protocol::error::ErrorCode::Io => {
            Ok(json!({"status": "stdinClosed"}))
        }
        Err(e) => Err(super::errors::from_wire(&e)),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SignalParams {
    process_id: String,
    signal: CodexSignal,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum CodexSignal {
    Interrupt,
}

#[derive(Serialize)]
struct NativeSignal<'a> {
    process_id: &'a str,
    signal: &'static str,
}

pub async fn signal(conn: &Conn, params: Value) -> Result<Value, RpcError> {
    let p: SignalParams = decode(params)?;
    conn.ready("exec")?;
    let CodexSignal::Interrupt = p.signal;
    let Some((native, _, exit, _)) = native_of(conn, &p.process_id) else {
        return Err(RpcError::invalid_request(format!(
            "unknown process id {}",
            p.process_id
        )));
    };
    if exit.is_none() {
        let r: Result<rmpv::Value, _> = conn
            .native
            .call_value(
                m::PROCESS_SIGNAL,
                &NativeSignal {
                    process_id: &native,
                    signal: "interrupt",
                },
                None,
            )
            .await;
        if let Err(e) = r {
            if e.code != executor_protocol::error::ErrorCode::UnknownProcess {
                return Err(super::errors::from_wire(&e));
            }
        }
    }
    Ok(json!({}))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TerminateParams {
    process_id: String,
}

pub async fn terminate(conn: &Conn, params: Value) -> Result<Value, RpcError> {
    let p: TerminateParams = decode(params)?;
    conn.ready("exec")?;
    let Some((native, _, exit, _)) = native_of(conn, &p.process_id) else {
        return Ok(json!({"running": false}));
    };
    if exit.is_some() {
        return Ok(json!({"running": false}));
    }
    let r: Result<rmpv::Value, _> = conn
        .native
        .call_value(
            m::PROCESS_SIGNAL,
            &NativeSignal {
                process_id: &native,
                signal: "kill",
            },
            None,
        )
        .await;
    match r {
        Ok(_) => Ok(json!({"running": true})),
        Err(e) if e.code == executor_protocol::error::ErrorCode::UnknownProcess => {
            Ok(json!({"running": false}))
        }
        Err(e) => Err(super::errors::from_wire(&e)),
    }
}

/// Lines pushed to the client, in order.
pub use super::wire::Out;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards() {
        assert!(wildmatch("*KEY*", "OPENAI_API_KEY"));
        assert!(wildmatch("*key*", "ssh_keyfile"));
        assert!(!wildmatch("*TOKEN*", "PATH"));
        assert!(wildmatch("LC_?", "LC_A"));
        assert!(wildmatch("*", ""));
    }

    #[test]
    fn env_policy() {
        std::env::set_var("CODEX_TEST_SECRET_TOKEN", "x");
        let p: EnvPolicy = serde_json::from_value(json!({
            "inherit": "all", "exclude": ["HOME"], "set": {"A": "1"}
        }))
        .unwrap();
        let env = compose_env(Some(p), BTreeMap::from([("B".into(), "2".into())]));
        assert!(!env.contains_key("CODEX_TEST_SECRET_TOKEN"));
        assert!(!env.contains_key("HOME"));
        assert_eq!(env["A"], "1");
        assert_eq!(env["B"], "2");
        let none = compose_env(None, BTreeMap::new());
        assert!(none.is_empty());
    }

    use executor_protocol::types::process::{OutputChunk, OutputStream};

    /// A registry with job `j` started as native `proc-1`, after `early`
    /// (notifications heard before the start's answer).
    fn started(early: impl FnOnce(&mut Inner)) -> (Inner, bool) {
        let mut g = Inner::default();
        g.by_codex.insert("j".into(), Entry::default());
        early(&mut g);
        let heard = g.started("j", "proc-1".into());
        (g, heard)
    }

    fn chunk(seq: u64) -> OutputChunk {
        OutputChunk {
            seq,
            stream: if seq % 2 == 0 {
                OutputStream::Stdout
            } else {
                OutputStream::Stderr
            },
            data: serde_bytes::ByteBuf::from(format!("c{seq}")),
        }
    }

    fn answer(chunks: &[u64], next_seq: u64) -> Option<ProcessReadResult> {
        Some(ProcessReadResult {
            chunks: chunks.iter().map(|&s| chunk(s)).collect(),
            next_seq,
            exited: None,
            dropped_before: None,
        })
    }

    fn exit(final_seq: u64) -> ProcessExited {
        rmpv::ext::from_value(
            rmpv::ext::to_value(json!({
                "process_id": "proc-1", "exit_code": 3, "final_seq": final_seq,
            }))
            .unwrap(),
        )
        .unwrap()
    }

    /// The Codex seqs of `lines`, with what each is.
    fn seqs(lines: &[Vec<u8>]) -> Vec<(String, u64)> {
        lines
            .iter()
            .map(|l| {
                let v: Value = serde_json::from_slice(l).unwrap();
                let kind = v["method"].as_str().unwrap().trim_start_matches("process/");
                (kind.to_owned(), v["params"]["seq"].as_u64().unwrap())
            })
            .collect()
    }

    fn pushed(all: &[Vec<u8>]) -> Vec<u64> {
        seqs(all).into_iter().map(|s| s.1).collect()
    }

    /// The read-back's answer made before the job's second chunk was
    /// buffered reaches the dialect after that chunk's notification (the
    /// agent buffers, then notifies; the answer was made before): the
    /// chunk was dropped as being read back, the empty answer must not end
    /// the catch-up (it did: the exit and close were pushed as 3 and 4,
    /// chunk 2 never).
    #[test]
    fn a_chunk_overtaking_an_empty_read_back_is_read_again() {
        let (mut g, heard) = started(|g| {
            assert!(g.chunk("proc-1", 0, "stdout", b"c0").lines.is_empty());
        });
        assert!(heard, "heard of before the answer");
        let mut out = Vec::new();
        // First read-back: chunk 0.
        assert_eq!(g.read_from("j"), Some(("proc-1".into(), None)));
        let (lines, done) = g.read_back("j", answer(&[0], 1)).unwrap();
        out.extend(lines);
        assert!(!done);
        // The second read-back is answered (nothing past 0, next seq 1),
        // then chunk 1 is buffered and notified, then the job exits; the
        // dialect hears the notification and the exit first.
        assert_eq!(g.read_from("j"), Some(("proc-1".into(), Some(0))));
        let s = g.chunk("proc-1", 1, "stderr", b"c1");
        assert!(s.lines.is_empty() && s.catch_up.is_none());
        let s = g.exited(exit(1));
        assert!(s.lines.is_empty() && s.catch_up.is_none());
        let (lines, done) = g.read_back("j", answer(&[], 1)).unwrap();
        out.extend(lines);
        assert!(!done, "ended before chunk 1: {:?}", seqs(&out));
        // Read again: chunk 1, then nothing more; the exit and close follow.
        assert_eq!(g.read_from("j"), Some(("proc-1".into(), Some(0))));
        let (lines, done) = g.read_back("j", answer(&[1], 2)).unwrap();
        out.extend(lines);
        assert!(!done);
        let (lines, done) = g.read_back("j", answer(&[], 2)).unwrap();
        out.extend(lines);
        assert!(done);
        assert_eq!(pushed(&out), [1, 2, 3, 4], "{:?}", seqs(&out));
        // Live again: nothing more is pushed for the job.
        assert!(g.exited(exit(1)).lines.is_empty());
    }

    /// The same overtaking on a gap's catch-up with no exit yet: the
    /// catch-up does not end (and push live again) before the dropped
    /// chunk; later chunks are live.
    #[test]
    fn a_gap_catch_up_ends_past_every_chunk_dropped() {
        let (mut g, heard) = started(|_| {});
        assert!(!heard);
        let mut out = g.chunk("proc-1", 0, "stdout", b"c0").lines;
        let s = g.chunk("proc-1", 2, "stdout", b"c2");
        assert_eq!(s.catch_up.as_deref(), Some("j"));
        // Chunk 3 is heard while the read-back (made before it) is on its
        // way.
        assert!(g.chunk("proc-1", 3, "stderr", b"c3").lines.is_empty());
        let (lines, done) = g.read_back("j", answer(&[1, 2], 3)).unwrap();
        out.extend(lines);
        assert!(!done);
        let (lines, done) = g.read_back("j", answer(&[], 3)).unwrap();
        out.extend(lines);
        assert!(!done, "ended before chunk 3: {:?}", seqs(&out));
        let (lines, _) = g.read_back("j", answer(&[3], 4)).unwrap();
        out.extend(lines);
        let (lines, done) = g.read_back("j", answer(&[], 4)).unwrap();
        out.extend(lines);
        assert!(done);
        out.extend(g.chunk("proc-1", 4, "stdout", b"c4").lines);
        out.extend(g.exited(exit(4)).lines);
        assert_eq!(pushed(&out), [1, 2, 3, 4, 5, 6, 7], "{:?}", seqs(&out));
    }

    /// A chunk the job's buffer no longer holds (the answer's next seq is
    /// past it) is a gap, not a reason to read forever; a failed read
    /// ends the catch-up too, releasing the exit.
    #[test]
    fn a_chunk_gone_from_the_buffer_or_a_failed_read_ends_the_catch_up() {
        let (mut g, _) = started(|g| {
            g.chunk("proc-1", 0, "stdout", b"c0");
            g.exited(exit(5));
        });
        let (lines, done) = g.read_back("j", answer(&[], 6)).unwrap();
        assert!(done);
        assert_eq!(pushed(&lines), [7, 8]);

        let (mut g, _) = started(|g| {
            g.chunk("proc-1", 0, "stdout", b"c0");
            g.exited(exit(0));
        });
        let (lines, done) = g.read_back("j", None).unwrap();
        assert!(done);
        assert_eq!(pushed(&lines), [2, 3]);
    }

    /// A lag notice names a chunk the catch-up must reach.
    #[test]
    fn a_lag_notice_names_a_chunk_the_catch_up_reaches() {
        let (mut g, _) = started(|_| {});
        let mut out = g.chunk("proc-1", 0, "stdout", b"c0").lines;
        let lag = ProcessLagged {
            process_id: "proc-1".into(),
            next_seq: 1,
        };
        assert_eq!(g.lagged(&lag).catch_up.as_deref(), Some("j"));
        let (lines, done) = g.read_back("j", answer(&[], 1)).unwrap();
        out.extend(lines);
        assert!(!done);
        let (lines, _) = g.read_back("j", answer(&[1], 2)).unwrap();
        out.extend(lines);
        let (lines, done) = g.read_back("j", answer(&[], 2)).unwrap();
        out.extend(lines);
        assert!(done);
        assert_eq!(pushed(&out), [1, 2]);
    }
}
