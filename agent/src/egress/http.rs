//! The HTTP side of a job's proxy: `CONNECT host:port` (a tunnel for
//! anything, TLS included) and absolute-URI requests for `http://` URLs.
//!
//! One proxy connection carries one decision: a `CONNECT` tunnel, or one
//! absolute-URI request, forwarded in origin form with `Connection: close`
//! (so the next request comes on a new connection and is decided on its
//! own). Whatever a job sends after that reaches only the destination
//! already decided on. A request whose `Host` header names another
//! authority than its URI is refused (`403`); so is a request head over
//! [`MAX_HEAD`] (`431`). Refusals carry a one-line `text/plain` body.

use super::matching::{canonicalize, Host};
use super::{relay, Ctx, Refused, HANDSHAKE_TIMEOUT};
use executor_protocol::types::network::EgressProtocol;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The largest request head read (request line and headers).
pub(super) const MAX_HEAD: usize = 64 * 1024;
const MAX_HEADERS: usize = 128;

/// Headers for the proxy only, never forwarded.
const HOP_BY_HOP: [&str; 5] = [
    "proxy-connection",
    "proxy-authorization",
    "connection",
    "keep-alive",
    "te",
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
        if let Some(i) = buf[from..].windows(4).position(|w| w == b"\r\n\r\n") {
            return Ok(Some((buf, from + i + 4)));
        }
        if buf.len() > MAX_HEAD {
            return Ok(Some((buf, 0)));
        }
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
    },
}

/// Parse the head into what to do, or the refusal to answer.
fn parse(head: &[u8]) -> Result<Ask, (Refused, String, u16)> {
    let invalid = |why: &str| (Refused::Invalid(why.to_string()), String::new(), 0);
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
    let mut path = url.path().to_string();
    if let Some(q) = url.query() {
        path.push('?');
        path.push_str(q);
    }
    let mut out = format!("{method} {path} HTTP/1.{minor}\r\n").into_bytes();
    if host_header.is_none() {
        out.extend_from_slice(format!("Host: {}\r\n", authority(&canon, port)).as_bytes());
    }
    for h in req.headers.iter() {
        if HOP_BY_HOP.iter().any(|n| h.name.eq_ignore_ascii_case(n)) {
            continue;
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    Ok(Ask::Forward {
        host,
        port,
        head: out,
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
            Ask::Forward { head, .. } => {
                if upstream.write_all(&head).await.is_ok() {
                    relay::run(job, upstream, early).await;
                }
            }
        },
        Err((canon, r)) => {
            let shown = canon.to_string();
            let _ = job.write_all(&refusal(&r, &shown, port)).await;
        }
    }
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
        let Ok(Ask::Forward { host, port, head }) = parse(head) else {
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
}
