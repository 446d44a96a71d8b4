//! The Codex CLI side of the Codex-dialect tests: where the reference
//! binary is (`EXECUTOR_CODEX_BIN`), which exec-server a run uses (the
//! reference, or `executor codex-exec-server` directly or through a real
//! sshd), a scripted Responses-API model on loopback, and `codex exec`
//! runs against them. Uses the crate's sshd and skip helpers.

use crate::sshd::Sshd;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Where the reference Codex CLI is unless `EXECUTOR_CODEX_BIN` says
/// otherwise (`.ci/run` installs it there).
pub const DEFAULT_CODEX_BIN: &str = "/opt/codex-ref/node_modules/.bin/codex";

/// The reference `codex` binary, or `None` after calling the skip helper
/// (a failure under `EXECUTOR_REQUIRE_ALL=1`).
pub fn codex_bin() -> Option<PathBuf> {
    let bin = std::env::var_os("EXECUTOR_CODEX_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CODEX_BIN));
    if bin.is_file() {
        Some(bin)
    } else {
        crate::prerequisite_missing(&format!(
            "the Codex CLI at {} (npm install @openai/codex@0.171.0, or set EXECUTOR_CODEX_BIN)",
            bin.display()
        ));
        None
    }
}

/// The value of `EXECUTOR_CODEX_MARK` in the exec-server's environment:
/// a command that prints it proves it ran under the configured server.
pub const SERVER_MARK: &str = "served-by-the-configured-exec-server";

/// A bearer token only the exec-server's environment holds (as
/// [`MCP_TOKEN_VAR`]): an MCP server needing it is reached with it only
/// when the exec-server resolves `valueEnvVar` itself.
pub const MCP_TOKEN: &str = "mcp-token-only-the-exec-server-has";
pub const MCP_TOKEN_VAR: &str = "EXECUTOR_MCP_TEST_TOKEN";

/// Which exec-server Codex's remote environment launches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    /// `codex exec-server --listen stdio` (locally, or as the remote
    /// command of a real sshd).
    Reference { via_ssh: bool },
    /// `executor codex-exec-server --listen stdio` of this workspace.
    Executor { via_ssh: bool },
}

impl Server {
    pub fn name(&self) -> &'static str {
        match self {
            Server::Reference { via_ssh: false } => "reference",
            Server::Reference { via_ssh: true } => "reference-ssh",
            Server::Executor { via_ssh: false } => "executor",
            Server::Executor { via_ssh: true } => "executor-ssh",
        }
    }

    /// The server's command line, with `EXECUTOR_CODEX_MARK` and
    /// [`MCP_TOKEN_VAR`] (and for the reference `CODEX_HOME`) in its
    /// environment.
    fn command(&self, codex: &Path, codex_home: &Path) -> Vec<String> {
        let mut argv = vec![
            "env".to_string(),
            format!("EXECUTOR_CODEX_MARK={SERVER_MARK}"),
            format!("{MCP_TOKEN_VAR}={MCP_TOKEN}"),
        ];
        match self {
            Server::Reference { .. } => {
                argv.push(format!("CODEX_HOME={}", codex_home.display()));
                argv.push(codex.display().to_string());
                argv.push("exec-server".into());
            }
            Server::Executor { .. } => {
                argv.push(crate::executor_bin().display().to_string());
                argv.push("codex-exec-server".into());
            }
        }
        argv.extend(["--listen".to_string(), "stdio".to_string()]);
        argv
    }

    /// `program` and `args` for environments.toml; the sshd (kept alive
    /// by the caller) when the server is reached through one.
    pub fn launch(&self, codex: &Path, codex_home: &Path) -> (String, Vec<String>, Option<Sshd>) {
        let argv = self.command(codex, codex_home);
        let via_ssh = matches!(
            self,
            Server::Reference { via_ssh: true } | Server::Executor { via_ssh: true }
        );
        if !via_ssh {
            let program = argv[0].clone();
            return (program, argv[1..].to_vec(), None);
        }
        let sshd = Sshd::start("", "");
        let mut args = vec![
            "-T".to_string(),
            "-p".into(),
            sshd.port.to_string(),
            "-i".into(),
            sshd.client_key.display().to_string(),
        ];
        for o in sshd.ssh_o_options() {
            args.push("-o".into());
            args.push(o);
        }
        args.push(format!("{}@127.0.0.1", sshd.user));
        args.push(
            argv.iter()
                .map(|a| shell_quote(a))
                .collect::<Vec<_>>()
                .join(" "),
        );
        ("ssh".into(), args, Some(sshd))
    }
}

/// `s` single-quoted for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// `s` as a TOML basic string.
fn toml_str(s: &str) -> String {
    serde_json::to_string(s).expect("a JSON string is a TOML basic string")
}

/// One model turn: given the request Codex sent (the Responses API body),
/// the output items to answer with.
pub type Turn = Box<dyn Fn(&Value) -> Vec<Value> + Send + Sync>;

/// A turn answering `items` whatever the request.
pub fn items(items: Vec<Value>) -> Turn {
    Box::new(move |_| items.clone())
}

/// A function tool call (`exec_command`, `write_stdin`, `view_image`).
pub fn function_call(call_id: &str, name: &str, arguments: Value) -> Value {
    json!({
        "type": "function_call",
        "id": format!("fc_{call_id}"),
        "call_id": call_id,
        "name": name,
        "arguments": arguments.to_string(),
    })
}

/// The freeform `apply_patch` call holding `patch`.
pub fn apply_patch(call_id: &str, patch: &str) -> Value {
    json!({
        "type": "custom_tool_call",
        "id": format!("ctc_{call_id}"),
        "call_id": call_id,
        "name": "apply_patch",
        "input": patch,
    })
}

/// An assistant message ending the task.
pub fn message(text: &str) -> Value {
    json!({
        "type": "message",
        "role": "assistant",
        "id": "msg_end",
        "content": [{"type": "output_text", "text": text}],
    })
}

/// The output Codex sent back for the tool call `call_id` in `request`
/// (a string, or a list of content items for `view_image`).
pub fn tool_output<'a>(request: &'a Value, call_id: &str) -> Option<&'a Value> {
    request["input"]
        .as_array()?
        .iter()
        .find(|i| {
            i["call_id"] == call_id
                && i["type"]
                    .as_str()
                    .is_some_and(|t| t.ends_with("_call_output"))
        })
        .map(|i| &i["output"])
}

/// The unified-exec session id in a tool output ("Process running with
/// session ID N").
pub fn session_id(output: &str) -> Option<u64> {
    let rest = output.split("session ID ").nth(1)?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// A Responses-API server on 127.0.0.1 answering `POST /v1/responses`
/// with SSE from a script of turns (then a final message), recording
/// every request body.
pub struct ScriptedModel {
    pub port: u16,
    requests: Arc<Mutex<Vec<Value>>>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for ScriptedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedModel")
            .field("port", &self.port)
            .finish()
    }
}

impl Drop for ScriptedModel {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct ModelState {
    turns: Vec<Turn>,
    requests: Arc<Mutex<Vec<Value>>>,
}

impl ScriptedModel {
    pub async fn start(turns: Vec<Turn>) -> ScriptedModel {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the scripted model");
        let port = listener.local_addr().expect("local addr").port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let state = Arc::new(ModelState {
            turns,
            requests: requests.clone(),
        });
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let state = state.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| answer(req, state.clone()));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service)
                        .await;
                });
            }
        });
        ScriptedModel {
            port,
            requests,
            task,
        }
    }

    /// Every request body received so far, in order.
    pub fn requests(&self) -> Vec<Value> {
        self.requests.lock().expect("requests lock").clone()
    }
}

async fn answer(
    req: Request<Incoming>,
    state: Arc<ModelState>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() != hyper::Method::POST || req.uri().path() != "/v1/responses" {
        return Ok(Response::builder()
            .status(404)
            .body(Full::new(Bytes::new()))
            .expect("response"));
    }
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    let turn = {
        let mut reqs = state.requests.lock().expect("requests lock");
        reqs.push(body.clone());
        reqs.len() - 1
    };
    let items = match state.turns.get(turn) {
        Some(t) => t(&body),
        None => vec![message("done")],
    };
    let id = format!("resp_{turn}");
    let mut sse = String::new();
    let mut event = |kind: &str, mut data: Value| {
        data["type"] = json!(kind);
        sse.push_str(&format!("event: {kind}\ndata: {data}\n\n"));
    };
    event("response.created", json!({"response": {"id": id}}));
    for item in items {
        event("response.output_item.done", json!({ "item": item }));
    }
    event(
        "response.completed",
        json!({"response": {"id": id, "usage": {
            "input_tokens": 1, "input_tokens_details": null,
            "output_tokens": 1, "output_tokens_details": null, "total_tokens": 2}}}),
    );
    Ok(Response::builder()
        .header("content-type", "text/event-stream")
        .body(Full::new(Bytes::from(sse)))
        .expect("response"))
}

/// `codex exec --sandbox MODE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sandbox {
    ReadOnly,
    WorkspaceWrite,
}

impl Sandbox {
    fn flag(&self) -> &'static str {
        match self {
            Sandbox::ReadOnly => "read-only",
            Sandbox::WorkspaceWrite => "workspace-write",
        }
    }
}

/// A fresh run directory outside /tmp and outside any git repository
/// (Codex looks for one upwards from the workspace):
/// `/var/tmp/executor-codex-tests/TAG-PID-NANOS` with `home/` (CODEX_HOME)
/// and `workspace/`. Removed on drop unless the thread panics (a failure
/// leaves it for a look).
#[derive(Debug)]
pub struct RunDir {
    pub root: PathBuf,
    pub home: PathBuf,
    pub workspace: PathBuf,
}

impl RunDir {
    pub fn new(tag: &str) -> RunDir {
        let base = std::env::var_os("EXECUTOR_CODEX_RUNS")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/tmp/executor-codex-tests"));
        sweep_dead_runs(&base);
        let root = base.join(format!(
            "{tag}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_nanos()
        ));
        let home = root.join("home");
        let workspace = root.join("workspace");
        std::fs::create_dir_all(&home).expect("create CODEX_HOME");
        std::fs::create_dir_all(&workspace).expect("create the workspace");
        RunDir {
            root,
            home,
            workspace,
        }
    }
}

/// Removes the run directories of test processes that are gone (a failed
/// run leaves its directory for a look; the next test process takes it
/// away). Names end in `-PID-NANOS`.
fn sweep_dead_runs(base: &Path) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let Ok(entries) = std::fs::read_dir(base) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(pid) = name.rsplit('-').nth(1).and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    });
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// What a `codex exec` run left: the model's recorded requests, Codex's
/// output, and the run directory (the workspace to check).
#[derive(Debug)]
pub struct Outcome {
    pub dir: RunDir,
    pub requests: Vec<Value>,
    pub stdout: String,
    pub stderr: String,
    pub status: std::process::ExitStatus,
}

impl Outcome {
    /// The output Codex sent the model for `call_id` (panics, with the
    /// run's log, when it never did).
    pub fn output(&self, call_id: &str) -> &Value {
        self.requests
            .iter()
            .rev()
            .find_map(|r| tool_output(r, call_id))
            .unwrap_or_else(|| {
                panic!(
                    "Codex sent no output for {call_id}\nstdout:\n{}\nstderr:\n{}",
                    self.stdout, self.stderr
                )
            })
    }

    /// The output for `call_id` as text.
    pub fn text(&self, call_id: &str) -> &str {
        let out = self.output(call_id);
        out.as_str()
            .unwrap_or_else(|| panic!("the output for {call_id} is not text: {out}"))
    }

    /// Codex's stdout and stderr, for assertion messages.
    pub fn log(&self) -> String {
        format!("stdout:\n{}\nstderr:\n{}", self.stdout, self.stderr)
    }
}

/// Bound on one `codex exec` run.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// Run `codex exec` once: the model answers `turns`, tools run in the
/// remote environment `server` launches, under `sandbox`. `setup`
/// prepares the workspace first. `None` when the Codex CLI is missing
/// (after the skip helper).
pub async fn run(
    tag: &str,
    server: Server,
    sandbox: Sandbox,
    turns: Vec<Turn>,
    setup: impl FnOnce(&Path),
) -> Option<Outcome> {
    run_with(tag, server, sandbox, turns, setup, "").await
}

/// [`run`] with `config` appended to Codex's config.toml (after the
/// model provider's table: it starts with a table of its own, such as
/// `[mcp_servers.NAME]`).
pub async fn run_with(
    tag: &str,
    server: Server,
    sandbox: Sandbox,
    turns: Vec<Turn>,
    setup: impl FnOnce(&Path),
    config: &str,
) -> Option<Outcome> {
    let codex = codex_bin()?;
    let dir = RunDir::new(&format!("{tag}-{}", server.name()));
    setup(&dir.workspace);
    let model = ScriptedModel::start(turns).await;
    let (program, args, sshd) = server.launch(&codex, &dir.home);
    std::fs::write(
        dir.home.join("config.toml"),
        format!(
            "model = \"gpt-5.5\"\nmodel_provider = \"scripted\"\napproval_policy = \"never\"\n\
             [model_providers.scripted]\nname = \"scripted\"\n\
             base_url = \"http://127.0.0.1:{}/v1\"\nwire_api = \"responses\"\n\
             env_key = \"EXECUTOR_CODEX_TEST_KEY\"\n{config}",
            model.port
        ),
    )
    .expect("write config.toml");
    std::fs::write(
        dir.home.join("environments.toml"),
        format!(
            "default = \"under-test\"\ninclude_local = false\n\n[[environments]]\n\
             id = \"under-test\"\nprogram = {}\nargs = [{}]\n",
            toml_str(&program),
            args.iter()
                .map(|a| toml_str(a))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )
    .expect("write environments.toml");
    let child = tokio::process::Command::new(&codex)
        .args([
            "exec",
            "--skip-git-repo-check",
            "--sandbox",
            sandbox.flag(),
            "run the scripted tools",
        ])
        .current_dir(&dir.workspace)
        .env("CODEX_HOME", &dir.home)
        .env("EXECUTOR_CODEX_TEST_KEY", "dummy")
        .env_remove("OPENAI_API_KEY")
        .env_remove("CODEX_EXEC_SERVER_URL")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn codex exec");
    let out = tokio::time::timeout(RUN_TIMEOUT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("codex exec ({}) did not end in time", server.name()))
        .expect("wait for codex exec");
    drop(sshd);
    Some(Outcome {
        dir,
        requests: model.requests(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        status: out.status,
    })
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding.
pub fn base64(bytes: &[u8]) -> String {
    let mut s = String::new();
    for c in bytes.chunks(3) {
        let n = u32::from(c[0]) << 16
            | u32::from(*c.get(1).unwrap_or(&0)) << 8
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                s.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

/// Standard base64 decoded (`None` when it is not).
pub fn unbase64(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0u32);
    for ch in s.bytes().filter(|b| *b != b'=') {
        let v = B64.iter().position(|x| *x == ch)? as u32;
        acc = acc << 6 | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}
