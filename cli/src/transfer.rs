//! `get` and `put`, with scp's habits: a directory (or `.`) destination
//! takes the source's name, `-` is stdout / stdin, relative remote paths
//! are taken against the remote home, modes are kept (a new local file or
//! directory less the umask; a directory also gets the owner's rwx, as
//! scp gives it), `-p` keeps exact modes and mtimes too (a `put` also the
//! atime), `-r` copies trees (walk-driven, one atomic file at
//! a time, symlinks kept as links and made after everything else; locally
//! every entry is made by `*at` calls beneath the opened destination, each
//! component `O_NOFOLLOW`, so no link there is ever written through, one a
//! remote tree or an earlier source made included). A file
//! appears whole or not at all: a failed or interrupted `get` removes its
//! temp file, and an unfinished `put` is discarded by the agent.

use super::files::Remote;
use super::quote;
use super::sandbox::SandboxArgs;
use anyhow::Context;
use executor_client::fs::NewFile;
use executor_client::protocol::types::fs::{FileKind, StatResult};
use executor_client::protocol::WirePath;
use executor_client::Client;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The flags `get` and `put` share.
#[derive(Debug, clap::Args)]
pub struct CopyFlags {
    /// Keep each file's modification time (`put` also its access time)
    /// and modes exactly (without -p they are kept less the local umask for
    /// `get`; a directory gets the owner's rwx added, as with scp);
    /// directories and symlinks get new times.
    #[arg(short = 'p')]
    pub preserve: bool,
    /// Copy directories and what they hold; a symlink inside is copied as
    /// a link holding the same target (never followed); devices, FIFOs and
    /// sockets are skipped with a message.
    #[arg(short = 'r')]
    pub recursive: bool,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
}

#[derive(Debug, clap::Args)]
pub struct GetArgs {
    #[command(flatten)]
    pub flags: CopyFlags,
    /// Remote sources, then the local destination (`-`: stdout).
    #[arg(required = true, num_args = 2.., value_name = "REMOTE... LOCAL")]
    pub paths: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct PutArgs {
    #[command(flatten)]
    pub flags: CopyFlags,
    /// Local sources (`-`: stdin), then the remote destination.
    #[arg(required = true, num_args = 2.., value_name = "LOCAL... REMOTE")]
    pub paths: Vec<String>,
}

/// The last component of a path (`/` and `.` have none).
fn base_name(path: &str) -> anyhow::Result<&str> {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty() && *n != "." && *n != "..")
        .ok_or_else(|| anyhow::anyhow!("{path:?} has no file name to copy to"))
}

/// `get`
pub async fn get(client: &Client, args: GetArgs) -> anyhow::Result<i32> {
    let mut remote = Remote::new(client);
    let c = remote.confined(&args.flags.sandbox).await?;
    let (dest, sources) = args.paths.split_last().expect("clap: at least 2");
    if dest == "-" {
        super::files::to_stdout(&c, &mut remote, sources).await?;
        return Ok(0);
    }
    let into_dir = Path::new(dest).is_dir() || dest.ends_with('/');
    if sources.len() > 1 && !into_dir {
        return Err(anyhow::anyhow!("{dest}: not a directory (several sources)"));
    }
    for s in sources {
        let path = remote.path(s).await?;
        let st = c.stat(path.as_str()).await?;
        let local = if into_dir {
            Path::new(dest).join(base_name(&path)?)
        } else {
            PathBuf::from(dest)
        };
        let copy = Copy {
            client: &c,
            preserve: args.flags.preserve,
        };
        match st.kind {
            FileKind::Dir if args.flags.recursive => copy.get_tree(&path, &st, &local).await?,
            FileKind::Dir => {
                return Err(anyhow::anyhow!("{path}: a directory (use -r)"));
            }
            _ => {
                let bar = progress(st.size, &format!("get {}", quote::name(path.as_bytes())));
                copy.get_file(path.as_str(), &st, Local::of_path(&local)?, &bar)
                    .await?;
                bar.finish_and_clear();
            }
        }
    }
    Ok(0)
}

/// One `get` or `put` of files, under one client.
struct Copy<'a> {
    client: &'a Client,
    preserve: bool,
}

impl Copy<'_> {
    /// One remote file into `local`, atomically (a temp file beside it).
    async fn get_file(
        &self,
        remote: impl Into<WirePath>,
        st: &StatResult,
        local: Local,
        bar: &indicatif::ProgressBar,
    ) -> anyhow::Result<()> {
        // Made with the remote mode (less the umask), as scp and cp make
        // a new file; `-p` sets it exactly below.
        let mut part = PartFile::beside(local, st.mode & 0o777)?;
        self.client
            .read_stream_into_with(remote, part.file.as_fd(), |n| bar.inc(n))
            .await
            .map_err(|e| match e {
                executor_client::Error::Sink(e) => {
                    anyhow::Error::new(e).context(format!("writing {}", part.shown().display()))
                }
                e => e.into(),
            })?;
        if self.preserve {
            part.preserve(st)?;
        }
        part.commit()
    }

    /// A remote tree into `local` (made if missing). Each directory made
    /// gets its remote mode with the owner's rwx added (so the copy can
    /// fill it), less the umask, as scp makes them; `-p` sets every
    /// directory's exact mode once the tree is complete.
    async fn get_tree(&self, root: &str, root_st: &StatResult, local: &Path) -> anyhow::Result<()> {
        let mut entries = Vec::new();
        let mut errors = Vec::new();
        self.client
            .walk(executor_client::fs::walk_params(root), |page| {
                entries.extend(page.entries.iter().cloned());
                errors.extend(page.errors.iter().map(|e| {
                    format!(
                        "{}: {}",
                        quote::name(e.path.as_bytes()),
                        quote::message(&e.message)
                    )
                }));
            })
            .await?;
        if let Some(first) = errors.first() {
            return Err(anyhow::anyhow!("get -r {root}: cannot read {first}"));
        }
        let total = entries
            .iter()
            .filter(|e| e.kind == FileKind::File)
            .map(|e| e.size)
            .sum();
        let bar = progress(total, &format!("get {}", quote::name(root.as_bytes())));
        mkdir_local(local, dir_mode(root_st.mode))?;
        let tree = LocalTree::open(local)?;
        let mut links = Vec::new();
        let mut dirs = vec![(PathBuf::new(), root_st.mode)];
        for e in &entries {
            let rel = plain_relative(e.path.as_bytes())?;
            // The remote name's bytes as they are (not UTF-8 either).
            let mut from = root.trim_end_matches('/').as_bytes().to_vec();
            from.push(b'/');
            from.extend_from_slice(e.path.as_bytes());
            let from = WirePath::from_bytes(from);
            match e.kind {
                FileKind::Dir => {
                    let st = self.client.stat_with(from.clone(), false).await?;
                    drop(tree.dir_with_mode(rel, dir_mode(st.mode))?);
                    dirs.push((rel.to_path_buf(), st.mode));
                }
                FileKind::File => {
                    let st = self.client.stat_with(from.clone(), false).await?;
                    self.get_file(from, &st, tree.entry(rel)?, &bar).await?;
                }
                FileKind::Symlink => links.push((from, rel)),
                _ => say!(
                    "executor-client: get -r: {}: not a regular file, directory or symlink, skipped",
                    quote::name(from.as_bytes())
                ),
            }
        }
        // Links last: nothing of this copy is written through one.
        for (from, rel) in links {
            let target = self.client.read_link(from).await?;
            link_local(
                tree.entry(rel)?,
                std::ffi::OsStr::from_bytes(target.as_bytes()),
            )?;
        }
        if self.preserve {
            for (rel, mode) in &dirs {
                let fd = tree.dir(rel)?;
                nix::sys::stat::fchmod(
                    &fd,
                    nix::sys::stat::Mode::from_bits_truncate(mode & 0o7777),
                )
                .map_err(std::io::Error::from)
                .with_context(|| {
                    format!("setting the mode of {}", tree.path.join(rel).display())
                })?;
            }
        }
        bar.finish_and_clear();
        Ok(())
    }

    /// One local file (or stdin, `-`) to `remote`.
    async fn put_file(
        &self,
        local: &str,
        remote: &str,
        bar: &indicatif::ProgressBar,
    ) -> anyhow::Result<()> {
        if local == "-" {
            self.client
                .write_stream(remote, tokio::io::stdin(), None)
                .await?;
            return Ok(());
        }
        let file = tokio::fs::File::open(local)
            .await
            .with_context(|| format!("opening {local}"))?;
        let meta = file
            .metadata()
            .await
            .with_context(|| format!("reading {local}"))?;
        if meta.is_dir() {
            return Err(anyhow::anyhow!("{local}: a directory (use -r)"));
        }
        use std::os::unix::fs::MetadataExt;
        let new = if self.preserve {
            let ns = |s: i64, n: i64| s.saturating_mul(1_000_000_000).saturating_add(n);
            NewFile {
                mode: Some(meta.mode() & 0o7777),
                mtime_ns: Some(ns(meta.mtime(), meta.mtime_nsec())),
                atime_ns: Some(ns(meta.atime(), meta.atime_nsec())),
            }
        } else {
            // The permission bits, as scp sends them (no setuid/setgid).
            NewFile {
                mode: Some(meta.mode() & 0o777),
                ..NewFile::default()
            }
        };
        self.client
            .write_stream_with(remote, bar.wrap_async_read(file), new)
            .await
            .with_context(|| format!("put {local} to {remote}"))?;
        Ok(())
    }

    /// A local tree to `remote` (made if missing).
    async fn put_tree(&self, local: &Path, remote: &str) -> anyhow::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let mut files = Vec::new();
        let mut links = Vec::new();
        let root_mode = std::fs::metadata(local)
            .with_context(|| format!("reading {}", local.display()))?
            .permissions()
            .mode();
        let mut dirs = vec![(PathBuf::new(), root_mode)];
        let mut i = 0;
        while i < dirs.len() {
            let rel = dirs[i].0.clone();
            i += 1;
            let dir = local.join(&rel);
            for entry in
                std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
            {
                let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
                let kind = entry.file_type()?;
                let r = rel.join(entry.file_name());
                if kind.is_dir() {
                    dirs.push((r, entry.metadata()?.permissions().mode()));
                } else if kind.is_file() {
                    files.push((r, entry.metadata()?.len()));
                } else if kind.is_symlink() {
                    let target = std::fs::read_link(entry.path())
                        .with_context(|| format!("reading the link {}", entry.path().display()))?;
                    links.push((r, target));
                } else {
                    say!(
                        "executor-client: put -r: {}: not a regular file, directory or symlink, skipped",
                        entry.path().display()
                    );
                }
            }
        }
        let bar = progress(
            files.iter().map(|f| f.1).sum(),
            &format!("put {}", local.display()),
        );
        let join = |rel: &Path| match rel.to_str() {
            Some("") => Ok(remote.to_string()),
            Some(r) => Ok(format!("{}/{r}", remote.trim_end_matches('/'))),
            None => Err(anyhow::anyhow!("{}: not UTF-8", rel.display())),
        };
        // Each new directory with its local mode and the owner's rwx (so
        // the copy can fill it), as scp makes one; with -p its setuid,
        // setgid and sticky bits too. The protocol has no request changing
        // an existing directory's mode, so -p cannot take the rwx back.
        for (d, mode) in &dirs {
            let bits = if self.preserve { 0o7777 } else { 0o777 };
            self.client
                .create_directory_with_mode(join(d)?.as_str(), true, Some(mode & bits | 0o700))
                .await?;
        }
        for (f, _) in &files {
            let from = local.join(f);
            self.put_file(&from.to_string_lossy(), &join(f)?, &bar)
                .await?;
        }
        // Links last, each made beside its name and renamed over it.
        for (l, target) in &links {
            self.put_link(&join(l)?, target).await?;
        }
        bar.finish_and_clear();
        Ok(())
    }
}

impl Copy<'_> {
    /// A symlink at `remote` holding `target`: made under a temp name in
    /// the same directory, then renamed over `remote` (an existing file or
    /// link there is replaced, as a copied file replaces one).
    async fn put_link(&self, remote: &str, target: &Path) -> anyhow::Result<()> {
        let (dir, name) = remote.rsplit_once('/').unwrap_or(("", remote));
        let tmp = format!("{dir}/.{name}.link{}", std::process::id());
        let target = WirePath::from(target);
        self.client
            .create_symlink(tmp.as_str(), target)
            .await
            .with_context(|| format!("put -r: creating the link {remote}"))?;
        if let Err(e) = self.client.rename(tmp.as_str(), remote).await {
            let _ = self.client.remove(tmp.as_str(), false).await;
            return Err(e).with_context(|| format!("put -r: creating the link {remote}"));
        }
        Ok(())
    }
}

/// A path from a walk of the agent, relative and plain (no `..`, `.`, root
/// or empty component): what an agent sends cannot name a file outside the
/// destination.
fn plain_relative(bytes: &[u8]) -> anyhow::Result<&Path> {
    let p = Path::new(std::ffi::OsStr::from_bytes(bytes));
    let plain = !bytes.is_empty()
        && p.components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
    if !plain {
        anyhow::bail!(
            "the agent's walk sent {:?}, not a plain relative path",
            p.display()
        );
    }
    Ok(p)
}

/// A local symlink at `to` holding `target`, made beside it under a temp
/// name and renamed over it (both in `to`'s opened directory).
fn link_local(to: Local, target: &std::ffi::OsStr) -> anyhow::Result<()> {
    let tmp = format!(".{}.link{}", to.name.to_string_lossy(), std::process::id());
    nix::unistd::symlinkat(target, &to.dir, tmp.as_str())
        .map_err(std::io::Error::from)
        .with_context(|| {
            format!(
                "creating the link {}",
                to.shown.with_file_name(&tmp).display()
            )
        })?;
    nix::fcntl::renameat(&to.dir, tmp.as_str(), &to.dir, to.name.as_os_str()).map_err(|e| {
        let _ = nix::unistd::unlinkat(
            &to.dir,
            tmp.as_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        );
        anyhow::Error::new(std::io::Error::from(e))
            .context(format!("renaming {tmp} to {}", to.shown.display()))
    })
}

/// The local destination of a `get -r`, opened once: every directory,
/// file and link of the copy is made by `*at` calls beneath it, each
/// component below it opened `O_NOFOLLOW`, so no symlink there (one this
/// copy made, one an earlier source of the same command made, one already
/// there) is ever followed: a remote tree cannot make the local side
/// write outside the destination.
struct LocalTree {
    root: std::os::fd::OwnedFd,
    path: PathBuf,
}

/// A name to make in an opened local directory (`shown`: the whole path,
/// for messages).
struct Local {
    dir: std::os::fd::OwnedFd,
    name: std::ffi::OsString,
    shown: PathBuf,
}

impl Local {
    /// The user's own destination path (its parent followed as given).
    fn of_path(path: &Path) -> anyhow::Result<Local> {
        let name = path
            .file_name()
            .with_context(|| format!("{}: no file name", path.display()))?;
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        Ok(Local {
            dir: open_dir(dir)?,
            name: name.to_os_string(),
            shown: path.to_path_buf(),
        })
    }
}

fn open_dir(dir: &Path) -> anyhow::Result<std::os::fd::OwnedFd> {
    use nix::fcntl::OFlag;
    nix::fcntl::open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(std::io::Error::from)
    .with_context(|| format!("opening {}", dir.display()))
}

impl LocalTree {
    /// `root` (the user's destination, followed as given) opened.
    fn open(root: &Path) -> anyhow::Result<LocalTree> {
        Ok(LocalTree {
            root: open_dir(root)?,
            path: root.to_path_buf(),
        })
    }

    /// The directory `rel` below the root, opened one component at a time
    /// (each `O_NOFOLLOW`) and made where missing; a link or a file in the
    /// way is an error naming it.
    fn dir(&self, rel: &Path) -> anyhow::Result<std::os::fd::OwnedFd> {
        self.dir_with_mode(rel, 0o777)
    }

    /// [`LocalTree::dir`], its last component made (when missing) with
    /// `mode` less the umask.
    fn dir_with_mode(&self, rel: &Path, mode: u32) -> anyhow::Result<std::os::fd::OwnedFd> {
        use nix::fcntl::OFlag;
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let none = nix::sys::stat::Mode::empty();
        let mut cur = self.root.try_clone()?;
        let mut at = self.path.clone();
        let last = rel.components().count();
        for (i, c) in rel.components().enumerate() {
            let name = c.as_os_str();
            at.push(name);
            let made = if i + 1 == last { mode } else { 0o777 };
            let opened = match nix::fcntl::openat(&cur, name, flags, none) {
                Err(nix::errno::Errno::ENOENT) => {
                    match nix::sys::stat::mkdirat(
                        &cur,
                        name,
                        nix::sys::stat::Mode::from_bits_truncate(made),
                    ) {
                        Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
                        Err(e) => {
                            return Err(std::io::Error::from(e))
                                .with_context(|| format!("creating {}", at.display()))
                        }
                    }
                    nix::fcntl::openat(&cur, name, flags, none)
                }
                r => r,
            };
            cur = match opened {
                Ok(fd) => fd,
                Err(nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR) => anyhow::bail!(
                    "{}: a symlink or a file is in the way of a directory (a copy never writes through a link)",
                    at.display()
                ),
                Err(e) => {
                    return Err(std::io::Error::from(e))
                        .with_context(|| format!("opening {}", at.display()))
                }
            };
        }
        Ok(cur)
    }

    /// `rel` (plain, not empty) to make in its opened parent.
    fn entry(&self, rel: &Path) -> anyhow::Result<Local> {
        let name = rel
            .file_name()
            .with_context(|| format!("{}: no file name", rel.display()))?;
        Ok(Local {
            dir: self.dir(rel.parent().unwrap_or(Path::new("")))?,
            name: name.to_os_string(),
            shown: self.path.join(rel),
        })
    }
}

/// `put`
pub async fn put(client: &Client, args: PutArgs) -> anyhow::Result<i32> {
    let mut remote = Remote::new(client);
    let c = remote.confined(&args.flags.sandbox).await?;
    let (dest, sources) = args.paths.split_last().expect("clap: at least 2");
    let dest_path = remote.path(dest).await?;
    let into_dir = dest.ends_with('/')
        || dest == "."
        || c.stat(dest_path.as_str())
            .await
            .is_ok_and(|st| st.kind == FileKind::Dir);
    if sources.len() > 1 && !into_dir {
        return Err(anyhow::anyhow!("{dest}: not a directory (several sources)"));
    }
    let copy = Copy {
        client: &c,
        preserve: args.flags.preserve,
    };
    for s in sources {
        let to = if into_dir {
            format!("{}/{}", dest_path.trim_end_matches('/'), base_name(s)?)
        } else {
            dest_path.clone()
        };
        if s != "-" && Path::new(s).is_dir() {
            if !args.flags.recursive {
                return Err(anyhow::anyhow!("{s}: a directory (use -r)"));
            }
            copy.put_tree(Path::new(s), &to).await?;
            continue;
        }
        let size = std::fs::metadata(s).map(|m| m.len()).unwrap_or(0);
        let bar = progress(size, &format!("put {to}"));
        copy.put_file(s, &to, &bar).await?;
        bar.finish_and_clear();
    }
    Ok(0)
}

/// A remote directory's mode as a copy makes it: its permission bits and
/// the owner's rwx (the copy fills it), as scp makes one.
fn dir_mode(mode: u32) -> u32 {
    mode & 0o777 | 0o700
}

/// `dir` and its missing parents, the last made with `mode` (less the
/// umask).
fn mkdir_local(dir: &Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    match std::fs::DirBuilder::new().mode(mode).create(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        r => r.with_context(|| format!("creating {}", dir.display())),
    }
}

/// A temp file `.NAME.partPID-N` beside the destination (in its opened
/// directory, made `O_EXCL | O_NOFOLLOW`): renamed over it by
/// [`PartFile::commit`], removed when dropped before (an error, a signal
/// stopping the transfer).
#[derive(Debug)]
struct PartFile {
    to: LocalDebug,
    temp: std::ffi::OsString,
    file: std::fs::File,
    committed: bool,
}

/// [`Local`] for a `Debug` holder.
struct LocalDebug(Local);

impl std::fmt::Debug for LocalDebug {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.shown.fmt(f)
    }
}

impl PartFile {
    /// Made with `mode` (less the umask); the descriptor writes whatever
    /// the mode.
    fn beside(to: Local, mode: u32) -> anyhow::Result<PartFile> {
        use nix::fcntl::OFlag;
        let st = nix::sys::stat::fstatat(
            &to.dir,
            to.name.as_os_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        );
        if st.is_ok_and(|st| st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFDIR) {
            return Err(anyhow::anyhow!(
                "{}: a directory is in the way",
                to.shown.display()
            ));
        }
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        for n in 0..1000u32 {
            let temp = format!(
                ".{}.part{}-{n}",
                to.name.to_string_lossy(),
                std::process::id()
            );
            match nix::fcntl::openat(
                &to.dir,
                temp.as_str(),
                flags,
                nix::sys::stat::Mode::from_bits_truncate(mode),
            ) {
                Ok(fd) => {
                    return Ok(PartFile {
                        to: LocalDebug(to),
                        temp: temp.into(),
                        file: fd.into(),
                        committed: false,
                    })
                }
                Err(nix::errno::Errno::EEXIST) => continue,
                Err(e) => {
                    return Err(std::io::Error::from(e)).with_context(|| {
                        format!("creating {}", to.shown.with_file_name(&temp).display())
                    })
                }
            }
        }
        anyhow::bail!("cannot create a temp file beside {}", to.shown.display())
    }

    /// The temp file's whole path, for messages.
    fn shown(&self) -> PathBuf {
        self.to.0.shown.with_file_name(&self.temp)
    }

    /// The remote file's permission bits and mtime.
    fn preserve(&mut self, st: &StatResult) -> anyhow::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let mtime = std::time::UNIX_EPOCH
            + std::time::Duration::from_nanos(u64::try_from(st.mtime_ns).unwrap_or(0));
        self.file
            .set_permissions(std::fs::Permissions::from_mode(st.mode & 0o7777))
            .and_then(|()| self.file.set_modified(mtime))
            .with_context(|| format!("setting the mode and mtime of {}", self.shown().display()))
    }

    fn commit(mut self) -> anyhow::Result<()> {
        self.file
            .sync_all()
            .with_context(|| format!("writing {}", self.shown().display()))?;
        let to = &self.to.0;
        nix::fcntl::renameat(&to.dir, self.temp.as_os_str(), &to.dir, to.name.as_os_str())
            .map_err(std::io::Error::from)
            .with_context(|| {
                format!(
                    "renaming {} to {}",
                    self.shown().display(),
                    to.shown.display()
                )
            })?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for PartFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = nix::unistd::unlinkat(
                &self.to.0.dir,
                self.temp.as_os_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
        }
    }
}

/// A progress bar on a terminal (stderr), hidden otherwise.
fn progress(len: u64, what: &str) -> indicatif::ProgressBar {
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}
