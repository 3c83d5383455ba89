//! The metrics connections served at once, and who gives way when they are all taken.
//!
//! A slot is held from accept until the exchange ends. A connection that has not yet sent its
//! whole request head has asked for nothing, so when every slot is taken a new connection takes
//! the slot of the one that has waited longest for its head, which is dropped: clients that
//! trickle their heads (or send nothing) cannot keep a scraper out, however many there are.
//! Prometheus sends its head as soon as it connects, so it waits for its head far less than
//! any connection that pushes it out. Only connections whose head was read keep their slot
//! until their exchange ends (their answer written within `WRITE_TIMEOUT`, the whole exchange
//! within `EXCHANGE_TIMEOUT`); a new connection that finds every
//! slot held by those is answered 503.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

/// The slots, shared by the accept loop and the exchanges.
#[derive(Debug)]
pub(super) struct Slots {
    state: Mutex<State>,
    most: usize,
}

#[derive(Debug, Default)]
struct State {
    /// Slots held, by connections reading their head or being served.
    held: usize,
    /// Connections still reading their head, oldest first, with what tells each it was
    /// pushed out.
    reading: VecDeque<(u64, oneshot::Sender<()>)>,
    next_id: u64,
}

/// One connection's slot; given back on drop, unless it was passed to a newer connection.
#[derive(Debug)]
pub(super) struct Slot {
    slots: Arc<Slots>,
    id: u64,
    /// Its head was read: it keeps the slot until it drops it.
    serving: bool,
    /// Fires when a newer connection took the slot.
    pushed_out: Option<oneshot::Receiver<()>>,
}

impl Slots {
    pub(super) fn new(most: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State::default()),
            most,
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Nothing panics while holding the lock; a poisoned lock still holds a sound count.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for a new connection: a free one, else the slot of the connection that has
    /// waited longest for its head (told to go). `None` when every slot serves a request.
    pub(super) fn take(self: &Arc<Self>) -> Option<Slot> {
        let mut state = self.state();
        if state.held < self.most {
            state.held += 1;
        } else {
            let (_, oldest) = state.reading.pop_front()?;
            // The slot passes to the new connection: `held` stays.
            let _ = oldest.send(());
        }
        let id = state.next_id;
        state.next_id += 1;
        let (tell, pushed_out) = oneshot::channel();
        state.reading.push_back((id, tell));
        Some(Slot {
            slots: Arc::clone(self),
            id,
            serving: false,
            pushed_out: Some(pushed_out),
        })
    }

    #[cfg(test)]
    fn held(&self) -> usize {
        self.state().held
    }
}

impl Slot {
    /// Resolves when a newer connection took this slot while its head was being read.
    pub(super) async fn pushed_out(&mut self) {
        match self.pushed_out.as_mut() {
            // A closed channel (the slot began serving) is no push.
            Some(receiver) => {
                if receiver.await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending().await,
        }
    }

    /// The head is read: the slot is this connection's until it drops it. False if it was
    /// taken from it first.
    pub(super) fn serve(&mut self) -> bool {
        let mut state = self.slots.state();
        let Some(at) = state.reading.iter().position(|(id, _)| *id == self.id) else {
            return false;
        };
        state.reading.remove(at);
        self.serving = true;
        self.pushed_out = None;
        true
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut state = self.slots.state();
        let reading = state.reading.iter().position(|(id, _)| *id == self.id);
        if let Some(at) = reading {
            state.reading.remove(at);
        }
        // A slot pushed out is not in `reading` and never served: it is the newer one's now.
        if reading.is_some() || self.serving {
            state.held -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_new_connection_pushes_out_the_longest_reader_never_a_served_one() {
        let slots = Slots::new(2);
        let mut first = slots.take().expect("a free slot");
        let mut second = slots.take().expect("a free slot");
        assert!(first.serve(), "its head came");
        // Full: the third takes the slot of the one still reading.
        let mut third = slots.take().expect("a reader's slot");
        second.pushed_out().await;
        assert!(!second.serve(), "a pushed-out connection is not served");
        drop(second);
        assert_eq!(slots.held(), 2);
        // Every slot serves: the next is turned away.
        assert!(third.serve());
        assert!(slots.take().is_none());
        drop(first);
        assert_eq!(slots.held(), 1);
        let fourth = slots.take().expect("a freed slot");
        drop((third, fourth));
        assert_eq!(slots.held(), 0);
    }

    #[tokio::test]
    async fn readers_give_way_oldest_first_and_drops_free_their_slots() {
        let slots = Slots::new(2);
        let mut a = slots.take().unwrap();
        let b = slots.take().unwrap();
        let c = slots.take().unwrap();
        a.pushed_out().await;
        drop(a);
        let d = slots.take().unwrap();
        // b was older than c, so b went.
        assert!(slots.state().reading.iter().all(|(id, _)| *id != b.id));
        drop((b, c, d));
        assert_eq!(slots.held(), 0);
    }
}
