//! `tools/list`: the tool contracts this agent owns, MCP-style (one per
//! tool method of the protocol's table).
//!
//! A handler module: it uses the session, nothing above it.

use crate::session::Session;
use executor_protocol::methods as m;
use executor_protocol::types::exec::{DEFAULT_MAX_OUTPUT_TOKENS, DEFAULT_YIELD_TIME_MS};
use executor_protocol::types::session::{ToolSpec, ToolsListParams, ToolsListResult};
use executor_protocol::WireError;
use serde_json::json;
use std::sync::Arc;

fn schema(v: serde_json::Value) -> rmpv::Value {
    rmpv::ext::to_value(v).unwrap_or(rmpv::Value::Nil)
}

/// The tool specs this build can serve.
pub fn specs() -> Vec<ToolSpec> {
    let all = vec![
        ToolSpec {
            name: m::EXEC_COMMAND.into(),
            description: "Run a command (final argv, no shell added) on the executor host. Returns its output \
                          and exit code if it finishes within yield_time_ms, else a process_id to continue \
                          with write_stdin."
                .into(),
            input_schema: schema(json!({
                "type": "object",
                "properties": {
                    "command": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                                "description": "argv; argv[0] is looked up in env.PATH when it has no '/'"},
                    "cwd": {"type": "string", "description": "absolute working directory"},
                    "env": {"type": "object", "additionalProperties": {"type": "string"},
                            "description": "the complete environment"},
                    "tty": {"type": "boolean", "default": false},
                    "yield_time_ms": {"type": "integer", "minimum": 0, "default": DEFAULT_YIELD_TIME_MS},
                    "max_output_tokens": {"type": "integer", "minimum": 0, "default": DEFAULT_MAX_OUTPUT_TOKENS},
                    "sandbox_permissions": {"type": "object"},
                    "additional_permissions": {"type": "object"},
                    "additional_permissions_preapproved": {"type": "boolean"},
                    "justification": {"type": "string"},
                    "exec_approval_requirement": {"description": "accepted and ignored"},
                    "env_base": {"type": "string", "enum": ["none", "agent", "login"], "default": "none"}
                },
                "required": ["command", "cwd", "env"],
                "additionalProperties": false
            })),
        },
        ToolSpec {
            name: m::WRITE_STDIN.into(),
            description: "Write to a running exec_command process (empty input polls; \\u0003 interrupts) \
                          and collect its output since the previous call."
                .into(),
            input_schema: schema(json!({
                "type": "object",
                "properties": {
                    "process_id": {"type": "string"},
                    "input": {"type": "string", "default": ""},
                    "yield_time_ms": {"type": "integer", "minimum": 0, "default": DEFAULT_YIELD_TIME_MS},
                    "max_output_tokens": {"type": "integer", "minimum": 0, "default": DEFAULT_MAX_OUTPUT_TOKENS}
                },
                "required": ["process_id"],
                "additionalProperties": false
            })),
        },
    ];
    all.into_iter()
        .filter(|t| m::ALL_REQUESTS.contains(&t.name.as_str()))
        .collect()
}

/// `tools/list`
pub async fn list(_s: &Arc<Session>, _p: ToolsListParams) -> Result<ToolsListResult, WireError> {
    Ok(ToolsListResult { tools: specs() })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The schemas say `additionalProperties: false` because the methods
    /// refuse unknown keys: every property they list is a key the method
    /// accepts, and a key they do not list is refused.
    #[test]
    fn each_schema_lists_exactly_keys_its_method_accepts() {
        for spec in specs() {
            let json: serde_json::Value = rmpv::ext::from_value(spec.input_schema).unwrap();
            assert_eq!(json["additionalProperties"], false, "{}", spec.name);
            let props = json["properties"].as_object().unwrap();
            let known = |key: &str| {
                let params = rmpv::Value::Map(vec![(key.into(), rmpv::Value::Nil)]);
                match m::validate_params(&spec.name, params) {
                    Err(e) => !e.message.contains("unknown field"),
                    Ok(()) => true,
                }
            };
            for key in props.keys() {
                assert!(known(key), "{}: {key} is listed but refused", spec.name);
            }
            assert!(!known("zz_unlisted"), "{}", spec.name);
        }
    }
}
