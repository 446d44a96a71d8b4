//! The method table: the only place where a method name maps to its
//! handler, one line per method of the protocol's table
//! (`executor_protocol::methods::ALL_REQUESTS`). A newcomer finds the
//! handler of any method here in one hop.
//!
//! Dispatch decodes the params into the method's type, runs the handler,
//! and hands back its [`Reply`]; it builds no frames (the connection frames
//! the reply with [`crate::outbound::reply_frame`]). A name outside the
//! table answers `method_not_found`.
//!
//! Above the handlers, below [`crate::conn`].

use crate::outbound::{IntoReply, Reply};
use crate::session::{self, Session};
use crate::tools;
use crate::{exec, fs, http, process};
use executor_protocol::message::from_params;
use executor_protocol::methods::{self as m, Request};
use executor_protocol::{ErrorCode, WireError};
use rmpv::Value;
use std::future::Future;
use std::sync::Arc;

/// Decode `params` for `handler` (its params type is the method's, by the
/// protocol's table), run it, make its result a [`Reply`].
async fn run<'a, P, R, F>(
    s: &'a Arc<Session>,
    method: &str,
    params: Value,
    handler: impl FnOnce(&'a Arc<Session>, P) -> F,
) -> Result<Reply, WireError>
where
    P: Request + crate::audit::Audited,
    R: IntoReply,
    F: Future<Output = Result<R, WireError>>,
{
    debug_assert_eq!(P::METHOD, method, "a handler routed under another method");
    let p: P = from_params(params)?;
    crate::audit::note_params(&p);
    handler(s, p).await.map(IntoReply::into_reply)
}

/// `initialize`, run inline by the connection so later requests see it.
pub fn initialize(s: &Arc<Session>, params: Value) -> Result<Reply, WireError> {
    let p = from_params(params)?;
    s.initialize(p).map(Reply::value)
}

/// `initialize` on a connection that already did it.
pub fn initialize_again() -> WireError {
    WireError::new(
        ErrorCode::InvalidRequest,
        "initialize was already done on this connection",
    )
}

macro_rules! table {
    ($($method:path => $handler:path,)*) => {
        /// Every method [`dispatch`] routes (for the test that it is the
        /// protocol's whole table).
        pub const ROUTED: &[&str] = &[$($method),*];

        /// Route one request (after `initialize`) to its handler.
        pub async fn dispatch(
            s: &Arc<Session>,
            method: &str,
            params: Value,
        ) -> Result<Reply, WireError> {
            match method {
                $($method => run(s, method, params, $handler).await,)*
                m::INITIALIZE => Err(initialize_again()),
                other => Err(WireError::method_not_found(other)),
            }
        }
    };
}

table! {
    m::ENVIRONMENT_INFO => session::environment_info,
    m::TOOLS_LIST => tools::list,
    m::PROCESS_START => process::handle_start,
    m::PROCESS_READ => process::handle_read,
    m::PROCESS_WRITE => process::handle_write,
    m::PROCESS_SIGNAL => process::handle_signal,
    m::PROCESS_RESIZE => process::handle_resize,
    m::PROCESS_LIST => process::handle_list,
    m::EXEC_COMMAND => exec::exec_command,
    m::WRITE_STDIN => exec::write_stdin,
    m::FS_STAT => fs::stat,
    m::FS_CANONICALIZE => fs::canonicalize,
    m::FS_READ_FILE => fs::read_file,
    m::FS_WRITE_FILE => fs::write_file,
    m::FS_CREATE_DIRECTORY => fs::create_directory,
    m::FS_REMOVE => fs::remove,
    m::FS_RENAME => fs::rename,
    m::FS_WALK => fs::walk::walk,
    m::FS_READ_LINK => fs::read_link,
    m::FS_CREATE_SYMLINK => fs::create_symlink,
    m::FS_COPY => fs::copy::copy,
    m::FS_OPEN => fs::handles::open,
    m::FS_READ_BLOCK => fs::handles::read_block,
    m::FS_PASS_DESCRIPTOR => fs::handles::pass_descriptor,
    m::FS_READ_STREAM => fs::stream::read_stream,
    m::FS_READ_CREDIT => fs::stream::read_credit,
    m::FS_READ_CANCEL => fs::stream::read_cancel,
    m::FS_OPEN_WRITE => fs::handles::open_write,
    m::FS_WRITE_BLOCK => fs::handles::write_block,
    m::FS_COMMIT => fs::handles::commit,
    m::FS_CLOSE => fs::handles::close,
    m::HTTP_REQUEST => http::handle_request,
    m::HTTP_CANCEL => http::handle_cancel,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_routes_every_request_method_once() {
        let mut routed = ROUTED.to_vec();
        let mut all = m::ALL_REQUESTS.to_vec();
        routed.sort_unstable();
        all.sort_unstable();
        let len = routed.len();
        routed.dedup();
        assert_eq!(routed.len(), len, "a method is routed twice");
        assert_eq!(routed, all);
    }

    /// Every method reaches the handler whose params type is the method's
    /// (a mismatch fails the debug assertion in `run`), and bad params are
    /// `invalid_params`, answered before any handler runs.
    #[tokio::test]
    async fn every_method_decodes_its_own_params_type() {
        let s = crate::session::test_session();
        for method in ROUTED {
            let Err(e) = dispatch(&s, method, Value::from(7)).await else {
                panic!("{method} accepted 7 as its params");
            };
            assert_eq!(e.code, ErrorCode::InvalidParams, "{method}: {e}");
        }
        let Err(e) = dispatch(&s, "fs/nope", Value::Map(vec![])).await else {
            panic!("an unknown method was routed");
        };
        assert_eq!(e.code, ErrorCode::MethodNotFound);
        let Err(e) = dispatch(&s, m::INITIALIZE, Value::Map(vec![])).await else {
            panic!("a second initialize was routed");
        };
        assert_eq!(e.code, ErrorCode::InvalidRequest);
    }
}
