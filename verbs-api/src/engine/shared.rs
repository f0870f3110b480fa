//! What application threads and the engine share of QPs and CQs, without the engine's
//! lock: the CQ's completion queue and arming, the QP's inbox of posted work, its state and
//! queue use.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use crossbeam::queue::SegQueue;

use super::mailbox::Mailbox;
use ferroce_stack::transport::{QpCaps, QpState, QpType, Sge, WorkCompletion};
use smallvec::SmallVec;

use crate::events::{AsyncEvent, EventSink};

/// A completion queue's shared half: the engine pushes, any thread pops, without a lock.
#[derive(Debug)]
pub(crate) struct CqShared {
    pub(crate) id: u32,
    /// Completions with the engine's clock when each was made (ns).
    pub(crate) queue: SegQueue<(WorkCompletion, u64)>,
    /// Entries it holds at most; a resize changes it.
    pub(crate) capacity: AtomicUsize,
    /// 0: not armed; 1: next completion; 2: next solicited completion.
    pub(crate) armed: AtomicU8,
    pub(crate) channel: Option<Arc<ChannelShared>>,
    /// Completions dropped because the CQ was full (the CQ overran).
    pub(crate) overruns: AtomicUsize,
    /// Where its overrun is reported (`IBV_EVENT_CQ_ERR`).
    pub(crate) events: EventSink,
    /// The service's CQ, on an attached context: completions come from its ring.
    pub(crate) remote: Option<crate::service::RemoteCq>,
    /// Set on a CQ a service serves: a counter shared by the service's CQs, whose next
    /// value each completion takes as its stamp instead of the clock, so the service can
    /// hand a program its completions, and their events, in the order they were made across
    /// its CQs (a program waiting on one channel for two CQs relies on it).
    pub(crate) order: Option<Arc<std::sync::atomic::AtomicU64>>,
    /// The engines of the device whose QPs complete here, a bit each (engine 63 stands for
    /// itself and every later one): those a poll of this CQ turns first (see
    /// [`Device::progress_for`](crate::device::Device::progress_for)).
    pub(crate) engines: std::sync::atomic::AtomicU64,
}

impl CqShared {
    pub(crate) fn new(id: u32, capacity: usize, channel: Option<Arc<ChannelShared>>) -> Self {
        Self {
            id,
            queue: SegQueue::new(),
            capacity: AtomicUsize::new(capacity),
            armed: AtomicU8::new(0),
            channel,
            overruns: AtomicUsize::new(0),
            events: EventSink::default(),
            remote: None,
            order: None,
            engines: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Notes that a QP on engine `engine` completes here.
    pub(crate) fn serves_engine(&self, engine: usize) {
        self.engines
            .fetch_or(1 << engine.min(63), std::sync::atomic::Ordering::Relaxed);
    }

    /// This CQ, reporting its overrun to `events`.
    pub(crate) fn with_events(mut self, events: EventSink) -> Self {
        self.events = events;
        self
    }

    /// Takes every completion of QP `qpn` out of the queue, keeping the others in order. A
    /// poller that races this may see the others in a different order; a QP is reset from
    /// the control path, not while its CQ is polled.
    pub(super) fn remove_qp(&self, qpn: u32) {
        let mut kept = Vec::new();
        while let Some(e) = self.queue.pop() {
            if e.0.qp_num.value() != qpn {
                kept.push(e);
            }
        }
        for e in kept {
            self.queue.push(e);
        }
    }

    pub(crate) fn push(&self, wc: WorkCompletion, now: u64) {
        if self.queue.len() >= self.capacity.load(Ordering::Relaxed) {
            // The first completion lost is the error an RNIC reports; the CQ stays in it.
            if self.overruns.fetch_add(1, Ordering::Relaxed) == 0 {
                self.events.emit(AsyncEvent::CqError(self.id));
            }
            return;
        }
        let solicited = wc.solicited || wc.status != ferroce_stack::transport::WcStatus::Success;
        let stamp = match &self.order {
            Some(o) => o.fetch_add(1, Ordering::Relaxed),
            None => now,
        };
        self.queue.push((wc, stamp));
        let fire = match self.armed.load(Ordering::Acquire) {
            1 => true,
            2 => solicited,
            _ => false,
        };
        if fire && self.armed.swap(0, Ordering::AcqRel) != 0 {
            if let Some(ch) = &self.channel {
                ch.post(self.id);
            }
        }
    }
}

/// A completion channel: CQ ids whose notification fired, for a thread that waits.
#[derive(Default)]
pub(crate) struct ChannelShared {
    events: Mutex<std::collections::VecDeque<u32>>,
    ready: Condvar,
    /// Called after each event is queued (the libibverbs shim makes the channel's fd
    /// readable with it).
    pub(crate) notify: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// On an attached context: the channel whose eventfd the service writes.
    pub(crate) remote: std::sync::OnceLock<crate::service::RemoteChannel>,
}

impl std::fmt::Debug for ChannelShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelShared")
            .field("events", &self.events)
            .finish_non_exhaustive()
    }
}

impl ChannelShared {
    fn post(&self, cq: u32) {
        let mut q = self.events.lock().unwrap_or_else(|e| e.into_inner());
        q.push_back(cq);
        self.ready.notify_all();
        drop(q);
        if let Some(f) = self.notify.get() {
            f();
        }
    }

    /// Waits up to `timeout` for a CQ event; returns the CQ's id.
    pub(crate) fn wait(&self, timeout: std::time::Duration) -> Option<u32> {
        let q = self.events.lock().unwrap_or_else(|e| e.into_inner());
        let (mut q, _) = self
            .ready
            .wait_timeout_while(q, timeout, |q| q.is_empty())
            .unwrap_or_else(|e| e.into_inner());
        q.pop_front()
    }
}

/// A send WR copied out of the caller's structures, as a NIC reads a WQE at post time.
pub(crate) type OwnedSend = ferroce_stack::transport::OwnedSendWr;

/// Work posted by an application thread, waiting for the engine.
#[derive(Debug)]
pub(crate) enum Op {
    Send(OwnedSend),
    Recv(u64, SmallVec<[Sge; 2]>),
}

/// What application threads see of a QP without taking the engine lock.
#[derive(Debug)]
pub(crate) struct QpShared {
    pub(crate) qpn: u32,
    pub(crate) qp_type: QpType,
    pub(crate) caps: QpCaps,
    pub(crate) inbox: Mailbox<Op>,
    /// The QP's state as of the engine's last turn (or the last modify).
    pub(crate) state: AtomicU8,
    /// Slots in use in the send and receive queues: WRs reserved by a poster (on their way
    /// through the inbox) plus WRs in the QP. One counter per queue, reserved with a
    /// compare-and-swap before a WR is queued and released by the engine when the QP lets
    /// the WR go, so no poster ever sees a queue fuller or emptier than it is.
    pub(crate) sq_used: AtomicU32,
    pub(crate) rq_used: AtomicU32,
    /// Receives come from a shared receive queue.
    pub(crate) has_srq: bool,
    rung: AtomicBool,
    /// Where the QP's affiliated events go (see `EngineCore::settle`).
    pub(crate) events: EventSink,
    /// The service's QP, on an attached context: posts go to its rings.
    pub(crate) remote: Option<crate::service::RemoteQp>,
}

impl QpShared {
    pub(crate) fn new(qpn: u32, qp_type: QpType, caps: QpCaps) -> Self {
        Self {
            qpn,
            qp_type,
            caps,
            inbox: Mailbox::new(),
            state: AtomicU8::new(state_code(QpState::Reset)),
            sq_used: AtomicU32::new(0),
            rq_used: AtomicU32::new(0),
            has_srq: false,
            rung: AtomicBool::new(false),
            events: EventSink::default(),
            remote: None,
        }
    }

    /// Reserves a slot in a queue of `max` whose use `used` counts; false when it is full.
    pub(crate) fn reserve(used: &AtomicU32, max: u32) -> bool {
        used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
            (u < max).then_some(u + 1)
        })
        .is_ok()
    }

    pub(crate) fn state(&self) -> QpState {
        QpState::ALL[usize::from(self.state.load(Ordering::Acquire)).min(6)]
    }

    /// Queues `op` and rings the doorbell the engine watches; true when this post rang it
    /// (the inbox was not already waiting for a turn).
    pub(crate) fn submit(&self, op: Op, doorbells: &Mailbox<u32>) -> bool {
        self.inbox.push(op);
        let ring = !self.rung.swap(true, Ordering::AcqRel);
        if ring {
            doorbells.push(self.qpn);
        }
        ring
    }

    /// Rings `doorbells` for this QP whatever the inbox holds: a QP arriving on another
    /// engine, whose old engine may have taken (and dropped) a doorbell meant for it.
    pub(crate) fn ring(&self, doorbells: &Mailbox<u32>) {
        self.rung.store(true, Ordering::Release);
        doorbells.push(self.qpn);
    }

    /// Marks the doorbell answered: the engine is taking the inbox now.
    pub(crate) fn answered(&self) {
        self.rung.store(false, Ordering::Release);
    }
}

pub(crate) fn state_code(s: QpState) -> u8 {
    QpState::ALL.iter().position(|&x| x == s).unwrap_or(0) as u8
}
