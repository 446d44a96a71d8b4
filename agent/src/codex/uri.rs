//! `file:` URIs of the Codex dialect ↔ the native protocol's paths.
//!
//! A URI is parsed as the `url` crate parses it (so `.` and `..` segments
//! are resolved lexically, as the reference server resolves them);
//! percent-escapes decode to raw bytes, so a name that is not UTF-8
//! travels as `%FF`. A native absolute path is not a URI (refused, as the
//! reference refuses it). Uses only `url` and the protocol's `WirePath`.

use super::wire::RpcError;
use executor_protocol::WirePath;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The path a `file:` URI names.
pub fn to_path(uri: &str) -> Result<PathBuf, RpcError> {
    let url =
        url::Url::parse(uri).map_err(|e| RpcError::invalid_params(format!("invalid URI: {e}")))?;
    if url.scheme() != "file" {
        return Err(RpcError::invalid_params(format!(
            "unsupported path URI scheme `{}`",
            url.scheme()
        )));
    }
    match url.host_str() {
        None | Some("") | Some("localhost") => {}
        Some(_) => {
            return Err(RpcError::invalid_request(format!(
                "'{uri}' is invalid on 'linux'"
            )))
        }
    }
    let bytes = percent_decode(url.path().as_bytes());
    if bytes.contains(&0) || bytes.first() != Some(&b'/') {
        return Err(RpcError::invalid_params(format!(
            "'{uri}' is invalid on 'linux'"
        )));
    }
    // `file:///a/` names the directory `/a`.
    let mut bytes = bytes;
    while bytes.len() > 1 && bytes.last() == Some(&b'/') {
        bytes.pop();
    }
    Ok(PathBuf::from(OsStr::from_bytes(&bytes)))
}

/// The native wire path a `file:` URI names.
pub fn to_wire(uri: &str) -> Result<WirePath, RpcError> {
    Ok(wire_path(&to_path(uri)?))
}

/// A path as the native protocol carries it (bytes when not UTF-8).
pub fn wire_path(p: &Path) -> WirePath {
    WirePath::from(p)
}

/// The `file:` URI of an absolute path.
pub fn from_path(p: &Path) -> String {
    match url::Url::from_file_path(p) {
        Ok(u) => u.to_string(),
        // Not absolute: the native side only answers absolute paths.
        Err(()) => format!("file://{}", p.display()),
    }
}

/// The `file:` URI of a native wire path.
pub fn from_wire(p: &WirePath) -> String {
    from_path(Path::new(OsStr::from_bytes(p.as_bytes())))
}

fn percent_decode(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'%' && i + 2 < s.len() {
            if let (Some(h), Some(l)) = (hex(s[i + 1]), hex(s[i + 2])) {
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        out.push(s[i]);
        i += 1;
    }
    out
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_with_escapes_and_raw_bytes() {
        let p = Path::new(OsStr::from_bytes(b"/tmp/a b/\xff%x"));
        let uri = from_path(p);
        assert_eq!(uri, "file:///tmp/a%20b/%FF%25x");
        assert_eq!(to_path(&uri).unwrap(), p);
        assert_eq!(to_path("file:///tmp/").unwrap(), Path::new("/tmp"));
        assert_eq!(to_path("file:///").unwrap(), Path::new("/"));
        assert_eq!(to_path("file:///tmp/../etc").unwrap(), Path::new("/etc"));
    }

    #[test]
    fn refusals_match_the_reference() {
        let e = to_path("/tmp").unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (-32602, "invalid URI: relative URL without a base")
        );
        let e = to_path("http://x/tmp").unwrap_err();
        assert_eq!(e.message, "unsupported path URI scheme `http`");
        assert_eq!(to_path("file://host/tmp").unwrap_err().code, -32600);
        assert_eq!(to_path("file:///tmp/a%00b").unwrap_err().code, -32602);
    }
}
