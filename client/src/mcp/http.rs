//! [`HostHttp`]: rmcp's `StreamableHttpClient` over `http/request`, so an
//! MCP server's Streamable HTTP endpoint is reached from the host.
//!
//! Every request is streamed (`stream: true`): a JSON answer is read up to
//! rmcp's size limit, an SSE answer is parsed as its deltas arrive, and a
//! body dropped early ends its stream on the agent. Status handling follows
//! rmcp's own clients (401/403 with `WWW-Authenticate`, 429 and 5xx as its
//! `HttpStatusError`, 202/204 accepted, 404 on a session = expired, a
//! JSON-RPC error in an error body kept).

use crate::http::{HttpBody, HttpRequest, HttpResponse};
use crate::{Client, Error};
use bytes::Bytes;
use executor_protocol::types::sandbox::SandboxIntent;
use futures_util::stream::BoxStream;
use futures_util::{Stream, StreamExt};
use http::{HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, ErrorData, ServerJsonRpcMessage};
use rmcp::transport::common::http_header::{
    EVENT_STREAM_MIME_TYPE, HEADER_LAST_EVENT_ID, HEADER_SESSION_ID, JSON_MIME_TYPE,
};
use rmcp::transport::streamable_http_client::{
    AuthRequiredError, HttpStatusError, InsufficientScopeError, SseError, StreamableHttpClient,
    StreamableHttpClientTransportConfig, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};
use rmcp::transport::StreamableHttpClientTransport;
use sse_stream::{Sse, SseStream};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// rmcp's default for one SSE event (its own clients' bound).
const DEFAULT_MAX_SSE_EVENT_SIZE: usize = 16 * 1024 * 1024;

/// The default deadline for a response's head and for each idle gap in a
/// body (the `mcp http` bridge's `--timeout-ms`): an hour, so a quiet SSE
/// stream or a long tool call is not cut.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3600);

/// Header names the transport sets itself; a custom header may not (as
/// rmcp's own clients: `MCP-Protocol-Version` passes, rmcp sets it so).
const RESERVED: [&str; 3] = ["accept", HEADER_SESSION_ID, HEADER_LAST_EVENT_ID];

type StreamResult<T> = Result<T, StreamableHttpError<Error>>;

/// rmcp's `StreamableHttpClient` through the agent's `http/request`: the
/// MCP server is reached from the host (its loopback, its network, its
/// egress policy), and headers may take their values from the agent's
/// environment ([`HostHttp::header_from_env`]) so a token never crosses the
/// client's connection.
#[derive(Debug, Clone)]
pub struct HostHttp {
    client: Client,
    env_headers: Vec<(String, String, String)>,
    timeout: Duration,
    sandbox: Option<SandboxIntent>,
}

impl HostHttp {
    /// Requests through `client`, [`DEFAULT_TIMEOUT`] apart.
    pub fn new(client: Client) -> Self {
        HostHttp {
            client,
            env_headers: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
            sandbox: None,
        }
    }

    /// rmcp's Streamable HTTP client transport to `uri` through this
    /// client: `StreamableHttpClientTransport::from_uri(uri)` with the
    /// requests leaving from the host. For more settings, give a
    /// [`StreamableHttpClientTransportConfig`] to
    /// `StreamableHttpClientTransport::with_client`.
    pub fn transport(self, uri: impl Into<Arc<str>>) -> StreamableHttpClientTransport<HostHttp> {
        StreamableHttpClientTransport::with_client(
            self,
            StreamableHttpClientTransportConfig::with_uri(uri),
        )
    }

    /// Every request carries the header `name` whose value is `prefix`
    /// followed by the agent's environment variable `env` (the agent's
    /// `http.header_env` says which it may read).
    pub fn header_from_env(
        mut self,
        name: impl Into<String>,
        env: impl Into<String>,
        prefix: impl Into<String>,
    ) -> Self {
        self.env_headers
            .push((name.into(), env.into(), prefix.into()));
        self
    }

    /// The deadline for a response's head, and for each idle gap of its
    /// body (an SSE stream quiet for longer ends, and rmcp reconnects it).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Limit where the requests may go (`network` of the intent).
    pub fn sandbox(mut self, intent: SandboxIntent) -> Self {
        self.sandbox = Some(intent);
        self
    }

    fn request(
        &self,
        method: &str,
        uri: &str,
        auth: Option<String>,
        custom: HashMap<HeaderName, HeaderValue>,
    ) -> StreamResult<HttpRequest> {
        let ms = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
        let mut r = HttpRequest::new(method, uri).stream(true).timeout_ms(ms);
        if let Some(intent) = &self.sandbox {
            r = r.sandbox(intent.clone());
        }
        for (name, env, prefix) in &self.env_headers {
            r = r.header_from_env(name, env, prefix);
        }
        if let Some(token) = auth {
            r = r.header("Authorization", format!("Bearer {token}"));
        }
        for (name, value) in custom {
            let n = name.as_str();
            if RESERVED.iter().any(|r| n.eq_ignore_ascii_case(r)) {
                return Err(StreamableHttpError::ReservedHeaderConflict(
                    name.to_string(),
                ));
            }
            let value = value.to_str().map_err(|_| {
                StreamableHttpError::Client(Error::Encode {
                    method: "http/request".into(),
                    message: format!("header {n}: its value is not visible ASCII"),
                })
            })?;
            r = r.header(n, value);
        }
        Ok(r)
    }

    async fn send(&self, request: HttpRequest) -> StreamResult<HttpResponse> {
        self.client
            .http_request(request)
            .await
            .map_err(StreamableHttpError::Client)
    }
}

/// The first value of header `name`.
fn header<'a>(r: &'a HttpResponse, name: &'a str) -> Option<&'a str> {
    r.header_values(name).next()
}

/// Whether a `Content-Type` value names `mime` (parameters ignored).
fn is_mime(value: Option<&str>, mime: &str) -> bool {
    value
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(mime))
}

/// 401/403 with a challenge: rmcp's auth errors.
fn auth_failure(r: &HttpResponse) -> Option<StreamableHttpError<Error>> {
    let challenge = header(r, "www-authenticate")?.to_string();
    match r.status {
        401 => Some(StreamableHttpError::AuthRequired(AuthRequiredError::new(
            challenge,
        ))),
        403 => {
            let scope = scope_of(&challenge);
            Some(StreamableHttpError::InsufficientScope(
                InsufficientScopeError::new(challenge, scope),
            ))
        }
        _ => None,
    }
}

/// 429 and 5xx: rmcp's status error (with `Retry-After`), as its own
/// clients report them.
fn status_failure(r: &HttpResponse) -> Option<HttpStatusError> {
    (r.status == 429 || r.status >= 500)
        .then(|| HttpStatusError::new(r.status, header(r, "retry-after").map(str::to_owned)))
}

/// The `scope=` parameter of a challenge, quoted or not.
fn scope_of(challenge: &str) -> Option<String> {
    let at = challenge.find("scope=")?;
    let rest = &challenge[at + "scope=".len()..];
    let scope = match rest.strip_prefix('"') {
        Some(q) => q.split('"').next()?,
        None => rest.split([',', ' ']).next()?,
    };
    Some(scope.to_string())
}

/// Up to `limit` bytes of `body`; `Err(None)` when it holds more.
async fn read_up_to(body: &mut HttpBody, limit: usize) -> Result<Vec<u8>, Option<Error>> {
    let mut out = Vec::new();
    while let Some(chunk) = body.next_chunk().await {
        let chunk = chunk.map_err(Some)?;
        if out.len() + chunk.len() > limit {
            let room = limit - out.len();
            out.extend_from_slice(&chunk[..room]);
            return Err(None);
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// A body that failed as a stream of SSE bytes.
#[derive(Debug, thiserror::Error)]
enum SseBodyError {
    #[error(transparent)]
    Body(Error),
    #[error("an SSE event larger than {0} bytes")]
    EventTooLarge(usize),
}

/// Counts the bytes of the current SSE event (its non-empty lines), reset
/// by the blank line that ends it.
struct EventSize {
    max: usize,
    size: usize,
    at_line_start: bool,
}

impl EventSize {
    fn observe(&mut self, chunk: &[u8]) -> Result<(), SseBodyError> {
        for &b in chunk {
            match b {
                b'\n' => {
                    if self.at_line_start {
                        self.size = 0;
                    }
                    self.at_line_start = true;
                }
                b'\r' => {}
                _ => {
                    self.at_line_start = false;
                    self.size += 1;
                    if self.size > self.max {
                        return Err(SseBodyError::EventTooLarge(self.max));
                    }
                }
            }
        }
        Ok(())
    }
}

/// `body` parsed as SSE, each event at most `max_event` bytes.
fn sse(body: HttpBody, max_event: usize) -> BoxStream<'static, Result<Sse, SseError>> {
    let mut size = EventSize {
        max: max_event,
        size: 0,
        at_line_start: true,
    };
    let bytes = body.into_stream().map(move |chunk| {
        let chunk = chunk.map_err(SseBodyError::Body)?;
        size.observe(&chunk)?;
        Ok::<Bytes, SseBodyError>(chunk)
    });
    let bytes: std::pin::Pin<Box<dyn Stream<Item = Result<Bytes, SseBodyError>> + Send>> =
        Box::pin(bytes);
    SseStream::from_bytes_stream(bytes).boxed()
}

/// A `server/discover` refused with a 4xx (not 401/403, no session yet)
/// answers as a JSON-RPC error, so rmcp falls back to `initialize` (as its
/// own clients do).
fn discover_refused(
    message: &ClientJsonRpcMessage,
    had_session: bool,
    status: u16,
    body: &str,
) -> Option<StreamableHttpPostResponse> {
    if had_session || !(400..500).contains(&status) || status == 401 || status == 403 {
        return None;
    }
    let ClientJsonRpcMessage::Request(request) = message else {
        return None;
    };
    if !matches!(request.request, ClientRequest::DiscoverRequest(_)) {
        return None;
    }
    let error = match serde_json::from_str::<ServerJsonRpcMessage>(body) {
        Ok(ServerJsonRpcMessage::Error(e)) => e.error,
        _ => ErrorData::invalid_request(
            format!("server/discover rejected with HTTP {status}: {body}"),
            None,
        ),
    };
    Some(StreamableHttpPostResponse::Json(
        ServerJsonRpcMessage::error(error, Some(request.id.clone())),
        None,
    ))
}

impl StreamableHttpClient for HostHttp {
    type Error = Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> StreamResult<StreamableHttpPostResponse> {
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            StreamableHttpResponseLimits::default(),
        )
        .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> StreamResult<StreamableHttpPostResponse> {
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_sse_event_size = max_sse_event_size;
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            limits,
        )
        .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> StreamResult<StreamableHttpPostResponse> {
        let json = serde_json::to_vec(&message)?;
        let mut request = self
            .request("POST", &uri, auth_header, custom_headers)?
            .header("Content-Type", JSON_MIME_TYPE)
            .header(
                "Accept",
                format!("{EVENT_STREAM_MIME_TYPE}, {JSON_MIME_TYPE}"),
            )
            .body(json);
        let had_session = session_id.is_some();
        if let Some(id) = &session_id {
            request = request.header(HEADER_SESSION_ID, id.as_ref());
        }
        let mut response = self.send(request).await?;
        if let Some(e) = auth_failure(&response) {
            return Err(e);
        }
        let status = response.status;
        if status == 202 || status == 204 {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        if status == 404 && had_session {
            return Err(StreamableHttpError::SessionExpired);
        }
        let content_type = header(&response, "content-type").map(str::to_owned);
        let new_session = header(&response, HEADER_SESSION_ID).map(str::to_owned);
        let is_json = is_mime(content_type.as_deref(), JSON_MIME_TYPE);
        if !(200..300).contains(&status) {
            if let Some(e) = status_failure(&response).filter(|_| !is_json || status == 429) {
                return Err(e.into());
            }
            let auth = status == 401 || status == 403;
            let limit = if is_json && !auth {
                limits.max_json_response_size
            } else {
                limits.max_error_response_size
            };
            let body = match read_up_to(&mut response.body, limit).await {
                Ok(b) => b,
                Err(None) if is_json && !auth => {
                    return Err(StreamableHttpError::ResponseBodyTooLarge { max_size: limit })
                }
                Err(None) => Vec::new(),
                Err(Some(e)) => format!("<the body failed: {e}>").into_bytes(),
            };
            let text = String::from_utf8_lossy(&body);
            if is_json && !auth {
                if let Ok(e @ ServerJsonRpcMessage::Error(_)) =
                    serde_json::from_str::<ServerJsonRpcMessage>(&text)
                {
                    if let Some(r) = discover_refused(&message, had_session, status, &text) {
                        return Ok(r);
                    }
                    return Ok(StreamableHttpPostResponse::Json(e, new_session));
                }
            }
            if let Some(r) = discover_refused(&message, had_session, status, &text) {
                return Ok(r);
            }
            if let Some(e) = status_failure(&response) {
                return Err(e.into());
            }
            return Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(
                format!("HTTP {status}: {text}"),
            )));
        }
        let awaits_nothing = !matches!(message, ClientJsonRpcMessage::Request(_));
        let declared_empty = header(&response, "content-length").map(str::trim) == Some("0");
        if awaits_nothing && declared_empty {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        if is_mime(content_type.as_deref(), EVENT_STREAM_MIME_TYPE) {
            let events = sse(response.body, limits.max_sse_event_size);
            return Ok(StreamableHttpPostResponse::Sse(events, new_session));
        }
        if is_json {
            let body = match read_up_to(&mut response.body, limits.max_json_response_size).await {
                Ok(b) => b,
                Err(None) => {
                    return Err(StreamableHttpError::ResponseBodyTooLarge {
                        max_size: limits.max_json_response_size,
                    })
                }
                Err(Some(e)) => return Err(StreamableHttpError::Client(e)),
            };
            return match serde_json::from_slice::<ServerJsonRpcMessage>(&body) {
                Ok(parsed) => Ok(StreamableHttpPostResponse::Json(parsed, new_session)),
                Err(e) if awaits_nothing => {
                    tracing::warn!(error = %e, "an unparsable JSON answer to a notification, taken as accepted");
                    Ok(StreamableHttpPostResponse::Accepted)
                }
                Err(e) => Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(
                    format!(
                        "the answer is not a JSON-RPC message: {e}: {}",
                        String::from_utf8_lossy(&body[..body.len().min(256)])
                    ),
                ))),
            };
        }
        if awaits_nothing {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        Err(StreamableHttpError::UnexpectedContentType(content_type))
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> StreamResult<()> {
        let request = self
            .request("DELETE", &uri, auth_header, custom_headers)?
            .header(HEADER_SESSION_ID, session_id.as_ref());
        let response = self.send(request).await?;
        match response.status {
            405 => {
                tracing::debug!("the MCP server does not delete sessions");
                Ok(())
            }
            200..=299 => Ok(()),
            s => Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(
                format!("delete_session returned {s}"),
            ))),
        }
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> StreamResult<BoxStream<'static, Result<Sse, SseError>>> {
        self.get_stream_with_max_sse_event_size(
            uri,
            session_id,
            last_event_id,
            auth_header,
            custom_headers,
            DEFAULT_MAX_SSE_EVENT_SIZE,
        )
        .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> StreamResult<BoxStream<'static, Result<Sse, SseError>>> {
        let mut request = self
            .request("GET", &uri, auth_header, custom_headers)?
            .header(
                "Accept",
                format!("{EVENT_STREAM_MIME_TYPE}, {JSON_MIME_TYPE}"),
            );
        if let Some(id) = &session_id {
            request = request.header(HEADER_SESSION_ID, id.as_ref());
        }
        if let Some(id) = last_event_id {
            request = request.header(HEADER_LAST_EVENT_ID, id);
        }
        let response = self.send(request).await?;
        if response.status == 405 {
            return Err(StreamableHttpError::ServerDoesNotSupportSse);
        }
        if let Some(e) = auth_failure(&response) {
            return Err(e);
        }
        if let Some(e) = status_failure(&response) {
            return Err(e.into());
        }
        if !(200..300).contains(&response.status) {
            return Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(
                format!("get_stream returned {}", response.status),
            )));
        }
        let content_type = header(&response, "content-type").map(str::to_owned);
        if !is_mime(content_type.as_deref(), EVENT_STREAM_MIME_TYPE)
            && !is_mime(content_type.as_deref(), JSON_MIME_TYPE)
        {
            return Err(StreamableHttpError::UnexpectedContentType(content_type));
        }
        Ok(sse(response.body, max_sse_event_size))
    }
}
