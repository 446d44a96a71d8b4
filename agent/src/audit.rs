//! The audit log: one JSON line per request, to a file (`[audit] file`)
//! and/or syslog (`[audit] syslog`, the `/dev/log` socket that journald
//! also serves). Never on stdout.
//!
//! An event names the request (method, id, and what it acts on: argv,
//! cwd, path, URL without query or credentials), its outcome (`ok` or the
//! error code), its duration, the session, the profile and where the SSH
//! connection came from (`SSH_CLIENT`, `SSH_CONNECTION`). It never holds
//! secrets: no resume token, no environment values, no request or file
//! data, no header values, no stdin text.

use crate::config::AuditConfig;
use executor_protocol::ErrorCode;
use rmpv::Value;
use serde_json::{json, Map, Value as Json};
use std::io::Write;
use std::sync::Mutex;
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
        let mut line = self.origin.clone();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        line.insert("ts_ms".into(), json!(now.as_millis() as u64));
        if let Some(s) = event.session_id {
            line.insert("session_id".into(), json!(s));
        }
        line.insert("method".into(), json!(event.method));
        if let Some(id) = event.id {
            line.insert("id".into(), json!(id));
        }
        line.insert(
            "outcome".into(),
            json!(event.outcome.map_or("ok", |c| c.as_str())),
        );
        line.insert(
            "duration_us".into(),
            json!(event.elapsed.as_micros() as u64),
        );
        for (k, v) in event.details {
            line.insert(k, v);
        }
        let text = Json::Object(line).to_string();
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

/// One request, as the audit log sees it.
#[derive(Debug)]
pub struct Event<'a> {
    pub session_id: Option<&'a str>,
    pub method: &'a str,
    pub id: Option<u64>,
    pub details: Map<String, Json>,
    pub outcome: Option<ErrorCode>,
    pub elapsed: Duration,
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

/// What a request acts on, from its params: an allow-list of keys, so that
/// nothing secret (env, data, body, headers, stdin) can slip in.
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
                    out.insert("argv".into(), Json::Array(argv));
                }
            }
            "cwd" | "path" | "from" | "to" | "root" => {
                if let Some(t) = text(v) {
                    out.insert(key.into(), Json::String(t));
                }
            }
            "process_id" | "handle" | "stream_id" | "session_id" | "signal" | "tty" => {
                let j = match v {
                    Value::Boolean(b) => json!(b),
                    Value::Integer(i) => i.as_u64().map_or(Json::Null, |n| json!(n)),
                    other => text(other).map_or(Json::Null, Json::String),
                };
                out.insert(key.into(), j);
            }
            "sandbox" | "sandbox_permissions" => {
                out.insert("sandboxed".into(), json!(!v.is_nil()));
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
}
