//! Egress by name (docs/PROTOCOL.md §8), through the real `executor` with
//! real clients inside the sandbox (curl, Python's urllib, git): the job's
//! only way out is the agent's proxy, which decides by name.
//!
//! The agent runs in a mount namespace of its own (`unshare -m`) with a
//! private `/etc/hosts` bound over the host's, so test names resolve to
//! the loopback servers of the test (and one to the metadata address);
//! the host's `/etc/hosts` is never touched. Each case runs as root and as
//! uid 65534 (`setpriv`), like the escape suite; it needs root for the
//! mount namespace (a prerequisite, failing under `EXECUTOR_REQUIRE_ALL`).

use executor_client::egress::{allow_hosts, EgressPolicy};
use executor_client::{Client, ClientOptions, ErrorCode};
use executor_protocol::methods as m;
use executor_protocol::types::exec::{ExecCommandParams, ExecResult};
use executor_protocol::types::network::*;
use executor_protocol::types::sandbox::{
    EgressIntent, FilesystemIntent, NetworkIntent, ReadRoots, SandboxIntent,
};
use executor_tests::http::{TestCa, TestServer};
use executor_tests::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The names of the private `/etc/hosts`.
const HOSTS: &str = "127.0.0.1 localhost\n\
127.0.0.1 mirror.test\n\
127.0.0.1 other.test\n\
127.0.0.1 ask-allow.test ask-deny.test ask-slow.test ask-keep.test ask-par.test\n\
169.254.169.254 meta.test\n";

struct Agent {
    c: Client,
    dir: PathBuf,
    audit: PathBuf,
}

/// An agent (as root, or as uid 65534) in its own mount namespace with the
/// private `/etc/hosts`, auditing to a file; `None` when this host cannot.
async fn agent(unprivileged: bool, options: ClientOptions, extra_config: &str) -> Option<Agent> {
    if current_uid() != 0 {
        prerequisite_missing("root, for a mount namespace with a private /etc/hosts");
        return None;
    }
    let dir = unique_tempdir(if unprivileged {
        "egress-user"
    } else {
        "egress-root"
    });
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let hosts = dir.join("hosts");
    std::fs::write(&hosts, HOSTS).unwrap();
    let audit = dir.join("audit.jsonl");
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!("[audit]\nfile = \"{}\"\n{extra_config}", audit.display()),
    )
    .unwrap();
    if unprivileged {
        chown_r(&dir, 65534);
    }
    let mut cmd = tokio::process::Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(r#"mount --bind "$0" /etc/hosts && exec "$@""#)
        .arg(&hosts);
    if unprivileged {
        cmd.args([
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
        ])
        .arg(executor_bin_for_any_user());
    } else {
        cmd.arg(executor_bin());
    }
    cmd.arg("--config").arg(&config);
    let c = Client::spawn(cmd, options).await.expect("agent");
    Some(Agent { c, dir, audit })
}

fn egress(hosts: &[String], ask: bool, ask_timeout_ms: u64) -> SandboxIntent {
    SandboxIntent {
        filesystem: FilesystemIntent {
            read: ReadRoots::All,
            ..Default::default()
        },
        network: NetworkIntent::AllowHosts(EgressIntent {
            allow_hosts: hosts.to_vec(),
            ask,
            ask_timeout_ms,
        }),
        required: true,
    }
}

impl Agent {
    async fn exec(&self, intent: &SandboxIntent, script: &str) -> ExecResult {
        self.exec_under(Some(intent), script).await
    }

    async fn exec_under(&self, intent: Option<&SandboxIntent>, script: &str) -> ExecResult {
        let p = ExecCommandParams {
            command: vec!["/bin/sh".into(), "-c".into(), format!("{script} 2>&1")],
            cwd: wire_path(Path::new("/")),
            env: path_env(),
            tty: false,
            yield_time_ms: 60_000,
            max_output_tokens: 1_000_000,
            sandbox_permissions: intent.cloned(),
            additional_permissions: None,
            additional_permissions_preapproved: false,
            justification: None,
            exec_approval_requirement: None,
            env_base: Default::default(),
        };
        self.c.exec_command(&p).await.expect("exec_command")
    }

    async fn sh(&self, intent: &SandboxIntent, script: &str) -> (String, i32) {
        let r = self.exec(intent, script).await;
        (r.output, r.exit_code.expect("finished"))
    }

    fn audit_lines(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.audit)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["method"] == "network/decision")
            .collect()
    }
}

/// The decisions notified so far (waiting up to a second for stragglers).
async fn decisions(sub: &mut executor_client::Subscription) -> Vec<NetworkDecision> {
    let mut out = Vec::new();
    while let Ok(Some(n)) = tokio::time::timeout(Duration::from_secs(1), sub.recv()).await {
        out.push(
            n.decode::<NetworkDecision>()
                .expect("network/decision params"),
        );
    }
    out
}

fn find<'a>(
    ds: &'a [NetworkDecision],
    host: &str,
    decision: EgressVerdict,
) -> Option<&'a NetworkDecision> {
    ds.iter().find(|d| d.host == host && d.decision == decision)
}

macro_rules! both {
    ($name:ident, $body:expr) => {
        mod $name {
            use super::*;
            #[tokio::test]
            async fn as_root() {
                ($body)(false).await;
            }
            #[tokio::test]
            async fn as_unprivileged_user() {
                ($body)(true).await;
            }
        }
    };
}

// An allowed name works over the HTTP proxy (curl, urllib), CONNECT with
// TLS (curl, urllib) and SOCKS5 (curl, remote names); another name is
// refused (403, SOCKS 0x02), a direct connect to the server fails, a name
// of the metadata address is refused by the destination policy; every
// decision is a notification and an audit line.
both!(
    names_on_the_list_and_nothing_else,
    |unprivileged| async move {
        let Some(a) = agent(unprivileged, ClientOptions::default(), "").await else {
            return;
        };
        let ca = TestCa::with_names(&a.dir, &["mirror.test", "other.test"]);
        std::fs::set_permissions(&ca.pem_path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let plain = TestServer::start().await;
        let tls = TestServer::start_tls(&ca).await;
        let (p, t) = (plain.addr.port(), tls.addr.port());
        let intent = egress(
            &[
                format!("MIRROR.test.:{p}"),
                format!("mirror.test:{t}"),
                format!("meta.test:{p}"),
            ],
            false,
            1000,
        );
        let mut sub = a.c.subscribe(&[m::NETWORK_DECISION]);
        let cacert = ca.pem_path.display();

        // The environment and the result name the proxy.
        let r = a
            .exec(
                &intent,
                "echo $HTTP_PROXY $https_proxy $ALL_PROXY $NO_PROXY",
            )
            .await;
        let proxy = r.egress.expect("egress in the result").proxy;
        let port: u16 = proxy.rsplit(':').next().unwrap().parse().unwrap();
        assert_eq!(
            r.output.trim(),
            format!("{proxy} {proxy} socks5h://127.0.0.1:{port} localhost,127.0.0.1,::1")
        );

        // curl over the HTTP proxy (absolute URI), the Host header as sent.
        let (out, code) = a
            .sh(&intent, &format!("curl -sS http://mirror.test:{p}/headers"))
            .await;
        assert_eq!(code, 0, "{out}");
        assert!(out.contains(&format!("host: mirror.test:{p}")), "{out}");
        assert!(
            !out.to_ascii_lowercase().contains("proxy-connection"),
            "{out}"
        );
        // CONNECT + TLS with the test CA.
        let (out, code) = a
            .sh(
                &intent,
                &format!("curl -sS --http1.1 --cacert {cacert} https://mirror.test:{t}/headers"),
            )
            .await;
        assert_eq!(code, 0, "{out}");
        assert!(out.contains(&format!("host: mirror.test:{t}")), "{out}");
        // Python's urllib, both ways, from the environment's proxies.
        let py = format!(
            "/usr/bin/python3 -c \"import ssl,urllib.request as u; \
         c=ssl.create_default_context(cafile='{cacert}'); \
         print(u.urlopen('http://mirror.test:{p}/bytes?n=7').read().__len__()); \
         print(u.urlopen('https://mirror.test:{t}/bytes?n=9', context=c).read().__len__())\""
        );
        let (out, code) = a.sh(&intent, &py).await;
        assert_eq!((out.as_str(), code), ("7\n9\n", 0), "{out}");
        // SOCKS5 with the name resolved by the agent.
        let (out, code) = a
            .sh(
                &intent,
                &format!("curl -sS -x \"$ALL_PROXY\" http://mirror.test:{p}/headers"),
            )
            .await;
        assert_eq!(code, 0, "{out}");
        assert!(out.contains(&format!("host: mirror.test:{p}")), "{out}");
        let (out, code) = a
        .sh(
            &intent,
            &format!("curl -sS --cacert {cacert} --socks5-hostname 127.0.0.1:${{HTTP_PROXY##*:}} https://mirror.test:{t}/bytes?n=3"),
        )
        .await;
        assert_eq!((out.as_str(), code), ("xxx", 0), "{out:?}");

        // Another name: 403 with the one-line body; CONNECT refused too.
        let (out, code) = a
            .sh(
                &intent,
                &format!("curl -sS -w ' %{{http_code}}' http://other.test:{p}/headers"),
            )
            .await;
        assert_eq!(code, 0, "{out}");
        assert_eq!(
            out,
            format!(
                "executor: egress to other.test:{p} is not allowed by the sandbox intent\n 403"
            )
        );
        let (out, code) = a
            .sh(
                &intent,
                &format!("curl -sS --cacert {cacert} https://other.test:{t}/headers"),
            )
            .await;
        assert_ne!(code, 0, "{out}");
        assert!(out.contains("403"), "{out}");
        // The allowed name on another port.
        let (out, _) = a
            .sh(&intent, "curl -sS -w ' %{http_code}' http://mirror.test/")
            .await;
        assert!(out.ends_with(" 403"), "{out}");
        // SOCKS: refused by ruleset (curl reports the reply code).
        let (out, code) = a
            .sh(
                &intent,
                &format!("curl -sS -x \"$ALL_PROXY\" http://other.test:{p}/headers"),
            )
            .await;
        assert_ne!(code, 0, "{out}");
        assert!(out.contains("(2)") || out.contains("not allowed"), "{out}");
        // A Host header naming another authority than the URI.
        let (out, _) = a
        .sh(
            &intent,
            &format!("curl -sS -w ' %{{http_code}}' -H 'Host: other.test:{p}' http://mirror.test:{p}/headers"),
        )
        .await;
        assert!(out.ends_with(" 403") && out.contains("differs"), "{out}");
        // Direct: the server's address does not exist for the job.
        let (out, code) = a
            .sh(
                &intent,
                &format!("curl -sS --noproxy '*' --max-time 5 http://127.0.0.1:{p}/headers"),
            )
            .await;
        assert_ne!(code, 0, "direct connect must fail: {out}");
        assert!(!out.contains("host:"), "{out}");
        let r = a
            .exec_under(
                None,
                &format!("curl -sS --noproxy '*' http://127.0.0.1:{p}/headers"),
            )
            .await;
        assert!(r.output.contains("host:"), "positive control: {}", r.output);
        // Allowed by the intent, refused by the destination policy.
        let (out, _) = a
            .sh(
                &intent,
                &format!("curl -sS -w ' %{{http_code}}' http://meta.test:{p}/"),
            )
            .await;
        assert!(out.ends_with(" 403"), "{out}");
        assert!(out.contains("metadata"), "{out}");

        let ds = decisions(&mut sub).await;
        let allow = find(&ds, "mirror.test", EgressVerdict::Allow).expect("allow reported");
        assert_eq!(allow.source, DecisionSource::Intent);
        assert_eq!(allow.addresses, vec!["127.0.0.1".to_string()]);
        let deny = find(&ds, "other.test", EgressVerdict::Deny).expect("deny reported");
        assert_eq!(deny.source, DecisionSource::Intent);
        let meta = find(&ds, "meta.test", EgressVerdict::Deny).expect("policy deny reported");
        assert_eq!(meta.source, DecisionSource::Policy);
        assert_eq!(meta.addresses, vec!["169.254.169.254".to_string()]);
        assert!(
            ds.iter().all(|d| d.process_id.starts_with("proc-")),
            "{ds:?}"
        );
        let lines = a.audit_lines();
        for (host, decision, source) in [
            ("mirror.test", "allow", "intent"),
            ("other.test", "deny", "intent"),
            ("meta.test", "deny", "policy"),
        ] {
            assert!(
                lines.iter().any(|l| l["host"] == host
                    && l["decision"] == decision
                    && l["source"] == source),
                "audit line for {host} {decision}: {lines:?}"
            );
        }
        let meta_line = lines.iter().find(|l| l["host"] == "meta.test").unwrap();
        assert_eq!(meta_line["outcome"], "policy_denied");
    }
);

// git over http:// through the proxy: a dumb-HTTP clone of a served repo
// would need a git server; `git ls-remote` against the test server shows
// the request reaches the allowed name through the proxy (and is refused
// for another).
both!(git_uses_the_proxy, |unprivileged| async move {
    let Some(a) = agent(unprivileged, ClientOptions::default(), "").await else {
        return;
    };
    if !Path::new("/usr/local/bin/git").exists() && !Path::new("/usr/bin/git").exists() {
        prerequisite_missing("git");
        return;
    }
    let plain = TestServer::start().await;
    let p = plain.addr.port();
    let intent = egress(&[format!("mirror.test:{p}")], false, 1000);
    let mut sub = a.c.subscribe(&[m::NETWORK_DECISION]);
    let (out, code) = a
        .sh(
            &intent,
            &format!(
                "HOME=/tmp GIT_TERMINAL_PROMPT=0 git ls-remote http://mirror.test:{p}/repo.git"
            ),
        )
        .await;
    // The test server is not a git server: git reached it and got its
    // answer (404: not found), not a proxy refusal.
    assert_ne!(code, 0, "{out}");
    assert!(!out.contains("403") && out.contains("not found"), "{out}");
    let (out, code) = a
        .sh(
            &intent,
            &format!(
                "HOME=/tmp GIT_TERMINAL_PROMPT=0 git ls-remote http://other.test:{p}/repo.git"
            ),
        )
        .await;
    assert_ne!(code, 0);
    assert!(out.contains("403"), "{out}");
    let ds = decisions(&mut sub).await;
    assert!(
        find(&ds, "mirror.test", EgressVerdict::Allow).is_some(),
        "{ds:?}"
    );
    assert!(
        find(&ds, "other.test", EgressVerdict::Deny).is_some(),
        "{ds:?}"
    );
});

// `ask`: the client's callback decides what is not on the list: allow,
// deny, no answer in time, and a `process` scope that is asked once.
both!(
    ask_puts_unlisted_names_to_the_client,
    |unprivileged| async move {
        let asked = Arc::new(AtomicU32::new(0));
        let count = asked.clone();
        let policy = EgressPolicy::new(move |req: PolicyRequestParams| {
            count.fetch_add(1, Ordering::SeqCst);
            async move {
                let verdict = |allow: bool, scope| PolicyRequestResult {
                    decision: if allow {
                        EgressVerdict::Allow
                    } else {
                        EgressVerdict::Deny
                    },
                    scope,
                };
                assert!(req.process_id.starts_with("proc-"));
                match req.host.as_str() {
                    "ask-allow.test" => verdict(true, EgressScope::Once),
                    "ask-keep.test" => verdict(true, EgressScope::Process),
                    "ask-slow.test" => {
                        tokio::time::sleep(Duration::from_secs(5)).await;
                        verdict(true, EgressScope::Once)
                    }
                    "ask-par.test" => {
                        // Long enough for parallel connections to arrive
                        // while the question is pending.
                        tokio::time::sleep(Duration::from_millis(1500)).await;
                        verdict(true, EgressScope::Once)
                    }
                    _ => verdict(false, EgressScope::Once),
                }
            }
        });
        let options = ClientOptions {
            egress_policy: Some(policy),
            ..Default::default()
        };
        let Some(a) = agent(unprivileged, options, "").await else {
            return;
        };
        let plain = TestServer::start().await;
        let p = plain.addr.port();
        let intent = egress(&[format!("mirror.test:{p}")], true, 3000);
        let mut sub = a.c.subscribe(&[m::NETWORK_DECISION]);
        let code_of = |host: &str| {
            format!("curl -sS -o /dev/null -w '%{{http_code}}' http://{host}:{p}/headers")
        };
        let (out, _) = a.sh(&intent, &code_of("ask-allow.test")).await;
        assert_eq!(out, "200");
        let (out, _) = a.sh(&intent, &code_of("ask-deny.test")).await;
        assert_eq!(out, "403");
        let before = asked.load(Ordering::SeqCst);
        let (out, _) = a.sh(&intent, &code_of("mirror.test")).await;
        assert_eq!(out, "200", "on the list: not asked");
        assert_eq!(asked.load(Ordering::SeqCst), before);
        let (out, _) = a.sh(&intent, &code_of("ask-slow.test")).await;
        assert_eq!(out, "403", "no answer within ask_timeout_ms");
        // `process` scope: asked once for the job's lifetime (two requests in
        // one job), and asked again by the next job.
        let before = asked.load(Ordering::SeqCst);
        let twice = format!(
            "{} ; echo; {}",
            code_of("ask-keep.test"),
            code_of("ask-keep.test")
        );
        let (out, _) = a.sh(&intent, &twice).await;
        assert_eq!(out, "200\n200");
        assert_eq!(asked.load(Ordering::SeqCst), before + 1);
        let (out, _) = a.sh(&intent, &code_of("ask-keep.test")).await;
        assert_eq!(out, "200");
        assert_eq!(asked.load(Ordering::SeqCst), before + 2);
        // Parallel connections to one host:port wait for one answer.
        let before = asked.load(Ordering::SeqCst);
        let par = format!(
            "{} & {} & {} & wait",
            code_of("ask-par.test"),
            code_of("ask-par.test"),
            code_of("ask-par.test")
        );
        let (out, _) = a.sh(&intent, &par).await;
        assert_eq!(out, "200200200");
        assert_eq!(
            asked.load(Ordering::SeqCst),
            before + 1,
            "one question for three parallel connections"
        );

        let ds = decisions(&mut sub).await;
        let allow = find(&ds, "ask-allow.test", EgressVerdict::Allow).expect("allow");
        assert_eq!(allow.source, DecisionSource::Client);
        let deny = find(&ds, "ask-deny.test", EgressVerdict::Deny).expect("deny");
        assert_eq!(deny.source, DecisionSource::Client);
        let slow = find(&ds, "ask-slow.test", EgressVerdict::Deny).expect("timeout");
        assert_eq!(slow.source, DecisionSource::Timeout);
        assert!(a
            .audit_lines()
            .iter()
            .any(|l| l["host"] == "ask-slow.test" && l["source"] == "timeout"));
    }
);

// `ask` with a client that did not declare `agent_requests`: denied, never
// asked.
both!(
    ask_without_the_capability_denies,
    |unprivileged| async move {
        let Some(a) = agent(unprivileged, ClientOptions::default(), "").await else {
            return;
        };
        let plain = TestServer::start().await;
        let p = plain.addr.port();
        let intent = egress(&[format!("mirror.test:{p}")], true, 10_000);
        let mut sub = a.c.subscribe(&[m::NETWORK_DECISION]);
        let started = std::time::Instant::now();
        let (out, _) = a
            .sh(
                &intent,
                &format!("curl -sS -o /dev/null -w '%{{http_code}}' http://ask-allow.test:{p}/"),
            )
            .await;
        assert_eq!(out, "403");
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "not held for ask_timeout_ms"
        );
        let ds = decisions(&mut sub).await;
        let d = find(&ds, "ask-allow.test", EgressVerdict::Deny).expect("deny");
        assert_eq!(d.source, DecisionSource::NoClient);
    }
);

// `max_egress_connections`: past it, a new connection gets 503 (HTTP) or
// 0x01 (SOCKS) while the held ones still work.
both!(connections_are_bounded_per_job, |unprivileged| async move {
    let Some(a) = agent(
        unprivileged,
        ClientOptions::default(),
        "[limits]\nmax_egress_connections = 2\n",
    )
    .await
    else {
        return;
    };
    assert_eq!(a.c.initialize_result().limits.max_egress_connections, 2);
    let plain = TestServer::start().await;
    let p = plain.addr.port();
    let intent = egress(&[format!("mirror.test:{p}")], false, 1000);
    let py = format!(
        r#"/usr/bin/python3 -c "
import os, socket
port = int(os.environ['HTTP_PROXY'].rsplit(':', 1)[1])
def tunnel():
    s = socket.create_connection(('127.0.0.1', port))
    s.sendall(b'CONNECT mirror.test:{p} HTTP/1.1\r\n\r\n')
    return s, s.recv(200).split(b' ')[1].decode()
held = [tunnel() for _ in range(2)]
third = tunnel()
socks = socket.create_connection(('127.0.0.1', port))
socks.sendall(b'\x05\x01\x00')
socks.recv(2)
socks.sendall(b'\x05\x01\x00\x03\x0bmirror.test' + ({p}).to_bytes(2, 'big'))
print(held[0][1], held[1][1], third[1], socks.recv(10)[1])
""#
    );
    let (out, code) = a.sh(&intent, &py).await;
    assert_eq!((out.trim(), code), ("200 200 503 1", 0), "{out}");
});

// A bad pattern is invalid_params naming its index; allow_hosts with
// allow_tcp_connect is refused; nothing runs.
#[tokio::test]
async fn bad_intents_are_refused_naming_the_field() {
    let c = local_client().await;
    let mut intent = egress(&["ok.test".into(), "bad host".into()], false, 1000);
    let p = ProcessStartParamsBuilder::sh("true", intent.clone());
    let e = remote(c.start(&p).await.unwrap_err());
    assert_eq!(e.code, ErrorCode::InvalidParams, "{e:?}");
    assert_eq!(
        e.data_get("field").and_then(|v| v.as_str()),
        Some("sandbox.network.allow_hosts.1"),
        "{e:?}"
    );
    intent.network = allow_hosts(["*.*.test"], false);
    let e = remote(
        c.start(&ProcessStartParamsBuilder::sh("true", intent))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, ErrorCode::InvalidParams, "{e:?}");
    let raw = rmpv::Value::Map(vec![
        ("argv".into(), rmpv::Value::Array(vec!["true".into()])),
        ("cwd".into(), "/".into()),
        (
            "sandbox".into(),
            rmpv::Value::Map(vec![(
                "network".into(),
                rmpv::Value::Map(vec![
                    (
                        "allow_hosts".into(),
                        rmpv::Value::Array(vec!["a.test".into()]),
                    ),
                    (
                        "allow_tcp_connect".into(),
                        rmpv::Value::Array(vec![443.into()]),
                    ),
                ]),
            )]),
        ),
    ]);
    let e = remote(
        c.start_call(m::PROCESS_START, &raw)
            .await
            .unwrap()
            .result::<rmpv::Value>()
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, ErrorCode::InvalidParams, "{e:?}");
    assert!(e.message.contains("allow_tcp_connect"), "{}", e.message);
}

/// `process/start` params for a shell line under `intent`.
struct ProcessStartParamsBuilder;

impl ProcessStartParamsBuilder {
    fn sh(
        script: &str,
        intent: SandboxIntent,
    ) -> executor_protocol::types::process::ProcessStartParams {
        let mut p = executor_protocol::types::process::ProcessStartParams::new(
            vec!["/bin/sh".into(), "-c".into(), script.into()],
            "/",
            path_env(),
        );
        p.sandbox = Some(intent);
        p
    }
}
