//! A delegated cgroup from the user's systemd: an unprivileged agent whose
//! own cgroup is not writable (a login session's scope belongs to root)
//! asks the user's service manager for a transient scope holding itself,
//! with `Delegate=yes`, as rootless container runtimes do. The manager
//! moves the agent into `executor-PID-START.scope` and gives the agent's
//! user that cgroup; [`super::Cgroups::setup`] then uses it as the agent's
//! own.
//!
//! One D-Bus method call (`StartTransientUnit`) on the manager's private
//! socket, `$XDG_RUNTIME_DIR/systemd/private` (a peer-to-peer connection,
//! no bus daemon: what `systemctl --user` uses first). Hand-written rather
//! than `zbus`: the call is made while the agent is still single-threaded,
//! before its spawner forks, and `zbus` runs executor threads of its own;
//! one call needs a few dozen lines of the wire format, nothing more.
//! Bounded: one deadline for the connect and every read and write, a size
//! cap on every reply.
//! Nothing the manager says is trusted: the caller checks where
//! `/proc/self/cgroup` puts it afterwards, and whether that is writable.
//!
//! Depends on `std` and `nix` only.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// The largest reply read (systemd's answers here are a few hundred bytes).
const MAX_MESSAGE: usize = 64 << 10;

/// Ask the manager listening on `socket` for the scope `unit` holding
/// this process, with `Delegate=yes`; `Ok` once the manager accepted the
/// job (the move itself follows: the caller waits for it). The error
/// names the manager's refusal, or what failed on the wire.
pub fn start_scope(socket: &Path, unit: &str, within: Duration) -> io::Result<()> {
    let deadline = Instant::now() + within;
    let mut s = Deadlined {
        s: connect(socket, deadline)?,
        deadline,
    };
    let uid = nix::unistd::geteuid().as_raw();
    same_user_and_pid_namespace(&s.s, uid)?;
    // SASL EXTERNAL: the manager checks the uid against the socket's
    // peer credentials.
    let hex: String = uid
        .to_string()
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect();
    s.write_all(format!("\0AUTH EXTERNAL {hex}\r\n").as_bytes())?;
    let line = read_line(&mut s)?;
    if !line.starts_with("OK ") {
        return Err(io::Error::other(format!(
            "the manager refused the authentication: {line:?}"
        )));
    }
    s.write_all(b"BEGIN\r\n")?;
    let serial = 1;
    s.write_all(&start_transient_unit(unit, std::process::id(), serial))?;
    loop {
        let m = read_message(&mut s)?;
        if m.reply_serial != Some(serial) {
            continue; // a signal, or another reply: not ours
        }
        return match m.kind {
            METHOD_RETURN => Ok(()),
            _ => Err(io::Error::other(format!(
                "the manager refused the scope {unit}: {} {}",
                m.error_name.as_deref().unwrap_or("(no error name)"),
                m.error_text.as_deref().unwrap_or("")
            ))),
        };
    }
}

/// A stream whose every read and write waits only until `deadline` (one
/// bound for the whole exchange, however the peer spaces its bytes).
struct Deadlined {
    s: UnixStream,
    deadline: Instant,
}

impl Deadlined {
    fn left(&self) -> io::Result<Duration> {
        self.deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the manager did not answer in time",
                )
            })
    }
}

impl Read for Deadlined {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.left()?;
        self.s.set_read_timeout(Some(left))?;
        self.s.read(buf).map_err(timed_out)
    }
}

impl Write for Deadlined {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let left = self.left()?;
        self.s.set_write_timeout(Some(left))?;
        self.s.write(buf).map_err(timed_out)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A socket timeout (`EAGAIN`) is the deadline passing.
fn timed_out(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::WouldBlock {
        io::Error::new(
            io::ErrorKind::TimedOut,
            "the manager did not answer in time",
        )
    } else {
        e
    }
}

/// Connect to the manager's socket by `deadline`: the socket must be
/// this user's (checked without following a link), and a listener whose
/// backlog is full (`EAGAIN` on a non-blocking connect) is retried until
/// then, never waited on without bound.
fn connect(socket: &Path, deadline: Instant) -> io::Result<UnixStream> {
    use nix::sys::socket::{socket as new_socket, AddressFamily, SockFlag, SockType, UnixAddr};
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let euid = nix::unistd::geteuid().as_raw();
    let st = std::fs::symlink_metadata(socket)?;
    if !st.file_type().is_socket() || st.uid() != euid {
        return Err(io::Error::other(format!(
            "not a socket of uid {euid} (a {:?} of uid {})",
            st.file_type(),
            st.uid()
        )));
    }
    let fd = new_socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    let addr = UnixAddr::new(socket)?;
    loop {
        match nix::sys::socket::connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr) {
            Ok(()) => break,
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR)
                if Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(nix::errno::Errno::EAGAIN) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the manager's socket accepted no connection in time",
                ))
            }
            Err(e) => return Err(e.into()),
        }
    }
    let s = UnixStream::from(fd);
    s.set_nonblocking(false)?;
    Ok(s)
}

/// The manager at the other end runs as this agent's user, in this
/// agent's PID namespace: the pid the call names is read in the manager's
/// namespace, and in another one it would be another process (a manager
/// outside a container whose socket was bound into it). Checked by the
/// kernel's peer credentials and the namespaces' identities.
fn same_user_and_pid_namespace(s: &UnixStream, uid: u32) -> io::Result<()> {
    let cred = nix::sys::socket::getsockopt(s, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(io::Error::from)?;
    if cred.uid() != uid {
        return Err(io::Error::other(format!(
            "the manager runs as uid {}, not as this agent's {uid}",
            cred.uid()
        )));
    }
    // `/proc` must be this PID namespace's: the peer's pid is numbered
    // in it, and looked up there.
    let me = std::fs::read_link("/proc/self")?;
    if me.as_os_str() != std::process::id().to_string().as_str() {
        return Err(io::Error::other(format!(
            "/proc is not this PID namespace's (/proc/self is {}, this process {})",
            me.display(),
            std::process::id()
        )));
    }
    let ours = std::fs::read_link("/proc/self/ns/pid")?;
    let theirs = (cred.pid() > 0)
        .then(|| std::fs::read_link(format!("/proc/{}/ns/pid", cred.pid())).ok())
        .flatten();
    if theirs.as_ref() != Some(&ours) {
        return Err(io::Error::other(format!(
            "the manager (pid {} here) is not in this agent's PID namespace ({}): \
             the pid it would move is not this agent's",
            cred.pid(),
            ours.display()
        )));
    }
    Ok(())
}

/// One `\r\n`-ended line of the authentication exchange (bounded).
fn read_line(s: &mut impl Read) -> io::Result<String> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while !line.ends_with(b"\r\n") {
        if line.len() > 512 {
            return Err(io::Error::other(
                "the manager's authentication line is too long",
            ));
        }
        if s.read(&mut b)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        line.push(b[0]);
    }
    line.truncate(line.len() - 2);
    Ok(String::from_utf8_lossy(&line).into_owned())
}

const METHOD_CALL: u8 = 1;
const METHOD_RETURN: u8 = 2;

/// A message body or header under construction (little-endian, offsets
/// from the message's start, which keeps every alignment right: the body
/// starts at a multiple of 8).
#[derive(Default)]
struct Out(Vec<u8>);

impl Out {
    fn pad(&mut self, to: usize) {
        while self.0.len() % to != 0 {
            self.0.push(0);
        }
    }
    fn u32(&mut self, v: u32) {
        self.pad(4);
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn str(&mut self, v: &str) {
        self.u32(v.len() as u32);
        self.0.extend_from_slice(v.as_bytes());
        self.0.push(0);
    }
    fn sig(&mut self, v: &str) {
        self.0.push(v.len() as u8);
        self.0.extend_from_slice(v.as_bytes());
        self.0.push(0);
    }
    /// An array: its length (in bytes, from its first element) patched in
    /// after `f` wrote the elements, aligned to `align`.
    fn array(&mut self, align: usize, f: impl FnOnce(&mut Out)) {
        self.u32(0);
        let at = self.0.len() - 4;
        self.pad(align);
        let start = self.0.len();
        f(self);
        let len = (self.0.len() - start) as u32;
        self.0[at..at + 4].copy_from_slice(&len.to_le_bytes());
    }
}

/// `StartTransientUnit(unit, "fail", [Delegate, PIDs, Description], [])`
/// on `org.freedesktop.systemd1.Manager`.
fn start_transient_unit(unit: &str, pid: u32, serial: u32) -> Vec<u8> {
    let mut body = Out::default();
    body.str(unit);
    body.str("fail");
    body.array(8, |a| {
        a.pad(8);
        a.str("Delegate");
        a.sig("b");
        a.u32(1);
        a.pad(8);
        a.str("PIDs");
        a.sig("au");
        a.array(4, |p| p.u32(pid));
        a.pad(8);
        a.str("Description");
        a.sig("s");
        a.str("executor agent (its jobs' cgroups)");
    });
    body.array(8, |_| {});
    let mut m = Out::default();
    m.0.extend_from_slice(&[b'l', METHOD_CALL, 0, 1]);
    m.u32(body.0.len() as u32);
    m.u32(serial);
    m.array(8, |f| {
        let mut field = |code: u8, sig: &str, value: &str| {
            f.pad(8);
            f.0.push(code);
            f.sig(sig);
            if sig == "g" {
                f.sig(value);
            } else {
                f.str(value);
            }
        };
        field(1, "o", "/org/freedesktop/systemd1");
        field(2, "s", "org.freedesktop.systemd1.Manager");
        field(3, "s", "StartTransientUnit");
        field(6, "s", "org.freedesktop.systemd1");
        field(8, "g", "ssa(sv)a(sa(sv))");
    });
    m.pad(8);
    m.0.extend_from_slice(&body.0);
    m.0
}

/// What the caller needs of a message the manager sent.
#[derive(Debug, Default, PartialEq, Eq)]
struct Message {
    kind: u8,
    reply_serial: Option<u32>,
    error_name: Option<String>,
    /// An error's first body argument, when it is a string.
    error_text: Option<String>,
}

fn read_message(s: &mut impl Read) -> io::Result<Message> {
    let mut fixed = [0u8; 16];
    s.read_exact(&mut fixed)?;
    let little = match fixed[0] {
        b'l' => true,
        b'B' => false,
        b => {
            return Err(io::Error::other(format!(
                "not a D-Bus message (byte {b:#x})"
            )))
        }
    };
    let u32_at = |b: &[u8], i: usize| {
        let w: [u8; 4] = b[i..i + 4].try_into().unwrap();
        if little {
            u32::from_le_bytes(w)
        } else {
            u32::from_be_bytes(w)
        }
    };
    let body_len = u32_at(&fixed, 4) as usize;
    let fields_len = u32_at(&fixed, 12) as usize;
    let total = 16usize
        .checked_add(fields_len)
        .map(|n| n.next_multiple_of(8))
        .and_then(|n| n.checked_add(body_len))
        .unwrap_or(usize::MAX);
    if total > MAX_MESSAGE {
        return Err(io::Error::other(format!(
            "a message of {total} bytes from the manager (the most read is {MAX_MESSAGE})"
        )));
    }
    let mut m = fixed.to_vec();
    m.resize(total, 0);
    s.read_exact(&mut m[16..])?;
    parse(&m, little, fields_len)
}

/// The header fields of message `m` (whole, `fields_len` bytes of them)
/// and an error's text.
fn parse(m: &[u8], little: bool, fields_len: usize) -> io::Result<Message> {
    let bad = || io::Error::other("a malformed message from the manager");
    let u32_at = |i: usize| -> io::Result<u32> {
        let w: [u8; 4] = m.get(i..i + 4).ok_or_else(bad)?.try_into().unwrap();
        Ok(if little {
            u32::from_le_bytes(w)
        } else {
            u32::from_be_bytes(w)
        })
    };
    let string_at = |i: usize| -> io::Result<(String, usize)> {
        let n = u32_at(i)? as usize;
        let b = m.get(i + 4..i + 4 + n).ok_or_else(bad)?;
        Ok((String::from_utf8_lossy(b).into_owned(), i + 4 + n + 1))
    };
    let mut msg = Message {
        kind: m[1],
        ..Message::default()
    };
    let end = 16 + fields_len;
    let mut i = 16;
    let mut body_sig = String::new();
    while i < end {
        let code = *m.get(i).ok_or_else(bad)?;
        let n = *m.get(i + 1).ok_or_else(bad)? as usize;
        let sig = m.get(i + 2..i + 2 + n).ok_or_else(bad)?;
        let mut at = i + 2 + n + 1;
        match sig {
            b"u" => {
                at = at.next_multiple_of(4);
                if code == 5 {
                    msg.reply_serial = Some(u32_at(at)?);
                }
                at += 4;
            }
            b"s" | b"o" => {
                at = at.next_multiple_of(4);
                let (v, next) = string_at(at)?;
                if code == 4 {
                    msg.error_name = Some(v);
                }
                at = next;
            }
            b"g" => {
                let n = *m.get(at).ok_or_else(bad)? as usize;
                let v = m.get(at + 1..at + 1 + n).ok_or_else(bad)?;
                if code == 8 {
                    body_sig = String::from_utf8_lossy(v).into_owned();
                }
                at += 1 + n + 1;
            }
            _ => return Err(bad()),
        }
        i = at.next_multiple_of(8);
    }
    if msg.kind != METHOD_RETURN && body_sig.starts_with('s') {
        msg.error_text = string_at(end.next_multiple_of(8)).ok().map(|(s, _)| s);
    }
    Ok(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The call's bytes, field by field, at the offsets the D-Bus
    /// specification's alignment rules give (worked out by hand). The
    /// suite's `limits::an_unprivileged_agent_gets_a_scope_from_the_users_systemd`
    /// has a real systemd take it.
    #[test]
    fn the_call_is_laid_out_as_the_specification_says() {
        let m = start_transient_unit("executor-1-2.scope", 77, 9);
        assert_eq!(&m[..4], &[b'l', METHOD_CALL, 0, 1]);
        let body_len = u32::from_le_bytes(m[4..8].try_into().unwrap()) as usize;
        assert_eq!(u32::from_le_bytes(m[8..12].try_into().unwrap()), 9);
        let fields_len = u32::from_le_bytes(m[12..16].try_into().unwrap()) as usize;
        let body = (16 + fields_len).next_multiple_of(8);
        assert_eq!(m.len(), body + body_len);
        // Fields: path first, at 16, code 1 with signature "o".
        assert_eq!(&m[16..20], &[1, 1, b'o', 0]);
        assert_eq!(u32::from_le_bytes(m[20..24].try_into().unwrap()), 25);
        assert_eq!(&m[24..49], b"/org/freedesktop/systemd1");
        // The body: the unit's name, then "fail".
        let b = &m[body..];
        assert_eq!(u32::from_le_bytes(b[0..4].try_into().unwrap()), 18);
        assert_eq!(&b[4..22], b"executor-1-2.scope");
        assert_eq!(b[22], 0);
        assert_eq!(u32::from_le_bytes(b[24..28].try_into().unwrap()), 4);
        assert_eq!(&b[28..33], b"fail\0");
        // The properties' array: its length at 36, its first struct at 40
        // (8-aligned), "Delegate" with a boolean variant true.
        let props_len = u32::from_le_bytes(b[36..40].try_into().unwrap()) as usize;
        assert_eq!(u32::from_le_bytes(b[40..44].try_into().unwrap()), 8);
        assert_eq!(&b[44..53], b"Delegate\0");
        assert_eq!(&b[53..56], &[1, b'b', 0]);
        assert_eq!(u32::from_le_bytes(b[56..60].try_into().unwrap()), 1);
        // "PIDs" at 64: the array of one pid.
        assert_eq!(&b[68..73], b"PIDs\0");
        assert_eq!(&b[73..77], &[2, b'a', b'u', 0]);
        assert_eq!(u32::from_le_bytes(b[80..84].try_into().unwrap()), 4);
        assert_eq!(u32::from_le_bytes(b[84..88].try_into().unwrap()), 77);
        // The auxiliary units: an empty array, 8-aligned after its length.
        let aux = 40 + props_len;
        let aux = aux.next_multiple_of(4);
        assert_eq!(u32::from_le_bytes(b[aux..aux + 4].try_into().unwrap()), 0);
        assert_eq!(b.len(), (aux + 4).next_multiple_of(8));
    }

    /// An error reply laid out as systemd sends one (its name, the serial
    /// it answers, a string body), then cut short and oversized.
    #[test]
    fn replies_are_read_whatever_their_fields() {
        let mut e = Out::default();
        e.0.extend_from_slice(&[b'l', 3, 1, 1]);
        let mut body = Out::default();
        body.str("Unit x.scope already exists.");
        e.u32(body.0.len() as u32);
        e.u32(2);
        e.array(8, |f| {
            f.pad(8);
            f.0.extend_from_slice(&[4, 1, b's', 0]);
            f.str("org.freedesktop.systemd1.UnitExists");
            f.pad(8);
            f.0.extend_from_slice(&[5, 1, b'u', 0]);
            f.u32(1);
            f.pad(8);
            f.0.extend_from_slice(&[8, 1, b'g', 0]);
            f.sig("s");
        });
        e.pad(8);
        e.0.extend_from_slice(&body.0);
        let m = read_message(&mut &e.0[..]).unwrap();
        assert_eq!(
            m,
            Message {
                kind: 3,
                reply_serial: Some(1),
                error_name: Some("org.freedesktop.systemd1.UnitExists".into()),
                error_text: Some("Unit x.scope already exists.".into()),
            }
        );
        // Cut anywhere: an error, never a panic.
        for n in 0..e.0.len() {
            assert!(read_message(&mut &e.0[..n]).is_err(), "cut at {n}");
        }
        // Too large: refused before it is read.
        let mut big = e.0.clone();
        big[4..8].copy_from_slice(&(1u32 << 20).to_le_bytes());
        let err = read_message(&mut &big[..]).unwrap_err();
        assert!(err.to_string().contains("most read"), "{err}");
    }

    fn temp_socket(tag: &str) -> (std::path::PathBuf, std::os::unix::net::UnixListener) {
        let dir = std::env::temp_dir().join(format!(
            "executor-systemd-test-{tag}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("private");
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        (path, l)
    }

    /// Hostile: a peer that answers one byte every 300 ms (a line that
    /// never ends) holds the call no longer than its deadline, whatever
    /// each read's wait.
    #[test]
    fn a_trickling_peer_is_bounded_by_one_deadline() {
        let (path, l) = temp_socket("trickle");
        let peer = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            for _ in 0..40 {
                if c.write_all(b"x").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        });
        let t = Instant::now();
        let err = start_scope(&path, "executor-1-2.scope", Duration::from_secs(1)).unwrap_err();
        assert!(
            t.elapsed() < Duration::from_millis(1500),
            "{:?}: {err}",
            t.elapsed()
        );
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        peer.join().unwrap();
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    /// Hostile: a listener that accepts nothing, its backlog full: the
    /// connect gives up at the deadline instead of blocking. Control: a
    /// listener with room is connected to (and then refuses the
    /// authentication with a line that is not `OK`).
    #[test]
    fn a_full_backlog_is_bounded_by_the_deadline() {
        let (path, l) = temp_socket("backlog");
        let mut held = Vec::new();
        loop {
            let s = nix::sys::socket::socket(
                nix::sys::socket::AddressFamily::Unix,
                nix::sys::socket::SockType::Stream,
                nix::sys::socket::SockFlag::SOCK_NONBLOCK,
                None,
            )
            .unwrap();
            let addr = nix::sys::socket::UnixAddr::new(&path).unwrap();
            match nix::sys::socket::connect(std::os::fd::AsRawFd::as_raw_fd(&s), &addr) {
                Ok(()) => held.push(s),
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(e) => panic!("{e}"),
            }
            assert!(held.len() < 10_000);
        }
        let t = Instant::now();
        let err = start_scope(&path, "executor-1-2.scope", Duration::from_millis(500)).unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        drop(held);
        drop(l);
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
        // Control.
        let (path, l) = temp_socket("control");
        let peer = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut b = [0u8; 64];
            let _ = c.read(&mut b);
            c.write_all(b"REJECTED EXTERNAL\r\n").unwrap();
        });
        let err = start_scope(&path, "executor-1-2.scope", Duration::from_secs(2)).unwrap_err();
        assert!(
            err.to_string().contains("refused the authentication"),
            "{err}"
        );
        peer.join().unwrap();
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }
}
