//! `--target`: `local`, `ssh://[user@]host[:port]` or a plain
//! `[user@]host`, parsed into where the command line connects. The library
//! takes a [`Target`](executor_client::Target) (a list of transports); this
//! grammar is the command line's own.

/// Where `--target` says the agent runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CliTarget {
    /// The `executor` next to this binary (or `$EXECUTOR_BIN`).
    Local,
    /// `ssh -T [-p PORT] [USER@]HOST executor`.
    Ssh {
        user: Option<String>,
        host: String,
        port: Option<u16>,
    },
}

impl CliTarget {
    /// Parse `local`, `ssh://[user@]host[:port]` or a plain `[user@]host`.
    pub fn parse(s: &str) -> Result<CliTarget, String> {
        if s == "local" {
            return Ok(CliTarget::Local);
        }
        let rest = s.strip_prefix("ssh://").unwrap_or(s);
        let rest = rest.trim_end_matches('/');
        let (user, hostport) = match rest.rsplit_once('@') {
            Some((u, h)) => (Some(u.to_string()), h),
            None => (None, rest),
        };
        let (host, port) = match hostport.strip_prefix('[') {
            // `[v6]` or `[v6]:port`: the brackets are the URL's, not ssh's.
            Some(inner) => {
                let (h, after) = inner
                    .split_once(']')
                    .ok_or_else(|| format!("unclosed [ in target {s:?}"))?;
                let port = match after {
                    "" => None,
                    p => Some(
                        p.strip_prefix(':')
                            .and_then(|p| p.parse::<u16>().ok())
                            .ok_or_else(|| format!("invalid port {p:?} in target {s:?}"))?,
                    ),
                };
                (h.to_string(), port)
            }
            None => match hostport.rsplit_once(':') {
                Some((h, p)) if !h.contains(':') => {
                    let port = p
                        .parse::<u16>()
                        .map_err(|_| format!("invalid port {p:?} in target {s:?}"))?;
                    (h.to_string(), Some(port))
                }
                _ => (hostport.to_string(), None),
            },
        };
        let valid = |v: &str| {
            !v.is_empty()
                && !v.starts_with('-')
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-[]:".contains(c))
        };
        if !valid(&host) {
            return Err(format!("invalid host {host:?} in target {s:?}"));
        }
        if let Some(u) = &user {
            if !valid(u) {
                return Err(format!("invalid user {u:?} in target {s:?}"));
            }
        }
        Ok(CliTarget::Ssh { user, host, port })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_targets() {
        assert_eq!(CliTarget::parse("local").unwrap(), CliTarget::Local);
        assert_eq!(
            CliTarget::parse("ssh://me@box:2222").unwrap(),
            CliTarget::Ssh {
                user: Some("me".into()),
                host: "box".into(),
                port: Some(2222)
            }
        );
        assert_eq!(
            CliTarget::parse("devbox").unwrap(),
            CliTarget::Ssh {
                user: None,
                host: "devbox".into(),
                port: None
            }
        );
        assert!(CliTarget::parse("-oProxyCommand=x").is_err());
        assert!(CliTarget::parse("ssh://a b").is_err());
        assert_eq!(
            CliTarget::parse("ssh://me@[::1]:2222").unwrap(),
            CliTarget::Ssh {
                user: Some("me".into()),
                host: "::1".into(),
                port: Some(2222)
            }
        );
        assert_eq!(
            CliTarget::parse("[::1]").unwrap(),
            CliTarget::Ssh {
                user: None,
                host: "::1".into(),
                port: None
            }
        );
    }
}
