//! HTTP from the executor host (PROTOCOL.md §6).

use super::sandbox::SandboxIntent;
use crate::error::WireError;
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

fn d_timeout() -> u64 {
    30_000
}

/// Never log `headers` values or `body`: they may carry credentials.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
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

/// `http/request/bodyDelta` notification.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BodyDelta {
    pub stream_id: u64,
    pub seq: u64,
    pub data: ByteBuf,
    pub done: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<WireError>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpCancelParams {
    pub stream_id: u64,
}
