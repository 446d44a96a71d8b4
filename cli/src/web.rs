//! `http`: a request from the agent's host, curl's flags where they mean
//! the same thing. Exit statuses as curl's: 0 for a status below 400, 22
//! for one of 400 or more (`HTTP NNN` on stderr), 7 when the server could
//! not be reached, 28 on a timeout.

use super::exit;
use super::files::Remote;
use super::sandbox::SandboxArgs;
use anyhow::Context;
use executor_client::http::HttpRequest;
use executor_client::{Client, Error, ErrorCode};
use std::io::Write;

/// curl's status for a timeout.
const TIMEOUT: i32 = 28;

#[derive(Debug, clap::Args)]
pub struct HttpArgs {
    /// The method (default GET, or POST with --data).
    #[arg(short = 'X', long = "request")]
    pub method: Option<String>,
    /// A header, `Name: value` (repeatable; order kept).
    #[arg(short = 'H', long = "header", value_name = "NAME: VALUE")]
    pub headers: Vec<String>,
    /// The body: a literal string, or `@FILE` for a local file's bytes
    /// (`@-`: stdin). Makes the request a POST unless -X says otherwise.
    #[arg(short = 'd', long = "data")]
    pub data: Option<String>,
    /// Print the status line and headers to stderr.
    #[arg(short = 'i', long)]
    pub include: bool,
    /// Follow up to N redirects.
    #[arg(short = 'L', long, value_name = "N", default_value_t = 0)]
    pub follow: u32,
    /// Deadline for the head and each idle gap of the body, in ms.
    #[arg(long, default_value_t = 30_000)]
    pub timeout_ms: u64,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    pub url: String,
}

fn body(data: &str) -> anyhow::Result<Vec<u8>> {
    Ok(match data.strip_prefix('@') {
        Some("-") => {
            let mut b = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut b).context("reading stdin")?;
            b
        }
        Some(file) => std::fs::read(file).with_context(|| format!("reading {file}"))?,
        None => data.as_bytes().to_vec(),
    })
}

/// `http`
pub async fn http(client: &Client, args: HttpArgs) -> anyhow::Result<i32> {
    let method = args
        .method
        .clone()
        .unwrap_or_else(|| if args.data.is_some() { "POST" } else { "GET" }.into());
    let mut request = HttpRequest::new(method, args.url.as_str())
        .stream(true)
        .follow_redirects(args.follow)
        .timeout_ms(args.timeout_ms);
    for h in &args.headers {
        let (name, value) = h
            .split_once(':')
            .with_context(|| format!("header {h:?} is not `Name: value`"))?;
        request = request.header(name.trim(), value.trim_start());
    }
    if let Some(data) = &args.data {
        request = request.body(body(data)?);
    }
    if let Some(intent) = Remote::new(client).confined(&args.sandbox).await?.sandbox() {
        request = request.sandbox(intent.clone());
    }
    let mut response = match client.http_request(request).await {
        Ok(r) => r,
        Err(e) => return unreachable_server(e, &args.url),
    };
    if args.include {
        // A server chooses the URL it redirected to and its headers: on a
        // terminal their control characters are escaped.
        let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
        let shown = |s: String| {
            if terminal {
                super::exit::shown(&s.replace(['\n', '\r'], " ")).into_owned()
            } else {
                s
            }
        };
        let mut err = std::io::stderr().lock();
        writeln!(
            err,
            "{}",
            shown(format!("{} {}", response.status, response.url))
        )?;
        for (k, v) in &response.headers {
            writeln!(err, "{}", shown(format!("{k}: {v}")))?;
        }
        writeln!(err)?;
    }
    let mut out = std::io::stdout().lock();
    while let Some(chunk) = response.body.next_chunk().await {
        out.write_all(&chunk?)?;
        out.flush()?;
    }
    if response.status >= 400 {
        say!(
            "executor-client: HTTP {} from {}",
            response.status,
            response.url
        );
        return Ok(exit::HTTP_STATUS);
    }
    Ok(0)
}

/// 7 (could not reach the server) and 28 (timeout) with the message;
/// anything else is the error.
fn unreachable_server(e: Error, url: &str) -> anyhow::Result<i32> {
    let code = match e.code() {
        Some(ErrorCode::HttpError) => exit::HTTP_CONNECT,
        Some(ErrorCode::Timeout) => TIMEOUT,
        _ => return Err(e.into()),
    };
    say!("executor-client: {url}: {e}");
    Ok(code)
}
