//! A thread per key (a user, say) for work that may wait as long as that key's owner likes: a
//! close of what a user passed ([`crate::serve::closer`]), a lock of a user's window pages
//! ([`crate::stream::prefetch`]). One key's stuck item holds up only that key's later items; the
//! others' threads go on. Each thread ends after [`IDLE_EXIT`] with nothing to do, so threads
//! are bounded by the keys with work waiting.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use log::warn;

/// How long a key's thread waits for more before it ends.
pub(crate) const IDLE_EXIT: Duration = Duration::from_secs(5);

/// What each thread does: `start` once when it begins, `work` for each item.
type Start<K> = dyn Fn(K) + Send + Sync;
type Work<K, T> = dyn Fn(K, T) + Send + Sync;

/// Threads by key, each with its queue. Cloned freely: every clone submits to the same threads.
pub(crate) struct KeyedThreads<K, T> {
    queues: Arc<Mutex<HashMap<K, Queue<T>>>>,
    name: String,
    start: Arc<Start<K>>,
    work: Arc<Work<K, T>>,
}

impl<K, T> Clone for KeyedThreads<K, T> {
    fn clone(&self) -> Self {
        Self {
            queues: Arc::clone(&self.queues),
            name: self.name.clone(),
            start: Arc::clone(&self.start),
            work: Arc::clone(&self.work),
        }
    }
}

impl<K, T> std::fmt::Debug for KeyedThreads<K, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedThreads")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// One key's thread and what waits for it.
struct Queue<T> {
    /// To the thread; `None` while no thread could be started (items wait in `backlog`).
    sender: Option<mpsc::Sender<T>>,
    /// Items submitted and not yet done, `backlog` included.
    pending: Arc<AtomicUsize>,
    /// Items that wait for a thread to start.
    backlog: Vec<T>,
}

impl<K, T> KeyedThreads<K, T>
where
    K: Copy + Eq + Hash + Send + 'static,
    T: Send + 'static,
{
    /// Threads named `name` (the kernel keeps 15 bytes of it) that run `start` when they
    /// begin and `work` on each item.
    pub(crate) fn new(
        name: &str,
        start: impl Fn(K) + Send + Sync + 'static,
        work: impl Fn(K, T) + Send + Sync + 'static,
    ) -> Self {
        Self {
            queues: Arc::default(),
            name: name.to_owned(),
            start: Arc::new(start),
            work: Arc::new(work),
        }
    }

    /// Hands `item` to `key`'s thread, starting one if there is none. Never waits for the
    /// work, and never does it on the caller's thread.
    pub(crate) fn submit(&self, key: K, item: T) {
        let mut queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
        let queue = queues.entry(key).or_insert_with(|| Queue {
            sender: None,
            pending: Arc::new(AtomicUsize::new(0)),
            backlog: Vec::new(),
        });
        queue.pending.fetch_add(1, Ordering::SeqCst);
        queue.backlog.push(item);
        if queue.sender.is_none() {
            queue.sender = self.start_thread(key, Arc::clone(&queue.pending));
        }
        if let Some(sender) = &queue.sender {
            let mut items = queue.backlog.drain(..);
            // A thread ends only under this lock, after removing its queue: it is there,
            // unless it died; then what could not be sent waits for a new one.
            let unsent: Vec<T> = items
                .by_ref()
                .filter_map(|item| sender.send(item).err().map(|error| error.0))
                .collect();
            drop(items);
            if !unsent.is_empty() {
                queue.sender = None;
                queue.backlog = unsent;
            }
        }
    }

    /// Items of `key` submitted and not yet done.
    #[must_use]
    pub(crate) fn pending(&self, key: K) -> usize {
        let queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
        queues
            .get(&key)
            .map_or(0, |queue| queue.pending.load(Ordering::SeqCst))
    }

    /// Threads running.
    #[must_use]
    #[cfg(test)]
    pub(crate) fn threads(&self) -> usize {
        let queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
        queues
            .values()
            .filter(|queue| queue.sender.is_some())
            .count()
    }

    fn start_thread(&self, key: K, pending: Arc<AtomicUsize>) -> Option<mpsc::Sender<T>> {
        let (sender, receiver) = mpsc::channel::<T>();
        let queues = Arc::clone(&self.queues);
        let (start, work) = (Arc::clone(&self.start), Arc::clone(&self.work));
        let started = std::thread::Builder::new()
            .name(self.name.clone())
            .spawn(move || {
                start(key);
                serve_until_idle(key, &receiver, &pending, &queues, &*work);
            });
        match started {
            Ok(_) => Some(sender),
            Err(error) => {
                // Tried again at the key's next item; meanwhile this one waits.
                warn!("cannot start a {} thread: {error}", self.name);
                None
            }
        }
    }
}

/// A key's thread: does what comes until nothing has for [`IDLE_EXIT`], then removes its
/// queue (under the lock every submitter holds, so nothing is sent to a thread that ended).
fn serve_until_idle<K: Copy + Eq + Hash, T>(
    key: K,
    receiver: &mpsc::Receiver<T>,
    pending: &AtomicUsize,
    queues: &Mutex<HashMap<K, Queue<T>>>,
    work: &Work<K, T>,
) {
    loop {
        match receiver.recv_timeout(IDLE_EXIT) {
            Ok(item) => {
                // A panic in one item's work must not end the thread: its queue would stay,
                // with nobody to take from it (and a closer's items would then be dropped on
                // the submitter's thread).
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(key, item)));
                pending.fetch_sub(1, Ordering::SeqCst);
            }
            Err(RecvTimeoutError::Timeout) => {
                let mut queues = queues.lock().unwrap_or_else(PoisonError::into_inner);
                if pending.load(Ordering::SeqCst) == 0 {
                    queues.remove(&key);
                    return;
                }
            }
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn settled<T: Send + 'static>(threads: &KeyedThreads<u32, T>, key: u32) -> bool {
        let deadline = Instant::now() + Duration::from_secs(2);
        while threads.pending(key) > 0 {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    #[test]
    fn a_key_whose_work_waits_holds_up_no_other_key() {
        // Key 1's first item waits until the test lets it go.
        let (release, released) = mpsc::channel::<()>();
        let released = Mutex::new(released);
        let done = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&done);
        let threads = KeyedThreads::new(
            "test-keyed",
            |_| {},
            move |key: u32, item: u32| {
                if key == 1 && item == 0 {
                    let _ = released
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .recv();
                }
                seen.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((key, item));
            },
        );
        threads.submit(1, 0);
        threads.submit(1, 1);
        threads.submit(2, 0);
        assert!(settled(&threads, 2), "key 2 is served while key 1 waits");
        assert_eq!(threads.pending(1), 2);
        release.send(()).expect("release");
        assert!(settled(&threads, 1));
        let done = done.lock().unwrap_or_else(PoisonError::into_inner).clone();
        assert_eq!(done, vec![(2, 0), (1, 0), (1, 1)], "each key in order");
    }

    #[test]
    fn threads_start_once_per_key_and_end_when_idle() {
        let starts = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&starts);
        let threads = KeyedThreads::new(
            "test-keyed",
            move |_| {
                counted.fetch_add(1, Ordering::SeqCst);
            },
            |_: u32, (): ()| {},
        );
        for _ in 0..10 {
            threads.submit(7, ());
        }
        assert!(settled(&threads, 7));
        assert_eq!(threads.threads(), 1);
        assert_eq!(starts.load(Ordering::SeqCst), 1);
        let deadline = Instant::now() + IDLE_EXIT + Duration::from_secs(2);
        while threads.threads() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(threads.threads(), 0, "an idle thread ends");
    }
}
