//! A queue from program threads to an engine that never makes its reader spin on a writer.
//!
//! A lock-free queue that claims a slot before filling it (crossbeam's `SegQueue`, and any
//! queue built that way) makes a reader that reaches a claimed, unfilled slot spin until the
//! writer finishes; a writer that claims the end of a block makes readers spin likewise while
//! it allocates the next. Between threads of one scheduling class that costs nanoseconds. An
//! engine thread in the real-time class (slot.rs) that preempted such a writer on its CPU
//! would spin instead until the kernel moved the writer elsewhere or throttled real-time
//! threads. Here a writer holds a lock for the few instructions of its push, and a reader that
//! finds the lock held waits on it in the kernel, which runs the writer.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// A multi-producer queue whose `pop` blocks (in the kernel, never spinning long) only while
/// a push is under way.
#[derive(Debug, Default)]
pub(crate) struct Mailbox<T> {
    items: Mutex<VecDeque<T>>,
    /// The queue's length as of the last push or pop, so an empty mailbox is seen without
    /// the lock.
    len: AtomicUsize,
}

impl<T> Mailbox<T> {
    pub(crate) fn new() -> Self {
        Self {
            items: Mutex::new(VecDeque::new()),
            len: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<T>> {
        // A push or pop cannot leave the deque half-changed: a poisoned lock's data is whole.
        self.items.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn push(&self, item: T) {
        let mut q = self.lock();
        q.push_back(item);
        self.len.store(q.len(), Ordering::Release);
    }

    pub(crate) fn pop(&self) -> Option<T> {
        if self.is_empty() {
            return None;
        }
        let mut q = self.lock();
        let item = q.pop_front();
        self.len.store(q.len(), Ordering::Release);
        item
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len.load(Ordering::Acquire) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_leave_in_order_and_none_is_lost_between_threads() {
        let m = std::sync::Arc::new(Mailbox::new());
        let writers: Vec<_> = (0..3u64)
            .map(|w| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for i in 0..10_000u64 {
                        m.push((w, i));
                    }
                })
            })
            .collect();
        let mut next = [0u64; 3];
        let mut got = 0;
        while got < 30_000 {
            if let Some((w, i)) = m.pop() {
                // Each writer's items come out in the order it pushed them.
                assert_eq!(i, next[w as usize]);
                next[w as usize] += 1;
                got += 1;
            }
        }
        for w in writers {
            w.join().unwrap();
        }
        assert!(m.is_empty());
        assert_eq!(m.pop(), None);
    }
}
