//! `tools/list`: the tool contracts this agent owns, MCP-style. Only tools
//! whose methods are enabled in this build are advertised.

use crate::dispatch::ENABLED;
use crate::session::Session;
use executor_protocol::types::session::{ToolSpec, ToolsListResult};
use executor_protocol::types::Empty;
use executor_protocol::WireError;
use std::sync::Arc;

/// The tool specs this build can serve.
pub fn specs() -> Vec<ToolSpec> {
    let all: Vec<ToolSpec> = Vec::new();
    all.into_iter()
        .filter(|t| ENABLED.contains(&t.name.as_str()))
        .collect()
}

/// `tools/list`
pub async fn list(_s: &Arc<Session>, _p: Empty) -> Result<ToolsListResult, WireError> {
    Ok(ToolsListResult { tools: specs() })
}
