//! Where [`Client::read_stream_into`](crate::Client::read_stream_into) puts
//! a file's bytes: a descriptor of the caller's, classified once
//! ([`Sink`]), written without ever making a worker of the runtime wait
//! for another process; and, on Linux, the connection reader's
//! `splice(2)` of a `fs/readStream/data` frame's payload from the transport
//! pipe straight into it ([`splice_payload`]). Depends on the crate's
//! [`Notification`] only.

use crate::Notification;
use bytes::Bytes;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// A descriptor to write a stream into, as this process's own copy (the
/// caller's descriptor stays theirs, its flags untouched).
#[derive(Debug)]
pub(crate) enum Sink {
    /// A regular file or `/dev/null`: a write ends without waiting for
    /// another process. `splice`: whether `splice(2)` may write it (not
    /// with `O_APPEND`, which it refuses).
    Direct { file: std::fs::File, splice: bool },
    /// A pipe, reopened as a file description of our own that is
    /// nonblocking (the caller's stays as it is): written when it is ready.
    #[cfg(target_os = "linux")]
    Ready(tokio::net::unix::pipe::Sender),
    /// Anything else (a terminal, a socket, a pipe that cannot be
    /// reopened): written on a blocking thread.
    Blocking(Arc<std::fs::File>),
}

impl Sink {
    /// Classify `fd` and take a descriptor of our own for it. A descriptor
    /// not open for writing is `InvalidInput`.
    pub(crate) fn new(fd: BorrowedFd<'_>) -> io::Result<Sink> {
        use nix::fcntl::{fcntl, FcntlArg, OFlag};
        use nix::sys::stat::SFlag;
        let st = nix::sys::stat::fstat(fd)?;
        let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
        if flags & OFlag::O_ACCMODE == OFlag::O_RDONLY {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the sink descriptor is not open for writing",
            ));
        }
        let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
        let own = || -> io::Result<std::fs::File> { Ok(nix::unistd::dup(fd)?.into()) };
        let dev_null = kind == SFlag::S_IFCHR && st.st_rdev == nix::sys::stat::makedev(1, 3);
        if kind == SFlag::S_IFREG || dev_null {
            return Ok(Sink::Direct {
                file: own()?,
                splice: !flags.contains(OFlag::O_APPEND),
            });
        }
        #[cfg(target_os = "linux")]
        if kind == SFlag::S_IFIFO {
            if let Some(pipe) = reopen_nonblocking(fd, &st) {
                return Ok(Sink::Ready(tokio::net::unix::pipe::Sender::from_owned_fd(
                    pipe,
                )?));
            }
        }
        Ok(Sink::Blocking(Arc::new(own()?)))
    }

    /// Whether the connection reader may write this sink itself (splice
    /// into it, and write without waiting).
    pub(crate) fn splice_ok(&self) -> bool {
        match self {
            Sink::Direct { splice, .. } => *splice && cfg!(target_os = "linux"),
            #[cfg(target_os = "linux")]
            Sink::Ready(_) => true,
            Sink::Blocking(_) => false,
        }
    }

    /// Write all of `data`, waiting (without blocking a worker) as long as
    /// the sink needs.
    pub(crate) async fn write_all(&self, data: Bytes) -> io::Result<()> {
        match self {
            Sink::Direct { file, .. } => (&*file).write_all(&data),
            #[cfg(target_os = "linux")]
            Sink::Ready(pipe) => {
                let mut at = 0;
                while at < data.len() {
                    pipe.writable().await?;
                    match pipe.try_write(&data[at..]) {
                        Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                        Ok(n) => at += n,
                        Err(e)
                            if matches!(
                                e.kind(),
                                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                            ) => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            }
            Sink::Blocking(file) => {
                let file = file.clone();
                tokio::task::spawn_blocking(move || (&*file).write_all(&data))
                    .await
                    .map_err(io::Error::other)?
            }
        }
    }

    /// One write of a part of `data` that never waits for another process:
    /// `WouldBlock` when a pipe or socket is full. For the reader, on a
    /// sink it may write ([`Sink::splice_ok`]).
    fn write_now(&self, data: &[u8]) -> io::Result<usize> {
        match self {
            Sink::Direct { file, .. } => loop {
                match (&*file).write(data) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    r => return r,
                }
            },
            #[cfg(target_os = "linux")]
            // Past tokio's readiness (the task's waits keep it right): the
            // descriptor is nonblocking.
            Sink::Ready(pipe) => loop {
                match nix::unistd::write(pipe.as_fd(), data) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => return Ok(n),
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => return Err(e.into()),
                }
            },
            Sink::Blocking(_) => Err(io::Error::from(io::ErrorKind::Unsupported)),
        }
    }
}

/// The pipe `fd` is, opened anew (`/proc/self/fd`) as a nonblocking
/// file description of our own: its `O_NONBLOCK` is not seen by whoever
/// else shares the caller's (a shell's pipe). `None` when that cannot be
/// done (no procfs, no reader left) or what opened is another file.
#[cfg(target_os = "linux")]
fn reopen_nonblocking(
    fd: BorrowedFd<'_>,
    st: &nix::sys::stat::FileStat,
) -> Option<std::os::fd::OwnedFd> {
    use nix::fcntl::OFlag;
    use std::os::fd::AsRawFd;
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let flags = OFlag::O_WRONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOCTTY;
    let new = nix::fcntl::open(path.as_str(), flags, nix::sys::stat::Mode::empty()).ok()?;
    let got = nix::sys::stat::fstat(&new).ok()?;
    (got.st_dev == st.st_dev && got.st_ino == st.st_ino).then_some(new)
}

/// What the connection reader knows of a stream registered with a sink;
/// shared with the stream's task ([`Client::read_stream_into`](crate::Client::read_stream_into)).
#[derive(Debug)]
pub(crate) struct SinkState {
    pub(crate) sink: Sink,
    /// Data events sent to the task and not yet written by it: the reader
    /// writes the sink itself only when this is 0 (so bytes stay in order
    /// and one writer at a time).
    pub(crate) queued: AtomicUsize,
    /// The task let go: the reader writes nothing more.
    pub(crate) closed: AtomicBool,
    /// `splice(2)` refused the sink (`EINVAL`): the task writes it all.
    pub(crate) no_splice: AtomicBool,
}

impl SinkState {
    pub(crate) fn new(sink: Sink) -> SinkState {
        SinkState {
            sink,
            queued: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            no_splice: AtomicBool::new(false),
        }
    }

    /// Whether the reader may write this sink now.
    pub(crate) fn reader_may_write(&self) -> bool {
        self.queued.load(Ordering::Acquire) == 0
            && !self.closed.load(Ordering::Acquire)
            && !self.no_splice.load(Ordering::Acquire)
            && self.sink.splice_ok()
    }
}

/// A stream's registration in the connection reader (the sender to its
/// task lives here only, so that closing the connection ends the task).
#[derive(Debug, Clone)]
pub(crate) struct SinkEntry {
    pub(crate) state: Arc<SinkState>,
    pub(crate) tx: mpsc::UnboundedSender<SinkEvent>,
}

impl SinkEntry {
    /// Bytes for the task to write (counted in `queued` until it did).
    pub(crate) fn queue(&self, offset: u64, data: Bytes) {
        if data.is_empty() || self.state.closed.load(Ordering::Acquire) {
            return;
        }
        self.state.queued.fetch_add(1, Ordering::AcqRel);
        let _ = self.tx.send(SinkEvent::Data { offset, data });
    }

    /// A whole frame of the stream for the task (counted in `queued` when
    /// it holds data).
    pub(crate) fn frame(&self, note: Notification, data: bool) {
        if data {
            self.state.queued.fetch_add(1, Ordering::AcqRel);
        }
        let _ = self.tx.send(SinkEvent::Frame(note));
    }
}

/// What the reader tells a stream's task, in the order of the stream.
#[derive(Debug)]
pub(crate) enum SinkEvent {
    /// The reader wrote `len` bytes at `offset` into the sink itself.
    Wrote { offset: u64, len: u64 },
    /// Bytes at `offset` for the task to write (the sink was full, or
    /// could not be spliced into).
    Data { offset: u64, data: Bytes },
    /// A frame of the stream read whole: a data block or the end.
    Frame(Notification),
    /// Writing the sink failed; the reader writes no more to it.
    Failed(io::Error),
}

/// How far the reader got with a frame's payload: `written` bytes are in
/// the sink, `unwritten` (from memory) and then `left` more (still in the
/// transport) are not.
#[derive(Debug)]
pub(crate) struct Taken {
    pub(crate) written: usize,
    pub(crate) unwritten: Bytes,
    pub(crate) left: usize,
    pub(crate) failed: Option<io::Error>,
}

/// Write a `fs/readStream/data` payload of `len` bytes into the sink:
/// `buffered` (its first bytes, already read) from memory, then exactly
/// the rest with `splice(2)` from the transport pipe `src`, never past the
/// frame's end. Stops early, without waiting, when the sink is full (the
/// rest is for the task), refuses `splice` or fails; only the transport is
/// waited for. `Err` is the transport's failure (or its end).
#[cfg(target_os = "linux")]
pub(crate) async fn splice_payload(
    src: &tokio::net::unix::pipe::Receiver,
    state: &SinkState,
    mut buffered: Bytes,
    len: usize,
) -> io::Result<Taken> {
    let mut taken = Taken {
        written: 0,
        unwritten: Bytes::new(),
        left: len - buffered.len(),
        failed: None,
    };
    while !buffered.is_empty() {
        match state.sink.write_now(&buffered) {
            Ok(n) => {
                let _ = buffered.split_to(n);
                taken.written += n;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => {
                taken.failed = Some(e);
                break;
            }
        }
    }
    taken.unwritten = buffered;
    if !taken.unwritten.is_empty() || taken.failed.is_some() {
        return Ok(taken);
    }
    while taken.left > 0 && !state.closed.load(Ordering::Acquire) {
        src.readable().await?;
        match src.try_io(|| splice_once(src.as_fd(), &state.sink, taken.left)) {
            Ok(Step::Moved(0)) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the agent's output ended inside a frame",
                ))
            }
            Ok(Step::Moved(n)) => {
                taken.left -= n;
                taken.written += n;
            }
            Ok(Step::SinkFull) => break,
            Ok(Step::Refused) => {
                state.no_splice.store(true, Ordering::Release);
                break;
            }
            Ok(Step::Failed(e)) => {
                taken.failed = Some(e);
                break;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(taken)
}

#[cfg(target_os = "linux")]
enum Step {
    Moved(usize),
    SinkFull,
    Refused,
    Failed(io::Error),
}

/// One `splice(2)` of at most `len` bytes from the pipe `src` into the
/// sink, neither side waited for. `Err(WouldBlock)` only when the pipe is
/// empty (what `try_io` clears readiness on); a full sink is `SinkFull`.
#[cfg(target_os = "linux")]
fn splice_once(src: BorrowedFd<'_>, sink: &Sink, len: usize) -> io::Result<Step> {
    use nix::errno::Errno;
    use nix::fcntl::SpliceFFlags;
    let (out, waits) = match sink {
        Sink::Direct { file, .. } => (file.as_fd(), false),
        Sink::Ready(pipe) => (pipe.as_fd(), true),
        Sink::Blocking(_) => return Ok(Step::Refused),
    };
    let flags = SpliceFFlags::SPLICE_F_NONBLOCK | SpliceFFlags::SPLICE_F_MOVE;
    let mut tries = 0;
    loop {
        match nix::fcntl::splice(src, None, out, None, len, flags) {
            Ok(n) => return Ok(Step::Moved(n)),
            Err(Errno::EINTR) => continue,
            Err(Errno::EAGAIN) => {
                // Either side may be the one that would block: only an
                // empty pipe may clear its readiness.
                if !readable_now(src) {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                tries += 1;
                if waits || tries > 8 {
                    return Ok(Step::SinkFull);
                }
            }
            Err(Errno::EINVAL) => return Ok(Step::Refused),
            Err(e) => return Ok(Step::Failed(e.into())),
        }
    }
}

/// Whether the pipe `fd` has bytes (or its end) to read now.
#[cfg(target_os = "linux")]
fn readable_now(fd: BorrowedFd<'_>) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
}
