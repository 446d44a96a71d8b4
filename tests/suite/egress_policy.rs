//! Egress by name (docs/PROTOCOL.md §8), the proxy's policy under attack:
//! one request per HTTP proxy connection with exact framing (a pipelined
//! or smuggled second request never reaches the upstream), names that
//! resolve to the host itself (loopback, its interfaces) refused unless
//! an address says so, decision reports and `ask` questions bounded per
//! job, and intent errors that name their exact path.
//!
//! Real jobs (python3, curl) through the real proxy to real loopback
//! servers; each case as root and as uid 65534 (`agent_command`, or the
//! private-`/etc/hosts` agent of `egress.rs` where names must resolve to
//! chosen addresses).

use super::egress::{agent_in_namespaces, agent_with_hosts, decisions, egress, find, Agent};
use executor_agent::egress::{ASK_BUDGET, MAX_ASKS, REPORT_BUDGET};
use executor_client::egress::EgressPolicy;
use executor_client::{Client, ClientOptions, ErrorCode};
use executor_protocol::methods as m;
use executor_protocol::types::network::*;
use executor_tests::http::TestServer;
use executor_tests::*;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use executor_tests::root_and_unprivileged as both;

/// An agent started by [`agent_command`] (as root, or as uid 65534 when
/// root) with `config` after an audit section; `None` (a missing
/// prerequisite) where jobs cannot get a network namespace.
async fn plain_agent(unprivileged: bool, options: ClientOptions, config: &str) -> Option<Agent> {
    let dir = unique_tempdir(if unprivileged {
        "egress-policy-user"
    } else {
        "egress-policy-root"
    });
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let audit = dir.join("audit.jsonl");
    let path = dir.join("config.toml");
    std::fs::write(
        &path,
        format!("[audit]\nfile = \"{}\"\n{config}", audit.display()),
    )
    .unwrap();
    std::fs::write(dir.join("raw.py"), RAW_CLIENT).unwrap();
    std::fs::write(dir.join("flood.py"), FLOOD).unwrap();
    let (mut cmd, uid) = agent_command(unprivileged);
    if uid != current_uid() {
        chown_r(&dir, uid);
    }
    cmd.arg("--config").arg(&path);
    let c = Client::spawn(cmd, options).await.expect("agent");
    if !c.initialize_result().sandbox.enforceable {
        prerequisite_missing("an enforceable sandbox (a network namespace per job)");
        return None;
    }
    Some(Agent { c, dir, audit })
}

/// A job's raw HTTP client: sends the bytes (hex in argv[1]) to the proxy
/// as they are, prints everything answered until the proxy closes.
const RAW_CLIENT: &str = r#"
import os, socket, sys
port = int(os.environ['HTTP_PROXY'].rsplit(':', 1)[1])
s = socket.create_connection(('127.0.0.1', port))
s.settimeout(20)
s.sendall(bytes.fromhex(sys.argv[1]))
got = b''
try:
    while True:
        b = s.recv(65536)
        if not b:
            break
        got += b
except socket.timeout:
    got += b'<timeout>'
except ConnectionResetError:
    got += b'<reset>'
sys.stdout.write(got.decode('latin1'))
"#;

/// A job that opens N CONNECT tunnels to distinct names
/// (`n0.TAG:443`, `n1.TAG:443`, ...), `W` at a time (argv: N TAG W), and
/// prints how many got each status, then the seconds it took.
const FLOOD: &str = r#"
import os, socket, sys, threading, time
port = int(os.environ['HTTP_PROXY'].rsplit(':', 1)[1])
n, tag, width = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
codes, lock = {}, threading.Lock()
def one(i):
    s = socket.create_connection(('127.0.0.1', port))
    s.settimeout(30)
    s.sendall(b'CONNECT n%d.%s:443 HTTP/1.1\r\n\r\n' % (i, tag.encode()))
    got = b''
    try:
        while True:
            b = s.recv(4096)
            if not b:
                break
            got += b
    except OSError:
        pass
    s.close()
    c = got.split(b' ')[1].decode() if got.startswith(b'HTTP/') else '-'
    with lock:
        codes[c] = codes.get(c, 0) + 1
def worker(w):
    for i in range(w, n, width):
        one(i)
t = time.time()
ts = [threading.Thread(target=worker, args=(w,)) for w in range(width)]
[x.start() for x in ts]
[x.join() for x in ts]
print(' '.join('%s=%d' % kv for kv in sorted(codes.items())), '%.3f' % (time.time() - t))
"#;

/// An upstream that records every byte it receives, answers the first
/// request head of a connection with `200 ok` and keeps reading (as a
/// server that pipelines, or ignores `Connection: close`, does) until 1.5 s
/// pass without a byte or the peer ends.
struct Recorder {
    port: u16,
    conns: Arc<Mutex<Vec<Arc<Mutex<Conn>>>>>,
    task: tokio::task::JoinHandle<()>,
}

/// One connection's bytes, and whether it has ended.
#[derive(Default)]
struct Conn {
    bytes: Vec<u8>,
    ended: bool,
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn recorder() -> Recorder {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let conns: Arc<Mutex<Vec<Arc<Mutex<Conn>>>>> = Arc::default();
    let all = conns.clone();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let conn: Arc<Mutex<Conn>> = Arc::default();
            all.lock().unwrap().push(conn.clone());
            tokio::spawn(async move {
                let mut answered = false;
                let mut buf = [0u8; 16384];
                loop {
                    let n =
                        match tokio::time::timeout(Duration::from_millis(1500), s.read(&mut buf))
                            .await
                        {
                            Ok(Ok(n)) if n > 0 => n,
                            _ => break,
                        };
                    let seen = {
                        let mut c = conn.lock().unwrap();
                        c.bytes.extend_from_slice(&buf[..n]);
                        c.bytes.windows(4).any(|w| w == b"\r\n\r\n")
                    };
                    if seen && !answered {
                        answered = true;
                        let _ = s
                            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                            .await;
                    }
                }
                conn.lock().unwrap().ended = true;
            });
        }
    });
    Recorder { port, conns, task }
}

impl Recorder {
    /// Every connection accepted since the last call, each once it has
    /// ended: the job may read the answer to a request's head and exit
    /// while the proxy's copy of the body is still on its way here, so
    /// taking the bytes at once would see a cut body. A connection ends
    /// when the proxy closes it or after 1.5 s without a byte.
    async fn take(&self) -> Vec<Vec<u8>> {
        let conns = std::mem::take(&mut *self.conns.lock().unwrap());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !conns.iter().all(|c| c.lock().unwrap().ended) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the recorder's connections did not end within 10 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        conns
            .iter()
            .map(|c| std::mem::take(&mut c.lock().unwrap().bytes))
            .collect()
    }
}

fn hex_of(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

/// What the upstream must have seen for one case.
enum Upstream {
    /// No connection at all (refused by the proxy before connecting).
    Nothing,
    /// One connection whose bytes are exactly this head line's request,
    /// with this body after its head (and nothing else).
    Exactly {
        request_line: &'static str,
        body: &'static [u8],
    },
    /// One connection, cut before its body: no byte of `absent` in it.
    Without(&'static [&'static str]),
}

// §8: every request is decided on its own. The proxy relays exactly one
// request per connection, re-framed, then closes: a second request
// pipelined behind the first (another Host, an absolute-form URI), a
// CL+TE smuggle, a body shorter than the bytes after it, or chunk framing
// an upstream could read otherwise never reaches the upstream. Ambiguous
// framing is a 400 before anything is connected. The upstream here reads
// on after the first request (as a pipelining server does), so it sees
// whatever the proxy forwards. Positive controls: two pipelined requests
// to the allowed host (the first is answered), and curl's bodies (length,
// chunked, 2 MiB with `Expect: 100-continue`) arriving intact.
both!(
    one_request_per_connection_with_exact_framing,
    |unprivileged| async move {
        let Some(a) = plain_agent(unprivileged, ClientOptions::default(), "").await else {
            return;
        };
        let rec = recorder().await;
        let p = rec.port;
        let auth = format!("127.0.0.1:{p}");
        let echo = TestServer::start().await;
        let e = echo.addr.port();
        let intent = egress(&[auth.clone(), format!("127.0.0.1:{e}")], false, 1000);
        let get = |path: &str| format!("GET http://{auth}{path} HTTP/1.1\r\nHost: {auth}\r\n\r\n");
        let post = |headers: &str| {
            format!("POST http://{auth}/up HTTP/1.1\r\nHost: {auth}\r\n{headers}\r\n")
        };
        let smuggled = "GET /admin HTTP/1.1\r\nHost: other.test\r\n\r\n";
        let absolute =
            format!("GET http://other.test:{p}/x HTTP/1.1\r\nHost: other.test:{p}\r\n\r\n");
        let cases: Vec<(&str, String, &str, Upstream)> = vec![
            (
                "a pipelined second request to another Host",
                format!("{}{smuggled}", get("/first")),
                "HTTP/1.1 200",
                Upstream::Exactly {
                    request_line: "GET /first HTTP/1.1",
                    body: b"",
                },
            ),
            (
                "positive control: two pipelined requests to the allowed host",
                format!("{}{}", get("/first"), get("/second")),
                "HTTP/1.1 200",
                Upstream::Exactly {
                    request_line: "GET /first HTTP/1.1",
                    body: b"",
                },
            ),
            (
                "CL+TE smuggle",
                format!(
                    "{}0\r\n\r\n{smuggled}",
                    post(&format!(
                        "Content-Length: {}\r\nTransfer-Encoding: chunked\r\n",
                        5 + smuggled.len()
                    ))
                ),
                "HTTP/1.1 400",
                Upstream::Nothing,
            ),
            (
                "TE+CL smuggle, the other order",
                format!(
                    "{}5\r\nhello\r\n0\r\n\r\n{smuggled}",
                    post("Transfer-Encoding: chunked\r\nContent-Length: 3\r\n")
                ),
                "HTTP/1.1 400",
                Upstream::Nothing,
            ),
            (
                "two Content-Length headers",
                format!(
                    "{}{smuggled}",
                    post(&format!(
                        "Content-Length: 0\r\nContent-Length: {}\r\n",
                        smuggled.len()
                    ))
                ),
                "HTTP/1.1 400",
                Upstream::Nothing,
            ),
            (
                "Transfer-Encoding folded onto a second line",
                format!(
                    "{}0\r\n\r\n{smuggled}",
                    post("Transfer-Encoding:\r\n chunked\r\n")
                ),
                "HTTP/1.1 400",
                Upstream::Nothing,
            ),
            (
                "a Transfer-Encoding that is not chunked",
                format!(
                    "{}0\r\n\r\n{smuggled}",
                    post("Transfer-Encoding: chunked, identity\r\n")
                ),
                "HTTP/1.1 400",
                Upstream::Nothing,
            ),
            (
                "variant: a chunked body, then an absolute-form request to another host",
                format!(
                    "{}5;ext=1\r\nhello\r\n0\r\n\r\n{absolute}",
                    post("Transfer-Encoding: chunked\r\n")
                ),
                "HTTP/1.1 200",
                Upstream::Exactly {
                    request_line: "POST /up HTTP/1.1",
                    body: b"5\r\nhello\r\n0\r\n\r\n",
                },
            ),
            (
                "variant: a body shorter than the bytes after the head",
                format!("{}hello{absolute}", post("Content-Length: 5\r\n")),
                "HTTP/1.1 200",
                Upstream::Exactly {
                    request_line: "POST /up HTTP/1.1",
                    body: b"hello",
                },
            ),
            (
                "variant: a chunk-size line ending in a bare LF",
                format!(
                    "{}5\nhello\r\n0\r\n\r\n{absolute}",
                    post("Transfer-Encoding: chunked\r\n")
                ),
                "",
                Upstream::Without(&["hello", "other.test"]),
            ),
        ];
        let raw = a.dir.join("raw.py");
        for (what, req, status, upstream) in cases {
            rec.take().await;
            let (out, code) = a
                .sh(
                    &intent,
                    &format!(
                        "/usr/bin/python3 {} {}",
                        raw.display(),
                        hex_of(req.as_bytes())
                    ),
                )
                .await;
            assert_eq!(code, 0, "{what}: {out}");
            assert!(out.starts_with(status), "{what}: the job got {out:?}");
            if status == "HTTP/1.1 200" {
                assert!(out.ends_with("\r\n\r\nok"), "{what}: the job got {out:?}");
            }
            if status == "HTTP/1.1 400" {
                assert!(
                    out.contains("executor: not a valid destination"),
                    "{what}: {out:?}"
                );
            }
            // The upstream closed before the proxy did (or was never reached).
            let seen = rec.take().await;
            match upstream {
                Upstream::Nothing => assert!(
                    seen.is_empty(),
                    "{what}: the agent's proxy must refuse before connecting; the upstream got {:?}",
                    seen.iter().map(|c| String::from_utf8_lossy(c).into_owned()).collect::<Vec<_>>()
                ),
                Upstream::Exactly { request_line, body } => {
                    assert_eq!(seen.len(), 1, "{what}: {seen:?}");
                    let got = &seen[0];
                    let text = String::from_utf8_lossy(got);
                    assert!(text.starts_with(&format!("{request_line}\r\n")), "{what}: {text:?}");
                    let end = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                    assert_eq!(
                        String::from_utf8_lossy(&got[end..]),
                        String::from_utf8_lossy(body),
                        "{what}: the agent's proxy forwarded more than the one request: {text:?}"
                    );
                    assert_eq!(count(got, b" HTTP/1.1\r\n"), 1, "{what}: {text:?}");
                    assert!(!text.contains("other.test"), "{what}: {text:?}");
                }
                Upstream::Without(absent) => {
                    assert!(seen.len() <= 1, "{what}: {seen:?}");
                    for c in &seen {
                        let text = String::from_utf8_lossy(c);
                        for x in absent {
                            assert!(
                                !text.contains(x),
                                "{what}: the agent's proxy forwarded {x:?}: {text:?}"
                            );
                        }
                    }
                }
            }
        }

        // Positive controls with curl: bodies by length and chunked, and a
        // 2 MiB upload (curl waits for `100 Continue`), echoed intact.
        let gen =
            "/usr/bin/python3 -c 'import sys; sys.stdout.buffer.write(bytes(range(256)) * 8192)'";
        let url = format!("http://127.0.0.1:{e}/echo");
        for (what, curl) in [
            (
                "Content-Length",
                format!("curl -sS --noproxy '' --data-binary @- {url}"),
            ),
            (
                "chunked",
                format!(
                    "curl -sS --noproxy '' -H 'Transfer-Encoding: chunked' --data-binary @- {url}"
                ),
            ),
            (
                "Expect: 100-continue",
                format!("curl -sS --noproxy '' -H 'Expect: 100-continue' --data-binary @- {url}"),
            ),
        ] {
            let (out, code) = a
                .sh(
                    &intent,
                    &format!("{gen} | {curl} | sha256sum; {gen} | sha256sum"),
                )
                .await;
            let sums: Vec<&str> = out.lines().collect();
            assert_eq!(code, 0, "{what}: {out}");
            assert_eq!(sums.len(), 2, "{what}: {out}");
            assert_eq!(sums[0], sums[1], "{what}: the echoed body differs: {out}");
        }
        let (out, _) = a
            .sh(&intent, &format!("curl -sS --noproxy '' -d 'a=1' {url}"))
            .await;
        assert_eq!(out, "a=1");
    }
);

/// The private `/etc/hosts` of the loopback cases: names for loopback in
/// each form, the unspecified address, and `iface.test` for this host's
/// non-loopback address `iface`.
fn loopback_hosts(iface: IpAddr) -> String {
    format!(
        "127.0.0.1 localhost lo4.test\n\
         ::1 lo6.test\n\
         ::ffff:127.0.0.1 mapped.test\n\
         0.0.0.0 zero.test\n\
         {iface} iface.test\n"
    )
}

/// A non-loopback, non-link-local address of this host's interfaces.
fn interface_address() -> Option<IpAddr> {
    let all = executor_sys::host_addresses().ok()?;
    let usable = |a: &IpAddr| match a {
        IpAddr::V4(v4) => !v4.is_loopback() && !v4.is_link_local(),
        IpAddr::V6(_) => false,
    };
    all.into_iter().find(usable)
}

// A name that resolves to the host itself reaches nothing: loopback
// (`localhost`, a name for 127.0.0.1, one for ::1, one for
// ::ffff:127.0.0.1), the unspecified address, and (variant) an address of
// one of the host's interfaces that is not loopback; over the HTTP proxy,
// CONNECT and SOCKS5 alike, judged on the address resolved once and
// connected to. The layer is the agent's egress policy (403 with the
// address and the rule; `network/decision` source `policy`). Positive
// controls: the same servers through an address pattern, through a name
// when an address pattern admits its address, and through the names when
// the configuration's `http.allow` names the addresses.
both!(
    names_never_reach_the_host_itself,
    |unprivileged| async move {
        let Some(iface) = interface_address() else {
            prerequisite_missing("a non-loopback IPv4 address on an interface");
            return;
        };
        let hosts = loopback_hosts(iface);
        let Some(a) = agent_with_hosts(unprivileged, ClientOptions::default(), "", &hosts).await
        else {
            return;
        };
        // One server on every address, IPv4 and IPv6.
        let server = TestServer::start_on("[::]:0").await;
        let p = server.addr.port();
        let names = [
            "localhost",
            "lo4.test",
            "lo6.test",
            "mapped.test",
            "zero.test",
            "iface.test",
        ];
        let intent = egress(
            &names.iter().map(|n| format!("{n}:{p}")).collect::<Vec<_>>(),
            false,
            1000,
        );
        let mut sub = a.c.subscribe(&[m::NETWORK_DECISION]);
        let status = |url: &str| format!("curl -sS --noproxy '' -w ' %{{http_code}}' {url}");
        for (name, rule) in [
            ("localhost", "loopback"),
            ("lo4.test", "loopback"),
            ("lo6.test", "loopback"),
            ("mapped.test", "loopback"),
            ("zero.test", "unspecified"),
            ("iface.test", "this host's interfaces"),
        ] {
            let (out, _) = a
                .sh(&intent, &status(&format!("http://{name}:{p}/headers")))
                .await;
            assert!(
                out.ends_with(" 403") && out.contains("destination policy") && out.contains(rule),
                "{name}: the agent's egress policy must refuse a name for the host itself ({rule}): {out}"
            );
            assert!(!out.contains("host: "), "{name}: reached the server: {out}");
        }
        // CONNECT and SOCKS5 the same.
        let (out, code) = a
            .sh(
                &intent,
                &format!("curl -sS --noproxy '' -p http://lo4.test:{p}/headers"),
            )
            .await;
        assert!(code != 0 && out.contains("403"), "CONNECT: {out}");
        let (out, code) = a
            .sh(
                &intent,
                &format!("curl -sS --noproxy '' -x \"$ALL_PROXY\" http://lo6.test:{p}/headers"),
            )
            .await;
        assert!(code != 0 && !out.contains("host: "), "SOCKS5: {out}");
        let ds = decisions(&mut sub).await;
        for name in names {
            let d = find(&ds, name, EgressVerdict::Deny)
                .unwrap_or_else(|| panic!("no deny reported for {name}: {ds:?}"));
            assert_eq!(d.source, DecisionSource::Policy, "{name}");
            assert!(
                find(&ds, name, EgressVerdict::Allow).is_none(),
                "{name}: {ds:?}"
            );
        }

        // Positive controls: addresses the intent names, and a name whose
        // address an address pattern admits.
        let by_address = egress(
            &[
                format!("127.0.0.1:{p}"),
                format!("[::1]:{p}"),
                format!("{iface}:{p}"),
                format!("lo4.test:{p}"),
            ],
            false,
            1000,
        );
        for url in [
            format!("http://127.0.0.1:{p}/headers"),
            format!("http://[::1]:{p}/headers"),
            format!("http://{iface}:{p}/headers"),
            format!("http://lo4.test:{p}/headers"),
        ] {
            let (out, _) = a.sh(&by_address, &status(&url)).await;
            assert!(
                out.ends_with(" 200") && out.contains("host:"),
                "positive control {url}: {out}"
            );
        }
        a.c.close().await.unwrap();

        // The configuration's http.allow names the addresses: the names work.
        let config = format!("[http]\nallow = [\"127.0.0.0/8\", \"[::1]\", \"{iface}\"]\n");
        let Some(a) =
            agent_with_hosts(unprivileged, ClientOptions::default(), &config, &hosts).await
        else {
            return;
        };
        for name in [
            "localhost",
            "lo4.test",
            "lo6.test",
            "mapped.test",
            "iface.test",
        ] {
            let (out, _) = a
                .sh(&intent, &status(&format!("http://{name}:{p}/headers")))
                .await;
            assert!(
                out.ends_with(" 200") && out.contains("host:"),
                "positive control {name} with http.allow: {out}"
            );
        }
        // 0.0.0.0 stays refused (by default, whatever names it).
        let (out, _) = a
            .sh(&intent, &status(&format!("http://zero.test:{p}/headers")))
            .await;
        assert!(out.ends_with(" 403"), "{out}");
    }
);

// §8 asks for the exact path of every error in an intent: an element of
// allow_hosts that is not a string, an unknown key of the egress form (a
// misspelt `ask_timeout`), a wrong type for `ask`, a timeout over the
// maximum, a port out of range (variant), a read root that is not a path
// (variant), for `process/start` (`sandbox.…`) and `exec_command`
// (`sandbox_permissions.…`). Positive control: the same intent without the
// fault runs. The layer is the protocol's params decoding.
both!(
    intent_errors_name_their_exact_path,
    |unprivileged| async move {
        let Some(a) = plain_agent(unprivileged, ClientOptions::default(), "").await else {
            return;
        };
        use rmpv::Value;
        let map = |kv: Vec<(&str, Value)>| {
            Value::Map(kv.into_iter().map(|(k, v)| (k.into(), v)).collect())
        };
        let hosts = |h: Vec<Value>| ("allow_hosts", Value::Array(h));
        let network = |kv: Vec<(&str, Value)>| map(vec![("network", map(kv))]);
        let cases = [
            (
                network(vec![hosts(vec!["a.test".into(), 42.into()])]),
                "network.allow_hosts.1",
            ),
            (
                network(vec![
                    hosts(vec!["a.test".into()]),
                    ("ask_timeout", 5.into()),
                ]),
                "network.ask_timeout",
            ),
            (
                network(vec![hosts(vec!["a.test".into()]), ("ask", "yes".into())]),
                "network.ask",
            ),
            (
                network(vec![
                    hosts(vec!["a.test".into()]),
                    ("ask_timeout_ms", 600_001.into()),
                ]),
                "network.ask_timeout_ms",
            ),
            (
                network(vec![(
                    "allow_tcp_connect",
                    Value::Array(vec![443.into(), 65_536.into()]),
                )]),
                "network.allow_tcp_connect.1",
            ),
            (
                map(vec![(
                    "filesystem",
                    map(vec![("read", Value::Array(vec!["/".into(), 7.into()]))]),
                )]),
                "filesystem.read.1",
            ),
        ];
        let start = |sandbox: Value| {
            map(vec![
                ("argv", Value::Array(vec!["/bin/true".into()])),
                ("cwd", "/".into()),
                ("env", Value::Map(Vec::new())),
                ("sandbox", sandbox),
            ])
        };
        let exec = |sandbox: Value| {
            map(vec![
                ("command", Value::Array(vec!["/bin/true".into()])),
                ("cwd", "/".into()),
                ("env", Value::Map(Vec::new())),
                ("sandbox_permissions", sandbox),
            ])
        };
        for (intent, path) in cases {
            for (method, params, prefix) in [
                (m::PROCESS_START, start(intent.clone()), "sandbox"),
                (m::EXEC_COMMAND, exec(intent.clone()), "sandbox_permissions"),
            ] {
                let e = remote(
                    a.c.start_call(method, &params)
                        .await
                        .unwrap()
                        .result::<Value>()
                        .await
                        .unwrap_err(),
                );
                assert_eq!(e.code, ErrorCode::InvalidParams, "{method} {intent}: {e:?}");
                assert_eq!(
                    e.data_get("field").and_then(|v| v.as_str()),
                    Some(format!("{prefix}.{path}").as_str()),
                    "{method} {intent}: the params decoding must name the exact path: {e:?}"
                );
            }
        }
        // Positive control: a good egress intent runs.
        let good = network(vec![
            hosts(vec!["a.test".into()]),
            ("ask_timeout_ms", 5.into()),
        ]);
        let r =
            a.c.start_call(m::EXEC_COMMAND, &exec(good))
                .await
                .unwrap()
                .result::<Value>()
                .await;
        assert!(r.is_ok(), "positive control: {r:?}");
    }
);

/// Runs the flood job: the status counts line and the seconds it took.
async fn flood(
    a: &Agent,
    intent: &executor_protocol::types::sandbox::SandboxIntent,
    n: usize,
    tag: &str,
    width: usize,
) -> (String, f64) {
    let (out, code) = a
        .sh(
            intent,
            &format!(
                "/usr/bin/python3 {} {n} {tag} {width}",
                a.dir.join("flood.py").display()
            ),
        )
        .await;
    assert_eq!(code, 0, "{out}");
    let (codes, secs) = out
        .trim()
        .rsplit_once(' ')
        .unwrap_or_else(|| panic!("{out}"));
    (codes.to_string(), secs.parse().unwrap())
}

/// The decisions (notifications, or audit lines) about hosts under `tag`:
/// how many reports, and how many decisions they stand for (a report with
/// `suppressed: N` stands for N).
fn accounted(ds: &[(String, Option<u64>)], tag: &str) -> (usize, u64, u64) {
    let mine: Vec<_> = ds.iter().filter(|(h, _)| h.ends_with(tag)).collect();
    let stands_for = mine.iter().map(|(_, s)| s.unwrap_or(1)).sum();
    let counted = mine.iter().filter_map(|(_, s)| *s).sum();
    (mine.len(), stands_for, counted)
}

/// An agent (see [`plain_agent`]) whose client denies every question
/// (scope once), counting them in the returned counter; a question about
/// a host ending in `slow_suffix` is answered after `delay`, any other at
/// once.
async fn counting_denier(
    unprivileged: bool,
    slow_suffix: &'static str,
    delay: Duration,
) -> Option<(Agent, Arc<AtomicU32>)> {
    let asked = Arc::new(AtomicU32::new(0));
    let count = asked.clone();
    let policy = EgressPolicy::new(move |req: PolicyRequestParams| {
        count.fetch_add(1, Ordering::SeqCst);
        async move {
            if req.host.ends_with(slow_suffix) {
                tokio::time::sleep(delay).await;
            }
            PolicyRequestResult {
                decision: EgressVerdict::Deny,
                scope: EgressScope::Once,
            }
        }
    });
    let options = ClientOptions {
        egress_policy: Some(policy),
        ..Default::default()
    };
    let a = plain_agent(unprivileged, options, "").await?;
    Some((a, asked))
}

/// The decisions notified once the last second's count is reported (at
/// the end of its second), and each as (host, suppressed) for
/// [`accounted`].
async fn reported(
    sub: &mut executor_client::Subscription,
) -> (Vec<NetworkDecision>, Vec<(String, Option<u64>)>) {
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let ds = decisions(sub).await;
    let reports = ds.iter().map(|d| (d.host.clone(), d.suppressed)).collect();
    (ds, reports)
}

// One job looping refused connections to distinct names flooded the audit
// log and the client (a report per decision). Reports of a job are now
// bounded per second (REPORT_BUDGET on their own, then one report counting
// the rest, `suppressed: N`), notifications and audit lines alike, and
// every decision is accounted for: the reports stand for exactly the
// decisions made. Positive control: a few refusals are each reported on
// their own. The layer is the agent's egress reporting.
both!(
    decision_reports_are_bounded_per_job,
    |unprivileged| async move {
        let Some(a) = plain_agent(unprivileged, ClientOptions::default(), "").await else {
            return;
        };
        let intent = egress(&["127.0.0.1:1".into()], false, 1000);
        let mut sub = a.c.subscribe(&[m::NETWORK_DECISION]);
        // Positive control: three refusals, three reports.
        let (codes, _) = flood(&a, &intent, 3, "few.test", 1).await;
        assert_eq!(codes, "403=3");
        // The flood: sequential, then 8 at a time.
        const N: usize = 1500;
        let (codes, secs1) = flood(&a, &intent, N, "flood.test", 1).await;
        assert_eq!(codes, format!("403={N}"));
        let (codes, secs2) = flood(&a, &intent, N, "wide.test", 8).await;
        assert_eq!(codes, format!("403={N}"));
        // The last count is reported at the end of its second.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let notes: Vec<(String, Option<u64>)> = decisions(&mut sub)
            .await
            .into_iter()
            .inspect(|d| assert_eq!(d.decision, EgressVerdict::Deny, "{d:?}"))
            .map(|d| (d.host, d.suppressed))
            .collect();
        let lines: Vec<(String, Option<u64>)> = a
            .audit_lines()
            .into_iter()
            .map(|l| {
                (
                    l["host"].as_str().unwrap_or_default().to_string(),
                    l["suppressed"].as_u64(),
                )
            })
            .collect();
        for (what, reports) in [("notifications", &notes), ("audit lines", &lines)] {
            assert_eq!(
                accounted(reports, ".few.test"),
                (3, 3, 0),
                "positive control, {what}: {reports:?}"
            );
            for (tag, secs) in [(".flood.test", secs1), (".wide.test", secs2)] {
                let (count, stands_for, counted) = accounted(reports, tag);
                // Per started second: the budget and one count.
                let bound = (REPORT_BUDGET as usize + 1) * (secs.ceil() as usize + 1);
                assert!(
                count <= bound,
                "{tag}: {count} {what} for {N} refusals in {secs} s (bound {bound}): the agent's egress reporting must bound them"
            );
                assert_eq!(
                    stands_for, N as u64,
                    "{tag}: every decision accounted for in the {what}"
                );
                assert!(
                    counted > 0,
                    "{tag}: the suppressed count is reported in the {what}"
                );
            }
        }
    }
);

// `ask` under a flood: a job opening connections to many distinct names at
// once had every one put to the client. At most MAX_ASKS questions of a job
// are outstanding; past it a destination is refused without asking (source
// `limit`), and reported (within the report budget, counted past it).
// Positive control: fewer parallel names than the bound are each asked.
both!(
    outstanding_asks_are_bounded_per_job,
    |unprivileged| async move {
        // Slow for the flood, at once for the control.
        let Some((a, asked)) =
            counting_denier(unprivileged, ".flood.test", Duration::from_secs(3)).await
        else {
            return;
        };
        let intent = egress(&["127.0.0.1:1".into()], true, 1500);
        let mut sub = a.c.subscribe(&[m::NETWORK_DECISION]);
        // Positive control: 3 at once, each asked.
        let (codes, _) = flood(&a, &intent, 3, "few.test", 3).await;
        assert_eq!(codes, "403=3");
        assert_eq!(
            asked.load(Ordering::SeqCst),
            3,
            "positive control: each asked"
        );
        // 40 at once.
        asked.store(0, Ordering::SeqCst);
        let (codes, secs) = flood(&a, &intent, 40, "flood.test", 40).await;
        assert_eq!(codes, "403=40");
        let n = asked.load(Ordering::SeqCst) as usize;
        assert!(
        (1..=MAX_ASKS).contains(&n),
        "{n} questions for 40 parallel names: the agent's egress proxy must bound outstanding asks at {MAX_ASKS}"
    );
        assert!(
            secs < 10.0,
            "refused without waiting for the client: {secs} s"
        );
        let (ds, reports) = reported(&mut sub).await;
        assert_eq!(accounted(&reports, ".flood.test").1, 40, "{ds:?}");
        assert!(
            ds.iter()
                .any(|d| d.host.ends_with(".flood.test") && d.source == DecisionSource::Limit),
            "{ds:?}"
        );
        assert!(a.audit_lines().iter().any(|l| l["source"] == "limit"));
    }
);

// The same without a private `/etc/hosts` (so it runs for any user, root
// or not): `localhost` resolves to loopback on every host and reaches
// nothing through the proxy, over HTTP and SOCKS5 (the layer: the agent's
// egress policy, 403 naming the rule). Positive controls: the address
// pattern, and the name once the configuration's `http.allow` names
// loopback.
both!(
    localhost_never_reaches_loopback,
    |unprivileged| async move {
        let Some(a) = plain_agent(unprivileged, ClientOptions::default(), "").await else {
            return;
        };
        let server = TestServer::start().await;
        let p = server.addr.port();
        let by_name = egress(&[format!("localhost:{p}")], false, 1000);
        let curl = |url: &str| format!("curl -sS --noproxy '' -w ' %{{http_code}}' {url}");
        let (out, _) = a
            .sh(&by_name, &curl(&format!("http://localhost:{p}/headers")))
            .await;
        assert!(
            out.ends_with(" 403") && out.contains("loopback") && !out.contains("host: "),
            "the agent's egress policy must refuse localhost: {out}"
        );
        let (out, code) = a
            .sh(
                &by_name,
                &format!("curl -sS --noproxy '' -x \"$ALL_PROXY\" http://localhost:{p}/headers"),
            )
            .await;
        assert!(code != 0 && !out.contains("host: "), "SOCKS5: {out}");
        let by_address = egress(&[format!("127.0.0.1:{p}")], false, 1000);
        let (out, _) = a
            .sh(&by_address, &curl(&format!("http://127.0.0.1:{p}/headers")))
            .await;
        assert!(
            out.ends_with(" 200") && out.contains("host: "),
            "positive control: {out}"
        );
        a.c.close().await.unwrap();
        let Some(a) = plain_agent(
            unprivileged,
            ClientOptions::default(),
            "[http]\nallow = [\"127.0.0.0/8\"]\n",
        )
        .await
        else {
            return;
        };
        let (out, _) = a
            .sh(&by_name, &curl(&format!("http://localhost:{p}/headers")))
            .await;
        assert!(
            out.ends_with(" 200") && out.contains("host: "),
            "positive control with http.allow: {out}"
        );
    }
);

// `ask` under a loop: MAX_ASKS bounds the questions outstanding, not how
// many a job puts to the client in a second. A denial is never remembered,
// so a job looping over refused destinations had one `network/policyRequest`
// per connection: hundreds a second against a client that answers at once,
// and (variant) against a client that never answers in time when
// `ask_timeout_ms` is short (each question ends at its timeout and the next
// one goes out). Questions of a job are now bounded per second
// (ASK_BUDGET); past it a destination is refused without asking (source
// `limit`), and every decision is still reported (within the report
// budget, counted past it). Positive control: a few names, each asked. The
// layer is the agent's egress proxy (its ask path).
both!(
    asks_are_bounded_per_second_per_job,
    |unprivileged| async move {
        // Never in time for the timeout variant, at once otherwise.
        let Some((a, asked)) =
            counting_denier(unprivileged, ".late.test", Duration::from_secs(2)).await
        else {
            return;
        };
        let mut sub = a.c.subscribe(&[m::NETWORK_DECISION]);
        let intent = egress(&["127.0.0.1:1".into()], true, 1000);
        // Positive control: three names, each asked.
        let (codes, _) = flood(&a, &intent, 3, "few.test", 1).await;
        assert_eq!(codes, "403=3");
        assert_eq!(asked.load(Ordering::SeqCst), 3, "positive control");
        const N: usize = 400;
        for (tag, intent, width) in [
            ("fast.test", intent.clone(), 2),
            (
                "late.test",
                egress(&["127.0.0.1:1".into()], true, 2),
                MAX_ASKS,
            ),
        ] {
            tokio::time::sleep(Duration::from_millis(1100)).await;
            asked.store(0, Ordering::SeqCst);
            let (codes, secs) = flood(&a, &intent, N, tag, width).await;
            assert_eq!(codes, format!("403={N}"), "{tag}");
            let n = asked.load(Ordering::SeqCst) as usize;
            let bound = ASK_BUDGET as usize * (secs.ceil() as usize + 1);
            assert!(
                n <= bound,
                "{tag}: {n} network/policyRequest for {N} refused connections in {secs} s (bound {bound}): the agent's egress proxy must bound asks per second"
            );
            assert!(n > 0, "{tag}: some are asked");
        }
        let (ds, reports) = reported(&mut sub).await;
        for tag in [".fast.test", ".late.test"] {
            assert_eq!(accounted(&reports, tag).1, N as u64, "{tag}: {ds:?}");
        }
        assert!(
            ds.iter()
                .any(|d| d.host.ends_with(".fast.test") && d.source == DecisionSource::Limit),
            "{ds:?}"
        );
    }
);

// Review of the one-request rule from a fresh context: what the proxy
// forwards of a request it accepts is its own decision, never the job's
// bytes read another way by the upstream. Hostile: a trailer section
// carrying `Host` and framing fields (an upstream that merges trailers
// into the head reads another Host and another framing), and (variant) a
// `Host` header the proxy judges equal to the URI's authority but that an
// upstream reads as written (`127.0.0.1%2e`, percent-encoded). Both now
// reach the upstream only as the proxy's own canonical head. Held (kept
// as cases): a tab before `chunked`, zero-padded chunk sizes (re-emitted
// canonical), a chunk size over 64 bits (cut, nothing after it), HTTP/1.0
// keep-alive with a second request, `Upgrade: websocket` (not forwarded:
// no upgrade, so no raw tunnel), a `Host` with userinfo (403). The layer
// is the agent's egress proxy (HTTP side).
both!(
    the_upstream_gets_the_proxys_head_only,
    |unprivileged| async move {
        let Some(a) = plain_agent(unprivileged, ClientOptions::default(), "").await else {
            return;
        };
        let rec = recorder().await;
        let p = rec.port;
        let auth = format!("127.0.0.1:{p}");
        let intent = egress(std::slice::from_ref(&auth), false, 1000);
        let absolute =
            format!("GET http://other.test:{p}/x HTTP/1.1\r\nHost: other.test:{p}\r\n\r\n");
        let post = |v: &str, headers: &str| {
            format!("POST http://{auth}/up HTTP/1.{v}\r\nHost: {auth}\r\n{headers}\r\n")
        };
        // (what, request, status, request line, body after the upstream's
        // head (None: cut, nothing past it), texts the upstream never sees)
        type Case<'a> = (
            &'a str,
            String,
            &'a str,
            &'a str,
            Option<&'a [u8]>,
            Vec<String>,
        );
        let cases: Vec<Case> = vec![
            (
                "trailers carrying Host and framing fields",
                format!(
                    "{}5\r\nhello\r\n0\r\nHost: other.test\r\nContent-Length: 9876543\r\nTransfer-Encoding: identity\r\n\r\n{absolute}",
                    post("1", "Transfer-Encoding: chunked\r\n")
                ),
                "HTTP/1.1 200",
                "POST /up HTTP/1.1",
                Some(b"5\r\nhello\r\n0\r\n\r\n"),
                // (No port has seven digits: the upstream's own port in the
                // Host line cannot match.)
                vec!["other.test".into(), "9876543".into(), "identity".into()],
            ),
            (
                "variant: a percent-encoded Host the proxy reads as the URI's",
                format!(
                    "GET http://{auth}/h HTTP/1.1\r\nHost: 127.0.0.1%2e:{p}\r\n\r\n{absolute}"
                ),
                "HTTP/1.1 200",
                "GET /h HTTP/1.1",
                Some(b""),
                vec!["%2e".into(), "other.test".into()],
            ),
            (
                "held: a tab before chunked, zero-padded sizes",
                format!(
                    "{}0005\r\nhello\r\n0000\r\n\r\n{absolute}",
                    post("1", "Transfer-Encoding:\tchunked\r\n")
                ),
                "HTTP/1.1 200",
                "POST /up HTTP/1.1",
                Some(b"5\r\nhello\r\n0\r\n\r\n"),
                // (`\r\n0005`: a port such as 10005 holds `0005`.)
                vec!["other.test".into(), "\r\n0005".into()],
            ),
            (
                "held: a chunk size over 64 bits",
                format!(
                    "{}10000000000000005\r\nhello\r\n0\r\n\r\n{absolute}",
                    post("1", "Transfer-Encoding: chunked\r\n")
                ),
                "",
                "POST /up HTTP/1.1",
                None,
                vec!["other.test".into(), "hello".into()],
            ),
            (
                "held: HTTP/1.0 keep-alive, then a second request",
                format!(
                    "{}hello{absolute}",
                    post("0", "Connection: keep-alive\r\nContent-Length: 5\r\n")
                ),
                "HTTP/1.1 200",
                "POST /up HTTP/1.0",
                Some(b"hello"),
                vec!["other.test".into(), "keep-alive".into()],
            ),
            (
                "held: Upgrade: websocket, then raw bytes",
                format!(
                    "GET http://{auth}/ws HTTP/1.1\r\nHost: {auth}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n{absolute}"
                ),
                "HTTP/1.1 200",
                "GET /ws HTTP/1.1",
                Some(b""),
                vec!["other.test".into(), "websocket".into(), "pgrade".into()],
            ),
        ];
        let raw = a.dir.join("raw.py");
        for (what, req, status, line, body, absent) in cases {
            rec.take().await;
            let (out, code) = a
                .sh(
                    &intent,
                    &format!(
                        "/usr/bin/python3 {} {}",
                        raw.display(),
                        hex_of(req.as_bytes())
                    ),
                )
                .await;
            assert_eq!(code, 0, "{what}: {out}");
            assert!(out.starts_with(status), "{what}: the job got {out:?}");
            let seen = rec.take().await;
            assert_eq!(seen.len(), 1, "{what}: {seen:?}");
            let got = &seen[0];
            let text = String::from_utf8_lossy(got);
            assert!(text.starts_with(&format!("{line}\r\n")), "{what}: {text:?}");
            if let Some(body) = body {
                let end = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                assert_eq!(
                    String::from_utf8_lossy(&got[end..]),
                    String::from_utf8_lossy(body),
                    "{what}: the agent's egress proxy forwarded other bytes: {text:?}"
                );
                assert!(
                    text.contains(&format!("\r\nHost: {auth}\r\n")),
                    "{what}: the upstream gets the proxy's canonical Host: {text:?}"
                );
            }
            for x in &absent {
                assert!(
                    !text.contains(x.as_str()),
                    "{what}: the agent's egress proxy forwarded {x:?}: {text:?}"
                );
            }
        }
        // Held: a Host with userinfo is another authority (403, nothing
        // connected).
        let req = format!("GET http://{auth}/ HTTP/1.1\r\nHost: x@{auth}\r\n\r\n");
        let (out, _) = a
            .sh(
                &intent,
                &format!(
                    "/usr/bin/python3 {} {}",
                    raw.display(),
                    hex_of(req.as_bytes())
                ),
            )
            .await;
        assert!(out.starts_with("HTTP/1.1 403"), "{out:?}");
        assert!(rec.take().await.is_empty());
    }
);

// "This host" is what the kernel routes locally, not only its interfaces'
// addresses: an address with a prefix on `lo` (`10.233.0.1/24`, as AnyIP
// setups do) makes the kernel answer on the whole prefix, so a name for
// `10.233.0.7` reached the host's own server although no interface has
// that address. A name's address is now this host's when the kernel takes
// it as local (a bind to it succeeds). The agent runs in a private network
// namespace (root only: it needs one) with that `lo` and a server on
// 0.0.0.0; as root and as uid 65534. Controls: the interface's own address
// by name (refused before too), and the prefix address by address
// pattern (200). The layer is the agent's egress policy.
both!(
    names_never_reach_addresses_the_kernel_routes_locally,
    |unprivileged| async move {
        if current_uid() != 0 {
            prerequisite_missing("root, for a network namespace with a local prefix on lo");
            return;
        }
        let a = agent_in_namespaces(
            unprivileged,
            "egress-anyip",
            ClientOptions::default(),
            "",
            "127.0.0.1 localhost\n10.233.0.7 anyip.test\n10.233.0.1 own.test\n",
            &["--mount", "--net", "--propagation", "private"],
            r#"mount --bind "$0" /etc/hosts && ip link set lo up && ip addr add 10.233.0.1/24 dev lo && { /usr/bin/python3 -m http.server 18099 --bind 0.0.0.0 --directory / >/dev/null 2>&1 </dev/null & } && sleep 0.5 && exec "$@""#,
        )
        .await;
        if !a.c.initialize_result().sandbox.enforceable {
            prerequisite_missing("an enforceable sandbox (a network namespace per job)");
            return;
        }
        let curl = |url: &str| {
            format!("curl -sS --noproxy '' -o /dev/null -w '%{{http_code}}' {url}; cat /dev/null")
        };
        for (what, host) in [
            ("a prefix address on lo", "anyip.test"),
            ("control: the interface's own address", "own.test"),
        ] {
            let intent = egress(&[format!("{host}:18099")], false, 1000);
            let (out, _) = a.sh(&intent, &curl(&format!("http://{host}:18099/"))).await;
            assert_eq!(
                out, "403",
                "{what}: the agent's egress policy must refuse a name for this host's own address"
            );
        }
        let intent = egress(&["10.233.0.7:18099".into()], false, 1000);
        let (out, _) = a.sh(&intent, &curl("http://10.233.0.7:18099/")).await;
        assert_eq!(out, "200", "positive control: by address pattern");
    }
);
