//! The session's jobs: [`Proc`] (one job's state: buffered output, exit,
//! stdin, terminal) and [`ProcessTable`] (the jobs by id, the
//! `max_processes` count).
//!
//! Below the session: it uses [`crate::outbound`] (a job pushes its output
//! and lag notices) and the protocol's types, nothing above. Starting a job
//! and the `process/*` handlers are in [`crate::process`].

use super::output::{Chunk, OutputBuffer};
use crate::outbound::{NotifyError, Outbound};
use bytes::Bytes;
use executor_protocol::methods as m;
use executor_protocol::types::process::{
    ExitInfo, OutputChunk, OutputStream, ProcessLagged, ProcessReadResult,
};
use executor_protocol::{ErrorCode, WireError};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;

/// How long an exited process stays readable after a client saw its exit.
pub const REAP_AFTER: Duration = Duration::from_secs(30);
/// How long a job's output push may wait for room in the notification
/// queue before the job is marked lagged (the client is not reading).
pub const LAG_PATIENCE: Duration = Duration::from_millis(500);
/// Grace between SIGTERM and SIGKILL when a session ends.
pub const TERM_GRACE: Duration = Duration::from_secs(2);

/// How a job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// The job's account and the limit it hit (where it had a cgroup).
    pub usage: Option<executor_protocol::types::process::JobUsage>,
    pub limit_hit: Option<executor_protocol::types::process::LimitHit>,
}

impl Exit {
    /// The conventional signal name (`SIGTERM`).
    pub fn signal_name(&self) -> Option<String> {
        self.signal.map(signal_name)
    }
    /// A shell-style code: the exit code, or 128 + the signal number.
    pub fn shell_code(&self) -> i32 {
        self.code.unwrap_or_else(|| 128 + self.signal.unwrap_or(0))
    }
    fn info(&self) -> ExitInfo {
        ExitInfo {
            exit_code: self.code,
            signal: self.signal_name(),
            usage: self.usage,
            limit_hit: self.limit_hit,
        }
    }
}

/// `SIGTERM` for 15, `SIG42` for what nix does not name.
pub fn signal_name(n: i32) -> String {
    Signal::try_from(n)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("SIG{n}"))
}

/// Where a job's stdin goes.
#[derive(Debug)]
pub enum StdinSink {
    Pipe(tokio::process::ChildStdin),
    /// The PTY master (a dup), written as a stream.
    Pty(tokio::net::unix::pipe::Sender),
}

#[derive(Debug)]
struct State {
    out: OutputBuffer,
    exit: Option<Exit>,
    streams_open: usize,
    lagged: bool,
    /// The task queueing `process/lagged`: `process/exited` waits for it.
    lag_note: Option<tokio::task::JoinHandle<()>>,
    delivered: bool,
    /// Next seq that `exec_command`/`write_stdin` will hand out.
    exec_cursor: u64,
}

/// One job of the session.
pub struct Proc {
    pub id: String,
    pub pid: u32,
    pub argv: Vec<String>,
    pub tag: Option<String>,
    pub tty: bool,
    /// Started under an enforced sandbox policy.
    pub sandboxed: bool,
    /// Whether output and the exit are pushed as notifications.
    pub notify: bool,
    /// What changes while the job lives.
    pub live: Live,
    /// Its cgroup while it runs (`process/list` reads its account there).
    pub cgroup: Option<Arc<executor_sandbox::cgroup::JobCgroup>>,
}

/// A job's changing state: buffered output, exit, stdin, terminal.
#[derive(Debug)]
pub struct Live {
    state: Mutex<State>,
    changed: watch::Sender<u64>,
    push_order: tokio::sync::Mutex<()>,
    stdin: tokio::sync::Mutex<Option<StdinSink>>,
    /// The PTY master (for resize); released when the job ends.
    pty: Mutex<Option<OwnedFd>>,
    /// The `write_id`s of `process/write` and what each write answered.
    pub write_ids: super::once::Once<()>,
}

impl Live {
    /// A running job's state: an output buffer of `buffer_bytes` fed by
    /// `streams` output streams (1 for a PTY, else 2).
    pub fn new(
        buffer_bytes: usize,
        streams: usize,
        stdin: Option<StdinSink>,
        pty: Option<OwnedFd>,
    ) -> Live {
        let (changed, _) = watch::channel(0u64);
        Live {
            state: Mutex::new(State {
                out: OutputBuffer::new(buffer_bytes),
                exit: None,
                streams_open: streams,
                lagged: false,
                lag_note: None,
                delivered: false,
                exec_cursor: 0,
            }),
            changed,
            push_order: tokio::sync::Mutex::new(()),
            stdin: tokio::sync::Mutex::new(stdin),
            pty: Mutex::new(pty),
            // A write that failed may have written part of its data:
            // retried, it answers the same failure, writing nothing.
            write_ids: super::once::Once::new(executor_protocol::limits::MAX_WRITE_IDS, false),
        }
    }
}

impl std::fmt::Debug for Proc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proc")
            .field("id", &self.id)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

impl Proc {
    fn bump(&self) {
        self.live.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Whether the job is still running.
    pub fn running(&self) -> bool {
        self.live.state.lock().expect("proc state").exit.is_none()
    }

    /// Its account: the final one once it ended, else what its cgroup
    /// says now (`None` without a cgroup).
    pub fn usage(&self) -> Option<executor_protocol::types::process::JobUsage> {
        let exit = self.live.state.lock().expect("proc state").exit;
        match exit {
            Some(e) => e.usage,
            None => self.cgroup.as_deref().map(crate::limits::current),
        }
    }

    /// The exit, once the job ended *and* all its output is buffered.
    pub fn finished(&self) -> Option<Exit> {
        let st = self.live.state.lock().expect("proc state");
        if st.streams_open == 0 {
            st.exit
        } else {
            None
        }
    }

    /// Buffer a chunk, then push it as `process/output` if the client keeps
    /// up. While the notification queue is full the pump waits (the child
    /// is slowed, nothing is lost) up to [`LAG_PATIENCE`]; past that the job
    /// is marked lagged, `process/lagged` is sent once, and output is only
    /// retained (bounded) until the client reads it.
    pub async fn append(&self, stream: OutputStream, data: Bytes, outbound: &Outbound) {
        // Per job, pushes leave in seq order (stdout and stderr pumps race).
        let _order = self.live.push_order.lock().await;
        let (seq, push) = {
            let mut st = self.live.state.lock().expect("proc state");
            let seq = st.out.push(stream, data.clone());
            (seq, self.notify && !st.lagged)
        };
        self.bump();
        if !push {
            return;
        }
        let pushed = outbound
            .notify_output(&self.id, seq, stream, data, LAG_PATIENCE)
            .await;
        if let Err(NotifyError::Full) = pushed {
            self.mark_lagged(seq, outbound);
        }
    }

    /// The client is not keeping up: queue `process/lagged` (after any
    /// earlier one) and push no more output until it reads.
    fn mark_lagged(&self, seq: u64, outbound: &Outbound) {
        tracing::debug!(process_id = %self.id, seq, "client not keeping up: process lagged");
        let mut st = self.live.state.lock().expect("proc state");
        st.lagged = true;
        let outbound = outbound.clone();
        let lagged = ProcessLagged {
            process_id: self.id.clone(),
            next_seq: seq,
        };
        let previous = st.lag_note.take();
        st.lag_note = Some(tokio::spawn(async move {
            // In order: a lag notice is queued after the previous one.
            if let Some(p) = previous {
                let _ = p.await;
            }
            let _ = outbound.notify(m::PROCESS_LAGGED, &lagged).await;
        }));
    }

    /// One of the job's output streams ended.
    pub fn stream_closed(&self) {
        self.live.state.lock().expect("proc state").streams_open -= 1;
        self.bump();
    }

    /// The job's descriptors (stdin, terminal) are released: a finished
    /// job's record stays readable for a while, its descriptors must not.
    pub async fn release_io(&self) {
        self.live.stdin.lock().await.take();
        self.live.pty.lock().expect("pty lock").take();
    }

    /// Record the exit once every output stream is drained (so
    /// `process/exited` follows the last `process/output`). Returns the
    /// last seq and the pending lag notice (to await before the exit
    /// notice).
    pub async fn record_exit(
        &self,
        exit: Exit,
    ) -> (Option<u64>, Option<tokio::task::JoinHandle<()>>) {
        let mut rx = self.subscribe();
        loop {
            {
                let mut st = self.live.state.lock().expect("proc state");
                if st.streams_open == 0 {
                    st.exit = Some(exit);
                    break;
                }
            }
            if rx.changed().await.is_err() {
                break;
            }
        }
        self.bump();
        let mut st = self.live.state.lock().expect("proc state");
        (st.out.next_seq().checked_sub(1), st.lag_note.take())
    }

    /// `process/read`'s answer now, or `None` when there is nothing to
    /// give yet and `may_wait`. A read clears the lagged mark.
    pub fn read(
        &self,
        after_seq: Option<u64>,
        max_bytes: usize,
        may_wait: bool,
    ) -> Option<ProcessReadResult> {
        let mut st = self.live.state.lock().expect("proc state");
        let chunks = st.out.read(after_seq, max_bytes);
        let finished = st.streams_open == 0 && st.exit.is_some();
        if chunks.is_empty() && !finished && may_wait {
            return None;
        }
        st.lagged = false;
        let exited = if finished {
            st.exit.map(|e| e.info())
        } else {
            None
        };
        Some(ProcessReadResult {
            chunks: chunks
                .into_iter()
                .map(|c| OutputChunk {
                    seq: c.seq,
                    stream: c.stream,
                    data: serde_bytes::ByteBuf::from(c.data.to_vec()),
                })
                .collect(),
            next_seq: st.out.next_seq(),
            exited,
            dropped_before: st.out.dropped_before(),
        })
    }

    /// Wait until the state changes or `deadline` passes.
    pub async fn changed_until(
        &self,
        rx: &mut watch::Receiver<u64>,
        deadline: tokio::time::Instant,
    ) -> bool {
        tokio::time::timeout_at(deadline, rx.changed())
            .await
            .is_ok()
    }

    /// A receiver of state changes (new output, exit).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.live.changed.subscribe()
    }

    /// Take the output not yet handed to `exec_command`/`write_stdin`, and
    /// how many chunks were dropped from the buffer before they could be.
    pub fn take_exec_output(&self) -> (Vec<Chunk>, u64) {
        let mut st = self.live.state.lock().expect("proc state");
        let cursor = st.exec_cursor;
        let missed = st.out.first_seq().saturating_sub(cursor);
        let chunks = st.out.read(cursor.checked_sub(1), usize::MAX);
        st.exec_cursor = st.out.next_seq();
        (chunks, missed)
    }

    /// The documented `sandbox_denied` heuristic: a sandboxed job that
    /// ended unsuccessfully and whose recent output shows a permission-style
    /// error (EPERM, EACCES, EROFS and their messages). Kernel audit records
    /// would be exact but are not readable by an unprivileged agent.
    pub fn sandbox_denied(&self) -> Option<bool> {
        if !self.sandboxed {
            return None;
        }
        let st = self.live.state.lock().expect("proc state");
        let exit = st.exit?;
        if exit.code == Some(0) {
            return None;
        }
        let chunks = st.out.read(st.out.next_seq().checked_sub(64), usize::MAX);
        let mut tail = Vec::new();
        for c in &chunks {
            tail.extend_from_slice(&c.data);
        }
        let text =
            String::from_utf8_lossy(&tail[tail.len().saturating_sub(64 * 1024)..]).to_lowercase();
        const MARKERS: &[&str] = &[
            "permission denied",
            "operation not permitted",
            "read-only file system",
            "eacces",
            "eperm",
            "erofs",
        ];
        MARKERS.iter().any(|m| text.contains(m)).then_some(true)
    }

    /// Mark the exit as given to a client; true the first time (reaping
    /// starts then: see [`ProcessTable::delivered`]).
    fn first_delivery(&self) -> bool {
        let mut st = self.live.state.lock().expect("proc state");
        !std::mem::replace(&mut st.delivered, true)
    }

    /// Send `signal` to the job's process group (no-op once it exited).
    pub fn signal(&self, signal: Signal) -> Result<(), WireError> {
        if !self.running() {
            return Ok(());
        }
        match killpg(Pid::from_raw(self.pid as i32), signal) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
            Err(e) => Err(WireError::new(
                ErrorCode::Io,
                format!("cannot signal process {} (pid {}): {e}", self.id, self.pid),
            )
            .with("errno", e as i32)),
        }
    }

    /// Set the terminal's size (`invalid_params` once the job exited).
    pub fn resize(&self, rows: u16, cols: u16) -> Result<(), WireError> {
        let pty = self.live.pty.lock().expect("pty lock");
        let Some(fd) = pty.as_ref() else {
            return Err(WireError::invalid_params(
                "process_id",
                format!("process {} has exited: its terminal is gone", self.id),
            ));
        };
        use std::os::fd::AsFd;
        executor_sys::set_winsize(fd.as_fd(), rows, cols).map_err(|e| {
            WireError::new(
                ErrorCode::Io,
                format!("resizing the terminal of {}: {e}", self.id),
            )
        })
    }

    /// Write to the job's stdin (pipe or PTY).
    pub async fn write_stdin(&self, data: &[u8], close: bool) -> Result<(), WireError> {
        let mut guard = self.live.stdin.lock().await;
        if !data.is_empty() {
            let written = match guard.as_mut() {
                None => {
                    return Err(WireError::new(
                        ErrorCode::Io,
                        format!("stdin of process {} is closed", self.id),
                    )
                    .with("errno", libc::EPIPE))
                }
                Some(StdinSink::Pipe(p)) => p.write_all(data).await.map_err(|e| (e, "stdin")),
                Some(StdinSink::Pty(fd)) => {
                    fd.write_all(data).await.map_err(|e| (e, "the terminal"))
                }
            };
            written.map_err(|(e, what)| {
                WireError::new(
                    ErrorCode::Io,
                    format!("writing to {what} of process {}: {e}", self.id),
                )
                .with("errno", e.raw_os_error().unwrap_or(0))
            })?;
        }
        if close {
            match guard.take() {
                // EOF for a terminal is the line discipline's EOF character.
                Some(StdinSink::Pty(mut fd)) => {
                    let _ = fd.write_all(b"\x04").await;
                }
                Some(StdinSink::Pipe(mut p)) => {
                    let _ = p.shutdown().await;
                }
                None => {}
            }
        }
        Ok(())
    }
}

/// The session's jobs.
#[derive(Debug, Default)]
pub struct ProcessTable {
    map: Mutex<HashMap<String, Arc<Proc>>>,
    next_id: AtomicU64,
    running: Arc<AtomicUsize>,
}

/// A `max_processes` slot, released when the job ends (or never started).
#[derive(Debug)]
pub struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl ProcessTable {
    /// Reserve a slot for a new job, `limit_exceeded` when `max` run
    /// already (the count goes up first, so concurrent starts cannot
    /// overshoot).
    pub fn reserve_slot(&self, max: u64) -> Result<Slot, WireError> {
        let running = self.running.fetch_add(1, Ordering::SeqCst);
        let slot = Slot(self.running.clone());
        if running as u64 >= max {
            return Err(WireError::limit("max_processes", max, None));
        }
        Ok(slot)
    }

    /// The id the next job gets (`proc-1`, `proc-2`, …).
    pub fn next_id(&self) -> String {
        format!("proc-{}", self.next_id.fetch_add(1, Ordering::SeqCst) + 1)
    }

    /// Register a started job.
    pub fn insert(&self, proc: Arc<Proc>) {
        self.map
            .lock()
            .expect("process table")
            .insert(proc.id.clone(), proc);
    }

    /// Look up a job by id.
    pub fn get(&self, id: &str) -> Result<Arc<Proc>, WireError> {
        self.map
            .lock()
            .expect("process table")
            .get(id)
            .cloned()
            .ok_or_else(|| {
                WireError::new(
                    ErrorCode::UnknownProcess,
                    format!("no process {id:?} in this session"),
                )
                .with("process_id", id)
            })
    }

    fn remove(&self, id: &str) {
        self.map.lock().expect("process table").remove(id);
    }

    /// The exit of `proc` was given to a client: it is forgotten
    /// [`REAP_AFTER`] later (if the table still exists then).
    pub fn delivered(self: &Arc<Self>, proc: &Proc) {
        if proc.first_delivery() {
            let weak = Arc::downgrade(self);
            let id = proc.id.clone();
            tokio::spawn(async move {
                tokio::time::sleep(REAP_AFTER).await;
                if let Some(table) = weak.upgrade() {
                    table.remove(&id);
                }
            });
        }
    }

    /// Every job.
    pub fn all(&self) -> Vec<Arc<Proc>> {
        let mut v: Vec<_> = self
            .map
            .lock()
            .expect("process table")
            .values()
            .cloned()
            .collect();
        // The number of each id parsed once, not once per comparison.
        v.sort_by_cached_key(|p| p.id.trim_start_matches("proc-").parse::<u64>().unwrap_or(0));
        v
    }

    /// SIGTERM every running job, SIGKILL what is left after the grace.
    pub async fn terminate_all(&self) {
        let procs: Vec<_> = self.all().into_iter().filter(|p| p.running()).collect();
        if procs.is_empty() {
            return;
        }
        for signal in [Signal::SIGTERM, Signal::SIGKILL] {
            for p in &procs {
                let _ = p.signal(signal);
            }
            let deadline = tokio::time::Instant::now() + TERM_GRACE;
            for p in &procs {
                let mut rx = p.subscribe();
                while p.running() && p.changed_until(&mut rx, deadline).await {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use executor_protocol::message::Incoming;

    fn job(notify: bool) -> Proc {
        Proc {
            id: "proc-1".into(),
            pid: u32::MAX,
            argv: vec!["true".into()],
            tag: None,
            tty: false,
            sandboxed: false,
            notify,
            live: Live::new(1 << 10, 2, None, None),
            cgroup: None,
        }
    }

    /// A notifying job whose session has a connection queueing `room`
    /// notifications.
    fn attached_job(
        room: usize,
    ) -> (
        Proc,
        Outbound,
        tokio::sync::mpsc::Receiver<crate::outbound::OutFrame>,
    ) {
        let out = Outbound::new(1 << 20);
        let (tx, rx) = tokio::sync::mpsc::channel(room);
        out.attach(tx, false);
        (job(true), out, rx)
    }

    fn decode(frame: &crate::outbound::OutFrame) -> Incoming {
        let mut bytes = frame.bytes[4..].to_vec();
        bytes.extend_from_slice(frame.tail.as_deref().unwrap_or_default());
        Incoming::decode(&bytes).unwrap()
    }

    #[test]
    fn slots_are_bounded_and_come_back_when_a_job_ends() {
        let t = ProcessTable::default();
        let a = t.reserve_slot(2).unwrap();
        let _b = t.reserve_slot(2).unwrap();
        let e = t.reserve_slot(2).unwrap_err();
        assert_eq!(e.code, ErrorCode::LimitExceeded);
        assert_eq!(
            e.data_get("limit").and_then(|v| v.as_str()),
            Some("max_processes")
        );
        drop(a);
        assert!(t.reserve_slot(2).is_ok());
        assert_eq!(
            (t.next_id(), t.next_id()),
            ("proc-1".into(), "proc-2".into())
        );
        let e = t.get("proc-9").unwrap_err();
        assert_eq!(e.code, ErrorCode::UnknownProcess);
    }

    #[tokio::test]
    async fn output_is_pushed_in_order_then_the_exit_follows_the_last_chunk() {
        let (p, out, mut rx) = attached_job(8);
        p.append(OutputStream::Stdout, Bytes::from_static(b"one"), &out)
            .await;
        p.append(OutputStream::Stderr, Bytes::from_static(b"two"), &out)
            .await;
        for (seq, stream) in [(0u64, "stdout"), (1, "stderr")] {
            let Incoming::Notification { method, params } = decode(&rx.recv().await.unwrap())
            else {
                panic!("not a notification");
            };
            assert_eq!(method, m::PROCESS_OUTPUT);
            let o: executor_protocol::types::process::ProcessOutput =
                executor_protocol::message::from_params(params).unwrap();
            assert_eq!((o.seq, o.stream.as_str()), (seq, stream));
        }
        assert!(p.running() && p.finished().is_none());
        // The exit is recorded once both streams closed.
        let exit = Exit {
            code: Some(3),
            signal: None,
            usage: None,
            limit_hit: None,
        };
        let p = Arc::new(p);
        p.stream_closed();
        let recorded = tokio::spawn({
            let p = p.clone();
            async move { p.record_exit(exit).await }
        });
        tokio::task::yield_now().await;
        assert!(!recorded.is_finished(), "recorded with a stream open");
        assert!(p.running());
        p.stream_closed();
        let (final_seq, lag) = recorded.await.unwrap();
        assert_eq!((final_seq, lag.is_none()), (Some(1), true));
        assert_eq!(p.finished(), Some(exit));
        let r = p.read(None, 1 << 20, true).unwrap();
        assert_eq!(r.exited.and_then(|e| e.exit_code), Some(3));
        assert_eq!(r.chunks.len(), 2);
    }

    #[tokio::test]
    async fn a_client_that_stops_reading_marks_the_job_lagged_and_is_told_once() {
        let (p, out, mut rx) = attached_job(1);
        p.append(OutputStream::Stdout, Bytes::from_static(b"a"), &out)
            .await;
        // The queue is full now: this push waits LAG_PATIENCE, then lags.
        p.append(OutputStream::Stdout, Bytes::from_static(b"b"), &out)
            .await;
        // Lagged: no more pushes, the output is only retained.
        p.append(OutputStream::Stdout, Bytes::from_static(b"c"), &out)
            .await;
        let first = rx.recv().await.unwrap();
        assert!(
            matches!(decode(&first), Incoming::Notification { method, .. } if method == m::PROCESS_OUTPUT)
        );
        let Incoming::Notification { method, params } = decode(&rx.recv().await.unwrap()) else {
            panic!("not a notification");
        };
        assert_eq!(method, m::PROCESS_LAGGED);
        let l: ProcessLagged = executor_protocol::message::from_params(params).unwrap();
        assert_eq!(l.next_seq, 1);
        assert!(rx.try_recv().is_err(), "told once, nothing pushed after");
        // A read clears the mark and gets everything retained.
        let r = p.read(None, 1 << 20, false).unwrap();
        assert_eq!(r.chunks.len(), 3);
        assert_eq!(r.next_seq, 3);
    }
}
