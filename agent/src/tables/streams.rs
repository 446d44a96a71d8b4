//! The session's streams ([`Streams`]): their ids, their cancellation
//! tokens, a read stream's [`Credit`], and the slots of their limit (one
//! table for streamed HTTP responses, `max_http_streams`, one for
//! `fs/readStream`, `max_read_streams`).
//!
//! Below the session: it uses the protocol's types only. The
//! `http/request` and `http/cancel` handlers are in [`crate::http`], the
//! read streams' in `crate::fs::stream`.

use executor_protocol::{ErrorCode, WireError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// The session's open streams of one kind.
#[derive(Debug)]
pub struct Streams {
    next: AtomicU64,
    live: Mutex<HashMap<u64, Entry>>,
    slots: Arc<Semaphore>,
    max: u64,
    /// The limit that bounds the table, as errors name it.
    limit: &'static str,
}

#[derive(Debug)]
struct Entry {
    token: CancellationToken,
    credit: Option<Arc<Credit>>,
}

/// A read stream's window: the agent has at most `window` bytes sent and
/// not yet returned by the client.
#[derive(Debug)]
pub struct Credit {
    window: u64,
    outstanding: Mutex<u64>,
    returned: tokio::sync::Notify,
}

impl Credit {
    fn new(window: u64) -> Credit {
        Credit {
            window,
            outstanding: Mutex::new(0),
            returned: tokio::sync::Notify::new(),
        }
    }

    /// Wait until `n` more bytes fit in the window, then count them as
    /// sent (`n` is at most the window).
    pub async fn take(&self, n: u64) {
        loop {
            {
                let mut out = self.outstanding.lock().expect("credit lock");
                if *out + n <= self.window {
                    *out += n;
                    return;
                }
            }
            // `notify_one` keeps a permit: a return between the check and
            // this wait is not missed.
            self.returned.notified().await;
        }
    }

    /// `n` bytes taken and not sent after all (the end of the file).
    pub fn untake(&self, n: u64) {
        let mut out = self.outstanding.lock().expect("credit lock");
        *out = out.saturating_sub(n);
    }

    /// Bytes sent and not yet returned.
    pub fn outstanding(&self) -> u64 {
        *self.outstanding.lock().expect("credit lock")
    }

    /// The client returned `n` bytes: more than are outstanding would widen
    /// the window past `credit_bytes` (`limit_exceeded`).
    fn give_back(&self, id: u64, n: u64) -> Result<(), WireError> {
        let mut out = self.outstanding.lock().expect("credit lock");
        if n > *out {
            return Err(WireError::limit("credit_bytes", self.window, Some(n))
                .with("stream_id", id)
                .with("outstanding", *out)
                .with(
                    "why",
                    "fs/readCredit returned more bytes than were sent and not yet returned",
                ));
        }
        *out -= n;
        drop(out);
        self.returned.notify_one();
        Ok(())
    }
}

fn unknown_stream(id: u64) -> WireError {
    WireError::new(ErrorCode::UnknownStream, format!("no open stream {id}")).with("stream_id", id)
}

impl Streams {
    /// No stream yet; at most `max` at a time, `limit` naming that bound.
    pub fn new(max: u64, limit: &'static str) -> Self {
        Streams {
            next: AtomicU64::new(1),
            live: Mutex::new(HashMap::new()),
            slots: Arc::new(Semaphore::new(max as usize)),
            max,
            limit,
        }
    }

    /// A stream slot, held until the stream ends (`limit_exceeded` naming
    /// the table's limit when none is free).
    pub fn reserve_slot(&self) -> Result<OwnedSemaphorePermit, WireError> {
        self.slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| WireError::limit(self.limit, self.max, None))
    }

    fn register(&self, credit: Option<Arc<Credit>>) -> (u64, CancellationToken) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let token = CancellationToken::new();
        let entry = Entry {
            token: token.clone(),
            credit,
        };
        self.live.lock().expect("streams lock").insert(id, entry);
        (id, token)
    }

    /// Register a new stream: its id and the token that ends it.
    pub fn open(&self) -> (u64, CancellationToken) {
        self.register(None)
    }

    /// Register a new stream with a window of `window` bytes.
    pub fn open_with_credit(&self, window: u64) -> (u64, CancellationToken, Arc<Credit>) {
        let credit = Arc::new(Credit::new(window));
        let (id, token) = self.register(Some(credit.clone()));
        (id, token, credit)
    }

    /// Return `bytes` to stream `id`'s window (`unknown_stream` if it is
    /// not open or has no window).
    pub fn give_back(&self, id: u64, bytes: u64) -> Result<(), WireError> {
        let credit = match self.live.lock().expect("streams lock").get(&id) {
            Some(Entry {
                credit: Some(c), ..
            }) => c.clone(),
            _ => return Err(unknown_stream(id)),
        };
        credit.give_back(id, bytes)
    }

    /// Cancel stream `id` (`unknown_stream` if it is not open).
    pub fn cancel(&self, id: u64) -> Result<(), WireError> {
        match self.live.lock().expect("streams lock").get(&id) {
            Some(entry) => {
                entry.token.cancel();
                Ok(())
            }
            None => Err(unknown_stream(id)),
        }
    }

    /// End every stream (each sends its end marking it `cancelled`).
    pub fn cancel_all(&self) {
        for entry in self.live.lock().expect("streams lock").values() {
            entry.token.cancel();
        }
    }

    /// Forget stream `id` (it ended).
    pub fn remove(&self, id: u64) {
        self.live.lock().expect("streams lock").remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_bounded_and_cancel_names_unknown_streams() {
        let s = Streams::new(1, "max_http_streams");
        let held = s.reserve_slot().unwrap();
        let e = s.reserve_slot().unwrap_err();
        assert_eq!(e.code, ErrorCode::LimitExceeded);
        drop(held);
        assert!(s.reserve_slot().is_ok());
        let (id, token) = s.open();
        assert!(s.cancel(id).is_ok());
        assert!(token.is_cancelled());
        s.remove(id);
        let e = s.cancel(id).unwrap_err();
        assert_eq!(e.code, ErrorCode::UnknownStream);
        assert_eq!(e.data_get("stream_id").and_then(|v| v.as_u64()), Some(id));
        assert_eq!(
            s.give_back(id, 1).unwrap_err().code,
            ErrorCode::UnknownStream
        );
    }

    #[tokio::test]
    async fn a_window_holds_at_most_its_credit_and_refuses_returns_beyond_what_was_sent() {
        let s = Streams::new(2, "max_read_streams");
        let (id, _token, credit) = s.open_with_credit(10);
        credit.take(6).await;
        credit.take(4).await;
        assert_eq!(credit.outstanding(), 10);
        // Full: the next take waits until bytes come back.
        let c = credit.clone();
        let waiting = tokio::spawn(async move { c.take(3).await });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        s.give_back(id, 3).unwrap();
        waiting.await.unwrap();
        assert_eq!(credit.outstanding(), 10);
        let e = s.give_back(id, 11).unwrap_err();
        assert_eq!(e.code, ErrorCode::LimitExceeded);
        assert_eq!(
            e.data_get("limit").and_then(|v| v.as_str()),
            Some("credit_bytes")
        );
        assert_eq!(credit.outstanding(), 10);
        // An HTTP stream has no window.
        let (plain, _) = s.open();
        assert_eq!(
            s.give_back(plain, 1).unwrap_err().code,
            ErrorCode::UnknownStream
        );
    }
}
