//! The Codex dialect's framing: newline-delimited JSON-RPC without the
//! `jsonrpc` key, ids a string or an integer, errors `{code, message}`.
//!
//! Incoming lines are bounded (64 MiB, CRLF tolerated, blank lines
//! skipped); a line is parsed into a JSON value that rejects duplicate
//! object keys and holds at most [`MAX_VALUES`] values, as the reference
//! server does. Uses `serde_json`, `base64`, `bytes` and `tokio`.

use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::fmt;
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// At most this many bytes in one incoming line (the reference's bound).
pub const MAX_LINE_BYTES: usize = 64 << 20;
/// At most this many JSON values in one incoming message.
pub const MAX_VALUES: usize = 256 * 1024;

/// JSON-RPC error codes the dialect answers with (the reference's).
pub mod code {
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL: i64 = -32603;
    pub const NOT_FOUND: i64 = -32004;
    pub const SESSION_ATTACHED: i64 = -32010;
}

/// A request id: a string or an integer, echoed as it came.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Id {
    Int(i64),
    Str(String),
}

impl Id {
    pub fn to_json(&self) -> Value {
        match self {
            Id::Int(n) => Value::from(*n),
            Id::Str(s) => Value::from(s.clone()),
        }
    }
}

/// An error answered to a request.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    /// The reference's `data`, where it sends one.
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }
    pub fn with_data(mut self, data: Value) -> RpcError {
        self.data = Some(data);
        self
    }
    pub fn invalid_request(message: impl Into<String>) -> RpcError {
        RpcError::new(code::INVALID_REQUEST, message)
    }
    pub fn invalid_params(message: impl Into<String>) -> RpcError {
        RpcError::new(code::INVALID_PARAMS, message)
    }
    pub fn internal(message: impl Into<String>) -> RpcError {
        RpcError::new(code::INTERNAL, message)
    }
}

/// One incoming message.
#[derive(Debug)]
pub enum Message {
    Request {
        id: Id,
        method: String,
        params: Value,
    },
    Notification {
        method: String,
        params: Value,
    },
    /// An answer to a request of ours (the dialect sends none: ignored).
    Response {
        id: Id,
    },
}

/// What a line that is not a message is answered with (id -1, `-32600`).
#[derive(Debug)]
pub struct Malformed(pub String);

/// One line of input: a message, a malformed line, or the end.
#[derive(Debug)]
pub enum Line {
    Message(Message),
    Malformed(Malformed),
    /// A line over [`MAX_LINE_BYTES`]: the stream cannot be resynchronised
    /// before its end, which is skipped.
    TooLong,
    End,
}

/// Read the next non-blank line of `input` and parse it.
pub async fn read_line<R: AsyncBufRead + Unpin>(
    input: &mut R,
    buf: &mut Vec<u8>,
) -> std::io::Result<Line> {
    loop {
        buf.clear();
        let mut too_long = false;
        loop {
            let available = input.fill_buf().await?;
            if available.is_empty() {
                if buf.is_empty() && !too_long {
                    return Ok(Line::End);
                }
                break;
            }
            let (take, done) = match available.iter().position(|&b| b == b'\n') {
                Some(i) => (i + 1, true),
                None => (available.len(), false),
            };
            if !too_long {
                if buf.len() + take > MAX_LINE_BYTES + 2 {
                    too_long = true;
                    buf.clear();
                } else {
                    buf.extend_from_slice(&available[..take]);
                }
            }
            input.consume(take);
            if done {
                break;
            }
        }
        if too_long {
            return Ok(Line::TooLong);
        }
        while matches!(buf.last(), Some(b'\n' | b'\r')) {
            buf.pop();
        }
        if buf.iter().all(|b| b.is_ascii_whitespace()) {
            continue;
        }
        return Ok(match parse(buf) {
            Ok(m) => Line::Message(m),
            Err(m) => Line::Malformed(m),
        });
    }
}

/// Parse one line into a message.
pub fn parse(line: &[u8]) -> Result<Message, Malformed> {
    let value = strict_value(line).map_err(|e| {
        Malformed(format!(
            "failed to parse JSON-RPC message from exec-server stdio: {e}"
        ))
    })?;
    let Value::Object(mut o) = value else {
        return Err(Malformed(
            "failed to parse JSON-RPC message from exec-server stdio: expected a JSON-RPC object"
                .into(),
        ));
    };
    let id = match o.remove("id") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(Id::Str(s)),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(n) => Some(Id::Int(n)),
            None => {
                return Err(Malformed(format!(
                    "failed to parse JSON-RPC message from exec-server stdio: id {n} is not an integer"
                )))
            }
        },
        Some(other) => {
            return Err(Malformed(format!(
                "failed to parse JSON-RPC message from exec-server stdio: id must be a string or an integer, got {other}"
            )))
        }
    };
    let method = match o.remove("method") {
        None => None,
        Some(Value::String(s)) => Some(s),
        Some(other) => {
            return Err(Malformed(format!(
                "failed to parse JSON-RPC message from exec-server stdio: method must be a string, got {other}"
            )))
        }
    };
    let params = o.remove("params").unwrap_or(Value::Null);
    match (id, method) {
        (Some(id), Some(method)) => Ok(Message::Request { id, method, params }),
        (None, Some(method)) => Ok(Message::Notification { method, params }),
        (Some(id), None) if o.contains_key("result") || o.contains_key("error") => {
            Ok(Message::Response { id })
        }
        _ => Err(Malformed(
            "failed to parse JSON-RPC message from exec-server stdio: neither a request, a notification nor a response"
                .into(),
        )),
    }
}

/// A response line (with its newline).
pub fn response(id: &Id, result: Result<Value, RpcError>) -> Vec<u8> {
    let mut o = Map::new();
    match result {
        Ok(v) => {
            o.insert("id".into(), id.to_json());
            o.insert("result".into(), v);
        }
        Err(e) => {
            let mut err = Map::new();
            err.insert("code".into(), e.code.into());
            err.insert("message".into(), e.message.into());
            if let Some(d) = e.data {
                err.insert("data".into(), d);
            }
            o.insert("error".into(), Value::Object(err));
            o.insert("id".into(), id.to_json());
        }
    }
    line(&Value::Object(o))
}

/// The line `response(id, Ok({"chunk": base64(data), "eof": eof}))` is,
/// byte for byte (keys in order, base64 needs no escape), with the base64
/// written straight from `pieces` (the data, in order) into the line.
pub fn chunk_response(id: &Id, pieces: &[bytes::Bytes], eof: bool) -> Vec<u8> {
    match pieces {
        [] => chunk_response_from(id, &[], eof),
        [one] => chunk_response_from(id, one, eof),
        // A block the agent answered in parts: joined first.
        many => chunk_response_from(id, &many.concat(), eof),
    }
}

/// [`chunk_response`] of one piece of data.
pub fn chunk_response_from(id: &Id, data: &[u8], eof: bool) -> Vec<u8> {
    let data_len = data.len();
    let b64_len = base64::encoded_len(data_len, true).expect("a block's base64 fits");
    let mut out = Vec::with_capacity(b64_len + 64);
    out.extend_from_slice(b"{\"id\":");
    serde_json::to_writer(&mut out, &id.to_json()).expect("an id serializes");
    out.extend_from_slice(b",\"result\":{\"chunk\":\"");
    // base64-simd (SIMD chosen at run time) rather than the base64
    // crate's scalar engine: this encode is most of the dialect's work per
    // block read.
    base64_simd::STANDARD.encode_append(data, &mut out);
    out.extend_from_slice(if eof {
        b"\",\"eof\":true}}\n"
    } else {
        b"\",\"eof\":false}}\n"
    });
    out
}

/// A notification line (with its newline).
pub fn notification(method: &str, params: Value) -> Vec<u8> {
    let mut o = Map::new();
    o.insert("method".into(), method.into());
    o.insert("params".into(), params);
    line(&Value::Object(o))
}

/// The answer to a malformed line.
pub fn malformed(m: &Malformed) -> Vec<u8> {
    response(&Id::Int(-1), Err(RpcError::invalid_request(m.0.clone())))
}

fn line(v: &Value) -> Vec<u8> {
    let mut out = serde_json::to_vec(v).expect("a JSON value serializes");
    out.push(b'\n');
    out
}

/// Parse `bytes` as one JSON value, refusing duplicate object keys and
/// more than [`MAX_VALUES`] values.
pub fn strict_value(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let mut count = 0usize;
    let v = Strict(&mut count).deserialize(&mut de)?;
    de.end()?;
    Ok(v)
}

struct Strict<'a>(&'a mut usize);

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl Strict<'_> {
    fn count<E: serde::de::Error>(&mut self) -> Result<(), E> {
        *self.0 += 1;
        if *self.0 > MAX_VALUES {
            return Err(E::custom(format!(
                "message holds more than {MAX_VALUES} JSON values"
            )));
        }
        Ok(())
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E: serde::de::Error>(mut self, v: bool) -> Result<Value, E> {
        self.count()?;
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: serde::de::Error>(mut self, v: i64) -> Result<Value, E> {
        self.count()?;
        Ok(Value::from(v))
    }
    fn visit_u64<E: serde::de::Error>(mut self, v: u64) -> Result<Value, E> {
        self.count()?;
        Ok(Value::from(v))
    }
    fn visit_f64<E: serde::de::Error>(mut self, v: f64) -> Result<Value, E> {
        self.count()?;
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E: serde::de::Error>(mut self, v: &str) -> Result<Value, E> {
        self.count()?;
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E: serde::de::Error>(mut self, v: String) -> Result<Value, E> {
        self.count()?;
        Ok(Value::String(v))
    }
    fn visit_unit<E: serde::de::Error>(mut self) -> Result<Value, E> {
        self.count()?;
        Ok(Value::Null)
    }
    fn visit_none<E: serde::de::Error>(mut self) -> Result<Value, E> {
        self.count()?;
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<Value, A::Error> {
        self.count()?;
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(Strict(&mut *self.0))? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<Value, A::Error> {
        self.count()?;
        let mut out = Map::new();
        while let Some(k) = map.next_key::<String>()? {
            if out.contains_key(&k) {
                return Err(serde::de::Error::custom(format!(
                    "duplicate key `{k}` in a JSON object"
                )));
            }
            let v = map.next_value_seed(Strict(&mut *self.0))?;
            out.insert(k, v);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_notifications_and_ids() {
        match parse(br#"{"id":"a","method":"m","params":{"x":1}}"#).unwrap() {
            Message::Request { id, method, .. } => {
                assert_eq!(id, Id::Str("a".into()));
                assert_eq!(method, "m");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(br#"{"method":"initialized"}"#).unwrap(),
            Message::Notification { .. }
        ));
        assert!(matches!(
            parse(br#"{"id":7,"result":{}}"#).unwrap(),
            Message::Response { id: Id::Int(7) }
        ));
    }

    #[test]
    fn malformed_lines_say_why() {
        let e = parse(b"garbage").unwrap_err();
        assert_eq!(
            e.0,
            "failed to parse JSON-RPC message from exec-server stdio: expected value at line 1 column 1"
        );
        assert!(parse(br#"{"id":1,"id":2,"method":"m"}"#)
            .unwrap_err()
            .0
            .contains("duplicate key `id`"));
        assert!(parse(br#"{"id":1,"method":"m","params":{"a":1,"a":2}}"#)
            .unwrap_err()
            .0
            .contains("duplicate key `a`"));
        assert!(parse(br#"{"id":1.5,"method":"m"}"#).is_err());
        assert!(parse(b"[1]").is_err());
    }

    #[test]
    fn the_value_count_is_bounded() {
        let many = format!("[{}0]", "0,".repeat(MAX_VALUES));
        assert!(strict_value(many.as_bytes())
            .unwrap_err()
            .to_string()
            .contains("more than"));
        let fine = format!("[{}0]", "0,".repeat(1000));
        assert!(strict_value(fine.as_bytes()).is_ok());
    }

    #[test]
    fn a_chunk_line_is_the_value_line() {
        use base64::Engine;
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 31 % 251) as u8).collect();
        for id in [Id::Int(7), Id::Int(-3), Id::Str("a\"b\\c\u{1}é".into())] {
            for eof in [false, true] {
                for cut in [0usize, 1, 2, 3, 4, 99_999, 100_000] {
                    let (a, b) = data.split_at(cut);
                    let pieces = [
                        bytes::Bytes::copy_from_slice(a),
                        bytes::Bytes::copy_from_slice(b),
                    ];
                    let want = response(
                        &id,
                        Ok(serde_json::json!({
                            "chunk": base64::engine::general_purpose::STANDARD.encode(&data),
                            "eof": eof,
                        })),
                    );
                    assert_eq!(chunk_response(&id, &pieces, eof), want, "cut {cut}");
                    assert_eq!(
                        chunk_response(&id, &pieces[..1], eof),
                        response(
                            &id,
                            Ok(serde_json::json!({
                                "chunk": base64::engine::general_purpose::STANDARD.encode(a),
                                "eof": eof,
                            })),
                        )
                    );
                }
            }
            assert_eq!(
                chunk_response(&id, &[], true),
                response(&id, Ok(serde_json::json!({"chunk": "", "eof": true})))
            );
        }
    }

    #[tokio::test]
    async fn lines_skip_blanks_and_tolerate_crlf() {
        let input = b"\r\n{\"method\":\"a\"}\r\n\n{\"method\":\"b\"}";
        let mut r = tokio::io::BufReader::new(&input[..]);
        let mut buf = Vec::new();
        for want in ["a", "b"] {
            match read_line(&mut r, &mut buf).await.unwrap() {
                Line::Message(Message::Notification { method, .. }) => assert_eq!(method, want),
                other => panic!("{other:?}"),
            }
        }
        assert!(matches!(
            read_line(&mut r, &mut buf).await.unwrap(),
            Line::End
        ));
    }
}

/// Bytes of lines queued for the client at most (a longer line alone
/// takes all of it): a client that stops reading stops what makes lines
/// (the request loop, jobs' output, HTTP streams), before the agent's
/// memory grows by more than this.
pub const OUT_BUDGET: usize = 64 << 20;

/// The connection's lines for the client, in order, bounded in number and
/// in bytes ([`OUT_BUDGET`]); each line's share of the budget comes back
/// once it is written.
#[derive(Clone, Debug)]
pub struct Out {
    tx: tokio::sync::mpsc::Sender<(Vec<u8>, tokio::sync::OwnedSemaphorePermit)>,
    budget: std::sync::Arc<tokio::sync::Semaphore>,
}

/// The client is gone: nothing more is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed;

/// The receiving end: lines with their share of the budget, dropped once
/// written.
pub type OutRx = tokio::sync::mpsc::Receiver<(Vec<u8>, tokio::sync::OwnedSemaphorePermit)>;

/// A place in the queue and `bytes` of the budget, taken before the line
/// is known (sent without waiting).
#[derive(Debug)]
pub struct Reserved {
    slot: tokio::sync::mpsc::OwnedPermit<(Vec<u8>, tokio::sync::OwnedSemaphorePermit)>,
    bytes: tokio::sync::OwnedSemaphorePermit,
}

impl Reserved {
    pub fn send(self, line: Vec<u8>) {
        self.slot.send((line, self.bytes));
    }
}

impl Out {
    /// A queue of `lines` lines.
    pub fn new(lines: usize) -> (Out, OutRx) {
        let (tx, rx) = tokio::sync::mpsc::channel(lines);
        let budget = std::sync::Arc::new(tokio::sync::Semaphore::new(OUT_BUDGET));
        (Out { tx, budget }, rx)
    }

    fn share(len: usize) -> u32 {
        len.clamp(1, OUT_BUDGET) as u32
    }

    /// Queue `line`, waiting for its share of the budget and a place.
    pub async fn send(&self, line: Vec<u8>) -> Result<(), Closed> {
        let bytes = self
            .budget
            .clone()
            .acquire_many_owned(Out::share(line.len()))
            .await
            .map_err(|_| Closed)?;
        self.tx.send((line, bytes)).await.map_err(|_| Closed)
    }

    /// A place and `bytes` of the budget for a line sent later.
    pub async fn reserve(&self, bytes: usize) -> Result<Reserved, Closed> {
        let bytes = self
            .budget
            .clone()
            .acquire_many_owned(Out::share(bytes))
            .await
            .map_err(|_| Closed)?;
        let slot = self.tx.clone().reserve_owned().await.map_err(|_| Closed)?;
        Ok(Reserved { slot, bytes })
    }
}
