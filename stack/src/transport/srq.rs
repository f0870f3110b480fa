//! A shared receive queue: receive WQEs that any QP attached to it consumes, in order, as
//! SENDs arrive (IBTA §10.2.9). The queue is shared between the QPs of a device and the
//! threads that post to it, so it sits behind a lock; the responder holds it for one pop.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use smallvec::SmallVec;

use super::wr::RecvWqe;
use super::wr::{PostError, RecvWr};

#[derive(Debug)]
struct Inner {
    queue: VecDeque<RecvWqe>,
    max_wr: u32,
    max_sge: u32,
}

/// A shared receive queue. Clones are handles to the same queue.
#[derive(Clone, Debug)]
pub struct Srq(Arc<Mutex<Inner>>);

impl Srq {
    /// An empty queue holding up to `max_wr` receives of up to `max_sge` elements each.
    pub fn new(max_wr: u32, max_sge: u32) -> Self {
        Self(Arc::new(Mutex::new(Inner {
            queue: VecDeque::new(),
            max_wr,
            max_sge,
        })))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `ibv_post_srq_recv` for one WR.
    pub fn post_recv(&self, wr: &RecvWr<'_>) -> Result<(), PostError> {
        let mut q = self.lock();
        if wr.sg_list.len() > q.max_sge as usize {
            return Err(PostError::TooManySges {
                got: wr.sg_list.len(),
                max: q.max_sge,
            });
        }
        if q.queue.len() >= q.max_wr as usize {
            return Err(PostError::QueueFull(q.max_wr));
        }
        q.queue.push_back(RecvWqe {
            wr_id: wr.wr_id,
            sges: SmallVec::from_slice(wr.sg_list),
        });
        Ok(())
    }

    /// Receives waiting.
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    /// True when no receive waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn pop(&self) -> Option<RecvWqe> {
        self.lock().queue.pop_front()
    }

    /// Puts back a receive a dropped message had taken, first in line.
    pub(crate) fn push_front(&self, w: RecvWqe) {
        self.lock().queue.push_front(w);
    }
}
