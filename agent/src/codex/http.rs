//! Codex's `http/request` over the native one (docs/PROTOCOL.md §6), so
//! executor's destination policy (no metadata or link-local addresses, no
//! DNS rebinding, the profile's `http.allow` and `http.proxy`, its sandbox
//! network rule) applies unchanged.
//!
//! The Codex request is checked as the reference checks it (method, URL,
//! scheme, then each header: name, `valueEnvVar`, value) with the
//! reference's messages; a header's `valueEnvVar` is read from this
//! process's environment, the reference's protected names refused, and its
//! value never logged nor echoed. `timeoutMs` absent is the native maximum
//! (a day), `redirectPolicy` `follow` is ten hops, `stop` none.
//!
//! A streamed request (`streamResponse`) is refused while a stream of the
//! same `requestId` is open. Its answer (the head, an empty body) is always
//! written before its first `http/request/bodyDelta`: the head's answer
//! line is built on the native reader (a hook on the native answer), then
//! written by whichever comes first, the request's task or the stream's
//! first delta. Native deltas become Codex ones in order, their seqs from
//! 1, their data in pieces of at most 32 KiB; the reader waits for room in
//! the client's queue, so a slow client slows the native stream, which
//! stops reading from the server.
//!
//! Uses the dialect's wire, errors and native modules, the protocol crate,
//! `http` and `url`.

use super::wire::{self, Id, RpcError};
use super::{b64, decode, Conn};
use base64::Engine;
use executor_protocol::error::{ErrorCode, WireError};
use executor_protocol::methods as m;
use executor_protocol::types::http::{
    BodyDelta, EnvHeader, HttpRequestParams, HttpRequestResult, HttpResponse, HttpStreamHead,
};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

/// At most this many body bytes in one Codex delta (the reference's bound
/// is 1 MiB). Smaller, so that the client's queue, bounded in lines, holds
/// at most about 45 MiB of deltas when the client stops reading.
pub const MAX_DELTA_BYTES: usize = 32 << 10;
/// The hops `redirectPolicy: "follow"` allows.
pub const FOLLOW_REDIRECTS: u32 = 10;
/// The native maximum `timeout_ms`: what "no timeout" becomes.
pub const MAX_TIMEOUT_MS: u64 = 86_400_000;

/// Variables a header may never take its value from (the reference's
/// list, ASCII case-insensitive): the executor's own credentials. The
/// native agent refuses them too, with the configuration's
/// `http.header_env` rule.
pub use crate::config::PROTECTED_HEADER_ENV as PROTECTED_ENV;

/// The open streams of one connection, shared by the request tasks and
/// the native reader.
#[derive(Default)]
#[allow(missing_debug_implementations)] // holds answer lines
pub struct Streams {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// `requestId`s of streamed requests from their start to their last
    /// delta.
    active: HashSet<String>,
    /// Native stream id → its stream.
    by_native: HashMap<u64, Stream>,
}

struct Stream {
    request_id: String,
    /// The next Codex seq.
    seq: u64,
    /// The next native seq.
    native_seq: u64,
    /// The request's answer while it is not yet written.
    answer: Option<Vec<u8>>,
}

impl Streams {
    /// A native `http/request/bodyDelta`, as Codex lines (the request's
    /// answer first when it is not yet written).
    pub fn note(&self, params: rmpv::Value) -> Vec<Vec<u8>> {
        let Ok(d) = rmpv::ext::from_value::<BodyDelta>(params) else {
            tracing::warn!("undecodable native body delta");
            return vec![];
        };
        let mut g = self.inner.lock().expect("streams lock");
        let Some(s) = g.by_native.get_mut(&d.stream_id) else {
            tracing::debug!(stream_id = d.stream_id, "a body delta of no known stream");
            return vec![];
        };
        let mut lines: Vec<Vec<u8>> = s.answer.take().into_iter().collect();
        let (done, error) = if d.seq != s.native_seq {
            (
                true,
                Some(format!(
                    "body delta {} of the executor's stream {} came where {} was expected",
                    d.seq, d.stream_id, s.native_seq
                )),
            )
        } else {
            (d.done, d.error.map(|e| e.message))
        };
        s.native_seq += 1;
        if d.seq == s.native_seq - 1 {
            for piece in d.data.chunks(MAX_DELTA_BYTES) {
                lines.push(delta_line(&s.request_id, s.seq, piece, false, None));
                s.seq += 1;
            }
        }
        if done {
            lines.push(delta_line(&s.request_id, s.seq, &[], true, error));
            let request_id = s.request_id.clone();
            g.by_native.remove(&d.stream_id);
            g.active.remove(&request_id);
        }
        lines
    }
}

fn delta_line(
    request_id: &str,
    seq: u64,
    data: &[u8],
    done: bool,
    error: Option<String>,
) -> Vec<u8> {
    wire::notification(
        "http/request/bodyDelta",
        json!({
            "requestId": request_id,
            "seq": seq,
            "deltaBase64": b64(data),
            "done": done,
            "error": error,
        }),
    )
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RequestParams {
    method: String,
    url: String,
    #[serde(default)]
    headers: Vec<Header>,
    #[serde(default)]
    body_base64: Option<String>,
    #[serde(default)]
    timeout_ms: Option<u64>,
    #[serde(default)]
    redirect_policy: Option<RedirectPolicy>,
    request_id: String,
    #[serde(default)]
    stream_response: bool,
}

/// Never log `value`, nor what `value_env_var` names.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Header {
    name: String,
    value: String,
    #[serde(default)]
    value_env_var: Option<String>,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum RedirectPolicy {
    Follow,
    Stop,
}

/// A checked `http/request`, its stream's `requestId` claimed.
#[allow(missing_debug_implementations)] // holds header values
pub struct Prepared {
    native: HttpRequestParams,
    request_id: String,
}

/// Check an `http/request` and claim its stream's `requestId`; run in the
/// order the requests came (the request itself then runs beside the
/// others, [`run`]), so of two streams with one id the first is served.
pub fn prepare(conn: &Conn, params: Value) -> Result<Prepared, RpcError> {
    let p: RequestParams = decode(params)?;
    conn.ready("http")?;
    let native = native_params(&|v, u| conn.header_env.refusal(v, u), &p)?;
    if native.timeout_ms == 0 {
        // A zero budget is spent before the request leaves.
        return Err(RpcError::internal(
            "http/request failed: timed out (timeoutMs 0)",
        ));
    }
    if native.stream {
        let mut g = conn.http.inner.lock().expect("streams lock");
        if !g.active.insert(p.request_id.clone()) {
            return Err(RpcError::invalid_params(format!(
                "http/request streamResponse requestId `{}` is already active",
                p.request_id
            )));
        }
    }
    Ok(Prepared {
        native,
        request_id: p.request_id,
    })
}

/// Run a prepared `http/request` whose answer goes to `id`: `None` when
/// the answer was already queued (a stream's head, written before its
/// deltas).
pub async fn run(conn: &Conn, id: &Id, p: Prepared) -> Option<Result<Value, RpcError>> {
    let native = p.native;
    if !native.stream {
        let r: Result<HttpResponse, WireError> = conn.native.call(m::HTTP_REQUEST, &native).await;
        return Some(match r {
            Ok(r) => Ok(json!({
                "status": r.status,
                "headers": headers_json(&r.headers),
                "bodyBase64": b64(&r.body),
            })),
            Err(e) => Err(failed(&e)),
        });
    }
    // The stream is known, its answer ready, before the reader looks at
    // its first delta.
    let (streams, answer_id, request_id) = (conn.http.clone(), id.clone(), p.request_id.clone());
    let hook: super::native::Hook = Box::new(move |v| {
        if let Ok(HttpRequestResult::Stream(h)) = rmpv::ext::from_value(v.clone()) {
            streams
                .inner
                .lock()
                .expect("streams lock")
                .by_native
                .insert(
                    h.stream_id,
                    Stream {
                        request_id,
                        seq: 1,
                        native_seq: 0,
                        answer: Some(wire::response(&answer_id, Ok(head_json(&h)))),
                    },
                );
        }
    });
    let r = conn
        .native
        .call_value(m::HTTP_REQUEST, &native, Some(hook))
        .await;
    let head = match r.map(rmpv::ext::from_value::<HttpRequestResult>) {
        Ok(Ok(HttpRequestResult::Stream(h))) => h,
        failure => {
            // No stream: the id is free again.
            conn.http
                .inner
                .lock()
                .expect("streams lock")
                .active
                .remove(&p.request_id);
            return Some(Err(match failure {
                Err(e) => failed(&e),
                Ok(_) => RpcError::internal(
                    "internal error (a bug): the agent answered a streamed http/request without a stream",
                ),
            }));
        }
    };
    // Write the answer unless the stream's first delta already did.
    let Ok(permit) = conn.out.reserve(64 << 10).await else {
        return None;
    };
    let mut g = conn.http.inner.lock().expect("streams lock");
    if let Some(line) = g
        .by_native
        .get_mut(&head.stream_id)
        .and_then(|s| s.answer.take())
    {
        permit.send(line);
    }
    None
}

/// The native request for `p`, checked as the reference checks it.
fn native_params(
    refusal: &dyn Fn(&str, &url::Url) -> Option<String>,
    p: &RequestParams,
) -> Result<HttpRequestParams, RpcError> {
    http::Method::from_bytes(p.method.as_bytes())
        .map_err(|e| RpcError::invalid_params(format!("http/request method is invalid: {e}")))?;
    let url = url::Url::parse(&p.url)
        .map_err(|e| RpcError::invalid_params(format!("http/request url is invalid: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(RpcError::invalid_params(format!(
            "http/request only supports http and https URLs, got {}",
            url.scheme()
        )));
    }
    let mut headers = Vec::with_capacity(p.headers.len());
    let mut env_headers = Vec::new();
    for h in &p.headers {
        match header_value(h, &|v| refusal(v, &url))? {
            Some(value) => headers.push((h.name.clone(), value)),
            // Read again by the native agent, under the configuration's
            // `http.header_env` and into its audit line (the name only).
            None => env_headers.push(EnvHeader {
                name: h.name.clone(),
                env: h.value_env_var.clone().unwrap_or_default(),
                prefix: h.value.clone(),
            }),
        }
    }
    let body = match &p.body_base64 {
        Some(b) => Some(serde_bytes::ByteBuf::from(
            base64::engine::general_purpose::STANDARD
                .decode(b.as_bytes())
                .map_err(|e| RpcError::invalid_params(e.to_string()))?,
        )),
        None => None,
    };
    Ok(HttpRequestParams {
        method: p.method.clone(),
        url: p.url.clone(),
        headers,
        body,
        timeout_ms: p
            .timeout_ms
            .map_or(MAX_TIMEOUT_MS, |t| t.min(MAX_TIMEOUT_MS)),
        stream: p.stream_response,
        max_response_bytes: None,
        follow_redirects: match p.redirect_policy.unwrap_or(RedirectPolicy::Follow) {
            RedirectPolicy::Follow => FOLLOW_REDIRECTS,
            RedirectPolicy::Stop => 0,
        },
        sandbox: None,
        env_headers,
    })
}

/// A header's value (`None` for one with `valueEnvVar`, checked as the
/// reference checks it: `value` followed by that variable of this
/// process's environment, which the native agent reads itself).
fn header_value(
    h: &Header,
    refusal: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<String>, RpcError> {
    let name = &h.name;
    http::HeaderName::from_bytes(name.as_bytes()).map_err(|e| {
        RpcError::invalid_params(format!("http/request header name is invalid: {e}"))
    })?;
    let value = match &h.value_env_var {
        None => h.value.clone(),
        Some(var) => {
            if PROTECTED_ENV.iter().any(|p| p.eq_ignore_ascii_case(var)) {
                return Err(RpcError::invalid_params(format!(
                    "http/request header {name} cannot use executor environment variable {var}"
                )));
            }
            // The configuration's rule before anything is read: whether a
            // variable the key may not read is set is not told either.
            if let Some(why) = refusal(var) {
                return Err(RpcError::invalid_request(format!(
                    "http/request header {name} from variable {var}: {why}"
                )));
            }
            // The native agent names a mismatched Host header's value in
            // its refusal: a variable's value never gets there.
            if name.eq_ignore_ascii_case("host") {
                return Err(RpcError::invalid_params(format!(
                    "http/request header {name} cannot take its value from an executor environment variable"
                )));
            }
            let found = if var.is_empty() || var.contains(['=', '\0']) {
                None
            } else {
                std::env::var(var).ok()
            };
            let Some(found) = found else {
                return Err(RpcError::invalid_params(format!(
                    "http/request header {name} requires executor environment variable {var}"
                )));
            };
            if found.is_empty() {
                return Err(RpcError::invalid_params(format!(
                    "http/request header {name} requires a non-empty executor environment variable {var}"
                )));
            }
            format!("{}{found}", h.value)
        }
    };
    http::HeaderValue::from_str(&value).map_err(|e| {
        RpcError::invalid_params(format!(
            "http/request header value is invalid for {name}: {e}"
        ))
    })?;
    Ok(h.value_env_var.is_none().then_some(value))
}

fn headers_json(headers: &[(String, String)]) -> Value {
    Value::Array(
        headers
            .iter()
            .map(|(n, v)| json!({"name": n, "value": v}))
            .collect(),
    )
}

fn head_json(h: &HttpStreamHead) -> Value {
    json!({
        "status": h.status,
        "headers": headers_json(&h.headers),
        "bodyBase64": "",
    })
}

/// A native refusal or failure in the dialect: the transport's failures
/// (`http_error`, `timeout`, `limit_exceeded`) as the reference reports
/// them (`-32603`, "http/request failed: ..."), refusals by their code.
fn failed(e: &WireError) -> RpcError {
    match e.code {
        ErrorCode::HttpError | ErrorCode::Timeout | ErrorCode::LimitExceeded => {
            RpcError::internal(format!("http/request failed: {}", e.message))
        }
        _ => super::errors::from_wire(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(v: Value) -> RequestParams {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn checks_in_the_references_order_and_words() {
        let p = |method: &str, url: &str| {
            native_params(
                &|_, _| None,
                &params(json!({
                    "method": method, "url": url, "requestId": "r"
                })),
            )
        };
        assert_eq!(
            p("GET BAD", "ftp://x/").unwrap_err().message,
            "http/request method is invalid: invalid HTTP method"
        );
        assert_eq!(
            p("GET", "not a url").unwrap_err().message,
            "http/request url is invalid: relative URL without a base"
        );
        assert_eq!(
            p("GET", "ftp://x/").unwrap_err().message,
            "http/request only supports http and https URLs, got ftp"
        );
        let n = p("GET", "http://h/").unwrap();
        assert_eq!(n.timeout_ms, MAX_TIMEOUT_MS);
        assert_eq!(n.follow_redirects, FOLLOW_REDIRECTS);
        let stop = native_params(
            &|_, _| None,
            &params(json!({
                "method": "GET", "url": "http://h/", "requestId": "r",
                "redirectPolicy": "stop", "timeoutMs": 250
            })),
        )
        .unwrap();
        assert_eq!((stop.follow_redirects, stop.timeout_ms), (0, 250));
    }

    #[test]
    fn env_headers() {
        std::env::set_var("CODEX_HTTP_UNIT_TOKEN", "tok");
        std::env::set_var("CODEX_HTTP_UNIT_EMPTY", "");
        let h = |name: &str, value: &str, var: &str| {
            header_value(
                &Header {
                    name: name.into(),
                    value: value.into(),
                    value_env_var: Some(var.into()),
                },
                &|_| None,
            )
        };
        // Checked here, read by the native agent.
        assert_eq!(
            h("Authorization", "Bearer ", "CODEX_HTTP_UNIT_TOKEN").unwrap(),
            None
        );
        for protected in ["OPENAI_API_KEY", "codex_exec_server_noise_auth_token"] {
            assert_eq!(
                h("X", "", protected).unwrap_err().message,
                format!(
                    "http/request header X cannot use executor environment variable {protected}"
                )
            );
        }
        assert_eq!(
            h("X", "", "CODEX_HTTP_UNIT_MISSING").unwrap_err().message,
            "http/request header X requires executor environment variable CODEX_HTTP_UNIT_MISSING"
        );
        assert!(h("X", "", "A=B").is_err());
        assert!(h("X", "", "").is_err());
        assert_eq!(
            h("X", "", "CODEX_HTTP_UNIT_EMPTY").unwrap_err().message,
            "http/request header X requires a non-empty executor environment variable CODEX_HTTP_UNIT_EMPTY"
        );
        let host = h("host", "", "CODEX_HTTP_UNIT_TOKEN").unwrap_err();
        assert!(!host.message.contains("tok"), "{}", host.message);
    }

    #[test]
    fn deltas_are_split_and_sequenced() {
        let s = Streams::default();
        s.inner.lock().unwrap().by_native.insert(
            3,
            Stream {
                request_id: "r".into(),
                seq: 1,
                native_seq: 0,
                answer: Some(b"answer\n".to_vec()),
            },
        );
        s.inner.lock().unwrap().active.insert("r".into());
        // As the native agent sends it: a map.
        let delta = |stream_id: u64, seq: u64, data: Vec<u8>, done: bool| {
            rmpv::Value::Map(vec![
                ("stream_id".into(), stream_id.into()),
                ("seq".into(), seq.into()),
                ("done".into(), done.into()),
                ("data".into(), rmpv::Value::Binary(data)),
            ])
        };
        let lines = s.note(delta(3, 0, vec![7; MAX_DELTA_BYTES + 1], false));
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], b"answer\n");
        let second: Value = serde_json::from_slice(&lines[2]).unwrap();
        assert_eq!(second["params"]["seq"], 2);
        assert_eq!(second["params"]["deltaBase64"], b64(&[7]));
        let last = s.note(delta(3, 1, vec![], true));
        let last: Value = serde_json::from_slice(&last[0]).unwrap();
        assert_eq!(last["params"]["seq"], 3);
        assert_eq!(last["params"]["done"], true);
        assert!(s.inner.lock().unwrap().active.is_empty());
        // A gap ends the stream with an error rather than skip bytes.
        s.inner.lock().unwrap().by_native.insert(
            4,
            Stream {
                request_id: "q".into(),
                seq: 1,
                native_seq: 0,
                answer: None,
            },
        );
        let end: Value = serde_json::from_slice(&s.note(delta(4, 2, vec![1], false))[0]).unwrap();
        assert_eq!(end["params"]["done"], true);
        assert!(end["params"]["error"]
            .as_str()
            .unwrap()
            .contains("expected"));
    }
}
