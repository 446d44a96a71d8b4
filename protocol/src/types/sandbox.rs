//! `SandboxIntent` (docs/PROTOCOL.md §7): what the orchestrator wants enforced.

use crate::path::WirePath;
use serde::de::{self, Deserializer};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};

/// The orchestrator's intent; the agent enforces it or refuses. An
/// unknown key anywhere in it (`deny_reads`, `denyRead`) is an error naming
/// the key, never ignored: a misspelt carve-out must not vanish.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxIntent {
    #[serde(default)]
    pub filesystem: FilesystemIntent,
    #[serde(default)]
    pub network: NetworkIntent,
    /// Fail closed (`sandbox_unavailable`) when not every part can be enforced.
    #[serde(default = "super::yes")]
    pub required: bool,
}

impl Default for SandboxIntent {
    fn default() -> Self {
        SandboxIntent {
            filesystem: FilesystemIntent::default(),
            network: NetworkIntent::Deny,
            required: true,
        }
    }
}

/// Filesystem part of an intent.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FilesystemIntent {
    pub read: ReadRoots,
    pub write: Vec<WirePath>,
    pub deny_read: Vec<WirePath>,
    pub deny_write: Vec<WirePath>,
}

/// `"all"` or a list of roots.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ReadRoots {
    #[default]
    All,
    Paths(Vec<WirePath>),
}

impl Serialize for ReadRoots {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ReadRoots::All => s.serialize_str("all"),
            ReadRoots::Paths(p) => p.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for ReadRoots {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match rmpv::Value::deserialize(d)? {
            rmpv::Value::String(s) if s.as_str() == Some("all") => Ok(ReadRoots::All),
            v @ rmpv::Value::Array(_) => rmpv::ext::from_value(v)
                .map(ReadRoots::Paths)
                .map_err(de::Error::custom),
            _ => Err(de::Error::custom("expected \"all\" or a list of paths")),
        }
    }
}

/// `"deny"` (the default), `"allow"`, `{"allow_tcp_connect": [port]}` or
/// egress by name, `{"allow_hosts": [pattern], "ask"?, "ask_timeout_ms"?}`
/// (docs/PROTOCOL.md §8).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NetworkIntent {
    #[default]
    Deny,
    Allow,
    AllowTcpConnect(Vec<u16>),
    AllowHosts(EgressIntent),
}

/// Egress by name: the job reaches the hosts its patterns name, through the
/// agent's proxy, and nothing else. The patterns are strings here (this
/// crate does no IDNA); the agent parses them and refuses a bad one naming
/// its index (`sandbox.network.allow_hosts.2`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressIntent {
    pub allow_hosts: Vec<String>,
    /// Put a destination not on the list to the client
    /// (`network/policyRequest`).
    #[serde(default)]
    pub ask: bool,
    #[serde(default = "default_ask_timeout_ms")]
    pub ask_timeout_ms: u64,
}

/// How long the agent waits for an answer to `network/policyRequest`.
pub const DEFAULT_ASK_TIMEOUT_MS: u64 = 30_000;
/// The longest `ask_timeout_ms` (10 minutes): a job's connection is held
/// open that long at most.
pub const MAX_ASK_TIMEOUT_MS: u64 = 600_000;

fn default_ask_timeout_ms() -> u64 {
    DEFAULT_ASK_TIMEOUT_MS
}

impl Serialize for NetworkIntent {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            NetworkIntent::Deny => s.serialize_str("deny"),
            NetworkIntent::Allow => s.serialize_str("allow"),
            NetworkIntent::AllowTcpConnect(ports) => {
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("allow_tcp_connect", ports)?;
                m.end()
            }
            NetworkIntent::AllowHosts(e) => e.serialize(s),
        }
    }
}

/// The keys a network map may hold.
const NETWORK_KEYS: [&str; 4] = ["allow_tcp_connect", "allow_hosts", "ask", "ask_timeout_ms"];

impl<'de> Deserialize<'de> for NetworkIntent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = rmpv::Value::deserialize(d)?;
        match &v {
            rmpv::Value::String(s) => match s.as_str() {
                Some("deny") => return Ok(NetworkIntent::Deny),
                Some("allow") => return Ok(NetworkIntent::Allow),
                _ => {}
            },
            rmpv::Value::Map(m) => {
                if let Some((k, _)) = m
                    .iter()
                    .find(|(k, _)| !k.as_str().is_some_and(|k| NETWORK_KEYS.contains(&k)))
                {
                    return Err(de::Error::custom(format!(
                        "unknown field `{}` in network, expected `allow_tcp_connect` or `allow_hosts` (with `ask`, `ask_timeout_ms`)",
                        k.as_str()
                            .map(str::to_string)
                            .unwrap_or_else(|| k.to_string())
                    )));
                }
                let get = |name: &str| m.iter().find(|(k, _)| k.as_str() == Some(name));
                let egress_keys = ["allow_hosts", "ask", "ask_timeout_ms"];
                match (get("allow_tcp_connect"), get("allow_hosts")) {
                    (Some(_), Some(_)) => {
                        return Err(de::Error::custom(
                            "allow_hosts: cannot be combined with allow_tcp_connect (ports to any host would bypass the host list)",
                        ))
                    }
                    (Some((_, ports)), None) => {
                        if let Some(k) = egress_keys.iter().find(|k| get(k).is_some()) {
                            return Err(de::Error::custom(format!(
                                "{k}: only with allow_hosts, not with allow_tcp_connect"
                            )));
                        }
                        return rmpv::ext::from_value(ports.clone())
                            .map(NetworkIntent::AllowTcpConnect)
                            .map_err(|e| de::Error::custom(format!("allow_tcp_connect: {e}")));
                    }
                    (None, Some(_)) => {
                        let e: EgressIntent = rmpv::ext::from_value(v.clone())
                            .map_err(|e| de::Error::custom(format!("network: {e}")))?;
                        if e.ask_timeout_ms > MAX_ASK_TIMEOUT_MS {
                            return Err(de::Error::custom(format!(
                                "ask_timeout_ms: {} is above the maximum {MAX_ASK_TIMEOUT_MS}",
                                e.ask_timeout_ms
                            )));
                        }
                        return Ok(NetworkIntent::AllowHosts(e));
                    }
                    (None, None) => {
                        if let Some(k) = egress_keys.iter().find(|k| get(k).is_some()) {
                            return Err(de::Error::custom(format!(
                                "{k}: only with allow_hosts"
                            )));
                        }
                    }
                }
            }
            _ => {}
        }
        Err(de::Error::custom(
            "expected \"deny\", \"allow\", {\"allow_tcp_connect\": [port]} or {\"allow_hosts\": [pattern]}",
        ))
    }
}
