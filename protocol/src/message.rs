//! The message envelope: request, response, notification.
//!
//! Incoming frames are checked by a non-allocating scan (value count, nesting,
//! exactly one value) before they are materialised as [`rmpv::Value`]; the
//! params of a request are then turned into their typed form with
//! [`from_params`], which names the offending field in its error.

use crate::error::{ErrorCode, WireError};
use crate::limits::{MAX_NESTING, MAX_VALUES_PER_MESSAGE};
use rmpv::Value;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// One decoded incoming message.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// `{"id", "method", "params"}`
    Request {
        id: u64,
        method: String,
        params: Value,
    },
    /// `{"method", "params"}`
    Notification { method: String, params: Value },
    /// `{"id", "result"}` or `{"id", "error"}`; `id` is `None` for the answer
    /// to a request whose id could not be read.
    Response {
        id: Option<u64>,
        result: Result<Value, WireError>,
    },
}

/// A frame that is not a valid message. `id` is set when it could be read,
/// so the error can be answered to the right request.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{error}")]
pub struct DecodeError {
    pub id: Option<u64>,
    pub error: WireError,
}

impl DecodeError {
    fn new(id: Option<u64>, code: ErrorCode, message: impl Into<String>) -> Self {
        DecodeError {
            id,
            error: WireError::new(code, message),
        }
    }
}

impl Incoming {
    /// Decode one frame's payload, with the default value-count bound.
    pub fn decode(frame: &[u8]) -> Result<Incoming, DecodeError> {
        Self::decode_bounded(frame, MAX_VALUES_PER_MESSAGE)
    }

    /// Decode one frame's payload holding at most `max_values` values.
    pub fn decode_bounded(frame: &[u8], max_values: u64) -> Result<Incoming, DecodeError> {
        match scan(frame, max_values, MAX_NESTING) {
            Ok(used) if used == frame.len() => {}
            Ok(used) => {
                return Err(DecodeError::new(
                    None,
                    ErrorCode::ParseError,
                    format!(
                        "frame holds {} bytes after its MessagePack value (frame is {} bytes)",
                        frame.len() - used,
                        frame.len()
                    ),
                ))
            }
            Err(ScanError::Malformed(at)) => {
                return Err(DecodeError::new(
                    None,
                    ErrorCode::ParseError,
                    format!(
                        "frame is not valid MessagePack (at byte {at} of {})",
                        frame.len()
                    ),
                ))
            }
            Err(ScanError::TooManyValues) => {
                let mut e = DecodeError::new(None, ErrorCode::LimitExceeded, "");
                e.error = WireError::limit("max_values_per_message", max_values, None);
                return Err(e);
            }
            Err(ScanError::TooDeep) => {
                let mut e = DecodeError::new(None, ErrorCode::LimitExceeded, "");
                e.error = WireError::limit("max_nesting", MAX_NESTING as u64, None);
                return Err(e);
            }
        }
        let value = rmpv::decode::read_value(&mut &frame[..]).map_err(|e| {
            DecodeError::new(
                None,
                ErrorCode::ParseError,
                format!("frame is not valid MessagePack: {e}"),
            )
        })?;
        Self::from_value(value)
    }

    /// Interpret a decoded value as a message.
    pub fn from_value(value: Value) -> Result<Incoming, DecodeError> {
        let entries = match value {
            Value::Map(m) => m,
            other => {
                return Err(DecodeError::new(
                    None,
                    ErrorCode::InvalidRequest,
                    format!("a message must be a map, got {}", kind_of(&other)),
                ))
            }
        };
        let mut id: Option<Value> = None;
        let mut method: Option<Value> = None;
        let mut params: Option<Value> = None;
        let mut result: Option<Value> = None;
        let mut error: Option<Value> = None;
        for (k, v) in entries {
            match k.as_str() {
                Some("id") => id = Some(v),
                Some("method") => method = Some(v),
                Some("params") => params = Some(v),
                Some("result") => result = Some(v),
                Some("error") => error = Some(v),
                _ => {}
            }
        }
        let id = message_id(id)?;
        if let Some(method) = method {
            return Self::request_or_notification(id, method, params);
        }
        if let Some(err) = error {
            let err: WireError = rmpv::ext::from_value(err).map_err(|e| {
                DecodeError::new(
                    id,
                    ErrorCode::InvalidRequest,
                    format!("malformed \"error\": {e}"),
                )
            })?;
            return Ok(Incoming::Response {
                id,
                result: Err(err),
            });
        }
        if let Some(result) = result {
            if id.is_none() {
                return Err(DecodeError::new(
                    None,
                    ErrorCode::InvalidRequest,
                    "a result without \"id\"",
                ));
            }
            return Ok(Incoming::Response {
                id,
                result: Ok(result),
            });
        }
        Err(DecodeError::new(
            id,
            ErrorCode::InvalidRequest,
            "a message needs \"method\" (request, notification) or \"result\"/\"error\" (response)",
        ))
    }
    /// A message with a `method`: a request when it has an id, else a
    /// notification; `params` absent or nil is `{}`, anything but a map is
    /// `invalid_params`.
    fn request_or_notification(
        id: Option<u64>,
        method: Value,
        params: Option<Value>,
    ) -> Result<Incoming, DecodeError> {
        let method = match method {
            Value::String(s) if s.as_str().is_some() => s.into_str().unwrap_or_default(),
            other => {
                return Err(DecodeError::new(
                    id,
                    ErrorCode::InvalidRequest,
                    format!("\"method\" must be a string, got {}", kind_of(&other)),
                ))
            }
        };
        let params = match params {
            None | Some(Value::Nil) => Value::Map(Vec::new()),
            Some(p @ Value::Map(_)) => p,
            Some(other) => {
                return Err(DecodeError {
                    id,
                    error: WireError::invalid_params(
                        "params",
                        format!("\"params\" must be a map, got {}", kind_of(&other)),
                    ),
                })
            }
        };
        Ok(match id {
            Some(id) => Incoming::Request { id, method, params },
            None => Incoming::Notification { method, params },
        })
    }
}

/// A message's `id`: absent or nil, or an unsigned integer.
fn message_id(id: Option<Value>) -> Result<Option<u64>, DecodeError> {
    match id {
        None | Some(Value::Nil) => Ok(None),
        Some(Value::Integer(i)) if i.as_u64().is_some() => Ok(i.as_u64()),
        Some(other) => Err(DecodeError::new(
            None,
            ErrorCode::InvalidRequest,
            format!(
                "\"id\" must be an unsigned integer, got {}",
                kind_of(&other)
            ),
        )),
    }
}

/// A short name for the kind of a value, for messages.
pub fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Nil => "nil",
        Value::Boolean(_) => "a boolean",
        Value::Integer(_) => "an integer",
        Value::F32(_) | Value::F64(_) => "a float",
        Value::String(_) => "a string",
        Value::Binary(_) => "binary",
        Value::Array(_) => "an array",
        Value::Map(_) => "a map",
        Value::Ext(..) => "an extension value",
    }
}

/// A path as `serde_path_to_error` writes it (`headers[2].name`) in the
/// wire's dotted form (`headers.2.name`).
pub(crate) fn dotted(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut rest = path;
    while let Some(i) = rest.find('[') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        match after.find(']') {
            Some(j) if j > 0 && after[..j].bytes().all(|b| b.is_ascii_digit()) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(&after[..j]);
                rest = &after[j + 1..];
            }
            _ => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Turn a request's params into their typed form. The error is
/// `invalid_params` with `data.field` the dotted path of the offending key.
pub fn from_params<T: DeserializeOwned>(params: Value) -> Result<T, WireError> {
    match serde_path_to_error::deserialize::<_, T>(params) {
        Ok(v) => Ok(v),
        Err(e) => {
            let mut field = dotted(&e.path().to_string());
            let raw = e.inner().to_string();
            let msg = raw
                .strip_prefix("error while decoding value: ")
                .unwrap_or(&raw)
                .to_string();
            if let Some(missing) = msg
                .split_once("missing field `")
                .and_then(|(_, s)| s.split('`').next())
            {
                field = if field == "." || field.is_empty() {
                    missing.to_string()
                } else {
                    format!("{field}.{missing}")
                };
            }
            if field == "." {
                field = String::new();
            }
            let message = if field.is_empty() {
                format!("invalid params: {msg}")
            } else {
                format!("invalid params at {field}: {msg}")
            };
            Err(WireError::invalid_params(&field, message))
        }
    }
}

/// Encoding failed: only when the encoded message exceeds the frame limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    #[error("encoded message of {size} bytes exceeds the frame limit of {max} bytes")]
    TooLarge { size: usize, max: usize },
    #[error("value cannot be encoded: {0}")]
    Serialize(String),
}

#[derive(Serialize)]
struct RequestOut<'a, P> {
    id: u64,
    method: &'a str,
    params: &'a P,
}
#[derive(Serialize)]
struct NotificationOut<'a, P> {
    method: &'a str,
    params: &'a P,
}
#[derive(Serialize)]
struct ResponseOut<'a, R> {
    id: Option<u64>,
    result: &'a R,
}
#[derive(Serialize)]
struct ErrorOut<'a> {
    id: Option<u64>,
    error: &'a WireError,
}

fn encode_framed<T: Serialize>(dst: &mut Vec<u8>, msg: &T, max: usize) -> Result<(), EncodeError> {
    let start = dst.len();
    dst.extend_from_slice(&[0; 4]);
    if let Err(e) = rmp_serde::encode::write_named(dst, msg) {
        dst.truncate(start);
        return Err(EncodeError::Serialize(e.to_string()));
    }
    let size = dst.len() - start - 4;
    if size > max || size > u32::MAX as usize {
        dst.truncate(start);
        return Err(EncodeError::TooLarge { size, max });
    }
    dst[start..start + 4].copy_from_slice(&(size as u32).to_be_bytes());
    Ok(())
}

/// Append a request frame to `dst`.
pub fn encode_request<P: Serialize>(
    dst: &mut Vec<u8>,
    id: u64,
    method: &str,
    params: &P,
    max: usize,
) -> Result<(), EncodeError> {
    encode_framed(dst, &RequestOut { id, method, params }, max)
}

/// Append a notification frame to `dst`.
pub fn encode_notification<P: Serialize>(
    dst: &mut Vec<u8>,
    method: &str,
    params: &P,
    max: usize,
) -> Result<(), EncodeError> {
    encode_framed(dst, &NotificationOut { method, params }, max)
}

/// Append a success response frame to `dst`.
pub fn encode_response<R: Serialize>(
    dst: &mut Vec<u8>,
    id: Option<u64>,
    result: &R,
    max: usize,
) -> Result<(), EncodeError> {
    encode_framed(dst, &ResponseOut { id, result }, max)
}

/// Append an error response frame to `dst`.
pub fn encode_error(
    dst: &mut Vec<u8>,
    id: Option<u64>,
    error: &WireError,
    max: usize,
) -> Result<(), EncodeError> {
    encode_framed(dst, &ErrorOut { id, error }, max)
}

/// Writes the head of a frame whose last value is `bin` data sent after it
/// by reference. Writing MessagePack into a `Vec` cannot fail, so the
/// methods return nothing; only the size check at the end can.
struct Head<'a> {
    dst: &'a mut Vec<u8>,
    start: usize,
}

impl<'a> Head<'a> {
    fn new(dst: &'a mut Vec<u8>) -> Self {
        let start = dst.len();
        dst.extend_from_slice(&[0; 4]);
        Head { dst, start }
    }
    fn map(&mut self, len: u32) -> &mut Self {
        let _ = rmp::encode::write_map_len(self.dst, len); // infallible on Vec
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        let _ = rmp::encode::write_str(self.dst, s); // infallible on Vec
        self
    }
    fn uint(&mut self, n: u64) -> &mut Self {
        let _ = rmp::encode::write_uint(self.dst, n); // infallible on Vec
        self
    }
    fn bool(&mut self, b: bool) -> &mut Self {
        let _ = rmp::encode::write_bool(self.dst, b); // infallible on Vec
        self
    }
    /// The `bin` header of `data_len` bytes, then the frame length
    /// (covering the data that follows).
    fn finish(&mut self, data_len: usize, max: usize) -> Result<(), EncodeError> {
        let too_large = |size| EncodeError::TooLarge { size, max };
        let len = u32::try_from(data_len).map_err(|_| too_large(data_len))?;
        let _ = rmp::encode::write_bin_len(self.dst, len); // infallible on Vec
        let size = self.dst.len() - self.start - 4 + data_len;
        if size > max || size > u32::MAX as usize {
            self.dst.truncate(self.start);
            return Err(too_large(size));
        }
        self.dst[self.start..self.start + 4].copy_from_slice(&(size as u32).to_be_bytes());
        Ok(())
    }
}

/// Append the frame of a `process/output` notification *without* its data
/// bytes: the caller sends `data` right after these bytes (a vectored
/// write), so bulk output is never copied into a frame buffer. The result is
/// byte-for-byte what [`encode_notification`] produces for
/// [`ProcessOutput`](crate::types::process::ProcessOutput) (`data` is last).
pub fn encode_output_head(
    dst: &mut Vec<u8>,
    process_id: &str,
    seq: u64,
    stream: crate::types::process::OutputStream,
    data_len: usize,
    max: usize,
) -> Result<(), EncodeError> {
    Head::new(dst)
        .map(2)
        .str("method")
        .str(crate::methods::PROCESS_OUTPUT)
        .str("params")
        .map(4)
        .str("process_id")
        .str(process_id)
        .str("seq")
        .uint(seq)
        .str("stream")
        .str(stream.as_str())
        .str("data")
        .finish(data_len, max)
}

/// Append the frame of a non-final `http/request/bodyDelta` notification
/// *without* its data bytes (sent right after, by a vectored write).
/// Byte-for-byte what [`encode_notification`] produces for
/// [`BodyDelta`](crate::types::http::BodyDelta) with `done: false` and no
/// error.
pub fn encode_body_delta_head(
    dst: &mut Vec<u8>,
    stream_id: u64,
    seq: u64,
    data_len: usize,
    max: usize,
) -> Result<(), EncodeError> {
    Head::new(dst)
        .map(2)
        .str("method")
        .str(crate::methods::HTTP_BODY_DELTA)
        .str("params")
        .map(4)
        .str("stream_id")
        .uint(stream_id)
        .str("seq")
        .uint(seq)
        .str("done")
        .bool(false)
        .str("data")
        .finish(data_len, max)
}

/// Append the frame of an `fs/readStream/data` notification *without* its
/// data bytes (sent right after, by a vectored write). Byte-for-byte what
/// [`encode_notification`] produces for
/// [`ReadStreamData`](crate::types::fs::ReadStreamData) (`data` is last).
pub fn encode_read_stream_data_head(
    dst: &mut Vec<u8>,
    stream_id: u64,
    offset: u64,
    data_len: usize,
    max: usize,
) -> Result<(), EncodeError> {
    Head::new(dst)
        .map(2)
        .str("method")
        .str(crate::methods::FS_READ_STREAM_DATA)
        .str("params")
        .map(3)
        .str("stream_id")
        .uint(stream_id)
        .str("offset")
        .uint(offset)
        .str("data")
        .finish(data_len, max)
}

/// What [`read_stream_data_head`] found at the start of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataHead {
    /// The head of an `fs/readStream/data` notification in exactly the
    /// layout [`encode_read_stream_data_head`] writes (any width of the
    /// integers), its `data` bin the last `data_len` bytes of the frame,
    /// starting at `len`.
    Found {
        stream_id: u64,
        offset: u64,
        len: usize,
        data_len: usize,
    },
    /// The bytes so far fit that head: more are needed to tell.
    Short,
    /// Anything else (another message, the same in another layout, a bin
    /// that does not end the frame): decode the whole frame instead.
    Other,
}

/// Recognise, without decoding the frame, the head of an
/// `fs/readStream/data` notification at the start of `payload` (a frame's
/// bytes after its length prefix, possibly not all of them yet) of a frame
/// of `frame_len` bytes: what lets a reader move the data elsewhere
/// (`splice(2)`) without reading it into memory.
pub fn read_stream_data_head(payload: &[u8], frame_len: usize) -> DataHead {
    let mut c = HeadCursor { b: payload, at: 0 };
    match c.data_head() {
        Ok((stream_id, offset, data_len)) if c.at.checked_add(data_len) == Some(frame_len) => {
            DataHead::Found {
                stream_id,
                offset,
                len: c.at,
                data_len,
            }
        }
        Ok(_) => DataHead::Other,
        Err(e) => e,
    }
}

/// Recognise, without decoding it, a whole frame (`payload`, after its
/// length prefix) that is a successful `fs/readBlock` response in exactly
/// the layout [`encode_read_block_head`] writes (any width of the id and
/// of the bin length, the data ending the frame): `(id, eof, start)`, the
/// data being `payload[start..]`. `None` for anything else (decode the
/// frame instead).
pub fn read_block_response(payload: &[u8]) -> Option<(u64, bool, usize)> {
    let mut c = HeadCursor { b: payload, at: 0 };
    let (id, eof, data_len) = c.block_head().ok()?;
    (c.at.checked_add(data_len) == Some(payload.len())).then_some((id, eof, c.at))
}

/// Reads [`read_stream_data_head`]'s layout; `Err` is `Short` or `Other`.
struct HeadCursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl HeadCursor<'_> {
    fn data_head(&mut self) -> Result<(u64, u64, usize), DataHead> {
        self.lit(&[0x82])?;
        self.fixstr("method")?;
        self.fixstr(crate::methods::FS_READ_STREAM_DATA)?;
        self.fixstr("params")?;
        self.lit(&[0x83])?;
        self.fixstr("stream_id")?;
        let stream_id = self.uint()?;
        self.fixstr("offset")?;
        let offset = self.uint()?;
        self.fixstr("data")?;
        let data_len = self.bin_len()?;
        Ok((stream_id, offset, data_len as usize))
    }

    fn block_head(&mut self) -> Result<(u64, bool, usize), DataHead> {
        self.lit(&[0x82])?;
        self.fixstr("id")?;
        let id = self.uint()?;
        self.fixstr("result")?;
        self.lit(&[0x82])?;
        self.fixstr("eof")?;
        let eof = match self.byte()? {
            0xc2 => false,
            0xc3 => true,
            _ => return Err(DataHead::Other),
        };
        self.fixstr("data")?;
        let data_len = self.bin_len()?;
        Ok((id, eof, data_len as usize))
    }

    fn bin_len(&mut self) -> Result<u64, DataHead> {
        match self.byte()? {
            0xc4 => self.be(1),
            0xc5 => self.be(2),
            0xc6 => self.be(4),
            _ => Err(DataHead::Other),
        }
    }

    /// `want` next: `Short` while what is there is a prefix of it.
    fn lit(&mut self, want: &[u8]) -> Result<(), DataHead> {
        let have = &self.b[self.at.min(self.b.len())..];
        let n = want.len().min(have.len());
        if have[..n] != want[..n] {
            return Err(DataHead::Other);
        }
        if n < want.len() {
            return Err(DataHead::Short);
        }
        self.at += n;
        Ok(())
    }

    fn fixstr(&mut self, s: &str) -> Result<(), DataHead> {
        debug_assert!(s.len() < 32);
        self.lit(&[0xa0 | s.len() as u8])?;
        self.lit(s.as_bytes())
    }

    fn byte(&mut self) -> Result<u8, DataHead> {
        let b = *self.b.get(self.at).ok_or(DataHead::Short)?;
        self.at += 1;
        Ok(b)
    }

    fn be(&mut self, n: usize) -> Result<u64, DataHead> {
        let mut v = 0u64;
        for _ in 0..n {
            v = (v << 8) | u64::from(self.byte()?);
        }
        Ok(v)
    }

    fn uint(&mut self) -> Result<u64, DataHead> {
        match self.byte()? {
            b @ 0..=0x7f => Ok(u64::from(b)),
            0xcc => self.be(1),
            0xcd => self.be(2),
            0xce => self.be(4),
            0xcf => self.be(8),
            _ => Err(DataHead::Other),
        }
    }
}

/// Append the frame of a successful `fs/readBlock` response *without* its
/// data bytes (sent right after, by a vectored write). Byte-for-byte what
/// [`encode_response`] produces for `{"eof": eof, "data": bin}`.
pub fn encode_read_block_head(
    dst: &mut Vec<u8>,
    id: u64,
    eof: bool,
    data_len: usize,
    max: usize,
) -> Result<(), EncodeError> {
    Head::new(dst)
        .map(2)
        .str("id")
        .uint(id)
        .str("result")
        .map(2)
        .str("eof")
        .bool(eof)
        .str("data")
        .finish(data_len, max)
}

#[derive(Debug, PartialEq, Eq)]
enum ScanError {
    Malformed(usize),
    TooManyValues,
    TooDeep,
}

/// Walk one MessagePack value without allocating; return its encoded length.
fn scan(buf: &[u8], max_values: u64, max_depth: usize) -> Result<usize, ScanError> {
    // `pending[i]` = values still expected by the i-th open container.
    let mut pending: Vec<u64> = Vec::with_capacity(8);
    let mut pos = 0usize;
    let mut values = 0u64;
    let take = |pos: &mut usize, n: usize| -> Result<u64, ScanError> {
        let end = pos
            .checked_add(n)
            .filter(|&e| e <= buf.len())
            .ok_or(ScanError::Malformed(*pos))?;
        let mut v = 0u64;
        for b in &buf[*pos..end] {
            v = (v << 8) | u64::from(*b);
        }
        *pos = end;
        Ok(v)
    };
    loop {
        let at = pos;
        let marker = *buf.get(pos).ok_or(ScanError::Malformed(at))?;
        pos += 1;
        values += 1;
        if values > max_values {
            return Err(ScanError::TooManyValues);
        }
        // (bytes to skip, children to expect)
        let (skip, children): (u64, u64) = match marker {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (0, 0),
            0x80..=0x8f => (0, 2 * u64::from(marker & 0x0f)),
            0x90..=0x9f => (0, u64::from(marker & 0x0f)),
            0xa0..=0xbf => (u64::from(marker & 0x1f), 0),
            0xc1 => return Err(ScanError::Malformed(at)),
            0xc4 | 0xd9 => (take(&mut pos, 1)?, 0),
            0xc5 | 0xda => (take(&mut pos, 2)?, 0),
            0xc6 | 0xdb => (take(&mut pos, 4)?, 0),
            0xc7 => (take(&mut pos, 1)? + 1, 0),
            0xc8 => (take(&mut pos, 2)? + 1, 0),
            0xc9 => (take(&mut pos, 4)? + 1, 0),
            0xca => (4, 0),
            0xcb => (8, 0),
            0xcc | 0xd0 => (1, 0),
            0xcd | 0xd1 => (2, 0),
            0xce | 0xd2 => (4, 0),
            0xcf | 0xd3 => (8, 0),
            0xd4 => (2, 0),
            0xd5 => (3, 0),
            0xd6 => (5, 0),
            0xd7 => (9, 0),
            0xd8 => (17, 0),
            0xdc => (0, take(&mut pos, 2)?),
            0xdd => (0, take(&mut pos, 4)?),
            0xde => (0, 2 * take(&mut pos, 2)?),
            0xdf => (0, 2 * take(&mut pos, 4)?),
        };
        let skip = usize::try_from(skip).map_err(|_| ScanError::Malformed(at))?;
        pos = pos
            .checked_add(skip)
            .filter(|&e| e <= buf.len())
            .ok_or(ScanError::Malformed(at))?;
        if children > 0 {
            // Each child needs at least one byte: cheap early rejection.
            if children > (buf.len() - pos) as u64 {
                return Err(ScanError::Malformed(at));
            }
            if pending.len() >= max_depth {
                return Err(ScanError::TooDeep);
            }
            pending.push(children);
            continue;
        }
        // A scalar (or empty container) completed: close finished containers.
        loop {
            match pending.last_mut() {
                None => return Ok(pos),
                Some(n) => {
                    *n -= 1;
                    if *n == 0 {
                        pending.pop();
                    } else {
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(v: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, v).unwrap();
        out
    }

    #[test]
    fn scan_agrees_with_rmpv_on_lengths() {
        let v = Value::Map(vec![
            (
                Value::from("a"),
                Value::Array(vec![Value::from(1), Value::from(-300), Value::Nil]),
            ),
            (Value::from("b"), Value::Binary(vec![1; 300])),
            (Value::from("c"), Value::Ext(3, vec![1, 2, 3, 4])),
            (Value::from("d"), Value::F64(1.5)),
            (Value::from("e"), Value::Map(vec![])),
        ]);
        let bytes = enc(&v);
        assert_eq!(scan(&bytes, 100, 8), Ok(bytes.len()));
        assert_eq!(scan(&bytes, 5, 8), Err(ScanError::TooManyValues));
        assert!(matches!(
            scan(&bytes[..bytes.len() - 1], 100, 8),
            Err(ScanError::Malformed(_))
        ));
    }

    #[test]
    fn output_head_plus_data_equals_the_serde_encoding() {
        use crate::types::process::{OutputStream, ProcessOutput};
        for len in [0usize, 1, 255, 256, 65_535, 65_536, 70_000] {
            for stream in OutputStream::ALL {
                let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
                let note = ProcessOutput {
                    process_id: "proc-17".into(),
                    seq: len as u64 * 3,
                    stream: *stream,
                    data: serde_bytes::ByteBuf::from(data.clone()),
                };
                let mut want = Vec::new();
                encode_notification(&mut want, crate::methods::PROCESS_OUTPUT, &note, 1 << 24)
                    .unwrap();
                let mut got = Vec::new();
                encode_output_head(&mut got, "proc-17", len as u64 * 3, *stream, len, 1 << 24)
                    .unwrap();
                got.extend_from_slice(&data);
                assert_eq!(got, want, "len {len}");
            }
        }
    }

    #[test]
    fn body_delta_head_plus_data_equals_the_serde_encoding() {
        use crate::types::http::BodyDelta;
        for len in [0usize, 1, 300, 65_536, 70_000] {
            let data: Vec<u8> = (0..len).map(|i| (i * 3) as u8).collect();
            let delta = BodyDelta {
                stream_id: 77,
                seq: len as u64 + 5,
                done: false,
                error: None,
                data: serde_bytes::ByteBuf::from(data.clone()),
            };
            let mut want = Vec::new();
            encode_notification(&mut want, crate::methods::HTTP_BODY_DELTA, &delta, 1 << 24)
                .unwrap();
            let mut got = Vec::new();
            encode_body_delta_head(&mut got, 77, len as u64 + 5, len, 1 << 24).unwrap();
            got.extend_from_slice(&data);
            assert_eq!(got, want, "len {len}");
        }
    }

    #[test]
    fn read_stream_data_head_plus_data_equals_the_serde_encoding() {
        use crate::types::fs::ReadStreamData;
        for len in [0usize, 1, 300, 70_000] {
            let data: Vec<u8> = (0..len).map(|i| (i * 13) as u8).collect();
            let value = ReadStreamData {
                stream_id: 9,
                offset: u64::MAX - len as u64,
                data: serde_bytes::ByteBuf::from(data.clone()),
            };
            let mut want = Vec::new();
            encode_notification(
                &mut want,
                crate::methods::FS_READ_STREAM_DATA,
                &value,
                1 << 24,
            )
            .unwrap();
            let mut got = Vec::new();
            encode_read_stream_data_head(&mut got, 9, u64::MAX - len as u64, len, 1 << 24).unwrap();
            got.extend_from_slice(&data);
            assert_eq!(got, want, "len {len}");
        }
    }

    #[test]
    fn a_read_stream_data_head_is_recognised_exactly_and_nothing_else_is() {
        use crate::types::fs::ReadStreamData;
        for (stream_id, offset, len) in [
            (1u64, 0u64, 1usize),
            (127, 128, 255),
            (300, 70_000, 65_536),
            (u64::MAX, u64::MAX - 5, 70_000),
        ] {
            let mut frame = Vec::new();
            encode_read_stream_data_head(&mut frame, stream_id, offset, len, 1 << 24).unwrap();
            let head_len = frame.len() - 4;
            frame.resize(frame.len() + len, 0x5a);
            let payload = &frame[4..];
            let found = DataHead::Found {
                stream_id,
                offset,
                len: head_len,
                data_len: len,
            };
            assert_eq!(read_stream_data_head(payload, payload.len()), found);
            // Only the head is needed, and every prefix of it is `Short`.
            assert_eq!(
                read_stream_data_head(&payload[..head_len], payload.len()),
                found
            );
            for cut in 0..head_len {
                assert_eq!(
                    read_stream_data_head(&payload[..cut], payload.len()),
                    DataHead::Short,
                    "cut {cut}"
                );
            }
            // A bin that does not end the frame (a field after it).
            assert_eq!(
                read_stream_data_head(payload, payload.len() + 1),
                DataHead::Other
            );
            // Any changed byte of the head is another message.
            for at in 0..head_len {
                let mut bad = payload.to_vec();
                bad[at] ^= 0x01;
                assert_ne!(
                    read_stream_data_head(&bad, bad.len()),
                    found,
                    "byte {at} changed"
                );
            }
        }
        // The same fields in another order are not taken for it.
        #[derive(serde::Serialize)]
        struct Swapped<'a> {
            offset: u64,
            stream_id: u64,
            #[serde(with = "serde_bytes")]
            data: &'a [u8],
        }
        let mut other = Vec::new();
        let value = Swapped {
            offset: 1,
            stream_id: 2,
            data: b"x",
        };
        encode_notification(
            &mut other,
            crate::methods::FS_READ_STREAM_DATA,
            &value,
            1 << 24,
        )
        .unwrap();
        assert_eq!(
            read_stream_data_head(&other[4..], other.len() - 4),
            DataHead::Other
        );
        // The serde encoding of the real type is recognised as well.
        let mut serde = Vec::new();
        let value = ReadStreamData {
            stream_id: 3,
            offset: 4,
            data: serde_bytes::ByteBuf::from(vec![7u8; 10]),
        };
        encode_notification(
            &mut serde,
            crate::methods::FS_READ_STREAM_DATA,
            &value,
            1 << 24,
        )
        .unwrap();
        assert!(matches!(
            read_stream_data_head(&serde[4..], serde.len() - 4),
            DataHead::Found {
                stream_id: 3,
                offset: 4,
                data_len: 10,
                ..
            }
        ));
    }

    #[test]
    fn read_block_head_plus_data_equals_the_serde_encoding() {
        #[derive(serde::Serialize)]
        struct R {
            eof: bool,
            #[serde(with = "serde_bytes")]
            data: Vec<u8>,
        }
        for len in [0usize, 7, 300, 70_000] {
            for eof in [false, true] {
                let data: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
                let mut want = Vec::new();
                encode_response(
                    &mut want,
                    Some(1234567),
                    &R {
                        eof,
                        data: data.clone(),
                    },
                    1 << 24,
                )
                .unwrap();
                let mut got = Vec::new();
                encode_read_block_head(&mut got, 1234567, eof, len, 1 << 24).unwrap();
                got.extend_from_slice(&data);
                assert_eq!(got, want);
                // And it decodes as the typed result.
                let frame = &got[4..];
                match Incoming::decode(frame).unwrap() {
                    Incoming::Response { result: Ok(v), .. } => {
                        let r: crate::types::fs::ReadBlockResult = from_params(v).unwrap();
                        assert_eq!((r.eof, r.data.len()), (eof, len));
                    }
                    other => panic!("{other:?}"),
                }
                // And it is recognised without decoding, exactly.
                let (id, got_eof, start) = read_block_response(frame).unwrap();
                assert_eq!((id, got_eof, &frame[start..]), (1234567, eof, &data[..]));
                assert_eq!(read_block_response(&frame[..frame.len() - 1]), None);
                let mut longer = frame.to_vec();
                longer.push(0);
                assert_eq!(read_block_response(&longer), None);
                for at in 0..start {
                    let mut bad = frame.to_vec();
                    bad[at] ^= 0x01;
                    assert_ne!(
                        read_block_response(&bad),
                        Some((1234567, eof, start)),
                        "byte {at} changed"
                    );
                }
            }
        }
        // Another answer (a map of other keys) is not taken for one.
        let mut other = Vec::new();
        #[derive(serde::Serialize)]
        struct Handle {
            handle: u64,
        }
        encode_response(&mut other, Some(5), &Handle { handle: 1 }, 1 << 24).unwrap();
        assert_eq!(read_block_response(&other[4..]), None);
    }

    #[test]
    fn nil_bomb_is_refused_before_decoding() {
        let mut frame = vec![0xdd, 0x00, 0x20, 0x00, 0x00];
        frame.extend(std::iter::repeat_n(0xc0u8, 0x20_0000));
        let e = Incoming::decode(&frame).unwrap_err();
        assert_eq!(e.error.code, ErrorCode::LimitExceeded);
    }

    #[test]
    fn deep_nesting_refused() {
        let frame = vec![0x91u8; 1000];
        let e = Incoming::decode(&frame).unwrap_err();
        assert_eq!(e.error.code, ErrorCode::LimitExceeded);
    }

    #[test]
    fn missing_field_is_named() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct P {
            inner: Inner,
        }
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct Inner {
            rows: u16,
        }
        let v = Value::Map(vec![(Value::from("inner"), Value::Map(vec![]))]);
        let e = from_params::<P>(v).unwrap_err();
        assert_eq!(
            e.data_get("field").and_then(|v| v.as_str()),
            Some("inner.rows")
        );
    }
}
