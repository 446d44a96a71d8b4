//! From a `SandboxIntent` to a resolved policy: symbols expanded, roots
//! canonicalized once, every path checked. This runs for every request that
//! carries an intent, before anything is decided or spawned, so a bad
//! intent is `invalid_params` naming the offending entry (never a silent
//! weakening, never a spawn).
//!
//! Symbols: `:cwd` (the request's cwd), `:workspace_roots` (the configured
//! workspace roots, default the cwd), `:tmp` (a private temp dir of the
//! process, created at spawn), `:home`.

use executor_protocol::types::sandbox::{NetworkIntent, ReadRoots, SandboxIntent};
use executor_protocol::WirePath;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// One root of a resolved policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Root {
    /// An existing, canonical path.
    Path(PathBuf),
    /// The process's private temp dir (made at spawn).
    Tmp,
}

/// The paths of `roots`, without `:tmp` (which belongs to a process).
pub fn root_paths(roots: &[Root]) -> Vec<PathBuf> {
    roots
        .iter()
        .filter_map(|r| match r {
            Root::Path(p) => Some(p.clone()),
            Root::Tmp => None,
        })
        .collect()
}

/// A resolved sandbox policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// `None`: everything is readable.
    pub read: Option<Vec<Root>>,
    pub write: Vec<Root>,
    /// Carve-outs; they may not exist yet (absolute, lexically clean).
    pub deny_read: Vec<PathBuf>,
    pub deny_write: Vec<PathBuf>,
    pub network: NetworkIntent,
    pub required: bool,
    /// Symlinks met on the way from a root as given to its canonical path
    /// (`/lib` -> `usr/lib`): (where, what it points to). A job's fresh root
    /// recreates them so the names it was given still lead somewhere.
    pub links: Vec<(PathBuf, PathBuf)>,
    /// Symlinks met on the way to a carve-out (the carve-out itself when
    /// it is one, and its symlinked ancestors): inside a write root they
    /// are pinned, so the name the intent gave cannot be swapped for
    /// something the carve-out does not cover.
    pub carve_out_links: Vec<PathBuf>,
}

/// What the symbols mean for one request.
#[derive(Debug, Clone, Default)]
pub struct Context {
    pub cwd: Option<PathBuf>,
    /// Configured workspace roots; empty means "the cwd".
    pub workspace_roots: Vec<PathBuf>,
    pub home: Option<PathBuf>,
}

/// Why an intent cannot be resolved; `field` is the dotted path into the
/// request params (`sandbox.filesystem.write.1`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    #[error("{field}: {path:?} does not exist (a sandbox root must exist)")]
    MissingRoot { field: String, path: String },
    #[error("{field}: {path:?} is not absolute and not a known symbol (:cwd, :workspace_roots, :tmp, :home)")]
    NotAbsolute { field: String, path: String },
    #[error("{field}: :cwd is used but the request has no absolute cwd")]
    NoCwd { field: String },
    #[error("{field}: :home is used but the agent's user has no home directory")]
    NoHome { field: String },
    #[error("{field}: :tmp cannot be a carve-out")]
    TmpCarveOut { field: String },
    #[error("{field}: {path:?} is a symbolic link; a write root must name the directory itself")]
    SymlinkRoot { field: String, path: String },
}

impl PolicyError {
    /// The offending field.
    pub fn field(&self) -> &str {
        match self {
            PolicyError::MissingRoot { field, .. }
            | PolicyError::NotAbsolute { field, .. }
            | PolicyError::NoCwd { field }
            | PolicyError::NoHome { field }
            | PolicyError::TmpCarveOut { field }
            | PolicyError::SymlinkRoot { field, .. } => field,
        }
    }
}

/// The symbols a root may be instead of an absolute path.
pub const SYMBOLS: [&str; 4] = [":cwd", ":workspace_roots", ":tmp", ":home"];

/// Whether `p` is an absolute path or one of [`SYMBOLS`]: what [`resolve`]
/// accepts before it looks anything up (for checking a configuration at
/// load).
pub fn well_formed_root(p: &WirePath) -> bool {
    p.as_bytes().first() == Some(&b'/') || SYMBOLS.iter().any(|s| s.as_bytes() == p.as_bytes())
}

enum Expanded {
    Paths(Vec<PathBuf>),
    Tmp,
}

fn expand(p: &WirePath, field: &str, ctx: &Context) -> Result<Expanded, PolicyError> {
    match p.as_bytes() {
        b":cwd" => ctx
            .cwd
            .clone()
            .map(|c| Expanded::Paths(vec![c]))
            .ok_or_else(|| PolicyError::NoCwd {
                field: field.into(),
            }),
        b":workspace_roots" => {
            if ctx.workspace_roots.is_empty() {
                ctx.cwd
                    .clone()
                    .map(|c| Expanded::Paths(vec![c]))
                    .ok_or_else(|| PolicyError::NoCwd {
                        field: field.into(),
                    })
            } else {
                Ok(Expanded::Paths(ctx.workspace_roots.clone()))
            }
        }
        b":home" => ctx
            .home
            .clone()
            .map(|h| Expanded::Paths(vec![h]))
            .ok_or_else(|| PolicyError::NoHome {
                field: field.into(),
            }),
        b":tmp" => Ok(Expanded::Tmp),
        bytes if bytes.first() == Some(&b'/') => Ok(Expanded::Paths(vec![PathBuf::from(
            OsStr::from_bytes(bytes),
        )])),
        _ => Err(PolicyError::NotAbsolute {
            field: field.into(),
            path: p.display(),
        }),
    }
}

/// The symlinks met resolving `path` component by component.
fn links_on(path: &Path, out: &mut Vec<(PathBuf, PathBuf)>) {
    let mut cur = PathBuf::from("/");
    for c in path.components() {
        let std::path::Component::Normal(n) = c else {
            continue;
        };
        let next = cur.join(n);
        match std::fs::read_link(&next) {
            Ok(to) => {
                let entry = (next.clone(), to);
                if !out.contains(&entry) {
                    out.push(entry);
                }
                cur = std::fs::canonicalize(&next).unwrap_or(next);
            }
            Err(_) => cur = next,
        }
    }
}

/// Roots must exist; a broken symlink does not. A write root may not be a
/// symlink itself (what it points to could change after the check).
fn roots(
    list: &[WirePath],
    name: &str,
    ctx: &Context,
    links: &mut Vec<(PathBuf, PathBuf)>,
) -> Result<Vec<Root>, PolicyError> {
    let mut out = Vec::new();
    for (i, p) in list.iter().enumerate() {
        let field = format!("sandbox.filesystem.{name}.{i}");
        match expand(p, &field, ctx)? {
            Expanded::Tmp => out.push(Root::Tmp),
            Expanded::Paths(paths) => {
                for path in paths {
                    let canon =
                        std::fs::canonicalize(&path).map_err(|_| PolicyError::MissingRoot {
                            field: field.clone(),
                            path: path.to_string_lossy().into_owned(),
                        })?;
                    if name == "write"
                        && std::fs::symlink_metadata(&path)
                            .is_ok_and(|m| m.file_type().is_symlink())
                    {
                        return Err(PolicyError::SymlinkRoot {
                            field: field.clone(),
                            path: path.to_string_lossy().into_owned(),
                        });
                    }
                    links_on(&path, links);
                    if !out.contains(&Root::Path(canon.clone())) {
                        out.push(Root::Path(canon));
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Remove `.` and resolve `..` lexically, and resolve the longest existing
/// prefix through the filesystem (so a carve-out names what a process would
/// reach), keeping the not-yet-existing tail.
fn carve_out_path(path: &Path) -> PathBuf {
    let mut clean = PathBuf::from("/");
    for c in path.components() {
        match c {
            std::path::Component::ParentDir => {
                clean.pop();
            }
            std::path::Component::Normal(n) => clean.push(n),
            _ => {}
        }
    }
    // A carve-out that is a symlink names what it points to (even when
    // that does not exist yet): follow it, lexically, a bounded number of
    // times.
    for _ in 0..40 {
        let Ok(to) = std::fs::read_link(&clean) else {
            break;
        };
        let base = clean
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("/"));
        let mut next = PathBuf::from("/");
        for c in base.join(to).components() {
            match c {
                std::path::Component::ParentDir => {
                    next.pop();
                }
                std::path::Component::Normal(n) => next.push(n),
                _ => {}
            }
        }
        clean = next;
    }
    let mut existing = clean.clone();
    let mut tail = Vec::new();
    loop {
        if let Ok(c) = std::fs::canonicalize(&existing) {
            let mut out = c;
            for t in tail.iter().rev() {
                out.push(t);
            }
            return out;
        }
        match (
            existing.file_name().map(|n| n.to_os_string()),
            existing.parent(),
        ) {
            (Some(name), Some(parent)) => {
                tail.push(name);
                existing = parent.to_path_buf();
            }
            _ => return clean,
        }
    }
}

fn carve_outs(
    list: &[WirePath],
    name: &str,
    ctx: &Context,
    links: &mut Vec<PathBuf>,
) -> Result<Vec<PathBuf>, PolicyError> {
    let mut out = Vec::new();
    for (i, p) in list.iter().enumerate() {
        let field = format!("sandbox.filesystem.{name}.{i}");
        match expand(p, &field, ctx)? {
            Expanded::Tmp => return Err(PolicyError::TmpCarveOut { field }),
            Expanded::Paths(paths) => {
                for path in paths {
                    let mut met = Vec::new();
                    links_on(&path, &mut met);
                    for (at, _) in met {
                        if !links.contains(&at) {
                            links.push(at);
                        }
                    }
                    let c = carve_out_path(&path);
                    if !out.contains(&c) {
                        out.push(c);
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Resolve an intent for one request.
pub fn resolve(intent: &SandboxIntent, ctx: &Context) -> Result<Policy, PolicyError> {
    let fs = &intent.filesystem;
    let mut links = Vec::new();
    let mut carve_out_links = Vec::new();
    let read = match &fs.read {
        ReadRoots::All => None,
        ReadRoots::Paths(p) => Some(roots(p, "read", ctx, &mut links)?),
    };
    Ok(Policy {
        read,
        write: roots(&fs.write, "write", ctx, &mut links)?,
        deny_read: carve_outs(&fs.deny_read, "deny_read", ctx, &mut carve_out_links)?,
        deny_write: carve_outs(&fs.deny_write, "deny_write", ctx, &mut carve_out_links)?,
        network: intent.network.clone(),
        required: intent.required,
        links,
        carve_out_links,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use executor_protocol::types::sandbox::FilesystemIntent;

    fn dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("sbx-policy-{}", std::process::id()));
        std::fs::create_dir_all(d.join("ws/.git")).unwrap();
        std::fs::canonicalize(d).unwrap()
    }

    #[test]
    fn symbols_expand_and_roots_canonicalize() {
        let d = dir();
        let ctx = Context {
            cwd: Some(d.join("ws")),
            workspace_roots: vec![],
            home: Some(d.clone()),
        };
        let intent = SandboxIntent {
            filesystem: FilesystemIntent {
                read: ReadRoots::Paths(vec![":home".into(), "/usr".into()]),
                write: vec![
                    ":workspace_roots".into(),
                    ":tmp".into(),
                    format!("{}/ws/../ws", d.display()).as_str().into(),
                ],
                deny_read: vec![],
                deny_write: vec![
                    format!("{}/ws/.git", d.display()).as_str().into(),
                    format!("{}/ws/new/../later", d.display()).as_str().into(),
                ],
            },
            network: NetworkIntent::Deny,
            required: true,
        };
        let p = resolve(&intent, &ctx).unwrap();
        assert_eq!(
            p.read,
            Some(vec![Root::Path(d.clone()), Root::Path("/usr".into())])
        );
        assert_eq!(
            p.write,
            vec![Root::Path(d.join("ws")), Root::Tmp],
            "duplicates collapse"
        );
        assert_eq!(
            p.deny_write,
            vec![d.join("ws/.git"), d.join("ws/later")],
            "a carve-out may not exist yet"
        );
    }

    #[test]
    fn bad_roots_name_their_field() {
        let ctx = Context::default();
        let mk = |write: Vec<WirePath>| SandboxIntent {
            filesystem: FilesystemIntent {
                write,
                ..Default::default()
            },
            ..Default::default()
        };
        let e = resolve(&mk(vec!["/usr".into(), "/no/such/root".into()]), &ctx).unwrap_err();
        assert_eq!(e.field(), "sandbox.filesystem.write.1");
        assert!(matches!(e, PolicyError::MissingRoot { .. }));
        let e = resolve(&mk(vec!["relative".into()]), &ctx).unwrap_err();
        assert!(matches!(e, PolicyError::NotAbsolute { .. }));
        let e = resolve(&mk(vec![":cwd".into()]), &ctx).unwrap_err();
        assert!(matches!(e, PolicyError::NoCwd { .. }));
        // A broken symlink is not a root.
        let d = dir();
        let link = d.join("broken");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(d.join("nowhere"), &link).unwrap();
        let e = resolve(&mk(vec![link.to_str().unwrap().into()]), &ctx).unwrap_err();
        assert!(matches!(e, PolicyError::MissingRoot { .. }));
    }
}
