//! The frame decoder: any byte stream, split anywhere, decodes the same as
//! whole, never yields a frame above the maximum, never panics.
#![no_main]

use bytes::BytesMut;
use executor_protocol::codec::FrameDecoder;
use libfuzzer_sys::fuzz_target;

const MAX: usize = 4096;

fn decode_all(chunks: &[&[u8]]) -> (Vec<Vec<u8>>, bool) {
    let mut dec = FrameDecoder::new(MAX);
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        loop {
            match dec.decode(&mut buf) {
                Ok(Some(f)) => {
                    assert!(
                        !f.is_empty() && f.len() <= MAX,
                        "frame of {} bytes",
                        f.len()
                    );
                    frames.push(f.to_vec());
                }
                Ok(None) => break,
                Err(_) => return (frames, true),
            }
        }
    }
    (frames, false)
}

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let split = data[0] as usize % data.len();
    let rest = &data[1..];
    let split = split.min(rest.len());
    let whole = decode_all(&[rest]);
    let parts = decode_all(&[&rest[..split], &rest[split..]]);
    assert_eq!(whole, parts, "splitting at {split} changed the outcome");
});
