//! `get` and `put`, with scp's habits: a directory (or `.`) destination
//! takes the source's name, `-` is stdout / stdin, relative remote paths
//! are taken against the remote home, `-p` keeps modes and mtimes (a
//! `put` also the atime), `-r` copies trees (walk-driven, one atomic file at
//! a time, symlinks kept as links and made after everything else, so no
//! file of the copy is written through a link the copy made). A file
//! appears whole or not at all: a failed or interrupted `get` removes its
//! temp file, and an unfinished `put` is discarded by the agent.

use super::files::Remote;
use super::sandbox::SandboxArgs;
use anyhow::Context;
use executor_client::fs::NewFile;
use executor_client::protocol::types::fs::{FileKind, StatResult};
use executor_client::protocol::WirePath;
use executor_client::Client;
use futures_util::StreamExt;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The flags `get` and `put` share.
#[derive(Debug, clap::Args)]
pub struct CopyFlags {
    /// Keep each file's mode and modification time (`put` also its access
    /// time); directories and symlinks get new ones.
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
            FileKind::Dir if args.flags.recursive => copy.get_tree(&path, &local).await?,
            FileKind::Dir => {
                return Err(anyhow::anyhow!("{path}: a directory (use -r)"));
            }
            _ => {
                let bar = progress(st.size, &format!("get {path}"));
                copy.get_file(&path, &st, &local, &bar).await?;
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
        remote: &str,
        st: &StatResult,
        local: &Path,
        bar: &indicatif::ProgressBar,
    ) -> anyhow::Result<()> {
        let (_, stream) = self.client.read_stream(remote).await?;
        let mut stream = std::pin::pin!(stream);
        let mut part = PartFile::beside(local)?;
        while let Some(block) = stream.next().await {
            let block = block?;
            part.write(&block)?;
            bar.inc(block.len() as u64);
        }
        if self.preserve {
            part.preserve(st)?;
        }
        part.commit(local)
    }

    /// A remote tree into `local` (made if missing).
    async fn get_tree(&self, root: &str, local: &Path) -> anyhow::Result<()> {
        let mut entries = Vec::new();
        let mut errors = Vec::new();
        self.client
            .walk(executor_client::fs::walk_params(root), |page| {
                entries.extend(page.entries.iter().cloned());
                errors.extend(
                    page.errors
                        .iter()
                        .map(|e| format!("{}: {}", e.path.display(), e.message)),
                );
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
        let bar = progress(total, &format!("get {root}"));
        mkdir_local(local)?;
        let mut links = Vec::new();
        for e in &entries {
            let rel = plain_relative(e.path.as_bytes())?;
            let from = format!("{}/{}", root.trim_end_matches('/'), rel.display());
            let to = local.join(rel);
            match e.kind {
                FileKind::Dir => mkdir_local(&to)?,
                FileKind::File => {
                    let st = self.client.stat_with(from.as_str(), false).await?;
                    self.get_file(&from, &st, &to, &bar).await?;
                }
                FileKind::Symlink => links.push((from, to)),
                _ => eprintln!(
                    "executor-client: get -r: {from}: not a regular file, directory or symlink, skipped"
                ),
            }
        }
        // Links last: nothing of this copy is written through one.
        for (from, to) in links {
            let target = self.client.read_link(from.as_str()).await?;
            link_local(&to, std::ffi::OsStr::from_bytes(target.as_bytes()))?;
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
        let new = if self.preserve {
            use std::os::unix::fs::MetadataExt;
            let ns = |s: i64, n: i64| s.saturating_mul(1_000_000_000).saturating_add(n);
            NewFile {
                mode: Some(meta.mode() & 0o7777),
                mtime_ns: Some(ns(meta.mtime(), meta.mtime_nsec())),
                atime_ns: Some(ns(meta.atime(), meta.atime_nsec())),
            }
        } else {
            NewFile::default()
        };
        self.client
            .write_stream_with(remote, bar.wrap_async_read(file), new)
            .await
            .with_context(|| format!("put {local} to {remote}"))?;
        Ok(())
    }

    /// A local tree to `remote` (made if missing).
    async fn put_tree(&self, local: &Path, remote: &str) -> anyhow::Result<()> {
        let mut files = Vec::new();
        let mut links = Vec::new();
        let mut dirs = vec![PathBuf::new()];
        let mut i = 0;
        while i < dirs.len() {
            let rel = dirs[i].clone();
            i += 1;
            let dir = local.join(&rel);
            for entry in
                std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
            {
                let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
                let kind = entry.file_type()?;
                let r = rel.join(entry.file_name());
                if kind.is_dir() {
                    dirs.push(r);
                } else if kind.is_file() {
                    files.push((r, entry.metadata()?.len()));
                } else if kind.is_symlink() {
                    let target = std::fs::read_link(entry.path())
                        .with_context(|| format!("reading the link {}", entry.path().display()))?;
                    links.push((r, target));
                } else {
                    eprintln!(
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
        for d in &dirs {
            self.client
                .create_directory(join(d)?.as_str(), true)
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
/// name and renamed over it.
fn link_local(to: &Path, target: &std::ffi::OsStr) -> anyhow::Result<()> {
    let name = to
        .file_name()
        .with_context(|| format!("{}: no file name", to.display()))?;
    let tmp = to.with_file_name(format!(
        ".{}.link{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    std::os::unix::fs::symlink(target, &tmp)
        .with_context(|| format!("creating the link {}", tmp.display()))?;
    std::fs::rename(&tmp, to).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        anyhow::Error::new(e).context(format!("renaming {} to {}", tmp.display(), to.display()))
    })
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

fn mkdir_local(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

/// A temp file `.NAME.partPID-N` beside the destination: renamed over it
/// by [`PartFile::commit`], removed when dropped before (an error, a
/// signal stopping the transfer).
#[derive(Debug)]
struct PartFile {
    path: PathBuf,
    file: std::fs::File,
    committed: bool,
}

impl PartFile {
    fn beside(target: &Path) -> anyhow::Result<PartFile> {
        if target.is_dir() {
            return Err(anyhow::anyhow!(
                "{}: a directory is in the way",
                target.display()
            ));
        }
        let name = target
            .file_name()
            .with_context(|| format!("{}: no file name", target.display()))?;
        let dir = target
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        for n in 0..1000u32 {
            let path = dir.join(format!(
                ".{}.part{}-{n}",
                name.to_string_lossy(),
                std::process::id()
            ));
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(file) => {
                    return Ok(PartFile {
                        path,
                        file,
                        committed: false,
                    })
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e).with_context(|| format!("creating {}", path.display())),
            }
        }
        anyhow::bail!("cannot create a temp file in {}", dir.display())
    }

    fn write(&mut self, data: &[u8]) -> anyhow::Result<()> {
        self.file
            .write_all(data)
            .with_context(|| format!("writing {}", self.path.display()))
    }

    /// The remote file's permission bits and mtime.
    fn preserve(&mut self, st: &StatResult) -> anyhow::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let mtime = std::time::UNIX_EPOCH
            + std::time::Duration::from_nanos(u64::try_from(st.mtime_ns).unwrap_or(0));
        self.file
            .set_permissions(std::fs::Permissions::from_mode(st.mode & 0o7777))
            .and_then(|()| self.file.set_modified(mtime))
            .with_context(|| format!("setting the mode and mtime of {}", self.path.display()))
    }

    fn commit(mut self, target: &Path) -> anyhow::Result<()> {
        self.file
            .sync_all()
            .with_context(|| format!("writing {}", self.path.display()))?;
        std::fs::rename(&self.path, target)
            .with_context(|| format!("renaming {} to {}", self.path.display(), target.display()))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for PartFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.path);
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
