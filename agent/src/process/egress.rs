//! A job's egress proxy (docs/PROTOCOL.md §8), started on the listener the
//! job's init made inside its network namespace: the session's policy,
//! notifications and audit log wired to [`crate::egress`].

use crate::session::Session;
use executor_protocol::methods as m;
use executor_protocol::types::network::{DecisionSource, EgressVerdict};
use executor_protocol::ErrorCode;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

/// Serve a job's egress proxy on `listener`; every decision is also an
/// audit line. `None` (logged) if it cannot be served: the job then
/// reaches nothing at all.
pub(super) fn serve(
    s: &Arc<Session>,
    process_id: &str,
    rules: crate::egress::Rules,
    listener: OwnedFd,
) -> Option<crate::egress::Server> {
    let session = Arc::downgrade(s);
    let audit: crate::egress::AuditSink = Arc::new(move |d| {
        let Some(s) = session.upgrade() else { return };
        if !s.audit().enabled() {
            return;
        }
        let outcome = match (d.decision, d.source) {
            (EgressVerdict::Allow, _) => None,
            (EgressVerdict::Deny, DecisionSource::Policy) => Some(ErrorCode::PolicyDenied),
            (EgressVerdict::Deny, _) => Some(ErrorCode::SandboxDenied),
        };
        let mut details = serde_json::Map::new();
        details.insert("process_id".into(), d.process_id.clone().into());
        details.insert("host".into(), d.host.clone().into());
        details.insert("port".into(), d.port.into());
        details.insert("decision".into(), d.decision.as_str().into());
        details.insert("source".into(), d.source.as_str().into());
        details.insert("addresses".into(), d.addresses.clone().into());
        if let Some(n) = d.suppressed {
            details.insert("suppressed".into(), n.into());
        }
        s.audit().record(crate::audit::Event {
            session_id: s.id(),
            method: m::NETWORK_DECISION,
            id: None,
            details,
            outcome,
            elapsed: Duration::ZERO,
        });
    });
    let job = crate::egress::Job {
        process_id: process_id.to_string(),
        rules,
        allow: s.http().config.allow.clone(),
        outbound: s.outbound().clone(),
        audit,
        max_connections: s.limits().max_egress_connections,
    };
    match crate::egress::serve(listener, job) {
        Ok(server) => Some(server),
        Err(e) => {
            tracing::error!(process_id, error = %e, "cannot serve the job's egress proxy; the job reaches nothing");
            None
        }
    }
}
