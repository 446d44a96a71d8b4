//! HTTP from the executor host (docs/PROTOCOL.md §6).
//!
//! Where PROTOCOL.md is silent, this agent:
//! - refuses `CONNECT`, URLs with credentials (`user:pass@`; send an
//!   `Authorization` header), `timeout_ms` of 0 or above a day, and more
//!   than 20 redirects (`invalid_params`);
//! - follows 301, 302, 303, 307 and 308; 303 (and 301/302 after a `POST`)
//!   becomes a `GET` without body, as browsers do. With `follow_redirects`
//!   exhausted the redirect response itself is the answer;
//! - treats a redirect to a non-HTTP scheme or from https to http as
//!   `policy_denied`;
//! - drops `Authorization`, `Cookie`, `Proxy-Authorization` and `Host` on a
//!   cross-origin hop (scheme, host or port differ);
//! - reports response header values that are not UTF-8 lossily;
//! - in streamed mode, applies `max_response_bytes` (when given) to the
//!   whole stream: past it the stream ends with a final delta whose error
//!   is `limit_exceeded`;
//! - with a configured proxy (`http.proxy`), tunnels every request with
//!   `CONNECT`; the destination's name (or address literal) is checked, its
//!   resolved addresses are the proxy's to judge;
//! - lets a configuration's CIDR entry (`http.allow = ["169.254.169.254/32"]`)
//!   admit an address refused by default; a host-name entry never does;
//! - judges an IPv6 address that carries an IPv4 address as that IPv4
//!   address, by every rule (refusals and `http.allow`): IPv4-mapped
//!   `::ffff:0:0/96`, IPv4-translated `::ffff:0:0:0/96`, IPv4-compatible
//!   `::/96` (not `::` or `::1`), NAT64 `64:ff9b::/96` and `64:ff9b:1::/48`
//!   (the IPv4 address in the last 32 bits), 6to4 `2002::/16`, and Teredo
//!   `2001::/32` (server and client, both judged), whether the URL writes
//!   the address or a name resolves to it. The refusal's `data` adds
//!   `embedded_ipv4` and `embedding` (`nat64`, `6to4`, `teredo-client`, ...);
//! - refuses a `Host` header that does not name the URL's authority (host
//!   ASCII case aside; the port may be left out only when it is the
//!   scheme's default), and a second `Host` header, as `invalid_params`,
//!   with or without `http.allow`: a server routing by `Host` would answer
//!   for a host the policy never judged. Pseudo-headers (`:authority`) are
//!   not valid header names; HTTP/2's `:authority` is the URL's;
//! - opens a fresh connection per request and per redirect hop (no pool):
//!   a connection admitted for one host is never reused for another.

use super::sandbox::SandboxIntent;
use crate::error::WireError;
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

fn d_timeout() -> u64 {
    30_000
}

/// Never log `headers` values or `body`: they may carry credentials.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpRequestParams {
    pub method: String,
    pub url: String,
    #[serde(default)]
    pub headers: Vec<(String, String)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<ByteBuf>,
    #[serde(default = "d_timeout")]
    pub timeout_ms: u64,
    #[serde(default)]
    pub stream: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_response_bytes: Option<u64>,
    #[serde(default)]
    pub follow_redirects: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxIntent>,
    /// Headers whose values the agent reads from its own environment
    /// (a bearer token that never leaves the host), added after `headers`
    /// in order. Which variables a key may name is the configuration's
    /// `http.header_env` (docs/PROTOCOL.md §6).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_headers: Vec<EnvHeader>,
}

/// A header whose value is `prefix` followed by the agent's environment
/// variable `env` (`{name: "Authorization", env: "TOKEN", prefix: "Bearer "}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvHeader {
    pub name: String,
    pub env: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub prefix: String,
}

impl std::fmt::Debug for HttpRequestParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpRequestParams")
            .field("method", &self.method)
            .field("url", &self.url)
            .field(
                "header_names",
                &self.headers.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .field("body_len", &self.body.as_ref().map(|b| b.len()))
            .field("timeout_ms", &self.timeout_ms)
            .field("stream", &self.stream)
            .field(
                "env_headers",
                &self
                    .env_headers
                    .iter()
                    .map(|h| (&h.name, &h.env))
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: ByteBuf,
    pub url: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpStreamHead {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub url: String,
    pub stream_id: u64,
}

/// What `http/request` answers: a stream's head when the request asked
/// for `stream`, the whole response otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum HttpRequestResult {
    Stream(HttpStreamHead),
    Buffered(HttpResponse),
}

/// `http/request/bodyDelta` notification. `data` is encoded last, so that
/// the agent can send the bytes after a prepared head without copying them
/// (`message::encode_body_delta_head`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BodyDelta {
    pub stream_id: u64,
    pub seq: u64,
    pub done: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<WireError>,
    pub data: ByteBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpCancelParams {
    pub stream_id: u64,
}
