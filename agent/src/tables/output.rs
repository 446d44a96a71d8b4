//! The bounded per-process output buffer behind `process/read`.

use bytes::Bytes;
use executor_protocol::types::process::OutputStream;
use std::collections::VecDeque;

/// One chunk of output, numbered per process from 0 without gaps.
#[derive(Debug, Clone)]
pub struct Chunk {
    pub seq: u64,
    pub stream: OutputStream,
    pub data: Bytes,
}

/// Retained output: the newest chunks up to `cap` bytes (always at least
/// the newest chunk). When older chunks are dropped, `dropped_before` says
/// from which seq the buffer is complete, so loss is never silent.
#[derive(Debug)]
pub struct OutputBuffer {
    chunks: VecDeque<Chunk>,
    bytes: usize,
    cap: usize,
    next_seq: u64,
    dropped: bool,
}

impl OutputBuffer {
    pub fn new(cap: usize) -> Self {
        OutputBuffer {
            chunks: VecDeque::new(),
            bytes: 0,
            cap,
            next_seq: 0,
            dropped: false,
        }
    }

    /// Append a chunk; returns its seq.
    pub fn push(&mut self, stream: OutputStream, data: Bytes) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.bytes += data.len();
        self.chunks.push_back(Chunk { seq, stream, data });
        while self.bytes > self.cap && self.chunks.len() > 1 {
            if let Some(old) = self.chunks.pop_front() {
                self.bytes -= old.data.len();
                self.dropped = true;
            }
        }
        seq
    }

    /// The seq the next chunk will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The first seq still held (== `next_seq` when empty).
    pub fn first_seq(&self) -> u64 {
        self.chunks.front().map(|c| c.seq).unwrap_or(self.next_seq)
    }

    /// Set when chunks were dropped: the first seq still held.
    pub fn dropped_before(&self) -> Option<u64> {
        self.dropped.then(|| self.first_seq())
    }

    /// Chunks with `seq > after` (all when `after` is None), at most
    /// `max_bytes` of data but at least one chunk when one is available.
    pub fn read(&self, after: Option<u64>, max_bytes: usize) -> Vec<Chunk> {
        let start = match after {
            None => 0,
            Some(a) => a.saturating_add(1),
        };
        let first = self.first_seq();
        let skip = start.saturating_sub(first) as usize;
        let mut out = Vec::new();
        let mut total = 0usize;
        for c in self.chunks.iter().skip(skip) {
            if !out.is_empty() && total + c.data.len() > max_bytes {
                break;
            }
            total += c.data.len();
            out.push(c.clone());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflow_drops_oldest_and_says_so() {
        let mut b = OutputBuffer::new(10);
        for i in 0..5u8 {
            b.push(OutputStream::Stdout, Bytes::from(vec![i; 4]));
        }
        assert_eq!(b.next_seq(), 5);
        assert_eq!(b.dropped_before(), Some(3));
        let all = b.read(None, 1 << 20);
        assert_eq!(all.iter().map(|c| c.seq).collect::<Vec<_>>(), vec![3, 4]);
        assert_eq!(b.read(Some(3), 1 << 20).len(), 1);
        assert_eq!(b.read(Some(4), 1 << 20).len(), 0);
        // At least one chunk even when bigger than max_bytes.
        assert_eq!(b.read(None, 1).len(), 1);
    }
}
