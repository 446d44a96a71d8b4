//! Message decoding: any frame payload either decodes or is a typed error;
//! a request's params are then decoded as every request type would.
#![no_main]

use executor_protocol::message::Incoming;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match Incoming::decode(data) {
        Ok(Incoming::Request { method, params, .. })
        | Ok(Incoming::Notification { method, params }) => {
            executor_fuzz::decode_typed(&method, params);
        }
        Ok(Incoming::Response { .. }) => {}
        Err(e) => {
            // A typed error that names what went wrong.
            assert!(!e.error.message.is_empty());
        }
    }
});
