//! Shared by the fuzz targets: typed decoding of every request's params,
//! and the confined in-process agent the dispatch target drives.

use executor_protocol::message::from_params;
use executor_protocol::methods as m;
use executor_protocol::types::{exec, fs, http, process, session, Empty};
use rmpv::Value;

pub mod agent;

/// Decode `params` as the typed params of `method` (every request type of
/// the protocol); the outcome is ignored, only a panic matters.
pub fn decode_typed(method: &str, params: Value) {
    macro_rules! try_as {
        ($t:ty) => {{
            let _ = from_params::<$t>(params);
        }};
    }
    match method {
        m::INITIALIZE => try_as!(session::InitializeParams),
        m::ENVIRONMENT_INFO => try_as!(session::EnvironmentInfoParams),
        m::TOOLS_LIST | m::PROCESS_LIST => try_as!(Empty),
        m::CANCEL => try_as!(session::CancelParams),
        m::PROCESS_START => try_as!(process::ProcessStartParams),
        m::PROCESS_READ => try_as!(process::ProcessReadParams),
        m::PROCESS_WRITE => try_as!(process::ProcessWriteParams),
        m::PROCESS_SIGNAL => try_as!(process::ProcessSignalParams),
        m::PROCESS_RESIZE => try_as!(process::ProcessResizeParams),
        m::EXEC_COMMAND => try_as!(exec::ExecCommandParams),
        m::WRITE_STDIN => try_as!(exec::WriteStdinParams),
        m::FS_STAT => try_as!(fs::StatParams),
        m::FS_CANONICALIZE => try_as!(fs::CanonicalizeParams),
        m::FS_READ_FILE => try_as!(fs::ReadFileParams),
        m::FS_WRITE_FILE => try_as!(fs::WriteFileParams),
        m::FS_CREATE_DIRECTORY => try_as!(fs::CreateDirectoryParams),
        m::FS_REMOVE => try_as!(fs::RemoveParams),
        m::FS_RENAME => try_as!(fs::RenameParams),
        m::FS_WALK => try_as!(fs::WalkParams),
        m::FS_READ_LINK => try_as!(fs::ReadLinkParams),
        m::FS_CREATE_SYMLINK => try_as!(fs::CreateSymlinkParams),
        m::FS_OPEN => try_as!(fs::OpenParams),
        m::FS_READ_BLOCK => try_as!(fs::ReadBlockParams),
        m::FS_OPEN_WRITE => try_as!(fs::OpenWriteParams),
        m::FS_WRITE_BLOCK => try_as!(fs::WriteBlockParams),
        m::FS_COMMIT | m::FS_CLOSE => try_as!(fs::HandleParams),
        m::HTTP_REQUEST => try_as!(http::HttpRequestParams),
        m::HTTP_CANCEL => try_as!(http::HttpCancelParams),
        _ => {
            // An unknown method: try every type anyway.
            for name in m::ALL_REQUESTS {
                decode_typed(name, params.clone());
            }
        }
    }
}
