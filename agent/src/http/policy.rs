//! The HTTP destination policy (PROTOCOL.md §6), as pure functions.
//!
//! Two layers decide, and both name the host and the rule when they refuse:
//! - the request's sandbox intent (`network: "deny"` refuses everything,
//!   `allow_tcp_connect` limits ports): `sandbox_denied`;
//! - the agent's configuration (`http.allow`) and the built-in refusals
//!   (link-local, unspecified, cloud metadata addresses): `policy_denied`.
//!
//! Names are checked before resolution; addresses after it, on exactly the
//! addresses the connection will use (IPv4-mapped IPv6 is checked as IPv4).
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
            AllowHost::Net(IpNet::from(normalize(ip)))
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

    fn admits_addr(&self, ip: IpAddr, port: u16) -> bool {
        self.port_ok(port) && matches!(&self.host, AllowHost::Net(net) if net.contains(&ip))
    }
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

/// IPv4-mapped IPv6 (`::ffff:a.b.c.d`) is the IPv4 address it carries.
pub fn normalize(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// A refused destination: the code (which layer), the host, the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: ErrorCode,
    pub host: String,
    pub addr: Option<IpAddr>,
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
        let mut e = WireError::new(
            self.code,
            format!(
                "refused to connect to {}{at} port {}: {}",
                self.host, self.port, self.rule
            ),
        )
        .with("host", self.host.clone())
        .with("port", self.port)
        .with("rule", self.rule.clone());
        if let Some(a) = self.addr {
            e = e.with("address", a.to_string());
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
            port,
            rule: "not in the configuration's http.allow".into(),
        })
    }

    /// After resolving: one address the connection would use.
    pub fn check_addr(&self, host: &str, ip: IpAddr, port: u16) -> Result<(), Refusal> {
        let ip = normalize(ip);
        let refuse = |rule: &str| Refusal {
            code: ErrorCode::PolicyDenied,
            host: host.to_string(),
            addr: Some(ip),
            port,
            rule: rule.to_string(),
        };
        let by_cidr = self.allow.iter().any(|a| a.admits_addr(ip, port));
        if !by_cidr {
            if let Some(rule) = refused_by_default(ip) {
                return Err(refuse(rule));
            }
            let name = host.trim_end_matches('.').to_ascii_lowercase();
            if !self.allow.is_empty() && !self.allow.iter().any(|a| a.admits_name(&name, port)) {
                return Err(refuse("not in the configuration's http.allow"));
            }
        }
        Ok(())
    }
}

/// The built-in refusal an address falls under, if any.
pub fn refused_by_default(ip: IpAddr) -> Option<&'static str> {
    let ip = normalize(ip);
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
