//! Kernel pipes that carry a block of a file by reference from a read
//! stream to the connection's writer (`splice(2)`, Linux): [`PipePool`],
//! a session's pipes within a byte budget and a count, and [`PooledPipe`],
//! one of them lent out with the bytes it holds.
//!
//! A block is spliced from the file into an empty pipe of its own before
//! its frame head (which carries its length) is made: the bytes the pipe
//! holds are then fixed (a file that shrinks afterwards cannot take them
//! back), so the writer always delivers exactly what the head announced.
//! The pipe holds references to page-cache pages, not copies: what the
//! client receives is those pages as they are when they are written out (a
//! write to the file meanwhile shows, as with `sendfile`; a cut at the new
//! end of the file may show zeros in that page), never a different length.
//!
//! A pipe goes back to the pool only empty; one dropped with bytes in it
//! (its frame was never written: the connection ended) is closed, so no
//! block can ever carry another's leftovers.
//!
//! Part of the bottom layer with [`super`]: it uses the sandbox crate's
//! system calls and nothing of the agent.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};

/// Pipes one session may hold at once (in use and idle): each is two file
/// descriptors, and the agent's descriptors are shared with open handles
/// and jobs.
pub const MAX_PIPES: usize = 32;

/// The smallest block worth splicing: below it a copy costs less than the
/// pipe round trip.
pub const MIN_SPLICE_BYTES: usize = 64 * 1024;

/// The system's page size (a pipe holds one page, or part of one, per
/// slot).
pub fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .and_then(|p| usize::try_from(p).ok())
            .filter(|p| p.is_power_of_two())
            .unwrap_or(4096)
    })
}

/// The pipe capacity (bytes) that holds `len` bytes of a file from
/// `offset`: one slot per page the range touches.
pub fn capacity_for(offset: u64, len: usize) -> usize {
    let page = page_size();
    let first = (offset % page as u64) as usize;
    (first + len).div_ceil(page) * page
}

/// One kernel pipe, both ends non-blocking.
#[derive(Debug)]
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// Bytes of slots (`F_GETPIPE_SZ`).
    capacity: usize,
}

impl Pipe {
    /// A pipe of at least `capacity` bytes (`None` when the kernel will not
    /// give one that large: `fs.pipe-max-size`, the user's pipe quota, or
    /// no descriptors left).
    fn open(capacity: usize) -> Option<Pipe> {
        use nix::fcntl::{fcntl, FcntlArg, OFlag};
        let (read, write) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC).ok()?;
        let want = i32::try_from(capacity).ok()?;
        let got = fcntl(&write, FcntlArg::F_SETPIPE_SZ(want)).ok()?;
        let capacity = usize::try_from(got).ok().filter(|&c| c >= capacity)?;
        Some(Pipe {
            read,
            write,
            capacity,
        })
    }
}

/// A session's pipes: at most `budget` bytes of pipe capacity and
/// [`MAX_PIPES`] pipes, in use and idle together. Idle pipes are kept for
/// the next block; one too small is closed when a larger one is needed.
#[derive(Debug)]
pub struct PipePool {
    budget: usize,
    state: Mutex<PoolState>,
}

#[derive(Debug, Default)]
struct PoolState {
    idle: Vec<Pipe>,
    /// Capacity of every pipe of the pool, in use or idle.
    bytes: usize,
    /// Pipes of the pool, in use or idle.
    count: usize,
}

impl PipePool {
    /// A pool of at most `budget` bytes of pipes.
    pub fn new(budget: usize) -> Arc<PipePool> {
        Arc::new(PipePool {
            budget,
            state: Mutex::new(PoolState::default()),
        })
    }

    /// An empty pipe of at least `capacity` bytes: an idle one, else a new
    /// one within the budget (`None`: not now; the block is copied
    /// instead).
    pub fn take(self: &Arc<Self>, capacity: usize) -> Option<PooledPipe> {
        let mut st = self.state.lock().expect("pipe pool lock");
        let fitting = st
            .idle
            .iter()
            .enumerate()
            .filter(|(_, p)| p.capacity >= capacity)
            .min_by_key(|(_, p)| p.capacity)
            .map(|(i, _)| i);
        if let Some(i) = fitting {
            let pipe = st.idle.swap_remove(i);
            return Some(self.lend(pipe));
        }
        // A new pipe is rounded up to a power of two of pages.
        let reserve = capacity.checked_next_power_of_two()?;
        // Idle pipes too small for this one make room for it.
        while st.bytes + reserve > self.budget || st.count >= MAX_PIPES {
            let small = st.idle.pop()?;
            st.bytes -= small.capacity;
            st.count -= 1;
        }
        st.bytes += reserve;
        st.count += 1;
        drop(st);
        let opened = Pipe::open(capacity);
        let mut st = self.state.lock().expect("pipe pool lock");
        st.bytes -= reserve;
        match opened {
            Some(pipe) => {
                st.bytes += pipe.capacity;
                drop(st);
                Some(self.lend(pipe))
            }
            None => {
                st.count -= 1;
                None
            }
        }
    }

    fn lend(self: &Arc<Self>, pipe: Pipe) -> PooledPipe {
        PooledPipe {
            pipe: Some(pipe),
            pool: self.clone(),
            held: 0,
        }
    }

    /// Pipes of the pool (in use and idle) and their capacity in bytes.
    pub fn usage(&self) -> (usize, usize) {
        let st = self.state.lock().expect("pipe pool lock");
        (st.count, st.bytes)
    }
}

/// A pipe of a [`PipePool`], lent out, and the bytes it holds. Dropped, it
/// goes back to the pool if it is empty, else it is closed.
#[derive(Debug)]
pub struct PooledPipe {
    pipe: Option<Pipe>,
    pool: Arc<PipePool>,
    held: usize,
}

impl PooledPipe {
    fn pipe(&self) -> &Pipe {
        self.pipe.as_ref().expect("a lent pipe until dropped")
    }

    /// Bytes in the pipe, not yet moved out.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Splice `len` bytes of `file` from `offset` into the (empty) pipe.
    /// `Ok(true)`: the pipe holds them all, or all up to the end of the
    /// file; `Ok(false)`: it holds only part of them (it filled up, or the
    /// file failed midway); `Err`: nothing was spliced (`EINVAL`: the
    /// file's filesystem cannot splice). Reads the file: call it where
    /// blocking is allowed.
    pub fn fill(&mut self, file: &std::fs::File, offset: u64, len: usize) -> io::Result<bool> {
        debug_assert_eq!(self.held, 0, "a pipe is filled only empty");
        loop {
            let at = offset + self.held as u64;
            let r = executor_sys::splice_file_to_pipe(
                file.as_fd(),
                at,
                self.pipe().write.as_fd(),
                len - self.held,
            );
            match r {
                Ok(0) => return Ok(true),
                Ok(n) => {
                    self.held += n;
                    if self.held == len {
                        return Ok(true);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if self.held == 0 => return Err(e),
                Err(_) => return Ok(false),
            }
        }
    }

    /// The read end, to splice the held bytes out of.
    pub fn source(&self) -> BorrowedFd<'_> {
        self.pipe().read.as_fd()
    }

    /// `n` held bytes were moved out of the pipe.
    pub fn drained(&mut self, n: usize) {
        self.held = self.held.saturating_sub(n);
    }

    /// Every held byte, read out of the pipe into memory (where they cannot
    /// be spliced on). Never waits: the bytes are in the pipe.
    pub fn read_back(&mut self) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; self.held];
        let mut got = 0;
        while got < buf.len() {
            match nix::unistd::read(self.pipe().read.as_fd(), &mut buf[got..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => got += n,
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.held = 0;
        Ok(buf)
    }
}

impl Drop for PooledPipe {
    fn drop(&mut self) {
        let Some(pipe) = self.pipe.take() else {
            return;
        };
        let mut st = self.pool.state.lock().expect("pipe pool lock");
        if self.held == 0 {
            st.idle.push(pipe);
        } else {
            // Its frame was never written whole: closed, never reused.
            st.bytes -= pipe.capacity;
            st.count -= 1;
            drop(st);
            drop(pipe);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_of(data: &[u8]) -> std::fs::File {
        let mut f = tempfile_in_tmp();
        f.write_all(data).unwrap();
        f
    }

    fn tempfile_in_tmp() -> std::fs::File {
        let p = std::env::temp_dir().join(format!(
            "executor-pipes-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        std::fs::remove_file(&p).unwrap();
        f
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 253) as u8).collect()
    }

    #[test]
    fn a_block_is_pinned_whole_and_read_back_exactly() {
        let page = page_size();
        let data = pattern(3 * page + 17);
        let f = file_of(&data);
        let pool = PipePool::new(1 << 20);
        let mut p = pool.take(capacity_for(5, 2 * page)).unwrap();
        assert!(p.fill(&f, 5, 2 * page).unwrap());
        assert_eq!(p.held(), 2 * page);
        assert_eq!(p.read_back().unwrap(), &data[5..5 + 2 * page]);
        // Up to the end of the file: whole, and short.
        assert!(p.fill(&f, 3 * page as u64, page).unwrap());
        assert_eq!(p.read_back().unwrap(), &data[3 * page..]);
        // Past the end: nothing, and complete.
        assert!(p.fill(&f, 10 * page as u64, page).unwrap());
        assert_eq!(p.held(), 0);
    }

    #[test]
    fn a_pipe_too_small_holds_part_and_says_so() {
        let page = page_size();
        let data = pattern(4 * page);
        let f = file_of(&data);
        let pool = PipePool::new(1 << 20);
        // One page of room for a range touching three pages.
        let mut p = pool.take(page).unwrap();
        assert!(p.pipe().capacity < capacity_for(1, 2 * page));
        let whole = p.fill(&f, 1, 2 * page).unwrap();
        assert!(!whole, "a pipe too small cannot hold the block");
        assert!(p.held() > 0 && p.held() < 2 * page);
        let n = p.held();
        assert_eq!(p.read_back().unwrap(), &data[1..1 + n]);
    }

    #[test]
    fn only_empty_pipes_go_back_and_the_budget_holds() {
        let page = page_size();
        let f = file_of(&pattern(4 * page));
        let pool = PipePool::new(4 * page);
        let mut a = pool.take(2 * page).unwrap();
        let b = pool.take(2 * page).unwrap();
        assert_eq!(pool.usage(), (2, 4 * page));
        // Over the budget: none.
        assert!(pool.take(page).is_none());
        drop(b);
        assert_eq!(pool.usage(), (2, 4 * page), "an empty pipe is kept idle");
        // A pipe dropped holding bytes is closed, not reused.
        assert!(a.fill(&f, 0, page).unwrap());
        drop(a);
        assert_eq!(pool.usage(), (1, 2 * page));
        // A larger need closes the idle small pipe to make room.
        let big = pool.take(4 * page).unwrap();
        assert_eq!(pool.usage(), (1, 4 * page));
        drop(big);
        let again = pool.take(page).unwrap();
        assert_eq!(again.pipe().capacity, 4 * page, "the idle pipe is reused");
    }

    #[test]
    fn a_filesystem_that_cannot_splice_is_an_error_with_nothing_held() {
        // procfs's /proc/self/status has no splice support.
        let f = std::fs::File::open("/proc/self/status").unwrap();
        let pool = PipePool::new(1 << 20);
        let mut p = pool.take(MIN_SPLICE_BYTES).unwrap();
        let e = p.fill(&f, 0, MIN_SPLICE_BYTES).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
        assert_eq!(p.held(), 0);
    }
}
