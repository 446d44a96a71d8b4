//! Length-prefixed frames: a 4-byte big-endian length `N` (1..=max), then `N`
//! bytes holding one MessagePack value.
//!
//! [`FrameDecoder`] works on a [`BytesMut`] and never allocates for a declared
//! length it has not validated: a prefix of 0 or above the maximum is an
//! error as soon as the 4 length bytes are in, before anything is reserved.

use bytes::{Buf, BufMut, BytesMut};

/// Bytes of the length prefix.
pub const LEN_PREFIX: usize = 4;

/// Why a byte stream stopped being a sequence of frames.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The length prefix is 0 or above the maximum. The connection cannot
    /// be resynchronised and must close.
    #[error("frame length {declared} is outside 1..={max}")]
    TooLarge { declared: u64, max: u64 },
    /// The stream ended inside a frame.
    #[error("stream ended inside a frame ({buffered} bytes buffered)")]
    Truncated { buffered: usize },
}

/// Splits a byte stream into frames. Pure: feed it bytes, take frames out.
#[derive(Debug, Clone)]
pub struct FrameDecoder {
    max: usize,
}

impl FrameDecoder {
    /// A decoder accepting frames of at most `max` bytes.
    pub fn new(max: usize) -> Self {
        FrameDecoder { max }
    }

    /// The largest frame accepted.
    pub fn max_frame_bytes(&self) -> usize {
        self.max
    }

    /// Take one whole frame's payload out of `buf`, `Ok(None)` when more
    /// bytes are needed. Reserves room for the rest of a frame only after its
    /// length was validated.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<BytesMut>, FrameError> {
        if buf.len() < LEN_PREFIX {
            return Ok(None);
        }
        let declared = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if declared == 0 || declared > self.max {
            return Err(FrameError::TooLarge {
                declared: declared as u64,
                max: self.max as u64,
            });
        }
        let total = LEN_PREFIX + declared;
        if buf.len() < total {
            // Validated above: at most `max` more bytes.
            buf.reserve(total - buf.len());
            return Ok(None);
        }
        buf.advance(LEN_PREFIX);
        Ok(Some(buf.split_to(declared)))
    }

    /// At end of stream: a frame or nothing; leftover bytes are `Truncated`.
    pub fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<BytesMut>, FrameError> {
        match self.decode(buf)? {
            Some(frame) => Ok(Some(frame)),
            None if buf.is_empty() => Ok(None),
            None => Err(FrameError::Truncated {
                buffered: buf.len(),
            }),
        }
    }
}

/// Append `payload` as one frame.
pub fn put_frame(dst: &mut BytesMut, payload: &[u8]) {
    dst.reserve(LEN_PREFIX + payload.len());
    dst.put_u32(payload.len() as u32);
    dst.put_slice(payload);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_and_oversized_rejected_before_allocation() {
        let mut d = FrameDecoder::new(16);
        let mut b = BytesMut::from(&[0u8, 0, 0, 0][..]);
        assert_eq!(
            d.decode(&mut b),
            Err(FrameError::TooLarge {
                declared: 0,
                max: 16
            })
        );
        let mut b = BytesMut::from(&[0xffu8, 0xff, 0xff, 0xff][..]);
        let cap = b.capacity();
        assert!(matches!(d.decode(&mut b), Err(FrameError::TooLarge { .. })));
        assert_eq!(b.capacity(), cap, "nothing reserved for a rejected length");
    }

    #[test]
    fn partial_then_whole() {
        let mut d = FrameDecoder::new(16);
        let mut b = BytesMut::new();
        put_frame(&mut b, b"\xc0");
        let mut part = b.split_to(3);
        assert_eq!(d.decode(&mut part).unwrap(), None);
        part.unsplit(b);
        assert_eq!(&d.decode(&mut part).unwrap().unwrap()[..], b"\xc0");
        assert!(part.is_empty());
    }

    #[test]
    fn eof_inside_frame_is_truncated() {
        let mut d = FrameDecoder::new(16);
        let mut b = BytesMut::from(&[0u8, 0, 0, 5, 1][..]);
        assert_eq!(
            d.decode_eof(&mut b),
            Err(FrameError::Truncated { buffered: 5 })
        );
    }
}
