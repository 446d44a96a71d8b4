//! The audit log: one JSON line per request, to a file (`[audit] file`)
//! and/or syslog (`[audit] syslog`, the `/dev/log` socket that journald
//! also serves). Never on stdout.
//!
//! An event names the request (method, id), its outcome (`ok` or the
//! error code), its duration, the session, the profile and where the SSH
//! connection came from (`SSH_CLIENT`, `SSH_CONNECTION`): the agent's own
//! fields. What the request acted on comes from what the agent validated
//! and did, never from the raw params: the decoded params' targets
//! ([`Audited`]: argv, cwd, path, URL without query or credentials) and
//! what the handlers report while the request runs ([`Notes`]: the pid of
//! a job spawned, `sandboxed` from the policy enforced). A key a client
//! adds to its params never reaches those fields; when the params were
//! not decoded (the request was refused before), what they claimed is
//! described under `request`, a nested object that cannot shadow them.
//! It never holds secrets: no resume token, no environment values, no
//! request or file data, no header values, no stdin text.

use crate::config::AuditConfig;
use executor_protocol::ErrorCode;
use rmpv::Value;
use serde_json::{json, Map, Value as Json};
use std::future::Future;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Where audit events go; a no-op when nothing is configured.
#[derive(Debug)]
pub struct Audit {
    file: Option<Mutex<std::fs::File>>,
    syslog: Option<std::os::unix::net::UnixDatagram>,
    origin: Map<String, Json>,
}

/// authpriv.info
const SYSLOG_PRI: u8 = 10 * 8 + 6;

impl Audit {
    /// A log that records nothing.
    pub fn disabled() -> Audit {
        Audit {
            file: None,
            syslog: None,
            origin: Map::new(),
        }
    }

    /// Open the configured sinks. A file that cannot be opened is an error
    /// (the agent must not run unaudited when auditing was asked for).
    /// A file it creates is readable by its owner only (the log names
    /// paths, commands and hosts).
    pub fn open(cfg: &AuditConfig, profile: Option<&str>) -> Result<Audit, String> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = match &cfg.file {
            Some(path) => Some(Mutex::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .mode(0o600)
                    .open(path)
                    .map_err(|e| format!("audit file {}: {e}", path.display()))?,
            )),
            None => None,
        };
        let syslog = if cfg.syslog {
            let s = std::os::unix::net::UnixDatagram::unbound()
                .and_then(|s| s.connect("/dev/log").map(|()| s))
                .map_err(|e| format!("audit syslog /dev/log: {e}"))?;
            Some(s)
        } else {
            None
        };
        let mut origin = Map::new();
        if file.is_none() && syslog.is_none() {
            return Ok(Audit {
                file,
                syslog,
                origin,
            });
        }
        for (key, var) in [
            ("ssh_client", "SSH_CLIENT"),
            ("ssh_connection", "SSH_CONNECTION"),
        ] {
            if let Ok(v) = std::env::var(var) {
                origin.insert(key.into(), Json::String(v));
            }
        }
        origin.insert(
            "user".into(),
            Json::String(
                nix::unistd::User::from_uid(nix::unistd::getuid())
                    .ok()
                    .flatten()
                    .map(|u| u.name)
                    .unwrap_or_default(),
            ),
        );
        origin.insert("agent_pid".into(), json!(std::process::id()));
        if let Some(p) = profile {
            origin.insert("profile".into(), Json::String(p.into()));
        }
        Ok(Audit {
            file,
            syslog,
            origin,
        })
    }

    /// Whether events are recorded at all.
    pub fn enabled(&self) -> bool {
        self.file.is_some() || self.syslog.is_some()
    }

    /// Record one request's outcome.
    pub fn record(&self, event: Event<'_>) {
        if !self.enabled() {
            return;
        }
        // The agent's own fields: nothing a request says can shadow them,
        // and they come first in the line (a sink that cuts a long line
        // keeps them).
        let mut own = self.origin.clone();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        own.insert("ts_ms".into(), json!(now.as_millis() as u64));
        if let Some(s) = event.session_id {
            own.insert("session_id".into(), json!(s));
        }
        own.insert("method".into(), json!(event.method));
        if let Some(id) = event.id {
            own.insert("id".into(), json!(id));
        }
        own.insert(
            "outcome".into(),
            json!(event.outcome.map_or("ok", |c| c.as_str())),
        );
        own.insert(
            "duration_us".into(),
            json!(event.elapsed.as_micros() as u64),
        );
        let mut details = event.details;
        details.retain(|k, _| !own.contains_key(k) && k != "truncated");
        let truncated = bound_details(&mut details);
        if !truncated.is_empty() {
            own.insert("truncated".into(), Json::Object(truncated));
        }
        let text = line_text(&own, &details);
        if let Some(f) = &self.file {
            let mut f = f.lock().expect("audit file lock");
            if let Err(e) = f.write_all(format!("{text}\n").as_bytes()) {
                tracing::error!(error = %e, "writing the audit log failed");
            }
        }
        if let Some(s) = &self.syslog {
            let msg = format!("<{SYSLOG_PRI}>executor[{}]: {text}", std::process::id());
            if let Err(e) = s.send(msg.as_bytes()) {
                tracing::error!(error = %e, "sending the audit event to syslog failed");
            }
        }
    }
}

/// The most bytes of one string a request supplied (an argv element, a
/// path) that a line keeps.
const FIELD_MAX: usize = 512;
/// The most bytes of strings one detail (all of an argv, all of
/// `request`) keeps.
const DETAIL_MAX: usize = 1024;

/// Cut every detail to [`FIELD_MAX`]/[`DETAIL_MAX`] so that a line stays
/// small enough for every sink (a syslog datagram over the socket's
/// buffer is refused whole, and daemons cut long messages): what was cut
/// is named in the result with its full size and SHA-256, so the line
/// still binds what the agent did.
fn bound_details(details: &mut Map<String, Json>) -> Map<String, Json> {
    let mut truncated = Map::new();
    for (key, value) in details.iter_mut() {
        let whole = value.to_string();
        let mut budget = DETAIL_MAX;
        if bound(value, &mut budget) {
            let digest = ring::digest::digest(&ring::digest::SHA256, whole.as_bytes());
            let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
            truncated.insert(key.clone(), json!({"bytes": whole.len(), "sha256": hex}));
        }
    }
    truncated
}

/// Cut `v`'s strings to [`FIELD_MAX`] and to what is left of `budget`,
/// an array's items past the budget dropped; whether anything was cut.
fn bound(v: &mut Json, budget: &mut usize) -> bool {
    match v {
        Json::String(s) => {
            let keep = FIELD_MAX.min(*budget);
            if s.len() <= keep {
                *budget -= s.len();
                return false;
            }
            let mut cut = keep;
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            s.truncate(cut);
            s.push('\u{2026}');
            *budget -= cut;
            true
        }
        Json::Array(items) => {
            let mut cut = false;
            let mut kept = 0;
            for item in items.iter_mut() {
                if *budget == 0 {
                    break;
                }
                cut |= bound(item, budget);
                kept += 1;
            }
            cut |= kept < items.len();
            items.truncate(kept);
            cut
        }
        Json::Object(m) => {
            let mut cut = false;
            for item in m.values_mut() {
                cut |= bound(item, budget);
            }
            cut
        }
        _ => false,
    }
}

/// One JSON object: `own`'s fields, then `details`' (no key is in both).
fn line_text(own: &Map<String, Json>, details: &Map<String, Json>) -> String {
    let mut text = Json::Object(own.clone()).to_string();
    if !details.is_empty() {
        let rest = Json::Object(details.clone()).to_string();
        text.pop(); // `}`
        text.push(',');
        text.push_str(&rest[1..]);
    }
    text
}

/// One request, as the audit log sees it.
#[derive(Debug)]
pub struct Event<'a> {
    pub session_id: Option<&'a str>,
    pub method: &'a str,
    pub id: Option<u64>,
    /// What the agent validated and did ([`Notes::take`]), and under
    /// `request` what undecoded params claimed ([`describe`]); the line's
    /// own fields are written over these.
    pub details: Map<String, Json>,
    pub outcome: Option<ErrorCode>,
    pub elapsed: Duration,
}

tokio::task_local! {
    static NOTES: Notes;
}

/// What the agent validated and did for one request, filled while its
/// handler runs (in the request's task: [`Notes::scope`]) by the dispatch
/// ([`note_params`]) and the handlers ([`note_sandboxed`],
/// [`note_spawned`]). Outside a scope (tests, the fuzzer) notes go
/// nowhere.
#[derive(Debug, Clone, Default)]
pub struct Notes(Arc<Mutex<Noted>>);

/// Where what is noted after a request's line was written goes (a job
/// whose start outlived its cancelled request): a line of its own.
pub type Late = Arc<dyn Fn(Map<String, Json>) + Send + Sync>;

#[derive(Default)]
struct Noted {
    fields: Map<String, Json>,
    decoded: bool,
    late: Option<Late>,
}

impl std::fmt::Debug for Noted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Noted")
            .field("fields", &self.fields)
            .field("decoded", &self.decoded)
            .field("closed", &self.late.is_some())
            .finish()
    }
}

impl Notes {
    /// Run `f` with this record as the current request's (when `on`:
    /// with the audit log off nothing is noted).
    pub async fn scope<F: Future>(&self, on: bool, f: F) -> F::Output {
        if on {
            NOTES.scope(self.clone(), f).await
        } else {
            f.await
        }
    }

    /// The current request's record, to carry into a task of its own
    /// (work that must finish whatever becomes of the request).
    pub fn current() -> Option<Notes> {
        NOTES.try_with(Notes::clone).ok()
    }

    /// Write the request's line with `write` (given the fields noted and
    /// whether the params were decoded); what is noted later (by work that
    /// outlived the request) goes to `late`. The record stays locked while
    /// `write` runs, so a late line always follows the request's own.
    pub fn close(&self, late: Late, write: impl FnOnce(Map<String, Json>, bool)) {
        let mut n = self.0.lock().expect("audit notes lock");
        n.late = Some(late);
        let fields = std::mem::take(&mut n.fields);
        write(fields, n.decoded);
    }
}

fn with_notes(f: impl FnOnce(&mut Noted)) {
    let _ = NOTES.try_with(|n| f(&mut n.0.lock().expect("audit notes lock")));
}

/// The decoded params of the current request: what it acts on, from the
/// fields the agent validated.
pub fn note_params<P: Audited>(params: &P) {
    with_notes(|n| {
        n.decoded = true;
        params.audit(&mut Details(&mut n.fields));
    });
}

/// Whether the current request runs under a sandbox policy the agent
/// enforces (the last word wins: a job whose plan degraded to nothing is
/// noted `false` after its policy was resolved).
pub fn note_sandboxed(enforced: bool) {
    with_notes(|n| {
        n.fields.insert("sandboxed".into(), json!(enforced));
    });
}

/// What of a job's intent was not enforced (`required: false`).
pub fn note_degraded(what: &[String]) {
    with_notes(|n| {
        n.fields.insert("sandbox_degraded".into(), json!(what));
    });
}

/// A job the current request spawned (after the request's line was
/// written, when its answer was `cancelled` meanwhile: a line of its own).
pub fn note_spawned(pid: u32, process_id: &str) {
    with_notes(|n| {
        let mut fields = Map::new();
        fields.insert("pid".into(), json!(pid));
        fields.insert("process_id".into(), json!(process_id));
        match &n.late {
            Some(late) => {
                fields.insert("after_answer".into(), json!(true));
                late(fields)
            }
            None => n.fields.extend(fields),
        }
    });
}

/// The current request was answered with an earlier one's outcome (an
/// `idempotency_key` or `write_id` seen before): it did nothing itself;
/// `job` is the job the earlier start made.
pub fn note_replayed(job: Option<(u32, &str)>) {
    with_notes(|n| {
        n.fields.insert("replayed".into(), json!(true));
        if let Some((pid, process_id)) = job {
            n.fields.insert("pid".into(), json!(pid));
            n.fields.insert("process_id".into(), json!(process_id));
        }
    });
}

/// Where a params type writes what it acts on.
#[derive(Debug)]
pub struct Details<'a>(&'a mut Map<String, Json>);

impl Details<'_> {
    fn path(&mut self, key: &str, p: &executor_protocol::WirePath) {
        self.0.insert(key.into(), Json::String(p.display()));
    }
    fn text(&mut self, key: &str, s: &str) {
        self.0.insert(key.into(), Json::String(s.into()));
    }
    fn num(&mut self, key: &str, n: u64) {
        self.0.insert(key.into(), json!(n));
    }
    fn names(&mut self, key: &str, names: Vec<&str>) {
        if !names.is_empty() {
            self.0.insert(key.into(), json!(names));
        }
    }
    fn argv(&mut self, argv: &[String]) {
        self.0.insert("argv".into(), json!(argv));
    }
    fn cwd(&mut self, cwd: Option<&executor_protocol::WirePath>) {
        if let Some(c) = cwd {
            self.path("cwd", c);
        }
    }
}

/// What a request's decoded params act on, for the audit line: every
/// request's params type implements it (the dispatch requires it), so a
/// method cannot be added without deciding what its line says.
pub trait Audited {
    fn audit(&self, d: &mut Details<'_>);
}

mod audited {
    use super::{Audited, Details};
    use executor_protocol::types::fs::Scoped;
    use executor_protocol::types::{exec, fs, http, process, session};

    macro_rules! audited {
        ($($t:ty => |$p:pat_param, $d:ident| $body:block)*) => {
            $(impl Audited for $t {
                fn audit(&self, $d: &mut Details<'_>) {
                    let $p = self;
                    $body
                }
            })*
        };
    }

    audited! {
        session::EnvironmentInfoParams => |_, _d| {}
        session::ToolsListParams => |_, _d| {}
        process::ProcessListParams => |_, _d| {}
        process::ProcessStartParams => |p, d| {
            d.argv(&p.argv);
            d.path("cwd", &p.cwd);
            d.0.insert("tty".into(), p.tty.into());
            if let Some(k) = &p.idempotency_key {
                d.text("idempotency_key", k);
            }
        }
        exec::ExecCommandParams => |p, d| {
            d.argv(&p.command);
            d.path("cwd", &p.cwd);
            d.0.insert("tty".into(), p.tty.into());
        }
        process::ProcessReadParams => |p, d| { d.text("process_id", &p.process_id) }
        process::ProcessWriteParams => |p, d| {
            d.text("process_id", &p.process_id);
            if let Some(w) = &p.write_id {
                d.text("write_id", w);
            }
        }
        process::ProcessSignalParams => |p, d| {
            d.text("process_id", &p.process_id);
            d.text("signal", p.signal.as_str());
        }
        process::ProcessResizeParams => |p, d| { d.text("process_id", &p.process_id) }
        exec::WriteStdinParams => |p, d| { d.text("process_id", &p.process_id) }
        fs::StatParams => |p, d| { d.path("path", &p.path); d.cwd(p.cwd()) }
        fs::CanonicalizeParams => |p, d| { d.path("path", &p.path); d.cwd(p.cwd()) }
        fs::ReadFileParams => |p, d| { d.path("path", &p.path); d.cwd(p.cwd()) }
        fs::WriteFileParams => |p, d| { d.path("path", &p.path); d.cwd(p.cwd()) }
        fs::CreateDirectoryParams => |p, d| { d.path("path", &p.path); d.cwd(p.cwd()) }
        fs::RemoveParams => |p, d| { d.path("path", &p.path); d.cwd(p.cwd()) }
        fs::RenameParams => |p, d| {
            d.path("from", &p.from);
            d.path("to", &p.to);
            d.cwd(p.cwd())
        }
        fs::CopyParams => |p, d| {
            d.path("source", &p.source);
            d.path("destination", &p.destination);
            d.cwd(p.cwd())
        }
        fs::WalkParams => |p, d| { d.path("root", &p.root); d.cwd(p.cwd()) }
        fs::ReadLinkParams => |p, d| { d.path("path", &p.path); d.cwd(p.cwd()) }
        fs::CreateSymlinkParams => |p, d| {
            d.path("path", &p.path);
            d.path("target", &p.target);
            d.cwd(p.cwd())
        }
        fs::OpenParams => |p, d| { d.path("path", &p.path); d.cwd(p.cwd()) }
        fs::OpenWriteParams => |p, d| { d.path("path", &p.path); d.cwd(p.cwd()) }
        fs::ReadBlockParams => |p, d| { d.num("handle", p.handle) }
        fs::PassDescriptorParams => |p, d| { d.num("handle", p.handle) }
        fs::WriteBlockParams => |p, d| { d.num("handle", p.handle) }
        fs::CommitParams => |p, d| { d.num("handle", p.handle) }
        fs::CloseParams => |p, d| { d.num("handle", p.handle) }
        fs::ReadStreamParams => |p, d| {
            if let Some(path) = &p.path {
                d.path("path", path);
            }
            if let Some(h) = p.handle {
                d.num("handle", h);
            }
            d.cwd(p.cwd())
        }
        fs::ReadCreditParams => |p, d| { d.num("stream_id", p.stream_id) }
        fs::ReadCancelParams => |p, d| { d.num("stream_id", p.stream_id) }
        http::HttpRequestParams => |p, d| {
            d.text("url", &super::redact_url(&p.url));
            d.text("http_method", &p.method);
            // The variables read, never their values.
            d.names("header_env", p.env_headers.iter().map(|h| h.env.as_str()).collect());
        }
        http::HttpCancelParams => |p, d| { d.num("stream_id", p.stream_id) }
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        Value::Binary(b) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    }
}

/// An http(s) URL without credentials, query or fragment.
fn redact_url(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut u) => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.set_query(None);
            u.set_fragment(None);
            u.to_string()
        }
        Err(_) => "(not a URL)".into(),
    }
}

/// What undecoded params claim to act on (logged under `request`, never
/// as the line's own fields): an allow-list of keys, each under its own
/// name, so that nothing secret (env, data, body, headers, stdin) can
/// slip in.
pub fn describe(method: &str, params: &Value) -> Map<String, Json> {
    let mut out = Map::new();
    let Value::Map(entries) = params else {
        return out;
    };
    for (k, v) in entries {
        let Some(key) = k.as_str() else { continue };
        match key {
            "argv" | "command" => {
                if let Value::Array(items) = v {
                    let argv: Vec<Json> = items.iter().filter_map(text).map(Json::String).collect();
                    out.insert(key.into(), Json::Array(argv));
                }
            }
            "cwd" | "path" | "from" | "to" | "root" | "target" | "source" | "destination" => {
                if let Some(t) = text(v) {
                    out.insert(key.into(), Json::String(t));
                }
            }
            "process_id" | "handle" | "stream_id" | "signal" | "tty" => {
                let j = match v {
                    Value::Boolean(b) => json!(b),
                    Value::Integer(i) => i.as_u64().map_or(Json::Null, |n| json!(n)),
                    other => text(other).map_or(Json::Null, Json::String),
                };
                out.insert(key.into(), j);
            }
            "url" if method == executor_protocol::methods::HTTP_REQUEST => {
                if let Some(t) = text(v) {
                    out.insert("url".into(), Json::String(redact_url(&t)));
                }
            }
            "method" if method == executor_protocol::methods::HTTP_REQUEST => {
                if let Some(t) = text(v) {
                    out.insert("http_method".into(), Json::String(t));
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_keeps_what_a_request_acts_on_and_drops_secrets() {
        let params = Value::Map(vec![
            (
                "argv".into(),
                Value::Array(vec!["sh".into(), "-c".into(), "true".into()]),
            ),
            ("cwd".into(), "/srv".into()),
            (
                "env".into(),
                Value::Map(vec![("TOKEN".into(), "hunter2".into())]),
            ),
            ("data".into(), Value::Binary(b"secret bytes".to_vec())),
        ]);
        let d = Json::Object(describe("process/start", &params)).to_string();
        assert!(d.contains("\"argv\":[\"sh\",\"-c\",\"true\"]"), "{d}");
        assert!(d.contains("/srv"), "{d}");
        assert!(
            !d.contains("hunter2") && !d.contains("TOKEN") && !d.contains("secret"),
            "{d}"
        );
        let http = Value::Map(vec![
            ("method".into(), "POST".into()),
            (
                "url".into(),
                "https://u:pw@api.corp/v1/x?token=abc#f".into(),
            ),
            (
                "headers".into(),
                Value::Array(vec![Value::Array(vec![
                    "Authorization".into(),
                    "Bearer xyz".into(),
                ])]),
            ),
            ("body".into(), Value::Binary(b"payload".to_vec())),
        ]);
        let d = Json::Object(describe("http/request", &http)).to_string();
        assert!(d.contains("\"url\":\"https://api.corp/v1/x\""), "{d}");
        assert!(d.contains("\"http_method\":\"POST\""), "{d}");
        for secret in ["pw", "token", "abc", "Bearer", "xyz", "payload"] {
            assert!(!d.contains(secret), "{secret} in {d}");
        }
    }

    /// Review of issue 29.5: a request-supplied value of any size went
    /// into the line whole. Over a syslog socket's buffer (argv of 3 x
    /// 100 KB, which execve accepts) the datagram was refused and the
    /// event lost: the job ran unaudited; a daemon that cuts long lines
    /// kept the argv (sorted first) and dropped method, session and
    /// `sandboxed`. Variant: a huge path under `request` (refused before
    /// decoding). Now each line is bounded, the agent's fields come
    /// first, and what was cut is named with its size and SHA-256.
    #[test]
    fn a_huge_request_value_neither_loses_nor_hides_the_event() {
        let (ours, theirs) = std::os::unix::net::UnixDatagram::pair().unwrap();
        theirs.set_nonblocking(true).unwrap();
        let audit = Audit {
            file: None,
            syslog: Some(ours),
            origin: Map::new(),
        };
        let arg = "x".repeat(100_000);
        let argv = json!(["sh", "-c", arg, arg, arg]);
        let whole = argv.to_string();
        let request = json!({"path": "p".repeat(300_000)});
        for (key, value) in [("argv", argv), ("request", request)] {
            let mut details = Map::new();
            details.insert(key.into(), value.clone());
            details.insert("sandboxed".into(), json!(false));
            audit.record(Event {
                session_id: Some("s1"),
                method: "process/start",
                id: Some(7),
                details,
                outcome: None,
                elapsed: Duration::ZERO,
            });
            let mut buf = vec![0u8; 1 << 20];
            let n = theirs
                .recv(&mut buf)
                .unwrap_or_else(|e| panic!("{key}: the audit event never reached syslog: {e}"));
            assert!(
                n <= 8192,
                "{key}: a {n}-byte syslog line (daemons cut at 8 KiB)"
            );
            let text = std::str::from_utf8(&buf[..n]).unwrap();
            let json_at = text.find('{').unwrap();
            let line: Json = serde_json::from_str(&text[json_at..]).unwrap();
            assert_eq!(line["method"], "process/start", "{text}");
            assert_eq!(line["session_id"], "s1", "{text}");
            assert_eq!(line["sandboxed"], false, "{text}");
            let cut = &line["truncated"][key];
            assert_eq!(cut["bytes"], value.to_string().len(), "{text}");
            assert_eq!(cut["sha256"].as_str().map(str::len), Some(64), "{text}");
            // The agent's fields before any request-derived one.
            assert!(
                text.find("\"method\"").unwrap() < text.find(&format!("\"{key}\"")).unwrap(),
                "{text}"
            );
        }
        let digest = ring::digest::digest(&ring::digest::SHA256, whole.as_bytes());
        assert_eq!(digest.as_ref().len(), 32);
    }
}
