//! The differential harness of the Codex dialect: JSON-RPC scenarios (lines
//! to send, messages to wait for) run against a stdio exec-server (the
//! reference `codex exec-server` or `executor codex-exec-server`), each
//! recorded as a normalized transcript that two servers can be compared
//! on line by line, and a golden file holding the reference's.
//!
//! Normalization (what may differ between runs and servers without
//! meaning anything): values the scenario captures (the server's session
//! ids) become `<NAME>`; the run's directories, the loopback HTTP server's
//! address and the reference's install directory become `{ws}`, `{home}`,
//! `{http}` and `{codex}`; other UUIDs `<uuid>`; times (`*AtMs`), the
//! `executorVersion`, `providerId`, `hostname` and an HTTP `date` header
//! `<...>`; base64 fields are decoded (`chunk@text` when UTF-8). Keys are
//! sorted. Uses the crate's HTTP server and Codex helpers.

use crate::codex::{unbase64, RunDir, Server};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin};
use tokio::sync::mpsc;

/// How long a wait for one message lasts before the transcript records
/// that it never came.
pub const MESSAGE_WAIT: Duration = Duration::from_secs(10);

/// Which message an [`Step::Expect`] claims.
#[derive(Debug, Clone)]
pub enum Match {
    /// The response to the request with this id.
    Response(Value),
    /// A notification of this method.
    Notification(&'static str),
    /// A notification of this method whose `params.processId` (or
    /// `params.requestId`) is this.
    NotificationFor(&'static str, &'static str),
}

impl Match {
    fn matches(&self, v: &Value) -> bool {
        match self {
            Match::Response(id) => v.get("method").is_none() && v.get("id") == Some(id),
            Match::Notification(m) => v.get("id").is_none() && v["method"] == *m,
            Match::NotificationFor(m, who) => {
                v.get("id").is_none()
                    && v["method"] == *m
                    && (v["params"]["processId"] == *who || v["params"]["requestId"] == *who)
            }
        }
    }
}

/// A check of executor's line where it deliberately differs from the
/// reference (`why` says how).
#[derive(Clone)]
pub struct ExecutorCheck(pub std::sync::Arc<CheckFn>);

/// The function inside an [`ExecutorCheck`].
pub type CheckFn = dyn Fn(&Value) -> Result<(), String> + Send + Sync;

impl ExecutorCheck {
    pub fn new(f: impl Fn(&Value) -> Result<(), String> + Send + Sync + 'static) -> ExecutorCheck {
        ExecutorCheck(std::sync::Arc::new(f))
    }
}

impl std::fmt::Debug for ExecutorCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ExecutorCheck")
    }
}

/// One step of a scenario.
#[derive(Debug, Clone)]
pub enum Step {
    /// Write this line (placeholders `{ws}`, `{wsuri}`, `{http}` and
    /// captured `{NAME}`s are filled in).
    Send(String),
    /// Claim the first received message that matches (in arrival order)
    /// and record it.
    Expect(Match),
    /// As `Expect`, but executor's message is checked by `check` instead of
    /// being compared with the reference's.
    ExpectDiffering {
        m: Match,
        why: &'static str,
        check: ExecutorCheck,
    },
    /// As `Expect`, with the values at these JSON pointers masked (for
    /// both servers: where the reference itself varies).
    ExpectMasked(Match, &'static [&'static str]),
    /// A message only executor sends, where it does better than the
    /// reference (`why` says how): on executor the first message `m`
    /// matches is claimed and must be exactly `want` (normalized, its
    /// seqs kept), recorded as a `+` line that the comparison with the
    /// golden steps over; the reference records nothing here and must
    /// never send `want` (its run reports it if it does).
    ExecutorOnly {
        m: Match,
        why: &'static str,
        want: Value,
    },
    /// Remember the value at this JSON pointer of the message the `Expect`
    /// just before claimed as `{NAME}` (and normalize it to `<NAME>`, in
    /// that message too).
    Capture(&'static str, &'static str),
    /// Wait for the server to close its stdout.
    ExpectEof,
    /// Close the server's stdin and wait for it to exit.
    CloseStdin,
    /// Start a new connection (a new server process).
    Reconnect,
    Sleep(u64),
}

/// A named scenario; `executor_masks` are JSON pointers masked in both
/// transcripts before executor's is compared with the golden (fields
/// where executor differs on purpose, e.g. the capabilities it
/// advertises).
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: &'static str,
    pub steps: Vec<Step>,
    pub executor_masks: &'static [&'static str],
}

/// One transcript line and, for a deliberately differing line, executor's
/// check.
#[derive(Debug, Clone)]
pub struct Line {
    pub text: String,
    pub differing: Option<(&'static str, ExecutorCheck)>,
    /// For a line only executor sends ([`Step::ExecutorOnly`]): why, and
    /// the line it must be exactly.
    pub executor_only: Option<(&'static str, String)>,
}

impl Line {
    /// A line compared with the golden's.
    pub fn plain(text: impl Into<String>) -> Line {
        Line {
            text: text.into(),
            differing: None,
            executor_only: None,
        }
    }
}

/// A scenario's recorded, normalized transcript.
#[derive(Debug, Clone)]
pub struct Transcript {
    pub lines: Vec<Line>,
    /// Messages the reference sent that the scenario declares executor's
    /// alone (empty for executor's transcript).
    pub reference_sent_executor_only: Vec<String>,
}

impl Transcript {
    /// The golden file's text.
    pub fn text(&self) -> String {
        let mut s = String::new();
        for l in &self.lines {
            s.push_str(&l.text);
            s.push('\n');
        }
        s
    }
}

/// The directory of the golden transcripts.
pub fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/codex/diff")
}

/// The environment every server of a scenario gets (nothing else).
fn server_env(dir: &RunDir) -> Vec<(String, String)> {
    let home = dir.home.display().to_string();
    vec![
        ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
        ("HOME".into(), home.clone()),
        ("CODEX_HOME".into(), home),
        ("LANG".into(), "C.UTF-8".into()),
        ("DIFF_VISIBLE".into(), "visible-value".into()),
        ("DIFF_TOKEN".into(), "token-from-the-server-env".into()),
        ("DIFF_OTHER".into(), "other-value".into()),
    ]
}

/// A stdio server connection: its lines arrive on a channel (`None` at
/// EOF).
struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
    rx: mpsc::UnboundedReceiver<Option<String>>,
    eof: bool,
    pending: Vec<String>,
}

impl Peer {
    fn spawn(server: Server, codex: &Path, dir: &RunDir) -> Peer {
        let mut cmd = match server {
            Server::Reference { .. } => {
                let mut c = tokio::process::Command::new(codex);
                c.arg("exec-server");
                c
            }
            Server::Executor { .. } => {
                let mut c = tokio::process::Command::new(crate::executor_bin());
                c.arg("codex-exec-server");
                c
            }
        };
        cmd.args(["--listen", "stdio"])
            .current_dir(&dir.workspace)
            .env_clear()
            .envs(server_env(dir))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn the exec-server");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                if tx.send(Some(l)).is_err() {
                    return;
                }
            }
            let _ = tx.send(None);
        });
        Peer {
            child,
            stdin,
            rx,
            eof: false,
            pending: Vec::new(),
        }
    }

    async fn send(&mut self, line: &str) -> bool {
        let Some(stdin) = self.stdin.as_mut() else {
            return false;
        };
        let mut b = line.as_bytes().to_vec();
        b.push(b'\n');
        stdin.write_all(&b).await.is_ok() && stdin.flush().await.is_ok()
    }

    /// The next line within `within` (`None` at EOF or timeout).
    async fn next(&mut self, within: Duration) -> Option<String> {
        if self.eof {
            return None;
        }
        match tokio::time::timeout(within, self.rx.recv()).await {
            Ok(Some(Some(l))) => Some(l),
            Ok(_) => {
                self.eof = true;
                None
            }
            Err(_) => None,
        }
    }

    /// Claim the first pending or arriving line that parses to a message
    /// `m` matches.
    async fn claim(&mut self, m: &Match) -> Option<String> {
        if let Some(i) = self.pending.iter().position(|l| {
            serde_json::from_str::<Value>(l)
                .map(|v| m.matches(&v))
                .unwrap_or(false)
        }) {
            return Some(self.pending.remove(i));
        }
        let deadline = tokio::time::Instant::now() + MESSAGE_WAIT;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let l = self.next(left).await?;
            if serde_json::from_str::<Value>(&l)
                .map(|v| m.matches(&v))
                .unwrap_or(false)
            {
                return Some(l);
            }
            self.pending.push(l);
        }
    }

    /// Wait up to `within` for the connection to end: stdout closed or
    /// the server exited (a helper may hold its stdout a little longer).
    /// Lines that arrive meanwhile stay pending.
    async fn wait_end(&mut self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.eof || matches!(self.child.try_wait(), Ok(Some(_))) {
                return true;
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            if let Some(l) = self.next(left.min(Duration::from_millis(50))).await {
                self.pending.push(l);
            }
        }
    }

    /// Everything that arrives within `within`.
    async fn settle(&mut self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return;
            }
            match self.next(left).await {
                Some(l) => self.pending.push(l),
                None => return,
            }
        }
    }

    async fn close_and_wait(&mut self) -> Option<i32> {
        self.stdin.take();
        let st = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
        match st {
            Ok(Ok(s)) => s.code(),
            _ => {
                let _ = self.child.start_kill();
                None
            }
        }
    }
}

/// Replaces run-specific text with stable names.
struct Normalizer {
    /// (text, replacement), longest first.
    subs: Vec<(String, String)>,
}

impl Normalizer {
    fn new(dir: &RunDir, http: &str, codex: &Path) -> Normalizer {
        let mut subs = vec![
            (dir.workspace.display().to_string(), "{ws}".to_string()),
            (dir.home.display().to_string(), "{home}".to_string()),
            (dir.root.display().to_string(), "{root}".to_string()),
            (http.to_string(), "{http}".to_string()),
            (
                http.trim_start_matches("http://").to_string(),
                "{httphost}".to_string(),
            ),
        ];
        // The reference's install prefix (its node_modules directory).
        if let Some(prefix) = codex.canonicalize().ok().and_then(|c| {
            c.ancestors()
                .find(|a| a.file_name().is_some_and(|n| n == "node_modules"))
                .map(Path::to_path_buf)
        }) {
            subs.push((prefix.display().to_string(), "{codex}".to_string()));
        }
        let mut n = Normalizer { subs };
        n.sort();
        n
    }

    fn sort(&mut self) {
        self.subs.sort_by_key(|s| std::cmp::Reverse(s.0.len()));
    }

    fn capture(&mut self, name: &str, value: &str) {
        if !value.is_empty() {
            self.subs.push((value.to_string(), format!("<{name}>")));
            self.sort();
        }
    }

    fn text(&self, s: &str) -> String {
        let mut s = s.to_string();
        for (from, to) in &self.subs {
            s = s.replace(from.as_str(), to);
        }
        strip_launcher_env(&replace_uuids(&s))
    }

    /// A line (sent or received) in normalized form.
    fn line(&self, raw: &str) -> String {
        self.line_with(raw, true)
    }

    /// A line in normalized form with its seqs as they are (for lines
    /// that are not compared with the other server's).
    fn line_keeping_seqs(&self, raw: &str) -> String {
        self.line_with(raw, false)
    }

    fn line_with(&self, raw: &str, mask_seqs: bool) -> String {
        match serde_json::from_str::<Value>(raw) {
            Ok(mut v) => {
                normalize_value(&mut v, mask_seqs);
                self.text(&v.to_string())
            }
            Err(_) => format!("RAW {}", self.text(raw)),
        }
    }
}

const BASE64_KEYS: &[&str] = &["chunk", "dataBase64", "bodyBase64", "deltaBase64"];

fn normalize_value(v: &mut Value, mask_seqs: bool) {
    match v {
        Value::Object(map) => {
            let keys: Vec<String> = map.keys().cloned().collect();
            for k in keys {
                if BASE64_KEYS.contains(&k.as_str()) {
                    if let Some(Value::String(b64)) = map.get(&k) {
                        if let Some(text) = unbase64(b64).and_then(|b| String::from_utf8(b).ok()) {
                            map.remove(&k);
                            map.insert(format!("{k}@text"), Value::String(text));
                            continue;
                        }
                    }
                }
                let masked = match k.as_str() {
                    // A process's seqs: its exit races its last output in
                    // the reference, so the order is checked apart
                    // (`SeqLog`) and the values masked.
                    "seq"
                        if mask_seqs
                            && (map.contains_key("processId") || map.contains_key("stream")) =>
                    {
                        Some("<seq>")
                    }
                    "executorVersion" => Some("<version>"),
                    "providerId" => Some("<provider-id>"),
                    "hostname" => Some("<hostname>"),
                    k if k.ends_with("AtMs") && map[k].is_number() => Some("<ms>"),
                    _ => None,
                };
                if let Some(m) = masked {
                    map.insert(k, json!(m));
                    continue;
                }
                if let Some(child) = map.get_mut(&k) {
                    normalize_value(child, mask_seqs);
                }
            }
            // An HTTP header `{name: "date", value}`.
            if map
                .get("name")
                .and_then(Value::as_str)
                .is_some_and(|n| n.eq_ignore_ascii_case("date"))
                && map.contains_key("value")
            {
                map.insert("value".into(), json!("<date>"));
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|i| normalize_value(i, mask_seqs)),
        _ => {}
    }
    // An HTTP `content-length`: bodies hold normalized paths.
    if v.get("name")
        .and_then(Value::as_str)
        .is_some_and(|n| n.eq_ignore_ascii_case("content-length"))
        && v.get("value").is_some()
    {
        v["value"] = json!("<len>");
    }
    // A directory's size is the file system's.
    if v.get("isDirectory") == Some(&Value::Bool(true))
        && v.get("size").is_some_and(Value::is_number)
    {
        v["size"] = json!("<dir-size>");
    }
    // Directory listings and walks: their order is the file system's.
    if let Some(Value::Array(entries)) = v.get_mut("entries") {
        entries.sort_by_key(|e| e.to_string());
    }
}

/// Whether `s` is an `8-4-4-4-12` hex UUID.
fn is_uuid(s: &[u8]) -> bool {
    s.len() == 36
        && s.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// Each UUID in `s` (not inside a longer word) as `<uuid>`.
fn replace_uuids(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    let mut copied = 0;
    while i + 36 <= b.len() {
        let starts = i == 0 || !b[i - 1].is_ascii_alphanumeric();
        let ends = i + 36 == b.len() || !b[i + 36].is_ascii_alphanumeric();
        if starts && ends && is_uuid(&b[i..i + 36]) {
            out.push_str(&s[copied..i]);
            out.push_str("<uuid>");
            i += 36;
            copied = i;
        } else {
            i += 1;
        }
    }
    out.push_str(&s[copied..]);
    out
}

/// What the reference's npm launcher adds to its server's environment
/// (and so to an inheriting command's), not part of the protocol: the
/// `CODEX_MANAGED_*` variables and the PATH entries of its bundled helpers
/// (`{codex}/…/codex-path` and a random `{home}/tmp/arg0-linux/codex-arg0XXXXXX`).
fn strip_launcher_env(s: &str) -> String {
    let mut s = s
        .replace("CODEX_MANAGED_BY_NPM=1\\n", "")
        .replace("CODEX_MANAGED_PACKAGE_ROOT={codex}/@openai/codex\\n", "")
        .replace(
            "{codex}/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/codex-path:",
            "",
        );
    let marker = "{home}/tmp/arg0-linux/codex-arg0";
    while let Some(at) = s.find(marker) {
        let rest = &s[at + marker.len()..];
        let end = rest.find(':').map_or(rest.len(), |e| e + 1);
        s.replace_range(at..at + marker.len() + end, "");
    }
    s
}

/// The seqs each process's notifications carried, in arrival order.
#[derive(Default)]
struct SeqLog(BTreeMap<String, Vec<(String, u64)>>);

impl SeqLog {
    fn note(&mut self, raw: &str) {
        let Ok(v) = serde_json::from_str::<Value>(raw) else {
            return;
        };
        let (Some(method), Some(id), Some(seq)) = (
            v["method"].as_str(),
            v["params"]["processId"].as_str(),
            v["params"]["seq"].as_u64(),
        ) else {
            return;
        };
        self.0
            .entry(id.to_string())
            .or_default()
            .push((method.to_string(), seq));
    }

    /// One line per process: its seqs are 1..=n without a gap or a
    /// repeat, each stream's output in increasing order, `process/closed`
    /// last.
    fn verdicts(&self) -> Vec<String> {
        self.0
            .iter()
            .map(|(id, seen)| {
                let mut seqs: Vec<u64> = seen.iter().map(|(_, s)| *s).collect();
                seqs.sort_unstable();
                let contiguous = seqs.iter().enumerate().all(|(i, s)| *s == i as u64 + 1);
                let outputs: Vec<u64> = seen
                    .iter()
                    .filter(|(m, _)| m == "process/output")
                    .map(|(_, s)| *s)
                    .collect();
                let ordered = outputs.windows(2).all(|w| w[0] < w[1]);
                let closed_last = seen
                    .iter()
                    .find(|(m, _)| m == "process/closed")
                    .is_none_or(|(_, s)| Some(s) == seqs.last());
                let kinds: Vec<&str> = seen
                    .iter()
                    .map(|(m, _)| m.trim_start_matches("process/"))
                    .collect();
                if contiguous && ordered && closed_last {
                    format!("# seqs of {id}: 1..={} ({})", seqs.len(), kinds.join(" "))
                } else {
                    format!("! seqs of {id}: {seen:?}")
                }
            })
            .collect()
    }
}

/// Fill `{NAME}` placeholders of a line to send.
fn fill(line: &str, vars: &BTreeMap<String, String>) -> String {
    let mut s = line.to_string();
    for (k, v) in vars {
        s = s.replace(&format!("{{{k}}}"), v);
    }
    s
}

/// Run `scenario` against `server` once and return its transcript. `None`
/// when the Codex CLI (needed for the reference, and for the normalizing
/// of its install directory) is missing, after the skip helper.
pub async fn run(scenario: &Scenario, server: Server) -> Option<Transcript> {
    let codex = crate::codex::codex_bin()?;
    let dir = RunDir::new(&format!("diff-{}", scenario.name));
    let http = crate::http::TestServer::start().await;
    let http_base = http.url("");
    let mut norm = Normalizer::new(&dir, &http_base, &codex);
    let mut vars = BTreeMap::from([
        ("ws".to_string(), dir.workspace.display().to_string()),
        (
            "wsuri".to_string(),
            format!("file://{}", dir.workspace.display()),
        ),
        ("http".to_string(), http_base.clone()),
    ]);
    let is_executor = matches!(server, Server::Executor { .. });
    let mut lines = Vec::new();
    // Every received line, raw: the reference's are checked against the
    // scenario's executor-only messages at the end.
    let mut received: Vec<String> = Vec::new();
    let mut push = |line: Line| lines.push(line);
    let mut peer = Peer::spawn(server, &codex, &dir);
    let mut seqs = SeqLog::default();
    for (i, step) in scenario.steps.iter().enumerate() {
        match step {
            Step::Send(l) => {
                let l = fill(l, &vars);
                // A write into a connection that ended is not recorded as
                // such (when the server's exit is seen is a race); the
                // waits that follow record the end.
                let _ = peer.send(&l).await;
                push(Line::plain(format!("> {}", norm.line(&l))));
            }
            Step::Expect(m) | Step::ExpectDiffering { m, .. } | Step::ExpectMasked(m, _) => {
                let masks: &[&str] = match step {
                    Step::ExpectMasked(_, masks) => masks,
                    _ => &[],
                };
                let differing = match step {
                    Step::ExpectDiffering { why, check, .. } => Some((*why, check.clone())),
                    _ => None,
                };
                match peer.claim(m).await {
                    Some(l) => {
                        seqs.note(&l);
                        let v: Value = serde_json::from_str(&l).unwrap_or(Value::Null);
                        // A capture right after applies to this line too.
                        if let Some(Step::Capture(name, pointer)) = scenario.steps.get(i + 1) {
                            let captured = match v.pointer(pointer) {
                                Some(Value::String(s)) => s.clone(),
                                Some(other) => other.to_string(),
                                None => String::new(),
                            };
                            norm.capture(name, &captured);
                            vars.insert((*name).to_string(), captured);
                        }
                        push(Line {
                            text: mask(&format!("< {}", norm.line(&l)), masks),
                            differing,
                            executor_only: None,
                        });
                        received.push(l);
                    }
                    None => {
                        // Whether the server had closed its end by then
                        // or not is its timing, not its answer.
                        push(Line {
                            text: format!("! no message {m:?}"),
                            differing,
                            executor_only: None,
                        });
                    }
                }
            }
            // The reference records nothing here (what it sends is
            // checked at the end).
            Step::ExecutorOnly { .. } if !is_executor => {}
            Step::ExecutorOnly { m, why, want } => {
                // Kept apart from the compared seqs: `want` states them.
                let text = match peer.claim(m).await {
                    Some(l) => format!("+ {}", norm.line_keeping_seqs(&l)),
                    None => format!("! no message {m:?}"),
                };
                push(Line {
                    text,
                    differing: None,
                    executor_only: Some((*why, want.to_string())),
                });
            }
            // Done with the `Expect` before it.
            Step::Capture(..) => {}
            Step::ExpectEof => {
                let ended = peer.wait_end(MESSAGE_WAIT).await;
                flush_pending(&mut peer, &norm, &mut seqs, &mut received, &mut push);
                push(Line::plain(if ended {
                    "# connection ended"
                } else {
                    "! the connection did not end"
                }));
            }
            Step::CloseStdin => {
                peer.settle(Duration::from_millis(200)).await;
                flush_pending(&mut peer, &norm, &mut seqs, &mut received, &mut push);
                let code = peer.close_and_wait().await;
                push(Line::plain(format!("# stdin closed; exit {code:?}")));
            }
            Step::Reconnect => {
                peer = Peer::spawn(server, &codex, &dir);
                push(Line::plain("# new connection"));
            }
            Step::Sleep(ms) => tokio::time::sleep(Duration::from_millis(*ms)).await,
        }
    }
    peer.settle(Duration::from_millis(200)).await;
    flush_pending(&mut peer, &norm, &mut seqs, &mut received, &mut push);
    let code = peer.close_and_wait().await;
    for v in seqs.verdicts() {
        push(Line::plain(v));
    }
    push(Line::plain(format!("# end; exit {code:?}")));
    let reference_sent_executor_only = if is_executor {
        Vec::new()
    } else {
        executor_only_sent(scenario, &norm, &received)
    };
    Some(Transcript {
        lines,
        reference_sent_executor_only,
    })
}
/// Record what arrived unclaimed, sorted (its order is not meaningful).
fn flush_pending(
    peer: &mut Peer,
    norm: &Normalizer,
    seqs: &mut SeqLog,
    received: &mut Vec<String>,
    push: &mut impl FnMut(Line),
) {
    let mut rest: Vec<String> = peer
        .pending
        .drain(..)
        .map(|l| {
            seqs.note(&l);
            let text = format!("<? {}", norm.line(&l));
            received.push(l);
            text
        })
        .collect();
    rest.sort();
    for l in rest {
        push(Line::plain(l));
    }
}

/// The scenario's executor-only messages that are among `received` (the
/// reference's lines): each one a sentence.
fn executor_only_sent(scenario: &Scenario, norm: &Normalizer, received: &[String]) -> Vec<String> {
    let got: Vec<String> = received.iter().map(|l| norm.line_keeping_seqs(l)).collect();
    scenario
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::ExecutorOnly { why, want, .. } => {
                let want = want.to_string();
                got.contains(&want).then(|| {
                    format!("the reference sent {want}, declared executor's alone ({why})")
                })
            }
            _ => None,
        })
        .collect()
}

/// Mask the values at `pointers` of a transcript line's message.
fn mask(text: &str, pointers: &[&str]) -> String {
    let Some((prefix, json)) = text.split_once(' ') else {
        return text.to_string();
    };
    let Ok(mut v) = serde_json::from_str::<Value>(json) else {
        return text.to_string();
    };
    for p in pointers {
        if let Some(x) = v.pointer_mut(p) {
            *x = json!("<masked>");
        }
    }
    format!("{prefix} {v}")
}

/// Compare executor's transcript with the reference's golden text:
/// masked pointers ignored, a declared difference checked by its check,
/// an executor-only line checked to be exactly the declared one and
/// stepped over (the golden's next line is compared with executor's line
/// after it). The differences, one message each (empty when they agree);
/// line numbers are executor's transcript's.
pub fn compare(scenario: &Scenario, golden: &str, executor: &Transcript) -> Vec<String> {
    let want: Vec<&str> = golden.lines().collect();
    let mut diffs = Vec::new();
    let mut w_at = 0;
    for (i, got) in executor.lines.iter().enumerate() {
        let n = i + 1;
        if let Some((why, line)) = &got.executor_only {
            let expected = format!("+ {line}");
            if got.text != expected {
                diffs.push(format!(
                    "line {n}: executor-only ({why})\n  expected {expected}\n  executor {}",
                    got.text
                ));
            }
            continue;
        }
        let w = want.get(w_at).copied().unwrap_or("<missing>");
        w_at += 1;
        if let Some((why, check)) = &got.differing {
            let json = got.text.split_once(' ').map(|(_, j)| j).unwrap_or("");
            let v: Value = serde_json::from_str(json).unwrap_or(Value::Null);
            if let Err(e) = (check.0)(&v) {
                diffs.push(format!(
                    "line {n}: executor differs on purpose ({why}) but: {e}\n  executor {}",
                    got.text
                ));
            }
            continue;
        }
        let (w, g) = (
            mask(w, scenario.executor_masks),
            mask(&got.text, scenario.executor_masks),
        );
        if w != g {
            diffs.push(format!("line {n}: reference {w}\n  executor {g}"));
        }
    }
    for w in want.iter().skip(w_at) {
        diffs.push(format!("reference {w}\n  executor <missing>"));
    }
    diffs
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference's run reports a message the scenario declares
    /// executor's alone, matched exactly with its seqs (the same message
    /// with another seq is not it).
    #[test]
    fn a_reference_sending_an_executor_only_line_is_reported() {
        let scenario = Scenario {
            name: "self-test",
            steps: vec![Step::ExecutorOnly {
                m: Match::NotificationFor("process/closed", "p"),
                why: "better",
                want: json!({"method": "process/closed", "params": {"processId": "p", "seq": 5}}),
            }],
            executor_masks: &[],
        };
        let norm = Normalizer { subs: Vec::new() };
        let other = r#"{"method":"process/closed","params":{"seq":4,"processId":"p"}}"#;
        assert!(executor_only_sent(&scenario, &norm, &[other.to_string()]).is_empty());
        let same = r#"{"params":{"seq":5,"processId":"p"},"method":"process/closed"}"#;
        let sent = executor_only_sent(&scenario, &norm, &[other.to_string(), same.to_string()]);
        assert_eq!(sent.len(), 1, "{sent:?}");
        assert!(
            sent[0].contains("declared executor's alone (better)"),
            "{sent:?}"
        );
    }
}
