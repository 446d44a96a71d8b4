//! Paths on the wire: `str` when valid UTF-8, `bin` (the raw bytes) otherwise.

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// A path as raw bytes (Unix paths are bytes). Serialises as `str` when the
/// bytes are UTF-8 and as `bin` when they are not; accepts both.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct WirePath(Vec<u8>);

impl WirePath {
    /// Wrap raw path bytes.
    pub fn from_bytes(bytes: impl Into<Vec<u8>>) -> Self {
        WirePath(bytes.into())
    }
    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
    /// Take the raw bytes.
    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }
    /// The path as UTF-8, if it is.
    pub fn as_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }
    /// Whether the path starts with `/`.
    pub fn is_absolute(&self) -> bool {
        self.0.first() == Some(&b'/')
    }
    /// A lossy rendering for messages and logs.
    pub fn display(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
    }
}

impl fmt::Debug for WirePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(&self.0))
    }
}

impl From<&str> for WirePath {
    fn from(s: &str) -> Self {
        WirePath(s.as_bytes().to_vec())
    }
}
/// The path's bytes as they are (not necessarily UTF-8).
#[cfg(unix)]
impl From<&std::path::Path> for WirePath {
    fn from(p: &std::path::Path) -> Self {
        use std::os::unix::ffi::OsStrExt;
        WirePath(p.as_os_str().as_bytes().to_vec())
    }
}

impl From<String> for WirePath {
    fn from(s: String) -> Self {
        WirePath(s.into_bytes())
    }
}

impl Serialize for WirePath {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(&self.0) {
            Ok(text) => s.serialize_str(text),
            Err(_) => s.serialize_bytes(&self.0),
        }
    }
}

impl<'de> Deserialize<'de> for WirePath {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = WirePath;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a path as str or bin")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<WirePath, E> {
                Ok(WirePath(v.as_bytes().to_vec()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<WirePath, E> {
                Ok(WirePath(v.into_bytes()))
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<WirePath, E> {
                Ok(WirePath(v.to_vec()))
            }
            fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<WirePath, E> {
                Ok(WirePath(v))
            }
        }
        d.deserialize_any(V)
    }
}
