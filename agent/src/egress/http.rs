//! The HTTP side of a job's proxy: `CONNECT host:port` (a tunnel for
//! anything, TLS included) and absolute-URI requests for `http://` URLs.
//!
//! One proxy connection carries one decision: a `CONNECT` tunnel, or
//! exactly one absolute-URI request. A request is forwarded in origin form
//! with `Connection: close` and its body re-framed by the proxy
//! ([`Framing`]: `Content-Length` bytes, or `chunked` chunks re-emitted in
//! canonical form); nothing the job sends after the request's end reaches
//! the upstream: it is read and discarded while the response is relayed
//! (the job's end is passed on), and the connection closes when the
//! upstream does. So a pipelined or
//! smuggled second request is never forwarded, whatever its `Host`: the
//! next request comes on a new connection and is decided on its own.
//! Framing the proxy and an upstream could read differently is refused
//! before anything is connected (`400`): `Content-Length` with
//! `Transfer-Encoding`, more than one `Content-Length` (equal or not), one
//! that is not a plain decimal number, a `Transfer-Encoding` other than
//! exactly `chunked` (or in an HTTP/1.0 request), a line ending in a bare
//! LF or CR, obsolete line folding. A malformed chunk ends the connection
//! (both sides) before the malformed bytes are forwarded. Inside a
//! `CONNECT` tunnel the bytes are not HTTP: the tunnel is decided once, by
//! its authority, and carries whatever the job sends to that destination.
//!
//! A request whose `Host` header names another authority than its URI is
//! refused (`403`); so is a request head over [`MAX_HEAD`] (`431`). The
//! forwarded head carries the proxy's own canonical `Host`, and a chunked
//! body's trailer fields are checked and dropped: what reaches the
//! upstream is only what the proxy decided.
//! Refusals carry a one-line `text/plain` body.

use super::matching::{canonicalize, Host};
use super::{relay, Ctx, Refused, HANDSHAKE_TIMEOUT};
use executor_protocol::types::network::EgressProtocol;
use std::io;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The largest request head read (request line and headers).
pub(super) const MAX_HEAD: usize = 64 * 1024;
const MAX_HEADERS: usize = 128;

/// The longest chunk-size line (with its extensions) or trailer line.
const MAX_LINE: usize = 8 * 1024;
/// The most trailer bytes after the last chunk.
const MAX_TRAILERS: usize = 64 * 1024;
/// After the response, how long and how much of what the job still sends
/// is read and discarded before closing (so that closing with unread bytes
/// does not reset the connection under the response's tail).
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 1 << 20;

/// Headers for the proxy only, never forwarded (the framing headers are
/// re-emitted by the proxy from what it decided, see [`Framing`]).
const HOP_BY_HOP: [&str; 8] = [
    "proxy-connection",
    "proxy-authorization",
    "connection",
    "keep-alive",
    "te",
    "upgrade",
    "content-length",
    "transfer-encoding",
];

fn response(status: u16, reason: &str, body: &str) -> Vec<u8> {
    let body = format!("{body}\n");
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn refusal(r: &Refused, host: &str, port: u16) -> Vec<u8> {
    let (status, reason) = match r {
        Refused::NotAllowed | Refused::Policy(_) | Refused::HostMismatch(_) => (403, "Forbidden"),
        Refused::Invalid(_) => (400, "Bad Request"),
        Refused::Unresolved(_) | Refused::ConnectFailed(_) => (502, "Bad Gateway"),
        Refused::Limit(_) => (503, "Service Unavailable"),
    };
    response(status, reason, &r.text(host, port))
}

/// Read until the end of the head; `Ok(None)`: the job closed first.
async fn read_head(s: &mut TcpStream) -> std::io::Result<Option<(Vec<u8>, usize)>> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        let from = buf.len().saturating_sub(3);
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = head_end(&buf, from) {
            return Ok(Some((buf, end)));
        }
        if buf.len() > MAX_HEAD {
            return Ok(Some((buf, 0)));
        }
    }
}

/// Where the head ends (past its empty line), searching from `from`: at a
/// CRLF CRLF, or at an LF LF (a bare-LF head, refused by [`parse`] rather
/// than waited on).
fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    let crlf = buf[from..]
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| from + i + 4);
    let lf = buf[from..]
        .windows(2)
        .position(|w| w == b"\n\n")
        .map(|i| from + i + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// `host:port` of an authority (`[v6]:port` for IPv6); `None` without a
/// valid port.
fn split_authority(a: &str, default_port: Option<u16>) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = a.strip_prefix('[') {
        let (inner, after) = rest.split_once(']')?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        (format!("[{inner}]"), port)
    } else {
        match a.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h.to_string(), Some(p)),
            Some(_) => return None,
            None => (a.to_string(), None),
        }
    };
    let port = match port {
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => p.parse().ok()?,
        Some(_) => return None,
        None => default_port?,
    };
    Some((host, port))
}

/// How a forwarded request's body ends, as the proxy decided it (and
/// re-emitted it in the head it forwards).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// Neither `Content-Length` nor `Transfer-Encoding`: no body.
    Empty,
    Length(u64),
    Chunked,
}

/// What the job asked for.
enum Ask {
    Connect {
        host: String,
        port: u16,
    },
    Forward {
        host: String,
        port: u16,
        head: Vec<u8>,
        framing: Framing,
    },
}

/// Refuse a head whose lines the proxy and an upstream could split
/// differently: a bare LF or CR, or obsolete line folding.
fn check_lines(head: &[u8]) -> Result<(), &'static str> {
    for (i, b) in head.iter().enumerate() {
        match b {
            b'\n' if i == 0 || head[i - 1] != b'\r' => {
                return Err("a line ends in a bare LF (lines end in CRLF)")
            }
            b'\r' if head.get(i + 1) != Some(&b'\n') => {
                return Err("a bare CR in the request head")
            }
            b'\n' if matches!(head.get(i + 1), Some(b' ' | b'\t')) => {
                return Err("obsolete line folding (a header line starts with a space or tab)")
            }
            _ => {}
        }
    }
    Ok(())
}

/// The body framing of a request head, or why it is ambiguous.
fn framing(headers: &[httparse::Header<'_>], minor: u8) -> Result<Framing, String> {
    let named = |n: &str| {
        headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case(n))
            .map(|h| {
                String::from_utf8_lossy(h.value)
                    .trim_matches([' ', '\t'])
                    .to_string()
            })
            .collect::<Vec<_>>()
    };
    let lengths = named("content-length");
    let codings = named("transfer-encoding");
    match (lengths.as_slice(), codings.as_slice()) {
        ([], []) => Ok(Framing::Empty),
        (_, [_, ..]) if !lengths.is_empty() => {
            Err("both Content-Length and Transfer-Encoding (ambiguous framing)".into())
        }
        ([], [te]) => {
            if minor == 0 {
                Err("Transfer-Encoding in an HTTP/1.0 request".into())
            } else if te.eq_ignore_ascii_case("chunked") {
                Ok(Framing::Chunked)
            } else {
                Err(format!(
                    "Transfer-Encoding {te:?}: only \"chunked\" is accepted"
                ))
            }
        }
        ([], _) => Err("more than one Transfer-Encoding header".into()),
        ([len], []) => {
            if !len.is_empty() && len.len() <= 19 && len.bytes().all(|b| b.is_ascii_digit()) {
                len.parse()
                    .map(Framing::Length)
                    .map_err(|_| format!("Content-Length {len:?} is not a number"))
            } else {
                Err(format!("Content-Length {len:?} is not a decimal number"))
            }
        }
        (_, _) => Err("more than one Content-Length header".into()),
    }
}

/// Parse the head into what to do, or the refusal to answer.
fn parse(head: &[u8]) -> Result<Ask, (Refused, String, u16)> {
    let invalid = |why: &str| (Refused::Invalid(why.to_string()), String::new(), 0);
    check_lines(head).map_err(invalid)?;
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(invalid("incomplete request head")),
        Err(e) => return Err(invalid(&format!("malformed request head: {e}"))),
    }
    let method = req.method.unwrap_or_default();
    let target = req.path.unwrap_or_default();
    let minor = req.version.unwrap_or(1);
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = split_authority(target, None)
            .ok_or_else(|| invalid(&format!("CONNECT needs host:port, got {target:?}")))?;
        return Ok(Ask::Connect { host, port });
    }
    let url = url::Url::parse(target).map_err(|_| {
        invalid(&format!(
            "{target:?} is not an absolute http:// URL (this is a proxy; use CONNECT for anything else)"
        ))
    })?;
    if url.scheme() != "http" {
        return Err(invalid(&format!(
            "only http:// URLs are forwarded (use CONNECT for {}://)",
            url.scheme()
        )));
    }
    let host = url
        .host_str()
        .ok_or_else(|| invalid("the URL has no host"))?
        .to_string();
    let port = url.port_or_known_default().unwrap_or(80);
    let canon = canonicalize(&host).map_err(|e| (Refused::Invalid(e), host.clone(), port))?;
    let mut host_header = None;
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("host") {
            if host_header.is_some() {
                return Err((
                    Refused::HostMismatch("more than one Host header".into()),
                    host,
                    port,
                ));
            }
            host_header = Some(String::from_utf8_lossy(h.value).trim().to_string());
        }
    }
    if let Some(h) = &host_header {
        let same = split_authority(h, Some(80))
            .and_then(|(hh, hp)| canonicalize(&hh).ok().map(|c| (c, hp)))
            .is_some_and(|(c, hp)| c == canon && hp == port);
        if !same {
            return Err((
                Refused::HostMismatch(format!(
                    "the Host header {h:?} differs from the request URI's authority {}",
                    canon.with_port(port)
                )),
                host,
                port,
            ));
        }
    }
    let framing = framing(req.headers, minor).map_err(|why| invalid(&why))?;
    // Headers the `Connection` header names are hop-by-hop too.
    let connection_named: Vec<String> = req
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("connection"))
        .flat_map(|h| {
            String::from_utf8_lossy(h.value)
                .split(',')
                .map(|t| t.trim().to_ascii_lowercase())
                .filter(|t| !t.is_empty())
                .collect::<Vec<_>>()
        })
        .collect();
    let mut path = url.path().to_string();
    if let Some(q) = url.query() {
        path.push('?');
        path.push_str(q);
    }
    // The upstream reads the proxy's canonical `Host`, never the job's
    // text of it (which the proxy judged equal to the URI's authority
    // through IDNA and percent-decoding an upstream may not apply).
    let mut out = format!(
        "{method} {path} HTTP/1.{minor}\r\nHost: {}\r\n",
        authority(&canon, port)
    )
    .into_bytes();
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("host")
            || HOP_BY_HOP.iter().any(|n| h.name.eq_ignore_ascii_case(n))
            || connection_named
                .iter()
                .any(|n| h.name.eq_ignore_ascii_case(n))
        {
            continue;
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    match framing {
        Framing::Empty => {}
        Framing::Length(n) => out.extend_from_slice(format!("Content-Length: {n}\r\n").as_bytes()),
        Framing::Chunked => out.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    Ok(Ask::Forward {
        host,
        port,
        head: out,
        framing,
    })
}

fn authority(h: &Host, port: u16) -> String {
    if port == 80 {
        h.to_string()
    } else {
        h.with_port(port)
    }
}

pub(super) async fn serve(ctx: &Arc<Ctx>, mut job: TcpStream, over_limit: bool) {
    let (buf, end) = match tokio::time::timeout(HANDSHAKE_TIMEOUT, read_head(&mut job)).await {
        Ok(Ok(Some(h))) => h,
        _ => return,
    };
    if end == 0 {
        let _ = job
            .write_all(&response(
                431,
                "Request Header Fields Too Large",
                &format!("executor: the request head is over {MAX_HEAD} bytes"),
            ))
            .await;
        return;
    }
    if over_limit {
        let r = Refused::Limit(ctx.job.max_connections);
        let _ = job.write_all(&refusal(&r, "", 0)).await;
        return;
    }
    let ask = match parse(&buf[..end]) {
        Ok(a) => a,
        Err((r, host, port)) => {
            let _ = job.write_all(&refusal(&r, &host, port)).await;
            return;
        }
    };
    let early = &buf[end..];
    let (host, port, protocol) = match &ask {
        Ask::Connect { host, port } => (host.clone(), *port, EgressProtocol::Connect),
        Ask::Forward { host, port, .. } => (host.clone(), *port, EgressProtocol::Http),
    };
    match ctx.open(&host, port, protocol).await {
        Ok(mut upstream) => match ask {
            Ask::Connect { .. } => {
                if job
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await
                    .is_ok()
                {
                    relay::run(job, upstream, early).await;
                }
            }
            Ask::Forward { head, framing, .. } => {
                if upstream.write_all(&head).await.is_ok() {
                    forward_one(job, upstream, early, framing).await;
                }
            }
        },
        Err((canon, r)) => {
            let shown = canon.to_string();
            let _ = job.write_all(&refusal(&r, &shown, port)).await;
        }
    }
}

/// Relay one request (its head already sent): its body as `framing` says,
/// the response back until the upstream closes, then close. Bytes the job
/// sends past the body are read and dropped, never forwarded; the job's
/// end (after the whole request) is passed on as the upstream's.
async fn forward_one(job: TcpStream, upstream: TcpStream, early: &[u8], framing: Framing) {
    let mut body = Body {
        src: &job,
        buf: early.to_vec(),
        pos: 0,
    };
    let request = async {
        body.forward(&upstream, framing).await?;
        // Past the request: what the job sends is dropped; its end is
        // passed on (a FIN carries no request).
        discard(&job, usize::MAX).await;
        let _ = nix::sys::socket::shutdown(
            std::os::fd::AsRawFd::as_raw_fd(&upstream),
            nix::sys::socket::Shutdown::Write,
        );
        Ok::<(), io::Error>(())
    };
    let response = relay::pump(&upstream, &job);
    tokio::pin!(request, response);
    let mut sent = false;
    loop {
        tokio::select! {
            r = &mut request, if !sent => match r {
                Ok(()) => sent = true,
                Err(e) => {
                    tracing::debug!(error = %e, "egress request body refused or cut: both sides closed");
                    return;
                }
            },
            _ = &mut response => break,
        }
    }
    // The response is relayed and the job's write side shut down: discard
    // what the job still sends for a while (never forwarded), then close.
    let _ = tokio::time::timeout(LINGER, discard(&job, LINGER_BYTES)).await;
}

/// Read and drop up to `max` bytes from `s`, until its end.
async fn discard(s: &TcpStream, max: usize) {
    let mut chunk = [0u8; 16 * 1024];
    let mut seen = 0usize;
    while seen < max {
        match read_some(s, &mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => seen += n,
        }
    }
}

async fn read_some(s: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        s.readable().await?;
        match s.try_read(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            r => return r,
        }
    }
}

async fn write_all(s: &TcpStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        s.writable().await?;
        match s.try_write(buf) {
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn framing_error(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.into())
}

/// A request body read from the job: what came with the head, then the
/// socket.
struct Body<'a> {
    src: &'a TcpStream,
    buf: Vec<u8>,
    pos: usize,
}

impl Body<'_> {
    /// Read more into the buffer; the job's end before the body's is an
    /// error (the upstream never sees a request cut short as a whole one).
    async fn fill(&mut self) -> io::Result<()> {
        // What was consumed goes, so the buffer holds at most a line and a
        // read, however long the body.
        self.buf.drain(..self.pos);
        self.pos = 0;
        let mut chunk = [0u8; 16 * 1024];
        let n = read_some(self.src, &mut chunk).await?;
        if n == 0 {
            return Err(framing_error(
                "the job closed before the end of the request body",
            ));
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    /// Copy exactly `n` bytes to `dst`.
    async fn copy(&mut self, dst: &TcpStream, mut n: u64) -> io::Result<()> {
        while n > 0 {
            if self.pos == self.buf.len() {
                self.fill().await?;
            }
            let have = self.buf.len() - self.pos;
            let take = usize::try_from(n).map_or(have, |n| n.min(have));
            write_all(dst, &self.buf[self.pos..self.pos + take]).await?;
            self.pos += take;
            n -= take as u64;
        }
        Ok(())
    }

    /// One line without its CRLF; a bare LF or CR, or a line over
    /// [`MAX_LINE`], is an error.
    async fn line(&mut self) -> io::Result<Vec<u8>> {
        loop {
            let pending = &self.buf[self.pos..];
            if let Some(i) = pending.iter().position(|&b| b == b'\n') {
                let line = &pending[..i];
                let Some(line) = line.strip_suffix(b"\r") else {
                    return Err(framing_error("a bare LF in the chunked body"));
                };
                if line.contains(&b'\r') {
                    return Err(framing_error("a bare CR in the chunked body"));
                }
                let line = line.to_vec();
                self.pos += i + 1;
                return Ok(line);
            }
            if pending.len() > MAX_LINE {
                return Err(framing_error("a chunked-body line over 8 KiB"));
            }
            self.fill().await?;
        }
    }

    /// Forward the body to `dst`, re-framed: `Content-Length` bytes, or each
    /// chunk as `SIZE CRLF data CRLF` (extensions dropped), then the last
    /// chunk with an empty trailer section (trailers are checked, dropped).
    async fn forward(&mut self, dst: &TcpStream, framing: Framing) -> io::Result<()> {
        match framing {
            Framing::Empty => Ok(()),
            Framing::Length(n) => self.copy(dst, n).await,
            Framing::Chunked => loop {
                let line = self.line().await?;
                let size = chunk_size(&line)?;
                write_all(dst, format!("{size:x}\r\n").as_bytes()).await?;
                if size == 0 {
                    return self.trailers(dst).await;
                }
                self.copy(dst, size).await?;
                if !self.line().await?.is_empty() {
                    return Err(framing_error("chunk data longer than its size"));
                }
                write_all(dst, b"\r\n").await?;
            },
        }
    }

    /// One non-last chunk, re-emitted (for the test of the buffer bound).
    #[cfg(test)]
    async fn forward_one_chunk(&mut self, dst: &TcpStream) -> io::Result<()> {
        let line = self.line().await?;
        let size = chunk_size(&line)?;
        assert!(size > 0);
        write_all(dst, format!("{size:x}\r\n").as_bytes()).await?;
        self.copy(dst, size).await?;
        if !self.line().await?.is_empty() {
            return Err(framing_error("chunk data longer than its size"));
        }
        write_all(dst, b"\r\n").await
    }

    /// The trailer section after the last chunk: each field checked, none
    /// forwarded (an upstream that merges trailers into the head would read
    /// them as `Host` or framing fields the proxy never decided on; RFC 9110
    /// §6.5.1 lets a recipient discard them), then the empty line.
    async fn trailers(&mut self, dst: &TcpStream) -> io::Result<()> {
        let mut total = 0usize;
        loop {
            let line = self.line().await?;
            if line.is_empty() {
                return write_all(dst, b"\r\n").await;
            }
            total += line.len() + 2;
            if total > MAX_TRAILERS {
                return Err(framing_error("trailers over 64 KiB"));
            }
            let mut one = [httparse::EMPTY_HEADER; 1];
            let mut field = line;
            field.extend_from_slice(b"\r\n\r\n");
            if !matches!(
                httparse::parse_headers(&field, &mut one),
                Ok(httparse::Status::Complete((_, [_])))
            ) {
                return Err(framing_error("a malformed trailer field"));
            }
        }
    }
}

/// The size of a chunk-size line: 1 to 16 hex digits, then nothing or
/// extensions (`;` ...) of visible characters, spaces and tabs.
fn chunk_size(line: &[u8]) -> io::Result<u64> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 16 {
        return Err(framing_error("a chunk size is not 1 to 16 hex digits"));
    }
    let rest = &line[digits..];
    let ext = rest
        .iter()
        .position(|&b| b != b' ' && b != b'\t')
        .map_or(&rest[rest.len()..], |i| &rest[i..]);
    if !ext.is_empty()
        && (ext[0] != b';' || !ext.iter().all(|&b| b == b'\t' || (0x20..0x7f).contains(&b)))
    {
        return Err(framing_error("malformed chunk extensions"));
    }
    let text = std::str::from_utf8(&line[..digits]).map_err(|_| framing_error("chunk size"))?;
    u64::from_str_radix(text, 16).map_err(|_| framing_error("chunk size out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities_split_with_brackets_and_default_ports() {
        assert_eq!(
            split_authority("a.example:443", None),
            Some(("a.example".into(), 443))
        );
        assert_eq!(
            split_authority("[::1]:8080", None),
            Some(("[::1]".into(), 8080))
        );
        assert_eq!(
            split_authority("a.example", Some(80)),
            Some(("a.example".into(), 80))
        );
        assert_eq!(split_authority("a.example", None), None);
        assert_eq!(split_authority("::1:80", None), None);
        assert_eq!(split_authority("a:+1", None), None);
        assert_eq!(split_authority("a:99999", None), None);
    }

    #[test]
    fn absolute_uri_requests_are_rewritten_to_origin_form_with_connection_close() {
        let head = b"GET http://Mirror.Internal:8080/a/b?c=d HTTP/1.1\r\nHost: mirror.internal:8080\r\nProxy-Connection: keep-alive\r\nProxy-Authorization: Basic eA==\r\nAccept: */*\r\n\r\n";
        let Ok(Ask::Forward {
            host, port, head, ..
        }) = parse(head)
        else {
            panic!("not forwarded");
        };
        assert_eq!((host.as_str(), port), ("mirror.internal", 8080));
        let text = String::from_utf8(head).unwrap();
        assert!(text.starts_with("GET /a/b?c=d HTTP/1.1\r\n"), "{text}");
        assert!(text.contains("Accept: */*\r\n"));
        assert!(text.ends_with("Connection: close\r\n\r\n"));
        assert!(!text.to_ascii_lowercase().contains("proxy-"), "{text}");
    }

    #[test]
    fn a_host_header_for_another_authority_is_refused() {
        for (head, ok) in [
            (
                &b"GET http://a.example/ HTTP/1.1\r\nHost: b.example\r\n\r\n"[..],
                false,
            ),
            (
                b"GET http://a.example/ HTTP/1.1\r\nHost: a.example:81\r\n\r\n",
                false,
            ),
            (
                b"GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n",
                false,
            ),
            (
                b"GET http://a.example/ HTTP/1.1\r\nHost: A.Example.:80\r\n\r\n",
                true,
            ),
            (
                b"GET http://127.1/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                true,
            ),
            (b"GET http://a.example/ HTTP/1.1\r\n\r\n", true),
        ] {
            let r = parse(head);
            assert_eq!(
                r.is_ok(),
                ok,
                "{}",
                String::from_utf8_lossy(head).lines().nth(1).unwrap_or("")
            );
            if !ok {
                assert!(matches!(r, Err((Refused::HostMismatch(_), _, _))));
            }
        }
    }

    #[test]
    fn other_targets_are_bad_requests() {
        for head in [
            &b"GET /relative HTTP/1.1\r\nHost: a\r\n\r\n"[..],
            b"GET https://a.example/ HTTP/1.1\r\n\r\n",
            b"CONNECT a.example HTTP/1.1\r\n\r\n",
            b"GARBAGE\r\n\r\n",
        ] {
            assert!(
                matches!(parse(head), Err((Refused::Invalid(_), _, _))),
                "{}",
                String::from_utf8_lossy(head)
            );
        }
    }

    fn framing_of(head: &[u8]) -> Result<Framing, String> {
        match parse(head) {
            Ok(Ask::Forward { framing, head, .. }) => {
                let text = String::from_utf8(head).unwrap();
                match framing {
                    Framing::Empty => assert!(
                        !text.to_ascii_lowercase().contains("content-length")
                            && !text.to_ascii_lowercase().contains("transfer-encoding"),
                        "{text}"
                    ),
                    Framing::Length(n) => assert!(
                        text.contains(&format!("\r\nContent-Length: {n}\r\n")),
                        "{text}"
                    ),
                    Framing::Chunked => assert!(
                        text.contains("\r\nTransfer-Encoding: chunked\r\n"),
                        "{text}"
                    ),
                }
                Ok(framing)
            }
            Ok(Ask::Connect { .. }) => Err("connect".into()),
            Err((Refused::Invalid(why), _, _)) => Err(why),
            Err((r, _, _)) => Err(format!("{r:?}")),
        }
    }

    #[test]
    fn request_framing_is_exact_and_ambiguous_framing_is_refused() {
        let req = |headers: &str| {
            format!("POST http://a.example/ HTTP/1.1\r\n{headers}\r\n").into_bytes()
        };
        assert_eq!(framing_of(&req("")), Ok(Framing::Empty));
        assert_eq!(
            framing_of(&req("Content-Length: 12\r\n")),
            Ok(Framing::Length(12))
        );
        assert_eq!(
            framing_of(&req("content-length:  0 \r\n")),
            Ok(Framing::Length(0))
        );
        assert_eq!(
            framing_of(&req("Transfer-Encoding: Chunked\r\n")),
            Ok(Framing::Chunked)
        );
        for (bad, why) in [
            (
                "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
                "both",
            ),
            (
                "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
                "both",
            ),
            (
                "Content-Length: 5\r\nContent-Length: 5\r\n",
                "more than one Content-Length",
            ),
            (
                "Content-Length: 5\r\nContent-Length: 6\r\n",
                "more than one Content-Length",
            ),
            ("Content-Length: 5, 5\r\n", "not a decimal"),
            ("Content-Length: +5\r\n", "not a decimal"),
            ("Content-Length: 0x5\r\n", "not a decimal"),
            ("Content-Length: \r\n", "not a decimal"),
            ("Content-Length: 99999999999999999999\r\n", "not a decimal"),
            ("Transfer-Encoding: gzip, chunked\r\n", "only \"chunked\""),
            (
                "Transfer-Encoding: chunked, identity\r\n",
                "only \"chunked\"",
            ),
            ("Transfer-Encoding: xchunked\r\n", "only \"chunked\""),
            (
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
                "more than one Transfer-Encoding",
            ),
            ("X-A: b\r\n c\r\n", "folding"),
            ("X-A: b\r\n\tc\r\n", "folding"),
            ("X-A: b\nContent-Length: 5\r\n", "bare LF"),
            ("X-A: b\rContent-Length: 5\r\n", "bare CR"),
        ] {
            let r = framing_of(&req(bad));
            assert!(matches!(&r, Err(w) if w.contains(why)), "{bad:?}: {r:?}");
        }
        // Not in HTTP/1.0.
        let r =
            framing_of(b"POST http://a.example/ HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert!(matches!(&r, Err(w) if w.contains("HTTP/1.0")), "{r:?}");
        // Whitespace before the colon is not a header httparse accepts.
        assert!(framing_of(&req("Content-Length : 5\r\n")).is_err());
        assert!(framing_of(&req("Transfer-Encoding : chunked\r\n")).is_err());
    }

    #[test]
    fn a_bare_lf_head_ends_and_is_refused() {
        let head = b"GET http://a.example/ HTTP/1.1\nHost: a.example\n\nGET http://b.example/";
        let end = head_end(head, 0).unwrap();
        assert_eq!(
            &head[..end],
            b"GET http://a.example/ HTTP/1.1\nHost: a.example\n\n"
        );
        assert!(framing_of(&head[..end]).is_err());
    }

    #[test]
    fn headers_named_by_connection_and_upgrade_are_not_forwarded() {
        let head = b"GET http://a.example/ HTTP/1.1\r\nConnection: X-Secret, Upgrade\r\nX-Secret: 1\r\nUpgrade: websocket\r\nX-Kept: 2\r\n\r\n";
        let Ok(Ask::Forward { head, .. }) = parse(head) else {
            panic!("not forwarded")
        };
        let text = String::from_utf8(head).unwrap();
        assert!(
            !text.contains("X-Secret") && !text.contains("websocket"),
            "{text}"
        );
        assert!(text.contains("X-Kept: 2\r\n"), "{text}");
    }

    #[test]
    fn chunk_sizes_are_hex_with_optional_extensions() {
        assert_eq!(chunk_size(b"1a").unwrap(), 26);
        assert_eq!(chunk_size(b"0").unwrap(), 0);
        assert_eq!(chunk_size(b"A;name=value").unwrap(), 10);
        assert_eq!(chunk_size(b"5 ; x").unwrap(), 5);
        assert_eq!(chunk_size(b"ffffffffffffffff").unwrap(), u64::MAX);
        for bad in [
            &b""[..],
            b" 5",
            b"0x5",
            b"-1",
            b"5 x",
            b"5;\x01",
            b"10000000000000000",
            b"g",
        ] {
            assert!(
                chunk_size(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// A socket pair over loopback: (the job's end as the proxy holds it,
    /// the job).
    async fn pair() -> (TcpStream, TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        (s, c)
    }

    #[tokio::test]
    async fn a_chunked_body_is_re_emitted_in_bounded_memory_and_nothing_after_it() {
        let (from_job, mut job) = pair().await;
        let (to_upstream, mut upstream) = pair().await;
        // 100,000 one-byte chunks with extensions, a trailer, then a
        // second request the proxy must not forward.
        let writer = tokio::spawn(async move {
            let mut body = Vec::new();
            for _ in 0..100_000 {
                body.extend_from_slice(b"1;x=y\r\nz\r\n");
            }
            body.extend_from_slice(b"0\r\nX-T: 1\r\n\r\nGET http://b.example/ HTTP/1.1\r\n\r\n");
            job.write_all(&body).await.unwrap();
            job
        });
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            upstream.read_to_end(&mut got).await.unwrap();
            got
        });
        let mut body = Body {
            src: &from_job,
            buf: Vec::new(),
            pos: 0,
        };
        let mut most = 0;
        for _ in 0..100_000 {
            body.forward_one_chunk(&to_upstream).await.unwrap();
            most = most.max(body.buf.capacity());
        }
        body.forward(&to_upstream, Framing::Chunked).await.unwrap();
        assert!(
            most <= 2 * (MAX_LINE + 16 * 1024),
            "the body buffer grew to {most}"
        );
        drop(to_upstream);
        let _job = writer.await.unwrap();
        let got = reader.await.unwrap();
        let mut want = b"1\r\nz\r\n".repeat(100_000);
        want.extend_from_slice(b"0\r\n\r\n");
        assert_eq!(got.len(), want.len());
        assert!(got == want, "the re-emitted body differs");
    }
}
