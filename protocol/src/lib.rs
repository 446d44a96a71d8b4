//! # executor-protocol
//!
//! The wire contract between the `executor` agent and its clients, version 1:
//! the 16-byte [`PREAMBLE`], length-prefixed MessagePack [frames](codec),
//! the [message envelope](message), the typed params and results of every
//! method (one module per method family under [`types`]), the wire
//! [error codes](error) and the [limits]. [`methods`] is the one method
//! table: each method's name, params type and result type, from which come
//! the name constants, `ALL_REQUESTS`, params validation and the
//! [`methods::Request`] impls a typed client call uses (one hop from a
//! method to its wire types).
//!
//! This crate does **not** perform I/O: it never touches a file descriptor,
//! a socket or an async runtime. It turns bytes into typed values and back,
//! so the agent, the client and the fuzzers share exactly one codec.
//!
//! ```
//! use executor_protocol::{codec::FrameDecoder, message::{encode_request, Incoming}, methods};
//! use executor_protocol::types::session::EnvironmentInfoParams;
//!
//! let mut wire = Vec::new();
//! encode_request(&mut wire, 7, methods::ENVIRONMENT_INFO, &EnvironmentInfoParams {}, 1 << 20).unwrap();
//!
//! let mut decoder = FrameDecoder::new(1 << 20);
//! let mut buf = bytes::BytesMut::from(&wire[..]);
//! let frame = decoder.decode(&mut buf).unwrap().expect("one whole frame");
//! match Incoming::decode(&frame).unwrap() {
//!     Incoming::Request { id, method, .. } => assert_eq!((id, method.as_str()), (7, "environment/info")),
//!     other => panic!("unexpected {other:?}"),
//! }
//! ```
//!
//! ## Choices where PROTOCOL.md is silent
//!
//! These are part of the contract and implemented by the agent:
//! - A request without `params` is treated as `params: {}`; `params` that is
//!   not a map is `invalid_params` with `data.field = "params"`.
//! - Trailing bytes after the one MessagePack value of a frame are a
//!   `parse_error` (a frame holds exactly one value).
//! - A frame holding more than [`limits::MAX_VALUES_PER_MESSAGE`] MessagePack
//!   values (or nested deeper than [`limits::MAX_NESTING`]) is refused with
//!   `limit_exceeded` (`limit: "max_values_per_message"`) before it is
//!   materialised: a 16 MiB frame of one-byte `nil`s would otherwise cost
//!   half a gigabyte of decoded values.
//! - `exec_command`/`write_stdin`: `tty` defaults to false, `yield_time_ms`
//!   to 10,000 and `max_output_tokens` to 10,000 when absent.
//! - `env` is required in `process/start` and `exec_command`: the complete
//!   environment is the caller's decision, never inherited from the agent.
//! - Responses to notifications are never sent; an unknown notification is
//!   ignored (logged at debug level).
//! - Sessions: a resume that arrives while another resume of the same
//!   session, with the right id and token, is still being set up
//!   (connected, `initialize` not yet answered, at most 10 s) is answered
//!   with the extra code `session_busy` (retry); a resume after a completed
//!   one takes over as §2 says. A resume with a wrong token is
//!   `session_expired` at once and never makes another one busy. A fresh
//!   `initialize` (without `session.resume`) sent to a session host is
//!   `session_expired`. An `initialize` on a connection that was taken
//!   over is `session_taken_over` like any request.
//! - A `detach_ttl_ms` the agent cannot keep (no session host could be
//!   started, for example no private directory for its socket: the message
//!   names each directory refused and why) is `invalid_params` naming
//!   `session.detach_ttl_ms`; nothing was started.
//! - `max_detached_sessions` counts the session hosts of the agent's user
//!   that are alive when an `initialize` asks for `detach_ttl_ms` (past
//!   it: `limit_exceeded`, and no host is started); hosts that ended do
//!   not count, and resumes and sessions without detach are not bounded
//!   by it.
//! - HTTP: see [`types::http`] for redirects, proxies, header encoding and
//!   limits of streamed bodies.
#![forbid(unsafe_code)]

mod wire_enum;

pub mod codec;
pub mod error;
pub mod launch;
pub mod limits;
pub mod message;
pub mod methods;
pub mod path;
pub mod types;

pub use error::{ErrorCode, WireError};
pub use path::WirePath;

/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: u32 = 1;

/// Written by the agent before its first frame: NUL, `EXECUTOR-WIRE1`, LF.
pub const PREAMBLE: &[u8; 16] = b"\0EXECUTOR-WIRE1\n";

/// How much noise a client skips before the preamble (a login shell's banner).
pub const MAX_PREAMBLE_NOISE: usize = 64 * 1024;

/// Everything fuzz targets need, without mocks. Not part of the stable API.
#[doc(hidden)]
pub mod internal {
    use crate::codec::FrameDecoder;
    use crate::message::Incoming;

    /// Feed arbitrary bytes through the frame decoder and the message decoder.
    pub fn fuzz_decode(data: &[u8], max_frame: usize) {
        let mut dec = FrameDecoder::new(max_frame);
        let mut buf = bytes::BytesMut::from(data);
        while let Ok(Some(frame)) = dec.decode(&mut buf) {
            if let Ok(Incoming::Request { method, params, .. }) = Incoming::decode(&frame) {
                let _ = crate::types::validate_params(&method, params);
            }
        }
    }
}
