//! `SandboxIntent` (docs/PROTOCOL.md §7): what the orchestrator wants enforced.

use crate::path::WirePath;
use serde::de::{self, Deserializer};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};

/// The orchestrator's intent; the agent enforces it or refuses. An
/// unknown key anywhere in it (`deny_reads`, `denyRead`) is an error naming
/// the key, never ignored: a misspelt carve-out must not vanish.
///
/// Each entry of the `filesystem` lists is an absolute path or a symbol
/// (docs/PROTOCOL.md §7): `:cwd`, `:workspace_roots` (or
/// `:workspace_roots/SUBPATH`, that path under each workspace root),
/// `:home`, `:tmp`, `:minimal` (the platform's minimal read set, read roots
/// only); a read or write root written with a leading `?` may be missing
/// (it is skipped instead of refused).
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
    /// What `:workspace_roots` means for this request (absolute paths);
    /// absent: the profile's `workspace_roots`, default the cwd. Under a
    /// profile with `workspace_roots`, each must lie within one of those
    /// (`policy_denied` otherwise): a request only narrows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_roots: Option<Vec<WirePath>>,
}

impl Default for SandboxIntent {
    fn default() -> Self {
        SandboxIntent {
            filesystem: FilesystemIntent::default(),
            network: NetworkIntent::Deny,
            required: true,
            workspace_roots: None,
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

/// Through the deserializer itself, so that a bad root names its index
/// (`sandbox.filesystem.read.1`).
struct ReadRootsVisitor;

impl<'de> de::Visitor<'de> for ReadRootsVisitor {
    type Value = ReadRoots;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"all\" or a list of paths")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<ReadRoots, E> {
        match v {
            "all" => Ok(ReadRoots::All),
            _ => Err(E::custom("expected \"all\" or a list of paths")),
        }
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<ReadRoots, A::Error> {
        let mut roots = Vec::new();
        while let Some(r) = seq.next_element::<WirePath>()? {
            roots.push(r);
        }
        Ok(ReadRoots::Paths(roots))
    }
}

impl<'de> Deserialize<'de> for ReadRoots {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ReadRootsVisitor)
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

/// A value that is never valid: its deserialization fails with the message
/// (so that the error's path, e.g. `sandbox.network.ask_timeout`, names
/// the key it came from).
struct Refuse(String);

impl<'de> de::DeserializeSeed<'de> for Refuse {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, _d: D) -> Result<(), D::Error> {
        Err(de::Error::custom(self.0))
    }
}

/// `ask_timeout_ms`, at most [`MAX_ASK_TIMEOUT_MS`].
struct AskTimeout;

impl<'de> de::DeserializeSeed<'de> for AskTimeout {
    type Value = u64;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        let t = u64::deserialize(d)?;
        if t > MAX_ASK_TIMEOUT_MS {
            return Err(de::Error::custom(format!(
                "ask_timeout_ms: {t} is above the maximum {MAX_ASK_TIMEOUT_MS}"
            )));
        }
        Ok(t)
    }
}

/// Parses a network intent through the deserializer itself (never through
/// a buffered value), so that every error names its exact path: a wrong
/// element is `sandbox.network.allow_hosts.1`, an unknown key
/// `sandbox.network.KEY`, an out-of-range timeout
/// `sandbox.network.ask_timeout_ms`; only a wrong combination of keys is
/// `sandbox.network`.
struct NetworkVisitor;

const EXPECTED_NETWORK: &str =
    "\"deny\", \"allow\", {\"allow_tcp_connect\": [port]} or {\"allow_hosts\": [pattern]}";

impl<'de> de::Visitor<'de> for NetworkVisitor {
    type Value = NetworkIntent;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(EXPECTED_NETWORK)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<NetworkIntent, E> {
        match v {
            "deny" => Ok(NetworkIntent::Deny),
            "allow" => Ok(NetworkIntent::Allow),
            _ => Err(E::custom(format!("expected {EXPECTED_NETWORK}, got {v:?}"))),
        }
    }

    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<NetworkIntent, A::Error> {
        let mut ports: Option<Vec<u16>> = None;
        let mut hosts: Option<Vec<String>> = None;
        let mut ask: Option<bool> = None;
        let mut timeout: Option<u64> = None;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "allow_tcp_connect" if ports.is_none() => ports = Some(map.next_value()?),
                "allow_hosts" if hosts.is_none() => hosts = Some(map.next_value()?),
                "ask" if ask.is_none() => ask = Some(map.next_value()?),
                "ask_timeout_ms" if timeout.is_none() => {
                    timeout = Some(map.next_value_seed(AskTimeout)?)
                }
                "allow_tcp_connect" | "allow_hosts" | "ask" | "ask_timeout_ms" => {
                    map.next_value_seed(Refuse(format!("duplicate field `{key}`")))?;
                    unreachable!("Refuse always fails");
                }
                _ => {
                    map.next_value_seed(Refuse(format!(
                        "unknown field `{key}` in network, expected `allow_tcp_connect` or `allow_hosts` (with `ask`, `ask_timeout_ms`)"
                    )))?;
                    unreachable!("Refuse always fails");
                }
            }
        }
        let egress_key = [ask.map(|_| "ask"), timeout.map(|_| "ask_timeout_ms")]
            .into_iter()
            .flatten()
            .next();
        match (ports, hosts) {
            (Some(_), Some(_)) => Err(de::Error::custom(
                "allow_hosts: cannot be combined with allow_tcp_connect (ports to any host would bypass the host list)",
            )),
            (Some(ports), None) => match egress_key {
                Some(k) => Err(de::Error::custom(format!(
                    "{k}: only with allow_hosts, not with allow_tcp_connect"
                ))),
                None => Ok(NetworkIntent::AllowTcpConnect(ports)),
            },
            (None, Some(allow_hosts)) => Ok(NetworkIntent::AllowHosts(EgressIntent {
                allow_hosts,
                ask: ask.unwrap_or(false),
                ask_timeout_ms: timeout.unwrap_or(DEFAULT_ASK_TIMEOUT_MS),
            })),
            (None, None) => Err(de::Error::custom(match egress_key {
                Some(k) => format!("{k}: only with allow_hosts"),
                None => format!("expected {EXPECTED_NETWORK}, got an empty map"),
            })),
        }
    }
}

impl<'de> Deserialize<'de> for NetworkIntent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NetworkVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::from_params;
    use rmpv::Value;

    fn map(kv: Vec<(&str, Value)>) -> Value {
        Value::Map(kv.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }

    /// The `data.field` of the error for `{"sandbox": intent}`.
    fn field_of(intent: Value) -> String {
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Params {
            sandbox: SandboxIntent,
        }
        let e = from_params::<Params>(map(vec![("sandbox", intent)])).unwrap_err();
        e.data_get("field")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string()
    }

    fn network(kv: Vec<(&str, Value)>) -> Value {
        map(vec![("network", map(kv))])
    }

    fn hosts(h: Vec<Value>) -> (&'static str, Value) {
        ("allow_hosts", Value::Array(h))
    }

    #[test]
    fn paths_are_dotted() {
        assert_eq!(crate::message::dotted("a.b[1].c[22]"), "a.b.1.c.22");
        assert_eq!(crate::message::dotted("[3]"), "3");
        assert_eq!(crate::message::dotted("a[x]"), "a[x]");
        assert_eq!(crate::message::dotted("."), ".");
    }

    #[test]
    fn every_error_in_an_intent_names_its_exact_path() {
        for (intent, field) in [
            (
                network(vec![hosts(vec!["a".into(), 42.into()])]),
                "sandbox.network.allow_hosts.1",
            ),
            (
                network(vec![hosts(vec!["a".into()]), ("ask_timeout", 5.into())]),
                "sandbox.network.ask_timeout",
            ),
            (
                network(vec![hosts(vec!["a".into()]), ("ask", "yes".into())]),
                "sandbox.network.ask",
            ),
            (
                network(vec![
                    hosts(vec!["a".into()]),
                    ("ask_timeout_ms", 600_001.into()),
                ]),
                "sandbox.network.ask_timeout_ms",
            ),
            (
                network(vec![
                    hosts(vec!["a".into()]),
                    ("ask_timeout_ms", (-1).into()),
                ]),
                "sandbox.network.ask_timeout_ms",
            ),
            (
                network(vec![(
                    "allow_tcp_connect",
                    Value::Array(vec![80.into(), 70_000.into()]),
                )]),
                "sandbox.network.allow_tcp_connect.1",
            ),
            (
                network(vec![hosts(vec!["a".into()]), hosts(vec!["b".into()])]),
                "sandbox.network.allow_hosts",
            ),
            (
                network(vec![("allow_hosts", "a".into())]),
                "sandbox.network.allow_hosts",
            ),
            // Combinations name the map.
            (
                network(vec![
                    hosts(vec!["a".into()]),
                    ("allow_tcp_connect", Value::Array(vec![443.into()])),
                ]),
                "sandbox.network",
            ),
            (network(vec![("ask", true.into())]), "sandbox.network"),
            (map(vec![("network", "open".into())]), "sandbox.network"),
            (
                map(vec![(
                    "filesystem",
                    map(vec![("read", Value::Array(vec!["/".into(), 42.into()]))]),
                )]),
                "sandbox.filesystem.read.1",
            ),
            (
                map(vec![("filesystem", map(vec![("read", "some".into())]))]),
                "sandbox.filesystem.read",
            ),
            (
                map(vec![(
                    "filesystem",
                    map(vec![(
                        "deny_write",
                        Value::Array(vec!["/".into(), 1.into()]),
                    )]),
                )]),
                "sandbox.filesystem.deny_write.1",
            ),
        ] {
            assert_eq!(field_of(intent.clone()), field, "{intent}");
        }
    }

    /// Every other nested field too: roots of each list, `required`,
    /// unknown keys at each level, ports, a pattern that is not a string,
    /// a timeout of the wrong type, a duplicate key, a non-string key.
    #[test]
    fn every_nested_field_names_its_path() {
        for (intent, field) in [
            (
                map(vec![(
                    "filesystem",
                    map(vec![("write", Value::Array(vec![1.into()]))]),
                )]),
                "sandbox.filesystem.write.0",
            ),
            (
                map(vec![(
                    "filesystem",
                    map(vec![(
                        "deny_read",
                        Value::Array(vec!["/a".into(), Value::Nil]),
                    )]),
                )]),
                "sandbox.filesystem.deny_read.1",
            ),
            (
                map(vec![(
                    "filesystem",
                    map(vec![("writes", Value::Array(vec![]))]),
                )]),
                "sandbox.filesystem.writes",
            ),
            (map(vec![("required", "yes".into())]), "sandbox.required"),
            (map(vec![("networks", "deny".into())]), "sandbox.networks"),
            (
                network(vec![("allow_tcp_connect", Value::Array(vec![(-1).into()]))]),
                "sandbox.network.allow_tcp_connect.0",
            ),
            (
                network(vec![hosts(vec![Value::Nil])]),
                "sandbox.network.allow_hosts.0",
            ),
            (
                network(vec![
                    hosts(vec!["a".into()]),
                    ("ask_timeout_ms", "5".into()),
                ]),
                "sandbox.network.ask_timeout_ms",
            ),
            (
                network(vec![
                    hosts(vec!["a".into()]),
                    ("ask", true.into()),
                    ("ask", false.into()),
                ]),
                "sandbox.network.ask",
            ),
            (
                map(vec![(
                    "network",
                    Value::Map(vec![(Value::from(1), Value::from(2))]),
                )]),
                "sandbox.network.1",
            ),
        ] {
            assert_eq!(field_of(intent.clone()), field, "{intent}");
        }
    }

    #[test]
    fn the_forms_still_parse() {
        let parse = |v: Value| rmpv::ext::from_value::<NetworkIntent>(v).unwrap();
        assert_eq!(parse("deny".into()), NetworkIntent::Deny);
        assert_eq!(parse("allow".into()), NetworkIntent::Allow);
        assert_eq!(
            parse(map(vec![hosts(vec!["a".into()]), ("ask", true.into())])),
            NetworkIntent::AllowHosts(EgressIntent {
                allow_hosts: vec!["a".into()],
                ask: true,
                ask_timeout_ms: DEFAULT_ASK_TIMEOUT_MS
            })
        );
        assert_eq!(
            parse(map(vec![(
                "allow_tcp_connect",
                Value::Array(vec![443.into()])
            )])),
            NetworkIntent::AllowTcpConnect(vec![443])
        );
        let roots = |v: Value| rmpv::ext::from_value::<ReadRoots>(v).unwrap();
        assert_eq!(
            roots(Value::Array(vec![
                "/a".into(),
                Value::Binary(b"/b".to_vec())
            ])),
            ReadRoots::Paths(vec!["/a".into(), "/b".into()])
        );
        assert_eq!(roots("all".into()), ReadRoots::All);
    }
}
