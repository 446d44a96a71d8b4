//! The agent's configuration: `/etc/executor/config.toml`, or the file given
//! with `--config`.
//!
//! A missing default file means the built-in defaults; a file given with
//! `--config` must exist. Unknown keys are errors (a typo must not silently
//! widen what a key may do), and every error names the file, the line and
//! the key.
//!
//! ```toml
//! [limits]                 # any limit of PROTOCOL.md §2, lowered or raised
//! max_processes = 64
//! max_http_body_bytes = 4194304
//!
//! [http]
//! # When non-empty, only these destinations may be reached: a host name
//! # (`mirror.corp`), a suffix (`*.corp`), an address or CIDR (`10.0.0.0/8`,
//! # `[fd00::/8]`), each with an optional `:port`. A CIDR entry also admits
//! # addresses refused by default (link-local, metadata), a name never does.
//! allow = ["mirror.corp:443", "10.0.0.0/8"]
//! extra_ca_file = "/etc/executor/corp-ca.pem"   # PEM, added to the host's roots
//! proxy = "http://proxy.corp:3128"              # HTTP(S)_PROXY is never read
//! ```

use crate::http::policy::{AllowEntry, ParseAllowError};
use executor_protocol::limits::Limits;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Where the agent looks when `--config` is not given.
pub const DEFAULT_PATH: &str = "/etc/executor/config.toml";

/// The validated configuration the agent runs with.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// The limits in force (defaults, with the file's overrides).
    pub limits: Limits,
    /// HTTP destination policy, trust and proxy.
    pub http: HttpConfig,
}

/// `[http]`
#[derive(Debug, Clone, Default)]
pub struct HttpConfig {
    /// Empty: every destination not refused by default.
    pub allow: Vec<AllowEntry>,
    /// Extra trust anchors (DER), added to the host's trust store.
    pub extra_roots: Vec<rustls_pki_types::CertificateDer<'static>>,
    /// `http://host:port` of a proxy (CONNECT tunnels for every request).
    pub proxy: Option<url::Url>,
}

/// Why the configuration cannot be used. Displays as
/// `FILE:LINE: KEY: what is wrong`.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {key}: {message}")]
    Invalid {
        path: PathBuf,
        line: usize,
        key: String,
        message: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    limits: Option<toml::Spanned<RawLimits>>,
    #[serde(default)]
    http: RawHttp,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    max_frame_bytes: Option<toml::Spanned<u64>>,
    max_requests_in_flight: Option<toml::Spanned<u64>>,
    max_processes: Option<toml::Spanned<u64>>,
    output_buffer_bytes: Option<toml::Spanned<u64>>,
    max_output_chunk_bytes: Option<toml::Spanned<u64>>,
    max_open_files: Option<toml::Spanned<u64>>,
    max_block_bytes: Option<toml::Spanned<u64>>,
    max_read_file_bytes: Option<toml::Spanned<u64>>,
    max_walk_entries: Option<toml::Spanned<u64>>,
    max_walk_response_bytes: Option<toml::Spanned<u64>>,
    max_http_body_bytes: Option<toml::Spanned<u64>>,
    max_http_streams: Option<toml::Spanned<u64>>,
    max_detach_ttl_ms: Option<toml::Spanned<u64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    #[serde(default)]
    allow: Vec<toml::Spanned<String>>,
    extra_ca_file: Option<toml::Spanned<PathBuf>>,
    proxy: Option<toml::Spanned<String>>,
}

/// Room in a frame for the envelope around the largest payload.
const FRAME_MARGIN: u64 = 64 * 1024;

impl Config {
    /// Load `explicit` (which must exist), or the default path (which may
    /// be missing: built-in defaults).
    pub fn load(explicit: Option<&Path>) -> Result<Config, ConfigError> {
        let path = explicit.unwrap_or(Path::new(DEFAULT_PATH));
        match std::fs::read_to_string(path) {
            Ok(text) => Config::parse(path, &text),
            Err(e) if explicit.is_none() && e.kind() == std::io::ErrorKind::NotFound => {
                Ok(Config::default())
            }
            Err(source) => Err(ConfigError::Read {
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    /// Parse and validate a configuration file's text.
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let invalid = |span: Option<std::ops::Range<usize>>, key: &str, message: String| {
            ConfigError::Invalid {
                path: path.to_path_buf(),
                line: span.map_or(0, |s| line_of(text, s.start)),
                key: key.to_string(),
                message,
            }
        };
        let raw: RawFile = toml::from_str(text).map_err(|e| {
            let key = unknown_key(e.message()).unwrap_or_default();
            invalid(e.span(), &key, e.message().trim().to_string())
        })?;

        let mut limits = Limits::default();
        let no_limits = RawLimits::default();
        let limits_span = raw.limits.as_ref().map(|l| l.span());
        let l = raw.limits.as_ref().map_or(&no_limits, |l| l.get_ref());
        let table: [(&str, &Option<toml::Spanned<u64>>, &mut u64); 13] = [
            (
                "max_frame_bytes",
                &l.max_frame_bytes,
                &mut limits.max_frame_bytes,
            ),
            (
                "max_requests_in_flight",
                &l.max_requests_in_flight,
                &mut limits.max_requests_in_flight,
            ),
            ("max_processes", &l.max_processes, &mut limits.max_processes),
            (
                "output_buffer_bytes",
                &l.output_buffer_bytes,
                &mut limits.output_buffer_bytes,
            ),
            (
                "max_output_chunk_bytes",
                &l.max_output_chunk_bytes,
                &mut limits.max_output_chunk_bytes,
            ),
            (
                "max_open_files",
                &l.max_open_files,
                &mut limits.max_open_files,
            ),
            (
                "max_block_bytes",
                &l.max_block_bytes,
                &mut limits.max_block_bytes,
            ),
            (
                "max_read_file_bytes",
                &l.max_read_file_bytes,
                &mut limits.max_read_file_bytes,
            ),
            (
                "max_walk_entries",
                &l.max_walk_entries,
                &mut limits.max_walk_entries,
            ),
            (
                "max_walk_response_bytes",
                &l.max_walk_response_bytes,
                &mut limits.max_walk_response_bytes,
            ),
            (
                "max_http_body_bytes",
                &l.max_http_body_bytes,
                &mut limits.max_http_body_bytes,
            ),
            (
                "max_http_streams",
                &l.max_http_streams,
                &mut limits.max_http_streams,
            ),
            (
                "max_detach_ttl_ms",
                &l.max_detach_ttl_ms,
                &mut limits.max_detach_ttl_ms,
            ),
        ];
        let mut spans = std::collections::HashMap::new();
        for (name, value, slot) in table {
            if let Some(v) = value {
                if *v.get_ref() == 0 {
                    return Err(invalid(
                        Some(v.span()),
                        &format!("limits.{name}"),
                        "must be at least 1".into(),
                    ));
                }
                *slot = *v.get_ref();
                spans.insert(name, v.span());
            }
        }
        // Payloads answered in one frame must fit one frame with room for
        // the envelope.
        let frame = limits.max_frame_bytes;
        if frame < 2 * FRAME_MARGIN {
            return Err(invalid(
                spans.get("max_frame_bytes").cloned(),
                "limits.max_frame_bytes",
                format!(
                    "{frame} is below the smallest usable frame ({})",
                    2 * FRAME_MARGIN
                ),
            ));
        }
        for (name, value) in [
            ("max_block_bytes", limits.max_block_bytes),
            ("max_read_file_bytes", limits.max_read_file_bytes),
            ("max_walk_response_bytes", limits.max_walk_response_bytes),
            ("max_http_body_bytes", limits.max_http_body_bytes),
            ("max_output_chunk_bytes", limits.max_output_chunk_bytes),
        ] {
            if value > frame - FRAME_MARGIN {
                let span = spans
                    .get(name)
                    .or_else(|| spans.get("max_frame_bytes"))
                    .cloned()
                    .or(limits_span.clone());
                return Err(invalid(
                    span,
                    &format!("limits.{name}"),
                    format!(
                        "{value} does not fit one frame (max_frame_bytes {frame} less {FRAME_MARGIN} for the envelope)"
                    ),
                ));
            }
        }

        let mut http = HttpConfig::default();
        for (i, entry) in raw.http.allow.iter().enumerate() {
            let parsed = AllowEntry::parse(entry.get_ref()).map_err(|e: ParseAllowError| {
                invalid(
                    Some(entry.span()),
                    &format!("http.allow[{i}]"),
                    e.to_string(),
                )
            })?;
            http.allow.push(parsed);
        }
        if let Some(file) = &raw.http.extra_ca_file {
            http.extra_roots = load_pem_roots(file.get_ref())
                .map_err(|message| invalid(Some(file.span()), "http.extra_ca_file", message))?;
        }
        if let Some(proxy) = &raw.http.proxy {
            let url = url::Url::parse(proxy.get_ref())
                .map_err(|e| format!("{:?} is not a URL: {e}", proxy.get_ref()))
                .and_then(|u| {
                    if u.scheme() != "http" || u.host().is_none() {
                        Err(format!(
                            "{:?}: only an http://host[:port] proxy is supported",
                            proxy.get_ref()
                        ))
                    } else {
                        Ok(u)
                    }
                })
                .map_err(|message| invalid(Some(proxy.span()), "http.proxy", message))?;
            http.proxy = Some(url);
        }
        Ok(Config { limits, http })
    }
}

/// Read a PEM bundle; an empty or unreadable bundle is an error.
fn load_pem_roots(path: &Path) -> Result<Vec<rustls_pki_types::CertificateDer<'static>>, String> {
    use rustls_pki_types::pem::PemObject;
    let certs = rustls_pki_types::CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in the file", path.display()));
    }
    Ok(certs)
}

/// 1-based line of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// The key named by serde's "unknown field `x`" message.
fn unknown_key(message: &str) -> Option<String> {
    let rest = message.split("unknown field `").nth(1)?;
    Some(rest.split('`').next()?.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("/etc/executor/config.toml"), text)
    }

    #[test]
    fn empty_file_is_the_defaults() {
        let c = parse("").unwrap();
        assert_eq!(c.limits, Limits::default());
        assert!(c.http.allow.is_empty() && c.http.proxy.is_none());
    }

    #[test]
    fn limits_override_and_are_checked_against_the_frame() {
        let c = parse("[limits]\nmax_processes = 7\n").unwrap();
        assert_eq!(c.limits.max_processes, 7);
        let e = parse("[limits]\n\nmax_http_body_bytes = 999999999\n").unwrap_err();
        let shown = e.to_string();
        assert!(
            shown.starts_with("/etc/executor/config.toml:3: limits.max_http_body_bytes: 999999999"),
            "{shown}"
        );
        let e = parse("[limits]\nmax_open_files = 0\n").unwrap_err();
        assert!(
            e.to_string()
                .contains(":2: limits.max_open_files: must be at least 1"),
            "{e}"
        );
    }

    #[test]
    fn unknown_keys_and_bad_values_name_file_line_and_key() {
        let e = parse("[http]\nallow = []\nalow = [\"x\"]\n").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("/etc/executor/config.toml:3: alow: "),
            "{e}"
        );
        let e = parse("[http]\nallow = [\n  \"10.0.0.0/8\",\n  \"10.0.0.0/99\",\n]\n").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("/etc/executor/config.toml:4: http.allow[1]: "),
            "{e}"
        );
        let e = parse("[http]\nproxy = \"socks5://p:1080\"\n").unwrap_err();
        assert!(e.to_string().contains(":2: http.proxy: "), "{e}");
        let e = parse("[limits]\nmax_processes = \"many\"\n").unwrap_err();
        assert!(e.to_string().contains(":2: "), "{e}");
    }

    #[test]
    fn a_missing_explicit_file_is_an_error_and_a_missing_default_is_not() {
        let e = Config::load(Some(Path::new("/nonexistent/executor.toml"))).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("/nonexistent/executor.toml: cannot read"),
            "{e}"
        );
    }
}
