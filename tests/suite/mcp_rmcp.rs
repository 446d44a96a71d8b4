//! The client library's rmcp transports (issue 31, feature `mcp`): rmcp's
//! own client through [`JobTransport`] to the Python MCP SDK's stdio
//! server run on the host as a job (`mcp_stdio/server.py`), and through
//! [`HostHttp`] to the SDK's Streamable HTTP server on the host's loopback
//! (`mcp_http/server.py`, behind a bearer token the agent's environment
//! holds); the job transport over a real sshd; plus the line bound and the
//! shutdown ladder with shell servers.

use crate::mcp_http::{agent_launcher, established_to, fresh_secret, Server};
use executor_client::mcp::rmcp::model::{
    CallToolRequestParams, CallToolResult, ProgressNotificationParam, ProgressToken,
    RequestMetaObject,
};
use executor_client::mcp::rmcp::service::{NotificationContext, RunningService, ServiceError};
use executor_client::mcp::rmcp::{ClientHandler, RoleClient, ServiceExt};
use executor_client::mcp::{HostHttp, JobCommand, JobTransport, JobTransportError};
use executor_client::{Client, ClientOptions};
use executor_tests::cli::wait_for;
use executor_tests::*;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::time::timeout;

/// Bound on one exchange with an SDK server (its Python start-up included).
const SCENARIO: Duration = Duration::from_secs(60);

/// An rmcp client handler passing on the progress notifications it gets.
#[derive(Clone)]
struct Progress(mpsc::UnboundedSender<ProgressNotificationParam>);

impl ClientHandler for Progress {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.0.send(params);
    }
}

type Service = RunningService<RoleClient, Progress>;

/// rmcp's client on `transport`, progress notifications to the receiver.
async fn serve<T, E, A>(
    transport: T,
) -> (Service, mpsc::UnboundedReceiver<ProgressNotificationParam>)
where
    T: executor_client::mcp::rmcp::transport::IntoTransport<RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    let service = timeout(SCENARIO, Progress(tx).serve(transport))
        .await
        .expect("the MCP handshake within the bound")
        .expect("the MCP handshake");
    (service, rx)
}

/// A tool call's parameters: `name` with `args` (a JSON object).
fn call(name: &'static str, args: serde_json::Value) -> CallToolRequestParams {
    let serde_json::Value::Object(args) = args else {
        panic!("not an object: {args}");
    };
    CallToolRequestParams::new(name).with_arguments(args)
}

/// The same with a progress token.
fn call_with_progress(
    name: &'static str,
    args: serde_json::Value,
    token: &str,
) -> CallToolRequestParams {
    let mut p = call(name, args);
    p.meta = Some(RequestMetaObject::with_progress_token(ProgressToken(
        executor_client::mcp::rmcp::model::NumberOrString::String(token.into()),
    )));
    p
}

/// The text of a tool result's first content block.
fn text_of(r: &CallToolResult) -> String {
    r.content
        .first()
        .and_then(|c| c.as_text())
        .map(|t| t.text.clone())
        .unwrap_or_else(|| panic!("no text in {r:?}"))
}

/// The tools' names, sorted, comma-joined.
async fn tool_names(service: &Service) -> String {
    let mut names: Vec<String> = timeout(SCENARIO, service.list_all_tools())
        .await
        .expect("tools/list within the bound")
        .expect("tools/list")
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    names.sort();
    names.join(",")
}

/// `n` progress notifications as `progress/total`, sorted: rmcp hands
/// each notification to the handler in a task of its own, so their order
/// there is not the wire's.
async fn progress_of(
    rx: &mut mpsc::UnboundedReceiver<ProgressNotificationParam>,
    n: usize,
) -> Vec<String> {
    let mut got = Vec::new();
    for _ in 0..n {
        let p = timeout(WAIT, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("{} of {n} progress notifications: {got:?}", got.len()))
            .expect("the handler is there");
        got.push(format!("{}/{}", p.progress, p.total.unwrap_or(0.0)));
    }
    got.sort();
    got
}

/// Whether the agent of `client` still lists job `id` as running.
async fn job_running(client: &Client, id: &str) -> bool {
    client
        .call(&executor_protocol::types::process::ProcessListParams {})
        .await
        .expect("process/list")
        .processes
        .iter()
        .any(|p| p.process_id == id && p.running)
}

/// The SDK stdio server started through `client`, its stderr kept.
async fn stdio_server(client: &Client, python: &str) -> JobTransport {
    let dir = crate::mcp_stdio::scripts();
    let command = JobCommand::new(python)
        .arg(dir.join("server.py").to_string_lossy())
        .capture_stderr();
    JobTransport::start(client, command)
        .await
        .expect("start the SDK server as a job")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rmcp_client_lists_and_calls_tools_of_an_sdk_server_run_as_a_job() {
    let Some(python) = crate::mcp_stdio::python_with_sdk() else {
        return;
    };
    let client = local_client().await;
    let mut transport = stdio_server(&client, &python).await;
    let (id, pid) = (transport.process_id().to_string(), transport.pid());
    let mut stderr = transport.take_stderr().expect("the captured stderr");
    let mut exit = transport.exit();
    let (service, mut progress) = serve(transport).await;
    assert_eq!(
        tool_names(&service).await,
        "add,big,connect,crash,numbered,pid,progress,tick,ticks,write_file"
    );
    let r = service
        .call_tool(call("add", serde_json::json!({"a": 40, "b": 2})))
        .await
        .expect("add");
    assert_eq!(text_of(&r), "42");
    // 4 MiB of tool result: one line of JSON far larger than any chunk of
    // the job's output, whole and unchanged.
    let r = service
        .call_tool(call("big", serde_json::json!({"n": 4 << 20})))
        .await
        .expect("big");
    let big = text_of(&r);
    let want: String = (0..4 << 20)
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    assert_eq!(big.len(), want.len());
    assert!(big == want, "the 4 MiB result changed on the way");
    // The progress notifications arrive, and the result.
    let r = service
        .call_tool(call_with_progress(
            "progress",
            serde_json::json!({"steps": 5}),
            "p-stdio",
        ))
        .await
        .expect("progress");
    assert_eq!(text_of(&r), "done 5");
    assert_eq!(
        progress_of(&mut progress, 5).await,
        ["1/5", "2/5", "3/5", "4/5", "5/5"]
    );
    // The pid the server reports is the job's.
    let r = service
        .call_tool(call("pid", serde_json::json!({})))
        .await
        .expect("pid");
    assert_eq!(text_of(&r), pid.to_string());
    let first = timeout(WAIT, stderr.recv()).await.expect("stderr").unwrap();
    assert!(
        String::from_utf8_lossy(&first).contains("test-server: started"),
        "{first:?}"
    );
    // Closing ends the job (its stdin closed: the SDK server exits 0) and
    // leaves nothing on the host.
    assert!(job_running(&client, &id).await);
    timeout(SCENARIO, service.cancel())
        .await
        .expect("close within the bound")
        .expect("close");
    // Exit code 0, not a signal: the closed stdin ended it.
    let status = exit.get().expect("the end is known once closed").unwrap();
    assert_eq!(status.code, Some(0), "{status:?}");
    assert!(!alive(pid), "the server {pid} outlived its transport");
    assert!(!job_running(&client, &id).await);
    assert!(timeout(WAIT, exit.wait()).await.unwrap().is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_crashing_mid_call_gives_the_rmcp_client_an_error() {
    let Some(python) = crate::mcp_stdio::python_with_sdk() else {
        return;
    };
    let client = local_client().await;
    let transport = stdio_server(&client, &python).await;
    let mut exit = transport.exit();
    let (service, _progress) = serve(transport).await;
    let started = Instant::now();
    let r = timeout(
        WAIT,
        service.call_tool(call("crash", serde_json::json!({}))),
    )
    .await
    .expect("the crash is an answer, not a hang");
    assert!(
        matches!(r, Err(ServiceError::TransportClosed)),
        "{r:?} after {:?}",
        started.elapsed()
    );
    // `os._exit(3)`: its own status, learned without the ladder.
    let status = timeout(WAIT, exit.wait()).await.unwrap().unwrap();
    assert_eq!(status.code, Some(3), "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_rmcp_client_leaves_no_job_on_the_host() {
    let Some(python) = crate::mcp_stdio::python_with_sdk() else {
        return;
    };
    let client = local_client().await;
    let transport = stdio_server(&client, &python).await;
    let (id, pid) = (transport.process_id().to_string(), transport.pid());
    let (service, _progress) = serve(transport).await;
    assert!(tool_names(&service).await.contains("add"));
    assert!(alive(pid));
    drop(service);
    assert!(
        wait_dead(pid, WAIT).await,
        "the server {pid} outlived its dropped client"
    );
    assert!(!job_running(&client, &id).await);
}

#[tokio::test]
async fn a_server_deaf_to_eof_and_terminate_is_killed_after_the_grace() {
    let client = local_client().await;
    // No MCP server at all: the handshake never completes; the transport
    // dropped with it runs the ladder.
    let command = JobCommand::new("sh")
        .args(["-c", "trap '' TERM; while :; do sleep 0.1; done"])
        .grace(Duration::from_millis(500));
    let transport = JobTransport::start(&client, command).await.unwrap();
    let pid = transport.pid();
    let mut exit = transport.exit();
    let started = Instant::now();
    let handshake = timeout(Duration::from_secs(1), ().serve(transport)).await;
    assert!(handshake.is_err(), "a handshake with a shell loop");
    // Dropped with the timed-out handshake: EOF, TERM (ignored), KILL.
    let status = timeout(WAIT, exit.wait()).await.unwrap().unwrap();
    assert_eq!(status.signal.as_deref(), Some("SIGKILL"), "{status:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(1900),
        "{:?}",
        started.elapsed()
    );
    assert!(!alive(pid));
}

#[tokio::test]
async fn a_line_past_the_bound_ends_the_transport_with_an_error_naming_it() {
    let client = local_client().await;
    // 5,000 bytes of one line where 1,000 are allowed, then silence.
    let command = JobCommand::new("sh")
        .args(["-c", "head -c 5000 /dev/zero | tr '\\0' x; echo; sleep 60"])
        .max_line(1000)
        .grace(Duration::from_millis(500));
    let transport = JobTransport::start(&client, command).await.unwrap();
    let pid = transport.pid();
    let mut exit = transport.exit();
    let started = Instant::now();
    let handshake = timeout(WAIT, ().serve(transport))
        .await
        .expect("the handshake fails rather than waits");
    assert!(handshake.is_err());
    let e = timeout(WAIT, exit.wait()).await.unwrap().unwrap_err();
    assert!(
        matches!(e, JobTransportError::LineTooLong { max: 1000, .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("longer than 1000 bytes"), "{e}");
    assert!(started.elapsed() < WAIT);
    assert!(
        wait_dead(pid, WAIT).await,
        "the server outlived its transport"
    );
}

#[tokio::test]
async fn messages_are_whole_lines_however_the_output_is_cut() {
    let client = local_client().await;
    // A JSON-RPC answer to `initialize` written in pieces a while apart
    // and a stray non-JSON line before it: rmcp gets the whole message.
    let script = r#"read -r line
id=$(printf '%s' "$line" | sed 's/.*"id":\([0-9]*\).*/\1/')
echo 'not json'
printf '{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-06-18",' "$id"
sleep 0.3
printf '"capabilities":{},"serverInfo":{"name":"sh","version":"1"}}}'
sleep 0.3
printf '\n'
cat >/dev/null"#;
    let command = JobCommand::new("sh")
        .args(["-c", script])
        .grace(Duration::from_millis(500));
    let transport = JobTransport::start(&client, command).await.unwrap();
    let pid = transport.pid();
    let mut exit = transport.exit();
    let service = timeout(WAIT, ().serve(transport))
        .await
        .expect("the handshake within the bound")
        .expect("the handshake with a line cut in three");
    assert_eq!(
        service
            .peer_info()
            .and_then(|i| i.server_info.clone())
            .map(|s| s.name),
        Some("sh".to_string())
    );
    service.cancel().await.unwrap();
    // `cat` ends at EOF: the job exits 0 before any signal.
    let status = timeout(WAIT, exit.wait()).await.unwrap().unwrap();
    assert_eq!(status.code, Some(0), "{status:?}");
    assert!(!alive(pid));
}

/// A client on an agent holding `MCP_TOKEN=Bearer <secret>` in its
/// environment (as `mcp_http`'s bridge tests start it).
async fn client_with_token(server: &Server, secret: &str) -> Client {
    let launcher = agent_launcher(&server.dir, secret, None);
    let mut cmd = tokio::process::Command::new(launcher);
    cmd.env_remove("MCP_TOKEN").env_remove("MCP_TEST_SECRET");
    Client::spawn(cmd, ClientOptions::default())
        .await
        .expect("connect to the agent")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rmcp_client_reaches_an_sdk_http_server_from_the_host() {
    let Some(python) = crate::mcp_http::python_with_sdk() else {
        return;
    };
    let secret = fresh_secret();
    let server = Server::start(&python, &secret, None);
    let client = client_with_token(&server, &secret).await;
    let http = HostHttp::new(client).header_from_env("Authorization", "MCP_TOKEN", "");
    let (service, mut progress) = serve(http.transport(server.url())).await;
    assert_eq!(tool_names(&service).await, "add,pid,progress,ticker");
    let r = service
        .call_tool(call("add", serde_json::json!({"a": 40, "b": 2})))
        .await
        .expect("add");
    assert_eq!(text_of(&r), "42");
    // An SSE answer: progress notifications, 50 ms apart, and the result.
    let r = service
        .call_tool(call_with_progress(
            "progress",
            serde_json::json!({"steps": 5}),
            "p-http",
        ))
        .await
        .expect("progress");
    assert_eq!(text_of(&r), "done 5");
    assert_eq!(
        progress_of(&mut progress, 5).await,
        ["1/5", "2/5", "3/5", "4/5", "5/5"]
    );
    timeout(SCENARIO, service.cancel())
        .await
        .expect("close within the bound")
        .expect("close");
    // Every request had the token (from the agent's environment); the
    // session the server gave was carried by every request after the
    // first, and deleted at the close.
    let requests = server.requests();
    assert!(requests.iter().all(|r| r.3 == "ok"), "{requests:?}");
    let given = requests
        .iter()
        .position(|r| r.2 != "-")
        .unwrap_or_else(|| panic!("no request carried a session: {requests:?}"));
    assert!(given > 0, "{requests:?}");
    assert!(
        requests[..given].iter().all(|r| r.0 == "POST"),
        "{requests:?}"
    );
    let session = &requests[given].2;
    assert!(
        requests[given..].iter().all(|r| &r.2 == session),
        "{requests:?}"
    );
    assert!(
        wait_for(WAIT, || server
            .requests()
            .iter()
            .any(|r| r.0 == "DELETE" && &r.2 == session && r.1 < 300)),
        "no DELETE of {session}: {:?}",
        server.requests()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_rmcp_client_leaves_no_stream_to_the_http_server() {
    let Some(python) = crate::mcp_http::python_with_sdk() else {
        return;
    };
    let secret = fresh_secret();
    let server = Server::start(&python, &secret, None);
    let client = client_with_token(&server, &secret).await;
    let http = HostHttp::new(client.clone()).header_from_env("Authorization", "MCP_TOKEN", "");
    let (service, mut progress) = serve(http.transport(server.url())).await;
    // A call answered by an SSE stream that never ends.
    let peer = service.peer().clone();
    let call = tokio::spawn(async move {
        peer.call_tool(call_with_progress("ticker", serde_json::json!({}), "t"))
            .await
    });
    for _ in 0..3 {
        timeout(WAIT, progress.recv())
            .await
            .expect("ticks within the bound")
            .expect("a tick");
    }
    // The control: the host holds the stream's connection open.
    let open = established_to(server.port);
    assert!(open >= 1, "{open} connections to the server mid-stream");
    drop(service);
    let answer = timeout(WAIT, call).await.expect("the call ends").unwrap();
    assert!(answer.is_err(), "{answer:?}");
    assert!(
        wait_for(Duration::from_secs(10), || established_to(server.port) == 0),
        "{} connections to the server 10 s after its client was dropped",
        established_to(server.port)
    );
    // The agent goes on serving the same connection.
    let (again, _p) = serve(
        HostHttp::new(client)
            .header_from_env("Authorization", "MCP_TOKEN", "")
            .transport(server.url()),
    )
    .await;
    assert!(tool_names(&again).await.contains("ticker"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_token_from_the_host_the_handshake_fails_naming_the_status() {
    let Some(python) = crate::mcp_http::python_with_sdk() else {
        return;
    };
    let secret = fresh_secret();
    let server = Server::start(&python, &secret, None);
    let client = client_with_token(&server, &secret).await;
    // The same agent, no `header_from_env`: the server answers 401.
    let handshake = timeout(
        SCENARIO,
        ().serve(HostHttp::new(client).transport(server.url())),
    )
    .await
    .expect("the handshake fails rather than waits");
    let e = handshake.expect_err("a handshake without the token");
    assert!(format!("{e:?}").contains("401"), "{e:?}");
    let requests = server.requests();
    assert!(
        !requests.is_empty() && requests.iter().all(|r| r.1 == 401 && r.3 == "none"),
        "{requests:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_a_real_sshd_the_job_transport_serves_and_ends_its_job() {
    let Some(python) = crate::mcp_stdio::python_with_sdk() else {
        return;
    };
    let sshd = executor_tests::sshd::Sshd::start("", "");
    let client = Client::connect_target(
        &executor_client::Target::ssh_with("127.0.0.1", sshd.options(&executor_bin())),
        ClientOptions::default(),
    )
    .await
    .expect("connect over sshd");
    let transport = stdio_server(&client, &python).await;
    let pid = transport.pid();
    let mut exit = transport.exit();
    let (service, mut progress) = serve(transport).await;
    assert!(tool_names(&service).await.contains("numbered"));
    // 20 progress notifications and a result through ssh's channel.
    let r = service
        .call_tool(call_with_progress(
            "numbered",
            serde_json::json!({"count": 20, "delay": 0.0}),
            "n",
        ))
        .await
        .expect("numbered");
    assert_eq!(text_of(&r), "done 20");
    assert_eq!(progress_of(&mut progress, 20).await.len(), 20);
    timeout(SCENARIO, service.cancel())
        .await
        .expect("close within the bound")
        .expect("close");
    let status = timeout(WAIT, exit.wait()).await.unwrap().unwrap();
    assert_eq!(status.code, Some(0), "{status:?}");
    assert!(!alive(pid), "the server {pid} outlived its transport");
    client.close().await.unwrap();
}
