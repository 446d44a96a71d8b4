//! Egress by name (docs/PROTOCOL.md §8): the agent's request to the client
//! about a destination not on a job's list, and the decision report.

use serde::{Deserialize, Serialize};

crate::wire_enum! {
    /// How the job asked for the destination.
    pub enum EgressProtocol {
        Http = "http",
        Connect = "connect",
        Socks5 = "socks5",
    }
}

crate::wire_enum! {
    pub enum EgressVerdict {
        Allow = "allow",
        Deny = "deny",
    }
}

crate::wire_enum! {
    /// How long a client's `allow` holds.
    pub enum EgressScope {
        /// This connection only.
        Once = "once",
        /// The host:port joins the job's list for its lifetime.
        Process = "process",
    }
}

crate::wire_enum! {
    /// Who decided.
    pub enum DecisionSource {
        Intent = "intent",
        Client = "client",
        Policy = "policy",
        Timeout = "timeout",
        NoClient = "no_client",
        /// Not asked: the job already had the most questions to the client
        /// outstanding at once.
        Limit = "limit",
    }
}

/// `network/policyRequest` (agent → client) params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyRequestParams {
    pub process_id: String,
    /// Canonical: lower case, punycode, or the address.
    pub host: String,
    pub port: u16,
    pub protocol: EgressProtocol,
}

/// The client's answer to `network/policyRequest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyRequestResult {
    pub decision: EgressVerdict,
    #[serde(default = "once")]
    pub scope: EgressScope,
}

fn once() -> EgressScope {
    EgressScope::Once
}

/// `network/decision` (notification).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkDecision {
    pub process_id: String,
    pub host: String,
    pub port: u16,
    pub decision: EgressVerdict,
    pub source: DecisionSource,
    /// The addresses connected to (allow) or refused (deny by policy).
    pub addresses: Vec<String>,
    /// Set on the one report that stands for decisions not reported on
    /// their own (over the job's budget per second): how many, this one
    /// included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suppressed: Option<u64>,
}

/// `"egress"` of a `process/start` / `exec_command` result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressInfo {
    /// `http://127.0.0.1:PORT`, as the job sees it.
    pub proxy: String,
}
