//! The HTTP destination policy (docs/PROTOCOL.md §6), as pure functions
//! (used by the configuration to parse `http.allow`, and by `http`).
//!
//! Two layers decide, and both name the host and the rule when they refuse:
//! - the request's sandbox intent (`network: "deny"` refuses everything,
//!   `allow_tcp_connect` limits ports): `sandbox_denied`;
//! - the agent's configuration (`http.allow`) and the built-in refusals
//!   (link-local, unspecified, cloud metadata addresses): `policy_denied`.
//!
//! Names are checked before resolution; addresses after it, on exactly the
//! addresses the connection will use, whether a URL wrote them or DNS
//! answered them. An IPv6 address that carries an IPv4 address (mapped,
//! translated, compatible, NAT64, 6to4, Teredo: [`embedded_ipv4`]) is judged
//! as the IPv4 address it carries, by every rule: such an address reaches,
//! through a translator or a tunnel, the IPv4 host it names, so
//! `64:ff9b::a9fe:a9fe` is the metadata endpoint. Teredo carries two (server
//! and client), and both must pass. A CIDR entry of `http.allow` is matched
//! against the judged address too: to admit destinations behind NAT64,
//! write their IPv4 networks, not `[64:ff9b::/96]`.
//!
//! A CIDR entry of `http.allow` admits an address even when it is refused by
//! default (an operator who writes `169.254.169.254/32` means it); a host
//! name entry never does, since DNS decides what a name points to.

use executor_protocol::types::sandbox::{NetworkIntent, SandboxIntent};
use executor_protocol::{ErrorCode, WireError};
use ipnet::IpNet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The cloud metadata endpoints refused by default.
pub const METADATA: [IpAddr; 4] = [
    IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254)),
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)),
    IpAddr::V4(Ipv4Addr::new(168, 63, 129, 16)),
    IpAddr::V4(Ipv4Addr::new(100, 100, 100, 200)),
];

/// One `http.allow` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowEntry {
    host: AllowHost,
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum AllowHost {
    /// An exact name, lower case.
    Name(String),
    /// `*.suffix`: any name ending in `.suffix` (not `suffix` itself).
    Suffix(String),
    /// An address or a network.
    Net(IpNet),
}

/// Why an `http.allow` entry does not parse.
#[derive(Debug, thiserror::Error)]
#[error("{entry:?}: {why}")]
pub struct ParseAllowError {
    entry: String,
    why: String,
}

impl AllowEntry {
    /// `host`, `*.suffix`, `1.2.3.4`, `10.0.0.0/8`, `[::1]`, `[fd00::/8]`,
    /// each optionally followed by `:port`.
    pub fn parse(text: &str) -> Result<AllowEntry, ParseAllowError> {
        let fail = |why: &str| ParseAllowError {
            entry: text.to_string(),
            why: why.to_string(),
        };
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let (inner, after) = rest.split_once(']').ok_or_else(|| fail("missing ']'"))?;
            let port = match after {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| fail("expected ':port' after ']'"))?,
                ),
            };
            (inner, port)
        } else if text.matches(':').count() > 1 {
            // A bare IPv6 address or network, no port.
            (text, None)
        } else {
            match text.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (text, None),
            }
        };
        let port = port
            .map(|p| match p.parse::<u16>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(fail("the port must be a number in 1..=65535")),
            })
            .transpose()?;
        if host.is_empty() {
            return Err(fail("empty host"));
        }
        let host = if let Ok(net) = host.parse::<IpNet>() {
            AllowHost::Net(net.trunc())
        } else if let Ok(ip) = host.parse::<IpAddr>() {
            // An embedded-IPv4 address stands for the IPv4 address it carries,
            // as destinations do; a Teredo address carries two, which one
            // entry cannot admit together.
            let judged = match ip {
                IpAddr::V6(v6) => match embedded_ipv4(v6).as_slice() {
                    [] => ip,
                    [one] => IpAddr::V4(one.ipv4),
                    _ => {
                        return Err(fail(
                            "a Teredo address carries two IPv4 addresses (server and client): list those instead",
                        ))
                    }
                },
                IpAddr::V4(_) => ip,
            };
            AllowHost::Net(IpNet::from(judged))
        } else if host.contains('/') {
            return Err(fail("not a valid CIDR network"));
        } else if let Some(suffix) = host.strip_prefix("*.") {
            AllowHost::Suffix(valid_name(suffix).ok_or_else(|| fail("not a valid host name"))?)
        } else {
            AllowHost::Name(valid_name(host).ok_or_else(|| fail("not a valid host name"))?)
        };
        Ok(AllowEntry { host, port })
    }

    fn port_ok(&self, port: u16) -> bool {
        self.port.is_none_or(|p| p == port)
    }

    fn admits_name(&self, name: &str, port: u16) -> bool {
        self.port_ok(port)
            && match &self.host {
                AllowHost::Name(n) => n == name,
                AllowHost::Suffix(s) => {
                    name.len() > s.len() + 1
                        && name.ends_with(s.as_str())
                        && name.as_bytes()[name.len() - s.len() - 1] == b'.'
                }
                AllowHost::Net(_) => false,
            }
    }

    /// Whether it admits a URL's host (a name by name, an address by
    /// address) at `port`.
    pub fn admits_host(&self, host: &url::Host<&str>, port: u16) -> bool {
        match host {
            url::Host::Domain(d) => {
                self.admits_name(&d.trim_end_matches('.').to_ascii_lowercase(), port)
            }
            url::Host::Ipv4(ip) => self.admits_addr(IpAddr::V4(*ip), port),
            url::Host::Ipv6(ip) => self.admits_addr(IpAddr::V6(*ip), port),
        }
    }

    fn admits_addr(&self, ip: IpAddr, port: u16) -> bool {
        self.port_ok(port) && matches!(&self.host, AllowHost::Net(net) if net.contains(&ip))
    }
}

/// `scheme://host[:port]` of `url`, for messages (no credentials, path or
/// query).
pub fn redacted_origin(url: &url::Url) -> String {
    match (url.host_str(), url.port()) {
        (Some(h), Some(p)) => format!("{}://{h}:{p}", url.scheme()),
        (Some(h), None) => format!("{}://{h}", url.scheme()),
        _ => url.scheme().to_string(),
    }
}

/// Whether an address or network entry of `allow` (the configuration's
/// `http.allow`) admits `ip` at `port` (a name entry never does).
pub fn allow_names_addr(allow: &[AllowEntry], ip: IpAddr, port: u16) -> bool {
    allow.iter().any(|a| a.admits_addr(ip, port))
}

fn valid_name(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    ok.then(|| name.to_ascii_lowercase())
}

/// How an IPv6 address carries an IPv4 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Embedding {
    /// `::ffff:a.b.c.d` (RFC 4291 §2.5.5.2): a dual-stack socket reaches the
    /// IPv4 host directly.
    Mapped,
    /// `::ffff:0:a.b.c.d` (RFC 2765, SIIT).
    Translated,
    /// `::a.b.c.d` (RFC 4291 §2.5.5.1, deprecated), except `::` and `::1`.
    Compatible,
    /// `64:ff9b::a.b.c.d`, the NAT64 well-known prefix (RFC 6052).
    Nat64,
    /// `64:ff9b:1::/48`, the local-use NAT64 prefix (RFC 8215), read with
    /// the IPv4 address in the last 32 bits (a /96 translation prefix).
    Nat64Local,
    /// `2002:AABB:CCDD::/48` (RFC 3056), the IPv4 address in bits 16..48.
    SixToFour,
    /// Teredo `2001:0::/32` (RFC 4380): the server, in bits 32..64.
    TeredoServer,
    /// Teredo `2001:0::/32`: the client, the last 32 bits inverted.
    TeredoClient,
}

impl Embedding {
    /// A short name for the wire (`data.embedding`).
    pub fn name(self) -> &'static str {
        match self {
            Embedding::Mapped => "ipv4-mapped",
            Embedding::Translated => "ipv4-translated",
            Embedding::Compatible => "ipv4-compatible",
            Embedding::Nat64 => "nat64",
            Embedding::Nat64Local => "nat64-local",
            Embedding::SixToFour => "6to4",
            Embedding::TeredoServer => "teredo-server",
            Embedding::TeredoClient => "teredo-client",
        }
    }

    /// The form and its prefix, for messages.
    pub fn describe(self) -> &'static str {
        match self {
            Embedding::Mapped => "IPv4-mapped, ::ffff:0:0/96",
            Embedding::Translated => "IPv4-translated, ::ffff:0:0:0/96",
            Embedding::Compatible => "IPv4-compatible, ::/96",
            Embedding::Nat64 => "NAT64 well-known prefix 64:ff9b::/96",
            Embedding::Nat64Local => "NAT64 local-use prefix 64:ff9b:1::/48",
            Embedding::SixToFour => "6to4, 2002::/16",
            Embedding::TeredoServer => "Teredo server, 2001::/32",
            Embedding::TeredoClient => "Teredo client, 2001::/32",
        }
    }
}

/// An IPv4 address carried inside an IPv6 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Embedded {
    pub ipv4: Ipv4Addr,
    pub form: Embedding,
}

/// The IPv4 addresses `v6` carries: none (a native IPv6 address), one, or
/// two (Teredo: server and client).
pub fn embedded_ipv4(v6: Ipv6Addr) -> Vec<Embedded> {
    let s = v6.segments();
    let v4 = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    let one = |form, ipv4| vec![Embedded { ipv4, form }];
    match s {
        [0, 0, 0, 0, 0, 0xffff, hi, lo] => one(Embedding::Mapped, v4(hi, lo)),
        [0, 0, 0, 0, 0xffff, 0, hi, lo] => one(Embedding::Translated, v4(hi, lo)),
        // `::` is the unspecified address and `::1` loopback: their own rules.
        [0, 0, 0, 0, 0, 0, 0, 0 | 1] => Vec::new(),
        [0, 0, 0, 0, 0, 0, hi, lo] => one(Embedding::Compatible, v4(hi, lo)),
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => one(Embedding::Nat64, v4(hi, lo)),
        [0x64, 0xff9b, 1, _, _, _, hi, lo] => one(Embedding::Nat64Local, v4(hi, lo)),
        [0x2002, hi, lo, ..] => one(Embedding::SixToFour, v4(hi, lo)),
        [0x2001, 0, shi, slo, _, _, chi, clo] => vec![
            Embedded {
                ipv4: v4(shi, slo),
                form: Embedding::TeredoServer,
            },
            Embedded {
                ipv4: Ipv4Addr::from(!u32::from(v4(chi, clo))),
                form: Embedding::TeredoClient,
            },
        ],
        _ => Vec::new(),
    }
}

/// A refused destination: the code (which layer), the host, the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: ErrorCode,
    pub host: String,
    /// The address as the connection would use it.
    pub addr: Option<IpAddr>,
    /// The IPv4 address `addr` carries that the rule refused.
    pub embedded: Option<Embedded>,
    pub port: u16,
    pub rule: String,
}

impl Refusal {
    /// The wire error: message and `data` name the host and the rule.
    pub fn to_wire(&self) -> WireError {
        let at = match self.addr {
            Some(a) if a.to_string() != self.host => format!(" ({a})"),
            _ => String::new(),
        };
        let carries = match (self.addr, self.embedded) {
            (Some(a), Some(e)) => format!("{a} embeds {} ({}): ", e.ipv4, e.form.describe()),
            _ => String::new(),
        };
        let mut e = WireError::new(
            self.code,
            format!(
                "refused to connect to {}{at} port {}: {carries}{}",
                self.host, self.port, self.rule
            ),
        )
        .with("host", self.host.clone())
        .with("port", self.port)
        .with("rule", self.rule.clone());
        if let Some(a) = self.addr {
            e = e.with("address", a.to_string());
        }
        if let Some(emb) = self.embedded {
            e = e
                .with("embedded_ipv4", emb.ipv4.to_string())
                .with("embedding", emb.form.name());
        }
        e
    }
}

/// The destination policy for one request: the configuration's allow-list
/// and the request's own sandbox intent.
#[derive(Debug, Clone, Copy)]
pub struct Destinations<'a> {
    pub allow: &'a [AllowEntry],
    pub sandbox: Option<&'a SandboxIntent>,
    /// The configuration profile's default intent (a refusal by it is
    /// `policy_denied`).
    pub profile: Option<&'a SandboxIntent>,
}

impl Destinations<'_> {
    /// Before resolving: the sandbox intent and name-only rules. `host` is
    /// the URL's host as text (a name, or an address literal).
    pub fn check_name(&self, host: &str, port: u16) -> Result<(), Refusal> {
        let refuse = |code, rule: String| Refusal {
            code,
            host: host.to_string(),
            addr: None,
            embedded: None,
            port,
            rule,
        };
        let layers = [
            (
                self.sandbox,
                ErrorCode::SandboxDenied,
                "the request's sandbox",
            ),
            (
                self.profile,
                ErrorCode::PolicyDenied,
                "the profile's sandbox",
            ),
        ];
        for (intent, code, whose) in layers {
            let Some(intent) = intent else { continue };
            match &intent.network {
                NetworkIntent::Deny => {
                    return Err(refuse(code, format!("{whose} has network \"deny\"")))
                }
                // Egress by name is for jobs (§8); any other request
                // treats it as "deny".
                NetworkIntent::AllowHosts(_) => {
                    return Err(refuse(
                        code,
                        format!("{whose} has network allow_hosts, which is \"deny\" for requests other than process/start and exec_command"),
                    ))
                }
                NetworkIntent::Allow => {}
                NetworkIntent::AllowTcpConnect(ports) => {
                    if !ports.contains(&port) {
                        return Err(refuse(
                            code,
                            format!("port {port} is not in {whose} allow_tcp_connect {ports:?}"),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// With a proxy, which resolves names itself: the name against the
    /// allow-list (addresses are the proxy's to judge).
    pub fn check_name_allowed(&self, host: &str, port: u16) -> Result<(), Refusal> {
        let name = host.trim_end_matches('.').to_ascii_lowercase();
        if self.allow.is_empty() || self.allow.iter().any(|a| a.admits_name(&name, port)) {
            return Ok(());
        }
        Err(Refusal {
            code: ErrorCode::PolicyDenied,
            host: host.to_string(),
            addr: None,
            embedded: None,
            port,
            rule: "not in the configuration's http.allow".into(),
        })
    }

    /// After resolving: one address the connection would use (an address
    /// literal of the URL, or one of a name's DNS answers). An address that
    /// embeds IPv4 is judged as each IPv4 address it carries.
    pub fn check_addr(&self, host: &str, ip: IpAddr, port: u16) -> Result<(), Refusal> {
        let refuse = |embedded, rule: &str| Refusal {
            code: ErrorCode::PolicyDenied,
            host: host.to_string(),
            addr: Some(ip),
            embedded,
            port,
            rule: rule.to_string(),
        };
        let embedded = match ip {
            IpAddr::V6(v6) => embedded_ipv4(v6),
            IpAddr::V4(_) => Vec::new(),
        };
        if embedded.is_empty() {
            return self.decide(host, ip, port).map_err(|r| refuse(None, r));
        }
        for e in embedded {
            self.decide(host, IpAddr::V4(e.ipv4), port)
                .map_err(|r| refuse(Some(e), r))?;
        }
        Ok(())
    }

    /// The decision on one judged address (never an embedded-IPv4 form):
    /// the rule that refuses it, if any.
    fn decide(&self, host: &str, ip: IpAddr, port: u16) -> Result<(), &'static str> {
        if self.allow.iter().any(|a| a.admits_addr(ip, port)) {
            return Ok(());
        }
        if let Some(rule) = refused_by_default(ip) {
            return Err(rule);
        }
        let name = host.trim_end_matches('.').to_ascii_lowercase();
        if !self.allow.is_empty() && !self.allow.iter().any(|a| a.admits_name(&name, port)) {
            return Err("not in the configuration's http.allow");
        }
        Ok(())
    }
}

/// The built-in refusal a judged address falls under, if any (an
/// embedded-IPv4 form is judged by [`Destinations::check_addr`] as the IPv4
/// addresses it carries, not here).
fn refused_by_default(ip: IpAddr) -> Option<&'static str> {
    if METADATA.contains(&ip) {
        return Some("cloud metadata address (refused by default)");
    }
    match ip {
        IpAddr::V4(v4) => {
            if v4.is_link_local() {
                Some("link-local address 169.254.0.0/16 (refused by default)")
            } else if v4.octets()[0] == 0 {
                Some("unspecified address 0.0.0.0/8 (refused by default)")
            } else if v4.is_broadcast() || v4.is_multicast() {
                Some("broadcast or multicast address (refused by default)")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            if v6.is_unspecified() {
                Some("unspecified address :: (refused by default)")
            } else if (v6.segments()[0] & 0xffc0) == 0xfe80 {
                Some("link-local address fe80::/10 (refused by default)")
            } else if v6.is_multicast() {
                Some("multicast address (refused by default)")
            } else {
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn open() -> Destinations<'static> {
        Destinations {
            allow: &[],
            sandbox: None,
            profile: None,
        }
    }

    #[test]
    fn defaults_refuse_metadata_link_local_and_unspecified_but_not_loopback() {
        let d = open();
        for bad in [
            "169.254.169.254",
            "::ffff:169.254.169.254",
            "169.254.1.1",
            "fe80::1",
            "fd00:ec2::254",
            "168.63.129.16",
            "100.100.100.200",
            "0.0.0.0",
            "::",
            "::ffff:0.0.0.0",
        ] {
            let r = d.check_addr("h", ip(bad), 80).unwrap_err();
            assert_eq!(r.code, ErrorCode::PolicyDenied, "{bad}");
        }
        for good in [
            "127.0.0.1",
            "::1",
            "10.1.2.3",
            "::ffff:127.0.0.1",
            "2001:db8::1",
        ] {
            d.check_addr("h", ip(good), 80).unwrap();
        }
    }

    fn v6(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    const MD: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);
    const LO: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);

    fn one(ipv4: Ipv4Addr, form: Embedding) -> Vec<Embedded> {
        vec![Embedded { ipv4, form }]
    }

    fn teredo(server: Ipv4Addr, client: Ipv4Addr) -> Vec<Embedded> {
        vec![
            Embedded {
                ipv4: server,
                form: Embedding::TeredoServer,
            },
            Embedded {
                ipv4: client,
                form: Embedding::TeredoClient,
            },
        ]
    }

    /// Each embedded form of 169.254.169.254, then of 127.0.0.1.
    const FORMS: [(&str, &str, Embedding); 7] = [
        (
            "::ffff:169.254.169.254",
            "::ffff:127.0.0.1",
            Embedding::Mapped,
        ),
        (
            "::ffff:0:a9fe:a9fe",
            "::ffff:0:7f00:1",
            Embedding::Translated,
        ),
        ("::169.254.169.254", "::127.0.0.1", Embedding::Compatible),
        ("64:ff9b::a9fe:a9fe", "64:ff9b::7f00:1", Embedding::Nat64),
        (
            "64:ff9b:1:ab:cd::a9fe:a9fe",
            "64:ff9b:1::7f00:1",
            Embedding::Nat64Local,
        ),
        (
            "2002:a9fe:a9fe:1:2:3:4:5",
            "2002:7f00:1::1",
            Embedding::SixToFour,
        ),
        // Teredo, the metadata address as the server (the client is
        // 127.0.0.1, inverted: 0x80fffffe).
        (
            "2001:0:a9fe:a9fe::80ff:fffe",
            "2001:0:7f00:1::80ff:fffe",
            Embedding::TeredoServer,
        ),
    ];

    #[test]
    fn embedded_ipv4_finds_the_address_of_every_form() {
        for (md, lo, form) in FORMS {
            if form == Embedding::TeredoServer {
                assert_eq!(embedded_ipv4(v6(md)), teredo(MD, LO), "{md}");
                assert_eq!(embedded_ipv4(v6(lo)), teredo(LO, LO), "{lo}");
            } else {
                assert_eq!(embedded_ipv4(v6(md)), one(MD, form), "{md}");
                assert_eq!(embedded_ipv4(v6(lo)), one(LO, form), "{lo}");
            }
        }
        // The Teredo client is the last 32 bits inverted.
        assert_eq!(
            embedded_ipv4(v6("2001:0:7f00:1::5601:5601")),
            teredo(LO, MD)
        );
        assert_eq!(
            embedded_ipv4(v6("2001::ffff:ffff")),
            teredo(Ipv4Addr::UNSPECIFIED, Ipv4Addr::UNSPECIFIED)
        );
        // Native IPv6 carries nothing, nor do `::` and `::1`; nor do the
        // neighbours of the embedding prefixes.
        for native in [
            "::",
            "::1",
            "fe80::1",
            "fd00:ec2::254",
            "2001:db8::a9fe:a9fe",
            "2001:1::a9fe:a9fe",
            "2003:a9fe:a9fe::",
            "64:ff9b:0:0:0:1:a9fe:a9fe",
            "64:ff9b:2::a9fe:a9fe",
            "::1:0:a9fe:a9fe",
            "::fffe:a9fe:a9fe",
            "1::a9fe:a9fe",
        ] {
            assert_eq!(embedded_ipv4(v6(native)), vec![], "{native}");
        }
    }

    #[test]
    fn every_embedded_form_is_judged_as_its_ipv4_address() {
        let d = open();
        for (md, lo, form) in FORMS {
            let r = d.check_addr("h", ip(md), 80).unwrap_err();
            assert_eq!(r.code, ErrorCode::PolicyDenied, "{md}");
            assert!(r.rule.contains("cloud metadata"), "{md}: {r:?}");
            assert_eq!(r.addr, Some(ip(md)), "{md}");
            assert_eq!(r.embedded, Some(Embedded { ipv4: MD, form }), "{md}");
            let w = r.to_wire();
            assert!(
                w.message
                    .contains(&format!("{} embeds 169.254.169.254", ip(md))),
                "{}",
                w.message
            );
            assert_eq!(
                w.data_get("embedded_ipv4").and_then(|v| v.as_str()),
                Some("169.254.169.254")
            );
            assert_eq!(
                w.data_get("embedding").and_then(|v| v.as_str()),
                Some(form.name())
            );
            // Positive control: the same form carrying loopback.
            d.check_addr("h", ip(lo), 80).unwrap();
        }
        // The other default refusals, through embedded forms.
        for (bad, rule) in [
            ("64:ff9b::a9fe:101", "link-local"),
            ("2002:a9fe:101::", "link-local"),
            ("::ffff:0:0:0", "unspecified"),
            ("::0.0.0.2", "unspecified"),
            ("64:ff9b:1::e000:1", "multicast"),
            ("64:ff9b::a83f:8110", "cloud metadata"),
            ("2002:6464:64c8::", "cloud metadata"),
            // Teredo with the metadata address as the client.
            ("2001:0:7f00:1::5601:5601", "cloud metadata"),
            // A Teredo server of 0.0.0.0 refuses whatever the client is.
            ("2001::80ff:fffe", "unspecified"),
        ] {
            let r = d.check_addr("h", ip(bad), 80).unwrap_err();
            assert!(r.rule.contains(rule), "{bad}: {r:?}");
        }
    }

    #[test]
    fn the_allow_list_judges_embedded_forms_by_their_ipv4_address() {
        let allow: Vec<AllowEntry> = ["127.0.0.0/8", "[64:ff9b::a9fe:a9fe]", "named.corp"]
            .iter()
            .map(|s| AllowEntry::parse(s).unwrap())
            .collect();
        let d = Destinations {
            allow: &allow,
            sandbox: None,
            profile: None,
        };
        d.check_addr("anything", ip("64:ff9b::7f00:1"), 80).unwrap();
        d.check_addr("anything", ip("2002:7f00:1::"), 80).unwrap();
        // The entry written as NAT64 admits the metadata address it names,
        // in any form.
        d.check_addr("anything", ip("169.254.169.254"), 80).unwrap();
        d.check_addr("anything", ip("2002:a9fe:a9fe::"), 80)
            .unwrap();
        let r = d
            .check_addr("anything", ip("64:ff9b::a00:1"), 80)
            .unwrap_err();
        assert!(r.rule.contains("http.allow"), "{r:?}");
        assert_eq!(r.embedded.map(|e| e.ipv4), Some(Ipv4Addr::new(10, 0, 0, 1)));
        // A name entry never admits a default-refused address, embedded or not.
        let r = d
            .check_addr("named.corp", ip("64:ff9b::a9fe:101"), 80)
            .unwrap_err();
        assert!(r.rule.contains("link-local"), "{r:?}");
        d.check_addr("named.corp", ip("64:ff9b::808:808"), 80)
            .unwrap();
        // Teredo: both carried addresses must pass.
        let r = d
            .check_addr("anything", ip("2001:0:7f00:1::f5f7:f7f7"), 80)
            .unwrap_err();
        assert_eq!(
            r.embedded,
            Some(Embedded {
                ipv4: Ipv4Addr::new(10, 8, 8, 8),
                form: Embedding::TeredoClient
            })
        );
        assert!(AllowEntry::parse("[2001:0:7f00:1::80ff:fffe]").is_err());
    }

    #[test]
    fn an_allow_list_admits_names_suffixes_and_networks_with_ports() {
        let allow: Vec<AllowEntry> = [
            "mirror.corp:443",
            "*.svc.corp",
            "10.0.0.0/8",
            "[fd00::/8]:8080",
            "169.254.169.254",
        ]
        .iter()
        .map(|s| AllowEntry::parse(s).unwrap())
        .collect();
        let d = Destinations {
            allow: &allow,
            sandbox: None,
            profile: None,
        };
        d.check_addr("mirror.corp", ip("192.0.2.1"), 443).unwrap();
        d.check_addr("MIRROR.corp.", ip("192.0.2.1"), 443).unwrap();
        assert!(d.check_addr("mirror.corp", ip("192.0.2.1"), 80).is_err());
        d.check_addr("a.svc.corp", ip("192.0.2.1"), 1).unwrap();
        assert!(d.check_addr("svc.corp", ip("192.0.2.1"), 1).is_err());
        assert!(d.check_addr("evilsvc.corp", ip("192.0.2.1"), 1).is_err());
        d.check_addr("anything", ip("10.9.9.9"), 22).unwrap();
        d.check_addr("anything", ip("fd00::5"), 8080).unwrap();
        assert!(d.check_addr("anything", ip("fd00::5"), 8081).is_err());
        // A CIDR entry admits a default-refused address; a name never does.
        d.check_addr("anything", ip("169.254.169.254"), 80).unwrap();
        let r = d
            .check_addr("mirror.corp", ip("169.254.1.1"), 443)
            .unwrap_err();
        assert!(r.rule.contains("link-local"), "{r:?}");
        let r = d
            .check_addr("other.example", ip("192.0.2.1"), 443)
            .unwrap_err();
        assert!(r.rule.contains("http.allow"), "{r:?}");
        assert!(r
            .to_wire()
            .message
            .contains("other.example (192.0.2.1) port 443"));
    }

    #[test]
    fn sandbox_intent_denies_or_limits_ports() {
        let deny = SandboxIntent::default();
        let d = Destinations {
            allow: &[],
            sandbox: Some(&deny),
            profile: None,
        };
        assert_eq!(
            d.check_name("127.0.0.1", 80).unwrap_err().code,
            ErrorCode::SandboxDenied
        );
        let ports = SandboxIntent {
            network: NetworkIntent::AllowTcpConnect(vec![8080]),
            ..SandboxIntent::default()
        };
        let d = Destinations {
            allow: &[],
            sandbox: Some(&ports),
            profile: None,
        };
        d.check_name("127.0.0.1", 8080).unwrap();
        assert_eq!(
            d.check_name("127.0.0.1", 80).unwrap_err().code,
            ErrorCode::SandboxDenied
        );
    }

    #[test]
    fn allow_entries_reject_garbage() {
        for bad in [
            "",
            "a:0",
            "a:99999",
            "10.0.0.0/33",
            "[::1",
            "[::1]x",
            "bad host",
            "*.",
        ] {
            assert!(AllowEntry::parse(bad).is_err(), "{bad:?}");
        }
    }
}
