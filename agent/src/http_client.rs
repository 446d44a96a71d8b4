//! One HTTP exchange on a connection of our own: resolve once, filter the
//! addresses through the destination policy, connect to exactly those, TLS
//! with the host's trust store, then HTTP/1.1 or HTTP/2 as ALPN decides.
//!
//! There is no connection pool: every request (and every redirect hop) gets
//! a fresh connection, so no request can reuse a connection whose address
//! was admitted for another host.
//!
//! Below the session (which holds the [`HttpContext`]): it uses
//! [`crate::config`] and [`crate::destinations`] only; `http/request` in
//! [`crate::http`] drives it.

use crate::config::HttpConfig;
use crate::destinations::Destinations;
use bytes::Bytes;
use executor_protocol::{ErrorCode, WireError};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use url::{Host, Url};

/// What one connection may hold of a response body not yet asked for
/// (HTTP/1.1 read buffer, HTTP/2 windows): with many concurrent streams,
/// the agent's memory is this times the streams, not the bodies' size.
const READ_AHEAD: usize = 128 * 1024;

/// `http_error` with `data.kind`.
pub fn http_error(kind: &'static str, message: String) -> WireError {
    WireError::new(ErrorCode::HttpError, message).with("kind", kind)
}

fn io_errno(e: &std::io::Error) -> Option<i32> {
    e.raw_os_error()
}

/// Shared, per agent: the configuration and the TLS client config (built
/// on first use: reading the host's trust store costs a few milliseconds
/// that a session without HTTPS should not pay).
#[derive(Debug)]
pub struct HttpContext {
    pub config: HttpConfig,
    tls: OnceLock<Result<Arc<rustls::ClientConfig>, String>>,
}

impl HttpContext {
    pub fn new(config: HttpConfig) -> Self {
        HttpContext {
            config,
            tls: OnceLock::new(),
        }
    }

    fn tls(&self) -> Result<Arc<rustls::ClientConfig>, WireError> {
        self.tls
            .get_or_init(|| self.build_tls())
            .clone()
            .map_err(|m| http_error("tls", m))
    }

    fn build_tls(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        let mut roots = rustls::RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        for e in &native.errors {
            tracing::warn!(error = %e, "reading the host's trust store");
        }
        let (added, ignored) = roots.add_parsable_certificates(native.certs);
        let (extra, extra_ignored) =
            roots.add_parsable_certificates(self.config.extra_roots.iter().cloned());
        tracing::debug!(added, ignored, extra, extra_ignored, "TLS trust anchors");
        if roots.is_empty() {
            return Err("no trust anchors: the host's trust store is empty and the configuration adds none (http.extra_ca_file)".into());
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS setup: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// The URL's host as text: a name, or an address without brackets.
pub fn host_text(url: &Url) -> String {
    match url.host() {
        Some(Host::Domain(d)) => d.to_string(),
        Some(Host::Ipv4(a)) => a.to_string(),
        Some(Host::Ipv6(a)) => a.to_string(),
        None => String::new(),
    }
}

trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}

/// An established connection, TLS done, ready for HTTP.
struct Connected {
    io: Box<dyn Stream>,
    h2: bool,
}

/// Connect to `url`'s origin under the destination policy.
async fn connect(
    ctx: &HttpContext,
    url: &Url,
    dest: &Destinations<'_>,
) -> Result<Connected, WireError> {
    let host = host_text(url);
    let port = url
        .port_or_known_default()
        .ok_or_else(|| http_error("connect", format!("{url}: no port")))?;
    dest.check_name(&host, port).map_err(|r| r.to_wire())?;
    let literal = match url.host() {
        Some(Host::Ipv4(a)) => Some(std::net::IpAddr::V4(a)),
        Some(Host::Ipv6(a)) => Some(std::net::IpAddr::V6(a)),
        _ => None,
    };
    let tcp = match &ctx.config.proxy {
        Some(proxy) => {
            // The proxy resolves the name: only what can be judged from the
            // name (or an address literal) is checked here.
            match literal {
                Some(ip) => dest.check_addr(&host, ip, port),
                None => dest.check_name_allowed(&host, port),
            }
            .map_err(|r| r.to_wire())?;
            let mut s = dial_proxy(proxy).await?;
            tunnel(&mut s, url, &host, port).await?;
            s
        }
        None => {
            let addrs: Vec<SocketAddr> = match literal {
                Some(ip) => vec![SocketAddr::new(ip, port)],
                None => resolve(&host, port).await?,
            };
            let mut refused = None;
            let allowed: Vec<SocketAddr> = addrs
                .into_iter()
                .filter(|a| match dest.check_addr(&host, a.ip(), port) {
                    Ok(()) => true,
                    Err(r) => {
                        refused.get_or_insert(r);
                        false
                    }
                })
                .collect();
            if allowed.is_empty() {
                return Err(match refused {
                    Some(r) => r.to_wire(),
                    None => http_error("dns", format!("{host} has no address")),
                });
            }
            dial(&host, &allowed).await?
        }
    };
    let _ = tcp.set_nodelay(true);
    if url.scheme() != "https" {
        return Ok(Connected {
            io: Box::new(tcp),
            h2: false,
        });
    }
    let config = ctx.tls()?;
    let name = rustls_pki_types::ServerName::try_from(host.clone())
        .map_err(|e| http_error("tls", format!("{host}: not a valid TLS server name: {e}")))?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|e| http_error("tls", format!("TLS with {host} port {port} failed: {e}")))?;
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    Ok(Connected {
        io: Box::new(tls),
        h2,
    })
}

async fn resolve(host: &str, port: u16) -> Result<Vec<SocketAddr>, WireError> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| http_error("dns", format!("cannot resolve {host}: {e}")))?
        .collect();
    if addrs.is_empty() {
        return Err(http_error("dns", format!("{host} has no address")));
    }
    Ok(addrs)
}

/// Try each admitted address in order; the last failure is reported.
async fn dial(host: &str, addrs: &[SocketAddr]) -> Result<TcpStream, WireError> {
    let mut last = None;
    for addr in addrs {
        match TcpStream::connect(addr).await {
            Ok(s) => return Ok(s),
            Err(e) => last = Some((addr, e)),
        }
    }
    let (addr, e) = last.expect("dial is given at least one address");
    let mut err = http_error("connect", format!("cannot connect to {host} ({addr}): {e}"))
        .with("address", addr.to_string());
    if let Some(errno) = io_errno(&e) {
        err = err.with("errno", errno);
    }
    Err(err)
}

async fn dial_proxy(proxy: &Url) -> Result<TcpStream, WireError> {
    let host = host_text(proxy);
    let port = proxy.port_or_known_default().unwrap_or(80);
    let addrs = resolve(&host, port).await?;
    dial(&host, &addrs).await.map_err(|e| {
        WireError::new(e.code, format!("proxy: {}", e.message)).with("kind", "connect")
    })
}

/// `CONNECT host:port` through the proxy; anything but a 2xx is refused.
async fn tunnel(s: &mut TcpStream, url: &Url, host: &str, port: u16) -> Result<(), WireError> {
    let authority = match url.host() {
        Some(Host::Ipv6(_)) => format!("[{host}]:{port}"),
        _ => format!("{host}:{port}"),
    };
    let request = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n");
    s.write_all(request.as_bytes())
        .await
        .map_err(|e| http_error("connect", format!("proxy: {e}")))?;
    // Read the reply head byte by byte: nothing past it may be consumed.
    let mut head = Vec::with_capacity(256);
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= 16 * 1024 {
            return Err(http_error("connect", "proxy: reply head too long".into()));
        }
        let b = s
            .read_u8()
            .await
            .map_err(|e| http_error("connect", format!("proxy: {e}")))?;
        head.push(b);
    }
    let line = String::from_utf8_lossy(&head);
    let status = line.split_whitespace().nth(1).unwrap_or("");
    if !status.starts_with('2') {
        let first = line.lines().next().unwrap_or("").to_string();
        return Err(http_error(
            "connect",
            format!("proxy refused CONNECT {authority}: {first}"),
        ));
    }
    Ok(())
}

/// Aborts the connection task when dropped (a cancelled or finished
/// exchange never leaves a connection behind).
#[derive(Debug)]
pub struct ConnGuard(tokio::task::JoinHandle<()>);

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A response head with its body still on the wire.
#[derive(Debug)]
pub struct Exchange {
    pub head: http::response::Parts,
    pub body: Incoming,
    pub guard: ConnGuard,
}

/// Connect and send one request; returns when the response head arrived.
pub async fn exchange(
    ctx: &HttpContext,
    url: &Url,
    dest: &Destinations<'_>,
    method: &http::Method,
    headers: &http::HeaderMap,
    body: &Bytes,
) -> Result<Exchange, WireError> {
    let conn = connect(ctx, url, dest).await?;
    let host = host_text(url);
    let io = TokioIo::new(conn.io);
    let io_err = |stage: &str, e: hyper::Error| {
        http_error(
            "io",
            format!("HTTP exchange with {host} failed ({stage}): {e}"),
        )
    };
    let mut builder = http::Request::builder().method(method.clone());
    let path = match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_string(),
    };
    // HTTP/2 carries the authority in the URI (`:authority`, from the URL
    // only: pseudo-headers are not valid header names, and a `Host` the
    // caller sent names the same authority, checked in `prepare`);
    // HTTP/1.1 in `Host`.
    builder = if conn.h2 {
        builder.uri(url.as_str()).version(http::Version::HTTP_2)
    } else {
        builder.uri(path)
    };
    let mut request = builder
        .body(Full::new(body.clone()))
        .map_err(|e| WireError::invalid_params("url", format!("{url}: {e}")))?;
    *request.headers_mut() = headers.clone();
    if !conn.h2 && !request.headers().contains_key(http::header::HOST) {
        let authority = match (url.host(), url.port()) {
            (Some(Host::Ipv6(_)), Some(p)) => format!("[{host}]:{p}"),
            (Some(Host::Ipv6(_)), None) => format!("[{host}]"),
            (_, Some(p)) => format!("{host}:{p}"),
            (_, None) => host.clone(),
        };
        let value = http::HeaderValue::from_str(&authority)
            .map_err(|e| WireError::invalid_params("url", format!("{url}: {e}")))?;
        request.headers_mut().insert(http::header::HOST, value);
    }
    let response = if conn.h2 {
        // Flow-control windows bound what a server may send ahead of our
        // reading (hyper's defaults allow megabytes per stream).
        let (mut sender, connection) =
            hyper::client::conn::http2::Builder::new(TokioExecutor::new())
                .initial_stream_window_size(READ_AHEAD as u32)
                .initial_connection_window_size(READ_AHEAD as u32)
                .handshake(io)
                .await
                .map_err(|e| io_err("HTTP/2 handshake", e))?;
        let guard = ConnGuard(tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "HTTP/2 connection ended");
            }
        }));
        sender
            .ready()
            .await
            .map_err(|e| io_err("HTTP/2 ready", e))?;
        let r = sender
            .send_request(request)
            .await
            .map_err(|e| io_err("request", e))?;
        (r, guard)
    } else {
        let (mut sender, connection) = hyper::client::conn::http1::Builder::new()
            .max_buf_size(READ_AHEAD)
            .handshake(io)
            .await
            .map_err(|e| io_err("HTTP/1.1 handshake", e))?;
        let guard = ConnGuard(tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "HTTP/1.1 connection ended");
            }
        }));
        sender
            .ready()
            .await
            .map_err(|e| io_err("HTTP/1.1 ready", e))?;
        let r = sender
            .send_request(request)
            .await
            .map_err(|e| io_err("request", e))?;
        (r, guard)
    };
    let (response, guard) = response;
    let (head, body) = response.into_parts();
    Ok(Exchange { head, body, guard })
}
