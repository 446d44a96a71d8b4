//! Native errors as the Codex dialect reports them: the reference's
//! numeric codes (`-32004` not found, `-32600` invalid request and
//! permission, `-32602` invalid params, `-32601` no such method, `-32603`
//! everything else) and, for a filesystem error, the reference's message
//! (the OS error's text, "No such file or directory (os error 2)"). A
//! sandbox or profile refusal keeps executor's message, which names the
//! path and the layer. Uses only the protocol crate.

use super::wire::{code, RpcError};
use executor_protocol::error::{ErrorCode, WireError};

/// `e` in the dialect.
pub fn from_wire(e: &WireError) -> RpcError {
    let errno = e
        .data_get("errno")
        .and_then(|v| v.as_i64())
        .filter(|n| *n > 0);
    let os = || errno.map(|n| std::io::Error::from_raw_os_error(n as i32).to_string());
    match e.code {
        ErrorCode::NotFound => RpcError::new(
            code::NOT_FOUND,
            os().unwrap_or_else(|| "No such file or directory (os error 2)".into()),
        ),
        ErrorCode::InvalidParams => RpcError::new(code::INVALID_PARAMS, e.message.clone()),
        ErrorCode::MethodNotFound => RpcError::new(code::METHOD_NOT_FOUND, e.message.clone()),
        ErrorCode::PermissionDenied => RpcError::new(
            code::INVALID_REQUEST,
            os().unwrap_or_else(|| e.message.clone()),
        ),
        ErrorCode::SandboxDenied
        | ErrorCode::PolicyDenied
        | ErrorCode::InvalidRequest
        | ErrorCode::NotInitialized
        | ErrorCode::SandboxUnavailable => RpcError::new(code::INVALID_REQUEST, e.message.clone()),
        ErrorCode::AlreadyExists
        | ErrorCode::NotADirectory
        | ErrorCode::IsADirectory
        | ErrorCode::Io => RpcError::new(code::INTERNAL, os().unwrap_or_else(|| e.message.clone())),
        _ => RpcError::new(code::INTERNAL, e.message.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_messages() {
        let nf = WireError::new(ErrorCode::NotFound, "stat /x: gone").with("errno", 2);
        assert_eq!(
            from_wire(&nf),
            RpcError::new(-32004, "No such file or directory (os error 2)")
        );
        let exists = WireError::new(ErrorCode::AlreadyExists, "mkdir /x").with("errno", 17);
        assert_eq!(
            from_wire(&exists),
            RpcError::new(-32603, "File exists (os error 17)")
        );
        let denied = WireError::new(ErrorCode::SandboxDenied, "write /x: outside the roots");
        assert_eq!(from_wire(&denied).code, -32600);
        assert_eq!(from_wire(&denied).message, "write /x: outside the roots");
        let bad = WireError::new(ErrorCode::InvalidParams, "argv must not be empty");
        assert_eq!(from_wire(&bad).code, -32602);
    }
}
