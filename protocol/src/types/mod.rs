//! Typed params and results, one module per method family.

pub mod exec;
pub mod fs;
pub mod http;
pub mod network;
pub mod process;
pub mod sandbox;
pub mod session;

use crate::error::WireError;
use crate::message::from_params;
use crate::methods as m;
use serde::{Deserialize, Serialize};

/// The `{}` result (and params) of methods that carry nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Empty {}

/// Decode `params` into the type of `method`, discarding the value: used by
/// the fuzzers and by tests to check that every method's params parse.
pub fn validate_params(method: &str, params: rmpv::Value) -> Result<(), WireError> {
    fn v<T: serde::de::DeserializeOwned>(p: rmpv::Value) -> Result<(), WireError> {
        from_params::<T>(p).map(|_| ())
    }
    match method {
        m::INITIALIZE => v::<session::InitializeParams>(params),
        m::ENVIRONMENT_INFO => v::<session::EnvironmentInfoParams>(params),
        m::TOOLS_LIST => v::<Empty>(params),
        m::CANCEL => v::<session::CancelParams>(params),
        m::PROCESS_START => v::<process::ProcessStartParams>(params),
        m::PROCESS_READ => v::<process::ProcessReadParams>(params),
        m::PROCESS_WRITE => v::<process::ProcessWriteParams>(params),
        m::PROCESS_SIGNAL => v::<process::ProcessSignalParams>(params),
        m::PROCESS_RESIZE => v::<process::ProcessResizeParams>(params),
        m::PROCESS_LIST => v::<Empty>(params),
        m::EXEC_COMMAND => v::<exec::ExecCommandParams>(params),
        m::WRITE_STDIN => v::<exec::WriteStdinParams>(params),
        m::FS_STAT => v::<fs::StatParams>(params),
        m::FS_CANONICALIZE => v::<fs::CanonicalizeParams>(params),
        m::FS_READ_FILE => v::<fs::ReadFileParams>(params),
        m::FS_WRITE_FILE => v::<fs::WriteFileParams>(params),
        m::FS_CREATE_DIRECTORY => v::<fs::CreateDirectoryParams>(params),
        m::FS_REMOVE => v::<fs::RemoveParams>(params),
        m::FS_RENAME => v::<fs::RenameParams>(params),
        m::FS_WALK => v::<fs::WalkParams>(params),
        m::FS_OPEN => v::<fs::OpenParams>(params),
        m::FS_READ_BLOCK => v::<fs::ReadBlockParams>(params),
        m::FS_OPEN_WRITE => v::<fs::OpenWriteParams>(params),
        m::FS_WRITE_BLOCK => v::<fs::WriteBlockParams>(params),
        m::FS_COMMIT => v::<fs::HandleParams>(params),
        m::FS_CLOSE => v::<fs::HandleParams>(params),
        m::HTTP_REQUEST => v::<http::HttpRequestParams>(params),
        m::HTTP_CANCEL => v::<http::HttpCancelParams>(params),
        other => Err(WireError::method_not_found(other)),
    }
}

pub(crate) fn yes() -> bool {
    true
}
