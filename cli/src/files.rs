//! `info`, `cat`, `walk`, `stat`, `rm`, `mv`, `mkdir`, `realpath`: one fs
//! request family each. A relative remote path is taken against the remote
//! home, as scp does; every verb takes the sandbox flags.

use super::exit;
use super::sandbox::SandboxArgs;
use executor_client::protocol::types::fs::{FileKind, WalkEntry, WalkResult};
use executor_client::{Client, ErrorCode};
use std::io::Write;
use std::os::fd::AsFd;

/// The remote home, asked for once and only when a path needs it.
#[derive(Debug)]
pub struct Remote<'a> {
    client: &'a Client,
    home: Option<String>,
}

impl<'a> Remote<'a> {
    pub fn new(client: &'a Client) -> Self {
        Remote { client, home: None }
    }

    pub async fn home(&mut self) -> anyhow::Result<&str> {
        if self.home.is_none() {
            self.home = Some(
                self.client
                    .call(&executor_client::protocol::types::session::EnvironmentInfoParams {})
                    .await?
                    .home,
            );
        }
        Ok(self.home.as_deref().unwrap_or("/"))
    }

    /// `path` made absolute against the remote home.
    pub async fn path(&mut self, path: &str) -> anyhow::Result<String> {
        if path.starts_with('/') {
            return Ok(path.to_string());
        }
        let home = self.home().await?.trim_end_matches('/').to_string();
        Ok(match path.trim_start_matches("./") {
            "" | "." | "~" => home,
            rest => format!("{home}/{}", rest.strip_prefix("~/").unwrap_or(rest)),
        })
    }

    /// The client under the sandbox flags (relative paths against the home).
    pub async fn confined(&mut self, sandbox: &SandboxArgs) -> anyhow::Result<Client> {
        if !sandbox.any() {
            return Ok(self.client.clone());
        }
        let home = self.home().await?.to_string();
        Ok(self.client.with_sandbox(sandbox.intent(&home)?))
    }
}

/// `info`
pub async fn info(client: &Client) -> anyhow::Result<i32> {
    let mut init = serde_json::to_value(client.initialize_result())?;
    init["resume_token"] = serde_json::Value::String("<redacted>".into());
    let env = client
        .call(&executor_client::protocol::types::session::EnvironmentInfoParams {})
        .await?;
    let out = serde_json::json!({ "initialize": init, "environment": env });
    print_json(&out)?;
    Ok(0)
}

#[derive(Debug, clap::Args)]
pub struct CatArgs {
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    #[arg(required = true)]
    pub paths: Vec<String>,
}

/// `cat`
pub async fn cat(client: &Client, args: CatArgs) -> anyhow::Result<i32> {
    let mut remote = Remote::new(client);
    let c = remote.confined(&args.sandbox).await?;
    to_stdout(&c, &mut remote, &args.paths).await?;
    Ok(0)
}

/// Stream remote files to stdout, one after the other (`cat`, `get … -`).
pub async fn to_stdout(
    c: &Client,
    remote: &mut Remote<'_>,
    paths: &[String],
) -> anyhow::Result<()> {
    // The bytes go to the descriptor itself, past stdout's line buffer:
    // spliced from the transport when stdout is a file, a pipe or
    // /dev/null, else written from the frame they arrived in.
    let mut out = std::io::stdout().lock();
    out.flush()?;
    for p in paths {
        let path = remote.path(p).await?;
        c.read_stream_into(path.as_str(), out.as_fd()).await?;
    }
    Ok(())
}

#[derive(Debug, clap::Args)]
pub struct WalkArgs {
    /// Only this many levels (1: the root's entries).
    #[arg(long)]
    pub max_depth: Option<u32>,
    /// End each entry with a NUL instead of a newline (names may hold
    /// newlines), as `find -print0`.
    #[arg(short = '0', long = "null", conflicts_with = "json")]
    pub null: bool,
    /// One JSON object per line: `{"path", "kind", "size", "mtime_ns"}`
    /// (and `"path_bytes"`, the exact bytes, when the path is not UTF-8).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    pub root: String,
}

/// `walk`: exits 1 when an entry could not be read (as find does).
pub async fn walk(client: &Client, args: WalkArgs) -> anyhow::Result<i32> {
    let mut remote = Remote::new(client);
    let c = remote.confined(&args.sandbox).await?;
    let mut params = executor_client::fs::walk_params(remote.path(&args.root).await?.as_str());
    if let Some(d) = args.max_depth {
        params.max_depth = d;
    }
    let terminal = super::quote::stdout_is_terminal();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let (mut written, mut unreadable) = (Ok(()), 0usize);
    c.walk(params, |page: &WalkResult| {
        for e in &page.entries {
            if written.is_ok() {
                written = write_entry(&mut out, e, &args, terminal);
            }
        }
        for e in &page.errors {
            unreadable += 1;
            let shown = super::quote::name(e.path.as_bytes());
            // The agent's message names the path again, as it is.
            let message = super::quote::message(&e.message);
            tracing::warn!(path = %shown, code = %e.code, "{message}");
            say!("executor-client: walk: {shown}: {message}");
        }
    })
    .await?;
    written?;
    out.flush()?;
    Ok(if unreadable > 0 { exit::FAILED } else { 0 })
}

fn kind_letter(kind: FileKind) -> char {
    match kind {
        FileKind::File => 'f',
        FileKind::Dir => 'd',
        FileKind::Symlink => 'l',
        _ => '?',
    }
}

/// One entry: JSON (exact: a path that is not UTF-8 also as its bytes),
/// NUL-terminated (exact), or a line whose path is quoted on a terminal
/// ([`super::quote`]) and exact elsewhere.
fn write_entry(
    out: &mut impl Write,
    e: &WalkEntry,
    args: &WalkArgs,
    terminal: bool,
) -> std::io::Result<()> {
    if args.json {
        let mut line = serde_json::json!({
            "path": e.path.display(),
            "kind": e.kind.as_str(),
            "size": e.size,
            "mtime_ns": e.mtime_ns,
        });
        if e.path.as_str().is_none() {
            line["path_bytes"] = serde_json::json!(e.path.as_bytes());
        }
        let line = line.to_string();
        let line = if terminal {
            super::quote::json_inert(line)
        } else {
            line
        };
        return writeln!(out, "{line}");
    }
    write!(out, "{} {} ", kind_letter(e.kind), e.size)?;
    if args.null {
        out.write_all(e.path.as_bytes())?;
        return out.write_all(b"\0");
    }
    out.write_all(&super::quote::listed(e.path.as_bytes(), terminal))?;
    out.write_all(b"\n")
}

#[derive(Debug, clap::Args)]
pub struct StatArgs {
    /// Describe a final symlink itself (as `stat` without `-L`).
    #[arg(long)]
    pub no_follow: bool,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    pub path: String,
}

/// `stat`: JSON with the mode in octal and the mtime in RFC 3339 (UTC).
pub async fn stat(client: &Client, args: StatArgs) -> anyhow::Result<i32> {
    let mut remote = Remote::new(client);
    let c = remote.confined(&args.sandbox).await?;
    let path = remote.path(&args.path).await?;
    let st = c.stat_with(path.as_str(), !args.no_follow).await?;
    let out = serde_json::json!({
        "path": path,
        "kind": st.kind.as_str(),
        "size": st.size,
        "mode": format!("{:o}", st.mode),
        "permissions": format!("{:04o}", st.mode & 0o7777),
        "mtime": rfc3339(st.mtime_ns),
        "mtime_ns": st.mtime_ns,
        "uid": st.uid,
        "gid": st.gid,
    });
    print_json(&out)?;
    Ok(0)
}

/// `value` pretty-printed on stdout (on a terminal, nothing in it a
/// terminal acts on: [`super::quote::json_inert`]).
fn print_json(value: &serde_json::Value) -> anyhow::Result<()> {
    let mut text = serde_json::to_string_pretty(value)?;
    if super::quote::stdout_is_terminal() {
        text = super::quote::json_inert(text);
    }
    writeln!(std::io::stdout().lock(), "{text}")?;
    Ok(())
}

/// `ns` since the epoch as `YYYY-MM-DDTHH:MM:SS.NNNNNNNNNZ`.
pub fn rfc3339(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let nanos = ns.rem_euclid(1_000_000_000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{nanos:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[derive(Debug, clap::Args)]
pub struct RmArgs {
    /// Remove directories and what they hold (symlinks are never followed).
    #[arg(short = 'r', long)]
    pub recursive: bool,
    /// A missing path is not an error.
    #[arg(short = 'f', long)]
    pub force: bool,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    #[arg(required = true)]
    pub paths: Vec<String>,
}

/// `rm`
pub async fn rm(client: &Client, args: RmArgs) -> anyhow::Result<i32> {
    let mut remote = Remote::new(client);
    let c = remote.confined(&args.sandbox).await?;
    for p in &args.paths {
        let path = remote.path(p).await?;
        match c.remove(path.as_str(), args.recursive).await {
            Err(e) if args.force && e.code() == Some(ErrorCode::NotFound) => {}
            r => r?,
        }
    }
    Ok(0)
}

#[derive(Debug, clap::Args)]
pub struct MvArgs {
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    pub from: String,
    pub to: String,
}

/// `mv`
pub async fn mv(client: &Client, args: MvArgs) -> anyhow::Result<i32> {
    let mut remote = Remote::new(client);
    let c = remote.confined(&args.sandbox).await?;
    let from = remote.path(&args.from).await?;
    let to = remote.path(&args.to).await?;
    c.rename(from.as_str(), to.as_str()).await?;
    Ok(0)
}

#[derive(Debug, clap::Args)]
pub struct MkdirArgs {
    /// Make missing parents; an existing directory is fine.
    #[arg(short = 'p', long)]
    pub parents: bool,
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    #[arg(required = true)]
    pub paths: Vec<String>,
}

/// `mkdir`
pub async fn mkdir(client: &Client, args: MkdirArgs) -> anyhow::Result<i32> {
    let mut remote = Remote::new(client);
    let c = remote.confined(&args.sandbox).await?;
    for p in &args.paths {
        let path = remote.path(p).await?;
        c.create_directory(path.as_str(), args.parents).await?;
    }
    Ok(0)
}

#[derive(Debug, clap::Args)]
pub struct RealpathArgs {
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    #[arg(required = true)]
    pub paths: Vec<String>,
}

/// `realpath`
pub async fn realpath(client: &Client, args: RealpathArgs) -> anyhow::Result<i32> {
    let mut remote = Remote::new(client);
    let c = remote.confined(&args.sandbox).await?;
    let terminal = super::quote::stdout_is_terminal();
    let mut out = std::io::stdout().lock();
    for p in &args.paths {
        let path = remote.path(p).await?;
        let real = c.canonicalize(path.as_str()).await?;
        out.write_all(&super::quote::listed(real.as_bytes(), terminal))?;
        out.write_all(b"\n")?;
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_dates() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(
            super::rfc3339(1_700_000_000_123_456_789),
            "2023-11-14T22:13:20.123456789Z"
        );
        assert_eq!(super::rfc3339(-1), "1969-12-31T23:59:59.999999999Z");
    }
}
