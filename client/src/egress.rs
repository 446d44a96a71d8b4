//! Egress by name from the client's side (docs/PROTOCOL.md §8): the intent
//! types, and the callback that answers the agent's
//! `network/policyRequest` for jobs started with `"ask": true`.
//!
//! ```
//! use executor_client::egress::{EgressPolicy, allow_hosts};
//! use executor_client::protocol::types::network::*;
//!
//! // Jobs may reach the mirror; anything else is put to this callback.
//! let network = allow_hosts(["mirror.internal", "*.forge.corp:443"], true);
//! let policy = EgressPolicy::new(|req: PolicyRequestParams| async move {
//!     let ok = req.host.ends_with(".example") && req.port == 443;
//!     PolicyRequestResult {
//!         decision: if ok { EgressVerdict::Allow } else { EgressVerdict::Deny },
//!         scope: EgressScope::Once,
//!     }
//! });
//! let options = executor_client::ClientOptions {
//!     egress_policy: Some(policy),
//!     ..Default::default()
//! };
//! # let _ = (network, options);
//! ```

use executor_protocol::types::network::{PolicyRequestParams, PolicyRequestResult};
use executor_protocol::types::sandbox::{EgressIntent, NetworkIntent, DEFAULT_ASK_TIMEOUT_MS};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

type Callback = dyn Fn(PolicyRequestParams) -> Pin<Box<dyn Future<Output = PolicyRequestResult> + Send>>
    + Send
    + Sync;

/// Answers `network/policyRequest`. A client with one declares
/// `capabilities.agent_requests` in `initialize`; without one, the agent
/// denies what is not on a job's list (`source: "no_client"`).
#[derive(Clone)]
pub struct EgressPolicy(Arc<Callback>);

impl std::fmt::Debug for EgressPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EgressPolicy(..)")
    }
}

impl EgressPolicy {
    /// A policy from an async callback (called once per question; the agent
    /// asks once per job and host:port at a time).
    pub fn new<F, Fut>(f: F) -> Self
    where
        F: Fn(PolicyRequestParams) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = PolicyRequestResult> + Send + 'static,
    {
        EgressPolicy(Arc::new(move |p| Box::pin(f(p))))
    }

    /// Ask the callback.
    pub async fn decide(&self, request: PolicyRequestParams) -> PolicyRequestResult {
        (self.0)(request).await
    }
}

/// `network: {"allow_hosts": hosts, "ask": ask}` with the default
/// `ask_timeout_ms`.
pub fn allow_hosts<I, S>(hosts: I, ask: bool) -> NetworkIntent
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    NetworkIntent::AllowHosts(EgressIntent {
        allow_hosts: hosts.into_iter().map(Into::into).collect(),
        ask,
        ask_timeout_ms: DEFAULT_ASK_TIMEOUT_MS,
    })
}
