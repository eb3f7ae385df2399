//! The engine's work queue: items handed from the dispatcher to a fixed pool of workers.
//!
//! Bounded, so memory does not grow with a bucket's size, and cheap to cross: a worker that
//! finds an item takes it without waking anyone; the dispatcher, once it has filled the
//! queue, is woken only when the queue has drained to half (one wake-up per half a queue of
//! items, not one per item), and workers are woken only when items arrive in an empty queue.
//! A spawned task or a semaphore wake-up per item cost more than the engine's own bookkeeping
//! on a fast API.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};

use tokio::sync::Notify;

use super::Stop;

pub(super) struct WorkQueue<T> {
    state: Mutex<State<T>>,
    cap: usize,
    /// The dispatcher is woken when a pop leaves this many items.
    low: usize,
    /// Items arrived in an empty queue, or the queue was closed.
    ready: Notify,
    /// The queue drained to `low`.
    room: Notify,
}

/// What a pop without waiting found.
enum Popped<T> {
    /// Nothing yet: wait for items.
    Empty,
    /// The pop's answer.
    Done(Option<T>),
}

struct State<T> {
    items: VecDeque<T>,
    closed: bool,
}

impl<T> WorkQueue<T> {
    /// A queue holding at most `cap` (at least 1) items.
    pub(super) fn new(cap: usize) -> WorkQueue<T> {
        let cap = cap.max(1);
        WorkQueue {
            state: Mutex::new(State {
                items: VecDeque::with_capacity(cap),
                closed: false,
            }),
            cap,
            low: cap / 2,
            ready: Notify::new(),
            room: Notify::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queue every item, in order, waiting for room as needed. Returns false, with the rest
    /// not queued, once a stop is asked for.
    pub(super) async fn push_all(&self, items: impl IntoIterator<Item = T>, stop: &Stop) -> bool {
        let mut items = items.into_iter().peekable();
        while items.peek().is_some() {
            // Registered before the queue is looked at, so a drain in between is not missed.
            let room = self.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            let was_empty = {
                let mut s = self.state();
                let was_empty = s.items.is_empty();
                while s.items.len() < self.cap {
                    match items.next() {
                        Some(item) => s.items.push_back(item),
                        None => break,
                    }
                }
                was_empty
            };
            // Workers wait only on an empty queue.
            if was_empty {
                self.ready.notify_waiters();
            }
            if items.peek().is_none() {
                break;
            }
            tokio::select! {
                _ = room => {}
                _ = stop.stopping() => return false,
            }
        }
        true
    }

    /// The next item; None once a stop is asked for, or the queue is closed and empty.
    pub(super) async fn pop(&self, stop: &Stop) -> Option<T> {
        // Most pops find an item: they take it without registering as a waiter (which locks
        // the notifier's list twice, on the way in and out).
        match self.try_pop(stop) {
            Popped::Empty => {}
            Popped::Done(item) => return item,
        }
        loop {
            let ready = self.ready.notified();
            tokio::pin!(ready);
            ready.as_mut().enable();
            match self.try_pop(stop) {
                Popped::Empty => {}
                Popped::Done(item) => return item,
            }
            tokio::select! {
                _ = ready => {}
                _ = stop.stopping() => return None,
            }
        }
    }

    /// An item, or None once a stop is asked for or the queue is closed and empty.
    fn try_pop(&self, stop: &Stop) -> Popped<T> {
        if stop.is_stopping() {
            return Popped::Done(None);
        }
        let mut s = self.state();
        if let Some(item) = s.items.pop_front() {
            if s.items.len() == self.low {
                self.room.notify_waiters();
            }
            return Popped::Done(Some(item));
        }
        if s.closed {
            return Popped::Done(None);
        }
        Popped::Empty
    }

    /// Up to `max` more items from the front while `same` holds of them, without waiting
    /// (a batch of what is queued now).
    pub(super) fn pop_more(&self, max: usize, same: impl Fn(&T) -> bool) -> Vec<T> {
        let mut s = self.state();
        let mut out = Vec::new();
        while out.len() < max && s.items.front().is_some_and(&same) {
            out.extend(s.items.pop_front());
        }
        let left = s.items.len();
        drop(s);
        if !out.is_empty() && left <= self.low {
            self.room.notify_waiters();
        }
        out
    }

    /// No more items will come: workers finish what is queued, then stop.
    pub(super) fn close(&self) {
        self.state().closed = true;
        self.ready.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::stop_pair;
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_item_reaches_exactly_one_worker_in_order_per_worker() {
        let queue = Arc::new(WorkQueue::new(8));
        let (_handle, stop) = stop_pair();
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..4 {
            let (queue, stop) = (queue.clone(), stop.clone());
            workers.spawn(async move {
                let mut got = Vec::new();
                while let Some(i) = queue.pop(&stop).await {
                    got.push(i);
                    if i % 7 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
                got
            });
        }
        // Batches larger and smaller than the queue, with pauses that let it run empty.
        let mut next = 0u32;
        for size in [1usize, 30, 3, 0, 100, 8, 17] {
            assert!(queue.push_all(next..next + size as u32, &stop).await);
            next += size as u32;
            tokio::task::yield_now().await;
        }
        queue.close();
        let mut all = Vec::new();
        while let Some(got) = workers.join_next().await {
            let got = got.unwrap();
            // One worker sees items in the order they were queued.
            assert!(got.windows(2).all(|w| w[0] < w[1]), "{got:?}");
            all.extend(got);
        }
        all.sort_unstable();
        assert_eq!(all, (0..next).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_stop_ends_a_full_push_and_idle_workers() {
        let queue = Arc::new(WorkQueue::new(2));
        let (handle, stop) = stop_pair();
        // Ten items through a queue of two with one pop: the push cannot end by itself.
        let push = tokio::spawn({
            let (queue, stop) = (queue.clone(), stop.clone());
            async move { queue.push_all(0..10u32, &stop).await }
        });
        assert_eq!(queue.pop(&stop).await, Some(0));
        let empty = Arc::new(WorkQueue::<u32>::new(2));
        let idle = tokio::spawn({
            let stop = stop.clone();
            async move { empty.pop(&stop).await }
        });
        handle.stop();
        assert!(!push.await.unwrap(), "the push was cut short");
        assert_eq!(idle.await.unwrap(), None, "an idle worker was let go");
        // After a stop no item is handed out, even one still queued.
        assert_eq!(queue.pop(&stop).await, None);
    }

    #[tokio::test]
    async fn a_closed_queue_hands_out_what_it_holds_then_none() {
        let queue = WorkQueue::new(4);
        let (_handle, stop) = stop_pair();
        assert!(queue.push_all([1, 2], &stop).await);
        queue.close();
        assert_eq!(queue.pop(&stop).await, Some(1));
        assert_eq!(queue.pop(&stop).await, Some(2));
        assert_eq!(queue.pop(&stop).await, None);
    }
}
