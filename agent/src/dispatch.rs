//! The only place where a method name maps to a handler. Every request
//! method of the protocol's table (`executor_protocol::methods::ALL_REQUESTS`)
//! has its arm here, and `initialize` reports that table; a name outside it
//! answers `method_not_found`.

use crate::outbound::OutFrame;
use crate::session::{self, Session};
use crate::tools;
use crate::{exec, fs, http, process};
use executor_protocol::message::{
    encode_error, encode_read_block_head, encode_response, from_params,
};
use executor_protocol::{methods as m, ErrorCode, WireError};
use rmpv::Value;
use serde::Serialize;
use std::sync::Arc;

/// Encode a handler's outcome as a response frame.
pub fn reply<R: Serialize>(id: u64, outcome: Result<R, WireError>, max_frame: usize) -> OutFrame {
    let mut bytes = Vec::new();
    match outcome {
        Ok(r) => {
            if let Err(e) = encode_response(&mut bytes, Some(id), &r, max_frame) {
                let err = WireError::new(
                    ErrorCode::Internal,
                    format!("cannot encode the result: {e}"),
                );
                return error_frame(id, &err, max_frame);
            }
        }
        Err(err) => return error_frame(id, &err, max_frame),
    }
    OutFrame::new(bytes)
}

/// Encode an error response frame.
pub fn error_frame(id: u64, err: &WireError, max_frame: usize) -> OutFrame {
    let mut bytes = Vec::new();
    if encode_error(&mut bytes, Some(id), err, max_frame).is_err() {
        // Only an enormous message could fail; send the code alone.
        let short = WireError::new(err.code, "error message too large to send");
        let _ = encode_error(&mut bytes, Some(id), &short, max_frame);
    }
    OutFrame {
        error: Some(err.code),
        ..OutFrame::new(bytes)
    }
}

/// `initialize`, run inline by the connection so later requests see it.
pub fn initialize(s: &Arc<Session>, id: u64, params: Value) -> OutFrame {
    let outcome = from_params(params).and_then(|p| s.initialize(p));
    reply(id, outcome, s.max_frame())
}

/// Route one request (after `initialize`) to its handler.
pub async fn dispatch(s: &Arc<Session>, id: u64, method: &str, params: Value) -> OutFrame {
    let max = s.max_frame();
    macro_rules! call {
        ($handler:expr) => {
            match from_params(params) {
                Ok(p) => reply(id, $handler(s, p).await, max),
                Err(e) => error_frame(id, &e, max),
            }
        };
    }
    match method {
        m::ENVIRONMENT_INFO => call!(session::environment_info),
        m::TOOLS_LIST => call!(tools::list),
        m::PROCESS_START => call!(process::handle_start),
        m::PROCESS_READ => call!(process::handle_read),
        m::PROCESS_WRITE => call!(process::handle_write),
        m::PROCESS_SIGNAL => call!(process::handle_signal),
        m::PROCESS_RESIZE => call!(process::handle_resize),
        m::PROCESS_LIST => call!(process::handle_list),
        m::EXEC_COMMAND => call!(exec::exec_command),
        m::WRITE_STDIN => call!(exec::write_stdin),
        m::FS_STAT => call!(fs::stat),
        m::FS_CANONICALIZE => call!(fs::canonicalize),
        m::FS_READ_FILE => call!(fs::read_file),
        m::FS_WRITE_FILE => call!(fs::write_file),
        m::FS_CREATE_DIRECTORY => call!(fs::create_directory),
        m::FS_REMOVE => call!(fs::remove),
        m::FS_RENAME => call!(fs::rename),
        m::FS_WALK => call!(fs::walk::walk),
        m::FS_OPEN => call!(fs::handles::open),
        m::FS_READ_BLOCK => match from_params(params) {
            // The block is sent by reference after its frame head.
            Ok(p) => match fs::handles::read_block(s, p).await {
                Ok((eof, data)) => {
                    let mut head = Vec::with_capacity(48);
                    match encode_read_block_head(&mut head, id, eof, data.len(), max) {
                        Ok(()) => OutFrame {
                            tail: Some(data),
                            ..OutFrame::new(head)
                        },
                        Err(e) => error_frame(
                            id,
                            &WireError::new(ErrorCode::Internal, e.to_string()),
                            max,
                        ),
                    }
                }
                Err(e) => error_frame(id, &e, max),
            },
            Err(e) => error_frame(id, &e, max),
        },
        m::FS_OPEN_WRITE => call!(fs::handles::open_write),
        m::FS_WRITE_BLOCK => call!(fs::handles::write_block),
        m::FS_COMMIT => call!(fs::handles::commit),
        m::FS_CLOSE => call!(fs::handles::close),
        m::HTTP_REQUEST => match from_params(params) {
            Ok(p) => match http::handle_request(s, p).await {
                Ok(http::Outcome::Buffered(r)) => reply(id, Ok(r), max),
                Ok(http::Outcome::Stream { head, started }) => {
                    // The pump starts once this head is queued.
                    let mut frame = reply(id, Ok(head), max);
                    frame.on_queued = Some(started);
                    frame
                }
                Err(e) => error_frame(id, &e, max),
            },
            Err(e) => error_frame(id, &e, max),
        },
        m::HTTP_CANCEL => call!(http::handle_cancel),
        m::INITIALIZE => error_frame(
            id,
            &WireError::new(
                ErrorCode::InvalidRequest,
                "initialize was already done on this connection",
            ),
            max,
        ),
        other => error_frame(id, &WireError::method_not_found(other), max),
    }
}
