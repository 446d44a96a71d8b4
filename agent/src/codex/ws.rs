//! `executor codex-exec-server --listen ws://IP:PORT`: the Codex dialect
//! over websockets, as the reference serves it. The URL line
//! (`ws://IP:PORT`, the bound port when 0 was asked) is the first line on
//! stdout; then each websocket connection is one Codex connection
//! ([`super::serve`]), one JSON message per frame (text, or binary JSON),
//! one per text frame back.
//!
//! Only loopback addresses are listened on: the dialect has no
//! authentication, so a reachable port would run commands for anyone who
//! can connect (forward it with `ssh -L` instead). An HTTP request carrying
//! an `Origin` header (a browser's, whatever page it came from) is refused
//! with 403 before anything else; `GET /readyz` answers 200; anything else
//! but a websocket upgrade of `/` is 400, 404 or 405. Each connection is
//! pinged every 30 s and closed when nothing came from it for 60 s.
//!
//! The handshake is parsed here (httparse, at most 16 KiB and 10 s for the
//! head), framing is tokio-tungstenite's. Uses [`super::serve`], the
//! configuration and the host launch.

use base64::Engine;
use futures_util::{SinkExt, StreamExt};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::protocol::{Message, Role, WebSocketConfig};
use tokio_tungstenite::WebSocketStream;

/// Largest request head read before the upgrade.
const MAX_HEAD: usize = 16 * 1024;
/// How long a client may take to send its head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// A ping every this often.
const PING_EVERY: Duration = Duration::from_secs(30);
/// Closed when nothing came from the peer for this long.
const PEER_SILENCE: Duration = Duration::from_secs(60);
/// Bytes buffered between the websocket and the dialect each way.
const PIPE: usize = 1 << 20;

/// What `--listen` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listen {
    Stdio,
    Ws(SocketAddr),
}

/// Parse a `--listen` value: `stdio`, `stdio://` or `ws://IP:PORT` with a
/// loopback IP.
pub fn parse_listen(text: &str) -> Result<Listen, String> {
    if text == "stdio" || text == "stdio://" {
        return Ok(Listen::Stdio);
    }
    let Some(rest) = text.strip_prefix("ws://") else {
        return Err(format!(
            "--listen {text:?}: expected `stdio` or `ws://IP:PORT`"
        ));
    };
    let addr: SocketAddr = rest.parse().map_err(|_| {
        format!("--listen {text:?}: expected `ws://IP:PORT` (an IP address and a port)")
    })?;
    if !addr.ip().is_loopback() {
        return Err(format!(
            "--listen {text:?}: only loopback addresses are served (the dialect has no authentication); forward the port with ssh -L"
        ));
    }
    Ok(Listen::Ws(addr))
}

/// Listen on `addr`, print the URL line, serve every connection until the
/// process is stopped.
pub async fn listen(
    addr: SocketAddr,
    config: crate::config::Config,
    launch: crate::host::Launch,
) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    {
        use std::io::Write;
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "ws://{local}")?;
        stdout.flush()?;
    }
    tracing::info!(%local, "codex exec-server listening");
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors and the like: wait, then go on.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (config, launch) = (config.clone(), launch.clone());
        tokio::spawn(async move {
            if let Err(e) = connection(tcp, config, launch).await {
                tracing::debug!(%peer, error = %e, "websocket connection ended");
            }
        });
    }
}

/// A parsed request head.
struct Head {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
}

impl Head {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Read a request head; what came after it is returned too.
async fn read_head(tcp: &mut TcpStream) -> Result<Option<(Head, Vec<u8>)>, u16> {
    let mut buf = Vec::with_capacity(1024);
    let read = async {
        loop {
            let mut chunk = [0u8; 4096];
            let n = tcp.read(&mut chunk).await.map_err(|_| 0u16)?;
            if n == 0 {
                return Err(0);
            }
            buf.extend_from_slice(&chunk[..n]);
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut req = httparse::Request::new(&mut headers);
            match req.parse(&buf) {
                Ok(httparse::Status::Complete(len)) => {
                    let head = Head {
                        method: req.method.unwrap_or_default().to_owned(),
                        path: req.path.unwrap_or_default().to_owned(),
                        headers: req
                            .headers
                            .iter()
                            .map(|h| {
                                (
                                    h.name.to_owned(),
                                    String::from_utf8_lossy(h.value).into_owned(),
                                )
                            })
                            .collect(),
                    };
                    return Ok((head, buf[len..].to_vec()));
                }
                Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => continue,
                Ok(httparse::Status::Partial) => return Err(431),
                Err(httparse::Error::TooManyHeaders) => return Err(431),
                Err(_) => return Err(400),
            }
        }
    };
    match tokio::time::timeout(HEAD_TIMEOUT, read).await {
        Ok(Ok(h)) => Ok(Some(h)),
        Ok(Err(0)) => Ok(None),
        Ok(Err(code)) => Err(code),
        Err(_) => Err(408),
    }
}

async fn respond(tcp: &mut TcpStream, status: u16, extra: &str, body: &str) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        _ => "Error",
    };
    let content_type = if body.is_empty() {
        ""
    } else {
        "content-type: text/plain; charset=utf-8\r\n"
    };
    let text = format!(
        "HTTP/1.1 {status} {reason}\r\n{extra}{content_type}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    tcp.write_all(text.as_bytes()).await?;
    tcp.shutdown().await
}

/// Whether `value` (a comma-separated header) holds `token`, ASCII case
/// aside.
fn has_token(value: Option<&str>, token: &str) -> bool {
    value.is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
}

/// `Sec-WebSocket-Accept` for `key` (RFC 6455 §4.2.2).
fn accept_key(key: &str) -> String {
    let mut input = key.trim().as_bytes().to_vec();
    input.extend_from_slice(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    let digest = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, &input);
    base64::engine::general_purpose::STANDARD.encode(digest.as_ref())
}

/// Why an upgrade request is not one, as a 400's text.
fn upgrade_problem(head: &Head) -> Option<&'static str> {
    if !has_token(head.header("connection"), "upgrade") {
        return Some("Connection header did not include 'upgrade'");
    }
    if !has_token(head.header("upgrade"), "websocket") {
        return Some("`Upgrade` header did not include 'websocket'");
    }
    if head.header("sec-websocket-version") != Some("13") {
        return Some("`Sec-WebSocket-Version` header did not include '13'");
    }
    if head.header("sec-websocket-key").is_none_or(str::is_empty) {
        return Some("`Sec-WebSocket-Key` header missing");
    }
    None
}

async fn connection(
    mut tcp: TcpStream,
    config: crate::config::Config,
    launch: crate::host::Launch,
) -> std::io::Result<()> {
    let _ = tcp.set_nodelay(true);
    let (head, rest) = match read_head(&mut tcp).await {
        Ok(Some(h)) => h,
        Ok(None) => return Ok(()),
        Err(status) => return respond(&mut tcp, status, "", "").await,
    };
    // A browser's request, whatever its page: never served.
    if head.header("origin").is_some() {
        return respond(&mut tcp, 403, "", "").await;
    }
    let path = head.path.split('?').next().unwrap_or_default();
    match (path, head.method.as_str()) {
        ("/readyz", "GET" | "HEAD") => return respond(&mut tcp, 200, "", "").await,
        ("/readyz", _) => return respond(&mut tcp, 405, "allow: GET,HEAD\r\n", "").await,
        ("/", "GET") => {}
        ("/", _) => return respond(&mut tcp, 405, "allow: GET\r\n", "").await,
        _ => return respond(&mut tcp, 404, "", "").await,
    }
    if let Some(problem) = upgrade_problem(&head) {
        return respond(&mut tcp, 400, "", problem).await;
    }
    let key = head.header("sec-websocket-key").unwrap_or_default();
    let switching = format!(
        "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: {}\r\n\r\n",
        accept_key(key)
    );
    tcp.write_all(switching.as_bytes()).await?;
    let ws = WebSocketStream::from_partially_read(tcp, rest, Role::Server, Some(ws_config())).await;
    bridge(ws, config, launch).await
}

fn ws_config() -> WebSocketConfig {
    // A message as large as a stdio line may be.
    WebSocketConfig::default()
        .max_message_size(Some(super::wire::MAX_LINE_BYTES))
        .max_frame_size(Some(super::wire::MAX_LINE_BYTES))
}

/// Serve one Codex connection over `ws`: each message becomes one input
/// line of [`super::serve`] (its line breaks, which in JSON can only be
/// whitespace between tokens, become spaces), each output line one text
/// message.
async fn bridge(
    ws: WebSocketStream<TcpStream>,
    config: crate::config::Config,
    launch: crate::host::Launch,
) -> std::io::Result<()> {
    let (mut sink, mut stream) = ws.split();
    let (serve_in, mut to_serve) = tokio::io::duplex(PIPE);
    let (from_serve, serve_out) = tokio::io::duplex(PIPE);
    let serving = tokio::spawn(super::serve(serve_in, serve_out, config, launch));
    let heard = Arc::new(Mutex::new(Instant::now()));
    let heard_r = heard.clone();
    let reader = tokio::spawn(async move {
        while let Some(m) = stream.next().await {
            *heard_r.lock().expect("heard lock") = Instant::now();
            let data = match m {
                Ok(Message::Text(t)) => t.as_bytes().to_vec(),
                Ok(Message::Binary(b)) => b.to_vec(),
                Ok(Message::Close(_)) | Err(_) => break,
                // Pings are answered by the framing; pongs only count as
                // heard.
                Ok(_) => continue,
            };
            let mut line: Vec<u8> = data
                .into_iter()
                .map(|b| if b == b'\n' || b == b'\r' { b' ' } else { b })
                .collect();
            line.push(b'\n');
            if to_serve.write_all(&line).await.is_err() {
                break;
            }
        }
        // The dialect sees its input end: the session detaches.
        let _ = to_serve.shutdown().await;
    });
    let mut lines = BufReader::new(from_serve);
    let mut line = Vec::new();
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
    loop {
        tokio::select! {
            n = lines.read_until(b'\n', &mut line) => {
                match n {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                while matches!(line.last(), Some(b'\n')) {
                    line.pop();
                }
                let text = String::from_utf8_lossy(&line).into_owned();
                line.clear();
                if sink.send(Message::text(text)).await.is_err() {
                    break;
                }
            }
            _ = ping.tick() => {
                if heard.lock().expect("heard lock").elapsed() > PEER_SILENCE {
                    tracing::info!("websocket peer silent for 60 s: closing");
                    break;
                }
                if sink.send(Message::Ping(Vec::new().into())).await.is_err() {
                    break;
                }
            }
        }
    }
    reader.abort();
    let _ = sink.close().await;
    match serving.await {
        Ok(r) => r,
        Err(e) => Err(std::io::Error::other(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_values() {
        assert_eq!(parse_listen("stdio"), Ok(Listen::Stdio));
        assert_eq!(parse_listen("stdio://"), Ok(Listen::Stdio));
        assert_eq!(
            parse_listen("ws://127.0.0.1:0"),
            Ok(Listen::Ws("127.0.0.1:0".parse().unwrap()))
        );
        assert_eq!(
            parse_listen("ws://[::1]:80"),
            Ok(Listen::Ws("[::1]:80".parse().unwrap()))
        );
        for bad in [
            "ws://0.0.0.0:1",
            "ws://10.0.0.1:1",
            "ws://localhost:1",
            "ws://127.0.0.1",
            "wss://127.0.0.1:1",
            "tcp://127.0.0.1:1",
            "ws://127.0.0.1:1/x",
        ] {
            assert!(parse_listen(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_rfc_accept_key() {
        // RFC 6455 §1.3's example.
        assert_eq!(
            accept_key("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn tokens() {
        assert!(has_token(Some("keep-alive, Upgrade"), "upgrade"));
        assert!(!has_token(Some("keep-alive"), "upgrade"));
        assert!(!has_token(None, "upgrade"));
    }
}
