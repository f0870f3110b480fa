//! A shared receive queue: receive WQEs that any QP attached to it consumes, in order, as
//! SENDs arrive (IBTA §10.2.9). The queue is shared between the QPs of a device and the
//! threads that post to it, so it sits behind a lock; the responder holds it for one pop.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use smallvec::SmallVec;

use super::tm::{TagList, Taken, TmError};
use super::wr::RecvWqe;
use super::wr::{PostError, RecvWr, Sge};

struct Inner {
    queue: VecDeque<RecvWqe>,
    max_wr: u32,
    max_sge: u32,
    /// Armed limit (`srq_limit`): when fewer receives than this remain after one is taken,
    /// `on_limit` runs once and the limit disarms (0).
    limit: u32,
    on_limit: Option<Box<dyn Fn() + Send + Sync>>,
    /// A tag matching SRQ's tag list (see [`super::tm`]).
    tm: Option<TagList>,
}

impl Inner {
    fn pop(&mut self) -> Option<RecvWqe> {
        pop_ordinary(&mut self.queue, &mut self.limit, &self.on_limit)
    }
}

/// Takes the first ordinary receive, crossing the armed limit if it is.
fn pop_ordinary(
    queue: &mut VecDeque<RecvWqe>,
    limit: &mut u32,
    on_limit: &Option<Box<dyn Fn() + Send + Sync>>,
) -> Option<RecvWqe> {
    let w = queue.pop_front();
    if w.is_some() && *limit != 0 && (queue.len() as u32) < *limit {
        *limit = 0;
        if let Some(f) = on_limit {
            f();
        }
    }
    w
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("queued", &self.queue.len())
            .field("max_wr", &self.max_wr)
            .field("max_sge", &self.max_sge)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

/// Why a shared receive queue could not be changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SrqModifyError {
    /// A limit above the queue's size.
    #[error("limit {limit} exceeds the queue's {max_wr} entries")]
    LimitTooHigh {
        /// The limit asked for.
        limit: u32,
        /// The queue's size.
        max_wr: u32,
    },
    /// A size below the receives waiting in it.
    #[error("cannot shrink the queue to {max_wr} entries: {queued} receives wait")]
    TooSmall {
        /// The size asked for.
        max_wr: u32,
        /// Receives waiting.
        queued: usize,
    },
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
            limit: 0,
            on_limit: None,
            tm: None,
        })))
    }

    /// A tag matching SRQ (`IBV_SRQT_TM`): ordinary receives as [`new`](Self::new), and a
    /// list of up to `max_tags` tagged buffers of up to `tag_sge` elements each.
    pub fn with_tag_matching(max_wr: u32, max_sge: u32, max_tags: u32, tag_sge: u32) -> Self {
        let srq = Self::new(max_wr, max_sge);
        srq.lock().tm = Some(TagList::new(max_tags, tag_sge));
        srq
    }

    /// True for a tag matching SRQ.
    pub fn is_tag_matching(&self) -> bool {
        self.lock().tm.is_some()
    }

    /// Runs `f` on the tag list; `None` for an SRQ without one.
    fn with_tags<T>(&self, f: impl FnOnce(&mut TagList) -> T) -> Option<T> {
        self.lock().tm.as_mut().map(f)
    }

    /// `IBV_WR_TAG_ADD`: a tagged buffer for messages whose tag agrees with `tag` under
    /// `mask`, completed with `recv_wr_id`; its handle. `unexpected`, when given, is the
    /// count of unexpected messages software has handled (`IBV_OPS_TM_SYNC`).
    pub fn add_tag(
        &self,
        unexpected: Option<u32>,
        tag: u64,
        mask: u64,
        recv_wr_id: u64,
        sges: &[Sge],
    ) -> Option<Result<u32, TmError>> {
        self.with_tags(|t| t.add(unexpected, tag, mask, recv_wr_id, sges))
    }

    /// `IBV_WR_TAG_DEL`.
    pub fn remove_tag(&self, unexpected: Option<u32>, handle: u32) -> Option<Result<(), TmError>> {
        self.with_tags(|t| t.remove(unexpected, handle))
    }

    /// `IBV_WR_TAG_SYNC`.
    pub fn sync_tags(&self, unexpected: u32) -> Option<()> {
        self.with_tags(|t| t.sync(unexpected))
    }

    /// True while software has not reported every unexpected message (what completions
    /// flag with `IBV_WC_TM_SYNC_REQ`).
    pub fn tag_sync_required(&self) -> bool {
        self.with_tags(|t| t.sync_required()).unwrap_or(false)
    }

    /// The buffer a SEND whose first packet carries `payload` goes to, and why: for a tag
    /// matching SRQ by its header, for any other the next receive.
    pub(crate) fn take_message(&self, payload: &[u8]) -> Option<(RecvWqe, Taken)> {
        let mut q = self.lock();
        let Inner {
            queue,
            limit,
            on_limit,
            tm,
            ..
        } = &mut *q;
        let mut ordinary = || pop_ordinary(queue, limit, on_limit);
        match tm {
            None => ordinary().map(|w| (w, Taken::Plain)),
            Some(tm) => tm.take(payload, ordinary),
        }
    }

    /// Runs `f` when an armed limit is crossed (what an RNIC reports as
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`); `f` runs under the queue's lock, on the thread that
    /// took the receive.
    pub fn set_limit_handler(&self, f: Box<dyn Fn() + Send + Sync>) {
        self.lock().on_limit = Some(f);
    }

    /// Size, elements per receive, and the armed limit (0: disarmed), as `ibv_query_srq`.
    pub fn attr(&self) -> (u32, u32, u32) {
        let q = self.lock();
        (q.max_wr, q.max_sge, q.limit)
    }

    /// `ibv_modify_srq`: a new size, and (or) a limit to arm (0 disarms). A limit at or
    /// above the receives waiting is crossed by the next one taken, as IBTA §10.2.9.5 has
    /// the event follow the first consumption below it.
    pub fn modify(&self, max_wr: Option<u32>, limit: Option<u32>) -> Result<(), SrqModifyError> {
        let mut q = self.lock();
        let size = max_wr.unwrap_or(q.max_wr);
        if let Some(m) = max_wr {
            if (m as usize) < q.queue.len() {
                return Err(SrqModifyError::TooSmall {
                    max_wr: m,
                    queued: q.queue.len(),
                });
            }
        }
        if let Some(l) = limit {
            if l > size {
                return Err(SrqModifyError::LimitTooHigh {
                    limit: l,
                    max_wr: size,
                });
            }
        }
        q.max_wr = size;
        if let Some(l) = limit {
            q.limit = l;
        }
        Ok(())
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
        self.lock().pop()
    }

    /// Puts back a receive a dropped message had taken, first in line.
    pub(crate) fn push_front(&self, w: RecvWqe) {
        self.lock().queue.push_front(w);
    }
}
