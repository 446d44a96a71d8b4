//! `mcp http`: a local MCP Streamable HTTP endpoint for an MCP server that
//! only the agent's host can reach. The endpoint (hyper, HTTP/1.1, on a
//! loopback address only, path [`PATH`]) makes each request it receives
//! again from the host with a streamed `http/request` to the server's URL:
//! method, body and end-to-end headers (`Mcp-Session-Id`,
//! `Mcp-Protocol-Version`, `Accept`, `Last-Event-ID`…) go up unchanged,
//! the status, headers and body come back unchanged, the body chunk by
//! chunk as the host receives it (an SSE stream flows event by event).
//! Headers given with `-H` and `--header-env` replace the local client's of
//! the same name; a `--header-env` value is read by the agent from its own
//! environment (`env_headers`), so it never crosses the client's
//! connection. A request whose `Host` or `Origin` names anything but a
//! loopback host is refused (403: DNS rebinding from a web page). A local
//! client that goes away mid-response drops the body,
//! which cancels the host's request (`http/cancel`): the agent closes its
//! connection to the server. The bound URL is the first line on stdout.
//! Uses the client library's [`executor_client::http`] and hyper's server.

use super::exit;
use super::signals::Signals;
use bytes::Bytes;
use executor_client::http::HttpRequest;
use executor_client::{Client, Error, ErrorCode};
use futures_util::StreamExt;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::mpsc;

/// The local endpoint's path (other paths are answered 404).
pub const PATH: &str = "/mcp";

/// The largest request body (one JSON-RPC message or batch) forwarded; a
/// larger one is answered 413. It travels in one frame to the agent.
pub const MAX_REQUEST_BODY: usize = 4 * 1024 * 1024;

/// Request headers that belong to one hop (this connection), not to the
/// exchange: never forwarded (the agent sets `Host` and the length).
const HOP_REQUEST: &[&str] = &[
    "host",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "expect",
];

/// Response headers not passed back: the local connection frames the body
/// itself (chunked) as it streams.
const HOP_RESPONSE: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
];

type Body = BoxBody<Bytes, Error>;

#[derive(Debug, clap::Args)]
pub struct HttpArgs {
    /// The MCP server's endpoint URL as the agent's host reaches it
    /// (`http://` or `https://`).
    #[arg(value_parser = parse_url)]
    pub url: String,
    /// The local address to serve on: loopback only (127.0.0.0/8, ::1);
    /// port 0 picks a free one. The endpoint is `http://ADDR:PORT/mcp`,
    /// printed as the first line on stdout.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:0", value_parser = parse_listen)]
    pub listen: SocketAddr,
    /// A header sent with every request to the server, `Name: value`
    /// (repeatable); it replaces the local client's header of that name.
    #[arg(short = 'H', long = "header", value_name = "NAME: VALUE", value_parser = parse_header)]
    pub headers: Vec<(String, String)>,
    /// A header sent with every request to the server whose whole value is
    /// the host's environment variable VAR, read by the agent (the value
    /// never reaches this process): `Authorization=MCP_TOKEN` with
    /// `MCP_TOKEN='Bearer …'` on the host. The agent's `http.header_env`
    /// says which variables may be named. Repeatable; it replaces the local
    /// client's header of that name.
    #[arg(long = "header-env", value_name = "NAME=VAR", value_parser = parse_header_env)]
    pub header_env: Vec<(String, String)>,
    /// Deadline, in ms, for each response head and each idle gap in a
    /// response body (an SSE stream quiet for longer ends).
    #[arg(long, value_name = "MS", default_value_t = 3_600_000)]
    pub timeout_ms: u64,
}

fn token(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn parse_url(v: &str) -> Result<String, String> {
    let lower = v.to_ascii_lowercase();
    let rest = lower
        .strip_prefix("http://")
        .or_else(|| lower.strip_prefix("https://"));
    match rest {
        Some(r) if !r.is_empty() && !r.starts_with('/') => Ok(v.to_string()),
        _ => Err(format!(
            "{v:?} is not an http:// or https:// URL with a host"
        )),
    }
}

fn parse_listen(v: &str) -> Result<SocketAddr, String> {
    let addr: SocketAddr = v
        .parse()
        .map_err(|_| format!("{v:?} is not ADDRESS:PORT (e.g. 127.0.0.1:8931)"))?;
    if !addr.ip().is_loopback() {
        return Err(format!(
            "{} is not a loopback address: the endpoint has no authentication of its own \
             and serves loopback only (127.0.0.1, ::1)",
            addr.ip()
        ));
    }
    Ok(addr)
}

fn parse_header(v: &str) -> Result<(String, String), String> {
    let (name, value) = v
        .split_once(':')
        .ok_or_else(|| format!("{v:?} is not `Name: value`"))?;
    let (name, value) = (name.trim(), value.trim());
    if !token(name) {
        return Err(format!("{name:?} (in {v:?}) is not a header name"));
    }
    if HeaderValue::from_str(value).is_err() {
        return Err(format!(
            "the value of header {name} is not a valid header value"
        ));
    }
    Ok((name.to_string(), value.to_string()))
}

fn parse_header_env(v: &str) -> Result<(String, String), String> {
    let (name, var) = v
        .split_once('=')
        .ok_or_else(|| format!("{v:?} is not `Name=VAR`"))?;
    if !token(name) {
        return Err(format!("{name:?} (in {v:?}) is not a header name"));
    }
    let var_ok = var
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && var.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !var_ok {
        return Err(format!(
            "{var:?} (in {v:?}) is not an environment variable name"
        ));
    }
    Ok((name.to_string(), var.to_string()))
}

/// What each forwarded request carries, and where the serving loop hears
/// that the agent's connection is gone.
#[derive(Debug)]
struct Bridge {
    client: Client,
    url: String,
    headers: Vec<(String, String)>,
    header_env: Vec<(String, String)>,
    timeout_ms: u64,
    lost: mpsc::UnboundedSender<String>,
}

/// `mcp http`: serve until a signal, or until the agent's connection ends
/// (an error, status 255).
pub async fn http(client: &Client, args: HttpArgs, signals: &mut Signals) -> anyhow::Result<i32> {
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| exit::Outside(format!("--listen {}: {e}", args.listen)))?;
    let local = listener.local_addr()?;
    let (lost, mut lost_rx) = mpsc::unbounded_channel();
    let bridge = Arc::new(Bridge {
        client: client.clone(),
        url: args.url,
        headers: args.headers,
        header_env: args.header_env,
        timeout_ms: args.timeout_ms,
        lost,
    });
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "http://{local}{PATH}")?;
        out.flush()?;
    }
    tracing::info!(endpoint = %format!("http://{local}{PATH}"), server = %bridge.url, "serving MCP over HTTP");
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a local connection");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let bridge = bridge.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let bridge = bridge.clone();
                        async move { Ok::<_, std::convert::Infallible>(bridge.forward(req).await) }
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
                    if let Err(e) = conn.await {
                        tracing::debug!(%peer, error = %e, "local connection ended");
                    }
                });
            }
            why = lost_rx.recv() => {
                let why = why.unwrap_or_default();
                return Err(exit::Outside(format!("the connection to the agent ended: {why}")).into());
            }
            sig = signals.recv() => {
                tracing::debug!(signal = sig.name(), "ending the MCP HTTP bridge");
                return Ok(sig.exit_code());
            }
        }
    }
}

impl Bridge {
    /// One local request, made from the host; the answer as the server
    /// gave it, or 4xx/5xx from the bridge with a text body saying why.
    async fn forward(&self, req: Request<Incoming>) -> Response<Body> {
        if req.uri().path() != PATH {
            return plain(
                StatusCode::NOT_FOUND,
                format!(
                    "executor-client mcp http serves {PATH} only, not {}",
                    req.uri().path()
                ),
            );
        }
        if let Some(refused) = foreign(&req) {
            return plain(StatusCode::FORBIDDEN, refused);
        }
        let (parts, body) = req.into_parts();
        let body = match Limited::new(body, MAX_REQUEST_BODY).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                let too_large = e
                    .downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some();
                return if too_large {
                    plain(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        format!("a request body above {MAX_REQUEST_BODY} bytes"),
                    )
                } else {
                    plain(
                        StatusCode::BAD_REQUEST,
                        format!("reading the request body: {e}"),
                    )
                };
            }
        };
        let replaced = |name: &str| {
            self.headers
                .iter()
                .chain(&self.header_env)
                .any(|(n, _)| n.eq_ignore_ascii_case(name))
        };
        let mut up = HttpRequest::new(parts.method.as_str(), &self.url)
            .stream(true)
            .timeout_ms(self.timeout_ms);
        for (name, value) in &parts.headers {
            if HOP_REQUEST.contains(&name.as_str()) || replaced(name.as_str()) {
                continue;
            }
            match value.to_str() {
                Ok(v) => up = up.header(name.as_str(), v),
                Err(_) => {
                    tracing::debug!(header = %name, "a header value that is not ASCII: not forwarded")
                }
            }
        }
        for (name, value) in &self.headers {
            up = up.header(name, value);
        }
        for (name, var) in &self.header_env {
            up = up.header_from_env(name, var, "");
        }
        if !body.is_empty() {
            up = up.body(body.to_vec());
        }
        let method = parts.method.clone();
        let resp = match self.client.http_request(up).await {
            Ok(r) => r,
            Err(e) => return self.failed(&method, e),
        };
        tracing::debug!(%method, status = resp.status, "forwarded");
        let mut out = Response::builder().status(resp.status);
        for (name, value) in &resp.headers {
            if HOP_RESPONSE.contains(&name.to_ascii_lowercase().as_str()) {
                continue;
            }
            match (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                (Ok(n), Ok(v)) => out = out.header(n, v),
                _ => tracing::debug!(header = %name, "a response header not valid here: dropped"),
            }
        }
        // Dropped by hyper when the local client goes away: the body's
        // drop cancels the host's request.
        let stream = resp.body.into_stream().map(|c| c.map(Frame::data));
        out.body(BodyExt::boxed(StreamBody::new(stream)))
            .unwrap_or_else(|e| {
                plain(
                    StatusCode::BAD_GATEWAY,
                    format!("the server's answer cannot be passed on: {e}"),
                )
            })
    }

    /// The answer when the host could not make the request: 504 for a
    /// timeout, 502 otherwise, the agent's message as the body. A closed
    /// connection to the agent also ends the bridge.
    fn failed(&self, method: &hyper::Method, e: Error) -> Response<Body> {
        tracing::warn!(%method, url = %self.url, error = %e, "forwarding to the MCP server");
        let status = match &e {
            Error::Remote(w) if w.code == ErrorCode::Timeout => StatusCode::GATEWAY_TIMEOUT,
            Error::Remote(_) => StatusCode::BAD_GATEWAY,
            _ => {
                let _ = self.lost.send(e.to_string());
                StatusCode::BAD_GATEWAY
            }
        };
        plain(status, format!("executor-client mcp http: {e}"))
    }
}

/// Why a request is refused for naming a host other than a loopback one in
/// `Host` or `Origin` (a web page reaching the endpoint through DNS
/// rebinding, as MCP's transport rules require servers to refuse), if it is.
fn foreign(req: &Request<Incoming>) -> Option<String> {
    let h = req.headers();
    if let Some(host) = h.get(hyper::header::HOST) {
        let text = String::from_utf8_lossy(host.as_bytes());
        if !loopback_authority(&text) {
            return Some(format!("Host {text:?} is not a loopback name or address"));
        }
    }
    if let Some(origin) = h.get(hyper::header::ORIGIN) {
        let text = String::from_utf8_lossy(origin.as_bytes());
        let authority = text
            .strip_prefix("http://")
            .or_else(|| text.strip_prefix("https://"));
        if !authority.is_some_and(loopback_authority) {
            return Some(format!("Origin {text:?} is not a loopback origin"));
        }
    }
    None
}

/// `localhost`, or a loopback address, with an optional port.
fn loopback_authority(authority: &str) -> bool {
    let host = match authority.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((h, _)) => h,
            None => return false,
        },
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn plain(status: StatusCode, text: String) -> Response<Body> {
    let mut r = Response::new(BodyExt::boxed(
        Full::new(Bytes::from(text + "\n")).map_err(|never| match never {}),
    ));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_is_loopback_only() {
        assert!(parse_listen("127.0.0.1:0").is_ok());
        assert!(parse_listen("[::1]:8080").is_ok());
        let e = parse_listen("0.0.0.0:8080").unwrap_err();
        assert!(e.contains("0.0.0.0 is not a loopback address"), "{e}");
        let e = parse_listen("localhost").unwrap_err();
        assert!(e.contains("\"localhost\" is not ADDRESS:PORT"), "{e}");
    }

    #[test]
    fn only_loopback_authorities_pass() {
        for ok in [
            "127.0.0.1:8931",
            "localhost:1",
            "LOCALHOST",
            "[::1]:80",
            "127.1.2.3",
        ] {
            assert!(loopback_authority(ok), "{ok}");
        }
        for bad in [
            "evil.example:8931",
            "10.0.0.1",
            "[::2]:80",
            "[::1",
            "localhost.evil",
        ] {
            assert!(!loopback_authority(bad), "{bad}");
        }
    }

    #[test]
    fn headers_and_header_env_are_checked() {
        assert_eq!(
            parse_header("X-A:  b c ").unwrap(),
            ("X-A".to_string(), "b c".to_string())
        );
        assert!(parse_header("no colon")
            .unwrap_err()
            .contains("\"no colon\""));
        assert!(parse_header("a b: c").unwrap_err().contains("\"a b\""));
        assert_eq!(
            parse_header_env("Authorization=MCP_TOKEN").unwrap(),
            ("Authorization".to_string(), "MCP_TOKEN".to_string())
        );
        assert!(parse_header_env("Authorization=1X")
            .unwrap_err()
            .contains("\"1X\""));
        assert!(parse_header_env("Authorization")
            .unwrap_err()
            .contains("Name=VAR"));
        assert!(parse_url("ftp://x/").unwrap_err().contains("\"ftp://x/\""));
        assert!(parse_url("https://internal/mcp").is_ok());
    }
}
