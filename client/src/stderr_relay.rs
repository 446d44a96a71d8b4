//! The transport command's stderr (the local agent's, or `ssh`'s with the
//! remote agent's): passed on to this process's stderr line by line, as
//! when it was inherited, with two differences:
//! - the launcher's `executor-launch: …` line (`executor_protocol::launch`)
//!   is taken out and logged (info, target `executor_client`): which agent
//!   binary the host runs;
//! - a line's `\r\n` (OpenSSH ends its own messages so) is passed on as
//!   `\n`;
//! - the last [`TAIL_BYTES`] are kept, so a transport that ends before the
//!   agent answered can be reported with the agent's own words
//!   ([`crate::Error::Exited`]).
//!
//! Depends on tokio and the protocol's launch marker only.

use std::sync::{Arc, Mutex};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// How much of the stderr is kept for an error message.
pub const TAIL_BYTES: usize = 4096;

/// The running relay.
#[derive(Debug)]
pub(crate) struct Relay {
    tail: Arc<Mutex<Vec<u8>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    pub(crate) fn start(stderr: tokio::process::ChildStderr) -> Relay {
        let tail = Arc::new(Mutex::new(Vec::new()));
        let keep = tail.clone();
        let task = tokio::spawn(async move {
            let mut lines = BufReader::new(stderr);
            let mut out = tokio::io::stderr();
            let mut line = Vec::new();
            loop {
                line.clear();
                match lines.read_until(b'\n', &mut line).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                if line.ends_with(b"\r\n") {
                    line.remove(line.len() - 2);
                }
                let text = String::from_utf8_lossy(&line);
                if let Some(which) = text.strip_prefix(executor_protocol::launch::MARKER) {
                    tracing::info!(agent = %which.trim_end(), "the host runs this agent");
                    continue;
                }
                let _ = out.write_all(&line).await;
                let _ = out.flush().await;
                let mut t = keep.lock().expect("stderr tail lock");
                t.extend_from_slice(&line);
                if t.len() > TAIL_BYTES {
                    let cut = t.len() - TAIL_BYTES;
                    t.drain(..cut);
                }
            }
        });
        Relay { tail, task }
    }

    /// Wait, at most `within`, for the relay to reach the end of the
    /// stderr (the transport has exited, or is about to) and pass on what
    /// was left.
    pub(crate) async fn drain(self, within: std::time::Duration) {
        let mut task = self.task;
        if tokio::time::timeout(within, &mut task).await.is_err() {
            task.abort();
        }
    }

    /// When `child` ended (or ends within a moment), the error naming its
    /// exit status and the last of its stderr; else (or when it wrote
    /// nothing on stderr but something on stdout) `err` as it is.
    pub(crate) async fn explain(
        self,
        child: &mut tokio::process::Child,
        program: &str,
        err: crate::Error,
    ) -> crate::Error {
        let wait = std::time::Duration::from_secs(3);
        let Ok(Ok(status)) = tokio::time::timeout(wait, child.wait()).await else {
            return err;
        };
        // The pipe may be held open by a process the agent left; take what
        // arrived by now.
        let _ = tokio::time::timeout(std::time::Duration::from_millis(500), self.task).await;
        let tail = self.tail.lock().expect("stderr tail lock");
        let stderr = String::from_utf8_lossy(&tail).trim().to_string();
        match err {
            // What it printed on stdout says more than an empty stderr.
            crate::Error::Preamble { ref seen, .. } if stderr.is_empty() && !seen.is_empty() => err,
            err => crate::Error::Exited {
                program: program.to_string(),
                code: status.code(),
                status: status.to_string(),
                stderr: if stderr.is_empty() {
                    format!("nothing on stderr; {err}")
                } else {
                    stderr
                },
            },
        }
    }
}

/// [`Relay::explain`] for a command whose stderr is not ours to read (it
/// went straight to the terminal): its exit status, its words being above.
pub(crate) async fn explain_inherited(
    child: &mut tokio::process::Child,
    program: &str,
    err: crate::Error,
) -> crate::Error {
    let wait = std::time::Duration::from_secs(3);
    match tokio::time::timeout(wait, child.wait()).await {
        Ok(Ok(status)) if !status.success() => crate::Error::Exited {
            program: program.to_string(),
            code: status.code(),
            status: status.to_string(),
            stderr: "see above".into(),
        },
        _ => err,
    }
}
