//! The sandbox flags of `run`, `cat`, `get`, `put`, `walk`, `stat`, `rm`,
//! `mv`, `mkdir`, `realpath` and `http` (landrun's names where they mean the
//! same thing), turned into one intent.

use anyhow::Context;
use executor_client::protocol::types::sandbox::{
    NetworkIntent, SandboxIntent, DEFAULT_ASK_TIMEOUT_MS,
};
use executor_client::sandbox::{Intent, Net};

/// Confine the command or request (any flag turns the sandbox on).
#[derive(Debug, Default, Clone, clap::Args)]
#[command(next_help_heading = "Sandbox")]
pub struct SandboxArgs {
    /// Readable (and executable) root, repeatable; without any, everything
    /// is readable.
    #[arg(long = "ro", value_name = "PATH")]
    pub ro: Vec<String>,
    /// Writable (and readable) root, repeatable; nothing else is writable.
    #[arg(long = "rw", value_name = "PATH")]
    pub rw: Vec<String>,
    /// Unreadable path inside a root (repeatable).
    #[arg(long = "deny-read", value_name = "PATH")]
    pub deny_read: Vec<String>,
    /// Unwritable path inside a writable root (repeatable).
    #[arg(long = "deny-write", value_name = "PATH")]
    pub deny_write: Vec<String>,
    /// A private writable /tmp for the job, removed when it ends.
    #[arg(long)]
    pub tmp: bool,
    /// The network: `deny` (the sandbox's default), `allow`,
    /// `tcp:PORT[,PORT...]` (outbound TCP to these ports only),
    /// `host:NAME[,NAME...]` (only these hosts, by name, through the job's
    /// proxy; `NAME` is `host`, `*.suffix` or `addr/len`, with an optional
    /// `:port`), or `ask[:NAME,...]` (those, and a question on the terminal
    /// for any other; denied without a terminal).
    #[arg(long, value_name = "deny|allow|tcp:PORTS|host:NAMES|ask")]
    pub net: Option<Net>,
    /// A whole intent as JSON (docs/PROTOCOL.md §7); the flags above add to it.
    #[arg(long = "sandbox", value_name = "FILE.json")]
    pub file: Option<std::path::PathBuf>,
    /// Run with what this host can enforce (`required: false`); what is
    /// not enforced is printed on stderr. Only `run` can be degraded: the
    /// agent enforces the intent of `cat`, `get`, `put`, `walk`, `stat`,
    /// `rm`, `mv`, `mkdir`, `realpath` and `http` itself, whole, on every
    /// host, so for those it changes nothing and prints nothing.
    #[arg(long)]
    pub best_effort: bool,
}

impl SandboxArgs {
    /// Whether any sandbox flag was given.
    pub fn any(&self) -> bool {
        !(self.ro.is_empty()
            && self.rw.is_empty()
            && self.deny_read.is_empty()
            && self.deny_write.is_empty()
            && !self.tmp
            && self.net.is_none()
            && self.file.is_none()
            && !self.best_effort)
    }

    /// The intent, `None` without any flag. A relative path is taken
    /// against `base` (the job's cwd; the remote home for fs and http
    /// requests); `:cwd`, `:home`, `:tmp`, `:workspace_roots` pass as they are.
    pub fn intent(&self, base: &str) -> anyhow::Result<Option<SandboxIntent>> {
        if !self.any() {
            return Ok(None);
        }
        let mut intent = match &self.file {
            Some(file) => {
                let text = std::fs::read(file)
                    .with_context(|| format!("reading --sandbox {}", file.display()))?;
                let whole: SandboxIntent = serde_json::from_slice(&text).map_err(|e| {
                    super::exit::Usage(format!("--sandbox {}: not an intent: {e}", file.display()))
                })?;
                Intent::from_intent(whole)
            }
            None => Intent::new(),
        };
        let abs = |p: &String| absolute(p, base);
        for p in &self.ro {
            intent = intent.read(abs(p));
        }
        for p in &self.rw {
            intent = intent.write(abs(p));
        }
        for p in &self.deny_read {
            intent = intent.deny_read(abs(p));
        }
        for p in &self.deny_write {
            intent = intent.deny_write(abs(p));
        }
        if self.tmp {
            intent = intent.tmp();
        }
        if let Some(net) = &self.net {
            intent = intent.net(net.clone());
        }
        if self.best_effort {
            intent = intent.best_effort(true);
        }
        let intent = intent.build();
        if let NetworkIntent::AllowHosts(e) = &intent.network {
            ASK_TIMEOUT_MS.store(e.ask_timeout_ms, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(Some(intent))
    }
}

fn absolute(p: &str, base: &str) -> String {
    if p.starts_with('/') || p.starts_with(':') {
        p.to_string()
    } else {
        let p = p.strip_prefix("./").unwrap_or(p);
        match p {
            "." | "" => base.to_string(),
            _ => format!("{}/{p}", base.trim_end_matches('/')),
        }
    }
}

/// Print what of the intent was not enforced.
pub fn report_degraded(what: &str, degraded: &[String]) {
    for entry in degraded {
        say!("executor-client: {what}: sandbox not enforced: {entry}");
    }
}

/// How long a question waits: the agent's `ask_timeout_ms` of the intent
/// this CLI sent (it denies then), set when the intent is built.
static ASK_TIMEOUT_MS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(DEFAULT_ASK_TIMEOUT_MS);

/// Answers the agent's `network/policyRequest` (a job started with
/// `--net ask`) with a question on the controlling terminal: the user
/// allows a destination by typing it (`HOST:PORT`) back, so a question the
/// job prints itself cannot lead to another destination being allowed; a
/// `y` is not enough. Without a terminal, or with any other answer, the
/// destination is denied. What the agent sends is shown only when it is a
/// plain host name or address and a `proc-N` id (nothing of it reaches the
/// terminal as a control character). One question at a time, for as long
/// as the agent waits; the answer is read through `run`'s stdin forwarder
/// when it forwards the terminal (`tty_question`).
pub fn terminal_egress_policy() -> executor_client::egress::EgressPolicy {
    use executor_client::protocol::types::network::{
        EgressScope, EgressVerdict, PolicyRequestParams, PolicyRequestResult,
    };
    // One question on the terminal at a time; one waits for it only until
    // its own deadline (arrival + the agent's ask_timeout_ms, when the
    // agent denies it anyway), never holding a thread meanwhile: a job
    // asking for many destinations at once cannot queue stale questions
    // that hold the terminal past the agent's wait.
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    executor_client::egress::EgressPolicy::new(|req: PolicyRequestParams| async move {
        let timeout = std::time::Duration::from_millis(
            ASK_TIMEOUT_MS.load(std::sync::atomic::Ordering::Relaxed),
        );
        let deadline = tokio::time::Instant::now() + timeout;
        let plain = plain_destination(&req.host) && plain_process_id(&req.process_id);
        let turn = match plain {
            true => tokio::time::timeout_at(deadline, ONE_AT_A_TIME.lock())
                .await
                .ok(),
            false => None,
        };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let allowed = match turn {
            Some(one) if !left.is_zero() => tokio::task::spawn_blocking(move || {
                let _one = one;
                let destination = format!("{}:{}", req.host, req.port);
                let answer = super::tty_question::ask(
                    &format!(
                        "\r\nexecutor-client: {} asks to reach {destination}; type {destination} to allow it, anything else denies: ",
                        req.process_id
                    ),
                    left,
                );
                answer.as_deref() == Some(destination.as_str())
            })
            .await
            .unwrap_or(false),
            _ => false,
        };
        PolicyRequestResult {
            decision: if allowed {
                EgressVerdict::Allow
            } else {
                EgressVerdict::Deny
            },
            scope: EgressScope::Once,
        }
    })
}

/// A canonical host as the agent sends it: a name of `[a-z0-9_.-]`, an
/// IPv4 address, or a bracketed IPv6 address.
fn plain_destination(host: &str) -> bool {
    let inner = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    !inner.is_empty()
        && inner.len() <= 255
        && inner.bytes().all(|b| {
            b.is_ascii_lowercase()
                || b.is_ascii_digit()
                || matches!(b, b'.' | b'-' | b'_')
                || (host.starts_with('[') && (b == b':' || b.is_ascii_hexdigit()))
        })
}

/// A process id as the agent mints them (`proc-N`).
fn plain_process_id(id: &str) -> bool {
    id.strip_prefix("proc-")
        .is_some_and(|n| !n.is_empty() && n.len() <= 20 && n.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_destinations_and_ids_are_shown() {
        assert!(plain_destination("mirror.internal"));
        assert!(plain_destination("10.0.0.1"));
        assert!(plain_destination("[::1]"));
        assert!(!plain_destination("evil\x1b]52;c;x\x07.com"));
        assert!(!plain_destination("a b"));
        assert!(!plain_destination("Mirror.internal"));
        assert!(!plain_destination(""));
        assert!(plain_process_id("proc-12"));
        assert!(!plain_process_id("proc-1\n"));
        assert!(!plain_process_id("x"));
    }
}
