//! Jobs on the agent: [`Process`] (from `process/start`), a handle that
//! reads a job's output in order, writes its stdin and signals it. The
//! unified-exec tools (`exec_command`, `write_stdin`) are plain
//! [`Client::call`]s of their params.

use crate::{Client, Error, Subscription};
use executor_protocol::methods as m;
use executor_protocol::types::process::*;
use executor_protocol::types::Empty;
use futures_util::Stream;
use std::collections::VecDeque;

/// One chunk of a job's output (its bytes share the received frame).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub seq: u64,
    pub stream: OutputStream,
    pub data: bytes::Bytes,
}

/// `process/output` params, `data` borrowed from the frame.
#[derive(serde::Deserialize)]
struct OutputNote<'a> {
    seq: u64,
    stream: OutputStream,
    #[serde(borrow)]
    data: &'a serde_bytes::Bytes,
}

/// How a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitStatus {
    pub code: Option<i32>,
    pub signal: Option<String>,
    pub signal_number: Option<i32>,
    /// The job ran under a sandbox that denied it something
    /// (`process/exited` `sandbox_denied`).
    pub sandbox_denied: bool,
    /// What it used, where the host accounts for it.
    pub usage: Option<executor_protocol::types::process::JobUsage>,
    /// The limit it ran into (an OOM kill: `memory`).
    pub limit_hit: Option<executor_protocol::types::process::LimitHit>,
}

impl ExitStatus {
    /// The exit code, or 128 + the signal number (as shells report it).
    pub fn shell_code(&self) -> i32 {
        self.code
            .unwrap_or_else(|| 128 + self.signal_number.unwrap_or(0))
    }
    /// Exited with code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// The Linux number of a conventional signal name.
fn signal_number(name: &str) -> Option<i32> {
    const NAMES: [&str; 15] = [
        "SIGHUP", "SIGINT", "SIGQUIT", "SIGILL", "SIGTRAP", "SIGABRT", "SIGBUS", "SIGFPE",
        "SIGKILL", "SIGUSR1", "SIGSEGV", "SIGUSR2", "SIGPIPE", "SIGALRM", "SIGTERM",
    ];
    NAMES.iter().position(|n| *n == name).map(|i| i as i32 + 1)
}

/// A job started with `process/start`. Output arrives as pushed
/// `process/output` notifications; any gap (output produced before this
/// handle subscribed, or while the agent had to stop pushing) is filled
/// with `process/read`, so the stream is complete and in order.
#[derive(Debug)]
pub struct Process {
    client: Client,
    id: String,
    pid: u32,
    sandbox_degraded: Vec<String>,
    limits_degraded: Vec<String>,
    sub: Subscription,
    next_seq: u64,
    ready: VecDeque<Output>,
    exited: Option<ProcessExited>,
    done: bool,
    /// Taken up again after it started ([`Client::attach_process`],
    /// [`Process::resume_on`]): an exit seen by `process/read` ends the
    /// stream.
    attached: bool,
    /// `next_seq` of the last `process/read` answer: the seq the agent
    /// will give the next chunk it keeps.
    read_next: u64,
}

/// A job's stdin and signals ([`Process::control`]): cheap to clone, used
/// while the [`Process`] itself reads the output elsewhere.
#[derive(Debug, Clone)]
pub struct ProcessControl {
    client: Client,
    id: String,
}

impl ProcessControl {
    /// The agent's id of the job.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Write to its stdin.
    pub async fn write(&self, data: &[u8]) -> Result<(), Error> {
        self.write_params(data, false, None).await
    }

    /// Close its stdin (EOF).
    pub async fn close_stdin(&self) -> Result<(), Error> {
        self.write_params(&[], true, None).await
    }

    async fn write_params(
        &self,
        data: &[u8],
        close_stdin: bool,
        write_id: Option<&str>,
    ) -> Result<(), Error> {
        self.client
            .request::<_, Empty>(
                m::PROCESS_WRITE,
                &ProcessWriteParams {
                    process_id: self.id.clone(),
                    data: serde_bytes::ByteBuf::from(data.to_vec()),
                    close_stdin,
                    write_id: write_id.map(str::to_owned),
                },
            )
            .await
            .map(|_| ())
    }

    /// Signal its process group.
    pub async fn signal(&self, signal: SignalName) -> Result<(), Error> {
        self.client
            .request::<_, Empty>(
                m::PROCESS_SIGNAL,
                &ProcessSignalParams {
                    process_id: self.id.clone(),
                    signal,
                },
            )
            .await
            .map(|_| ())
    }
}

impl Client {
    /// `process/start`, returning a handle on the job.
    pub async fn start(&self, params: &ProcessStartParams) -> Result<Process, Error> {
        // Subscribe before asking: output may be pushed before the answer.
        let early = self.subscribe(&[m::PROCESS_OUTPUT, m::PROCESS_EXITED, m::PROCESS_LAGGED]);
        let r: ProcessStartResult = self.request(m::PROCESS_START, params).await?;
        let sub = self.narrow_to_process(early, &r.process_id);
        Ok(Process {
            client: self.clone(),
            id: r.process_id,
            pid: r.pid,
            sandbox_degraded: r.sandbox_degraded.unwrap_or_default(),
            limits_degraded: r.limits_degraded.unwrap_or_default(),
            sub,
            next_seq: 0,
            ready: VecDeque::new(),
            exited: None,
            done: false,
            attached: false,
            read_next: 0,
        })
    }

    /// A handle on a job that already runs (or ran) in this session, for
    /// example after resuming a detached session: its output from the
    /// first chunk still held, then as it arrives.
    pub async fn attach_process(&self, process_id: &str) -> Result<Process, Error> {
        let sub = self.subscribe_process(
            &[m::PROCESS_OUTPUT, m::PROCESS_EXITED, m::PROCESS_LAGGED],
            process_id,
        );
        let pid = self
            .call(&ProcessListParams {})
            .await?
            .processes
            .into_iter()
            .find(|p| p.process_id == process_id)
            .map(|p| p.pid)
            .ok_or_else(|| {
                Error::Remote(crate::WireError::new(
                    crate::ErrorCode::UnknownProcess,
                    format!("no process {process_id:?} in this session"),
                ))
            })?;
        let mut p = Process {
            client: self.clone(),
            id: process_id.to_string(),
            pid,
            sandbox_degraded: Vec::new(),
            limits_degraded: Vec::new(),
            sub,
            next_seq: 0,
            ready: VecDeque::new(),
            exited: None,
            done: false,
            attached: true,
            read_next: 0,
        };
        p.catch_up().await?;
        Ok(p)
    }
}

impl Process {
    /// The agent's id of this job.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The client this job belongs to.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The host pid of the program.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// What of the sandbox intent was not enforced (only with
    /// `required: false`; empty when all of it was, or there was none).
    pub fn sandbox_degraded(&self) -> &[String] {
        &self.sandbox_degraded
    }

    /// What of its limits is not enforced as asked (`limits.required:
    /// false`, or the agent's defaults on a host without the means).
    pub fn limits_degraded(&self) -> &[String] {
        &self.limits_degraded
    }

    /// Its stdin and signals, as a handle apart from the output: another
    /// task can write and signal while this one reads.
    pub fn control(&self) -> ProcessControl {
        ProcessControl {
            client: self.client.clone(),
            id: self.id.clone(),
        }
    }

    /// Write to its stdin.
    pub async fn write(&self, data: &[u8]) -> Result<(), Error> {
        self.control().write_params(data, false, None).await
    }

    /// Write to its stdin once: retried with the same `write_id` (on this
    /// connection or, for a detached session, after a resume), the agent
    /// answers as the first write did and writes nothing again.
    pub async fn write_once(&self, data: &[u8], write_id: &str) -> Result<(), Error> {
        self.control()
            .write_params(data, false, Some(write_id))
            .await
    }

    /// Close its stdin (EOF).
    pub async fn close_stdin(&self) -> Result<(), Error> {
        self.control().close_stdin().await
    }

    /// Close its stdin (EOF), once per `write_id` as [`Process::write_once`].
    pub async fn close_stdin_once(&self, write_id: &str) -> Result<(), Error> {
        self.control().write_params(&[], true, Some(write_id)).await
    }

    /// Signal its process group.
    pub async fn signal(&self, signal: SignalName) -> Result<(), Error> {
        self.control().signal(signal).await
    }

    /// Resize its terminal.
    pub async fn resize(&self, rows: u16, cols: u16) -> Result<(), Error> {
        self.client
            .request::<_, Empty>(
                m::PROCESS_RESIZE,
                &ProcessResizeParams {
                    process_id: self.id.clone(),
                    rows,
                    cols,
                },
            )
            .await
            .map(|_| ())
    }

    /// Fill `ready` from `process/read` starting at `next_seq`; returns
    /// whether the read reported the exit.
    async fn catch_up(&mut self) -> Result<bool, Error> {
        let r: ProcessReadResult = self
            .client
            .request(
                m::PROCESS_READ,
                &ProcessReadParams {
                    process_id: self.id.clone(),
                    after_seq: self.next_seq.checked_sub(1),
                    max_bytes: None,
                    wait_ms: None,
                },
            )
            .await?;
        if let Some(first) = r.dropped_before {
            if first > self.next_seq {
                return Err(Error::Protocol(format!(
                    "output of {} chunks {}..{} was dropped by the agent (buffer overflow)",
                    self.id, self.next_seq, first
                )));
            }
        }
        for c in r.chunks {
            if c.seq >= self.next_seq {
                self.next_seq = c.seq + 1;
                self.ready.push_back(Output {
                    seq: c.seq,
                    stream: c.stream,
                    data: bytes::Bytes::from(c.data.into_vec()),
                });
            }
        }
        self.read_next = r.next_seq;
        let all = r.exited.is_some() && self.next_seq >= r.next_seq;
        if let (true, true, None, Some(e)) = (all, self.attached, &self.exited, &r.exited) {
            self.exited = Some(ProcessExited {
                process_id: self.id.clone(),
                exit_code: e.exit_code,
                signal: e.signal.clone(),
                signal_number: e.signal.as_deref().and_then(signal_number),
                final_seq: r.next_seq.checked_sub(1),
                sandbox_denied: None,
                usage: e.usage,
                limit_hit: e.limit_hit,
            });
        }
        Ok(all)
    }

    /// Take this job up again on `client`, a new connection that resumed
    /// its (detached) session ([`Client::reconnect`]): the output goes on
    /// from the first chunk this handle has not yet received, none
    /// repeated and none skipped (what the agent kept while detached is
    /// read with `process/read`; a chunk it had to drop, past the job's
    /// output buffer, is an [`Error::Protocol`]), and an exit missed
    /// while detached still ends the stream.
    pub async fn resume_on(&mut self, client: &Client) -> Result<(), Error> {
        self.sub = client.subscribe_process(
            &[m::PROCESS_OUTPUT, m::PROCESS_EXITED, m::PROCESS_LAGGED],
            &self.id,
        );
        self.client = client.clone();
        self.attached = true;
        // Everything the agent holds now, however many reads it takes.
        while !self.catch_up().await? && self.next_seq < self.read_next {}
        Ok(())
    }

    /// The next chunk of output, in seq order; `None` once the job exited
    /// and all its output was returned.
    pub async fn next_output(&mut self) -> Result<Option<Output>, Error> {
        loop {
            if let Some(c) = self.ready.pop_front() {
                return Ok(Some(c));
            }
            if self.done {
                return Ok(None);
            }
            if let Some(ex) = &self.exited {
                let want = ex.final_seq.map(|s| s + 1).unwrap_or(0);
                if self.next_seq >= want {
                    self.done = true;
                    continue;
                }
                self.catch_up().await?;
                continue;
            }
            let Some(note) = self.sub.recv().await else {
                return Err(Error::Closed(format!(
                    "connection closed before {} exited",
                    self.id
                )));
            };
            match note.method.as_str() {
                m::PROCESS_OUTPUT => {
                    let o: OutputNote<'_> = note.decode_borrowed()?;
                    let (seq, stream, data) = (o.seq, o.stream, note.share(o.data));
                    if seq > self.next_seq {
                        // A gap: fetch what we missed (includes this chunk).
                        self.catch_up().await?;
                    } else if seq == self.next_seq {
                        self.next_seq += 1;
                        self.ready.push_back(Output { seq, stream, data });
                    }
                }
                m::PROCESS_EXITED => self.exited = Some(note.into_decoded()?),
                m::PROCESS_LAGGED => {
                    // The agent stopped pushing until we read: read, and
                    // later gaps are filled the same way.
                    self.catch_up().await?;
                }
                _ => {}
            }
        }
    }

    /// The output as a `Stream`.
    pub fn output(self) -> impl Stream<Item = Result<Output, Error>> {
        futures_util::stream::unfold(Some(self), |state| async move {
            let mut p = state?;
            match p.next_output().await {
                Ok(Some(c)) => Some((Ok(c), Some(p))),
                Ok(None) => None,
                Err(e) => Some((Err(e), None)),
            }
        })
    }

    /// Drain the output (discarding it) and wait for the exit.
    pub async fn wait(mut self) -> Result<ExitStatus, Error> {
        while self.next_output().await?.is_some() {}
        self.exit_status()
            .ok_or_else(|| Error::Protocol("process ended without an exit report".into()))
    }

    /// The exit, once `next_output` returned `None`.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        self.exited.as_ref().map(|e| ExitStatus {
            code: e.exit_code,
            signal: e.signal.clone(),
            signal_number: e.signal_number,
            sandbox_denied: e.sandbox_denied == Some(true),
            usage: e.usage,
            limit_hit: e.limit_hit,
        })
    }
}
