//! The sandbox flags of `run`, `cat`, `get`, `put`, `walk`, `stat`, `rm`,
//! `mv`, `mkdir`, `realpath` and `http` (landrun's names where they mean the
//! same thing), turned into one intent.

use anyhow::Context;
use executor_client::protocol::types::sandbox::SandboxIntent;
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
    /// not enforced is printed on stderr.
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
                let whole: SandboxIntent = serde_json::from_slice(&text)
                    .with_context(|| format!("--sandbox {}: not an intent", file.display()))?;
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
        Ok(Some(intent.build()))
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
        eprintln!("executor-client: {what}: sandbox not enforced: {entry}");
    }
}

/// Answers the agent's `network/policyRequest` (a job started with
/// `--net ask`) with a question on the controlling terminal; without one,
/// or without an answer of `y`, the destination is denied. One question at
/// a time.
pub fn terminal_egress_policy() -> executor_client::egress::EgressPolicy {
    use executor_client::protocol::types::network::{
        EgressScope, EgressVerdict, PolicyRequestParams, PolicyRequestResult,
    };
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    executor_client::egress::EgressPolicy::new(|req: PolicyRequestParams| async move {
        let allowed = tokio::task::spawn_blocking(move || {
            let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
            ask_terminal(&format!(
                "executor-client: may {} reach {}:{}? [y/N] ",
                req.process_id, req.host, req.port
            ))
        })
        .await
        .unwrap_or(false);
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

/// `question` on /dev/tty; whether the answer was yes.
fn ask_terminal(question: &str) -> bool {
    use std::io::{BufRead, Write};
    let Ok(tty) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
    else {
        return false;
    };
    let mut out = &tty;
    if out.write_all(question.as_bytes()).is_err() {
        return false;
    }
    let mut line = String::new();
    let _ = std::io::BufReader::new(&tty).read_line(&mut line);
    matches!(line.trim(), "y" | "Y" | "yes")
}
