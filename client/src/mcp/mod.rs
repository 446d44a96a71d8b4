//! rmcp transports over the executor (feature `mcp`): an rmcp client
//! talks to an MCP server on the agent's host, one line different from
//! rmcp's own child-process and Streamable-HTTP transports.
//!
//! - [`JobTransport`]: the server runs on the host as a job
//!   (`process/start` with pipes, optionally under a sandbox intent). The
//!   messages received are its stdout's newline-delimited JSON-RPC lines,
//!   whole (a line past [`JobCommand::max_line`] ends the transport with
//!   [`JobTransportError::LineTooLong`]); what is sent goes to its stdin in
//!   order; its stderr goes to this process's stderr (or to the caller,
//!   [`JobCommand::capture_stderr`]). Closing or dropping the transport
//!   ends the job: stdin closed, then `terminate`, then `kill`, a grace
//!   apart ([`JobExit`] tells how it ended).
//! - [`HostHttp`]: rmcp's `StreamableHttpClient` over `http/request`, so
//!   the requests leave from the host: responses streamed (SSE parsed as it
//!   arrives, a dropped stream cancelled on the agent), the session id
//!   kept by rmcp, `DELETE` on close, headers whose values the agent reads
//!   from its own environment ([`HostHttp::header_from_env`]).
//!
//! ```no_run
//! # async fn demo(client: executor_client::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use executor_client::mcp::{HostHttp, JobCommand, JobTransport};
//! use rmcp::ServiceExt;
//!
//! // rmcp: ().serve(TokioChildProcess::new(Command::new("python3").arg("server.py"))?).await?
//! let stdio = ().serve(JobTransport::start(&client, JobCommand::new("python3").arg("server.py")).await?).await?;
//! println!("{:?}", stdio.list_all_tools().await?);
//! stdio.cancel().await?; // the job ends
//!
//! // rmcp: ().serve(StreamableHttpClientTransport::from_uri("http://127.0.0.1:8000/mcp")).await?
//! let http = ().serve(HostHttp::new(client.clone()).transport("http://127.0.0.1:8000/mcp")).await?;
//! println!("{:?}", http.list_all_tools().await?);
//! http.cancel().await?; // the session is deleted
//! # Ok(()) }
//! ```
//!
//! Depends on `rmcp` (its client and Streamable-HTTP client, no HTTP
//! library of its own), `sse-stream` (SSE parsing of streamed bodies) and
//! the library's [`Process`](crate::Process) and [`http`](crate::http).

mod http;
mod job;

pub use http::{HostHttp, DEFAULT_TIMEOUT};
pub use job::{
    JobCommand, JobExit, JobTransport, JobTransportError, DEFAULT_GRACE, DEFAULT_MAX_LINE,
};
/// The rmcp this module implements against.
pub use rmcp;
