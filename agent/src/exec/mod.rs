//! The unified-exec tool contract (docs/PROTOCOL.md §4): `exec_command` and
//! `write_stdin`, on top of the same jobs as `process/start`.
//!
//! Output is collected until the job exits or `yield_time_ms` passes. Beyond
//! `max_output_tokens` (1 token = 4 bytes) the head and the tail are kept
//! and the cut is marked in the text.
//!
//! A handler module: it uses [`crate::process`] (to start jobs) and the
//! session; nothing above it.

use crate::process::{self, Proc};
use crate::session::Session;
use executor_protocol::types::exec::*;
use executor_protocol::types::sandbox::{NetworkIntent, ReadRoots, SandboxIntent};
use executor_protocol::WireError;
use nix::sys::signal::Signal;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest a single call waits for output.
pub const MAX_YIELD_TIME_MS: u64 = 30 * 60 * 1000;

/// Widen `base` by `extra` for one call: union of roots, network allowed if
/// either allows it.
pub fn widen(base: Option<SandboxIntent>, extra: Option<SandboxIntent>) -> Option<SandboxIntent> {
    match (base, extra) {
        (None, e) => e,
        (b, None) => b,
        (Some(mut b), Some(e)) => {
            let fs = &mut b.filesystem;
            fs.read = match (std::mem::take(&mut fs.read), e.filesystem.read) {
                (ReadRoots::All, _) | (_, ReadRoots::All) => ReadRoots::All,
                (ReadRoots::Paths(mut a), ReadRoots::Paths(x)) => {
                    a.extend(x);
                    ReadRoots::Paths(a)
                }
            };
            fs.write.extend(e.filesystem.write);
            b.network = match (std::mem::take(&mut b.network), e.network) {
                (NetworkIntent::Allow, _) | (_, NetworkIntent::Allow) => NetworkIntent::Allow,
                (NetworkIntent::AllowTcpConnect(mut a), NetworkIntent::AllowTcpConnect(x)) => {
                    a.extend(x);
                    a.sort_unstable();
                    a.dedup();
                    NetworkIntent::AllowTcpConnect(a)
                }
                (NetworkIntent::AllowTcpConnect(a), NetworkIntent::Deny)
                | (NetworkIntent::Deny, NetworkIntent::AllowTcpConnect(a)) => {
                    NetworkIntent::AllowTcpConnect(a)
                }
                (NetworkIntent::Deny, NetworkIntent::Deny) => NetworkIntent::Deny,
                (NetworkIntent::AllowHosts(mut a), NetworkIntent::AllowHosts(x)) => {
                    for h in x.allow_hosts {
                        if !a.allow_hosts.contains(&h) {
                            a.allow_hosts.push(h);
                        }
                    }
                    a.ask |= x.ask;
                    a.ask_timeout_ms = a.ask_timeout_ms.max(x.ask_timeout_ms);
                    NetworkIntent::AllowHosts(a)
                }
                (NetworkIntent::AllowHosts(a), NetworkIntent::Deny)
                | (NetworkIntent::Deny, NetworkIntent::AllowHosts(a)) => {
                    NetworkIntent::AllowHosts(a)
                }
                // Ports to any host and hosts by name do not combine (§8):
                // the base stays, never silently wider than either asked.
                (base @ NetworkIntent::AllowTcpConnect(_), NetworkIntent::AllowHosts(_))
                | (base @ NetworkIntent::AllowHosts(_), NetworkIntent::AllowTcpConnect(_)) => base,
            };
            b.required = b.required || e.required;
            // Request-level workspace roots: the union of both (each is
            // still checked against the profile's where it is used).
            b.workspace_roots = match (b.workspace_roots.take(), e.workspace_roots) {
                (Some(mut a), Some(x)) => {
                    for r in x {
                        if !a.contains(&r) {
                            a.push(r);
                        }
                    }
                    Some(a)
                }
                (a, x) => a.or(x),
            };
            Some(b)
        }
    }
}

/// Keep head and tail within `max_tokens`, marking the cut.
pub fn truncate_output(text: &str, max_tokens: u64) -> (String, u64, bool) {
    let len = text.len() as u64;
    let tokens = len.div_ceil(BYTES_PER_TOKEN);
    let budget = max_tokens.saturating_mul(BYTES_PER_TOKEN);
    if len <= budget {
        return (text.to_string(), tokens, false);
    }
    let half = (budget / 2) as usize;
    let mut head_end = half.min(text.len());
    while !text.is_char_boundary(head_end) {
        head_end -= 1;
    }
    let mut tail_start = text.len().saturating_sub(half);
    while !text.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    let cut = (tail_start - head_end) as u64;
    let out = format!(
        "{}\n…[{} tokens truncated]…\n{}",
        &text[..head_end],
        cut.div_ceil(BYTES_PER_TOKEN),
        &text[tail_start..]
    );
    (out, tokens, true)
}

/// Collect output until the job finishes or the yield window closes.
async fn collect(
    s: &Arc<Session>,
    proc: &Arc<Proc>,
    yield_ms: u64,
    max_tokens: u64,
    started: Instant,
) -> ExecResult {
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(yield_ms.min(MAX_YIELD_TIME_MS));
    let mut rx = proc.subscribe();
    let mut bytes: Vec<u8> = Vec::new();
    let mut missed = 0u64;
    let exit = loop {
        let (chunks, lost) = proc.take_exec_output();
        missed += lost;
        for c in chunks {
            bytes.extend_from_slice(&c.data);
        }
        if let Some(exit) = proc.finished() {
            // Anything appended between the take and now.
            let (chunks, lost) = proc.take_exec_output();
            missed += lost;
            for c in chunks {
                bytes.extend_from_slice(&c.data);
            }
            break Some(exit);
        }
        if !proc.changed_until(&mut rx, deadline).await && tokio::time::Instant::now() >= deadline {
            break None;
        }
    };
    let mut text = String::from_utf8_lossy(&bytes).into_owned();
    if missed > 0 {
        text = format!("…[{missed} output chunks dropped: buffer full]…\n{text}");
    }
    let (output, original_token_count, truncated) = truncate_output(&text, max_tokens);
    let wall_time_ms = started.elapsed().as_millis() as u64;
    match exit {
        Some(e) => {
            s.processes().delivered(proc);
            ExecResult {
                output,
                original_token_count,
                truncated,
                exit_code: Some(e.shell_code()),
                process_id: None,
                wall_time_ms,
                sandbox_denied: proc.sandbox_denied(),
                sandbox_degraded: None,
                egress: None,
                limits_degraded: None,
                usage: e.usage,
                limit_hit: e.limit_hit,
            }
        }
        None => ExecResult {
            output,
            original_token_count,
            truncated,
            exit_code: None,
            process_id: Some(proc.id.clone()),
            wall_time_ms,
            sandbox_denied: None,
            sandbox_degraded: None,
            egress: None,
            limits_degraded: None,
            usage: None,
            limit_hit: None,
        },
    }
}

/// `exec_command`
pub async fn exec_command(s: &Arc<Session>, p: ExecCommandParams) -> Result<ExecResult, WireError> {
    let started_at = Instant::now();
    let intent = widen(
        p.sandbox_permissions.clone(),
        p.additional_permissions.clone(),
    );
    tracing::info!(
        command = ?p.command,
        cwd = %p.cwd.display(),
        additional_permissions_preapproved = p.additional_permissions_preapproved,
        justification = ?p.justification,
        "exec_command"
    );
    let started = process::start(
        s,
        process::StartOptions {
            argv: &p.command,
            cwd: &p.cwd,
            env: &p.env,
            arg0: None,
            tty: p.tty,
            pty_size: None,
            stdin_null: false,
            notify: false,
            output_buffer_bytes: None,
            tag: Some("exec_command".into()),
            intent: intent.as_ref(),
            intent_param: "sandbox_permissions",
            argv_param: "command",
            env_base: p.env_base,
            limits: p.limits.as_ref(),
        },
    )
    .await?;
    let mut r = collect(
        s,
        &started.proc,
        p.yield_time_ms,
        p.max_output_tokens,
        started_at,
    )
    .await;
    r.sandbox_degraded = started.sandbox_degraded;
    r.egress = started.egress;
    r.limits_degraded = started.limits_degraded;
    Ok(r)
}

/// `write_stdin`
pub async fn write_stdin(s: &Arc<Session>, p: WriteStdinParams) -> Result<ExecResult, WireError> {
    let started = Instant::now();
    let proc = s.processes().get(&p.process_id)?;
    if p.input == "\u{3}" && !proc.tty {
        proc.signal(Signal::SIGINT)?;
    } else if !p.input.is_empty() {
        proc.write_stdin(p.input.as_bytes(), false).await?;
    }
    Ok(collect(s, &proc, p.yield_time_ms, p.max_output_tokens, started).await)
}

#[cfg(test)]
mod tests {
    use super::*;
    use executor_protocol::types::sandbox::FilesystemIntent;

    #[test]
    fn truncation_keeps_head_and_tail() {
        let text: String = (0..1000).map(|i| format!("line{i}\n")).collect();
        let (out, tokens, cut) = truncate_output(&text, 20);
        assert!(cut);
        assert_eq!(tokens, (text.len() as u64).div_ceil(4));
        assert!(out.starts_with("line0\n"));
        assert!(out.ends_with("line999\n"));
        assert!(out.contains("tokens truncated"));
        let (same, _, cut) = truncate_output("short", 20);
        assert_eq!((same.as_str(), cut), ("short", false));
        // Never splits a UTF-8 character.
        let (out, _, _) = truncate_output(&"é".repeat(100), 5);
        assert!(out.contains("truncated"));
    }

    #[test]
    fn widening_unions_roots_and_network() {
        let a = SandboxIntent {
            filesystem: FilesystemIntent {
                read: ReadRoots::Paths(vec!["/a".into()]),
                write: vec!["/w".into()],
                ..Default::default()
            },
            network: NetworkIntent::Deny,
            required: true,
            workspace_roots: None,
        };
        let b = SandboxIntent {
            filesystem: FilesystemIntent {
                read: ReadRoots::Paths(vec!["/b".into()]),
                write: vec!["/x".into()],
                ..Default::default()
            },
            network: NetworkIntent::AllowTcpConnect(vec![443]),
            required: false,
            workspace_roots: None,
        };
        let w = widen(Some(a), Some(b)).unwrap();
        assert_eq!(
            w.filesystem.read,
            ReadRoots::Paths(vec!["/a".into(), "/b".into()])
        );
        assert_eq!(w.filesystem.write.len(), 2);
        assert_eq!(w.network, NetworkIntent::AllowTcpConnect(vec![443]));
    }
}
