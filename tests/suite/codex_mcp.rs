//! The real Codex CLI calling MCP tools through an exec-server: its
//! `[mcp_servers.NAME]` with `environment_id` naming the remote
//! environment, a stdio server started there (`process/start`, its
//! JSON-RPC over `process/write` and pushed output) and a Streamable-HTTP
//! server reached from there (`http/request`, the bearer token resolved
//! from the exec-server's environment through `valueEnvVar`). The same
//! scenarios run against the reference `codex exec-server` and against
//! `executor codex-exec-server`, directly and through a real sshd.

use executor_tests::codex::{
    function_call, run_with, Sandbox, Server, Turn, MCP_TOKEN as TOKEN, MCP_TOKEN_VAR as TOKEN_VAR,
};
use executor_tests::prerequisite_missing;
use serde_json::{json, Value};
use std::io::BufRead;

fn python_with_sdk() -> Option<String> {
    let out = std::process::Command::new("python3")
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

fn server_script() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/suite/codex_mcp/server.py").to_string()
}

/// Where Codex put MCP tool `tool` of server `server` in the
/// `tool_search_output` it sent back: `(namespace, name)` for the model's
/// function call (Codex 0.171.0 defers MCP tools: the model finds them
/// with `tool_search` first).
fn found_tool(request: &Value, server: &str, tool: &str) -> Option<(Option<String>, String)> {
    fn walk(
        v: &Value,
        ns: Option<&str>,
        server: &str,
        tool: &str,
    ) -> Option<(Option<String>, String)> {
        match v {
            Value::Object(m) => {
                let name = m.get("name").and_then(Value::as_str);
                if m.get("type").and_then(Value::as_str) == Some("namespace") {
                    let inner = name.filter(|n| n.contains(server));
                    return m.values().find_map(|v| walk(v, inner.or(ns), server, tool));
                }
                if let Some(n) = name {
                    let in_server = ns.is_some() || n.contains(server);
                    if in_server && (n == tool || n.ends_with(&format!("_{tool}"))) {
                        return Some((ns.map(str::to_string), n.to_string()));
                    }
                }
                m.values().find_map(|v| walk(v, ns, server, tool))
            }
            Value::Array(a) => a.iter().find_map(|v| walk(v, ns, server, tool)),
            _ => None,
        }
    }
    request["input"]
        .as_array()?
        .iter()
        .filter(|i| i["type"] == "tool_search_output")
        .find_map(|i| walk(&i["tools"], None, server, tool))
}

/// A `tool_search` call (its call id numbered `n`) for `tool` of `server`.
fn search(n: usize, server: &str, tool: &str) -> Value {
    json!({
        "type": "tool_search_call",
        "id": format!("ts_search_{n}"),
        "call_id": format!("search-{n}"),
        "execution": "client",
        "arguments": {"query": format!("{server} {tool}"), "limit": 8},
    })
}

/// The turns that search for MCP tool `tool` of `server`, then call it
/// with `args` (call id `call_id`). Codex starts MCP servers while the
/// turn begins: a search made before a server listed its tools finds
/// nothing, so the search is repeated (half a second apart, at most
/// [`SEARCHES`] times) until the tool shows up.
fn call_mcp(
    call_id: &'static str,
    server: &'static str,
    tool: &'static str,
    args: Value,
) -> Vec<Turn> {
    let mut turns: Vec<Turn> = vec![Box::new(move |_| vec![search(0, server, tool)])];
    for n in 1..=SEARCHES {
        let args = args.clone();
        turns.push(Box::new(move |req| {
            if executor_tests::codex::tool_output(req, call_id).is_some() {
                return vec![executor_tests::codex::message("done")];
            }
            match found_tool(req, server, tool) {
                Some((namespace, name)) => {
                    let mut item = function_call(call_id, &name, args.clone());
                    if let Some(ns) = namespace {
                        item["namespace"] = json!(ns);
                    }
                    vec![item]
                }
                None if n < SEARCHES => {
                    std::thread::sleep(std::time::Duration::from_millis(500));
                    vec![search(n, server, tool)]
                }
                None => panic!(
                    "tool_search found no tool {tool} of MCP server {server} in {SEARCHES} tries; input: {}",
                    req["input"]
                ),
            }
        }));
    }
    turns
}

/// Searches before giving up on an MCP server's tools.
const SEARCHES: usize = 40;

/// A stdio MCP server in the remote environment: its tool's answer (with
/// the exec-server's environment mark) reaches the model.
async fn stdio_tool(server: Server) {
    let Some(python) = python_with_sdk() else {
        return;
    };
    let config = format!(
        "\n[mcp_servers.hosttools]\ncommand = {}\nargs = [{}, \"stdio\"]\n\
         environment_id = \"under-test\"\ncwd = \"/\"\n\
         startup_timeout_sec = 60\ndefault_tools_approval_mode = \"approve\"\n",
        toml(&python),
        toml(&server_script()),
    );
    let Some(o) = run_with(
        "mcp-stdio",
        server,
        Sandbox::WorkspaceWrite,
        call_mcp("call_add", "hosttools", "add", json!({"a": 2, "b": 3})),
        |_| {},
        &config,
    )
    .await
    else {
        return;
    };
    let out = o.output("call_add").to_string();
    assert!(out.contains("sum 5 under "), "{out}\n{}", o.log());
    // Started by the exec-server, not by Codex itself: the reference's
    // `codex exec-server`, or executor's session host, is an ancestor.
    let started_by = match server {
        Server::Reference { .. } => "exec-server --listen stdio",
        Server::Executor { .. } => "executor session-host",
    };
    assert!(out.contains(started_by), "not under {started_by}: {out}");
}

fn toml(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// A Streamable-HTTP MCP server on loopback needing a bearer token,
/// reached from the remote environment: the token is named by
/// `bearer_token_env_var` and read from the exec-server's environment.
async fn http_tool(server: Server) {
    let Some(python) = python_with_sdk() else {
        return;
    };
    assert!(
        std::env::var_os(TOKEN_VAR).is_none(),
        "{TOKEN_VAR} must not be set in the test's own environment"
    );
    let dir = executor_tests::codex::RunDir::new("mcp-http-server");
    let log = dir.root.join("requests.log");
    let mut child = std::process::Command::new(&python)
        .arg(server_script())
        .arg("http")
        .arg(&log)
        .env("MCP_TEST_SECRET", TOKEN)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("start the HTTP MCP server");
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let _server = Kill(child);
    let port: u16 = first
        .trim()
        .strip_prefix("port: ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port line from the HTTP MCP server: {first:?}"));
    let config = format!(
        "\n[mcp_servers.hostweb]\nurl = \"http://127.0.0.1:{port}/mcp\"\n\
         environment_id = \"under-test\"\nbearer_token_env_var = \"{TOKEN_VAR}\"\n\
         startup_timeout_sec = 60\ndefault_tools_approval_mode = \"approve\"\n"
    );
    let Some(o) = run_with(
        "mcp-http",
        server,
        Sandbox::WorkspaceWrite,
        call_mcp("call_add", "hostweb", "add", json!({"a": 20, "b": 22})),
        |_| {},
        &config,
    )
    .await
    else {
        return;
    };
    let out = o.output("call_add").to_string();
    assert!(out.contains("sum 42"), "{out}\n{}", o.log());
    let seen = std::fs::read_to_string(&log).unwrap();
    assert!(seen.lines().any(|l| l == "POST ok"), "{seen}");
    assert!(
        !seen.contains("refused"),
        "a request came without the token:\n{seen}"
    );
    assert!(!o.log().contains(TOKEN), "the token reached Codex's output");
}

macro_rules! scenarios_against {
    ($m:ident, $server:expr) => {
        mod $m {
            use super::*;
            #[tokio::test]
            async fn a_stdio_mcp_server_runs_in_the_environment() {
                stdio_tool($server).await;
            }
            #[tokio::test]
            async fn an_http_mcp_server_is_reached_from_the_environment_with_its_token() {
                http_tool($server).await;
            }
        }
    };
}

scenarios_against!(reference, Server::Reference { via_ssh: false });
scenarios_against!(executor, Server::Executor { via_ssh: false });
scenarios_against!(executor_over_ssh, Server::Executor { via_ssh: true });
