//! Relaying a job's connection to its destination: both directions at
//! once, each through a kernel pipe of [`EGRESS_BUFFER_BYTES`] with
//! `splice(2)` (the bytes never enter the agent's memory), so a slow reader
//! slows the other side down instead of growing the agent.

use executor_protocol::limits::EGRESS_BUFFER_BYTES;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::TcpStream;

/// Send `early` (what the job sent past the proxy handshake) upstream, then
/// relay until both sides are done (or one fails).
pub(super) async fn run(job: TcpStream, mut upstream: TcpStream, early: &[u8]) {
    if !early.is_empty() && upstream.write_all(early).await.is_err() {
        return;
    }
    let _ = tokio::try_join!(pump(&job, &upstream), pump(&upstream, &job));
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
    // The bound per direction (the default is 64 KiB too; a smaller
    // pipe-max-size leaves the default).
    let _ = fcntl(&w, FcntlArg::F_SETPIPE_SZ(EGRESS_BUFFER_BYTES as i32));
    Ok((r, w))
}

fn would_block(r: &io::Result<usize>) -> bool {
    matches!(r, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

/// `src` to `dst` through a pipe, until EOF on `src` (then `dst`'s write
/// side is shut down).
///
/// `splice` answers `EAGAIN` both when `src` has nothing and when the pipe
/// has no room (a pipe's slots fill with partial pages before it holds its
/// size in bytes). Only the first may clear `src`'s readiness: tokio
/// forgets a readiness it was told would block and waits for the next
/// edge, so clearing it for a full pipe left bytes in the socket and the
/// relay asleep until the sender's next segment (a 1 GiB download at a
/// few percent of its speed). So `src` is read through `try_io` only while
/// the pipe is empty; with bytes held, an `EAGAIN` is taken as "drain the
/// pipe first", and the pump waits for `dst` alone.
pub(super) async fn pump(src: &TcpStream, dst: &TcpStream) -> io::Result<()> {
    use executor_sys::splice_nonblocking as splice;
    let (pr, pw) = pipe()?;
    let mut held = 0usize;
    let mut eof = false;
    loop {
        let mut progressed = false;
        // Set when `src` could not be read for a reason that may be the
        // pipe: its readiness was kept, so waiting on it would spin.
        let mut pipe_full = false;
        if !eof && held < EGRESS_BUFFER_BYTES {
            let room = EGRESS_BUFFER_BYTES - held;
            let r = if held == 0 {
                src.try_io(Interest::READABLE, || splice(src.as_fd(), pw.as_fd(), room))
            } else {
                splice(src.as_fd(), pw.as_fd(), room)
            };
            match r {
                Ok(0) => eof = true,
                Ok(n) => {
                    held += n;
                    progressed = true;
                }
                ref r if would_block(r) => pipe_full = held > 0,
                Err(e) => return Err(e),
            }
        }
        if held > 0 {
            // With bytes in the pipe, `EAGAIN` can only mean `dst` is full.
            let r = dst.try_io(Interest::WRITABLE, || splice(pr.as_fd(), dst.as_fd(), held));
            match r {
                Ok(n) => {
                    held -= n;
                    progressed = true;
                }
                ref r if would_block(r) => {}
                Err(e) => return Err(e),
            }
        }
        if eof && held == 0 {
            let _ = nix::sys::socket::shutdown(
                std::os::fd::AsRawFd::as_raw_fd(dst),
                nix::sys::socket::Shutdown::Write,
            );
            return Ok(());
        }
        if progressed {
            continue;
        }
        // Nothing moved: wait for the side that can unblock us.
        tokio::select! {
            r = src.readable(), if !eof && held < EGRESS_BUFFER_BYTES && !pipe_full => r?,
            r = dst.writable(), if held > 0 => r?,
        }
    }
}
