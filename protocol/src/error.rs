//! Wire errors: `{"code": str, "message": str, "data"?: map}`.

use rmpv::Value;
use serde::{Deserialize, Serialize};

crate::wire_enum! {
    /// Every error code of docs/PROTOCOL.md §1. Codes this crate does not know
    /// (from a newer agent) decode as [`ErrorCode::Unknown`].
    #[non_exhaustive]
    pub enum ErrorCode {
        ParseError = "parse_error",
        InvalidRequest = "invalid_request",
        FrameTooLarge = "frame_too_large",
        MethodNotFound = "method_not_found",
        InvalidParams = "invalid_params",
        NotInitialized = "not_initialized",
        UnsupportedVersion = "unsupported_version",
        NotFound = "not_found",
        PermissionDenied = "permission_denied",
        AlreadyExists = "already_exists",
        NotADirectory = "not_a_directory",
        IsADirectory = "is_a_directory",
        Io = "io",
        UnknownProcess = "unknown_process",
        UnknownHandle = "unknown_handle",
        UnknownStream = "unknown_stream",
        LimitExceeded = "limit_exceeded",
        SandboxUnavailable = "sandbox_unavailable",
        SandboxDenied = "sandbox_denied",
        PolicyDenied = "policy_denied",
        Timeout = "timeout",
        Cancelled = "cancelled",
        HttpError = "http_error",
        SessionExpired = "session_expired",
        SessionTakenOver = "session_taken_over",
        /// Not in PROTOCOL.md's table (an extension of this implementation):
        /// a resume arrived while another resume of the same session, with
        /// the right token, was still being set up (between its connection
        /// and its `initialize` answer); retry. Once a resume is done, a
        /// new one takes over.
        SessionBusy = "session_busy",
        Internal = "internal",
    }
    other = Unknown;
}

/// An error as carried on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct WireError {
    pub code: ErrorCode,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl WireError {
    /// An error without data.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        WireError {
            code,
            message: message.into(),
            data: None,
        }
    }

    /// Add one `data` entry (creating the map).
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        let entry = (Value::from(key), value.into());
        match &mut self.data {
            Some(Value::Map(m)) => m.push(entry),
            _ => self.data = Some(Value::Map(vec![entry])),
        }
        self
    }

    /// Look up a `data` entry.
    pub fn data_get(&self, key: &str) -> Option<&Value> {
        match &self.data {
            Some(Value::Map(m)) => m
                .iter()
                .find(|(k, _)| k.as_str() == Some(key))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// `invalid_params` naming `field`.
    pub fn invalid_params(field: &str, message: impl Into<String>) -> Self {
        WireError::new(ErrorCode::InvalidParams, message).with("field", field)
    }

    /// `limit_exceeded` with the limit's name, its maximum and what was asked.
    pub fn limit(name: &str, max: u64, requested: Option<u64>) -> Self {
        let msg = match requested {
            Some(r) => format!("limit {name} exceeded: requested {r}, maximum {max}"),
            None => format!("limit {name} reached (maximum {max})"),
        };
        let e = WireError::new(ErrorCode::LimitExceeded, msg)
            .with("limit", name)
            .with("max", max);
        match requested {
            Some(r) => e.with("requested", r),
            None => e,
        }
    }

    /// `method_not_found` naming the method.
    pub fn method_not_found(method: &str) -> Self {
        WireError::new(
            ErrorCode::MethodNotFound,
            format!("method {method:?} is not available on this agent"),
        )
        .with("method", method)
    }
}
