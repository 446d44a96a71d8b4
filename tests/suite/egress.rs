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
//! A name never reaches the host's own addresses unless an address says so
//! (§8), so the agent's `http.allow` names 127.0.0.0/8 for these names.

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

pub(crate) struct Agent {
    pub(crate) c: Client,
    pub(crate) dir: PathBuf,
    pub(crate) audit: PathBuf,
}

/// The configuration every agent of this file has: the test names point to
/// loopback servers, which a name reaches only when an address entry of
/// `http.allow` names them.
const LOOPBACK_ALLOWED: &str = "[http]\nallow = [\"127.0.0.0/8\"]\n";

/// An agent (as root, or as uid 65534) in its own mount namespace with the
/// private `/etc/hosts`, auditing to a file; `None` when this host cannot.
async fn agent(unprivileged: bool, options: ClientOptions, extra_config: &str) -> Option<Agent> {
    agent_with_hosts(
        unprivileged,
        options,
        &format!("{LOOPBACK_ALLOWED}{extra_config}"),
        HOSTS,
    )
    .await
}

/// As [`agent`], with `hosts` as the private `/etc/hosts` and exactly
/// `extra_config` after the audit section.
pub(crate) async fn agent_with_hosts(
    unprivileged: bool,
    options: ClientOptions,
    extra_config: &str,
    hosts_text: &str,
) -> Option<Agent> {
    if current_uid() != 0 {
        prerequisite_missing("root, for a mount namespace with a private /etc/hosts");
        return None;
    }
    let tag = if unprivileged {
        "egress-user"
    } else {
        "egress-root"
    };
    Some(
        agent_in_namespaces(
            unprivileged,
            tag,
            options,
            extra_config,
            hosts_text,
            &["--mount", "--propagation", "private"],
            r#"mount --bind "$0" /etc/hosts && exec "$@""#,
        )
        .await,
    )
}

/// An agent (as root, or as uid 65534 through `setpriv`) started by
/// `unshare UNSHARE -- sh -c SCRIPT HOSTS agent --config …` in a fresh
/// directory `tag`: `script` gets the file holding `hosts_text` as `$0`
/// (to bind on /etc/hosts) and ends by `exec "$@"`; the config is the audit
/// section and exactly `extra_config`.
pub(crate) async fn agent_in_namespaces(
    unprivileged: bool,
    tag: &str,
    options: ClientOptions,
    extra_config: &str,
    hosts_text: &str,
    unshare: &[&str],
    script: &str,
) -> Agent {
    let dir = unique_tempdir(tag);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let hosts = dir.join("hosts");
    std::fs::write(&hosts, hosts_text).unwrap();
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
    cmd.args(unshare)
        .args(["--", "sh", "-c"])
        .arg(script)
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
    Agent { c, dir, audit }
}

pub(crate) fn egress(hosts: &[String], ask: bool, ask_timeout_ms: u64) -> SandboxIntent {
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
        workspace_roots: None,
    }
}

impl Agent {
    pub(crate) async fn exec(&self, intent: &SandboxIntent, script: &str) -> ExecResult {
        self.exec_under(Some(intent), script).await
    }

    pub(crate) async fn exec_under(
        &self,
        intent: Option<&SandboxIntent>,
        script: &str,
    ) -> ExecResult {
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
            limits: None,
        };
        self.c.call(&p).await.expect("exec_command")
    }

    pub(crate) async fn sh(&self, intent: &SandboxIntent, script: &str) -> (String, i32) {
        let r = self.exec(intent, script).await;
        (r.output, r.exit_code.expect("finished"))
    }

    pub(crate) fn audit_lines(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.audit)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["method"] == "network/decision")
            .collect()
    }
}

/// The decisions notified so far (waiting up to a second for stragglers).
pub(crate) async fn decisions(sub: &mut executor_client::Subscription) -> Vec<NetworkDecision> {
    let mut out = Vec::new();
    while let Ok(Some(n)) = tokio::time::timeout(Duration::from_secs(1), sub.recv()).await {
        out.push(
            n.decode::<NetworkDecision>()
                .expect("network/decision params"),
        );
    }
    out
}

pub(crate) fn find<'a>(
    ds: &'a [NetworkDecision],
    host: &str,
    decision: EgressVerdict,
) -> Option<&'a NetworkDecision> {
    ds.iter().find(|d| d.host == host && d.decision == decision)
}

use executor_tests::root_and_unprivileged as both;

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
        assert!(out.contains("response 403"), "{out}");
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
    // (The status as git says it: the URL's port may contain "403".)
    assert!(
        !out.contains("error: 403") && out.contains("not found"),
        "{out}"
    );
    let (out, code) = a
        .sh(
            &intent,
            &format!(
                "HOME=/tmp GIT_TERMINAL_PROMPT=0 git ls-remote http://other.test:{p}/repo.git"
            ),
        )
        .await;
    assert_ne!(code, 0);
    assert!(out.contains("error: 403"), "{out}");
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

/// The CPU time (user + system, in clock ticks) of the process whose
/// command line names `marker`: the agent of one test.
fn cpu_ticks_of(marker: &Path) -> u64 {
    let marker = marker.to_string_lossy().into_owned();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let args = String::from_utf8_lossy(&cmdline);
        if !args.contains(&marker) || args.contains("sandbox-exec") || args.starts_with("unshare") {
            continue;
        }
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        // Fields after the command's closing parenthesis; utime, stime are 14, 15.
        let rest = &stat[stat.rfind(')').map_or(0, |i| i + 2)..];
        let f: Vec<&str> = rest.split(' ').collect();
        if f.len() > 13 {
            return f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
        }
    }
    panic!("no agent process names {marker}");
}

// A relay whose job does not read sleeps: the upstream socket still has
// bytes, the pipe is full (its slots fill with partial pages before it
// holds its size in bytes) and the job's socket is full. The relay once
// took `EAGAIN` from the full pipe for an empty socket and, tokio still
// holding the socket readable, retried it in a loop: a core spent for
// nothing while the job was slow (and, on 2 cores, a proxied download at
// a few percent of its speed). Then every byte arrives, in order.
both!(
    a_relay_whose_job_does_not_read_sleeps,
    |unprivileged| async move {
        let Some(a) = agent(unprivileged, ClientOptions::default(), "").await else {
            return;
        };
        const BURST: usize = 32 << 20;
        // Sent with sendfile from the page cache, as a file server does.
        let file = a.dir.join("burst.bin");
        let burst: Vec<u8> = (0..BURST).map(|i| (i % 251) as u8).collect();
        std::fs::write(&file, &burst).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let p = listener.local_addr().unwrap().port();
        let (sending_tx, sending) = std::sync::mpsc::channel();
        let server = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let f = std::fs::File::open(&file).unwrap();
            sending_tx.send(()).unwrap();
            let mut off: libc::off_t = 0;
            while (off as usize) < BURST {
                let left = BURST - off as usize;
                match nix::sys::sendfile::sendfile(&s, &f, Some(&mut off), left) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        });
        let intent = egress(&[format!("mirror.test:{p}")], false, 1000);
        let py = format!(
            r#"/usr/bin/python3 -c "
import os, socket, time
port = int(os.environ['HTTP_PROXY'].rsplit(':', 1)[1])
s = socket.create_connection(('127.0.0.1', port), timeout=60)
s.sendall(b'CONNECT mirror.test:{p} HTTP/1.1\r\n\r\n')
head = b''
while b'\r\n\r\n' not in head:
    head += s.recv(1)
time.sleep(4)
burst = bytes(i % 251 for i in range({BURST}))
got = bytearray()
while len(got) < {BURST}:
    b = s.recv(1 << 20)
    if not b:
        break
    got += b
print(head.split(b' ')[1].decode(), len(got), got == burst)
""#
        );
        let measure = async {
            tokio::task::spawn_blocking(move || sending.recv_timeout(Duration::from_secs(30)))
                .await
                .unwrap()
                .expect("the job connected");
            // Past the burst's first moments, well inside the job's sleep.
            tokio::time::sleep(Duration::from_millis(800)).await;
            let before = cpu_ticks_of(&a.dir);
            tokio::time::sleep(Duration::from_secs(2)).await;
            cpu_ticks_of(&a.dir) - before
        };
        let ((out, code), spent) = tokio::join!(a.sh(&intent, &py), measure);
        assert_eq!(
            (out.trim(), code),
            (format!("200 {BURST} True").as_str(), 0),
            "{out}"
        );
        // Clock ticks are 1/100 s: a spinning relay spends most of the 2 s
        // (about 200); a sleeping one next to nothing.
        assert!(
            spent < 40,
            "the agent spent {spent} ticks of CPU in 2 s while its only job slept"
        );
        server.join().unwrap();
    }
);

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

/// What the player does with a case, and what the judge expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    /// Send, shut down the write side, read the answer: a refusal, an
    /// answer or a close; never a hang.
    Hostile,
    /// A good absolute-URI request for `/bytes?n=5` (no shutdown: the test
    /// server drops a half-closed connection): 200 and the bytes.
    GoodHttp,
    /// A good SOCKS5 request and the same GET through it.
    GoodSocks,
    /// Positive control of the hang detector: a head that never ends,
    /// without a shutdown; the player waits 1 s and must see nothing.
    Held,
}

/// Requests to start the mutations from (`auth`: the allowed host:port).
fn templates(auth: &str) -> Vec<Vec<u8>> {
    let (host, port) = auth.rsplit_once(':').unwrap();
    let port: u16 = port.parse().unwrap();
    let get =
        format!("GET http://{auth}/bytes?n=5 HTTP/1.1\r\nHost: {auth}\r\nAccept: */*\r\n\r\n");
    let mut socks_name = vec![5, 1, 0, 5, 1, 0, 3, host.len() as u8];
    socks_name.extend_from_slice(host.as_bytes());
    socks_name.extend_from_slice(&port.to_be_bytes());
    let mut socks_v4 = vec![5, 2, 0, 2, 5, 1, 0, 1, 127, 0, 0, 2];
    socks_v4.extend_from_slice(&port.to_be_bytes());
    let mut socks_v6 = vec![5, 1, 0, 5, 1, 0, 4];
    socks_v6.extend_from_slice(&[0; 15]);
    socks_v6.push(1);
    socks_v6.extend_from_slice(&port.to_be_bytes());
    vec![
        get.clone().into_bytes(),
        format!("CONNECT {auth} HTTP/1.1\r\nHost: {auth}\r\n\r\n").into_bytes(),
        format!("POST http://{auth}/echo HTTP/1.0\r\nContent-Length: 4\r\n\r\nbody").into_bytes(),
        format!("CONNECT other.test:{port} HTTP/1.1\r\n\r\n").into_bytes(),
        socks_name,
        socks_v4,
        socks_v6,
    ]
}

/// Heads no parser should accept as they stand.
const NASTY: &[&str] = &[
    "GET http://[::1 HTTP/1.1\r\n\r\n",
    "GET http://a b/ HTTP/1.1\r\n\r\n",
    "GET http://%41%42/ HTTP/1.1\r\n\r\n",
    "GET http://user:pw@127.0.0.2:{p}/ HTTP/1.1\r\n\r\n",
    "GET http://127.0.0.2:{p}/ HTTP/1.1\r\nHost: 127.0.0.2:{p}\r\nHost: x\r\n\r\n",
    "GET http://127.0.0.2:99999/ HTTP/1.1\r\n\r\n",
    "GET http://127.0.0.2:-1/ HTTP/1.1\r\n\r\n",
    "GET http://127.0.0.2:{p}/ HTTP/9.9\r\n\r\n",
    "GET https://127.0.0.2:{p}/ HTTP/1.1\r\n\r\n",
    "GET /relative HTTP/1.1\r\nHost: 127.0.0.2:{p}\r\n\r\n",
    "CONNECT :0 HTTP/1.1\r\n\r\n",
    "CONNECT 127.0.0.2 HTTP/1.1\r\n\r\n",
    "CONNECT [fe80::1%eth0]:80 HTTP/1.1\r\n\r\n",
    "CONNECT [::ffff:169.254.169.254]:80 HTTP/1.1\r\n\r\n",
    "CONNECT 0x7f.1:{p} HTTP/1.1\r\n\r\n",
    "CONNECT xn--:80 HTTP/1.1\r\n\r\n",
    "CONNECT a..b:80 HTTP/1.1\r\n\r\n",
    "CONNECT aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.test:80 HTTP/1.1\r\n\r\n",
    "CONNECT mirror\u{0}.test:80 HTTP/1.1\r\n\r\n",
    "CONNECT ex\u{e4}mple.test:80 HTTP/1.1\r\n\r\n",
    "\r\n\r\n",
    " \r\n\r\n",
    "GET\r\n\r\n",
    "GET http://127.0.0.2:{p}/\r\n\r\n",
    "GET  http://127.0.0.2:{p}/  HTTP/1.1 \r\n\r\n",
    "GET http://127.0.0.2:{p}/ HTTP/1.1\r\nNo-colon-header\r\n\r\n",
    "GET http://127.0.0.2:{p}/ HTTP/1.1\r\n: empty-name\r\n\r\n",
    "GET http://127.0.0.2:{p}/ HTTP/1.1\r\n Folded: header\r\n\r\n",
    "GET http://127.0.0.2:{p}/ HTTP/1.1\nHost: 127.0.0.2:{p}\n\n",
];

/// Byte strings the mutations insert.
const SPECIAL: &[&[u8]] = &[
    b":", b"/", b"[", b"]", b"%", b"@", b" ", b"\r\n", b"\0", b"\xff", b"\x05", b"..", b"\t",
];

fn mutate(r: &mut Rng, mut b: Vec<u8>) -> Vec<u8> {
    for _ in 0..1 + r.below(8) {
        let at = r.below(b.len() + 1);
        match r.below(4) {
            0 if at < b.len() => b[at] = r.next_u64() as u8,
            1 if at < b.len() => {
                b.remove(at);
            }
            2 => {
                let s = r.pick(SPECIAL).to_vec();
                b.splice(at..at, s);
            }
            _ => {
                let n = r.below(6);
                let junk: Vec<u8> = (0..n).map(|_| r.next_u64() as u8).collect();
                b.splice(at..at, junk);
            }
        }
    }
    b
}

/// One hostile case.
fn hostile(r: &mut Rng, auth: &str, port: u16) -> Vec<u8> {
    let t = templates(auth);
    let base = r.pick(&t).clone();
    match r.below(8) {
        0 => base[..r.below(base.len())].to_vec(),
        1 | 2 => mutate(r, base),
        3 => {
            let n = r.below(600);
            let mut b: Vec<u8> = (0..n).map(|_| r.next_u64() as u8).collect();
            if r.below(2) == 0 && !b.is_empty() {
                b[0] = 5;
            }
            b
        }
        4 => {
            // Over the 64 KiB head: one huge header, a huge URI, or many
            // headers.
            let big = 65_536 + r.below(150_000);
            match r.below(3) {
                0 => format!(
                    "GET http://{auth}/ HTTP/1.1\r\nX-Big: {}\r\n\r\n",
                    "a".repeat(big)
                ),
                1 => format!("GET http://{auth}/{} HTTP/1.1\r\n\r\n", "b".repeat(big)),
                _ => format!(
                    "GET http://{auth}/ HTTP/1.1\r\n{}\r\n",
                    "H: v\r\n".repeat(200 + r.below(20_000))
                ),
            }
            .into_bytes()
        }
        5 => r.pick(NASTY).replace("{p}", &port.to_string()).into_bytes(),
        6 => {
            // SOCKS5 with random fields.
            let nmethods = r.below(256);
            let mut b = vec![5, nmethods as u8];
            b.extend((0..r.below(nmethods + 2)).map(|_| r.below(3) as u8));
            let cmd = *r.pick(&[1u8, 1, 2, 3, 0, 9]);
            let atyp = *r.pick(&[1u8, 3, 4, 0, 2, 5, 0xff]);
            b.extend_from_slice(&[*r.pick(&[5u8, 5, 4]), cmd, 0, atyp]);
            let len = r.below(256);
            b.push(len as u8);
            b.extend((0..r.below(len + 4)).map(|_| r.next_u64() as u8));
            b
        }
        _ => {
            // Two templates spliced.
            let other = r.pick(&t).clone();
            let mut b = base[..r.below(base.len())].to_vec();
            b.extend_from_slice(&other[r.below(other.len())..]);
            b
        }
    }
}

/// The cases for the player: `[u32 len][u8 case][bytes]` each. Hostile
/// cases aim at the sink (`auth`, `port`), good ones at the HTTP server.
fn fuzz_cases(
    seed: u64,
    n: usize,
    (auth, port): (&str, u16),
    good: &str,
) -> (Vec<u8>, Vec<(Case, Vec<u8>)>) {
    let mut r = Rng(seed);
    let t = templates(good);
    // Through SOCKS the head is not rewritten: the server is to close.
    let mut good_socks = t[4].clone();
    good_socks.extend_from_slice(
        &String::from_utf8_lossy(&t[0])
            .replace("\r\n\r\n", "\r\nConnection: close\r\n\r\n")
            .into_bytes(),
    );
    let mut cases = vec![(
        Case::Held,
        b"GET http://127.0.0.2/ HTTP/1.1\r\nX: ".to_vec(),
    )];
    for i in 0..n {
        cases.push(match i % 25 {
            0 => (Case::GoodHttp, t[0].clone()),
            12 => (Case::GoodSocks, good_socks.clone()),
            _ => (Case::Hostile, hostile(&mut r, auth, port)),
        });
    }
    cases.push((Case::GoodHttp, t[0].clone()));
    let mut file = Vec::new();
    for (case, bytes) in &cases {
        file.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        file.push(*case as u8);
        file.extend_from_slice(bytes);
    }
    (file, cases)
}

/// Plays the cases against the job's proxy: one line per case, `i kind
/// hex total` (kind: `data`, `closed`, `reset` or `hang`; hex: the first
/// 40 and the last 8 bytes of the answer).
const PLAYER: &str = r#"
import os, socket, struct, sys, time
port = int(os.environ['HTTP_PROXY'].rsplit(':', 1)[1])
data = open(sys.argv[1], 'rb').read()
i = off = 0
while off < len(data):
    n, case = struct.unpack('>IB', data[off:off + 5]); off += 5
    req = data[off:off + n]; off += n
    s = socket.create_connection(('127.0.0.1', port))
    s.settimeout(1 if case == 3 else 10)
    got, kind = b'', 'closed'
    try:
        s.sendall(req)
        if case == 0:
            try:
                s.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        while True:
            b = s.recv(65536)
            if not b:
                break
            got += b
    except socket.timeout:
        kind = 'hang'
    except (ConnectionResetError, BrokenPipeError):
        kind = 'reset'
    if got and kind != 'hang':
        kind = 'data'
    s.close()
    print(i, kind, (got[:40] + got[-8:]).hex() if got else '-', len(got), flush=True)
    i += 1
"#;

/// A destination that reads until EOF, then answers and closes: a tunnel
/// a hostile case happens to open ends as soon as the job's side does.
async fn sink() -> (u16, tokio::task::JoinHandle<()>) {
    use tokio::io::AsyncWriteExt;
    let l = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut s, &mut tokio::io::sink()).await;
                let _ = s.write_all(b"HTTP/1.0 200 OK\r\n\r\nsink").await;
            });
        }
    });
    (port, task)
}

/// Hostile HTTP-proxy and SOCKS5 requests (truncated, mutated, random,
/// oversized, hand-picked nasty heads, random SOCKS fields) against the
/// real proxy: each connection gets a refusal or an answer or is closed,
/// never a hang, the good request interleaved every 25 cases is served
/// each time, and the agent neither panics nor stops answering. The held
/// case is the positive control of the hang detector.
#[tokio::test]
async fn hostile_proxy_requests_are_refused_or_closed_and_the_proxy_keeps_serving() {
    if !Path::new("/usr/bin/python3").exists() {
        prerequisite_missing("python3");
        return;
    }
    let dir = unique_tempdir("egress-fuzz");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let stderr = dir.join("agent.stderr");
    let mut cmd = tokio::process::Command::new(executor_bin());
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .kill_on_drop(true);
    let child = cmd.spawn().unwrap();
    let c = Client::from_child(child, "executor", ClientOptions::default())
        .await
        .unwrap();
    if !c.initialize_result().sandbox.enforceable {
        prerequisite_missing("an enforceable sandbox");
        return;
    }
    let server = TestServer::start_on("127.0.0.2:0").await;
    let good = format!("127.0.0.2:{}", server.addr.port());
    let (port, sink) = sink().await;
    let auth = format!("127.0.0.2:{port}");
    let (file, cases) = fuzz_cases(0x5eed_e9e5, 1500, (&auth, port), &good);
    let cases_path = dir.join("cases");
    std::fs::write(&cases_path, &file).unwrap();
    std::fs::write(dir.join("player.py"), PLAYER).unwrap();
    let intent = egress(&[auth, good], false, 1000);
    let mut p = executor_protocol::types::process::ProcessStartParams::new(
        vec![
            "/usr/bin/python3".into(),
            dir.join("player.py").display().to_string(),
            cases_path.display().to_string(),
        ],
        "/",
        path_env(),
    );
    p.sandbox = Some(intent);
    let mut job = c.start(&p).await.unwrap();
    let mut out = Vec::new();
    while let Some(ch) = job.next_output().await.unwrap() {
        out.extend_from_slice(&ch.data);
    }
    let out = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), cases.len(), "the player stopped: {out}");
    let mut seen: std::collections::BTreeMap<String, usize> = Default::default();
    for (line, (case, req)) in lines.iter().zip(&cases) {
        let f: Vec<&str> = line.split(' ').collect();
        let (kind, head) = (f[1], f[2]);
        let shown = String::from_utf8_lossy(&req[..req.len().min(120)]).into_owned();
        match case {
            Case::Held => assert_eq!(kind, "hang", "the hang detector: {line}"),
            Case::GoodHttp | Case::GoodSocks => {
                let tail = "7878787878"; // xxxxx
                let start = if *case == Case::GoodHttp {
                    hex("HTTP/1.1 200")
                } else {
                    "05000500".to_string()
                };
                assert!(
                    kind == "data" && head.starts_with(&start) && head.ends_with(tail),
                    "a good request after hostile ones: {line}"
                );
            }
            Case::Hostile => {
                assert_ne!(kind, "hang", "held after EOF: {line} for {shown:?}");
                if kind == "data" {
                    let want = if req.first() == Some(&5) {
                        "05".to_string()
                    } else {
                        hex("HTTP/1.")
                    };
                    assert!(head.starts_with(&want), "{line} for {shown:?}");
                    let got = unhex(head);
                    let total: usize = f[3].parse().unwrap();
                    let first = &got[..total.min(4)];
                    let label = if req.first() == Some(&5) {
                        format!("socks {}", hex_of(first))
                    } else {
                        let text = String::from_utf8_lossy(&got);
                        format!("http {}", text.get(9..12).unwrap_or("?"))
                    };
                    *seen.entry(label).or_default() += 1;
                } else {
                    *seen.entry(kind.to_string()).or_default() += 1;
                }
            }
        }
    }
    // The parsers really answered: typed refusals of each kind were seen.
    for want in ["http 400", "http 403", "http 431", "socks 05ff", "closed"] {
        assert!(seen.contains_key(want), "no {want:?} in {seen:?}");
    }
    assert!(
        seen.keys().any(|k| k.starts_with("socks 050005")),
        "no SOCKS reply past the greeting in {seen:?}"
    );
    // The agent still serves, and never panicked.
    c.call(&executor_protocol::types::session::EnvironmentInfoParams {})
        .await
        .unwrap();
    let log = std::fs::read_to_string(&stderr).unwrap();
    assert!(!log.contains("panicked"), "{log}");
    c.close().await.unwrap();
    sink.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

fn hex(s: &str) -> String {
    hex_of(s.as_bytes())
}

fn hex_of(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}
