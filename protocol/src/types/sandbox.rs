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

/// `"deny"` (the default), `"allow"` or `{"allow_tcp_connect": [port]}`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NetworkIntent {
    #[default]
    Deny,
    Allow,
    AllowTcpConnect(Vec<u16>),
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
        }
    }
}

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
                    .find(|(k, _)| k.as_str() != Some("allow_tcp_connect"))
                {
                    return Err(de::Error::custom(format!(
                        "unknown field `{}` in network, expected `allow_tcp_connect`",
                        k.as_str()
                            .map(str::to_string)
                            .unwrap_or_else(|| k.to_string())
                    )));
                }
                if let Some((_, ports)) = m.first() {
                    return rmpv::ext::from_value(ports.clone())
                        .map(NetworkIntent::AllowTcpConnect)
                        .map_err(|e| de::Error::custom(format!("allow_tcp_connect: {e}")));
                }
            }
            _ => {}
        }
        Err(de::Error::custom(
            "expected \"deny\", \"allow\" or {\"allow_tcp_connect\": [port]}",
        ))
    }
}
