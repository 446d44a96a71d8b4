//! The session's streamed HTTP responses ([`Streams`]): their ids, their
//! cancellation tokens, and the `max_http_streams` slots.
//!
//! Below the session: it uses the protocol's types only. The
//! `http/request` and `http/cancel` handlers are in [`crate::http`].

use executor_protocol::{ErrorCode, WireError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// The session's open streams.
#[derive(Debug)]
pub struct Streams {
    next: AtomicU64,
    live: Mutex<HashMap<u64, CancellationToken>>,
    slots: Arc<Semaphore>,
    max: u64,
}

impl Streams {
    /// No stream yet; at most `max` at a time.
    pub fn new(max: u64) -> Self {
        Streams {
            next: AtomicU64::new(1),
            live: Mutex::new(HashMap::new()),
            slots: Arc::new(Semaphore::new(max as usize)),
            max,
        }
    }

    /// A stream slot, held until the stream ends (`limit_exceeded` naming
    /// `max_http_streams` when none is free).
    pub fn reserve_slot(&self) -> Result<OwnedSemaphorePermit, WireError> {
        self.slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| WireError::limit("max_http_streams", self.max, None))
    }

    /// Register a new stream: its id and the token that ends it.
    pub fn open(&self) -> (u64, CancellationToken) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let token = CancellationToken::new();
        self.live
            .lock()
            .expect("streams lock")
            .insert(id, token.clone());
        (id, token)
    }

    /// Cancel stream `id` (`unknown_stream` if it is not open).
    pub fn cancel(&self, id: u64) -> Result<(), WireError> {
        match self.live.lock().expect("streams lock").get(&id) {
            Some(token) => {
                token.cancel();
                Ok(())
            }
            None => Err(
                WireError::new(ErrorCode::UnknownStream, format!("no open stream {id}"))
                    .with("stream_id", id),
            ),
        }
    }

    /// End every stream (with a final `cancelled` delta).
    pub fn cancel_all(&self) {
        for token in self.live.lock().expect("streams lock").values() {
            token.cancel();
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
        let s = Streams::new(1);
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
    }
}
