//! Destinations and `allow_hosts` patterns in canonical form
//! (docs/PROTOCOL.md §8), as pure functions.
//!
//! A host is canonicalized once, the same way for a pattern and for what a
//! job asks for: lower case, one trailing dot dropped, IDNA to ASCII
//! (punycode), and a numeric host in any IPv4 form the WHATWG URL parser
//! knows (decimal `2130706433`, octal `0177.0.0.1`, hex `0x7f.1`, short
//! `127.1`) or IPv6 form turned into its address; an IPv6 address that
//! carries one IPv4 address (mapped, translated, compatible, NAT64, 6to4)
//! is that IPv4 address. Then a pattern matches by what it is, never by
//! what a name resolves to: a name pattern admits that name, `*.domain`
//! admits names below `domain`, an address or network pattern admits
//! numeric destinations in it.
//!
//! Depends on [`crate::destinations`] (the embedded-IPv4 forms) only.

use crate::destinations::embedded_ipv4;
use ipnet::IpNet;
use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

/// A destination host in canonical form.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Host {
    /// ASCII, lower case, no trailing dot.
    Name(String),
    Ip(IpAddr),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(IpAddr::V6(a)) => write!(f, "[{a}]"),
            Host::Ip(a) => write!(f, "{a}"),
        }
    }
}

impl Host {
    /// As a URL or `Host` header writes it (IPv6 in brackets), with `:port`.
    pub fn with_port(&self, port: u16) -> String {
        format!("{self}:{port}")
    }

    /// The host without brackets (for `network/decision` and the audit).
    pub fn bare(&self) -> String {
        match self {
            Host::Name(n) => n.clone(),
            Host::Ip(a) => a.to_string(),
        }
    }
}

/// The address an IPv6 address stands for: the IPv4 address it carries
/// when it carries exactly one (Teredo carries two and stays IPv6).
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match embedded_ipv4(v6).as_slice() {
            [one] => IpAddr::V4(one.ipv4),
            _ => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

fn valid_ascii_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        })
}

/// Canonicalize a host as a job or a pattern wrote it (a name, an IPv4
/// address in any form, an IPv6 address with or without brackets).
pub fn canonicalize(host: &str) -> Result<Host, String> {
    let t = host.strip_suffix('.').unwrap_or(host);
    if t.is_empty() {
        return Err("empty host".into());
    }
    if let Some(inner) = t.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        return inner
            .parse::<Ipv6Addr>()
            .map(|a| Host::Ip(canonical_ip(IpAddr::V6(a))))
            .map_err(|_| format!("{host:?} is not an IPv6 address"));
    }
    if let Ok(a) = t.parse::<Ipv6Addr>() {
        return Ok(Host::Ip(canonical_ip(IpAddr::V6(a))));
    }
    match url::Host::parse(t) {
        Ok(url::Host::Ipv4(a)) => Ok(Host::Ip(IpAddr::V4(a))),
        Ok(url::Host::Ipv6(a)) => Ok(Host::Ip(canonical_ip(IpAddr::V6(a)))),
        Ok(url::Host::Domain(d)) => {
            // A second trailing dot ("a.b..") is an empty label: refused.
            if valid_ascii_name(&d) {
                Ok(Host::Name(d))
            } else {
                Err(format!("{host:?} is not a valid host name"))
            }
        }
        Err(e) => Err(format!("{host:?} is not a valid host: {e}")),
    }
}

/// What a pattern admits, host side.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Admits {
    Name(String),
    /// `*.suffix`: names ending in `.suffix`, not `suffix` itself.
    Below(String),
    Net(IpNet),
}

/// One `allow_hosts` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    host: Admits,
    /// `None`: 80 and 443.
    port: Option<u16>,
}

/// The ports a pattern without `:port` admits.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

fn parse_port(p: &str) -> Result<u16, String> {
    match p.parse::<u16>() {
        Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
        _ => Err(format!("port {p:?} is not a number in 1..=65535")),
    }
}

fn net(text: &str) -> Result<IpNet, String> {
    let n: IpNet = text
        .parse()
        .map_err(|_| format!("{text:?} is not a valid CIDR network"))?;
    // An IPv6 network of embedded IPv4 addresses is the IPv4 network.
    if let IpNet::V6(v6) = n {
        if v6.prefix_len() >= 96 {
            if let IpAddr::V4(a) = canonical_ip(IpAddr::V6(v6.network())) {
                let len = v6.prefix_len() - 96;
                return IpNet::new(IpAddr::V4(a), len)
                    .map(|n| n.trunc())
                    .map_err(|e| e.to_string());
            }
        }
    }
    Ok(n.trunc())
}

impl Pattern {
    /// `host`, `*.domain`, `10.1.2.3`, `[fd00::7]`, `10.20.0.0/16`,
    /// `[fd00::]/64` (or `[fd00::/64]`), each optionally with `:port`.
    pub fn parse(text: &str) -> Result<Pattern, String> {
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let (inner, after) = rest
                .split_once(']')
                .ok_or_else(|| "missing ']'".to_string())?;
            let (prefix, port) = match after.split_once(':') {
                Some((pre, p)) => (pre, Some(p)),
                None => (after, None),
            };
            let addr = match prefix {
                "" => inner.to_string(),
                pre if pre.starts_with('/') && !inner.contains('/') => format!("{inner}{pre}"),
                _ => return Err("expected '/len' or ':port' after ']'".into()),
            };
            if !addr.contains(':') {
                return Err("brackets are for IPv6 addresses".into());
            }
            (addr, port)
        } else if text.parse::<IpAddr>().is_ok() || text.parse::<IpNet>().is_ok() {
            (text.to_string(), None)
        } else {
            match text.rsplit_once(':') {
                Some((h, _)) if h.contains(':') => {
                    return Err("an IPv6 address with a port needs brackets: [addr]:port".into())
                }
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (text.to_string(), None),
            }
        };
        let port = port.map(parse_port).transpose()?;
        let admits = if host.contains('/') {
            Admits::Net(net(&host)?)
        } else if let Some(suffix) = host.strip_prefix("*.") {
            match canonicalize(suffix)? {
                Host::Name(n) => Admits::Below(n),
                Host::Ip(_) => return Err("*. must be followed by a domain name".into()),
            }
        } else if host.contains('*') {
            return Err("a wildcard is only allowed as a leading '*.'".into());
        } else {
            match canonicalize(&host)? {
                Host::Name(n) => Admits::Name(n),
                Host::Ip(a) => Admits::Net(IpNet::from(a)),
            }
        };
        Ok(Pattern { host: admits, port })
    }

    /// Whether it admits `host` at `port`.
    pub fn admits(&self, host: &Host, port: u16) -> bool {
        let port_ok = match self.port {
            Some(p) => p == port,
            None => DEFAULT_PORTS.contains(&port),
        };
        port_ok
            && match (&self.host, host) {
                (Admits::Name(n), Host::Name(h)) => n == h,
                (Admits::Below(s), Host::Name(h)) => {
                    h.len() > s.len() + 1
                        && h.ends_with(s.as_str())
                        && h.as_bytes()[h.len() - s.len() - 1] == b'.'
                }
                (Admits::Net(n), Host::Ip(a)) => n.contains(a),
                _ => false,
            }
    }
}

/// Parse a whole list; the error names the index of the bad entry.
pub fn parse_list(list: &[String]) -> Result<Vec<Pattern>, (usize, String)> {
    list.iter()
        .enumerate()
        .map(|(i, p)| Pattern::parse(p).map_err(|e| (i, format!("{p:?}: {e}"))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Host {
        canonicalize(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn every_numeric_form_is_its_address() {
        let lo = Host::Ip("127.0.0.1".parse().unwrap());
        for form in [
            "127.0.0.1",
            "127.0.0.1.",
            "2130706433",
            "0x7f000001",
            "0x7f.1",
            "0177.0.0.1",
            "127.1",
            "017700000001",
            "[::ffff:127.0.0.1]",
            "::ffff:7f00:1",
            "[64:ff9b::7f00:1]",
            "[::ffff:0:127.0.0.1]",
        ] {
            assert_eq!(c(form), lo, "{form}");
        }
        assert_eq!(
            c("[FD00::0007]"),
            Host::Ip("fd00::7".parse().unwrap()),
            "IPv6 in canonical text"
        );
    }

    #[test]
    fn names_are_lowercase_punycode_without_the_trailing_dot() {
        assert_eq!(c("Mirror.Internal."), Host::Name("mirror.internal".into()));
        assert_eq!(
            c("BÜCHER.example"),
            Host::Name("xn--bcher-kva.example".into())
        );
        assert_eq!(c("xn--bcher-kva.example"), c("bücher.example"));
        for bad in [
            "",
            ".",
            "a..b",
            "a b",
            "a/b",
            "host:80",
            "[1.2.3.4]",
            "a..",
            "-",
        ] {
            if bad == "-" {
                continue; // a valid (if odd) label
            }
            assert!(canonicalize(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn patterns_match_by_kind_and_port() {
        let p = |s: &str| Pattern::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        let name = |s: &str| c(s);
        assert!(p("mirror.internal").admits(&name("MIRROR.internal."), 443));
        assert!(p("mirror.internal").admits(&name("mirror.internal"), 80));
        assert!(!p("mirror.internal").admits(&name("mirror.internal"), 8080));
        assert!(!p("mirror.internal").admits(&name("evil.mirror.internal"), 443));
        assert!(p("*.forge.corp:443").admits(&name("git.forge.corp"), 443));
        assert!(p("*.forge.corp:443").admits(&name("a.b.forge.corp"), 443));
        assert!(!p("*.forge.corp:443").admits(&name("forge.corp"), 443));
        assert!(!p("*.forge.corp:443").admits(&name("evilforge.corp"), 443));
        assert!(!p("*.forge.corp:443").admits(&name("git.forge.corp"), 80));
        assert!(p("10.20.0.0/16:8080").admits(&name("10.20.3.4"), 8080));
        assert!(p("10.20.0.0/16:8080").admits(&name("[::ffff:10.20.3.4]"), 8080));
        assert!(p("10.20.0.0/16:8080").admits(&name("0x0a.20.3.4"), 8080));
        assert!(!p("10.20.0.0/16:8080").admits(&name("10.21.0.1"), 8080));
        assert!(p("[fd00::]/64").admits(&name("[fd00::1:2]"), 443));
        assert!(p("[fd00::/64]:22").admits(&name("[fd00::1]"), 22));
        assert!(p("[fd00::7]:8443").admits(&name("[fd00::7]"), 8443));
        assert!(p("fd00::7").admits(&name("[fd00::7]"), 80));
        assert!(p("127.1:9000").admits(&name("127.0.0.1"), 9000));
        assert!(p("[::ffff:10.0.0.0]/104").admits(&name("10.1.2.3"), 80));
        // A name never matches an address pattern, nor the reverse.
        assert!(!p("127.0.0.1").admits(&name("localhost"), 80));
        assert!(!p("localhost").admits(&name("127.0.0.1"), 80));
        // IDNA in patterns.
        assert!(p("bücher.example").admits(&name("xn--bcher-kva.example"), 443));
    }

    #[test]
    fn bad_patterns_are_refused_with_their_index() {
        for bad in [
            "",
            "host:0",
            "host:65536",
            "host:+80",
            "host:",
            "fd00::7:80x",
            "[fd00::7",
            "[fd00::7]x",
            "[1.2.3.4]",
            "10.0.0.0/33",
            "a*.b",
            "*.",
            "*.10.0.0.1",
            "a b",
            "http://x",
        ] {
            assert!(Pattern::parse(bad).is_err(), "{bad:?}");
        }
        let e = parse_list(&["ok.example".into(), "x:99999".into()]).unwrap_err();
        assert_eq!(e.0, 1);
    }
}
