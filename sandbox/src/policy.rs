//! From a `SandboxIntent` to a resolved policy: symbols expanded, every
//! root and carve-out resolved by one walk (`walk`: each component opened
//! in the directory the previous one opened, so its canonical path, the
//! symlinks met and its identity come from the same look-ups), every path
//! checked. This runs for every request that carries an intent, before
//! anything is decided or spawned, so a bad intent is `invalid_params`
//! naming the offending entry (never a silent weakening, never a spawn).
//! Depends on `std`, `nix` and the protocol's intent types.
//!
//! Symbols: `:cwd` (the request's cwd), `:workspace_roots` (the request's
//! or the configured workspace roots, default the cwd; `:workspace_roots/SUB`
//! that subpath under each, which must stay inside it), `:tmp` (a private
//! temp dir of the process, created at spawn), `:home`, `:minimal`
//! ([`MINIMAL_READ`], read roots only). A root written `?ROOT` may be
//! missing: it is skipped, never granted later.

use executor_protocol::types::sandbox::{NetworkIntent, ReadRoots, SandboxIntent};
use executor_protocol::WirePath;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// One root of a resolved policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Root {
    /// An existing path, canonical, with the identity of what it named.
    Path(Checked),
    /// The process's private temp dir (made at spawn).
    Tmp,
}

/// A root as the agent resolved it, in one look-up: the canonical path of
/// what the given path named at that moment, and that node's identity.
/// The two never come from different look-ups, so a name swapped for a
/// symlink while the agent checks it cannot make the agent check one
/// place and grant another: the trampoline opens `path` without following
/// anything and refuses a node whose identity is not this one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub path: PathBuf,
    pub dev: u64,
    pub ino: u64,
}

impl Checked {
    /// A path with no identity (device and inode 0, which no node has):
    /// for what only generates a profile from a policy (Seatbelt, tests).
    /// A plan made from it fails at the trampoline's identity check.
    pub fn unchecked(path: impl Into<PathBuf>) -> Checked {
        Checked {
            path: path.into(),
            dev: 0,
            ino: 0,
        }
    }
}

impl std::ops::Deref for Checked {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for Checked {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

/// The paths of `roots`, without `:tmp` (which belongs to a process).
pub fn root_paths(roots: &[Root]) -> Vec<PathBuf> {
    roots
        .iter()
        .filter_map(|r| match r {
            Root::Path(p) => Some(p.path.clone()),
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
    /// it is one, and its symlinked ancestors), each with the identity of
    /// the link the walk went through: inside a write root they are
    /// pinned, so the name the intent gave cannot be swapped for something
    /// the carve-out does not cover (nor be a directory again by the time
    /// the job starts: the job's start then fails).
    pub carve_out_links: Vec<Checked>,
}

/// What the symbols mean for one request.
#[derive(Debug, Clone, Default)]
pub struct Context {
    pub cwd: Option<PathBuf>,
    /// Configured workspace roots; empty means "the cwd".
    pub workspace_roots: Vec<PathBuf>,
    pub home: Option<PathBuf>,
    /// Set when `workspace_roots` came from the request (its intent's
    /// `workspace_roots`): the canonical roots each must lie within once
    /// resolved (the profile's), or `None` when the profile has none.
    /// Checked on the walk that grants the root, named
    /// `sandbox.workspace_roots.J`.
    pub request_roots_within: Option<Option<Vec<PathBuf>>>,
}

/// Why an intent cannot be resolved; `field` is the dotted path into the
/// request params (`sandbox.filesystem.write.1`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    #[error("{field}: {path:?} does not exist (a sandbox root must exist; write it with a leading `?` to skip it when missing)")]
    MissingRoot { field: String, path: String },
    #[error("{field}: {path:?} is not absolute and not a known symbol (:cwd, :workspace_roots, :workspace_roots/SUBPATH, :tmp, :home, :minimal, or a root with a leading `?`)")]
    NotAbsolute { field: String, path: String },
    #[error("{field}: :cwd is used but the request has no absolute cwd")]
    NoCwd { field: String },
    #[error("{field}: :home is used but the agent's user has no home directory")]
    NoHome { field: String },
    #[error("{field}: :tmp cannot be a carve-out")]
    TmpCarveOut { field: String },
    #[error("{field}: {path:?} is a symbolic link; a write root must name the directory itself")]
    SymlinkRoot { field: String, path: String },
    #[error("{field}: {path:?} cannot be resolved: {reason}")]
    Unresolvable {
        field: String,
        path: String,
        reason: String,
    },
    #[error("{field}: {path:?}: {reason}")]
    BadSymbol {
        field: String,
        path: String,
        reason: String,
    },
    #[error("{field}: {path:?} is not absolute (a workspace root is an absolute path)")]
    NotAbsoluteWorkspaceRoot { field: String, path: String },
    /// A request's workspace root outside the profile's: `policy_denied`.
    #[error("{field}: {path:?} is outside this profile's workspace_roots (a request's workspace roots may only narrow them)")]
    WiderWorkspaceRoot { field: String, path: String },
    #[error("{field}: {path:?} resolves to {resolved:?}, outside its workspace root {root:?} (a symbolic link on the way leaves it)")]
    SubpathEscapes {
        field: String,
        path: String,
        resolved: String,
        root: String,
    },
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
            | PolicyError::SymlinkRoot { field, .. }
            | PolicyError::Unresolvable { field, .. }
            | PolicyError::BadSymbol { field, .. }
            | PolicyError::NotAbsoluteWorkspaceRoot { field, .. }
            | PolicyError::WiderWorkspaceRoot { field, .. }
            | PolicyError::SubpathEscapes { field, .. } => field,
        }
    }

    /// Whether the intent asks for more than the profile allows (rather
    /// than being malformed): `policy_denied`, not `invalid_params`.
    pub fn is_wider_than_profile(&self) -> bool {
        matches!(self, PolicyError::WiderWorkspaceRoot { .. })
    }
}

/// The symbols a root may be instead of an absolute path
/// (`:workspace_roots/SUBPATH` and a leading `?` besides).
pub const SYMBOLS: [&str; 5] = [":cwd", ":workspace_roots", ":tmp", ":home", ":minimal"];

/// `:minimal`: what a process needs to run on Linux (programs, libraries,
/// the dynamic linker's and the system's configuration), read-only. Those
/// that do not exist on the host are skipped. The job gets its own `/dev`
/// and `/proc` anyway. (The same directories Codex's Linux sandbox reads
/// for its platform defaults.)
pub const MINIMAL_READ: [&str; 8] = [
    "/bin",
    "/sbin",
    "/usr",
    "/etc",
    "/lib",
    "/lib64",
    "/nix/store",
    "/run/current-system/sw",
];

/// What an entry of an intent's lists names, before anything is looked up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Symbol {
    /// An absolute path.
    Path(PathBuf),
    Cwd,
    /// `:workspace_roots`, or `:workspace_roots/SUBPATH` (relative, only
    /// plain names: no `.`, `..` or empty component).
    WorkspaceRoots(Option<PathBuf>),
    Home,
    Tmp,
    Minimal,
}

/// An entry of an intent's lists: its symbol, and whether it was written
/// with a leading `?` (a root that may be missing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub optional: bool,
    pub symbol: Symbol,
}

/// Parse one entry; the error is the reason, for [`PolicyError::BadSymbol`]
/// (or `None`: not absolute and not a symbol).
pub fn parse_entry(p: &WirePath) -> Result<Entry, Option<String>> {
    let mut bytes = p.as_bytes();
    let optional = bytes.first() == Some(&b'?');
    if optional {
        bytes = &bytes[1..];
        if bytes.first() == Some(&b'?') {
            return Err(Some("a root takes one leading `?`".into()));
        }
    }
    let symbol = match bytes {
        b":cwd" => Symbol::Cwd,
        b":workspace_roots" => Symbol::WorkspaceRoots(None),
        b":home" => Symbol::Home,
        b":tmp" => Symbol::Tmp,
        b":minimal" => Symbol::Minimal,
        _ if bytes.starts_with(b":workspace_roots/") => {
            let sub = &bytes[b":workspace_roots/".len()..];
            if sub.contains(&0) {
                return Err(Some("a subpath holds no NUL byte".into()));
            }
            if sub
                .split(|b| *b == b'/')
                .any(|c| c.is_empty() || c == b"." || c == b"..")
            {
                return Err(Some(
                    "a subpath of :workspace_roots is relative and made of plain names \
                     (no `.`, `..` or empty component)"
                        .into(),
                ));
            }
            Symbol::WorkspaceRoots(Some(PathBuf::from(OsStr::from_bytes(sub))))
        }
        _ if bytes.first() == Some(&b'/') => Symbol::Path(PathBuf::from(OsStr::from_bytes(bytes))),
        _ => return Err(None),
    };
    Ok(Entry { optional, symbol })
}

/// Whether `p` is an absolute path or a symbol [`resolve`] knows (see
/// [`parse_entry`]): what it accepts before it looks anything up (for
/// checking a configuration at load).
pub fn well_formed_root(p: &WirePath) -> bool {
    parse_entry(p).is_ok()
}

fn bad_entry(p: &WirePath, field: &str, why: Option<String>) -> PolicyError {
    match why {
        Some(reason) => PolicyError::BadSymbol {
            field: field.into(),
            path: p.display(),
            reason,
        },
        None => PolicyError::NotAbsolute {
            field: field.into(),
            path: p.display(),
        },
    }
}

/// One path an entry expands to.
struct Expansion {
    path: PathBuf,
    /// Skip it when missing (`?`, a `:minimal` member).
    optional: bool,
    /// The field a wider-than-profile request root is reported at
    /// (`sandbox.workspace_roots.J`), when it came from the request.
    request_root: Option<String>,
    /// A subpath: the granted path must stay under the (canonical)
    /// workspace root it was joined to.
    within: Option<PathBuf>,
}

enum Expanded {
    Paths(Vec<Expansion>),
    Tmp,
}

/// The workspace roots `:workspace_roots` stands for, each with the field
/// of a request's own (`sandbox.workspace_roots.J`).
fn workspace_roots(
    field: &str,
    ctx: &Context,
) -> Result<Vec<(PathBuf, Option<String>)>, PolicyError> {
    if ctx.workspace_roots.is_empty() {
        return ctx
            .cwd
            .clone()
            .map(|c| vec![(c, None)])
            .ok_or_else(|| PolicyError::NoCwd {
                field: field.into(),
            });
    }
    Ok(ctx
        .workspace_roots
        .iter()
        .enumerate()
        .map(|(j, r)| {
            let f = ctx
                .request_roots_within
                .is_some()
                .then(|| format!("sandbox.workspace_roots.{j}"));
            (r.clone(), f)
        })
        .collect())
}

/// Whether the canonical `path` lies within the profile's roots, for a
/// request's own workspace root.
fn check_request_root(
    path: &Path,
    field: &Option<String>,
    ctx: &Context,
) -> Result<(), PolicyError> {
    if let (Some(f), Some(Some(bound))) = (field, &ctx.request_roots_within) {
        if !bound.iter().any(|b| path.starts_with(b)) {
            return Err(PolicyError::WiderWorkspaceRoot {
                field: f.clone(),
                path: path.to_string_lossy().into_owned(),
            });
        }
    }
    Ok(())
}

fn expand(p: &WirePath, field: &str, ctx: &Context, list: &str) -> Result<Expanded, PolicyError> {
    let entry = parse_entry(p).map_err(|why| bad_entry(p, field, why))?;
    let one = |path: PathBuf| Expansion {
        path,
        optional: entry.optional,
        request_root: None,
        within: None,
    };
    let carve_out = list.starts_with("deny_");
    if entry.optional && carve_out {
        return Err(bad_entry(
            p,
            field,
            Some("a carve-out may be missing already; `?` is for read and write roots".into()),
        ));
    }
    Ok(match entry.symbol {
        Symbol::Cwd => ctx
            .cwd
            .clone()
            .map(|c| Expanded::Paths(vec![one(c)]))
            .ok_or_else(|| PolicyError::NoCwd {
                field: field.into(),
            })?,
        Symbol::Home => ctx
            .home
            .clone()
            .map(|h| Expanded::Paths(vec![one(h)]))
            .ok_or_else(|| PolicyError::NoHome {
                field: field.into(),
            })?,
        Symbol::Tmp => Expanded::Tmp,
        Symbol::Path(path) => Expanded::Paths(vec![one(path)]),
        Symbol::Minimal => {
            if list != "read" {
                return Err(bad_entry(
                    p,
                    field,
                    Some(":minimal is a read root only".into()),
                ));
            }
            Expanded::Paths(
                MINIMAL_READ
                    .iter()
                    .map(|m| Expansion {
                        optional: true,
                        ..one(PathBuf::from(m))
                    })
                    .collect(),
            )
        }
        Symbol::WorkspaceRoots(sub) => {
            let mut out = Vec::new();
            for (root, request_root) in workspace_roots(field, ctx)? {
                match &sub {
                    None => out.push(Expansion {
                        request_root,
                        ..one(root)
                    }),
                    // A carve-out: taken lexically under the root (its
                    // walk follows and pins what it meets, as any
                    // carve-out's; covering more only denies more).
                    Some(sub) if carve_out => out.push(one(root.join(sub))),
                    Some(sub) => {
                        // The root itself must exist (`?` skips it): its
                        // canonical path is what the subpath must stay in.
                        let canonical = match walk(&root, true) {
                            Ok(w) if w.node.is_some() => w.path,
                            _ if entry.optional => continue,
                            _ => {
                                return Err(PolicyError::MissingRoot {
                                    field: field.into(),
                                    path: root.to_string_lossy().into_owned(),
                                })
                            }
                        };
                        check_request_root(&canonical, &request_root, ctx)?;
                        out.push(Expansion {
                            within: Some(canonical.clone()),
                            ..one(canonical.join(sub))
                        });
                    }
                }
            }
            Expanded::Paths(out)
        }
    })
}

/// Roots must exist (unless optional: then a missing one is skipped); a
/// broken symlink does not. A write root may not be a symlink itself
/// (what it points to could change after the check), optional or not.
fn roots(
    list: &[WirePath],
    name: &str,
    ctx: &Context,
    links: &mut Vec<(PathBuf, PathBuf)>,
) -> Result<Vec<Root>, PolicyError> {
    let mut out = Vec::new();
    for (i, p) in list.iter().enumerate() {
        let field = format!("sandbox.filesystem.{name}.{i}");
        match expand(p, &field, ctx, name)? {
            Expanded::Tmp => out.push(Root::Tmp),
            Expanded::Paths(paths) => {
                for e in paths {
                    let path = e.path;
                    let missing = || PolicyError::MissingRoot {
                        field: field.clone(),
                        path: path.to_string_lossy().into_owned(),
                    };
                    let w = match walk(&path, name != "write") {
                        Ok(w) => w,
                        Err(_) if e.optional => continue,
                        Err(_) => return Err(missing()),
                    };
                    if w.final_link {
                        return Err(PolicyError::SymlinkRoot {
                            field: field.clone(),
                            path: path.to_string_lossy().into_owned(),
                        });
                    }
                    let (dev, ino) = match w.node {
                        Some(id) => id,
                        None if e.optional => continue,
                        None => return Err(missing()),
                    };
                    // Checked on this walk's own result: what is granted.
                    check_request_root(&w.path, &e.request_root, ctx)?;
                    if let Some(within) = &e.within {
                        if !w.path.starts_with(within) {
                            return Err(PolicyError::SubpathEscapes {
                                field: field.clone(),
                                path: path.to_string_lossy().into_owned(),
                                resolved: w.path.to_string_lossy().into_owned(),
                                root: within.to_string_lossy().into_owned(),
                            });
                        }
                    }
                    for (at, to) in w.links {
                        let l = (at.path, to);
                        if !links.contains(&l) {
                            links.push(l);
                        }
                    }
                    let checked = Checked {
                        path: w.path,
                        dev,
                        ino,
                    };
                    if !out
                        .iter()
                        .any(|r| matches!(r, Root::Path(c) if c.path == checked.path))
                    {
                        out.push(Root::Path(checked));
                    }
                }
            }
        }
    }
    Ok(out)
}

/// What one walk of a path found.
#[derive(Debug)]
struct Walk {
    /// Canonical: the existing part with its symlinks resolved, then the
    /// part that does not exist (yet), lexically clean.
    path: PathBuf,
    /// The identity of `path` when all of it exists.
    node: Option<(u64, u64)>,
    /// The symlinks met, in order: where (with the link's own identity)
    /// and what it points to.
    links: Vec<(Checked, PathBuf)>,
    /// The last component is a symlink, not followed.
    final_link: bool,
}

/// Symlinks followed in one walk (the kernel's 40) before the rest is
/// taken lexically.
const MAX_LINKS: usize = 40;

/// Walk the absolute `path` once, component by component, each looked up
/// in the directory the previous one opened (never by a path string
/// again): the canonical path, the symlinks met on the way and the
/// identity of what it names all come from the same look-ups, so a name
/// swapped for a symlink while the agent checks it cannot make the agent
/// check one place and grant or protect another. A final symlink is
/// followed when `follow` (even when it points at nothing yet);
/// otherwise `final_link` is set. From the first component that does not
/// exist (or cannot be searched) on, the rest is kept lexically.
fn walk(path: &Path, follow: bool) -> std::io::Result<Walk> {
    walk_stopping(path, follow, &[])
}

/// [`walk`], looking nothing up at or below a path of `stop` (canonical
/// `deny_read` carve-outs): from there on the rest is kept lexically, as
/// a missing part is, so what such a carve-out holds (files, links) never
/// shapes another carve-out.
fn walk_stopping(path: &Path, follow: bool, stop: &[PathBuf]) -> std::io::Result<Walk> {
    use std::collections::VecDeque;
    use std::ffi::OsString;
    use std::path::Component;
    // The names of `p`, `..` kept; `None` for the root.
    fn parts(p: &Path) -> Vec<Option<OsString>> {
        p.components()
            .filter_map(|c| match c {
                Component::RootDir => Some(None),
                Component::Normal(_) | Component::ParentDir => {
                    Some(Some(c.as_os_str().to_os_string()))
                }
                _ => None,
            })
            .collect()
    }
    let root = look::root()?;
    let mut w = Walk {
        path: PathBuf::from("/"),
        node: None,
        links: Vec::new(),
        final_link: false,
    };
    // The directory `w.path` names (`None`: `/`) and its depth: one
    // descriptor at a time, however deep the tree a request names (`..`
    // opens the parent, as the kernel resolves it).
    let mut cur: Option<look::Dir> = None;
    let mut depth = 0usize;
    // Components that do not exist, after the existing part.
    let mut tail: Vec<OsString> = Vec::new();
    let given = parts(path);
    if given.first() != Some(&None) {
        return Err(std::io::Error::other("not an absolute path"));
    }
    let mut queue: VecDeque<OsString> = given.into_iter().flatten().collect();
    let mut hops = 0;
    while let Some(name) = queue.pop_front() {
        if name == ".." {
            if tail.pop().is_none() && depth > 0 {
                depth -= 1;
                w.path.pop();
                cur = match (depth, &cur) {
                    (0, _) | (_, None) => None,
                    (_, Some(d)) => Some(look::parent(d)?),
                };
            }
            continue;
        }
        if !tail.is_empty() || stop.iter().any(|d| w.path.starts_with(d)) {
            tail.push(name);
            continue;
        }
        let dir = cur.as_ref().unwrap_or(&root);
        match look::child(dir, &name) {
            Ok(look::Found::Node(d)) => {
                w.path.push(&name);
                depth += 1;
                cur = Some(d);
            }
            Ok(look::Found::Link(to, (dev, ino))) => {
                if queue.is_empty() && !follow {
                    w.final_link = true;
                    w.path.push(&name);
                    return Ok(w);
                }
                hops += 1;
                if hops > MAX_LINKS {
                    // A loop (`ln -s .env .env`): where the name leads
                    // cannot be known; it and the rest are kept lexically,
                    // as a missing component is (a root is then missing,
                    // a carve-out covers the link itself).
                    tail.push(name);
                    continue;
                }
                let at = Checked {
                    path: w.path.join(&name),
                    dev,
                    ino,
                };
                w.links.push((at, to.clone()));
                let mut next = Vec::new();
                for c in parts(&to) {
                    match c {
                        None => {
                            cur = None;
                            depth = 0;
                            w.path = PathBuf::from("/");
                        }
                        Some(c) => next.push(c),
                    }
                }
                for c in next.into_iter().rev() {
                    queue.push_front(c);
                }
            }
            Err(_) => tail.push(name),
        }
    }
    if tail.is_empty() {
        w.node = Some(look::identity(cur.as_ref().unwrap_or(&root))?);
    }
    w.path.extend(tail);
    Ok(w)
}

/// The look-ups of [`walk`]: one component in an open directory.
#[cfg(target_os = "linux")]
mod look {
    use nix::fcntl::{openat, readlinkat, OFlag};
    use nix::sys::stat::{fstat, Mode};
    use std::ffi::OsStr;
    use std::os::fd::OwnedFd;
    use std::path::PathBuf;

    /// A node of the walk, open with `O_PATH` (never followed).
    pub type Dir = OwnedFd;

    pub enum Found {
        Node(Dir),
        /// A symlink: its target and its own identity.
        Link(PathBuf, (u64, u64)),
    }

    pub fn root() -> std::io::Result<Dir> {
        Ok(nix::fcntl::open(
            "/",
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?)
    }

    /// `name` in `dir`, not following it; a symlink's target is read from
    /// the symlink opened here (`readlinkat` with an empty path).
    pub fn child(dir: &Dir, name: &OsStr) -> std::io::Result<Found> {
        let fd = openat(
            dir,
            name,
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let st = fstat(&fd)?;
        if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
            return Ok(Found::Link(
                PathBuf::from(readlinkat(&fd, "")?),
                (st.st_dev, st.st_ino),
            ));
        }
        Ok(Found::Node(fd))
    }

    /// The directory above `d` (`..` of `d`, across a mount's root as the
    /// kernel resolves it).
    pub fn parent(d: &Dir) -> std::io::Result<Dir> {
        Ok(openat(
            d,
            "..",
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?)
    }

    pub fn identity(d: &Dir) -> std::io::Result<(u64, u64)> {
        let st = fstat(d)?;
        Ok((st.st_dev, st.st_ino))
    }
}

/// The look-ups of [`walk`] where there is no `O_PATH` (macOS, where only
/// a Seatbelt profile is made from the paths): by path, one component at
/// a time.
#[cfg(not(target_os = "linux"))]
mod look {
    use std::ffi::OsStr;
    use std::os::unix::fs::MetadataExt;
    use std::path::PathBuf;

    pub type Dir = PathBuf;

    pub enum Found {
        Node(Dir),
        Link(PathBuf, (u64, u64)),
    }

    pub fn root() -> std::io::Result<Dir> {
        Ok(PathBuf::from("/"))
    }

    pub fn child(dir: &Dir, name: &OsStr) -> std::io::Result<Found> {
        let p = dir.join(name);
        let m = std::fs::symlink_metadata(&p)?;
        if m.file_type().is_symlink() {
            return Ok(Found::Link(std::fs::read_link(&p)?, (m.dev(), m.ino())));
        }
        Ok(Found::Node(p))
    }

    pub fn parent(d: &Dir) -> std::io::Result<Dir> {
        Ok(d.parent()
            .map_or_else(|| PathBuf::from("/"), |p| p.to_path_buf()))
    }

    pub fn identity(d: &Dir) -> std::io::Result<(u64, u64)> {
        let m = std::fs::symlink_metadata(d)?;
        Ok((m.dev(), m.ino()))
    }
}

/// The canonical path and identity of the existing `path` (symlinks
/// followed), from one walk as a root's ([`walk`]); `None` when some of it
/// does not exist.
pub fn existing(path: &Path) -> Option<Checked> {
    let w = walk(path, true).ok()?;
    let (dev, ino) = w.node?;
    Some(Checked {
        path: w.path,
        dev,
        ino,
    })
}

///
/// Nothing is looked up at or below a `deny_read` carve-out (`stop`, and
/// the `deny_read` ones of this list resolved before, shallowest first):
/// a carve-out there is kept lexically (and dropped by [`resolve`]), so
/// neither its outcome nor its errors tell what the `deny_read` path holds.
fn carve_outs(
    list: &[WirePath],
    name: &str,
    ctx: &Context,
    links: &mut Vec<Checked>,
    stop: &[PathBuf],
) -> Result<Vec<PathBuf>, PolicyError> {
    let mut given: Vec<(String, PathBuf)> = Vec::new();
    for (i, p) in list.iter().enumerate() {
        let field = format!("sandbox.filesystem.{name}.{i}");
        match expand(p, &field, ctx, name)? {
            Expanded::Tmp => return Err(PolicyError::TmpCarveOut { field }),
            Expanded::Paths(paths) => {
                given.extend(paths.into_iter().map(|e| (field.clone(), e.path)))
            }
        }
    }
    // Shallowest first: a deny_read path is known before one named below it.
    let mut order: Vec<usize> = (0..given.len()).collect();
    order.sort_by_key(|&i| given[i].1.components().count());
    let mut stop = stop.to_vec();
    let mut found: Vec<Option<PathBuf>> = vec![None; given.len()];
    for i in order {
        let (field, path) = &given[i];
        // A carve-out names what a process would reach: a symlink is
        // followed, also to what does not exist yet.
        let w = walk_stopping(path, true, &stop).map_err(|e| PolicyError::Unresolvable {
            field: field.clone(),
            path: path.to_string_lossy().into_owned(),
            reason: e.to_string(),
        })?;
        for (at, _) in w.links {
            if !links.contains(&at) {
                links.push(at);
            }
        }
        if name == "deny_read" {
            stop.push(w.path.clone());
        }
        found[i] = Some(w.path);
    }
    let mut out = Vec::new();
    for p in found.into_iter().flatten() {
        if !out.contains(&p) {
            out.push(p);
        }
    }
    Ok(out)
}

/// A carve-out inside a `deny_read` one adds nothing (nothing below a
/// `deny_read` path is reached) and is dropped: never covered, pinned or
/// given a placeholder inside it, so a job's start does not depend on what
/// that path holds.
pub fn drop_nested(deny_read: &mut Vec<PathBuf>, deny_write: &mut Vec<PathBuf>) {
    let all_read = deny_read.clone();
    deny_read.retain(|d| !all_read.iter().any(|r| r != d && d.starts_with(r)));
    deny_write.retain(|d| !all_read.iter().any(|r| d.starts_with(r)));
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
    let write = roots(&fs.write, "write", ctx, &mut links)?;
    let mut deny_read = carve_outs(&fs.deny_read, "deny_read", ctx, &mut carve_out_links, &[])?;
    let mut deny_write = carve_outs(
        &fs.deny_write,
        "deny_write",
        ctx,
        &mut carve_out_links,
        &deny_read,
    )?;
    drop_nested(&mut deny_read, &mut deny_write);
    Ok(Policy {
        read,
        write,
        deny_read,
        deny_write,
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
    use std::os::unix::fs::MetadataExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

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
            ..Context::default()
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
            workspace_roots: None,
        };
        let p = resolve(&intent, &ctx).unwrap();
        assert_eq!(
            p.read.as_deref().map(root_paths),
            Some(vec![d.clone(), "/usr".into()])
        );
        assert_eq!(
            root_paths(&p.write),
            vec![d.join("ws")],
            "duplicates collapse"
        );
        assert_eq!(p.write.last(), Some(&Root::Tmp));
        let Some(Root::Path(ws)) = p.write.first() else {
            panic!("{:?}", p.write)
        };
        let m = std::fs::metadata(d.join("ws")).unwrap();
        assert_eq!((ws.dev, ws.ino), (m.dev(), m.ino()), "the identity travels");
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
        assert!(matches!(e, PolicyError::SymlinkRoot { .. }), "{e}");
        let mut read = mk(vec![]);
        read.filesystem.read = ReadRoots::Paths(vec![link.to_str().unwrap().into()]);
        let e = resolve(&read, &ctx).unwrap_err();
        assert!(matches!(e, PolicyError::MissingRoot { .. }), "{e}");
    }

    #[test]
    fn entries_parse_or_name_why_not() {
        let ok = |s: &str| parse_entry(&s.into()).unwrap();
        assert_eq!(ok("/a").symbol, Symbol::Path("/a".into()));
        assert!(ok("?/a").optional && !ok("/a").optional);
        assert_eq!(ok(":minimal").symbol, Symbol::Minimal);
        assert_eq!(
            ok("?:workspace_roots/.git/hooks").symbol,
            Symbol::WorkspaceRoots(Some(".git/hooks".into()))
        );
        assert_eq!(ok(":workspace_roots").symbol, Symbol::WorkspaceRoots(None));
        for bad in [
            ":workspace_roots/..",
            ":workspace_roots/a/../../etc",
            ":workspace_roots/./a",
            ":workspace_roots//etc",
            ":workspace_roots/",
            ":workspace_roots/a/",
            "??/a",
        ] {
            assert!(
                matches!(parse_entry(&bad.into()), Err(Some(_))),
                "{bad} was accepted"
            );
        }
        for bad in [
            "relative",
            "?relative",
            ":minimals",
            ":workspace_rootsx",
            "",
        ] {
            assert_eq!(parse_entry(&bad.into()), Err(None), "{bad}");
        }
        let nul = WirePath::from_bytes(&b":workspace_roots/a\0b"[..]);
        assert!(matches!(parse_entry(&nul), Err(Some(_))));
    }

    fn intent(read: Option<Vec<&str>>, write: Vec<&str>, deny_write: Vec<&str>) -> SandboxIntent {
        SandboxIntent {
            filesystem: FilesystemIntent {
                read: read.map_or(ReadRoots::All, |r| {
                    ReadRoots::Paths(r.into_iter().map(WirePath::from).collect())
                }),
                write: write.into_iter().map(WirePath::from).collect(),
                deny_write: deny_write.into_iter().map(WirePath::from).collect(),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn minimal_is_the_existing_system_directories_and_read_only() {
        let p = resolve(
            &intent(Some(vec![":minimal"]), vec![], vec![]),
            &Context::default(),
        )
        .unwrap();
        let got = root_paths(&p.read.unwrap());
        let want: Vec<PathBuf> = MINIMAL_READ
            .iter()
            .filter_map(|m| existing(Path::new(m)).map(|c| c.path))
            .collect();
        assert_eq!(got, want);
        assert!(got.contains(&PathBuf::from("/usr")) && got.contains(&PathBuf::from("/etc")));
        for (i, field) in [
            (
                intent(None, vec![":minimal"], vec![]),
                "sandbox.filesystem.write.0",
            ),
            (
                intent(None, vec![], vec![":minimal"]),
                "sandbox.filesystem.deny_write.0",
            ),
        ] {
            let e = resolve(&i, &Context::default()).unwrap_err();
            assert!(matches!(e, PolicyError::BadSymbol { .. }), "{e}");
            assert_eq!(e.field(), field);
        }
    }

    #[test]
    fn an_optional_root_is_skipped_only_when_missing() {
        let d = dir().join("optional");
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("there")).unwrap();
        std::os::unix::fs::symlink(d.join("there"), d.join("link")).unwrap();
        let s = |p: &str| format!("?{}/{p}", d.display());
        let (gone, there, link) = (s("gone"), s("there"), s("link"));
        let p = resolve(
            &intent(Some(vec![&gone, &there]), vec![&gone, &there], vec![]),
            &Context::default(),
        )
        .unwrap();
        assert_eq!(root_paths(&p.read.unwrap()), vec![d.join("there")]);
        assert_eq!(root_paths(&p.write), vec![d.join("there")]);
        // Control: without `?`, the missing root is refused.
        let e = resolve(
            &intent(None, vec![&there, &gone[1..]], vec![]),
            &Context::default(),
        )
        .unwrap_err();
        assert!(matches!(e, PolicyError::MissingRoot { .. }), "{e}");
        assert_eq!(e.field(), "sandbox.filesystem.write.1");
        // Existing but not acceptable is never skipped: a write root that
        // is a symlink.
        let e = resolve(&intent(None, vec![&link], vec![]), &Context::default()).unwrap_err();
        assert!(matches!(e, PolicyError::SymlinkRoot { .. }), "{e}");
        // `?` is for roots: a carve-out may be missing already.
        let e = resolve(&intent(None, vec![], vec![&gone]), &Context::default()).unwrap_err();
        assert!(matches!(e, PolicyError::BadSymbol { .. }), "{e}");
        assert_eq!(e.field(), "sandbox.filesystem.deny_write.0");
    }

    #[test]
    fn subpaths_stay_under_their_workspace_root() {
        let d = dir().join("subpaths");
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("ws/src")).unwrap();
        std::fs::create_dir_all(d.join("outside")).unwrap();
        std::os::unix::fs::symlink(d.join("outside"), d.join("ws/esc")).unwrap();
        let ctx = Context {
            workspace_roots: vec![d.join("ws")],
            ..Context::default()
        };
        let p = resolve(
            &intent(
                None,
                vec![":workspace_roots/src", "?:workspace_roots/gone"],
                vec![":workspace_roots/.git", ":workspace_roots/esc/x"],
            ),
            &ctx,
        )
        .unwrap();
        assert_eq!(root_paths(&p.write), vec![d.join("ws/src")]);
        // Carve-outs: lexically under the root, symlinks followed (and
        // pinned) as for any carve-out: covering more only denies more.
        assert_eq!(p.deny_write, vec![d.join("ws/.git"), d.join("outside/x")]);
        for w in [":workspace_roots/esc", ":workspace_roots/esc/"] {
            let e = resolve(&intent(None, vec![w], vec![]), &ctx).unwrap_err();
            assert!(
                matches!(
                    e,
                    PolicyError::SymlinkRoot { .. } | PolicyError::BadSymbol { .. }
                ),
                "{w}: {e}"
            );
        }
        let e = resolve(
            &intent(Some(vec![":workspace_roots/esc"]), vec![], vec![]),
            &ctx,
        )
        .unwrap_err();
        assert!(matches!(e, PolicyError::SubpathEscapes { .. }), "{e}");
        let e = resolve(&intent(None, vec![":workspace_roots/gone"], vec![]), &ctx).unwrap_err();
        assert!(matches!(e, PolicyError::MissingRoot { .. }), "{e}");
    }

    #[test]
    fn request_workspace_roots_stay_within_the_profiles() {
        let d = dir().join("request-roots");
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("ws/sub")).unwrap();
        std::fs::create_dir_all(d.join("outside")).unwrap();
        std::os::unix::fs::symlink(d.join("outside"), d.join("ws/esc")).unwrap();
        let ctx = |roots: Vec<PathBuf>, bound: Option<Vec<PathBuf>>| Context {
            workspace_roots: roots,
            request_roots_within: Some(bound),
            ..Context::default()
        };
        let w = intent(None, vec![":workspace_roots"], vec![]);
        let bound = Some(vec![d.join("ws")]);
        // Within: granted.
        let p = resolve(&w, &ctx(vec![d.join("ws/sub")], bound.clone())).unwrap();
        assert_eq!(root_paths(&p.write), vec![d.join("ws/sub")]);
        // Outside, directly or through a link inside: policy, naming the
        // request's root.
        // (A write root that is a link is refused anyway; as a read root
        // the link is followed, out of the profile's roots.)
        let r = intent(Some(vec![":workspace_roots"]), vec![], vec![]);
        for (i, roots, field) in [
            (
                &w,
                vec![d.join("ws/sub"), d.join("outside")],
                "sandbox.workspace_roots.1",
            ),
            (&r, vec![d.join("ws/esc")], "sandbox.workspace_roots.0"),
            (&w, vec![PathBuf::from("/")], "sandbox.workspace_roots.0"),
        ] {
            let e = resolve(i, &ctx(roots, bound.clone())).unwrap_err();
            assert!(e.is_wider_than_profile(), "{e}");
            assert_eq!(e.field(), field);
        }
        // A subpath of a request root outside the profile's is refused too.
        let sub = intent(None, vec![":workspace_roots/x"], vec![]);
        std::fs::create_dir_all(d.join("outside/x")).unwrap();
        let e = resolve(&sub, &ctx(vec![d.join("outside")], bound.clone())).unwrap_err();
        assert!(e.is_wider_than_profile(), "{e}");
        // Without profile roots, the request's are its own.
        let p = resolve(&w, &ctx(vec![d.join("outside")], None)).unwrap();
        assert_eq!(root_paths(&p.write), vec![d.join("outside")]);
    }

    /// Run `swap` in a loop on another thread while `check` runs `n`
    /// times.
    fn racing(swap: impl Fn() + Send + 'static, n: usize, mut check: impl FnMut()) {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let t = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                swap();
            }
        });
        for _ in 0..n {
            check();
        }
        stop.store(true, Ordering::Relaxed);
        t.join().unwrap();
    }

    /// A tree for the race tests: `ws/<name>` (a directory) and
    /// `outside/<name>`, canonical.
    fn race_dirs(test: &str, name: &str) -> (PathBuf, PathBuf) {
        let d = dir().join(test);
        let _ = std::fs::remove_dir_all(&d);
        for p in ["ws", "outside"] {
            std::fs::create_dir_all(d.join(p).join(name).join("sub")).unwrap();
        }
        (d.join("ws"), d.join("outside"))
    }

    /// `ws/<name>` swapped for a symlink to `outside/<name>` and back.
    fn swapper(ws: &Path, outside: &Path, name: &str) -> impl Fn() + Send + 'static {
        let (real, parked, target) = (
            ws.join(name),
            ws.join(format!("{name}-parked")),
            outside.join(name),
        );
        move || {
            if std::fs::rename(&real, &parked).is_ok() {
                let _ = std::os::unix::fs::symlink(&target, &real);
                let _ = std::fs::remove_file(&real);
                let _ = std::fs::rename(&parked, &real);
            }
        }
    }

    fn write_root(p: &Path) -> SandboxIntent {
        SandboxIntent {
            filesystem: FilesystemIntent {
                write: vec![p.to_str().unwrap().into()],
                ..Default::default()
            },
            ..Default::default()
        }
    }

    // A write root swapped for a symlink while it is resolved names the
    // directory itself or is refused; it never names where the link
    // points (the check that it is not a symlink and the resolution were
    // two look-ups: the link could be followed by one and gone for the
    // other).
    #[test]
    fn a_write_root_swapped_for_a_link_is_never_followed() {
        let (ws, outside) = race_dirs("swap-root", "sub");
        let real = std::fs::metadata(ws.join("sub")).unwrap();
        let intent = write_root(&ws.join("sub"));
        let (mut named, mut refused) = (0, 0);
        racing(swapper(&ws, &outside, "sub"), 20_000, || {
            match resolve(&intent, &Context::default()) {
                Ok(p) => {
                    let Some(Root::Path(c)) = p.write.first() else {
                        panic!("{:?}", p.write)
                    };
                    // The directory itself, where it was at that moment
                    // (its name, or the name it was parked under).
                    assert!(
                        [ws.join("sub"), ws.join("sub-parked")].contains(&c.path),
                        "followed the swapped link: {}",
                        c.path.display()
                    );
                    assert_eq!((c.dev, c.ino), (real.dev(), real.ino()));
                    named += 1;
                }
                Err(PolicyError::SymlinkRoot { .. } | PolicyError::MissingRoot { .. }) => {
                    refused += 1
                }
                Err(e) => panic!("{e}"),
            }
        });
        // Both states were met: the race ran.
        assert!(named > 0 && refused > 0, "{named} named, {refused} refused");
    }

    // The parent of a root swapped for a symlink: the root resolves to
    // wherever the name led at one moment, and its identity is that
    // place's, never one place's path with the other's identity.
    #[test]
    fn a_root_under_a_swapped_parent_keeps_path_and_identity_together() {
        let (ws, outside) = race_dirs("swap-parent", "a");
        let ids = |p: &Path| {
            let m = std::fs::metadata(p).unwrap();
            (m.dev(), m.ino())
        };
        let (inside_id, outside_id) = (ids(&ws.join("a/sub")), ids(&outside.join("a/sub")));
        for follow in [false, true] {
            let mut intent = write_root(&ws.join("a/sub"));
            if follow {
                intent.filesystem.read = ReadRoots::Paths(intent.filesystem.write.clone());
                intent.filesystem.write.clear();
            }
            let (mut inside, mut elsewhere) = (0, 0);
            racing(swapper(&ws, &outside, "a"), 20_000, || {
                let Ok(p) = resolve(&intent, &Context::default()) else {
                    return;
                };
                let roots = if follow { p.read.unwrap() } else { p.write };
                let Some(Root::Path(c)) = roots.first() else {
                    panic!("{roots:?}")
                };
                if [ws.join("a/sub"), ws.join("a-parked/sub")].contains(&c.path) {
                    assert_eq!((c.dev, c.ino), inside_id);
                    inside += 1;
                } else {
                    assert_eq!(c.path, outside.join("a/sub"));
                    assert_eq!((c.dev, c.ino), outside_id);
                    elsewhere += 1;
                }
            });
            assert!(
                inside > 0 && elsewhere > 0,
                "{inside} inside, {elsewhere} elsewhere"
            );
        }
    }

    // A carve-out under a parent swapped for a symlink: either the name
    // led through the link (then the carve-out is where it led and the
    // link is among the links to pin, so the job cannot swap it back) or
    // it did not (the carve-out is the name itself). Never the place the
    // link led with no link to pin: the job would then write the real
    // `.git/hooks` once the link is gone.
    #[test]
    fn a_carve_out_under_a_swapped_parent_names_the_link_it_went_through() {
        let (ws, outside) = race_dirs("swap-carve-out", ".git");
        let mut intent = write_root(&ws);
        intent.filesystem.deny_write = vec![ws.join(".git/sub").to_str().unwrap().into()];
        let (mut direct, mut through) = (0, 0);
        racing(swapper(&ws, &outside, ".git"), 20_000, || {
            let p = resolve(&intent, &Context::default()).unwrap();
            let linked = p.carve_out_links.iter().any(|l| l.path == ws.join(".git"));
            match p.deny_write.as_slice() {
                [c] if *c == outside.join(".git/sub") => {
                    assert!(linked, "went through a link it does not pin");
                    through += 1;
                }
                [c] if [ws.join(".git/sub"), ws.join(".git-parked/sub")].contains(c) => {
                    assert!(!linked, "{:?}", p.carve_out_links);
                    direct += 1;
                }
                other => panic!("{other:?}"),
            }
        });
        assert!(
            direct > 0 && through > 0,
            "{direct} direct, {through} through"
        );
    }

    // A symlink loop (which a job can make: `ln -s .env .env`) in a
    // carve-out is taken lexically from the looping name on, never an
    // error that would fail every later request of a profile naming it; a
    // root through a loop is missing.
    #[test]
    fn a_symlink_loop_is_kept_lexically() {
        let d = dir().join("loops");
        let _ = std::fs::remove_dir_all(&d);
        let ws = d.join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        std::os::unix::fs::symlink(".env", ws.join(".env")).unwrap();
        std::os::unix::fs::symlink("b", ws.join("a")).unwrap();
        std::os::unix::fs::symlink("a", ws.join("b")).unwrap();
        let mut intent = write_root(&ws);
        intent.filesystem.deny_read = vec![
            ws.join(".env").to_str().unwrap().into(),
            ws.join("a/x").to_str().unwrap().into(),
        ];
        let p = resolve(&intent, &Context::default()).unwrap();
        assert_eq!(p.deny_read.len(), 2, "{:?}", p.deny_read);
        assert_eq!(p.deny_read[0], ws.join(".env"));
        assert!(
            p.deny_read[1].starts_with(&ws) && p.deny_read[1].ends_with("x"),
            "{:?}",
            p.deny_read[1]
        );
        assert!(p.carve_out_links.iter().any(|l| l.path == ws.join(".env")));
        let e = resolve(&write_root(&ws.join("a/x")), &Context::default()).unwrap_err();
        assert!(matches!(e, PolicyError::MissingRoot { .. }), "{e}");
    }

    // A root at the bottom of a tree deeper than the descriptors the agent
    // may hold (a job can make one): the walk holds one directory open at a
    // time, so it resolves; `..` on the way opens the parent. In a forked
    // child with `RLIMIT_NOFILE` 32 and a tree 100 deep.
    #[test]
    fn a_deep_tree_is_walked_with_one_descriptor_at_a_time() {
        let base = dir().join("deep");
        let _ = std::fs::remove_dir_all(&base);
        let mut bottom = base.clone();
        for _ in 0..100 {
            bottom.push("d");
        }
        std::fs::create_dir_all(bottom.join("x")).unwrap();
        let via_dotdot = bottom.join("x/../x");
        let child = || -> Result<(), String> {
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, 32, 32)
                .map_err(|e| e.to_string())?;
            let p = resolve(&write_root(&via_dotdot), &Context::default())
                .map_err(|e| e.to_string())?;
            match p.write.first() {
                Some(Root::Path(c)) if c.path == bottom.join("x") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        };
        executor_sys::in_forked_child(child).unwrap();
        let _ = std::fs::remove_dir_all(base);
    }
}
