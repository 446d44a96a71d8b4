//! Requests that happen once per client-chosen key: `process/start` with an
//! `idempotency_key` (per session) and `process/write` with a `write_id`
//! (per process). A [`Once`] table remembers, for the most recent keys (a
//! bounded number, the oldest forgotten first), a digest of the params the
//! key was first used with and that request's outcome; a retry with the
//! same key and params waits for (or reads) that outcome instead of doing
//! the work again, and a retry with other params is refused.
//!
//! Claiming a key is one step under the table's lock, so two concurrent
//! requests with the same key cannot both be first. The first one's work
//! runs in a task of its own ([`Once::run`]): a cancelled request or a
//! dropped connection loses only its answer, and a retry gets the outcome.
//!
//! Keys are kept as SHA-256 digests (a key is at most 128 bytes, its
//! digest always 32), so what a full table holds is fixed.
//!
//! A table: it uses `executor_protocol` and tokio, nothing of the agent.

use executor_protocol::{ErrorCode, WireError};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// A SHA-256 digest.
pub type Digest = [u8; 32];

/// The SHA-256 digest of `parts` (each length-prefixed, so that the
/// boundaries count).
pub fn digest(parts: &[&[u8]]) -> Digest {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for p in parts {
        ctx.update(&(p.len() as u64).to_le_bytes());
        ctx.update(p);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// Check a client-chosen key: 1..=`max` bytes, else `invalid_params`
/// naming `field`.
pub fn check_key(key: &str, field: &str, max: usize) -> Result<(), WireError> {
    if key.is_empty() || key.len() > max {
        return Err(WireError::invalid_params(
            field,
            format!("{field} must be 1..={max} bytes, got {}", key.len()),
        ));
    }
    Ok(())
}

type Outcome<T> = Option<Result<T, WireError>>;

/// What a key's first request came to, or is coming to.
#[derive(Debug)]
enum State<T> {
    Running(watch::Receiver<Outcome<T>>),
    Done(Result<T, WireError>),
}

#[derive(Debug)]
struct Entry<T> {
    params: Digest,
    state: State<T>,
}

#[derive(Debug)]
struct Inner<T> {
    map: HashMap<Digest, Entry<T>>,
    /// Keys in the order they were first used (each once).
    order: VecDeque<Digest>,
}

/// The most recent `cap` keys and what their first request came to.
#[derive(Debug)]
pub struct Once<T> {
    cap: usize,
    /// Whether a failed first request is forgotten (a retry does the work
    /// again) rather than answered again.
    forget_failures: bool,
    inner: Arc<Mutex<Inner<T>>>,
}

/// What claiming a key found.
enum Claim<T> {
    /// The key is new: this request does the work and reports here.
    First(watch::Sender<Outcome<T>>),
    /// The key's first request is still running: wait for its outcome.
    Wait(watch::Receiver<Outcome<T>>),
    /// The key's first request ended so.
    Done(Result<T, WireError>),
    /// The key was first used with other params.
    Mismatch,
}

impl<T: Clone + Send + Sync + 'static> Once<T> {
    /// A table remembering the last `cap` keys; with `forget_failures`, a
    /// first request that failed leaves its key unused.
    pub fn new(cap: usize, forget_failures: bool) -> Once<T> {
        Once {
            cap: cap.max(1),
            forget_failures,
            inner: Arc::new(Mutex::new(Inner {
                map: HashMap::new(),
                order: VecDeque::new(),
            })),
        }
    }

    /// How many keys are remembered.
    pub fn len(&self) -> usize {
        self.inner.lock().expect("once lock").map.len()
    }

    /// Whether no key is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn claim(&self, key: Digest, params: Digest) -> Claim<T> {
        let mut inner = self.inner.lock().expect("once lock");
        if let Some(e) = inner.map.get(&key) {
            if e.params != params {
                return Claim::Mismatch;
            }
            return match &e.state {
                State::Running(rx) => Claim::Wait(rx.clone()),
                State::Done(r) => Claim::Done(r.clone()),
            };
        }
        while inner.map.len() >= self.cap {
            let Some(old) = inner.order.pop_front() else {
                break;
            };
            inner.map.remove(&old);
        }
        let (tx, rx) = watch::channel(None);
        inner.map.insert(
            key,
            Entry {
                params,
                state: State::Running(rx),
            },
        );
        inner.order.push_back(key);
        Claim::First(tx)
    }

    /// The outcome of `key`'s first request is known: remember it (or
    /// forget the key), then tell whoever waits.
    fn finish(inner: &Mutex<Inner<T>>, forget: bool, key: Digest, r: &Result<T, WireError>) {
        let mut inner = inner.lock().expect("once lock");
        if forget && r.is_err() {
            if inner.map.remove(&key).is_some() {
                inner.order.retain(|k| *k != key);
            }
        } else if let Some(e) = inner.map.get_mut(&key) {
            e.state = State::Done(r.clone());
        }
    }

    /// Run `work` once for `key` (first used with params of digest
    /// `params`): the first request runs it in a task of its own, which
    /// goes on if the request is dropped; a request with the same key and
    /// params gets its outcome; one with other params is refused
    /// `invalid_params` naming `field`. `replayed` runs for a request
    /// answered with an earlier one's outcome.
    pub async fn run<F>(
        &self,
        key: &str,
        params: Digest,
        field: &str,
        replayed: impl FnOnce(),
        work: F,
    ) -> Result<T, WireError>
    where
        F: Future<Output = Result<T, WireError>> + Send + 'static,
    {
        let k = digest(&[key.as_bytes()]);
        let mut rx = match self.claim(k, params) {
            Claim::Mismatch => {
                return Err(WireError::invalid_params(
                    field,
                    format!("{field} {key:?} was already used with other params"),
                ))
            }
            Claim::Done(r) => {
                replayed();
                return r;
            }
            Claim::Wait(rx) => {
                replayed();
                rx
            }
            Claim::First(tx) => {
                let rx = tx.subscribe();
                let inner = self.inner.clone();
                let forget = self.forget_failures;
                tokio::spawn(async move {
                    // A panic in `work` ends this task: the guard then
                    // reports it, so that no one waits forever.
                    let guard = Report {
                        inner: inner.clone(),
                        forget,
                        key: k,
                        tx: Some(tx),
                    };
                    let r = work.await;
                    guard.send(r);
                });
                rx
            }
        };
        let outcome = match rx.wait_for(Option::is_some).await {
            Ok(r) => r.clone().expect("waited for an outcome"),
            Err(_) => Err(lost()),
        };
        outcome
    }
}

fn lost() -> WireError {
    WireError::new(
        ErrorCode::Internal,
        "internal error (a bug): the first request with this key ended without an outcome",
    )
}

/// Reports the first request's outcome, or (dropped without one: its task
/// panicked) an internal error, forgetting the key.
struct Report<T: Clone> {
    inner: Arc<Mutex<Inner<T>>>,
    forget: bool,
    key: Digest,
    tx: Option<watch::Sender<Outcome<T>>>,
}

impl<T: Clone + Send + Sync + 'static> Report<T> {
    fn send(mut self, r: Result<T, WireError>) {
        Once::finish(&self.inner, self.forget, self.key, &r);
        if let Some(tx) = self.tx.take() {
            tx.send_replace(Some(r));
        }
    }
}

impl<T: Clone> Drop for Report<T> {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            let mut inner = self.inner.lock().expect("once lock");
            if inner.map.remove(&self.key).is_some() {
                let key = self.key;
                inner.order.retain(|k| *k != key);
            }
            drop(inner);
            tx.send_replace(Some(Err(lost())));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn concurrent_requests_with_one_key_run_the_work_once() {
        let once: Arc<Once<u32>> = Arc::new(Once::new(16, true));
        let runs = Arc::new(AtomicU32::new(0));
        let mut tasks = Vec::new();
        for _ in 0..32 {
            let (once, runs) = (once.clone(), runs.clone());
            tasks.push(tokio::spawn(async move {
                once.run("k", digest(&[b"p"]), "key", || {}, async move {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    Ok(runs.fetch_add(1, Ordering::SeqCst) + 100)
                })
                .await
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap().unwrap(), 100);
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        // Other params under the same key: refused, naming the field.
        let e = once
            .run("k", digest(&[b"q"]), "key", || {}, async { Ok(0) })
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidParams);
        assert_eq!(e.data_get("field").and_then(|v| v.as_str()), Some("key"));
    }

    #[tokio::test]
    async fn a_dropped_first_request_still_finishes_and_a_retry_gets_its_outcome() {
        let once: Once<u32> = Once::new(16, true);
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let first = once.run("k", digest(&[]), "key", || {}, async move {
            let _ = wait.await;
            Ok(7)
        });
        // Polled once (the key is claimed, the work spawned), then dropped.
        let _ = tokio::time::timeout(std::time::Duration::from_millis(10), first).await;
        go.send(()).unwrap();
        let again = once
            .run("k", digest(&[]), "key", || {}, async { Ok(8) })
            .await;
        assert_eq!(again.unwrap(), 7);
    }

    #[tokio::test]
    async fn failures_are_forgotten_or_answered_again_and_the_oldest_key_goes_first() {
        let fail = || async { Err::<u32, _>(WireError::new(ErrorCode::Io, "no")) };
        let forgetting: Once<u32> = Once::new(2, true);
        assert!(forgetting
            .run("a", [0; 32], "k", || {}, fail())
            .await
            .is_err());
        assert_eq!(
            forgetting
                .run("a", [0; 32], "k", || {}, async { Ok(1) })
                .await
                .unwrap(),
            1
        );
        let keeping: Once<u32> = Once::new(2, false);
        assert!(keeping.run("a", [0; 32], "k", || {}, fail()).await.is_err());
        assert!(keeping
            .run("a", [0; 32], "k", || {}, async { Ok(1) })
            .await
            .is_err());
        // Bounded: a third key forgets the first.
        keeping
            .run("b", [0; 32], "k", || {}, async { Ok(2) })
            .await
            .unwrap();
        keeping
            .run("c", [0; 32], "k", || {}, async { Ok(3) })
            .await
            .unwrap();
        assert_eq!(keeping.len(), 2);
        assert_eq!(
            keeping
                .run("a", [0; 32], "k", || {}, async { Ok(4) })
                .await
                .unwrap(),
            4
        );
        assert_eq!(
            keeping
                .run("c", [0; 32], "k", || {}, async { Ok(5) })
                .await
                .unwrap(),
            3
        );
    }
}
