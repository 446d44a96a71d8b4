//! `http/request` and `http/cancel` (docs/PROTOCOL.md §6): HTTP from the
//! executor's side of the network.
//!
//! Where PROTOCOL.md is silent, the choices are documented in
//! `executor_protocol::types::http`; the destination policy is in [`policy`].
//!
//! A handler module: it uses the session, its stream table
//! ([`crate::tables::streams`]), [`crate::http_client`] and `outbound`
//! (a stream's body deltas); nothing above it.

pub use crate::destinations as policy;
pub use crate::http_client as transport;

use crate::outbound::{NotifyError, Outbound, Reply};
use crate::session::Session;
pub use crate::tables::streams::Streams;
use bytes::Bytes;
use executor_protocol::methods;
use executor_protocol::types::http::{
    BodyDelta, EnvHeader, HttpCancelParams, HttpRequestParams, HttpResponse, HttpStreamHead,
};
use executor_protocol::types::sandbox::SandboxIntent;
use executor_protocol::types::Empty;
use executor_protocol::{ErrorCode, WireError};
use http::header;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use policy::Destinations;
use serde_bytes::ByteBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{oneshot, OwnedSemaphorePermit};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
pub use transport::HttpContext;
use transport::{http_error, Exchange};
use url::Url;

/// The longest `timeout_ms` accepted: a day.
pub const MAX_TIMEOUT_MS: u64 = 24 * 60 * 60 * 1000;
/// The most redirect hops one request may ask for.
pub const MAX_REDIRECTS: u32 = 20;

/// A validated request.
struct Prepared {
    method: http::Method,
    url: Url,
    headers: http::HeaderMap,
    body: Bytes,
    timeout: Duration,
    stream: bool,
    max_body: Option<u64>,
    follow: u32,
    sandbox: Option<SandboxIntent>,
    /// The names of the headers valued from the agent's environment: taken
    /// off at any change of origin, as credentials are.
    env_names: Vec<header::HeaderName>,
}

fn prepare(s: &Session, p: HttpRequestParams) -> Result<Prepared, WireError> {
    let method = http::Method::from_bytes(p.method.as_bytes()).map_err(|_| {
        WireError::invalid_params("method", format!("{:?} is not an HTTP method", p.method))
    })?;
    if method == http::Method::CONNECT {
        return Err(WireError::invalid_params(
            "method",
            "CONNECT is not supported by http/request",
        ));
    }
    let url = check_url(&p.url)?;
    let mut headers = request_headers(&url, &p.headers)?;
    let env_names = env_headers(s, &url, &p.env_headers, &mut headers)?;
    if p.timeout_ms == 0 || p.timeout_ms > MAX_TIMEOUT_MS {
        return Err(WireError::invalid_params(
            "timeout_ms",
            format!(
                "timeout_ms {} is outside 1..={MAX_TIMEOUT_MS}",
                p.timeout_ms
            ),
        ));
    }
    if p.follow_redirects > MAX_REDIRECTS {
        return Err(WireError::invalid_params(
            "follow_redirects",
            format!(
                "follow_redirects {} is above {MAX_REDIRECTS}",
                p.follow_redirects
            ),
        ));
    }
    let cap = s.limits().max_http_body_bytes;
    let max_body = if p.stream {
        p.max_response_bytes
    } else {
        match p.max_response_bytes {
            Some(n) if n > cap => {
                return Err(WireError::limit("max_http_body_bytes", cap, Some(n)))
            }
            Some(n) => Some(n),
            None => Some(cap),
        }
    };
    Ok(Prepared {
        method,
        url,
        headers,
        body: p
            .body
            .map(|b| Bytes::from(b.into_vec()))
            .unwrap_or_default(),
        timeout: Duration::from_millis(p.timeout_ms),
        stream: p.stream,
        max_body,
        follow: p.follow_redirects,
        sandbox: p.sandbox,
        env_names,
    })
}

/// `url` parsed: http or https, with a host, without credentials.
fn check_url(text: &str) -> Result<Url, WireError> {
    let url = Url::parse(text)
        .map_err(|e| WireError::invalid_params("url", format!("{text:?} is not a URL: {e}")))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(WireError::invalid_params(
            "url",
            format!(
                "{:?}: scheme {:?} is not supported (only http and https)",
                text,
                url.scheme()
            ),
        ));
    }
    if url.host().is_none() {
        return Err(WireError::invalid_params(
            "url",
            format!("{:?} has no host", text),
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(WireError::invalid_params(
            "url",
            "credentials in the URL are not supported: send an Authorization header",
        ));
    }
    Ok(url)
}

/// The request's headers, each name and value valid, at most one `Host`
/// and that one naming the URL's authority ([`check_host_header`]).
fn request_headers(url: &Url, given: &[(String, String)]) -> Result<http::HeaderMap, WireError> {
    let mut headers = http::HeaderMap::with_capacity(given.len());
    let mut host_at = None;
    for (i, (name, value)) in given.iter().enumerate() {
        let n = header::HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            WireError::invalid_params(
                &format!("headers.{i}"),
                format!("{name:?} is not a valid header name"),
            )
        })?;
        // The value is never echoed: it may be a credential.
        let v = header::HeaderValue::from_str(value).map_err(|_| {
            WireError::invalid_params(
                &format!("headers.{i}"),
                format!("the value of header {name:?} is not a valid header value"),
            )
        })?;
        if n == header::HOST {
            if let Some(first) = host_at {
                return Err(WireError::invalid_params(
                    &format!("headers.{i}"),
                    format!("a second Host header (the first is headers.{first}): a request names one authority"),
                ));
            }
            check_host_header(url, i, name, value)?;
            host_at = Some(i);
        }
        headers.append(n, v);
    }
    Ok(headers)
}

/// `env_headers`, appended in order: each variable one the configuration
/// lets this key read ([`crate::config::HttpConfig::header_env_refusal`]:
/// `policy_denied`), set and not empty in the agent's environment; never a
/// `Host` header (its value would be echoed in a refusal). Values are
/// never echoed nor logged.
fn env_headers(
    s: &Session,
    url: &Url,
    given: &[EnvHeader],
    headers: &mut http::HeaderMap,
) -> Result<Vec<header::HeaderName>, WireError> {
    let mut names = Vec::new();
    for (i, h) in given.iter().enumerate() {
        let field = format!("env_headers.{i}");
        let n = header::HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| {
            WireError::invalid_params(&field, format!("{:?} is not a valid header name", h.name))
        })?;
        if n == header::HOST {
            return Err(WireError::invalid_params(
                &field,
                "a Host header cannot take its value from the environment",
            ));
        }
        if let Some(why) = s.http().config.header_env_refusal(s.profile(), &h.env, url) {
            return Err(WireError::new(
                ErrorCode::PolicyDenied,
                format!("header {:?} from variable {:?}: {why}", h.name, h.env),
            )
            .with("field", field)
            .with("env", h.env.as_str()));
        }
        let found = if h.env.is_empty() || h.env.contains(['=', '\0']) {
            None
        } else {
            std::env::var(&h.env).ok().filter(|v| !v.is_empty())
        };
        let Some(found) = found else {
            return Err(WireError::invalid_params(
                &field,
                format!(
                    "header {:?}: the variable {:?} is not set, or empty, in the agent's environment",
                    h.name, h.env
                ),
            ));
        };
        let v = header::HeaderValue::from_str(&format!("{}{found}", h.prefix)).map_err(|_| {
            WireError::invalid_params(
                &field,
                format!(
                    "header {:?}: its prefix and the variable {:?} make no valid header value",
                    h.name, h.env
                ),
            )
        })?;
        names.push(n.clone());
        headers.append(n, v);
    }
    Ok(names)
}

/// A `Host` header (any case of the name) must name the URL's authority:
/// the same host, ASCII case aside, written as the URL writes it (a name in
/// lower-case ASCII, an IPv4 address dotted, an IPv6 address in brackets),
/// and the same port, which may be left out when the URL uses the scheme's
/// default. Anything else is `invalid_params` before any connection.
///
/// This holds with or without `http.allow`: the destination policy judges
/// the URL's host, and a server that routes by `Host` (virtual hosts, and
/// HTTP/2's `:authority`, which the agent always takes from the URL) would
/// otherwise answer for a host the policy never judged. Reaching a virtual
/// host means putting its name in the URL.
fn check_host_header(url: &Url, i: usize, name: &str, value: &str) -> Result<(), WireError> {
    let host = url.host_str().unwrap_or_default();
    let port = url.port_or_known_default();
    let given = value.trim_matches([' ', '\t']);
    // `host[:port]`, an IPv6 host in brackets.
    let split = if given.starts_with('[') {
        given.find(']').map(|end| end + 1)
    } else {
        given.find(':')
    };
    let (h, p) = given.split_at(split.unwrap_or(given.len()));
    let port_ok = match p.strip_prefix(':') {
        // No port: the scheme's default, which the URL must use too.
        None => p.is_empty() && url.port().is_none(),
        Some(digits) => {
            !digits.is_empty()
                && digits.bytes().all(|b| b.is_ascii_digit())
                && digits.parse::<u16>().ok() == port
        }
    };
    if h.eq_ignore_ascii_case(host) && port_ok {
        return Ok(());
    }
    let authority = match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    };
    Err(WireError::invalid_params(
        &format!("headers.{i}"),
        format!(
            "header {name:?} is {value:?}, but the URL's authority is {authority:?}: a Host header must name the URL's host and port"
        ),
    )
    .with("header", name)
    .with("value", value)
    .with("authority", authority))
}

/// `http/request`: a whole response, or a stream's head (sent before any
/// of its deltas: the pump waits for the head to be queued).
pub async fn handle_request(s: &Arc<Session>, p: HttpRequestParams) -> Result<Reply, WireError> {
    // Destinations are judged under the request's or the profile's intent.
    crate::audit::note_sandboxed(p.sandbox.is_some() || s.profile().sandbox.is_some());
    let req = prepare(s, p)?;
    let streams = s.http_streams();
    let permit = if req.stream {
        Some(streams.reserve_slot()?)
    } else {
        None
    };
    tracing::debug!(
        method = %req.method,
        scheme = req.url.scheme(),
        host = %transport::host_text(&req.url),
        stream = req.stream,
        "http/request"
    );
    let ms = req.timeout.as_millis() as u64;
    let deadline = Instant::now() + req.timeout;
    let timed_out = |what: &str| {
        WireError::new(
            ErrorCode::Timeout,
            format!(
                "{what} from {} within timeout_ms {ms}",
                transport::host_text(&req.url)
            ),
        )
        .with("timeout_ms", ms)
    };
    let (url, ex) = tokio::time::timeout_at(
        deadline,
        follow(s.http(), s.profile().sandbox.as_ref(), &req),
    )
    .await
    .map_err(|_| timed_out("no response head"))??;
    let Exchange { head, body, guard } = ex;
    let status = head.status.as_u16();
    let headers = header_pairs(&head.headers);
    if !req.stream {
        let max = req.max_body.unwrap_or(s.limits().max_http_body_bytes);
        if let Some(len) = content_length(&head.headers) {
            if len > max {
                return Err(WireError::limit("max_http_body_bytes", max, Some(len)));
            }
        }
        let body = tokio::time::timeout_at(deadline, collect(body, max))
            .await
            .map_err(|_| timed_out("no complete body"))??;
        drop(guard);
        return Ok(Reply::value(HttpResponse {
            status,
            headers,
            body: ByteBuf::from(body),
            url: url.to_string(),
        }));
    }
    let (stream_id, token) = streams.open();
    let (started, start) = oneshot::channel();
    let pump = Pump {
        streams: s.http_streams().clone(),
        outbound: s.outbound().clone(),
        stream_id,
        idle: req.timeout,
        max_total: req.max_body,
        token,
        _guard: guard,
        _permit: permit,
    };
    tokio::spawn(pump.run(body, start));
    Ok(Reply::Stream {
        head: Box::new(HttpStreamHead {
            status,
            headers,
            url: url.to_string(),
            stream_id,
        }),
        started,
    })
}

/// Send the request, following redirects as asked; every hop is checked
/// against the destination policy again (inside `exchange`).
async fn follow(
    ctx: &HttpContext,
    profile: Option<&SandboxIntent>,
    req: &Prepared,
) -> Result<(Url, Exchange), WireError> {
    let mut url = req.url.clone();
    let mut method = req.method.clone();
    let mut headers = req.headers.clone();
    let mut body = req.body.clone();
    let dest = Destinations {
        allow: &ctx.config.allow,
        sandbox: req.sandbox.as_ref(),
        profile,
    };
    let mut hops = 0;
    loop {
        let ex = transport::exchange(ctx, &url, &dest, &method, &headers, &body).await?;
        let code = ex.head.status.as_u16();
        if hops >= req.follow || !matches!(code, 301 | 302 | 303 | 307 | 308) {
            return Ok((url, ex));
        }
        let Some(next) = ex
            .head
            .headers
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|loc| url.join(loc).ok())
        else {
            return Ok((url, ex));
        };
        let refuse = |rule: &str| {
            WireError::new(
                ErrorCode::PolicyDenied,
                format!("refused the redirect from {url} to {next}: {rule}"),
            )
            .with("host", transport::host_text(&next))
            .with("rule", rule)
        };
        if next.scheme() != "http" && next.scheme() != "https" {
            return Err(refuse("redirects only go to http or https"));
        }
        if url.scheme() == "https" && next.scheme() == "http" {
            return Err(refuse("never from https to http"));
        }
        let to_get = (code == 303 && method != http::Method::HEAD)
            || (matches!(code, 301 | 302) && method == http::Method::POST);
        if to_get {
            method = http::Method::GET;
            body = Bytes::new();
            for h in [
                header::CONTENT_TYPE,
                header::CONTENT_LENGTH,
                header::TRANSFER_ENCODING,
                header::CONTENT_ENCODING,
            ] {
                headers.remove(h);
            }
        }
        if url.origin() != next.origin() {
            for h in &req.env_names {
                headers.remove(h);
            }
            for h in [
                header::AUTHORIZATION,
                header::COOKIE,
                header::PROXY_AUTHORIZATION,
                header::HOST,
            ] {
                headers.remove(h);
            }
        }
        drop(ex);
        hops += 1;
        url = next;
    }
}

fn content_length(h: &http::HeaderMap) -> Option<u64> {
    h.get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Response headers in order, repeated names kept.
fn header_pairs(h: &http::HeaderMap) -> Vec<(String, String)> {
    h.iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect()
}

/// Read a whole body, refusing more than `max` bytes.
async fn collect(mut body: Incoming, max: u64) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| http_error("io", format!("reading the body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            let total = out.len() as u64 + data.len() as u64;
            if total > max {
                return Err(
                    WireError::limit("max_http_body_bytes", max, None).with("received", total)
                );
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

/// Moves one streamed body to the client as ordered deltas. It reads from
/// the upstream only when the previous delta found room in the
/// notification queue, so a slow client slows the server down.
struct Pump {
    streams: Arc<Streams>,
    outbound: Outbound,
    stream_id: u64,
    idle: Duration,
    max_total: Option<u64>,
    token: CancellationToken,
    _guard: transport::ConnGuard,
    _permit: Option<OwnedSemaphorePermit>,
}

impl Pump {
    async fn run(self, mut body: Incoming, start: oneshot::Receiver<()>) {
        // The head must be queued before the first delta; if it never is
        // (the request was cancelled), nobody knows this stream.
        if start.await.is_err() {
            self.streams.remove(self.stream_id);
            return;
        }
        let mut seq = 0u64;
        let mut total = 0u64;
        let error = loop {
            let next = tokio::select! {
                _ = self.token.cancelled() => break Some(self.cancelled()),
                r = tokio::time::timeout(self.idle, body.frame()) => r,
            };
            let data = match next {
                Err(_) => {
                    let ms = self.idle.as_millis() as u64;
                    break Some(
                        WireError::new(
                            ErrorCode::Timeout,
                            format!("no body data for timeout_ms {ms}"),
                        )
                        .with("timeout_ms", ms),
                    );
                }
                Ok(None) => break None,
                Ok(Some(Err(e))) => break Some(http_error("io", format!("reading the body: {e}"))),
                Ok(Some(Ok(frame))) => match frame.into_data() {
                    Ok(d) if !d.is_empty() => d,
                    _ => continue,
                },
            };
            total += data.len() as u64;
            if let Some(max) = self.max_total {
                if total > max {
                    break Some(WireError::limit("max_http_body_bytes", max, None));
                }
            }
            // The data follows its frame head by reference: never copied.
            let sent = tokio::select! {
                r = self.outbound.notify_body_delta(self.stream_id, seq, data) => r,
                _ = self.token.cancelled() => break Some(self.cancelled()),
            };
            if let Err(NotifyError::Unencodable(e)) = sent {
                break Some(WireError::new(ErrorCode::Internal, e));
            }
            if sent.is_err() {
                // The connection is gone: nobody to tell.
                self.streams.remove(self.stream_id);
                return;
            }
            seq += 1;
        };
        drop(body);
        self.streams.remove(self.stream_id);
        let last = BodyDelta {
            stream_id: self.stream_id,
            seq,
            data: ByteBuf::new(),
            done: true,
            error,
        };
        let _ = self.outbound.notify(methods::HTTP_BODY_DELTA, &last).await;
    }

    fn cancelled(&self) -> WireError {
        WireError::new(
            ErrorCode::Cancelled,
            format!("stream {} was cancelled", self.stream_id),
        )
    }
}

/// `http/cancel`
pub async fn handle_cancel(s: &Arc<Session>, p: HttpCancelParams) -> Result<Empty, WireError> {
    s.http_streams().cancel(p.stream_id)?;
    Ok(Empty {})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host_ok(url: &str, value: &str) -> bool {
        check_host_header(&Url::parse(url).unwrap(), 0, "Host", value).is_ok()
    }

    #[test]
    fn a_host_header_must_name_the_urls_authority() {
        for (url, value) in [
            ("http://example.com/", "example.com"),
            ("http://example.com/", "EXAMPLE.com"),
            ("http://example.com/", " example.com\t"),
            ("http://example.com/", "example.com:80"),
            ("http://example.com:80/", "example.com"),
            ("https://example.com/", "example.com:443"),
            ("http://Example.COM:8080/", "example.com:8080"),
            ("http://127.0.0.1:8080/", "127.0.0.1:8080"),
            ("http://[::1]:8080/", "[::1]:8080"),
            ("http://[::1]/", "[::1]"),
        ] {
            assert!(host_ok(url, value), "{url} {value:?}");
        }
        for (url, value) in [
            ("http://example.com/", "other.example"),
            ("http://example.com/", "example.com.evil"),
            ("http://example.com/", "example.com:8080"),
            ("http://example.com/", "example.com:"),
            ("http://example.com/", "example.com:+80"),
            ("http://example.com/", "example.com:80:80"),
            ("http://example.com:8080/", "example.com"),
            ("http://example.com:8080/", "example.com:8081"),
            ("https://example.com/", "example.com:80"),
            ("http://127.0.0.1/", "0x7f.1"),
            ("http://127.0.0.1/", "localhost"),
            ("http://[::1]/", "::1"),
            ("http://[::1]/", "[::1"),
            ("http://[::1]/", "[::1]x"),
            ("http://example.com/", ""),
        ] {
            assert!(!host_ok(url, value), "{url} {value:?}");
        }
        let e = check_host_header(
            &Url::parse("http://localhost:8080/").unwrap(),
            2,
            "hOsT",
            "evil.example",
        )
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidParams);
        assert_eq!(
            e.data_get("field").and_then(|v| v.as_str()),
            Some("headers.2")
        );
        for part in ["\"hOsT\"", "\"evil.example\"", "\"localhost:8080\""] {
            assert!(e.message.contains(part), "{}", e.message);
        }
    }
}
