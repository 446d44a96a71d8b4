//! `executor-client mcp http` (issue 31, the Streamable HTTP bridge): the
//! Python MCP SDK's Streamable HTTP server (`mcp_http/server.py`, behind a
//! bearer token) reached from the agent's host, and the SDK's own client
//! (`mcp_http/client.py`) on the bridge's local endpoint; raw HTTP through
//! the bridge for the statuses and headers an MCP client relies on; a
//! client killed mid-stream; a server only the host can reach (a network
//! namespace holding the server and the agent).

use executor_tests::cli::*;
use executor_tests::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const SERVER: &str = include_str!("mcp_http/server.py");
const CLIENT: &str = include_str!("mcp_http/client.py");

/// Bound on one SDK scenario (its Python start-up included).
const SCENARIO: Duration = Duration::from_secs(120);

/// The Python interpreter when it imports the MCP SDK and uvicorn; `None`
/// (and a skip that `EXECUTOR_REQUIRE_ALL=1` fails) otherwise.
pub(crate) fn python_with_sdk() -> Option<String> {
    let out = Command::new("python3")
        .args(["-c", "import sys, mcp, uvicorn; print(sys.executable)"])
        .output();
    match out {
        Ok(o) if o.status.success() => Some(String::from_utf8(o.stdout).unwrap().trim().into()),
        _ => {
            prerequisite_missing("the Python MCP SDK (python3 -m pip install \"mcp>=1.0\")");
            None
        }
    }
}

/// A child killed (and reaped) when the test lets go of it.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A fresh network namespace with `lo` up, deleted on drop.
pub(crate) struct Netns(String);

impl Netns {
    /// `None` when namespaces cannot be made here (not root).
    fn new() -> Option<Netns> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let name = format!(
            "exec-mcp-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        );
        let made = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .is_ok_and(|s| s.success());
        if !made {
            return None;
        }
        let ns = Netns(name);
        let up = Command::new("ip")
            .args(["netns", "exec", &ns.0, "ip", "link", "set", "lo", "up"])
            .status()
            .unwrap();
        assert!(up.success(), "ip link set lo up in {}", ns.0);
        Some(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// The SDK server and what the test needs of it.
pub(crate) struct Server {
    pub(crate) port: u16,
    log: std::path::PathBuf,
    pub(crate) dir: std::path::PathBuf,
    _child: Killed,
}

impl Server {
    /// The server (inside `netns` when given), requiring `Bearer secret`.
    pub(crate) fn start(python: &str, secret: &str, netns: Option<&Netns>) -> Server {
        let dir = unique_tempdir("mcp-http");
        std::fs::write(dir.join("server.py"), SERVER).unwrap();
        std::fs::write(dir.join("client.py"), CLIENT).unwrap();
        let log = dir.join("requests.log");
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &ns.0, python]);
                c
            }
            None => Command::new(python),
        };
        let mut child = cmd
            .arg(dir.join("server.py"))
            .arg(&log)
            .env("MCP_TEST_SECRET", secret)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the SDK server");
        let stdout = child.stdout.take().unwrap();
        let child = Killed(child);
        let line = first_line(stdout, "the SDK server's port");
        let port = line
            .strip_prefix("port: ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("not a port line: {line:?}"));
        Server {
            port,
            log,
            dir,
            _child: child,
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// The request log: `(method, status, session, auth)` per request.
    pub(crate) fn requests(&self) -> Vec<(String, u16, String, String)> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                (
                    f[0].to_string(),
                    f[1].parse().unwrap(),
                    f[2].to_string(),
                    f[3].to_string(),
                )
            })
            .collect()
    }
}

/// The first line `r` gives, failing past [`SCENARIO`].
fn first_line(r: impl Read + Send + 'static, what: &str) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(r).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(SCENARIO)
        .unwrap_or_else(|_| panic!("no {what} within {SCENARIO:?}"));
    assert!(!line.is_empty(), "no {what}: the process ended");
    line
}

/// An `executor` launcher for the bridge's agent: the test secret put in
/// its environment as `MCP_TOKEN=Bearer <secret>` (read from a file, so
/// the bridge never holds it), run inside `netns` when given.
pub(crate) fn agent_launcher(
    dir: &std::path::Path,
    secret: &str,
    netns: Option<&Netns>,
) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let secret_file = dir.join("secret");
    std::fs::write(&secret_file, secret).unwrap();
    let prefix = netns.map_or(String::new(), |ns| format!("ip netns exec {} ", ns.0));
    let script = dir.join("executor-with-token");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nMCP_TOKEN=\"Bearer $(cat '{}')\" exec {prefix}'{}' \"$@\"\n",
            secret_file.display(),
            executor_bin().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

/// The bridge: `mcp http URL FLAGS`, its agent started by `launcher`; the
/// local endpoint it printed.
fn bridge(launcher: &std::path::Path, url: &str, flags: &[&str]) -> (Killed, String) {
    bridge_via(&["--target".into(), "local".into()], launcher, url, flags)
}

/// [`bridge`] with connection flags `conn` (a local target's agent is
/// `launcher`).
fn bridge_via(
    conn: &[String],
    launcher: &std::path::Path,
    url: &str,
    flags: &[&str],
) -> (Killed, String) {
    let mut child = Command::new(client_bin())
        .args(conn)
        .args(["mcp", "http", url])
        .args(flags)
        .env("EXECUTOR_BIN", launcher)
        .env("RUST_BACKTRACE", "0")
        .env_remove("EXECUTOR_TARGET")
        .env_remove("MCP_TOKEN")
        .env_remove("MCP_TEST_SECRET")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the bridge");
    let stdout = child.stdout.take().unwrap();
    let child = Killed(child);
    let endpoint = first_line(stdout, "endpoint from the bridge")
        .trim()
        .to_string();
    assert!(
        endpoint.starts_with("http://127.0.0.1:") && endpoint.ends_with("/mcp"),
        "{endpoint:?}"
    );
    (child, endpoint)
}

/// The SDK client running `mode` against `endpoint`.
fn sdk_client(python: &str, dir: &std::path::Path, endpoint: &str, mode: &str) -> Child {
    Command::new(python)
        .arg(dir.join("client.py"))
        .arg(endpoint)
        .arg(mode)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the SDK client")
}

/// `child`'s output, killing it (and failing) past `within`.
fn finish(mut child: Child, within: Duration) -> Output {
    let deadline = Instant::now() + within;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("still running after {within:?}: {}", text(&out));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// The `key: value` lines of the SDK client's output.
fn results(out: &Output) -> std::collections::BTreeMap<String, String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A secret no other process holds.
pub(crate) fn fresh_secret() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("tok-{}-{nanos:x}", std::process::id())
}

/// Whether `needle` is in `pid`'s command line or environment.
fn process_holds(pid: u32, needle: &str) -> bool {
    ["cmdline", "environ"].iter().any(|f| {
        let data = std::fs::read(format!("/proc/{pid}/{f}")).unwrap();
        data.windows(needle.len()).any(|w| w == needle.as_bytes())
    })
}

/// An answer read whole: status, headers (names lower case), body
/// (chunked framing undone).
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 exchange with `endpoint` (`http://ADDR/PATH`), `Connection:
/// close`, read to its end within [`WAIT`].
fn raw(endpoint: &str, method: &str, headers: &[(&str, &str)], body: &str) -> Answer {
    let rest = endpoint.strip_prefix("http://").unwrap();
    let addr = &rest[..rest.find('/').unwrap()];
    raw_as(endpoint, method, addr, headers, body)
}

/// A POST to `endpoint` whose `Host` header is `host`.
fn raw_with_host(endpoint: &str, host: &str, headers: &[(&str, &str)], body: &str) -> Answer {
    raw_as(endpoint, "POST", host, headers, body)
}

fn raw_as(
    endpoint: &str,
    method: &str,
    host: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let rest = endpoint.strip_prefix("http://").unwrap();
    let (addr, path) = rest.split_at(rest.find('/').unwrap());
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).expect("the whole answer");
    let all = String::from_utf8(all).unwrap();
    let (head, mut rest) = all.split_once("\r\n\r\n").expect("a head");
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        let mut out = String::new();
        loop {
            let (size, after) = rest.split_once("\r\n").expect("a chunk size");
            let n = usize::from_str_radix(size.trim(), 16).unwrap();
            if n == 0 {
                break;
            }
            out.push_str(&after[..n]);
            rest = &after[n + 2..];
        }
        out
    } else {
        rest.to_string()
    };
    Answer {
        status,
        headers,
        body,
    }
}

const JSON_AND_SSE: (&str, &str) = ("Accept", "application/json, text/event-stream");
const JSON: (&str, &str) = ("Content-Type", "application/json");
const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#;

#[test]
fn the_sdk_client_works_through_the_bridge_with_a_token_from_the_host() {
    let Some(python) = python_with_sdk() else {
        return;
    };
    let secret = fresh_secret();
    let server = Server::start(&python, &secret, None);
    let launcher = agent_launcher(&server.dir, &secret, None);
    let (bridged, endpoint) = bridge(
        &launcher,
        &server.url(),
        &["--header-env", "Authorization=MCP_TOKEN"],
    );
    let out = finish(
        sdk_client(&python, &server.dir, &endpoint, "full"),
        SCENARIO,
    );
    assert!(out.status.success(), "{}", text(&out));
    let r = results(&out);
    let get = |k: &str| r.get(k).map(String::as_str);
    assert_eq!(
        get("tools"),
        Some("add,pid,progress,ticker"),
        "{}",
        text(&out)
    );
    assert_eq!(get("add"), Some("42"));
    // The progress notifications arrive, in order, before the result.
    assert_eq!(get("progress"), Some("done 5 1/5 2/5 3/5 4/5 5/5"));
    assert_eq!(get("resource"), Some("hello from behind the host"));
    assert_eq!(get("end"), Some("ok"));

    // What the server saw: every request authorized; the first without a
    // session, every later one with the session id it issued, a GET
    // stream among them, and the client's DELETE last, which ended it.
    let seen = server.requests();
    assert!(seen.len() >= 6, "{seen:?}");
    assert!(seen.iter().all(|(_, _, _, auth)| auth == "ok"), "{seen:?}");
    assert_eq!((seen[0].0.as_str(), seen[0].2.as_str()), ("POST", "-"));
    let session = seen[1].2.clone();
    assert_ne!(session, "-", "{seen:?}");
    assert!(
        seen[1..].iter().all(|(_, _, s, _)| *s == session),
        "{seen:?}"
    );
    assert!(
        seen.iter().any(|(m, st, _, _)| m == "GET" && *st == 200),
        "{seen:?}"
    );
    let last = seen.last().unwrap();
    assert_eq!((last.0.as_str(), last.1), ("DELETE", 200), "{seen:?}");
    let after = raw(
        &endpoint,
        "POST",
        &[JSON_AND_SSE, JSON, ("Mcp-Session-Id", &session)],
        r#"{"jsonrpc":"2.0","id":9,"method":"tools/list"}"#,
    );
    assert_eq!(after.status, 404, "{}", after.body);

    // The secret: in the agent's environment, nowhere in the bridge's
    // arguments or environment.
    let bridge_pid = bridged.0.id();
    assert!(!process_holds(bridge_pid, &secret));
    let agents = children(bridge_pid);
    assert_eq!(agents.len(), 1, "{agents:?}");
    assert!(process_holds(
        agents[0],
        &format!("MCP_TOKEN=Bearer {secret}")
    ));

    // The control: a bridge without --header-env is refused by the server.
    let (_plain, plain_endpoint) = bridge(&launcher, &server.url(), &[]);
    let refused = raw(&plain_endpoint, "POST", &[JSON_AND_SSE, JSON], INITIALIZE);
    assert_eq!(refused.status, 401, "{}", refused.body);
    assert_eq!(server.requests().last().unwrap().3, "none");
}

#[test]
fn statuses_and_mcp_headers_pass_both_ways() {
    let Some(python) = python_with_sdk() else {
        return;
    };
    let secret = fresh_secret();
    let server = Server::start(&python, &secret, None);
    let launcher = agent_launcher(&server.dir, &secret, None);
    let (_bridge, endpoint) = bridge(
        &launcher,
        &server.url(),
        &[
            "--header-env",
            "Authorization=MCP_TOKEN",
            "-H",
            "X-Extra: 1",
        ],
    );
    // A local Authorization is replaced by the host's.
    let init = raw(
        &endpoint,
        "POST",
        &[JSON_AND_SSE, JSON, ("Authorization", "Bearer wrong")],
        INITIALIZE,
    );
    assert_eq!(init.status, 200, "{}", init.body);
    assert_eq!(server.requests().last().unwrap().3, "ok");
    assert!(
        init.header("content-type")
            .is_some_and(|v| v.starts_with("text/event-stream")),
        "{:?}",
        init.headers
    );
    assert!(init.body.contains("\"serverInfo\""), "{}", init.body);
    let session = init
        .header("mcp-session-id")
        .expect("a session id")
        .to_string();
    let with_session = [JSON_AND_SSE, JSON, ("Mcp-Session-Id", session.as_str())];
    // A notification: 202, no body.
    let note = raw(
        &endpoint,
        "POST",
        &with_session,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    );
    assert_eq!(note.status, 202, "{}", note.body);
    // A method the server does not serve: 405 and its Allow.
    let put = raw(&endpoint, "PUT", &with_session, "");
    assert_eq!(put.status, 405, "{}", put.body);
    assert_eq!(put.header("allow"), Some("GET, POST, DELETE"));
    // A session the server does not know: 404.
    let unknown = raw(
        &endpoint,
        "POST",
        &[JSON_AND_SSE, JSON, ("Mcp-Session-Id", "0123456789abcdef")],
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    );
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    // Without its session id, DELETE is the server's 400, its body intact.
    let del = raw(&endpoint, "DELETE", &with_session[..1], "");
    assert_eq!(del.status, 400, "{}", del.body);
    assert!(del.body.contains("Missing session ID"), "{}", del.body);
    // DELETE ends the session: it is unknown afterwards.
    let del = raw(
        &endpoint,
        "DELETE",
        &[("Mcp-Session-Id", session.as_str())],
        "",
    );
    assert_eq!(del.status, 200, "{}", del.body);
    let gone = raw(
        &endpoint,
        "POST",
        &with_session,
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#,
    );
    assert_eq!(gone.status, 404, "{}", gone.body);
    // A web page reaching the endpoint by DNS rebinding is refused; a
    // loopback origin is not.
    let rebound = raw_with_host(
        &endpoint,
        "evil.example:8931",
        &[JSON_AND_SSE, JSON],
        INITIALIZE,
    );
    assert_eq!(rebound.status, 403, "{}", rebound.body);
    assert!(
        rebound
            .body
            .contains("Host \"evil.example:8931\" is not a loopback"),
        "{}",
        rebound.body
    );
    let cross = raw(
        &endpoint,
        "POST",
        &[JSON_AND_SSE, JSON, ("Origin", "http://evil.example")],
        INITIALIZE,
    );
    assert_eq!(cross.status, 403, "{}", cross.body);
    assert!(
        cross.body.contains("Origin \"http://evil.example\""),
        "{}",
        cross.body
    );
    let local = raw(
        &endpoint,
        "POST",
        &[JSON_AND_SSE, JSON, ("Origin", "http://localhost:3000")],
        INITIALIZE,
    );
    assert_eq!(local.status, 200, "{}", local.body);
    // Another local path is not the endpoint.
    let other = raw(&endpoint.replace("/mcp", "/other"), "GET", &[], "");
    assert_eq!(other.status, 404);
    assert!(
        other.body.contains("serves /mcp only, not /other"),
        "{}",
        other.body
    );
}

/// Established TCP connections whose local port is `port` (the server's
/// side of each connection to it), in this network namespace.
pub(crate) fn established_to(port: u16) -> usize {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(f)
                .unwrap_or_default()
                .lines()
                .skip(1)
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local_port = f[1].rsplit(':').next().unwrap();
            u16::from_str_radix(local_port, 16) == Ok(port) && f[3] == "01"
        })
        .count()
}

#[test]
fn a_client_killed_mid_stream_leaves_no_upstream_connection() {
    let Some(python) = python_with_sdk() else {
        return;
    };
    let secret = fresh_secret();
    let server = Server::start(&python, &secret, None);
    let launcher = agent_launcher(&server.dir, &secret, None);
    let (_bridge, endpoint) = bridge(
        &launcher,
        &server.url(),
        &["--header-env", "Authorization=MCP_TOKEN"],
    );
    // A tool call answered as an SSE stream of progress notifications
    // that never ends, and the client's GET stream.
    let mut client = sdk_client(&python, &server.dir, &endpoint, "hold");
    let mut lines = BufReader::new(client.stdout.take().unwrap()).lines();
    let mut ticks = 0;
    while ticks < 3 {
        let line = lines
            .next()
            .expect("the client ended before its ticks")
            .unwrap();
        if line.starts_with("tick: ") {
            ticks += 1;
        }
    }
    // The control: the host holds the streams' connections open.
    let open = established_to(server.port);
    assert!(open >= 2, "{open} connections to the server mid-stream");
    client.kill().unwrap();
    client.wait().unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || established_to(server.port) == 0),
        "{} connections to the server 10 s after its client was killed",
        established_to(server.port)
    );
    // The bridge goes on serving.
    let init = raw(&endpoint, "POST", &[JSON_AND_SSE, JSON], INITIALIZE);
    assert_eq!(init.status, 200, "{}", init.body);
}

#[test]
fn a_server_only_the_host_reaches_is_served_on_local_loopback() {
    let Some(python) = python_with_sdk() else {
        return;
    };
    let Some(ns) = Netns::new() else {
        prerequisite_missing("network namespaces (`ip netns add`, as root)");
        return;
    };
    let secret = fresh_secret();
    // The server and the agent live in the namespace; the bridge and the
    // SDK client in the test's.
    let server = Server::start(&python, &secret, Some(&ns));
    let probe = |inside: bool| {
        let code = format!(
            "import socket; socket.create_connection(('127.0.0.1', {}), timeout=5).close()",
            server.port
        );
        let mut c = if inside {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &ns.0, &python]);
            c
        } else {
            Command::new(&python)
        };
        c.args(["-c", &code])
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
    };
    assert!(probe(true), "the server is not reachable inside {}", ns.0);
    assert!(!probe(false), "the server is reachable outside {}", ns.0);
    let launcher = agent_launcher(&server.dir, &secret, Some(&ns));
    let (_bridge, endpoint) = bridge(
        &launcher,
        &server.url(),
        &["--header-env", "Authorization=MCP_TOKEN"],
    );
    let out = finish(
        sdk_client(&python, &server.dir, &endpoint, "full"),
        SCENARIO,
    );
    assert!(out.status.success(), "{}", text(&out));
    let r = results(&out);
    assert_eq!(
        r.get("add").map(String::as_str),
        Some("42"),
        "{}",
        text(&out)
    );
    assert_eq!(
        r.get("progress").map(String::as_str),
        Some("done 5 1/5 2/5 3/5 4/5 5/5")
    );
    assert_eq!(
        r.get("resource").map(String::as_str),
        Some("hello from behind the host")
    );
    assert_eq!(r.get("end").map(String::as_str), Some("ok"));
    let last = server.requests().pop().unwrap();
    assert_eq!((last.0.as_str(), last.1), ("DELETE", 200));
}

#[test]
fn bad_flag_values_are_refused_by_name_before_connecting() {
    let cases: [(&[&str], &str); 4] = [
        (
            &["http://127.0.0.1:1/mcp", "--listen", "0.0.0.0:8931"],
            "0.0.0.0 is not a loopback address",
        ),
        (
            &["http://127.0.0.1:1/mcp", "--listen", "localhost"],
            "\"localhost\" is not ADDRESS:PORT",
        ),
        (
            &["http://127.0.0.1:1/mcp", "--header-env", "Authorization=9X"],
            "\"9X\" (in \"Authorization=9X\") is not an environment variable name",
        ),
        (
            &["ftp://host/mcp"],
            "\"ftp://host/mcp\" is not an http:// or https:// URL",
        ),
    ];
    for (args, want) in cases {
        let out = Command::new(client_bin())
            .args(["--target", "local", "mcp", "http"])
            .args(args)
            // An agent that would start is never asked for.
            .env("EXECUTOR_BIN", "/nonexistent/executor")
            .env_remove("EXECUTOR_TARGET")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}: {}", text(&out));
    }
}

#[test]
fn the_bridge_ends_when_its_agent_is_gone() {
    // The server is a plain one: the agent's death is what is tested.
    let port = tiny_http_server();
    let dir = unique_tempdir("mcp-http-agent-gone");
    let launcher = agent_launcher(&dir, "unused", None);
    let (mut b, endpoint) = bridge(&launcher, &format!("http://127.0.0.1:{port}/mcp"), &[]);
    let ok = raw(&endpoint, "POST", &[JSON], "{}");
    assert_eq!((ok.status, ok.body.as_str()), (200, "ok"));
    let agents = children(b.0.id());
    assert_eq!(agents.len(), 1, "{agents:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agents[0] as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // The next request learns it: 502 with the reason, and the bridge
    // exits 255 instead of serving errors.
    let failed = raw(&endpoint, "POST", &[JSON], "{}");
    assert_eq!(failed.status, 502, "{}", failed.body);
    assert!(
        failed.body.contains("executor-client mcp http:"),
        "{}",
        failed.body
    );
    assert!(
        wait_for(WAIT, || b.0.try_wait().unwrap().is_some()),
        "the bridge outlived its agent"
    );
    assert_eq!(b.0.wait().unwrap().code(), Some(255));
}

#[test]
fn over_a_real_sshd_the_token_stays_on_the_host() {
    let Some(python) = python_with_sdk() else {
        return;
    };
    let secret = fresh_secret();
    let server = Server::start(&python, &secret, None);
    let launcher = agent_launcher(&server.dir, &secret, None);
    // sshd runs the launcher as the remote command: the token is in the
    // environment of the agent it starts, on the host's side of ssh.
    let sshd = executor_tests::sshd::Sshd::start("", "");
    let (bridged, endpoint) = bridge_via(
        &ssh_flags(&sshd, &launcher.to_string_lossy()),
        &launcher,
        &server.url(),
        &["--header-env", "Authorization=MCP_TOKEN"],
    );
    let out = finish(
        sdk_client(&python, &server.dir, &endpoint, "full"),
        SCENARIO,
    );
    assert!(out.status.success(), "{}", text(&out));
    let r = results(&out);
    assert_eq!(
        r.get("add").map(String::as_str),
        Some("42"),
        "{}",
        text(&out)
    );
    assert_eq!(
        r.get("progress").map(String::as_str),
        Some("done 5 1/5 2/5 3/5 4/5 5/5")
    );
    assert_eq!(r.get("end").map(String::as_str), Some("ok"));
    let seen = server.requests();
    assert!(seen.iter().all(|(_, _, _, auth)| auth == "ok"), "{seen:?}");
    // Neither the bridge nor its ssh holds the secret.
    let pid = bridged.0.id();
    assert!(!process_holds(pid, &secret));
    let ssh = children(pid);
    assert_eq!(ssh.len(), 1, "{ssh:?}");
    assert_eq!(comm(ssh[0]), "ssh");
    assert!(!process_holds(ssh[0], &secret));
}
