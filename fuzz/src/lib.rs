//! Shared by the fuzz targets: typed decoding of every method's params
//! (through the protocol's one method table, so a method added there is
//! fuzzed here with its own type), and the confined in-process agent the
//! dispatch target drives.

use executor_protocol::methods as m;
use rmpv::Value;

pub mod agent;

/// Decode `params` as the typed params of `method` (any request of the
/// protocol's table, `initialize`, or a notification a client sends,
/// through [`m::validate_params`]); the outcome is ignored, only a panic
/// matters. An unknown method's params are tried as every method's.
pub fn decode_typed(method: &str, params: Value) {
    let known = m::facts(method).is_some() || method == m::CANCEL;
    if known {
        let _ = m::validate_params(method, params);
        return;
    }
    for name in m::ALL_REQUESTS
        .iter()
        .chain([m::INITIALIZE, m::CANCEL].iter())
    {
        let _ = m::validate_params(name, params.clone());
    }
}
