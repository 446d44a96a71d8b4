//! `http/request` from the executor's side of the network.
//!
//! ```
//! # // The examples run against the workspace's own agent (build it first:
//! # // `cargo build --workspace --bins`).
//! # std::env::set_var("EXECUTOR_BIN", concat!(env!("CARGO_MANIFEST_DIR"), "/../target/debug/executor"));
//! # // A one-shot HTTP server on loopback stands in for the internal service.
//! # let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
//! # let url = format!("http://{}/simple/", listener.local_addr().unwrap());
//! # std::thread::spawn(move || {
//! #     use std::io::{Read, Write};
//! #     let (mut s, _) = listener.accept().unwrap();
//! #     let mut buf = [0u8; 4096];
//! #     let _ = s.read(&mut buf).unwrap();
//! #     s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\nhello index").unwrap();
//! # });
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use executor_client::http::HttpRequest;
//! use executor_client::{Client, Target};
//!
//! let client = Client::connect_target(&Target::local(), Default::default()).await?;
//! let mut response = client
//!     .http_request(HttpRequest::get(url).stream(true))
//!     .await?;
//! assert_eq!(response.status, 200);
//! let mut body = Vec::new();
//! while let Some(chunk) = response.body.next_chunk().await {
//!     body.extend_from_slice(&chunk?);
//! }
//! assert_eq!(body, b"hello index");
//! client.close().await?;
//! # Ok::<(), executor_client::Error>(()) }).unwrap();
//! ```

use crate::{Client, Error, Subscription};
use bytes::Bytes;
use executor_protocol::methods;
use executor_protocol::types::http::{
    BodyDelta, EnvHeader, HttpCancelParams, HttpRequestParams, HttpResponse as WireResponse,
    HttpStreamHead,
};
use executor_protocol::types::sandbox::SandboxIntent;
use futures_util::Stream;
use serde_bytes::ByteBuf;

/// A request, built with [`HttpRequest::new`] / [`HttpRequest::get`] and
/// the setters below.
#[derive(Debug, Clone)]
pub struct HttpRequest {
    params: HttpRequestParams,
}

impl HttpRequest {
    /// `method url`, no headers, no body, the protocol's defaults.
    pub fn new(method: impl Into<String>, url: impl Into<String>) -> Self {
        HttpRequest {
            params: HttpRequestParams {
                method: method.into(),
                url: url.into(),
                headers: Vec::new(),
                body: None,
                timeout_ms: 30_000,
                stream: false,
                max_response_bytes: None,
                follow_redirects: 0,
                sandbox: None,
                env_headers: Vec::new(),
            },
        }
    }

    /// `GET url`.
    pub fn get(url: impl Into<String>) -> Self {
        HttpRequest::new("GET", url)
    }

    /// Add a header (repeated names are kept, in order).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.params.headers.push((name.into(), value.into()));
        self
    }

    /// A header whose value the agent reads from its own environment
    /// variable `env`, after `prefix` (`"Bearer "`): the secret never
    /// leaves the host. The agent's `http.header_env` says which
    /// variables may be named.
    pub fn header_from_env(
        mut self,
        name: impl Into<String>,
        env: impl Into<String>,
        prefix: impl Into<String>,
    ) -> Self {
        self.params.env_headers.push(EnvHeader {
            name: name.into(),
            env: env.into(),
            prefix: prefix.into(),
        });
        self
    }

    /// The request body.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.params.body = Some(ByteBuf::from(body.into()));
        self
    }

    /// Deadline for the whole exchange (buffered), or for the head and each
    /// idle gap (streamed).
    pub fn timeout_ms(mut self, ms: u64) -> Self {
        self.params.timeout_ms = ms;
        self
    }

    /// Stream the body as it arrives instead of buffering it in the agent.
    pub fn stream(mut self, stream: bool) -> Self {
        self.params.stream = stream;
        self
    }

    /// Refuse bodies larger than this (`limit_exceeded`).
    pub fn max_response_bytes(mut self, max: u64) -> Self {
        self.params.max_response_bytes = Some(max);
        self
    }

    /// Follow up to `hops` redirects (never from https to http).
    pub fn follow_redirects(mut self, hops: u32) -> Self {
        self.params.follow_redirects = hops;
        self
    }

    /// Limit where the request may go (`network` of the intent).
    pub fn sandbox(mut self, intent: SandboxIntent) -> Self {
        self.params.sandbox = Some(intent);
        self
    }

    /// The wire params.
    pub fn params(&self) -> &HttpRequestParams {
        &self.params
    }
}

impl From<HttpRequestParams> for HttpRequest {
    fn from(params: HttpRequestParams) -> Self {
        HttpRequest { params }
    }
}

/// A response: head now, body as it comes.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    /// In order, repeated names kept.
    pub headers: Vec<(String, String)>,
    /// The final URL, after redirects.
    pub url: String,
    pub body: HttpBody,
}

impl HttpResponse {
    /// Values of the header `name` (case-insensitive), in order.
    pub fn header_values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.headers
            .iter()
            .filter(move |(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A response body: one buffered chunk, or the deltas of a stream.
#[derive(Debug)]
pub struct HttpBody {
    inner: BodyInner,
}

#[derive(Debug)]
enum BodyInner {
    Buffered(Option<Bytes>),
    Streamed {
        client: Client,
        stream_id: u64,
        sub: Subscription,
        next_seq: u64,
        done: bool,
        /// `http/cancel` was sent (by [`HttpBody::cancel`]).
        cancel_sent: bool,
    },
}

impl HttpBody {
    /// The stream id, for a streamed body.
    pub fn stream_id(&self) -> Option<u64> {
        match &self.inner {
            BodyInner::Streamed { stream_id, .. } => Some(*stream_id),
            BodyInner::Buffered(_) => None,
        }
    }

    /// The next piece of the body; `None` at its end. An error that ended
    /// the stream (`timeout`, `cancelled`, `limit_exceeded`, `http_error`)
    /// comes once, as `Error::Remote`.
    pub async fn next_chunk(&mut self) -> Option<Result<Bytes, Error>> {
        match &mut self.inner {
            BodyInner::Buffered(b) => b.take().map(Ok),
            BodyInner::Streamed {
                sub,
                next_seq,
                done,
                stream_id,
                ..
            } => loop {
                if *done {
                    return None;
                }
                let Some(note) = sub.recv().await else {
                    *done = true;
                    return Some(Err(Error::Closed(format!(
                        "the connection closed during stream {stream_id}"
                    ))));
                };
                let delta: BodyDelta = match note.decode() {
                    Ok(d) => d,
                    Err(e) => {
                        *done = true;
                        return Some(Err(e));
                    }
                };
                if delta.seq != *next_seq {
                    *done = true;
                    return Some(Err(Error::Protocol(format!(
                        "stream {stream_id}: delta seq {} where {} was expected",
                        delta.seq, next_seq
                    ))));
                }
                *next_seq += 1;
                if delta.done {
                    *done = true;
                    if let Some(e) = delta.error {
                        return Some(Err(Error::Remote(e)));
                    }
                }
                if !delta.data.is_empty() {
                    return Some(Ok(Bytes::from(delta.data.into_vec())));
                }
            },
        }
    }

    /// The whole body (for a stream: until its end).
    pub async fn bytes(mut self) -> Result<Vec<u8>, Error> {
        let mut out = Vec::new();
        while let Some(chunk) = self.next_chunk().await {
            out.extend_from_slice(&chunk?);
        }
        Ok(out)
    }

    /// Close a stream early (`http/cancel`); the body then ends with a
    /// `cancelled` error. A buffered body just ends. Dropping a stream
    /// before its end cancels it too (without waiting for the answer).
    pub async fn cancel(&mut self) -> Result<(), Error> {
        match &mut self.inner {
            BodyInner::Buffered(b) => {
                b.take();
                Ok(())
            }
            BodyInner::Streamed {
                client,
                stream_id,
                done,
                cancel_sent,
                ..
            } => {
                if *done {
                    return Ok(());
                }
                *cancel_sent = true;
                let params = HttpCancelParams {
                    stream_id: *stream_id,
                };
                client
                    .request::<_, executor_protocol::types::Empty>(methods::HTTP_CANCEL, &params)
                    .await
                    .map(|_| ())
            }
        }
    }

    /// The body as a `Stream` of chunks.
    pub fn into_stream(self) -> impl Stream<Item = Result<Bytes, Error>> + Send {
        futures_util::stream::unfold(self, |mut body| async move {
            body.next_chunk().await.map(|c| (c, body))
        })
    }
}

impl Drop for HttpBody {
    /// A stream let go of before its end is cancelled (`http/cancel`, from
    /// a task: the agent then closes the upstream connection and frees the
    /// stream's slot), when a runtime is there to send it.
    fn drop(&mut self) {
        let BodyInner::Streamed {
            client,
            stream_id,
            done: false,
            cancel_sent: false,
            ..
        } = &self.inner
        else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (client, params) = (
            client.clone(),
            HttpCancelParams {
                stream_id: *stream_id,
            },
        );
        rt.spawn(async move {
            // `unknown_stream` when it ended meanwhile: nothing to do.
            let r = client
                .request::<_, executor_protocol::types::Empty>(methods::HTTP_CANCEL, &params)
                .await;
            tracing::debug!(stream_id = params.stream_id, result = ?r.err(), "dropped stream cancelled");
        });
    }
}

impl Client {
    /// `http/request`: buffered, or streamed when the request says so.
    pub async fn http_request(&self, request: HttpRequest) -> Result<HttpResponse, Error> {
        let params = request.params;
        if !params.stream {
            let r: WireResponse = self.request(methods::HTTP_REQUEST, &params).await?;
            return Ok(HttpResponse {
                status: r.status,
                headers: r.headers,
                url: r.url,
                body: HttpBody {
                    inner: BodyInner::Buffered(Some(Bytes::from(r.body.into_vec()))),
                },
            });
        }
        // Subscribe before asking: deltas may follow the head at once.
        let sub = self.subscribe(&[methods::HTTP_BODY_DELTA]);
        let head: HttpStreamHead = self.request(methods::HTTP_REQUEST, &params).await?;
        let sub = self.narrow_to_stream(sub, head.stream_id);
        Ok(HttpResponse {
            status: head.status,
            headers: head.headers,
            url: head.url,
            body: HttpBody {
                inner: BodyInner::Streamed {
                    client: self.clone(),
                    stream_id: head.stream_id,
                    sub,
                    next_seq: 0,
                    done: false,
                    cancel_sent: false,
                },
            },
        })
    }
}
