//! One reader of the terminal. The CLI asks the user questions on the
//! controlling terminal (`--net ask`) while `run` may be forwarding the
//! same terminal, as its stdin, to the job: two readers of one terminal
//! race for every line, and the job would get the answer (and the question
//! would wait for its timeout). So while `run` forwards a terminal it is
//! the only reader: a question registers here and the forwarder hands it
//! the next line it reads ([`route`]) instead of giving it to the job. An
//! answer is a whole line typed while its question is asked: the rest of
//! a line begun before it stays the job's, and the rest of an answer
//! whose question ended goes nowhere (with `--tty` every key arrives as
//! typed, so a line can span two questions).
//! Without a forwarder (`-n`, `cat`, `http`) the question reads the
//! terminal itself. Every question is bounded by the agent's own timeout.
//!
//! Depends on nothing else of the CLI.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

/// The longest answer kept (the rest of a longer line is dropped, so it
/// cannot match a destination).
const MAX_ANSWER: usize = 512;

struct Hub {
    /// `run` forwards the terminal to a job (it reads the terminal).
    forwarding: bool,
    /// The question waiting for the next line the forwarder reads.
    pending: Option<mpsc::Sender<String>>,
    /// What of that line has arrived.
    line: Vec<u8>,
    /// The last byte the forwarder read ended a line (or none came yet).
    at_line_start: bool,
    /// The rest of the line being typed is not an answer: an answer is a
    /// whole line typed while its question is asked, never the end of a
    /// line begun before it (for the job, or for a question that ended).
    skip: Option<Skip>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Skip {
    /// A line for the job was being typed when the question came: the
    /// rest of it is the job's.
    ToJob,
    /// An answer was being typed when its question ended: the rest of it
    /// goes nowhere.
    Drop,
}

static HUB: Mutex<Hub> = Mutex::new(Hub {
    forwarding: false,
    pending: None,
    line: Vec::new(),
    at_line_start: true,
    skip: None,
});

fn hub() -> std::sync::MutexGuard<'static, Hub> {
    HUB.lock().unwrap_or_else(|e| e.into_inner())
}

/// `run`'s forwarder reads this process's stdin, which is a terminal, from
/// now on (`false`: no longer). Questions then take their answer from it.
pub fn forwarding_terminal(on: bool) {
    let mut h = hub();
    h.forwarding = on;
    if !on {
        // A question still waiting reads the terminal itself no more: it
        // is denied (its sender dropped) rather than left without input.
        h.pending = None;
        h.line.clear();
        h.skip = None;
        h.at_line_start = true;
    }
}

/// The part of `data` (just read from the terminal by the forwarder) that
/// goes to the job; the rest is the answer to a waiting question, up to
/// and including the end of its line (`\r`, `\n`, or `\r\n`). Routed bytes
/// are echoed when the terminal does not echo them itself (raw mode, as
/// with `--tty`).
pub fn route(data: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    let mut h = hub();
    if h.pending.is_none() && h.skip.is_none() {
        if let Some(&last) = data.last() {
            h.at_line_start = matches!(last, b'\r' | b'\n');
        }
        // The common case: no question, the chunk goes as it is.
        return std::borrow::Cow::Borrowed(data);
    }
    let mut to_job = Vec::new();
    let mut shown = Vec::new();
    let mut i = 0;
    while i < data.len() {
        let start = i;
        let b = data[i];
        i += 1;
        let eol = b == b'\r' || b == b'\n';
        if b == b'\r' && data.get(i) == Some(&b'\n') {
            i += 1;
        }
        let bytes = &data[start..i];
        match (h.skip, h.pending.is_some()) {
            (Some(Skip::ToJob), _) | (None, false) => to_job.extend_from_slice(bytes),
            (Some(Skip::Drop), _) => shown.extend_from_slice(bytes),
            (None, true) => {
                shown.extend_from_slice(bytes);
                if eol {
                    let answer = String::from_utf8_lossy(&h.line).trim().to_string();
                    h.line.clear();
                    if let Some(tx) = h.pending.take() {
                        let _ = tx.send(answer);
                    }
                } else if h.line.len() < MAX_ANSWER {
                    h.line.push(b);
                }
            }
        }
        if eol {
            h.skip = None;
        }
        h.at_line_start = eol;
    }
    if !shown.is_empty() && !terminal_echoes() {
        echo(&shown);
    }
    std::borrow::Cow::Owned(to_job)
}

fn terminal_echoes() -> bool {
    nix::sys::termios::tcgetattr(std::io::stdin().as_fd())
        .is_ok_and(|t| t.local_flags.contains(nix::sys::termios::LocalFlags::ECHO))
}

fn echo(bytes: &[u8]) {
    if let Ok(mut tty) = std::fs::OpenOptions::new().write(true).open("/dev/tty") {
        let shown: Vec<u8> = bytes
            .iter()
            .map(|&b| match b {
                b'\r' | b'\n' => b'\n',
                b if b.is_ascii_graphic() || b == b' ' => b,
                _ => b'?',
            })
            .collect();
        let _ = tty.write_all(&shown);
        if shown.last() == Some(&b'\n') {
            let _ = tty.write_all(b"\r");
        }
    }
}

/// Put `question` on the controlling terminal and return the line typed
/// back, `None` without a terminal or when `timeout` passes first (then
/// the terminal says so). Blocking: call it from a blocking thread.
pub fn ask(question: &str, timeout: Duration) -> Option<String> {
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .ok()?;
    let mut out = &tty;
    out.write_all(question.as_bytes()).ok()?;
    let rx = register();
    let answer = match rx {
        Some(rx) => {
            let got = rx.recv_timeout(timeout).ok();
            if got.is_none() {
                let mut h = hub();
                h.pending = None;
                if !h.line.is_empty() {
                    h.skip = Some(Skip::Drop);
                }
                h.line.clear();
            }
            got
        }
        None => read_line(&tty, Instant::now() + timeout),
    };
    let _ = out.write_all(match answer {
        Some(_) => b"\r\n".as_slice(),
        None => b"\r\nexecutor-client: no answer in time: denied\r\n".as_slice(),
    });
    answer
}

/// While the forwarder reads the terminal: the question waiting for its
/// next whole line.
fn register() -> Option<mpsc::Receiver<String>> {
    let mut h = hub();
    if !h.forwarding {
        return None;
    }
    let (tx, rx) = mpsc::channel();
    h.pending = Some(tx);
    h.line.clear();
    if !h.at_line_start && h.skip.is_none() {
        h.skip = Some(Skip::ToJob);
    }
    Some(rx)
}

/// A line from the terminal (ended by `\n` or `\r`, as a terminal in raw
/// mode sends Enter), `None` at `deadline` or end of input.
fn read_line(tty: &std::fs::File, deadline: Instant) -> Option<String> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    let mut input = tty;
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(tty.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return None,
        }
        match input.read(&mut byte) {
            Ok(1) if matches!(byte[0], b'\n' | b'\r') => break,
            Ok(1) => {
                if line.len() < MAX_ANSWER {
                    line.push(byte[0]);
                }
            }
            _ => return None,
        }
    }
    Some(String::from_utf8_lossy(&line).trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiting_question_takes_one_line_and_the_job_the_rest() {
        forwarding_terminal(true);
        assert_eq!(&*route(b"for the job"), b"for the job");
        let (tx, rx) = mpsc::channel();
        hub().pending = Some(tx);
        assert_eq!(&*route(b"mirror.int"), b"");
        assert_eq!(&*route(b"ernal:443\r\nmore"), b"more");
        assert_eq!(rx.try_recv().unwrap(), "mirror.internal:443");
        assert_eq!(&*route(b"after"), b"after");
        // A line for the job begun before the question stays the job's;
        // the answer is the next whole line.
        let rx = register().unwrap();
        assert_eq!(
            &*route(b" mirror.internal:443\r"),
            b" mirror.internal:443\r"
        );
        assert!(rx.try_recv().is_err());
        assert_eq!(&*route(b"mirror.internal:443\rnext"), b"next");
        assert_eq!(rx.try_recv().unwrap(), "mirror.internal:443");
        forwarding_terminal(false);
    }
}
