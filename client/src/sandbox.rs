//! [`Intent`]: build a [`SandboxIntent`] the way `landrun` and `bwrap`
//! users think of one (read roots, write roots, carve-outs, network), for
//! `process/start`, the fs helpers ([`crate::Client::with_sandbox`]) and
//! `http/request`.
//!
//! ```
//! use executor_client::sandbox::{Intent, Net};
//!
//! let intent = Intent::new()
//!     .read("/usr")
//!     .read("/lib")
//!     .write("/tmp/work")
//!     .deny_read("/tmp/work/secrets")
//!     .net(Net::TcpConnect(vec![443]))
//!     .build();
//! assert!(intent.required);
//! ```

use executor_protocol::types::sandbox::{
    EgressIntent, FilesystemIntent, NetworkIntent, ReadRoots, SandboxIntent, DEFAULT_ASK_TIMEOUT_MS,
};
use executor_protocol::WirePath;

/// Network of an [`Intent`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Net {
    /// No network (the default).
    Deny,
    /// The host's network.
    Allow,
    /// Outbound TCP to these ports only.
    TcpConnect(Vec<u16>),
    /// Egress by name (docs/PROTOCOL.md §8): only these destinations
    /// (`host`, `*.suffix`, `addr/len`, each with an optional `:port`),
    /// through the job's proxy; with `ask`, another destination is put to
    /// the client's [`crate::egress::EgressPolicy`], which has
    /// `ask_timeout_ms` to answer before the agent denies.
    Hosts {
        hosts: Vec<String>,
        ask: bool,
        ask_timeout_ms: u64,
    },
}

/// A [`SandboxIntent`] under construction. Without any [`Intent::read`]
/// everything is readable; the first one makes reads limited to the roots
/// given. Writes are denied but under [`Intent::write`] roots.
#[derive(Debug, Clone, Default)]
pub struct Intent {
    read: Vec<WirePath>,
    write: Vec<WirePath>,
    deny_read: Vec<WirePath>,
    deny_write: Vec<WirePath>,
    net: Option<Net>,
    best_effort: bool,
    workspace_roots: Option<Vec<WirePath>>,
}

impl Intent {
    /// Read everything, write nothing, no network, required.
    pub fn new() -> Self {
        Intent::default()
    }

    /// Start from a whole intent (e.g. one read from JSON).
    pub fn from_intent(intent: SandboxIntent) -> Self {
        let read = match intent.filesystem.read {
            ReadRoots::All => Vec::new(),
            ReadRoots::Paths(p) => p,
        };
        Intent {
            read,
            write: intent.filesystem.write,
            deny_read: intent.filesystem.deny_read,
            deny_write: intent.filesystem.deny_write,
            net: Some(match intent.network {
                NetworkIntent::Deny => Net::Deny,
                NetworkIntent::Allow => Net::Allow,
                NetworkIntent::AllowTcpConnect(p) => Net::TcpConnect(p),
                NetworkIntent::AllowHosts(e) => Net::Hosts {
                    hosts: e.allow_hosts,
                    ask: e.ask,
                    ask_timeout_ms: e.ask_timeout_ms,
                },
            }),
            best_effort: !intent.required,
            workspace_roots: intent.workspace_roots,
        }
    }

    /// Make `path` readable (and limit reads to the roots given).
    pub fn read(mut self, path: impl Into<WirePath>) -> Self {
        self.read.push(path.into());
        self
    }

    /// Make `path` writable (and readable).
    pub fn write(mut self, path: impl Into<WirePath>) -> Self {
        self.write.push(path.into());
        self
    }

    /// Deny reading `path` (inside a readable root).
    pub fn deny_read(mut self, path: impl Into<WirePath>) -> Self {
        self.deny_read.push(path.into());
        self
    }

    /// Deny writing `path` (inside a writable root).
    pub fn deny_write(mut self, path: impl Into<WirePath>) -> Self {
        self.deny_write.push(path.into());
        self
    }

    /// A private, writable `/tmp` for the job (the `:tmp` write root:
    /// removed when the job ends; grants nothing to fs requests).
    pub fn tmp(self) -> Self {
        self.write(":tmp")
    }

    /// What `:workspace_roots` means for this request (within the
    /// profile's `workspace_roots`, when it has some).
    pub fn workspace_root(mut self, path: impl Into<WirePath>) -> Self {
        self.workspace_roots
            .get_or_insert_with(Vec::new)
            .push(path.into());
        self
    }

    /// The network.
    pub fn net(mut self, net: Net) -> Self {
        self.net = Some(net);
        self
    }

    /// `required: false`: what cannot be enforced is reported in
    /// `sandbox_degraded` instead of refusing with `sandbox_unavailable`.
    pub fn best_effort(mut self, yes: bool) -> Self {
        self.best_effort = yes;
        self
    }

    /// The intent.
    pub fn build(self) -> SandboxIntent {
        let read = if self.read.is_empty() {
            ReadRoots::All
        } else {
            ReadRoots::Paths(self.read)
        };
        SandboxIntent {
            filesystem: FilesystemIntent {
                read,
                write: self.write,
                deny_read: self.deny_read,
                deny_write: self.deny_write,
            },
            network: match self.net.unwrap_or(Net::Deny) {
                Net::Deny => NetworkIntent::Deny,
                Net::Allow => NetworkIntent::Allow,
                Net::TcpConnect(p) => NetworkIntent::AllowTcpConnect(p),
                Net::Hosts {
                    hosts,
                    ask,
                    ask_timeout_ms,
                } => NetworkIntent::AllowHosts(EgressIntent {
                    allow_hosts: hosts,
                    ask,
                    ask_timeout_ms,
                }),
            },
            required: !self.best_effort,
            workspace_roots: self.workspace_roots,
        }
    }
}

impl std::str::FromStr for Net {
    type Err = String;

    /// `deny`, `allow`, `tcp:PORT[,PORT…]`, `host:PATTERN[,PATTERN…]`,
    /// `ask` or `ask:PATTERN[,PATTERN…]` (the list, and a question to the
    /// client for anything else).
    fn from_str(s: &str) -> Result<Net, String> {
        let hosts = |list: &str| -> Result<Vec<String>, String> {
            let hosts: Vec<String> = list
                .split(',')
                .filter(|h| !h.is_empty())
                .map(str::to_string)
                .collect();
            Ok(hosts)
        };
        match s {
            "deny" => Ok(Net::Deny),
            "allow" => Ok(Net::Allow),
            "ask" => Ok(Net::Hosts {
                hosts: Vec::new(),
                ask: true,
                ask_timeout_ms: DEFAULT_ASK_TIMEOUT_MS,
            }),
            _ if s.starts_with("host:") => {
                let list = hosts(&s["host:".len()..])?;
                if list.is_empty() {
                    return Err(format!("{s:?} names no host (host:NAME[,NAME...])"));
                }
                Ok(Net::Hosts {
                    hosts: list,
                    ask: false,
                    ask_timeout_ms: DEFAULT_ASK_TIMEOUT_MS,
                })
            }
            _ if s.starts_with("ask:") => Ok(Net::Hosts {
                hosts: hosts(&s["ask:".len()..])?,
                ask: true,
                ask_timeout_ms: DEFAULT_ASK_TIMEOUT_MS,
            }),
            _ => {
                let ports = s
                    .strip_prefix("tcp:")
                    .ok_or_else(|| {
                        format!("{s:?} is not deny, allow, tcp:PORT[,PORT...], host:NAME[,NAME...] or ask[:NAME,...]")
                    })?;
                ports
                    .split(',')
                    .map(|p| {
                        p.parse::<u16>()
                            .ok()
                            .filter(|&n| n != 0)
                            .ok_or_else(|| format!("{p:?} in {s:?} is not a port (1-65535)"))
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map(Net::TcpConnect)
            }
        }
    }
}

#[cfg(test)]
mod round_trip {
    use super::*;

    #[test]
    fn a_whole_intent_round_trips_through_the_builder() {
        let whole = SandboxIntent {
            network: NetworkIntent::AllowHosts(EgressIntent {
                allow_hosts: vec!["mirror.internal".into()],
                ask: true,
                ask_timeout_ms: 1500,
            }),
            required: false,
            workspace_roots: Some(vec!["/srv/ws".into()]),
            ..SandboxIntent::default()
        };
        assert_eq!(Intent::from_intent(whole.clone()).build(), whole);
    }
}
