//! Codex's sandbox requests as a native [`SandboxIntent`]: the `sandbox`
//! of `process/start` and `fs/*` (Codex's `FileSystemSandboxContext`, as
//! Codex 0.171.0 sends it: tests/fixtures/codex/) with `process/start`'s
//! `enforceManagedNetwork`, `managedNetwork` and `networkProxy`. The
//! intent then goes through the native gate like any other, so a
//! read-only Explorer role is read-only on the remote host.
//!
//! Pure but for two things: a `glob_pattern` deny entry is expanded by a
//! bounded scan of the filesystem (as the reference snapshots glob matches
//! before its sandbox starts), and a writable root's `.git` file is read
//! for the repository it names. Depends on the protocol's intent types and
//! `serde_json`.
//!
//! The mapping (never weaker than asked; what cannot be expressed is
//! [`Untranslatable`]):
//!
//! | Codex | intent |
//! | --- | --- |
//! | `sandbox: null`, `permissions.type: disabled` | none (with `enforceManagedNetwork` or an enabled `networkProxy`: read all, write `/`, the managed network) |
//! | `external {network}` | read all, write `/`, the network: what the reference itself grants for it |
//! | `managed`, `file_system: unrestricted` | read all, write `/` |
//! | `special root` read / write / deny | read `"all"` / write `/` / nothing readable but other entries |
//! | `special minimal` read (or write: Codex reads it only) | read `:minimal` |
//! | `special project_roots {subpath?}` | `:workspace_roots[/SUBPATH]`, `workspace_roots` from the sandbox's `workspaceRoots` (none: the entry grants nothing) |
//! | `special current_working_directory` | the sandbox's `cwd` (else the request's) |
//! | `special tmpdir` | the job's `$TMPDIR` ([`Host::tmpdir`]; unset: nothing), as the reference resolves it |
//! | `special slash_tmp` | `/tmp` (the host's, shared, as the reference grants it) |
//! | `special unknown` | a grant: nothing (as the reference ignores it); a deny: refused |
//! | `path {URI}` | the path |
//! | access `read` / `write` / `deny` (`none`) | read root / write root / `deny_read` |
//! | a `read` entry below a `write` one | also `deny_write` of each place (the more specific entry wins, as in Codex; a `write` of the same place wins over it) |
//! | every `write` place but the root, `tmpdir` and `slash_tmp` | also `deny_write` of its `.git`, `.agents`, `.codex` ([`PROTECTED_METADATA`]), existing or not, unless a `write` entry names that place (as Codex protects them under writable roots; not in the shared temporary directories, where any local user could plant one that refuses every job); for a `.git` *file*, also the repository it names and that repository's `commondir` ([`git_pointer_dirs`], read when the request is translated) |
//! | `glob_pattern` deny | `deny_read` of each match when the request is translated (as the reference snapshots them), scanned to `glob_scan_max_depth` or, without it, as deep as the scan budget ([`MAX_GLOB_SCAN`] entries, [`MAX_GLOB_MATCHES`] matches) allows: beyond it, refused |
//! | `glob_pattern` read / write | refused |
//! | `missing_path_behavior` | every grant is `?ROOT` (skipped when missing, as the reference runs with a missing path) |
//! | `network: restricted` / `enabled` | `deny` / `allow` |
//! | `enforceManagedNetwork` without an expressible `networkProxy` | `deny` (fail closed) |
//! | `networkProxy.proxy.domains` allow entries | `allow_hosts` (`a.b` → `a.b`, `*.a.b` → `*.a.b`, `**.a.b` → both); `policyDecisionTimeoutMs` → `ask` |
//!
//! Refused (each naming its field): `mode: limited`, `enableSocks5Udp`,
//! `allowUpstreamProxy`, unix socket permissions, `allowLocalBinding`, a
//! domain pattern other than those forms, a deny entry that an allow
//! pattern could match; an unknown key anywhere in the sandbox (the
//! reference ignores them; an unknown key could carry a restriction).

use executor_protocol::types::sandbox::{
    EgressIntent, FilesystemIntent, NetworkIntent, ReadRoots, SandboxIntent, MAX_ASK_TIMEOUT_MS,
};
use executor_protocol::WirePath;
use serde_json::{Map, Value};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};

/// JSON-RPC "invalid params": how the reference answers a sandbox it cannot
/// parse (`unknown variant ...`, `missing field ...`, `invalid URI: ...`),
/// and how a sandbox this translation cannot express is answered.
pub const INVALID_PARAMS: i64 = -32602;

/// Names Codex keeps read-only directly under every writable root (its
/// own list): what they hold runs later with more authority than the job
/// (`.git/hooks`, `.git/config`'s `core.fsmonitor`, the agents' own rules
/// and skills).
pub const PROTECTED_METADATA: [&str; 3] = [".git", ".agents", ".codex"];

/// At most this many glob matches become carve-outs.
pub const MAX_GLOB_MATCHES: usize = 4096;
/// At most this many directory entries are examined expanding globs.
pub const MAX_GLOB_SCAN: usize = 100_000;

/// Why a Codex sandbox has no native intent; answered as
/// [`INVALID_PARAMS`] with [`Untranslatable::message`], nothing runs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Untranslatable {
    /// The offending field, dotted from the request's params
    /// (`sandbox.permissions.file_system.entries.2.access`).
    pub field: String,
    /// What the dialect answers: the reference's own words for what it
    /// refuses too (`unknown variant `x`, expected ...`), else
    /// `unsupported sandbox: FIELD: WHY`.
    pub message: String,
}

impl Untranslatable {
    /// The JSON-RPC error code ([`INVALID_PARAMS`]).
    pub fn code(&self) -> i64 {
        INVALID_PARAMS
    }

    fn reference(field: &str, message: impl Into<String>) -> Self {
        Untranslatable {
            field: field.into(),
            message: message.into(),
        }
    }

    fn unsupported(field: &str, why: impl std::fmt::Display) -> Self {
        Untranslatable {
            field: field.into(),
            message: format!("unsupported sandbox: {field}: {why}"),
        }
    }
}

/// The network half of a `process/start` (`fs/*` have none: pass
/// [`NetworkRequest::default`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct NetworkRequest<'a> {
    /// `enforceManagedNetwork`.
    pub enforce_managed: bool,
    /// `networkProxy` (a `RemoteNetworkProxyLaunchConfig`), if not null.
    pub proxy: Option<&'a Value>,
    /// `managedNetwork` (an existing proxy's loopback ports), if not null.
    pub managed: Option<&'a Value>,
}

/// What the request's context contributes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Host<'a> {
    /// The `TMPDIR` of the job's environment (after `envPolicy`, `env`):
    /// what a `tmpdir` entry means (the reference resolves it so; the
    /// sandbox's `temporaryDirectories` grant nothing there). `None`: the
    /// entry grants nothing. For `fs/*`, the agent's own.
    pub tmpdir: Option<&'a Path>,
}

type R<T> = Result<T, Untranslatable>;

/// Translate `sandbox` (the request's `sandbox` param, `null` included)
/// for a request whose cwd is `cwd`: `None` for no sandbox (the profile's,
/// if any, still applies), or the intent to enforce.
pub fn translate(
    sandbox: &Value,
    network: NetworkRequest<'_>,
    cwd: &Path,
    host: Host<'_>,
) -> R<Option<SandboxIntent>> {
    let unrestricted = |net: NetworkIntent| SandboxIntent {
        filesystem: FilesystemIntent {
            read: ReadRoots::All,
            write: vec!["/".into()],
            ..Default::default()
        },
        network: net,
        ..Default::default()
    };
    // No filesystem sandbox: none at all, unless the network is managed
    // (`enforceManagedNetwork`, or an enabled `networkProxy` whose rules
    // the job's network is to follow).
    let unconfined = |network: NetworkRequest<'_>| -> R<Option<SandboxIntent>> {
        let net = managed_network(network, true)?;
        let managed = network.enforce_managed || matches!(net, NetworkIntent::AllowHosts(_));
        Ok(managed.then(|| unrestricted(net)))
    };
    if sandbox.is_null() {
        return unconfined(network);
    }
    let top = object(sandbox, "sandbox")?;
    known_keys(
        top,
        "sandbox",
        &[
            "permissions",
            "cwd",
            "workspaceRoots",
            "policyContext",
            "userHomeDir",
            "temporaryDirectories",
            "windowsSandboxLevel",
            "windowsSandboxPrivateDesktop",
            "windowsSandboxProxySettingsMode",
            "useLegacyLandlock",
        ],
    )?;
    let permissions = required(top, "permissions", "sandbox")?;
    let perms = object(permissions, "sandbox.permissions")?;
    let kind = tag(perms, "type", "sandbox.permissions")?;
    let cwd = match top.get("cwd").filter(|v| !v.is_null()) {
        Some(c) => file_uri(c, "sandbox.cwd")?,
        None => cwd.to_path_buf(),
    };
    let roots = workspace_roots(top)?;
    match kind {
        "disabled" => {
            known_keys(perms, "sandbox.permissions", &["type"])?;
            unconfined(network)
        }
        "external" => {
            known_keys(perms, "sandbox.permissions", &["type", "network"])?;
            let open = network_flag(perms)?;
            Ok(Some(unrestricted(managed_network(network, open)?)))
        }
        "managed" => {
            known_keys(
                perms,
                "sandbox.permissions",
                &["type", "file_system", "network"],
            )?;
            let open = network_flag(perms)?;
            let net = managed_network(network, open)?;
            let fs = required(perms, "file_system", "sandbox.permissions")?;
            let fs_map = object(fs, "sandbox.permissions.file_system")?;
            match tag(fs_map, "type", "sandbox.permissions.file_system")? {
                "unrestricted" => {
                    known_keys(fs_map, "sandbox.permissions.file_system", &["type"])?;
                    Ok(Some(unrestricted(net)))
                }
                "restricted" => {
                    let filesystem = restricted(fs_map, top, &cwd, &roots, host)?;
                    Ok(Some(SandboxIntent {
                        filesystem,
                        network: net,
                        required: true,
                        workspace_roots: (!roots.is_empty())
                            .then(|| roots.iter().map(|r| wire(r)).collect()),
                    }))
                }
                other => Err(Untranslatable::reference(
                    "sandbox.permissions.file_system.type",
                    format!("unknown variant `{other}`, expected `restricted` or `unrestricted`"),
                )),
            }
        }
        other => Err(Untranslatable::reference(
            "sandbox.permissions.type",
            format!("unknown variant `{other}`, expected one of `managed`, `disabled`, `external`"),
        )),
    }
}

fn wire(p: &Path) -> WirePath {
    WirePath::from_bytes(p.as_os_str().as_bytes())
}

fn optional(p: &Path) -> WirePath {
    if p == Path::new("/") {
        return "/".into();
    }
    let mut b = b"?".to_vec();
    b.extend_from_slice(p.as_os_str().as_bytes());
    WirePath::from_bytes(b)
}

fn object<'a>(v: &'a Value, field: &str) -> R<&'a Map<String, Value>> {
    v.as_object().ok_or_else(|| {
        Untranslatable::reference(
            field,
            format!("invalid type: {}, expected a map", kind_of(v)),
        )
    })
}

fn kind_of(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("boolean `{b}`"),
        Value::Number(n) => format!("integer `{n}`"),
        Value::String(s) => format!("string {s:?}"),
        Value::Array(_) => "sequence".into(),
        Value::Object(_) => "map".into(),
    }
}

fn required<'a>(m: &'a Map<String, Value>, key: &str, at: &str) -> R<&'a Value> {
    m.get(key).ok_or_else(|| {
        Untranslatable::reference(&format!("{at}.{key}"), format!("missing field `{key}`"))
    })
}

fn string<'a>(v: &'a Value, field: &str) -> R<&'a str> {
    v.as_str().ok_or_else(|| {
        Untranslatable::reference(
            field,
            format!("invalid type: {}, expected a string", kind_of(v)),
        )
    })
}

fn tag<'a>(m: &'a Map<String, Value>, key: &str, at: &str) -> R<&'a str> {
    string(required(m, key, at)?, &format!("{at}.{key}"))
}

/// An unknown key is refused, naming it (the reference ignores them).
fn known_keys(m: &Map<String, Value>, at: &str, known: &[&str]) -> R<()> {
    match m.keys().find(|k| !known.contains(&k.as_str())) {
        None => Ok(()),
        Some(k) => Err(Untranslatable::unsupported(
            &format!("{at}.{k}"),
            format!("unknown field `{k}`, expected one of {}", list(known)),
        )),
    }
}

fn list(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `permissions.network`: whether it is `enabled`.
fn network_flag(perms: &Map<String, Value>) -> R<bool> {
    let field = "sandbox.permissions.network";
    match perms.get("network") {
        None => Ok(false),
        Some(v) => match string(v, field)? {
            "restricted" => Ok(false),
            "enabled" => Ok(true),
            other => Err(Untranslatable::reference(
                field,
                format!("unknown variant `{other}`, expected `restricted` or `enabled`"),
            )),
        },
    }
}

/// A `file:` URI as an absolute path (percent-decoded, any bytes).
fn file_uri(v: &Value, field: &str) -> R<PathBuf> {
    let s = string(v, field)?;
    let Some((scheme, rest)) = s.split_once(':').filter(|(sc, _)| {
        !sc.is_empty()
            && sc.starts_with(|c: char| c.is_ascii_alphabetic())
            && sc
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    }) else {
        return Err(Untranslatable::reference(
            field,
            "invalid URI: relative URL without a base",
        ));
    };
    if !scheme.eq_ignore_ascii_case("file") {
        return Err(Untranslatable::unsupported(
            field,
            format!("{s:?} is not a file: URI"),
        ));
    }
    let path = match rest.strip_prefix("//") {
        Some(after) => {
            let (authority, path) = after.split_at(after.find('/').unwrap_or(after.len()));
            if !(authority.is_empty() || authority.eq_ignore_ascii_case("localhost")) {
                return Err(Untranslatable::unsupported(
                    field,
                    format!("{s:?} names another host"),
                ));
            }
            path
        }
        None => rest,
    };
    if !path.starts_with('/') || path.contains(['?', '#']) {
        return Err(Untranslatable::unsupported(
            field,
            format!("{s:?} is not an absolute file path"),
        ));
    }
    let bytes = percent_decode(path).ok_or_else(|| {
        Untranslatable::unsupported(field, format!("{s:?} has a bad percent-encoding"))
    })?;
    if bytes.contains(&0) {
        return Err(Untranslatable::unsupported(
            field,
            format!("{s:?} holds a NUL byte"),
        ));
    }
    // `.` and `..` would be resolved by the agent as the kernel does
    // (through symlinks), where Codex normalizes them lexically: the two
    // could name different places, so neither is guessed.
    if bytes.split(|b| *b == b'/').any(|c| c == b"." || c == b"..") {
        return Err(Untranslatable::unsupported(
            field,
            format!("{s:?} has a `.` or `..` component"),
        ));
    }
    Ok(PathBuf::from(std::ffi::OsString::from_vec(bytes)))
}

fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

fn uri_list(v: &Value, field: &str) -> R<Vec<PathBuf>> {
    if v.is_null() {
        return Ok(Vec::new());
    }
    let a = v.as_array().ok_or_else(|| {
        Untranslatable::reference(
            field,
            format!("invalid type: {}, expected a sequence", kind_of(v)),
        )
    })?;
    a.iter()
        .enumerate()
        .map(|(i, u)| file_uri(u, &format!("{field}.{i}")))
        .collect()
}

/// The sandbox's workspace roots (`workspaceRoots`, or those of
/// `policyContext` in an fs sandbox; both given, they must agree).
fn workspace_roots(top: &Map<String, Value>) -> R<Vec<PathBuf>> {
    let own = match top.get("workspaceRoots") {
        Some(v) => Some(uri_list(v, "sandbox.workspaceRoots")?),
        None => None,
    };
    let ctx = match top.get("policyContext").filter(|v| !v.is_null()) {
        Some(v) => {
            let m = object(v, "sandbox.policyContext")?;
            known_keys(m, "sandbox.policyContext", &["cwd", "workspaceRoots"])?;
            if let Some(c) = m.get("cwd").filter(|c| !c.is_null()) {
                file_uri(c, "sandbox.policyContext.cwd")?;
            }
            match m.get("workspaceRoots") {
                Some(v) => Some(uri_list(v, "sandbox.policyContext.workspaceRoots")?),
                None => None,
            }
        }
        None => None,
    };
    match (own, ctx) {
        (Some(a), Some(b)) if a != b => Err(Untranslatable::unsupported(
            "sandbox.policyContext.workspaceRoots",
            "differs from sandbox.workspaceRoots",
        )),
        (Some(a), _) => Ok(a),
        (None, Some(b)) => Ok(b),
        (None, None) => Ok(Vec::new()),
    }
}

/// Access of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Write,
    Deny,
}

/// Where an entry points, before the roots are resolved by the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// Everything (`special root`).
    Root,
    Minimal,
    /// An absolute path.
    Path(PathBuf),
    /// A shared temporary directory (`tmpdir`, `slash_tmp`): a path whose
    /// top-level names anyone may have made.
    Temp(PathBuf),
    /// `:workspace_roots[/sub]`.
    Workspace(Option<PathBuf>),
    /// Nothing (an `unknown` special grant, an empty tmpdir list, project
    /// roots without roots).
    Nothing,
}

fn restricted(
    fs: &Map<String, Value>,
    top: &Map<String, Value>,
    cwd: &Path,
    roots: &[PathBuf],
    host: Host<'_>,
) -> R<FilesystemIntent> {
    let at = "sandbox.permissions.file_system";
    known_keys(fs, at, &["type", "entries", "glob_scan_max_depth"])?;
    let depth = match fs.get("glob_scan_max_depth").filter(|v| !v.is_null()) {
        None => None,
        Some(v) => match v.as_u64() {
            Some(d) if d >= 1 => Some(d as usize),
            _ => {
                return Err(Untranslatable::reference(
                    &format!("{at}.glob_scan_max_depth"),
                    "glob_scan_max_depth must be at least 1",
                ))
            }
        },
    };
    // Validated; they grant nothing (the reference's `tmpdir` is the job's
    // TMPDIR, not these).
    if let Some(v) = top.get("temporaryDirectories") {
        uri_list(v, "sandbox.temporaryDirectories")?;
    }
    let empty = Vec::new();
    let entries = match fs.get("entries") {
        None | Some(Value::Null) => &empty,
        Some(Value::Array(a)) => a,
        Some(v) => {
            return Err(Untranslatable::reference(
                &format!("{at}.entries"),
                format!("invalid type: {}, expected a sequence", kind_of(v)),
            ))
        }
    };
    // (target, access) of every entry, globs expanded.
    let mut items: Vec<(Target, Access, String)> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let ef = format!("{at}.entries.{i}");
        let m = object(e, &ef)?;
        known_keys(m, &ef, &["path", "access", "missing_path_behavior"])?;
        let access = match tag(m, "access", &ef)? {
            "read" => Access::Read,
            "write" => Access::Write,
            "deny" | "none" => Access::Deny,
            other => {
                return Err(Untranslatable::reference(
                    &format!("{ef}.access"),
                    format!(
                        "unknown variant `{other}`, expected one of `read`, `write`, `deny`, `none`"
                    ),
                ))
            }
        };
        if let Some(b) = m.get("missing_path_behavior").filter(|v| !v.is_null()) {
            let s = string(b, &format!("{ef}.missing_path_behavior"))?;
            if s != "skip" {
                return Err(Untranslatable::reference(
                    &format!("{ef}.missing_path_behavior"),
                    format!("unknown variant `{s}`, expected `skip`"),
                ));
            }
        }
        let pf = format!("{ef}.path");
        let p = object(required(m, "path", &ef)?, &pf)?;
        match tag(p, "type", &pf)? {
            "path" => {
                known_keys(p, &pf, &["type", "path"])?;
                let path = file_uri(required(p, "path", &pf)?, &format!("{pf}.path"))?;
                items.push((Target::Path(path), access, pf));
            }
            "glob_pattern" => {
                known_keys(p, &pf, &["type", "pattern"])?;
                let pattern = string(required(p, "pattern", &pf)?, &format!("{pf}.pattern"))?;
                let field = format!("{pf}.pattern");
                if access != Access::Deny {
                    return Err(Untranslatable::unsupported(
                        &field,
                        format!(
                            "{pattern:?}: a glob grants nothing here; only deny globs are expanded"
                        ),
                    ));
                }
                for m in expand_glob(pattern, cwd, depth, &field)? {
                    items.push((Target::Path(m), Access::Deny, field.clone()));
                }
            }
            "special" => {
                known_keys(p, &pf, &["type", "value"])?;
                let vf = format!("{pf}.value");
                let v = object(required(p, "value", &pf)?, &vf)?;
                let target = special(v, &vf, access, cwd, roots, host)?;
                items.push((target, access, vf));
            }
            other => {
                return Err(Untranslatable::reference(
                    &format!("{pf}.type"),
                    format!(
                    "unknown variant `{other}`, expected one of `path`, `glob_pattern`, `special`"
                ),
                ))
            }
        }
    }
    assemble(items, roots)
}

fn special(
    v: &Map<String, Value>,
    vf: &str,
    access: Access,
    cwd: &Path,
    roots: &[PathBuf],
    host: Host<'_>,
) -> R<Target> {
    let kind = tag(v, "kind", vf)?;
    let only_kind = |m: &Map<String, Value>| known_keys(m, vf, &["kind"]);
    Ok(match kind {
        "root" => {
            only_kind(v)?;
            Target::Root
        }
        "minimal" => {
            only_kind(v)?;
            if access == Access::Deny {
                return Err(Untranslatable::unsupported(
                    &format!("{vf}.kind"),
                    "a deny of the minimal read set has no native form",
                ));
            }
            Target::Minimal
        }
        "current_working_directory" => {
            only_kind(v)?;
            Target::Path(cwd.to_path_buf())
        }
        "project_roots" => {
            known_keys(v, vf, &["kind", "subpath"])?;
            let sub = match v.get("subpath").filter(|s| !s.is_null()) {
                None => None,
                Some(s) => Some(subpath(
                    string(s, &format!("{vf}.subpath"))?,
                    &format!("{vf}.subpath"),
                )?),
            };
            if roots.is_empty() {
                Target::Nothing
            } else {
                Target::Workspace(sub)
            }
        }
        "tmpdir" => {
            only_kind(v)?;
            match host.tmpdir {
                Some(t) if t.is_absolute() => Target::Temp(t.to_path_buf()),
                _ => Target::Nothing,
            }
        }
        "slash_tmp" => {
            only_kind(v)?;
            Target::Temp(PathBuf::from("/tmp"))
        }
        "unknown" => {
            known_keys(v, vf, &["kind", "path", "subpath"])?;
            if access == Access::Deny {
                return Err(Untranslatable::unsupported(
                    &format!("{vf}.kind"),
                    "a deny of an unknown special path cannot be enforced",
                ));
            }
            Target::Nothing
        }
        other => {
            return Err(Untranslatable::reference(
                &format!("{vf}.kind"),
                format!(
                    "unknown variant `{other}`, expected one of `root`, `minimal`, \
                     `current_working_directory`, `project_roots`, `tmpdir`, `slash_tmp`, `unknown`"
                ),
            ))
        }
    })
}

/// A `project_roots` subpath: relative plain names (what
/// `:workspace_roots/SUBPATH` takes).
fn subpath(s: &str, field: &str) -> R<PathBuf> {
    let p = Path::new(s);
    let plain = !s.is_empty()
        && !s.ends_with('/')
        && !s.contains("//")
        && p.components().all(|c| matches!(c, Component::Normal(_)))
        && !s.split('/').any(|c| c == ".");
    if !plain || s.contains('\0') {
        return Err(Untranslatable::unsupported(
            field,
            format!("{s:?}: a subpath of the project roots must be relative plain names (no `.`, `..`, empty or leading `/`)"),
        ));
    }
    Ok(p.to_path_buf())
}

/// The native lists from the entries: the more specific entry wins (a
/// `read` below a `write`, on the workspace roots as given, is a
/// `deny_write` too, unless a `write` names the same place); a carve-out
/// always wins over the roots around it natively (stricter than Codex for
/// a grant below a deny: never weaker).
fn assemble(items: Vec<(Target, Access, String)>, roots: &[PathBuf]) -> R<FilesystemIntent> {
    let mut fs = FilesystemIntent {
        read: ReadRoots::Paths(Vec::new()),
        ..Default::default()
    };
    let mut read_all = false;
    let mut deny_root = false;
    let mut reads: Vec<WirePath> = Vec::new();
    let grants_of = |t: &Target| -> Vec<WirePath> {
        match t {
            Target::Root => vec!["/".into()],
            Target::Path(p) | Target::Temp(p) => vec![optional(p)],
            Target::Workspace(None) => vec!["?:workspace_roots".into()],
            Target::Workspace(Some(s)) => vec![workspace_sub(s, true)],
            Target::Minimal | Target::Nothing => Vec::new(),
        }
    };
    // The places the write entries name, for the read-below-write rule.
    let written: Vec<PathBuf> = items
        .iter()
        .filter(|(_, a, _)| *a == Access::Write)
        .flat_map(|(t, _, _)| places(t, roots))
        .collect();
    for (t, a, _field) in &items {
        match (a, t) {
            (_, Target::Nothing) => {}
            (Access::Read, Target::Root) => read_all = true,
            // Codex reads the minimal set only (its platform defaults).
            (Access::Read | Access::Write, Target::Minimal) => reads.push(":minimal".into()),
            (Access::Write, t) => fs.write.extend(grants_of(t)),
            (Access::Read, t) => {
                reads.extend(grants_of(t));
                for place in places(t, roots) {
                    let below = written.iter().any(|w| place != *w && place.starts_with(w));
                    let same = written.contains(&place);
                    if below && !same {
                        fs.deny_write.push(wire(&place));
                    }
                }
            }
            // Deny of everything: only the other entries' grants (a grant
            // of the root itself beside it is refused below: in Codex the
            // deny wins that tie).
            (Access::Deny, Target::Root) => deny_root = true,
            (Access::Deny, t) => fs.deny_read.extend(carve_of(t)),
        }
    }
    // Codex keeps its protected metadata names read-only under every
    // writable root (created or not), unless a write entry names that
    // place itself. Not under the shared temporary directories: anyone
    // may plant a `.git` there, and a carve-out holding more than can be
    // examined, or a file hard-linked outside it, refuses the job, so any
    // local user could refuse every job.
    let protected: Vec<PathBuf> = items
        .iter()
        .filter(|(t, a, _)| *a == Access::Write && !matches!(t, Target::Temp(_)))
        .flat_map(|(t, _, _)| places(t, roots))
        .filter(|w| w.as_os_str() != "/")
        .collect();
    for w in &protected {
        for name in PROTECTED_METADATA {
            let place = w.join(name);
            if !written.contains(&place) {
                fs.deny_write.push(wire(&place));
            }
        }
        // A `.git` file (a worktree, a submodule, `--separate-git-dir`)
        // names the repository elsewhere: that is what runs later (its
        // hooks, its config), so it is protected too, with the common
        // directory a worktree's names.
        if !written.contains(&w.join(".git")) {
            for dir in git_pointer_dirs(w) {
                if !written.contains(&dir) {
                    fs.deny_write.push(wire(&dir));
                }
            }
        }
    }
    let any_write_all = fs.write.iter().any(|w| w.as_bytes() == b"/");
    if deny_root && (read_all || any_write_all) {
        return Err(Untranslatable::unsupported(
            "sandbox.permissions.file_system.entries",
            "the root is both denied and granted (Codex lets the deny win; \
             executor has no intent for it)",
        ));
    }
    fs.read = if read_all || any_write_all {
        ReadRoots::All
    } else {
        dedup(&mut reads);
        ReadRoots::Paths(reads)
    };
    dedup(&mut fs.write);
    dedup(&mut fs.deny_read);
    dedup(&mut fs.deny_write);
    Ok(fs)
}

/// The repository a `.git` *file* under `root` names (`gitdir: PATH`,
/// relative to `root` or absolute) and, when that holds a `commondir`
/// file, the common directory it names (relative to the repository):
/// read once each, a few KiB at most, never through a symlink. Nothing
/// for a `.git` directory, link or anything unreadable.
fn git_pointer_dirs(root: &Path) -> Vec<PathBuf> {
    fn small_file(p: &Path) -> Option<String> {
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::File::options()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(p)
            .ok()?;
        if !f.metadata().ok()?.is_file() {
            return None;
        }
        let mut text = String::new();
        f.take(4096).read_to_string(&mut text).ok()?;
        Some(text)
    }
    let mut out = Vec::new();
    let Some(text) = small_file(&root.join(".git")) else {
        return out;
    };
    let Some(named) = text.lines().next().and_then(|l| l.strip_prefix("gitdir:")) else {
        return out;
    };
    let gitdir = root.join(named.trim());
    if let Some(common) = small_file(&gitdir.join("commondir")) {
        let common = common.lines().next().unwrap_or_default().trim();
        if !common.is_empty() {
            out.push(gitdir.join(common));
        }
    }
    out.insert(0, gitdir);
    out.into_iter().map(|p| lexical(&p)).collect()
}

/// `.` and `..` taken out of an absolute path, lexically (as git writes
/// these pointers: `../.git/worktrees/wt`).
fn lexical(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// The absolute places a target names, lexically (`/` for the root).
fn places(t: &Target, roots: &[PathBuf]) -> Vec<PathBuf> {
    match t {
        Target::Root => vec![PathBuf::from("/")],
        Target::Path(p) | Target::Temp(p) => vec![p.clone()],
        Target::Workspace(None) => roots.to_vec(),
        Target::Workspace(Some(s)) => roots.iter().map(|r| r.join(s)).collect(),
        Target::Minimal | Target::Nothing => Vec::new(),
    }
}

fn dedup(v: &mut Vec<WirePath>) {
    let mut seen = std::collections::HashSet::new();
    v.retain(|p| seen.insert(p.clone()));
}

fn workspace_sub(s: &Path, opt: bool) -> WirePath {
    let mut b = if opt { b"?".to_vec() } else { Vec::new() };
    b.extend_from_slice(b":workspace_roots/");
    b.extend_from_slice(s.as_os_str().as_bytes());
    WirePath::from_bytes(b)
}

fn carve_of(t: &Target) -> Vec<WirePath> {
    match t {
        Target::Path(p) | Target::Temp(p) => vec![wire(p)],
        Target::Workspace(None) => vec![":workspace_roots".into()],
        Target::Workspace(Some(s)) => vec![workspace_sub(s, false)],
        Target::Root | Target::Minimal | Target::Nothing => Vec::new(),
    }
}

/// The matches of a deny glob: a bounded scan from its literal prefix,
/// symlinks not followed. `*` and `?` match within a name, `**` any
/// number of names; other glob syntax is refused.
fn expand_glob(pattern: &str, cwd: &Path, depth: Option<usize>, field: &str) -> R<Vec<PathBuf>> {
    if pattern.contains(['[', ']', '{', '}', '\\']) || pattern.contains('\0') {
        return Err(Untranslatable::unsupported(
            field,
            format!("{pattern:?}: only `*`, `?` and `**` are supported in a glob"),
        ));
    }
    let full = if pattern.starts_with('/') {
        pattern.to_string()
    } else {
        format!("{}/{pattern}", cwd.display())
    };
    let parts: Vec<&str> = full.split('/').filter(|c| !c.is_empty()).collect();
    if parts.iter().any(|c| *c == "." || *c == "..") {
        return Err(Untranslatable::unsupported(
            field,
            format!("{pattern:?}: `.` and `..` are not supported in a glob"),
        ));
    }
    let literal = parts.iter().take_while(|c| !c.contains(['*', '?'])).count();
    let rest = &parts[literal..];
    if rest.is_empty() {
        // No wildcard: the path itself.
        return Ok(vec![PathBuf::from(full)]);
    }
    if rest.iter().any(|c| c.contains("**") && *c != "**") {
        return Err(Untranslatable::unsupported(
            field,
            format!("{pattern:?}: `**` must be a whole path component"),
        ));
    }
    // With `**`: to glob_scan_max_depth, or as deep as the scan budget
    // allows; without: the pattern's own depth.
    let max_depth = if rest.contains(&"**") {
        depth.unwrap_or(usize::MAX)
    } else {
        depth.unwrap_or(rest.len()).min(rest.len())
    };
    let base: PathBuf = std::iter::once("/")
        .chain(parts[..literal].iter().copied())
        .collect();
    let mut out = Vec::new();
    let mut scanned = 0usize;
    let mut stack = vec![(base, 0usize)];
    while let Some((dir, d)) = stack.pop() {
        if d >= max_depth {
            continue;
        }
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in rd.flatten() {
            scanned += 1;
            if scanned > MAX_GLOB_SCAN {
                return Err(Untranslatable::unsupported(
                    field,
                    format!("{pattern:?}: more than {MAX_GLOB_SCAN} entries to examine"),
                ));
            }
            let path = entry.path();
            // The names below the literal prefix (`/` and its components).
            let rel: Vec<Vec<u8>> = path
                .components()
                .skip(literal + 1)
                .map(|c| c.as_os_str().as_bytes().to_vec())
                .collect();
            if glob_match(rest, &rel) {
                out.push(path.clone());
                if out.len() > MAX_GLOB_MATCHES {
                    return Err(Untranslatable::unsupported(
                        field,
                        format!("{pattern:?}: more than {MAX_GLOB_MATCHES} matches"),
                    ));
                }
            }
            let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
            if is_dir {
                stack.push((path, d + 1));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Whether the names `rel` match the pattern components `pat`.
fn glob_match(pat: &[&str], rel: &[Vec<u8>]) -> bool {
    match pat.split_first() {
        None => rel.is_empty(),
        Some((&"**", rest)) => (0..=rel.len()).any(|k| glob_match(rest, &rel[k..])),
        Some((p, rest)) => match rel.split_first() {
            Some((name, more)) => name_match(p.as_bytes(), name) && glob_match(rest, more),
            None => false,
        },
    }
}

fn name_match(p: &[u8], n: &[u8]) -> bool {
    match p.split_first() {
        None => n.is_empty(),
        Some((b'*', rest)) => (0..=n.len()).any(|k| name_match(rest, &n[k..])),
        Some((b'?', rest)) => !n.is_empty() && name_match(rest, &n[1..]),
        Some((c, rest)) => n.first() == Some(c) && name_match(rest, &n[1..]),
    }
}

/// The job's network: `open` (`permissions.network: enabled`) or not,
/// under `enforceManagedNetwork`, `managedNetwork` and `networkProxy`.
fn managed_network(n: NetworkRequest<'_>, open: bool) -> R<NetworkIntent> {
    let proxy = match n.proxy.filter(|p| !p.is_null()) {
        Some(p) => proxy_hosts(p)?,
        None => None,
    };
    if let Some(m) = n.managed.filter(|m| !m.is_null()) {
        // An existing proxy's loopback ports: checked, never a way out
        // (the ports would be open to any host natively).
        let mm = object(m, "managedNetwork")?;
        known_keys(
            mm,
            "managedNetwork",
            &["loopbackPorts", "allowLocalBinding"],
        )?;
    }
    Ok(match (open, proxy) {
        (false, _) => NetworkIntent::Deny,
        (true, Some(hosts)) => NetworkIntent::AllowHosts(hosts),
        // Managed without an expressible proxy: fail closed.
        (true, None) if n.enforce_managed => NetworkIntent::Deny,
        (true, None) => NetworkIntent::Allow,
    })
}

/// `networkProxy` as egress by name; `None` when the proxy is disabled.
fn proxy_hosts(v: &Value) -> R<Option<EgressIntent>> {
    let at = "networkProxy";
    let m = object(v, at)?;
    known_keys(
        m,
        at,
        &[
            "proxy",
            "auditMetadata",
            "environmentId",
            "executionId",
            "policyDecisionTimeoutMs",
        ],
    )?;
    let pf = "networkProxy.proxy";
    let p = object(required(m, "proxy", at)?, pf)?;
    let fields = [
        "enabled",
        "enableSocks5",
        "enableSocks5Udp",
        "allowUpstreamProxy",
        "dangerouslyAllowAllUnixSockets",
        "mode",
        "domains",
        "unixSockets",
        "allowLocalBinding",
    ];
    known_keys(p, pf, &fields)?;
    for f in fields {
        if !p.contains_key(f) {
            return Err(Untranslatable::reference(
                &format!("{pf}.{f}"),
                format!("missing field `{f}`"),
            ));
        }
    }
    let flag = |k: &str| -> R<bool> {
        p[k].as_bool().ok_or_else(|| {
            Untranslatable::reference(
                &format!("{pf}.{k}"),
                format!("invalid type: {}, expected a boolean", kind_of(&p[k])),
            )
        })
    };
    let on = flag("enabled")?;
    flag("enableSocks5")?;
    for k in [
        "enableSocks5Udp",
        "allowUpstreamProxy",
        "dangerouslyAllowAllUnixSockets",
        "allowLocalBinding",
    ] {
        if flag(k)? {
            return Err(Untranslatable::unsupported(
                &format!("{pf}.{k}"),
                "not supported by executor's egress (TCP by name through its proxy only)",
            ));
        }
    }
    match string(&p["mode"], &format!("{pf}.mode"))? {
        "full" => {}
        "limited" => {
            return Err(Untranslatable::unsupported(
                &format!("{pf}.mode"),
                "`limited` (read-only HTTP methods) has no native form",
            ))
        }
        other => {
            return Err(Untranslatable::reference(
                &format!("{pf}.mode"),
                format!("unknown variant `{other}`, expected `limited` or `full`"),
            ))
        }
    }
    if let Some(u) = p.get("unixSockets").filter(|u| !u.is_null()) {
        let um = object(u, &format!("{pf}.unixSockets"))?;
        if um.values().any(|v| v.as_str() != Some("deny")) {
            return Err(Untranslatable::unsupported(
                &format!("{pf}.unixSockets"),
                "unix socket permissions are not supported",
            ));
        }
    }
    let timeout = match m.get("policyDecisionTimeoutMs").filter(|t| !t.is_null()) {
        None => None,
        Some(t) => Some(t.as_u64().ok_or_else(|| {
            Untranslatable::reference(
                "networkProxy.policyDecisionTimeoutMs",
                format!("invalid type: {}, expected u64", kind_of(t)),
            )
        })?),
    };
    if !on {
        return Ok(None);
    }
    let df = format!("{pf}.domains");
    let mut allow: Vec<String> = Vec::new();
    let mut deny: Vec<(String, String)> = Vec::new();
    match p.get("domains") {
        None | Some(Value::Null) => {}
        Some(Value::Object(d)) => {
            for (pattern, perm) in d {
                let f = format!("{df}.{pattern}");
                match string(perm, &f)? {
                    "allow" => allow.extend(domain_allow(pattern, &f)?),
                    "deny" => deny.push((pattern.clone(), f)),
                    "none" => {}
                    other => {
                        return Err(Untranslatable::reference(
                            &f,
                            format!(
                            "unknown variant `{other}`, expected one of `none`, `allow`, `deny`"
                        ),
                        ))
                    }
                }
            }
        }
        Some(v) => {
            return Err(Untranslatable::reference(
                &df,
                format!("invalid type: {}, expected a map", kind_of(v)),
            ))
        }
    }
    // A deny outside every allowed name is denied anyway; one an allow
    // pattern could admit has no native form (allow-lists only).
    for (pattern, f) in deny {
        let d = base_name(&pattern);
        if allow.iter().any(|a| {
            let a = base_name(a);
            a == d || a.ends_with(&format!(".{d}")) || d.ends_with(&format!(".{a}"))
        }) {
            return Err(Untranslatable::unsupported(
                &f,
                "a deny inside an allowed domain has no native form (allow-lists only)",
            ));
        }
    }
    dedup_strings(&mut allow);
    Ok(Some(EgressIntent {
        allow_hosts: allow,
        ask: timeout.is_some(),
        ask_timeout_ms: timeout
            .unwrap_or(executor_protocol::types::sandbox::DEFAULT_ASK_TIMEOUT_MS)
            .min(MAX_ASK_TIMEOUT_MS),
    }))
}

fn dedup_strings(v: &mut Vec<String>) {
    let mut seen = std::collections::HashSet::new();
    v.retain(|p| seen.insert(p.clone()));
}

fn base_name(p: &str) -> String {
    p.trim_start_matches("**.")
        .trim_start_matches("*.")
        .trim_end_matches('.')
        .to_ascii_lowercase()
}

/// A Codex allow pattern as native ones: `a.b` exact, `*.a.b` names below
/// (not the apex, as Codex), `**.a.b` the apex and below.
fn domain_allow(pattern: &str, field: &str) -> R<Vec<String>> {
    let (apex, below, name) = if let Some(n) = pattern.strip_prefix("**.") {
        (true, true, n)
    } else if let Some(n) = pattern.strip_prefix("*.") {
        (false, true, n)
    } else {
        (true, false, pattern)
    };
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        && !name.starts_with('.')
        && !name.contains("..");
    if !ok {
        return Err(Untranslatable::unsupported(
            field,
            format!(
                "{pattern:?}: only `host`, `*.domain` and `**.domain` patterns map onto egress by name"
            ),
        ));
    }
    let mut out = Vec::new();
    if apex {
        out.push(name.to_string());
    }
    if below {
        out.push(format!("*.{name}"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
