//! The agent's configuration: `/etc/executor/config.toml`, or the file given
//! with `--config`.
//!
//! A missing default file means the built-in defaults; a file given with
//! `--config` must exist. Unknown keys are errors (a typo must not silently
//! widen what a key may do), and every error names the file, the line and
//! the key.
//!
//! ```toml
//! [limits]                 # any limit of docs/PROTOCOL.md §2, lowered or raised
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
//! # The variables a request's env_headers may read (a token that never
//! # crosses the client's connection), each to any destination or only to
//! # its `to` entries (as `allow`'s, matched on the URL's host and port).
//! # Unset: any but the executor's own credentials without --profile, none
//! # under a profile (unless its [http] sets it).
//! header_env = ["MCP_*", { env = "GITHUB_TOKEN", to = ["api.github.com:443"] }]
//!
//! [audit]                  # one JSON line per request
//! file = "/var/log/executor/audit.jsonl"
//! syslog = false           # or to /dev/log (syslog, journald)
//!
//! # Chosen with `executor --profile NAME` (in an authorized_keys forced
//! # command). A profile's own [limits] and [http] keys replace the top
//! # level's.
//! [profiles.readonly]
//! methods.allow = ["fs/*", "environment/info"]  # exact names or `family/*`
//! methods.deny = ["fs/remove"]                  # deny wins
//! read_only = true         # only the methods `executor --list-methods` marks
//!                          # read-only (no writes, no jobs, no network), and
//!                          # any named exactly in methods.allow
//! allow_root = false       # refuse to start as root
//! workspace_roots = ["/srv/work"]               # what `:workspace_roots` means
//! # Jobs and HTTP run under this intent; a request's own intent may only
//! # narrow it (same or fewer roots and ports).
//! sandbox = { filesystem = { write = [":workspace_roots"] }, network = "deny" }
//! ```

use crate::destinations::{AllowEntry, ParseAllowError};
use executor_protocol::limits::Limits;
use executor_protocol::methods;
use executor_protocol::types::sandbox::SandboxIntent;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Where the agent looks when `--config` is not given.
pub const DEFAULT_PATH: &str = "/etc/executor/config.toml";

/// The validated configuration the agent runs with (the chosen profile
/// applied).
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// The limits in force (defaults, with the file's overrides).
    pub limits: Limits,
    /// HTTP destination policy, trust and proxy.
    pub http: HttpConfig,
    /// What this key may do.
    pub profile: Profile,
    /// Where the audit log goes.
    pub audit: AuditConfig,
}

/// `[audit]`
#[derive(Debug, Clone, Default)]
pub struct AuditConfig {
    pub file: Option<PathBuf>,
    pub syslog: bool,
}

/// The chosen profile (without `--profile`: every method, as the SSH
/// user).
#[derive(Debug, Clone)]
pub struct Profile {
    /// `None` without `--profile`.
    pub name: Option<String>,
    /// Empty: every method.
    pub allow: Vec<String>,
    pub deny: Vec<String>,
    pub read_only: bool,
    pub allow_root: bool,
    pub workspace_roots: Vec<PathBuf>,
    /// The intent jobs and HTTP requests run under; requests may narrow it.
    pub sandbox: Option<SandboxIntent>,
    /// The job limits the configuration file set (`[limits.job]`, the
    /// profile's own over it): required caps, unlike the built-in
    /// defaults (docs/PROTOCOL.md §3.1).
    pub configured_job_limits: executor_protocol::types::process::JobLimits,
}

impl Default for Profile {
    fn default() -> Self {
        Profile {
            name: None,
            allow: Vec::new(),
            deny: Vec::new(),
            read_only: false,
            allow_root: true,
            workspace_roots: Vec::new(),
            sandbox: None,
            configured_job_limits: Default::default(),
        }
    }
}

/// `name` exactly, `family/*`, or `*`.
fn pattern_matches(pattern: &str, method: &str) -> bool {
    match pattern.strip_suffix("/*") {
        Some(family) => method
            .strip_prefix(family)
            .is_some_and(|rest| rest.starts_with('/')),
        None => pattern == "*" || pattern == method,
    }
}

impl Profile {
    /// Whether `method` may be called; the refusal names the rule.
    pub fn check(&self, method: &str) -> Result<(), String> {
        let who = self.name.as_deref().unwrap_or("(default)");
        // A deny rule reaches the method's aliases (the table's facts):
        // denying `process/start` denies `exec_command`, which starts a
        // job too.
        let aliases = methods::facts(method).map_or(&[][..], |f| f.aliases);
        let denied = |p: &String| {
            pattern_matches(p, method) || aliases.iter().any(|a| pattern_matches(p, a))
        };
        if let Some(p) = self.deny.iter().find(|p| denied(p)) {
            return Err(format!(
                "{method} is refused by profile {who}: methods.deny has {p:?}"
            ));
        }
        if !self.allow.is_empty() && !self.allow.iter().any(|p| pattern_matches(p, method)) {
            return Err(format!(
                "{method} is refused by profile {who}: not in methods.allow"
            ));
        }
        // read_only is an allow-list: the methods the protocol's table
        // marks read-only (nothing changed on the host, nothing started,
        // no network), and those `methods.allow` names exactly.
        let read_only = methods::facts(method).is_some_and(|f| f.is_read_only());
        if self.read_only && !read_only && !self.allow.iter().any(|p| p == method) {
            let what = match methods::facts(method) {
                Some(f) => [
                    (f.changes_host, "changes the host"),
                    (f.spawns, "starts a process"),
                    (f.network, "reaches the network"),
                ]
                .iter()
                .filter(|(on, _)| *on)
                .map(|(_, w)| *w)
                .collect::<Vec<_>>()
                .join(" and "),
                None => "not in the method table".into(),
            };
            return Err(format!(
                "{method} is refused by profile {who}: read_only ({method} {what}; \
                 allow it by name in methods.allow)"
            ));
        }
        Ok(())
    }
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
    /// The environment variables a request's `env_headers` may name
    /// (`NAME`, or `PREFIX*`); `None` when not configured: any variable
    /// but the executor's own credentials without `--profile`, none with
    /// one ([`HttpConfig::header_env_refusal`]).
    pub header_env: Option<Vec<HeaderEnvRule>>,
}

/// Variables a header may never take its value from, whatever the
/// configuration (ASCII case aside): the credentials of the executor and
/// of the Codex exec-server it stands in for (Codex's own list).
pub const PROTECTED_HEADER_ENV: &[&str] = &[
    "CODEX_EXEC_SERVER_NOISE_AUTH_TOKEN",
    "OPENAI_FEDERATION_RULE_ID",
    "OPENAI_IDENTITY_TOKEN_FILE",
    "OPENAI_WORKLOAD_IDENTITY_CONTEXT",
    "OPENAI_API_KEY",
    "CODEX_API_KEY",
    "CODEX_ACCESS_TOKEN",
    "CODEX_CONNECTORS_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AZURE_CLIENT_SECRET",
    "AZURE_FEDERATED_TOKEN_FILE",
    "GOOGLE_APPLICATION_CREDENTIALS",
];

/// One entry of `http.header_env`: a variable (`NAME`, or `PREFIX*`) and,
/// when given, the only destinations (`to`, entries as `http.allow`'s,
/// matched against the URL's host and port) a header valued from it may
/// go to.
#[derive(Debug, Clone)]
pub struct HeaderEnvRule {
    pub var: String,
    pub to: Option<Vec<AllowEntry>>,
}

impl HeaderEnvRule {
    fn names(&self, var: &str) -> bool {
        match self.var.strip_suffix('*') {
            Some(prefix) => var.starts_with(prefix),
            None => self.var == var,
        }
    }

    fn goes_to(&self, url: &url::Url) -> bool {
        let port = url.port_or_known_default().unwrap_or(0);
        match (&self.to, url.host()) {
            (None, _) => true,
            (Some(to), Some(host)) => to.iter().any(|a| a.admits_host(&host, port)),
            (Some(_), None) => false,
        }
    }
}

impl HttpConfig {
    /// Why a header may not take its value from variable `var` under
    /// `profile` on a request to `url`, if it may not.
    pub fn header_env_refusal(
        &self,
        profile: &Profile,
        var: &str,
        url: &url::Url,
    ) -> Option<String> {
        if PROTECTED_HEADER_ENV
            .iter()
            .any(|p| p.eq_ignore_ascii_case(var))
        {
            return Some(format!("{var} is one of the executor's own credentials"));
        }
        let who = profile.name.as_deref().unwrap_or("(default)");
        match &self.header_env {
            Some(list) => {
                let named: Vec<&HeaderEnvRule> = list.iter().filter(|r| r.names(var)).collect();
                if named.is_empty() {
                    return Some(format!("{var} is not in http.header_env of profile {who}"));
                }
                (!named.iter().any(|r| r.goes_to(url))).then(|| {
                    format!(
                        "{var} may not go to {} (http.header_env of profile {who} binds it to its `to` destinations)",
                        crate::destinations::redacted_origin(url)
                    )
                })
            }
            None if profile.name.is_some() => Some(format!(
                "profile {who} names no variable in http.header_env"
            )),
            None => None,
        }
    }
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
    #[serde(default)]
    audit: RawAudit,
    #[serde(default)]
    profiles: std::collections::BTreeMap<String, toml::Spanned<RawProfile>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAudit {
    file: Option<toml::Spanned<PathBuf>>,
    #[serde(default)]
    syslog: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMethods {
    #[serde(default)]
    allow: Vec<toml::Spanned<String>>,
    #[serde(default)]
    deny: Vec<toml::Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    #[serde(default)]
    methods: RawMethods,
    #[serde(default)]
    read_only: bool,
    #[serde(default = "yes")]
    allow_root: bool,
    #[serde(default)]
    workspace_roots: Vec<toml::Spanned<PathBuf>>,
    sandbox: Option<toml::Spanned<SandboxIntent>>,
    limits: Option<toml::Spanned<RawLimits>>,
    http: Option<RawHttp>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    max_frame_bytes: Option<toml::Spanned<u64>>,
    max_requests_in_flight: Option<toml::Spanned<u64>>,
    max_inflight_request_bytes: Option<toml::Spanned<u64>>,
    max_processes: Option<toml::Spanned<u64>>,
    output_buffer_bytes: Option<toml::Spanned<u64>>,
    max_output_chunk_bytes: Option<toml::Spanned<u64>>,
    max_open_files: Option<toml::Spanned<u64>>,
    max_block_bytes: Option<toml::Spanned<u64>>,
    max_read_file_bytes: Option<toml::Spanned<u64>>,
    max_read_credit_bytes: Option<toml::Spanned<u64>>,
    max_read_streams: Option<toml::Spanned<u64>>,
    max_walk_entries: Option<toml::Spanned<u64>>,
    max_walk_response_bytes: Option<toml::Spanned<u64>>,
    max_copy_bytes: Option<toml::Spanned<u64>>,
    max_http_body_bytes: Option<toml::Spanned<u64>>,
    max_http_streams: Option<toml::Spanned<u64>>,
    max_detach_ttl_ms: Option<toml::Spanned<u64>>,
    max_detached_sessions: Option<toml::Spanned<u64>>,
    max_egress_connections: Option<toml::Spanned<u64>>,
    /// `[limits.job]`: every job's limits (docs/PROTOCOL.md §3.1), the
    /// defaults a request may only narrow.
    job: Option<toml::Spanned<executor_protocol::types::process::JobLimits>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    #[serde(default)]
    allow: Vec<toml::Spanned<String>>,
    header_env: Option<Vec<toml::Spanned<RawHeaderEnv>>>,
    extra_ca_file: Option<toml::Spanned<PathBuf>>,
    proxy: Option<toml::Spanned<String>>,
}

/// An `http.header_env` entry: `"NAME"` or `{ env = "NAME", to = [...] }`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawHeaderEnv {
    Name(String),
    Bound(RawHeaderEnvBound),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHeaderEnvBound {
    env: String,
    to: Vec<String>,
}

/// Room in a frame for the envelope around the largest payload.
const FRAME_MARGIN: u64 = 64 * 1024;

impl Config {
    /// Load `explicit` (which must exist), or the default path (which may
    /// be missing: built-in defaults).
    pub fn load(explicit: Option<&Path>, profile: Option<&str>) -> Result<Config, ConfigError> {
        let path = explicit.unwrap_or(Path::new(DEFAULT_PATH));
        match std::fs::read_to_string(path) {
            Ok(text) => Config::parse(path, &text, profile),
            Err(e) if explicit.is_none() && e.kind() == std::io::ErrorKind::NotFound => {
                match profile {
                    None => Ok(Config::default()),
                    Some(name) => Err(ConfigError::Invalid {
                        path: path.to_path_buf(),
                        line: 0,
                        key: format!("profiles.{name}"),
                        message: "no such profile: the file does not exist".into(),
                    }),
                }
            }
            Err(source) => Err(ConfigError::Read {
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    /// Parse and validate a configuration file's text, with `profile`
    /// (which must exist in it) applied.
    pub fn parse(path: &Path, text: &str, profile: Option<&str>) -> Result<Config, ConfigError> {
        let ctx = Ctx { path, text };
        let raw: RawFile = toml::from_str(text).map_err(|e| {
            let key = unknown_key(e.message())
                .or_else(|| e.span().map(|s| key_at(text, s.start)))
                .unwrap_or_else(|| "(file)".into());
            ctx.invalid(e.span(), &key, e.message().trim().to_string())
        })?;
        let mut limits = Limits::default();
        let mut spans = Spans::new();
        if let Some(l) = &raw.limits {
            apply_limits(&ctx, "limits", l, &mut limits, &mut spans)?;
        }
        let mut http = parse_http(&ctx, "http", &raw.http)?;
        if let Some(f) = &raw.audit.file {
            absolute_path(&ctx, "audit.file", f)?;
        }
        let audit = AuditConfig {
            file: raw.audit.file.as_ref().map(|f| f.get_ref().clone()),
            syslog: raw.audit.syslog,
        };
        let mut chosen = Profile::default();
        if let Some(name) = profile {
            let Some(p) = raw.profiles.get(name) else {
                let known: Vec<&str> = raw.profiles.keys().map(String::as_str).collect();
                return Err(ctx.invalid(
                    None,
                    &format!("profiles.{name}"),
                    format!("no such profile (defined: {known:?})"),
                ));
            };
            let key = format!("profiles.{name}");
            let raw_p = p.get_ref();
            check_method_patterns(&ctx, &key, raw_p)?;
            if let Some(sb) = &raw_p.sandbox {
                let has_roots = !raw_p.workspace_roots.is_empty();
                check_sandbox_roots(&ctx, &format!("{key}.sandbox"), sb, has_roots)?;
            }
            let roots = workspace_roots(&ctx, &key, raw_p)?;
            if let Some(l) = &raw_p.limits {
                apply_limits(&ctx, &format!("{key}.limits"), l, &mut limits, &mut spans)?;
            }
            if let Some(h) = &raw_p.http {
                let over = parse_http(&ctx, &format!("{key}.http"), h)?;
                if !h.allow.is_empty() {
                    http.allow = over.allow;
                }
                if h.extra_ca_file.is_some() {
                    http.extra_roots = over.extra_roots;
                }
                if h.proxy.is_some() {
                    http.proxy = over.proxy;
                }
                if h.header_env.is_some() {
                    http.header_env = over.header_env;
                }
            }
            chosen = Profile {
                name: Some(name.to_string()),
                allow: raw_p
                    .methods
                    .allow
                    .iter()
                    .map(|m| m.get_ref().clone())
                    .collect(),
                deny: raw_p
                    .methods
                    .deny
                    .iter()
                    .map(|m| m.get_ref().clone())
                    .collect(),
                read_only: raw_p.read_only,
                allow_root: raw_p.allow_root,
                workspace_roots: roots,
                sandbox: raw_p.sandbox.as_ref().map(|s| s.get_ref().clone()),
                configured_job_limits: Default::default(),
            };
        }
        // What the file set of every job's limits (required caps).
        let set = |name: &str, v: Option<u64>| v.filter(|_| spans.contains_key(name));
        chosen.configured_job_limits = executor_protocol::types::process::JobLimits {
            memory_bytes: set("job.memory_bytes", limits.job.memory_bytes),
            processes: set("job.processes", limits.job.processes),
            cpu_millis_per_sec: set("job.cpu_millis_per_sec", limits.job.cpu_millis_per_sec),
            tmp_bytes: set("job.tmp_bytes", limits.job.tmp_bytes),
            required: None,
        };
        check_frame_fit(&ctx, &limits, &spans, raw.limits.as_ref().map(|l| l.span()))?;
        Ok(Config {
            limits,
            http,
            profile: chosen,
            audit,
        })
    }
}

/// Every `methods.allow` / `methods.deny` pattern of a profile must match
/// a method (a typo would silently allow or deny nothing).
fn check_method_patterns(ctx: &Ctx<'_>, key: &str, raw_p: &RawProfile) -> Result<(), ConfigError> {
    for (list, what) in [
        (&raw_p.methods.allow, "allow"),
        (&raw_p.methods.deny, "deny"),
    ] {
        for (i, m) in list.iter().enumerate() {
            let known = m.get_ref() == "*"
                || methods::ALL_REQUESTS
                    .iter()
                    .any(|k| pattern_matches(m.get_ref(), k));
            if !known {
                return Err(ctx.invalid(
                    Some(m.span()),
                    &format!("{key}.methods.{what}[{i}]"),
                    format!(
                        "{:?} matches no method (see executor --list-methods)",
                        m.get_ref()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A profile's workspace roots, each absolute.
fn workspace_roots(
    ctx: &Ctx<'_>,
    key: &str,
    raw_p: &RawProfile,
) -> Result<Vec<PathBuf>, ConfigError> {
    let mut roots = Vec::new();
    for (i, r) in raw_p.workspace_roots.iter().enumerate() {
        let root = r.get_ref();
        if !root.is_absolute() {
            return Err(ctx.invalid(
                Some(r.span()),
                &format!("{key}.workspace_roots[{i}]"),
                format!("{} is not absolute", root.display()),
            ));
        }
        roots.push(root.clone());
    }
    Ok(roots)
}

/// Where errors point: the file and its text (for line numbers).
struct Ctx<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Ctx<'_> {
    fn invalid(
        &self,
        span: Option<std::ops::Range<usize>>,
        key: &str,
        message: String,
    ) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.to_path_buf(),
            line: span.map_or(0, |s| line_of(self.text, s.start)),
            key: key.to_string(),
            message,
        }
    }
}

/// The span (and full key) of each limit set in the file.
type Spans = std::collections::HashMap<&'static str, (String, std::ops::Range<usize>)>;

fn apply_limits(
    ctx: &Ctx<'_>,
    prefix: &str,
    raw: &toml::Spanned<RawLimits>,
    limits: &mut Limits,
    spans: &mut Spans,
) -> Result<(), ConfigError> {
    let l = raw.get_ref();
    let table: [(&'static str, &Option<toml::Spanned<u64>>, &mut u64); 19] = [
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
        (
            "max_inflight_request_bytes",
            &l.max_inflight_request_bytes,
            &mut limits.max_inflight_request_bytes,
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
            "max_read_credit_bytes",
            &l.max_read_credit_bytes,
            &mut limits.max_read_credit_bytes,
        ),
        (
            "max_read_streams",
            &l.max_read_streams,
            &mut limits.max_read_streams,
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
            "max_copy_bytes",
            &l.max_copy_bytes,
            &mut limits.max_copy_bytes,
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
        (
            "max_detached_sessions",
            &l.max_detached_sessions,
            &mut limits.max_detached_sessions,
        ),
        (
            "max_egress_connections",
            &l.max_egress_connections,
            &mut limits.max_egress_connections,
        ),
    ];
    for (name, value, slot) in table {
        if let Some(v) = value {
            let key = format!("{prefix}.{name}");
            if *v.get_ref() == 0 {
                return Err(ctx.invalid(Some(v.span()), &key, "must be at least 1".into()));
            }
            *slot = *v.get_ref();
            spans.insert(name, (key, v.span()));
        }
    }
    if let Some(job) = &l.job {
        let j = job.get_ref();
        let key = format!("{prefix}.job");
        if j.required.is_some() {
            return Err(ctx.invalid(
                Some(job.span()),
                &format!("{key}.required"),
                "is a request's choice; a profile's limits are always required".into(),
            ));
        }
        for (name, spanned, v) in [
            ("memory_bytes", "job.memory_bytes", j.memory_bytes),
            ("processes", "job.processes", j.processes),
            (
                "cpu_millis_per_sec",
                "job.cpu_millis_per_sec",
                j.cpu_millis_per_sec,
            ),
            ("tmp_bytes", "job.tmp_bytes", j.tmp_bytes),
        ] {
            if v == Some(0) {
                return Err(ctx.invalid(
                    Some(job.span()),
                    &format!("{key}.{name}"),
                    "must be at least 1".into(),
                ));
            }
            if v.is_some() {
                spans.insert(spanned, (format!("{key}.{name}"), job.span()));
            }
        }
        let set = &mut limits.job;
        set.memory_bytes = j.memory_bytes.or(set.memory_bytes);
        set.processes = j.processes.or(set.processes);
        set.cpu_millis_per_sec = j.cpu_millis_per_sec.or(set.cpu_millis_per_sec);
        set.tmp_bytes = j.tmp_bytes.or(set.tmp_bytes);
    }
    Ok(())
}

/// Payloads answered in one frame must fit one frame with room for the
/// envelope.
fn check_frame_fit(
    ctx: &Ctx<'_>,
    limits: &Limits,
    spans: &Spans,
    section: Option<std::ops::Range<usize>>,
) -> Result<(), ConfigError> {
    let at = |name: &str| {
        spans
            .get(name)
            .cloned()
            .unwrap_or_else(|| (format!("limits.{name}"), section.clone().unwrap_or(0..0)))
    };
    // The default buffer of every job: past the most a request may ask
    // for, every process/start would be refused.
    let max_buffer = executor_protocol::limits::MAX_OUTPUT_BUFFER_BYTES;
    if limits.output_buffer_bytes > max_buffer {
        let (key, span) = at("output_buffer_bytes");
        return Err(ctx.invalid(
            Some(span),
            &key,
            format!(
                "{} is above the most a process may buffer ({max_buffer})",
                limits.output_buffer_bytes
            ),
        ));
    }
    let frame = limits.max_frame_bytes;
    if frame < 2 * FRAME_MARGIN {
        let (key, span) = at("max_frame_bytes");
        return Err(ctx.invalid(
            Some(span),
            &key,
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
            let message = if spans.contains_key(name) {
                format!("{value} does not fit one frame (max_frame_bytes {frame} less {FRAME_MARGIN} for the envelope)")
            } else {
                format!("{frame} leaves no room for {name} {value} (and {FRAME_MARGIN} for the envelope)")
            };
            let (key, span) = if spans.contains_key(name) {
                at(name)
            } else {
                at("max_frame_bytes")
            };
            return Err(ctx.invalid(Some(span), &key, message));
        }
    }
    Ok(())
}

fn parse_http(ctx: &Ctx<'_>, prefix: &str, raw: &RawHttp) -> Result<HttpConfig, ConfigError> {
    let mut http = HttpConfig::default();
    for (i, entry) in raw.allow.iter().enumerate() {
        let parsed = AllowEntry::parse(entry.get_ref()).map_err(|e: ParseAllowError| {
            ctx.invalid(
                Some(entry.span()),
                &format!("{prefix}.allow[{i}]"),
                e.to_string(),
            )
        })?;
        http.allow.push(parsed);
    }
    if let Some(file) = &raw.extra_ca_file {
        absolute_path(ctx, &format!("{prefix}.extra_ca_file"), file)?;
        http.extra_roots = load_pem_roots(file.get_ref()).map_err(|message| {
            ctx.invalid(
                Some(file.span()),
                &format!("{prefix}.extra_ca_file"),
                message,
            )
        })?;
    }
    if let Some(proxy) = &raw.proxy {
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
            .map_err(|message| {
                ctx.invalid(Some(proxy.span()), &format!("{prefix}.proxy"), message)
            })?;
        http.proxy = Some(url);
    }
    if let Some(list) = &raw.header_env {
        let mut rules = Vec::new();
        for (i, v) in list.iter().enumerate() {
            let key = format!("{prefix}.header_env[{i}]");
            let (name, to) = match v.get_ref() {
                RawHeaderEnv::Name(n) => (n.clone(), None),
                RawHeaderEnv::Bound(RawHeaderEnvBound { env, to }) => {
                    if to.is_empty() {
                        return Err(ctx.invalid(
                            Some(v.span()),
                            &format!("{key}.to"),
                            "empty: name the destinations, or give the variable's name alone for any".into(),
                        ));
                    }
                    let mut entries = Vec::new();
                    for t in to {
                        entries.push(AllowEntry::parse(t).map_err(|e: ParseAllowError| {
                            ctx.invalid(Some(v.span()), &format!("{key}.to"), e.to_string())
                        })?);
                    }
                    (env.clone(), Some(entries))
                }
            };
            let stem = name.strip_suffix('*').unwrap_or(&name);
            let valid = stem.bytes().enumerate().all(|(j, b)| {
                b == b'_' || b.is_ascii_alphabetic() || (j > 0 && b.is_ascii_digit())
            }) && !name.is_empty()
                && name != "*";
            if !valid {
                return Err(ctx.invalid(
                    Some(v.span()),
                    &key,
                    format!("{name:?} is not a variable name (letters, digits, `_`; a trailing `*` for a prefix)"),
                ));
            }
            rules.push(HeaderEnvRule { var: name, to });
        }
        http.header_env = Some(rules);
    }
    Ok(http)
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

/// A profile's sandbox roots are absolute paths or symbols: a relative
/// root is refused at load, naming its key and line (inside the inline
/// table, found by its quoted text).
/// A configured file must be named by an absolute path: a relative one
/// would depend on the directory the agent was started in (`$HOME` under
/// sshd).
fn absolute_path(
    ctx: &Ctx<'_>,
    key: &str,
    path: &toml::Spanned<PathBuf>,
) -> Result<(), ConfigError> {
    if path.get_ref().is_absolute() {
        return Ok(());
    }
    Err(ctx.invalid(
        Some(path.span()),
        key,
        format!("{} is not absolute", path.get_ref().display()),
    ))
}

fn check_sandbox_roots(
    ctx: &Ctx<'_>,
    key: &str,
    sb: &toml::Spanned<SandboxIntent>,
    has_workspace_roots: bool,
) -> Result<(), ConfigError> {
    use executor_protocol::types::sandbox::ReadRoots;
    if sb.get_ref().workspace_roots.is_some() {
        let span = sb.span();
        let at = ctx.text[span.clone()]
            .find("workspace_roots")
            .map_or(span.start, |o| span.start + o);
        return Err(ctx.invalid(
            Some(at..at),
            &format!("{key}.workspace_roots"),
            "a profile's workspace roots are the profile's own `workspace_roots` key, \
             not a key of its sandbox"
                .to_string(),
        ));
    }
    let fs = &sb.get_ref().filesystem;
    let read: &[_] = match &fs.read {
        ReadRoots::All => &[],
        ReadRoots::Paths(p) => p,
    };
    for (list, name) in [
        (read, "read"),
        (&fs.write[..], "write"),
        (&fs.deny_read[..], "deny_read"),
        (&fs.deny_write[..], "deny_write"),
    ] {
        for (i, root) in list.iter().enumerate() {
            // A profile's roots never depend on a request: `:cwd` (and
            // `:workspace_roots` without `workspace_roots`, which means
            // the cwd) would be the request's cwd, so the client would
            // choose the roots the profile imposes.
            use executor_sandbox::policy::{parse_entry, Symbol};
            let why = match parse_entry(root) {
                Err(None) => format!(
                    "is not absolute and not a symbol ({})",
                    executor_sandbox::policy::SYMBOLS.join(", ")
                ),
                Err(Some(why)) => why,
                Ok(e) if e.symbol == Symbol::Cwd => {
                    "would be each request's cwd: a profile's roots must not depend on a request \
                 (name the directory, or use :workspace_roots with workspace_roots set)"
                        .to_string()
                }
                Ok(e) if matches!(e.symbol, Symbol::WorkspaceRoots(_)) && !has_workspace_roots => {
                    "without workspace_roots would be each request's cwd: a profile's roots must \
                     not depend on a request (set workspace_roots in this profile)"
                        .to_string()
                }
                Ok(_) => continue,
            };
            let shown = root.display();
            let span = sb.span();
            let at = ctx.text[span.clone()]
                .find(&format!("\"{shown}\""))
                .or_else(|| ctx.text[span.clone()].find(&format!("'{shown}'")))
                .map_or(span.start, |o| span.start + o);
            return Err(ctx.invalid(
                Some(at..at),
                &format!("{key}.filesystem.{name}[{i}]"),
                format!("{shown:?} {why}"),
            ));
        }
    }
    Ok(())
}

/// The dotted key a byte offset of the file is the value of: the
/// `[table]` header above it and the `key =` of its line (or of the
/// nearest line above with one, for a value spread over lines).
fn key_at(text: &str, offset: usize) -> String {
    let before = &text[..offset.min(text.len())];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[line_start..]
        .find('\n')
        .map_or(text.len(), |i| line_start + i);
    let mut key = None;
    let mut table = None;
    let lines: Vec<&str> = text[..line_end].lines().collect();
    for line in lines.iter().rev() {
        let t = line.trim();
        if t.starts_with('[') {
            table = Some(t.trim_matches(|c| c == '[' || c == ']').trim().to_string());
            break;
        }
        if key.is_none() {
            if let Some((k, _)) = t.split_once('=') {
                if !t.starts_with('#') {
                    key = Some(k.trim().trim_matches('"').to_string());
                }
            }
        }
    }
    match (table, key) {
        (Some(t), Some(k)) => format!("{t}.{k}"),
        (None, Some(k)) => k,
        (Some(t), None) => t,
        (None, None) => "(top level)".into(),
    }
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
        Config::parse(Path::new("/etc/executor/config.toml"), text, None)
    }

    #[test]
    fn header_env_names_variables_or_prefixes() {
        let u = |s: &str| url::Url::parse(s).unwrap();
        let any = u("https://example.test/");
        let c = parse("[http]\nheader_env = [\"GITHUB_TOKEN\", \"MCP_*\"]\n").unwrap();
        let anyone = Profile::default();
        assert_eq!(
            c.http.header_env_refusal(&anyone, "GITHUB_TOKEN", &any),
            None
        );
        assert_eq!(c.http.header_env_refusal(&anyone, "MCP_X", &any), None);
        assert!(c.http.header_env_refusal(&anyone, "HOME", &any).is_some());
        // The credentials, whatever a prefix says.
        let c = parse("[http]\nheader_env = [\"AWS_*\"]\n").unwrap();
        assert!(c
            .http
            .header_env_refusal(&anyone, "aws_secret_access_key", &any)
            .is_some());
        // Unset: any without a profile, none under one.
        let c = parse("[profiles.p]\n").unwrap();
        assert_eq!(c.http.header_env_refusal(&anyone, "HOME", &any), None);
        let c = Config::parse(Path::new("/c.toml"), "[profiles.p]\n", Some("p")).unwrap();
        assert!(c
            .http
            .header_env_refusal(&c.profile, "HOME", &any)
            .is_some());
        // Bound to destinations: only there (host and port, as http.allow).
        let c = parse(
            "[http]\nheader_env = [{ env = \"GH\", to = [\"api.github.com:443\", \"*.corp\", \"10.0.0.0/8\"] }]\n",
        )
        .unwrap();
        for ok in [
            "https://api.github.com/x",
            "http://a.corp:8080/",
            "http://10.1.2.3/",
        ] {
            assert_eq!(
                c.http.header_env_refusal(&anyone, "GH", &u(ok)),
                None,
                "{ok}"
            );
        }
        for no in [
            "http://api.github.com/x",
            "https://evil.test/",
            "https://corp/",
            "http://127.0.0.1/",
        ] {
            let why = c.http.header_env_refusal(&anyone, "GH", &u(no)).unwrap();
            assert!(why.contains("may not go to"), "{no}: {why}");
        }
        for bad in ["1X", "A-B", "*", "", "A*B"] {
            let e = parse(&format!("[http]\nheader_env = [\"ok\", {bad:?}]\n")).unwrap_err();
            assert!(
                e.to_string().contains(":2: http.header_env[1]: "),
                "{bad}: {e}"
            );
        }
        let e = parse("[http]\nheader_env = [{ env = \"X\", to = [\"no pe\"] }]\n").unwrap_err();
        assert!(e.to_string().contains("http.header_env[0].to"), "{e}");
        for bad in ["to = [], ", "to = [\"a.b\"], extra = 1, "] {
            let e = parse(&format!("[http]\nheader_env = [{{ {bad}env = \"X\" }}]\n")).unwrap_err();
            assert!(e.to_string().contains("header_env"), "{bad}: {e}");
        }
    }

    #[test]
    fn empty_file_is_the_defaults() {
        let c = parse("").unwrap();
        assert_eq!(c.limits, Limits::default());
        assert!(c.http.allow.is_empty() && c.http.proxy.is_none());
    }

    #[test]
    fn limits_override_and_are_checked_against_the_frame() {
        let c = parse("[limits]\nmax_processes = 7\nmax_detached_sessions = 2\n").unwrap();
        assert_eq!(c.limits.max_processes, 7);
        assert_eq!(c.limits.max_detached_sessions, 2);
        assert_eq!(Limits::default().max_detached_sessions, 64);
        let e = parse("[limits]\n\nmax_http_body_bytes = 999999999\n").unwrap_err();
        let shown = e.to_string();
        assert!(
            shown.starts_with("/etc/executor/config.toml:3: limits.max_http_body_bytes: 999999999"),
            "{shown}"
        );
        let e = parse("[limits]\noutput_buffer_bytes = 67108865\n").unwrap_err();
        assert!(
            e.to_string()
                .contains(":2: limits.output_buffer_bytes: 67108865 is above"),
            "{e}"
        );
        let e = parse("[limits]\nmax_open_files = 0\n").unwrap_err();
        assert!(
            e.to_string()
                .contains(":2: limits.max_open_files: must be at least 1"),
            "{e}"
        );
    }

    #[test]
    fn a_relative_audit_file_or_ca_file_is_refused_naming_its_key() {
        let e = parse("[audit]\nfile = \"audit.jsonl\"\n").unwrap_err();
        assert!(
            e.to_string()
                .contains(":2: audit.file: audit.jsonl is not absolute"),
            "{e}"
        );
        let e = parse("[http]\nextra_ca_file = \"ca.pem\"\n").unwrap_err();
        assert!(
            e.to_string()
                .contains("http.extra_ca_file: ca.pem is not absolute"),
            "{e}"
        );
    }

    #[test]
    fn a_profile_intent_takes_the_new_symbols_but_not_request_roots() {
        let ok = Config::parse(
            Path::new("c.toml"),
            "[profiles.ci]\nworkspace_roots = [\"/srv\"]\nsandbox = { filesystem = { read = [\":minimal\", \"?/opt/tool\", \":workspace_roots\"], write = [\":workspace_roots/out\"] } }\n",
            Some("ci"),
        );
        assert!(ok.is_ok(), "{:?}", ok.err());
        for (toml, why) in [
            (
                "[profiles.ci]\nsandbox = { filesystem = { write = [\"?:workspace_roots/out\"] } }\n",
                "without workspace_roots",
            ),
            (
                "[profiles.ci]\nsandbox = { filesystem = { write = [\"?:cwd\"] } }\n",
                "each request's cwd",
            ),
            (
                "[profiles.ci]\nworkspace_roots = [\"/srv\"]\nsandbox = { filesystem = { write = [\":workspace_roots/../etc\"] } }\n",
                "plain names",
            ),
            (
                "[profiles.ci]\nsandbox = { workspace_roots = [\"/srv\"], filesystem = { write = [\"/srv\"] } }\n",
                "profiles.ci.sandbox.workspace_roots",
            ),
        ] {
            let e = Config::parse(Path::new("c.toml"), toml, Some("ci")).unwrap_err();
            assert!(e.to_string().contains(why), "{toml}: {e}");
        }
    }

    #[test]
    fn a_bad_type_or_a_relative_sandbox_root_names_its_key() {
        let e = parse("[profiles.a]\nallow_root = \"yes\"\n").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("/etc/executor/config.toml:2: profiles.a.allow_root: invalid type"),
            "{e}"
        );
        let e = Config::parse(
            Path::new("c.toml"),
            "[profiles.ci]\nsandbox = { filesystem = { write = [\n  \"/srv\",\n  \"build/out\",\n] } }\n",
            Some("ci"),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "c.toml:4: profiles.ci.sandbox.filesystem.write[1]: \"build/out\" is not absolute and not a symbol (:cwd, :workspace_roots, :tmp, :home, :minimal)"
        );
        let ok = Config::parse(
            Path::new("c.toml"),
            "[profiles.ci]\nsandbox = { filesystem = { read = [\":home\", \"/usr\"], write = [\":tmp\"] } }\n",
            Some("ci"),
        );
        assert!(ok.is_ok(), "{ok:?}");
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
        let e = parse("[limits]\nmax_detached_session = 2\n").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("/etc/executor/config.toml:2: max_detached_session: unknown field"),
            "{e}"
        );
        let e = parse("[limits]\nmax_processes = \"many\"\n").unwrap_err();
        assert!(e.to_string().contains(":2: "), "{e}");
    }

    #[test]
    fn profiles_select_methods_read_only_and_overrides() {
        let text = r#"
[limits]
max_processes = 50

[profiles.reader]
methods.allow = ["fs/*", "environment/info", "process/start"]
methods.deny = ["fs/remove"]
read_only = true
allow_root = false
workspace_roots = ["/srv"]
sandbox = { filesystem = { write = [":workspace_roots"] }, network = { allow_tcp_connect = [443] } }
limits.max_open_files = 9
"#;
        let path = Path::new("/c.toml");
        let base = Config::parse(path, text, None).unwrap();
        assert_eq!(base.profile.name, None);
        assert!(base.profile.check("fs/remove").is_ok());
        let c = Config::parse(path, text, Some("reader")).unwrap();
        assert_eq!((c.limits.max_processes, c.limits.max_open_files), (50, 9));
        assert!(!c.profile.allow_root);
        assert_eq!(c.profile.workspace_roots, [PathBuf::from("/srv")]);
        let intent = c.profile.sandbox.clone().unwrap();
        assert_eq!(
            intent.network,
            executor_protocol::types::sandbox::NetworkIntent::AllowTcpConnect(vec![443])
        );
        let p = &c.profile;
        assert!(p.check("fs/readFile").is_ok());
        assert!(p.check("environment/info").is_ok());
        // Named in methods.allow: allowed despite read_only.
        assert!(p.check("process/start").is_ok());
        let e = p.check("fs/remove").unwrap_err();
        assert!(e.contains("methods.deny"), "{e}");
        let e = p.check("fs/writeFile").unwrap_err();
        assert!(e.contains("read_only"), "{e}");
        let e = p.check("http/request").unwrap_err();
        assert!(e.contains("not in methods.allow"), "{e}");
        let e = Config::parse(path, text, Some("writer")).unwrap_err();
        assert!(
            e.to_string().contains("profiles.writer: no such profile"),
            "{e}"
        );
        let e = Config::parse(
            path,
            "[profiles.x]\nmethods.allow = [\"fs/nope\"]\n",
            Some("x"),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains(":2: profiles.x.methods.allow[0]"),
            "{e}"
        );
    }

    /// Issue 29.1: `read_only` allowed fs/createSymlink (a hand-kept
    /// deny-list missed it). It is now the table's allow-list: exactly
    /// the methods marked read-only pass, every other is refused naming
    /// the method and the rule, unless `methods.allow` names it exactly.
    #[test]
    fn read_only_allows_exactly_the_tables_read_only_methods() {
        let path = Path::new("/c.toml");
        let c = Config::parse(path, "[profiles.ro]\nread_only = true\n", Some("ro")).unwrap();
        for (m, facts) in methods::REQUEST_FACTS {
            match c.profile.check(m) {
                Ok(()) => assert!(facts.is_read_only(), "{m} allowed under read_only"),
                Err(e) => {
                    assert!(!facts.is_read_only(), "{m} refused: {e}");
                    assert!(e.contains(m) && e.contains("read_only"), "{e}");
                }
            }
        }
        let e = c.profile.check(methods::FS_CREATE_SYMLINK).unwrap_err();
        assert!(e.contains("changes the host"), "{e}");
        let e = c.profile.check(methods::HTTP_REQUEST).unwrap_err();
        assert!(e.contains("reaches the network"), "{e}");
        // Named exactly: allowed; a family pattern does not lift read_only.
        let c = Config::parse(
            path,
            "[profiles.ro]\nread_only = true\nmethods.allow = [\"http/request\", \"fs/*\"]\n",
            Some("ro"),
        )
        .unwrap();
        assert!(c.profile.check(methods::HTTP_REQUEST).is_ok());
        assert!(c.profile.check(methods::FS_READ_FILE).is_ok());
        assert!(c.profile.check(methods::FS_CREATE_SYMLINK).is_err());
    }

    /// Review of issue 29.1 (aliases): `exec_command` starts a job as
    /// `process/start` does and `write_stdin` writes to one as
    /// `process/write` does, but a profile denying `process/*` (or
    /// `process/start` by name) still let a key start jobs through
    /// `exec_command`. A deny rule now reaches a method's aliases (the
    /// table's facts); an allow rule does not widen through them.
    #[test]
    fn a_deny_rule_reaches_the_aliases_of_what_it_denies() {
        let path = Path::new("/c.toml");
        for deny in ["process/*", "process/start"] {
            let text = format!("[profiles.p]\nmethods.deny = [{deny:?}]\n");
            let c = Config::parse(path, &text, Some("p")).unwrap();
            let e = c.profile.check(methods::EXEC_COMMAND).unwrap_err();
            assert!(
                e.contains("exec_command") && e.contains(deny),
                "{deny}: {e}"
            );
            assert!(c.profile.check(methods::PROCESS_LIST).is_ok() || deny == "process/*");
        }
        let c = Config::parse(
            path,
            "[profiles.p]\nmethods.deny = [\"process/write\"]\n",
            Some("p"),
        )
        .unwrap();
        assert!(c.profile.check(methods::WRITE_STDIN).is_err());
        // Control: other denials leave it alone, and allow does not widen.
        let c =
            Config::parse(path, "[profiles.p]\nmethods.deny = [\"fs/*\"]\n", Some("p")).unwrap();
        assert!(c.profile.check(methods::EXEC_COMMAND).is_ok());
        let c = Config::parse(
            path,
            "[profiles.p]\nmethods.allow = [\"process/*\"]\n",
            Some("p"),
        )
        .unwrap();
        assert!(c.profile.check(methods::PROCESS_START).is_ok());
        assert!(c.profile.check(methods::EXEC_COMMAND).is_err());
    }

    /// Issue 29.4: a profile intent whose roots would come from the
    /// request's cwd is refused at load, naming the key.
    #[test]
    fn a_profile_intent_needing_a_request_cwd_is_refused() {
        let path = Path::new("/c.toml");
        for (intent, key) in [
            (
                "write = [\":cwd\"]",
                "profiles.p.sandbox.filesystem.write[0]",
            ),
            (
                "write = [\":workspace_roots\"]",
                "profiles.p.sandbox.filesystem.write[0]",
            ),
            (
                "deny_write = [\"/a\", \":cwd\"]",
                "profiles.p.sandbox.filesystem.deny_write[1]",
            ),
        ] {
            let text = format!("[profiles.p]\nsandbox = {{ filesystem = {{ {intent} }} }}\n");
            let e = Config::parse(path, &text, Some("p"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!(":2: {key}: ")), "{intent}: {e}");
            assert!(e.contains("must not depend on a request"), "{e}");
        }
        let ok = "[profiles.p]\nworkspace_roots = [\"/srv\"]\n\
                  sandbox = { filesystem = { write = [\":workspace_roots\", \":tmp\"], deny_read = [\":home\"] } }\n";
        Config::parse(path, ok, Some("p")).unwrap();
    }

    #[test]
    fn the_packaged_example_parses_as_is_and_with_its_settings_uncommented() {
        let text = include_str!("../../packaging/config.toml");
        let c = Config::parse(Path::new("packaging/config.toml"), text, None).unwrap();
        assert_eq!(
            c.limits,
            Limits::default(),
            "all commented out: the defaults"
        );
        // `# key = value` lines are settings, `##` lines prose.
        let active: Vec<&str> = text
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                Some(setting) => setting,
                None => l,
            })
            .collect();
        let active = active.join("\n");
        for profile in [None, Some("ci"), Some("readonly")] {
            let c = Config::parse(Path::new("uncommented"), &active, profile)
                .unwrap_or_else(|e| panic!("{profile:?}: {e}"));
            assert_eq!(c.limits.max_http_streams, 16);
            assert_eq!(c.limits.max_detached_sessions, 8);
        }
        let ci = Config::parse(Path::new("uncommented"), &active, Some("ci")).unwrap();
        assert!(ci.profile.sandbox.is_some() && !ci.profile.allow_root);
        assert_eq!(ci.limits.max_processes, 64);
    }

    #[test]
    fn a_missing_explicit_file_is_an_error_and_a_missing_default_is_not() {
        let e = Config::load(Some(Path::new("/nonexistent/executor.toml")), None).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("/nonexistent/executor.toml: cannot read"),
            "{e}"
        );
    }
}
