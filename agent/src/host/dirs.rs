//! Where session hosts put their sockets, and how many of them are alive.
//!
//! A new host's socket goes in the first of these directories that is this
//! user's own:
//!
//! 1. `$XDG_RUNTIME_DIR/executor`, when `$XDG_RUNTIME_DIR` is set, absolute,
//!    and (by `lstat`) a directory owned by the user that neither group nor
//!    others may write to;
//! 2. `$TMPDIR/executor-<uid>` (`/tmp/executor-<uid>` without `$TMPDIR`);
//! 3. `$HOME/.cache/executor/run`, created with its parents.
//!
//! The directory is created mode 0700 and used only when `lstat` shows a
//! directory (not a symlink) owned by the user with no access for group or
//! others. Anyone may take the name `/tmp/executor-<uid>` first in a shared
//! `/tmp`: that directory is refused and the next one tried. When all are
//! refused, the error names each and why. A resume looks for the socket in
//! the same directories, in the same order, and never creates one.
//!
//! A live host holds an exclusive `flock` on `<socket>.lock` beside its
//! socket. The file is made under another name, locked and then renamed,
//! so a `.sock.lock` file that nobody holds belongs to a host that is gone:
//! counting held ones counts live hosts ([`RuntimeEnv::live_hosts`], the
//! bound `max_detached_sessions`), and unheld ones are removed with their
//! socket when counted.

use nix::fcntl::{Flock, FlockArg};
use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A host's lock file is named by its socket's (`V-ID.sock`) and `.lock`.
const LOCK_SUFFIX: &str = ".sock.lock";
/// Held while a relay counts the live hosts and starts one.
const STARTING_LOCK: &str = "starting.lock";
/// The longest socket path: `sun_path` holds 108 bytes with the NUL.
const MAX_SOCKET_PATH: usize = 107;

/// Why a directory was not used for sockets.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DirRefusal {
    #[error("not set")]
    Unset,
    #[error("not an absolute path")]
    NotAbsolute,
    #[error("is a symbolic link")]
    Symlink,
    #[error("is not a directory")]
    NotADirectory,
    #[error("is owned by uid {owner}, not {uid}")]
    Owner { owner: u32, uid: u32 },
    #[error("has mode {mode:04o}: group or others may write to it")]
    Writable { mode: u32 },
    #[error("has mode {mode:04o}: group or others have access (0700 needed)")]
    NotPrivate { mode: u32 },
    #[error("is {len} bytes long: a socket in it would not fit a socket address (at most {max})")]
    TooLong { len: usize, max: usize },
    #[error("{0}")]
    Io(std::io::Error),
}

/// One directory refused, and why.
#[derive(Debug)]
pub struct Refused {
    /// The path, or the variable that did not give one (`$HOME`).
    pub what: String,
    pub why: DirRefusal,
}

/// Every candidate directory for sockets was refused.
#[derive(Debug, thiserror::Error)]
#[error("no private directory for session host sockets: {}", list(.refused))]
pub struct NoSocketDir {
    pub refused: Vec<Refused>,
}

fn list(refused: &[Refused]) -> String {
    refused
        .iter()
        .map(|r| format!("{}: {}", r.what, r.why))
        .collect::<Vec<_>>()
        .join("; ")
}

/// What the socket directories are derived from: the user and the
/// agent's environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeEnv {
    pub uid: u32,
    /// `$XDG_RUNTIME_DIR` (`None` when unset or empty).
    pub xdg_runtime_dir: Option<PathBuf>,
    /// The temporary directory (`$TMPDIR`, else `/tmp`).
    pub tmp: PathBuf,
    /// `$HOME` (`None` when unset or empty).
    pub home: Option<PathBuf>,
}

fn non_empty(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// A candidate: the directory, and whether its parents may be created.
struct Candidate {
    dir: PathBuf,
    parents: bool,
}

impl RuntimeEnv {
    /// This process's user and environment.
    pub fn current() -> RuntimeEnv {
        RuntimeEnv {
            uid: nix::unistd::getuid().as_raw(),
            xdg_runtime_dir: non_empty("XDG_RUNTIME_DIR"),
            tmp: std::env::temp_dir(),
            home: non_empty("HOME"),
        }
    }

    /// The candidates in the order tried, each a directory to use or why
    /// there is none.
    fn candidates(&self) -> [Result<Candidate, Refused>; 3] {
        let xdg = match &self.xdg_runtime_dir {
            None => Err(Refused {
                what: "$XDG_RUNTIME_DIR".into(),
                why: DirRefusal::Unset,
            }),
            Some(base) => check_base(base, self.uid)
                .map(|()| Candidate {
                    dir: base.join("executor"),
                    parents: false,
                })
                .map_err(|why| Refused {
                    what: format!("$XDG_RUNTIME_DIR {}", base.display()),
                    why,
                }),
        };
        let tmp = self.tmp.join(format!("executor-{}", self.uid));
        let tmp = if tmp.is_absolute() {
            Ok(Candidate {
                dir: tmp,
                parents: false,
            })
        } else {
            Err(Refused {
                what: tmp.display().to_string(),
                why: DirRefusal::NotAbsolute,
            })
        };
        let cache = match &self.home {
            None => Err(Refused {
                what: "$HOME".into(),
                why: DirRefusal::Unset,
            }),
            Some(home) if !home.is_absolute() => Err(Refused {
                what: format!("$HOME {}", home.display()),
                why: DirRefusal::NotAbsolute,
            }),
            Some(home) => Ok(Candidate {
                dir: home.join(".cache/executor/run"),
                parents: true,
            }),
        };
        [xdg, tmp, cache]
    }

    /// Where a new host's socket goes: the first candidate that is, or can
    /// be made, this user's private directory.
    pub fn socket_dir(&self) -> Result<PathBuf, NoSocketDir> {
        let mut refused = Vec::new();
        for candidate in self.candidates() {
            let c = match candidate {
                Ok(c) => c,
                Err(r) => {
                    refused.push(r);
                    continue;
                }
            };
            match fits(&c.dir).and_then(|()| make_private(&c.dir, c.parents, self.uid)) {
                Ok(()) => return Ok(c.dir),
                Err(why) => refused.push(Refused {
                    what: c.dir.display().to_string(),
                    why,
                }),
            }
        }
        Err(NoSocketDir { refused })
    }

    /// The candidates that exist and are this user's private directories,
    /// in order, without creating any: where hosts may be found.
    pub fn existing_dirs(&self) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = Vec::new();
        for c in self.candidates().into_iter().flatten() {
            if check_private(&c.dir, self.uid).is_ok() && !dirs.contains(&c.dir) {
                dirs.push(c.dir);
            }
        }
        dirs
    }

    /// The socket of `session_id`, wherever its host put it.
    pub fn find_socket(&self, session_id: &str) -> Option<PathBuf> {
        self.existing_dirs()
            .iter()
            .filter_map(|d| super::socket_path(d, session_id))
            .find(|s| std::fs::symlink_metadata(s).is_ok())
    }

    /// How many session hosts of this user are alive (hold their lock),
    /// in every directory they may be in. Lock files nobody holds are
    /// removed, with their sockets.
    pub fn live_hosts(&self) -> usize {
        self.existing_dirs().iter().map(|d| live_hosts_in(d)).sum()
    }
}

/// Whether a socket of this agent fits in `dir`.
fn fits(dir: &Path) -> Result<(), DirRefusal> {
    use std::os::unix::ffi::OsStrExt;
    let name = super::socket_path(Path::new(""), &"0".repeat(32)).expect("a valid id");
    let max = MAX_SOCKET_PATH - 1 - name.as_os_str().len();
    let len = dir.as_os_str().as_bytes().len();
    if len > max {
        return Err(DirRefusal::TooLong { len, max });
    }
    Ok(())
}

/// `$XDG_RUNTIME_DIR` itself: absolute, a directory (not a symlink) of
/// `uid` that group and others cannot write to.
fn check_base(base: &Path, uid: u32) -> Result<(), DirRefusal> {
    if !base.is_absolute() {
        return Err(DirRefusal::NotAbsolute);
    }
    let m = owned_dir(base, uid)?;
    if m.mode() & 0o022 != 0 {
        return Err(DirRefusal::Writable {
            mode: m.mode() & 0o7777,
        });
    }
    Ok(())
}

/// A directory (by `lstat`: not a symlink) owned by `uid`.
fn owned_dir(dir: &Path, uid: u32) -> Result<std::fs::Metadata, DirRefusal> {
    let m = std::fs::symlink_metadata(dir).map_err(DirRefusal::Io)?;
    if m.file_type().is_symlink() {
        return Err(DirRefusal::Symlink);
    }
    if !m.is_dir() {
        return Err(DirRefusal::NotADirectory);
    }
    if m.uid() != uid {
        return Err(DirRefusal::Owner {
            owner: m.uid(),
            uid,
        });
    }
    Ok(m)
}

/// A directory (not a symlink) of `uid` with no access for group or
/// others.
fn check_private(dir: &Path, uid: u32) -> Result<(), DirRefusal> {
    let m = owned_dir(dir, uid)?;
    if m.mode() & 0o077 != 0 {
        return Err(DirRefusal::NotPrivate {
            mode: m.mode() & 0o7777,
        });
    }
    Ok(())
}

/// Create `dir` 0700 (and its missing parents 0700 when `parents`), then
/// check that it is private, whoever made it.
fn make_private(dir: &Path, parents: bool, uid: u32) -> Result<(), DirRefusal> {
    match std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(parents)
        .create(dir)
    {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        // A symlink or a file in the way says more than the error would.
        Err(e) => {
            return Err(match std::fs::symlink_metadata(dir) {
                Ok(_) => check_private(dir, uid).err().unwrap_or(DirRefusal::Io(e)),
                Err(_) => DirRefusal::Io(e),
            })
        }
    }
    check_private(dir, uid)
}

/// Held hosts' locks in `dir`; unheld ones (and their sockets) removed.
fn live_hosts_in(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut live = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(LOCK_SUFFIX)) else {
            continue;
        };
        let socket_name = format!("{stem}.sock");
        let Ok(f) = File::open(e.path()) else {
            continue; // gone meanwhile: its host ended
        };
        match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
            Ok(stale) => {
                // Born locked and held for the host's life: its host is
                // gone. Removed while held, so a second counter finds
                // nothing to do.
                let _ = std::fs::remove_file(dir.join(&socket_name));
                let _ = std::fs::remove_file(e.path());
                drop(stale);
            }
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => live += 1,
            Err((_, e)) => {
                tracing::warn!(file = %name.to_string_lossy(), error = %e, "cannot check a session host's lock")
            }
        }
    }
    live
}

/// A session host's lock, held for its life and removed when dropped.
#[derive(Debug)]
pub struct HostLock {
    path: PathBuf,
    _held: Flock<File>,
}

impl HostLock {
    /// Take the lock of the host serving `socket`: made under a temporary
    /// name, locked, then renamed, so that under its own name it is never
    /// unheld while its host lives.
    pub fn take(socket: &Path) -> std::io::Result<HostLock> {
        let mut name = socket.file_name().unwrap_or_default().to_os_string();
        name.push(".lock");
        let path = socket.with_file_name(&name);
        name.push(".new");
        let new = socket.with_file_name(name);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&new)?;
        let held = Flock::lock(f, FlockArg::LockExclusiveNonblock)
            .map_err(|(_, e)| std::io::Error::from(e))?;
        std::fs::rename(&new, &path)?;
        Ok(HostLock { path, _held: held })
    }
}

impl Drop for HostLock {
    fn drop(&mut self) {
        // Removed before the lock is released (the field drops after).
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Held while a relay counts the live hosts and starts one: two relays
/// starting hosts in one directory cannot both count room for one.
#[derive(Debug)]
pub struct StartingLock {
    _held: Flock<File>,
}

/// How long a relay waits for another to finish starting its host (a
/// start takes at most the host's ready timeout of 10 s).
const STARTING_WAIT: Duration = Duration::from_secs(15);

impl StartingLock {
    /// Take the starting lock of `dir`, waiting for another relay's start.
    pub async fn take(dir: &Path) -> std::io::Result<StartingLock> {
        let path = dir.join(STARTING_LOCK);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)?;
        let deadline = Instant::now() + STARTING_WAIT;
        loop {
            match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
                Ok(held) => return Ok(StartingLock { _held: held }),
                Err((back, nix::errno::Errno::EWOULDBLOCK)) if Instant::now() < deadline => {
                    f = back;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err((_, e)) => {
                    return Err(std::io::Error::other(format!(
                        "{}: another session host start holds it: {e}",
                        path.display()
                    )))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A fresh directory with a short name: the socket directories below
    /// it must leave room for a socket's name in 108 bytes.
    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("exd-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        d
    }

    fn env(root: &Path) -> RuntimeEnv {
        let uid = nix::unistd::getuid().as_raw();
        let xdg = root.join("xdg");
        std::fs::create_dir(&xdg).unwrap();
        std::fs::set_permissions(&xdg, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::create_dir(root.join("tmp")).unwrap();
        std::fs::create_dir(root.join("home")).unwrap();
        RuntimeEnv {
            uid,
            xdg_runtime_dir: Some(xdg),
            tmp: root.join("tmp"),
            home: Some(root.join("home")),
        }
    }

    #[test]
    fn each_candidate_is_taken_in_order_when_the_ones_before_are_refused() {
        let root = scratch("order");
        let mut e = env(&root);
        assert_eq!(e.socket_dir().unwrap(), root.join("xdg/executor"));
        // $XDG_RUNTIME_DIR writable by others: refused, /tmp next.
        std::fs::set_permissions(root.join("xdg"), std::fs::Permissions::from_mode(0o777)).unwrap();
        let tmp = root.join(format!("tmp/executor-{}", e.uid));
        assert_eq!(e.socket_dir().unwrap(), tmp);
        // The /tmp name taken with the wrong mode: the cache, parents made.
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
        let cache = root.join("home/.cache/executor/run");
        assert_eq!(e.socket_dir().unwrap(), cache);
        let m = std::fs::symlink_metadata(root.join("home/.cache/executor")).unwrap();
        assert_eq!(m.mode() & 0o777, 0o700);
        // A lookup sees only the private ones, in order.
        assert_eq!(e.existing_dirs(), vec![cache.clone()]);
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(e.existing_dirs(), vec![tmp.clone(), cache.clone()]);
        // Unset variables are refused, not guessed.
        e.xdg_runtime_dir = None;
        e.home = None;
        assert_eq!(e.socket_dir().unwrap(), tmp);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn when_every_candidate_is_refused_the_error_names_each_and_why() {
        let root = scratch("refused");
        let mut e = env(&root);
        e.xdg_runtime_dir = Some("relative/run".into());
        // The /tmp name is a symlink to a private directory of ours.
        let elsewhere = root.join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o700)).unwrap();
        let tmp = root.join(format!("tmp/executor-{}", e.uid));
        std::os::unix::fs::symlink(&elsewhere, &tmp).unwrap();
        // ~/.cache is a file: the cache directory cannot be made.
        std::fs::write(root.join("home/.cache"), "").unwrap();
        let err = e.socket_dir().unwrap_err();
        let shown = err.to_string();
        assert_eq!(err.refused.len(), 3, "{shown}");
        assert!(
            shown.contains("$XDG_RUNTIME_DIR relative/run: not an absolute path"),
            "{shown}"
        );
        assert!(
            shown.contains(&format!("{}: is a symbolic link", tmp.display())),
            "{shown}"
        );
        let cache = root.join("home/.cache/executor/run");
        assert!(shown.contains(&format!("{}: ", cache.display())), "{shown}");
        assert!(e.existing_dirs().is_empty());
        // Positive control: the symlink replaced by a private directory.
        std::fs::remove_file(&tmp).unwrap();
        assert_eq!(e.socket_dir().unwrap(), tmp);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_directory_too_long_for_a_socket_address_is_refused() {
        let root = scratch("long");
        let mut e = env(&root);
        e.xdg_runtime_dir = None;
        e.home = None;
        e.tmp = root.join("t".repeat(80));
        std::fs::create_dir(&e.tmp).unwrap();
        let err = e.socket_dir().unwrap_err();
        assert!(
            matches!(err.refused[1].why, DirRefusal::TooLong { .. }),
            "{err}"
        );
        assert!(!e.tmp.join(format!("executor-{}", e.uid)).exists());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn live_hosts_counts_held_locks_and_removes_unheld_ones_with_their_socket() {
        let root = scratch("count");
        let e = env(&root);
        let dir = e.socket_dir().unwrap();
        let a = HostLock::take(&dir.join("v-a.sock")).unwrap();
        let b = HostLock::take(&dir.join("v-b.sock")).unwrap();
        std::fs::write(dir.join("v-b.sock"), "").unwrap();
        assert_eq!(e.live_hosts(), 2);
        // A host killed without its drop: its lock file stays, unheld.
        let stale = dir.join("v-c.sock.lock");
        std::fs::write(&stale, "").unwrap();
        std::fs::write(dir.join("v-c.sock"), "").unwrap();
        assert_eq!(e.live_hosts(), 2);
        assert!(!stale.exists() && !dir.join("v-c.sock").exists());
        // Held ones are left alone.
        assert!(dir.join("v-b.sock").exists());
        drop(a);
        assert!(!dir.join("v-a.sock.lock").exists());
        assert_eq!(e.live_hosts(), 1);
        drop(b);
        assert_eq!(e.live_hosts(), 0);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
