//! Files on the agent's host: streaming reads with a read-ahead window,
//! streaming atomic writes, and walks in pages.

use crate::sink::SinkEvent;
use crate::{Call, Client, Error};
use bytes::Bytes;
use executor_protocol::methods as m;
use executor_protocol::types::fs::*;
use executor_protocol::types::Empty;
use executor_protocol::WirePath;
use futures_util::Stream;
use serde_bytes::ByteBuf;
use std::collections::VecDeque;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Block size of streaming reads and writes (the protocol's maximum).
pub const BLOCK: u64 = 1 << 20;
/// Blocks kept in flight by `write_stream`: enough to hide a round trip at
/// wire speed.
pub const WINDOW: usize = 8;
/// The window of `read_stream` (the agent's `max_read_credit_bytes` when
/// that is less): bytes the agent may push ahead of what was consumed.
pub const READ_CREDIT: u64 = 8 * BLOCK;

impl Client {
    /// A request whose answer is `{}`.
    async fn empty_request<P: serde::Serialize>(
        &self,
        method: &str,
        params: &P,
    ) -> Result<(), Error> {
        self.request::<_, Empty>(method, params).await.map(|_| ())
    }

    /// `fs/stat`, following a final symlink.
    pub async fn stat(&self, path: impl Into<WirePath>) -> Result<StatResult, Error> {
        self.stat_with(path, true).await
    }

    /// `fs/stat`; with `follow_symlinks: false` a final symlink is
    /// described itself.
    pub async fn stat_with(
        &self,
        path: impl Into<WirePath>,
        follow_symlinks: bool,
    ) -> Result<StatResult, Error> {
        self.request(
            m::FS_STAT,
            &StatParams {
                path: path.into(),
                follow_symlinks,
                sandbox: self.intent(),
                cwd: None,
            },
        )
        .await
    }

    /// `fs/canonicalize`: the absolute path with every symlink, `.` and
    /// `..` resolved.
    pub async fn canonicalize(&self, path: impl Into<WirePath>) -> Result<WirePath, Error> {
        let r: PathResult = self
            .request(
                m::FS_CANONICALIZE,
                &CanonicalizeParams {
                    path: path.into(),
                    sandbox: self.intent(),
                    cwd: None,
                },
            )
            .await?;
        Ok(r.path)
    }

    /// `fs/createDirectory` (`recursive`: `mkdir -p`).
    pub async fn create_directory(
        &self,
        path: impl Into<WirePath>,
        recursive: bool,
    ) -> Result<(), Error> {
        self.create_directory_with_mode(path, recursive, None).await
    }

    /// `fs/createDirectory` giving the new directory `mode` (exactly; an
    /// existing one keeps its own).
    pub async fn create_directory_with_mode(
        &self,
        path: impl Into<WirePath>,
        recursive: bool,
        mode: Option<u32>,
    ) -> Result<(), Error> {
        self.empty_request(
            m::FS_CREATE_DIRECTORY,
            &CreateDirectoryParams {
                path: path.into(),
                recursive,
                mode,
                sandbox: self.intent(),
                cwd: None,
            },
        )
        .await
    }

    /// `fs/remove` (a directory needs `recursive` unless it is empty).
    pub async fn remove(&self, path: impl Into<WirePath>, recursive: bool) -> Result<(), Error> {
        self.empty_request(
            m::FS_REMOVE,
            &RemoveParams {
                path: path.into(),
                recursive,
                sandbox: self.intent(),
                cwd: None,
            },
        )
        .await
    }

    /// `fs/copy`: a file or a symlink (copied as a link); with `recursive`
    /// a directory tree (FIFOs, sockets and devices left out).
    pub async fn copy(
        &self,
        source: impl Into<WirePath>,
        destination: impl Into<WirePath>,
        recursive: bool,
    ) -> Result<CopyResult, Error> {
        self.request(
            m::FS_COPY,
            &CopyParams {
                source: source.into(),
                destination: destination.into(),
                recursive,
                sandbox: self.intent(),
                cwd: None,
            },
        )
        .await
    }

    /// `fs/rename` (an existing file at `to` is replaced).
    pub async fn rename(
        &self,
        from: impl Into<WirePath>,
        to: impl Into<WirePath>,
    ) -> Result<(), Error> {
        self.empty_request(
            m::FS_RENAME,
            &RenameParams {
                from: from.into(),
                to: to.into(),
                sandbox: self.intent(),
                cwd: None,
            },
        )
        .await
    }

    /// `fs/readLink`: what the symlink at `path` holds (the link itself
    /// is never followed; a path that is not a link is an `io` error).
    pub async fn read_link(&self, path: impl Into<WirePath>) -> Result<WirePath, Error> {
        let r: ReadLinkResult = self
            .request(
                m::FS_READ_LINK,
                &ReadLinkParams {
                    path: path.into(),
                    sandbox: self.intent(),
                    cwd: None,
                },
            )
            .await?;
        Ok(r.target)
    }

    /// `fs/createSymlink`: a new symlink at `path` holding `target` (not
    /// resolved; an existing entry at `path` is `already_exists`).
    pub async fn create_symlink(
        &self,
        path: impl Into<WirePath>,
        target: impl Into<WirePath>,
    ) -> Result<(), Error> {
        self.empty_request(
            m::FS_CREATE_SYMLINK,
            &CreateSymlinkParams {
                path: path.into(),
                target: target.into(),
                sandbox: self.intent(),
                cwd: None,
            },
        )
        .await
    }

    /// `fs/readFile` of a whole (small) file.
    pub async fn read_file(&self, path: impl Into<WirePath>) -> Result<Vec<u8>, Error> {
        let r: ReadFileResult = self
            .request(
                m::FS_READ_FILE,
                &ReadFileParams {
                    path: path.into(),
                    offset: None,
                    length: None,
                    sandbox: self.intent(),
                    cwd: None,
                },
            )
            .await?;
        Ok(r.data.into_vec())
    }

    /// `fs/writeFile`, atomic.
    pub async fn write_file(&self, path: impl Into<WirePath>, data: &[u8]) -> Result<(), Error> {
        self.empty_request(
            m::FS_WRITE_FILE,
            &WriteFileParams {
                path: path.into(),
                data: ByteBuf::from(data.to_vec()),
                mode: None,
                create_parents: false,
                atomic: true,
                sandbox: self.intent(),
                cwd: None,
            },
        )
        .await
    }

    /// Stream a file of any size with one `fs/readStream`: the agent
    /// pushes its blocks within a window of [`READ_CREDIT`] bytes, returned
    /// with `fs/readCredit` as the blocks are taken from the stream.
    /// Returns the size seen at open and the stream of blocks (each shares
    /// the frame it arrived in: no copy). Dropping the stream before its
    /// end cancels it (`fs/readCancel`).
    pub async fn read_stream(
        &self,
        path: impl Into<WirePath>,
    ) -> Result<(u64, impl Stream<Item = Result<Bytes, Error>>), Error> {
        let params = self.read_stream_params(path.into());
        // Subscribed before asking: the first blocks follow the answer at once.
        let sub = self.subscribe(&[m::FS_READ_STREAM_DATA, m::FS_READ_STREAM_END]);
        let head: ReadStreamResult = self.request(m::FS_READ_STREAM, &params).await?;
        let state = PushedRead {
            sub: self.narrow_to_stream(sub, head.stream_id),
            credit: Credit::new(self, head.stream_id, &params),
            next_offset: 0,
            taken: 0,
            done: false,
            ended: false,
        };
        let stream = futures_util::stream::unfold(state, |mut st| async move {
            match st.next_block().await {
                Ok(Some(b)) => Some((Ok(b), st)),
                Ok(None) => None,
                Err(e) => {
                    st.done = true;
                    Some((Err(e), st))
                }
            }
        });
        Ok((head.size, stream))
    }

    /// `fs/readStream` of a whole file, in blocks of [`BLOCK`] within a
    /// window of [`READ_CREDIT`] (less when the agent's limits are).
    fn read_stream_params(&self, path: WirePath) -> ReadStreamParams {
        let limits = &self.initialize_result().limits;
        ReadStreamParams {
            path: Some(path),
            handle: None,
            offset: 0,
            length: None,
            block_bytes: BLOCK
                .min(limits.max_block_bytes)
                .min(limits.max_read_credit_bytes),
            credit_bytes: READ_CREDIT.min(limits.max_read_credit_bytes),
            sandbox: self.intent(),
            cwd: None,
        }
    }

    /// Stream a file of any size into `sink` (a file, a pipe, `/dev/null`,
    /// a socket, a terminal: any descriptor open for writing, which stays
    /// the caller's; its flags are not changed) with one `fs/readStream`,
    /// as [`Client::read_stream`] does; returns the bytes written, which
    /// are all of the stream's (its end's `total` is checked).
    ///
    /// When the transport is a pipe (a spawned `ssh` or local agent, on
    /// Linux) and the sink a regular file, `/dev/null` or a pipe, the
    /// stream's data never enters this process:
    /// **the connection reader writes the sink itself**, moving each
    /// block's bytes from the transport pipe with `splice(2)`. It never
    /// waits for the sink: when a pipe or socket is full, the rest of the
    /// block is read into memory and written by this future when the sink
    /// is ready, and the stream's next blocks wait behind it (credit is
    /// returned only for bytes written, so the window bounds that memory
    /// and other streams' frames go on meanwhile). A regular file is
    /// written as it comes (the reader waits for the disk as a `write`
    /// would). A terminal, a socket or anything else is written by a
    /// blocking thread.
    ///
    /// The stream's notifications reach no [`Client::subscribe`]r.
    ///
    /// A sink that cannot be written (`BrokenPipe` when its reader is gone,
    /// a full disk) ends this stream (`fs/readCancel`) with
    /// [`Error::Sink`]; the connection goes on. Dropping the future stops
    /// the writing (the block being spliced at that moment is finished)
    /// and cancels the stream. As with `write(2)`, a pipe without a reader
    /// raises `SIGPIPE` unless it is ignored (Rust programs ignore it).
    pub async fn read_stream_into(
        &self,
        path: impl Into<WirePath>,
        sink: impl std::os::fd::AsFd,
    ) -> Result<u64, Error> {
        self.read_stream_into_with(path, sink, |_| {}).await
    }

    /// [`Client::read_stream_into`], calling `progress` with the length of
    /// every piece written (for a progress bar).
    pub async fn read_stream_into_with(
        &self,
        path: impl Into<WirePath>,
        sink: impl std::os::fd::AsFd,
        mut progress: impl FnMut(u64),
    ) -> Result<u64, Error> {
        let sink = crate::sink::Sink::new(sink.as_fd()).map_err(Error::Sink)?;
        if !(self.splices() && sink.splice_ok()) {
            let (_, stream) = self.read_stream(path).await?;
            let mut stream = std::pin::pin!(stream);
            let mut total = 0;
            while let Some(block) = futures_util::StreamExt::next(&mut stream).await {
                let block = block?;
                let len = block.len() as u64;
                sink.write_all(block).await.map_err(Error::Sink)?;
                total += len;
                progress(len);
            }
            return Ok(total);
        }
        let params = self.read_stream_params(path.into());
        let state = std::sync::Arc::new(crate::sink::SinkState::new(sink));
        let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
        let mut guard = SinkGuard {
            client: self.clone(),
            state: state.clone(),
            stream_id: None,
            ended: false,
        };
        let entry = crate::sink::SinkEntry {
            state: state.clone(),
            tx,
        };
        let head: ReadStreamResult = self
            .start_call_into(m::FS_READ_STREAM, &params, entry)
            .await?
            .result()
            .await?;
        guard.stream_id = Some(head.stream_id);
        let mut credit = Credit::new(self, head.stream_id, &params);
        let mut next = 0u64;
        loop {
            credit.return_due().await?;
            let event = tokio::select! {
                e = events.recv() => e,
                Some(e) = credit.failed.recv() => return Err(e),
            };
            let (offset, len, data) = match event {
                None => {
                    guard.ended = true;
                    return Err(closed_during(head.stream_id));
                }
                Some(SinkEvent::Failed(e)) => return Err(Error::Sink(e)),
                Some(SinkEvent::Wrote { offset, len }) => (offset, len, None),
                Some(SinkEvent::Data { offset, data }) => (offset, data.len() as u64, Some(data)),
                Some(SinkEvent::Frame(note)) if note.method == m::FS_READ_STREAM_END => {
                    guard.ended = true;
                    check_end(&note, next)?;
                    return Ok(next);
                }
                Some(SinkEvent::Frame(note)) => {
                    let d: DataRef<'_> = note.decode_borrowed()?;
                    check_block(&note, (d.stream_id, d.offset), (head.stream_id, next))?;
                    let data = note.share(d.data);
                    (d.offset, data.len() as u64, Some(data))
                }
            };
            if offset != next {
                return Err(out_of_order(offset, next, head.stream_id));
            }
            if let Some(data) = data {
                state.sink.write_all(data).await.map_err(Error::Sink)?;
                state
                    .queued
                    .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
            }
            next += len;
            credit.consumed(len);
            progress(len);
        }
    }

    /// Write a file of any size atomically: `fs/openWrite`, pipelined
    /// `fs/writeBlock`s, `fs/commit`. The file appears whole or not at all.
    /// Returns the committed size.
    pub async fn write_stream<R: AsyncRead + Unpin>(
        &self,
        path: impl Into<WirePath>,
        reader: R,
        mode: Option<u32>,
    ) -> Result<u64, Error> {
        let meta = NewFile {
            mode,
            ..NewFile::default()
        };
        self.write_stream_with(path, reader, meta).await
    }

    /// [`Client::write_stream`], the committed file given `meta`'s mode
    /// and times (as `cp -p` / `scp -p` keep them).
    pub async fn write_stream_with<R: AsyncRead + Unpin>(
        &self,
        path: impl Into<WirePath>,
        mut reader: R,
        meta: NewFile,
    ) -> Result<u64, Error> {
        let h: HandleResult = self
            .request(
                m::FS_OPEN_WRITE,
                &OpenWriteParams {
                    path: path.into(),
                    mode: meta.mode,
                    create_parents: false,
                    mtime_ns: meta.mtime_ns,
                    atime_ns: meta.atime_ns,
                    sandbox: self.intent(),
                    cwd: None,
                },
            )
            .await?;
        let result = async {
            let mut inflight: VecDeque<Call> = VecDeque::new();
            let mut offset = 0u64;
            loop {
                let mut buf = vec![0u8; BLOCK as usize];
                let mut n = 0;
                while n < buf.len() {
                    let k = reader.read(&mut buf[n..]).await?;
                    if k == 0 {
                        break;
                    }
                    n += k;
                }
                if n == 0 {
                    break;
                }
                buf.truncate(n);
                if inflight.len() >= WINDOW {
                    if let Some(c) = inflight.pop_front() {
                        c.result::<Empty>().await?;
                    }
                }
                inflight.push_back(
                    self.start_call(
                        m::FS_WRITE_BLOCK,
                        &WriteBlockParams {
                            handle: h.handle,
                            offset,
                            data: ByteBuf::from(buf),
                            sandbox: None,
                            cwd: None,
                        },
                    )
                    .await?,
                );
                offset += n as u64;
            }
            for c in inflight {
                c.result::<Empty>().await?;
            }
            let r: CommitResult = self
                .call(&CommitParams {
                    handle: h.handle,
                    sandbox: None,
                    cwd: None,
                })
                .await?;
            Ok::<u64, Error>(r.size)
        }
        .await;
        if result.is_err() {
            // Discard the temp file; the error that matters is the first.
            let _ = self
                .call(&CloseParams {
                    handle: h.handle,
                    sandbox: None,
                    cwd: None,
                })
                .await;
        }
        result
    }

    /// A whole walk, page by page (following `next_cursor`), calling `each`
    /// with every page (under this client's intent when `params` has none). Stops at a truncation that has no cursor (max_depth).
    /// The next page is asked for as soon as a page is decoded, before
    /// `each` sees it: the agent walks on while this side hands the page
    /// out and frees it. An error ends the walk (an answer still in
    /// flight is discarded).
    pub async fn walk(
        &self,
        mut params: WalkParams,
        mut each: impl FnMut(&WalkResult),
    ) -> Result<(), Error> {
        if params.sandbox.is_none() {
            params.sandbox = self.intent();
        }
        let mut call = self.start_call(m::FS_WALK, &params).await?;
        loop {
            let page: WalkResult = call.result().await?;
            let next = match &page.next_cursor {
                Some(c) => {
                    params.cursor = Some(c.clone());
                    Some(self.start_call(m::FS_WALK, &params).await?)
                }
                None => None,
            };
            each(&page);
            drop(page);
            match next {
                Some(c) => call = c,
                None => return Ok(()),
            }
        }
    }
}

/// What a file written by [`Client::write_stream_with`] gets besides its
/// bytes; `None` leaves each as the agent would set it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NewFile {
    /// Permission bits (`0o7777` at most).
    pub mode: Option<u32>,
    /// Modification time, ns since the epoch.
    pub mtime_ns: Option<i64>,
    /// Access time, ns since the epoch.
    pub atime_ns: Option<i64>,
}

/// Default walk params for `root`.
pub fn walk_params(root: impl Into<WirePath>) -> WalkParams {
    WalkParams {
        root: root.into(),
        max_depth: WALK_MAX_DEPTH,
        max_entries: executor_protocol::limits::MAX_WALK_ENTRIES,
        max_directories: WALK_MAX_DIRECTORIES,
        max_response_bytes: executor_protocol::limits::MAX_WALK_RESPONSE_BYTES,
        include_hidden: true,
        cursor: None,
        sandbox: None,
        cwd: None,
    }
}

/// The window of one `fs/readStream` as the client returns it.
struct Credit {
    client: Client,
    stream_id: u64,
    /// Bytes consumed and not yet returned to the agent.
    unreturned: u64,
    /// Credit goes back in batches of this many bytes.
    return_at: u64,
    /// Errors answering `fs/readCredit`.
    failed: tokio::sync::mpsc::UnboundedReceiver<Error>,
    failed_tx: tokio::sync::mpsc::UnboundedSender<Error>,
}

impl Credit {
    fn new(client: &Client, stream_id: u64, params: &ReadStreamParams) -> Credit {
        let (failed_tx, failed) = tokio::sync::mpsc::unbounded_channel();
        Credit {
            client: client.clone(),
            stream_id,
            unreturned: 0,
            return_at: (params.credit_bytes / 4).max(params.block_bytes),
            failed,
            failed_tx,
        }
    }

    /// `bytes` more were consumed (their credit is due).
    fn consumed(&mut self, bytes: u64) {
        self.unreturned += bytes;
    }

    /// Return the credit of what was consumed, in batches; the answer is
    /// awaited on the side (an error ends the stream at its next block).
    async fn return_due(&mut self) -> Result<(), Error> {
        if self.unreturned < self.return_at {
            return Ok(());
        }
        let bytes = std::mem::take(&mut self.unreturned);
        let call = self
            .client
            .start_call(
                m::FS_READ_CREDIT,
                &ReadCreditParams {
                    stream_id: self.stream_id,
                    bytes,
                    sandbox: None,
                    cwd: None,
                },
            )
            .await?;
        let failed = self.failed_tx.clone();
        tokio::spawn(async move {
            match call.result::<Empty>().await {
                // The stream ended before the credit arrived: nothing owed.
                Err(e) if e.code() == Some(executor_protocol::ErrorCode::UnknownStream) => {}
                Err(e) => {
                    let _ = failed.send(e);
                }
                Ok(_) => {}
            }
        });
        Ok(())
    }
}

/// One `fs/readStream` as the client sees it.
struct PushedRead {
    sub: crate::Subscription,
    credit: Credit,
    /// Where the next block must start.
    next_offset: u64,
    /// The length of the block handed out last (taken: its credit is due
    /// once the next one is asked for).
    taken: u64,
    /// No more blocks will be handed out.
    done: bool,
    /// The agent's `fs/readStream/end` arrived (or the connection closed).
    ended: bool,
}

/// A `fs/readStream/data` notification, its data borrowed from the frame.
#[derive(serde::Deserialize)]
struct DataRef<'a> {
    stream_id: u64,
    offset: u64,
    #[serde(borrow)]
    data: &'a serde_bytes::Bytes,
}

fn closed_during(stream_id: u64) -> Error {
    Error::Closed(format!(
        "the connection closed during read stream {stream_id}"
    ))
}

fn out_of_order(offset: u64, expected: u64, stream_id: u64) -> Error {
    Error::Decode {
        method: m::FS_READ_STREAM_DATA.into(),
        message: format!(
            "a block at offset {offset} of stream {stream_id}; expected offset {expected}"
        ),
    }
}

/// A data block `(stream, offset)` where `want` was expected.
fn check_block(note: &crate::Notification, got: (u64, u64), want: (u64, u64)) -> Result<(), Error> {
    if got == want {
        return Ok(());
    }
    Err(Error::Decode {
        method: note.method.clone(),
        message: format!(
            "a block at offset {} of stream {}; expected offset {} of stream {}",
            got.1, got.0, want.1, want.0
        ),
    })
}

/// A stream's `fs/readStream/end`, after `received` data bytes.
fn check_end(note: &crate::Notification, received: u64) -> Result<(), Error> {
    let end: ReadStreamEnd = note.decode()?;
    if let Some(e) = end.error {
        return Err(Error::Remote(e));
    }
    if end.total != received {
        return Err(Error::Decode {
            method: note.method.clone(),
            message: format!(
                "the stream ended at {} bytes, {received} were received",
                end.total
            ),
        });
    }
    Ok(())
}

/// Cancel stream `stream_id` on the side (`fs/readCancel`), when a task
/// can be spawned.
fn cancel_stream(client: &Client, stream_id: u64) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let client = client.clone();
    rt.spawn(async move {
        let _ = client
            .request::<_, Empty>(
                m::FS_READ_CANCEL,
                &ReadCancelParams {
                    stream_id,
                    sandbox: None,
                    cwd: None,
                },
            )
            .await;
    });
}

impl PushedRead {
    async fn next_block(&mut self) -> Result<Option<Bytes>, Error> {
        if self.done {
            return Ok(None);
        }
        self.credit.consumed(std::mem::take(&mut self.taken));
        self.credit.return_due().await?;
        let note = tokio::select! {
            n = self.sub.recv() => n,
            Some(e) = self.credit.failed.recv() => return Err(e),
        };
        let Some(note) = note else {
            self.ended = true;
            return Err(closed_during(self.credit.stream_id));
        };
        if note.method == m::FS_READ_STREAM_END {
            (self.done, self.ended) = (true, true);
            check_end(&note, self.next_offset)?;
            return Ok(None);
        }
        let d: DataRef<'_> = note.decode_borrowed()?;
        check_block(
            &note,
            (d.stream_id, d.offset),
            (self.credit.stream_id, self.next_offset),
        )?;
        let data = note.share(d.data);
        self.next_offset += data.len() as u64;
        self.taken = data.len() as u64;
        Ok(Some(data))
    }
}

impl Drop for PushedRead {
    /// A stream let go of before its end is cancelled.
    fn drop(&mut self) {
        if !self.ended {
            cancel_stream(&self.credit.client, self.credit.stream_id);
        }
    }
}

/// A [`Client::read_stream_into`] in progress: dropped, it takes the sink
/// from the reader and cancels the stream unless it ended.
struct SinkGuard {
    client: Client,
    state: std::sync::Arc<crate::sink::SinkState>,
    /// Known once `fs/readStream` answered.
    stream_id: Option<u64>,
    ended: bool,
}

impl Drop for SinkGuard {
    fn drop(&mut self) {
        self.state
            .closed
            .store(true, std::sync::atomic::Ordering::Release);
        if let Some(id) = self.stream_id {
            self.client.unregister_sink(id);
            if !self.ended {
                cancel_stream(&self.client, id);
            }
        }
    }
}
