//! Egress by name (docs/PROTOCOL.md §8): the proxy a sandboxed job reaches
//! the hosts its intent names through, and nothing else.
//!
//! The job's init listens on `127.0.0.1:PORT` inside the job's own network
//! namespace and hands the listener to the agent (`executor_sandbox`'s
//! trampoline, `SCM_RIGHTS`); [`serve`] accepts on it from outside the
//! namespace. One port serves an HTTP proxy ([`http`]: absolute-URI
//! `http://` requests and `CONNECT`) and a SOCKS5 proxy ([`socks5`]); the
//! first byte tells them apart (`0x05`: SOCKS5). For each destination:
//!
//! 1. the host is canonicalized ([`matching::canonicalize`]) and matched
//!    with its port against `allow_hosts`, then against what the client
//!    allowed for the job's lifetime; not matched: with `ask`, the client
//!    is asked (`network/policyRequest`, one request per host:port at a
//!    time, parallel connections wait for the same answer; at most
//!    [`MAX_ASKS`] host:ports asked at once and [`ASK_BUDGET`] questions
//!    a second per job, past either refused unasked, source `limit`), else
//!    refused;
//! 2. a name is resolved once, here; every address is judged by the
//!    agent's destination policy of §6 ([`crate::destinations`]: the
//!    refused ranges and the configuration's `http.allow`), and a name's
//!    addresses that are this host itself (loopback, unspecified, its
//!    interfaces' addresses, what the kernel routes locally, see
//!    `host_itself`) are refused unless an address
//!    pattern or an address entry of `http.allow` admits them; the
//!    connection goes only to addresses that pass, directly (not through
//!    the configuration's `http.proxy`);
//! 3. the decision is a `network/decision` notification and an audit line:
//!    per job and second at most one per host:port and decision, and at
//!    most [`REPORT_BUDGET`] in all; the decisions left out are counted,
//!    and the count is reported once at the end of that second (on a
//!    report of the last of them, `suppressed: N`);
//! 4. the bytes are relayed ([`relay`]) with 64 KiB per direction.
//!
//! At most `max_egress_connections` connections of a job are served at
//! once; past it a connection is refused (`503` / SOCKS `0x01`).
//!
//! Depends on [`crate::destinations`] and [`crate::outbound`] only (the
//! audit sink is a closure its caller gives).

mod http;
pub mod matching;
mod relay;
mod socks5;

use crate::destinations::{AllowEntry, Destinations};
use crate::outbound::{Outbound, RequestError};
use executor_protocol::methods as m;
use executor_protocol::types::network::{
    DecisionSource, EgressProtocol, EgressScope, EgressVerdict, NetworkDecision,
    PolicyRequestParams, PolicyRequestResult,
};
use executor_protocol::types::sandbox::EgressIntent;
use executor_protocol::WireError;
use matching::{Host, Pattern};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::{watch, Semaphore};
use tokio_util::sync::CancellationToken;

/// How long a job's connection may take to say where it goes.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long connecting to one resolved address may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections past `max_egress_connections` being told so at once; more
/// are closed without an answer.
const REFUSING_AT_ONCE: usize = 16;
/// The window of the report budget: at most one report per host:port and
/// decision in it, and at most [`REPORT_BUDGET`] in all.
const REPORT_INTERVAL: Duration = Duration::from_secs(1);
/// The most decisions of a job reported on their own per
/// [`REPORT_INTERVAL`] (notifications and audit lines alike); one more
/// report per interval counts those left out.
pub const REPORT_BUDGET: u32 = 20;
/// The most host:ports of a job put to the client at once.
pub const MAX_ASKS: usize = 8;
/// The most questions a job puts to the client per [`REPORT_INTERVAL`]
/// (a denial is never remembered, so without it a job looping over
/// refused destinations asks at the client's speed, or at its
/// `ask_timeout_ms`); past it a destination is refused unasked, source
/// `limit`.
pub const ASK_BUDGET: u32 = 20;

/// A job's egress rules, parsed from its intent.
#[derive(Debug, Clone)]
pub struct Rules {
    patterns: Vec<Pattern>,
    ask: bool,
    ask_timeout: Duration,
}

impl Rules {
    /// Parse an intent's `allow_hosts`; a bad pattern is `invalid_params`
    /// naming its index (`{param}.network.allow_hosts.N`).
    pub fn from_intent(e: &EgressIntent, param: &str) -> Result<Rules, WireError> {
        let patterns = matching::parse_list(&e.allow_hosts).map_err(|(i, why)| {
            let field = format!("{param}.network.allow_hosts.{i}");
            WireError::invalid_params(&field, format!("{field}: {why}"))
        })?;
        Ok(Rules {
            patterns,
            ask: e.ask,
            ask_timeout: Duration::from_millis(e.ask_timeout_ms),
        })
    }

    fn admits(&self, host: &Host, port: u16) -> bool {
        self.patterns.iter().any(|p| p.admits(host, port))
    }
}

/// The proxy's URL as the job sees it.
pub fn proxy_url(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

/// The job's environment: the request's, with the proxy variables of §8
/// set (replacing the request's values for these names).
pub fn job_env(env: &BTreeMap<String, String>, port: u16) -> BTreeMap<String, String> {
    let mut out = env.clone();
    let http = proxy_url(port);
    let socks = format!("socks5h://127.0.0.1:{port}");
    for (k, v) in [
        ("HTTP_PROXY", &http),
        ("HTTPS_PROXY", &http),
        ("http_proxy", &http),
        ("https_proxy", &http),
        ("ALL_PROXY", &socks),
        ("all_proxy", &socks),
    ] {
        out.insert(k.to_string(), v.clone());
    }
    for k in ["NO_PROXY", "no_proxy"] {
        out.insert(k.to_string(), "localhost,127.0.0.1,::1".to_string());
    }
    out
}

/// Where a decision goes besides the notification (the audit log).
pub type AuditSink = Arc<dyn Fn(&NetworkDecision) + Send + Sync>;

/// What the proxy of one job needs.
pub struct Job {
    pub process_id: String,
    pub rules: Rules,
    /// The configuration's `http.allow`.
    pub allow: Vec<AllowEntry>,
    pub outbound: Outbound,
    pub audit: AuditSink,
    pub max_connections: u64,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("process_id", &self.process_id)
            .field("rules", &self.rules)
            .finish_non_exhaustive()
    }
}

type Key = (Host, u16);

/// An answer to a question about one host:port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Answer {
    allow: bool,
    source: DecisionSource,
}

struct Ctx {
    job: Job,
    /// host:port the client allowed with scope `process`.
    granted: Mutex<HashSet<Key>>,
    /// Questions in flight: later connections wait for the same answer.
    pending: Mutex<HashMap<Key, watch::Receiver<Option<Answer>>>>,
    reports: Mutex<Reports>,
    /// The ask budget's window (see [`ASK_BUDGET`]): when it began, and
    /// the questions put in it.
    asked: Mutex<(Option<Instant>, u32)>,
    stop: CancellationToken,
}

/// The report budget of a job (see [`REPORT_BUDGET`]).
#[derive(Default)]
struct Reports {
    /// When the current window began.
    window: Option<Instant>,
    /// Reports sent in it.
    sent: u32,
    /// What was reported in it.
    seen: HashSet<(Key, bool)>,
    /// Decisions not reported since the last count was reported, and the
    /// last of them.
    suppressed: u64,
    last: Option<NetworkDecision>,
    /// A task will report the count at the end of the window.
    flushing: bool,
}

/// A running proxy; dropping it stops accepting and ends the job's relayed
/// connections.
#[derive(Debug)]
pub struct Server {
    stop: CancellationToken,
    port: u16,
}

impl Server {
    /// The port the job's proxy listens on.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Serve the job's proxy on `listener` (the socket its init handed over).
pub fn serve(listener: OwnedFd, job: Job) -> std::io::Result<Server> {
    let std_listener = std::net::TcpListener::from(listener);
    std_listener.set_nonblocking(true)?;
    let port = std_listener.local_addr()?.port();
    let listener = tokio::net::TcpListener::from_std(std_listener)?;
    let stop = CancellationToken::new();
    let conns = Arc::new(Semaphore::new(
        usize::try_from(job.max_connections)
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS),
    ));
    let refusing = Arc::new(Semaphore::new(REFUSING_AT_ONCE));
    let ctx = Arc::new(Ctx {
        job,
        granted: Mutex::default(),
        pending: Mutex::default(),
        reports: Mutex::default(),
        asked: Mutex::default(),
        stop: stop.clone(),
    });
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = ctx.stop.cancelled() => break,
            };
            let (stream, _) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(process_id = %ctx.job.process_id, error = %e, "egress accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let (permit, over_limit) = match conns.clone().try_acquire_owned() {
                Ok(p) => (p, false),
                Err(_) => match refusing.clone().try_acquire_owned() {
                    Ok(p) => (p, true),
                    Err(_) => continue, // dropped: closed unanswered
                },
            };
            let ctx = ctx.clone();
            tokio::spawn(async move {
                let _permit = permit;
                tokio::select! {
                    _ = handle(&ctx, stream, over_limit) => {}
                    _ = ctx.stop.cancelled() => {}
                }
            });
        }
    });
    Ok(Server { stop, port })
}

async fn handle(ctx: &Arc<Ctx>, stream: TcpStream, over_limit: bool) {
    let mut first = [0u8; 1];
    let peeked = tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.peek(&mut first)).await;
    if !matches!(peeked, Ok(Ok(1))) {
        return;
    }
    if first[0] == socks5::VERSION {
        socks5::serve(ctx, stream, over_limit).await
    } else {
        http::serve(ctx, stream, over_limit).await
    }
}

/// Why a destination is not connected.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Refused {
    /// Not on the list, and no `ask` (or the client said no).
    NotAllowed,
    /// Allowed, but the destination policy refuses every address.
    Policy(String),
    /// The host is not a valid host.
    Invalid(String),
    /// The name did not resolve.
    Unresolved(String),
    /// Every address refused the connection or timed out.
    ConnectFailed(String),
    /// `max_egress_connections`.
    Limit(u64),
    /// A request whose `Host` header is another authority than its URI.
    HostMismatch(String),
}

impl Refused {
    /// The one-line text the job reads (HTTP body; the agent's log).
    fn text(&self, host: &str, port: u16) -> String {
        match self {
            Refused::NotAllowed => {
                format!("executor: egress to {host}:{port} is not allowed by the sandbox intent")
            }
            Refused::Policy(why) => format!(
                "executor: egress to {host}:{port} is refused by the agent's destination policy: {why}"
            ),
            Refused::Invalid(why) => format!("executor: not a valid destination: {why}"),
            Refused::Unresolved(why) => format!("executor: cannot resolve {host}: {why}"),
            Refused::ConnectFailed(why) => {
                format!("executor: cannot connect to {host}:{port}: {why}")
            }
            Refused::Limit(max) => format!(
                "executor: this job has {max} proxied connections open (max_egress_connections)"
            ),
            Refused::HostMismatch(why) => format!("executor: {why}"),
        }
    }
}

impl Ctx {
    /// Decide on `host:port` and connect: the upstream stream, or why not.
    async fn open(
        self: &Arc<Self>,
        host: &str,
        port: u16,
        protocol: EgressProtocol,
    ) -> Result<TcpStream, (Host, Refused)> {
        let canon = matching::canonicalize(host)
            .map_err(|why| (Host::Name(host.to_string()), Refused::Invalid(why)))?;
        let fail = |r: Refused| (canon.clone(), r);
        if port == 0 {
            return Err(fail(Refused::Invalid("port 0".into())));
        }
        let key = (canon.clone(), port);
        let answer = if self.job.rules.admits(&canon, port) {
            Answer {
                allow: true,
                source: DecisionSource::Intent,
            }
        } else if self.granted.lock().expect("granted lock").contains(&key) {
            Answer {
                allow: true,
                source: DecisionSource::Client,
            }
        } else if self.job.rules.ask {
            self.ask(&key, protocol).await
        } else {
            Answer {
                allow: false,
                source: DecisionSource::Intent,
            }
        };
        if !answer.allow {
            self.report(&key, false, answer.source, &[]);
            return Err(fail(Refused::NotAllowed));
        }
        let addrs: Vec<IpAddr> = match &canon {
            Host::Ip(ip) => vec![*ip],
            Host::Name(name) => match tokio::net::lookup_host((name.as_str(), port)).await {
                Ok(found) => {
                    let mut v: Vec<IpAddr> = Vec::new();
                    for a in found {
                        let ip = matching::canonical_ip(a.ip());
                        if !v.contains(&ip) {
                            v.push(ip);
                        }
                    }
                    v
                }
                Err(e) => return Err(fail(Refused::Unresolved(e.to_string()))),
            },
        };
        let policy = Destinations {
            allow: &self.job.allow,
            sandbox: None,
            profile: None,
        };
        let judged = canon.bare();
        // A name reaches this host itself only where an address says so
        // (an address pattern, or http.allow): its own interfaces are
        // looked up once per destination, and judged on exactly the
        // addresses connected to below.
        let own = match &canon {
            Host::Name(_) => Some(executor_sys::host_addresses().unwrap_or_else(|e| {
                tracing::warn!(error = %e, "cannot list this host's addresses: only loopback and unspecified addresses are known as its own");
                Vec::new()
            })),
            Host::Ip(_) => None,
        };
        let (ok, refused): (Vec<_>, Vec<_>) = addrs
            .iter()
            .map(|ip| {
                let r = policy.check_addr(&judged, *ip, port).map_err(|r| r.rule);
                let r = r.and_then(|()| match &own {
                    Some(own) => self.name_may_reach(*ip, port, own),
                    None => Ok(()),
                });
                (*ip, r)
            })
            .partition(|(_, r)| r.is_ok());
        let ok: Vec<IpAddr> = ok.into_iter().map(|(ip, _)| ip).collect();
        if ok.is_empty() {
            let addrs: Vec<IpAddr> = refused.iter().map(|(ip, _)| *ip).collect();
            let why = refused
                .into_iter()
                .find_map(|(ip, r)| r.err().map(|rule| format!("{ip}: {rule}")))
                .unwrap_or_else(|| "no address".into());
            self.report(&key, false, DecisionSource::Policy, &addrs);
            return Err(fail(Refused::Policy(why)));
        }
        self.report(&key, true, answer.source, &ok);
        let mut last = String::from("no address");
        for ip in ok {
            match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect((ip, port))).await {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    return Ok(s);
                }
                Ok(Err(e)) => last = format!("{ip}: {e}"),
                Err(_) => last = format!("{ip}: timed out"),
            }
        }
        Err(fail(Refused::ConnectFailed(last)))
    }

    /// Whether a destination given by name may connect to `ip`, one of
    /// its resolved addresses: not when `ip` is this host (loopback, the
    /// unspecified address, an address of its interfaces, or an IPv6
    /// address carrying one of those), unless an address or network
    /// pattern of `allow_hosts`, or an address entry of `http.allow`,
    /// admits it.
    fn name_may_reach(&self, ip: IpAddr, port: u16, own: &[IpAddr]) -> Result<(), String> {
        let Some(what) = host_itself(ip, own, kernel_local) else {
            return Ok(());
        };
        if self.job.rules.admits(&Host::Ip(ip), port)
            || crate::destinations::allow_names_addr(&self.job.allow, ip, port)
        {
            return Ok(());
        }
        Err(format!(
            "{what}: a name never reaches this host's own services (name the address in allow_hosts or http.allow)"
        ))
    }

    /// Put `key` to the client (once at a time per host:port).
    async fn ask(self: &Arc<Self>, key: &Key, protocol: EgressProtocol) -> Answer {
        let no_client = Answer {
            allow: false,
            source: DecisionSource::NoClient,
        };
        if !self.job.outbound.client_answers_requests() {
            return no_client;
        }
        let (mut rx, leader) = {
            let mut pending = self.pending.lock().expect("pending lock");
            match pending.get(key) {
                Some(rx) => (rx.clone(), None),
                None if pending.len() >= MAX_ASKS || !self.ask_budget() => {
                    return Answer {
                        allow: false,
                        source: DecisionSource::Limit,
                    }
                }
                None => {
                    let (tx, rx) = watch::channel(None);
                    pending.insert(key.clone(), rx.clone());
                    (rx, Some(tx))
                }
            }
        };
        let Some(tx) = leader else {
            return match rx.wait_for(|a| a.is_some()).await {
                Ok(a) => a.unwrap_or(no_client),
                Err(_) => Answer {
                    allow: false,
                    source: DecisionSource::Timeout,
                },
            };
        };
        let params = PolicyRequestParams {
            process_id: self.job.process_id.clone(),
            host: key.0.bare(),
            port: key.1,
            protocol,
        };
        let answered = self
            .job
            .outbound
            .request(
                m::NETWORK_POLICY_REQUEST,
                &params,
                self.job.rules.ask_timeout,
            )
            .await;
        let answer = match answered {
            Ok(v) => match executor_protocol::message::from_params::<PolicyRequestResult>(v) {
                Ok(r) => {
                    let allow = r.decision == EgressVerdict::Allow;
                    if allow && r.scope == EgressScope::Process {
                        self.granted
                            .lock()
                            .expect("granted lock")
                            .insert(key.clone());
                    }
                    Answer {
                        allow,
                        source: DecisionSource::Client,
                    }
                }
                Err(e) => {
                    tracing::warn!(process_id = %self.job.process_id, error = %e, "malformed network/policyRequest answer: deny");
                    Answer {
                        allow: false,
                        source: DecisionSource::Client,
                    }
                }
            },
            Err(RequestError::Answered(e)) => {
                tracing::info!(process_id = %self.job.process_id, error = %e, "network/policyRequest answered with an error: deny");
                Answer {
                    allow: false,
                    source: DecisionSource::Client,
                }
            }
            Err(RequestError::Timeout) => Answer {
                allow: false,
                source: DecisionSource::Timeout,
            },
            Err(RequestError::NoClient) => no_client,
        };
        self.pending.lock().expect("pending lock").remove(key);
        let _ = tx.send(Some(answer));
        answer
    }

    /// Whether one more question fits in the job's ask budget (taking it).
    fn ask_budget(&self) -> bool {
        let mut a = self.asked.lock().expect("asked lock");
        let now = Instant::now();
        if a.0.is_none_or(|w| now.duration_since(w) >= REPORT_INTERVAL) {
            *a = (Some(now), 0);
        }
        if a.1 >= ASK_BUDGET {
            return false;
        }
        a.1 += 1;
        true
    }

    /// The `network/decision` notification and the audit line, within the
    /// job's budget (see [`REPORT_BUDGET`]); past it the decision is
    /// counted, and the count reported at the end of the window.
    fn report(self: &Arc<Self>, key: &Key, allow: bool, source: DecisionSource, addrs: &[IpAddr]) {
        let note = NetworkDecision {
            process_id: self.job.process_id.clone(),
            host: key.0.bare(),
            port: key.1,
            decision: if allow {
                EgressVerdict::Allow
            } else {
                EgressVerdict::Deny
            },
            source,
            addresses: addrs.iter().map(IpAddr::to_string).collect(),
            suppressed: None,
        };
        {
            let mut r = self.reports.lock().expect("reports lock");
            let now = Instant::now();
            let window = match r.window {
                Some(w) if now.duration_since(w) < REPORT_INTERVAL => w,
                _ => {
                    r.window = Some(now);
                    r.sent = 0;
                    r.seen.clear();
                    now
                }
            };
            let slot = (key.clone(), allow);
            if r.sent >= REPORT_BUDGET || r.seen.contains(&slot) {
                r.suppressed += 1;
                r.last = Some(note);
                if !r.flushing {
                    r.flushing = true;
                    let ctx = self.clone();
                    let at = tokio::time::Instant::from_std(window + REPORT_INTERVAL);
                    tokio::spawn(async move {
                        tokio::time::sleep_until(at).await;
                        ctx.report_suppressed();
                    });
                }
                return;
            }
            r.seen.insert(slot);
            r.sent += 1;
        }
        self.emit(note);
    }

    /// Report how many decisions were left out since the last such report,
    /// on the last of them.
    fn report_suppressed(&self) {
        let note = {
            let mut r = self.reports.lock().expect("reports lock");
            r.flushing = false;
            let n = std::mem::take(&mut r.suppressed);
            match r.last.take() {
                Some(mut last) if n > 0 => {
                    last.suppressed = Some(n);
                    last
                }
                _ => return,
            }
        };
        self.emit(note);
    }

    fn emit(&self, note: NetworkDecision) {
        tracing::info!(
            process_id = %note.process_id,
            host = %note.host,
            port = note.port,
            decision = note.decision.as_str(),
            source = note.source.as_str(),
            addresses = ?note.addresses,
            suppressed = note.suppressed,
            "egress decision"
        );
        (self.job.audit)(&note);
        let outbound = self.job.outbound.clone();
        tokio::spawn(async move {
            let _ = outbound
                .notify_within(m::NETWORK_DECISION, &note, REPORT_INTERVAL)
                .await;
        });
    }
}

/// Whether the kernel takes `ip` as an address of this host (a local
/// route: an interface's address, and every address of a prefix on `lo`,
/// which the kernel answers on though no interface lists it): a bind to it
/// succeeds. Where binds to non-local addresses are allowed
/// (`ip_nonlocal_bind`, or its setting unreadable) a bind tells nothing:
/// `false`, and the interface list decides.
fn kernel_local(ip: IpAddr) -> bool {
    let sysctl = match ip {
        IpAddr::V4(_) => "/proc/sys/net/ipv4/ip_nonlocal_bind",
        IpAddr::V6(_) => "/proc/sys/net/ipv6/ip_nonlocal_bind",
    };
    if std::fs::read_to_string(sysctl).map_or(true, |v| v.trim() != "0") {
        return false;
    }
    std::net::UdpSocket::bind((ip, 0)).is_ok()
}

/// What makes `ip` this host itself, if it is: loopback, unspecified,
/// one of `own` (the addresses of its interfaces), or an address `local`
/// (the kernel) takes as this host's, directly or as an IPv4 address an
/// IPv6 address carries.
fn host_itself(ip: IpAddr, own: &[IpAddr], local: impl Fn(IpAddr) -> bool) -> Option<String> {
    let mut judged = vec![matching::canonical_ip(ip)];
    if let IpAddr::V6(v6) = ip {
        judged.extend(
            crate::destinations::embedded_ipv4(v6)
                .into_iter()
                .map(|e| IpAddr::V4(e.ipv4)),
        );
    }
    judged.into_iter().find_map(|a| {
        if a.is_loopback() {
            Some(format!("{a} is a loopback address"))
        } else if a.is_unspecified() || matches!(a, IpAddr::V4(v4) if v4.octets()[0] == 0) {
            Some(format!(
                "{a} is an unspecified address (it reaches this host)"
            ))
        } else if own.iter().any(|o| matching::canonical_ip(*o) == a) {
            Some(format!("{a} is an address of this host's interfaces"))
        } else if local(a) {
            Some(format!("{a} is routed to this host itself (a local route)"))
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_itself_is_loopback_unspecified_or_its_own_addresses_in_any_form() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let own = [ip("192.0.2.2"), ip("fd00::2")];
        for local in [
            "127.0.0.1",
            "127.9.8.7",
            "::1",
            "::ffff:127.0.0.1",
            "64:ff9b::7f00:1",
            "2002:7f00:1::",
            "0.0.0.0",
            "::",
            "0.1.2.3",
            "192.0.2.2",
            "::ffff:192.0.2.2",
            "fd00::2",
            // Teredo whose client (inverted last 32 bits) is loopback.
            "2001:0:808:808::80ff:fffe",
        ] {
            assert!(host_itself(ip(local), &own, |_| false).is_some(), "{local}");
        }
        for remote in ["192.0.2.3", "8.8.8.8", "fd00::3", "::ffff:8.8.8.8"] {
            assert!(
                host_itself(ip(remote), &own, |_| false).is_none(),
                "{remote}"
            );
            assert!(
                host_itself(ip(remote), &own, |_| true).is_some(),
                "{remote}"
            );
        }
    }

    #[test]
    fn the_environment_names_the_proxy_and_replaces_the_requests_values() {
        let mut env = BTreeMap::new();
        env.insert("HTTPS_PROXY".to_string(), "http://evil:1".to_string());
        env.insert("PATH".to_string(), "/bin".to_string());
        let out = job_env(&env, 12345);
        assert_eq!(out["HTTPS_PROXY"], "http://127.0.0.1:12345");
        assert_eq!(out["https_proxy"], "http://127.0.0.1:12345");
        assert_eq!(out["ALL_PROXY"], "socks5h://127.0.0.1:12345");
        assert_eq!(out["no_proxy"], "localhost,127.0.0.1,::1");
        assert_eq!(out["PATH"], "/bin");
    }

    #[test]
    fn a_bad_pattern_names_its_index() {
        let e = Rules::from_intent(
            &EgressIntent {
                allow_hosts: vec!["a.example".into(), "b.example".into(), "x:0".into()],
                ask: false,
                ask_timeout_ms: 1,
            },
            "sandbox",
        )
        .unwrap_err();
        assert_eq!(
            e.data_get("field").and_then(|v| v.as_str()),
            Some("sandbox.network.allow_hosts.2"),
            "{e:?}"
        );
    }
}
